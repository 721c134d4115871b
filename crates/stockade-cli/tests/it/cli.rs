//! The command line: G1 (only verified output is printed), G2 (fail closed).

use std::process::{Command, Output};

/// Every `stockade run` reaps the stale cgroups of dead supervisors when it starts, so a run
/// of any test could collect the cgroups `g7_*` checks between doctor naming them and the
/// host seeing them. Whatever starts `stockade` holds [`shared`] while it runs; `g7_*` holds
/// [`exclusive`], so no other test's run overlaps it.
static RUNS: std::sync::RwLock<()> = std::sync::RwLock::new(());

thread_local! {
    /// Whether this thread holds a guard of [`RUNS`] already: a second read of a lock a writer
    /// waits for would deadlock, so a nested guard is a no-op.
    static HELD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A guard of [`RUNS`], shared or exclusive (or none if this thread holds one already, which
/// is also the default).
#[derive(Default)]
pub(crate) struct Runs {
    read: Option<std::sync::RwLockReadGuard<'static, ()>>,
    write: Option<std::sync::RwLockWriteGuard<'static, ()>>,
}

impl Drop for Runs {
    fn drop(&mut self) {
        if self.read.is_some() || self.write.is_some() {
            HELD.set(false);
        }
    }
}

/// Held while a test runs `stockade` (see [`RUNS`]).
pub(crate) fn shared() -> Runs {
    if HELD.get() {
        return Runs { read: None, write: None };
    }
    let read = RUNS.read().unwrap_or_else(std::sync::PoisonError::into_inner);
    HELD.set(true);
    Runs { read: Some(read), write: None }
}

/// Held by the one test that needs no other `stockade run` to overlap it (see [`RUNS`]).
fn exclusive() -> Runs {
    assert!(!HELD.get(), "exclusive() under another guard of this thread");
    let write = RUNS.write().unwrap_or_else(std::sync::PoisonError::into_inner);
    HELD.set(true);
    Runs { read: None, write: Some(write) }
}

fn stockade(args: &[&str], env: &[(&str, &str)]) -> Output {
    let _runs = shared();
    Command::new(env!("CARGO_BIN_EXE_stockade")).args(args).envs(env.iter().copied()).output().unwrap()
}

/// (exit code, stdout, stderr).
pub(crate) fn check(args: &[&str]) -> (i32, String, String) {
    check_env(args, &[])
}

/// [`check`], with `env` added to stockade's own environment.
pub(crate) fn check_env(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let o = stockade(args, env);
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Whether `stockade doctor --json` says `tier` can run here (by `ready(doctor)`). Prints
/// SKIPPED otherwise, or fails the test under `STOCKADE_REQUIRE_ALL` (CI).
pub(crate) fn tier_ready(tier: &str, ready: impl Fn(&serde_json::Value) -> bool) -> bool {
    let (_, out, _) = check(&["doctor", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let ok = ready(&v);
    if !ok {
        assert!(std::env::var_os("STOCKADE_REQUIRE_ALL").is_none(), "{tier} tier not ready: {out}");
        eprintln!("SKIPPED: the {tier} tier cannot run here: {out}");
    }
    ok
}

/// The real local model's base URL (`cargo xtask llm --test` starts one and sets
/// `STOCKADE_LLM_URL`). Prints SKIPPED without one, or fails the test when
/// `STOCKADE_REQUIRE_LLM` is set. With the URL comes the model's lock: the local server
/// answers one request at a time, so two tests sharing it would each wait for the other's
/// generation inside their own request timeouts (CI13's `g4_real_model_*` timed out so,
/// queued behind `g3_real_model_*` on a loaded machine).
pub(crate) fn llm_url() -> Option<(String, std::sync::MutexGuard<'static, ()>)> {
    static MODEL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let url = std::env::var_os("STOCKADE_LLM_URL").and_then(|u| u.into_string().ok());
    if url.is_none() {
        assert!(
            std::env::var_os("STOCKADE_REQUIRE_LLM").is_none(),
            "STOCKADE_REQUIRE_LLM is set but STOCKADE_LLM_URL is not"
        );
        eprintln!("SKIPPED real_model: no local model (cargo xtask llm --test runs this test against one)");
    }
    url.map(|u| (u, MODEL.lock().unwrap_or_else(std::sync::PoisonError::into_inner)))
}

/// A pinned SDK's interpreter or directory, from the variable `cargo xtask ci` sets (`var`);
/// `None` (the test skips) when it is unset, which CI, requiring all, does not allow.
pub(crate) fn installed(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(path) => Some(path),
        Err(_) => {
            assert!(
                std::env::var_os("STOCKADE_REQUIRE_ALL").is_none(),
                "STOCKADE_REQUIRE_ALL is set but {var} is not (cargo xtask ci installs the pinned SDKs)"
            );
            eprintln!("SKIPPED: {var} is not set");
            None
        }
    }
}

pub(crate) fn ready() -> bool {
    tier_ready("process", |v| v["process_tier"].as_bool().unwrap())
}

#[test]
fn g1_verified_output_is_printed() {
    if !ready() {
        return;
    }
    assert_eq!(check(&["run", "--", "python3", "-c", "print(6*7)"]), (0, "42\n".into(), String::new()));
    let (code, out, _) = check(&["run", "--expect-json", "--", "python3", "-c", "print('{\"n\": 1}')"]);
    assert_eq!((code, out.as_str()), (0, "{\"n\": 1}\n"));
}

#[test]
fn g1_the_cli_forks_its_helper_and_the_guest_sees_none_of_it() {
    if !ready() {
        return;
    }
    // The CLI is single-threaded when it launches, so the helper is a fork of it. Pid 1 of the
    // run is a copy of the CLI, whose command line every process of the run could read in
    // /proc/1/cmdline (the kernel checks no dumpable flag there): the fork overwrites it, so
    // no argument of the CLI (a --grant-tool command, a path) reaches the guest. The marker
    // says it is a fork (an exec'd helper has its own, argument-less command line).
    let (code, out, err) = check(&[
        "run",
        "--grant-tool",
        "notify=curl -H 'Authorization: Bearer CANARY-ARGV-7f3a' http://127.0.0.1:9/",
        "--",
        "sh",
        "-c",
        "tr '\\0' ' ' </proc/1/cmdline; cat /proc/1/environ 2>/dev/null; true",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("stockade-sandbox-init (forked helper)"),
        "pid 1 is not a scrubbed fork of the CLI: {out:?}"
    );
    assert!(!out.contains("CANARY-ARGV") && !out.contains("sh -c"), "the CLI's arguments reached the guest: {out:?}");
    assert!(!out.contains("PATH="), "the CLI's environment reached the guest: {out:?}");
    // The forked helper's own exit adds nothing to the guest's output (it once closed its
    // inherited descriptors twice, and a debug build aborted onto the guest's stderr).
    let (_, out, _) = check(&["run", "--json", "--", "sh", "-c", "echo out; echo err >&2"]);
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!((&report["stdout"]["bytes"], &report["stderr"]["bytes"]), (&"out\n".into(), &"err\n".into()));
    // With --tty the guest's stdio is a terminal (through the fork launch too).
    let (code, out, err) = check(&["run", "--tty", "--", "sh", "-c", "test -t 0 && test -t 2 && echo on-a-tty"]);
    assert_eq!((code, out.as_str()), (0, "on-a-tty\r\n"), "{err}");
    assert_eq!(check(&["run", "--tier", "wasm", "--tty", "--js", "1"]).0, 125);
    // On a terminal (util-linux `script` makes one), the run's terminal has its size; off
    // one, 0x0.
    assert_eq!(check(&["run", "--tty", "--", "stty", "size"]).1, "0 0\r\n");
    let inner = format!("stty rows 40 cols 120; {} run --tty -- stty size", env!("CARGO_BIN_EXE_stockade"));
    let _runs = shared();
    match Command::new("script").args(["-qc", &inner, "/dev/null"]).stdin(std::process::Stdio::null()).output() {
        Ok(o) => assert!(String::from_utf8_lossy(&o.stdout).contains("40 120"), "{o:?}"),
        Err(e) => eprintln!("SKIPPED the terminal size through the CLI: no `script` ({e})"),
    }
    // That copy of the CLI's memory stays out of the guest's reach.
    let (code, out, err) =
        check(&["run", "--json", "--", "sh", "-c", "cat /proc/1/environ /proc/1/maps; ls /proc/1/fd"]);
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(i64::from(code), report["status"]["code"].as_i64().unwrap(), "{out}{err}");
    assert_ne!(code, 0);
    assert_eq!(report["stdout"]["bytes"], "", "{report:#}");
    let stderr = report["stderr"]["bytes"].as_str().unwrap();
    assert_eq!(stderr.matches("Permission denied").count(), 3, "{stderr}");
}

#[test]
fn g1_refusals_print_one_line_and_the_stable_code() {
    if !ready() {
        return;
    }
    let cases: &[(&[&str], i32, &str)] = &[
        (&["run", "--timeout", "300ms", "--", "sleep", "5"], 124, "stockade: refused: timed out"),
        (&["run", "--", "sh", "-c", "echo secret-output; exit 3"], 3, "stockade: refused: exited with code 3"),
        (&["run", "--expect-json", "--", "echo", "not json"], 122, "stockade: refused: malformed output"),
        (&["run", "--max-output", "10", "--", "yes"], 123, "stockade: refused: output too large"),
        (&["run", "--", "no-such-program"], 126, "stockade: refused: failed to start"),
        (&["run", "--expect-exit", "3", "--", "sh", "-c", "exit 0"], 1, "stockade: refused: exited with code 0"),
    ];
    for (args, want_code, want_err) in cases {
        let (code, out, err) = check(args);
        assert_eq!(code, *want_code, "{args:?}: {err}");
        assert_eq!(out, "", "{args:?} printed unverified output");
        assert!(err.starts_with(want_err), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    }
    // Guest bytes in the refusal line cannot drive the terminal (with --quiet, the line
    // quotes the program's stderr).
    let (_, _, err) = check(&[
        "run",
        "--quiet",
        "--",
        "python3",
        "-c",
        "import sys; sys.stderr.write('\\x1b]0;pwned\\x07\\n'); sys.exit(2)",
    ]);
    assert!(!err.trim_end().chars().any(char::is_control), "{err:?}");
    // The refusal says that stdout was withheld, and how much, without a byte of it (a test
    // runner's failure report is on stdout); with nothing printed it says nothing.
    let (_, out, err) = check(&["run", "--", "sh", "-c", "echo secret-output; exit 3"]);
    assert_eq!(out, "");
    assert_eq!(
        err,
        "stockade: refused: exited with code 3; 14 bytes of stdout withheld (--json prints the report with them)\n"
    );
    let (_, _, err) = check(&["run", "--max-output", "10", "--", "yes"]);
    assert!(err.trim_end().ends_with("; 10+ bytes of stdout withheld (--json prints the report with them)"), "{err}");
    let (_, _, err) = check(&["run", "--", "sh", "-c", "exit 3"]);
    assert_eq!(err, "stockade: refused: exited with code 3\n");
    // With --quiet the line quotes the program's stderr, and an empty one not at all.
    let (_, _, err) = check(&["run", "--quiet", "--", "sh", "-c", "exit 3"]);
    assert_eq!(err, "stockade: refused: exited with code 3\n");
    let (_, _, err) = check(&["run", "--quiet", "--", "sh", "-c", "echo why >&2; exit 3"]);
    assert_eq!(err, "stockade: refused: exited with code 3; stderr: why\\n\n");
    // --json shows the whole report, unverified output included, and keeps the exit code.
    let (code, out, _) = check(&["run", "--json", "--", "sh", "-c", "echo visible; exit 3"]);
    assert_eq!(code, 3, "the program's own code passes through");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["stdout"]["bytes"], "visible\n");
    assert_eq!(report["status"]["code"], 3);
}

#[test]
fn g2_a_missing_mechanism_fails_closed() {
    if !ready() {
        return;
    }
    let (_, doctor, _) = check(&["doctor", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&doctor).unwrap();
    let abi: u32 = v["checks"][0]["detail"].as_str().unwrap().trim_start_matches("abi ").parse().unwrap();
    if abi >= 9 {
        eprintln!("SKIPPED g2: this kernel has landlock abi {abi}; the test needs a missing abi (9)");
        return;
    }
    let (code, out, err) = check(&["run", "--landlock-abi", "9", "--", "echo", "ran"]);
    assert_eq!((code, out.as_str()), (125, ""), "{err}");
    assert!(err.contains("cannot enforce the sandbox (landlock)"), "{err}");
}

/// A root supervisor without `CAP_KILL` (a container that dropped it) could not end a run of
/// another uid at its deadline, or a session at its kill (before: an E2B kill of a
/// code-interpreter sandbox in such a container never returned). So nothing starts, and the
/// error names the mechanism.
#[test]
fn g2_a_root_supervisor_without_cap_kill_starts_nothing() {
    if !ready() {
        return;
    }
    let out = std::process::Command::new("setpriv")
        .args(["--bounding-set", "-kill", "--inh-caps", "-kill", "--"])
        .arg(env!("CARGO_BIN_EXE_stockade"))
        .args(["run", "--", "echo", "ran"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!((out.status.code(), String::from_utf8_lossy(&out.stdout).as_ref()), (Some(125), ""), "{err}");
    assert!(
        err.contains("cannot enforce the sandbox (ending the sandbox's processes)") && err.contains("CAP_KILL"),
        "{err}"
    );
    // `stockade doctor` tries a real run, so it says so too (its probes alone said ready).
    let out = std::process::Command::new("setpriv")
        .args(["--bounding-set", "-kill", "--inh-caps", "-kill", "--"])
        .arg(env!("CARGO_BIN_EXE_stockade"))
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["process_tier"], false, "{v}");
    let row = v["checks"].as_array().unwrap().iter().find(|c| c["name"] == "process run").unwrap();
    assert!(row["ok"] == false && row["detail"].as_str().unwrap().contains("CAP_KILL"), "{row}");
}

#[test]
fn usage_errors_and_help() {
    let (code, _, err) = check(&["run", "--timeout", "soon", "--", "true"]);
    assert_eq!(code, 2, "{err}");
    let (code, out, _) = check(&["run", "--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("stockade run -- python3 -c 'print(6*7)'"));
    let (code, out, _) = check(&["doctor"]);
    assert_eq!(code, 0);
    assert!(out.contains("landlock"));
}

/// True if the JavaScript guest is built (CI builds it; a skip fails there).
pub(crate) fn js_ready() -> bool {
    tier_ready("wasm", |v| {
        let guest = v["checks"].as_array().unwrap().iter().find(|c| c["name"] == "wasm js guest").unwrap();
        guest["ok"].as_bool().unwrap() && v["wasm_tier"].as_bool().unwrap()
    })
}

#[test]
fn g1_wasm_tier_prints_only_verified_output() {
    if !js_ready() {
        return;
    }
    assert_eq!(check(&["run", "--tier", "wasm", "--js", "console.log(6*7)"]), (0, "42\n".into(), String::new()));
    let (code, out, err) =
        check(&["run", "--tier", "wasm", "--js", "console.log('partial'); for (;;) {}", "--cpu", "50ms"]);
    assert_eq!((code, out.as_str()), (120, ""), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let (code, out, _) = check(&["run", "--tier", "wasm", "--timeout", "300ms", "--js", "sleep(5000)"]);
    assert_eq!((code, out.as_str()), (124, ""));
    let (code, out, err) = check(&["run", "--tier", "wasm", "--max-output", "1K", "--js", "for (;;) console.log('y')"]);
    assert_eq!((code, out.as_str()), (123, ""), "{err}");
    // The guest's stderr is shown (into a pipe, unchanged); with --quiet the one refusal
    // line quotes it, escaped.
    let (code, _, err) = check(&["run", "--tier", "wasm", "--js", "throw new Error('\\x1b[31m')"]);
    assert_eq!(code, 1);
    assert!(
        err.starts_with("Error: \x1b[31m\n") && err.ends_with("\nstockade: refused: exited with code 1\n"),
        "{err:?}"
    );
    let (code, _, err) = check(&["run", "--quiet", "--tier", "wasm", "--js", "throw new Error('\\x1b[31m')"]);
    assert_eq!(code, 1);
    assert!(!err.trim_end().chars().any(char::is_control), "{err:?}");
}

#[test]
fn g1_wasm_tier_runs_a_module_file_and_a_script_file() {
    if !js_ready() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("stockade-cli-wasm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("s.js");
    std::fs::write(&script, "print('from file')").unwrap();
    assert_eq!(
        check(&["run", "--tier", "wasm", "--js-file", script.to_str().unwrap()]),
        (0, "from file\n".into(), String::new())
    );
    // (module (func (export "_start") unreachable)): a trap is its own refusal.
    let module = dir.join("trap.wasm");
    std::fs::write(
        &module,
        b"\0asm\x01\0\0\0\x01\x04\x01\x60\0\0\x03\x02\x01\0\x07\x0a\x01\x06_start\0\0\x0a\x05\x01\x03\0\x00\x0b",
    )
    .unwrap();
    for args in [
        vec!["run", "--tier", "wasm", "--", module.to_str().unwrap()],
        vec!["run", "--tier", "wasm", module.to_str().unwrap()],
    ] {
        let (code, _, err) = check(&args);
        assert_eq!(code, 117, "{err}");
        assert!(err.contains("unreachable"), "{err}");
    }
    let (code, _, err) = check(&["run", module.to_str().unwrap(), "--", "x"]);
    assert_eq!(code, 125, "{err}");
    let (code, _, err) = check(&["run", "--js", "1"]);
    assert_eq!(code, 125, "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn g1_docker_tier_prints_only_verified_output() {
    if !tier_ready("docker", |v| v["docker_tier"].as_bool().unwrap()) {
        return;
    }
    assert_eq!(
        check(&["run", "--tier", "docker", "--", "sh", "-c", "echo $((6*7))"]),
        (0, "42\n".into(), String::new())
    );
    let (code, out, err) =
        check(&["run", "--tier", "docker", "--timeout", "1s", "--", "sh", "-c", "echo partial; sleep 30"]);
    assert_eq!((code, out.as_str()), (124, ""), "{err}");
    let (code, _, err) = check(&["run", "--tier", "docker", "--image=-bad", "--", "true"]);
    assert_eq!(code, 125, "{err}");
}

/// The row `name` of `stockade doctor --json`'s checks.
fn doctor_row(name: &str) -> serde_json::Value {
    let (_, out, _) = check(&["doctor", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["checks"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap().clone()
}

#[test]
fn g7_a_killed_supervisors_cgroup_is_reported_and_collected() {
    if !ready() {
        return;
    }
    let _runs = exclusive();
    // Doctor also says where a run's broker listens, and what a socket in a workspace meets.
    let broker = doctor_row("grants broker");
    assert_eq!(broker["ok"], true, "{broker}");
    assert!(doctor_row("unix sockets")["detail"].as_str().unwrap().contains("covered when the run starts"));
    let cgroups = &doctor_row("cgroups");
    if cgroups["ok"] != true {
        assert!(std::env::var_os("STOCKADE_REQUIRE_ALL").is_none(), "no cgroups: {cgroups}");
        eprintln!("SKIPPED: no cgroups here: {cgroups}");
        return;
    }
    // A user's `kill -9` of stockade mid-run: returns the stale cgroup directories doctor names.
    let kill_mid_run = |marker: &str| -> Vec<String> {
        let mut stockade = Command::new(env!("CARGO_BIN_EXE_stockade"))
            .args(["run", "--timeout", "60s", "--", "sleep", marker])
            .stdin(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // The guest itself, by its whole command line (stockade's own holds the same words).
        let want = format!("sleep\0{marker}\0");
        let guest = || stockade_test_support::host_pids(|c| c == want.as_bytes()).len();
        let start = std::time::Instant::now();
        while guest() == 0 {
            assert!(start.elapsed() < std::time::Duration::from_secs(10), "the guest never started");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        stockade.kill().unwrap();
        stockade.wait().unwrap();
        let start = std::time::Instant::now();
        while guest() != 0 {
            assert!(start.elapsed() < std::time::Duration::from_secs(5), "the run outlived its supervisor");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        // Its cgroup stayed, and doctor names it (the owner's pid is in its name).
        let row = doctor_row("stale cgroups");
        assert_eq!(row["ok"], false, "{row}");
        let detail = row["detail"].as_str().unwrap().to_owned();
        assert!(detail.contains(&format!("stockade-{}-", stockade.id())), "pid {}: {detail}", stockade.id());
        let dirs: Vec<String> =
            detail.split(' ').filter(|w| w.starts_with("/sys/fs/cgroup/")).map(str::to_owned).collect();
        assert!(!dirs.is_empty() && dirs.iter().all(|d| std::path::Path::new(d).is_dir()), "{detail}");
        dirs
    };
    // `stockade gc` removes it, judged by the host's cgroupfs.
    let dirs = kill_mid_run("1207.5151");
    let (code, out, err) = check(&["gc"]);
    assert_eq!(code, 0, "{out} {err}");
    assert!(out.starts_with("removed ") && !out.starts_with("removed 0 "), "{out}");
    assert!(dirs.iter().all(|d| !std::path::Path::new(d).exists()), "{dirs:?} left after gc");
    assert_eq!(doctor_row("stale cgroups")["ok"], true);
    // So does the next run, on its own.
    let dirs = kill_mid_run("1207.6262");
    assert_eq!(check(&["run", "--", "true"]).0, 0);
    assert!(dirs.iter().all(|d| !std::path::Path::new(d).exists()), "{dirs:?} left after the next run");
    assert_eq!(doctor_row("stale cgroups")["ok"], true);
}

/// A one-shot run's helper is the fork server `main` started, handed over (stockade-process
/// G14): while the run runs, `stockade` has one child, the parent of the run's pid 1, and
/// no server beside it. Judged from the host's `/proc`.
#[test]
fn g14_a_one_shot_runs_helper_is_the_fork_server_itself() {
    if !ready() {
        return;
    }
    let _runs = shared();
    let marker = format!("1207.{}", std::process::id());
    let mut stockade = Command::new(env!("CARGO_BIN_EXE_stockade"))
        .args(["run", "--timeout", "60s", "--", "sleep", &marker])
        .stdin(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let want = format!("sleep\0{marker}\0");
    let guest = || stockade_test_support::host_pids(|c| c == want.as_bytes());
    stockade_test_support::eventually(std::time::Duration::from_secs(10), "the guest never started", || {
        guest().len() == 1
    });
    let parent = |pid| stockade_test_support::parent_of(pid).unwrap();
    let helper = parent(parent(guest()[0]));
    let children = stockade_test_support::children(stockade.id());
    assert_eq!(children, vec![helper], "stockade's children: the helper alone");
    let kill = Command::new("kill").args(["-TERM", &stockade.id().to_string()]).status().unwrap();
    assert!(kill.success());
    assert_eq!(stockade.wait().unwrap().code(), Some(143));
}

#[test]
fn g14_no_process_of_a_run_outlives_stockade_run() {
    if !ready() {
        return;
    }
    let _runs = shared();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/subreaper.py");
    let o = Command::new("python3").arg(script).arg(env!("CARGO_BIN_EXE_stockade")).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["up"], "up\n", "{report}");
    let expected = [("verified", 0), ("refused", 3), ("timeout", 124), ("sigterm", 143), ("burst", 0)];
    for (case, code) in expected {
        let codes = report[case]["codes"].as_array().unwrap();
        assert!(codes.iter().all(|c| c == code), "{case}: exit codes {codes:?}, expected {code}: {report}");
        assert_eq!(
            report[case]["left"],
            serde_json::json!([]),
            "{case}: processes of stockade's outlived it: {report}"
        );
    }
}
