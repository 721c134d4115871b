//! Shocker: open a host file by handle.
//! Catalogue row: 35 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    let mut handle = [0u8; 136];
    handle[0..4].copy_from_slice(&8u32.to_ne_bytes());
    handle[4..8].copy_from_slice(&1i32.to_ne_bytes());
    report(
        "open_by_handle_at",
        syscall(libc::SYS_open_by_handle_at, [libc::AT_FDCWD as u64, handle.as_mut_ptr() as u64, 0, 0, 0, 0]),
    );
}
