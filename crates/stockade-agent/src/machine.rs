//! The loop as a sans-IO step machine: [`AgentRun::next_step`] says what to do
//! ([`Step::CallModel`], [`Step::CallTools`], [`Step::Done`]); the driver does it and feeds
//! the result back ([`AgentRun::on_completion`], [`AgentRun::approve`],
//! [`AgentRun::tool_result`], [`AgentRun::finish_tools`]). No clock, no network, no tool is
//! touched here, so every rule below is testable with scripted completions.
//!
//! For each proposed call, in order:
//! 1. a fresh host id (`call_<run>_<n>`) replaces whatever id the server sent;
//! 2. a call cut by the token limit, beyond [`MAX_CALLS_PER_TURN`], naming no known tool
//!    (exact match), or with unusable arguments is answered with an error and runs nothing;
//! 3. arguments copied from earlier untrusted output get `Source::Tool(name)` (G4);
//! 4. `Policy::authorize` decides: allow mints the permit the driver runs, ask goes to the
//!    approver, deny is answered "Blocked by policy (RULE): REASON. Nothing was sent.";
//! 5. results go into the history in the model's order, untrusted ones marked.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};
use stockade_policy::allow::{Approval, ApprovalKey, Decision, Gate, Permit, Policy, Source, ToolCall};
use stockade_policy::mark::{MarkMode, Provenance, Untrusted, mark_json, mark_with};
use stockade_policy::taint::{Taint, call_with_sources};
use stockade_protocol::chat::{
    ChatMessage, ChatRequest, Content, MAX_MESSAGES, MAX_TOOL_CALLS, Role, Tool as ChatTool, ToolCall as ChatToolCall,
    is_valid_tool_name,
};
use stockade_protocol::completion::{Completion, DecodedCall, cut};

use crate::endpoint::EndpointError;
use crate::tool::{ToolOutput, Trust};

/// Most calls of one turn that run: 8 (protocol's per-message cap). Further calls are
/// dropped from the history, and the model is told.
pub const MAX_CALLS_PER_TURN: usize = MAX_TOOL_CALLS;

/// How many times in a row the same call (tool and canonical arguments) may be denied before
/// the run stops: 3 (goose's repetition rule; small models loop on a denied call).
pub const MAX_REPEATED_DENIALS: u32 = 3;

/// Shortest copied text the provenance check traces: 8 characters (policy's rule).
pub use stockade_policy::taint::MIN_TAINT_CHARS;

/// Most untrusted output remembered for the provenance check: 4 MiB, older output
/// forgotten first (policy's rule).
pub use stockade_policy::taint::MAX_TAINT_BYTES;

/// Budgets of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunLimits {
    max_turns: u32,
    max_tool_calls: u32,
    max_total_tokens: u64,
}

impl Default for RunLimits {
    /// 12 model calls, 64 tool calls, 1,000,000 tokens.
    fn default() -> Self {
        Self { max_turns: 12, max_tool_calls: 64, max_total_tokens: 1_000_000 }
    }
}

impl RunLimits {
    /// At most `n` model calls (1..=1000).
    #[must_use]
    pub fn max_turns(mut self, n: u32) -> Self {
        self.max_turns = n.clamp(1, 1000);
        self
    }
    /// At most `n` tool calls in the run (1..=10,000).
    #[must_use]
    pub fn max_tool_calls(mut self, n: u32) -> Self {
        self.max_tool_calls = n.clamp(1, 10_000);
        self
    }
    /// At most `n` tokens in the run, as the server reports them.
    #[must_use]
    pub fn max_total_tokens(mut self, n: u64) -> Self {
        self.max_total_tokens = n.max(1);
        self
    }
    /// The turn budget.
    #[must_use]
    pub fn turns(&self) -> u32 {
        self.max_turns
    }

    /// The tool-call budget.
    #[must_use]
    pub fn tool_calls(&self) -> u32 {
        self.max_tool_calls
    }

