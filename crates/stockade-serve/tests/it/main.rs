//! stockade-serve's own tests, without the CLI's binary: an in-process E2B server on
//! 127.0.0.1:0 over the process tier's sessions, driven by raw HTTP/1.1 as a hostile or an
//! honest client would. This binary is its own sandbox helper (`helper_main` runs first), so
//! `cargo test -p stockade-serve` is the whole of it. The official SDK's tests are the CLI's
//! (`g11_*`).

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly on broken invariants")]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use stockade_runtime::process::{Helper, ProcessTier};
use stockade_runtime::session::Sessions;
use stockade_serve::e2b::{E2bConfig, E2bServer};

const KEY: &str = "serve-test-api-key-0123456789";

/// One request on a new connection: the status and the body.
fn request(addr: SocketAddr, head: &str, body: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut req = format!("{head}Host: t\r\nConnection: close\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes();
    req.extend_from_slice(body);
    s.write_all(&req).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

fn create(addr: SocketAddr, key: &str) -> (u16, serde_json::Value) {
    let head = format!("POST /v2/sandboxes HTTP/1.1\r\nX-API-Key: {key}\r\nContent-Type: application/json\r\n");
    let (status, body) = request(addr, &head, br#"{"templateID":"base","timeout":120}"#);
    (status, serde_json::from_str(&body).unwrap_or(serde_json::Value::Null))
}

/// envd's Start of `sh -c script` in sandbox `id` with `token`.
fn sh(addr: SocketAddr, id: &str, token: &str, script: &str) -> (u16, String) {
    let msg = serde_json::json!({"process": {"cmd": "/bin/sh", "args": ["-c", script]}}).to_string();
    let mut env = vec![0u8];
    env.extend_from_slice(&u32::try_from(msg.len()).unwrap().to_be_bytes());
    env.extend_from_slice(msg.as_bytes());
    let head = format!(
        "POST /process.Process/Start HTTP/1.1\r\nE2b-Sandbox-Id: {id}\r\nX-Access-Token: {token}\r\nContent-Type: application/connect+json\r\n"
    );
    request(addr, &head, &env)
}

fn ids(v: &serde_json::Value) -> (String, String) {
    (v["sandboxID"].as_str().unwrap().to_owned(), v["envdAccessToken"].as_str().unwrap().to_owned())
}

fn the_api_key_opens_the_control_plane_and_nothing_else_does(addr: SocketAddr) {
    assert_eq!(create(addr, "").0, 401, "no key");
    assert_eq!(create(addr, "serve-test-api-key-0123456788").0, 401, "a key one byte off");
    let (status, v) = create(addr, KEY);
    assert_eq!(status, 201, "{v}");
    let (id, _) = ids(&v);
    let kill = format!("DELETE /sandboxes/{id} HTTP/1.1\r\nX-API-Key: {KEY}\r\n");
    assert_eq!(request(addr, &kill, b"").0, 204);
    assert_eq!(request(addr, &kill, b"").0, 404, "killed once");
}

fn a_sandbox_runs_a_command_and_its_token_opens_it_alone(addr: SocketAddr) {
    let (a, a_token) = ids(&create(addr, KEY).1);
    let (b, b_token) = ids(&create(addr, KEY).1);
    let (status, body) = sh(addr, &a, &a_token, "echo $((6*7))");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("NDIK"), "42 in base64: {body}");
    assert_eq!(sh(addr, &a, &b_token, "echo no").0, 401, "B's token on A");
    // As through E2B's proxy: a sandbox that is not running is a 502 that says so.
    let (status, body) = sh(addr, "0123456789abcdef", &a_token, "echo no");
    assert!(status == 502 && body.contains("was not found"), "an unknown sandbox: {status} {body}");
    for (id, _) in [(a, a_token), (b, b_token)] {
        assert_eq!(request(addr, &format!("DELETE /sandboxes/{id} HTTP/1.1\r\nX-API-Key: {KEY}\r\n"), b"").0, 204);
    }
}

/// A test: its name, and the function it runs against the server's address.
type Case = (&'static str, fn(SocketAddr));

fn main() -> ExitCode {
    stockade_runtime::process::helper_main();
    if !stockade_runtime::sys::proc::is_root().unwrap_or(false) {
        // A sandbox's home is a tmpfs of the template's size, which takes root to mount.
        println!("stockade-serve tests: SKIPPED: a sandbox's sized home needs root");
        return if std::env::var_os("STOCKADE_REQUIRE_ALL").is_some() { ExitCode::FAILURE } else { ExitCode::SUCCESS };
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let state = std::env::temp_dir().join(format!("serve-it-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&state);
    std::fs::create_dir_all(&state).unwrap();
    let addr = rt.block_on(async {
        let tier = ProcessTier::new(Helper::current_exe().unwrap().prefer_fork());
        let sessions = Arc::new(Sessions::new(tier, &state, 8).unwrap());
        let server = E2bServer::new(sessions, E2bConfig::new(KEY.to_owned()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(server.serve(listener));
        addr
    });
    let tests: [Case; 2] = [
        (
            "the_api_key_opens_the_control_plane_and_nothing_else_does",
            the_api_key_opens_the_control_plane_and_nothing_else_does,
        ),
        (
            "a_sandbox_runs_a_command_and_its_token_opens_it_alone",
            a_sandbox_runs_a_command_and_its_token_opens_it_alone,
        ),
    ];
    let mut failed = 0;
    for (name, test) in tests {
        match std::panic::catch_unwind(|| test(addr)) {
            Ok(()) => println!("test {name} ... ok"),
            Err(_) => {
                println!("test {name} ... FAILED");
                failed += 1;
            }
        }
    }
    rt.shutdown_timeout(Duration::from_secs(5));
    let _ = std::fs::remove_dir_all(&state);
    println!(
        "test result: {}. {} passed; {failed} failed",
        if failed == 0 { "ok" } else { "FAILED" },
        tests.len() - failed
    );
    if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
