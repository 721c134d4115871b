//! Open a perf event on itself.
//! Catalogue row: 31 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    let mut attr = [0u8; 128];
    attr[4..8].copy_from_slice(&128u32.to_ne_bytes());
    report(
        "perf_event_open",
        syscall(libc::SYS_perf_event_open, [attr.as_mut_ptr() as u64, 0, u64::MAX, u64::MAX, 0, 0]),
    );
}
