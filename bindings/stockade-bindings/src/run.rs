//! One run: options as JSON, the job `stockade run` and `run_code` would build, the grants,
//! and the verified value or the refusal.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Deserialize;
use stockade_agent::{Language, Runner};
use stockade_runtime::protocol::{Limits, Report, RunError, limits};
use stockade_runtime::verify::{Budget, Contract, Outcome, Refusal, accept_any};
use stockade_runtime::{FunctionGrant, GrantFuture, Grants, RunRequest, Sandbox};

use crate::Refused;

/// A run's options, as the bindings pass them (JSON, `snake_case`; unknown keys are refused).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunOptions {
    /// The command to run in the process tier (or `code` instead).
    #[serde(default)]
    pub argv: Vec<String>,
    /// Code to run in `language` (`javascript` in the wasm tier; `python`, `sh` in the
    /// process tier).
    pub code: Option<String>,
    /// The code's language (default `python`).
    pub language: Option<String>,
    /// The wall-clock deadline, in seconds (default 10).
    pub timeout: Option<f64>,
    /// The CPU-time limit, in seconds (default: the deadline).
    pub cpu: Option<f64>,
    /// The memory limit: bytes, or `256M` (default 512M).
    pub memory: Option<Size>,
    /// The stdout budget: bytes, or `64K` (default 1M); more kills the run.
    pub max_output: Option<Size>,
    /// How stdout is read: `text` (UTF-8, the default), `json` or `bytes`.
    pub output: Option<String>,
    /// The exit code to expect (0).
    pub expect_exit: Option<i32>,
    /// The guest's environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The network grant: `--allow-net` entries (process tier only).
    #[serde(default)]
    pub allow_net: Vec<String>,
    /// `--net-resolve` entries for it.
    #[serde(default)]
    pub net_resolve: Vec<String>,
    /// Data grants: name to JSON value.
    #[serde(default)]
    pub data: BTreeMap<String, serde_json::Value>,
    /// The grant policy (TOML) deciding every host-function call; without one every call is
    /// denied.
    pub grant_policy: Option<String>,
    /// Refuse the run if the policy denied any grant call.
    #[serde(default)]
    pub strict_grants: bool,
}

/// A size: bytes, or a text such as `256M`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Size {
    /// Bytes.
    Bytes(u64),
    /// `256M`, `64K`, `1G`.
    Text(String),
}

impl Size {
    pub(crate) fn bytes(&self, what: &str) -> Result<u64, Refused> {
        match self {
            Self::Bytes(n) => Ok(*n),
            Self::Text(t) => limits::parse_size(t).map_err(|e| Refused::invalid(format!("{what} {t:?}: {e}"))),
        }
    }
}

/// A verified value: stdout as the contract read it.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// UTF-8 text.
    Text(String),
    /// A JSON value.
    Json(serde_json::Value),
    /// Raw bytes.
    Bytes(Vec<u8>),
}

/// A verified run: its value, and its report (JSON).
#[derive(Debug, Clone)]
pub struct Ran {
    /// The value.
    pub value: Value,
    /// The report, as JSON.
    pub report: String,
}

/// A host function: called with the arguments the policy allowed, it answers with a JSON
/// value or a reason it failed.
pub type HostFn = Arc<dyn Fn(serde_json::Value) -> GrantFuture + Send + Sync>;

/// A function grant `name` over `call`, whose arguments follow `schema` (a JSON Schema object).
pub fn host_function(
    name: &str,
    schema: serde_json::Value,
    description: Option<&str>,
    call: HostFn,
) -> Result<FunctionGrant, Refused> {
    let f = FunctionGrant::new(name, schema, move |permit: stockade_runtime::policy::allow::Permit| {
        call(permit.call().args_json())
    })
    .map_err(|e| Refused::invalid(format!("grant {name}: {e}")))?;
    Ok(match description {
        Some(d) => f.describe(d),
        None => f,
    })
}

/// A run that happened, not yet verified: [`Executed::verify`] on the host's own thread (so
/// a host check, a Python callable or a JavaScript function, runs where its language runs).
#[derive(Debug)]
pub struct Executed {
    report: Report,
    budget: Budget,
    output: String,
    expect_exit: i32,
    strict: bool,
}

