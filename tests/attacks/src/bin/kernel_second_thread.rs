//! Try the filtered syscalls from a second thread, in case filtering was per thread or late.
//! Catalogue row: 37 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    let t = std::thread::spawn(|| {
        let mut params = [0u8; 120];
        report("thread_io_uring_setup", syscall(libc::SYS_io_uring_setup, [8, params.as_mut_ptr() as u64, 0, 0, 0, 0]));
        report("thread_unshare_user", syscall(libc::SYS_unshare, [libc::CLONE_NEWUSER as u64, 0, 0, 0, 0, 0]));
        report("thread_ptrace_traceme", syscall(libc::SYS_ptrace, [libc::PTRACE_TRACEME as u64, 0, 0, 0, 0, 0]));
    });
    let _ = t.join();
}
