//! Mounts, `pivot_root`, namespaces and the hostname.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::{check, check_long};

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::other("path contains a NUL byte"))
}

fn cstr_str(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::other("string contains a NUL byte"))
}

/// `unshare(2)` with the given `CLONE_*` flags.
pub(crate) fn unshare(flags: libc::c_int) -> io::Result<()> {
    // SAFETY: unshare takes an integer flag set and touches no memory.
    check(unsafe { libc::unshare(flags) }).map(drop)
}

/// `mount(2)`. `source` and `fstype` may be empty; `data` is an fs option string.
pub(crate) fn mount(source: &Path, target: &Path, fstype: &str, flags: libc::c_ulong, data: &str) -> io::Result<()> {
    let (src, tgt, fst, dat) = (cstr(source)?, cstr(target)?, cstr_str(fstype)?, cstr_str(data)?);
    let opt = |c: &CString, empty: bool| if empty { std::ptr::null() } else { c.as_ptr() };
    // SAFETY: every pointer is either null (allowed by mount(2) for source, fstype and data)
    // or points at a NUL-terminated string that outlives the call.
    check(unsafe {
        libc::mount(
            opt(&src, source.as_os_str().is_empty()),
            tgt.as_ptr(),
            opt(&fst, fstype.is_empty()),
            flags,
            opt(&dat, data.is_empty()).cast(),
        )
    })
    .map(drop)
}

/// `umount2(2)`.
pub(crate) fn umount(target: &Path, flags: libc::c_int) -> io::Result<()> {
    let tgt = cstr(target)?;
    // SAFETY: `tgt` is NUL-terminated and outlives the call.
    check(unsafe { libc::umount2(tgt.as_ptr(), flags) }).map(drop)
}

/// `pivot_root(2)`.
pub(crate) fn pivot_root(new_root: &Path, put_old: &Path) -> io::Result<()> {
    let (a, b) = (cstr(new_root)?, cstr(put_old)?);
    // SAFETY: both pointers are NUL-terminated strings that outlive the call.
    check_long(unsafe { libc::syscall(libc::SYS_pivot_root, a.as_ptr(), b.as_ptr()) }).map(drop)
}

/// `sethostname(2)`.
pub(crate) fn set_hostname(name: &str) -> io::Result<()> {
    // SAFETY: the pointer and length describe `name`'s bytes, which outlive the call.
    check(unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) }).map(drop)
}

/// The mount flags of the filesystem at `path` that a bind remount inside a user namespace
/// must keep (the kernel locks them): nosuid, nodev, noexec and the atime flags.
pub(crate) fn mount_flags(path: &Path) -> io::Result<libc::c_ulong> {
    let p = cstr(path)?;
    // SAFETY: an all-zero statvfs is a valid value of this plain C struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `p` is NUL-terminated; statvfs writes one struct into `st` on this frame.
    check(unsafe { libc::statvfs(p.as_ptr(), &mut st) })?;
    let pairs = [
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
        (libc::ST_RELATIME, libc::MS_RELATIME),
    ];
    Ok(pairs.iter().filter(|(st_flag, _)| st.f_flag & st_flag != 0).map(|(_, ms)| *ms).fold(0, |a, b| a | b))
}

/// `struct mount_attr` of `mount_setattr(2)` (`MOUNT_ATTR_SIZE_VER0`, 32 bytes).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

/// `open_tree(path, OPEN_TREE_CLONE)`: a detached copy of the mount at `path` (not its
/// submounts), held by the returned descriptor. Opened with the caller's current rights.
pub(crate) fn open_tree_clone(path: &Path) -> io::Result<OwnedFd> {
    let p = cstr(path)?;
    let flags = OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint;
    // SAFETY: `p` is NUL-terminated and outlives the call; open_tree returns a new
    // descriptor (or -1), which we own from here on.
    let fd = check_long(unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, p.as_ptr(), flags) })?;
    let fd = i32::try_from(fd).map_err(|_| io::Error::other("open_tree returned an out-of-range fd"))?;
    // SAFETY: `fd` was just returned by the kernel and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `mount_setattr(2)` on a detached tree: idmapped through the user namespace `userns`,
/// nosuid and nodev, and read-only unless `writable`.
pub(crate) fn set_idmapped(tree: BorrowedFd<'_>, userns: BorrowedFd<'_>, writable: bool) -> io::Result<()> {
    let mut set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    if !writable {
        set |= MOUNT_ATTR_RDONLY;
    }
    let fd = u64::try_from(userns.as_raw_fd()).map_err(|_| io::Error::other("negative fd"))?;
    let attr = MountAttr { attr_set: set, attr_clr: 0, propagation: 0, userns_fd: fd };
    let empty = c"";
    // SAFETY: `attr` is a fully initialised MountAttr on this frame whose size is passed
    // alongside it, and `empty` is a NUL-terminated static string.
    check_long(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint,
            &raw const attr,
            std::mem::size_of::<MountAttr>(),
        )
    })
    .map(drop)
}

/// `move_mount(2)`: attaches the detached tree `tree` on `target`.
pub(crate) fn move_mount_onto(tree: BorrowedFd<'_>, target: &Path) -> io::Result<()> {
    let t = cstr(target)?;
    let empty = c"";
    // SAFETY: both pointers are NUL-terminated strings that outlive the call.
    check_long(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    })
    .map(drop)
}
