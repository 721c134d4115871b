//! E2B's wire, as the official SDKs speak it: the control plane's REST bodies
//! (`POST /v2/sandboxes`, `GET /sandboxes/{id}`...) and envd's Connect RPC messages in the
//! JSON codec (the one the Python and JavaScript SDKs use: proto3's JSON mapping, with
//! `bytes` as base64, 64-bit integers as strings and enums by name), with the Connect
//! protocol's envelopes and error codes.
//!
//! Every request body read here is untrusted: it is bounded before it is parsed
//! ([`crate::json::parse_untrusted`]), and an unknown key is refused by name, as envd's own
//! `protojson` does (it does not discard unknown fields). Responses carry only what the
//! SDK reads.
//!
//! Source: e2b-dev/E2B `spec/envd/process/process.proto`, `spec/envd/filesystem/
//! filesystem.proto`, `spec/envd/envd.yaml` and `spec/openapi.yml`; connectrpc.com's
//! protocol reference for envelopes, `Connect-Timeout-Ms` and the error codes.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::json::{JsonError, JsonLimits, parse_untrusted};

pub mod proto;

/// The envd version stockade answers as: the SDKs gate features on it (`0.5.7` brings the
/// octet-stream upload, `0.6.2` file metadata in extended attributes, `0.6.3` a directory
/// watch's entry info, `0.6.4` a watch's `allowNetworkMounts`, which a sandbox's home, never
/// a network mount, accepts as it is).
pub const ENVD_VERSION: &str = "0.6.4";

/// Largest Connect request message (one unary body or one envelope's payload): 1 MiB.
pub const MAX_RPC_BYTES: usize = 1 << 20;

/// Largest REST request body on the control plane: 64 KiB.
pub const MAX_API_BYTES: usize = 64 << 10;

/// Most environment variables or metadata entries one request may set.
pub const MAX_MAP_ENTRIES: usize = 256;

const LIMITS: JsonLimits = JsonLimits::new(MAX_RPC_BYTES, 32);

/// A Connect error code (connectrpc.com/docs/protocol#error-codes): its wire name and the
/// HTTP status a unary call answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Code {
    /// The call was cancelled.
    Canceled,
    /// The request is malformed or names something impossible.
    InvalidArgument,
    /// The call's deadline (`Connect-Timeout-Ms`) passed.
    DeadlineExceeded,
    /// No such process, file or sandbox.
    NotFound,
    /// It exists already.
    AlreadyExists,
    /// The caller may not do this.
    PermissionDenied,
    /// A limit was reached.
    ResourceExhausted,
    /// The state does not allow it (a process that has ended).
    FailedPrecondition,
    /// No such method, or one stockade does not offer.
    Unimplemented,
    /// Something on the server failed.
    Internal,
    /// The sandbox is not reachable now.
    Unavailable,
    /// No or a wrong access token.
    Unauthenticated,
}

impl Code {
    /// The code's name on the wire (`not_found`).
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Canceled => "canceled",
            Self::InvalidArgument => "invalid_argument",
            Self::DeadlineExceeded => "deadline_exceeded",
            Self::NotFound => "not_found",
            Self::AlreadyExists => "already_exists",
            Self::PermissionDenied => "permission_denied",
            Self::ResourceExhausted => "resource_exhausted",
            Self::FailedPrecondition => "failed_precondition",
            Self::Unimplemented => "unimplemented",
            Self::Internal => "internal",
            Self::Unavailable => "unavailable",
            Self::Unauthenticated => "unauthenticated",
        }
    }

    /// The HTTP status a unary call answers with for this code.
    #[must_use]
    pub const fn http_status(self) -> u16 {
        match self {
            Self::Canceled => 499,
            Self::InvalidArgument | Self::FailedPrecondition => 400,
            Self::DeadlineExceeded => 504,
            Self::NotFound => 404,
            Self::AlreadyExists => 409,
            Self::PermissionDenied => 403,
            Self::ResourceExhausted => 429,
            Self::Unimplemented => 501,
            Self::Internal => 500,
            Self::Unavailable => 503,
            Self::Unauthenticated => 401,
        }
    }
}

