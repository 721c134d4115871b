//! The default stockade tier: runs a command as a Linux subprocess confined by everything the
//! kernel offers without a daemon.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use stockade_process::{Helper, ProcessTier};
//! use stockade_protocol::Job;
//!
//! stockade_process::helper_main(); // first thing in `main` when using Helper::current_exe()
//! stockade_process::ForkServer::start()?; // next, while single-threaded (see ForkServer)
//! let tier = ProcessTier::new(Helper::current_exe()?.prefer_fork());
//! let report = tier.run(&Job::command("python3", ["-c", "print(6*7)"])?).await?;
//! assert_eq!(report.stdout.bytes, b"42\n");
//! # Ok(()) }
//! ```
//!
//! Every run gets, by default and as a hard requirement:
//! - **namespaces**: user (the guest is never host uid 0: it runs as the invoking uid, or as
//!   `nobody` when stockade runs as root), pid, mount, net, ipc and uts;
//! - **a fresh, minimal filesystem view**: a read-only tmpfs root with `/usr`, `/bin`, `/lib*`
//!   and a few `/etc` files bound read-only and nosuid (the smallest copied in, and
//!   `/etc/localtime` kept as the host's link), a fresh `/proc`, a `/dev` with only
//!   null, zero, full, random, urandom and `tty` (which opens to ENXIO, since the guest's
//!   session has no controlling terminal, unless a private pseudo-terminal is asked for:
//!   [`ProcessTier::tty`]), private size-capped tmpfs `/tmp` and `/dev/shm`, and
//!   the workspace at `/workspace` if granted (nosuid, nodev; id-mapped to the guest when
//!   stockade runs as root, see G13), and with a grants directory ([`ProcessTier::run_live`]) the
//!   run's own grants directory read-only at `/run/stockade`. Nothing else of the host exists
//!   in the view: no `/home`, `/root`, the rest of `/run`, `/var`, and so no host sockets
//!   such as `docker.sock`;
//! - **landlock** (ABI 7): filesystem rules matching the view, TCP bind and connect denied
//!   (connect allowed to the one port of a [`Loopback`] listener,
//!   when asked), abstract unix sockets and signals scoped;
//! - **seccomp**: an allowlist of about 280 syscalls; anything else (among them `io_uring_*`,
//!   `clone3` and the x32 ABI) fails with ENOSYS, so libraries fall back; ptrace, `process_vm_*`, bpf,
//!   perf, keyrings, userfaultfd, the mount family, `unshare`/`setns`, `clone` with
//!   `CLONE_NEW*`, `personality` changes, `open_by_handle_at`, kexec, modules, and the
//!   TIOCSTI and TIOCLINUX ioctls fail with EPERM, as does a set-uid or set-gid file mode;
//!   sockets only of the unix, inet, inet6 and netlink-route families;
//! - **hygiene**: `no_new_privs`, every capability dropped, a new session with no controlling
//!   tty, parent-death SIGKILL, core dumps off, an empty environment plus the job's
//!   allowlist, stdin from the job or `/dev/null`, every fd but 0–2 closed;
//! - **limits**: a wall-clock deadline that kills the whole pid namespace, CPU time, memory
//!   and processes through a cgroup where one can be created (else `RLIMIT_AS` and
//!   `RLIMIT_NPROC`, and the report says which), open files, file size, tmpfs sizes, and
//!   stdout/stderr budgets enforced with fail-fast capture.
//!
//! # Position in the stack
//! Depends on: `stockade-protocol`, `stockade-hostfs`, `stockade-sys` (the /proc and cgroup readers). Used by:
//! `stockade-runtime`.
//! API boundary: yes; [`ProcessTier`] (with [`ProcessTier::pool`]), [`Helper`], [`ForkServer`], [`helper_main`], [`probe`], [`HomeMount`], [`RawTerminal`].
//!
//! # Threat model
//! Trusted: the host kernel, this crate, the helper binary it execs.
//! Attacker-controlled: the guest program and everything it runs: its syscalls, files it
//! writes in granted directories, its output, its timing, its children.
//! Out of scope: kernel bugs (a namespace or landlock escape through a kernel flaw),
//! micro-architectural side channels, and what the guest does with network access when the
//! host grants it (this tier grants none).
//!
//! # Guarantees
//! G1. The guest sees only the view above: host files outside it (a home directory, `/root`,
//!     `/etc/shadow`, host sockets) do not exist for it, a unix socket or fifo inside a
//!     granted workspace (found by the helper in what it mounted, at any depth, whatever
//!     the bytes of its name, however many) is covered with `/dev/null`,
//!     system directories are read-only, and writes land only in its private tmpfs or a
//!     read-write workspace.
//!     (pinned by: tests/it/confinement.rs::g1_*, tests/it/workspace.rs::g1_*)
//! G2. The guest is never host uid 0 and holds no capabilities, and `no_new_privs` is set.
//!     (pinned by: tests/it/confinement.rs::g2_*)
//! G3. The guest has no network: no route to the host's loopback listeners, TCP bind and
//!     connect denied by landlock, and only unix, inet, inet6 and netlink-route sockets,
//!     inet ones only stream or datagram with the default, TCP, UDP or ICMP protocol (so no
//!     MPTCP or SCTP socket, which landlock's TCP rules do not cover).
//!     (pinned by: tests/it/confinement.rs::g3_*)
//! G4. The seccomp filter refuses each listed syscall, and a process cannot signal or trace
//!     anything outside the run.
//!     (pinned by: tests/it/confinement.rs::g4_*)
//! G5. The environment is exactly the job's allowlist, stdin is the job's bytes or empty, and
//!     no descriptor but 0–2 reaches the guest. Outside a terminal, the guest's stdin, stdout
//!     and stderr pipes are held in the run by the guest's processes alone (the helper and
//!     init hand them down and keep `/dev/null` in their place), so the output ends, and a
//!     stdin writer meets `EPIPE`, as soon as the guest's processes close them.
//!     (pinned by: tests/it/confinement.rs::g5_*)
//! G6. At the deadline, on an output-budget breach, or when the supervisor dies, every process
//!     of the run dies, including `setsid` daemons; the report says which limit ended it. The
//!     per-run cgroups a SIGKILLed supervisor leaves are named after its pid and start time,
//!     listed by [`stale_cgroups`] and removed by the next run ([`reap_stale_cgroups`]).
//!     (pinned by: tests/it/limits.rs::g6_*)
//! G7. Memory, processes, CPU time, open files and file size are limited, and a memory bomb
//!     is reported as out of memory where a cgroup is available. When the host (or the
//!     supervisor's cgroup) runs out of processes, a run that cannot start says so, typed
//!     ([`RunError::Exhausted`], or a `FailedToStart` report naming `EAGAIN`), never as
//!     a missing mechanism or a misconfiguration; runs already started go on, and none
//!     leaves a process or cgroup behind A guest that fills its read-write workspace's filesystem
//!     gets `ENOSPC` like any program; the run ends normally and the next one works.
//!     (pinned by: tests/it/limits.rs::g7_*)
//! G8. Fail closed: if a mechanism cannot be enforced, the run does not start and the error
//!     names the mechanism; best effort is an explicit opt-in whose report lists what is missing.
//!     (pinned by: tests/it/limits.rs::g8_*)
//! G9. Every mechanism in force is listed in the report's enforcement list.
//!     (pinned by: tests/it/confinement.rs::g9_*)
//! G10. In a read-write workspace, each [`PROTECTED`] path that exists (git hooks and
//!     config, shell rc files, editor, agent and tool settings, credential directories)
//!     stays read-only and can be neither removed nor renamed, and `.git` itself is pinned
//!     (bound writable onto itself) so it cannot be moved aside and replaced, while git's
//!     history stays writable (`git commit` works); a protected path reached through a
//!     symlink refuses the grant; what the guest creates where a protected path was
//!     absent, and any new top-level entry of `.git` that git does not write
//!     (`.git/commondir`), is removed when the run is over (`stockade-hostfs`), and the
//!     report says what, with every path the sweep could not remove; a gitfile the user had
//!     is never removed. The sweep also runs when the run ends early or its future is
//!     dropped (a cancelled call), once the run's processes are gone (its pid 1 is waited
//!     for, not only the helper, so this holds without a cgroup too); it is recorded before
//!     the guest starts, so that a supervisor killed before it swept has it finished later
//!     ([`finish_killed_sweeps`]). One read-write run
//!     of a workspace at a time (`stockade_hostfs::OpenedWorkspace::lock`, held through the
//!     sweep and shared with the other tiers: a run of a directory inside it waits too;
//!     read-only runs share it; `Busy::Refuse` refuses with [`RunError::Busy`] instead of
//!     waiting), so a run never inspects what another run's guest is planting. So the guest
//!     cannot leave code the host runs later.
//!     (pinned by: tests/it/confinement.rs::g10_*, tests/it/workspace.rs::g10_*; the killed
//!     supervisor's record end to end by stockade-cli's `g6_the_sweep_of_a_sigkilled_*`)
//! G11. [`Helper::fork`] forks the supervisor only while it has exactly one thread (checked
//!     at every launch), and fails with [`RunError::Misconfigured`] otherwise;
//!     [`Helper::prefer_fork`] never forks the supervisor: without a fork server it
//!     executes its helper binary, so no copy of what the supervisor read (an API key)
//!     is in its helpers. Either way the guest is a fresh
//!     exec holding none of the supervisor's memory, descriptors or signal dispositions, and
//!     pid 1 of the run (a copy of the supervisor's memory after a fork), and under a root
//!     supervisor the helper too once it has written its id maps as uid 65534, is not dumpable
//!     (pid 1 is inside the guest's landlock domain and under its filters, G21; the helper is
//!     outside both), so to the guest, which holds no capability and may not call `ptrace`,
//!     their memory, environment and descriptors are unreadable, and pid 1 ignores its signals; and a forked helper overwrites its copy of the
//!     supervisor's argument and environment strings first, so `/proc/1/cmdline` (which the
//!     kernel lets any process of the namespace read) shows none of the supervisor's
//!     arguments (walked end to end in stockade-cli's tests/it/cli.rs).
//!     (pinned by: tests/it/launch.rs::g11_*, tests/it/workspace.rs::g11_*,
//!     src/launch.rs::tests)
//! G12. With a [`Loopback`] ([`ProcessTier::run_live`]), the run's own loopback is up and the
//!     guest can connect to exactly one TCP port on it, where the listener the host serves
//!     waits; every other port (and the host's loopback, which is not the run's) is refused,
//!     binding any port is denied, and the listener is created by the helper before init
//!     exists, closed in init, and never a descriptor of the guest.
//!     (pinned by: tests/it/confinement.rs::g12_*)
//! G13. A workspace is granted only if, with symlinks resolved, it passes the protocol's
//!     dedicated-directory rule ([`stockade_protocol::check_dedicated`]: no `/`, system
//!     tree, shared directory or home directory itself, nor an ancestor of one), else
//!     [`RunError::Misconfigured`] names the path. The directory is opened once, without
//!     following a symlink (`stockade_hostfs::open_workspace`), judged as opened, and the
//!     helper runs nothing unless the directory it mounted at `/workspace` has that
//!     directory's device and inode: a directory on the path swapped for a symlink between
//!     the check and the mount (by another run's guest) is refused, never mounted. A directory the invoking user owns is
//!     usable whatever its mode: as root, the helper opens it before dropping to `nobody`
//!     and attaches it as an id-mapped mount (`open_tree`, `mount_setattr(MOUNT_ATTR_IDMAP)`,
//!     `move_mount`) in which root's files are the guest's own and what the guest creates
//!     belongs to root on the host, while the guest itself stays host uid 65534 (a
//!     filesystem without id-mapped mounts fails closed, naming the mechanism); as any other
//!     user, the guest is that user. Seccomp refuses a set-uid or set-gid mode in `chmod`,
//!     `fchmod*`, `creat`, `mknod*` and creating `open`/`openat` (and `openat2`, whose mode
//!     it cannot read, is ENOSYS), so such a file cannot hand its owner's rights to whoever
//!     runs it on the host.
//!     (pinned by: tests/it/confinement.rs::g13_*, tests/it/workspace.rs::g13_*)
//! G14. A [`ForkServer`], started while the process has one thread (else
//!     [`RunError::Misconfigured`]), lets a multi-threaded program launch every run
//!     without an exec, with the same mechanisms as an executed helper: each helper is
//!     cloned by the server as this process's own child and confined as in G11. The server
//!     holds `/dev/null` as descriptors 0–2 and its socket as 3, and nothing else; its memory
//!     holds none of the environment the program was started with; it and every run in
//!     flight die with the program; and a server killed from outside fails the one launch
//!     that finds out, by name, after which launches take the fallback.
//!     [`ForkServer::hand_over_next`] makes the next launch the server's last: the server's
//!     own process becomes that run's helper (no clone beside it), the run's end reaps it,
//!     and later launches take the fallback.
//!     (pinned by: tests/it/forkserver.rs::g14_*)
//! G15. With [`ProcessTier::pool`], a run can take a sandbox built before its job existed:
//!     the helper joined its cgroup, unshared every namespace, init built the view, entered
//!     the landlock domain and installed the seccomp filter, then waited for the job; the
//!     job's command, environment, stdin, rlimits and cgroup limits are handed over when it
//!     runs, and init starts the guest as every guest starts (G21). A pooled run has the mechanisms, view and
//!     report of a one-shot run: each sandbox serves exactly one run (fresh `/tmp`, pid
//!     namespace and cgroup), a waiting sandbox serves a workspace only if it was built
//!     from the inspection the run makes as it starts (the directory's identity, its sockets,
//!     and for read-write its protected paths), granted runs are one-shot, and a mechanism
//!     the host cannot enforce fails a pooled run closed as it does a one-shot one. A dropped
//!     pool leaves no process, cgroup or mount (a replacement still being built when the last
//!     clone goes is killed by the pool's thread as soon as its build ends); a SIGKILLed
//!     owner's sandboxes die with it and their cgroups are stale until the next run removes
//!     them. A pooled run's report comes once its helper has reaped the run's init, when the
//!     kernel has killed and reaped every other process of the run's pid namespace; the
//!     helper (killed then, with nothing left to do but exit) and the run's cgroup go right
//!     after, in the background of the caller's runtime, or at once if that runtime shuts
//!     down first.
//!     (pinned by: tests/it/pool.rs::g15_*)
//! G16. Every process of a run (helper, init, the guest and whatever it starts) has
//!     `oom_score_adj` 1000, the kernel's maximum, set by the helper as its first step, so
//!     pooled sandboxes have it too: when the host, or a memory cgroup that holds the
//!     supervisor, runs out of memory, the kernel's out-of-memory killer takes a run's
//!     largest process before the supervisor or any process whose score was not raised, even
//!     one many times larger. Such a run ends `OutOfMemory` (the kill is counted in the run's
//!     own memory cgroup) or, without a cgroup, killed by signal 9; the supervisor and its
//!     other runs go on, and the next run works. Where `/proc/self/oom_score_adj` cannot be
//!     written the run fails closed naming it (best effort: reported missing).
//!     (pinned by: tests/it/limits.rs::g16_*)
//! G17. A [`ProcessSession`] ([`ProcessTier::session`]) is one sandbox for many execs: one
//!     helper, init, pid namespace, view and cgroup for its whole life, with its home (a host
//!     directory its owner made for it) read-write at [`SESSION_HOME`]. Init spawns one guest
//!     per exec (a vfork-style clone, as `posix_spawn` does, with no copy of init's memory), and
//!     each exec's guest takes the steps a run's guest takes (its own session,
//!     capabilities dropped, `no_new_privs`, the exec's rlimits) in the session's one
//!     landlock domain and under its seccomp filter (the run's rules and filter, entered
//!     and installed once by init, which is then as confined as its guests, and inherited, so
//!     that a later exec can signal what an earlier one left running and reach its abstract
//!     sockets, and nothing outside the session can be either), with the
//!     exec's own argv, environment, working directory, stdin and output budgets; at its
//!     deadline the exec's process group is killed and the session goes on. Files in the
//!     home, `/tmp` and `/dev/shm`, and processes left running, persist between execs; two
//!     sessions see neither each other's files nor processes; [`ProcessSession::processes`] lists
//!     a session's processes from the host's `/proc`. [`ProcessSession::pause`] freezes
//!     every process of the session (the cgroup freezer, v1 or v2): it uses no CPU, takes no
//!     exec, and its execs' deadlines stop until [`ProcessSession::resume`]; without a freezer
//!     pause is [`RunError::Unsupported`], named. [`ProcessSession::kill`] (or
//!     a drop, or the owner's death) ends every process of the session, then its cgroup; a
//!     read-write workspace stays locked for the session's life and is swept at the end of
//!     each exec (named in its report), at each heartbeat (every second) and at its end.
//!     A session's network namespace has its loopback up (its only interface), and its
//!     landlock domain leaves TCP free there: a server one exec starts answers the next, and
//!     neither another session nor the host reaches it.
//!     (pinned by: tests/it/session.rs::g17_*)
//! G18. [`ProcessSession::exec_with`] tells [`ExecOptions::started`] the exec's id and pid
//!     (in the session's namespace) as soon as init forked its guest, so a caller can run it
//!     in the background: [`ProcessSession::signal`] reaches its process group, and an exec
//!     that ended is not signalled. With [`ExecOptions::pty`] its stdin, stdout and stderr
//!     are one new pseudo-terminal (echo on, as a terminal someone types into) that is its controlling terminal, typed into
//!     from its stdin, read as its stdout, and resized through [`Terminal::resize`] (the
//!     kernel sends `SIGWINCH`). With [`CaptureMode::Drain`](stockade_protocol::CaptureMode::Drain) an output budget keeps the
//!     first bytes for the report and the exec goes on (its live copies see every byte); the
//!     default fails fast, as a run.
//!     (pinned by: tests/it/session.rs::g18_*)
//! G19. [`HomeMount::mount`] caps a session home's size with a tmpfs (nosuid, nodev, the
//!     directory's owner and mode, an inode bound) mounted on the host directory by a root
//!     supervisor, so the guest's view and the host's files API see one filesystem and a
//!     write past the size fails with `ENOSPC`; without root it is refused, naming the
//!     mechanism; it is unmounted when dropped, and [`unmount_under`] unmounts what a killed
//!     owner left before its directory is removed.
//!     (pinned by: tests/it/session.rs::g19_*; walked end to end with a session in
//!     stockade-cli's session tests)
//! G20. [`SessionConfig::guest_id`] runs a root supervisor's session guest as that host uid
//!     and gid instead of 65534: the helper drops to it, its user namespace maps `nobody`
//!     inside to it (so inside nothing changes), and the id-mapped workspace and home map
//!     root's files to it; the kernel then counts the session's per-user limits (inotify
//!     instances and watches, `RLIMIT_NPROC`, mqueue bytes, pipe buffers, keys) apart from
//!     every other session's. Without root, or for uid 0, the session is refused, naming why.
//!     (pinned by: stockade-cli's `g10_each_session_s_guest_is_a_host_uid_*`)
//!
//! G21. Every guest starts one way, a run's and a session exec's alike: init enters the
//!     landlock domain and installs the seccomp filter once (a pre-built sandbox's init
//!     before its job exists), then spawns the guest (a vfork-style clone) whose child takes
//!     the same steps in the same order (descriptors 0–2, its own session and terminal,
//!     capabilities dropped and checked, `no_new_privs`, the job's rlimits, working
//!     directory, every other descriptor closed, signals reset, exec). A step that fails
//!     ends that guest with exit 126 and one report line naming the step, with the same
//!     stage and text on both paths; and a run and a session's exec report the same
//!     enforcement list for the same limits.
//!     (pinned by: tests/it/one_path.rs::g21_*)
//! # Non-guarantees
//! Kernel vulnerabilities are out of reach of any of these mechanisms. A pooled sandbox's
//! `/etc` files were bound or copied when it was built: a host file replaced (not edited) in
//! between, or any change to a copied one, is seen as it was. Pooling moves the sandbox's setup off the run's path, not off the CPU: on
//! a machine whose cores are busy, runs back to back wait for their replacements. The fork server is a
//! copy of the program as it was when [`ForkServer::start`] ran: what the program held in
//! memory by then, other than its command line and environment strings, is in the server
//! and in every helper (and run's pid 1) forked from it, where G11 keeps it from the guest;
//! calling it first in `main`, before any secret is read, is the caller's part. Its limits,
//! umask and working directory are those of that moment too, not later changes. A [`PROTECTED`] path
//! that does not exist in a read-write workspace can be created by the guest during the run
//! and exists on the host until the run ends (blocking it would need a mount point, an
//! empty file left in the user's directory); only the workspace's top level is covered. A
//! supervisor that is SIGKILLed sweeps nothing itself: its run's sweep, recorded before the
//! guest started, is finished by [`finish_killed_sweeps`] (the CLI's next run or `stockade
//! gc`), and until then what the guest planted is on the host. Landlock ABI 7 cannot
//! restrict pathname unix sockets (a later ABI can): the view does not contain host sockets,
//! and those inside a workspace are covered when the run starts, so a socket or fifo a host
//! process creates in the workspace during the run is reachable (sandbox-runtime blocks unix
//! sockets with seccomp instead, which would also break the guest's own). `RLIMIT_NPROC` (the fallback without a
//! cgroup) counts every process of the guest's host uid. Through the id-mapped workspace the
//! guest acts as the owner of root's files there (that is the point: it can edit the
//! project); files there owned by any other host uid (including `nobody` itself) map to no
//! one, and are reachable only through their "other" permission bits. Timing and cache side channels
//! between the guest and the host remain.
//!
//! # Failure behaviour
//! A misbehaving guest is a normal outcome reported in the [`Report`]; a host that cannot
//! enforce a mechanism yields [`RunError::Unsupported`] naming it.
//!
//! # Unsafe
//! Only in `src/sys/` (one file per syscall family), each block with a `// SAFETY:` comment;
//! counted by `cargo xtask tidy`. Between fork and exec in a multi-threaded supervisor only
//! `fcntl` runs; all other setup happens in the single-threaded helper, which is either a
//! fresh exec, a fork of a supervisor that was checked to have one thread, or a clone of the
//! single-threaded fork server. Descriptor passing to the server (`SCM_RIGHTS`) goes through
//! rustix's safe `sendmsg`/`recvmsg`.
//!
//! # Ambient authority
//! Spawns the helper binary (or forks this process, see [`Helper::fork`], or asks the
//! [`ForkServer`] to), reads
//! `/proc/self/cgroup` and `/proc/self/status`, creates and removes per-run cgroups
//! under this process's own cgroup, and opens the workspace path the job names.
//!
//! # Feature flags
//! None.
//!
//! # Invariants
//! Stated as absences: no allocation between fork and exec in a multi-threaded supervisor
//! (a fork launch happens only from a single-threaded one); no host path
//! in the view that the job did not grant besides the read-only system directories; no
//! inherited environment.
//!
//! [`Report`]: stockade_protocol::Report

