//! The `stockade` binary. All logic is in the library; `main` first gives the process tier's
//! helper a chance to run (the binary re-executes itself as the sandbox helper), then starts
//! the process tier's fork server while the process is still single-threaded and has read
//! nothing, so that every run's helper, from any subcommand and any thread, is forked from
//! that small, clean process rather than executed.

fn main() -> std::process::ExitCode {
    stockade_cli::process::helper_main();
    // A launch optimisation, not a mechanism: if it cannot start, runs fork this process
    // while it is single-threaded, or execute it as the helper.
    if !stockade_cli::is_confined_loop() {
        let _ = stockade_cli::process::ForkServer::start();
    }
    stockade_cli::main()
}
