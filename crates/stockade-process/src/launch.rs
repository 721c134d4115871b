//! Starting the helper, in one of two ways:
//! - **exec**: spawn a helper binary (any binary that calls [`crate::helper_main`] first),
//!   passing the spec in an environment variable. Works from any process, including a
//!   multi-threaded one: between fork and exec only `fcntl` runs.
//! - **fork**: fork the supervisor itself and run the helper's code in the child, with no
//!   exec. Saves one program start (about 1 ms here), and is sound only in a process that
//!   has exactly one thread at that moment, which is checked at every launch: only the
//!   calling thread could start another one, and it does not before `fork` returns.
//!
//! Either way the supervisor ends up with the helper's pid as a pidfd (waited on without a
//! thread, killed with `pidfd_send_signal`, reaped with `waitid(P_PIDFD)`, killed and reaped
//! on drop), the status pipe, and the guest's stdio: pipes (stdin only if the job has bytes),
//! or, for a run with a terminal, nothing here (the supervisor keeps the pty's master).

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;

use crate::child::{forked_child, start_failed};
use crate::spec::{SPEC_VAR, Spec};
use crate::sys::{fs as sysfs, process};
use crate::{RunError, forkserver};

/// How the supervisor starts the helper.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Execute this helper binary.
    Exec(PathBuf),
    /// Fork this process; if it has more than one thread, execute the fallback binary, or
    /// fail when there is none.
    Fork(Option<PathBuf>),
}

/// What the helper (and so the guest) gets as descriptors 0–2.
pub(crate) enum GuestIo {
    /// Pipes: a stdin pipe if the job has bytes (else `/dev/null`), stdout and stderr pipes.
    Pipes {
        /// Whether the job has stdin bytes.
        stdin: bool,
    },
    /// The slave side of a private pty, as stdin, stdout and stderr.
    Terminal(OwnedFd),
}

/// A started helper, not yet tied to an async runtime: its pidfd and the supervisor's ends of
/// its pipes (none for stdio when it has a terminal). Killed and reaped when dropped
/// unregistered; a pre-built sandbox waits in the pool in this form.
pub(crate) struct Started {
    pidfd: Option<OwnedFd>,
    stdin: Option<OwnedFd>,
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
    status: Option<OwnedFd>,
}

impl Started {
    /// Registers the pidfd and the pipes with the current tokio runtime.
    pub(crate) fn register(mut self) -> Result<Launched, RunError> {
        let (Some(pidfd), Some(status)) = (self.pidfd.take(), self.status.take()) else {
            return Err(RunError::Internal("a started helper was registered twice".into()));
        };
        // From here on the pidfd's owner (a `HelperProcess`) kills and reaps the helper.
        let pidfd = match process::register_readable(pidfd.try_clone().map_err(internal("duplicating the pidfd"))?) {
            Ok(p) => p,
            Err(e) => {
                let _ = process::pidfd_kill(pidfd.as_fd(), libc::SIGKILL);
                let _ = process::reap_pidfd(pidfd.as_fd(), false);
                return Err(RunError::Internal(format!("registering the pidfd: {e}")));
            }
        };
        let process = HelperProcess { pidfd, reaped: false, init: None };
        Ok(Launched {
            process,
            stdin: self.stdin.take().map(sender).transpose()?,
            stdout: self.stdout.take().map(receiver).transpose()?,
            stderr: self.stderr.take().map(receiver).transpose()?,
            status: receiver(status)?,
        })
    }

    /// Whether the helper has exited already (a pre-built sandbox whose setup failed, or that
    /// was killed from outside).
    pub(crate) fn exited(&self) -> bool {
        self.pidfd.as_ref().is_none_or(|p| sysfs::polls_ready(p.as_fd()))
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        if let Some(pidfd) = self.pidfd.take() {
            let _ = process::pidfd_kill(pidfd.as_fd(), libc::SIGKILL);
            // SIGKILL cannot be caught; the wait is short.
            let _ = process::reap_pidfd(pidfd.as_fd(), false);
        }
    }
}

