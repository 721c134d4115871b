//! The confined agent: the whole loop runs inside a tier, and reaches the model, the host's
//! tools and the host's MCP servers only through the run's broker.
//!
//! Two halves, one on each side of the wall:
//! - [`ConfinedAgent`], on the host, holds everything with authority: the endpoint and its
//!   real key (served to the loop as the run's model grant, [`ModelProxy`]), every tool (a
//!   command tool, `run_code`, a host MCP server's tool), each served as a function grant
//!   under the host's policy, and the trace. It hands the loop a
//!   [`Turn`](stockade_protocol::turn::Turn) on stdin, copies the loop's program into the run
//!   ([`stockade_runtime::Grants::program`]), and takes back one bounded
//!   [`Reply`](stockade_protocol::turn::Reply) on stdout, through `stockade_verify`.
//! - [`serve_turn_ambient`], inside, is the ordinary loop ([`Agent`]) over the model at
//!   `$OPENAI_BASE_URL` with the run's placeholder key, and over tools that are calls to the
//!   broker at `$STOCKADE_BROKER`. It holds no key, no policy that binds and no record that
//!   counts: whatever it asks, the host's policy decides, and the host's trace is written
//!   from the broker's own record of the run.
//!
//! A compromised loop (the model's plan, or a replaced binary) can ask the broker for any
//! grant of the run with any arguments, as often as the broker's bounds let it; it can do
//! nothing the host's policy denies, and cannot reach a tool it was not granted, forge a
//! permit (there is none inside), read the key, or rewrite the host's trace.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use stockade_policy::allow::{Permit, Policy};
use stockade_protocol::broker::{BROKER_ENV, BrokerFrame, GrantName, ReplyBody};
use stockade_protocol::turn::{MAX_REPLY_BYTES, Reply, Role, Turn, TurnTool};
use stockade_protocol::{FrameCodec, GrantOutcome, Job, Limits};
use stockade_runtime::verify::{Budget, Contract};
use stockade_runtime::{CallEvent, GrantLimits, Grants, RunRequest, Sandbox};

use crate::agent::{Agent, Approver};
use crate::endpoint::Endpoint;
use crate::machine::{AgentError, Answer, Profile, RunLimits};
use crate::proxy::ModelProxy;
use crate::secret::ApiKey;
use crate::tool::{Tool, ToolDef, ToolOutput, Trust, tool_grant};
use crate::trace::Trace;

/// The name the loop's program has inside the run (in the grants directory's `bin/`).
pub const LOOP_PROGRAM: &str = "stockade-loop";

/// The largest broker reply the loop reads: the broker's own cap on a reply.
const MAX_BROKER_REPLY: u32 = 2 << 20;

/// An agent whose loop runs inside a tier. Built with [`ConfinedAgent::builder`].
#[derive(Debug)]
pub struct ConfinedAgent {
    sandbox: Arc<Sandbox>,
    model: String,
    grants: Grants,
    tools: Vec<TurnTool>,
    program: (PathBuf, Vec<String>),
    system_prompt: String,
    limits: RunLimits,
    profile: Profile,
    deadline: Duration,
    memory: u64,
    workspace: Option<(PathBuf, stockade_protocol::Access)>,
    image: Option<String>,
    trace: Option<Trace>,
}

/// Builds a [`ConfinedAgent`]. Defaults: no tools, an empty system prompt,
/// [`RunLimits::default`] (12 model calls), a 10-minute deadline, a 60 s tool timeout,
/// 1 GiB of memory for the loop, no workspace, no trace.
#[derive(Debug)]
pub struct ConfinedBuilder {
    agent: ConfinedAgent,
    endpoint: Endpoint,
    tokens: Option<u64>,
    tool_timeout: Duration,
    host_tools: Vec<Arc<dyn Tool>>,
    policy_text: Option<String>,
    approver: Option<Arc<dyn Approver>>,
}

