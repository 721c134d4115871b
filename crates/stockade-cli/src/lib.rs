//! The `stockade` command line: `stockade run` confines a command and prints its output only
//! if the run is verified; `stockade agent` runs an agent over an OpenAI-compatible endpoint
//! that marks, allows and isolates; `stockade mcp` serves the same sandboxes to MCP clients;
//! `stockade doctor` says what this host can enforce (its probes, and a real run of
//! `/bin/true` in the process tier, so that what the probes cannot see, a container's seccomp
//! profile or a dropped capability, is reported too).
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
//!     concurrently up to a cap; with `--trace FILE` (mode 0600) each call's decision and
//!     run are `decision` and `tool` records, and a denied call has no `tool` record.
//!     (pinned by: tests/it/mcp.rs::g8_*)
//! G9. `stockade run --allow-net` gives the run's clients (curl, pip, Python, busybox wget)
//!     the network grant's proxy through the environment alone, reaches only the hosts it
//!     names (a denied one is a line on stderr and no connection upstream, a name that
//!     resolves to loopback is refused without `--net-resolve`, a tunnel whose TLS names
//!     another host reaches nothing), lists every connection in `--json`, and without it
//!     nothing changes: no proxy variable, no listener, no route. `stockade mcp --allow-net`
//!     and `allow_net` in `agent.toml` (on `run_code` and on a confined command tool) give
//!     those runs the same grant, named in `run_code`'s description; a call cannot widen it.
//!     `--net-secret HOST=ENVVAR[:HEADER]` gives the run a placeholder for stockade's own
//!     `$ENVVAR`, and only HOST's upstream gets the real value (in HEADER), through TLS the
//!     proxy ends with a per-run CA; without a grant for its host, or with `$ENVVAR` unset,
//!     the run is refused before it starts.
//!     (pinned by: tests/it/net.rs::g9_*)
//! G10. `stockade serve` owns live sessions on a unix socket in a directory only its user
//!     can enter (the socket mode 0600, and a peer of another uid is answered with nothing);
//!     `stockade session create` prints an id, `session exec ID -- CMD` runs one command in
//!     that session with stdin piped, stdout and stderr shown as they come and the exit status
//!     passed through (124 at its deadline), files and processes persist between execs, `session
//!     cp` moves a file in or out by the guest's path (and nothing outside the home and the
//!     workspace), and `session ps` lists its processes by their pids inside the session, `session pause` freezes every process of the session (no exec until `session resume`), `session snapshot ID FILE` writes its home as a new tar file (mode 0600) from which `session create --from FILE` starts another, a session idle past its `--idle-timeout` ends by itself (one with an exec running is not idle), and `session kill` leaves no process and no home. `session exec -i` streams our stdin to the command as it comes and `session exec -it` gives it a terminal, this one raw meanwhile (restored after) and its size followed, as `docker exec -it` (the exit status passed through); `session exec -d` starts a command in the background and prints its pid; `session input` writes its stdin (`-i`) from ours and closes it, `session signal` signals its process group (by name or number), `session resize` sizes its terminal (`-t`), `session jobs` lists it running or ended, and `session attach` streams its output (`--replay`: what it wrote before first) and passes its exit status through. `session create --allow-net HOST` lets every exec of the session reach what the rules name through one proxy for the session's life, and nothing else; `--tier docker` makes the session one hardened container driven by the same commands (`--allow-net` too: the proxy is put in the container's own network namespace, as root); `--disk SIZE` caps the home (a write past it fails with "No space left on device"; the host sees the tmpfs on the home in its mount table, and kill or gc unmounts it). Without an owner, each
//!     command says in one line how to start one. A SIGTERM ends every session; a
//!     SIGKILLed owner's sessions die with it (a docker session's container stops, every
//!     process in it gone, judged from the host), and `stockade gc` removes their homes and
//!     containers.
//!     (pinned by: tests/it/session.rs::g10_*)
//! G11. `stockade serve --listen ADDR --api-key-env VAR` (HTTPS only off loopback: `--tls-cert`,
//!     `--tls-key`) also speaks E2B's API
//!     over the same sessions, so the official E2B Python SDK, sync and async, drives them
//!     unchanged: create, info, list, connect, timeout and kill; `commands.run` with its
//!     output callbacks, a non-zero exit as `CommandExitException`, its timeout as
//!     `TimeoutException` (the process killed), background commands with stdin (`send_stdin`, `stream_input`), kill and
//!     list; the filesystem calls and 10 MiB uploads and downloads through the session's
//!     descriptor-held files API (`..` refused, a planted symlink not followed out); a PTY
//!     with resize. A wrong or missing API key or access token is 401, one sandbox's token
//!     opens no other, a sandbox past its timeout is gone from the host, malformed or
//!     oversized Connect messages and unknown methods and fields get their Connect codes,
//!     and 1,000 idle connections do not stop it answering.
//!     (pinned by: tests/it/e2b.rs::g11_*)
//! G12. `stockade run --grant-mcp NAME=COMMAND` starts a host MCP server (the pinned MCP
//!     Python SDK's, in the tests) and grants its tools as `NAME.TOOL`: `stockade-call
//!     NAME.TOOL JSON` in the process tier, `NAME.TOOL(...)` in JavaScript. The server's log
//!     shows that only calls the policy allowed and the tool's schema accepted reached it;
//!     the guest gets the tool's result with its `isError`, and of a crash only that the
//!     server stopped, while the server's stderr and exit status are shown on stockade's
//!     stderr, prefixed; `--json` lists each call with its rule; the server is gone when the
//!     run ends; a server that cannot start is one line before the run. `stockade agent`'s
//!     `[[grant.mcp]]` gives the same grants, under `[grant] policy`, to `run_code`'s programs.
//!     (pinned by: tests/it/mcp_grant.rs::g12_*)
//! G13. `stockade agent --confine process` runs the whole loop inside the process tier (the
//!     host sees NoNewPrivs, seccomp mode 2 and namespaces of its own in its
//!     `/proc/PID/status`): the endpoint gets the real key, added on the host, while the
//!     loop's environment and memory hold only the run's placeholder, and an answer that
//!     echoes the key reaches the user scrubbed; each tool (commands, `run_code`,
//!     `[[grant.mcp]]` servers' tools) runs on the host only when the policy, decided on the
//!     host, allows the call, decided on arguments whose sources the host traced through
//!     the traffic it relayed (the runtime's G16), so the steward decides the same confined
//!     and unconfined on the same model script; the `--trace` file is the host's, written
//!     from the broker's record as each call is decided and as it ends (a line each,
//!     flushed), a call still running when the loop exits or when SIGINT, SIGTERM or SIGHUP
//!     stops the run closed as `cancelled` (the run then ends with its end line and exit
//!     128 + N). A loop replaced by a hostile program can ask for a denied or ungranted tool,
//!     forge a permit in a frame, or try to write the host's trace or side-effect files:
//!     nothing runs that the policy denies, the files are unchanged, and the trace records
//!     each attempt. A call the policy marks `ask` is shown on the host's terminal (tool,
//!     canonical arguments, rule) while the loop's call waits, and runs only if approved. `--confine docker` (as root) does the same with the loop in a hardened
//!     container of `--image` (busybox by default, which has no C library: the loop brings
//!     the loader and libraries it was linked with), judged the same way from the host;
//!     without root, or with `--image` but not docker, or an image the engine lacks, it is one
//!     line and exit 125.
//!     (pinned by: tests/it/confined.rs::g13_*)
//! G14. No process `stockade` starts outlives it: when `stockade run` (or any other command)
//!     returns, whatever the outcome (a verified run, a refusal, a timeout, a stop by SIGINT,
//!     SIGTERM or SIGHUP, a panic), its fork server, every run's helper and pid 1 have exited
//!     and been reaped by it (it is a child subreaper, so a killed run's pid 1, orphaned when
//!     its helper dies first, comes back to it), so none is left as a zombie for the
//!     machine's PID 1 (which in a container, where `stockade serve` itself is PID 1, may
//!     never reap). Judged from `/proc` by a subreaper that starts the runs. A one-shot
//!     `stockade run` in the process tier hands its fork server over to the run: the
//!     server's own process is the run's helper, with no clone beside it (judged from
//!     `/proc` while the run runs).
//!     (pinned by: tests/it/cli.rs::g14_*)
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
//! command on the host (as the user, environment cleared to `PATH`) when a call is allowed,
//! and starts each `--grant-mcp` server on the host (as the user, with stockade's
//! environment, for the whole run);
//! for `mcp`, reads its policy file and serves stdin and stdout; for `agent`, reads
//! its config and policy files, the API key's variable, connects to the endpoint and starts the
//! configured command tools (with `--confine`, copies its own binary into the run as the
//! loop; `stockade confined-loop`, inside, reads its turn on stdin and the broker's and the
//! model's addresses from its environment); reads the wasm tier's guest and
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
mod doctor;
mod mcp;
mod run;
mod session;
mod term;
mod tiers;

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
pub use stockade_runtime::process;
use stockade_runtime::{docker, wasm};

