//! A host uid (and gid) of its own for each process session's guest, when the owner runs as
//! root: the kernel counts inotify instances and watches, `RLIMIT_NPROC`, mqueue bytes, pipe
//! buffers and keys per user, so a guest that shares a uid with other sessions can spend
//! their share. Ids come from one fixed range ([`GUEST_ID_BASE`], [`GUEST_IDS`] of them),
//! like a subordinate range of rootless podman's. An id is claimed by a lock on a file named
//! for it in [`GUEST_ID_LOCK_DIR`] (`flock`, held by the open file for the session's life and
//! released by the kernel if the owner dies), so two owners on one host never hand out one
//! id at once; an id that `/etc/passwd` gives a user is never handed out.
//!
//! An owner in a user namespace that does not map that range (a Kubernetes pod with
//! `hostUsers: false` maps 65,536 ids) takes its ids from the upper half of the largest
//! extent both its uid and gid maps hold, below 65534 (`nobody`): 32,767 in such a pod, each
//! a host id of the pod's own range. The lock directory is then the pod's own, as the range is.

use std::io;
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::Path;
use std::sync::OnceLock;

use stockade_protocol::RunError;

/// The first host id of the range.
pub const GUEST_ID_BASE: u32 = 0x5AF0_0000;
/// How many ids the range holds: more than sessions one host can run.
pub const GUEST_IDS: u32 = 1 << 16;
/// Where the claims are (root's, 0700).
pub const GUEST_ID_LOCK_DIR: &str = "/run/stockade-guest-ids";

/// One claimed id: the claim lasts as long as this value.
#[derive(Debug)]
pub(crate) struct GuestId {
    id: u32,
    _claim: std::fs::File,
}

impl GuestId {
    /// The id.
    pub(crate) fn id(&self) -> u32 {
        self.id
    }

    /// Claims the first free id of the range at or after its start plus `hint` (wrapping).
    pub(crate) fn claim(hint: u32) -> Result<Self, RunError> {
        Self::claim_in(Path::new(GUEST_ID_LOCK_DIR), hint)
    }

    fn claim_in(dir: &Path, hint: u32) -> Result<Self, RunError> {
        let (base, count) = *range();
        if count == 0 {
            return Err(RunError::Unsupported {
                mechanism: "a host uid of the session's own".into(),
                reason: "this owner's user namespace maps no range of ids for its sessions' guests (/proc/self/uid_map, gid_map)".into(),
            });
        }
        let unsupported = |e: io::Error| RunError::Unsupported {
            mechanism: "a host uid of the session's own".into(),
            reason: format!("claiming one in {}: {e}", dir.display()),
        };
        lock_dir(dir).map_err(unsupported)?;
        let taken = passwd_ids();
        for i in 0..count {
            let id = base + (hint.wrapping_add(i) % count);
            if taken.contains(&id) {
                continue;
            }
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .custom_flags(libc_o_nofollow())
                .open(dir.join(id.to_string()))
                .map_err(unsupported)?;
            match file.try_lock() {
                Ok(()) => return Ok(Self { id, _claim: file }),
                Err(std::fs::TryLockError::WouldBlock) => {}
                Err(std::fs::TryLockError::Error(e)) => return Err(unsupported(e)),
            }
        }
        Err(RunError::Misconfigured(format!("every one of the {count} session guest ids is in use")))
    }
}

/// `O_NOFOLLOW` (this crate has no libc dependency; the value is per architecture).
const fn libc_o_nofollow() -> i32 {
    if cfg!(target_arch = "aarch64") { 0o100_000 } else { 0o400_000 }
}

/// The claims' directory, made 0700 if it is missing, and refused unless it is a directory
/// of root's that no one else can write.
fn lock_dir(dir: &Path) -> io::Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() || meta.uid() != 0 || meta.mode() & 0o022 != 0 {
        return Err(io::Error::other(format!(
            "{} is not a directory of root's that only root can write",
            dir.display()
        )));
    }
    Ok(())
}

/// The range this owner hands out, (first, count), read from its id maps once.
fn range() -> &'static (u32, u32) {
    static RANGE: OnceLock<(u32, u32)> = OnceLock::new();
    RANGE.get_or_init(|| {
        let read = |f: &str| std::fs::read_to_string(format!("/proc/self/{f}")).unwrap_or_default();
        range_in(&read("uid_map"), &read("gid_map"))
    })
}