impl ConfinedAgent {
    /// A builder for a loop that runs `program args...` (stockade's own binary, as
    /// `stockade confined-loop`, in the CLI) in `sandbox`, and asks `endpoint` through the
    /// run's model grant.
    #[must_use]
    pub fn builder(
        sandbox: Arc<Sandbox>,
        endpoint: Endpoint,
        program: impl Into<PathBuf>,
        args: Vec<String>,
    ) -> ConfinedBuilder {
        ConfinedBuilder {
            agent: ConfinedAgent {
                sandbox,
                model: endpoint.model().to_owned(),
                grants: Grants::new(),
                tools: Vec::new(),
                program: (program.into(), args),
                system_prompt: String::new(),
                limits: RunLimits::default(),
                profile: Profile::default(),
                deadline: Duration::from_secs(600),
                memory: 1 << 30,
                workspace: None,
                image: None,
                trace: None,
            },
            endpoint,
            tokens: None,
            tool_timeout: Duration::from_secs(60),
            host_tools: Vec::new(),
            policy_text: None,
            approver: None,
        }
    }
}

impl ConfinedBuilder {
    /// Adds a host tool: served to the loop as the function grant of its name, run on the
    /// host only when the policy allows the call.
    #[must_use]
    pub fn tool(mut self, tool: Arc<dyn Tool>) -> Self {
        self.host_tools.push(tool);
        self
    }

    /// Adds function grants served as they are (a host MCP server's tools,
    /// `Grants::mcp`): each is offered to the loop's model as a tool of the grant's name,
    /// its output marked untrusted.
    pub fn grants(mut self, grants: &Grants) -> Result<Self, crate::BuildError> {
        for f in grants.function_grants() {
            self.agent.grants = std::mem::take(&mut self.agent.grants).function(f.clone())?;
        }
        Ok(self)
    }

    /// The policy (TOML) every call of the loop is decided by, on the host: it is loaded
    /// against every tool and grant added (add them first). There is no default.
    #[must_use]
    pub fn policy_toml(mut self, text: impl Into<String>) -> Self {
        self.policy_text = Some(text.into());
        self
    }

    /// Who answers a call the host's policy marks `ask`, on the host, while the loop's call
    /// waits at the broker (one question at a time); without one, such a call is denied.
    #[must_use]
    pub fn approver(mut self, approver: Arc<dyn Approver>) -> Self {
        self.approver = Some(approver);
        self
    }

    /// The system prompt.
    #[must_use]
    pub fn system_prompt(mut self, prompt: impl Into<String>) -> Self {
        self.agent.system_prompt = prompt.into();
        self
    }

    /// The budgets: the loop's model calls ([`RunLimits::turns`]) go in the turn, and the
    /// host bounds the tokens the model grant spends.
    #[must_use]
    pub fn limits(mut self, limits: RunLimits) -> Self {
        self.agent.limits = limits;
        self
    }

    /// The sampling choices the loop sends (temperature and `max_tokens`).
    #[must_use]
    pub fn profile(mut self, profile: Profile) -> Self {
        self.agent.profile = profile;
        self
    }

    /// The whole turn's wall time: the loop is killed at it.
    #[must_use]
    pub fn deadline(mut self, d: Duration) -> Self {
        self.agent.deadline = d;
        self
    }

    /// One tool call's time on the host (the broker drops the call at it).
    #[must_use]
    pub fn tool_timeout(mut self, d: Duration) -> Self {
        self.tool_timeout = d;
        self
    }

    /// The loop's memory limit.
    #[must_use]
    pub fn memory(mut self, bytes: u64) -> Self {
        self.agent.memory = bytes;
        self
    }

    /// Gives the loop a workspace (a dedicated directory, as `stockade run --workspace`).
    #[must_use]
    pub fn workspace(mut self, path: impl Into<PathBuf>, access: stockade_protocol::Access) -> Self {
        self.agent.workspace = Some((path.into(), access));
        self
    }

