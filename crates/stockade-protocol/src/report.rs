//! The record of one run: how it ended, what it cost, what it wrote, and which enforcement
//! mechanisms were active.
//!
//! A tier (host code) writes the report; the guest influences only the values in it (exit
//! code, output bytes, timings). `stockade-verify` decides what a report proves.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::capture::Captured;

/// Longest failure reason a report carries: 4 KiB. Longer reasons are cut at a char boundary.
///
/// Reasons can quote guest-influenced text (a path, an error from the guest's loader).
pub const MAX_REASON_BYTES: usize = 4 << 10;

/// Which output stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", deny_unknown_fields)]
#[non_exhaustive]
pub enum Status {
    /// The program exited by itself.
    Exited {
        /// Its exit code.
        code: i32,
    },
    /// The program was killed by a signal that the supervisor did not send for a limit.
    Signaled {
        /// The signal number.
        signal: i32,
    },
    /// The wall-clock deadline passed and the run was killed.
    TimedOut,
    /// An output stream went over its budget and the run was killed.
    OutputLimit {
        /// The stream that went over.
        stream: Stream,
    },
    /// The run hit its memory limit.
    OutOfMemory,
    /// The CPU-time limit was reached (for the wasm tier: the fuel ran out).
    CpuLimit,
    /// A WebAssembly guest trapped (unreachable, stack overflow, an out-of-bounds access, a
    /// failed host call): the engine stopped it safely.
    Trapped {
        /// Which trap (at most [`MAX_REASON_BYTES`]).
        trap: String,
    },
    /// The run never started.
    FailedToStart {
        /// Why (at most [`MAX_REASON_BYTES`]).
        reason: String,
    },
}

impl Status {
    /// A `FailedToStart` status, with the reason cut to [`MAX_REASON_BYTES`].
    #[must_use]
    pub fn failed_to_start(reason: impl Into<String>) -> Self {
        Self::FailedToStart { reason: bounded_reason(reason.into()) }
    }

    /// A `Trapped` status, with the trap's description cut to [`MAX_REASON_BYTES`].
    #[must_use]
    pub fn trapped(trap: impl Into<String>) -> Self {
        Self::Trapped { trap: bounded_reason(trap.into()) }
    }
}

/// `reason`, cut to [`MAX_REASON_BYTES`] at a char boundary.
fn bounded_reason(mut reason: String) -> String {
    truncate_at_char(&mut reason, MAX_REASON_BYTES);
    reason
}

/// Cuts `s` to at most `max` bytes at a char boundary.
pub(crate) fn truncate_at_char(s: &mut String, max: usize) {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
}

/// An enforcement mechanism a tier can apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Mechanism {
    /// A user namespace; the guest is unprivileged on the host.
    UserNamespace,
    /// A pid namespace.
    PidNamespace,
    /// A mount namespace with a minimal filesystem view.
    MountNamespace,
    /// A network namespace with no route out.
    NetNamespace,
    /// An IPC namespace.
    IpcNamespace,
    /// A UTS namespace.
    UtsNamespace,
    /// Landlock filesystem and network rules.
    Landlock,
    /// A seccomp filter.
    Seccomp,
    /// `no_new_privs`.
    NoNewPrivs,
    /// Every capability dropped.
    CapabilitiesDropped,
    /// A cgroup v2 with memory and pid limits.
    Cgroup,
    /// Resource rlimits.
    Rlimits,
    /// A wall-clock deadline that kills the whole tree.
    Deadline,
    /// An output budget that kills the run when crossed.
    OutputBudget,
    /// WebAssembly fuel metering.
    WasmFuel,
    /// WebAssembly epoch interruption.
    WasmEpoch,
    /// WebAssembly store limits on memory and tables.
    WasmStoreLimits,
    /// A WASI preopened workspace: no path outside it; a read-write one holds no protected
    /// path, and what the guest creates where one was absent is removed after the run.
    WasmWorkspace,
    /// A container with networking disabled.
    ContainerNoNetwork,
    /// A container with a read-only root filesystem.
    ContainerReadOnlyRoot,
    /// A container with every capability dropped and no-new-privileges.
    ContainerNoCapabilities,
    /// A container with memory, cpu and pids limits.
    ContainerLimits,
    /// A workspace copied into a size-capped tmpfs volume, and (read-write) results copied
    /// back without following links and without touching protected paths.
    ContainerWorkspace,
    /// A grants broker: the guest reaches its granted data and functions only through
    /// policed calls, with no credential inside.
    GrantsBroker,
    /// The run's processes are the kernel's first out-of-memory victims (`oom_score_adj`
    /// 1000): a host short of memory loses the guest, never the supervisor or another host
    /// process.
    OomScore,
}