/// The ids inside a namespace whose maps are `uid_map` and `gid_map` (as `/proc` prints
/// them): the fixed range when both map all of it; else the upper half of the largest
/// extent both map, below 65534; else none. Only the inside ids matter: the kernel turns
/// each into the host's through the same maps.
fn range_in(uid_map: &str, gid_map: &str) -> (u32, u32) {
    let extents = |text: &str| -> Vec<(u64, u64)> {
        text.lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace().map(|w| w.parse::<u64>().ok());
                let (inside, _outside, count) = (f.next()??, f.next()??, f.next()??);
                Some((inside, inside + count))
            })
            .collect()
    };
    let (uids, gids) = (extents(uid_map), extents(gid_map));
    let fixed = (u64::from(GUEST_ID_BASE), u64::from(GUEST_ID_BASE) + u64::from(GUEST_IDS));
    let holds = |ext: &[(u64, u64)], (a, b): (u64, u64)| ext.iter().any(|(s, e)| *s <= a && b <= *e);
    if holds(&uids, fixed) && holds(&gids, fixed) {
        return (GUEST_ID_BASE, GUEST_IDS);
    }
    let mut best = (0u64, 0u64);
    for (us, ue) in &uids {
        for (gs, ge) in &gids {
            let (s, e) = ((*us).max(*gs), (*ue).min(*ge).min(65534));
            if e > s && e - s > best.1 - best.0 {
                best = (s, e);
            }
        }
    }
    let (s, e) = best;
    let start = s + (e - s) / 2;
    match (u32::try_from(start), u32::try_from(e - start)) {
        (Ok(start), Ok(count)) if start >= 1000 && count > 0 => (start, count),
        _ => (0, 0),
    }
}

/// The uids `/etc/passwd` names inside the range, read once.
fn passwd_ids() -> &'static Vec<u32> {
    static IDS: OnceLock<Vec<u32>> = OnceLock::new();
    IDS.get_or_init(|| {
        let (base, count) = *range();
        let text = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
        text.lines()
            .filter_map(|l| l.split(':').nth(2)?.parse::<u32>().ok())
            .filter(|id| (u64::from(base)..u64::from(base) + u64::from(count)).contains(&u64::from(*id)))
            .collect()
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use super::*;

    #[test]
    fn the_range_is_the_fixed_one_where_mapped_and_else_the_upper_half_of_a_pod_s() {
        let host = "         0          0 4294967295\n";
        assert_eq!(range_in(host, host), (GUEST_ID_BASE, GUEST_IDS));
        // A Kubernetes pod with hostUsers: false: 65,536 ids from a host offset.
        let pod = "         0    1376256      65536\n";
        assert_eq!(range_in(pod, pod), (32767, 32767));
        // Uids and gids map different extents: their overlap.
        assert_eq!(range_in("0 100000 65536\n", "0 100000 40000\n"), (20000, 20000));
        // One id (an unprivileged owner's own) or only low ids: none.
        assert_eq!(range_in("0 1000 1\n", "0 1000 1\n"), (0, 0));
        assert_eq!(range_in("0 100000 1500\n", "0 100000 1500\n"), (0, 0));
        assert_eq!(range_in("", ""), (0, 0));
    }

    #[test]
    fn two_claims_get_two_ids_and_a_released_one_is_free_again() {
        if !stockade_sys::proc::is_root().unwrap_or(false) {
            eprintln!("SKIPPED: the claims' directory must be root's");
            return;
        }
        let dir = std::env::temp_dir().join(format!("stockade-guest-ids-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let a = GuestId::claim_in(&dir, 7).unwrap();
        let b = GuestId::claim_in(&dir, 7).unwrap();
        assert_eq!(a.id(), GUEST_ID_BASE + 7);
        assert_eq!(b.id(), GUEST_ID_BASE + 8);
        drop(a);
        assert_eq!(GuestId::claim_in(&dir, 7).unwrap().id(), GUEST_ID_BASE + 7);
        // A claims directory another user could write is refused.
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        assert!(matches!(GuestId::claim_in(&dir, 0), Err(RunError::Unsupported { .. })));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
