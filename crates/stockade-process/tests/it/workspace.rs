//! hold-the-line: the audit's findings on the read-write workspace, each judged from the
//! host (a canary, the host's own git, a listener or a fifo reader), each failing before its
//! fix.

use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use stockade_protocol::{Access, Job, Mechanism, Status};

use crate::confinement::PROBE;
use crate::support::*;

/// A canary directory where no workspace may be granted (`/etc`, a system tree): the race
/// below points a symlink at it.
fn canary_in_etc(tag: &str) -> PathBuf {
    let d = PathBuf::from(format!("/etc/stockade-it-canary-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("secret"), "CANARY-SECRET\n").unwrap();
    d
}

/// Finding 1: the workspace was judged by name and mounted by name, so a guest swapping a
/// directory of a granted path for a symlink between the two got the symlink's target (the
/// audit read `/etc/shadow` on the second try). Raced here as the audit raced it: a thread
/// swaps `W/sub` with a symlink to a canary under `/etc` as fast as it can, while runs are
/// granted `W/sub`. Judged by the canary's bytes: no run may ever read them.
#[test]
fn g13_a_path_swapped_while_runs_start_never_mounts_another_directory() {
    require!("g13_a_path_swapped_while_runs_start_never_mounts_another_directory");
    if nix_uid() != 0 {
        eprintln!("SKIPPED g13_a_path_swapped: the canary lives under /etc, which needs root");
        return;
    }
    let canary = canary_in_etc("swap");
    let ws = host_dir("ws-swap");
    let sub = ws.join("sub");
    std::fs::create_dir(&sub).unwrap();
    std::fs::write(sub.join("secret"), "ordinary\n").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let (stop, sub, canary, ws) = (stop.clone(), sub.clone(), canary.clone(), ws.clone());
        std::thread::spawn(move || {
            // `sub` and `link` trade places atomically (renameat2 RENAME_EXCHANGE), so `sub`
            // is always there: the directory for 3 ms, then a symlink to the canary for 1 ms.
            let link = ws.join("link");
            std::os::unix::fs::symlink(&canary, &link).unwrap();
            let exchange = || {
                rustix::fs::renameat_with(
                    rustix::fs::CWD,
                    &sub,
                    rustix::fs::CWD,
                    &link,
                    rustix::fs::RenameFlags::EXCHANGE,
                )
                .unwrap();
            };
            let mut swaps = 0u64;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(3));
                exchange();
                std::thread::sleep(Duration::from_millis(1));
                exchange();
                swaps += 1;
            }
            swaps
        })
    };
    let (mut ran, mut refused) = (0, 0);
    let tier = tier();
    block_on(async {
        let start = std::time::Instant::now();
        let mut tries = 0;
        while tries < 300 || start.elapsed() < Duration::from_secs(3) {
            tries += 1;
            let job = sh("cat /workspace/secret 2>/dev/null; true").with_workspace(&sub, Access::ReadOnly).unwrap();
            match tier.run(&job).await {
                Ok(r) => {
                    let out = stdout(&r);
                    assert!(!out.contains("CANARY"), "a run mounted the canary under /etc: {out}");
                    if matches!(r.status, Status::Exited { code: 0 }) {
                        ran += 1;
                    } else {
                        if refused < 3 {
                            eprintln!("g13 swap race: not run: {:?} {}", r.status, stderr(&r));
                        }
                        refused += 1;
                    }
                }
                Err(e) => {
                    if refused % 100 == 0 {
                        eprintln!("g13 swap race: refused: {e}");
                    }
                    refused += 1;
                }
            }
        }
    });
    stop.store(true, Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    eprintln!("g13 swap race: {ran} runs, {refused} refused or not started, {swaps} swaps");
    assert!(swaps > 50, "the race did not race: {swaps} swaps");
    assert!(ran > 0, "no run got through the race at all");
    let _ = std::fs::remove_dir_all(&ws);
    let _ = std::fs::remove_dir_all(&canary);
}

