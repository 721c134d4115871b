//! A confined agent's turn: what the host hands the loop inside a tier ([`Turn`]) and the
//! one bounded answer the loop hands back ([`Reply`]).
//!
//! The host writes the turn on the loop's stdin as one JSON document, and reads the reply
//! from the loop's stdout. The turn names the model, the system prompt, the earlier
//! exchanges of the conversation (the host keeps them; the loop keeps nothing) and the tools
//! the loop may offer the model: each a grant the host serves through the run's broker,
//! under the host's policy. The reply is attacker-controlled (the loop runs the model's
//! plan inside the sandbox), so [`Reply::parse`] is strict: one object, bounded, unknown
//! keys refused. The turn is parsed as strictly, so a host and a loop of different versions
//! fail loudly rather than drop a field.
//!
//! ```text
//! turn  = {"text":"…","speaker":"alice","model":"smollm2","system_prompt":"…",
//!          "history":[{"role":"user","text":"…"},{"role":"assistant","text":"…"}],
//!          "tools":[{"name":"desk.file_ticket","description":"…","parameters":{…},"untrusted":true}],
//!          "max_turns":12}
//! reply = {"ok":true,"text":"…"}
//! ```

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::broker::GrantName;
use crate::json::{JsonError, JsonLimits, parse_untrusted};

/// Longest turn document: 4 MiB (256 tools of 4 KiB descriptions and their schemas, the
/// history and the text).
pub const MAX_TURN_BYTES: usize = 4 << 20;
/// Longest text of a turn, of one history entry, and of a reply: 64 KiB.
pub const MAX_TURN_TEXT: usize = 64 << 10;
/// Longest system prompt: 64 KiB.
pub const MAX_SYSTEM_PROMPT: usize = 64 << 10;
/// Most history entries a turn carries (the oldest are dropped by the host first).
pub const MAX_HISTORY: usize = 64;
/// Most tools a turn offers (the runtime's grant bound).
pub const MAX_TURN_TOOLS: usize = 256;
/// Longest tool description: 4 KiB (a function grant's).
pub const MAX_TOOL_DESCRIPTION: usize = 4 << 10;
/// Longest model name: 256 bytes.
pub const MAX_MODEL_NAME: usize = 256;
/// Most model calls one turn may make.
pub const MAX_TURN_MODEL_CALLS: u32 = 256;
/// Longest reply document: its text and the JSON around it, escapes included.
pub const MAX_REPLY_BYTES: usize = 6 * MAX_TURN_TEXT + 64;

/// A turn or a reply was malformed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TurnError {
    /// Not one JSON document of the schema (unknown key, wrong type, over the byte or depth
    /// cap).
    #[error("{0}")]
    Json(#[from] JsonError),
    /// A field is over its bound or breaks its rule.
    #[error("{field}: {reason}")]
    Field {
        /// The field.
        field: &'static str,
        /// Why.
        reason: String,
    },
}

fn field(field: &'static str, reason: impl Into<String>) -> TurnError {
    TurnError::Field { field, reason: reason.into() }
}

/// serde reads a struct from a JSON array too (`[true, "42"]`); the wire has objects only.
fn object(bytes: &[u8], what: &'static str) -> Result<(), TurnError> {
    match bytes.trim_ascii_start().first() {
        Some(b'{') => Ok(()),
        _ => Err(field(what, "not one JSON object")),
    }
}

/// Who said a history entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Role {
    /// The people the agent answers.
    User,
    /// The agent.
    Assistant,
}

/// One earlier message of the conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Said {
    /// Who said it.
    pub role: Role,
    /// What was said.
    pub text: String,
    /// It was said after untrusted output was read (an answer can quote an injection): the
    /// host starts the next turn's policy as having read untrusted data, and the loop marks
    /// the text when it replays it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub untrusted: bool,
}

impl Said {
    /// An entry.
    #[must_use]
    pub fn new(role: Role, text: impl Into<String>) -> Self {
        Self { role, text: text.into(), untrusted: false }
    }

    /// The entry, said after untrusted output was read.
    #[must_use]
    pub fn untrusted(mut self) -> Self {
        self.untrusted = true;
        self
    }
}

/// A tool the loop may offer the model: a grant the host serves through the run's broker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct TurnTool {
    /// The grant's name (`[a-zA-Z0-9_.-]{1,64}`; an MCP tool is `SERVER.TOOL`).
    pub name: GrantName,
    /// What the model is told the tool does.
    #[serde(default)]
    pub description: String,
    /// The arguments' JSON Schema (an object schema).
    pub parameters: Value,
    /// Whether the tool's output may carry an outsider's words (the loop marks it).
    #[serde(default)]
    pub untrusted: bool,
}

impl TurnTool {
    /// A tool.
    #[must_use]
    pub fn new(name: GrantName, description: impl Into<String>, parameters: Value, untrusted: bool) -> Self {
        Self { name, description: description.into(), parameters, untrusted }
    }
}

