//! Policy documents in TOML: parsing straight into validated types, load-time checks, and
//! the examples each rule carries.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use toml::Spanned;

use super::{
    Bound, Context, Decision, Effect, Ledger, Limit, MAX_LIMIT_CALLS, MAX_RULES, Policy, Predicate, Rule, Source,
    SourceReq, ToolCall, ToolPattern,
};
use crate::allow::registry::{ArgType, Registry, ToolSpec};

/// Ids the policy engine uses for its own decisions; rules may not take them.
const BUILTIN_IDS: &[&str] = &[
    "default-deny",
    "unknown-tool",
    "unknown-argument",
    "bad-argument",
    "call-too-large",
    "session-limit",
    "approval-mismatch",
];

/// Longest rule id: 64 characters of `[a-zA-Z0-9_.-]`.
pub const MAX_RULE_ID_LEN: usize = 64;
/// Longest policy document: 1 MiB.
pub const MAX_POLICY_BYTES: usize = 1 << 20;
/// Longest limit window: one year.
const MAX_WINDOW_SECS: u64 = 366 * 24 * 60 * 60;

/// A 1-based line and column in a policy document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    /// Line, from 1.
    pub line: usize,
    /// Column in characters, from 1.
    pub column: usize,
}

/// A policy was refused at load time.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub struct PolicyError {
    /// Where in the document, if it came from one.
    pub location: Option<Location>,
    /// What was wrong (boxed: the error travels through every `?` of the loader).
    pub kind: Box<PolicyErrorKind>,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.location {
            Some(Location { line, column }) => write!(f, "line {line}, column {column}: {}", self.kind),
            None => write!(f, "{}", self.kind),
        }
    }
}

impl PolicyError {
    pub(crate) fn unlocated(kind: PolicyErrorKind) -> Self {
        Self { location: None, kind: Box::new(kind) }
    }
}

