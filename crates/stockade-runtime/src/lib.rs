//! Composes stockade's layers: selects a tier, runs a job in it, and verifies the report.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use stockade_runtime::{Sandbox, process::{Helper, ProcessTier}};
//! use stockade_runtime::protocol::Job;
//! use stockade_runtime::verify::{Budget, Contract, Outcome};
//!
//! // In `main`, before any runtime or thread starts: `stockade_runtime::process::helper_main()`
//! // and `stockade_runtime::process::ForkServer::start()`, so that runs from any thread are
//! // forked by the fork server rather than executing the helper binary.
//! let helper = Helper::current_exe()?.prefer_fork();
//! let sandbox = Sandbox::builder().tier(ProcessTier::new(helper)).build()?;
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
//! # Grants
//! A job may be given [`Grants`]: named JSON data, named host functions with a JSON Schema
//! for their arguments, and the [`policy::allow::Policy`] that decides every function call.
//! [`Sandbox::report`] of a [`RunRequest`] with grants serves them for that one run through a broker that speaks
//! `stockade_protocol::broker`'s wire protocol:
//!
//! | tier | how the guest reaches the broker | data grants |
//! |---|---|---|
//! | process | `/run/stockade/grants.sock`, in a read-only bind of the run's grants directory | `/run/stockade/data/NAME.json` |
//! | docker | `/broker/grants.sock`, the same directory bound read-only at `/broker` | `/broker/data/NAME.json` |
//! | wasm | the `host.call` import, in process (see `stockade_wasm::HostCalls`) | JavaScript globals |
//!
//! A model grant ([`Grants::model`], a [`ModelService`] such as `stockade_agent::ModelProxy`)
//! adds `model.sock` beside `grants.sock` (process and docker tiers): OpenAI-compatible HTTP/1.1, reached with `curl --unix-socket "$STOCKADE_MODEL_SOCKET"`
//! or Python's `http.client` over a unix socket, with `$OPENAI_API_KEY` set to a random
//! per-run placeholder; the real key stays with the service. In the process tier the same
//! service also answers at `$OPENAI_BASE_URL` (`http://127.0.0.1:8765/v1`), for clients that
//! speak only TCP (the OpenAI SDKs, unconfigured): a listener on the loopback of the run's
//! own network namespace, created there by the tier's helper and taken by the host with
//! `pidfd_getfd`, so it works without root and without `setns`, and no code inside the
//! sandbox relays anything; landlock lets the guest connect to that port only (see
//! [`Broker::loopback`]). In the docker tier (as root, under the engine's default
//! runtime, with the `process` feature) the
//! same listener is put, with `stockade_process::listen_in_netns`, in the network namespace
//! of a holder container that the guest container then joins
//! (`stockade_docker::DockerTier::run_granted_in_netns`); without root the docker guest has
//! `model.sock` only. In every tier,
//! and the only way in the wasm tier (which has no sockets), the model also answers calls
//! to the grant `model` (G9): JavaScript's `model({messages: [...]})` returns the response
//! object, and `stockade-call model '{...}'` prints it.
//!
//! `$STOCKADE_BROKER` names the socket and `$STOCKADE_GRANTS` the directory; its
//! `bin/stockade-call NAME JSON` (a static client, on the guest's `PATH` unless the job sets
//! one) makes a call from a shell. The process tier's choice of a socket in a read-only
//! directory over a pre-connected socketpair: one transport for the process and docker
//! tiers, and HTTP clients (the planned model proxy) need a path to connect to; the
//! process tier's seccomp filter allows unix sockets, so nothing is lost.
//!
//! # Sessions
//! [`session::Sessions`] owns live sessions over the process tier's
//! [`process::ProcessSession`]: each gets an id of 16 random bytes, a home of its own under
//! `sessions/OWNER/ID` in stockade's state directory (served on the host by
//! `stockade_hostfs::files::Files`), an idle timeout and a lifetime that end it without
//! anyone calling ([`session::Sessions::reap_expired`]), pause and resume, and a
//! filesystem-only snapshot of its home that a new session can start from, and background
//! execs ([`session::Session::start`]): each a [`session::Background`] handle by its pid,
//! whose output is kept (its latest 1 MiB) for an attach at any time and streamed live to
//! each reader ([`session::LiveOutput`]), every chunk once, with back-pressure: a reader
//! 1 MiB behind ([`session::LIVE_BYTES`]) stops the exec's output from being read (the
//! guest waits on its write) rather than growing the owner; whose stdin can be written and closed, whose process group can be signalled and whose
//! terminal can be resized; a session with an exec running is not idle. A profile's grants
//! are served by one [`Broker`] for the session's whole life, to every exec. A profile's
//! [`session::SessionTier::Docker`] makes the session one hardened container instead
//! (`stockade_docker::session`), its files read and written through the engine, its
//! workspace staged, its grants served by one broker whose directory is bound read-only at
//! `/broker` and whose loopback listener (a model grant's `OPENAI_BASE_URL`, a network
//! grant's proxy) is put in the container's own network namespace once it has started,
//! before any exec (root; a network grant fails closed without it). A profile's
//! `home_bytes` caps the home: a tmpfs the owner mounts on it (process tier, root;
//! `stockade_process::HomeMount`), or the home volume's size (docker tier). The owner's
//! session cap is reserved before a create's work, so racing creates cannot pass it, and
//! every files call of a process-tier session, and a session home's making (its mount, a
//! snapshot's restore, read only from a regular file: a fifo is refused at once), runs on
//! the blocking pool. Under a root owner each process session's guest runs as a host uid
//! and gid of its own, claimed from [`session::GUEST_ID_BASE`]'s range of
//! [`session::GUEST_IDS`] by a lock in [`session::GUEST_ID_LOCK_DIR`] (so owners on one host
//! never share one) and freed when its processes have ended, so the kernel's per-user
//! limits (inotify, `RLIMIT_NPROC`, mqueue bytes, pipe buffers, keys) are each session's
//! own; inside it is `nobody` either way, and its grants directory is shared with its gid
//! alone. A rootless owner's sessions are all the invoking user. The owner's
//! directory is named after its pid and start time, so a later owner (or `stockade gc`)
//! removes what a killed one left. Pinned end to end by stockade-cli's `tests/it/session.rs`
//! (its G10) and stockade-process's G17.
//!
//! # Position in the stack
//! Depends on: `stockade-protocol`, `stockade-policy`, `stockade-verify`, `stockade-sys`,
//! `stockade-egress` (the network grant), and each tier
//! behind its feature (`stockade-process` behind `process`, `stockade-wasm` behind `wasm`,
//! `stockade-docker` behind `docker`). Used by: `stockade-agent`, `stockade-cli`.
//! API boundary: yes; [`Tier`], [`Sandbox`], [`SandboxBuilder`], [`RunRequest`], [`RunError`], [`Grants`],
//! [`FunctionGrant`], [`Broker`], and the tier and layer crates re-exported as modules.
//!
//! # Threat model
//! Trusted: the host program, the tier implementations, the caller's contract, the grants
//! and their policy.
//! Attacker-controlled: everything the tiers' guests produce, which reaches this crate only
//! as a `Report` (leaving it only through `stockade_verify::verify`) or as broker frames:
//! every byte, length, grant name and argument of a call, their number and their timing.
//! Out of scope: enforcement itself, which lives in the tier crates; what a function grant
//! does once the policy allowed it (it is the host's code, and runs unconfined), and so what
//! a host MCP server does with an allowed call. A host MCP server's answers are
//! attacker-influenced too (it may relay a web page), and are bounded like any reply.
//!
//! # Guarantees
//! G1. [`Sandbox::run`] returns a `Verified<T>` only through `stockade_verify::verify` on the
//!     tier's report; the runtime adds no other path to a trusted value.
//!     (pinned by: tests/it/runtime.rs::g1_*)
//! G2. A tier that cannot enforce what the job needs yields [`RunError::Unsupported`]
//!     naming the mechanism, never a weaker run.
//!     (pinned by: tests/it/runtime.rs::g2_*)
//! G3. [`Tier`] is object safe, and a sandbox has exactly one tier, chosen explicitly.
//!     (pinned by: tests/it/runtime.rs::g3_*)
//! G4. A function grant runs only with the `Permit` the grants' policy minted for exactly
//!     that call. Its arguments carry the source `sandbox` (unless the grants ask for
//!     relayed provenance, G16), so no `source = "trusted"` rule matches them; a name the run was not granted, arguments that are not the grant's
//!     schema (the whole JSON Schema, checked before the policy with `jsonschema`: every
//!     keyword, integers compared exactly, `pattern` in linear time), or grants without a
//!     policy are denied and run nothing. The grants are fixed
//!     before the run starts. Once a call of a function marked
//!     [`FunctionGrant::untrusted_output`] (every host MCP tool, an untrusted agent tool)
//!     returned, a result or a failure (whose message can quote the tool), the run's policy
//!     sees the session as having read untrusted data. Two grants whose names are one where
//!     a `.` is written `__` ([`door_name`]) are refused when loaded, naming both.
//!     (pinned by: tests/it/grants.rs::g4_*)
//! G5. Each run's broker is bounded: calls per run, bytes per call (checked on the length
//!     prefix, before anything is allocated), bytes per reply, time per call (the function's
//!     future is dropped) and calls at once. A malformed frame, a lying length, a stream cut
//!     inside a frame or a flood ends that run's broker session for every connection and is
//!     reported; the host goes on.
//!     (pinned by: tests/it/grants.rs::g5_*)
//! G6. A call after the run has ended is refused and runs nothing; the run's grants
//!     directory holds only the socket, the client and the data (no broker state), only the
//!     invoking user and the tiers' guest user can enter it, and it is removed when the run
//!     ends; nothing the job carries configures the broker.
//!     (pinned by: tests/it/grants.rs::g6_*)
//! G7. The report's `grants` section lists each call's grant, outcome, rule, bytes and
//!     duration (the first 1024 one by one, every call counted), a function call's
//!     arguments as the policy saw them (canonical, cut at `MAX_GRANT_ARGS_LEN` bytes), and the
//!     enforcement list names the broker.
//!     Each decision and each call's end is also told, as it happens, to the grants'
//!     observer ([`Grants::observer`], a [`CallEvent`]); a call still running when the run
//!     ends (the guest exited, or the run's future was dropped: a signal, an outer
//!     deadline) is aborted and recorded, in the report and to the observer, as `cancelled`.
//!     (pinned by: tests/it/grants.rs::g7_*)
//! G8. A tier that cannot carry grants fails closed with [`RunError::Unsupported`]
//!     (`grants`). (The wasm tier's Python guest carries them through its own tool door:
//!     `stockade-wasm`'s G12.)
//!     (pinned by: tests/it/grants.rs::g8_*)
//! G9. A model grant also answers calls to the grant [`MODEL_GRANT`] (`model`) in every
//!     tier: the wasm tier's JavaScript `model({...})` global (the manifest lists it), and
//!     `stockade-call model '{...}'` in the others. Each call is counted and bounded like
//!     any other, served by [`ModelService::complete`] with the run's own [`ModelRun`] (one
//!     token budget with the sockets), and recorded as `model-call`; a service that speaks
//!     only HTTP refuses it, and no function grant may take the name.
//!     (pinned by: tests/it/grants.rs::g9_*)
//! G10. A network grant (`Grants::net`, `stockade_egress`) is served on the run's loopback
//!     beside the model grant: each connection goes, by its first bytes (read, within one
//!     30 s deadline for the whole wait, and put back; a peer that closes first is let go at
//!     once), to the run's own proxy (CONNECT, an absolute-form URL, SOCKS5) or to the model
//!     (origin-form HTTP); a session's grant renews its totals at each exec; the
//!     guest gets the proxy's variables, a job that sets them itself is refused, and the
//!     report's grants section lists every connection. With secrets, the per-run CA
//!     (appended to the host's roots) is [`NET_CA_FILE`] in the grants directory, the guest's
//!     CA variables name it, and its placeholders are in its environment, never the values.
//!     A guest without sockets (the wasm tier) reaches the
//!     grant as the call [`FETCH_GRANT`] (`fetch`), which the host makes as a client of the
//!     run's own proxy: one path to the network for every tier. A tier that cannot put the
//!     proxy's listener in the run's namespace (docker without root or under gVisor) fails
//!     closed with [`RunError::Unsupported`].
//!     (pinned by: tests/it/grants.rs::g10_*)
//! G11. [`stale_grants_dirs`] names a grants directory only when its broker is gone (its
//!     socket is bound nowhere in this network namespace, read from `/proc/net/unix`, never
//!     connected to) and it is older than the age asked for; a live run's is never named.
//!     (pinned by: tests/it/grants.rs::g11_*)
//! G12. A host MCP server ([`mcp::McpServer`], [`Grants::mcp`]) is started over stdio and
//!     shaken hands with as any MCP client does (`initialize` at 2025-11-25, every page of
//!     `tools/list`); each tool is granted as `NAME.TOOL` with its input schema (an optional
//!     `anyOf [T, null]` narrowed to an optional `T`; a tool whose name or schema cannot be
//!     checked is not granted, and [`mcp::McpServer::skipped`] says why). A call reaches the
//!     server only with its permit, and its result keeps the server's `isError`; a call
//!     abandoned at its deadline is cancelled at the server; the server's requests get
//!     "method not found" (`ping` is answered); its crash, exit status and stderr go to the
//!     host (all of them once [`mcp::McpServer::settled`] returns), the guest learns only
//!     that it stopped; an oversized message stops it; dropping
//!     it kills its whole process group; a server that cannot start or shake hands is one
//!     typed error.
//!     (pinned by: tests/it/mcp.rs::g12_*)
//! G13. A program grant ([`Grants::program`]) is a copy, made when the run starts and never
//!     a link, of a host file as `bin/NAME` in the run's grants directory (mode 0750, on the
//!     guest's `PATH`), so sharing it changes nothing of the host's file; a name outside the
//!     grant-name rule, the client's own name or a second program of one name is refused, a
//!     source that is not a regular file fails the run before it starts, and the wasm tier
//!     refuses program grants.
//!     (pinned by: tests/it/grants.rs::g13_*)
//! G14. A linked program grant ([`Grants::program_linked`]) also copies, the same way, the
//!     dynamic loader named in the program's ELF `PT_INTERP` and each shared object that loader
//!     lists for it (asked with `--list`, in an empty environment) into the run's `lib/`
//!     under the name the loader looks for; [`Grants::program_command`] starts it through
//!     that loader with `lib/` as its only library path, so it runs where the image has no C
//!     library (the libraries it loads are the run's copies); a script or a static program
//!     is granted as [`Grants::program`] grants it, and a library the loader cannot find is
//!     [`GrantError::Program`].
//!     (pinned by: tests/it/grants.rs::g14_*, src/linked/tests.rs)
//! G15. A function call the policy marks `ask` is put to the grants' approver
//!     ([`Grants::approver`], a [`GrantApprover`]), one question at a time, while the call
//!     waits; it runs only if approved, decided again with a single-use approval for exactly
//!     its arguments, so the rule's limits and the ledger still bind; refused, or with no
//!     approver, it is denied, the reply saying which.
//!     (pinned by: tests/it/grants.rs::g15_*)
//! G16. With relayed provenance ([`Grants::relayed_provenance`]: the guest is an agent's
//!     loop, and the run's model grant relays its model), each function call's arguments
//!     get their sources from the traffic the host relayed, never from the loop's word: a
//!     call the last relayed model response did not propose is the sandbox's; in one it
//!     proposed, an argument copied from an untrusted grant's output is `tool:NAME`, one
//!     copied from text the loop wrote into a model request (and from no text the host
//!     gave) is the sandbox's, and the rest are the user's, as the loop's own tracking
//!     (`stockade_policy::taint`) decides unconfined. A model request carrying a system,
//!     user or assistant text the host did not give or relay sets read-untrusted.
//!     (pinned by: src/relayed.rs::g16_*; stockade-cli's `g13_the_steward_decides_*`, `g13_a_loop_that_writes_*`)
//!
//! # Non-guarantees
//! The runtime isolates nothing itself; each tier's guarantees are its own crate's. A
//! function grant is the host's code: the policy decides whether it runs, not what it does.
//! A host process running as the guest's uid or gid (65534 when stockade runs as root, or
//! a root owner's session's own) can
//! enter a run's grants directory and call its broker while the run lasts. In the docker
//! tier a model grant serves `OPENAI_BASE_URL` only when stockade runs as root (see above).
//!
//! # Failure behaviour
//! Errors are typed and say whose fault they are (unsupported host, misconfiguration, bug).
//! A guest that breaks the broker protocol is a normal outcome, recorded in the report.
//!
//! # Unsafe
//! None: `#![forbid(unsafe_code)]`.
//!
//! # Ambient authority
//! [`mcp::McpServer::start`] starts the host program it is given, as the caller, with the
//! caller's environment (the server is the user's, and holds the user's tokens).
//! For a granted run only: creates a directory under the system's temporary directory (or
//! [`SandboxBuilder::grants_dir`]), writes the client and the data grants into it, listens
//! on unix sockets there, and removes it afterwards; draws the model grant's placeholder
//! from the OS RNG. The tiers it composes document theirs.
//!
//! # Feature flags
//! `process` (default): the Linux subprocess tier, re-exported as `process`.
//! `wasm`: the WebAssembly tier, re-exported as `wasm`; `wasm-python` adds its opt-in
//! Python guest; `docker`: the docker tier, re-exported as `docker`. `net`: the network grant
//! (`Grants::net`, `stockade-egress` re-exported as `egress`, with its TLS and DNS);
//! without it, the network grant's types have no values (`net.rs`), so a build that takes
//! only a tier and data or function grants compiles no proxy. Enabling a feature adds a
//! tier or a grant and never changes a default.
//!
//! # Invariants
//! Stated as absences: no enforcement logic; no policy decision but the grants policy's;
//! no constructor of `Verified` or `Permit`; no HTTP (a model grant's service is the
//! caller's).

