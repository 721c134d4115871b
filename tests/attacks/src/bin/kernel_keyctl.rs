//! Store data in a kernel keyring that outlives the run.
//! Catalogue row: 32 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    let (ty, desc) = (c"user".as_ptr() as u64, c"stockade".as_ptr() as u64);
    let data = b"x".as_ptr() as u64;
    report("add_key", syscall(libc::SYS_add_key, [ty, desc, data, 1, (-2i64) as u64, 0]));
    report("keyctl", syscall(libc::SYS_keyctl, [0, (-2i64) as u64, 0, 0, 0, 0]));
}
