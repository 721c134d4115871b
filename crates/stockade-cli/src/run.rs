//! `stockade run`: its flags, the job they describe, the grants, and the run itself.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use stockade_agent::config::{parse_duration, parse_size};
use stockade_runtime::protocol::{Access, Busy, Job, Limits};
use stockade_runtime::verify::{Budget, Contract, accept_any};
use stockade_runtime::{RunError, RunRequest, Sandbox};
use stockade_runtime::{docker, egress, wasm};

use crate::tiers::{self, TierKind};
use crate::{process, term};

#[derive(clap::Args)]
pub(crate) struct RunArgs {
    /// The isolation tier: `process` (a confined Linux process) or `wasm` (a WebAssembly
    /// guest in wasmtime).
    #[arg(long, value_enum, default_value_t = TierKind::Process)]
    tier: TierKind,
    /// The image for `--tier docker` (built locally; nothing is pulled).
    #[arg(long, default_value = docker::spec::DEFAULT_IMAGE)]
    image: String,
    /// An OCI runtime for `--tier docker` that the engine has registered, e.g. `runsc`
    /// (gVisor); the run fails if the engine lacks it.
    #[arg(long, value_name = "NAME")]
    docker_runtime: Option<String>,
    /// Run this JavaScript in the wasm tier's QuickJS guest (needs `--tier wasm`).
    #[arg(long, value_name = "CODE", conflicts_with_all = ["js_file", "command"])]
    js: Option<String>,
    /// Run this Python in the wasm tier's CPython guest (needs `--tier wasm`, a stockade built
    /// with `--features python`, and `cargo xtask guests --python`). Grants are globals, as
    /// in JavaScript (`print(add(len(rows), 1))`), and `from host import tools` lists them.
    #[arg(long, value_name = "CODE", conflicts_with_all = ["js", "js_file", "command"])]
    python: Option<String>,
    /// Run the JavaScript in this file in the wasm tier's QuickJS guest (needs `--tier wasm`).
    #[arg(long, value_name = "FILE", conflicts_with = "command")]
    js_file: Option<PathBuf>,
    /// The exported function of a wasm module to call (`_start` runs a WASI command).
    #[arg(long, default_value = "_start")]
    entry: String,
    /// Wall-clock deadline (e.g. 500ms, 2s, 1m).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    timeout: Duration,
    /// CPU-time limit (process tier: RLIMIT_CPU; wasm tier: fuel at a calibrated rate).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    cpu: Duration,
    /// Memory limit (e.g. 256M, 1G).
    #[arg(long, default_value = "512M", value_parser = parse_size)]
    memory: u64,
    /// Stdout budget; more output kills the run (e.g. 64K, 1M).
    #[arg(long, default_value = "1M", value_parser = parse_size)]
    max_output: u64,
    /// Grant a host directory at /workspace, read-only (`:ro`, the default) or read-write (`:rw`).
    /// It must be a dedicated directory (a project, or one from `mktemp -d`): `/`, system
    /// directories, `/tmp` or a home directory itself are refused. Yours is usable whatever
    /// its mode, and what the program creates there is yours.
    #[arg(long, value_name = "DIR[:ro|:rw]")]
    workspace: Option<String>,
    /// If another run holds the workspace (a read-write run holds its workspace and every
    /// directory inside it alone until it is done), fail at once (exit 125) instead of waiting.
    #[arg(long, requires = "workspace")]
    no_wait: bool,
    /// Follow a symlink on the workspace path that leads out of the directory holding it
    /// (refused by default: an earlier run's guest could have planted it).
    #[arg(long, requires = "workspace")]
    follow_workspace_links: bool,
    /// Grant one environment variable (repeatable); the environment is otherwise empty.
    #[arg(long = "env", value_name = "K=V")]
    env: Vec<String>,
    /// The exit code a verified run must end with.
    #[arg(long, default_value_t = 0)]
    expect_exit: i32,
    /// Stdout must be one JSON document.
    #[arg(long)]
    expect_json: bool,
    /// Require this landlock ABI (a kernel without it fails closed).
    #[arg(long, default_value_t = process::DEFAULT_LANDLOCK_ABI)]
    landlock_abi: u8,
    /// Limit memory and processes with rlimits only, without a per-run cgroup (faster start
    /// on cgroup v1 hosts; no out-of-memory report).
    #[arg(long)]
    no_cgroup: bool,
    /// Feed the program this file as stdin, streamed (instead of the CLI's own stdin).
    #[arg(long, value_name = "FILE", conflicts_with = "no_stdin")]
    stdin: Option<PathBuf>,
    /// Give the program no stdin (`/dev/null`). By default the CLI's stdin is streamed to the
    /// program when it is not a terminal (`tar c . | stockade run -- tar t`).
    #[arg(long)]
    no_stdin: bool,
    /// Do not show the program's stderr as it runs (a refusal's line then quotes its start).
    #[arg(long)]
    quiet: bool,
    /// Pass the program's stderr and stdout to a terminal unchanged; by default control
    /// sequences (clear screen, titles, clipboard writes, cursor movement) are shown as `^[`
    /// text on a terminal. Into a pipe or a file the bytes always pass unchanged.
    #[arg(long)]
    raw: bool,
    /// Give the program a terminal (process tier): stdin, stdout and stderr are a private
    /// pseudo-terminal, so output is stdout and stderr interleaved with `\r\n` line endings;
    /// its window size is this terminal's, if stockade runs on one.
    #[arg(long)]
    tty: bool,
    /// Grant data as NAME (repeatable): `NAME=@FILE.json` or `NAME=JSON`. The guest reads it
    /// as `$STOCKADE_GRANTS/data/NAME.json` (process, docker), as a global (JavaScript), or
    /// with `stockade-call NAME`.
    #[arg(long = "grant-data", value_name = "NAME=@FILE.json")]
    grant_data: Vec<String>,
    /// Grant a host command as the function NAME (repeatable). It runs on the host, as you,
    /// with the call's arguments as one JSON object on stdin, and answers on stdout (10 s,
    /// 64 KiB); the guest calls it with `stockade-call NAME '{...}'` (or `NAME(...)` in
    /// JavaScript), and only when --grant-policy allows the call.
    #[arg(long = "grant-tool", value_name = "NAME=COMMAND")]
    grant_tool: Vec<String>,
    /// The JSON Schema of a granted tool's arguments object: `NAME=@FILE.json` or
    /// `NAME=JSON` (default: no arguments). Its `required` list, in order, gives the
    /// positional parameters in JavaScript.
    #[arg(long = "grant-schema", value_name = "NAME=@FILE.json")]
    grant_schema: Vec<String>,
    /// Grant a host MCP server's tools (repeatable): stockade starts COMMAND (a shell command
    /// line, run on the host as you, as any MCP client starts a stdio server), shakes hands,
    /// and grants each tool as the function `NAME.TOOL` with the server's input schema; the
    /// guest calls `stockade-call NAME.TOOL '{...}'` (`NAME.TOOL(...)` in JavaScript,
    /// `NAME.TOOL(...)` in Python), and only when --grant-policy allows the call (`tool =
    /// "NAME.TOOL"`). The result keeps the server's `isError`; the server's stderr is shown
    /// here, prefixed, and never to the guest.
    #[arg(long = "grant-mcp", value_name = "NAME=COMMAND")]
    grant_mcp: Vec<String>,
    /// The policy (TOML) that decides every call of a granted tool; without one, every call
    /// is denied.
    #[arg(long = "grant-policy", value_name = "FILE")]
    grant_policy: Option<PathBuf>,
    /// Refuse the run (exit 116) if the broker denied any grant call.
    #[arg(long)]
    grant_strict: bool,
    /// Grant a model: the guest speaks OpenAI-compatible HTTP to `$STOCKADE_MODEL_SOCKET`
    /// (and, in the process tier and as root in the docker tier, to `$OPENAI_BASE_URL` on the
    /// run's own loopback) with a
    /// per-run placeholder in `$OPENAI_API_KEY`, or calls `model({...})` in JavaScript
    /// (`stockade-call model JSON` from a shell); the broker validates each request,
    /// rebuilds it, and sends it to --base-url with the real key from --api-key-env, which
    /// never enters the sandbox.
    #[arg(long, requires_all = ["base_url", "model"])]
    grant_model: bool,
    /// The upstream of --grant-model (e.g. http://127.0.0.1:8080/v1).
    #[arg(long, value_name = "URL", requires = "grant_model")]
    base_url: Option<String>,
    /// The one model --grant-model serves.
    #[arg(long, value_name = "NAME", requires = "grant_model")]
    model: Option<String>,
    /// The host environment variable holding --grant-model's real API key.
    #[arg(long, value_name = "VAR", requires = "grant_model")]
    api_key_env: Option<String>,
    /// Tokens the guest may use through --grant-model in one run.
    #[arg(long, value_name = "N", default_value_t = stockade_agent::DEFAULT_RUN_TOKENS, requires = "grant_model")]
    grant_model_tokens: u64,
    /// Let the program reach SPEC through a policed proxy on the run's own loopback
    /// (repeatable; process tier, and docker as root): `host` (ports 80 and 443),
    /// `host:port`, `*.domain` (subdomains only), an address or a CIDR block. Every
    /// connection is decided, names are resolved on the host and never to a private address
    /// (see --net-resolve), and a tunnel to a name must carry TLS naming it. HTTP_PROXY,
    /// HTTPS_PROXY and ALL_PROXY (socks5h) are set: curl, pip, git, Python's urllib,
    /// requests and httpx, and Go honour them. Clients that do not: Node's fetch before 24
    /// (set NODE_USE_ENV_PROXY=1 on 24+, or use undici's EnvHttpProxyAgent), the JVM (pass
    /// -Dhttps.proxyHost=127.0.0.1 -Dhttps.proxyPort=8765), and anything that opens raw
    /// sockets; they reach nothing, since the run has no route out.
    #[arg(long = "allow-net", value_name = "SPEC")]
    allow_net: Vec<String>,
    /// The full form of --allow-net: a stockade-policy TOML file over the tool
    /// `net.connect` (arguments host, port, scheme, and for plain http method and path),
    /// with allow and deny rules, limits and examples.
    #[arg(long = "net-policy", value_name = "FILE", conflicts_with = "allow_net")]
    net_policy: Option<PathBuf>,
    /// Point HOST:PORT at ADDRESS, as curl's --resolve does: the one way a name reaches a
    /// loopback or private address (repeatable).
    #[arg(long = "net-resolve", value_name = "HOST:PORT:ADDRESS")]
    net_resolve: Vec<String>,
    /// Keep a credential out of the sandbox (repeatable): the program finds a per-run
    /// placeholder in $ENVVAR (and $STOCKADE_SECRET_ENVVAR); for HOST only, the proxy ends
    /// the program's TLS with a per-run CA (trusted through SSL_CERT_FILE, REQUESTS_CA_BUNDLE,
    /// NODE_EXTRA_CA_CERTS, PIP_CERT, GIT_SSL_CAINFO and CURL_CA_BUNDLE), puts the real
    /// value from stockade's own $ENVVAR where the placeholder is in HEADER (Authorization
    /// unless named), and sends the request on over TLS verified against the host's roots.
    #[arg(long = "net-secret", value_name = "HOST=ENVVAR[:HEADER]")]
    net_secret: Vec<String>,
    /// Print the whole report as JSON (on stdout) instead of the verified output.
    #[arg(long)]
    json: bool,
    /// A WebAssembly module to run (`--tier wasm`); its arguments follow `--`.
    #[arg(value_name = "MODULE.wasm", conflicts_with_all = ["js", "js_file", "python"])]
    module: Option<PathBuf>,
    /// The command and its arguments (for `--tier wasm` without MODULE.wasm: the module file
    /// and its arguments).
    #[arg(last = true, required_unless_present_any = ["js", "js_file", "python", "module"], num_args = 1..)]
    command: Vec<String>,
}

