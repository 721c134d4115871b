//! One run's proxy: each guest connection read, decided, resolved, checked and carried.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::json;
use stockade_policy::allow::{Gate, RefusalKind, Source, ToolCall};
use stockade_protocol::{GrantsReport, NetConnection, NetDecision};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

use crate::http::{self, Body, Request};
use crate::policy::{NET_TOOL, NetPolicy, NetPolicyError, Resolve};
use crate::scope::{NameScope, NetScope};
use crate::secret::{Intercept, NetSecret, SECRET_ENV_PREFIX, Target};
use crate::socks;
use crate::tls::{self, Hello};

/// Bytes read or written at a time.
const CHUNK: usize = 256 << 10;

/// A run's network bounds (G6). Every bound has a default; none is unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct NetLimits {
    /// Connections the run may ask for in all (denied ones count): 1024.
    pub max_connections: u64,
    /// Connections open at once: 64.
    pub max_concurrent: usize,
    /// Bytes from the guest to all upstreams: 1 GiB.
    pub max_bytes_up: u64,
    /// Bytes from all upstreams to the guest: 4 GiB.
    pub max_bytes_down: u64,
    /// A connection with no byte either way for this long is cut: 60 s.
    pub idle: Duration,
    /// A connection open this long is cut: 10 min.
    pub max_duration: Duration,
    /// Largest request or response head, and SOCKS request: 16 KiB.
    pub max_head_bytes: usize,
    /// Time to resolve a name and connect upstream: 10 s.
    pub connect_timeout: Duration,
}

impl Default for NetLimits {
    fn default() -> Self {
        Self {
            max_connections: 1024,
            max_concurrent: 64,
            max_bytes_up: 1 << 30,
            max_bytes_down: 4 << 30,
            idle: Duration::from_secs(60),
            max_duration: Duration::from_secs(600),
            max_head_bytes: 16 << 10,
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// What the first bytes of a connection to the run's loopback ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Kind {
    /// A proxy request (CONNECT, an absolute-form URL, SOCKS5): the network grant's.
    Proxy,
    /// An origin-form HTTP request (`POST /v1/chat/completions`): another service's.
    Origin,
    /// Too few bytes to tell.
    NeedMore,
}

/// Tells a proxy request from an origin-form one by its first bytes.
#[must_use]
pub fn classify(prefix: &[u8]) -> Kind {
    match prefix.first() {
        None => return Kind::NeedMore,
        Some(5) => return Kind::Proxy,
        Some(_) => {}
    }
    let Some(space) = prefix.iter().position(|b| *b == b' ') else {
        return if prefix.len() < 16 { Kind::NeedMore } else { Kind::Origin };
    };
    if &prefix[..space] == b"CONNECT" {
        return Kind::Proxy;
    }
    let target = &prefix[space + 1..];
    let mut kind = Kind::Origin;
    for scheme in [&b"http://"[..], b"https://"] {
        let n = target.len().min(scheme.len());
        if target[..n].eq_ignore_ascii_case(&scheme[..n]) {
            if n == scheme.len() {
                return Kind::Proxy;
            }
            kind = Kind::NeedMore;
        }
    }
    kind
}

/// The variables that point a guest's clients at the proxy on `127.0.0.1:port`, in upper
/// and lower case: `HTTP_PROXY` and `HTTPS_PROXY` (`http://`), `ALL_PROXY` (`socks5h://`, so
/// names are resolved here), and `NO_PROXY` for loopback.
#[must_use]
pub fn proxy_env(port: u16) -> Vec<(String, String)> {
    let http = format!("http://127.0.0.1:{port}");
    let socks = format!("socks5h://127.0.0.1:{port}");
    let mut out = Vec::new();
    for (k, v) in [
        ("HTTP_PROXY", &http),
        ("HTTPS_PROXY", &http),
        ("ALL_PROXY", &socks),
        ("NO_PROXY", &"localhost,127.0.0.1,::1".to_owned()),
    ] {
        out.push((k.to_owned(), v.clone()));
        out.push((k.to_ascii_lowercase(), v.clone()));
    }
    out
}

/// Called with each connection that was denied or refused, as it is decided (a CLI prints
/// one line for it).
pub type OnRefused = Arc<dyn Fn(&NetConnection) + Send + Sync>;

/// One run's network grant: serve each guest connection with [`Egress::serve`]; the
/// connections are on the record ([`Egress::record_into`]).
#[derive(Clone)]
pub struct Egress {
    inner: Arc<Inner>,
}

struct Inner {
    gate: Mutex<Gate>,
    policy: NetPolicy,
    resolve: Resolve,
    limits: NetLimits,
    start: Instant,
    opened: AtomicU64,
    up: AtomicU64,
    down: AtomicU64,
    slots: Semaphore,
    records: Mutex<GrantsReport>,
    on_refused: Option<OnRefused>,
    /// The scope laid over the policy, if the grant has one.
    scope: Option<NetScope>,
    /// The secret hosts' interception, if the grant has secrets (`Err`: it could not be
    /// set up, and every tunnel to a secret host is refused, saying why).
    intercept: Option<Result<Intercept, (Vec<String>, String)>>,
    /// The TLS a fetch verifies with, made on the first https fetch.
    fetch_tls: std::sync::OnceLock<Result<Arc<rustls::ClientConfig>, String>>,
    /// The TLS the proxy verifies an `https://` request's upstream with (the host's roots).
    upstream_tls: std::sync::OnceLock<Result<Arc<rustls::ClientConfig>, String>>,
    /// Each rule's byte budget (its limit's `max_bytes`), and what its connections used.
    budgets: std::collections::HashMap<String, u64>,
    budget_used: Mutex<std::collections::HashMap<String, u64>>,
}

/// Which way bytes go.
#[derive(Debug, Clone, Copy)]
enum Way {
    /// From the guest to an upstream.
    Up,
    /// From an upstream to the guest.
    Down,
}

impl std::fmt::Debug for Egress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Egress").field("limits", &self.inner.limits).finish_non_exhaustive()
    }
}

/// A connection's record, written when it is dropped (so a connection the run's end cuts
/// is recorded too).
pub(crate) struct Conn {
    egress: Arc<Inner>,
    record: NetConnection,
    started: Instant,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.record.duration = self.started.elapsed();
        let record = std::mem::replace(&mut self.record, NetConnection::new("", 0, ""));
        self.egress.records.lock().unwrap_or_else(PoisonError::into_inner).record_connection(record);
    }
}

