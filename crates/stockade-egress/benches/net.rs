#![allow(missing_docs, reason = "a bench's main")]
#![allow(clippy::unwrap_used, reason = "a bench fails loudly")]
//! The network grant's costs, each next to a baseline measured in the same run:
//! - `net_download_100mib`: 100 MiB from a local upstream through a CONNECT tunnel (an
//!   address-literal grant, so the bytes are not TLS), next to the same download straight
//!   from the upstream;
//! - `net_connect`: one allowed connection's setup (CONNECT, the decision, the ClientHello's
//!   SNI check, the upstream's connect) and a one-byte answer, next to a direct connect and
//!   the same ClientHello and answer;
//! - `net_decide`: one connection's policy decision under 10 `--allow-net` rules, next to
//!   building the call alone;
//! - in the first two, `peer_tinyproxy`: the same through tinyproxy (Debian's), a forward
//!   proxy users already run, started on the same loopback for the run when it is installed
//!   (skipped, and said so, when it is not), and `own_process`: the same through stockade's
//!   proxy in a process of its own (this bench binary, run again as the proxy), as tinyproxy
//!   is, so neither shares the client's and upstream's runtime;
//! - `net_relay_ceiling`: what any relay can do on this machine's loopback, with no proxy
//!   logic at all: 100 MiB read straight, through a plain 256 KiB copy loop on a thread, and
//!   through `splice(2)` via a 1 MiB pipe (zero-copy relaying), all with std threads.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group};
use serde_json::json;
use stockade_egress::{NetGrant, NetPolicy, NetRule, Resolve};
use stockade_policy::allow::{Gate, Source, ToolCall};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const DOWNLOAD: usize = 100 << 20;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// An upstream that writes `DOWNLOAD` bytes to each connection after reading one byte, or,
/// for a ClientHello (0x16), answers one byte.
async fn upstream() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.2:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let chunk = vec![7u8; 1 << 20];
        loop {
            let (mut c, _) = l.accept().await.unwrap();
            let chunk = chunk.clone();
            tokio::spawn(async move {
                let mut first = [0u8; 512];
                let Ok(n) = c.read(&mut first).await else { return };
                if n > 0 && first[0] == 0x16 {
                    // The start of a ServerHello record: a tunnel to a name stays TLS (G4),
                    // so the proxy passes only what looks like a TLS server's answer.
                    let _ = c.write_all(&[0x16, 0x03, 0x03, 0x00, 0x01, 0x02]).await;
                    return;
                }
                for _ in 0..DOWNLOAD / chunk.len() {
                    if c.write_all(&chunk).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

async fn proxy(grant: NetGrant) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let egress = grant.start();
        loop {
            let (c, _) = l.accept().await.unwrap();
            let e = egress.clone();
            tokio::spawn(async move { e.serve(c).await });
        }
    });
    addr
}

fn grant(up: SocketAddr) -> NetGrant {
    let mut limits = stockade_egress::NetLimits::default();
    limits.max_connections = u64::MAX;
    limits.max_bytes_down = u64::MAX;
    limits.max_bytes_up = u64::MAX;
    let rules =
        [format!("127.0.0.2:{}", up.port()), format!("bench.test:{}", up.port())].map(|e| NetRule::parse(&e).unwrap());
    NetGrant::new(NetPolicy::allow(&rules).unwrap())
        .resolve(Resolve::new().entry(&format!("bench.test:{}:127.0.0.2", up.port())).unwrap())
        .limits(limits)
}

/// tinyproxy on 127.0.0.1, started for one group and ended by its PID when the group ends.
struct Tinyproxy {
    child: std::process::Child,
    addr: SocketAddr,
    dir: std::path::PathBuf,
}

impl Tinyproxy {
    /// Starts it, or `None` (said on stderr) when it is not installed.
    fn start() -> Option<Self> {
        let bin = ["/usr/bin/tinyproxy", "/usr/sbin/tinyproxy"].into_iter().find(|p| std::path::Path::new(p).exists());
        let Some(bin) = bin else {
            eprintln!("net: peer_tinyproxy SKIPPED: tinyproxy is not installed (apt-get install tinyproxy)");
            return None;
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let dir = std::env::temp_dir().join(format!("stockade-bench-tinyproxy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // No ConnectPort line: CONNECT to any port, as the grant allows the upstream's.
        let conf = format!(
            "Port {port}\nListen 127.0.0.1\nTimeout 60\nMaxClients 256\nAllow 127.0.0.1\nLogLevel Critical\nLogFile \"{}\"\nPidFile \"{}\"\n",
            dir.join("log").display(),
            dir.join("pid").display()
        );
        std::fs::write(dir.join("conf"), conf).unwrap();
        let child = std::process::Command::new(bin).arg("-d").arg("-c").arg(dir.join("conf")).spawn().unwrap();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        // Ready when it accepts: asked, not waited for.
        let start = Instant::now();
        while std::net::TcpStream::connect(addr).is_err() {
            assert!(start.elapsed() < Duration::from_secs(10), "tinyproxy did not listen on {addr}");
            std::thread::yield_now();
        }
        Some(Self { child, addr, dir })
    }
}

impl Drop for Tinyproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Sends `CONNECT target` and reads the proxy's answer head.
async fn connect_through(proxy: SocketAddr, target: &str) -> TcpStream {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes()).await.unwrap();
    let mut head = Vec::with_capacity(128);
    let mut buf = [0u8; 256];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0, "the proxy closed before answering CONNECT");
        head.extend_from_slice(&buf[..n]);
    }
    assert!(head.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4 == head.len(), "bytes after the answer");
    assert!(head.starts_with(b"HTTP/1.1 200") || head.starts_with(b"HTTP/1.0 200"), "{head:?}");
    s
}

async fn drain(s: &mut TcpStream) -> usize {
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0;
    loop {
        let n = s.read(&mut buf).await.unwrap();
        if n == 0 || total + n >= DOWNLOAD {
            return total + n;
        }
        total += n;
    }
}

/// A ClientHello naming `bench.test`.
fn client_hello() -> Vec<u8> {
    stockade_test_support::tls_client_hello(&stockade_test_support::tls_sni_extension(&["bench.test"]))
}

fn download(c: &mut Criterion) {
    let rt = rt();
    let up = rt.block_on(upstream());
    let p = rt.block_on(proxy(grant(up)));
    let mut g = c.benchmark_group("net_download_100mib");
    g.sample_size(10).throughput(Throughput::Bytes(DOWNLOAD as u64)).measurement_time(Duration::from_secs(20));
    g.bench_function("baseline_direct", |b| {
        b.iter(|| {
            rt.block_on(async {
                let mut s = TcpStream::connect(up).await.unwrap();
                s.write_all(b"g").await.unwrap();
                assert!(drain(&mut s).await >= DOWNLOAD);
            })
        });
    });
    let target = format!("127.0.0.2:{}", up.port());
    let through = |b: &mut criterion::Bencher<'_>, proxy: SocketAddr| {
        b.iter(|| {
            rt.block_on(async {
                let mut s = connect_through(proxy, &target).await;
                s.write_all(b"g").await.unwrap();
                assert!(drain(&mut s).await >= DOWNLOAD);
            })
        });
    };
    g.bench_function("through_the_proxy", |b| through(b, p));
    let own = OwnProcess::start(up);
    g.bench_function("own_process", |b| through(b, own.addr));
    if let Some(peer) = Tinyproxy::start() {
        g.bench_function("peer_tinyproxy", |b| through(b, peer.addr));
    }
    g.finish();
}

