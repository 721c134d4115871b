//! The session owner: `stockade serve`'s unix socket, where `stockade session` drives live
//! sessions, one call and one reply (with an exec's or an attach's output as frames before
//! it) per connection ([`stockade_protocol::session`]'s `SessionCall` and `SessionReply`).
//!
//! Only the owner's own uid is served (the socket is 0600 in a 0700 directory, and each
//! peer's credentials are checked again). Each call is one function of [`Owner`]; every
//! blocking step runs in the runtime's sessions off the async workers, and an exec's or an
//! attach's output reaches a slow client with back-pressure (an exec's output budget bounds
//! its queue; an attach waits at the client's pace, and the exec at its output log's).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use stockade_runtime::egress;
use stockade_runtime::protocol::session::{
    ExecInfo, MAX_FILE_BYTES, SESSION_CODEC, SessionCall, SessionInfo, SessionProcessInfo, SessionReply,
};
use stockade_runtime::protocol::{Access, Busy, Limits, LiveIo, RunError, Workspace};
use stockade_runtime::session::{FilesError, SessionProfile, Sessions, exec_job};
use tokio::net::{UnixListener, UnixStream};

/// The owner of one host's live sessions on a unix socket. Built with [`Owner::new`].
pub struct Owner {
    sessions: Arc<Sessions>,
    on_refused: Option<egress::OnRefused>,
}

impl std::fmt::Debug for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Owner").finish_non_exhaustive()
    }
}

impl Owner {
    /// An owner of `sessions`.
    #[must_use]
    pub fn new(sessions: Arc<Sessions>) -> Self {
        Self { sessions, on_refused: None }
    }

    /// Tells `hook` of each connection a session's network grant refuses (a line for the
    /// owner's log; it must not block).
    #[must_use]
    pub fn on_refused(mut self, hook: egress::OnRefused) -> Self {
        self.on_refused = Some(hook);
        self
    }

    /// Serves `listener` until the future is dropped: each connection on a task of its own.
    pub async fn serve(self: Arc<Self>, listener: UnixListener) {
        loop {
            if let Ok((conn, _)) = listener.accept().await {
                let owner = Arc::clone(&self);
                tokio::spawn(async move {
                    let _ = connection(conn, &owner).await;
                });
            }
        }
    }

    /// One call that is not an exec's or an attach's stream.
    async fn handle(&self, call: SessionCall) -> SessionReply {
        let sessions = &*self.sessions;
        match call {
            call @ SessionCall::Create { .. } => self.create(call).await,
            call @ SessionCall::Exec { .. } => handle_exec(call, sessions, LiveIo::default()).await,
            SessionCall::List => list(sessions),
            call @ SessionCall::Start { .. } => start(call, sessions).await,
            SessionCall::Input { id, pid, data, close } => input(sessions, &id, pid, &data, close).await,
            SessionCall::Signal { id, pid, signal } => signal_exec(sessions, &id, pid, signal).await,
            SessionCall::Resize { id, pid, rows, cols } => match sessions.get(&id) {
                Some(s) => done(s.resize(pid, rows, cols).await),
                None => missing(&id),
            },
            SessionCall::Jobs { id } => jobs(sessions, &id),
            SessionCall::Ps { id } => ps(sessions, &id).await,
            SessionCall::Snapshot { id, path } => snapshot(sessions, &id, &path).await,
            SessionCall::Pause { id } => match sessions.get(&id) {
                Some(s) => done(s.pause().await),
                None => missing(&id),
            },
            SessionCall::Resume { id } => match sessions.get(&id) {
                Some(s) => done(s.resume().await),
                None => missing(&id),
            },
            SessionCall::Kill { id } => match sessions.kill(&id).await {
                Some(_) => SessionReply::Done,
                None => missing(&id),
            },
            SessionCall::Read { id, path } => read(sessions, &id, &path).await,
            SessionCall::Write { id, path, data } => write(sessions, &id, &path, &data).await,
            _ => error("invalid", "unknown call"),
        }
    }

