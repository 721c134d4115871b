//! ALLOW: G6-G11, G13, G14.

use std::time::Duration;

use proptest::prelude::*;
use serde_json::{Value, json};
use static_assertions::assert_not_impl_any;
use stockade_policy::allow::{
    Approval, ArgType, Context, Decision, Effect, Gate, Ledger, Limit, Permit, Policy, Predicate, RefusalKind,
    Registry, Rule, Source, SourceReq, ToolCall, ToolPattern, ToolSpec, normalise_path,
};

assert_not_impl_any!(Permit: Clone, Default, serde::de::DeserializeOwned);
assert_not_impl_any!(Approval: Clone, Copy);

fn registry() -> Registry {
    let meta = ArgType::Object(
        [("host".to_owned(), stockade_policy::allow::ArgSpec::new(ArgType::String, true))].into_iter().collect(),
    );
    Registry::new()
        .with(ToolSpec::new("send_raven").arg("to", ArgType::String, true).arg("body", ArgType::String, false))
        .with(ToolSpec::new("read_file").arg("path", ArgType::String, true))
        .with(ToolSpec::new("fetch").arg("url", ArgType::String, true).arg("meta", meta, false))
        .with(ToolSpec::new("sleep").arg("secs", ArgType::Integer, true))
        .with(ToolSpec::new("fs_write").arg("path", ArgType::String, true))
        .with(ToolSpec::new("fs_read").arg("path", ArgType::String, true))
}

fn policy(rules: Vec<Rule>) -> Policy {
    Policy::new(registry(), rules, None).unwrap()
}

fn rule(id: &str, tool: &str, effect: Effect) -> Rule {
    Rule::new(id, ToolPattern::parse(tool), effect)
}

fn raven(to: &str) -> ToolCall {
    ToolCall::new("send_raven").arg("to", json!(to), Source::User).arg("body", json!("hi"), Source::User)
}

/// Decides `call` with an empty ledger and describes the result as `effect:rule`.
fn check(p: &Policy, call: &ToolCall) -> String {
    check_in(p, call, &Ledger::new(), false)
}

fn check_in(p: &Policy, call: &ToolCall, ledger: &Ledger, untrusted: bool) -> String {
    let ctx = Context::new(ledger, Duration::from_secs(100)).read_untrusted(untrusted);
    let d = p.authorize(call, &ctx);
    format!("{:?}:{}", d.effect(), d.rule()).to_lowercase()
}

fn allies() -> Predicate {
    Predicate::OneOf(vec![json!("riverhold"), json!("highcliff")])
}

#[test]
fn g6_default_deny_and_unknowns() {
    let p = policy(vec![rule("ravens", "send_raven", Effect::Allow).arg("to", allies())]);
    assert_eq!(check(&p, &raven("riverhold")), "allow:ravens");
    assert_eq!(check(&p, &raven("eastwatch")), "deny:default-deny");
    assert_eq!(check(&Policy::deny_all(registry()), &raven("riverhold")), "deny:default-deny");
    assert_eq!(check(&p, &ToolCall::new("launch_missiles")), "deny:unknown-tool");
    let extra = raven("riverhold").arg("cc", json!("eastwatch"), Source::User);
    assert_eq!(check(&p, &extra), "deny:unknown-argument");
    let mistyped = ToolCall::new("send_raven").arg("to", json!(["riverhold"]), Source::User);
    assert_eq!(check(&p, &mistyped), "deny:bad-argument");
    let missing = ToolCall::new("send_raven").arg("body", json!("hi"), Source::User);
    assert_eq!(check(&p, &missing), "deny:bad-argument");
    let nested_unknown = ToolCall::new("fetch").arg("url", json!("https://a.example/"), Source::User).arg(
        "meta",
        json!({"host": "a", "extra": 1}),
        Source::User,
    );
    let p = policy(vec![rule("fetch-any", "fetch", Effect::Allow)]);
    assert_eq!(check(&p, &nested_unknown), "deny:bad-argument");
    let integer = ToolCall::new("sleep").arg("secs", json!(1.5), Source::User);
    assert_eq!(check(&policy(vec![rule("s", "sleep", Effect::Allow)]), &integer), "deny:bad-argument");
}