#![deny(unsafe_code)]

mod cgroup;
mod child;
mod confine;
mod fdpass;
mod forkserver;
mod helper;
mod home;
mod launch;
mod pool;
mod session;
mod session_init;
mod spec;
mod supervisor;
mod sys;

use std::path::{Path, PathBuf};

pub use helper::{NOBODY, PROTECTED, helper_main};
pub use home::{HomeMount, disk_usage, unmount_under};
pub use session::{
    ExecOptions, ExecStarted, ProcessSession, SessionConfig, SessionProcess, SessionUsage, Terminal, UsageMeter,
};
pub use stockade_hostfs::{Finished as FinishedSweep, Swept, files, stage, state_dir, watch};
use stockade_protocol::{Job, LiveIo, Report};

/// The window size (rows, columns) of the terminal `fd` is, if it is one and has a size:
/// for [`ProcessTier::tty_size`] from the supervisor's own terminal.
#[must_use]
pub fn terminal_size(fd: std::os::fd::BorrowedFd<'_>) -> Option<(u16, u16)> {
    sys::tty::window_size(fd)
}

/// This process's own terminal in raw mode (`stockade session exec -it`), as `docker exec -it` puts it, so that each
/// keystroke (Ctrl-C included) goes to a remote pseudo-terminal as typed; its settings are
/// restored when this is dropped.
#[derive(Debug)]
pub struct RawTerminal {
    fd: std::os::fd::OwnedFd,
    saved: rustix::termios::Termios,
}

