//! ALLOW: deciding, in plain code, whether a tool call may run.
//!
//! [`Policy::authorize`] is pure (no I/O, no clock: the caller passes `now`), runs in time
//! linear in the policy and the call, and returns a [`Decision`]:
//! [`Decision::Allow`] with a [`Permit`] (which only `authorize` can mint), [`Decision::Ask`]
//! with an [`ApprovalKey`] bound to the exact call, or [`Decision::Deny`] naming the rule.
//!
//! Semantics, in order:
//! 1. an unknown tool, an unknown argument, a mistyped or missing argument: deny;
//! 2. over the session's call limit: deny;
//! 3. any matching `deny` rule, or a matching rule whose own limit is used up: deny;
//! 4. any matching `ask` rule: ask (or allow, with an [`Approval`] for exactly this call);
//! 5. any matching `allow` rule: allow;
//! 6. otherwise: deny (`default-deny`).

mod document;
mod gate;
mod ledger;
mod predicate;
mod registry;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Duration;

use serde_json::Value;
use sha2::{Digest, Sha256};

pub use document::{Location, MAX_POLICY_BYTES, MAX_RULE_ID_LEN, PolicyError, PolicyErrorKind};
pub use gate::{Gate, RefusalKind, Refused};
pub use ledger::{Ledger, MAX_LEDGER_WINDOW};
pub use predicate::{Bound, HostPattern, MAX_REGEX_SIZE, Predicate, SourceReq, normalise_path};
pub use registry::{ArgSpec, ArgType, MAX_ARG_TYPE_DEPTH, Registry, SchemaError, ToolSpec};

/// Most rules in one policy: 1024. Bounds the time of one decision.
pub const MAX_RULES: usize = 1024;
/// Largest call (tool name plus canonical arguments) `authorize` considers: 1 MiB; larger
/// calls are denied without evaluating any rule.
pub const MAX_CALL_BYTES: usize = 1 << 20;
/// Largest `max_calls` a limit may name: 4096 (the ledger keeps that many timestamps per tool).
pub const MAX_LIMIT_CALLS: u32 = 4096;

/// Where an argument value came from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Source {
    /// Typed or chosen by the user.
    User,
    /// From the host's configuration.
    Config,
    /// Derived from the output of the named tool (possibly attacker-influenced).
    Tool(String),
    /// Sent by code running in a sandbox (a grant call): never trusted.
    Sandbox,
}

impl Source {
    /// Parses `user`, `config`, `sandbox` or `tool:NAME`.
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "user" => Some(Self::User),
            "config" => Some(Self::Config),
            "sandbox" => Some(Self::Sandbox),
            _ => s.strip_prefix("tool:").filter(|t| !t.is_empty()).map(|t| Self::Tool(t.to_owned())),
        }
    }
}

/// One argument of a call, with its provenance.
#[derive(Debug, Clone, PartialEq)]
pub struct Arg {
    value: Value,
    source: Source,
}

impl Arg {
    /// The value.
    #[must_use]
    pub fn value(&self) -> &Value {
        &self.value
    }
    /// Where it came from.
    #[must_use]
    pub fn source(&self) -> &Source {
        &self.source
    }
}

/// A proposed tool call: a tool name and named arguments, each with its source.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    tool: String,
    args: BTreeMap<String, Arg>,
}

impl ToolCall {
    /// A call of `tool` with no arguments.
    #[must_use]
    pub fn new(tool: impl Into<String>) -> Self {
        Self { tool: tool.into(), args: BTreeMap::new() }
    }

    /// Adds (or replaces) an argument.
    #[must_use]
    pub fn arg(mut self, name: impl Into<String>, value: Value, source: Source) -> Self {
        self.args.insert(name.into(), Arg { value, source });
        self
    }

    /// A call whose arguments are the fields of a JSON object, all from `source`.
    /// `None` if `args` is not an object.
    #[must_use]
    pub fn from_json(tool: impl Into<String>, args: &Value, source: &Source) -> Option<Self> {
        let map = args.as_object()?;
        let mut call = Self::new(tool);
        for (k, v) in map {
            call = call.arg(k.clone(), v.clone(), source.clone());
        }
        Some(call)
    }

