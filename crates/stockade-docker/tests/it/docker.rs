//! G2-G7 from inside real containers; the host checks the engine's state and its own files itself.

use std::sync::Mutex;
use std::time::Duration;

use bollard::query_parameters::ListContainersOptionsBuilder;
use stockade_docker::spec::{DEFAULT_IMAGE, LABEL_EXPIRES, LABEL_RUN};
use stockade_docker::{DockerTier, RunError};
use stockade_protocol::{Access, Busy, Job, Limits, Mechanism, Report, Status, Stream};

/// Docker tests run one at a time: each checks that no stockade container is left.
pub(crate) static ENGINE: Mutex<()> = Mutex::new(());

pub(crate) fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// The tier, or None (SKIPPED) without an engine; `STOCKADE_REQUIRE_ALL` makes that a failure.
pub(crate) fn tier(test: &str) -> Option<DockerTier> {
    match rt().block_on(DockerTier::connect()) {
        Ok(t) => Some(t),
        Err(e) if std::env::var_os("STOCKADE_REQUIRE_ALL").is_some() => panic!("{test}: {e}"),
        Err(e) => {
            eprintln!("SKIPPED {test}: {e}");
            None
        }
    }
}

pub(crate) fn sh(script: &str) -> Job {
    Job::image(DEFAULT_IMAGE, ["/bin/sh", "-c", script]).unwrap()
}

pub(crate) fn run(tier: &DockerTier, job: &Job) -> Report {
    rt().block_on(tier.run(job)).unwrap()
}

/// Stockade containers whose run id names process `pid` (run ids embed the creating pid,
/// so other users of the engine do not count), right now; only running ones with
/// `running`. The host's count, through the engine's own socket.
pub(crate) async fn containers_named_for(pid: u32, running: bool) -> usize {
    containers_on(&bollard::Docker::connect_with_local_defaults().unwrap(), pid, running).await
}

/// [`containers_named_for`] on the engine `docker` is connected to.
pub(crate) async fn containers_on(docker: &bollard::Docker, pid: u32, running: bool) -> usize {
    let mine = format!("-{pid:x}-");
    let mut filters = std::collections::HashMap::from([("label", vec![LABEL_RUN])]);
    if running {
        filters.insert("status", vec!["running"]);
    }
    let opts = ListContainersOptionsBuilder::default().all(!running).filters(&filters).build();
    let list = docker.list_containers(Some(opts)).await.unwrap();
    list.iter().filter(|c| c.labels.as_ref().and_then(|l| l.get(LABEL_RUN)).is_some_and(|v| v.contains(&mine))).count()
}

/// [`containers_named_for`], every state, from a blocking test.
pub(crate) fn containers_of(pid: u32) -> usize {
    rt().block_on(containers_named_for(pid, false))
}

/// Stockade containers of this test process that the engine still has, counted by the
/// host. Waits up to 10 s for background removals.
pub(crate) fn leftovers() -> usize {
    let mut count = 0;
    for _ in 0..50 {
        count = containers_of(std::process::id());
        if count == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    count
}

/// Volumes of this test process's containers that the engine still has (labelled with the
/// run id, like the containers).
pub(crate) fn leftover_volumes() -> usize {
    rt().block_on(volumes_on(&bollard::Docker::connect_with_local_defaults().unwrap(), std::process::id()))
}

/// Volumes of process `pid`'s containers on the engine `docker` is connected to.
pub(crate) async fn volumes_on(docker: &bollard::Docker, pid: u32) -> usize {
    let mine = format!("-{pid:x}-");
    let filters = std::collections::HashMap::from([("label", vec![LABEL_RUN])]);
    let opts = bollard::query_parameters::ListVolumesOptionsBuilder::default().filters(&filters).build();
    let list = docker.list_volumes(Some(opts)).await.unwrap();
    list.volumes
        .unwrap_or_default()
        .iter()
        .filter(|v| v.labels.get(LABEL_RUN).is_some_and(|r| r.contains(&mine)))
        .count()
}

/// A fresh host directory for a staged workspace.
pub(crate) fn host_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("stockade-docker-it-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn stage_detail(r: &Report) -> String {
    r.enforcement
        .iter()
        .find(|e| e.mechanism == Mechanism::ContainerWorkspace)
        .map(|e| e.detail.clone())
        .unwrap_or_default()
}

pub(crate) fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn g2_every_default_takes_effect_inside() {
    let _one = ENGINE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(tier) = tier("g2_every_default_takes_effect_inside") else { return };
    let script = r#"
        echo "ifaces $(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\n' ',')"
        echo "uid $(id -u):$(id -g)"
        grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status | tr -s '\t ' ' '
        touch /rootfile 2>/dev/null && echo "root writable" || echo "root read-only"
        echo x > /tmp/f && echo "tmp writable"
        cp /bin/busybox /tmp/bb && (/tmp/bb true 2>/dev/null && echo "tmp exec" || echo "tmp noexec")
        echo "nofile $(ulimit -n)"
        echo "pids $(cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max)"
        chmod 4755 /tmp/f 2>/dev/null && echo "setuid allowed" || echo "setuid refused"
        chmod 755 /tmp/f && echo "chmod allowed"
        unshare -U true 2>/dev/null && echo "unshare allowed" || echo "unshare refused"
        echo "oom_score_adj $(cat /proc/self/oom_score_adj)"
    "#;
    let job = sh(script).with_limits(Limits::new().with_processes(32).unwrap().with_open_files(128).unwrap());
    let report = run(&tier, &job);
    let out = text(&report.stdout.bytes);
    assert_eq!(report.status, Status::Exited { code: 0 }, "{out} {}", text(&report.stderr.bytes));
    assert!(out.contains("ifaces lo,\n"), "{out}");
    assert!(out.contains("uid 65534:65534"), "{out}");
    for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert!(out.contains(&format!("{cap}: 0000000000000000")), "{cap}: {out}");
    }
    assert!(out.contains("NoNewPrivs: 1"), "{out}");
    assert!(out.contains("root read-only") && out.contains("tmp writable") && out.contains("tmp noexec"), "{out}");
    assert!(out.contains("nofile 128") && out.contains("pids 32"), "{out}");
    assert!(out.contains("oom_score_adj 1000"), "{out}");
    assert!(report.enforced(Mechanism::OomScore), "{:?}", report.enforcement);
    // The process tier's seccomp policy: a set-id mode and namespace creation refused, an
    // ordinary chmod allowed; `Seccomp: 2` is a filter in force.
    assert!(out.contains("Seccomp: 2"), "{out}");
    assert!(
        out.contains("setuid refused") && out.contains("chmod allowed") && out.contains("unshare refused"),
        "{out}"
    );
    assert_eq!(leftovers(), 0);
}

