//! What stockade's Python and Node packages share: runs, policy decisions, MARK and sessions
//! over the crates, so that neither host language re-implements any of it. Each binding is a
//! thin layer of its own FFI (pyo3 in `stockade-python`, napi in `stockade-node`) over this
//! crate: options and values cross as JSON, a host function crosses as a [`HostFn`], and a
//! refusal crosses as a [`Refused`] that the binding raises (Python) or rejects with (Node) as
//! its typed error. Nothing here knows either language.
//!
//! # Position in the stack
//! Depends on: `stockade-runtime` (the process and wasm tiers, grants, sessions, the network
//! grant) and `stockade-agent` (the one mapping from a language to a job, `run_code`'s).
//! Used by: `stockade-python`, `stockade-node`. Nothing under `crates/` depends on it: the
//! bindings are a floor above the CLI.
//! API boundary: internal to the two bindings.
//!
//! # Threat model
//! Trusted: the host program that calls the binding (its options, its policy, its host
//! functions), as a Rust caller of the runtime is. Attacker-controlled: everything a guest
//! produces (its output, its report's texts, its grant calls' arguments), exactly as in the
//! crates: a binding adds no path by which any of it is read as trusted.
//!
//! # Guarantees
//! G1. No refusal can be read as a value: [`run`] returns a [`Ran`] only for an
//!     [`Outcome::Verified`](stockade_runtime::verify::Outcome) outcome; every other outcome,
//!     and every failure to start, is a [`Refused`] with its kind, its one-line message and,
//!     where the run happened, its report. A host check can only turn a verified value into
//!     an `AssertionFailed` refusal, never the reverse.
//!     (pinned by: tests/it/main.rs::g1_*)
//! G2. A guest's crash, timeout or flood is a refusal within the run's deadline, never a hang
//!     of the host interpreter: runs execute on this crate's own runtime ([`runtime`]), off
//!     the caller's thread, and each has the deadline its options give (10 s by default).
//!     (pinned by: tests/it/main.rs::g2_*)
//! G3. A host function runs only with the permit the grant policy minted for exactly that
//!     call (the runtime's broker decides; without a policy every call is denied).
//!     (pinned by: tests/it/main.rs::g3_*)
//! G4. An asynchronous binding call runs on this crate's run threads ([`spawn_run`]), never
//!     on a pool the host shares with its own I/O (Node's libuv pool): a run holds its thread
//!     for as long as it lasts, so runs there would starve the host's file calls, and a host
//!     function waiting on one of those would deadlock its run. At most [`MAX_RUN_THREADS`]
//!     run at once (more wait in order); a call goes to the thread that went idle last; a
//!     panic inside stockade is the call's `SandboxError` refusal ([`caught`]), never a
//!     Promise left pending, and its thread goes on. The packages' own tests drive it as a
//!     user meets it: Node's "runs hold none of libuv's pool" and Python's
//!     `test_runs_hold_none_of_the_loops_default_executor`.
//!     (pinned by: src/threads.rs::g4_*)
//!
//! # Non-guarantees
//! A host function is the host's code: what it does with the arguments a guest sent is the
//! host's to judge, as with any grant.
//!
//! # Failure behaviour
//! Bad options are a [`Refused`] of kind `InvalidOptions` naming the option, before anything
//! runs. A host this crate cannot enforce on (no user namespaces, no guest built) is a
//! `Unsupported` refusal naming the mechanism.
//!
//! # Unsafe
//! None: `#![forbid(unsafe_code)]`.
//!
//! # Ambient authority
//! Starts the process tier's helper (the binary [`set_helper`] names, or
//! `STOCKADE_HELPER`), reads the wasm tier's guests from their directory, and keeps
//! sessions under stockade's state directory.
//!
//! # Feature flags
//! None.
//!
//! # Invariants
//! One runtime, one process-tier sandbox and one wasm-tier sandbox per host process, made
//! on first use.

#![forbid(unsafe_code)]

mod mark;
mod policy;
mod run;
mod session;
mod threads;

pub use mark::{mark, system_prompt};
pub use policy::BoundPolicy;
pub use run::{Executed, HostFn, Ran, RunOptions, Size, Value, host_function, run};
pub use session::{BoundSession, MAX_FILE_BYTES, SessionOptions};
pub use stockade_runtime::FunctionGrant;
pub use threads::{IDLE_EXIT, Job, MAX_RUN_THREADS, RunThreads, caught, spawn_run};

use std::path::PathBuf;
use std::sync::OnceLock;

/// A refusal, as the bindings raise it: a kind (the exception's or error's class name), a
/// one-line message, and the run's report as JSON when the run happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// `Timeout`, `OutputTooLarge`, `OutOfMemory`, `NonZeroExit`, `AssertionFailed`, ...
    pub kind: &'static str,
    /// What happened, in one line.
    pub message: String,
    /// The report (JSON), if the run happened.
    pub report: Option<String>,
}

impl Refused {
    /// A refusal of `kind` with no report.
    #[must_use]
    pub fn new(kind: &'static str, message: impl Into<String>) -> Self {
        Self { kind, message: message.into(), report: None }
    }

    /// Bad options: what was asked cannot be run as asked.
    #[must_use]
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new("InvalidOptions", message)
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.message)
    }
}

impl std::error::Error for Refused {}

/// Every kind a [`Refused`] can have, for the bindings' error classes (and the test that
/// each has one).
pub const REFUSAL_KINDS: [&str; 15] = [
    "InvalidOptions",
    "Unsupported",
    "FailedToStart",
    "EnforcementMissing",
    "Timeout",
    "CpuLimit",
    "OutOfMemory",
    "OutputTooLarge",
    "Killed",
    "Trapped",
    "NonZeroExit",
    "MalformedOutput",
    "AssertionFailed",
    "GrantDenied",
    "SandboxError",
];

static HELPER: OnceLock<PathBuf> = OnceLock::new();

/// Names the process tier's helper binary (`stockade-process-helper`, which the packages
/// carry); the first call wins. Without one, `STOCKADE_HELPER` names it.
pub fn set_helper(path: impl Into<PathBuf>) {
    let _ = HELPER.set(path.into());
}

fn helper() -> Result<PathBuf, Refused> {
    if let Some(p) = HELPER.get() {
        return Ok(p.clone());
    }
    std::env::var_os("STOCKADE_HELPER").filter(|v| !v.is_empty()).map(PathBuf::from).ok_or_else(|| {
        Refused::new(
            "Unsupported",
            "the process tier needs its helper binary: the package carries stockade-process-helper, or set STOCKADE_HELPER",
        )
    })
}

/// The runtime every run and session call of a host process executes on: two workers,
/// started on first use, never the caller's thread.
///
/// # Panics
/// If the operating system refuses the runtime's threads at the first call.
#[allow(clippy::expect_used, reason = "a process that cannot start two threads cannot run anything")]
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("stockade-binding")
            .enable_all()
            .build()
            .expect("starting the bindings' runtime")
    })
}
