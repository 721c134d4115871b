//! envd's messages in proto3's binary encoding, by a schema.
//!
//! There is one set of message types ([`super`]'s serde structs) and one schema per message
//! here, written from `spec/envd/process/process.proto` and `filesystem.proto`. A request in
//! the binary codec decodes to exactly the JSON value proto3's JSON mapping gives the same
//! message (`bytes` as base64, 64-bit integers as strings, enums by name, a
//! `google.protobuf.Timestamp` as RFC 3339), and that value then goes through the same serde
//! type, and the same refusals, as a request in the JSON codec. A response's JSON value
//! encodes back through the same schema, so both codecs answer with the same message.
//!
//! Hostile bytes: a field number the message does not have, a wire type its field does not
//! use, a truncated or over-long varint or length, a string that is not UTF-8, a group, or
//! more than [`MAX_FIELDS`] fields in one request is refused with a one-line error naming
//! the message and the field. The schemas hold no cycle, so nesting is as deep as the
//! schema and no deeper.
//!
//! No crate was added for the wire primitives: prost's are `#[doc(hidden)]` (there for its
//! derive), and they are the few lines of varints and keys below, checked against the
//! official SDK's own protobuf classes in the CLI's tests.

use base64::Engine as _;
use serde_json::{Map, Value};

use super::{parse_rfc3339, rfc3339};

/// Most fields (map entries and repeated elements included) one request may hold.
pub const MAX_FIELDS: usize = 65_536;

/// A field's type, as proto3 writes it on the wire.
#[derive(Debug, Clone, Copy)]
pub enum Ty {
    /// `string`.
    Str,
    /// `bytes` (base64 in JSON).
    Bytes,
    /// `bool`.
    Bool,
    /// `uint32`.
    U32,
    /// `sint32` (zigzag).
    S32,
    /// `int64` (a string in JSON).
    I64,
    /// An enum: its numbers and names.
    Enum(&'static [(i32, &'static str)]),
    /// A message.
    Msg(&'static Message),
    /// `google.protobuf.Timestamp` (RFC 3339 in JSON).
    Timestamp,
    /// `map<string, string>`.
    StrMap,
}

/// One field of a message.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    /// Its number.
    pub num: u32,
    /// Its JSON name (proto3's lowerCamelCase).
    pub name: &'static str,
    /// Its type.
    pub ty: Ty,
    /// `repeated`.
    pub repeated: bool,
}

/// A message's schema.
#[derive(Debug)]
pub struct Message {
    /// Its full name (`process.StartRequest`), for errors.
    pub name: &'static str,
    /// Its fields, by number.
    pub fields: &'static [Field],
}

const fn f(num: u32, name: &'static str, ty: Ty) -> Field {
    Field { num, name, ty, repeated: false }
}

const fn rep(num: u32, name: &'static str, ty: Ty) -> Field {
    Field { num, name, ty, repeated: true }
}

/// Every empty message (`ListRequest`, `UpdateResponse`, `KeepAlive`...).
pub static EMPTY: Message = Message { name: "an empty message", fields: &[] };

// ---- process.proto ----

static PTY_SIZE: Message =
    Message { name: "process.PTY.Size", fields: &[f(1, "cols", Ty::U32), f(2, "rows", Ty::U32)] };
static PTY: Message = Message { name: "process.PTY", fields: &[f(1, "size", Ty::Msg(&PTY_SIZE))] };
static PROCESS_CONFIG: Message = Message {
    name: "process.ProcessConfig",
    fields: &[f(1, "cmd", Ty::Str), rep(2, "args", Ty::Str), f(3, "envs", Ty::StrMap), f(4, "cwd", Ty::Str)],
};
static SELECTOR: Message =
    Message { name: "process.ProcessSelector", fields: &[f(1, "pid", Ty::U32), f(2, "tag", Ty::Str)] };
static INPUT: Message =
    Message { name: "process.ProcessInput", fields: &[f(1, "stdin", Ty::Bytes), f(2, "pty", Ty::Bytes)] };
