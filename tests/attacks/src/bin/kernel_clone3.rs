//! Hide namespace flags from seccomp inside the clone3 argument struct.
//! Catalogue row: 36 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    let mut args = [0u64; 11];
    args[0] = libc::CLONE_NEWUSER as u64;
    let r = syscall(libc::SYS_clone3, [args.as_mut_ptr() as u64, 88, 0, 0, 0, 0]);
    if matches!(r, Ok(0)) {
        std::process::exit(0);
    }
    report("clone3_newuser", r);
}
