//! Create cgroups through cgroupfs.
//! Catalogue row: 14 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    report("mkdir_cgroup_pids", std::fs::create_dir(format!("/sys/fs/cgroup/pids/{}", arg("marker"))));
    report("mkdir_cgroup_memory", std::fs::create_dir(format!("/sys/fs/cgroup/memory/{}", arg("marker"))));
}
