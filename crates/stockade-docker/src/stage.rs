//! Staged workspaces: the host directory is copied into a size-capped tmpfs volume through
//! the archive API instead of being bind-mounted, and for a read-write grant what the run
//! left there is copied back afterwards. The container never sees a host path.
//!
//! Both directions are bounded and follow no link:
//! - [`pack`] walks the host directory without following symlinks (a symlink is stored as a
//!   symlink, which inside the container resolves in the container's own filesystem), reads
//!   each regular file through a descriptor opened with `O_NOFOLLOW` and only up to the size
//!   it had when listed, refuses fifos, sockets and devices, and stops with
//!   [`StageError::TooLarge`] or [`StageError::TooManyEntries`] before anything is uploaded.
//!   A read-only grant gives root-owned files and directories (0444/0555, exec bits kept), so
//!   the non-root guest can neither change nor add anything; a read-write grant gives them to
//!   the job user, with setuid, setgid and sticky bits dropped.
//! - [`unpack`] applies the archive the engine returns to the host directory: only regular
//!   files and directories, only names made of normal components, never into or through a
//!   host symlink (each parent is checked, and files are opened with `O_NOFOLLOW`), never a
//!   [`PROTECTED_PATHS`] entry, new files without setuid bits, identical files left alone.
//!   Links, devices and anything else are skipped and listed. Deletions are not replayed:
//!   results are merged into the host directory, nothing on the host is removed.

use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use stockade_protocol::{Access, PINNED_DIRS, PROTECTED_PATHS};

/// Default size of a staged workspace (the tmpfs volume, and the most [`pack`] uploads): 64 MiB.
pub const DEFAULT_STAGE_BYTES: u64 = 64 << 20;

/// Most files, directories and links a staged workspace may hold (also the volume's inode
/// limit, which bounds the archive's per-entry overhead on the way back): 16384.
pub const MAX_ENTRIES: usize = 16_384;

/// How many skipped names an [`Applied`] keeps (the count is exact).
const MAX_LISTED: usize = 16;

