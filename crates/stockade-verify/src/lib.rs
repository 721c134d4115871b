//! Decides whether a run's output may be trusted; never runs anything itself.
//!
//! A tier returns a [`Report`]. [`verify`] checks it against the caller's [`Contract`] (a
//! deadline, an output budget, a parser to `T` and an assertion on `T`) and returns an
//! [`Outcome`]: either a [`Verified<T>`], which cannot be built any other way, or a
//! [`Refusal`] that says exactly why not. Code downstream takes `Verified<T>`, and the
//! compiler refuses any path that skipped the check.
//!
//! ```
//! use std::time::Duration;
//! use stockade_protocol::{Captured, Report, Status};
//! use stockade_verify::{Budget, Contract, Outcome, verify};
//!
//! let report = Report::new(Status::Exited { code: 0 }, Duration::from_millis(5))
//!     .with_output(Captured::new(b"42\n".to_vec(), 3), Captured::default());
//! let contract = Contract::json(Budget::new(Duration::from_secs(2), 1024), |n: &u32| {
//!     if *n == 42 { Ok(()) } else { Err(format!("expected 42, got {n}")) }
//! });
//! match verify(report, &contract) {
//!     Outcome::Verified(answer) => assert_eq!(*answer.value(), 42),
//!     Outcome::Refused(why) => panic!("{why} (exit {})", why.exit_code()),
//! }
//! ```
//!
//! # Position in the stack
//! Depends on: `stockade-protocol`. Used by: the tier crates, `stockade-runtime`,
//! `stockade-agent`.
//! API boundary: yes; users hold [`Verified<T>`], [`Outcome<T>`] and [`Refusal`].
//!
//! # Threat model
//! Trusted: the host process, the tier that wrote the report (host code), the caller's
//! contract and assertion.
//! Attacker-controlled: every byte the guest wrote (stdout and stderr), its exit status, how
//! long it ran, and so every value of `T` the parser can produce.
//! Out of scope: whether the tier really enforced what it lists (that is the tier's own
//! guarantee; verify can only require that it is listed); side channels.
//!
//! # Guarantees
//! G1. A [`Verified<T>`] comes only from [`verify`], and only when every check passed: the
//!     run started, every mechanism the contract requires is listed as enforced, it exited
//!     with the expected code (0 unless the contract says otherwise) within the deadline,
//!     stdout stayed within the budget and was not truncated, the report is consistent,
//!     the output parsed, and the assertion passed.
//!     (pinned by: tests/it/verify.rs::g1_*, tests/ui/fail/construct_outside.rs)
//! G2. Every other report is a specific [`Refusal`], checked in a fixed order (failed to
//!     start, enforcement missing, a denied grant call when the contract forbids them,
//!     timeout, cpu limit, out of memory, output too large, signal or trap, exit code,
//!     malformed output, assertion).
//!     (pinned by: tests/it/verify.rs::g2_*)
//! G3. Verify trusts no summary it can recompute: it compares the reported wall time with
//!     the contract's deadline itself, recounts the captured bytes against the budget, and
//!     refuses a report whose counts contradict each other.
//!     (pinned by: tests/it/verify.rs::g3_*)
//! G4. `Verified<T>` has no backdoor: no public fields or constructor, and no `Default`,
//!     `From`, `Deserialize`, `Clone`, `Deref`, `DerefMut`, `AsMut` or `get_mut`; its `Debug`
//!     redacts the value.
//!     (pinned by: tests/ui/fail/*.rs, tests/it/verify.rs::g4_*)
//! G5. A value that failed the assertion is kept only as a bounded diagnostic string in
//!     [`Rejected`]; no API turns it back into a `T`.
//!     (pinned by: tests/it/verify.rs::g5_*)
//! G6. Every refusal maps to a stable process exit code (timeout is 124) and a one-line
//!     message in which guest-written bytes are escaped and bounded.
//!     (pinned by: tests/it/verify.rs::g6_*)
//! G7. An [`Outcome`] cannot be silently dropped (`#[must_use]`), and [`Refusal`] is
//!     `#[non_exhaustive]`, so callers outside this crate must handle refusals added later.
//!     (pinned by: tests/ui/fail/unused_outcome.rs, tests/ui/fail/exhaustive_refusal.rs)
//! G8. `verify` never panics, whatever the report holds.
//!     (pinned by: tests/it/verify.rs::g8_*)
//!
//! # Non-guarantees
//! This crate isolates nothing; it only decides. A `T` with interior mutability (`Cell`,
//! `RefCell`, `Mutex`) can be changed after verification through `&T`; use plain data.
//! The assertion is the caller's code: a weak assertion verifies weak claims.
//!
//! # Failure behaviour
//! Fails closed: every report that does not pass every check is a refusal. Never panics on
//! attacker-controlled input.
//!
//! # Unsafe
//! None: `#![forbid(unsafe_code)]`.
//!
//! # Ambient authority
//! None. No filesystem, network, process, environment or clock access: the times it checks
//! are the ones in the report.
//!
//! # Feature flags
//! None.
//!
//! # Invariants
//! Stated as absences: performs no I/O; reads no clock; knows nothing about tiers; no
//! function other than [`verify`] constructs a [`Verified`].
//!
//! # Exit codes
//! [`Refusal::exit_code`] gives each refusal a stable code, for the `stockade` CLI:
//!
//! | refusal | code |
//! |---|---|
//! | [`Refusal::NonZeroExit`] | the program's own exit code, as `timeout(1)` and `docker run` pass it through (1 when it exited 0 but another code was expected, or its code is out of range) |
//! | [`Refusal::GrantDenied`] | 116 |
//! | [`Refusal::Trapped`] | 117 |
//! | [`Refusal::EnforcementMissing`] | 118 |
//! | [`Refusal::OutOfMemory`] | 119 |
//! | [`Refusal::CpuLimit`] | 120 |
//! | [`Refusal::AssertionFailed`] | 121 |
//! | [`Refusal::MalformedOutput`] | 122 |
//! | [`Refusal::OutputTooLarge`] | 123 |
//! | [`Refusal::Timeout`] | 124 (as `timeout(1)`) |
//! | [`Refusal::Error`] | 125 (stockade itself failed, as `timeout(1)`) |
//! | [`Refusal::FailedToStart`] | 126 (as a shell's "cannot execute") |
//! | [`Refusal::KilledBySignal`] | 128 + signal number (as a shell), 255 if out of range |
//!
//! A program's own code can collide with a reserved one (a program that exits 124 looks like a
//! timeout, as under `timeout(1)`); the refusal's message, or `stockade run --json`, tells them
//! apart.

