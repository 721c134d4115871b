//! Sessions of the docker tier ([`DockerTier::session`]): one hardened container that lives
//! across many execs, as E2B's and `docker run -d` + `docker exec`'s sandboxes do.
//!
//! The container is a pool keeper's (every default of G2: no network, read-only root, no
//! capabilities, no-new-privileges, uid 65534, the session's memory, pids, nofile and CPU
//! limits, `/tmp` tmpfs, an init, labels for reaping), with one more mount: its home, a
//! tmpfs-backed volume of the local driver (size- and inode-capped, nosuid, nodev, owned by
//! the job user) at [`SESSION_HOME`], so that the engine's archive API reaches it (it does
//! not reach a plain tmpfs mount). Files move through that API ([`DockerSession::read`],
//! [`DockerSession::write`]): never a host path, and the engine resolves the guest's path
//! inside the container.
//!
//! An exec is `docker exec` as the job user, with its own argv, environment, working
//! directory and stdin, its output captured fail-fast and copied live. Docker cannot kill an
//! exec: at an exec's deadline or a budget's breach, the supervisor kills the exec's process
//! (and its process group) from inside the container, by the pid the engine gives for it
//! (mapped into the container's pid namespace through the host's `/proc`, so this needs a
//! local engine and a `kill` in the image, as busybox has); where either is missing, the
//! container is killed and the session ends, and the report says so.
//!
//! The container dies with its owner: its keeper ([`SESSION_KEEPER`], `cat`) reads a stdin
//! the engine closes once the one client attached to it goes (`StdinOnce`), and that client
//! is the owner, attached from before the container starts until the session ends. When a
//! SIGKILLed owner's connection to the engine closes, the keeper reads end-of-file and exits,
//! and the container stops with every process in it (the engine's init is its pid 1); the
//! owner label still lets `gc` remove the stopped container and its volumes. The init and the
//! keeper run as a uid of their own ([`keeper_uid`]), every exec as the job user, and no
//! process of the container has a capability, so no guest can stop or kill them. A paused
//! session's keeper is frozen with the rest and cannot see its owner go: `stockade serve`
//! removes such a container through its lifeline process (`stockade docker lifeline`, which
//! the owner's exit wakes); for another owner it waits, frozen, for the next stockade that
//! connects to the engine, or `gc`.

use std::time::{Duration, Instant};

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, KillContainerOptionsBuilder, UploadToContainerOptionsBuilder,
};
use futures_util::StreamExt;
use stockade_protocol::{
    Access, BoundedSink, CaptureMode, Enforced, Flow, Job, JobKind, Limits, LiveIo, Mechanism, Report, Status, Stream,
};
use tokio::io::AsyncWriteExt;

use stockade_hostfs::files::{Entry, Kind, MAX_DEPTH, MAX_LIST};

use crate::{DockerTier, RunError, engine, spec};

/// What a session's container runs: `cat`, which reads the stdin its owner holds open and
/// exits (stopping the container) when the owner is gone.
pub const SESSION_KEEPER: [&str; 1] = ["cat"];

/// The uid (and gid) a session container's init and keeper run as: 65533, or 65532 when the
/// job user is 65533. Never the job user's, so no exec can signal them; never root.
#[must_use]
pub fn keeper_uid(job_uid: u32) -> u32 {
    if job_uid == 65533 { 65532 } else { 65533 }
}

/// How long an exec's pid is waited for after its start (a loaded engine can take a while).
const EXEC_START_WAIT: Duration = Duration::from_secs(5);

/// Where a docker session's home is, as in the process tier and E2B's images.
pub const SESSION_HOME: &str = "/home/user";

/// The size of a docker session's home volume by default: 512 MiB.
pub const HOME_BYTES: u64 = 512 << 20;

/// What a docker session is made with.
#[derive(Debug, Clone)]
pub struct DockerSessionConfig {
    /// The image (local; the engine is never asked to pull).
    pub image: String,
    /// Memory, processes, open files and CPU of the whole container.
    pub limits: Limits,
    /// The home volume's size, bytes.
    pub home_bytes: u64,
    /// How long the container may live: its expiry label, after which `gc` reaps it even
    /// if its owner is alive.
    pub lifetime: Duration,
    /// A workspace, staged into the container's own `/workspace` volume when the session
    /// starts (as a pool stages one, G7), locked for the session's life, and for a
    /// read-write grant applied back to the host directory when it ends.
    pub workspace: Option<stockade_protocol::Workspace>,
    /// The workspace volume's size, bytes.
    pub workspace_bytes: u64,
    /// A snapshot ([`DockerSession::snapshot`]) unpacked into the home before the first
    /// exec.
    pub restore: Option<Vec<u8>>,
    /// A run's grants directory (the runtime's broker, for the session's whole life),
    /// bound read-only at [`spec::GRANTS`], as a one-shot run's is: the only host path in the
    /// container.
    pub grants_dir: Option<std::path::PathBuf>,
}

impl DockerSessionConfig {
    /// A session of `image` with the default limits, a [`HOME_BYTES`] home and a one-day
    /// lifetime.
    pub fn new(image: impl Into<String>) -> Self {
        Self {
            image: image.into(),
            limits: Limits::default(),
            home_bytes: HOME_BYTES,
            lifetime: Duration::from_secs(24 * 60 * 60),
            workspace: None,
            workspace_bytes: crate::stage::DEFAULT_STAGE_BYTES,
            restore: None,
            grants_dir: None,
        }
    }
}