    /// The token budget.
    #[must_use]
    pub fn total_tokens(&self) -> u64 {
        self.max_total_tokens
    }
}

/// What an assistant message that only calls tools carries as `content` when it is sent back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ToolContent {
    /// `""`: llama-cpp-python answers 500 and LM Studio 400 to `null`.
    #[default]
    Empty,
    /// `null`: what OpenAI sends.
    Null,
}

/// The `tool_choice` to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ToolChoice {
    /// Send none (the server's default; llama-cpp-python's `chatml-function-calling` then
    /// never calls a tool).
    #[default]
    Unset,
    /// `"auto"`: the model chooses.
    Auto,
    /// `"required"`: the model must call a tool.
    Required,
    /// `"none"`: the model may not call a tool.
    None,
}

/// Per-server choices, explicit in the configuration, never guessed.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Profile {
    /// The `content` of an assistant message that only calls tools.
    pub tool_content: ToolContent,
    /// The `tool_choice` sent with every request that offers tools.
    pub tool_choice: ToolChoice,
    /// Sampling temperature to send, if any.
    pub temperature: Option<f64>,
    /// `max_tokens` to send, if any.
    pub max_tokens: Option<u32>,
}

/// The model's final answer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Answer {
    /// The text (the model's own words: not checked by anything).
    pub text: String,
    /// Model calls made.
    pub turns: u32,
    /// Tool calls proposed.
    pub tool_calls: u32,
    /// Tokens used, as reported.
    pub tokens: u64,
    /// Untrusted output was read on the way to it (the host's word under confinement: its
    /// broker's policy state), so the answer can quote an injection.
    pub read_untrusted: bool,
}

/// Why a run ended without an answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// The turn budget is spent.
    #[error("no answer after {turns} turns")]
    #[non_exhaustive]
    NoAnswer {
        /// Turns made.
        turns: u32,
    },
    /// The tool-call budget is spent.
    #[error("the tool-call budget of {max} calls is spent")]
    #[non_exhaustive]
    ToolCallBudget {
        /// The budget.
        max: u32,
    },
    /// The token budget is spent.
    #[error("the token budget is spent: {used} of {max} tokens")]
    #[non_exhaustive]
    TokenBudget {
        /// Tokens used.
        used: u64,
        /// The budget.
        max: u64,
    },
    /// The run's wall-time budget is spent.
    #[error("the run's deadline of {after:?} passed")]
    #[non_exhaustive]
    Deadline {
        /// The budget.
        after: Duration,
    },
    /// The conversation outgrew what one request may carry.
    #[error("the conversation is longer than {max} messages", max = MAX_MESSAGES)]
    ConversationTooLong,
    /// The model kept proposing a call the policy denies.
    #[error("the model proposed the denied call {tool} {times} times in a row (rule {rule})")]
    #[non_exhaustive]
    RepeatedDenial {
        /// The tool.
        tool: String,
        /// The deciding rule.
        rule: String,
        /// How many times.
        times: u32,
    },
    /// The endpoint failed (after retries, where they apply).
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    /// A confined loop ([`crate::ConfinedAgent`]) ended without an answer: it said why, or
    /// it exited, was killed at a limit, or wrote something that is not one reply. The
    /// loop runs the model's plan, so this is a normal outcome, never a host failure.
    #[error("the confined loop gave no answer: {reason}")]
    #[non_exhaustive]
    Confined {
        /// Why, as the host saw it (the loop's own words after "the loop ended without an
        /// answer:").
        reason: String,
    },
    /// A confined loop could not be run: the tier cannot enforce what it needs, or is
    /// misconfigured.
    #[error("the confined loop could not run: {0}")]
    Sandbox(stockade_runtime::RunError),
    /// The run was stopped from outside (a signal at the terminal) before it ended: its
    /// calls still running were cancelled, and the trace says so.
    #[error("interrupted ({why})")]
    #[non_exhaustive]
    Interrupted {
        /// What stopped it (`SIGINT`).
        why: String,
    },
    /// A step was fed out of order, or a result is missing: stockade's bug.
    #[error("internal error: {0}")]
    Internal(String),
}

