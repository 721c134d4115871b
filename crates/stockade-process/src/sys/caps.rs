//! Capabilities, `no_new_privs`, parent-death signals and the dumpable flag.

use std::io;

use super::{check, check_long};

/// Highest capability number we drop from the bounding set (CAP_LAST_CAP is 40 on 6.x).
const CAP_MAX: libc::c_int = 63;

/// Sets `no_new_privs`: exec can never grant privileges again.
pub(crate) fn set_no_new_privs() -> io::Result<()> {
    // SAFETY: PR_SET_NO_NEW_PRIVS takes integer arguments only and touches no memory.
    check(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) }).map(drop)
}

/// Asks the kernel to send SIGKILL to this process when its parent thread exits.
pub(crate) fn set_parent_death_kill() -> io::Result<()> {
    // SAFETY: PR_SET_PDEATHSIG takes a signal number and touches no memory.
    check(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) }).map(drop)
}

/// Makes this process a child subreaper: a descendant orphaned by its parent's death
/// becomes this process's child rather than the machine's PID 1's.
pub(crate) fn set_child_subreaper() -> io::Result<()> {
    // SAFETY: PR_SET_CHILD_SUBREAPER takes an integer and touches no memory.
    check(unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) }).map(drop)
}

/// `capget`/`capset`'s header (linux/capability.h).
#[repr(C)]
struct Header {
    version: u32,
    pid: libc::c_int,
}

/// `capget`/`capset`'s data: version 3 takes two, the low and the high 32 capabilities.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Data {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// `_LINUX_CAPABILITY_VERSION_3`.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// Drops every capability from the bounding, ambient, effective, permitted and inheritable sets.
pub(crate) fn drop_all() -> io::Result<()> {
    for cap in 0..=CAP_MAX {
        // SAFETY: PR_CAPBSET_DROP takes a capability number and touches no memory.
        let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
        if r == -1 {
            match io::Error::last_os_error() {
                // Past the kernel's last capability (numbers are contiguous from 0): done.
                e if e.raw_os_error() == Some(libc::EINVAL) && cap > 0 => break,
                e => return Err(e),
            }
        }
    }
    // SAFETY: PR_CAP_AMBIENT_CLEAR_ALL takes integer arguments only.
    check(unsafe { libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) })?;
    let mut header = Header { version: CAPABILITY_VERSION_3, pid: 0 };
    let data = [Data::default(); 2];
    // SAFETY: capset reads one header and two data structs of exactly these layouts
    // (linux/capability.h, version 3), both live for the duration of the call.
    check_long(unsafe { libc::syscall(libc::SYS_capset, &mut header as *mut Header, data.as_ptr()) }).map(drop)
}

/// This process's capability sets, low and high 32 (`capget(2)`: one call, where
/// `/proc/self/status` is an open and a read).
fn capget() -> io::Result<[Data; 2]> {
    let mut header = Header { version: CAPABILITY_VERSION_3, pid: 0 };
    let mut data = [Data::default(); 2];
    // SAFETY: capget reads one header and writes two data structs of exactly these layouts
    // (linux/capability.h, version 3), both live on this frame for the duration of the call.
    check_long(unsafe { libc::syscall(libc::SYS_capget, &mut header as *mut Header, data.as_mut_ptr()) })?;
    Ok(data)
}

/// The capabilities this process still holds, effective, permitted or inheritable, as one
/// 64-bit mask.
pub(crate) fn remaining() -> io::Result<u64> {
    let data = capget()?;
    let half = |d: &Data| u64::from(d.effective | d.permitted | d.inheritable);
    Ok(half(&data[0]) | (half(&data[1]) << 32))
}

/// `CAP_KILL` (linux/capability.h): signals to processes of other uids.
pub(crate) const CAP_KILL: u32 = 5;

/// This process's effective capabilities, as one 64-bit mask.
pub(crate) fn effective() -> io::Result<u64> {
    let data = capget()?;
    Ok(u64::from(data[0].effective) | (u64::from(data[1].effective) << 32))
}

/// Marks the process not dumpable: its `/proc/PID` files become root-owned and its memory,
/// environment and descriptors are out of reach of same-uid processes without
/// `CAP_SYS_PTRACE`. An exec of a normal program makes it dumpable again.
pub(crate) fn set_not_dumpable() -> io::Result<()> {
    // SAFETY: PR_SET_DUMPABLE takes an integer and touches no memory.
    check(unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) }).map(drop)
}

/// Marks the process dumpable again. Changing credentials (root → nobody) clears the flag,
/// which makes `/proc/self/*` root-owned and the id-map files unwritable for the new uid.
pub(crate) fn set_dumpable() -> io::Result<()> {
    // SAFETY: PR_SET_DUMPABLE takes an integer and touches no memory.
    check(unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) }).map(drop)
}