/// A started helper: the process and its pipes (none for stdio when it has a terminal).
pub(crate) struct Launched {
    pub(crate) process: HelperProcess,
    pub(crate) stdin: Option<pipe::Sender>,
    pub(crate) stdout: Option<pipe::Receiver>,
    pub(crate) stderr: Option<pipe::Receiver>,
    pub(crate) status: pipe::Receiver,
}

/// The helper process, killed and reaped when dropped.
///
/// Killing it kills the run's pid 1 too, and waits for that process as well as the helper:
/// the helper is pid 1's parent, outside the run's pid namespace, so its own end says
/// nothing about the run's; pid 1's end does (the kernel kills and reaps every other
/// process of a pid namespace before its init exits), so once [`HelperProcess::wait`] or
/// the drop returns after a kill, no process of the run is left to write in the workspace,
/// with or without a cgroup.
pub(crate) struct HelperProcess {
    pidfd: AsyncFd<OwnedFd>,
    reaped: bool,
    /// The run's pid 1, when a kill found it: waited for after the helper.
    init: Option<OwnedFd>,
}

/// Longest a killed run's pid 1 is waited for: SIGKILL cannot be caught, and the kernel
/// kills the namespace's other processes at once; past this something is wrong (a process
/// stuck in the kernel) and the caller goes on.
const INIT_GONE_WITHIN: std::time::Duration = std::time::Duration::from_secs(5);

impl HelperProcess {
    /// Waits until the helper has exited, and reaps it; after a [`HelperProcess::kill`], also
    /// until the run's pid 1 has exited.
    pub(crate) async fn wait(&mut self) {
        while !self.reaped {
            let Ok(mut guard) = self.pidfd.readable().await else {
                // The reactor is gone (runtime shutting down): reap synchronously.
                self.reaped = process::reap_pidfd(self.pidfd.get_ref().as_fd(), false).is_ok();
                break;
            };
            match process::reap_pidfd(self.pidfd.get_ref().as_fd(), true) {
                Ok(true) | Err(_) => self.reaped = true,
                Ok(false) => guard.clear_ready(),
            }
        }
        if let Some(init) = self.init.take() {
            // Dying takes the kernel microseconds; poll off the runtime's threads.
            let _ = tokio::task::spawn_blocking(move || reap_orphaned_init(&init)).await;
        }
    }

    /// A duplicate of the helper's pidfd.
    /// SIGKILLs the helper (and so the run's init and every process of the run) without
    /// waiting; [`HelperProcess::wait`] or the drop reaps it.
    pub(crate) fn signal_kill(&self) {
        let _ = process::pidfd_kill(self.pidfd.get_ref().as_fd(), libc::SIGKILL);
    }

    /// The helper's pid (in this process's pid namespace), while it lives.
    pub(crate) fn pid(&self) -> Option<libc::pid_t> {
        process::pidfd_pid(self.pidfd.get_ref().as_fd()).ok().filter(|p| *p > 0)
    }

    /// Whether the helper has exited (a session's sandbox that died).
    pub(crate) fn exited(&self) -> bool {
        sysfs::polls_ready(self.pidfd.get_ref().as_fd())
    }

    pub(crate) fn pidfd(&self) -> std::io::Result<OwnedFd> {
        self.pidfd.get_ref().try_clone()
    }

    /// Sends SIGKILL to the helper, which takes the whole run with it (see `helper`), and to
    /// the run's pid 1, found first (the helper's child), so that [`HelperProcess::wait`] can
    /// wait for the run itself to be gone.
    pub(crate) fn kill(&mut self) {
        if self.reaped {
            return;
        }
        let helper = self.pidfd.get_ref().as_fd();
        if self.init.is_none() {
            // Looked up while the helper lives: once it is gone, pid 1 has another parent.
            // A helper that has no child yet has started no process of the run.
            self.init = process::pidfd_pid(helper).ok().and_then(process::child_pidfd);
        }
        let _ = process::pidfd_kill(helper, libc::SIGKILL);
        if let Some(init) = &self.init {
            let _ = process::pidfd_kill(init.as_fd(), libc::SIGKILL);
        }
    }
}

