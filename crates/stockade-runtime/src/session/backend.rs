//! The seam between a [`Session`](super::Session) and the sandbox behind it: one trait,
//! [`SessionBackend`], with one set of exec options, implemented by the process tier's
//! session here and by the docker tier's in `docker.rs`. A session holds a boxed backend and
//! never asks which tier it is: what differs between tiers (how an exec is started and
//! reached, where the files are, what a snapshot is) is each backend's, in one place.

use std::any::Any;
use std::path::PathBuf;
use std::sync::Arc;

use stockade_process::files::{self, Files};
use stockade_process::{ProcessSession, SessionProcess, Swept};
use stockade_protocol::{CaptureMode, Job, LiveIo, Report, RunError};

use super::{Entry, FilesError, MAX_SNAPSHOT_BYTES};

/// How an exec runs, beyond its job, in every backend: in the foreground (the default), or
/// as a background exec, with a terminal, a drained budget and a channel told its pid and
/// control once its guest runs.
#[derive(Default)]
pub(super) struct ExecOptions {
    /// A terminal of this size (rows, columns).
    pub pty: Option<(u16, u16)>,
    /// An output budget's breach keeps the first bytes for the report and goes on, rather
    /// than ending the exec (a background exec).
    pub drain: bool,
    /// Told the exec's pid in the session and its [`Control`] once it runs.
    pub started: Option<tokio::sync::oneshot::Sender<(u32, Control)>>,
}

/// How a running exec is reached in its tier: what its backend made of it, which only that
/// backend reads ([`SessionBackend::signal`], [`SessionBackend::resize`]).
pub(super) struct Control {
    pty: bool,
    handle: Box<dyn Any + Send + Sync>,
}

impl Control {
    pub(super) fn new(pty: bool, handle: impl Any + Send + Sync) -> Self {
        Self { pty, handle: Box::new(handle) }
    }

    /// Whether the exec has a terminal.
    pub(super) fn has_pty(&self) -> bool {
        self.pty
    }

    /// The backend's own handle; `None` if another backend made it (a session never mixes
    /// them, so this is an internal error where it happens).
    pub(super) fn get<T: 'static>(&self) -> Option<&T> {
        self.handle.downcast_ref()
    }
}

/// One call of the files API, by the guest's paths.
pub(super) enum FileOp {
    Read { path: String, limit: u64 },
    Write { path: String, data: Vec<u8>, limit: u64, metadata: files::Metadata },
    Stat { path: String },
    List { path: String, depth: usize },
    Mkdir { path: String },
    Remove { path: String },
    Rename { from: String, to: String },
}

/// What a [`FileOp`] returns.
pub(super) enum FileOut {
    Bytes(Vec<u8>),
    Done,
    Entry(Entry),
    Entries(Vec<Entry>),
    Made(bool),
}

/// What a session's sandbox does, whichever tier it is.
#[async_trait::async_trait]
pub(super) trait SessionBackend: Send + Sync {
    /// Runs one exec (the session has added its environment).
    async fn exec(&self, job: &Job, cwd: Option<&str>, io: LiveIo, opts: ExecOptions) -> Result<Report, RunError>;

    /// Sends `signal` to a running exec's process group.
    async fn signal(&self, exec: &Control, pid: u32, signal: i32) -> Result<(), RunError>;

    /// Sizes a running exec's terminal (it has one: the session checked).
    async fn resize(&self, exec: &Control, pid: u32, rows: u16, cols: u16) -> Result<(), RunError>;

    /// Its processes, init aside, each with its pid in the session and on the host.
    async fn processes(&self) -> Vec<SessionProcess>;

    /// What it uses now; `None` where the tier cannot say.
    async fn usage(&self) -> Option<super::Usage>;

    /// A connection to `127.0.0.1:port` on the sandbox's own loopback.
    async fn connect(&self, port: u16) -> Result<std::net::TcpStream, RunError>;

    /// Its home as the host can read it, read-only, for a directory watch
    /// ([`Session::watch_files`](super::Session::watch_files)); `None` where the host cannot.
    async fn home_view(&self) -> Option<Files> {
        None
    }

    /// Pauses (`true`) or resumes it; `now` is whether the session is paused now.
    async fn set_paused(&self, paused: bool, now: bool) -> Result<(), RunError>;

    /// The home's files as a tar archive of at most [`MAX_SNAPSHOT_BYTES`] of content, taken
    /// paused (a session that was paused stays paused).
    async fn snapshot(&self, was_paused: bool) -> Result<Vec<u8>, RunError>;

    /// One files call, never on an async worker where it touches the host's filesystem.
    async fn file(&self, op: FileOp) -> Result<FileOut, FilesError>;

    /// Stops every process (running execs end; the session is then taken and ended).
    async fn stop(&self);

    /// Ends it and frees what it held; the workspace sweep's result.
    async fn end(self: Box<Self>, id: &str) -> Swept;
}

/// A process-tier session with its home on the host and the files API over it.
pub(super) struct ProcessBackend {
    pub session: ProcessSession,
    pub files: Arc<Files>,
    pub home: PathBuf,
}

/// A process-tier exec's control: its id in the session, and its terminal.
struct ProcessControl {
    exec: u64,
    terminal: Option<stockade_process::Terminal>,
}

fn other_backend() -> RunError {
    RunError::Internal("an exec's control is another backend's".into())
}

