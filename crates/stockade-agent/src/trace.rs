//! `--trace FILE`: one JSON object per line for every request, response, decision, tool run
//! and usage record.
//!
//! Schema: every line is an object with `event` (`request`, `response`, `decision`, `tool`,
//! `usage`, `end`) and `t_ms` (milliseconds since the run started), plus the event's fields:
//! - `request`: `turn`, `url`, `attempt`, `body` (the request as sent; it never holds the key);
//! - `response`: `turn`, `status`, `bytes`, `ms`, `body` (cut to 64 KiB), `quirks`;
//! - `decision`: `turn`, `call` (the host id), `provider_id`, `tool`, `args` (canonical),
//!   `effect` (`allow`, `ask`, `deny`, `refused`), `rule`, `reason`, `tainted` (argument names);
//! - `tool`: `turn`, `call`, `tool`, `ms`, `status` (`ok`, `failed`, `timeout`), `bytes`,
//!   `report` (for run_code: tier, status, wall time);
//! - `usage`: `turn`, `prompt_tokens`, `completion_tokens`, `total_tokens`, `run_total`;
//! - `end`: `outcome` (`answer` or the error's text), `turns`, `tool_calls`.
//!
//! The key is never written: it is only ever a header, and every line is scrubbed of it too.

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::{Value, json};

use crate::secret::ApiKey;

/// A JSONL trace sink. Write errors are counted, never fatal to the run.
#[derive(Debug, Clone)]
pub struct Trace {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug)]
struct Inner {
    out: Box<dyn WriteDebug>,
    start: Instant,
    key: Option<Arc<ApiKey>>,
    errors: u64,
}

trait WriteDebug: Write + Send + std::fmt::Debug {}
impl<T: Write + Send + std::fmt::Debug> WriteDebug for T {}

impl Trace {
    /// Creates (truncates) the trace file at `path`, mode 0600.
    ///
    /// # Ambient Authority
    /// Creates a file by path.
    pub fn create_ambient(path: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
        Ok(Self::to_writer(std::io::BufWriter::new(file)))
    }

    /// A trace into any writer.
    pub fn to_writer(out: impl Write + Send + std::fmt::Debug + 'static) -> Self {
        Self { inner: Arc::new(Mutex::new(Inner { out: Box::new(out), start: Instant::now(), key: None, errors: 0 })) }
    }

    /// Scrubs `key` from every later line (defence in depth: the key is never put in a line).
    pub(crate) fn scrub_key(&self, key: Option<Arc<ApiKey>>) {
        if let Ok(mut inner) = self.inner.lock() {
            inner.key = key;
        }
    }

    /// Writes one event.
    pub fn event(&self, event: &str, fields: Value) {
        let Ok(mut inner) = self.inner.lock() else { return };
        let mut line = json!({"event": event, "t_ms": inner.start.elapsed().as_millis() as u64});
        if let (Value::Object(line), Value::Object(fields)) = (&mut line, fields) {
            line.extend(fields);
        }
        let mut text = line.to_string();
        if let Some(key) = &inner.key {
            text = key.scrub(&text);
        }
        text.push('\n');
        let ok = inner.out.write_all(text.as_bytes()).and_then(|()| inner.out.flush()).is_ok();
        if !ok {
            inner.errors += 1;
        }
    }
}
