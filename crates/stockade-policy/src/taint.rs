//! Provenance by copying: which outside text an argument was copied from.
//!
//! A [`Taint`] remembers texts by where they came from (a tool's untrusted output, or text a
//! sandbox wrote), bounded at [`MAX_TAINT_BYTES`] (older text is forgotten first). An
//! argument value is traced to a text when one of its strings (or numbers, as written) is
//! the whole text, trimmed, or, at [`MIN_TAINT_CHARS`] characters or more, a part of it.
//!
//! The agent's loop keeps one over the untrusted outputs it marks, so an argument copied
//! from one gets [`Source::Tool`]; a confined agent's host keeps them over the traffic it
//! relays (`stockade_runtime`'s relayed provenance), so the same rule holds when the loop
//! runs inside a sandbox.
//!
//! Not a guarantee: text the model rephrases is not traced. What does not trace to an
//! outside text is the model's own choice, which the policy's other conditions (and
//! `session_read_untrusted`, set whenever untrusted text was read) still bound.

use std::collections::VecDeque;

use serde_json::{Map, Value};

use crate::allow::{Source, ToolCall};

/// Shortest copied text traced as a part of a longer one: 8 characters (shorter values are
/// traced only when they are the whole text).
pub const MIN_TAINT_CHARS: usize = 8;

/// Most text one [`Taint`] remembers: 4 MiB (older text is forgotten first).
pub const MAX_TAINT_BYTES: usize = 4 << 20;

/// Texts by origin, bounded (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct Taint {
    texts: VecDeque<(String, String)>,
    bytes: usize,
}

impl Taint {
    /// An empty store.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Remembers `text` as from `origin` (a tool's name).
    pub fn remember(&mut self, origin: &str, text: String) {
        if text.trim().is_empty() {
            return;
        }
        self.bytes += text.len();
        self.texts.push_back((origin.to_owned(), text));
        while self.bytes > MAX_TAINT_BYTES {
            let Some((_, old)) = self.texts.pop_front() else { break };
            self.bytes -= old.len();
        }
    }

    /// Remembers every string, key and scalar of `value` as from `origin`.
    pub fn remember_json(&mut self, origin: &str, value: &Value) {
        let mut stack = vec![value];
        while let Some(v) = stack.pop() {
            match v {
                Value::String(s) => self.remember(origin, s.clone()),
                Value::Array(items) => stack.extend(items),
                Value::Object(map) => {
                    stack.extend(map.values());
                    for k in map.keys() {
                        self.remember(origin, k.clone());
                    }
                }
                other => self.remember(origin, other.to_string()),
            }
        }
    }

    /// The origin of the first remembered text that `value` (any string or number in it)
    /// was copied from.
    #[must_use]
    pub fn origin_of(&self, value: &Value) -> Option<&str> {
        let mut stack = vec![value];
        while let Some(v) = stack.pop() {
            let found = match v {
                Value::String(s) => self.copied_from(s),
                Value::Number(n) => self.copied_from(&n.to_string()),
                Value::Array(items) => {
                    stack.extend(items);
                    None
                }
                Value::Object(map) => {
                    stack.extend(map.values());
                    None
                }
                Value::Bool(_) | Value::Null => None,
            };
            if found.is_some() {
                return found;
            }
        }
        None
    }

    fn copied_from(&self, s: &str) -> Option<&str> {
        let s = s.trim();
        if s.is_empty() {
            return None;
        }
        let long = s.chars().count() >= MIN_TAINT_CHARS;
        self.texts.iter().find(|(_, text)| text.trim() == s || (long && text.contains(s))).map(|(o, _)| o.as_str())
    }
}

/// The call of `tool` with `args`, each argument's source given by `source_of` (`None`:
/// the user's), and the names of the arguments whose source is not the user's.
pub fn call_with_sources(
    tool: &str,
    args: Map<String, Value>,
    mut source_of: impl FnMut(&Value) -> Option<Source>,
) -> (ToolCall, Vec<String>) {
    let mut call = ToolCall::new(tool);
    let mut tainted = Vec::new();
    for (name, value) in args {
        let source = source_of(&value).unwrap_or(Source::User);
        if source != Source::User {
            tainted.push(name.clone());
        }
        call = call.arg(name, value, source);
    }
    (call, tainted)
}
