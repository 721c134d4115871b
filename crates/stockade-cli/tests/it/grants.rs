//! `stockade run --grant-*` (G4) with real guests: sh and python3 in the process tier,
//! busybox sh in the docker tier, JavaScript in the wasm tier. A granted tool appends each
//! call it runs to a log on the host; the host reads that log, never the guest's word.

use std::path::PathBuf;

use crate::cli::{check, ready, tier_ready};

const POLICY: &str = r#"
version = 1
default = "deny"
[[rule]]
id = "small-sums"
tool = "add"
effect = "allow"
args.a = { maximum = 1000 }
"#;

const SCHEMA: &str = r#"{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"required":["a","b"],"additionalProperties":false}"#;

/// A fresh directory with rows.json, the policy, the schema, and the tool's log path.
struct Fixture {
    dir: PathBuf,
}

impl Fixture {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("stockade-cli-grants-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("rows.json"), "[{\"id\":1},{\"id\":2},{\"id\":3}]").unwrap();
        std::fs::write(dir.join("policy.toml"), POLICY).unwrap();
        std::fs::write(dir.join("add.json"), SCHEMA).unwrap();
        Self { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("calls.log")).unwrap_or_default()
    }

    /// `stockade run` with the fixture's grants, then `rest`.
    fn run(&self, rest: &[&str]) -> (i32, String, String) {
        let data = format!("rows=@{}", self.path("rows.json"));
        let tool = format!(
            "add=tee -a {} | python3 -c 'import json,sys; a=json.load(sys.stdin); print(a[\"a\"]+a[\"b\"])'; echo >> {}",
            self.path("calls.log"),
            self.path("calls.log")
        );
        let schema = format!("add=@{}", self.path("add.json"));
        let policy = self.path("policy.toml");
        let mut args = vec![
            "run",
            "--grant-data",
            &data,
            "--grant-tool",
            &tool,
            "--grant-schema",
            &schema,
            "--grant-policy",
            &policy,
        ];
        args.extend_from_slice(rest);
        check(&args)
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn g4_sh_in_the_process_tier_reads_its_data_and_calls_only_what_the_policy_allows() {
    if !ready() {
        return;
    }
    let f = Fixture::new("sh");
    let script = r#"cat "$STOCKADE_GRANTS/data/rows.json"; echo
stockade-call add '{"a":3,"b":4}'
stockade-call add '{"a":3000,"b":4}' 2>&1; echo "denied=$?"
stockade-call send '{"to":"x"}' 2>&1; echo "ungranted=$?"
stockade-call rows"#;
    let (code, out, err) = f.run(&["--", "sh", "-c", script]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], r#"[{"id":1},{"id":2},{"id":3}]"#);
    assert_eq!(lines[1], "7");
    assert!(lines[2].contains(r#""code":"denied""#), "{out}");
    assert_eq!(lines[3], "denied=1");
    assert!(lines[4].contains("this run has no grant named \\\"send\\\""), "{out}");
    assert_eq!(lines[5], "ungranted=1");
    assert_eq!(lines[6], r#"[{"id":1},{"id":2},{"id":3}]"#);
    // The host's log: the tool ran once, for the allowed call only.
    assert_eq!(f.log(), "{\"a\":3,\"b\":4}\n");
}

#[test]
fn g4_python3_speaks_the_documented_wire_protocol_itself() {
    if !ready() {
        return;
    }
    let f = Fixture::new("py");
    let script = r#"
import json, os, socket, struct
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["STOCKADE_BROKER"])
def call(i, grant, args):
    body = json.dumps({"type": "call", "id": i, "grant": grant, "args": args}).encode()
    s.sendall(struct.pack(">I", len(body)) + body)
    n = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))[0]
    return json.loads(s.recv(n, socket.MSG_WAITALL))
print(json.dumps(call(1, "add", {"a": 20, "b": 22})))
print(json.dumps(call(2, "add", {"a": "20", "b": 22})["error"]["code"]))
print(json.dumps(call(3, "stockade.list", {})["result"]["functions"][0]["params"]))
"#;
    let (code, out, err) = f.run(&["--", "python3", "-c", script]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "{\"type\": \"reply\", \"id\": 1, \"result\": 42}\n\"bad_args\"\n[\"a\", \"b\"]\n");
    assert_eq!(f.log(), "{\"a\":20,\"b\":22}\n");
}

#[test]
fn g4_grant_strict_refuses_a_run_with_a_denied_call_and_json_shows_every_call() {
    if !ready() {
        return;
    }
    let f = Fixture::new("strict");
    let (code, out, err) =
        f.run(&["--grant-strict", "--", "sh", "-c", "stockade-call add '{\"a\":5000,\"b\":1}'; echo done"]);
    assert_eq!((code, out.as_str()), (116, ""), "{err}");
    assert!(err.contains("refused: grant denied: 1 of 1 calls denied; first: add by rule default-deny"), "{err}");
    let (code, out, _) = f.run(&["--json", "--", "sh", "-c", "stockade-call add '{\"a\":1,\"b\":1}'"]);
    assert_eq!(code, 0);
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let call = &report["grants"]["calls"][0];
    assert_eq!((&call["grant"], &call["outcome"], &call["rule"]), (&"add".into(), &"ok".into(), &"small-sums".into()));
    assert!(report["enforcement"].as_array().unwrap().iter().any(|e| e["mechanism"] == "grants_broker"));
    // The view: the grants directory is read-only, and the guest cannot plant anything in it.
    let (code, out, _) = f.run(&["--", "sh", "-c", "touch $STOCKADE_GRANTS/x 2>/dev/null; echo $?"]);
    assert_eq!((code, out.as_str()), (0, "1\n"));
}

#[test]
fn g4_busybox_sh_in_the_docker_tier_reaches_its_grants_through_a_read_only_bind() {
    if !tier_ready("docker", |v| v["docker_tier"].as_bool().unwrap()) {
        return;
    }
    let f = Fixture::new("docker");
    let script = r#"cat /broker/data/rows.json; echo; stockade-call add '{"a":3,"b":4}'; stockade-call add '{"a":3000,"b":4}' 2>/dev/null; echo "denied=$?"; touch /broker/x 2>/dev/null; echo "write=$?""#;
    let (code, out, err) = f.run(&["--tier", "docker", "--", "sh", "-c", script]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "[{\"id\":1},{\"id\":2},{\"id\":3}]\n7\ndenied=1\nwrite=1\n");
    assert_eq!(f.log(), "{\"a\":3,\"b\":4}\n");
}

#[test]
fn g4_javascript_in_the_wasm_tier_sees_its_grants_as_globals() {
    if !tier_ready("wasm", |v| {
        let guest = v["checks"].as_array().unwrap().iter().find(|c| c["name"] == "wasm js guest").unwrap();
        guest["ok"].as_bool().unwrap() && v["wasm_tier"].as_bool().unwrap()
    }) {
        return;
    }
    let f = Fixture::new("js");
    let js = "console.log(add(rows.length, 1)); \
              try { add(5000, 1) } catch (e) { console.log(e.code) } \
              try { stockade.call('send', {}) } catch (e) { console.log(e.code) } \
              console.log(add({a: 2, b: 2}))";
    let (code, out, err) = f.run(&["--tier", "wasm", "--js", js]);
    assert_eq!((code, out.as_str()), (0, "4\ndenied\ndenied\n4\n"), "{err}");
    assert_eq!(f.log(), "{\"a\":3,\"b\":1}\n{\"a\":2,\"b\":2}\n");
    // Without grants, a script sees none of this.
    let (code, out, _) = check(&["run", "--tier", "wasm", "--js", "console.log(typeof rows, typeof stockade)"]);
    assert_eq!((code, out.as_str()), (0, "undefined undefined\n"));
}

#[test]
fn g4_bad_grant_flags_are_clear_errors() {
    let f = Fixture::new("flags");
    for (args, expected) in [
        (vec!["run", "--grant-data", "rows", "--", "true"], "is not NAME=@FILE or NAME=JSON"),
        (vec!["run", "--grant-data", "rows=@/nonexistent.json", "--", "true"], "reading /nonexistent.json"),
        (vec!["run", "--grant-data", "rows={not json", "--", "true"], "--grant-data rows: not JSON"),
        (vec!["run", "--grant-data", "bad name=1", "--", "true"], "invalid grant name"),
        (vec!["run", "--grant-schema", "x={}", "--", "true"], "--grant-schema x: no --grant-tool x=COMMAND"),
    ] {
        let (code, _, err) = check(&args);
        assert_eq!(code, 125, "{args:?}: {err}");
        assert!(err.contains(expected), "{args:?}: {err}");
    }
    let bad_policy = f.path("bad.toml");
    std::fs::write(&bad_policy, "version = 1\ndefault = \"allow\"\n").unwrap();
    let (code, _, err) = check(&["run", "--grant-tool", "t=true", "--grant-policy", &bad_policy, "--", "true"]);
    assert_eq!(code, 125, "{err}");
    assert!(err.contains("grant policy"), "{err}");
}

/// `stockade run --grant-model` against the mock upstream on 127.0.0.1, with the real key in
/// the CLI's environment only. The mock records what reached it; the guest's output and
/// environment are checked for the key from the host.
fn run_with_model(mock: &stockade_test_support::MockLlm, rest: &[&str]) -> (i32, String, String) {
    run_model(&mock.url(), "smol", rest)
}

/// `stockade run --grant-model` of `model` at `url`, with the real key in the CLI's
/// environment only, then `rest`.
fn run_model(url: &str, model: &str, rest: &[&str]) -> (i32, String, String) {
    let (_, code, out, err) = run_model_as(url, model, rest);
    (code, out, err)
}

/// [`run_model`], with the pid the CLI ran as (what its containers' owner label names).
fn run_model_as(url: &str, model: &str, rest: &[&str]) -> (u32, i32, String, String) {
    let mut args =
        vec!["run", "--grant-model", "--base-url", url, "--model", model, "--api-key-env", "STOCKADE_TEST_REAL_KEY"];
    args.extend_from_slice(rest);
    let _runs = crate::cli::shared();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_stockade"))
        .args(&args)
        .env("STOCKADE_TEST_REAL_KEY", REAL_KEY)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let o = child.wait_with_output().unwrap();
    (
        pid,
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

const REAL_KEY: &str = "sk-real-CANARY-5b1e9d";

/// A python3 guest posting each body in `bodies` (with `key`, or the run's placeholder)
/// through the standard library over the model socket; prints `STATUS BODY` per request.
const PY_CLIENT: &str = r#"
import http.client, json, os, socket, sys
class Unix(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(os.environ["STOCKADE_MODEL_SOCKET"])
key = os.environ["OPENAI_API_KEY"]
print("KEY", key.startswith("sk-stockade-"), len(key))
for body in json.loads(sys.argv[1]):
    k = body.pop("_key", key)
    pad = body.pop("_pad", 0)
    if pad:
        body["pad"] = "x" * pad
    c = Unix("localhost")
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Authorization": "Bearer " + k, "Content-Type": "application/json"})
    r = c.getresponse()
    print(r.status, r.read().decode())
"#;

#[test]
fn g4_a_model_grant_keeps_the_real_key_outside_and_sends_only_validated_requests() {
    if !ready() {
        return;
    }
    // A hostile upstream: it echoes the Authorization header it got into its answer.
    let mock = stockade_test_support::MockLlm::start(|_, r| {
        let text = format!("the answer is 42; you sent {}", r.header("authorization").unwrap_or(""));
        if r.body["stream"] == serde_json::json!(true) {
            let delta = serde_json::json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": text}}]});
            let end = serde_json::json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]});
            stockade_test_support::Reply::sse(&[delta, end], true)
        } else {
            stockade_test_support::Reply::text(&text)
        }
    })
    .unwrap();
    let user = serde_json::json!({"role": "user", "content": "What is 6*7?"});
    let bodies = serde_json::json!([
        // llama.cpp's tests send no model; `store` is a field the broker drops.
        {"messages": [user], "store": true, "temperature": 0},
        {"model": "smol", "messages": [user], "stream": true},
        {"model": "gpt-elsewhere", "messages": [user]},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/x.png"}}]}]},
        {"messages": [user], "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "http://127.0.0.1:9/s.json"}}}},
        {"messages": [user], "_key": REAL_KEY},
        {"messages": [user], "_key": "sk-stockade-guessed"},
        // A body larger than the socket's buffer with a wrong key: the refusal must reach the
        // client, not close the connection while it is still writing (a broken pipe).
        {"messages": [user], "_key": "sk-stockade-guessed", "_pad": 900_000},
    ])
    .to_string();
    let (code, out, err) = run_with_model(&mock, &["--json", "--", "python3", "-c", PY_CLIENT, &bodies]);
    assert_eq!(code, 0, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let stdout = report["stdout"]["bytes"].as_str().unwrap().to_owned();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "KEY True 60", "{stdout}");
    assert!(
        lines[1].starts_with("200 ") && lines[1].contains("the answer is 42; you sent Bearer [redacted]"),
        "{stdout}"
    );
    assert!(lines[2].starts_with("200 data: ") && stdout.contains("data: [DONE]"), "{stdout}");
    assert!(stdout.contains("you sent Bearer [redacted]") && !stdout.contains("upstream_error"), "{stdout}");
    let rest: Vec<&str> = lines.iter().filter(|l| l.starts_with(char::is_numeric)).skip(2).copied().collect();
    let statuses: Vec<&str> = rest.iter().map(|l| &l[..3]).collect();
    assert_eq!(statuses, ["403", "400", "400", "401", "401", "401"], "{stdout}");
    // The real key is nowhere the guest could see.
    assert!(!out.contains(REAL_KEY), "the real key reached the sandbox: {out}");
    // Only the two valid requests reached the upstream, rebuilt, with the real key.
    let got = mock.received();
    assert_eq!(got.len(), 2, "{got:#?}");
    for r in &got {
        assert_eq!(r.header("authorization"), Some(format!("Bearer {REAL_KEY}").as_str()));
        assert_eq!(r.body["model"], "smol");
        assert!(r.body.get("store").is_none(), "a dropped field was forwarded: {}", r.body);
    }
    // The streamed request is relayed as a stream (asking for usage); the other is not.
    assert_eq!((got[0].body.get("stream"), &got[1].body["stream"]), (None, &serde_json::json!(true)));
    let calls = report["grants"]["calls"].as_array().unwrap();
    let rules: Vec<&str> = calls.iter().map(|c| c["rule"].as_str().unwrap()).collect();
    assert_eq!(
        rules,
        [
            "model",
            "model",
            "model-allowlist",
            "model-validator",
            "model-validator",
            "model-placeholder-key",
            "model-placeholder-key",
            "model-placeholder-key"
        ]
    );
}

#[test]
fn g4_curl_reaches_the_model_grant_over_its_unix_socket() {
    if !ready() || std::process::Command::new("curl").arg("--version").output().is_err() {
        return;
    }
    let mock = stockade_test_support::MockLlm::start(|_, _| stockade_test_support::Reply::text("hi")).unwrap();
    let script = r#"curl -s --unix-socket "$STOCKADE_MODEL_SOCKET" -H "Authorization: Bearer $OPENAI_API_KEY" http://localhost/v1/models"#;
    let (code, out, err) = run_with_model(&mock, &["--", "sh", "-c", script]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["data"][0]["id"], "smol");
    assert!(mock.received().is_empty());
}

/// A python3 guest that speaks only TCP (the standard library's `urllib`, as an SDK would)
/// to `$OPENAI_BASE_URL`, then tries the host's loopback port where the mock really listens.
const PY_TCP_CLIENT: &str = r#"
import json, os, socket, sys, urllib.request
base = os.environ["OPENAI_BASE_URL"]
print("BASE", base)
req = urllib.request.Request(base + "/chat/completions",
    data=json.dumps({"messages": [{"role": "user", "content": "6*7?"}]}).encode(),
    headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
print("CHAT", json.load(urllib.request.urlopen(req, timeout=10))["choices"][0]["message"]["content"])
for port in (int(sys.argv[1]), 22, 80):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2)
        print("CONNECTED", port)
    except OSError as e:
        print("REFUSED", port, e.errno)
"#;

#[test]
fn g4_a_tcp_only_client_reaches_the_model_grant_at_openai_base_url_and_nothing_else() {
    if !ready() {
        return;
    }
    let mock = stockade_test_support::MockLlm::start(|_, _| stockade_test_support::Reply::text("42")).unwrap();
    let url = mock.url();
    let port = url.trim_end_matches("/v1").rsplit(':').next().unwrap();
    let (code, out, err) = run_with_model(&mock, &["--", "python3", "-c", PY_TCP_CLIENT, port]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[..2], ["BASE http://127.0.0.1:8765/v1", "CHAT 42"], "{out}");
    // The host's loopback is not the run's: the mock's own port, and any other, is refused
    // (landlock denies every tcp connect but the model port; nothing else listens there).
    for line in &lines[2..] {
        assert!(line.starts_with("REFUSED "), "{out}");
    }
    // Exactly the one chat request reached the upstream, with the real key.
    let got = mock.received();
    assert_eq!(got.len(), 1, "{got:#?}");
    assert_eq!(got[0].header("authorization"), Some(format!("Bearer {REAL_KEY}").as_str()));
    // curl over TCP, streamed, the same way.
    if std::process::Command::new("curl").arg("--version").output().is_ok() {
        let script = r#"curl -sS -H "Authorization: Bearer $OPENAI_API_KEY" "$OPENAI_BASE_URL/models""#;
        let (code, out, err) = run_with_model(&mock, &["--", "sh", "-c", script]);
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["data"][0]["id"], "smol");
    }
}

/// The pinned OpenAI Python SDK installed for the guests' interpreter (`cargo xtask ci` and
/// `cargo xtask llm --test` set `STOCKADE_OPENAI_PYTHON`); required when CI requires all.
fn openai_sdk() -> Option<String> {
    crate::cli::installed("STOCKADE_OPENAI_PYTHON")
}

/// A guest using the stock OpenAI SDK with nothing configured but what the grant put in its
/// environment (`OPENAI_BASE_URL`, `OPENAI_API_KEY`): a chat, a streamed chat, the model list.
const PY_SDK_CLIENT: &str = r#"
import os, sys, openai
c = openai.OpenAI(max_retries=0, timeout=float(sys.argv[2]))
msgs = [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "What is 6*7?"}]
r = c.chat.completions.create(model=sys.argv[1], messages=msgs, max_tokens=16, temperature=0)
print("CHAT", r.choices[0].finish_reason, repr(r.choices[0].message.content)[:60])
n = sum(1 for _ in c.chat.completions.create(model=sys.argv[1], messages=msgs, max_tokens=16, stream=True))
print("STREAM", n > 0)
print("MODELS", [m.id for m in c.models.list()])
try:
    openai.OpenAI(max_retries=0, api_key="sk-guessed").models.list()
except openai.AuthenticationError as e:
    print("WRONG KEY", e.status_code)
"#;

/// `stockade run --grant-model` with the OpenAI SDK granted read-only as the workspace.
fn run_sdk(sdk: &str, base_url: &str, model: &str, timeout: &str) -> (i32, String, String) {
    run_sdk_script(sdk, base_url, model, timeout, PY_SDK_CLIENT, &[model, "60"])
}

/// `stockade run --grant-model` running `script` (with `args`) on the OpenAI SDK.
fn run_sdk_script(
    sdk: &str,
    base_url: &str,
    model: &str,
    timeout: &str,
    script: &str,
    args: &[&str],
) -> (i32, String, String) {
    // A copy the guest's user can reach (the install lives under the invoking user's home),
    // one per call: tests that run at once with the same model name once shared one, and one
    // test's removal pulled modules from under the other's import.
    static COPIES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COPIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let copy = std::env::temp_dir().join(format!("stockade-cli-sdk-{}-{n}-{model}", std::process::id()));
    let _ = std::fs::remove_dir_all(&copy);
    assert!(std::process::Command::new("cp").arg("-a").arg(sdk).arg(&copy).status().unwrap().success());
    std::fs::set_permissions(&copy, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let ws = format!("{}:ro", copy.display());
    let rest = ["--workspace", &ws, "--env", "PYTHONPATH=/workspace", "--timeout", timeout, "--memory", "1g"];
    let out = run_model(base_url, model, &[&rest[..], &["--", "python3", "-c", script], args].concat());
    let _ = std::fs::remove_dir_all(&copy);
    out
}

#[test]
fn g4_the_openai_sdk_inside_the_sandbox_reaches_the_model_grant_unconfigured() {
    let Some(sdk) = openai_sdk() else { return };
    if !ready() {
        return;
    }
    let mock = stockade_test_support::MockLlm::start(|_, r| {
        if r.body["stream"] == serde_json::json!(true) {
            let delta = serde_json::json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "42"}}]});
            let end = serde_json::json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]});
            stockade_test_support::Reply::sse(&[delta, end], true)
        } else {
            stockade_test_support::Reply::text("42")
        }
    })
    .unwrap();
    let (code, out, err) = run_sdk(&sdk, &mock.url(), "smol", "60s");
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        ["CHAT stop '42'", "STREAM True", "MODELS ['smol']", "WRONG KEY 401"],
        "{err}"
    );
    let got = mock.received();
    assert_eq!(got.len(), 2, "{got:#?}");
    for r in &got {
        assert_eq!(r.header("authorization"), Some(format!("Bearer {REAL_KEY}").as_str()));
    }
    assert!(!out.contains(REAL_KEY) && !err.contains(REAL_KEY));
}