/// One mechanism that was active during a run, with a free-form detail (e.g. `abi 7`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Enforced {
    /// The mechanism.
    pub mechanism: Mechanism,
    /// What exactly was applied, for humans.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

/// How the detail of the record that lists what a read-write workspace run removed when it
/// ended begins (see [`Enforced::swept`]).
pub const SWEPT_DETAIL: &str = "removed after the run, created by the guest where a protected path was absent: ";

impl Enforced {
    /// A record that `mechanism` was active, with `detail`.
    #[must_use]
    pub fn new(mechanism: Mechanism, detail: impl Into<String>) -> Self {
        Self { mechanism, detail: detail.into() }
    }

    /// The record that `paths` (relative to the workspace), which the guest created where a
    /// protected path ([`crate::PROTECTED_PATHS`]) was absent, were removed after the run by
    /// `mechanism`.
    #[must_use]
    pub fn swept(mechanism: Mechanism, paths: &[String]) -> Self {
        Self::new(mechanism, format!("{SWEPT_DETAIL}{}", paths.join(" ")))
    }
}

/// The record of one run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Report {
    /// How the run ended.
    pub status: Status,
    /// Wall-clock time from start to the end of the last process, as measured by the host.
    #[serde(with = "micros")]
    pub wall: Duration,
    /// CPU time (user plus system), if the tier measured it.
    #[serde(default, with = "opt_micros", skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Duration>,
    /// Peak memory in bytes, if the tier measured it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_memory_bytes: Option<u64>,
    /// The captured stdout.
    pub stdout: Captured,
    /// The captured stderr.
    pub stderr: Captured,
    /// Every mechanism that was active.
    pub enforcement: Vec<Enforced>,
    /// The grant calls the guest made through the broker, if the run had grants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grants: Option<GrantsReport>,
    /// What a read-write workspace run removed when it ended: what the guest created where a
    /// protected path ([`crate::PROTECTED_PATHS`]) was absent, relative to the workspace
    /// (the enforcement list names the same paths in its [`Enforced::swept`] record).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub swept: Vec<String>,
    /// What a read-write workspace run's sweep could not remove of what the guest planted at
    /// protected paths, one line each naming the path and the reason: these stay on the host
    /// until the user removes them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sweep_errors: Vec<String>,
    /// Every git ref a read-write workspace run created, moved or deleted in the
    /// workspace's `.git` (`refs/heads/main 1f2e3d4c5b6a..0a1b2c3d4e5f`, guest-written
    /// bytes escaped), or why they could not be compared: a commit made in the run can
    /// bring back, on the user's next checkout, what the sweep removed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub git_refs_moved: Vec<String>,
}

/// Most grant calls a [`GrantsReport`] lists one by one: 1024. Later calls are still counted.
pub const MAX_GRANT_RECORDS: usize = 1024;

/// How one grant call ended, as the broker saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum GrantOutcome {
    /// The policy allowed it (or it read a data grant) and it returned a value.
    Ok,
    /// The policy denied it, or named no grant the run has.
    Denied,
    /// It was allowed and ran, but failed, timed out, or answered too much.
    Failed,
    /// The broker refused it before the policy: a bound was reached (calls, bytes,
    /// concurrency), the arguments were malformed, or the run had ended.
    Refused,
}

