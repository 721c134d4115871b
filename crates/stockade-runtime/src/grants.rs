//! What a job is granted: named data, named host functions, and the policy that decides
//! every function call.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use stockade_policy::allow::{Permit, Policy, Registry, ToolSpec};
use stockade_protocol::GrantCall;
use stockade_protocol::broker::{GrantName, LIST_GRANT};

/// Largest size of all data grants of one job together, serialised: 1 MiB.
pub const MAX_DATA_BYTES: usize = 1 << 20;

/// Most grants (data and functions together) one job may have: 256 (a host MCP server such
/// as GitHub's lists about a hundred tools, each one grant).
pub const MAX_GRANTS: usize = 256;

/// What a function grant's future yields: a JSON result, or an error message for the guest.
pub type GrantResult = Result<Value, String>;

/// A boxed future of a [`GrantResult`].
pub type GrantFuture = Pin<Box<dyn Future<Output = GrantResult> + Send>>;

/// A host function a guest may call. It runs only with the [`Permit`] the policy minted
/// for exactly this call (`permit.call().args_json()` are the arguments). The arguments
/// come from the sandbox (source `sandbox`): the broker has checked them against the
/// grant's schema and the policy, and nothing more.
pub trait GrantFn: Send + Sync {
    /// Runs the function. The broker bounds its time; a future that is dropped at the
    /// deadline must leave nothing running (spawned work is the implementor's to bound).
    fn call(&self, permit: Permit) -> GrantFuture;
}

impl<F, Fut> GrantFn for F
where
    F: Fn(Permit) -> Fut + Send + Sync,
    Fut: Future<Output = GrantResult> + Send + 'static,
{
    fn call(&self, permit: Permit) -> GrantFuture {
        Box::pin(self(permit))
    }
}

/// A grant could not be declared.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GrantError {
    /// The name is not a grant name (1–64 bytes of `[A-Za-z0-9_.-]`), or is reserved.
    #[error("invalid grant name {0:?}: 1-64 bytes of [A-Za-z0-9_.-], and not `stockade.*`")]
    Name(String),
    /// Two grants share a name.
    #[error("grant {0:?} is declared twice")]
    Duplicate(String),
    /// Two grants' names would be one name where a `.` cannot be spelled (a chat tool
    /// name, a Python attribute: [`door_name`] writes `.` as `__`).
    #[error("grants {0:?} and {1:?} are both {door:?} where a `.` is written `__`: rename one", door = door_name(.0))]
    Collides(String, String),
    /// More than [`MAX_GRANTS`] grants.
    #[error("at most {MAX_GRANTS} grants per job")]
    TooMany,
    /// The data grants are larger than [`MAX_DATA_BYTES`] together.
    #[error("data grants of {0} bytes exceed the maximum of {MAX_DATA_BYTES} bytes")]
    DataTooLarge(usize),
    /// A function's argument schema is not one the policy can check.
    #[error("grant {name:?}: {reason}")]
    Schema {
        /// The grant.
        name: String,
        /// What is wrong with its schema.
        reason: String,
    },
    /// A program's runtime could not be found ([`Grants::program_linked`]).
    #[error("program {name:?}: {reason}")]
    Program {
        /// The program grant.
        name: String,
        /// Why (the loader's own words where it gave them).
        reason: String,
    },
}

/// A grant's argument schema, compiled for the broker (JSON Schema draft 2020-12 unless
/// it says otherwise). Nothing is fetched: a `$ref` resolves only inside the schema. A
/// `pattern` runs on the `regex` crate (linear time: the guest writes the strings it is
/// matched against), so a pattern that needs backtracking is refused here.
fn compile_schema(schema: &Value) -> Result<Arc<jsonschema::Validator>, String> {
    jsonschema::options()
        .with_pattern_options(jsonschema::PatternOptions::regex())
        .build(schema)
        .map(Arc::new)
        .map_err(|e| format!("its schema cannot be checked: {e}"))
}

/// How a grant's name is spelled where `.` cannot be (a chat tool's name, a Python
/// attribute): each `.` as `__`, so a host MCP server's `desk.file_ticket` is
/// `desk__file_ticket`. Two grants with one such name are refused when loaded.
#[must_use]
pub fn door_name(name: &str) -> String {
    name.replace('.', "__")
}

