//! `--trace FILE`: one JSON object per line for every request, response, decision, tool run
//! and usage record.
//!
//! Schema: every line is an object with `event` (`request`, `response`, `decision`, `tool`,
//! `usage`, `end`) and `t_ms` (milliseconds since the run started), plus the event's fields:
//! - `request`: `turn`, `url`, `attempt`, `body` (the request as sent; it never holds the key);
//! - `response`: `turn`, `status`, `bytes`, `ms`, `body` (cut to 64 KiB), `quirks`;
//! - `decision`: `turn`, `call` (the host id), `provider_id`, `tool`, `args` (canonical),
//!   `effect` (`allow`, `ask`, `deny`, `refused`), `rule`, `reason`, `tainted` (argument names);
//! - `tool`: `turn`, `call`, `tool`, `ms`, `status` (`ok`, `failed`, `timeout`, `cancelled`:
//!   the run was stopped or ended while it ran), `bytes`, `untrusted` (the output was
//!   marked), `report` (for run_code: tier, status, wall time);
//! - `usage`: `turn`, `prompt_tokens`, `completion_tokens`, `total_tokens`, `run_total`;
//! - `end`: `outcome` (`answer`, the error's text, or `interrupted (SIGINT)`), `turns`,
//!   `tool_calls`.
//!
//! A confined agent's trace is the host's, from the broker as it happens: `decision` with
//! `confined: true` for each call as it is decided (an allowed one before it runs), and
//! `tool` (`ok`, `failed`, `cancelled`) with `rule`, `failure`, `ms` and bytes when an
//! allowed call ends; `broker` if the broker ended the session; `end` with `broker_calls`,
//! `denied` and `tokens`.
//!
//! The key is never written: it is only ever a header, and every line is scrubbed of it too.
//!
//! An observer ([`Trace::observer`]) gets each event as it is written, the same fields, for a
//! display (`stockade agent` shows the steps on a terminal with one); a trace may have a file,
//! an observer, or both.

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

/// Called with each event's name and its line (the fields, `event` and `t_ms`).
pub type Observer = Arc<dyn Fn(&str, &Value) + Send + Sync>;

struct Inner {
    out: Option<Box<dyn WriteDebug>>,
    observer: Option<Observer>,
    start: Instant,
    key: Option<Arc<ApiKey>>,
    errors: u64,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("out", &self.out)
            .field("observer", &self.observer.is_some())
            .field("errors", &self.errors)
            .finish_non_exhaustive()
    }
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
        Self::new(Some(Box::new(out)), None)
    }

    /// A trace with no file that hands each event to `observer`.
    pub fn observer(observer: Observer) -> Self {
        Self::new(None, Some(observer))
    }

    /// This trace, also handing each event to `observer`.
    #[must_use]
    pub fn with_observer(self, observer: Observer) -> Self {
        if let Ok(mut inner) = self.inner.lock() {
            inner.observer = Some(observer);
        }
        self
    }

    fn new(out: Option<Box<dyn WriteDebug>>, observer: Option<Observer>) -> Self {
        Self { inner: Arc::new(Mutex::new(Inner { out, observer, start: Instant::now(), key: None, errors: 0 })) }
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
        if let Some(observer) = inner.observer.clone() {
            // The scrubbed line, as the file gets it (read back only when a key was scrubbed).
            let seen = match &inner.key {
                Some(_) => serde_json::from_str(&text).unwrap_or(line),
                None => line,
            };
            observer(event, &seen);
        }
        text.push('\n');
        if let Some(out) = inner.out.as_mut() {
            let ok = out.write_all(text.as_bytes()).and_then(|()| out.flush()).is_ok();
            if !ok {
                inner.errors += 1;
            }
        }
    }
}
