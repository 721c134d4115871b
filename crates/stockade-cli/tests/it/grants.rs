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
