//! Staged workspaces: a host directory packed into a tar for a sandbox that must not see a
//! host path (the docker tier uploads it into a size-capped tmpfs volume), and, for a
//! read-write grant, the archive the sandbox left applied back to the host directory.
//!
//! Both directions are bounded, and every access goes through a `cap_std::fs::Dir` for the
//! directory at hand, one name at a time, each opened with `O_NOFOLLOW` (directories with
//! `O_NOFOLLOW | O_DIRECTORY`), so no walk follows a symlink, even one swapped in between a
//! check and an open, and none resolves outside the workspace:
//! - [`pack`] walks the host directory (a symlink is stored as a symlink, which inside the
//!   container resolves in the container's own filesystem), reads each regular file only up
//!   to the size it had when listed, refuses fifos, sockets and devices, and stops with
//!   [`StageError::TooLarge`] or [`StageError::TooManyEntries`] before anything is uploaded.
//!   A read-only grant gives root-owned files and directories (0444/0555, exec bits kept), so
//!   the non-root guest can neither change nor add anything; a read-write grant gives them to
//!   the job user, with setuid, setgid and sticky bits dropped.
//! - [`unpack`] applies the archive the engine returns to the host directory: only regular
//!   files and directories, only names made of normal components, never into or through a
//!   host symlink (each parent is opened without following one), never a
//!   protected path (`stockade_protocol::is_protected`: a listed one, or a new `.git` entry git does not write), new files without setuid bits, identical files left alone,
//!   each file written beside its name and renamed over it once complete, so a host
//!   directory that fills up skips that entry (listed, with the error) and leaves the host
//!   file as it was.
//!   Links, devices and anything else are skipped and listed. Deletions are not replayed:
//!   results are merged into the host directory, nothing on the host is removed.

use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use cap_std::fs::{Dir, MetadataExt, OpenOptions, OpenOptionsExt, Permissions, PermissionsExt};
use stockade_protocol::{Access, PINNED_DIRS};

/// Default size of a staged workspace (the tmpfs volume, and the most [`pack`] uploads): 64 MiB.
pub const DEFAULT_STAGE_BYTES: u64 = 64 << 20;

/// Most files, directories and links a staged workspace may hold (also the volume's inode
/// limit, which bounds the archive's per-entry overhead on the way back): 16384.
pub const MAX_ENTRIES: usize = 16_384;

/// The longest name of one path component a host filesystem takes (`NAME_MAX`).
const MAX_NAME: usize = 255;

/// How many skipped names an [`Applied`] keeps (the count is exact).
const MAX_LISTED: usize = 16;

/// `O_NOFOLLOW` and `O_DIRECTORY` (the crate has no libc dependency; the values are per
/// architecture).
#[cfg(target_arch = "aarch64")]
pub(crate) const O_NOFOLLOW: i32 = 0o100_000;
#[cfg(not(target_arch = "aarch64"))]
pub(crate) const O_NOFOLLOW: i32 = 0o400_000;
/// `O_NONBLOCK` (the same value on x86-64 and aarch64): an open of a fifo for reading
/// returns at once instead of waiting for a writer.
pub(crate) const O_NONBLOCK: i32 = 0o4_000;
#[cfg(target_arch = "aarch64")]
const O_DIRECTORY: i32 = 0o40_000;
#[cfg(not(target_arch = "aarch64"))]
const O_DIRECTORY: i32 = 0o200_000;

/// A workspace that cannot be staged is the job's fault (misconfigured).
impl From<StageError> for stockade_protocol::RunError {
    fn from(e: StageError) -> Self {
        Self::Misconfigured(format!("staged workspace: {e}"))
    }
}

/// A workspace could not be staged, or the container's copy could not be applied.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StageError {
    /// An entry of the host workspace cannot be staged.
    #[error("workspace entry {path:?}: {why}")]
    Refused {
        /// The host path.
        path: PathBuf,
        /// Why.
        why: &'static str,
    },
    /// The workspace is larger than the stage limit.
    #[error("the workspace needs at least {bytes} bytes staged, over the limit of {limit}")]
    TooLarge {
        /// Bytes counted when the limit was crossed.
        bytes: u64,
        /// The limit.
        limit: u64,
    },
    /// The workspace has more entries than [`MAX_ENTRIES`].
    #[error("the workspace has more than {0} entries")]
    TooManyEntries(usize),
    /// Reading the host workspace or writing results failed.
    #[error("workspace {path:?}: {source}")]
    Io {
        /// The host path.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The archive the sandbox returned is malformed or over its bound.
    #[error("the container's workspace archive: {0}")]
    Archive(String),
}

