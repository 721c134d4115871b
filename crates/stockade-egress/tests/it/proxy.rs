//! G1–G7 of stockade-egress.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stockade_egress::{Egress, NetGrant, NetLimits, NetPolicy, NetRule, NetScope, Resolve, ScopeRules};
use stockade_protocol::{GrantsReport, NetDecision};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// An upstream on `ip`: records every connection's bytes, answers each with `answer`.
struct Upstream {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Upstream {
    async fn start(ip: &str, answer: impl Into<Vec<u8>>) -> Self {
        let answer: Arc<[u8]> = answer.into().into();
        let listener = TcpListener::bind((ip, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut c, _)) = listener.accept().await else { return };
                let (s, answer) = (s.clone(), answer.clone());
                tokio::spawn(async move {
                    let i = {
                        let mut v = s.lock().unwrap();
                        v.push(Vec::new());
                        v.len() - 1
                    };
                    let mut buf = [0u8; 65536];
                    let mut answered = false;
                    loop {
                        let n = match tokio::time::timeout(Duration::from_millis(300), c.read(&mut buf)).await {
                            Ok(Ok(0) | Err(_)) => break,
                            Ok(Ok(n)) => n,
                            Err(_) if !answered => {
                                answered = true;
                                let _ = c.write_all(&answer).await;
                                let _ = c.shutdown().await;
                                continue;
                            }
                            Err(_) => break,
                        };
                        s.lock().unwrap()[i].extend_from_slice(&buf[..n]);
                    }
                    if !answered {
                        let _ = c.write_all(&answer).await;
                    }
                });
            }
        });
        Self { addr, seen }
    }

    fn connections(&self) -> Vec<String> {
        self.seen.lock().unwrap().iter().map(|b| String::from_utf8_lossy(b).into_owned()).collect()
    }
}

/// A proxy on 127.0.0.1 serving `egress`.
pub(crate) async fn proxy(egress: Egress) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((c, _)) = listener.accept().await else { return };
            let e = egress.clone();
            tokio::spawn(async move { e.serve(c).await });
        }
    });
    addr
}

fn allow(entries: &[&str]) -> NetPolicy {
    NetPolicy::allow(&entries.iter().map(|e| NetRule::parse(e).unwrap()).collect::<Vec<_>>()).unwrap()
}

