//! Sessions: a live sandbox that serves many commands and keeps its state ([`Session`]),
//! and their owner ([`Sessions`]), which gives each an id, a home, and an end.
//!
//! A session is the process tier's [`ProcessSession`](stockade_process::ProcessSession) with what an owner adds: an id no
//! other session of this host had (16 random bytes, hex), a home directory made for it alone
//! under `sessions/OWNER/ID` in stockade's state directory (bound read-write at
//! `/home/user`, served on the host by [`files::Files`]), an idle timeout and a maximum
//! lifetime. [`Sessions`] holds the live ones; its reaper kills each one whose idle time or
//! lifetime is over, without anyone calling. The `OWNER` directory is named after the owner's
//! pid and start time: an owner that was SIGKILLed leaves its sessions' homes (its sandboxes
//! die with it: parent-death signals), and the next owner, or `stockade gc`, removes them.
//!
//! The sandbox behind a session is a `SessionBackend` (`backend.rs`): one trait with one set
//! of exec options, implemented by the process tier's session (`backend.rs`) and the docker
//! tier's (`docker.rs`, the only place that names the `docker` feature). A session holds a
//! boxed backend and never asks which tier it is.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use stockade_process::files::Files;
use stockade_process::{ProcessTier, SESSION_HOME, SessionConfig, files};
use stockade_protocol::{Job, Limits, LiveIo, Report, RunError, Workspace};

/// Which tier runs a session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum SessionTier {
    /// The process tier (`ProcessSession`): namespaces, landlock, seccomp, cgroups.
    #[default]
    Process,
    /// The docker tier: one hardened container of this image (local; never pulled).
    Docker {
        /// The image.
        image: String,
    },
}

/// What a session is made from.
#[derive(Debug, Clone)]
pub struct SessionProfile {
    /// The tier that runs it.
    pub tier: SessionTier,
    /// Memory and processes for the whole session; each exec brings its own wall clock,
    /// CPU and output budgets.
    pub limits: Limits,
    /// A workspace, held for the session's whole life.
    pub workspace: Option<Workspace>,
    /// The session ends after this long without an exec or a files call.
    pub idle_timeout: Duration,
    /// The session ends this long after it was made, however busy.
    pub max_lifetime: Duration,
    /// A snapshot ([`Session::snapshot`]) whose files the new session's home starts with.
    pub from_snapshot: Option<PathBuf>,
    /// Grants served to every exec for the session's whole life, by one broker (its call
    /// bounds count the session's calls): data, functions, a model, the network.
    pub grants: Option<Arc<crate::Grants>>,
    /// The session's environment: every exec gets these variables unless it sets them
    /// itself (then `PATH` and `HOME` as defaults, the same way).
    pub env: Vec<(String, String)>,
    /// The size of the session's home, bytes: a write past it fails (`ENOSPC`). In the
    /// process tier, a tmpfs the owner mounts on the home (it takes root; without it the
    /// session is refused, naming the mechanism), memory-backed and charged to the session's
    /// memory; `None` leaves the home on the state directory's disk, uncapped. In the docker
    /// tier, the home volume's size (default `stockade_docker::session::HOME_BYTES`).
    pub home_bytes: Option<u64>,
}

impl Default for SessionProfile {
    fn default() -> Self {
        Self {
            tier: SessionTier::Process,
            limits: Limits::default(),
            workspace: None,
            idle_timeout: Duration::from_secs(300),
            max_lifetime: Duration::from_secs(3600),
            from_snapshot: None,
            grants: None,
            env: Vec::new(),
            home_bytes: None,
        }
    }
}

/// How long [`Session::send_stdin`] waits for a background exec to read its input.
pub const STDIN_WAIT: Duration = Duration::from_secs(10);

mod backend;
mod docker;

use backend::{Control, ExecOptions, FileOp, FileOut, ProcessBackend, SessionBackend};

/// An exec's job: `argv` with `env` and its stdin bytes, its deadline both its wall clock
/// and its CPU time (without one, the default limits'). The session adds its own variables,
/// then `PATH` and `HOME`, where the exec sets none.
pub fn exec_job(
    argv: &[String],
    env: impl IntoIterator<Item = (String, String)>,
    stdin: Vec<u8>,
    deadline: Option<Duration>,
) -> Result<Job, RunError> {
    let invalid = |e: &dyn std::fmt::Display| RunError::Misconfigured(e.to_string());
    let (program, args) = argv.split_first().ok_or_else(|| invalid(&"no command"))?;
    let mut job = Job::command(program.clone(), args.iter().cloned())
        .and_then(|j| j.with_stdin(stdin))
        .map_err(|e| invalid(&e))?;
    for (k, v) in env {
        job = job.with_env(k, v).map_err(|e| invalid(&e))?;
    }
    if let Some(d) = deadline {
        job = job.with_limits(Limits::default().with_wall(d).and_then(|l| l.with_cpu(d)).map_err(|e| invalid(&e))?);
    }
    Ok(job)
}

/// What a session uses at one moment ([`Session::usage`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Memory in use (its cgroup's), bytes.
    pub memory_bytes: u64,
    /// The page cache within it, bytes.
    pub memory_cache: u64,
    /// Its memory limit, bytes.
    pub memory_limit: u64,
    /// CPU time of everything it has run, nanoseconds (only grows).
    pub cpu_ns: u64,
    /// Bytes used of its home's filesystem (its size cap, where it has one).
    pub disk_used: u64,
    /// That filesystem's size, bytes.
    pub disk_total: u64,
}

impl Usage {
    /// A usage from its memory (in use, page cache, limit), CPU time and home filesystem
    /// (used, size; zero where unknown).
    pub(crate) fn of(
        [memory_bytes, memory_cache, memory_limit]: [u64; 3],
        cpu_ns: u64,
        disk: Option<(u64, u64)>,
    ) -> Self {
        let (disk_used, disk_total) = disk.unwrap_or((0, 0));
        Self { memory_bytes, memory_cache, memory_limit, cpu_ns, disk_used, disk_total }
    }
}

/// Why a session ended by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// Its idle timeout passed.
    Idle,
    /// Its maximum lifetime passed.
    Lifetime,
}

/// How [`Session::start`] starts a background exec.
#[derive(Debug, Clone, Default)]
pub struct StartOptions {
    /// A pseudo-terminal of this size (rows, columns) as its stdio: its output comes as
    /// stdout, its input is typed into it ([`Session::send_stdin`]), and
    /// [`Session::resize`] changes its size.
    pub pty: Option<(u16, u16)>,
    /// Its stdin stays open for [`Session::send_stdin`] until [`Session::close_stdin`];
    /// without it (and without a pty) stdin is `/dev/null`, as in `docker exec -d`.
    pub stdin: bool,
    /// A name the caller gives it, listed with it.
    pub tag: Option<String>,
}