    /// Runs the loop in `image`: the sandbox's tier is then the docker tier, whose jobs name
    /// an image. The loop's program goes with its dynamic loader and the shared objects the
    /// host's loader resolves for it ([`Grants::program_linked`]), so an image without a C
    /// library (busybox, `FROM scratch` with a shell) runs it; it needs `sh`. In the docker
    /// tier the loop reaches the model at `$OPENAI_BASE_URL` only when stockade runs as root
    /// (see `stockade_runtime`); otherwise its reply says so.
    #[must_use]
    pub fn image(mut self, image: impl Into<String>) -> Self {
        self.agent.image = Some(image.into());
        self
    }

    /// Writes the host's JSONL trace: each call the broker decided, as the broker recorded
    /// it, and the turn's end.
    #[must_use]
    pub fn trace(mut self, trace: Trace) -> Self {
        self.agent.trace = Some(trace);
        self
    }

    /// The agent.
    pub fn build(self) -> Result<ConfinedAgent, crate::BuildError> {
        let Self { mut agent, endpoint, tokens, tool_timeout, host_tools, policy_text, approver } = self;
        for tool in host_tools {
            let def = tool.def().clone();
            let grant = tool_grant(tool)?;
            agent.grants = agent.grants.function(grant)?;
            agent.tools.push(turn_tool(
                def.name(),
                def.description(),
                def.parameters(),
                def.trust() == Trust::Untrusted,
            )?);
        }
        for f in agent.grants.function_grants() {
            if !agent.tools.iter().any(|t| t.name.as_str() == f.name()) {
                agent.tools.push(turn_tool(f.name(), f.description(), f.schema(), true)?);
            }
        }
        let text = policy_text.ok_or(crate::BuildError::NoPolicy)?;
        let policy = Policy::from_toml(&text, &agent.grants.registry())?;
        if let Some(t) = &agent.trace {
            t.scrub_key(endpoint.key());
        }
        // The host owns the budgets, whatever the loop inside counts: its model calls and
        // tokens at the model grant, its tool calls at the broker (each of which also takes
        // one of the broker's calls, as a model request does).
        let budget = agent.limits;
        let proxy = ModelProxy::new(endpoint)
            .max_tokens(tokens.map_or(budget.total_tokens(), |n| n.min(budget.total_tokens())))
            .max_requests(u64::from(budget.turns()));
        let calls = GrantLimits::default()
            .call_timeout(tool_timeout)
            .max_function_calls(budget.tool_calls())
            .max_calls(budget.turns().saturating_add(budget.tool_calls()).saturating_add(8));
        let mut grants = std::mem::take(&mut agent.grants).policy(policy).limits(calls).model(Arc::new(proxy));
        if let Some(approver) = approver {
            grants = grants.approver(Arc::new(HostApprover(approver)));
        }
        agent.grants = match agent.image {
            Some(_) => grants.program_linked(LOOP_PROGRAM, &agent.program.0)?,
            None => grants.program(LOOP_PROGRAM, &agent.program.0)?,
        };
        Ok(agent)
    }

    /// The most tokens the model grant spends on one turn (the upstream's reported usage).
    #[must_use]
    pub fn max_tokens(mut self, n: u64) -> Self {
        self.tokens = Some(n);
        self
    }
}

fn turn_tool(
    name: &str,
    description: &str,
    parameters: &Value,
    untrusted: bool,
) -> Result<TurnTool, crate::BuildError> {
    let name = GrantName::new(name)
        .map_err(|_| crate::BuildError::Grant(stockade_runtime::GrantError::Name(name.to_owned())))?;
    let description = stockade_protocol::completion::cut(description, stockade_protocol::turn::MAX_TOOL_DESCRIPTION);
    Ok(TurnTool::new(name, description, parameters.clone(), untrusted))
}

impl ConfinedAgent {
    /// The turn the loop is handed for `text`.
    #[must_use]
    pub fn turn(&self, text: &str) -> Turn {
        let mut turn = Turn::new(text, self.model.clone());
        turn.system_prompt.clone_from(&self.system_prompt);
        turn.tools.clone_from(&self.tools);
        turn.max_turns = self.limits.turns().min(stockade_protocol::turn::MAX_TURN_MODEL_CALLS);
        turn.temperature = self.profile.temperature;
        turn.max_tokens = self.profile.max_tokens;
        turn
    }