fn io(path: &Path) -> impl FnOnce(io::Error) -> StageError + '_ {
    move |source| StageError::Io { path: path.to_path_buf(), source }
}

/// Opens the directory `name` in `dir`, failing (`ELOOP`) if it is a symlink and
/// (`ENOTDIR`) if it is anything else but a directory.
pub(crate) fn open_dir_nofollow(dir: &Dir, name: &OsStr) -> io::Result<Dir> {
    let f = dir.open_with(name, OpenOptions::new().read(true).custom_flags(O_NOFOLLOW | O_DIRECTORY))?;
    Ok(Dir::from_std_file(f.into_std()))
}

/// Opens the host directory `root` itself, refusing a symlink or a non-directory.
fn open_root(root: &Path) -> Result<Dir, StageError> {
    let meta = std::fs::symlink_metadata(root).map_err(io(root))?;
    if !meta.is_dir() {
        return Err(StageError::Refused { path: root.to_path_buf(), why: "is not a directory (or is a symlink)" });
    }
    let (Some(parent), Some(name)) = (root.parent(), root.file_name()) else {
        return Dir::open_ambient_dir(root, cap_std::ambient_authority()).map_err(io(root));
    };
    let parent = if parent.as_os_str().is_empty() { Path::new(".") } else { parent };
    let up = Dir::open_ambient_dir(parent, cap_std::ambient_authority()).map_err(io(parent))?;
    open_dir_nofollow(&up, name).map_err(io(root))
}

/// A packed workspace: the tar to upload, and what it holds.
#[derive(Debug)]
pub struct Packed {
    /// The archive (shared, not copied, by the upload).
    pub tar: bytes::Bytes,
    /// Regular files.
    pub files: usize,
    /// Bytes of file content.
    pub bytes: u64,
}

/// Packs the host directory `root` for upload (see the module docs). `uid`/`gid` own the
/// entries of a read-write grant.
pub fn pack(root: &Path, access: Access, uid: u32, gid: u32, limit: u64) -> Result<Packed, StageError> {
    let top = open_root(root)?;
    let mut builder = tar::Builder::new(Vec::new());
    let (mut entries, mut files, mut bytes, mut staged) = (0usize, 0usize, 0u64, 0u64);
    let mut stack = vec![(top, PathBuf::new())];
    while let Some((dir, rel)) = stack.pop() {
        let at = root.join(&rel);
        let mut names: Vec<_> = dir
            .entries()
            .map_err(io(&at))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .map_err(io(&at))?;
        names.sort();
        for name in names {
            entries += 1;
            if entries > MAX_ENTRIES {
                return Err(StageError::TooManyEntries(MAX_ENTRIES));
            }
            let (host, rel) = (at.join(&name), rel.join(&name));
            let m = dir.symlink_metadata(&name).map_err(io(&host))?;
            let mut h = tar::Header::new_gnu();
            let (owner, group) = if access == Access::ReadOnly { (0, 0) } else { (uid, gid) };
            h.set_uid(owner.into());
            h.set_gid(group.into());
            h.set_mtime(u64::try_from(m.mtime()).unwrap_or(0));
            staged += 1024; // a header and, at worst, a padding block
            let ft = m.file_type();
            if ft.is_dir() {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(if access == Access::ReadOnly { 0o555 } else { (m.mode() & 0o755) | 0o700 });
                h.set_size(0);
                builder.append_data(&mut h, &rel, io::empty()).map_err(io(&host))?;
                stack.push((open_dir_nofollow(&dir, &name).map_err(io(&host))?, rel));
            } else if ft.is_file() {
                staged += m.len();
                if staged > limit {
                    return Err(StageError::TooLarge { bytes: staged, limit });
                }
                let mut content = Vec::new();
                let file =
                    dir.open_with(&name, OpenOptions::new().read(true).custom_flags(O_NOFOLLOW)).map_err(io(&host))?;
                file.take(m.len()).read_to_end(&mut content).map_err(io(&host))?;
                let exec = m.mode() & 0o111;
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(if access == Access::ReadOnly { 0o444 | exec } else { (m.mode() & 0o755) | 0o600 });
                h.set_size(content.len() as u64);
                builder.append_data(&mut h, &rel, content.as_slice()).map_err(io(&host))?;
                files += 1;
                bytes += content.len() as u64;
            } else if ft.is_symlink() {
                let target = dir.read_link_contents(&name).map_err(io(&host))?;
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_mode(0o777);
                h.set_size(0);
                builder.append_link(&mut h, &rel, &target).map_err(io(&host))?;
            } else {
                return Err(StageError::Refused {
                    path: host,
                    why: "is a fifo, socket or device; only files, directories and symlinks can be staged",
                });
            }
            if staged > limit {
                return Err(StageError::TooLarge { bytes: staged, limit });
            }
        }
    }
    let tar = builder.into_inner().map_err(io(root))?;
    Ok(Packed { tar: tar.into(), files, bytes })
}

