//! `stockade.node`: the napi layer of the Node package `stockade`, over `stockade-bindings`.
//! It holds no logic of its own: options and values cross as JSON text (bytes as a
//! `Buffer`), a run is a Promise settled by one of the bindings' run threads (never libuv's
//! pool, which the host's own file calls share), and a refusal is
//! either an outcome with `ok: false` (runs) or an error whose message is
//! `stockade-refusal:` and the refusal as JSON (decisions, marks); the package's `index.js`
//! turns both into its typed errors (`Timeout`, `NonZeroExit`, ...), so no refusal reaches a
//! caller as a value.
//!
//! # Position in the stack
//! Depends on: `stockade-bindings` (and napi, whose one owner this crate is). Used by: the
//! `stockade` Node package (`index.js`). Nothing in the workspace depends on it.
//!
//! # Threat model
//! That of `stockade-bindings`: the host program is trusted, a guest's output is not.
//!
//! # Guarantees
//! Those of `stockade-bindings`; this layer adds that a host function (a JavaScript
//! function, synchronous or `async`) runs on Node's own thread, called through a thread-safe
//! function while the run waits, its Promise awaited without holding Node's loop, and that a
//! run (`run`, `runCode`) never blocks Node's event loop. `runSync` and
//! `runCodeSync` are the same run on Node's own thread, for callers that want its cost
//! without the Promise's thread round trip; they refuse host functions, which need that
//! thread. A session (`Session`) is the bindings' `BoundSession`, each call a Promise settled
//! by a task of the bindings' runtime (it waits on processes and files, holding no thread).
//!
//! # Non-guarantees
//! A host function that never returns, or whose Promise never settles, holds its call until
//! the grant's call timeout; the Promise itself is not cancelled (JavaScript cannot cancel one).
//!
//! # Failure behaviour
//! Bad options are an `InvalidOptions` refusal naming the option.
//!
//! # Unsafe
//! None of ours: `#![deny(unsafe_code)]`; napi's macros expand to the FFI glue.
//!
//! # Ambient authority
//! That of `stockade-bindings`.
//!
//! # Feature flags
//! None.
//!
//! # Invariants
//! A `Grants` object's functions go to exactly one run (the run takes them).

#![deny(unsafe_code)]

use std::sync::{Arc, Mutex, PoisonError};

use napi::bindgen_prelude::{Buffer, Function, Object, Promise};
use napi::{Env, Error, Status};
use napi_derive::napi;
use stockade_bindings::{self as core, Refused};

/// A refusal as a thrown error: the package's `index.js` reads it back.
fn thrown(r: &Refused) -> Error {
    let json = serde_json::json!({"kind": r.kind, "message": r.message, "report": r.report});
    Error::new(Status::GenericFailure, format!("stockade-refusal:{json}"))
}

fn json_arg(what: &str, text: &str) -> Result<serde_json::Value, Error> {
    serde_json::from_str(text).map_err(|e| thrown(&Refused::invalid(format!("{what}: {e}"))))
}

/// Names the process tier's helper binary.
#[napi]
pub fn set_helper(path: String) {
    core::set_helper(path);
}

/// Every refusal kind, for the package's error classes.
#[napi]
pub fn refusal_kinds() -> Vec<String> {
    core::REFUSAL_KINDS.iter().map(|k| (*k).to_owned()).collect()
}

/// A run's outcome: `ok` with `kind` (`text`, `json`, `bytes`) and the value (`value`, JSON
/// text for `json`; `bytes`), or not `ok` with the refusal's `kind` and `message`; and the
/// report (JSON) where the run happened.
#[napi(object)]
pub struct RunOutcome {
    /// Verified.
    pub ok: bool,
    /// `text`, `json` or `bytes`; or the refusal's kind.
    pub kind: String,
    /// The value (JSON text for `json`).
    pub value: Option<String>,
    /// The value, for `bytes`.
    pub bytes: Option<Buffer>,
    /// The refusal's one line.
    pub message: Option<String>,
    /// The run's report (JSON), where it ran.
    pub report: Option<String>,
}

impl RunOutcome {
    fn of(result: Result<core::Ran, Refused>) -> Self {
        match result {
            Ok(ran) => {
                let (kind, value, bytes) = match ran.value {
                    core::Value::Text(s) => ("text", Some(s), None),
                    core::Value::Json(j) => ("json", Some(j.to_string()), None),
                    core::Value::Bytes(b) => ("bytes", None, Some(Buffer::from(b))),
                };
                Self { ok: true, kind: kind.into(), value, bytes, message: None, report: Some(ran.report) }
            }
            Err(r) => Self {
                ok: false,
                kind: r.kind.into(),
                value: None,
                bytes: None,
                message: Some(r.message),
                report: r.report,
            },
        }
    }
}

/// The host functions one run may call: each a JavaScript function taking the arguments as
/// JSON text and answering a Promise of JSON text (the package wraps the user's, which may
/// be synchronous or `async`).
#[napi]
pub struct Grants {
    functions: Mutex<Vec<core::FunctionGrant>>,
}

