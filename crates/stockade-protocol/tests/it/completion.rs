//! Decoding real servers' completions: G9.

use stockade_protocol::completion::{
    ArgumentsError, Completion, CompletionError, MAX_ARGUMENT_BYTES, MAX_ARGUMENT_DEPTH, MAX_DECODED_CALLS, Quirk,
    decode_completion, parse_arguments,
};

fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/fixtures/completions/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn decode(name: &str) -> Completion {
    decode_completion(&fixture(name)).unwrap()
}

fn dup_key<T>(r: &Result<T, ArgumentsError>) -> Option<&str> {
    match r {
        Err(ArgumentsError::DuplicateKey { key, .. }) => Some(key),
        _ => None,
    }
}

fn not_object<T>(r: &Result<T, ArgumentsError>) -> Option<&'static str> {
    match r {
        Err(ArgumentsError::NotObject { found, .. }) => Some(found),
        _ => None,
    }
}

fn names_and_args(c: &Completion) -> Vec<(String, String)> {
    c.calls
        .iter()
        .map(|call| {
            let args = match &call.arguments {
                Ok(m) => serde_json::Value::Object(m.clone()).to_string(),
                Err(e) => format!("ERR {e}"),
            };
            (call.name.clone(), args)
        })
        .collect()
}

#[test]
fn g9_the_reference_shape_decodes() {
    let c = decode("openai_tool_calls.json");
    assert_eq!(names_and_args(&c), [("read_scroll".to_owned(), r#"{"name":"north"}"#.to_owned())]);
    assert_eq!(c.calls[0].provider_id.as_deref(), Some("call_1"));
    assert_eq!(c.text, None);
    assert_eq!(c.quirks, [Quirk::ContentNull]);
    assert_eq!(c.usage.unwrap().total_tokens, 92);
}

#[test]
fn g9_arguments_as_an_object_are_accepted() {
    let c = decode("llamacpp_arguments_object.json");
    assert_eq!(names_and_args(&c), [("read_scroll".to_owned(), r#"{"name":"north"}"#.to_owned())]);
    assert!(c.quirks.contains(&Quirk::ArgumentsAsObject));
    assert_eq!(c.text.as_deref(), Some(""));
}

#[test]
fn g9_constant_and_missing_ids_are_recorded_not_trusted() {
    let c = decode("llamacpp_constant_ids.json");
    assert_eq!(c.calls.len(), 2);
    assert!(c.quirks.contains(&Quirk::DuplicateCallId));
    let c = decode("ollama_missing_ids_stop.json");
    assert_eq!(c.calls[0].provider_id, None);
    assert!(c.quirks.contains(&Quirk::MissingCallId));
    assert!(c.quirks.contains(&Quirk::FinishReasonDisagrees), "stop beside tool_calls: {:?}", c.quirks);
    assert_eq!(c.calls.len(), 1, "tool calls are decided by tool_calls, not by finish_reason");
}

#[test]
fn g9_absent_content_and_text_parts_and_reasoning() {
    let c = decode("content_absent.json");
    assert!(c.quirks.contains(&Quirk::ContentMissing));
    assert_eq!(names_and_args(&c), [("read_ledger".to_owned(), r#"{"page":3}"#.to_owned())]);
    let c = decode("vllm_reasoning_parts.json");
    assert_eq!(c.text.as_deref(), Some("The answer is 42."));
    assert!(c.calls.is_empty());
    assert!(c.quirks.contains(&Quirk::ContentParts) && c.quirks.contains(&Quirk::ReasoningContent));
}

#[test]
fn g9_truncated_arguments_refuse_that_call_only() {
    let c = decode("llama_cpp_python_truncated_args.json");
    assert_eq!(c.calls.len(), 1);
    assert!(matches!(c.calls[0].arguments, Err(ArgumentsError::Syntax { .. })), "{:?}", c.calls[0].arguments);
    assert!(c.quirks.contains(&Quirk::LegacyFunctionCall));
}

#[test]
fn g9_duplicate_keys_are_refused_at_every_level() {
    let c = decode("duplicate_key_args.json");
    assert_eq!(dup_key(&c.calls[0].arguments), Some("to"));
    assert_eq!(dup_key(&parse_arguments(r#"{"a":{"b":1,"b":2}}"#)), Some("b"));
    assert_eq!(parse_arguments(r#"{"a":[{"k":1},{"k":2}]}"#).map(|m| m.len()), Ok(1), "same key in sibling objects");
    // As an object inside the body, too (not only inside an arguments string).
    let body = br#"{"choices":[{"message":{"role":"assistant","tool_calls":[{"id":"a","function":{"name":"t","arguments":{"x":1,"x":2}}}]},"finish_reason":"tool_calls"}]}"#;
    let c = decode_completion(body).unwrap();
    assert_eq!(dup_key(&c.calls[0].arguments), Some("x"));
}

#[test]
fn g9_arguments_must_be_one_bounded_object() {
    assert_eq!(not_object(&parse_arguments("[1,2]")), Some("an array"));
    assert_eq!(not_object(&parse_arguments("\"hi\"")), Some("a string"));
    assert!(matches!(parse_arguments("{} {}"), Err(ArgumentsError::Syntax { .. })), "two documents");
    assert!(matches!(parse_arguments("not json"), Err(ArgumentsError::Syntax { .. })));
    assert_eq!(parse_arguments("").map(|m| m.len()), Ok(0), "empty means no arguments");
    let deep =
        format!("{}{}", "{\"a\":".repeat(MAX_ARGUMENT_DEPTH + 1), "1".to_owned() + &"}".repeat(MAX_ARGUMENT_DEPTH + 1));
    assert_eq!(parse_arguments(&deep), Err(ArgumentsError::TooDeep));
    let ok_deep = format!("{}1{}", "{\"a\":".repeat(MAX_ARGUMENT_DEPTH), "}".repeat(MAX_ARGUMENT_DEPTH));
    assert!(parse_arguments(&ok_deep).is_ok());
    let big = format!("{{\"a\":\"{}\"}}", "x".repeat(MAX_ARGUMENT_BYTES));
    assert!(matches!(parse_arguments(&big), Err(ArgumentsError::TooLarge { .. })));
    let body = format!(
        r#"{{"choices":[{{"message":{{"role":"assistant","tool_calls":[{{"id":"a","function":{{"name":"t","arguments":{}}}}}]}}}}]}}"#,
        serde_json::to_string(&big).unwrap()
    );
    let c = decode_completion(body.as_bytes()).unwrap();
    assert!(matches!(c.calls[0].arguments, Err(ArgumentsError::TooLarge { .. })));
    let missing =
        br#"{"choices":[{"message":{"role":"assistant","tool_calls":[{"id":"a","function":{"name":"t"}}]}}]}"#;
    assert_eq!(decode_completion(missing).unwrap().calls[0].arguments, Err(ArgumentsError::Missing));
}

#[test]
fn g9_broken_bodies_are_typed_errors() {
    assert!(matches!(decode_completion(&fixture("empty_choices.json")), Err(CompletionError::NoChoices)));
    assert!(matches!(decode_completion(b"{}"), Err(CompletionError::NoChoices)));
    assert!(matches!(
        decode_completion(&fixture("server_error.json")),
        Err(CompletionError::Server { message, .. }) if message == "the model is overloaded"
    ));
    let whole = fixture("openai_tool_calls.json");
    for cut in [1, whole.len() / 2, whole.len() - 3] {
        assert!(matches!(decode_completion(&whole[..cut]), Err(CompletionError::Json(_))), "cut at {cut}");
    }
    let user = br#"{"choices":[{"message":{"role":"user","content":"hi"}}]}"#;
    assert!(matches!(decode_completion(user), Err(CompletionError::NotAssistant { .. })));
    assert!(matches!(decode_completion(br#"{"choices":[{}]}"#), Err(CompletionError::NoMessage)));
}

#[test]
fn g9_the_number_of_calls_kept_is_bounded() {
    let calls: Vec<String> = (0..MAX_DECODED_CALLS + 36)
        .map(|i| format!(r#"{{"id":"c{i}","type":"function","function":{{"name":"t","arguments":"{{}}"}}}}"#))
        .collect();
    let body = format!(
        r#"{{"choices":[{{"message":{{"role":"assistant","tool_calls":[{}]}},"finish_reason":"tool_calls"}}]}}"#,
        calls.join(",")
    );
    let c = decode_completion(body.as_bytes()).unwrap();
    assert_eq!(c.calls.len(), MAX_DECODED_CALLS);
    assert_eq!(c.dropped_calls, 36);
}

#[test]
fn g9_lookalike_names_are_kept_verbatim_for_the_caller_to_refuse() {
    let body = r#"{"choices":[{"message":{"role":"assistant","tool_calls":[{"id":"a","function":{"name":"send_rаven","arguments":"{}"}}]}}]}"#;
    let c = decode_completion(body.as_bytes()).unwrap();
    assert_eq!(c.calls[0].name, "send_r\u{430}ven");
    assert_ne!(c.calls[0].name, "send_raven");
}
