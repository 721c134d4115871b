//! The supervisor: launches the helper, feeds stdin, captures output under budget, enforces
//! the deadline, and turns what happened into a [`Report`].

use std::time::{Duration, Instant};

use stockade_protocol::capture::{CaptureMode, Flow};
use stockade_protocol::{Captured, Enforced, Job, JobKind, Mechanism, Report, Status, Stream};
use tokio::io::AsyncWriteExt;

use crate::cgroup::Cgroup;
use crate::spec::{MAX_REPORT_LINE, MAX_REPORT_LINES, Msg, PooledJob, Spec, SpecLimits};
use crate::sys::tty;
use crate::{Loopback, ProcessTier, RunError, launch};

/// How long output may keep draining after the run's processes are gone: 2 s.
const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// When a pooled run's replacement is asked for, if the run has not ended by then: 20 ms
/// after its job was handed over. A short run's replacement is asked for when it ends, so
/// building it (namespaces, view, confinement: a few milliseconds of CPU) does not compete
/// with the run for this machine's cores; a long run does not leave its pool short for long.
const REFILL_AFTER: Duration = Duration::from_millis(20);

pub(crate) enum End {
    Exited,
    Deadline,
    Output(Stream),
}

pub(crate) async fn run(
    tier: &ProcessTier,
    job: &Job,
    grants_dir: Option<&std::path::Path>,
    loopback: Option<Loopback>,
    io: stockade_protocol::LiveIo,
) -> Result<Report, RunError> {
    io.check(job).map_err(|e| RunError::Misconfigured(e.into()))?;
    if io.stdin.is_some() && tier.tty {
        return Err(RunError::Misconfigured("a streamed stdin and a terminal (tty) cannot be combined".into()));
    }
    // A one-shot run's copies are the caller's to keep up with (the CLI's terminal).
    let stockade_protocol::LiveIo { stdin: live_stdin, stderr: live_stderr, stdout: live_stdout, pace: _ } = io;
    let JobKind::Command { program, args } = job.kind() else {
        return Err(RunError::Misconfigured("the process tier runs only command jobs".into()));
    };
    let limits = job.limits();
    // A pool serves the jobs whose sandbox is the same for every job (see `pool`).
    let pool = tier.pool.as_ref().filter(|_| grants_dir.is_none() && loopback.is_none() && !tier.tty);
    // Declared before the sweep guard, so the lock is dropped after the sweep; the sweep
    // runs once every guest process is gone: at the end of this function, or, if it returns
    // early or its future is dropped (a cancelled call), when the guard is dropped, after
    // the helper, init and the run's cgroup (declared later, dropped first).
    let Workspace { lock: _lock, view, sweep } = workspace(job.workspace(), pool.is_some()).await?;
    let mut sweep = sweep;
    if let Some(dir) = grants_dir {
        check_own_tree("grants directory", dir, view.workspace.as_ref().map(|(ws, _)| ws.as_path()), true)?;
    }
    let processes = u64::from(limits.processes());
    let env: Vec<(String, String)> = job.env().iter().map(|v| (v.key().to_owned(), v.value().to_owned())).collect();
    let spec_limits = spec_limits(tier, limits);
    let start;
    let mut refill = Refill { pool: None, tier, key: None };
    let (launched, master, cgroup) = if let Some(pool) = pool {
        let job = PooledJob { program: program.clone(), args: args.clone(), env, limits: spec_limits };
        let (launched, cgroup, started) = start_pooled(tier, pool, &view, job, limits).await?;
        start = started;
        refill = Refill { pool: Some(pool), tier, key: view.workspace.clone() };
        if pool.builds_inline(tier) {
            // A single-threaded supervisor builds it in line: now, while the guest runs.
            refill.now();
        }
        (launched, None, cgroup)
    } else {
        let cgroup = crate::pool::run_cgroup(tier, limits.memory_bytes(), processes);
        let spec = Spec {
            program: program.clone(),
            args: args.clone(),
            env,
            grants_dir: grants_dir.map(std::path::Path::to_path_buf),
            tty: tier.tty,
            model_port: loopback.as_ref().map(|l| l.port),
            ..crate::pool::sandbox_spec(tier, view, &cgroup, spec_limits)
        };
        start = Instant::now();
        let (io, master) = match tier.tty.then(|| open_terminal(tier.tty_size, false)).transpose()? {
            Some((master, slave)) => (launch::GuestIo::Terminal(slave), Some(master)),
            None => (launch::GuestIo::Pipes { stdin: live_stdin.is_some() || !job.stdin().is_empty() }, None),
        };
        // On an error the guard removes the cgroup.
        let launched = launch::launch(&tier.helper, spec, io, None)?.register()?;
        (launched, master, cgroup)
    };
    let launch::Launched { process: mut child, stdin, stdout, stderr, status } = launched;
    // The helper's listener is taken through a duplicate of its pidfd, while it lives.
    let take = match loopback {
        Some(l) => Some((child.pidfd().map_err(|e| RunError::Internal(format!("duplicating a pidfd: {e}")))?, l)),
        None => None,
    };
    let mut status_task = tokio::spawn(read_messages(status, take));
    let (mut out, mut err) = wire_stdio(master, (stdin, stdout, stderr), job.stdin().to_vec(), live_stdin)?;
    let out_limit = usize::try_from(limits.stdout_bytes()).unwrap_or(usize::MAX);
    let err_limit = usize::try_from(limits.stderr_bytes()).unwrap_or(usize::MAX);
    let mut out_task = tokio::spawn(async move {
        stockade_protocol::capture::capture_tee_async(&mut out, out_limit, CaptureMode::FailFast, live_stdout, None)
            .await
    });
    let mut err_task = tokio::spawn(async move {
        stockade_protocol::capture::capture_tee_async(&mut err, err_limit, CaptureMode::FailFast, live_stderr, None)
            .await
    });

    let deadline = tokio::time::sleep(limits.wall());
    tokio::pin!(deadline);
    let refill_at = tokio::time::sleep(REFILL_AFTER);
    tokio::pin!(refill_at);
    let mut heartbeat = tokio::time::interval(stockade_hostfs::HEARTBEAT);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let recorded = sweep.0.is_some();
    let mut out_done = None;
    let mut err_done = None;
    let mut msgs = None;
    let mut ended = false;
    let end = loop {
        tokio::select! {
            _ = child.wait() => break End::Exited,
            // A pooled run ends when the helper has reaped init (every process of the run is
            // gone); the helper's own exit, which tears down the namespaces, and the cgroup's
            // removal follow in the background (see `Msg::Ended`).
            r = &mut status_task, if pool.is_some() && msgs.is_none() => {
                let r: Vec<Msg> = r.unwrap_or_default();
                ended = r.iter().any(|m| matches!(m, Msg::Ended));
                msgs = Some(r);
                if ended { break End::Exited; }
            }
            () = &mut deadline => break End::Deadline,
            () = &mut refill_at, if refill.pending() => refill.now(),
            _ = heartbeat.tick(), if recorded => sweep.heartbeat(),
            r = &mut out_task, if out_done.is_none() => {
                let (r, over) = captured(r)?;
                out_done = Some(r);
                if over { break End::Output(Stream::Stdout); }
            }
            r = &mut err_task, if err_done.is_none() => {
                let (r, over) = captured(r)?;
                err_done = Some(r);
                if over { break End::Output(Stream::Stderr); }
            }
        }
    };
    if !matches!(end, End::Exited) {
        child.kill();
        if let Some(cg) = cgroup.get() {
            cg.kill_all();
        }
    }
    if !ended {
        child.wait().await;
    }
    let wall = start.elapsed();
    refill.now();
    let stdout = finish(out_done, &mut out_task).await;
    let stderr = finish(err_done, &mut err_task).await;
    let msgs = match msgs {
        Some(m) => m,
        None => status_task.await.unwrap_or_default(),
    };
    let usage = cgroup.get().map(Cgroup::usage);
    let cgroup_detail = cgroup.get().map(|cg| cg.detail(limits.memory_bytes(), processes));
    release(pool.is_some(), ended, child, cgroup);
    // Every process of the run is gone (the pid namespace's init reaps them all before it is
    // reaped): what the guest created among the absent protected paths goes now.
    let swept = sweep.now();

    assemble(
        Ended { end, wall, stdout, stderr, msgs, usage, cgroup_detail, swept, drained: false },
        limits,
        tier.best_effort,
    )
}

