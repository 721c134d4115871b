//! `stockade serve --listen`: E2B's API over stockade's sessions, so the official E2B SDKs
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
//! No compression, no directory watch, no file metadata. A docker-tier template's
//! filesystem service runs inside its container with the image's own `stat`, `find`,
//! `mkdir`, `rm` and `mv`, so its image needs them (busybox's or GNU's).

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{CONTENT_TYPE, HeaderMap};
use hyper::{Method, Request, Response, StatusCode};
use stockade_protocol::e2b::{self as wire, Code, Codec, ConnectError, ProcessEvent, Shape};
use stockade_runtime::protocol::{Limits, RunError, Status};
use stockade_runtime::session::{
    Background, Chunk, FilesError, Kind, Session, SessionProfile, SessionTier, Sessions, StartOptions, exec_job,
};
use subtle::ConstantTimeEq;

type Body = BoxBody<Bytes, std::io::Error>;

/// The guest's home, where relative paths resolve.
const HOME: &str = "/home/user";

/// Most `/files` transfers held whole in memory at once (multipart uploads, and a docker
/// sandbox's files), so the server holds at most this many times [`E2bLimits::max_upload`];
/// more wait for one to end. Streamed transfers do not count.
pub const MAX_TRANSFERS: usize = 4;

/// The one user a sandbox has.
const USER: &str = "user";

/// Bounds of one server.
#[derive(Debug, Clone)]
pub struct E2bLimits {
    /// Most live sandboxes.
    pub max_sandboxes: usize,
    /// Most open connections.
    pub max_connections: usize,
    /// Most streams (Start, Connect) at once.
    pub max_streams: usize,
    /// Largest upload or download through `/files`.
    pub max_upload: u64,
    /// Most snapshots kept (each at most [`stockade_runtime::session::MAX_SNAPSHOT_BYTES`]).
    pub max_snapshots: usize,
}

impl Default for E2bLimits {
    fn default() -> Self {
        Self { max_sandboxes: 64, max_connections: 1024, max_streams: 256, max_upload: 256 << 20, max_snapshots: 64 }
    }
}

/// One filesystem snapshot: its archive, the template it is made on, and who it came from.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Snapshot {
    id: String,
    names: Vec<String>,
    template: String,
    sandbox: String,
    made: u64,
}

/// Most items one page of a list holds, and the default.
const MAX_PAGE: usize = 100;

/// A template: what a sandbox made from it is.
#[derive(Debug, Clone)]
pub struct Template {
    /// The tier.
    pub tier: SessionTier,
    /// Memory and processes for the whole sandbox.
    pub limits: Limits,
    /// The longest timeout a sandbox may ask for.
    pub max_timeout: Duration,
    /// Hosts the sandbox may reach (`--allow-net` entries); empty: no network.
    pub allow_net: Vec<String>,
    /// Names pinned to addresses (`--net-resolve` entries).
    pub net_resolve: Vec<String>,
    /// Its environment.
    pub env: Vec<(String, String)>,
    /// The size of its home, in bytes ([`DEFAULT_DISK`] unless `disk` says otherwise):
    /// untrusted code fills at most this much of the host. Where the host cannot enforce it
    /// (a process-tier home is a tmpfs only root mounts), a create fails and says so.
    pub disk: u64,
}

/// A template's home size when its `disk` is not set: 1 GiB.
pub const DEFAULT_DISK: u64 = 1 << 30;

impl Default for Template {
    fn default() -> Self {
        Self {
            tier: SessionTier::Process,
            limits: Limits::default(),
            max_timeout: Duration::from_secs(3600),
            allow_net: Vec::new(),
            net_resolve: Vec::new(),
            env: Vec::new(),
            disk: DEFAULT_DISK,
        }
    }
}

/// The server's configuration: its key, templates (`base` is the SDK's default), bounds and
/// TLS.
#[derive(Debug, Clone)]
pub struct E2bConfig {
    /// The API key clients present (`X-API-Key`).
    pub api_key: String,
    /// Templates by name.
    pub templates: BTreeMap<String, Template>,
    /// Bounds.
    pub limits: E2bLimits,
    /// Serve HTTPS with this certificate and key ([`Tls::from_pem`]); without it, plain HTTP.
    pub tls: Option<Tls>,
    /// Where filesystem snapshots are kept (made 0700; each snapshot a 0600 archive and a
    /// record beside it), so that they outlive their sandbox and the server; without it,
    /// snapshots are refused.
    pub snapshots: Option<PathBuf>,
}

/// A server certificate chain and key for HTTPS (rustls with ring; HTTP/1.1 by ALPN).
#[derive(Clone)]
pub struct Tls(#[cfg(feature = "tls")] Arc<rustls::ServerConfig>, #[cfg(not(feature = "tls"))] ());

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls(..)")
    }
}

impl Tls {
    /// The chain (leaf first) and private key, both PEM.
    pub fn from_pem(chain: &[u8], key: &[u8]) -> Result<Self, String> {
        #[cfg(feature = "tls")]
        {
            use rustls::pki_types::pem::PemObject as _;
            use rustls::pki_types::{CertificateDer, PrivateKeyDer};
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(chain)
                .collect::<Result<_, _>>()
                .map_err(|e| format!("the certificate file: {e}"))?;
            if certs.is_empty() {
                return Err("the certificate file holds no certificate".into());
            }
            let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| format!("the key file: {e}"))?;
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let mut config = rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?
                .with_no_client_auth()
                .with_single_cert(certs, key)
                .map_err(|e| format!("the certificate and key: {e}"))?;
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            Ok(Self(Arc::new(config)))
        }
        #[cfg(not(feature = "tls"))]
        {
            let _ = (chain, key);
            Err("this build has no TLS (the `tls` feature)".into())
        }
    }
}

/// How long a connection may stay unauthenticated (no request with valid credentials yet):
/// a client sends its first request at once; a flood of idle connections is let go.
const ANONYMOUS_WITHIN: Duration = Duration::from_secs(5);

/// The unauthenticated share of the connection cap: one in this many of
/// [`E2bLimits::max_connections`] (256 of 1,024).
const ANONYMOUS_SHARE: usize = 4;

/// The connections not yet authenticated, oldest first, each with the signal that lets it go.
#[derive(Default)]
struct Anonymous {
    next: u64,
    waiting: std::collections::VecDeque<(u64, tokio::sync::oneshot::Sender<()>)>,
}

/// A connection's place among [`Anonymous`]: its id, and the signal that it was evicted.
struct Admitted {
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
struct ConnState {
    id: u64,
    authed: Mutex<Option<tokio::sync::OwnedSemaphorePermit>>,
}

impl ConnState {
    fn is_authed(&self) -> bool {
        self.authed.lock().unwrap_or_else(PoisonError::into_inner).is_some()
    }
}

/// One sandbox: its session, token and timeout.
struct Sandbox {
    session: Arc<Session>,
    token: String,
    template: String,
    metadata: BTreeMap<String, String>,
    env: BTreeMap<String, String>,
    started: SystemTime,
    memory_mb: u64,
    disk_mb: u64,
    end: Mutex<(Instant, SystemTime)>,
    // Its place under `max_sandboxes`, taken before it was made and given back with it.
    _slot: tokio::sync::OwnedSemaphorePermit,
}

impl Sandbox {
    fn set_timeout(&self, secs: u64) {
        let d = Duration::from_secs(secs);
        *self.end.lock().unwrap_or_else(PoisonError::into_inner) = (Instant::now() + d, SystemTime::now() + d);
    }

    fn end(&self) -> (Instant, SystemTime) {
        *self.end.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

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
    // Filesystem snapshots, oldest first.
    snapshots: Mutex<Vec<Snapshot>>,
}

impl std::fmt::Debug for E2bServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("E2bServer").finish_non_exhaustive()
    }
}

fn secs(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

fn whole(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Full::new(body.into()).map_err(|never| match never {}).boxed());
    *r.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(CONTENT_TYPE, v);
    }
    r
}

fn json(status: StatusCode, v: &impl serde::Serialize) -> Response<Body> {
    whole(status, "application/json", serde_json::to_vec(v).unwrap_or_default())
}

/// A control-plane error, `{"code": N, "message": "..."}`.
fn api_error(status: StatusCode, message: &str) -> Response<Body> {
    json(status, &wire::api_error(status.as_u16(), message))
}

/// What E2B's proxy answers for a sandbox that is not running: 502, "... was not found"
/// (the SDKs raise `SandboxNotRunningException` on it, and `is_running()` is false).
fn not_running(id: &str) -> Response<Body> {
    api_error(StatusCode::BAD_GATEWAY, &format!("the sandbox {id:?} was not found"))
}

