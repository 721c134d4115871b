//! Make a setuid copy of a binary and check whether exec would honour it.
//! Catalogue row: 10 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    use std::os::unix::fs::PermissionsExt;
    report("copy", std::fs::copy("/usr/bin/id", "/tmp/id").map(drop));
    report("chmod_suid", std::fs::set_permissions("/tmp/id", std::fs::Permissions::from_mode(0o4755)));
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let nnp = status.lines().any(|l| l.starts_with("NoNewPrivs:") && l.ends_with('1'));
    println!("ATTEMPT suid_effective {}", if nnp { "EPERM" } else { "ok" });
}
