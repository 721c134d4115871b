//! `stockade-escape`: runs the attack matrix. Usually started by `cargo xtask escape`.
//!
//! Usage: `stockade-escape --attacks DIR [--wasm-attacks FILE] [--tier process|process-fork|process-pool|process-session|wasm|docker|bwrap|docker-run|all]
//! [--attack NAME] [--json] [--markdown FILE] [--require TIER]`

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use stockade_escape::world::World;
use stockade_escape::{ATTACKS, Comparison, Entry, Outcome, Setup};
use stockade_process::{Helper, ProcessTier, RunError};
use stockade_protocol::{Access, Job, JobKind, Limits, Report, Status};

/// The columns that are stockade's own tiers: an unexpected outcome there fails the run.
/// `process` launches each run's helper through a fork server (what a multi-threaded
/// embedder, the runtime and the CLI use); `process-fork` forks the single-threaded
/// supervisor directly; `process-pool` runs each attack in a sandbox built before the
/// attack's job existed (`ProcessTier::pool`, through the fork server). All three expect
/// the process tier's outcomes.
const STOCKADE_TIERS: &[&str] = &["process", "process-fork", "process-pool", "process-session", "wasm", "docker"];

/// Set in a `--*-one` child's environment for the `process-fork` column: it then starts no
/// fork server, and the helper is forked from the child itself.
const DIRECT_FORK_VAR: &str = "STOCKADE_ESCAPE_DIRECT_FORK";

/// Set in a `--*-one` child's environment for the `process-pool` column: its tier has a
/// pool, whose sandbox for the attack's workspace is built before the job is made.
const POOL_VAR: &str = "STOCKADE_ESCAPE_POOL";

/// Set in a `--*-one` child's environment for the `process-session` column: the attack runs
/// as the second exec of a live session, after a first exec that prepared the ground.
const SESSION_VAR: &str = "STOCKADE_ESCAPE_SESSION";

/// The `process-session` column's first exec, in the same session before the attack: it
/// leaves what a later exec could try to use (a daemon with a copy of the attack program
/// running from `/tmp`, a script and start-up files in the home, files in `/tmp` and
/// `/dev/shm`, an abstract socket listener if python3 is there), and tries to change what
/// the next exec starts from (the session's init, its environment, `/etc`).
const PREPARE: &str = r#"cp "$0" /tmp/prepared 2>/dev/null; chmod +x /tmp/prepared 2>/dev/null
(exec sleep 600 </dev/null >/dev/null 2>&1 &)
printf '#!/bin/sh\nexec /tmp/prepared "$@"\n' > /home/user/run.sh; chmod +x /home/user/run.sh
echo 'export LD_PRELOAD=/tmp/evil.so' > /home/user/.profile; cp /home/user/.profile /home/user/.bashrc
echo planted > /dev/shm/planted; echo planted > /tmp/planted
export STOCKADE_PLANTED=1; echo 'PATH=/tmp' >> /etc/environment 2>/dev/null
kill -STOP 1 2>/dev/null; kill -9 1 2>/dev/null
python3 -c '
import os, socket
if os.fork() == 0:
    os.setsid()
    s = socket.socket(socket.AF_UNIX)
    s.bind("\0stockade-planted")
    s.listen()
    s.accept()
' </dev/null >/dev/null 2>&1
exit 0"#;

/// How a `--*-one` child launches its runs: the process-tier column it serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Launch {
    /// `process`: through the child's fork server.
    Server,
    /// `process-fork`: the single-threaded child forks its helper itself.
    Direct,
    /// `process-pool`: a pre-built sandbox, through the fork server.
    Pool,
    /// `process-session`: the second exec of a live session, through the fork server.
    Session,
}

/// The process tier of a `--*-one` child, as its column asks.
fn child_tier() -> ProcessTier {
    let tier = ProcessTier::new(Helper::fork());
    if std::env::var_os(POOL_VAR).is_some() { tier.pool(1) } else { tier }
}

const SECRET_VAR: &str = "STOCKADE_ESCAPE_SUPERVISOR_SECRET";

struct Args {
    attacks: PathBuf,
    wasm_attacks: Option<PathBuf>,
    tiers: Vec<String>,
    only: Option<String>,
    json: bool,
    markdown: Option<PathBuf>,
    require: Vec<String>,
}

/// Runs one attack from the workspace `ws` in the process tier, from this fresh,
/// single-threaded process, launching the helper by fork as the `stockade` CLI does.
/// An `attack` that is an absolute path is run as it is (a reader in the view, for the
/// two-run race's second runs).
fn run_one(ws: &str, access: Access, attack: &str, args: &[String]) -> Result<Result<Report, RunError>> {
    let program = if attack.starts_with('/') { attack.to_owned() } else { format!("/workspace/{attack}") };
    let job = Job::command(program, args.iter().cloned())?.with_workspace(ws, access)?.with_limits(limits());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let tier = child_tier();
    if std::env::var_os(SESSION_VAR).is_some() {
        return rt.block_on(in_session(&tier, &job, attack));
    }
    // The `process-pool` column: the attack's sandbox is built (and confined) before its job
    // exists, then the job is handed in.
    if let Err(e) = tier.prebuild(Some((Path::new(ws), access))) {
        return Ok(Err(e));
    }
    Ok(rt.block_on(tier.run(&job)))
}

