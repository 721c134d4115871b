//! `oneshot`: one command confined by the process tier, from a program that links this crate
//! and nothing of stockade's other tiers, stacks or CLI. It is what a one-shot
//! `stockade run -- PROGRAM` does, less the CLI's own work (its 48 MB binary's start, its
//! flags, grants and verification), so `cargo xtask bench process` times it beside
//! `stockade run` and bwrap: the difference is what a small front binary for the CLI could
//! save (issue 58), measured rather than estimated.
//!
//! ```text
//! oneshot [--no-cgroup] PROGRAM [ARG...]
//! ```
//!
//! It starts the fork server first thing, as the CLI's `main` does, hands it over to its one
//! run (`ForkServer::hand_over_next`, as `stockade run` does), runs the program with
//! the tier's defaults (every namespace, the view, landlock, seccomp, a cgroup unless
//! `--no-cgroup`), prints the program's stdout and stderr once it has ended, and exits with
//! its code (125 for a run stockade refused or could not start, 128 + N for a signal).

use std::io::Write as _;
use std::process::ExitCode;

use stockade_process::{ForkServer, Helper, ProcessTier};
use stockade_protocol::{Job, Status};

fn main() -> ExitCode {
    stockade_process::helper_main();
    // A launch optimisation, as in the CLI: without it, the run executes this binary as its
    // helper (`prefer_fork`'s fallback).
    let _ = ForkServer::start();
    let code = match run() {
        Ok(code) => code,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "oneshot: {e}");
            ExitCode::from(125)
        }
    };
    // Does nothing if the server did not start, or became the run's helper.
    ForkServer::stop();
    code
}

fn run() -> Result<ExitCode, String> {
    let mut args = std::env::args().skip(1).peekable();
    let cgroup = args.next_if_eq("--no-cgroup").is_none();
    let program = args.next().ok_or("usage: oneshot [--no-cgroup] PROGRAM [ARG...]")?;
    let job = Job::command(program, args.collect::<Vec<_>>()).map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| format!("locating this binary: {e}"))?;
    // One run: the fork server becomes its helper (as `stockade run` does).
    ForkServer::hand_over_next();
    let mut tier = ProcessTier::new(Helper::at(exe).prefer_fork());
    if !cgroup {
        tier = tier.without_cgroups();
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    let report = runtime.block_on(tier.run(&job)).map_err(|e| e.to_string())?;
    let _ = std::io::stdout().write_all(&report.stdout.bytes);
    let _ = std::io::stderr().write_all(&report.stderr.bytes);
    Ok(match report.status {
        Status::Exited { code } => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Status::Signaled { signal } => ExitCode::from(u8::try_from(128 + signal).unwrap_or(1)),
        other => {
            let _ = writeln!(std::io::stderr(), "oneshot: {other:?}");
            ExitCode::from(125)
        }
    })
}
