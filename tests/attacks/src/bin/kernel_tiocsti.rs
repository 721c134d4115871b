//! Inject keystrokes into a terminal with TIOCSTI and TIOCLINUX.
//! Catalogue row: 27 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    let c = b'x';
    let p = &raw const c as u64;
    for fd in 0..3u64 {
        report(&format!("tiocsti_fd{fd}"), syscall(libc::SYS_ioctl, [fd, 0x5412, p, 0, 0, 0]));
    }
    report("tioclinux", syscall(libc::SYS_ioctl, [0, 0x541C, p, 0, 0, 0]));
}