/// One grant call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct GrantCall {
    /// The grant the guest named (checked as a grant name, so at most 64 bytes).
    pub grant: String,
    /// How it ended.
    pub outcome: GrantOutcome,
    /// The policy rule that decided, or the broker's own reason (`data-grant`,
    /// `unknown-grant`, `max-calls`, `run-ended`, ...).
    pub rule: String,
    /// Bytes of the call's frame.
    pub bytes_in: u64,
    /// Bytes of the reply's frame.
    pub bytes_out: u64,
    /// Time from the call's arrival to its reply.
    #[serde(with = "micros")]
    pub duration: Duration,
    /// A function grant's arguments as the policy saw them (canonical JSON: sorted keys, no
    /// whitespace), cut to at most [`MAX_GRANT_ARGS_LEN`] bytes; absent for other calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<String>,
    /// Why a call that was decided (and may have run) failed after the decision
    /// (`reply-too-large`); the decision's `rule` stays as it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
}

/// The most bytes of a call's arguments a [`GrantCall`] keeps.
pub const MAX_GRANT_ARGS_LEN: usize = 512;

/// What a run's broker saw: every call (the first [`MAX_GRANT_RECORDS`] one by one), and
/// why the broker session ended early, if it did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct GrantsReport {
    /// The calls, in the order their replies were sent.
    pub calls: Vec<GrantCall>,
    /// Every call the broker received, including those beyond [`MAX_GRANT_RECORDS`].
    pub total: u64,
    /// How many of `total` were denied.
    pub denied: u64,
    /// Set when the broker ended the session before the run ended (a malformed frame, a
    /// lying length, a flood): the reason. The run itself goes on without its grants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_ended: Option<String>,
    /// The network grant's connections (the first [`MAX_GRANT_RECORDS`] one by one), in the
    /// order they ended; empty without a network grant.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub connections: Vec<NetConnection>,
    /// Every connection the network grant was asked for, including those beyond
    /// [`MAX_GRANT_RECORDS`].
    #[serde(default, skip_serializing_if = "is_zero")]
    pub connections_total: u64,
    /// The tokens the model grant's upstream reported this run used (its `usage`), 0 without
    /// a model grant.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub model_tokens: u64,
    /// The run read untrusted output through its grants (a call of an untrusted grant
    /// returned, or a session that had already read some): the policy's
    /// `session_read_untrusted`, as it stood when the run ended.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_untrusted: bool,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// How the network grant decided a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum NetDecision {
    /// The policy allowed it and the proxy connected (`address` is where).
    Allowed,
    /// The policy denied it (`rule` says which rule, or `default-deny`).
    Denied,
    /// The proxy refused it before or after the policy: a malformed request, a name that
    /// resolves only to addresses the grant does not reach, a TLS name that is not the
    /// host's, a bound of the run, or an upstream that could not be reached.
    Refused,
}

/// One connection the sandbox asked the network grant for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct NetConnection {
    /// The host the guest named (a DNS name or an address literal), at most 255 bytes.
    pub host: String,
    /// The port it named.
    pub port: u16,
    /// How it asked: `https` (a CONNECT tunnel), `http` (one plain request), `socks`.
    pub scheme: String,
    /// The address the proxy connected to, exactly the one it checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// The decision.
    pub decision: NetDecision,
    /// The rule that decided, or the proxy's own reason (`bad-request`, `private-address`,
    /// `sni-mismatch`, `max-connections`, `unreachable`, ...).
    pub rule: String,
    /// Why, in one line.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Bytes from the guest to the upstream.
    pub bytes_up: u64,
    /// Bytes from the upstream to the guest.
    pub bytes_down: u64,
    /// From the guest's request to the connection's end.
    #[serde(with = "micros")]
    pub duration: Duration,
    /// Why an allowed connection ended, when the proxy ended it (`idle`, `max-duration`,
    /// `max-bytes`, `run-ended`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut: Option<String>,
    /// For a secret host's connection, the header the proxy put the real value in (never
    /// the value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
}