/// One chunk of a background exec's output, in the order it was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chunk {
    /// From its stdout (or its terminal).
    Stdout(Vec<u8>),
    /// From its stderr.
    Stderr(Vec<u8>),
}

impl Chunk {
    fn len(&self) -> usize {
        match self {
            Self::Stdout(b) | Self::Stderr(b) => b.len(),
        }
    }
}

/// Most bytes of a background exec's latest output kept for [`Background::attach`] to
/// replay: 1 MiB (older chunks go first).
pub const HISTORY_BYTES: usize = 1 << 20;

/// Most bytes a live reader of a background exec ([`LiveOutput`]) may fall behind its
/// output: past it, the exec's output is not read (its pipe fills and its writes wait)
/// until the slowest reader has taken some. So a background exec's output holds at most
/// [`HISTORY_BYTES`] plus this plus one read (64 KiB) of the owner's memory, however fast
/// it writes and however slowly it is read.
pub const LIVE_BYTES: usize = 1 << 20;

/// Most background execs a session keeps a handle on, running or ended (the oldest ended
/// one goes first; running ones are never dropped).
pub const MAX_BACKGROUND: usize = 256;

/// A background exec's output: every chunk from the oldest still kept, each with its
/// sequence number and the byte offset it starts at, and each live reader's place.
#[derive(Default)]
struct LogState {
    chunks: std::collections::VecDeque<(u64, Chunk)>,
    // The sequence number of `chunks[0]`, and of the next chunk pushed.
    first: u64,
    next: u64,
    // Bytes pushed in all, and bytes `chunks` holds.
    pushed: u64,
    held: usize,
    // Each live reader's next sequence number.
    readers: HashMap<u64, u64>,
    next_reader: u64,
    ended: bool,
}

impl LogState {
    /// How far the reader at `seq` is behind the output, in bytes.
    fn behind(&self, seq: u64) -> u64 {
        let at = usize::try_from(seq.saturating_sub(self.first)).unwrap_or(usize::MAX);
        self.chunks.get(at).map_or(0, |(offset, _)| self.pushed - offset)
    }

    /// Drops the oldest chunks past [`HISTORY_BYTES`] that every reader has taken.
    fn trim(&mut self) {
        let oldest_unread = self.readers.values().copied().min().unwrap_or(self.next);
        while self.held > HISTORY_BYTES && self.first < oldest_unread {
            match self.chunks.pop_front() {
                Some((_, old)) => {
                    self.held -= old.len();
                    self.first += 1;
                }
                None => break,
            }
        }
    }
}

/// A background exec's output: its latest [`HISTORY_BYTES`], and a place for each live
/// reader ([`LiveOutput`]), written under one lock so that an attach gets every chunk once,
/// history then live. It paces the exec's reading to its slowest reader ([`LIVE_BYTES`]).
#[derive(Default)]
struct OutputLog {
    state: Mutex<LogState>,
    // Woken on each push and at the end, and on each take and each reader gone.
    pushed: tokio::sync::Notify,
    taken: tokio::sync::Notify,
}

impl OutputLog {
    fn state(&self) -> std::sync::MutexGuard<'_, LogState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn push(&self, chunk: Chunk) {
        let mut state = self.state();
        let seq = state.next;
        let offset = state.pushed;
        state.next += 1;
        state.pushed += chunk.len() as u64;
        state.held += chunk.len();
        state.chunks.push_back((offset, chunk));
        debug_assert_eq!(state.first + state.chunks.len() as u64, seq + 1);
        state.trim();
        drop(state);
        self.pushed.notify_waiters();
    }

    fn end(&self) {
        self.state().ended = true;
        self.pushed.notify_waiters();
        self.taken.notify_waiters();
    }
}

impl stockade_protocol::Pace for OutputLog {
    fn ready(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            loop {
                let taken = self.taken.notified();
                tokio::pin!(taken);
                taken.as_mut().enable();
                {
                    let state = self.state();
                    let limit = LIVE_BYTES as u64;
                    if state.ended || state.readers.values().all(|seq| state.behind(*seq) <= limit) {
                        return;
                    }
                }
                taken.await;
            }
        })
    }
}

/// A live reader of a background exec's output ([`Background::attach`]): each chunk once,
/// in order. While it is [`LIVE_BYTES`] behind, the exec's output waits for it; dropping it
/// lets the exec go on.
pub struct LiveOutput {
    log: Arc<OutputLog>,
    id: u64,
}

impl std::fmt::Debug for LiveOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveOutput").field("id", &self.id).finish_non_exhaustive()
    }
}

impl LiveOutput {
    /// The next chunk, if one is there now.
    pub fn try_recv(&mut self) -> Option<Chunk> {
        let mut state = self.log.state();
        let seq = *state.readers.get(&self.id)?;
        let at = usize::try_from(seq.checked_sub(state.first)?).ok()?;
        let chunk = state.chunks.get(at)?.1.clone();
        state.readers.insert(self.id, seq + 1);
        state.trim();
        drop(state);
        self.log.taken.notify_waiters();
        Some(chunk)
    }

    /// The next chunk, once there is one (pending for good once the exec has ended and
    /// everything was taken: wait for the exec's end beside it, then [`Self::try_recv`]).
    pub async fn recv(&mut self) -> Chunk {
        let log = Arc::clone(&self.log);
        loop {
            let pushed = log.pushed.notified();
            tokio::pin!(pushed);
            pushed.as_mut().enable();
            if let Some(c) = self.try_recv() {
                return c;
            }
            pushed.await;
        }
    }
}

impl Drop for LiveOutput {
    fn drop(&mut self) {
        let mut state = self.log.state();
        state.readers.remove(&self.id);
        state.trim();
        drop(state);
        self.log.taken.notify_waiters();
    }
}

/// One stream of a background exec, written into its [`OutputLog`].
struct LogWriter {
    log: Arc<OutputLog>,
    stdout: bool,
}

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let bytes = buf.to_vec();
        self.log.push(if self.stdout { Chunk::Stdout(bytes) } else { Chunk::Stderr(bytes) });
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// An exec running in the background of a session ([`Session::start`]): its output can be
/// attached to at any time (the latest [`HISTORY_BYTES`], then live), its stdin written and
/// closed, its process group signalled, its terminal resized, and its end awaited.
pub struct Background {
    pid: u32,
    control: Control,
    argv: Vec<String>,
    tag: Option<String>,
    cwd: Option<String>,
    output: Arc<OutputLog>,
    stdin: tokio::sync::Mutex<Option<tokio::io::DuplexStream>>,
    done: tokio::sync::watch::Receiver<Option<Result<Report, RunError>>>,
}