#![forbid(unsafe_code)]

mod contract;
mod refusal;

use std::fmt;

pub use contract::{Budget, Contract, accept_any};
pub use refusal::{MAX_DIAGNOSTIC_BYTES, MAX_EXCERPT_BYTES, Refusal, Rejected};
use stockade_protocol::{Report, Status, Stream};

/// A value that passed every check of a [`Contract`]. Only [`verify`] makes one.
///
/// ```compile_fail
/// // No struct literal: the fields are private.
/// let v = stockade_verify::Verified { value: 1u8 };
/// ```
#[must_use]
pub struct Verified<T> {
    value: T,
    report: Report,
}

impl<T> Verified<T> {
    /// The verified value.
    pub fn value(&self) -> &T {
        &self.value
    }

    /// Gives up the proof and returns the value.
    pub fn into_inner(self) -> T {
        self.value
    }

    /// The report the value was verified from.
    pub fn report(&self) -> &Report {
        &self.report
    }
}

impl<T> fmt::Debug for Verified<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verified").field("value", &format_args!("<redacted>")).field("report", &self.report).finish()
    }
}

/// What [`verify`] decided.
#[must_use = "a refusal that is not inspected is an allow"]
#[derive(Debug)]
#[allow(
    clippy::large_enum_variant,
    reason = "one Outcome per run, moved to the caller once and matched at once: boxing the verified report would add an allocation to every verified run for no saving"
)]
pub enum Outcome<T> {
    /// Every check passed.
    Verified(Verified<T>),
    /// Some check failed; the refusal says which.
    Refused(Refusal),
}

impl<T> Outcome<T> {
    /// `Ok` for a verified value, `Err` for a refusal.
    pub fn into_result(self) -> Result<Verified<T>, Refusal> {
        match self {
            Self::Verified(v) => Ok(v),
            Self::Refused(r) => Err(r),
        }
    }

