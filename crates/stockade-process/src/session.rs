//! Sessions ([`ProcessTier::session`]): one sandbox (pid namespace, view, cgroup) that lives
//! across many execs.
//!
//! The helper and init are started as for a run, with the spec's `session` set and a
//! `SOCK_SEQPACKET` socket as the job descriptor; init builds the view, says
//! [`Msg::Ready`], and then forks one guest per exec request (`session_init`). Each exec
//! gets four fresh pipes (stdin, stdout, stderr, status): its guest confines itself exactly
//! as a run's guest does and reports each mechanism on the status pipe, and init writes the
//! exit there when it reaps the guest. So an exec's [`Report`] is assembled by the same code
//! as a run's, from the same lines.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use stockade_protocol::capture::CaptureMode;
use stockade_protocol::{Captured, Enforced, Job, JobKind, LiveIo, Mechanism, Report, Stream};

use crate::cgroup::Cgroup;
use crate::pool::CgroupGuard;
use crate::spec::{MAX_SPEC, Msg, SessionRequest, Spec};
use crate::supervisor::{End, Ended, Reader};
use crate::{ProcessTier, RunError, launch};

/// How long an exec's output is still read once its guest has exited: a process it left in
/// the background may hold its stdout or stderr for as long as it lives (a server started
/// with `&`), and the exec ends anyway, with what was read (`docker exec` would wait for it).
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(250);

/// A reader that reads `inner` until `stop` turns true, then ends (end of file), so that a
/// capture returns what it read while a background process still holds the pipe.
struct Stoppable<R> {
    inner: R,
    stop: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
    stopped: bool,
}

impl<R> Stoppable<R> {
    fn new(inner: R, mut stop: tokio::sync::watch::Receiver<bool>) -> Self {
        let stop = Box::pin(async move {
            let _ = stop.wait_for(|s| *s).await;
        });
        Self { inner, stop, stopped: false }
    }
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Stoppable<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if !self.stopped && self.stop.as_mut().poll(cx).is_ready() {
            self.stopped = true;
        }
        if self.stopped {
            return std::task::Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

/// How [`ProcessSession::exec_with`] runs an exec, beyond its job.
#[derive(Debug)]
pub struct ExecOptions {
    /// A pseudo-terminal of this size (rows, columns) as the exec's stdin, stdout, stderr
    /// and controlling terminal: its output is read from the terminal (the report's stdout;
    /// stderr is empty), and its stdin is typed into it. The line discipline is the kernel's
    /// default, echo on, as in E2B's PTY and `docker exec -it`: what is typed comes back as
    /// output unless the program turns echo off (a shell's line editor, a password prompt).
    pub pty: Option<(u16, u16)>,
    /// What an output budget's breach does: [`CaptureMode::FailFast`] (the default, as a
    /// run) kills the exec; [`CaptureMode::Drain`] keeps the first bytes for the report and
    /// goes on (the live copies still see everything): for a long-lived background exec.
    pub output: CaptureMode,
    /// Told the exec's id, pid and terminal as soon as init forked its guest.
    pub started: Option<tokio::sync::oneshot::Sender<ExecStarted>>,
}

impl Default for ExecOptions {
    fn default() -> Self {
        Self { pty: None, output: CaptureMode::FailFast, started: None }
    }
}

/// A running exec, as [`ExecOptions::started`] is told of it.
#[derive(Debug)]
pub struct ExecStarted {
    /// Its id in the session ([`ProcessSession::signal`] takes it).
    pub id: u64,
    /// Its guest's pid in the session's pid namespace.
    pub pid: u32,
    /// Its terminal, when it has one ([`ExecOptions::pty`]).
    pub terminal: Option<Terminal>,
}

/// An exec's pseudo-terminal, for its size: [`Terminal::resize`] is `TIOCSWINSZ` on the
/// master, and the kernel sends the exec's foreground process group `SIGWINCH`.
#[derive(Debug)]
pub struct Terminal(OwnedFd);

impl Terminal {
    /// Sets the window size (rows, columns).
    pub fn resize(&self, rows: u16, cols: u16) -> std::io::Result<()> {
        crate::sys::tty::set_window_size(self.0.as_fd(), rows, cols)
    }
}

/// When a session was paused, and for how long in all: an exec's deadline does not count the
/// time its session spent paused.
#[derive(Debug, Default)]
struct PauseClock {
    since: Option<Instant>,
    total: Duration,
}

impl PauseClock {
    /// Time paused so far, the pause in progress included.
    fn total(&self) -> Duration {
        self.total + self.since.map_or(Duration::ZERO, |s| s.elapsed())
    }
}

/// How long a session's setup may take before it counts as failed: 30 s (a cold page cache
/// and a busy host; a warm one takes milliseconds).
const SETUP_TIMEOUT: Duration = Duration::from_secs(30);

/// One process of a session, as [`ProcessSession::processes`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionProcess {
    /// Its pid inside the session (what `kill` there takes).
    pub pid: u32,
    /// Its pid on the host.
    pub host_pid: u32,
    /// Its command line, arguments joined by spaces (lossy UTF-8).
    pub cmdline: String,
}

/// What a session is made with: limits for the whole session, an optional workspace, the
/// host directory that becomes its home, and grants served for its whole life.
#[derive(Debug, Default)]
pub struct SessionConfig {
    /// Memory and processes of the whole session (its cgroup); `Limits::default()` otherwise.
    pub limits: stockade_protocol::Limits,
    /// The workspace and its access, held (and, read-write, locked and swept) for the
    /// session's whole life.
    pub workspace: Option<stockade_protocol::Workspace>,
    /// A host directory made for this session alone (the caller creates it empty, in a
    /// directory no guest reaches), bound read-write at [`crate::SESSION_HOME`].
    pub home: Option<PathBuf>,
    /// A grants directory, bound read-only at [`crate::GRANTS_GUEST_DIR`] (as for
    /// [`ProcessTier::run_live`]).
    pub grants_dir: Option<PathBuf>,
    /// A listener on the session's loopback, taken by the supervisor and served for the
    /// session's life (as for [`ProcessTier::run_live`]).
    pub loopback: Option<crate::Loopback>,
    /// The host uid and gid the session's guest runs as, when the supervisor is root: one
    /// no other session (and no host user) has, so the kernel's per-user limits (inotify
    /// instances, `RLIMIT_NPROC`, mqueue bytes, keys) are the session's own. Inside, the
    /// guest is `nobody` either way. `None`: [`crate::NOBODY`], shared with every run.
    /// Refused without root (only root can become another user) and for uid 0.
    pub guest_id: Option<u32>,
}

/// A live sandbox that serves many execs ([`ProcessTier::session`]). Files written in
/// [`crate::SESSION_HOME`], `/tmp` and `/dev/shm`, processes left running, and anything else
/// of the view outlive one exec, and die with the session. Dropping it kills it (as
/// [`ProcessSession::kill`] does, without waiting for the sweep's result).
pub struct ProcessSession {
    // Field order is drop order: the socket (init ends), the helper (killed and reaped with
    // init, so no process is left), then the cgroup, then the sweep and the lock.
    sock: Option<OwnedFd>,
    helper: Option<launch::HelperProcess>,
    status: Option<tokio::task::JoinHandle<Vec<Msg>>>,
    cgroup: CgroupGuard,
    sweep: crate::supervisor::SweepGuard,
    _lock: Option<stockade_hostfs::WorkspaceLock>,
    heartbeat: Option<tokio::task::JoinHandle<()>>,
    // What the heartbeat's sweeps removed since the last exec's report (or the kill's).
    planted: Arc<std::sync::Mutex<stockade_hostfs::Swept>>,
    tier: ProcessTier,
    limits: stockade_protocol::Limits,
    workspace: Option<stockade_protocol::Workspace>,
    enforced: Vec<Enforced>,
    next: AtomicU64,
    clock: std::sync::Mutex<PauseClock>,
    /// `/dev/null`, opened once: the stdin of every exec that has none.
    null: File,
}

impl std::fmt::Debug for ProcessSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessSession").field("enforced", &self.enforced.len()).finish_non_exhaustive()
    }
}

