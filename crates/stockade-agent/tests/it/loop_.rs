//! The loop's core rules: G1 (permits), G2 (marking), G5 (budgets, order), G8 (approvals).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use stockade_agent::policy::mark::{MarkMode, system_prompt};
use stockade_agent::{AgentError, RunLimits};
use stockade_test_support::{MockLlm, Reply};

use crate::support::{Approve, World, agent, block_on, builder, last_tool_text, policy, tool_messages};

#[test]
fn g1_only_calls_the_policy_allows_run() {
    let world = World::default();
    let mock = MockLlm::script(vec![
        Reply::calls(&[("send_raven", json!({"to": "riverhold", "text": "The harvest is in."}))]),
        Reply::calls(&[("send_raven", json!({"to": "eastwatch", "text": "The harvest is in."}))]),
        Reply::text("Done."),
    ])
    .unwrap();
    let answer = block_on(agent(&mock.url(), &world).run("Tell riverhold the harvest is in.")).unwrap();
    assert_eq!(answer.text, "Done.");
    assert_eq!(world.ravens(), [json!({"to": "riverhold", "text": "The harvest is in."})]);
    let got = mock.received();
    assert_eq!(got.len(), 3);
    assert_eq!(
        last_tool_text(&got),
        "Blocked by policy (default-deny): no rule allows this call of `send_raven`. Nothing was sent."
    );
}

#[test]
fn g2_untrusted_output_is_marked_and_the_system_prompt_says_so() {
    let world = World::default();
    let mock = MockLlm::script(vec![
        Reply::calls(&[("read_scroll", json!({"name": "stranger"})), ("read_ledger", json!({"page": 3}))]),
        Reply::text("Read."),
    ])
    .unwrap();
    block_on(agent(&mock.url(), &world).run("Read the stranger's scroll.")).unwrap();
    let got = mock.received();
    let system = got[0].body["messages"][0]["content"].as_str().unwrap().to_owned();
    assert!(system.starts_with("You are the steward of Fort Milonga."));
    assert!(system.ends_with(&system_prompt(MarkMode::Delimit)), "{system}");
    let tools = tool_messages(&got[1]);
    let (scroll, ledger) = (&tools[0].1, &tools[1].1);
    assert!(scroll.contains("[provenance source=\"read_scroll\""), "{scroll}");
    assert!(scroll.contains("<untrusted id=\""), "{scroll}");
    assert!(scroll.contains("&lt;b&gt;and&lt;/b&gt;"), "the scroll's tags are escaped: {scroll}");
    assert!(!scroll.contains("<b>"), "{scroll}");
    assert_eq!(ledger, &json!({"page": 3, "grain": 1200, "gold": 35}).to_string(), "trusted output is not marked");
}

#[test]
fn g2_untrusted_json_is_marked_field_by_field() {
    use stockade_agent::{Agent, Endpoint, FnTool, ToolDef, ToolOutput, Trust};
    let mock = MockLlm::script(vec![Reply::calls(&[("fetch", json!({}))]), Reply::text("ok")]).unwrap();
    let tool = FnTool::new(
        ToolDef::new("fetch", "Fetches.", json!({"type": "object", "properties": {}}), Trust::Untrusted),
        |_| ToolOutput::Json(json!({"title": "<script>x</script>", "n": 1})),
    );
    let agent = Agent::builder(Endpoint::new(&mock.url(), "m").unwrap())
        .tool(Arc::new(tool))
        .policy_toml("version = 1\ndefault = \"deny\"\n[[rule]]\nid = \"f\"\ntool = \"fetch\"\neffect = \"allow\"\n")
        .unwrap()
        .build()
        .unwrap();
    block_on(agent.run("go")).unwrap();
    let text = last_tool_text(&mock.received());
    assert!(text.contains("<untrusted id=") && text.contains("&lt;script&gt;") && !text.contains("<script>"), "{text}");
}

#[test]
fn g5_no_answer_after_max_turns() {
    let world = World::default();
    let mock = MockLlm::start(|_, _| Reply::calls(&[("read_ledger", json!({"page": 1}))])).unwrap();
    let agent = builder(&mock.url(), &world)
        .policy_toml(&policy())
        .unwrap()
        .limits(RunLimits::default().max_turns(3))
        .build()
        .unwrap();
    let err = block_on(agent.run("loop")).unwrap_err();
    assert!(matches!(err, AgentError::NoAnswer { turns: 3, .. }), "{err:?}");
    assert_eq!(err.to_string(), "no answer after 3 turns");
    assert_eq!(mock.received().len(), 3);
    assert_eq!(world.runs().len(), 3);
}

