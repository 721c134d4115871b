//! G15: pre-built sandboxes (`ProcessTier::pool`). Judged from this test process: each
//! run's report, the host's `/proc` for processes and mounts, and the cgroup filesystem.

use std::collections::BTreeSet;
use std::time::Duration;

use stockade_process::{ProcessTier, RunError, stale_cgroups};
use stockade_protocol::{Access, Limits, Mechanism, Report, Status};

use stockade_test_support::eventually;

use crate::support::*;

/// How long a pool's background work may take to show on the host.
const WITHIN: Duration = Duration::from_secs(5);

fn pooled(n: usize) -> ProcessTier {
    tier().pool(n)
}

fn mechanisms(r: &Report) -> BTreeSet<String> {
    r.enforcement.iter().map(|e| format!("{:?}", e.mechanism)).collect()
}

/// Processes whose parent chain leads to this test process (its runs' helpers, inits and
/// guests; the test harness starts no other child).
fn descendants() -> Vec<u32> {
    stockade_test_support::descendants(std::process::id())
}

/// Whether `now` holds nothing that `before` did not: what the test's runs made is gone. An
/// earlier test's pool may still be ending a replacement it was building (so `before` can
/// hold what goes away meanwhile); that is not this test's to wait for, and an equality would
/// wait for it for ever.
fn none_added<T: PartialEq>(before: &[T], now: Vec<T>) -> bool {
    now.iter().all(|x| before.contains(x))
}

/// This process's per-run cgroups (named `stockade-PID-...`) in the v1 pids hierarchy, or
/// the v2 directory.
fn own_cgroups() -> Vec<String> {
    let prefix = format!("stockade-{}-", std::process::id());
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let parent = own.lines().find_map(|l| {
        let mut p = l.splitn(3, ':');
        let (_, ctrls, path) = (p.next()?, p.next()?, p.next()?);
        ctrls.split(',').any(|c| c == "pids").then(|| format!("/sys/fs/cgroup/pids{path}"))
    });
    let Some(parent) = parent else { return Vec::new() };
    let mut out: Vec<String> = std::fs::read_dir(parent)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&prefix))
        .collect();
    out.sort();
    out
}

/// The host's mount table: each mount's point, source and type (the ids change with any
/// remount, so they are left out). A failure shows what differs, since anything that
/// mounts on the host meanwhile (a docker engine starting a container) changes it too.
fn mounts() -> std::collections::BTreeMap<String, usize> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    table
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let after = f.iter().position(|x| *x == "-").map_or(&[][..], |i| &f[i + 1..]);
            format!("{} {}", f.get(4).unwrap_or(&""), after.iter().take(2).copied().collect::<Vec<_>>().join(" "))
        })
        .fold(std::collections::BTreeMap::new(), |mut m, k| {
            *m.entry(k).or_insert(0) += 1;
            m
        })
}

#[test]
fn g15_a_pooled_run_is_a_one_shot_run_with_the_same_mechanisms() {
    require!("g15_a_pooled_run_is_a_one_shot_run_with_the_same_mechanisms");
    let tier = pooled(2);
    let script = "cat; echo; echo \"$GREETING\"; id -u; ulimit -n; cat /proc/1/cmdline | tr '\\0' ' '; echo; \
                  grep CapEff /proc/self/status; grep NoNewPrivs /proc/self/status; grep Seccomp: /proc/self/status; \
                  echo err >&2; exit 7";
    let job = sh(script)
        .with_stdin("piped in")
        .unwrap()
        .with_env("GREETING", "hello from the job")
        .unwrap()
        .with_limits(Limits::default().with_open_files(37).unwrap());
    let (pool_r, one_shot) =
        block_on(async { (tier.run(&job).await.unwrap(), crate::support::tier().run(&job).await.unwrap()) });
    assert_eq!(pool_r.status, Status::Exited { code: 7 }, "{pool_r:#?}");
    assert_eq!(stdout(&pool_r), stdout(&one_shot), "a pooled run sees what a one-shot run sees");
    assert_eq!(stderr(&pool_r), "err\n");
    let out = stdout(&pool_r);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "piped in", "{out}");
    assert_eq!(lines[1], "hello from the job", "the job's environment, sent after the sandbox was built");
    assert_ne!(lines[2], "0", "never host root");
    assert_eq!(lines[3], "37", "the job's own limits, applied after the sandbox was built");
    assert!(out.contains("CapEff:\t0000000000000000"), "{out}");
    assert!(out.contains("NoNewPrivs:\t1"), "{out}");
    assert!(out.contains("Seccomp:\t2"), "{out}");
    assert_eq!(mechanisms(&pool_r), mechanisms(&one_shot));
    for m in [Mechanism::Landlock, Mechanism::Seccomp, Mechanism::Cgroup, Mechanism::MountNamespace] {
        assert!(pool_r.enforcement.iter().any(|e| e.mechanism == m), "{m:?} in {pool_r:#?}");
    }
    let (size, _) = tier.pool_status().unwrap();
    assert_eq!(size, 2);
}