#[test]
fn g7_deny_beats_ask_beats_allow_and_names_the_rule() {
    let allow = rule("allow-all", "send_raven", Effect::Allow);
    let ask = rule("ask-highcliff", "send_raven", Effect::Ask).arg("to", Predicate::Const(json!("highcliff")));
    let deny = rule("deny-eastwatch", "send_raven", Effect::Deny).arg("to", Predicate::Const(json!("eastwatch")));
    for rules in [vec![allow.clone(), ask.clone(), deny.clone()], vec![deny, ask, allow]] {
        let p = policy(rules);
        assert_eq!(check(&p, &raven("riverhold")), "allow:allow-all");
        assert_eq!(check(&p, &raven("highcliff")), "ask:ask-highcliff");
        assert_eq!(check(&p, &raven("eastwatch")), "deny:deny-eastwatch");
    }
    let p = policy(vec![rule("a", "send_raven", Effect::Allow), rule("b", "send_raven", Effect::Allow)]);
    assert_eq!(check(&p, &raven("x")), "allow:a");
    // Prefix rules take part in the same ordering.
    let p = policy(vec![rule("fs-ok", "fs_*", Effect::Allow), rule("no-write", "fs_write", Effect::Deny)]);
    let call = |t: &str| ToolCall::new(t).arg("path", json!("/w/a"), Source::User);
    assert_eq!(check(&p, &call("fs_read")), "allow:fs-ok");
    assert_eq!(check(&p, &call("fs_write")), "deny:no-write");
}

#[test]
fn g7_provenance_and_session_conditions() {
    let p = policy(vec![
        rule("trusted-ravens", "send_raven", Effect::Allow)
            .arg("to", allies())
            .arg("to", Predicate::Source(SourceReq::Trusted))
            .when_read_untrusted(false),
        rule("ask-after-untrusted", "send_raven", Effect::Ask).arg("to", allies()).when_read_untrusted(true),
    ]);
    let ledger = Ledger::new();
    assert_eq!(check_in(&p, &raven("riverhold"), &ledger, false), "allow:trusted-ravens");
    assert_eq!(check_in(&p, &raven("riverhold"), &ledger, true), "ask:ask-after-untrusted");
    let tainted = raven("riverhold").with_source("to", Source::Tool("read_scroll".into()));
    assert_eq!(check_in(&p, &tainted, &ledger, false), "deny:default-deny");
    let config = raven("riverhold").with_source("to", Source::Config);
    assert_eq!(check_in(&p, &config, &ledger, false), "allow:trusted-ravens");
}

#[test]
fn g9_permit_names_the_exact_call() {
    let p = policy(vec![rule("ravens", "send_raven", Effect::Allow)]);
    let call = raven("riverhold");
    let Decision::Allow(permit) = p.authorize(&call, &Context::new(&Ledger::new(), Duration::ZERO)) else {
        panic!("not allowed")
    };
    assert_eq!(permit.call(), &call);
    assert_eq!(permit.rule(), "ravens");
    assert!(permit.covers(&call));
    assert!(!permit.covers(&raven("eastwatch")));
    assert!(!permit.covers(&raven("riverhold").arg("body", json!("other"), Source::User)));
}

#[test]
fn g10_approvals_bind_to_one_exact_call_and_never_override_deny() {
    let p = policy(vec![
        rule("ask-ravens", "send_raven", Effect::Ask),
        rule("never-eastwatch", "send_raven", Effect::Deny).arg("to", Predicate::Const(json!("eastwatch"))),
    ]);
    let ledger = Ledger::new();
    let ctx = Context::new(&ledger, Duration::ZERO);
    let call = raven("riverhold");
    let Decision::Ask { approval_key, rule, .. } = p.authorize(&call, &ctx) else { panic!("expected ask") };
    assert_eq!(rule, "ask-ravens");
    // The key is the hash of the canonical call: argument order does not matter, values do.
    let reordered =
        ToolCall::new("send_raven").arg("body", json!("hi"), Source::User).arg("to", json!("riverhold"), Source::User);
    assert_eq!(stockade_policy::allow::ApprovalKey::of(&reordered), approval_key);
    assert_eq!(approval_key.to_string().len(), 64);
    let d = p.authorize_approved(&call, &ctx, Approval::grant(approval_key));
    assert_eq!(format!("{:?}:{}", d.effect(), d.rule()), "Allow:ask-ravens");
    let other = raven("highcliff");
    let d = p.authorize_approved(&other, &ctx, Approval::grant(approval_key));
    assert_eq!(d.rule(), "approval-mismatch");
    let east = raven("eastwatch");
    let Decision::Deny { .. } = p.authorize(&east, &ctx) else { panic!() };
    let d = p.authorize_approved(&east, &ctx, Approval::grant(stockade_policy::allow::ApprovalKey::of(&east)));
    assert_eq!(d.rule(), "never-eastwatch");
}

