//! OpenAI-compatible chat-completions types, with a strict validator for model traffic.
//!
//! A model's output is attacker-influenced (prompt injection reaches it), and so is a
//! remote endpoint. Every struct here denies unknown keys, and [`ChatRequest::validate`] and
//! [`ChatResponse::validate`] enforce the counts, names and schema references below before
//! anything acts on a message.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::json::{JsonError, JsonLimits, parse_untrusted};

/// Most messages in one conversation: 128.
pub const MAX_MESSAGES: usize = 128;
/// Most tool calls in one assistant message: 8.
///
/// Each call is a side effect to authorise; a model that emits hundreds at once is either
/// broken or attacked.
pub const MAX_TOOL_CALLS: usize = 8;
/// Most tools offered in one request: 128.
pub const MAX_TOOLS: usize = 128;
/// Longest tool name: 64 characters of `[a-zA-Z0-9_-]`.
pub const MAX_TOOL_NAME_LEN: usize = 64;
/// Longest `tool_call_id`: 128 characters.
pub const MAX_TOOL_CALL_ID_LEN: usize = 128;
/// Deepest schema nesting the reference check walks: 64.
///
/// The JSON depth cap bounds parsed documents; this bound also covers values built in code.
pub const MAX_SCHEMA_DEPTH: usize = 64;
/// Largest chat document accepted from the wire: 8 MiB.
pub const MAX_CHAT_BYTES: usize = 8 << 20;

/// A message author.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The host's instructions.
    System,
    /// The host's instructions, as newer OpenAI models name them.
    Developer,
    /// The user.
    User,
    /// The model.
    Assistant,
    /// A tool's result.
    Tool,
}

/// The content of a message: plain text or a list of text parts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Text parts.
    Parts(Vec<ContentPart>),
}

/// One content part. Only text parts are accepted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum ContentPart {
    /// A piece of text.
    Text {
        /// The text.
        text: String,
    },
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ChatMessage {
    /// Who wrote it.
    pub role: Role,
    /// The text, absent on some assistant messages that only call tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Content>,
    /// An optional participant name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Tool calls (assistant messages only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// The call this message answers (tool messages only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A refusal text some servers send on assistant messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<String>,
    /// Annotations some servers send on assistant messages; kept opaque.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<Value>,
    /// A reasoning model's thinking, which clients send back in the history (vLLM and
    /// Ollama name it `reasoning_content` or `reasoning`): accepted on assistant messages,
    /// at most [`MAX_REASONING_BYTES`], and never sent on (the model does not need its old
    /// thoughts, and a rebuilt request carries only what it must).
    #[serde(default, skip_serializing)]
    reasoning_content: Option<String>,
    #[serde(default, skip_serializing)]
    reasoning: Option<String>,
}

impl ChatMessage {
    /// A message from `role` with text `content`.
    #[must_use]
    pub fn text(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: Some(Content::Text(content.into())),
            name: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            refusal: None,
            annotations: None,
            reasoning_content: None,
            reasoning: None,
        }
    }

    /// A tool message answering call `tool_call_id` with `content`.
    #[must_use]
    pub fn tool_result(tool_call_id: impl Into<String>, content: impl Into<String>) -> Self {
        Self { tool_call_id: Some(tool_call_id.into()), ..Self::text(Role::Tool, content) }
    }
}

/// The only tool kind: a function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolKind {
    /// A function tool.
    Function,
}

/// A tool call emitted by the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ToolCall {
    /// The call's id, 1 to [`MAX_TOOL_CALL_ID_LEN`] characters.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: ToolKind,
    /// The function and its arguments.
    pub function: FunctionCall,
}

/// The function half of a tool call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct FunctionCall {
    /// The tool's name.
    pub name: String,
    /// The arguments as a JSON *string*, to be parsed (and possibly refused) separately.
    pub arguments: String,
}