/// A unary Connect error: the code's HTTP status and its JSON.
fn rpc_error(e: &ConnectError) -> Response<Body> {
    let status = StatusCode::from_u16(e.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json(status, &e.to_json())
}

fn no_content() -> Response<Body> {
    whole(StatusCode::NO_CONTENT, "text/plain", Bytes::new())
}

/// A runtime error as a Connect error.
fn run_code(e: &RunError) -> ConnectError {
    let code = match e {
        RunError::Busy(_) => Code::ResourceExhausted,
        RunError::Unsupported { .. } => Code::Unimplemented,
        // The session, or the process, ended since the call looked it up.
        RunError::Ended(_) => Code::NotFound,
        RunError::Misconfigured(_) => Code::FailedPrecondition,
        _ => Code::Internal,
    };
    ConnectError::new(code, e.to_string())
}

/// The running process a selector names (a pid, or the tag of a running one): `not_found`
/// for one the sandbox never started through the API or one that has ended, as envd says.
fn running_exec(s: &Session, sel: &wire::ProcessSelector) -> Result<Arc<Background>, ConnectError> {
    let found = match sel {
        wire::ProcessSelector::Pid(p) => s.find(*p).ok(),
        wire::ProcessSelector::Tag(t) => {
            s.background().into_iter().find(|x| x.running() && x.tag() == Some(t.as_str()))
        }
    };
    found.filter(|x| x.running()).ok_or_else(|| {
        let which = match sel {
            wire::ProcessSelector::Pid(p) => format!("pid {p}"),
            wire::ProcessSelector::Tag(t) => format!("tag {t:?}"),
        };
        ConnectError::new(Code::NotFound, format!("no running process has {which}"))
    })
}

/// A files error as a Connect error.
fn files_code(e: &FilesError) -> ConnectError {
    let code = match e {
        FilesError::NotFound(_) => Code::NotFound,
        FilesError::Invalid { .. } => Code::InvalidArgument,
        FilesError::Denied { .. } => Code::PermissionDenied,
        FilesError::TooLarge { .. } => Code::ResourceExhausted,
        FilesError::Io { source, .. } if source.kind() == std::io::ErrorKind::AlreadyExists => Code::AlreadyExists,
        FilesError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotADirectory => Code::InvalidArgument,
        _ => Code::Internal,
    };
    ConnectError::new(code, e.to_string())
}

/// The guest's path for a request's: relative paths are under the home, `~` is the home.
fn guest_path(p: &str) -> String {
    if p.is_empty() || p == "~" {
        HOME.to_owned()
    } else if let Some(rest) = p.strip_prefix("~/") {
        format!("{HOME}/{rest}")
    } else if p.starts_with('/') {
        p.to_owned()
    } else {
        format!("{HOME}/{p}")
    }
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

fn constant_eq(a: &str, b: &str) -> bool {
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// The user a request names (`Authorization: Basic base64(user:)` or `?username=`): only
/// the sandbox's one user is accepted.
fn check_user(name: Option<&str>) -> Result<(), ConnectError> {
    match name {
        None | Some("" | USER) => Ok(()),
        Some(other) => Err(ConnectError::new(
            Code::InvalidArgument,
            format!("user {other:?}: a stockade sandbox runs everything as its one unprivileged user ({USER:?})"),
        )),
    }
}

fn basic_user(h: &HeaderMap) -> Option<String> {
    let v = header(h, "authorization")?.strip_prefix("Basic ")?;
    let raw = base64::engine::general_purpose::STANDARD.decode(v.trim()).ok()?;
    let text = String::from_utf8(raw).ok()?;
    Some(text.split_once(':').map_or(text.clone(), |(u, _)| u.to_owned()))
}

fn query(req: &Request<hyper::body::Incoming>) -> HashMap<String, String> {
    req.uri().query().map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect()).unwrap_or_default()
}

/// How long a request body (but an upload's) may take to arrive: a client that trickles one
/// is cut off.
const BODY_WITHIN: Duration = Duration::from_secs(30);

/// How long one `/files` transfer (an upload's body, or a streamed download) may take.
const TRANSFER_WITHIN: Duration = Duration::from_secs(600);

/// Reads a body of at most `max` bytes that arrives within `within`.
async fn read_body_within(body: hyper::body::Incoming, max: usize, within: Duration) -> Result<Bytes, String> {
    match tokio::time::timeout(within, Limited::new(body, max).collect()).await {
        Err(_) => Err(format!("the body did not arrive within {within:?}")),
        Ok(Ok(c)) => Ok(c.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            Err(format!("the body is over the {max}-byte limit"))
        }
        Ok(Err(e)) => Err(format!("reading the body: {e}")),
    }
}

/// Reads a body of at most `max` bytes that arrives within [`BODY_WITHIN`].
async fn read_body(body: hyper::body::Incoming, max: usize) -> Result<Bytes, String> {
    read_body_within(body, max, BODY_WITHIN).await
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
            tokio::spawn(async move {
                let conn_state = Arc::new(ConnState { id: admitted.id, authed: Mutex::new(None) });
                let evicted = admitted.evicted;
                let serving = async {
                    match me.config.tls.clone() {
                        None => Arc::clone(&me).serve_io(conn, Arc::clone(&conn_state)).await,
                        #[cfg(feature = "tls")]
                        Some(tls) => {
                            // The handshake is bounded like a request's headers.
                            let accept = tokio_rustls::TlsAcceptor::from(tls.0).accept(conn);
                            if let Ok(Ok(stream)) = tokio::time::timeout(Duration::from_secs(10), accept).await {
                                Arc::clone(&me).serve_io(stream, Arc::clone(&conn_state)).await;
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
    async fn serve_io<I>(self: Arc<Self>, io: I, conn: Arc<ConnState>)
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
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
        let due: Vec<String> = self
            .boxes()
            .iter()
            .filter(|(id, b)| b.end().0 <= now || self.sessions.get(id).is_none())
            .map(|(id, _)| id.clone())
            .collect();
        for id in due {
            self.boxes().remove(&id);
            let _ = self.sessions.kill(&id).await;
        }
    }

    async fn handle(self: &Arc<Self>, req: Request<hyper::body::Incoming>) -> Response<Body> {
        let path = req.uri().path().to_owned();
        let method = req.method().clone();
        if path == "/health" {
            // Through E2B's proxy, a sandbox that is gone answers 502 "... was not found".
            return match header(req.headers(), "e2b-sandbox-id") {
                Some(id) if self.sandbox(id).is_none() => not_running(id),
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
            (&Method::DELETE, ["templates", id]) => self.delete_snapshot(id),
            (&Method::POST, ["sandboxes", id, op @ ("timeout" | "refreshes" | "pause" | "resume" | "connect")]) => {
                let id = (*id).to_owned();
                let op = (*op).to_owned();
                self.lifecycle(&id, &op, req).await
            }
            (_, ["sandboxes", ..]) => api_error(
                StatusCode::NOT_IMPLEMENTED,
                &format!(
                    "{method} {path}: stockade does not offer this (no forks, logs, metrics or network updates yet)"
                ),
            ),
            _ => api_error(StatusCode::NOT_FOUND, &format!("{method} {path}: no such route")),
        }
    }

    fn sandbox(&self, id: &str) -> Option<Arc<Sandbox>> {
        self.boxes().get(id).cloned()
    }

    fn detail(&self, id: &str, b: &Sandbox) -> wire::SandboxDetail {
        wire::SandboxDetail {
            template_id: b.template.clone(),
            sandbox_id: id.to_owned(),
            client_id: "stockade".into(),
            started_at: wire::rfc3339(secs(b.started)),
            end_at: wire::rfc3339(secs(b.end().1)),
            cpu_count: 1,
            memory_mb: b.memory_mb,
            disk_size_mb: b.disk_mb,
            state: if b.session.paused() { "paused".into() } else { "running".into() },
            envd_version: wire::ENVD_VERSION.into(),
            metadata: b.metadata.clone(),
        }
    }

    fn created(&self, id: &str, b: &Sandbox) -> wire::SandboxCreated {
        wire::SandboxCreated {
            template_id: b.template.clone(),
            sandbox_id: id.to_owned(),
            client_id: "stockade".into(),
            envd_version: wire::ENVD_VERSION.into(),
            envd_access_token: b.token.clone(),
        }
    }

    fn list(&self, req: &Request<hyper::body::Incoming>) -> Response<Body> {
        let q = query(req);
        let states: Option<Vec<String>> = q.get("state").map(|s| s.split(',').map(str::to_owned).collect());
        let wanted: Vec<(String, String)> =
            q.get("metadata").map(|m| form_urlencoded::parse(m.as_bytes()).into_owned().collect()).unwrap_or_default();
        let all: Vec<(String, Arc<Sandbox>)> = self.boxes().iter().map(|(k, v)| (k.clone(), Arc::clone(v))).collect();
        let out: Vec<(String, wire::SandboxDetail)> = all
            .iter()
            .map(|(id, b)| (page_key(b.started, id), self.detail(id, b)))
            .filter(|(_, d)| states.as_ref().is_none_or(|s| s.contains(&d.state)))
            .filter(|(_, d)| wanted.iter().all(|(k, v)| d.metadata.get(k) == Some(v)))
            .collect();
        page(&q, out)
    }

    /// `POST /sandboxes/{id}/snapshots`: a filesystem-only snapshot of the sandbox's home,
    /// kept under [`E2bConfig::snapshots`] until deleted; `Sandbox.create(snapshot_id)` (or
    /// its name) makes a sandbox of the same template whose home starts as this one's is now.
    async fn snapshot(&self, id: &str, req: Request<hyper::body::Incoming>) -> Response<Body> {
        let (b, r) = match self.sandbox_request::<wire::SnapshotRequest>(id, req).await {
            Ok(x) => x,
            Err(response) => return response,
        };
        if r.memory != Some(false) {
            return api_error(
                StatusCode::BAD_REQUEST,
                "a full snapshot (memory and running processes): stockade takes filesystem-only snapshots; pass mode=\"filesystem\"",
            );
        }
        let Some(dir) = self.config.snapshots.clone() else {
            return api_error(
                StatusCode::NOT_IMPLEMENTED,
                "this server keeps no snapshots (it has no snapshot directory)",
            );
        };
        if let Some(name) = &r.name {
            if let Err(e) = snapshot_name(name) {
                return api_error(StatusCode::BAD_REQUEST, &e);
            }
            if self.config.templates.contains_key(name) {
                return api_error(StatusCode::CONFLICT, &format!("snapshot name {name:?}: a template has that name"));
            }
        }
        if self.snapshots().len() >= self.config.limits.max_snapshots {
            return api_error(
                StatusCode::TOO_MANY_REQUESTS,
                &format!("{} snapshots are kept, the most this server keeps", self.config.limits.max_snapshots),
            );
        }
        let mut raw = [0u8; 8];
        if getrandom::fill(&mut raw).is_err() {
            return api_error(StatusCode::INTERNAL_SERVER_ERROR, "no randomness for the snapshot's id");
        }
        let snap = Snapshot {
            id: format!("snapshot-{}", raw.iter().map(|b| format!("{b:02x}")).collect::<String>()),
            names: r.name.into_iter().collect(),
            template: b.template.clone(),
            sandbox: id.to_owned(),
            made: u64::try_from(secs(SystemTime::now())).unwrap_or(0),
        };
        let archive = dir.join(format!("{}.tar", snap.id));
        if let Err(e) = b.session.snapshot(&archive).await {
            let _ = std::fs::remove_file(&archive);
            return api_error(StatusCode::INTERNAL_SERVER_ERROR, &format!("snapshot of sandbox {id}: {e}"));
        }
        if let Err(e) = save_snapshot(&dir, &snap) {
            let _ = std::fs::remove_file(&archive);
            return api_error(StatusCode::INTERNAL_SERVER_ERROR, &format!("recording snapshot {}: {e}", snap.id));
        }
        let out = wire::SnapshotInfo { snapshot_id: snap.id.clone(), names: snap.names.clone() };
        self.snapshots().push(snap);
        json(StatusCode::CREATED, &out)
    }

    /// `GET /snapshots`: the snapshots kept, oldest first, by source sandbox (`sandboxID`)
    /// or `name` if asked, a page at a time.
    fn list_snapshots(&self, req: &Request<hyper::body::Incoming>) -> Response<Body> {
        let q = query(req);
        let out: Vec<(String, wire::SnapshotInfo)> = self
            .snapshots()
            .iter()
            .filter(|s| q.get("sandboxID").is_none_or(|id| *id == s.sandbox))
            .filter(|s| q.get("name").is_none_or(|n| s.names.contains(n)))
            .map(|s| {
                let key = page_key(SystemTime::UNIX_EPOCH + Duration::from_secs(s.made), &s.id);
                (key, wire::SnapshotInfo { snapshot_id: s.id.clone(), names: s.names.clone() })
            })
            .collect();
        page(&q, out)
    }

    /// `DELETE /templates/{id}`: a snapshot, its archive and its record.
    fn delete_snapshot(&self, id: &str) -> Response<Body> {
        if self.config.templates.contains_key(id) {
            return api_error(
                StatusCode::BAD_REQUEST,
                &format!("template {id:?} is this server's configuration (--config), not a snapshot"),
            );
        }
        let removed = {
            let mut all = self.snapshots();
            all.iter().position(|s| s.id == id).map(|i| all.remove(i))
        };
        match (removed, &self.config.snapshots) {
            (Some(s), Some(dir)) => {
                let _ = std::fs::remove_file(dir.join(format!("{}.tar", s.id)));
                let _ = std::fs::remove_file(dir.join(format!("{}.json", s.id)));
                no_content()
            }
            _ => api_error(StatusCode::NOT_FOUND, &format!("snapshot {id} not found")),
        }
    }

    /// A template by name, or a snapshot by id or name (the newest of that name): the
    /// template's name and the archive a new home starts from.
    fn resolve_template(&self, name: &str) -> Option<(String, Option<PathBuf>)> {
        if self.config.templates.contains_key(name) {
            return Some((name.to_owned(), None));
        }
        let dir = self.config.snapshots.as_ref()?;
        let all = self.snapshots();
        let s = all
            .iter()
            .find(|s| s.id == name)
            .or_else(|| all.iter().rev().find(|s| s.names.iter().any(|n| n == name)))?;
        Some((s.template.clone(), Some(dir.join(format!("{}.tar", s.id)))))
    }

    async fn create(self: &Arc<Self>, req: Request<hyper::body::Incoming>) -> Response<Body> {
        let body = match read_body(req.into_body(), wire::MAX_API_BYTES).await {
            Ok(b) => b,
            Err(e) => return api_error(StatusCode::BAD_REQUEST, &e),
        };
        let new: wire::NewSandbox = match wire::parse_api(&body) {
            Ok(n) => n,
            Err(e) => return api_error(StatusCode::BAD_REQUEST, &format!("the sandbox request: {e}")),
        };
        let resolved = self.resolve_template(&new.template_id);
        let Some((template_name, template, from_snapshot)) =
            resolved.and_then(|(n, from)| self.config.templates.get(&n).map(|t| (n, t, from)))
        else {
            let names: Vec<&str> = self.config.templates.keys().map(String::as_str).collect();
            return api_error(
                StatusCode::NOT_FOUND,
                &format!(
                    "template {:?} not found (this server has: {}, and the snapshots GET /snapshots lists)",
                    new.template_id,
                    names.join(", ")
                ),
            );
        };
        let refused = |what: &str| api_error(StatusCode::BAD_REQUEST, &format!("{what}: stockade does not offer it"));
        if new.auto_pause == Some(true) {
            return refused("autoPause");
        }
        if new.auto_resume.is_some() {
            return refused("autoResume");
        }
        if new.mcp.as_ref().is_some_and(|v| !v.is_null()) {
            return refused("mcp");
        }
        if new.iam.is_some() {
            return refused("iam");
        }
        if new.volume_mounts.as_ref().is_some_and(|v| v.as_array().is_none_or(|a| !a.is_empty())) {
            return refused("volumeMounts");
        }
        let timeout = new.timeout.unwrap_or(300);
        if timeout == 0 || Duration::from_secs(timeout) > template.max_timeout {
            return api_error(
                StatusCode::BAD_REQUEST,
                &format!("timeout {timeout}s: must be 1 to {}s for this template", template.max_timeout.as_secs()),
            );
        }
        // The place is reserved before any work, and kept by the sandbox, or given back
        // (dropped) on any failure below.
        let Ok(slot) = Arc::clone(&self.slots).try_acquire_owned() else {
            return api_error(
                StatusCode::TOO_MANY_REQUESTS,
                &format!("{} sandboxes are live, the most this server keeps", self.config.limits.max_sandboxes),
            );
        };
        let grants = match net_grant(template, &new) {
            Ok(g) => g,
            Err(e) => return api_error(StatusCode::BAD_REQUEST, &e),
        };
        let mut env = template.env.clone();
        env.extend(new.env_vars.iter().map(|(k, v)| (k.clone(), v.clone())));
        let profile = SessionProfile {
            tier: template.tier.clone(),
            limits: template.limits,
            // The sandbox's own timeout ends it (the reaper); these are the template's cap.
            idle_timeout: template.max_timeout,
            max_lifetime: template.max_timeout,
            grants: grants.map(|g| Arc::new(stockade_runtime::Grants::new().net(g))),
            env,
            from_snapshot,
            home_bytes: Some(template.disk),
            ..SessionProfile::default()
        };
        let session = match self.sessions.create(profile).await {
            Ok(s) => s,
            Err(e) => {
                let status = match e {
                    RunError::Busy(_) => StatusCode::TOO_MANY_REQUESTS,
                    RunError::Unsupported { .. } | RunError::Misconfigured(_) => StatusCode::BAD_REQUEST,
                    _ => StatusCode::INTERNAL_SERVER_ERROR,
                };
                return api_error(status, &format!("creating the sandbox: {e}"));
            }
        };
        let id = session.id().to_owned();
        let mut token = [0u8; 32];
        if getrandom::fill(&mut token).is_err() {
            let _ = self.sessions.kill(&id).await;
            return api_error(StatusCode::INTERNAL_SERVER_ERROR, "no randomness for the access token");
        }
        let now = (Instant::now(), SystemTime::now());
        let b = Arc::new(Sandbox {
            session,
            token: token.iter().map(|b| format!("{b:02x}")).collect(),
            template: template_name,
            metadata: new.metadata,
            env: new.env_vars,
            started: now.1,
            memory_mb: template.limits.memory_bytes() >> 20,
            disk_mb: template.disk >> 20,
            end: Mutex::new(now),
            _slot: slot,
        });
        b.set_timeout(timeout);
        let out = self.created(&id, &b);
        self.boxes().insert(id, b);
        json(StatusCode::CREATED, &out)
    }

    /// A control-plane call on one sandbox: the sandbox, and its body (empty: the default).
    async fn sandbox_request<T: serde::de::DeserializeOwned + Default>(
        &self,
        id: &str,
        req: Request<hyper::body::Incoming>,
    ) -> Result<(Arc<Sandbox>, T), Response<Body>> {
        let Some(b) = self.sandbox(id) else {
            return Err(api_error(StatusCode::NOT_FOUND, &format!("sandbox {id} not found")));
        };
        let body = read_body(req.into_body(), wire::MAX_API_BYTES)
            .await
            .map_err(|e| api_error(StatusCode::BAD_REQUEST, &e))?;
        if body.is_empty() {
            return Ok((b, T::default()));
        }
        let t = wire::parse_api(&body).map_err(|e| api_error(StatusCode::BAD_REQUEST, &format!("the request: {e}")))?;
        Ok((b, t))
    }

    async fn lifecycle(&self, id: &str, op: &str, req: Request<hyper::body::Incoming>) -> Response<Body> {
        let (b, t) = match self.sandbox_request::<wire::TimeoutRequest>(id, req).await {
            Ok(x) => x,
            Err(response) => return response,
        };
        let max = self.config.templates.get(&b.template).map_or(Duration::from_secs(3600), |t| t.max_timeout);
        if let Some(s) = t.timeout
            && (s == 0 || Duration::from_secs(s) > max)
        {
            return api_error(StatusCode::BAD_REQUEST, &format!("timeout {s}s: must be 1 to {}s", max.as_secs()));
        }
        match op {
            "timeout" | "refreshes" => {
                if let Some(s) = t.timeout {
                    b.set_timeout(s);
                }
                no_content()
            }
            "pause" => {
                if b.session.paused() {
                    return api_error(StatusCode::CONFLICT, &format!("sandbox {id} is already paused"));
                }
                match b.session.pause().await {
                    Ok(()) => no_content(),
                    Err(e) => api_error(StatusCode::INTERNAL_SERVER_ERROR, &format!("pausing sandbox {id}: {e}")),
                }
            }
            _ => {
                let was_paused = b.session.paused();
                if was_paused && let Err(e) = b.session.resume().await {
                    return api_error(StatusCode::INTERNAL_SERVER_ERROR, &format!("resuming sandbox {id}: {e}"));
                }
                if let Some(s) = t.timeout {
                    b.set_timeout(s);
                }
                let status = if was_paused { StatusCode::CREATED } else { StatusCode::OK };
                json(status, &self.created(id, &b))
            }
        }
    }

    /// An envd call: the sandbox by `E2b-Sandbox-Id`, its token, then the service.
    async fn envd(self: &Arc<Self>, req: Request<hyper::body::Incoming>, path: &str) -> Response<Body> {
        let rpc = path != "/files" && path != "/envs";
        let fail = |e: ConnectError| {
            if rpc {
                rpc_error(&e)
            } else {
                api_error(StatusCode::from_u16(e.code.http_status()).unwrap_or(StatusCode::BAD_REQUEST), &e.message)
            }
        };
        let id = header(req.headers(), "e2b-sandbox-id").unwrap_or_default().to_owned();
        let Some(b) = self.sandbox(&id) else { return not_running(&id) };
        let token = header(req.headers(), "x-access-token").unwrap_or_default();
        if !constant_eq(token, &b.token) {
            return fail(ConnectError::new(Code::Unauthenticated, "a missing or wrong access token (X-Access-Token)"));
        }
        if let Err(e) = check_user(basic_user(req.headers()).as_deref()) {
            return fail(e);
        }
        match path {
            "/files" => self.files(&b, req).await,
            "/envs" => json(StatusCode::OK, &b.env),
            _ => self.rpc(b, req, path).await,
        }
    }

    async fn rpc(self: &Arc<Self>, b: Arc<Sandbox>, req: Request<hyper::body::Incoming>, path: &str) -> Response<Body> {
        if req.method() != Method::POST {
            return rpc_error(&ConnectError::new(Code::Unimplemented, format!("{path}: Connect calls are POST")));
        }
        let Some(method) = wire::find_method(path) else {
            let why = if wire::NOT_OFFERED.contains(&path) {
                "not offered (stockade has no directory watch yet)"
            } else {
                "no such method"
            };
            return rpc_error(&ConnectError::new(Code::Unimplemented, format!("{path}: {why}")));
        };
        let streaming = method.shape.streaming();
        let ct = header(req.headers(), "content-type").unwrap_or_default().to_owned();
        let Some(codec) = Codec::from_content_type(&ct, streaming) else {
            let mut r = rpc_error(&ConnectError::new(
                Code::Unimplemented,
                format!(
                    "content type {ct:?}: this call takes Connect's JSON or binary codec ({} or {})",
                    Codec::Json.content_type(streaming),
                    Codec::Proto.content_type(streaming)
                ),
            ));
            *r.status_mut() = StatusCode::UNSUPPORTED_MEDIA_TYPE;
            return r;
        };
        let deadline = header(req.headers(), "connect-timeout-ms")
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|ms| *ms > 0)
            .map(Duration::from_millis);
        let keepalive = header(req.headers(), "keepalive-ping-interval")
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|s| *s > 0)
            .map(Duration::from_secs);
        if method.shape == Shape::ClientStream {
            let within = deadline.unwrap_or(Duration::from_secs(3600));
            let input = stream_input(&b.session, codec, method.request, req.into_body(), within);
            return match input.await.and_then(|()| codec.encode(&serde_json::json!({}), method.response)) {
                Ok(reply) => {
                    let mut out = wire::envelope(0, &reply);
                    out.extend(wire::end_stream(None));
                    whole(StatusCode::OK, codec.content_type(true), out)
                }
                Err(e) => stream_error(codec, &e),
            };
        }
        let body = match read_body(req.into_body(), wire::MAX_RPC_BYTES + 5).await {
            Ok(b) => b,
            Err(e) => return rpc_error(&ConnectError::new(Code::ResourceExhausted, e)),
        };
        if streaming {
            let bytes = match wire::single_envelope(&body) {
                Ok(m) => m,
                Err(e) => return stream_error(codec, &e),
            };
            let Ok(permit) = Arc::clone(&self.streams).try_acquire_owned() else {
                return stream_error(codec, &ConnectError::new(Code::ResourceExhausted, "too many streams are open"));
            };
            let msg = Message { codec, method, bytes };
            return match self.stream(&b, msg, deadline, keepalive, permit).await {
                Ok(r) => r,
                Err(e) => stream_error(codec, &e),
            };
        }
        let msg = Message { codec, method, bytes: &body };
        match self.unary(&b, msg).await.and_then(|v| codec.encode(&v, method.response)) {
            Ok(reply) => whole(StatusCode::OK, codec.content_type(false), reply),
            Err(e) => rpc_error(&e),
        }
    }

    async fn unary(&self, b: &Sandbox, msg: Message<'_>) -> Result<serde_json::Value, ConnectError> {
        let s = &b.session;
        let pid_of = |sel: &wire::ProcessSelector| running_exec(s, sel).map(|x| x.pid());
        let empty = serde_json::json!({});
        match msg.method.path {
            "/process.Process/List" => {
                let _: wire::Empty = msg.read()?;
                let processes = s
                    .background()
                    .iter()
                    .filter(|x| x.running())
                    .map(|x| {
                        let (cmd, args) = x
                            .argv()
                            .split_first()
                            .map_or((String::new(), Vec::new()), |(c, a)| (c.clone(), a.to_vec()));
                        wire::ProcessInfo {
                            config: wire::ProcessConfig {
                                cmd,
                                args,
                                envs: BTreeMap::new(),
                                cwd: x.cwd().map(str::to_owned),
                            },
                            pid: x.pid(),
                            tag: x.tag().map(str::to_owned),
                        }
                    })
                    .collect();
                Ok(serde_json::to_value(wire::ListResponse { processes }).unwrap_or(empty))
            }
            "/process.Process/SendInput" => {
                let r: wire::SendInputRequest = msg.read()?;
                let pid = pid_of(&r.process)?;
                let bytes = match r.input {
                    wire::ProcessInput::Stdin(b) | wire::ProcessInput::Pty(b) => b,
                };
                s.send_stdin(pid, &bytes).await.map_err(|e| run_code(&e))?;
                Ok(empty)
            }
            "/process.Process/CloseStdin" => {
                let r: wire::ProcessRequest = msg.read()?;
                let pid = pid_of(&r.process)?;
                s.close_stdin(pid).await.map_err(|e| run_code(&e))?;
                Ok(empty)
            }
            "/process.Process/SendSignal" => {
                let r: wire::SendSignalRequest = msg.read()?;
                let pid = pid_of(&r.process)?;
                s.signal(pid, r.signal.number()).await.map_err(|e| run_code(&e))?;
                Ok(empty)
            }
            "/process.Process/Update" => {
                let r: wire::UpdateRequest = msg.read()?;
                let pid = pid_of(&r.process)?;
                if let Some(size) = r.pty.and_then(|p| p.size) {
                    let (rows, cols) = pty_size(size)?;
                    s.resize(pid, rows, cols).await.map_err(|e| run_code(&e))?;
                }
                Ok(empty)
            }
            p if p.starts_with("/filesystem.Filesystem/") => self.filesystem(s, msg).await,
            other => Err(ConnectError::new(Code::Unimplemented, format!("{other}: no such method"))),
        }
    }

    async fn filesystem(&self, s: &Session, msg: Message<'_>) -> Result<serde_json::Value, ConnectError> {
        let fail = |e: FilesError| files_code(&e);
        let entry = |e: &stockade_runtime::session::Entry| serde_json::json!({ "entry": entry_info(e) });
        match msg.method.path {
            "/filesystem.Filesystem/Stat" => {
                let r: wire::PathRequest = msg.read()?;
                Ok(entry(&s.stat(&guest_path(&r.path)).await.map_err(fail)?))
            }
            "/filesystem.Filesystem/MakeDir" => {
                let r: wire::PathRequest = msg.read()?;
                let p = guest_path(&r.path);
                if !s.mkdir(&p).await.map_err(fail)? {
                    return Err(ConnectError::new(Code::AlreadyExists, format!("{p}: the directory exists")));
                }
                Ok(entry(&s.stat(&p).await.map_err(fail)?))
            }
            "/filesystem.Filesystem/Move" => {
                let r: wire::MoveRequest = msg.read()?;
                let (from, to) = (guest_path(&r.source), guest_path(&r.destination));
                s.rename(&from, &to).await.map_err(fail)?;
                Ok(entry(&s.stat(&to).await.map_err(fail)?))
            }
            "/filesystem.Filesystem/ListDir" => {
                let r: wire::ListDirRequest = msg.read()?;
                let p = guest_path(&r.path);
                let depth = usize::try_from(r.depth.max(1)).unwrap_or(1);
                let entries: Vec<wire::EntryInfo> =
                    s.list(&p, depth).await.map_err(fail)?.iter().map(entry_info).collect();
                Ok(serde_json::json!({ "entries": entries }))
            }
            "/filesystem.Filesystem/Remove" => {
                let r: wire::PathRequest = msg.read()?;
                s.remove(&guest_path(&r.path)).await.map_err(fail)?;
                Ok(serde_json::json!({}))
            }
            other => Err(ConnectError::new(Code::Unimplemented, format!("{other}: no such method"))),
        }
    }

    /// Start or Connect: a stream of the process's events.
    async fn stream(
        self: &Arc<Self>,
        b: &Arc<Sandbox>,
        msg: Message<'_>,
        deadline: Option<Duration>,
        keepalive: Option<Duration>,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) -> Result<Response<Body>, ConnectError> {
        let s = Arc::clone(&b.session);
        let handle = if msg.method.path == "/process.Process/Start" {
            let r: wire::StartRequest = msg.read()?;
            let cfg = r.process.unwrap_or_default();
            if cfg.cmd.is_empty() {
                return Err(ConnectError::new(Code::InvalidArgument, "process.cmd: empty"));
            }
            // The deadline ends the process (E2B's command timeout); without one, the
            // sandbox's own end does.
            let wall = deadline.unwrap_or(stockade_runtime::protocol::limits::MAX_DURATION);
            let argv: Vec<String> = std::iter::once(cfg.cmd.clone()).chain(cfg.args.iter().cloned()).collect();
            let job = exec_job(&argv, cfg.envs.clone(), Vec::new(), Some(wall))
                .map_err(|e| ConnectError::new(Code::InvalidArgument, e.to_string()))?;
            let pty = match r.pty {
                Some(p) => Some(pty_size(p.size.unwrap_or(wire::PtySize { cols: 80, rows: 24 }))?),
                None => None,
            };
            let opts = StartOptions { pty, stdin: r.stdin.unwrap_or(true), tag: r.tag };
            let cwd = Some(cfg.cwd.as_deref().map_or_else(|| HOME.to_owned(), guest_path));
            s.start(job, cwd, opts).await.map_err(|e| run_code(&e))?
        } else {
            let r: wire::ProcessRequest = msg.read()?;
            running_exec(&s, &r.process)?
        };
        // Bounded: a slow client holds the stream task at `send`, which stops taking the
        // exec's output, which stops its reading (the guest waits on its write).
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(STREAM_QUEUE);
        let (codec, response) = (msg.codec, msg.method.response);
        let encode = move |ev: &ProcessEvent| match codec.encode(&ev.to_json(), response) {
            Ok(bytes) => (Bytes::from(wire::envelope(0, &bytes)), true),
            Err(e) => (Bytes::from(wire::end_stream(Some(&e))), false),
        };
        let pty = handle.has_pty();
        let to_event = move |c: Chunk| match c {
            Chunk::Stdout(b) if pty => ProcessEvent::Pty(b),
            Chunk::Stdout(b) => ProcessEvent::Stdout(b),
            Chunk::Stderr(b) => ProcessEvent::Stderr(b),
        };
        tokio::spawn(async move {
            let _permit = permit;
            let send = |ev: ProcessEvent| {
                let (bytes, ok) = encode(&ev);
                let tx = &tx;
                async move { tx.send(Ok(bytes)).await.is_ok() && ok }
            };
            let end_with = |e: Option<ConnectError>| {
                let tx = &tx;
                async move {
                    let _ = tx.send(Ok(Bytes::from(wire::end_stream(e.as_ref())))).await;
                }
            };
            // Connect announces the pid too, as envd does.
            if !send(ProcessEvent::Start { pid: handle.pid() }).await {
                return;
            }
            let (history, mut live) = handle.attach();
            for c in history {
                if !send(to_event(c)).await {
                    return;
                }
            }
            let tick = keepalive.unwrap_or(Duration::from_secs(3600));
            let end = handle.wait();
            tokio::pin!(end);
            let result = loop {
                tokio::select! {
                    result = &mut end => {
                        // Its output was all pushed before its end was: what is queued is the rest.
                        while let Some(c) = live.try_recv() {
                            if !send(to_event(c)).await {
                                return;
                            }
                        }
                        break result;
                    }
                    c = live.recv() => if !send(to_event(c)).await { return },
                    () = tokio::time::sleep(tick) => if !send(ProcessEvent::KeepAlive).await { return },
                    () = tx.closed() => return,
                }
            };
            match result.map_err(|e| run_code(&e)).and_then(|report| end_event(&report.status)) {
                Ok(ev) => {
                    if send(ev).await {
                        end_with(None).await;
                    }
                }
                Err(e) => end_with(Some(e)).await,
            }
        });
        let mut r = Response::new(PipeBody(rx).boxed());
        if let Ok(v) = codec.content_type(true).parse() {
            r.headers_mut().insert(CONTENT_TYPE, v);
        }
        Ok(r)
    }

    /// A slot for a streamed transfer, waiting at most [`TRANSFER_WAIT`] for one.
    async fn streamed_permit(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        tokio::time::timeout(TRANSFER_WAIT, Arc::clone(&self.streamed).acquire_owned()).await.ok()?.ok()
    }

    /// `/files`: GET downloads, POST uploads (octet-stream or multipart).
    async fn files(&self, b: &Sandbox, req: Request<hyper::body::Incoming>) -> Response<Body> {
        let q = query(&req);
        if let Err(e) = check_user(q.get("username").map(String::as_str)) {
            return api_error(StatusCode::UNAUTHORIZED, &e.message);
        }
        let path = q.get("path").map(|p| guest_path(p));
        match *req.method() {
            Method::GET => match path {
                Some(path) => self.download(b, &path).await,
                None => api_error(StatusCode::BAD_REQUEST, "a download needs ?path="),
            },
            Method::POST => self.upload(b, req, path).await,
            _ => api_error(StatusCode::METHOD_NOT_ALLOWED, "/files takes GET or POST"),
        }
    }

    /// A download: a process-tier file streams from its descriptor; a docker one comes whole.
    async fn download(&self, b: &Sandbox, path: &str) -> Response<Body> {
        let max = self.config.limits.max_upload;
        if let Some(files) = b.session.files() {
            let Some(permit) = self.streamed_permit().await else { return transfers_busy() };
            // The open is the guest's to slow (its path, its filesystem): off the workers.
            let (files, at) = (Arc::clone(files), path.to_owned());
            let opened = tokio::task::spawn_blocking(move || files.open(&at, max)).await;
            return match opened {
                Ok(Ok((file, len))) => stream_file(file, len, permit),
                Ok(Err(e)) => files_error(&e),
                Err(e) => api_error(StatusCode::INTERNAL_SERVER_ERROR, &format!("opening {path}: {e}")),
            };
        }
        let Ok(Ok(_transfer)) = tokio::time::timeout(TRANSFER_WAIT, self.transfers.acquire()).await else {
            return transfers_busy();
        };
        match b.session.read(path, max).await {
            Ok(bytes) => whole(StatusCode::OK, "application/octet-stream", bytes),
            Err(e) => files_error(&e),
        }
    }

    /// An upload: an octet-stream body to a process-tier sandbox streams to its file; a
    /// multipart body, or any to a docker sandbox, is read whole first.
    async fn upload(&self, b: &Sandbox, req: Request<hyper::body::Incoming>, path: Option<String>) -> Response<Body> {
        let max = self.config.limits.max_upload;
        let ct = header(req.headers(), "content-type").unwrap_or_default().to_owned();
        if header(req.headers(), "content-encoding").is_some_and(|e| e != "identity") {
            return api_error(StatusCode::BAD_REQUEST, "compressed uploads are not accepted");
        }
        let multipart_body = ct.starts_with("multipart/form-data");
        if !multipart_body && b.session.files().is_some() {
            let Some(p) = path else { return api_error(StatusCode::BAD_REQUEST, "an upload needs ?path=") };
            let Some(_permit) = self.streamed_permit().await else { return transfers_busy() };
            return match stream_upload(Arc::clone(&b.session), p.clone(), req.into_body(), max).await {
                Ok(()) => json(StatusCode::OK, &[written(&p)]),
                Err(e) => files_error(&e),
            };
        }
        let Ok(Ok(_transfer)) = tokio::time::timeout(TRANSFER_WAIT, self.transfers.acquire()).await else {
            return transfers_busy();
        };
        let cap = usize::try_from(max).unwrap_or(usize::MAX).saturating_add(64 << 10);
        let body = match read_body_within(req.into_body(), cap, TRANSFER_WITHIN).await {
            Ok(b) => b,
            Err(e) => return api_error(StatusCode::PAYLOAD_TOO_LARGE, &e),
        };
        let uploads: Vec<(String, Bytes)> = if multipart_body {
            let parts = match multipart(&ct, &body) {
                Ok(parts) => parts,
                Err(e) => return api_error(StatusCode::BAD_REQUEST, &format!("the multipart body: {e}")),
            };
            // One part goes to `?path=`; several, each to its own file name.
            let single = parts.len() == 1;
            let mut out = Vec::new();
            for (name, data) in parts {
                let p = match (&path, name) {
                    (Some(p), _) if single => p.clone(),
                    (_, Some(n)) => guest_path(&n),
                    (Some(p), None) => p.clone(),
                    (None, None) => {
                        return api_error(StatusCode::BAD_REQUEST, "a part has no file name and no ?path= was given");
                    }
                };
                out.push((p, data));
            }
            out
        } else {
            let Some(p) = path else { return api_error(StatusCode::BAD_REQUEST, "an upload needs ?path=") };
            vec![(p, body)]
        };
        let mut done = Vec::new();
        for (p, data) in uploads {
            if let Err(e) = b.session.write(&p, &data, max).await {
                return files_error(&e);
            }
            done.push(written(&p));
        }
        json(StatusCode::OK, &done)
    }
}

/// A `/files` call's refusal: the files API's error with its Connect code's HTTP status.
fn files_error(e: &FilesError) -> Response<Body> {
    let c = files_code(e);
    api_error(StatusCode::from_u16(c.code.http_status()).unwrap_or(StatusCode::BAD_REQUEST), &c.message)
}

/// A `/files` call that found no transfer slot within [`TRANSFER_WAIT`].
fn transfers_busy() -> Response<Body> {
    api_error(StatusCode::TOO_MANY_REQUESTS, "too many file transfers are in flight; try again")
}

/// `/files`' answer for one file written.
fn written(path: &str) -> serde_json::Value {
    let name = path.rsplit('/').next().unwrap_or_default();
    serde_json::json!({ "name": name, "type": "file", "path": path })
}

/// Most streamed `/files` transfers at once (each holds at most four 64 KiB pieces, and an
/// upload a blocking thread, for at most 10 minutes); more wait for one to end.
pub const MAX_STREAMED: usize = 64;

/// How long a transfer waits for a slot before it is refused (429).
const TRANSFER_WAIT: Duration = Duration::from_secs(60);

/// How many events of a process stream wait for a slow client (each at most one read of
/// the guest's output, 64 KiB, encoded): with the exec's own bound
/// ([`stockade_runtime::session::LIVE_BYTES`]), what one stream holds of the owner's memory.
pub const STREAM_QUEUE: usize = 16;

/// How many pieces of a streamed transfer wait between the network and the disk.
const PIPE_PIECES: usize = 4;

/// Most bytes one piece of a streamed download holds.
const PIPE_PIECE_BYTES: usize = 64 << 10;

/// A download of an open file, `len` bytes long, streamed through a bounded channel: each
/// piece is read on a blocking thread and handed on asynchronously, so a slow client holds
/// at most [`PIPE_PIECES`] pieces in memory and no thread while it waits, and the whole
/// transfer must end within [`TRANSFER_WITHIN`]. A file the guest shortened meanwhile, or a
/// transfer past its time, ends the response early with an error (the connection is closed,
/// so the client sees a short body against its `Content-Length`). `permit` is held until
/// the transfer ends.
fn stream_file(file: std::fs::File, len: u64, permit: tokio::sync::OwnedSemaphorePermit) -> Response<Body> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(PIPE_PIECES);
    tokio::spawn(async move {
        let _permit = permit;
        let until = tokio::time::Instant::now() + TRANSFER_WITHIN;
        let mut src = Some(file);
        let mut left = len;
        while left > 0 {
            let want = PIPE_PIECE_BYTES.min(usize::try_from(left).unwrap_or(PIPE_PIECE_BYTES));
            let Some(mut f) = src.take() else { return };
            let read = tokio::task::spawn_blocking(move || {
                use std::io::Read as _;
                let mut buf = vec![0u8; want];
                let n = f.read(&mut buf);
                (f, n.map(|n| Bytes::from(buf).slice(..n)))
            })
            .await;
            let piece = match read {
                Ok((f, Ok(b))) if !b.is_empty() => {
                    src = Some(f);
                    left -= b.len() as u64;
                    Ok(b)
                }
                Ok((_, Ok(_))) => Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the file shrank")),
                Ok((_, Err(e))) => Err(e),
                Err(e) => Err(std::io::Error::other(e)),
            };
            let failed = piece.is_err();
            match tokio::time::timeout_at(until, tx.send(piece)).await {
                Ok(Ok(())) if !failed => {}
                Ok(_) => return,
                Err(_) => {
                    let late = std::io::Error::new(std::io::ErrorKind::TimedOut, "the download's time passed");
                    let _ = tx.try_send(Err(late));
                    return;
                }
            }
        }
    });
    let mut r = Response::new(PipeBody(rx).boxed());
    r.headers_mut().insert(CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/octet-stream"));
    r.headers_mut().insert(hyper::header::CONTENT_LENGTH, hyper::header::HeaderValue::from(len));
    r
}

/// An `application/octet-stream` upload written as it arrives, through the session's
/// descriptor-held files API, on a blocking thread fed by a bounded channel: the body is
/// never held whole. Over `max`, or cut short, or late past [`TRANSFER_WITHIN`], nothing is
/// written (the files API writes a new file and renames it over the name only at the end).
async fn stream_upload(
    session: Arc<Session>,
    path: String,
    mut body: hyper::body::Incoming,
    max: u64,
) -> Result<(), FilesError> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Piece>(PIPE_PIECES);
    let at = path.clone();
    let writer = tokio::task::spawn_blocking(move || {
        let files =
            session.files().ok_or_else(|| FilesError::Invalid { path: at.clone(), why: "the sandbox ended".into() })?;
        files.write(&at, &mut PipeReader { rx, piece: Bytes::new(), ended: false }, max).map(drop)
    });
    let until = tokio::time::Instant::now() + TRANSFER_WITHIN;
    let end = loop {
        match tokio::time::timeout_at(until, body.frame()).await {
            Err(_) => break Piece::Fail(format!("the body did not arrive within {TRANSFER_WITHIN:?}")),
            Ok(None) => break Piece::End,
            Ok(Some(Err(e))) => break Piece::Fail(format!("reading the body: {e}")),
            Ok(Some(Ok(frame))) => {
                // A writer that stopped (over the cap, a failed write) has said why.
                if let Ok(data) = frame.into_data()
                    && tx.send(Piece::Data(data)).await.is_err()
                {
                    break Piece::End;
                }
            }
        }
    };
    let _ = tx.send(end).await;
    drop(tx);
    writer.await.unwrap_or_else(|e| Err(FilesError::Invalid { path, why: format!("the upload's writer: {e}") }))
}

/// One piece of a streamed upload, or how it ended.
enum Piece {
    Data(Bytes),
    End,
    Fail(String),
}

/// The blocking side of a streamed upload: the body's pieces as a [`std::io::Read`]. A
/// stream that ends without [`Piece::End`] is an error, so a cut-off upload is never taken
/// for a whole one.
struct PipeReader {
    rx: tokio::sync::mpsc::Receiver<Piece>,
    piece: Bytes,
    ended: bool,
}

impl std::io::Read for PipeReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.piece.is_empty() {
            if self.ended {
                return Ok(0);
            }
            match self.rx.blocking_recv() {
                Some(Piece::Data(b)) => self.piece = b,
                Some(Piece::End) => self.ended = true,
                Some(Piece::Fail(why)) => return Err(std::io::Error::other(why)),
                None => return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the upload ended early")),
            }
        }
        let n = buf.len().min(self.piece.len());
        buf[..n].copy_from_slice(&self.piece.split_to(n));
        Ok(n)
    }
}

/// A response body fed by a bounded channel; an error ends it short.
struct PipeBody(tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>);

impl hyper::body::Body for PipeBody {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, std::io::Error>>> {
        self.0.poll_recv(cx).map(|o| o.map(|r| r.map(hyper::body::Frame::data)))
    }
}

/// A list item's place in the order pages follow: its start, then its id.
fn page_key(t: SystemTime, id: &str) -> String {
    let nanos = t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{nanos:020}.{id}")
}

/// One page of `items` (each with its [`page_key`]): those after the request's `nextToken`,
/// at most its `limit` (1 to 100; 100 when absent), in order; when more follow, the last
/// one's key is the next page's token, in `x-next-token`, as E2B's API pages.
fn page<T: serde::Serialize>(q: &HashMap<String, String>, mut items: Vec<(String, T)>) -> Response<Body> {
    let limit = match q.get("limit").map(|l| (l, l.parse::<usize>())) {
        None => MAX_PAGE,
        Some((_, Ok(n))) if (1..=MAX_PAGE).contains(&n) => n,
        Some((l, _)) => return api_error(StatusCode::BAD_REQUEST, &format!("limit {l:?}: must be 1 to {MAX_PAGE}")),
    };
    items.sort_by(|a, b| a.0.cmp(&b.0));
    let after = q.get("nextToken");
    items.retain(|(k, _)| after.is_none_or(|a| k > a));
    let more = items.len() > limit;
    items.truncate(limit);
    let next = items.last().map(|(k, _)| k.clone()).filter(|_| more);
    let out: Vec<T> = items.into_iter().map(|(_, v)| v).collect();
    let mut r = json(StatusCode::OK, &out);
    if let Some(v) = next.and_then(|k| k.parse().ok()) {
        r.headers_mut().insert("x-next-token", v);
    }
    r
}

/// A snapshot's name: 1 to 64 letters, digits, `-`, `_` or `.`.
fn snapshot_name(name: &str) -> Result<(), String> {
    let ok = (1..=64).contains(&name.len()) && name.bytes().all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(&c));
    if ok { Ok(()) } else { Err(format!("snapshot name {name:?}: 1 to 64 letters, digits, '-', '_' or '.'")) }
}

/// The snapshots a server's directory holds: each record whose archive is beside it (the
/// directory is made, and kept 0700, first). What cannot be read is skipped.
fn load_snapshots(dir: &Path) -> Vec<Snapshot> {
    use std::os::unix::fs::PermissionsExt;
    if std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)))
        .is_err()
    {
        return Vec::new();
    }
    let mut out: Vec<Snapshot> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| {
            let text = std::fs::read(e.path()).ok().filter(|t| t.len() <= wire::MAX_API_BYTES)?;
            let s: Snapshot = serde_json::from_slice(&text).ok()?;
            let stem_ok = e.path().file_stem().is_some_and(|f| *f == *s.id);
            (stem_ok && dir.join(format!("{}.tar", s.id)).is_file()).then_some(s)
        })
        .collect();
    out.sort_by(|a, b| (a.made, &a.id).cmp(&(b.made, &b.id)));
    out
}