/// What the driver must do next.
#[derive(Debug)]
#[must_use = "a step must be carried out"]
pub enum Step {
    /// Send this request to the model.
    CallModel(Box<ChatRequest>),
    /// Resolve these calls (run permitted ones, ask about the rest), then call
    /// [`AgentRun::finish_tools`].
    CallTools(Vec<Dispatch>),
    /// The run is over.
    Done(Result<Answer, AgentError>),
}

/// One call the driver must resolve.
#[derive(Debug)]
#[non_exhaustive]
pub struct Dispatch {
    /// Its slot in this turn (pass it back with the result).
    pub slot: usize,
    /// The host id.
    pub call_id: String,
    /// What to do.
    pub action: Action,
}

/// What to do with one call.
#[derive(Debug)]
#[non_exhaustive]
pub enum Action {
    /// Run it: the permit names exactly this call.
    Run(Permit),
    /// Ask a human; then call [`AgentRun::approve`].
    Ask {
        /// The call (its canonical text is what a human approves).
        call: ToolCall,
        /// The rule that asked.
        rule: String,
        /// Why.
        reason: String,
        /// The key an approval must carry.
        key: ApprovalKey,
    },
}

/// An entry of the machine's event log (the driver writes it to the trace).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Event {
    pub(crate) kind: &'static str,
    pub(crate) fields: Value,
}

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Phase {
    Ready,
    AwaitModel,
    AwaitTools,
    Done,
}

#[derive(Debug)]
struct Slot {
    call_id: String,
    tool: String,
    result: Option<String>,
    /// The tool's output was untrusted (and was marked).
    untrusted: bool,
}

/// The system message a run sends for `system_prompt`: it, then MARK's sentence (a confined
/// agent's host knows the loop's from it).
pub(crate) fn system_message(system_prompt: &str, mode: MarkMode) -> String {
    if system_prompt.trim().is_empty() {
        stockade_policy::mark::system_prompt(mode)
    } else {
        format!("{}\n\n{}", system_prompt.trim_end(), stockade_policy::mark::system_prompt(mode))
    }
}

/// The state of one agent run.
#[derive(Debug)]
pub struct AgentRun {
    /// The policy and this run's ledger, and whether untrusted output has been read.
    gate: Gate,
    tools: Vec<ChatTool>,
    trust: HashMap<String, Trust>,
    model: String,
    limits: RunLimits,
    profile: Profile,
    mark_mode: MarkMode,
    messages: Vec<ChatMessage>,
    taint: Taint,
    turns: u32,
    tool_calls: u32,
    tokens: u64,
    run_id: String,
    next_id: u64,
    phase: Phase,
    slots: Vec<Slot>,
    denials: Option<(String, String, u32)>,
    turn_note: Option<String>,
    events: Vec<Event>,
}

impl AgentRun {
    /// A run of `prompt` under `system_prompt` (MARK's sentence is appended to it), offering
    /// `tools` (definition and trust) to `model`, decided by `policy`.
    pub fn new(
        policy: Arc<Policy>,
        tools: Vec<(ChatTool, Trust)>,
        model: impl Into<String>,
        system_prompt: &str,
        prompt: &str,
        limits: RunLimits,
        profile: Profile,
    ) -> Self {
        let mark_mode = MarkMode::Delimit;
        let system = system_message(system_prompt, mark_mode);
        let trust = tools.iter().map(|(t, trust)| (t.function.name.clone(), *trust)).collect();
        let mut nonce = [0u8; 4];
        let _ = getrandom::fill(&mut nonce);
        Self {
            gate: Gate::new(policy),
            tools: tools.into_iter().map(|(t, _)| t).collect(),
            trust,
            model: model.into(),
            limits,
            profile,
            mark_mode,
            messages: vec![ChatMessage::text(Role::System, system), ChatMessage::text(Role::User, prompt)],
            taint: Taint::new(),
            turns: 0,
            tool_calls: 0,
            tokens: 0,
            run_id: nonce.iter().map(|b| format!("{b:02x}")).collect(),
            next_id: 0,
            phase: Phase::Ready,
            slots: Vec::new(),
            denials: None,
            turn_note: None,
            events: Vec::new(),
        }
    }

