//! Host MCP servers as grants: stockade starts a Model Context Protocol server on the host
//! over stdio, as any MCP client does (`initialize`, `notifications/initialized`,
//! `tools/list`), and grants each of its tools as the function `NAME.TOOL`, with the tool's
//! input schema as the grant's schema ([`Grants::mcp`](crate::Grants::mcp)).
//!
//! # What it guarantees
//! - A tool runs only with the [`Permit`] the run's policy minted for exactly that call
//!   (a rule names it `tool = "NAME.TOOL"`); the broker has checked the arguments against the
//!   tool's schema first, so a call the schema or the policy refuses never reaches the server.
//! - The guest gets the tool's result (`content`, `structuredContent`, and the server's
//!   `isError`, kept), bounded by the run's reply bound, or a one-line error. The server's
//!   stderr, its exit status and its crashes go to the host's [`McpCommand::on_stderr`] sink
//!   and to [`McpServer::stopped`], never to the guest: a guest learns only that the server
//!   stopped.
//! - A call that the broker abandons (its deadline) is cancelled at the server
//!   (`notifications/cancelled`).
//! - The server is the leader of a process group of its own; dropping the last handle (or
//!   [`McpServer::shutdown`]: stdin closed, then a grace period) kills the whole group, so a
//!   server that started helpers leaves none behind.
//! - A server that breaks the protocol (a message over [`MAX_MESSAGE_BYTES`], an answer to no
//!   question) is stopped, and every call waiting on it fails.
//!
//! # What it does not
//! - The server runs with the user's authority, outside every sandbox: that is the point
//!   (it holds the user's tokens). The policy is what bounds it.
//! - Only tools: a server's resources, prompts, sampling and elicitation are not offered
//!   (a server's requests get JSON-RPC's "method not found"; `ping` is answered).
//! - The tool list is read once: `notifications/tools/list_changed` is ignored, as the
//!   grants of a run are fixed when it starts.
//! - A tool whose name does not fit a grant name, or whose schema the policy cannot check, is
//!   not granted; [`McpServer::skipped`] says which and why. An optional property that may
//!   also be `null` (`anyOf: [T, null]`, Pydantic's `Optional[T]`) is granted as an optional
//!   `T`: the guest omits it instead of sending `null`.
//! - If stockade itself is killed with SIGKILL, the server sees its stdin close, which ends a
//!   well-behaved server (the MCP stdio transport's shutdown); nothing kills one that ignores it.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde_json::{Value, json};
use stockade_policy::allow::Permit;
use stockade_protocol::frame::{Line, read_line};
use tokio::io::{AsyncBufRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin};
use tokio::sync::oneshot;

use crate::grants::{FunctionGrant, GrantError, GrantResult};

/// Largest JSON-RPC message the server may send (one line of its stdout): 4 MiB.
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;

/// Most pages of `tools/list` read from one server.
pub const MAX_TOOL_PAGES: usize = 16;

/// The protocol version stockade asks for, and the ones it accepts in answer.
const PROTOCOL_VERSION: &str = "2025-11-25";
const ACCEPTED_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// The longest stderr line passed to the sink, and how much of the latest stderr is kept
/// for [`McpServer::stopped`].
const MAX_STDERR_LINE: usize = 4 << 10;
const STDERR_TAIL: usize = 2 << 10;

/// The longest error message from the server that a guest is shown.
const MAX_GUEST_MESSAGE: usize = 1 << 10;

/// What receives each line the server writes to its stderr (and stockade's own lines about
/// the server: its exit, a protocol fault), for the host's eyes.
pub type StderrSink = Arc<dyn Fn(&str) + Send + Sync>;

/// How to start one host MCP server.
#[derive(Clone)]
pub struct McpCommand {
    name: String,
    program: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    clear_env: bool,
    cwd: Option<PathBuf>,
    start_timeout: Duration,
    stderr: Option<StderrSink>,
}

impl fmt::Debug for McpCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpCommand")
            .field("name", &self.name)
            .field("program", &self.program)
            .field("args", &self.args)
            .field("env", &self.env.iter().map(|(k, _)| k).collect::<Vec<_>>())
            .field("cwd", &self.cwd)
            .finish_non_exhaustive()
    }
}