#![forbid(unsafe_code)]

mod broker;
mod grants;
#[cfg(feature = "process")]
mod guest_id;
mod linked;
pub mod mcp;
mod net;
mod relayed;

pub use broker::stale_grants_dirs;

use std::fmt::Debug;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
pub use grants::{
    CallEvent, CallObserver, FETCH_GRANT, FunctionGrant, GrantApprover, GrantError, GrantFn, GrantFuture, GrantLimits,
    GrantResult, Grants, MAX_DATA_BYTES, MAX_GRANTS, MODEL_GRANT, ModelCall, ModelConn, ModelRun, ModelService,
    ModelStream, door_name,
};
#[cfg(feature = "net")]
pub use stockade_egress as egress;
pub use stockade_policy as policy;
pub use stockade_protocol as protocol;
pub use stockade_protocol::LiveIo;
use stockade_protocol::broker::{BROKER_ENV, GRANTS_SOCKET};
use stockade_protocol::{Enforced, Job, Mechanism, Report};
pub use stockade_sys as sys;
pub use stockade_verify as verify;
use stockade_verify::{Contract, Outcome};

/// The `PATH` a granted guest gets after the client's directory when its job sets none
/// (the docker engine's default).
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The environment variable naming the model grant's socket inside the guest.
pub const MODEL_ENV: &str = "STOCKADE_MODEL_SOCKET";