/// `O_NOFOLLOW` (the crate has no libc dependency; the value is per architecture).
#[cfg(target_arch = "aarch64")]
const O_NOFOLLOW: i32 = 0o100_000;
#[cfg(not(target_arch = "aarch64"))]
const O_NOFOLLOW: i32 = 0o400_000;

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
        source: std::io::Error,
    },
    /// The archive the engine returned is malformed or over its bound.
    #[error("the container's workspace archive: {0}")]
    Archive(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StageError + '_ {
    move |source| StageError::Io { path: path.to_path_buf(), source }
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
    let meta = fs::symlink_metadata(root).map_err(io(root))?;
    if !meta.is_dir() {
        return Err(StageError::Refused { path: root.to_path_buf(), why: "is not a directory (or is a symlink)" });
    }
    let mut builder = tar::Builder::new(Vec::new());
    let (mut entries, mut files, mut bytes, mut staged) = (0usize, 0usize, 0u64, 0u64);
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        let mut names: Vec<_> = fs::read_dir(&dir)
            .map_err(io(&dir))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .map_err(io(&dir))?;
        names.sort();
        for name in names {
            entries += 1;
            if entries > MAX_ENTRIES {
                return Err(StageError::TooManyEntries(MAX_ENTRIES));
            }
            let (host, rel) = (dir.join(&name), rel.join(&name));
            let m = fs::symlink_metadata(&host).map_err(io(&host))?;
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
                builder.append_data(&mut h, &rel, std::io::empty()).map_err(io(&host))?;
                stack.push(rel);
            } else if ft.is_file() {
                staged += m.len();
                if staged > limit {
                    return Err(StageError::TooLarge { bytes: staged, limit });
                }
                let mut content = Vec::new();
                let file = OpenOptions::new().read(true).custom_flags(O_NOFOLLOW).open(&host).map_err(io(&host))?;
                file.take(m.len()).read_to_end(&mut content).map_err(io(&host))?;
                let exec = m.mode() & 0o111;
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(if access == Access::ReadOnly { 0o444 | exec } else { (m.mode() & 0o755) | 0o600 });
                h.set_size(content.len() as u64);
                builder.append_data(&mut h, &rel, content.as_slice()).map_err(io(&host))?;
                files += 1;
                bytes += content.len() as u64;
            } else if ft.is_symlink() {
                let target = fs::read_link(&host).map_err(io(&host))?;
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

/// What [`unpack`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Applied {
    /// Files created or changed on the host.
    pub written: usize,
    /// Files already identical on the host.
    pub unchanged: usize,
    /// Directories created on the host.
    pub dirs: usize,
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

/// Applies the archive the engine returned for the container's `/workspace` to the host
/// directory `dest` (see the module docs). `archive` must already be bounded by the caller
/// ([`archive_bound`]).
pub fn unpack(archive: &[u8], dest: &Path) -> Result<Applied, StageError> {
    let meta = fs::symlink_metadata(dest).map_err(io(dest))?;
    if !meta.is_dir() {
        return Err(StageError::Refused { path: dest.to_path_buf(), why: "is not a directory (or is a symlink)" });
    }
    let mut applied = Applied::default();
    let mut ar = tar::Archive::new(archive);
    let entries = ar.entries().map_err(|e| StageError::Archive(e.to_string()))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| StageError::Archive(e.to_string()))?;
        let raw = entry.path().map_err(|e| StageError::Archive(e.to_string()))?.into_owned();
        // The engine names entries after the directory asked for: `workspace/...`.
        let rel = match raw.strip_prefix("workspace") {
            Ok(r) => r.to_path_buf(),
            Err(_) => {
                applied.skip(&raw, "outside /workspace");
                continue;
            }
        };
        if rel.as_os_str().is_empty() {
            continue;
        }
        if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
            applied.skip(&rel, "not a plain relative name");
            continue;
        }
        let kind = entry.header().entry_type();
        // A protected path or anything under it, and a pinned directory's name as anything
        // but a directory (a gitfile would point git at the guest's own hooks).
        let pinned_not_dir = PINNED_DIRS.iter().any(|p| rel == Path::new(p)) && !kind.is_dir();
        if pinned_not_dir || PROTECTED_PATHS.iter().any(|p| rel.starts_with(p)) {
            applied.skip(&rel, "protected path");
            continue;
        }
        if !(kind.is_dir() || kind.is_file()) {
            applied.skip(&rel, "not a regular file or directory");
            continue;
        }
        let Some(parent_ok) = plain_parents(dest, &rel).map_err(io(dest))? else {
            applied.skip(&rel, "a parent is a symlink or not a directory on the host");
            continue;
        };
        let target = parent_ok.join(rel.file_name().unwrap_or_default());
        match fs::symlink_metadata(&target) {
            Ok(m) if kind.is_dir() && m.is_dir() => {}
            Ok(_) if kind.is_dir() => applied.skip(&rel, "exists on the host and is not a directory"),
            Ok(m) if !m.is_file() => applied.skip(&rel, "exists on the host and is not a regular file"),
            Err(_) if kind.is_dir() => {
                fs::create_dir(&target).map_err(io(&target))?;
                applied.dirs += 1;
            }
            existing => {
                let mut content = Vec::new();
                entry.read_to_end(&mut content).map_err(|e| StageError::Archive(e.to_string()))?;
                if existing.as_ref().is_ok_and(|m| m.len() == content.len() as u64)
                    && fs::read(&target).is_ok_and(|old| old == content)
                {
                    applied.unchanged += 1;
                    continue;
                }
                let mode = entry.header().mode().unwrap_or(0o644) & 0o755;
                let mut f = OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(mode)
                    .custom_flags(O_NOFOLLOW)
                    .open(&target)
                    .map_err(io(&target))?;
                f.write_all(&content).map_err(io(&target))?;
                if existing.is_err() {
                    // A new file: its mode as the guest left it, minus setuid and friends
                    // (and whatever the host umask removed at creation).
                    f.set_permissions(fs::Permissions::from_mode(mode)).map_err(io(&target))?;
                }
                applied.written += 1;
            }
        }
    }
    Ok(applied)
}

/// Walks `rel`'s parent directories under `dest`, creating missing ones; returns the host
/// parent directory, or `None` if one of them is a symlink or not a directory.
fn plain_parents(dest: &Path, rel: &Path) -> std::io::Result<Option<PathBuf>> {
    let mut at = dest.to_path_buf();
    let Some(parent) = rel.parent() else { return Ok(Some(at)) };
    for c in parent.components() {
        at.push(c);
        match fs::symlink_metadata(&at) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => fs::create_dir(&at)?,
            Err(e) => return Err(e),
        }
    }
    Ok(Some(at))
}

/// The tmpfs option that caps the volume's entries (the volume root counts as one).
pub(crate) fn entry_count_option() -> String {
    format!("nr_inodes={}", MAX_ENTRIES + 1)
}