impl RawTerminal {
    /// Raw mode for the terminal on `fd` (a duplicate of it is kept to restore it).
    pub fn enter(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<Self> {
        let fd = fd.try_clone_to_owned()?;
        let saved = sys::tty::make_raw(std::os::fd::AsFd::as_fd(&fd))?;
        Ok(Self { fd, saved })
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        let _ = sys::tty::restore(std::os::fd::AsFd::as_fd(&self.fd), &self.saved);
    }
}

/// Where [`ProcessTier::run_live`] binds a grants directory in the guest's view.
pub const GRANTS_GUEST_DIR: &str = "/run/stockade";

/// Where a session's home (a host directory the session's owner made for it) is in the
/// view: read-write, the working directory and `HOME` of every exec that names no other.
pub const SESSION_HOME: &str = "/home/user";

/// Default size of each private tmpfs (`/tmp`, `/dev/shm`): 64 MiB.
///
/// tmpfs pages are charged to the run's memory cgroup where there is one; the cap bounds disk
/// fill where there is not.
pub const DEFAULT_TMPFS_BYTES: u64 = 64 << 20;

/// The landlock ABI required by default: 7. ABI 6 brought abstract-socket and signal
/// scoping; ABI 7 adds audit logging. ABI 9 (pathname unix sockets) is opt-in.
pub const DEFAULT_LANDLOCK_ABI: u8 = 7;

/// How a run's helper starts: by executing a helper binary, or by forking the calling
/// process when it is single-threaded (one program start fewer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Helper(launch::Mode);

impl Helper {
    /// Executes the current executable, which must call [`helper_main`] first thing in `main`.
    pub fn current_exe() -> std::io::Result<Self> {
        std::env::current_exe().map(|p| Self(launch::Mode::Exec(p)))
    }