#[test]
fn g11_path_prefix_is_lexical() {
    let p =
        policy(vec![rule("ws", "read_file", Effect::Allow).arg("path", Predicate::path_prefix("/work/ws").unwrap())]);
    let read = |path: &str| check(&p, &ToolCall::new("read_file").arg("path", json!(path), Source::User));
    for ok in ["/work/ws", "/work/ws/a.txt", "/work/ws/./a/../b", "//work//ws/x", "/work/other/../ws/x"] {
        assert_eq!(read(ok), "allow:ws", "{ok}");
    }
    for bad in [
        "/work/ws/../secret",
        "/work/ws/../../etc/passwd",
        "/work/wsx/a",
        "/work/w",
        "work/ws/a",
        "../ws",
        "/..",
        "/work/ws/\0",
        "/work/ws/a/../../..",
    ] {
        assert_eq!(read(bad), "deny:default-deny", "{bad:?}");
    }
    assert_eq!(normalise_path("/a/./b/../c"), Some(vec!["a".to_owned(), "c".to_owned()]));
    assert_eq!(normalise_path("/a/../.."), None);
}

#[test]
fn g11_url_hosts_are_checked_on_the_parsed_url() {
    let p = policy(vec![
        rule("hosts", "fetch", Effect::Allow)
            .arg("url", Predicate::url_hosts(["riverhold.example", "*.highcliff.example"])),
    ]);
    let get = |url: &str| check(&p, &ToolCall::new("fetch").arg("url", json!(url), Source::User));
    for ok in [
        "https://riverhold.example/",
        "http://RIVERHOLD.example:8080/x?y",
        "https://riverhold.example./",
        "https://a.highcliff.example/",
        "https://b.a.highcliff.example/",
    ] {
        assert_eq!(get(ok), "allow:hosts", "{ok}");
    }
    for bad in [
        "https://riverhold.example.evil.test/",
        "https://riverhold.example@evil.test/",
        "https://evil.test/riverhold.example",
        "https://evil.test/?u=https://riverhold.example/",
        "https://evil.test#riverhold.example",
        "https://highcliff.example/",
        "https://xhighcliff.example/",
        "ftp://riverhold.example/",
        "file:///etc/passwd",
        "javascript:alert(1)//riverhold.example",
        "riverhold.example",
        "https://riverhold\u{2024}example/",
        "https://evil.test\\@riverhold.example/",
    ] {
        assert_eq!(get(bad), "deny:default-deny", "{bad:?}");
    }
}

#[test]
fn g11_hosts_match_names_subdomains_and_address_blocks_and_nothing_else() {
    let reg = Registry::new().with(ToolSpec::new("net.connect").arg("host", ArgType::String, true));
    let entries = ["pypi.org", "*.github.com", "192.0.2.7", "198.51.100.0/24", "2001:db8::/32"];
    let p = Policy::new(
        reg,
        vec![rule("net", "net.connect", Effect::Allow).arg("host", Predicate::hosts(entries).unwrap())],
        None,
    )
    .unwrap();
    let connect = |host: &str| check(&p, &ToolCall::new("net.connect").arg("host", json!(host), Source::Config));
    for ok in [
        "pypi.org",
        "PyPI.org.",
        "api.github.com",
        "a.b.github.com",
        "192.0.2.7",
        "198.51.100.255",
        "2001:db8::1",
        "[2001:db8:ffff::2]",
    ] {
        assert_eq!(connect(ok), "allow:net", "{ok}");
    }
    for bad in [
        "github.com",
        "xgithub.com",
        "pypi.org.evil.test",
        "evil.pypi.org",
        "192.0.2.8",
        "198.51.101.1",
        "::ffff:192.0.2.7",
        "2001:db9::1",
        "198.51.100.0.nip.io",
        "",
    ] {
        assert_eq!(connect(bad), "deny:default-deny", "{bad:?}");
    }
    for bad in ["", "*.", "a..b", "10.0.0.0/33", "x/8", "exa mple.org", "under*.org", "http://a.org"] {
        assert!(Predicate::hosts([bad]).is_err(), "{bad:?}");
    }
}

