//! A warm pool: containers created and started ahead of time, so that a run is one exec.
//!
//! Every pool container has the same hardening as a one-shot run, with the pool's limits
//! (memory, pids, nofile, cpu are fixed when a container is created), and runs only an idle
//! keeper (`sleep`) under docker-init. A run execs the job's command as the job user.
//! Docker cannot kill an exec, so the deadline and the output budget kill the whole
//! container; and unless the pool is a persistent session, a container serves one run and
//! is then removed and replaced in the background, so no state (files in `/tmp`, background
//! processes) passes from one run to the next. Containers older than the pool's maximum age
//! are replaced instead of used, and one that sat idle is inspected first and replaced if it
//! stopped running.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bollard::exec::{StartExecOptions, StartExecResults};
use bollard::models::ExecConfig;
use bollard::query_parameters::CreateContainerOptionsBuilder;
use stockade_protocol::{Access, Enforced, Job, JobKind, Limits, Mechanism, Report, Status};
use tokio::sync::Mutex;

use crate::spec::{self, ORPHAN_GRACE};
use crate::stage;
use crate::{DockerTier, RunError, enforcement, engine, run_id, unix_now};

/// How long a pool container may live (and the expiry label the reaper reads).
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(15 * 60);

/// A pool's shape.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Containers kept started and idle.
    pub size: usize,
    /// The image.
    pub image: String,
    /// Limits every pool container is created with (the job's own wall-clock deadline and
    /// output budgets apply per run).
    pub limits: Limits,
    /// A container older than this is replaced instead of used.
    pub max_age: Duration,
    /// Keep using the same container across runs (state persists: one caller's session).
    /// Off by default: each container serves one run.
    ///
    /// A persistent pool is single-tenant: what one run leaves (files, background
    /// processes, which outlive that run's deadline by design) sees every later run,
    /// including its staged workspace. So it serves one workspace only (or none): the first
    /// run fixes which, and a run granting another is refused ([`spec::SpecError::Pool`]).
    /// Keep one persistent pool per caller.
    pub persistent: bool,
    /// A container idle for longer than this is inspected before use, and replaced if it is
    /// no longer running (killed, out of memory, or gone). Default 2 s.
    pub health_check_after: Duration,
    /// Whether runs take a staged workspace, and how it is granted: every container then
    /// has a `/workspace` tmpfs volume of [`PoolConfig::workspace_bytes`] (see
    /// [`crate::stage`]); a job's workspace must be granted with this access. `None` (the
    /// default): runs take no workspace.
    pub workspace: Option<Access>,
    /// Size of each container's workspace volume, and the most a job's workspace may hold.
    pub workspace_bytes: u64,
}

impl PoolConfig {
    /// `size` containers of `image` with default limits, one run each.
    #[must_use]
    pub fn new(size: usize, image: impl Into<String>) -> Self {
        Self {
            size,
            image: image.into(),
            limits: Limits::new(),
            max_age: DEFAULT_MAX_AGE,
            persistent: false,
            health_check_after: Duration::from_secs(2),
            workspace: None,
            workspace_bytes: stage::DEFAULT_STAGE_BYTES,
        }
    }

    /// Runs take a workspace granted with `access`, staged into each container (see
    /// [`PoolConfig::workspace`]).
    #[must_use]
    pub fn with_workspace(mut self, access: Access) -> Self {
        self.workspace = Some(access);
        self
    }
}

#[derive(Debug)]
struct Warm {
    id: String,
    born: Instant,
    idle_since: Instant,
}

/// A pool of started containers.
#[derive(Debug, Clone)]
pub struct DockerPool {
    tier: DockerTier,
    config: Arc<PoolConfig>,
    idle: Arc<Mutex<VecDeque<Warm>>>,
    closed: Arc<AtomicBool>,
    /// For a persistent pool: the workspace (host path, or none) its first run granted,
    /// the only one it serves since.
    tenant: Arc<std::sync::Mutex<Option<Option<std::path::PathBuf>>>>,
}