/// The most bytes [`unpack`] accepts from the engine for a workspace of `limit` bytes: the
/// content, plus a header and a padding block per entry, plus the end of the archive.
#[must_use]
pub fn archive_bound(limit: u64) -> u64 {
    limit + (MAX_ENTRIES as u64 + 1) * 1024 + 10_240
}

/// What a file that is not a regular file is, as a refusal names it (`not a regular file
/// (a fifo)`): one naming for every reader of a host or guest path (this module, `files`).
pub(crate) fn kind_name(dir: bool, fifo: bool, socket: bool, device: bool) -> &'static str {
    match (dir, fifo, socket, device) {
        (true, ..) => "directory",
        (_, true, ..) => "fifo",
        (_, _, true, _) => "socket",
        (.., true) => "device",
        _ => "special file",
    }
}

/// Reads the regular file at `path` (a snapshot, an archive), at most `bound` bytes. The
/// open never waits and never follows a final link (`O_NONBLOCK | O_NOFOLLOW`): a fifo opens
/// at once with no writer and is refused by its type, as are sockets, devices and
/// directories, so a caller's path cannot hold a thread until a writer comes.
pub fn read_regular(path: &Path, bound: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
    let file = std::fs::OpenOptions::new().read(true).custom_flags(O_NONBLOCK | O_NOFOLLOW).open(path)?;
    let ft = file.metadata()?.file_type();
    if !ft.is_file() {
        let device = ft.is_char_device() || ft.is_block_device();
        let what = kind_name(ft.is_dir(), ft.is_fifo(), ft.is_socket(), device);
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("not a regular file (a {what})")));
    }
    let mut bytes = Vec::new();
    file.take(bound.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > bound {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("over the {bound}-byte bound")));
    }
    Ok(bytes)
}

/// What [`unpack`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Applied {
    /// Files created or changed on the host.
    pub written: usize,
    /// Files already identical on the host.
    pub unchanged: usize,
    /// Directories created on the host.
    pub dirs: usize,
    /// Symlinks restored (a snapshot's; [`unpack`] restores none).
    pub links: usize,
    /// Entries not applied (links, special files, protected paths, names or places that are
    /// not plain): the exact count.
    pub skipped: usize,
    /// The first few skipped names, with why.
    pub skipped_names: Vec<String>,
}

impl Applied {
    fn skip(&mut self, name: &Path, why: &str) {
        self.skipped += 1;
        if self.skipped_names.len() < MAX_LISTED {
            self.skipped_names.push(format!("{} ({why})", name.display()));
        }
    }
}

/// Applies the archive the sandbox returned for its `/workspace` (entries named
/// `workspace/...`, as the docker engine names them) to the host directory `dest` (see the
/// module docs). `archive` must already be bounded by the caller ([`archive_bound`]).
pub fn unpack(archive: &[u8], dest: &Path) -> Result<Applied, StageError> {
    unpack_into(archive, dest, "workspace", true)
}

/// [`unpack`] of an archive [`pack`] made (entries named from the directory's root, no
/// prefix), into `dest`, with the same rules but the protected paths' (`guarded: false`: a
/// session's home from its snapshot, a directory no host program runs code from), and one
/// more kind: symlinks are restored as the guest left them (a virtualenv's
/// `bin/python -> /usr/bin/python3`), made where nothing is and never followed: an entry
/// under a restored link is skipped, as under any link.
pub fn unpack_snapshot(archive: &[u8], dest: &Path) -> Result<Applied, StageError> {
    unpack_into(archive, dest, "", false)
}

/// Longest symlink target restored: Linux's `PATH_MAX` less its NUL.
const MAX_LINK_TARGET: usize = 4095;

