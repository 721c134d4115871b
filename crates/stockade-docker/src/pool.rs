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
use stockade_protocol::{Job, JobKind, Limits, Report, Status};
use tokio::sync::Mutex;

use crate::spec::{self, ORPHAN_GRACE};
use crate::{DockerError, DockerTier, enforcement, engine, run_id, unix_now};

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
    pub persistent: bool,
    /// A container idle for longer than this is inspected before use, and replaced if it is
    /// no longer running (killed, out of memory, or gone). Default 2 s.
    pub health_check_after: Duration,
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
        }
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
    pub async fn new(tier: DockerTier, config: PoolConfig) -> Result<Self, DockerError> {
        let pool = Self {
            tier,
            config: Arc::new(config),
            idle: Arc::new(Mutex::new(VecDeque::new())),
            closed: Arc::new(AtomicBool::new(false)),
        };
        for _ in 0..pool.config.size {
            let warm = pool.start_one().await?;
            pool.idle.lock().await.push_back(warm);
        }
        Ok(pool)
    }

    /// Creates and starts one idle container.
    async fn start_one(&self) -> Result<Warm, DockerError> {
        let keeper = Job::image(self.config.image.clone(), ["sleep", "2147483647"])
            .map_err(|e| DockerError::Engine(e.to_string()))?
            .with_limits(self.config.limits);
        let id = run_id();
        let expires = unix_now() + self.config.max_age.as_secs() + ORPHAN_GRACE.as_secs();
        let mut spec = spec::spec(&keeper, &self.tier.hardening, &id, expires)?;
        // The keeper never reads stdin and nothing attaches to it.
        spec.body.attach_stdin = Some(false);
        spec.body.open_stdin = Some(false);
        spec.body.stdin_once = Some(false);
        spec.body.attach_stdout = Some(false);
        spec.body.attach_stderr = Some(false);
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
    async fn take(&self) -> Result<Warm, DockerError> {
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

    /// Runs an image job in a warm container. The job's image must be the pool's; the job
    /// may not grant a workspace (pool containers are created before the job is known).
    pub async fn run(&self, job: &Job) -> Result<Report, DockerError> {
        let JobKind::Image { image, command } = job.kind() else {
            return Err(DockerError::Spec(spec::SpecError::NotAnImageJob));
        };
        if *image != self.config.image || job.workspace().is_some() {
            return Err(DockerError::Engine("a pool runs only its own image, without a workspace".into()));
        }
        if command.is_empty() {
            return Err(DockerError::Spec(spec::SpecError::EmptyCommand));
        }
        let warm = self.take().await?;
        let result = self.exec(&warm.id, job, command).await;
        let killed = matches!(&result, Ok(r) if !matches!(r.status, Status::Exited { .. }));
        if self.config.persistent && !killed {
            self.idle.lock().await.push_back(Warm { idle_since: Instant::now(), ..warm });
        } else {
            self.retire(warm.id);
        }
        let mut report = result?;
        report.enforcement = enforcement(job);
        Ok(report)
    }

    async fn exec(&self, id: &str, job: &Job, command: &[String]) -> Result<Report, DockerError> {
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
            working_dir: Some("/".into()),
            ..Default::default()
        };
        let exec = docker.create_exec(id, config).await.map_err(engine)?;
        let start = Instant::now();
        let opts = StartExecOptions { detach: false, tty: false, output_capacity: None };
        let StartExecResults::Attached { output, input } =
            docker.start_exec(&exec.id, Some(opts)).await.map_err(engine)?
        else {
            return Err(DockerError::Engine("exec started detached".into()));
        };
        // A breach or the deadline kills the container, which the pool then replaces.
        let (sink, timed_out) = self.tier.drive(id, input, output, stdin, limits, start).await;
        let mut code = None;
        for _ in 0..50 {
            match docker.inspect_exec(&exec.id).await {
                Ok(i) if i.running == Some(false) => {
                    code = i.exit_code;
                    break;
                }
                Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                Err(_) => break,
            }
        }
        let wall = start.elapsed();
        let oom = docker
            .inspect_container(id, None)
            .await
            .ok()
            .and_then(|c| c.state)
            .and_then(|s| s.oom_killed)
            .unwrap_or(false);
        Ok(sink.report(timed_out, oom, code.unwrap_or(-1), wall))
    }
}