/// Exit code for stockade's own failures (as `timeout(1)` uses 125).
pub(crate) const EXIT_STOCKADE: u8 = 125;

/// The signals that stop a run rather than the CLI alone, by name and number: a stopped run
/// is cleaned up (its sandbox killed, its record closed) and the CLI exits as a program
/// killed by that signal would, 128 + N.
const STOP_SIGNALS: [(&str, u8); 3] = [("SIGTERM", 15), ("SIGINT", 2), ("SIGHUP", 1)];

/// Resolves at the first of [`STOP_SIGNALS`] to arrive after its first poll (from then on
/// they no longer end the process), with its name and number.
pub(crate) async fn stop_signal() -> std::io::Result<(&'static str, u8)> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    let [t, i, h] = STOP_SIGNALS;
    Ok(tokio::select! {
        _ = term.recv() => t,
        _ = int.recv() => i,
        _ = hup.recv() => h,
    })
}

/// The exit code of a run stopped by the signal `name` (one of [`STOP_SIGNALS`]).
pub(crate) fn stopped_exit(name: &str) -> u8 {
    STOP_SIGNALS.iter().find(|(n, _)| *n == name).map_or(EXIT_STOCKADE, |(_, n)| 128 + n)
}

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
    Run(Box<run::RunArgs>),
    /// Run an agent over an OpenAI-compatible endpoint: every untrusted tool output is marked,
    /// every tool call is decided by the policy before it runs, and code runs in a tier.
    #[command(after_help = "Examples:
  stockade agent --config examples/steward/agent.toml \\
    \"Three deliveries reached the gate today. Read each one and deal with it.\"
  stockade agent --base-url http://127.0.0.1:8080/v1 --model smollm2 --policy policy.toml 'What is 6*7? Use run_code.'
  stockade agent --config agent.toml --api-key-env OPENAI_API_KEY --trace run.jsonl --json 'Summarise the scrolls.'
  stockade agent --config agent.toml --stream 'Tell me about the keep.'
  stockade agent --confine process --config agent.toml --trace run.jsonl 'Summarise the scrolls.'
  stockade agent --confine process --config agent.toml --channel ops --speaker alice 'Is the gate fixed?'
  stockade agent --confine process --config agent.toml --channel ops --reset
  stockade agent --confine docker --config agent.toml 'Summarise the scrolls.'

