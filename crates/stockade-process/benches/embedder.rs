#![allow(missing_docs, reason = "criterion_group generates undocumented items")]
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a bench fails loudly")]
//! The process tier from a long-lived multi-threaded embedder: this program starts the fork
//! server first thing in `main`, then a tokio runtime with 2 worker threads, and runs jobs
//! with `ProcessTier::run`, every mechanism on (cgroup, namespaces, view, landlock,
//! seccomp). Side by side, from the same program and in the same run:
//! - `baseline_bare_spawn`: the program itself, spawned with `tokio::process`;
//! - `bwrap_unshare_all`: `bwrap --unshare-all` with the flags of `research/process-tier.md`
//!   §6, spawned the same way (skipped, and said so, when bwrap is not installed);
//! - `stockade_fork_server`: `Helper::fork()`, through the fork server;
//! - `stockade_pool`: the same with `ProcessTier::pool(8)`: sandboxes built ahead of their
//!   jobs, each replaced while its run goes on (the replacement's CPU is counted: it is in
//!   the bench's cgroup);
//! - `stockade_exec_helper`: `Helper::at(stockade-process-helper)`, an exec of the helper
//!   binary per run, which is what a multi-threaded embedder paid without the server.
//!
//! Groups: `process_embedder_true` and `process_embedder_python` (one run at a time, back to
//! back: the median is the p50 latency), `process_embedder_true_spaced` (one run after each
//! 10 ms of idle time, which is not timed: the latency of a caller that does something
//! between runs, and the pool's best case) and `process_embedder_8_concurrent` (`/bin/true` with 8 runs
//! always in flight; an iteration is 8 runs, so the throughput is in runs/s). CPU per run is measured from the host: this
//! program moves itself into a cgroup of its own in the v1 `cpuacct` hierarchy before it
//! starts anything, so that every process it or a run creates is counted there whoever
//! reaps it (bwrap's pid 1 is reaped by the system's init, so counting reaped children would
//! miss it), and the growth of `cpuacct.usage` over a benchmark, divided by its runs, is the
//! CPU per run, this program's own work for the run included. Without that hierarchy it
//! falls back to reaped children plus the fork server, and says so. The figures are printed,
//! and written as JSON to `$STOCKADE_BENCH_CPU_OUT` when that is set (`cargo xtask bench
//! process`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod common;

use common::spawn;
use criterion::{Criterion, Throughput};
use stockade_process::{ForkServer, Helper, ProcessTier};
use stockade_protocol::{Job, Status};

const BWRAP: &str = "--unshare-all --die-with-parent --new-session --ro-bind /usr /usr --symlink usr/lib /lib \
                     --symlink usr/lib64 /lib64 --symlink usr/bin /bin --symlink usr/sbin /sbin --ro-bind /etc /etc \
                     --proc /proc --dev /dev --tmpfs /tmp --clearenv";

/// One way of running a program from this embedder.
#[derive(Clone)]
enum Variant {
    Bare,
    Bwrap,
    Tier(Arc<ProcessTier>),
}

impl Variant {
    async fn run(&self, program: &[&str]) {
        match self {
            Self::Bare => spawn(program[0], &program[1..]).await,
            Self::Bwrap => {
                let mut args: Vec<&str> = BWRAP.split_whitespace().collect();
                args.extend_from_slice(program);
                spawn("bwrap", &args).await;
            }
            Self::Tier(tier) => {
                let job = Job::command(program[0], program[1..].iter().copied()).unwrap();
                let r = tier.run(&job).await.unwrap();
                assert_eq!(r.status, Status::Exited { code: 0 }, "{r:#?}");
            }
        }
    }
}

/// Where CPU time is read from.
enum Meter {
    /// A cgroup of this program's own in the v1 `cpuacct` hierarchy: `cpuacct.usage` (ns).
    Cgroup(std::path::PathBuf),
    /// Reaped children of this program (`/proc/self/stat`) plus the fork server, in ticks.
    Children(u32),
}