/// A run's helper and cgroup once every process of the run is gone. A pooled run's go in the
/// background: the helper (killed, since it has nothing left to do but exit; so even a line
/// that only claimed the end would end the run's tree here) and then the cgroup, whose removal
/// is blocking file-system work that can wait behind the kernel's cgroup lock (on v2 a
/// replacement sandbox's join holds it through an RCU grace period). A runtime that shuts down
/// first drops the task, and with it kills and reaps the helper and removes the cgroup at once.
/// A one-shot run's cgroup is removed now.
fn release(pooled: bool, ended: bool, mut child: launch::HelperProcess, cgroup: crate::pool::CgroupGuard) {
    if pooled {
        tokio::spawn(async move {
            if ended {
                child.kill();
                child.wait().await;
            }
            drop(child);
            let _ = tokio::task::spawn_blocking(move || drop(cgroup)).await;
        });
    } else if let Some(cg) = cgroup.get() {
        cg.remove();
    }
}

/// A pooled run's sandbox, taken from `pool` for `view`: its cgroup set to the job's limits,
/// then the job written to it (bounded by [`crate::spec::MAX_SPEC`]). Returns it, its
/// cgroup, and when it was handed its job.
async fn start_pooled(
    tier: &ProcessTier,
    pool: &crate::pool::Pool,
    view: &crate::pool::View,
    job: PooledJob,
    limits: &stockade_protocol::Limits,
) -> Result<(launch::Launched, crate::pool::CgroupGuard, Instant), RunError> {
    let crate::pool::Prebuilt { started, job: job_pipe, cgroup, .. } = pool.take(tier, view)?;
    if let Some(cg) = cgroup.get() {
        cg.set_limits(limits.memory_bytes(), u64::from(limits.processes()))
            .map_err(|e| RunError::Internal(format!("setting the limits of a pre-built sandbox's cgroup: {e}")))?;
    }
    let message = serde_json::to_vec(&job).map_err(|e| RunError::Internal(e.to_string()))?;
    if message.len() > crate::spec::MAX_SPEC {
        return Err(RunError::Misconfigured(format!(
            "the job is {} bytes, over the {}-byte limit (arguments and environment together)",
            message.len(),
            crate::spec::MAX_SPEC
        )));
    }
    let start = Instant::now();
    let launched = started.register()?;
    let mut job_pipe = launch::sender(job_pipe)?;
    // A sandbox whose setup failed has closed its end: its report says why.
    let _ = job_pipe.write_all(&message).await;
    drop(job_pipe);
    Ok((launched, cgroup, start))
}

