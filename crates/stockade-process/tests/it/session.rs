//! G17: sessions (`ProcessTier::session`). Judged from this test process: the host's `/proc`
//! for the session's processes and their confinement, the session's home directory on the
//! host, and the cgroup filesystem; never from what the guest says alone.

use std::time::Duration;

use stockade_process::{ExecOptions, ProcessSession, SessionConfig};
use stockade_protocol::{Job, Limits, LiveIo, Mechanism, Report, Status};

use crate::support::*;

fn config(home: &std::path::Path) -> SessionConfig {
    SessionConfig { limits: Limits::default(), home: Some(home.to_path_buf()), ..SessionConfig::default() }
}

async fn sh(session: &ProcessSession, script: &str) -> Report {
    session.exec(&Job::command("sh", ["-c", script]).unwrap(), None, LiveIo::default()).await.unwrap()
}

async fn session_py(session: &ProcessSession, code: &str) -> Report {
    let job = Job::command("python3", ["-c", code]).unwrap();
    session.exec(&job, None, LiveIo::default()).await.unwrap()
}

fn stdout(r: &Report) -> String {
    String::from_utf8_lossy(&r.stdout.bytes).into_owned()
}

/// Host pids of this test process's descendants whose command name is `comm`.
fn named(comm: &str) -> Vec<u32> {
    stockade_test_support::descendants(std::process::id())
        .into_iter()
        .filter(|p| std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == comm))
        .collect()
}

fn status_field(pid: u32, field: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix(&format!("{field}:"))).unwrap_or_default().trim().to_owned()
}

#[test]
fn g17_files_processes_and_tmp_persist_between_execs_and_die_with_the_session() {
    // Exclusive: it counts every process this test process has.
    if !available("g17_files_processes_and_tmp_persist_between_execs_and_die_with_the_session") {
        return;
    }
    let _g = exclusive();
    let home = host_dir("session-home");
    block_on(async {
        let session = tier().session(config(&home)).await.unwrap();
        let first = sh(
            &session,
            "echo kept > /tmp/t; echo mine > note.txt; pwd; (exec sleep 300 < /dev/null > /dev/null 2>&1 &); echo started",
        )
        .await;
        assert_eq!(first.status, Status::Exited { code: 0 }, "{first:?}");
        assert_eq!(stdout(&first), "/home/user\nstarted\n");
        assert_eq!(first.stderr.bytes, b"", "{}", String::from_utf8_lossy(&first.stderr.bytes));
        // The home is the host directory: the file is there, judged from the host.
        assert_eq!(std::fs::read_to_string(home.join("note.txt")).unwrap(), "mine\n");
        // The background process outlives its exec, confined like any guest. (The report can
        // come before the background child has exec'd `sleep`.)
        stockade_test_support::eventually(Duration::from_secs(5), "the background sleep runs", || {
            !named("sleep").is_empty()
        });
        let sleepers = named("sleep");
        assert_eq!(sleepers.len(), 1, "one background sleep in the session: {sleepers:?}");
        let pid = sleepers[0];
        assert_eq!(status_field(pid, "NoNewPrivs"), "1");
        assert_eq!(status_field(pid, "Seccomp"), "2");
        // The session's filter, inherited from init, not installed again on top.
        assert_eq!(status_field(pid, "Seccomp_filters"), "1");
        assert_eq!(status_field(pid, "CapEff"), "0000000000000000");
        // Its parent (it was orphaned) is the session's init, which is under the same filters.
        let init: u32 = status_field(pid, "PPid").parse().unwrap();
        assert_eq!(status_field(init, "NSpid").split_whitespace().last(), Some("1"), "the sleep's parent is init");
        assert_eq!((status_field(init, "Seccomp"), status_field(init, "Seccomp_filters")), ("2".into(), "1".into()));
        // Listed from the host: the sleep, with its pid inside the session and on the host.
        let listed = session.processes();
        let sleep = listed.iter().find(|p| p.cmdline == "sleep 300").expect("the sleep is listed");
        assert_eq!(sleep.host_pid, pid);
        assert!(sleep.pid > 1 && sleep.pid < 100, "{listed:?}");
        let second = sh(&session, "cat /tmp/t note.txt; pgrep -c sleep || ps -e | grep -c sleep").await;
        assert_eq!(second.status, Status::Exited { code: 0 }, "{second:?}");
        assert_eq!(stdout(&second), "kept\nmine\n1\n");
        // A later exec may signal what an earlier one left running (one landlock domain for
        // the session's execs), as on one machine; judged from the host.
        let third = sh(&session, "kill $(pgrep -x sleep) && echo killed").await;
        assert_eq!(stdout(&third), "killed\n", "{third:?}");
        stockade_test_support::eventually(Duration::from_secs(5), "the signalled sleep is gone", || {
            named("sleep").is_empty()
        });
        let _ = session.kill().await;
        // Nothing of the session is left: no process, whatever it started.
        assert!(named("sleep").is_empty(), "the background sleep died with the session");
        assert!(stockade_test_support::descendants(std::process::id()).is_empty(), "no process of the session is left");
    });
    let _ = std::fs::remove_dir_all(&home);
}