    /// `Create`: a session of the call's profile, under the owner's session cap.
    async fn create(&self, call: SessionCall) -> SessionReply {
        let SessionCall::Create {
            memory_bytes,
            processes,
            workspace,
            idle_timeout_secs,
            max_lifetime_secs,
            from_snapshot,
            docker_image,
            allow_net,
            net_resolve,
            env,
            disk_bytes,
        } = call
        else {
            return error("invalid", "not a create");
        };
        let mut profile = SessionProfile { env, home_bytes: disk_bytes, ..SessionProfile::default() };
        match self.net_grant(&allow_net, &net_resolve) {
            Ok(Some(net)) => profile.grants = Some(Arc::new(stockade_runtime::Grants::new().net(net))),
            Ok(None) => {}
            Err(e) => return error("invalid", e),
        }
        if let Some(image) = docker_image {
            profile.tier = stockade_runtime::session::SessionTier::Docker { image };
        }
        profile.limits = match limits(memory_bytes, processes) {
            Ok(l) => l,
            Err(e) => return error("invalid", e.to_string()),
        };
        if let Some((path, writable)) = workspace {
            let access = if writable { Access::ReadWrite } else { Access::ReadOnly };
            // Held for the session's life: another holder refuses it rather than waits.
            profile.workspace = match Workspace::new(path, access, Busy::Refuse) {
                Ok(w) => Some(w),
                Err(e) => return error("invalid", e.to_string()),
            };
        }
        if let Some(s) = idle_timeout_secs {
            profile.idle_timeout = Duration::from_secs(s);
        }
        if let Some(s) = max_lifetime_secs {
            profile.max_lifetime = Duration::from_secs(s);
        }
        profile.from_snapshot = from_snapshot.map(PathBuf::from);
        match self.sessions.create(profile).await {
            Ok(s) => SessionReply::Created { id: s.id().to_owned() },
            Err(e) => run_error(&e),
        }
    }

    /// A session's network grant: the `--allow-net` entries and `--net-resolve` overrides.
    fn net_grant(&self, allow_net: &[String], net_resolve: &[String]) -> Result<Option<egress::NetGrant>, String> {
        if allow_net.is_empty() {
            if !net_resolve.is_empty() {
                return Err("--net-resolve needs --allow-net".to_owned());
            }
            return Ok(None);
        }
        let policy = egress::NetPolicy::allow_entries(allow_net).map_err(|e| e.to_string())?;
        let resolve = egress::Resolve::entries(net_resolve).map_err(|e| e.to_string())?;
        let mut grant = egress::NetGrant::new(policy).resolve(resolve);
        if let Some(hook) = &self.on_refused {
            grant = grant.on_refused(Arc::clone(hook));
        }
        Ok(Some(grant))
    }
}

fn limits(
    memory_bytes: Option<u64>,
    processes: Option<u32>,
) -> Result<Limits, stockade_runtime::protocol::LimitsError> {
    let mut limits = Limits::default();
    if let Some(m) = memory_bytes {
        limits = limits.with_memory(m)?;
    }
    if let Some(p) = processes {
        limits = limits.with_processes(p)?;
    }
    Ok(limits)
}

fn done(r: Result<(), RunError>) -> SessionReply {
    match r {
        Ok(()) => SessionReply::Done,
        Err(e) => run_error(&e),
    }
}

fn list(sessions: &Sessions) -> SessionReply {
    SessionReply::Sessions(
        sessions
            .list()
            .iter()
            .map(|s| {
                let (age, idle) = s.age();
                SessionInfo {
                    id: s.id().to_owned(),
                    age_secs: age.as_secs(),
                    idle_secs: idle.as_secs(),
                    paused: s.paused(),
                }
            })
            .collect(),
    )
}