/// Runs as `opts` say (on [`crate::runtime`]), to its report. `stdin` is the guest's
/// standard input (not with `javascript`, whose source it is).
pub async fn run(opts: RunOptions, stdin: Option<Vec<u8>>, functions: Vec<FunctionGrant>) -> Result<Executed, Refused> {
    let wall = Duration::try_from_secs_f64(opts.timeout.unwrap_or(10.0))
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| Refused::invalid("timeout: a positive number of seconds"))?;
    let cpu = match opts.cpu {
        Some(s) => Duration::try_from_secs_f64(s).map_err(|_| Refused::invalid("cpu: a positive number of seconds"))?,
        None => wall,
    };
    let output = opts.output.clone().unwrap_or_else(|| "text".into());
    if !["text", "json", "bytes"].contains(&output.as_str()) {
        return Err(Refused::invalid(format!("output {output:?}: text, json or bytes")));
    }
    let memory = opts.memory.as_ref().map_or(Ok(512 << 20), |m| m.bytes("memory"))?;
    let max_output = opts.max_output.as_ref().map_or(Ok(1 << 20), |m| m.bytes("max_output"))?;
    let bad = |e: &dyn std::fmt::Display| Refused::invalid(e.to_string());
    let limits = Limits::new()
        .with_wall(wall)
        .and_then(|l| l.with_cpu(cpu))
        .and_then(|l| l.with_memory(memory))
        .and_then(|l| l.with_stdout(max_output))
        .map_err(|e| bad(&e))?;
    let (runner, job) = job(&opts)?;
    let mut job = job.with_limits(limits);
    if let Some(bytes) = stdin {
        if matches!(runner, Runner::Javascript(_)) {
            return Err(Refused::invalid("stdin: a javascript run reads its source from stdin"));
        }
        job = job.with_stdin(bytes).map_err(|e| bad(&e))?;
    }
    for (k, v) in &opts.env {
        job = job.with_env(k.clone(), v.clone()).map_err(|e| bad(&e))?;
    }
    let grants = grants(&opts, functions, &runner)?;
    let mut request = RunRequest::new(&job);
    if let Some(g) = grants {
        request = request.grants(Arc::new(g));
    }
    let report = runner.sandbox().report(request).await.map_err(run_error)?;
    let budget = Budget::new(wall, max_output);
    Ok(Executed { report, budget, output, expect_exit: opts.expect_exit.unwrap_or(0), strict: opts.strict_grants })
}

/// The runner and job for `opts`: code in its language, or a command in the process tier.
fn job(opts: &RunOptions) -> Result<(Runner, stockade_runtime::protocol::Job), Refused> {
    match (&opts.code, opts.argv.is_empty()) {
        (Some(code), true) => {
            let name = opts.language.as_deref().unwrap_or("python");
            let language = Language::parse(name)
                .ok_or_else(|| Refused::invalid(format!("language {name:?}: python, javascript or sh")))?;
            let runner = match language {
                Language::Javascript => Runner::Javascript(sandbox(Tier::Wasm)?),
                _ => Runner::Command(sandbox(Tier::Process)?),
            };
            let job = runner.code_job(language, code).map_err(Refused::invalid)?;
            Ok((runner, job))
        }
        (None, false) => {
            if opts.language.is_some() {
                return Err(Refused::invalid("language: only with code"));
            }
            let runner = Runner::Command(sandbox(Tier::Process)?);
            let job = runner.command_job(opts.argv.clone()).map_err(Refused::invalid)?;
            Ok((runner, job))
        }
        (Some(_), false) => Err(Refused::invalid("argv and code: give one")),
        (None, true) => Err(Refused::invalid("argv: the command is empty")),
    }
}

/// The grants of `opts` (none if it grants nothing).
fn grants(opts: &RunOptions, functions: Vec<FunctionGrant>, runner: &Runner) -> Result<Option<Grants>, Refused> {
    let named = |e: &dyn std::fmt::Display| Refused::invalid(format!("grants: {e}"));
    let mut g = Grants::new();
    for (name, value) in &opts.data {
        g = g.data(name, value.clone()).map_err(|e| named(&e))?;
    }
    for f in functions {
        g = g.function(f).map_err(|e| named(&e))?;
    }
    if let Some(text) = &opts.grant_policy {
        let policy = stockade_runtime::policy::allow::Policy::from_toml(text, &g.registry())
            .map_err(|e| Refused::invalid(format!("grant_policy: {e}")))?;
        g = g.policy(policy);
    }
    if let Some(net) = net_grant(&opts.allow_net, &opts.net_resolve)? {
        if matches!(runner, Runner::Javascript(_)) {
            return Err(Refused::invalid("allow_net: a javascript run has no sockets (the wasm tier)"));
        }
        g = g.net(net);
    }
    Ok((!g.is_empty() || opts.grant_policy.is_some()).then_some(g))
}

/// The network grant of `allow_net` entries (`--allow-net`'s) with `net_resolve`'s; none
/// without entries.
pub(crate) fn net_grant(
    allow_net: &[String],
    net_resolve: &[String],
) -> Result<Option<stockade_runtime::egress::NetGrant>, Refused> {
    use stockade_runtime::egress;
    if allow_net.is_empty() {
        return if net_resolve.is_empty() {
            Ok(None)
        } else {
            Err(Refused::invalid("net_resolve: only with allow_net"))
        };
    }
    let named = |e: &dyn std::fmt::Display| Refused::invalid(format!("allow_net: {e}"));
    let policy = egress::NetPolicy::allow_entries(allow_net).map_err(|e| named(&e))?;
    let resolve = egress::Resolve::entries(net_resolve).map_err(|e| named(&e))?;
    Ok(Some(egress::NetGrant::new(policy).resolve(resolve)))
}