/// The last component of `path`, as UTF-8.
fn file_name(path: &std::path::Path) -> Option<String> {
    path.file_name()?.to_str().map(str::to_owned)
}

fn grant_name(name: &str) -> Result<GrantName, GrantError> {
    if name.starts_with("stockade.") || name == LIST_GRANT {
        return Err(GrantError::Name(name.into()));
    }
    GrantName::new(name).map_err(|_| GrantError::Name(name.into()))
}

/// A named host function with a JSON Schema for its arguments object.
#[derive(Clone)]
pub struct FunctionGrant {
    pub(crate) name: GrantName,
    pub(crate) schema: Value,
    pub(crate) spec: ToolSpec,
    /// The whole schema, compiled: every keyword (`enum`, `minimum`, `maxLength`,
    /// `pattern`, ...) is checked at the broker, integers exactly.
    pub(crate) validator: Arc<jsonschema::Validator>,
    pub(crate) params: Vec<String>,
    pub(crate) description: String,
    pub(crate) handler: Arc<dyn GrantFn>,
}

impl fmt::Debug for FunctionGrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FunctionGrant").field("name", &self.name).field("params", &self.params).finish_non_exhaustive()
    }
}

impl FunctionGrant {
    /// A function `name` whose arguments object follows `schema` (`type: object` with
    /// `properties` and `required`, the form OpenAI tool definitions use; see
    /// `stockade_policy::allow::ToolSpec::from_json_schema` for the subset understood).
    ///
    /// The names in `required`, in order, are also the function's positional parameters:
    /// a JavaScript guest may call `add(1, 2)` for `{"a":1,"b":2}` when `required` is
    /// `["a","b"]`.
    pub fn new(name: &str, schema: Value, handler: impl GrantFn + 'static) -> Result<Self, GrantError> {
        let name = grant_name(name)?;
        let spec = ToolSpec::from_json_schema(name.as_str(), &schema)
            .map_err(|e| GrantError::Schema { name: name.as_str().into(), reason: e.to_string() })?;
        let validator =
            compile_schema(&schema).map_err(|reason| GrantError::Schema { name: name.as_str().into(), reason })?;
        let params = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
            .unwrap_or_default();
        Ok(Self { name, schema, spec, validator, params, description: String::new(), handler: Arc::new(handler) })
    }

    /// Checks `args` against the whole schema: `Err` is the first violation, one line (its
    /// place in the arguments and what was wanted), at most 512 bytes.
    pub(crate) fn check_args(&self, args: &Value) -> Result<(), String> {
        match self.validator.iter_errors(args).next() {
            None => Ok(()),
            Some(e) => {
                let line = format!(
                    "{}: {e}",
                    if e.instance_path().as_str().is_empty() { "/" } else { e.instance_path().as_str() }
                );
                Err(stockade_protocol::completion::cut(&line.replace(['\n', '\r'], " "), 512))
            }
        }
    }

    /// Describes the function to the guest (the manifest's `description`; the Python
    /// guest's tool description), at most 4 KiB.
    #[must_use]
    pub fn describe(mut self, description: &str) -> Self {
        self.description = stockade_protocol::completion::cut(description, 4 << 10);
        self
    }

    /// Marks the function's output as possibly an outsider's words (a web page, a letter, a
    /// host MCP server's answer): once a call of it returned, the run's policy sees the
    /// session as having read untrusted data (`when = { session_read_untrusted = ... }`), as
    /// the agent loop's does.
    #[must_use]
    pub fn untrusted_output(mut self) -> Self {
        self.spec = self.spec.untrusted_output();
        self
    }

    /// The grant's name.
    #[must_use]
    pub fn name(&self) -> &str {
        self.name.as_str()
    }

    /// What the guest is told the function does ([`describe`](Self::describe)).
    #[must_use]
    pub fn description(&self) -> &str {
        &self.description
    }

    /// The arguments' JSON Schema, as given.
    #[must_use]
    pub fn schema(&self) -> &Value {
        &self.schema
    }
}