impl ToolCall {
    /// A function call with `id`, `name` and JSON `arguments`.
    #[must_use]
    pub fn function(id: impl Into<String>, name: impl Into<String>, arguments: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            kind: ToolKind::Function,
            function: FunctionCall { name: name.into(), arguments: arguments.into() },
        }
    }
}

/// A tool offered to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Tool {
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: ToolKind,
    /// The function's definition.
    pub function: FunctionDef,
    /// `strict` beside `type` and `function`, as vLLM's tests send it: moved into
    /// [`FunctionDef::strict`] by [`ChatRequest::parse`], never sent here.
    #[serde(default, skip_serializing)]
    strict: Option<bool>,
}

/// A function tool's definition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct FunctionDef {
    /// The name, matching `^[a-zA-Z0-9_-]{1,64}$`.
    pub name: String,
    /// What it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// A JSON Schema of the arguments; references must be local (`#...`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    /// Whether the server should enforce the schema.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

impl Tool {
    /// A function tool.
    #[must_use]
    pub fn function(name: impl Into<String>, description: impl Into<String>, parameters: Value) -> Self {
        Self {
            kind: ToolKind::Function,
            function: FunctionDef {
                name: name.into(),
                description: Some(description.into()),
                parameters: Some(parameters),
                strict: None,
            },
            strict: None,
        }
    }
}

/// A chat-completions request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ChatRequest {
    /// The model name (llama.cpp's server accepts requests without one; absent is empty).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub model: String,
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// Tools offered (`null`, as llama.cpp's tests send it, is none).
    #[serde(default, deserialize_with = "null_as_empty", skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<Tool>,
    /// `auto`, `none`, `required`, or a named tool; kept opaque.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<Value>,
    /// Sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Largest completion in tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Server-sent events instead of one body (decoded by
    /// [`completion::StreamAssembler`](crate::completion::StreamAssembler)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Streaming options (`include_usage`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    /// Sampling seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
    /// Whether the model may call several tools in one turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    /// Largest completion in tokens (the newer name of `max_tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<u32>,
    /// Nucleus sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Stop sequences: one string or at most [`MAX_STOP`] strings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Stop>,
    /// Completions to generate: 1 to [`MAX_CHOICES`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u32>,
    /// The answer's format: text, a JSON object, or JSON with a schema (local refs only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<ResponseFormat>,
    /// Return log probabilities.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<bool>,
    /// How many top log probabilities per token: 0 to 20.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<u32>,
    /// An end-user id (at most [`MAX_SHORT_TEXT`] bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// String pairs for the caller's bookkeeping (at most 16, keys 64 and values 512 bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<std::collections::BTreeMap<String, String>>,
    /// How hard a reasoning model thinks: `none`, `minimal`, `low`, `medium`, `high`, `xhigh`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_effort: Option<String>,
    /// Frequency penalty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f64>,
    /// Presence penalty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f64>,
    /// Top-k sampling of the local servers (llama.cpp, vLLM, Ollama): 0 (off) to
    /// [`MAX_TOP_K`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u32>,
    /// Min-p sampling (llama.cpp, vLLM): 0 to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f64>,
    /// Locally typical sampling (llama.cpp): 0 to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub typical_p: Option<f64>,
    /// Repetition penalty (llama.cpp, Ollama): 0 to [`MAX_REPEAT_PENALTY`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeat_penalty: Option<f64>,
    /// Fields accepted and dropped: they change only how the provider bills, stores, caches or
    /// logs the request (`store`, `service_tier`, `prompt_cache_key`, `safety_identifier`,
    /// `verbosity`) or biases tokens (`logit_bias`), and a rebuilt request never carries them.
    #[serde(default, skip_serializing)]
    store: Option<Value>,
    #[serde(default, skip_serializing)]
    service_tier: Option<Value>,
    #[serde(default, skip_serializing)]
    prompt_cache_key: Option<Value>,
    #[serde(default, skip_serializing)]
    safety_identifier: Option<Value>,
    #[serde(default, skip_serializing)]
    verbosity: Option<Value>,
    #[serde(default, skip_serializing)]
    logit_bias: Option<Value>,
}

