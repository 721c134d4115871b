// The intended use compiles, so the fail cases cannot pass because everything broke.
use std::time::Duration;

use serde_json::json;
use stockade_policy::allow::{ArgType, Context, Decision, Effect, Ledger, Policy, Registry, Rule, Source, ToolCall, ToolPattern, ToolSpec};
use stockade_policy::mark::{Provenance, Untrusted, mark};

fn main() {
    let registry = Registry::new().with(ToolSpec::new("echo").arg("text", ArgType::String, true));
    let policy = Policy::new(registry, vec![Rule::new("echo-ok", ToolPattern::parse("echo"), Effect::Allow)], None).unwrap();
    let mut ledger = Ledger::new();
    let call = ToolCall::new("echo").arg("text", json!("hi"), Source::User);
    let permit = match policy.authorize(&call, &Context::new(&ledger, Duration::ZERO)) {
        Decision::Allow(p) => p,
        other => panic!("{other:?}"),
    };
    assert!(permit.covers(&call));
    ledger.record(&permit, Duration::ZERO);
    let marked = mark(&Untrusted::new(String::from("<b>"), Provenance::tool("echo", "c1"))).unwrap();
    assert!(marked.to_string().contains("&lt;b&gt;"));
}