/// Bounds on one run's grant calls. Reaching `max_calls` or sending a frame over
/// `max_call_bytes` ends the run's broker session; the others fail the one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct GrantLimits {
    /// Most calls per run (default 1024).
    pub max_calls: u32,
    /// Largest call frame, in bytes (default 64 KiB).
    pub max_call_bytes: u32,
    /// Largest reply frame, in bytes (default 2 MiB; a larger result fails the call).
    pub max_reply_bytes: u32,
    /// Longest a function may run, including its wait for a concurrency slot (default 10 s).
    pub call_timeout: Duration,
    /// Most function calls running at once (default 4).
    pub concurrency: usize,
    /// Most broker connections open at once (default 8).
    pub max_connections: usize,
    /// Most function calls per run (default: no bound but `max_calls`); past it a function
    /// call is refused (`max-function-calls`) and runs nothing, and the session goes on.
    pub max_function_calls: u32,
}

impl Default for GrantLimits {
    fn default() -> Self {
        Self {
            max_calls: 1024,
            max_call_bytes: 64 << 10,
            max_reply_bytes: 2 << 20,
            call_timeout: Duration::from_secs(10),
            concurrency: 4,
            max_connections: 8,
            max_function_calls: u32::MAX,
        }
    }
}

impl GrantLimits {
    /// Sets the most calls per run.
    #[must_use]
    pub fn max_calls(mut self, n: u32) -> Self {
        self.max_calls = n;
        self
    }

    /// Sets the most function calls per run (an agent's tool calls).
    #[must_use]
    pub fn max_function_calls(mut self, n: u32) -> Self {
        self.max_function_calls = n;
        self
    }

    /// Sets the per-call time limit.
    #[must_use]
    pub fn call_timeout(mut self, d: Duration) -> Self {
        self.call_timeout = d;
        self
    }

    /// Sets the most function calls running at once (at least 1).
    #[must_use]
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// Sets the largest call frame (at least 1 KiB, at most the protocol's 1 MiB frame).
    #[must_use]
    pub fn max_call_bytes(mut self, n: u32) -> Self {
        self.max_call_bytes = n.clamp(1 << 10, stockade_protocol::MAX_FRAME_LEN);
        self
    }
}

/// What serves a run's model grant: every connection a guest opens to the run's
/// `model.sock` (an HTTP/1.1 OpenAI-compatible endpoint; `stockade_agent::ModelProxy` is
/// one). The service holds the real credential; the guest holds only [`ModelRun`]'s
/// per-run placeholder.
pub trait ModelService: Send + Sync {
    /// Serves one connection of the run `run` until it closes or the future is dropped
    /// (when the run ends).
    fn serve(&self, conn: ModelConn, run: ModelRun) -> Pin<Box<dyn Future<Output = ()> + Send>>;

    /// Answers one chat completion asked for as a call to the grant [`MODEL_GRANT`] (the
    /// wasm tier's `model({...})` global, or `stockade-call model '{...}'`): the request's
    /// JSON body in (an OpenAI chat completions request, not streamed), the response's JSON
    /// out, or why not. The broker has already counted and bounded the call and records its
    /// outcome, so the service must not call [`ModelRun::begin`] or [`ModelRun::record`];
    /// the same validation, upstream and token budget as `serve` apply. The default refuses:
    /// a service that speaks only HTTP.
    fn complete(&self, request: serde_json::Value, run: ModelRun) -> ModelCall {
        let _ = (request, run);
        Box::pin(async { Err("this model service answers only on its socket".to_owned()) })
    }
}

/// The name under which a model grant also answers calls (see [`ModelService::complete`]);
/// no function grant may take it while a model is granted.
pub const MODEL_GRANT: &str = "model";

/// The grant name a network grant also answers to as a call: `fetch({url, init})`, for a
/// guest without sockets (the wasm tier's JavaScript `fetch`), made
/// through the run's own proxy.
pub const FETCH_GRANT: &str = "fetch";

/// The answer of [`ModelService::complete`].
pub type ModelCall = Pin<Box<dyn Future<Output = Result<serde_json::Value, String>> + Send>>;

/// A byte stream a guest opened to its model grant.
pub trait ModelStream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> ModelStream for T {}

/// One guest connection to a model grant: `model.sock` (a unix stream), or the process
/// tier's loopback listener (a TCP stream) in the run's own network namespace.
pub type ModelConn = Box<dyn ModelStream>;

/// One run's side of a model grant, as its [`ModelService`] sees it: the placeholder key
/// the guest was given, the run's call bound and record, and its token count.
#[derive(Clone)]
pub struct ModelRun {
    pub(crate) placeholder: Arc<str>,
    pub(crate) session: Arc<crate::broker::Session>,
    pub(crate) tokens: Arc<std::sync::atomic::AtomicU64>,
    /// Chat requests asked for so far ([`ModelRun::begin_request`]).
    pub(crate) requests: Arc<std::sync::atomic::AtomicU64>,
}