/// A Connect error: a code and a one-line message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", code.name())]
pub struct ConnectError {
    /// The code.
    pub code: Code,
    /// What went wrong, naming the thing.
    pub message: String,
}

impl ConnectError {
    /// An error with this code and message.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }

    /// The error as Connect's JSON error object, `{"code": "...", "message": "..."}`.
    #[must_use]
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({ "code": self.code.name(), "message": self.message })
    }
}

impl From<JsonError> for ConnectError {
    fn from(e: JsonError) -> Self {
        Self::new(Code::InvalidArgument, format!("the request message: {e}"))
    }
}

/// An envelope flag: the payload is compressed (stockade offers no compression).
pub const FLAG_COMPRESSED: u8 = 0x01;
/// An envelope flag: the stream's end message (its JSON holds the error, if any).
pub const FLAG_END_STREAM: u8 = 0x02;

/// One envelope of a streaming call: a flags byte, the payload's length (big-endian u32),
/// then the payload.
#[must_use]
pub fn envelope(flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + payload.len());
    out.push(flags);
    out.extend_from_slice(&u32::try_from(payload.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A stream's end envelope: `{}` for success, else `{"error": {...}}`.
#[must_use]
pub fn end_stream(error: Option<&ConnectError>) -> Vec<u8> {
    let body = match error {
        None => serde_json::json!({}),
        Some(e) => serde_json::json!({ "error": e.to_json() }),
    };
    envelope(FLAG_END_STREAM, body.to_string().as_bytes())
}

/// The one message of a server-streaming request body: exactly one uncompressed envelope
/// of at most [`MAX_RPC_BYTES`], and nothing after it.
pub fn single_envelope(body: &[u8]) -> Result<&[u8], ConnectError> {
    let bad = |why: &str| ConnectError::new(Code::InvalidArgument, format!("the request envelope: {why}"));
    let Some((head, rest)) = body.split_first_chunk::<5>() else {
        return Err(bad("shorter than its 5-byte prefix"));
    };
    let [flags, len @ ..] = *head;
    if flags & FLAG_COMPRESSED != 0 {
        return Err(ConnectError::new(Code::Unimplemented, "compressed messages are not accepted"));
    }
    if flags != 0 {
        return Err(bad(&format!("unexpected flags {flags:#04x}")));
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_RPC_BYTES {
        return Err(ConnectError::new(
            Code::ResourceExhausted,
            format!("a {len}-byte message is over the {MAX_RPC_BYTES}-byte limit"),
        ));
    }
    match rest.len().cmp(&len) {
        std::cmp::Ordering::Less => Err(bad("truncated")),
        std::cmp::Ordering::Greater => Err(bad("more than one message in a server-streaming request")),
        std::cmp::Ordering::Equal => Ok(rest),
    }
}

/// Parses one request message in the JSON codec (bounded, unknown keys refused).
pub fn parse<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ConnectError> {
    Ok(parse_untrusted(bytes, LIMITS)?)
}

/// A Connect call's codec, from its content type: proto3's JSON mapping or its binary
/// encoding. Both read into the same types with the same refusals, and both answer with
/// the same message; a stream's end message and a unary error are JSON in both, as the
/// Connect protocol has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    /// `application/json`, `application/connect+json`.
    Json,
    /// `application/proto`, `application/connect+proto`.
    Proto,
}

impl Codec {
    /// The codec a `Content-Type` names (`application/proto` for a unary call,
    /// `application/connect+proto` for a streaming one; a `charset` parameter is allowed).
    #[must_use]
    pub fn from_content_type(content_type: &str, streaming: bool) -> Option<Self> {
        let bare = content_type.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
        [Self::Json, Self::Proto].into_iter().find(|c| c.content_type(streaming) == bare)
    }

    /// Its content type for a unary or a streaming call.
    #[must_use]
    pub const fn content_type(self, streaming: bool) -> &'static str {
        match (self, streaming) {
            (Self::Json, false) => "application/json",
            (Self::Json, true) => "application/connect+json",
            (Self::Proto, false) => "application/proto",
            (Self::Proto, true) => "application/connect+proto",
        }
    }

    /// Reads one request message (bounded; unknown keys or field numbers refused by name).
    pub fn decode<T: serde::de::DeserializeOwned>(
        self,
        bytes: &[u8],
        message: &'static proto::Message,
    ) -> Result<T, ConnectError> {
        match self {
            Self::Json => parse(bytes),
            Self::Proto => {
                if bytes.len() > MAX_RPC_BYTES {
                    return Err(ConnectError::new(
                        Code::ResourceExhausted,
                        format!("a {}-byte message is over the {MAX_RPC_BYTES}-byte limit", bytes.len()),
                    ));
                }
                let bad = |e: &dyn std::fmt::Display| {
                    ConnectError::new(Code::InvalidArgument, format!("the request message: {e}"))
                };
                let value = proto::decode(bytes, message).map_err(|e| bad(&e))?;
                serde_json::from_value(value).map_err(|e| bad(&e))
            }
        }
    }

    /// Writes one response message, given as proto3's JSON value for it.
    pub fn encode(self, value: &serde_json::Value, message: &'static proto::Message) -> Result<Vec<u8>, ConnectError> {
        match self {
            Self::Json => Ok(value.to_string().into_bytes()),
            Self::Proto => proto::encode(value, message)
                .map_err(|e| ConnectError::new(Code::Internal, format!("encoding the response: {e}"))),
        }
    }
}

/// How a method's messages flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// One request, one response.
    Unary,
    /// One request, a stream of responses (`Start`, `Connect`).
    ServerStream,
    /// A stream of requests, one response (`StreamInput`).
    ClientStream,
}