impl Meter {
    fn new(server: u32) -> Self {
        let dir = std::path::PathBuf::from(format!("/sys/fs/cgroup/cpuacct/stockade-bench-{}", std::process::id()));
        let joined = std::fs::create_dir(&dir)
            .and_then(|()| std::fs::write(dir.join("cgroup.procs"), std::process::id().to_string()));
        match joined {
            // The fork server was started before: move it too.
            Ok(()) if std::fs::write(dir.join("cgroup.procs"), server.to_string()).is_ok() => Self::Cgroup(dir),
            r => {
                eprintln!("cpu: no cpuacct cgroup ({r:?}); counting reaped children and the fork server");
                let _ = std::fs::remove_dir(&dir);
                Self::Children(server)
            }
        }
    }

    fn label(&self) -> &'static str {
        match self {
            Self::Cgroup(_) => "cpuacct cgroup of the bench",
            Self::Children(_) => "reaped children and the fork server",
        }
    }

    /// CPU so far, in ms.
    fn ms(&self) -> f64 {
        match self {
            Self::Cgroup(dir) => {
                let ns: u64 = std::fs::read_to_string(dir.join("cpuacct.usage")).unwrap().trim().parse().unwrap();
                ns as f64 / 1e6
            }
            Self::Children(server) => {
                let fields = |path: String, at: &[usize]| -> u64 {
                    let stat = std::fs::read_to_string(path).unwrap_or_default();
                    let rest = stat.rsplit_once(')').map(|(_, r)| r.to_owned()).unwrap_or_default();
                    let f: Vec<&str> = rest.split_whitespace().collect();
                    // After the command name, field 3 (state) is index 0: utime 14, stime 15,
                    // cutime 16, cstime 17 (proc_pid_stat(5)), in ticks of 10 ms.
                    at.iter().map(|i| f.get(i - 3).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)).sum()
                };
                let ticks =
                    fields("/proc/self/stat".into(), &[16, 17]) + fields(format!("/proc/{server}/stat"), &[14, 15]);
                ticks as f64 * 10.0
            }
        }
    }

    /// Leaves the cgroup (this program and its server) and removes it.
    fn close(&self, server: u32) {
        if let Self::Cgroup(dir) = self {
            let parent = dir.parent().unwrap().join("cgroup.procs");
            let _ = std::fs::write(&parent, std::process::id().to_string());
            let _ = std::fs::write(&parent, server.to_string());
            let _ = std::fs::remove_dir(dir);
        }
    }
}

struct Cpu {
    meter: Meter,
    rows: std::sync::Mutex<Vec<serde_json::Value>>,
}

impl Cpu {
    /// Runs `bench` and records the CPU per run of the runs it made (`runs` counts them).
    fn measure(&self, group: &str, name: &str, runs: &AtomicU64, bench: impl FnOnce()) {
        let (before, start) = (self.meter.ms(), runs.load(Ordering::Relaxed));
        bench();
        let n = runs.load(Ordering::Relaxed) - start;
        let per_run_ms = (self.meter.ms() - before) / n.max(1) as f64;
        println!("cpu per run: {group}/{name}: {per_run_ms:.3} ms over {n} runs ({})", self.meter.label());
        self.rows.lock().unwrap().push(serde_json::json!({
            "group": group, "benchmark": name, "runs": n, "cpu_ms_per_run": per_run_ms, "meter": self.meter.label(),
        }));
    }
}