/// Sends `bytes` and reads until the proxy closes (or 2 s pass).
async fn exchange(proxy: SocketAddr, bytes: &[u8]) -> String {
    let mut c = TcpStream::connect(proxy).await.unwrap();
    c.write_all(bytes).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(2), c.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

fn records(e: &Egress) -> GrantsReport {
    let mut r = GrantsReport::default();
    e.record_into(&mut r);
    r
}

/// A TLS ClientHello record naming `sni` (none when `None`).
fn client_hello(sni: Option<&str>) -> Vec<u8> {
    let ext = sni.map(|n| stockade_test_support::tls_sni_extension(&[n])).unwrap_or_default();
    stockade_test_support::tls_client_hello(&ext)
}

async fn settle() {
    tokio::time::sleep(Duration::from_millis(400)).await;
}

#[tokio::test]
async fn g1_only_allowed_hosts_are_reached_and_each_plain_request_is_decided() {
    let up =
        Upstream::start("127.0.0.2", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok").await;
    let port = up.addr.port();
    let resolve = Resolve::new()
        .entry(&format!("allowed.test:{port}:127.0.0.2"))
        .unwrap()
        .entry(&format!("denied.test:{port}:127.0.0.2"))
        .unwrap();
    let e = NetGrant::new(allow(&[&format!("allowed.test:{port}")])).resolve(resolve).start();
    let p = proxy(e.clone()).await;
    // A denied name, a denied port, a denied CONNECT: answered 403, and nothing upstream.
    let d =
        exchange(p, format!("GET http://denied.test:{port}/ HTTP/1.1\r\nHost: denied.test:{port}\r\n\r\n").as_bytes())
            .await;
    assert!(d.starts_with("HTTP/1.1 403"), "{d}");
    assert!(d.contains(&format!("--allow-net denied.test:{port}")), "{d}");
    let d = exchange(p, b"GET http://allowed.test:81/ HTTP/1.1\r\nHost: allowed.test:81\r\n\r\n").await;
    assert!(d.starts_with("HTTP/1.1 403"), "{d}");
    let d = exchange(p, format!("CONNECT denied.test:{port} HTTP/1.1\r\n\r\n").as_bytes()).await;
    assert!(d.starts_with("HTTP/1.1 403"), "{d}");
    settle().await;
    assert!(up.connections().is_empty(), "a denied request reached the upstream: {:?}", up.connections());
    // Allowed: forwarded in origin form, closed after one response; a second request
    // pipelined behind the first is not forwarded on its decision.
    let two = format!(
        "GET http://allowed.test:{port}/first HTTP/1.1\r\nHost: allowed.test:{port}\r\n\r\nGET http://allowed.test:{port}/second HTTP/1.1\r\nHost: allowed.test:{port}\r\n\r\n"
    );
    let ok = exchange(p, two.as_bytes()).await;
    assert!(
        ok.starts_with("HTTP/1.1 200 OK\r\n") && ok.contains("Connection: close\r\n") && ok.ends_with("ok"),
        "{ok}"
    );
    assert!(!ok.contains("keep-alive"), "{ok}");
    settle().await;
    let seen = up.connections();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(seen[0].starts_with("GET /first HTTP/1.1\r\n") && seen[0].contains("Connection: close"), "{seen:?}");
    assert!(!seen[0].contains("second"), "a pipelined request rode on the first one's decision: {seen:?}");
    let r = records(&e);
    let rules: Vec<(&str, NetDecision)> = r.connections.iter().map(|c| (c.rule.as_str(), c.decision)).collect();
    assert!(rules.contains(&("default-deny", NetDecision::Denied)), "{rules:?}");
    assert!(rules.contains(&(format!("allow-net-allowed.test-{port}").as_str(), NetDecision::Allowed)), "{rules:?}");
}

#[tokio::test]
async fn g2_a_denied_name_is_never_resolved() {
    let e = NetGrant::new(allow(&["allowed.test"])).start();
    let p = proxy(e.clone()).await;
    let d = exchange(p, b"CONNECT exfil-a1b2c3.never-resolved.invalid:443 HTTP/1.1\r\n\r\n").await;
    assert!(d.starts_with("HTTP/1.1 403"), "{d}");
    let r = records(&e);
    // Decided (denied) by the policy, not "unresolved": the lookup never happened.
    assert_eq!((r.connections[0].rule.as_str(), r.connections[0].address.as_deref()), ("default-deny", None));
}

#[tokio::test]
async fn g3_a_name_that_resolves_inward_is_refused_unless_pointed_there() {
    let up = Upstream::start("127.0.0.3", b"HTTP/1.1 204 No Content\r\n\r\n").await;
    let port = up.addr.port();
    // `localhost` resolves to loopback: allowed by the policy, refused by the address check.
    let e = NetGrant::new(allow(&[&format!("localhost:{port}")])).start();
    let p = proxy(e.clone()).await;
    let d = exchange(p, format!("GET http://localhost:{port}/ HTTP/1.1\r\nHost: localhost:{port}\r\n\r\n").as_bytes())
        .await;
    assert!(d.starts_with("HTTP/1.1 403") && d.contains("loopback"), "{d}");
    let r = records(&e);
    assert_eq!(r.connections[0].rule, "private-address");
    // A literal the grant names, and a name pointed with --net-resolve, are reached.
    let e = NetGrant::new(allow(&[&format!("127.0.0.3:{port}"), &format!("svc.test:{port}")]))
        .resolve(Resolve::new().entry(&format!("svc.test:{port}:127.0.0.3")).unwrap())
        .start();
    let p = proxy(e.clone()).await;
    for host in ["127.0.0.3", "svc.test"] {
        let ok =
            exchange(p, format!("GET http://{host}:{port}/ HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n").as_bytes()).await;
        assert!(ok.starts_with("HTTP/1.1 204"), "{host}: {ok}");
    }
    settle().await;
    assert_eq!(up.connections().len(), 2);
    let r = records(&e);
    assert!(r.connections.iter().all(|c| c.address.as_deref() == Some(&*format!("127.0.0.3:{port}"))), "{r:?}");
}

#[tokio::test]
async fn g3_a_literal_reaches_inward_only_through_a_rule_that_names_it() {
    let up = Upstream::start("127.0.0.3", b"HTTP/1.1 204 No Content\r\n\r\n").await;
    let port = up.addr.port();
    // A careless policy: any host on the upstream's port. It must not open the host's own
    // loopback to a guest that names an address, in any spelling or protocol.
    let careless = format!(
        "version = 1\ndefault = \"deny\"\n[[rule]]\nid = \"any-host\"\ntool = \"net.connect\"\neffect = \"allow\"\nargs.port = {{ const = {port} }}\n"
    );
    let e = NetGrant::new(NetPolicy::from_toml(&careless).unwrap()).start();
    let p = proxy(e.clone()).await;
    let get = |h: &str| format!("GET http://{h}:{port}/ HTTP/1.1\r\nHost: {h}:{port}\r\n\r\n").into_bytes();
    for (what, bytes) in [
        ("plain", get("127.0.0.3")),
        ("mapped", get("[::ffff:127.0.0.3]")),
        ("connect", format!("CONNECT 127.0.0.3:{port} HTTP/1.1\r\n\r\n").into_bytes()),
        ("connect-unspecified", format!("CONNECT 0.0.0.0:{port} HTTP/1.1\r\n\r\n").into_bytes()),
    ] {
        let d = exchange(p, &bytes).await;
        assert!(d.starts_with("HTTP/1.1 403"), "{what}: {d}");
    }
    // SOCKS5 with an IPv4 address.
    let mut socks = vec![5, 1, 0, 5, 1, 0, 1, 127, 0, 0, 3];
    socks.extend(port.to_be_bytes());
    let d = exchange(p, &socks).await;
    assert_eq!(d.as_bytes().get(3), Some(&4), "socks: host unreachable, {d:?}");
    settle().await;
    assert!(up.connections().is_empty(), "{:?}", up.connections());
    let r = records(&e);
    assert_eq!(r.connections.len(), 5, "{r:?}");
    assert!(r.connections.iter().all(|c| c.rule == "private-address" && c.address.is_none()), "{r:?}");
    // A rule that names the address (a block, or the string) reaches it.
    for named in ["args.host = { hosts = [\"127.0.0.0/24\"] }", "args.host = { const = \"127.0.0.3\" }"] {
        let policy = format!("{careless}{named}\n");
        let e = NetGrant::new(NetPolicy::from_toml(&policy).unwrap()).start();
        let d = exchange(proxy(e).await, &get("127.0.0.3")).await;
        assert!(d.starts_with("HTTP/1.1 204"), "{named}: {d}");
    }
}

#[tokio::test]
async fn g4_a_tunnel_carries_tls_for_its_own_name_or_nothing() {
    let up = Upstream::start("127.0.0.4", b"server-hello").await;
    let port = up.addr.port();
    let e = NetGrant::new(allow(&[&format!("good.test:{port}")]))
        .resolve(Resolve::new().entry(&format!("good.test:{port}:127.0.0.4")).unwrap())
        .start();
    let p = proxy(e.clone()).await;
    let connect = format!("CONNECT good.test:{port} HTTP/1.1\r\nHost: good.test:{port}\r\n\r\n");
    for (inner, rule) in [
        (client_hello(Some("evil.test")), "sni-mismatch"),
        (client_hello(None), "no-sni"),
        (b"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n".to_vec(), "not-tls"),
    ] {
        let mut c = TcpStream::connect(p).await.unwrap();
        c.write_all(connect.as_bytes()).await.unwrap();
        let mut ok = [0u8; 39];
        c.read_exact(&mut ok).await.unwrap();
        assert!(ok.starts_with(b"HTTP/1.1 200"));
        c.write_all(&inner).await.unwrap();
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(2), c.read_to_end(&mut rest)).await;
        assert!(rest.is_empty(), "{rule}: {rest:?}");
        let r = records(&e);
        assert_eq!(r.connections.last().unwrap().rule, rule);
    }
    settle().await;
    assert!(up.connections().is_empty(), "a refused tunnel reached the upstream: {:?}", up.connections());
    // The right name, but a service that does not speak TLS: the ClientHello reaches it,
    // the plaintext after it never does (held until a ServerHello that never comes), and
    // its answer never reaches the guest.
    let mut c = TcpStream::connect(p).await.unwrap();
    c.write_all(connect.as_bytes()).await.unwrap();
    let mut ok = [0u8; 39];
    c.read_exact(&mut ok).await.unwrap();
    let hello = client_hello(Some("Good.Test"));
    c.write_all(&hello).await.unwrap();
    c.write_all(b"GET /secret HTTP/1.1\r\nHost: good.test\r\n\r\n").await.unwrap();
    // Closed on it (a reset, since the plaintext was never read): nothing comes back.
    let mut back = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut back)).await.unwrap();
    assert!(back.is_empty(), "{:?}", String::from_utf8_lossy(&back));
    settle().await;
    let seen = up.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0], hello, "only the ClientHello reached a non-TLS service");
    let r = records(&e);
    let last = r.connections.last().unwrap();
    assert_eq!(last.cut.as_deref(), Some("not-tls"), "{r:?}");

    // A TLS upstream: its ServerHello comes back, then the client's records go up.
    let mut server = vec![0x16, 0x03, 0x03, 0x00, 0x04, 0x02, 0x00, 0x00, 0x00];
    server.extend([0x17, 0x03, 0x03, 0x00, 0x01, b'x']);
    let tls_up = Upstream::start("127.0.0.14", server.clone()).await;
    let tport = tls_up.addr.port();
    let e = NetGrant::new(allow(&[&format!("good.test:{tport}")]))
        .resolve(Resolve::new().entry(&format!("good.test:{tport}:127.0.0.14")).unwrap())
        .start();
    let p = proxy(e.clone()).await;
    let mut c = TcpStream::connect(p).await.unwrap();
    c.write_all(format!("CONNECT good.test:{tport} HTTP/1.1\r\n\r\n").as_bytes()).await.unwrap();
    c.read_exact(&mut ok).await.unwrap();
    c.write_all(&hello).await.unwrap();
    let mut got = vec![0u8; server.len()];
    c.read_exact(&mut got).await.unwrap();
    assert_eq!(got, server);
    let record = [0x17, 0x03, 0x03, 0x00, 0x04, b'm', b'o', b'r', b'e'];
    c.write_all(&record).await.unwrap();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut rest)).await;
    settle().await;
    let seen = tls_up.seen.lock().unwrap().clone();
    assert!(seen[0].starts_with(&hello) && seen[0].ends_with(&record), "{seen:?}");
}