impl std::fmt::Debug for Background {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Background").field("pid", &self.pid).field("argv", &self.argv).finish_non_exhaustive()
    }
}

impl Background {
    /// Its pid in the session.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Its command.
    #[must_use]
    pub fn argv(&self) -> &[String] {
        &self.argv
    }

    /// The tag it was started with.
    #[must_use]
    pub fn tag(&self) -> Option<&str> {
        self.tag.as_deref()
    }

    /// The working directory it was started in, if one was named.
    #[must_use]
    pub fn cwd(&self) -> Option<&str> {
        self.cwd.as_deref()
    }

    /// Whether it has a terminal.
    #[must_use]
    pub fn has_pty(&self) -> bool {
        self.control.has_pty()
    }

    /// Whether it is still running.
    #[must_use]
    pub fn running(&self) -> bool {
        self.done.borrow().is_none()
    }

    /// Its output so far (the latest [`HISTORY_BYTES`]) and a reader of what comes next:
    /// each chunk exactly once across the two, none lost. While the reader is
    /// [`LIVE_BYTES`] behind, the exec's output waits for it (back-pressure to the guest).
    #[must_use]
    pub fn attach(&self) -> (Vec<Chunk>, LiveOutput) {
        let mut state = self.output.state();
        let mut history = Vec::new();
        let mut bytes = 0;
        for (_, c) in state.chunks.iter().rev() {
            if bytes + c.len() > HISTORY_BYTES && !history.is_empty() {
                break;
            }
            bytes += c.len();
            history.push(c.clone());
        }
        history.reverse();
        let id = state.next_reader;
        state.next_reader += 1;
        let next = state.next;
        state.readers.insert(id, next);
        (history, LiveOutput { log: Arc::clone(&self.output), id })
    }

    /// Waits for its end: its report (stdout and stderr hold the first bytes of each, up to
    /// the exec's output budgets), or why it could not run.
    pub async fn wait(&self) -> Result<Report, RunError> {
        let mut done = self.done.clone();
        let r = done.wait_for(Option::is_some).await;
        match r.as_deref() {
            Ok(Some(result)) => result.clone(),
            _ => Err(RunError::Internal("a background exec's task ended without a result".into())),
        }
    }
}

/// One live session ([`Sessions::create`]).
pub struct Session {
    id: String,
    // Read-locked by every exec (they run side by side), write-locked to end it.
    inner: tokio::sync::RwLock<Option<Box<dyn SessionBackend>>>,
    background: Mutex<Vec<Arc<Background>>>,
    // The grants' broker, for the session's whole life.
    broker: Option<crate::Broker>,
    // Where an exec sees the grants directory, and whether the loopback listener is there
    // (a docker session's; a process session's is the process tier's, always).
    guest: std::sync::OnceLock<(&'static str, bool)>,
    // Execs in flight, foreground and background.
    running: std::sync::atomic::AtomicUsize,
    files: Option<Arc<Files>>,
    dir: PathBuf,
    paused: std::sync::atomic::AtomicBool,
    // Set when `kill` begins: nothing of it runs after.
    ended: std::sync::atomic::AtomicBool,
    profile: SessionProfile,
    made: Instant,
    used: Mutex<Instant>,
    // The home's size cap (a tmpfs), unmounted when the session ends.
    home_mount: Mutex<Option<stockade_process::HomeMount>>,
    // Its place under the owner's cap, given back when it has ended.
    slot: Mutex<Option<tokio::sync::OwnedSemaphorePermit>>,
    // A root owner's process session: the host id its guest runs as, claimed until every
    // process of it has ended.
    host_id: Mutex<Option<crate::guest_id::GuestId>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("id", &self.id).finish_non_exhaustive()
    }
}

impl Session {
    /// The session's id.
    #[must_use]
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The profile it was made from.
    #[must_use]
    pub fn profile(&self) -> &SessionProfile {
        &self.profile
    }

    /// How long it has lived, and how long since its last exec or files call.
    #[must_use]
    pub fn age(&self) -> (Duration, Duration) {
        (self.made.elapsed(), self.used.lock().unwrap_or_else(PoisonError::into_inner).elapsed())
    }

    fn touch(&self) {
        *self.used.lock().unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }

    /// Whether its idle timeout or lifetime is over (a paused session, or one with an exec
    /// running, foreground or background, is not idle: only its lifetime ends it).
    #[must_use]
    pub fn expired(&self) -> Option<Expiry> {
        let (age, idle) = self.age();
        let busy = self.running.load(std::sync::atomic::Ordering::Relaxed) > 0;
        if age >= self.profile.max_lifetime {
            Some(Expiry::Lifetime)
        } else if idle >= self.profile.idle_timeout && !self.paused() && !busy {
            Some(Expiry::Idle)
        } else {
            None
        }
    }

    /// Runs one exec ([`ProcessSession::exec`](stockade_process::ProcessSession::exec)).
    pub async fn exec(&self, job: &Job, cwd: Option<&str>, io: LiveIo) -> Result<Report, RunError> {
        self.exec_with(job, cwd, io, ExecOptions::default()).await
    }

    /// One exec with its options, counted as running (the session is not idle meanwhile).
    async fn exec_with(&self, job: &Job, cwd: Option<&str>, io: LiveIo, opts: ExecOptions) -> Result<Report, RunError> {
        use std::sync::atomic::Ordering;
        self.touch();
        // The exec's own variables, then the session's, then (with grants) the broker's (a
        // job that sets those is refused), then the defaults.
        let mut full = with_missing(job.clone(), &self.profile.env)?;
        if let Some(b) = &self.broker {
            let (dir, loopback) = self.guest.get().copied().unwrap_or((stockade_process::GRANTS_GUEST_DIR, true));
            full = b.session_job(&full, dir, loopback)?;
        }
        let defaults =
            [("PATH".to_owned(), crate::DEFAULT_PATH.to_owned()), ("HOME".to_owned(), SESSION_HOME.to_owned())];
        let full = with_missing(full, &defaults)?;
        let job = &full;
        self.running.fetch_add(1, Ordering::Relaxed);
        let report = async {
            match self.inner.read().await.as_deref() {
                None => Err(self.gone()),
                Some(backend) => backend.exec(job, cwd, io, opts).await,
            }
        }
        .await;
        self.running.fetch_sub(1, Ordering::Relaxed);
        self.touch();
        report
    }

