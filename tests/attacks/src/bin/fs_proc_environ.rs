//! Read the environment of the supervisor and of host processes through procfs.
//! Catalogue row: 3 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    read_and_show("proc_1_environ", "/proc/1/environ");
    let ppid = std::os::unix::process::parent_id();
    read_and_show("proc_ppid_environ", &format!("/proc/{ppid}/environ"));
    read_and_show("host_pid_environ", &format!("/proc/{}/environ", arg("pid")));
    read_and_show("host_pid_cmdline", &format!("/proc/{}/cmdline", arg("pid")));
}