fn nix_uid() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:").and_then(|v| v.split_whitespace().next()).and_then(|v| v.parse().ok()))
        .unwrap()
}

fn git() -> Option<&'static str> {
    let found = ["/usr/bin/git", "/usr/local/bin/git"].into_iter().find(|g| Path::new(g).exists());
    if found.is_none() {
        assert!(std::env::var_os("STOCKADE_REQUIRE_ALL").is_none(), "git is not installed");
        eprintln!("SKIPPED: no git");
    }
    found
}

/// The host's own `git` in `dir`, with a fixed author; its stdout, after checking it succeeded.
fn host_git(git: &str, dir: &Path, args: &[&str]) -> String {
    let o = std::process::Command::new(git)
        .args(args)
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@x")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@x")
        .output()
        .unwrap();
    assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Finding 2: `.git/commondir` was not protected; git reads it in every repository and takes
/// `config` and `hooks` from where it points, so one run planted a `core.fsmonitor` that the
/// host's next `git status` ran. Judged by the host's own `git status` and a canary file.
#[test]
fn g10_new_git_entries_such_as_commondir_never_reach_the_hosts_git() {
    require!("g10_new_git_entries_such_as_commondir_never_reach_the_hosts_git");
    let Some(git) = git() else { return };
    let ws = host_dir("ws-commondir");
    let canary = std::env::temp_dir().join(format!("stockade-it-fsmonitor-canary-{}", std::process::id()));
    let _ = std::fs::remove_file(&canary);
    let host_git = |args: &[&str]| host_git(git, &ws, args);
    host_git(&["init", "-q", "-b", "main"]);
    let script = format!(
        "cd /workspace/.git && mkdir -p x && printf 'x\\n' > commondir && \
         printf '[core]\\n\\trepositoryformatversion = 0\\n\\tfsmonitor = touch {}\\n' > x/config && echo planted",
        canary.display()
    );
    let r = run(sh(&script).with_workspace(&ws, Access::ReadWrite).unwrap());
    assert_eq!(stdout(&r), "planted\n", "{}", stderr(&r));
    assert!(!ws.join(".git/commondir").exists(), "commondir stayed");
    assert_eq!(r.swept, [".git/commondir", ".git/x"]);
    host_git(&["status", "--short"]);
    assert!(!canary.exists(), "the host's git ran the guest's fsmonitor");
    let _ = std::fs::remove_dir_all(&ws);
}

/// Finding 6: a read-write run in a git worktree deleted the user's `.git` gitfile, even
/// `-- true`. Judged by the host's git in the worktree afterwards.
#[test]
fn g10_a_worktrees_gitfile_survives_a_run() {
    require!("g10_a_worktrees_gitfile_survives_a_run");
    let Some(git) = git() else { return };
    let repo = host_dir("ws-worktree-main");
    let wt = host_dir("ws-worktree");
    std::fs::remove_dir(&wt).unwrap();
    let g = |dir: &Path, args: &[&str]| host_git(git, dir, args);
    g(&repo, &["init", "-q", "-b", "main"]);
    std::fs::write(repo.join("a.txt"), "a\n").unwrap();
    g(&repo, &["add", "a.txt"]);
    g(&repo, &["commit", "-q", "-m", "one"]);
    g(&repo, &["worktree", "add", "-q", wt.to_str().unwrap()]);
    let gitfile = std::fs::read_to_string(wt.join(".git")).unwrap();
    let r = run(sh("true").with_workspace(&wt, Access::ReadWrite).unwrap());
    assert_eq!(r.status, Status::Exited { code: 0 }, "{}", stderr(&r));
    assert_eq!(std::fs::read_to_string(wt.join(".git")).unwrap(), gitfile, "the gitfile changed or vanished");
    assert!(r.swept.is_empty());
    assert_eq!(g(&wt, &["status", "--short"]), "");
    let _ = std::fs::remove_dir_all(&wt);
    let _ = std::fs::remove_dir_all(&repo);
}

