//! `cargo xtask bench [protocol|verify|policy|process|wasm|net|session|docker|agent|grants|mcp|serve|confined|bindings|all] [--write]`: runs the criterion benches and prints
//! each measurement as a ratio to the bare baseline of its group, measured in the same run.
//! `--write` puts the table into docs/benchmarks.md between the group's markers.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// (xtask group, package, bench target, features, criterion groups).
const GROUPS: &[(&str, &str, &str, &str, &[&str])] = &[
    ("protocol", "stockade-protocol", "protocol", "", &["capture_1gib", "frames_1kib"]),
    ("verify", "stockade-verify", "verify", "", &["verify_small_json"]),
    ("policy", "stockade-policy", "authorize", "", &["authorize_100_rules"]),
    ("wasm", "stockade-wasm", "wasm", "", &["wasm_in_process"]),
    ("net", "stockade-egress", "net", "", &["net_download_100mib", "net_connect", "net_decide", "net_relay_ceiling"]),
    ("agent", "stockade-agent", "agent", "wasm", &["agent_loop_per_call", "agent_run_code_wasm", "agent_model_proxy"]),
    ("session", "stockade-process", "session", "", &["session_create", "session_exec_true", "session_files_1mib"]),
    (
        "grants",
        "stockade-runtime",
        "grants",
        "wasm",
        &["grants_socket_round_trip", "grants_in_process", "grants_wasm_js", "grants_mcp"],
    ),
];

pub(crate) fn run(root: &Path, target: &Path, args: &[String]) -> Result<()> {
    let write = args.iter().any(|a| a == "--write");
    let wanted: Vec<&str> = args.iter().map(String::as_str).filter(|a| !a.starts_with("--")).collect();
    if wanted.iter().any(|w| *w == "process" || *w == "all") {
        process(root, target, write)?;
        if wanted == ["process"] {
            return Ok(());
        }
    }
    if wanted.iter().any(|w| *w == "mcp" || *w == "all") {
        mcp(root, target, write)?;
        if wanted == ["mcp"] {
            return Ok(());
        }
    }
    if wanted.iter().any(|w| *w == "serve" || *w == "all") {
        serve(root, target, write)?;
        if wanted == ["serve"] {
            return Ok(());
        }
    }
    if wanted.iter().any(|w| *w == "confined" || *w == "all") {
        confined(root, target, write)?;
        if wanted == ["confined"] {
            return Ok(());
        }
    }
    if wanted.iter().any(|w| *w == "bindings" || *w == "all") {
        bindings(root, target, write)?;
        if wanted == ["bindings"] {
            return Ok(());
        }
    }
    if wanted.iter().any(|w| *w == "deploy" || *w == "all") {
        let table = crate::deploy::bench(root, target)?;
        println!("\n{table}");
        if write {
            write_docs(root, "deploy", &table)?;
        }
        if wanted == ["deploy"] {
            return Ok(());
        }
    }
    if wanted.iter().any(|w| *w == "docker" || *w == "all") {
        docker(root, target, write)?;
        if wanted == ["docker"] {
            return Ok(());
        }
    }
    let selected: Vec<_> =
        GROUPS.iter().filter(|(g, ..)| wanted.is_empty() || wanted.contains(&"all") || wanted.contains(g)).collect();
    if selected.is_empty() {
        bail!(
            "unknown bench group {wanted:?}; groups: protocol, verify, policy, process, wasm, net, session, docker, agent, grants, mcp, serve, confined, bindings, deploy, all"
        );
    }
    for (group, package, bench, features, criterion_groups) in selected {
        // Stale results of benchmarks that no longer exist must not reach the table.
        for g in *criterion_groups {
            let dir = target.join("criterion").join(g);
            if dir.exists() {
                fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
            }
        }
        if *group == "agent" || *group == "grants" {
            crate::run(&mut crate::guests_command())?;
        }
        if *group == "session" {
            // The baselines' container image (`docker run -d`, `docker exec`).
            if let Err(e) = crate::images::run(target) {
                println!("bench session: no image for the docker baselines ({e:#}); they are skipped");
            }
        }
        let memory = target.join("bench-session-memory.txt");
        let _ = fs::remove_file(&memory);
        crate::run(
            crate::cargo(&["bench", "--package", package, "--bench", bench, "--features", features])
                .env("STOCKADE_BENCH_MEMORY_OUT", &memory),
        )?;
        let mut table = table(&target.join("criterion"), criterion_groups)?;
        if let Ok(extra) = fs::read_to_string(&memory) {
            table.push_str(&extra);
        }
        println!("\n{table}");
        if write {
            write_docs(root, group, &table)?;
        }
        if *group == "wasm" {
            wasm_process(root, target, write)?;
        }
    }
    Ok(())
}