impl Drop for HelperProcess {
    fn drop(&mut self) {
        if !self.reaped {
            self.kill();
            // SIGKILL cannot be caught; the wait is short.
            let _ = process::reap_pidfd(self.pidfd.get_ref().as_fd(), false);
        }
        if let Some(init) = self.init.take() {
            reap_orphaned_init(&init);
        }
    }
}

/// Waits (at most [`INIT_GONE_WITHIN`]) for a killed run's pid 1, orphaned once its helper
/// is reaped, to exit, and reaps it if it is this process's child: it is, in a supervisor
/// that is a child subreaper ([`crate::adopt_orphaned_runs`]), since the helper was reaped
/// first; otherwise the machine's PID 1 reaps it.
fn reap_orphaned_init(init: &OwnedFd) {
    if sysfs::wait_ready(init.as_fd(), INIT_GONE_WITHIN) {
        let _ = process::reap_pidfd(init.as_fd(), true);
    }
}

fn internal(what: &str) -> impl FnOnce(std::io::Error) -> RunError + '_ {
    move |e| RunError::Internal(format!("{what}: {e}"))
}

/// A root supervisor's helper drops to another uid (65534, or a session's own), so only
/// `CAP_KILL` lets the supervisor end a run (at its deadline, or a session at its kill):
/// without it (a container that dropped it) a run could outlive every bound, so none starts.
/// Read once: a process's capabilities do not come back.
fn can_end_runs() -> Result<(), RunError> {
    static CAN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let can = *CAN.get_or_init(|| {
        let kill = 1u64 << crate::sys::caps::CAP_KILL;
        !stockade_sys::proc::is_root().unwrap_or(false)
            || !matches!(crate::sys::caps::effective(), Ok(e) if e & kill == 0)
    });
    if can {
        Ok(())
    } else {
        Err(RunError::Unsupported {
            mechanism: "ending the sandbox's processes".into(),
            reason: "this root process lacks CAP_KILL, and each sandbox runs as another uid, so no run could be ended at its deadline".into(),
        })
    }
}

/// Starts the helper for `spec`. The spec's `status_fd` (and, for a pre-built sandbox given
/// the read end of its job pipe as `job`, its `job_fd`) is filled in here.
pub(crate) fn launch(mode: &Mode, mut spec: Spec, io: GuestIo, job: Option<File>) -> Result<Started, RunError> {
    can_end_runs()?;
    match mode {
        Mode::Exec(path) => exec(path, spec, io, job),
        Mode::Fork(fallback) => {
            // A server handed over or stopped since is not waited for: the launch goes on
            // as without one.
            if let Some(server) = forkserver::running().and_then(forkserver::Server::claim) {
                spec.status_fd = FORK_STATUS_FD;
                spec.job_fd = job.is_some().then_some(FORK_JOB_FD);
                return served(server, spec, io, job, fallback.as_deref());
            }
            let threads = process::thread_count().map_err(internal("counting this process's threads"))?;
            match route(fallback.as_deref(), threads) {
                Route::Exec(path) => exec(path, spec, io, job),
                Route::Fork => {
                    spec.status_fd = FORK_STATUS_FD;
                    spec.job_fd = job.is_some().then_some(FORK_JOB_FD);
                    fork(spec, io, job)
                }
                Route::Refuse => Err(RunError::Misconfigured(format!(
                    "Helper::fork() launches only from a single-threaded process or through a fork server, and this one has {threads} threads and no fork server; call ForkServer::start first thing in main, use Helper::at or Helper::current_exe, or add a fallback with Helper::prefer_fork"
                ))),
            }
        }
    }
}

/// How a fork launch goes when no fork server is running.
#[derive(Debug, PartialEq, Eq)]
enum Route<'a> {
    /// Execute the fallback binary.
    Exec(&'a Path),
    /// Fork this process.
    Fork,
    /// Neither is possible.
    Refuse,
}