/// Largest `top_k`: 1000 (llama.cpp's and vLLM's vocabularies are larger, but no sampler
/// needs more candidates than this).
pub const MAX_TOP_K: u32 = 1000;
/// Largest `repeat_penalty`: 10 (1 is off; llama.cpp's default is 1.1).
pub const MAX_REPEAT_PENALTY: f64 = 10.0;
/// Longest reasoning text on one history message: 256 KiB.
pub const MAX_REASONING_BYTES: usize = 256 << 10;

/// `null` as an empty list.
fn null_as_empty<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

/// Most stop sequences: 4 (OpenAI's bound).
pub const MAX_STOP: usize = 4;
/// Most completions per request: 8.
pub const MAX_CHOICES: u32 = 8;
/// Longest short text field (a stop sequence, a user id, a schema name): 256 bytes.
pub const MAX_SHORT_TEXT: usize = 256;

/// Stop sequences.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// One sequence.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// The format of the answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum ResponseFormat {
    /// Plain text.
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON matching a schema.
    JsonSchema {
        /// The schema and its name.
        json_schema: JsonSchemaFormat,
    },
}

/// A named JSON Schema for the answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct JsonSchemaFormat {
    /// Its name, matching `^[a-zA-Z0-9_-]{1,64}$`.
    pub name: String,
    /// What it is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The schema; references must be local.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<Value>,
    /// Whether the server should enforce it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

impl ChatRequest {
    /// A request for `model` with `messages` and no tools.
    #[must_use]
    pub fn new(model: impl Into<String>, messages: Vec<ChatMessage>) -> Self {
        Self {
            model: model.into(),
            messages,
            tools: Vec::new(),
            tool_choice: None,
            temperature: None,
            max_tokens: None,
            stream: None,
            stream_options: None,
            seed: None,
            parallel_tool_calls: None,
            max_completion_tokens: None,
            top_p: None,
            stop: None,
            n: None,
            response_format: None,
            logprobs: None,
            top_logprobs: None,
            user: None,
            metadata: None,
            reasoning_effort: None,
            frequency_penalty: None,
            presence_penalty: None,
            top_k: None,
            min_p: None,
            typical_p: None,
            repeat_penalty: None,
            store: None,
            service_tier: None,
            prompt_cache_key: None,
            safety_identifier: None,
            verbosity: None,
            logit_bias: None,
        }
    }
}

/// Options of a streamed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct StreamOptions {
    /// Ask for a last chunk carrying the usage.
    #[serde(default)]
    pub include_usage: bool,
}

impl StreamOptions {
    /// `include_usage: true`.
    #[must_use]
    pub fn with_usage() -> Self {
        Self { include_usage: true }
    }
}

/// Token usage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
    /// Total tokens.
    pub total_tokens: u64,
    /// Per-kind breakdown some servers send; kept opaque.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<Value>,
    /// Per-kind breakdown some servers send; kept opaque.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_tokens_details: Option<Value>,
}

/// One completion choice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Choice {
    /// Its index.
    pub index: u32,
    /// The model's message.
    pub message: ChatMessage,
    /// Why generation stopped (`stop`, `length`, `tool_calls`, ...).
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// Log probabilities; kept opaque.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Value>,
}

/// A chat-completions response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ChatResponse {
    /// The completion id.
    pub id: String,
    /// Always `chat.completion`.
    pub object: String,
    /// Creation time, seconds since the epoch.
    pub created: u64,
    /// The model that answered.
    pub model: String,
    /// The choices.
    pub choices: Vec<Choice>,
    /// Token usage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// A server fingerprint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_fingerprint: Option<String>,
    /// The service tier some servers report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_tier: Option<String>,
}