/// The environment variable naming the grants directory inside the guest.
pub const GRANTS_ENV: &str = "STOCKADE_GRANTS";

/// The run's CA bundle in the grants directory, with a network grant that has secrets: the
/// host's roots and the per-run CA (`stockade_egress::CA_ENV` point at it).
pub const NET_CA_FILE: &str = "net-ca.pem";

/// Where the host's own roots are looked for (Debian and Alpine, Fedora, openSUSE).
const HOST_CA_BUNDLES: [&str; 3] =
    ["/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/ca-bundle.pem"];

/// The Linux subprocess tier.
#[cfg(feature = "process")]
pub use stockade_process as process;

#[cfg(feature = "process")]
pub mod session;

/// The WebAssembly tier.
#[cfg(feature = "wasm")]
pub use stockade_wasm as wasm;

/// The docker tier.
#[cfg(feature = "docker")]
pub use stockade_docker as docker;

/// A tier could not run a job: the one error every tier returns (see
/// [`protocol::RunError`]).
pub use stockade_protocol::RunError;

/// An isolation tier: runs a [`Job`] and reports what happened. Tiers enforce; they never
/// decide what a report proves.
#[async_trait]
pub trait Tier: Send + Sync + Debug {
    /// A short name (`process`, `wasm`, `docker`).
    fn name(&self) -> &'static str;