#[test]
fn g17_a_read_write_workspace_is_swept_after_each_exec_and_between_them() {
    if !available("g17_a_read_write_workspace_is_swept_after_each_exec_and_between_them") {
        return;
    }
    let _g = shared();
    let home = host_dir("sweep-home");
    let ws = host_dir("sweep-ws");
    block_on(async {
        let workspace =
            stockade_protocol::Workspace::new(&ws, stockade_protocol::Access::ReadWrite, stockade_protocol::Busy::Wait)
                .unwrap();
        let session = tier().session(SessionConfig { workspace: Some(workspace), ..config(&home) }).await.unwrap();
        // Planted by an exec: gone from the host when the exec's report comes, and named there.
        let r = sh(&session, "echo evil > /workspace/.bashrc; echo kept > /workspace/notes.txt").await;
        assert_eq!(r.status, Status::Exited { code: 0 }, "{r:?}");
        assert_eq!(r.swept, [".bashrc"], "{r:?}");
        assert!(!ws.join(".bashrc").exists());
        assert_eq!(std::fs::read_to_string(ws.join("notes.txt")).unwrap(), "kept\n");
        // Planted by a process the exec left behind, after the exec ended: swept by the
        // heartbeat with no exec running, judged from the host, and named in the next
        // exec's report. Ordered by events, not by time: the process plants only once the
        // host says the exec has reported (`go`), and says when it has (`planted`).
        let r = sh(
            &session,
            "(while [ ! -e /workspace/go ]; do sleep 0.05; done; echo evil > /workspace/.bashrc; touch /workspace/planted) > /dev/null 2>&1 &",
        )
        .await;
        assert_eq!(r.swept, Vec::<String>::new(), "{r:?}");
        std::fs::write(ws.join("go"), "").unwrap();
        let swept = async {
            while !ws.join("planted").exists() || ws.join(".bashrc").exists() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        // The bound is the failure's only (a sweep that never comes): the heartbeat is 1 s.
        tokio::time::timeout(Duration::from_secs(60), swept).await.expect("a planted path was never swept");
        let r = sh(&session, "true").await;
        assert_eq!(r.swept, [".bashrc"], "{r:?}");
        session.kill().await;
    });
    assert!(!ws.join(".bashrc").exists());
}

#[test]
fn g17_each_exec_has_its_own_stdin_env_exit_code_and_deadline() {
    require!("g17_each_exec_has_its_own_stdin_env_exit_code_and_deadline");
    let home = host_dir("session-exec");
    block_on(async {
        let session = tier().session(config(&home)).await.unwrap();
        let job = Job::command("sh", ["-c", "read line; echo \"$line $GREETING\" ; echo oops >&2; exit 3"])
            .unwrap()
            .with_stdin(b"hello\n".to_vec())
            .unwrap()
            .with_env("GREETING", "world")
            .unwrap();
        let r = session.exec(&job, Some("/tmp"), LiveIo::default()).await.unwrap();
        assert_eq!(r.status, Status::Exited { code: 3 });
        assert_eq!(stdout(&r), "hello world\n");
        assert_eq!(r.stderr.bytes, b"oops\n");
        // The environment was the exec's alone: the next exec does not see GREETING.
        let r = sh(&session, "echo \"[$GREETING]\"; pwd").await;
        assert_eq!(stdout(&r), "[]\n/home/user\n");
        // A deadline kills that exec, not the session.
        let slow = Job::command("sleep", ["30"])
            .unwrap()
            .with_limits(Limits::default().with_wall(Duration::from_millis(300)).unwrap());
        let r = session.exec(&slow, None, LiveIo::default()).await.unwrap();
        assert_eq!(r.status, Status::TimedOut);
        let r = sh(&session, "echo still here").await;
        assert_eq!(r.status, Status::Exited { code: 0 });
        assert_eq!(stdout(&r), "still here\n");
        let _ = session.kill().await;
    });
    let _ = std::fs::remove_dir_all(&home);
}

#[test]
fn g17_two_sessions_do_not_see_each_other() {
    require!("g17_two_sessions_do_not_see_each_other");
    let (ha, hb) = (host_dir("session-a"), host_dir("session-b"));
    block_on(async {
        let a = tier().session(config(&ha)).await.unwrap();
        let b = tier().session(config(&hb)).await.unwrap();
        let r = sh(&a, "echo a > /tmp/mark; (exec sleep 300 < /dev/null > /dev/null 2>&1 &); echo ok").await;
        assert_eq!(stdout(&r), "ok\n");
        // An abstract unix socket listening in A: A's own next exec reaches it, B does not.
        let listen = "import os, socket, sys\nif os.fork() == 0:\n    os.setsid()\n    s = socket.socket(socket.AF_UNIX)\n    s.bind('\\0stockade-g17')\n    s.listen()\n    while True:\n        c, _ = s.accept(); c.send(b'hello'); c.close()\nelse:\n    import time; time.sleep(0.3); print('listening')";
        let r = session_py(&a, listen).await;
        assert_eq!(stdout(&r), "listening\n", "{r:?}");
        let connect = "import socket\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect('\\0stockade-g17'); print(s.recv(5).decode())\nexcept OSError as e:\n    print(type(e).__name__)";
        let r = session_py(&a, connect).await;
        assert_eq!(stdout(&r), "hello\n", "A reaches its own abstract socket: {r:?}");
        let r = session_py(&b, connect).await;
        assert_eq!(stdout(&r), "ConnectionRefusedError\n", "B does not reach A's abstract socket: {r:?}");
        // A TCP server on A's loopback: A's next exec reaches it; B, on a loopback of its
        // own, does not; nor does the host (judged here, from this test process).
        let port = 48_000 + (std::process::id() % 1000) as u16;
        let serve = format!(
            "import os, socket, time\nif os.fork() == 0:\n    os.setsid()\n    s = socket.socket()\n    s.bind(('127.0.0.1', {port}))\n    s.listen()\n    while True:\n        c, _ = s.accept(); c.send(b'tcp'); c.close()\nelse:\n    time.sleep(0.3); print('serving')"
        );
        let r = session_py(&a, &serve).await;
        assert_eq!(stdout(&r), "serving\n", "{r:?}");
        let reach = format!(
            "import socket\ntry:\n    s = socket.create_connection(('127.0.0.1', {port}), timeout=2); print(s.recv(3).decode())\nexcept OSError as e:\n    print(type(e).__name__)"
        );
        let r = session_py(&a, &reach).await;
        assert_eq!(stdout(&r), "tcp\n", "A reaches its own server: {r:?}");
        let r = session_py(&b, &reach).await;
        assert_eq!(stdout(&r), "ConnectionRefusedError\n", "B does not reach A's server: {r:?}");
        assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err(), "the host does not reach A's server");
        // B sees neither A's /tmp nor A's processes (its /proc lists only its own).
        let r = sh(&b, "cat /tmp/mark 2>&1; ls /proc | grep -c '^[0-9]'").await;
        assert!(stdout(&r).contains("No such file"), "{}", stdout(&r));
        // init, sh and ls (and the grep): never A's sleep or server.
        let count: u32 = stdout(&r).lines().last().unwrap().trim().parse().unwrap();
        assert!(count <= 4, "session B's /proc lists only its own processes: {count}");
        let _ = a.kill().await;
        let _ = b.kill().await;
    });
    let _ = (std::fs::remove_dir_all(&ha), std::fs::remove_dir_all(&hb));
}