/// A run's or a session's workspace as it starts, set up one way for both.
pub(crate) struct Workspace {
    /// One read-write run at a time per workspace, and no read-only run beside one: held
    /// until the sweep is done.
    pub(crate) lock: Option<stockade_hostfs::WorkspaceLock>,
    /// What the sandbox is built from: the workspace's identity, its sockets and fifos and
    /// (read-write) its protected paths.
    pub(crate) view: crate::pool::View,
    /// The sweep of a read-write workspace's protected paths, recorded on disk first.
    pub(crate) sweep: SweepGuard,
}

/// Sets up `granted` for a run (`pooled`: from a pre-built sandbox) or a session: the
/// workspace is opened once and judged as opened (`open_workspace`: what the helper mounts
/// must be this directory, which it compares by device and inode, never whatever the path
/// names later), locked (waiting or refusing as the grant says), inspected, and, read-write,
/// its sweep recorded on disk before the guest starts, so that a supervisor killed before
/// it swept has its sweep finished later (`stockade_hostfs::finish_killed_sweeps`).
pub(crate) async fn workspace(
    granted: Option<&stockade_protocol::Workspace>,
    pooled: bool,
) -> Result<Workspace, RunError> {
    let opened = match granted {
        Some(ws) => Some((
            stockade_hostfs::open_workspace(ws.path()).map_err(RunError::from)?,
            ws.access() == stockade_protocol::Access::ReadWrite,
        )),
        None => None,
    };
    let lock = match (&opened, granted) {
        (Some((ws, writable)), Some(granted)) => Some(
            ws.lock(*writable, granted.busy(), || tokio::time::sleep(stockade_hostfs::LOCK_POLL))
                .await
                .map_err(RunError::from)?,
        ),
        _ => None,
    };
    let (view, mut guard) = crate::pool::View::inspect(opened.as_ref().map(|(ws, rw)| (ws, *rw)), pooled)?;
    if let Some(g) = guard.as_mut() {
        let dir = stockade_hostfs::sweeps_dir().ok_or_else(|| {
            RunError::Misconfigured(
                "a read-write workspace needs a state directory for its sweep record: set STOCKADE_STATE_DIR, XDG_STATE_HOME or HOME".into(),
            )
        })?;
        g.record_in(&dir).map_err(|e| RunError::Misconfigured(e.to_string()))?;
    }
    Ok(Workspace { lock, view, sweep: SweepGuard(guard.map(std::sync::Arc::new)) })
}