#[test]
fn g11_patterns_are_anchored_and_nested_paths_work() {
    let p = policy(vec![
        rule("digits", "read_file", Effect::Allow).arg("path", Predicate::pattern("[0-9]+").unwrap()),
        rule("meta", "fetch", Effect::Allow).arg("meta.host", Predicate::Const(json!("a"))),
    ]);
    let read = |path: &str| check(&p, &ToolCall::new("read_file").arg("path", json!(path), Source::User));
    assert_eq!(read("123"), "allow:digits");
    assert_eq!(read("123; rm -rf /"), "deny:default-deny");
    assert_eq!(read("x123"), "deny:default-deny");
    let fetch = |meta: Value| {
        check(&p, &ToolCall::new("fetch").arg("url", json!("https://x/"), Source::User).arg("meta", meta, Source::User))
    };
    assert_eq!(fetch(json!({"host": "a"})), "allow:meta");
    assert_eq!(fetch(json!({"host": "b"})), "deny:default-deny");
    assert_eq!(check(&p, &ToolCall::new("fetch").arg("url", json!("https://x/"), Source::User)), "deny:default-deny");
}

#[test]
fn g13_limits_come_from_the_callers_ledger() {
    let p = Policy::new(
        registry(),
        vec![rule("ravens", "send_raven", Effect::Allow).limit(Limit::new(2, Some(Duration::from_secs(60))))],
        Some(Limit::new(3, None)),
    )
    .unwrap();
    let mut ledger = Ledger::new();
    let mut decide = |t: u64| {
        let ctx = Context::new(&ledger, Duration::from_secs(t));
        let d = p.authorize(&raven("riverhold"), &ctx);
        let out = format!("{:?}:{}", d.effect(), d.rule());
        if let Decision::Allow(permit) = d {
            ledger.record(&permit, Duration::from_secs(t));
        }
        out
    };
    assert_eq!(decide(0), "Allow:ravens");
    assert_eq!(decide(1), "Allow:ravens");
    assert_eq!(decide(2), "Deny:ravens");
    assert_eq!(decide(61), "Allow:ravens");
    assert_eq!(decide(200), "Deny:session-limit");
}

#[test]
fn g13_ledger_memory_is_bounded() {
    let p = policy(vec![rule("ravens", "send_raven", Effect::Allow)]);
    let mut ledger = Ledger::new();
    let Decision::Allow(permit) = p.authorize(&raven("r"), &Context::new(&ledger, Duration::ZERO)) else { panic!() };
    for i in 0..10_000u64 {
        ledger.record(&permit, Duration::from_millis(i));
    }
    assert_eq!(ledger.calls("send_raven"), 10_000);
    assert_eq!(ledger.kept_times("send_raven"), stockade_policy::allow::MAX_LEDGER_WINDOW);
}

