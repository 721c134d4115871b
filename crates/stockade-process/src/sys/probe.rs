//! Host capability probes for `stockade doctor`.

use std::fs;

use crate::Probe;

fn landlock_abi() -> i32 {
    // SAFETY: with a NULL attr, size 0 and the VERSION flag, landlock_create_ruleset reads no
    // memory and returns the ABI version or -1.
    let v = unsafe { libc::syscall(libc::SYS_landlock_create_ruleset, std::ptr::null::<libc::c_void>(), 0usize, 1u32) };
    i32::try_from(v).unwrap_or(0).max(0)
}

fn seccomp() -> bool {
    // SAFETY: PR_GET_SECCOMP takes no pointers; it fails with EINVAL only without seccomp.
    unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) >= 0 }
}

fn read_num(path: &str) -> Option<i64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn user_namespaces() -> Result<(), String> {
    if read_num("/proc/sys/user/max_user_namespaces") == Some(0) {
        return Err("user.max_user_namespaces is 0".into());
    }
    if read_num("/proc/sys/kernel/unprivileged_userns_clone") == Some(0) {
        return Err("kernel.unprivileged_userns_clone is 0".into());
    }
    if read_num("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == Some(1) {
        return Err(
            "AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns=1)".into()
        );
    }
    Ok(())
}

pub(crate) fn probe() -> Probe {
    let cgroups = match crate::cgroup::Cgroup::create(None, 64 << 20, 64) {
        Some(cg) => {
            let d = cg.detail(64 << 20, 64);
            cg.remove();
            Ok(d)
        }
        None => Err("no memory and pids controllers this process may create cgroups in; falling back to RLIMIT_AS and RLIMIT_NPROC".into()),
    };
    Probe { landlock_abi: landlock_abi(), seccomp: seccomp(), user_namespaces: user_namespaces(), cgroups }
}