impl Shape {
    /// Whether its messages travel in envelopes (`application/connect+...`).
    #[must_use]
    pub const fn streaming(self) -> bool {
        !matches!(self, Self::Unary)
    }
}

/// One envd method stockade offers: its path and its messages' schemas.
#[derive(Debug)]
pub struct Method {
    /// `/process.Process/Start`.
    pub path: &'static str,
    /// How its messages flow.
    pub shape: Shape,
    /// Its request message.
    pub request: &'static proto::Message,
    /// Its response message.
    pub response: &'static proto::Message,
}

const fn method(
    path: &'static str,
    shape: Shape,
    request: &'static proto::Message,
    response: &'static proto::Message,
) -> Method {
    Method { path, shape, request, response }
}

/// Every envd method stockade offers.
pub static METHODS: [Method; 17] = {
    use Shape::{ClientStream, ServerStream, Unary};
    use proto::{
        CREATE_WATCHER_REQUEST, CREATE_WATCHER_RESPONSE, EMPTY, ENTRY_RESPONSE, EVENT_RESPONSE, LIST_DIR_REQUEST,
        LIST_DIR_RESPONSE, LIST_RESPONSE, MOVE_REQUEST, PATH_REQUEST, PROCESS_REQUEST, SEND_INPUT_REQUEST,
        SEND_SIGNAL_REQUEST, START_REQUEST, STREAM_INPUT_REQUEST, UPDATE_REQUEST, WATCH_DIR_RESPONSE,
        WATCHER_EVENTS_RESPONSE, WATCHER_REQUEST,
    };
    [
        method("/process.Process/Start", ServerStream, &START_REQUEST, &EVENT_RESPONSE),
        method("/process.Process/Connect", ServerStream, &PROCESS_REQUEST, &EVENT_RESPONSE),
        method("/process.Process/StreamInput", ClientStream, &STREAM_INPUT_REQUEST, &EMPTY),
        method("/process.Process/List", Unary, &EMPTY, &LIST_RESPONSE),
        method("/process.Process/SendInput", Unary, &SEND_INPUT_REQUEST, &EMPTY),
        method("/process.Process/CloseStdin", Unary, &PROCESS_REQUEST, &EMPTY),
        method("/process.Process/SendSignal", Unary, &SEND_SIGNAL_REQUEST, &EMPTY),
        method("/process.Process/Update", Unary, &UPDATE_REQUEST, &EMPTY),
        method("/filesystem.Filesystem/Stat", Unary, &PATH_REQUEST, &ENTRY_RESPONSE),
        method("/filesystem.Filesystem/MakeDir", Unary, &PATH_REQUEST, &ENTRY_RESPONSE),
        method("/filesystem.Filesystem/Move", Unary, &MOVE_REQUEST, &ENTRY_RESPONSE),
        method("/filesystem.Filesystem/ListDir", Unary, &LIST_DIR_REQUEST, &LIST_DIR_RESPONSE),
        method("/filesystem.Filesystem/Remove", Unary, &PATH_REQUEST, &EMPTY),
        method("/filesystem.Filesystem/CreateWatcher", Unary, &CREATE_WATCHER_REQUEST, &CREATE_WATCHER_RESPONSE),
        method("/filesystem.Filesystem/GetWatcherEvents", Unary, &WATCHER_REQUEST, &WATCHER_EVENTS_RESPONSE),
        method("/filesystem.Filesystem/RemoveWatcher", Unary, &WATCHER_REQUEST, &EMPTY),
        method("/filesystem.Filesystem/WatchDir", ServerStream, &CREATE_WATCHER_REQUEST, &WATCH_DIR_RESPONSE),
    ]
};