impl fmt::Debug for ModelRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelRun").field("placeholder", &"[per-run]").finish_non_exhaustive()
    }
}

impl ModelRun {
    /// Relayed provenance ([`Grants::relayed_provenance`]): a chat request the loop sent,
    /// as validated. Text in it the host did not give or relay is remembered as the
    /// sandbox's, and a system, user or assistant text of the sandbox's sets
    /// read-untrusted. A no-op for other runs.
    pub fn witness_request(&self, messages: &[stockade_protocol::chat::ChatMessage]) {
        self.session.witness_request(messages);
    }

    /// Relayed provenance: the response the grant relays, its text and its calls (chat
    /// name and arguments, as the loop receives them). A no-op for other runs.
    pub fn witness_response(&self, text: Option<&str>, calls: Vec<(String, Value)>) {
        self.session.witness_response(text, calls);
    }

    /// True if `presented` is exactly this run's placeholder key (compared in constant time).
    #[must_use]
    pub fn placeholder_matches(&self, presented: &str) -> bool {
        let (a, b) = (self.placeholder.as_bytes(), presented.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }

    /// Counts one request against the run's call bound: `Err` (why) once the run has ended,
    /// its broker session has ended, or the bound is reached.
    pub fn begin(&self) -> Result<(), String> {
        self.session.begin_external()
    }

    /// Records one request in the run's report, as the grant `model`.
    pub fn record(&self, outcome: stockade_protocol::GrantOutcome, rule: &str, bytes: (u64, u64), duration: Duration) {
        self.session.record("model", outcome, rule, bytes, duration);
    }

    /// Counts one chat request of the run and returns how many there have been, this one
    /// included: a service bounds a run's model calls (an agent's turns) with it, on the
    /// host, whatever the guest's loop says.
    pub fn begin_request(&self) -> u64 {
        self.requests.fetch_add(1, std::sync::atomic::Ordering::SeqCst).saturating_add(1)
    }

    /// Adds `n` tokens to the run's count and returns the new total.
    pub fn add_tokens(&self, n: u64) -> u64 {
        self.tokens.fetch_add(n, std::sync::atomic::Ordering::SeqCst).saturating_add(n)
    }

    /// The tokens counted so far.
    #[must_use]
    pub fn tokens(&self) -> u64 {
        self.tokens.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Everything a job is granted. Fixed when the run starts: the guest cannot add to it.
#[derive(Clone, Default)]
pub struct Grants {
    pub(crate) data: BTreeMap<String, Value>,
    data_bytes: usize,
    pub(crate) functions: BTreeMap<String, FunctionGrant>,
    pub(crate) policy: Option<Arc<Policy>>,
    pub(crate) limits: GrantLimits,
    pub(crate) model: Option<Arc<dyn ModelService>>,
    pub(crate) net: Option<crate::net::NetGrant>,
    pub(crate) programs: BTreeMap<String, std::path::PathBuf>,
    /// The shared objects (and loaders) of [`Grants::program_linked`], by file name in `lib/`.
    pub(crate) libraries: BTreeMap<String, std::path::PathBuf>,
    /// A linked program's loader, by the program's name.
    loaders: BTreeMap<String, String>,
    /// Who answers a call the policy marks `ask`.
    pub(crate) approver: Option<Arc<dyn GrantApprover>>,
    /// An earlier turn of the same conversation read untrusted data.
    pub(crate) read_untrusted: bool,
    /// Told of each decision and each call's end as they happen.
    pub(crate) observer: Option<CallObserver>,
    /// Relayed provenance: the system and user messages the host gives the loop.
    pub(crate) relayed: Option<Arc<Vec<String>>>,
}

/// What the broker tells a [`CallObserver`], as it happens.
#[derive(Debug)]
#[non_exhaustive]
pub enum CallEvent<'a> {
    /// The policy allowed a function call, which runs now: its grant, the rule, and its
    /// canonical arguments (cut as a record's are). The call's [`CallEvent::Ended`] follows,
    /// with `ran` set, however it ends.
    Allowed {
        /// The grant.
        grant: &'a str,
        /// The rule that allowed it.
        rule: &'a str,
        /// Its arguments as the policy saw them.
        args: &'a str,
    },
    /// A call's record, written when the call ends: a denial or a refusal at its decision,
    /// a call that ran when it returns, and one still running when the run ends at that end
    /// (`failure` `cancelled`). `ran` says an [`CallEvent::Allowed`] came before it.
    Ended {
        /// The record, as the report holds it.
        call: &'a GrantCall,
        /// The call was allowed and ran (or was running).
        ran: bool,
    },
}

/// Called by the broker with each [`CallEvent`] of a run, in order, as it happens (a
/// `--trace` written line by line). It runs on the broker's task while the run's record is
/// locked: it must be quick and must not call into the run.
pub type CallObserver = Arc<dyn Fn(CallEvent<'_>) + Send + Sync>;

/// Answers a function call the policy marks `ask` (a human at a terminal, an approval in a
/// chat): whether this one call, exactly as given, may run. The broker asks one question at a
/// time, while the call waits (under the run's deadline, not the call's timeout); an
/// approved call is decided again with a single-use approval for exactly its arguments.
#[async_trait::async_trait]
pub trait GrantApprover: Send + Sync + fmt::Debug {
    /// Whether `call` (its tool and arguments, from the sandbox) may run; `rule` asked, for
    /// `reason`.
    async fn approve(&self, call: &stockade_policy::allow::ToolCall, rule: &str, reason: &str) -> bool;
}

impl fmt::Debug for Grants {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Grants")
            .field("data", &self.data.keys().collect::<Vec<_>>())
            .field("functions", &self.functions.keys().collect::<Vec<_>>())
            .field("policy", &self.policy.is_some())
            .field("limits", &self.limits)
            .field("model", &self.model.is_some())
            .field("net", &self.net)
            .field("programs", &self.programs.keys().collect::<Vec<_>>())
            .field("libraries", &self.libraries.keys().collect::<Vec<_>>())
            .field("approver", &self.approver)
            .field("observer", &self.observer.is_some())
            .finish()
    }
}

impl Grants {
    /// No grants.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn check_new(&self, name: &str) -> Result<(), GrantError> {
        if self.data.contains_key(name) || self.functions.contains_key(name) {
            return Err(GrantError::Duplicate(name.into()));
        }
        // `a.b__c` and `a__b.c` are one name to a model or a guest that cannot spell `.`:
        // a call meant for one would run the other.
        let door = door_name(name);
        if let Some(other) = self.data.keys().chain(self.functions.keys()).find(|n| door_name(n) == door) {
            return Err(GrantError::Collides(other.clone(), name.into()));
        }
        if self.data.len() + self.functions.len() >= MAX_GRANTS {
            return Err(GrantError::TooMany);
        }
        Ok(())
    }

    /// Grants the JSON value `value` as `name`. Data is given, not called: reading it needs
    /// no policy, and every tier shows it to the guest (a file in the grants directory, a
    /// global in JavaScript, a call through the broker).
    pub fn data(mut self, name: &str, value: Value) -> Result<Self, GrantError> {
        grant_name(name)?;
        self.check_new(name)?;
        let bytes = serde_json::to_vec(&value).map(|v| v.len()).unwrap_or(usize::MAX);
        let total = self.data_bytes.saturating_add(bytes);
        if total > MAX_DATA_BYTES {
            return Err(GrantError::DataTooLarge(total));
        }
        self.data_bytes = total;
        self.data.insert(name.into(), value);
        Ok(self)
    }

    /// Starts each run's policy as having read untrusted data (`session_read_untrusted`):
    /// for a conversation an earlier turn of which read some (a channel), whose history
    /// can carry it on. Taint lasts; nothing clears it.
    #[must_use]
    pub fn already_read_untrusted(mut self) -> Self {
        self.read_untrusted = true;
        self
    }

    /// Grants a host function. Every call of it is decided by the [`policy`](Self::policy)
    /// first; without a policy every call is denied.
    pub fn function(mut self, f: FunctionGrant) -> Result<Self, GrantError> {
        self.check_new(f.name())?;
        self.functions.insert(f.name().into(), f);
        Ok(self)
    }

    /// Grants every tool of a host MCP server as the function `SERVER.TOOL`
    /// ([`crate::mcp`]); the grants hold the server, which ends when the last of them (and
    /// the caller's handle) is dropped.
    pub fn mcp(mut self, server: &Arc<crate::mcp::McpServer>) -> Result<Self, GrantError> {
        for grant in server.grants()? {
            self = self.function(grant)?;
        }
        Ok(self)
    }

    /// Gives the guest a host program to run: a copy of the regular file at `path`, made
    /// when the run starts, as `bin/NAME` in the run's grants directory (on the guest's
    /// `PATH` unless the job sets one; read-only, like the client beside it). The copy is the
    /// guest's to run with the guest's authority, inside the tier: a program is not a
    /// function grant and the host runs nothing of it. Process and docker tiers (a docker
    /// image needs what the program links); the wasm tier refuses it.
    pub fn program(mut self, name: &str, path: impl Into<std::path::PathBuf>) -> Result<Self, GrantError> {
        grant_name(name)?;
        if name == "stockade-call" || name.starts_with('.') || self.programs.contains_key(name) {
            return Err(GrantError::Duplicate(name.into()));
        }
        self.programs.insert(name.into(), path.into());
        Ok(self)
    }

    /// Like [`program`](Self::program), for a dynamically linked program that is to run where
    /// the image lacks what it links (a docker image built on busybox or `FROM scratch`): its
    /// dynamic loader and each shared object the host's loader resolves for it are copied too,
    /// as `lib/NAME` in the grants directory (the name the loader looks for), and
    /// [`program_command`](Self::program_command) starts it through that loader. The
    /// objects are found as `ldd` finds them: the host's loader is asked to `--list` the
    /// program, in an empty environment, which maps the objects and runs none of the
    /// program's code, so the program must be one the host trusts. A static program or a
    /// script is granted as [`program`](Self::program) grants it. A loader that cannot list
    /// the program (a library it does not find, another architecture) is
    /// [`GrantError::Program`], with the loader's words.
    pub fn program_linked(self, name: &str, path: impl Into<std::path::PathBuf>) -> Result<Self, GrantError> {
        let path = path.into();
        let failed = |e: std::io::Error| GrantError::Program { name: name.into(), reason: e.to_string() };
        let linked = crate::linked::resolve(&path).map_err(failed)?;
        let mut this = self.program(name, path)?;
        let Some(linked) = linked else { return Ok(this) };
        let loader = file_name(&linked.loader).ok_or_else(|| {
            failed(std::io::Error::other(format!("its loader {} has no file name", linked.loader.display())))
        })?;
        for (lib, source) in std::iter::once((loader.clone(), linked.loader)).chain(linked.objects) {
            if lib.is_empty() || lib.contains('/') || lib == "." || lib == ".." || lib.len() > 255 {
                return Err(failed(std::io::Error::other(format!("the loader names a library {lib:?}"))));
            }
            match this.libraries.get(&lib) {
                Some(had) if *had != source => return Err(GrantError::Duplicate(lib)),
                _ => {
                    this.libraries.insert(lib, source);
                }
            }
        }
        this.loaders.insert(name.into(), loader);
        Ok(this)
    }

    /// How a shell inside the run starts program `name`: its name, found on the guest's
    /// `PATH`, or, for a [`program_linked`](Self::program_linked) program with a loader, that
    /// loader with the run's `lib/` as its only library path. Shell words over
    /// `$STOCKADE_GRANTS`, to be followed by the arguments (`exec WORDS "$@"`); `None` for a
    /// name that is not a program grant.
    #[must_use]
    pub fn program_command(&self, name: &str) -> Option<String> {
        if !self.programs.contains_key(name) {
            return None;
        }
        let dir = crate::GRANTS_ENV;
        Some(match self.loaders.get(name) {
            Some(loader) => {
                format!("\"${dir}/lib/{loader}\" --library-path \"${dir}/lib\" \"${dir}/bin/{name}\"")
            }
            None => name.to_owned(),
        })
    }

    /// The programs' names.
    pub fn program_names(&self) -> impl Iterator<Item = &str> {
        self.programs.keys().map(String::as_str)
    }

    /// The function grants as a policy registry, to load a policy against:
    /// `Policy::from_toml(text, &grants.registry())`.
    #[must_use]
    pub fn registry(&self) -> Registry {
        self.functions.values().fold(Registry::new(), |r, f| r.with(f.spec.clone()))
    }

    /// Decides every function call by `policy`. Its registry should be
    /// [`registry`](Self::registry): a function it does not know is denied.
    #[must_use]
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = Some(Arc::new(policy));
        self
    }