fn connect(c: &mut Criterion) {
    let rt = rt();
    let up = rt.block_on(upstream());
    let p = rt.block_on(proxy(grant(up)));
    let hello = client_hello();
    let mut g = c.benchmark_group("net_connect");
    g.bench_function("baseline_direct", |b| {
        b.iter(|| {
            rt.block_on(async {
                let mut s = TcpStream::connect(up).await.unwrap();
                s.write_all(&hello).await.unwrap();
                let mut k = [0u8; 1];
                s.read_exact(&mut k).await.unwrap();
            })
        });
    });
    let through = |b: &mut criterion::Bencher<'_>, proxy: SocketAddr, target: &str| {
        b.iter(|| {
            rt.block_on(async {
                let mut s = connect_through(proxy, target).await;
                s.write_all(&hello).await.unwrap();
                let mut k = [0u8; 1];
                s.read_exact(&mut k).await.unwrap();
            })
        });
    };
    g.bench_function("connect_sni_checked", |b| through(b, p, &format!("bench.test:{}", up.port())));
    let own = OwnProcess::start(up);
    g.bench_function("own_process", |b| through(b, own.addr, &format!("bench.test:{}", up.port())));
    // The same with an address literal, as tinyproxy is given: no SNI check, no record watch.
    g.bench_function("own_process_literal", |b| through(b, own.addr, &format!("127.0.0.2:{}", up.port())));
    if let Some(peer) = Tinyproxy::start() {
        // tinyproxy resolves what it is given; an address literal costs it no lookup.
        g.bench_function("peer_tinyproxy", |b| through(b, peer.addr, &format!("127.0.0.2:{}", up.port())));
    }
    g.finish();
}

