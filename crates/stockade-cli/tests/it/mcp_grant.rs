//! `stockade run --grant-mcp` (G12) with a real host MCP server written with the pinned MCP
//! Python SDK (`desk_server.py`), granted to real guests: sh in the process tier, JavaScript
//! in the wasm tier. The server appends each tool it runs to a log on the host, and writes
//! its pid there; the verdicts are that log, `/proc`, and what reached the guest's stdout.

use std::path::PathBuf;

use serde_json::Value;

use crate::cli::{check_env, ready, tier_ready};

const POLICY: &str = r#"
version = 1
default = "deny"
[[rule]]
id = "notes"
tool = "desk.write_note"
effect = "allow"
args.text = { max_len = 40 }
[[rule]]
id = "failing"
tool = "desk.fail"
effect = "allow"
[[rule]]
id = "crashing"
tool = "desk.crash"
effect = "allow"
"#;

struct Desk {
    dir: PathBuf,
    python: String,
}

impl Desk {
    fn new(name: &str) -> Option<Self> {
        let python = crate::cli::installed("STOCKADE_MCP_PYTHON")?;
        let dir = std::env::temp_dir().join(format!("stockade-cli-desk-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("policy.toml"), POLICY).unwrap();
        Some(Self { dir, python })
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("desk.log")).unwrap_or_default()
    }

    fn server_pid(&self) -> u32 {
        std::fs::read_to_string(self.dir.join("desk.pid")).unwrap().trim().parse().unwrap()
    }

    /// `stockade run --grant-mcp desk=... --grant-policy ...`, then `rest`.
    fn run(&self, rest: &[&str]) -> (i32, String, String) {
        let server = format!("desk=exec {} {}/tests/it/desk_server.py", self.python, env!("CARGO_MANIFEST_DIR"));
        let policy = self.path("policy.toml");
        let mut args = vec!["run", "--grant-mcp", &server, "--grant-policy", &policy];
        args.extend_from_slice(rest);
        let (log, pid) = (self.path("desk.log"), self.path("desk.pid"));
        check_env(&args, &[("DESK_LOG", &log), ("DESK_PID", &pid)])
    }
}

impl Drop for Desk {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn g12_sh_in_the_process_tier_calls_a_host_mcp_servers_tools_only_as_the_policy_allows() {
    if !ready() {
        return;
    }
    let Some(desk) = Desk::new("sh") else { return };
    let script = r#"stockade-call desk.write_note '{"text":"from sh","title":"t1"}'
stockade-call desk.burn '{"text":"x"}' 2>&1; echo "burn=$?"
stockade-call desk.write_note '{"text":5}' 2>&1; echo "typed=$?"
stockade-call desk.write_note '{"text":"a note far longer than the policy lets through"}' 2>&1; echo "long=$?"
stockade-call desk.fail '{"why":"boom"}'; echo "fail=$?"
stockade-call desk.crash '{}' 2>&1; echo "crash=$?"
stockade-call desk.write_note '{"text":"late"}' 2>&1; echo "late=$?""#;
    let (code, out, err) = desk.run(&["--", "sh", "-c", script]);
    assert_eq!(code, 0, "{out}\n{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 13, "{out}");
    let first: Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(first["content"][0]["text"], "noted: from sh", "{out}");
    assert_eq!((&first["isError"], &first["structuredContent"]["result"]), (&false.into(), &"noted: from sh".into()));
    assert!(lines[1].contains(r#""code":"denied""#), "{out}");
    assert_eq!(lines[2], "burn=1");
    assert!(lines[3].contains(r#""code":"bad_args""#), "{out}");
    assert_eq!(lines[4], "typed=1");
    assert!(lines[5].contains(r#""code":"denied""#), "{out}");
    assert_eq!(lines[6], "long=1");
    // The tool's own failure is a result, with the server's isError kept.
    let failed: Value = serde_json::from_str(lines[7]).unwrap();
    assert_eq!(failed["isError"], true, "{out}");
    assert_eq!(lines[8], "fail=0");
    assert!(lines[9].contains("the MCP server desk has stopped"), "{out}");
    assert_eq!(lines[10], "crash=1");
    assert!(lines[11].contains("the MCP server desk has stopped"), "{out}");
    assert_eq!(lines[12], "late=1");
    // The host's log: only the allowed, well-typed calls reached the server.
    assert_eq!(desk.log(), "write_note t1 from sh\nfail boom\ncrash\n");
    // The server's stderr and its crash are the host's news, never the guest's output.
    assert!(err.contains("stockade: mcp desk: DESK-STDERR-CANARY"), "{err}");
    assert!(err.contains("stockade: mcp desk: DESK-DYING-WORDS"), "{err}");
    assert!(err.contains("stockade: mcp desk: stopped during the run:") && err.contains("exit status: 3"), "{err}");
    assert!(!out.contains("DESK-"), "{out}");
}

#[test]
fn g12_a_servers_stderr_reaches_the_terminal_by_the_one_escaping_rule() {
    // The guest's words, logged by the server: an escape sequence that would clear the
    // screen and set the title arrives as visible text, never as the bytes (judged on
    // stockade's own stderr, whatever it is).
    if !ready() {
        return;
    }
    let Some(desk) = Desk::new("escape") else { return };
    let script = r#"stockade-call desk.write_note '{"text":"\u001b[2J\u001b]0;pwned\u0007"}' >/dev/null"#;
    let (code, out, err) = desk.run(&["--", "sh", "-c", script]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(desk.log().contains("write_note"), "{}", desk.log());
    assert!(!err.contains('\u{1b}') && !err.contains('\u{7}'), "raw control bytes on stderr: {err:?}");
    assert!(err.contains("stockade: mcp desk: DESK-NOTE ^[[2J^[]0;pwned^G"), "{err}");
}

#[test]
fn g12_the_report_lists_each_call_and_the_server_ends_with_the_run() {
    if !ready() {
        return;
    }
    let Some(desk) = Desk::new("report") else { return };
    let script = r#"stockade-call desk.write_note '{"text":"one"}' >/dev/null; stockade-call desk.burn '{"text":"two"}' 2>/dev/null; true"#;
    let (code, out, err) = desk.run(&["--json", "--", "sh", "-c", script]);
    assert_eq!(code, 0, "{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    let calls: Vec<(&str, &str, &str)> = report["grants"]["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["grant"].as_str().unwrap(), c["outcome"].as_str().unwrap(), c["rule"].as_str().unwrap()))
        .collect();
    assert_eq!(calls, [("desk.write_note", "ok", "notes"), ("desk.burn", "denied", "default-deny")]);
    assert_eq!(desk.log(), "write_note - one\n");
    // The server (and its process group) ended with the run: stockade has exited, and so
    // has the server it started.
    let pid = desk.server_pid();
    stockade_test_support::eventually(std::time::Duration::from_secs(5), "the MCP server outlived the run", || {
        !stockade_test_support::alive(pid)
    });
}

#[test]
fn g12_busybox_sh_in_the_docker_tier_calls_the_same_tools_through_its_read_only_broker() {
    if !tier_ready("docker", |v| v["docker_tier"].as_bool().unwrap()) {
        return;
    }
    let Some(desk) = Desk::new("docker") else { return };
    let script = r#"stockade-call desk.write_note '{"text":"from docker"}'; stockade-call desk.burn '{"text":"x"}' 2>/dev/null; echo "burn=$?""#;
    let (code, out, err) = desk.run(&["--tier", "docker", "--", "sh", "-c", script]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("noted: from docker") && out.ends_with("burn=1\n"), "{out}");
    assert_eq!(desk.log(), "write_note - from docker\n");
}

#[test]
fn g12_javascript_in_the_wasm_tier_calls_name_dot_tool() {
    if !tier_ready("wasm", |v| {
        let guest = v["checks"].as_array().unwrap().iter().find(|c| c["name"] == "wasm js guest").unwrap();
        guest["ok"].as_bool().unwrap() && v["wasm_tier"].as_bool().unwrap()
    }) {
        return;
    }
    let Some(desk) = Desk::new("js") else { return };
    let js = "console.log(desk.write_note('from js').content[0].text); \
              console.log(desk.write_note({text: 'object', title: 'o'}).isError); \
              try { desk.burn('x') } catch (e) { console.log(e.code) }";
    let (code, out, err) = desk.run(&["--tier", "wasm", "--js", js]);
    assert_eq!((code, out.as_str()), (0, "noted: from js\nfalse\ndenied\n"), "{err}");
    assert_eq!(desk.log(), "write_note - from js\nwrite_note o object\n");
}

#[test]
fn g12_a_bad_mcp_server_is_a_clear_error_before_the_run() {
    let Some(desk) = Desk::new("bad") else { return };
    let policy = desk.path("policy.toml");
    for (spec, expected) in [
        ("desk", "--grant-mcp \"desk\" is not NAME=COMMAND"),
        ("a.b=true", "invalid MCP server name \"a.b\""),
        ("desk=echo not a server; exit 4", "(exit status: 4)"),
    ] {
        let (code, out, err) = check_env(&["run", "--grant-mcp", spec, "--grant-policy", &policy, "--", "true"], &[]);
        assert_eq!((code, out.as_str()), (125, ""), "{spec}: {err}");
        assert!(err.contains(expected), "{spec}: {err}");
        if spec.contains("exit 4") {
            assert!(err.contains("stockade: MCP server desk stopped during its handshake: its std"), "{err}");
        }
    }
}

#[test]
fn g12_an_agents_run_code_programs_call_the_configs_mcp_servers_as_the_grant_policy_allows() {
    use stockade_test_support::{MockLlm, Reply};
    if !ready() {
        return;
    }
    let Some(desk) = Desk::new("agent") else { return };
    let config = format!(
        r#"[endpoint]
model = "m"
[agent]
policy = "agent-policy.toml"
[grant]
policy = "policy.toml"
[[grant.mcp]]
name = "desk"
command = ["{}", "{}/tests/it/desk_server.py"]
env = ["DESK_LOG", "DESK_PID"]
[[tool]]
builtin = "run_code"
languages = ["sh"]
timeout = "20s"
"#,
        desk.python,
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::write(desk.dir.join("agent.toml"), config).unwrap();
    std::fs::write(
        desk.dir.join("agent-policy.toml"),
        "version = 1\ndefault = \"deny\"\n[[rule]]\nid = \"code\"\ntool = \"run_code\"\neffect = \"allow\"\n",
    )
    .unwrap();
    let code = r#"stockade-call desk.write_note '{"text":"from the agent"}'; stockade-call desk.burn '{"text":"x"}' 2>&1; echo "burn=$?""#;
    let mock = MockLlm::script(vec![
        Reply::calls(&[("run_code", serde_json::json!({"language": "sh", "code": code}))]),
        Reply::text("done"),
    ])
    .unwrap();
    let config = desk.path("agent.toml");
    let (log, pid) = (desk.path("desk.log"), desk.path("desk.pid"));
    let (code, out, err) = check_env(
        &["agent", "--config", &config, "--base-url", &mock.url(), "write it"],
        &[("DESK_LOG", &log), ("DESK_PID", &pid)],
    );
    assert_eq!((code, out.as_str()), (0, "done\n"), "{err}");
    let got = mock.received();
    let offered = got[0].body["tools"][0]["function"]["description"].as_str().unwrap().to_owned();
    assert!(offered.contains("desk.write_note") && offered.contains("desk.burn"), "{offered}");
    let result = got[1].body["messages"].as_array().unwrap().iter().find(|m| m["role"] == "tool").unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(result.contains("noted: from the agent"), "{result}");
    assert!(result.contains("no rule allows this call of `desk.burn`") && result.contains("burn=1"), "{result}");
    assert_eq!(desk.log(), "write_note - from the agent\n");
    assert!(err.contains("stockade: mcp desk: DESK-STDERR-CANARY"), "{err}");
}

/// G13 with a real host MCP server: a confined agent's model is offered the server's tools
/// (as `desk__write_note`), and each call reaches the server on the host only as the
/// agent's policy, decided there, allows.
#[test]
fn g13_a_confined_agents_model_calls_host_mcp_tools_as_the_host_policy_allows() {
    use stockade_test_support::{MockLlm, Reply};
    if !ready() {
        return;
    }
    let Some(desk) = Desk::new("confined") else { return };
    let config = format!(
        r#"[endpoint]
model = "m"
[agent]
policy = "policy.toml"
[[grant.mcp]]
name = "desk"
command = ["{}", "{}/tests/it/desk_server.py"]
env = ["DESK_LOG", "DESK_PID"]
[[tool]]
builtin = "run_code"
languages = ["sh"]
"#,
        desk.python,
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::write(desk.dir.join("agent.toml"), config).unwrap();
    let mock = MockLlm::script(vec![
        Reply::calls(&[
            ("desk__write_note", serde_json::json!({"text": "from the confined agent"})),
            ("desk__burn", serde_json::json!({"text": "x"})),
        ]),
        Reply::text("done"),
    ])
    .unwrap();
    let (config, trace) = (desk.path("agent.toml"), desk.path("trace.jsonl"));
    let (log, pid) = (desk.path("desk.log"), desk.path("desk.pid"));
    let (code, out, err) = check_env(
        &[
            "agent",
            "--confine",
            "process",
            "--config",
            &config,
            "--base-url",
            &mock.url(),
            "--trace",
            &trace,
            "write it",
        ],
        &[("DESK_LOG", &log), ("DESK_PID", &pid)],
    );
    assert_eq!((code, out.as_str()), (0, "done\n"), "{err}");
    let offered: Vec<String> = mock.received()[0].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        offered.contains(&"desk__write_note".to_owned()) && offered.contains(&"run_code".to_owned()),
        "{offered:?}"
    );
    let results: Vec<String> = mock.received()[1].tool_messages().into_iter().map(|(_, c)| c).collect();
    assert!(results[0].contains("noted: from the confined agent") && results[0].contains("<untrusted"), "{results:?}");
    assert!(results[1].contains("denied"), "{results:?}");
    // The server's own log: only the allowed call reached it.
    assert_eq!(desk.log(), "write_note - from the confined agent\n");
    let trace = std::fs::read_to_string(desk.dir.join("trace.jsonl")).unwrap();
    assert!(trace.contains(r#""tool":"desk.write_note""#) && trace.contains(r#""tool":"desk.burn""#), "{trace}");
}
