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

/// Argument documents at the caps: one level too deep, exactly as deep as allowed, and one
/// over the byte cap.
fn cap_documents() -> (String, String, String) {
    let deep =
        format!("{}{}", "{\"a\":".repeat(MAX_ARGUMENT_DEPTH + 1), "1".to_owned() + &"}".repeat(MAX_ARGUMENT_DEPTH + 1));
    let ok_deep = format!("{}1{}", "{\"a\":".repeat(MAX_ARGUMENT_DEPTH), "}".repeat(MAX_ARGUMENT_DEPTH));
    let big = format!("{{\"a\":\"{}\"}}", "x".repeat(MAX_ARGUMENT_BYTES));
    (deep, ok_deep, big)
}

/// The decoded arguments of the one call in a completion whose `arguments` field is the JSON
/// `args` (a string holding JSON, or JSON itself).
fn call_arguments(args: &str) -> Result<serde_json::Map<String, serde_json::Value>, ArgumentsError> {
    let body = format!(
        r#"{{"choices":[{{"message":{{"role":"assistant","tool_calls":[{{"id":"a","function":{{"name":"t","arguments":{args}}}}}]}}}}]}}"#
    );
    decode_completion(body.as_bytes()).unwrap().calls.remove(0).arguments
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
fn g9_arguments_as_an_object_keep_their_caps_and_no_key_is_special() {
    // serde_json's raw-value token is an ordinary key, first or not.
    let token = "$serde_json::private::RawValue";
    let m = call_arguments(&format!(r#"{{"{token}":"[1]","b":2}}"#)).unwrap();
    assert_eq!((m[token].as_str(), m["b"].as_u64()), (Some("[1]"), Some(2)));
    // The object form has the string form's caps, each with its own error, per call.
    assert_eq!(dup_key(&call_arguments(r#"{"a":{"k":1,"k":2}}"#)), Some("k"));
    assert_eq!(not_object(&call_arguments("[1]")), Some("an array"));
    assert_eq!(not_object(&call_arguments("7")), Some("a number"));
    assert_eq!(call_arguments("null"), Err(ArgumentsError::Missing));
    let (deep, ok_deep, big) = cap_documents();
    assert_eq!(call_arguments(&deep), Err(ArgumentsError::TooDeep));
    assert!(call_arguments(&ok_deep).is_ok());
    assert!(matches!(call_arguments(&big), Err(ArgumentsError::TooLarge { .. })));
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
    let (deep, ok_deep, big) = cap_documents();
    assert_eq!(parse_arguments(&deep), Err(ArgumentsError::TooDeep));
    assert!(parse_arguments(&ok_deep).is_ok());
    assert!(matches!(parse_arguments(&big), Err(ArgumentsError::TooLarge { .. })));
    assert!(matches!(call_arguments(&serde_json::to_string(&big).unwrap()), Err(ArgumentsError::TooLarge { .. })));
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

mod stream {
    use serde_json::{Value, json};
    use stockade_protocol::completion::{ArgumentsError, MAX_SSE_LINE_BYTES, Quirk, StreamAssembler, StreamError};

    fn sse(chunks: &[Value], done: bool) -> Vec<u8> {
        let mut out = String::new();
        for c in chunks {
            out.push_str(&format!("data: {c}\n\n"));
        }
        if done {
            out.push_str("data: [DONE]\n\n");
        }
        out.into_bytes()
    }

    fn delta(d: Value) -> Value {
        json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": d, "finish_reason": null}]})
    }

    fn finish(reason: &str) -> Value {
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]})
    }

    /// Feeds `bytes` in pieces of `step` bytes; returns the text shown and the completion.
    fn feed(bytes: &[u8], step: usize) -> (String, Result<stockade_protocol::completion::Completion, StreamError>) {
        let mut a = StreamAssembler::new();
        let mut shown = String::new();
        for piece in bytes.chunks(step) {
            match a.push(piece) {
                Ok(texts) => shown.extend(texts),
                Err(e) => return (shown, Err(e)),
            }
        }
        (shown, a.finish())
    }

    #[test]
    fn g9_streamed_text_arrives_in_pieces_and_assembles() {
        let body = sse(
            &[
                delta(json!({"role": "assistant", "content": "Hel"})),
                delta(json!({"content": "lo"})),
                finish("stop"),
                json!({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}),
            ],
            true,
        );
        for step in [1, 7, body.len()] {
            let (shown, c) = feed(&body, step);
            let c = c.unwrap();
            assert_eq!((shown.as_str(), c.text.as_deref()), ("Hello", Some("Hello")), "step {step}");
            assert_eq!(c.usage.unwrap().total_tokens, 5);
        }
        let crlf = String::from_utf8(body).unwrap().replace('\n', "\r\n");
        assert_eq!(feed(crlf.as_bytes(), 5).1.unwrap().text.as_deref(), Some("Hello"));
    }

    #[test]
    fn g9_tool_call_deltas_join_by_index() {
        let body = sse(
            &[
                delta(
                    json!({"tool_calls": [{"index": 0, "id": "a", "type": "function", "function": {"name": "read_scroll", "arguments": ""}}]}),
                ),
                delta(
                    json!({"tool_calls": [{"index": 1, "id": "b", "type": "function", "function": {"name": "read_ledger", "arguments": "{\"pa"}}]}),
                ),
                delta(json!({"tool_calls": [{"index": 0, "id": "", "function": {"arguments": "{\"name\":"}}]})),
                delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"north\"}"}}]})),
                delta(json!({"tool_calls": [{"index": 1, "function": {"arguments": "ge\": 2}"}}]})),
                finish("tool_calls"),
            ],
            true,
        );
        let c = feed(&body, 3).1.unwrap();
        let got: Vec<(String, Option<String>, String)> = c
            .calls
            .iter()
            .map(|k| (k.name.clone(), k.provider_id.clone(), Value::Object(k.arguments.clone().unwrap()).to_string()))
            .collect();
        assert_eq!(
            got,
            [
                ("read_scroll".into(), Some("a".into()), r#"{"name":"north"}"#.into()),
                ("read_ledger".into(), Some("b".into()), r#"{"page":2}"#.into())
            ]
        );
    }

    #[test]
    fn g9_a_missing_index_and_a_first_index_other_than_zero_are_tolerated() {
        let body = sse(
            &[
                delta(json!({"tool_calls": [{"id": "x", "function": {"name": "t", "arguments": "{\"a\""}}]})),
                delta(json!({"tool_calls": [{"function": {"arguments": ":1}"}}]})),
                delta(json!({"tool_calls": [{"id": "y", "function": {"name": "u", "arguments": "{}"}}]})),
                finish("tool_calls"),
            ],
            true,
        );
        let c = feed(&body, 64).1.unwrap();
        assert_eq!(c.calls.len(), 2);
        assert_eq!(Value::Object(c.calls[0].arguments.clone().unwrap()), json!({"a": 1}));
        assert!(c.quirks.contains(&Quirk::MissingDeltaIndex));
        let body = sse(
            &[
                delta(json!({"tool_calls": [{"index": 3, "id": "z", "function": {"name": "t", "arguments": "{}"}}]})),
                finish("tool_calls"),
            ],
            false,
        );
        let c = feed(&body, 64).1.unwrap();
        assert_eq!((c.calls.len(), c.calls[0].name.as_str()), (1, "t"));
    }

    #[test]
    fn g9_a_truncated_stream_or_truncated_arguments_are_refused() {
        let body = sse(&[delta(json!({"content": "half"}))], false);
        assert!(matches!(feed(&body, 64).1, Err(StreamError::Incomplete)));
        let body = sse(
            &[
                delta(
                    json!({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "t", "arguments": "{\"a\":"}}]}),
                ),
                finish("length"),
            ],
            true,
        );
        let c = feed(&body, 64).1.unwrap();
        assert!(c.truncated());
        assert!(matches!(c.calls[0].arguments, Err(ArgumentsError::Syntax { .. })));
        let mut after = sse(&[finish("stop")], true);
        after.extend_from_slice(b"data: {\"choices\":[]}\n\n");
        assert!(matches!(feed(&after, 64).1, Err(StreamError::AfterDone)));
        let err = sse(&[json!({"error": {"message": "overloaded"}})], false);
        assert!(matches!(feed(&err, 64).1, Err(StreamError::Server { .. })));
        assert!(matches!(feed(b"data: {not json\n\n", 64).1, Err(StreamError::Json(_))));
    }

    #[test]
    fn g9_an_endless_line_is_refused_before_it_is_buffered_whole() {
        let mut a = StreamAssembler::new();
        let piece = vec![b'x'; 64 << 10];
        let mut fed = 0;
        let err = loop {
            match a.push(&piece) {
                Ok(_) => fed += piece.len(),
                Err(e) => break e,
            }
            assert!(fed <= MAX_SSE_LINE_BYTES + piece.len());
        };
        assert!(matches!(err, StreamError::LineTooLong));
        assert!(fed <= MAX_SSE_LINE_BYTES);
    }
}