#[test]
fn g3_the_deadline_kills_and_nothing_is_left() {
    let _one = ENGINE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(tier) = tier("g3_the_deadline_kills") else { return };
    let job = sh("echo started; sleep 60").with_limits(Limits::new().with_wall(Duration::from_secs(1)).unwrap());
    let started = std::time::Instant::now();
    let report = run(&tier, &job);
    assert_eq!(report.status, Status::TimedOut, "{report:?}");
    assert_eq!(report.stdout.bytes, b"started\n");
    assert!(started.elapsed() < Duration::from_secs(15), "{:?}", started.elapsed());
    assert_eq!(leftovers(), 0);
}

#[test]
fn g3_a_run_whose_future_is_dropped_leaves_no_container() {
    let _one = ENGINE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(tier) = tier("g3_a_run_whose_future_is_dropped") else { return };
    let job = sh("sleep 60").with_limits(Limits::new().with_wall(Duration::from_secs(50)).unwrap());
    let rt = rt();
    rt.block_on(async {
        // Cancelled while the guest sleeps (a caller's timeout, an MCP cancellation).
        let cut = tokio::time::timeout(Duration::from_secs(3), tier.run(&job)).await;
        assert!(cut.is_err(), "the run should still be going: {cut:?}");
        // The removal was spawned on this runtime: give it time to reach the engine.
        tokio::time::sleep(Duration::from_millis(500)).await;
    });
    assert_eq!(leftovers(), 0);
}

#[test]
fn g3_an_output_flood_stops_at_the_budget() {
    let _one = ENGINE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(tier) = tier("g3_an_output_flood") else { return };
    let report = run(&tier, &sh("yes").with_limits(Limits::new().with_stdout(64 << 10).unwrap()));
    assert_eq!(report.status, Status::OutputLimit { stream: Stream::Stdout });
    assert_eq!(report.stdout.bytes.len(), 64 << 10);
    assert!(report.wall < Duration::from_secs(5), "{:?}", report.wall);
    assert_eq!(leftovers(), 0);
}

#[test]
fn g3_out_of_memory_and_the_pids_limit_are_enforced() {
    let _one = ENGINE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(tier) = tier("g3_oom_and_pids") else { return };
    let bomb =
        sh("x=aaaaaaaaaaaaaaaa; while true; do x=$x$x; done").with_limits(Limits::new().with_memory(32 << 20).unwrap());
    assert_eq!(run(&tier, &bomb).status, Status::OutOfMemory);
    // Forty background sleeps under a limit of 16 processes: the shell's forks fail.
    let forks =
        sh("for i in $(seq 40); do sleep 2 & done; wait").with_limits(Limits::new().with_processes(16).unwrap());
    let report = run(&tier, &forks);
    assert!(text(&report.stderr.bytes).contains("can't fork"), "{report:?}");
    assert_eq!(leftovers(), 0);
}

#[test]
fn g3_stdin_exit_codes_and_a_missing_image() {
    let _one = ENGINE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(tier) = tier("g3_stdin_exit_codes") else { return };
    let job = sh("cat; echo err >&2; exit 3").with_stdin("from stdin\n").unwrap();
    let report = run(&tier, &job);
    assert_eq!(report.status, Status::Exited { code: 3 });
    assert_eq!((report.stdout.bytes.as_slice(), report.stderr.bytes.as_slice()), (&b"from stdin\n"[..], &b"err\n"[..]));
    let missing = Job::image("stockade-no-such-image:local", ["true"]).unwrap();
    assert!(matches!(run(&tier, &missing).status, Status::FailedToStart { .. }));
    assert_eq!(leftovers(), 0);
}

#[test]
fn g3_sixteen_concurrent_runs_do_not_interfere() {
    let _one = ENGINE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(tier) = tier("g3_sixteen_concurrent_runs") else { return };
    let reports = rt().block_on(async {
        let runs = (0..16).map(|i| {
            let tier = tier.clone();
            async move {
                let job = sh("echo $N > /tmp/n; sleep 0.3; cat /tmp/n").with_env("N", i.to_string()).unwrap();
                (i, tier.run(&job).await.unwrap())
            }
        });
        futures_util::future::join_all(runs).await
    });
    for (i, report) in reports {
        assert_eq!(report.status, Status::Exited { code: 0 }, "{i}: {report:?}");
        assert_eq!(text(&report.stdout.bytes), format!("{i}\n"));
    }
    assert_eq!(leftovers(), 0);
}

#[test]
fn g4_orphans_are_reaped_by_label() {
    let _one = ENGINE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(tier) = tier("g4_orphans_are_reaped") else { return };
    rt().block_on(async {
        let docker = bollard::Docker::connect_with_local_defaults().unwrap();
        for (i, expires) in ["1", "not-a-time"].into_iter().enumerate() {
            let run = format!("orphan-{:x}-{i}", std::process::id());
            let body = bollard::models::ContainerCreateBody {
                image: Some(DEFAULT_IMAGE.into()),
                cmd: Some(vec!["true".into()]),
                labels: Some(std::collections::HashMap::from([
                    (LABEL_RUN.to_owned(), run.clone()),
                    (LABEL_EXPIRES.to_owned(), expires.to_owned()),
                ])),
                ..Default::default()
            };
            // Named as stockade names its containers.
            let opts = bollard::query_parameters::CreateContainerOptionsBuilder::default()
                .name(&format!("stockade-{run}"))
                .build();
            docker.create_container(Some(opts), body).await.unwrap();
        }
    });
    // Counted without waiting: they must still be there.
    let orphans = containers_of(std::process::id());
    assert_eq!(orphans, 2);
    assert!(rt().block_on(tier.gc(false)).unwrap() >= 2);
    assert_eq!(leftovers(), 0);
}

