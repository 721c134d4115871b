//! Read the memory of a host process: process_vm_readv and /proc/PID/mem.
//! Catalogue row: 25 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    let pid: u64 = arg("pid").parse().unwrap_or(0);
    let mut buf = [0u8; 64];
    let local = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    let remote = libc::iovec { iov_base: 0x40_0000 as *mut libc::c_void, iov_len: 64 };
    let (l, r) = (&raw const local as u64, &raw const remote as u64);
    report("process_vm_readv", syscall(libc::SYS_process_vm_readv, [pid, l, 1, r, 1, 0]));
    read_and_show("proc_pid_mem", &format!("/proc/{pid}/mem"));
}
