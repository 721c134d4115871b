#![allow(missing_docs, reason = "criterion_main generates an undocumented main")]
//! `authorize` on a 100-rule policy (target: p50 at most 2 µs), next to a hand-written
//! inline check of the same call measured in the same run.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::json;
use stockade_policy::allow::{
    ArgType, Bound, Context, Effect, Ledger, Policy, Predicate, Registry, Rule, Source, ToolCall, ToolPattern, ToolSpec,
};

fn registry() -> Registry {
    (0..20).fold(Registry::new(), |r, t| {
        r.with(
            ToolSpec::new(format!("tool_{t}"))
                .arg("to", ArgType::String, true)
                .arg("path", ArgType::String, true)
                .arg("url", ArgType::String, true)
                .arg("n", ArgType::Integer, true),
        )
    })
}

/// Rule `i` of a realistic mix: one-of sets, anchored patterns, path prefixes, URL hosts,
/// ranges, and some deny and ask rules.
fn rule(i: usize, tool: &str) -> Rule {
    let effect = match i % 10 {
        0 => Effect::Deny,
        5 => Effect::Ask,
        _ => Effect::Allow,
    };
    let r = Rule::new(format!("rule-{i}"), ToolPattern::parse(tool), effect);
    match i % 5 {
        0 => r.arg("to", Predicate::Const(json!(format!("blocked-{i}")))),
        1 => r.arg("to", Predicate::OneOf(vec![json!("riverhold"), json!("highcliff"), json!(format!("x{i}"))])),
        2 => r.arg("path", Predicate::path_prefix(&format!("/work/ws{}", i % 3)).unwrap_or(Predicate::MaxLen(9))),
        3 => r.arg("url", Predicate::url_hosts([format!("h{i}.example"), "riverhold.example".into()])),
        _ => r
            .arg(
                "n",
                Predicate::Range {
                    min: Some(Bound::Int(0)),
                    max: Some(Bound::Int(i64::try_from(i).unwrap_or(i64::MAX))),
                },
            )
            .arg("to", Predicate::pattern("[a-z]{1,16}").unwrap_or(Predicate::MaxLen(16))),
    }
}

fn policy(one_tool: bool) -> Policy {
    let rules =
        (0..100).map(|i| rule(i, &if one_tool { "tool_0".into() } else { format!("tool_{}", i % 20) })).collect();
    Policy::new(registry(), rules, None).unwrap_or_else(|e| panic!("{e}"))
}

fn call() -> ToolCall {
    ToolCall::new("tool_0")
        .arg("to", json!("riverhold"), Source::User)
        .arg("path", json!("/work/ws0/notes/today.md"), Source::User)
        .arg("url", json!("https://riverhold.example/api"), Source::User)
        .arg("n", json!(7), Source::User)
}

fn bench(c: &mut Criterion) {
    let ledger = Ledger::new();
    let ctx = Context::new(&ledger, Duration::from_secs(1));
    let call = call();
    let mut g = c.benchmark_group("authorize_100_rules");
    g.bench_function("baseline_inline_check", |b| {
        b.iter(|| {
            let c = black_box(&call);
            let to = c.args().get("to").and_then(|a| a.value().as_str());
            black_box(c.tool() == "tool_0" && matches!(to, Some("riverhold" | "highcliff")))
        });
    });
    let spread = policy(false);
    g.bench_function("authorize_5_rules_per_tool", |b| {
        b.iter(|| black_box(spread.authorize(black_box(&call), &ctx)).effect());
    });
    let dense = policy(true);
    g.bench_function("authorize_100_rules_on_one_tool", |b| {
        b.iter(|| black_box(dense.authorize(black_box(&call), &ctx)).effect());
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
