//! Sessions: a live sandbox that serves many commands and keeps its state ([`Session`]),
//! and their owner ([`Sessions`]), which gives each an id, a home, and an end.
//!
//! A session is the process tier's [`ProcessSession`] with what an owner adds: an id no
//! other session of this host had (16 random bytes, hex), a home directory made for it alone
//! under `sessions/OWNER/ID` in stockade's state directory (bound read-write at
//! `/home/user`, served on the host by [`files::Files`]), an idle timeout and a maximum
//! lifetime. [`Sessions`] holds the live ones; its reaper kills each one whose idle time or
//! lifetime is over, without anyone calling. The `OWNER` directory is named after the owner's
//! pid and start time: an owner that was SIGKILLed leaves its sessions' homes (its sandboxes
//! die with it: parent-death signals), and the next owner, or `stockade gc`, removes them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use stockade_process::files::Files;
use stockade_process::{ProcessSession, ProcessTier, SESSION_HOME, SessionConfig, files};
use stockade_protocol::{Job, Limits, LiveIo, Report, RunError, Workspace};

/// What a session is made from.
#[derive(Debug, Clone)]
pub struct SessionProfile {
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
}

impl Default for SessionProfile {
    fn default() -> Self {
        Self {
            limits: Limits::default(),
            workspace: None,
            idle_timeout: Duration::from_secs(300),
            max_lifetime: Duration::from_secs(3600),
            from_snapshot: None,
        }
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

/// One live session ([`Sessions::create`]).
pub struct Session {
    id: String,
    // Read-locked by every exec (they run side by side), write-locked to end it.
    inner: tokio::sync::RwLock<Option<ProcessSession>>,
    files: Files,
    dir: PathBuf,
    profile: SessionProfile,
    made: Instant,
    used: Mutex<Instant>,
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

    /// Whether its idle timeout or lifetime is over (a paused session is not idle: only its
    /// lifetime ends it).
    #[must_use]
    pub fn expired(&self) -> Option<Expiry> {
        let (age, idle) = self.age();
        if age >= self.profile.max_lifetime {
            Some(Expiry::Lifetime)
        } else if idle >= self.profile.idle_timeout && !self.paused() {
            Some(Expiry::Idle)
        } else {
            None
        }
    }

    /// Runs one exec ([`ProcessSession::exec`]).
    pub async fn exec(&self, job: &Job, cwd: Option<&str>, io: LiveIo) -> Result<Report, RunError> {
        self.touch();
        let inner = self.inner.read().await;
        let session = inner.as_ref().ok_or_else(|| RunError::Misconfigured(format!("session {} is gone", self.id)))?;
        let report = session.exec(job, cwd, io).await;
        self.touch();
        report
    }

    /// Its processes, init aside ([`ProcessSession::processes`]).
    pub async fn processes(&self) -> Vec<stockade_process::SessionProcess> {
        self.inner.read().await.as_ref().map(ProcessSession::processes).unwrap_or_default()
    }

    /// Whether it is paused.
    #[must_use]
    pub fn paused(&self) -> bool {
        self.inner.try_read().ok().and_then(|g| g.as_ref().map(ProcessSession::paused)).unwrap_or(false)
    }

    /// Pauses it ([`ProcessSession::pause`]): no CPU, no exec, deadlines stopped.
    pub async fn pause(&self) -> Result<(), RunError> {
        self.touch();
        let inner = self.inner.read().await;
        inner.as_ref().ok_or_else(|| RunError::Misconfigured(format!("session {} is gone", self.id)))?.pause()
    }

    /// Resumes it ([`ProcessSession::resume`]).
    pub async fn resume(&self) -> Result<(), RunError> {
        self.touch();
        let inner = self.inner.read().await;
        inner.as_ref().ok_or_else(|| RunError::Misconfigured(format!("session {} is gone", self.id)))?.resume()
    }

    /// A filesystem-only snapshot: the session's home (every file, directory and symlink
    /// under `/home/user`, at most [`MAX_SNAPSHOT_BYTES`] of content) written to `to` as a
    /// tar archive (a new file, mode 0600), with the session paused meanwhile so that the
    /// archive is one moment's (a paused session stays paused). Processes, `/tmp` and the
    /// workspace are not in it. [`SessionProfile::from_snapshot`] makes a session from it.
    pub async fn snapshot(&self, to: &Path) -> Result<stockade_process::stage::Packed, RunError> {
        let was_paused = self.paused();
        self.pause().await?;
        let home = self.dir.join("home");
        let packed = tokio::task::spawn_blocking(move || {
            stockade_process::stage::pack(&home, stockade_protocol::Access::ReadWrite, 0, 0, MAX_SNAPSHOT_BYTES)
        })
        .await
        .map_err(|e| RunError::Internal(e.to_string()));
        if !was_paused {
            self.resume().await?;
        }
        let packed = packed?.map_err(|e| RunError::Misconfigured(format!("snapshot of session {}: {e}", self.id)))?;
        let write = || -> std::io::Result<()> {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(to)?;
            f.write_all(&packed.tar)?;
            f.sync_all()
        };
        write().map_err(|e| RunError::Misconfigured(format!("snapshot file {}: {e}", to.display())))?;
        Ok(packed)
    }

    /// The files API: the home at `/home/user` (and the workspace at `/workspace`), on the
    /// host, through cap-std.
    #[must_use]
    pub fn files(&self) -> &Files {
        self.touch();
        &self.files
    }

    /// Ends it: every process, the cgroup, and its home directory; returns the workspace
    /// sweep's result.
    pub async fn kill(&self) -> stockade_process::Swept {
        if let Some(s) = self.inner.read().await.as_ref() {
            // Running execs end with it (their pipes close), so the write lock comes.
            s.terminate();
        }
        let taken = self.inner.write().await.take();
        let swept = match taken {
            Some(s) => s.kill().await,
            None => stockade_process::Swept::default(),
        };
        let _ = std::fs::remove_dir_all(&self.dir);
        swept
    }
}

/// The owner of sessions: makes, finds, lists and ends them, and ends each one whose time is
/// over (its reaper, [`Sessions::reap_expired`]).
pub struct Sessions {
    tier: ProcessTier,
    root: PathBuf,
    max: usize,
    live: Mutex<HashMap<String, Arc<Session>>>,
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
        let _ = stale_homes(&base).into_iter().map(std::fs::remove_dir_all).count();
        let start = stockade_sys::proc::start_time("self").unwrap_or(0);
        let root = base.join(format!("{}-{start}", std::process::id()));
        std::fs::create_dir_all(&root)
            .and_then(|()| {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700))
            })
            .map_err(|e| RunError::Misconfigured(format!("sessions directory {}: {e}", root.display())))?;
        Ok(Self { tier, root, max, live: Mutex::new(HashMap::new()) })
    }

    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Session>>> {
        self.live.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes a session.
    pub async fn create(&self, profile: SessionProfile) -> Result<Arc<Session>, RunError> {
        if self.live().len() >= self.max {
            return Err(RunError::Busy(format!("{} sessions are live, the most this owner keeps", self.max)));
        }
        let id = new_id().map_err(|e| RunError::Internal(format!("a session id: {e}")))?;
        let dir = self.root.join(&id);
        let home = dir.join("home");
        std::fs::create_dir_all(&home)
            .map_err(|e| RunError::Misconfigured(format!("session home {}: {e}", home.display())))?;
        let cleanup = |e| {
            let _ = std::fs::remove_dir_all(&dir);
            e
        };
        if let Some(from) = &profile.from_snapshot {
            restore(from, &home).map_err(cleanup)?;
        }
        let mut files = Files::default()
            .serve(SESSION_HOME, &home, true, false)
            .map_err(|e| cleanup(RunError::Misconfigured(format!("session home {}: {e}", home.display()))))?;
        if let Some(ws) = &profile.workspace {
            let rw = ws.access() == stockade_protocol::Access::ReadWrite;
            files = files
                .serve("/workspace", ws.path(), rw, rw)
                .map_err(|e| cleanup(RunError::Misconfigured(format!("workspace {}: {e}", ws.path().display()))))?;
        }
        let config = SessionConfig { limits: profile.limits, workspace: profile.workspace.clone(), home: Some(home) };
        let inner = self.tier.session(config).await.map_err(cleanup)?;
        let session = Arc::new(Session {
            id: id.clone(),
            inner: tokio::sync::RwLock::new(Some(inner)),
            files,
            dir,
            profile,
            made: Instant::now(),
            used: Mutex::new(Instant::now()),
        });
        self.live().insert(id, Arc::clone(&session));
        Ok(session)
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

/// Fills a new session's `home` from the snapshot file `from` (bounded, never through a link,
/// files and directories only: `stockade_hostfs::stage::unpack_snapshot`).
fn restore(from: &Path, home: &Path) -> Result<(), RunError> {
    use std::io::Read;
    let bound = stockade_process::stage::archive_bound(MAX_SNAPSHOT_BYTES);
    let bad = |e: &dyn std::fmt::Display| RunError::Misconfigured(format!("snapshot {}: {e}", from.display()));
    let mut bytes = Vec::new();
    std::fs::File::open(from).and_then(|f| f.take(bound + 1).read_to_end(&mut bytes)).map_err(|e| bad(&e))?;
    if bytes.len() as u64 > bound {
        return Err(bad(&format!("over the {bound}-byte bound of a snapshot")));
    }
    stockade_process::stage::unpack_snapshot(&bytes, home).map_err(|e| bad(&e))?;
    Ok(())
}

/// 16 random bytes from the kernel, as 32 hex digits.
fn new_id() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The files API's types.
pub use files::{Entry, FilesError, Kind};