/// The same guest against the real local model (`cargo xtask llm --test` sets
/// `STOCKADE_LLM_URL`): the SDK's own parsing accepts what the broker relays from a real
/// server, whole and streamed.
#[test]
fn g4_real_model_reached_by_the_openai_sdk_inside_the_sandbox() {
    let Some((url, _model)) = crate::cli::llm_url() else { return };
    let Some(sdk) = openai_sdk() else { return };
    if !ready() {
        return;
    }
    let (code, out, err) = run_sdk(&sdk, &url, "smollm2", "170s");
    eprintln!("real model through the SDK: exit {code}\n{out}{err}");
    if code == 1 && err.contains("openai.InternalServerError: Error code: 502 - the endpoint is unreachable") {
        // The local server died under the request (seen on a fresh machine: a general
        // protection fault in libggml-cpu; see the session note): the broker still answered
        // with a typed 502 that the SDK raised as its own error, and the key stayed outside.
        eprintln!("real model UNAVAILABLE: the upstream server is unreachable; the SDK got a typed 502");
        assert!(!err.contains(REAL_KEY) && !out.contains(REAL_KEY));
        return;
    }
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("CHAT "), "{out}");
    assert_eq!(lines[1..], ["STREAM True", "MODELS ['smollm2']", "WRONG KEY 401"], "{out}");
}