fn unpack_into(archive: &[u8], dest: &Path, prefix: &str, guarded: bool) -> Result<Applied, StageError> {
    let top = open_root(dest)?;
    let mut applied = Applied::default();
    let mut ar = tar::Archive::new(archive);
    let entries = ar.entries().map_err(|e| StageError::Archive(e.to_string()))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| StageError::Archive(e.to_string()))?;
        let raw = entry.path().map_err(|e| StageError::Archive(e.to_string()))?.into_owned();
        // The engine names entries after the directory asked for: `workspace/...`.
        let rel = match raw.strip_prefix(prefix) {
            Ok(r) => r.to_path_buf(),
            Err(_) => {
                applied.skip(&raw, "outside /workspace");
                continue;
            }
        };
        if rel.as_os_str().is_empty() {
            continue;
        }
        // A NUL cannot be in a host name (a PAX header can carry one), and a component longer
        // than the host allows would fail the whole apply-back instead of this entry.
        if !rel.components().all(|c| matches!(c, Component::Normal(_))) || rel.as_os_str().as_bytes().contains(&0) {
            applied.skip(&rel, "not a plain relative name");
            continue;
        }
        if rel.components().any(|c| c.as_os_str().len() > MAX_NAME) {
            applied.skip(&rel, "a name longer than the host allows");
            continue;
        }
        let kind = entry.header().entry_type();
        // A protected path or anything under it, and a pinned directory's name as anything
        // but a directory (a gitfile would point git at the guest's own hooks).
        let pinned_not_dir = PINNED_DIRS.iter().any(|p| rel == Path::new(p)) && !kind.is_dir();
        if guarded && (pinned_not_dir || stockade_protocol::is_protected(&rel)) {
            applied.skip(&rel, "protected path");
            continue;
        }
        let link = !guarded && kind.is_symlink();
        if !(kind.is_dir() || kind.is_file() || link) {
            applied.skip(&rel, "not a regular file or directory");
            continue;
        }
        // The host side of one entry: a failure here (the host directory full, a quota, an
        // I/O error) skips this entry, named with the error, leaves the host file as it was,
        // and goes on, so whatever fits still comes back.
        let dir = match plain_parents(&top, &rel) {
            Ok(Some(dir)) => dir,
            Ok(None) => {
                applied.skip(&rel, "a parent is a symlink or not a directory on the host");
                continue;
            }
            Err(e) => {
                applied.skip(&rel, &format!("host: {e}"));
                continue;
            }
        };
        let name = rel.file_name().unwrap_or_default();
        if link {
            let target = entry.link_name().ok().flatten().map(std::borrow::Cow::into_owned).unwrap_or_default();
            let bytes = target.as_os_str().as_bytes();
            if bytes.is_empty() || bytes.len() > MAX_LINK_TARGET || bytes.contains(&0) {
                applied.skip(&rel, "a link without a plain target");
            } else if dir.symlink_metadata(name).is_ok() {
                applied.skip(&rel, "exists on the host");
            } else {
                match dir.symlink_contents(&target, name) {
                    Ok(()) => applied.links += 1,
                    Err(e) => applied.skip(&rel, &format!("host: {e}")),
                }
            }
            continue;
        }
        match dir.symlink_metadata(name) {
            Ok(m) if kind.is_dir() && m.is_dir() => {}
            Ok(_) if kind.is_dir() => applied.skip(&rel, "exists on the host and is not a directory"),
            Ok(m) if !m.is_file() => applied.skip(&rel, "exists on the host and is not a regular file"),
            Err(e) if e.kind() != io::ErrorKind::NotFound => applied.skip(&rel, &format!("host: {e}")),
            Err(_) if kind.is_dir() => match dir.create_dir(name) {
                Ok(()) => applied.dirs += 1,
                Err(e) => applied.skip(&rel, &format!("host: {e}")),
            },
            existing => {
                let mut content = Vec::new();
                entry.read_to_end(&mut content).map_err(|e| StageError::Archive(e.to_string()))?;
                if existing.as_ref().is_ok_and(|m| m.len() == content.len() as u64) && same(&dir, name, &content) {
                    applied.unchanged += 1;
                    continue;
                }
                // A new file keeps its mode as the guest left it, minus setuid and friends; a
                // changed one keeps the host's mode, minus the same bits.
                let mode = match &existing {
                    Ok(m) => m.mode() & 0o777,
                    Err(_) => entry.header().mode().unwrap_or(0o644) & 0o755,
                };
                match replace(&dir, name, &content, mode, existing.is_ok()) {
                    Ok(()) => applied.written += 1,
                    Err(e) => applied.skip(&rel, &format!("host: {e}; the host file is unchanged")),
                }
            }
        }
    }
    Ok(applied)
}