    /// Runs one turn inside the sandbox: the loop's answer, or why there is none. The host's
    /// trace gets every call the broker decided, whatever the loop did, each as it happens.
    pub async fn run(&self, turn: &Turn) -> Result<Answer, AgentError> {
        self.run_until(turn, std::future::pending()).await
    }

    /// [`run`](Self::run), stopped when `stop` resolves first (a signal at the terminal: it
    /// names it). Stopped, the loop is killed, every host call still running is cancelled
    /// and closed in the trace as `cancelled` (the broker's record), the trace's end says
    /// why, and the result is [`AgentError::Interrupted`].
    pub async fn run_until(
        &self,
        turn: &Turn,
        stop: impl std::future::Future<Output = String>,
    ) -> Result<Answer, AgentError> {
        // The select's futures (the run, with its broker) are dropped at its end, which
        // closes the broker's record before the end line is written.
        let why = tokio::select! {
            r = self.run_turn(turn) => return r,
            why = stop => why,
        };
        self.trace_end(&format!("interrupted ({why})"), None);
        Err(AgentError::Interrupted { why })
    }

    async fn run_turn(&self, turn: &Turn) -> Result<Answer, AgentError> {
        let failed = |e: String| AgentError::Confined { reason: e };
        let stdout = MAX_REPLY_BYTES as u64;
        let limits = Limits::new()
            .with_wall(self.deadline)
            .and_then(|l| l.with_cpu(self.deadline))
            .and_then(|l| l.with_memory(self.memory))
            .and_then(|l| l.with_stdout(stdout))
            .map_err(|e| failed(e.to_string()))?;
        // The program is on the guest's PATH (the grants directory's `bin/`, wherever the
        // tier shows it), which the shell searches and a tier's exec need not; a linked one is
        // started through the loader it came with.
        let command = self.grants.program_command(LOOP_PROGRAM).unwrap_or_else(|| LOOP_PROGRAM.to_owned());
        let mut argv = vec!["-c".to_owned(), format!("exec {command} \"$@\""), LOOP_PROGRAM.to_owned()];
        argv.extend(self.program.1.iter().cloned());
        let job = match &self.image {
            Some(image) => Job::image(image.clone(), std::iter::once("sh".to_owned()).chain(argv)),
            None => Job::command("sh", argv),
        };
        let mut job =
            job.and_then(|j| j.with_stdin(turn.to_bytes())).map_err(|e| failed(e.to_string()))?.with_limits(limits);
        if let Some((path, access)) = &self.workspace {
            job = job.with_workspace(path, *access).map_err(|e| failed(e.to_string()))?;
        }
        // A conversation whose history was said after untrusted output keeps that taint: the
        // host's policy starts as having read untrusted data (the history is the host's).
        let mut grants = self.grants.clone();
        if turn.history.iter().any(|s| s.untrusted) {
            grants = grants.already_read_untrusted();
        }
        if let Some(trace) = &self.trace {
            grants = grants.observer(observer(trace.clone()));
        }
        // The host gives the loop these two messages; the broker judges every call's
        // arguments against what it relays (the runtime's G16), as the loop itself would unconfined.
        let system = crate::machine::system_message(&self.system_prompt, stockade_policy::mark::MarkMode::Delimit);
        grants = grants.relayed_provenance(vec![system, prompt(turn)]);
        let report = self.sandbox.report(RunRequest::new(&job).grants(Arc::new(grants))).await;
        let report = match report {
            Ok(r) => r,
            Err(e) => {
                self.trace_end(&format!("the loop could not run: {e}"), None);
                return Err(AgentError::Sandbox(e));
            }
        };
        let calls = report.grants.clone().unwrap_or_default();
        if let (Some(t), Some(why)) = (&self.trace, &calls.session_ended) {
            t.event("broker", json!({"ended": why}));
        }
        let contract = Contract::bytes(Budget::new(self.deadline, stdout), |bytes: &Vec<u8>| {
            Reply::parse(bytes).map(|_| ()).map_err(|e| format!("the loop's reply: {e}"))
        });
        let verified = match stockade_runtime::verify::verify(report, &contract).into_result() {
            Ok(v) => v,
            Err(refusal) => {
                let reason = refusal.message();
                self.trace_end(&reason, Some(&calls));
                return Err(match refusal {
                    stockade_runtime::verify::Refusal::Timeout { .. } => AgentError::Deadline { after: self.deadline },
                    // The sandbox could not start the loop (an image the engine lacks, a
                    // program it cannot exec): stockade's failure, not the loop's.
                    stockade_runtime::verify::Refusal::FailedToStart { .. } => {
                        AgentError::Sandbox(stockade_runtime::RunError::Misconfigured(format!("the loop {reason}")))
                    }
                    _ => failed(reason),
                });
            }
        };
        let reply = Reply::parse(verified.value()).map_err(|e| failed(e.to_string()))?;
        let turns = calls.calls.iter().filter(|c| c.grant == stockade_runtime::MODEL_GRANT).count();
        let tool_calls = calls.calls.len() - turns;
        if !reply.ok {
            let reason = format!("the loop ended without an answer: {}", reply.text);
            self.trace_end(&reason, Some(&calls));
            return Err(failed(reason));
        }
        self.trace_end("answer", Some(&calls));
        Ok(Answer {
            text: reply.text,
            turns: u32::try_from(turns).unwrap_or(u32::MAX),
            tool_calls: u32::try_from(tool_calls).unwrap_or(u32::MAX),
            tokens: calls.model_tokens,
            read_untrusted: calls.read_untrusted,
        })
    }

