//! The driver: carries out the machine's steps against a real endpoint, real tools and an
//! approver, under the run's deadline.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::json;
use stockade_policy::allow::{Policy, PolicyError, SchemaError, ToolCall};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::endpoint::Endpoint;
use crate::machine::{Action, AgentError, AgentRun, Answer, Dispatch, Profile, RunLimits, Step};
use crate::tool::{Tool, ToolBox, ToolOutput};
use crate::trace::Trace;

/// A question for a human: may this exact call run?
#[derive(Debug)]
#[non_exhaustive]
pub struct ApprovalRequest {
    /// The tool.
    pub tool: String,
    /// The arguments, canonical (sorted keys, no whitespace): exactly what is approved.
    pub arguments: String,
    /// The rule that asked.
    pub rule: String,
    /// Why it asked.
    pub reason: String,
}

/// Answers `ask` decisions.
#[async_trait]
pub trait Approver: Send + Sync + std::fmt::Debug {
    /// Whether the one call described may run.
    async fn approve(&self, request: &ApprovalRequest) -> bool;
}

/// The approver of a run with nobody to ask: every `ask` is a denial that says approval was
/// needed.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoApprover;

#[async_trait]
impl Approver for NoApprover {
    async fn approve(&self, _request: &ApprovalRequest) -> bool {
        false
    }
}

/// The agent could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// A tool's parameters are not a schema the policy can read.
    #[error(transparent)]
    Schema(#[from] SchemaError),
    /// The policy does not load against these tools.
    #[error("the policy does not load: {0}")]
    Policy(#[from] PolicyError),
    /// No policy was given; there is no default.
    #[error("no policy given: call AgentBuilder::policy or policy_toml")]
    NoPolicy,
    /// The policy was built for other tools.
    #[error("the policy's registry does not match the agent's tools ({0})")]
    Mismatch(String),
    /// A confined agent's tool cannot be served as a grant (a name outside the grant-name
    /// rule, two tools of one name, too many).
    #[error("a confined agent's tool cannot be granted: {0}")]
    Grant(#[from] stockade_runtime::GrantError),
}

/// Builds an [`Agent`]. Defaults: no tools, an empty system prompt (MARK's sentence is always
/// added), [`RunLimits::default`], a 10-minute run deadline, a 60 s tool timeout, 4 tool
/// calls at once, no approver ([`NoApprover`]), no trace, [`Profile::default`].
#[derive(Debug)]
pub struct AgentBuilder {
    endpoint: Endpoint,
    tools: ToolBox,
    policy: Option<Arc<Policy>>,
    system_prompt: String,
    limits: RunLimits,
    deadline: Duration,
    tool_timeout: Duration,
    parallel: usize,
    approver: Arc<dyn Approver>,
    trace: Option<Trace>,
    profile: Profile,
    stream: Option<Sink>,
}

/// Where streamed text goes as it arrives.
pub type TextSink = dyn Fn(&str) + Send + Sync;

#[derive(Clone)]
struct Sink(Arc<TextSink>);

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sink")
    }
}

impl AgentBuilder {
    /// Streams every answer, handing each piece of the model's text to `sink` as it arrives.
    #[must_use]
    pub fn stream(mut self, sink: Arc<TextSink>) -> Self {
        self.stream = Some(Sink(sink));
        self
    }

    /// Adds a tool (its definition is offered to the model and registered with the policy).
    #[must_use]
    pub fn tool(mut self, tool: Arc<dyn Tool>) -> Self {
        self.tools.insert(tool);
        self
    }

    /// The system prompt.
    #[must_use]
    pub fn system_prompt(mut self, prompt: impl Into<String>) -> Self {
        self.system_prompt = prompt.into();
        self
    }

    /// Loads the policy from TOML, checked against the tools added so far (add tools first).
    pub fn policy_toml(mut self, text: &str) -> Result<Self, BuildError> {
        let registry = self.tools.registry()?;
        self.policy = Some(Arc::new(Policy::from_toml(text, &registry)?));
        Ok(self)
    }

    /// Uses `policy`, whose registry must hold exactly the agent's tools.
    #[must_use]
    pub fn policy(mut self, policy: Arc<Policy>) -> Self {
        self.policy = Some(policy);
        self
    }

