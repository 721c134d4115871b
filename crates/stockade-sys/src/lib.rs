//! Host process and cgroup facts, read from `/proc` and the cgroup filesystem: one reader of
//! each, shared by the tiers and the runtime (tiers may not depend on each other, and the
//! runtime enforces nothing, so these readers live below them all).
//!
//! - [`proc`]: the fields of `/proc/PID/stat` and a `Key:` line of `/proc/PID/status` (or
//!   `fdinfo`), a process's start time, this boot's id, this process's pid namespace,
//!   whether a process named by pid and start time is gone, whether this process runs as root,
//!   the mount points under a directory;
//! - [`cgroup`]: a process's cgroup path for a controller (v1) or the unified one (v2), and
//!   the out-of-memory kill counter of a memory cgroup.
//!
//! # Position in the stack
//! Depends on: no workspace crate, and no external one. Used by: `stockade-process`,
//! `stockade-docker`, `stockade-runtime`.
//! API boundary: internal to the workspace; [`proc`] and [`cgroup`].
//!
//! # Threat model
//! Trusted: the kernel's `/proc` and cgroup files. Attacker-controlled: the command name in
//! `/proc/PID/stat` (a guest names its own processes, with spaces and parentheses), and the
//! cgroup paths a container's processes sit in.
//! Out of scope: enforcement; every decision is the caller's.
//!
//! # Guarantees
//! G1. A process's start time is read after the last `)` of `/proc/PID/stat`, so no command
//!     name moves the fields; a pid that is gone reads as `None`, and [`proc::gone`] tells a
//!     reused pid from its first owner by the start time, and counts an exited process that
//!     is not yet reaped (a zombie) as gone.
//!     (pinned by: tests/it/sys.rs::g1_*)
//! G2. The cgroup readers find a controller's line by exact name in the comma list (v1), or
//!     the line with no controllers (v2), and read the `oom_kill` counter by its exact key;
//!     anything that does not parse is `None`, never a guess.
//!     (pinned by: tests/it/sys.rs::g2_*)
//! G3. [`proc::unix_socket_paths`] lists the path of every unix socket bound in this
//!     network namespace, and only those: a socket file left by a killed process is not
//!     among them, abstract names are left out.
//!     (pinned by: tests/it/sys.rs::g3_*)
//! G4. [`proc::mount_points_under`] lists the mount points at or under a directory, path
//!     components compared (a sibling sharing a prefix is not under it), the kernel's octal
//!     escapes undone, deepest first.
//!     (pinned by: tests/it/sys.rs::g4_*)
//!
//! # Non-guarantees
//! A pid and start time name one process of this boot and this pid namespace only: callers
//! that keep them across either must also keep [`proc::boot_id`] and
//! [`proc::pid_namespace`]. A reading is a moment's: the process may end right after.
//!
//! # Failure behaviour
//! Every reader returns `Option`: a missing file, a permission or a format it does not know
//! is `None`. Nothing panics on what it reads.
//!
//! # Unsafe
//! None: `#![forbid(unsafe_code)]`. (The process tier's system calls stay in its `sys`
//! module, the one place STYLE §5 allows them.)
//!
//! # Ambient authority
//! Reads `/proc` and `/sys/fs/cgroup`; writes nothing.
//!
//! # Feature flags
//! None.
//!
//! # Invariants
//! Stated as absences: no write, no system call beyond reading files, no dependency.

#![forbid(unsafe_code)]

pub mod cgroup;
pub mod proc;
