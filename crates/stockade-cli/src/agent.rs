//! `stockade agent`: the steward's loop over any OpenAI-compatible endpoint, from a config
//! file and flags (flags win).

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use async_trait::async_trait;
use stockade_agent::config::{ConfinedTier, RunCodeConfig};
use stockade_agent::{
    Agent, AgentConfig, AgentError, ApiKey, ApprovalRequest, Approver, Endpoint, Language, NoApprover, RunCode, Trace,
};
use stockade_runtime::protocol::Limits;

use crate::{docker, wasm};

/// Sandboxes the agent's process tier keeps built ahead of the next command, per workspace:
/// an agent runs one command at a time, and the next is usually in the same workspace.
const AGENT_POOL: usize = 2;

/// Exit code when the run ended without an answer (budget spent, repeated denials, deadline).
pub(crate) const EXIT_NO_ANSWER: u8 = 3;
/// Exit code when the endpoint failed (unreachable after retries, auth, a bad response).
pub(crate) const EXIT_ENDPOINT: u8 = 4;

#[derive(clap::Args)]
pub(crate) struct AgentArgs {
    /// The agent's configuration (TOML): endpoint, system prompt, policy, budgets and tools.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The endpoint's base URL, e.g. http://127.0.0.1:8080/v1 or https://api.openai.com/v1.
    #[arg(long, value_name = "URL")]
    base_url: Option<String>,
    /// The model name.
    #[arg(long, value_name = "NAME")]
    model: Option<String>,
    /// The environment variable holding the API key (sent only to the base URL's origin).
    #[arg(long, value_name = "VAR")]
    api_key_env: Option<String>,
    /// The ALLOW policy (TOML); without one every tool call is denied.
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    /// Most model calls before "No answer after N turns".
    #[arg(long, value_name = "N")]
    max_turns: Option<u32>,
    /// Write a JSONL trace of requests, responses, decisions, tool runs and usage.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Print the result as one JSON object.
    #[arg(long, conflicts_with = "stream")]
    json: bool,
    /// Stream: print the model's text as it arrives (control characters escaped).
    #[arg(long)]
    stream: bool,
    /// Do not show the steps (each model call, decision and tool run) on stderr; they are
    /// shown only when stderr is a terminal, and never with --json.
    #[arg(long, short)]
    quiet: bool,
    /// Run the whole loop inside a tier: the model is reached through the run's model grant
    /// (the key stays here), every tool (commands, run_code, [[grant.mcp]] servers' tools)
    /// runs here only when the policy, decided here, allows the call, and the trace is
    /// written here from the broker's record.
    #[arg(long, value_name = "TIER")]
    confine: Option<ConfineTier>,
    /// With --confine docker: the image the loop runs in (built locally; nothing is pulled).
    /// It needs `sh`; the loop brings its own C library.
    #[arg(long, value_name = "IMAGE", requires = "confine")]
    image: Option<String>,
    /// For tests: the program run inside as the loop, in place of this binary.
    #[arg(long, value_name = "PROGRAM", hide = true, requires = "confine")]
    confine_loop: Option<PathBuf>,
    /// With --confine: keep this channel's conversation and workspace between turns, under
    /// stockade's state directory (outside every mount; the workspace is the loop's
    /// /workspace).
    #[arg(long, value_name = "NAME", requires = "confine")]
    channel: Option<String>,
    /// With --channel: who sends this message (a name of [a-zA-Z0-9_.-]).
    #[arg(long, value_name = "NAME", requires = "channel")]
    speaker: Option<String>,
    /// With --channel: start the channel over (its history and workspace removed) before
    /// this turn; without a message, only that.
    #[arg(long, requires = "channel")]
    reset: bool,
    /// The task (with --confine --channel, the channel's next message).
    #[arg(required_unless_present = "reset")]
    prompt: Option<String>,
}

/// `--confine`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum ConfineTier {
    /// A confined Linux process (namespaces, landlock, seccomp, cgroups).
    Process,
    /// A hardened container (the docker tier), the loop with the C library it was linked
    /// against; needs root, for the model grant's listener in the container's network.
    Docker,
}