/// Writes `content` to `name` in `dir` through a new file beside it, renamed over `name`
/// once complete: a write that fails (the host directory full) removes the new file and
/// leaves `name` as it was.
fn replace(dir: &Dir, name: &OsStr, content: &[u8], mode: u32, replacing: bool) -> io::Result<()> {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let tmp =
        format!(".stockade-apply-{}-{}", std::process::id(), N.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let mut f =
        dir.open_with(&tmp, OpenOptions::new().write(true).create_new(true).mode(mode).custom_flags(O_NOFOLLOW))?;
    // Replacing a host file, the copy is synced first: a filesystem that reports a full
    // disk only at writeback (NFS, btrfs) would otherwise rename an incomplete file over the
    // host's. A new file is not (an fsync per file would make a large apply-back take
    // seconds, and nothing of the host's is lost if it comes up short).
    let written = f
        .write_all(content)
        .and_then(|()| f.set_permissions(Permissions::from_mode(mode)))
        .and_then(|()| if replacing { f.sync_data() } else { Ok(()) })
        .and_then(|()| dir.rename(&tmp, dir, name));
    if written.is_err() {
        let _ = dir.remove_file(&tmp);
    }
    written
}

/// Whether the regular file `name` in `dir` holds exactly `content`.
fn same(dir: &Dir, name: &OsStr, content: &[u8]) -> bool {
    let Ok(f) = dir.open_with(name, OpenOptions::new().read(true).custom_flags(O_NOFOLLOW)) else { return false };
    let mut old = Vec::with_capacity(content.len());
    f.take(content.len() as u64 + 1).read_to_end(&mut old).is_ok() && old == content
}

/// Walks `rel`'s parent directories under `top`, creating missing ones; returns the parent
/// directory, or `None` if one of them is a symlink or not a directory.
fn plain_parents(top: &Dir, rel: &Path) -> io::Result<Option<Dir>> {
    let mut dir = top.try_clone()?;
    let Some(parent) = rel.parent() else { return Ok(Some(dir)) };
    for c in parent.components() {
        let name = c.as_os_str();
        match dir.symlink_metadata(name) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::NotFound => dir.create_dir(name)?,
            Err(e) => return Err(e),
        }
        dir = match open_dir_nofollow(&dir, name) {
            Ok(d) => d,
            // Swapped for a link or a file since the check: treat it as one.
            Err(e) if matches!(e.raw_os_error(), Some(40 | 20)) => return Ok(None),
            Err(e) => return Err(e),
        };
    }
    Ok(Some(dir))
}

/// One file as an archive for the engine's upload: `name` (one plain path component) with
/// `content`, owned by `uid`:`gid`, mode 0644.
pub fn pack_file(name: &str, content: &[u8], uid: u32, gid: u32) -> Result<Vec<u8>, StageError> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(StageError::Archive(format!("{name:?} is not a plain file name")));
    }
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_uid(uid.into());
    h.set_gid(gid.into());
    h.set_mode(0o644);
    h.set_size(content.len() as u64);
    h.set_mtime(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()));
    let mut builder = tar::Builder::new(Vec::new());
    builder.append_data(&mut h, name, content).map_err(|e| StageError::Archive(e.to_string()))?;
    builder.into_inner().map_err(|e| StageError::Archive(e.to_string()))
}

/// The content of the one regular file an engine's download of a file path holds, at most
/// `limit` bytes; a directory, a link or anything else is refused by its kind.
pub fn unpack_file(archive: &[u8], limit: u64) -> Result<Vec<u8>, StageError> {
    let mut ar = tar::Archive::new(archive);
    let mut entries = ar.entries().map_err(|e| StageError::Archive(e.to_string()))?;
    let mut entry = entries
        .next()
        .ok_or_else(|| StageError::Archive("the archive is empty".into()))?
        .map_err(|e| StageError::Archive(e.to_string()))?;
    match entry.header().entry_type() {
        tar::EntryType::Regular | tar::EntryType::Continuous => {}
        tar::EntryType::Directory => return Err(StageError::Archive("is a directory".into())),
        other => return Err(StageError::Archive(format!("is not a regular file ({other:?})"))),
    }
    let size = entry.header().size().map_err(|e| StageError::Archive(e.to_string()))?;
    if size > limit {
        return Err(StageError::TooLarge { bytes: size, limit });
    }
    let mut content = Vec::new();
    entry.by_ref().take(limit).read_to_end(&mut content).map_err(|e| StageError::Archive(e.to_string()))?;
    Ok(content)
}