/// What a session uses at one moment ([`UsageMeter::read`], from [`ProcessSession::usage_meter`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionUsage {
    /// Memory in use (its cgroup's), bytes.
    pub memory_bytes: u64,
    /// The page cache within it, bytes.
    pub memory_cache: u64,
    /// Its memory limit, bytes.
    pub memory_limit: u64,
    /// CPU time of every process it has run, nanoseconds (a count that only grows).
    pub cpu_ns: u64,
}

/// Reads what a session uses ([`ProcessSession::usage_meter`]), from another thread.
#[derive(Debug, Clone)]
pub struct UsageMeter {
    cgroup: Option<crate::cgroup::Meter>,
    helper: Option<u32>,
    limit: u64,
}

impl UsageMeter {
    /// What the session uses now: its cgroup's memory, and its CPU time (cgroup v2's count;
    /// on v1, whose cgroup here has no CPU accounting, the sum over its live processes, init
    /// with them, of their own and their reaped children's CPU time from `/proc`: every
    /// process that ran in it is counted once, in the live ancestor that reaped it).
    #[must_use]
    pub fn read(&self) -> SessionUsage {
        let (memory_bytes, memory_cache, cpu) = self.cgroup.as_ref().map_or((0, 0, None), crate::cgroup::Meter::read);
        let cpu_ns = cpu.unwrap_or_else(|| self.cpu_from_proc());
        SessionUsage { memory_bytes, memory_cache, memory_limit: self.limit, cpu_ns }
    }