    /// Starts `job` in the background and returns its handle once its guest is forked: its
    /// output is kept for [`Background::attach`] (the report keeps the first bytes up to the
    /// job's output budgets, and the exec goes on past them), and it ends at its deadline,
    /// at the end of its command, or with the session. Execs in flight hold the session
    /// open: [`Session::kill`] ends them first.
    pub async fn start(
        self: &Arc<Self>,
        job: Job,
        cwd: Option<String>,
        opts: StartOptions,
    ) -> Result<Arc<Background>, RunError> {
        self.touch();
        let log = Arc::new(OutputLog::default());
        let (stdin, reader) = match opts.stdin || opts.pty.is_some() {
            true => {
                let (w, r) = tokio::io::duplex(64 << 10);
                (Some(w), Some(Box::new(r) as Box<dyn tokio::io::AsyncRead + Send + Unpin>))
            }
            false => (None, None),
        };
        let io = LiveIo {
            stdin: reader,
            stdout: Some(Box::new(LogWriter { log: Arc::clone(&log), stdout: true })),
            stderr: Some(Box::new(LogWriter { log: Arc::clone(&log), stdout: false })),
            pace: Some(Arc::clone(&log) as Arc<dyn stockade_protocol::Pace>),
        };
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let (done_tx, done_rx) = tokio::sync::watch::channel(None);
        let exec_opts = ExecOptions { pty: opts.pty, drain: true, started: Some(started_tx) };
        let argv: Vec<String> = match job.kind() {
            stockade_protocol::JobKind::Command { program, args } => {
                std::iter::once(program.clone()).chain(args.iter().cloned()).collect()
            }
            _ => Vec::new(),
        };
        let session = Arc::clone(self);
        let task_cwd = cwd.clone();
        let ended = Arc::clone(&log);
        tokio::spawn(async move {
            let result = session.exec_with(&job, task_cwd.as_deref(), io, exec_opts).await;
            ended.end();
            let _ = done_tx.send(Some(result));
        });
        let Ok((pid, control)) = started_rx.await else {
            // It ended before its guest was forked: why.
            let mut done = done_rx;
            let r = done.wait_for(Option::is_some).await;
            return match r.as_deref() {
                Ok(Some(Err(e))) => Err(e.clone()),
                _ => Err(RunError::Internal("the background exec ended before it started".into())),
            };
        };
        let handle = Arc::new(Background {
            pid,
            control,
            argv,
            tag: opts.tag,
            cwd,
            output: log,
            stdin: tokio::sync::Mutex::new(stdin),
            done: done_rx,
        });
        let mut all = self.background.lock().unwrap_or_else(PoisonError::into_inner);
        // A pid the session reused names the new exec.
        all.retain(|b| b.pid != handle.pid);
        if all.len() >= MAX_BACKGROUND
            && let Some(i) = all.iter().position(|b| !b.running())
        {
            all.remove(i);
        }
        all.push(Arc::clone(&handle));
        Ok(handle)
    }

