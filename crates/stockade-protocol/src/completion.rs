//! Decoding the chat completions that real OpenAI-compatible servers send: lenient where
//! servers differ, strict where safety depends on it.
//!
//! [`chat::ChatResponse`](crate::chat::ChatResponse) is the strict schema (unknown keys
//! refused). Real servers (llama.cpp, llama-cpp-python, Ollama, vLLM, LM Studio, proxies) add
//! and omit fields, so an agent reading them needs a second decoder. [`decode_completion`]
//! accepts, and records as a [`Quirk`]:
//! - `content` null, `""` or absent beside `tool_calls`, or a list of text parts;
//! - `arguments` as a JSON string or as a JSON object;
//! - tool-call ids missing, empty or duplicated (the caller gives every call an id of its own);
//! - `finish_reason: "stop"` with `tool_calls` present (tool calls are decided by
//!   `tool_calls` being non-empty, never by `finish_reason`);
//! - a legacy `function_call` field, and `reasoning_content` (both ignored);
//! - unknown fields anywhere.
//!
//! It is strict where a wrong guess would act on the wrong thing:
//! - every call's arguments must be one JSON object, at most [`MAX_ARGUMENT_BYTES`] bytes and
//!   [`MAX_ARGUMENT_DEPTH`] levels deep, with no duplicate key at any level; anything else is
//!   an [`ArgumentsError`] *for that call* (the caller tells the model, and runs nothing);
//! - an empty or missing `choices` array, a body that is not one complete JSON document (a
//!   truncated body), or an `error` object in the body are a [`CompletionError`];
//! - at most [`MAX_DECODED_CALLS`] calls are kept; more are counted in
//!   [`Completion::dropped_calls`].
//!
//! Text that looks like a tool call (`<tool_call>` blocks, JSON in `content`) stays text:
//! attacker-controlled tool output can echo such blocks.

use std::cell::RefCell;
use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

use crate::chat::MAX_CHAT_BYTES;
use crate::json::{JsonError, JsonLimits, MAX_JSON_DEPTH, nesting_depth, parse_untrusted};

/// Largest arguments document of one call: 64 KiB.
///
/// A model chooses the size of what it proposes; every argument is later canonicalised,
/// authorised, logged and possibly echoed back, so a bound keeps each of those cheap.
pub const MAX_ARGUMENT_BYTES: usize = 64 << 10;

/// Deepest nesting inside one call's arguments: 16 levels.
///
/// No tool this project knows takes deeper arguments, and the policy's argument types stop
/// at the same depth.
pub const MAX_ARGUMENT_DEPTH: usize = 16;

/// Most tool calls decoded from one completion: 64. Further calls are counted and dropped.
///
/// A completion is bounded in bytes already; this bounds the per-call work (ids, parsing,
/// authorisation) a hostile model can ask for in one turn.
pub const MAX_DECODED_CALLS: usize = 64;

/// Longest tool name kept from a completion: 256 bytes (longer names are cut at a character
/// boundary; a real tool name is at most 64 characters, so a cut name is never a match).
pub const MAX_CALL_NAME_BYTES: usize = 256;

/// Longest provider call id kept: 256 bytes (longer ids are dropped, and recorded as missing).
pub const MAX_PROVIDER_ID_BYTES: usize = 256;

/// Something a server did that differs from OpenAI's reference behaviour, and was tolerated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Quirk {
    /// `content` was `null`.
    ContentNull,
    /// `content` was absent.
    ContentMissing,
    /// `content` was a list of text parts, joined here.
    ContentParts,
    /// A call's `arguments` was a JSON object instead of a string.
    ArgumentsAsObject,
    /// A call had no id, or an empty one.
    MissingCallId,
    /// Two calls shared an id (within this completion).
    DuplicateCallId,
    /// `finish_reason` was not `tool_calls` although calls were present.
    FinishReasonDisagrees,
    /// A legacy `function_call` field came with the message (ignored).
    LegacyFunctionCall,
    /// A `reasoning_content` (or `reasoning`) field came with the message (ignored).
    ReasoningContent,
    /// The choice had no `finish_reason`.
    FinishReasonMissing,
    /// A streamed tool-call delta had no `index`.
    MissingDeltaIndex,
}

/// Token counts, as far as the server reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct TokenUsage {
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
    /// Total tokens (the sum when the server left it out).
    pub total_tokens: u64,
}