#[test]
fn g5_results_come_back_in_the_models_order_with_bounded_parallelism() {
    let world = World::default();
    let mock = MockLlm::script(vec![
        Reply::calls(&[("sleep", json!({"ms": 300})), ("sleep", json!({"ms": 150})), ("sleep", json!({"ms": 1}))]),
        Reply::text("ok"),
    ])
    .unwrap();
    let agent = builder(&mock.url(), &world).policy_toml(&policy()).unwrap().parallel_tools(3).build().unwrap();
    let t0 = Instant::now();
    block_on(agent.run("sleep")).unwrap();
    let took = t0.elapsed();
    assert_eq!(world.runs(), ["sleep 1", "sleep 150", "sleep 300"], "they ran at once, so they finished in reverse");
    assert!(took < Duration::from_millis(440), "parallel: {took:?}");
    let texts: Vec<String> = tool_messages(&mock.received()[1]).into_iter().map(|(_, t)| t).collect();
    assert_eq!(texts, ["slept 300", "slept 150", "slept 1"]);
    // One at a time when asked.
    let world = World::default();
    let mock = MockLlm::script(vec![
        Reply::calls(&[("sleep", json!({"ms": 200})), ("sleep", json!({"ms": 200}))]),
        Reply::text("ok"),
    ])
    .unwrap();
    let agent = builder(&mock.url(), &world).policy_toml(&policy()).unwrap().parallel_tools(1).build().unwrap();
    let t0 = Instant::now();
    block_on(agent.run("sleep")).unwrap();
    assert!(t0.elapsed() >= Duration::from_millis(400));
}

#[test]
fn g5_tool_call_token_and_time_budgets_end_the_run() {
    let world = World::default();
    let mock = MockLlm::start(|_, _| {
        Reply::calls(&[("read_ledger", json!({"page": 1})), ("read_ledger", json!({"page": 2}))])
    })
    .unwrap();
    let agent = builder(&mock.url(), &world)
        .policy_toml(&policy())
        .unwrap()
        .limits(RunLimits::default().max_tool_calls(3))
        .build()
        .unwrap();
    let err = block_on(agent.run("go")).unwrap_err();
    assert!(matches!(err, AgentError::ToolCallBudget { max: 3, .. }), "{err:?}");
    assert_eq!(world.runs().len(), 2, "the call over budget did not run");

    let agent = builder(&mock.url(), &world)
        .policy_toml(&policy())
        .unwrap()
        .limits(RunLimits::default().max_total_tokens(20))
        .build()
        .unwrap();
    let err = block_on(agent.run("go")).unwrap_err();
    assert!(matches!(err, AgentError::TokenBudget { used: 30, max: 20, .. }), "{err:?}");

    let slow = MockLlm::start(|_, _| Reply::text("late").delayed(Duration::from_secs(5))).unwrap();
    let agent = builder(&slow.url(), &world)
        .policy_toml(&policy())
        .unwrap()
        .deadline(Duration::from_millis(300))
        .build()
        .unwrap();
    let t0 = Instant::now();
    let err = block_on(agent.run("go")).unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    assert!(matches!(err, AgentError::Endpoint(_) | AgentError::Deadline { .. }), "{err:?}");
}

#[test]
fn g8_ask_without_an_approver_is_a_denial_that_says_why() {
    let world = World::default();
    let mock = MockLlm::script(vec![
        Reply::calls(&[("read_scroll", json!({"name": "north"}))]),
        Reply::calls(&[("send_raven", json!({"to": "riverhold", "text": "1200 measures of grain."}))]),
        Reply::text("Asked."),
    ])
    .unwrap();
    block_on(agent(&mock.url(), &world).run("Deal with the north scroll.")).unwrap();
    assert!(world.ravens().is_empty());
    assert_eq!(
        last_tool_text(&mock.received()),
        "Blocked by policy: this call needs a human's approval, and it was not given. Nothing was sent."
    );
}

#[test]
fn g8_an_approval_is_for_one_exact_call_and_is_used_up() {
    let world = World::default();
    let raven = || ("send_raven", json!({"text": "1200 measures of grain.", "to": "riverhold"}));
    let mock = MockLlm::script(vec![
        Reply::calls(&[("read_scroll", json!({"name": "north"}))]),
        Reply::calls(&[raven()]),
        Reply::calls(&[raven()]),
        Reply::text("Sent twice."),
    ])
    .unwrap();
    let approver = Arc::new(Approve::default());
    let agent =
        builder(&mock.url(), &world).policy_toml(&policy()).unwrap().approver(approver.clone()).build().unwrap();
    block_on(agent.run("Deal with the north scroll.")).unwrap();
    let asked = approver.0.lock().unwrap().clone();
    assert_eq!(asked.len(), 2, "the second identical call was asked again: {asked:?}");
    assert_eq!(
        asked[0],
        (
            "send_raven".into(),
            r#"{"text":"1200 measures of grain.","to":"riverhold"}"#.into(),
            "ask-after-untrusted".into()
        )
    );
    assert_eq!(world.ravens().len(), 2);
}