static PROCESS_INFO: Message = Message {
    name: "process.ProcessInfo",
    fields: &[f(1, "config", Ty::Msg(&PROCESS_CONFIG)), f(2, "pid", Ty::U32), f(3, "tag", Ty::Str)],
};
static SIGNALS: [(i32, &str); 3] = [(0, "SIGNAL_UNSPECIFIED"), (15, "SIGNAL_SIGTERM"), (9, "SIGNAL_SIGKILL")];
static START_EVENT: Message = Message { name: "process.ProcessEvent.StartEvent", fields: &[f(1, "pid", Ty::U32)] };
static DATA_EVENT: Message = Message {
    name: "process.ProcessEvent.DataEvent",
    fields: &[f(1, "stdout", Ty::Bytes), f(2, "stderr", Ty::Bytes), f(3, "pty", Ty::Bytes)],
};
static END_EVENT: Message = Message {
    name: "process.ProcessEvent.EndEvent",
    fields: &[f(1, "exitCode", Ty::S32), f(2, "exited", Ty::Bool), f(3, "status", Ty::Str), f(4, "error", Ty::Str)],
};
static PROCESS_EVENT: Message = Message {
    name: "process.ProcessEvent",
    fields: &[
        f(1, "start", Ty::Msg(&START_EVENT)),
        f(2, "data", Ty::Msg(&DATA_EVENT)),
        f(3, "end", Ty::Msg(&END_EVENT)),
        f(4, "keepalive", Ty::Msg(&EMPTY)),
    ],
};
static STREAM_INPUT_START: Message =
    Message { name: "process.StreamInputRequest.StartEvent", fields: &[f(1, "process", Ty::Msg(&SELECTOR))] };
static STREAM_INPUT_DATA: Message =
    Message { name: "process.StreamInputRequest.DataEvent", fields: &[f(2, "input", Ty::Msg(&INPUT))] };

/// `process.StartRequest`.
pub static START_REQUEST: Message = Message {
    name: "process.StartRequest",
    fields: &[
        f(1, "process", Ty::Msg(&PROCESS_CONFIG)),
        f(2, "pty", Ty::Msg(&PTY)),
        f(3, "tag", Ty::Str),
        f(4, "stdin", Ty::Bool),
    ],
};
/// `process.StartResponse` and `process.ConnectResponse`: one event.
pub static EVENT_RESPONSE: Message =
    Message { name: "process.StartResponse", fields: &[f(1, "event", Ty::Msg(&PROCESS_EVENT))] };
/// `process.ConnectRequest` and `process.CloseStdinRequest`: one process.
pub static PROCESS_REQUEST: Message =
    Message { name: "process.ConnectRequest", fields: &[f(1, "process", Ty::Msg(&SELECTOR))] };
/// `process.ListResponse`.
pub static LIST_RESPONSE: Message =
    Message { name: "process.ListResponse", fields: &[rep(1, "processes", Ty::Msg(&PROCESS_INFO))] };
/// `process.UpdateRequest`.
pub static UPDATE_REQUEST: Message = Message {
    name: "process.UpdateRequest",
    fields: &[f(1, "process", Ty::Msg(&SELECTOR)), f(2, "pty", Ty::Msg(&PTY))],
};
/// `process.SendInputRequest`.
pub static SEND_INPUT_REQUEST: Message = Message {
    name: "process.SendInputRequest",
    fields: &[f(1, "process", Ty::Msg(&SELECTOR)), f(2, "input", Ty::Msg(&INPUT))],
};
/// `process.StreamInputRequest`.
pub static STREAM_INPUT_REQUEST: Message = Message {
    name: "process.StreamInputRequest",
    fields: &[
        f(1, "start", Ty::Msg(&STREAM_INPUT_START)),
        f(2, "data", Ty::Msg(&STREAM_INPUT_DATA)),
        f(3, "keepalive", Ty::Msg(&EMPTY)),
    ],
};
/// `process.SendSignalRequest`.
pub static SEND_SIGNAL_REQUEST: Message = Message {
    name: "process.SendSignalRequest",
    fields: &[f(1, "process", Ty::Msg(&SELECTOR)), f(2, "signal", Ty::Enum(&SIGNALS))],
};