async fn start(call: SessionCall, sessions: &Sessions) -> SessionReply {
    let SessionCall::Start { id, argv, env, cwd, timeout_ms, pty, stdin, tag } = call else {
        return error("invalid", "not a start");
    };
    let Some(session) = sessions.get(&id) else { return missing(&id) };
    let job = match exec_job(&argv, env, Vec::new(), timeout_ms.map(Duration::from_millis)) {
        Ok(j) => j,
        Err(e) => return error("invalid", e.to_string()),
    };
    let opts = stockade_runtime::session::StartOptions { pty, stdin, tag };
    match session.start(job, cwd, opts).await {
        Ok(b) => SessionReply::Started { pid: b.pid() },
        Err(e) => run_error(&e),
    }
}

async fn input(sessions: &Sessions, id: &str, pid: u32, data: &[u8], close: bool) -> SessionReply {
    let Some(session) = sessions.get(id) else { return missing(id) };
    let mut r = Ok(());
    if !data.is_empty() {
        r = session.send_stdin(pid, data).await;
    }
    if close && r.is_ok() {
        r = session.close_stdin(pid).await;
    }
    done(r)
}

async fn signal_exec(sessions: &Sessions, id: &str, pid: u32, signal: i32) -> SessionReply {
    let Some(session) = sessions.get(id) else { return missing(id) };
    if !(1..=64).contains(&signal) {
        return error("invalid", format!("signal {signal}: not a signal number (1-64)"));
    }
    done(session.signal(pid, signal).await)
}

fn jobs(sessions: &Sessions, id: &str) -> SessionReply {
    let Some(session) = sessions.get(id) else { return missing(id) };
    SessionReply::Execs(
        session
            .background()
            .iter()
            .map(|b| ExecInfo {
                pid: b.pid(),
                argv: b.argv().to_vec(),
                tag: b.tag().map(str::to_owned),
                cwd: b.cwd().map(str::to_owned),
                pty: b.has_pty(),
                running: b.running(),
            })
            .collect(),
    )
}

async fn ps(sessions: &Sessions, id: &str) -> SessionReply {
    let Some(session) = sessions.get(id) else { return missing(id) };
    SessionReply::Processes(
        session.processes().await.into_iter().map(|p| SessionProcessInfo { pid: p.pid, cmd: p.cmdline }).collect(),
    )
}

async fn snapshot(sessions: &Sessions, id: &str, path: &str) -> SessionReply {
    let Some(session) = sessions.get(id) else { return missing(id) };
    if !Path::new(path).is_absolute() {
        return error("invalid", format!("snapshot file {path}: not an absolute path"));
    }
    match session.snapshot(Path::new(path)).await {
        Ok(_) => SessionReply::Done,
        Err(e) => run_error(&e),
    }
}

async fn read(sessions: &Sessions, id: &str, path: &str) -> SessionReply {
    let Some(session) = sessions.get(id) else { return missing(id) };
    match session.read(path, MAX_FILE_BYTES).await {
        Ok(bytes) => SessionReply::Data(bytes),
        Err(e) => files_error(&e),
    }
}

async fn write(sessions: &Sessions, id: &str, path: &str, data: &[u8]) -> SessionReply {
    let Some(session) = sessions.get(id) else { return missing(id) };
    match session.write(path, data, MAX_FILE_BYTES).await {
        Ok(_) => SessionReply::Done,
        Err(e) => files_error(&e),
    }
}

/// The socket's directory: made mode 0700 if it is missing, else required to be this user's
/// alone. Never loosened or tightened here: a directory another user can enter (or one not
/// ours) could let them reach the socket, or be theirs to swap.
///
/// # Ambient Authority
/// Creates a directory by path.
pub fn private_dir_ambient(socket: &Path) -> io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let dir = socket.parent().ok_or_else(|| failed(format!("socket {} has no directory", socket.display())))?;
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| failed(format!("creating {}: {e}", dir.display()))),
        Err(e) => Err(failed(format!("the socket's directory {}: {e}", dir.display()))),
        Ok(m) if m.uid() != my_uid() || m.mode() & 0o077 != 0 => Err(failed(format!(
            "the socket's directory {} must be yours alone (mode 0700); pass --socket in a private directory",
            dir.display()
        ))),
        Ok(_) => Ok(()),
    }
}