/// The request shapes local servers' clients send (issue 40's fixtures, in
/// `stockade-protocol/tests/fixtures/requests/`), each sent by the stock OpenAI SDK inside the
/// sandbox with everything but `model` and `messages` as `extra_body`, as a user of those
/// servers writes it; prints `OK` or `ERR STATUS MESSAGE` per body.
const PY_SDK_SHAPES: &str = r#"
import json, sys, openai
c = openai.OpenAI(max_retries=0, timeout=120.0)
for body in json.loads(sys.argv[1]):
    body.pop("model", None)
    messages = body.pop("messages")
    try:
        r = c.chat.completions.create(model=sys.argv[2], messages=messages, extra_body=body)
        print("OK", r.choices[0].finish_reason)
    except openai.APIStatusError as e:
        print("ERR", e.status_code, str(e)[:300].replace("\n", " "))
"#;

/// Issue 40's accepted shapes, read from the protocol crate's fixtures, and the refused one.
fn shapes(max_tokens: Option<u64>) -> String {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../stockade-protocol/tests/fixtures/requests");
    let bodies: Vec<serde_json::Value> = [
        "llamacpp_required_tool_top_k.json",
        "llamacpp_tools_null.json",
        "zod_schema_dialect.json",
        "local_sampling_knobs.json",
        "reasoning_history.json",
        "vllm_tool_level_strict.json",
        "ollama_tool_name_no_id.json",
    ]
    .iter()
    .map(|f| {
        let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join(f)).unwrap()).unwrap();
        if let Some(n) = max_tokens {
            v["max_tokens"] = n.into();
        }
        v
    })
    .collect();
    serde_json::to_string(&bodies).unwrap()
}