    /// Its background execs ([`Session::start`]), running or ended (the latest
    /// [`MAX_BACKGROUND`]), oldest first.
    #[must_use]
    pub fn background(&self) -> Vec<Arc<Background>> {
        self.background.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The background exec with this pid.
    pub fn find(&self, pid: u32) -> Result<Arc<Background>, RunError> {
        self.background().into_iter().find(|b| b.pid == pid).ok_or_else(|| {
            RunError::Misconfigured(format!("session {} started no background exec with pid {pid}", self.id))
        })
    }

    /// Sends `signal` to a running background exec's process group (what it started in its
    /// own process group is not reached; [`Session::kill`] ends everything).
    pub async fn signal(&self, pid: u32, signal: i32) -> Result<(), RunError> {
        self.touch();
        let b = self.find(pid)?;
        if !b.running() {
            return Err(RunError::Ended(format!("the exec with pid {pid} has ended")));
        }
        match self.inner.read().await.as_deref() {
            Some(backend) => backend.signal(&b.control, pid, signal).await,
            None => Err(self.gone()),
        }
    }

    /// Writes `bytes` to a background exec's stdin (or types them into its terminal),
    /// waiting at most [`STDIN_WAIT`] for it to read them.
    pub async fn send_stdin(&self, pid: u32, bytes: &[u8]) -> Result<(), RunError> {
        use tokio::io::AsyncWriteExt;
        self.touch();
        let b = self.find(pid)?;
        let mut stdin = b.stdin.lock().await;
        let w = stdin.as_mut().ok_or_else(|| {
            RunError::Misconfigured(format!("the exec with pid {pid} has no open stdin (start it with one)"))
        })?;
        match tokio::time::timeout(STDIN_WAIT, w.write_all(bytes)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(RunError::Misconfigured(format!("the exec with pid {pid} no longer reads its stdin"))),
            Err(_) => {
                Err(RunError::Busy(format!("the exec with pid {pid} did not read its stdin within {STDIN_WAIT:?}")))
            }
        }
    }

    /// Closes a background exec's stdin (its reader sees the end of its input; a terminal
    /// has no end of input: this is refused for one).
    pub async fn close_stdin(&self, pid: u32) -> Result<(), RunError> {
        self.touch();
        let b = self.find(pid)?;
        if b.has_pty() {
            return Err(RunError::Misconfigured(format!(
                "the exec with pid {pid} has a terminal: type ^D (0x04) to end its input"
            )));
        }
        b.stdin.lock().await.take();
        Ok(())
    }

    /// Sets a background exec's terminal size (rows, columns); its process group gets
    /// `SIGWINCH`.
    pub async fn resize(&self, pid: u32, rows: u16, cols: u16) -> Result<(), RunError> {
        self.touch();
        let b = self.find(pid)?;
        if !b.has_pty() {
            return Err(RunError::Misconfigured(format!(
                "the exec with pid {pid} has no terminal (start it with a pty)"
            )));
        }
        match self.inner.read().await.as_deref() {
            Some(backend) => backend.resize(&b.control, pid, rows, cols).await,
            None => Err(self.gone()),
        }
    }

    /// Its processes, init aside ([`ProcessSession::processes`](stockade_process::ProcessSession::processes); a docker session's as the
    /// engine lists them, each pid the one in the container where the host's `/proc` says
    /// it).
    pub async fn processes(&self) -> Vec<stockade_process::SessionProcess> {
        match self.inner.read().await.as_deref() {
            None => Vec::new(),
            Some(backend) => backend.processes().await,
        }
    }

    /// What it uses now ([`Usage`]); `None` for a session that has ended or a tier that
    /// cannot say (docker).
    pub async fn usage(&self) -> Option<Usage> {
        match self.inner.read().await.as_deref() {
            Some(backend) => backend.usage().await,
            None => None,
        }
    }

    /// A connection to `127.0.0.1:port` on its own loopback (a server an exec started), as
    /// a blocking socket (for the caller's runtime to adopt).
    pub async fn connect(&self, port: u16) -> Result<std::net::TcpStream, RunError> {
        match self.inner.read().await.as_deref() {
            Some(backend) => backend.connect(port).await,
            None => Err(self.gone()),
        }
    }

    /// Whether it has been killed (or is being killed): an exec that ends now ended with it.
    #[must_use]
    pub fn ended(&self) -> bool {
        self.ended.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether it is paused.
    #[must_use]
    pub fn paused(&self) -> bool {
        self.paused.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Pauses it ([`ProcessSession::pause`](stockade_process::ProcessSession::pause), or `docker pause`): no CPU, no exec (for the
    /// process tier, deadlines stopped).
    pub async fn pause(&self) -> Result<(), RunError> {
        self.set_paused(true).await
    }

    /// Resumes it ([`ProcessSession::resume`](stockade_process::ProcessSession::resume), or `docker unpause`).
    pub async fn resume(&self) -> Result<(), RunError> {
        self.set_paused(false).await
    }

    async fn set_paused(&self, paused: bool) -> Result<(), RunError> {
        self.touch();
        match self.inner.read().await.as_deref() {
            None => return Err(self.gone()),
            Some(backend) => backend.set_paused(paused, self.paused()).await?,
        }
        self.paused.store(paused, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// The error of a call on a session that has ended.
    fn gone(&self) -> RunError {
        RunError::Ended(format!("session {} is gone", self.id))
    }

    /// A filesystem-only snapshot: the session's home (every file, directory and symlink
    /// under `/home/user`, at most [`MAX_SNAPSHOT_BYTES`] of content) written to `to` as a
    /// tar archive (a new file, mode 0600), with the session paused meanwhile so that the
    /// archive is one moment's (a paused session stays paused). Processes, `/tmp` and the
    /// workspace are not in it. [`SessionProfile::from_snapshot`] makes a session from it.
    /// Returns the archive's size.
    pub async fn snapshot(&self, to: &Path) -> Result<u64, RunError> {
        let was_paused = self.paused();
        let tar = match self.inner.read().await.as_deref() {
            None => return Err(self.gone()),
            Some(backend) => backend.snapshot(was_paused).await?,
        };
        write_snapshot(to, &tar)
    }

    /// The files API of a process-tier session: the home at `/home/user` (and the
    /// workspace at `/workspace`), on the host, through cap-std. `None` for a docker
    /// session, whose files are in its container ([`Session::read`], [`Session::write`]).
    /// Its calls touch the host's filesystem and can wait on what the guest made there:
    /// make them on a blocking thread (`tokio::task::spawn_blocking`), as this type's own
    /// async calls do.
    #[must_use]
    pub fn files(&self) -> Option<&Arc<Files>> {
        self.touch();
        self.files.as_ref()
    }

    /// The files a directory watch reads: [`Session::files`], or for a docker session its
    /// home read-only through its container's init; `None` where the host cannot see them
    /// (a remote engine) or the session has ended.
    pub async fn watch_files(&self) -> Option<Arc<Files>> {
        if let Some(files) = self.files() {
            return Some(Arc::clone(files));
        }
        let view = match self.inner.read().await.as_deref() {
            Some(backend) => backend.home_view().await,
            None => None,
        };
        view.map(Arc::new)
    }

    /// Reads a file of the session by the guest's path, at most `limit` bytes: through
    /// [`Session::files`], or a docker session's container (the engine's archive API).
    pub async fn read(&self, path: &str, limit: u64) -> Result<Vec<u8>, FilesError> {
        match self.file(FileOp::Read { path: path.into(), limit }).await? {
            FileOut::Bytes(b) => Ok(b),
            _ => Err(unexpected(path)),
        }
    }

    /// Writes a file of the session by the guest's path, at most `limit` bytes.
    pub async fn write(&self, path: &str, data: &[u8], limit: u64) -> Result<(), FilesError> {
        self.write_with(path, data, limit, files::Metadata::new()).await
    }

    /// [`write`](Self::write), the file carrying `metadata` ([`Files::write_with`]; the
    /// docker tier keeps none and refuses it).
    pub async fn write_with(
        &self,
        path: &str,
        data: &[u8],
        limit: u64,
        metadata: files::Metadata,
    ) -> Result<(), FilesError> {
        if data.len() as u64 > limit {
            return Err(FilesError::TooLarge { path: path.into(), limit });
        }
        self.file(FileOp::Write { path: path.into(), data: data.to_vec(), limit, metadata }).await.map(drop)
    }

    /// The entry at `path`: through [`Session::files`], or inside a docker session's
    /// container (as its user, by the image's own tools).
    pub async fn stat(&self, path: &str) -> Result<Entry, FilesError> {
        match self.file(FileOp::Stat { path: path.into() }).await? {
            FileOut::Entry(e) => Ok(e),
            _ => Err(unexpected(path)),
        }
    }

    /// The entries under the directory `path`, `depth` levels down ([`Files::list`]).
    pub async fn list(&self, path: &str, depth: usize) -> Result<Vec<Entry>, FilesError> {
        match self.file(FileOp::List { path: path.into(), depth }).await? {
            FileOut::Entries(e) => Ok(e),
            _ => Err(unexpected(path)),
        }
    }

    /// Makes the directory `path` and its parents; `false` if it was there.
    pub async fn mkdir(&self, path: &str) -> Result<bool, FilesError> {
        match self.file(FileOp::Mkdir { path: path.into() }).await? {
            FileOut::Made(m) => Ok(m),
            _ => Err(unexpected(path)),
        }
    }

    /// Removes what is at `path` (a directory with what is in it).
    pub async fn remove(&self, path: &str) -> Result<(), FilesError> {
        self.file(FileOp::Remove { path: path.into() }).await.map(drop)
    }

    /// Renames `from` to `to`.
    pub async fn rename(&self, from: &str, to: &str) -> Result<(), FilesError> {
        self.file(FileOp::Rename { from: from.into(), to: to.into() }).await.map(drop)
    }

    /// One files call through its backend (counted as use).
    async fn file(&self, op: FileOp) -> Result<FileOut, FilesError> {
        self.touch();
        match self.inner.read().await.as_deref() {
            Some(backend) => backend.file(op).await,
            None => Err(FilesError::Invalid { path: op.path().into(), why: self.gone().to_string() }),
        }
    }

    /// Ends it: every process, the cgroup, and its home directory; returns the workspace
    /// sweep's result.
    pub async fn kill(&self) -> stockade_process::Swept {
        self.ended.store(true, std::sync::atomic::Ordering::SeqCst);
        // Running execs end with it (their pipes or the engine's streams close), so the
        // write lock comes.
        if let Some(backend) = self.inner.read().await.as_deref() {
            backend.stop().await;
        }
        let taken = self.inner.write().await.take();
        if let Some(b) = &self.broker {
            b.finish();
        }
        let swept = match taken {
            Some(backend) => backend.end(&self.id).await,
            None => stockade_process::Swept::default(),
        };
        // Every process of it has ended: its host id may go to another session.
        drop(self.host_id.lock().unwrap_or_else(PoisonError::into_inner).take());
        // Its home's unmount, and a tree whose size the guest decides: off the async workers.
        let mount = self.home_mount.lock().unwrap_or_else(PoisonError::into_inner).take();
        let dir = self.dir.clone();
        let _ = tokio::task::spawn_blocking(move || {
            drop(mount);
            std::fs::remove_dir_all(dir)
        })
        .await;
        drop(self.slot.lock().unwrap_or_else(PoisonError::into_inner).take());
        swept
    }
}

/// The owner of sessions: makes, finds, lists and ends them, and ends each one whose time is
/// over (its reaper, [`Sessions::reap_expired`]).
pub struct Sessions {
    tier: ProcessTier,
    // The engine's connection, made on the first docker session.
    #[cfg_attr(not(feature = "docker"), allow(dead_code, reason = "no docker tier in this build"))]
    docker: docker::Engine,
    root: PathBuf,
    max: usize,
    // `max` places: a create takes one before any work (concurrent creates cannot all pass
    // a count taken before any of them is live), and its session gives it back when it ends.
    slots: Arc<tokio::sync::Semaphore>,
    live: Mutex<HashMap<String, Arc<Session>>>,
    // Where the next host id claim starts (`guest_id`), spread by the owner's pid.
    next_host_id: std::sync::atomic::AtomicU32,
    // Appended to every session id after a `-` ([`Sessions::id_suffix`]).
    id_suffix: Option<String>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions").field("root", &self.root).finish_non_exhaustive()
    }
}

/// Most bytes of file content a snapshot holds: 256 MiB.
pub const MAX_SNAPSHOT_BYTES: u64 = 256 << 20;

/// Most live sessions one owner keeps by default.
pub const DEFAULT_MAX_SESSIONS: usize = 64;

impl Sessions {
    /// An owner whose sessions run in `tier`, with their homes under `state/sessions/OWNER`
    /// (`state`: stockade's state directory), at most `max` at a time. Removes what owners
    /// that were killed left there.
    pub fn new(tier: ProcessTier, state: &Path, max: usize) -> Result<Self, RunError> {
        let base = state.join("sessions");
        for dir in stale_homes(&base) {
            let _ = remove_stale_home(&dir);
        }
        let start = stockade_sys::proc::start_time("self").unwrap_or(0);
        let root = base.join(format!("{}-{start}", std::process::id()));
        std::fs::create_dir_all(&root)
            .and_then(|()| {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700))
            })
            .map_err(|e| RunError::Misconfigured(format!("sessions directory {}: {e}", root.display())))?;
        Ok(Self {
            tier,
            docker: docker::Engine::default(),
            root,
            max,
            slots: Arc::new(tokio::sync::Semaphore::new(max)),
            live: Mutex::new(HashMap::new()),
            next_host_id: std::sync::atomic::AtomicU32::new(std::process::id().wrapping_mul(97)),
            id_suffix: None,
        })
    }

    /// Ends every session id with `-SUFFIX`, so that an id names the owner that holds it (a
    /// pod's name, for a router that sends each request to the owner of the session it
    /// names). The suffix is a DNS label (lowercase letters, digits and inner `-`, at most
    /// [`MAX_ID_SUFFIX`] characters), so an id stays one label of a host name.
    pub fn id_suffix(mut self, suffix: &str) -> Result<Self, RunError> {
        if !is_id_suffix(suffix) {
            return Err(RunError::Misconfigured(format!(
                "session id suffix {suffix:?}: not a DNS label of lowercase letters, digits and inner '-', at most {MAX_ID_SUFFIX} characters"
            )));
        }
        self.id_suffix = Some(suffix.to_owned());
        Ok(self)
    }

    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Session>>> {
        self.live.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes a session: its place under the owner's cap is reserved first, so at most
    /// `max` sessions are live or being made, however many creates race.
    pub async fn create(&self, profile: SessionProfile) -> Result<Arc<Session>, RunError> {
        let Ok(slot) = Arc::clone(&self.slots).try_acquire_owned() else {
            return Err(RunError::Busy(format!("{} sessions are live, the most this owner keeps", self.max)));
        };
        let mut id = new_id().map_err(|e| RunError::Internal(format!("a session id: {e}")))?;
        if let Some(suffix) = &self.id_suffix {
            id = format!("{id}-{suffix}");
        }
        let session = match &profile.tier {
            SessionTier::Docker { image } => {
                let image = image.clone();
                self.create_docker(id, image, profile).await?
            }
            SessionTier::Process => self.create_process(id, profile).await?,
        };
        *session.slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(slot);
        Ok(session)
    }

    /// A process-tier session.
    async fn create_process(&self, id: String, profile: SessionProfile) -> Result<Arc<Session>, RunError> {
        let dir = self.root.join(&id);
        let home = dir.join("home");
        let cleanup = |e| {
            stockade_process::unmount_under(&dir);
            let _ = std::fs::remove_dir_all(&dir);
            e
        };
        // Its home on disk (a mount, a snapshot's files, open directories: as long as the
        // snapshot makes it, and a path the client names) off the async workers.
        let (home_mount, files) = {
            let (home, profile) = (home.clone(), profile.clone());
            tokio::task::spawn_blocking(move || prepare_home(&home, &profile))
                .await
                .map_err(|e| RunError::Misconfigured(format!("session home: {e}")))
                .and_then(|r| r)
                .map_err(cleanup)?
        };
        // A root owner gives the guest a host id of its own (`guest_id`): the kernel's
        // per-user limits are then this session's alone.
        let host_id = if stockade_sys::proc::is_root().unwrap_or(false) {
            let hint = self.next_host_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Some(crate::guest_id::GuestId::claim(hint).map_err(cleanup)?)
        } else {
            None
        };
        let guest_gid = host_id.as_ref().map_or(stockade_process::NOBODY, crate::guest_id::GuestId::id);
        let mut config = SessionConfig {
            limits: profile.limits,
            workspace: profile.workspace.clone(),
            home: Some(home),
            guest_id: host_id.as_ref().map(crate::guest_id::GuestId::id),
            ..SessionConfig::default()
        };
        // Grants: one broker for the session's life, its directory where a run's is: the
        // temporary directory, which the helper can traverse to bind it (the owner's 0700
        // directory it cannot), and whose path leaves a unix socket room.
        let broker = match profile.grants.as_ref().filter(|g| !g.is_empty()) {
            Some(g) => {
                let broker = crate::Broker::new(Arc::clone(g), std::env::temp_dir()).map_err(cleanup)?;
                config.grants_dir = Some(broker.socket_dir_for(guest_gid).map_err(cleanup)?);
                config.loopback = broker.loopback().map(|(port, serve)| stockade_process::Loopback::new(port, serve));
                Some(broker)
            }
            None => None,
        };
        let inner = self.tier.session(config).await.map_err(cleanup)?;
        let files = Arc::new(files);
        let backend = ProcessBackend { session: inner, files: Arc::clone(&files), home: dir.join("home") };
        let session = self.keep(id, Box::new(backend), Some(files), dir, profile, broker);
        *session.home_mount.lock().unwrap_or_else(PoisonError::into_inner) = home_mount;
        *session.host_id.lock().unwrap_or_else(PoisonError::into_inner) = host_id;
        Ok(session)
    }

    fn keep(
        &self,
        id: String,
        backend: Box<dyn SessionBackend>,
        files: Option<Arc<Files>>,
        dir: PathBuf,
        profile: SessionProfile,
        broker: Option<crate::Broker>,
    ) -> Arc<Session> {
        let session = Arc::new(Session {
            id: id.clone(),
            inner: tokio::sync::RwLock::new(Some(backend)),
            background: Mutex::new(Vec::new()),
            broker,
            guest: std::sync::OnceLock::new(),
            running: std::sync::atomic::AtomicUsize::new(0),
            files,
            dir,
            paused: std::sync::atomic::AtomicBool::new(false),
            ended: std::sync::atomic::AtomicBool::new(false),
            profile,
            made: Instant::now(),
            used: Mutex::new(Instant::now()),
            home_mount: Mutex::new(None),
            slot: Mutex::new(None),
            host_id: Mutex::new(None),
        });
        self.live().insert(id, Arc::clone(&session));
        session
    }

    /// The live session with this id.
    #[must_use]
    pub fn get(&self, id: &str) -> Option<Arc<Session>> {
        self.live().get(id).cloned()
    }

    /// Every live session, oldest first.
    #[must_use]
    pub fn list(&self) -> Vec<Arc<Session>> {
        let mut all: Vec<Arc<Session>> = self.live().values().cloned().collect();
        all.sort_by_key(|s| std::cmp::Reverse(s.age().0));
        all
    }

    /// Ends the session with this id; `None` if there is none.
    pub async fn kill(&self, id: &str) -> Option<stockade_process::Swept> {
        let session = self.live().remove(id)?;
        Some(session.kill().await)
    }

    /// Ends every session whose idle timeout or lifetime is over; returns their ids and why.
    pub async fn reap_expired(&self) -> Vec<(String, Expiry)> {
        let expired: Vec<(Arc<Session>, Expiry)> = {
            let mut live = self.live();
            let ids: Vec<(String, Expiry)> =
                live.iter().filter_map(|(id, s)| s.expired().map(|e| (id.clone(), e))).collect();
            ids.into_iter().filter_map(|(id, e)| live.remove(&id).map(|s| (s, e))).collect()
        };
        let mut out = Vec::new();
        for (s, e) in expired {
            s.kill().await;
            out.push((s.id().to_owned(), e));
        }
        out
    }

    /// Ends every session (an owner shutting down).
    pub async fn kill_all(&self) {
        let all: Vec<Arc<Session>> = self.live().drain().map(|(_, s)| s).collect();
        for s in all {
            s.kill().await;
        }
        let _ = std::fs::remove_dir(&self.root);
    }
}

/// The session directories of owners that are gone (`sessions/PID-START` whose process is
/// not that one), for [`Sessions::new`] and `stockade gc`.
#[must_use]
pub fn stale_homes(base: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(base) else { return Vec::new() };
    entries
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            let Some((pid, start)) = name.split_once('-') else { return false };
            let (Ok(_), Ok(start)) = (pid.parse::<u32>(), start.parse::<u64>()) else { return false };
            stockade_sys::proc::start_time(pid) != Some(start)
        })
        .map(|e| e.path())
        .collect()
}

/// Removes a [`stale_homes`] directory: first what is mounted under it (a home's size cap,
/// left by a SIGKILLed owner), then the directory.
pub fn remove_stale_home(dir: &Path) -> std::io::Result<()> {
    stockade_process::unmount_under(dir);
    std::fs::remove_dir_all(dir)
}

/// `job` with each of `env` whose key it does not set already.
fn with_missing(job: Job, env: &[(String, String)]) -> Result<Job, RunError> {
    env.iter().try_fold(
        job,
        |j, (k, v)| {
            if j.env().iter().any(|e| e.key() == k) { Ok(j) } else { Ok(j.with_env(k, v)?) }
        },
    )
}

/// Writes a snapshot's archive to `to`, a new file of mode 0600; returns its size.
fn write_snapshot(to: &Path, tar: &[u8]) -> Result<u64, RunError> {
    let write = || -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(to)?;
        f.write_all(tar)?;
        f.sync_all()
    };
    write().map_err(|e| RunError::Misconfigured(format!("snapshot file {}: {e}", to.display())))?;
    Ok(tar.len() as u64)
}

/// Reads a snapshot file, bounded.
fn read_snapshot(from: &Path) -> Result<Vec<u8>, RunError> {
    let bound = stockade_process::stage::archive_bound(MAX_SNAPSHOT_BYTES);
    stockade_process::stage::read_regular(from, bound)
        .map_err(|e| RunError::Misconfigured(format!("snapshot {}: {e}", from.display())))
}

/// A new process session's `home`, made: the directory, its size cap (first: what a snapshot
/// restores, and what the files API opens, is on it), the snapshot's files, and the files
/// API over it and the workspace. Blocking: run off the async workers.
fn prepare_home(
    home: &Path,
    profile: &SessionProfile,
) -> Result<(Option<stockade_process::HomeMount>, Files), RunError> {
    std::fs::create_dir_all(home)
        .map_err(|e| RunError::Misconfigured(format!("session home {}: {e}", home.display())))?;
    let home_mount = profile.home_bytes.map(|b| stockade_process::HomeMount::mount(home, b)).transpose()?;
    if let Some(from) = &profile.from_snapshot {
        restore(from, home)?;
    }
    let mut files = Files::default()
        .serve(SESSION_HOME, home, true, false)
        .map_err(|e| RunError::Misconfigured(format!("session home {}: {e}", home.display())))?;
    if let Some(ws) = &profile.workspace {
        let rw = ws.access() == stockade_protocol::Access::ReadWrite;
        files = files
            .serve("/workspace", ws.path(), rw, rw)
            .map_err(|e| RunError::Misconfigured(format!("workspace {}: {e}", ws.path().display())))?;
    }
    Ok((home_mount, files))
}

/// Fills a new session's `home` from the snapshot file `from` (bounded, never through a link,
/// files, directories and symlinks, nothing through a link:
/// `stockade_hostfs::stage::unpack_snapshot`).
fn restore(from: &Path, home: &Path) -> Result<(), RunError> {
    let bytes = read_snapshot(from)?;
    let bad = |e: &dyn std::fmt::Display| RunError::Misconfigured(format!("snapshot {}: {e}", from.display()));
    stockade_process::stage::unpack_snapshot(&bytes, home).map_err(|e| bad(&e))?;
    Ok(())
}

/// A backend's answer of the wrong kind (an internal error).
fn unexpected(path: &str) -> FilesError {
    FilesError::Invalid { path: path.into(), why: "the files call returned another kind of answer".into() }
}

/// Most characters of a session id's suffix ([`Sessions::id_suffix`]): with the 32 hex digits,
/// the `-` before it and a port's `PORT-` before the id, a host label stays within DNS's 63.
pub const MAX_ID_SUFFIX: usize = 24;

/// Whether `s` may end session ids ([`Sessions::id_suffix`]).
#[must_use]
pub fn is_id_suffix(s: &str) -> bool {
    let b = s.as_bytes();
    (1..=MAX_ID_SUFFIX).contains(&b.len())
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b.first() != Some(&b'-')
        && b.last() != Some(&b'-')
}

/// Whether `id` has the form of a session id: 32 lowercase hex digits, then, if its owner has
/// an [id suffix](Sessions::id_suffix), `-` and the suffix.
#[must_use]
pub fn is_session_id(id: &str) -> bool {
    let (random, suffix) = match id.split_at_checked(32) {
        Some((r, "")) => (r, None),
        Some((r, rest)) => match rest.strip_prefix('-') {
            Some(s) => (r, Some(s)),
            None => return false,
        },
        None => return false,
    };
    random.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) && suffix.is_none_or(is_id_suffix)
}

