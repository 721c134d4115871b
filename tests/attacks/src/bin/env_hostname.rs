//! Change the hostname.
//! Catalogue row: 50 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    report("sethostname", syscall(libc::SYS_sethostname, [b"pwned".as_ptr() as u64, 5, 0, 0, 0, 0]));
}
