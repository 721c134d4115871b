//! Create an eBPF map.
//! Catalogue row: 30 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    let mut attr = [0u32; 30];
    attr[..4].copy_from_slice(&[2, 4, 4, 1]);
    report("bpf_map_create", syscall(libc::SYS_bpf, [0, attr.as_mut_ptr() as u64, 120, 0, 0, 0]));
}