impl Executed {
    /// The verified value (G1), read as the options' `output` says, then passed to `check`
    /// (the host's own: `Err` is its reason to reject the value); or the refusal, with the
    /// report. A check can only turn a verified value into a refusal, never the reverse.
    pub fn verify(self, check: impl FnOnce(&Value) -> Result<(), String>) -> Result<Ran, Refused> {
        let json = serde_json::to_string(&self.report).unwrap_or_default();
        let refused = |r: Refusal| Refused { kind: refusal_kind(&r), message: r.message(), report: Some(json.clone()) };
        let (budget, expect, strict) = (self.budget, self.expect_exit, self.strict);
        let outcome = match self.output.as_str() {
            "json" => verify_as(self.report, Contract::json(budget, accept_any), expect, strict, Value::Json),
            "bytes" => verify_as(self.report, Contract::bytes(budget, accept_any), expect, strict, Value::Bytes),
            _ => verify_as(self.report, Contract::text(budget, accept_any), expect, strict, Value::Text),
        };
        let value = outcome.map_err(refused)?;
        if let Err(reason) = check(&value) {
            let mut line = String::new();
            for c in reason.chars().take(4096) {
                if c.is_control() {
                    line.extend(c.escape_default());
                } else {
                    line.push(c);
                }
            }
            return Err(Refused {
                kind: "AssertionFailed",
                message: format!("assertion failed: {line}"),
                report: Some(json),
            });
        }
        Ok(Ran { value, report: json })
    }
}

fn verify_as<T: std::fmt::Debug>(
    report: Report,
    contract: Contract<T>,
    expect: i32,
    strict: bool,
    f: impl FnOnce(T) -> Value,
) -> Result<Value, Refusal> {
    let contract = contract.expect_exit(expect);
    let contract = if strict { contract.no_denied_grants() } else { contract };
    let o: Outcome<T> = stockade_runtime::verify::verify(report, &contract);
    o.into_result().map(|v| f(v.into_inner()))
}

fn refusal_kind(r: &Refusal) -> &'static str {
    match r {
        Refusal::FailedToStart { .. } => "FailedToStart",
        Refusal::EnforcementMissing { .. } => "EnforcementMissing",
        Refusal::Timeout { .. } => "Timeout",
        Refusal::CpuLimit => "CpuLimit",
        Refusal::OutOfMemory => "OutOfMemory",
        Refusal::OutputTooLarge { .. } => "OutputTooLarge",
        Refusal::KilledBySignal { .. } => "Killed",
        Refusal::Trapped { .. } => "Trapped",
        Refusal::NonZeroExit { .. } => "NonZeroExit",
        Refusal::MalformedOutput { .. } => "MalformedOutput",
        Refusal::AssertionFailed { .. } => "AssertionFailed",
        Refusal::GrantDenied { .. } => "GrantDenied",
        _ => "SandboxError",
    }
}

/// A run that could not happen, as a refusal naming why.
pub(crate) fn run_error(e: RunError) -> Refused {
    match e {
        RunError::Unsupported { mechanism, reason } => {
            Refused::new("Unsupported", format!("this host cannot enforce the sandbox ({mechanism}): {reason}"))
        }
        RunError::Misconfigured(m) => Refused::invalid(m),
        other => Refused::new("SandboxError", other.to_string()),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Tier {
    Process,
    Wasm,
}

/// This host process's sandbox of `tier`, made on first use.
fn sandbox(tier: Tier) -> Result<Arc<Sandbox>, Refused> {
    static PROCESS: Mutex<Option<Arc<Sandbox>>> = Mutex::new(None);
    static WASM: Mutex<Option<Arc<Sandbox>>> = Mutex::new(None);
    let slot = if tier == Tier::Process { &PROCESS } else { &WASM };
    let mut held = slot.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(s) = held.as_ref() {
        return Ok(Arc::clone(s));
    }
    let built = match tier {
        Tier::Process => Sandbox::builder().tier(process_tier()?).build(),
        Tier::Wasm => Sandbox::builder().tier(stockade_runtime::wasm::WasmTier::new().map_err(run_error)?).build(),
    };
    let s = Arc::new(built.map_err(|e| Refused::new("SandboxError", e.to_string()))?);
    *held = Some(Arc::clone(&s));
    Ok(s)
}

pub(crate) fn process_tier() -> Result<stockade_runtime::process::ProcessTier, Refused> {
    Ok(stockade_runtime::process::ProcessTier::new(stockade_runtime::process::Helper::at(crate::helper()?)))
}