/// Writes a snapshot's record beside its archive (a new file, mode 0600).
fn save_snapshot(dir: &Path, s: &Snapshot) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dir.join(format!("{}.json", s.id)))?;
    f.write_all(&serde_json::to_vec(s).map_err(std::io::Error::other)?)
}

/// The parts of a `multipart/form-data` body: each part's file name, if it has one, and its
/// bytes.
fn multipart(ct: &str, body: &Bytes) -> Result<Vec<(Option<String>, Bytes)>, String> {
    let boundary = ct
        .split(';')
        .filter_map(|p| p.trim().strip_prefix("boundary="))
        .next()
        .map(|b| b.trim_matches('"').to_owned())
        .filter(|b| !b.is_empty() && b.len() <= 70)
        .ok_or("no boundary")?;
    let delim = format!("--{boundary}");
    let find = |hay: &[u8], from: usize, needle: &[u8]| -> Option<usize> {
        hay.get(from..)?.windows(needle.len()).position(|w| w == needle).map(|i| i + from)
    };
    let mut at = find(body, 0, delim.as_bytes()).ok_or("no first boundary")? + delim.len();
    let mut parts = Vec::new();
    loop {
        if body.get(at..at + 2) == Some(b"--") {
            return Ok(parts);
        }
        if body.get(at..at + 2) != Some(b"\r\n") {
            return Err("a boundary line does not end in CRLF".into());
        }
        at += 2;
        let head_end = find(body, at, b"\r\n\r\n").ok_or("a part's headers do not end")?;
        let head = std::str::from_utf8(&body[at..head_end]).map_err(|_| "a part's headers are not UTF-8")?;
        let name = head
            .lines()
            .filter(|l| l.to_ascii_lowercase().starts_with("content-disposition:"))
            .flat_map(|l| l.split(';').map(str::trim).collect::<Vec<_>>())
            .find_map(|p| p.strip_prefix("filename=").map(|f| f.trim_matches('"').to_owned()));
        let data_start = head_end + 4;
        let end_marker = format!("\r\n{delim}");
        let data_end = find(body, data_start, end_marker.as_bytes()).ok_or("a part does not end")?;
        parts.push((name, body.slice(data_start..data_end)));
        if parts.len() > 1024 {
            return Err("more than 1,024 parts".into());
        }
        at = data_end + end_marker.len();
    }
}