    /// The budgets.
    #[must_use]
    pub fn limits(mut self, limits: RunLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The whole run's wall-time budget.
    #[must_use]
    pub fn deadline(mut self, d: Duration) -> Self {
        self.deadline = d;
        self
    }

    /// One tool call's timeout.
    #[must_use]
    pub fn tool_timeout(mut self, d: Duration) -> Self {
        self.tool_timeout = d;
        self
    }

    /// How many tool calls of one turn run at once (at least 1).
    #[must_use]
    pub fn parallel_tools(mut self, n: usize) -> Self {
        self.parallel = n.max(1);
        self
    }

    /// Who answers `ask` decisions.
    #[must_use]
    pub fn approver(mut self, approver: Arc<dyn Approver>) -> Self {
        self.approver = approver;
        self
    }

    /// Writes a JSONL trace.
    #[must_use]
    pub fn trace(mut self, trace: Trace) -> Self {
        self.trace = Some(trace);
        self
    }

    /// The server profile.
    #[must_use]
    pub fn profile(mut self, profile: Profile) -> Self {
        self.profile = profile;
        self
    }

    /// The agent.
    pub fn build(self) -> Result<Agent, BuildError> {
        let policy = self.policy.ok_or(BuildError::NoPolicy)?;
        let registry = self.tools.registry()?;
        if *policy.registry() != registry {
            let theirs: Vec<&str> = policy.registry().tools().map(|t| t.name()).collect();
            let ours: Vec<&str> = registry.tools().map(|t| t.name()).collect();
            return Err(BuildError::Mismatch(format!("policy knows {theirs:?}, agent has {ours:?}")));
        }
        if let Some(t) = &self.trace {
            t.scrub_key(self.endpoint.key());
        }
        Ok(Agent {
            endpoint: self.endpoint,
            tools: Arc::new(self.tools),
            policy,
            system_prompt: self.system_prompt,
            limits: self.limits,
            deadline: self.deadline,
            tool_timeout: self.tool_timeout,
            parallel: self.parallel,
            approver: self.approver,
            trace: self.trace,
            profile: self.profile,
            stream: self.stream,
        })
    }
}

/// An agent: an endpoint, tools, a policy and budgets. Each [`Agent::run`] is independent.
#[derive(Debug)]
pub struct Agent {
    endpoint: Endpoint,
    tools: Arc<ToolBox>,
    policy: Arc<Policy>,
    system_prompt: String,
    limits: RunLimits,
    deadline: Duration,
    tool_timeout: Duration,
    parallel: usize,
    approver: Arc<dyn Approver>,
    trace: Option<Trace>,
    profile: Profile,
    stream: Option<Sink>,
}

impl Agent {
    /// A builder for an agent talking to `endpoint`.
    #[must_use]
    pub fn builder(endpoint: Endpoint) -> AgentBuilder {
        AgentBuilder {
            endpoint,
            tools: ToolBox::new(),
            policy: None,
            system_prompt: String::new(),
            limits: RunLimits::default(),
            deadline: Duration::from_secs(600),
            tool_timeout: Duration::from_secs(60),
            parallel: 4,
            approver: Arc::new(NoApprover),
            trace: None,
            profile: Profile::default(),
            stream: None,
        }
    }

    /// The policy.
    #[must_use]
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// A fresh machine for `prompt` (what [`Agent::run`] drives).
    #[must_use]
    pub fn start(&self, prompt: &str) -> AgentRun {
        let tools = self.tools.iter().map(|t| (t.def().chat_tool(), t.def().trust())).collect();
        AgentRun::new(
            self.policy.clone(),
            tools,
            self.endpoint.model(),
            &self.system_prompt,
            prompt,
            self.limits,
            self.profile,
        )
    }

    /// Runs `prompt` to an answer or a typed error.
    pub async fn run(&self, prompt: &str) -> Result<Answer, AgentError> {
        self.run_until(prompt, std::future::pending()).await
    }

    /// [`run`](Self::run), stopped when `stop` resolves first (a signal at the terminal:
    /// it names it). Stopped, every call still running is cancelled (its task aborted, a
    /// command tool's process killed) and closed in the trace as `cancelled`, the trace's
    /// end says why, and the result is [`AgentError::Interrupted`].
    pub async fn run_until(
        &self,
        prompt: &str,
        stop: impl std::future::Future<Output = String>,
    ) -> Result<Answer, AgentError> {
        let started = Instant::now();
        let deadline = started + self.deadline;
        let mut run = self.start(prompt);
        // The select's futures (the drive, with its running calls) are dropped at its end.
        let result = tokio::select! {
            r = tokio::time::timeout_at(deadline.into(), self.drive(&mut run, started, deadline)) => {
                r.unwrap_or(Err(AgentError::Deadline { after: self.deadline }))
            }
            why = stop => Err(AgentError::Interrupted { why }),
        };
        self.flush(&mut run);
        if let (Err(AgentError::Interrupted { .. }), Some(t)) = (&result, &self.trace) {
            for (call, tool) in run.cancel_pending() {
                t.event("tool", json!({"turn": run.turns(), "call": call, "tool": tool, "status": "cancelled"}));
            }
        }
        if let Some(t) = &self.trace {
            let outcome = match &result {
                Ok(_) => "answer".to_owned(),
                Err(e) => e.to_string(),
            };
            t.event("end", json!({"outcome": outcome, "turns": run.turns(), "tool_calls": run.tool_calls()}));
        }
        result
    }