/// The method at `path`, if stockade offers it.
#[must_use]
pub fn find_method(path: &str) -> Option<&'static Method> {
    METHODS.iter().find(|m| m.path == path)
}

/// Parses one control-plane request body (bounded, unknown keys refused).
pub fn parse_api<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, JsonError> {
    parse_untrusted(bytes, JsonLimits::new(MAX_API_BYTES, 16))
}

/// proto3 `bytes` in JSON: standard base64 (padded or not, or URL-safe on the way in).
mod b64 {
    use super::{Deserialize, Deserializer};
    use base64::Engine as _;

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        let trimmed = text.trim_end_matches('=');
        let engine = if trimmed.contains(['-', '_']) {
            base64::engine::general_purpose::URL_SAFE_NO_PAD
        } else {
            base64::engine::general_purpose::STANDARD_NO_PAD
        };
        engine.decode(trimmed).map_err(serde::de::Error::custom)
    }
}

/// A bounded string map (`map<string, string>`).
fn bounded_map<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    let m = BTreeMap::<String, String>::deserialize(d)?;
    if m.len() > MAX_MAP_ENTRIES {
        return Err(serde::de::Error::custom(format!("more than {MAX_MAP_ENTRIES} entries")));
    }
    Ok(m)
}

/// A 64-bit integer as proto3 JSON writes it: a string.
fn i64_string<S: Serializer>(v: &i64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&v.to_string())
}

// ---- the process service ----

/// `process.ProcessConfig`: the command, its arguments, environment and directory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProcessConfig {
    /// The program.
    #[serde(default)]
    pub cmd: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Its environment, on top of the sandbox's.
    #[serde(default, deserialize_with = "bounded_map", skip_serializing_if = "BTreeMap::is_empty")]
    pub envs: BTreeMap<String, String>,
    /// Its working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

/// `process.PTY.Size`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PtySize {
    /// Columns.
    #[serde(default)]
    pub cols: u32,
    /// Rows.
    #[serde(default)]
    pub rows: u32,
}

/// `process.PTY`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pty {
    /// Its size.
    #[serde(default)]
    pub size: Option<PtySize>,
}

/// `process.StartRequest`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartRequest {
    /// What to run.
    #[serde(default)]
    pub process: Option<ProcessConfig>,
    /// A terminal, if asked for.
    #[serde(default)]
    pub pty: Option<Pty>,
    /// A name for it.
    #[serde(default)]
    pub tag: Option<String>,
    /// Keep its stdin open for `SendInput`.
    #[serde(default)]
    pub stdin: Option<bool>,
}