impl DockerPool {
    /// Removes the idle containers and stops replacing used ones. Containers of runs in
    /// flight are removed when those runs end; anything missed is reaped by label.
    pub async fn shutdown(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let idle: Vec<Warm> = self.idle.lock().await.drain(..).collect();
        for w in idle {
            self.tier.remove(&w.id).await;
        }
    }

    /// Creates and starts `config.size` containers.
    pub async fn new(tier: DockerTier, config: PoolConfig) -> Result<Self, RunError> {
        let pool = Self {
            tier,
            config: Arc::new(config),
            idle: Arc::new(Mutex::new(VecDeque::new())),
            closed: Arc::new(AtomicBool::new(false)),
            tenant: Arc::new(std::sync::Mutex::new(None)),
        };
        for _ in 0..pool.config.size {
            let warm = pool.start_one().await?;
            pool.idle.lock().await.push_back(warm);
        }
        Ok(pool)
    }

    /// Creates and starts one idle container.
    async fn start_one(&self) -> Result<Warm, RunError> {
        self.tier.retry_pending().await;
        let keeper = Job::image(self.config.image.clone(), spec::KEEPER)?.with_limits(self.config.limits);
        let id = run_id();
        let expires = unix_now() + self.config.max_age.as_secs() + ORPHAN_GRACE.as_secs();
        let mut spec = spec::spec(&keeper, &self.tier.hardening, &id, expires)?;
        // The keeper never reads stdin and nothing attaches to it.
        spec.body.attach_stdin = Some(false);
        spec.body.open_stdin = Some(false);
        spec.body.stdin_once = Some(false);
        spec.body.attach_stdout = Some(false);
        spec.body.attach_stderr = Some(false);
        if let Some(access) = self.config.workspace {
            let mount = spec::staged_workspace_mount(access, self.config.workspace_bytes, &self.tier.hardening, &id)?;
            if let Some(host) = spec.body.host_config.as_mut() {
                host.mounts = Some(vec![mount]);
            }
            spec.body.working_dir = Some(spec::WORKSPACE.into());
        }
        let name = format!("stockade-pool-{id}");
        let opts = CreateContainerOptionsBuilder::default().name(&name).build();
        let created = self.tier.docker.create_container(Some(opts), spec.body).await.map_err(engine)?;
        if let Err(e) = self.tier.docker.start_container(&created.id, None).await {
            self.tier.remove(&created.id).await;
            return Err(engine(e));
        }
        let now = Instant::now();
        Ok(Warm { id: created.id, born: now, idle_since: now })
    }

    /// Takes a fresh enough idle container, or starts one.
    async fn take(&self) -> Result<Warm, RunError> {
        loop {
            let next = self.idle.lock().await.pop_front();
            match next {
                Some(w) if w.born.elapsed() >= self.config.max_age => self.retire(w.id),
                Some(w) if w.idle_since.elapsed() >= self.config.health_check_after && !self.healthy(&w.id).await => {
                    self.retire(w.id);
                }
                Some(w) => return Ok(w),
                None => return self.start_one().await,
            }
        }
    }

    /// Whether an idle container is still running and was not killed for memory.
    async fn healthy(&self, id: &str) -> bool {
        match self.tier.docker.inspect_container(id, None).await {
            Ok(c) => c.state.is_some_and(|s| s.running == Some(true) && s.oom_killed != Some(true)),
            Err(_) => false,
        }
    }

    /// Removes a container and starts a replacement, in the background.
    fn retire(&self, id: String) {
        let pool = self.clone();
        tokio::spawn(async move {
            pool.tier.remove(&id).await;
            if pool.closed.load(Ordering::SeqCst) {
                return;
            }
            if let Ok(w) = pool.start_one().await {
                let mut idle = pool.idle.lock().await;
                if idle.len() < pool.config.size && !pool.closed.load(Ordering::SeqCst) {
                    idle.push_back(w);
                } else {
                    drop(idle);
                    pool.tier.remove(&w.id).await;
                }
            }
        });
    }

