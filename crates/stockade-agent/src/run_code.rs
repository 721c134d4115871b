//! `run_code`: the model's code, run in a tier under a contract, its output marked untrusted.
//!
//! `javascript` runs in the wasm tier's QuickJS guest, `python` and `sh` in the process tier
//! (`python3 -c CODE`, `sh -c CODE`), or all in a container when the tool is given a docker
//! sandbox and an image. A verified run's stdout is the result; a refusal (timeout, output
//! too large, out of memory, a non-zero exit with its stderr excerpt) is the result's error
//! text. Both are the guest's bytes, so both are marked (the tool's trust is untrusted).
//!
//! With [`RunCode::net`], python and sh runs (not javascript: the wasm tier has no sockets)
//! reach the network through the run's policed proxy (`stockade_egress`), and only the hosts
//! the grant allows; the model cannot widen it, since the grant is the host's.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};
use stockade_policy::allow::Permit;
use stockade_protocol::{Job, Limits};
use stockade_runtime::verify::{Budget, Contract, Outcome, accept_any};
use stockade_runtime::{Grants, RunRequest, Sandbox};

use crate::tool::{Tool, ToolDef, ToolOutput, Trust};

/// Longest `code` the tool accepts: 64 KiB (the policy may ask for less).
pub const MAX_CODE_BYTES: usize = 64 << 10;

/// A language `run_code` can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Language {
    /// Python 3 (`python3 -c`).
    Python,
    /// JavaScript (QuickJS in the wasm tier).
    Javascript,
    /// POSIX shell (`sh -c`).
    Sh,
}

impl Language {
    /// `python`, `javascript` or `sh`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Python => "python",
            Self::Javascript => "javascript",
            Self::Sh => "sh",
        }
    }

    /// Parses a name (`js` is accepted for javascript).
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "python" => Some(Self::Python),
            "javascript" | "js" => Some(Self::Javascript),
            "sh" => Some(Self::Sh),
            _ => None,
        }
    }
}

/// Where a program runs: one sandbox, and how a program becomes a job in it. The one
/// mapping from a language to a job, shared by the agent's `run_code` and `stockade mcp`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Runner {
    /// A command (python and sh, or any argv) in this sandbox (the process tier).
    Command(Arc<Sandbox>),
    /// javascript in this sandbox (the wasm tier).
    Javascript(Arc<Sandbox>),
    /// A command in this image in this sandbox (the docker tier).
    Image(Arc<Sandbox>, String),
}

impl Runner {
    /// The sandbox it runs in.
    #[must_use]
    pub fn sandbox(&self) -> &Arc<Sandbox> {
        match self {
            Self::Command(s) | Self::Javascript(s) | Self::Image(s, _) => s,
        }
    }

    /// The job that runs `argv` here (a command or an image runner).
    pub fn command_job(&self, argv: Vec<String>) -> Result<Job, String> {
        let job = match self {
            Self::Command(_) => {
                let (program, args) = argv.split_first().ok_or("the command is empty")?;
                Job::command(program.clone(), args.iter().cloned())
            }
            Self::Image(_, image) => Job::image(image.clone(), argv),
            Self::Javascript(_) => return Err("the wasm tier runs javascript, not commands".into()),
        };
        job.map_err(|e| format!("the job could not be built: {e}"))
    }

    /// The job that runs `code` in `language` here: `python3 -c CODE`, `sh -c CODE`, or the
    /// QuickJS guest for javascript.
    pub fn code_job(&self, language: Language, code: &str) -> Result<Job, String> {
        let argv = |program: &str| vec![program.to_owned(), "-c".to_owned(), code.to_owned()];
        match (language, self) {
            (Language::Javascript, Self::Javascript(_)) => javascript_job(code),
            (Language::Javascript, _) => Err("javascript runs in the wasm tier".into()),
            (Language::Python, _) => self.command_job(argv("python3")),
            (Language::Sh, _) => self.command_job(argv("sh")),
        }
    }
}

/// The built-in `run_code` tool.
#[derive(Debug)]
pub struct RunCode {
    def: ToolDef,
    limits: Limits,
    runners: Vec<(Language, Runner)>,
    /// The network grant of command and image runs, with the hosts it allows.
    net: Option<(stockade_runtime::egress::NetGrant, Vec<String>)>,
    /// Host functions (a host MCP server's tools) and the policy deciding their calls.
    functions: Option<Grants>,
    /// What command and image runs get (functions and the network), and JavaScript runs
    /// (functions only), from the two above.
    for_commands: Option<Arc<Grants>>,
    for_javascript: Option<Arc<Grants>>,
}

