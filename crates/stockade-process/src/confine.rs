//! The landlock ruleset and the seccomp filter, built as data so they can be reviewed and
//! snapshot-tested, then applied by the helper just before exec.

use std::collections::BTreeMap;

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope,
};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule, TargetArch,
};

/// Access a path in the view gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PathAccess {
    /// Read files and directories, and execute.
    ReadExec,
    /// Read only.
    Read,
    /// List directories only (for `/`: the view holds nothing of the host to reveal).
    ListDirs,
    /// Read and write files (devices such as `/dev/null`).
    ReadWriteFile,
    /// Everything: create, remove, write, execute.
    Full,
}

/// The landlock rules for the view: (path inside the new root, access).
pub(crate) fn landlock_rules(workspace: Option<bool>) -> Vec<(&'static str, PathAccess)> {
    let mut rules = vec![
        ("/", PathAccess::ListDirs),
        ("/usr", PathAccess::ReadExec),
        ("/bin", PathAccess::ReadExec),
        ("/sbin", PathAccess::ReadExec),
        ("/lib", PathAccess::ReadExec),
        ("/lib32", PathAccess::ReadExec),
        ("/lib64", PathAccess::ReadExec),
        ("/libx32", PathAccess::ReadExec),
        ("/etc", PathAccess::Read),
        ("/proc", PathAccess::Read),
        ("/dev", PathAccess::Read),
        ("/dev/null", PathAccess::ReadWriteFile),
        ("/dev/zero", PathAccess::ReadWriteFile),
        ("/dev/full", PathAccess::ReadWriteFile),
        ("/dev/random", PathAccess::ReadWriteFile),
        ("/dev/urandom", PathAccess::ReadWriteFile),
        ("/dev/shm", PathAccess::Full),
        ("/tmp", PathAccess::Full),
    ];
    match workspace {
        Some(true) => rules.push(("/workspace", PathAccess::Full)),
        Some(false) => rules.push(("/workspace", PathAccess::ReadExec)),
        None => {}
    }
    rules
}

fn access_bits(a: PathAccess, abi: ABI) -> landlock::BitFlags<AccessFs> {
    match a {
        PathAccess::ReadExec => AccessFs::from_read(abi),
        PathAccess::Read => AccessFs::from_read(abi) & !AccessFs::Execute,
        PathAccess::ListDirs => AccessFs::ReadDir.into(),
        PathAccess::ReadWriteFile => AccessFs::ReadFile | AccessFs::WriteFile,
        PathAccess::Full => AccessFs::from_all(abi),
    }
}

/// What applying landlock achieved.
pub(crate) struct LandlockOutcome {
    pub(crate) detail: String,
    pub(crate) full: bool,
}

/// Applies the landlock ruleset to the calling process. With `hard`, any access right,
/// network control or scope this kernel cannot enforce is an error naming what is missing.
pub(crate) fn apply_landlock(workspace: Option<bool>, hard: bool, abi: u8) -> Result<LandlockOutcome, String> {
    let abi = ABI::from(i32::from(abi));
    let level = if hard { CompatLevel::HardRequirement } else { CompatLevel::BestEffort };
    let mut created = Ruleset::default()
        .set_compatibility(level)
        .handle_access(AccessFs::from_all(abi))
        .and_then(|r| r.handle_access(AccessNet::from_all(abi)))
        .and_then(|r| r.scope(Scope::from_all(abi)))
        .and_then(|r| r.create())
        .map_err(|e| format!("landlock ruleset (abi {}): {e}", abi as i32))?;
    for (path, access) in landlock_rules(workspace) {
        // Paths the view does not contain (e.g. /lib32 on most hosts) get no rule.
        let Ok(fd) = PathFd::new(path) else { continue };
        let bits = access_bits(access, abi);
        let is_dir = std::fs::metadata(path).map(|m| m.is_dir()).unwrap_or(false);
        // Directory-only rights cannot be granted on a file.
        let bits = if is_dir { bits } else { bits & AccessFs::from_file(abi) };
        created = created.add_rule(PathBeneath::new(fd, bits)).map_err(|e| format!("landlock rule for {path}: {e}"))?;
    }
    let status = created.restrict_self().map_err(|e| format!("landlock restrict_self: {e}"))?;
    let full = status.ruleset == RulesetStatus::FullyEnforced;
    if hard && !full {
        return Err(format!("landlock is {:?} on this kernel; abi {} is required", status.ruleset, abi as i32));
    }
    Ok(LandlockOutcome {
        detail: format!(
            "abi {} {:?}: fs rules for the view, tcp bind/connect denied, abstract-unix and signal scoped",
            abi as i32, status.ruleset
        ),
        full,
    })
}