/// `process.ProcessSelector`: a pid or a tag.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub enum ProcessSelector {
    /// By pid.
    Pid(u32),
    /// By tag.
    Tag(String),
}

/// A request naming one process (`ConnectRequest`, `CloseStdinRequest`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessRequest {
    /// Which.
    pub process: ProcessSelector,
}

/// `process.ProcessInput`: bytes for its stdin or its terminal.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub enum ProcessInput {
    /// For its stdin.
    Stdin(#[serde(deserialize_with = "b64::deserialize")] Vec<u8>),
    /// Typed into its terminal.
    Pty(#[serde(deserialize_with = "b64::deserialize")] Vec<u8>),
}

/// `process.SendInputRequest`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SendInputRequest {
    /// Which.
    pub process: ProcessSelector,
    /// What.
    pub input: ProcessInput,
}

/// `process.StreamInputRequest`: the first message names the process, each later one is
/// input for it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub enum StreamInputRequest {
    /// Which process.
    Start {
        /// It.
        process: ProcessSelector,
    },
    /// Input.
    Data {
        /// The bytes.
        input: ProcessInput,
    },
    /// Nothing; the stream is alive.
    #[serde(rename = "keepalive")]
    KeepAlive {},
}

/// `process.SendSignalRequest`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SendSignalRequest {
    /// Which.
    pub process: ProcessSelector,
    /// `SIGNAL_SIGTERM` or `SIGNAL_SIGKILL` (or their numbers).
    pub signal: Signal,
}

/// `process.Signal`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGTERM (15).
    Term,
    /// SIGKILL (9).
    Kill,
}

impl Signal {
    /// Its number.
    #[must_use]
    pub const fn number(self) -> i32 {
        match self {
            Self::Term => 15,
            Self::Kill => 9,
        }
    }
}

impl<'de> Deserialize<'de> for Signal {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Wire {
            Name(String),
            Number(i64),
        }
        match Wire::deserialize(d)? {
            Wire::Name(n) if n == "SIGNAL_SIGTERM" => Ok(Self::Term),
            Wire::Name(n) if n == "SIGNAL_SIGKILL" => Ok(Self::Kill),
            Wire::Number(15) => Ok(Self::Term),
            Wire::Number(9) => Ok(Self::Kill),
            Wire::Name(n) => Err(serde::de::Error::custom(format!("signal {n}: not SIGNAL_SIGTERM or SIGNAL_SIGKILL"))),
            Wire::Number(n) => Err(serde::de::Error::custom(format!("signal {n}: not 15 or 9"))),
        }
    }
}

/// `process.UpdateRequest`: a new terminal size.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateRequest {
    /// Which.
    pub process: ProcessSelector,
    /// The new size.
    #[serde(default)]
    pub pty: Option<Pty>,
}

/// `process.ListRequest` (empty).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Empty {}

/// `process.ProcessInfo`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcessInfo {
    /// How it was started.
    pub config: ProcessConfig,
    /// Its pid in the sandbox.
    pub pid: u32,
    /// Its tag.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

/// `process.ListResponse`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ListResponse {
    /// The running processes started through the API.
    pub processes: Vec<ProcessInfo>,
}

/// `process.ProcessEvent`, wrapped as a `StartResponse`/`ConnectResponse` (`{"event": ...}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessEvent {
    /// It started with this pid.
    Start {
        /// The pid.
        pid: u32,
    },
    /// Output from its stdout.
    Stdout(Vec<u8>),
    /// Output from its stderr.
    Stderr(Vec<u8>),
    /// Output from its terminal.
    Pty(Vec<u8>),
    /// It ended.
    End {
        /// Its exit code (-1 when a signal ended it).
        exit_code: i32,
        /// Whether it exited (rather than being killed by a signal).
        exited: bool,
        /// `exit status N` or `signal: killed`, as Go's `ProcessState` says it.
        status: String,
        /// Why it could not run or was cut short.
        error: Option<String>,
    },
    /// Nothing new; the stream is alive.
    KeepAlive,
}

