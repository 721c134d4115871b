//! Read root-only files: the real and a fake /etc/shadow.
//! Catalogue row: 2 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    read_and_show("etc_shadow", "/etc/shadow");
    read_and_show("fake_shadow", &arg("shadow"));
}