/// What was wrong with a policy.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyErrorKind {
    /// The document is not valid TOML or does not have the policy's shape.
    #[error("{0}")]
    Toml(String),
    /// The document is longer than 1 MiB.
    #[error("policy document of {0} bytes exceeds the maximum of 1 MiB")]
    TooLarge(usize),
    /// `version` is not 1.
    #[error("unsupported policy version {0}; this engine reads version 1")]
    Version(u32),
    /// `default` is not `deny`.
    #[error("`default` must be \"deny\" (got {0:?}); the engine denies by default and nothing else")]
    Default(String),
    /// Two rules share an id.
    #[error("rule id {0:?} is used twice")]
    DuplicateRule(String),
    /// A rule id is empty, too long, uses other characters, or is a built-in id.
    #[error("invalid rule id {0:?}: use 1 to 64 of [a-zA-Z0-9_.-], not a built-in id")]
    RuleId(String),
    /// More than [`MAX_RULES`] rules.
    #[error("{0} rules; the maximum is {MAX_RULES}")]
    TooManyRules(usize),
    /// A rule names a tool (or prefix) that matches no registered tool.
    #[error("rule {rule:?}: no registered tool matches {tool:?}")]
    UnknownTool {
        /// The rule.
        rule: String,
        /// The tool pattern.
        tool: String,
    },
    /// A rule names an argument the tool does not have.
    #[error("rule {rule:?}: tool {tool:?} has no argument {path:?}")]
    UnknownArgument {
        /// The rule.
        rule: String,
        /// The tool.
        tool: String,
        /// The dotted argument path.
        path: String,
    },
    /// A predicate does not fit the argument's type (e.g. `maximum` on a string).
    #[error("rule {rule:?}: `{predicate}` does not fit argument {path:?} of type {ty}")]
    Mistyped {
        /// The rule.
        rule: String,
        /// The dotted argument path.
        path: String,
        /// The predicate keyword.
        predicate: String,
        /// The argument's type.
        ty: String,
    },
    /// A predicate value is invalid (a bad regex, a relative path prefix, a NaN, ...).
    #[error("rule {rule:?}: argument {path:?}: {reason}")]
    InvalidPredicate {
        /// The rule.
        rule: String,
        /// The dotted argument path.
        path: String,
        /// What was wrong.
        reason: String,
    },
    /// A rule can never match any call.
    #[error("rule {rule:?} can never match: {reason}")]
    NeverMatches {
        /// The rule.
        rule: String,
        /// Why.
        reason: String,
    },
    /// A limit is out of range.
    #[error("invalid limit: {0}")]
    Limit(String),
    /// An example is malformed.
    #[error("rule {rule:?}: example {which}[{index}]: {reason}")]
    BadExample {
        /// The rule.
        rule: String,
        /// `allow`, `ask` or `deny`.
        which: String,
        /// Its index.
        index: usize,
        /// What was wrong.
        reason: String,
    },
    /// An example did not get the decision it declares.
    #[error("rule {rule:?}: example {which}[{index}] was decided {got:?} by {decided_by:?}: {reason}")]
    ExampleFailed {
        /// The rule.
        rule: String,
        /// `allow`, `ask` or `deny`.
        which: String,
        /// Its index.
        index: usize,
        /// The decision it got.
        got: Effect,
        /// The rule that decided.
        decided_by: String,
        /// The decision's reason.
        reason: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Doc {
    version: Option<Spanned<u32>>,
    default: Option<Spanned<String>>,
    session: Option<Spanned<LimitDoc>>,
    #[serde(default)]
    rule: Vec<Spanned<RuleDoc>>,
}

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum EffectDoc {
    Allow,
    Ask,
    Deny,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleDoc {
    id: Spanned<String>,
    tool: Spanned<String>,
    effect: EffectDoc,
    #[serde(default)]
    #[expect(dead_code, reason = "documentation for humans; accepted and ignored")]
    description: Option<String>,
    #[serde(default)]
    args: BTreeMap<Spanned<String>, PredDoc>,
    when: Option<WhenDoc>,
    limits: Option<Spanned<LimitDoc>>,
    #[serde(default)]
    examples: ExamplesDoc,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WhenDoc {
    session_read_untrusted: Option<bool>,
}

#[derive(Deserialize, Clone, Copy)]
#[serde(deny_unknown_fields)]
struct LimitDoc {
    max_calls: Option<u32>,
    per_secs: Option<u64>,
    max_bytes: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ExamplesDoc {
    #[serde(default)]
    allow: Vec<Spanned<toml::Table>>,
    #[serde(default)]
    ask: Vec<Spanned<toml::Table>>,
    #[serde(default)]
    deny: Vec<Spanned<toml::Table>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PredDoc {
    #[serde(rename = "const")]
    konst: Option<toml::Value>,
    one_of: Option<Vec<toml::Value>>,
    minimum: Option<toml::Value>,
    maximum: Option<toml::Value>,
    max_len: Option<usize>,
    pattern: Option<String>,
    path_prefix: Option<String>,
    url_hosts: Option<Vec<String>>,
    hosts: Option<Vec<String>>,
    source: Option<String>,
}

/// Maps byte offsets to line and column.
struct Lines<'a>(&'a str);

impl Lines<'_> {
    fn at(&self, offset: usize) -> Location {
        let offset = offset.min(self.0.len());
        let before = self.0.get(..offset).unwrap_or(self.0);
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        Location { line, column }
    }

    fn err<T>(&self, span: std::ops::Range<usize>, kind: PolicyErrorKind) -> Result<T, PolicyError> {
        Err(PolicyError { location: Some(self.at(span.start)), kind: Box::new(kind) })
    }
}

fn json_of(v: &toml::Value) -> Result<Value, String> {
    match v {
        toml::Value::Datetime(_) => Err("datetimes are not argument values".into()),
        toml::Value::Float(f) if !f.is_finite() => Err("non-finite numbers are not argument values".into()),
        toml::Value::Array(items) => items.iter().map(json_of).collect::<Result<_, _>>().map(Value::Array),
        toml::Value::Table(t) => {
            t.iter().map(|(k, v)| Ok((k.clone(), json_of(v)?))).collect::<Result<_, String>>().map(Value::Object)
        }
        other => serde_json::to_value(other).map_err(|e| e.to_string()),
    }
}

fn predicates(rule: &str, path: &str, doc: &PredDoc) -> Result<Vec<Predicate>, PolicyErrorKind> {
    let invalid = |reason: String| PolicyErrorKind::InvalidPredicate { rule: rule.into(), path: path.into(), reason };
    let mut out = Vec::new();
    if let Some(v) = &doc.konst {
        out.push(Predicate::Const(json_of(v).map_err(invalid)?));
    }
    if let Some(vs) = &doc.one_of {
        out.push(Predicate::OneOf(vs.iter().map(json_of).collect::<Result<_, _>>().map_err(invalid)?));
    }
    if doc.minimum.is_some() || doc.maximum.is_some() {
        // Kept as written: an integer bound stays an integer, compared exactly.
        let bound = |v: &Option<toml::Value>| match v {
            None => Ok(None),
            Some(toml::Value::Integer(i)) => Ok(Some(Bound::Int(*i))),
            Some(toml::Value::Float(f)) if !f.is_nan() => Ok(Some(Bound::Float(*f))),
            Some(_) => Err(invalid("minimum and maximum must be numbers".into())),
        };
        out.push(Predicate::Range { min: bound(&doc.minimum)?, max: bound(&doc.maximum)? });
    }
    if let Some(n) = doc.max_len {
        out.push(Predicate::MaxLen(n));
    }
    if let Some(p) = &doc.pattern {
        out.push(Predicate::pattern(p).map_err(|e| invalid(format!("invalid pattern: {e}")))?);
    }
    if let Some(p) = &doc.path_prefix {
        out.push(
            Predicate::path_prefix(p)
                .ok_or_else(|| invalid(format!("path_prefix {p:?} must be an absolute path inside /")))?,
        );
    }
    if let Some(hosts) = &doc.url_hosts {
        if hosts.iter().any(|h| h.is_empty() || h.contains(['/', ':', '@', ' '])) {
            return Err(invalid("url_hosts entries are bare host names (optionally `*.` prefixed)".into()));
        }
        out.push(Predicate::url_hosts(hosts.iter().cloned()));
    }
    if let Some(hosts) = &doc.hosts {
        out.push(Predicate::hosts(hosts.iter().map(String::as_str)).map_err(invalid)?);
    }
    if let Some(s) = &doc.source {
        let req = match s.as_str() {
            "trusted" => SourceReq::Trusted,
            "user" => SourceReq::User,
            "config" => SourceReq::Config,
            other => return Err(invalid(format!("source must be trusted, user or config, not {other:?}"))),
        };
        out.push(Predicate::Source(req));
    }
    if out.is_empty() {
        return Err(invalid("a predicate table needs at least one condition".into()));
    }
    Ok(out)
}

fn type_name(ty: &ArgType) -> String {
    match ty {
        ArgType::String => "string".into(),
        ArgType::Integer => "integer".into(),
        ArgType::Number => "number".into(),
        ArgType::Boolean => "boolean".into(),
        ArgType::Array(item) => format!("array of {}", type_name(item)),
        ArgType::Object(_) => "object".into(),
    }
}

fn predicate_name(p: &Predicate) -> &'static str {
    match p {
        Predicate::Const(_) => "const",
        Predicate::OneOf(_) => "one_of",
        Predicate::Range { .. } => "minimum/maximum",
        Predicate::MaxLen(_) => "max_len",
        Predicate::Pattern(_) => "pattern",
        Predicate::PathPrefix(_) => "path_prefix",
        Predicate::UrlHost(_) => "url_hosts",
        Predicate::Hosts(_) => "hosts",
        Predicate::Source(_) => "source",
    }
}

fn matching_tools<'r>(registry: &'r Registry, pattern: &ToolPattern) -> Vec<&'r ToolSpec> {
    registry.tools().filter(|t| pattern.matches(t.name())).collect()
}

