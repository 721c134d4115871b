//! `agent.toml`: the endpoint, the system prompt, the policy, the budgets and the tools,
//! checked when it loads, with the line and column in every error.
//!
//! ```toml
//! [endpoint]
//! base_url = "http://127.0.0.1:8080/v1"
//! model = "smollm2"
//! api_key_env = "OPENAI_API_KEY"   # optional: the variable holding the key
//! ca_file = "ca.pem"               # optional: extra roots for an https endpoint
//! request_timeout = "120s"         # also: connect_timeout, retries, max_response,
//! tool_content = "empty"           # "empty" or "null": content of tool-call messages sent back
//! tool_choice = "auto"             # optional: "auto", "required" or "none"
//! temperature = 0.0                # optional, as is max_tokens
//!
//! [agent]
//! system_prompt = "You are the steward of Fort Milonga."
//! policy = "policy.toml"           # relative to this file
//! max_turns = 12                   # also: max_tool_calls, max_total_tokens, deadline,
//!                                  # tool_timeout, parallel_tools
//!
//! [[tool]]                         # a command tool: JSON arguments on stdin, answer on stdout
//! name = "read_scroll"
//! description = "Reads one delivery."
//! command = ["python3", "tools/read_scroll.py"]   # a relative program path is relative to this file
//! parameters = { type = "object", properties = { name = { type = "string" } }, required = ["name"] }
//! output = "untrusted"             # or "trusted"
//! env = ["STEWARD_SCROLLS"]        # passed through from the agent's environment when set
//! timeout = "10s"
//! max_output = "64K"
//! # confine = "process"            # optional: run it in the process tier, not on the host
//! # allow_net = ["api.github.com"] # optional, confined only: the hosts its runs reach
//!
//! [grant]                          # what run_code's programs may call on the host
//! policy = "grants.toml"           # decides each call (`tool = "desk.write_note"`)
//!
//! [[grant.mcp]]                    # a host MCP server: its tools are granted as desk.TOOL
//! name = "desk"
//! command = ["python3", "desk_server.py"]   # started on the host when the agent starts
//! env = ["DESK_LOG"]               # besides PATH and HOME, from the agent's environment
//!
//! [[tool]]                         # the built-in run_code
//! builtin = "run_code"
//! languages = ["python", "javascript", "sh"]
//! tier = "process"                 # or "docker" (with image = "...")
//! allow_net = ["pypi.org", "files.pythonhosted.org"]  # optional: python and sh reach these
//! timeout = "10s"
//! memory = "256M"
//! max_output = "64K"
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::command::CommandTool;
use crate::machine::{Profile, RunLimits, ToolChoice, ToolContent};
use crate::run_code::Language;
use crate::tool::{ToolDef, Trust};

/// Largest config or policy file read: 1 MiB.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// A config file could not be used.
#[derive(Debug, thiserror::Error)]
#[error("{}{}: {message}", path.display(), at.map(|(l, c)| format!(":{l}:{c}")).unwrap_or_default())]
#[non_exhaustive]
pub struct ConfigError {
    /// The file.
    pub path: PathBuf,
    /// Line and column (1-based), when the error has a place.
    pub at: Option<(usize, usize)>,
    /// What is wrong.
    pub message: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    endpoint: EndpointSection,
    #[serde(default)]
    agent: AgentSection,
    #[serde(default, rename = "tool")]
    tools: Vec<ToolSection>,
    #[serde(default)]
    grant: GrantSection,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct GrantSection {
    policy: Option<PathBuf>,
    #[serde(default)]
    mcp: Vec<McpSection>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct McpSection {
    name: String,
    command: Vec<String>,
    #[serde(default)]
    env: Vec<String>,
}

/// `[grant]` and each `[[grant.mcp]]`: what run_code's programs may call on the host, and
/// the policy that decides each call.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct GrantsConfig {
    /// The grants policy (TOML), relative to the config file; it names the granted tools
    /// (`tool = "desk.write_note"`), not the agent's.
    pub policy: Option<PathBuf>,
    /// The host MCP servers whose tools are granted as `NAME.TOOL`.
    pub mcp: Vec<McpGrantConfig>,
}

/// One `[[grant.mcp]]`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct McpGrantConfig {
    /// Its name: its tools are granted as `NAME.TOOL`.
    pub name: String,
    /// The program and its arguments (a relative path resolves against the config file).
    pub argv: Vec<String>,
    /// Variables passed through from the agent's environment (besides `PATH` and `HOME`).
    pub env: Vec<String>,
}