    /// Marks one argument as coming from `source` (e.g. after taint tracking found it in a tool's output).
    #[must_use]
    pub fn with_source(mut self, name: &str, source: Source) -> Self {
        if let Some(a) = self.args.get_mut(name) {
            a.source = source;
        }
        self
    }

    /// The tool.
    #[must_use]
    pub fn tool(&self) -> &str {
        &self.tool
    }

    /// The arguments.
    #[must_use]
    pub fn args(&self) -> &BTreeMap<String, Arg> {
        &self.args
    }

    /// The arguments as one JSON object.
    #[must_use]
    pub fn args_json(&self) -> Value {
        Value::Object(self.args.iter().map(|(k, a)| (k.clone(), a.value.clone())).collect())
    }

    /// The canonical text of the call: the tool name, a NUL, and the arguments as JSON with
    /// object keys sorted at every level and no whitespace.
    #[must_use]
    pub fn canonical(&self) -> String {
        let mut out = Vec::with_capacity(64);
        out.extend_from_slice(self.tool.as_bytes());
        out.push(0);
        // The arguments are a BTreeMap, so their keys are already in order.
        canonical_object(self.args.iter().map(|(k, a)| (k.as_str(), &a.value)), &mut out);
        // Only UTF-8 went in: the tool name, JSON punctuation and serde_json's output.
        String::from_utf8(out).unwrap_or_default()
    }

    /// The arguments of [`ToolCall::canonical`] alone: JSON with object keys sorted at every
    /// level and no whitespace.
    #[must_use]
    pub fn canonical_args(&self) -> String {
        let mut out = Vec::with_capacity(64);
        canonical_object(self.args.iter().map(|(k, a)| (k.as_str(), &a.value)), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

/// The value at `rest` inside a top-level argument.
fn value_in<'c>(arg: &'c Arg, rest: &[String]) -> Option<(&'c Value, &'c Source)> {
    let mut v = &arg.value;
    for seg in rest {
        v = v.as_object()?.get(seg)?;
    }
    Some((v, &arg.source))
}

fn json_string(s: &str, out: &mut Vec<u8>) {
    // Writing a string into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

/// Writes `{"k":v,...}` for entries already in key order, each value canonical.
fn canonical_object<'a>(entries: impl Iterator<Item = (&'a str, &'a Value)>, out: &mut Vec<u8>) {
    out.push(b'{');
    for (i, (k, v)) in entries.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        json_string(k, out);
        out.push(b':');
        canonical_json(v, out);
    }
    out.push(b'}');
}

/// Writes `v` with sorted keys regardless of how the JSON map type orders them (a feature of
/// serde_json elsewhere in the build can switch maps to insertion order).
fn canonical_json(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Object(map) => {
            let mut entries: Vec<(&str, &Value)> = map.iter().map(|(k, v)| (k.as_str(), v)).collect();
            if !entries.is_sorted_by_key(|(k, _)| *k) {
                entries.sort_by_key(|(k, _)| *k);
            }
            canonical_object(entries.into_iter(), out);
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical_json(item, out);
            }
            out.push(b']');
        }
        other => {
            let _ = serde_json::to_writer(&mut *out, other);
        }
    }
}

/// The SHA-256 of a call's canonical text: what an approval binds to.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ApprovalKey([u8; 32]);

impl ApprovalKey {
    /// The key of `call`.
    #[must_use]
    pub fn of(call: &ToolCall) -> Self {
        Self::of_canonical(&call.canonical())
    }

    fn of_canonical(canonical: &str) -> Self {
        Self(Sha256::digest(canonical.as_bytes()).into())
    }
}

impl fmt::Display for ApprovalKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for ApprovalKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ApprovalKey({self})")
    }
}

/// A human's approval of one exact call. It is not `Clone`, so passing it to
/// [`Policy::authorize_approved`] uses it up.
#[derive(Debug, PartialEq, Eq)]
pub struct Approval {
    key: ApprovalKey,
}