fn pty_size(s: wire::PtySize) -> Result<(u16, u16), ConnectError> {
    let bad = || {
        ConnectError::new(
            Code::InvalidArgument,
            format!("pty size {}x{}: rows and cols must be 1 to 1000", s.rows, s.cols),
        )
    };
    let rows = u16::try_from(s.rows).ok().filter(|r| (1..=1000).contains(r)).ok_or_else(bad)?;
    let cols = u16::try_from(s.cols).ok().filter(|c| (1..=1000).contains(c)).ok_or_else(bad)?;
    Ok((rows, cols))
}

/// How a run's end reads as envd's end event; a deadline is the stream's error.
fn end_event(status: &Status) -> Result<ProcessEvent, ConnectError> {
    let killed = |error: &str| ProcessEvent::End {
        exit_code: -1,
        exited: false,
        status: "signal: killed".into(),
        error: Some(error.to_owned()),
    };
    Ok(match status {
        Status::Exited { code } => {
            ProcessEvent::End { exit_code: *code, exited: true, status: format!("exit status {code}"), error: None }
        }
        Status::Signaled { signal } => ProcessEvent::End {
            exit_code: -1,
            exited: false,
            status: format!("signal: {}", signal_name(*signal)),
            error: None,
        },
        Status::TimedOut | Status::CpuLimit => {
            return Err(ConnectError::new(Code::DeadlineExceeded, "the command's timeout passed and it was killed"));
        }
        Status::OutOfMemory => killed("out of memory: the sandbox's memory limit was reached"),
        Status::OutputLimit { stream } => killed(&format!("its {stream:?} went over its output budget")),
        Status::FailedToStart { reason } => {
            return Err(ConnectError::new(Code::InvalidArgument, format!("the command could not start: {reason}")));
        }
        other => killed(&format!("{other:?}")),
    })
}

