//! A session's files API on the host ([`Files`]): read, write, list, stat, exists, mkdir,
//! remove and rename, by the paths the guest sees (`/home/user/notes.txt`), each confined to
//! the host directory that path is mounted from.
//!
//! Every access goes through a `cap_std::fs::Dir` opened on that directory when the session
//! was made, so a path resolves beneath it whatever the guest planted between two calls: an
//! absolute symlink, or one whose `..` climbs out, fails the call (cap-std refuses to leave
//! the directory), and a path with a `..` of its own is refused before any lookup. A write
//! never goes through an existing file: it streams into a new file beside it, then renames
//! it over the name, so a hard link the guest made to another file of the tree is replaced,
//! never written through. In a read-write workspace, a protected path
//! ([`stockade_protocol::is_protected`]) is never written, removed, renamed or created; a
//! read-only root takes no change at all.
//!
//! A file's user metadata ([`Entry::metadata`], [`Files::write_with`]) is its `user.e2b.*`
//! extended attributes, as E2B's envd keeps it: set on the new file before it is renamed
//! over the name (so an overwrite without metadata clears the old), read through a
//! descriptor opened `O_NOFOLLOW | O_NONBLOCK` (never through a symlink, never waiting on a
//! fifo), at most [`MAX_METADATA`] keys of at most [`MAX_METADATA_BYTES`] each.

use std::io::{self, Read, Write};
use std::path::{Component, Path, PathBuf};

use cap_std::fs::{Dir, MetadataExt, OpenOptions, OpenOptionsExt};

/// Most entries one [`Files::list`] returns.
pub const MAX_LIST: usize = 10_000;

/// Deepest [`Files::list`] walks.
pub const MAX_DEPTH: usize = 32;

/// The extended-attribute namespace of a file's user metadata (envd's).
pub const METADATA_PREFIX: &str = "user.e2b.";

/// Most metadata keys one file keeps, and most read back from one.
pub const MAX_METADATA: usize = 64;

/// Most bytes of one metadata key or value.
pub const MAX_METADATA_BYTES: usize = 4096;

/// A file's user metadata: key to value.
pub type Metadata = std::collections::BTreeMap<String, String>;

/// Why a files call failed: one line, naming the path as the guest sees it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FilesError {
    /// Nothing at that path.
    #[error("{0}: no such file or directory")]
    NotFound(String),
    /// The path is malformed or outside every directory the session's files API serves.
    #[error("{path}: {why}")]
    Invalid {
        /// The path.
        path: String,
        /// Why.
        why: String,
    },
    /// The path is served, but not for this change (a read-only root, a protected path).
    #[error("{path}: {why}")]
    Denied {
        /// The path.
        path: String,
        /// Why.
        why: String,
    },
    /// A read or write over its cap.
    #[error("{path}: over the {limit}-byte limit")]
    TooLarge {
        /// The path.
        path: String,
        /// The cap.
        limit: u64,
    },
    /// The host said no (a symlink that leaves the tree, a full disk, a file where a
    /// directory was expected...).
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// What the host said.
        source: io::Error,
    },
}

/// What kind of entry a path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (never followed by a listing).
    Symlink,
    /// A fifo, socket or device.
    Other,
}

/// One entry: its path in the guest's view, kind, size, mode and modification time.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Entry {
    /// The path as the guest sees it.
    pub path: String,
    /// The kind.
    pub kind: Kind,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Modification time, seconds since the epoch.
    pub modified: i64,
    /// Its user metadata (a regular file's or a directory's `user.e2b.*` attributes).
    pub metadata: Metadata,
    /// A symlink's target, as the link says it (its text, never followed here).
    pub link: Option<String>,
}

struct Root {
    at: String,
    dir: Dir,
    writable: bool,
    guarded: bool,
}

/// The files API of one session: a set of host directories, each served at the path the
/// guest sees it at.
#[derive(Default)]
pub struct Files {
    roots: Vec<Root>,
}

impl std::fmt::Debug for Files {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.roots.iter().map(|r| &r.at)).finish()
    }
}

