//! E2B's API (`stockade serve --listen`) over stockade's sessions, so the official E2B SDKs
//! (Python and JavaScript, and the agent frameworks built on them) drive stockade
//! unmodified.
//!
//! One HTTP/1.1 listener answers both faces E2B splits between its API and each sandbox's
//! envd: the control plane (`POST /v2/sandboxes`, `GET /sandboxes/{id}`, `DELETE`, timeout,
//! pause, connect), authenticated by `X-API-Key`; and envd's Connect RPC services
//! (`process.Process`, `filesystem.Filesystem`) with `/files`, `/health` and `/envs`,
//! routed by the `E2b-Sandbox-Id` header and authenticated by that sandbox's own
//! `X-Access-Token`. A sandbox is one [`Session`]; a template names a session profile.
//!
//! # Threat model
//! Trusted: the host user who runs the server and writes its templates. Attacker-controlled:
//! every byte a client sends (it may hold the API key, or only one sandbox's token, or
//! nothing), and everything the code inside a sandbox does.
//!
//! # Guarantees
//! - The API key is compared in constant time; a sandbox's token is 32 random bytes, also
//!   compared in constant time, and opens that sandbox alone: another sandbox's id with it
//!   is `401`, an unknown id `404`.
//! - Off loopback it serves HTTPS only (rustls, TLS 1.2 and 1.3); the CLI refuses a
//!   non-loopback address without a certificate and key.
//! - Every request body is read under a cap before it is parsed (1 MiB for a Connect
//!   message, 64 KiB for a control-plane body, [`E2bLimits::max_upload`] for `/files`);
//!   a header section must arrive within 10 s (slow clients are cut off), connections,
//!   streams and sandboxes are capped (a connection counts against the connection cap once
//!   it authenticated; until then it is in a quarter-sized share that lets its oldest go
//!   and each go after 5 s, so an anonymous flood cannot lock clients out), and a create reserves its place under the sandbox
//!   cap before any work (racing creates cannot pass it). Every sandbox's home has the
//!   template's `disk` size ([`DEFAULT_DISK`] unless set), or the create fails naming why. A process-tier sandbox's download, and its
//!   `application/octet-stream` upload (what the SDK sends for a file-like object), stream
//!   between the socket and the file's descriptor through a bounded channel (a few 64 KiB
//!   pieces), at most [`MAX_STREAMED`] at once, each within 10 minutes, and a waiting client
//!   holds no thread; an upload cut short, late or over the cap writes nothing. Multipart
//!   bodies and a docker sandbox's files are held whole, at most [`MAX_TRANSFERS`] at once.
//! - A process's output reaches a slow client through bounded queues, with back-pressure
//!   to the guest: a stream holds [`STREAM_QUEUE`] events, and the exec's output log at most
//!   its history and [`stockade_runtime::session::LIVE_BYTES`] unread; past that the guest
//!   waits on its write, and the server's memory for a stream is a constant.
//! - A process started through the API ends at its `Connect-Timeout-Ms` deadline (the
//!   SDK's command timeout) or with its sandbox; a client that goes away mid-stream leaves
//!   nothing running past those. A sandbox ends at its timeout whether or not anyone calls.
//! - A kill (`SendSignal` with SIGKILL: the SDKs' `commands.kill`, `pty.kill`) answers once
//!   the process is reaped, so nothing after it finds the process, or after 5 s if it is
//!   slow to die.
//! - A client that closes its side of an authenticated connection (FIN or reset) ends that
//!   connection at once, and with it what the connection was streaming (a command's events,
//!   a directory watch and its inotify instance), not at the stream's next write; an
//!   unauthenticated connection costs the server one descriptor, not two.
//! - A request's `network.rules` are header secrets of the sandbox's grant: their values go
//!   to their hosts over HTTPS and never into the sandbox (masked in what comes back).
//! - A docker sandbox's port, metrics and watch reach its container through its init's pid
//!   only where this host's `/proc` shows that pid in the container's cgroup, checked again
//!   after each use.
//! - Files go through the session's descriptor-held files API (cap-std): no `..`, symlink
//!   or hard link reaches past the sandbox's home. Every files call runs off the async
//!   workers, and only a regular file is opened to be read (`O_NONBLOCK`, so a guest's
//!   fifo is refused at once), so no sandbox's files can stall another's API.
//! - A filesystem snapshot (`create_snapshot(mode="filesystem")`) is the session's own
//!   (bounded, never through a link), kept 0600 in a 0700 directory until deleted; a full
//!   one is refused by name, since stockade keeps no memory image.
//! - A Connect call speaks the codec its content type names: proto3's JSON mapping (what the
//!   SDKs send) or its binary encoding (connectrpc's default), read into the same types with
//!   the same refusals ([`stockade_protocol::e2b::Codec`]).
//!
//! # Non-guarantees
//! No compression but an upload's gzip; no file metadata in the docker tier, and no watch,
//! port or disk figure for a sandbox of a remote engine. A docker-tier template's
//! filesystem service runs inside its container with the image's own `stat`, `find`,
//! `mkdir`, `rm` and `mv`, so its image needs them (busybox's or GNU's).