/// A launch with a fallback binary ([`crate::Helper::prefer_fork`]) executes it: a fork of
/// this process would copy everything it holds by now (an API key read since `main`
/// started) into the helper and the run's pid 1. Only [`crate::Helper::fork`], which has no
/// fallback and says so, forks this process, and only while it has one thread.
fn route(fallback: Option<&Path>, threads: usize) -> Route<'_> {
    match (fallback, threads) {
        (Some(path), _) => Route::Exec(path),
        (None, 1) => Route::Fork,
        (None, _) => Route::Refuse,
    }
}

/// Where the forked helper finds the status pipe.
const FORK_STATUS_FD: i32 = 3;
/// Where the forked helper of a pre-built sandbox finds its job pipe.
const FORK_JOB_FD: i32 = 4;

pub(crate) fn receiver(fd: impl Into<OwnedFd>) -> Result<pipe::Receiver, RunError> {
    pipe::Receiver::from_owned_fd(fd.into()).map_err(internal("registering a pipe"))
}

pub(crate) fn sender(fd: impl Into<OwnedFd>) -> Result<pipe::Sender, RunError> {
    pipe::Sender::from_owned_fd(fd.into()).map_err(internal("registering a pipe"))
}

/// A pidfd for the helper `pid` (this process's child), or, if none can be opened, the
/// helper killed and reaped and the error.
fn watch(pid: libc::pid_t) -> Result<OwnedFd, RunError> {
    process::pidfd_open(pid).map_err(|e| {
        let _ = process::kill(pid, libc::SIGKILL);
        let _ = process::wait(pid);
        RunError::Unsupported { mechanism: "pidfd".into(), reason: format!("pidfd_open: {e}") }
    })
}