/// The load-time checks of one argument's predicates against every tool the rule names.
fn check_arg(
    registry: &Registry,
    rule: &str,
    pattern: &ToolPattern,
    path: &[String],
    preds: &[&Predicate],
) -> Result<(), PolicyErrorKind> {
    let dotted = path.join(".");
    for tool in matching_tools(registry, pattern) {
        let Some(ty) = tool.type_at(path) else {
            return Err(PolicyErrorKind::UnknownArgument { rule: rule.into(), tool: tool.name().into(), path: dotted });
        };
        if let Some(p) = preds.iter().find(|p| !p.fits(ty)) {
            return Err(PolicyErrorKind::Mistyped {
                rule: rule.into(),
                path: dotted,
                predicate: predicate_name(p).into(),
                ty: type_name(ty),
            });
        }
    }
    let never = |reason: String| PolicyErrorKind::NeverMatches { rule: rule.into(), reason };
    if let Some(p) = preds.iter().find(|p| p.is_empty()) {
        return Err(never(format!("`{}` on {dotted:?} admits no value", predicate_name(p))));
    }
    for p in preds {
        if let Some(values) = p.candidates()
            && !values
                .iter()
                .any(|v| preds.iter().all(|q| matches!(q, Predicate::Source(_)) || q.holds(v, &Source::User)))
        {
            return Err(never(format!(
                "no value allowed by `{}` on {dotted:?} passes its other conditions",
                predicate_name(p)
            )));
        }
    }
    Ok(())
}