#[test]
fn g14_the_gate_counts_every_allowed_call_and_nothing_else() {
    let p = Policy::new(
        registry(),
        vec![
            rule("ravens", "send_raven", Effect::Allow).arg("to", allies()).limit(Limit::new(2, None)),
            rule("ask-reads", "read_file", Effect::Ask),
        ],
        None,
    )
    .unwrap();
    let mut gate = Gate::new(p);
    let at = Duration::from_secs(1);
    assert!(matches!(gate.decide(&raven("riverhold"), at), Decision::Allow(_)));
    assert_eq!(gate.ledger().calls("send_raven"), 1, "an allow is recorded before the permit leaves the gate");
    assert!(matches!(gate.decide(&raven("the-enemy"), at), Decision::Deny { .. }));
    let read = ToolCall::new("read_file").arg("path", json!("/x"), Source::User);
    assert!(matches!(gate.decide(&read, at), Decision::Ask { .. }));
    assert_eq!(
        (gate.ledger().calls("send_raven"), gate.ledger().calls("read_file")),
        (1, 0),
        "a deny or an ask counts nothing"
    );
    assert!(gate.decide_unattended(&raven("riverhold"), at).is_ok());
    // The limit of two is reached through the gate's own ledger.
    let limited = gate.decide_unattended(&raven("riverhold"), at).unwrap_err();
    assert_eq!((limited.kind, limited.rule.as_str()), (RefusalKind::Denied, "ravens"));
    assert_eq!(gate.decide_unattended(&read, at).unwrap_err().kind, RefusalKind::NeedsApproval);
    let mistyped = ToolCall::new("send_raven").arg("to", json!(7), Source::User);
    assert_eq!(gate.decide_unattended(&mistyped, at).unwrap_err().kind, RefusalKind::BadArguments);
    let unknown = raven("riverhold").arg("seal", json!("red"), Source::User);
    assert_eq!(gate.decide_unattended(&unknown, at).unwrap_err().kind, RefusalKind::BadArguments);
    let Decision::Ask { approval_key, .. } = gate.decide(&read, at) else { panic!("ask") };
    assert!(matches!(gate.decide_approved(&read, at, Approval::grant(approval_key)), Decision::Allow(_)));
    assert_eq!(gate.ledger().calls("read_file"), 1, "an approved call is counted too");
}

#[test]
fn g14_the_gate_applies_read_untrusted_rules_once_the_session_read_untrusted_output() {
    let p = policy(vec![
        rule("ravens", "send_raven", Effect::Allow).arg("to", allies()).when_read_untrusted(false),
        rule("ask-after-untrusted", "send_raven", Effect::Ask).arg("to", allies()).when_read_untrusted(true),
    ]);
    let mut gate = Gate::new(p);
    assert!(matches!(gate.decide(&raven("riverhold"), Duration::ZERO), Decision::Allow(_)));
    gate.set_read_untrusted();
    assert!(gate.has_read_untrusted());
    assert!(matches!(gate.decide(&raven("riverhold"), Duration::ZERO), Decision::Ask { .. }));
}

#[test]
fn authorize_is_deterministic() {
    let p = policy(vec![rule("ravens", "send_raven", Effect::Allow).arg("to", allies())]);
    let ledger = Ledger::new();
    let first: Vec<String> =
        ["riverhold", "eastwatch"].iter().map(|t| check_in(&p, &raven(t), &ledger, false)).collect();
    for _ in 0..100 {
        let again: Vec<String> =
            ["riverhold", "eastwatch"].iter().map(|t| check_in(&p, &raven(t), &ledger, false)).collect();
        assert_eq!(again, first);
    }
}

fn arb_rule(i: usize) -> impl Strategy<Value = Rule> {
    let effect = prop_oneof![Just(Effect::Allow), Just(Effect::Ask), Just(Effect::Deny)];
    let pred = prop_oneof![
        Just(None),
        Just(Some(allies())),
        Just(Some(Predicate::Const(json!("eastwatch")))),
        Just(Some(Predicate::Source(SourceReq::Trusted))),
        Just(Some(Predicate::MaxLen(5))),
    ];
    (effect, pred, proptest::option::of(any::<bool>())).prop_map(move |(effect, pred, when)| {
        let mut r = rule(&format!("r{i}"), "send_raven", effect);
        if let Some(p) = pred {
            r = r.arg("to", p);
        }
        if let Some(w) = when {
            r = r.when_read_untrusted(w);
        }
        r
    })
}

fn arb_rules() -> impl Strategy<Value = Vec<Rule>> {
    (0usize..6).prop_flat_map(|n| (0..n).map(arb_rule).collect::<Vec<_>>())
}