/// The hidden subcommand the confined loop runs as, inside the tier.
pub(crate) const LOOP_COMMAND: &str = "confined-loop";

/// `stockade confined-loop`, inside a confined run: one turn on stdin, one reply line on
/// stdout (exit 0 whenever a reply was written; its `ok` says whether there is an answer).
pub(crate) fn confined_loop() -> Result<ExitCode> {
    use std::io::Read;
    use stockade_runtime::protocol::turn::{MAX_TURN_BYTES, Reply, Turn};
    let mut input = Vec::new();
    std::io::stdin().take(MAX_TURN_BYTES as u64 + 1).read_to_end(&mut input)?;
    let reply = match Turn::parse(&input) {
        Ok(turn) => {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(stockade_agent::serve_turn_ambient(&turn))
        }
        Err(e) => Reply::new(false, format!("the turn: {e}")),
    };
    std::io::stdout().lock().write_all(&reply.to_line())?;
    Ok(ExitCode::SUCCESS)
}

/// Asks on the terminal, on stderr, for each `ask` decision: the exact call, y/N.
#[derive(Debug)]
struct TerminalApprover;

#[async_trait]
impl Approver for TerminalApprover {
    async fn approve(&self, r: &ApprovalRequest) -> bool {
        let question = format!(
            "\nstockade: the policy asks before this call runs\n  tool:      {}\n  arguments: {}\n  rule:      {}\n  reason:    {}\nAllow this one call? [y/N] ",
            r.tool,
            crate::term::outside_text(&r.arguments),
            r.rule,
            crate::term::outside_text(&r.reason)
        );
        // The terminal is read off the runtime's thread: the broker (a confined run's model
        // and tool calls, its deadline) goes on serving while the human decides.
        tokio::task::spawn_blocking(move || {
            let mut err = std::io::stderr().lock();
            let _ = err.write_all(question.as_bytes());
            let _ = err.flush();
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).is_ok() && matches!(line.trim(), "y" | "Y" | "yes")
        })
        .await
        .unwrap_or(false)
    }
}

/// The terminal, when stdin and stderr are one; otherwise nobody, and every `ask` is a denial.
fn approver() -> Arc<dyn Approver> {
    if std::io::stdin().is_terminal() && std::io::stderr().is_terminal() {
        Arc::new(TerminalApprover)
    } else {
        Arc::new(NoApprover)
    }
}