/// real-traffic: each shape reaches the upstream rebuilt (knobs forwarded, `tools: null`,
/// `$schema` and reasoning dropped, a tool-level `strict` moved), and the one refused by
/// decision comes back to the SDK as a typed 400 naming why. Judged by what the upstream got.
#[test]
fn g4_local_server_request_shapes_pass_the_proxy_rebuilt() {
    let Some(sdk) = openai_sdk() else { return };
    if !ready() {
        return;
    }
    let mock = stockade_test_support::MockLlm::start(|_, _| stockade_test_support::Reply::text("ok")).unwrap();
    let (code, out, err) = run_sdk_script(&sdk, &mock.url(), "smol", "60s", PY_SDK_SHAPES, &[&shapes(None), "smol"]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[..6], ["OK stop"; 6], "{out}{err}");
    assert!(lines[6].starts_with("ERR 400 ") && lines[6].contains("a tool name alone cannot say"), "{out}");
    let got: Vec<serde_json::Value> = mock.received().into_iter().map(|r| r.body).collect();
    assert_eq!(got.len(), 6, "{got:#?}");
    assert_eq!(got[0]["top_k"], 1);
    assert!(got[1].get("tools").is_none(), "{}", got[1]);
    assert!(!got[2].to_string().contains("$schema"), "{}", got[2]);
    for (k, v) in [("top_k", 40.0), ("min_p", 0.05), ("typical_p", 1.0), ("repeat_penalty", 1.1)] {
        assert_eq!(got[3][k].as_f64(), Some(v), "{k}: {}", got[3]);
    }
    assert!(!got[4].to_string().contains("reasoning"), "{}", got[4]);
    assert_eq!(got[5]["tools"][0]["function"]["strict"], true, "{}", got[5]);
    assert!(got[5]["tools"][0].get("strict").is_none(), "{}", got[5]);
    assert!(got.iter().all(|b| b["model"] == "smol"));
}