/// A call's arguments could not be accepted. The call must not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ArgumentsError {
    /// The arguments were missing or `null`.
    #[error("the arguments are missing")]
    Missing,
    /// Not one valid JSON document (truncated, or not JSON at all).
    #[error("the arguments are not valid JSON: {message}")]
    #[non_exhaustive]
    Syntax {
        /// The parser's description.
        message: String,
    },
    /// Valid JSON, but not an object.
    #[error("the arguments must be a JSON object, not {found}")]
    #[non_exhaustive]
    NotObject {
        /// The JSON type found.
        found: &'static str,
    },
    /// Larger than [`MAX_ARGUMENT_BYTES`].
    #[error("the arguments are {len} bytes, more than the maximum of {max}", max = MAX_ARGUMENT_BYTES)]
    #[non_exhaustive]
    TooLarge {
        /// Their length.
        len: usize,
    },
    /// Deeper than [`MAX_ARGUMENT_DEPTH`].
    #[error("the arguments nest deeper than {max} levels", max = MAX_ARGUMENT_DEPTH)]
    TooDeep,
    /// The same key twice in one object.
    #[error("the arguments repeat the key {key:?}")]
    #[non_exhaustive]
    DuplicateKey {
        /// The key (cut to 64 bytes).
        key: String,
    },
}

/// One tool call as the server proposed it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct DecodedCall {
    /// The server's id for it, if it sent a usable one (never trusted to be unique).
    pub provider_id: Option<String>,
    /// The tool name as sent, cut to [`MAX_CALL_NAME_BYTES`]; not yet checked against anything.
    pub name: String,
    /// The arguments, or why they were refused.
    pub arguments: Result<Map<String, Value>, ArgumentsError>,
}

/// The first choice of a completion, normalised.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Completion {
    /// The model's text (parts joined), if any.
    pub text: Option<String>,
    /// The tool calls, in the model's order (at most [`MAX_DECODED_CALLS`]).
    pub calls: Vec<DecodedCall>,
    /// How many further calls were dropped.
    pub dropped_calls: usize,
    /// Why generation stopped, as sent.
    pub finish_reason: Option<String>,
    /// Token usage, if reported.
    pub usage: Option<TokenUsage>,
    /// The model name the server reported.
    pub model: Option<String>,
    /// What was tolerated, each quirk once, in the order met.
    pub quirks: Vec<Quirk>,
}

impl Completion {
    /// True if generation was cut by the token limit (`finish_reason: "length"`): calls in a
    /// cut completion may be incomplete and should not run.
    #[must_use]
    pub fn truncated(&self) -> bool {
        self.finish_reason.as_deref() == Some("length")
    }
}

/// A completion could not be decoded at all.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CompletionError {
    /// The body is not one acceptable JSON document (too large, too deep, truncated, garbage).
    #[error(transparent)]
    Json(#[from] JsonError),
    /// The body carries an `error` object instead of a completion.
    #[error("the server reported an error: {message}")]
    #[non_exhaustive]
    Server {
        /// The server's message, cut to 512 bytes.
        message: String,
    },
    /// `choices` is missing or empty.
    #[error("the completion has no choices")]
    NoChoices,
    /// The first choice has no `message`.
    #[error("the first choice has no message")]
    NoMessage,
    /// The message's role is not `assistant`.
    #[error("the first choice's message has role {role:?}, not assistant")]
    #[non_exhaustive]
    NotAssistant {
        /// The role sent (cut to 32 bytes).
        role: String,
    },
}

#[derive(Deserialize)]
struct WireCompletion {
    #[serde(default)]
    choices: Option<Vec<WireChoice>>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Deserialize)]