#[async_trait::async_trait]
impl SessionBackend for ProcessBackend {
    async fn exec(&self, job: &Job, cwd: Option<&str>, io: LiveIo, opts: ExecOptions) -> Result<Report, RunError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let output = if opts.drain { CaptureMode::Drain } else { CaptureMode::FailFast };
        let own = stockade_process::ExecOptions { pty: opts.pty, output, started: Some(tx) };
        let forward = async {
            if let (Ok(st), Some(out)) = (rx.await, opts.started) {
                let pty = st.terminal.is_some();
                let _ = out.send((st.pid, Control::new(pty, ProcessControl { exec: st.id, terminal: st.terminal })));
            }
        };
        tokio::join!(self.session.exec_with(job, cwd, io, own), forward).0
    }

    async fn signal(&self, exec: &Control, _pid: u32, signal: i32) -> Result<(), RunError> {
        let c = exec.get::<ProcessControl>().ok_or_else(other_backend)?;
        self.session.signal(c.exec, signal);
        Ok(())
    }

    async fn resize(&self, exec: &Control, pid: u32, rows: u16, cols: u16) -> Result<(), RunError> {
        let c = exec.get::<ProcessControl>().ok_or_else(other_backend)?;
        let terminal = c.terminal.as_ref().ok_or_else(other_backend)?;
        terminal
            .resize(rows, cols)
            .map_err(|e| RunError::Misconfigured(format!("resizing the terminal of pid {pid}: {e}")))
    }

    async fn processes(&self) -> Vec<SessionProcess> {
        self.session.processes()
    }

    async fn usage(&self) -> Option<super::Usage> {
        // `/proc`, the cgroupfs and `statvfs`: off the async workers.
        let (home, meter) = (self.home.clone(), self.session.usage_meter());
        tokio::task::spawn_blocking(move || {
            let u = meter.read();
            let memory = [u.memory_bytes, u.memory_cache, u.memory_limit];
            super::Usage::of(memory, u.cpu_ns, stockade_process::disk_usage(&home))
        })
        .await
        .ok()
    }

    async fn connect(&self, port: u16) -> Result<std::net::TcpStream, RunError> {
        let ended = || RunError::Ended("the sandbox's init has ended".into());
        let pid = self.session.netns_pid().ok_or_else(ended)?;
        let stream = tokio::task::spawn_blocking(move || stockade_process::connect_in_netns(pid, port))
            .await
            .map_err(|e| RunError::Internal(e.to_string()))?
            .map_err(|e| RunError::Misconfigured(format!("port {port}: {e}")))?;
        // The pid was pinned while its namespace was opened; that it is still this session's
        // init afterwards means the namespace was this session's, not a later process's.
        if self.session.netns_pid() != Some(pid) {
            return Err(ended());
        }
        Ok(stream)
    }

    async fn set_paused(&self, paused: bool, _now: bool) -> Result<(), RunError> {
        // The process tier keeps its own state: pausing twice is a no-op there.
        if paused { self.session.pause() } else { self.session.resume() }
    }

    async fn snapshot(&self, was_paused: bool) -> Result<Vec<u8>, RunError> {
        self.session.pause()?;
        let home = self.home.clone();
        let packed = tokio::task::spawn_blocking(move || {
            stockade_process::stage::pack(&home, stockade_protocol::Access::ReadWrite, 0, 0, MAX_SNAPSHOT_BYTES)
        })
        .await
        .map_err(|e| RunError::Internal(e.to_string()));
        if !was_paused {
            self.session.resume()?;
        }
        let packed = packed?.map_err(|e| RunError::Misconfigured(format!("snapshot of the session's home: {e}")))?;
        Ok(packed.tar.into())
    }

    async fn file(&self, op: FileOp) -> Result<FileOut, FilesError> {
        // A guest decides what a path is, and a call that waited on it (a FIFO, a slow
        // filesystem) would stall every session the worker serves: the blocking pool.
        let files = Arc::clone(&self.files);
        let at = op.path().to_owned();
        tokio::task::spawn_blocking(move || op.on_host(&files))
            .await
            .unwrap_or_else(|e| Err(FilesError::Invalid { path: at, why: format!("the files call ended: {e}") }))
    }

    async fn stop(&self) {
        self.session.terminate();
    }

    async fn end(self: Box<Self>, _id: &str) -> Swept {
        self.session.kill().await
    }
}

impl FileOp {
    /// The path it is about (the first, for a rename).
    pub(super) fn path(&self) -> &str {
        match self {
            Self::Read { path, .. }
            | Self::Write { path, .. }
            | Self::Stat { path }
            | Self::List { path, .. }
            | Self::Mkdir { path }
            | Self::Remove { path } => path,
            Self::Rename { from, .. } => from,
        }
    }

    /// The call through the host's files API (blocking).
    fn on_host(self, files: &Files) -> Result<FileOut, FilesError> {
        Ok(match self {
            Self::Read { path, limit } => FileOut::Bytes(files.read(&path, limit)?),
            Self::Write { path, data, limit, metadata } => {
                files.write_with(&path, &mut &data[..], limit, &metadata)?;
                FileOut::Done
            }
            Self::Stat { path } => FileOut::Entry(files.stat(&path)?),
            Self::List { path, depth } => FileOut::Entries(files.list(&path, depth)?),
            Self::Mkdir { path } => FileOut::Made(files.mkdir(&path)?),
            Self::Remove { path } => {
                files.remove(&path)?;
                FileOut::Done
            }
            Self::Rename { from, to } => {
                files.rename(&from, &to)?;
                FileOut::Done
            }
        })
    }
}