/// A read-write workspace's sweep, run exactly once: [`SweepGuard::now`] at the end of a run,
/// or on drop for a run that returned early or was cancelled (whose report is gone, so what
/// the sweep could not remove is then only on the host).
pub(crate) struct SweepGuard(pub(crate) Option<std::sync::Arc<stockade_hostfs::Guarded>>);

impl SweepGuard {
    pub(crate) fn now(&mut self) -> stockade_hostfs::Swept {
        self.0.take().map(|g| g.sweep()).unwrap_or_default()
    }

    fn heartbeat(&self) {
        if let Some(g) = &self.0 {
            g.heartbeat();
        }
    }
}

impl Drop for SweepGuard {
    fn drop(&mut self) {
        let _ = self.now();
    }
}

/// A pooled run's replacement, asked for once: when the run ends, at [`REFILL_AFTER`] if it
/// goes on, or when the run returns early.
struct Refill<'a> {
    pool: Option<&'a crate::pool::Pool>,
    tier: &'a ProcessTier,
    key: crate::pool::Key,
}

impl Refill<'_> {
    fn pending(&self) -> bool {
        self.pool.is_some()
    }

    fn now(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.refill_later(self.tier, std::mem::take(&mut self.key));
        }
    }
}

impl Drop for Refill<'_> {
    fn drop(&mut self) {
        self.now();
    }
}

/// What the run left for its report: how it ended, its output, the helper's messages, the
/// cgroup's reading and the sweep's.
pub(crate) struct Ended {
    pub(crate) end: End,
    pub(crate) wall: Duration,
    pub(crate) stdout: Captured,
    pub(crate) stderr: Captured,
    pub(crate) msgs: Vec<Msg>,
    pub(crate) usage: Option<crate::cgroup::Usage>,
    pub(crate) cgroup_detail: Option<String>,
    pub(crate) swept: stockade_hostfs::Swept,
    /// The captures kept their first bytes and read on past their budgets
    /// ([`stockade_protocol::CaptureMode::Drain`]): a truncated one did not end the run.
    pub(crate) drained: bool,
}