fn job(args: &RunArgs) -> Result<Job> {
    let limits = Limits::new()
        .with_wall(args.timeout)?
        .with_cpu(args.cpu)?
        .with_memory(args.memory)?
        .with_stdout(args.max_output)?;
    let script = match (&args.js, &args.js_file) {
        (Some(code), _) => Some(code.clone().into_bytes()),
        (None, Some(file)) => Some(std::fs::read(file).with_context(|| format!("reading {}", file.display()))?),
        (None, None) => None,
    };
    if args.tty && args.tier != TierKind::Process {
        bail!("--tty needs --tier process");
    }
    if let Some(code) = &args.python {
        if args.tier != TierKind::Wasm {
            bail!("--python needs --tier wasm");
        }
        let granted = !args.grant_data.is_empty()
            || !args.grant_tool.is_empty()
            || !args.grant_mcp.is_empty()
            || args.grant_model;
        return with_grants(python_job(code, granted)?.with_limits(limits), args);
    }
    let job = match (args.tier, script) {
        (TierKind::Wasm, Some(script)) => wasm::javascript_job(script)?,
        (_, Some(_)) => bail!("--js and --js-file need --tier wasm"),
        (TierKind::Wasm, None) => {
            let (module, rest) = match &args.module {
                Some(m) => (m.clone(), args.command.as_slice()),
                None => {
                    let (m, rest) = args.command.split_first().context("no module given")?;
                    (PathBuf::from(m), rest)
                }
            };
            let module = std::fs::canonicalize(&module).with_context(|| format!("module {}", module.display()))?;
            Job::wasm(module, args.entry.clone(), rest.iter().cloned())?
        }
        (_, None) if args.module.is_some() => bail!("a module file needs --tier wasm"),
        (TierKind::Docker, None) => Job::image(args.image.clone(), args.command.iter().cloned())?,
        _ => {
            let (program, rest) = args.command.split_first().context("no command given")?;
            Job::command(program.clone(), rest.iter().cloned())?
        }
    };
    with_grants(job.with_limits(limits), args)
}

