//! The `stockade` command line: `stockade run` confines a command and prints its output only
//! if the run is verified; `stockade agent` runs an agent over an OpenAI-compatible endpoint
//! that marks, allows and isolates; `stockade mcp` serves the same sandboxes to MCP clients;
//! `stockade doctor` says what this host can enforce.
//!
//! # Position in the stack
//! Depends on: `stockade-agent` and `stockade-runtime` (and through them protocol, policy,
//! verify and the three tiers).
//! Used by: people and scripts.
//! API boundary: the command line; exit codes follow `stockade-verify`'s table (124 timeout).
//!
//! # Threat model
//! Trusted: the invoking user and the arguments they pass.
//! Attacker-controlled: the confined program and everything it prints.
//! Out of scope: what the user does with verified output.
//!
//! # Guarantees
//! G1. `stockade run` writes the program's stdout only when the run is verified; otherwise it
//!     writes exactly one refusal line to stderr (after the program's own stderr; with
//!     `--quiet` the line quotes its start, guest bytes escaped), which says how many bytes
//!     of stdout it withheld, if any, and exits with the refusal's stable code (the
//!     program's own code for a non-zero exit).
//!     (pinned by: tests/it/cli.rs::g1_*)
//! G2. A host that cannot enforce the sandbox is an error naming the missing mechanism
//!     (exit 125), never an unconfined run.
//!     (pinned by: tests/it/cli.rs::g2_*)
//! G3. `stockade agent` runs a tool call only when the policy allows it (or a human approved
//!     it on a terminal), marks untrusted output before the model reads it, takes no proxy
//!     from the environment, and exits 0 with an answer, 3 with no answer (budget spent), 4
//!     when the endpoint failed, or 125 on a configuration error naming the line and column.
//!     On a terminal (and without `--quiet` or `--json`) it shows each step on stderr as it
//!     happens: the turn, each proposed call with its canonical arguments and the decision
//!     with its rule, each tool run with its status, time and size; the answer is on stdout.
//!     (pinned by: tests/it/agent.rs::g3_*)
//! G4. `stockade run --grant-data/--grant-tool` gives the guest exactly the named grants in
//!     every tier (files and `stockade-call` in the process and docker tiers, globals in
//!     JavaScript, and with the `python` feature globals in the wasm tier's Python guest,
//!     whose door stockade-wasm's G12 pins); a granted tool runs on the host only when
//!     `--grant-policy` allows the call, and `--grant-strict` refuses a run with a denied call (exit 116); `--grant-model`
//!     reaches the configured endpoint through the broker only (the real key never inside):
//!     on a unix socket and, in the process tier (the docker tier as root), at
//!     `$OPENAI_BASE_URL`, and in every tier as
//!     the call `model` (JavaScript's `model({...})`).
//!     (pinned by: tests/it/grants.rs::g4_*)
//! G5. `stockade run` streams its stdin to the program when it is not a terminal (or
//!     `--stdin FILE`; `--no-stdin` gives `/dev/null`), holding one buffer at a time, and
//!     does not wait for a stdin the program never read; the program's stderr reaches the
//!     CLI's stderr as it is written (not with `--quiet`), with control sequences shown as
//!     text when stderr is a terminal (not with `--raw`) and unchanged into a pipe or file;
//!     the verified stdout likewise (control sequences shown as text on a terminal).
//!     The wasm and docker tiers read a piped stdin whole first (up to 16 MiB) and show
//!     stderr when the run ends.
//!     (pinned by: tests/it/stdio.rs::g5_*)
//! G6. `stockade run --workspace DIR` grants only a dedicated directory, judged after
//!     symlinks are resolved by the rule every tier shares, and refuses any other with one
//!     line naming the path and why (exit 125), also a path through a symlink that leads
//!     out of the directory holding it unless `--follow-workspace-links` (it names the link
//!     and where it leads); a run of a workspace another run holds waits, or with
//!     `--no-wait` is refused in one line; a directory the user owns is usable whatever
//!     its mode, what the program creates there belongs to the user, and no set-uid bit can
//!     be planted in it; what the program created at a protected path that was absent is
//!     removed when the run ends, and one `stockade:` line on stderr names it (not with
//!     `--json`, whose report lists it).
//!     (pinned by: tests/it/workspace.rs::g6_*)
//! G7. After a `kill -9` of `stockade run`, the run's per-run cgroups (named after the
//!     supervisor's pid and start time) are reported by `stockade doctor` and removed by the
//!     next run or by `stockade gc`; a live supervisor's never are.
//!     (pinned by: tests/it/cli.rs::g7_*)
//! G8. `stockade mcp` speaks MCP over stdio, the 2025-11-25 handshake (`initialize`) and the
//!     stateless 2026-07-28 era (`server/discover`) alike, and writes nothing but protocol
//!     messages to stdout. It lists `run_code` (javascript in the wasm tier, python and sh in
//!     the process tier or a container) and `run_command` only when this host can run them;
//!     bad arguments, arguments over the server's caps, a policy denial (naming the rule)
//!     and every refused run (non-zero exit, timeout, output over budget, out of memory) are
//!     results with `isError` and a one-line reason, while a line that is not JSON gets
//!     -32700, an oversized line -32600 (never held whole), and the session goes on;
//!     `notifications/cancelled` kills that call's run and sends no answer; calls run
//!     concurrently up to a cap.
//!     (pinned by: tests/it/mcp.rs::g8_*)
//!
//! # Non-guarantees
//! `--json` prints the whole report, including unverified output, for inspection. What
//! `stockade mcp` returns (stdout and stderr, raw, in `structuredContent` and a text copy)
//! is the guest's: the tools' descriptions call it untrusted; it is not marked.
//!
//! # Failure behaviour
//! Usage errors exit 2 (clap); stockade's own failures exit 125.
//!
//! # Unsafe
//! None: `#![forbid(unsafe_code)]`.
//!
//! # Ambient authority
//! Reads its arguments, forks (or re-executes) itself as the sandbox helper; for `run` with
//! grants, reads the named data, schema and policy files and runs each `--grant-tool`
//! command on the host (as the user, environment cleared to `PATH`) when a call is allowed;
//! for `mcp`, reads its policy file and serves stdin and stdout; for `agent`, reads
//! its config and policy files, the API key's variable, connects to the endpoint and starts the
//! configured command tools; reads the wasm tier's guest and
//! cache directories, and for `doctor` probes the host and the Docker socket.
//!
//! # Feature flags
//! `python`: `--python CODE` runs the wasm tier's opt-in CPython guest.
//!
//! # Invariants
//! Stated as absences: never prints unverified stdout outside `--json`; never runs the
//! command outside the tier.