    /// Executes the helper binary at `path` (the crate's `stockade-process-helper`, or any
    /// binary that calls [`helper_main`]).
    #[must_use]
    pub fn at(path: impl Into<PathBuf>) -> Self {
        Self(launch::Mode::Exec(path.into()))
    }

    /// Forks the helper, with no exec: about 1 ms faster per run. Through the [`ForkServer`]
    /// when this process started one; otherwise by forking the calling process, which is
    /// sound only while it has exactly one thread, checked at every launch
    /// (`/proc/self/status`): a launch from a multi-threaded process without a fork server
    /// fails with [`RunError::Misconfigured`]. Without a server, the helper and the run's
    /// pid 1 are copies of the calling process's memory as it is at that launch (secrets
    /// included); the guest shares none of it (it is a fresh exec, and landlock forbids it
    /// to trace or read the memory of the helper or the run's pid 1, neither of which is
    /// dumpable under root), but a program that holds secrets should start a
    /// [`ForkServer`] or use [`Helper::prefer_fork`], which executes instead.
    #[must_use]
    pub fn fork() -> Self {
        Self(launch::Mode::Fork(None))
    }

    /// Forks through the [`ForkServer`] when one is running, and otherwise executes this
    /// helper binary: never a fork of the calling process, which by the time it launches
    /// may hold what the sandbox must not (an API key it read), even if only in memory the
    /// guest cannot read.
    #[must_use]
    pub fn prefer_fork(self) -> Self {
        match self.0 {
            launch::Mode::Exec(p) => Self(launch::Mode::Fork(Some(p))),
            fork @ launch::Mode::Fork(_) => Self(fork),
        }
    }