/// The same shapes against the real local model (`cargo xtask llm --test`): none is refused
/// by the validator; the server answers those without tools (its sampling knobs included),
/// and a tool-bearing one it cannot serve comes back as its own error, relayed as a 502.
#[test]
fn g4_real_model_answers_local_server_request_shapes() {
    let Some((url, _model)) = crate::cli::llm_url() else { return };
    let Some(sdk) = openai_sdk() else { return };
    if !ready() {
        return;
    }
    let (code, out, err) = run_sdk_script(&sdk, &url, "smollm2", "300s", PY_SDK_SHAPES, &[&shapes(Some(8)), "smollm2"]);
    eprintln!("real model, request shapes: exit {code}\n{out}{err}");
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 7, "{out}");
    for line in &lines[..6] {
        assert!(line.starts_with("OK ") || line.starts_with("ERR 502 "), "{out}");
    }
    // No tools: `tools: null`, the sampling knobs, the reasoning history.
    for i in [1, 3, 4] {
        assert!(lines[i].starts_with("OK "), "{out}");
    }
    assert!(lines[6].starts_with("ERR 400 "), "{out}");
}

#[test]
fn g4_a_javascript_guest_reaches_the_model_grant_as_a_global() {
    if !crate::cli::js_ready() {
        return;
    }
    // A hostile upstream again: it echoes the Authorization header it got.
    let mock = stockade_test_support::MockLlm::start(|_, r| {
        stockade_test_support::Reply::text(&format!("42; you sent {}", r.header("authorization").unwrap_or("")))
    })
    .unwrap();
    let js = r#"
const r = model({messages: [{role: "user", content: "What is 6*7?"}], temperature: 0});
console.log("ANSWER " + r.choices[0].message.content);
for (const bad of [{model: "gpt-elsewhere", messages: [{role: "user", content: "x"}]},
                   {messages: [{role: "user", content: "x"}], stream: true},
                   {messages: "not a list"}]) {
  try { model(bad); console.log("ACCEPTED"); } catch (e) { console.log("REFUSED " + e.code + " " + e.message.split(":")[2]); }
}
console.log("GLOBALS " + stockade.manifest.functions.map(f => f.name).join(","));
"#;
    let (code, out, err) = run_with_model(&mock, &["--tier", "wasm", "--json", "--js", js]);
    assert_eq!(code, 0, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let stdout = report["stdout"]["bytes"].as_str().unwrap().to_owned();
    // The answer came back through the broker, which kept the real key out of it.
    assert!(stdout.contains("ANSWER 42; you sent Bearer [redacted]"), "{stdout}");
    assert_eq!(stdout.matches("REFUSED failed").count(), 3, "{stdout}");
    assert!(!stdout.contains("ACCEPTED") && stdout.contains("GLOBALS model"), "{stdout}");
    assert!(!out.contains(REAL_KEY), "the real key reached the guest: {out}");
    // Only the one valid request reached the upstream, rebuilt, with the real key.
    let got = mock.received();
    assert_eq!(got.len(), 1, "{got:#?}");
    assert_eq!(got[0].header("authorization"), Some(format!("Bearer {REAL_KEY}").as_str()));
    assert_eq!(got[0].body["model"], "smol");
    // The report names each call: the manifest, then four calls to `model`.
    let calls = report["grants"]["calls"].as_array().unwrap();
    let seen: Vec<(&str, &str)> =
        calls.iter().map(|c| (c["grant"].as_str().unwrap(), c["outcome"].as_str().unwrap())).collect();
    assert_eq!(seen[1..], [("model", "ok"), ("model", "failed"), ("model", "failed"), ("model", "failed")], "{seen:?}");
    // The same call from the process tier's client, through the grants socket.
    if ready() {
        let call = r#"stockade-call model '{"messages":[{"role":"user","content":"hi"}]}'"#;
        let (code, out, err) = run_with_model(&mock, &["--", "sh", "-c", call]);
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["choices"][0]["message"]["content"], "42; you sent Bearer [redacted]", "{out}");
        assert_eq!(mock.received().len(), 2);
    }
}