fn signal_name(n: i32) -> &'static str {
    match n {
        1 => "hangup",
        2 => "interrupt",
        9 => "killed",
        13 => "broken pipe",
        15 => "terminated",
        _ => "signal",
    }
}

fn entry_info(e: &stockade_runtime::session::Entry) -> wire::EntryInfo {
    let kind = match e.kind {
        Kind::File => wire::FileType::File,
        Kind::Dir => wire::FileType::Directory,
        Kind::Symlink => wire::FileType::Symlink,
        _ => wire::FileType::Unspecified,
    };
    wire::EntryInfo {
        name: e.path.rsplit('/').next().unwrap_or_default().to_owned(),
        kind,
        path: e.path.clone(),
        size: i64::try_from(e.size).unwrap_or(i64::MAX),
        mode: e.mode,
        permissions: wire::permissions(kind, e.mode),
        owner: USER.into(),
        group: USER.into(),
        modified_time: wire::rfc3339(e.modified),
        symlink_target: None,
    }
}

/// `StreamInput`: a client stream of envelopes, the first naming the process, each later one
/// input for it, written in order as each arrives (one message at most 1 MiB; the whole
/// stream within `deadline`).
async fn stream_input(
    s: &Session,
    codec: Codec,
    request: &'static wire::proto::Message,
    mut body: hyper::body::Incoming,
    deadline: Duration,
) -> Result<(), ConnectError> {
    let until = tokio::time::Instant::now() + deadline;
    let mut buf = bytes::BytesMut::new();
    let mut pid: Option<u32> = None;
    let mut ended = false;
    loop {
        // Every whole envelope in the buffer, in order.
        while buf.len() >= 5 {
            let flags = buf[0];
            let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
            if len > wire::MAX_RPC_BYTES {
                return Err(ConnectError::new(
                    Code::ResourceExhausted,
                    format!("a {len}-byte message is over the limit"),
                ));
            }
            if buf.len() < 5 + len {
                break;
            }
            let frame = buf.split_to(5 + len);
            if flags & wire::FLAG_END_STREAM != 0 {
                return Ok(());
            }
            let msg: wire::StreamInputRequest = codec.decode(wire::single_envelope(&frame)?, request)?;
            match (msg, pid) {
                (wire::StreamInputRequest::Start { process }, None) => {
                    pid = Some(running_exec(s, &process)?.pid());
                }
                (wire::StreamInputRequest::Start { .. }, Some(_)) => {
                    return Err(ConnectError::new(Code::InvalidArgument, "a second start message"));
                }
                (_, None) => return Err(ConnectError::new(Code::InvalidArgument, "the first message must be start")),
                (wire::StreamInputRequest::Data { input }, Some(p)) => {
                    let bytes = match input {
                        wire::ProcessInput::Stdin(b) | wire::ProcessInput::Pty(b) => b,
                    };
                    s.send_stdin(p, &bytes).await.map_err(|e| run_code(&e))?;
                }
                (wire::StreamInputRequest::KeepAlive {}, Some(_)) => {}
            }
        }
        if ended {
            return if buf.is_empty() {
                Ok(())
            } else {
                Err(ConnectError::new(Code::InvalidArgument, "the stream ends mid-message"))
            };
        }
        match tokio::time::timeout_at(until, body.frame()).await {
            Err(_) => return Err(ConnectError::new(Code::DeadlineExceeded, "the input stream's deadline passed")),
            Ok(None) => ended = true,
            Ok(Some(Err(e))) => {
                return Err(ConnectError::new(Code::Canceled, format!("reading the input stream: {e}")));
            }
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    buf.extend_from_slice(&data);
                }
            }
        }
    }
}

