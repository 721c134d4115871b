//! Chat validation: G6.

use serde_json::{Value, json};
use stockade_protocol::chat::{
    ChatError, ChatMessage, ChatRequest, ChatResponse, MAX_MESSAGES, MAX_TOOL_CALLS, MAX_TOOLS, Role, Tool, ToolCall,
    check_schema_refs,
};

fn request(messages: Vec<ChatMessage>, tools: Vec<Tool>) -> ChatRequest {
    let mut r = ChatRequest::new("m", messages);
    r.tools = tools;
    r
}

fn tool(name: &str, parameters: Value) -> Tool {
    Tool::function(name, "does a thing", parameters)
}

fn assistant_calls(n: usize) -> ChatMessage {
    let mut m = ChatMessage::text(Role::Assistant, "");
    m.tool_calls = (0..n).map(|i| ToolCall::function(format!("call_{i}"), "t", "{}")).collect();
    m
}

/// Validates `req` both as built and after a trip through its wire form.
fn check(req: ChatRequest) -> Result<(), ChatError> {
    let direct = req.validate();
    let wire = ChatRequest::parse(&serde_json::to_vec(&req).unwrap()).map(drop);
    assert_eq!(direct.is_ok(), wire.is_ok(), "{direct:?} vs {wire:?}");
    direct
}

fn refs(schema: Value) -> Result<(), ChatError> {
    check_schema_refs("t", &schema)
}

#[test]
fn g6_message_count_is_capped() {
    let msgs = |n| (0..n).map(|_| ChatMessage::text(Role::User, "hi")).collect();
    assert!(check(request(msgs(MAX_MESSAGES), vec![])).is_ok());
    assert!(matches!(check(request(msgs(MAX_MESSAGES + 1), vec![])), Err(ChatError::TooMany { what: "messages", .. })));
}

#[test]
fn g6_tool_calls_per_message_are_capped() {
    assert!(check(request(vec![assistant_calls(MAX_TOOL_CALLS)], vec![])).is_ok());
    assert!(matches!(
        check(request(vec![assistant_calls(MAX_TOOL_CALLS + 1)], vec![])),
        Err(ChatError::TooMany { .. })
    ));
}

#[test]
fn g6_tool_count_is_capped() {
    let tools = |n| (0..n).map(|i| tool(&format!("t{i}"), json!({}))).collect();
    assert!(check(request(vec![], tools(MAX_TOOLS))).is_ok());
    assert!(matches!(check(request(vec![], tools(MAX_TOOLS + 1))), Err(ChatError::TooMany { what: "tools", .. })));
}

#[test]
fn g6_tool_names_are_checked_and_unique() {
    for good in ["a", "read_file", "A-9", &"x".repeat(64)] {
        assert!(check(request(vec![], vec![tool(good, json!({}))])).is_ok(), "{good:?}");
    }
    for bad in ["", "read file", "a.b", "fn()", "ünï", &"x".repeat(65), "a\n"] {
        assert!(
            matches!(check(request(vec![], vec![tool(bad, json!({}))])), Err(ChatError::ToolName { .. })),
            "{bad:?}"
        );
    }
    let dup = request(vec![], vec![tool("t", json!({})), tool("t", json!({}))]);
    assert!(matches!(check(dup), Err(ChatError::DuplicateTool { .. })));
    let mut call = assistant_calls(1);
    call.tool_calls[0].function.name = "rm -rf".into();
    assert!(matches!(check(request(vec![call], vec![])), Err(ChatError::ToolName { .. })));
}

#[test]
fn g6_tool_call_ids_are_1_to_128_characters() {
    let with_id = |id: &str| request(vec![ChatMessage::tool_result(id, "ok")], vec![]);
    assert!(check(with_id("x")).is_ok());
    assert!(check(with_id(&"é".repeat(128))).is_ok());
    assert!(matches!(check(with_id("")), Err(ChatError::ToolCallId { len: 0, .. })));
    assert!(matches!(check(with_id(&"x".repeat(129))), Err(ChatError::ToolCallId { len: 129, .. })));
    let mut call = assistant_calls(1);
    call.tool_calls[0].id = String::new();
    assert!(matches!(check(request(vec![call], vec![])), Err(ChatError::ToolCallId { .. })));
}