/// Whether `name` may name an MCP server: 1–32 bytes of `[A-Za-z0-9_-]` (no dot: the dot
/// separates it from the tool in `NAME.TOOL`).
fn server_name(name: &str) -> bool {
    (1..=32).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl McpCommand {
    /// The server `name` (its tools are granted as `name.TOOL`), started as `program args`
    /// with stockade's own environment and working directory.
    pub fn new(
        name: &str,
        program: impl Into<String>,
        args: impl IntoIterator<Item = impl Into<String>>,
    ) -> Result<Self, McpError> {
        if !server_name(name) || name == "stockade" {
            return Err(McpError::Name(name.into()));
        }
        Ok(Self {
            name: name.into(),
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
            env: Vec::new(),
            clear_env: false,
            cwd: None,
            start_timeout: Duration::from_secs(30),
            stderr: None,
        })
    }

    /// Sets one environment variable of the server's.
    #[must_use]
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Starts the server with an environment of `PATH` and `HOME` (this process's) and the
    /// variables [`env`](Self::env) sets, instead of this process's whole environment.
    #[must_use]
    pub fn env_clear(mut self) -> Self {
        self.clear_env = true;
        self
    }

    /// Starts the server in `dir`.
    #[must_use]
    pub fn current_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cwd = Some(dir.into());
        self
    }

    /// Bounds the start: the spawn, `initialize` and every page of `tools/list` (default 30 s).
    #[must_use]
    pub fn start_timeout(mut self, timeout: Duration) -> Self {
        self.start_timeout = timeout;
        self
    }

    /// Gives each line of the server's stderr, and stockade's lines about the server, to
    /// `sink` (by default they are dropped; the latest 2 KiB are kept for
    /// [`McpServer::stopped`] either way).
    #[must_use]
    pub fn on_stderr(mut self, sink: impl Fn(&str) + Send + Sync + 'static) -> Self {
        self.stderr = Some(Arc::new(sink));
        self
    }

    /// The server's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// A host MCP server could not be started, or its handshake failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum McpError {
    /// The name is not 1–32 bytes of `[A-Za-z0-9_-]`, or is reserved.
    #[error("invalid MCP server name {0:?}: 1-32 bytes of [A-Za-z0-9_-], and not `stockade`")]
    Name(String),
    /// The program could not be started.
    #[error("MCP server {name}: cannot start {program:?}: {reason}")]
    Spawn {
        /// The server.
        name: String,
        /// What was started.
        program: String,
        /// Why it could not be.
        reason: String,
    },
    /// The server answered the handshake or `tools/list` with something stockade cannot use.
    #[error("MCP server {name}: {reason}")]
    Protocol {
        /// The server.
        name: String,
        /// What was wrong.
        reason: String,
    },
    /// The server stopped before its handshake finished.
    #[error("MCP server {name} stopped during its handshake: {reason}")]
    Stopped {
        /// The server.
        name: String,
        /// Its exit status and the latest of its stderr.
        reason: String,
    },
    /// The handshake did not finish in time.
    #[error("MCP server {name} did not finish its handshake within {ms} ms")]
    Timeout {
        /// The server.
        name: String,
        /// The bound, in milliseconds.
        ms: u64,
    },
}

/// One tool a server offers.
#[derive(Debug, Clone, PartialEq)]
pub struct McpTool {
    name: String,
    description: String,
    schema: Value,
}

impl McpTool {
    /// Its name at the server (the grant is `SERVER.NAME`).
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Its description, as the server gave it.
    #[must_use]
    pub fn description(&self) -> &str {
        &self.description
    }
    /// The schema of its arguments object, as granted (see the module's notes on `null`).
    #[must_use]
    pub fn schema(&self) -> &Value {
        &self.schema
    }
}

/// A JSON-RPC answer: the result, or the error's code and message.
type Answer = Result<Value, (i64, String)>;

/// What the connection's tasks and the callers share.
struct Shared {
    name: String,
    /// Lines for the writer task, which owns the server's stdin and writes each line whole
    /// (a caller that stops waiting never leaves half a line); `None` once stdin is closed.
    lines: Mutex<Option<tokio::sync::mpsc::Sender<Vec<u8>>>>,
    /// Calls waiting for an answer, by id; `None` once the server has stopped.
    pending: Mutex<Option<HashMap<u64, oneshot::Sender<Answer>>>>,
    next_id: AtomicU64,
    /// Why the server stopped, for the host, once it has.
    stopped: Mutex<Option<String>>,
    stderr_tail: Mutex<String>,
    /// Set when the stderr reader has read the end (every line given to the sink).
    stderr_done: std::sync::atomic::AtomicBool,
    sink: Option<StderrSink>,
}

impl Shared {
    fn say(&self, line: &str) {
        if let Some(sink) = &self.sink {
            sink(line);
        }
    }

    fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn write(&self, message: &Value) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(message).map_err(std::io::Error::other)?;
        line.push(b'\n');
        let closed = || std::io::Error::new(std::io::ErrorKind::BrokenPipe, "stdin is closed");
        let tx = Self::lock(&self.lines).clone().ok_or_else(closed)?;
        tx.send(line).await.map_err(|_| closed())
    }

    /// Marks the server stopped (the first reason wins) and fails every waiting call.
    fn stop(&self, why: &str) {
        Self::lock(&self.stopped).get_or_insert_with(|| why.to_owned());
        Self::lock(&self.pending).take();
    }

    /// Sends one request and waits for its answer; `Err` if the server stopped first. If the
    /// future is dropped before the answer, the request is cancelled at the server.
    async fn request(self: &Arc<Self>, method: &str, params: Value) -> Result<Answer, ()> {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = oneshot::channel();
        match Self::lock(&self.pending).as_mut() {
            Some(pending) => pending.insert(id, tx),
            None => return Err(()),
        };
        let mut guard = Cancel { shared: self.clone(), id, armed: true };
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        if self.write(&message).await.is_err() {
            guard.armed = false;
            self.stop("its stdin closed");
            return Err(());
        }
        let answer = rx.await.map_err(|_| ());
        guard.armed = false;
        answer
    }
}