    fn cpu_from_proc(&self) -> u64 {
        let Some(init) = self.helper.and_then(stockade_sys::proc::first_child) else { return 0 };
        let ticks: u64 = stockade_sys::proc::pids_in_namespace_of(init)
            .into_iter()
            // utime, stime, cutime and cstime: fields 14-17 of `stat`, in clock ticks.
            .filter_map(|pid| stockade_sys::proc::stat_fields(&pid.to_string()))
            .map(|f| f.iter().skip(14 - 3).take(4).filter_map(|v| v.parse::<u64>().ok()).sum::<u64>())
            .sum();
        let hz = rustix::param::clock_ticks_per_second().max(1);
        ticks.saturating_mul(1_000_000_000 / hz)
    }
}

/// A session's guest id (G20): never root's, and only under a root supervisor.
fn check_guest_id(guest_id: Option<u32>) -> Result<(), RunError> {
    let Some(id) = guest_id else { return Ok(()) };
    if id == 0 {
        return Err(RunError::Misconfigured("a session's guest id cannot be 0 (root)".into()));
    }
    if crate::sys::process::ids().0 != 0 {
        return Err(RunError::Unsupported {
            mechanism: "a host uid of the session's own".into(),
            reason: "only a root supervisor can run a guest as another user".into(),
        });
    }
    Ok(())
}

/// The setup's messages up to `Ready`: what it enforced (and what is missing) added to
/// `enforced`; a failure, or an end before `Ready`, is the error (the caller kills the
/// helper).
fn setup_enforced(msgs: Vec<Msg>, best_effort: bool, enforced: &mut Vec<Enforced>) -> Result<(), RunError> {
    let mut ready = false;
    for msg in msgs {
        match msg {
            Msg::Enforced { mechanism, detail } => enforced.push(Enforced::new(mechanism, detail)),
            Msg::Missing { mechanism, reason } => {
                enforced.push(Enforced::new(Mechanism::Rlimits, format!("MISSING {mechanism}: {reason}")));
            }
            Msg::Error { stage, unsupported, message } => {
                return Err(if unsupported && !best_effort {
                    RunError::Unsupported { mechanism: stage, reason: message }
                } else {
                    RunError::Misconfigured(format!("the session could not start: {stage}: {message}"))
                });
            }
            Msg::Ready => ready = true,
            Msg::Listening { .. } | Msg::Started { .. } | Msg::Exit { .. } | Msg::Ended => {}
        }
    }
    if ready { Ok(()) } else { Err(RunError::Internal("the session's sandbox ended before it was ready".into())) }
}

/// The sweep record's heartbeat, for the session's whole life (see
/// `stockade_hostfs::finish_killed_sweeps`), and a sweep of what the guest planted so far at
/// each beat, so that a planted path lasts on the host a beat at most, not until the session
/// ends.
fn heartbeat(
    g: Arc<stockade_hostfs::Guarded>,
    planted: Arc<std::sync::Mutex<stockade_hostfs::Swept>>,
) -> tokio::task::JoinHandle<()> {
    let file = g.heartbeat_file();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(stockade_hostfs::HEARTBEAT);
        loop {
            tick.tick().await;
            if let Some(f) = &file {
                let _ = f.set_modified(std::time::SystemTime::now());
            }
            let (g, planted) = (Arc::clone(&g), Arc::clone(&planted));
            let _ = tokio::task::spawn_blocking(move || drop(sweep_recorded(&g, &planted))).await;
        }
    })
}