#[test]
fn g15_the_jobs_limits_hold_in_a_pooled_sandbox() {
    require!("g15_the_jobs_limits_hold_in_a_pooled_sandbox");
    let tier = pooled(2);
    let small = Limits::default().with_memory(64 << 20).unwrap();
    let bomb = py("b = []\nwhile True: b.append(bytearray(1 << 20))").with_limits(small);
    let flood = sh("yes flood").with_limits(Limits::default().with_stdout(4096).unwrap());
    let sleep = with_wall(sh("sleep 30"), Duration::from_millis(500));
    let forks = sh("for i in $(seq 1 40); do sleep 5 & done; wait")
        .with_limits(Limits::default().with_processes(8).unwrap().with_wall(Duration::from_secs(10)).unwrap());
    let reports = block_on(async {
        let mut out = Vec::new();
        for job in [&bomb, &flood, &sleep, &forks] {
            out.push(tier.run(job).await.unwrap());
        }
        out
    });
    assert_eq!(reports[0].status, Status::OutOfMemory, "{:#?}", reports[0]);
    assert_eq!(reports[1].status, Status::OutputLimit { stream: stockade_protocol::Stream::Stdout });
    assert_eq!(reports[2].status, Status::TimedOut);
    assert!(reports[2].wall < Duration::from_secs(5), "the deadline counts from the job, not the build");
    assert!(stderr(&reports[3]).contains("fork") || stderr(&reports[3]).contains("Resource"), "{:#?}", reports[3]);
    // The cgroup's limits were the job's, set when it was taken.
    let detail = &reports[0].enforcement.iter().find(|e| e.mechanism == Mechanism::Cgroup).unwrap().detail;
    assert!(detail.contains(&format!("memory {}", 64 << 20)), "{detail}");
}

#[test]
fn g15_each_sandbox_serves_exactly_one_run() {
    require!("g15_each_sandbox_serves_exactly_one_run");
    let tier = pooled(1);
    let probe = "ls /tmp /dev/shm; echo planted > /tmp/mark; echo planted > /dev/shm/mark";
    let reports = block_on(async {
        let mut out = Vec::new();
        for _ in 0..3 {
            out.push(tier.run(&sh(probe)).await.unwrap());
        }
        out
    });
    for r in &reports {
        assert_eq!(r.status, Status::Exited { code: 0 }, "{r:#?}");
        // Nothing left by the run before: each run has a fresh /tmp and /dev/shm.
        assert!(!stdout(r).contains("mark"), "{}", stdout(r));
    }
}