    /// The helper binary this executes, if any.
    #[must_use]
    pub fn path(&self) -> Option<&Path> {
        match &self.0 {
            launch::Mode::Exec(p) | launch::Mode::Fork(Some(p)) => Some(p),
            launch::Mode::Fork(None) => None,
        }
    }
}

/// The fork server: a small single-threaded process, started first thing in `main`, that
/// forks each run's helper on request. With it, a multi-threaded program (a tokio server, an
/// agent) launches runs with [`Helper::fork`] or [`Helper::prefer_fork`] without executing
/// the helper binary again.
///
/// ```no_run
/// // First in `main`:
/// stockade_process::helper_main(); // when the binary is also the exec fallback
/// stockade_process::ForkServer::start().expect("single-threaded at the start of main");
/// // ... then start the async runtime, read configuration and keys, serve ...
/// ```
///
/// What the server holds, and so what a run's helper can hold, is what this process was
/// when it started: so call it before any secret exists in memory (before reading keys,
/// files or configuration), which is the caller's part of the contract. Enforced here: it
/// starts only while the process has one thread; it overwrites its copy of the command line
/// and environment strings at once (an API key passed in the environment is not in its
/// memory); it keeps `/dev/null` as descriptors 0–2 and its socket as 3, and no other
/// descriptor; it dies with this process (parent-death SIGKILL, and the end of its socket);
/// and each helper it starts is this process's own child, confined exactly as a forked
/// helper (G11). A server that is gone (killed from outside) fails the launch that finds out
/// with a [`RunError::Internal`] naming it; later launches take the fallback. A process
/// forked from this one after `start` does not use it.
#[derive(Debug)]
#[non_exhaustive]
pub struct ForkServer;

impl ForkServer {
    /// Starts this process's fork server, or returns the running one's pid; it returns once
    /// the server has closed what it inherited and scrubbed its copy of the environment. Fails
    /// with [`RunError::Misconfigured`] when the process already has more than one thread.
    pub fn start() -> Result<u32, RunError> {
        forkserver::start().map(|s| s.pid)
    }

    /// Ends the server this process started, and reaps it (its socket is shut down, and it
    /// is waited for, killed if it has not left within two seconds). Call it last thing in
    /// `main`, or from a guard there: the server dies with this process in any case, but only
    /// this process can reap it, and without this it is left a zombie for the machine's
    /// PID 1, which in a container may never reap. Launches after it take the fallback.
    pub fn stop() {
        forkserver::stop();
    }

    /// Makes the next launch through the server its last: the server becomes that run's
    /// helper (in its own process, this process's child, confined as in G11) instead of
    /// cloning one, and launches after it take the fallback. For a program that launches
    /// one run and exits (a one-shot CLI), this saves a clone and the server's exit and
    /// reaping; [`ForkServer::stop`] then has nothing to do. Returns whether a server was
    /// running to take the launch.
    pub fn hand_over_next() -> bool {
        forkserver::hand_over_next()
    }

