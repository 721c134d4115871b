//! The fork server: a small single-threaded process, forked at the start of `main`, that
//! forks each run's helper on request, so that a multi-threaded supervisor (a tokio server,
//! an agent) never executes the helper binary again.
//!
//! ```text
//! supervisor ─┬─ fork server         (forked by ForkServer::start, first thing in main;
//!             │                       holds one socket and nothing else)
//!             └─ helper ── init ── guest
//!                (cloned by the server with CLONE_PARENT: the supervisor's own child)
//! ```
//!
//! One request is one `SOCK_SEQPACKET` message from the supervisor: a kind byte, then the
//! helper's spec as JSON, with the guest's stdin, stdout and stderr, the status pipe and, for
//! a pre-built sandbox (`pool`), its job pipe, as four or five descriptors (`SCM_RIGHTS`).
//! For a clone request the server clones a child with `CLONE_PARENT`, which runs the helper
//! exactly as a forked helper does (`child::forked_child`), and answers with its pid (or
//! a negative errno). Because the helper is the supervisor's child, the supervisor waits on
//! it, kills it and reaps it through a pidfd as it does any helper, the helper's parent-death
//! signal follows the supervisor, and the server never has a child of its own to reap. The
//! last request ([`hand_over_next`]) is a become request: the server answers with its own
//! pid and runs the helper itself, already the supervisor's child, and serves nothing more.
//!
//! What holds, and how:
//! - **Forks before secrets exist.** [`start`] refuses to run when the process already has
//!   more than one thread (so it runs before any runtime or library thread starts); that it
//!   runs before the embedder reads a key, a file or a socket is the embedder's part, and
//!   documented on [`crate::ForkServer::start`]. The server overwrites its copy of the
//!   command line and environment strings at once, so the environment the program was
//!   started with (where keys usually arrive) is not in its memory.
//! - **Holds no descriptor beyond its socket.** Enforced: descriptors 0–2 become
//!   `/dev/null`, the socket becomes descriptor 3, and every other descriptor is closed
//!   before the server serves anything.
//! - **Dies with its parent.** Enforced twice: a parent-death SIGKILL armed before it checks
//!   that its parent is still the process that started it, and the end of its socket (the
//!   supervisor's end is closed when the supervisor exits) ends its loop.
//! - **Is reaped by its parent.** [`stop`] (`ForkServer::stop`, last thing in `main`) shuts
//!   its socket down and reaps it, so it is not left a zombie for the machine's PID 1.
//! - The server's signal dispositions and mask are the defaults, so each helper starts as an
//!   exec would leave it.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};

use crate::RunError;
use crate::sys::{caps, fs as sysfs, process};

use crate::spec::MAX_SPEC;

/// Most descriptors one request carries: stdin, stdout, stderr, status, and the job pipe of a
/// pre-built sandbox (or a session's socket).
const MAX_FDS: usize = crate::fdpass::MAX_FDS;

/// What the server sends once, when it is isolated and scrubbed.
const READY: &[u8; 1] = b"R";

/// A request's first byte: clone a helper and go on serving.
const CLONE: u8 = b'C';
/// A request's first byte: become the helper, and serve nothing more ([`hand_over_next`]).
const BECOME: u8 = b'B';

/// How long the supervisor waits for the server's answer before it counts the server as
/// gone: the server answers after one `clone`, so this is only ever reached if it was stopped.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// The supervisor's side of a running server.
pub(crate) struct Server {
    /// The supervisor's end of the socket; the lock keeps a request and its answer together.
    sock: Mutex<OwnedFd>,
    /// The server's pid.
    pub(crate) pid: u32,
    /// The process that started it: a later fork of the embedder is not its owner.
    owner: u32,
    /// Set once a request found the server gone, or it was stopped; launches then take the
    /// fallback.
    dead: std::sync::atomic::AtomicBool,
    /// Set once [`stop`] has reaped it (or found nothing to reap), or it has become a helper,
    /// which that helper's owner reaps.
    reaped: OnceLock<()>,
    /// Set by [`hand_over_next`]: the next request is the last, and the server runs that
    /// helper itself.
    hand_over: std::sync::atomic::AtomicBool,
}