    /// Runs `job`. A misbehaving guest is an `Ok` report.
    async fn run(&self, job: &Job) -> Result<Report, RunError>;

    /// Runs `job` with its guest able to reach `broker` (and nothing else of the host
    /// beyond what [`run`](Self::run) gives). A tier that cannot carry grants fails closed.
    async fn run_granted(&self, job: &Job, broker: &Broker) -> Result<Report, RunError> {
        let _ = (job, broker);
        Err(RunError::Unsupported {
            mechanism: "grants".into(),
            reason: format!("the {} tier cannot carry grants", self.name()),
        })
    }

    /// [`run`](Self::run) or [`run_granted`](Self::run_granted), with live stdio (see
    /// [`LiveIo`]). By default a streamed stdin is read whole first (at most the job's
    /// limit, [`protocol::job::MAX_STDIN_BYTES`]; more is a [`RunError::Misconfigured`] that
    /// says so, never a silent cut) and the stderr and stdout copies are written when the run
    /// ends; the process tier streams them.
    async fn run_live(&self, job: &Job, broker: Option<&Broker>, io: LiveIo) -> Result<Report, RunError> {
        io.check(job).map_err(|e| RunError::Misconfigured(e.into()))?;
        let LiveIo { stdin, stderr, stdout, pace: _ } = io;
        let job = match stdin {
            Some(stdin) => job.clone().with_stdin(read_stdin(stdin).await?)?,
            None => job.clone(),
        };
        let report = match broker {
            Some(b) => self.run_granted(&job, b).await?,
            None => self.run(&job).await?,
        };
        if let Some(mut w) = stderr {
            let _ = w.write_all(&report.stderr.bytes).and_then(|()| w.flush());
        }
        if let Some(mut w) = stdout {
            let _ = w.write_all(&report.stdout.bytes).and_then(|()| w.flush());
        }
        Ok(report)
    }
}

