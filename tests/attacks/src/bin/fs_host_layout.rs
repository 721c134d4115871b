//! Learn the mount layout and kernel details of the host.
//! Catalogue row: 12 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    for (what, path) in [("mountinfo", "/proc/self/mountinfo"), ("kallsyms", "/proc/kallsyms")] {
        match std::fs::read(path) {
            Ok(bytes) => {
                println!("ATTEMPT {what} ok");
                println!("DATA {}", String::from_utf8_lossy(&bytes[..bytes.len().min(4096)]));
            }
            Err(e) => println!("ATTEMPT {what} {}", errno_name(&e)),
        }
    }
    report("syslog", syscall(libc::SYS_syslog, [3, 0, 0, 0, 0, 0]));
}
