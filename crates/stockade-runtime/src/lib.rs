//! Composes stockade's layers: selects a tier, runs a job in it, and verifies the report.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use stockade_runtime::{Sandbox, process::{Helper, ProcessTier}};
//! use stockade_runtime::protocol::Job;
//! use stockade_runtime::verify::{Budget, Contract, Outcome};
//!
//! let sandbox = Sandbox::builder().tier(ProcessTier::new(Helper::current_exe()?)).build()?;
//! let job = Job::command("python3", ["-c", "print(6*7)"])?;
//! let contract = Contract::json(Budget::new(Duration::from_secs(2), 1024), |n: &u32| {
//!     if *n == 42 { Ok(()) } else { Err(format!("got {n}")) }
//! });
//! match sandbox.run(&job, &contract).await? {
//!     Outcome::Verified(v) => println!("{}", v.value()),
//!     Outcome::Refused(r) => eprintln!("refused: {}", r.message()),
//! }
//! # Ok(()) }
//! ```
//!
//! # Position in the stack
//! Depends on: `stockade-protocol`, `stockade-verify`, and each tier behind its feature
//! (`stockade-process` behind `process`, `stockade-wasm` behind `wasm`, `stockade-docker`
//! behind `docker`). Used by: `stockade-agent`, `stockade-cli`.
//! API boundary: yes; [`Tier`], [`Sandbox`], [`SandboxBuilder`], [`TierError`], and the tier
//! and layer crates re-exported as modules.
//!
//! # Threat model
//! Trusted: the host program, the tier implementations, the caller's contract.
//! Attacker-controlled: everything the tiers' guests produce, which reaches this crate only
//! as a `Report` and leaves it only through `stockade_verify::verify`.
//! Out of scope: enforcement itself, which lives in the tier crates.
//!
//! # Guarantees
//! G1. [`Sandbox::run`] returns a `Verified<T>` only through `stockade_verify::verify` on the
//!     tier's report; the runtime adds no other path to a trusted value.
//!     (pinned by: tests/it/runtime.rs::g1_*)
//! G2. A tier that cannot enforce what the job needs yields [`TierError::Unsupported`]
//!     naming the mechanism, never a weaker run.
//!     (pinned by: tests/it/runtime.rs::g2_*)
//! G3. [`Tier`] is object safe, and a sandbox has exactly one tier, chosen explicitly.
//!     (pinned by: tests/it/runtime.rs::g3_*)
//!
//! # Non-guarantees
//! The runtime isolates nothing itself; each tier's guarantees are its own crate's.
//!
//! # Failure behaviour
//! Errors are typed and say whose fault they are (unsupported host, misconfiguration, bug).
//!
//! # Unsafe
//! None: `#![forbid(unsafe_code)]`.
//!
//! # Ambient authority
//! None of its own; the tiers it composes document theirs.
//!
//! # Feature flags
//! `process` (default): the Linux subprocess tier, re-exported as `process`.
//! `wasm`: the WebAssembly tier, re-exported as `wasm`; `wasm-python` adds its opt-in
//! Python guest; `docker`: the docker tier, re-exported as `docker`. Enabling a feature adds a tier and
//! never changes a default.
//!
//! # Invariants
//! Stated as absences: no enforcement logic; no policy decisions; no constructor of
//! `Verified` or `Permit`.

#![forbid(unsafe_code)]

use std::fmt::Debug;

use async_trait::async_trait;
pub use stockade_protocol as protocol;
use stockade_protocol::{Job, Report};
pub use stockade_verify as verify;
use stockade_verify::{Contract, Outcome};

/// The Linux subprocess tier.
#[cfg(feature = "process")]
pub use stockade_process as process;

/// The WebAssembly tier.
#[cfg(feature = "wasm")]
pub use stockade_wasm as wasm;

/// The docker tier.
#[cfg(feature = "docker")]
pub use stockade_docker as docker;

/// A tier could not run a job.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TierError {
    /// The host cannot enforce a mechanism the run requires.
    #[error("unsupported on this host: {mechanism}: {reason}")]
    Unsupported {
        /// The mechanism.
        mechanism: String,
        /// Why.
        reason: String,
    },
    /// The job or the tier is set up wrong.
    #[error("misconfigured: {0}")]
    Misconfigured(String),
    /// A bug in stockade.
    #[error("internal error: {0}")]
    Internal(String),
}