/// Syscalls that fail with EPERM: escape, introspection and kernel-attack surface.
const DENIED: &[(&str, i64)] = &[
    ("ptrace", libc::SYS_ptrace),
    ("process_vm_readv", libc::SYS_process_vm_readv),
    ("process_vm_writev", libc::SYS_process_vm_writev),
    ("pidfd_getfd", libc::SYS_pidfd_getfd),
    ("bpf", libc::SYS_bpf),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    ("userfaultfd", libc::SYS_userfaultfd),
    ("mount", libc::SYS_mount),
    ("umount2", libc::SYS_umount2),
    ("pivot_root", libc::SYS_pivot_root),
    ("chroot", libc::SYS_chroot),
    ("open_tree", libc::SYS_open_tree),
    ("move_mount", libc::SYS_move_mount),
    ("fsopen", libc::SYS_fsopen),
    ("fsconfig", libc::SYS_fsconfig),
    ("fsmount", libc::SYS_fsmount),
    ("fspick", libc::SYS_fspick),
    ("mount_setattr", libc::SYS_mount_setattr),
    ("unshare", libc::SYS_unshare),
    ("setns", libc::SYS_setns),
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    ("name_to_handle_at", libc::SYS_name_to_handle_at),
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("syslog", libc::SYS_syslog),
    ("acct", libc::SYS_acct),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    ("reboot", libc::SYS_reboot),
    ("quotactl", libc::SYS_quotactl),
    ("iopl", libc::SYS_iopl),
    ("ioperm", libc::SYS_ioperm),
    ("settimeofday", libc::SYS_settimeofday),
    ("clock_settime", libc::SYS_clock_settime),
    ("clock_adjtime", libc::SYS_clock_adjtime),
    ("adjtimex", libc::SYS_adjtimex),
    ("vhangup", libc::SYS_vhangup),
    ("uselib", libc::SYS_uselib),
    ("fanotify_init", libc::SYS_fanotify_init),
    ("lookup_dcookie", libc::SYS_lookup_dcookie),
];

/// Syscalls that fail with ENOSYS, so that libraries fall back to an older interface:
/// `clone3` (its flags sit in a struct seccomp cannot read; libc falls back to `clone`) and
/// io_uring (its operations bypass seccomp; runtimes fall back to epoll).
const NOT_IMPLEMENTED: &[(&str, i64)] = &[
    ("clone3", libc::SYS_clone3),
    ("io_uring_setup", libc::SYS_io_uring_setup),
    ("io_uring_enter", libc::SYS_io_uring_enter),
    ("io_uring_register", libc::SYS_io_uring_register),
];

/// Namespace-creating `clone` flags, each refused.
const CLONE_NEW: &[(&str, u64)] = &[
    ("CLONE_NEWNS", libc::CLONE_NEWNS as u64),
    ("CLONE_NEWUTS", libc::CLONE_NEWUTS as u64),
    ("CLONE_NEWIPC", libc::CLONE_NEWIPC as u64),
    ("CLONE_NEWUSER", libc::CLONE_NEWUSER as u64),
    ("CLONE_NEWPID", libc::CLONE_NEWPID as u64),
    ("CLONE_NEWNET", libc::CLONE_NEWNET as u64),
    ("CLONE_NEWCGROUP", libc::CLONE_NEWCGROUP as u64),
];

/// Socket families allowed: unix, IPv4, IPv6 and netlink route (all inside the run's empty
/// network namespace). Everything else (packet, raw netlink families, bluetooth, ...) is EPERM.
const SOCKET_FAMILIES: &[(&str, u64)] = &[("AF_UNIX", 1), ("AF_INET", 2), ("AF_INET6", 10), ("AF_NETLINK", 16)];

const TIOCSTI: u64 = 0x5412;
const TIOCLINUX: u64 = 0x541C;
const PERSONALITY_QUERY: u64 = 0xffff_ffff;