On a terminal, a call the policy marks `ask` is shown (tool, canonical arguments, rule, reason)
and runs only if you answer y; with no terminal it is denied.

Exit codes: 0 answered; 3 no answer (turns, tool calls, tokens or time spent, or the same call
denied again and again); 4 the endpoint failed (unreachable after retries, credentials refused,
a bad response); 125 stockade failed (configuration, policy, setup).")]
    Agent(Box<agent::AgentArgs>),
    /// Serve the sandboxes as an MCP server on stdio (`run_code`, `run_command`), for Claude
    /// Desktop, Codex and other MCP clients; protocol messages only on stdout, logs on stderr.
    Mcp(Box<mcp::McpArgs>),
    /// Own live sessions (sandboxes that keep their state across commands) until SIGTERM or
    /// SIGINT, on a unix socket only this user can open; `stockade session` drives them.
    #[command(
        after_help = "Examples:\n  owner=$(stockade serve --detach)   # its pid, once it listens\n  id=$(stockade session create --memory 1G)\n  stockade session exec $id -- sh -c 'echo hi > notes.txt'\n  stockade session exec $id -- cat notes.txt\n  stockade session kill $id\n  kill $owner                         # ends every session it owns"
    )]
    Serve(session::ServeArgs),
    /// Drive the sessions `stockade serve` owns: create, exec (-d in the background), attach,
    /// input, signal, resize, jobs, cp, ps, ls, pause, resume, snapshot, kill.
    #[command(subcommand)]
    Session(Box<session::SessionCommand>),
    /// Remove what killed runs left behind: what the guest planted in a read-write workspace
    /// when its supervisor was killed before the sweep, the process tier's per-run cgroups
    /// whose supervisor is gone, the homes of a killed `stockade serve`'s sessions, grants
    /// directories whose broker is gone, and the docker tier's expired or orphaned
    /// containers, sessions' included (when an engine answers).
    #[command(
        after_help = "Examples:\n  stockade gc\n  stockade doctor   # the `stale cgroups` row says whether there is anything to remove"
    )]
    Gc,
    /// Docker tier maintenance.
    #[command(subcommand)]
    Docker(DockerCommand),
    /// Inside a confined agent's run (`stockade agent --confine`): one turn on stdin, one
    /// reply on stdout.
    #[command(name = "confined-loop", hide = true)]
    ConfinedLoop,
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
    /// `stockade serve`'s lifeline: once its stdin ends (the owner holding it exited, however
    /// it exited), remove the containers of owners that are gone, this one's included.
    #[command(hide = true)]
    Lifeline {
        /// The owner's label (`spec::owner` of the serving process).
        #[arg(long)]
        owner: String,
    },
}

