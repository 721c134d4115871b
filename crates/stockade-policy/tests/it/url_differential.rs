//! G11's differential test: the `url_hosts` predicate reads a URL's host as the clients that
//! fetch it do. For every URL of a corpus of tricky spellings that the policy would allow
//! (its host `allowed.example`), curl (through a recording proxy on 127.0.0.1, so nothing
//! leaves the machine) and Python's `urllib.parse.urlsplit` must read that same host. A
//! disagreement is a URL whose decision and whose fetch differ: the test fails on it.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::process::Command;
use std::time::Duration;

use serde_json::json;
use stockade_policy::allow::{Effect, Policy, Predicate, Registry, Rule, Source, ToolCall, ToolPattern, ToolSpec};

/// Spellings two URL readers have been known to read differently, and plain ones.
const CORPUS: &[&str] = &[
    "http://allowed.example/",
    "https://allowed.example/x?y=1",
    "HTTP://ALLOWED.EXAMPLE./path",
    "http://allowed.example:8080/",
    "http://allowed.example:0080/",
    "http://allowed.example:/",
    "http://allowed.example:65536/",
    "http://allowed.example\\@127.0.0.1:9/",
    "http://allowed.example\\\\@127.0.0.1:9/",
    "http://allowed.example@127.0.0.1:9/",
    "http://user:pass@allowed.example/",
    "http://127.0.0.1:9#@allowed.example/",
    "http://127.0.0.1:9?@allowed.example/",
    "http://127.0.0.1:9\\@allowed.example/",
    "http://allowed%2eexample/",
    "http://allowed.example%2f@127.0.0.1:9/",
    "http://allowed.example.127.0.0.1.nip.io/",
    "http://allowed.example\t/",
    "http://allowed.\nexample/",
    " http://allowed.example/",
    "http:/allowed.example/",
    "http:allowed.example/",
    "http:\\\\allowed.example\\",
    "http://allowed.example/\\@127.0.0.1:9/",
    "http://allowed.example/..\\..\\x",
    "http://[::1]:9/",
    "http://0x7f.1:9/",
    "http://allowed.exampl\u{0435}/",
    "http://allowed.example;@127.0.0.1:9/",
    "http://allowed.example\u{3002}/",
];

fn policy() -> Policy {
    let registry =
        Registry::new().with(ToolSpec::new("fetch").arg("url", stockade_policy::allow::ArgType::String, true));
    let rule = Rule::new("allowed", ToolPattern::parse("fetch"), Effect::Allow)
        .arg("url", Predicate::url_hosts(["allowed.example"]));
    Policy::new(registry, vec![rule], None).unwrap()
}

fn allowed(p: &Policy, url: &str) -> bool {
    let call = ToolCall::new("fetch").arg("url", json!(url), Source::User);
    let mut gate = stockade_policy::allow::Gate::new(p.clone());
    gate.decide_unattended(&call, Duration::ZERO).is_ok()
}

/// The host curl sends each URL to, as a proxy on 127.0.0.1 sees it (the request's `Host`
/// for plain HTTP, the CONNECT target's host for HTTPS); `None` where curl sent nothing.
fn curl_hosts(urls: &[&str]) -> Vec<Option<String>> {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let proxy = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = std::sync::mpsc::channel::<Option<String>>();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut first = String::new();
            let _ = reader.read_line(&mut first);
            let mut host = None;
            if let Some(target) = first.strip_prefix("CONNECT ") {
                host = target.split_whitespace().next().map(|t| t.rsplit_once(':').map_or(t, |(h, _)| h).to_owned());
            }
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(v) = line.strip_prefix("Host: ").or_else(|| line.strip_prefix("host: ")) {
                    host.get_or_insert_with(|| {
                        let v = v.trim();
                        let end = if v.starts_with('[') {
                            v.find(']').map_or(v.len(), |i| i + 1)
                        } else {
                            v.rfind(':').unwrap_or(v.len())
                        };
                        v[..end].to_owned()
                    });
                }
            }
            let _ = conn.write_all(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
            let _ = tx.send(host.map(|h| h.trim_end_matches('.').to_ascii_lowercase()));
        }
    });
    urls.iter()
        .map(|url| {
            let status = Command::new("curl")
                .args(["-s", "-o", "/dev/null", "--max-time", "5", "--path-as-is", "-x", &proxy, "--", url])
                .status()
                .unwrap();
            // curl refused the URL itself (exit 3: malformed), or sent it to the proxy.
            if status.code() == Some(3) {
                return None;
            }
            rx.recv_timeout(Duration::from_secs(5)).ok().flatten()
        })
        .collect()
}

/// The host Python's `urllib.parse.urlsplit` reads in each URL (`None`: none, or an error).
fn python_hosts(urls: &[&str]) -> Vec<Option<String>> {
    let script = "import json, sys, urllib.parse\nfor u in json.load(sys.stdin):\n    try:\n        h = urllib.parse.urlsplit(u).hostname\n    except ValueError:\n        h = None\n    print(json.dumps(h.rstrip('.') if h else None))\n";
    let mut child = Command::new("python3")
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(serde_json::to_string(urls).unwrap().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn have(program: &str) -> bool {
    let there = Command::new(program).arg("--version").output().is_ok_and(|o| o.status.success());
    if !there {
        assert!(std::env::var_os("STOCKADE_REQUIRE_ALL").is_none(), "{program} is required here");
        eprintln!("SKIPPED the URL differential test: no {program}");
    }
    there
}

#[test]
fn g11_url_hosts_reads_a_url_as_curl_and_python_do_or_allows_nothing() {
    if !have("curl") || !have("python3") {
        return;
    }
    let p = policy();
    let curl = curl_hosts(CORPUS);
    let python = python_hosts(CORPUS);
    let mut disagreements = Vec::new();
    let mut allowed_count = 0;
    for (i, url) in CORPUS.iter().enumerate() {
        if !allowed(&p, url) {
            continue;
        }
        allowed_count += 1;
        let want = Some("allowed.example".to_owned());
        if curl[i] != want || python[i] != want {
            disagreements
                .push(format!("{url:?}: the policy allows it; curl reads {:?}, Python {:?}", curl[i], python[i]));
        }
    }
    assert!(disagreements.is_empty(), "{}", disagreements.join("\n"));
    // The plain spellings are still allowed: the test compares something.
    assert!(allowed_count >= 4, "only {allowed_count} URLs allowed");
    for plain in ["http://allowed.example/", "https://allowed.example/x?y=1", "HTTP://ALLOWED.EXAMPLE./path"] {
        assert!(allowed(&p, plain), "{plain}");
    }
}