pub(crate) fn run(args: AgentArgs) -> Result<ExitCode> {
    if args.confine.is_some() && args.stream {
        bail!("--stream is not available with --confine: the loop's text reaches the host as one reply")
    }
    if args.image.is_some() && args.confine != Some(ConfineTier::Docker) {
        bail!("--image is the image of --confine docker")
    }
    let config = match &args.config {
        Some(path) => AgentConfig::load_ambient(path)?,
        None => AgentConfig::parse("", Path::new("agent.toml"))?,
    };
    let base_url = args
        .base_url
        .clone()
        .or_else(|| config.endpoint.base_url.clone())
        .context("no endpoint: pass --base-url URL or set [endpoint] base_url in --config")?;
    let model = args
        .model
        .clone()
        .or_else(|| config.endpoint.model.clone())
        .context("no model: pass --model NAME or set [endpoint] model")?;
    let mut endpoint = Endpoint::new(&base_url, model)?;
    if let Some(d) = config.endpoint.connect_timeout {
        endpoint = endpoint.connect_timeout(d);
    }
    if let Some(d) = config.endpoint.request_timeout {
        endpoint = endpoint.request_timeout(d);
    }
    if let Some(n) = config.endpoint.retries {
        endpoint = endpoint.retries(n);
    }
    if let Some(n) = config.endpoint.max_response {
        endpoint = endpoint.max_response_bytes(usize::try_from(n).unwrap_or(usize::MAX));
    }
    if let Some(path) = &config.endpoint.ca_file {
        let pem = std::fs::read(path).with_context(|| format!("reading the ca_file {}", path.display()))?;
        endpoint = endpoint.with_root_pem(&pem)?;
    }
    if let Some(var) = args.api_key_env.as_ref().or(config.endpoint.api_key_env.as_ref()) {
        endpoint = endpoint.with_key(ApiKey::from_env_ambient(var)?);
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let mut tools: Vec<Arc<dyn stockade_agent::Tool>> = Vec::new();
    for c in &config.commands {
        let mut tool = c.tool_ambient();
        if c.confine == Some(ConfinedTier::Process) {
            // Sandboxes built ahead of each command (G15 of stockade-process).
            tool = tool.confined(crate::tiers::process_pool(AGENT_POOL)?);
            if let Some(grant) = crate::run::net_grant_from(None, &c.allow_net, &[])? {
                tool = tool.net(grant);
            }
        }
        tools.push(Arc::new(tool));
    }
    let run_code = match (&config.run_code, &args.config) {
        (Some(rc), _) => Some(rc.clone()),
        // No config file: offer run_code in every language this host has.
        (None, None) => Some(RunCodeConfig::all()),
        (None, Some(_)) => None,
    };
    if args.confine.is_none()
        && let Err(e) = config.check_unconfined()
    {
        let path = args.config.as_deref().unwrap_or(Path::new("agent.toml"));
        bail!("{}: {e}", path.display());
    }
    let servers = rt.block_on(start_mcp_servers(&config.grants))?;
    if let Some(rc) = &run_code {
        let mut tool = rt.block_on(run_code_tool(rc))?;
        if !servers.is_empty() && (args.confine.is_none() || config.grants.policy.is_some()) {
            tool = tool.functions(mcp_grants(&config.grants, &servers)?);
        }
        tools.push(Arc::new(tool));
    }
    let policy_text = match (&args.policy, config.policy_text_ambient()?) {
        (Some(path), _) => {
            std::fs::read_to_string(path).with_context(|| format!("reading the policy {}", path.display()))?
        }
        (None, Some(text)) => text,
        (None, None) => {
            writeln!(std::io::stderr(), "stockade: no policy given (--policy FILE): every tool call will be denied")?;
            "version = 1\ndefault = \"deny\"\n".to_owned()
        }
    };
    let mut limits = config.limits();
    if let Some(n) = args.max_turns {
        limits = limits.max_turns(n);
    }
    if let Some(tier) = args.confine {
        return confined(&args, &config, tier, endpoint, tools, &servers, &policy_text, limits, &rt);
    }
    let mut builder =
        Agent::builder(endpoint).system_prompt(config.agent.system_prompt.clone()).profile(config.profile());
    for tool in tools {
        builder = builder.tool(tool);
    }
    builder = builder.policy_toml(&policy_text).context("loading the policy")?.limits(limits);
    if let Some(d) = config.agent.deadline {
        builder = builder.deadline(d);
    }
    if let Some(d) = config.agent.tool_timeout {
        builder = builder.tool_timeout(d);
    }
    if let Some(n) = config.agent.parallel_tools {
        builder = builder.parallel_tools(n);
    }
    builder = builder.approver(approver());
    if let Some(t) = trace(&args)? {
        builder = builder.trace(t);
    }
    if args.stream {
        builder = builder.stream(Arc::new(|text: &str| {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(crate::term::outside_text(text).as_bytes());
            let _ = out.flush();
        }));
    }
    let agent = builder.build()?;
    let result = rt.block_on(agent.run_until(args.prompt.as_deref().unwrap_or_default(), stop()));
    answer(&args, &result)
}

/// The trace `--trace` names, and on a terminal (without `--quiet` or `--json`) the steps
/// shown as they happen.
fn trace(args: &AgentArgs) -> Result<Option<Trace>> {
    let file = match &args.trace {
        Some(path) => {
            Some(Trace::create_ambient(path).with_context(|| format!("creating the trace {}", path.display()))?)
        }
        None => None,
    };
    let show = !args.quiet && !args.json && std::io::stderr().is_terminal();
    Ok(match (file, show) {
        (Some(t), true) => Some(t.with_observer(Arc::new(show_step))),
        (None, true) => Some(Trace::observer(Arc::new(show_step))),
        (file, false) => file,
    })
}

/// `stockade agent --confine`: the loop inside the tier, everything with authority here.
#[allow(clippy::too_many_arguments, reason = "one call site: the pieces `run` already built")]
fn confined(
    args: &AgentArgs,
    config: &AgentConfig,
    tier: ConfineTier,
    endpoint: Endpoint,
    tools: Vec<Arc<dyn stockade_agent::Tool>>,
    servers: &[Arc<stockade_runtime::mcp::McpServer>],
    policy_text: &str,
    limits: stockade_agent::RunLimits,
    rt: &tokio::runtime::Runtime,
) -> Result<ExitCode> {
    let sandbox = match tier {
        ConfineTier::Process => crate::tiers::process_pool(1)?,
        ConfineTier::Docker => {
            // The loop reaches the model at OPENAI_BASE_URL, a listener the host puts in the
            // container's network namespace, which takes root (setns).
            if !stockade_runtime::sys::proc::is_root().context("reading /proc/self")? {
                bail!(
                    "--confine docker needs root: the loop reaches the model at OPENAI_BASE_URL, a listener put in the container's network namespace (setns); use --confine process"
                );
            }
            rt.block_on(crate::tiers::docker())?
        }
    };
    let program = match &args.confine_loop {
        Some(p) => p.clone(),
        None => std::env::current_exe().context("locating the stockade binary to run as the loop")?,
    };
    let loop_args = if args.confine_loop.is_some() { Vec::new() } else { vec![LOOP_COMMAND.to_owned()] };
    let mut builder = stockade_agent::ConfinedAgent::builder(sandbox, endpoint, program, loop_args)
        .system_prompt(config.agent.system_prompt.clone())
        .profile(config.profile())
        .limits(limits);
    builder = builder.approver(approver());
    if tier == ConfineTier::Docker {
        builder = builder.image(args.image.clone().unwrap_or_else(|| docker::spec::DEFAULT_IMAGE.to_owned()));
    }
    for tool in tools {
        builder = builder.tool(tool);
    }
    let mut grants = stockade_runtime::Grants::new();
    for server in servers {
        grants = grants.mcp(server)?;
    }
    builder = builder.grants(&grants)?.policy_toml(policy_text);
    if let Some(d) = config.agent.deadline {
        builder = builder.deadline(d);
    }
    if let Some(d) = config.agent.tool_timeout {
        builder = builder.tool_timeout(d);
    }
    if let Some(t) = trace(args)? {
        builder = builder.trace(t);
    }
    let channel = match &args.channel {
        Some(name) => {
            let root = stockade_runtime::process::state_dir()
                .context("--channel: no state directory (set STOCKADE_STATE_DIR, XDG_STATE_HOME or HOME)")?;
            let channel = stockade_agent::Channel::open(&root, name)?;
            if args.reset {
                channel.reset()?;
            }
            if tier == ConfineTier::Docker {
                // A one-shot docker run binds the workspace as the container's user.
                channel.share_workspace(docker::spec::JOB_UID, docker::spec::JOB_UID)?;
            }
            builder = builder.workspace(channel.workspace(), stockade_runtime::protocol::Access::ReadWrite);
            Some(channel)
        }
        None => None,
    };
    let Some(prompt) = args.prompt.as_deref() else { return Ok(ExitCode::SUCCESS) };
    let agent = builder.build().context("loading the policy")?;
    let mut turn = agent.turn(prompt);
    if let Some(speaker) = &args.speaker {
        turn.speaker = Some(
            stockade_runtime::protocol::GrantName::new(speaker.clone())
                .map_err(|_| anyhow::anyhow!("--speaker {speaker:?}: a name of 1-64 bytes of [a-zA-Z0-9_.-]"))?,
        );
    }
    if let Some(channel) = &channel {
        turn.history = channel.history()?;
    }
    let result = rt.block_on(agent.run_until(&turn, stop()));
    if let (Some(channel), Ok(answer)) = (&channel, &result) {
        let message = match &args.speaker {
            Some(who) => format!("{who}: {prompt}"),
            None => prompt.to_owned(),
        };
        channel.record(&message, &answer.text, answer.read_untrusted)?;
    }
    answer(args, &result)
}

/// What stops an agent's run from outside: the first stop signal (a signal that cannot be
/// watched stops nothing, and ends the process as it always would).
async fn stop() -> String {
    match crate::stop_signal().await {
        Ok((name, _)) => name.to_owned(),
        Err(_) => std::future::pending().await,
    }
}

/// Prints the answer (or the error) as `--json` or text says, and the exit code for it.
fn answer(args: &AgentArgs, result: &Result<stockade_agent::Answer, AgentError>) -> Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    let code = match result {
        Ok(_) => ExitCode::SUCCESS,
        Err(AgentError::Endpoint(_)) => ExitCode::from(EXIT_ENDPOINT),
        Err(AgentError::Internal(_) | AgentError::Sandbox(_)) => ExitCode::from(crate::EXIT_STOCKADE),
        Err(AgentError::Interrupted { why, .. }) => ExitCode::from(crate::stopped_exit(why)),
        Err(_) => ExitCode::from(EXIT_NO_ANSWER),
    };
    if args.json {
        let value = match result {
            Ok(a) => {
                serde_json::json!({"answer": a.text, "turns": a.turns, "tool_calls": a.tool_calls, "tokens": a.tokens, "error": null})
            }
            Err(e) => serde_json::json!({"answer": null, "error": message(e)}),
        };
        writeln!(out, "{value}")?;
    } else {
        match result {
            // Streamed: the text is on the terminal already.
            Ok(_) if args.stream => writeln!(out)?,
            Ok(a) => writeln!(out, "{}", crate::term::outside_text(&a.text))?,
            // An error can quote a tool, a server or a confined loop: outside text.
            Err(e) => writeln!(std::io::stderr(), "stockade: {}", crate::term::outside_text(&message(e)))?,
        }
    }
    Ok(code)
}