/// Whether this process is a confined agent's loop (`stockade confined-loop`), which runs
/// no sandbox of its own: `main` starts no fork server for it.
#[must_use]
pub fn is_confined_loop() -> bool {
    std::env::args_os().nth(1).is_some_and(|a| a == agent::LOOP_COMMAND)
}

/// Entry point for the binary.
#[must_use]
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    if matches!(cli.command, Command::Run(_) | Command::Agent(_) | Command::Mcp(_) | Command::Serve(_)) {
        // What a killed run left for its sweep is finished before anything else runs.
        for done in process::finish_killed_sweeps() {
            let _ = writeln!(std::io::stderr(), "stockade: {done}");
        }
    }
    let result = match cli.command {
        Command::Run(args) => run::run(*args),
        Command::Agent(args) => agent::run(*args),
        Command::ConfinedLoop => agent::confined_loop(),
        Command::Mcp(args) => mcp::run(*args),
        Command::Serve(args) => session::serve(args),
        Command::Session(cmd) => session::session(*cmd),
        Command::Doctor { json } => doctor::doctor(json).map(|()| ExitCode::SUCCESS),
        Command::Docker(DockerCommand::Gc { all }) => doctor::docker_gc(all).map(|()| ExitCode::SUCCESS),
        Command::Docker(DockerCommand::Lifeline { owner }) => {
            doctor::docker_lifeline(&owner).map(|()| ExitCode::SUCCESS)
        }
        Command::Gc => doctor::gc().map(|()| ExitCode::SUCCESS),
    };
    // What the log queued is written before this process's own last line, and before exit.
    term::flush_log(std::time::Duration::from_secs(2));
    result.unwrap_or_else(|e| {
        let _ = writeln!(std::io::stderr(), "stockade: {e:#}");
        ExitCode::from(EXIT_STOCKADE)
    })
}