pub(crate) fn check_limit(l: &Limit) -> Result<(), PolicyErrorKind> {
    match (l.max_calls, l.max_bytes) {
        (None, None) => return Err(PolicyErrorKind::Limit("a limit names max_calls, max_bytes or both".into())),
        (Some(n), _) if n == 0 || n > MAX_LIMIT_CALLS => {
            return Err(PolicyErrorKind::Limit(format!("max_calls must be 1..={MAX_LIMIT_CALLS}, not {n}")));
        }
        (_, Some(0)) => return Err(PolicyErrorKind::Limit("max_bytes must be at least 1".into())),
        _ => {}
    }
    if l.per.is_some() && l.max_calls.is_none() {
        return Err(PolicyErrorKind::Limit("per_secs windows max_calls; it needs one".into()));
    }
    if let Some(per) = l.per
        && (per.is_zero() || per.as_secs() > MAX_WINDOW_SECS)
    {
        return Err(PolicyErrorKind::Limit(format!("per_secs must be 1..={MAX_WINDOW_SECS}")));
    }
    Ok(())
}

fn check_id(id: &str) -> Result<(), PolicyErrorKind> {
    let ok = (1..=MAX_RULE_ID_LEN).contains(&id.len())
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        && !BUILTIN_IDS.contains(&id);
    if ok { Ok(()) } else { Err(PolicyErrorKind::RuleId(id.into())) }
}

/// Every load-time check of one rule (used for rules built in code).
pub(crate) fn check_rule(registry: &Registry, rule: &Rule) -> Result<(), PolicyErrorKind> {
    check_id(&rule.id)?;
    check_tool(registry, &rule.id, &rule.tool)?;
    let mut by_path: BTreeMap<&[String], Vec<&Predicate>> = BTreeMap::new();
    for (path, p) in &rule.args {
        by_path.entry(path).or_default().push(p);
    }
    for (path, preds) in by_path {
        check_arg(registry, &rule.id, &rule.tool, path, &preds)?;
    }
    rule.limit.as_ref().map_or(Ok(()), check_limit)?;
    check_metered(registry, rule)
}

/// A byte budget only on a rule whose every tool is metered: nothing else counts bytes, and
/// a budget nobody enforces would be a promise the policy does not keep.
fn check_metered(registry: &Registry, rule: &Rule) -> Result<(), PolicyErrorKind> {
    if rule.limit.is_some_and(|l| l.max_bytes.is_some())
        && !matching_tools(registry, &rule.tool).iter().all(|t| t.is_metered())
    {
        return Err(PolicyErrorKind::Limit(format!(
            "rule {}: max_bytes applies only to a metered tool (net.connect), whose caller counts bytes",
            rule.id
        )));
    }
    Ok(())
}

