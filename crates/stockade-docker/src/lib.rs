//! The docker tier: runs a job as a hardened, throwaway container through bollard.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use stockade_docker::DockerTier;
//! use stockade_protocol::Job;
//!
//! let tier = DockerTier::connect().await?;
//! let job = Job::image("stockade-busybox:local", ["echo", "hi"])?;
//! let report = tier.run(&job).await?;
//! assert_eq!(report.stdout.bytes, b"hi\n");
//! # Ok(()) }
//! ```
//!
//! # Position in the stack
//! Depends on: `stockade-protocol`, `stockade-hostfs`, `stockade-sys`; `bollard` (this crate is its only owner).
//! Used by: `stockade-runtime` (feature `docker`), and through it `stockade-cli`.
//! API boundary: yes; [`DockerTier`], [`RunError`], [`spec`], [`pool`], [`session`], [`stage`].
//!
//! # Threat model
//! Trusted: the host program, the Docker engine and its runtime (runc, or runsc), the
//! kernel, and the image the caller names (it is code the caller chose, run confined).
//! Attacker-controlled: everything the container's processes do and write.
//! Out of scope: kernel vulnerabilities (containers share the host kernel; use the
//! `runsc` runtime for a user-space kernel), a compromised engine, and anyone who can
//! reach the engine's socket (that is root on the host).
//!
//! # Guarantees
//! G1. A job is validated before any call to the engine: the image reference, container
//!     name, a non-root uid and gid, workspace directories (absolute, dedicated, not
//!     nested, and, for a one-shot run's bind on an engine whose container uids are the
//!     host's, usable by the container's user: readable, and writable for a read-write
//!     grant, as far as the mode bits decide whatever ACL there is) and every limit's
//!     range; a bad job is a typed [`spec::SpecError`] that says what to change.
//!     (pinned by: src/spec_tests.rs::g1_*, tests/it/docker.rs::g1_*)
//! G2. Every container gets, by default: networking disabled (`NetworkDisabled` and network
//!     mode `none`), a read-only root, every capability dropped and no-new-privileges, a
//!     non-root user, memory equal to memory plus swap, cpus, a pids limit, `nofile`, `core`
//!     and `cpu` (the job's CPU time per process) ulimits, a `/tmp` tmpfs with noexec, nosuid, nodev and a size, log driver
//!     `none`, an init process, never privileged, an `oom_score_adj` of 1000 (a host short of
//!     memory loses the container's processes first), and labels for reaping. The engine is
//!     never asked to pull. [`DockerTier::runtime`] selects another OCI runtime, such as
//!     `runsc` (gVisor), only if the engine has it registered, and fails closed otherwise;
//!     under gVisor the pids limit also leaves room for the sandbox kernel's host threads.
//!     (pinned by: src/spec_tests.rs::g2_*, tests/it/docker.rs::g2_*)
//! G3. A run is create, attach, start, bounded fail-fast capture, SIGKILL at the deadline
//!     or on an output breach (after dropping the attach stream), wait for not-running,
//!     inspect (out of memory, exit code; for a SIGKILL that neither the deadline nor a
//!     budget sent, also the engine's `oom` event, which can reach the engine after the
//!     exit, so `OOMKilled` alone missed 4 of 196 memory bombs in the soak) and a forced
//!     removal with retries, on every path
//!     out, so no container outlives its run; a run whose future is dropped mid-run (a
//!     caller's timeout, a cancellation) force-removes its container at once, from a task
//!     on the caller's runtime; a removal the engine cannot take (it went away) is retried
//!     before the tier's next run, pool container and gc.
//!     (pinned by: tests/it/docker.rs::g3_*, tests/it/faults.rs::g5_*)
//! G4. Containers left behind are reaped by label when the tier connects and by
//!     [`DockerTier::gc`]: at once if their owner label names a process of this boot and
//!     pid namespace that is gone (a SIGKILLed or crashed supervisor, one-shot runs and
//!     pool containers alike), otherwise once past their expiry label; a live
//!     supervisor's containers are never touched.
//!     (pinned by: src/spec_tests.rs::g4_*, tests/it/docker.rs::g4_*, tests/it/faults.rs::g4_*)
//! G5. A missing or unreachable engine is [`RunError::Unsupported`], never a weaker run;
//!     an engine that goes away mid-run (its socket cut, the engine crashed, or it was
//!     restarted) ends the run, one-shot or pooled, with [`RunError::Engine`] within
//!     seconds, never a report (a pool run whose exit code the engine cannot give is an
//!     error, not a made-up code), and later runs fail the same way until it is back; then
//!     the next runs work and the containers the outage left are removed.
//!     (pinned by: tests/it/docker.rs::g5_*, tests/it/faults.rs::g5_*)
//! G6. A warm pool ([`pool::DockerPool`]) runs each job as an exec in a started container
//!     with the same hardening; the deadline and the output budget kill the container
//!     (Docker cannot kill an exec), and unless the pool is a persistent session each
//!     container serves one run and is then replaced, so nothing passes between runs;
//!     containers past their maximum age, or found dead by the idle health check, are
//!     replaced instead of used; a run whose process the kernel's OOM killer ended is
//!     [`Status::OutOfMemory`], as in a one-shot run (the container outlives its exec's
//!     process, so its memory cgroup's OOM-kill count says it, or the engine's `oom` event
//!     where the engine is remote; not its state).
//!     (pinned by: tests/it/docker.rs::g6_*)
//! G7. A pool configured with [`pool::PoolConfig::with_workspace`] stages the job's
//!     workspace instead of mounting it ([`stage`]): the host directory is packed without
//!     following symlinks and within a size and entry cap (or refused before a container is
//!     used), uploaded into the container's own tmpfs volume (size- and inode-capped,
//!     nosuid, nodev, removed with the container), read-only grants as root-owned files in a
//!     root-owned directory; for a read-write grant and a run that ended by itself, the
//!     volume comes back through a bounded download and only regular files and directories
//!     with plain names are written to the host directory, never through a host symlink and
//!     never under a protected path (git hooks and config, rc files, ...; never `.git` as a
//!     file). The archive side is `stockade-hostfs`'s G5, pinned there without a daemon.
//!     (pinned by: tests/it/docker.rs::g7_*)
//! G8. A workspace must be a dedicated directory, judged with symlinks resolved by the
//!     protocol's rule every tier shares. A one-shot run's read-write workspace (a bind
//!     mount) keeps each protected path that exists in it (git hooks and config, rc files,
//!     editor and agent settings, ...; `stockade-hostfs`) read-only, bound onto itself, and
//!     `.git` pinned (bound writable onto itself), so they can be neither changed, removed
//!     nor renamed while the history stays writable; a protected path reached through a
//!     symlink refuses the grant; what the guest creates where a protected path was absent
//!     is removed once the container is gone; the report lists all three.
//!     (pinned by: tests/it/docker.rs::g8_*)
//! G9. [`DockerTier::run_granted_in_netns`] starts the guest in the network namespace of a
//!     holder container ([`netns`]: networking disabled, the guest's hardening, a 129-byte
//!     static `pause` binary imported locally), after the caller's `join` saw the holder's
//!     pid; a failing `join` starts no guest, and both containers are removed with the run;
//!     under another OCI runtime (gVisor) it is refused before any container exists
//!     (walked end to end with a model grant and busybox wget in stockade-cli's grants tests).
//!     (pinned by: src/netns.rs::g9_*, tests/it/docker.rs::g9_*)
//! G10. A session ([`DockerTier::session`], [`session::DockerSession`]) is one container
//!     with G2's hardening that serves many execs, its home ([`session::SESSION_HOME`]) a
//!     size-capped tmpfs volume of its own, no host path mounted. Each exec is a `docker
//!     exec` as the job user with its own argv, environment, working directory and stdin,
//!     its output captured fail-fast and copied live; files and processes persist between
//!     execs. At an exec's deadline or a budget's breach, that exec's process group is
//!     killed from inside the container (by its pid there, mapped through the host's
//!     `/proc`) and the session goes on; where that cannot be done (a remote engine, no
//!     `kill` in the image) the container is killed and the report says so. Whole files move
//!     through the engine's archive API (an absolute path without `..`; the root stays
//!     read-only; a write makes its parents); stat, list (links listed, never followed),
//!     mkdir, remove and rename run inside the container as the job user, by the image's own
//!     `sh`, `stat`, `find`, `mkdir`, `rm` and `mv` with every path an argument, so the
//!     guest's own permissions bound them; pause and resume are `docker pause`; a background exec
//!     ([`session::DockerExecOptions`]) reports its pid in the container, takes a signal to
//!     its process group the same way, and may have a terminal the engine resizes; a
//!     workspace is staged as in G7 and, read-write, copied back when the session ends; a
//!     grants directory is bound read-only at `/broker` and [`DockerTier::session_joined`]'s
//!     `join` puts a listener in the started container's own network namespace before it
//!     returns (refused under another runtime); a
//!     snapshot is the engine's archive of the home, which a new session starts from; a
//!     kill removes the container and its volumes; the container stops with its owner (its
//!     keeper reads a stdin only the owner's attachment holds open, `StdinOnce`), and a
//!     killed owner's stopped session containers are reaped as in G4 (the owner's death
//!     walked end to end, SIGKILLed, in stockade-cli's session tests).
//!     (pinned by: tests/it/docker.rs::g10_*)
//!
//! # Non-guarantees
//! - Under runc the container shares the host kernel; seccomp is [`spec::SECCOMP_PROFILE`],
//!   the process tier's policy (io_uring, clone3 and openat2 ENOSYS, namespace creation,
//!   set-id modes and the rest EPERM; unknown calls EPERM, as in Docker's default, where the
//!   process tier says ENOSYS), not the engine's default, which allows io_uring; `ioctl` is
//!   not narrowed (a container has no terminal). runsc applies an OCI profile only when
//!   configured with `--oci-seccomp`; its own sentry is the boundary there. Under runsc,
//!   guest processes are
//!   bounded by the memory limit, not by the pids limit (which counts gVisor's host threads).
//! - userns-remap is an engine setting: [`DockerTier::userns_remap`] and `stockade doctor`
//!   report it, and [`DockerTier::require_userns_remap`] refuses an engine without it; by
//!   default the tier does not require it (this machine's engine does not remap).
//! - A pool's containers get the pool's limits (memory, pids, nofile, cpu) and workspace
//!   grant, fixed when they are created; per run only the deadline, the output budgets and
//!   the workspace's contents come from the job.
//! - A one-shot run's workspace is a bind mount (Docker's bind syntax has no nosuid or nodev;
//!   no-new-privileges, the empty capability sets and the engine's device cgroup cover them);
//!   a protected path that is absent can be created there during the run (it is removed
//!   after, as in the process tier; see `stockade-hostfs` for the window). A staged
//!   read-write workspace merges results into the host directory: files the guest deleted
//!   stay on the host, and a run killed at its deadline or budget returns nothing.
//!
//! # Failure behaviour
//! A misbehaving guest is an `Ok(Report)`; an image that does not exist is a
//! `FailedToStart` report. Engine failures are [`RunError`].
//!
//! # Unsafe
//! None: `#![forbid(unsafe_code)]`.
//!
//! # Ambient authority
//! Connects to the engine through `DOCKER_HOST` or the default socket; creates, starts,
//! kills, inspects and removes containers it labels (with their anonymous workspace
//! volumes); lists containers by its labels; reads a staged workspace's host directory and,
//! for a read-write grant, writes results into it.
//!
//! # Feature flags
//! None.
//!
//! # Invariants
//! Stated as absences: no `privileged`, no pull, no `AutoRemove`, no network mode other than
//! `none`, no container without the run label.