#[test]
fn g4_busybox_wget_in_the_docker_tier_reaches_the_model_grant_at_openai_base_url() {
    if !tier_ready("docker", |v| v["docker_tier"].as_bool().unwrap()) {
        return;
    }
    let mock = stockade_test_support::MockLlm::start(|_, r| {
        stockade_test_support::Reply::text(&format!("42; you sent {}", r.header("authorization").unwrap_or("")))
    })
    .unwrap();
    // busybox wget, a TCP-only client, with nothing but the environment the broker set.
    let script = r#"echo "BASE $OPENAI_BASE_URL"
wget -q -O - --header "Authorization: Bearer $OPENAI_API_KEY" --header "Content-Type: application/json" \
  --post-data '{"messages":[{"role":"user","content":"6*7?"}]}' "$OPENAI_BASE_URL/chat/completions"; echo
wget -q -O - -T 2 "http://127.0.0.1:22/" >/dev/null 2>&1 && echo "PORT22 open" || echo "PORT22 closed"
ls /sys/class/net | tr '\n' ' '"#;
    let (pid, code, out, err) = run_model_as(&mock.url(), "smol", &["--tier", "docker", "--", "sh", "-c", script]);
    assert_eq!(code, 0, "{out} {err}");
    assert!(out.contains("BASE http://127.0.0.1:8765/v1"), "{out}");
    assert!(out.contains("42; you sent Bearer [redacted]"), "{out}");
    // Nothing else listens in the run's namespace, and it has no interface but lo.
    assert!(out.contains("PORT22 closed") && out.trim_end().ends_with("lo"), "{out}");
    assert!(!out.contains(REAL_KEY));
    let got = mock.received();
    assert_eq!(got.len(), 1, "{got:#?}");
    assert_eq!(got[0].header("authorization"), Some(format!("Bearer {REAL_KEY}").as_str()));
    // The holder container went with the run: none is left whose owner label (boot, pid
    // namespace, pid, start time) names this run's CLI (other runs' holders may be live).
    let ps = std::process::Command::new("docker")
        .args(["ps", "-a", "--filter", "name=-netns", "--format", "{{.Names}} {{.Label \"stockade.owner\"}}"])
        .output()
        .unwrap();
    let ps = String::from_utf8_lossy(&ps.stdout);
    let ours: Vec<&str> = ps.lines().filter(|l| l.contains(&format!("/{pid}/"))).collect();
    assert!(ours.is_empty(), "a holder container was left: {ours:?}");
}

