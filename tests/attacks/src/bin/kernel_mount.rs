//! Use the mount family.
//! Catalogue row: 29 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    let (t, d, root) = (c"tmpfs", c"/tmp", c"/");
    let (t, d, root) = (t.as_ptr() as u64, d.as_ptr() as u64, root.as_ptr() as u64);
    report("mount", syscall(libc::SYS_mount, [t, d, t, 0, 0, 0]));
    report("umount_root", syscall(libc::SYS_umount2, [root, libc::MNT_DETACH as u64, 0, 0, 0, 0]));
    report("chroot", syscall(libc::SYS_chroot, [d, 0, 0, 0, 0, 0]));
    report("pivot_root", syscall(libc::SYS_pivot_root, [d, d, 0, 0, 0, 0]));
    report("fsopen", syscall(libc::SYS_fsopen, [t, 0, 0, 0, 0, 0]));
    report("open_tree", syscall(libc::SYS_open_tree, [libc::AT_FDCWD as u64, d, 1, 0, 0, 0]));
}
