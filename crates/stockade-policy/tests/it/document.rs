//! Policy documents: G12.

use std::time::Duration;

use serde_json::json;
use stockade_policy::allow::{
    ArgType, Context, Decision, Ledger, Location, Policy, PolicyError, PolicyErrorKind, Registry, Source, ToolCall,
    ToolSpec,
};

const STEWARD: &str = include_str!("../../policies/steward.toml");

fn steward_registry() -> Registry {
    Registry::new()
        .with(ToolSpec::new("read_scroll").arg("name", ArgType::String, true).untrusted_output())
        .with(ToolSpec::new("read_ledger").arg("page", ArgType::Integer, true))
        .with(ToolSpec::new("send_raven").arg("to", ArgType::String, true).arg("text", ArgType::String, true))
        .with(ToolSpec::new("run_code").arg("language", ArgType::String, true).arg("code", ArgType::String, true).arg(
            "stdin",
            ArgType::String,
            false,
        ))
}

/// Loads `doc` (a steward-registry policy) and renders the error, or "ok".
fn check(doc: &str) -> String {
    match Policy::from_toml(doc, &steward_registry()) {
        Ok(_) => "ok".to_owned(),
        Err(e) => e.to_string(),
    }
}

fn rule(body: &str) -> String {
    format!("version = 1\ndefault = \"deny\"\n\n[[rule]]\nid = \"r\"\n{body}\n")
}

#[test]
fn g12_the_steward_policy_loads_and_decides() {
    let policy = Policy::from_toml(STEWARD, &steward_registry()).unwrap();
    let ledger = Ledger::new();
    let decide = |call: &ToolCall, untrusted: bool| {
        let d = policy.authorize(call, &Context::new(&ledger, Duration::ZERO).read_untrusted(untrusted));
        format!("{:?}:{}", d.effect(), d.rule())
    };
    let raven =
        |to: &str| ToolCall::new("send_raven").arg("to", json!(to), Source::User).arg("text", json!("x"), Source::User);
    assert_eq!(decide(&raven("riverhold"), false), "Allow:ravens-to-allies");
    assert_eq!(decide(&raven("eastwatch"), false), "Deny:default-deny");
    assert_eq!(decide(&raven("highcliff"), true), "Ask:ask-after-untrusted");
    assert_eq!(decide(&raven("eastwatch"), true), "Deny:default-deny");
    let ledger_read = ToolCall::new("read_ledger").arg("page", json!(3), Source::User);
    assert_eq!(decide(&ledger_read, true), "Allow:read-ledger");
    let scroll = ToolCall::new("read_scroll").arg("name", json!("a/../../b"), Source::User);
    assert_eq!(decide(&scroll, false), "Deny:default-deny");
    assert!(policy.registry().get("read_scroll").unwrap().has_untrusted_output());
    let Decision::Ask { approval_key, .. } =
        policy.authorize(&raven("riverhold"), &Context::new(&ledger, Duration::ZERO).read_untrusted(true))
    else {
        panic!()
    };
    assert_eq!(approval_key.to_string().len(), 64);
}

