//! Shared fixtures: the tier, a runtime, and the skip-or-fail rule for missing kernel features.

use std::time::Duration;

use stockade_process::{Helper, ProcessTier, probe};
use stockade_protocol::{Job, Report};

pub(crate) fn tier() -> ProcessTier {
    ProcessTier::new(Helper::at(env!("CARGO_BIN_EXE_stockade-process-helper")))
}

/// True if the host can run the tier. Otherwise prints SKIPPED with the reason, or fails the
/// test when `STOCKADE_REQUIRE_ALL` is set (CI sets it, so nothing is skipped there).
pub(crate) fn available(test: &str) -> bool {
    let p = probe();
    let missing = match (&p.user_namespaces, p.landlock_abi, p.seccomp) {
        (Err(e), _, _) => Some(format!("user namespaces: {e}")),
        (_, abi, _) if abi < 6 => Some(format!("landlock abi {abi} < 6")),
        (_, _, false) => Some("seccomp".to_owned()),
        _ => None,
    };
    match missing {
        None => true,
        Some(why) if std::env::var_os("STOCKADE_REQUIRE_ALL").is_some() => {
            panic!("{test}: required mechanism missing: {why}")
        }
        Some(why) => {
            eprintln!("SKIPPED {test}: {why}");
            false
        }
    }
}

pub(crate) fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap().block_on(f)
}

/// Runs share this lock; a test that counts process-wide resources (fds, cgroups) takes it
/// exclusively so that no other test's runs are in flight meanwhile.
static RUNS: std::sync::RwLock<()> = std::sync::RwLock::new(());

pub(crate) fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    RUNS.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub(crate) fn exclusive() -> std::sync::RwLockWriteGuard<'static, ()> {
    RUNS.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub(crate) fn run(job: Job) -> Report {
    block_on(tier().run(&job)).unwrap()
}

/// A host directory the guest may be given, owned by whoever runs the tests (as a user's
/// project directory is): the tier makes it the guest's own.
pub(crate) fn host_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("stockade-it-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub(crate) fn sh(script: &str) -> Job {
    Job::command("/bin/sh", ["-c", script]).unwrap().with_env("PATH", "/usr/bin:/bin").unwrap()
}

pub(crate) fn py(code: &str) -> Job {
    Job::command("/usr/bin/python3", ["-c", code]).unwrap()
}

pub(crate) fn with_wall(job: Job, wall: Duration) -> Job {
    let limits = *job.limits();
    job.with_limits(limits.with_wall(wall).unwrap())
}

pub(crate) fn stdout(r: &Report) -> String {
    String::from_utf8_lossy(&r.stdout.bytes).into_owned()
}

pub(crate) fn stderr(r: &Report) -> String {
    String::from_utf8_lossy(&r.stderr.bytes).into_owned()
}

/// Skips (or, in CI, fails) without the kernel features, then holds the shared run lock for
/// the rest of the test.
macro_rules! require {
    ($name:expr) => {
        if !available($name) {
            return;
        }
        let _runs = shared();
    };
}

/// Host pids whose command line contains `marker`, found by scanning `/proc` (the host's
/// view, not the guest's word).
pub(crate) fn host_pids_with(marker: &str) -> Vec<u32> {
    stockade_test_support::host_pids(|cmd| String::from_utf8_lossy(cmd).contains(marker))
}