#[test]
fn g15_a_pooled_run_returns_when_no_process_of_it_is_left_and_the_rest_follows() {
    if !available("g15_a_pooled_run_returns_when_no_process_of_it_is_left_and_the_rest_follows") {
        return;
    }
    let _only_us = exclusive();
    let (procs, cgroups) = (descendants(), own_cgroups());
    let tier = pooled(1);
    // A daemon in a session of its own, still running when the guest's shell exits: the
    // report comes only once the kernel has killed and reaped it with the run's init.
    let marker = "1207.4343";
    let want = format!("sleep\0{marker}\0");
    let r = block_on(async {
        let r = tier.run(&sh(&format!("setsid sleep {marker} </dev/null >/dev/null 2>&1 & echo started"))).await;
        // Judged before this runtime (which holds the background end of the run) is gone.
        let left = stockade_test_support::host_pids(|c| c == want.as_bytes());
        assert!(left.is_empty(), "the run's daemon outlived its report: {left:?}");
        r
    })
    .unwrap();
    assert_eq!((r.status.clone(), stdout(&r)), (Status::Exited { code: 0 }, "started\n".to_owned()), "{r:#?}");
    drop(tier);
    // The helper's exit and the cgroup's removal, which followed the report, are done too.
    eventually(WITHIN, "the run's helper is reaped, and the sandboxes' processes", || {
        none_added(&procs, descendants())
    });
    eventually(WITHIN, "and the cgroups removed", || none_added(&cgroups, own_cgroups()));
}

#[test]
fn g15_a_dropped_pool_leaves_no_process_cgroup_or_mount() {
    if !available("g15_a_dropped_pool_leaves_no_process_cgroup_or_mount") {
        return;
    }
    let _only_us = exclusive();
    let (procs, cgroups, mounts_before) = (descendants(), own_cgroups(), mounts());
    let tier = pooled(3);
    assert_eq!(tier.prebuild(None).unwrap(), 3);
    // A waiting sandbox is its helper and its init, confined, waiting for the job; the guest
    // is started when the job comes (G21).
    eventually(WITHIN, "three sandboxes of two processes each are built", || descendants().len() >= procs.len() + 6);
    assert!(own_cgroups().len() >= cgroups.len() + 3, "each waits in a cgroup of its own");
    let r = block_on(tier.run(&sh("echo ran"))).unwrap();
    assert_eq!(stdout(&r), "ran\n");
    drop(tier);
    // The run's replacement may still be building on the pool's thread, which holds the pool
    // until that build is done and then drops it there: the end comes moments later.
    eventually(WITHIN, "every sandbox's processes are killed and reaped", || none_added(&procs, descendants()));
    eventually(WITHIN, "and their cgroups removed", || none_added(&cgroups, own_cgroups()));
    let after = mounts();
    let differs = |a: &std::collections::BTreeMap<String, usize>, b: &std::collections::BTreeMap<String, usize>| {
        a.iter().filter(|(k, n)| b.get(*k) != Some(n)).map(|(k, n)| format!("{k} x{n}")).collect::<Vec<_>>()
    };
    assert_eq!(
        after,
        mounts_before,
        "the host's mount table changed: now {:?}, before {:?}",
        differs(&after, &mounts_before),
        differs(&mounts_before, &after)
    );
}

#[test]
fn g15_a_sigkilled_owner_leaves_nothing_that_the_next_run_does_not_remove() {
    if !available("g15_a_sigkilled_owner_leaves_nothing_that_the_next_run_does_not_remove") {
        return;
    }
    let _only_us = exclusive();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_stockade-process-embedder"));
    cmd.env("STOCKADE_EMBEDDER_POOL", "4").stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    let mut output = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut output, &mut line).unwrap();
    let job = serde_json::json!({ "job": sh("echo ran"), "helper": "pool" });
    std::io::Write::write_all(&mut input, format!("{job}\n").as_bytes()).unwrap();
    line.clear();
    std::io::BufRead::read_line(&mut output, &mut line).unwrap();
    assert!(line.contains("\"ran\\n\"") || line.contains("[114,97,110,10]"), "{line}");
    let owner = child.id();
    let owned = || stockade_test_support::descendants(owner);
    // The fork server, and four sandboxes of two processes (helper and init).
    eventually(WITHIN, "the pool refills", || owned().len() >= 9);
    let pids = owned();
    let stale_before = stale_cgroups(None).len();
    child.kill().unwrap();
    child.wait().unwrap();
    eventually(WITHIN, "every process of the pool dies with its owner", || {
        !pids.iter().any(|p| stockade_test_support::alive(*p))
    });
    let stale = stale_cgroups(None);
    assert!(stale.len() >= stale_before + 4, "the four waiting sandboxes' cgroups are stale: {stale:?}");
    // The next run of any supervisor removes them.
    let r = block_on(crate::support::tier().run(&sh("true"))).unwrap();
    assert_eq!(r.status, Status::Exited { code: 0 });
    let owner_prefix = format!("stockade-{owner}-");
    assert!(
        !stale_cgroups(None).iter().any(|p| p.file_name().unwrap().to_string_lossy().starts_with(&owner_prefix)),
        "{:?}",
        stale_cgroups(None)
    );
}