/// A streaming call's error: HTTP 200 and an end-of-stream envelope holding it.
fn stream_error(codec: Codec, e: &ConnectError) -> Response<Body> {
    whole(StatusCode::OK, codec.content_type(true), wire::end_stream(Some(e)))
}

/// One request message and the call it came with, read in that call's codec.
struct Message<'a> {
    codec: Codec,
    method: &'static wire::Method,
    bytes: &'a [u8],
}

impl Message<'_> {
    fn read<T: serde::de::DeserializeOwned>(&self) -> Result<T, ConnectError> {
        self.codec.decode(self.bytes, self.method.request)
    }
}

/// The network a sandbox gets: the template's hosts, narrowed by the request's
/// `allowOut`/`denyOut` (which can never widen them); none unless the template grants some.
fn net_grant(t: &Template, new: &wire::NewSandbox) -> Result<Option<stockade_runtime::egress::NetGrant>, String> {
    use stockade_runtime::egress;
    let net = new.network.clone().unwrap_or_default();
    if let Some(k) = net.other.keys().next() {
        return Err(format!("network.{k}: stockade does not offer it"));
    }
    if net.allow_public_traffic == Some(true) {
        return Err("network.allowPublicTraffic: a stockade sandbox publishes no port".into());
    }
    let mut hosts: Vec<String> = if net.allow_out.is_empty() {
        t.allow_net.clone()
    } else {
        for h in &net.allow_out {
            if h != "ALL_TRAFFIC" && !t.allow_net.contains(h) {
                return Err(format!(
                    "network.allowOut {h:?}: this template does not grant it (it grants: {})",
                    if t.allow_net.is_empty() { "no network".to_owned() } else { t.allow_net.join(", ") }
                ));
            }
        }
        if net.allow_out.iter().any(|h| h == "ALL_TRAFFIC") { t.allow_net.clone() } else { net.allow_out.clone() }
    };
    if net.deny_out.iter().any(|h| h == "ALL_TRAFFIC") || new.allow_internet_access == Some(false) {
        hosts.clear();
    }
    hosts.retain(|h| !net.deny_out.contains(h));
    if hosts.is_empty() {
        return Ok(None);
    }
    let policy = egress::NetPolicy::allow_entries(&hosts).map_err(|e| e.to_string())?;
    let resolve = egress::Resolve::entries(&t.net_resolve).map_err(|e| e.to_string())?;
    Ok(Some(egress::NetGrant::new(policy).resolve(resolve)))
}