/// Listens on `socket`, in a directory only this user can enter, the socket itself mode
/// 0600; an old socket that no owner answers is replaced, a live one is not.
/// Listens on `socket` (mode 0600) in a directory that is the caller's alone (made 0700 if
/// missing; refused otherwise); a stale socket is removed, a live one refused.
///
/// # Ambient Authority
/// Creates and removes paths in the host's filesystem.
pub fn bind_ambient(socket: &Path) -> io::Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    private_dir_ambient(socket)?;
    if socket.exists() {
        if std::os::unix::net::UnixStream::connect(socket).is_ok() {
            return Err(failed(format!("another `stockade serve` already listens on {}", socket.display())));
        }
        std::fs::remove_file(socket)
            .map_err(|e| failed(format!("removing the stale socket {}: {e}", socket.display())))?;
    }
    let listener = UnixListener::bind(socket).map_err(|e| failed(format!("listening on {}: {e}", socket.display())))?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

fn failed(message: String) -> io::Error {
    io::Error::other(message)
}

/// One connection: one call, one reply. A peer of another uid is refused (the socket's mode
/// already keeps it out; this holds even if someone loosened it).
async fn connection(mut conn: UnixStream, owner: &Owner) -> io::Result<()> {
    let me = my_uid();
    if conn.peer_cred().map(|c| c.uid()).ok() != Some(me) {
        return Ok(());
    }
    let Some(frame) = SESSION_CODEC.read_frame_async(&mut conn).await.map_err(|e| failed(e.to_string()))? else {
        return Ok(());
    };
    let reply = match stockade_runtime::protocol::parse_untrusted::<SessionCall>(
        &frame,
        stockade_runtime::protocol::JsonLimits::new(frame.len(), 16),
    ) {
        Ok(call @ SessionCall::Exec { .. }) => exec_streamed(call, &owner.sessions, &mut conn).await,
        Ok(SessionCall::Attach { id, pid, replay }) => attach(&id, pid, replay, &owner.sessions, &mut conn).await,
        Ok(call) => owner.handle(call).await,
        Err(e) => error("invalid", format!("malformed call: {e}")),
    };
    let bytes = serde_json::to_vec(&reply).map_err(|e| failed(e.to_string()))?;
    SESSION_CODEC.write_frame_async(&mut conn, &bytes).await.map_err(|e| failed(e.to_string()))
}

/// A live copy of one of an exec's streams, as frames for the client: each write is a
/// chunk sent on. The exec's output budget bounds what can queue.
struct Tee {
    tx: tokio::sync::mpsc::UnboundedSender<SessionReply>,
    stdout: bool,
}