fn arb_call() -> impl Strategy<Value = (ToolCall, bool)> {
    let to = prop_oneof![Just("riverhold"), Just("highcliff"), Just("eastwatch"), Just("longname")];
    let src = prop_oneof![Just(Source::User), Just(Source::Config), Just(Source::Tool("read_scroll".into()))];
    (to, src, any::<bool>()).prop_map(|(to, src, untrusted)| (raven(to).with_source("to", src), untrusted))
}

proptest! {
    #[test]
    fn g8_adding_a_deny_rule_never_turns_deny_into_allow(rules in arb_rules(), extra in arb_rule(99), (call, u) in arb_call()) {
        let before = check_in(&policy(rules.clone()), &call, &Ledger::new(), u);
        let mut more = rules;
        let deny = Rule::new("extra-deny", ToolPattern::parse("send_raven"), Effect::Deny);
        let deny = if extra.effect() == Effect::Deny { extra } else { deny };
        more.push(deny);
        let after = check_in(&policy(more), &call, &Ledger::new(), u);
        if before.starts_with("deny") {
            prop_assert!(after.starts_with("deny"), "{} -> {}", before, after);
        }
        prop_assert!(!after.starts_with("allow") || before.starts_with("allow"));
    }

    #[test]
    fn g8_removing_an_allow_rule_never_turns_deny_into_allow(rules in arb_rules(), (call, u) in arb_call()) {
        let before = check_in(&policy(rules.clone()), &call, &Ledger::new(), u);
        for i in (0..rules.len()).filter(|i| rules[*i].effect() == Effect::Allow) {
            let mut fewer = rules.clone();
            fewer.remove(i);
            let after = check_in(&policy(fewer), &call, &Ledger::new(), u);
            if before.starts_with("deny") {
                prop_assert!(after.starts_with("deny"), "{} -> {}", before, after);
            }
        }
    }

    #[test]
    fn g6_arbitrary_calls_never_panic(tool in "[a-z_]{0,12}", args in proptest::collection::btree_map("[a-z]{0,6}", any::<i64>().prop_map(|n| json!(n)), 0..4)) {
        let p = policy(vec![rule("ravens", "send_raven", Effect::Allow).arg("to", allies())]);
        let call = ToolCall::from_json(tool, &Value::Object(args.into_iter().collect()), &Source::User).unwrap();
        let _ = check(&p, &call);
    }
}

/// `minimum`/`maximum` compare integers exactly: 2^53 + 1 is over a maximum of 2^53 (as
/// `f64` both are 2^53), an integer against a fractional bound is decided by its value, and
/// a bound written as an integer above 2^53 is kept as written.
#[test]
fn g7_range_bounds_compare_integers_exactly() {
    let doc = |pred: &str| {
        format!(
            "version = 1\ndefault = \"deny\"\n[[rule]]\nid = \"r\"\ntool = \"sleep\"\neffect = \"allow\"\nargs.secs = {{ {pred} }}\n"
        )
    };
    let sleep = |n: Value| ToolCall::new("sleep").arg("secs", n, Source::User);
    let cases: Vec<(&str, Value, &str)> = vec![
        ("maximum = 9007199254740992", json!(9_007_199_254_740_992_u64), "allow:r"),
        ("maximum = 9007199254740992", json!(9_007_199_254_740_993_u64), "deny:default-deny"),
        ("minimum = 9007199254740993", json!(9_007_199_254_740_992_u64), "deny:default-deny"),
        ("minimum = 9007199254740993", json!(9_007_199_254_740_993_u64), "allow:r"),
        ("maximum = 9223372036854775807", json!(u64::MAX), "deny:default-deny"),
        ("minimum = -9223372036854775808", json!(i64::MIN), "allow:r"),
        ("minimum = 0.5", json!(0), "deny:default-deny"),
        ("minimum = 0.5", json!(1), "allow:r"),
        ("maximum = 9007199254740992.0", json!(9_007_199_254_740_993_u64), "deny:default-deny"),
        ("minimum = 1, maximum = 3", json!(3), "allow:r"),
        ("minimum = 1, maximum = 3", json!(4), "deny:default-deny"),
    ];
    for (pred, n, want) in cases {
        let p = Policy::from_toml(&doc(pred), &registry()).unwrap();
        assert_eq!(check(&p, &sleep(n.clone())), want, "{pred} with {n}");
    }
}
