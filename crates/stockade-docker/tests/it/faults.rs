//! Faults (issue 14), each injected for real and judged from the host through the engine's
//! own socket: a supervisor SIGKILLed mid-run, the engine's socket gone mid-run, the engine
//! itself crashed or restarted mid-run (a private engine the test starts), and a host
//! directory that fills up while a staged workspace comes back.

use std::io::{BufRead, BufReader};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use stockade_docker::DockerTier;
use stockade_docker::pool::{DockerPool, PoolConfig};
use stockade_docker::spec::DEFAULT_IMAGE;
use stockade_protocol::{Limits, Status};

use crate::docker::{ENGINE, containers_named_for, containers_of, leftover_volumes, leftovers, rt, sh, tier};
use crate::engine::{PrivateEngine, Stop};

/// Not a guarantee's test: the supervisor `g4_a_killed_supervisor...` starts and SIGKILLs.
/// Without `STOCKADE_FAULT_CHILD` it returns at once.
#[test]
fn fault_child_supervisor() {
    if std::env::var_os("STOCKADE_FAULT_CHILD").is_none() {
        return;
    }
    let tier = rt().block_on(DockerTier::connect()).unwrap();
    let rt = rt();
    rt.block_on(async {
        let pool = DockerPool::new(tier.clone(), PoolConfig::new(2, DEFAULT_IMAGE)).await.unwrap();
        let job = sh("sleep 120").with_limits(Limits::new().with_wall(Duration::from_secs(110)).unwrap());
        let (one_shot, pooled) = (tier.clone(), pool.clone());
        let (a, b) = (job.clone(), job);
        tokio::spawn(async move { one_shot.run(&a).await });
        tokio::spawn(async move { pooled.run(&b).await });
        // The pool's idle container, the one its run took, and the one-shot run's.
        let pid = std::process::id();
        let started = Instant::now();
        while containers_named_for(pid, true).await < 3 && started.elapsed() < Duration::from_secs(60) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        println!("ready {}", containers_named_for(pid, true).await);
        tokio::time::sleep(Duration::from_secs(600)).await;
    });
}

#[test]
fn g4_a_killed_supervisors_containers_are_reaped_at_the_next_connect_and_a_live_ones_are_not() {
    let _one = ENGINE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(tier) = tier("g4_a_killed_supervisor") else { return };
    let rt = rt();
    // A live supervisor's container (this process's), which no reaping may touch.
    let live = rt.block_on(DockerPool::new(tier.clone(), PoolConfig::new(1, DEFAULT_IMAGE))).unwrap();
    let mut child = Killed(
        Command::new(std::env::current_exe().unwrap())
            .args(["faults::fault_child_supervisor", "--exact", "--nocapture", "--test-threads=1"])
            .env("STOCKADE_FAULT_CHILD", "1")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let pid = child.0.id();
    let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
    // libtest prints the test's name first, on the same line.
    let ready = lines.by_ref().map_while(Result::ok).find(|l| l.contains("ready ")).expect("the child never got ready");
    // SIGKILL: the supervisor gets no chance to clean up.
    drop(child);
    let left = containers_of(pid);
    assert!(left >= 3, "{ready}: the killed supervisor should have left its containers, found {left}");
    // The next start of any supervisor on this host reaps them: its connect runs the gc.
    let next = rt.block_on(DockerTier::connect()).unwrap();
    assert_eq!(containers_of(pid), 0, "the killed supervisor's containers outlived the next connect");
    assert_eq!(containers_of(std::process::id()), 1, "a live supervisor's container was reaped");
    assert_eq!(rt.block_on(next.gc(false)).unwrap(), 0, "gc found more to reap after the connect");
    rt.block_on(live.shutdown());
    assert_eq!(leftovers(), 0);
    assert_eq!(leftover_volumes(), 0);
}

/// A child process, SIGKILLed and reaped when this is dropped (also when the test fails).
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A unix-socket proxy to the engine that the test can cut: every connection through it
/// is shut down at once and new ones are refused, as when the engine stops or its socket
/// is removed. (The machine's engine itself is never restarted: that would stop every
/// container on it, not only this test's.)
struct Proxy {
    path: PathBuf,
    open: Arc<Mutex<Vec<UnixStream>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    fn start(path: &Path) -> Self {
        let _ = std::fs::remove_file(path);
        let engine = std::env::var("DOCKER_HOST")
            .ok()
            .and_then(|h| h.strip_prefix("unix://").map(str::to_owned))
            .unwrap_or_else(|| "/var/run/docker.sock".into());
        let listener = UnixListener::bind(path).unwrap();
        let (open, stop) = (Arc::new(Mutex::new(Vec::new())), Arc::new(AtomicBool::new(false)));
        let (o, s) = (open.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = conn else { continue };
                let Ok(upstream) = UnixStream::connect(&engine) else { continue };
                let mut guard = o.lock().unwrap();
                guard.push(client.try_clone().unwrap());
                guard.push(upstream.try_clone().unwrap());
                drop(guard);
                let (mut c2, mut u2) = (client.try_clone().unwrap(), upstream.try_clone().unwrap());
                let (mut c1, mut u1) = (client, upstream);
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut c1, &mut u1);
                    let _ = u1.shutdown(std::net::Shutdown::Write);
                });
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut u2, &mut c2);
                    let _ = c2.shutdown(std::net::Shutdown::Write);
                });
            }
        });
        Self { path: path.to_path_buf(), open, stop, thread: Some(thread) }
    }

    /// Cuts every connection and removes the socket.
    fn cut(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = UnixStream::connect(&self.path); // wakes the accept loop
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        let _ = std::fs::remove_file(&self.path);
        for s in self.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
    }
}

