//! The endpoint's API key: held apart from everything that could print or send it elsewhere.

use std::fmt;

/// An API key. It has no `Display`, no `Serialize` and no `Clone`; `Debug` shows only that a
/// key is present. Its bytes are overwritten when it is dropped (best effort: copies the
/// allocator or the HTTP stack made are not reached).
pub struct ApiKey(Vec<u8>);

/// The key could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The variable is not set.
    #[error("the environment variable {var} (named for the API key) is not set")]
    #[non_exhaustive]
    Unset {
        /// The variable.
        var: String,
    },
    /// The variable's value cannot be a header value (not ASCII, a control character, empty).
    #[error("the environment variable {var} does not hold a usable API key (it must be non-empty visible ASCII)")]
    #[non_exhaustive]
    Unusable {
        /// The variable.
        var: String,
    },
}

impl ApiKey {
    /// A key from its text; `None` if it is empty or not visible ASCII.
    #[must_use]
    pub fn new(key: String) -> Option<Self> {
        let ok = !key.is_empty() && key.bytes().all(|b| b.is_ascii_graphic());
        ok.then(|| Self(key.into_bytes()))
    }

    /// Reads the key from the environment variable `var`.
    ///
    /// # Ambient Authority
    /// Reads the process environment.
    pub fn from_env_ambient(var: &str) -> Result<Self, KeyError> {
        let value = std::env::var_os(var).ok_or_else(|| KeyError::Unset { var: var.to_owned() })?;
        let text = value.into_string().map_err(|_| KeyError::Unusable { var: var.to_owned() })?;
        Self::new(text).ok_or_else(|| KeyError::Unusable { var: var.to_owned() })
    }

    /// The `Authorization` header value, marked sensitive so hyper never logs it.
    pub(crate) fn bearer(&self) -> Option<hyper::header::HeaderValue> {
        let mut v = Vec::with_capacity(self.0.len() + 7);
        v.extend_from_slice(b"Bearer ");
        v.extend_from_slice(&self.0);
        let mut h = hyper::header::HeaderValue::from_bytes(&v).ok()?;
        v.fill(0);
        h.set_sensitive(true);
        Some(h)
    }

    /// The key's length in bytes (for a scrubber that must hold back a possible prefix).
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// `text` with every occurrence of the key replaced by `[redacted]`.
    #[must_use]
    pub fn scrub(&self, text: &str) -> String {
        match std::str::from_utf8(&self.0) {
            Ok(key) if text.contains(key) => text.replace(key, "[redacted]"),
            _ => text.to_owned(),
        }
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey([redacted])")
    }
}

impl Drop for ApiKey {
    fn drop(&mut self) {
        self.0.fill(0);
        std::hint::black_box(&self.0);
    }
}