    /// Like [`policy`](Self::policy), for a policy already shared.
    #[must_use]
    pub fn shared_policy(mut self, policy: Arc<Policy>) -> Self {
        self.policy = Some(policy);
        self
    }

    /// Puts each call the policy marks `ask` to `approver`; without one, such a call is
    /// denied, saying that a sandbox call has no one to ask.
    #[must_use]
    pub fn approver(mut self, approver: Arc<dyn GrantApprover>) -> Self {
        self.approver = Some(approver);
        self
    }

    /// The guest is an agent's loop whose model this run's model grant relays (a confined
    /// agent; the loop was given `host_texts` as its system and user messages): each function
    /// call's arguments get their source from what the host relayed, not from the loop's word
    /// (G16, see the crate docs). Without it every argument is `sandbox`.
    #[must_use]
    pub fn relayed_provenance(mut self, host_texts: Vec<String>) -> Self {
        self.relayed = Some(Arc::new(host_texts));
        self
    }

    /// Tells `observer` of each decision and each call's end as they happen
    /// ([`CallEvent`]): a record that does not wait for the run to end, and in which a call
    /// the run's end cut short is closed as `cancelled`.
    #[must_use]
    pub fn observer(mut self, observer: CallObserver) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Sets the bounds on calls.
    #[must_use]
    pub fn limits(mut self, limits: GrantLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Grants a model: the guest reaches `service` at `model.sock` in its grants directory
    /// (`$STOCKADE_MODEL_SOCKET`) with the per-run placeholder key in `$OPENAI_API_KEY`; the
    /// real credential stays with the service. Process and docker tiers only.
    #[must_use]
    pub fn model(mut self, service: Arc<dyn ModelService>) -> Self {
        self.model = Some(service);
        self
    }

    /// Grants the network through a policed proxy on the run's own loopback (see
    /// `stockade_egress`): `HTTP_PROXY`, `HTTPS_PROXY` and `ALL_PROXY` point the guest's
    /// clients at it, and every connection is decided by `net`'s policy. Process tier, and
    /// docker tier as root under the engine's default runtime; elsewhere the run fails
    /// closed.
    #[must_use]
    #[cfg(feature = "net")]
    pub fn net(mut self, net: stockade_egress::NetGrant) -> Self {
        self.net = Some(net);
        self
    }

    /// True if the network is granted.
    #[must_use]
    pub fn has_net(&self) -> bool {
        self.net.is_some()
    }

    /// True if a model is granted.
    #[must_use]
    pub fn has_model(&self) -> bool {
        self.model.is_some()
    }

    /// True if nothing is granted.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
            && self.functions.is_empty()
            && self.model.is_none()
            && self.net.is_none()
            && self.programs.is_empty()
            && self.libraries.is_empty()
    }