/// A `--workspace DIR[:ro|:rw]` value: the directory as the user named it, resolved by
/// [`resolve_as_given`], and the access.
pub(crate) fn parse_workspace(spec: &str, follow_links: bool) -> Result<(PathBuf, Access)> {
    let (dir, access) = match spec.rsplit_once(':') {
        Some((d, "rw")) => (d, Access::ReadWrite),
        Some((d, "ro")) => (d, Access::ReadOnly),
        _ => (spec, Access::ReadOnly),
    };
    Ok((resolve_as_given(std::path::Path::new(dir), follow_links)?, access))
}

/// Resolves a workspace path as the user typed it (relative to the current directory, `.`
/// and `..` as the kernel takes them) to the absolute path with no symlink on it, and refuses
/// a symlink on the way that leads out of the directory holding it, naming the link and
/// where the path leads, unless `follow_links`: a guest of an earlier read-write run of `W`
/// can plant `W/sub -> /home/u/other`, and a later grant of `W/sub` would then be another
/// tree than the one named. A symlink that stays inside its directory
/// (`current -> releases/42`), or one directly under `/` (`/home -> /data/home`), is
/// followed. The tiers then open and judge the result without following any symlink.
pub(crate) fn resolve_as_given(given: &std::path::Path, follow_links: bool) -> Result<PathBuf> {
    use std::path::Component;
    let named = || format!("workspace {}", given.display());
    let mut at =
        if given.is_absolute() { PathBuf::from("/") } else { std::fs::canonicalize(".").with_context(named)? };
    for part in given.components() {
        match part {
            Component::RootDir | Component::Prefix(_) => at = PathBuf::from("/"),
            Component::CurDir => {}
            // `at` has no symlink on it, so its lexical parent is the kernel's `..`.
            Component::ParentDir => drop(at.pop()),
            Component::Normal(name) => {
                let next = at.join(name);
                let meta = std::fs::symlink_metadata(&next).with_context(named)?;
                if !meta.file_type().is_symlink() {
                    at = next;
                    continue;
                }
                let resolved = std::fs::canonicalize(&next).with_context(named)?;
                if !follow_links && !resolved.starts_with(&at) {
                    let whole = std::fs::canonicalize(given).unwrap_or_else(|_| resolved.clone());
                    bail!(
                        "workspace {}: {} is a symlink to {}, outside the directory that holds it (an earlier run's guest could have planted it); grant {} itself if that is meant, or pass --follow-workspace-links",
                        given.display(),
                        next.display(),
                        resolved.display(),
                        whole.display()
                    );
                }
                at = resolved;
            }
        }
    }
    Ok(at)
}