    /// Runs an image job in a warm container. The job's image must be the pool's, and its
    /// workspace (if any) must be granted as [`PoolConfig::workspace`] says: it is packed
    /// before a container is taken (an oversize or unstageable workspace is an error and
    /// costs no container), uploaded into the container's workspace volume, and, for a
    /// read-write grant and a run that ended by itself, the volume's contents are applied
    /// back to the host directory (see [`crate::stage`]). A run killed at its deadline or
    /// budget returns no files.
    pub async fn run(&self, job: &Job) -> Result<Report, RunError> {
        let job = &*spec::resolve_workspace(job)?;
        // Held from the pack to the apply-back.
        let _lock = crate::lock_workspace(job).await?;
        let JobKind::Image { image, command } = job.kind() else {
            return Err(RunError::from(spec::SpecError::NotAnImageJob));
        };
        if *image != self.config.image {
            return Err(RunError::from(spec::SpecError::Pool(format!(
                "the pool runs {:?}, the job asks for {image:?}",
                self.config.image
            ))));
        }
        if command.is_empty() {
            return Err(RunError::from(spec::SpecError::EmptyCommand));
        }
        if self.config.persistent {
            let this = job.workspace().map(|ws| ws.path().to_path_buf());
            let mut tenant = self.tenant.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            match &*tenant {
                None => *tenant = Some(this),
                Some(first) if *first == this => {}
                Some(first) => {
                    let name = |w: &Option<std::path::PathBuf>| {
                        w.as_ref().map_or("no workspace".to_owned(), |p| p.display().to_string())
                    };
                    return Err(RunError::from(spec::SpecError::Pool(format!(
                        "this persistent pool serves {} (its first run's); its containers keep earlier runs' files and processes, which would see {}: use a pool of its own",
                        name(first),
                        name(&this)
                    ))));
                }
            }
        }
        let staged = match (job.workspace(), self.config.workspace) {
            (None, _) => None,
            (Some(ws), Some(access)) if ws.access() == access => {
                let (root, h, bytes) =
                    (ws.path().to_path_buf(), self.tier.hardening.clone(), self.config.workspace_bytes);
                let packed = tokio::task::spawn_blocking(move || stage::pack(&root, access, h.uid, h.gid, bytes))
                    .await
                    .map_err(|e| RunError::Internal(format!("packing the workspace: {e}")))??;
                Some((ws.path().to_path_buf(), access, packed))
            }
            (Some(ws), configured) => {
                return Err(RunError::from(spec::SpecError::Pool(format!(
                    "the job grants its workspace {:?}, the pool stages workspaces {configured:?}",
                    ws.access()
                ))));
            }
        };
        let warm = self.take().await?;
        let mut detail = None;
        let result = match &staged {
            Some((_, _, packed)) => match self.tier.upload(&warm.id, spec::WORKSPACE, packed.tar.clone()).await {
                Ok(()) => self.exec(&warm.id, job, command).await,
                Err(e) => Err(e),
            },
            None => self.exec(&warm.id, job, command).await,
        };
        let finished = matches!(&result, Ok(r) if matches!(r.status, Status::Exited { .. }));
        if let (Some((host, access, packed)), true) = (&staged, result.is_ok()) {
            let back = match (access, finished) {
                (Access::ReadWrite, true) => {
                    Some(self.tier.download_workspace(&warm.id, host, self.config.workspace_bytes).await)
                }
                _ => None,
            };
            detail = Some(stage_detail(*access, packed, self.config.workspace_bytes, back));
        }
        if self.config.persistent && finished {
            self.idle.lock().await.push_back(Warm { idle_since: Instant::now(), ..warm });
        } else {
            self.retire(warm.id);
        }
        let mut report = result?;
        report.enforcement = enforcement(job, &self.tier.hardening);
        if let Some(d) = detail {
            report.enforcement.push(Enforced::new(Mechanism::ContainerWorkspace, d));
        }
        Ok(report)
    }