#[test]
fn g17_an_exec_ends_with_its_output_while_a_background_process_holds_its_pipes() {
    require!("g17_an_exec_ends_with_its_output_while_a_background_process_holds_its_pipes");
    let home = host_dir("session-holder");
    block_on(async {
        let session = tier().session(config(&home)).await.unwrap();
        // The background sleep keeps stdout and stderr open (as `server &` does).
        let start = std::time::Instant::now();
        let r = sh(&session, "echo before; echo warn >&2; sleep 300 & echo after").await;
        assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
        assert_eq!(r.status, Status::Exited { code: 0 });
        assert_eq!(stdout(&r), "before\nafter\n");
        assert_eq!(r.stderr.bytes, b"warn\n");
        let r = sh(&session, "pgrep -c sleep || ps -e | grep -c sleep").await;
        assert_eq!(stdout(&r), "1\n", "the background process lives on in the session");
        let _ = session.kill().await;
    });
    let _ = std::fs::remove_dir_all(&home);
}

#[test]
fn g17_an_exec_that_cannot_start_names_its_step_and_the_session_goes_on() {
    require!("g17_an_exec_that_cannot_start_names_its_step_and_the_session_goes_on");
    let home = host_dir("session-nostart");
    block_on(async {
        let session = tier().session(config(&home)).await.unwrap();
        let reason = |r: &Report| match &r.status {
            Status::FailedToStart { reason } => reason.clone(),
            other => panic!("expected a failure to start, got {other:?}"),
        };
        let none = LiveIo::default;
        // Found by init before a guest is made.
        let r =
            session.exec(&Job::command("no-such-program", Vec::<String>::new()).unwrap(), None, none()).await.unwrap();
        assert_eq!(reason(&r), "exec: no-such-program: not found in the sandbox view", "{r:?}");
        // Failed in the spawned guest: its working directory, then the exec itself. The steps
        // before the failed one are reported as enforced, the ones after it are not.
        let r =
            session.exec(&Job::command("true", Vec::<String>::new()).unwrap(), Some("/nowhere"), none()).await.unwrap();
        assert!(reason(&r).starts_with("guest: chdir /nowhere: No such file or directory"), "{r:?}");
        let mechanisms: Vec<_> = r.enforcement.iter().map(|e| e.mechanism).collect();
        assert!(mechanisms.contains(&Mechanism::Rlimits) && mechanisms.contains(&Mechanism::Seccomp), "{r:?}");
        let r = session.exec(&Job::command("/etc/passwd", Vec::<String>::new()).unwrap(), None, none()).await.unwrap();
        assert!(reason(&r).starts_with("exec: /etc/passwd: Permission denied"), "{r:?}");
        // Nothing is left of them, judged from the host, and the session serves the next exec.
        assert!(session.processes().is_empty(), "{:?}", session.processes());
        let r = sh(&session, "echo still here").await;
        assert_eq!((r.status.clone(), stdout(&r)), (Status::Exited { code: 0 }, "still here\n".into()), "{r:?}");
        let _ = session.kill().await;
    });
    let _ = std::fs::remove_dir_all(&home);
}