impl Approval {
    /// Records that a human approved the call with `key` (from a [`Decision::Ask`]).
    #[must_use]
    pub fn grant(key: ApprovalKey) -> Self {
        Self { key }
    }
}

/// Permission to execute exactly one call. Only [`Policy::authorize`] mints one; it cannot be
/// cloned, built, or deserialized outside this crate.
///
/// ```compile_fail
/// let p = stockade_policy::allow::Permit { call: todo!(), rule: String::new(), canonical: String::new() };
/// ```
#[derive(Debug)]
#[must_use = "a permit is the only way to execute a call"]
pub struct Permit {
    call: ToolCall,
    rule: String,
    canonical: String,
}

impl Permit {
    /// The call this permit names.
    pub fn call(&self) -> &ToolCall {
        &self.call
    }
    /// The rule that allowed it.
    #[must_use]
    pub fn rule(&self) -> &str {
        &self.rule
    }
    /// The call's key.
    #[must_use]
    pub fn key(&self) -> ApprovalKey {
        ApprovalKey::of_canonical(&self.canonical)
    }
    /// True if this permit names exactly `call` (same tool, same canonical arguments).
    #[must_use]
    pub fn covers(&self, call: &ToolCall) -> bool {
        self.canonical == call.canonical()
    }
}

/// What [`Policy::authorize`] decided.
#[derive(Debug)]
#[must_use = "a decision that is not inspected is an allow"]
pub enum Decision {
    /// Run the call.
    Allow(Permit),
    /// Ask a human first.
    Ask {
        /// The rule that asked.
        rule: String,
        /// Why.
        reason: String,
        /// The key an [`Approval`] must carry.
        approval_key: ApprovalKey,
    },
    /// Do not run the call.
    Deny {
        /// The rule that decided (a policy rule id, or a built-in one such as `default-deny`).
        rule: String,
        /// Why, in words that can be shown to the model.
        reason: String,
    },
}

impl Decision {
    /// The rule that decided.
    #[must_use]
    pub fn rule(&self) -> &str {
        match self {
            Self::Allow(p) => &p.rule,
            Self::Ask { rule, .. } | Self::Deny { rule, .. } => rule,
        }
    }

    /// `allow`, `ask` or `deny`.
    #[must_use]
    pub fn effect(&self) -> Effect {
        match self {
            Self::Allow(_) => Effect::Allow,
            Self::Ask { .. } => Effect::Ask,
            Self::Deny { .. } => Effect::Deny,
        }
    }
}

/// What a rule does when it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Effect {
    /// Allow the call.
    Allow,
    /// Ask a human.
    Ask,
    /// Deny the call.
    Deny,
}

/// A call-count limit, optionally per sliding window, and for a metered tool
/// ([`ToolSpec::metered`]) a byte budget its caller enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    max_calls: Option<u32>,
    per: Option<Duration>,
    max_bytes: Option<u64>,
}

impl Limit {
    /// At most `max_calls` calls (1..=[`MAX_LIMIT_CALLS`]) in total, or per window `per`.
    #[must_use]
    pub fn new(max_calls: u32, per: Option<Duration>) -> Self {
        Self { max_calls: Some(max_calls), per, max_bytes: None }
    }

    /// At most `max_bytes` bytes, both ways, over every call the rule allows in a session.
    /// The policy only carries the number: the metered tool's caller counts the bytes and
    /// stops at it (the network grant's proxy does, per connection it allowed by the rule).
    #[must_use]
    pub fn bytes(max_bytes: u64) -> Self {
        Self { max_calls: None, per: None, max_bytes: Some(max_bytes) }
    }

    /// This limit with a byte budget too.
    #[must_use]
    pub fn with_bytes(mut self, max_bytes: u64) -> Self {
        self.max_bytes = Some(max_bytes);
        self
    }

    /// The byte budget, if any.
    #[must_use]
    pub fn max_bytes(&self) -> Option<u64> {
        self.max_bytes
    }
}

/// The state and facts a decision may depend on, owned by the caller.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    ledger: &'a Ledger,
    now: Duration,
    read_untrusted: bool,
}