struct WireChoice {
    #[serde(default)]
    message: Option<WireMessage>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct WireMessage {
    #[serde(default)]
    role: Option<String>,
    #[serde(default, deserialize_with = "present")]
    content: Option<Value>,
    #[serde(default)]
    tool_calls: Option<Vec<WireToolCall>>,
    #[serde(default)]
    function_call: Option<Value>,
    #[serde(default)]
    reasoning_content: Option<Value>,
    #[serde(default)]
    reasoning: Option<Value>,
}

/// Keeps an explicit `null` apart from an absent field: a present field is `Some`, even `null`.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

#[derive(Deserialize)]
struct WireToolCall {
    #[serde(default)]
    id: Option<Value>,
    #[serde(default)]
    function: Option<WireFunction>,
}

#[derive(Deserialize)]
struct WireFunction {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<WireArguments>,
}

/// A call's `arguments` as the server sent it. Read without serde_json's `RawValue` on
/// purpose: its `raw_value` feature makes every `serde_json::Value` in the program read an
/// object whose first key is `$serde_json::private::RawValue` as the JSON text of its value,
/// so the text and the parsed value of such an object differ (found by the `broker_frame`
/// fuzzer: a frame so written did not parse back), and this crate does not enable it.
enum WireArguments {
    /// A JSON string: the JSON text of the arguments, as the API specifies.
    Text(String),
    /// Any other JSON (some servers send the object itself), with the first key that an
    /// object in it repeated, if any.
    Json { value: Value, repeated: Option<String> },
}

impl<'de> Deserialize<'de> for WireArguments {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(WireArgumentsVisitor)
    }
}

struct WireArgumentsVisitor;

