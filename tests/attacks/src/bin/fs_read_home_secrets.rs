//! Read user secrets from the home directory.
//! Catalogue row: 1 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    let home = arg("home");
    for f in [".ssh/id_rsa", ".aws/credentials", ".config/gh/hosts.yml"] {
        read_and_show(f, &format!("{home}/{f}"));
    }
}