fn io_err(path: &str) -> impl FnOnce(io::Error) -> FilesError + '_ {
    move |e| match e.kind() {
        io::ErrorKind::NotFound => FilesError::NotFound(path.to_owned()),
        _ => FilesError::Io { path: path.to_owned(), source: e },
    }
}

impl Files {
    /// Serves the host directory `host` at the guest's path `at` (absolute): read-write if
    /// `writable`, and, if `guarded` (a read-write workspace), never changing a protected
    /// path. The directory is opened now and held: later calls never resolve `host` again.
    pub fn serve(mut self, at: &str, host: &Path, writable: bool, guarded: bool) -> io::Result<Self> {
        let dir = Dir::open_ambient_dir(host, cap_std::ambient_authority())?;
        self.roots.push(Root { at: at.trim_end_matches('/').to_owned(), dir, writable, guarded });
        Ok(self)
    }

    /// Serves, read-only at the guest's path `at`, the directory `inside` (relative) of the
    /// host directory `host`, resolved beneath `host` as the guest would resolve it: a
    /// symlink or `..` on the way cannot leave `host`. For a container's directory seen
    /// through `/proc/PID/root`, where an absolute symlink would otherwise be read on the
    /// host's root.
    pub fn serve_within(mut self, at: &str, host: &Path, inside: &str) -> io::Result<Self> {
        let base = Dir::open_ambient_dir(host, cap_std::ambient_authority())?;
        let dir = base.open_dir(inside.trim_start_matches('/'))?;
        self.roots.push(Root { at: at.trim_end_matches('/').to_owned(), dir, writable: false, guarded: false });
        Ok(self)
    }

    /// The root `path` is under, and the path relative to it (empty for the root itself).
    fn locate(&self, path: &str) -> Result<(&Root, PathBuf), FilesError> {
        let invalid = |why: &str| FilesError::Invalid { path: path.to_owned(), why: why.to_owned() };
        if !path.starts_with('/') {
            return Err(invalid("not an absolute path"));
        }
        if path.contains('\0') {
            return Err(invalid("a path cannot hold a NUL byte"));
        }
        let p = Path::new(path);
        if p.components().any(|c| c == Component::ParentDir) {
            return Err(invalid("`..` is not accepted; name the path from the root"));
        }
        for root in &self.roots {
            if let Ok(rel) = p.strip_prefix(&root.at) {
                let rel: PathBuf = rel.components().filter(|c| matches!(c, Component::Normal(_))).collect();
                return Ok((root, rel));
            }
        }
        let served: Vec<&str> = self.roots.iter().map(|r| r.at.as_str()).collect();
        Err(invalid(&format!("outside the directories the files API serves ({})", served.join(", "))))
    }

    /// The root and relative path for a change: refused on a read-only root, at a root
    /// itself, and on a protected path of a guarded one.
    fn locate_change(&self, path: &str) -> Result<(&Root, PathBuf), FilesError> {
        let (root, rel) = self.locate(path)?;
        let denied = |why: &str| FilesError::Denied { path: path.to_owned(), why: why.to_owned() };
        if !root.writable {
            return Err(denied("read-only"));
        }
        if rel.as_os_str().is_empty() {
            return Err(denied("the root of a served directory cannot be changed"));
        }
        if root.guarded && stockade_protocol::is_protected(&rel) {
            return Err(denied("a protected path of the workspace (it could make the host run code later)"));
        }
        Ok((root, rel))
    }

    /// Reads a whole file, refusing one over `max` bytes.
    pub fn read(&self, path: &str, max: u64) -> Result<Vec<u8>, FilesError> {
        let (file, _) = self.open(path, max)?;
        let mut out = Vec::new();
        file.take(max + 1).read_to_end(&mut out).map_err(io_err(path))?;
        if out.len() as u64 > max {
            return Err(FilesError::TooLarge { path: path.to_owned(), limit: max });
        }
        Ok(out)
    }