#![forbid(unsafe_code)]

pub mod netns;
pub mod pool;
pub mod session;
pub mod spec;
#[cfg(test)]
mod spec_tests;
/// Staged workspaces: packing a host directory and applying the container's copy back
/// (`stockade-hostfs` owns the walks, through cap-std).
pub use stockade_hostfs::stage;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::query_parameters::{
    AttachContainerOptionsBuilder, CreateContainerOptionsBuilder, EventsOptionsBuilder, KillContainerOptionsBuilder,
    ListContainersOptionsBuilder, RemoveContainerOptionsBuilder, WaitContainerOptionsBuilder,
};
use futures_util::StreamExt;
use spec::{Hardening, LABEL_EXPIRES, LABEL_RUN, ORPHAN_GRACE, SpecError};
use stockade_protocol::{Access, BoundedSink, CaptureMode, Enforced, Flow, Job, Mechanism, Report, Status, Stream};
use tokio::io::AsyncWriteExt;

/// What a loaded engine answers, now and then, to the start of a fresh network holder that
/// it did (or half did) start: a holder runs no guest code, so it is replaced.
const HOLDER_START_RACES: [&str; 2] = ["cannot start a stopped process", "cannot start an already running container"];

/// The engine could not run a job: the one error every tier returns. A misbehaving guest is
/// never an error. An engine that is missing or lacks a mechanism is
/// [`RunError::Unsupported`]; one that fails mid-run is [`RunError::Engine`], whose message
/// starts with `docker engine:`.
pub use stockade_protocol::RunError;