/// Puts a listener in a started session container's network namespace, given the host pid
/// of its init (`stockade_process::listen_in_netns`, by the runtime): `Err` is why not.
pub type Join = Box<dyn FnOnce(u32) -> Result<(), String> + Send>;

/// How [`DockerSession::exec_with`] runs an exec, beyond its job.
#[derive(Debug, Default)]
pub struct DockerExecOptions {
    /// A terminal of this size (rows, columns): the exec is created with a tty, its output
    /// comes as stdout, its stdin is typed into it, and [`DockerSession::resize`] sizes it.
    pub pty: Option<(u16, u16)>,
    /// An output budget keeps the first bytes for the report and the exec goes on (the live
    /// copies see every byte), rather than being killed: a background exec.
    pub drain: bool,
    /// Told the exec's engine id and its pid in the container once it runs.
    pub started: Option<tokio::sync::oneshot::Sender<DockerExecStarted>>,
}

/// A running exec of a docker session, as [`DockerExecOptions::started`] is told of it.
#[derive(Debug, Clone)]
pub struct DockerExecStarted {
    /// The engine's id for the exec ([`DockerSession::resize`] takes it).
    pub exec: String,
    /// Its pid in the container (0 where the host's `/proc` cannot map it: a remote
    /// engine), which [`DockerSession::signal`] takes.
    pub pid: u32,
}

/// A docker session's usage at one moment ([`DockerSession::usage`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DockerUsage {
    /// Memory in use (its cgroup's), bytes.
    pub memory_bytes: u64,
    /// The page cache within it, bytes.
    pub memory_cache: u64,
    /// Its memory limit, bytes.
    pub memory_limit: u64,
    /// CPU time of everything it has run, nanoseconds.
    pub cpu_ns: u64,
}

/// One process of a docker session, as the engine lists it (`docker top`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DockerProcess {
    /// Its pid in the container, where the host's `/proc` maps it (a local engine); else
    /// its pid on the host.
    pub pid: u32,
    /// Its pid on the host (the engine's view).
    pub host_pid: u32,
    /// Its command line.
    pub cmdline: String,
}

/// A live container that serves many execs ([`DockerTier::session`]). Dropping it removes
/// the container (from a task on the caller's runtime), as [`DockerSession::kill`] does.
#[derive(Debug)]
pub struct DockerSession {
    tier: DockerTier,
    id: Option<String>,
    enforced: Vec<Enforced>,
    // A read-write workspace (host directory, volume size) to apply back at the end, and
    // what that did.
    apply_back: std::sync::Mutex<Option<(std::path::PathBuf, u64)>>,
    applied: std::sync::Mutex<Option<Result<crate::stage::Applied, RunError>>>,
    _lock: Option<stockade_hostfs::WorkspaceLock>,
    _lifeline: std::sync::Mutex<Option<Lifeline>>,
}

/// The owner's attachment to the keeper's stdin: held, never written, for the session's life.
struct Lifeline {
    _input: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
    _output: std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>,
}

impl std::fmt::Debug for Lifeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Lifeline")
    }
}

impl DockerTier {
    /// Starts a session's container: the pool keeper's hardening, the config's limits, and a
    /// home volume at [`SESSION_HOME`], where execs start by default.
    pub async fn session(&self, config: DockerSessionConfig) -> Result<DockerSession, RunError> {
        self.session_joined(config, None).await
    }