/// An isolation tier: runs a [`Job`] and reports what happened. Tiers enforce; they never
/// decide what a report proves.
#[async_trait]
pub trait Tier: Send + Sync + Debug {
    /// A short name (`process`, `wasm`, `docker`).
    fn name(&self) -> &'static str;

    /// Runs `job`. A misbehaving guest is an `Ok` report.
    async fn run(&self, job: &Job) -> Result<Report, TierError>;
}

#[cfg(feature = "process")]
#[async_trait]
impl Tier for stockade_process::ProcessTier {
    fn name(&self) -> &'static str {
        "process"
    }

    async fn run(&self, job: &Job) -> Result<Report, TierError> {
        stockade_process::ProcessTier::run(self, job).await.map_err(|e| match e {
            stockade_process::LaunchError::Unsupported { mechanism, reason } => {
                TierError::Unsupported { mechanism, reason }
            }
            stockade_process::LaunchError::Misconfigured(m) => TierError::Misconfigured(m),
            other => TierError::Internal(other.to_string()),
        })
    }
}

#[cfg(feature = "wasm")]
#[async_trait]
impl Tier for stockade_wasm::WasmTier {
    fn name(&self) -> &'static str {
        "wasm"
    }

    async fn run(&self, job: &Job) -> Result<Report, TierError> {
        stockade_wasm::WasmTier::run(self, job).await.map_err(|e| match e {
            stockade_wasm::WasmError::Unsupported { mechanism, reason } => TierError::Unsupported { mechanism, reason },
            stockade_wasm::WasmError::Misconfigured(m) => TierError::Misconfigured(m),
            other => TierError::Internal(other.to_string()),
        })
    }
}

#[cfg(feature = "docker")]
#[async_trait]
impl Tier for stockade_docker::DockerTier {
    fn name(&self) -> &'static str {
        "docker"
    }

    async fn run(&self, job: &Job) -> Result<Report, TierError> {
        stockade_docker::DockerTier::run(self, job).await.map_err(|e| match e {
            stockade_docker::DockerError::Unsupported { mechanism, reason } => {
                TierError::Unsupported { mechanism, reason }
            }
            stockade_docker::DockerError::Spec(m) => TierError::Misconfigured(m.to_string()),
            stockade_docker::DockerError::Stage(s) => TierError::Misconfigured(s.to_string()),
            other => TierError::Internal(other.to_string()),
        })
    }
}

/// Building a sandbox failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// No tier was chosen; there is no default.
    #[error("no tier chosen: call SandboxBuilder::tier")]
    NoTier,
}

/// Chooses a sandbox's tier. There is no default tier: the choice is explicit.
#[derive(Debug, Default)]
pub struct SandboxBuilder {
    tier: Option<Box<dyn Tier>>,
}

impl SandboxBuilder {
    /// Runs jobs in `tier`.
    #[must_use]
    pub fn tier(mut self, tier: impl Tier + 'static) -> Self {
        self.tier = Some(Box::new(tier));
        self
    }

    /// Runs jobs in an already boxed tier.
    #[must_use]
    pub fn boxed_tier(mut self, tier: Box<dyn Tier>) -> Self {
        self.tier = Some(tier);
        self
    }

    /// The sandbox.
    pub fn build(self) -> Result<Sandbox, BuildError> {
        Ok(Sandbox { tier: self.tier.ok_or(BuildError::NoTier)? })
    }
}

/// One tier, ready to run jobs.
#[derive(Debug)]
pub struct Sandbox {
    tier: Box<dyn Tier>,
}

impl Sandbox {
    /// A builder.
    #[must_use]
    pub fn builder() -> SandboxBuilder {
        SandboxBuilder::default()
    }

    /// The tier's name.
    #[must_use]
    pub fn tier_name(&self) -> &'static str {
        self.tier.name()
    }

    /// Runs `job` and returns the raw report (nothing in it is trusted).
    pub async fn report(&self, job: &Job) -> Result<Report, TierError> {
        self.tier.run(job).await
    }

    /// Runs `job` and verifies the report against `contract`.
    pub async fn run<T: Debug>(&self, job: &Job, contract: &Contract<T>) -> Result<Outcome<T>, TierError> {
        let report = self.tier.run(job).await?;
        Ok(stockade_verify::verify(report, contract))
    }
}
