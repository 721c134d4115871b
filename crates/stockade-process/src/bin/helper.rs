//! The process tier's helper binary: builds the sandbox and execs the guest.
//! It does nothing when started by hand (without the spec the supervisor passes).

fn main() {
    stockade_process::helper_main();
    eprintln!("stockade-process-helper: started without a spec; it is launched by stockade, not by hand");
    std::process::exit(2);
}