static SERVER: OnceLock<Server> = OnceLock::new();

/// The server this process started, if any and if this process is still the one that
/// started it.
pub(crate) fn running() -> Option<&'static Server> {
    SERVER.get().filter(|s| s.owner == std::process::id() && !s.dead.load(std::sync::atomic::Ordering::Relaxed))
}

/// Starts the server (once; later calls return the running one).
pub(crate) fn start() -> Result<&'static Server, RunError> {
    if let Some(s) = running() {
        return Ok(s);
    }
    let threads = process::thread_count().map_err(|e| RunError::Internal(format!("counting threads: {e}")))?;
    if threads != 1 {
        return Err(RunError::Misconfigured(format!(
            "ForkServer::start must be called while the process is single-threaded (first thing in main, before any runtime starts), and this one has {threads} threads"
        )));
    }
    let (ours, theirs) =
        rustix::net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)
            .map_err(|e| RunError::Internal(format!("fork server socketpair: {e}")))?;
    let owner = std::process::id();
    match process::fork().map_err(|e| RunError::Internal(format!("forking the fork server: {e}")))? {
        process::Fork::Child => {
            drop(ours);
            // Never returns into the caller's `main`.
            let code = std::panic::catch_unwind(move || serve(theirs, owner)).unwrap_or(125);
            process::exit_now(code)
        }
        process::Fork::Parent(pid) => {
            drop(theirs);
            rustix::net::sockopt::set_socket_timeout(&ours, rustix::net::sockopt::Timeout::Recv, Some(ANSWER_TIMEOUT))
                .map_err(|e| RunError::Internal(format!("fork server socket timeout: {e}")))?;
            // Wait until it has closed what it inherited and scrubbed its copy of the
            // environment, so that it holds only its socket once `start` returns.
            let mut ready = [0u8; 1];
            match rustix::net::recv(&ours, &mut ready, RecvFlags::empty()) {
                Ok((1, _)) if ready == *READY => {}
                other => {
                    return Err(RunError::Internal(format!(
                        "the fork server (pid {pid}) did not become ready: {other:?}"
                    )));
                }
            }
            let server = Server {
                sock: Mutex::new(ours),
                pid: pid as u32,
                owner,
                dead: false.into(),
                reaped: OnceLock::new(),
                hand_over: false.into(),
            };
            // Only this (single) thread could have set it in between.
            Ok(SERVER.get_or_init(|| server))
        }
    }
}

/// Longest [`stop`] waits for the server to leave once its socket is shut down (it is
/// waiting in `recv`, so it leaves at once; past this it is stopped, and is killed).
const LEAVE_WITHIN: Duration = Duration::from_secs(2);

/// Ends this process's server, if it started one, and reaps it: it would die with this
/// process anyway (parent-death SIGKILL), but only its parent can reap it, and a process that
/// exits first leaves it a zombie for the machine's PID 1, which in a container may never
/// reap. The socket is shut down (the server's `recv` ends and it exits), then the server is
/// waited for, at most [`LEAVE_WITHIN`] before it is killed. Launches after this take the
/// fallback. A second call does nothing.
pub(crate) fn stop() {
    let Some(server) = SERVER.get().filter(|s| s.owner == std::process::id()) else { return };
    server.dead.store(true, std::sync::atomic::Ordering::Relaxed);
    // The lock waits out a request in flight: its helper is started and answered first.
    let sock = server.sock.lock().unwrap_or_else(PoisonError::into_inner);
    if server.reaped.set(()).is_err() {
        return;
    }
    let _ = rustix::net::shutdown(&*sock, rustix::net::Shutdown::Both);
    // A child of ours not yet reaped: its pid cannot have been reused.
    let Ok(pidfd) = process::pidfd_open(server.pid as libc::pid_t) else { return };
    if !sysfs::wait_ready(pidfd.as_fd(), LEAVE_WITHIN) {
        let _ = process::pidfd_kill(pidfd.as_fd(), libc::SIGKILL);
    }
    // SIGKILL cannot be caught: this wait is short.
    let _ = process::reap_pidfd(pidfd.as_fd(), false);
}