impl Conn {
    /// The bytes that went up so far.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn bytes_up(&self) -> u64 {
        self.record.bytes_up
    }

    fn refuse(&mut self, decision: NetDecision, rule: &str, reason: impl Into<String>) {
        self.record.decision = decision;
        self.record.rule = rule.to_owned();
        self.record.reason = reason.into();
        if let Some(cb) = &self.egress.on_refused {
            cb(&self.record);
        }
    }
}

/// Reads from `s` into `buf` until `done` says how much is enough, within `limit` bytes and
/// the idle deadline. `Ok(false)`: the stream ended, or the limit was reached, first.
async fn read_until<S: AsyncRead + Unpin>(
    s: &mut S,
    buf: &mut Vec<u8>,
    limit: usize,
    idle: Duration,
    mut done: impl FnMut(&[u8]) -> bool,
) -> std::io::Result<bool> {
    let mut chunk = [0u8; 4096];
    while !done(buf) {
        if buf.len() >= limit {
            return Ok(false);
        }
        let room = (limit - buf.len()).min(chunk.len());
        let n = tokio::time::timeout(idle, s.read(&mut chunk[..room]))
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "idle"))??;
        if n == 0 {
            return Ok(false);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok(true)
}

/// A network grant: what every run it is given to may reach, and how much. Each run gets
/// its own [`Egress`] ([`NetGrant::start`]), with its own ledger, bounds and record.
#[derive(Clone)]
pub struct NetGrant {
    policy: NetPolicy,
    resolve: Resolve,
    limits: NetLimits,
    on_refused: Option<OnRefused>,
    secrets: Vec<NetSecret>,
    client: Option<Arc<rustls::ClientConfig>>,
    scope: Option<NetScope>,
}

impl std::fmt::Debug for NetGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetGrant")
            .field("resolve", &self.resolve)
            .field("limits", &self.limits)
            .field("secrets", &self.secrets)
            .finish_non_exhaustive()
    }
}

impl NetGrant {
    /// A grant deciding by `policy`, with no [`Resolve`] entries and the default bounds.
    #[must_use]
    pub fn new(policy: NetPolicy) -> Self {
        Self {
            policy,
            resolve: Resolve::new(),
            limits: NetLimits::default(),
            on_refused: None,
            secrets: Vec::new(),
            client: None,
            scope: None,
        }
    }

    /// Narrows every run of this grant by `scope` (which its holder may replace while the
    /// runs go on): within the policy's yes, a connection must also be in scope.
    #[must_use]
    pub fn scope(mut self, scope: NetScope) -> Self {
        self.scope = Some(scope);
        self
    }

    /// Keeps `secrets` out of the sandbox (G8): for each one's host, the guest's TLS ends
    /// at the proxy, with a certificate from a per-run CA, and on the way up the real value
    /// replaces the placeholder in the one named header (or, for a header secret, is that
    /// header). Fails if the host has no TLS roots to verify the upstreams with, or two
    /// secrets name one header of one host.
    pub fn secrets(mut self, secrets: Vec<NetSecret>) -> Result<Self, NetPolicyError> {
        let entry = |s: &NetSecret| format!("{}={}", s.host(), s.env().unwrap_or(s.header()));
        let mut seen = std::collections::BTreeSet::new();
        if let Some(twice) = secrets.iter().find(|s| !seen.insert((s.host().to_owned(), s.header().to_owned()))) {
            return Err(NetPolicyError::Secret {
                entry: entry(twice),
                reason: format!("another secret of the same host is in the {} header", twice.header()),
            });
        }
        if !secrets.is_empty() {
            let client = crate::secret::client_config(None).map_err(|reason| NetPolicyError::Secret {
                entry: secrets.iter().map(entry).collect::<Vec<_>>().join(","),
                reason,
            })?;
            self.client = Some(client);
        }
        self.secrets = secrets;
        Ok(self)
    }

    /// Resolves with `resolve`'s entries first.
    #[must_use]
    pub fn resolve(mut self, resolve: Resolve) -> Self {
        self.resolve = resolve;
        self
    }

    /// Bounds each run by `limits`.
    #[must_use]
    pub fn limits(mut self, limits: NetLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Calls `f` with each connection denied or refused, as it is decided.
    #[must_use]
    pub fn on_refused(mut self, f: OnRefused) -> Self {
        self.on_refused = Some(f);
        self
    }

    /// The bounds.
    #[must_use]
    pub fn net_limits(&self) -> &NetLimits {
        &self.limits
    }

    /// One run's proxy.
    #[must_use]
    pub fn start(&self) -> Egress {
        let limits = self.limits;
        Egress {
            inner: Arc::new(Inner {
                gate: Mutex::new(Gate::new(self.policy.policy().clone())),
                policy: self.policy.clone(),
                resolve: self.resolve.clone(),
                slots: Semaphore::new(limits.max_concurrent.max(1)),
                limits,
                start: Instant::now(),
                opened: AtomicU64::new(0),
                up: AtomicU64::new(0),
                down: AtomicU64::new(0),
                records: Mutex::new(GrantsReport::default()),
                on_refused: self.on_refused.clone(),
                scope: self.scope.clone(),
                intercept: (!self.secrets.is_empty()).then(|| {
                    Intercept::start(&self.secrets)
                        .map_err(|why| (self.secrets.iter().map(|s| s.host().to_owned()).collect(), why))
                }),
                fetch_tls: std::sync::OnceLock::new(),
                // The roots `secrets` loaded, if it did: one load per grant, not one per run.
                upstream_tls: self.client.clone().map(Ok).map(std::sync::OnceLock::from).unwrap_or_default(),
                budgets: self
                    .policy
                    .policy()
                    .rules()
                    .filter_map(|r| Some((r.id().to_owned(), r.limit_of()?.max_bytes()?)))
                    .collect(),
                budget_used: Mutex::new(std::collections::HashMap::new()),
            }),
        }
    }
}

impl Egress {
    /// The variables that hold each secret's per-run placeholder: `$ENVVAR` and
    /// `$STOCKADE_SECRET_<ENVVAR>`. Empty without secrets.
    #[must_use]
    pub fn secret_env(&self) -> Vec<(String, String)> {
        let Some(Ok(intercept)) = &self.inner.intercept else { return Vec::new() };
        intercept
            .targets
            .iter()
            .flat_map(|t| &t.secrets)
            .filter_map(|(secret, placeholder)| Some((secret.env()?, placeholder.clone()?)))
            .flat_map(|(env, p)| [(env.to_owned(), p.clone()), (format!("{SECRET_ENV_PREFIX}{env}"), p)])
            .collect()
    }