/// Cancels a request whose caller stopped waiting.
struct Cancel {
    shared: Arc<Shared>,
    id: u64,
    armed: bool,
}

impl Drop for Cancel {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let removed = Shared::lock(&self.shared.pending).as_mut().and_then(|p| p.remove(&self.id)).is_some();
        if let (true, Ok(handle)) = (removed, tokio::runtime::Handle::try_current()) {
            let shared = self.shared.clone();
            let id = self.id;
            handle.spawn(async move {
                let note = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                    "params": {"requestId": id, "reason": "the sandbox's call reached its deadline"}});
                let _ = shared.write(&note).await;
            });
        }
    }
}

/// A running host MCP server and the tools it offers. Dropping the last handle kills it and
/// everything it started; so do the run's grants, which hold handles, when they are dropped.
pub struct McpServer {
    shared: Arc<Shared>,
    tools: Vec<McpTool>,
    skipped: Vec<(String, String)>,
    server_info: Value,
    child: Mutex<Option<Child>>,
    pgid: Option<u32>,
}

impl fmt::Debug for McpServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpServer")
            .field("name", &self.shared.name)
            .field("tools", &self.tools.iter().map(McpTool::name).collect::<Vec<_>>())
            .field("skipped", &self.skipped)
            .finish_non_exhaustive()
    }
}

impl Drop for McpServer {
    fn drop(&mut self) {
        self.kill();
    }
}