    /// The conversation so far.
    #[must_use]
    pub fn messages(&self) -> &[ChatMessage] {
        &self.messages
    }

    /// The run's state as JSON: the conversation, the counters and the session facts (the
    /// pending permits, which cannot be serialized by design, are not part of it).
    #[must_use]
    pub fn snapshot(&self) -> Value {
        json!({
            "model": self.model,
            "messages": self.messages,
            "turns": self.turns,
            "tool_calls": self.tool_calls,
            "tokens": self.tokens,
            "read_untrusted": self.gate.has_read_untrusted(),
            "phase": format!("{:?}", self.phase),
        })
    }

    /// Whether untrusted output has been read.
    #[must_use]
    pub fn has_read_untrusted(&self) -> bool {
        self.gate.has_read_untrusted()
    }

    /// Model calls made.
    #[must_use]
    pub fn turns(&self) -> u32 {
        self.turns
    }

    /// Tool calls proposed and counted.
    #[must_use]
    pub fn tool_calls(&self) -> u32 {
        self.tool_calls
    }

    pub(crate) fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }

    fn done(&mut self, result: Result<Answer, AgentError>) -> Step {
        self.phase = Phase::Done;
        Step::Done(result)
    }

    /// The next step, from the ready state: a model call, or the end of the budget.
    pub fn next_step(&mut self) -> Step {
        if self.phase != Phase::Ready {
            return self.done(Err(AgentError::Internal(format!("next_step in phase {:?}", self.phase))));
        }
        if self.turns >= self.limits.max_turns {
            let turns = self.turns;
            return self.done(Err(AgentError::NoAnswer { turns }));
        }
        if self.messages.len() >= MAX_MESSAGES {
            return self.done(Err(AgentError::ConversationTooLong));
        }
        self.turns += 1;
        self.phase = Phase::AwaitModel;
        let mut request = ChatRequest::new(self.model.clone(), self.messages.clone());
        request.tools = self.tools.clone();
        request.tool_choice = match self.profile.tool_choice {
            _ if self.tools.is_empty() => None,
            ToolChoice::Unset => None,
            ToolChoice::Auto => Some(Value::from("auto")),
            ToolChoice::Required => Some(Value::from("required")),
            ToolChoice::None => Some(Value::from("none")),
        };
        request.temperature = self.profile.temperature;
        request.max_tokens = self.profile.max_tokens;
        Step::CallModel(Box::new(request))
    }

    /// Feeds the model's completion; `now` is the time since the run started (for the
    /// policy's windows).
    pub fn on_completion(&mut self, completion: Completion, now: Duration) -> Step {
        if self.phase != Phase::AwaitModel {
            return self.done(Err(AgentError::Internal("a completion arrived unasked".into())));
        }
        if let Some(u) = completion.usage {
            self.tokens = self.tokens.saturating_add(u.total_tokens);
            self.events.push(Event {
                kind: "usage",
                fields: json!({"turn": self.turns, "prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
                               "total_tokens": u.total_tokens, "run_total": self.tokens}),
            });
            if self.tokens > self.limits.max_total_tokens {
                let (used, max) = (self.tokens, self.limits.max_total_tokens);
                return self.done(Err(AgentError::TokenBudget { used, max }));
            }
        }
        if completion.calls.is_empty() {
            let answer = Answer {
                text: completion.text.unwrap_or_default(),
                turns: self.turns,
                tool_calls: self.tool_calls,
                tokens: self.tokens,
                read_untrusted: self.gate.has_read_untrusted(),
            };
            return self.done(Ok(answer));
        }
        let truncated = completion.truncated();
        let dropped = completion.dropped_calls + completion.calls.len().saturating_sub(MAX_CALLS_PER_TURN);
        let mut dispatches = Vec::new();
        let mut history_calls = Vec::new();
        self.slots.clear();
        for (slot, call) in completion.calls.into_iter().take(MAX_CALLS_PER_TURN).enumerate() {
            if self.tool_calls >= self.limits.max_tool_calls {
                let max = self.limits.max_tool_calls;
                return self.done(Err(AgentError::ToolCallBudget { max }));
            }
            self.tool_calls += 1;
            self.next_id += 1;
            let call_id = format!("call_{}_{}", self.run_id, self.next_id);
            let sent_name = if is_valid_tool_name(&call.name) { call.name.clone() } else { "unknown_tool".to_owned() };
            let arguments = match &call.arguments {
                Ok(map) => Value::Object(map.clone()).to_string(),
                Err(_) => "{}".to_owned(),
            };
            history_calls.push(ChatToolCall::function(call_id.clone(), sent_name, arguments));
            let untrusted = self.trust.get(&call.name) == Some(&Trust::Untrusted);
            self.slots.push(Slot { call_id: call_id.clone(), tool: call.name.clone(), result: None, untrusted });
            match self.plan(&call_id, call, truncated, now) {
                Ok(action) => dispatches.push(Dispatch { slot, call_id, action }),
                Err(text) => self.slots[slot].result = Some(text),
            }
            if let Some(err) = self.repeated_denial() {
                return self.done(Err(err));
            }
        }
        self.turn_note = (dropped > 0).then(|| {
            format!("\n(Note: {dropped} further call(s) in this reply were not run: at most {MAX_CALLS_PER_TURN} calls run per reply.)")
        });
        let content = match self.profile.tool_content {
            ToolContent::Empty => Some(Content::Text(completion.text.unwrap_or_default())),
            ToolContent::Null => completion.text.filter(|t| !t.is_empty()).map(Content::Text),
        };
        let mut assistant = ChatMessage::text(Role::Assistant, "");
        assistant.content = content;
        assistant.tool_calls = history_calls;
        self.messages.push(assistant);
        self.phase = Phase::AwaitTools;
        if dispatches.is_empty() { self.finish_tools() } else { Step::CallTools(dispatches) }
    }

    /// Decides one call: an action for the driver, or the text answered right away.
    fn plan(&mut self, call_id: &str, call: DecodedCall, truncated: bool, now: Duration) -> Result<Action, String> {
        let shown = serde_json::to_string(&cut(&call.name, 64)).unwrap_or_default();
        let refuse = |this: &mut Self, why: &str, text: String| {
            this.events.push(Event {
                kind: "decision",
                fields: json!({"turn": this.turns, "call": call_id, "provider_id": call.provider_id, "tool": cut(&call.name, 64),
                               "effect": "refused", "rule": why, "reason": text}),
            });
            text
        };
        if truncated {
            return Err(refuse(
                self,
                "truncated",
                "Error: your reply was cut off by the token limit, so this call was not run. Nothing was done.".into(),
            ));
        }
        if !self.trust.contains_key(&call.name) {
            let names: Vec<&str> = self.tools.iter().map(|t| t.function.name.as_str()).collect();
            return Err(refuse(
                self,
                "unknown-tool",
                format!("Error: there is no tool named {shown}. The tools are: {}. Nothing was run.", names.join(", ")),
            ));
        }
        let args = match call.arguments {
            Ok(args) => args,
            Err(e) => {
                return Err(refuse(
                    self,
                    "bad-arguments",
                    format!(
                        "Error: the arguments of {shown} could not be used: {e}. Send one JSON object. Nothing was run."
                    ),
                ));
            }
        };
        let (tool_call, tainted) = self.with_provenance(&call.name, args);
        let decision = self.gate.decide(&tool_call, now);
        self.events.push(Event {
            kind: "decision",
            fields: json!({"turn": self.turns, "call": call_id, "provider_id": call.provider_id, "tool": call.name,
                           "args": tool_call.canonical_args(), "effect": format!("{:?}", decision.effect()).to_lowercase(),
                           "rule": decision.rule(), "reason": reason_of(&decision), "tainted": tainted}),
        });
        match decision {
            Decision::Allow(permit) => {
                self.denials = None;
                Ok(Action::Run(permit))
            }
            Decision::Ask { rule, reason, approval_key } => {
                self.denials = None;
                Ok(Action::Ask { call: tool_call, rule, reason, key: approval_key })
            }
            Decision::Deny { rule, reason } => {
                self.note_denial(&tool_call, &rule);
                Err(format!("Blocked by policy ({rule}): {reason}. Nothing was sent."))
            }
        }
    }

    fn note_denial(&mut self, call: &ToolCall, rule: &str) {
        let canonical = call.canonical();
        self.denials = match self.denials.take() {
            Some((c, r, n)) if c == canonical => Some((c, r, n + 1)),
            _ => Some((canonical, rule.to_owned(), 1)),
        };
    }

    fn repeated_denial(&self) -> Option<AgentError> {
        match &self.denials {
            Some((canonical, rule, times)) if *times >= MAX_REPEATED_DENIALS => Some(AgentError::RepeatedDenial {
                tool: canonical.split('\0').next().unwrap_or_default().to_owned(),
                rule: rule.clone(),
                times: *times,
            }),
            _ => None,
        }
    }

    /// The call with each argument's source: `Source::Tool(t)` when a string in it was copied
    /// from tool `t`'s untrusted output, `Source::User` otherwise.
    fn with_provenance(&self, tool: &str, args: Map<String, Value>) -> (ToolCall, Vec<String>) {
        call_with_sources(tool, args, |v| self.taint.origin_of(v).map(|t| Source::Tool(t.to_owned())))
    }

    /// Resolves an `ask`: with `approved`, the policy decides again with a single-use approval
    /// for exactly this call, and the permit it mints is returned for the driver to run;
    /// otherwise the call is answered as blocked.
    pub fn approve(
        &mut self,
        slot: usize,
        call: ToolCall,
        key: ApprovalKey,
        approved: bool,
        now: Duration,
    ) -> Option<Permit> {
        if self.phase != Phase::AwaitTools || slot >= self.slots.len() {
            return None;
        }
        if !approved {
            let text = "Blocked by policy: this call needs a human's approval, and it was not given. Nothing was sent."
                .to_owned();
            self.events.push(Event { kind: "decision", fields: json!({"turn": self.turns, "call": self.slots[slot].call_id, "tool": call.tool(), "effect": "deny", "rule": "approval", "reason": "approval needed and not given"}) });
            self.note_denial(&call, "approval");
            self.slots[slot].result = Some(text);
            return None;
        }
        match self.gate.decide_approved(&call, now, Approval::grant(key)) {
            Decision::Allow(permit) => {
                self.events.push(Event { kind: "decision", fields: json!({"turn": self.turns, "call": self.slots[slot].call_id, "tool": call.tool(), "effect": "allow", "rule": permit.rule(), "reason": "approved by a human"}) });
                Some(permit)
            }
            other => {
                let rule = other.rule().to_owned();
                self.slots[slot].result =
                    Some(format!("Blocked by policy ({rule}): {}. Nothing was sent.", reason_of(&other)));
                None
            }
        }
    }

    /// The run was stopped while calls ran: each call still without a result (allowed and
    /// running, or waiting for its approval) is closed as cancelled and returned (its host
    /// id and tool), for the trace.
    pub fn cancel_pending(&mut self) -> Vec<(String, String)> {
        if self.phase != Phase::AwaitTools {
            return Vec::new();
        }
        let mut cancelled = Vec::new();
        for s in &mut self.slots {
            if s.result.is_none() {
                s.result = Some("Error: the run was stopped before this call ended.".to_owned());
                cancelled.push((s.call_id.clone(), s.tool.clone()));
            }
        }
        self.phase = Phase::Done;
        cancelled
    }

    /// Whether the tool in `slot` gives untrusted output (marked before the model reads it).
    #[must_use]
    pub fn untrusted(&self, slot: usize) -> bool {
        self.slots.get(slot).is_some_and(|s| s.untrusted)
    }

    /// Records what slot `slot`'s tool returned. Untrusted output is marked here.
    pub fn tool_result(&mut self, slot: usize, output: ToolOutput) {
        let Some(s) = self.slots.get(slot) else { return };
        let (tool, call_id, untrusted) = (s.tool.clone(), s.call_id.clone(), s.untrusted);
        let text = self.render(&tool, &call_id, untrusted, output);
        if let Some(s) = self.slots.get_mut(slot) {
            s.result = Some(text);
        }
    }

    fn render(&mut self, tool: &str, call_id: &str, untrusted: bool, output: ToolOutput) -> String {
        if !untrusted {
            return match output {
                ToolOutput::Text(t) => t,
                ToolOutput::Json(v) => v.to_string(),
                ToolOutput::Failed { reason, output: None } | ToolOutput::TimedOut { reason } => {
                    format!("Error: {reason}")
                }
                ToolOutput::Failed { reason, output: Some(o) } => format!("Error: {reason}\n{o}"),
            };
        }
        self.gate.set_read_untrusted();
        let provenance = || Provenance::tool(tool, call_id);
        match output {
            ToolOutput::Text(t) => {
                let marked = mark_with(&Untrusted::new(t.clone(), provenance()), self.mark_mode);
                self.taint.remember(tool, t);
                marked.map_or_else(
                    |e| format!("Error: the output could not be marked ({e}), so it is withheld."),
                    |m| m.to_string(),
                )
            }
            ToolOutput::Json(v) => {
                let marked = mark_json(&Untrusted::new(v.clone(), provenance()), self.mark_mode);
                self.taint.remember_json(tool, &v);
                marked.map_or_else(
                    |e| format!("Error: the output could not be marked ({e}), so it is withheld."),
                    |m| m.to_string(),
                )
            }
            ToolOutput::Failed { reason, output: None } | ToolOutput::TimedOut { reason } => format!("Error: {reason}"),
            ToolOutput::Failed { reason, output: Some(o) } => {
                let marked = mark_with(&Untrusted::new(o.clone(), provenance()), self.mark_mode);
                self.taint.remember(tool, o);
                match marked {
                    Ok(m) => format!("Error: {reason}\n{m}"),
                    Err(_) => format!("Error: {reason}"),
                }
            }
        }
    }

    /// Appends every result of this turn to the history, in the model's order, and returns
    /// the next step. Every slot must have a result by now.
    pub fn finish_tools(&mut self) -> Step {
        if self.phase != Phase::AwaitTools {
            return self.done(Err(AgentError::Internal("finish_tools with no calls pending".into())));
        }
        if let Some(err) = self.repeated_denial() {
            return self.done(Err(err));
        }
        let slots = std::mem::take(&mut self.slots);
        let last = slots.len().saturating_sub(1);
        for (i, s) in slots.into_iter().enumerate() {
            let Some(mut text) = s.result else {
                return self.done(Err(AgentError::Internal(format!("no result for call {}", s.call_id))));
            };
            if i == last
                && let Some(note) = self.turn_note.take()
            {
                text.push_str(&note);
            }
            self.messages.push(ChatMessage::tool_result(s.call_id, text));
        }
        self.phase = Phase::Ready;
        self.next_step()
    }

    /// The names of the tools whose output is untrusted.
    #[must_use]
    pub fn untrusted_tools(&self) -> BTreeSet<&str> {
        self.trust.iter().filter(|(_, t)| **t == Trust::Untrusted).map(|(n, _)| n.as_str()).collect()
    }
}

fn reason_of(d: &Decision) -> String {
    match d {
        Decision::Allow(_) => String::new(),
        Decision::Ask { reason, .. } | Decision::Deny { reason, .. } => reason.clone(),
    }
}
