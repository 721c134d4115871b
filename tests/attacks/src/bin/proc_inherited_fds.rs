//! Use descriptors the supervisor might have leaked.
//! Catalogue row: 23 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    let mut open = Vec::new();
    for fd in 3..1024u64 {
        let mut st = [0u8; 256];
        if syscall(libc::SYS_fstat, [fd, st.as_mut_ptr() as u64, 0, 0, 0, 0]).is_ok() {
            open.push(fd);
        }
    }
    println!("ATTEMPT inherited_fds {}", if open.is_empty() { "EBADF" } else { "ok" });
    for fd in open {
        read_and_show(&format!("fd{fd}"), &format!("/proc/self/fd/{fd}"));
    }
}