impl std::io::Write for Tee {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let chunk = if self.stdout { SessionReply::Stdout(buf.to_vec()) } else { SessionReply::Stderr(buf.to_vec()) };
        // A client that hung up is no reason to stop the exec.
        let _ = self.tx.send(chunk);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// An exec whose stdout and stderr go to the client as they come (`Stdout` and `Stderr`
/// frames), then its report; returns the last reply for the caller to send.
async fn exec_streamed(call: SessionCall, sessions: &Sessions, conn: &mut UnixStream) -> SessionReply {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let io = LiveIo {
        stdout: Some(Box::new(Tee { tx: tx.clone(), stdout: true })),
        stderr: Some(Box::new(Tee { tx, stdout: false })),
        ..LiveIo::default()
    };
    let exec = handle_exec(call, sessions, io);
    tokio::pin!(exec);
    let mut gone = false;
    let reply = loop {
        tokio::select! {
            reply = &mut exec => break reply,
            Some(chunk) = rx.recv() => gone = gone || !send(conn, &chunk).await,
        }
    };
    while let Ok(chunk) = rx.try_recv() {
        gone = gone || !send(conn, &chunk).await;
    }
    reply
}

/// Writes one reply frame; `false` if the client is gone.
async fn send(w: &mut (impl tokio::io::AsyncWrite + Unpin), reply: &SessionReply) -> bool {
    match serde_json::to_vec(reply) {
        Ok(bytes) => SESSION_CODEC.write_frame_async(w, &bytes).await.is_ok(),
        Err(_) => true,
    }
}

/// A background exec's output, as frames for the client (what it wrote before first, if
/// `replay`), then its end; returns the last reply for the caller to send. A client that
/// hangs up ends the attach, not the exec.
async fn attach(id: &str, pid: u32, replay: bool, sessions: &Sessions, conn: &mut UnixStream) -> SessionReply {
    use stockade_runtime::session::Chunk;
    use tokio::io::AsyncReadExt;
    let Some(session) = sessions.get(id) else { return missing(id) };
    let exec = match session.find(pid) {
        Ok(b) => b,
        Err(e) => return error("not_found", e.to_string()),
    };
    let (history, mut live) = exec.attach();
    let (mut rd, mut wr) = conn.split();
    let frame = |c: Chunk| match c {
        Chunk::Stdout(b) => SessionReply::Stdout(b),
        Chunk::Stderr(b) => SessionReply::Stderr(b),
    };
    for c in history.into_iter().filter(|_| replay) {
        if !send(&mut wr, &frame(c)).await {
            return SessionReply::Done;
        }
    }
    let end = exec.wait();
    tokio::pin!(end);
    let mut probe = [0u8; 1];
    loop {
        tokio::select! {
            result = &mut end => {
                // Its output was all pushed before its end was: what is queued is the rest.
                while let Some(c) = live.try_recv() {
                    if !send(&mut wr, &frame(c)).await {
                        return SessionReply::Done;
                    }
                }
                return match result {
                    Ok(report) => SessionReply::Ran(Box::new(report)),
                    Err(e) => run_error(&e),
                };
            }
            // A slow client holds this at `send`, and the exec's output waits for it.
            c = live.recv() => {
                if !send(&mut wr, &frame(c)).await {
                    return SessionReply::Done;
                }
            }
            // The client sends nothing after its call: a read that ends means it hung up.
            _ = rd.read(&mut probe) => return SessionReply::Done,
        }
    }
}

fn my_uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(u32::MAX)
}

fn error(kind: &str, message: impl Into<String>) -> SessionReply {
    SessionReply::Error { kind: kind.into(), message: message.into() }
}

fn missing(id: &str) -> SessionReply {
    error("not_found", format!("no session {id} (`stockade session ls` lists them)"))
}

fn run_error(e: &RunError) -> SessionReply {
    let kind = match e {
        RunError::Misconfigured(_) => "invalid",
        RunError::Ended(_) => "not_found",
        RunError::Unsupported { .. } => "unsupported",
        RunError::Busy(_) | RunError::Exhausted(_) => "busy",
        _ => "internal",
    };
    error(kind, e.to_string())
}

fn files_error(e: &FilesError) -> SessionReply {
    let kind = match e {
        FilesError::NotFound(_) => "not_found",
        FilesError::Invalid { .. } | FilesError::TooLarge { .. } => "invalid",
        FilesError::Denied { .. } => "denied",
        _ => "internal",
    };
    error(kind, e.to_string())
}

/// One exec, with `io` as its live stdio.
async fn handle_exec(call: SessionCall, sessions: &Sessions, io: LiveIo) -> SessionReply {
    let SessionCall::Exec { id, argv, env, cwd, stdin, timeout_ms } = call else {
        return error("invalid", "not an exec");
    };
    let Some(session) = sessions.get(&id) else { return missing(&id) };
    let job = match exec_job(&argv, env, stdin, timeout_ms.map(Duration::from_millis)) {
        Ok(j) => j,
        Err(e) => return error("invalid", e.to_string()),
    };
    match session.exec(&job, cwd.as_deref(), io).await {
        Ok(report) => SessionReply::Ran(Box::new(report)),
        Err(e) => run_error(&e),
    }
}