impl McpGrantConfig {
    /// The command that starts the server, with the named variables taken from this
    /// process's environment.
    ///
    /// # Ambient Authority
    /// Reads the process environment.
    pub fn command_ambient(&self) -> Result<stockade_runtime::mcp::McpCommand, stockade_runtime::mcp::McpError> {
        let (program, args) = self.argv.split_first().map_or(("", &[][..]), |(p, a)| (p.as_str(), a));
        let mut command =
            stockade_runtime::mcp::McpCommand::new(&self.name, program, args.iter().cloned())?.env_clear();
        for var in &self.env {
            if let Some(v) = std::env::var_os(var).and_then(|v| v.into_string().ok()) {
                command = command.env(var.clone(), v);
            }
        }
        Ok(command)
    }
}

/// `argv` with a relative program path, and arguments that name a file beside the config
/// (e.g. `tools/x.py`), resolved against `base`.
fn resolve_argv(base: &Path, mut argv: Vec<String>) -> Vec<String> {
    if let Some(program) = argv.first_mut()
        && program.contains('/')
        && Path::new(program.as_str()).is_relative()
    {
        *program = base.join(program.as_str()).to_string_lossy().into_owned();
    }
    for a in argv.iter_mut().skip(1) {
        if a.contains('/') && Path::new(a.as_str()).is_relative() && base.join(a.as_str()).exists() {
            *a = base.join(a.as_str()).to_string_lossy().into_owned();
        }
    }
    argv
}

/// `[endpoint]`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct EndpointSection {
    /// The base URL (`.../v1`).
    pub base_url: Option<String>,
    /// The model name.
    pub model: Option<String>,
    /// The environment variable holding the API key.
    pub api_key_env: Option<String>,
    /// Extra root certificates (PEM) for an https endpoint, relative to the config file.
    pub ca_file: Option<PathBuf>,
    /// Connect timeout.
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub connect_timeout: Option<Duration>,
    /// Per-request timeout.
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub request_timeout: Option<Duration>,
    /// Retries after the first attempt.
    pub retries: Option<u32>,
    /// Response body cap.
    #[serde(default, deserialize_with = "de_opt_size")]
    pub max_response: Option<u64>,
    /// `empty` or `null`.
    #[serde(default, deserialize_with = "de_tool_content")]
    pub tool_content: Option<ToolContent>,
    /// `auto`, `required` or `none`.
    #[serde(default, deserialize_with = "de_tool_choice")]
    pub tool_choice: Option<ToolChoice>,
    /// Sampling temperature.
    pub temperature: Option<f64>,
    /// `max_tokens` per completion.
    pub max_tokens: Option<u32>,
}

/// `[agent]`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct AgentSection {
    /// The system prompt (MARK's sentence is appended).
    #[serde(default)]
    pub system_prompt: String,
    /// The policy file, relative to the config file.
    pub policy: Option<PathBuf>,
    /// Model calls.
    pub max_turns: Option<u32>,
    /// Tool calls.
    pub max_tool_calls: Option<u32>,
    /// Tokens.
    pub max_total_tokens: Option<u64>,
    /// The run's wall time.
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub deadline: Option<Duration>,
    /// One tool call's time.
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub tool_timeout: Option<Duration>,
    /// Tool calls at once.
    pub parallel_tools: Option<usize>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolSection {
    name: Option<String>,
    builtin: Option<String>,
    description: Option<String>,
    command: Option<Vec<String>>,
    parameters: Option<toml::Value>,
    output: Option<String>,
    #[serde(default)]
    env: Vec<String>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    timeout: Option<Duration>,
    #[serde(default, deserialize_with = "de_opt_size")]
    max_output: Option<u64>,
    #[serde(default, deserialize_with = "de_opt_size")]
    memory: Option<u64>,
    languages: Option<Vec<String>>,
    tier: Option<String>,
    image: Option<String>,
    confine: Option<String>,
    #[serde(default)]
    allow_net: Vec<String>,
}

/// The tier a configured run goes to (`tier` and `confine` in `agent.toml`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfinedTier {
    /// The process tier (`"process"`).
    Process,
    /// The docker tier (`"docker"`, with an image).
    Docker,
}

impl ConfinedTier {
    /// The tier `name` names in `agent.toml`.
    #[must_use]
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "process" => Some(Self::Process),
            "docker" => Some(Self::Docker),
            _ => None,
        }
    }
}

/// The built-in `run_code`'s configuration.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RunCodeConfig {
    /// The languages offered.
    pub languages: Vec<Language>,
    /// `process` (python and sh as commands; javascript in wasm) or `docker`.
    pub tier: ConfinedTier,
    /// The image for `docker`.
    pub image: Option<String>,
    /// Each run's deadline.
    pub timeout: Duration,
    /// Each run's memory.
    pub memory: u64,
    /// Each run's stdout budget.
    pub max_output: u64,
    /// `--allow-net` entries for python and sh runs (none: no network).
    pub allow_net: Vec<String>,
}