#![forbid(unsafe_code)]

mod agent;
mod mcp;
mod term;
mod tiers;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
pub use stockade_runtime::process;
use stockade_runtime::protocol::{Access, Busy, Job, Limits};
use stockade_runtime::verify::{Budget, Contract, accept_any};
use stockade_runtime::{RunError, RunRequest, Sandbox};
use stockade_runtime::{docker, wasm};
use tiers::TierKind;

/// Exit code for stockade's own failures (as `timeout(1)` uses 125).
pub(crate) const EXIT_STOCKADE: u8 = 125;

#[derive(Parser)]
#[command(name = "stockade", version, about = "Run untrusted code confined; trust its output only when verified")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a command in a sandbox and print its stdout only if the run is verified.
    #[command(after_help = "Examples:
  stockade run -- python3 -c 'print(6*7)'
  stockade run --timeout 2s --memory 256M --max-output 1M -- sh -c 'ls /'
  stockade run --workspace ./data:ro --env LANG=C.UTF-8 -- python3 /workspace/job.py
  stockade run --expect-json -- python3 -c 'import json; print(json.dumps({\"n\": 42}))'
  stockade run --json -- sh -c 'exit 3'      # print the whole report
  stockade run --tier wasm --js 'console.log(6*7)'
  stockade run --tier wasm --js-file script.js --timeout 500ms
  stockade run --tier wasm ./module.wasm -- arg1 arg2
  stockade run --tier docker -- sh -c 'echo hi'
  stockade run --tier docker --image my-tools:local -- make test
  stockade run --tier docker --docker-runtime runsc -- sh -c 'dmesg | head -1'
  stockade run --tier wasm --grant-data rows=@rows.json --js 'console.log(rows.length)'
  stockade run --grant-tool 'add=./add.py' --grant-schema add=@add.json --grant-policy grants.toml \
    -- sh -c 'stockade-call add {\\\"a\\\":1,\\\"b\\\":2}'