/// Adds the environment and workspace grants of `args` to `job`.
fn with_grants(mut job: Job, args: &RunArgs) -> Result<Job> {
    for kv in &args.env {
        let (k, v) = kv.split_once('=').with_context(|| format!("--env {kv:?} is not K=V"))?;
        job = job.with_env(k, v)?;
    }
    if let Some(ws) = &args.workspace {
        let (dir, access) = parse_workspace(ws, args.follow_workspace_links)?;
        let busy = if args.no_wait { Busy::Refuse } else { Busy::Wait };
        job = job.with_workspace_when_busy(dir, access, busy)?;
    }
    Ok(job)
}

/// The Python guest's job; with grants, their names are globals as in JavaScript.
#[cfg(feature = "python")]
fn python_job(code: &str, granted: bool) -> Result<Job> {
    Ok(if granted { wasm::python_job_with_grants(code)? } else { wasm::python_job(code)? })
}

#[cfg(not(feature = "python"))]
fn python_job(_code: &str, _granted: bool) -> Result<Job> {
    bail!(
        "this stockade was built without the `python` feature: \
         cargo build --release -p stockade-cli --features python, then cargo xtask guests --python"
    )
}

/// `NAME=@FILE` (the file's JSON) or `NAME=JSON`.
fn named_json(flag: &str, arg: &str) -> Result<(String, serde_json::Value)> {
    let (name, value) =
        arg.split_once('=').with_context(|| format!("{flag} {arg:?} is not NAME=@FILE or NAME=JSON"))?;
    let text = match value.strip_prefix('@') {
        Some(file) => std::fs::read_to_string(file).with_context(|| format!("{flag} {name}: reading {file}"))?,
        None => value.to_owned(),
    };
    let value = serde_json::from_str(&text).with_context(|| format!("{flag} {name}: not JSON"))?;
    Ok((name.to_owned(), value))
}

