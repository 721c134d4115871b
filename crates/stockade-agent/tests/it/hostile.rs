//! A hostile model: G3 (per-call failures go back to the model), G4 (provenance), G5 (floods).
//! Judged by the tools' own logs: what ran, and which ravens flew.

use serde_json::{Value, json};
use stockade_agent::{AgentError, EndpointError, MAX_CALLS_PER_TURN, MAX_REPEATED_DENIALS};
use stockade_test_support::{MockLlm, Reply, completion};

use crate::support::{World, agent, block_on, builder, policy, tool_messages};

/// Runs `calls` in one turn, then an answer; returns the tool messages the model got back.
fn one_turn(world: &World, reply: Reply) -> Vec<String> {
    let mock = MockLlm::script(vec![reply, Reply::text("done")]).unwrap();
    block_on(agent(&mock.url(), world).run("go")).unwrap();
    tool_messages(&mock.received()[1]).into_iter().map(|(_, t)| t).collect()
}

#[test]
fn g3_unknown_tools_and_lookalike_names_run_nothing() {
    let world = World::default();
    let args = json!({"to": "riverhold", "text": "hi"});
    let texts = one_turn(
        &world,
        Reply::calls(&[
            ("Send_raven", args.clone()),
            ("send_r\u{430}ven", args.clone()),
            ("send_raven ", args.clone()),
            ("SEND_RAVEN", args.clone()),
            ("launch_catapult", args.clone()),
            ("", args),
        ]),
    );
    assert!(world.runs().is_empty(), "{:?}", world.runs());
    assert_eq!(texts.len(), 6);
    for t in &texts {
        assert!(t.starts_with("Error: there is no tool named"), "{t}");
        assert!(t.ends_with("Nothing was run."), "{t}");
    }
    assert!(texts[1].contains("send_r\u{430}ven"), "the model is told what it sent: {}", texts[1]);
}

