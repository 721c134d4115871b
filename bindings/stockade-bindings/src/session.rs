//! Sessions, with the CLI's names: a confined process-tier sandbox that lives across execs
//! (its home kept), in this host process, until it is killed or its time is over.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use stockade_runtime::protocol::{Limits, LiveIo, Status};
use stockade_runtime::session::{Session, SessionProfile, Sessions, exec_job};

use crate::Refused;
use crate::run::{Size, net_grant, process_tier, run_error};

/// Most bytes one `read` or `write` moves: 64 MiB.
pub const MAX_FILE_BYTES: u64 = 64 << 20;

/// A session's options (JSON, `snake_case`; unknown keys are refused).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionOptions {
    /// The memory limit of everything it runs: bytes, or `256M` (default 512M).
    pub memory: Option<Size>,
    /// Its home's size: bytes, or `1G` (default: the state directory's own filesystem).
    pub disk: Option<Size>,
    /// Seconds without an exec after which it ends (default 300).
    pub idle_timeout: Option<f64>,
    /// Seconds after which it ends whatever it does (default 3600).
    pub lifetime: Option<f64>,
    /// Its environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The network grant: `--allow-net` entries.
    #[serde(default)]
    pub allow_net: Vec<String>,
    /// `--net-resolve` entries for it.
    #[serde(default)]
    pub net_resolve: Vec<String>,
}

/// One live session.
pub struct BoundSession {
    session: Arc<Session>,
}

impl std::fmt::Debug for BoundSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoundSession").field("id", &self.session.id()).finish()
    }
}

/// This host process's owner of sessions, made on first use, under stockade's state directory.
fn owner() -> Result<Arc<Sessions>, Refused> {
    static OWNER: Mutex<Option<Arc<Sessions>>> = Mutex::new(None);
    let mut held = OWNER.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(s) = held.as_ref() {
        return Ok(Arc::clone(s));
    }
    let state = stockade_runtime::process::state_dir().ok_or_else(|| {
        Refused::new("Unsupported", "a session needs stockade's state directory: set STOCKADE_STATE_DIR or HOME")
    })?;
    let sessions = Arc::new(
        Sessions::new(process_tier()?, &state, stockade_runtime::session::DEFAULT_MAX_SESSIONS).map_err(run_error)?,
    );
    *held = Some(Arc::clone(&sessions));
    Ok(sessions)
}

/// The guest's path for `path`: as given if absolute, else under the session's home.
fn guest_path(path: &str) -> String {
    if path.starts_with('/') { path.to_owned() } else { format!("{}/{path}", stockade_runtime::process::SESSION_HOME) }
}

fn seconds(what: &str, s: Option<f64>, default: u64) -> Result<Duration, Refused> {
    s.map_or(Ok(Duration::from_secs(default)), |s| {
        Duration::try_from_secs_f64(s)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| Refused::invalid(format!("{what}: a positive number of seconds")))
    })
}

impl BoundSession {
    /// Makes a session.
    pub async fn create(opts: SessionOptions) -> Result<Self, Refused> {
        let memory = opts.memory.as_ref().map_or(Ok(512 << 20), |m| m.bytes("memory"))?;
        let limits = Limits::new().with_memory(memory).map_err(|e| Refused::invalid(e.to_string()))?;
        let grants = net_grant(&opts.allow_net, &opts.net_resolve)?
            .map(|net| Arc::new(stockade_runtime::Grants::new().net(net)));
        let profile = SessionProfile {
            limits,
            idle_timeout: seconds("idle_timeout", opts.idle_timeout, 300)?,
            max_lifetime: seconds("lifetime", opts.lifetime, 3600)?,
            grants,
            env: opts.env.into_iter().collect(),
            home_bytes: opts.disk.as_ref().map(|d| d.bytes("disk")).transpose()?,
            ..SessionProfile::default()
        };
        let session = owner()?.create(profile).await.map_err(run_error)?;
        Ok(Self { session })
    }

    /// Its id.
    #[must_use]
    pub fn id(&self) -> &str {
        self.session.id()
    }

    /// Runs `argv` in it, with `stdin`, within `timeout` seconds (default 60), in `cwd` (its
    /// home by default). The answer: `{"exit_code", "signal", "timed_out", "stdout",
    /// "stderr"}` (the two streams as the guest wrote them, lossily UTF-8) and the report.
    /// A non-zero exit is an answer, as `subprocess.run` gives it; output is the guest's.
    pub async fn exec(
        &self,
        argv: &[String],
        stdin: Vec<u8>,
        timeout: Option<f64>,
        cwd: Option<&str>,
    ) -> Result<(Value, Vec<u8>, Vec<u8>), Refused> {
        let deadline = seconds("timeout", timeout, 60)?;
        let job = exec_job(argv, Vec::new(), stdin, Some(deadline)).map_err(run_error)?;
        let report = self.session.exec(&job, cwd, LiveIo::default()).await.map_err(run_error)?;
        let (code, signal, timed_out) = match report.status {
            Status::Exited { code } => (Some(code), None, false),
            Status::Signaled { signal } => (None, Some(signal), false),
            Status::TimedOut => (None, None, true),
            _ => (None, None, false),
        };
        let summary = json!({
            "exit_code": code,
            "signal": signal,
            "timed_out": timed_out,
            "status": serde_json::to_value(&report.status).unwrap_or(Value::Null),
            "report": serde_json::to_value(&report).unwrap_or(Value::Null),
        });
        Ok((summary, report.stdout.bytes.clone(), report.stderr.bytes.clone()))
    }

    /// Writes `data` to `path` (the guest's; a relative one is in its home).
    pub async fn write(&self, path: &str, data: &[u8]) -> Result<(), Refused> {
        let path = guest_path(path);
        self.session.write(&path, data, MAX_FILE_BYTES).await.map_err(|e| Refused::new("SandboxError", e.to_string()))
    }

    /// Reads `path` (the guest's; a relative one is in its home), at most [`MAX_FILE_BYTES`].
    pub async fn read(&self, path: &str) -> Result<Vec<u8>, Refused> {
        let path = guest_path(path);
        self.session.read(&path, MAX_FILE_BYTES).await.map_err(|e| Refused::new("SandboxError", e.to_string()))
    }

    /// Freezes everything it runs (memory kept).
    pub async fn pause(&self) -> Result<(), Refused> {
        self.session.pause().await.map_err(run_error)
    }

    /// Thaws it.
    pub async fn resume(&self) -> Result<(), Refused> {
        self.session.resume().await.map_err(run_error)
    }

    /// Ends it: every process it ran is gone and its home removed when this returns.
    pub async fn kill(&self) -> Result<(), Refused> {
        let owner = owner()?;
        owner.kill(self.session.id()).await;
        Ok(())
    }
}
