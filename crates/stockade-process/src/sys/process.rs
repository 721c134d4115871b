//! Process lifecycle: fork, exec, wait, ids, sessions, rlimits and signals.

use std::io;

use super::check;

/// The result of `fork`.
pub(crate) enum Fork {
    /// In the parent, with the child's pid.
    Parent(libc::pid_t),
    /// In the child.
    Child,
}

/// `fork(2)`. Only called from a single-threaded process (the helper, or the supervisor
/// after [`thread_count`] returned 1), so the child may allocate and run ordinary Rust code.
pub(crate) fn fork() -> io::Result<Fork> {
    // SAFETY: every caller has exactly one thread: the helper was just exec'd and spawns no
    // threads, and the supervisor's fork launch checks `thread_count() == 1` first (only this
    // thread could start another, and it does not in between). So the child inherits no
    // lock held by another thread, and glibc's fork resets the allocator's own locks.
    match check(unsafe { libc::fork() })? {
        0 => Ok(Fork::Child),
        pid => Ok(Fork::Parent(pid)),
    }
}

/// `clone(CLONE_PARENT | SIGCHLD)` with no new stack: a fork whose child is a child of this
/// process's parent, not of this process. Only the fork server calls it (see `forkserver`),
/// so that each helper it starts is the supervisor's own child (waited on with a pidfd,
/// reaped by the supervisor, its parent for the parent-death signal).
pub(crate) fn fork_sibling() -> io::Result<Fork> {
    // SAFETY: clone with a null stack pointer behaves as fork: the child runs on a
    // copy-on-write copy of this stack and returns here with 0. The only caller is the fork
    // server, which has exactly one thread (it is a fork of a process that was checked to be
    // single-threaded, and starts none), so no lock can be held by another thread; glibc has
    // no pid cache to refresh (since 2.25), and no atfork handler is needed in a process that
    // holds no locks across this call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (libc::CLONE_PARENT | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    match super::check_long(r)? {
        0 => Ok(Fork::Child),
        pid => Ok(Fork::Parent(pid as libc::pid_t)),
    }
}

/// `_exit(2)`: ends the process without running destructors or flushing stdio.
pub(crate) fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and is always safe to call.
    unsafe { libc::_exit(code) }
}

/// How a waited-for child ended, with the resource usage of the process and its reaped children.
pub(crate) struct Exit {
    pub(crate) pid: libc::pid_t,
    pub(crate) code: Option<i32>,
    pub(crate) signal: Option<i32>,
}

/// `waitpid(pid, 0)`, retrying on EINTR.
pub(crate) fn wait(pid: libc::pid_t) -> io::Result<Exit> {
    let mut status = 0;
    loop {
        // SAFETY: waitpid writes one int into `status`, which lives on this frame.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == -1 && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        let pid = check(r)?;
        return Ok(decode(pid, status));
    }
}

fn decode(pid: libc::pid_t, status: libc::c_int) -> Exit {
    let (code, signal) = if libc::WIFEXITED(status) {
        (Some(libc::WEXITSTATUS(status)), None)
    } else if libc::WIFSIGNALED(status) {
        (None, Some(libc::WTERMSIG(status)))
    } else {
        (None, None)
    };
    Exit { pid, code, signal }
}

/// `wait4(-1, WNOHANG)`: a child that has ended, with its CPU time (microseconds) and peak
/// RSS (bytes) (its own and its reaped children's), or `None` when no child has ended (or
/// there is none).
pub(crate) fn wait_any_nohang() -> io::Result<Option<(Exit, u64, u64)>> {
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value of this plain C struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: wait4 writes one int into `status` and one rusage into `ru`, both on this
        // frame.
        let r = unsafe { libc::wait4(-1, &mut status, libc::WNOHANG, &mut ru) };
        match r {
            0 => return Ok(None),
            -1 => match io::Error::last_os_error() {
                e if e.raw_os_error() == Some(libc::EINTR) => {}
                e if e.raw_os_error() == Some(libc::ECHILD) => return Ok(None),
                e => return Err(e),
            },
            pid => {
                let us = |t: libc::timeval| (t.tv_sec.max(0) as u64) * 1_000_000 + t.tv_usec.max(0) as u64;
                let usage = (us(ru.ru_utime) + us(ru.ru_stime), (ru.ru_maxrss.max(0) as u64) * 1024);
                return Ok(Some((decode(pid, status), usage.0, usage.1)));
            }
        }
    }
}