    /// The running server's pid, if this process started one and it is still usable.
    #[must_use]
    pub fn pid() -> Option<u32> {
        forkserver::running().map(|s| s.pid)
    }
}

/// Launching a run failed before the guest could start: the one error every tier returns
/// (`stockade_protocol::RunError`). [`RunError::Exhausted`] here means the host, or the
/// supervisor's own cgroup, is out of processes or memory (`EAGAIN`, `ENOMEM`) and the run's
/// helper could not be started: nothing of the run exists. (A sandbox process that cannot
/// fork later in the start is a [`stockade_protocol::Status::FailedToStart`] report naming
/// the same error.)
pub use stockade_protocol::RunError;

/// Registers `fd` with the tokio reactor for readability (for a crate that allows no
/// `unsafe`: the files API's directory watch, whose inotify descriptor this owns; the E2B
/// server's watch for a client closing its side, on a second descriptor of its socket).
pub fn async_readable(fd: std::os::fd::OwnedFd) -> std::io::Result<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>> {
    sys::process::register_readable(fd)
}

/// The process tier. Defaults: every mechanism required, 64 MiB tmpfs, cgroups detected.
#[derive(Debug, Clone)]
pub struct ProcessTier {
    helper: launch::Mode,
    best_effort: bool,
    tmpfs_bytes: u64,
    cgroup_v2_dir: Option<PathBuf>,
    landlock_abi: u8,
    cgroups: bool,
    tty: bool,
    tty_size: Option<(u16, u16)>,
    pool: Option<std::sync::Arc<pool::Pool>>,
    fail_step: Option<u8>,
}

impl ProcessTier {
    /// A tier that launches runs through `helper`.
    #[must_use]
    pub fn new(helper: Helper) -> Self {
        Self {
            helper: helper.0,
            best_effort: false,
            tmpfs_bytes: DEFAULT_TMPFS_BYTES,
            cgroup_v2_dir: None,
            landlock_abi: DEFAULT_LANDLOCK_ABI,
            cgroups: true,
            tty: false,
            tty_size: None,
            pool: None,
            fail_step: None,
        }
    }

    /// Runs even when landlock cannot be fully enforced, listing what is missing in the
    /// report. Namespaces, the view and seccomp stay hard requirements.
    #[must_use]
    pub fn best_effort(mut self) -> Self {
        self.best_effort = true;
        self.repool()
    }

    /// Requires landlock ABI `abi` (default 7): every access right, network control and
    /// scope of that ABI is handled, and a kernel that lacks any of them fails the run
    /// (unless [`best_effort`](Self::best_effort)).
    #[must_use]
    pub fn landlock_abi(mut self, abi: u8) -> Self {
        self.landlock_abi = abi;
        self.repool()
    }

    /// Limits memory and processes with `RLIMIT_AS` and `RLIMIT_NPROC` only, even where a
    /// per-run cgroup could be created. A little faster to start (no cgroup to make, join and
    /// remove: about 0.45 ms a run on the project's VM), at the price of per-process rather
    /// than per-run accounting and no out-of-memory report. The report says which mechanism
    /// limited memory.
    #[must_use]
    pub fn without_cgroups(mut self) -> Self {
        self.cgroups = false;
        self.repool()
    }

    /// For tests: every guest of this tier's runs and sessions fails step `step` of its start
    /// (by its number, 1 to 11: the steps of `sys::spawn`), as if the step's call had returned `EPERM`,
    /// and the run or exec reports it as such a failure would be reported.
    #[doc(hidden)]
    #[must_use]
    pub fn fail_guest_step(mut self, step: u8) -> Self {
        self.fail_step = Some(step);
        self
    }

    /// Gives each run a terminal: the guest's stdin, stdout and stderr are one private
    /// pseudo-terminal (echo off), which is its controlling terminal, and `/dev/tty` and the
    /// pty's own name, `/dev/pts/N`, exist in the view (so `tty` and `ttyname()` name it; the
    /// pty stays the supervisor's user's, so a root supervisor's guest, `nobody`, opens it
    /// through `/dev/tty` only). Output is read from the terminal, so the report's stdout
    /// holds stdout and stderr interleaved, with the terminal's line endings (`\r\n`), and
    /// its stderr is empty; the job's stdin bytes are typed in, followed by end-of-file
    /// (input lines longer than the terminal's 4 KiB line buffer are cut). No other pty can
    /// be opened in the view.
    #[must_use]
    pub fn tty(mut self) -> Self {
        self.tty = true;
        self
    }

    /// Sets the window size (rows, columns) of each run's terminal ([`tty`](Self::tty)), as
    /// `docker run -t` passes on its client's: `stty size`, `$COLUMNS`-less programs and
    /// `shutil.get_terminal_size()` see it. Without it the size is 0x0, as of a pty nobody
    /// sized. [`terminal_size`] reads a terminal's.
    #[must_use]
    pub fn tty_size(mut self, rows: u16, cols: u16) -> Self {
        self.tty_size = Some((rows, cols));
        self
    }

    /// Sets the size of each private tmpfs.
    #[must_use]
    pub fn tmpfs_bytes(mut self, bytes: u64) -> Self {
        self.tmpfs_bytes = bytes.max(1 << 20);
        self.repool()
    }

    /// Uses a delegated cgroup v2 directory (writable by this process, with the memory and
    /// pids controllers enabled for its children) for per-run cgroups.
    #[must_use]
    pub fn cgroup_v2_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cgroup_v2_dir = Some(dir.into());
        self.repool()
    }