/// User plus system CPU ticks of `pid`, from the host's `/proc/PID/stat`.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = stat.rsplit_once(')').unwrap().1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

#[test]
fn g17_a_paused_session_uses_no_cpu_takes_no_exec_and_its_deadlines_stop() {
    require!("g17_a_paused_session_uses_no_cpu_takes_no_exec_and_its_deadlines_stop");
    let home = host_dir("session-pause");
    let marker = format!("spin{}", std::process::id());
    block_on(async {
        let session = tier().session(config(&home)).await.unwrap();
        let r =
            sh(&session, &format!("(exec sh -c 'while :; do :; done' {marker} </dev/null >/dev/null 2>&1 &)")).await;
        assert_eq!(r.status, Status::Exited { code: 0 });
        // The exec's report can come before the background child has exec'd the spinner
        // (its output is already /dev/null): wait for it to show from the host.
        stockade_test_support::eventually(Duration::from_secs(5), "the spinner is running", || {
            host_pids_with(&marker).len() == 1
        });
        let spinner = host_pids_with(&marker);
        let pid = spinner[0];
        session.pause().unwrap();
        assert!(session.paused());
        let before = cpu_ticks(pid);
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(cpu_ticks(pid), before, "a paused session's spinner used CPU");
        let e = session.exec(&Job::command("true", Vec::<String>::new()).unwrap(), None, LiveIo::default()).await;
        assert!(e.unwrap_err().to_string().contains("paused"));
        session.resume().unwrap();
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(cpu_ticks(pid) > before, "the resumed spinner runs again");
        // An exec whose 1.5 s deadline would pass during a 1.5 s pause finishes normally.
        let slow = Job::command("sleep", ["1"])
            .unwrap()
            .with_limits(Limits::default().with_wall(Duration::from_millis(1500)).unwrap());
        let pausing = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            session.pause().unwrap();
            tokio::time::sleep(Duration::from_millis(1500)).await;
            session.resume().unwrap();
        };
        let (r, ()) = tokio::join!(session.exec(&slow, None, LiveIo::default()), pausing);
        let r = r.unwrap();
        assert_eq!(r.status, Status::Exited { code: 0 }, "{r:?}");
        assert!(r.wall > Duration::from_millis(1500), "{:?}", r.wall);
        // A paused session dies at its kill (frozen processes are thawed so the kill lands).
        session.pause().unwrap();
        let _ = session.kill().await;
        assert!(host_pids_with(&marker).is_empty(), "the frozen spinner died with the session");
    });
    let _ = std::fs::remove_dir_all(&home);
}