/// Finding 3: run A created `.claude` (absent at A's start); run C started meanwhile, found it
/// present and bound it read-only; A's sweep removed it (detaching C's bind) and C planted
/// `.claude/settings.json`, which no sweep removed. Now runs of one read-write workspace take
/// turns, so C starts after A's sweep and its own sweep removes what it planted.
#[test]
fn g10_overlapping_runs_take_turns_and_nothing_planted_stays() {
    require!("g10_overlapping_runs_take_turns_and_nothing_planted_stays");
    let ws = host_dir("ws-overlap");
    let tier = tier();
    let started = std::time::Instant::now();
    let (a, c) = block_on(async {
        let a = sh("mkdir /workspace/.claude && sleep 1").with_workspace(&ws, Access::ReadWrite).unwrap();
        let c = sh("sleep 1.5; mkdir -p /workspace/.claude && echo '{\"hooks\":1}' > /workspace/.claude/settings.json && echo planted")
            .with_workspace(&ws, Access::ReadWrite)
            .unwrap();
        let run_a = tier.run(&a);
        let run_c = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            tier.run(&c).await
        };
        let (a, c) = tokio::join!(run_a, run_c);
        (a.unwrap(), c.unwrap())
    });
    assert_eq!(a.status, Status::Exited { code: 0 }, "{}", stderr(&a));
    assert_eq!(stdout(&c), "planted\n", "{}", stderr(&c));
    assert!(!ws.join(".claude").exists(), "a planted .claude stayed on the host");
    assert_eq!(c.swept, [".claude"]);
    // They took turns: side by side both would be done in about 1.8 s (C starts at 0.3 s and
    // sleeps 1.5 s); C waiting for A's end (1 s) and then running makes it at least 2.5 s.
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(2400), "the two runs overlapped: {took:?}");
    let _ = std::fs::remove_dir_all(&ws);
}

/// Finding 4: the sweep ran only when a run ended normally; a cancelled call (a dropped
/// future, as an MCP `notifications/cancelled` does) left what the guest planted.
#[test]
fn g10_a_cancelled_run_is_swept() {
    require!("g10_a_cancelled_run_is_swept");
    let ws = host_dir("ws-cancel");
    let tier = tier();
    let job = sh("mkdir /workspace/.claude && echo hook > /workspace/.claude/settings.json && echo x > /workspace/.envrc && sleep 30")
        .with_workspace(&ws, Access::ReadWrite)
        .unwrap();
    block_on(async {
        let cancelled = tokio::time::timeout(Duration::from_millis(1500), tier.run(&job)).await;
        assert!(cancelled.is_err(), "the run ended before it was cancelled");
    });
    assert!(!ws.join(".claude").exists(), "a cancelled run left .claude");
    assert!(!ws.join(".envrc").exists(), "a cancelled run left .envrc");
    let _ = std::fs::remove_dir_all(&ws);
}