    /// The per-run CA's certificate (PEM), which a guest must trust to reach a secret host;
    /// `None` without secrets. Its key never leaves the proxy.
    #[must_use]
    pub fn ca_pem(&self) -> Option<&str> {
        match &self.inner.intercept {
            Some(Ok(i)) => Some(&i.ca_pem),
            _ => None,
        }
    }

    /// The TLS a fetch verifies its far end with: the host's roots, and the run's CA when
    /// the grant has secrets (a fetch to a secret host meets the proxy's certificate).
    pub(crate) fn fetch_tls(&self) -> Result<Arc<rustls::ClientConfig>, String> {
        self.inner.fetch_tls.get_or_init(|| crate::secret::client_config(self.ca_pem())).clone()
    }

    /// Moves the connections recorded so far into `report`.
    pub fn record_into(&self, report: &mut GrantsReport) {
        let mut records = self.inner.records.lock().unwrap_or_else(PoisonError::into_inner);
        report.connections_total += records.connections_total;
        report.connections.append(&mut records.connections);
        report.connections.truncate(stockade_protocol::MAX_GRANT_RECORDS);
        records.connections_total = 0;
    }

    /// Starts the run's totals again: connections in all, and bytes each way (a session's
    /// next exec: its grant lives as long as the session, and each exec gets the whole
    /// budget). Connections open now go on; a policy rule's own limits are not renewed.
    pub fn renew(&self) {
        self.inner.opened.store(0, Ordering::SeqCst);
        self.inner.up.store(0, Ordering::SeqCst);
        self.inner.down.store(0, Ordering::SeqCst);
    }

    /// Serves one guest connection to the proxy, to its end. Every way it can end is a
    /// normal outcome, recorded; nothing is returned.
    ///
    /// The connection has one deadline, `max_duration` from its accept, for every phase:
    /// its head, a ClientHello, a request body, the relay. Past it the connection is cut
    /// (`max-duration`), whatever the guest's pace.
    pub async fn serve<S: AsyncRead + AsyncWrite + Unpin + Send>(&self, mut stream: S) {
        let mut conn = self.conn();
        let deadline = tokio::time::Instant::from_std(conn.started + self.inner.limits.max_duration);
        if tokio::time::timeout_at(deadline, self.serve_conn(&mut conn, &mut stream)).await.is_err() {
            conn.record.cut = Some("max-duration".into());
        }
    }

    /// A new connection's record, written when it is dropped.
    pub(crate) fn conn(&self) -> Conn {
        Conn { egress: self.inner.clone(), record: NetConnection::new("", 0, ""), started: Instant::now() }
    }

    /// [`Egress::serve`]'s work, within its deadline.
    async fn serve_conn<S: AsyncRead + AsyncWrite + Unpin + Send>(&self, conn: &mut Conn, stream: &mut S) {
        let inner = &self.inner;
        let mut buf = Vec::with_capacity(1024);
        let limits = inner.limits;
        if inner.opened.fetch_add(1, Ordering::SeqCst) >= limits.max_connections {
            conn.refuse(
                NetDecision::Refused,
                "max-connections",
                format!("the run's {} connections are used up", limits.max_connections),
            );
            let _ = stream.write_all(&http::reply(429, &conn.record.reason)).await;
            return;
        }
        let Ok(_slot) = inner.slots.try_acquire() else {
            conn.refuse(
                NetDecision::Refused,
                "max-concurrent",
                format!("{} connections are already open", limits.max_concurrent),
            );
            let _ = stream.write_all(&http::reply(429, &conn.record.reason)).await;
            return;
        };
        // The first byte tells SOCKS5 from HTTP.
        match read_until(stream, &mut buf, 1, limits.idle, |b| !b.is_empty()).await {
            Ok(true) => {}
            _ => {
                conn.record.rule = "no-request".into();
                return;
            }
        }
        if buf[0] == 5 {
            let mut s = Prefixed { head: std::mem::take(&mut buf), at: 0, inner: &mut *stream };
            let asked = tokio::time::timeout(limits.idle, socks::handshake(&mut s)).await;
            let (host, port) = match asked {
                Ok(Ok(Ok(target))) => target,
                Ok(Ok(Err((code, why)))) => {
                    conn.refuse(NetDecision::Refused, "bad-request", why);
                    let _ = stream.write_all(&socks::reply(code)).await;
                    return;
                }
                _ => {
                    conn.refuse(NetDecision::Refused, "bad-request", "the SOCKS5 handshake did not complete");
                    return;
                }
            };
            conn.record = NetConnection::new(host, port, "socks");
            self.tunnel(conn, stream, true).await;
            return;
        }
        let head =
            read_until(stream, &mut buf, limits.max_head_bytes, limits.idle, |b| http::head_end(b).is_some()).await;
        let Some(end) = head.ok().filter(|ok| *ok).and_then(|_| http::head_end(&buf)) else {
            conn.refuse(
                NetDecision::Refused,
                "bad-request",
                format!("no complete request head within {} bytes", limits.max_head_bytes),
            );
            let _ = stream.write_all(&http::reply(431, &conn.record.reason)).await;
            return;
        };
        let request = match http::parse_request(&buf[..end]) {
            Ok(r) => r,
            Err(r) => {
                conn.refuse(NetDecision::Refused, "bad-request", r.reason.clone());
                let _ = stream.write_all(&http::reply(r.status, &r.reason)).await;
                return;
            }
        };
        match request {
            Request::Connect { host, port } => {
                conn.record = NetConnection::new(host, port, "https");
                if end < buf.len() {
                    // Bytes after a CONNECT head before its answer: a client that does not
                    // wait; they would go upstream undecided.
                    conn.refuse(NetDecision::Refused, "bad-request", "bytes were sent after CONNECT before its answer");
                    let _ = stream.write_all(&http::reply(400, &conn.record.reason)).await;
                    return;
                }
                self.tunnel(conn, stream, false).await;
            }
            Request::Forward { method, host, port, path, head, body, tls } => {
                conn.record = NetConnection::new(host, port, if tls { "https" } else { "http" });
                let rest = buf.split_off(end);
                self.forward(conn, stream, (&method, &path), (&head, body, tls), rest).await;
            }
        }
    }