#[test]
fn g12_errors_name_line_and_column() {
    let cases = [
        (rule("tool = \"send_raven\"\neffect = \"allow\"\nargs.to = { pattern = \"(\" }"), "line 8, column 6: rule \"r\": argument \"to\": invalid pattern"),
        (rule("tool = \"launch\"\neffect = \"allow\""), "line 6, column 8: rule \"r\": no registered tool matches \"launch\""),
        (rule("tool = \"send*\"\neffect = \"allow\""), "ok"),
        (rule("tool = \"x*\"\neffect = \"allow\""), "line 6, column 8: rule \"r\": no registered tool matches \"x*\""),
        (rule("tool = \"send_raven\"\neffect = \"allow\"\nargs.cc = { max_len = 3 }"), "line 8, column 6: rule \"r\": tool \"send_raven\" has no argument \"cc\""),
        (rule("tool = \"send_raven\"\neffect = \"allow\"\nargs.to = { maximum = 3 }"), "line 8, column 6: rule \"r\": `minimum/maximum` does not fit argument \"to\" of type string"),
        (rule("tool = \"read_ledger\"\neffect = \"allow\"\nargs.page = { one_of = [\"one\"] }"), "line 8, column 6: rule \"r\": `one_of` does not fit argument \"page\" of type integer"),
        (rule("tool = \"read_ledger\"\neffect = \"allow\"\nargs.page = { minimum = 5, maximum = 1 }"), "line 8, column 6: rule \"r\" can never match: `minimum/maximum` on \"page\" admits no value"),
        (rule("tool = \"send_raven\"\neffect = \"allow\"\nargs.to = { one_of = [] }"), "line 8, column 6: rule \"r\" can never match: `one_of` on \"to\" admits no value"),
        (rule("tool = \"send_raven\"\neffect = \"allow\"\nargs.to = { one_of = [\"aa\", \"bbb\"], max_len = 1 }"), "line 8, column 6: rule \"r\" can never match: no value allowed by `one_of` on \"to\" passes its other conditions"),
        (rule("tool = \"send_raven\"\neffect = \"allow\"\nargs.to = { const = \"x\", pattern = \"y\" }"), "line 8, column 6: rule \"r\" can never match: no value allowed by `const` on \"to\" passes its other conditions"),
        (rule("tool = \"send_raven\"\neffect = \"allow\"\nargs.to = { path_prefix = \"rel\" }"), "line 8, column 6: rule \"r\": argument \"to\": path_prefix \"rel\" must be an absolute path inside /"),
        (rule("tool = \"send_raven\"\neffect = \"allow\"\nargs.to = { source = \"model\" }"), "line 8, column 6: rule \"r\": argument \"to\": source must be trusted, user or config, not \"model\""),
        (rule("tool = \"send_raven\"\neffect = \"allow\"\nargs.to = {}"), "line 8, column 6: rule \"r\": argument \"to\": a predicate table needs at least one condition"),
        (rule("tool = \"send_raven\"\neffect = \"maybe\""), "line 7, column 10: unknown variant `maybe`, expected one of `allow`, `ask`, `deny`"),
        (rule("tool = \"send_raven\"\neffect = \"allow\"\nlimits = { max_calls = 0 }"), "line 8, column 10: invalid limit: max_calls must be 1..=4096, not 0"),
        (rule("tool = \"send_raven\"\neffect = \"allow\"\nargs.to = { enum = [\"a\"] }"), "line 8, column 13: unknown field `enum`, expected one of `const`, `one_of`, `minimum`, `maximum`, `max_len`, `pattern`, `path_prefix`, `url_hosts`, `hosts`, `source`"),
        (rule("tool = \"send_raven\"\neffect = \"allow\"\nunless = true"), "line 8, column 1: unknown field `unless`, expected one of `id`, `tool`, `effect`, `description`, `args`, `when`, `limits`, `examples`"),
        ("version = 2\n".to_owned(), "line 1, column 11: unsupported policy version 2; this engine reads version 1"),
        ("default = \"allow\"\n".to_owned(), "line 1, column 11: `default` must be \"deny\" (got \"allow\"); the engine denies by default and nothing else"),
        ("[[rule]]\nid = \"default-deny\"\ntool = \"send_raven\"\neffect = \"deny\"\n".to_owned(), "line 2, column 6: invalid rule id \"default-deny\": use 1 to 64 of [a-zA-Z0-9_.-], not a built-in id"),
        ("[[rule]]\nid = \"a\"\ntool = \"send_raven\"\neffect = \"deny\"\n[[rule]]\nid = \"a\"\ntool = \"send_raven\"\neffect = \"deny\"\n".to_owned(), "line 6, column 6: rule id \"a\" is used twice"),
        ("[[rule]\n".to_owned(), "line 1, column 8: unclosed array table"),
    ];
    for (doc, want) in cases {
        let got = check(&doc);
        assert!(got.starts_with(want), "for\n{doc}\nwant {want:?}\ngot  {got:?}");
    }
}

#[test]
fn g12_examples_run_at_load() {
    let doc = rule(
        "tool = \"send_raven\"\neffect = \"allow\"\nargs.to = { one_of = [\"riverhold\"] }\nexamples.allow = [{ to = \"riverhold\", text = \"x\" }, { to = \"eastwatch\", text = \"x\" }]",
    );
    let err = Policy::from_toml(&doc, &steward_registry()).unwrap_err();
    assert_eq!(err.location, Some(Location { line: 9, column: 53 }));
    assert!(
        matches!(
            &*err.kind,
            PolicyErrorKind::ExampleFailed { which, index: 1, decided_by, .. } if which == "allow" && decided_by == "default-deny"
        ),
        "{err}"
    );
    let bad =
        rule("tool = \"send_raven\"\neffect = \"allow\"\nexamples.deny = [{ to = \"x\", text = \"x\", _sudo = true }]");
    assert!(check(&bad).contains("\"_sudo\" is not an example directive"), "{}", check(&bad));
    let bad = rule(
        "tool = \"send_raven\"\neffect = \"allow\"\nexamples.deny = [{ to = \"x\", text = \"x\", _source = { cc = \"user\" } }]",
    );
    assert!(check(&bad).contains("_source names \"cc\""), "{}", check(&bad));
    let bad = rule("tool = \"send_raven\"\neffect = \"allow\"\nexamples.allow = [{ to = \"x\", text = 3 }]");
    assert!(check(&bad).contains("was decided Deny by \"bad-argument\""), "{}", check(&bad));
    // Examples see the whole policy: a later deny rule fails an earlier rule's allow example.
    let doc = format!(
        "{}\n[[rule]]\nid = \"no\"\ntool = \"send_raven\"\neffect = \"deny\"\n",
        rule("tool = \"send_raven\"\neffect = \"allow\"\nexamples.allow = [{ to = \"x\", text = \"x\" }]")
    );
    assert!(check(&doc).contains("decided Deny by \"no\""), "{}", check(&doc));
}

#[test]
fn g12_registry_from_json_schema() {
    let spec = ToolSpec::from_json_schema(
        "send_raven",
        &json!({"type": "object", "properties": {"to": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["to"]}),
    )
    .unwrap();
    assert!(spec.args()["to"].required());
    assert!(!spec.args()["tags"].required());
    assert!(ToolSpec::from_json_schema("t", &json!({"type": "string"})).is_err());
    assert!(ToolSpec::from_json_schema("t", &json!({"type": "object", "properties": {"x": {"oneOf": []}}})).is_err());
}

#[test]
fn g12_oversized_documents_are_refused() {
    let big = "#".repeat(stockade_policy::allow::MAX_POLICY_BYTES + 1);
    let err: PolicyError = Policy::from_toml(&big, &steward_registry()).unwrap_err();
    assert!(matches!(*err.kind, PolicyErrorKind::TooLarge(_)), "{err}");
}