fn check_tool(registry: &Registry, rule: &str, pattern: &ToolPattern) -> Result<(), PolicyErrorKind> {
    if matching_tools(registry, pattern).is_empty() {
        let tool = match pattern {
            ToolPattern::Exact(t) => t.clone(),
            ToolPattern::Prefix(p) => format!("{p}*"),
        };
        return Err(PolicyErrorKind::UnknownTool { rule: rule.into(), tool });
    }
    Ok(())
}

fn limit_of(doc: LimitDoc) -> Limit {
    let calls = doc.max_calls.map(|n| Limit::new(n, doc.per_secs.map(Duration::from_secs)));
    match (calls, doc.max_bytes) {
        (Some(l), Some(b)) => l.with_bytes(b),
        (Some(l), None) => l,
        (None, Some(b)) => Limit::bytes(b),
        // Checked as "names neither" (a window alone is refused there too).
        (None, None) => Limit { max_calls: None, per: doc.per_secs.map(Duration::from_secs), max_bytes: None },
    }
}

pub(crate) fn load(text: &str, registry: &Registry) -> Result<Policy, PolicyError> {
    if text.len() > MAX_POLICY_BYTES {
        return Err(PolicyError::unlocated(PolicyErrorKind::TooLarge(text.len())));
    }
    let lines = Lines(text);
    let doc: Doc = toml::from_str(text).map_err(|e| PolicyError {
        location: e.span().map(|s| lines.at(s.start)),
        kind: Box::new(PolicyErrorKind::Toml(e.message().to_owned())),
    })?;
    if let Some(v) = &doc.version
        && *v.get_ref() != 1
    {
        return lines.err(v.span(), PolicyErrorKind::Version(*v.get_ref()));
    }
    if let Some(d) = &doc.default
        && d.get_ref() != "deny"
    {
        return lines.err(d.span(), PolicyErrorKind::Default(d.get_ref().clone()));
    }
    if doc.rule.len() > MAX_RULES {
        return Err(PolicyError::unlocated(PolicyErrorKind::TooManyRules(doc.rule.len())));
    }
    let session_limit = match &doc.session {
        Some(s) => {
            let l = limit_of(*s.get_ref());
            check_limit(&l).or_else(|k| lines.err(s.span(), k))?;
            Some(l)
        }
        None => None,
    };
    let mut rules = Vec::with_capacity(doc.rule.len());
    let mut seen = std::collections::HashSet::new();
    for spanned in &doc.rule {
        let r = spanned.get_ref();
        let id = r.id.get_ref().clone();
        check_id(&id).or_else(|k| lines.err(r.id.span(), k))?;
        if !seen.insert(id.clone()) {
            return lines.err(r.id.span(), PolicyErrorKind::DuplicateRule(id));
        }
        let pattern = ToolPattern::parse(r.tool.get_ref());
        check_tool(registry, &id, &pattern).or_else(|k| lines.err(r.tool.span(), k))?;
        let effect = match r.effect {
            EffectDoc::Allow => Effect::Allow,
            EffectDoc::Ask => Effect::Ask,
            EffectDoc::Deny => Effect::Deny,
        };
        let mut rule = Rule::new(id.clone(), pattern.clone(), effect);
        for (key, pred_doc) in &r.args {
            let path: Vec<String> = key.get_ref().split('.').map(str::to_owned).collect();
            let preds = predicates(&id, key.get_ref(), pred_doc).or_else(|k| lines.err(key.span(), k))?;
            check_arg(registry, &id, &pattern, &path, &preds.iter().collect::<Vec<_>>())
                .or_else(|k| lines.err(key.span(), k))?;
            for p in preds {
                rule.args.push((path.clone(), p));
            }
        }
        if let Some(w) = r.when.as_ref().and_then(|w| w.session_read_untrusted) {
            rule = rule.when_read_untrusted(w);
        }
        if let Some(l) = &r.limits {
            let limit = limit_of(*l.get_ref());
            check_limit(&limit).or_else(|k| lines.err(l.span(), k))?;
            rule = rule.limit(limit);
            check_metered(registry, &rule).or_else(|k| lines.err(l.span(), k))?;
        }
        rules.push(rule);
    }
    let policy = Policy::new(registry.clone(), rules, session_limit)?;
    for spanned in &doc.rule {
        run_examples(&policy, spanned.get_ref(), &lines)?;
    }
    Ok(policy)
}