/// bounded (issue 39), finding 3: the reaper force-removed any container carrying the run
/// label with a missing or past expiry, with its anonymous volumes; labels come from images,
/// so an unrelated container started from a labelled image was deleted with its data.
/// Judged by the engine afterwards: the container and its volume are still there after
/// `gc` and after a run (whose connect runs `gc`).
#[test]
fn g4_a_labelled_container_stockade_did_not_start_survives_gc() {
    let _one = ENGINE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(tier) = tier("g4_a_labelled_container_stockade_did_not_start_survives_gc") else { return };
    let name = format!("not-stockade-{}", std::process::id());
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    let volume = rt().block_on(async {
        let body = bollard::models::ContainerCreateBody {
            image: Some(DEFAULT_IMAGE.into()),
            cmd: Some(vec!["sleep".into(), "300".into()]),
            // What an image built `FROM` a committed stockade container carries.
            labels: Some(std::collections::HashMap::from([
                (LABEL_RUN.to_owned(), format!("copied-{:x}-0", std::process::id())),
                (LABEL_EXPIRES.to_owned(), "1".to_owned()),
            ])),
            volumes: Some(vec!["/data".to_owned()]),
            ..Default::default()
        };
        let opts = bollard::query_parameters::CreateContainerOptionsBuilder::default().name(&name).build();
        let c = docker.create_container(Some(opts), body).await.unwrap();
        docker.start_container(&c.id, None).await.unwrap();
        let info = docker.inspect_container(&c.id, None).await.unwrap();
        info.mounts.unwrap_or_default().into_iter().find_map(|m| m.name).unwrap()
    });
    assert_eq!(rt().block_on(tier.gc(false)).unwrap(), 0, "gc removed a container it did not create");
    let r = run(&tier, &sh("echo ran"));
    assert_eq!(text(&r.stdout.bytes), "ran\n");
    rt().block_on(async {
        let c = docker.inspect_container(&name, None).await.expect("the unrelated container was removed");
        assert_eq!(c.state.and_then(|s| s.running), Some(true));
        docker.inspect_volume(&volume).await.expect("its volume was removed");
        let opts = bollard::query_parameters::RemoveContainerOptionsBuilder::default().force(true).v(true).build();
        docker.remove_container(&name, Some(opts)).await.unwrap();
    });
}

#[test]
fn g5_a_missing_engine_is_unsupported() {
    let err = rt().block_on(DockerTier::connect_to("unix:///nonexistent/docker.sock")).unwrap_err();
    assert!(matches!(err, RunError::Unsupported { .. }), "{err}");
    let err = rt().block_on(DockerTier::connect_to("tcp://127.0.0.1:1")).unwrap_err();
    assert!(matches!(err, RunError::Unsupported { .. }), "{err}");
}

