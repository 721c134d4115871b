//! Thin, checked wrappers over the Linux system calls the tier needs that `landlock` and
//! `seccompiler` do not cover. This module (one file per syscall family) is the only place
//! in the workspace with `unsafe` code that is not a test; every block says why it is sound.
//!
//! Everything here runs either in the supervisor (which may be multi-threaded: there, only
//! `spawn`'s pre-exec hook runs between fork and exec, and it only calls `fcntl`; a fork
//! launch first checks that the supervisor has one thread), or in the helper, a
//! single-threaded process, where allocating after `fork` is safe. A session's exec is the
//! exception: its guest is the child of a `CLONE_VM` clone (`spawn`), sharing init's memory,
//! where only this module's plain system-call wrappers run, allocating nothing.

#![allow(unsafe_code, reason = "the one module allowed to call libc directly (STYLE §5.2)")]

pub(crate) mod caps;
pub(crate) mod fs;
pub(crate) mod mount;
pub(crate) mod net;
pub(crate) mod probe;
pub(crate) mod process;
pub(crate) mod spawn;
pub(crate) mod tty;

use std::io;

/// Converts a libc return value into an `io::Result`, reading `errno` on -1.
pub(crate) fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 { Err(io::Error::last_os_error()) } else { Ok(ret) }
}

/// Like [`check`], for calls that return `c_long`.
pub(crate) fn check_long(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret == -1 { Err(io::Error::last_os_error()) } else { Ok(ret) }
}