Exit codes: 0 verified; the program's own code when it exited non-zero (1 when it exited 0
against --expect-exit; a program's code can collide with the ones below, as under timeout(1):
the refusal line tells them apart); 116 a grant call was denied (--grant-strict); 118 enforcement missing; 119 out of memory;
117 wasm trap; 120 cpu limit (wasm: out of fuel); 121 assertion failed; 122 malformed output; 123 output too large;
124 timeout; 125 stockade failed (e.g. the host cannot enforce the sandbox);
126 failed to start; 128+N killed by signal N.")]
    Run(Box<RunArgs>),
    /// Run an agent over an OpenAI-compatible endpoint: every untrusted tool output is marked,
    /// every tool call is decided by the policy before it runs, and code runs in a tier.
    #[command(after_help = "Examples:
  stockade agent --config examples/steward/agent.toml \\
    \"Three deliveries reached the gate today. Read each one and deal with it.\"
  stockade agent --base-url http://127.0.0.1:8080/v1 --model smollm2 --policy policy.toml 'What is 6*7? Use run_code.'
  stockade agent --config agent.toml --api-key-env OPENAI_API_KEY --trace run.jsonl --json 'Summarise the scrolls.'
  stockade agent --config agent.toml --stream 'Tell me about the keep.'

On a terminal, a call the policy marks `ask` is shown (tool, canonical arguments, rule, reason)
and runs only if you answer y; with no terminal it is denied.

Exit codes: 0 answered; 3 no answer (turns, tool calls, tokens or time spent, or the same call
denied again and again); 4 the endpoint failed (unreachable after retries, credentials refused,
a bad response); 125 stockade failed (configuration, policy, setup).")]
    Agent(Box<agent::AgentArgs>),
    /// Serve the sandboxes as an MCP server on stdio (`run_code`, `run_command`), for Claude
    /// Desktop, Codex and other MCP clients; protocol messages only on stdout, logs on stderr.
    Mcp(Box<mcp::McpArgs>),
    /// Remove what killed runs left behind: what the guest planted in a read-write workspace
    /// when its supervisor was killed before the sweep, the process tier's per-run cgroups
    /// whose supervisor is gone, and the docker tier's expired containers (when an engine
    /// answers).
    #[command(
        after_help = "Examples:\n  stockade gc\n  stockade doctor   # the `stale cgroups` row says whether there is anything to remove"
    )]
    Gc,
    /// Docker tier maintenance.
    #[command(subcommand)]
    Docker(DockerCommand),
    /// Show what this host can enforce.
    #[command(after_help = "Examples:\n  stockade doctor\n  stockade doctor --json")]
    Doctor {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum DockerCommand {
    /// Remove stockade's containers that outlived their run (`--all`: every stockade container).
    Gc {
        /// Remove every container stockade labelled, not only expired ones.
        #[arg(long)]
        all: bool,
    },
}

#[derive(clap::Args)]
struct RunArgs {
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

use stockade_agent::config::{parse_duration, parse_size};

/// Entry point for the binary.
#[must_use]
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    if matches!(cli.command, Command::Run(_) | Command::Agent(_) | Command::Mcp(_)) {
        // What a killed run left for its sweep is finished before anything else runs.
        for done in process::finish_killed_sweeps() {
            let _ = writeln!(std::io::stderr(), "stockade: {done}");
        }
    }
    let result = match cli.command {
        Command::Run(args) => run(*args),
        Command::Agent(args) => agent::run(*args),
        Command::Mcp(args) => mcp::run(*args),
        Command::Doctor { json } => doctor(json).map(|()| ExitCode::SUCCESS),
        Command::Docker(DockerCommand::Gc { all }) => docker_gc(all).map(|()| ExitCode::SUCCESS),
        Command::Gc => gc().map(|()| ExitCode::SUCCESS),
    };
    result.unwrap_or_else(|e| {
        let _ = writeln!(std::io::stderr(), "stockade: {e:#}");
        ExitCode::from(EXIT_STOCKADE)
    })
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
        let granted = !args.grant_data.is_empty() || !args.grant_tool.is_empty() || args.grant_model;
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

/// The grants the run's flags name, with their policy.
fn grants(args: &RunArgs) -> Result<stockade_runtime::Grants> {
    use stockade_agent::{CommandTool, ToolDef, Trust};
    let mut grants = stockade_runtime::Grants::new();
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
    } else if !args.grant_tool.is_empty() {
        let _ = writeln!(std::io::stderr(), "stockade: no --grant-policy: every call of a granted tool is denied");
    }
    Ok(grants)
}

fn run(args: RunArgs) -> Result<ExitCode> {
    let job = job(&args)?;
    let grants = std::sync::Arc::new(grants(&args)?);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let sandbox = if args.tier == TierKind::Wasm {
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
        let mut tier = process::ProcessTier::new(tiers::helper()?).landlock_abi(args.landlock_abi);
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
    };
    let budget = Budget::new(args.timeout, args.max_output);
    let io = live_io(&args, &job)?;
    let live_stderr = io.stderr.is_some();
    // SIGTERM, SIGINT and SIGHUP stop the run rather than this process alone: its future is
    // dropped, which kills the sandbox and then sweeps a read-write workspace, and the CLI
    // exits as a program killed by that signal would (128 + N), as `timeout(1)` passes it on.
    let stopped = rt.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let mut hup = signal(SignalKind::hangup())?;
        anyhow::Ok(tokio::select! {
            r = sandbox.report(RunRequest::new(&job).grants(grants).live(io)) => Ok(r),
            _ = term.recv() => Err(("SIGTERM", 15u8)),
            _ = int.recv() => Err(("SIGINT", 2)),
            _ = hup.recv() => Err(("SIGHUP", 1)),
        })
    })?;
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
    if let (false, Some(paths)) = (args.json, report.swept()) {
        writeln!(
            std::io::stderr(),
            "stockade: removed from the workspace what the program created at protected paths (git hooks and config, rc files, editor and agent settings stay the host's): {paths}"
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

/// The docker tier: a reachable engine (API negotiated) and the default image.
fn docker_status() -> Result<String, String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(async {
        let tier = docker::DockerTier::connect().await.map_err(|e| e.to_string())?;
        let image = docker::spec::DEFAULT_IMAGE;
        if tier.has_image(image).await {
            let gvisor = if tier.clone().runtime("runsc").await.is_ok() { "registered" } else { "not registered" };
            let remap = if tier.userns_remap().await.unwrap_or(false) { "on" } else { "off" };
            Ok(format!("engine reachable; image {image} present; gVisor runtime runsc {gvisor}; userns-remap {remap}"))
        } else {
            Err(format!("engine reachable, but image {image} is missing: cargo xtask images"))
        }
    })
}

fn docker_gc(all: bool) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let removed = rt.block_on(async { docker::DockerTier::connect().await?.gc(all).await })?;
    println!("removed {removed} stockade container(s)");
    Ok(())
}