/// The bindings' cost over the same calls from Rust (issue 57: at most 10% plus 20 µs): a
/// wasm `run_code` of `console.log(1)` and one `authorize`, 200 of each (after 20 unmeasured)
/// from the Rust core (a release example), the release wheel and the release addon, taking
/// turns for five rounds in one run; and Node's `runCodeSync`, and its own Promise floor.
fn bindings(root: &Path, target: &Path, write: bool) -> Result<()> {
    crate::run(&mut crate::guests_command())?;
    crate::run(&mut crate::cargo(&["build", "--release", "--package", "stockade-bindings", "--example", "bench"]))?;
    let (python, addon) = crate::bindings::release(root, target)?;
    let measure = |cmd: &mut std::process::Command| -> Result<Value> {
        let out = cmd.arg("200").output()?;
        if !out.status.success() {
            bail!("a bindings bench failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(serde_json::from_slice(&out.stdout)?)
    };
    // The three alternate, ROUNDS times, and each figure is the median of its rounds' p50s:
    // this machine drifts by tens of µs between one process and the next.
    const ROUNDS: usize = 5;
    let mut rounds: [Vec<Value>; 3] = Default::default();
    for _ in 0..ROUNDS {
        rounds[0].push(measure(&mut std::process::Command::new(target.join("release/examples/bench")))?);
        rounds[1].push(measure(
            std::process::Command::new(&python).arg(root.join("bindings/stockade-python/benches/bench.py")),
        )?);
        rounds[2].push(measure(
            std::process::Command::new("node")
                .arg(root.join("bindings/stockade-node/bench/bench.js"))
                .env("STOCKADE_NODE_ADDON", &addon),
        )?);
    }
    let [rust, py, node] = &rounds;
    let p50 = |data: &Vec<Value>, key: &str| {
        median_of(data.iter().filter_map(|d| median(d, key)).collect())
            .with_context(|| format!("no {key} samples in a bench's output"))
    };
    let mut table = String::from(
        "| call | Rust (the core) p50 | Python p50 | Node p50 | Python over Rust | Node over Rust | within 10% + 20 µs |\n|---|---|---|---|---|---|---|\n",
    );
    let (run, authorize) = (p50(rust, "run_us")?, p50(rust, "authorize_us")?);
    let ok = |r: f64, x: f64| if x <= r * 1.1 + 20.0 { "yes" } else { "no" };
    for (name, r, p, n) in [
        (
            "wasm `run_code` / `runCode` (a Promise) of `console.log(1)`",
            run,
            Some(p50(py, "run_us")?),
            p50(node, "run_us")?,
        ),
        ("wasm `runCodeSync` of `console.log(1)`", run, None, p50(node, "sync_run_us")?),
        ("`authorize` (one rule)", authorize, Some(p50(py, "authorize_us")?), p50(node, "authorize_us")?),
    ] {
        let (p_cell, p_over, p_ok) = match p {
            Some(p) => (format!("{p:.1} µs"), format!("{:+.1} µs ({:.2}x)", p - r, p / r), ok(r, p)),
            None => ("(Python's runs are synchronous: the row above)".to_owned(), "-".to_owned(), "-"),
        };
        let _ = writeln!(
            table,
            "| {name} | {r:.1} µs | {p_cell} | {n:.1} µs | {p_over} | {:+.1} µs ({:.2}x) | {p_ok} / {} |",
            n - r,
            n / r,
            ok(r, n)
        );
    }
    let (floor, floor_sync) = (p50(node, "floor_us")?, p50(node, "floor_sync_us")?);
    let _ = writeln!(
        table,
        "\nNode's own floor for a native call settled as a Promise, in the same run: `await fs.promises.access('/')` {floor:.1} µs against `fs.accessSync('/')` {floor_sync:.1} µs, so +{:.1} µs for the thread round trip alone.",
        floor - floor_sync
    );
    println!("\n{table}");
    if write {
        write_docs(root, "bindings", &table)?;
    }
    Ok(())
}

/// `run_code` javascript through the official MCP Python client against `stockade mcp`,
/// next to the same code through `stockade run --tier wasm --js` (hyperfine), in one run.
fn mcp(root: &Path, target: &Path, write: bool) -> Result<()> {
    apt_install(&[("hyperfine", "hyperfine")])?;
    crate::run(&mut crate::guests_command())?;
    crate::run(&mut crate::cargo(&["build", "--release", "--package", "stockade-cli"]))?;
    let python = crate::llm::install_mcp_client()?;
    let stockade = target.join("release/stockade");
    let stockade = stockade.to_str().context("target path is not UTF-8")?;
    let script = root.join("crates/stockade-cli/benches/mcp_client_bench.py");
    let out = std::process::Command::new(&python).arg(&script).arg(stockade).arg("500").output()?;
    if !out.status.success() {
        bail!("the MCP bench client failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let data: Value = serde_json::from_slice(&out.stdout)?;
    let p50 = |key: &str| median(&data, key).with_context(|| format!("no {key} samples in the bench's output"));
    let overhead: Vec<f64> = {
        let (c, w) = (data["call_us"].as_array().context("calls")?, data["wall_us"].as_array().context("walls")?);
        let mut o: Vec<f64> = c.iter().zip(w).filter_map(|(c, w)| Some(c.as_f64()? - w.as_f64()?)).collect();
        o.sort_by(f64::total_cmp);
        o
    };
    let json = target.join("bench-mcp.json");
    let mut cmd = std::process::Command::new("hyperfine");
    cmd.args(["-N", "--warmup", "10", "--runs", "100", "--export-json"]).arg(&json);
    cmd.args(["-n", "stockade run", &format!("{stockade} run --tier wasm --js console.log(1+2)")]);
    let run_ms = hyperfine(&mut cmd, &json)?["stockade run"];
    let (call, wall) = (p50("call_us")? / 1e3, p50("wall_us")? / 1e3);
    let over = overhead[overhead.len() / 2] / 1e3;
    let mut table = String::from("| path | p50 | note |\n|---|---|---|\n");
    let _ = writeln!(
        table,
        "| `stockade run --tier wasm --js` (hyperfine) | {run_ms:.2} ms | a fresh process per run: start, guest load from the cache, run |"
    );
    let _ = writeln!(
        table,
        "| `run_code` through the MCP Python client | {call:.2} ms | one long-lived `stockade mcp`; timed by the client, 500 calls |"
    );
    let _ = writeln!(
        table,
        "| the same runs' own wall time, as the server measured it | {wall:.2} ms | `structuredContent.wall_us` |"
    );
    let _ = writeln!(
        table,
        "| MCP overhead per call (client time minus run wall, p50) | {over:.2} ms | JSON-RPC over stdio, the SDK's validation, scheduling |"
    );
    let _ = writeln!(table, "| MCP call against `stockade run` | {:.2}x | |", run_ms / call);
    println!("\n{table}");
    if write {
        write_docs(root, "mcp", &table)?;
    }
    Ok(())
}

/// One turn of `stockade agent --confine process` and `--confine docker` next to the same
/// turn unconfined, all against the scripted endpoint (`stockade-mock-llm`, one answer per
/// request, no tool call), and `docker run --rm IMAGE true` for scale, with hyperfine, in one
/// run.
fn confined(root: &Path, target: &Path, write: bool) -> Result<()> {
    apt_install(&[("hyperfine", "hyperfine")])?;
    crate::run(&mut crate::cargo(&["xtask", "images"]))?;
    crate::run(&mut crate::cargo(&[
        "build",
        "--release",
        "--package",
        "stockade-cli",
        "--package",
        "stockade-test-support",
        "--bin",
        "stockade",
        "--bin",
        "stockade-mock-llm",
    ]))?;
    let (warmup, runs) = (3, 30);
    let answer = serde_json::json!({
        "id": "bench", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "done"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}
    });
    let dir = target.join("bench-confined");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)?;
    let script = dir.join("script.json");
    fs::write(&script, serde_json::to_vec(&vec![answer; 3 * (warmup + runs) + 8])?)?;
    let policy = dir.join("policy.toml");
    fs::write(&policy, "version = 1\ndefault = \"deny\"\n")?;
    let mut mock = std::process::Command::new(target.join("release/stockade-mock-llm"))
        .arg(&script)
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let url = {
        use std::io::BufRead as _;
        let stdout = mock.stdout.take().context("the mock's stdout")?;
        let mut line = String::new();
        std::io::BufReader::new(stdout).read_line(&mut line)?;
        line.trim().to_owned()
    };
    let stockade = target.join("release/stockade");
    let stockade = stockade.to_str().context("target path is not UTF-8")?;
    let policy = policy.to_str().context("target path is not UTF-8")?;
    let agent = format!("{stockade} agent --base-url {url} --model m --policy {policy} --quiet hi");
    let json = dir.join("hyperfine.json");
    let mut cmd = std::process::Command::new("hyperfine");
    cmd.args(["-N", "--warmup", &warmup.to_string(), "--runs", &runs.to_string(), "--export-json"]).arg(&json);
    cmd.args(["-n", "unconfined", &agent]);
    cmd.args(["-n", "confined", &agent.replace(" agent ", " agent --confine process ")]);
    cmd.args(["-n", "confined-docker", &agent.replace(" agent ", " agent --confine docker ")]);
    let image = crate::images::BUSYBOX_IMAGE;
    cmd.args(["-n", "docker-run", &format!("docker run --rm --network none {image} true")]);
    let result = hyperfine(&mut cmd, &json);
    // Ended by its pid: the mock is this process's child.
    let _ = mock.kill();
    let _ = mock.wait();
    let ms = result?;
    let plain = ms["unconfined"];
    let mut table = String::from("| what | p50 | against the unconfined turn |\n|---|---|---|\n");
    let _ = writeln!(table, "| `stockade agent` turn, unconfined (baseline) | {plain:.1} ms | 1.00x |");
    for (name, what) in [
        ("confined", "`stockade agent --confine process` turn"),
        ("confined-docker", "`stockade agent --confine docker` turn"),
        ("docker-run", "`docker run --rm --network none busybox true` (for scale)"),
    ] {
        let t = *ms.get(name).with_context(|| format!("hyperfine reported no {name}"))?;
        let _ = writeln!(table, "| {what} | {t:.1} ms | {:.2}x (+{:.1} ms) |", t / plain, t - plain);
    }
    println!("\n{table}");
    if write {
        write_docs(root, "confined", &table)?;
    }
    Ok(())
}

/// The official E2B SDK against `stockade serve --listen` (a command's round trip, a
/// sandbox's create and kill), beside `docker exec` and `docker run --rm`, in one run.
fn serve(root: &Path, target: &Path, write: bool) -> Result<()> {
    crate::run(&mut crate::cargo(&["xtask", "images"]))?;
    crate::run(&mut crate::cargo(&["build", "--release", "--package", "stockade-cli"]))?;
    let python = crate::llm::install_e2b_sdk()?;
    let state = target.join("bench-serve-state");
    let key = "bench-key-0123456789abcdef";
    let (mut server, url) = crate::deploy::host_server(&target.join("release/stockade"), &state, key)?;
    let out = std::process::Command::new(&python)
        .arg(root.join("crates/stockade-cli/benches/e2b_bench.py"))
        .args(["500", crate::images::BUSYBOX_IMAGE])
        .env("E2B_API_URL", &url)
        .env("E2B_SANDBOX_URL", &url)
        .env("E2B_API_KEY", key)
        .output();
    // Ended by its pid: SIGTERM kills its sandboxes.
    let _ = std::process::Command::new("kill").arg(server.id().to_string()).status();
    let _ = server.wait();
    let out = out?;
    if !out.status.success() {
        bail!("the E2B bench client failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    let data: Value = serde_json::from_slice(&out.stdout)?;
    let p50 = |key: &str| median(&data, key).map(|us| us / 1e3);
    let shown = |v: Option<f64>| v.map_or_else(|| "n/a".to_owned(), |ms| format!("{ms:.2} ms"));
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if a > 0.0 => format!("{:.1}x faster", b / a),
        _ => "n/a".to_owned(),
    };
    let (run, create, exec, docker_run) = (p50("run_true"), p50("create_kill"), p50("docker_exec"), p50("docker_run"));
    let mut table = String::from("| what | p50 | target | baseline (same run) | against it |\n|---|---|---|---|---|\n");
    let _ = writeln!(
        table,
        "| SDK `commands.run(\"true\")` round trip | {} | ≤ 5 ms | `docker exec CTR sh -c true`: {} | {} |",
        shown(run),
        shown(exec),
        ratio(run, exec)
    );
    let _ = writeln!(
        table,
        "| SDK `Sandbox.create()` then `.kill()` | {} | ≤ 30 ms | `docker run --rm IMAGE true`: {} | {} |",
        shown(create),
        shown(docker_run),
        ratio(create, docker_run)
    );
    let (code, bare) = (p50("run_code"), p50("bare_kernel"));
    let slower = match (code, bare) {
        (Some(c), Some(b)) if b > 0.0 => format!("{:.2}x the bare kernel's time", c / b),
        _ => "n/a".to_owned(),
    };
    let _ = writeln!(
        table,
        "| code-interpreter SDK `run_code(\"1+1\")` round trip | {} | ≤ 1.5x the bare kernel | a local IPython kernel's `execute(\"1+1\")` (jupyter_client, no sandbox): {} | {} |",
        shown(code),
        shown(bare),
        slower
    );
    println!("\n{table}");
    if write {
        write_docs(root, "serve", &table)?;
    }
    Ok(())
}

/// A one-shot `stockade run --tier docker` against `docker run --rm` with the same hardening
/// flags, with hyperfine in one run.
fn docker(root: &Path, target: &Path, write: bool) -> Result<()> {
    apt_install(&[("hyperfine", "hyperfine")])?;
    crate::run(&mut crate::cargo(&["xtask", "images"]))?;
    crate::run(&mut crate::cargo(&["build", "--release", "--package", "stockade-cli"]))?;
    let stockade = target.join("release/stockade");
    let stockade = stockade.to_str().context("target path is not UTF-8")?;
    let flags = "--rm --network none --read-only --cap-drop ALL --security-opt no-new-privileges --user 65534:65534 \
                 --memory 512m --memory-swap 512m --pids-limit 64 --cpus 1 --ulimit nofile=256:256 --ulimit core=0:0 \
                 --ulimit cpu=10:10 --tmpfs /tmp:rw,noexec,nosuid,nodev,size=64m --log-driver none --init";
    let flags = flags.split_whitespace().filter(|w| *w != "\\").collect::<Vec<_>>().join(" ");
    let json = target.join("bench-docker.json");
    let mut cmd = std::process::Command::new("hyperfine");
    cmd.args(["-N", "--warmup", "3", "--runs", "30", "--export-json"]).arg(&json);
    cmd.args(["-n", "stockade docker", &format!("{stockade} run --tier docker -- true")]);
    cmd.args(["-n", "docker run", &format!("docker run {flags} stockade-busybox:local true")]);
    let medians = hyperfine(&mut cmd, &json)?;
    let median = |name: &str| medians.get(name).copied().with_context(|| format!("no result for {name}"));
    let (ours, cli) = (median("stockade docker")?, median("docker run")?);
    let pool =
        crate::cargo(&["run", "--release", "--quiet", "--package", "stockade-docker", "--example", "pool_bench"])
            .output()?;
    if !pool.status.success() {
        bail!("pool_bench failed: {}", String::from_utf8_lossy(&pool.stderr));
    }
    let pool: Value = serde_json::from_slice(&pool.stdout)?;
    let p = |k: &str, q: &str| pool[k][q].as_f64().unwrap_or(f64::NAN);
    let mut out =
        String::from("| run of `true`, same hardening | p50 | p90 | ratio to `docker run --rm` |\n|---|---|---|---|\n");
    let _ = writeln!(out, "| `docker run --rm` (same flags), fresh CLI process | {cli:.1} ms | - | 1.00x |");
    let _ = writeln!(
        out,
        "| `stockade run --tier docker -- true`, fresh CLI process | {ours:.1} ms | - | {:.2}x |",
        ours / cli
    );
    for (key, label) in [
        ("one_shot_in_process", "`DockerTier::run`, one-shot, in process"),
        ("recycled", "warm pool exec, a fresh container per run"),
        ("session", "warm pool exec, persistent session"),
    ] {
        let (p50, p90) = (p(key, "p50"), p(key, "p90"));
        let _ = writeln!(out, "| {label} | {p50:.1} ms | {p90:.1} ms | {:.2}x |", p50 / cli);
    }
    println!("\n{out}");
    if write {
        write_docs(root, "docker", &out)?;
    }
    Ok(())
}

/// A fresh `stockade run --tier wasm --js` process against `/usr/bin/python3 -c` and
/// `node -e` (when installed), with hyperfine in one run.
fn wasm_process(root: &Path, target: &Path, write: bool) -> Result<()> {
    apt_install(&[("hyperfine", "hyperfine")])?;
    crate::run(&mut crate::guests_command())?;
    crate::run(&mut crate::cargo(&["build", "--release", "--package", "stockade-cli"]))?;
    let stockade = target.join("release/stockade");
    let stockade = stockade.to_str().context("target path is not UTF-8")?;
    // Compile and cache the guest before timing.
    crate::run(std::process::Command::new(stockade).args(["run", "--tier", "wasm", "--js", "0"]))?;
    let json = target.join("bench-wasm-process.json");
    let mut cmd = std::process::Command::new("hyperfine");
    cmd.args(["-N", "--warmup", "10", "--runs", "200", "--export-json"]).arg(&json);
    cmd.args(["-n", "stockade wasm js", &format!("{stockade} run --tier wasm --js console.log(1+2)")]);
    cmd.args(["-n", "python3 -c", "/usr/bin/python3 -c print(1+2)"]);
    let node = std::process::Command::new("node").arg("--version").output().is_ok_and(|o| o.status.success());
    if node {
        cmd.args(["-n", "node -e", "node -e console.log(1+2)"]);
    }
    let medians = hyperfine(&mut cmd, &json)?;
    let median = |name: &str| medians.get(name).copied();
    let ours = median("stockade wasm js").context("no result for stockade")?;
    let mut out = String::from("| fresh process | p50 | ratio to stockade |\n|---|---|---|\n");
    let _ = writeln!(out, "| `stockade run --tier wasm --js 'console.log(1+2)'` | {ours:.2} ms | 1.00x |");
    for (name, label) in
        [("python3 -c", "`/usr/bin/python3 -c 'print(1+2)'`"), ("node -e", "`node -e 'console.log(1+2)'`")]
    {
        match median(name) {
            Some(t) => {
                let _ = writeln!(out, "| {label} | {t:.2} ms | {:.2}x |", t / ours);
            }
            None => {
                let _ = writeln!(out, "| {label} | not installed | - |");
            }
        }
    }
    println!("\n{out}");
    if write {
        write_docs(root, "wasm-process", &out)?;
    }
    Ok(())
}

/// One markdown table: every function of each criterion group, with its median and its
/// ratio to the group's `baseline_*` function.
fn table(criterion: &Path, groups: &[&str]) -> Result<String> {
    let mut out =
        String::from("| group | benchmark | median | throughput | ratio to baseline |\n|---|---|---|---|---|\n");
    for group in groups {
        let dir = criterion.join(group);
        let mut rows = Vec::new();
        for entry in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry?.path();
            let est = path.join("new/estimates.json");
            let info = path.join("new/benchmark.json");
            if !est.is_file() {
                continue;
            }
            let est: Value = serde_json::from_str(&fs::read_to_string(&est)?)?;
            let info: Value = serde_json::from_str(&fs::read_to_string(&info)?)?;
            let median_ns = est["median"]["point_estimate"].as_f64().context("no median")?;
            let name = info["function_id"].as_str().unwrap_or_default().to_owned();
            rows.push((name, median_ns, info["throughput"].clone()));
        }
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        let baseline = rows.iter().find(|r| r.0.starts_with("baseline_")).map(|r| r.1);
        for (name, ns, tp) in &rows {
            let ratio = baseline.map_or("n/a".to_owned(), |b| format!("{:.2}x", ns / b));
            let _ = writeln!(out, "| {group} | {name} | {} | {} | {ratio} |", time(*ns), throughput(tp, *ns));
        }
    }
    Ok(out)
}

fn time(ns: f64) -> String {
    match ns {
        n if n >= 1e9 => format!("{:.3} s", n / 1e9),
        n if n >= 1e6 => format!("{:.3} ms", n / 1e6),
        n if n >= 1e3 => format!("{:.3} µs", n / 1e3),
        n => format!("{n:.1} ns"),
    }
}

fn throughput(tp: &Value, ns: f64) -> String {
    let secs = ns / 1e9;
    if let Some(b) = tp["Bytes"].as_f64() {
        format!("{:.2} GiB/s", b / secs / (1u64 << 30) as f64)
    } else if let Some(e) = tp["Elements"].as_f64() {
        format!("{:.2} M/s", e / secs / 1e6)
    } else {
        "-".to_owned()
    }
}

/// Runs a hyperfine command that exports to `json`, and returns each command's median in
/// milliseconds, by its name (`-n`).
fn hyperfine(cmd: &mut std::process::Command, json: &Path) -> Result<std::collections::HashMap<String, f64>> {
    crate::run(cmd)?;
    hyperfine_field(json, |r| r["median"].as_f64())
}

/// One figure per command of an exported hyperfine run, in milliseconds, by its name.
fn hyperfine_field(
    json: &Path,
    field: impl Fn(&Value) -> Option<f64>,
) -> Result<std::collections::HashMap<String, f64>> {
    let data: Value = serde_json::from_str(&fs::read_to_string(json)?)?;
    let results = data["results"].as_array().context("hyperfine json has no results")?;
    Ok(results.iter().filter_map(|r| Some((r["command"].as_str()?.to_owned(), field(r)? * 1e3))).collect())
}

/// The median of the numbers in `data[key]` (a bench client's samples), if it has any.
fn median(data: &Value, key: &str) -> Option<f64> {
    median_of(data[key].as_array()?.iter().filter_map(Value::as_f64).collect())
}

/// The median of samples (the upper one of an even count); `None` for none.
pub(crate) fn median_of(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

fn write_docs(root: &Path, group: &str, table: &str) -> Result<()> {
    let path = root.join("docs/benchmarks.md");
    let doc = fs::read_to_string(&path)?;
    let (start, end) = (format!("<!-- bench:{group}:start -->"), format!("<!-- bench:{group}:end -->"));
    let (Some(a), Some(b)) = (doc.find(&start), doc.find(&end)) else {
        bail!("docs/benchmarks.md lacks the {start} ... {end} markers");
    };
    let new = format!("{}{start}\n{table}{}", &doc[..a], &doc[b..]);
    fs::write(&path, new)?;
    println!("wrote the {group} table to docs/benchmarks.md");
    Ok(())
}

/// Installs Debian packages that are missing (the bench's own tools), with apt.
fn apt_install(pkgs: &[(&str, &str)]) -> Result<()> {
    let missing: Vec<&str> = pkgs
        .iter()
        .filter(|(bin, _)| {
            std::process::Command::new("sh")
                .args(["-c", &format!("command -v {bin}")])
                .output()
                .map_or(true, |o| !o.status.success())
        })
        .map(|(_, pkg)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    crate::run(std::process::Command::new("apt-get").args(["update", "-qq"]))?;
    crate::run(std::process::Command::new("apt-get").args(["install", "-y", "-qq"]).args(&missing))
}

/// `stockade run` against bare spawns and `bwrap --unshare-all`, with hyperfine, in one run.
fn process(root: &Path, target: &Path, write: bool) -> Result<()> {
    apt_install(&[("bwrap", "bubblewrap"), ("hyperfine", "hyperfine")])?;
    crate::run(&mut crate::cargo(&["build", "--release", "--package", "stockade-cli"]))?;
    // The same run from a program that links the process tier alone (issue 58's small front).
    crate::run(&mut crate::cargo(&["build", "--release", "--package", "stockade-process", "--example", "oneshot"]))?;
    let stockade = target.join("release/stockade");
    let stockade = stockade.to_str().context("target path is not UTF-8")?;
    let oneshot = target.join("release/examples/oneshot");
    let oneshot = oneshot.to_str().context("target path is not UTF-8")?;
    let bwrap = "bwrap --unshare-all --die-with-parent --new-session --ro-bind /usr /usr --symlink usr/lib /lib \
                 --symlink usr/lib64 /lib64 --symlink usr/bin /bin --symlink usr/sbin /sbin --ro-bind /etc /etc \
                 --proc /proc --dev /dev --tmpfs /tmp --clearenv";
    let bwrap = bwrap.split_whitespace().filter(|w| *w != "\\").collect::<Vec<_>>().join(" ");
    let json = target.join("bench-process.json");
    // A small project as a read-write workspace: a git repository and 200 files, so the
    // per-run workspace work (id-mapped mount as root, socket walk, protected-path binds and
    // sweep) is in the figure. Under the temporary directory, as a user's would be: the target
    // directory may sit in a home's hidden directory (`~/.cache`), which no tier grants.
    let ws = std::env::temp_dir().join(format!("stockade-bench-workspace-{}", std::process::id()));
    let _ = fs::remove_dir_all(&ws);
    fs::create_dir_all(ws.join(".git/hooks"))?;
    fs::write(ws.join(".git/config"), "[core]\n")?;
    for i in 0..200 {
        fs::create_dir_all(ws.join(format!("src/m{}", i % 10)))?;
        fs::write(ws.join(format!("src/m{}/f{i}.txt", i % 10)), "x")?;
    }
    let ws = ws.to_str().context("the temporary directory's path is not UTF-8")?.to_owned();
    let mut cmd = std::process::Command::new("hyperfine");
    cmd.args(["-N", "--warmup", "20", "--runs", "300", "--export-json"]).arg(&json);
    // For the phases of a one-shot run (below): the front binary alone, and the namespaces
    // alone (util-linux's `unshare`, a small C program that makes the same six and forks).
    cmd.args(["-n", "stockade front", &format!("{stockade} --version")]);
    cmd.args(["-n", "unshare true", "unshare -Urnpmiuf /bin/true"]);
    cmd.args(["-n", "oneshot true", &format!("{oneshot} /bin/true")]);
    for (name, program) in [("true", "/bin/true"), ("python", "/usr/bin/python3 -c pass")] {
        cmd.args(["-n", &format!("bare {name}"), program]);
        cmd.args(["-n", &format!("stockade {name}"), &format!("{stockade} run -- {program}")]);
        cmd.args(["-n", &format!("stockade-no-cgroup {name}"), &format!("{stockade} run --no-cgroup -- {program}")]);
        cmd.args([
            "-n",
            &format!("stockade-workspace {name}"),
            &format!("{stockade} run --workspace {ws}:rw -- {program}"),
        ]);
        cmd.args(["-n", &format!("bwrap {name}"), &format!("{bwrap} {program}")]);
    }
    let mut medians = hyperfine(&mut cmd, &json)?;
    // The same one-shot run and bwrap's, 100 ms apart, as a user's runs come: a wait in the
    // kernel that a run back to back with the last one skips (such as an RCU grace period)
    // shows here.
    let spaced_json = target.join("bench-process-spaced.json");
    let mut spaced = std::process::Command::new("hyperfine");
    spaced.args(["-N", "--prepare", "sleep 0.1", "--warmup", "3", "--runs", "60", "--export-json"]).arg(&spaced_json);
    spaced.args(["-n", "stockade true spaced", &format!("{stockade} run -- /bin/true")]);
    spaced.args(["-n", "bwrap true spaced", &format!("{bwrap} /bin/true")]);
    spaced.args(["-n", "oneshot true spaced", &format!("{oneshot} /bin/true")]);
    // Their names are their own, so both runs' medians are looked up in one map.
    medians.extend(hyperfine(&mut spaced, &spaced_json)?);
    // CPU per run: user plus system time of the command and the children it reaps (hyperfine's
    // means). Not shown for bwrap: its pid 1 and the program are reaped by the system's init,
    // so hyperfine misses most of its CPU; the embedder table measures both through a cgroup.
    let cpus = hyperfine_field(&json, |r| Some(r["user"].as_f64()? + r["system"].as_f64()?))?;
    let _ = fs::remove_dir_all(&ws);
    let median = |name: &str| medians.get(name).copied().with_context(|| format!("no result for {name}"));
    let cpu = |name: &str| cpus.get(name).copied().with_context(|| format!("no cpu for {name}"));
    let mut out = String::from(
        "| target | variant | bare p50 | stockade p50 | overhead over bare | bwrap --unshare-all p50 | bwrap / stockade | stockade CPU per run |\n|---|---|---|---|---|---|---|---|\n",
    );
    for name in ["true", "python"] {
        let (bare, bw) = (median(&format!("bare {name}"))?, median(&format!("bwrap {name}"))?);
        for (variant, label) in [
            ("stockade", "default (cgroup v1)"),
            ("stockade-no-cgroup", "--no-cgroup (rlimits)"),
            ("stockade-workspace", "--workspace (a git repo, 200 files):rw"),
        ] {
            let ours = median(&format!("{variant} {name}"))?;
            let our_cpu = cpu(&format!("{variant} {name}"))?;
            let _ = writeln!(
                out,
                "| {name} | {label} | {bare:.2} ms | {ours:.2} ms | {:.2} ms | {bw:.2} ms | {:.2}x | {our_cpu:.2} ms |",
                ours - bare,
                bw / ours,
            );
        }
    }
    println!("\n{out}");
    let phases = phases(&median)?;
    println!("\n{phases}");
    if write {
        write_docs(root, "process", &out)?;
        write_docs(root, "process-phases", &phases)?;
    }
    embedder(root, target, write)
}

/// Where a one-shot `stockade run -- /bin/true` spends its time, by difference between
/// commands of the same hyperfine run (`median` by command name), next to bwrap's and the
/// `oneshot` example's (the run without the CLI); then all three spaced 100 ms apart (a
/// second hyperfine run, its commands named `... spaced`).
fn phases(median: &dyn Fn(&str) -> Result<f64>) -> Result<String> {
    let bare = median("bare true")?;
    let front = median("stockade front")? - bare;
    let namespaces = median("unshare true")? - bare;
    let (ours, no_cgroup, bw) = (median("stockade true")?, median("stockade-no-cgroup true")?, median("bwrap true")?);
    let cgroup = ours - no_cgroup;
    let rest = no_cgroup - bare - front - namespaces;
    let mut out = String::from("| phase of `stockade run -- /bin/true` | measured as | time |\n|---|---|---|\n");
    for (phase, how, ms) in [
        ("a bare spawn of `/bin/true`", "`/bin/true`", bare),
        ("the front binary: exec, loading, fork server, arguments", "`stockade --version` - bare", front),
        ("six namespaces (the kernel's cost)", "`unshare -Urnpmiuf /bin/true` - bare", namespaces),
        (
            "the rest: helper and pid 1, the view, landlock, seccomp, the guest's spawn, capture, report",
            "`--no-cgroup` run - bare - front - namespaces",
            rest,
        ),
        ("a cgroup per run (v1: made, limited, removed)", "default run - `--no-cgroup` run", cgroup),
        ("**the whole run**", "`stockade run -- /bin/true`", ours),
        ("bwrap `--unshare-all`, for comparison", "same run", bw),
    ] {
        let _ = writeln!(out, "| {phase} | {how} | {ms:.2} ms |");
    }
    let _ = writeln!(out, "| **stockade / bwrap** (target: at most 1.33x) | | **{:.2}x** |", ours / bw);
    let small = median("oneshot true")?;
    let _ = writeln!(
        out,
        "| the same run from a program that links the process tier alone (a small front's floor) | stockade-process's `oneshot` example | {small:.2} ms, **{:.2}x** bwrap |",
        small / bw
    );
    let (ours, bw, small) =
        (median("stockade true spaced")?, median("bwrap true spaced")?, median("oneshot true spaced")?);
    let how = "hyperfine `--prepare 'sleep 0.1'`";
    let _ = writeln!(out, "| the whole run, 100 ms after the last, as a user's runs come | {how} | {ours:.2} ms |");
    let _ = writeln!(out, "| bwrap, 100 ms after the last | {how} | {bw:.2} ms |");
    let _ = writeln!(out, "| **stockade / bwrap, spaced** | | **{:.2}x** |", ours / bw);
    let _ = writeln!(out, "| `oneshot`, 100 ms after the last | {how} | {small:.2} ms, **{:.2}x** bwrap |", small / bw);
    Ok(out)
}

/// The process tier from a long-lived multi-threaded embedder (the `embedder` criterion
/// bench of stockade-process), next to bwrap and a bare spawn from the same program, with
/// CPU per run measured from the host.
fn embedder(root: &Path, target: &Path, write: bool) -> Result<()> {
    let groups = [
        "process_embedder_true",
        "process_embedder_python",
        "process_embedder_true_spaced",
        "process_embedder_8_concurrent",
    ];
    for g in groups {
        let dir = target.join("criterion").join(g);
        if dir.exists() {
            fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
        }
    }
    let cpu_json = target.join("bench-process-embedder-cpu.json");
    crate::run(
        crate::cargo(&["bench", "--package", "stockade-process", "--bench", "embedder"])
            .env("STOCKADE_BENCH_CPU_OUT", &cpu_json),
    )?;
    let cpu: Vec<Value> = serde_json::from_str(&fs::read_to_string(&cpu_json)?)?;
    let cpu_of = |group: &str, bench: &str| {
        cpu.iter().find(|r| r["group"] == group && r["benchmark"] == bench).and_then(|r| r["cpu_ms_per_run"].as_f64())
    };
    let median_of = |group: &str, bench: &str| -> Result<f64> {
        let est = target.join("criterion").join(group).join(bench).join("new/estimates.json");
        let est: Value = serde_json::from_str(&fs::read_to_string(&est).with_context(|| est.display().to_string())?)?;
        est["median"]["point_estimate"].as_f64().context("no median")
    };
    let mut out = String::from(
        "| group | runner | median | runs/s | bwrap / runner (time) | CPU per run | runner CPU / bwrap CPU |\n|---|---|---|---|---|---|---|\n",
    );
    for group in groups {
        let per_iter = if group.ends_with("concurrent") { 8.0 } else { 1.0 };
        let bwrap = median_of(group, "bwrap_unshare_all").ok();
        let bwrap_cpu = cpu_of(group, "bwrap_unshare_all");
        for bench in [
            "baseline_bare_spawn",
            "bwrap_unshare_all",
            "stockade_fork_server",
            "stockade_pool",
            "stockade_exec_helper",
        ] {
            let Ok(ns) = median_of(group, bench) else { continue };
            let ratio = bwrap.map_or("n/a".to_owned(), |b| format!("{:.2}x", b / ns));
            let c = cpu_of(group, bench);
            let cpu_ratio = match (c, bwrap_cpu) {
                (Some(c), Some(b)) if b > 0.0 => format!("{:.2}x", c / b),
                _ => "n/a".to_owned(),
            };
            let _ = writeln!(
                out,
                "| {group} | {bench} | {} | {:.0} | {ratio} | {} | {cpu_ratio} |",
                time(ns),
                per_iter / (ns / 1e9),
                c.map_or("n/a".to_owned(), |c| format!("{c:.2} ms")),
            );
        }
    }
    println!("\n{out}");
    if write {
        write_docs(root, "process-embedder", &out)?;
    }
    Ok(())
}