impl RunCode {
    /// A `run_code` that runs nothing yet; add sandboxes with [`RunCode::command`],
    /// [`RunCode::javascript`] or [`RunCode::image`]. Every run gets `limits`.
    #[must_use]
    pub fn new(limits: Limits) -> Self {
        Self {
            def: Self::definition(&[], None, &[]),
            limits,
            runners: Vec::new(),
            net: None,
            functions: None,
            for_commands: None,
            for_javascript: None,
        }
    }

    fn definition(languages: &[Language], hosts: Option<&[String]>, functions: &[&str]) -> ToolDef {
        let names: Vec<&str> = languages.iter().map(|l| l.name()).collect();
        let calls = if functions.is_empty() {
            String::new()
        } else {
            format!(
                " The program may call these host tools, each only as the host's policy allows: {} \
                 (in sh: `stockade-call NAME '{{JSON arguments}}'`; in JavaScript and Python: `NAME(args)`).",
                functions.join(", ")
            )
        };
        let network = match hosts {
            None => "no network".to_owned(),
            Some(h) => {
                format!("network only to {} (python and sh, through the proxy the environment names)", h.join(", "))
            }
        };
        ToolDef::new(
            "run_code",
            format!(
                "Runs code in a sandbox with {network} and no host files, and returns its standard output. \
                 Languages: {}. Print the result you need. The output is untrusted text.{calls}",
                if names.is_empty() { "none".to_owned() } else { names.join(", ") }
            ),
            json!({
                "type": "object",
                "properties": {
                    "language": {"type": "string", "enum": names},
                    // No `maxLength`: llama-cpp-python turns it into a grammar of that many
                    // repetitions and its server dies of a stack overflow (seen with 65536).
                    // The bound is enforced here and by the policy instead.
                    "code": {"type": "string", "description": format!("at most {MAX_CODE_BYTES} bytes")},
                    "stdin": {"type": "string"}
                },
                "required": ["language", "code"],
                "additionalProperties": false
            }),
            Trust::Untrusted,
        )
    }

    fn add(mut self, language: Language, runner: Runner) -> Self {
        self.runners.retain(|(l, _)| *l != language);
        self.runners.push((language, runner));
        self.describe();
        self
    }

    fn describe(&mut self) {
        let languages: Vec<Language> = self.runners.iter().map(|(l, _)| *l).collect();
        let functions: Vec<&str> = self.functions.iter().flat_map(Grants::function_names).collect();
        self.def = Self::definition(&languages, self.net.as_ref().map(|(_, h)| h.as_slice()), &functions);
        let functions = self.functions.clone();
        self.for_javascript = functions.clone().map(Arc::new);
        self.for_commands = match (&self.net, functions) {
            (None, None) => None,
            (net, functions) => {
                let grants = functions.unwrap_or_default();
                Some(Arc::new(match net {
                    Some((grant, _)) => grants.net(grant.clone()),
                    None => grants,
                }))
            }
        };
    }

    /// Gives python and sh runs the network through `grant`; `hosts` (the `--allow-net`
    /// entries, or a description of the policy) are named in the tool's description.
    #[must_use]
    pub fn net(mut self, grant: stockade_runtime::egress::NetGrant, hosts: Vec<String>) -> Self {
        self.net = Some((grant, hosts));
        self.describe();
        self
    }

    /// Gives every run host functions (a host MCP server's tools, [`Grants::mcp`]) with the
    /// policy that decides each call (`grants` should carry one; without it every call is
    /// denied). The tool's description names them to the model.
    #[must_use]
    pub fn functions(mut self, grants: Grants) -> Self {
        self.functions = Some(grants);
        self.describe();
        self
    }

    /// The hosts [`net`](Self::net) named, if the network is granted.
    #[must_use]
    pub fn net_hosts(&self) -> Option<&[String]> {
        self.net.as_ref().map(|(_, h)| h.as_slice())
    }

    /// The grants a run of `runner` gets: the functions, and the network grant for command
    /// and image runs.
    #[must_use]
    pub fn grants_for(&self, runner: &Runner) -> Option<Arc<Grants>> {
        match runner {
            Runner::Javascript(_) => self.for_javascript.clone(),
            Runner::Command(_) | Runner::Image(..) => self.for_commands.clone(),
        }
    }