/// One step of the run on stderr, compactly (`stockade agent` on a terminal): each model
/// call, each proposed call with its canonical arguments (cut at 80 characters) and the
/// policy's decision with its rule, and each tool run with its status, time and output size,
/// saying when the output was marked untrusted. Model- and tool-written text has its control
/// characters made visible, as the run's stderr has.
fn show_step(event: &str, v: &serde_json::Value) {
    let s = |k: &str| v[k].as_str().map(crate::term::outside_line).unwrap_or_default();
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    let line = match event {
        "request" if n("attempt") <= 1 => format!("turn {}: asking the model", n("turn")),
        "request" => format!("turn {}: asking the model again (attempt {})", n("turn"), n("attempt")),
        // A confined loop's call is the broker's record: arguments for a function grant only.
        "decision" => {
            let args = match &v["args"] {
                serde_json::Value::Null => String::new(),
                serde_json::Value::String(a) => format!(" {}", crate::term::outside_line(a)),
                other => format!(" {}", crate::term::outside_line(&other.to_string())),
            };
            let args: String = if args.chars().count() > 81 {
                args.chars().take(80).chain(std::iter::once('…')).collect()
            } else {
                args
            };
            let confined = if v["confined"] == serde_json::Value::Bool(true) { " (confined)" } else { "" };
            format!("  {}{confined}{args}: {} (rule {})", s("tool"), s("effect"), s("rule"))
        }
        "tool" => format!(
            "  ran {}: {} in {} ms, {} bytes{}",
            s("tool"),
            s("status"),
            n("ms"),
            n("bytes"),
            if v["untrusted"] == serde_json::Value::Bool(true) { ", marked untrusted" } else { "" }
        ),
        _ => return,
    };
    let _ = writeln!(std::io::stderr().lock(), "stockade: {line}");
}