pub(crate) async fn create(tier: &ProcessTier, config: SessionConfig) -> Result<ProcessSession, RunError> {
    if tier.tty {
        return Err(RunError::Misconfigured(
            "a session's execs each have their own stdio; make the session on a tier without a terminal".into(),
        ));
    }
    let limits = config.limits;
    let crate::supervisor::Workspace { lock, view, sweep } =
        crate::supervisor::workspace(config.workspace.as_ref(), false).await?;
    if let Some(home) = &config.home {
        let workspace = view.workspace.as_ref().map(|(ws, _)| ws.as_path());
        crate::supervisor::check_own_tree("session home", home, workspace, false)?;
    }
    if let Some(dir) = &config.grants_dir {
        let workspace = view.workspace.as_ref().map(|(ws, _)| ws.as_path());
        crate::supervisor::check_own_tree("grants directory", dir, workspace, true)?;
    }
    let processes = u64::from(limits.processes());
    let mut cgroup = crate::pool::run_cgroup(tier, limits.memory_bytes(), processes);
    // The freezer pauses and resumes the whole session; without one, pause is refused by name.
    let freezer = cgroup.0.as_mut().map(Cgroup::add_freezer);
    let (mine, theirs) = rustix::net::socketpair(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::SEQPACKET,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| RunError::Internal(format!("session socketpair: {e}")))?;
    check_guest_id(config.guest_id)?;
    let spec = Spec {
        session: true,
        guest_id: config.guest_id,
        home: config.home.clone(),
        grants_dir: config.grants_dir.clone(),
        model_port: config.loopback.as_ref().map(|l| l.port),
        ..crate::pool::sandbox_spec(tier, view, &cgroup, crate::supervisor::spec_limits(tier, &limits))
    };
    let launched =
        launch::launch(&tier.helper, spec, launch::GuestIo::Pipes { stdin: false }, Some(File::from(theirs)))?
            .register()?;
    let launch::Launched { process: mut helper, status, .. } = launched;
    // The helper's listener is taken through a duplicate of its pidfd, while it lives.
    let mut take = match config.loopback {
        Some(l) => Some((helper.pidfd().map_err(|e| RunError::Internal(format!("duplicating a pidfd: {e}")))?, l)),
        None => None,
    };
    // The setup's lines up to `Ready` (or the failure that ends them), then the rest of the
    // pipe (the helper's `Ended`) is read in the background.
    let mut lines = crate::supervisor::status_reader(status);
    let mut handed = None;
    let setup = tokio::time::timeout(
        SETUP_TIMEOUT,
        crate::supervisor::read_lines(&mut lines, |m| {
            if let Msg::Listening { fd } = m
                && let Some((pidfd, loopback)) = take.take()
            {
                handed = crate::supervisor::hand_over(&pidfd, *fd, loopback).err();
            }
            matches!(m, Msg::Ready | Msg::Error { .. })
        }),
    )
    .await;
    let msgs = match setup {
        // A listener that could not be taken fails the session (its helper is killed).
        Ok(mut m) => {
            m.extend(handed);
            m
        }
        Err(_) => {
            helper.kill();
            helper.wait().await;
            return Err(RunError::Internal(format!("the session's setup took over {SETUP_TIMEOUT:?}")));
        }
    };
    let mut enforced = Vec::new();
    if let Some(cg) = cgroup.get() {
        let pause = match &freezer {
            Some(Ok(())) => "; a freezer pauses it".to_owned(),
            Some(Err(e)) => format!("; no freezer ({e}): it cannot be paused"),
            None => String::new(),
        };
        enforced.push(Enforced::new(
            Mechanism::Cgroup,
            format!("{} (the whole session){pause}", cg.detail(limits.memory_bytes(), processes)),
        ));
    }
    if let Err(e) = setup_enforced(msgs, tier.best_effort, &mut enforced) {
        helper.kill();
        helper.wait().await;
        return Err(e);
    }
    let status = tokio::spawn(async move { crate::supervisor::read_lines(&mut lines, |_| false).await });
    // The sweep record's heartbeat, for the session's whole life (see
    // `stockade_hostfs::finish_killed_sweeps`), and a sweep of what the guest planted so
    // far at each beat, so that a planted path lasts on the host a beat at most, not until
    // the session ends.
    let planted = Arc::new(std::sync::Mutex::new(stockade_hostfs::Swept::default()));
    let heartbeat = sweep.0.clone().map(|g| heartbeat(g, Arc::clone(&planted)));
    Ok(ProcessSession {
        sock: Some(mine),
        helper: Some(helper),
        status: Some(status),
        cgroup,
        sweep,
        _lock: lock,
        heartbeat,
        planted,
        tier: tier.clone(),
        limits,
        workspace: config.workspace,
        enforced,
        next: AtomicU64::new(1),
        clock: std::sync::Mutex::new(PauseClock::default()),
        null: File::open("/dev/null").map_err(|e| RunError::Internal(format!("opening /dev/null: {e}")))?,
    })
}

impl ProcessSession {
    /// The mechanisms the session's sandbox holds (its namespaces, view and cgroup); each
    /// exec's report adds its guest's own (capabilities, `no_new_privs`, landlock, seccomp,
    /// rlimits).
    #[must_use]
    pub fn enforced(&self) -> &[Enforced] {
        &self.enforced
    }

    /// Whether the session's sandbox is still there (its helper has not exited).
    #[must_use]
    pub fn alive(&self) -> bool {
        self.helper.as_ref().is_some_and(|h| !h.exited()) && self.sock.is_some()
    }

    /// Runs `job` (a command; its workspace unset or the session's own) as one
    /// exec of the session, in `cwd` (default [`crate::SESSION_HOME`] with a home, else
    /// `/workspace`, else `/tmp`), with its own environment, stdin, limits (wall clock,
    /// CPU, output budgets, open files, file size) and live stdio, and returns its report
    /// once its guest has exited and its output has drained. At the deadline or an output
    /// budget's breach, the exec's process group is killed; the session goes on. What the
    /// exec started in the background and left running stays in the session.
    pub async fn exec(&self, job: &Job, cwd: Option<&str>, io: LiveIo) -> Result<Report, RunError> {
        self.exec_with(job, cwd, io, ExecOptions::default()).await
    }