    /// The policy's decision on `conn`'s target; `Err` has been recorded.
    fn decide(&self, conn: &mut Conn, extra: Option<(&str, &str)>) -> Result<(), ()> {
        let r = &conn.record;
        let mut args = json!({"host": r.host, "port": r.port, "scheme": r.scheme});
        if let Some((method, path)) = extra {
            args["method"] = json!(method);
            args["path"] = json!(path);
        }
        let now = self.inner.start.elapsed();
        let decided = ToolCall::from_json(NET_TOOL, &args, &Source::Sandbox)
            .ok_or(())
            .map(|call| self.inner.gate.lock().unwrap_or_else(PoisonError::into_inner).decide_unattended(&call, now));
        match decided {
            Ok(Ok(permit)) => {
                conn.record.rule = permit.rule().to_owned();
                Ok(())
            }
            Ok(Err(refused)) => {
                let reason = match refused.kind {
                    RefusalKind::NeedsApproval => {
                        format!("rule {} asks for approval, which a sandbox's connection cannot get", refused.rule)
                    }
                    _ => refused.reason,
                };
                let decision =
                    if refused.kind == RefusalKind::BadArguments { NetDecision::Refused } else { NetDecision::Denied };
                conn.refuse(decision, &refused.rule, reason);
                Err(())
            }
            Err(()) => {
                conn.refuse(NetDecision::Refused, "bad-request", "the connection's arguments are not an object");
                Err(())
            }
        }
    }

    /// The addresses `host:port` may be connected at (G3): a literal the policy allowed, a
    /// [`Resolve`] entry, or what the host's resolver says, less every address a name may
    /// not reach, and every address out of the grant's scope. `Err` has been recorded.
    async fn addresses(&self, conn: &mut Conn) -> Result<Vec<SocketAddr>, ()> {
        let scope = self.inner.scope.as_ref().map(NetScope::rules).filter(|s| !s.is_open());
        let addrs = self.reachable_addresses(conn).await?;
        let Some(scope) = scope else { return Ok(addrs) };
        let host = conn.record.host.clone();
        let out_of_scope = |conn: &mut Conn, why: String| {
            conn.refuse(NetDecision::Denied, "scope", format!("{host} is out of the sandbox's network scope: {why}"));
        };
        match scope.name(&host) {
            NameScope::Allowed => return Ok(addrs),
            NameScope::Denied => {
                out_of_scope(conn, "a deny entry names it".into());
                return Err(());
            }
            NameScope::ByAddress => {}
        }
        let (ok, denied): (Vec<SocketAddr>, Vec<SocketAddr>) = addrs.iter().partition(|a| scope.address(a.ip()));
        if ok.is_empty() {
            let ip = denied.first().map_or_else(String::new, |a| a.ip().to_string());
            out_of_scope(conn, format!("{ip} is in a denied block, and no allow entry names it"));
            return Err(());
        }
        Ok(ok)
    }

    /// [`Self::addresses`], before the scope.
    async fn reachable_addresses(&self, conn: &mut Conn) -> Result<Vec<SocketAddr>, ()> {
        let (host, port) = (conn.record.host.clone(), conn.record.port);
        if let Ok(ip) = host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
            // A literal the deciding rule did not name is held to the same address check
            // as a name: a rule for any host on a port does not open the host's loopback.
            if let Err(kind) = crate::addr::reachable(ip)
                && !self.inner.policy.names_literally(&conn.record.rule, ip)
            {
                let reason = format!(
                    "{ip} is a {kind} address, which only a rule naming it may reach (--allow-net {}:{port})",
                    if ip.is_ipv6() { format!("[{ip}]") } else { ip.to_string() }
                );
                conn.refuse(NetDecision::Refused, "private-address", reason);
                return Err(());
            }
            return Ok(vec![SocketAddr::new(ip, port)]);
        }
        if let Some(ip) = self.inner.resolve.lookup(&host, port) {
            return Ok(vec![SocketAddr::new(ip, port)]);
        }
        let looked =
            tokio::time::timeout(self.inner.limits.connect_timeout, tokio::net::lookup_host((host.as_str(), port)))
                .await;
        let all: Vec<SocketAddr> = match looked {
            Ok(Ok(addrs)) => addrs.collect(),
            Ok(Err(e)) => {
                conn.refuse(NetDecision::Refused, "unresolved", format!("{host} does not resolve: {e}"));
                return Err(());
            }
            Err(_) => {
                conn.refuse(NetDecision::Refused, "unresolved", format!("resolving {host} timed out"));
                return Err(());
            }
        };
        let mut why = None;
        let ok: Vec<SocketAddr> = all
            .iter()
            .filter(|a| match crate::addr::reachable(a.ip()) {
                Ok(()) => true,
                Err(kind) => {
                    why.get_or_insert((a.ip(), kind));
                    false
                }
            })
            .copied()
            .collect();
        if ok.is_empty() {
            let reason = match why {
                Some((ip, kind)) => format!(
                    "{host} resolves to {ip}, a {kind} address, which a name may not reach; --net-resolve {host}:{port}:{ip} to allow it"
                ),
                None => format!("{host} resolves to no address"),
            };
            conn.refuse(NetDecision::Refused, "private-address", reason);
            return Err(());
        }
        Ok(ok)
    }

    /// Connects to the first of `addrs` that answers; `Err` has been recorded.
    async fn connect(&self, conn: &mut Conn, addrs: &[SocketAddr]) -> Result<TcpStream, ()> {
        let mut last = String::from("no address");
        for addr in addrs {
            match tokio::time::timeout(self.inner.limits.connect_timeout, TcpStream::connect(addr)).await {
                Ok(Ok(s)) => {
                    let _ = s.set_nodelay(true);
                    conn.record.address = Some(addr.to_string());
                    conn.record.decision = NetDecision::Allowed;
                    return Ok(s);
                }
                Ok(Err(e)) => last = format!("{addr}: {e}"),
                Err(_) => last = format!("{addr}: timed out"),
            }
        }
        conn.refuse(
            NetDecision::Refused,
            "unreachable",
            format!("cannot connect to {}:{}: {last}", conn.record.host, conn.record.port),
        );
        Err(())
    }