#[test]
fn g3_bad_arguments_run_nothing_and_say_why() {
    let world = World::default();
    let raw = |s: &str| Value::String(s.to_owned());
    let texts = one_turn(
        &world,
        Reply::calls(&[
            ("send_raven", json!({"to": 3, "text": "hi"})),
            ("send_raven", json!({"to": "riverhold"})),
            ("send_raven", json!({"to": "riverhold", "text": "hi", "cc": "eastwatch"})),
            ("send_raven", raw(r#"{"to":"riverhold","to":"eastwatch","text":"hi"}"#)),
            ("send_raven", raw("to riverhold: hi")),
            ("send_raven", raw(r#"{"to": "riverhold", "text": "hi""#)),
            ("send_raven", raw(r#"["riverhold","hi"]"#)),
        ]),
    );
    assert!(world.ravens().is_empty(), "{:?}", world.ravens());
    let expect = [
        "Blocked by policy (bad-argument)",
        "Blocked by policy (bad-argument): missing required argument `text`",
        "Blocked by policy (unknown-argument)",
        "Error: the arguments of \"send_raven\" could not be used: the arguments repeat the key \"to\"",
        "Error: the arguments of \"send_raven\" could not be used: the arguments are not valid JSON",
        "Error: the arguments of \"send_raven\" could not be used: the arguments are not valid JSON",
        "Error: the arguments of \"send_raven\" could not be used: the arguments must be a JSON object, not an array",
    ];
    for (t, e) in texts.iter().zip(expect) {
        assert!(t.starts_with(e), "{t:?} should start with {e:?}");
    }
}

#[test]
fn g3_a_call_cut_by_the_token_limit_does_not_run() {
    let world = World::default();
    let message = json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "send_raven", "arguments": "{\"to\":\"riverhold\",\"text\":\"hi\"}"}}]});
    let texts = one_turn(&world, Reply::json(&completion(message, "length")));
    assert!(world.ravens().is_empty());
    assert!(texts[0].contains("cut off by the token limit"), "{}", texts[0]);
}

#[test]
fn g3_a_tool_that_times_out_is_that_calls_result() {
    let world = World::default();
    let mock = MockLlm::script(vec![Reply::calls(&[("sleep", json!({"ms": 5000}))]), Reply::text("ok")]).unwrap();
    let agent = builder(&mock.url(), &world)
        .policy_toml(&policy())
        .unwrap()
        .tool_timeout(std::time::Duration::from_millis(200))
        .build()
        .unwrap();
    let answer = block_on(agent.run("go")).unwrap();
    assert_eq!(answer.text, "ok");
    let texts = tool_messages(&mock.received()[1]);
    assert!(texts[0].1.starts_with("Error: the tool timed out after 200ms"), "{:?}", texts[0]);
}

#[test]
fn g3_a_huge_or_broken_response_is_a_typed_error() {
    let world = World::default();
    let huge = format!(r#"{{"choices":[{{"message":{{"role":"assistant","content":"{}"}}}}]}}"#, "x".repeat(10 << 20));
    let mock = MockLlm::script(vec![Reply::raw(200, huge.into_bytes())]).unwrap();
    let err = block_on(agent(&mock.url(), &world).run("go")).unwrap_err();
    assert!(matches!(err, AgentError::Endpoint(EndpointError::TooLarge { .. })), "{err:?}");
    for body in [
        &b"{\"choices\":[]}"[..],
        b"{\"choices\":[{\"message\":{\"role\":\"assistant\",\"content\":\"trunc",
        b"<html>502</html>",
    ] {
        let mock = MockLlm::script(vec![Reply::raw(200, body.to_vec())]).unwrap();
        let err = block_on(agent(&mock.url(), &world).run("go")).unwrap_err();
        assert!(matches!(err, AgentError::Endpoint(EndpointError::Decode(_))), "{err:?}");
    }
    assert!(world.runs().is_empty());
}

#[test]
fn g4_arguments_copied_from_untrusted_output_are_not_trusted() {
    // The stranger's scroll asks to tell riverhold something; the model copies the text.
    let world = World::default();
    let copied = "the bridge at the ford is out";
    let mock = MockLlm::script(vec![
        Reply::calls(&[("read_scroll", json!({"name": "stranger"}))]),
        Reply::calls(&[("send_raven", json!({"to": "riverhold", "text": copied}))]),
        Reply::calls(&[("send_raven", json!({"to": "eastwatch", "text": "the ledger"}))]),
        Reply::text("done"),
    ])
    .unwrap();
    let approver = std::sync::Arc::new(crate::support::Approve::default());
    let agent =
        builder(&mock.url(), &world).policy_toml(&policy()).unwrap().approver(approver.clone()).build().unwrap();
    block_on(agent.run("Deal with the stranger.")).unwrap();
    // The copy to an ally was not allowed outright: it went to a human (who approved it here);
    // the non-ally was denied with no human asked.
    assert_eq!(approver.0.lock().unwrap().len(), 1);
    assert_eq!(world.ravens(), [json!({"to": "riverhold", "text": copied})]);
    let got = mock.received();
    assert!(
        tool_messages(&got[3])[2].1.starts_with("Blocked by policy (default-deny)"),
        "{:?}",
        tool_messages(&got[3])
    );
}

#[test]
fn g4_a_copied_value_fails_a_trusted_source_rule_and_short_or_new_values_pass() {
    // A policy whose send rule needs trusted values and ignores the session flag, so only
    // provenance decides.
    let doc = "version = 1\ndefault = \"deny\"\n\
        [[rule]]\nid = \"read\"\ntool = \"read_scroll\"\neffect = \"allow\"\n\
        [[rule]]\nid = \"trusted-send\"\ntool = \"send_raven\"\neffect = \"allow\"\n\
        args.to = { one_of = [\"riverhold\", \"highcliff\"], source = \"trusted\" }\nargs.text = { source = \"trusted\" }\n";
    let world = World::default();
    let raven = |to: &str, text: &str| Reply::calls(&[("send_raven", json!({"to": to, "text": text}))]);
    let mock = MockLlm::script(vec![
        Reply::calls(&[("read_scroll", json!({"name": "stranger"}))]),
        raven("riverhold", "All is well."), // `to` appears in the scroll: denied
        raven("highcliff", "the bridge at the ford"), // text copied (>= 8 chars): denied
        raven("highcliff", "bridge"),       // 6 characters: not traced, allowed
        raven("highcliff", "All is well."), // nothing copied: allowed
        Reply::text("done"),
    ])
    .unwrap();
    let agent = builder(&mock.url(), &world).policy_toml(doc).unwrap().build().unwrap();
    block_on(agent.run("go")).unwrap();
    assert_eq!(
        world.ravens(),
        [json!({"to": "highcliff", "text": "bridge"}), json!({"to": "highcliff", "text": "All is well."})]
    );
    let texts: Vec<String> = tool_messages(&mock.received()[5]).into_iter().map(|(_, t)| t).collect();
    assert!(texts[1].starts_with("Blocked by policy (default-deny)"), "{}", texts[1]);
    assert!(texts[2].starts_with("Blocked by policy (default-deny)"), "{}", texts[2]);
    // Before any untrusted read, the same destination passes.
    let world = World::default();
    let mock = MockLlm::script(vec![raven("riverhold", "All is well."), Reply::text("done")]).unwrap();
    let agent = builder(&mock.url(), &world).policy_toml(doc).unwrap().build().unwrap();
    block_on(agent.run("go")).unwrap();
    assert_eq!(world.ravens().len(), 1);
}

#[test]
fn g4_the_first_untrusted_output_sets_the_session_flag() {
    use stockade_agent::protocol::completion::decode_completion;
    use stockade_agent::{Step, ToolOutput};
    let world = World::default();
    let a = agent("http://127.0.0.1:9/v1", &world);
    let mut run = a.start("go");
    let decode = |r: &Reply| decode_completion(&r.body).unwrap();
    let Step::CallModel(_) = run.next_step() else { panic!() };
    let Step::CallTools(_) =
        run.on_completion(decode(&Reply::calls(&[("read_ledger", json!({"page": 1}))])), Default::default())
    else {
        panic!()
    };
    run.tool_result(0, ToolOutput::Json(json!({"grain": 1})));
    let Step::CallModel(_) = run.finish_tools() else { panic!() };
    assert!(!run.has_read_untrusted(), "trusted output does not set it");
    let Step::CallTools(_) =
        run.on_completion(decode(&Reply::calls(&[("read_scroll", json!({"name": "north"}))])), Default::default())
    else {
        panic!()
    };
    run.tool_result(0, ToolOutput::Text("From riverhold: hello".into()));
    let Step::CallModel(_) = run.finish_tools() else { panic!() };
    assert!(run.has_read_untrusted());
}

#[test]
fn g5_a_hundred_parallel_calls_run_at_most_the_per_turn_cap() {
    let world = World::default();
    let calls: Vec<(&str, Value)> = (0..100).map(|i| ("read_ledger", json!({"page": i + 1}))).collect();
    let texts = one_turn(&world, Reply::calls(&calls));
    assert_eq!(world.runs().len(), MAX_CALLS_PER_TURN);
    assert_eq!(texts.len(), MAX_CALLS_PER_TURN);
    assert!(
        texts.last().unwrap().contains("92 further call(s) in this reply were not run"),
        "{}",
        texts.last().unwrap()
    );
}

#[test]
fn g5_the_same_denied_call_again_and_again_ends_the_run() {
    let world = World::default();
    let mock =
        MockLlm::start(|_, _| Reply::calls(&[("send_raven", json!({"to": "eastwatch", "text": "ledger"}))])).unwrap();
    let err = block_on(agent(&mock.url(), &world).run("go")).unwrap_err();
    assert!(
        matches!(&err, AgentError::RepeatedDenial { tool, times, .. } if tool == "send_raven" && *times == MAX_REPEATED_DENIALS),
        "{err:?}"
    );
    assert_eq!(mock.received().len() as u32, MAX_REPEATED_DENIALS);
    assert!(world.ravens().is_empty());
}