    /// [`exec`](Self::exec) with [`ExecOptions`]: a pseudo-terminal, an output budget that
    /// keeps the first bytes rather than ending the exec, and a channel told the exec's id
    /// and pid as soon as its guest is forked (for [`signal`](Self::signal) and a
    /// terminal's resize while it runs: a background exec's handle).
    pub async fn exec_with(
        &self,
        job: &Job,
        cwd: Option<&str>,
        io: LiveIo,
        opts: ExecOptions,
    ) -> Result<Report, RunError> {
        io.check(job).map_err(|e| RunError::Misconfigured(e.into()))?;
        let sock = self.sock.as_ref().ok_or_else(|| RunError::Ended("the session is gone".into()))?;
        let (id, message) = self.exec_request(job, cwd, opts.pty.is_some())?;
        let paused_before = self.paused_total();
        let limits = job.limits();
        let internal = |what: &str| {
            let what = what.to_owned();
            move |e: std::io::Error| RunError::Internal(format!("{what}: {e}"))
        };
        let (status_r, status_w) = crate::sys::fs::pipe().map_err(internal("status pipe"))?;
        let stockade_protocol::LiveIo { stdin: live_stdin, stderr: live_stderr, stdout: live_stdout, pace } = io;
        let oom_before = self.cgroup.get().map(Cgroup::oom_kills);
        let start = Instant::now();
        let (out, err, mut terminal) = self.exec_stdio(sock, &message, status_w, job, opts.pty, live_stdin)?;
        let status = launch::receiver(status_r)?;
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let mut out = Stoppable::new(out, stopped.clone());
        let mut err = Stoppable::new(err, stopped);
        let mut started = opts.started;
        let mut status_task = tokio::spawn(async move {
            let mut lines = crate::supervisor::status_reader(status);
            crate::supervisor::read_lines(&mut lines, |m| {
                if let Msg::Started { pid } = m
                    && let Some(tx) = started.take()
                {
                    let pid = u32::try_from(*pid).unwrap_or(0);
                    let _ = tx.send(ExecStarted { id, pid, terminal: terminal.take() });
                }
                false
            })
            .await
        });
        let mode = opts.output;
        let out_limit = usize::try_from(limits.stdout_bytes()).unwrap_or(usize::MAX);
        let err_limit = usize::try_from(limits.stderr_bytes()).unwrap_or(usize::MAX);
        let err_pace = pace.clone();
        let mut out_task = tokio::spawn(async move {
            let pace = pace.as_deref();
            stockade_protocol::capture::capture_tee_async(&mut out, out_limit, mode, live_stdout, pace).await
        });
        let mut err_task = tokio::spawn(async move {
            let pace = err_pace.as_deref();
            stockade_protocol::capture::capture_tee_async(&mut err, err_limit, mode, live_stderr, pace).await
        });
        let deadline = tokio::time::sleep(limits.wall());
        tokio::pin!(deadline);
        let mut out_done = None;
        let mut err_done = None;
        let mut msgs = None;
        let end = loop {
            tokio::select! {
                r = &mut status_task, if msgs.is_none() => {
                    msgs = Some(r.unwrap_or_default());
                    break End::Exited;
                }
                () = &mut deadline => {
                    // Time the session spent paused since this exec started does not count.
                    if self.paused() {
                        deadline.as_mut().reset(tokio::time::Instant::now() + Duration::from_millis(50));
                        continue;
                    }
                    let due = start + limits.wall() + self.paused_total().saturating_sub(paused_before);
                    if due > Instant::now() {
                        deadline.as_mut().reset(due.into());
                        continue;
                    }
                    break End::Deadline;
                }
                r = &mut out_task, if out_done.is_none() => {
                    let (r, over) = crate::supervisor::captured(r)?;
                    out_done = Some(r);
                    if over { break End::Output(Stream::Stdout); }
                }
                r = &mut err_task, if err_done.is_none() => {
                    let (r, over) = crate::supervisor::captured(r)?;
                    err_done = Some(r);
                    if over { break End::Output(Stream::Stderr); }
                }
            }
        };
        if !matches!(end, End::Exited) {
            self.signal_exec(id, libc::SIGKILL);
        }
        let msgs = match msgs {
            Some(m) => m,
            None => status_task.await.unwrap_or_default(),
        };
        let wall = start.elapsed();
        let (stdout, stderr) = drain((out_done, &mut out_task), (err_done, &mut err_task), stop).await;
        let oom = match (oom_before, self.cgroup.get()) {
            (Some(before), Some(cg)) => cg.oom_kills() > before,
            _ => false,
        };
        let usage = Some(crate::cgroup::Usage { oom_killed: oom, peak_bytes: None });
        let ended = Ended {
            end,
            wall,
            stdout,
            stderr,
            msgs,
            usage,
            cgroup_detail: None,
            swept: self.swept_so_far().await,
            drained: mode == CaptureMode::Drain,
        };
        let mut report = crate::supervisor::assemble(ended, limits, self.tier.best_effort)?;
        // An exec's deadline ends the exec, not the session.
        for e in report.enforcement.iter_mut().filter(|e| e.mechanism == Mechanism::Deadline) {
            e.detail = format!(
                "{:?} wall clock; the exec's process group is killed at it, the session goes on",
                limits.wall()
            );
        }
        report.enforcement.splice(0..0, self.enforced.iter().cloned());
        Ok(report)
    }