    /// [`session`](Self::session), with `join` run once the container has started and before
    /// anything else runs in it, given the host pid of its init: it puts a listener (a model
    /// grant's, a network grant's proxy) in the container's own network namespace, which
    /// only loopback reaches. A `join` that fails removes the container
    /// ([`RunError::Unsupported`], with its reason). The engine's default runtime only.
    pub async fn session_joined(
        &self,
        config: DockerSessionConfig,
        join: Option<Join>,
    ) -> Result<DockerSession, RunError> {
        self.retry_pending().await;
        if let (Some(rt), Some(_)) = (self.oci_runtime(), &join) {
            return Err(RunError::Unsupported {
                mechanism: "a listener in the session's network namespace".into(),
                reason: format!("the {rt} runtime gives its guest a network stack of its own"),
            });
        }
        let keeper = Job::image(config.image.clone(), SESSION_KEEPER)?.with_limits(config.limits);
        // The workspace: locked for the session's life, packed before any container exists.
        let (lock, staged) = match &config.workspace {
            None => (None, None),
            Some(ws) => {
                let opened = stockade_hostfs::open_workspace(ws.path())?;
                let writable = ws.access() == Access::ReadWrite;
                let lock = opened.lock(writable, ws.busy(), || tokio::time::sleep(stockade_hostfs::LOCK_POLL)).await?;
                let (root, h, bytes, access) =
                    (ws.path().to_path_buf(), self.hardening.clone(), config.workspace_bytes, ws.access());
                let packed =
                    tokio::task::spawn_blocking(move || crate::stage::pack(&root, access, h.uid, h.gid, bytes))
                        .await
                        .map_err(|e| RunError::Internal(format!("packing the workspace: {e}")))??;
                (Some(lock), Some((ws.clone(), packed)))
            }
        };
        let id = crate::run_id();
        let expires = crate::unix_now() + config.lifetime.as_secs() + spec::ORPHAN_GRACE.as_secs();
        let mut spec = spec::spec(&keeper, &self.hardening, &id, expires)?;
        // The container's init and keeper run as a uid of their own, which no exec runs as:
        // with no capabilities, a guest cannot signal them (stop the keeper, and with it the
        // lifeline), and every exec names the job user itself.
        let keeper_uid = keeper_uid(self.hardening.uid);
        spec.body.user = Some(format!("{keeper_uid}:{keeper_uid}"));
        // The keeper's stdin is the owner's lifeline: open, closed by the engine once the
        // owner's attachment goes.
        spec.body.attach_stdin = Some(true);
        spec.body.open_stdin = Some(true);
        spec.body.stdin_once = Some(true);
        spec.body.attach_stdout = Some(false);
        spec.body.attach_stderr = Some(false);
        let mut mounts =
            vec![spec::staged_volume(SESSION_HOME, Access::ReadWrite, config.home_bytes, &self.hardening, &id)?];
        if let Some((ws, _)) = &staged {
            mounts.push(spec::staged_workspace_mount(ws.access(), config.workspace_bytes, &self.hardening, &id)?);
        }
        if let Some(host) = spec.body.host_config.as_mut() {
            host.mounts = Some(mounts);
            if let Some(dir) = &config.grants_dir {
                host.binds.get_or_insert_with(Vec::new).push(spec::grants_bind(dir, &keeper)?);
            }
        }
        spec.body.working_dir = Some(SESSION_HOME.into());
        let name = format!("stockade-session-{id}");
        let opts = CreateContainerOptionsBuilder::default().name(&name).build();
        let created = self.docker.create_container(Some(opts), spec.body).await.map_err(engine)?;
        let mut session = DockerSession {
            tier: self.clone(),
            id: Some(created.id.clone()),
            enforced: Vec::new(),
            apply_back: std::sync::Mutex::new(None),
            applied: std::sync::Mutex::new(None),
            _lock: lock,
            _lifeline: std::sync::Mutex::new(None),
        };
        // On an error from here, dropping the session removes the container. Attached before
        // it starts, so there is no moment when the keeper runs without its owner.
        let attach = bollard::query_parameters::AttachContainerOptionsBuilder::default()
            .stream(true)
            .logs(false)
            .stdin(true)
            .stdout(false)
            .stderr(false)
            .build();
        let attached = self.docker.attach_container(&created.id, Some(attach)).await.map_err(engine)?;
        session._lifeline = std::sync::Mutex::new(Some(Lifeline { _input: attached.input, _output: attached.output }));
        self.docker.start_container(&created.id, None).await.map_err(engine)?;
        if let Some(join) = join {
            self.join_netns(&created.id, join, "the session's container", "session").await?;
        }
        if let Some(tar) = config.restore {
            self.upload(&created.id, SESSION_HOME, tar.into()).await?;
        }
        // The container's own mechanisms; each exec adds its deadline and budgets.
        let mut enforced = crate::enforcement(&keeper, &self.hardening);
        enforced.retain(|e| !matches!(e.mechanism, Mechanism::Deadline | Mechanism::OutputBudget));
        let mut apply_back = None;
        if let Some((ws, packed)) = &staged {
            self.upload(&created.id, spec::WORKSPACE, packed.tar.clone()).await?;
            enforced.push(Enforced::new(
                Mechanism::ContainerWorkspace,
                format!(
                    "workspace staged {}: {} files, {} bytes into a {}-byte tmpfs volume, no host path mounted{}",
                    if ws.access() == Access::ReadWrite { "read-write" } else { "read-only (root-owned)" },
                    packed.files,
                    packed.bytes,
                    config.workspace_bytes,
                    if ws.access() == Access::ReadWrite { "; copied back when the session ends" } else { "" }
                ),
            ));
            if ws.access() == Access::ReadWrite {
                apply_back = Some((ws.path().to_path_buf(), config.workspace_bytes));
            }
        }
        enforced.push(Enforced::new(
            Mechanism::ContainerWorkspace,
            format!(
                "home {SESSION_HOME}: a {}-byte tmpfs volume of the container's own (nosuid, nodev), no host path mounted",
                config.home_bytes
            ),
        ));
        session.enforced = enforced;
        session.apply_back = std::sync::Mutex::new(apply_back);
        Ok(session)
    }
}

impl DockerSession {
    fn id(&self) -> Result<&str, RunError> {
        self.id.as_deref().ok_or_else(|| RunError::Ended("the session is gone".into()))
    }

    /// The container's id.
    #[must_use]
    pub fn container(&self) -> Option<&str> {
        self.id.as_deref()
    }

    /// Whether the container is still running.
    pub async fn alive(&self) -> bool {
        let Some(id) = &self.id else { return false };
        match self.tier.docker.inspect_container(id, None).await {
            Ok(c) => c.state.is_some_and(|s| s.running == Some(true)),
            Err(_) => false,
        }
    }