/// Chat traffic was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChatError {
    /// The document is not acceptable JSON for this type.
    #[error(transparent)]
    Json(#[from] JsonError),
    /// Too many of something.
    #[error("{what}: {len} is more than the maximum of {max}")]
    #[non_exhaustive]
    TooMany {
        /// What was counted.
        what: &'static str,
        /// The count.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// A tool name does not match `^[a-zA-Z0-9_-]{1,64}$`.
    #[error("invalid tool name {name:?}")]
    #[non_exhaustive]
    ToolName {
        /// The name.
        name: String,
    },
    /// Two tools share a name.
    #[error("tool {name:?} is defined twice")]
    #[non_exhaustive]
    DuplicateTool {
        /// The name.
        name: String,
    },
    /// A `tool_call_id` or tool call id is empty or longer than [`MAX_TOOL_CALL_ID_LEN`].
    #[error("message {message}: tool call id of {len} characters is outside 1..={max}", max = MAX_TOOL_CALL_ID_LEN)]
    #[non_exhaustive]
    ToolCallId {
        /// Index of the message.
        message: usize,
        /// Its length in characters.
        len: usize,
    },
    /// A field appears on a role that must not carry it (e.g. `tool_calls` on a user message).
    #[error("message {message}: a {role:?} message cannot carry `{field}`")]
    #[non_exhaustive]
    Misplaced {
        /// Index of the message.
        message: usize,
        /// Its role.
        role: Role,
        /// The field.
        field: &'static str,
    },
    /// A tool message lacks its `tool_call_id`. A `name` alone (Ollama's form) is not taken
    /// for one: two calls of one tool in a turn would answer each other, and the
    /// OpenAI-compatible servers the request goes on to need the id.
    #[error("message {message}: a tool message needs a tool_call_id (the id of the call it answers){}", if *named { "; a tool name alone cannot say which call of that tool it answers" } else { "" })]
    #[non_exhaustive]
    MissingToolCallId {
        /// Index of the message.
        message: usize,
        /// Whether it named its tool instead.
        named: bool,
    },
    /// A schema reference keyword points outside the document.
    #[error("tool {tool:?}: `{keyword}` at {pointer} must be a local `#...` reference")]
    #[non_exhaustive]
    NonLocalRef {
        /// The tool.
        tool: String,
        /// The keyword (`$ref`, `$id`, `$dynamicRef`).
        keyword: String,
        /// JSON pointer to the schema holding it.
        pointer: String,
    },
    /// A field's value is out of its bounds or not one of its forms.
    #[error("{field}: {reason}")]
    #[non_exhaustive]
    Field {
        /// The field.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A tool schema nests deeper than [`MAX_SCHEMA_DEPTH`].
    #[error("tool {tool:?}: schema nests deeper than {max} levels", max = MAX_SCHEMA_DEPTH)]
    #[non_exhaustive]
    SchemaTooDeep {
        /// The tool.
        tool: String,
    },
}

fn too_many(what: &'static str, len: usize, max: usize) -> Result<(), ChatError> {
    if len > max {
        return Err(ChatError::TooMany { what, len, max });
    }
    Ok(())
}

/// `tool_choice`: `none`, `auto`, `required`, a named function, or an allowed-tools list of
/// functions.
fn check_tool_choice(choice: &Value) -> Result<(), ChatError> {
    let bad = |reason: &str| Err(ChatError::Field { field: "tool_choice", reason: reason.to_owned() });
    let named = |v: &Value| {
        v.get("type").and_then(Value::as_str) == Some("function")
            && v.pointer("/function/name").and_then(Value::as_str).is_some_and(is_valid_tool_name)
    };
    match choice {
        Value::String(s) if ["none", "auto", "required"].contains(&s.as_str()) => Ok(()),
        Value::Object(o) if named(choice) && o.len() == 2 => Ok(()),
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("allowed_tools") => {
            let at = o.get("allowed_tools");
            let mode_ok =
                at.and_then(|a| a.get("mode")).and_then(Value::as_str).is_some_and(|m| m == "auto" || m == "required");
            let tools = at.and_then(|a| a.get("tools")).and_then(Value::as_array);
            match tools {
                Some(t) if mode_ok && t.len() <= MAX_TOOLS && t.iter().all(named) => Ok(()),
                _ => bad("allowed_tools needs a mode (auto or required) and function tools by name"),
            }
        }
        _ => bad("must be none, auto, required, a function by name, or allowed_tools of functions"),
    }
}

fn cut_text(s: &str) -> String {
    s.chars().take(32).collect()
}

/// True if `name` matches `^[a-zA-Z0-9_-]{1,64}$`.
#[must_use]
pub fn is_valid_tool_name(name: &str) -> bool {
    (1..=MAX_TOOL_NAME_LEN).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn check_tool_name(name: &str) -> Result<(), ChatError> {
    if is_valid_tool_name(name) { Ok(()) } else { Err(ChatError::ToolName { name: name.to_owned() }) }
}

fn check_call_id(message: usize, id: &str) -> Result<(), ChatError> {
    let len = id.chars().count();
    if (1..=MAX_TOOL_CALL_ID_LEN).contains(&len) { Ok(()) } else { Err(ChatError::ToolCallId { message, len }) }
}

fn check_messages(messages: &[ChatMessage]) -> Result<(), ChatError> {
    too_many("messages", messages.len(), MAX_MESSAGES)?;
    messages.iter().enumerate().try_for_each(|(i, m)| check_message(i, m))
}

fn check_message(i: usize, m: &ChatMessage) -> Result<(), ChatError> {
    let misplaced = |field| ChatError::Misplaced { message: i, role: m.role, field };
    if !m.tool_calls.is_empty() && m.role != Role::Assistant {
        return Err(misplaced("tool_calls"));
    }
    too_many("tool calls in one message", m.tool_calls.len(), MAX_TOOL_CALLS)?;
    for call in &m.tool_calls {
        check_call_id(i, &call.id)?;
        check_tool_name(&call.function.name)?;
    }
    for (field, text) in [("reasoning_content", &m.reasoning_content), ("reasoning", &m.reasoning)] {
        match text {
            Some(_) if m.role != Role::Assistant => return Err(misplaced(field)),
            Some(t) if t.len() > MAX_REASONING_BYTES => {
                return Err(ChatError::TooMany { what: "bytes of reasoning", len: t.len(), max: MAX_REASONING_BYTES });
            }
            _ => {}
        }
    }
    match (m.role, &m.tool_call_id) {
        (Role::Tool, Some(id)) => check_call_id(i, id),
        (Role::Tool, None) => Err(ChatError::MissingToolCallId { message: i, named: m.name.is_some() }),
        (_, Some(_)) => Err(misplaced("tool_call_id")),
        (_, None) => Ok(()),
    }
}

impl ChatRequest {
    /// Checks every rule in the module docs. Call it on any request before it is sent.
    pub fn validate(&self) -> Result<(), ChatError> {
        check_messages(&self.messages)?;
        too_many("tools", self.tools.len(), MAX_TOOLS)?;
        let mut seen = HashSet::new();
        for tool in &self.tools {
            let name = &tool.function.name;
            check_tool_name(name)?;
            if !seen.insert(name.as_str()) {
                return Err(ChatError::DuplicateTool { name: name.clone() });
            }
            if let Some(schema) = &tool.function.parameters {
                check_schema_refs(name, schema)?;
            }
        }
        self.check_fields()
    }

    fn check_fields(&self) -> Result<(), ChatError> {
        let bad = |field, reason: String| Err(ChatError::Field { field, reason });
        if let Some(choice) = &self.tool_choice {
            check_tool_choice(choice)?;
        }
        match &self.stop {
            Some(Stop::Many(v)) if v.len() > MAX_STOP => return bad("stop", format!("at most {MAX_STOP} sequences")),
            Some(Stop::One(s)) if s.len() > MAX_SHORT_TEXT => return bad("stop", "a sequence is too long".into()),
            Some(Stop::Many(v)) if v.iter().any(|s| s.len() > MAX_SHORT_TEXT) => {
                return bad("stop", "a sequence is too long".into());
            }
            _ => {}
        }
        if self.n.is_some_and(|n| !(1..=MAX_CHOICES).contains(&n)) {
            return bad("n", format!("must be 1 to {MAX_CHOICES}"));
        }
        if self.top_logprobs.is_some_and(|n| n > 20) {
            return bad("top_logprobs", "must be 0 to 20".into());
        }
        if self.user.as_ref().is_some_and(|u| u.len() > MAX_SHORT_TEXT) {
            return bad("user", format!("at most {MAX_SHORT_TEXT} bytes"));
        }
        if let Some(m) = &self.metadata
            && (m.len() > 16 || m.iter().any(|(k, v)| k.len() > 64 || v.len() > 512))
        {
            return bad("metadata", "at most 16 pairs, keys of 64 and values of 512 bytes".into());
        }
        if let Some(e) = &self.reasoning_effort
            && !["none", "minimal", "low", "medium", "high", "xhigh"].contains(&e.as_str())
        {
            return bad("reasoning_effort", format!("unknown effort {:?}", cut_text(e)));
        }
        for (field, v) in [
            ("temperature", self.temperature),
            ("top_p", self.top_p),
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
        ] {
            if v.is_some_and(|v| !v.is_finite() || v.abs() > 2.0) {
                return bad(field, "must be a number from -2 to 2".into());
            }
        }
        if self.top_k.is_some_and(|k| k > MAX_TOP_K) {
            return bad("top_k", format!("must be 0 to {MAX_TOP_K}"));
        }
        for (field, v, max) in [
            ("min_p", self.min_p, 1.0),
            ("typical_p", self.typical_p, 1.0),
            ("repeat_penalty", self.repeat_penalty, MAX_REPEAT_PENALTY),
        ] {
            if v.is_some_and(|v| !v.is_finite() || !(0.0..=max).contains(&v)) {
                return bad(field, format!("must be a number from 0 to {max}"));
            }
        }
        for tool in &self.tools {
            if let (Some(outer), Some(inner)) = (tool.strict, tool.function.strict)
                && outer != inner
            {
                return bad("tools", format!("tool {:?} says strict twice, differently", tool.function.name));
            }
        }
        if let Some(ResponseFormat::JsonSchema { json_schema }) = &self.response_format {
            if !is_valid_tool_name(&json_schema.name) {
                return bad("response_format", "the schema's name must match ^[a-zA-Z0-9_-]{1,64}$".into());
            }
            if let Some(schema) = &json_schema.schema {
                check_schema_refs(&json_schema.name, schema)?;
            }
        }
        Ok(())
    }

    /// Parses and validates a request from untrusted bytes, and puts the forms real clients
    /// send that say nothing the rebuilt request needs into their one form: a tool-level
    /// `strict` moves into its function, and `$schema` (a dialect name, never fetched) is
    /// dropped from every schema.
    pub fn parse(bytes: &[u8]) -> Result<Self, ChatError> {
        let mut req: Self = parse_untrusted(bytes, chat_limits())?;
        req.validate()?;
        for tool in &mut req.tools {
            if let Some(strict) = tool.strict.take() {
                tool.function.strict = Some(strict);
            }
            if let Some(schema) = &mut tool.function.parameters {
                drop_dialect(schema);
            }
        }
        if let Some(ResponseFormat::JsonSchema { json_schema }) = &mut req.response_format
            && let Some(schema) = &mut json_schema.schema
        {
            drop_dialect(schema);
        }
        Ok(req)
    }
}

/// Removes `$schema` from every object of `schema` (validated first: depth is bounded).
fn drop_dialect(schema: &mut Value) {
    let mut stack = vec![schema];
    while let Some(node) = stack.pop() {
        match node {
            Value::Object(map) => {
                map.remove("$schema");
                stack.extend(map.values_mut());
            }
            Value::Array(items) => stack.extend(items.iter_mut()),
            _ => {}
        }
    }
}

impl ChatResponse {
    /// Checks the messages in every choice against the module's rules.
    pub fn validate(&self) -> Result<(), ChatError> {
        too_many("choices", self.choices.len(), MAX_MESSAGES)?;
        self.choices.iter().try_for_each(|c| {
            if c.message.role != Role::Assistant {
                return Err(ChatError::Misplaced { message: c.index as usize, role: c.message.role, field: "choices" });
            }
            check_message(c.index as usize, &c.message)
        })
    }

    /// Parses and validates a response from untrusted bytes.
    pub fn parse(bytes: &[u8]) -> Result<Self, ChatError> {
        let resp: Self = parse_untrusted(bytes, chat_limits())?;
        resp.validate()?;
        Ok(resp)
    }
}

fn chat_limits() -> JsonLimits {
    JsonLimits::new(MAX_CHAT_BYTES, crate::json::MAX_JSON_DEPTH)
}

/// Keywords whose value is a map from names to schemas.
const SCHEMA_MAP_KEYWORDS: &[&str] =
    &["$defs", "definitions", "dependentSchemas", "patternProperties", "properties", "dependencies"];
/// Keywords whose value is data, never a schema.
const DATA_KEYWORDS: &[&str] = &["const", "default", "enum", "examples", "required", "description", "title"];
/// Reference keywords that must be local.
const REF_KEYWORDS: &[&str] = &["$ref", "$id", "$dynamicRef"];

/// Checks that every reference keyword in every schema position of `schema` is a local
/// `#...` string.
///
/// Every keyword except the data keywords (`const`, `default`, `enum`, `examples`, ...) is
/// treated as a schema position: an object value is walked as a schema and an array value as
/// a list of schemas (`allOf`, `prefixItems`, ...), and the map keywords (`properties`,
/// `$defs`, ...) hold a schema under each name. Unknown keywords are walked too, so a
/// reference cannot hide behind a vocabulary this check does not know; the cost is that an
/// unusual document may be refused, never that a remote reference passes.
pub fn check_schema_refs(tool: &str, schema: &Value) -> Result<(), ChatError> {
    let mut stack = vec![(schema, String::new(), 0usize)];
    while let Some((node, pointer, depth)) = stack.pop() {
        if depth > MAX_SCHEMA_DEPTH {
            return Err(ChatError::SchemaTooDeep { tool: tool.to_owned() });
        }
        let Value::Object(map) = node else {
            // `true`, `false` and non-object values carry no references.
            continue;
        };
        for (key, value) in map {
            let here = format!("{pointer}/{}", escape_pointer(key));
            // `$schema` names a dialect (zod-to-json-schema writes draft-07's URI); nothing
            // fetches it, so any string is accepted ([`ChatRequest::parse`] drops it).
            if key == "$schema" {
                if !value.is_string() {
                    return Err(ChatError::Field { field: "$schema", reason: "must be a string".into() });
                }
                continue;
            }
            if REF_KEYWORDS.contains(&key.as_str()) {
                if !matches!(value, Value::String(s) if s.starts_with('#')) {
                    return Err(ChatError::NonLocalRef {
                        tool: tool.to_owned(),
                        keyword: key.clone(),
                        pointer: if pointer.is_empty() { "/".to_owned() } else { pointer.clone() },
                    });
                }
                continue;
            }
            if DATA_KEYWORDS.contains(&key.as_str()) {
                continue;
            }
            let is_map = SCHEMA_MAP_KEYWORDS.contains(&key.as_str());
            match value {
                Value::Object(children) if is_map => {
                    for (name, child) in children {
                        stack.push((child, format!("{here}/{}", escape_pointer(name)), depth + 1));
                    }
                }
                Value::Object(_) => stack.push((value, here, depth + 1)),
                Value::Array(items) => {
                    for (i, child) in items.iter().enumerate() {
                        stack.push((child, format!("{here}/{i}"), depth + 1));
                    }
                }
                _ => {}
            }
        }
    }
    Ok(())
}

fn escape_pointer(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}
