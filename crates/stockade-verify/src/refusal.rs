//! Why a report was not verified.

use std::fmt::{self, Write as _};
use std::time::Duration;

use stockade_protocol::{Mechanism, Stream};

/// Longest excerpt of guest-written text (stderr, reasons) a refusal carries: 1 KiB before
/// escaping.
///
/// Refusals are printed on the host's terminal and logged; the guest chooses these bytes.
pub const MAX_EXCERPT_BYTES: usize = 1024;

/// Longest diagnostic rendering of a rejected value: 4 KiB.
pub const MAX_DIAGNOSTIC_BYTES: usize = 4096;

/// Why a run's output is not trusted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The run never started.
    #[error("failed to start: {reason}")]
    #[non_exhaustive]
    FailedToStart {
        /// Why (escaped, bounded).
        reason: String,
    },
    /// The contract requires a mechanism the report does not list.
    #[error("enforcement missing: {mechanism:?} was required but not active")]
    #[non_exhaustive]
    EnforcementMissing {
        /// The missing mechanism.
        mechanism: Mechanism,
    },
    /// The run passed its deadline.
    #[error("timed out: ran {elapsed:?}, deadline {limit:?}")]
    #[non_exhaustive]
    Timeout {
        /// The contract's deadline.
        limit: Duration,
        /// The wall time in the report.
        elapsed: Duration,
    },
    /// The run used up its CPU time.
    #[error("cpu time limit reached")]
    CpuLimit,
    /// The run hit its memory limit.
    #[error("out of memory")]
    OutOfMemory,
    /// A stream went over its budget (or stdout was truncated).
    #[error("output too large: {stream:?} wrote {seen} bytes, budget {limit}")]
    #[non_exhaustive]
    OutputTooLarge {
        /// The stream.
        stream: Stream,
        /// The contract's stdout budget.
        limit: u64,
        /// Bytes seen on the stream.
        seen: u64,
    },
    /// The run was killed by a signal.
    #[error("killed by signal {signal}")]
    #[non_exhaustive]
    KilledBySignal {
        /// The signal number.
        signal: i32,
    },
    /// A WebAssembly guest trapped.
    #[error("guest trapped: {trap}")]
    #[non_exhaustive]
    Trapped {
        /// The trap (escaped, bounded).
        trap: String,
    },
    /// The run exited with an unexpected code.
    #[error("exited with code {code}; stderr: {stderr}")]
    #[non_exhaustive]
    NonZeroExit {
        /// The exit code.
        code: i32,
        /// The start of stderr (escaped, bounded).
        stderr: String,
    },
    /// Stdout did not parse as the contract's type.
    #[error("malformed output: {reason}")]
    #[non_exhaustive]
    MalformedOutput {
        /// The parser's reason.
        reason: String,
    },
    /// The value parsed but the caller's assertion rejected it.
    #[error("assertion failed: {reason}")]
    #[non_exhaustive]
    AssertionFailed {
        /// The assertion's reason (escaped, bounded).
        reason: String,
        /// The rejected value, as a diagnostic only.
        rejected: Rejected,
    },
    /// The contract forbids denied grant calls, and the broker denied one (or ended the
    /// broker session early).
    #[error("grant denied: {detail}")]
    #[non_exhaustive]
    GrantDenied {
        /// Which call and which rule, or why the session ended (escaped, bounded).
        detail: String,
    },
    /// The report was unusable (inconsistent counts, an unknown status): stockade's fault,
    /// never the guest's success.
    #[error("verification error: {reason}")]
    #[non_exhaustive]
    Error {
        /// What was wrong.
        reason: String,
    },
}

impl Refusal {
    /// The stable process exit code for this refusal (see the table in the crate docs).
    #[must_use]
    pub fn exit_code(&self) -> u8 {
        match self {
            // The program's own code, as `timeout(1)` and `docker run` pass it through; 1 when
            // it exited 0 but the contract expected another code (0 must mean verified).
            Self::NonZeroExit { code, .. } => u8::try_from(*code).ok().filter(|c| *c != 0).unwrap_or(1),
            Self::GrantDenied { .. } => 116,
            Self::Trapped { .. } => 117,
            Self::EnforcementMissing { .. } => 118,
            Self::OutOfMemory => 119,
            Self::CpuLimit => 120,
            Self::AssertionFailed { .. } => 121,
            Self::MalformedOutput { .. } => 122,
            Self::OutputTooLarge { .. } => 123,
            Self::Timeout { .. } => 124,
            Self::Error { .. } => 125,
            Self::FailedToStart { .. } => 126,
            Self::KilledBySignal { signal } => match u8::try_from(*signal) {
                Ok(s @ 1..=64) => 128 + s,
                _ => 255,
            },
        }
    }

    /// The refusal as one line of text, safe to print on a terminal.
    #[must_use]
    pub fn message(&self) -> String {
        let line = self.to_string();
        // Every guest-written part is escaped already; this also covers reasons that came
        // from parsers and assertions.
        let mut out = String::with_capacity(line.len());
        for c in line.chars() {
            if c.is_control() {
                out.extend(c.escape_default());
            } else {
                out.push(c);
            }
        }
        out
    }
}

/// A value that failed the caller's assertion, kept only as a bounded `Debug` rendering.
/// There is no way to get a `T` back from it.
pub struct Rejected {
    diagnostic: String,
}

impl Rejected {
    pub(crate) fn new<T: fmt::Debug>(value: &T) -> Self {
        let mut out = Bounded { buf: String::new(), max: MAX_DIAGNOSTIC_BYTES };
        // A bounded writer errors out once it is full; the prefix is what we keep.
        let _ = write!(out, "{value:?}");
        Self { diagnostic: out.buf }
    }

    /// The value's `Debug` rendering, cut to [`MAX_DIAGNOSTIC_BYTES`].
    #[must_use]
    pub fn diagnostic(&self) -> &str {
        &self.diagnostic
    }
}

impl fmt::Debug for Rejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Rejected").field(&self.diagnostic).finish()
    }
}

/// A `fmt::Write` that keeps at most `max` bytes and then fails, stopping the formatter.
struct Bounded {
    buf: String,
    max: usize,
}

impl fmt::Write for Bounded {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = self.max - self.buf.len();
        if s.len() <= room {
            self.buf.push_str(s);
            return Ok(());
        }
        let mut cut = room;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        self.buf.push_str(&s[..cut]);
        Err(fmt::Error)
    }
}

/// The first [`MAX_EXCERPT_BYTES`] of guest-written bytes, decoded lossily with every control
/// character escaped, so it stays on one line and cannot drive a terminal.
pub(crate) fn excerpt(bytes: &[u8]) -> String {
    let cut = &bytes[..bytes.len().min(MAX_EXCERPT_BYTES)];
    let mut out: String = String::from_utf8_lossy(cut).chars().flat_map(char::escape_debug).collect();
    if bytes.len() > MAX_EXCERPT_BYTES {
        out.push_str("...");
    }
    out
}