    /// Runs one exec: `job` (a command: program and arguments, run from the image's
    /// `PATH`), as the job user, in `cwd` (default [`SESSION_HOME`]), with the job's
    /// environment, stdin, deadline and output budgets, its stdout and stderr copied live to
    /// `io`. At the deadline or a budget's breach the exec's process group is killed and the
    /// session goes on (see the module docs for when the container is killed instead).
    pub async fn exec(&self, job: &Job, cwd: Option<&str>, io: LiveIo) -> Result<Report, RunError> {
        self.exec_with(job, cwd, io, DockerExecOptions::default()).await
    }

    /// [`exec`](Self::exec) with [`DockerExecOptions`]: a terminal, a drained output
    /// budget, and a channel told the exec's id and pid once it runs (a background exec).
    pub async fn exec_with(
        &self,
        job: &Job,
        cwd: Option<&str>,
        io: LiveIo,
        opts: DockerExecOptions,
    ) -> Result<Report, RunError> {
        io.check(job).map_err(|e| RunError::Misconfigured(e.into()))?;
        let id = self.id()?.to_owned();
        let cmd = exec_argv(job, cwd)?;
        let docker = &self.tier.docker;
        let limits = job.limits();
        let LiveIo { stdin: live_stdin, stdout: mut live_out, stderr: mut live_err, pace } = io;
        let stdin = job.stdin().to_vec();
        let has_stdin = live_stdin.is_some() || !stdin.is_empty();
        let config = CreateExecOptions {
            cmd: Some(cmd),
            user: Some(format!("{}:{}", self.tier.hardening.uid, self.tier.hardening.gid)),
            env: Some(job.env().iter().map(|v| format!("{}={}", v.key(), v.value())).collect()),
            attach_stdin: Some(has_stdin || opts.pty.is_some()),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            tty: Some(opts.pty.is_some()),
            privileged: Some(false),
            working_dir: Some(cwd.unwrap_or(SESSION_HOME).to_owned()),
            ..Default::default()
        };
        let exec = docker.create_exec(&id, config).await.map_err(engine)?;
        // The container's OOM kills so far, from the host (a local engine): an exec the
        // kernel's OOM killer ends is out of memory, not merely killed by signal 9.
        let oom_before = self.oom_kills().await;
        let start = Instant::now();
        let tty = opts.pty.is_some();
        let start_opts = StartExecOptions { detach: false, tty, output_capacity: None };
        let StartExecResults::Attached { mut output, mut input } =
            docker.start_exec(&exec.id, Some(start_opts)).await.map_err(engine)?
        else {
            return Err(engine("exec started detached"));
        };
        if let Some((rows, cols)) = opts.pty {
            let _ = self.resize(&exec.id, rows, cols).await;
        }
        if let Some(tx) = opts.started {
            let pid = self.exec_pid(&exec.id).await.unwrap_or(0);
            let _ = tx.send(DockerExecStarted { exec: exec.id.clone(), pid });
        }
        let writer = tokio::spawn(async move {
            let _ = input.write_all(&stdin).await;
            if let Some(mut src) = live_stdin {
                let _ = tokio::io::copy(&mut src, &mut input).await;
            }
            // A terminal's input has no end of file until the exec ends.
            if !tty {
                let _ = input.shutdown().await;
            }
        });
        let cap = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        let mode = if opts.drain { CaptureMode::Drain } else { CaptureMode::FailFast };
        let mut out = BoundedSink::new(cap(limits.stdout_bytes()), mode);
        let mut err = BoundedSink::new(cap(limits.stderr_bytes()), mode);
        let mut breach = None;
        let read = async {
            while let Some(frame) = output.next().await {
                let Ok(frame) = frame else { break };
                let (sink, stream, live, bytes) = match frame {
                    LogOutput::StdOut { message } | LogOutput::Console { message } => {
                        (&mut out, Stream::Stdout, &mut live_out, message)
                    }
                    LogOutput::StdErr { message } => (&mut err, Stream::Stderr, &mut live_err, message),
                    LogOutput::StdIn { .. } => continue,
                };
                if let Some(w) = live.as_mut()
                    && w.write_all(&bytes).and_then(|()| w.flush()).is_err()
                {
                    *live = None;
                }
                if sink.push(&bytes) == Flow::OverBudget {
                    breach = Some(stream);
                    return;
                }
                // A slow consumer of the copies stops the reading: the engine's stream,
                // then the container's pipe, fill, and the guest waits on its write.
                if let (Some(p), true) = (pace.as_deref(), live.is_some()) {
                    p.ready().await;
                }
            }
        };
        let timed_out = tokio::time::timeout(limits.wall(), read).await.is_err();
        // An open, unread attach stream blocks the engine's kill and inspect: drop it first.
        drop(output);
        writer.abort();
        let mut detail = None;
        if timed_out || breach.is_some() {
            detail = Some(self.kill_exec(&id, &exec.id).await);
        }
        let code = self.tier.exec_exit_code(&exec.id, 200).await?;
        let wall = start.elapsed();
        let oom = code == Some(128 + 9)
            && !timed_out
            && breach.is_none()
            && matches!((oom_before, self.oom_kills().await), (Some(b), Some(a)) if a > b);
        let status = match (timed_out, breach, code) {
            (true, _, _) => Status::TimedOut,
            (_, Some(stream), _) => Status::OutputLimit { stream },
            _ if oom => Status::OutOfMemory,
            (_, _, Some(c)) if (129..=192).contains(&c) => {
                Status::Signaled { signal: i32::try_from(c - 128).unwrap_or(0) }
            }
            (_, _, Some(c)) => Status::Exited { code: i32::try_from(c).unwrap_or(-1) },
            (_, _, None) => {
                return Err(engine(format!(
                    "the engine gave no exit code for exec {} in container {id} after its output ended",
                    exec.id
                )));
            }
        };
        let report = Report::new(status, wall).with_output(out.finish(), err.finish());
        Ok(self.enforced_on(report, limits, detail, opts.drain))
    }

