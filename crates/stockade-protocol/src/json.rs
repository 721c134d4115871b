//! Parsing JSON that an untrusted party wrote, with a byte cap and a nesting-depth cap.
//!
//! The depth is measured by a linear scan before serde sees the input, so a deeply nested
//! document is refused without recursion and without building any value.

use serde::de::DeserializeOwned;

/// Default largest untrusted JSON document: 1 MiB, the same as a frame.
///
/// A document's size bounds the memory its parsed value takes (within a small factor).
pub const MAX_JSON_BYTES: usize = 1 << 20;

/// Default deepest nesting of arrays and objects: 64.
///
/// Recursive descent over a deeply nested document costs stack; serde_json's own limit is
/// 128, and no tool call or chat message we accept needs more than a few levels.
pub const MAX_JSON_DEPTH: usize = 64;

/// Caps for one untrusted JSON document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonLimits {
    max_bytes: usize,
    max_depth: usize,
}

impl Default for JsonLimits {
    /// [`MAX_JSON_BYTES`] and [`MAX_JSON_DEPTH`].
    fn default() -> Self {
        Self::new(MAX_JSON_BYTES, MAX_JSON_DEPTH)
    }
}

impl JsonLimits {
    /// Caps of `max_bytes` bytes and `max_depth` levels of nesting.
    #[must_use]
    pub const fn new(max_bytes: usize, max_depth: usize) -> Self {
        Self { max_bytes, max_depth }
    }

    /// The byte cap.
    #[must_use]
    pub const fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// The depth cap.
    #[must_use]
    pub const fn max_depth(&self) -> usize {
        self.max_depth
    }
}

/// Untrusted JSON was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JsonError {
    /// The document is longer than the byte cap; it was not parsed.
    #[error("json document of {len} bytes exceeds the maximum of {max} bytes")]
    #[non_exhaustive]
    TooLarge {
        /// The document length.
        len: usize,
        /// The cap.
        max: usize,
    },
    /// The document nests deeper than the depth cap; it was not parsed.
    #[error("json nests deeper than {max} levels")]
    #[non_exhaustive]
    TooDeep {
        /// The cap.
        max: usize,
    },
    /// The document is not valid JSON.
    #[error("invalid json at line {line} column {column}: {message}")]
    #[non_exhaustive]
    Syntax {
        /// 1-based line of the error.
        line: usize,
        /// 1-based column of the error.
        column: usize,
        /// The parser's description.
        message: String,
    },
    /// The document is valid JSON but does not fit the expected schema.
    #[error("json does not match the schema at line {line} column {column}: {message}")]
    #[non_exhaustive]
    Schema {
        /// 1-based line of the error.
        line: usize,
        /// 1-based column of the error.
        column: usize,
        /// The parser's description.
        message: String,
    },
}

/// Parses `bytes` as `T` after checking the byte and depth caps.
pub fn parse_untrusted<T: DeserializeOwned>(bytes: &[u8], limits: JsonLimits) -> Result<T, JsonError> {
    if bytes.len() > limits.max_bytes {
        return Err(JsonError::TooLarge { len: bytes.len(), max: limits.max_bytes });
    }
    if nesting_depth(bytes) > limits.max_depth {
        return Err(JsonError::TooDeep { max: limits.max_depth });
    }
    serde_json::from_slice(bytes).map_err(|e| {
        let (line, column, message) = (e.line(), e.column(), e.to_string());
        if e.is_data() {
            JsonError::Schema { line, column, message }
        } else {
            JsonError::Syntax { line, column, message }
        }
    })
}

/// The deepest nesting of `[` and `{` outside strings, in one pass without recursion.
///
/// Malformed input is measured as best it can be; serde reports the syntax error afterwards.
#[must_use]
pub fn nesting_depth(bytes: &[u8]) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for &b in bytes {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}