    fn trace_end(&self, outcome: &str, calls: Option<&stockade_protocol::GrantsReport>) {
        if let Some(t) = &self.trace {
            let (total, denied, tokens) = calls.map_or((0, 0, 0), |c| (c.total, c.denied, c.model_tokens));
            t.event(
                "end",
                json!({"confined": true, "outcome": outcome, "broker_calls": total, "denied": denied, "tokens": tokens}),
            );
        }
    }
}

/// The host's trace of a confined run, written by the broker as each call is decided and
/// as each ends: `decision` (a denial, a refusal, a model request; or an allowed call, as it
/// starts), and `tool` for an allowed call's end (`ok`, `failed` or `cancelled`).
fn observer(trace: Trace) -> stockade_runtime::CallObserver {
    Arc::new(move |event| match event {
        CallEvent::Allowed { grant, rule, args } => trace
            .event("decision", json!({"confined": true, "tool": grant, "args": args, "effect": "allow", "rule": rule})),
        CallEvent::Ended { call: c, ran: true } => {
            let status = match (c.outcome, c.failure.as_deref()) {
                (GrantOutcome::Ok, _) => "ok",
                (_, Some("cancelled")) => "cancelled",
                _ => "failed",
            };
            trace.event(
                "tool",
                json!({"confined": true, "tool": c.grant, "status": status, "rule": c.rule, "failure": c.failure,
                       "ms": c.duration.as_millis() as u64, "bytes": c.bytes_out, "bytes_in": c.bytes_in,
                       "bytes_out": c.bytes_out}),
            );
        }
        CallEvent::Ended { call: c, ran: false } => trace.event(
            "decision",
            json!({"confined": true, "tool": c.grant, "args": c.args, "effect": outcome(c.outcome), "rule": c.rule,
                   "failure": c.failure, "ms": c.duration.as_millis() as u64, "bytes_in": c.bytes_in,
                   "bytes_out": c.bytes_out}),
        ),
        _ => {}
    })
}

fn outcome(o: GrantOutcome) -> &'static str {
    match o {
        GrantOutcome::Ok => "allow",
        GrantOutcome::Denied => "deny",
        GrantOutcome::Failed => "failed",
        _ => "refused",
    }
}