/// Takes the lock of `job`'s workspace ([`stockade_hostfs::OpenedWorkspace::lock`]), shared
/// with the other tiers: held until the run's sweep or apply-back is done, it keeps a
/// read-write run of a directory above this one from swapping a directory on its path while
/// the engine binds it by name.
pub(crate) async fn lock_workspace(job: &Job) -> Result<Option<stockade_hostfs::WorkspaceLock>, RunError> {
    let Some(ws) = job.workspace() else { return Ok(None) };
    let opened = stockade_hostfs::open_workspace(ws.path())?;
    let writable = ws.access() == Access::ReadWrite;
    Ok(Some(opened.lock(writable, ws.busy(), || tokio::time::sleep(stockade_hostfs::LOCK_POLL)).await?))
}

pub(crate) fn engine(e: impl std::fmt::Display) -> RunError {
    RunError::Engine(format!("docker engine: {e}"))
}

/// The docker tier: a connection to the engine and the hardening every container gets.
#[derive(Debug, Clone)]
pub struct DockerTier {
    docker: Docker,
    hardening: Hardening,
    /// Containers whose removal failed (the engine was unreachable): retried before every
    /// run, pool container and gc, so a run cut off from its engine leaves nothing once the
    /// engine is back.
    pending: Arc<Mutex<Vec<String>>>,
    /// Whether the engine maps container uids to other host uids (`userns-remap`, or a
    /// rootless engine), so that a container's uid is not the host's.
    remapped: bool,
}

/// Remembers a container whose removal failed.
fn remember(pending: &Mutex<Vec<String>>, id: String) {
    let mut p = pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if !p.contains(&id) {
        p.push(id);
    }
}

static RUNS: AtomicU64 = AtomicU64::new(0);

/// Force-removes a container when a run's future is dropped before the run removed it.
struct RemoveOnDrop {
    docker: Option<Docker>,
    pending: Arc<Mutex<Vec<String>>>,
    id: String,
}

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let (Some(docker), Ok(rt)) = (self.docker.take(), tokio::runtime::Handle::try_current()) else { return };
        let id = std::mem::take(&mut self.id);
        let pending = self.pending.clone();
        rt.spawn(async move {
            let opts = RemoveContainerOptionsBuilder::default().force(true).v(true).build();
            match docker.remove_container(&id, Some(opts)).await {
                Ok(()) | Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => {}
                Err(_) => remember(&pending, id),
            }
        });
    }
}