#[napi]
impl Grants {
    /// No functions yet.
    #[napi(constructor)]
    #[must_use]
    pub fn new() -> Self {
        Self { functions: Mutex::new(Vec::new()) }
    }

    /// Adds the function `name` (its arguments' JSON Schema as JSON text).
    #[napi]
    pub fn add_function(
        &self,
        name: String,
        schema: String,
        description: Option<String>,
        call: Function<String, Promise<String>>,
    ) -> napi::Result<()> {
        let schema = json_arg(&format!("grant {name}'s schema"), &schema)?;
        let tsfn =
            Arc::new(call.build_threadsafe_function::<String>().callee_handled::<false>().weak::<true>().build()?);
        let host: core::HostFn = Arc::new(move |args: serde_json::Value| {
            let tsfn = Arc::clone(&tsfn);
            Box::pin(async move {
                // Called on Node's thread, which hands back the function's Promise; its
                // settling is awaited here, so Node's loop goes on while it is pending.
                let answer = tsfn.call_async_catch(args.to_string()).await.map_err(|e| e.reason.clone())?;
                let text = answer.await.map_err(|e| e.reason.clone())?;
                serde_json::from_str(&text).map_err(|e| format!("the host function's answer: {e}"))
            })
        });
        let grant = core::host_function(&name, schema, description.as_deref(), host).map_err(|r| thrown(&r))?;
        self.functions.lock().unwrap_or_else(PoisonError::into_inner).push(grant);
        Ok(())
    }
}

impl Default for Grants {
    fn default() -> Self {
        Self::new()
    }
}

/// One run on the calling thread, driving the bindings' runtime: one of the bindings' run
/// threads for [`run`], Node's own for [`run_sync`].
fn execute(
    opts: Result<core::RunOptions, Refused>,
    stdin: Option<Vec<u8>>,
    functions: Vec<core::FunctionGrant>,
) -> Result<core::Ran, Refused> {
    opts.and_then(|o| core::runtime().block_on(core::run(o, stdin, functions))?.verify(|_| Ok(())))
}

/// Runs as the options (JSON text) say on Node's own thread, which waits for the outcome
/// (the package's `runSync` and `runCodeSync`, as `execFileSync` is to `execFile`). No host
/// function can be granted: one is called on Node's thread, which this run holds.
#[napi]
#[must_use]
pub fn run_sync(options: String, stdin: Option<Buffer>) -> RunOutcome {
    let opts = serde_json::from_str(&options).map_err(|e| Refused::invalid(e.to_string()));
    RunOutcome::of(execute(opts, stdin.map(|b| b.to_vec()), Vec::new()))
}

/// Runs as the options (JSON text) say: a Promise of its outcome, settled when the run is
/// over; Node's event loop goes on meanwhile. The run goes to the bindings' own run threads
/// (`stockade_bindings::spawn_run`), never libuv's pool, which the host's file calls need.
#[napi(ts_return_type = "Promise<RunOutcome>")]
pub fn run<'env>(
    env: &'env Env,
    options: String,
    stdin: Option<Buffer>,
    grants: Option<&Grants>,
) -> napi::Result<Object<'env>> {
    let opts = serde_json::from_str(&options).map_err(|e| Refused::invalid(e.to_string()));
    let functions = grants
        .map(|g| std::mem::take(&mut *g.functions.lock().unwrap_or_else(PoisonError::into_inner)))
        .unwrap_or_default();
    let stdin = stdin.map(|b| b.to_vec());
    let (deferred, promise) = env.create_deferred()?;
    core::spawn_run(Box::new(move |ready| {
        let outcome = ready.and_then(|()| core::caught(|| execute(opts, stdin, functions)));
        deferred.resolve(move |_| Ok(RunOutcome::of(outcome)));
    }));
    Ok(promise)
}

/// A Promise of what `call` (a session call, on the bindings' runtime) answers, made a JS
/// value by `value` on Node's thread; a refusal rejects it as a thrown refusal.
fn settle_later<T, V, F>(env: &Env, call: F, value: fn(T) -> V) -> napi::Result<Object<'_>>
where
    T: Send + 'static,
    V: napi::bindgen_prelude::ToNapiValue + 'static,
    F: std::future::Future<Output = Result<T, Refused>> + Send + 'static,
{
    let (deferred, promise) = env.create_deferred()?;
    // A session call waits on processes and files, not the CPU: a task of the runtime,
    // holding no thread while it waits, and a task of its own, so that one that panics
    // still settles the Promise.
    let call = core::runtime().spawn(call);
    core::runtime().spawn(async move {
        let answer = call
            .await
            .unwrap_or_else(|e| Err(Refused::new("SandboxError", format!("the call failed inside stockade: {e}"))));
        match answer {
            Ok(t) => deferred.resolve(move |_| Ok(value(t))),
            Err(r) => deferred.reject(thrown(&r)),
        }
    });
    Ok(promise)
}

/// One session exec's answer: the summary (JSON text: exit code, signal, timed out, report)
/// and the guest's two streams.
#[napi(object)]
pub struct ExecOutcome {
    /// JSON text.
    pub summary: String,
    /// The guest's stdout.
    pub stdout: Buffer,
    /// The guest's stderr.
    pub stderr: Buffer,
}