/// The report phase: turns what the run left into its [`Report`] (or, for a mechanism the
/// helper could not apply and the tier requires, [`RunError::Unsupported`]).
pub(crate) fn assemble(
    ended: Ended,
    limits: &stockade_protocol::Limits,
    best_effort: bool,
) -> Result<Report, RunError> {
    let Ended { end, wall, stdout, stderr, msgs, usage, cgroup_detail, swept, drained } = ended;
    // A capture drops its pipe the moment its budget is crossed, and the guest may die of
    // that (SIGPIPE) before the run's loop saw the capture end (both ready in one wake-up,
    // and `select!` picks either): the budget ended the run all the same. A fail-fast
    // capture is truncated only when its budget was crossed. (The soak caught 3 of 1,025
    // floods reported as `Signaled(13)`; a guest that exits 0 right after crossing was
    // reported as `Exited(0)` with its output cut.)
    let end = match end {
        End::Exited if stdout.truncated && !drained => End::Output(Stream::Stdout),
        End::Exited if stderr.truncated && !drained => End::Output(Stream::Stderr),
        other => other,
    };
    let mut report = Report::new(Status::TimedOut, wall).with_output(stdout, stderr);
    report = report.with_enforced(Enforced::new(
        Mechanism::Deadline,
        format!("{:?} wall clock; the whole pid namespace dies with it", limits.wall()),
    ));
    report = report.with_enforced(Enforced::new(
        Mechanism::OutputBudget,
        format!(
            "stdout {} bytes, stderr {} bytes; {}",
            limits.stdout_bytes(),
            limits.stderr_bytes(),
            if drained {
                "the first bytes are kept, the rest is read and not kept (the live copy sees it)"
            } else {
                "the run is killed at the first byte over"
            }
        ),
    ));
    if let Some(detail) = cgroup_detail {
        report = report.with_enforced(Enforced::new(Mechanism::Cgroup, detail));
    }
    let mut exit = None;
    let mut failure = None;
    for msg in msgs {
        match msg {
            Msg::Enforced { mechanism, detail } => report = report.with_enforced(Enforced::new(mechanism, detail)),
            Msg::Missing { mechanism, reason } => {
                report =
                    report.with_enforced(Enforced::new(Mechanism::Rlimits, format!("MISSING {mechanism}: {reason}")));
            }
            Msg::Error { stage, unsupported, message } => {
                failure.get_or_insert((stage, unsupported, message));
            }
            Msg::Exit { code, signal, cpu_us, max_rss } => exit = Some((code, signal, cpu_us, max_rss)),
            Msg::Listening { .. } | Msg::Ready | Msg::Started { .. } | Msg::Ended => {}
        }
    }
    swept.record(&mut report, Mechanism::MountNamespace);
    if let Some((stage, unsupported, message)) = failure {
        if unsupported && !best_effort {
            return Err(RunError::Unsupported { mechanism: stage, reason: message });
        }
        report.status = Status::failed_to_start(format!("{stage}: {message}"));
        return Ok(report);
    }
    if let Some((_, _, cpu_us, max_rss)) = exit {
        report = report.with_cpu(Duration::from_micros(cpu_us));
        report = report.with_peak_memory(max_rss);
    }
    if let Some(peak) = usage.as_ref().and_then(|u| u.peak_bytes) {
        report.peak_memory_bytes = Some(peak);
    }
    report.status = match (end, exit) {
        (End::Deadline, _) => Status::TimedOut,
        (End::Output(stream), _) => Status::OutputLimit { stream },
        _ if usage.as_ref().is_some_and(|u| u.oom_killed) => Status::OutOfMemory,
        (End::Exited, Some((_, Some(sig), cpu_us, _)))
            if sig == libc::SIGXCPU || (sig == libc::SIGKILL && cpu_us >= limits.cpu().as_micros() as u64) =>
        {
            Status::CpuLimit
        }
        (End::Exited, Some((_, Some(signal), _, _))) => Status::Signaled { signal },
        (End::Exited, Some((Some(code), None, _, _))) => Status::Exited { code },
        (End::Exited, _) => Status::failed_to_start("the sandbox ended before reporting the guest's exit"),
    };
    Ok(report)
}

/// A directory bound into the view beside the workspace (a grants directory, a session's
/// home; `what` names it) must be an absolute directory, in a tree of its own apart from the
/// workspace. Without `follow`, a symlink is refused rather than followed.
pub(crate) fn check_own_tree(
    what: &str,
    dir: &std::path::Path,
    workspace: Option<&std::path::Path>,
    follow: bool,
) -> Result<(), RunError> {
    let meta = if follow { std::fs::metadata(dir) } else { std::fs::symlink_metadata(dir) }
        .map_err(|e| RunError::Misconfigured(format!("{what} {}: {e}", dir.display())))?;
    if !meta.is_dir() || !dir.is_absolute() {
        let link = if follow { "" } else { " (a symlink is refused)" };
        return Err(RunError::Misconfigured(format!("{what} {} is not an absolute directory{link}", dir.display())));
    }
    if workspace.is_some_and(|ws| ws.starts_with(dir) || dir.starts_with(ws)) {
        return Err(RunError::Misconfigured(format!(
            "{what} {} and the workspace must be separate trees",
            dir.display()
        )));
    }
    Ok(())
}