fn exec(path: &Path, mut spec: Spec, io: GuestIo, job: Option<File>) -> Result<Started, RunError> {
    let (status_r, status_w) = sysfs::pipe().map_err(internal("status pipe"))?;
    spec.status_fd = status_w.as_raw_fd();
    spec.job_fd = job.as_ref().map(AsRawFd::as_raw_fd);
    let spec_json = serde_json::to_string(&spec).map_err(|e| RunError::Internal(e.to_string()))?;
    let mut cmd = std::process::Command::new(path);
    cmd.env_clear().env(SPEC_VAR, spec_json);
    match io {
        GuestIo::Pipes { stdin } => {
            cmd.stdin(if stdin { Stdio::piped() } else { Stdio::null() }).stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        GuestIo::Terminal(slave) => {
            let copy = || slave.try_clone().map(Stdio::from).map_err(internal("duplicating the pty"));
            cmd.stdin(copy()?).stdout(copy()?).stderr(Stdio::from(slave));
        }
    }
    sysfs::keep_on_exec(&mut cmd, status_w.as_raw_fd());
    if let Some(job) = &job {
        sysfs::keep_on_exec(&mut cmd, job.as_raw_fd());
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| start_failed(&format!("spawning the helper {}", path.display()), &e, RunError::Misconfigured))?;
    drop((status_w, job));
    let pid = child.id() as libc::pid_t;
    let pipes = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    // `child` is dropped without waiting: the pidfd reaps it.
    // `cmd` holds the parent's copies of a pty slave: drop them, so that the master sees the
    // end of output when the run's processes are gone.
    drop(cmd);
    let pidfd = watch(pid)?;
    let (stdin, out, err) = pipes;
    Ok(Started {
        pidfd: Some(pidfd),
        stdin: stdin.map(OwnedFd::from),
        stdout: out.map(OwnedFd::from),
        stderr: err.map(OwnedFd::from),
        status: Some(status_r.into()),
    })
}

/// The guest's stdio for a forked helper: the ends the helper takes (stdin, stdout,
/// stderr) and the ends the supervisor keeps.
struct ForkedIo {
    child: [File; 3],
    stdin: Option<File>,
    stdout: Option<File>,
    stderr: Option<File>,
}

impl ForkedIo {
    fn new(io: GuestIo) -> Result<Self, RunError> {
        Ok(match io {
            GuestIo::Pipes { stdin } => {
                let (in_r, in_w) = if stdin {
                    let (r, w) = sysfs::pipe().map_err(internal("stdin pipe"))?;
                    (r, Some(w))
                } else {
                    (File::open("/dev/null").map_err(internal("opening /dev/null"))?, None)
                };
                let (out_r, out_w) = sysfs::pipe().map_err(internal("stdout pipe"))?;
                let (err_r, err_w) = sysfs::pipe().map_err(internal("stderr pipe"))?;
                Self { child: [in_r, out_w, err_w], stdin: in_w, stdout: Some(out_r), stderr: Some(err_r) }
            }
            GuestIo::Terminal(slave) => {
                let copy = || slave.try_clone().map(File::from).map_err(internal("duplicating the pty"));
                let (a, b) = (copy()?, copy()?);
                Self { child: [a, b, File::from(slave)], stdin: None, stdout: None, stderr: None }
            }
        })
    }

    /// The supervisor's side, once the helper holds its copies of the child's ends.
    fn launched(self, pid: libc::pid_t, status: File) -> Result<Started, RunError> {
        drop(self.child);
        Ok(Started {
            pidfd: Some(watch(pid)?),
            stdin: self.stdin.map(OwnedFd::from),
            stdout: self.stdout.map(OwnedFd::from),
            stderr: self.stderr.map(OwnedFd::from),
            status: Some(status.into()),
        })
    }
}

fn fork(spec: Spec, io: GuestIo, job: Option<File>) -> Result<Started, RunError> {
    let ends = ForkedIo::new(io)?;
    let (status_r, status_w) = sysfs::pipe().map_err(internal("status pipe"))?;
    match process::fork().map_err(|e| start_failed("fork", &e, RunError::Internal))? {
        process::Fork::Child => {
            // Single-threaded child of the supervisor: ordinary code is fine, but it must never
            // return into the supervisor's stack (the async runtime), so it always exits here.
            let [i, o, e] = ends.child;
            let mut fds: Vec<OwnedFd> = vec![i.into(), o.into(), e.into(), status_w.into()];
            fds.extend(job.map(OwnedFd::from));
            forked_child(spec, fds, true)
        }
        process::Fork::Parent(pid) => {
            drop((status_w, job));
            ends.launched(pid, status_r)
        }
    }
}

/// Starts the helper through the fork server: the helper is cloned by the server as a child
/// of this process, and gets the same descriptors as a forked one.
fn served(
    server: forkserver::Claim<'_>,
    spec: Spec,
    io: GuestIo,
    job: Option<File>,
    fallback: Option<&Path>,
) -> Result<Started, RunError> {
    let ends = ForkedIo::new(io)?;
    let (status_r, status_w) = sysfs::pipe().map_err(internal("status pipe"))?;
    let json = serde_json::to_vec(&spec).map_err(|e| RunError::Internal(e.to_string()))?;
    let mut fds = vec![ends.child[0].as_fd(), ends.child[1].as_fd(), ends.child[2].as_fd(), status_w.as_fd()];
    fds.extend(job.as_ref().map(AsFd::as_fd));
    let pid = server.spawn(&json, &fds).map_err(|e| match e {
        forkserver::SpawnError::Launch(e) => e,
        forkserver::SpawnError::Gone(why) => RunError::Internal(format!(
            "{why}; later runs {}",
            match fallback {
                Some(p) => format!("execute the helper {}", p.display()),
                None => "fork this process when it is single-threaded, and fail otherwise".into(),
            }
        )),
    })?;
    drop((status_w, job));
    ends.launched(pid, status_r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fallback_is_executed_rather_than_forking_a_process_that_may_hold_secrets() {
        let bin = Path::new("/usr/libexec/helper");
        // Single-threaded or not, with no fork server a launch that has a binary executes it.
        assert_eq!(route(Some(bin), 1), Route::Exec(bin));
        assert_eq!(route(Some(bin), 4), Route::Exec(bin));
        assert_eq!(route(None, 1), Route::Fork);
        assert_eq!(route(None, 4), Route::Refuse);
    }
}