    /// Keeps `n` sandboxes built ahead of their jobs (see G15), so that a run skips the
    /// namespaces, the cgroup, the view and the guest's confinement, which are ready when the
    /// job arrives: each sandbox serves exactly one run and is replaced at once, while that
    /// run goes on. A pool serves runs through [`run`](Self::run) and
    /// [`run_live`](Self::run_live) without grants, on a tier without [`tty`](Self::tty),
    /// with a queue of `n` per workspace (none, or a directory and its access) for the 4 most
    /// recently used; a waiting sandbox is used only if its view was built from the same
    /// inspection of the workspace that the run makes as it starts (else it is replaced), so
    /// a pooled run sees what a one-shot run would. Every other run is one-shot, with the same
    /// mechanisms. Clones of this tier share the pool. Sandboxes are built at the first run
    /// (or by [`prebuild`](Self::prebuild)); those left when the last clone is dropped are
    /// killed and reaped and their cgroups removed, and a SIGKILLed owner's die with it
    /// (parent-death signals), leaving only cgroups that the next run removes
    /// ([`reap_stale_cgroups`]). `n` is at least 1. A builder call after this one that
    /// changes the sandboxes (landlock, cgroups, tmpfs, best effort) starts a new, empty pool
    /// of the same size.
    #[must_use]
    pub fn pool(mut self, n: usize) -> Self {
        self.pool = Some(pool::Pool::new(n.max(1)));
        self
    }

    /// A builder call that changes the sandboxes this tier builds gives a tier with a pool a
    /// new, empty pool of the same size, so a pool never holds sandboxes of another
    /// configuration (clones made before the call keep the old one).
    fn repool(mut self) -> Self {
        if let Some(p) = &self.pool {
            self.pool = Some(pool::Pool::new(p.size()));
        }
        self
    }

    /// Builds the pool's sandboxes now for jobs with `workspace` (or none), which are
    /// otherwise built at the first such run, and returns how many wait. They are built on
    /// the calling thread, and a sandbox's processes die with the thread that started them
    /// (parent-death signal) unless the helper comes from the [`ForkServer`]: call it from a
    /// thread that outlives the runs, such as `main`. A tier without a pool returns 0.
    pub fn prebuild(&self, workspace: Option<(&Path, stockade_protocol::Access)>) -> Result<usize, RunError> {
        let Some(pool) = &self.pool else { return Ok(0) };
        let opened = match workspace {
            Some((path, access)) => {
                Some((stockade_hostfs::open_workspace(path)?, access == stockade_protocol::Access::ReadWrite))
            }
            None => None,
        };
        let (view, _) = pool::View::inspect(opened.as_ref().map(|(ws, rw)| (ws, *rw)), true)?;
        let key = view.workspace.clone();
        // One built by hand, so that an error is returned rather than swallowed by `refill`.
        if pool.ready(&key) == 0 {
            let first = pool.take(self, &view)?;
            pool.put_back(first);
        }
        pool.refill(self, &key);
        Ok(pool.ready(&key))
    }

    /// The pool's size per workspace and how many sandboxes wait now for jobs without a
    /// workspace, if this tier has a pool.
    #[must_use]
    pub fn pool_status(&self) -> Option<(usize, usize)> {
        self.pool.as_ref().map(|p| (p.size(), p.ready(&None)))
    }

    /// How many pre-built sandboxes wait for jobs with the workspace `path` (resolved as a
    /// run resolves it) and that access, if this tier has a pool.
    #[must_use]
    pub fn pool_ready_for(&self, path: &Path, access: stockade_protocol::Access) -> Option<usize> {
        let pool = self.pool.as_ref()?;
        let path = stockade_hostfs::resolve_workspace(path).ok()?;
        Some(pool.ready(&Some((path, access == stockade_protocol::Access::ReadWrite))))
    }

    /// How this tier starts each run's helper.
    #[must_use]
    pub fn helper(&self) -> Helper {
        Helper(self.helper.clone())
    }

    /// Runs `job` and reports what happened. A misbehaving guest is an `Ok` report; an
    /// `Err` means the run could not be set up as required.
    pub async fn run(&self, job: &Job) -> Result<Report, RunError> {
        supervisor::run(self, job, None, None, LiveIo::default()).await
    }

    /// [`run`](Self::run), with what a granted run adds, and with live stdio:
    ///
    /// - `grants_dir`: the host directory bound read-only (nosuid, nodev) at
    ///   [`GRANTS_GUEST_DIR`], where the guest may read and execute but not write. This is how
    ///   a broker's socket, its client and the job's data grants reach the guest
    ///   (`stockade-runtime` serves them); this crate only makes the directory visible. The
    ///   directory must be absolute and must neither contain nor lie inside the workspace.
    /// - `loopback` (with a grants directory): a TCP listener on `127.0.0.1:PORT` in the run's
    ///   own network namespace, handed to it for the host to serve (a model grant, for clients
    ///   that speak only TCP). The run's loopback is brought up, landlock lets the guest
    ///   connect to that one port (and bind none), and the listener is created by the helper
    ///   and held by neither init nor the guest; the host takes it with `pidfd_getfd` as soon
    ///   as it is reported. The guest can reach nothing through it but what the host serves
    ///   on it.
    /// - `io`: `io.stdin`, if any, is streamed to the guest as it reads (instead of the job's
    ///   stdin bytes; the guest still holds only a pipe), and `io.stderr`, if any, sees the
    ///   guest's stderr as it arrives (the report still captures it within budget). A
    ///   streamed stdin and [`tty`](Self::tty) cannot be combined.
    pub async fn run_live(
        &self,
        job: &Job,
        grants_dir: Option<&Path>,
        loopback: Option<Loopback>,
        io: LiveIo,
    ) -> Result<Report, RunError> {
        if loopback.is_some() && grants_dir.is_none() {
            return Err(RunError::Misconfigured("a loopback listener needs a grants directory".into()));
        }
        supervisor::run(self, job, grants_dir, loopback, io).await
    }

    /// Makes a live sandbox that serves many execs ([`ProcessSession::exec`]) and keeps its
    /// state between them (G17): one pid namespace, view and cgroup for the session's whole
    /// life, and every exec's guest confined exactly as a run's guest.
    pub async fn session(&self, config: SessionConfig) -> Result<ProcessSession, RunError> {
        session::create(self, config).await
    }
}

/// A listener the host serves inside one run's network namespace (see
/// [`ProcessTier::run_live`]).
pub struct Loopback {
    port: u16,
    serve: Box<dyn FnOnce(std::net::TcpListener) + Send>,
}

impl Loopback {
    /// Listen on `127.0.0.1:port` in the run's network namespace, and give the listener to
    /// `serve` (called once, from the supervisor's task, while the run lasts; never if the
    /// run ends before the listener was taken).
    #[must_use]
    pub fn new(port: u16, serve: impl FnOnce(std::net::TcpListener) + Send + 'static) -> Self {
        Self { port, serve: Box::new(serve) }
    }
}