/// CPU time (user + system, microseconds) and peak RSS (bytes) of reaped children.
pub(crate) fn children_usage() -> (u64, u64) {
    // SAFETY: an all-zero rusage is a valid value of this plain C struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes one rusage into `ru`, which lives on this frame.
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) } != 0 {
        return (0, 0);
    }
    let us = |t: libc::timeval| (t.tv_sec.max(0) as u64) * 1_000_000 + t.tv_usec.max(0) as u64;
    (us(ru.ru_utime) + us(ru.ru_stime), (ru.ru_maxrss.max(0) as u64) * 1024)
}

/// `setsid(2)`.
pub(crate) fn setsid() -> io::Result<()> {
    // SAFETY: setsid takes no arguments.
    check(unsafe { libc::setsid() }).map(drop)
}

/// The parent's pid.
pub(crate) fn parent_pid() -> libc::pid_t {
    // SAFETY: getppid takes no arguments and cannot fail.
    unsafe { libc::getppid() }
}

/// Effective uid and gid.
pub(crate) fn ids() -> (u32, u32) {
    // SAFETY: geteuid and getegid take no arguments and cannot fail.
    unsafe { (libc::geteuid(), libc::getegid()) }
}

/// Drops supplementary groups and switches real, effective and saved ids to `uid`/`gid`.
pub(crate) fn become_user(uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: setgroups(0, NULL) clears the list and reads no memory.
    check(unsafe { libc::setgroups(0, std::ptr::null()) })?;
    // SAFETY: setresgid and setresuid take integers only.
    check(unsafe { libc::setresgid(gid, gid, gid) })?;
    // SAFETY: as above.
    check(unsafe { libc::setresuid(uid, uid, uid) }).map(drop)
}

/// `kill(2)`.
pub(crate) fn kill(pid: libc::pid_t, signal: libc::c_int) -> io::Result<()> {
    // SAFETY: kill takes integers only.
    check(unsafe { libc::kill(pid, signal) }).map(drop)
}

/// Number of threads of this process, from `/proc/self/status`.
pub(crate) fn thread_count() -> io::Result<usize> {
    parsed("/proc/self/status", "Threads:")
}

/// [`stockade_sys::proc::field`] as a number.
fn parsed<T: std::str::FromStr>(path: &str, key: &str) -> io::Result<T> {
    stockade_sys::proc::field(path, key)?
        .parse()
        .map_err(|_| io::Error::other(format!("{key} in {path} is not a number")))
}

/// The pid behind `pidfd`, from its `fdinfo`.
pub(crate) fn pidfd_pid(pidfd: std::os::fd::BorrowedFd<'_>) -> io::Result<libc::pid_t> {
    use std::os::fd::AsRawFd;
    parsed(&format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd()), "Pid:")
}

/// A pidfd for the child of `parent` (a single-threaded process), if it has one now: the
/// first pid in its `children` file, opened, and kept only if that process's parent is
/// still `parent` once the pidfd is open and the process is still there after (a pid is
/// not reused while its process exists, so the pidfd and the name agree).
pub(crate) fn child_pidfd(parent: libc::pid_t) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::AsFd;
    let children = std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children")).ok()?;
    let pid: libc::pid_t = children.split_whitespace().next()?.parse().ok()?;
    let fd = pidfd_open(pid).ok()?;
    let ppid: libc::pid_t = parsed(&format!("/proc/{pid}/status"), "PPid:").ok()?;
    (ppid == parent && pidfd_kill(fd.as_fd(), 0).is_ok()).then_some(fd)
}