/// Reads a streamed stdin whole, for a tier that takes the job's bytes only.
async fn read_stdin(stdin: Box<dyn tokio::io::AsyncRead + Send + Unpin>) -> Result<Vec<u8>, RunError> {
    use tokio::io::AsyncReadExt;
    let max = stockade_protocol::job::MAX_STDIN_BYTES;
    let mut bytes = Vec::new();
    stdin
        .take(max as u64 + 1)
        .read_to_end(&mut bytes)
        .await
        .map_err(|e| RunError::Misconfigured(format!("reading stdin: {e}")))?;
    if bytes.len() > max {
        return Err(RunError::Misconfigured(format!(
            "stdin is over {max} bytes, and this tier takes stdin whole; use the process tier to stream it"
        )));
    }
    Ok(bytes)
}

/// A run's broker, as a tier sees it: a directory to show the guest (with the broker's
/// socket, its client and the data grants), or in-process calls. Made by
/// [`Sandbox::report`] for a request with grants; everything it serves ends with the run.
pub struct Broker {
    session: Arc<broker::Session>,
    grants: Arc<Grants>,
    parent: PathBuf,
    dirs: Mutex<Vec<broker::GrantsDir>>,
    /// `None` once the run has ended: nothing is served after that.
    tasks: Arc<Mutex<Option<tokio::task::JoinSet<()>>>>,
    /// The model grant's per-run state (its placeholder key among it), shared by every
    /// listener of the run.
    model_run: ModelRun,
    /// The network grant's proxy for this run.
    egress: Option<net::Egress>,
}

impl Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker").field("grants", &self.grants).finish_non_exhaustive()
    }
}

impl Broker {
    fn new(grants: Arc<Grants>, parent: PathBuf) -> Result<Self, RunError> {
        let placeholder = broker::random_hex(24).map_err(|e| RunError::Internal(format!("getrandom: {e}")))?;
        let session = broker::Session::new(grants.clone());
        let placeholder = Arc::from(format!("sk-stockade-{placeholder}"));
        if grants.model.is_some() && grants.functions.contains_key(MODEL_GRANT) {
            return Err(RunError::Misconfigured(format!(
                "a function grant is named {MODEL_GRANT:?}, which the model grant answers to: rename it"
            )));
        }
        let model_run =
            ModelRun { placeholder, session: session.clone(), tokens: Arc::default(), requests: Arc::default() };
        session.set_model(&model_run);
        if grants.net.is_some() && grants.functions.contains_key(FETCH_GRANT) {
            return Err(RunError::Misconfigured(format!(
                "a function grant is named {FETCH_GRANT:?}, which the network grant answers to: rename it"
            )));
        }
        let egress = grants.net.as_ref().map(net::NetGrant::start);
        #[cfg_attr(not(feature = "net"), allow(unreachable_code, reason = "this build has no network grant"))]
        if let Some(e) = &egress {
            session.set_egress(e.clone());
        }
        Ok(Self {
            session,
            grants,
            parent,
            dirs: Mutex::new(Vec::new()),
            tasks: Arc::new(Mutex::new(Some(tokio::task::JoinSet::new()))),
            egress,
            model_run,
        })
    }

    /// The grants.
    #[must_use]
    pub fn grants(&self) -> &Grants {
        &self.grants
    }

    /// Creates this run's grants directory on the host and serves the broker on its socket
    /// ([`GRANTS_SOCKET`]) until the run ends. The directory also holds `bin/stockade-call`
    /// (the client) and `data/NAME.json` for each data grant. Only the invoking user and
    /// the tiers' guest user can enter it; it is removed when the run ends.
    pub fn socket_dir(&self) -> Result<PathBuf, RunError> {
        self.socket_dir_for(broker::NOBODY)
    }

    /// [`Broker::socket_dir`] for a guest whose host gid is `guest_gid` (a root owner's
    /// session with a host id of its own): under root, the directory is `root:guest_gid`
    /// 0750, so that guest, and no other, can enter it.
    pub fn socket_dir_for(&self, guest_gid: u32) -> Result<PathBuf, RunError> {
        let (dir, listener, model) = broker::GrantsDir::create(&self.parent, &self.grants, guest_gid).map_err(|e| {
            RunError::Misconfigured(format!("creating a grants directory in {}: {e}", self.parent.display()))
        })?;
        let path = dir.path().to_path_buf();
        self.dirs.lock().unwrap_or_else(PoisonError::into_inner).push(dir);
        if let Some(ca) = self.egress.as_ref().and_then(net::Egress::ca_pem) {
            // The guest's trust for a secret host: the host's roots and the per-run CA.
            let mut bundle = HOST_CA_BUNDLES.iter().find_map(|p| std::fs::read_to_string(p).ok()).unwrap_or_default();
            bundle.push_str(ca);
            std::fs::write(path.join(NET_CA_FILE), bundle).map_err(|e| {
                RunError::Misconfigured(format!("writing the run's CA bundle in {}: {e}", path.display()))
            })?;
        }
        let mut tasks = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(tasks) = tasks.as_mut() else {
            return Err(RunError::Misconfigured("the run's broker has already ended".into()));
        };
        tasks.spawn(broker::serve(listener, self.session.clone()));
        if let Some(model) = model {
            tasks.spawn(broker::serve_model(model, self.session.clone(), self.model_run.clone()));
        }
        Ok(path)
    }

