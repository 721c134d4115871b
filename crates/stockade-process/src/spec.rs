//! What the supervisor tells the helper, and what the helper reports back.
//!
//! Both ends are this crate's own code: the spec travels in one environment variable of the
//! helper (never of the guest), and reports travel as JSON lines on a pipe that the guest
//! never holds (it is close-on-exec in the guest, and pid 1 of the run is our helper).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use stockade_protocol::Mechanism;

/// Largest spec a helper takes: 128 KiB, the limit the kernel puts on one environment
/// string, and so on the spec of an executed helper as well.
pub(crate) const MAX_SPEC: usize = 128 << 10;

/// The environment variable that carries the spec to the helper.
pub(crate) const SPEC_VAR: &str = "STOCKADE_PROCESS_HELPER_SPEC";

/// Longest report line the supervisor reads: 8 KiB.
pub(crate) const MAX_REPORT_LINE: usize = 8 << 10;
/// Most report lines the supervisor reads from one run: 64.
pub(crate) const MAX_REPORT_LINES: usize = 64;

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Spec {
    pub(crate) program: String,
    pub(crate) args: Vec<String>,
    pub(crate) env: Vec<(String, String)>,
    /// Host path and whether it is writable.
    pub(crate) workspace: Option<(PathBuf, bool)>,
    /// In a read-write workspace, the directories pinned in place (bound writable onto
    /// themselves) and then the protected paths bound read-only onto themselves, relative to
    /// the workspace, and the line describing them (from `stockade_hostfs::Guarded`).
    #[serde(default)]
    pub(crate) pinned: Vec<String>,
    #[serde(default)]
    pub(crate) protected: Vec<String>,
    #[serde(default)]
    pub(crate) protected_detail: String,
    /// The device and inode of the workspace directory the supervisor opened and judged: the
    /// helper refuses to run unless the directory it mounted at `/workspace` is that one (a
    /// path re-resolved later can name another directory).
    #[serde(default)]
    pub(crate) workspace_id: Option<(u64, u64)>,
    /// Host directory bound read-only at [`crate::GRANTS_GUEST_DIR`] (the broker's socket,
    /// its client and the data grants).
    pub(crate) grants_dir: Option<PathBuf>,
    pub(crate) status_fd: i32,
    pub(crate) supervisor_pid: i32,
    /// The cgroup files the helper writes `0` (itself) to before anything else
    /// ([`crate::cgroup::Cgroup::join_files`]).
    pub(crate) cgroup_join: Vec<PathBuf>,
    pub(crate) rlimit_memory: bool,
    pub(crate) rlimit_processes: bool,
    pub(crate) limits: SpecLimits,
    pub(crate) hard: bool,
    pub(crate) landlock_abi: u8,
    /// stdin, stdout and stderr are a private pty, which becomes the guest's controlling
    /// terminal, and `/dev/tty` and its own `/dev/pts/N` are in the view.
    pub(crate) tty: bool,
    /// A model grant's port: the helper brings the run's loopback up, listens on
    /// `127.0.0.1:PORT` there for the supervisor ([`Msg::Listening`]), and landlock lets the
    /// guest connect to that port only.
    pub(crate) model_port: Option<u16>,
    /// A pre-built sandbox ([`crate::ProcessTier::pool`]): the guest process is confined
    /// (everything but its limits) before the job exists, then reads a [`PooledJob`] from this
    /// descriptor, and its program, arguments, environment and limits replace the spec's. The
    /// end of the descriptor with no job (the pool was dropped) ends the sandbox quietly.
    #[serde(default)]
    pub(crate) job_fd: Option<i32>,
    /// A session ([`crate::ProcessTier::session`]): `job_fd` is then a `SOCK_SEQPACKET`
    /// socket on which init takes [`SessionRequest`]s for as long as the session lives, and
    /// init forks one confined guest per exec instead of one guest for the run.
    #[serde(default)]
    pub(crate) session: bool,
    /// A host directory bound read-write at [`crate::SESSION_HOME`] (a session's home), the
    /// guest's working directory and `HOME` unless an exec names others.
    #[serde(default)]
    pub(crate) home: Option<PathBuf>,
    /// The host uid and gid a root supervisor's guest runs as (a session's own,
    /// [`crate::SessionConfig::guest_id`]); [`crate::NOBODY`] when `None`. Inside, the guest
    /// is `nobody` either way.
    #[serde(default)]
    pub(crate) guest_id: Option<u32>,
    /// A step of the guest's start that fails as if its call had returned `EPERM`
    /// ([`crate::ProcessTier::fail_guest_step`], for tests).
    #[serde(default)]
    pub(crate) fail_step: Option<u8>,
}

/// What a session's init is asked on its socket. An `Exec` comes with four descriptors:
/// the exec's stdin, stdout and stderr, and its status pipe, on which the exec's guest
/// reports its confinement ([`Msg`] lines, as a run's guest does) and init, once it has
/// reaped the exec's process, its [`Msg::Exit`].
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum SessionRequest {
    Exec {
        id: u64,
        program: String,
        args: Vec<String>,
        env: Vec<(String, String)>,
        cwd: Option<String>,
        limits: SpecLimits,
        /// Descriptors 0–2 are a pseudo-terminal's slave: the guest makes it its controlling
        /// terminal (after `setsid`).
        #[serde(default)]
        tty: bool,
    },
    /// A signal to an exec's process group (the exec's guest leads a session of its own).
    Signal { id: u64, signal: i32 },
}

/// What a pre-built sandbox waits for: the job-specific part of a [`Spec`].
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PooledJob {
    pub(crate) program: String,
    pub(crate) args: Vec<String>,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) limits: SpecLimits,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SpecLimits {
    pub(crate) cpu_secs: u64,
    pub(crate) memory_bytes: u64,
    pub(crate) processes: u64,
    pub(crate) open_files: u64,
    pub(crate) file_size_bytes: u64,
    pub(crate) tmpfs_bytes: u64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum Msg {
    /// A mechanism is in force.
    Enforced { mechanism: Mechanism, detail: String },
    /// A mechanism was asked for but could not be applied (best effort only).
    Missing { mechanism: String, reason: String },
    /// Setup failed at `stage`; `unsupported` means the host cannot enforce it.
    Error { stage: String, unsupported: bool, message: String },
    /// The helper listens on the spec's model port, in the run's network namespace, on its
    /// descriptor `fd` (the supervisor takes a copy with `pidfd_getfd`).
    Listening { fd: i32 },
    /// A session's init has built the view and takes exec requests.
    Ready,
    /// A session's init forked an exec's guest, whose pid in the session's namespace is
    /// `pid` (the first line on the exec's status pipe, written by init).
    Started { pid: i32 },
    /// The guest ended.
    Exit { code: Option<i32>, signal: Option<i32>, cpu_us: u64, max_rss: u64 },
    /// The helper reaped the run's init, so no process of the run's pid namespace is left
    /// (the kernel reaps them all before pid 1 can be reaped). The helper's last line: what is
    /// left of the run is the helper itself and the namespaces its exit tears down.
    Ended,
}