/// Restores every signal to its default action and unblocks all signals, so that nothing the
/// launching process ignored or blocked (Rust ignores SIGPIPE) reaches the guest.
pub(crate) fn reset_signals() -> io::Result<()> {
    // The kernel's `struct sigaction` on x86_64: handler, flags, restorer, mask; all zero is
    // SIG_DFL with no flags and an empty mask. The raw syscall also resets the two real-time
    // signals glibc reserves for itself (32 and 33), which `signal(3)` refuses to touch.
    let default = [0u64; 4];
    for sig in 1..=64 {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: rt_sigaction reads one kernel sigaction (32 bytes, `default` on this frame)
        // and writes no old action (null); the mask size is 8 bytes, as the kernel expects.
        super::check_long(unsafe {
            libc::syscall(libc::SYS_rt_sigaction, sig, default.as_ptr(), std::ptr::null_mut::<u64>(), 8usize)
        })?;
    }
    // SAFETY: an all-zero sigset_t is the empty set; sigemptyset makes that explicit.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: sigemptyset writes into `set`, which lives on this frame.
    unsafe { libc::sigemptyset(&mut set) };
    // SAFETY: sigprocmask reads `set` and writes no old set (null).
    check(unsafe { libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut()) }).map(drop)
}

/// `pidfd_open(2)`: a descriptor that becomes readable when `pid` exits. For a child of
/// ours not yet reaped the pid cannot have been reused; for any other process the caller
/// confirms, after this, that `pid` is still the process it meant.
pub(crate) fn pidfd_open(pid: libc::pid_t) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open takes integers only.
    let fd = super::check_long(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })?;
    // SAFETY: the kernel just returned this descriptor (close-on-exec by default); we own it.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// `pidfd_getfd(2)`: a duplicate, in this process, of descriptor `fd` of the process behind
/// `pidfd` (close-on-exec). Needs ptrace access to it: our own child, same uid, dumpable.
pub(crate) fn pidfd_getfd(pidfd: std::os::fd::BorrowedFd<'_>, fd: libc::c_int) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd};
    // SAFETY: pidfd_getfd takes integers only.
    let fd = super::check_long(unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) })?;
    // SAFETY: the kernel just returned this new descriptor; we own it.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// `pidfd_send_signal(2)`: signals the process behind `pidfd` (ESRCH once it has been reaped).
pub(crate) fn pidfd_kill(pidfd: std::os::fd::BorrowedFd<'_>, signal: libc::c_int) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: a null siginfo asks the kernel to fill one in as kill(2) would; no memory is read.
    super::check_long(unsafe {
        libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), signal, std::ptr::null::<libc::siginfo_t>(), 0)
    })
    .map(drop)
}

/// Reaps the exited child behind `pidfd` (`waitid(P_PIDFD, WEXITED)`), blocking until it
/// exits unless `nohang`; `Ok(false)` means it is still running.
pub(crate) fn reap_pidfd(pidfd: std::os::fd::BorrowedFd<'_>, nohang: bool) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: an all-zero siginfo_t is a valid value of this plain C struct.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let flags = libc::WEXITED | if nohang { libc::WNOHANG } else { 0 };
    loop {
        // SAFETY: waitid writes one siginfo_t into `info`, which lives on this frame;
        // P_PIDFD (3) selects the child by the descriptor.
        let r = unsafe { libc::waitid(libc::P_PIDFD, pidfd.as_raw_fd() as libc::id_t, &mut info, flags) };
        if r == -1 && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        check(r)?;
        // SAFETY: si_pid is valid to read after a successful waitid; 0 means nothing exited.
        return Ok(unsafe { info.si_pid() } != 0);
    }
}

/// Registers a descriptor with the tokio reactor for readability (a pidfd is readable once
/// its process exits; an inotify descriptor once it has events).
pub(crate) fn register_readable(
    fd: std::os::fd::OwnedFd,
) -> io::Result<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>> {
    // SAFETY: an `OwnedFd` owns one open descriptor for its whole life, `as_raw_fd` always
    // returns that same number, and it is closed only when the `AsyncFd` drops it.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }.map_err(|e| e.into())
}