    /// Sends the exec's request to init with its descriptors: a pty's slave as all three
    /// (its master read as the output and written with the stdin), or pipes; returns the
    /// output's two readers and the terminal, if any.
    fn exec_stdio(
        &self,
        sock: &OwnedFd,
        message: &[u8],
        status_w: std::fs::File,
        job: &Job,
        pty: Option<(u16, u16)>,
        live_stdin: Option<Box<dyn tokio::io::AsyncRead + Send + Unpin>>,
    ) -> Result<(Reader, Reader, Option<Terminal>), RunError> {
        let internal = |what: &str| {
            let what = what.to_owned();
            move |e: std::io::Error| RunError::Internal(format!("{what}: {e}"))
        };
        Ok(if let Some(size) = pty {
            // One pty for the exec: its slave is the guest's stdin, stdout and stderr (and
            // controlling terminal); its master is read as the exec's output and written
            // with its stdin (the job's bytes, then the streamed stdin; no end of file: a
            // terminal's input has none until the guest exits).
            let (master, slave) = crate::supervisor::open_terminal(Some(size), true)?;
            let fds = [slave.as_fd(), slave.as_fd(), slave.as_fd(), status_w.as_fd()];
            crate::fdpass::send(sock.as_fd(), message, &fds)
                .map_err(|e| RunError::Ended(format!("the session is gone: {e}")))?;
            drop((slave, status_w));
            let terminal = Some(Terminal(master.raw_clone().map_err(internal("the terminal's master"))?));
            if let Ok(mut typist) = master.try_clone() {
                let bytes = job.stdin().to_vec();
                let mut live = live_stdin;
                tokio::spawn(async move {
                    use tokio::io::AsyncWriteExt;
                    let _ = typist.write_all(&bytes).await;
                    if let Some(src) = live.as_mut() {
                        let _ = tokio::io::copy(src, &mut typist).await;
                    }
                });
            }
            (Box::new(master), Box::new(tokio::io::empty()), terminal)
        } else {
            let has_stdin = live_stdin.is_some() || !job.stdin().is_empty();
            let (in_r, in_w) = if has_stdin {
                let (r, w) = crate::sys::fs::pipe().map_err(internal("stdin pipe"))?;
                (Some(r), Some(w))
            } else {
                (None, None)
            };
            let (out_r, out_w) = crate::sys::fs::pipe().map_err(internal("stdout pipe"))?;
            let (err_r, err_w) = crate::sys::fs::pipe().map_err(internal("stderr pipe"))?;
            let stdin = in_r.as_ref().map_or(self.null.as_fd(), AsFd::as_fd);
            let fds = [stdin, out_w.as_fd(), err_w.as_fd(), status_w.as_fd()];
            crate::fdpass::send(sock.as_fd(), message, &fds)
                .map_err(|e| RunError::Ended(format!("the session is gone: {e}")))?;
            drop((in_r, out_w, err_w, status_w));
            let stdin = in_w.map(launch::sender).transpose()?;
            let stdio = (stdin, Some(launch::receiver(out_r)?), Some(launch::receiver(err_r)?));
            let (out, err) = crate::supervisor::wire_stdio(None, stdio, job.stdin().to_vec(), live_stdin)?;
            (out, err, None)
        })
    }