impl RunCodeConfig {
    /// Every language in the process tier (javascript in wasm), 10 s, 256 MiB, 64 KiB of output.
    #[must_use]
    pub fn all() -> Self {
        Self {
            languages: vec![Language::Python, Language::Javascript, Language::Sh],
            tier: ConfinedTier::Process,
            image: None,
            timeout: Duration::from_secs(10),
            memory: 256 << 20,
            max_output: 64 << 10,
            allow_net: Vec::new(),
        }
    }
}

/// A command tool's configuration, resolved.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct CommandConfig {
    /// The definition.
    pub def: ToolDef,
    /// The program and its arguments (a relative program path resolved against the config's directory).
    pub argv: Vec<String>,
    /// Variables to pass through when set.
    pub env: Vec<String>,
    /// The timeout.
    pub timeout: Duration,
    /// The stdout cap.
    pub max_output: u64,
    /// Run it in this tier (only [`ConfinedTier::Process`]) instead of on the host.
    pub confine: Option<ConfinedTier>,
    /// `--allow-net` entries for its confined runs (none: no network).
    pub allow_net: Vec<String>,
}

/// A loaded `agent.toml`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AgentConfig {
    /// The file it came from.
    pub path: PathBuf,
    /// `[endpoint]`.
    pub endpoint: EndpointSection,
    /// `[agent]`.
    pub agent: AgentSection,
    /// The command tools.
    pub commands: Vec<CommandConfig>,
    /// The built-in run_code, if configured.
    pub run_code: Option<RunCodeConfig>,
    /// `[grant]`: what run_code's programs may call on the host.
    pub grants: GrantsConfig,
}

impl AgentConfig {
    /// Reads and checks the file at `path`.
    ///
    /// # Ambient Authority
    /// Reads a file by path.
    pub fn load_ambient(path: &Path) -> Result<Self, ConfigError> {
        let text = read_bounded(path)?;
        Self::parse(&text, path)
    }