/// A cancelled or timed-out run without a per-run cgroup was swept once its helper was
/// reaped; the helper is the parent of the run's pid 1, outside its pid namespace, so the
/// run's processes could still be running then (here, twenty sleepers with a marked command
/// line, and twenty writers re-creating `.envrc` as fast as they can) and put back what the
/// sweep had just removed. Judged on the host, in `/proc` the moment the run has returned,
/// and in the workspace again after a pause: nothing of the run is left.
#[test]
fn g10_a_run_without_a_cgroup_is_swept_after_its_last_process() {
    require!("g10_a_run_without_a_cgroup_is_swept_after_its_last_process");
    let ws = host_dir("ws-cancel-nocg");
    let tier = tier().without_cgroups();
    let script =
        "for i in $(seq 20); do sleep 987654 & (while :; do echo x > /workspace/.envrc; done) & done; sleep 30";
    fn marked(pid: &std::path::Path) -> bool {
        std::fs::read(pid.join("cmdline")).is_ok_and(|c| c == b"sleep\0987654\0")
    }
    fn alive() -> usize {
        std::fs::read_dir("/proc").unwrap().filter_map(Result::ok).filter(|e| marked(&e.path())).count()
    }
    for round in 0..6 {
        let cancel = round % 2 == 0;
        let mut job = sh(script).with_workspace(&ws, Access::ReadWrite).unwrap();
        if !cancel {
            let limits = job.limits().with_wall(Duration::from_millis(700)).unwrap();
            job = job.with_limits(limits);
        }
        let wait = if cancel { Duration::from_millis(700) } else { Duration::from_secs(20) };
        // While the run goes on, its marked sleepers are seen from the host (else the check
        // after it could not see them either).
        let seen = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(450));
            alive()
        });
        block_on(async {
            match tokio::time::timeout(wait, tier.run(&job)).await {
                Err(_) => assert!(cancel, "the run outlived its deadline"),
                Ok(r) => assert_eq!(r.unwrap().status, stockade_protocol::Status::TimedOut),
            }
        });
        assert!(seen.join().unwrap() > 0, "round {round}: the run's sleepers were never seen from the host");
        let how = if cancel { "cancelled" } else { "timed-out" };
        assert_eq!(alive(), 0, "round {round}: processes of a {how} run were still there when it returned");
        assert!(!ws.join(".envrc").exists(), "round {round}: a {how} run left .envrc");
        std::thread::sleep(Duration::from_millis(300));
        assert!(!ws.join(".envrc").exists(), "round {round}: a process of a {how} run wrote .envrc after the sweep");
    }
    let _ = std::fs::remove_dir_all(&ws);
}

/// Findings 7, 8 and 12: a socket whose name is not UTF-8 was not covered (the guest reached
/// a host daemon even read-only), a fifo was not covered at all (a host reader received the
/// guest's line), and each covered socket grew the helper's spec, so thousands of them
/// refused every later run. Judged by the listener and the fifo's reader on the host.
#[test]
fn g1_fifos_sockets_of_any_name_and_thousands_of_them_are_covered() {
    require!("g1_fifos_sockets_of_any_name_and_thousands_of_them_are_covered");
    let ws = host_dir("ws-specials");
    let odd = std::ffi::OsStr::from_bytes(b"odd-\xff.sock");
    let listener = UnixListener::bind(ws.join(odd)).unwrap();
    std::fs::set_permissions(ws.join(odd), std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    listener.set_nonblocking(true).unwrap();
    let status = std::process::Command::new("mkfifo").args(["-m", "0666"]).arg(ws.join("pipe")).status().unwrap();
    assert!(status.success());
    // The host's reader of the fifo, which must receive nothing.
    let mut reader = std::fs::OpenOptions::new().read(true).custom_flags_nonblock().open(ws.join("pipe")).unwrap();
    // Ten thousand more sockets (stale socket files count the same).
    std::fs::create_dir(ws.join("many")).unwrap();
    for i in 0..10_000 {
        drop(UnixListener::bind(ws.join(format!("many/s{i}"))).unwrap());
    }
    let body = r#"
import socket, os
def conn(p):
    s = socket.socket(socket.AF_UNIX)
    s.connect(p)
    s.send(b"guest bytes")
def fifo():
    fd = os.open("/workspace/pipe", os.O_WRONLY | os.O_NONBLOCK)
    os.write(fd, b"guest line\n")
attempt("odd", lambda: conn(b"/workspace/odd-\xff.sock"))
attempt("many", lambda: conn("/workspace/many/s9999"))
attempt("fifo", fifo)
"#;
    for access in [Access::ReadOnly, Access::ReadWrite] {
        let job = Job::command("/usr/bin/python3", ["-c", &format!("{}{body}", PROBE)]).unwrap();
        let r = run(job.with_workspace(&ws, access).unwrap());
        assert_eq!(r.status, Status::Exited { code: 0 }, "{access:?}: {}", stderr(&r));
        let view = r.enforcement.iter().find(|e| e.mechanism == Mechanism::MountNamespace).unwrap();
        assert!(view.detail.contains("and 9994 more"), "{}", view.detail);
    }
    // Judged by the host: the daemon got no connection, the fifo's reader no byte.
    assert!(listener.accept().is_err(), "a host daemon under a non-UTF-8 name was reached");
    let mut buf = [0u8; 64];
    match reader.read(&mut buf) {
        Ok(0) => {}
        Ok(n) => panic!("the host's fifo reader received {:?}", String::from_utf8_lossy(&buf[..n])),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "{e}"),
    }
    let _ = std::fs::remove_dir_all(&ws);
}