/// bounded (issue 39), finding 4: the grants directory and its `bin/` and `data/` were made
/// with the process's umask and restricted afterwards, so under umask 000 another user
/// could plant a symlink in `data/` in that window. Judged by a watcher on the host that
/// stats every grants directory and file in a loop while runs start under umask 000: none
/// is ever more open than its final mode (the directory 0700, or 0750 as root; `bin/` and
/// `data/` 0750; a data file 0640).
#[test]
fn g4_the_grants_directory_is_never_more_open_than_its_final_mode() {
    use std::os::unix::fs::PermissionsExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    if !ready() {
        return;
    }
    let parent = std::env::temp_dir().join(format!("stockade-cli-grants-umask-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&parent);
    std::fs::create_dir_all(&parent).unwrap();
    std::fs::write(parent.join("rows.json"), "[1,2,3]").unwrap();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let watcher = {
        let (stop, parent) = (stop.clone(), parent.clone());
        std::thread::spawn(move || {
            let mut seen = 0u64;
            let mut worst: Vec<String> = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let Ok(entries) = std::fs::read_dir(&parent) else { continue };
                for e in entries.flatten() {
                    if !e.file_name().to_string_lossy().starts_with("stockade-g-") {
                        continue;
                    }
                    let top = e.path();
                    for (p, most) in [
                        (top.clone(), 0o750),
                        (top.join("data"), 0o750),
                        (top.join("bin"), 0o750),
                        (top.join("data/rows.json"), 0o640),
                        (top.join("bin/stockade-call"), 0o750),
                    ] {
                        if let Ok(m) = std::fs::symlink_metadata(&p) {
                            seen += 1;
                            let mode = m.permissions().mode() & 0o7777;
                            if mode & !most != 0 {
                                worst.push(format!("{} was {mode:o}", p.display()));
                            }
                        }
                    }
                }
            }
            (seen, worst)
        })
    };
    let bin = env!("CARGO_BIN_EXE_stockade");
    for _ in 0..20 {
        let script = format!(
            "umask 000; TMPDIR={} exec {bin} run --grant-data rows=@{} -- sh -c 'cat $STOCKADE_GRANTS/data/rows.json'",
            parent.display(),
            parent.join("rows.json").display()
        );
        let o =
            std::process::Command::new("sh").args(["-c", &script]).stdin(std::process::Stdio::null()).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&o.stdout), "[1,2,3]", "{}", String::from_utf8_lossy(&o.stderr));
    }
    stop.store(true, Ordering::Relaxed);
    let (seen, worst) = watcher.join().unwrap();
    assert!(seen > 0, "the watcher never saw a grants directory");
    assert!(worst.is_empty(), "more open than its final mode: {worst:?}");
    let _ = std::fs::remove_dir_all(&parent);
}