/// A live session (the package's `Session` holds one): the bindings' `BoundSession`, whose
/// calls are Promises.
#[napi]
pub struct Session(Arc<core::BoundSession>);

#[napi]
impl Session {
    /// A Promise of a new session (options: JSON text).
    #[napi(ts_return_type = "Promise<Session>")]
    pub fn create(env: &Env, options: String) -> napi::Result<Object<'_>> {
        let opts: core::SessionOptions =
            serde_json::from_str(&options).map_err(|e| thrown(&Refused::invalid(e.to_string())))?;
        settle_later(env, core::BoundSession::create(opts), |s| Session(Arc::new(s)))
    }

    /// Its id.
    #[napi(getter)]
    #[must_use]
    pub fn id(&self) -> String {
        self.0.id().to_owned()
    }

    /// Runs argv in it (`timeout` in seconds; `cwd` its home by default).
    #[napi(ts_return_type = "Promise<ExecOutcome>")]
    pub fn exec<'env>(
        &self,
        env: &'env Env,
        argv: Vec<String>,
        stdin: Option<Buffer>,
        timeout: Option<f64>,
        cwd: Option<String>,
    ) -> napi::Result<Object<'env>> {
        let (s, stdin) = (Arc::clone(&self.0), stdin.map(|b| b.to_vec()).unwrap_or_default());
        let call = async move { s.exec(&argv, stdin, timeout, cwd.as_deref()).await };
        settle_later(env, call, |(summary, out, err)| ExecOutcome {
            summary: summary.to_string(),
            stdout: out.into(),
            stderr: err.into(),
        })
    }

    /// Writes `data` to `path` (the guest's; a relative one is in its home).
    #[napi(ts_return_type = "Promise<void>")]
    pub fn write<'env>(&self, env: &'env Env, path: String, data: Buffer) -> napi::Result<Object<'env>> {
        let (s, data) = (Arc::clone(&self.0), data.to_vec());
        settle_later(env, async move { s.write(&path, &data).await }, |()| ())
    }

    /// Reads `path` (the guest's; a relative one is in its home).
    #[napi(ts_return_type = "Promise<Buffer>")]
    pub fn read<'env>(&self, env: &'env Env, path: String) -> napi::Result<Object<'env>> {
        let s = Arc::clone(&self.0);
        settle_later(env, async move { s.read(&path).await }, Buffer::from)
    }

    /// Freezes everything it runs.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn pause<'env>(&self, env: &'env Env) -> napi::Result<Object<'env>> {
        let s = Arc::clone(&self.0);
        settle_later(env, async move { s.pause().await }, |()| ())
    }

    /// Thaws it.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn resume<'env>(&self, env: &'env Env) -> napi::Result<Object<'env>> {
        let s = Arc::clone(&self.0);
        settle_later(env, async move { s.resume().await }, |()| ())
    }

    /// Ends it: everything it ran is gone and its home removed when the Promise settles.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn kill<'env>(&self, env: &'env Env) -> napi::Result<Object<'env>> {
        let s = Arc::clone(&self.0);
        settle_later(env, async move { s.kill().await }, |()| ())
    }
}

/// A policy over the host's tools, with one gate deciding each call.
#[napi]
pub struct Policy(core::BoundPolicy);

#[napi]
impl Policy {
    /// The policy TOML over the tools (JSON text: name to the JSON Schema of its arguments).
    #[napi(factory)]
    pub fn from_toml(toml: String, tools: String) -> napi::Result<Self> {
        let tools = json_arg("tools", &tools)?;
        core::BoundPolicy::from_toml(&toml, &tools).map(Self).map_err(|r| thrown(&r))
    }

    /// The decision on one call (args: JSON text), as JSON text.
    #[napi]
    pub fn authorize(&self, tool: String, args: String, source: String) -> napi::Result<String> {
        let args = json_arg("args", &args)?;
        self.0.authorize(&tool, &args, &source).map(|d| d.to_string()).map_err(|r| thrown(&r))
    }

    /// From now on, the loop has read untrusted output.
    #[napi]
    pub fn set_read_untrusted(&self) {
        self.0.set_read_untrusted();
    }

    /// Whether the loop has read untrusted output.
    #[napi]
    pub fn has_read_untrusted(&self) -> bool {
        self.0.has_read_untrusted()
    }

    /// Whether `tool`'s output is untrusted.
    #[napi]
    pub fn untrusted_output(&self, tool: String) -> bool {
        self.0.untrusted_output(&tool)
    }
}

/// Marks untrusted text (or JSON text, with `is_json`); the block's parts as JSON text.
#[napi]
pub fn mark(text: String, source: String, call_id: String, is_json: bool, datamark: bool) -> napi::Result<String> {
    core::mark(&text, &source, &call_id, is_json, datamark).map(|v| v.to_string()).map_err(|r| thrown(&r))
}

/// The system-prompt sentence for marked blocks.
#[napi]
#[must_use]
pub fn system_prompt(datamark: bool) -> String {
    core::system_prompt(datamark)
}