impl std::fmt::Debug for Loopback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loopback").field("port", &self.port).finish_non_exhaustive()
    }
}

/// What this host can enforce, for `stockade doctor`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Probe {
    /// The kernel's landlock ABI (0 if none).
    pub landlock_abi: i32,
    /// Whether seccomp filters can be installed.
    pub seccomp: bool,
    /// Whether this process can create user namespaces, or what blocks it.
    pub user_namespaces: Result<(), String>,
    /// The cgroup controllers per-run cgroups can use, or why none.
    pub cgroups: Result<String, String>,
}

/// Probes the host (reads `/proc`, asks the kernel for the landlock ABI, and tries to
/// create a user namespace in a short-lived child process).
#[must_use]
pub fn probe() -> Probe {
    sys::probe::probe()
}

/// A TCP listener on `127.0.0.1:port` inside the network namespace of process `pid`, such
/// as a container's: a model grant's `OPENAI_BASE_URL` for the docker tier, composed by
/// `stockade-runtime`. Joins the namespace from a thread of its own for the one `bind`, so
/// the caller's threads keep theirs; needs `CAP_SYS_ADMIN` over the namespace (root for an
/// engine's containers).
///
/// The process is pinned by a pidfd before its namespace is opened and must be alive after;
/// a caller that learned `pid` from elsewhere (an engine's inspect) confirms afterwards that
/// the pid still names the process it meant. Refused with an error: a process in this
/// process's own network namespace (the listener would be on the host's loopback), or one
/// that ended.
pub fn listen_in_netns(pid: u32, port: u16) -> std::io::Result<std::net::TcpListener> {
    sys::net::listen_in_netns(pid, port)
}

/// Connects to `127.0.0.1:port` in the network namespace of process `pid` (a session's
/// init: [`ProcessSession::netns_pid`]), as [`listen_in_netns`] listens there. Blocking
/// (a thread joins the namespace): call it off the async workers.
pub fn connect_in_netns(pid: u32, port: u16) -> std::io::Result<std::net::TcpStream> {
    sys::net::connect_in_netns(pid, port)
}

/// Sends SIGKILL to the process group `pgid`: a host helper that stockade started as the
/// leader of a group of its own (`Command::process_group(0)`), such as a host MCP server
/// (`stockade-runtime`'s `mcp`), and everything it started. Refuses 0 and 1 (the caller's
/// own group, and every process). A group that is already empty is not an error.
pub fn kill_process_group(pgid: u32) -> std::io::Result<()> {
    let pgid = libc::pid_t::try_from(pgid).map_err(|_| std::io::Error::other("no such process group"))?;
    if pgid <= 1 {
        return Err(std::io::Error::other("refusing to signal process group 0 or 1"));
    }
    match sys::process::kill(-pgid, libc::SIGKILL) {
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
        r => r,
    }
}

/// Makes this process a child subreaper (`PR_SET_CHILD_SUBREAPER`), so that what a killed
/// run leaves is reaped here: a run's pid 1 is its helper's child, and when a deadline, a
/// cancelled call or a session's kill ends the run, the helper can die first; its pid 1 then
/// becomes this process's child, and the run's end reaps it (after the helper), rather than
/// leaving it a zombie for the machine's PID 1, which in a container where stockade itself
/// is PID 1, or any PID 1 that does not reap, it would stay. Call it once, early in a
/// program that supervises runs (the `stockade` CLI does); other orphaned descendants of
/// this process then become its children too, and are its to reap.
pub fn adopt_orphaned_runs() -> std::io::Result<()> {
    sys::caps::set_child_subreaper()
}

/// Per-run cgroups left behind by supervisors that are gone (a `kill -9` gives a supervisor
/// no chance to remove them), under this process's own cgroups or `v2_dir`. Names carry the
/// owner's pid and start time, so a live supervisor's cgroups are never listed.
#[must_use]
pub fn stale_cgroups(v2_dir: Option<&std::path::Path>) -> Vec<std::path::PathBuf> {
    cgroup::stale(v2_dir)
}

/// Removes [`stale_cgroups`], killing anything still in them, and returns what it removed.
/// Every run does this first; `stockade gc` does it on demand.
pub fn reap_stale_cgroups(v2_dir: Option<&std::path::Path>) -> Vec<std::path::PathBuf> {
    cgroup::reap_stale(v2_dir)
}

/// Finishes the sweep of every read-write run whose supervisor was killed before it swept
/// (a run records its sweep in [`stockade_hostfs::sweeps_dir`] before its guest starts, and
/// removes the record once it swept): what the guest planted where a protected path was
/// absent is removed, unless it changed after the run could have written it, which is left
/// and listed (see [`stockade_hostfs::finish_killed_sweeps`]). A record whose workspace a run
/// holds is left for later. `stockade run`, `agent` and `mcp` do this as they start, and
/// `stockade gc` on demand; an embedder calls it at its start.
#[must_use]
pub fn finish_killed_sweeps() -> Vec<stockade_hostfs::Finished> {
    stockade_hostfs::sweeps_dir().map(|d| stockade_hostfs::finish_killed_sweeps(&d)).unwrap_or_default()
}

/// The tier's seccomp policy as an OCI runtime seccomp profile (the format of Docker's
/// `--security-opt seccomp=`), so that a container engine can refuse what this tier
/// refuses; a test of this crate keeps the docker tier's copy (`stockade-docker/src/seccomp.json`) current.
#[must_use]
pub fn seccomp_oci_profile() -> serde_json::Value {
    confine::oci_profile()
}

/// The seccomp profile for a container that runs stockade itself (`stockade serve`): what this
/// tier's guests may call and what its owner needs beyond that (namespaces, mounts, the new
/// root), everything else refused; `deploy/seccomp/stockade-serve.json` is this, kept current
/// by a test of this crate.
#[must_use]
pub fn seccomp_owner_profile() -> serde_json::Value {
    confine::owner_profile()
}

#[doc(hidden)]
/// The seccomp policy as text, for review and snapshot tests.
#[must_use]
pub fn seccomp_policy_text() -> String {
    confine::seccomp_summary()
}