    /// `report` with what the session enforced, and this exec's deadline and budgets.
    fn enforced_on(&self, mut report: Report, limits: &Limits, detail: Option<String>, drain: bool) -> Report {
        report.enforcement = self.enforced.clone();
        report.enforcement.push(Enforced::new(
            Mechanism::Deadline,
            format!(
                "{:?} wall clock; {}",
                limits.wall(),
                detail.unwrap_or_else(|| "the exec's process group is killed at it, the session goes on".into())
            ),
        ));
        report.enforcement.push(Enforced::new(
            Mechanism::OutputBudget,
            format!(
                "stdout {} bytes, stderr {} bytes; {}",
                limits.stdout_bytes(),
                limits.stderr_bytes(),
                if drain {
                    "the first bytes are kept, the rest is read and not kept (the live copy sees it)"
                } else {
                    "the exec is killed at the first byte over"
                }
            ),
        ));
        report
    }

    /// The OOM kills the container's memory cgroup has counted, read from the host through
    /// its init's pid; `None` where this host cannot see it (a remote engine).
    async fn oom_kills(&self) -> Option<u64> {
        let pid = self.init_pid().await?;
        stockade_sys::cgroup::memory_oom_kills(&pid.to_string())
    }

    /// The pid, in this host's `/proc`, of the container's init while it runs (the engine's
    /// `State.Pid`): its namespaces are the session's. `None` for a container that is not
    /// running, and for a pid this host's `/proc` does not show in the container's cgroup (a
    /// remote engine's pid, or one reused since), so no caller can mistake another process
    /// for the container.
    pub async fn init_pid(&self) -> Option<u32> {
        let id = self.id.as_deref()?;
        let state = self.tier.docker.inspect_container(id, None).await.ok()?.state?;
        let pid = u32::try_from(state.pid.filter(|p| *p > 0)?).ok()?;
        stockade_sys::cgroup::names(&pid.to_string(), id).then_some(pid)
    }

    /// What the container uses now, as the engine counts it (one `stats` sample, not
    /// streamed): memory in use and its page cache (`cache` on cgroup v1, `file` on v2), the
    /// memory limit, and the CPU time of everything it has run. `None` if the engine gives
    /// no sample (a container that has ended). Bounded only by the engine client's own
    /// timeout: a caller that samples often puts its own deadline on it.
    pub async fn usage(&self) -> Option<DockerUsage> {
        let options = bollard::query_parameters::StatsOptions { stream: false, one_shot: true };
        let mut stats = self.tier.docker.stats(self.id.as_deref()?, Some(options));
        let sample = stats.next().await?.ok()?;
        let memory = sample.memory_stats?;
        let raw = memory.stats.unwrap_or_default();
        Some(DockerUsage {
            memory_bytes: memory.usage.unwrap_or(0),
            memory_cache: raw.get("cache").or_else(|| raw.get("file")).copied().unwrap_or(0),
            memory_limit: memory.limit.unwrap_or(0),
            cpu_ns: sample.cpu_stats.and_then(|c| c.cpu_usage?.total_usage).unwrap_or(0),
        })
    }