/// 16 random bytes from the kernel, as 32 hex digits.
fn new_id() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The files API's types.
pub use files::{Entry, FilesError, Kind, Metadata};

/// The host ids a root owner's process sessions get, one each (`guest_id`).
pub use crate::guest_id::{GUEST_ID_BASE, GUEST_ID_LOCK_DIR, GUEST_IDS};

#[cfg(test)]
mod id_tests {
    use super::{MAX_ID_SUFFIX, is_id_suffix, is_session_id};

    #[test]
    fn a_session_id_is_32_hex_digits_then_its_owner_s_suffix() {
        let random = "0123456789abcdef0123456789abcdef";
        assert!(is_session_id(random));
        assert!(is_session_id(&format!("{random}-stockade-3")));
        for bad in [
            "",
            &random[1..],
            &format!("{random}0"),
            &random.to_uppercase(),
            &format!("{random}-"),
            &format!("{random}--x"),
            &format!("{random}-x-"),
            &format!("{random}-Pod"),
            &format!("{random}-a.b"),
            &format!("{random}-{}", "a".repeat(MAX_ID_SUFFIX + 1)),
            &format!("{}g-x", &random[1..]),
        ] {
            assert!(!is_session_id(bad), "{bad:?}");
        }
        assert!(is_id_suffix(&"a".repeat(MAX_ID_SUFFIX)));
        // The longest id, after a port, is one DNS label.
        assert!(format!("49983-{random}-{}", "a".repeat(MAX_ID_SUFFIX)).len() <= 63);
    }
}

