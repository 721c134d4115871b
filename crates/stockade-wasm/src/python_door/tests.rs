#![allow(clippy::unwrap_used, reason = "tests fail loudly")]

use std::sync::Mutex;

use serde_json::{Value, json};

use super::answer;

/// How the stand-in answers a broker frame.
type Script = Box<dyn Fn(&Value) -> Result<Value, String> + Send + Sync>;

/// A broker stand-in: records each frame and answers from a script.
struct Fake {
    frames: Mutex<Vec<Value>>,
    reply: Script,
}

impl crate::HostCalls for Fake {
    fn call(
        &self,
        request: Vec<u8>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Vec<u8>, String>> + Send>> {
        let frame: Value = serde_json::from_slice(&request).unwrap();
        self.frames.lock().unwrap().push(frame.clone());
        let r = (self.reply)(&frame).map(|v| v.to_string().into_bytes());
        Box::pin(async move { r })
    }
    fn abort(&self, _reason: String) {}
}

fn fake(reply: impl Fn(&Value) -> Result<Value, String> + Send + Sync + 'static) -> Fake {
    Fake { frames: Mutex::new(Vec::new()), reply: Box::new(reply) }
}

fn ask(f: &Fake, frame: Value) -> Value {
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let mut ids = 0;
    let out = rt.block_on(answer(f, frame.to_string().as_bytes(), &mut ids)).unwrap();
    serde_json::from_slice(&out).unwrap()
}

#[test]
fn list_offers_functions_data_and_the_model_and_drops_non_identifiers() {
    let f = fake(|frame| {
        assert_eq!((&frame["type"], &frame["grant"]), (&json!("call"), &json!("stockade.list")));
        Ok(json!({"type": "reply", "id": frame["id"], "result": {
        "data": {"rows": [1, 2, 3], "not-an-identifier": 1},
        "functions": [
            {"name": "add", "params": ["a", "b"], "schema": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}},
            {"name": "model", "params": ["request"], "schema": {"type": "object"}},
            {"name": "my.tool", "params": [], "schema": {"type": "object"}, "description": "An MCP tool."},
            {"name": "a.b.c", "params": [], "schema": {"type": "object"}},
            {"name": "x__y", "params": [], "schema": {"type": "object"}},
        ]}}))
    });
    let a = ask(&f, json!({"v": 1, "id": 7, "op": "list"}));
    assert_eq!((&a["v"], &a["id"], &a["ok"]), (&json!(1), &json!(7), &json!(true)), "{a}");
    let names: Vec<&str> = a["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["add", "model", "my__tool", "rows"]);
    assert_eq!(a["tools"][0]["inputSchema"]["properties"]["a"]["type"], "integer");
    assert_eq!(a["tools"][1]["inputSchema"]["required"], json!(["request"]));
    assert!(a["tools"][2]["description"].as_str().unwrap().starts_with("An MCP tool."), "{a}");
    assert_eq!(a["tools"][3]["inputSchema"]["properties"], json!({}));
}

#[test]
fn a_call_is_one_broker_call_and_errors_keep_their_meaning() {
    let f = fake(|frame| {
        Ok(match frame["grant"].as_str().unwrap() {
            "add" => json!({"type": "reply", "id": frame["id"], "result": frame["args"]["a"].as_i64().unwrap() + 1}),
            "model" => json!({"type": "reply", "id": frame["id"], "result": {"echo": frame["args"]}}),
            _ => json!({"type": "reply", "id": frame["id"], "error": {"code": "denied", "message": "rule no-send"}}),
        })
    });
    let a = ask(&f, json!({"v": 1, "id": 1, "op": "call", "tool": "add", "args": {"a": 41}}));
    assert_eq!((&a["ok"], &a["value"]), (&json!(true), &json!(42)), "{a}");
    let d = ask(&f, json!({"v": 1, "id": 2, "op": "call", "tool": "send", "args": {}}));
    assert_eq!(
        (&d["ok"], &d["error"]["kind"], &d["error"]["message"]),
        (&json!(false), &json!("denied"), &json!("rule no-send"))
    );
    // `model(request)` passes the request itself, as the broker's model call takes it.
    let m = ask(&f, json!({"v": 1, "id": 3, "op": "call", "tool": "model", "args": {"request": {"messages": []}}}));
    assert_eq!(m["value"]["echo"], json!({"messages": []}));
    let frames = f.frames.lock().unwrap();
    assert_eq!(frames.len(), 3, "one broker call per door call: {frames:?}");
    assert_eq!(frames[0]["args"], json!({"a": 41}));
}

#[test]
fn bad_frames_are_protocol_errors_without_a_broker_call() {
    let f = fake(|_| panic!("no broker call for a bad frame"));
    for (frame, kind) in [
        (json!({"v": 2, "id": 1, "op": "list"}), "protocol"),
        (json!({"v": 1, "id": 1, "op": "batch"}), "protocol"),
        (json!({"v": 1, "id": 1, "op": "call"}), "protocol"),
        (json!({"v": 1, "id": 1, "op": "call", "tool": "add", "args": [1]}), "invalid_arguments"),
    ] {
        let a = ask(&f, frame.clone());
        assert_eq!((&a["ok"], &a["error"]["kind"]), (&json!(false), &json!(kind)), "{frame} -> {a}");
    }
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let out = rt.block_on(answer(&f, b"not json", &mut 0)).unwrap();
    let a: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!((&a["id"], &a["error"]["kind"]), (&Value::Null, &json!("protocol")));
}

#[test]
fn the_end_of_the_broker_session_ends_the_door() {
    let f = fake(|_| Err("the run has ended".into()));
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let frame = json!({"v": 1, "id": 1, "op": "call", "tool": "add", "args": {}}).to_string();
    assert!(rt.block_on(answer(&f, frame.as_bytes(), &mut 0)).is_err());
}

#[test]
fn a_door_name_for_a_dotted_grant_calls_that_grant() {
    let f = fake(|frame| Ok(json!({"type": "reply", "id": frame["id"], "result": frame["grant"]})));
    let a = ask(&f, json!({"v": 1, "id": 1, "op": "call", "tool": "desk__write_note", "args": {"text": "x"}}));
    assert_eq!(a["value"], "desk.write_note", "{a}");
    let a = ask(&f, json!({"v": 1, "id": 2, "op": "call", "tool": "add", "args": {}}));
    assert_eq!(a["value"], "add", "{a}");
}