impl<'a> Context<'a> {
    /// A context at time `now` (any monotonic origin, e.g. session start).
    #[must_use]
    pub fn new(ledger: &'a Ledger, now: Duration) -> Self {
        Self { ledger, now, read_untrusted: false }
    }

    /// Sets the session's "has read untrusted data" flag.
    #[must_use]
    pub fn read_untrusted(mut self, yes: bool) -> Self {
        self.read_untrusted = yes;
        self
    }
}

/// Which tools a rule applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolPattern {
    /// Exactly this tool.
    Exact(String),
    /// Every tool whose name starts with this prefix (written `prefix*`).
    Prefix(String),
}

impl ToolPattern {
    /// Parses `name` or `prefix*`.
    #[must_use]
    pub fn parse(s: &str) -> Self {
        match s.strip_suffix('*') {
            Some(p) => Self::Prefix(p.to_owned()),
            None => Self::Exact(s.to_owned()),
        }
    }

    fn matches(&self, tool: &str) -> bool {
        match self {
            Self::Exact(t) => t == tool,
            Self::Prefix(p) => tool.starts_with(p.as_str()),
        }
    }
}

/// One policy rule.
#[derive(Debug, Clone)]
pub struct Rule {
    id: String,
    tool: ToolPattern,
    effect: Effect,
    args: Vec<(Vec<String>, Predicate)>,
    /// For each entry of `args`, the interned id of its top-level argument name (filled in
    /// by `Policy::new`), so a decision looks each argument up once, not once per rule.
    arg_ids: Vec<usize>,
    when_read_untrusted: Option<bool>,
    limit: Option<Limit>,
}

impl Rule {
    /// A rule with no argument predicates and no conditions.
    #[must_use]
    pub fn new(id: impl Into<String>, tool: ToolPattern, effect: Effect) -> Self {
        Self {
            id: id.into(),
            tool,
            effect,
            args: Vec::new(),
            arg_ids: Vec::new(),
            when_read_untrusted: None,
            limit: None,
        }
    }

    /// Adds a predicate on the argument at the dotted `path` (`to`, `meta.host`).
    #[must_use]
    pub fn arg(mut self, path: &str, predicate: Predicate) -> Self {
        self.args.push((path.split('.').map(str::to_owned).collect(), predicate));
        self
    }

    /// Matches only when the session's "has read untrusted data" flag equals `flag`.
    #[must_use]
    pub fn when_read_untrusted(mut self, flag: bool) -> Self {
        self.when_read_untrusted = Some(flag);
        self
    }

    /// Limits how often the rule's tools may be called while it is the deciding rule.
    #[must_use]
    pub fn limit(mut self, limit: Limit) -> Self {
        self.limit = Some(limit);
        self
    }

    /// The rule's id.
    #[must_use]
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The rule's effect.
    #[must_use]
    pub fn effect(&self) -> Effect {
        self.effect
    }

    /// The rule's limit, if it has one.
    #[must_use]
    pub fn limit_of(&self) -> Option<Limit> {
        self.limit
    }

    /// The predicates the rule puts on the top-level argument `name` (a rule may put
    /// several; all must hold). A caller that acts on what allowed a call reads them here:
    /// the network grant asks whether the rule named an address literally.
    pub fn predicates_on<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Predicate> + 'a {
        self.args.iter().filter(move |(path, _)| path.len() == 1 && path[0] == name).map(|(_, p)| p)
    }

    fn matches<'c>(&self, resolved: &[Option<&'c Arg>], ctx: &Context<'_>, memo: &predicate::Memo<'c>) -> bool {
        // Rules reach here through the tool index (exact) or after a prefix check.
        self.when_read_untrusted.is_none_or(|w| w == ctx.read_untrusted)
            && self.args.iter().zip(&self.arg_ids).all(|((path, pred), id)| {
                resolved
                    .get(*id)
                    .copied()
                    .flatten()
                    .and_then(|arg| value_in(arg, &path[1..]))
                    .is_some_and(|(v, src)| pred.holds_memo(v, src, memo))
            })
    }

    fn over_limit(&self, ctx: &Context<'_>) -> bool {
        self.limit
            .and_then(|l| l.max_calls.map(|max| (l.per, max)))
            .is_some_and(|(per, max)| ctx.ledger.count(|t| self.tool.matches(t), per, ctx.now) >= u64::from(max))
    }
}