#[test]
fn g5_an_engine_gone_mid_run_is_a_typed_error_and_its_container_is_removed_once_it_is_back() {
    let _one = ENGINE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if tier("g5_an_engine_gone_mid_run").is_none() {
        return;
    }
    let path = std::env::temp_dir().join(format!("stockade-docker-proxy-{}.sock", std::process::id()));
    let mut proxy = Proxy::start(&path);
    let rt = rt();
    let through = rt.block_on(DockerTier::connect_to(&format!("unix://{}", path.display()))).unwrap();
    let job = sh("sleep 60").with_limits(Limits::new().with_wall(Duration::from_secs(50)).unwrap());
    let pid = std::process::id();
    let (result, took) = rt.block_on(async {
        let t = through.clone();
        let run = tokio::spawn(async move { t.run(&job).await });
        let started = Instant::now();
        while containers_named_for(pid, true).await == 0 && started.elapsed() < Duration::from_secs(30) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(containers_named_for(pid, true).await, 1, "the run's container never started");
        proxy.cut();
        let cut_at = Instant::now();
        let result =
            tokio::time::timeout(Duration::from_secs(40), run).await.expect("the run hung after the engine went away");
        (result.unwrap(), cut_at.elapsed())
    });
    let err = result.expect_err("a run whose engine went away cannot have a report");
    assert!(matches!(err, stockade_docker::RunError::Engine(_)), "{err}");
    assert!(took < Duration::from_secs(20), "the run took {took:?} to notice the engine was gone");
    // While it is gone, a run fails at once, typed, and starts nothing.
    let gone = rt.block_on(through.run(&sh("true")));
    assert!(matches!(gone, Err(stockade_docker::RunError::Engine(_))), "{gone:?}");
    // The container of the cut run is still on the engine (its removal could not reach it).
    assert_eq!(containers_of(pid), 1, "expected the cut run's container to be left for now");
    // Back: the next run works, and removes what the cut left behind.
    let _back = Proxy::start(&path);
    let r = rt.block_on(through.run(&sh("echo back"))).unwrap();
    assert_eq!(r.status, Status::Exited { code: 0 }, "{r:?}");
    assert_eq!(leftovers(), 0, "the cut run's container was not removed once the engine was back");
    assert_eq!(leftover_volumes(), 0);
}