impl ProcessEvent {
    /// The response message as JSON (`{"event": {"data": {"stdout": "aGk="}}}`).
    #[must_use]
    pub fn to_json(&self) -> serde_json::Value {
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let event = match self {
            Self::Start { pid } => serde_json::json!({ "start": { "pid": pid } }),
            Self::Stdout(b) => serde_json::json!({ "data": { "stdout": b64(b) } }),
            Self::Stderr(b) => serde_json::json!({ "data": { "stderr": b64(b) } }),
            Self::Pty(b) => serde_json::json!({ "data": { "pty": b64(b) } }),
            Self::End { exit_code, exited, status, error } => {
                let mut end = serde_json::json!({ "exitCode": exit_code, "exited": exited, "status": status });
                if let Some(e) = error {
                    end["error"] = serde_json::Value::String(e.clone());
                }
                serde_json::json!({ "end": end })
            }
            Self::KeepAlive => serde_json::json!({ "keepalive": {} }),
        };
        serde_json::json!({ "event": event })
    }
}

// ---- the filesystem service ----

/// `filesystem.CreateWatcherRequest`, and `WatchDirRequest`, which has the same fields.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CreateWatcherRequest {
    /// The directory.
    #[serde(default)]
    pub path: String,
    /// Its subdirectories too.
    #[serde(default)]
    pub recursive: bool,
    /// Each event with the entry's info.
    #[serde(default)]
    pub include_entry: bool,
    /// Network mounts allowed (a sandbox's home is never one).
    #[serde(default)]
    pub allow_network_mounts: bool,
}

/// `filesystem.GetWatcherEventsRequest` and `RemoveWatcherRequest`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WatcherRequest {
    /// The watcher.
    #[serde(default)]
    pub watcher_id: String,
}

/// A request naming one path (`StatRequest`, `MakeDirRequest`, `RemoveRequest`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathRequest {
    /// The path.
    #[serde(default)]
    pub path: String,
}

/// `filesystem.ListDirRequest`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListDirRequest {
    /// The directory.
    #[serde(default)]
    pub path: String,
    /// How deep (0 and 1: its own entries).
    #[serde(default)]
    pub depth: u32,
}

/// `filesystem.MoveRequest`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoveRequest {
    /// From.
    #[serde(default)]
    pub source: String,
    /// To.
    #[serde(default)]
    pub destination: String,
}

/// `filesystem.FileType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum FileType {
    /// Anything else (a fifo, socket or device).
    #[serde(rename = "FILE_TYPE_UNSPECIFIED")]
    Unspecified,
    /// A regular file.
    #[serde(rename = "FILE_TYPE_FILE")]
    File,
    /// A directory.
    #[serde(rename = "FILE_TYPE_DIRECTORY")]
    Directory,
    /// A symbolic link.
    #[serde(rename = "FILE_TYPE_SYMLINK")]
    Symlink,
}

/// `filesystem.EntryInfo`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EntryInfo {
    /// Its name.
    pub name: String,
    /// Its kind.
    #[serde(rename = "type")]
    pub kind: FileType,
    /// Its path in the sandbox.
    pub path: String,
    /// Its size.
    #[serde(serialize_with = "i64_string")]
    pub size: i64,
    /// Its mode bits.
    pub mode: u32,
    /// Its mode as `ls -l` writes it (`-rw-r--r--`).
    pub permissions: String,
    /// Its owner's name.
    pub owner: String,
    /// Its group's name.
    pub group: String,
    /// Its modification time, RFC 3339.
    pub modified_time: String,
    /// Where a symlink points, if it is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
    /// Its user metadata (`user.e2b.*` extended attributes, the prefix stripped).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub metadata: std::collections::BTreeMap<String, String>,
}