/// A validated policy: a registry, rules, and an optional session limit.
#[derive(Debug, Clone)]
pub struct Policy {
    registry: Registry,
    rules: Vec<Rule>,
    by_tool: HashMap<String, Vec<usize>>,
    prefix_rules: Vec<usize>,
    session_limit: Option<Limit>,
    /// Interned top-level argument names used by any rule.
    arg_names: HashMap<String, usize>,
}

/// The union of two ascending index lists, in ascending order (policy order).
fn merged<'a>(a: &'a [usize], b: &'a [usize]) -> impl Iterator<Item = usize> + 'a {
    let (mut a, mut b) = (a.iter().peekable(), b.iter().peekable());
    std::iter::from_fn(move || match (a.peek(), b.peek()) {
        (Some(&&x), Some(&&y)) if x <= y => a.next().copied(),
        (Some(_), Some(_)) | (None, Some(_)) => b.next().copied(),
        (Some(_), None) => a.next().copied(),
        (None, None) => None,
    })
}

fn deny(rule: &str, reason: String) -> Decision {
    Decision::Deny { rule: rule.to_owned(), reason }
}

impl Policy {
    /// A policy that denies every call.
    #[must_use]
    pub fn deny_all(registry: Registry) -> Self {
        Self {
            registry,
            rules: Vec::new(),
            by_tool: HashMap::new(),
            prefix_rules: Vec::new(),
            session_limit: None,
            arg_names: HashMap::new(),
        }
    }

    /// A policy of `rules` (in order) over `registry`, after the same load-time checks as
    /// [`Policy::from_toml`] (no examples, no locations).
    pub fn new(registry: Registry, rules: Vec<Rule>, session_limit: Option<Limit>) -> Result<Self, PolicyError> {
        let mut seen = std::collections::HashSet::new();
        for rule in &rules {
            document::check_rule(&registry, rule).map_err(PolicyError::unlocated)?;
            if !seen.insert(rule.id.clone()) {
                return Err(PolicyError::unlocated(PolicyErrorKind::DuplicateRule(rule.id.clone())));
            }
        }
        if let Some(l) = &session_limit {
            document::check_limit(l).map_err(PolicyError::unlocated)?;
        }
        if rules.len() > MAX_RULES {
            return Err(PolicyError::unlocated(PolicyErrorKind::TooManyRules(rules.len())));
        }
        let mut policy = Self::deny_all(registry);
        policy.session_limit = session_limit;
        for (i, rule) in rules.iter().enumerate() {
            match &rule.tool {
                ToolPattern::Exact(t) => policy.by_tool.entry(t.clone()).or_default().push(i),
                ToolPattern::Prefix(_) => policy.prefix_rules.push(i),
            }
        }
        let mut rules = rules;
        let mut patterns: HashMap<String, std::sync::Arc<regex::Regex>> = HashMap::new();
        for rule in &mut rules {
            for (_, pred) in &mut rule.args {
                if let Predicate::Pattern(re) = pred {
                    *re = patterns.entry(re.as_str().to_owned()).or_insert_with(|| re.clone()).clone();
                }
            }
            rule.arg_ids = Vec::with_capacity(rule.args.len());
            for (path, _) in &rule.args {
                let next = policy.arg_names.len();
                rule.arg_ids.push(*policy.arg_names.entry(path[0].clone()).or_insert(next));
            }
        }
        policy.rules = rules;
        Ok(policy)
    }

    /// Parses and validates a TOML policy (format in the crate docs) against `registry`,
    /// then runs every rule's examples.
    pub fn from_toml(text: &str, registry: &Registry) -> Result<Self, PolicyError> {
        document::load(text, registry)
    }

    /// The registry the policy was checked against.
    #[must_use]
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The rules, in order.
    pub fn rules(&self) -> impl Iterator<Item = &Rule> {
        self.rules.iter()
    }

