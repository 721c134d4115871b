//! File descriptors and small file writes.

use std::fs::File;
use std::io;
use std::os::fd::{FromRawFd, RawFd};

use super::check;

/// Clears `FD_CLOEXEC` on `fd`, so it survives the next exec. Async-signal-safe: this is what
/// the supervisor's pre-exec hook calls between fork and exec.
pub(crate) fn clear_cloexec(fd: RawFd) -> io::Result<()> {
    // SAFETY: F_SETFD with an integer flag touches no memory; an invalid fd yields EBADF.
    check(unsafe { libc::fcntl(fd, libc::F_SETFD, 0) }).map(drop)
}

/// Sets `FD_CLOEXEC` on `fd`.
pub(crate) fn set_cloexec(fd: RawFd) -> io::Result<()> {
    // SAFETY: as above.
    check(unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) }).map(drop)
}

/// Takes ownership of an inherited descriptor after checking that it is open.
pub(crate) fn adopt(fd: RawFd) -> io::Result<File> {
    // SAFETY: F_GETFD on any integer is harmless; it tells us whether `fd` is open.
    check(unsafe { libc::fcntl(fd, libc::F_GETFD) })?;
    // SAFETY: `fd` is open (checked above), was handed to this process by its parent for
    // exactly this purpose, and nothing else in the helper owns it.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Closes every descriptor from `first` upwards except `keep`.
pub(crate) fn close_from(first: u32, keep: u32) -> io::Result<()> {
    if keep > first {
        close_range(first, keep - 1)?;
    }
    close_range(first.max(keep.saturating_add(1)), u32::MAX)
}

/// Closes the descriptors from `lo` to `hi`, both included (`close_range(2)`).
pub(crate) fn close_range(lo: u32, hi: u32) -> io::Result<()> {
    // SAFETY: close_range takes integers; closing descriptors this process owns is sound
    // because nothing after this point uses them (the caller execs next).
    super::check_long(unsafe { libc::syscall(libc::SYS_close_range, lo, hi, 0u32) }).map(drop)
}

/// Creates a pipe with both ends close-on-exec.
pub(crate) fn pipe() -> io::Result<(File, File)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 writes two descriptors into the two-element array it is given.
    check(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: both descriptors were just created by pipe2 and are owned by nobody else.
    Ok(unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) })
}

/// The events `fd` polls with for reading now, without waiting (0 if none).
fn poll_now(fd: RawFd) -> libc::c_short {
    poll_for(fd, 0)
}

/// `poll(2)` for input on `fd`, waiting up to `ms` milliseconds: the events that came.
fn poll_for(fd: RawFd, ms: libc::c_int) -> libc::c_short {
    poll_all(&[fd], ms).first().copied().unwrap_or(0)
}

/// True if the write end of the pipe whose read end is `fd` has been closed everywhere.
pub(crate) fn peer_closed(fd: RawFd) -> bool {
    poll_now(fd) & libc::POLLHUP != 0
}

/// True if `fd` (a pidfd) polls readable or hung up: the process has exited.
pub(crate) fn polls_ready(fd: std::os::fd::BorrowedFd<'_>) -> bool {
    use std::os::fd::AsRawFd;
    poll_now(fd.as_raw_fd()) & (libc::POLLIN | libc::POLLHUP) != 0
}

/// Waits up to `timeout` for `fd` (a pidfd) to poll readable: true once the process has
/// exited. Retries a poll an interrupting signal cut short.
pub(crate) fn wait_ready(fd: std::os::fd::BorrowedFd<'_>, timeout: std::time::Duration) -> bool {
    use std::os::fd::AsRawFd;
    let until = std::time::Instant::now() + timeout;
    loop {
        let left = until.saturating_duration_since(std::time::Instant::now());
        let ms = libc::c_int::try_from(left.as_millis()).unwrap_or(libc::c_int::MAX);
        if poll_for(fd.as_raw_fd(), ms) & (libc::POLLIN | libc::POLLHUP) != 0 {
            return true;
        }
        if left.is_zero() {
            return false;
        }
    }
}

/// Waits up to `ms` milliseconds (-1: without end) for any of `fds` to poll readable or hung
/// up, and returns each one's `revents` (all 0 when the time ran out or a signal cut the
/// wait short).
pub(crate) fn poll_all(fds: &[RawFd], ms: libc::c_int) -> Vec<libc::c_short> {
    let mut polls: Vec<libc::pollfd> =
        fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
    // SAFETY: `polls` is a valid array of `polls.len()` pollfds that poll may write into.
    let r = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, ms) };
    if r <= 0 {
        return vec![0; fds.len()];
    }
    polls.iter().map(|p| p.revents).collect()
}

/// Makes `fd` survive into the program `cmd` execs (the helper), by clearing close-on-exec
/// in the forked child just before exec.
pub(crate) fn keep_on_exec(cmd: &mut std::process::Command, fd: RawFd) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the hook runs in the child between fork and exec of a multi-threaded parent,
    // where only async-signal-safe calls are allowed. It calls `fcntl` (async-signal-safe)
    // through `clear_cloexec`, which neither allocates nor takes locks.
    unsafe {
        cmd.pre_exec(move || clear_cloexec(fd));
    }
}

/// A close-on-exec duplicate of `fd` numbered at least `min`.
pub(crate) fn dup_at_least(fd: RawFd, min: RawFd) -> io::Result<RawFd> {
    // SAFETY: F_DUPFD_CLOEXEC takes integers only and creates a descriptor we then own.
    check(unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, min) })
}

/// Moves `fd` onto `target` (`dup2`); the copy does not have close-on-exec set.
pub(crate) fn dup_onto(fd: RawFd, target: RawFd) -> io::Result<()> {
    // SAFETY: dup2 takes integers only; the caller owns both descriptor numbers.
    check(unsafe { libc::dup2(fd, target) }).map(drop)
}