/// The error as the user reads it ("No answer after 12 turns").
fn message(e: &AgentError) -> String {
    let text = e.to_string();
    let mut chars = text.chars();
    chars.next().map(|c| c.to_uppercase().chain(chars).collect()).unwrap_or_default()
}

/// The `[[grant.mcp]]` servers, started.
async fn start_mcp_servers(
    config: &stockade_agent::config::GrantsConfig,
) -> Result<Vec<Arc<stockade_runtime::mcp::McpServer>>> {
    let mut servers = Vec::new();
    for m in &config.mcp {
        servers
            .push(crate::run::start_mcp(m.command_ambient()?).await.with_context(|| format!("grant.mcp {}", m.name))?);
    }
    Ok(servers)
}

/// The started `[[grant.mcp]]` servers' tools, with the `[grant] policy` over them (the
/// grants `run_code`'s programs get).
fn mcp_grants(
    config: &stockade_agent::config::GrantsConfig,
    servers: &[Arc<stockade_runtime::mcp::McpServer>],
) -> Result<stockade_runtime::Grants> {
    let mut grants = stockade_runtime::Grants::new();
    for server in servers {
        grants = grants.mcp(server)?;
    }
    let path = config.policy.as_ref().context("[[grant.mcp]] needs [grant] policy")?;
    let text = std::fs::read_to_string(path).with_context(|| format!("reading the grant policy {}", path.display()))?;
    let policy = stockade_runtime::policy::allow::Policy::from_toml(&text, &grants.registry())
        .map_err(|e| anyhow::anyhow!("grant policy {}: {e}", path.display()))?;
    Ok(grants.policy(policy))
}

