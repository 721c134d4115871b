//! Open a userfaultfd, which widens kernel exploit races.
//! Catalogue row: 33 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    report("userfaultfd", syscall(libc::SYS_userfaultfd, [1, 0, 0, 0, 0, 0]));
}
