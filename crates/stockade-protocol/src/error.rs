//! [`RunError`]: why a run could not happen, the one error every tier returns.
//!
//! A misbehaving guest is never a `RunError`: it is a [`Report`](crate::Report) with a
//! status. A `RunError` means the run did not happen as asked (or, for
//! [`RunError::Engine`], that the engine running it failed), and its kind says whose fault
//! that is, so a caller can match it without reading the message: retry later
//! ([`Exhausted`](RunError::Exhausted), [`Busy`](RunError::Busy),
//! [`Engine`](RunError::Engine)), fix the request ([`Misconfigured`](RunError::Misconfigured)),
//! pick another host or tier ([`Unsupported`](RunError::Unsupported)), look the session up
//! again ([`Ended`](RunError::Ended)), or report a bug ([`Internal`](RunError::Internal)).

use crate::job::JobError;

/// A tier could not run a job. Each message is one line.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The host cannot enforce a mechanism the run requires (the kernel lacks it, the
    /// engine does not offer it): the run fails closed rather than run weaker.
    #[error("unsupported on this host: {mechanism}: {reason}")]
    Unsupported {
        /// The mechanism (or setup stage) that could not be enforced.
        mechanism: String,
        /// Why: what the kernel or the engine said.
        reason: String,
    },
    /// The job or the tier is set up wrong: a workspace that cannot be granted, a job this
    /// tier does not run, a missing helper, a permission or a path.
    #[error("misconfigured: {0}")]
    Misconfigured(String),
    /// The host is out of processes or memory and the run did not start; retry once other
    /// runs have ended.
    #[error("out of resources: {0}; the run did not start (retry once other runs have ended)")]
    Exhausted(String),
    /// Another run holds the workspace and the job asked not to wait
    /// ([`Busy::Refuse`](crate::Busy::Refuse)); nothing of the run exists.
    #[error("{0}")]
    Busy(String),
    /// The engine that runs the tier's guests (the docker engine) is unreachable or failed
    /// mid-run; what the run created is removed once it answers again.
    #[error("{0}")]
    Engine(String),
    /// The live session or background process the call named has ended (killed, expired,
    /// exited) since it was looked up; nothing ran.
    #[error("{0}")]
    Ended(String),
    /// A bug in stockade.
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<JobError> for RunError {
    fn from(e: JobError) -> Self {
        Self::Misconfigured(e.to_string())
    }
}