    async fn exec(&self, id: &str, job: &Job, command: &[String]) -> Result<Report, RunError> {
        let docker = &self.tier.docker;
        let limits = job.limits();
        let stdin = job.stdin().to_vec();
        let config = ExecConfig {
            cmd: Some(command.to_vec()),
            user: Some(format!("{}:{}", self.tier.hardening.uid, self.tier.hardening.gid)),
            env: Some(job.env().iter().map(|v| format!("{}={}", v.key(), v.value())).collect()),
            attach_stdin: Some(!stdin.is_empty()),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            tty: Some(false),
            privileged: Some(false),
            working_dir: Some(if self.config.workspace.is_some() { spec::WORKSPACE.into() } else { "/".into() }),
            ..Default::default()
        };
        let exec = docker.create_exec(id, config).await.map_err(engine)?;
        let start = Instant::now();
        let started_unix = crate::unix_now();
        let opts = StartExecOptions { detach: false, tty: false, output_capacity: None };
        let StartExecResults::Attached { output, input } =
            docker.start_exec(&exec.id, Some(opts)).await.map_err(engine)?
        else {
            return Err(engine("exec started detached"));
        };
        // A breach or the deadline kills the container, which the pool then replaces.
        let (sink, timed_out) = self.tier.drive(id, input, output, stdin, limits, start).await;
        // The exit code is the engine's to tell. An engine that cannot (it crashed or was
        // restarted mid-run, so the output ended with the connection) makes the run an error,
        // never a report with a made-up code.
        let Some(code) = self.tier.exec_exit_code(&exec.id, 50).await? else {
            return Err(engine(format!(
                "the engine gave no exit code for exec {} in container {id} after its output ended",
                exec.id
            )));
        };
        let wall = start.elapsed();
        let state = docker.inspect_container(id, None).await.ok().and_then(|c| c.state);
        let mut oom = state.as_ref().and_then(|s| s.oom_killed).unwrap_or(false);
        // The kernel's OOM killer picks the exec's process, not the container's init, so the
        // container's own state does not say it (it is still running). Asked only for an
        // exec ended by SIGKILL that the deadline or a budget did not send: the container's
        // memory cgroup counts its OOM kills, read from the host when the engine is local
        // (its init's pid is then ours to look up); otherwise the engine's `oom` event.
        // A container reaches a run only if no earlier run of it was killed for memory (a
        // persistent session keeps a container only after a run that exited by itself).
        if !oom && !timed_out && sink.breach.is_none() && code == 128 + 9 {
            let pid = state.as_ref().and_then(|s| s.pid).filter(|p| *p > 0);
            oom = match pid.and_then(|p| stockade_sys::cgroup::memory_oom_kills(&p.to_string())) {
                Some(kills) => kills > 0,
                None => self.tier.oom_event_since(id, started_unix).await,
            };
        }
        Ok(sink.report(timed_out, oom, code, wall))
    }
}

/// The report line for a staged workspace.
fn stage_detail(
    access: Access,
    packed: &stage::Packed,
    bytes: u64,
    back: Option<Result<stage::Applied, RunError>>,
) -> String {
    let grant = match access {
        Access::ReadOnly => "read-only (root-owned)",
        Access::ReadWrite => "read-write",
    };
    let mut d = format!(
        "workspace staged {grant}: {} files, {} bytes into a {bytes}-byte tmpfs volume, no host path mounted",
        packed.files, packed.bytes
    );
    match back {
        None if access == Access::ReadWrite => d.push_str("; results not copied back (the run did not end by itself)"),
        None => {}
        Some(Ok(a)) => {
            d.push_str(&format!(
                "; copied back: {} files written, {} unchanged, {} directories created, {} entries skipped",
                a.written, a.unchanged, a.dirs, a.skipped
            ));
            if !a.skipped_names.is_empty() {
                d.push_str(&format!(" ({})", a.skipped_names.join(", ")));
            }
        }
        Some(Err(e)) => d.push_str(&format!("; results not copied back: {e}")),
    }
    d
}
