//! The JavaScript guest (G9), and the issue's JavaScript cases for every budget.

use std::time::Duration;

use stockade_protocol::{Mechanism, Status, Stream};

use crate::support::{js, limits, run};

#[test]
fn g9_javascript_runs_and_prints() {
    let Some(job) = js("g9_javascript_runs_and_prints", "console.log(1 + 2); print([1, 2].map(x => x * 2).join(','))")
    else {
        return;
    };
    let report = run(&job);
    assert_eq!(report.status, Status::Exited { code: 0 }, "{report:?}");
    assert_eq!(report.stdout.bytes, b"3\n2,4\n");
}

#[test]
fn g9_runs_start_from_the_pre_initialized_snapshot() {
    let Some(job) = js("g9_runs_start_from_the_pre_initialized_snapshot", "0") else { return };
    let report = run(&job);
    assert_eq!(report.status, Status::Exited { code: 0 }, "{report:?}");
    // Without the snapshot, creating the runtime and context costs about 1.8M fuel.
    let detail = &report.enforcement.iter().find(|e| e.mechanism == Mechanism::WasmFuel).unwrap().detail;
    let used: u64 = detail.rsplit(", ").next().unwrap().trim_end_matches(" used").parse().unwrap();
    assert!(used < 1_000_000, "{detail}");
}

#[test]
fn g9_math_random_differs_between_runs() {
    let src = "console.log(Math.random())";
    let Some(job) = js("g9_math_random_differs_between_runs", src) else { return };
    let a = run(&job).stdout.bytes;
    let b = run(&job).stdout.bytes;
    assert!(!a.is_empty());
    assert_ne!(a, b, "Math.random repeated across runs");
}

#[test]
fn js_uncaught_exception_exits_1_with_the_error_on_stderr() {
    let Some(job) = js("js_uncaught_exception", "throw new Error('boom')") else { return };
    let report = run(&job);
    assert_eq!(report.status, Status::Exited { code: 1 });
    assert!(String::from_utf8_lossy(&report.stderr.bytes).contains("boom"), "{report:?}");
    let Some(job) = js("js_rejected_promise", "(async () => { throw new Error('later') })()") else { return };
    assert_eq!(run(&job).status, Status::Exited { code: 1 });
}

#[test]
fn js_infinite_loop_runs_out_of_fuel_and_on_its_own_out_of_time() {
    let Some(job) = js("js_infinite_loop", "for (;;) {}") else { return };
    let fuel = job.clone().with_limits(limits().with_cpu(Duration::from_millis(50)).unwrap());
    assert_eq!(run(&fuel).status, Status::CpuLimit);
    let wall = job.with_limits(limits().with_wall(Duration::from_millis(300)).unwrap());
    let report = run(&wall);
    assert_eq!(report.status, Status::TimedOut);
    assert!(report.wall < Duration::from_millis(600), "{:?}", report.wall);
}

#[test]
fn js_memory_bomb_is_out_of_memory() {
    let src = "let a = []; for (;;) a.push(new Array(1e6).fill(1));";
    let Some(job) = js("js_memory_bomb", src) else { return };
    let report = run(&job.with_limits(limits().with_memory(64 << 20).unwrap()));
    assert_eq!(report.status, Status::OutOfMemory, "{report:?}");
    assert!(report.peak_memory_bytes.unwrap() <= 64 << 20);
}

#[test]
fn js_output_flood_stops_at_the_budget() {
    let Some(job) = js("js_output_flood", "for (;;) console.log('y'.repeat(100))") else { return };
    let report = run(&job.with_limits(limits().with_stdout(10_000).unwrap()));
    assert_eq!(report.status, Status::OutputLimit { stream: Stream::Stdout });
    assert_eq!(report.stdout.bytes.len(), 10_000);
}

#[test]
fn js_sleep_past_the_deadline_is_cut() {
    let Some(job) = js("js_sleep", "sleep(5000); console.log('woke')") else { return };
    let started = std::time::Instant::now();
    let report = run(&job.with_limits(limits().with_wall(Duration::from_millis(300)).unwrap()));
    assert_eq!(report.status, Status::TimedOut);
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    assert!(report.stdout.bytes.is_empty());
}

#[test]
fn js_files_environment_processes_and_network_are_absent() {
    let src = r#"
      const names = ['std', 'os', 'require', 'process', 'fetch', 'XMLHttpRequest', 'WebSocket', 'Deno', 'Bun'];
      console.log(names.filter(n => typeof globalThis[n] !== 'undefined').join(',') || 'none');
      import('os').then(() => console.log('os imported'), e => console.log('import failed'));
      import('std').then(() => console.log('std imported'), e => console.log('import failed'));
    "#;
    let Some(job) = js("js_no_authority", src) else { return };
    let job = job.with_env("SECRET", "not-for-js").unwrap();
    let report = run(&job);
    assert_eq!(report.status, Status::Exited { code: 0 }, "{report:?}");
    assert_eq!(String::from_utf8_lossy(&report.stdout.bytes), "none\nimport failed\nimport failed\n");
}

#[test]
fn g10_deterministic_mode_replays_clocks_and_randomness() {
    let src = "console.log(Math.random(), Date.now(), performance.now() < 1000)";
    let Some(job) = js("g10_deterministic_mode", src) else { return };
    let tier = |seed| {
        let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("stockade-wasm-cache");
        stockade_wasm::WasmTier::builder().cache_dir(dir).deterministic(seed).build().unwrap()
    };
    let run_with = |t: &stockade_wasm::WasmTier| crate::support::block_on(t.run(&job)).unwrap().stdout.bytes;
    let (a, b) = (tier(7), tier(8));
    let first = run_with(&a);
    assert_eq!(first, run_with(&a), "the same seed replays");
    assert_ne!(first, run_with(&b), "another seed differs");
    // The wall clock starts at the Unix epoch: Date.now() is tiny.
    let text = String::from_utf8_lossy(&first);
    let now: f64 = text.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(now < 1000.0, "{text}");
}