fn variants() -> Vec<(&'static str, Variant)> {
    let mut v = vec![("baseline_bare_spawn", Variant::Bare)];
    if std::process::Command::new("bwrap").arg("--version").output().is_ok_and(|o| o.status.success()) {
        v.push(("bwrap_unshare_all", Variant::Bwrap));
    } else {
        eprintln!("SKIPPED bwrap_unshare_all: bwrap is not installed (cargo xtask bench process installs it)");
    }
    v.push(("stockade_fork_server", Variant::Tier(Arc::new(ProcessTier::new(Helper::fork())))));
    v.push(("stockade_pool", Variant::Tier(Arc::new(ProcessTier::new(Helper::fork()).pool(8)))));
    v.push((
        "stockade_exec_helper",
        Variant::Tier(Arc::new(ProcessTier::new(Helper::at(env!("CARGO_BIN_EXE_stockade-process-helper"))))),
    ));
    v
}

fn main() {
    let server = ForkServer::start().expect("the bench starts single-threaded");
    let cpu = Cpu { meter: Meter::new(server), rows: std::sync::Mutex::new(Vec::new()) };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut c = Criterion::default().configure_from_args().warm_up_time(Duration::from_secs(2));
    let runs = AtomicU64::new(0);
    for (group, program) in [
        ("process_embedder_true", &["/bin/true"][..]),
        ("process_embedder_python", &["/usr/bin/python3", "-c", "pass"]),
    ] {
        let mut g = c.benchmark_group(group);
        g.sample_size(50).measurement_time(Duration::from_secs(6));
        for (name, variant) in variants() {
            cpu.measure(group, name, &runs, || {
                g.bench_function(name, |b| {
                    b.iter(|| {
                        rt.block_on(variant.run(program));
                        runs.fetch_add(1, Ordering::Relaxed);
                    });
                });
            });
        }
        g.finish();
    }
    // One run after 10 ms of idle time each (not timed): the latency a caller that does
    // something between runs (an agent waiting for its model) sees, with the pool's
    // replacement built in the gap.
    let group = "process_embedder_true_spaced";
    let mut g = c.benchmark_group(group);
    g.sample_size(20).measurement_time(Duration::from_secs(4));
    for (name, variant) in variants().into_iter().filter(|(n, _)| *n != "stockade_exec_helper") {
        cpu.measure(group, name, &runs, || {
            g.bench_function(name, |b| {
                b.iter_custom(|iters| {
                    let mut spent = Duration::ZERO;
                    for _ in 0..iters {
                        std::thread::sleep(Duration::from_millis(10));
                        let start = Instant::now();
                        rt.block_on(variant.run(&["/bin/true"]));
                        spent += start.elapsed();
                    }
                    runs.fetch_add(iters, Ordering::Relaxed);
                    spent
                });
            });
        });
    }
    g.finish();
    let group = "process_embedder_8_concurrent";
    let mut g = c.benchmark_group(group);
    g.sample_size(30).measurement_time(Duration::from_secs(6)).throughput(Throughput::Elements(8));
    for (name, variant) in variants() {
        cpu.measure(group, name, &runs, || {
            g.bench_function(name, |b| {
                // `iters * 8` runs with 8 always in flight: 8 tasks each take the next run
                // until none is left (no barrier between batches).
                b.iter_custom(|iters| {
                    let start = Instant::now();
                    let left = Arc::new(AtomicU64::new(iters * 8));
                    rt.block_on(async {
                        let mut set = tokio::task::JoinSet::new();
                        for _ in 0..8 {
                            let (v, left) = (variant.clone(), left.clone());
                            set.spawn(async move {
                                while left
                                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                                    .is_ok()
                                {
                                    v.run(&["/bin/true"]).await;
                                }
                            });
                        }
                        while let Some(r) = set.join_next().await {
                            r.unwrap();
                        }
                    });
                    runs.fetch_add(iters * 8, Ordering::Relaxed);
                    start.elapsed()
                });
            });
        });
    }
    g.finish();
    c.final_summary();
    cpu.meter.close(server);
    if let Some(path) = std::env::var_os("STOCKADE_BENCH_CPU_OUT") {
        let rows = cpu.rows.lock().unwrap();
        std::fs::write(path, serde_json::to_vec_pretty(&*rows).unwrap()).unwrap();
    }
}