    /// An exec's request to init, once the job is one this session runs: a command job,
    /// naming no workspace or the session's own, an absolute `cwd`, the session not paused,
    /// the message within [`MAX_SPEC`]. Returns its id and the message.
    fn exec_request(&self, job: &Job, cwd: Option<&str>, tty: bool) -> Result<(u64, Vec<u8>), RunError> {
        if let Some(ws) = job.workspace()
            && self.workspace.as_ref().is_none_or(|own| own.path() != ws.path() || own.access() != ws.access())
        {
            return Err(RunError::Misconfigured(
                "a session's workspace is set when it is made: an exec names none, or the session's own".into(),
            ));
        }
        let JobKind::Command { program, args } = job.kind() else {
            return Err(RunError::Misconfigured("the process tier runs only command jobs".into()));
        };
        if let Some(cwd) = cwd
            && !cwd.starts_with('/')
        {
            return Err(RunError::Misconfigured(format!("the working directory {cwd:?} is not absolute")));
        }
        if self.paused() {
            return Err(RunError::Misconfigured("the session is paused; resume it first".into()));
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let request = SessionRequest::Exec {
            id,
            program: program.clone(),
            args: args.clone(),
            env: job.env().iter().map(|v| (v.key().to_owned(), v.value().to_owned())).collect(),
            cwd: cwd.map(str::to_owned),
            limits: crate::supervisor::spec_limits(&self.tier, job.limits()),
            tty,
        };
        let message = serde_json::to_vec(&request).map_err(|e| RunError::Internal(e.to_string()))?;
        if message.len() > MAX_SPEC {
            return Err(RunError::Misconfigured(format!(
                "the exec is {} bytes, over the {MAX_SPEC}-byte limit (arguments and environment together)",
                message.len()
            )));
        }
        Ok((id, message))
    }

    /// Kills every process of the session at once, without waiting: execs in flight end (as
    /// killed by signal 9). [`ProcessSession::kill`] then reaps and cleans up.
    pub fn terminate(&self) {
        if let Some(h) = &self.helper {
            h.signal_kill();
        }
        // A frozen process cannot die: the kill is pending, and lands as it thaws.
        if let Some(cg) = self.cgroup.get() {
            cg.thaw();
        }
    }

    fn clock(&self) -> std::sync::MutexGuard<'_, PauseClock> {
        self.clock.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether the session is paused.
    #[must_use]
    pub fn paused(&self) -> bool {
        self.clock().since.is_some()
    }

    fn paused_total(&self) -> Duration {
        self.clock().total()
    }

    /// Pauses every process of the session (the cgroup freezer: v1 `freezer.state`, v2
    /// `cgroup.freeze`), once the kernel says they are frozen. A paused session uses no CPU,
    /// takes no exec, and its execs' deadlines stop. Without a freezer (no cgroup, or no
    /// freezer controller), [`RunError::Unsupported`] names it.
    pub fn pause(&self) -> Result<(), RunError> {
        let cg = self.freezer()?;
        let mut clock = self.clock();
        if clock.since.is_some() {
            return Ok(());
        }
        cg.freeze(true).map_err(|e| RunError::Unsupported { mechanism: "freezer".into(), reason: e.to_string() })?;
        clock.since = Some(Instant::now());
        Ok(())
    }

    /// Resumes a paused session; its execs' deadlines go on from where they stopped.
    pub fn resume(&self) -> Result<(), RunError> {
        let cg = self.freezer()?;
        let mut clock = self.clock();
        let Some(since) = clock.since else { return Ok(()) };
        cg.freeze(false).map_err(|e| RunError::Unsupported { mechanism: "freezer".into(), reason: e.to_string() })?;
        clock.total += since.elapsed();
        clock.since = None;
        Ok(())
    }

    fn freezer(&self) -> Result<&Cgroup, RunError> {
        self.cgroup.get().filter(|c| c.has_freezer()).ok_or_else(|| RunError::Unsupported {
            mechanism: "freezer".into(),
            reason: "the session has no freezer cgroup (no cgroup, or no freezer controller for this process)".into(),
        })
    }

    /// The session's processes (init aside), read from the host's `/proc`: every process in
    /// the session's pid namespace, with its pid there and on the host, sorted by the former.
    #[must_use]
    pub fn processes(&self) -> Vec<SessionProcess> {
        let Some(init) = self.netns_pid() else { return Vec::new() };
        let mut out: Vec<SessionProcess> = stockade_sys::proc::pids_in_namespace_of(init)
            .into_iter()
            .filter(|pid| *pid != init)
            .filter_map(|host_pid| {
                let pid = stockade_sys::proc::ns_pid(host_pid)?;
                let raw = std::fs::read(format!("/proc/{host_pid}/cmdline")).ok()?;
                let cmdline = String::from_utf8_lossy(&raw).trim_end_matches('\0').replace('\0', " ");
                Some(SessionProcess { pid, host_pid, cmdline })
            })
            .collect();
        out.sort_by_key(|p| p.pid);
        out
    }

    /// The host pid of the session's init, whose network namespace is the session's (its
    /// loopback, where an exec's server listens); `None` once it has ended.
    #[must_use]
    pub fn netns_pid(&self) -> Option<u32> {
        let helper = self.helper.as_ref().and_then(launch::HelperProcess::pid)?;
        stockade_sys::proc::first_child(u32::try_from(helper).ok()?)
    }

    /// A reader of what the session uses ([`UsageMeter::read`]), to call on another thread
    /// (it reads `/proc` and the cgroupfs: off the async workers).
    #[must_use]
    pub fn usage_meter(&self) -> UsageMeter {
        UsageMeter {
            cgroup: self.cgroup.get().map(crate::cgroup::Cgroup::meter),
            helper: self.helper.as_ref().and_then(launch::HelperProcess::pid).and_then(|p| u32::try_from(p).ok()),
            limit: self.limits.memory_bytes(),
        }
    }

    /// Sends `signal` to a running exec's process group (the exec's guest leads a session
    /// of its own), by the id [`ExecStarted`] gave; an exec that ended is not signalled.
    pub fn signal(&self, id: u64, signal: i32) {
        self.signal_exec(id, signal);
    }

    fn signal_exec(&self, id: u64, signal: i32) {
        if let (Some(sock), Ok(message)) = (&self.sock, serde_json::to_vec(&SessionRequest::Signal { id, signal })) {
            let _ = crate::fdpass::send(sock.as_fd(), &message, &[]);
        }
    }

    /// Ends the session: init is told (its socket ends) and killed with every process of the
    /// session, then the cgroup goes, then a read-write workspace is swept and its lock let
    /// go. Returns the sweep's result; nothing of the session is left when it returns.
    pub async fn kill(mut self) -> stockade_hostfs::Swept {
        self.sock = None;
        if let Some(mut helper) = self.helper.take() {
            helper.kill();
            if let Some(cg) = self.cgroup.get() {
                cg.thaw();
            }
            helper.wait().await;
        }
        if let Some(status) = self.status.take() {
            status.abort();
        }
        if let Some(hb) = self.heartbeat.take() {
            hb.abort();
        }
        let cgroup = std::mem::replace(&mut self.cgroup, CgroupGuard(None));
        let _ = tokio::task::spawn_blocking(move || drop(cgroup)).await;
        let mut swept = self.sweep.now();
        absorb(
            &mut swept,
            std::mem::take(&mut *self.planted.lock().unwrap_or_else(std::sync::PoisonError::into_inner)),
        );
        swept
    }

    /// A read-write workspace's sweep at the end of an exec, while the session goes on:
    /// what the guest planted so far, removed now, with what the heartbeat's sweeps removed
    /// since the last report (the exec's report names them all).
    async fn swept_so_far(&self) -> stockade_hostfs::Swept {
        let Some(g) = self.sweep.0.clone() else { return stockade_hostfs::Swept::default() };
        let planted = Arc::clone(&self.planted);
        tokio::task::spawn_blocking(move || std::mem::take(&mut *sweep_recorded(&g, &planted)))
            .await
            .unwrap_or_default()
    }

    /// The session's limits, as made.
    #[must_use]
    pub fn limits(&self) -> &stockade_protocol::Limits {
        &self.limits
    }
}

impl Drop for ProcessSession {
    fn drop(&mut self) {
        // The helper's own drop kills and reaps it: a frozen session is thawed first, with
        // the kill already pending, so the reap comes.
        self.terminate();
        if let Some(hb) = self.heartbeat.take() {
            hb.abort();
        }
        if let Some(status) = self.status.take() {
            status.abort();
        }
    }
}

/// Adds one sweep's removals and errors to another's.
/// Sweeps what the guest planted and records it in `planted`, as one step under `planted`'s
/// lock, which it returns held. The heartbeat and an exec's report both sweep this way, so
/// a report that takes `planted` after its own sweep holds every removal made before it: a
/// heartbeat's sweep can no longer finish before the report's and be recorded after the
/// report took `planted` (a CI run saw an exec's report miss the `.bashrc` it planted).
fn sweep_recorded<'a>(
    g: &stockade_hostfs::Guarded,
    planted: &'a std::sync::Mutex<stockade_hostfs::Swept>,
) -> std::sync::MutexGuard<'a, stockade_hostfs::Swept> {
    let mut held = planted.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let found = g.sweep_planted();
    absorb(&mut held, found);
    held
}

