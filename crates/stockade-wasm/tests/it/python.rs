//! The opt-in Python guest (feature `python`, installed by `cargo xtask guests --python`,
//! which runs these tests). The first run compiles CPython: minutes, about 3 GB of memory.

use std::time::Duration;

use stockade_protocol::{Job, Status};

use crate::support::{guest_job, limits, run};

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