    /// For a model or network grant: the loopback TCP port a tier may listen on inside the
    /// run's own network namespace, and the sink that serves a listener there until the run
    /// ends: as the model grant (the same service, placeholder, call bound and token budget
    /// as `model.sock`) for origin-form HTTP, and as the network grant's proxy for proxy
    /// requests. `None` with neither grant. A tier that serves it adds
    /// [`loopback_env`](Self::loopback_env) to the guest's job.
    #[must_use]
    pub fn loopback(&self) -> Option<(u16, impl FnOnce(std::net::TcpListener) + Send + 'static)> {
        if self.grants.model.is_none() && self.egress.is_none() {
            return None;
        }
        let (tasks, session, run) = (self.tasks.clone(), self.session.clone(), self.model_run.clone());
        let egress = self.egress.clone();
        Some((broker::LOOPBACK_PORT, move |listener: std::net::TcpListener| {
            let listener = listener.set_nonblocking(true).and_then(|()| tokio::net::TcpListener::from_std(listener));
            let Ok(listener) = listener else { return };
            if let Some(tasks) = tasks.lock().unwrap_or_else(PoisonError::into_inner).as_mut() {
                tasks.spawn(broker::serve_loopback(listener, session, run, egress));
            }
        }))
    }

    /// The variables a guest whose tier serves [`loopback`](Self::loopback) gets:
    /// `OPENAI_BASE_URL` with a model grant, and the proxy variables
    /// (`stockade_egress::proxy_env`) with a network grant.
    #[must_use]
    pub fn loopback_env(&self) -> Vec<(String, String)> {
        let mut env = Vec::new();
        if self.grants.model.is_some() {
            env.push(("OPENAI_BASE_URL".to_owned(), Self::model_base_url()));
        }
        if self.egress.is_some() {
            env.extend(net::proxy_env(broker::LOOPBACK_PORT));
        }
        env
    }

    /// `job` with [`loopback_env`](Self::loopback_env) added.
    #[cfg(any(feature = "process", feature = "docker"))]
    fn with_loopback_env(&self, job: Job) -> Result<Job, RunError> {
        self.loopback_env().into_iter().try_fold(job, |j, (k, v)| Ok(j.with_env(k, v)?))
    }

    /// The `OPENAI_BASE_URL` a guest uses to reach [`loopback`](Self::loopback)'s listener.
    #[must_use]
    pub fn model_base_url() -> String {
        format!("http://127.0.0.1:{}/v1", broker::LOOPBACK_PORT)
    }

    /// With secrets in the network grant, what a guest that sees the grants directory at
    /// `dir` gets beside the proxy's variables: the CA variables (`stockade_egress::CA_ENV`)
    /// naming [`NET_CA_FILE`], and each secret's placeholder.
    fn net_env(&self, dir: &str) -> Vec<(String, String)> {
        let Some(egress) = self.egress.as_ref().filter(|e| e.ca_pem().is_some()) else { return Vec::new() };
        let ca = format!("{dir}/{NET_CA_FILE}");
        let mut env: Vec<(String, String)> = net::CA_ENV.iter().map(|v| ((*v).to_owned(), ca.clone())).collect();
        env.extend(egress.secret_env());
        env
    }

    /// `job` with the broker's variables added for a guest that sees the grants directory
    /// at `guest_dir`: [`BROKER_ENV`] (the socket), [`GRANTS_ENV`] (the directory), and, if
    /// the job sets no `PATH`, a `PATH` that starts with the client's directory. A job that
    /// sets either of the first two itself is refused: nothing the job carries configures
    /// the broker.
    pub fn guest_job(&self, job: &Job, guest_dir: &str) -> Result<Job, RunError> {
        let reserved = [BROKER_ENV, GRANTS_ENV, MODEL_ENV, "OPENAI_API_KEY", "OPENAI_BASE_URL"];
        let dir = guest_dir.trim_end_matches('/');
        let net = self.net_env(dir);
        let loopback = self.loopback_env();
        let set_here = |k: &str| reserved.contains(&k) || net.iter().chain(&loopback).any(|(name, _)| name == k);
        if let Some(v) = job.env().iter().find(|v| set_here(v.key())) {
            return Err(RunError::Misconfigured(format!("{} is set by the broker, not by the job", v.key())));
        }
        let mut job = job
            .clone()
            .with_env(BROKER_ENV, format!("{dir}/{GRANTS_SOCKET}"))
            .and_then(|j| j.with_env(GRANTS_ENV, dir));
        if self.grants.model.is_some() {
            job = job
                .and_then(|j| j.with_env(MODEL_ENV, format!("{dir}/{}", broker::MODEL_SOCKET)))
                .and_then(|j| j.with_env("OPENAI_API_KEY", &*self.model_run.placeholder));
        }
        for (k, v) in net {
            job = job.and_then(|j| j.with_env(k, v));
        }
        if !job.as_ref().is_ok_and(|j| j.env().iter().any(|v| v.key() == "PATH")) {
            job = job.and_then(|j| j.with_env("PATH", format!("{dir}/bin:{DEFAULT_PATH}")));
        }
        Ok(job?)
    }

    /// A session's exec as its guest sees the grants: [`guest_job`](Self::guest_job) at
    /// `guest_dir` (the process tier's grants directory, or a docker session's `/broker`),
    /// plus [`loopback_env`](Self::loopback_env) when the loopback listener is in the
    /// session's network namespace.
    #[cfg(feature = "process")]
    pub(crate) fn session_job(&self, job: &Job, guest_dir: &str, loopback: bool) -> Result<Job, RunError> {
        // Each exec of a session gets the network grant's whole budget: the grant lives as
        // long as the session, and its totals would otherwise run dry for good.
        if let Some(e) = &self.egress {
            e.renew();
        }
        let job = self.guest_job(job, guest_dir)?;
        if loopback { self.with_loopback_env(job) } else { Ok(job) }
    }