    /// A CONNECT or SOCKS5 tunnel: decided, resolved, answered, its ClientHello checked
    /// (G4), then connected and carried.
    async fn tunnel<S: AsyncRead + AsyncWrite + Unpin + Send>(&self, conn: &mut Conn, stream: &mut S, socks: bool) {
        if self.decide(conn, None).is_err() {
            let body = if socks {
                socks::reply(socks::Reply::NotAllowed).to_vec()
            } else {
                http::reply(403, &denied_line(&conn.record))
            };
            let _ = stream.write_all(&body).await;
            return;
        }
        let Ok(addrs) = self.addresses(conn).await else {
            let body = if socks {
                socks::reply(socks::Reply::HostUnreachable).to_vec()
            } else {
                http::reply(403, &conn.record.reason)
            };
            let _ = stream.write_all(&body).await;
            return;
        };
        let ok = if socks { socks::reply(socks::Reply::Succeeded).to_vec() } else { http::reply(200, "") };
        if stream.write_all(&ok).await.is_err() {
            return;
        }
        let named = conn.record.host.parse::<IpAddr>().is_err();
        let limits = self.inner.limits;
        let mut hello = Vec::new();
        let mut want = 1;
        // A tunnel to an address the policy named literally carries whatever the guest sends:
        // there is no name for its TLS to match.
        let verdict = if !named {
            Hello::NoSni
        } else {
            loop {
                match read_until(stream, &mut hello, want, limits.idle, |b| b.len() >= want).await {
                    Ok(true) => {}
                    _ => break Hello::NotTls("the tunnel ended before its ClientHello"),
                }
                match tls::client_hello(&hello) {
                    Hello::NeedMore(n) => want = n,
                    other => break other,
                }
            }
        };
        let refused = match (&verdict, named) {
            (Hello::Sni(sni), true) if *sni != conn.record.host => Some((
                "sni-mismatch",
                format!("the TLS server name {sni:?} is not the tunnel's host {:?}", conn.record.host),
            )),
            (Hello::NoSni, true) => Some((
                "no-sni",
                "a tunnel to a name must carry TLS naming it (the ClientHello has no server name)".to_owned(),
            )),
            (Hello::NotTls(why), true) => {
                Some(("not-tls", format!("a tunnel to a name must carry TLS naming it: {why}")))
            }
            _ => None,
        };
        if let Some((rule, reason)) = refused {
            conn.refuse(NetDecision::Refused, rule, reason);
            return;
        }
        if named {
            match &self.inner.intercept {
                Some(Ok(i)) => {
                    if let Some(target) = i.target(&conn.record.host) {
                        let client = Prefixed { head: hello, at: 0, inner: &mut *stream };
                        self.intercept(conn, client, &addrs, target).await;
                        return;
                    }
                }
                Some(Err((hosts, why))) if hosts.contains(&conn.record.host) => {
                    conn.refuse(NetDecision::Refused, "secret-setup", why.clone());
                    return;
                }
                _ => {}
            }
        }
        let Ok(mut upstream) = self.connect(conn, &addrs).await else { return };
        if !self.charge(conn, hello.len(), Way::Up) || upstream.write_all(&hello).await.is_err() {
            return;
        }
        // A tunnel to a name stays TLS through its handshake, both ways (G4).
        let watch = named.then(|| (tls::RecordWatch::new(false), tls::RecordWatch::new(true)));
        self.splice(conn, stream, &mut upstream, watch).await;
    }

    /// A tunnel to a secret host (G8): the guest's TLS ends here with the per-run
    /// certificate; one request is read, its placeholder replaced in the secret's header,
    /// and sent on over TLS verified against the host's roots; the response comes back.
    async fn intercept<S: AsyncRead + AsyncWrite + Unpin + Send>(
        &self,
        conn: &mut Conn,
        client: Prefixed<&mut S>,
        addrs: &[SocketAddr],
        target: &Target,
    ) {
        let limits = self.inner.limits;
        let accepted =
            tokio::time::timeout(limits.idle, tokio_rustls::TlsAcceptor::from(target.server.clone()).accept(client))
                .await;
        let Ok(Ok(mut guest)) = accepted else {
            conn.refuse(
                NetDecision::Refused,
                "secret-tls",
                "the guest's TLS handshake with the per-run CA's certificate failed (does it trust $SSL_CERT_FILE?)",
            );
            return;
        };
        let mut buf = Vec::with_capacity(1024);
        let got =
            read_until(&mut guest, &mut buf, limits.max_head_bytes, limits.idle, |b| http::head_end(b).is_some()).await;
        let Some(end) = got.ok().filter(|ok| *ok).and_then(|_| http::head_end(&buf)) else {
            conn.refuse(
                NetDecision::Refused,
                "bad-request",
                "no complete request head inside the secret host's tunnel",
            );
            let _ = guest.write_all(&http::reply(431, &conn.record.reason)).await;
            return;
        };
        let (head, body) = match http::parse_origin(&buf[..end], &conn.record.host, conn.record.port, &target.inject())
        {
            Ok(parsed) => parsed,
            Err(r) => {
                conn.refuse(NetDecision::Refused, "bad-request", r.reason.clone());
                let _ = guest.write_all(&http::reply(r.status, &r.reason)).await;
                return;
            }
        };
        let Ok(tcp) = self.connect(conn, addrs).await else {
            let _ = guest.write_all(&http::reply(502, &conn.record.reason)).await;
            return;
        };
        let Ok(mut upstream) = self.upstream_tls(conn, tcp).await else {
            let _ = guest.write_all(&http::reply(502, &conn.record.reason)).await;
            return;
        };
        conn.record.secret = Some(target.headers());
        let rest = buf.split_off(end);
        self.relay(conn, &mut guest, &mut upstream, &head, body, rest).await;
        let _ = upstream.shutdown().await;
    }

    /// One request in absolute form (`(method, path)`, its rebuilt `head`, its `body`'s
    /// framing, whether the URL is `https://`): decided with its method and path, resolved,
    /// connected, forwarded with its body by its own framing (G5), and the response carried
    /// back.
    async fn forward<S: AsyncRead + AsyncWrite + Unpin + Send>(
        &self,
        conn: &mut Conn,
        stream: &mut S,
        (method, path): (&str, &str),
        (head, body, tls): (&[u8], Body, bool),
        rest: Vec<u8>,
    ) {
        if self.decide(conn, Some((method, path))).is_err() {
            let _ = stream.write_all(&http::reply(403, &denied_line(&conn.record))).await;
            return;
        }
        let Ok(addrs) = self.addresses(conn).await else {
            let _ = stream.write_all(&http::reply(403, &conn.record.reason)).await;
            return;
        };
        let Ok(mut upstream) = self.connect(conn, &addrs).await else {
            let _ = stream.write_all(&http::reply(502, &conn.record.reason)).await;
            return;
        };
        if !tls {
            self.relay(conn, stream, &mut upstream, head, body, rest).await;
            return;
        }
        // An https:// URL: the proxy is the TLS client, verifying the upstream against the
        // host's roots; a secret host's placeholder is replaced on the way (G8).
        let head = match self.secret_head(conn, head) {
            Ok(head) => head,
            Err(r) => {
                let _ = stream.write_all(&http::reply(r.0, &r.1)).await;
                return;
            }
        };
        let Ok(mut upstream) = self.upstream_tls(conn, upstream).await else {
            let _ = stream.write_all(&http::reply(502, &conn.record.reason)).await;
            return;
        };
        self.relay(conn, stream, &mut upstream, &head, body, rest).await;
        let _ = upstream.shutdown().await;
    }