impl McpServer {
    /// Starts the server, shakes hands and reads its tools, all within the command's start
    /// timeout. A server that fails any step is stopped before this returns.
    pub async fn start(command: McpCommand) -> Result<Arc<Self>, McpError> {
        let name = command.name.clone();
        let ms = u64::try_from(command.start_timeout.as_millis()).unwrap_or(u64::MAX);
        let mut cmd = tokio::process::Command::new(&command.program);
        if command.clear_env {
            cmd.env_clear();
            for key in ["PATH", "HOME"] {
                if let Some(value) = std::env::var_os(key) {
                    cmd.env(key, value);
                }
            }
        }
        cmd.args(&command.args)
            .envs(command.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        if let Some(dir) = &command.cwd {
            cmd.current_dir(dir);
        }
        let mut child = cmd.spawn().map_err(|e| McpError::Spawn {
            name: name.clone(),
            program: command.program.clone(),
            reason: e.to_string(),
        })?;
        let (Some(stdin), Some(stdout), Some(stderr)) = (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(McpError::Spawn { name, program: command.program, reason: "no pipes".into() });
        };
        let (lines, queue) = tokio::sync::mpsc::channel(64);
        tokio::spawn(write_stdin(stdin, queue));
        let shared = Arc::new(Shared {
            name: name.clone(),
            lines: Mutex::new(Some(lines)),
            pending: Mutex::new(Some(HashMap::new())),
            next_id: AtomicU64::new(1),
            stopped: Mutex::new(None),
            stderr_tail: Mutex::new(String::new()),
            stderr_done: std::sync::atomic::AtomicBool::new(false),
            sink: command.stderr.clone(),
        });
        let pgid = child.id();
        let server = Self {
            shared: shared.clone(),
            tools: Vec::new(),
            skipped: Vec::new(),
            server_info: Value::Null,
            child: Mutex::new(Some(child)),
            pgid,
        };
        tokio::spawn(read_stderr(shared.clone(), BufReader::new(stderr)));
        tokio::spawn(read_stdout(shared.clone(), BufReader::new(stdout)));
        match tokio::time::timeout(command.start_timeout, server.handshake()).await {
            Ok(Ok((tools, skipped, info))) => {
                let mut server = server;
                server.tools = tools;
                server.skipped = skipped;
                server.server_info = info;
                Ok(Arc::new(server))
            }
            Ok(Err(e)) => {
                drop(server);
                Err(e)
            }
            Err(_) => Err(McpError::Timeout { name, ms }),
        }
    }

    async fn handshake(&self) -> Result<(Vec<McpTool>, Vec<(String, String)>, Value), McpError> {
        let name = &self.shared.name;
        let protocol = |reason: String| McpError::Protocol { name: name.clone(), reason };
        let init = json!({
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "stockade", "version": env!("CARGO_PKG_VERSION")},
        });
        let result = self.ask("initialize", init).await?.map_err(|(code, m)| {
            protocol(format!("refused initialize ({code}: {})", bounded(&m, MAX_GUEST_MESSAGE)))
        })?;
        let version = result.get("protocolVersion").and_then(Value::as_str).unwrap_or_default();
        if !ACCEPTED_VERSIONS.contains(&version) {
            return Err(protocol(format!(
                "speaks protocol version {:?}, and stockade speaks {}",
                bounded(version, 64),
                ACCEPTED_VERSIONS.join(", ")
            )));
        }
        if result.pointer("/capabilities/tools").is_none() {
            return Err(protocol("offers no tools (its capabilities have no `tools`)".into()));
        }
        let info = result.get("serverInfo").cloned().unwrap_or(Value::Null);
        if self.shared.write(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await.is_err() {
            self.shared.stop("its stdin closed");
            return Err(McpError::Stopped { name: name.clone(), reason: self.wait_stopped().await });
        }
        let (mut tools, mut skipped) = (Vec::new(), Vec::new());
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_TOOL_PAGES {
            let params = cursor.as_ref().map_or_else(|| json!({}), |c| json!({"cursor": c}));
            let page = self.ask("tools/list", params).await?.map_err(|(code, m)| {
                protocol(format!("refused tools/list ({code}: {})", bounded(&m, MAX_GUEST_MESSAGE)))
            })?;
            let list = page
                .get("tools")
                .and_then(Value::as_array)
                .ok_or_else(|| protocol("answered tools/list without a `tools` array".into()))?;
            for tool in list {
                match parse_tool(name, tool) {
                    Ok(t) => tools.push(t),
                    Err((tool, why)) => skipped.push((tool, why)),
                }
            }
            cursor = page.get("nextCursor").and_then(Value::as_str).map(str::to_owned);
            if cursor.is_none() {
                return Ok((tools, skipped, info));
            }
        }
        Err(protocol(format!("lists its tools in more than {MAX_TOOL_PAGES} pages")))
    }

    /// One request during the handshake.
    async fn ask(&self, method: &str, params: Value) -> Result<Answer, McpError> {
        match self.shared.request(method, params).await {
            Ok(answer) => Ok(answer),
            Err(()) => {
                // The stdout reader saw the end; give the exit status a moment to arrive.
                let why = self.wait_stopped().await;
                Err(McpError::Stopped { name: self.shared.name.clone(), reason: why })
            }
        }
    }

    /// Why the server stopped, with its exit status and the latest of its stderr.
    async fn wait_stopped(&self) -> String {
        let child = Shared::lock(&self.child).take();
        let status = match child {
            Some(mut child) => match tokio::time::timeout(Duration::from_secs(2), child.wait()).await {
                Ok(Ok(status)) => status.to_string(),
                _ => {
                    let _ = child.start_kill();
                    "still running; killed".to_owned()
                }
            },
            None => "gone".to_owned(),
        };
        let why = Shared::lock(&self.shared.stopped).clone().unwrap_or_default();
        let tail = Shared::lock(&self.shared.stderr_tail).trim().to_owned();
        let mut out = format!("{why} ({status})");
        if !tail.is_empty() {
            out.push_str(&format!("; its stderr ends: {}", tail.replace('\n', " | ")));
        }
        out
    }

    /// The server's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The tools granted, in the server's order.
    #[must_use]
    pub fn tools(&self) -> &[McpTool] {
        &self.tools
    }

    /// The tools not granted, and why: a name that does not fit a grant name, or a schema
    /// the policy cannot check.
    #[must_use]
    pub fn skipped(&self) -> &[(String, String)] {
        &self.skipped
    }

    /// The server's `serverInfo`, as it gave it.
    #[must_use]
    pub fn server_info(&self) -> &Value {
        &self.server_info
    }

    /// Why the server stopped, with its exit status once it has one (for the host; a guest
    /// is told only that it did), or `None` while it runs.
    #[must_use]
    pub fn stopped(&self) -> Option<String> {
        let why = Shared::lock(&self.shared.stopped).clone()?;
        let status = Shared::lock(&self.child).as_mut().and_then(|c| c.try_wait().ok().flatten());
        Some(match status {
            Some(status) => format!("{why} ({status})"),
            None => why,
        })
    }

    /// [`stopped`](Self::stopped), once the stopped server's news is all in: it waits, at
    /// most `within`, for the server's exit status and for its stderr's last line to reach
    /// the sink (a crash is seen on stdout first, and the rest arrives a moment later).
    /// `None` at once while the server runs.
    pub async fn settled(&self, within: Duration) -> Option<String> {
        self.stopped()?;
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let exited = Shared::lock(&self.child).as_mut().is_none_or(|c| c.try_wait().ok().flatten().is_some());
            if (exited && self.shared.stderr_done.load(Ordering::SeqCst)) || tokio::time::Instant::now() >= deadline {
                return self.stopped();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Calls the tool `permit` was minted for (`SERVER.TOOL`) with the permit's arguments:
    /// the tool's result (`content`, `structuredContent` and `isError`), or why not in one
    /// line.
    pub async fn call(&self, permit: Permit) -> GrantResult {
        let name = &self.shared.name;
        let call = permit.call();
        let Some(tool) = call.tool().strip_prefix(name.as_str()).and_then(|t| t.strip_prefix('.')) else {
            return Err(format!("{} is not a tool of the MCP server {name}", call.tool()));
        };
        if !self.tools.iter().any(|t| t.name == tool) {
            return Err(format!("the MCP server {name} has no tool {tool:?}"));
        }
        let params = json!({"name": tool, "arguments": call.args_json()});
        let answer = self.shared.request("tools/call", params).await;
        match answer {
            Err(()) => Err(format!("the MCP server {name} has stopped")),
            Ok(Err((code, message))) => Err(format!(
                "the MCP server {name} refused the call ({code}: {})",
                bounded(&message, MAX_GUEST_MESSAGE)
            )),
            Ok(Ok(Value::Object(result))) => {
                let mut out = serde_json::Map::new();
                out.insert("content".into(), result.get("content").cloned().unwrap_or_else(|| json!([])));
                if let Some(s) = result.get("structuredContent") {
                    out.insert("structuredContent".into(), s.clone());
                }
                let is_error = result.get("isError").and_then(Value::as_bool).unwrap_or(false);
                out.insert("isError".into(), Value::Bool(is_error));
                Ok(Value::Object(out))
            }
            Ok(Ok(_)) => Err(format!("the MCP server {name} answered with something that is not a tool result")),
        }
    }

    /// The server's tools as function grants named `SERVER.TOOL`, each calling
    /// [`call`](Self::call).
    pub fn grants(self: &Arc<Self>) -> Result<Vec<FunctionGrant>, GrantError> {
        self.tools
            .iter()
            .map(|tool| {
                let server = self.clone();
                let grant = format!("{}.{}", self.shared.name, tool.name);
                FunctionGrant::new(&grant, tool.schema.clone(), move |permit: Permit| {
                    let server = server.clone();
                    async move { server.call(permit).await }
                })
                // What a server answers may relay an outsider's words (a web page, an issue).
                .map(|g| g.describe(&tool.description).untrusted_output())
            })
            .collect()
    }

    /// Ends the server as the MCP stdio transport says: its stdin is closed, then after
    /// `grace` the whole process group is killed. Calls still waiting fail.
    pub async fn shutdown(&self, grace: Duration) {
        self.shared.stop("shut down");
        Shared::lock(&self.shared.lines).take();
        let child = Shared::lock(&self.child).take();
        if let Some(mut child) = child {
            let status = tokio::time::timeout(grace, child.wait()).await;
            self.kill_group();
            if status.is_err() {
                let _ = child.wait().await;
            }
        }
    }

    fn kill_group(&self) {
        #[cfg(feature = "process")]
        if let Some(pgid) = self.pgid {
            let _ = stockade_process::kill_process_group(pgid);
        }
        #[cfg(not(feature = "process"))]
        let _ = self.pgid;
    }

    fn kill(&self) {
        self.kill_group();
        if let Some(mut child) = Shared::lock(&self.child).take() {
            let _ = child.start_kill();
        }
        Shared::lock(&self.shared.pending).take();
    }
}

/// One tool of a `tools/list` page, or its name and why it is not granted.
fn parse_tool(server: &str, tool: &Value) -> Result<McpTool, (String, String)> {
    let name = tool.get("name").and_then(Value::as_str).unwrap_or_default();
    let shown = bounded(name, 128);
    let grant = format!("{server}.{name}");
    if name.is_empty() || stockade_protocol::broker::GrantName::new(&grant).is_err() {
        return Err((shown, format!("{grant:?} is not a grant name (at most 64 bytes of [A-Za-z0-9_.-])")));
    }
    let mut schema = tool.get("inputSchema").cloned().unwrap_or_else(|| json!({"type": "object"}));
    narrow_nullable(&mut schema);
    if let Err(e) = stockade_policy::allow::ToolSpec::from_json_schema(grant, &schema) {
        return Err((shown, format!("its input schema cannot be checked: {e}")));
    }
    let description = tool.get("description").and_then(Value::as_str).unwrap_or_default();
    Ok(McpTool { name: name.to_owned(), description: bounded(description, 4 << 10), schema })
}

/// Grants an optional property typed `anyOf: [T, {"type": "null"}]` as an optional `T`, at
/// every depth: narrower than the server's schema, never wider.
fn narrow_nullable(schema: &mut Value) {
    let required: Vec<String> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).map(str::to_owned).collect())
        .unwrap_or_default();
    if let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) {
        for (key, prop) in props.iter_mut() {
            if !required.contains(key)
                && let Some(Value::Array(any)) = prop.get("anyOf")
                && any.len() == 2
                && let Some(i) = any.iter().position(|s| s.get("type").and_then(Value::as_str) == Some("null"))
            {
                let mut only = any[1 - i].clone();
                if let (Some(obj), Some(d)) = (only.as_object_mut(), prop.get("description")) {
                    obj.entry("description").or_insert_with(|| d.clone());
                }
                *prop = only;
            }
            narrow_nullable(prop);
        }
    }
    if let Some(items) = schema.get_mut("items") {
        narrow_nullable(items);
    }
}

