//! Set up io_uring, whose operations bypass seccomp.
//! Catalogue row: 22 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    let mut params = [0u8; 120];
    report("io_uring_setup", syscall(libc::SYS_io_uring_setup, [8, params.as_mut_ptr() as u64, 0, 0, 0, 0]));
}