fn absorb(into: &mut stockade_hostfs::Swept, from: stockade_hostfs::Swept) {
    into.removed.extend(from.removed);
    into.removed.sort();
    into.removed.dedup();
    into.errors.extend(from.errors);
}

/// A capture's end, as its task returns it.
type CaptureResult = Result<stockade_protocol::CaptureEnd, stockade_protocol::CaptureError>;

/// A capture's task.
type CaptureTask = tokio::task::JoinHandle<CaptureResult>;

/// An exec's captures once it has exited: what it left in the background may hold its
/// pipes, so each is read a little longer ([`DRAIN_AFTER_EXIT`]), then ended with what it
/// has. A task that ended is never polled again (`finish` would): its result, or an empty
/// capture if it failed.
async fn drain(
    out: (Option<CaptureResult>, &mut CaptureTask),
    err: (Option<CaptureResult>, &mut CaptureTask),
    stop: tokio::sync::watch::Sender<bool>,
) -> (Captured, Captured) {
    let ((mut out_done, out_task), (mut err_done, err_task)) = (out, err);
    let mut lost = (false, false);
    let drained = async {
        if out_done.is_none() {
            match (&mut *out_task).await {
                Ok(r) => out_done = Some(r),
                Err(_) => lost.0 = true,
            }
        }
        if err_done.is_none() {
            match (&mut *err_task).await {
                Ok(r) => err_done = Some(r),
                Err(_) => lost.1 = true,
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_AFTER_EXIT, drained).await;
    let _ = stop.send(true);
    let stdout = if lost.0 { Captured::default() } else { crate::supervisor::finish(out_done, out_task).await };
    let stderr = if lost.1 { Captured::default() } else { crate::supervisor::finish(err_done, err_task).await };
    (stdout, stderr)
}