/// `s` cut to at most `max` bytes, at a character boundary, with `…` where it was cut.
fn bounded(s: &str, max: usize) -> String {
    let cut = stockade_protocol::completion::cut(s, max);
    if cut.len() < s.len() { format!("{cut}…") } else { cut }
}

/// Reads the server's stdout: answers go to their callers, `ping` is answered, other
/// requests are refused, notifications are dropped. Ends the connection at the end of
/// stdout or at a protocol fault.
async fn read_stdout<R: AsyncBufRead + Unpin>(shared: Arc<Shared>, mut stdout: R) {
    let why = loop {
        let line = match read_line(&mut stdout, MAX_MESSAGE_BYTES).await {
            Ok(Line::Text(line)) => line,
            Ok(Line::Eof) => break "its stdout closed".to_owned(),
            Ok(Line::TooLong(_)) => break format!("it broke the protocol: a message over {MAX_MESSAGE_BYTES} bytes"),
            Err(e) => break format!("reading its stdout failed: {e}"),
        };
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let Ok(Value::Object(message)) = serde_json::from_slice::<Value>(&line) else {
            shared.say("ignored a line of its stdout that is not a JSON-RPC message");
            continue;
        };
        let id = message.get("id").cloned();
        match (message.get("method").and_then(Value::as_str), id) {
            (Some(method), Some(id)) => {
                let reply = if method == "ping" {
                    json!({"jsonrpc": "2.0", "id": id, "result": {}})
                } else {
                    json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601,
                        "message": format!("stockade's MCP client offers no {}", bounded(method, 64))}})
                };
                let _ = shared.write(&reply).await;
            }
            (Some(_), None) => {}
            (None, Some(id)) => {
                let answer = match (message.get("result"), message.get("error")) {
                    (Some(result), None) => Ok(result.clone()),
                    (None, Some(error)) => Err((
                        error.get("code").and_then(Value::as_i64).unwrap_or(0),
                        error.get("message").and_then(Value::as_str).unwrap_or("no message").to_owned(),
                    )),
                    _ => break "it broke the protocol: an answer with neither or both of result and error".to_owned(),
                };
                let waiting = id.as_u64().and_then(|id| Shared::lock(&shared.pending).as_mut()?.remove(&id));
                if let Some(tx) = waiting {
                    let _ = tx.send(answer);
                }
            }
            (None, None) => {
                break "it broke the protocol: a message that is neither a request nor an answer".to_owned();
            }
        }
    };
    shared.stop(&why);
}