/// The host MCP servers of `--grant-mcp`, started (each `NAME=COMMAND`, run by `/bin/sh -c`);
/// their stderr is shown on this process's stderr, each line prefixed with the server's name.
pub(crate) async fn mcp_servers(specs: &[String]) -> Result<Vec<std::sync::Arc<stockade_runtime::mcp::McpServer>>> {
    let mut servers = Vec::new();
    for spec in specs {
        let (name, command) =
            spec.split_once('=').with_context(|| format!("--grant-mcp {spec:?} is not NAME=COMMAND"))?;
        servers.push(start_mcp(stockade_runtime::mcp::McpCommand::new(name, "/bin/sh", ["-c", command])?).await?);
    }
    Ok(servers)
}

/// Starts a host MCP server with its stderr on this process's stderr, each line prefixed
/// with the server's name, and says which of its tools are not granted, and why.
pub(crate) async fn start_mcp(
    command: stockade_runtime::mcp::McpCommand,
) -> Result<std::sync::Arc<stockade_runtime::mcp::McpServer>> {
    let name = command.name().to_owned();
    let prefix = format!("stockade: mcp {name}: ");
    // Outside text (a server that logs its arguments logs the sandbox's words), shown by the
    // one rule, and never a blocking write.
    let command =
        command.on_stderr(move |line| crate::term::log_line(format!("{prefix}{}", crate::term::outside_line(line))));
    let server = stockade_runtime::mcp::McpServer::start(command).await?;
    for (tool, why) in server.skipped() {
        writeln!(std::io::stderr(), "stockade: mcp {name}: tool {tool:?} is not granted: {why}")?;
    }
    Ok(server)
}

/// The grants the run's flags name, with their policy.
fn grants(
    args: &RunArgs,
    mcp: &[std::sync::Arc<stockade_runtime::mcp::McpServer>],
) -> Result<stockade_runtime::Grants> {
    use stockade_agent::{CommandTool, ToolDef, Trust};
    let mut grants = stockade_runtime::Grants::new();
    for server in mcp {
        grants = grants.mcp(server).with_context(|| format!("--grant-mcp {}", server.name()))?;
    }
    for arg in &args.grant_data {
        let (name, value) = named_json("--grant-data", arg)?;
        grants = grants.data(&name, value).with_context(|| format!("--grant-data {name}"))?;
    }
    let mut schemas = std::collections::BTreeMap::new();
    for arg in &args.grant_schema {
        let (name, value) = named_json("--grant-schema", arg)?;
        if !args.grant_tool.iter().any(|t| t.split_once('=').is_some_and(|(n, _)| n == name)) {
            bail!("--grant-schema {name}: no --grant-tool {name}=COMMAND");
        }
        schemas.insert(name, value);
    }
    for arg in &args.grant_tool {
        let (name, command) =
            arg.split_once('=').with_context(|| format!("--grant-tool {arg:?} is not NAME=COMMAND"))?;
        let schema = schemas
            .remove(name)
            .unwrap_or_else(|| serde_json::json!({"type": "object", "properties": {}, "additionalProperties": false}));
        let def = ToolDef::new(name, format!("the host command {command:?}"), schema, Trust::Untrusted);
        let tool = CommandTool::new(def, vec!["/bin/sh".into(), "-c".into(), command.into()]);
        let grant =
            stockade_agent::tool_grant(std::sync::Arc::new(tool)).with_context(|| format!("--grant-tool {name}"))?;
        grants = grants.function(grant).with_context(|| format!("--grant-tool {name}"))?;
    }
    if let (true, Some(url), Some(model)) = (args.grant_model, &args.base_url, &args.model) {
        let mut endpoint =
            stockade_agent::Endpoint::new(url, model.clone()).with_context(|| format!("--base-url {url}"))?;
        if let Some(var) = &args.api_key_env {
            endpoint = endpoint.with_key(stockade_agent::ApiKey::from_env_ambient(var)?);
        }
        let proxy = stockade_agent::ModelProxy::new(endpoint).max_tokens(args.grant_model_tokens);
        grants = grants.model(std::sync::Arc::new(proxy));
    }
    if let Some(file) = &args.grant_policy {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("reading the grant policy {}", file.display()))?;
        let policy = stockade_runtime::policy::allow::Policy::from_toml(&text, &grants.registry())
            .map_err(|e| anyhow::anyhow!("grant policy {}: {e}", file.display()))?;
        grants = grants.policy(policy);
    } else if !args.grant_tool.is_empty() || !args.grant_mcp.is_empty() {
        let _ = writeln!(std::io::stderr(), "stockade: no --grant-policy: every call of a granted tool is denied");
    }
    if let Some(net) = net_grant(args)? {
        grants = grants.net(net);
    }
    Ok(grants)
}