    /// Decides whether `call` may run. Pure and bounded; see the module docs for the order.
    pub fn authorize(&self, call: &ToolCall, ctx: &Context<'_>) -> Decision {
        self.decide(call, ctx, None)
    }

    /// Like [`authorize`](Self::authorize), but an `ask` becomes an allow if `approval` was
    /// granted for exactly this call. An approval for another call is a denial
    /// (`approval-mismatch`); an approval never overrides a denial.
    pub fn authorize_approved(&self, call: &ToolCall, ctx: &Context<'_>, approval: Approval) -> Decision {
        self.decide(call, ctx, Some(approval))
    }

    fn decide(&self, call: &ToolCall, ctx: &Context<'_>, approval: Option<Approval>) -> Decision {
        let Some(spec) = self.registry.get(&call.tool) else {
            return deny("unknown-tool", format!("there is no tool named {:?}", call.tool));
        };
        for (name, arg) in &call.args {
            let Some(arg_spec) = spec.args().get(name) else {
                return deny("unknown-argument", format!("tool `{}` has no argument {name:?}", call.tool));
            };
            if let Err((path, what)) = registry::check_value(arg_spec.ty(), &arg.value, name) {
                return deny("bad-argument", format!("argument `{path}`: {what}"));
            }
        }
        if let Some((name, _)) = spec.args().iter().find(|(k, a)| a.required() && !call.args.contains_key(*k)) {
            return deny("bad-argument", format!("missing required argument `{name}`"));
        }
        let canonical = call.canonical();
        if canonical.len() > MAX_CALL_BYTES {
            return deny(
                "call-too-large",
                format!("the call is {} bytes; the maximum is {MAX_CALL_BYTES}", canonical.len()),
            );
        }
        if let Some((per, max)) = self.session_limit.and_then(|l| l.max_calls.map(|m| (l.per, m)))
            && ctx.ledger.count(|_| true, per, ctx.now) >= u64::from(max)
        {
            return deny("session-limit", format!("the session may make at most {max} calls"));
        }
        let exact = self.by_tool.get(&call.tool).map(Vec::as_slice).unwrap_or_default();
        let (mut ask, mut allow) = (None, None);
        let memo = predicate::Memo::default();
        let mut resolved: Vec<Option<&Arg>> = vec![None; self.arg_names.len()];
        for (name, arg) in &call.args {
            if let Some(&id) = self.arg_names.get(name) {
                resolved[id] = Some(arg);
            }
        }
        for i in merged(exact, &self.prefix_rules) {
            let rule = &self.rules[i];
            let tool_ok = matches!(rule.tool, ToolPattern::Exact(_)) || rule.tool.matches(&call.tool);
            if !tool_ok || !rule.matches(&resolved, ctx, &memo) {
                continue;
            }
            match rule.effect {
                Effect::Deny => return deny(&rule.id, format!("denied by rule `{}`", rule.id)),
                _ if rule.over_limit(ctx) => {
                    return deny(&rule.id, format!("rule `{}`: call limit reached", rule.id));
                }
                Effect::Ask => ask = ask.or(Some(rule)),
                Effect::Allow => allow = allow.or(Some(rule)),
            }
        }
        let key = || ApprovalKey::of_canonical(&canonical);
        let permit = |rule: &Rule| {
            Decision::Allow(Permit { call: call.clone(), rule: rule.id.clone(), canonical: canonical.clone() })
        };
        match (ask, allow, approval) {
            (Some(rule), _, None) => Decision::Ask {
                rule: rule.id.clone(),
                reason: format!("rule `{}` asks for approval of this call", rule.id),
                approval_key: key(),
            },
            (Some(rule), _, Some(a)) if a.key == key() => permit(rule),
            (_, _, Some(a)) if a.key != key() => {
                deny("approval-mismatch", "the approval was granted for a different call".into())
            }
            (None, Some(rule), _) => permit(rule),
            _ => deny("default-deny", format!("no rule allows this call of `{}`", call.tool)),
        }
    }
}