// ---- filesystem.proto ----

static FILE_TYPES: [(i32, &str); 4] =
    [(0, "FILE_TYPE_UNSPECIFIED"), (1, "FILE_TYPE_FILE"), (2, "FILE_TYPE_DIRECTORY"), (3, "FILE_TYPE_SYMLINK")];
static ENTRY_INFO: Message = Message {
    name: "filesystem.EntryInfo",
    fields: &[
        f(1, "name", Ty::Str),
        f(2, "type", Ty::Enum(&FILE_TYPES)),
        f(3, "path", Ty::Str),
        f(4, "size", Ty::I64),
        f(5, "mode", Ty::U32),
        f(6, "permissions", Ty::Str),
        f(7, "owner", Ty::Str),
        f(8, "group", Ty::Str),
        f(9, "modifiedTime", Ty::Timestamp),
        f(10, "symlinkTarget", Ty::Str),
        f(11, "metadata", Ty::StrMap),
    ],
};
/// `filesystem.StatRequest`, `MakeDirRequest` and `RemoveRequest`: one path.
pub static PATH_REQUEST: Message = Message { name: "filesystem.StatRequest", fields: &[f(1, "path", Ty::Str)] };
/// `filesystem.MoveRequest`.
pub static MOVE_REQUEST: Message =
    Message { name: "filesystem.MoveRequest", fields: &[f(1, "source", Ty::Str), f(2, "destination", Ty::Str)] };
/// `filesystem.ListDirRequest`.
pub static LIST_DIR_REQUEST: Message =
    Message { name: "filesystem.ListDirRequest", fields: &[f(1, "path", Ty::Str), f(2, "depth", Ty::U32)] };
/// `filesystem.StatResponse`, `MakeDirResponse` and `MoveResponse`: one entry.
pub static ENTRY_RESPONSE: Message =
    Message { name: "filesystem.StatResponse", fields: &[f(1, "entry", Ty::Msg(&ENTRY_INFO))] };
/// `filesystem.ListDirResponse`.
pub static LIST_DIR_RESPONSE: Message =
    Message { name: "filesystem.ListDirResponse", fields: &[rep(1, "entries", Ty::Msg(&ENTRY_INFO))] };

static EVENT_TYPES: [(i32, &str); 6] = [
    (0, "EVENT_TYPE_UNSPECIFIED"),
    (1, "EVENT_TYPE_CREATE"),
    (2, "EVENT_TYPE_WRITE"),
    (3, "EVENT_TYPE_REMOVE"),
    (4, "EVENT_TYPE_RENAME"),
    (5, "EVENT_TYPE_CHMOD"),
];
static FILESYSTEM_EVENT: Message = Message {
    name: "filesystem.FilesystemEvent",
    fields: &[f(1, "name", Ty::Str), f(2, "type", Ty::Enum(&EVENT_TYPES)), f(3, "entry", Ty::Msg(&ENTRY_INFO))],
};
/// `filesystem.CreateWatcherRequest`, and `WatchDirRequest`, which has the same fields.
pub static CREATE_WATCHER_REQUEST: Message = Message {
    name: "filesystem.CreateWatcherRequest",
    fields: &[
        f(1, "path", Ty::Str),
        f(2, "recursive", Ty::Bool),
        f(3, "includeEntry", Ty::Bool),
        f(4, "allowNetworkMounts", Ty::Bool),
    ],
};
/// `filesystem.CreateWatcherResponse`.
pub static CREATE_WATCHER_RESPONSE: Message =
    Message { name: "filesystem.CreateWatcherResponse", fields: &[f(1, "watcherId", Ty::Str)] };
/// `filesystem.GetWatcherEventsRequest` and `RemoveWatcherRequest`: one watcher.
pub static WATCHER_REQUEST: Message =
    Message { name: "filesystem.GetWatcherEventsRequest", fields: &[f(1, "watcherId", Ty::Str)] };