    /// The scrubber of `conn`'s secret, if a secret was put into its request.
    fn scrubber(&self, conn: &Conn) -> Option<crate::secret::Scrub> {
        conn.record.secret.as_ref()?;
        let Some(Ok(i)) = &self.inner.intercept else { return None };
        i.target(&conn.record.host).map(Target::scrub)
    }

    /// `head` with the placeholder of `conn`'s host's secret replaced, if it has one.
    fn secret_head(&self, conn: &mut Conn, head: &[u8]) -> Result<Vec<u8>, (u16, String)> {
        let Some(Ok(i)) = &self.inner.intercept else { return Ok(head.to_vec()) };
        let Some(target) = i.target(&conn.record.host) else { return Ok(head.to_vec()) };
        match http::parse_origin(head, &conn.record.host, conn.record.port, &target.inject()) {
            Ok((head, _)) => {
                conn.record.secret = Some(target.headers());
                Ok(head)
            }
            Err(r) => {
                conn.refuse(NetDecision::Refused, "bad-request", r.reason.clone());
                Err((r.status, r.reason))
            }
        }
    }

    /// TLS to `conn`'s host over `tcp`, verified against the host's roots (a secret host's
    /// tunnel and an `https://` request alike); `Err` has been recorded.
    async fn upstream_tls(
        &self,
        conn: &mut Conn,
        tcp: TcpStream,
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>, ()> {
        let config = self.inner.upstream_tls.get_or_init(|| crate::secret::client_config(None)).clone();
        let name = rustls::pki_types::ServerName::try_from(conn.record.host.clone()).map_err(|e| e.to_string());
        let connected = match (config, name) {
            (Ok(config), Ok(name)) => tokio::time::timeout(
                self.inner.limits.connect_timeout,
                tokio_rustls::TlsConnector::from(config).connect(name, tcp),
            )
            .await
            .map_err(|_| "timed out".to_owned())
            .and_then(|r| r.map_err(|e| e.to_string())),
            (Err(e), _) | (_, Err(e)) => Err(e),
        };
        connected.map_err(|e| {
            conn.refuse(
                NetDecision::Refused,
                "upstream-tls",
                format!("{}'s TLS did not verify against the host's roots: {e}", conn.record.host),
            );
        })
    }

    /// Sends one request (its `head`, then its body by `body`'s framing, starting with the
    /// `rest` already read) to `upstream`, and carries the response back, its head
    /// rewritten to close.
    async fn relay<C: AsyncRead + AsyncWrite + Unpin + Send, U: AsyncRead + AsyncWrite + Unpin>(
        &self,
        conn: &mut Conn,
        stream: &mut C,
        upstream: &mut U,
        head: &[u8],
        body: Body,
        rest: Vec<u8>,
    ) {
        // The whole of a sized body is reserved before its head goes up: a body the budget
        // cannot carry is refused, never announced and then cut.
        if let Body::Length(n) = body
            && !self.room_up(conn, (head.len() as u64).saturating_add(n))
        {
            let _ =
                stream.write_all(&http::reply(413, "the request is over what this connection may still send")).await;
            return;
        }
        if self.send_up(conn, upstream, head).await.is_err() {
            return;
        }
        let mut client = Prefixed { head: rest, at: 0, inner: &mut *stream };
        if let Err(cut) = self.send_body(conn, &mut client, upstream, body).await {
            conn.record.cut = Some(cut.into());
            return;
        }
        // The response head, rewritten to close; then the rest as it comes.
        let limits = self.inner.limits;
        let mut head = Vec::new();
        let got =
            read_until(upstream, &mut head, limits.max_head_bytes, limits.idle, |b| http::head_end(b).is_some()).await;
        let Some(end) = got.ok().filter(|ok| *ok).and_then(|_| http::head_end(&head)) else {
            conn.record.cut = Some("bad-response".into());
            let _ = client
                .inner
                .write_all(&http::reply(502, "the upstream's response head is malformed or too large"))
                .await;
            return;
        };
        let Some(rewritten) = http::rewrite_response(&head[..end]) else {
            conn.record.cut = Some("bad-response".into());
            let _ = client.inner.write_all(&http::reply(502, "the upstream's response head is malformed")).await;
            return;
        };
        // A secret host's answer goes back with the value masked (G8): it could repeat the
        // request (an echo, an error page), and the guest must never read the value.
        let mut scrub = self.scrubber(conn);
        if scrub.is_some() && http::response_encoded(&rewritten) {
            conn.record.cut = Some("secret-encoded".into());
            let _ = client
                .inner
                .write_all(&http::reply(502, "a secret host's response is compressed, so it cannot be scrubbed"))
                .await;
            return;
        }
        let (rewritten, first) = match scrub.as_mut() {
            Some(s) => {
                let mut h = s.feed(&rewritten);
                h.extend(s.finish());
                (h, s.feed(&head[end..]))
            }
            None => (rewritten, head[end..].to_vec()),
        };
        if !self.charge(conn, head.len(), Way::Down)
            || client.inner.write_all(&rewritten).await.is_err()
            || client.inner.write_all(&first).await.is_err()
        {
            return;
        }
        let cut = self.pump_down(conn, upstream, client.inner, scrub.as_mut()).await;
        conn.record.cut = cut.map(str::to_owned);
        let _ = client.inner.shutdown().await;
    }

    /// Copies one request body, framed as `body`, from the guest upstream.
    pub(crate) async fn send_body<C: AsyncRead + Unpin, U: AsyncWrite + Unpin>(
        &self,
        conn: &mut Conn,
        from: &mut C,
        to: &mut U,
        body: Body,
    ) -> Result<(), &'static str> {
        match body {
            Body::Length(n) => self.copy_exact(conn, from, to, n).await,
            // Buffered: size lines are read a line at a time, not a byte per read. What the
            // buffer holds past the last chunk is dropped with it: nothing after a body is
            // forwarded.
            Body::Chunked => self.copy_chunked(conn, &mut tokio::io::BufReader::new(from), to).await,
        }
    }