/// A live copy of an exec's output, shared with the test.
#[derive(Clone, Default)]
struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Shared {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Shared {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    async fn wait_for(&self, what: &str) {
        let start = std::time::Instant::now();
        while !self.text().contains(what) {
            assert!(start.elapsed() < Duration::from_secs(20), "no {what:?} in {:?}", self.text());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[test]
fn g18_a_started_exec_names_its_pid_at_once_and_takes_a_signal_to_its_process_group() {
    require!("g18_a_started_exec_names_its_pid_at_once_and_takes_a_signal_to_its_process_group");
    let home = host_dir("session-started");
    block_on(async {
        let session = tier().session(config(&home)).await.unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let opts = ExecOptions { started: Some(tx), ..ExecOptions::default() };
        // The exec's shell waits on a child of its own: the signal goes to its process group.
        let job = Job::command("sh", ["-c", "sleep 300 & wait"]).unwrap();
        let exec = session.exec_with(&job, None, LiveIo::default(), opts);
        let control = async {
            let started = rx.await.expect("told of the exec's start");
            // The pid names that exec's shell in the session, judged from the host's /proc.
            // (Told at the fork, it may still be init's copy for a moment: then the shell.)
            let shell = std::cell::RefCell::new(None);
            stockade_test_support::eventually(Duration::from_secs(5), "the pid is the exec's shell", || {
                let found = session.processes().into_iter().find(|p| p.pid == started.pid);
                let ok = found.as_ref().is_some_and(|p| p.cmdline == "sh -c sleep 300 & wait");
                *shell.borrow_mut() = found;
                ok
            });
            let shell = shell.into_inner().unwrap();
            let nspid = status_field(shell.host_pid, "NSpid");
            assert_eq!(nspid.split_whitespace().last(), Some(started.pid.to_string().as_str()));
            stockade_test_support::eventually(Duration::from_secs(5), "the sleep runs", || !named("sleep").is_empty());
            session.signal(started.id, 15);
            stockade_test_support::eventually(Duration::from_secs(5), "the signalled group is gone", || {
                named("sleep").is_empty()
            });
        };
        let (report, ()) = tokio::join!(exec, control);
        let report = report.unwrap();
        assert_eq!(report.status, Status::Signaled { signal: 15 }, "{report:?}");
        // The session goes on.
        assert_eq!(stdout(&sh(&session, "echo on").await), "on\n");
        let _ = session.kill().await;
    });
    let _ = std::fs::remove_dir_all(&home);
}

#[test]
fn g18_a_pty_exec_has_a_controlling_terminal_that_resizes_and_takes_typed_input() {
    require!("g18_a_pty_exec_has_a_controlling_terminal_that_resizes_and_takes_typed_input");
    let home = host_dir("session-pty");
    block_on(async {
        let session = tier().session(config(&home)).await.unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let opts = ExecOptions { pty: Some((24, 80)), started: Some(tx), ..ExecOptions::default() };
        let out = Shared::default();
        let (mut typed, input) = tokio::io::duplex(1024);
        let io = LiveIo { stdin: Some(Box::new(input)), stdout: Some(Box::new(out.clone())), ..LiveIo::default() };
        // The trap runs between two waits of the loop (bash runs traps between commands).
        let script = "trap 'echo winch; stty size' WINCH; test -t 0 && test -t 1 && test -t 2 && echo terminal; \
                      stty size; until read -t 0.2 line; do :; done; echo \"got $line\"";
        let job = Job::command("bash", ["-c", script]).unwrap();
        let exec = session.exec_with(&job, None, io, opts);
        let control = async {
            let started = rx.await.expect("told of the exec's start");
            out.wait_for("24 80").await;
            // Its controlling terminal, judged from the host: `tty_nr` in /proc/PID/stat.
            let host = session.processes().into_iter().find(|p| p.pid == started.pid).unwrap().host_pid;
            let stat = std::fs::read_to_string(format!("/proc/{host}/stat")).unwrap();
            let after = &stat[stat.rfind(')').unwrap() + 2..];
            let tty_nr: i64 = after.split_whitespace().nth(4).unwrap().parse().unwrap();
            assert_ne!(tty_nr, 0, "the exec has a controlling terminal: {stat}");
            started.terminal.as_ref().expect("a terminal").resize(40, 120).unwrap();
            out.wait_for("40 120").await;
            use tokio::io::AsyncWriteExt;
            typed.write_all(b"hello\n").await.unwrap();
        };
        let (report, ()) = tokio::join!(exec, control);
        let report = report.unwrap();
        assert_eq!(report.status, Status::Exited { code: 0 }, "{report:?}");
        let text = stdout(&report).replace("\r\n", "\n");
        // Echo is on, as in a terminal someone types into: the typed line comes back (from
        // the line discipline, before bash reads it), then bash's answer.
        assert_eq!(text, "terminal\n24 80\nwinch\n40 120\nhello\ngot hello\n", "{report:?}");
        let _ = session.kill().await;
    });
    let _ = std::fs::remove_dir_all(&home);
}

#[test]
fn g18_a_drained_exec_goes_on_past_its_output_budget_and_keeps_its_first_bytes() {
    require!("g18_a_drained_exec_goes_on_past_its_output_budget_and_keeps_its_first_bytes");
    let home = host_dir("session-drain");
    block_on(async {
        let session = tier().session(config(&home)).await.unwrap();
        let job = Job::command("sh", ["-c", "head -c 100000 /dev/zero | tr '\\0' x; echo; echo done >&2"])
            .unwrap()
            .with_limits(Limits::default().with_stdout(1024).unwrap());
        let live = Shared::default();
        let io = LiveIo { stdout: Some(Box::new(live.clone())), ..LiveIo::default() };
        let opts = ExecOptions { output: stockade_protocol::CaptureMode::Drain, ..ExecOptions::default() };
        let r = session.exec_with(&job, None, io, opts).await.unwrap();
        assert_eq!(r.status, Status::Exited { code: 0 }, "{r:?}");
        assert_eq!(r.stdout.bytes.len(), 1024);
        assert_eq!(r.stderr.bytes, b"done\n");
        // The live copy saw every byte.
        assert_eq!(live.text().len(), 100_001);
        // The default fails fast, as a run does.
        let r = session.exec(&job, None, LiveIo::default()).await.unwrap();
        assert_eq!(r.status, Status::OutputLimit { stream: stockade_protocol::Stream::Stdout }, "{r:?}");
        let _ = session.kill().await;
    });
    let _ = std::fs::remove_dir_all(&home);
}

#[test]
fn g19_a_home_mount_caps_the_home_and_is_gone_when_dropped_or_unmounted_under() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use stockade_test_support::mounts_under;
    let dir = std::env::temp_dir().join(format!("stockade-process-g19-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let home = dir.join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o750)).unwrap();
    let root = std::fs::metadata("/proc/self").unwrap().uid() == 0;
    let mounted = stockade_process::HomeMount::mount(&home, 1 << 20);
    if !root {
        let err = mounted.unwrap_err();
        assert!(
            matches!(err, stockade_protocol::RunError::Unsupported { ref mechanism, .. } if mechanism == "session disk limit"),
            "{err}"
        );
        return;
    }
    let mount = mounted.unwrap();
    // Judged from the host's mount table; the tmpfs keeps the directory's owner and mode.
    assert_eq!(mounts_under(&dir), std::slice::from_ref(&home));
    assert_eq!(std::fs::metadata(&home).unwrap().mode() & 0o7777, 0o750);
    std::fs::write(home.join("fits"), vec![0u8; 512 << 10]).unwrap();
    let err = std::fs::write(home.join("big"), vec![0u8; 2 << 20]).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    drop(mount);
    assert!(mounts_under(&dir).is_empty(), "unmounted when dropped");
    assert!(!home.join("fits").exists(), "what was on the tmpfs is gone with it");
    // What a killed owner left mounted: unmounted under its directory, deepest first.
    let left = stockade_process::HomeMount::mount(&home, 1 << 20).unwrap();
    std::mem::forget(left);
    assert_eq!(stockade_process::unmount_under(&dir), 1);
    assert!(mounts_under(&dir).is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
    // A size of 0 is a misconfiguration, not an unbounded home.
    std::fs::create_dir_all(&home).unwrap();
    assert!(matches!(stockade_process::HomeMount::mount(&home, 0), Err(stockade_protocol::RunError::Misconfigured(_))));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn g20_a_session_s_guest_runs_as_the_host_id_it_is_given_and_is_nobody_inside() {
    require!("g20_a_session_s_guest_runs_as_the_host_id_it_is_given_and_is_nobody_inside");
    const ID: u32 = 0x5AF0_FFF0;
    let home = host_dir("session-guest-id");
    block_on(async {
        // Root only can run a guest as another user, and never as root.
        let zero = tier().session(SessionConfig { guest_id: Some(0), ..config(&home) }).await;
        assert!(matches!(zero, Err(stockade_protocol::RunError::Misconfigured(_))), "{zero:?}");
        let session = tier().session(SessionConfig { guest_id: Some(ID), ..config(&home) }).await.unwrap();
        let r = sh(
            &session,
            "(exec sleep 3141 </dev/null >/dev/null 2>&1 &); id -u; echo x > mine.txt; stat -c %u mine.txt",
        )
        .await;
        assert_eq!(r.status, Status::Exited { code: 0 }, "{r:?}");
        // Inside: nobody, owning what it wrote.
        assert_eq!(stdout(&r), "65534\n65534\n");
        // On the host: the sleep runs as the id given; the file it wrote belongs to root.
        let pid = std::cell::Cell::new(0);
        stockade_test_support::eventually(Duration::from_secs(5), "the sleep runs", || {
            let found = stockade_test_support::descendants(std::process::id())
                .into_iter()
                .find(|p| std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| c == b"sleep\x003141\x00"));
            pid.set(found.unwrap_or(0));
            found.is_some()
        });
        let uids = status_field(pid.get(), "Uid");
        assert!(uids.split_whitespace().all(|u| u == ID.to_string()), "{uids}");
        let gids = status_field(pid.get(), "Gid");
        assert!(gids.split_whitespace().all(|g| g == ID.to_string()), "{gids}");
        assert_eq!(std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(home.join("mine.txt")).unwrap()), 0);
        let enforced = session.enforced().iter().map(|e| e.detail.clone()).collect::<Vec<_>>().join("\n");
        assert!(enforced.contains(&format!("host uid {ID}")), "{enforced}");
        session.kill().await;
    });
}