/// `filesystem.WatchDirResponse`: one of the stream's start, an event, or a keepalive.
pub static WATCH_DIR_RESPONSE: Message = Message {
    name: "filesystem.WatchDirResponse",
    fields: &[
        f(1, "start", Ty::Msg(&EMPTY)),
        f(2, "filesystem", Ty::Msg(&FILESYSTEM_EVENT)),
        f(3, "keepalive", Ty::Msg(&EMPTY)),
    ],
};
/// `filesystem.GetWatcherEventsResponse`.
pub static WATCHER_EVENTS_RESPONSE: Message =
    Message { name: "filesystem.GetWatcherEventsResponse", fields: &[rep(1, "events", Ty::Msg(&FILESYSTEM_EVENT))] };

// ---- the wire ----

const VARINT: u8 = 0;
const I64_WIRE: u8 = 1;
const LEN: u8 = 2;
const I32_WIRE: u8 = 5;

/// A message that is not what its schema says, in one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ProtoError(String);

fn varint(buf: &mut &[u8], what: &str) -> Result<u64, ProtoError> {
    let mut value = 0u64;
    for i in 0..10 {
        let Some((&b, rest)) = buf.split_first() else {
            return Err(ProtoError(format!("{what}: truncated varint")));
        };
        *buf = rest;
        // The tenth byte may carry only the top bit of a u64.
        if i == 9 && b > 1 {
            return Err(ProtoError(format!("{what}: varint over 64 bits")));
        }
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(ProtoError(format!("{what}: varint over 10 bytes")))
}

fn put_varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_key(num: u32, wire: u8, out: &mut Vec<u8>) {
    put_varint((u64::from(num) << 3) | u64::from(wire), out);
}

fn put_len(num: u32, bytes: &[u8], out: &mut Vec<u8>) {
    put_key(num, LEN, out);
    put_varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

fn take<'a>(buf: &mut &'a [u8], what: &str) -> Result<&'a [u8], ProtoError> {
    let len = varint(buf, what)?;
    let len = usize::try_from(len)
        .ok()
        .filter(|l| *l <= buf.len())
        .ok_or_else(|| ProtoError(format!("{what}: a {len}-byte length with {} bytes left (truncated)", buf.len())))?;
    let (head, rest) = buf.split_at(len);
    *buf = rest;
    Ok(head)
}

const fn wire_name(w: u8) -> &'static str {
    match w {
        VARINT => "varint",
        I64_WIRE => "64-bit",
        LEN => "length-delimited",
        3 | 4 => "group",
        I32_WIRE => "32-bit",
        _ => "invalid",
    }
}

/// Decodes `bytes` as `msg` into proto3's JSON value for it.
pub fn decode(bytes: &[u8], msg: &'static Message) -> Result<Value, ProtoError> {
    let mut budget = MAX_FIELDS;
    decode_message(bytes, msg, &mut budget).map(Value::Object)
}

