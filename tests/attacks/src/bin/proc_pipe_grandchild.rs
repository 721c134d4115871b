//! Keep the output pipe open from a grandchild after the guest exits.
//! Catalogue row: 45 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    match fork() {
        Ok(0) => {
            let _ = std::process::Command::new("/usr/bin/sleep").arg(arg("marker")).status();
            std::process::exit(0);
        }
        r => report("fork_holder", r),
    }
}