    fn flush(&self, run: &mut AgentRun) {
        let events = run.take_events();
        if let Some(t) = &self.trace {
            for e in events {
                t.event(e.kind, e.fields);
            }
        }
    }

    async fn drive(&self, run: &mut AgentRun, started: Instant, deadline: Instant) -> Result<Answer, AgentError> {
        let mut step = run.next_step();
        loop {
            self.flush(run);
            step = match step {
                Step::Done(result) => return result,
                Step::CallModel(request) => {
                    let trace = self.trace.as_ref();
                    let exchange = match &self.stream {
                        Some(sink) => {
                            self.endpoint
                                .complete_streamed(&request, deadline, trace, run.turns(), sink.0.as_ref())
                                .await?
                        }
                        None => self.endpoint.complete(&request, deadline, trace, run.turns()).await?,
                    };
                    if let Some(t) = &self.trace
                        && !exchange.completion.quirks.is_empty()
                    {
                        t.event("quirks", json!({"turn": run.turns(), "quirks": exchange.completion.quirks}));
                    }
                    run.on_completion(exchange.completion, started.elapsed())
                }
                Step::CallTools(dispatches) => {
                    self.resolve(run, dispatches, started).await;
                    self.flush(run);
                    run.finish_tools()
                }
            };
        }
    }

    /// Asks about `ask` calls (one at a time, in order), then runs every permitted call with
    /// bounded parallelism, each under the tool timeout.
    async fn resolve(&self, run: &mut AgentRun, dispatches: Vec<Dispatch>, started: Instant) {
        let mut runnable = Vec::new();
        for d in dispatches {
            match d.action {
                Action::Run(permit) => runnable.push((d.slot, d.call_id, permit)),
                Action::Ask { call, rule, reason, key } => {
                    let request = approval_request(&call, &rule, &reason);
                    let approved = self.approver.approve(&request).await;
                    if let Some(permit) = run.approve(d.slot, call, key, approved, started.elapsed()) {
                        runnable.push((d.slot, d.call_id, permit));
                    }
                }
            }
        }
        let limit = Arc::new(Semaphore::new(self.parallel));
        let mut set = JoinSet::new();
        for (slot, call_id, permit) in runnable {
            let (tools, limit, timeout) = (self.tools.clone(), limit.clone(), self.tool_timeout);
            let tool = permit.call().tool().to_owned();
            set.spawn(async move {
                let _held = limit.acquire_owned().await;
                let t0 = Instant::now();
                let output = match tokio::time::timeout(timeout, tools.dispatch(permit)).await {
                    Ok(out) => out,
                    Err(_) => ToolOutput::failed(format!("the tool timed out after {timeout:?}")),
                };
                (slot, call_id, tool, output, t0.elapsed())
            });
        }
        while let Some(joined) = set.join_next().await {
            let Ok((slot, call_id, tool, output, took)) = joined else {
                // A panicking tool is the tool's bug; its slot stays empty and the run ends
                // with an internal error in finish_tools (fail closed).
                continue;
            };
            if let Some(t) = &self.trace {
                let (status, bytes) = match &output {
                    ToolOutput::Text(s) => ("ok", s.len()),
                    ToolOutput::Json(v) => ("ok", v.to_string().len()),
                    ToolOutput::Failed { output, .. } => ("failed", output.as_ref().map_or(0, String::len)),
                    ToolOutput::TimedOut { .. } => ("timeout", 0),
                };
                t.event(
                    "tool",
                    json!({"turn": run.turns(), "call": call_id, "tool": tool, "ms": took.as_millis() as u64, "status": status, "bytes": bytes, "untrusted": run.untrusted(slot)}),
                );
            }
            run.tool_result(slot, output);
        }
    }
}

pub(crate) fn approval_request(call: &ToolCall, rule: &str, reason: &str) -> ApprovalRequest {
    let arguments = call.canonical_args();
    ApprovalRequest { tool: call.tool().to_owned(), arguments, rule: rule.to_owned(), reason: reason.to_owned() }
}
