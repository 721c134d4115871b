//! The landlock ruleset and the seccomp filter, built as data so they can be reviewed and
//! snapshot-tested, then applied by the helper just before exec.

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope,
};
use seccompiler::BpfProgram;

mod program;
pub(crate) use program::seccomp_program;

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
    /// Read, write and terminal ioctls (`/dev/tty` and `/dev/pts` when the run has a terminal).
    Terminal,
}

/// The landlock rules for the view: (path inside the new root, access).
pub(crate) fn landlock_rules(workspace: Option<bool>, grants: bool, tty: bool) -> Vec<(&'static str, PathAccess)> {
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
        // A session's home (absent from a run's view, so no rule there).
        (crate::SESSION_HOME, PathAccess::Full),
    ];
    if !tty {
        // With no controlling terminal the open itself fails (ENXIO); landlock lets it get
        // that far, and no ioctl on a device.
        rules.push(("/dev/tty", PathAccess::ReadWriteFile));
    } else {
        rules.push(("/dev/tty", PathAccess::Terminal));
        // Holds only the run's own terminal (see the view), when it has a `/dev/pts/N` name.
        rules.push(("/dev/pts", PathAccess::Terminal));
    }
    if grants {
        rules.push((crate::GRANTS_GUEST_DIR, PathAccess::ReadExec));
    }
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
        PathAccess::Terminal => {
            (AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::IoctlDev) & AccessFs::from_all(abi)
        }
    }
}

/// What applying landlock achieved.
pub(crate) struct LandlockOutcome {
    pub(crate) detail: String,
    pub(crate) full: bool,
}

/// What TCP the guest's landlock domain allows, inside the run's own network namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tcp {
    /// No bind, no connect (a run: its loopback is down anyway).
    Denied,
    /// Connect to this port only (the model grant's listener on the run's loopback).
    Connect(u16),
    /// Bind and connect freely: a session's own loopback, the only interface of its
    /// namespace, for the servers its execs start and query (nothing else is reachable).
    OwnLoopback,
}

impl Tcp {
    pub(crate) fn of(spec: &crate::spec::Spec) -> Self {
        match (spec.session, spec.model_port) {
            // A session's own servers and its grants' listener share its loopback.
            (true, _) => Self::OwnLoopback,
            (false, Some(port)) => Self::Connect(port),
            (false, None) => Self::Denied,
        }
    }
}

/// Applies the landlock ruleset to the calling process. With `hard`, any access right,
/// network control or scope this kernel cannot enforce is an error naming what is missing.
pub(crate) fn apply_landlock(
    workspace: Option<bool>,
    grants: bool,
    tty: bool,
    tcp: Tcp,
    hard: bool,
    abi: u8,
) -> Result<LandlockOutcome, String> {
    let abi = ABI::from(i32::from(abi));
    let level = if hard { CompatLevel::HardRequirement } else { CompatLevel::BestEffort };
    let mut created = Ruleset::default()
        .set_compatibility(level)
        .handle_access(AccessFs::from_all(abi))
        .and_then(|r| if tcp == Tcp::OwnLoopback { Ok(r) } else { r.handle_access(AccessNet::from_all(abi)) })
        .and_then(|r| r.scope(Scope::from_all(abi)))
        .and_then(|r| r.create())
        .map_err(|e| format!("landlock ruleset (abi {}): {e}", abi as i32))?;
    for (path, access) in landlock_rules(workspace, grants, tty) {
        // Paths the view does not contain (e.g. /lib32 on most hosts) get no rule.
        let Ok(fd) = PathFd::new(path) else { continue };
        let bits = access_bits(access, abi);
        let is_dir = std::fs::metadata(path).map(|m| m.is_dir()).unwrap_or(false);
        // Directory-only rights cannot be granted on a file.
        let bits = if is_dir { bits } else { bits & AccessFs::from_file(abi) };
        created = created.add_rule(PathBeneath::new(fd, bits)).map_err(|e| format!("landlock rule for {path}: {e}"))?;
    }
    if let Tcp::Connect(port) = tcp {
        created = created
            .add_rule(NetPort::new(port, AccessNet::ConnectTcp))
            .map_err(|e| format!("landlock rule for tcp connect to port {port}: {e}"))?;
    }
    let status = created.restrict_self().map_err(|e| format!("landlock restrict_self: {e}"))?;
    let full = status.ruleset == RulesetStatus::FullyEnforced;
    if hard && !full {
        return Err(format!("landlock is {:?} on this kernel; abi {} is required", status.ruleset, abi as i32));
    }
    Ok(LandlockOutcome {
        detail: format!(
            "abi {} {:?}: fs rules for the view, {}, abstract-unix and signal scoped",
            abi as i32,
            status.ruleset,
            match tcp {
                Tcp::Connect(port) => format!("tcp bind denied, tcp connect to port {port} only (the model grant)"),
                Tcp::Denied => "tcp bind and connect denied".into(),
                Tcp::OwnLoopback => {
                    "tcp bind and connect free on the session's own loopback (its namespace's only interface)".into()
                }
            }
        ),
        full,
    })
}