    /// Checks `text` as if it were the file at `path` (relative paths resolve against its directory).
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let err = |at, message: String| ConfigError { path: path.to_owned(), at, message };
        let file: File = toml::from_str(text).map_err(|e| {
            let at = e.span().map(|s| line_col(text, s.start));
            err(at, e.message().to_owned())
        })?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let mut commands = Vec::new();
        let mut run_code = None;
        let mut names = Vec::new();
        for (i, t) in file.tools.into_iter().enumerate() {
            let place = |what: &str| {
                format!("tool {} ({}): {what}", i + 1, t.name.as_deref().or(t.builtin.as_deref()).unwrap_or("unnamed"))
            };
            let at = tool_line(text, i);
            match t.builtin.as_deref() {
                Some("run_code") => {
                    if t.command.is_some()
                        || t.parameters.is_some()
                        || t.name.as_deref().is_some_and(|n| n != "run_code")
                    {
                        return Err(err(at, place("the built-in run_code takes no name, command or parameters")));
                    }
                    let languages = match &t.languages {
                        None => vec![Language::Python, Language::Javascript, Language::Sh],
                        Some(ls) => ls
                            .iter()
                            .map(|l| {
                                Language::parse(l).ok_or_else(|| {
                                    err(at, place(&format!("unknown language {l:?} (python, javascript, sh)")))
                                })
                            })
                            .collect::<Result<_, _>>()?,
                    };
                    let tier = match t.tier.as_deref() {
                        None => ConfinedTier::Process,
                        Some(name) => ConfinedTier::parse(name)
                            .ok_or_else(|| err(at, place(&format!("tier {name:?} is not process or docker"))))?,
                    };
                    for entry in &t.allow_net {
                        stockade_runtime::egress::NetRule::parse(entry).map_err(|e| err(at, place(&e.to_string())))?;
                    }
                    names.push("run_code".to_owned());
                    run_code = Some(RunCodeConfig {
                        languages,
                        tier,
                        image: t.image.clone(),
                        timeout: t.timeout.unwrap_or(Duration::from_secs(10)),
                        memory: t.memory.unwrap_or(256 << 20),
                        max_output: t.max_output.unwrap_or(64 << 10),
                        allow_net: t.allow_net.clone(),
                    });
                }
                Some(other) => {
                    return Err(err(at, place(&format!("unknown builtin {other:?} (the only one is run_code)"))));
                }
                None => {
                    let name = t.name.clone().ok_or_else(|| err(at, place("a command tool needs a name")))?;
                    if !stockade_protocol::chat::is_valid_tool_name(&name) {
                        return Err(err(at, place("the name must be 1 to 64 of [a-zA-Z0-9_-]")));
                    }
                    let argv = t
                        .command
                        .clone()
                        .filter(|c| !c.is_empty())
                        .ok_or_else(|| err(at, place("a command tool needs command = [program, args...]")))?;
                    let argv = resolve_argv(&base, argv);
                    let parameters: Value = match &t.parameters {
                        Some(p) => serde_json::to_value(p).map_err(|e| err(at, place(&e.to_string())))?,
                        None => serde_json::json!({"type": "object", "properties": {}}),
                    };
                    let trust = match t.output.as_deref() {
                        Some("trusted") => Trust::Trusted,
                        Some("untrusted") => Trust::Untrusted,
                        other => {
                            return Err(err(
                                at,
                                place(&format!("output must be \"trusted\" or \"untrusted\", not {other:?}")),
                            ));
                        }
                    };
                    let def = ToolDef::new(name.clone(), t.description.clone().unwrap_or_default(), parameters, trust);
                    def.spec().map_err(|e| err(at, place(&e.to_string())))?;
                    let confine = match t.confine.as_deref() {
                        None => None,
                        Some("process") => Some(ConfinedTier::Process),
                        Some(c) => {
                            return Err(err(
                                at,
                                place(&format!("confine = {c:?}: the only tier for a command tool is \"process\"")),
                            ));
                        }
                    };
                    if !t.allow_net.is_empty() && confine.is_none() {
                        return Err(err(
                            at,
                            place(
                                "allow_net needs confine = \"process\": an unconfined command has the host's network already",
                            ),
                        ));
                    }
                    for entry in &t.allow_net {
                        stockade_runtime::egress::NetRule::parse(entry).map_err(|e| err(at, place(&e.to_string())))?;
                    }
                    names.push(name);
                    commands.push(CommandConfig {
                        def,
                        argv,
                        env: t.env.clone(),
                        timeout: t.timeout.unwrap_or(Duration::from_secs(10)),
                        max_output: t.max_output.unwrap_or(64 << 10),
                        confine,
                        allow_net: t.allow_net.clone(),
                    });
                }
            }
            if names.iter().filter(|n| **n == names[names.len() - 1]).count() > 1 {
                return Err(err(at, place("a tool of this name is defined twice")));
            }
        }
        let grants = grants_config(file.grant, &base).map_err(|m| err(None, m))?;
        let mut agent = file.agent;
        agent.policy = agent.policy.map(|p| if p.is_relative() { base.join(p) } else { p });
        let mut endpoint = file.endpoint;
        endpoint.ca_file = endpoint.ca_file.map(|p| if p.is_relative() { base.join(p) } else { p });
        Ok(Self { path: path.to_owned(), endpoint, agent, commands, run_code, grants })
    }

    /// The budgets this config names (defaults for the rest).
    #[must_use]
    pub fn limits(&self) -> RunLimits {
        let mut l = RunLimits::default();
        if let Some(n) = self.agent.max_turns {
            l = l.max_turns(n);
        }
        if let Some(n) = self.agent.max_tool_calls {
            l = l.max_tool_calls(n);
        }
        if let Some(n) = self.agent.max_total_tokens {
            l = l.max_total_tokens(n);
        }
        l
    }

    /// The server profile this config names.
    #[must_use]
    pub fn profile(&self) -> Profile {
        Profile {
            tool_content: self.endpoint.tool_content.unwrap_or_default(),
            tool_choice: self.endpoint.tool_choice.unwrap_or_default(),
            temperature: self.endpoint.temperature,
            max_tokens: self.endpoint.max_tokens,
        }
    }

    /// What an agent whose loop runs on the host (not `--confine`) needs beyond what
    /// [`parse`](Self::parse) checks: `[[grant.mcp]]` grants to `run_code`'s programs, so it
    /// needs the built-in `run_code` and a `[grant] policy` to decide their calls.
    pub fn check_unconfined(&self) -> Result<(), String> {
        if self.grants.mcp.is_empty() {
            return Ok(());
        }
        if self.run_code.is_none() {
            return Err("[[grant.mcp]] grants to run_code's programs: add the built-in run_code (or run the agent with --confine, whose model calls them)".into());
        }
        if self.grants.policy.is_none() {
            return Err("[[grant.mcp]] needs [grant] policy = \"FILE\": the policy that decides each call (or run the agent with --confine, where the agent's policy does)".into());
        }
        Ok(())
    }

    /// The policy file's text, if the config names one.
    ///
    /// # Ambient Authority
    /// Reads a file by path.
    pub fn policy_text_ambient(&self) -> Result<Option<String>, ConfigError> {
        self.agent.policy.as_deref().map(read_bounded).transpose()
    }
}