impl<'de> Visitor<'de> for WireArgumentsVisitor {
    type Value = WireArguments;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a call's arguments")
    }
    fn visit_str<E>(self, v: &str) -> Result<WireArguments, E> {
        Ok(WireArguments::Text(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<WireArguments, E> {
        Ok(WireArguments::Text(v))
    }
    fn visit_bool<E>(self, v: bool) -> Result<WireArguments, E> {
        Ok(WireArguments::Json { value: Value::Bool(v), repeated: None })
    }
    fn visit_i64<E>(self, v: i64) -> Result<WireArguments, E> {
        Ok(WireArguments::Json { value: Value::from(v), repeated: None })
    }
    fn visit_u64<E>(self, v: u64) -> Result<WireArguments, E> {
        Ok(WireArguments::Json { value: Value::from(v), repeated: None })
    }
    fn visit_f64<E>(self, v: f64) -> Result<WireArguments, E> {
        Ok(WireArguments::Json { value: Value::from(v), repeated: None })
    }
    fn visit_unit<E>(self) -> Result<WireArguments, E> {
        Ok(WireArguments::Json { value: Value::Null, repeated: None })
    }
    fn visit_none<E>(self) -> Result<WireArguments, E> {
        Ok(WireArguments::Json { value: Value::Null, repeated: None })
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<WireArguments, A::Error> {
        let repeated = RefCell::new(None);
        let value = StrictVisitor { repeated: Some(&repeated) }.visit_seq(seq)?;
        Ok(WireArguments::Json { value, repeated: repeated.into_inner() })
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<WireArguments, A::Error> {
        let repeated = RefCell::new(None);
        let value = StrictVisitor { repeated: Some(&repeated) }.visit_map(map)?;
        Ok(WireArguments::Json { value, repeated: repeated.into_inner() })
    }
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    total_tokens: Option<u64>,
}

/// Decodes a completion body (at most [`MAX_CHAT_BYTES`], checked before parsing).
pub fn decode_completion(bytes: &[u8]) -> Result<Completion, CompletionError> {
    let wire: WireCompletion = parse_untrusted(bytes, JsonLimits::new(MAX_CHAT_BYTES, MAX_JSON_DEPTH))?;
    if let Some(message) = server_error(wire.error) {
        return Err(CompletionError::Server { message });
    }
    let choice = wire.choices.and_then(|c| c.into_iter().next()).ok_or(CompletionError::NoChoices)?;
    let message = choice.message.ok_or(CompletionError::NoMessage)?;
    if let Some(role) = message.role.as_deref().filter(|r| *r != "assistant") {
        return Err(CompletionError::NotAssistant { role: cut(role, 32) });
    }
    let mut quirks = Quirks::default();
    let text = match message.content {
        None => {
            quirks.add(Quirk::ContentMissing);
            None
        }
        Some(Value::Null) => {
            quirks.add(Quirk::ContentNull);
            None
        }
        Some(Value::String(s)) => Some(s),
        Some(Value::Array(parts)) => {
            quirks.add(Quirk::ContentParts);
            let texts: Vec<&str> = parts
                .iter()
                .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect();
            Some(texts.concat())
        }
        // A number or an object as content is not text; keep it visible as JSON text.
        Some(other) => Some(other.to_string()),
    };
    if message.function_call.is_some_and(|f| !f.is_null()) {
        quirks.add(Quirk::LegacyFunctionCall);
    }
    if message.reasoning_content.is_some_and(|r| !r.is_null()) || message.reasoning.is_some_and(|r| !r.is_null()) {
        quirks.add(Quirk::ReasoningContent);
    }
    let wire_calls = message.tool_calls.unwrap_or_default();
    let dropped_calls = wire_calls.len().saturating_sub(MAX_DECODED_CALLS);
    let mut seen_ids: Vec<String> = Vec::new();
    let mut calls = Vec::with_capacity(wire_calls.len().min(MAX_DECODED_CALLS));
    for wc in wire_calls.into_iter().take(MAX_DECODED_CALLS) {
        let provider_id = provider_id(wc.id);
        quirks.note_id(&provider_id, &mut seen_ids);
        let (name, raw) = match wc.function {
            Some(f) => (f.name.unwrap_or_default(), f.arguments),
            None => (String::new(), None),
        };
        let arguments = match raw {
            None => Err(ArgumentsError::Missing),
            Some(wire) => decode_arguments_wire(wire, &mut quirks),
        };
        calls.push(DecodedCall { provider_id, name: cut(&name, MAX_CALL_NAME_BYTES), arguments });
    }
    quirks.note_finish(choice.finish_reason.as_deref(), !calls.is_empty());
    let usage = wire.usage.map(WireUsage::tokens);
    Ok(Completion {
        text,
        calls,
        dropped_calls,
        finish_reason: choice.finish_reason,
        usage,
        model: wire.model,
        quirks: quirks.0,
    })
}

/// An `arguments` field: a string holding JSON, or JSON itself, under the same caps.
fn decode_arguments_wire(wire: WireArguments, quirks: &mut Quirks) -> Result<Map<String, Value>, ArgumentsError> {
    let (value, repeated) = match wire {
        WireArguments::Text(text) => return parse_arguments(&text),
        WireArguments::Json { value: Value::Null, .. } => return Err(ArgumentsError::Missing),
        WireArguments::Json { value, repeated } => (value, repeated),
    };
    quirks.add(Quirk::ArgumentsAsObject);
    let len = serde_json::to_string(&value).map_or(usize::MAX, |t| t.len());
    if len > MAX_ARGUMENT_BYTES {
        return Err(ArgumentsError::TooLarge { len });
    }
    if value_depth(&value) > MAX_ARGUMENT_DEPTH {
        return Err(ArgumentsError::TooDeep);
    }
    if let Some(key) = repeated {
        return Err(ArgumentsError::DuplicateKey { key: cut(&key, 64) });
    }
    match value {
        Value::Object(map) => Ok(map),
        other => Err(ArgumentsError::NotObject { found: json_type(&other) }),
    }
}

/// How deeply arrays and objects nest in `v`, counted as [`nesting_depth`] counts text.
fn value_depth(v: &Value) -> usize {
    match v {
        Value::Array(items) => 1 + items.iter().map(value_depth).max().unwrap_or(0),
        Value::Object(map) => 1 + map.values().map(value_depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// Parses one call's arguments: one JSON object, bounded in bytes and depth, no duplicate keys.
pub fn parse_arguments(text: &str) -> Result<Map<String, Value>, ArgumentsError> {
    if text.len() > MAX_ARGUMENT_BYTES {
        return Err(ArgumentsError::TooLarge { len: text.len() });
    }
    // An empty string is how some servers say "no arguments".
    if text.trim().is_empty() {
        return Ok(Map::new());
    }
    if nesting_depth(text.as_bytes()) > MAX_ARGUMENT_DEPTH {
        return Err(ArgumentsError::TooDeep);
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let value = match (StrictValue { repeated: None }).deserialize(&mut de).and_then(|v| de.end().map(|()| v)) {
        Ok(v) => v,
        Err(e) => {
            let message = e.to_string();
            return Err(match message.strip_prefix(DUPLICATE_PREFIX) {
                Some(rest) => ArgumentsError::DuplicateKey {
                    key: cut(rest.split(DUPLICATE_SUFFIX).next().unwrap_or_default(), 64),
                },
                None => ArgumentsError::Syntax { message: cut(&message, 256) },
            });
        }
    };
    match value {
        Value::Object(map) => Ok(map),
        other => Err(ArgumentsError::NotObject { found: json_type(&other) }),
    }
}

const DUPLICATE_PREFIX: &str = "\u{0}duplicate key\u{0}";
const DUPLICATE_SUFFIX: &str = "\u{0}end\u{0}";

/// Deserializes a [`Value`] but refuses a repeated key in any object, or, given a place to
/// record it, records the first one and goes on. It never treats a key as special, as
/// serde_json's own `Value` does under its `raw_value` feature.
#[derive(Clone, Copy)]
struct StrictValue<'a> {
    repeated: Option<&'a RefCell<Option<String>>>,
}

impl<'de> DeserializeSeed<'de> for StrictValue<'_> {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(StrictVisitor { repeated: self.repeated })
    }
}

#[derive(Clone, Copy)]
struct StrictVisitor<'a> {
    repeated: Option<&'a RefCell<Option<String>>>,
}

impl<'de> Visitor<'de> for StrictVisitor<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(v) = seq.next_element_seed(StrictValue { repeated: self.repeated })? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                match self.repeated {
                    None => return Err(de::Error::custom(format!("{DUPLICATE_PREFIX}{key}{DUPLICATE_SUFFIX}"))),
                    Some(first) => {
                        first.borrow_mut().get_or_insert(key.clone());
                    }
                }
            }
            let value = map.next_value_seed(StrictValue { repeated: self.repeated })?;
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// `s` cut to at most `max` bytes at a character boundary.
#[must_use]
pub fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

#[derive(Default)]
struct Quirks(Vec<Quirk>);

impl Quirks {
    fn add(&mut self, q: Quirk) {
        if !self.0.contains(&q) {
            self.0.push(q);
        }
    }

    /// Records a missing or repeated call id.
    fn note_id(&mut self, id: &Option<String>, seen: &mut Vec<String>) {
        match id {
            None => self.add(Quirk::MissingCallId),
            Some(id) if seen.contains(id) => self.add(Quirk::DuplicateCallId),
            Some(id) => seen.push(id.clone()),
        }
    }

    /// Records a missing `finish_reason`, or one that disagrees with the calls present.
    fn note_finish(&mut self, finish_reason: Option<&str>, has_calls: bool) {
        match finish_reason {
            None => self.add(Quirk::FinishReasonMissing),
            Some(r) if has_calls && r != "tool_calls" && r != "function_call" && r != "length" => {
                self.add(Quirk::FinishReasonDisagrees);
            }
            Some(_) => {}
        }
    }
}

impl WireUsage {
    fn tokens(self) -> TokenUsage {
        let prompt_tokens = self.prompt_tokens.unwrap_or(0);
        let completion_tokens = self.completion_tokens.unwrap_or(0);
        TokenUsage {
            prompt_tokens,
            completion_tokens,
            total_tokens: self.total_tokens.unwrap_or(prompt_tokens.saturating_add(completion_tokens)),
        }
    }
}

/// A usable provider call id: a non-empty string of at most [`MAX_PROVIDER_ID_BYTES`], or a number.
fn provider_id(id: Option<Value>) -> Option<String> {
    match id {
        Some(Value::String(s)) if !s.is_empty() && s.len() <= MAX_PROVIDER_ID_BYTES => Some(s),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
    }
}

/// The message of an `error` object (cut to 512 bytes), if one is present.
fn server_error(error: Option<Value>) -> Option<String> {
    let err = error.filter(|e| !e.is_null())?;
    let message = err.get("message").and_then(Value::as_str).map_or_else(|| err.to_string(), str::to_owned);
    Some(cut(&message, 512))
}

/// Longest server-sent-events line: 1 MiB. A streamed chunk is a few hundred bytes; a longer
/// line is refused before it is buffered whole.
pub const MAX_SSE_LINE_BYTES: usize = 1 << 20;

/// A streamed completion could not be assembled.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// A line is longer than [`MAX_SSE_LINE_BYTES`].
    #[error("a streamed line is longer than {max} bytes", max = MAX_SSE_LINE_BYTES)]
    LineTooLong,
    /// The text and arguments together outgrew [`MAX_CHAT_BYTES`].
    #[error("the streamed completion is larger than {max} bytes", max = MAX_CHAT_BYTES)]
    TooLarge,
    /// An event's data is not an acceptable chunk.
    #[error("a streamed chunk is not acceptable: {0}")]
    Json(#[from] JsonError),
    /// The stream carried an `error` object.
    #[error("the server reported an error mid-stream: {message}")]
    #[non_exhaustive]
    Server {
        /// The server's message, cut to 512 bytes.
        message: String,
    },
    /// The stream ended before `[DONE]` or a `finish_reason`.
    #[error("the stream ended before the completion did")]
    Incomplete,
    /// Data arrived after `[DONE]`.
    #[error("data arrived after [DONE]")]
    AfterDone,
}

#[derive(Deserialize)]
struct WireChunk {
    #[serde(default)]
    choices: Option<Vec<WireDeltaChoice>>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Deserialize)]
struct WireDeltaChoice {
    #[serde(default)]
    delta: Option<WireDelta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct WireDelta {
    #[serde(default)]
    content: Option<Value>,
    #[serde(default)]
    tool_calls: Option<Vec<WireDeltaCall>>,
    #[serde(default)]
    function_call: Option<Value>,
    #[serde(default)]
    reasoning_content: Option<Value>,
}

#[derive(Deserialize)]
struct WireDeltaCall {
    #[serde(default)]
    index: Option<usize>,
    #[serde(default)]
    id: Option<Value>,
    #[serde(default)]
    function: Option<WireDeltaFunction>,
}

#[derive(Deserialize)]
struct WireDeltaFunction {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<Value>,
}

#[derive(Debug, Default)]
struct PartialCall {
    index: Option<usize>,
    provider_id: Option<String>,
    name: String,
    arguments: String,
}

/// Assembles a streamed completion (`text/event-stream` of `chat.completion.chunk`s) from
/// bytes as they arrive, with no I/O of its own: [`StreamAssembler::push`] returns the text
/// pieces to show, [`StreamAssembler::finish`] the [`Completion`], decoded with the same rules
/// as [`decode_completion`].
///
/// Tool-call deltas are joined by their `index`; a delta without one continues the last call,
/// unless it carries a new id (a missing index on a single call is tolerated; the quirk is
/// recorded). A first index other than 0 is fine. Empty continuation ids are ignored. Lines
/// are capped at [`MAX_SSE_LINE_BYTES`] and the whole completion at [`MAX_CHAT_BYTES`].
#[derive(Debug, Default)]
pub struct StreamAssembler {
    line: Vec<u8>,
    data: String,
    text: Option<String>,
    calls: Vec<PartialCall>,
    dropped_calls: usize,
    finish_reason: Option<String>,
    usage: Option<TokenUsage>,
    model: Option<String>,
    quirks: Quirks,
    bytes: usize,
    done: bool,
}

impl fmt::Debug for Quirks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl StreamAssembler {
    /// An empty assembler.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether `[DONE]` was seen.
    #[must_use]
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Feeds bytes; returns the text pieces that arrived (to print as they come).
    pub fn push(&mut self, mut bytes: &[u8]) -> Result<Vec<String>, StreamError> {
        let mut shown = Vec::new();
        while !bytes.is_empty() {
            let (segment, rest, ended) = match bytes.iter().position(|&b| b == b'\n') {
                Some(i) => (&bytes[..i], &bytes[i + 1..], true),
                None => (bytes, &[][..], false),
            };
            if self.line.len() + segment.len() > MAX_SSE_LINE_BYTES {
                return Err(StreamError::LineTooLong);
            }
            self.line.extend_from_slice(segment);
            bytes = rest;
            if ended {
                let line = std::mem::take(&mut self.line);
                self.line_done(&line, &mut shown)?;
            }
        }
        Ok(shown)
    }

    fn line_done(&mut self, line: &[u8], shown: &mut Vec<String>) -> Result<(), StreamError> {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            return self.dispatch(shown);
        }
        let text = String::from_utf8_lossy(line);
        if let Some(value) = text.strip_prefix("data:") {
            if !self.data.is_empty() {
                self.data.push('\n');
            }
            self.data.push_str(value.strip_prefix(' ').unwrap_or(value));
            if self.data.len() > MAX_SSE_LINE_BYTES {
                return Err(StreamError::LineTooLong);
            }
        }
        // Comments (`:`) and the `event`, `id` and `retry` fields carry nothing we use.
        Ok(())
    }

    fn dispatch(&mut self, shown: &mut Vec<String>) -> Result<(), StreamError> {
        let data = std::mem::take(&mut self.data);
        if data.trim().is_empty() {
            return Ok(());
        }
        if self.done {
            return Err(StreamError::AfterDone);
        }
        if data.trim() == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        let chunk: WireChunk = parse_untrusted(data.as_bytes(), JsonLimits::new(MAX_SSE_LINE_BYTES, MAX_JSON_DEPTH))?;
        if let Some(message) = server_error(chunk.error) {
            return Err(StreamError::Server { message });
        }
        if chunk.model.is_some() {
            self.model = chunk.model;
        }
        if let Some(u) = chunk.usage {
            self.usage = Some(u.tokens());
        }
        let Some(choice) = chunk.choices.and_then(|c| c.into_iter().next()) else { return Ok(()) };
        if choice.finish_reason.is_some() {
            self.finish_reason = choice.finish_reason;
        }
        let Some(delta) = choice.delta else { return Ok(()) };
        if delta.function_call.is_some_and(|f| !f.is_null()) {
            self.quirks.add(Quirk::LegacyFunctionCall);
        }
        if delta.reasoning_content.is_some_and(|r| !r.is_null()) {
            self.quirks.add(Quirk::ReasoningContent);
        }
        if let Some(Value::String(piece)) = delta.content
            && !piece.is_empty()
        {
            self.grow(piece.len())?;
            self.text.get_or_insert_with(String::new).push_str(&piece);
            shown.push(piece);
        }
        for d in delta.tool_calls.unwrap_or_default() {
            self.apply(d)?;
        }
        Ok(())
    }

    fn grow(&mut self, n: usize) -> Result<(), StreamError> {
        self.bytes = self.bytes.saturating_add(n);
        if self.bytes > MAX_CHAT_BYTES { Err(StreamError::TooLarge) } else { Ok(()) }
    }

    fn apply(&mut self, d: WireDeltaCall) -> Result<(), StreamError> {
        let id = provider_id(d.id);
        let pos = match d.index {
            Some(i) => self.calls.iter().position(|c| c.index == Some(i)),
            None => {
                self.quirks.add(Quirk::MissingDeltaIndex);
                match (&id, self.calls.last()) {
                    (Some(id), Some(last)) if last.provider_id.as_ref().is_some_and(|l| l != id) => None,
                    (_, Some(_)) => Some(self.calls.len() - 1),
                    (_, None) => None,
                }
            }
        };
        let pos = match pos {
            Some(p) => p,
            None if self.calls.len() >= MAX_DECODED_CALLS => {
                self.dropped_calls += 1;
                return Ok(());
            }
            None => {
                self.calls.push(PartialCall { index: d.index, ..PartialCall::default() });
                self.calls.len() - 1
            }
        };
        let (name, arguments) = match d.function {
            Some(f) => (f.name, f.arguments),
            None => (None, None),
        };
        let added = name.as_ref().map_or(0, String::len)
            + match &arguments {
                Some(Value::String(s)) => s.len(),
                Some(other) => other.to_string().len(),
                None => 0,
            };
        self.grow(added)?;
        let call = &mut self.calls[pos];
        if call.provider_id.is_none() {
            call.provider_id = id;
        }
        if let Some(n) = name {
            call.name.push_str(&n);
        }
        match arguments {
            Some(Value::String(s)) => call.arguments.push_str(&s),
            Some(Value::Null) | None => {}
            Some(other) => {
                self.quirks.add(Quirk::ArgumentsAsObject);
                call.arguments.push_str(&other.to_string());
            }
        }
        Ok(())
    }

    /// The assembled completion. A stream that ended with neither `[DONE]` nor a
    /// `finish_reason` is [`StreamError::Incomplete`].
    pub fn finish(mut self) -> Result<Completion, StreamError> {
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            let mut ignored = Vec::new();
            self.line_done(&line, &mut ignored)?;
        }
        let mut ignored = Vec::new();
        self.dispatch(&mut ignored)?;
        if !self.done && self.finish_reason.is_none() {
            return Err(StreamError::Incomplete);
        }
        let mut quirks = self.quirks;
        let mut seen: Vec<String> = Vec::new();
        let calls: Vec<DecodedCall> = self
            .calls
            .into_iter()
            .map(|c| {
                quirks.note_id(&c.provider_id, &mut seen);
                DecodedCall {
                    provider_id: c.provider_id,
                    name: cut(&c.name, MAX_CALL_NAME_BYTES),
                    arguments: parse_arguments(&c.arguments),
                }
            })
            .collect();
        quirks.note_finish(self.finish_reason.as_deref(), !calls.is_empty());
        Ok(Completion {
            text: self.text,
            calls,
            dropped_calls: self.dropped_calls,
            finish_reason: self.finish_reason,
            usage: self.usage,
            model: self.model,
            quirks: quirks.0,
        })
    }
}