    /// Handles one call in-process (the wasm tier's `host.call`): a call frame's payload in,
    /// the reply's payload out. `Err` means the session has ended; the reason is reported.
    pub async fn call(&self, payload: &[u8]) -> Result<Vec<u8>, String> {
        BrokerCaller::call_session(&self.session, payload).await
    }

    /// A handle for in-process calls that outlives a borrow of the broker.
    #[must_use]
    pub fn caller(&self) -> BrokerCaller {
        BrokerCaller(self.session.clone())
    }

    pub(crate) fn finish(&self) -> stockade_protocol::GrantsReport {
        if let Some(mut tasks) = self.tasks.lock().unwrap_or_else(PoisonError::into_inner).take() {
            tasks.abort_all();
        }
        let mut report = self.session.close();
        if let Some(egress) = &self.egress {
            egress.record_into(&mut report);
        }
        self.dirs.lock().unwrap_or_else(PoisonError::into_inner).clear();
        report
    }
}

impl Drop for Broker {
    /// A run cut short (its future dropped: a signal, an outer deadline) ends its broker as
    /// a finished run does: every task aborted, and a call still running closed as
    /// `cancelled` in the record its observer sees.
    fn drop(&mut self) {
        if self.tasks.lock().unwrap_or_else(PoisonError::into_inner).is_some() {
            let _ = self.finish();
        }
    }
}

/// In-process calls into one run's broker (see [`Broker::call`]).
#[derive(Clone)]
pub struct BrokerCaller(Arc<broker::Session>);

impl Debug for BrokerCaller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BrokerCaller")
    }
}

impl BrokerCaller {
    /// Handles one call frame's payload (see [`Broker::call`]).
    pub async fn call(&self, payload: &[u8]) -> Result<Vec<u8>, String> {
        Self::call_session(&self.0, payload).await
    }

    async fn call_session(session: &Arc<broker::Session>, payload: &[u8]) -> Result<Vec<u8>, String> {
        session.handle(payload).await.map_err(|e| e.0)
    }
}

#[cfg(feature = "process")]
#[async_trait]
impl Tier for stockade_process::ProcessTier {
    fn name(&self) -> &'static str {
        "process"
    }

    async fn run(&self, job: &Job) -> Result<Report, RunError> {
        stockade_process::ProcessTier::run(self, job).await
    }

    async fn run_granted(&self, job: &Job, broker: &Broker) -> Result<Report, RunError> {
        Tier::run_live(self, job, Some(broker), LiveIo::default()).await
    }

    async fn run_live(&self, job: &Job, broker: Option<&Broker>, io: LiveIo) -> Result<Report, RunError> {
        let Some(broker) = broker else {
            return stockade_process::ProcessTier::run_live(self, job, None, None, io).await;
        };
        let dir = broker.socket_dir()?;
        let mut job = broker.guest_job(job, stockade_process::GRANTS_GUEST_DIR)?;
        let loopback = match broker.loopback() {
            Some((port, serve)) => {
                job = broker.with_loopback_env(job)?;
                Some(stockade_process::Loopback::new(port, serve))
            }
            None => None,
        };
        stockade_process::ProcessTier::run_live(self, &job, Some(&dir), loopback, io).await
    }
}

#[cfg(feature = "wasm")]
#[async_trait]
impl Tier for stockade_wasm::WasmTier {
    fn name(&self) -> &'static str {
        "wasm"
    }

    async fn run(&self, job: &Job) -> Result<Report, RunError> {
        stockade_wasm::WasmTier::run(self, job).await
    }

    async fn run_granted(&self, job: &Job, broker: &Broker) -> Result<Report, RunError> {
        if broker.grants().programs.keys().next().is_some() {
            return Err(RunError::Unsupported {
                mechanism: "program grant".into(),
                reason: "the wasm tier runs no host programs (it has a module, not a PATH)".into(),
            });
        }
        // A network grant reaches a wasm guest as the call `fetch` only (the guest has no
        // sockets): the JavaScript global `fetch`.
        let calls: Arc<dyn stockade_wasm::HostCalls> = Arc::new(broker.caller());
        stockade_wasm::WasmTier::run_granted(self, job, calls).await
    }
}

#[cfg(feature = "wasm")]
impl stockade_wasm::HostCalls for BrokerCaller {
    fn call(
        &self,
        request: Vec<u8>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Vec<u8>, String>> + Send>> {
        let caller = self.clone();
        Box::pin(async move { caller.call(&request).await })
    }

    fn abort(&self, reason: String) {
        self.0.end(reason);
    }
}

#[cfg(feature = "docker")]
#[async_trait]
impl Tier for stockade_docker::DockerTier {
    fn name(&self) -> &'static str {
        "docker"
    }

    async fn run(&self, job: &Job) -> Result<Report, RunError> {
        stockade_docker::DockerTier::run(self, job).await
    }

    async fn run_granted(&self, job: &Job, broker: &Broker) -> Result<Report, RunError> {
        let dir = broker.socket_dir()?;
        let job = broker.guest_job(job, stockade_docker::spec::GRANTS)?;
        match broker.docker_join(self.oci_runtime(), "network grant in the docker tier")? {
            Some(join) => {
                let job = broker.with_loopback_env(job)?;
                stockade_docker::DockerTier::run_granted_in_netns(self, &job, &dir, join).await
            }
            None => stockade_docker::DockerTier::run_granted(self, &job, &dir).await,
        }
    }
}

