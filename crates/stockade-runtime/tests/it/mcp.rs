//! Host MCP servers as grants (G12), against `mcp_server.py`, a raw MCP server written with
//! the standard library so that every fault is deterministic. The real SDK's server, in a
//! real sandbox, is `stockade run --grant-mcp` in stockade-cli's tests. Every verdict is the
//! host's: the server's own log of what reached it, `/proc`, the sink's lines.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use stockade_policy::allow::{Gate, Permit, Policy, Source, ToolCall};
use stockade_runtime::Grants;
use stockade_runtime::mcp::{McpCommand, McpError, McpServer};

struct Fixture {
    dir: PathBuf,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Fixture {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("stockade-rt-mcp-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self { dir, lines: Arc::default() }
    }

    fn command(&self, mode: &str) -> McpCommand {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/mcp_server.py");
        let lines = self.lines.clone();
        McpCommand::new("raw", "python3", [script, mode])
            .unwrap()
            .env("MCP_LOG", self.dir.join("log").display().to_string())
            .start_timeout(Duration::from_secs(10))
            .on_stderr(move |l| lines.lock().unwrap().push(l.to_owned()))
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }

    /// Waits up to 5 s for the server's log to contain `needle`.
    async fn logged(&self, needle: &str) -> bool {
        for _ in 0..100 {
            if self.log().contains(needle) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    fn stderr(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A permit for `tool` with `args`, from a policy allowing every tool of the server.
fn permit(server: &Arc<McpServer>, tool: &str, args: Value) -> Permit {
    let grants = Grants::new().mcp(server).unwrap();
    let policy = Policy::from_toml(
        "version = 1\ndefault = \"deny\"\n[[rule]]\nid = \"all\"\ntool = \"raw.*\"\neffect = \"allow\"\n",
        &grants.registry(),
    )
    .unwrap();
    let call = ToolCall::from_json(tool, &args, &Source::Sandbox).unwrap();
    Gate::new(policy).decide_unattended(&call, Duration::ZERO).unwrap()
}

#[tokio::test]
async fn g12_the_handshake_pages_the_tools_skips_what_cannot_be_checked_and_answers_the_servers_requests() {
    let f = Fixture::new("handshake");
    let server = McpServer::start(f.command("ok")).await.unwrap();
    let names: Vec<&str> = server.tools().iter().map(|t| t.name()).collect();
    assert_eq!(names, ["echo", "slow", "die", "huge"]);
    let skipped: Vec<&str> = server.skipped().iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(skipped, ["bad name!", "loose"], "{:?}", server.skipped());
    assert!(server.skipped()[1].1.contains("cannot be checked"), "{:?}", server.skipped());
    // `Optional[str]` is granted as an optional string.
    assert_eq!(server.tools()[0].schema()["properties"]["note"], json!({"type": "string"}));
    assert_eq!(server.server_info()["name"], "raw");
    // What reached the server, in order: the handshake, both pages, and our answers to its
    // own requests (roots are not offered; ping is answered).
    assert!(f.logged("answer s2").await, "{}", f.log());
    let log = f.log();
    let lines: Vec<&str> = log.lines().collect();
    assert!(lines[0].starts_with("initialize ") && lines[0].contains("\"protocolVersion\": \"2025-11-25\""), "{log}");
    assert_eq!(lines[1], "notifications/initialized {}");
    assert_eq!(lines[2], "tools/list {}");
    assert_eq!(lines[3], "tools/list {\"cursor\": \"page-2\"}");
    assert!(log.contains("answer s1 {\"code\": -32601"), "{log}");
    assert!(log.contains("answer s2 {}"), "{log}");
    // The grants: `raw.TOOL`, with the tool's description in the manifest.
    let grants = Grants::new().mcp(&server).unwrap();
    let granted: Vec<&str> = grants.function_names().collect();
    assert_eq!(granted, ["raw.die", "raw.echo", "raw.huge", "raw.slow"]);
    assert!(f.stderr().contains("raw server starting"), "{}", f.stderr());
}

#[tokio::test]
async fn g12_a_call_returns_the_tool_result_with_the_servers_is_error_kept() {
    let f = Fixture::new("call");
    let server = McpServer::start(f.command("ok")).await.unwrap();
    let ok = server.call(permit(&server, "raw.echo", json!({"text": "hello"}))).await.unwrap();
    assert_eq!(ok, json!({"content": [{"type": "text", "text": "hello"}], "isError": false}));
    let err = server.call(permit(&server, "raw.echo", json!({"text": "err"}))).await.unwrap();
    assert_eq!(err["isError"], true);
    assert!(f.logged("tools/call {\"arguments\": {\"text\": \"err\"}, \"name\": \"echo\"}").await, "{}", f.log());
}

#[tokio::test]
async fn g12_a_call_abandoned_at_its_deadline_is_cancelled_at_the_server() {
    let f = Fixture::new("cancel");
    let server = McpServer::start(f.command("ok")).await.unwrap();
    let p = permit(&server, "raw.slow", json!({}));
    assert!(tokio::time::timeout(Duration::from_millis(300), server.call(p)).await.is_err());
    assert!(f.logged("notifications/cancelled {\"reason\"").await, "{}", f.log());
    // The connection is still good.
    let ok = server.call(permit(&server, "raw.echo", json!({"text": "after"}))).await.unwrap();
    assert_eq!(ok["content"][0]["text"], "after");
}

#[tokio::test]
async fn g12_a_crash_is_the_hosts_news_and_the_guest_learns_only_that_the_server_stopped() {
    let f = Fixture::new("crash");
    let server = McpServer::start(f.command("ok")).await.unwrap();
    let err = server.call(permit(&server, "raw.die", json!({}))).await.unwrap_err();
    assert_eq!(err, "the MCP server raw has stopped");
    // Once settled, the host has all of it: the exit status, and the last stderr line.
    let why = server.settled(Duration::from_secs(10)).await.expect("the host learns that it stopped");
    assert!(why.contains("exit status: 3"), "{why}");
    assert!(f.stderr().contains("dying words"), "{}", f.stderr());
    // Later calls fail at once, and run nothing.
    let err = server.call(permit(&server, "raw.echo", json!({"text": "late"}))).await.unwrap_err();
    assert_eq!(err, "the MCP server raw has stopped");
    assert!(!f.log().contains("late"));
}

#[tokio::test]
async fn g12_an_oversized_message_stops_the_server() {
    let f = Fixture::new("huge");
    let server = McpServer::start(f.command("ok")).await.unwrap();
    let err = server.call(permit(&server, "raw.huge", json!({}))).await.unwrap_err();
    assert_eq!(err, "the MCP server raw has stopped");
    assert!(server.stopped().unwrap().contains("a message over 4194304 bytes"), "{:?}", server.stopped());
}

#[tokio::test]
async fn g12_dropping_the_server_kills_its_whole_process_group() {
    let f = Fixture::new("group");
    let server = McpServer::start(f.command("helper")).await.unwrap();
    let log = f.log();
    let pid_of = |what: &str| -> u32 {
        log.lines().find_map(|l| l.strip_prefix(what)).and_then(|p| p.trim().parse().ok()).unwrap()
    };
    let (helper, leader) = (pid_of("helper "), pid_of("server "));
    // A live process: in /proc, and not a zombie (the state, stat's field 3).
    let alive = |pid: u32| {
        stockade_sys::proc::stat_fields(&pid.to_string()).is_some_and(|f| f.first().is_some_and(|s| s != "Z"))
    };
    assert!(alive(helper) && alive(leader));
    let grants = Grants::new().mcp(&server).unwrap();
    drop(server);
    // The grants still hold it.
    assert!(alive(helper));
    drop(grants);
    let mut gone = false;
    for _ in 0..100 {
        if !alive(helper) && !alive(leader) {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(gone, "the server's helper {helper} outlived it");
}

#[tokio::test]
async fn g12_a_server_that_cannot_start_or_shake_hands_is_a_clear_error() {
    let f = Fixture::new("errors");
    let e = McpServer::start(McpCommand::new("none", "/nonexistent/server", ["x"]).unwrap()).await.unwrap_err();
    assert!(matches!(e, McpError::Spawn { .. }), "{e}");
    assert!(e.to_string().starts_with("MCP server none: cannot start \"/nonexistent/server\""), "{e}");

    let e = McpServer::start(f.command("exit")).await.unwrap_err();
    assert!(matches!(e, McpError::Stopped { .. }), "{e}");
    let line = e.to_string();
    assert!(line.contains("exit status: 7") && line.contains("no config file, giving up"), "{line}");
    assert!(!line.contains('\n'), "{line}");

    let e = McpServer::start(f.command("old")).await.unwrap_err();
    assert!(e.to_string().contains("speaks protocol version \"2023-01-01\""), "{e}");

    let e = McpServer::start(f.command("mute").start_timeout(Duration::from_millis(500))).await.unwrap_err();
    assert_eq!(e, McpError::Timeout { name: "raw".into(), ms: 500 });

    assert!(matches!(McpCommand::new("a.b", "true", ["x"]), Err(McpError::Name(_))));
}

#[tokio::test]
async fn g12_a_server_with_a_hundred_tools_is_granted_whole() {
    let f = Fixture::new("many");
    let server = McpServer::start(f.command("many")).await.unwrap();
    let grants = Grants::new().mcp(&server).unwrap();
    assert_eq!(grants.function_names().count(), 120);
}
