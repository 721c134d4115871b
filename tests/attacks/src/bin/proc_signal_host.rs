//! Kill a host process the harness owns, and everything else it can reach.
//! Catalogue row: 26 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    let pid: u64 = arg("pid").parse().unwrap_or(0);
    report("kill_host_pid", syscall(libc::SYS_kill, [pid, libc::SIGKILL as u64, 0, 0, 0, 0]));
    report("kill_all", syscall(libc::SYS_kill, [u64::MAX, libc::SIGKILL as u64, 0, 0, 0, 0]));
}
