//! Change the personality: disable ASLR, READ_IMPLIES_EXEC.
//! Catalogue row: 34 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    report("personality_set", syscall(libc::SYS_personality, [0x0040000 | 0x0400000, 0, 0, 0, 0, 0]));
}
