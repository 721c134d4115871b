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
        }
    }
}

/// A chat-completions request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ChatRequest {
    /// The model name.
    pub model: String,
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// Tools offered.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
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
    /// A tool message lacks its `tool_call_id`.
    #[error("message {message}: a tool message needs a tool_call_id")]
    #[non_exhaustive]
    MissingToolCallId {
        /// Index of the message.
        message: usize,
    },
    /// A schema reference keyword points outside the document.
    #[error("tool {tool:?}: `{keyword}` at {pointer} must be a local `#...` reference")]
    #[non_exhaustive]
    NonLocalRef {
        /// The tool.
        tool: String,
        /// The keyword (`$ref`, `$id`, `$schema`, `$dynamicRef`).
        keyword: String,
        /// JSON pointer to the schema holding it.
        pointer: String,
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
    match (m.role, &m.tool_call_id) {
        (Role::Tool, Some(id)) => check_call_id(i, id),
        (Role::Tool, None) => Err(ChatError::MissingToolCallId { message: i }),
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
        Ok(())
    }

    /// Parses and validates a request from untrusted bytes.
    pub fn parse(bytes: &[u8]) -> Result<Self, ChatError> {
        let req: Self = parse_untrusted(bytes, chat_limits())?;
        req.validate()?;
        Ok(req)
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
const REF_KEYWORDS: &[&str] = &["$ref", "$id", "$schema", "$dynamicRef"];

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