    /// Copies exactly `n` body bytes from the guest upstream.
    async fn copy_exact<C: AsyncRead + Unpin, U: AsyncWrite + Unpin>(
        &self,
        conn: &mut Conn,
        from: &mut C,
        to: &mut U,
        mut n: u64,
    ) -> Result<(), &'static str> {
        let mut buf = vec![0u8; CHUNK];
        while n > 0 {
            let want = usize::try_from(n).unwrap_or(CHUNK).min(CHUNK);
            let got = tokio::time::timeout(self.inner.limits.idle, from.read(&mut buf[..want]))
                .await
                .map_err(|_| "idle")?
                .map_err(|_| "client-error")?;
            if got == 0 {
                return Err("body-cut-short");
            }
            if !self.charge(conn, got, Way::Up) {
                return Err("max-bytes");
            }
            to.write_all(&buf[..got]).await.map_err(|_| "upstream-error")?;
            n -= got as u64;
        }
        Ok(())
    }

    /// Copies a chunked body upstream in its canonical form (G5): each size line read
    /// strictly ([`http::chunk_size`]) and sent as `{size:x}`, each chunk's data and its
    /// CRLF checked, the trailer section bounded by the head limit, each field checked and
    /// re-serialised ([`http::trailer_field`]), and every byte of it counted. Lines end in
    /// CRLF only: a bare LF is the end of the body, not a line, since a reader upstream
    /// could take it for one and read what follows as a second request.
    async fn copy_chunked<C: AsyncRead + Unpin, U: AsyncWrite + Unpin>(
        &self,
        conn: &mut Conn,
        from: &mut C,
        to: &mut U,
    ) -> Result<(), &'static str> {
        let limits = self.inner.limits;
        loop {
            let line = read_line(from, limits.max_head_bytes, limits.idle).await?;
            let size = http::chunk_size(&line).ok_or("bad-chunk")?;
            let size_line = format!("{size:x}\r\n");
            // The whole chunk fits in the budget, or its size never goes up: no reader
            // upstream is handed a size the proxy could not deliver (2^64 - 1, which some
            // read as -1).
            if !self.room_up(conn, (size_line.len() as u64 + 2).saturating_add(size)) {
                return Err("max-bytes");
            }
            self.send_up(conn, to, size_line.as_bytes()).await?;
            if size == 0 {
                return self.copy_trailers(conn, from, to).await;
            }
            self.copy_exact(conn, from, to, size).await?;
            if !read_line(from, 0, limits.idle).await?.is_empty() {
                return Err("bad-chunk");
            }
            self.send_up(conn, to, b"\r\n").await?;
        }
    }

    /// The trailer section after a last chunk, to its empty line: at most the head limit in
    /// all, each field counted and sent in its canonical form.
    async fn copy_trailers<C: AsyncRead + Unpin, U: AsyncWrite + Unpin>(
        &self,
        conn: &mut Conn,
        from: &mut C,
        to: &mut U,
    ) -> Result<(), &'static str> {
        let limits = self.inner.limits;
        let mut left = limits.max_head_bytes;
        loop {
            let line = read_line(from, left, limits.idle).await?;
            if line.is_empty() {
                return self.send_up(conn, to, b"\r\n").await;
            }
            left = left.saturating_sub(line.len() + 2);
            let mut field = http::trailer_field(&line).ok_or("bad-trailer")?;
            field.extend_from_slice(b"\r\n");
            self.send_up(conn, to, &field).await?;
        }
    }

    /// Counts `bytes` going up ([`Egress::charge`]), then writes them to the upstream.
    pub(crate) async fn send_up<U: AsyncWrite + Unpin>(
        &self,
        conn: &mut Conn,
        to: &mut U,
        bytes: &[u8],
    ) -> Result<(), &'static str> {
        if !self.charge(conn, bytes.len(), Way::Up) {
            return Err("max-bytes");
        }
        to.write_all(bytes).await.map_err(|_| "upstream-error")
    }

    /// Counts `n` bytes of `conn` going `way`: against the run's bound that way, and against
    /// the byte budget of the rule that allowed the connection (a policy's `max_bytes`,
    /// both ways together). `false` once either is spent, the cut recorded.
    /// Whether `n` more bytes up fit in what the run and the connection's rule may still
    /// send (nothing is charged: [`Egress::charge`] counts them as they go). If not, the
    /// connection's record is cut as `charge` would cut it.
    fn room_up(&self, conn: &mut Conn, n: u64) -> bool {
        if self.inner.up.load(Ordering::SeqCst).saturating_add(n) > self.inner.limits.max_bytes_up {
            conn.record.cut = Some("max-bytes".into());
            return false;
        }
        let Some(budget) = self.inner.budgets.get(&conn.record.rule) else { return true };
        let used = self.inner.budget_used.lock().unwrap_or_else(PoisonError::into_inner);
        if used.get(&conn.record.rule).copied().unwrap_or(0).saturating_add(n) > *budget {
            conn.record.reason = format!("rule {}'s max_bytes of {budget} is spent", conn.record.rule);
            conn.record.cut = Some("max-bytes".into());
            return false;
        }
        true
    }

    fn charge(&self, conn: &mut Conn, n: usize, way: Way) -> bool {
        let n = n as u64;
        let (mine, total, max) = match way {
            Way::Up => (&mut conn.record.bytes_up, &self.inner.up, self.inner.limits.max_bytes_up),
            Way::Down => (&mut conn.record.bytes_down, &self.inner.down, self.inner.limits.max_bytes_down),
        };
        *mine += n;
        if total.fetch_add(n, Ordering::SeqCst) + n > max {
            conn.record.cut = Some("max-bytes".into());
            return false;
        }
        let Some(budget) = self.inner.budgets.get(&conn.record.rule) else { return true };
        let mut used = self.inner.budget_used.lock().unwrap_or_else(PoisonError::into_inner);
        let spent = used.entry(conn.record.rule.clone()).or_insert(0);
        *spent += n;
        if *spent > *budget {
            conn.record.reason = format!("rule {}'s max_bytes of {budget} is spent", conn.record.rule);
            conn.record.cut = Some("max-bytes".into());
            return false;
        }
        true
    }

    /// Carries the upstream's bytes to the guest until the upstream ends; the cut, if the
    /// proxy made one.
    async fn pump_down<U: AsyncRead + Unpin, C: AsyncWrite + Unpin>(
        &self,
        conn: &mut Conn,
        up: &mut U,
        client: &mut C,
        mut scrub: Option<&mut crate::secret::Scrub>,
    ) -> Option<&'static str> {
        let limits = self.inner.limits;
        let deadline = tokio::time::Instant::from_std(conn.started + limits.max_duration);
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = tokio::select! {
                () = tokio::time::sleep_until(deadline) => return Some("max-duration"),
                r = tokio::time::timeout(limits.idle, up.read(&mut buf)) => match r {
                    Err(_) => return Some("idle"),
                    Ok(Ok(0) | Err(_)) => {
                        if let Some(s) = scrub {
                            let _ = client.write_all(&s.finish()).await;
                        }
                        return None;
                    }
                    Ok(Ok(n)) => n,
                },
            };
            if !self.charge(conn, n, Way::Down) {
                return Some("max-bytes");
            }
            let wrote = match scrub.as_deref_mut() {
                Some(s) => client.write_all(&s.feed(&buf[..n])).await,
                None => client.write_all(&buf[..n]).await,
            };
            if wrote.is_err() {
                return None;
            }
        }
    }

    /// Carries bytes both ways until both sides have ended, or a bound cuts it (G6). With
    /// `watch` (the client's and the upstream's [`tls::RecordWatch`]), each direction must be
    /// TLS records until its first application data, and nothing more of the client's goes
    /// upstream until the upstream has answered with a ServerHello (G4).
    async fn splice<C: AsyncRead + AsyncWrite + Unpin + Send>(
        &self,
        conn: &mut Conn,
        client: &mut C,
        upstream: &mut TcpStream,
        mut watch: Option<(tls::RecordWatch, tls::RecordWatch)>,
    ) {
        let limits = self.inner.limits;
        let deadline = tokio::time::Instant::from_std(conn.started + limits.max_duration);
        let (mut ur, mut uw) = upstream.split();
        let (mut cr, mut cw) = tokio::io::split(client);
        let (mut cbuf, mut ubuf) = (vec![0u8; CHUNK], vec![0u8; CHUNK]);
        let (mut up_open, mut down_open) = (true, true);
        let cut = loop {
            if !up_open && !down_open {
                break None;
            }
            let hello_seen = watch.as_ref().is_none_or(|(_, server)| server.hello_seen());
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => break Some("max-duration"),
                () = tokio::time::sleep(limits.idle) => break Some("idle"),
                r = cr.read(&mut cbuf), if up_open && hello_seen => match r {
                    Ok(0) | Err(_) => {
                        up_open = false;
                        let _ = uw.shutdown().await;
                    }
                    Ok(n) => {
                        if let Some(Err(why)) = watch.as_mut().map(|(client, _)| client.feed(&cbuf[..n])) {
                            conn.record.reason = format!("the tunnel stopped carrying TLS: {why}");
                            break Some("not-tls");
                        }
                        if !self.charge(conn, n, Way::Up) {
                            break Some("max-bytes");
                        }
                        if uw.write_all(&cbuf[..n]).await.is_err() {
                            break None;
                        }
                    }
                },
                r = ur.read(&mut ubuf), if down_open => match r {
                    Ok(0) | Err(_) => {
                        down_open = false;
                        let _ = cw.shutdown().await;
                    }
                    Ok(n) => {
                        if let Some(Err(why)) = watch.as_mut().map(|(_, server)| server.feed(&ubuf[..n])) {
                            conn.record.reason = format!("the upstream does not speak TLS: {why}");
                            break Some("not-tls");
                        }
                        if watch.as_ref().is_some_and(|(c, s)| c.done() && s.done()) {
                            watch = None;
                        }
                        if !self.charge(conn, n, Way::Down) {
                            break Some("max-bytes");
                        }
                        if cw.write_all(&ubuf[..n]).await.is_err() {
                            break None;
                        }
                    }
                },
            }
        };
        conn.record.cut = cut.map(str::to_owned);
    }
}