fn decode_message(mut buf: &[u8], msg: &'static Message, budget: &mut usize) -> Result<Map<String, Value>, ProtoError> {
    let mut out = Map::new();
    while !buf.is_empty() {
        let key = varint(&mut buf, msg.name)?;
        let (num, wire) = (key >> 3, (key & 7) as u8);
        *budget =
            budget.checked_sub(1).ok_or_else(|| ProtoError(format!("{}: more than {MAX_FIELDS} fields", msg.name)))?;
        let field =
            msg.fields.iter().find(|f| u64::from(f.num) == num).ok_or_else(|| {
                ProtoError(format!("{}: unknown field {num} ({} wire type)", msg.name, wire_name(wire)))
            })?;
        let what = format!("{}.{}", msg.name, field.name);
        let expected = match field.ty {
            Ty::Bool | Ty::U32 | Ty::S32 | Ty::I64 | Ty::Enum(_) => VARINT,
            Ty::Str | Ty::Bytes | Ty::Msg(_) | Ty::Timestamp | Ty::StrMap => LEN,
        };
        if wire != expected {
            return Err(ProtoError(format!(
                "{what}: {} wire type where {} was expected",
                wire_name(wire),
                wire_name(expected)
            )));
        }
        let value = match field.ty {
            Ty::Str => Value::String(utf8(take(&mut buf, &what)?, &what)?),
            Ty::Bytes => Value::String(base64::engine::general_purpose::STANDARD.encode(take(&mut buf, &what)?)),
            Ty::Bool => Value::Bool(varint(&mut buf, &what)? != 0),
            // proto3: a 32-bit field keeps the low 32 bits of its varint.
            Ty::U32 => Value::from(varint(&mut buf, &what)? as u32),
            Ty::S32 => {
                let z = varint(&mut buf, &what)? as u32;
                Value::from((z >> 1) as i32 ^ -((z & 1) as i32))
            }
            Ty::I64 => Value::String((varint(&mut buf, &what)? as i64).to_string()),
            Ty::Enum(names) => {
                let n = varint(&mut buf, &what)? as i32;
                names.iter().find(|(v, _)| *v == n).map_or_else(|| Value::from(n), |(_, name)| Value::from(*name))
            }
            Ty::Msg(m) => Value::Object(decode_message(take(&mut buf, &what)?, m, budget)?),
            Ty::Timestamp => {
                let ts = decode_message(take(&mut buf, &what)?, &TIMESTAMP, budget)?;
                let secs = ts.get("seconds").and_then(Value::as_str).and_then(|s| s.parse().ok()).unwrap_or(0);
                let nanos = ts.get("nanos").and_then(Value::as_u64).unwrap_or(0);
                if nanos > 999_999_999 {
                    return Err(ProtoError(format!("{what}: {nanos} nanoseconds")));
                }
                // As proto3 JSON writes it: 0, 3, 6 or 9 digits of a fraction.
                let text = rfc3339(secs);
                let whole = &text[..text.len() - 1];
                Value::String(match nanos {
                    0 => text.clone(),
                    n if n % 1_000_000 == 0 => format!("{whole}.{:03}Z", n / 1_000_000),
                    n if n % 1_000 == 0 => format!("{whole}.{:06}Z", n / 1_000),
                    n => format!("{whole}.{n:09}Z"),
                })
            }
            Ty::StrMap => {
                let entry = decode_message(take(&mut buf, &what)?, &MAP_ENTRY, budget)?;
                let text = |k: &str| entry.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
                if let Value::Object(m) = out.entry(field.name).or_insert_with(|| Value::Object(Map::new())) {
                    m.insert(text("key"), Value::String(text("value")));
                }
                continue;
            }
        };
        if field.repeated {
            if let Value::Array(a) = out.entry(field.name).or_insert_with(|| Value::Array(Vec::new())) {
                a.push(value);
            }
        } else {
            merge(&mut out, field.name, value);
        }
    }
    Ok(out)
}

/// A field seen again: a message merges into the one before, anything else replaces it.
fn merge(out: &mut Map<String, Value>, name: &str, value: Value) {
    match (out.get_mut(name), value) {
        (Some(Value::Object(old)), Value::Object(new)) => {
            for (k, v) in new {
                merge(old, &k, v);
            }
        }
        (_, value) => {
            out.insert(name.to_owned(), value);
        }
    }
}

fn utf8(bytes: &[u8], what: &str) -> Result<String, ProtoError> {
    String::from_utf8(bytes.to_vec()).map_err(|_| ProtoError(format!("{what}: a string that is not UTF-8")))
}

static TIMESTAMP: Message =
    Message { name: "google.protobuf.Timestamp", fields: &[f(1, "seconds", Ty::I64), f(2, "nanos", Ty::U32)] };
static MAP_ENTRY: Message = Message { name: "a map entry", fields: &[f(1, "key", Ty::Str), f(2, "value", Ty::Str)] };

/// Encodes proto3's JSON value for `msg` in the binary codec. A key the schema does not
/// have, or a value of the wrong shape, is an error (a response must not lose a field).
pub fn encode(value: &Value, msg: &'static Message) -> Result<Vec<u8>, ProtoError> {
    let mut out = Vec::new();
    encode_message(value, msg, &mut out)?;
    Ok(out)
}

