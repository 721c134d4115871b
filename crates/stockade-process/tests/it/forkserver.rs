//! G14: the fork server, from a real multi-threaded embedder (`stockade-process-embedder`:
//! a tokio program with worker threads that starts the server first in `main`). Everything
//! is judged from this test process: the server's descriptors and memory through `/proc`,
//! its life through its pid, each run's result through its report.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use stockade_process::{ForkServer, RunError};
use stockade_protocol::{Mechanism, Report, Status};

use crate::support::*;

/// A running embedder: its stdin for requests, its answers, and its fork server's pid.
struct Embedder {
    child: Child,
    input: Option<ChildStdin>,
    output: BufReader<std::process::ChildStdout>,
    server: u32,
}

impl Embedder {
    fn start(env: &[(&str, &str)]) -> Self {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_stockade-process-embedder"));
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let input = child.stdin.take();
        let mut output = BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        output.read_line(&mut first).unwrap();
        let v: Value = serde_json::from_str(&first).unwrap_or_else(|e| panic!("first line {first:?}: {e}"));
        assert!(v["threads"].as_u64().unwrap() > 1, "the embedder must be multi-threaded: {v}");
        let server = u32::try_from(v["fork_server"].as_u64().unwrap()).unwrap();
        Self { child, input, output, server }
    }

    fn send(&mut self, job: &stockade_protocol::Job, helper: &str) {
        self.request(&json!({ "job": job, "helper": helper }));
    }

    /// One request line, as it is.
    fn request(&mut self, line: &Value) {
        writeln!(self.input.as_mut().unwrap(), "{line}").unwrap();
    }

    /// The next `n` answers, by request line (1-based).
    fn answers(&mut self, n: usize) -> std::collections::BTreeMap<u64, Result<Report, String>> {
        let mut out = std::collections::BTreeMap::new();
        for _ in 0..n {
            let mut line = String::new();
            assert!(self.output.read_line(&mut line).unwrap() > 0, "the embedder ended early");
            let v: Value = serde_json::from_str(&line).unwrap();
            let answer = match v.get("report") {
                Some(r) => Ok(serde_json::from_value(r.clone()).unwrap()),
                None => Err(v["error"].as_str().unwrap().to_owned()),
            };
            out.insert(v["line"].as_u64().unwrap(), answer);
        }
        out
    }

    fn finish(mut self) {
        drop(self.input.take());
        assert!(self.child.wait().unwrap().success());
    }
}

fn mechanisms(r: &Report) -> Vec<Mechanism> {
    let mut m: Vec<Mechanism> = r.enforcement.iter().map(|e| e.mechanism).collect();
    m.sort_by_key(|m| format!("{m:?}"));
    m
}

/// Gone, or a zombie nobody has reaped yet: either way it runs nothing.
fn ended(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

#[test]
fn g14_start_refuses_a_multi_threaded_process() {
    // This test binary runs each test on a thread of its own, so it is never single-threaded.
    match ForkServer::start() {
        Err(RunError::Misconfigured(m)) => assert!(m.contains("single-threaded"), "{m}"),
        other => panic!("expected Misconfigured, got {other:?}"),
    }
    assert_eq!(ForkServer::pid(), None);
}

#[test]
fn g14_a_multi_threaded_embedder_launches_through_the_fork_server() {
    require!("g14_a_multi_threaded_embedder_launches_through_the_fork_server");
    let _g = shared();
    let mut e = Embedder::start(&[]);
    // `Helper::fork()` has no fallback, and the embedder has worker threads: a launch that
    // did not go through the server would fail with Misconfigured.
    for i in 0..16 {
        let job = sh("cat; echo; cat /proc/1/cmdline; echo; echo $PPID").with_stdin(format!("in-{i}")).unwrap();
        e.send(&job, "fork");
    }
    e.send(&sh("cat /proc/1/cmdline; echo; echo $PPID"), "exec");
    let answers = e.answers(17);
    let exec = answers[&17].as_ref().unwrap();
    for i in 0..16u64 {
        let r = answers[&(i + 1)].as_ref().unwrap_or_else(|err| panic!("run {i}: {err}"));
        assert_eq!(r.status, Status::Exited { code: 0 }, "{r:#?}");
        let out = stdout(r);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], format!("in-{i}"), "stdin is piped through: {out:?}");
        // pid 1 of the run shows the server's scrubbed command line, not the embedder's.
        assert!(lines[1].starts_with("stockade-sandbox-init (forked helper)"), "{out:?}");
        assert_eq!(mechanisms(r), mechanisms(exec), "the same mechanisms as an executed helper");
    }
    e.finish();
}