fn decide(c: &mut Criterion) {
    let rules: Vec<NetRule> = (0..9)
        .map(|i| NetRule::parse(&format!("host{i}.example.org")).unwrap())
        .chain([NetRule::parse("*.pythonhosted.org").unwrap()])
        .collect();
    let policy = NetPolicy::allow(&rules).unwrap();
    let mut gate = Gate::new(policy.policy().clone());
    let args = json!({"host": "files.pythonhosted.org", "port": 443, "scheme": "https"});
    let start = Instant::now();
    let mut g = c.benchmark_group("net_decide");
    g.bench_function("baseline_build_call", |b| {
        b.iter(|| ToolCall::from_json(stockade_egress::NET_TOOL, &args, &Source::Sandbox).unwrap());
    });
    g.bench_function("decide_10_rules", |b| {
        b.iter(|| {
            let call = ToolCall::from_json(stockade_egress::NET_TOOL, &args, &Source::Sandbox).unwrap();
            assert!(gate.decide_unattended(&call, start.elapsed()).is_ok());
        });
    });
    g.finish();
}

/// A blocking upstream on 127.0.0.3 that writes `DOWNLOAD` bytes to each connection.
fn blocking_upstream() -> SocketAddr {
    use std::io::Write;
    let l = std::net::TcpListener::bind("127.0.0.3:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let mut c = c.unwrap();
            std::thread::spawn(move || {
                let chunk = vec![7u8; 1 << 20];
                for _ in 0..DOWNLOAD / chunk.len() {
                    if c.write_all(&chunk).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A relay on 127.0.0.1 to `up`: a 256 KiB copy loop, or `splice(2)` through a pipe.
fn blocking_relay(up: SocketAddr, splice: bool) -> SocketAddr {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let mut c = c.unwrap();
            std::thread::spawn(move || {
                let mut u = std::net::TcpStream::connect(up).unwrap();
                if splice {
                    use rustix::pipe::{SpliceFlags, fcntl_setpipe_size, pipe, splice};
                    let (r, w) = pipe().unwrap();
                    let _ = fcntl_setpipe_size(&w, 1 << 20);
                    loop {
                        let n = splice(&u, None, &w, None, 1 << 20, SpliceFlags::MOVE).unwrap_or(0);
                        if n == 0 {
                            return;
                        }
                        let mut left = n;
                        while left > 0 {
                            match splice(&r, None, &c, None, left, SpliceFlags::MOVE) {
                                Ok(m) if m > 0 => left -= m,
                                _ => return,
                            }
                        }
                    }
                }
                let mut buf = vec![0u8; 256 << 10];
                loop {
                    let n = u.read(&mut buf).unwrap_or(0);
                    if n == 0 || c.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

fn relay_ceiling(c: &mut Criterion) {
    use std::io::Read;
    let up = blocking_upstream();
    let (plain, spliced) = (blocking_relay(up, false), blocking_relay(up, true));
    let read_all = |addr: SocketAddr| {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        let (mut buf, mut total) = (vec![0u8; 1 << 20], 0);
        while total < DOWNLOAD {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0);
            total += n;
        }
    };
    let mut g = c.benchmark_group("net_relay_ceiling");
    g.sample_size(10).throughput(Throughput::Bytes(DOWNLOAD as u64)).measurement_time(Duration::from_secs(20));
    g.bench_function("baseline_direct", |b| b.iter(|| read_all(up)));
    g.bench_function("copy_loop_relay", |b| b.iter(|| read_all(plain)));
    g.bench_function("splice_relay", |b| b.iter(|| read_all(spliced)));
    g.finish();
}

criterion_group!(benches, download, connect, decide, relay_ceiling);

/// The variable that makes this binary the proxy of [`OwnProcess`]: the upstream's port.
const PROXY_UPSTREAM: &str = "STOCKADE_BENCH_PROXY_UPSTREAM";

fn main() {
    if let Ok(port) = std::env::var(PROXY_UPSTREAM) {
        own_process_proxy(port.parse().unwrap());
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}

/// Stockade's proxy in a process of its own: this binary, run again with [`PROXY_UPSTREAM`]
/// (the grant of [`grant`] for an upstream on that port), on its own two-worker runtime. It
/// prints its address and serves until its stdin ends; ended by its PID when dropped.
struct OwnProcess {
    child: std::process::Child,
    addr: SocketAddr,
}

impl OwnProcess {
    fn start(up: SocketAddr) -> Self {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .env(PROXY_UPSTREAM, up.port().to_string())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
        Self { child, addr: line.trim().parse().unwrap() }
    }
}

impl Drop for OwnProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn own_process_proxy(port: u16) {
    rt().block_on(async {
        let p = proxy(grant(SocketAddr::from(([127, 0, 0, 2], port)))).await;
        println!("{p}");
        // Until the bench lets go of stdin (or kills this process).
        let _ = tokio::io::AsyncReadExt::read(&mut tokio::io::stdin(), &mut [0u8; 1]).await;
    });
}
