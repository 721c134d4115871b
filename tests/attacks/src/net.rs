//! The network rows' plumbing: the run's proxy (from `HTTP_PROXY`, as every client finds
//! it), one exchange through it, SOCKS5 frames, and TLS ClientHellos built by hand.
//!
//! The harness passes `up=PORT` (the allowed upstream, `allowed.test`, pointed at
//! 127.0.0.2 with `--net-resolve`), `forbidden=ADDR:PORT` (a listener no rule allows),
//! `dns=ADDR:PORT` (a UDP listener standing in for a resolver) and `tcp=PORT` (the world's
//! listener on the host's 127.0.0.1). Everything an attack must not get through carries the
//! word `forbidden`, so the host's listeners can tell it from the baseline.

use std::io::{Error, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::{arg, errno_name};

/// The name the harness's policy allows, at `up=PORT`.
pub const ALLOWED: &str = "allowed.test";

/// The proxy's address, from `HTTP_PROXY` (`http://127.0.0.1:PORT`).
#[must_use]
pub fn proxy() -> SocketAddr {
    let url = std::env::var("HTTP_PROXY").unwrap_or_default();
    let port = url.rsplit(':').next().and_then(|p| p.trim_end_matches('/').parse().ok()).unwrap_or(9);
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// The allowed upstream's port.
#[must_use]
pub fn up() -> u16 {
    arg("up").parse().unwrap_or(9)
}

/// Reads what `s` sends until it closes, `cap` bytes, or `wait` passes without a byte.
pub fn read_some(s: &mut TcpStream, cap: usize, wait: Duration) -> Vec<u8> {
    let _ = s.set_read_timeout(Some(wait));
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let start = Instant::now();
    while out.len() < cap && start.elapsed() < Duration::from_secs(5) {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    out
}

/// A fresh connection to the proxy.
pub fn connect() -> Result<TcpStream, Error> {
    let s = TcpStream::connect_timeout(&proxy(), Duration::from_secs(2))?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// Sends `bytes` to the proxy on a fresh connection and returns all it answers.
pub fn exchange(bytes: &[u8]) -> Result<Vec<u8>, Error> {
    let mut s = connect()?;
    s.write_all(bytes)?;
    Ok(read_some(&mut s, 1 << 16, Duration::from_secs(2)))
}

/// `http200`, `http403`, ... from an answer's status line; `closed` for no answer.
#[must_use]
pub fn status(answer: &[u8]) -> String {
    let text = String::from_utf8_lossy(answer);
    match text.split_whitespace().nth(1).filter(|_| text.starts_with("HTTP/")) {
        Some(code) => format!("http{code}"),
        None if answer.is_empty() => "closed".into(),
        None => "garbled".into(),
    }
}

/// Prints one proxied attempt: `ok` only when the proxy answered 200 (it carried it).
pub fn report_http(what: &str, r: Result<Vec<u8>, Error>) {
    match r {
        Ok(a) if a.starts_with(b"HTTP/1.1 200") => println!("ATTEMPT {what} ok"),
        Ok(a) => println!("ATTEMPT {what} {}", status(&a)),
        Err(e) => println!("ATTEMPT {what} {}", errno_name(&e)),
    }
}

/// The baseline every network attack makes first: one allowed plain request, which the
/// harness requires the upstream to have seen (else the grant never worked, and every
/// denial below would prove nothing).
pub fn baseline() {
    let port = up();
    let r = exchange(
        format!("GET http://{ALLOWED}:{port}/ok-baseline HTTP/1.1\r\nHost: {ALLOWED}:{port}\r\n\r\n").as_bytes(),
    );
    println!("DATA baseline {}", r.map(|a| status(&a)).unwrap_or_else(|e| errno_name(&e)));
}

/// Opens a CONNECT tunnel to `target`, then sends `then` in `pieces` writes; prints `ok`
/// only if the far end answered through the tunnel.
pub fn tunnel(what: &str, target: &str, then: &[u8], pieces: usize) {
    println!("ATTEMPT {what} {}", tunnel_result(target, then, pieces));
}

/// What [`tunnel`] prints after the attempt's name: `ok`, `closed`, `http403`, an errno.
#[must_use]
pub fn tunnel_result(target: &str, then: &[u8], pieces: usize) -> String {
    let r = (|| -> Result<String, Error> {
        let mut s = connect()?;
        s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())?;
        let head = read_head(&mut s);
        if !head.starts_with(b"HTTP/1.1 200") {
            return Ok(status(&head));
        }
        for part in then.chunks(then.len().div_ceil(pieces.max(1)).max(1)) {
            s.write_all(part)?;
            std::thread::sleep(Duration::from_millis(5));
        }
        let answer = read_some(&mut s, 1 << 16, Duration::from_millis(1500));
        Ok(if answer.is_empty() { "closed".into() } else { "ok".into() })
    })();
    r.unwrap_or_else(|e| errno_name(&e))
}

/// Reads a response head byte by byte (so nothing after it is consumed).
fn read_head(s: &mut TcpStream) -> Vec<u8> {
    let _ = s.set_read_timeout(Some(Duration::from_secs(3)));
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 8192 {
        match s.read(&mut b) {
            Ok(1) => head.push(b[0]),
            _ => break,
        }
    }
    head
}

/// A SOCKS5 request (no authentication) for `cmd` (1 connect, 3 UDP associate) to the
/// address `atyp` and `addr` (for a name, its length byte first) and `port`; the reply
/// code, or the error. `then` is sent once the request succeeds.
pub fn socks(what: &str, cmd: u8, atyp: u8, addr: &[u8], port: u16, then: &[u8]) {
    let r = (|| -> Result<String, Error> {
        let mut s = connect()?;
        let mut req = vec![5, 1, 0, 5, cmd, 0, atyp];
        req.extend_from_slice(addr);
        req.extend_from_slice(&port.to_be_bytes());
        s.write_all(&req)?;
        let _ = s.set_read_timeout(Some(Duration::from_secs(3)));
        let mut reply = [0u8; 12];
        let n = s.read(&mut reply)?;
        // The method choice (2 bytes), then the request's reply: its code is byte 3.
        let mut got = reply[..n].to_vec();
        if got.len() < 4 {
            got.extend(read_some(&mut s, 10, Duration::from_secs(2)));
        }
        match got.get(3) {
            Some(0) => {
                s.write_all(then)?;
                let answer = read_some(&mut s, 1 << 16, Duration::from_millis(1500));
                Ok(if answer.is_empty() { "closed".into() } else { "ok".into() })
            }
            Some(code) => Ok(format!("socks{code}")),
            None => Ok("closed".into()),
        }
    })();
    match r {
        Ok(v) => println!("ATTEMPT {what} {v}"),
        Err(e) => println!("ATTEMPT {what} {}", errno_name(&e)),
    }
}

/// A SOCKS5 domain-name address: its length, then the name.
#[must_use]
pub fn socks_name(name: &str) -> Vec<u8> {
    let mut a = vec![u8::try_from(name.len()).unwrap_or(u8::MAX)];
    a.extend_from_slice(name.as_bytes());
    a
}

/// A TLS ClientHello record (TLS 1.3's shape: one cipher suite, null compression) carrying
/// `extensions` as they are given: enough for a proxy's SNI check, not a handshake anyone
/// completes.
#[must_use]
pub fn tls_client_hello(extensions: &[u8]) -> Vec<u8> {
    let mut body = vec![3, 3];
    body.extend([9u8; 32]);
    body.extend([0, 0, 2, 0x13, 0x01, 1, 0]);
    body.extend(u16::try_from(extensions.len()).unwrap_or(u16::MAX).to_be_bytes());
    body.extend(extensions);
    let mut handshake = vec![1];
    handshake.extend(&u32::try_from(body.len()).unwrap_or(u32::MAX).to_be_bytes()[1..]);
    handshake.extend(body);
    let mut record = vec![0x16, 3, 1];
    record.extend(u16::try_from(handshake.len()).unwrap_or(u16::MAX).to_be_bytes());
    record.extend(handshake);
    record
}

/// A `server_name` extension listing `names` (each a `host_name` entry).
#[must_use]
pub fn tls_sni_extension(names: &[&str]) -> Vec<u8> {
    let mut list = Vec::new();
    for n in names {
        list.push(0);
        list.extend(u16::try_from(n.len()).unwrap_or(u16::MAX).to_be_bytes());
        list.extend(n.as_bytes());
    }
    let mut ext = vec![0, 0];
    ext.extend(u16::try_from(list.len() + 2).unwrap_or(u16::MAX).to_be_bytes());
    ext.extend(u16::try_from(list.len()).unwrap_or(u16::MAX).to_be_bytes());
    ext.extend(list);
    ext
}