    /// The data grants' names.
    pub fn data_names(&self) -> impl Iterator<Item = &str> {
        self.data.keys().map(String::as_str)
    }

    /// The function grants' names.
    pub fn function_names(&self) -> impl Iterator<Item = &str> {
        self.functions.keys().map(String::as_str)
    }

    /// The function grants, by name.
    pub fn function_grants(&self) -> impl Iterator<Item = &FunctionGrant> {
        self.functions.values()
    }

    /// What [`LIST_GRANT`] answers: the data and each function's name, positional
    /// parameters and schema.
    pub(crate) fn manifest(&self) -> Value {
        let mut functions: Vec<Value> = self
            .functions
            .values()
            .map(|f| {
                let mut entry = serde_json::json!({"name": f.name(), "params": f.params, "schema": f.schema});
                if !f.description.is_empty() {
                    entry["description"] = Value::String(f.description.clone());
                }
                entry
            })
            .collect();
        if self.model.is_some() {
            functions.push(serde_json::json!({
                "name": MODEL_GRANT,
                "params": ["request"],
                "schema": {"type": "object", "description": "an OpenAI chat completions request; answers with the response"},
            }));
        }
        if self.net.is_some() {
            functions.push(serde_json::json!({
                "name": FETCH_GRANT,
                "params": ["url", "init"],
                "schema": {"type": "object", "description": "one HTTP request through the run's network grant: {url, init: {method, headers, body}}; answers {status, statusText, headers, body}"},
            }));
        }
        serde_json::json!({ "data": self.data, "functions": functions })
    }
}