pub(crate) fn run_id() -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{:x}-{:x}-{:x}", nanos & 0xffff_ffff_ffff, std::process::id(), RUNS.fetch_add(1, Ordering::Relaxed))
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl DockerTier {
    /// Connects through `DOCKER_HOST` or the default socket, negotiates the API version,
    /// and reaps expired stockade containers.
    pub async fn connect() -> Result<Self, RunError> {
        let host = std::env::var("DOCKER_HOST").unwrap_or_else(|_| "unix:///var/run/docker.sock".into());
        Self::connect_to(&host).await
    }

    /// Connects to the engine at `host` (`unix:///path/to/docker.sock`), negotiates the API
    /// version, and reaps expired stockade containers.
    pub async fn connect_to(host: &str) -> Result<Self, RunError> {
        let unsupported = |e: bollard::errors::Error| RunError::Unsupported {
            mechanism: "docker engine".into(),
            reason: format!("{host}: {e}"),
        };
        let Some(path) = host.strip_prefix("unix://") else {
            return Err(RunError::Unsupported {
                mechanism: "docker engine".into(),
                reason: format!("{host}: only unix:// engine addresses are supported"),
            });
        };
        let docker = Docker::connect_with_unix(path, 30, bollard::API_DEFAULT_VERSION).map_err(unsupported)?;
        let docker = tokio::time::timeout(Duration::from_secs(10), docker.negotiate_version())
            .await
            .map_err(|_| RunError::Unsupported {
                mechanism: "docker engine".into(),
                reason: "no answer in 10 s".into(),
            })?
            .map_err(unsupported)?;
        docker.ping().await.map_err(unsupported)?;
        let info = docker.info().await.map_err(unsupported)?;
        let remapped = info
            .security_options
            .unwrap_or_default()
            .iter()
            .any(|o| o.contains("name=userns") || o.contains("name=rootless"));
        let tier = Self { docker, hardening: Hardening::default(), pending: Arc::default(), remapped };
        tier.gc(false).await?;
        Ok(tier)
    }

    /// Runs every container under the OCI runtime `runtime` (e.g. `runsc`, gVisor: a
    /// user-space kernel between the guest and the host's). The engine must have it
    /// registered; if not, this fails closed with [`RunError::Unsupported`] naming the
    /// runtime and the ones the engine has, rather than running under the default.
    pub async fn runtime(mut self, runtime: &str) -> Result<Self, RunError> {
        spec::check_name(runtime)?;
        let info = self.docker.info().await.map_err(engine)?;
        let known: Vec<String> = info.runtimes.map(|r| r.into_keys().collect()).unwrap_or_default();
        if !known.iter().any(|k| k == runtime) {
            return Err(RunError::Unsupported {
                mechanism: format!("OCI runtime {runtime}"),
                reason: format!("the engine has no runtime named {runtime} (it has: {})", known.join(", ")),
            });
        }
        self.hardening.runtime = Some(runtime.to_owned());
        Ok(self)
    }

    /// The OCI runtime the containers use, if not the engine's default (`runsc`: gVisor).
    #[must_use]
    pub fn oci_runtime(&self) -> Option<&str> {
        self.hardening.runtime.as_deref()
    }

    /// Whether the engine remaps container root to an unprivileged host range
    /// (`userns-remap`, an engine setting): defense in depth if a container escapes to root.
    pub async fn userns_remap(&self) -> Result<bool, RunError> {
        let info = self.docker.info().await.map_err(engine)?;
        Ok(info.security_options.unwrap_or_default().iter().any(|o| o.contains("name=userns")))
    }

    /// Requires the engine to run with `userns-remap` (container uids mapped to an
    /// unprivileged host range), failing closed with [`RunError::Unsupported`] otherwise.
    /// The remap is the engine's setting (`dockerd --userns-remap`); the tier cannot turn it on.
    pub async fn require_userns_remap(self) -> Result<Self, RunError> {
        if self.userns_remap().await? {
            Ok(self)
        } else {
            Err(RunError::Unsupported {
                mechanism: "userns-remap".into(),
                reason: "the engine does not remap container users (start dockerd with --userns-remap)".into(),
            })
        }
    }

    /// Whether the engine has `image` locally (the tier never pulls).
    pub async fn has_image(&self, image: &str) -> bool {
        self.docker.inspect_image(image).await.is_ok()
    }

    /// Removes stockade's containers: those past their expiry label, those whose owner
    /// label names a process of this boot and pid namespace that is gone (a supervisor
    /// that was killed), or with `all`, every one. A container is stockade's only if it
    /// carries the run label and is named after it ([`spec::named_by_stockade`]): a label
    /// alone is copied from images, so an unrelated container started from one is never
    /// touched. Returns how many were removed.
    pub async fn gc(&self, all: bool) -> Result<usize, RunError> {
        self.retry_pending().await;
        let filters = HashMap::from([("label", vec![LABEL_RUN])]);
        let opts = ListContainersOptionsBuilder::default().all(true).filters(&filters).build();
        let list = self.docker.list_containers(Some(opts)).await.map_err(engine)?;
        let now = unix_now();
        let mut removed = 0;
        for c in list {
            let run = c.labels.as_ref().and_then(|l| l.get(LABEL_RUN)).map_or("", String::as_str);
            if !spec::named_by_stockade(c.names.as_deref().unwrap_or_default(), run) {
                continue;
            }
            let expires = c.labels.as_ref().and_then(|l| l.get(LABEL_EXPIRES)).and_then(|v| v.parse::<u64>().ok());
            let orphaned =
                c.labels.as_ref().and_then(|l| l.get(spec::LABEL_OWNER)).is_some_and(|o| spec::owner_gone(o));
            if (all || orphaned || expires.is_none_or(|t| t < now))
                && let Some(id) = c.id
                && self.remove(&id).await
            {
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Force-removes a container (and its anonymous volumes), retrying; true once it is gone.
    /// One that cannot be removed (the engine is unreachable) is remembered and retried.
    async fn remove(&self, id: &str) -> bool {
        for attempt in 0..5u32 {
            if self.remove_once(id).await {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
        }
        remember(&self.pending, id.to_owned());
        false
    }

    async fn remove_once(&self, id: &str) -> bool {
        let opts = RemoveContainerOptionsBuilder::default().force(true).v(true).build();
        matches!(
            self.docker.remove_container(id, Some(opts)).await,
            Ok(()) | Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. })
        )
    }

    /// Retries the removals that failed, once each; those that fail again stay remembered.
    pub(crate) async fn retry_pending(&self) {
        let ids = std::mem::take(&mut *self.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        for id in ids {
            if !self.remove_once(&id).await {
                remember(&self.pending, id);
            }
        }
    }

    /// Runs an image job. A misbehaving guest is an `Ok` report.
    pub async fn run(&self, job: &Job) -> Result<Report, RunError> {
        self.run_with(job, None, None).await
    }

    /// Hands `join` the host pid of the started container `id` (`who`, for messages) to put
    /// a listener in its network namespace (the `whose` run's or session's), then checks the
    /// container still runs under that pid. A `join` that fails is
    /// [`RunError::Unsupported`], with its reason.
    pub(crate) async fn join_netns(
        &self,
        id: &str,
        join: impl FnOnce(u32) -> Result<(), String>,
        who: &str,
        whose: &str,
    ) -> Result<(), RunError> {
        let state = self.docker.inspect_container(id, None).await.map_err(engine)?.state;
        let pid = state.and_then(|s| s.pid).and_then(|p| u32::try_from(p).ok()).filter(|p| *p > 0);
        let pid = pid.ok_or_else(|| engine(format!("{who} has no pid")))?;
        join(pid).map_err(|reason| RunError::Unsupported {
            mechanism: format!("a listener in the {whose}'s network namespace"),
            reason,
        })?;
        // `join` pinned `pid` and found it alive after opening its namespace; the container
        // still running under that pid now means the pid was the container's all along (a pid
        // is reused only once its process is gone), so the listener is in its namespace and
        // no other process's.
        let again = self.docker.inspect_container(id, None).await.map_err(engine)?.state;
        if again.as_ref().is_some_and(|s| s.running == Some(true) && s.pid == Some(i64::from(pid))) {
            Ok(())
        } else {
            Err(engine(format!("{who} left pid {pid} while the listener was placed")))
        }
    }

    /// Runs an image job with the host directory `grants_dir` bound read-only at
    /// [`spec::GRANTS`] (`/broker`): a broker's socket, its client and the job's data grants
    /// (`stockade-runtime` serves them). Connecting to a unix socket needs no write access
    /// to the mount. The directory must be absolute and separate from the workspace.
    pub async fn run_granted(&self, job: &Job, grants_dir: &std::path::Path) -> Result<Report, RunError> {
        self.run_with(job, Some(grants_dir), None).await
    }

    /// Like [`DockerTier::run_granted`], with the guest in a network namespace the host can
    /// reach first (see [`netns`]): a holder container starts, `join` gets its host pid (to
    /// put a listener in its namespace), then the guest container shares that namespace, and
    /// both are removed when the run ends. A `join` that fails ends the run before the guest
    /// starts ([`RunError::Unsupported`], with its reason). The engine's default runtime
    /// only: gVisor's guest has a network stack of its own and would not see that loopback.
    pub async fn run_granted_in_netns(
        &self,
        job: &Job,
        grants_dir: &std::path::Path,
        join: impl FnOnce(u32) -> Result<(), String> + Send,
    ) -> Result<Report, RunError> {
        if let Some(rt) = self.oci_runtime() {
            return Err(RunError::Unsupported {
                mechanism: "a listener in the run's network namespace".into(),
                reason: format!("the {rt} runtime gives its guest a network stack of its own"),
            });
        }
        self.holder_image().await?;
        let id = run_id();
        let expires = unix_now() + job.limits().wall().as_secs() + ORPHAN_GRACE.as_secs();
        let body = netns::holder_body(&id, expires, self.hardening.uid, self.hardening.gid);
        let name = format!("stockade-{id}-netns");
        // The engine, loaded, sometimes fails to start a fresh holder ("cannot start a stopped
        // process", seen twice in CI over thousands of runs; "cannot start an already running
        // container", seen in two CI runs of 2026-12-06 and 2026-12-07): the holder runs no
        // guest code, so it is removed (forced) and a new one made, twice at most, before the
        // run fails with the engine's error.
        let mut attempt = 0;
        let (holder, started) = loop {
            let holder = self
                .docker
                .create_container(Some(CreateContainerOptionsBuilder::default().name(&name).build()), body.clone())
                .await
                .map_err(engine)?
                .id;
            match self.docker.start_container(&holder, None).await {
                Err(e) if attempt < 2 && HOLDER_START_RACES.iter().any(|m| e.to_string().contains(m)) => {
                    attempt += 1;
                    if !self.remove(&holder).await {
                        return Err(engine(format!("container {holder} could not be removed")));
                    }
                }
                started => break (holder, started.map_err(engine)),
            }
        };
        let joined = async {
            started?;
            self.join_netns(&holder, join, "the network holder", "run").await
        };
        let result = match joined.await {
            Ok(()) => self.run_with(job, Some(grants_dir), Some(&holder)).await,
            Err(e) => Err(e),
        };
        let removed = self.remove(&holder).await;
        let report = result?;
        if !removed {
            return Err(engine(format!("container {holder} could not be removed")));
        }
        Ok(report)
    }

    /// Builds [`netns::HOLDER_IMAGE`] from its embedded root filesystem unless the engine
    /// has it.
    async fn holder_image(&self) -> Result<(), RunError> {
        if self.docker.inspect_image(netns::HOLDER_IMAGE).await.is_ok() {
            return Ok(());
        }
        let tar = netns::holder_tar().map_err(|e| engine(format!("building the holder image: {e}")))?;
        let (repo, tag) = netns::HOLDER_IMAGE.split_once(':').unwrap_or((netns::HOLDER_IMAGE, "latest"));
        let opts =
            bollard::query_parameters::CreateImageOptionsBuilder::default().from_src("-").repo(repo).tag(tag).build();
        let mut progress = self.docker.create_image(Some(opts), Some(bollard::body_full(tar.into())), None);
        while let Some(step) = progress.next().await {
            step.map_err(engine)?;
        }
        Ok(())
    }

    async fn run_with(
        &self,
        job: &Job,
        grants_dir: Option<&std::path::Path>,
        netns_of: Option<&str>,
    ) -> Result<Report, RunError> {
        let job = &*spec::resolve_workspace(job)?;
        // Held until the sweep below is done (dropped last).
        let _lock = lock_workspace(job).await?;
        self.retry_pending().await;
        let id = run_id();
        let limits = job.limits();
        let expires = unix_now() + limits.wall().as_secs() + ORPHAN_GRACE.as_secs();
        let mut spec = spec::spec(job, &self.hardening, &id, expires)?;
        if let (Some(holder), Some(hc)) = (netns_of, spec.body.host_config.as_mut()) {
            // The holder's namespace: only `lo`, and the host's listener on it.
            hc.network_mode = Some(format!("container:{holder}"));
            spec.body.network_disabled = None;
        }
        if let (Some(dir), Some(hc)) = (grants_dir, spec.body.host_config.as_mut()) {
            hc.binds.get_or_insert_with(Vec::new).push(spec::grants_bind(dir, job)?);
        }
        // The container's user must be able to use the bound directory (where its uid is the
        // host's): otherwise say so now, not as "Permission denied" inside.
        if let (Some(ws), false) = (job.workspace(), self.remapped) {
            use std::os::unix::fs::MetadataExt;
            let m = std::fs::metadata(ws.path())
                .map_err(|e| SpecError::Unusable(format!("workspace {}: {e}", ws.path().display())))?;
            spec::check_workspace_access(
                ws.path(),
                ws.access(),
                self.hardening.uid,
                self.hardening.gid,
                m.mode(),
                (m.uid(), m.gid()),
            )?;
        }
        let guard = match job.workspace() {
            Some(ws) if ws.access() == Access::ReadWrite => {
                Some(stockade_hostfs::Guarded::inspect(ws.path()).map_err(|e| SpecError::Protected(e.to_string()))?)
            }
            _ => None,
        };
        if let (Some(g), Some(hc)) = (&guard, spec.body.host_config.as_mut()) {
            hc.binds.get_or_insert_with(Vec::new).extend(spec::protected_binds(g.root(), g.pinned(), g.present()));
        }
        // A host daemon's unix socket in the bound workspace would be reachable from the
        // container (a bind does not stop a connect): `/dev/null` covers each one.
        let sockets = match job.workspace() {
            Some(ws) => stockade_hostfs::specials(ws.path(), stockade_hostfs::MAX_WALK_ENTRIES)
                .map_err(|e| SpecError::Protected(e.to_string()))?,
            None => Vec::new(),
        };
        let covers = spec::special_cover_binds(&sockets)?;
        if let Some(hc) = spec.body.host_config.as_mut() {
            hc.binds.get_or_insert_with(Vec::new).extend(covers);
        }
        let name = format!("stockade-{id}");
        let created = self
            .docker
            .create_container(Some(CreateContainerOptionsBuilder::default().name(&name).build()), spec.body)
            .await;
        let container = match created {
            Ok(c) => c.id,
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, message }) => {
                return Ok(Report::new(Status::failed_to_start(message), Duration::ZERO));
            }
            Err(e) => return Err(engine(e)),
        };
        // If this future is dropped mid-run (a caller's timeout, an MCP cancellation), the
        // container is force-removed at once instead of running on until its expiry.
        let mut dropped =
            RemoveOnDrop { docker: Some(self.docker.clone()), pending: self.pending.clone(), id: container.clone() };
        let result = self.lifecycle(&container, job).await;
        dropped.docker = None;
        let removed = self.remove(&container).await;
        // The container is gone: what the guest created among the absent protected paths
        // goes now, whatever became of the run.
        let swept = guard.as_ref().map(stockade_hostfs::Guarded::sweep);
        let mut report = result?;
        if !removed {
            return Err(engine(format!("container {container} could not be removed")));
        }
        report.enforcement = enforcement(job, &self.hardening);
        if let (Some(g), Some(swept)) = (guard, swept) {
            report.enforcement.push(Enforced::new(
                Mechanism::ContainerWorkspace,
                format!("workspace bind-mounted read-write; {}", g.describe()),
            ));
            swept.record(&mut report, Mechanism::ContainerWorkspace);
        }
        Ok(report)
    }

    async fn lifecycle(&self, id: &str, job: &Job) -> Result<Report, RunError> {
        let limits = job.limits();
        let stdin = job.stdin().to_vec();
        let attach = AttachContainerOptionsBuilder::default()
            .stream(true)
            .logs(false)
            .stdin(!stdin.is_empty())
            .stdout(true)
            .stderr(true)
            .build();
        let attached = self.docker.attach_container(id, Some(attach)).await.map_err(engine)?;
        let (input, output) = (attached.input, attached.output);
        if let Err(e) = self.docker.start_container(id, None).await {
            return Ok(Report::new(Status::failed_to_start(e.to_string()), Duration::ZERO));
        }
        let (start, started_unix) = (Instant::now(), unix_now());
        let (sink, timed_out) = self.drive(id, input, output, stdin, limits, start).await;
        let code = self.wait_not_running(id).await;
        let wall = start.elapsed();
        // An out-of-memory kill never exits 0, so a clean exit needs no inspect.
        let (mut oom, code) = match code {
            Some(0) if !timed_out && sink.breach.is_none() => (false, 0),
            _ => {
                let state = self.docker.inspect_container(id, None).await.map_err(engine)?.state;
                let oom = state.as_ref().and_then(|s| s.oom_killed).unwrap_or(false);
                (oom, code.or_else(|| state.and_then(|s| s.exit_code)).unwrap_or(-1))
            }
        };
        // The engine sets `OOMKilled` only if the runtime's OOM event reached it before the
        // exit did, which under load it sometimes does not (the soak saw 4 of 196 memory bombs
        // end as SIGKILL with `OOMKilled` false). The container's cgroup is gone with it, so
        // for a SIGKILL that the deadline or a budget did not send, the engine's `oom` event
        // decides.
        if !oom && !timed_out && sink.breach.is_none() && code == 128 + 9 {
            oom = self.oom_event_since(id, started_unix).await;
        }
        Ok(sink.report(timed_out, oom, code, wall))
    }

    /// Whether the engine reported an out-of-memory kill in container `id` since
    /// `since_unix` (its event can trail the process's exit, by more under load, so the
    /// query runs to two seconds past now).
    pub(crate) async fn oom_event_since(&self, id: &str, since_unix: u64) -> bool {
        let filters = HashMap::from([("container", vec![id]), ("event", vec!["oom"])]);
        let (since, until) = (since_unix.saturating_sub(1).to_string(), (unix_now() + 2).to_string());
        let opts = EventsOptionsBuilder::default().since(&since).until(&until).filters(&filters).build();
        let mut events = self.docker.events(Some(opts));
        // The first event is the answer; the stream ends empty at `until` without one.
        let first = tokio::time::timeout(Duration::from_secs(4), events.next()).await;
        matches!(first, Ok(Some(Ok(_))))
    }

    /// Feeds `stdin` to a started process of `container` and captures its output fail-fast
    /// until `start + limits.wall()`; then drops the stream and, on a breach or at the
    /// deadline, SIGKILLs the whole container (Docker cannot kill an exec). Returns the
    /// captured output and whether the deadline passed.
    pub(crate) async fn drive(
        &self,
        container: &str,
        mut input: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
        mut output: std::pin::Pin<
            Box<dyn futures_util::Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>,
        >,
        stdin: Vec<u8>,
        limits: &stockade_protocol::Limits,
        start: Instant,
    ) -> (Sink, bool) {
        let deadline = tokio::time::Instant::from_std(start + limits.wall());
        let writer = tokio::spawn(async move {
            if !stdin.is_empty() {
                let _ = input.write_all(&stdin).await;
            }
            let _ = input.shutdown().await;
        });
        let mut sink = Sink::new(limits);
        let timed_out = tokio::time::timeout_at(deadline, sink.read(&mut output)).await.is_err();
        // Trap 4 of research/docker-tier.md: an open, unread attach stream blocks kill, wait
        // and inspect. Drop it first.
        drop(output);
        writer.abort();
        if timed_out || sink.breach.is_some() {
            let kill = KillContainerOptionsBuilder::default().signal("SIGKILL").build();
            let _ = self.docker.kill_container(container, Some(kill)).await;
        }
        (sink, timed_out)
    }

    /// Waits until the engine says exec `id` is not running, polling at most `polls` times
    /// 10 ms apart, and returns its exit code: `None` if the engine gave none in that time
    /// (the exit code is the engine's to tell; a caller never makes one up).
    pub(crate) async fn exec_exit_code(&self, id: &str, polls: u32) -> Result<Option<i64>, RunError> {
        for _ in 0..polls {
            let i = self.docker.inspect_exec(id).await.map_err(engine)?;
            if i.running == Some(false) {
                return Ok(i.exit_code);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(None)
    }

    /// Uploads an archive into the container at `path` (a directory there).
    pub(crate) async fn upload(&self, id: &str, path: &str, tar: bytes::Bytes) -> Result<(), RunError> {
        let opts = bollard::query_parameters::UploadToContainerOptionsBuilder::default()
            .path(path)
            .no_overwrite_dir_non_dir("true")
            .build();
        self.docker.upload_to_container(id, Some(opts), bollard::body_full(tar)).await.map_err(engine)
    }

    /// Downloads the archive of `path` in the container, at most `bound` bytes; a path the
    /// container does not have is said so (misconfigured, "no such file"), not an engine
    /// failure.
    pub(crate) async fn download(&self, id: &str, path: &str, bound: u64) -> Result<Vec<u8>, RunError> {
        let opts = bollard::query_parameters::DownloadFromContainerOptionsBuilder::default().path(path).build();
        let mut stream = self.docker.download_from_container(id, Some(opts));
        let mut archive = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| match e {
                bollard::errors::Error::DockerResponseServerError { status_code: 404, .. } => {
                    RunError::Misconfigured(format!("{path}: no such file in the container"))
                }
                e => engine(e),
            })?;
            if archive.len() as u64 + chunk.len() as u64 > bound {
                return Err(RunError::Misconfigured(format!(
                    "{path} in the container: its archive is over the {bound}-byte bound of one download"
                )));
            }
            archive.extend_from_slice(&chunk);
        }
        Ok(archive)
    }

    /// Downloads the container's `/workspace` (bounded by [`stage::archive_bound`] of
    /// `bytes`) and applies it to `host`.
    pub(crate) async fn download_workspace(
        &self,
        id: &str,
        host: &std::path::Path,
        bytes: u64,
    ) -> Result<stage::Applied, RunError> {
        let archive = self.download(id, spec::WORKSPACE, stage::archive_bound(bytes)).await?;
        let host = host.to_path_buf();
        Ok(tokio::task::spawn_blocking(move || stage::unpack(&archive, &host))
            .await
            .map_err(|e| RunError::Internal(format!("unpacking the workspace: {e}")))??)
    }

    /// Waits (at most 10 s) until the container is not running; its exit code if known.
    async fn wait_not_running(&self, id: &str) -> Option<i64> {
        let opts = WaitContainerOptionsBuilder::default().condition("not-running").build();
        let mut stream = self.docker.wait_container(id, Some(opts));
        match tokio::time::timeout(Duration::from_secs(10), stream.next()).await {
            Ok(Some(Ok(r))) => Some(r.status_code),
            Ok(Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. }))) => Some(code),
            _ => None,
        }
    }
}