#[test]
fn g6_roles_and_their_fields_are_strict() {
    let mut user_with_calls = assistant_calls(1);
    user_with_calls.role = Role::User;
    assert!(matches!(
        check(request(vec![user_with_calls], vec![])),
        Err(ChatError::Misplaced { field: "tool_calls", .. })
    ));
    let mut tool_without_id = ChatMessage::text(Role::Tool, "ok");
    tool_without_id.tool_call_id = None;
    assert!(matches!(check(request(vec![tool_without_id], vec![])), Err(ChatError::MissingToolCallId { .. })));
    let mut user_with_id = ChatMessage::text(Role::User, "hi");
    user_with_id.tool_call_id = Some("c".into());
    assert!(matches!(check(request(vec![user_with_id], vec![])), Err(ChatError::Misplaced { .. })));
    for doc in [
        r#"{"model":"m","messages":[{"role":"root","content":"x"}]}"#,
        r#"{"model":"m","messages":[{"role":"user","content":"x","extra":1}]}"#,
        r#"{"model":"m","messages":[],"functions":[]}"#,
        r#"{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":"x"}]}]}"#,
        r#"{"model":"m","messages":[],"stream":true,"stream_options":{"include_usage":true,"x":1}}"#,
    ] {
        assert!(ChatRequest::parse(doc.as_bytes()).is_err(), "accepted {doc}");
    }
    let parts = r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}"#;
    assert!(ChatRequest::parse(parts.as_bytes()).is_ok());
    let streamed = r#"{"model":"m","messages":[],"stream":true,"stream_options":{"include_usage":true}}"#;
    assert!(ChatRequest::parse(streamed.as_bytes()).is_ok());
}

#[test]
fn g6_schema_references_must_be_local_in_every_position() {
    assert!(refs(json!({"$schema": "#", "$ref": "#/$defs/a", "$defs": {"a": {"type": "string"}}})).is_ok());
    let remote = "https://attacker.example/schema.json";
    for schema in [
        json!({"$ref": remote}),
        json!({"$id": "urn:x"}),
        json!({"$dynamicRef": "other.json#meta"}),
        json!({"$ref": 7}),
        json!({"properties": {"a": {"$ref": remote}}}),
        json!({"properties": {"a": {"items": {"anyOf": [{"type": "string"}, {"$ref": remote}]}}}}),
        json!({"$defs": {"x": {"not": {"$ref": remote}}}}),
        json!({"prefixItems": [{"$ref": remote}]}),
        json!({"if": {"$ref": remote}, "then": {}, "else": {}}),
        json!({"additionalProperties": {"$ref": remote}}),
        json!({"patternProperties": {"^a": {"$ref": remote}}}),
        json!({"dependentSchemas": {"a": {"$ref": remote}}}),
        json!({"x-vendor": {"nested": {"$ref": remote}}}),
    ] {
        let err = refs(schema.clone()).expect_err(&schema.to_string());
        assert!(matches!(err, ChatError::NonLocalRef { .. }), "{schema}: {err:?}");
    }
    // `$schema` names a dialect and is never fetched: any string is accepted (and dropped
    // by `ChatRequest::parse`), anything else is refused.
    assert!(refs(json!({"$schema": "https://json-schema.org/draft/2020-12/schema"})).is_ok());
    assert!(refs(json!({"$schema": {"$ref": remote}})).is_err());
    let err = refs(json!({"properties": {"a": {"items": {"$ref": remote}}}})).unwrap_err();
    assert!(err.to_string().contains("/properties/a/items"), "{err}");
    // Data positions are not schemas: a "$ref" inside `default` or `enum` is a value.
    assert!(refs(json!({"default": {"$ref": remote}, "enum": [{"$ref": remote}], "const": {"$id": remote}})).is_ok());
    // A property *named* "$ref" is a name, and its schema is checked as a schema.
    assert!(refs(json!({"properties": {"$ref": {"type": "string"}}})).is_ok());
    assert!(refs(json!({"properties": {"$ref": {"$ref": remote}}})).is_err());
    // The same rule is applied through a request.
    let req = request(vec![], vec![tool("t", json!({"properties": {"a": {"$ref": remote}}}))]);
    assert!(matches!(check(req), Err(ChatError::NonLocalRef { .. })));
}