/// The limits the helper and the guest apply (the CPU limit rounded up to whole seconds).
pub(crate) fn spec_limits(tier: &ProcessTier, limits: &stockade_protocol::Limits) -> SpecLimits {
    SpecLimits {
        cpu_secs: limits.cpu().as_secs().max(1) + u64::from(limits.cpu().subsec_nanos() > 0),
        memory_bytes: limits.memory_bytes(),
        processes: u64::from(limits.processes()),
        open_files: u64::from(limits.open_files()),
        file_size_bytes: limits.file_size_bytes(),
        tmpfs_bytes: tier.tmpfs_bytes,
    }
}

/// The start phase's stdio: a terminal's master (typed into, then end-of-file) or the
/// guest's pipes (stdin fed from the job's bytes or the streamed stdin), as the two readers
/// the capture takes.
pub(crate) fn wire_stdio(
    master: Option<tty::Master>,
    (stdin, stdout, stderr): (
        Option<tokio::net::unix::pipe::Sender>,
        Option<tokio::net::unix::pipe::Receiver>,
        Option<tokio::net::unix::pipe::Receiver>,
    ),
    bytes: Vec<u8>,
    live_stdin: Option<Box<dyn tokio::io::AsyncRead + Send + Unpin>>,
) -> Result<(Reader, Reader), RunError> {
    Ok(match (master, stdout, stderr) {
        (Some(master), _, _) => {
            // Typed into the terminal, then end-of-file: ^D ends a line in progress, a second
            // one (at the start of a line) is the end of input.
            if let Ok(mut typist) = master.try_clone() {
                let eof: &[u8] = if bytes.is_empty() || bytes.ends_with(b"\n") { b"\x04" } else { b"\x04\x04" };
                tokio::spawn(async move {
                    let _ = typist.write_all(&bytes).await;
                    let _ = typist.write_all(eof).await;
                });
            }
            (Box::new(master), Box::new(tokio::io::empty()))
        }
        (None, Some(out), Some(err)) => {
            if let Some(mut stdin) = stdin.filter(|_| live_stdin.is_some() || !bytes.is_empty()) {
                let mut live = live_stdin;
                tokio::spawn(async move {
                    // A guest that exits without reading its stdin closes the pipe: not an
                    // error. A streamed stdin is copied as the guest reads it (one buffer at a
                    // time), and the pipe closes at its end.
                    let _ = match live.as_mut() {
                        Some(src) => tokio::io::copy(src, &mut stdin).await.map(drop),
                        None => stdin.write_all(&bytes).await,
                    };
                });
            }
            (Box::new(out), Box::new(err))
        }
        _ => return Err(RunError::Internal("helper pipes missing".into())),
    })
}

pub(crate) async fn finish(
    done: Option<Result<stockade_protocol::CaptureEnd, stockade_protocol::CaptureError>>,
    task: &mut tokio::task::JoinHandle<Result<stockade_protocol::CaptureEnd, stockade_protocol::CaptureError>>,
) -> Captured {
    let r = match done {
        Some(r) => r,
        None => match tokio::time::timeout(DRAIN_GRACE, &mut *task).await {
            Ok(Ok(r)) => r,
            _ => {
                task.abort();
                return Captured::default();
            }
        },
    };
    match r {
        Ok(end) => end.captured,
        Err(e) => e.captured,
    }
}

/// A capture task's end: the capture, and whether its budget was crossed.
pub(crate) fn captured(
    r: Result<Result<stockade_protocol::CaptureEnd, stockade_protocol::CaptureError>, tokio::task::JoinError>,
) -> Result<(Result<stockade_protocol::CaptureEnd, stockade_protocol::CaptureError>, bool), RunError> {
    let r = r.map_err(|e| RunError::Internal(e.to_string()))?;
    let over = matches!(&r, Ok(end) if end.flow == Flow::OverBudget);
    Ok((r, over))
}

/// Where output is read from: a pipe, or the terminal's master side.
pub(crate) type Reader = Box<dyn tokio::io::AsyncRead + Unpin + Send>;