#[test]
fn g6_a_warm_pool_runs_each_job_in_a_fresh_container() {
    use stockade_docker::pool::{DockerPool, PoolConfig};
    let _one = ENGINE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(tier) = tier("g6_a_warm_pool") else { return };
    let rt = rt();
    rt.block_on(async {
        let pool = DockerPool::new(tier.clone(), PoolConfig::new(2, DEFAULT_IMAGE)).await.unwrap();
        let first = pool.run(&sh("id -u; ls /tmp; touch /tmp/left-behind; sleep 30 &")).await.unwrap();
        assert_eq!(first.status, Status::Exited { code: 0 }, "{first:?}");
        assert_eq!(text(&first.stdout.bytes), "65534\n");
        // The next run sees nothing of the first: a fresh container.
        let second = pool.run(&sh("ls /tmp; ps -o args | grep -c 'sleep 3[0]' || true")).await.unwrap();
        assert_eq!(text(&second.stdout.bytes), "0\n", "{second:?}");
        // The deadline kills the exec's container.
        let slow = sh("sleep 60").with_limits(Limits::new().with_wall(Duration::from_millis(500)).unwrap());
        let started = std::time::Instant::now();
        assert_eq!(pool.run(&slow).await.unwrap().status, Status::TimedOut);
        assert!(started.elapsed() < Duration::from_secs(10));
        let flood = sh("yes").with_limits(Limits::new().with_stdout(4096).unwrap());
        assert_eq!(pool.run(&flood).await.unwrap().status, Status::OutputLimit { stream: Stream::Stdout });
        // The OOM killer ends the exec's shell, not the container's init.
        let bomb = sh("x=aaaaaaaaaaaaaaaa; while true; do x=$x$x; done");
        assert_eq!(pool.run(&bomb).await.unwrap().status, Status::OutOfMemory);
        let other = pool.run(&Job::image("other:local", ["true"]).unwrap()).await;
        assert!(matches!(&other, Err(RunError::Misconfigured(m)) if m.starts_with("the job does not fit the pool")), "{other:?}");
        // A pool without staging takes no workspace.
        let dir = std::env::temp_dir().join(format!("stockade-pool-nows-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ws = sh("true").with_workspace(&dir, Access::ReadOnly).unwrap();
        assert!(matches!(pool.run(&ws).await, Err(RunError::Misconfigured(m)) if m.starts_with("the job does not fit the pool")));
        // A system directory is refused before anything else, by the rule every tier shares.
        let etc = sh("true").with_workspace("/etc", Access::ReadOnly).unwrap();
        assert!(matches!(pool.run(&etc).await, Err(RunError::Misconfigured(m)) if m.starts_with("workspace /etc")));
        let _ = std::fs::remove_dir(&dir);
        pool.shutdown().await;
        // A persistent session keeps its container (and its state) between runs.
        let mut config = PoolConfig::new(1, DEFAULT_IMAGE);
        config.persistent = true;
        let session = DockerPool::new(tier.clone(), config).await.unwrap();
        session.run(&sh("echo kept > /tmp/state")).await.unwrap();
        assert_eq!(text(&session.run(&sh("cat /tmp/state")).await.unwrap().stdout.bytes), "kept\n");
        session.shutdown().await;
        // It is single-tenant: its first run fixes the workspace it serves, and a run that
        // grants another (whose staged files the earlier runs' processes would see) is
        // refused before any container is used.
        let mut config = PoolConfig::new(1, DEFAULT_IMAGE).with_workspace(Access::ReadOnly);
        config.persistent = true;
        let session = DockerPool::new(tier.clone(), config).await.unwrap();
        let (first, second) = (
            std::env::temp_dir().join(format!("stockade-tenant-a-{}", std::process::id())),
            std::env::temp_dir().join(format!("stockade-tenant-b-{}", std::process::id())),
        );
        for d in [&first, &second] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(second.join("secret"), "b's").unwrap();
        let on = |d: &std::path::Path| {
            sh("cat /workspace/secret 2>/dev/null; true").with_workspace(d, Access::ReadOnly).unwrap()
        };
        assert!(session.run(&on(&first)).await.unwrap().status == Status::Exited { code: 0 });
        let refused = session.run(&on(&second)).await.unwrap_err();
        assert!(refused.to_string().contains("persistent pool serves"), "{refused}");
        assert!(session.run(&sh("true")).await.is_err(), "no workspace is another tenant too");
        assert!(session.run(&on(&first)).await.unwrap().status == Status::Exited { code: 0 });
        session.shutdown().await;
        for d in [&first, &second] {
            let _ = std::fs::remove_dir_all(d);
        }
        // A container that died while idle is noticed by the health check and replaced.
        let mut config = PoolConfig::new(1, DEFAULT_IMAGE);
        config.health_check_after = Duration::ZERO;
        let checked = DockerPool::new(tier.clone(), config).await.unwrap();
        let docker = bollard::Docker::connect_with_local_defaults().unwrap();
        let mine = format!("-{:x}-", std::process::id());
        let filters = std::collections::HashMap::from([("label", vec![LABEL_RUN])]);
        let opts = ListContainersOptionsBuilder::default().filters(&filters).build();
        for c in docker.list_containers(Some(opts)).await.unwrap() {
            if c.labels.as_ref().and_then(|l| l.get(LABEL_RUN)).is_some_and(|v| v.contains(&mine)) {
                docker.kill_container(c.id.as_deref().unwrap(), None).await.unwrap();
            }
        }
        let report = checked.run(&sh("echo alive")).await.unwrap();
        assert_eq!(text(&report.stdout.bytes), "alive\n", "{report:?}");
        checked.shutdown().await;
        // Let the background replacements of used containers finish their removals.
        tokio::time::sleep(Duration::from_secs(2)).await;
    });
    assert_eq!(leftovers(), 0);
}

/// A guest that closes its stdout and stderr and goes on: the output ends before the run
/// does. Its exit code is still the report's, in a pool (where the exec's output ends when
/// the guest closes it) as in a one-shot run, and one that goes on past the deadline is
/// killed there.
#[test]
fn g6_a_guest_that_closes_its_output_early_is_waited_for_one_shot_and_pooled() {
    use stockade_docker::pool::{DockerPool, PoolConfig};
    let _one = ENGINE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(tier) = tier("g6_a_guest_that_closes_its_output_early") else { return };
    let rt = rt();
    rt.block_on(async {
        let pool = DockerPool::new(tier.clone(), PoolConfig::new(1, DEFAULT_IMAGE)).await.unwrap();
        let closes = sh("echo before; exec >&- 2>&-; sleep 1; exit 3");
        let lingers =
            sh("exec >&- 2>&-; sleep 60").with_limits(Limits::new().with_wall(Duration::from_secs(2)).unwrap());
        for pooled in [false, true] {
            let started = std::time::Instant::now();
            let r = if pooled { pool.run(&closes).await } else { tier.run(&closes).await }.unwrap();
            assert_eq!(r.status, Status::Exited { code: 3 }, "pooled {pooled}: {r:?}");
            assert_eq!(text(&r.stdout.bytes), "before\n", "pooled {pooled}");
            assert!(started.elapsed() >= Duration::from_secs(1), "pooled {pooled}: {:?}", started.elapsed());
            let started = std::time::Instant::now();
            let r = if pooled { pool.run(&lingers).await } else { tier.run(&lingers).await }.unwrap();
            assert_eq!(r.status, Status::TimedOut, "pooled {pooled}: {r:?}");
            let took = started.elapsed();
            assert!(took >= Duration::from_secs(2) && took < Duration::from_secs(15), "pooled {pooled}: {took:?}");
        }
        pool.shutdown().await;
    });
    assert_eq!(leftovers(), 0);
}

#[test]
fn g7_a_read_only_staged_workspace_is_seen_and_cannot_change() {
    use stockade_docker::pool::{DockerPool, PoolConfig};
    let _one = ENGINE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(tier) = tier("g7_read_only_staged") else { return };
    let ws = host_dir("ro");
    std::fs::create_dir(ws.join("sub")).unwrap();
    std::fs::write(ws.join("sub/input.txt"), "input\n").unwrap();
    std::fs::write(ws.join("tool.sh"), "#!/bin/sh\necho tool ran\n").unwrap();
    std::fs::set_permissions(ws.join("tool.sh"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    // A host symlink travels as a link: inside, it names the container's own file.
    std::os::unix::fs::symlink("/etc/shadow", ws.join("shadow")).unwrap();
    let rt = rt();
    rt.block_on(async {
        let pool = DockerPool::new(tier.clone(), PoolConfig::new(1, DEFAULT_IMAGE).with_workspace(Access::ReadOnly))
            .await
            .unwrap();
        let job = sh("pwd; cat sub/input.txt; ./tool.sh; cat shadow 2>&1 | head -c 60; echo; \
                      echo x > sub/input.txt || echo no-write; touch new || echo no-create; \
                      rm -f tool.sh 2>/dev/null; ls tool.sh")
        .with_workspace(&ws, Access::ReadOnly)
        .unwrap();
        let r = pool.run(&job).await.unwrap();
        let out = text(&r.stdout.bytes);
        assert_eq!(r.status, Status::Exited { code: 0 }, "{r:?}");
        assert!(out.starts_with("/workspace\ninput\ntool ran\n"), "{out}");
        assert!(!out.contains("root:") && out.contains("No such file"), "the host's /etc/shadow leaked: {out}");
        assert!(out.contains("no-write\nno-create\ntool.sh\n"), "{out}");
        assert!(stage_detail(&r).contains("read-only (root-owned): 2 files"), "{r:?}");
        // An oversize workspace is refused before any container is used.
        std::fs::write(ws.join("big"), vec![0u8; 2 << 20]).unwrap();
        let mut small = PoolConfig::new(1, DEFAULT_IMAGE).with_workspace(Access::ReadOnly);
        small.workspace_bytes = 1 << 20;
        let small = DockerPool::new(tier.clone(), small).await.unwrap();
        let err = small.run(&sh("true").with_workspace(&ws, Access::ReadOnly).unwrap()).await;
        assert!(matches!(&err, Err(RunError::Misconfigured(m)) if m.starts_with("staged workspace: the workspace needs at least")), "{err:?}");
        // A grant that does not match the pool is refused.
        let rw = sh("true").with_workspace(&ws, Access::ReadWrite).unwrap();
        assert!(matches!(pool.run(&rw).await, Err(RunError::Misconfigured(m)) if m.starts_with("the job does not fit the pool")));
        pool.shutdown().await;
        small.shutdown().await;
    });
    assert_eq!(std::fs::read_to_string(ws.join("sub/input.txt")).unwrap(), "input\n");
    assert_eq!(leftovers(), 0, "containers left behind");
    assert_eq!(leftover_volumes(), 0, "workspace volumes left behind");
    let _ = std::fs::remove_dir_all(&ws);
}

#[test]
fn g7_a_read_write_staged_workspace_comes_back_without_escaping() {
    use stockade_docker::pool::{DockerPool, PoolConfig};
    let _one = ENGINE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(tier) = tier("g7_read_write_staged") else { return };
    let ws = host_dir("rw");
    let outside = host_dir("rw-outside");
    std::fs::write(ws.join("data.txt"), "before\n").unwrap();
    std::fs::create_dir(ws.join(".git")).unwrap();
    std::fs::write(ws.join(".git/config"), "[core]\n").unwrap();
    std::os::unix::fs::symlink(&outside, ws.join("out")).unwrap();
    let rt = rt();
    rt.block_on(async {
        let mut config = PoolConfig::new(1, DEFAULT_IMAGE).with_workspace(Access::ReadWrite);
        config.workspace_bytes = 4 << 20;
        let pool = DockerPool::new(tier.clone(), config).await.unwrap();
        // The guest changes a file, adds results, rewrites a protected path, replaces the
        // host's symlink with a directory to write through, plants links, and fills its volume.
        let job = sh("echo after > data.txt; mkdir -p res && echo 42 > res/answer; \
                      echo '[core] hooksPath=/tmp/evil' > .git/config; \
                      rm out && mkdir out && echo pwn > out/pwned; \
                      ln -s /etc/passwd passwd-link; mkfifo pipe; \
                      dd if=/dev/zero of=fill bs=1k count=8192 2>/dev/null || echo volume-full")
        .with_workspace(&ws, Access::ReadWrite)
        .unwrap();
        let r = pool.run(&job).await.unwrap();
        assert_eq!(r.status, Status::Exited { code: 0 }, "{r:?}");
        assert_eq!(text(&r.stdout.bytes), "volume-full\n", "the volume's size cap did not hold: {r:?}");
        let detail = stage_detail(&r);
        assert!(detail.contains("copied back:"), "{detail}");
        for why in [
            ".git/config (protected path)",
            "passwd-link (not a regular file or directory)",
            "pipe (not a regular file or directory)",
            "out/pwned (a parent is a symlink or not a directory on the host)",
        ] {
            assert!(detail.contains(why), "{why}: {detail}");
        }
        // A run killed at its deadline copies nothing back.
        let slow = sh("echo late > late.txt; sleep 60")
            .with_workspace(&ws, Access::ReadWrite)
            .unwrap()
            .with_limits(Limits::new().with_wall(Duration::from_millis(800)).unwrap());
        let r = pool.run(&slow).await.unwrap();
        assert_eq!(r.status, Status::TimedOut);
        assert!(stage_detail(&r).contains("not copied back"), "{r:?}");
        pool.shutdown().await;
    });
    assert_eq!(std::fs::read_to_string(ws.join("data.txt")).unwrap(), "after\n");
    assert_eq!(std::fs::read_to_string(ws.join("res/answer")).unwrap(), "42\n");
    assert_eq!(std::fs::read_to_string(ws.join(".git/config")).unwrap(), "[core]\n", "protected path changed");
    assert!(std::fs::symlink_metadata(ws.join("out")).unwrap().file_type().is_symlink(), "host symlink replaced");
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0, "a write escaped through the host symlink");
    assert!(
        std::fs::symlink_metadata(ws.join("passwd-link")).is_err()
            && std::fs::symlink_metadata(ws.join("pipe")).is_err()
    );
    assert!(!ws.join("late.txt").exists());
    assert_eq!(leftovers(), 0, "containers left behind");
    assert_eq!(leftover_volumes(), 0, "workspace volumes left behind");
    let _ = std::fs::remove_dir_all(&ws);
    let _ = std::fs::remove_dir_all(&outside);
}

#[test]
fn g2_the_gvisor_runtime_is_used_when_asked_and_refused_when_missing() {
    let _one = ENGINE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(tier) = tier("g2_gvisor") else { return };
    let rt = rt();
    let missing = rt.block_on(tier.clone().runtime("no-such-runtime"));
    assert!(
        matches!(&missing, Err(RunError::Unsupported { mechanism, .. }) if mechanism.contains("no-such-runtime")),
        "{missing:?}"
    );
    // userns-remap is the engine's setting: required, it is checked, never assumed.
    let remap = rt.block_on(tier.userns_remap()).unwrap();
    let required = rt.block_on(tier.clone().require_userns_remap());
    assert_eq!(required.is_ok(), remap, "{required:?}");
    if let Err(e) = required {
        assert!(matches!(&e, RunError::Unsupported { mechanism, .. } if mechanism == "userns-remap"), "{e:?}");
    }
    let gvisor = match rt.block_on(tier.clone().runtime("runsc")) {
        Ok(t) => t,
        Err(e) if std::env::var_os("STOCKADE_REQUIRE_ALL").is_some() => {
            panic!("g2_gvisor: {e} (.ci/run registers runsc)")
        }
        Err(e) => {
            eprintln!("SKIPPED g2_gvisor: {e}");
            return;
        }
    };
    // Several runs: with the default pids limit applied to gVisor's own threads, docker-init
    // failed to start the command about half the time (exit 2).
    let script = "dmesg | head -1; id -u; grep CapEff /proc/self/status; ls /sys/class/net; touch /x 2>/dev/null || echo read-only";
    let mut out = String::new();
    for _ in 0..4 {
        let r = run(&gvisor, &sh(script));
        assert_eq!(r.status, Status::Exited { code: 0 }, "{r:?}");
        out = text(&r.stdout.bytes);
    }
    assert!(out.contains("Starting gVisor"), "not under gVisor: {out}");
    assert!(out.contains("\n65534\nCapEff:\t0000000000000000\nlo\nread-only\n"), "{out}");
    let slow = sh("sleep 60").with_limits(Limits::new().with_wall(Duration::from_secs(1)).unwrap());
    let started = std::time::Instant::now();
    assert_eq!(run(&gvisor, &slow).status, Status::TimedOut);
    assert!(started.elapsed() < Duration::from_secs(15));
    assert_eq!(leftovers(), 0);
}

/// A one-shot run bind-mounts the workspace and runs as uid 65534, as `docker run --user`
/// does: a directory that user cannot use is refused before any container exists, with the
/// fixes, instead of "Permission denied" inside.
#[test]
fn g1_a_workspace_the_containers_user_cannot_use_is_refused_before_any_container() {
    use std::os::unix::fs::PermissionsExt;
    let _one = ENGINE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(tier) = tier("g1_a_workspace_the_containers_user_cannot_use") else { return };
    let ws = host_dir("unusable");
    std::fs::set_permissions(&ws, std::fs::Permissions::from_mode(0o755)).unwrap();
    let job = sh("echo out > made.txt").with_workspace(&ws, Access::ReadWrite).unwrap();
    let refused = rt().block_on(tier.run(&job));
    match &refused {
        Err(RunError::Misconfigured(why)) if why.starts_with("workspace ") => {
            assert!(why.contains("cannot read and write it (owner 0:0, mode 0755)"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(containers_of(std::process::id()), 0, "a container was made for a refused workspace");
    // Read-only, it can be read; made writable for that user, the run writes it.
    let ro = sh("ls").with_workspace(&ws, Access::ReadOnly).unwrap();
    assert_eq!(run(&tier, &ro).status, Status::Exited { code: 0 });
    std::fs::set_permissions(&ws, std::fs::Permissions::from_mode(0o777)).unwrap();
    let r = run(&tier, &job);
    assert_eq!(r.status, Status::Exited { code: 0 }, "{r:?}");
    assert_eq!(std::fs::read_to_string(ws.join("made.txt")).unwrap(), "out\n");
    assert_eq!(leftovers(), 0);
    let _ = std::fs::remove_dir_all(&ws);
}

#[test]
fn g8_a_read_write_workspace_keeps_its_protected_paths() {
    let _one = ENGINE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(tier) = tier("g8_protected_paths") else { return };
    let ws = host_dir("protected");
    std::fs::create_dir_all(ws.join(".git/hooks")).unwrap();
    std::fs::write(ws.join(".git/config"), "[core]\n").unwrap();
    std::fs::write(ws.join(".bashrc"), "# rc\n").unwrap();
    for p in ["", ".git", ".git/hooks", ".git/config", ".bashrc"] {
        std::os::unix::fs::chown(ws.join(p), Some(65534), Some(65534)).unwrap();
    }
    let job = sh("echo result > out.txt && echo wrote; echo x >> .git/config || echo config-refused; \
                  touch .git/hooks/pre-commit || echo hook-refused; echo x >> .bashrc || echo rc-refused; \
                  mv .git git-old || echo rename-refused; rm -f .bashrc; \
                  echo evil > .envrc; mkdir -p .claude && echo '{}' > .claude/settings.json; \
                  ls -a | tr '\\n' ' '")
    .with_workspace(&ws, Access::ReadWrite)
    .unwrap();
    let r = run(&tier, &job);
    let out = text(&r.stdout.bytes);
    assert_eq!(r.status, Status::Exited { code: 0 }, "{r:?}");
    assert!(
        out.starts_with("wrote\nconfig-refused\nhook-refused\nrc-refused\nrename-refused\n"),
        "{out}\n{}",
        text(&r.stderr.bytes)
    );
    assert!(out.contains(".bashrc") && out.contains(".git") && out.contains("out.txt"), "{out}");
    let detail = stage_detail(&r);
    assert!(detail.contains("read-only inside the workspace: .git/hooks .git/config .bashrc;"), "{detail}");
    // What the guest created where a protected path was absent is gone after the run.
    let swept: Vec<&str> =
        r.enforcement.iter().map(|e| e.detail.as_str()).filter(|d| d.starts_with("removed")).collect();
    assert_eq!(
        swept,
        ["removed after the run, created by the guest where a protected path was absent: .claude .envrc"]
    );
    assert_eq!(r.swept, [".claude", ".envrc"]);
    assert!(!ws.join(".envrc").exists() && !ws.join(".claude").exists());
    // The host checks its own files.
    assert_eq!(std::fs::read_to_string(ws.join(".git/config")).unwrap(), "[core]\n");
    assert_eq!(std::fs::read_to_string(ws.join(".bashrc")).unwrap(), "# rc\n");
    assert_eq!(std::fs::read_dir(ws.join(".git/hooks")).unwrap().count(), 0);
    assert_eq!(std::fs::read_to_string(ws.join("out.txt")).unwrap(), "result\n");
    // A read-only grant is a read-only bind.
    let ro = sh("cat out.txt; touch new 2>/dev/null || echo read-only").with_workspace(&ws, Access::ReadOnly).unwrap();
    assert_eq!(text(&run(&tier, &ro).stdout.bytes), "result\nread-only\n");
    // A protected path that is a symlink refuses the grant before any container exists.
    std::fs::remove_file(ws.join(".bashrc")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", ws.join(".bashrc")).unwrap();
    let refused = rt().block_on(tier.run(&job));
    assert!(matches!(&refused, Err(RunError::Misconfigured(m)) if m.contains(".bashrc")), "{refused:?}");
    assert_eq!(leftovers(), 0);
    let _ = std::fs::remove_dir_all(&ws);
}

/// hold-the-line, finding 1 (the docker one-shot binds its workspace by name): a run of a
/// directory inside a workspace that a read-write run holds (any tier's, here a lock taken
/// as the process tier takes it) is refused before any container exists when it asks not to
/// wait, so no guest of the holder can swap the directory the engine binds; once the holder
/// is done it runs.
#[test]
fn g8_a_workspace_inside_a_held_one_is_refused_before_any_container() {
    let _one = ENGINE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(tier) = tier("g8_held_workspace") else { return };
    let ws = host_dir("held");
    std::fs::create_dir(ws.join("sub")).unwrap();
    std::fs::set_permissions(ws.join("sub"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let opened = stockade_hostfs::open_workspace(&ws).unwrap();
    let held = rt().block_on(opened.lock(true, Busy::Refuse, || async {})).unwrap();
    let job = sh("ls").with_workspace_when_busy(ws.join("sub"), Access::ReadOnly, Busy::Refuse).unwrap();
    let refused = rt().block_on(tier.run(&job));
    assert!(matches!(&refused, Err(RunError::Busy(m)) if m.contains("held by another run")), "{refused:?}");
    assert_eq!(containers_of(std::process::id()), 0, "a container was made for a held workspace");
    drop(held);
    assert_eq!(run(&tier, &job).status, Status::Exited { code: 0 });
    assert_eq!(leftovers(), 0);
    let _ = std::fs::remove_dir_all(&ws);
}

#[test]
fn g9_the_guest_joins_a_held_network_namespace_and_nothing_is_left() {
    let _one = ENGINE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(tier) = tier("g9_netns") else { return };
    let grants = host_dir("netns-grants");
    let seen = std::sync::Arc::new(Mutex::new(None));
    let record = seen.clone();
    // The guest reports its network namespace; the host compares it with the holder's.
    let job = sh("readlink /proc/self/ns/net; ls /sys/class/net | tr '\\n' ' '");
    let report = rt()
        .block_on(tier.run_granted_in_netns(&job, &grants, move |pid| {
            *record.lock().unwrap() = std::fs::read_link(format!("/proc/{pid}/ns/net")).ok();
            Ok(())
        }))
        .unwrap();
    assert_eq!(report.status, Status::Exited { code: 0 }, "{report:?}");
    let out = text(&report.stdout.bytes);
    let holder_ns = seen.lock().unwrap().clone().expect("join was not called with the holder's pid");
    let ours = std::fs::read_link("/proc/self/ns/net").unwrap();
    assert_ne!(holder_ns, ours, "the holder shares the host's namespace");
    assert!(out.starts_with(&format!("{}\n", holder_ns.display())), "{out} vs {holder_ns:?}");
    assert!(out.trim_end().ends_with("lo"), "{out}");
    assert_eq!(leftovers(), 0);
    // A join that fails starts no guest, and leaves nothing.
    let refused = rt().block_on(tier.run_granted_in_netns(&sh("echo ran"), &grants, |_| Err("no setns here".into())));
    assert!(matches!(&refused, Err(RunError::Unsupported { reason, .. }) if reason == "no setns here"), "{refused:?}");
    assert_eq!(leftovers(), 0);
    // Under gVisor the guest would not see the namespace's loopback: refused before any
    // container exists.
    if let Ok(gvisor) = rt().block_on(tier.clone().runtime("runsc")) {
        let refused = rt().block_on(gvisor.run_granted_in_netns(&sh("echo ran"), &grants, |_| Ok(())));
        assert!(
            matches!(&refused, Err(RunError::Unsupported { reason, .. }) if reason.contains("runsc")),
            "{refused:?}"
        );
        assert_eq!(leftovers(), 0);
    }
    let _ = std::fs::remove_dir_all(&grants);
}

#[test]
fn g10_a_session_container_keeps_files_and_processes_between_execs_and_its_deadline_ends_one_exec() {
    use stockade_docker::session::{DockerSessionConfig, SESSION_HOME};
    use stockade_protocol::LiveIo;
    let _g = ENGINE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(tier) = tier("g10_a_session_container") else { return };
    rt().block_on(async {
        let limits = Limits::default().with_memory(64 << 20).unwrap();
        let session =
            tier.session(DockerSessionConfig { limits, ..DockerSessionConfig::new(DEFAULT_IMAGE) }).await.unwrap();
        let cmd = |s: &str| Job::command("sh", ["-c", s]).unwrap().with_env("PATH", "/bin:/usr/bin").unwrap();
        // An exec with its own stdin, env and cwd; files and processes persist.
        let job = cmd("read l; echo \"$l $G\"; pwd; echo kept > note; (sleep 300 &) ; echo err >&2; exit 3")
            .with_stdin(b"hello\n".to_vec())
            .unwrap()
            .with_env("G", "world")
            .unwrap();
        let r = session.exec(&job, None, LiveIo::default()).await.unwrap();
        assert_eq!(r.status, Status::Exited { code: 3 }, "{r:?}");
        assert_eq!(String::from_utf8_lossy(&r.stdout.bytes), format!("hello world\n{SESSION_HOME}\n"));
        assert_eq!(r.stderr.bytes, b"err\n");
        let r =
            session.exec(&cmd("cat note; id -u; echo \"[$G]\""), Some("/home/user"), LiveIo::default()).await.unwrap();
        assert_eq!(String::from_utf8_lossy(&r.stdout.bytes), "kept\n65534\n[]\n", "{r:?}");
        // The engine lists the sleep the first exec left running.
        let listed = session.processes().await.unwrap();
        assert!(listed.iter().any(|p| p.cmdline.contains("sleep 300")), "{listed:?}");
        // A guest's own `cat` is listed; the container's init and its keeper (`cat`, under a
        // uid of their own) are not.
        session.exec(&cmd("(sleep 299 | cat > /dev/null &)"), None, LiveIo::default()).await.unwrap();
        let mut listed = Vec::new();
        for _ in 0..100 {
            listed = session.processes().await.unwrap();
            if listed.iter().any(|p| p.cmdline == "cat") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(listed.iter().filter(|p| p.cmdline == "cat").count(), 1, "{listed:?}");
        assert!(!listed.iter().any(|p| p.cmdline.contains("docker-init")), "{listed:?}");
        // The files API: through the engine's archive API, in and out of the home.
        session.write("/home/user/in.txt", b"from the host\n").await.unwrap();
        let r =
            session.exec(&cmd("cat in.txt; ls -ln in.txt | awk '{print $3}'"), None, LiveIo::default()).await.unwrap();
        assert_eq!(String::from_utf8_lossy(&r.stdout.bytes), "from the host\n65534\n", "{r:?}");
        assert_eq!(session.read("/home/user/note", 1 << 20).await.unwrap(), b"kept\n");
        assert!(session.read("/home/user/missing", 1 << 20).await.is_err());
        assert!(session.read("/home/user/../../etc/passwd", 1 << 20).await.is_err(), "`..` is refused");
        assert!(session.read("/home/user", 1 << 20).await.is_err(), "a directory is not a file");
        // The root stays read-only for a write through the API as for the guest.
        assert!(session.write("/etc/planted", b"x").await.is_err());
        // The rest of the files API runs inside the container, as the job user.
        use stockade_hostfs::files::Kind;
        assert!(session.mkdir("/home/user/d/e").await.unwrap(), "made, with its parent");
        assert!(!session.mkdir("/home/user/d/e").await.unwrap(), "there already");
        session.write("/home/user/d/a b.txt", b"12345").await.unwrap();
        session.exec(&cmd("ln -s /etc/passwd /home/user/d/link"), None, LiveIo::default()).await.unwrap();
        let listed = session.list("/home/user/d", 2).await.unwrap();
        let seen: Vec<(&str, Kind, u64)> = listed.iter().map(|e| (e.path.as_str(), e.kind, e.size)).collect();
        assert_eq!(seen[0], ("/home/user/d/a b.txt", Kind::File, 5), "{listed:?}");
        assert_eq!((seen[1].0, seen[1].1), ("/home/user/d/e", Kind::Dir), "{listed:?}");
        assert_eq!((seen[2].0, seen[2].1), ("/home/user/d/link", Kind::Symlink), "a link is listed, not followed");
        assert_eq!(listed.len(), 3, "{listed:?}");
        let st = session.stat("/home/user/d/a b.txt").await.unwrap();
        assert_eq!((st.kind, st.size, st.mode), (Kind::File, 5, 0o644), "{st:?}");
        assert!(st.modified > 1_700_000_000, "{st:?}");
        session.write("/home/user/new/deeper/f", b"x").await.unwrap();
        assert_eq!(session.stat("/home/user/new/deeper").await.unwrap().kind, Kind::Dir, "a write makes its parents");
        session.rename("/home/user/d/a b.txt", "/home/user/moved/c.txt").await.unwrap();
        assert_eq!(session.read("/home/user/moved/c.txt", 64).await.unwrap(), b"12345");
        session.remove("/home/user/d").await.unwrap();
        let gone = session.stat("/home/user/d").await.unwrap_err().to_string();
        assert!(gone.contains("/home/user/d: no such file or directory"), "{gone}");
        assert!(session.list("/home/user/../etc", 1).await.is_err(), "`..` is refused");
        // The guest's own permissions: the read-only root cannot be changed this way either.
        let denied = session.mkdir("/etc/planted").await.unwrap_err().to_string();
        assert!(denied.contains("/etc/planted"), "{denied}");
        assert!(session.remove("/etc/passwd").await.is_err());
        // A deadline ends that exec (and its process group), not the session.
        let slow = cmd("sleep 30").with_limits(Limits::default().with_wall(Duration::from_millis(500)).unwrap());
        let r = session.exec(&slow, None, LiveIo::default()).await.unwrap();
        assert_eq!(r.status, Status::TimedOut, "{r:?}");
        assert!(session.alive().await, "the session outlives an exec's deadline");
        let count =
            "echo still here; for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done | grep -c '^sleep 3'";
        let r = session.exec(&cmd(count), None, LiveIo::default()).await.unwrap();
        assert!(!r.enforcement.iter().any(|e| e.detail.contains("SIGKILL to the container")), "{r:?}");
        assert_eq!(
            String::from_utf8_lossy(&r.stdout.bytes),
            "still here\n1\n",
            "only the first exec's sleep is left: {r:?}"
        );
        // A memory bomb is out of memory (the container's memory cgroup counted the kill,
        // read from the host), and the session goes on.
        let bomb = cmd("x=aaaaaaaaaaaaaaaa; while true; do x=$x$x; done")
            .with_limits(Limits::default().with_wall(Duration::from_secs(30)).unwrap());
        let r = session.exec(&bomb, None, LiveIo::default()).await.unwrap();
        assert_eq!(r.status, Status::OutOfMemory, "{r:?}");
        let r = session.exec(&cmd("echo after"), None, LiveIo::default()).await.unwrap();
        assert_eq!(String::from_utf8_lossy(&r.stdout.bytes), "after\n", "{r:?}");
        // Pause freezes it (judged by the engine's state).
        session.pause().await.unwrap();
        let state = bollard::Docker::connect_with_local_defaults()
            .unwrap()
            .inspect_container(session.container().unwrap(), None)
            .await
            .unwrap()
            .state
            .unwrap();
        assert_eq!(state.paused, Some(true));
        session.resume().await.unwrap();
        session.kill().await;
    });
    assert_eq!(leftovers(), 0, "the session's container is removed");
    assert_eq!(leftover_volumes(), 0, "and its home volume");
}