    /// An exec's pid in the container: the engine's host pid for it, mapped through the
    /// host's `/proc` (`NSpid`), waited for until the engine has started it; `None` for an
    /// engine whose processes this host cannot see, an exec that ended before it was seen
    /// running, or one not started within [`EXEC_START_WAIT`].
    async fn exec_pid(&self, exec: &str) -> Option<u32> {
        let deadline = Instant::now() + EXEC_START_WAIT;
        while Instant::now() < deadline {
            let i = self.tier.docker.inspect_exec(exec).await.ok()?;
            if let Some(p) = i.pid.filter(|p| *p > 0) {
                return stockade_sys::proc::ns_pid(u32::try_from(p).ok()?);
            }
            // Right after `start_exec` the engine can still show the exec not running and
            // with no pid: not started yet, which is not ended (an ended one has its exit code).
            if i.exit_code.is_some() {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        None
    }

    /// Sends `signal` (1-64) to a running exec's process group and itself, by its pid in the
    /// container ([`DockerExecStarted::pid`]), from a `kill` exec as the job user.
    pub async fn signal(&self, pid: u32, signal: i32) -> Result<(), RunError> {
        if pid == 0 || !(1..=64).contains(&signal) {
            return Err(RunError::Misconfigured(format!("cannot signal pid {pid} with {signal}")));
        }
        let docker = &self.tier.docker;
        let config = CreateExecOptions {
            cmd: Some(vec!["kill".into(), format!("-{signal}"), format!("-{pid}"), pid.to_string()]),
            user: Some(format!("{}:{}", self.tier.hardening.uid, self.tier.hardening.gid)),
            attach_stdout: Some(false),
            attach_stderr: Some(false),
            ..Default::default()
        };
        let k = docker.create_exec(self.id()?, config).await.map_err(engine)?;
        docker
            .start_exec(&k.id, Some(StartExecOptions { detach: true, ..Default::default() }))
            .await
            .map_err(engine)?;
        Ok(())
    }

    /// Sets the terminal size (rows, columns) of an exec started with one.
    pub async fn resize(&self, exec: &str, rows: u16, cols: u16) -> Result<(), RunError> {
        let size = bollard::query_parameters::ResizeExecOptionsBuilder::default()
            .h(i32::from(rows))
            .w(i32::from(cols))
            .build();
        self.tier.docker.resize_exec(exec, size).await.map_err(engine)
    }

    /// Kills an exec (Docker has no call for it): its process group, then itself, by its
    /// pid in the container, from a `kill` exec as the job user. Where that cannot be done,
    /// the container. Returns what was done, for the report.
    async fn kill_exec(&self, container: &str, exec: &str) -> String {
        let docker = &self.tier.docker;
        if let Some(pid) = self.exec_pid(exec).await
            && self.signal(pid, 9).await.is_ok()
        {
            for _ in 0..100 {
                if docker.inspect_exec(exec).await.is_ok_and(|i| i.running == Some(false)) {
                    return "the exec's process group is killed at it (a `kill` exec), the session goes on".into();
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        let kill = KillContainerOptionsBuilder::default().signal("SIGKILL").build();
        let _ = docker.kill_container(container, Some(kill)).await;
        "the exec could not be killed alone (a remote engine, or no `kill` in the image): the container was killed, and the session with it".into()
    }

    /// Pauses every process of the session (`docker pause`: the cgroup freezer).
    pub async fn pause(&self) -> Result<(), RunError> {
        self.tier.docker.pause_container(self.id()?).await.map_err(engine)
    }

    /// Resumes a paused session (`docker unpause`).
    pub async fn resume(&self) -> Result<(), RunError> {
        self.tier.docker.unpause_container(self.id()?).await.map_err(engine)
    }

    /// The session's processes, as the engine lists them (`docker top`), the container's init and
    /// keeper aside, each with its pid in the container where the host's `/proc` maps it.
    pub async fn processes(&self) -> Result<Vec<DockerProcess>, RunError> {
        let top = self.tier.docker.top_processes(self.id()?, None::<bollard::query_parameters::TopOptions>).await;
        let top = top.map_err(engine)?;
        let titles = top.titles.unwrap_or_default();
        let col = |name: &str| titles.iter().position(|t| t == name);
        let (Some(pid), Some(cmd)) = (col("PID"), col("CMD").or_else(|| col("COMMAND"))) else {
            return Ok(Vec::new());
        };
        let uid = col("UID");
        let keeper = keeper_uid(self.tier.hardening.uid).to_string();
        // `docker top` runs the engine host's `ps`, which names a uid that host's passwd names.
        let keeper_name = std::fs::read_to_string("/etc/passwd").ok().and_then(|passwd| {
            passwd.lines().find_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                (f.get(2) == Some(&keeper.as_str())).then(|| f[0].to_owned())
            })
        });
        let is_keeper = |u: &String| *u == keeper || keeper_name.as_ref() == Some(u);
        Ok(top
            .processes
            .unwrap_or_default()
            .into_iter()
            // The container's own init and the keeper it runs are not the session's: they are
            // the processes of the keeper's uid, which no exec runs as (so a guest's own `cat`
            // is listed). Without a UID column, by their command lines.
            .filter(|row| match uid.map(|u| row.get(u)) {
                Some(u) => !u.is_some_and(is_keeper),
                None => {
                    row.get(cmd).is_some_and(|c| *c != SESSION_KEEPER.join(" ") && !c.starts_with("/sbin/docker-init"))
                }
            })
            .filter_map(|row| {
                let host_pid: u32 = row.get(pid)?.parse().ok()?;
                let cmdline = row.get(cmd)?.clone();
                let pid = stockade_sys::proc::ns_pid(host_pid).unwrap_or(host_pid);
                Some(DockerProcess { pid, host_pid, cmdline })
            })
            .collect())
    }

    /// Reads the regular file at `path` (absolute, in the container) through the engine's
    /// archive API, at most `limit` bytes.
    pub async fn read(&self, path: &str, limit: u64) -> Result<Vec<u8>, RunError> {
        check_path(path)?;
        // The file's bytes, plus its header, padding and the archive's end.
        let archive = self.tier.download(self.id()?, path, limit + 10_240).await?;
        stockade_hostfs::stage::unpack_file(&archive, limit).map_err(|e| {
            RunError::Misconfigured(format!(
                "{path}: {}",
                e.to_string().replace("the container's workspace archive: ", "")
            ))
        })
    }

    /// Writes `content` to the file at `path` (absolute), owned by the job user, through the
    /// engine's archive API; a missing parent directory is made first, as the job user
    /// ([`mkdir`](Self::mkdir)).
    pub async fn write(&self, path: &str, content: &[u8]) -> Result<(), RunError> {
        check_path(path)?;
        let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
        let dir = if dir.is_empty() { "/" } else { dir };
        let tar = stockade_hostfs::stage::pack_file(name, content, self.tier.hardening.uid, self.tier.hardening.gid)
            .map_err(|e| RunError::Misconfigured(format!("{path}: {e}")))?;
        let id = self.id()?;
        let upload = || {
            let opts = UploadToContainerOptionsBuilder::default().path(dir).no_overwrite_dir_non_dir("true").build();
            self.tier.docker.upload_to_container(id, Some(opts), bollard::body_full(tar.clone().into()))
        };
        let missing_dir = |e: &bollard::errors::Error| {
            matches!(e, bollard::errors::Error::DockerResponseServerError { status_code: 404, .. })
        };
        let mut done = upload().await;
        if done.as_ref().is_err_and(missing_dir) {
            self.mkdir(dir).await?;
            done = upload().await;
        }
        done.map_err(|e| match e {
            bollard::errors::Error::DockerResponseServerError { status_code: 404, .. } => {
                RunError::Misconfigured(format!("{dir}: no such directory in the session"))
            }
            bollard::errors::Error::DockerResponseServerError { status_code: 403 | 400, message } => {
                RunError::Misconfigured(format!("{path}: {message}"))
            }
            e => engine(e),
        })
    }

    /// The entry at `path` (absolute), a final symlink not followed.
    pub async fn stat(&self, path: &str) -> Result<Entry, RunError> {
        check_path(path)?;
        let out = self.files_op(&["stat", path]).await?;
        parse_entries(&out).into_iter().next().ok_or_else(|| RunError::Internal(format!("{path}: stat said nothing")))
    }

    /// The entries under the directory `path`, down to `depth` levels (1: its own entries),
    /// at most [`MAX_LIST`], sorted by path; symlinks are listed, never followed. A name
    /// holding a newline is left out.
    pub async fn list(&self, path: &str, depth: usize) -> Result<Vec<Entry>, RunError> {
        check_path(path)?;
        let depth = depth.clamp(1, MAX_DEPTH).to_string();
        let mut out = parse_entries(&self.files_op(&["list", path, &depth]).await?);
        out.sort_by(|a, b| a.path.cmp(&b.path));
        out.truncate(MAX_LIST);
        Ok(out)
    }

    /// Makes the directory `path` and its parents; `false` if it was there already.
    pub async fn mkdir(&self, path: &str) -> Result<bool, RunError> {
        check_path(path)?;
        match self.files_op(&["mkdir", path]).await {
            Ok(_) => Ok(true),
            Err(RunError::Misconfigured(why)) if why.ends_with(": exists") => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Removes the file, link or directory (with what is in it) at `path`.
    pub async fn remove(&self, path: &str) -> Result<(), RunError> {
        check_path(path)?;
        self.files_op(&["remove", path]).await.map(drop)
    }

    /// Renames `from` to `to`, making `to`'s parent directories.
    pub async fn rename(&self, from: &str, to: &str) -> Result<(), RunError> {
        check_path(from)?;
        check_path(to)?;
        self.files_op(&["rename", from, to]).await.map(drop)
    }

    /// Runs [`FILES_SCRIPT`] with `args` inside the container as the job user: its stdout,
    /// or its one-line complaint (`PATH: no such file or directory`) as the error.
    async fn files_op(&self, args: &[&str]) -> Result<Vec<u8>, RunError> {
        let bad = |e: &dyn std::fmt::Display| RunError::Misconfigured(e.to_string());
        let argv = ["-c", FILES_SCRIPT, "sh"].iter().chain(args).map(|a| (*a).to_owned());
        let limits = Limits::default()
            .with_wall(FILES_OP_WALL)
            .and_then(|l| l.with_stdout(FILES_OP_OUTPUT))
            .map_err(|e| bad(&e))?;
        let job = Job::command("sh", argv)
            .and_then(|j| j.with_env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"))
            .map_err(|e| bad(&e))?
            .with_limits(limits);
        let r = self.exec(&job, Some("/"), LiveIo::default()).await?;
        let complaint = || String::from_utf8_lossy(&r.stderr.bytes).lines().last().unwrap_or_default().to_owned();
        match r.status {
            Status::Exited { code: 0 } => Ok(r.stdout.bytes),
            Status::Exited { code: 2 | 3 } => Err(RunError::Misconfigured(complaint())),
            Status::Exited { code: 127 } => Err(RunError::Unsupported {
                mechanism: "the files API in this image".into(),
                reason: format!("the image lacks a tool it runs ({})", complaint()),
            }),
            Status::Exited { .. } => Err(RunError::Misconfigured(format!("{}: {}", args[1], complaint()))),
            other => Err(RunError::Internal(format!("the files call ended {other:?}"))),
        }
    }

    /// A filesystem-only snapshot: the home's files (a tar, at most `limit` bytes of
    /// archive), with the session paused meanwhile so that it is one moment's (a paused
    /// session stays paused). [`DockerSessionConfig::restore`] starts a session with it.
    pub async fn snapshot(&self, limit: u64, was_paused: bool) -> Result<Vec<u8>, RunError> {
        let id = self.id()?;
        if !was_paused {
            self.pause().await?;
        }
        let archive = self.tier.download(id, &format!("{SESSION_HOME}/."), limit).await;
        if !was_paused {
            self.resume().await?;
        }
        archive
    }

    /// Stops the session without removing it: a read-write workspace is applied back to its
    /// host directory first (with the container frozen: a tmpfs volume is gone once the
    /// container stops), then every process is killed, so execs in flight end (their output
    /// streams close). What the copy back did is kept for [`kill`](Self::kill).
    pub async fn stop(&self) {
        let Some(id) = self.id.as_deref() else { return };
        let taken = self.apply_back.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if let Some((host, bytes)) = taken {
            let _ = self.tier.docker.pause_container(id).await;
            let applied = self.tier.download_workspace(id, &host, bytes).await;
            *self.applied.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(applied);
        }
        let _ = self.tier.docker.unpause_container(id).await;
        let kill = KillContainerOptionsBuilder::default().signal("SIGKILL").build();
        let _ = self.tier.docker.kill_container(id, Some(kill)).await;
    }

    /// Ends the session ([`stop`](Self::stop) if it was not stopped), then removes the
    /// container and its volumes; returns what the copy back of a read-write workspace did.
    pub async fn kill(mut self) -> Option<Result<crate::stage::Applied, RunError>> {
        self.stop().await;
        let id = self.id.take()?;
        self.tier.remove(&id).await;
        self.applied.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take()
    }
}

/// The files API's calls besides whole-file reads and writes, run inside a session's
/// container as the job user by the image's own `sh`, `stat`, `find`, `mkdir`, `rm` and `mv`
/// (busybox's or GNU's): the container is the wall, and the guest's own permissions apply,
/// as they do to E2B's envd. Paths arrive as arguments, never in the script's text. An
/// entry is one line, `MODE SIZE MTIME PATH` (the raw mode in hex); exit 2 or 3 with one
/// line on stderr is the call's refusal.
const FILES_SCRIPT: &str = r#"set -u
gone() { echo "$1: no such file or directory" >&2; exit 2; }
there() { [ -e "$1" ] || [ -L "$1" ]; }
case $1 in
stat) there "$2" || gone "$2"; exec stat -c '%f %s %Y %n' "$2" ;;
list) there "$2" || gone "$2"
  [ -d "$2" ] || { echo "$2: not a directory" >&2; exit 2; }
  exec find "$2" -mindepth 1 -maxdepth "$3" -exec stat -c '%f %s %Y %n' {} + ;;
mkdir) [ -d "$2" ] && { echo "$2: exists" >&2; exit 3; }
  there "$2" && { echo "$2: a file is there" >&2; exit 2; }
  exec mkdir -p "$2" ;;
remove) there "$2" || gone "$2"; exec rm -rf "$2" ;;
rename) there "$2" || gone "$2"
  [ -d "$3" ] && [ ! -L "$3" ] && { echo "$3: a directory is there" >&2; exit 2; }
  mkdir -p "$(dirname "$3")" && exec mv -f "$2" "$3" ;;
esac
echo "$1: no such files call" >&2; exit 2
"#;

/// A files call's deadline.
const FILES_OP_WALL: Duration = Duration::from_secs(30);

/// A files call's largest answer: [`MAX_LIST`] entries of up to 4 KiB paths.
const FILES_OP_OUTPUT: u64 = 48 << 20;

/// The entries [`FILES_SCRIPT`] printed (a line that is not one, such as a name's second
/// line, is skipped).
fn parse_entries(out: &[u8]) -> Vec<Entry> {
    String::from_utf8_lossy(out)
        .lines()
        .filter_map(|line| {
            let mut f = line.splitn(4, ' ');
            let mode = u32::from_str_radix(f.next()?, 16).ok()?;
            let size = f.next()?.parse().ok()?;
            let modified = f.next()?.parse().ok()?;
            let path = f.next().filter(|p| p.starts_with('/'))?.to_owned();
            let kind = match mode & 0o170_000 {
                0o100_000 => Kind::File,
                0o040_000 => Kind::Dir,
                0o120_000 => Kind::Symlink,
                _ => Kind::Other,
            };
            Some(Entry { path, kind, size, mode: mode & 0o7777, modified, metadata: Default::default(), link: None })
        })
        .collect()
}

/// An absolute path with no `..` and no NUL.
fn check_path(path: &str) -> Result<(), RunError> {
    if !path.starts_with('/') || path.split('/').any(|c| c == "..") || path.contains('\0') {
        return Err(RunError::Misconfigured(format!("{path:?}: not an absolute path without `..`")));
    }
    Ok(())
}

impl Drop for DockerSession {
    fn drop(&mut self) {
        if let Some(id) = self.id.take()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            let tier = self.tier.clone();
            rt.spawn(async move {
                tier.remove(&id).await;
            });
        }
    }
}

/// An exec's command line, once the job is one a docker session can run: a command job with
/// no workspace (a session has none; its files API copies in) and an absolute `cwd`.
fn exec_argv(job: &Job, cwd: Option<&str>) -> Result<Vec<String>, RunError> {
    let JobKind::Command { program, args } = job.kind() else {
        return Err(RunError::Misconfigured("a docker session runs command jobs (program and arguments)".into()));
    };
    if job.workspace().is_some() {
        return Err(RunError::Misconfigured(
            "a docker session has no workspace; copy files in through its files API".into(),
        ));
    }
    if let Some(cwd) = cwd
        && !cwd.starts_with('/')
    {
        return Err(RunError::Misconfigured(format!("the working directory {cwd:?} is not absolute")));
    }
    let mut cmd = vec![program.clone()];
    cmd.extend(args.iter().cloned());
    Ok(cmd)
}
