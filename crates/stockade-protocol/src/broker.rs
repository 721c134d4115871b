//! Broker frames: how sandboxed code calls back into a grant the host serves.
//!
//! The guest sends [`BrokerFrame::Call`] and the host answers with [`BrokerFrame::Reply`],
//! each one JSON document inside one length-prefixed frame. Everything here is parsed from
//! guest bytes, so every struct denies unknown fields and every string has a bound.
//!
//! # The wire protocol (version 1)
//!
//! A stream (a unix socket in the process and docker tiers; the `host.call` import in the
//! wasm tier carries one frame's payload per call, without the length prefix):
//!
//! ```text
//! frame   = length payload          ; length: u32, big-endian, 1 ..= the broker's maximum
//! payload = one JSON object (UTF-8)
//! call    = {"type":"call","id":<u64>,"grant":"<name>","args":<JSON>}
//! reply   = {"type":"reply","id":<u64>,"result":<JSON>}
//!         | {"type":"reply","id":<u64>,"error":{"code":"<code>","message":"<text>"}}
//! ```
//!
//! - Calls on one connection are answered in order, one at a time; open several
//!   connections for concurrency (the broker bounds both).
//! - A function grant takes its arguments as a JSON object; a data grant ignores `args`
//!   and answers with its value; [`LIST_GRANT`] answers with the run's manifest,
//!   `{"data":{"<name>":<value>,…},"functions":[{"name":…,"params":[…],"schema":…},…]}`.
//! - Error codes: `denied` (the policy, or no such grant), `bad_args` (not an object, or
//!   not the grant's schema), `failed` (the function returned an error, or timed out),
//!   `too_large` (the reply is over the broker's cap), `refused` (a bound of the run was
//!   reached, or the run has ended).
//! - The host always serialises a reply with its keys in the order above (`type`, `id`,
//!   then `result` or `error`), so a client can find the result without a JSON parser.
//! - Any protocol error ends the broker session for the whole run, as Deno's permission
//!   broker does: a length over the maximum (refused before anything is allocated), a
//!   payload that is not one call, a stream that ends inside a frame, or a flood.
//!   The run's report says why; the guest's connections are closed.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Longest grant name: 64 bytes of `[a-zA-Z0-9_.-]`.
pub const MAX_GRANT_NAME_LEN: usize = 64;
/// The grant name that answers with the run's manifest of grants (see the module docs).
pub const LIST_GRANT: &str = "stockade.list";

/// The broker's socket file name inside a run's grants directory.
pub const GRANTS_SOCKET: &str = "grants.sock";

/// The environment variable that names the broker socket's path inside the guest.
pub const BROKER_ENV: &str = "STOCKADE_BROKER";

/// Longest error message in a reply: 4 KiB.
pub const MAX_BROKER_MESSAGE_LEN: usize = 4 << 10;

/// A grant name, checked on construction and on parse.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct GrantName(String);

/// A broker message was malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BrokerError {
    /// A grant name is empty, too long, or uses characters outside `[a-zA-Z0-9_.-]`.
    #[error("invalid grant name {0:?}")]
    GrantName(String),
    /// A reply carries both a result and an error, or neither.
    #[error("a reply must carry exactly one of `result` and `error`")]
    ReplyShape,
    /// A reply's error message is longer than [`MAX_BROKER_MESSAGE_LEN`].
    #[error("error message of {0} bytes is too long")]
    MessageTooLong(usize),
}

impl GrantName {
    /// Checks and wraps a grant name.
    pub fn new(name: impl Into<String>) -> Result<Self, BrokerError> {
        let name = name.into();
        let ok = !name.is_empty()
            && name.len() <= MAX_GRANT_NAME_LEN
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if ok { Ok(Self(name)) } else { Err(BrokerError::GrantName(name)) }
    }

    /// The name.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for GrantName {
    type Error = BrokerError;
    fn try_from(s: String) -> Result<Self, BrokerError> {
        Self::new(s)
    }
}

impl From<GrantName> for String {
    fn from(g: GrantName) -> String {
        g.0
    }
}