/// `run_code` with a sandbox per configured language; a language this host cannot run is
/// left out (and said on stderr).
async fn run_code_tool(rc: &RunCodeConfig) -> Result<RunCode> {
    let limits = Limits::new()
        .with_wall(rc.timeout)?
        .with_cpu(rc.timeout)?
        .with_memory(rc.memory)?
        .with_stdout(rc.max_output)?;
    let mut tool = RunCode::new(limits);
    let wants = |l| rc.languages.contains(&l);
    if rc.tier == ConfinedTier::Docker {
        let sandbox = crate::tiers::docker().await.map_err(|e| anyhow::anyhow!("run_code's docker tier: {e}"))?;
        let image = rc.image.clone().unwrap_or_else(|| docker::spec::DEFAULT_IMAGE.to_owned());
        for l in [Language::Sh, Language::Python].into_iter().filter(|l| wants(*l)) {
            tool = tool.image(l, sandbox.clone(), image.clone());
        }
        if wants(Language::Javascript) {
            bail!("run_code: javascript runs in the wasm tier; use tier = \"process\" for it");
        }
        return with_net(tool, rc);
    }
    if wants(Language::Python) || wants(Language::Sh) {
        let sandbox = crate::tiers::process_pool(AGENT_POOL)?;
        for l in [Language::Python, Language::Sh].into_iter().filter(|l| wants(*l)) {
            tool = tool.command(l, sandbox.clone());
        }
    }
    if wants(Language::Javascript) {
        match wasm::guests::javascript() {
            Ok(_) => {
                tool = tool.javascript(crate::tiers::wasm()?);
            }
            Err(e) => {
                writeln!(std::io::stderr(), "stockade: run_code will not offer javascript: {e}")?;
            }
        }
    }
    with_net(tool, rc)
}

/// `tool` with the network grant of `rc.allow_net`, if it names any host.
fn with_net(tool: RunCode, rc: &RunCodeConfig) -> Result<RunCode> {
    Ok(match crate::run::net_grant_from(None, &rc.allow_net, &[])? {
        Some(grant) => tool.net(grant, rc.allow_net.clone()),
        None => tool,
    })
}