/// Makes the next launch through this process's server its last: the server runs that
/// run's helper itself, in its own process, instead of cloning one and serving on. For a
/// program that launches one run (a one-shot CLI), this saves a clone and the server's own
/// exit and reaping (0.07 to 0.12 ms; docs/benchmarks.md), and the helper is the same: a copy of
/// the scrubbed, isolated server, this process's child, confined as in G11. Launches after
/// it take the fallback, as after [`stop`]. Returns whether a server was running to take it.
pub(crate) fn hand_over_next() -> bool {
    running().map(|s| s.hand_over.store(true, std::sync::atomic::Ordering::Relaxed)).is_some()
}

/// Why a request to the server failed.
#[derive(Debug)]
pub(crate) enum SpawnError {
    /// The server is gone (killed, or stopped answering): the launch that found out fails
    /// with this, and later launches take the fallback.
    Gone(String),
    /// The request itself failed.
    Launch(RunError),
}

impl Server {
    /// The server, held for one request, if it is still serving: a launch that finds it
    /// handed over or stopped meanwhile takes the fallback instead.
    pub(crate) fn claim(&self) -> Option<Claim<'_>> {
        let sock = self.sock.lock().unwrap_or_else(PoisonError::into_inner);
        (!self.dead.load(std::sync::atomic::Ordering::Relaxed)).then_some(Claim { server: self, sock })
    }
}

/// The server held for one request (its lock keeps the request and its answer together).
pub(crate) struct Claim<'a> {
    server: &'a Server,
    sock: std::sync::MutexGuard<'a, OwnedFd>,
}