#[test]
fn g15_a_waiting_sandbox_serves_a_workspace_only_as_the_run_finds_it() {
    require!("g15_a_waiting_sandbox_serves_a_workspace_only_as_the_run_finds_it");
    let dir = host_dir("g15-ws");
    std::fs::write(dir.join("in.txt"), "first\n").unwrap();
    let tier = pooled(1);
    let ro = || sh("cat /workspace/in.txt").with_workspace(&dir, Access::ReadOnly).unwrap();
    let ready = |access| tier.pool_ready_for(&dir, access).unwrap();
    let r = block_on(tier.run(&ro())).unwrap();
    assert_eq!(stdout(&r), "first\n", "{r:#?}");
    eventually(WITHIN, "a sandbox for the workspace waits", || ready(Access::ReadOnly) == 1);
    // The directory is replaced at the same path after its sandbox was built: the waiting
    // sandbox holds the old one, and must not serve.
    std::fs::rename(&dir, dir.with_extension("old")).unwrap();
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("in.txt"), "second\n").unwrap();
    let r = block_on(tier.run(&ro())).unwrap();
    assert_eq!(stdout(&r), "second\n", "the run sees the directory that is at the path now");
    // Read-write: a protected path created after the sandbox was built is protected.
    let rw = |script: &str| sh(script).with_workspace(&dir, Access::ReadWrite).unwrap();
    let r = block_on(tier.run(&rw("true"))).unwrap();
    assert_eq!(r.status, Status::Exited { code: 0 }, "{r:#?}");
    eventually(WITHIN, "a read-write sandbox waits", || ready(Access::ReadWrite) == 1);
    std::fs::create_dir(dir.join(".git")).unwrap();
    std::fs::write(dir.join(".git/config"), "[core]\n").unwrap();
    let r = block_on(tier.run(&rw("echo '[alias] x = !evil' >> .git/config; echo done"))).unwrap();
    assert_eq!(stdout(&r), "done\n", "{r:#?}");
    assert_eq!(std::fs::read_to_string(dir.join(".git/config")).unwrap(), "[core]\n", "{}", stderr(&r));
    assert!(stderr(&r).contains("Read-only"), "{}", stderr(&r));
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(dir.with_extension("old")).unwrap();
}

#[test]
fn g15_granted_runs_are_one_shot_and_a_pool_fails_closed() {
    require!("g15_granted_runs_are_one_shot_and_a_pool_fails_closed");
    let grants = host_dir("g15-grants");
    std::fs::write(grants.join("data.json"), "[1, 2]").unwrap();
    let tier = pooled(1);
    assert_eq!(tier.prebuild(None).unwrap(), 1);
    let r = block_on(tier.run_live(
        &sh("cat /run/stockade/data.json"),
        Some(&grants),
        None,
        stockade_protocol::LiveIo::default(),
    ))
    .unwrap();
    assert_eq!(stdout(&r), "[1, 2]", "{r:#?}");
    assert_eq!(tier.pool_status(), Some((1, 1)), "the waiting sandbox was not used");
    std::fs::remove_dir_all(&grants).unwrap();
    // A mechanism the host cannot enforce fails a pooled run closed, naming it, exactly as a
    // one-shot run (landlock ABI 99 does not exist).
    let strict = crate::support::tier().landlock_abi(99).pool(1);
    match block_on(strict.run(&sh("true"))) {
        Err(RunError::Unsupported { mechanism, .. }) => assert_eq!(mechanism, "landlock"),
        other => panic!("expected Unsupported(landlock), got {other:?}"),
    }
}
