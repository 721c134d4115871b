//! Create a nested user namespace, then mount in it.
//! Catalogue row: 28 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    let flags = (libc::CLONE_NEWUSER | libc::CLONE_NEWNS) as u64;
    report("unshare_user_mount", syscall(libc::SYS_unshare, [flags, 0, 0, 0, 0, 0]));
    let r = syscall(libc::SYS_clone, [(libc::CLONE_NEWUSER | libc::SIGCHLD) as u64, 0, 0, 0, 0, 0]);
    if matches!(r, Ok(0)) {
        std::process::exit(0);
    }
    report("clone_newuser", r);
}