impl Claim<'_> {
    /// Asks the server for a helper running `spec` with `fds` (stdin, stdout, stderr, status,
    /// and a pre-built sandbox's job pipe) as its descriptors 0, 1, ... Returns the helper's
    /// pid: a child of this process (the server's own, after [`hand_over_next`]).
    pub(crate) fn spawn(self, spec: &[u8], fds: &[BorrowedFd<'_>]) -> Result<libc::pid_t, SpawnError> {
        if spec.len() > MAX_SPEC {
            return Err(SpawnError::Launch(RunError::Misconfigured(format!(
                "the job's helper spec is {} bytes, over the {MAX_SPEC}-byte limit (arguments, environment and paths together)",
                spec.len()
            ))));
        }
        let Self { server, sock } = self;
        let gone = |what: &str, e: io::Error| {
            server.dead.store(true, std::sync::atomic::Ordering::Relaxed);
            Err(SpawnError::Gone(format!("the fork server (pid {}) {what}: {e}", server.pid)))
        };
        if fds.len() > MAX_FDS {
            return Err(SpawnError::Launch(RunError::Internal("fork server: too many descriptors".into())));
        }
        let last = server.hand_over.swap(false, std::sync::atomic::Ordering::Relaxed);
        if last {
            // Whatever the answer, the server serves nothing more.
            server.dead.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let mut message = Vec::with_capacity(spec.len() + 1);
        message.push(if last { BECOME } else { CLONE });
        message.extend_from_slice(spec);
        if let Err(e) = crate::fdpass::send(sock.as_fd(), &message, fds) {
            return gone("cannot be reached", e);
        }
        let mut answer = [0u8; 4];
        let n = loop {
            match rustix::net::recv(&*sock, &mut answer, RecvFlags::empty()) {
                Ok((n, _)) => break n,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return gone("did not answer", e.into()),
            }
        };
        if n != answer.len() {
            return gone("closed its socket", io::Error::from(io::ErrorKind::UnexpectedEof));
        }
        match i32::from_ne_bytes(answer) {
            pid if pid > 0 => {
                if last {
                    // The server is the helper now, which the helper's owner reaps: `stop`
                    // has nothing to do. (A server that refused the request has exited, and
                    // `stop` reaps it.)
                    let _ = server.reaped.set(());
                }
                Ok(pid)
            }
            errno => Err(SpawnError::Launch(crate::child::start_failed(
                "the fork server could not start a helper",
                &io::Error::from_raw_os_error(-errno),
                RunError::Internal,
            ))),
        }
    }
}

/// The server's whole life, in the forked child of [`start`]. Returns only to exit.
fn serve(sock: OwnedFd, owner: u32) -> i32 {
    if caps::set_parent_death_kill().is_err() || process::parent_pid() as u32 != owner {
        return 0;
    }
    let Ok(sock) = isolate(sock) else { return 125 };
    // Its copy of the command line and environment (and every helper's, cloned from it).
    if crate::child::scrub_inherited_args().is_err() {
        return 125;
    }
    // Ready: isolated and scrubbed (`start` returns only after this).
    if rustix::net::send(&sock, READY, SendFlags::NOSIGNAL).is_err() {
        return 0;
    }
    // The kind byte, then the spec.
    let mut buf = vec![0u8; MAX_SPEC + 1];
    loop {
        let Ok(crate::fdpass::Received { len, fds, truncated }) = crate::fdpass::recv(sock.as_fd(), &mut buf) else {
            return 0;
        };
        if len == 0 && fds.is_empty() {
            // The supervisor's end is closed: it has exited.
            return 0;
        }
        let (kind, spec) = match buf[..len].split_first() {
            Some((kind, spec)) => (*kind, spec),
            None => (0, &[][..]),
        };
        if !(4..=MAX_FDS).contains(&fds.len()) || truncated || !matches!(kind, CLONE | BECOME) {
            drop(fds);
            let sent = rustix::net::send(&sock, &(-libc::EINVAL).to_ne_bytes(), SendFlags::NOSIGNAL);
            // A refused last request ends the server all the same (its supervisor reaps it).
            if sent.is_err() || kind == BECOME {
                return 0;
            }
            continue;
        }
        if kind == BECOME {
            // The last request: answer with this process's pid, then be the helper, exactly
            // as a cloned child is (`served_child` replaces the socket at descriptor 3).
            let pid = std::process::id() as i32;
            if rustix::net::send(&sock, &pid.to_ne_bytes(), SendFlags::NOSIGNAL).is_err() {
                return 0;
            }
            crate::child::served_child(spec, fds)
        }
        let answer = match process::fork_sibling() {
            Ok(process::Fork::Child) => crate::child::served_child(spec, fds),
            Ok(process::Fork::Parent(pid)) => pid,
            Err(e) => -e.raw_os_error().unwrap_or(libc::EIO),
        };
        drop(fds);
        if rustix::net::send(&sock, &answer.to_ne_bytes(), SendFlags::NOSIGNAL).is_err() {
            return 0;
        }
    }
}

/// Leaves the server with `/dev/null` as descriptors 0–2, the socket as 3, and nothing
/// else; signals at their defaults.
fn isolate(sock: OwnedFd) -> io::Result<OwnedFd> {
    use std::os::fd::IntoRawFd;
    let high = sysfs::dup_at_least(sock.as_raw_fd(), 16)?;
    drop(sock);
    let null = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null")?.into_raw_fd();
    for target in 0..3 {
        sysfs::dup_onto(null, target)?;
    }
    sysfs::dup_onto(high, 3)?;
    sysfs::close_from(4, u32::MAX)?;
    sysfs::set_cloexec(3)?;
    process::reset_signals()?;
    // Descriptor 3 is now the only copy of the socket.
    Ok(sysfs::adopt(3)?.into())
}