/// `O_NONBLOCK` for opening a fifo's read end without a writer.
trait NonBlock {
    fn custom_flags_nonblock(&mut self) -> &mut Self;
}

impl NonBlock for std::fs::OpenOptions {
    fn custom_flags_nonblock(&mut self) -> &mut Self {
        std::os::unix::fs::OpenOptionsExt::custom_flags(self, 0o4000)
    }
}

/// hold-the-line, finding 16: a root supervisor's helper dropped to host uid 65534 and
/// stayed dumpable for the whole run, while it held the model listener and (forked) a copy
/// of the supervisor's memory, so any host process of uid 65534 could read it. Judged from
/// the host's /proc: while the guest runs, every process of the run but the guest itself has
/// a root-owned /proc/PID/environ (the mark of a process that is not dumpable).
#[test]
fn g11_a_root_runs_helper_and_init_are_not_dumpable() {
    if !available("g11_a_root_runs_helper_and_init_are_not_dumpable") {
        return;
    }
    let _only_us = exclusive();
    if nix_uid() != 0 {
        eprintln!("SKIPPED g11_a_root_runs_helper_and_init_are_not_dumpable: not root");
        return;
    }
    let marker = format!("stockade-dumpable-{}", std::process::id());
    let job = sh(&format!("sleep 3; : {marker}"));
    let runner = std::thread::spawn(move || run(job));
    let me = std::process::id();
    let mut checked = None;
    for _ in 0..200 {
        std::thread::sleep(Duration::from_millis(20));
        let tree = stockade_test_support::descendants(me);
        let guest = tree.iter().find(|p| {
            std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains(&marker))
        });
        if let Some(guest) = guest {
            let _ = guest;
            // The guest's own processes (sh and its sleep) are dumpable, as any exec'd
            // program is; the rest of the tree is the run's helper and init.
            let comm = |p: &u32| std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
            let others: Vec<(u32, u32)> = tree
                .iter()
                .filter(|p| !["sh\n", "sleep\n"].contains(&comm(p).as_str()))
                // The files under /proc/PID (not the directory itself, which keeps the euid
                // for procps) are root's when a process is not dumpable.
                .filter_map(|p| {
                    std::fs::metadata(format!("/proc/{p}/environ"))
                        .ok()
                        .map(|m| (*p, std::os::unix::fs::MetadataExt::uid(&m)))
                })
                .collect();
            checked = Some(others);
            break;
        }
    }
    let others = checked.expect("the guest never appeared");
    assert!(others.len() >= 2, "the helper and init were not found: {others:?}");
    let described: Vec<String> = others
        .iter()
        .map(|(p, uid)| {
            let comm = std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
            format!("{p} {} uid {uid}", comm.trim())
        })
        .collect();
    assert!(others.iter().all(|(_, uid)| *uid == 0), "a process of the run is dumpable: {described:?}");
    let r = runner.join().unwrap();
    assert_eq!(r.status, Status::Exited { code: 0 }, "{}", stderr(&r));
}
