//! `stockade run --allow-net`: real clients inside the process tier (curl, Python), real
//! upstreams this test starts on 127.0.0.x (an HTTP server, a TLS server with a test
//! certificate), every verdict from what the upstream's own log saw.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::cli::check;

/// An HTTP upstream on `ip`: logs every request line, answers each with `hello from IP`.
pub(crate) struct HttpUpstream {
    pub(crate) port: u16,
    log: Arc<Mutex<Vec<String>>>,
}

impl HttpUpstream {
    pub(crate) fn start(ip: &str) -> Self {
        let listener = TcpListener::bind((ip, 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (l, ip) = (log.clone(), ip.to_owned());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut line = String::new();
                let _ = reader.read_line(&mut line);
                l.lock().unwrap().push(line.trim_end().to_owned());
                loop {
                    let mut h = String::new();
                    if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                        break;
                    }
                }
                let body = format!("hello from {ip}\n");
                let _ = write!(conn, "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len());
            }
        });
        Self { port, log }
    }

    pub(crate) fn requests(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

/// A TLS upstream on 127.0.0.3 for `name` (Python's ssl with a certificate openssl made),
/// logging each accepted connection; with the certificate's path for the client.
struct TlsUpstream {
    child: Child,
    port: u16,
    log: std::path::PathBuf,
    dir: std::path::PathBuf,
}

impl TlsUpstream {
    fn start(name: &str) -> Option<Self> {
        if Command::new("openssl").arg("version").output().is_err() {
            eprintln!("SKIPPED tls upstream: no openssl");
            return None;
        }
        let dir = std::env::temp_dir().join(format!("stockade-net-tls-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ok = Command::new("openssl")
            .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj"])
            .arg(format!("/CN={name}"))
            .args(["-addext"])
            .arg(format!("subjectAltName=DNS:{name}"))
            .arg("-keyout")
            .arg(dir.join("key.pem"))
            .arg("-out")
            .arg(dir.join("cert.pem"))
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(ok.success());
        let log = dir.join("accepted.log");
        let script = r#"
import socket, ssl, sys
d = sys.argv[1]
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(d + "/cert.pem", d + "/key.pem")
s = socket.socket(); s.bind(("127.0.0.3", 0)); s.listen(16)
print(s.getsockname()[1], flush=True)
while True:
    c, _ = s.accept()
    open(d + "/accepted.log", "a").write("accepted\n")
    try:
        t = ctx.wrap_socket(c, server_side=True)
        t.recv(65536)
        t.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nConnection: close\r\n\r\nhello by tls")
        t.close()
    except Exception as e:
        open(d + "/accepted.log", "a").write("failed %s\n" % e)
"#;
        let mut child = Command::new("python3")
            .args(["-c", script])
            .arg(&dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        Some(Self { child, port: line.trim().parse().unwrap(), log, dir })
    }

    fn accepted(&self) -> usize {
        std::fs::read_to_string(&self.log).map(|s| s.lines().count()).unwrap_or(0)
    }
}

impl Drop for TlsUpstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn g9_curl_reaches_an_allowed_host_and_nothing_else() {
    let up = HttpUpstream::start("127.0.0.2");
    let port = up.port.to_string();
    let allow = format!("api.test:{port}");
    let resolve = format!("api.test:{port}:127.0.0.2");
    let run = |cmd: &str| {
        check(&["run", "--allow-net", &allow, "--net-resolve", &resolve, "--max-output", "64K", "--", "sh", "-c", cmd])
    };
    let (code, out, err) = run(&format!("curl -sS http://api.test:{port}/allowed"));
    assert_eq!((code, out.as_str()), (0, "hello from 127.0.0.2\n"), "{err}");
    assert_eq!(up.requests(), ["GET /allowed HTTP/1.1"]);
    // A name the grant does not name: the proxy answers 403, says so on stderr, and the
    // upstream (which that name would also resolve to) sees nothing.
    let (code, out, err) = run(&format!(
        "curl -sS -o /dev/null -w '%{{http_code}}' --resolve other.test:{port}:127.0.0.2 http://other.test:{port}/denied"
    ));
    assert_eq!((code, out.as_str()), (0, "403"), "{err}");
    assert!(
        err.contains(&format!(
            "stockade: denied connect other.test:{port} (no rule allows it; --allow-net other.test:{port} to allow)"
        )),
        "{err}"
    );
    // Around the proxy: straight to the upstream's address, to the host's loopback, and to
    // an IPv6 literal. There is no route; nothing arrives.
    for direct in [
        format!("curl -sS --noproxy '*' --max-time 3 http://127.0.0.2:{port}/direct"),
        format!("curl -sS --noproxy '*' --max-time 3 http://[::1]:{port}/direct6"),
        format!("python3 -c \"import socket; socket.create_connection(('127.0.0.2', {port}), 3)\""),
    ] {
        let (code, _, err) = run(&direct);
        assert_ne!(code, 0, "{direct} connected: {err}");
    }
    // A name that resolves to loopback, with no --net-resolve for it, is refused.
    let (code, out, err) = check(&[
        "run",
        "--allow-net",
        &format!("localhost:{port}"),
        "--",
        "curl",
        "-sS",
        "--noproxy",
        "",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        &format!("http://localhost:{port}/loopback"),
    ]);
    assert_eq!((code, out.as_str()), (0, "403"), "{err}");
    assert!(err.contains("loopback"), "{err}");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(up.requests(), ["GET /allowed HTTP/1.1"], "only the allowed request arrived");
}

/// A supervisor that cannot take its helper's listener (without `CAP_SYS_PTRACE` over a
/// helper of another uid, as in a container that dropped it) refuses the run and names the
/// mechanism, rather than running the guest with a proxy nobody serves (before: curl hung
/// until its own timeout, and the report said only that it exited 28). Judged by what the
/// upstream saw: nothing.
#[test]
fn g9_a_supervisor_that_cannot_take_the_grant_s_listener_refuses_the_run() {
    let up = HttpUpstream::start("127.0.0.2");
    let port = up.port.to_string();
    let out = Command::new("setpriv")
        .args(["--bounding-set", "-sys_ptrace", "--inh-caps", "-sys_ptrace", "--"])
        .arg(env!("CARGO_BIN_EXE_stockade"))
        .args([
            "run",
            "--allow-net",
            &format!("api.test:{port}"),
            "--net-resolve",
            &format!("api.test:{port}:127.0.0.2"),
        ])
        .args(["--timeout", "60s", "--", "curl", "-sS", "-m", "30", &format!("http://api.test:{port}/")])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    // 125: stockade failed (the host cannot enforce the sandbox), not the guest's curl.
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("the grants' loopback listener") && err.contains("CAP_SYS_PTRACE"), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(up.requests().is_empty());
}

#[test]
fn g9_https_goes_through_a_tunnel_whose_tls_names_its_host() {
    let Some(up) = TlsUpstream::start("tls.test") else { return };
    let port = up.port.to_string();
    let allow = format!("tls.test:{port}");
    let resolve = format!("tls.test:{port}:127.0.0.3");
    let ws = up.dir.to_str().unwrap().to_owned();
    let run = |cmd: &str| {
        check(&["run", "--allow-net", &allow, "--net-resolve", &resolve, "--workspace", &ws, "--", "sh", "-c", cmd])
    };
    let (code, out, err) = run(&format!("curl -sS --cacert /workspace/cert.pem https://tls.test:{port}/"));
    assert_eq!((code, out.as_str()), (0, "hello by tls"), "{err}");
    assert_eq!(up.accepted(), 1);
    // A tunnel opened for tls.test whose ClientHello names another host: refused before
    // anything reaches the upstream.
    let sni = format!(
        r#"python3 -c "
import socket, ssl
s = socket.create_connection(('127.0.0.1', 8765))
s.sendall(b'CONNECT tls.test:{port} HTTP/1.1\r\n\r\n')
assert s.recv(100).startswith(b'HTTP/1.1 200')
ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
try:
    ctx.wrap_socket(s, server_hostname='evil.test')
    print('handshake completed')
except Exception as e:
    print('refused', type(e).__name__)
""#
    );
    let (code, out, err) = run(&sni);
    assert_eq!((code, out.starts_with("refused")), (0, true), "{out} {err}");
    assert!(err.contains("sni-mismatch"), "{err}");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(up.accepted(), 1, "the mismatched tunnel reached the upstream");
    let mut log = String::new();
    let _ = std::fs::File::open(&up.log).and_then(|mut f| f.read_to_string(&mut log));
    assert!(!log.contains("failed"), "{log}");
}

#[test]
fn g9_the_report_lists_every_connection() {
    let up = HttpUpstream::start("127.0.0.4");
    let port = up.port.to_string();
    let (code, out, err) = check(&[
        "run",
        "--json",
        "--allow-net",
        &format!("rec.test:{port}"),
        "--net-resolve",
        &format!("rec.test:{port}:127.0.0.4"),
        "--",
        "sh",
        "-c",
        &format!("curl -sS http://rec.test:{port}/a; curl -sS http://nope.test:{port}/b"),
    ]);
    assert_eq!(code, 0, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let conns = report["grants"]["connections"].as_array().unwrap_or_else(|| panic!("{report:#}"));
    assert_eq!(conns.len(), 2, "{conns:#?}");
    assert_eq!(
        (&conns[0]["host"], &conns[0]["decision"], &conns[0]["address"], &conns[0]["scheme"]),
        (
            &serde_json::json!("rec.test"),
            &serde_json::json!("allowed"),
            &serde_json::json!(format!("127.0.0.4:{port}")),
            &serde_json::json!("http")
        ),
        "{conns:#?}"
    );
    assert!(conns[0]["bytes_down"].as_u64().unwrap() > 20, "{conns:#?}");
    assert_eq!(
        (&conns[1]["decision"], &conns[1]["rule"]),
        (&serde_json::json!("denied"), &serde_json::json!("default-deny"))
    );
    // Without a grant nothing changes: no proxy variable, no listener.
    let (code, out, err) = check(&[
        "run",
        "--",
        "sh",
        "-c",
        "env | grep -ci proxy; curl -sS --max-time 2 http://127.0.0.1:8765/ >/dev/null 2>&1 || echo unreachable",
    ]);
    assert_eq!((code, out.as_str()), (0, "0\nunreachable\n"), "{err}");
}

/// One stand-in index at a time: it listens on 127.0.0.9:443.
static STANDIN: Mutex<()> = Mutex::new(());

/// The PyPI stand-in (`pypi_standin.py`): pypi.org and files.pythonhosted.org on
/// 127.0.0.9:443 over TLS with a test certificate, serving one real wheel.
pub(crate) struct PypiStandin {
    child: Child,
    dir: std::path::PathBuf,
    _one: std::sync::MutexGuard<'static, ()>,
}

impl PypiStandin {
    /// `None` (skipped, said on stderr) where port 443 cannot be bound: not root.
    pub(crate) fn start() -> Option<Self> {
        let root = std::fs::read_to_string("/proc/self/status")
            .is_ok_and(|s| s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0")));
        if !root {
            assert!(
                std::env::var_os("STOCKADE_REQUIRE_ALL").is_none(),
                "the PyPI stand-in listens on port 443: run as root"
            );
            eprintln!("SKIPPED pypi stand-in: it listens on port 443, which needs root");
            return None;
        }
        let one = STANDIN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let dir = std::env::temp_dir().join(format!("stockade-net-pypi-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/pypi_standin.py");
        let mut child = Command::new("python3")
            .arg(script)
            .arg(&dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "the PyPI stand-in did not start");
        Some(Self { child, dir, _one: one })
    }

    /// The `stockade run` flags that point both names here and trust its certificate.
    pub(crate) fn flags(&self) -> String {
        format!(
            "--net-resolve pypi.org:443:127.0.0.9 --net-resolve files.pythonhosted.org:443:127.0.0.9 --workspace {} --env PIP_CERT=/workspace/cert.pem",
            self.dir.display()
        )
    }

    /// What it was asked for: `HOST METHOD PATH` lines.
    pub(crate) fn requests(&self) -> String {
        std::fs::read_to_string(self.dir.join("requests.log")).unwrap_or_default()
    }
}

impl Drop for PypiStandin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn g9_pip_installs_from_an_index_through_the_proxy() {
    if !crate::cli::ready() {
        return;
    }
    let Some(index) = PypiStandin::start() else { return };
    let mut args: Vec<String> = vec![
        "run".into(),
        "--allow-net".into(),
        "pypi.org".into(),
        "--allow-net".into(),
        "files.pythonhosted.org".into(),
    ];
    args.extend(index.flags().split(' ').map(str::to_owned));
    args.extend(["--timeout", "60s", "--", "sh", "-c", "pip install --no-cache-dir --target /tmp/lib requests && PYTHONPATH=/tmp/lib python3 -c 'import requests; print(requests.STANDIN)'"].map(str::to_owned));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, out, err) = check(&args);
    assert_eq!(code, 0, "{out}\n{err}\n{}", index.requests());
    assert!(out.contains("Successfully installed requests-99.0.0") && out.ends_with("stockade test index\n"), "{out}");
    let log = index.requests();
    assert!(log.contains("pypi.org GET /simple/requests/"), "{log}");
    assert!(log.contains("files.pythonhosted.org GET /packages/requests-99.0.0-py3-none-any.whl"), "{log}");
}

#[test]
fn g9_busybox_wget_in_the_docker_tier_goes_through_the_proxy() {
    if !crate::cli::tier_ready("docker", |v| v["docker_tier"].as_bool().unwrap()) {
        return;
    }
    let up = HttpUpstream::start("127.0.0.5");
    let port = up.port.to_string();
    let (code, out, err) = check(&[
        "run",
        "--tier",
        "docker",
        "--allow-net",
        &format!("box.test:{port}"),
        "--net-resolve",
        &format!("box.test:{port}:127.0.0.5"),
        "--",
        "sh",
        "-c",
        &format!(
            "wget -q -O - http://box.test:{port}/docker; wget -q -O - -T 3 http://127.0.0.5:{port}/direct 2>&1 || echo direct-failed"
        ),
    ]);
    assert_eq!(code, 0, "{out} {err}");
    assert!(out.starts_with("hello from 127.0.0.5\n") && out.ends_with("direct-failed\n"), "{out}");
    assert_eq!(up.requests(), ["GET /docker HTTP/1.1"]);
}

#[test]
fn g9_git_clones_over_https_through_the_proxy() {
    if !crate::cli::ready() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("stockade-net-git-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/git_standin.py");
    let mut server =
        Command::new("python3").arg(script).arg(&dir).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(server.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let port: u16 = line.trim().parse().unwrap_or_else(|_| panic!("the git server did not start: {line:?}"));
    let cmd = format!(
        "git clone -q https://git.test:{port}/repo.git /tmp/repo && git -C /tmp/repo log --format=%s && cat /tmp/repo/README"
    );
    let (code, out, err) = check(&[
        "run",
        "--allow-net",
        &format!("git.test:{port}"),
        "--net-resolve",
        &format!("git.test:{port}:127.0.0.10"),
        "--workspace",
        dir.to_str().unwrap(),
        "--env",
        "GIT_SSL_CAINFO=/workspace/cert.pem",
        "--timeout",
        "30s",
        "--",
        "sh",
        "-c",
        &cmd,
    ]);
    let log = std::fs::read_to_string(dir.join("requests.log")).unwrap_or_default();
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!((code, out.as_str()), (0, "the one commit\ncloned through the proxy\n"), "{err}\n{log}");
    assert!(log.contains("git.test") && log.contains("/repo.git/info/refs"), "{log}");
    assert!(log.contains("POST /repo.git/git-upload-pack"), "the smart protocol: {log}");
}

#[test]
fn g9_stockade_mcp_allow_net_gives_run_code_the_server_s_grant_only() {
    if !crate::cli::ready() {
        return;
    }
    let up = HttpUpstream::start("127.0.0.6");
    let port = up.port;
    let _runs = crate::cli::shared();
    let mut child = Command::new(env!("CARGO_BIN_EXE_stockade"))
        .args(["mcp", "--languages", "sh", "--allow-net", &format!("mcp.test:{port}")])
        .args(["--net-resolve", &format!("mcp.test:{port}:127.0.0.6")])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut ask = |line: String| -> serde_json::Value {
        writeln!(input, "{line}").unwrap();
        let mut answer = String::new();
        out.read_line(&mut answer).unwrap();
        serde_json::from_str(&answer).unwrap()
    };
    let tools = ask(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#.to_owned());
    let desc = tools["result"]["tools"][0]["description"].as_str().unwrap().to_owned();
    assert!(desc.contains(&format!("Network only to mcp.test:{port}")), "{desc}");
    assert_eq!(tools["result"]["tools"][0]["annotations"]["openWorldHint"], true);
    let call = |id: u32, code: String| {
        serde_json::json!({"jsonrpc":"2.0","id":id,"method":"tools/call",
            "params":{"name":"run_code","arguments":{"language":"sh","code":code}}})
        .to_string()
    };
    let ok = ask(call(2, format!("curl -sS http://mcp.test:{port}/from-mcp")));
    assert_eq!(ok["result"]["structuredContent"]["stdout"], "hello from 127.0.0.6\n", "{ok}");
    // A host the server did not grant: the proxy refuses it, whatever the call asks.
    let denied = ask(call(3, format!("curl -sS -o /dev/null -w '%{{http_code}}' http://other.test:{port}/")));
    assert_eq!(denied["result"]["structuredContent"]["stdout"], "403", "{denied}");
    drop(input);
    let _ = child.wait();
    assert_eq!(up.requests(), ["GET /from-mcp HTTP/1.1"]);
}

#[test]
fn g9_the_agent_s_run_code_and_confined_tools_reach_what_allow_net_names() {
    use stockade_test_support::{MockLlm, Reply};
    if !crate::cli::ready() {
        return;
    }
    let up = HttpUpstream::start("127.0.0.7");
    let port = up.port;
    let dir = std::env::temp_dir().join(format!("stockade-net-agent-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // An address literal: the grant names it, so no --net-resolve is needed (agent.toml has
    // none), and nothing leaves loopback.
    std::fs::write(
        dir.join("agent.toml"),
        format!(
            "[endpoint]\nmodel = \"m\"\n[agent]\npolicy = \"policy.toml\"\n[[tool]]\nbuiltin = \"run_code\"\nlanguages = [\"sh\"]\nallow_net = [\"127.0.0.7:{port}\"]\n\
             [[tool]]\nname = \"fetch\"\ncommand = [\"curl\", \"-sS\", \"http://127.0.0.7:{port}/from-tool\"]\noutput = \"untrusted\"\nconfine = \"process\"\nallow_net = [\"127.0.0.7:{port}\"]\n"
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("policy.toml"),
        "version = 1\ndefault = \"deny\"\n[[rule]]\nid = \"code\"\ntool = \"run_code\"\neffect = \"allow\"\n[[rule]]\nid = \"fetch\"\ntool = \"fetch\"\neffect = \"allow\"\n",
    )
    .unwrap();
    let code = format!(
        "curl -sS http://127.0.0.7:{port}/from-agent; curl -sS -o /dev/null -w ' %{{http_code}}' http://127.0.0.7:1/"
    );
    let mock = MockLlm::script(vec![
        Reply::calls(&[("run_code", serde_json::json!({"language": "sh", "code": code}))]),
        Reply::calls(&[("fetch", serde_json::json!({}))]),
        Reply::text("done"),
    ])
    .unwrap();
    let config = dir.join("agent.toml");
    let (exit, out, err) = check(&["agent", "--config", config.to_str().unwrap(), "--base-url", &mock.url(), "fetch"]);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!((exit, out.as_str()), (0, "done\n"), "{err}");
    let got = mock.received();
    let tools = got[0].body["tools"].as_array().unwrap();
    let run_code = tools.iter().find(|t| t["function"]["name"] == "run_code").unwrap();
    let description = run_code["function"]["description"].as_str().unwrap().to_owned();
    assert!(description.contains(&format!("network only to 127.0.0.7:{port}")), "{description}");
    let result = got[1].body["messages"].as_array().unwrap().iter().find(|m| m["role"] == "tool").unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(result.contains("hello from 127.0.0.7") && result.contains(" 403"), "{result}");
    // The confined command tool's run reaches it too, through its own run's proxy.
    let fetched = got[2].body["messages"].as_array().unwrap().iter().rfind(|m| m["role"] == "tool").unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(fetched.contains("hello from 127.0.0.7"), "{fetched}");
    assert_eq!(up.requests(), ["GET /from-agent HTTP/1.1", "GET /from-tool HTTP/1.1"]);
}

/// A test CA and a certificate it signed for `name` (openssl), in `dir`: `ca.pem`,
/// `leaf.pem`, `leaf.key`.
pub(crate) fn test_ca(dir: &std::path::Path, name: &str) {
    let openssl = |args: &[&str]| {
        let ok = Command::new("openssl").args(args).current_dir(dir).stderr(Stdio::null()).status().unwrap();
        assert!(ok.success(), "openssl {args:?}");
    };
    std::fs::write(
        dir.join("ext.cnf"),
        format!("subjectAltName=DNS:{name}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"),
    )
    .unwrap();
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=stockade test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        &format!("/CN={name}"),
        "-keyout",
        "leaf.key",
        "-out",
        "leaf.csr",
    ]);
    openssl(&[
        "x509",
        "-req",
        "-in",
        "leaf.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        "ext.cnf",
        "-out",
        "leaf.pem",
    ]);
}

/// A TLS upstream for api.test on 127.0.0.5 (the certificate [`test_ca`] made in `dir`),
/// appending each request head to `dir/requests.log` and answering `secret-ok`.
pub(crate) fn tls_logging_upstream(dir: &std::path::Path) -> (Child, u16) {
    let script = r#"
import socket, ssl, sys
d = sys.argv[1]
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(d + "/leaf.pem", d + "/leaf.key")
s = socket.socket(); s.bind(("127.0.0.5", 0)); s.listen(16)
print(s.getsockname()[1], flush=True)
while True:
    c, _ = s.accept()
    try:
        t = ctx.wrap_socket(c, server_side=True)
        head = b""
        while b"\r\n\r\n" not in head:
            b = t.recv(65536)
            if not b: break
            head += b
        open(d + "/requests.log", "ab").write(head)
        if b" /echo" in head.split(b"\r\n", 1)[0]:
            # An echo endpoint: the request comes back, in a header and in the body.
            auth = [l for l in head.split(b"\r\n") if l.lower().startswith(b"authorization:")]
            echo = auth[0].split(b":", 1)[1].strip() if auth else b""
            t.sendall(b"HTTP/1.1 200 OK\r\nX-Echo: " + echo + b"\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(head) + head)
        else:
            t.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nConnection: close\r\n\r\nsecret-ok")
        t.close()
    except Exception as e:
        open(d + "/requests.log", "a").write("failed %s\n" % e)
"#;
    let mut child = Command::new("python3")
        .args(["-c", script])
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    (child, line.trim().parse().unwrap())
}

#[test]
fn g9_the_wasm_tier_s_fetch_goes_through_the_same_proxy() {
    if Command::new("openssl").arg("version").output().is_err() {
        eprintln!("SKIPPED wasm fetch: no openssl");
        return;
    }
    if !crate::cli::tier_ready("wasm", |v| {
        let guest = v["checks"].as_array().unwrap().iter().find(|c| c["name"] == "wasm js guest").unwrap();
        guest["ok"].as_bool().unwrap() && v["wasm_tier"].as_bool().unwrap()
    }) {
        return;
    }
    let dir = std::env::temp_dir().join(format!("stockade-net-fetch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    test_ca(&dir, "api.test");
    let (mut child, port) = tls_logging_upstream(&dir);
    let plain = HttpUpstream::start("127.0.0.4");
    let real = "real-fetch-secret-9a2e";
    let js = format!(
        r#"(async () => {{
  const a = await fetch('http://plain.test:{pp}/from-wasm?x=1');
  console.log('plain', a.status, a.ok, (await a.text()).trim());
  const b = await fetch('https://api.test:{port}/s', {{ headers: {{ 'X-Api-Key': stockade.secrets.TOKEN }} }});
  console.log('tls', b.status, await b.text(), b.headers.get('content-length'));
  for (const url of ['http://evil.test:{pp}/', 'http://127.0.0.1:{pp}/', 'https://api.test:1/']) {{
    try {{ await fetch(url); console.log('reached', url); }} catch (e) {{ console.log('refused', e instanceof TypeError, e.message); }}
  }}
}})();"#,
        pp = plain.port
    );
    let (code, out, err) = crate::cli::check_env(
        &[
            "run",
            "--tier",
            "wasm",
            "--allow-net",
            &format!("api.test:{port}"),
            "--allow-net",
            &format!("plain.test:{}", plain.port),
            "--net-resolve",
            &format!("api.test:{port}:127.0.0.5"),
            "--net-resolve",
            &format!("plain.test:{}:127.0.0.4", plain.port),
            "--net-secret",
            "api.test=TOKEN:X-Api-Key",
            "--js",
            &js,
        ],
        &[("TOKEN", real), ("SSL_CERT_FILE", dir.join("ca.pem").to_str().unwrap())],
    );
    let _ = child.kill();
    let _ = child.wait();
    let log = std::fs::read_to_string(dir.join("requests.log")).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(code, 0, "{out}\n{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "plain 200 true hello from 127.0.0.4", "{out}\n{err}");
    assert_eq!(lines[1], "tls 200 secret-ok 9", "{out}\n{err}\n{log}");
    assert_eq!(lines.len(), 5, "{out}");
    assert!(lines[2..].iter().all(|l| l.starts_with("refused true")), "{out}");
    assert!(out.contains("no rule allows"), "{out}");
    assert_eq!(plain.requests(), vec!["GET /from-wasm?x=1 HTTP/1.1".to_owned()]);
    // The guest held the placeholder; the secret host got the value, in the header named.
    assert!(log.contains("GET /s HTTP/1.1") && log.contains(&format!("X-Api-Key: {real}")), "{log}");
    assert!(!out.contains(real) && !err.contains(real), "{out}");
}

#[test]
fn g9_a_net_secret_reaches_its_host_only_and_never_the_sandbox() {
    if Command::new("openssl").arg("version").output().is_err() {
        eprintln!("SKIPPED net secret: no openssl");
        return;
    }
    let dir = std::env::temp_dir().join(format!("stockade-net-secret-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    test_ca(&dir, "api.test");
    let (mut child, port) = tls_logging_upstream(&dir);
    let plain = HttpUpstream::start("127.0.0.4");
    let real = "real-secret-value-4f1c";
    let ca = dir.join("ca.pem");
    let cmd = format!(
        "curl -sS -H \"Authorization: Bearer $TOKEN\" https://api.test:{port}/curl; echo; \
         python3 -c \"import os, urllib.request as u; r = u.Request('https://api.test:{port}/py', headers={{'Authorization': 'token ' + os.environ['STOCKADE_SECRET_TOKEN']}}); print(u.urlopen(r).read().decode())\"; \
         curl -sS http://plain.test:{}/$TOKEN >/dev/null; env; cat /proc/self/environ",
        plain.port
    );
    let (code, out, err) = crate::cli::check_env(
        &[
            "run",
            "--allow-net",
            &format!("api.test:{port}"),
            "--allow-net",
            &format!("plain.test:{}", plain.port),
            "--net-resolve",
            &format!("api.test:{port}:127.0.0.5"),
            "--net-resolve",
            &format!("plain.test:{}:127.0.0.4", plain.port),
            "--net-secret",
            "api.test=TOKEN",
            "--",
            "sh",
            "-c",
            &cmd,
        ],
        // The proxy verifies the upstream against the host's roots: here, the test CA.
        &[("TOKEN", real), ("SSL_CERT_FILE", ca.to_str().unwrap())],
    );
    let _ = child.kill();
    let _ = child.wait();
    let log = std::fs::read_to_string(dir.join("requests.log")).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(code, 0, "{out}\n{err}\n{log}");
    assert!(out.starts_with("secret-ok\nsecret-ok\n"), "{out}\n{err}\n{log}");
    // The upstream got the real value, in the header named, from both clients.
    assert!(log.contains(&format!("Bearer {real}")) && log.contains(&format!("token {real}")), "{log}");
    assert!(!log.contains("stockade-secret-"), "a placeholder reached the secret host: {log}");
    // The sandbox held only the placeholder, in both variables; another host got that.
    assert!(!out.contains(real) && !err.contains(real), "{out}\n{err}");
    assert!(out.contains("TOKEN=stockade-secret-") && out.contains("STOCKADE_SECRET_TOKEN=stockade-secret-"), "{out}");
    let seen = plain.requests();
    assert!(seen.iter().any(|r| r.contains("/stockade-secret-")) && !seen.iter().any(|r| r.contains(real)), "{seen:?}");
    // Without a grant for its host, a secret is refused before anything runs.
    let (code, _, err) =
        crate::cli::check_env(&["run", "--net-secret", "api.test=TOKEN", "--", "true"], &[("TOKEN", real)]);
    assert_ne!(code, 0);
    assert!(err.contains("--net-secret needs --allow-net"), "{err}");
    let (code, _, err) = crate::cli::check_env(
        &["run", "--allow-net", "api.test", "--net-secret", "api.test=NOPE_UNSET", "--", "true"],
        &[],
    );
    assert_ne!(code, 0);
    assert!(err.contains("$NOPE_UNSET is not set"), "{err}");
}

#[test]
fn g9_busybox_wget_asks_for_https_urls_and_the_proxy_speaks_tls_with_the_secret() {
    if Command::new("openssl").arg("version").output().is_err()
        || !crate::cli::tier_ready("docker", |v| v["docker_tier"].as_bool().unwrap())
    {
        return;
    }
    let dir = std::env::temp_dir().join(format!("stockade-net-wget-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    test_ca(&dir, "api.test");
    let (mut child, port) = tls_logging_upstream(&dir);
    let real = "real-wget-secret-51d0";
    // busybox wget sends `GET https://api.test:PORT/ HTTP/1.1` to the proxy (no CONNECT):
    // the proxy is the TLS client, verifying the upstream, and puts the secret in.
    let (code, out, err) = crate::cli::check_env(
        &[
            "run",
            "--tier",
            "docker",
            "--allow-net",
            &format!("api.test:{port}"),
            "--net-resolve",
            &format!("api.test:{port}:127.0.0.5"),
            "--net-secret",
            "api.test=TOKEN",
            "--",
            "sh",
            "-c",
            &format!(
                "wget -q -O - --header \"Authorization: Bearer $TOKEN\" https://api.test:{port}/wget; echo; env | grep TOKEN="
            ),
        ],
        &[("TOKEN", real), ("SSL_CERT_FILE", dir.join("ca.pem").to_str().unwrap())],
    );
    let _ = child.kill();
    let _ = child.wait();
    let log = std::fs::read_to_string(dir.join("requests.log")).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(code, 0, "{out}\n{err}\n{log}");
    assert!(out.starts_with("secret-ok\n") && out.contains("TOKEN=stockade-secret-"), "{out}\n{err}");
    assert!(log.contains("GET /wget HTTP/1.1") && log.contains(&format!("Bearer {real}")), "{log}");
    assert!(!out.contains(real) && !err.contains(real), "{out}\n{err}");
}

#[test]
fn g9_a_secret_host_is_a_closed_door_the_value_never_comes_back() {
    // An echo endpoint on the secret host repeats the request, header and body, and TRACE
    // would too: the value reached the upstream, and the sandbox must never read it back.
    if Command::new("openssl").arg("version").output().is_err() {
        eprintln!("SKIPPED net secret echo: no openssl");
        return;
    }
    let dir = std::env::temp_dir().join(format!("stockade-net-secret-echo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    test_ca(&dir, "api.test");
    let (mut child, port) = tls_logging_upstream(&dir);
    let real = "real-echo-secret-93ab";
    let cmd = format!(
        "curl -sS -i -H \"Authorization: Bearer $TOKEN\" https://api.test:{port}/echo; \
         curl -sS -i -X TRACE -H \"Authorization: Bearer $TOKEN\" https://api.test:{port}/trace; \
         python3 -c \"import os, urllib.request as u; r = u.Request('https://api.test:{port}/echo/py', headers={{'Authorization': os.environ['TOKEN'], 'Accept-Encoding': 'gzip'}}); x = u.urlopen(r); print(x.headers['X-Echo']); print(x.read().decode())\""
    );
    let (_, out, err) = crate::cli::check_env(
        &[
            "run",
            "--allow-net",
            &format!("api.test:{port}"),
            "--net-resolve",
            &format!("api.test:{port}:127.0.0.5"),
            "--net-secret",
            "api.test=TOKEN",
            "--",
            "sh",
            "-c",
            &cmd,
        ],
        &[("TOKEN", real), ("SSL_CERT_FILE", dir.join("ca.pem").to_str().unwrap())],
    );
    let _ = child.kill();
    let _ = child.wait();
    let log = std::fs::read_to_string(dir.join("requests.log")).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    // The echo requests reached the host with the value; what came back has it masked.
    assert!(log.contains("GET /echo HTTP/1.1") && log.contains(&format!("Bearer {real}")), "{log}");
    assert!(log.contains("GET /echo/py HTTP/1.1") && log.contains("Accept-Encoding: identity"), "{log}");
    assert!(!out.contains(real) && !err.contains(real), "the value came back:\n{out}\n{err}");
    assert!(out.contains("HTTP/1.1 200") && out.contains("X-Echo: Bearer *"), "{out}\n{err}");
    // TRACE never left the proxy.
    assert!(!log.contains("TRACE"), "{log}");
    assert!(out.contains("HTTP/1.1 405") && out.contains("only GET, HEAD, POST, PUT, PATCH, DELETE"), "{out}\n{err}");
}