/// Reads one line of at most `max` bytes before its CRLF, and returns it without the CRLF.
/// A line that ends in a bare LF, holds a CR elsewhere, or runs past `max` is `bad-chunk`;
/// a stream that ends first is `body-cut-short`.
async fn read_line<C: AsyncRead + Unpin>(from: &mut C, max: usize, idle: Duration) -> Result<Vec<u8>, &'static str> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        let n =
            tokio::time::timeout(idle, from.read(&mut byte)).await.map_err(|_| "idle")?.map_err(|_| "client-error")?;
        if n == 0 {
            return Err("body-cut-short");
        }
        match byte[0] {
            b'\n' if line.last() == Some(&b'\r') => {
                line.pop();
                return Ok(line);
            }
            b'\n' => return Err("bad-chunk"),
            _ if line.last() == Some(&b'\r') => return Err("bad-chunk"),
            b => line.push(b),
        }
        if line.len() > max.saturating_add(1) {
            return Err("bad-chunk");
        }
    }
}

/// The one line a denial is shown as (`stockade: denied connect evil.example:443 (...)`).
#[must_use]
pub fn denied_line(r: &NetConnection) -> String {
    if r.host.is_empty() {
        return format!("refused a proxy request ({}: {})", r.rule, r.reason);
    }
    let target =
        if r.host.contains(':') { format!("[{}]:{}", r.host, r.port) } else { format!("{}:{}", r.host, r.port) };
    let hint = if r.rule == "default-deny" {
        let entry = if matches!(r.port, 80 | 443) { r.host.clone() } else { target.clone() };
        format!("no rule allows it; --allow-net {entry} to allow")
    } else {
        format!("rule {}: {}", r.rule, r.reason)
    };
    format!("denied connect {target} ({hint})")
}

/// A stream with some of its bytes already read: those first, then the stream.
/// The runtime's loopback front reads a connection's first bytes to route it, then hands
/// it on as one of these (so nothing is peeked in a loop).
pub struct Prefixed<S> {
    head: Vec<u8>,
    at: usize,
    inner: S,
}

impl<S> Prefixed<S> {
    /// `inner`, whose first bytes, `head`, were already read.
    pub fn new(head: Vec<u8>, inner: S) -> Self {
        Self { head, at: 0, inner }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.at < self.head.len() {
            let n = (self.head.len() - self.at).min(buf.remaining());
            let at = self.at;
            buf.put_slice(&self.head[at..at + n]);
            self.at += n;
            return std::task::Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
