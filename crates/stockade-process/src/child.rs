//! The helper's side of a fork launch: what runs in a child that the supervisor forked, or
//! that the fork server cloned, before the helper's own code (`helper::run`). Both
//! `launch.rs` (the supervisor's side) and `forkserver.rs` (the server's) call it, and it
//! calls neither, so the three modules form no circle.

use std::os::fd::OwnedFd;

use crate::RunError;
use crate::spec::Spec;
use crate::sys::{fs as sysfs, process};

/// A helper that could not be started: out of processes or memory is
/// [`RunError::Exhausted`]; anything else is `otherwise`.
pub(crate) fn start_failed(what: &str, e: &std::io::Error, otherwise: fn(String) -> RunError) -> RunError {
    match e.raw_os_error() {
        Some(libc::EAGAIN | libc::ENOMEM) => RunError::Exhausted(format!("{what}: {e}")),
        _ => otherwise(format!("{what}: {e}")),
    }
}

/// In a child cloned by the fork server: the spec arrives as JSON, and the server has
/// already scrubbed its copy of the supervisor's arguments and environment.
pub(crate) fn served_child(spec: &[u8], fds: Vec<OwnedFd>) -> ! {
    match serde_json::from_slice::<Spec>(spec) {
        Ok(spec) => forked_child(spec, fds, false),
        Err(_) => process::exit_now(125),
    }
}

/// The helper in a forked (or served) child. The descriptors (stdin, stdout, stderr,
/// status, and a pre-built sandbox's job pipe) change hands as plain numbers:
/// `forked_stdio` places them at 0, 1, ... and closes everything else, so no owner may close
/// them again later.
pub(crate) fn forked_child(spec: Spec, fds: Vec<OwnedFd>, scrub: bool) -> ! {
    let fds: Vec<std::os::fd::RawFd> = fds.into_iter().map(std::os::fd::IntoRawFd::into_raw_fd).collect();
    let code = std::panic::catch_unwind(move || {
        if forked_stdio(&fds).is_err() || (scrub && scrub_inherited_args().is_err()) {
            return 125;
        }
        crate::helper::run(spec)
    })
    .unwrap_or(125);
    process::exit_now(code)
}

/// What `/proc/<pid>/cmdline` of a forked helper (and of the run's pid 1, forked from it)
/// shows, in place of the supervisor's arguments.
pub(crate) const FORKED_CMDLINE: &[u8] = b"stockade-sandbox-init (forked helper)";

/// In the forked child: overwrites the supervisor's command line and environment strings in
/// this process's memory (through `/proc/self/mem`, the setproctitle technique), so that
/// `/proc/1/cmdline`, which the kernel lets every process of the pid namespace read whatever
/// its dumpable flag, shows [`FORKED_CMDLINE`] and none of the supervisor's arguments. The
/// copies are the child's own (copy-on-write): the supervisor keeps its arguments.
pub(crate) fn scrub_inherited_args() -> std::io::Result<()> {
    use std::io::{Seek, SeekFrom, Write};
    let bad = || std::io::Error::other("unexpected /proc/self/stat");
    // arg_start is field 48, arg_end 49, env_start 50, env_end 51 (proc_pid_stat(5)).
    let fields = stockade_sys::proc::stat_fields("self").ok_or_else(bad)?;
    let f: Vec<u64> = fields.iter().skip(48 - 3).take(4).map(|v| v.parse().unwrap_or(0)).collect();
    let [arg_start, arg_end, env_start, env_end] = f[..] else { return Err(bad()) };
    let mut mem = std::fs::OpenOptions::new().write(true).open("/proc/self/mem")?;
    for (start, end, text) in [(arg_start, arg_end, FORKED_CMDLINE), (env_start, env_end, &b""[..])] {
        let len = usize::try_from(end.saturating_sub(start)).map_err(|_| bad())?;
        if len == 0 {
            continue;
        }
        let mut fill = vec![0u8; len];
        let keep = text.len().min(len.saturating_sub(1));
        fill[..keep].copy_from_slice(&text[..keep]);
        mem.seek(SeekFrom::Start(start))?;
        mem.write_all(&fill)?;
    }
    Ok(())
}

/// In the forked child: stdin, stdout, stderr and the status pipe become descriptors 0–3
/// (and a pre-built sandbox's job pipe 4), every other descriptor of the supervisor is
/// closed, and signal dispositions and the mask go back to their defaults, as an exec would
/// leave them.
fn forked_stdio(fds: &[std::os::fd::RawFd]) -> std::io::Result<()> {
    // First copy them all above the target range, so no dup2 overwrites a source.
    let mut high = Vec::with_capacity(fds.len());
    for fd in fds {
        high.push(sysfs::dup_at_least(*fd, 16)?);
    }
    for (target, h) in high.iter().enumerate() {
        sysfs::dup_onto(*h, target as i32)?;
    }
    sysfs::close_from(fds.len() as u32, u32::MAX)?;
    process::reset_signals()
}
