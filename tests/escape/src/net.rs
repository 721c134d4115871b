//! The network rows: what the harness grants an attack (a network policy and one
//! `--net-resolve` entry), the listeners it stands up on 127.0.0.x, and how it judges the
//! run from them, never from the attack's words.
//!
//! - `allowed.test` is the one name the policy allows, on one port, pointed at an upstream
//!   on 127.0.0.2 that records every byte it is sent. Each attack first makes one allowed
//!   request; the harness requires the upstream to have seen it, so that a grant that never
//!   worked cannot pass for one that held.
//! - `paths.test` names the same upstream through a narrower rule: paths under `/pub` only,
//!   and 10,000 bytes in all. What a request carries past a decided path or past the byte
//!   budget carries the word `forbidden` too.
//! - A third rule is careless on purpose: any host on the world's port (its listener on
//!   the host's 127.0.0.1). Only the address checks stand between that rule and the host.
//! - A listener on 127.0.0.3 that no rule allows, and a UDP socket there standing in for a
//!   resolver, must see nothing at all.
//!
//! Everything an attack must not get through carries the word `forbidden`; the allowed
//! upstream must never see it.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use stockade_protocol::Report;
use stockade_runtime::egress::{NetGrant, NetPolicy, Resolve};

/// The name the policy allows.
pub const ALLOWED: &str = "allowed.test";

/// A second name for the same upstream, allowed under `/pub` only and for 10,000 bytes.
pub const PATHS: &str = "paths.test";

/// A TCP listener that records what each connection sends.
struct Recorder {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Recorder {
    /// Listens on `ip`. An HTTP request head is answered `200 ok` and the connection
    /// closed; other bytes are answered `server-hello` once the sender pauses.
    fn start(ip: &str) -> anyhow::Result<Self> {
        let listener = TcpListener::bind((ip, 0))?;
        let addr = listener.local_addr()?;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        std::thread::spawn(move || {
            for c in listener.incoming().flatten() {
                let s = s.clone();
                std::thread::spawn(move || record(c, &s));
            }
        });
        Ok(Self { addr, seen })
    }

    /// What each connection sent since the last call, and forgets it.
    fn take(&self) -> Vec<Vec<u8>> {
        std::mem::take(&mut *self.seen.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

fn record(mut c: TcpStream, seen: &Mutex<Vec<Vec<u8>>>) {
    let i = {
        let mut v = seen.lock().unwrap_or_else(PoisonError::into_inner);
        v.push(Vec::new());
        v.len() - 1
    };
    let _ = c.set_read_timeout(Some(Duration::from_millis(250)));
    let (mut got, mut buf, start, mut answered) = (Vec::new(), [0u8; 8192], Instant::now(), false);
    while start.elapsed() < Duration::from_secs(4) {
        match c.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                got.extend_from_slice(&buf[..n]);
                seen.lock().unwrap_or_else(PoisonError::into_inner)[i].extend_from_slice(&buf[..n]);
                if !answered && got.windows(4).any(|w| w == b"\r\n\r\n") {
                    let _ = c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
                    answered = true;
                }
            }
            // Quiet after the answer: done. Quiet after bytes that were no request head (a
            // ClientHello): answer them.
            Err(_) if answered => break,
            Err(_) if !got.is_empty() => {
                let _ = c.write_all(b"server-hello");
                answered = true;
            }
            Err(_) => {}
        }
    }
}

/// The listeners of the network rows.
pub struct NetWorld {
    upstream: Recorder,
    forbidden: Recorder,
    dns: UdpSocket,
}

impl NetWorld {
    /// Stands up the upstream (127.0.0.2), the forbidden listener and the resolver
    /// (127.0.0.3).
    pub fn new() -> anyhow::Result<Self> {
        let dns = UdpSocket::bind("127.0.0.3:0")?;
        dns.set_nonblocking(true)?;
        Ok(Self { upstream: Recorder::start("127.0.0.2")?, forbidden: Recorder::start("127.0.0.3")?, dns })
    }

    /// The arguments an attack gets (beside the world's `tcp=PORT`).
    #[must_use]
    pub fn args(&self) -> Vec<String> {
        vec![
            format!("up={}", self.upstream.addr.port()),
            format!("forbidden={}", self.forbidden.addr),
            format!("dns={}", self.dns.local_addr().map(|a| a.to_string()).unwrap_or_default()),
        ]
    }

    /// The policy (TOML) and the `--net-resolve` entries (comma-separated) of a run whose world listener is on
    /// the host's `tcp` port.
    #[must_use]
    pub fn grant_spec(&self, tcp: u16) -> (String, String) {
        let up = self.upstream.addr.port();
        let policy = format!(
            r#"version = 1
default = "deny"

[[rule]]
id = "allowed-upstream"
tool = "net.connect"
effect = "allow"
args.host = {{ hosts = ["{ALLOWED}"] }}
args.port = {{ const = {up} }}

[[rule]]
id = "paths-pub-only"
tool = "net.connect"
effect = "allow"
args.host = {{ hosts = ["{PATHS}"] }}
args.port = {{ const = {up} }}
args.path = {{ path_prefix = "/pub" }}
limits = {{ max_bytes = 10000 }}

[[rule]]
id = "careless-any-host"
tool = "net.connect"
effect = "allow"
args.port = {{ const = {tcp} }}
"#
        );
        let ip = self.upstream.addr.ip();
        (policy, format!("{ALLOWED}:{up}:{ip},{PATHS}:{up}:{ip}"))
    }

    /// The judgement from the listeners and the report's record of connections: `Err` if
    /// the allowed baseline never arrived (the harness, not the tier, is broken).
    pub fn judge(&self, report: &Report) -> anyhow::Result<Option<String>> {
        // Connections the proxy is still cutting may land a moment after the run ends.
        std::thread::sleep(Duration::from_millis(300));
        let upstream = self.upstream.take();
        let forbidden = self.forbidden.take();
        let mut datagram = [0u8; 512];
        if let Ok((n, from)) = self.dns.recv_from(&mut datagram) {
            return Ok(Some(format!(
                "the stand-in resolver received a datagram from {from}: {:?}",
                String::from_utf8_lossy(&datagram[..n])
            )));
        }
        if !forbidden.is_empty() {
            return Ok(Some(format!("a listener no rule allows was connected to {} times", forbidden.len())));
        }
        if let Some(bad) = upstream.iter().find(|b| b.windows(9).any(|w| w.eq_ignore_ascii_case(b"forbidden"))) {
            return Ok(Some(format!(
                "the allowed upstream was sent what the proxy must refuse: {:?}",
                String::from_utf8_lossy(&bad[..bad.len().min(200)])
            )));
        }
        let g = report.grants.clone().unwrap_or_default();
        if let Some(c) = g.connections.iter().find(|c| c.host.contains("forbidden") && c.address.is_some()) {
            return Ok(Some(format!("a name no rule allows was resolved and connected: {c:?}")));
        }
        if !upstream.iter().any(|b| b.windows(11).any(|w| w == b"ok-baseline")) {
            anyhow::bail!(
                "the allowed baseline request never reached the upstream (the grant does not work here); the run's connections: {:?}",
                g.connections
            );
        }
        Ok(None)
    }
}

/// The network grant of `policy` (TOML) with the `resolve` entries (comma-separated).
pub fn grant(policy: &str, resolve: &str) -> anyhow::Result<NetGrant> {
    let policy = NetPolicy::from_toml(policy).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut entries = Resolve::new();
    for entry in resolve.split(',') {
        entries = entries.entry(entry).map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    Ok(NetGrant::new(policy).resolve(entries))
}