fn encode_message(value: &Value, msg: &'static Message, out: &mut Vec<u8>) -> Result<(), ProtoError> {
    let obj = value.as_object().ok_or_else(|| ProtoError(format!("{}: not an object", msg.name)))?;
    if let Some(k) = obj.keys().find(|k| !msg.fields.iter().any(|f| f.name == k.as_str())) {
        return Err(ProtoError(format!("{}: no field {k:?}", msg.name)));
    }
    for field in msg.fields {
        let Some(v) = obj.get(field.name).filter(|v| !v.is_null()) else { continue };
        let what = || format!("{}.{}", msg.name, field.name);
        match (field.repeated, field.ty) {
            (true, _) => {
                for item in v.as_array().ok_or_else(|| ProtoError(format!("{}: not an array", what())))? {
                    encode_one(field.num, field.ty, item, out, &what)?;
                }
            }
            (false, Ty::StrMap) => {
                for (k, item) in v.as_object().ok_or_else(|| ProtoError(format!("{}: not an object", what())))? {
                    let mut entry = Vec::new();
                    put_len(1, k.as_bytes(), &mut entry);
                    let text = item.as_str().ok_or_else(|| ProtoError(format!("{}[{k:?}]: not a string", what())))?;
                    put_len(2, text.as_bytes(), &mut entry);
                    put_len(field.num, &entry, out);
                }
            }
            (false, ty) => encode_one(field.num, ty, v, out, &what)?,
        }
    }
    Ok(())
}

fn encode_one(num: u32, ty: Ty, v: &Value, out: &mut Vec<u8>, what: &dyn Fn() -> String) -> Result<(), ProtoError> {
    let bad = || ProtoError(format!("{}: {v} does not fit its type", what()));
    match ty {
        Ty::Str => put_len(num, v.as_str().ok_or_else(bad)?.as_bytes(), out),
        Ty::Bytes => {
            let raw =
                base64::engine::general_purpose::STANDARD.decode(v.as_str().ok_or_else(bad)?).map_err(|_| bad())?;
            put_len(num, &raw, out);
        }
        Ty::Bool => {
            put_key(num, VARINT, out);
            put_varint(u64::from(v.as_bool().ok_or_else(bad)?), out);
        }
        Ty::U32 => {
            let n = v.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(bad)?;
            put_key(num, VARINT, out);
            put_varint(u64::from(n), out);
        }
        Ty::S32 => {
            let n = v.as_i64().and_then(|n| i32::try_from(n).ok()).ok_or_else(bad)?;
            put_key(num, VARINT, out);
            put_varint(u64::from(((n << 1) ^ (n >> 31)) as u32), out);
        }
        Ty::I64 => {
            let n = v.as_i64().or_else(|| v.as_str().and_then(|s| s.parse().ok())).ok_or_else(bad)?;
            put_key(num, VARINT, out);
            put_varint(n as u64, out);
        }
        Ty::Enum(names) => {
            let n = match v {
                Value::String(s) => names.iter().find(|(_, name)| name == s).map(|(n, _)| *n),
                other => other.as_i64().and_then(|n| i32::try_from(n).ok()),
            }
            .ok_or_else(bad)?;
            put_key(num, VARINT, out);
            // A negative enum is a ten-byte varint, as for int32.
            put_varint(i64::from(n) as u64, out);
        }
        Ty::Msg(m) => {
            let mut inner = Vec::new();
            encode_message(v, m, &mut inner)?;
            put_len(num, &inner, out);
        }
        Ty::Timestamp => {
            let (secs, nanos) = v.as_str().and_then(parse_rfc3339).ok_or_else(bad)?;
            let mut inner = Vec::new();
            if secs != 0 {
                put_key(1, VARINT, &mut inner);
                put_varint(secs as u64, &mut inner);
            }
            if nanos != 0 {
                put_key(2, VARINT, &mut inner);
                put_varint(u64::from(nanos), &mut inner);
            }
            put_len(num, &inner, out);
        }
        Ty::StrMap => return Err(bad()),
    }
    Ok(())
}