/// Both output streams of a run, captured fail-fast.
pub(crate) struct Sink {
    out: BoundedSink,
    err: BoundedSink,
    pub(crate) breach: Option<Stream>,
}

impl Sink {
    pub(crate) fn new(limits: &stockade_protocol::Limits) -> Self {
        let cap = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        Self {
            out: BoundedSink::new(cap(limits.stdout_bytes()), CaptureMode::FailFast),
            err: BoundedSink::new(cap(limits.stderr_bytes()), CaptureMode::FailFast),
            breach: None,
        }
    }

    /// Reads demultiplexed frames until the stream ends or a budget is crossed.
    pub(crate) async fn read<S>(&mut self, output: &mut S)
    where
        S: futures_util::Stream<Item = Result<LogOutput, bollard::errors::Error>> + Unpin + ?Sized,
    {
        while let Some(Ok(frame)) = output.next().await {
            let (sink, stream, bytes) = match &frame {
                LogOutput::StdOut { message } | LogOutput::Console { message } => {
                    (&mut self.out, Stream::Stdout, message)
                }
                LogOutput::StdErr { message } => (&mut self.err, Stream::Stderr, message),
                LogOutput::StdIn { .. } => continue,
            };
            if sink.push(bytes) == Flow::OverBudget {
                self.breach = Some(stream);
                return;
            }
        }
    }