/// The engine itself restarted mid-run, on a private engine this test starts (see
/// [`PrivateEngine`]): crashed (SIGKILL: its containers go on under their shims until it is
/// back, and it stops them when it restores), then restarted by a service manager
/// (SIGTERM: it closes its API, stops its containers and exits). Each time a one-shot run
/// and a pool run are in flight.
#[test]
fn g5_an_engine_restarted_mid_run_ends_its_runs_typed_and_once_it_is_back_runs_work_and_nothing_is_left() {
    let _one = ENGINE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let test = "g5_an_engine_restarted_mid_run";
    // The machine's engine holds the image the private one loads.
    if tier(test).is_none() {
        return;
    }
    let mut engine = match PrivateEngine::start(DEFAULT_IMAGE) {
        Ok(e) => e,
        Err(e) if std::env::var_os("STOCKADE_REQUIRE_ALL").is_some() => panic!("{test}: a private engine: {e}"),
        Err(e) => {
            eprintln!("SKIPPED {test}: no private engine: {e}");
            return;
        }
    };
    let rt = rt();
    let tier = rt.block_on(DockerTier::connect_to(&engine.host())).unwrap();
    let pool = rt.block_on(DockerPool::new(tier.clone(), PoolConfig::new(1, DEFAULT_IMAGE))).unwrap();
    for how in [Stop::Kill, Stop::Term] {
        let job = sh("sleep 60").with_limits(Limits::new().with_wall(Duration::from_secs(50)).unwrap());
        let (one_shot, pooled, took) = rt.block_on(async {
            let (t, p, a, b) = (tier.clone(), pool.clone(), job.clone(), job.clone());
            let one_shot = tokio::spawn(async move { t.run(&a).await });
            let pooled = tokio::spawn(async move { p.run(&b).await });
            let started = Instant::now();
            while engine.running("sleep 60").await < 2 && started.elapsed() < Duration::from_secs(30) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert_eq!(engine.running("sleep 60").await, 2, "{how:?}: both runs' guests should be running");
            engine.stop(how);
            let stopped = Instant::now();
            let limit = Duration::from_secs(40);
            let one_shot = tokio::time::timeout(limit, one_shot).await.expect("the one-shot run hung").unwrap();
            let pooled = tokio::time::timeout(limit, pooled).await.expect("the pool run hung").unwrap();
            (one_shot, pooled, stopped.elapsed())
        });
        for (what, result) in [("one-shot", one_shot), ("pool", pooled)] {
            let err = result.expect_err(&format!("{how:?}: a {what} run whose engine went away cannot have a report"));
            assert!(matches!(err, stockade_docker::RunError::Engine(_)), "{how:?} {what}: {err}");
        }
        assert!(took < Duration::from_secs(20), "{how:?}: the runs took {took:?} to end after the engine stopped");
        // While it is down, runs fail at once, typed.
        let down = rt.block_on(tier.run(&sh("true")));
        assert!(matches!(down, Err(stockade_docker::RunError::Engine(_))), "{how:?}: {down:?}");
        let down = rt.block_on(pool.run(&sh("true")));
        assert!(matches!(down, Err(stockade_docker::RunError::Engine(_))), "{how:?}: {down:?}");
        // Back: the next runs work, and what the restart left behind is removed.
        engine.up().unwrap();
        let r = rt.block_on(tier.run(&sh("echo back"))).unwrap();
        assert_eq!((&r.status, &r.stdout.bytes[..]), (&Status::Exited { code: 0 }, &b"back\n"[..]), "{how:?}: {r:?}");
        let r = rt.block_on(pool.run(&sh("echo back"))).unwrap();
        assert_eq!((&r.status, &r.stdout.bytes[..]), (&Status::Exited { code: 0 }, &b"back\n"[..]), "{how:?}: {r:?}");
        // Only the pool's replacement container is left (its one idle container).
        let counts = rt.block_on(engine.counts_settle((1, 0)));
        assert_eq!(counts, (1, 0), "{how:?}: (containers, volumes) of this process on the engine after the restart");
    }
    rt.block_on(pool.shutdown());
    let counts = rt.block_on(engine.counts_settle((0, 0)));
    assert_eq!(counts, (0, 0), "(containers, volumes) of this process on the engine after the pool's shutdown");
}