/// The `process-session` column: a session with the attack's workspace and a home of its
/// own; a first exec prepares the ground ([`PREPARE`], with the attack program as `$0`),
/// then the attack runs as the second exec; the session is killed (and a read-write
/// workspace swept, its result in the attack's report) before the report is returned.
async fn in_session(tier: &ProcessTier, job: &Job, attack: &str) -> Result<Result<Report, RunError>> {
    let home = std::env::temp_dir().join(format!("stockade-escape-session-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    std::fs::create_dir_all(&home)?;
    let config = stockade_process::SessionConfig {
        limits: limits(),
        workspace: job.workspace().cloned(),
        home: Some(home.clone()),
        ..stockade_process::SessionConfig::default()
    };
    let session = match tier.session(config).await {
        Ok(s) => s,
        Err(e) => return Ok(Err(e)),
    };
    let program = if attack.starts_with('/') { attack.to_owned() } else { format!("/workspace/{attack}") };
    let prepare = Job::command("sh", ["-c", PREPARE, &program])?.with_limits(limits());
    let prepared = session.exec(&prepare, None, stockade_protocol::LiveIo::default()).await;
    let JobKind::Command { program, args } = job.kind() else { bail!("a command job") };
    let attack = Job::command(program.clone(), args.iter().cloned())?.with_limits(*job.limits());
    let report = match prepared {
        Ok(_) => session.exec(&attack, Some("/workspace"), stockade_protocol::LiveIo::default()).await,
        Err(e) => Err(e),
    };
    let swept = session.kill().await;
    let _ = std::fs::remove_dir_all(&home);
    Ok(report.map(|mut r| {
        swept.record(&mut r, stockade_protocol::Mechanism::MountNamespace);
        r
    }))
}

/// Where one grants attack writes: its `log` grant's log, the victim run's log, the parent
/// directory of the victim run's grants directory, and the grant's key.
struct GrantPaths {
    log: PathBuf,
    victim_log: PathBuf,
    victim_parent: PathBuf,
    key: String,
}

impl GrantPaths {
    fn new(world: &World, name: &str) -> Result<Self> {
        let log = world.root.join(format!("grants-{name}.log"));
        let victim_log = world.root.join(format!("grants-{name}-victim.log"));
        // Short: the victim's socket path must stay under 108 bytes.
        let victim_parent = world.root.join(format!("v-{}", name.trim_start_matches("grant_")));
        let _ = std::fs::remove_file(&log);
        let _ = std::fs::remove_file(&victim_log);
        let _ = std::fs::remove_dir_all(&victim_parent);
        std::fs::create_dir_all(&victim_parent)?;
        Ok(Self { log, victim_log, victim_parent, key: stockade_escape::grants::key() })
    }

    /// The extra target an attack gets: where the victim run's grants directory lives on
    /// the host (the worst case: the attacker knows the path).
    fn arg(&self) -> String {
        format!("victim_grants={}", self.victim_parent.display())
    }
}

/// Runs `job` with the harness's grants in `attacker`, and, for `grant_other_run`, a victim
/// run with its own grants in `victim` at the same time (`victim_job`).
async fn granted(
    name: &str,
    paths: &GrantPaths,
    attacker: &stockade_runtime::Sandbox,
    job: &Job,
    victim: Option<(&stockade_runtime::Sandbox, Job)>,
    upstream: Option<&str>,
) -> Result<Report> {
    let mut grants = stockade_escape::grants::grants(&paths.log, &paths.key)?;
    if let Some(url) = upstream {
        grants = grants.model(stockade_escape::grants::model(url, &paths.key)?);
    }
    let grants = std::sync::Arc::new(grants);
    let victim = victim.filter(|_| name == "grant_other_run");
    let wait = victim.is_some();
    let attack = async {
        if wait {
            // Let the victim's broker come up first.
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
        attacker.report(stockade_runtime::RunRequest::new(job).grants(grants)).await
    };
    let report = match victim {
        Some((sandbox, vjob)) => {
            let vgrants = std::sync::Arc::new(stockade_escape::grants::grants(&paths.victim_log, &paths.key)?);
            let (v, a) = tokio::join!(sandbox.report(stockade_runtime::RunRequest::new(&vjob).grants(vgrants)), attack);
            v?;
            a?
        }
        None => attack.await?,
    };
    Ok(report)
}

/// `--granted-one BIN_DIR ATTACK LOG VICTIM_LOG VICTIM_PARENT KEY UPSTREAM ARGS...`: run one grants
/// attack in the process tier from this fresh, single-threaded process (the helper is
/// forked, as the CLI does) and print the report as JSON.
fn granted_one(rest: &[String]) -> Result<()> {
    let usage = "--granted-one BIN_DIR ATTACK LOG VICTIM_LOG VICTIM_PARENT KEY UPSTREAM ARGS...";
    let [bin_dir, name, log, victim_log, victim_parent, key, upstream, args @ ..] = rest else { bail!(usage) };
    let paths = GrantPaths {
        log: log.into(),
        victim_log: victim_log.into(),
        victim_parent: victim_parent.into(),
        key: key.clone(),
    };
    let job = |args: &[String]| -> Result<Job> {
        Ok(Job::command(format!("/workspace/{name}"), args.iter().cloned())?
            .with_workspace(bin_dir, Access::ReadOnly)?
            .with_limits(limits()))
    };
    let tier = child_tier;
    let attacker = stockade_runtime::Sandbox::builder().tier(tier()).build()?;
    let victim = stockade_runtime::Sandbox::builder().tier(tier()).grants_dir(&paths.victim_parent).build()?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let report = rt.block_on(granted(
        name,
        &paths,
        &attacker,
        &job(args)?,
        Some((&victim, job(&["role=victim".to_owned()])?)),
        Some(upstream.as_str()),
    ));
    print_report(report.map_err(|e| e.to_string()))
}

/// Judges a grants run: the world's checks, the grants' own checks (and what reached the
/// model grant's upstream, if it had one), then the report.
fn judge_granted(
    world: &mut World,
    report: &Report,
    marker: &str,
    paths: &GrantPaths,
    upstream: Option<&stockade_test_support::MockLlm>,
    expect: &[stockade_escape::Expect],
    name: &str,
) -> Result<Cell> {
    if name == "grant_after_deadline" {
        std::thread::sleep(stockade_escape::grants::LATE_CALL_WAIT);
    }
    let out = output(report);
    let grants = || {
        stockade_escape::grants::judge(name, report, &out, &paths.log, &paths.key, &paths.victim_log)
            .or_else(|| upstream.and_then(|u| stockade_escape::grants::upstream_changed(name, &u.received())))
    };
    judge(world, report, marker, grants, expect, name)
}

fn run_process_granted(world: &mut World, bin_dir: &Path, entry: &Entry, launch: Launch) -> Result<Cell> {
    let targets = world.targets(entry.name);
    let paths = GrantPaths::new(world, entry.name)?;
    let upstream = stockade_escape::grants::upstream()?;
    let one = one_child(launch)?
        .arg("--granted-one")
        .arg(bin_dir)
        .arg(entry.name)
        .arg(&paths.log)
        .arg(&paths.victim_log)
        .arg(&paths.victim_parent)
        .arg(&paths.key)
        .arg(upstream.url())
        .args(&targets.args)
        .arg(paths.arg())
        .env("STOCKADE_ESCAPE_GRANT_KEY", &paths.key)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()?;
    let report = match child_report(entry.name, "--granted-one", &one)? {
        Ok(r) => r,
        Err(cell) => return Ok(cell),
    };
    judge_granted(world, &report, &targets.marker, &paths, Some(&upstream), entry.expect.process, entry.name)
}

/// `--net-one BIN_DIR ATTACK POLICY_FILE RESOLVE ARGS...`: run one network attack in the
/// process tier with the network grant of `POLICY_FILE` and the `RESOLVE` entry, from this
/// fresh, single-threaded process, and print the report as JSON.
fn net_one(rest: &[String]) -> Result<()> {
    let usage = "--net-one BIN_DIR ATTACK POLICY_FILE RESOLVE ARGS...";
    let [bin_dir, name, policy, resolve, args @ ..] = rest else { bail!(usage) };
    let job = Job::command(format!("/workspace/{name}"), args.iter().cloned())?
        .with_workspace(bin_dir, Access::ReadOnly)?
        .with_limits(limits());
    let net = stockade_escape::net::grant(&std::fs::read_to_string(policy)?, resolve)?;
    let grants = std::sync::Arc::new(stockade_runtime::Grants::new().net(net));
    let sandbox = stockade_runtime::Sandbox::builder().tier(child_tier()).build()?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let report = rt.block_on(sandbox.report(stockade_runtime::RunRequest::new(&job).grants(grants)));
    print_report(report.map_err(|e| e.to_string()))
}

/// The listeners of the network rows, stood up on first use and shared by every column.
fn net_world() -> Result<&'static stockade_escape::net::NetWorld> {
    static NET: std::sync::OnceLock<std::result::Result<stockade_escape::net::NetWorld, String>> =
        std::sync::OnceLock::new();
    NET.get_or_init(|| stockade_escape::net::NetWorld::new().map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|e| anyhow::anyhow!("standing up the network rows' listeners: {e}"))
}

/// The arguments, policy and resolve entry of one network attack.
fn net_setup(
    world: &World,
    name: &str,
    targets: &stockade_escape::world::Targets,
) -> Result<(Vec<String>, String, String)> {
    let net = net_world()?;
    let tcp = targets.args.iter().find_map(|a| a.strip_prefix("tcp=")).and_then(|p| p.parse().ok()).unwrap_or(0);
    let (policy, resolve) = net.grant_spec(tcp);
    let file = world.root.join(format!("net-{name}.toml"));
    std::fs::write(&file, &policy)?;
    let mut args = targets.args.clone();
    args.extend(net.args());
    Ok((args, file.to_string_lossy().into_owned(), resolve))
}

/// A network row in a process-tier column: the attack runs with the network grant from a
/// `--net-one` child; judged from the world and the network rows' listeners.
fn run_process_net(world: &mut World, bin_dir: &Path, entry: &Entry, launch: Launch) -> Result<Cell> {
    let targets = world.targets(entry.name);
    let (args, policy, resolve) = net_setup(world, entry.name, &targets)?;
    let one = one_child(launch)?
        .arg("--net-one")
        .arg(bin_dir)
        .arg(entry.name)
        .arg(&policy)
        .arg(&resolve)
        .args(&args)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()?;
    let report = match child_report(entry.name, "--net-one", &one)? {
        Ok(r) => r,
        Err(cell) => return Ok(cell),
    };
    let verdict = net_world()?.judge(&report).with_context(|| entry.name.to_owned())?;
    judge(
        world,
        &report,
        &targets.marker,
        || verdict.or_else(|| bin_changed(bin_dir, entry.name)),
        entry.expect.process,
        entry.name,
    )
}

/// `--supervise-one BIN_DIR ATTACK ARGS...`: run one attack in the process tier and wait.
/// Used as the stand-in supervisor that the harness kills mid-run.
fn supervise_one(rest: &[String]) -> Result<()> {
    let (bin_dir, rest) = rest.split_first().context("--supervise-one BIN_DIR ATTACK ARGS...")?;
    let (attack, args) = rest.split_first().context("--supervise-one BIN_DIR ATTACK ARGS...")?;
    let _ = run_one(bin_dir, Access::ReadOnly, attack, args)?;
    Ok(())
}

/// `--process-one WORKSPACE ro|rw ATTACK ARGS...`: run one attack (see [`run_one`]) and
/// print the report as JSON. A launch error is printed as `{"launch_error": ...}`.
fn process_one(rest: &[String]) -> Result<()> {
    let usage = "--process-one WORKSPACE ro|rw ATTACK ARGS...";
    let (ws, rest) = rest.split_first().context(usage)?;
    let (access, rest) = rest.split_first().context(usage)?;
    let (attack, args) = rest.split_first().context(usage)?;
    let access = if access == "rw" { Access::ReadWrite } else { Access::ReadOnly };
    print_report(run_one(ws, access, attack, args)?.map_err(|e| e.to_string()))
}

/// What a `--*-one` child prints: the report as JSON, or `{"launch_error": ...}`.
fn print_report(report: std::result::Result<Report, String>) -> Result<()> {
    let out = match report {
        Ok(report) => serde_json::to_string(&report)?,
        Err(e) => serde_json::json!({ "launch_error": e }).to_string(),
    };
    println!("{out}");
    Ok(())
}

/// Reads what a `--*-one` child (`flag`) printed: its report, or the skipped cell of a
/// launch error. A child that failed is a harness failure.
fn child_report(name: &str, flag: &str, one: &std::process::Output) -> Result<std::result::Result<Report, Cell>> {
    if !one.status.success() {
        bail!("{name}: {flag} failed: {}", one.status);
    }
    let value: serde_json::Value =
        serde_json::from_slice(&one.stdout).with_context(|| format!("{flag} printed no report"))?;
    if let Some(e) = value.get("launch_error").and_then(|e| e.as_str()) {
        return Ok(Err(skipped(&e)));
    }
    Ok(Ok(serde_json::from_value(value).context("parsing the report")?))
}

fn parse() -> Result<Args> {
    let mut a = Args {
        attacks: PathBuf::new(),
        wasm_attacks: None,
        tiers: vec![],
        only: None,
        json: false,
        markdown: None,
        require: vec![],
    };
    let mut it = std::env::args().skip(1);
    while let Some(x) = it.next() {
        match x.as_str() {
            "--attacks" => a.attacks = it.next().context("--attacks DIR")?.into(),
            "--wasm-attacks" => a.wasm_attacks = Some(it.next().context("--wasm-attacks FILE")?.into()),
            "--tier" => a.tiers.push(it.next().context("--tier NAME")?),
            "--attack" => a.only = Some(it.next().context("--attack NAME")?),
            "--json" => a.json = true,
            "--markdown" => a.markdown = Some(it.next().context("--markdown FILE")?.into()),
            "--require" => a.require.push(it.next().context("--require TIER")?),
            other => bail!("unknown argument {other:?}"),
        }
    }
    if a.tiers.is_empty() || a.tiers.iter().any(|t| t == "all") {
        a.tiers = vec![
            "process".into(),
            "process-fork".into(),
            "process-pool".into(),
            "process-session".into(),
            "wasm".into(),
            "docker".into(),
            "bwrap".into(),
            "docker-run".into(),
        ];
    }
    Ok(a)
}

fn main() -> ExitCode {
    // A `--*-one` child (one process-tier run) starts its fork server first thing, while it
    // has one thread, unless it serves the `process-fork` column. The `process` column's
    // child makes one run, as `stockade run` does, and hands the server over to it (the
    // server becomes that run's helper); the pool's and the session's children have the
    // server clone their helpers.
    let one = std::env::args_os().nth(1).is_some_and(|a| a.to_str().is_some_and(|a| a.ends_with("-one")));
    if one && std::env::var_os(DIRECT_FORK_VAR).is_none() {
        if let Err(e) = stockade_process::ForkServer::start() {
            eprintln!("stockade-escape: {e}");
            return ExitCode::FAILURE;
        }
        if std::env::var_os(POOL_VAR).is_none() && std::env::var_os(SESSION_VAR).is_none() {
            stockade_process::ForkServer::hand_over_next();
        }
    }
    // The supervisor's environment holds a secret; re-execute with one if it is missing.
    if std::env::var_os(SECRET_VAR).is_none() {
        let secret = format!("CANARY-SUPERVISOR-{}", std::process::id() * 7919 + 17);
        let status = std::env::current_exe()
            .and_then(|exe| Command::new(exe).args(std::env::args().skip(1)).env(SECRET_VAR, secret).status());
        return match status {
            Ok(s) if s.success() => ExitCode::SUCCESS,
            _ => ExitCode::FAILURE,
        };
    }
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.first().is_some_and(|a| a == "--listen-metadata") {
        let log = argv.get(1).map(PathBuf::from).unwrap_or_default();
        return match stockade_escape::world::listen_metadata(&log) {
            Ok(()) => ExitCode::SUCCESS,
            Err(_) => ExitCode::FAILURE,
        };
    }
    if argv.first().is_some_and(|a| a == "--process-one") {
        return match process_one(&argv[1..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("stockade-escape --process-one: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    if argv.first().is_some_and(|a| a == "--granted-one") {
        return match granted_one(&argv[1..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("stockade-escape --granted-one: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    if argv.first().is_some_and(|a| a == "--net-one") {
        return match net_one(&argv[1..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("stockade-escape --net-one: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    if argv.first().is_some_and(|a| a == "--supervise-one") {
        return match supervise_one(&argv[1..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(_) => ExitCode::FAILURE,
        };
    }
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("stockade-escape: {e:#}");
            ExitCode::FAILURE
        }
    }
}

struct Cell {
    outcome: Outcome,
    evidence: String,
    expected: bool,
}

/// One-line evidence from the attack's own attempt lines (informational only).
fn attempts(output: &[u8]) -> String {
    let text = String::from_utf8_lossy(output);
    let parts: Vec<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("ATTEMPT "))
        .map(|l| l.split_whitespace().take(2).collect::<Vec<_>>().join(" "))
        .collect();
    parts.join(", ")
}

fn limits() -> Limits {
    let l = Limits::new();
    l.with_wall(Duration::from_secs(6))
        .and_then(|l| l.with_cpu(Duration::from_secs(1)))
        .and_then(|l| l.with_memory(256 << 20))
        .and_then(|l| l.with_stdout(64 << 10))
        .unwrap_or(l)
}

fn classify(status: &Status, output: &[u8]) -> Outcome {
    match status {
        Status::TimedOut
        | Status::OutOfMemory
        | Status::OutputLimit { .. }
        | Status::CpuLimit
        | Status::Signaled { .. }
        | Status::Trapped { .. } => Outcome::Killed,
        _ if String::from_utf8_lossy(output)
            .lines()
            .any(|l| l.starts_with("ATTEMPT ") && l.split_whitespace().nth(2) == Some("ok")) =>
        {
            Outcome::Contained
        }
        _ => Outcome::Denied,
    }
}

/// Row 47: a stand-in supervisor (this program, re-executed) runs the attack; once the
/// attack is visible on the host, the supervisor is SIGKILLed, and the attack must die too.
fn run_process_killing_supervisor(world: &mut World, bin_dir: &Path, entry: &Entry, launch: Launch) -> Result<Cell> {
    let targets = world.targets(entry.name);
    let mut supervisor = one_child(launch)?
        .arg("--supervise-one")
        .arg(bin_dir)
        .arg(entry.name)
        .args(&targets.args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let start = Instant::now();
    let mut seen = false;
    while start.elapsed() < Duration::from_secs(5) {
        if !stockade_escape::world::pids_now(&targets.marker).is_empty() {
            seen = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    supervisor.kill()?;
    supervisor.wait()?;
    if !seen {
        bail!("{}: the attack never started under the stand-in supervisor", entry.name);
    }
    let outcome = match world.check(b"", &targets.marker) {
        Some(evidence) => Outcome::Escaped(evidence),
        None => Outcome::Killed,
    };
    let expected = outcome.is_one_of(entry.expect.process);
    let evidence = match &outcome {
        Outcome::Escaped(e) => e.clone(),
        _ => "the supervisor was SIGKILLed mid-run; the host found no process of the run left".into(),
    };
    Ok(Cell { outcome, evidence, expected })
}

/// A fresh read-write workspace with `.git/hooks`, `.git/config` and `.bashrc`, and the
/// attack program inside; owned by the invoking user (as a project is: the process tier
/// makes it the guest's own), or by `owner` (the docker tier's container user).
fn rw_workspace(world: &World, bin_dir: &Path, name: &str, owner: Option<u32>) -> Result<PathBuf> {
    let ws = world.root.join(format!("ws-{name}"));
    let _ = std::fs::remove_dir_all(&ws);
    std::fs::create_dir_all(ws.join(".git/hooks"))?;
    std::fs::write(ws.join(".git/config"), "[core]\n")?;
    std::fs::write(ws.join(".bashrc"), "# rc\n")?;
    std::fs::copy(bin_dir.join(name), ws.join(name))?;
    if let Some(id) = owner {
        for p in ["", ".git", ".git/hooks", ".git/config", ".bashrc", name] {
            std::os::unix::fs::chown(ws.join(p), Some(id), Some(id))?;
        }
    }
    // A host daemon's socket inside the workspace, open to everyone (the newcomer issue's
    // item 6): the host checks after the run that nothing connected to it.
    let daemon = std::os::unix::net::UnixListener::bind(ws.join("run/daemon.sock")).or_else(|_| {
        std::fs::create_dir_all(ws.join("run"))?;
        std::os::unix::net::UnixListener::bind(ws.join("run/daemon.sock"))
    })?;
    std::fs::set_permissions(ws.join("run/daemon.sock"), std::os::unix::fs::PermissionsExt::from_mode(0o666))?;
    daemon.set_nonblocking(true)?;
    DAEMONS.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(ws.clone(), daemon);
    Ok(ws)
}

/// The daemon sockets of the [`rw_workspace`]s, by workspace, held while their runs last.
static DAEMONS: std::sync::Mutex<std::collections::BTreeMap<PathBuf, std::os::unix::net::UnixListener>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

/// What changed in an [`rw_workspace`] that would outlive the run.
fn rw_workspace_changed(ws: &Path) -> Option<String> {
    if let Some(daemon) = DAEMONS.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(ws)
        && daemon.accept().is_ok()
    {
        return Some("a host daemon's unix socket inside the workspace was connected to".into());
    }
    let read = |p: &str| std::fs::read_to_string(ws.join(p)).ok();
    if read(".git/config").as_deref() != Some("[core]\n") {
        return Some(".git/config was changed in the workspace".into());
    }
    if read(".bashrc").as_deref() != Some("# rc\n") {
        return Some(".bashrc was changed in the workspace".into());
    }
    let hooks: Vec<_> = std::fs::read_dir(ws.join(".git/hooks")).into_iter().flatten().flatten().collect();
    if !hooks.is_empty()
        || !ws.join(".git").is_dir()
        || std::fs::symlink_metadata(ws.join(".git")).is_ok_and(|m| m.file_type().is_symlink())
    {
        return Some("a git hook was planted or .git was swapped in the workspace".into());
    }
    // Nothing created where a protected path was absent (`.envrc`, agent settings, git
    // metadata): the tier's sweep removed it, or the guest could not make it.
    let absent: Vec<&str> = stockade_protocol::PROTECTED_PATHS
        .iter()
        .copied()
        .filter(|p| !matches!(*p, ".git/hooks" | ".git/config" | ".bashrc"))
        .filter(|p| std::fs::symlink_metadata(ws.join(p)).is_ok())
        .collect();
    if !absent.is_empty() {
        return Some(format!("protected paths were planted in the workspace: {}", absent.join(" ")));
    }
    // Nothing new at the top of `.git` beyond what git writes (the setup made `hooks` and
    // `config`): `.git/commondir` would point the host's git at a planted config.
    let planted: Vec<String> = std::fs::read_dir(ws.join(".git"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| !(n == "hooks" || n == "config" || stockade_protocol::git_writable(n)))
        .map(|n| format!(".git/{}", n.to_string_lossy()))
        .collect();
    if !planted.is_empty() {
        return Some(format!("new .git entries git does not write were planted: {}", planted.join(" ")));
    }
    // No set-user-ID or set-group-ID file that the invoking user owns (it would carry the
    // user's rights to whoever runs it).
    let me = std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m)).unwrap_or(0);
    for e in std::fs::read_dir(ws).into_iter().flatten().flatten() {
        let Ok(m) = std::fs::symlink_metadata(e.path()) else { continue };
        if std::os::unix::fs::MetadataExt::mode(&m) & 0o6000 != 0 && std::os::unix::fs::MetadataExt::uid(&m) == me {
            return Some(format!("a set-id file owned by the invoking user was planted: {}", e.path().display()));
        }
    }
    None
}

/// `launch`: the process-tier column this is.
fn run_process(world: &mut World, bin_dir: &Path, entry: &Entry, launch: Launch) -> Result<Cell> {
    if let Some(cell) = not_applicable(entry.expect.process) {
        return Ok(cell);
    }
    if entry.setup == Setup::KillSupervisor {
        return run_process_killing_supervisor(world, bin_dir, entry, launch);
    }
    if launch == Launch::Session && matches!(entry.setup, Setup::Grants | Setup::Net) {
        let why = "the column drives the process tier's session without a broker; a session's grants are the run's broker (the CLI's tests)";
        return Ok(Cell { outcome: Outcome::NotApplicable(why), evidence: why.into(), expected: true });
    }
    if entry.setup == Setup::Grants {
        return run_process_granted(world, bin_dir, entry, launch);
    }
    if entry.setup == Setup::TwoRuns {
        return run_process_two_runs(world, bin_dir, entry, launch);
    }
    if entry.setup == Setup::Net {
        return run_process_net(world, bin_dir, entry, launch);
    }
    let targets = world.targets(entry.name);
    let rw = (entry.setup == Setup::RwWorkspace).then(|| rw_workspace(world, bin_dir, entry.name, None)).transpose()?;
    let (ws, access) = match &rw {
        Some(ws) => (ws.as_path(), Access::ReadWrite),
        None => (bin_dir, Access::ReadOnly),
    };
    // Each attack runs from a fresh process that launches the helper without an exec: through
    // its fork server, or (`process-fork`) by forking itself while single-threaded. This
    // harness has other threads, so it could only exec one; the library's exec launch is
    // covered by the tier's own tests.
    let one = one_child(launch)?
        .arg("--process-one")
        .arg(ws)
        .arg(if access == Access::ReadWrite { "rw" } else { "ro" })
        .arg(entry.name)
        .args(&targets.args)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()?;
    let report = match child_report(entry.name, "--process-one", &one)? {
        Ok(r) => r,
        Err(cell) => return Ok(cell),
    };
    let host_changed = || bin_changed(bin_dir, entry.name).or_else(|| rw.as_deref().and_then(rw_workspace_changed));
    // A session's loopback is up (its execs' own servers): a datagram to it goes out and
    // reaches nothing of the host, as in a container; the host's listener judges that.
    let expect = match (launch, entry.name) {
        (Launch::Session, "net_udp_loopback") => entry.expect.docker,
        _ => entry.expect.process,
    };
    judge(world, &report, &targets.marker, host_changed, expect, entry.name)
}

/// Most second runs one two-run race starts.
const RACE_RUNS: usize = 24;

/// The two-run race ([`Setup::TwoRuns`]): the attack holds the workspace `W` read-write and
/// swaps `W/sub` with a symlink to the world's home; meanwhile, every 30 ms, a `--*-one`
/// child of the same column starts a run granted `W/sub` read-only that prints the home's
/// canary files if they are what it was given. Judged on the host: a canary in any of
/// their outputs, or a change to the workspace, is an escape.
fn run_process_two_runs(world: &mut World, bin_dir: &Path, entry: &Entry, launch: Launch) -> Result<Cell> {
    let targets = world.targets(entry.name);
    let ws = rw_workspace(world, bin_dir, entry.name, None)?;
    std::fs::create_dir(ws.join("sub"))?;
    std::fs::write(ws.join("sub/inside"), "granted\n")?;
    let mut attack = one_child(launch)?;
    attack.arg("--process-one").arg(&ws).arg("rw").arg(entry.name).args(&targets.args).stdin(Stdio::null());
    let attack = std::thread::spawn(move || attack.stderr(Stdio::inherit()).output());
    let readers =
        [".ssh/id_rsa", ".aws/credentials", ".config/gh/hosts.yml", "inside"].map(|f| format!("/workspace/{f}"));
    let mut second = Vec::new();
    while !attack.is_finished() && second.len() < RACE_RUNS {
        let run = one_child(launch)?
            .arg("--process-one")
            .arg(ws.join("sub"))
            .arg("ro")
            .arg("/bin/cat")
            .args(&readers)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        second.push(run);
        std::thread::sleep(Duration::from_millis(30));
    }
    let attack = attack.join().map_err(|_| anyhow::anyhow!("{}: the attack's thread panicked", entry.name))??;
    // Each second run either read `sub` (after waiting for the attack's run to let go of
    // the workspace) or was refused as it started (its path met the swapped-in symlink).
    let (mut seen, mut granted, mut refused) = (Vec::new(), 0, 0);
    for run in second {
        let out = run.wait_with_output()?;
        match child_report(entry.name, "--process-one", &out)? {
            Ok(report) => {
                let text = output(&report);
                granted += usize::from(String::from_utf8_lossy(&text).contains("granted"));
                seen.extend(text);
            }
            Err(_) => refused += 1,
        }
    }
    let report = match child_report(entry.name, "--process-one", &attack)? {
        Ok(r) => r,
        Err(cell) => return Ok(cell),
    };
    let started = seen.len();
    let leaked = world.check(&seen, &targets.marker);
    let host_changed = || leaked.or_else(|| bin_changed(bin_dir, entry.name)).or_else(|| rw_workspace_changed(&ws));
    let mut cell = judge(world, &report, &targets.marker, host_changed, entry.expect.process, entry.name)?;
    if !matches!(cell.outcome, Outcome::Escaped(_)) {
        if granted + refused == 0 {
            bail!("{}: no second run read the directory it was granted or was refused ({started} bytes)", entry.name);
        }
        cell.evidence = format!(
            "of {} runs granted sub read-only while the attack swapped it, {granted} read sub itself and {refused} were refused; {}",
            granted + refused,
            cell.evidence
        );
    }
    Ok(cell)
}

/// A `--*-one` child of this binary, for the process-tier column `launch`.
fn one_child(launch: Launch) -> Result<Command> {
    let mut cmd = Command::new(std::env::current_exe()?);
    match launch {
        Launch::Server => {}
        Launch::Direct => {
            cmd.env(DIRECT_FORK_VAR, "1");
        }
        Launch::Pool => {
            cmd.env(POOL_VAR, "1");
        }
        Launch::Session => {
            cmd.env(SESSION_VAR, "1");
        }
    }
    Ok(cmd)
}

/// A cell for a tier that could not run the attack at all.
fn skipped(e: &dyn std::fmt::Display) -> Cell {
    Cell { outcome: Outcome::Skipped(e.to_string()), evidence: e.to_string(), expected: false }
}

/// The n/a cell of an attack that does not apply to a tier, if it does not.
fn not_applicable(expect: &[stockade_escape::Expect]) -> Option<Cell> {
    match expect.first() {
        Some(stockade_escape::Expect::NotApplicable(why)) => {
            Some(Cell { outcome: Outcome::NotApplicable(why), evidence: (*why).into(), expected: true })
        }
        _ => None,
    }
}

/// Everything the attack wrote, stdout then stderr.
fn output(report: &Report) -> Vec<u8> {
    let mut output = report.stdout.bytes.clone();
    output.extend_from_slice(&report.stderr.bytes);
    output
}

/// Judges one stockade-tier run from the world: an escape if the host saw a change (its
/// own checks, then `host_changed`), else the outcome the report's status and attempts
/// give, checked against `expect`. A run that never started is a harness failure.
fn judge(
    world: &mut World,
    report: &Report,
    marker: &str,
    host_changed: impl FnOnce() -> Option<String>,
    expect: &[stockade_escape::Expect],
    name: &str,
) -> Result<Cell> {
    let output = output(report);
    if let Status::FailedToStart { reason } = &report.status {
        bail!("{name}: failed to start: {reason}");
    }
    let outcome = match world.check(&output, marker).or_else(host_changed) {
        Some(evidence) => Outcome::Escaped(evidence),
        None => classify(&report.status, &output),
    };
    let expected = outcome.is_one_of(expect);
    let evidence = match &outcome {
        Outcome::Escaped(e) => e.clone(),
        Outcome::Killed => format!("{:?}", report.status),
        _ => attempts(&output),
    };
    Ok(Cell { outcome, evidence, expected })
}

/// The wasm column: the attack's variant in `attacks.wasm` (copied into the read-only
/// workspace), run by the wasm tier with the same targets and the same world checks.
fn run_wasm(world: &mut World, tier: &stockade_wasm::WasmTier, bin_dir: &Path, entry: &Entry) -> Result<Cell> {
    if let Some(cell) = not_applicable(entry.expect.wasm) {
        return Ok(cell);
    }
    if entry.setup == Setup::WasmInitializer {
        return run_wasm_initializer(world, tier, bin_dir, entry);
    }
    let targets = world.targets(entry.name);
    let mut args = vec![entry.name.to_owned()];
    args.extend(targets.args.iter().cloned());
    let job = Job::wasm(bin_dir.join(WASM_ATTACKS), "_start", args)?
        .with_workspace(bin_dir, Access::ReadOnly)?
        .with_limits(limits());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let report = if entry.setup == Setup::Grants {
        let paths = GrantPaths::new(world, entry.name)?;
        let sandbox = stockade_runtime::Sandbox::builder().tier(tier.clone()).build()?;
        let report = match rt.block_on(granted(entry.name, &paths, &sandbox, &job, None, None)) {
            Ok(r) => r,
            Err(e) => return Ok(skipped(&e)),
        };
        if report.status == (Status::Exited { code: 2 }) {
            bail!("{}: attacks.wasm has no variant of it: {}", entry.name, attempts(&output(&report)));
        }
        return judge_granted(world, &report, &targets.marker, &paths, None, entry.expect.wasm, entry.name);
    } else {
        match rt.block_on(tier.run(&job)) {
            Ok(r) => r,
            Err(e) => return Ok(skipped(&e)),
        }
    };
    if report.status == (Status::Exited { code: 2 }) {
        bail!("{}: attacks.wasm has no variant of it: {}", entry.name, attempts(&output(&report)));
    }
    judge(world, &report, &targets.marker, || bin_changed(bin_dir, WASM_ATTACKS), entry.expect.wasm, entry.name)
}

const WASM_ATTACKS: &str = "attacks.wasm";
/// The pre-initializer attack module, built beside [`WASM_ATTACKS`].
const WASM_PREINIT: &str = "preinit.wasm";

/// How long past its deadline a run may take to come back: the tier's own grace.
const RETURN_GRACE: Duration = Duration::from_secs(4);

/// The largest artifact the wasm tier's compiled-module cache may hold (its cap).
const CACHE_CAP: u64 = 64 << 20;

/// The pre-initializer row ([`Setup::WasmInitializer`]): the module's `wizer-initialize`
/// grows memory until refused and then sleeps 30 s. Judged on the host: the run must come
/// back within its deadline (plus the tier's grace), and the cache must hold no artifact
/// over its cap; the report must say the run was stopped.
fn run_wasm_initializer(
    world: &mut World,
    tier: &stockade_wasm::WasmTier,
    bin_dir: &Path,
    entry: &Entry,
) -> Result<Cell> {
    let targets = world.targets(entry.name);
    let module = bin_dir.join(WASM_PREINIT);
    if !module.is_file() {
        return Ok(skipped(&format!(
            "no {WASM_PREINIT} beside the --wasm-attacks module (cargo xtask escape builds it)"
        )));
    }
    let job = Job::wasm(&module, "_start", Vec::<String>::new())?.with_limits(limits());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let start = Instant::now();
    let report = match rt.block_on(tier.run(&job)) {
        Ok(r) => r,
        Err(e) => return Ok(skipped(&e)),
    };
    let took = start.elapsed();
    let largest = std::fs::read_dir(world.root.join("wasm-cache"))
        .map(|d| d.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).max().unwrap_or(0))
        .unwrap_or(0);
    let output = output(&report);
    let escaped = world
        .check(&output, &targets.marker)
        .or_else(|| {
            (took > limits().wall() + RETURN_GRACE)
                .then(|| format!("the initializer ran {took:?}, past the job's {:?} deadline", limits().wall()))
        })
        .or_else(|| (largest > CACHE_CAP).then(|| format!("the module cache holds a {largest}-byte artifact")));
    let outcome = match (escaped, &report.status) {
        (Some(evidence), _) => Outcome::Escaped(evidence),
        (None, Status::FailedToStart { reason })
            if ["deadline", "memory", "fuel"].iter().any(|bound| reason.contains(bound)) =>
        {
            Outcome::Killed
        }
        (None, status) => bail!("{}: the initializer was not stopped: {status:?}", entry.name),
    };
    let expected = outcome.is_one_of(entry.expect.wasm);
    let evidence = match &outcome {
        Outcome::Escaped(e) => e.clone(),
        _ => format!("{:?} after {:.1} s; largest cache artifact {largest} bytes", report.status, took.as_secs_f64()),
    };
    Ok(Cell { outcome, evidence, expected })
}

fn run_bwrap(world: &mut World, bin_dir: &Path, entry: &Entry) -> Result<Cell> {
    if let Comparison::Skip(why) = entry.comparison {
        return Ok(Cell { outcome: Outcome::NotApplicable(why), evidence: why.into(), expected: true });
    }
    let targets = world.targets(entry.name);
    let bin = bin_dir.to_string_lossy().into_owned();
    // bwrap as the unprivileged user it is meant for: as root it keeps host privileges,
    // and the attacks would then reach the host for real.
    let mut cmd = Command::new("setpriv");
    cmd.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--",
        "bwrap",
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--ro-bind",
        "/usr",
        "/usr",
    ])
    .args(["--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/bin", "/bin"])
    .args(["--ro-bind", "/etc", "/etc", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--clearenv"])
    .args(["--ro-bind", &bin, "/workspace", &format!("/workspace/{}", entry.name)])
    .args(&targets.args)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::null());
    run_comparison(world, bin_dir, entry, &targets.marker, cmd, Duration::from_secs(6), || {})
}

/// Runs one attack under a comparison wrapper: drains its output, kills it at `deadline`
/// (calling `cleanup` then and after every run), and judges from the world.
fn run_comparison(
    world: &mut World,
    bin_dir: &Path,
    entry: &Entry,
    marker: &str,
    mut cmd: Command,
    deadline: Duration,
    cleanup: impl Fn(),
) -> Result<Cell> {
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn()?;
    let mut out = child.stdout.take().context("wrapper stdout")?;
    let reader = std::thread::spawn(move || drain_capped(&mut out));
    let start = Instant::now();
    let mut killed = false;
    while child.try_wait()?.is_none() {
        if start.elapsed() > deadline {
            cleanup();
            let _ = child.kill();
            killed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let status = child.wait()?;
    cleanup();
    let output = reader.join().unwrap_or_default();
    let outcome = match world.check(&output, marker).or_else(|| bin_changed(bin_dir, entry.name)) {
        Some(e) => Outcome::Escaped(e),
        None if killed || status.code().is_some_and(|c| c >= 128) => Outcome::Killed,
        None => classify(&Status::Exited { code: 0 }, &output),
    };
    let evidence = match &outcome {
        Outcome::Escaped(e) => e.clone(),
        _ => attempts(&output),
    };
    Ok(Cell { outcome, evidence, expected: true })
}

/// Keeps the first 64 KiB of a stream and discards the rest, reading to the end so that the
/// writer never blocks on a full pipe.
fn drain_capped(r: &mut impl Read) -> Vec<u8> {
    let mut kept = Vec::new();
    let mut buf = [0u8; 8192];
    while let Ok(n @ 1..) = r.read(&mut buf) {
        let room = (64usize << 10).saturating_sub(kept.len());
        kept.extend_from_slice(&buf[..n.min(room)]);
    }
    kept
}

/// The read-only attack binaries must be intact, and no core file may appear beside them.
fn bin_changed(bin_dir: &Path, name: &str) -> Option<String> {
    let len = std::fs::metadata(bin_dir.join(name)).map(|m| m.len()).unwrap_or(0);
    let original = std::fs::metadata(bin_dir.join(format!("{name}.len")))
        .ok()
        .and(std::fs::read_to_string(bin_dir.join(format!("{name}.len"))).ok());
    if original.is_some_and(|o| o.trim() != len.to_string()) {
        return Some(format!("the read-only program {name} was modified"));
    }
    let cores = std::fs::read_dir(bin_dir)
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().starts_with("core"));
    cores.then(|| "a core file appeared on the host".to_owned())
}

const DOCKER_IMAGE: &str = "stockade-attacks:local";
/// The docker tier's container user (its default `Hardening`).
const DOCKER_UID: u32 = 65534;

/// Imports the static attack programs as a `FROM scratch`-style image (no registry needed).
/// Returns why the docker column must be skipped, if it must.
fn docker_image(bin_dir: &Path) -> Option<String> {
    match Command::new("docker").args(["version", "--format", "{{.Server.Version}}"]).output() {
        Ok(o) if o.status.success() => {}
        Ok(o) => return Some(format!("no Docker engine: {}", String::from_utf8_lossy(&o.stderr).trim())),
        Err(e) => return Some(format!("no docker client: {e}")),
    }
    let names: Vec<&str> = ATTACKS.iter().map(|e| e.name).collect();
    let tar = Command::new("tar")
        .arg("-C")
        .arg(bin_dir)
        .args(["--owner=0", "--group=0", "-cf", "-"])
        .args(&names)
        .stdout(Stdio::piped())
        .spawn();
    let Ok(mut tar) = tar else { return Some("tar is missing".into()) };
    let previous = image_id(DOCKER_IMAGE);
    let Some(stdout) = tar.stdout.take() else { return Some("tar has no stdout".into()) };
    let imported =
        Command::new("docker").args(["import", "-", DOCKER_IMAGE]).stdin(stdout).stdout(Stdio::null()).status();
    let _ = tar.wait();
    match imported {
        Ok(s) if s.success() => {
            // The re-import left the previous image untagged: remove it (by its id, which
            // this harness created), so repeated runs do not pile up dangling images.
            if let Some(old) = previous.filter(|old| image_id(DOCKER_IMAGE).as_ref() != Some(old)) {
                let _ = Command::new("docker").args(["rmi", &old]).stdout(Stdio::null()).stderr(Stdio::null()).status();
            }
            None
        }
        other => Some(format!("docker import failed: {other:?}")),
    }
}

/// The docker tier's column: the attack program from the attack image, run by
/// `stockade-docker` with every default, judged from the world like the other tiers.
fn run_docker_tier(
    world: &mut World,
    rt: &tokio::runtime::Runtime,
    tier: &stockade_docker::DockerTier,
    bin_dir: &Path,
    entry: &Entry,
) -> Result<Cell> {
    if let Some(cell) = not_applicable(entry.expect.docker) {
        return Ok(cell);
    }
    let targets = world.targets(entry.name);
    let mut command = vec![format!("/{}", entry.name)];
    command.extend(targets.args.iter().cloned());
    if entry.setup == Setup::Grants {
        let paths = GrantPaths::new(world, entry.name)?;
        command.push(paths.arg());
        let job = Job::image(DOCKER_IMAGE, command)?.with_limits(limits());
        let victim_job =
            Job::image(DOCKER_IMAGE, [format!("/{}", entry.name), "role=victim".into()])?.with_limits(limits());
        let attacker = stockade_runtime::Sandbox::builder().tier(tier.clone()).build()?;
        let victim =
            stockade_runtime::Sandbox::builder().tier(tier.clone()).grants_dir(&paths.victim_parent).build()?;
        let upstream = stockade_escape::grants::upstream()?;
        let url = upstream.url();
        let report =
            match rt.block_on(granted(entry.name, &paths, &attacker, &job, Some((&victim, victim_job)), Some(&url))) {
                Ok(r) => r,
                Err(e) => return Ok(skipped(&e)),
            };
        return judge_granted(
            world,
            &report,
            &targets.marker,
            &paths,
            Some(&upstream),
            entry.expect.docker,
            entry.name,
        );
    }
    if entry.setup == Setup::Net {
        let (args, policy, resolve) = net_setup(world, entry.name, &targets)?;
        let mut command = vec![format!("/{}", entry.name)];
        command.extend(args);
        let job = Job::image(DOCKER_IMAGE, command)?.with_limits(limits());
        let net = stockade_escape::net::grant(&std::fs::read_to_string(&policy)?, &resolve)?;
        let grants = std::sync::Arc::new(stockade_runtime::Grants::new().net(net));
        let sandbox = stockade_runtime::Sandbox::builder().tier(tier.clone()).build()?;
        let report = match rt.block_on(sandbox.report(stockade_runtime::RunRequest::new(&job).grants(grants))) {
            Ok(r) => r,
            Err(e) => return Ok(skipped(&e)),
        };
        let verdict = net_world()?.judge(&report).with_context(|| entry.name.to_owned())?;
        return judge(
            world,
            &report,
            &targets.marker,
            || verdict.or_else(|| bin_changed(bin_dir, entry.name)),
            entry.expect.docker,
            entry.name,
        );
    }
    let mut job = Job::image(DOCKER_IMAGE, command)?.with_limits(limits());
    // Attacks on a read-write workspace get the same one the process column gets, owned by
    // the container's user (65534), with protected paths in it.
    let rw = (entry.setup == Setup::RwWorkspace)
        .then(|| rw_workspace(world, bin_dir, entry.name, Some(DOCKER_UID)))
        .transpose()?;
    if let Some(ws) = &rw {
        job = job.with_workspace(ws, Access::ReadWrite)?;
    }
    let report = match rt.block_on(tier.run(&job)) {
        Ok(r) => r,
        Err(e) => return Ok(skipped(&e)),
    };
    let host_changed = || bin_changed(bin_dir, entry.name).or_else(|| rw.as_deref().and_then(rw_workspace_changed));
    judge(world, &report, &targets.marker, host_changed, entry.expect.docker, entry.name)
}

/// The id of the local image `name`, if it exists.
fn image_id(name: &str) -> Option<String> {
    let out = Command::new("docker").args(["image", "inspect", "-f", "{{.Id}}", name]).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn run_docker(world: &mut World, bin_dir: &Path, entry: &Entry) -> Result<Cell> {
    if let Comparison::Skip(why) = entry.comparison {
        return Ok(Cell { outcome: Outcome::NotApplicable(why), evidence: why.into(), expected: true });
    }
    let targets = world.targets(entry.name);
    let name = format!("stockade-escape-{}-{}", std::process::id(), entry.name.replace('_', "-"));
    let mut cmd = Command::new("docker");
    cmd.args(["run", "--rm", "--name", &name, DOCKER_IMAGE, &format!("/{}", entry.name)]).args(&targets.args);
    // Whatever happens, no container of this run may outlive it.
    let remove = || {
        let _ = Command::new("docker").args(["rm", "-f", &name]).stdout(Stdio::null()).stderr(Stdio::null()).status();
    };
    run_comparison(world, bin_dir, entry, &targets.marker, cmd, Duration::from_secs(8), remove)
}

fn bwrap_available() -> Option<String> {
    match Command::new("bwrap").arg("--version").output() {
        Ok(o) if o.status.success() => None,
        _ => Some("bwrap is not installed (Debian package bubblewrap)".into()),
    }
}

fn run() -> Result<bool> {
    let args = parse()?;
    let secret = std::env::var(SECRET_VAR).unwrap_or_default();
    let mut world = World::new(&secret)?;
    // The attack binaries must be readable by the sandbox's uid: copy them under /tmp.
    let bin_dir = world.root.join("bin");
    std::fs::create_dir_all(&bin_dir)?;
    for e in ATTACKS {
        let src = args.attacks.join(e.name);
        let len = std::fs::copy(&src, bin_dir.join(e.name)).with_context(|| format!("copying {}", src.display()))?;
        std::fs::write(bin_dir.join(format!("{}.len", e.name)), len.to_string())?;
    }
    let wasm_attacks = match &args.wasm_attacks {
        Some(src) => {
            let len =
                std::fs::copy(src, bin_dir.join(WASM_ATTACKS)).with_context(|| format!("copying {}", src.display()))?;
            std::fs::write(bin_dir.join(format!("{WASM_ATTACKS}.len")), len.to_string())?;
            // The pre-initializer module, if built beside it.
            if let Some(preinit) = src.parent().map(|d| d.join(WASM_PREINIT)).filter(|p| p.is_file()) {
                std::fs::copy(&preinit, bin_dir.join(WASM_PREINIT))
                    .with_context(|| format!("copying {}", preinit.display()))?;
            }
            true
        }
        None => false,
    };
    let mut wasm_tier = None;
    let docker_rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    let mut docker_tier = None;
    let mut docker_imported: Option<Option<String>> = None;
    let selected: Vec<&Entry> = ATTACKS.iter().filter(|e| args.only.as_deref().is_none_or(|n| n == e.name)).collect();
    if selected.is_empty() {
        bail!("no attack named {:?}", args.only);
    }
    let mut columns: Vec<(String, Option<String>)> = Vec::new();
    for t in &args.tiers {
        let skip = match t.as_str() {
            "process" | "process-fork" | "process-pool" | "process-session" => {
                let p = stockade_process::probe();
                p.user_namespaces
                    .clone()
                    .err()
                    .or_else(|| (p.landlock_abi < 6).then(|| format!("landlock abi {}", p.landlock_abi)))
            }
            "wasm" if !wasm_attacks => Some("no --wasm-attacks module (cargo xtask escape builds it)".into()),
            "wasm" => match stockade_wasm::WasmTier::builder().cache_dir(world.root.join("wasm-cache")).build() {
                Ok(t) => {
                    wasm_tier = Some(t);
                    None
                }
                Err(e) => Some(e.to_string()),
            },
            "bwrap" => bwrap_available(),
            "docker-run" => docker_imported.get_or_insert_with(|| docker_image(&bin_dir)).clone(),
            "docker" => match docker_imported.get_or_insert_with(|| docker_image(&bin_dir)).clone() {
                Some(why) => Some(why),
                None => match docker_rt.block_on(stockade_docker::DockerTier::connect()) {
                    Ok(t) => {
                        docker_tier = Some(t);
                        None
                    }
                    Err(e) => Some(e.to_string()),
                },
            },
            other => Some(format!("tier {other} is not built yet")),
        };
        columns.push((t.clone(), skip));
    }
    let mut rows = Vec::new();
    for e in &selected {
        let mut cells = Vec::new();
        for (tier, skip) in &columns {
            let cell = match (tier.as_str(), skip) {
                (_, Some(why)) => {
                    Cell { outcome: Outcome::Skipped(why.clone()), evidence: why.clone(), expected: true }
                }
                ("process", None) => run_process(&mut world, &bin_dir, e, Launch::Server)?,
                ("process-fork", None) => run_process(&mut world, &bin_dir, e, Launch::Direct)?,
                ("process-pool", None) => run_process(&mut world, &bin_dir, e, Launch::Pool)?,
                ("process-session", None) => run_process(&mut world, &bin_dir, e, Launch::Session)?,
                ("wasm", None) => match &wasm_tier {
                    Some(t) => run_wasm(&mut world, t, &bin_dir, e)?,
                    None => unreachable!("the wasm column has a tier when it is not skipped"),
                },
                ("docker", None) => match &docker_tier {
                    Some(t) => run_docker_tier(&mut world, &docker_rt, t, &bin_dir, e)?,
                    None => unreachable!("the docker column has a tier when it is not skipped"),
                },
                ("bwrap", None) => run_bwrap(&mut world, &bin_dir, e)?,
                ("docker-run", None) => run_docker(&mut world, &bin_dir, e)?,
                _ => unreachable!("every column was classified above"),
            };
            eprintln!("{:<24} {:<8} {:<10} {}", e.name, tier, cell.outcome.label(), cell.evidence);
            cells.push(cell);
        }
        rows.push((e.name, cells));
    }
    // Verdict: every stockade tier must be as expected; comparison columns are informational.
    let mut ok = true;
    for (name, cells) in &rows {
        for ((tier, _), cell) in columns.iter().zip(cells) {
            if STOCKADE_TIERS.contains(&tier.as_str()) && !cell.expected {
                eprintln!("UNEXPECTED: {name} in {tier}: {} ({})", cell.outcome.label(), cell.evidence);
                ok = false;
            }
        }
    }
    for (tier, skip) in &columns {
        if let Some(why) = skip {
            eprintln!("SKIPPED tier {tier}: {why}");
            if args.require.contains(tier) {
                eprintln!("tier {tier} is required (--require)");
                ok = false;
            }
        }
    }
    let table = markdown(&columns, &rows);
    if args.json {
        let v: Vec<_> = rows
            .iter()
            .map(|(name, cells)| {
                let c: serde_json::Map<String, serde_json::Value> = columns
                    .iter()
                    .zip(cells)
                    .map(|((t, _), c)| (t.clone(), serde_json::json!({"outcome": c.outcome.label(), "evidence": c.evidence, "expected": c.expected})))
                    .collect();
                serde_json::json!({"attack": name, "tiers": c})
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!("{table}");
    }
    if let Some(path) = &args.markdown {
        std::fs::write(path, markdown_doc(&table))?;
    }
    Ok(ok)
}

fn markdown(columns: &[(String, Option<String>)], rows: &[(&str, Vec<Cell>)]) -> String {
    let mut s = String::from("| attack |");
    for (t, _) in columns {
        // Comparison columns are marked so that CI's freshness check can leave them out:
        // they depend on what this host has installed.
        let shown = if STOCKADE_TIERS.contains(&t.as_str()) { t.clone() } else { format!("{t} (comparison)") };
        s.push_str(&format!(" {shown} |"));
    }
    s.push_str("\n|---|");
    for _ in columns {
        s.push_str("---|");
    }
    s.push('\n');
    for (name, cells) in rows {
        s.push_str(&format!("| `{name}` |"));
        for c in cells {
            let ev = c.evidence.replace('|', "/");
            s.push_str(&format!(" **{}**: {ev} |", c.outcome.label()));
        }
        s.push('\n');
    }
    s
}

fn markdown_doc(table: &str) -> String {
    format!(
        "# Escape matrix\n\n\
Generated by `cargo xtask escape --markdown`; CI checks that it is current.\n\
Each row is one attack program in `tests/attacks/src/bin`; each column a tier. The `wasm` column runs the attack's variant in `tests/attacks/wasm/attacks.c` (WASI, built with clang for wasm32-wasi); n/a there names what WASI lacks. The `docker` column is stockade's docker tier (every default of `stockade-docker`) running the same static programs from an imported image (the protected-path rows with the same read-write workspace the process column gets, bind-mounted); the `process` column runs each attack from a fresh process whose fork server, started first in its `main` and handed over to its one run as in `stockade run` (`ForkServer::hand_over_next`), is the run's helper, `process-fork` from a fresh single-threaded process that forks its helper itself, and `process-pool` in a sandbox of `ProcessTier::pool` (whose helpers the fork server clones, as it does a session's and every run of a multi-threaded program's) built and confined for the attack's workspace before the attack's job was made, then handed the job (the grants rows run one-shot there: a pool does not serve granted runs), and `process-session` as the second exec of a live session (`ProcessTier::session`) whose first exec prepared the ground: a daemon and a copy of the attack left running, a script and start-up files in the session's home, files in `/tmp` and `/dev/shm`, an abstract socket listening, and tries at the session's init, environment and `/etc` (the grants and network rows are n/a there: the column drives the session without a broker; a session's grants are the run's broker, pinned by the CLI's tests); `docker-run` is plain `docker run` for comparison.\n\
Verdicts come from the host's own checks (canary files and environment values, listeners on 127.0.0.1, a docker.sock stand-in, an abstract socket, a host process, kernel knobs, surviving processes), never from the attack's report.\n\
The `fs_race_workspace_swap` row is two runs at once: the attack holds a read-write workspace and swaps a directory in it with a symlink to the world's home (`renameat2(RENAME_EXCHANGE)`), while the harness starts, every 30 ms, runs granted that directory read-only that print the home's canaries if they are given the home; each either waits for the attack's run and reads the directory itself, or is refused as it starts (its path met the symlink).\n\
The `wasm_preinit_bomb` row is a module, not a program (`tests/attacks/wasm/preinit.c`): its `wizer-initialize` export, which the wasm tier runs as it loads the module, grows memory until refused and then sleeps in the host; the host checks that the run came back within its deadline and that the module cache holds no artifact over its 64 MiB cap.\n\
The `net_*` rows run with a network grant (stockade-egress's proxy on the run's loopback): its policy allows one name, `allowed.test`, on one port, pointed with `--net-resolve` at an upstream the harness runs on 127.0.0.2, and, carelessly on purpose, any host on the port of the world's listener on the host's 127.0.0.1; each attack first makes one allowed request, which the upstream must have seen. Judged on the host: the upstream must never receive a byte of what the proxy must refuse (every such attempt carries the word `forbidden`), a listener and a stand-in resolver on 127.0.0.3 that no rule allows must see nothing, the world's listener must stay untouched, and no name a rule does not allow may appear in the report's connections with an address.\n\
The evidence column lists the attack's own attempt results, for reading only.\n\n\
- **Denied**: every attempt failed and the world is unchanged.\n\
- **Contained**: something worked, but only inside the sandbox.\n\
- **Killed**: a limit ended the run.\n\
- **ESCAPED**: the host saw a change; in a stockade column this fails the run.\n\
- **n/a**: not run there (the `bwrap` and `docker-run` columns are comparisons, never failing the run: `bwrap --unshare-all` run as `nobody`, and `docker run` with its default flags on an image of the same static programs; neither sets limits, so the bombs are not run under them).\n\n\
{table}"
    )
}