    /// True if verified.
    #[must_use]
    pub fn is_verified(&self) -> bool {
        matches!(self, Self::Verified(_))
    }
}

/// Checks `report` against `contract`; the only way to obtain a [`Verified<T>`].
///
/// The checks run in the order listed under G2 in the crate docs, and the first one that
/// fails decides the refusal.
pub fn verify<T: fmt::Debug>(report: Report, contract: &Contract<T>) -> Outcome<T> {
    match check(&report, contract) {
        Ok(value) => Outcome::Verified(Verified { value, report }),
        Err(refusal) => Outcome::Refused(refusal),
    }
}

fn check<T: fmt::Debug>(report: &Report, contract: &Contract<T>) -> Result<T, Refusal> {
    let budget = contract.budget();
    if let Status::FailedToStart { reason } = &report.status {
        return Err(Refusal::FailedToStart { reason: refusal::excerpt(reason.as_bytes()) });
    }
    if let Some(&mechanism) = contract.required().iter().find(|m| !report.enforced(**m)) {
        return Err(Refusal::EnforcementMissing { mechanism });
    }
    if contract.denies_on_denied_grants()
        && let Some(g) = &report.grants
    {
        if let Some(reason) = &g.session_ended {
            return Err(Refusal::GrantDenied {
                detail: refusal::excerpt(format!("the broker session ended: {reason}").as_bytes()),
            });
        }
        if g.denied > 0 {
            let first = g.calls.iter().find(|c| c.outcome == stockade_protocol::GrantOutcome::Denied);
            let detail = match first {
                Some(c) => format!("{} of {} calls denied; first: {} by rule {}", g.denied, g.total, c.grant, c.rule),
                None => format!("{} of {} calls denied", g.denied, g.total),
            };
            return Err(Refusal::GrantDenied { detail: refusal::excerpt(detail.as_bytes()) });
        }
    }
    if report.status == Status::TimedOut || report.wall > budget.deadline() {
        return Err(Refusal::Timeout { limit: budget.deadline(), elapsed: report.wall });
    }
    match report.status {
        Status::CpuLimit => return Err(Refusal::CpuLimit),
        Status::OutOfMemory => return Err(Refusal::OutOfMemory),
        Status::OutputLimit { stream } => {
            let seen = match stream {
                Stream::Stdout => report.stdout.seen,
                Stream::Stderr => report.stderr.seen,
            };
            return Err(Refusal::OutputTooLarge { stream, limit: budget.max_output(), seen });
        }
        _ => {}
    }
    for (stream, captured) in [(Stream::Stdout, &report.stdout), (Stream::Stderr, &report.stderr)] {
        if (captured.bytes.len() as u64) > captured.seen
            || captured.truncated != (captured.seen > captured.bytes.len() as u64)
        {
            return Err(Refusal::Error {
                reason: format!("inconsistent report: {stream:?} counts contradict the captured bytes"),
            });
        }
    }
    let out = &report.stdout;
    if out.truncated || out.seen > budget.max_output() {
        return Err(Refusal::OutputTooLarge { stream: Stream::Stdout, limit: budget.max_output(), seen: out.seen });
    }
    match report.status {
        Status::Exited { code } if code == contract.expected_exit() => {}
        Status::Exited { code } => {
            return Err(Refusal::NonZeroExit { code, stderr: refusal::excerpt(&report.stderr.bytes) });
        }
        Status::Signaled { signal } => return Err(Refusal::KilledBySignal { signal }),
        Status::Trapped { ref trap } => return Err(Refusal::Trapped { trap: refusal::excerpt(trap.as_bytes()) }),
        ref other => {
            return Err(Refusal::Error { reason: format!("unknown run status {other:?}") });
        }
    }
    let value = contract
        .parse(&out.bytes)
        .map_err(|reason| Refusal::MalformedOutput { reason: refusal::excerpt(reason.as_bytes()) })?;
    match contract.assertion(&value) {
        Ok(()) => Ok(value),
        Err(reason) => Err(Refusal::AssertionFailed {
            reason: refusal::excerpt(reason.as_bytes()),
            rejected: Rejected::new(&value),
        }),
    }
}