    /// Opens the regular file at `path` for reading, to stream it: the file and its size,
    /// refusing one over `max` bytes or anything but a regular file. It may change while it
    /// is read (the guest can write it), so a reader takes at most the size returned.
    ///
    /// The open itself never waits: it is `O_NONBLOCK`, so a fifo the guest made (or a
    /// symlink to one) opens at once, with no writer, and is then refused by its type, as
    /// are sockets and devices. Without it an open of a fifo blocks until a writer comes,
    /// which the guest decides.
    pub fn open(&self, path: &str, max: u64) -> Result<(std::fs::File, u64), FilesError> {
        let (root, rel) = self.locate(path)?;
        let mut opts = OpenOptions::new();
        opts.read(true).custom_flags(crate::stage::O_NONBLOCK);
        let file = root.dir.open_with(&rel, &opts).map_err(io_err(path))?;
        let meta = file.metadata().map_err(io_err(path))?;
        if !meta.is_file() {
            let what = kind_name(&meta);
            return Err(FilesError::Invalid { path: path.to_owned(), why: format!("not a regular file (a {what})") });
        }
        if meta.len() > max {
            return Err(FilesError::TooLarge { path: path.to_owned(), limit: max });
        }
        Ok((file.into_std(), meta.len()))
    }

    /// Writes `data` (streamed, at most `max` bytes) as the whole file at `path`, creating
    /// its parent directories: into a new file beside it, then renamed over the name. Over
    /// the cap, nothing changes. Returns the bytes written.
    pub fn write(&self, path: &str, data: &mut dyn Read, max: u64) -> Result<u64, FilesError> {
        self.write_with(path, data, max, &Metadata::new())
    }

    /// [`write`](Self::write), the new file carrying `metadata` (at most [`MAX_METADATA`]
    /// keys, each key and value at most [`MAX_METADATA_BYTES`]) before it takes the name. A
    /// filesystem that keeps no user attributes refuses it, naming the mechanism.
    pub fn write_with(
        &self,
        path: &str,
        data: &mut dyn Read,
        max: u64,
        metadata: &Metadata,
    ) -> Result<u64, FilesError> {
        check_metadata(path, metadata)?;
        let (root, rel) = self.locate_change(path)?;
        let (parent, name) = split(&rel, path)?;
        if !parent.as_os_str().is_empty() {
            root.dir.create_dir_all(&parent).map_err(io_err(path))?;
        }
        let tmp = parent.join(format!(".{}.stockade-{}", name.to_string_lossy(), std::process::id()));
        let mut opts = OpenOptions::new();
        opts.write(true).create_new(true).mode(0o644);
        let mut file = root.dir.open_with(&tmp, &opts).map_err(io_err(path))?;
        let copied = io::copy(&mut data.take(max + 1), &mut file).and_then(|n| file.flush().map(|()| n));
        let done = match copied {
            Ok(n) if n > max => Err(FilesError::TooLarge { path: path.to_owned(), limit: max }),
            Ok(_) if let Err(e) = set_metadata(&file, metadata) => Err(metadata_error(path, e)),
            Ok(n) => root.dir.rename(&tmp, &root.dir, &rel).map(|()| n).map_err(io_err(path)),
            Err(e) => Err(io_err(path)(e)),
        };
        if done.is_err() {
            let _ = root.dir.remove_file(&tmp);
        }
        done
    }

    /// The entry at `path`, without following a final symlink.
    pub fn stat(&self, path: &str) -> Result<Entry, FilesError> {
        let (root, rel) = self.locate(path)?;
        let meta = if rel.as_os_str().is_empty() { root.dir.dir_metadata() } else { root.dir.symlink_metadata(&rel) }
            .map_err(io_err(path))?;
        let mut e = entry(path.trim_end_matches('/').to_owned(), &meta);
        let name = if rel.as_os_str().is_empty() { Path::new(".") } else { rel.as_path() };
        describe(&mut e, &root.dir, name.as_os_str());
        Ok(e)
    }