/// The network grant of `--allow-net` or `--net-policy`, with `--net-resolve` and
/// `--net-secret`.
fn net_grant(args: &RunArgs) -> Result<Option<egress::NetGrant>> {
    let grant = net_grant_from(args.net_policy.as_deref(), &args.allow_net, &args.net_resolve)?;
    match grant {
        Some(grant) if !args.net_secret.is_empty() => {
            let secrets = args
                .net_secret
                .iter()
                .map(|s| egress::NetSecret::parse(s, |k| std::env::var(k).ok()))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Some(grant.secrets(secrets)?))
        }
        None if !args.net_secret.is_empty() => {
            bail!("--net-secret needs --allow-net or --net-policy allowing the secret's host")
        }
        grant => Ok(grant),
    }
}

/// A network grant from a policy file or `--allow-net` entries, with `--net-resolve`
/// entries (`None` with neither); each connection it refuses is one line on stderr as it
/// happens. `stockade run`, `agent` (`allow_net`) and `mcp` build theirs here.
pub(crate) fn net_grant_from(
    policy_file: Option<&std::path::Path>,
    allow_net: &[String],
    net_resolve: &[String],
) -> Result<Option<egress::NetGrant>> {
    let policy = match (policy_file, allow_net.is_empty()) {
        (Some(file), _) => {
            let text =
                std::fs::read_to_string(file).with_context(|| format!("reading the net policy {}", file.display()))?;
            egress::NetPolicy::from_toml(&text).map_err(|e| anyhow::anyhow!("net policy {}: {e}", file.display()))?
        }
        (None, false) => egress::NetPolicy::allow_entries(allow_net)?,
        (None, true) if !net_resolve.is_empty() => bail!("--net-resolve needs --allow-net or --net-policy"),
        (None, true) => return Ok(None),
    };
    let resolve = egress::Resolve::entries(net_resolve)?;
    // A guest makes these at will, on the proxy's async workers: never a blocking write.
    let shown: egress::OnRefused =
        std::sync::Arc::new(|c| crate::term::log_line(format!("stockade: {}", egress::denied_line(c))));
    Ok(Some(egress::NetGrant::new(policy).resolve(resolve).on_refused(shown)))
}

/// The sandbox of `--tier`, as the run's flags set it up.
fn sandbox(args: &RunArgs, rt: &tokio::runtime::Runtime) -> Result<Sandbox> {
    Ok(if args.tier == TierKind::Wasm {
        Sandbox::builder().tier(wasm::WasmTier::new()?).build()?
    } else if args.tier == TierKind::Docker {
        let connected = rt.block_on(async {
            let tier = docker::DockerTier::connect().await?;
            match &args.docker_runtime {
                Some(name) => tier.runtime(name).await,
                None => Ok(tier),
            }
        });
        match connected {
            Ok(t) => Sandbox::builder().tier(t).build()?,
            Err(docker::RunError::Unsupported { mechanism, reason }) => {
                bail!("this host cannot enforce the sandbox ({mechanism}): {reason}; see `stockade doctor`")
            }
            Err(e) => return Err(e.into()),
        }
    } else {
        let mut tier = tiers::process_tier()?.landlock_abi(args.landlock_abi);
        if args.no_cgroup {
            tier = tier.without_cgroups();
        }
        if args.tty {
            tier = tier.tty();
            // The output is shown on this terminal once verified: size the run's to it.
            use std::os::fd::AsFd;
            let size = process::terminal_size(std::io::stdout().as_fd())
                .or_else(|| process::terminal_size(std::io::stderr().as_fd()))
                .or_else(|| process::terminal_size(std::io::stdin().as_fd()));
            if let Some((rows, cols)) = size {
                tier = tier.tty_size(rows, cols);
            }
        }
        Sandbox::builder().tier(tier).build()?
    })
}