/// One turn of a confined agent: what the host hands the loop.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Turn {
    /// The new message.
    pub text: String,
    /// Who sent it (a name of `[a-zA-Z0-9_.-]{1,64}`), if anyone is named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speaker: Option<GrantName>,
    /// The model to ask.
    pub model: String,
    /// The system prompt (the loop adds MARK's sentence).
    #[serde(default)]
    pub system_prompt: String,
    /// The conversation so far, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<Said>,
    /// The tools to offer.
    #[serde(default)]
    pub tools: Vec<TurnTool>,
    /// Most model calls for this turn.
    pub max_turns: u32,
    /// The sampling temperature to ask for, if any (0 to 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// The most tokens one answer may have, if set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
}

impl Turn {
    /// A turn with no history, no tools and 12 model calls.
    #[must_use]
    pub fn new(text: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            speaker: None,
            model: model.into(),
            system_prompt: String::new(),
            history: Vec::new(),
            tools: Vec::new(),
            max_turns: 12,
            temperature: None,
            max_tokens: None,
        }
    }

    /// Parses and checks a turn.
    pub fn parse(bytes: &[u8]) -> Result<Self, TurnError> {
        object(bytes, "turn")?;
        let turn: Self = parse_untrusted(bytes, JsonLimits::new(MAX_TURN_BYTES, crate::json::MAX_JSON_DEPTH))?;
        turn.check()?;
        Ok(turn)
    }

    /// Checks every bound and rule (what [`parse`](Self::parse) checks after decoding).
    pub fn check(&self) -> Result<(), TurnError> {
        if self.text.len() > MAX_TURN_TEXT {
            return Err(field("text", format!("{} bytes, over {MAX_TURN_TEXT}", self.text.len())));
        }
        if self.model.is_empty() || self.model.len() > MAX_MODEL_NAME || self.model.chars().any(char::is_control) {
            return Err(field("model", format!("must be 1 to {MAX_MODEL_NAME} bytes with no control characters")));
        }
        if self.system_prompt.len() > MAX_SYSTEM_PROMPT {
            return Err(field(
                "system_prompt",
                format!("{} bytes, over {MAX_SYSTEM_PROMPT}", self.system_prompt.len()),
            ));
        }
        if self.history.len() > MAX_HISTORY {
            return Err(field("history", format!("{} entries, over {MAX_HISTORY}", self.history.len())));
        }
        if let Some(s) = self.history.iter().find(|s| s.text.len() > MAX_TURN_TEXT) {
            return Err(field("history", format!("an entry of {} bytes, over {MAX_TURN_TEXT}", s.text.len())));
        }
        if self.tools.len() > MAX_TURN_TOOLS {
            return Err(field("tools", format!("{} tools, over {MAX_TURN_TOOLS}", self.tools.len())));
        }
        let mut names = std::collections::BTreeSet::new();
        for t in &self.tools {
            if !names.insert(t.name.as_str()) {
                return Err(field("tools", format!("{} is named twice", t.name.as_str())));
            }
            if t.description.len() > MAX_TOOL_DESCRIPTION {
                return Err(field(
                    "tools",
                    format!("{}'s description is over {MAX_TOOL_DESCRIPTION} bytes", t.name.as_str()),
                ));
            }
            if t.parameters.get("type").and_then(Value::as_str) != Some("object") {
                return Err(field("tools", format!("{}'s parameters are not an object schema", t.name.as_str())));
            }
        }
        if self.temperature.is_some_and(|t| !(0.0..=2.0).contains(&t)) {
            return Err(field("temperature", "must be from 0 to 2"));
        }
        if self.max_turns == 0 || self.max_turns > MAX_TURN_MODEL_CALLS {
            return Err(field("max_turns", format!("must be 1 to {MAX_TURN_MODEL_CALLS}")));
        }
        Ok(())
    }

    /// The turn as one JSON document.
    #[must_use]
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// What the loop hands back: whether the turn ended with an answer, and the answer (or, when
/// `ok` is false, why not, in one line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Reply {
    /// Whether the turn ended with an answer.
    pub ok: bool,
    /// The answer, or why there is none.
    pub text: String,
}

impl Reply {
    /// A reply.
    #[must_use]
    pub fn new(ok: bool, text: impl Into<String>) -> Self {
        Self { ok, text: text.into() }
    }

    /// Parses and checks a reply: one object of exactly `ok` and `text`, the text at most
    /// [`MAX_TURN_TEXT`] bytes. Surrounding whitespace (a trailing newline) is allowed.
    pub fn parse(bytes: &[u8]) -> Result<Self, TurnError> {
        object(bytes, "reply")?;
        let reply: Self = parse_untrusted(bytes, JsonLimits::new(MAX_REPLY_BYTES, 2))?;
        if reply.text.len() > MAX_TURN_TEXT {
            return Err(field("text", format!("{} bytes, over {MAX_TURN_TEXT}", reply.text.len())));
        }
        Ok(reply)
    }

    /// The reply as one JSON line (its text cut to [`MAX_TURN_TEXT`] bytes at a character
    /// boundary).
    #[must_use]
    pub fn to_line(&self) -> Vec<u8> {
        let cut = Self { ok: self.ok, text: crate::completion::cut(&self.text, MAX_TURN_TEXT) };
        let mut line = serde_json::to_vec(&cut).unwrap_or_default();
        line.push(b'\n');
        line
    }
}
