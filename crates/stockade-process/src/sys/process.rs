//! Process lifecycle: fork, exec, wait, ids, sessions, rlimits and signals.

use std::ffi::CString;
use std::io;

use super::check;

/// The result of `fork`.
pub(crate) enum Fork {
    /// In the parent, with the child's pid.
    Parent(libc::pid_t),
    /// In the child.
    Child,
}

/// `fork(2)`. Only called from the helper, which is single-threaded, so the child may
/// allocate and run ordinary Rust code.
pub(crate) fn fork() -> io::Result<Fork> {
    // SAFETY: the helper process has exactly one thread (it was just exec'd and spawns no
    // threads), so the child inherits no locks held by other threads.
    match check(unsafe { libc::fork() })? {
        0 => Ok(Fork::Child),
        pid => Ok(Fork::Parent(pid)),
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
        let (code, signal) = if libc::WIFEXITED(status) {
            (Some(libc::WEXITSTATUS(status)), None)
        } else if libc::WIFSIGNALED(status) {
            (None, Some(libc::WTERMSIG(status)))
        } else {
            (None, None)
        };
        return Ok(Exit { pid, code, signal });
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

/// `setrlimit(2)` with soft and hard limits.
pub(crate) fn set_rlimit(resource: libc::__rlimit_resource_t, soft: u64, hard: u64) -> io::Result<()> {
    let lim = libc::rlimit { rlim_cur: soft, rlim_max: hard };
    // SAFETY: setrlimit reads one rlimit struct, which lives on this frame.
    check(unsafe { libc::setrlimit(resource, &lim) }).map(drop)
}

/// `kill(2)`.
pub(crate) fn kill(pid: libc::pid_t, signal: libc::c_int) -> io::Result<()> {
    // SAFETY: kill takes integers only.
    check(unsafe { libc::kill(pid, signal) }).map(drop)
}

/// `execve(2)`: replaces the process image; returns only on failure.
pub(crate) fn exec(program: &str, argv: &[String], env: &[(String, String)]) -> io::Error {
    let to_c = |s: &str| CString::new(s).map_err(|_| io::Error::other("argument contains a NUL byte"));
    let build = || -> io::Result<(CString, Vec<CString>, Vec<CString>)> {
        let prog = to_c(program)?;
        let args = argv.iter().map(|a| to_c(a)).collect::<io::Result<Vec<_>>>()?;
        let envs = env.iter().map(|(k, v)| to_c(&format!("{k}={v}"))).collect::<io::Result<Vec<_>>>()?;
        Ok((prog, args, envs))
    };
    let (prog, args, envs) = match build() {
        Ok(v) => v,
        Err(e) => return e,
    };
    let mut argp: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argp.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = envs.iter().map(|e| e.as_ptr()).collect();
    envp.push(std::ptr::null());
    // SAFETY: `prog` and every element of `argp` and `envp` point at NUL-terminated strings
    // owned by `prog`, `args` and `envs`, which outlive the call; both arrays end with NULL.
    unsafe { libc::execve(prog.as_ptr(), argp.as_ptr(), envp.as_ptr()) };
    io::Error::last_os_error()
}