/// `ls -l`'s permission string for a kind and mode.
#[must_use]
pub fn permissions(kind: FileType, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(match kind {
        FileType::Directory => 'd',
        FileType::Symlink => 'l',
        _ => '-',
    });
    for shift in [6u32, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

/// Seconds since the epoch as RFC 3339 in UTC (`2026-12-05T06:00:00Z`).
#[must_use]
pub fn rfc3339(secs: i64) -> String {
    // Howard Hinnant's days-to-civil.
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// RFC 3339 in UTC (`2026-12-05T06:00:00Z`, or with up to nine digits of a fraction) as
/// seconds since the epoch and nanoseconds: [`rfc3339`]'s inverse.
#[must_use]
pub fn parse_rfc3339(text: &str) -> Option<(i64, u32)> {
    let body = text.strip_suffix('Z')?;
    let (stamp, fraction) = body.split_once('.').unwrap_or((body, "0"));
    let b = stamp.as_bytes();
    if b.len() != 19 || [b[4], b[7], b[10], b[13], b[16]] != *b"--T::" {
        return None;
    }
    let num =
        |r: std::ops::Range<usize>| stamp.get(r).filter(|d| d.bytes().all(|c| c.is_ascii_digit()))?.parse::<i64>().ok();
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    if !(1..=9).contains(&fraction.len()) || !fraction.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let nanos = format!("{fraction:0<9}").parse().ok()?;
    // Howard Hinnant's days-from-civil.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + hour * 3600 + minute * 60 + second, nanos))
}

// ---- the control plane ----

/// `NewSandbox`/`NewSandboxV2`: what `Sandbox.create` sends.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NewSandbox {
    /// The template (a name from the server's configuration).
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// Seconds until the sandbox is killed.
    #[serde(default)]
    pub timeout: Option<u64>,
    /// Labels the caller can list by.
    #[serde(default, deserialize_with = "bounded_map")]
    pub metadata: BTreeMap<String, String>,
    /// The sandbox's environment.
    #[serde(default, deserialize_with = "bounded_map")]
    pub env_vars: BTreeMap<String, String>,
    /// Pause instead of kill at the timeout (refused when true).
    #[serde(default)]
    pub auto_pause: Option<bool>,
    /// Keep memory when auto-pausing (ignored: stockade never auto-pauses).
    #[serde(default)]
    pub auto_pause_memory: Option<bool>,
    /// Resume on traffic (refused when set).
    #[serde(default)]
    pub auto_resume: Option<serde_json::Value>,
    /// Whether envd asks for an access token (stockade always does).
    #[serde(default)]
    pub secure: Option<bool>,
    /// The old network switch (the SDK spells it in snake case).
    #[serde(default, rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
    /// The network rules: `allowOut`, `denyOut`...
    #[serde(default)]
    pub network: Option<NetworkConfig>,
    /// An MCP gateway (refused when set).
    #[serde(default)]
    pub mcp: Option<serde_json::Value>,
    /// Cloud IAM (refused when set).
    #[serde(default)]
    pub iam: Option<serde_json::Value>,
    /// Volumes (refused when set).
    #[serde(default)]
    pub volume_mounts: Option<serde_json::Value>,
}

/// `SandboxNetworkConfig` (keys it does not name are kept in `other`, for the server to
/// refuse by name).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkConfig {
    /// Whether the sandbox's ports are public (stockade publishes none).
    #[serde(default)]
    pub allow_public_traffic: Option<bool>,
    /// Hosts (or `ALL_TRAFFIC`) the sandbox may reach.
    #[serde(default)]
    pub allow_out: Vec<String>,
    /// Hosts it may not reach.
    #[serde(default)]
    pub deny_out: Vec<String>,
    /// The `Host` a request to one of its ports carries upstream (`${PORT}` is the port).
    #[serde(default)]
    pub mask_request_host: Option<String>,
    /// Per-host rules for its egress requests: host to an ordered list of rules.
    #[serde(default)]
    pub rules: BTreeMap<String, Vec<NetworkRule>>,
    /// Anything else the SDK can set (refused when present).
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

/// `SandboxNetworkRule`: what happens to a request to the host it is listed under.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkRule {
    /// Changes made to the request on its way out.
    #[serde(default)]
    pub transform: Option<NetworkTransform>,
}

/// `SandboxNetworkTransform`: headers set on a request on its way out, replacing any the
/// sandbox sent under the same name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkTransform {
    /// Header names to values.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

/// `SandboxNetworkUpdateConfig` (`PUT /sandboxes/{id}/network`): the egress lists, which
/// replace the sandbox's all at once (a list left out is cleared). Keys it does not name are
/// kept in `other`, for the server to refuse by name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkUpdate {
    /// Hosts (or `ALL_TRAFFIC`) the sandbox may reach.
    #[serde(default)]
    pub allow_out: Vec<String>,
    /// Hosts it may not reach.
    #[serde(default)]
    pub deny_out: Vec<String>,
    /// The old network switch (the SDK spells it in snake case).
    #[serde(default, rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
    /// Anything else the SDK can set (refused when present).
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

/// `SandboxTimeoutRequest`, `ConnectSandbox`, `SandboxRefreshRequest`: a new timeout.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeoutRequest {
    /// Seconds from now.
    #[serde(default, alias = "duration")]
    pub timeout: Option<u64>,
    /// Resume with memory (ignored: a stockade pause always keeps it).
    #[serde(default)]
    pub memory: Option<serde_json::Value>,
    /// Pause only a healthy guest (ignored).
    #[serde(default, rename = "requireHealthyGuest")]
    pub require_healthy_guest: Option<bool>,
}