#[cfg(test)]
mod live_output_tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use std::sync::Arc;

    use stockade_protocol::Pace as _;

    use super::{Chunk, HISTORY_BYTES, LIVE_BYTES, OutputLog};

    fn chunk(i: usize, len: usize) -> Chunk {
        Chunk::Stdout(vec![u8::try_from(i % 251).unwrap(); len])
    }

    fn background(log: &Arc<OutputLog>) -> super::Background {
        let (_, done) = tokio::sync::watch::channel(None);
        super::Background {
            pid: 1,
            control: super::Control::new(false, ()),
            argv: Vec::new(),
            tag: None,
            cwd: None,
            output: Arc::clone(log),
            stdin: tokio::sync::Mutex::new(None),
            done,
        }
    }

    #[tokio::test]
    async fn every_chunk_reaches_every_reader_once_and_the_writer_waits_for_the_slowest() {
        let log = Arc::new(OutputLog::default());
        let b = background(&log);
        log.push(chunk(0, 10));
        let (history, mut fast) = b.attach();
        assert_eq!(history, [chunk(0, 10)]);
        let (_, mut slow) = b.attach();
        // Past LIVE_BYTES unread by `slow`, the writer is not ready; `fast` keeping up does
        // not make it so.
        let piece = 64 << 10;
        let mut pushed = 0;
        let mut i = 1;
        while pushed <= LIVE_BYTES {
            log.push(chunk(i, piece));
            pushed += piece;
            i += 1;
            assert_eq!(fast.recv().await.len(), piece);
        }
        let ready = log.ready();
        tokio::pin!(ready);
        assert!(futures_poll_once(ready.as_mut()).await.is_none(), "ready with a reader a MiB behind");
        // The slow reader takes one chunk: the writer goes on, and nothing was lost.
        assert_eq!(slow.try_recv(), Some(chunk(1, piece)));
        ready.await;
        let mut n = 1;
        while let Some(c) = slow.try_recv() {
            n += 1;
            assert_eq!(c, chunk(n, piece));
        }
        assert_eq!(n, i - 1);
        // A reader that goes away holds nothing back.
        for j in 0..32 {
            log.push(chunk(j, piece));
        }
        drop(slow);
        drop(fast);
        log.ready().await;
        // With no reader, what is kept is the history's bound.
        assert!(log.state().held <= HISTORY_BYTES + piece, "{}", log.state().held);
        let (history, _) = b.attach();
        assert!(history.iter().map(Chunk::len).sum::<usize>() <= HISTORY_BYTES);
    }

    /// Polls `f` once: its output if it is ready.
    async fn futures_poll_once<F: std::future::Future + Unpin>(mut f: F) -> Option<F::Output> {
        std::future::poll_fn(|cx| match std::pin::Pin::new(&mut f).poll(cx) {
            std::task::Poll::Ready(v) => std::task::Poll::Ready(Some(v)),
            std::task::Poll::Pending => std::task::Poll::Ready(None),
        })
        .await
    }
}