    /// The report of a run that ended so.
    pub(crate) fn report(self, timed_out: bool, oom: bool, code: i64, wall: Duration) -> Report {
        let status = match (timed_out, self.breach) {
            (true, _) => Status::TimedOut,
            (_, Some(stream)) => Status::OutputLimit { stream },
            _ if oom => Status::OutOfMemory,
            // docker-init (pid 1) reports a child killed by signal N as 128 + N.
            _ if (129..=192).contains(&code) => Status::Signaled { signal: i32::try_from(code - 128).unwrap_or(0) },
            _ => Status::Exited { code: i32::try_from(code).unwrap_or(-1) },
        };
        Report::new(status, wall).with_output(self.out.finish(), self.err.finish())
    }
}

pub(crate) fn enforcement(job: &Job, hardening: &Hardening) -> Vec<Enforced> {
    let l = job.limits();
    let kernel = match hardening.runtime.as_deref() {
        Some(spec::RUNSC) => format!(
            "; runtime runsc (gVisor: a user-space kernel; the pids limit counts its host threads, so guest processes are bounded by memory, pids {})",
            i64::from(l.processes()) + spec::RUNSC_HOST_TASKS
        ),
        Some(other) => format!("; runtime {other}"),
        None => String::new(),
    };
    vec![
        Enforced::new(Mechanism::ContainerNoNetwork, "NetworkDisabled, network mode none"),
        Enforced::new(Mechanism::ContainerReadOnlyRoot, "read-only root, /tmp tmpfs noexec nosuid nodev"),
        Enforced::new(
            Mechanism::ContainerNoCapabilities,
            format!("cap-drop ALL, no-new-privileges, uid 65534{kernel}"),
        ),
        Enforced::new(
            Mechanism::ContainerLimits,
            format!(
                "memory = memory+swap = {} bytes, pids {}, nofile {}, cpu time {} s per process, 1 cpu",
                l.memory_bytes(),
                l.processes(),
                l.open_files(),
                l.cpu().as_secs_f64().ceil()
            ),
        ),
        Enforced::new(
            Mechanism::OomScore,
            format!("oom_score_adj {}: the host's first out-of-memory victims", spec::OOM_SCORE_ADJ),
        ),
        Enforced::new(Mechanism::Deadline, format!("{} ms, SIGKILL to the container", l.wall().as_millis())),
        Enforced::new(
            Mechanism::OutputBudget,
            format!("stdout {} bytes, stderr {} bytes, log driver none", l.stdout_bytes(), l.stderr_bytes()),
        ),
    ]
}