/// Why a grant call failed, as a stable machine-readable code (guests match on it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ReplyCode {
    /// The policy denied the call, or the run has no such grant.
    Denied,
    /// The arguments are not the grant's (not one JSON object, or not its schema).
    BadArgs,
    /// The call ran and failed, or timed out.
    Failed,
    /// The result is over the reply limit.
    TooLarge,
    /// The run has ended; nothing is served any more.
    Refused,
}

impl ReplyCode {
    /// The wire name (`denied`, `bad_args`, `failed`, `too_large`, `refused`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Denied => "denied",
            Self::BadArgs => "bad_args",
            Self::Failed => "failed",
            Self::TooLarge => "too_large",
            Self::Refused => "refused",
        }
    }
}

/// Why a grant call failed, as told to the guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ReplyError {
    /// The machine-readable code.
    pub code: ReplyCode,
    /// A human-readable message, at most [`MAX_BROKER_MESSAGE_LEN`] bytes.
    pub message: String,
}

impl ReplyError {
    /// An error with `code` and `message`; the message is cut to [`MAX_BROKER_MESSAGE_LEN`].
    #[must_use]
    pub fn new(code: ReplyCode, message: impl Into<String>) -> Self {
        let mut message = message.into();
        crate::report::truncate_at_char(&mut message, MAX_BROKER_MESSAGE_LEN);
        Self { code, message }
    }
}

/// One broker message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "FrameWire", into = "FrameWire")]
#[non_exhaustive]
pub enum BrokerFrame {
    /// The guest asks the host to run a grant.
    Call {
        /// Chosen by the guest; echoed in the reply.
        id: u64,
        /// Which grant.
        grant: GrantName,
        /// The grant's arguments.
        args: Value,
    },
    /// The host's answer to one call.
    Reply {
        /// The call's id.
        id: u64,
        /// The result, or the error.
        body: ReplyBody,
    },
}

/// The payload of a reply: exactly one of `result` and `error` on the wire.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ReplyBody {
    /// The grant ran and returned this value.
    Result(Value),
    /// The grant was refused or failed.
    Error(ReplyError),
}

/// The wire shape: `{"type":"call","id":1,"grant":"g","args":{}}` or
/// `{"type":"reply","id":1,"result":…}` / `{"type":"reply","id":1,"error":{…}}`.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type", deny_unknown_fields)]
enum FrameWire {
    Call {
        id: u64,
        grant: GrantName,
        args: Value,
    },
    Reply {
        id: u64,
        #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
        result: Option<Value>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<ReplyError>,
    },
}

/// Deserializes a field that is present (even as `null`) into `Some`.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

impl TryFrom<FrameWire> for BrokerFrame {
    type Error = BrokerError;
    fn try_from(w: FrameWire) -> Result<Self, BrokerError> {
        Ok(match w {
            FrameWire::Call { id, grant, args } => Self::Call { id, grant, args },
            FrameWire::Reply { id, result, error } => {
                let body = match (result, error) {
                    (Some(v), None) => ReplyBody::Result(v),
                    (None, Some(e)) if e.message.len() > MAX_BROKER_MESSAGE_LEN => {
                        return Err(BrokerError::MessageTooLong(e.message.len()));
                    }
                    (None, Some(e)) => ReplyBody::Error(e),
                    _ => return Err(BrokerError::ReplyShape),
                };
                Self::Reply { id, body }
            }
        })
    }
}

impl From<BrokerFrame> for FrameWire {
    fn from(f: BrokerFrame) -> Self {
        match f {
            BrokerFrame::Call { id, grant, args } => Self::Call { id, grant, args },
            BrokerFrame::Reply { id, body } => {
                let (result, error) = match body {
                    ReplyBody::Result(v) => (Some(v), None),
                    ReplyBody::Error(e) => (None, Some(e)),
                };
                Self::Reply { id, result, error }
            }
        }
    }
}

impl BrokerFrame {
    /// Parses one broker frame's payload under the default JSON caps.
    pub fn parse(payload: &[u8]) -> Result<Self, crate::json::JsonError> {
        crate::json::parse_untrusted(payload, crate::json::JsonLimits::default())
    }

    /// Serializes this frame to JSON bytes.
    #[must_use]
    pub fn to_bytes(&self) -> Vec<u8> {
        // Serializing these types cannot fail: every map key is a string and no custom
        // `Serialize` impl returns an error.
        serde_json::to_vec(self).unwrap_or_default()
    }
}