/// The agent's [`Approver`] as the broker's: the same request an unconfined run shows.
#[derive(Debug)]
struct HostApprover(Arc<dyn Approver>);

#[async_trait]
impl stockade_runtime::GrantApprover for HostApprover {
    async fn approve(&self, call: &stockade_policy::allow::ToolCall, rule: &str, reason: &str) -> bool {
        self.0.approve(&crate::agent::approval_request(call, rule, reason)).await
    }
}

/// A tool of the loop inside: a call to the grant of its name through the run's broker.
#[derive(Debug)]
struct BrokerTool {
    def: ToolDef,
    grant: GrantName,
    socket: PathBuf,
    next: Arc<AtomicU64>,
}

#[async_trait]
impl Tool for BrokerTool {
    fn def(&self) -> &ToolDef {
        &self.def
    }

    async fn call(&self, permit: Permit) -> ToolOutput {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        match broker_call(&self.socket, id, &self.grant, permit.call().args_json()).await {
            Ok(ReplyBody::Result(Value::String(s))) => ToolOutput::Text(s),
            Ok(ReplyBody::Result(v)) => ToolOutput::Json(v),
            // The message can quote the tool (an MCP server's error): its output, marked when
            // the tool is untrusted, never the trusted reason.
            Ok(ReplyBody::Error(e)) => {
                ToolOutput::Failed { reason: format!("the call failed ({})", e.code.as_str()), output: Some(e.message) }
            }
            Ok(_) => ToolOutput::failed("the broker answered with neither a result nor an error"),
            Err(e) => ToolOutput::failed(format!("the broker: {e}")),
        }
    }
}

/// One call through the broker at `socket`: its reply's body.
async fn broker_call(socket: &Path, id: u64, grant: &GrantName, args: Value) -> std::io::Result<ReplyBody> {
    let bad = |e: String| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
    let mut stream = tokio::net::UnixStream::connect(socket).await?;
    let frame = BrokerFrame::Call { id, grant: grant.clone(), args }.to_bytes();
    let codec = FrameCodec::new(MAX_BROKER_REPLY);
    codec.write_frame_async(&mut stream, &frame).await.map_err(|e| bad(e.to_string()))?;
    let payload = codec
        .read_frame_async(&mut stream)
        .await
        .map_err(|e| bad(e.to_string()))?
        .ok_or_else(|| bad("the broker closed the connection".into()))?;
    match BrokerFrame::parse(&payload).map_err(|e| bad(e.to_string()))? {
        BrokerFrame::Reply { id: got, body } if got == id => Ok(body),
        _ => Err(bad("the broker's reply is not this call's".into())),
    }
}

/// Inside the tier: [`serve_turn`] with the model at `$OPENAI_BASE_URL`, the run's
/// placeholder key in `$OPENAI_API_KEY`, and the broker at `$STOCKADE_BROKER`. Never fails:
/// a missing variable is a reply with `ok` false.
pub async fn serve_turn_ambient(turn: &Turn) -> Reply {
    let var =
        |name: &str| std::env::var(name).map_err(|_| format!("${name} is not set: this runs inside a confined run"));
    let (base, broker) = match (var("OPENAI_BASE_URL"), var(BROKER_ENV)) {
        (Ok(base), Ok(broker)) => (base, broker),
        (Err(_), Ok(_)) if std::env::var_os(stockade_runtime::MODEL_ENV).is_some() => {
            return Reply::new(
                false,
                "the model is reachable here only at $STOCKADE_MODEL_SOCKET, not at $OPENAI_BASE_URL, which the loop needs: \
                 a docker-tier run serves OPENAI_BASE_URL only when stockade runs as root",
            );
        }
        (Err(e), _) | (_, Err(e)) => return Reply::new(false, e),
    };
    let key = match std::env::var_os("OPENAI_API_KEY") {
        Some(_) => match ApiKey::from_env_ambient("OPENAI_API_KEY") {
            Ok(k) => Some(k),
            Err(e) => return Reply::new(false, e.to_string()),
        },
        None => None,
    };
    serve_turn(turn, &base, key, Path::new(&broker)).await
}