pub(crate) fn run(args: RunArgs) -> Result<ExitCode> {
    let job = job(&args)?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let mcp = rt.block_on(mcp_servers(&args.grant_mcp))?;
    let grants = std::sync::Arc::new(grants(&args, &mcp)?);
    let sandbox = sandbox(&args, &rt)?;
    let budget = Budget::new(args.timeout, args.max_output);
    let io = live_io(&args, &job)?;
    let live_stderr = io.stderr.is_some();
    if args.tier == TierKind::Process {
        // This process launches one helper: the fork server becomes it rather than cloning
        // one and being stopped afterwards (0.07 to 0.12 ms a run; docs/benchmarks.md).
        process::ForkServer::hand_over_next();
    }
    // SIGTERM, SIGINT and SIGHUP stop the run rather than this process alone: its future is
    // dropped, which kills the sandbox and then sweeps a read-write workspace, and the CLI
    // exits as a program killed by that signal would (128 + N), as `timeout(1)` passes it on.
    let stopped = rt.block_on(async {
        anyhow::Ok(tokio::select! {
            r = sandbox.report(RunRequest::new(&job).grants(grants).live(io)) => Ok(r),
            s = crate::stop_signal() => Err(s?),
        })
    })?;
    // A host MCP server that stopped during the run is the host's news, not the guest's.
    for server in &mcp {
        // A crash is seen on the server's stdout first; its exit status and last stderr
        // lines arrive a moment later.
        if let Some(why) = rt.block_on(server.settled(std::time::Duration::from_secs(2))) {
            writeln!(std::io::stderr(), "stockade: mcp {}: stopped during the run: {why}", server.name())?;
        }
    }
    rt.block_on(async {
        for server in &mcp {
            server.shutdown(std::time::Duration::from_secs(2)).await;
        }
    });
    // A stdin copy may still be blocked reading the CLI's stdin (a pipe nobody closes):
    // leave it behind rather than wait for it.
    rt.shutdown_background();
    let report = match stopped {
        Ok(r) => r,
        Err((name, n)) => {
            writeln!(std::io::stderr(), "stockade: stopped by {name}: the run was killed")?;
            return Ok(ExitCode::from(128 + n));
        }
    };
    let report = match report {
        Ok(r) => r,
        Err(RunError::Unsupported { mechanism, reason }) => {
            bail!("this host cannot enforce the sandbox ({mechanism}): {reason}; see `stockade doctor`")
        }
        Err(e) => return Err(e.into()),
    };
    // What the program planted where the workspace protects an absent path (`git init`
    // makes `.git/config` and `.git/hooks`) is gone now: say so, or the user finds it missing
    // and cannot tell why. The names are the protected list's, never the guest's.
    if !args.json && !report.swept.is_empty() {
        writeln!(
            std::io::stderr(),
            "stockade: removed from the workspace what the program created at protected paths (git hooks and config, rc files, editor and agent settings stay the host's): {}",
            report.swept.join(" ")
        )?;
    }
    // What the sweep could not remove stays on the host, where a tool may run it: every
    // path, with why, in one line (the report in `--json` lists them too).
    if !args.json && !report.sweep_errors.is_empty() {
        writeln!(
            std::io::stderr(),
            "stockade: could not remove from the workspace what the program created at protected paths; remove them by hand before any tool reads them: {}",
            report.sweep_errors.join("; ")
        )?;
    }
    if let (false, Some(line)) = (args.json, refs_notice(&report)) {
        writeln!(std::io::stderr(), "stockade: {line}")?;
    }
    let outcome = if args.expect_json {
        let mut c: Contract<serde_json::Value> = Contract::json(budget, accept_any).expect_exit(args.expect_exit);
        if args.grant_strict {
            c = c.no_denied_grants();
        }
        stockade_runtime::verify::verify(report.clone(), &c).into_result().map(|v| v.report().stdout.bytes.clone())
    } else {
        let mut c = Contract::bytes(budget, accept_any).expect_exit(args.expect_exit);
        if args.grant_strict {
            c = c.no_denied_grants();
        }
        stockade_runtime::verify::verify(report.clone(), &c).into_result().map(|v| v.into_inner())
    };
    let mut stdout = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut stdout, &report)?;
        writeln!(stdout)?;
    }
    match outcome {
        Ok(bytes) => {
            if !args.json {
                // Verified is not harmless on a terminal: the program's control sequences
                // (the clipboard's OSC 52, the window title, cursor moves) are shown as text
                // there, as its stderr is, unless `--raw`.
                if std::io::IsTerminal::is_terminal(&stdout) && !args.raw {
                    let mut shown = Vec::with_capacity(bytes.len());
                    let pending = term::neutralise(&bytes, false, &mut shown);
                    if pending {
                        shown.push(0xc2);
                    }
                    stdout.write_all(&shown)?;
                } else {
                    stdout.write_all(&bytes)?;
                }
            }
            stdout.flush()?;
            Ok(ExitCode::SUCCESS)
        }
        Err(refusal) => {
            stdout.flush()?;
            let message = match &refusal {
                // The user saw the program's stderr as it ran: do not quote it again; and
                // an empty one is not quoted at all (`--quiet`).
                stockade_runtime::verify::Refusal::NonZeroExit { code, stderr, .. }
                    if live_stderr || stderr.is_empty() =>
                {
                    format!("exited with code {code}")
                }
                r => r.message(),
            };
            // What the program printed is not shown, but the user is told it exists and how
            // to see it: a test runner that fails writes its report to stdout.
            let withheld = match report.stdout.bytes.len() {
                0 => String::new(),
                _ if args.json => String::new(),
                n => format!(
                    "; {n}{} bytes of stdout withheld (--json prints the report with them)",
                    if report.stdout.truncated { "+" } else { "" }
                ),
            };
            writeln!(std::io::stderr(), "stockade: refused: {message}{withheld}")?;
            Ok(ExitCode::from(refusal.exit_code()))
        }
    }
}