    /// Whether anything is at `path` (a dangling symlink counts).
    pub fn exists(&self, path: &str) -> Result<bool, FilesError> {
        match self.stat(path) {
            Ok(_) => Ok(true),
            Err(FilesError::NotFound(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The entries under the directory `path`, down to `depth` levels (1: its own entries),
    /// at most [`MAX_LIST`], sorted by path; symlinks are listed, never followed.
    pub fn list(&self, path: &str, depth: usize) -> Result<Vec<Entry>, FilesError> {
        let dir = self.open_dir(path)?;
        let mut out = Vec::new();
        walk(&dir, path.trim_end_matches('/'), depth.clamp(1, MAX_DEPTH), &mut out)
            .map_err(|e| FilesError::Io { path: path.to_owned(), source: e })?;
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// The directory at `path`, opened beneath its root (its last component not followed).
    pub(crate) fn open_dir(&self, path: &str) -> Result<Dir, FilesError> {
        let (root, rel) = self.locate(path)?;
        if rel.as_os_str().is_empty() {
            root.dir.try_clone()
        } else {
            crate::stage::open_dir_nofollow(&root.dir, rel.as_os_str())
        }
        .map_err(io_err(path))
    }

    /// Makes the directory `path` and its parents; `false` if it was there already.
    pub fn mkdir(&self, path: &str) -> Result<bool, FilesError> {
        let (root, rel) = self.locate_change(path)?;
        match root.dir.symlink_metadata(&rel) {
            Ok(m) if m.is_dir() => Ok(false),
            Ok(_) => {
                Err(FilesError::Io { path: path.to_owned(), source: io::Error::from(io::ErrorKind::AlreadyExists) })
            }
            Err(_) => root.dir.create_dir_all(&rel).map(|()| true).map_err(io_err(path)),
        }
    }

    /// Removes the file, symlink or directory (with what it holds) at `path`.
    pub fn remove(&self, path: &str) -> Result<(), FilesError> {
        let (root, rel) = self.locate_change(path)?;
        let meta = root.dir.symlink_metadata(&rel).map_err(io_err(path))?;
        if meta.is_dir() { root.dir.remove_dir_all(&rel) } else { root.dir.remove_file(&rel) }.map_err(io_err(path))
    }

    /// Renames `from` to `to`, both under the same served directory.
    pub fn rename(&self, from: &str, to: &str) -> Result<(), FilesError> {
        let (a, from_rel) = self.locate_change(from)?;
        let (b, to_rel) = self.locate_change(to)?;
        if !std::ptr::eq(a, b) {
            return Err(FilesError::Invalid {
                path: to.to_owned(),
                why: format!("not in the same served directory as {from}"),
            });
        }
        a.dir.rename(&from_rel, &a.dir, &to_rel).map_err(io_err(from))
    }
}

fn split<'a>(rel: &'a Path, path: &str) -> Result<(PathBuf, &'a std::ffi::OsStr), FilesError> {
    let name =
        rel.file_name().ok_or_else(|| FilesError::Invalid { path: path.to_owned(), why: "no file name".into() })?;
    Ok((rel.parent().map(Path::to_path_buf).unwrap_or_default(), name))
}

/// What kind of entry `meta` describes, as a refusal names it.
fn kind_name(meta: &cap_std::fs::Metadata) -> &'static str {
    use cap_std::fs::FileTypeExt as _;
    let ft = meta.file_type();
    crate::stage::kind_name(ft.is_dir(), ft.is_fifo(), ft.is_socket(), ft.is_char_device() || ft.is_block_device())
}

fn entry(path: String, meta: &cap_std::fs::Metadata) -> Entry {
    let ft = meta.file_type();
    let kind = if ft.is_symlink() {
        Kind::Symlink
    } else if ft.is_dir() {
        Kind::Dir
    } else if ft.is_file() {
        Kind::File
    } else {
        Kind::Other
    };
    Entry {
        path,
        kind,
        size: meta.len(),
        mode: meta.mode() & 0o7777,
        modified: meta.mtime(),
        metadata: Metadata::new(),
        link: None,
    }
}

/// An entry's metadata (a file's or a directory's) or link text (a symlink's), read from
/// `name` under `dir`.
fn describe(e: &mut Entry, dir: &Dir, name: &std::ffi::OsStr) {
    match e.kind {
        Kind::File | Kind::Dir => e.metadata = read_metadata(dir, name),
        Kind::Symlink => {
            e.link = dir.read_link_contents(name).ok().map(|t| t.to_string_lossy().into_owned());
        }
        Kind::Other => {}
    }
}

/// A write's metadata, checked before anything is written.
fn check_metadata(path: &str, metadata: &Metadata) -> Result<(), FilesError> {
    let bad = |why: String| FilesError::Invalid { path: path.to_owned(), why };
    if metadata.len() > MAX_METADATA {
        return Err(bad(format!("{} metadata keys; at most {MAX_METADATA}", metadata.len())));
    }
    for (k, v) in metadata {
        if k.is_empty() || k.len() > MAX_METADATA_BYTES || k.contains('\0') {
            return Err(bad(format!("metadata key {k:?}: empty, too long or with a NUL")));
        }
        if v.len() > MAX_METADATA_BYTES {
            return Err(bad(format!("metadata value of {k:?}: over {MAX_METADATA_BYTES} bytes")));
        }
    }
    Ok(())
}

/// Sets `metadata` on an open file, each key under [`METADATA_PREFIX`].
fn set_metadata(file: &cap_std::fs::File, metadata: &Metadata) -> io::Result<()> {
    for (k, v) in metadata {
        let name = format!("{METADATA_PREFIX}{k}");
        rustix::fs::fsetxattr(file, name.as_str(), v.as_bytes(), rustix::fs::XattrFlags::empty())?;
    }
    Ok(())
}

fn metadata_error(path: &str, e: io::Error) -> FilesError {
    match e.raw_os_error() {
        Some(n) if n == rustix::io::Errno::NOTSUP.raw_os_error() => FilesError::Invalid {
            path: path.to_owned(),
            why: "this filesystem keeps no user extended attributes (user.e2b.*), where file metadata lives".into(),
        },
        _ => io_err(path)(e),
    }
}

/// The `user.e2b.*` attributes of `name` under `dir` (a regular file or a directory, opened
/// `O_NOFOLLOW | O_NONBLOCK`): bounded, and empty where there are none or they cannot be
/// read (a value that is not UTF-8 is left out).
fn read_metadata(dir: &Dir, name: &std::ffi::OsStr) -> Metadata {
    let mut out = Metadata::new();
    let mut opts = OpenOptions::new();
    opts.read(true).custom_flags(crate::stage::O_NOFOLLOW | crate::stage::O_NONBLOCK);
    let Ok(file) = dir.open_with(name, &opts) else { return out };
    let mut names = vec![0u8; MAX_METADATA * (METADATA_PREFIX.len() + MAX_METADATA_BYTES).min(256)];
    let Ok(n) = rustix::fs::flistxattr(&file, &mut names) else { return out };
    let mut value = vec![0u8; MAX_METADATA_BYTES];
    for raw in names[..n.min(names.len())].split(|b| *b == 0) {
        let Some(key) = std::str::from_utf8(raw).ok().and_then(|k| k.strip_prefix(METADATA_PREFIX)) else { continue };
        if key.is_empty() || out.len() >= MAX_METADATA {
            continue;
        }
        if let Ok(len) = rustix::fs::fgetxattr(&file, raw, &mut value)
            && let Ok(v) = std::str::from_utf8(&value[..len.min(value.len())])
        {
            out.insert(key.to_owned(), v.to_owned());
        }
    }
    out
}

fn walk(dir: &Dir, at: &str, depth: usize, out: &mut Vec<Entry>) -> io::Result<()> {
    for item in dir.entries()? {
        if out.len() >= MAX_LIST {
            return Ok(());
        }
        let item = item?;
        let name = item.file_name();
        let path = format!("{at}/{}", name.to_string_lossy());
        let Ok(meta) = dir.symlink_metadata(&name) else { continue };
        let is_dir = meta.is_dir();
        let mut e = entry(path.clone(), &meta);
        describe(&mut e, dir, &name);
        out.push(e);
        if is_dir && depth > 1 {
            // A directory swapped for a symlink since is not entered.
            if let Ok(sub) = crate::stage::open_dir_nofollow(dir, &name) {
                walk(&sub, &path, depth - 1, out)?;
            }
        }
    }
    Ok(())
}