mod code_interpreter;
mod config;
mod control;
mod filesystem;
mod hangup;
mod metrics;
mod ports;
mod process;
mod reply;
mod watch;

pub use config::{DEFAULT_DISK, E2bConfig, E2bLimits, Template, Tls};
pub use filesystem::{MAX_STREAMED, MAX_TRANSFERS};
pub use process::STREAM_QUEUE;

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use hyper::{Method, Request, Response, StatusCode};
use stockade_runtime::session::{Session, Sessions};

#[allow(clippy::wildcard_imports, reason = "the planes' helpers, one crate's own")]
use self::{config::*, control::*, filesystem::*, process::*, reply::*};

/// A response body: whole, or streamed.
pub(crate) type Body = BoxBody<Bytes, std::io::Error>;

/// The guest's home, where relative paths resolve.
pub(crate) const HOME: &str = "/home/user";

/// The one user a sandbox has.
pub(crate) const USER: &str = "user";

/// How long a connection may stay unauthenticated (no request with valid credentials yet):
/// a client sends its first request at once; a flood of idle connections is let go.
pub(crate) const ANONYMOUS_WITHIN: Duration = Duration::from_secs(5);

/// The unauthenticated share of the connection cap: one in this many of
/// [`E2bLimits::max_connections`] (256 of 1,024).
pub(crate) const ANONYMOUS_SHARE: usize = 4;

/// The connections not yet authenticated, oldest first, each with the signal that lets it go.
#[derive(Default)]
pub(crate) struct Anonymous {
    next: u64,
    waiting: std::collections::VecDeque<(u64, tokio::sync::oneshot::Sender<()>)>,
}

/// A connection's place among [`Anonymous`]: its id, and the signal that it was evicted.
pub(crate) struct Admitted {
    id: u64,
    evicted: tokio::sync::oneshot::Receiver<()>,
}

impl Anonymous {
    /// Admits a connection; past `share`, the oldest is evicted first.
    fn admit(&mut self, share: usize) -> Admitted {
        while self.waiting.len() >= share {
            match self.waiting.pop_front() {
                Some((_, evict)) => drop(evict.send(())),
                None => break,
            }
        }
        let id = self.next;
        self.next += 1;
        let (tx, evicted) = tokio::sync::oneshot::channel();
        self.waiting.push_back((id, tx));
        Admitted { id, evicted }
    }

    fn remove(&mut self, id: u64) {
        self.waiting.retain(|(i, _)| *i != id);
    }
}

/// One connection's standing: its id among [`Anonymous`], and once authenticated, its
/// place under the connection cap.
pub(crate) struct ConnState {
    id: u64,
    authed: Mutex<Option<tokio::sync::OwnedSemaphorePermit>>,
}

impl ConnState {
    fn is_authed(&self) -> bool {
        self.authed.lock().unwrap_or_else(PoisonError::into_inner).is_some()
    }
}

/// One sandbox: its session, token and timeout.
pub(crate) struct Sandbox {
    session: Arc<Session>,
    token: String,
    // The token a request to one of its ports presents (`ports`).
    traffic: String,
    template: String,
    metadata: BTreeMap<String, String>,
    env: BTreeMap<String, String>,
    started: SystemTime,
    memory_mb: u64,
    disk_mb: u64,
    end: Mutex<(Instant, SystemTime)>,
    // At its end, paused (the freezer, memory kept) rather than killed.
    auto_pause: bool,
    // A paused one is resumed by an envd call.
    auto_resume: bool,
    made: Instant,
    // Its usage over time, bounded (`metrics`).
    metrics: Mutex<metrics::MetricLog>,
    // Its directory watchers by id, polled and streamed (`watch`), and their places
    // (`watch::MAX_WATCHERS_PER_SANDBOX`), each taken before its watch is made.
    watchers: Mutex<HashMap<String, Arc<watch::Watcher>>>,
    watch_places: Arc<tokio::sync::Semaphore>,
    // Its network grant's scope (`allowOut`, `denyOut`), which `update_network` replaces;
    // none if its template grants no network.
    scope: Option<stockade_runtime::egress::NetScope>,
    // The `Host` its ports' requests carry (`maskRequestHost`, `${PORT}` in it).
    mask_host: Option<String>,
    // Its place under `max_sandboxes`, taken before it was made and given back with it.
    _slot: tokio::sync::OwnedSemaphorePermit,
}