#[test]
fn g14_the_fork_server_holds_only_its_socket_and_none_of_the_environment() {
    require!("g14_the_fork_server_holds_only_its_socket_and_none_of_the_environment");
    let _g = shared();
    let canary = format!("stockade-canary-{}-{:?}", std::process::id(), Instant::now());
    let e = Embedder::start(&[("OPENAI_API_KEY", &canary)]);
    let pid = e.server;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(stat.lines().any(|l| l == "Threads:\t1"), "{stat}");
    let ppid: u32 = stat.lines().find_map(|l| l.strip_prefix("PPid:")).unwrap().trim().parse().unwrap();
    assert_eq!(ppid, e.child.id());
    let mut fds: Vec<(String, String)> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .map(|d| {
            let d = d.unwrap();
            (d.file_name().to_string_lossy().into_owned(), std::fs::read_link(d.path()).unwrap().display().to_string())
        })
        .collect();
    fds.sort();
    assert_eq!(fds.len(), 4, "{fds:?}");
    for (n, (fd, target)) in fds.iter().enumerate() {
        assert_eq!(fd, &n.to_string());
        if n < 3 {
            assert_eq!(target, "/dev/null", "{fds:?}");
        } else {
            assert!(target.starts_with("socket:["), "{fds:?}");
        }
    }
    // Its whole readable memory: the key the embedder was started with is not in it.
    let (found, scanned) = stockade_test_support::memory_holds(pid, canary.as_bytes());
    assert!(found.is_none(), "the environment's key is in the fork server's memory at {found:?}");
    assert!(scanned > 1 << 20, "scanned only {scanned} bytes of the server's memory");
    e.finish();
}

#[test]
fn g14_the_fork_server_dies_with_its_embedder() {
    require!("g14_the_fork_server_dies_with_its_embedder");
    let _g = shared();
    let mut e = Embedder::start(&[]);
    let (server, embedder) = (e.server, e.child.id());
    // A run in flight when the embedder dies goes with it too: its helper, init and guest.
    e.send(&sh("sleep 30"), "fork");
    let (tree, _) = sleeping_guest(embedder);
    assert!(tree.contains(&server) && tree.len() >= 4, "server, helper, init and guest: {tree:?}");
    stockade_test_support_kill(embedder);
    let _ = e.child.wait();
    let deadline = Instant::now() + Duration::from_secs(10);
    for pid in tree {
        while !ended(pid) {
            assert!(Instant::now() < deadline, "{pid} ({:?}) outlived the embedder", comm(pid));
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Once a run's guest `sleep` has started under `embedder`: the embedder's descendants and
/// the guest's pid.
fn sleeping_guest(embedder: u32) -> (Vec<u32>, u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let tree = stockade_test_support::descendants(embedder);
        if let Some(guest) = tree.iter().copied().find(|p| comm(*p).as_deref() == Some("sleep")) {
            return (tree, guest);
        }
        assert!(Instant::now() < deadline, "the run never started: {tree:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// After the server is gone (killed, or handed over), with the next request line `line`:
/// `Helper::fork()` (no fallback, multi-threaded) is refused by name, and `prefer_fork`
/// executes the helper binary. Returns the executed run's report.
fn later_launches_fall_back(e: &mut Embedder, line: u64) -> Report {
    e.send(&sh("echo two"), "fork");
    let refused = e.answers(1).remove(&line).unwrap().expect_err("no server and no fallback");
    assert!(refused.contains("no fork server"), "{refused}");
    e.send(&sh("echo three"), "prefer");
    let executed = e.answers(1).remove(&(line + 1)).unwrap().unwrap();
    assert_eq!((stdout(&executed).as_str(), &executed.status), ("three\n", &Status::Exited { code: 0 }));
    executed
}

fn comm(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).ok().map(|c| c.trim().to_owned())
}

#[test]
fn g14_a_killed_fork_server_fails_one_launch_by_name_then_launches_fall_back() {
    require!("g14_a_killed_fork_server_fails_one_launch_by_name_then_launches_fall_back");
    let _g = shared();
    let mut e = Embedder::start(&[]);
    stockade_test_support_kill(e.server);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ended(e.server) {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    }
    e.send(&sh("echo one"), "fork");
    let first = e.answers(1).remove(&1).unwrap();
    let err = first.expect_err("the launch that finds the server gone fails");
    assert!(err.contains("fork server") && err.contains(&e.server.to_string()), "{err}");
    later_launches_fall_back(&mut e, 2);
    e.finish();
}

#[test]
fn g14_a_handed_over_server_becomes_the_next_runs_helper_then_launches_fall_back() {
    require!("g14_a_handed_over_server_becomes_the_next_runs_helper_then_launches_fall_back");
    let _g = shared();
    let mut e = Embedder::start(&[]);
    let (server, embedder) = (e.server, e.child.id());
    e.request(&json!({ "job": sh("cat /proc/1/cmdline; echo; exec sleep 30"), "helper": "fork", "hand_over": true }));
    // Judged from here while it runs: the server's own process is the run's helper (the
    // parent of the run's pid 1), and the embedder has no other child.
    let (_, guest) = sleeping_guest(embedder);
    let parent = |pid| stockade_test_support::parent_of(pid).unwrap();
    assert_eq!(parent(parent(guest)), server, "the run's pid 1 is the server's child");
    assert_eq!(stockade_test_support::children(embedder), vec![server], "no helper was cloned beside the server");
    stockade_test_support_kill(guest);
    let first = e.answers(1).remove(&1).unwrap().unwrap();
    assert!(stdout(&first).starts_with("stockade-sandbox-init (forked helper)"), "{first:#?}");
    // The run's end reaped it: once the report is out, nothing of the server is left.
    assert!(std::fs::metadata(format!("/proc/{server}")).is_err(), "the server outlived its run");
    // Later launches fall back, and the executed one has the handed-over run's mechanisms.
    let executed = later_launches_fall_back(&mut e, 2);
    assert_eq!(mechanisms(&first), mechanisms(&executed), "the same mechanisms as an executed helper");
    e.finish();
}

/// SIGKILL to a process this test started (directly or as the embedder's server).
fn stockade_test_support_kill(pid: u32) {
    let status = Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap();
    assert!(status.success());
}
