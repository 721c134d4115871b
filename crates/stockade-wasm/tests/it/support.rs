//! Shared fixtures: one tier for the whole test binary, WAT modules on disk, and the
//! skip-or-fail rule for the JavaScript guest.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use stockade_protocol::{Job, Limits, Report};
use stockade_wasm::WasmTier;

/// The test binary's tier, with a cache directory inside the target directory so that the
/// JavaScript guest is compiled once per target directory, not once per test.
pub(crate) fn tier() -> &'static WasmTier {
    static TIER: OnceLock<WasmTier> = OnceLock::new();
    TIER.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("stockade-wasm-cache");
        WasmTier::builder().cache_dir(dir).build().unwrap()
    })
}

pub(crate) fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
}

pub(crate) fn run(job: &Job) -> Report {
    block_on(tier().run(job)).unwrap()
}

/// Writes the module for `wat` under the target directory and returns its path.
pub(crate) fn module(wat: &str) -> PathBuf {
    let bytes = wat::parse_str(wat).unwrap();
    let name = format!("{:016x}.wasm", fxhash(&bytes));
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("wat");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    if !path.exists() {
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, &bytes).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }
    path
}

fn fxhash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3))
}

/// A job that calls `entry` of the module for `wat`.
pub(crate) fn wat_job(wat: &str, entry: &str) -> Job {
    Job::wasm(module(wat), entry, Vec::<String>::new()).unwrap()
}

pub(crate) fn limits() -> Limits {
    Limits::new()
}

pub(crate) fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// The JavaScript job for `src`, or None (printing SKIPPED) when the guest has not been
/// built; under `STOCKADE_REQUIRE_ALL` (CI) a missing guest fails the test.
pub(crate) fn js(test: &str, src: &str) -> Option<Job> {
    guest_job(test, stockade_wasm::javascript_job(src))
}

/// The job, or None (printing SKIPPED) when its guest is not installed; under
/// `STOCKADE_REQUIRE_ALL` a missing guest fails the test.
pub(crate) fn guest_job(test: &str, job: Result<Job, stockade_wasm::RunError>) -> Option<Job> {
    match job {
        Ok(job) => Some(job),
        Err(e) if std::env::var_os("STOCKADE_REQUIRE_ALL").is_some() => panic!("{test}: {e}"),
        Err(e) => {
            eprintln!("SKIPPED {test}: {e}");
            None
        }
    }
}

/// WASI preview 1 imports and a `print` helper writing memory[ptr..ptr+len] to fd 1, for WAT
/// modules. Memory layout: 0..16 scratch (iovec at 0, nwritten at 8), data from 1024.
pub(crate) const WASI_PRELUDE: &str = r#"
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))
  (import "wasi_snapshot_preview1" "poll_oneoff" (func $poll_oneoff (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_open" (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_read" (func $fd_read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "environ_sizes_get" (func $environ_sizes_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "args_sizes_get" (func $args_sizes_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_prestat_get" (func $fd_prestat_get (param i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func $write (param $fd i32) (param $ptr i32) (param $len i32) (result i32)
    (i32.store (i32.const 0) (local.get $ptr))
    (i32.store (i32.const 4) (local.get $len))
    (call $fd_write (local.get $fd) (i32.const 0) (i32.const 1) (i32.const 8)))
  ;; prints a number (0..=99999) and a newline
  (func $num (param $n i32)
    (local $i i32)
    (local.set $i (i32.const 200))
    (i32.store8 (local.get $i) (i32.const 10))
    (loop $l
      (local.set $i (i32.sub (local.get $i) (i32.const 1)))
      (i32.store8 (local.get $i) (i32.add (i32.const 48) (i32.rem_u (local.get $n) (i32.const 10))))
      (local.set $n (i32.div_u (local.get $n) (i32.const 10)))
      (br_if $l (local.get $n)))
    (drop (call $write (i32.const 1) (local.get $i) (i32.sub (i32.const 201) (local.get $i)))))
"#;

/// A module with the prelude and `body` as its contents.
pub(crate) fn wasi_module(body: &str) -> String {
    format!("(module {WASI_PRELUDE} {body})")
}