impl Sandbox {
    fn set_timeout(&self, secs: u64) {
        let d = Duration::from_secs(secs);
        *self.end.lock().unwrap_or_else(PoisonError::into_inner) = (Instant::now() + d, SystemTime::now() + d);
    }

    /// Sets its end `secs` from now, if that is later than its end now.
    fn extend_timeout(&self, secs: u64) {
        let d = Duration::from_secs(secs);
        let mut end = self.end.lock().unwrap_or_else(PoisonError::into_inner);
        if Instant::now() + d > end.0 {
            *end = (Instant::now() + d, SystemTime::now() + d);
        }
    }

    /// Whether it answers traffic: a running sandbox does; a paused one does not, unless it
    /// resumes on traffic (then it is resumed, its time extended).
    async fn awake(&self) -> bool {
        if !self.session.paused() {
            return true;
        }
        if !self.auto_resume || self.session.resume().await.is_err() {
            return false;
        }
        self.extend_timeout(DEFAULT_TIMEOUT_SECS);
        true
    }

    fn watchers(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<watch::Watcher>>> {
        self.watchers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn end(&self) -> (Instant, SystemTime) {
        *self.end.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A sandbox's timeout when none is asked for, seconds (E2B's default).
pub(crate) const DEFAULT_TIMEOUT_SECS: u64 = 300;

/// The server ([`E2bServer::serve`]).
pub struct E2bServer {
    sessions: Arc<Sessions>,
    config: E2bConfig,
    boxes: Mutex<HashMap<String, Arc<Sandbox>>>,
    // `max_sandboxes` places: a create takes one before it starts (so concurrent creates
    // cannot all pass a count taken before any of them ended), and its sandbox holds it.
    slots: Arc<tokio::sync::Semaphore>,
    streams: Arc<tokio::sync::Semaphore>,
    // Connections whose client has authenticated (an API key, or a sandbox's token), up to
    // `max_connections`; and those that have not yet, a small share of their own.
    connections: Arc<tokio::sync::Semaphore>,
    anonymous: Mutex<Anonymous>,
    // Transfers through `/files` held whole in memory: at most this many at once.
    transfers: tokio::sync::Semaphore,
    // Streamed transfers through `/files`: at most this many at once.
    streamed: Arc<tokio::sync::Semaphore>,
    // Directory watchers in all (`watch::MAX_WATCHERS`).
    watch_slots: Arc<tokio::sync::Semaphore>,
    // Filesystem snapshots, oldest first.
    snapshots: Mutex<Vec<Snapshot>>,
}

impl std::fmt::Debug for E2bServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("E2bServer").finish_non_exhaustive()
    }
}

pub(crate) fn secs(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

impl E2bServer {
    /// A server over `sessions` (which it shares with the unix-socket API).
    #[must_use]
    pub fn new(sessions: Arc<Sessions>, config: E2bConfig) -> Arc<Self> {
        let streams = Arc::new(tokio::sync::Semaphore::new(config.limits.max_streams));
        let connections = Arc::new(tokio::sync::Semaphore::new(config.limits.max_connections));
        let transfers = tokio::sync::Semaphore::new(MAX_TRANSFERS);
        let slots = Arc::new(tokio::sync::Semaphore::new(config.limits.max_sandboxes));
        let snapshots = Mutex::new(config.snapshots.as_deref().map(load_snapshots).unwrap_or_default());
        Arc::new(Self {
            sessions,
            config,
            boxes: Mutex::new(HashMap::new()),
            slots,
            streams,
            connections,
            anonymous: Mutex::new(Anonymous::default()),
            transfers,
            streamed: Arc::new(tokio::sync::Semaphore::new(MAX_STREAMED)),
            watch_slots: Arc::new(tokio::sync::Semaphore::new(watch::MAX_WATCHERS)),
            snapshots,
        })
    }

    fn snapshots(&self) -> std::sync::MutexGuard<'_, Vec<Snapshot>> {
        self.snapshots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn boxes(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Sandbox>>> {
        self.boxes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Serves `listener` until the task is dropped; ends sandboxes at their timeouts.
    pub async fn serve(self: Arc<Self>, listener: tokio::net::TcpListener) {
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = tick.tick() => {
                    // Off the accept loop: a kill can take a while.
                    let me = Arc::clone(&self);
                    tokio::spawn(async move { me.reap().await });
                    continue;
                }
            };
            let Ok((conn, _)) = accepted else { continue };
            // A stream's events are small writes: without this, Nagle's algorithm holds each
            // behind the client's delayed ACK (40 ms a command).
            let _ = conn.set_nodelay(true);
            // Every connection starts unauthenticated, in its small share; past that share
            // the oldest unauthenticated one is let go, so a flood of idle connections
            // cycles among themselves and a real client's new one gets in.
            let admitted = self.admit();
            let me = Arc::clone(&self);
            let (hand_over, peer) = tokio::sync::oneshot::channel();
            tokio::spawn(async move {
                let conn_state = Arc::new(ConnState { id: admitted.id, authed: Mutex::new(None) });
                let evicted = admitted.evicted;
                let serving = async {
                    match me.config.tls.clone() {
                        None => {
                            let io = hangup::Watched::new(conn, Arc::clone(&conn_state), hand_over);
                            Arc::clone(&me).serve_io(io).await;
                        }
                        #[cfg(feature = "tls")]
                        Some(tls) => {
                            // The handshake is bounded like a request's headers.
                            let accept = tokio_rustls::TlsAcceptor::from(tls.0).accept(conn);
                            if let Ok(Ok(stream)) = tokio::time::timeout(Duration::from_secs(10), accept).await {
                                let io = hangup::Watched::new(stream, Arc::clone(&conn_state), hand_over);
                                Arc::clone(&me).serve_io(io).await;
                            }
                        }
                        #[cfg(not(feature = "tls"))]
                        Some(_) => {}
                    }
                };
                // Unauthenticated, a connection has ANONYMOUS_WITHIN in all, and ends when it
                // is evicted; once authenticated, neither applies.
                let watch_auth = async {
                    let deadline = tokio::time::sleep(ANONYMOUS_WITHIN);
                    tokio::pin!(deadline);
                    tokio::select! {
                        () = &mut deadline => {}
                        _ = evicted => {}
                    }
                    if conn_state.is_authed() {
                        std::future::pending::<()>().await;
                    }
                };
                tokio::select! {
                    () = serving => {}
                    () = watch_auth => {}
                    () = hangup::peer_closed(peer) => {}
                }
                me.anonymous().remove(admitted.id);
            });
        }
    }

    fn anonymous(&self) -> std::sync::MutexGuard<'_, Anonymous> {
        self.anonymous.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new connection's place among the unauthenticated ones (evicting the oldest past
    /// [`E2bLimits::max_connections`]' anonymous share).
    fn admit(&self) -> Admitted {
        let share = (self.config.limits.max_connections / ANONYMOUS_SHARE).max(1);
        self.anonymous().admit(share)
    }

    /// Moves the connection `conn` out of the unauthenticated share, into the authenticated
    /// cap; `false` if that cap is full (the request is refused, 503).
    fn authenticate(&self, conn: &ConnState) -> bool {
        if conn.is_authed() {
            return true;
        }
        let Ok(permit) = Arc::clone(&self.connections).try_acquire_owned() else { return false };
        *conn.authed.lock().unwrap_or_else(PoisonError::into_inner) = Some(permit);
        self.anonymous().remove(conn.id);
        true
    }

    /// Whether `req` carries valid credentials: the API key, or a live sandbox's id and
    /// token (each compared in constant time, as the handlers compare them again).
    fn credentials(&self, req: &Request<hyper::body::Incoming>) -> bool {
        let h = req.headers();
        if header(h, "x-api-key").is_some_and(|k| constant_eq(k, &self.config.api_key)) {
            return true;
        }
        let (Some(id), Some(token)) = (header(h, "e2b-sandbox-id"), header(h, "x-access-token")) else {
            return false;
        };
        self.sandbox(id).is_some_and(|b| constant_eq(token, &b.token))
    }

    /// Serves one connection's requests; the first with valid credentials moves it into
    /// the authenticated cap.
    async fn serve_io<I: hangup::Socket>(self: Arc<Self>, io: hangup::Watched<I>) {
        let conn = io.conn();
        let service = hyper::service::service_fn(move |req| {
            let (me, conn) = (Arc::clone(&self), Arc::clone(&conn));
            async move {
                if me.credentials(&req) && !me.authenticate(&conn) {
                    let busy = api_error(StatusCode::SERVICE_UNAVAILABLE, "the server's connections are all in use");
                    return Ok::<_, Infallible>(busy);
                }
                Ok::<_, Infallible>(me.handle(req).await)
            }
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(Duration::from_secs(10))
            .max_buf_size(64 << 10)
            .serve_connection(hyper_util::rt::TokioIo::new(io), service)
            .await;
    }

    /// Kills sandboxes past their timeout, and forgets those whose session ended.
    async fn reap(&self) {
        let now = Instant::now();
        // A paused sandbox keeps until it is killed or its session's lifetime ends (E2B's
        // paused sandboxes persist); one that auto-pauses is paused at its end.
        let (mut pause, mut kill) = (Vec::new(), Vec::new());
        for (id, b) in self.boxes().iter() {
            if self.sessions.get(id).is_none() {
                kill.push(id.clone());
            } else if b.end().0 <= now && !b.session.paused() {
                if b.auto_pause { pause.push(Arc::clone(b)) } else { kill.push(id.clone()) }
            }
        }
        for b in pause {
            if b.session.pause().await.is_err() {
                let id = b.session.id().to_owned();
                self.boxes().remove(&id);
                let _ = self.sessions.kill(&id).await;
            }
        }
        for id in kill {
            self.boxes().remove(&id);
            let _ = self.sessions.kill(&id).await;
        }
        let live: Vec<Arc<Sandbox>> = self.boxes().values().cloned().collect();
        for b in live {
            b.sample(b.made, false).await;
        }
    }

    async fn handle(self: &Arc<Self>, req: Request<hyper::body::Incoming>) -> Response<Body> {
        // A request for one of a sandbox's ports (by `E2b-Sandbox-Port`, or a host name
        // `PORT-ID.…`) goes to it; envd's own port is served here.
        if let Some((id, port)) = ports::routed(&req)
            && port != ports::ENVD_PORT
        {
            return self.port(req, &id, port).await;
        }
        let path = req.uri().path().to_owned();
        let method = req.method().clone();
        if path == "/health" {
            // Through E2B's proxy, a sandbox that is gone answers 502 "... was not found".
            // A paused one is not running either (its envd does not answer).
            return match header(req.headers(), "e2b-sandbox-id") {
                Some(id) if self.sandbox(id).is_none_or(|b| b.session.paused()) => not_running(id),
                _ => no_content(),
            };
        }
        if path.starts_with("/process.Process/")
            || path.starts_with("/filesystem.Filesystem/")
            || path == "/files"
            || path == "/envs"
        {
            return self.envd(req, &path).await;
        }
        // The control plane.
        let key = header(req.headers(), "x-api-key").unwrap_or_default();
        if !constant_eq(key, &self.config.api_key) {
            return api_error(StatusCode::UNAUTHORIZED, "a missing or wrong API key (X-API-Key)");
        }
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        let parts: &[&str] = match parts.as_slice() {
            ["v2", rest @ ..] => rest,
            all => all,
        };
        match (&method, parts) {
            (&Method::POST, ["sandboxes"]) => self.create(req).await,
            (&Method::GET, ["sandboxes"]) => self.list(&req),
            (&Method::GET, ["sandboxes", id]) => match self.sandbox(id) {
                Some(b) => json(StatusCode::OK, &self.detail(id, &b)),
                None => api_error(StatusCode::NOT_FOUND, &format!("sandbox {id} not found")),
            },
            (&Method::DELETE, ["sandboxes", id]) => {
                let removed = self.boxes().remove(*id);
                match removed {
                    Some(_) => {
                        let _ = self.sessions.kill(id).await;
                        no_content()
                    }
                    None => api_error(StatusCode::NOT_FOUND, &format!("sandbox {id} not found")),
                }
            }
            (&Method::POST, ["sandboxes", id, "snapshots"]) => {
                let id = (*id).to_owned();
                self.snapshot(&id, req).await
            }
            (&Method::GET, ["snapshots"]) => self.list_snapshots(&req),
            (&Method::GET, ["sandboxes", id, "metrics"]) => self.metrics(id, &req).await,
            (&Method::DELETE, ["templates", id]) => self.delete_snapshot(id),
            (&Method::POST, ["sandboxes", id, op @ ("timeout" | "refreshes" | "pause" | "resume" | "connect")]) => {
                let id = (*id).to_owned();
                let op = (*op).to_owned();
                self.lifecycle(&id, &op, req).await
            }
            (&Method::PUT, ["sandboxes", id, "network"]) => {
                let id = (*id).to_owned();
                self.update_network(&id, req).await
            }
            (_, ["sandboxes", ..]) => api_error(
                StatusCode::NOT_IMPLEMENTED,
                &format!("{method} {path}: stockade does not offer this (no forks or logs)"),
            ),
            _ => api_error(StatusCode::NOT_FOUND, &format!("{method} {path}: no such route")),
        }
    }

    fn sandbox(&self, id: &str) -> Option<Arc<Sandbox>> {
        self.boxes().get(id).cloned()
    }
}