fn cond(arg: u8, len: SeccompCmpArgLen, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, String> {
    SeccompCondition::new(arg, len, op, value).map_err(|e| e.to_string())
}

fn rule(conds: Vec<SeccompCondition>) -> Result<SeccompRule, String> {
    SeccompRule::new(conds).map_err(|e| e.to_string())
}

/// A human-readable listing of the seccomp policy, for review and snapshot tests.
pub(crate) fn seccomp_summary() -> String {
    fn names<T>(list: &[(&str, T)]) -> String {
        list.iter().map(|(n, _)| format!(" {n}")).collect()
    }
    format!(
        "arch: x86_64 only (any other arch: kill process)\n\
         ENOSYS:{}\n\
         EPERM:{}\n\
         EPERM clone with any of:{}\n\
         EPERM socket unless family is:{} (netlink: NETLINK_ROUTE only)\n\
         EPERM ioctl TIOCSTI, TIOCLINUX\n\
         EPERM personality except 0 and the query 0xffffffff\n",
        names(NOT_IMPLEMENTED),
        names(DENIED),
        names(CLONE_NEW),
        names(SOCKET_FAMILIES),
    )
}

/// The two filters: ENOSYS first, then EPERM. Everything not listed is allowed.
pub(crate) fn seccomp_filters() -> Result<Vec<BpfProgram>, String> {
    let arch = TargetArch::x86_64;
    let enosys: BTreeMap<i64, Vec<SeccompRule>> = NOT_IMPLEMENTED.iter().map(|(_, nr)| (*nr, Vec::new())).collect();
    let mut eperm: BTreeMap<i64, Vec<SeccompRule>> = DENIED.iter().map(|(_, nr)| (*nr, Vec::new())).collect();
    let q = SeccompCmpArgLen::Qword;
    let d = SeccompCmpArgLen::Dword;
    eperm.insert(
        libc::SYS_clone,
        CLONE_NEW
            .iter()
            .map(|(_, f)| rule(vec![cond(0, q.clone(), SeccompCmpOp::MaskedEq(*f), *f)?]))
            .collect::<Result<_, _>>()?,
    );
    let mut family_rule: Vec<SeccompCondition> = Vec::new();
    for (_, fam) in SOCKET_FAMILIES {
        family_rule.push(cond(0, d.clone(), SeccompCmpOp::Ne, *fam)?);
    }
    eperm.insert(
        libc::SYS_socket,
        vec![
            rule(family_rule)?,
            rule(vec![cond(0, d.clone(), SeccompCmpOp::Eq, 16)?, cond(2, d.clone(), SeccompCmpOp::Ne, 0)?])?,
        ],
    );
    eperm.insert(
        libc::SYS_ioctl,
        vec![
            rule(vec![cond(1, d.clone(), SeccompCmpOp::Eq, TIOCSTI)?])?,
            rule(vec![cond(1, d.clone(), SeccompCmpOp::Eq, TIOCLINUX)?])?,
        ],
    );
    eperm.insert(
        libc::SYS_personality,
        vec![rule(vec![cond(0, d.clone(), SeccompCmpOp::Ne, PERSONALITY_QUERY)?, cond(0, d, SeccompCmpOp::Ne, 0)?])?],
    );
    let build = |rules, errno: i32| -> Result<BpfProgram, String> {
        let filter = SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(errno as u32), arch)
            .map_err(|e| e.to_string())?;
        BpfProgram::try_from(filter).map_err(|e| e.to_string())
    };
    Ok(vec![build(enosys, libc::ENOSYS)?, build(eperm, libc::EPERM)?])
}

/// Installs the filters on the calling thread (the helper is single-threaded, and exec follows).
pub(crate) fn apply_seccomp() -> Result<String, String> {
    let filters = seccomp_filters()?;
    let mut insns = 0;
    for f in &filters {
        insns += f.len();
        seccompiler::apply_filter(f).map_err(|e| format!("seccomp: {e}"))?;
    }
    Ok(format!(
        "{} filters, {insns} instructions: io_uring and clone3 ENOSYS; ptrace, bpf, mount family, namespaces, keyrings and more EPERM",
        filters.len()
    ))
}