fn gc() -> Result<()> {
    let sweeps = process::finish_killed_sweeps();
    let failed = sweeps
        .iter()
        .filter(|f| matches!(f, process::FinishedSweep::Swept { swept, .. } if !swept.errors.is_empty()))
        .count();
    for done in &sweeps {
        println!("{done}");
    }
    let removed = process::reap_stale_cgroups(None);
    let left = process::stale_cgroups(None);
    println!("removed {} stale cgroup(s) of killed supervisors", removed.len());
    for dir in &left {
        println!("could not remove {}", dir.display());
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    match rt.block_on(async { docker::DockerTier::connect().await?.gc(false).await }) {
        Ok(n) => println!("removed {n} expired stockade container(s)"),
        Err(e) => println!("docker: not checked ({e})"),
    }
    if !left.is_empty() {
        bail!("{} stale cgroup(s) could not be removed", left.len());
    }
    if failed > 0 {
        bail!("{failed} killed run(s) could not be swept entirely (each line above names what stays)");
    }
    Ok(())
}

/// Whether a run's grants broker can listen where the runtime puts it (a fresh directory
/// under the temporary directory, with a unix socket), and how each tier reaches a model.
fn broker_status() -> Result<String, String> {
    let parent = std::env::temp_dir();
    let dir = parent.join(format!("stockade-doctor-{}", std::process::id()));
    let tried =
        std::fs::create_dir(&dir).and_then(|()| std::os::unix::net::UnixListener::bind(dir.join("grants.sock")));
    let _ = std::fs::remove_dir_all(&dir);
    match tried {
        Ok(_) => Ok(format!(
            "grants directories under {}; a model grant answers on model.sock and OPENAI_BASE_URL (process; docker as root), model() (wasm)",
            parent.display()
        )),
        Err(e) => Err(format!("cannot listen on a unix socket under {}: {e}", parent.display())),
    }
}

/// The opt-in Python guest: whether this build has it and whether it is installed.
fn python_status() -> Result<String, String> {
    let path = wasm::guests::dir().map(|d| d.join(wasm::guests::PYTHON_DIR).join(wasm::guests::PYTHON_FILE));
    let installed = path.as_ref().is_some_and(|p| p.is_file());
    match (cfg!(feature = "python"), installed) {
        (true, true) => Ok(format!("CPython guest at {}", path.unwrap_or_default().display())),
        (true, false) => Err("not installed: cargo xtask guests --python".into()),
        (false, true) => Err("installed, but this stockade was built without --features python".into()),
        (false, false) => Err("opt-in: build with --features python, then cargo xtask guests --python".into()),
    }
}

fn doctor(json: bool) -> Result<()> {
    let stale = process::stale_cgroups(None);
    let stale_detail = match stale.len() {
        0 => "none left by killed supervisors".to_owned(),
        n => format!(
            "{n} left by killed supervisors (the next run removes them, or `stockade gc`): {}",
            stale.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(" ")
        ),
    };
    let p = process::probe();
    let broker = broker_status();
    let docker = docker_status();
    let wasm_engine = wasm::WasmTier::new().map_err(|e| e.to_string()).map(|t| match t.cache_dir() {
        Some(dir) => format!("wasmtime 48 engine ready; compiled modules cached in {}", dir.display()),
        None => "wasmtime 48 engine ready; no usable cache directory (modules compile on every start)".into(),
    });
    let python = python_status();
    let js_guest =
        wasm::guests::javascript().map(|p| format!("QuickJS-ng at {}", p.display())).map_err(|e| e.to_string());
    let rows: Vec<(&str, bool, String)> = vec![
        ("landlock", p.landlock_abi >= 6, format!("abi {}", p.landlock_abi)),
        ("seccomp", p.seccomp, if p.seccomp { "filters available".into() } else { "not available".into() }),
        (
            "user namespaces",
            p.user_namespaces.is_ok(),
            p.user_namespaces.clone().err().unwrap_or_else(|| "available".into()),
        ),
        ("cgroups", p.cgroups.is_ok(), p.cgroups.clone().unwrap_or_else(|e| e)),
        ("stale cgroups", stale.is_empty(), stale_detail),
        ("grants broker", broker.is_ok(), broker.clone().unwrap_or_else(|e| e)),
        (
            "unix sockets",
            true,
            format!(
                "landlock abi {} cannot restrict connecting to a pathname socket (a later ABI can): sockets in a granted workspace are covered when the run starts",
                p.landlock_abi
            ),
        ),
        ("docker tier", docker.is_ok(), docker.clone().unwrap_or_else(|e| e)),
        ("wasm tier", wasm_engine.is_ok(), wasm_engine.clone().unwrap_or_else(|e| e)),
        ("wasm js guest", js_guest.is_ok(), js_guest.unwrap_or_else(|e| e)),
        ("wasm python", python.is_ok(), python.unwrap_or_else(|e| e)),
    ];
    let process_ready = p.landlock_abi >= 6 && p.seccomp && p.user_namespaces.is_ok();
    let wasm_ready = wasm_engine.is_ok();
    let docker_ready = docker.is_ok();
    let mut out = std::io::stdout().lock();
    if json {
        let value = serde_json::json!({
            "process_tier": process_ready,
            "wasm_tier": wasm_ready,
            "docker_tier": docker_ready,
            "checks": rows.iter().map(|(name, ok, detail)| serde_json::json!({"name": name, "ok": ok, "detail": detail})).collect::<Vec<_>>(),
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&value)?)?;
    } else {
        writeln!(out, "{:<16} {:<4} detail", "check", "ok")?;
        for (name, ok, detail) in &rows {
            writeln!(out, "{name:<16} {:<4} {detail}", if *ok { "yes" } else { "no" })?;
        }
        writeln!(
            out,
            "\nprocess tier: {}",
            if process_ready { "ready (every mechanism enforced)" } else { "NOT ready: runs fail closed" }
        )?;
        writeln!(out, "wasm tier:    {}", if wasm_ready { "ready" } else { "NOT ready" })?;
        writeln!(out, "docker tier:  {}", if docker_ready { "ready" } else { "NOT ready" })?;
    }
    Ok(())
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
