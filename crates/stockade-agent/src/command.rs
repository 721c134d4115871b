//! Command tools: a program the user wrote gets the call's arguments as one JSON object on
//! stdin and answers on stdout, under a timeout and an output cap.
//!
//! The program runs as the user, unconfined (it is the user's own code, like an MCP server's
//! tools), with an environment cleared down to `PATH` and the variables its configuration
//! names; or, with [`CommandTool::confined`] (`confine = "process"` in `agent.toml`), inside a
//! tier. Its exit status 0 means success and stdout is the result; any other ending is a
//! failure whose stderr excerpt goes back to the model (marked, when the tool is untrusted).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use std::sync::Arc;

use async_trait::async_trait;
use stockade_policy::allow::Permit;
use stockade_protocol::{Job, Limits};
use stockade_runtime::Sandbox;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::tool::{Tool, ToolDef, ToolOutput};

/// Longest stderr excerpt kept from a failed command: 2 KiB.
pub const MAX_STDERR_EXCERPT: usize = 2 << 10;

/// A host program as a tool.
#[derive(Debug, Clone)]
pub struct CommandTool {
    def: ToolDef,
    argv: Vec<String>,
    env: Vec<(String, String)>,
    dir: Option<PathBuf>,
    timeout: Duration,
    max_output: usize,
    confined: Option<Arc<Sandbox>>,
    /// The network grant of a confined run.
    net: Option<Arc<stockade_runtime::Grants>>,
}

impl CommandTool {
    /// Runs `argv` (program and arguments) for each call, with a 10 s timeout, a 64 KiB stdout
    /// cap and an environment of `PATH` alone.
    #[must_use]
    pub fn new(def: ToolDef, argv: Vec<String>) -> Self {
        Self {
            def,
            argv,
            env: Vec::new(),
            dir: None,
            timeout: Duration::from_secs(10),
            max_output: 64 << 10,
            confined: None,
            net: None,
        }
    }

    /// Runs the program inside `sandbox` (a tier) instead of on the host: the arguments still
    /// arrive on stdin, the timeout and output cap become the run's limits, the environment
    /// holds only the named variables, and stdout counts only if the run is verified. The
    /// program sees the tier's view (no host files beyond its grants, no network).
    #[must_use]
    pub fn confined(mut self, sandbox: Arc<Sandbox>) -> Self {
        self.confined = Some(sandbox);
        self
    }

    /// Gives the confined run the network through `grant` (see `stockade_egress`); without
    /// [`confined`](Self::confined) it changes nothing, since an unconfined program has the
    /// host's network anyway.
    #[must_use]
    pub fn net(mut self, grant: stockade_runtime::egress::NetGrant) -> Self {
        self.net = Some(Arc::new(stockade_runtime::Grants::new().net(grant)));
        self
    }

    async fn run_confined(&self, sandbox: &Sandbox, input: Vec<u8>) -> ToolOutput {
        let Some((program, args)) = self.argv.split_first() else {
            return ToolOutput::failed("the tool has no command configured");
        };
        let max = u64::try_from(self.max_output).unwrap_or(u64::MAX);
        let limits = match Limits::new().with_wall(self.timeout).and_then(|l| l.with_stdout(max)) {
            Ok(l) => l,
            Err(e) => return ToolOutput::failed(format!("the tool's limits are out of range: {e}")),
        };
        let job = Job::command(program.clone(), args.iter().cloned()).and_then(|j| j.with_stdin(input));
        let mut job = match job {
            Ok(j) => j.with_limits(limits),
            Err(e) => return ToolOutput::failed(format!("the tool's job could not be built: {e}")),
        };
        for (k, v) in &self.env {
            job = match job.with_env(k.clone(), v.clone()) {
                Ok(j) => j,
                Err(e) => return ToolOutput::failed(format!("the tool's environment was refused: {e}")),
            };
        }
        let request = match &self.net {
            Some(grants) => stockade_runtime::RunRequest::new(&job).grants(grants.clone()),
            None => stockade_runtime::RunRequest::new(&job),
        };
        crate::run_code::run_verified(sandbox, request, "the tool's confined run").await
    }

    /// Adds an environment variable.
    #[must_use]
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Runs the program in `dir`.
    #[must_use]
    pub fn current_dir(mut self, dir: PathBuf) -> Self {
        self.dir = Some(dir);
        self
    }

    /// The timeout of one call.
    #[must_use]
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = d;
        self
    }

    /// The stdout cap of one call (more is a failure).
    #[must_use]
    pub fn max_output(mut self, bytes: usize) -> Self {
        self.max_output = bytes;
        self
    }

    async fn run(&self, input: Vec<u8>) -> ToolOutput {
        let Some((program, args)) = self.argv.split_first() else {
            return ToolOutput::failed("the tool has no command configured");
        };
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(path) = std::env::var_os("PATH") {
            cmd.env("PATH", path);
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        if let Some(dir) = &self.dir {
            cmd.current_dir(dir);
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => return ToolOutput::failed(format!("the tool's program could not start: {e}")),
        };
        let (Some(mut stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return ToolOutput::failed("the tool's pipes could not be set up");
        };
        let max = self.max_output;
        let work = async {
            let feed = async move {
                // A program that exits without reading its input is not an error here.
                let _ = stdin.write_all(&input).await;
                drop(stdin);
            };
            let (_, out, err) = tokio::join!(feed, read_capped(stdout, max), read_capped(stderr, MAX_STDERR_EXCERPT));
            let status = child.wait().await;
            (out, err, status)
        };
        match tokio::time::timeout(self.timeout, work).await {
            Err(_) => ToolOutput::TimedOut { reason: format!("the tool timed out after {:?}", self.timeout) },
            Ok(((out, out_over), (err, _), status)) => {
                let err = String::from_utf8_lossy(&err).into_owned();
                let output = (!err.trim().is_empty()).then_some(err);
                match status {
                    Err(e) => ToolOutput::failed(format!("waiting for the tool failed: {e}")),
                    Ok(_) if out_over => ToolOutput::Failed {
                        reason: format!("the tool wrote more than {max} bytes; its output was discarded"),
                        output,
                    },
                    Ok(s) if s.success() => ToolOutput::Text(String::from_utf8_lossy(&out).into_owned()),
                    Ok(s) => ToolOutput::Failed { reason: format!("the tool failed ({s})"), output },
                }
            }
        }
    }
}

/// Reads at most `max` bytes, then drains the rest (so the writer does not block), and says
/// whether there was more.
async fn read_capped(mut r: impl AsyncRead + Unpin, max: usize) -> (Vec<u8>, bool) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let mut over = false;
    loop {
        match r.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = max.saturating_sub(buf.len());
                buf.extend_from_slice(&chunk[..n.min(room)]);
                over |= n > room;
            }
        }
    }
    (buf, over)
}

#[async_trait]
impl Tool for CommandTool {
    fn def(&self) -> &ToolDef {
        &self.def
    }

    async fn call(&self, permit: Permit) -> ToolOutput {
        let input = permit.call().args_json().to_string().into_bytes();
        match &self.confined {
            Some(sandbox) => self.run_confined(sandbox, input).await,
            None => self.run(input).await,
        }
    }
}