/// The allowlist: every syscall the guest may make (x86_64 numbers). Anything else fails
/// with ENOSYS, the answer of a kernel that lacks the call, so libraries fall back to an
/// older interface (`clone3` → `clone`, io_uring → epoll) instead of failing hard. The list
/// follows Docker's default profile for unprivileged containers minus what [`DENIED`]
/// refuses and minus the obsolete and rarely needed calls (`modify_ldt`, `uselib`, the NUMA
/// policy calls, `kcmp`, `process_madvise`, `fanotify_*`, `*_mount`/`statmount`, ...).
/// `clone`, `socket`, `ioctl`, `personality` and the calls that set a mode are listed here
/// and narrowed by argument ([`seccomp_program`]).
pub(crate) const ALLOWED: &[(&str, i64)] = &[
    ("read", libc::SYS_read),
    ("write", libc::SYS_write),
    ("open", libc::SYS_open),
    ("close", libc::SYS_close),
    ("stat", libc::SYS_stat),
    ("fstat", libc::SYS_fstat),
    ("lstat", libc::SYS_lstat),
    ("poll", libc::SYS_poll),
    ("lseek", libc::SYS_lseek),
    ("mmap", libc::SYS_mmap),
    ("mprotect", libc::SYS_mprotect),
    ("munmap", libc::SYS_munmap),
    ("brk", libc::SYS_brk),
    ("rt_sigaction", libc::SYS_rt_sigaction),
    ("rt_sigprocmask", libc::SYS_rt_sigprocmask),
    ("rt_sigreturn", libc::SYS_rt_sigreturn),
    ("ioctl", libc::SYS_ioctl),
    ("pread64", libc::SYS_pread64),
    ("pwrite64", libc::SYS_pwrite64),
    ("readv", libc::SYS_readv),
    ("writev", libc::SYS_writev),
    ("access", libc::SYS_access),
    ("pipe", libc::SYS_pipe),
    ("select", libc::SYS_select),
    ("sched_yield", libc::SYS_sched_yield),
    ("mremap", libc::SYS_mremap),
    ("msync", libc::SYS_msync),
    ("mincore", libc::SYS_mincore),
    ("madvise", libc::SYS_madvise),
    ("shmget", libc::SYS_shmget),
    ("shmat", libc::SYS_shmat),
    ("shmctl", libc::SYS_shmctl),
    ("dup", libc::SYS_dup),
    ("dup2", libc::SYS_dup2),
    ("pause", libc::SYS_pause),
    ("nanosleep", libc::SYS_nanosleep),
    ("getitimer", libc::SYS_getitimer),
    ("alarm", libc::SYS_alarm),
    ("setitimer", libc::SYS_setitimer),
    ("getpid", libc::SYS_getpid),
    ("sendfile", libc::SYS_sendfile),
    ("socket", libc::SYS_socket),
    ("connect", libc::SYS_connect),
    ("accept", libc::SYS_accept),
    ("sendto", libc::SYS_sendto),
    ("recvfrom", libc::SYS_recvfrom),
    ("sendmsg", libc::SYS_sendmsg),
    ("recvmsg", libc::SYS_recvmsg),
    ("shutdown", libc::SYS_shutdown),
    ("bind", libc::SYS_bind),
    ("listen", libc::SYS_listen),
    ("getsockname", libc::SYS_getsockname),
    ("getpeername", libc::SYS_getpeername),
    ("socketpair", libc::SYS_socketpair),
    ("setsockopt", libc::SYS_setsockopt),
    ("getsockopt", libc::SYS_getsockopt),
    ("clone", libc::SYS_clone),
    ("fork", libc::SYS_fork),
    ("vfork", libc::SYS_vfork),
    ("execve", libc::SYS_execve),
    ("exit", libc::SYS_exit),
    ("wait4", libc::SYS_wait4),
    ("kill", libc::SYS_kill),
    ("uname", libc::SYS_uname),
    ("semget", libc::SYS_semget),
    ("semop", libc::SYS_semop),
    ("semctl", libc::SYS_semctl),
    ("shmdt", libc::SYS_shmdt),
    ("msgget", libc::SYS_msgget),
    ("msgsnd", libc::SYS_msgsnd),
    ("msgrcv", libc::SYS_msgrcv),
    ("msgctl", libc::SYS_msgctl),
    ("fcntl", libc::SYS_fcntl),
    ("flock", libc::SYS_flock),
    ("fsync", libc::SYS_fsync),
    ("fdatasync", libc::SYS_fdatasync),
    ("truncate", libc::SYS_truncate),
    ("ftruncate", libc::SYS_ftruncate),
    ("getdents", libc::SYS_getdents),
    ("getcwd", libc::SYS_getcwd),
    ("chdir", libc::SYS_chdir),
    ("fchdir", libc::SYS_fchdir),
    ("rename", libc::SYS_rename),
    ("mkdir", libc::SYS_mkdir),
    ("rmdir", libc::SYS_rmdir),
    ("creat", libc::SYS_creat),
    ("link", libc::SYS_link),
    ("unlink", libc::SYS_unlink),
    ("symlink", libc::SYS_symlink),
    ("readlink", libc::SYS_readlink),
    ("chmod", libc::SYS_chmod),
    ("fchmod", libc::SYS_fchmod),
    ("chown", libc::SYS_chown),
    ("fchown", libc::SYS_fchown),
    ("lchown", libc::SYS_lchown),
    ("umask", libc::SYS_umask),
    ("gettimeofday", libc::SYS_gettimeofday),
    ("getrlimit", libc::SYS_getrlimit),
    ("getrusage", libc::SYS_getrusage),
    ("sysinfo", libc::SYS_sysinfo),
    ("times", libc::SYS_times),
    ("getuid", libc::SYS_getuid),
    ("getgid", libc::SYS_getgid),
    ("setuid", libc::SYS_setuid),
    ("setgid", libc::SYS_setgid),
    ("geteuid", libc::SYS_geteuid),
    ("getegid", libc::SYS_getegid),
    ("setpgid", libc::SYS_setpgid),
    ("getppid", libc::SYS_getppid),
    ("getpgrp", libc::SYS_getpgrp),
    ("setsid", libc::SYS_setsid),
    ("setreuid", libc::SYS_setreuid),
    ("setregid", libc::SYS_setregid),
    ("getgroups", libc::SYS_getgroups),
    ("setgroups", libc::SYS_setgroups),
    ("setresuid", libc::SYS_setresuid),
    ("getresuid", libc::SYS_getresuid),
    ("setresgid", libc::SYS_setresgid),
    ("getresgid", libc::SYS_getresgid),
    ("getpgid", libc::SYS_getpgid),
    ("setfsuid", libc::SYS_setfsuid),
    ("setfsgid", libc::SYS_setfsgid),
    ("getsid", libc::SYS_getsid),
    ("capget", libc::SYS_capget),
    ("capset", libc::SYS_capset),
    ("rt_sigpending", libc::SYS_rt_sigpending),
    ("rt_sigtimedwait", libc::SYS_rt_sigtimedwait),
    ("rt_sigqueueinfo", libc::SYS_rt_sigqueueinfo),
    ("rt_sigsuspend", libc::SYS_rt_sigsuspend),
    ("sigaltstack", libc::SYS_sigaltstack),
    ("utime", libc::SYS_utime),
    ("mknod", libc::SYS_mknod),
    ("personality", libc::SYS_personality),
    ("statfs", libc::SYS_statfs),
    ("fstatfs", libc::SYS_fstatfs),
    ("getpriority", libc::SYS_getpriority),
    ("setpriority", libc::SYS_setpriority),
    ("sched_setparam", libc::SYS_sched_setparam),
    ("sched_getparam", libc::SYS_sched_getparam),
    ("sched_setscheduler", libc::SYS_sched_setscheduler),
    ("sched_getscheduler", libc::SYS_sched_getscheduler),
    ("sched_get_priority_max", libc::SYS_sched_get_priority_max),
    ("sched_get_priority_min", libc::SYS_sched_get_priority_min),
    ("sched_rr_get_interval", libc::SYS_sched_rr_get_interval),
    ("mlock", libc::SYS_mlock),
    ("munlock", libc::SYS_munlock),
    ("mlockall", libc::SYS_mlockall),
    ("munlockall", libc::SYS_munlockall),
    ("prctl", libc::SYS_prctl),
    ("arch_prctl", libc::SYS_arch_prctl),
    ("setrlimit", libc::SYS_setrlimit),
    ("sync", libc::SYS_sync),
    ("gettid", libc::SYS_gettid),
    ("readahead", libc::SYS_readahead),
    ("setxattr", libc::SYS_setxattr),
    ("lsetxattr", libc::SYS_lsetxattr),
    ("fsetxattr", libc::SYS_fsetxattr),
    ("getxattr", libc::SYS_getxattr),
    ("lgetxattr", libc::SYS_lgetxattr),
    ("fgetxattr", libc::SYS_fgetxattr),
    ("listxattr", libc::SYS_listxattr),
    ("llistxattr", libc::SYS_llistxattr),
    ("flistxattr", libc::SYS_flistxattr),
    ("removexattr", libc::SYS_removexattr),
    ("lremovexattr", libc::SYS_lremovexattr),
    ("fremovexattr", libc::SYS_fremovexattr),
    ("tkill", libc::SYS_tkill),
    ("time", libc::SYS_time),
    ("futex", libc::SYS_futex),
    ("sched_setaffinity", libc::SYS_sched_setaffinity),
    ("sched_getaffinity", libc::SYS_sched_getaffinity),
    ("io_setup", libc::SYS_io_setup),
    ("io_destroy", libc::SYS_io_destroy),
    ("io_getevents", libc::SYS_io_getevents),
    ("io_submit", libc::SYS_io_submit),
    ("io_cancel", libc::SYS_io_cancel),
    ("getdents64", libc::SYS_getdents64),
    ("set_tid_address", libc::SYS_set_tid_address),
    ("restart_syscall", libc::SYS_restart_syscall),
    ("semtimedop", libc::SYS_semtimedop),
    ("fadvise64", libc::SYS_fadvise64),
    ("timer_create", libc::SYS_timer_create),
    ("timer_settime", libc::SYS_timer_settime),
    ("timer_gettime", libc::SYS_timer_gettime),
    ("timer_getoverrun", libc::SYS_timer_getoverrun),
    ("timer_delete", libc::SYS_timer_delete),
    ("clock_gettime", libc::SYS_clock_gettime),
    ("clock_getres", libc::SYS_clock_getres),
    ("clock_nanosleep", libc::SYS_clock_nanosleep),
    ("exit_group", libc::SYS_exit_group),
    ("epoll_wait", libc::SYS_epoll_wait),
    ("epoll_ctl", libc::SYS_epoll_ctl),
    ("tgkill", libc::SYS_tgkill),
    ("utimes", libc::SYS_utimes),
    ("mq_open", libc::SYS_mq_open),
    ("mq_unlink", libc::SYS_mq_unlink),
    ("mq_timedsend", libc::SYS_mq_timedsend),
    ("mq_timedreceive", libc::SYS_mq_timedreceive),
    ("mq_notify", libc::SYS_mq_notify),
    ("mq_getsetattr", libc::SYS_mq_getsetattr),
    ("waitid", libc::SYS_waitid),
    ("ioprio_set", libc::SYS_ioprio_set),
    ("ioprio_get", libc::SYS_ioprio_get),
    ("inotify_init", libc::SYS_inotify_init),
    ("inotify_add_watch", libc::SYS_inotify_add_watch),
    ("inotify_rm_watch", libc::SYS_inotify_rm_watch),
    ("openat", libc::SYS_openat),
    ("mkdirat", libc::SYS_mkdirat),
    ("mknodat", libc::SYS_mknodat),
    ("fchownat", libc::SYS_fchownat),
    ("futimesat", libc::SYS_futimesat),
    ("newfstatat", libc::SYS_newfstatat),
    ("unlinkat", libc::SYS_unlinkat),
    ("renameat", libc::SYS_renameat),
    ("linkat", libc::SYS_linkat),
    ("symlinkat", libc::SYS_symlinkat),
    ("readlinkat", libc::SYS_readlinkat),
    ("fchmodat", libc::SYS_fchmodat),
    ("faccessat", libc::SYS_faccessat),
    ("pselect6", libc::SYS_pselect6),
    ("ppoll", libc::SYS_ppoll),
    ("set_robust_list", libc::SYS_set_robust_list),
    ("get_robust_list", libc::SYS_get_robust_list),
    ("splice", libc::SYS_splice),
    ("tee", libc::SYS_tee),
    ("sync_file_range", libc::SYS_sync_file_range),
    ("vmsplice", libc::SYS_vmsplice),
    ("utimensat", libc::SYS_utimensat),
    ("epoll_pwait", libc::SYS_epoll_pwait),
    ("signalfd", libc::SYS_signalfd),
    ("timerfd_create", libc::SYS_timerfd_create),
    ("eventfd", libc::SYS_eventfd),
    ("fallocate", libc::SYS_fallocate),
    ("timerfd_settime", libc::SYS_timerfd_settime),
    ("timerfd_gettime", libc::SYS_timerfd_gettime),
    ("accept4", libc::SYS_accept4),
    ("signalfd4", libc::SYS_signalfd4),
    ("eventfd2", libc::SYS_eventfd2),
    ("epoll_create", libc::SYS_epoll_create),
    ("epoll_create1", libc::SYS_epoll_create1),
    ("dup3", libc::SYS_dup3),
    ("pipe2", libc::SYS_pipe2),
    ("inotify_init1", libc::SYS_inotify_init1),
    ("preadv", libc::SYS_preadv),
    ("pwritev", libc::SYS_pwritev),
    ("rt_tgsigqueueinfo", libc::SYS_rt_tgsigqueueinfo),
    ("recvmmsg", libc::SYS_recvmmsg),
    ("prlimit64", libc::SYS_prlimit64),
    ("syncfs", libc::SYS_syncfs),
    ("sendmmsg", libc::SYS_sendmmsg),
    ("getcpu", libc::SYS_getcpu),
    ("sched_setattr", libc::SYS_sched_setattr),
    ("sched_getattr", libc::SYS_sched_getattr),
    ("renameat2", libc::SYS_renameat2),
    ("seccomp", libc::SYS_seccomp),
    ("getrandom", libc::SYS_getrandom),
    ("memfd_create", libc::SYS_memfd_create),
    ("execveat", libc::SYS_execveat),
    ("membarrier", libc::SYS_membarrier),
    ("mlock2", libc::SYS_mlock2),
    ("copy_file_range", libc::SYS_copy_file_range),
    ("preadv2", libc::SYS_preadv2),
    ("pwritev2", libc::SYS_pwritev2),
    ("pkey_mprotect", libc::SYS_pkey_mprotect),
    ("pkey_alloc", libc::SYS_pkey_alloc),
    ("pkey_free", libc::SYS_pkey_free),
    ("statx", libc::SYS_statx),
    ("rseq", libc::SYS_rseq),
    ("pidfd_send_signal", libc::SYS_pidfd_send_signal),
    ("pidfd_open", libc::SYS_pidfd_open),
    ("close_range", libc::SYS_close_range),
    ("faccessat2", libc::SYS_faccessat2),
    ("epoll_pwait2", libc::SYS_epoll_pwait2),
    ("landlock_create_ruleset", libc::SYS_landlock_create_ruleset),
    ("landlock_add_rule", libc::SYS_landlock_add_rule),
    ("landlock_restrict_self", libc::SYS_landlock_restrict_self),
    ("futex_waitv", libc::SYS_futex_waitv),
    ("fchmodat2", libc::SYS_fchmodat2),
];