/// Runs `turn` with the ordinary loop ([`Agent`]): the model at `base_url` (with `key`,
/// the run's placeholder), and each of the turn's tools a call to its grant through the
/// broker at `broker` (an MCP tool `desk.file_ticket` is offered to the model as
/// `desk__file_ticket`, since a chat tool name has no `.`). The loop's own policy allows
/// every call of the turn's tools: the host's policy decides each one at the broker. Never
/// fails: an endpoint error or a spent budget is a reply with `ok` false.
pub async fn serve_turn(turn: &Turn, base_url: &str, key: Option<ApiKey>, broker: &Path) -> Reply {
    match serve(turn, base_url, key, broker).await {
        Ok(answer) => Reply::new(true, answer.text),
        Err(e) => Reply::new(false, e),
    }
}

async fn serve(turn: &Turn, base_url: &str, key: Option<ApiKey>, broker: &Path) -> Result<Answer, String> {
    let mut endpoint = Endpoint::new(base_url, turn.model.clone()).map_err(|e| e.to_string())?;
    if let Some(key) = key {
        endpoint = endpoint.with_key(key);
    }
    let socket = broker.to_path_buf();
    let next = Arc::new(AtomicU64::new(1));
    let mut builder = Agent::builder(endpoint).system_prompt(turn.system_prompt.clone());
    let mut rules = String::from("version = 1\ndefault = \"deny\"\n");
    let mut seen = std::collections::BTreeSet::new();
    for t in &turn.tools {
        let name = stockade_runtime::door_name(t.name.as_str());
        // A name the chat format cannot carry is not offered (two grants cannot share one:
        // the host refused that when it loaded them).
        if name.len() > stockade_protocol::chat::MAX_TOOL_NAME_LEN || !seen.insert(name.clone()) {
            continue;
        }
        let trust = if t.untrusted { Trust::Untrusted } else { Trust::Trusted };
        let def = ToolDef::new(name.clone(), t.description.clone(), t.parameters.clone(), trust);
        let tool = BrokerTool { def, grant: t.name.clone(), socket: socket.clone(), next: next.clone() };
        builder = builder.tool(Arc::new(tool));
        rules.push_str(&format!(
            "\n[[rule]]\nid = \"host-decides-{n}\"\ntool = \"{name}\"\neffect = \"allow\"\n",
            n = seen.len()
        ));
    }
    let profile = Profile { temperature: turn.temperature, max_tokens: turn.max_tokens, ..Profile::default() };
    let limits = RunLimits::default().max_turns(turn.max_turns);
    let agent = builder
        .profile(profile)
        .limits(limits)
        .policy_toml(&rules)
        .and_then(crate::agent::AgentBuilder::build)
        .map_err(|e| e.to_string())?;
    agent.run(&prompt(turn)).await.map_err(|e| e.to_string())
}

/// The user's message for the loop: the conversation so far, then the new message with
/// its speaker.
fn prompt(turn: &Turn) -> String {
    let mut text = String::new();
    if !turn.history.is_empty() {
        text.push_str("The conversation so far:\n");
        for s in &turn.history {
            let who = match s.role {
                Role::User => "user",
                Role::Assistant => "you",
                _ => "other",
            };
            // Said after untrusted output: it can quote an injection, so it is marked.
            let said = if s.untrusted {
                let provenance = stockade_policy::mark::Provenance::tool("channel-history", "earlier-turn");
                stockade_policy::mark::mark(&stockade_policy::mark::Untrusted::new(s.text.clone(), provenance))
                    .map_or_else(|_| "(withheld: it could not be marked)".to_owned(), |m| m.to_string())
            } else {
                s.text.clone()
            };
            text.push_str(&format!("{who}: {said}\n"));
        }
        text.push_str("\nThe new message:\n");
    }
    match &turn.speaker {
        Some(who) => text.push_str(&format!("{}: {}", who.as_str(), turn.text)),
        None => text.push_str(&turn.text),
    }
    text
}