/// Runs one rule's examples against the whole policy, with an empty ledger.
fn run_examples(policy: &Policy, r: &RuleDoc, lines: &Lines<'_>) -> Result<(), PolicyError> {
    let rule = r.id.get_ref();
    let sets = [
        (Effect::Allow, "allow", &r.examples.allow),
        (Effect::Ask, "ask", &r.examples.ask),
        (Effect::Deny, "deny", &r.examples.deny),
    ];
    for (want, which, examples) in sets {
        for (index, ex) in examples.iter().enumerate() {
            let bad =
                |reason: String| PolicyErrorKind::BadExample { rule: rule.clone(), which: which.into(), index, reason };
            let (call, read_untrusted) =
                example_call(r.tool.get_ref(), ex.get_ref()).map_err(bad).or_else(|k| lines.err(ex.span(), k))?;
            let ledger = Ledger::new();
            let ctx = Context::new(&ledger, Duration::ZERO).read_untrusted(read_untrusted);
            let decision = policy.authorize(&call, &ctx);
            if decision.effect() != want {
                let reason = match &decision {
                    Decision::Allow(_) => "allowed".to_owned(),
                    Decision::Ask { reason, .. } | Decision::Deny { reason, .. } => reason.clone(),
                };
                return lines.err(
                    ex.span(),
                    PolicyErrorKind::ExampleFailed {
                        rule: rule.clone(),
                        which: which.into(),
                        index,
                        got: decision.effect(),
                        decided_by: decision.rule().to_owned(),
                        reason,
                    },
                );
            }
        }
    }
    Ok(())
}

/// Builds an example's call: its keys are arguments (from the user), except `_tool` (the
/// tool, required for prefix rules), `_source` (a table of argument → `user`, `config` or
/// `tool:NAME`) and `_session` (a table with `read_untrusted`).
fn example_call(tool: &str, table: &toml::Table) -> Result<(ToolCall, bool), String> {
    let tool = match table.get("_tool") {
        Some(toml::Value::String(t)) => t.clone(),
        Some(_) => return Err("_tool must be a string".into()),
        None if tool.ends_with('*') => return Err("examples of a prefix rule must name `_tool`".into()),
        None => tool.to_owned(),
    };
    let mut call = ToolCall::new(tool);
    for (k, v) in table.iter().filter(|(k, _)| !k.starts_with('_')) {
        call = call.arg(k.clone(), json_of(v)?, Source::User);
    }
    if let Some(sources) = table.get("_source") {
        let sources = sources.as_table().ok_or("_source must be a table")?;
        for (k, v) in sources {
            let s = v
                .as_str()
                .and_then(Source::parse)
                .ok_or_else(|| format!("_source.{k} must be user, config or tool:NAME"))?;
            if !call.args().contains_key(k) {
                return Err(format!("_source names {k:?}, which the example does not set"));
            }
            call = call.with_source(k, s);
        }
    }
    let mut read_untrusted = false;
    if let Some(session) = table.get("_session") {
        let session = session.as_table().ok_or("_session must be a table")?;
        for (k, v) in session {
            match (k.as_str(), v) {
                ("read_untrusted", toml::Value::Boolean(b)) => read_untrusted = *b,
                _ => return Err(format!("_session.{k} is not a session fact (read_untrusted = bool)")),
            }
        }
    }
    if let Some(k) =
        table.keys().find(|k| k.starts_with('_') && !matches!(k.as_str(), "_tool" | "_source" | "_session"))
    {
        return Err(format!("{k:?} is not an example directive (_tool, _source, _session)"));
    }
    Ok((call, read_untrusted))
}
