//! Attach to a host process with ptrace.
//! Catalogue row: 24 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    let pid: u64 = arg("pid").parse().unwrap_or(0);
    report("ptrace_attach", syscall(libc::SYS_ptrace, [libc::PTRACE_ATTACH as u64, pid, 0, 0, 0, 0]));
    report("ptrace_seize", syscall(libc::SYS_ptrace, [0x4206, pid, 0, 0, 0, 0]));
}