/// `Sandbox`: the answer to a create or a connect.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxCreated {
    /// The template.
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// The sandbox's id.
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    /// `stockade`.
    #[serde(rename = "clientID")]
    pub client_id: String,
    /// [`ENVD_VERSION`].
    pub envd_version: String,
    /// The token every envd call must present (`X-Access-Token`).
    pub envd_access_token: String,
    /// The token a request to one of the sandbox's ports presents
    /// (`E2B-Traffic-Access-Token`).
    pub traffic_access_token: String,
}

/// `ListedSandbox` and `SandboxDetail`: one sandbox as `list` and `get_info` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxDetail {
    /// The template.
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// The sandbox's id.
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    /// `stockade`.
    #[serde(rename = "clientID")]
    pub client_id: String,
    /// When it was made (RFC 3339).
    pub started_at: String,
    /// When it will be killed (RFC 3339).
    pub end_at: String,
    /// Its CPU share, in CPUs.
    pub cpu_count: u32,
    /// Its memory, in MiB.
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    /// Its disk, in MiB (0: not capped).
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u64,
    /// `running` or `paused`.
    pub state: String,
    /// [`ENVD_VERSION`].
    pub envd_version: String,
    /// Its labels.
    pub metadata: BTreeMap<String, String>,
}

/// The control plane's error body, `{"code": 404, "message": "..."}`.
#[must_use]
pub fn api_error(status: u16, message: &str) -> serde_json::Value {
    serde_json::json!({ "code": status, "message": message })
}

/// `SandboxSnapshotRequest`: what `create_snapshot` sends.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRequest {
    /// A name sandboxes can be created from, besides the snapshot's id.
    #[serde(default)]
    pub name: Option<String>,
    /// Whether memory is kept too (`mode="full"`; absent means full, E2B's default);
    /// `false` is `mode="filesystem"`, the only kind stockade takes.
    #[serde(default)]
    pub memory: Option<bool>,
}

/// `SnapshotInfo`: a snapshot as `create_snapshot` and `list_snapshots` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SnapshotInfo {
    /// Its id: `Sandbox.create(snapshot_id)` makes a sandbox from it.
    #[serde(rename = "snapshotID")]
    pub snapshot_id: String,
    /// Its names.
    pub names: Vec<String>,
}