impl CommandConfig {
    /// The tool, with the named variables taken from this process's environment.
    ///
    /// # Ambient Authority
    /// Reads the process environment.
    #[must_use]
    pub fn tool_ambient(&self) -> CommandTool {
        let mut tool = CommandTool::new(self.def.clone(), self.argv.clone())
            .timeout(self.timeout)
            .max_output(usize::try_from(self.max_output).unwrap_or(usize::MAX));
        for var in &self.env {
            if let Some(v) = std::env::var_os(var).and_then(|v| v.into_string().ok()) {
                tool = tool.env(var.clone(), v);
            }
        }
        tool
    }
}

fn read_bounded(path: &Path) -> Result<String, ConfigError> {
    use std::io::Read;
    let err = |message: String| ConfigError { path: path.to_owned(), at: None, message };
    let file = std::fs::File::open(path).map_err(|e| err(format!("cannot open: {e}")))?;
    let mut text = String::new();
    file.take(MAX_CONFIG_BYTES + 1).read_to_string(&mut text).map_err(|e| err(format!("cannot read: {e}")))?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(err(format!("larger than {MAX_CONFIG_BYTES} bytes")));
    }
    Ok(text)
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

/// `[grant]` checked: each `[[grant.mcp]]` needs a name and a command. (What an unconfined
/// agent also needs, run_code to grant to and a `[grant] policy`, is
/// [`AgentConfig::check_unconfined`]: a confined agent's model calls the tools itself,
/// under the agent's policy.)
fn grants_config(section: GrantSection, base: &Path) -> Result<GrantsConfig, String> {
    let policy = section.policy.map(|p| if p.is_relative() { base.join(p) } else { p });
    let mut mcp: Vec<McpGrantConfig> = Vec::new();
    for (i, m) in section.mcp.into_iter().enumerate() {
        let place = format!("grant.mcp {} ({})", i + 1, m.name);
        if m.command.is_empty() {
            return Err(format!("{place}: needs command = [program, args...]"));
        }
        if mcp.iter().any(|o| o.name == m.name) {
            return Err(format!("{place}: a server of this name is defined twice"));
        }
        stockade_runtime::mcp::McpCommand::new(&m.name, "", Vec::<String>::new())
            .map_err(|e| format!("{place}: {e}"))?;
        mcp.push(McpGrantConfig { name: m.name, argv: resolve_argv(base, m.command), env: m.env });
    }
    if mcp.is_empty() && policy.is_some() {
        return Err("[grant] policy decides grant calls, and nothing is granted".into());
    }
    Ok(GrantsConfig { policy, mcp })
}

/// The place of the `i`-th `[[tool]]` header.
fn tool_line(text: &str, i: usize) -> Option<(usize, usize)> {
    let mut seen = 0;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        if line.trim_start().starts_with("[[tool]]") {
            if seen == i {
                return Some(line_col(text, offset + (line.len() - line.trim_start().len())));
            }
            seen += 1;
        }
        offset += line.len();
    }
    None
}

/// The one reader of human-written durations and sizes (`stockade_protocol::limits`).
pub use stockade_protocol::limits::{parse_duration, parse_size};

fn de_opt_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let s = String::deserialize(d)?;
    parse_duration(&s).map(Some).map_err(serde::de::Error::custom)
}

fn de_opt_size<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let s = String::deserialize(d)?;
    parse_size(&s).map(Some).map_err(serde::de::Error::custom)
}

fn de_tool_content<'de, D: Deserializer<'de>>(d: D) -> Result<Option<ToolContent>, D::Error> {
    match String::deserialize(d)?.as_str() {
        "empty" => Ok(Some(ToolContent::Empty)),
        "null" => Ok(Some(ToolContent::Null)),
        other => Err(serde::de::Error::custom(format!("tool_content must be \"empty\" or \"null\", not {other:?}"))),
    }
}

fn de_tool_choice<'de, D: Deserializer<'de>>(d: D) -> Result<Option<ToolChoice>, D::Error> {
    match String::deserialize(d)?.as_str() {
        "auto" => Ok(Some(ToolChoice::Auto)),
        "required" => Ok(Some(ToolChoice::Required)),
        "none" => Ok(Some(ToolChoice::None)),
        other => Err(serde::de::Error::custom(format!(
            "tool_choice must be \"auto\", \"required\" or \"none\", not {other:?}"
        ))),
    }
}
