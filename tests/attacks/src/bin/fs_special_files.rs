//! Create device nodes and fifos.
//! Catalogue row: 9 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    let path = c"/tmp/mem";
    let mode = (libc::S_IFCHR | 0o666) as u64;
    report("mknod_char", syscall(libc::SYS_mknodat, [libc::AT_FDCWD as u64, path.as_ptr() as u64, mode, 0x0101, 0, 0]));
    let fifo = c"/tmp/fifo";
    let mode = (libc::S_IFIFO | 0o666) as u64;
    report("mkfifo_inside", syscall(libc::SYS_mknodat, [libc::AT_FDCWD as u64, fifo.as_ptr() as u64, mode, 0, 0, 0]));
}
