//! The docker tier's [`SessionBackend`]: one hardened container per session
//! (`stockade_docker::session`), its files reached through the engine, and the engine's
//! connection, made once per owner. Without the `docker` feature, a docker session is
//! refused, naming the feature.

#[cfg(feature = "docker")]
use super::{Session, read_snapshot};
use super::{SessionProfile, Sessions};
use std::sync::Arc;
use stockade_protocol::RunError;

/// The owner's connection to the engine, made on its first docker session.
#[cfg(feature = "docker")]
pub(super) type Engine = tokio::sync::OnceCell<stockade_docker::DockerTier>;
/// No engine: this build has no docker tier.
#[cfg(not(feature = "docker"))]
pub(super) type Engine = ();

#[cfg(feature = "docker")]
mod backend {
    use stockade_docker::session::{DockerExecOptions, DockerSession};
    use stockade_process::{SessionProcess, Swept};
    use stockade_protocol::{Job, LiveIo, Report, RunError};

    use super::super::backend::{Control, ExecOptions, FileOp, FileOut, SessionBackend};
    use super::super::{FilesError, MAX_SNAPSHOT_BYTES};

    /// The longest one usage sample of a docker session may take, the engine's calls and
    /// the home's `statvfs` together.
    const USAGE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

    /// A docker exec's control: the engine's id for it.
    struct DockerControl(String);

    #[async_trait::async_trait]
    impl SessionBackend for DockerSession {
        async fn exec(&self, job: &Job, cwd: Option<&str>, io: LiveIo, opts: ExecOptions) -> Result<Report, RunError> {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let pty = opts.pty.is_some();
            let own = DockerExecOptions { pty: opts.pty, drain: opts.drain, started: Some(tx) };
            let forward = async {
                if let (Ok(st), Some(out)) = (rx.await, opts.started) {
                    let _ = out.send((st.pid, Control::new(pty, DockerControl(st.exec))));
                }
            };
            tokio::join!(self.exec_with(job, cwd, io, own), forward).0
        }

        async fn signal(&self, _exec: &Control, pid: u32, signal: i32) -> Result<(), RunError> {
            DockerSession::signal(self, pid, signal).await
        }

        async fn resize(&self, exec: &Control, _pid: u32, rows: u16, cols: u16) -> Result<(), RunError> {
            let c = exec
                .get::<DockerControl>()
                .ok_or_else(|| RunError::Internal("an exec's control is another backend's".into()))?;
            DockerSession::resize(self, &c.0, rows, cols).await
        }

        async fn processes(&self) -> Vec<SessionProcess> {
            DockerSession::processes(self)
                .await
                .unwrap_or_default()
                .into_iter()
                .map(|p| SessionProcess { pid: p.pid, host_pid: p.host_pid, cmdline: p.cmdline })
                .collect()
        }

        async fn usage(&self) -> Option<super::super::Usage> {
            // Memory and CPU as the engine counts them; the home volume's filesystem through
            // the container's init (`/proc/PID/root`), off the async workers. One deadline
            // for the whole sample: an engine that does not answer costs the sandbox its
            // sample, never the reaper its turn.
            let sample = async {
                let u = DockerSession::usage(self).await?;
                let disk = match self.init_pid().await {
                    Some(pid) => tokio::task::spawn_blocking(move || {
                        let home = format!("/proc/{pid}/root{}", stockade_docker::session::SESSION_HOME);
                        stockade_process::disk_usage(std::path::Path::new(&home))
                    })
                    .await
                    .ok()
                    .flatten(),
                    None => None,
                };
                let memory = [u.memory_bytes, u.memory_cache, u.memory_limit];
                Some(super::super::Usage::of(memory, u.cpu_ns, disk))
            };
            tokio::time::timeout(USAGE_WAIT, sample).await.ok().flatten()
        }

        async fn connect(&self, port: u16) -> Result<std::net::TcpStream, RunError> {
            // The container's own loopback, through its init's network namespace (a
            // container has no network but `lo`; nothing is published on the host).
            let gone = || RunError::Unsupported {
                mechanism: format!("a connection to port {port} of a docker session"),
                reason: "its container is not running, or its engine's processes are not this host's".into(),
            };
            let pid = self.init_pid().await.ok_or_else(gone)?;
            let stream = tokio::task::spawn_blocking(move || stockade_process::connect_in_netns(pid, port))
                .await
                .map_err(|e| RunError::Internal(e.to_string()))?
                .map_err(|e| RunError::Misconfigured(format!("port {port}: {e}")))?;
            // That the pid is still the container's init afterwards means the namespace
            // entered was the container's, not a later process's.
            if self.init_pid().await != Some(pid) {
                return Err(gone());
            }
            Ok(stream)
        }

        async fn home_view(&self) -> Option<stockade_process::files::Files> {
            // The container's home volume, opened beneath its init's root (a link in the
            // image cannot lead out of it), off the async workers; the pid checked again
            // once the directory is held, as for a port.
            let pid = self.init_pid().await?;
            let home = stockade_docker::session::SESSION_HOME;
            let view = tokio::task::spawn_blocking(move || {
                stockade_process::files::Files::default().serve_within(
                    home,
                    std::path::Path::new(&format!("/proc/{pid}/root")),
                    home,
                )
            })
            .await
            .ok()?
            .ok()?;
            (self.init_pid().await == Some(pid)).then_some(view)
        }