#[tokio::test]
async fn g5_smuggling_is_refused_and_a_body_goes_by_its_own_framing() {
    let up = Upstream::start("127.0.0.5", b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").await;
    let port = up.addr.port();
    let e = NetGrant::new(allow(&[&format!("api.test:{port}")]))
        .resolve(Resolve::new().entry(&format!("api.test:{port}:127.0.0.5")).unwrap())
        .start();
    let p = proxy(e).await;
    let host = format!("api.test:{port}");
    for smuggle in [
        format!(
            "POST http://{host}/ HTTP/1.1\r\nHost: {host}\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        ),
        format!(
            "POST http://{host}/ HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n"
        ),
        format!("POST http://{host}/ HTTP/1.1\r\nHost: {host}\r\nContent-Length: 4\r\nContent-Length: 40\r\n\r\nabcd"),
        format!("GET http://{host}/ HTTP/1.1\r\nHost: other.test\r\n\r\n"),
    ] {
        let d = exchange(p, smuggle.as_bytes()).await;
        assert!(d.starts_with("HTTP/1.1 400") || d.starts_with("HTTP/1.1 501"), "{smuggle:?} -> {d}");
    }
    settle().await;
    assert!(up.connections().is_empty(), "{:?}", up.connections());
    // A chunked body is forwarded to its last chunk; what follows it is not.
    let body = format!(
        "POST http://{host}/up HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: {host}\r\n\r\n"
    );
    let ok = exchange(p, body.as_bytes()).await;
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    let body = format!(
        "POST http://{host}/len HTTP/1.1\r\nHost: {host}\r\nContent-Length: 3\r\n\r\nabcGET /smuggled HTTP/1.1\r\n\r\n"
    );
    let ok = exchange(p, body.as_bytes()).await;
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    settle().await;
    let seen = up.connections();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(seen.iter().all(|s| !s.contains("smuggled")), "{seen:?}");
    assert!(seen.iter().any(|s| s.ends_with("\r\n\r\n5\r\nhello\r\n0\r\n\r\n")), "{seen:?}");
    assert!(seen.iter().any(|s| s.ends_with("\r\n\r\nabc")), "{seen:?}");
}

#[tokio::test]
async fn g6_the_run_s_bounds_cut_off_a_greedy_guest() {
    let mut big = b"HTTP/1.1 200 OK\r\nContent-Length: 60000\r\n\r\n".to_vec();
    big.extend([b'x'; 60_000]);
    let up = Upstream::start("127.0.0.6", big).await;
    let port = up.addr.port();
    let mut limits = NetLimits::default();
    limits.max_connections = 3;
    limits.max_bytes_down = 100_000;
    limits.idle = Duration::from_millis(800);
    let e = NetGrant::new(allow(&[&format!("big.test:{port}")]))
        .resolve(Resolve::new().entry(&format!("big.test:{port}:127.0.0.6")).unwrap())
        .limits(limits)
        .start();
    let p = proxy(e.clone()).await;
    let get = format!("GET http://big.test:{port}/ HTTP/1.1\r\nHost: big.test:{port}\r\n\r\n");
    // 60 000 bytes fit; the second response passes the run's 100 000 and is cut.
    let first = exchange(p, get.as_bytes()).await;
    assert!(first.len() >= 60_000, "{}", first.len());
    let second = exchange(p, get.as_bytes()).await;
    assert!(second.len() < 60_000, "{}", second.len());
    // A guest that opens a tunnel and sends nothing is cut when idle.
    let mut idle = TcpStream::connect(p).await.unwrap();
    idle.write_all(format!("CONNECT big.test:{port} HTTP/1.1\r\n\r\n").as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), idle.read_to_end(&mut out))
        .await
        .expect("an idle tunnel was not cut")
        .unwrap();
    // The run's connections are used up.
    let d = exchange(p, get.as_bytes()).await;
    assert!(d.starts_with("HTTP/1.1 429"), "{d}");
    let r = records(&e);
    let cuts: Vec<Option<&str>> = r.connections.iter().map(|c| c.cut.as_deref()).collect();
    assert!(cuts.contains(&Some("max-bytes")), "{r:?}");
    assert!(r.connections.iter().any(|c| c.rule == "max-connections"), "{r:?}");
    assert!(r.connections.iter().any(|c| c.rule == "not-tls"), "the idle tunnel: {r:?}");
}

#[tokio::test]
async fn g7_every_connection_is_on_the_record_and_socks5_is_decided_like_connect() {
    // A ServerHello-shaped answer: a tunnel to a name must carry TLS both ways (G4).
    const PONG: [u8; 9] = [0x16, 0x03, 0x03, 0x00, 0x04, 0x02, b'p', b'o', b'n'];
    let up = Upstream::start("127.0.0.7", PONG).await;
    let port = up.addr.port();
    let seen_refusals = Arc::new(Mutex::new(Vec::new()));
    let s = seen_refusals.clone();
    let e = NetGrant::new(allow(&[&format!("socks.test:{port}")]))
        .resolve(Resolve::new().entry(&format!("socks.test:{port}:127.0.0.7")).unwrap())
        .on_refused(Arc::new(move |c| s.lock().unwrap().push(stockade_egress::denied_line(c))))
        .start();
    let p = proxy(e.clone()).await;
    let socks = |host: &str| {
        let mut req = vec![5, 1, 0, 5, 1, 0, 3, host.len() as u8];
        req.extend(host.as_bytes());
        req.extend(port.to_be_bytes());
        req
    };
    // Denied by name: the SOCKS reply is "not allowed" (2).
    let mut c = TcpStream::connect(p).await.unwrap();
    c.write_all(&socks("evil.test")).await.unwrap();
    let mut r = [0u8; 12];
    c.read_exact(&mut r).await.unwrap();
    assert_eq!((r[0], r[1], r[2], r[3]), (5, 0, 5, 2), "{r:?}");
    // Allowed: succeeded (0), then TLS for the name goes through.
    let mut c = TcpStream::connect(p).await.unwrap();
    c.write_all(&socks("socks.test")).await.unwrap();
    c.read_exact(&mut r).await.unwrap();
    assert_eq!((r[2], r[3]), (5, 0), "{r:?}");
    c.write_all(&client_hello(Some("socks.test"))).await.unwrap();
    let mut back = Vec::new();
    tokio::time::timeout(Duration::from_secs(3), c.read_to_end(&mut back)).await.unwrap().unwrap();
    assert_eq!(back, PONG);
    drop(c);
    settle().await;
    let r = records(&e);
    assert_eq!(r.connections_total, 2);
    let denied = &r.connections[0];
    assert_eq!(
        (denied.host.as_str(), denied.port, denied.scheme.as_str(), denied.decision, denied.rule.as_str()),
        ("evil.test", port, "socks", NetDecision::Denied, "default-deny")
    );
    let ok = &r.connections[1];
    assert_eq!((ok.decision, ok.address.clone()), (NetDecision::Allowed, Some(format!("127.0.0.7:{port}"))));
    assert_eq!((ok.bytes_up as usize, ok.bytes_down as usize), (client_hello(Some("socks.test")).len(), PONG.len()));
    assert!(ok.duration > Duration::ZERO);
    assert_eq!(
        seen_refusals.lock().unwrap().as_slice(),
        [format!("denied connect evil.test:{port} (no rule allows it; --allow-net evil.test:{port} to allow)")]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g6_a_large_download_goes_through_whole_within_its_bounds() {
    // The upstream sends 32 MiB after the first byte; the guest reads them all.
    let listener = TcpListener::bind("127.0.0.8:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let (mut c, _) = listener.accept().await.unwrap();
        let mut first = [0u8; 1];
        c.read_exact(&mut first).await.unwrap();
        let chunk = vec![9u8; 1 << 20];
        for _ in 0..32 {
            c.write_all(&chunk).await.unwrap();
        }
    });
    let e = NetGrant::new(allow(&[&format!("127.0.0.8:{port}")])).start();
    let p = proxy(e.clone()).await;
    let mut c = TcpStream::connect(p).await.unwrap();
    c.write_all(format!("CONNECT 127.0.0.8:{port} HTTP/1.1\r\n\r\n").as_bytes()).await.unwrap();
    let mut ok = [0u8; 39];
    c.read_exact(&mut ok).await.unwrap();
    c.write_all(b"g").await.unwrap();
    let started = std::time::Instant::now();
    let mut got = 0usize;
    let mut buf = vec![0u8; 1 << 20];
    while got < 32 << 20 {
        let n = tokio::time::timeout(Duration::from_secs(20), c.read(&mut buf))
            .await
            .expect("the download stalled")
            .unwrap();
        assert!(n > 0, "the tunnel ended after {got} bytes");
        got += n;
    }
    eprintln!("32 MiB through the proxy in {:?}", started.elapsed());
}

#[tokio::test]
async fn g8_a_secret_host_s_tls_ends_at_the_per_run_ca_and_an_unverified_upstream_gets_nothing() {
    use stockade_egress::NetSecret;
    // A plain-TCP upstream: its "TLS" cannot verify, so nothing past a ClientHello may reach it.
    let up = Upstream::start("127.0.0.6", b"not tls").await;
    let port = up.addr.port();
    let secret = NetSecret::new("sec.test", "TOKEN", "Authorization", "real-value-77").unwrap();
    assert!(!format!("{secret:?}").contains("real-value-77"));
    let e = NetGrant::new(allow(&[&format!("sec.test:{port}")]))
        .resolve(Resolve::new().entry(&format!("sec.test:{port}:127.0.0.6")).unwrap())
        .secrets(vec![secret])
        .unwrap()
        .start();
    let env = e.secret_env();
    let placeholder = env.iter().find(|(k, _)| k == "TOKEN").map(|(_, v)| v.clone()).unwrap();
    assert!(placeholder.starts_with("stockade-secret-"), "{env:?}");
    assert!(env.iter().any(|(k, v)| k == "STOCKADE_SECRET_TOKEN" && *v == placeholder), "{env:?}");
    // Each run has its own placeholder.
    assert_ne!(
        placeholder,
        NetGrant::new(allow(&["sec.test"]))
            .secrets(vec![NetSecret::new("sec.test", "TOKEN", "Authorization", "x").unwrap()])
            .unwrap()
            .start()
            .secret_env()[0]
            .1
    );
    // The guest trusts the run's CA and completes TLS for sec.test with the proxy.
    let mut roots = rustls::RootCertStore::empty();
    let ca = <rustls::pki_types::CertificateDer as rustls::pki_types::pem::PemObject>::from_pem_slice(
        e.ca_pem().unwrap().as_bytes(),
    )
    .unwrap();
    roots.add(ca).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let p = proxy(e.clone()).await;
    let mut tcp = TcpStream::connect(p).await.unwrap();
    tcp.write_all(format!("CONNECT sec.test:{port} HTTP/1.1\r\n\r\n").as_bytes()).await.unwrap();
    let mut head = [0u8; 39];
    tcp.read_exact(&mut head).await.unwrap();
    assert!(head.starts_with(b"HTTP/1.1 200"));
    let name = rustls::pki_types::ServerName::try_from("sec.test").unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await.unwrap();
    tls.write_all(
        format!("GET / HTTP/1.1\r\nHost: sec.test:{port}\r\nAuthorization: Bearer {placeholder}\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(3), tls.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 502") && answer.contains("did not verify"), "{answer}");
    settle().await;
    let seen = up.connections().concat();
    assert!(!seen.contains("real-value-77") && !seen.contains(&placeholder), "{seen}");
    let r = records(&e);
    assert_eq!(r.connections[0].rule, "upstream-tls", "{r:?}");
}

#[tokio::test]
async fn g9_fetch_is_a_client_of_the_same_proxy() {
    use serde_json::json;
    use stockade_egress::FetchError;
    let up = Upstream::start("127.0.0.7", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Up: 1\r\n\r\nhello").await;
    let port = up.addr.port();
    let e = NetGrant::new(allow(&[&format!("f.test:{port}")]))
        .resolve(Resolve::new().entry(&format!("f.test:{port}:127.0.0.7")).unwrap())
        .start();
    let url = format!("http://f.test:{port}/p?q=1");
    let got =
        e.fetch(&json!({"url": url, "init": {"method": "post", "headers": {"X-A": "b"}, "body": "hi"}})).await.unwrap();
    assert_eq!((got["status"].as_u64(), got["body"].as_str()), (Some(200), Some("hello")), "{got}");
    assert!(got["headers"].as_array().unwrap().iter().any(|h| h == &json!(["x-up", "1"])), "{got}");
    settle().await;
    let seen = up.connections().concat();
    assert!(seen.starts_with("POST /p?q=1 HTTP/1.1\r\n") && seen.contains("X-A: b") && seen.ends_with("hi"), "{seen}");
    // A denial is the proxy's, never the upstream's: no connection, and the one line.
    let denied = e.fetch(&json!({"url": format!("http://g.test:{port}/")})).await;
    assert!(matches!(&denied, Err(FetchError::Refused(m)) if m.contains("no rule allows")), "{denied:?}");
    let inward = e.fetch(&json!({"url": format!("https://127.0.0.7:{port}/")})).await;
    assert!(matches!(&inward, Err(FetchError::Refused(_))), "{inward:?}");
    for bad in [json!({"url": "ftp://f.test/"}), json!({"url": url, "init": {"headers": {"Host": "x"}}}), json!({})] {
        assert!(matches!(e.fetch(&bad).await, Err(FetchError::BadRequest(_))), "{bad}");
    }
    settle().await;
    assert_eq!(up.connections().len(), 1);
    let r = records(&e);
    assert_eq!(
        r.connections.iter().map(|c| c.decision).collect::<Vec<_>>()[..2],
        [NetDecision::Allowed, NetDecision::Denied]
    );
}

#[tokio::test]
async fn g6_a_rule_s_byte_budget_is_shared_by_its_connections_and_cuts_them() {
    let mut big = b"HTTP/1.1 200 OK\r\nContent-Length: 600000\r\n\r\n".to_vec();
    big.extend(vec![b'x'; 600_000]);
    let up = Upstream::start("127.0.0.8", big).await;
    let port = up.addr.port();
    let policy = "version = 1\ndefault = \"deny\"\n[[rule]]\nid = \"small\"\ntool = \"net.connect\"\neffect = \"allow\"\nargs.host = { hosts = [\"b.test\"] }\nlimits = { max_bytes = 1000 }\n[[rule]]\nid = \"large\"\ntool = \"net.connect\"\neffect = \"allow\"\nargs.host = { hosts = [\"c.test\"] }\n";
    let resolve = Resolve::new()
        .entry(&format!("b.test:{port}:127.0.0.8"))
        .unwrap()
        .entry(&format!("c.test:{port}:127.0.0.8"))
        .unwrap();
    let e = NetGrant::new(NetPolicy::from_toml(policy).unwrap()).resolve(resolve).start();
    let p = proxy(e.clone()).await;
    let get = |h: &str| format!("GET http://{h}:{port}/ HTTP/1.1\r\nHost: {h}:{port}\r\n\r\n").into_bytes();
    // The budget's rule: the first download is cut within a chunk of its budget, the second
    // finds it spent; another rule's connection is not charged.
    for _ in 0..2 {
        let d = exchange(p, &get("b.test")).await;
        assert!(d.len() < 300_000, "{} bytes came through a 1000-byte budget", d.len());
    }
    let whole = exchange(p, &get("c.test")).await;
    assert!(whole.len() > 600_000, "{}", whole.len());
    let r = records(&e);
    let small: Vec<_> = r.connections.iter().filter(|c| c.rule == "small").collect();
    assert_eq!(small.len(), 2, "{r:?}");
    assert!(
        small.iter().all(|c| c.cut.as_deref() == Some("max-bytes") && c.reason.contains("small's max_bytes")),
        "{small:?}"
    );
    // A byte budget on a tool nobody meters does not load.
    let registry = stockade_policy::allow::Registry::new().with(stockade_policy::allow::ToolSpec::new("send").arg(
        "to",
        stockade_policy::allow::ArgType::String,
        true,
    ));
    let bad = "version = 1\n[[rule]]\nid = \"r\"\ntool = \"send\"\neffect = \"allow\"\nlimits = { max_bytes = 5 }\n";
    let err = stockade_policy::allow::Policy::from_toml(bad, &registry).unwrap_err().to_string();
    assert!(err.contains("max_bytes applies only to a metered tool"), "{err}");
}

#[tokio::test]
async fn g8_an_https_url_in_absolute_form_is_verified_before_its_secret_goes_anywhere() {
    use stockade_egress::NetSecret;
    let up = Upstream::start("127.0.0.9", b"not tls").await;
    let port = up.addr.port();
    let secret = NetSecret::new("abs.test", "TOKEN", "Authorization", "real-value-88").unwrap();
    let e = NetGrant::new(allow(&[&format!("abs.test:{port}")]))
        .resolve(Resolve::new().entry(&format!("abs.test:{port}:127.0.0.9")).unwrap())
        .secrets(vec![secret])
        .unwrap()
        .start();
    let placeholder = e.secret_env()[0].1.clone();
    let p = proxy(e.clone()).await;
    let d = exchange(
        p,
        format!("GET https://abs.test:{port}/ HTTP/1.1\r\nHost: abs.test:{port}\r\nAuthorization: Bearer {placeholder}\r\n\r\n")
            .as_bytes(),
    )
    .await;
    assert!(d.starts_with("HTTP/1.1 502") && d.contains("did not verify"), "{d}");
    settle().await;
    let seen = up.connections().concat();
    assert!(!seen.contains("real-value-88") && !seen.contains(&placeholder), "{seen}");
    let r = records(&e);
    assert_eq!((r.connections[0].scheme.as_str(), r.connections[0].rule.as_str()), ("https", "upstream-tls"), "{r:?}");
    assert_eq!(stockade_egress::classify(b"GET https://abs.test/ HTTP/1.1"), stockade_egress::Kind::Proxy);
    assert_eq!(stockade_egress::classify(b"GET https:/"), stockade_egress::Kind::NeedMore);
}

/// A path rule's proxy: `api.test` on the upstream's port, paths under `/pub` only.
pub(crate) fn pub_only(port: u16) -> NetPolicy {
    NetPolicy::from_toml(&format!(
        "version = 1\ndefault = \"deny\"\n[[rule]]\nid = \"pub\"\ntool = \"net.connect\"\neffect = \"allow\"\nargs.host = {{ const = \"api.test\" }}\nargs.port = {{ const = {port} }}\nargs.path = {{ path_prefix = \"/pub\" }}\n"
    ))
    .unwrap()
}

#[tokio::test]
async fn g1_a_path_rule_judges_the_path_the_upstream_serves() {
    let up = Upstream::start("127.0.0.10", b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").await;
    let port = up.addr.port();
    let e = NetGrant::new(pub_only(port))
        .resolve(Resolve::new().entry(&format!("api.test:{port}:127.0.0.10")).unwrap())
        .start();
    let p = proxy(e.clone()).await;
    let get = |path: &str| format!("GET http://api.test:{port}{path} HTTP/1.1\r\nHost: api.test:{port}\r\n\r\n");
    // Encoded dot segments climb out of /pub: decided as the upstream reads them.
    for out in ["/pub/%2e%2e/secret.txt", "/pub/%2E%2e/%2e%2e/secret.txt", "/pub/./../secret.txt"] {
        let d = exchange(p, get(out).as_bytes()).await;
        assert!(d.starts_with("HTTP/1.1 403"), "{out}: {d}");
    }
    // What two servers read differently is refused before any decision.
    for ambiguous in ["/pub%2f..%2fsecret.txt", "/pub/..;/secret.txt", "/pub/%5c../secret.txt", "/pub/%zz"] {
        let d = exchange(p, get(ambiguous).as_bytes()).await;
        assert!(d.starts_with("HTTP/1.1 400"), "{ambiguous}: {d}");
    }
    // Inside /pub, the normal form is what goes upstream.
    let d = exchange(p, get("/pub/a/%2e%2e/%62.txt?x=%2e%2e").as_bytes()).await;
    assert!(d.starts_with("HTTP/1.1 200"), "{d}");
    settle().await;
    let seen = up.connections();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(seen[0].starts_with("GET /pub/b.txt?x=%2e%2e HTTP/1.1\r\n"), "{seen:?}");
    let r = records(&e);
    assert!(r.connections.iter().filter(|c| c.decision == NetDecision::Denied).count() == 3, "{r:?}");
}

#[tokio::test]
async fn g3_an_ipv4_mapped_literal_is_decided_as_the_ipv4_address_it_reaches() {
    let up = Upstream::start("127.0.0.1", b"HTTP/1.1 204 No Content\r\n\r\n").await;
    let port = up.addr.port();
    // A rule for every IPv6 address names no IPv4 one, mapped or not.
    let v6 = format!(
        "version = 1\ndefault = \"deny\"\n[[rule]]\nid = \"v6\"\ntool = \"net.connect\"\neffect = \"allow\"\nargs.host = {{ hosts = [\"::/0\"] }}\nargs.port = {{ const = {port} }}\n"
    );
    let e = NetGrant::new(NetPolicy::from_toml(&v6).unwrap()).start();
    let p = proxy(e.clone()).await;
    for (what, bytes) in [
        ("connect mapped", format!("CONNECT [::ffff:127.0.0.1]:{port} HTTP/1.1\r\n\r\n").into_bytes()),
        ("connect long form", format!("CONNECT [0:0:0:0:0:ffff:7f00:1]:{port} HTTP/1.1\r\n\r\n").into_bytes()),
        ("connect compatible", format!("CONNECT [::127.0.0.1]:{port} HTTP/1.1\r\n\r\n").into_bytes()),
        ("connect v4", format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n").into_bytes()),
        (
            "get mapped",
            format!("GET http://[::ffff:127.0.0.1]:{port}/ HTTP/1.1\r\nHost: [::ffff:127.0.0.1]:{port}\r\n\r\n")
                .into_bytes(),
        ),
    ] {
        let d = exchange(p, &bytes).await;
        assert!(d.starts_with("HTTP/1.1 403"), "{what}: {d}");
    }
    // SOCKS5 with the mapped address as an IPv6 one.
    let mut socks = vec![5, 1, 0, 5, 1, 0, 4];
    socks.extend("::ffff:127.0.0.1".parse::<std::net::Ipv6Addr>().unwrap().octets());
    socks.extend(port.to_be_bytes());
    let d = exchange(p, &socks).await;
    assert_eq!(d.as_bytes().get(3), Some(&2), "socks: not allowed, {d:?}");
    settle().await;
    assert!(up.connections().is_empty(), "{:?}", up.connections());
    let r = records(&e);
    assert!(r.connections.iter().all(|c| c.host == "127.0.0.1" && c.decision == NetDecision::Denied), "{r:?}");
}

#[tokio::test]
async fn g5_a_chunked_body_goes_upstream_in_its_canonical_form_and_nothing_follows_it() {
    let up = Upstream::start("127.0.0.11", b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").await;
    let port = up.addr.port();
    let mut limits = NetLimits::default();
    limits.max_head_bytes = 4096;
    let e = NetGrant::new(allow(&[&format!("api.test:{port}")]))
        .resolve(Resolve::new().entry(&format!("api.test:{port}:127.0.0.11")).unwrap())
        .limits(limits)
        .start();
    let p = proxy(e.clone()).await;
    let host = format!("api.test:{port}");
    let post = |body: &str| {
        format!("POST http://{host}/up HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n\r\n{body}")
    };
    // A bare LF after the last chunk, then a second request: the body is malformed, and
    // the second request never reaches the upstream.
    let smuggle = post("0\r\n\nGET /smuggled HTTP/1.1\r\nHost: other.test\r\n\r\n");
    let _ = exchange(p, smuggle.as_bytes()).await;
    // Sizes with padding and extensions are sent canonical; a trailer field is re-serialised.
    let ok = exchange(p, post("0005;ext=1\r\nhello\r\n0\r\nX-Sum:   abc  \r\n\r\n").as_bytes()).await;
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    // Sizes and lines a lenient reader would take another way.
    for bad in [
        "5 \r\nhello\r\n0\r\n\r\n",
        "5\nhello\r\n0\r\n\r\n",
        "5\r\nhello\r\n0\r\nHost: x\r\n\r\n",
        "+5\r\nhello\r\n0\r\n\r\n",
    ] {
        let _ = exchange(p, post(bad).as_bytes()).await;
    }
    settle().await;
    let seen = up.connections();
    assert!(seen.iter().all(|s| !s.contains("smuggled") && !s.contains("other.test")), "{seen:?}");
    assert!(seen.iter().any(|s| s.ends_with("\r\n\r\n5\r\nhello\r\n0\r\nX-Sum: abc\r\n\r\n")), "{seen:?}");
    assert!(seen.iter().all(|s| !s.contains("5 \r\n") && !s.contains("Host: x") && !s.contains("+5")), "{seen:?}");
    let r = records(&e);
    let cuts: Vec<&str> = r.connections.iter().filter_map(|c| c.cut.as_deref()).collect();
    assert!(cuts.iter().filter(|c| matches!(**c, "bad-chunk" | "bad-trailer")).count() >= 5, "{r:?}");
}

#[tokio::test]
async fn g6_trailers_are_counted_and_bounded() {
    let up = Upstream::start("127.0.0.12", b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").await;
    let port = up.addr.port();
    let policy = "version = 1\ndefault = \"deny\"\n[[rule]]\nid = \"small\"\ntool = \"net.connect\"\neffect = \"allow\"\nargs.host = { hosts = [\"api.test\"] }\nlimits = { max_bytes = 10000 }\n";
    let e = NetGrant::new(NetPolicy::from_toml(policy).unwrap())
        .resolve(Resolve::new().entry(&format!("api.test:{port}:127.0.0.12")).unwrap())
        .start();
    let p = proxy(e.clone()).await;
    let host = format!("api.test:{port}");
    // A megabyte of trailer fields, each under the head limit: cut at the budget.
    let mut req = format!("POST http://{host}/t HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n")
        .into_bytes();
    for i in 0..1000 {
        req.extend(format!("X-T{i}: {}\r\n", "a".repeat(1000)).into_bytes());
    }
    req.extend(b"\r\n");
    let mut c = TcpStream::connect(p).await.unwrap();
    let _ = c.write_all(&req).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), c.read_to_end(&mut out)).await;
    settle().await;
    let sent: usize = up.connections().iter().map(String::len).sum();
    assert!(sent < 20_000, "{sent} bytes went through a 10000-byte rule");
    let r = records(&e);
    let c = &r.connections[0];
    assert!(c.bytes_up > 1000 && c.cut.is_some(), "{r:?}");
}

#[tokio::test]
async fn g6_one_deadline_bounds_a_connection_in_every_phase() {
    let up = Upstream::start("127.0.0.13", b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").await;
    let port = up.addr.port();
    let mut limits = NetLimits::default();
    limits.max_duration = Duration::from_secs(1);
    limits.idle = Duration::from_secs(60);
    let e = NetGrant::new(allow(&[&format!("api.test:{port}")]))
        .resolve(Resolve::new().entry(&format!("api.test:{port}:127.0.0.13")).unwrap())
        .limits(limits)
        .start();
    let p = proxy(e.clone()).await;
    // A head sent a byte at a time, each well within the idle bound: the connection ends
    // at its deadline, whatever the pace (the loop stops when the proxy closes).
    let mut c = TcpStream::connect(p).await.unwrap();
    let head = format!("POST http://api.test:{port}/ HTTP/1.1\r\nHost: api.test:{port}\r\nX-Slow: ");
    c.write_all(head.as_bytes()).await.unwrap();
    let closed = async {
        let mut buf = [0u8; 64];
        loop {
            match c.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    let trickle = async {
        let mut w = TcpStream::connect(p).await.unwrap();
        w.write_all(head.as_bytes()).await.unwrap();
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if w.write_all(b"a").await.is_err() {
                return w;
            }
            let mut probe = [0u8; 1];
            if let Ok(Ok(0)) = tokio::time::timeout(Duration::from_millis(1), w.read(&mut probe)).await {
                return w;
            }
        }
    };
    let both = async { tokio::join!(closed, trickle) };
    tokio::time::timeout(Duration::from_secs(60), both).await.expect("a trickled head outlived its deadline");
    let r = records(&e);
    assert!(r.connections.iter().filter(|c| c.cut.as_deref() == Some("max-duration")).count() == 2, "{r:?}");
}

#[tokio::test]
async fn g6_a_body_the_budget_cannot_carry_is_refused_before_it_is_announced() {
    // Found by the proxy_request fuzz target: a chunk announcing 2^64 - 1 bytes had its size
    // line forwarded upstream, a size no reader can take the same way (some read it as -1)
    // and the proxy could never deliver. A chunk, or a Content-Length body, that does not
    // fit in what the rule and the run may still send is refused before its size goes up.
    let up = Upstream::start("127.0.0.15", b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").await;
    let port = up.addr.port();
    let policy = "version = 1\ndefault = \"deny\"\n[[rule]]\nid = \"small\"\ntool = \"net.connect\"\neffect = \"allow\"\nargs.host = { hosts = [\"api.test\"] }\nlimits = { max_bytes = 10000 }\n";
    let e = NetGrant::new(NetPolicy::from_toml(policy).unwrap())
        .resolve(Resolve::new().entry(&format!("api.test:{port}:127.0.0.15")).unwrap())
        .start();
    let p = proxy(e.clone()).await;
    let host = format!("api.test:{port}");
    let ask = |req: String| async move {
        let mut c = TcpStream::connect(p).await.unwrap();
        let _ = c.write_all(req.as_bytes()).await;
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(20), c.read_to_end(&mut out)).await;
        String::from_utf8_lossy(&out).into_owned()
    };
    let chunked = format!(
        "POST http://{host}/c HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\nabc\r\n"
    );
    let _ = ask(chunked).await;
    let sized = format!("POST http://{host}/l HTTP/1.1\r\nHost: {host}\r\nContent-Length: 1000000\r\n\r\nabc");
    let answer = ask(sized).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    settle().await;
    let seen = up.connections().join("\n");
    assert!(!seen.contains("ffffffffffffffff"), "the huge chunk's size went upstream: {seen:?}");
    assert!(!seen.contains("POST /l"), "the oversized body's head went upstream: {seen:?}");
    let r = records(&e);
    assert!(r.connections.iter().all(|c| c.cut.as_deref() == Some("max-bytes")), "{r:?}");
}

#[tokio::test]
async fn g10_a_scope_narrows_the_policy_by_name_and_by_address_and_is_replaced_at_run_time() {
    let a = Upstream::start("127.0.0.3", b"HTTP/1.1 204 No Content\r\n\r\n").await;
    let b = Upstream::start("127.0.0.4", b"HTTP/1.1 204 No Content\r\n\r\n").await;
    let (pa, pb) = (a.addr.port(), b.addr.port());
    let own = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let rules = |allow: &[&str], deny: &[&str]| ScopeRules::parse(&own(allow), &own(deny)).unwrap();
    // The policy allows both names (and a's address); the scope denies b's block.
    let scope = NetScope::new(rules(&[], &["127.0.0.4/32"]));
    let e = NetGrant::new(allow(&[&format!("a.test:{pa}"), &format!("b.test:{pb}"), &format!("127.0.0.3:{pa}")]))
        .resolve(
            Resolve::new()
                .entry(&format!("a.test:{pa}:127.0.0.3"))
                .unwrap()
                .entry(&format!("b.test:{pb}:127.0.0.4"))
                .unwrap(),
        )
        .scope(scope.clone())
        .start();
    let p = proxy(e.clone()).await;
    let get = |h: &str, port: u16| format!("GET http://{h}:{port}/ HTTP/1.1\r\nHost: {h}:{port}\r\n\r\n").into_bytes();
    let status = |d: String| d.split(' ').nth(1).unwrap_or("none").to_owned();
    assert_eq!(status(exchange(p, &get("a.test", pa)).await), "204");
    let denied = exchange(p, &get("b.test", pb)).await;
    assert!(denied.starts_with("HTTP/1.1 403") && denied.contains("network scope"), "{denied}");
    // Replaced while the run goes on: only b, by name, with everything else denied (allow wins).
    scope.set(rules(&["b.test"], &["0.0.0.0/0"]));
    assert_eq!(status(exchange(p, &get("b.test", pb)).await), "204");
    assert_eq!(status(exchange(p, &get("a.test", pa)).await), "403");
    assert_eq!(status(exchange(p, &get("127.0.0.3", pa)).await), "403", "a literal is judged by its address");
    // An allowed block opens a literal within it; CONNECT is held the same way.
    scope.set(rules(&["127.0.0.3/32"], &["0.0.0.0/0"]));
    assert_eq!(status(exchange(p, &get("127.0.0.3", pa)).await), "204");
    let tunnel = exchange(p, format!("CONNECT b.test:{pb} HTTP/1.1\r\n\r\n").as_bytes()).await;
    assert!(tunnel.starts_with("HTTP/1.1 403"), "{tunnel}");
    // Cleared: the policy alone decides again.
    scope.set(rules(&[], &[]));
    assert_eq!(status(exchange(p, &get("b.test", pb)).await), "204");
    settle().await;
    // Judged by the upstreams: a was reached twice (by name, then by its literal), b twice.
    assert_eq!((a.connections().len(), b.connections().len()), (2, 2));
    let r = records(&e);
    let scoped: Vec<_> = r.connections.iter().filter(|c| c.rule == "scope").collect();
    assert_eq!(scoped.len(), 4, "{r:?}");
    assert!(scoped.iter().all(|c| c.decision == NetDecision::Denied && c.address.is_none()), "{r:?}");
}