impl GrantCall {
    /// A record of one call of `grant`.
    #[must_use]
    pub fn new(
        grant: impl Into<String>,
        outcome: GrantOutcome,
        rule: impl Into<String>,
        bytes: (u64, u64),
        duration: Duration,
    ) -> Self {
        Self {
            grant: grant.into(),
            outcome,
            rule: rule.into(),
            bytes_in: bytes.0,
            bytes_out: bytes.1,
            duration,
            args: None,
            failure: None,
        }
    }

    /// The record of a call that failed after its decision: `Failed`, the decision's rule
    /// kept, and why.
    #[must_use]
    pub fn failed_after(mut self, why: impl Into<String>) -> Self {
        self.outcome = GrantOutcome::Failed;
        self.failure = Some(why.into());
        self
    }

    /// The record with the call's canonical arguments, cut to [`MAX_GRANT_ARGS_LEN`] bytes.
    #[must_use]
    pub fn with_args(mut self, mut args: String) -> Self {
        truncate_at_char(&mut args, MAX_GRANT_ARGS_LEN);
        self.args = Some(args);
        self
    }
}

impl NetConnection {
    /// A connection to `host:port` asked for by `scheme`, not yet decided (refused, no rule,
    /// no bytes).
    #[must_use]
    pub fn new(host: impl Into<String>, port: u16, scheme: impl Into<String>) -> Self {
        Self {
            host: host.into(),
            port,
            scheme: scheme.into(),
            address: None,
            decision: NetDecision::Refused,
            rule: String::new(),
            reason: String::new(),
            bytes_up: 0,
            bytes_down: 0,
            duration: Duration::ZERO,
            cut: None,
            secret: None,
        }
    }
}

impl GrantsReport {
    /// Records one call, listing it if there is room.
    pub fn record(&mut self, call: GrantCall) {
        self.total += 1;
        if call.outcome == GrantOutcome::Denied {
            self.denied += 1;
        }
        if self.calls.len() < MAX_GRANT_RECORDS {
            self.calls.push(call);
        }
    }

    /// Records one network connection, listing it if there is room.
    pub fn record_connection(&mut self, connection: NetConnection) {
        self.connections_total += 1;
        if self.connections.len() < MAX_GRANT_RECORDS {
            self.connections.push(connection);
        }
    }
}

impl Report {
    /// A report with the given status and wall time, empty output and no enforcement listed.
    #[must_use]
    pub fn new(status: Status, wall: Duration) -> Self {
        Self {
            status,
            wall,
            cpu: None,
            peak_memory_bytes: None,
            stdout: Captured::default(),
            stderr: Captured::default(),
            enforcement: Vec::new(),
            grants: None,
            swept: Vec::new(),
            sweep_errors: Vec::new(),
            git_refs_moved: Vec::new(),
        }
    }

    /// Sets the captured streams.
    #[must_use]
    pub fn with_output(mut self, stdout: Captured, stderr: Captured) -> Self {
        self.stdout = stdout;
        self.stderr = stderr;
        self
    }

    /// Sets the measured CPU time.
    #[must_use]
    pub fn with_cpu(mut self, cpu: Duration) -> Self {
        self.cpu = Some(cpu);
        self
    }

    /// Sets the measured peak memory.
    #[must_use]
    pub fn with_peak_memory(mut self, bytes: u64) -> Self {
        self.peak_memory_bytes = Some(bytes);
        self
    }

    /// Records that a mechanism was active.
    #[must_use]
    pub fn with_enforced(mut self, enforced: Enforced) -> Self {
        self.enforcement.push(enforced);
        self
    }

    /// Sets what the broker saw.
    #[must_use]
    pub fn with_grants(mut self, grants: GrantsReport) -> Self {
        self.grants = Some(grants);
        self
    }

    /// True if `mechanism` is listed as active.
    #[must_use]
    pub fn enforced(&self, mechanism: Mechanism) -> bool {
        self.enforcement.iter().any(|e| e.mechanism == mechanism)
    }
}

mod micros {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_micros)
    }
}

mod opt_micros {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => super::micros::serialize(d, s),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Option::<u64>::deserialize(d).map(|v| v.map(Duration::from_micros))
    }
}
