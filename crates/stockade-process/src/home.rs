//! A session home of a fixed size: a tmpfs the supervisor mounts on the host directory it
//! made for the session, in its own (the host's) mount namespace, so that the session's view
//! (which binds the directory) and the host's files API and snapshots (which open it) see
//! the same files, and a write past the size fails with `ENOSPC` in the guest. The tmpfs's
//! pages are charged to the memory cgroup of the process that writes them: the session's.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use stockade_protocol::RunError;

use crate::sys::mount;

/// A tmpfs mounted on a session's home; unmounted (lazily, so a straggler's open file never
/// keeps it) when dropped.
#[derive(Debug)]
pub struct HomeMount {
    path: PathBuf,
}

impl HomeMount {
    /// Mounts a tmpfs of `bytes` on the empty directory `home` (nosuid, nodev), with the
    /// directory's owner and mode. Needs root: without it, this is
    /// [`RunError::Unsupported`], naming the mechanism.
    pub fn mount(home: &Path, bytes: u64) -> Result<Self, RunError> {
        let unsupported = |reason: String| RunError::Unsupported { mechanism: "session disk limit".into(), reason };
        if !stockade_sys::proc::is_root().unwrap_or(false) {
            return Err(unsupported(
                "a session's disk limit is a tmpfs the supervisor mounts on the session's home, which takes root"
                    .into(),
            ));
        }
        if bytes == 0 {
            return Err(RunError::Misconfigured("a session's disk limit must be over 0 bytes".into()));
        }
        let meta = std::fs::symlink_metadata(home)
            .map_err(|e| RunError::Misconfigured(format!("session home {}: {e}", home.display())))?;
        if !meta.is_dir() {
            return Err(RunError::Misconfigured(format!("session home {} is not a directory", home.display())));
        }
        let data = format!(
            "size={bytes},nr_inodes={},mode={:o},uid={},gid={}",
            inodes(bytes),
            meta.mode() & 0o7777,
            meta.uid(),
            meta.gid()
        );
        mount::mount(Path::new("tmpfs"), home, "tmpfs", libc::MS_NOSUID | libc::MS_NODEV, &data)
            .map_err(|e| unsupported(format!("mounting a tmpfs of {bytes} bytes on {}: {e}", home.display())))?;
        Ok(Self { path: home.to_path_buf() })
    }
}

impl Drop for HomeMount {
    fn drop(&mut self) {
        let _ = mount::umount(&self.path, libc::MNT_DETACH);
    }
}

/// Inodes for a tmpfs of `bytes`: one per 4 KiB, at least 1024, so a flood of empty files
/// meets a bound too.
fn inodes(bytes: u64) -> u64 {
    (bytes / 4096).max(1024)
}

/// Unmounts (lazily) every mount at or under `dir` in this mount namespace, deepest first,
/// before `dir` is removed: what a SIGKILLed owner's session homes left mounted. Returns how
/// many were unmounted.
pub fn unmount_under(dir: &Path) -> usize {
    stockade_sys::proc::mount_points_under(dir).iter().filter(|p| mount::umount(p, libc::MNT_DETACH).is_ok()).count()
}

/// The filesystem holding `dir`: bytes used and its size (`statvfs`), e.g. a session home's
/// size cap and what is in it. `None` if it cannot be read.
#[must_use]
pub fn disk_usage(dir: &std::path::Path) -> Option<(u64, u64)> {
    let v = rustix::fs::statvfs(dir).ok()?;
    let total = v.f_blocks.saturating_mul(v.f_frsize);
    let free = v.f_bfree.saturating_mul(v.f_frsize);
    Some((total.saturating_sub(free), total))
}