/// A private pty for a run that asked for a terminal.
pub(crate) fn open_terminal(
    size: Option<(u16, u16)>,
    echo: bool,
) -> Result<(tty::Master, std::os::fd::OwnedFd), RunError> {
    let unsupported =
        |e: std::io::Error| RunError::Unsupported { mechanism: "terminal".into(), reason: format!("pty: {e}") };
    let (master, slave) = tty::open_pty(size, echo).map_err(unsupported)?;
    Ok((tty::Master::new(master).map_err(unsupported)?, slave))
}

/// The helper's status pipe, bounded as a whole: at most [`MAX_REPORT_LINES`] lines'
/// worth of [`MAX_REPORT_LINE`] bytes.
pub(crate) type StatusReader = tokio::io::BufReader<tokio::io::Take<tokio::net::unix::pipe::Receiver>>;

pub(crate) fn status_reader(pipe: tokio::net::unix::pipe::Receiver) -> StatusReader {
    tokio::io::BufReader::new(tokio::io::AsyncReadExt::take(pipe, (MAX_REPORT_LINE * MAX_REPORT_LINES) as u64))
}

/// Reads report lines, each at most [`MAX_REPORT_LINE`] bytes and at most
/// [`MAX_REPORT_LINES`] of them, until the end of the pipe or a line that `stop` says ends
/// the reading (it sees every line as it comes).
pub(crate) async fn read_lines(reader: &mut StatusReader, mut stop: impl FnMut(&Msg) -> bool) -> Vec<Msg> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt};
    let mut out = Vec::new();
    let mut line = Vec::new();
    while out.len() < MAX_REPORT_LINES {
        line.clear();
        match (&mut *reader).take(MAX_REPORT_LINE as u64).read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                if let Ok(msg) = serde_json::from_slice::<Msg>(&line) {
                    let end = stop(&msg);
                    out.push(msg);
                    if end {
                        break;
                    }
                }
            }
        }
    }
    out
}

/// Reads a run's report lines up to the helper's `Ended`. A [`Msg::Listening`] hands the
/// helper's listener (taken through `take`'s pidfd) to `take`'s [`Loopback`] at once; if it
/// cannot be taken, the helper is killed and the lines end with that [`Msg::Error`], so the
/// run fails closed rather than running with a grant nobody serves.
pub(crate) async fn read_messages(
    pipe: tokio::net::unix::pipe::Receiver,
    mut take: Option<(std::os::fd::OwnedFd, Loopback)>,
) -> Vec<Msg> {
    let mut failed = None;
    let mut msgs = read_lines(&mut status_reader(pipe), |msg| {
        if let Msg::Listening { fd } = msg
            && let Some((pidfd, loopback)) = take.take()
        {
            failed = hand_over(&pidfd, *fd, loopback).err();
        }
        matches!(msg, Msg::Ended)
    })
    .await;
    msgs.extend(failed);
    msgs
}

/// The mechanism a failed [`hand_over`] names.
pub(crate) const LOOPBACK_STAGE: &str = "the grants' loopback listener";

/// Takes the helper's listening socket `fd` and gives it to `loopback`. A helper that is
/// already gone (the run ended first) leaves nothing to take: the grant's listener is
/// simply never served. Any other failure (a supervisor without `CAP_SYS_PTRACE` over a
/// helper of another uid: a container that dropped it) kills the helper, so its run ends,
/// and is the [`Msg::Error`] that says why.
pub(crate) fn hand_over(pidfd: &std::os::fd::OwnedFd, fd: i32, loopback: Loopback) -> Result<(), Msg> {
    use std::os::fd::AsFd;
    match crate::sys::process::pidfd_getfd(pidfd.as_fd(), fd) {
        Ok(socket) => {
            (loopback.serve)(std::net::TcpListener::from(socket));
            Ok(())
        }
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
        Err(e) => {
            let _ = crate::sys::process::pidfd_kill(pidfd.as_fd(), libc::SIGKILL);
            Err(Msg::Error {
                stage: LOOPBACK_STAGE.into(),
                unsupported: true,
                message: format!(
                    "taking the helper's listener (pidfd_getfd): {e}; the supervisor needs CAP_SYS_PTRACE over its helper"
                ),
            })
        }
    }
}