#[test]
fn g6_schema_walk_is_bounded() {
    let mut schema = json!({"type": "string"});
    for _ in 0..100 {
        schema = json!({"items": schema});
    }
    assert!(matches!(refs(schema), Err(ChatError::SchemaTooDeep { .. })));
}

#[test]
fn g6_a_real_response_with_tool_calls_parses() {
    let doc = json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "logprobs": null,
            "message": {"role": "assistant", "content": null, "refusal": null, "annotations": [],
                "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "read_scroll", "arguments": "{\"n\":1}"}}]}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
        "system_fingerprint": "fp"
    });
    let resp = ChatResponse::parse(doc.to_string().as_bytes()).unwrap();
    assert_eq!(resp.choices[0].message.tool_calls[0].function.name, "read_scroll");
    let mut bad = doc.clone();
    bad["choices"][0]["message"]["role"] = json!("user");
    assert!(ChatResponse::parse(bad.to_string().as_bytes()).is_err());
    let mut bad = doc;
    bad["choices"][0]["message"]["tool_calls"][0]["function"]["name"] = json!("../../etc");
    assert!(ChatResponse::parse(bad.to_string().as_bytes()).is_err());
}

fn request_fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/fixtures/requests/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn g6_real_client_requests_are_accepted() {
    for name in [
        "openai_python_text_params.json",
        "openai_reference_tools_named_choice.json",
        "openai_reference_json_schema.json",
        "llamacpp_server_no_model.json",
        "vllm_tool_history.json",
        "ollama_openai_compat.json",
        "llamacpp_required_tool_top_k.json",
        "llamacpp_tools_null.json",
        "zod_schema_dialect.json",
        "local_sampling_knobs.json",
        "reasoning_history.json",
        "vllm_tool_level_strict.json",
    ] {
        let req = ChatRequest::parse(&request_fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        // The rebuilt request validates too, and carries none of the dropped fields.
        let wire = serde_json::to_value(&req).unwrap();
        for dropped in ["store", "service_tier", "logit_bias", "prompt_cache_key", "safety_identifier", "verbosity"] {
            assert!(wire.get(dropped).is_none(), "{name}: {dropped} was sent on");
        }
        assert!(ChatRequest::parse(&serde_json::to_vec(&wire).unwrap()).is_ok(), "{name}: rebuilt");
    }
    let req = ChatRequest::parse(&request_fixture("llamacpp_server_no_model.json")).unwrap();
    assert_eq!((req.model.as_str(), req.stream), ("", Some(true)));
}

/// real-traffic: the shapes local servers' clients send are accepted and put into one form:
/// sampling knobs forwarded, `tools: null` none, `$schema` and reasoning dropped, a
/// tool-level `strict` moved into its function; a tool result named but not linked refused.
#[test]
fn g6_local_server_shapes_are_accepted_in_one_form() {
    let wire = |name: &str| serde_json::to_value(ChatRequest::parse(&request_fixture(name)).unwrap()).unwrap();
    let w = wire("llamacpp_required_tool_top_k.json");
    assert_eq!((w["top_k"].as_u64(), w["tool_choice"].as_str()), (Some(1), Some("required")));
    let w = wire("llamacpp_tools_null.json");
    assert!(w.get("tools").is_none() && w.get("tool_choice").is_none(), "{w}");
    let w = wire("zod_schema_dialect.json");
    assert!(!w.to_string().contains("$schema"), "{w}");
    assert_eq!(w["tools"][0]["function"]["parameters"]["required"], json!(["city"]));
    let w = wire("local_sampling_knobs.json");
    for (k, v) in
        [("top_k", json!(40)), ("min_p", json!(0.05)), ("typical_p", json!(1.0)), ("repeat_penalty", json!(1.1))]
    {
        assert_eq!(w[k], v, "{k}");
    }
    let w = wire("reasoning_history.json");
    assert!(!w.to_string().contains("reasoning"), "{w}");
    assert_eq!(w["messages"][1]["content"], "9.8 is greater.");
    let w = wire("vllm_tool_level_strict.json");
    assert_eq!((w["tools"][0].get("strict"), &w["tools"][0]["function"]["strict"]), (None, &json!(true)));
    let err = ChatRequest::parse(&request_fixture("ollama_tool_name_no_id.json")).unwrap_err().to_string();
    assert!(err.contains("needs a tool_call_id") && err.contains("a tool name alone cannot say"), "{err}");
    // Bounds: each knob's range, reasoning only on the assistant's turns and bounded, one
    // `strict` meaning, a `$schema` that is not a string.
    let base = |extra: &str| format!(r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}]{extra}}}"#);
    for (extra, ok) in [
        (r#","top_k":0"#, true),
        (r#","top_k":1001"#, false),
        (r#","min_p":1.5"#, false),
        (r#","typical_p":-0.1"#, false),
        (r#","repeat_penalty":10"#, true),
        (r#","repeat_penalty":11"#, false),
        (r#","tools":[{"type":"function","strict":true,"function":{"name":"t","strict":false}}]"#, false),
        (r#","tools":[{"type":"function","function":{"name":"t","parameters":{"$schema":7}}}]"#, false),
    ] {
        assert_eq!(ChatRequest::parse(base(extra).as_bytes()).is_ok(), ok, "{extra}");
    }
    let user_reasoning = r#"{"model":"m","messages":[{"role":"user","content":"hi","reasoning_content":"x"}]}"#;
    assert!(ChatRequest::parse(user_reasoning.as_bytes()).unwrap_err().to_string().contains("reasoning_content"));
    let long = format!(
        r#"{{"model":"m","messages":[{{"role":"assistant","content":"a","reasoning":"{}"}}]}}"#,
        "x".repeat(stockade_protocol::chat::MAX_REASONING_BYTES + 1)
    );
    assert!(ChatRequest::parse(long.as_bytes()).unwrap_err().to_string().contains("bytes of reasoning"));
}

#[test]
fn g6_real_client_requests_that_reach_outside_are_refused() {
    for (name, why) in [
        ("openai_python_all_params.json", "unknown field"),
        ("litellm_metadata_user.json", "unknown field `allowed_tools`"),
        ("reject_image_url.json", "untagged enum Content"),
        ("reject_native_tool.json", "web_search_preview"),
        ("reject_remote_ref.json", "must be a local"),
        ("reject_file_part.json", "untagged enum Content"),
    ] {
        let err = ChatRequest::parse(&request_fixture(name)).expect_err(name).to_string();
        assert!(err.contains(why), "{name}: {err}");
    }
}

#[test]
fn g6_request_fields_are_bounded() {
    let base = r#"{"model":"m","messages":[]"#;
    for (extra, ok) in [
        (r#","n":8"#, true),
        (r#","n":9"#, false),
        (r#","n":0"#, false),
        (r#","stop":["a","b","c","d"]"#, true),
        (r#","stop":["a","b","c","d","e"]"#, false),
        (r#","top_logprobs":21"#, false),
        (r#","temperature":2.5"#, false),
        (r#","reasoning_effort":"maximal""#, false),
        (r#","reasoning_effort":"minimal""#, true),
        (r#","tool_choice":"sometimes""#, false),
        (r#","tool_choice":{"type":"function","function":{"name":"bad name"}}"#, false),
        (
            r#","tool_choice":{"type":"allowed_tools","allowed_tools":{"mode":"auto","tools":[{"type":"function","function":{"name":"t"}}]}}"#,
            true,
        ),
        (
            r#","tool_choice":{"type":"allowed_tools","allowed_tools":{"mode":"auto","tools":[{"type":"mcp","server_label":"x"}]}}"#,
            false,
        ),
        (r#","response_format":{"type":"json_object"}"#, true),
        (r#","response_format":{"type":"json_schema","json_schema":{"name":"x y"}}"#, false),
        (r#","metadata":{"a":"b"}"#, true),
    ] {
        let doc = format!("{base}{extra}}}");
        assert_eq!(
            ChatRequest::parse(doc.as_bytes()).is_ok(),
            ok,
            "{doc}: {:?}",
            ChatRequest::parse(doc.as_bytes()).err()
        );
    }
}
