//! Truncate or overwrite a read-only file: the attack program itself, in the read-only workspace.
//! Catalogue row: 11 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    let me = format!("/workspace/{}", "fs_truncate_readonly");
    report("open_trunc", std::fs::OpenOptions::new().write(true).truncate(true).open(&me).map(drop));
    let path = std::ffi::CString::new(me).unwrap_or_default();
    report("truncate", syscall(libc::SYS_truncate, [path.as_ptr() as u64, 0, 0, 0, 0, 0]));
}