/// `serve.toml`, as written.
#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    #[serde(default)]
    limits: Option<LimitsFile>,
    #[serde(default)]
    template: BTreeMap<String, TemplateFile>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsFile {
    max_sandboxes: Option<usize>,
    max_connections: Option<usize>,
    max_streams: Option<usize>,
    max_upload: Option<String>,
    max_snapshots: Option<usize>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TemplateFile {
    #[serde(default)]
    tier: Option<String>,
    image: Option<String>,
    memory: Option<String>,
    pids: Option<u32>,
    max_timeout: Option<String>,
    #[serde(default)]
    allow_net: Vec<String>,
    #[serde(default)]
    net_resolve: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    disk: Option<String>,
}

impl E2bConfig {
    /// A configuration with the `base` template alone (the process tier, no network).
    #[must_use]
    pub fn new(api_key: String) -> Self {
        Self {
            api_key,
            templates: BTreeMap::from([("base".to_owned(), Template::default())]),
            limits: E2bLimits::default(),
            tls: None,
            snapshots: None,
        }
    }

    /// Reads `serve.toml`: `[limits]` and `[template.NAME]` tables (`tier`, `image`,
    /// `memory`, `pids`, `disk`, `max_timeout`, `allow_net`, `net_resolve`, `env`). Without a
    /// `base` template, `base` is the default one.
    pub fn from_toml(api_key: String, text: &str) -> Result<Self, String> {
        let file: ConfigFile = toml::from_str(text).map_err(|e| e.message().to_owned())?;
        let mut config = Self::new(api_key);
        if let Some(l) = file.limits {
            let d = E2bLimits::default();
            config.limits = E2bLimits {
                max_sandboxes: l.max_sandboxes.unwrap_or(d.max_sandboxes),
                max_connections: l.max_connections.unwrap_or(d.max_connections),
                max_streams: l.max_streams.unwrap_or(d.max_streams),
                max_upload: match l.max_upload {
                    Some(s) => crate::config::parse_size(&s).map_err(|e| format!("limits.max_upload: {e}"))?,
                    None => d.max_upload,
                },
                max_snapshots: l.max_snapshots.unwrap_or(d.max_snapshots),
            };
        }
        for (name, t) in file.template {
            let at = |what: &str, e: &dyn std::fmt::Display| format!("template.{name}.{what}: {e}");
            let tier = match (t.tier.as_deref(), t.image) {
                (None | Some("process"), None) => SessionTier::Process,
                (Some("docker"), Some(image)) => SessionTier::Docker { image },
                (Some("docker"), None) => return Err(at("image", &"a docker template names its image")),
                (None | Some("process"), Some(_)) => return Err(at("image", &"only a docker template has an image")),
                (Some(other), _) => return Err(at("tier", &format!("{other:?} is not process or docker"))),
            };
            let mut limits = Limits::default();
            if let Some(m) = &t.memory {
                let bytes = crate::config::parse_size(m).map_err(|e| at("memory", &e))?;
                limits = limits.with_memory(bytes).map_err(|e| at("memory", &e))?;
            }
            if let Some(p) = t.pids {
                limits = limits.with_processes(p).map_err(|e| at("pids", &e))?;
            }
            let max_timeout = match &t.max_timeout {
                Some(d) => crate::config::parse_duration(d).map_err(|e| at("max_timeout", &e))?,
                None => Template::default().max_timeout,
            };
            if max_timeout.is_zero() || max_timeout > stockade_runtime::protocol::limits::MAX_DURATION {
                return Err(at("max_timeout", &"must be more than 0 and at most 24h"));
            }
            let disk = match &t.disk {
                Some(d) => crate::config::parse_size(d).map_err(|e| at("disk", &e))?,
                None => DEFAULT_DISK,
            };
            if disk < 1 << 20 {
                return Err(at("disk", &"must be at least 1M"));
            }
            let template = Template {
                tier,
                limits,
                max_timeout,
                allow_net: t.allow_net,
                net_resolve: t.net_resolve,
                env: t.env.into_iter().collect(),
                disk,
            };
            // Checked now, so that a typo is the server's first line, not a sandbox's error.
            net_grant(&template, &wire::NewSandbox::default()).map_err(|e| at("allow_net", &e))?;
            config.templates.insert(name, template);
        }
        Ok(config)
    }
}