/// Writes each queued line to the server's stdin, whole; ends (closing stdin) when the
/// queue's senders are gone or a write fails.
async fn write_stdin(mut stdin: ChildStdin, mut queue: tokio::sync::mpsc::Receiver<Vec<u8>>) {
    while let Some(line) = queue.recv().await {
        if stdin.write_all(&line).await.is_err() || stdin.flush().await.is_err() {
            return;
        }
    }
}

/// Reads the server's stderr: each line to the sink, the latest kept.
async fn read_stderr<R: AsyncBufRead + Unpin>(shared: Arc<Shared>, mut stderr: R) {
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let mut limited = (&mut stderr).take(MAX_STDERR_LINE as u64);
        match tokio::io::AsyncBufReadExt::read_until(&mut limited, b'\n', &mut buf).await {
            Ok(0) | Err(_) => {
                shared.stderr_done.store(true, Ordering::SeqCst);
                return;
            }
            Ok(_) => {}
        }
        let line = String::from_utf8_lossy(&buf);
        let line = line.trim_end();
        shared.say(line);
        let mut tail = Shared::lock(&shared.stderr_tail);
        tail.push_str(line);
        tail.push('\n');
        if tail.len() > STDERR_TAIL {
            let mut cut = tail.len() - STDERR_TAIL;
            while !tail.is_char_boundary(cut) {
                cut += 1;
            }
            tail.drain(..cut);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly")]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(server_name("github"));
        assert!(server_name("my-server_2"));
        assert!(!server_name(""));
        assert!(!server_name("a.b"));
        assert!(!server_name(&"x".repeat(33)));
        assert!(McpCommand::new("stockade", "true", Vec::<String>::new()).is_err());
    }

    #[test]
    fn an_optional_nullable_property_is_granted_as_an_optional_value() {
        let mut schema = json!({"type": "object", "properties": {
            "x": {"type": "integer"},
            "y": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": null, "description": "why"},
            "z": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        }, "required": ["x", "z"]});
        narrow_nullable(&mut schema);
        assert_eq!(schema["properties"]["y"], json!({"type": "string", "description": "why"}));
        // A required nullable stays as it was, and is then refused as uncheckable.
        assert!(schema["properties"]["z"].get("anyOf").is_some());
        let tool = json!({"name": "t", "inputSchema": schema});
        assert!(parse_tool("s", &tool).is_err());
    }

    #[test]
    fn a_tool_whose_grant_name_would_not_fit_is_skipped() {
        let tool = json!({"name": "has space", "inputSchema": {"type": "object"}});
        assert!(parse_tool("s", &tool).unwrap_err().1.contains("not a grant name"));
        let tool = json!({"name": "x".repeat(70), "inputSchema": {"type": "object"}});
        assert!(parse_tool("s", &tool).is_err());
        let ok =
            parse_tool("s", &json!({"name": "ok", "description": "d", "inputSchema": {"type": "object"}})).unwrap();
        assert_eq!((ok.name(), ok.description()), ("ok", "d"));
    }

    #[test]
    fn a_bounded_message_is_cut_at_a_character_and_marked() {
        assert_eq!(bounded("héllo", 2), "h…");
        assert_eq!(bounded("hé", 3), "hé");
    }
}
