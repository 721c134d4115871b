//! A session's init (pid 1 of the session's pid namespace), once the view is built: it takes
//! [`SessionRequest`]s on its socket for as long as the session lives, spawns one guest per
//! exec (confined as a run's guest: `helper::start_guest`, the way a run's guest starts), signals an exec's
//! process group when asked, and reaps everything, orphans included. When the socket ends
//! (the supervisor closed it, or died), init returns, and the kernel kills every process
//! left in the session.
//!
//! Init is single-threaded and waits in `poll(2)` on the socket and each running exec's
//! pidfd; orphans (a daemon whose parent exited) are reaped at each wake-up and at least
//! every [`REAP_EVERY_MS`].

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use crate::helper::{JobRef, Prepared, Reporter};
use crate::spec::{MAX_SPEC, Msg, SessionRequest, Spec};
use crate::sys::{fs as sysfs, process};

/// The longest init waits between two reaps of orphaned processes.
const REAP_EVERY_MS: i32 = 500;

/// A running exec: its id, its guest's pid (in the session's namespace), the pidfd that
/// wakes init when it ends, and its status pipe, on which init writes its exit.
struct Running {
    id: u64,
    pid: libc::pid_t,
    pidfd: OwnedFd,
    status: File,
}

/// Serves the session until its socket ends. Returns init's exit code.
pub(crate) fn serve(spec: &Spec, rep: &mut Reporter, sock_fd: i32) -> i32 {
    let Ok(sock) = sysfs::adopt(sock_fd).map(OwnedFd::from) else {
        return rep.fail("session", false, "the session socket is not open");
    };
    let _ = sysfs::set_cloexec(sock.as_raw_fd());
    // Built once; init enters and installs them, and every exec's guest inherits them.
    let mut pre = match Prepared::build(spec) {
        Ok(p) => p,
        Err((stage, e)) => return rep.fail(stage, true, e),
    };
    rep.send(&Msg::Ready);
    crate::helper::release_stdio(spec);
    let mut running: Vec<Running> = Vec::new();
    let mut buf = vec![0u8; MAX_SPEC];
    loop {
        let mut fds = vec![sock.as_raw_fd()];
        fds.extend(running.iter().map(|r| r.pidfd.as_raw_fd()));
        let ready = sysfs::poll_all(&fds, REAP_EVERY_MS);
        reap(&mut running);
        if ready.first().is_some_and(|e| e & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0) {
            match receive(&sock, &mut buf) {
                Some((len, passed)) => handle(spec, &mut pre, &buf[..len], passed, &mut running),
                None => return 0,
            }
        }
    }
}

/// One message from the socket, or `None` at its end (or on an error reading it).
fn receive(sock: &OwnedFd, buf: &mut [u8]) -> Option<(usize, Vec<OwnedFd>)> {
    let got = crate::fdpass::recv(sock.as_fd(), buf).ok()?;
    if got.len == 0 && got.fds.is_empty() {
        return None;
    }
    // A message cut short is answered like a malformed one: ignored, its descriptors closed
    // (so the supervisor sees the exec's status pipe end with no exit, and says so).
    if got.truncated {
        return Some((0, Vec::new()));
    }
    Some((got.len, got.fds))
}

fn handle(spec: &Spec, pre: &mut Prepared, msg: &[u8], passed: Vec<OwnedFd>, running: &mut Vec<Running>) {
    match serde_json::from_slice::<SessionRequest>(msg) {
        Ok(SessionRequest::Exec { id, program, args, env, cwd, limits, tty }) => {
            let Ok([stdin, stdout, stderr, status]) = <[OwnedFd; 4]>::try_from(passed) else { return };
            let job = JobRef { program: &program, args: &args, env: &env, limits, cwd: cwd.as_deref(), tty };
            if let Some(r) = start(spec, pre, id, &job, [stdin, stdout, stderr], File::from(status)) {
                running.push(r);
            }
        }
        Ok(SessionRequest::Signal { id, signal }) => {
            if let Some(r) = running.iter().find(|r| r.id == id) {
                // The exec's guest leads its own process group; a group that is gone already
                // (the leader's children went their own way) leaves the leader itself.
                if process::kill(-r.pid, signal).is_err() {
                    let _ = process::kill(r.pid, signal);
                }
            }
        }
        Err(_) => {}
    }
}

/// Starts the exec's guest with the exec's descriptors as 0–2 (`helper::start_guest`,
/// which reports its start and its steps on the status pipe), and keeps its pidfd.
fn start(
    spec: &Spec,
    pre: &mut Prepared,
    id: u64,
    job: &JobRef<'_>,
    stdio: [OwnedFd; 3],
    status: File,
) -> Option<Running> {
    let mut rep = Reporter::new(status);
    let fds = [stdio[0].as_raw_fd(), stdio[1].as_raw_fd(), stdio[2].as_raw_fd()];
    let pid = crate::helper::start_guest(spec, pre, job, fds, &mut rep, true)?;
    drop(stdio);
    match process::pidfd_open(pid) {
        Ok(pidfd) => Some(Running { id, pid, pidfd, status: rep.into_file() }),
        Err(e) => {
            let _ = process::kill(pid, libc::SIGKILL);
            rep.fail("guest", false, format!("pidfd_open: {e}"));
            None
        }
    }
}

/// Reaps every process that has ended: an exec's guest gets its exit written on its status
/// pipe, which then closes; an orphan is simply reaped.
fn reap(running: &mut Vec<Running>) {
    while let Ok(Some((exit, cpu_us, max_rss))) = process::wait_any_nohang() {
        if let Some(i) = running.iter().position(|r| r.pid == exit.pid) {
            let r = running.swap_remove(i);
            let mut rep = Reporter::new(r.status);
            rep.send(&Msg::Exit { code: exit.code, signal: exit.signal, cpu_us, max_rss });
        }
    }
}