    /// Runs `language` (python or sh) as a command in `sandbox` (the process tier).
    #[must_use]
    pub fn command(self, language: Language, sandbox: Arc<Sandbox>) -> Self {
        self.add(language, Runner::Command(sandbox))
    }

    /// Runs javascript in `sandbox` (the wasm tier).
    #[must_use]
    pub fn javascript(self, sandbox: Arc<Sandbox>) -> Self {
        self.add(Language::Javascript, Runner::Javascript(sandbox))
    }

    /// Runs `language` (python or sh) as a command in `image` in `sandbox` (the docker tier).
    #[must_use]
    pub fn image(self, language: Language, sandbox: Arc<Sandbox>, image: impl Into<String>) -> Self {
        self.add(language, Runner::Image(sandbox, image.into()))
    }

    /// The languages it can run.
    pub fn languages(&self) -> impl Iterator<Item = Language> + '_ {
        self.runners.iter().map(|(l, _)| *l)
    }

    /// Where `language` runs, if it is offered.
    #[must_use]
    pub fn runner(&self, language: Language) -> Option<&Runner> {
        self.runners.iter().find(|(l, _)| *l == language).map(|(_, r)| r)
    }

    /// The job for `code` in `language` (at most [`MAX_CODE_BYTES`]), with this tool's
    /// limits, and where it runs.
    pub fn job(&self, language: Language, code: &str) -> Result<(Job, &Runner), String> {
        let runner =
            self.runner(language).ok_or_else(|| format!("{} is not available on this host", language.name()))?;
        if code.len() > MAX_CODE_BYTES {
            return Err(format!("the code is longer than {MAX_CODE_BYTES} bytes"));
        }
        Ok((runner.code_job(language, code)?.with_limits(self.limits), runner))
    }
}

#[cfg(feature = "wasm")]
fn javascript_job(code: &str) -> Result<Job, String> {
    stockade_runtime::wasm::javascript_job(code.as_bytes().to_vec())
        .map_err(|e| format!("the job could not be built: {e}"))
}

#[cfg(not(feature = "wasm"))]
fn javascript_job(_code: &str) -> Result<Job, String> {
    Err("this build has no wasm tier for javascript".into())
}

#[async_trait]
impl Tool for RunCode {
    fn def(&self) -> &ToolDef {
        &self.def
    }

    async fn call(&self, permit: Permit) -> ToolOutput {
        let args = permit.call().args_json();
        let Some(language) = args.get("language").and_then(Value::as_str).and_then(Language::parse) else {
            return ToolOutput::failed("language must be one of the listed languages");
        };
        let code = args.get("code").and_then(Value::as_str).unwrap_or_default();
        let (mut job, runner) = match self.job(language, code) {
            Ok(j) => j,
            Err(e) => return ToolOutput::failed(e),
        };
        if let Some(stdin) = args.get("stdin").and_then(Value::as_str) {
            job = match job.with_stdin(stdin.as_bytes().to_vec()) {
                Ok(j) => j,
                Err(e) => return ToolOutput::failed(format!("stdin refused: {e}")),
            };
        }
        let request = match self.grants_for(runner) {
            Some(grants) => RunRequest::new(&job).grants(grants),
            None => RunRequest::new(&job),
        };
        run_verified(runner.sandbox(), request, "the run").await
    }
}

/// Runs `job` in `sandbox` under a contract of the job's own deadline and stdout budget: the
/// verified stdout is the result, a refusal is a failure whose message (it quotes the guest's
/// stderr) is the tool's own output, marked as such by the loop.
pub(crate) async fn run_verified(sandbox: &Sandbox, request: RunRequest<'_>, what: &str) -> ToolOutput {
    let limits = request.job().limits();
    let budget = Budget::new(limits.wall(), limits.stdout_bytes());
    let contract = Contract::bytes(budget, accept_any);
    match sandbox.run(request, &contract).await {
        Ok(Outcome::Verified(v)) => ToolOutput::Text(String::from_utf8_lossy(v.value()).into_owned()),
        Ok(Outcome::Refused(refusal)) => ToolOutput::Failed {
            reason: format!("{what} was refused ({} tier)", sandbox.tier_name()),
            output: Some(refusal.message()),
        },
        Err(e) => ToolOutput::failed(format!("the sandbox could not run it: {e}")),
    }
}
