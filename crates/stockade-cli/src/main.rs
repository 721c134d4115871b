//! The `stockade` binary. All logic is in the library; `main` first gives the process tier's
//! helper a chance to run (the binary re-executes itself as the sandbox helper).

fn main() -> std::process::ExitCode {
    stockade_cli::process::helper_main();
    stockade_cli::main()
}