/// Syscalls that fail with EPERM: escape, introspection and kernel-attack surface. None of
/// them is in [`ALLOWED`]; the explicit EPERM (rather than the ENOSYS of a call not listed)
/// tells a program it was refused rather than that the kernel is old.
pub(crate) const DENIED: &[(&str, i64)] = &[
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
/// `openat2` likewise: its mode sits in a struct, so the set-id rule below could not see it
/// (libc's `open` is `openat`, and callers of `openat2` fall back on ENOSYS).
pub(crate) const NOT_IMPLEMENTED: &[(&str, i64)] = &[
    ("clone3", libc::SYS_clone3),
    ("openat2", libc::SYS_openat2),
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

/// The protocols an inet (IPv4 or IPv6) socket may ask for: the type's default (0), TCP,
/// UDP and ICMP (ping sockets; ICMPv6). Landlock's network rules cover TCP only, so another
/// stream protocol would bind and listen where TCP gets EACCES: MPTCP (262) and SCTP (132)
/// are refused, and so is `SOCK_SEQPACKET`, whose default protocol is SCTP.
const INET_PROTOCOLS: &[(&str, u64)] =
    &[("default", 0), ("IPPROTO_TCP", 6), ("IPPROTO_UDP", 17), ("IPPROTO_ICMP", 1), ("IPPROTO_ICMPV6", 58)];
/// The inet socket types allowed: stream and datagram (the low four bits of `type`; the
/// rest are `SOCK_NONBLOCK` and `SOCK_CLOEXEC`).
const INET_TYPES: &[(&str, u64)] = &[("SOCK_STREAM", 1), ("SOCK_DGRAM", 2)];
const SOCK_TYPE_MASK: u64 = 0xf;

/// Calls that set a file mode, with the index of the mode argument: a set-uid or set-gid bit
/// in it is refused. A file the guest makes in a workspace belongs to the invoking user on
/// the host (root, through the id-mapped mount), so a set-id bit there would hand whoever
/// runs it later the invoking user's rights. `open` and `openat` are refused only with
/// `O_CREAT` or `O_TMPFILE`, when the mode is read at all.
const SETID_MODE_ARG: &[(&str, i64, u8)] = &[
    ("chmod", libc::SYS_chmod, 1),
    ("fchmod", libc::SYS_fchmod, 1),
    ("fchmodat", libc::SYS_fchmodat, 2),
    ("fchmodat2", libc::SYS_fchmodat2, 2),
    ("creat", libc::SYS_creat, 1),
    ("mknod", libc::SYS_mknod, 1),
    ("mknodat", libc::SYS_mknodat, 2),
    ("open", libc::SYS_open, 2),
    ("openat", libc::SYS_openat, 3),
];
const SETID_BITS: [u64; 2] = [libc::S_ISUID as u64, libc::S_ISGID as u64];
/// The flags that make `open` and `openat` read their mode: `O_CREAT` and `__O_TMPFILE`.
const CREATE_FLAGS: [u64; 2] = [libc::O_CREAT as u64, 0o20_000_000];

const TIOCSTI: u64 = 0x5412;
const TIOCLINUX: u64 = 0x541C;
const PERSONALITY_QUERY: u64 = 0xffff_ffff;

/// The calls narrowed by argument, each also in [`ALLOWED`]: `clone`, `socket`, `ioctl`,
/// `personality` and [`SETID_MODE_ARG`]'s.
pub(crate) fn narrowed() -> impl Iterator<Item = i64> {
    [libc::SYS_clone, libc::SYS_socket, libc::SYS_ioctl, libc::SYS_personality]
        .into_iter()
        .chain(SETID_MODE_ARG.iter().map(|(_, nr, _)| *nr))
}

/// A human-readable listing of the seccomp policy, for review and snapshot tests.
pub(crate) fn seccomp_summary() -> String {
    fn names<T>(list: &[(&str, T)]) -> String {
        list.iter().map(|(n, _)| format!(" {n}")).collect()
    }
    format!(
        "arch: x86_64 only (any other arch: kill process)\n\
         ALLOWED ({} calls; anything else ENOSYS):{}\n\
         ENOSYS, so that libraries fall back:{}\n\
         EPERM:{}\n\
         EPERM clone with any of:{}\n\
         EPERM socket unless family is:{} (netlink: NETLINK_ROUTE only; inet and inet6: type{} only, protocol{} only)\n\
         EPERM ioctl TIOCSTI, TIOCLINUX\n\
         EPERM personality except 0 and the query 0xffffffff\n\
         EPERM a set-uid or set-gid mode in:{}\n",
        ALLOWED.len(),
        names(ALLOWED),
        names(NOT_IMPLEMENTED),
        names(DENIED),
        names(CLONE_NEW),
        names(SOCKET_FAMILIES),
        names(INET_TYPES),
        names(INET_PROTOCOLS),
        SETID_MODE_ARG.iter().map(|(n, _, _)| format!(" {n}")).collect::<String>(),
    )
}

/// The same policy as an OCI runtime seccomp profile (the format Docker's
/// `--security-opt seccomp=` takes), for an engine that applies seccomp itself: the allowed
/// calls, with `clone`, `socket`, `personality` and the mode-setting calls allowed only with
/// the arguments this tier allows; the ENOSYS calls; everything else EPERM (Docker's own
/// default errno), x86_64 only. `ioctl` is not narrowed: a container has no terminal.
pub(crate) fn oci_profile() -> serde_json::Value {
    use serde_json::json;
    let narrowed: Vec<i64> = narrowed().filter(|nr| *nr != libc::SYS_ioctl).collect();
    let plain: Vec<&str> = ALLOWED.iter().filter(|(_, nr)| !narrowed.contains(nr)).map(|(n, _)| *n).collect();
    let masked = |index: u8, mask: u64, value: u64| json!({"index": index, "value": mask, "valueTwo": value, "op": "SCMP_CMP_MASKED_EQ"});
    let eq = |index: u8, value: u64| json!({"index": index, "value": value, "op": "SCMP_CMP_EQ"});
    let allow =
        |name: &str, args: Vec<serde_json::Value>| json!({"names": [name], "action": "SCMP_ACT_ALLOW", "args": args});
    let mut rules = vec![json!({"names": plain, "action": "SCMP_ACT_ALLOW"})];
    let clone_new = CLONE_NEW.iter().fold(0, |a, (_, f)| a | f);
    rules.push(allow("clone", vec![masked(0, clone_new, 0)]));
    for (name, family) in SOCKET_FAMILIES {
        match *name {
            "AF_NETLINK" => rules.push(allow("socket", vec![eq(0, *family), eq(2, 0)])),
            "AF_INET" | "AF_INET6" => {
                for (_, ty) in INET_TYPES {
                    for (_, proto) in INET_PROTOCOLS {
                        rules
                            .push(allow("socket", vec![eq(0, *family), masked(1, SOCK_TYPE_MASK, *ty), eq(2, *proto)]));
                    }
                }
            }
            _ => rules.push(allow("socket", vec![eq(0, *family)])),
        }
    }
    for value in [0, PERSONALITY_QUERY] {
        rules.push(allow("personality", vec![eq(0, value)]));
    }
    let setid = SETID_BITS.iter().fold(0, |a, b| a | b);
    let create = CREATE_FLAGS.iter().fold(0, |a, b| a | b);
    for (name, nr, arg) in SETID_MODE_ARG {
        rules.push(allow(name, vec![masked(*arg, setid, 0)]));
        if *nr == libc::SYS_open || *nr == libc::SYS_openat {
            rules.push(allow(name, vec![masked(*arg - 1, create, 0)]));
        }
    }
    let enosys: Vec<&str> = NOT_IMPLEMENTED.iter().map(|(n, _)| *n).collect();
    rules.push(json!({"names": enosys, "action": "SCMP_ACT_ERRNO", "errnoRet": libc::ENOSYS}));
    json!({
        "comment": "stockade-process's seccomp policy, generated by its test g4_the_docker_tiers_copy_of_the_policy_is_current (UPDATE_EXPECT=1 writes it); do not edit.",
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": libc::EPERM,
        "architectures": ["SCMP_ARCH_X86_64"],
        "syscalls": rules,
    })
}

/// The calls stockade's own processes make beyond a guest's [`ALLOWED`] ones: the supervisor
/// and helper build each sandbox's namespaces, mounts, root and hostname, and hand
/// descriptors between processes. A container that runs `stockade serve` must let these
/// through ([`owner_profile`]); a guest's own filter still refuses each of them.
pub(crate) const OWNER: &[(&str, i64)] = &[
    ("unshare", libc::SYS_unshare),
    ("setns", libc::SYS_setns),
    ("mount", libc::SYS_mount),
    ("umount2", libc::SYS_umount2),
    ("pivot_root", libc::SYS_pivot_root),
    ("open_tree", libc::SYS_open_tree),
    ("move_mount", libc::SYS_move_mount),
    ("mount_setattr", libc::SYS_mount_setattr),
    ("sethostname", libc::SYS_sethostname),
    ("pidfd_getfd", libc::SYS_pidfd_getfd),
];

/// The seccomp profile for a container that runs stockade itself (`stockade serve` in
/// `deploy/`): a guest's calls and [`OWNER`]'s, each without argument narrowing (the owner
/// makes namespaces with `clone` and sockets of its own kinds; every guest still gets this
/// tier's whole filter inside); the ENOSYS calls as here; everything else EPERM, x86_64 only.
/// So what a container engine's default profile would refuse the owner (namespaces, mounts)
/// is allowed by name, and what neither stockade nor its guests call (`ptrace`, `bpf`,
/// `keyctl`, modules, `kexec`, clocks, `reboot`, ...) stays refused for the whole container.
pub(crate) fn owner_profile() -> serde_json::Value {
    use serde_json::json;
    let mut allowed: Vec<&str> = ALLOWED.iter().chain(OWNER).map(|(n, _)| *n).collect();
    allowed.sort_unstable();
    allowed.dedup();
    let enosys: Vec<&str> = NOT_IMPLEMENTED.iter().map(|(n, _)| *n).collect();
    json!({
        "comment": "stockade serve's container profile: a guest's calls and the owner's (confine.rs OWNER), generated by stockade-process's test g4_the_deploy_profile_is_current (UPDATE_EXPECT=1 writes it); do not edit.",
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": libc::EPERM,
        "architectures": ["SCMP_ARCH_X86_64"],
        "syscalls": [
            {"names": allowed, "action": "SCMP_ACT_ALLOW"},
            {"names": enosys, "action": "SCMP_ACT_ERRNO", "errnoRet": libc::ENOSYS},
        ],
    })
}

/// Installs the filter compiled before ([`seccomp_program`]; a session's init installs it
/// once on itself, for all its execs to inherit).
pub(crate) fn apply_compiled_seccomp(program: &BpfProgram) -> Result<String, String> {
    seccompiler::apply_filter(program).map_err(|e| format!("seccomp: {e}"))?;
    Ok(format!(
        "one filter, {} instructions: an allowlist of {} syscalls (anything else ENOSYS, so io_uring and clone3 too); ptrace, bpf, mount family, namespaces, keyrings and more EPERM",
        program.len(),
        ALLOWED.len()
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly on broken invariants")]
mod tests;