        async fn set_paused(&self, paused: bool, now: bool) -> Result<(), RunError> {
            match (paused, now) {
                (true, false) => self.pause().await,
                (false, true) => self.resume().await,
                _ => Ok(()),
            }
        }

        async fn snapshot(&self, was_paused: bool) -> Result<Vec<u8>, RunError> {
            let bound = stockade_process::stage::archive_bound(MAX_SNAPSHOT_BYTES);
            DockerSession::snapshot(self, bound, was_paused).await
        }

        async fn file(&self, op: FileOp) -> Result<FileOut, FilesError> {
            let at = op.path().to_owned();
            let out = match op {
                FileOp::Read { path, limit } => self.read(&path, limit).await.map(FileOut::Bytes),
                FileOp::Write { path, metadata, .. } if !metadata.is_empty() => Err(RunError::Misconfigured(format!(
                    "{path}: file metadata (user.e2b.* extended attributes) is not kept by the docker tier"
                ))),
                FileOp::Write { path, data, .. } => self.write(&path, &data).await.map(|()| FileOut::Done),
                FileOp::Stat { path } => self.stat(&path).await.map(FileOut::Entry),
                FileOp::List { path, depth } => self.list(&path, depth).await.map(FileOut::Entries),
                FileOp::Mkdir { path } => self.mkdir(&path).await.map(FileOut::Made),
                FileOp::Remove { path } => self.remove(&path).await.map(|()| FileOut::Done),
                FileOp::Rename { from, to } => self.rename(&from, &to).await.map(|()| FileOut::Done),
            };
            out.map_err(|e| files_error(&at, e))
        }

        async fn stop(&self) {
            DockerSession::stop(self).await;
        }

        async fn end(self: Box<Self>, id: &str) -> Swept {
            // A read-write workspace's copy back: what failed is said on the owner's log.
            if let Some(Err(e)) = (*self).kill().await {
                eprintln!("stockade: session {id}: the workspace was not copied back: {e}");
            }
            Swept::default()
        }
    }

    /// A docker session's file error as the files API's.
    fn files_error(path: &str, e: RunError) -> FilesError {
        match e {
            RunError::Misconfigured(why) if why.contains("no such") => FilesError::NotFound(path.into()),
            RunError::Misconfigured(why) => {
                let why = why.strip_prefix(path).and_then(|w| w.strip_prefix(": ")).map_or(why.clone(), str::to_owned);
                FilesError::Invalid { path: path.into(), why }
            }
            other => FilesError::Io { path: path.into(), source: std::io::Error::other(other.to_string()) },
        }
    }
}

impl Sessions {
    /// A docker-tier session: one hardened container of `image`, its home a volume of its
    /// own (`stockade_docker::session`).
    #[cfg(feature = "docker")]
    pub(super) async fn create_docker(
        &self,
        id: String,
        image: String,
        profile: SessionProfile,
    ) -> Result<Arc<Session>, RunError> {
        let tier = self.docker.get_or_try_init(|| async { stockade_docker::DockerTier::connect().await }).await?;
        // Grants: one broker for the session's life, its directory bound read-only at
        // `/broker` as a one-shot run's is; a model grant's `OPENAI_BASE_URL` and a network
        // grant's proxy are a listener put in the container's own network namespace once it
        // has started, before any exec (`Broker::docker_join`, as for a one-shot run).
        let broker = match profile.grants.as_ref().filter(|g| !g.is_empty()) {
            Some(g) => Some(crate::Broker::new(Arc::clone(g), std::env::temp_dir())?),
            None => None,
        };
        let mut grants_dir = None;
        let mut join = None;
        if let Some(b) = &broker {
            grants_dir = Some(b.socket_dir()?);
            join = b.docker_join(tier.oci_runtime(), "network grant in a docker session")?;
        }
        let loopback = join.is_some();
        let restore = match profile.from_snapshot.clone() {
            Some(from) => Some(
                tokio::task::spawn_blocking(move || read_snapshot(&from))
                    .await
                    .map_err(|e| RunError::Misconfigured(format!("snapshot: {e}")))??,
            ),
            None => None,
        };
        let base = stockade_docker::session::DockerSessionConfig::new(image);
        let config = stockade_docker::session::DockerSessionConfig {
            limits: profile.limits,
            lifetime: profile.max_lifetime,
            workspace: profile.workspace.clone(),
            restore,
            home_bytes: profile.home_bytes.unwrap_or(base.home_bytes),
            grants_dir,
            ..base
        };
        let inner = tier.session_joined(config, join).await?;
        let session = self.keep(id.clone(), Box::new(inner), None, self.root.join(&id), profile, broker);
        let _ = session.guest.set((stockade_docker::spec::GRANTS, loopback));
        Ok(session)
    }

    /// No docker tier in this build: refused, naming the feature.
    #[cfg(not(feature = "docker"))]
    pub(super) async fn create_docker(
        &self,
        _: String,
        _: String,
        _: SessionProfile,
    ) -> Result<Arc<super::Session>, RunError> {
        Err(RunError::Unsupported {
            mechanism: "docker".into(),
            reason: "this build has no docker tier (feature `docker`)".into(),
        })
    }
}
