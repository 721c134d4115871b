//! `stockade-process-embedder`: the process tier embedded the way a long-lived
//! multi-threaded program embeds it, and the reference for such a program's `main`.
//!
//! It starts the fork server first thing (before any thread, and before it reads its
//! arguments, its environment or its input), then a multi-threaded tokio runtime, then runs
//! each job it reads on stdin concurrently:
//!
//! ```text
//! → {"job": JOB, "helper": "fork" | "prefer" | "exec" | "pool", "hand_over": BOOL}   one JSON line per job (JOB: protocol's Job)
//! ← {"fork_server": PID, "threads": N}                first line: the server, and this process's threads
//! ← {"line": I, "report": REPORT} | {"line": I, "error": "..."}   one per job, in completion order
//! ```
//!
//! `"fork"` (the default) launches with `Helper::fork()` (through the fork server: there is
//! no fallback, so a launch that did not use it fails), `"prefer"` with
//! `Helper::at(this binary).prefer_fork()` (the server, else an exec of this binary), and
//! `"exec"` with `Helper::at(this binary)`, and `"pool"` with `Helper::fork()` and
//! `ProcessTier::pool(N)` (`N` from `STOCKADE_EMBEDDER_POOL`, default 4); `"hand_over":
//! true` calls `ForkServer::hand_over_next()` before the job's launch. The crate's
//! tests drive it to check the fork server from a real multi-threaded embedder.

use std::io::Write as _;
use std::sync::Arc;

use stockade_process::{ForkServer, Helper, ProcessTier};
use stockade_protocol::Job;
use tokio::io::AsyncBufReadExt as _;

fn main() -> std::process::ExitCode {
    stockade_process::helper_main();
    let server = ForkServer::start();
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("stockade-process-embedder: tokio runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let pid = match server {
        Ok(pid) => pid,
        Err(e) => {
            eprintln!("stockade-process-embedder: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    runtime.block_on(serve(pid))
}

async fn serve(server: u32) -> std::process::ExitCode {
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("stockade-process-embedder: locating this binary: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let tiers = Arc::new([
        ProcessTier::new(Helper::fork()),
        ProcessTier::new(Helper::at(&exe).prefer_fork()),
        ProcessTier::new(Helper::at(exe)),
        ProcessTier::new(Helper::fork()).pool(pool_size()),
    ]);
    let threads = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Threads:")).and_then(|n| n.trim().parse::<u64>().ok()))
        .unwrap_or(0);
    let out = Arc::new(std::sync::Mutex::new(std::io::stdout()));
    emit(&out, &serde_json::json!({ "fork_server": server, "threads": threads }));
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let mut tasks = tokio::task::JoinSet::new();
    let mut n = 0u64;
    while let Ok(Some(line)) = lines.next_line().await {
        n += 1;
        let (tiers, out) = (tiers.clone(), out.clone());
        tasks.spawn(async move {
            let answer = match parse(&line) {
                Ok((job, helper, hand_over)) => match run(&tiers[helper], &job, hand_over).await {
                    Ok(report) => serde_json::json!({ "line": n, "report": report }),
                    Err(e) => serde_json::json!({ "line": n, "error": e.to_string() }),
                },
                Err(e) => serde_json::json!({ "line": n, "error": e }),
            };
            emit(&out, &answer);
        });
    }
    while tasks.join_next().await.is_some() {}
    std::process::ExitCode::SUCCESS
}

/// Runs `job`, after handing the fork server over to it if asked.
async fn run(
    tier: &ProcessTier,
    job: &Job,
    hand_over: bool,
) -> Result<stockade_protocol::Report, stockade_process::RunError> {
    if hand_over {
        ForkServer::hand_over_next();
    }
    tier.run(job).await
}

/// The pool's size: `STOCKADE_EMBEDDER_POOL`, else 4.
fn pool_size() -> usize {
    std::env::var("STOCKADE_EMBEDDER_POOL").ok().and_then(|v| v.parse().ok()).unwrap_or(4)
}

/// The job, which of the four tiers runs it, and whether the fork server is handed over.
fn parse(line: &str) -> Result<(Job, usize, bool), String> {
    let v: serde_json::Value = serde_json::from_str(line).map_err(|e| format!("bad request: {e}"))?;
    let helper = match v.get("helper").and_then(serde_json::Value::as_str) {
        None | Some("fork") => 0,
        Some("prefer") => 1,
        Some("exec") => 2,
        Some("pool") => 3,
        Some(other) => {
            return Err(format!("bad request: helper {other:?} is not \"fork\", \"prefer\", \"exec\" or \"pool\""));
        }
    };
    let hand_over = match v.get("hand_over") {
        None => false,
        Some(b) => b.as_bool().ok_or_else(|| format!("bad request: hand_over {b} is not a boolean"))?,
    };
    let job = serde_json::from_value(v.get("job").cloned().unwrap_or_default()).map_err(|e| format!("bad job: {e}"))?;
    Ok((job, helper, hand_over))
}

fn emit(out: &std::sync::Mutex<std::io::Stdout>, v: &serde_json::Value) {
    let mut out = out.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}
