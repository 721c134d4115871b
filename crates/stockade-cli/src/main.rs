//! The `stockade` binary. All logic is in the library; `main` first gives the process tier's
//! helper a chance to run (the binary re-executes itself as the sandbox helper), then starts
//! the process tier's fork server while the process is still single-threaded and has read
//! nothing, so that every run's helper, from any subcommand and any thread, is forked from
//! that small, clean process rather than executed. The server is ended and reaped before
//! `main` returns, and on a panic's unwinding too, and a killed run's pid 1 is reaped here
//! (this process is a child subreaper): no process `stockade` started outlives it (G14).

/// Ends and reaps the fork server when dropped.
struct ForkServer;

impl Drop for ForkServer {
    fn drop(&mut self) {
        stockade_cli::process::ForkServer::stop();
    }
}

fn main() -> std::process::ExitCode {
    stockade_cli::process::helper_main();
    // A killed run's pid 1 is reaped by the run's end, here, not left for the machine's
    // PID 1. Best effort: without it such a pid 1 is the machine's PID 1's to reap.
    let _ = stockade_cli::process::adopt_orphaned_runs();
    // A launch optimisation, not a mechanism: if it cannot start, runs fork this process
    // while it is single-threaded, or execute it as the helper.
    let _server = (!stockade_cli::is_confined_loop())
        .then(stockade_cli::process::ForkServer::start)
        .and_then(Result::ok)
        .map(|_| ForkServer);
    stockade_cli::main()
}