/// The run's live stdio: the CLI's stdin (or `--stdin FILE`) streamed unless it is a
/// terminal, `--no-stdin`, or the job carries its own stdin; the program's stderr shown as it arrives unless `--quiet`,
/// neutralised on a terminal unless `--raw`.
fn live_io(args: &RunArgs, job: &Job) -> Result<stockade_runtime::LiveIo> {
    use std::io::IsTerminal;
    let mut io = stockade_runtime::LiveIo::default();
    // A job that carries its own stdin (the wasm tier's --js and --python code) keeps it.
    if !job.stdin().is_empty() {
        if args.stdin.is_some() {
            bail!("--stdin cannot be combined with --js, --js-file or --python (the code is the guest's stdin)");
        }
    } else if !args.tty && !args.no_stdin {
        io.stdin = match &args.stdin {
            Some(path) => {
                let file = std::fs::File::open(path).with_context(|| format!("--stdin {}", path.display()))?;
                Some(Box::new(tokio::fs::File::from_std(file)))
            }
            None if !std::io::stdin().is_terminal() => Some(Box::new(tokio::io::stdin())),
            None => None,
        };
    }
    if !args.quiet && !args.tty {
        let stderr = std::io::stderr();
        io.stderr = if stderr.is_terminal() && !args.raw {
            Some(Box::new(term::Neutral::new(stderr)))
        } else {
            Some(Box::new(stderr))
        };
    }
    Ok(io)
}

/// The line that tells the user which git refs a read-write run moved (none if it moved
/// none): a commit made in the run can bring back, on the user's next checkout or reset,
/// a protected file the sweep removed, so the user is told how to review it first. The
/// names and values in the report are escaped already (`stockade-hostfs`).
pub(crate) fn refs_notice(report: &stockade_runtime::protocol::Report) -> Option<String> {
    if report.git_refs_moved.is_empty() {
        return None;
    }
    Some(format!(
        "the program changed git refs in the workspace ({}); a commit can restore what the sweep removed on your next checkout or reset: review each with `git log --stat OLD..NEW` first",
        report.git_refs_moved.join("; ")
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed step is the test's failure")]
mod tests {
    use std::os::unix::fs::symlink;

    use super::resolve_as_given;

    /// hold-the-line, finding 13: a symlink an earlier run's guest planted in its workspace
    /// (`W/sub -> elsewhere`) sent a later grant of `W/sub` to another tree. Now a path as
    /// given that goes through a symlink out of the directory holding it is refused, naming
    /// the link and where it leads, unless followed on request; inward links, `.` and `..`
    /// resolve as the kernel resolves them.
    #[test]
    fn a_path_through_a_symlink_that_leaves_its_directory_is_refused_unless_followed() {
        let d = std::env::temp_dir().join(format!("stockade-cli-as-given-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        for sub in ["w/real/deep", "other/x"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        symlink(d.join("other"), d.join("w/sub")).unwrap();
        symlink("real", d.join("w/current")).unwrap();
        let e = resolve_as_given(&d.join("w/sub"), false).unwrap_err().to_string();
        let link = format!("{} is a symlink to {}, outside", d.join("w/sub").display(), d.join("other").display());
        assert!(e.contains(&link) && e.ends_with("--follow-workspace-links"), "{e}");
        assert!(resolve_as_given(&d.join("w/sub/x"), false).is_err(), "deeper on the way");
        assert_eq!(resolve_as_given(&d.join("w/sub"), true).unwrap(), d.join("other"));
        assert_eq!(resolve_as_given(&d.join("w/current/deep"), false).unwrap(), d.join("w/real/deep"));
        assert_eq!(resolve_as_given(&d.join("w/./real/deep/.."), false).unwrap(), d.join("w/real"));
        // `..` after an inward link is the kernel's: the link's target's parent.
        assert_eq!(resolve_as_given(&d.join("w/current/deep/../.."), false).unwrap(), d.join("w"));
        let e = resolve_as_given(&d.join("w/missing"), false).unwrap_err().to_string();
        assert!(e.contains("w/missing"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
