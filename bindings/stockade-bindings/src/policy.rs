//! ALLOW for a host's own agent loop: a policy over the host's tools, and one [`Gate`]
//! deciding each call (its ledger counts allowed calls for the rules' limits; once the loop
//! has read untrusted output, `when_read_untrusted` rules apply).

use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use serde_json::{Value, json};
use stockade_runtime::policy::allow::{Decision, Gate, Policy, Registry, Source, ToolCall, ToolSpec};

use crate::Refused;

/// A policy bound to one gate: what `stockade.Policy` and Node's `Policy` hold.
#[derive(Debug)]
pub struct BoundPolicy {
    gate: Mutex<Gate>,
    start: Instant,
}

impl BoundPolicy {
    /// The policy `toml` over the tools `tools` (a JSON object: tool name to the JSON Schema
    /// of its arguments; a tool whose output is untrusted has `"x-untrusted-output": true`).
    pub fn from_toml(toml: &str, tools: &Value) -> Result<Self, Refused> {
        let map = tools.as_object().ok_or_else(|| Refused::invalid("tools: an object of name to JSON Schema"))?;
        let mut registry = Registry::new();
        for (name, schema) in map {
            let mut spec = ToolSpec::from_json_schema(name.as_str(), schema)
                .map_err(|e| Refused::invalid(format!("tools.{name}: {e}")))?;
            if schema.get("x-untrusted-output").and_then(Value::as_bool) == Some(true) {
                spec = spec.untrusted_output();
            }
            registry = registry.with(spec);
        }
        let policy = Policy::from_toml(toml, &registry).map_err(|e| Refused::invalid(format!("policy: {e}")))?;
        Ok(Self { gate: Mutex::new(Gate::new(policy)), start: Instant::now() })
    }

    /// Decides one call of `tool` with `args` (a JSON object), whose arguments come from
    /// `source` (`user`, `config`, `sandbox`, or `tool:NAME` for a value derived from that
    /// tool's output). The answer: `{"effect": "allow"|"ask"|"deny", "rule", "reason"?,
    /// "permit"?: {"tool", "args", "rule"}}`. An allow is counted in the gate's ledger.
    pub fn authorize(&self, tool: &str, args: &Value, source: &str) -> Result<Value, Refused> {
        let source = match source {
            "user" => Source::User,
            "config" => Source::Config,
            "sandbox" => Source::Sandbox,
            s => match s.strip_prefix("tool:") {
                Some(t) if !t.is_empty() => Source::Tool(t.to_owned()),
                _ => return Err(Refused::invalid(format!("source {s:?}: user, config, sandbox or tool:NAME"))),
            },
        };
        let call = ToolCall::from_json(tool, args, &source)
            .ok_or_else(|| Refused::invalid("args: a JSON object of argument name to value"))?;
        let now = self.start.elapsed();
        let decision = self.gate.lock().unwrap_or_else(PoisonError::into_inner).decide(&call, now);
        Ok(match decision {
            Decision::Allow(p) => json!({
                "effect": "allow",
                "rule": p.rule(),
                "permit": {"tool": p.call().tool(), "args": p.call().args_json(), "rule": p.rule()},
            }),
            Decision::Ask { rule, reason, .. } => json!({"effect": "ask", "rule": rule, "reason": reason}),
            Decision::Deny { rule, reason } => json!({"effect": "deny", "rule": rule, "reason": reason}),
        })
    }

    /// From now on, the loop has read untrusted output (taint lasts; nothing clears it).
    pub fn set_read_untrusted(&self) {
        self.gate.lock().unwrap_or_else(PoisonError::into_inner).set_read_untrusted();
    }

    /// Whether the loop has read untrusted output.
    #[must_use]
    pub fn has_read_untrusted(&self) -> bool {
        self.gate.lock().unwrap_or_else(PoisonError::into_inner).has_read_untrusted()
    }

    /// Whether `tool`'s output is untrusted (MARK it, and call [`Self::set_read_untrusted`]).
    #[must_use]
    pub fn untrusted_output(&self, tool: &str) -> bool {
        let gate = self.gate.lock().unwrap_or_else(PoisonError::into_inner);
        gate.policy().registry().get(tool).is_some_and(ToolSpec::has_untrusted_output)
    }
}