#[cfg(feature = "docker")]
impl Broker {
    /// For a docker container: the `join` that puts this broker's loopback listener in the
    /// container's network namespace, given its init's host pid, if there is a listener to
    /// put there. A model grant also answers at OPENAI_BASE_URL, and a network grant's
    /// proxy is only there. Placing it takes root (joining a container's namespace), the
    /// process tier's `setns` and the engine's default runtime (gVisor's guest has a network
    /// stack of its own); without them the guest has `model.sock` and `stockade-call model`
    /// only (`None`), and a network grant fails closed ([`RunError::Unsupported`] naming
    /// `mechanism`).
    pub(crate) fn docker_join(
        &self,
        oci_runtime: Option<&str>,
        mechanism: &str,
    ) -> Result<Option<stockade_docker::session::Join>, RunError> {
        let root = stockade_sys::proc::is_root().map_err(|e| RunError::Internal(format!("reading /proc/self: {e}")))?;
        let placeable = cfg!(feature = "process") && root && oci_runtime.is_none();
        if self.grants().has_net() && !placeable {
            let why = if !root {
                "it needs root, to put the proxy's listener in the container's network namespace (setns)"
            } else if oci_runtime.is_some() {
                "gVisor's guest has a network stack of its own, where the host cannot put the proxy's listener"
            } else {
                "this build has no process tier, whose setns puts the proxy's listener in the container's network namespace"
            };
            return Err(RunError::Unsupported { mechanism: mechanism.into(), reason: why.into() });
        }
        #[cfg(feature = "process")]
        if let Some((port, serve)) = self.loopback()
            && placeable
        {
            return Ok(Some(Box::new(move |pid: u32| {
                let listener = stockade_process::listen_in_netns(pid, port)
                    .map_err(|e| format!("listening on 127.0.0.1:{port} in the container's network namespace: {e}"))?;
                serve(listener);
                Ok(())
            })));
        }
        Ok(None)
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
    grants_parent: Option<PathBuf>,
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

    /// Creates each run's grants directory under `dir` (default: the system's temporary
    /// directory). It must be reachable by the tiers' guest user and by the docker engine.
    #[must_use]
    pub fn grants_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.grants_parent = Some(dir.into());
        self
    }

    /// The sandbox.
    pub fn build(self) -> Result<Sandbox, BuildError> {
        Ok(Sandbox {
            tier: self.tier.ok_or(BuildError::NoTier)?,
            grants_parent: self.grants_parent.unwrap_or_else(std::env::temp_dir),
        })
    }
}

/// One tier, ready to run jobs.
#[derive(Debug)]
pub struct Sandbox {
    tier: Box<dyn Tier>,
    grants_parent: PathBuf,
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

    /// Runs `request` (a `&Job`, or a [`RunRequest`] with grants or live stdio) and returns
    /// the raw report (nothing in it is trusted). With grants, a broker serves them for this
    /// run only, and the report's `grants` section lists every call.
    pub async fn report<'a>(&self, request: impl Into<RunRequest<'a>>) -> Result<Report, RunError> {
        let RunRequest { job, grants, io } = request.into();
        let Some(grants) = grants.filter(|g| !g.is_empty()) else {
            return match io {
                LiveIo { stdin: None, stderr: None, stdout: None, .. } => self.tier.run(job).await,
                io => self.tier.run_live(job, None, io).await,
            };
        };
        let broker = Broker::new(grants.clone(), self.grants_parent.clone())?;
        let result = self.tier.run_live(job, Some(&broker), io).await;
        // Calls still in flight when the guest ended are refused from here on.
        let seen = broker.finish();
        let report = result?;
        let detail = format!(
            "{} data and {} function grants; {} calls, {} denied; policy decides every function call",
            grants.data.len(),
            grants.functions.len(),
            seen.total,
            seen.denied
        );
        Ok(report.with_enforced(Enforced::new(Mechanism::GrantsBroker, detail)).with_grants(seen))
    }

    /// Runs `request` and verifies the report against `contract`.
    pub async fn run<'a, T: Debug>(
        &self,
        request: impl Into<RunRequest<'a>>,
        contract: &Contract<T>,
    ) -> Result<Outcome<T>, RunError> {
        let report = self.report(request).await?;
        Ok(stockade_verify::verify(report, contract))
    }
}

/// One run, as a [`Sandbox`] takes it: the job, and optionally the [`Grants`] served to it
/// and live stdio ([`LiveIo`]). A `&Job` is a request with neither.
pub struct RunRequest<'a> {
    job: &'a Job,
    grants: Option<Arc<Grants>>,
    io: LiveIo,
}

impl<'a> RunRequest<'a> {
    /// A request to run `job`.
    #[must_use]
    pub fn new(job: &'a Job) -> Self {
        Self { job, grants: None, io: LiveIo::default() }
    }

    /// The job it runs.
    #[must_use]
    pub fn job(&self) -> &'a Job {
        self.job
    }

    /// Serves `grants` to this run (none, if they are empty).
    #[must_use]
    pub fn grants(mut self, grants: Arc<Grants>) -> Self {
        self.grants = Some(grants);
        self
    }

    /// Streams stdin to the guest and shows its stderr as it arrives (see [`Tier::run_live`]).
    #[must_use]
    pub fn live(mut self, io: LiveIo) -> Self {
        self.io = io;
        self
    }
}

impl<'a> From<&'a Job> for RunRequest<'a> {
    fn from(job: &'a Job) -> Self {
        Self::new(job)
    }
}

impl Debug for RunRequest<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunRequest").field("job", self.job).field("grants", &self.grants).finish_non_exhaustive()
    }
}
