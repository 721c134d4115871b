//! `stockade-soak`: sustained load on the process, wasm and docker tiers, usually started by
//! `cargo xtask soak`.
//!
//! Usage: `stockade-soak [--tier process|process-pool|process-session|wasm|docker|docker-pool|docker-session|serve|all]
//! [--runs N] [--docker-runs N] [--concurrency C] [--seed S] [--markdown FILE] [--stockade PATH]` (`docker` is
//! one-shot runs, a container each; `--docker-runs` sets the run count of the docker tiers)
//!
//! Each run is a job drawn from a fixed, seeded mix (per tier: a trivial run, a small
//! computation whose output is checked, an output flood, a sleep past the deadline, a memory
//! bomb, for the wasm tier a module whose pre-initializer grows its memory and then sleeps,
//! for the process tier a fork bomb, and for the process and docker tiers a read-write
//! workspace job whose result the host reads back). Every outcome is compared with the one
//! that kind must have. The host counts, before the first run and after the last: this
//! process's descriptors, its descendants (the fork server aside), its per-run cgroups, the
//! mounts it sees, stockade's entries in the temp directory, and (through the docker CLI,
//! not the tier) stockade's containers and volumes and the engine's images; and
//! samples its RSS at the start (after a warm-up run of every kind), at 10% of the runs and
//! at the end. It passes with no unexpected outcome, nothing left behind, and the RSS at the
//! end within 10% (or 4 MiB) of the RSS at the start, and no panic on any of this process's
//! threads (a tier's background thread that panics stops doing its work, which no outcome
//! may show).
//!
//! `process-session` soaks sessions (`ProcessTier::session`): its runs are execs, ten to a
//! session (`--runs 10000` is 1,000 sessions), each session made with a read-write workspace
//! and a home of its own, used for ten execs of the process tier's mix (a fork bomb only as a
//! session's last exec, since what it forks lives on in the session) and killed, `--concurrency`
//! sessions at a time; a `session` row counts the sessions made and killed.
//! `docker-session` does the same with docker sessions (`DockerTier::session`: a container
//! each, the worker's directory staged read-write), the docker mix as execs; a workspace
//! exec's file is read by the host once its session has ended and copied it back.
//!
//! `serve` soaks `stockade serve --listen` (the binary `--stockade` names) through E2B's API
//! beside hostile clients, and judges the owner from `/proc` and `df`: see `serve.rs`.
//!
//! `main` starts the process tier's fork server first, while this program is still
//! single-threaded, as every embedder should.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use stockade_docker::DockerTier;
use stockade_docker::pool::{DockerPool, PoolConfig};
use stockade_process::{ForkServer, Helper, ProcessTier};
use stockade_protocol::{Access, Job, JobKind, Limits, Report, Status, Stream};
use stockade_wasm::WasmTier;

mod serve;

struct Args {
    tiers: Vec<String>,
    /// No `--tier` was given: a tier whose host lacks what it needs (no docker engine) is
    /// skipped with a message instead of failing, unless `STOCKADE_REQUIRE_ALL` is set.
    defaulted: bool,
    runs: u64,
    docker_runs: Option<u64>,
    concurrency: usize,
    seed: u64,
    markdown: Option<PathBuf>,
    /// The `stockade` binary the serve tier starts.
    stockade: Option<PathBuf>,
}

fn parse() -> Result<Args> {
    let mut a = Args {
        tiers: Vec::new(),
        defaulted: false,
        runs: 10_000,
        docker_runs: None,
        concurrency: 8,
        seed: 0x5eed,
        markdown: None,
        stockade: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(x) = it.next() {
        let mut value = || it.next().with_context(|| format!("{x} needs a value"));
        match x.as_str() {
            "--tier" => a.tiers.push(value()?),
            "--runs" => a.runs = value()?.parse().context("--runs")?,
            "--docker-runs" => a.docker_runs = Some(value()?.parse().context("--docker-runs")?),
            "--concurrency" => a.concurrency = value()?.parse().context("--concurrency")?,
            "--seed" => a.seed = value()?.parse().context("--seed")?,
            "--markdown" => a.markdown = Some(value()?.into()),
            "--stockade" => a.stockade = Some(value()?.into()),
            other => bail!("unknown argument {other:?}"),
        }
    }
    a.defaulted = a.tiers.is_empty();
    if a.tiers.is_empty() || a.tiers.iter().any(|t| t == "all") {
        a.tiers = vec![
            "process".into(),
            "process-pool".into(),
            "process-session".into(),
            "wasm".into(),
            "docker".into(),
            "docker-pool".into(),
            "docker-session".into(),
            "serve".into(),
        ];
    }
    if a.concurrency == 0 || a.runs == 0 {
        bail!("--runs and --concurrency must be at least 1");
    }
    Ok(a)
}

/// splitmix64: the mix is the same for the same seed and run number.
fn mix(seed: u64, n: u64) -> u64 {
    let mut z = seed.wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Builds run `n`'s job, with a workspace directory of its worker's.
type MakeJob = Box<dyn Fn(u64, &Path) -> Result<Job> + Send + Sync>;
/// Whether run `n`'s report, and what the host finds in the run's workspace directory
/// afterwards, are what its kind must give.
type Expect = Box<dyn Fn(&Report, u64, &Path) -> bool + Send + Sync>;

/// One kind of job: its name, its weight in the mix, and what its report must say.
struct Kind {
    name: &'static str,
    weight: u64,
    job: MakeJob,
    expect: Expect,
    expected: &'static str,
}

fn limits(wall_ms: u64) -> Result<Limits> {
    Ok(Limits::new().with_wall(Duration::from_millis(wall_ms))?.with_cpu(Duration::from_secs(10))?)
}

fn out(r: &Report) -> &[u8] {
    &r.stdout.bytes
}

fn exited0(r: &Report) -> bool {
    r.status == Status::Exited { code: 0 }
}

/// Run `n`'s computation exited 0 and printed the sum of 0..n % 1000.
fn prints_sum(r: &Report, n: u64) -> bool {
    exited0(r) && out(r) == format!("{}\n", (0..n % 1000).sum::<u64>()).as_bytes()
}

/// A flood ended at its 64 KiB stdout budget, keeping at most that.
fn flooded(r: &Report) -> bool {
    r.status == Status::OutputLimit { stream: Stream::Stdout } && r.stdout.bytes.len() <= 64 << 10
}

fn process_kinds(cgroups: bool) -> Vec<Kind> {
    let py = |code: &str| Job::command("/usr/bin/python3", ["-c", code]);
    let flood = Limits::new().with_stdout(64 << 10).and_then(|l| l.with_wall(Duration::from_secs(10)));
    vec![
        Kind {
            name: "true",
            weight: 30,
            job: Box::new(|_, _| Ok(Job::command("/bin/true", Vec::<String>::new())?)),
            expect: Box::new(|r, _, _| exited0(r)),
            expected: "exits 0",
        },
        Kind {
            name: "python",
            weight: 20,
            job: Box::new(move |n, _| Ok(py(&format!("print(sum(range({n} % 1000)))"))?)),
            expect: Box::new(|r, n, _| prints_sum(r, n)),
            expected: "exits 0 and prints the sum it was asked for",
        },
        Kind {
            name: "flood",
            weight: 10,
            job: Box::new(move |_, _| {
                Ok(Job::command("/bin/sh", ["-c", "exec cat /dev/zero"])?.with_limits(flood.clone()?))
            }),
            expect: Box::new(|r, _, _| flooded(r)),
            expected: "output limit on stdout, at most 64 KiB kept",
        },
        Kind {
            name: "sleep",
            weight: 10,
            job: Box::new(|_, _| Ok(Job::command("/bin/sleep", ["30"])?.with_limits(limits(300)?))),
            expect: Box::new(|r, _, _| r.status == Status::TimedOut),
            expected: "timed out at 300 ms",
        },
        Kind {
            name: "memory",
            weight: 10,
            job: Box::new(move |_, _| {
                Ok(py("b = bytearray(1 << 30)")?.with_limits(limits(10_000)?.with_memory(128 << 20)?))
            }),
            expect: Box::new(move |r, _, _| {
                if cgroups { r.status == Status::OutOfMemory } else { r.status == Status::Exited { code: 1 } }
            }),
            expected: "out of memory (with a cgroup; MemoryError under RLIMIT_AS without)",
        },
        Kind {
            name: "fork_bomb",
            weight: 5,
            job: Box::new(move |_, _| {
                Ok(py("import os, time\ntry:\n    while True:\n        if os.fork() == 0:\n            time.sleep(30)\n            os._exit(0)\nexcept OSError:\n    print('capped')")?
                    .with_limits(limits(10_000)?))
            }),
            expect: Box::new(|r, _, _| exited0(r) && out(r) == b"capped\n"),
            expected: "fork fails at the process limit; the run ends with its guest, children and all",
        },
        Kind {
            name: "workspace",
            weight: 15,
            job: Box::new(|n, ws| {
                Ok(Job::command(
                    "/bin/sh",
                    ["-c", "echo \"$0\" > /workspace/out && cat /workspace/out", &n.to_string()],
                )?
                .with_workspace(ws, Access::ReadWrite)?)
            }),
            expect: Box::new(|r, n, ws| exited0(r) && out(r) == format!("{n}\n").as_bytes() && host_has(ws, n)),
            expected: "writes its run number into a read-write workspace; the host reads it there",
        },
    ]
}

/// Whether the host finds run `n`'s number in the workspace's `out`.
fn host_has(ws: &Path, n: u64) -> bool {
    std::fs::read_to_string(ws.join("out")).is_ok_and(|s| s == format!("{n}\n"))
}

/// The docker tier's image (`cargo xtask images`).
const DOCKER_IMAGE: &str = "stockade-busybox:local";

/// The docker tiers' memory and process limits, added to `l`: a pool's containers are
/// created with them, and a one-shot run's job carries them.
fn docker_limits(l: Limits) -> Result<Limits> {
    Ok(l.with_memory(64 << 20)?.with_processes(64)?)
}

/// The docker tiers' mix. A pool's containers carry [`docker_limits`]; a one-shot run
/// (`one_shot`) carries them in its job, so the memory bomb is judged against the same
/// 64 MiB either way. The pool stages the workspace into the container's volume and copies
/// it back; a one-shot run bind-mounts it.
fn docker_kinds(one_shot: bool) -> Vec<Kind> {
    let sh = |code: &str| Job::image(DOCKER_IMAGE, ["sh", "-c", code]);
    let lim = move |l: Limits| if one_shot { docker_limits(l) } else { Ok(l) };
    vec![
        Kind {
            name: "true",
            weight: 30,
            job: Box::new(move |_, _| Ok(Job::image(DOCKER_IMAGE, ["true"])?.with_limits(lim(Limits::new())?))),
            expect: Box::new(|r, _, _| exited0(r)),
            expected: "exits 0",
        },
        Kind {
            name: "compute",
            weight: 20,
            job: Box::new(move |n, _| {
                let m = n % 1000;
                Ok(sh(&format!("s=0; i=0; while [ $i -lt {m} ]; do s=$((s+i)); i=$((i+1)); done; echo $s"))?
                    .with_limits(lim(Limits::new())?))
            }),
            expect: Box::new(|r, n, _| prints_sum(r, n)),
            expected: "exits 0 and prints the sum it was asked for",
        },
        Kind {
            name: "flood",
            weight: 10,
            job: Box::new(move |_, _| {
                Ok(sh("exec cat /dev/zero")?.with_limits(lim(Limits::new().with_stdout(64 << 10)?)?))
            }),
            expect: Box::new(|r, _, _| flooded(r)),
            expected: "output limit on stdout, at most 64 KiB kept",
        },
        Kind {
            name: "sleep",
            weight: 10,
            job: Box::new(move |_, _| Ok(Job::image(DOCKER_IMAGE, ["sleep", "30"])?.with_limits(lim(limits(500)?)?))),
            expect: Box::new(|r, _, _| r.status == Status::TimedOut),
            expected: "timed out at 500 ms",
        },
        Kind {
            name: "memory",
            weight: 10,
            job: Box::new(move |_, _| {
                Ok(sh("x=aaaaaaaaaaaaaaaa; while true; do x=$x$x; done")?.with_limits(lim(limits(20_000)?)?))
            }),
            expect: Box::new(|r, _, _| r.status == Status::OutOfMemory),
            expected: "out of memory at 64 MiB",
        },
        Kind {
            name: "workspace",
            weight: 20,
            job: Box::new(move |n, ws| {
                if one_shot {
                    // A one-shot run bind-mounts the directory, and the container runs as the
                    // tier's default user (65534), which must be able to write there, as with
                    // `docker run --user`; a pool stages the directory into a volume it owns.
                    std::os::unix::fs::chown(ws, Some(65534), Some(65534))?;
                }
                Ok(Job::image(DOCKER_IMAGE, ["sh", "-c", "echo \"$0\" > out && cat out", &n.to_string()])?
                    .with_workspace(ws, Access::ReadWrite)?
                    .with_limits(lim(Limits::new())?))
            }),
            expect: Box::new(|r, n, ws| exited0(r) && out(r) == format!("{n}\n").as_bytes() && host_has(ws, n)),
            expected: if one_shot {
                "writes its run number into its bind-mounted workspace; the host reads it after the run"
            } else {
                "writes its run number into its staged workspace; the host reads it after the copy back"
            },
        },
    ]
}

/// A module whose pre-initializer (`wizer-initialize`, run as the tier loads it) grows its
/// memory until refused, filling it, then sleeps 30 s in the host (bounded, issue 39): it
/// must end at its run's deadline, within its run's memory, every time.
const PREINIT_BOMB: &str = r#"(module
  (import "wasi_snapshot_preview1" "poll_oneoff" (func $poll_oneoff (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "wizer-initialize") (local $pages i32)
    (block $full (loop $grow
      (local.set $pages (memory.grow (i32.const 16)))
      (br_if $full (i32.eq (local.get $pages) (i32.const -1)))
      (memory.fill (i32.mul (local.get $pages) (i32.const 65536)) (i32.const 65) (i32.const 1048576))
      (br $grow)))
    (i32.store8 (i32.const 1032) (i32.const 0))
    (i32.store (i32.const 1040) (i32.const 1))
    (i64.store (i32.const 1048) (i64.const 30000000000))
    (i64.store (i32.const 1056) (i64.const 0))
    (i32.store16 (i32.const 1064) (i32.const 0))
    (drop (call $poll_oneoff (i32.const 1024) (i32.const 2048) (i32.const 1) (i32.const 8))))
  (func (export "_start")))"#;

fn wasm_kinds(scratch: &Path) -> Result<Vec<Kind>> {
    let js = |code: &str| -> Result<Job> { Ok(stockade_wasm::javascript_job(code.as_bytes().to_vec())?) };
    js("0").context("the wasm tier's JavaScript guest (cargo xtask guests)")?;
    let preinit = scratch.join("preinit-bomb.wasm");
    std::fs::write(&preinit, wat::parse_str(PREINIT_BOMB)?)?;
    Ok(vec![
        Kind {
            name: "wasm_preinit_bomb",
            weight: 5,
            job: Box::new(move |_, _| {
                Ok(Job::wasm(&preinit, "_start", Vec::<String>::new())?
                    .with_limits(limits(300)?.with_memory(16 << 20)?))
            }),
            expect: Box::new(|r, _, _| {
                matches!(&r.status, Status::FailedToStart { reason } if reason.contains("deadline"))
                    && r.wall < Duration::from_secs(3)
            }),
            expected: "stopped at the 300 ms deadline, within 16 MiB",
        },
        Kind {
            name: "js_empty",
            weight: 30,
            job: Box::new(move |_, _| js("0")),
            expect: Box::new(|r, _, _| exited0(r)),
            expected: "exits 0",
        },
        Kind {
            name: "js_compute",
            weight: 30,
            job: Box::new(move |n, _| {
                js(&format!("let s = 0; for (let i = 0; i < {}; i++) s += i; console.log(s)", n % 1000))
            }),
            expect: Box::new(|r, n, _| prints_sum(r, n)),
            expected: "exits 0 and prints the sum it was asked for",
        },
        Kind {
            name: "js_flood",
            weight: 15,
            job: Box::new(move |_, _| {
                Ok(js("for (;;) console.log('x'.repeat(1000))")?.with_limits(Limits::new().with_stdout(64 << 10)?))
            }),
            expect: Box::new(|r, _, _| r.status == Status::OutputLimit { stream: Stream::Stdout }),
            expected: "output limit on stdout",
        },
        Kind {
            name: "js_spin",
            weight: 15,
            job: Box::new(move |_, _| Ok(js("for (;;) {}")?.with_limits(limits(300)?))),
            expect: Box::new(|r, _, _| r.status == Status::TimedOut),
            expected: "timed out at 300 ms",
        },
        Kind {
            name: "js_memory",
            weight: 10,
            job: Box::new(move |_, _| {
                Ok(js("let a = []; for (;;) a.push(new Array(1 << 20).fill(7))")?
                    .with_limits(limits(10_000)?.with_memory(64 << 20)?))
            }),
            expect: Box::new(|r, _, _| r.status == Status::OutOfMemory),
            expected: "out of memory at 64 MiB",
        },
    ])
}

/// What the host counts.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Resources {
    fds: usize,
    processes: usize,
    cgroups: usize,
    mounts: usize,
    temp_entries: usize,
    /// (stockade containers, stockade volumes, images), counted only for the docker tier.
    docker: Option<(usize, usize, usize)>,
}

/// Lines of a docker CLI listing (the host's view, not the tier's).
fn docker_lines(args: &[&str]) -> usize {
    std::process::Command::new("docker")
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map_or(usize::MAX, |o| String::from_utf8_lossy(&o.stdout).lines().count())
}

fn count_dir(p: impl AsRef<Path>) -> usize {
    std::fs::read_dir(p).map(|d| d.count()).unwrap_or(0)
}

/// This process's live descendants, the fork server aside (it is a child for the program's
/// whole life, and has no children of its own: it clones each helper as ours).
fn descendants(skip: Option<u32>) -> usize {
    stockade_test_support::descendants(std::process::id()).into_iter().filter(|p| Some(*p) != skip).count()
}

/// Per-run cgroups of this process (named `stockade-PID-...`) in its v1 memory and pids
/// hierarchies, or under its v2 cgroup.
fn own_cgroups() -> usize {
    let prefix = format!("stockade-{}-", std::process::id());
    let mine = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let mut n = 0;
    for line in mine.lines() {
        let mut f = line.splitn(3, ':');
        let (_, controllers, path) = (f.next(), f.next().unwrap_or_default(), f.next().unwrap_or_default());
        let base = match controllers {
            "" => PathBuf::from("/sys/fs/cgroup"),
            c if c.split(',').any(|c| c == "memory" || c == "pids") => PathBuf::from("/sys/fs/cgroup").join(c),
            _ => continue,
        };
        let dir = base.join(path.trim_start_matches('/'));
        n += std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .count();
    }
    n
}

fn resources(server: Option<u32>, docker: bool) -> Resources {
    let tmp = std::env::temp_dir();
    let label = format!("label={}", stockade_docker::spec::LABEL_RUN);
    Resources {
        docker: docker.then(|| {
            (
                docker_lines(&["ps", "-aq", "--filter", &label]),
                docker_lines(&["volume", "ls", "-q", "--filter", &label]),
                docker_lines(&["images", "-aq"]),
            )
        }),
        fds: count_dir("/proc/self/fd"),
        processes: descendants(server),
        cgroups: own_cgroups(),
        mounts: std::fs::read_to_string("/proc/self/mountinfo").map(|m| m.lines().count()).unwrap_or(0),
        temp_entries: std::fs::read_dir(&tmp)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("stockade"))
            .count(),
    }
}

/// Panics on any of this process's threads since it started, counted by the hook `main` sets.
static PANICS: AtomicU64 = AtomicU64::new(0);

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

enum Runner {
    Process(ProcessTier),
    Wasm(WasmTier),
    Docker(DockerTier),
    DockerPool(DockerPool),
}

impl Runner {
    async fn run(&self, job: &Job) -> Result<Report> {
        Ok(match self {
            Self::Process(t) => t.run(job).await?,
            Self::Wasm(t) => t.run(job).await?,
            Self::Docker(t) => t.run(job).await?,
            Self::DockerPool(p) => p.run(job).await?,
        })
    }
}

struct Record {
    kind: &'static str,
    ok: bool,
    latency: Duration,
    status: String,
}

struct Outcome {
    tier: String,
    runs: u64,
    elapsed: Duration,
    records: Vec<Record>,
    before: Resources,
    after: Resources,
    rss: [u64; 3],
    /// Panics on this process's threads while the tier was soaked.
    panics: u64,
    kinds: Vec<(&'static str, &'static str)>,
}

async fn soak_tier(tier: &str, args: &Args, server: Option<u32>, scratch: &Path) -> Result<Outcome> {
    // A pool's waiting sandboxes are resources too: for `process-pool` the count before is
    // taken before the tier exists, and the one after once it is dropped.
    let docker = tier.starts_with("docker");
    // Connecting reaps what a killed supervisor left on the engine, so it comes first.
    let engine = if docker {
        let engine = DockerTier::connect().await.context("the docker engine (DOCKER_HOST or the default socket)")?;
        if !engine.has_image(DOCKER_IMAGE).await {
            bail!("the engine has no {DOCKER_IMAGE} (cargo xtask images)");
        }
        Some(engine)
    } else {
        None
    };
    let panics_before = PANICS.load(Ordering::Relaxed);
    let before_tier = resources(server, docker);
    let (runner, kinds) = match tier {
        "process" => {
            let p = stockade_process::probe();
            (Runner::Process(ProcessTier::new(Helper::current_exe()?.prefer_fork())), process_kinds(p.cgroups.is_ok()))
        }
        "process-pool" => {
            let p = stockade_process::probe();
            let tier = ProcessTier::new(Helper::current_exe()?.prefer_fork()).pool(4);
            (Runner::Process(tier), process_kinds(p.cgroups.is_ok()))
        }
        "process-session" => {
            let p = stockade_process::probe();
            let mut kinds = process_kinds(p.cgroups.is_ok());
            kinds.push(Kind {
                name: SESSION_KIND,
                weight: 0,
                job: Box::new(|_, _| bail!("not an exec")),
                expect: Box::new(|_, _, _| true),
                expected: "made, used for ten execs, killed",
            });
            (Runner::Process(ProcessTier::new(Helper::current_exe()?.prefer_fork())), kinds)
        }
        "wasm" => (Runner::Wasm(WasmTier::new()?), wasm_kinds(scratch)?),
        "docker" => (Runner::Docker(engine.context("connected above")?), docker_kinds(true)),
        "docker-session" => {
            let mut kinds = docker_kinds(false);
            kinds.push(Kind {
                name: SESSION_KIND,
                weight: 0,
                job: Box::new(|_, _| bail!("not an exec")),
                expect: Box::new(|_, _, _| true),
                expected: "made, used for ten execs, killed; the workspace's last write copied back",
            });
            (Runner::Docker(engine.context("connected above")?), kinds)
        }
        "docker-pool" => {
            let engine = engine.context("connected above")?;
            let mut config = PoolConfig::new(4, DOCKER_IMAGE).with_workspace(Access::ReadWrite);
            config.limits = docker_limits(Limits::new())?;
            config.workspace_bytes = 4 << 20;
            (Runner::DockerPool(DockerPool::new(engine, config).await?), docker_kinds(false))
        }
        other => {
            bail!(
                "tier {other:?} is not soaked by this program (process, process-pool, process-session, wasm, docker, docker-pool or docker-session)"
            )
        }
    };
    let kinds = Arc::new(kinds);
    let total: u64 = kinds.iter().map(|k| k.weight).sum();
    let pick = |n: u64| {
        let mut r = mix(args.seed, n) % total;
        kinds
            .iter()
            .position(|k| {
                if r < k.weight {
                    return true;
                }
                r -= k.weight;
                false
            })
            .unwrap_or(0)
    };
    // Warm-up (a cached module, the first cgroup), then the resources before.
    for n in 0..kinds.len() as u64 {
        let k = &kinds[n as usize];
        // A docker session warms up by its own sessions, below.
        if k.weight == 0 || tier == "docker-session" {
            continue;
        }
        let ws = scratch.join(format!("{tier}-warm-{n}"));
        std::fs::create_dir_all(&ws)?;
        let _ = runner.run(&(k.job)(n, &ws)?).await;
    }
    let sessions = tier.ends_with("-session");
    // Sessions warm up as they are used: `concurrency` sessions of ten execs each, side by
    // side, before the resources and the RSS are first counted.
    if sessions {
        let warm = Shared::new(kinds.clone(), (0..EXECS_PER_SESSION * args.concurrency as u64).map(pick).collect());
        let mut dirs = Vec::new();
        for w in 0..args.concurrency {
            let (ws, homes) =
                (scratch.join(format!("{tier}-warm-ws-{w}")), scratch.join(format!("{tier}-warm-homes-{w}")));
            std::fs::create_dir_all(&ws)?;
            dirs.push((ws, homes));
        }
        let workers = dirs.iter().map(|(ws, homes)| session_worker(&runner, &warm, ws, homes));
        for r in futures_util::future::join_all(workers).await {
            r?;
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let pooled = tier == "process-pool" || tier == "docker-pool";
    let before = if pooled { before_tier } else { resources(server, docker) };
    let runs = if docker { args.docker_runs.unwrap_or(args.runs) } else { args.runs };
    let rss_start = rss_kib();
    let shared = Arc::new(Shared::new(kinds.clone(), (0..runs).map(pick).collect()));
    let runner = Arc::new(runner);
    let start = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..args.concurrency {
        let (runner, shared) = (runner.clone(), shared.clone());
        let ws = scratch.join(format!("{tier}-worker-{w}"));
        std::fs::create_dir_all(&ws)?;
        let homes = scratch.join(format!("{tier}-homes-{w}"));
        workers.spawn(async move {
            if sessions {
                return session_worker(&runner, &shared, &ws, &homes).await;
            }
            while let Some(n) = shared.take(1) {
                let k = shared.kind(n);
                let job = (k.job)(n, &ws)?;
                let t = Instant::now();
                let report = runner.run(&job).await;
                let latency = t.elapsed();
                let (ok, status) = match &report {
                    Ok(r) => ((k.expect)(r, n, &ws), format!("{:?}", r.status)),
                    Err(e) => (false, format!("error: {e}")),
                };
                shared.record(k.name, ok, latency, status);
            }
            Ok::<(), anyhow::Error>(())
        });
    }
    while let Some(r) = workers.join_next().await {
        r??;
    }
    let elapsed = start.elapsed();
    // The workers are done, so this is the last owner: a pool kills its waiting sandboxes.
    // Other tiers live on to the end, as they did when the count before was taken (the
    // wasm tier holds its cache directory open).
    let runner = if pooled {
        if let Runner::DockerPool(pool) = &*runner {
            pool.shutdown().await;
        }
        drop(runner);
        None
    } else {
        Some(runner)
    };
    // Let the kernel finish tearing down the last runs' namespaces and cgroups (and the
    // engine its last containers, whose removal the pool runs in the background).
    let mut after = resources(server, docker);
    for _ in 0..if docker { 300 } else { 50 } {
        if after == before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        after = resources(server, docker);
    }
    drop(runner);
    let records = std::mem::take(&mut *shared.records.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
    Ok(Outcome {
        tier: tier.to_owned(),
        runs,
        elapsed,
        records,
        before,
        after,
        rss: [rss_start, shared.rss_tenth.load(Ordering::Relaxed), rss_kib()],
        panics: PANICS.load(Ordering::Relaxed) - panics_before,
        kinds: kinds.iter().map(|k| (k.name, k.expected)).collect(),
    })
}

/// The `process-session` tier's kind for a session's own life (made, used, killed).
const SESSION_KIND: &str = "session";

/// Execs per session in the `process-session` tier.
const EXECS_PER_SESSION: u64 = 10;

/// What a tier's workers share: the mix, each run's kind, the next run to take, the
/// records, and the RSS sampled when the run a tenth of the way is taken.
struct Shared {
    kinds: Arc<Vec<Kind>>,
    picks: Vec<usize>,
    runs: u64,
    next: AtomicU64,
    records: Mutex<Vec<Record>>,
    rss_tenth: AtomicU64,
}

impl Shared {
    fn new(kinds: Arc<Vec<Kind>>, picks: Vec<usize>) -> Self {
        let runs = picks.len() as u64;
        let records = Mutex::new(Vec::with_capacity(picks.len()));
        Self { kinds, picks, runs, next: AtomicU64::new(0), records, rss_tenth: AtomicU64::new(0) }
    }

    /// The first of the next `count` runs, or `None` once every run is taken.
    fn take(&self, count: u64) -> Option<u64> {
        let first = self.next.fetch_add(count, Ordering::Relaxed);
        if first >= self.runs {
            return None;
        }
        if (first..first + count).contains(&(self.runs / 10)) {
            self.rss_tenth.store(rss_kib(), Ordering::Relaxed);
        }
        Some(first)
    }

    /// Run `n`'s kind.
    fn kind(&self, n: u64) -> &Kind {
        &self.kinds[self.picks[usize::try_from(n).unwrap_or(0)]]
    }

    fn record(&self, kind: &'static str, ok: bool, latency: Duration, status: String) {
        self.records.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(Record {
            kind,
            ok,
            latency,
            status,
        });
    }
}

/// One worker of a session tier (`process-session`, `docker-session`), by its runner.
async fn session_worker(runner: &Runner, shared: &Shared, ws: &Path, homes: &Path) -> Result<()> {
    match runner {
        Runner::Process(tier) => process_session_worker(tier, shared, ws, homes).await,
        Runner::Docker(engine) => docker_session_worker(engine, shared, ws).await,
        _ => bail!("not a session tier"),
    }
}

/// One worker of the `process-session` tier: sessions, each used for [`EXECS_PER_SESSION`]
/// execs (runs `n` to `n + 9` of the mix; a fork bomb only as the last) and killed; a
/// record per exec and one per session.
async fn process_session_worker(tier: &ProcessTier, shared: &Shared, ws: &Path, homes: &Path) -> Result<()> {
    let record = |kind, ok, latency, status| shared.record(kind, ok, latency, status);
    let workspace = stockade_protocol::Workspace::new(ws, Access::ReadWrite, stockade_protocol::Busy::Wait)?;
    while let Some(first) = shared.take(EXECS_PER_SESSION) {
        let home = homes.join(first.to_string());
        std::fs::create_dir_all(&home)?;
        let t = Instant::now();
        let config = stockade_process::SessionConfig {
            limits: Limits::new(),
            workspace: Some(workspace.clone()),
            home: Some(home.clone()),
            ..stockade_process::SessionConfig::default()
        };
        let session = match tier.session(config).await {
            Ok(s) => s,
            Err(e) => {
                record(SESSION_KIND, false, t.elapsed(), format!("error: {e}"));
                let _ = std::fs::remove_dir_all(&home);
                continue;
            }
        };
        let last = (first + EXECS_PER_SESSION).min(shared.runs);
        // A fork bomb drawn for this session runs as its last exec (what it forks lives on in
        // the session until the kill), and a trivial exec takes its place.
        let drawn: Vec<&Kind> = (first..last).map(|n| shared.kind(n)).collect();
        let bomb = drawn.iter().any(|k| k.name == "fork_bomb");
        for (i, n) in (first..last).enumerate() {
            let mut k = if drawn[i].name == "fork_bomb" { &shared.kinds[0] } else { drawn[i] };
            if bomb && n + 1 == last {
                k = drawn.iter().find(|k| k.name == "fork_bomb").copied().unwrap_or(k);
            }
            let job = (k.job)(n, ws)?;
            let started = Instant::now();
            let report = session.exec(&job, None, stockade_protocol::LiveIo::default()).await;
            let (ok, status) = match &report {
                Ok(r) => ((k.expect)(r, n, ws), format!("{:?}", r.status)),
                Err(e) => (false, format!("error: {e}")),
            };
            record(k.name, ok, started.elapsed(), status);
        }
        let swept = session.kill().await;
        let _ = std::fs::remove_dir_all(&home);
        let ok = swept.errors.is_empty();
        record(
            SESSION_KIND,
            ok,
            t.elapsed(),
            if ok { "killed".into() } else { format!("sweep errors: {:?}", swept.errors) },
        );
    }
    Ok(())
}

/// One worker of the `docker-session` tier: docker sessions (one container each, the
/// worker's directory staged read-write as its workspace), each used for
/// [`EXECS_PER_SESSION`] execs of the docker mix and killed. A workspace exec runs in
/// `/workspace`, and the host reads what the session's last one wrote once the session has
/// ended and copied it back (not before: no host path is mounted).
async fn docker_session_worker(engine: &DockerTier, shared: &Shared, ws: &Path) -> Result<()> {
    use stockade_docker::session::DockerSessionConfig;
    let record = |kind, ok, latency, status| shared.record(kind, ok, latency, status);
    let workspace = stockade_protocol::Workspace::new(ws, Access::ReadWrite, stockade_protocol::Busy::Wait)?;
    while let Some(first) = shared.take(EXECS_PER_SESSION) {
        let _ = std::fs::remove_file(ws.join("out"));
        let t = Instant::now();
        let config = DockerSessionConfig {
            limits: docker_limits(Limits::new())?,
            workspace: Some(workspace.clone()),
            workspace_bytes: 4 << 20,
            ..DockerSessionConfig::new(DOCKER_IMAGE)
        };
        let session = match engine.session(config).await {
            Ok(s) => s,
            Err(e) => {
                record(SESSION_KIND, false, t.elapsed(), format!("error: {e}"));
                continue;
            }
        };
        let mut last_write = None;
        for n in first..(first + EXECS_PER_SESSION).min(shared.runs) {
            let k = shared.kind(n);
            let image_job = (k.job)(n, ws)?;
            let JobKind::Image { command, .. } = image_job.kind() else { bail!("the docker mix has image jobs") };
            let (program, args) = command.split_first().context("an empty command")?;
            let job = Job::command(program.clone(), args.iter().cloned())?
                .with_env("PATH", "/bin:/usr/bin")?
                .with_limits(*image_job.limits());
            let cwd = image_job.workspace().map(|_| "/workspace");
            let started = Instant::now();
            let report = session.exec(&job, cwd, stockade_protocol::LiveIo::default()).await;
            let (ok, status) = match &report {
                // The host sees a workspace exec's file only at the session's end.
                Ok(r) if cwd.is_some() => {
                    last_write = Some(n);
                    (exited0(r) && out(r) == format!("{n}\n").as_bytes(), format!("{:?}", r.status))
                }
                Ok(r) => ((k.expect)(r, n, ws), format!("{:?}", r.status)),
                Err(e) => (false, format!("error: {e}")),
            };
            record(k.name, ok, started.elapsed(), status);
        }
        let applied = session.kill().await;
        let copied = last_write.is_none_or(|n| host_has(ws, n));
        let ok = copied && !matches!(applied, Some(Err(_)));
        record(
            SESSION_KIND,
            ok,
            t.elapsed(),
            match (&applied, copied) {
                (Some(Err(e)), _) => format!("copy back: {e}"),
                (_, false) => "the workspace's last write was not copied back".into(),
                _ => "killed".into(),
            },
        );
    }
    Ok(())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The report's table and whether the tier passed.
fn judge(o: &Outcome) -> (String, bool) {
    let mut s = String::new();
    let unexpected = o.records.iter().filter(|r| !r.ok).count();
    let _ = writeln!(
        s,
        "**{}**: {} runs in {:.1} s, {:.0} runs/s; {} unexpected outcomes.\n",
        o.tier,
        o.runs,
        o.elapsed.as_secs_f64(),
        o.runs as f64 / o.elapsed.as_secs_f64(),
        unexpected
    );
    let _ = writeln!(s, "| kind | expected | runs | as expected | p50 | p99 |\n|---|---|---|---|---|---|");
    let mut by: BTreeMap<&str, Vec<&Record>> = BTreeMap::new();
    for r in &o.records {
        by.entry(r.kind).or_default().push(r);
    }
    for (name, expected) in &o.kinds {
        let rs = by.remove(name).unwrap_or_default();
        let mut lat: Vec<Duration> = rs.iter().map(|r| r.latency).collect();
        lat.sort();
        let ok = rs.iter().filter(|r| r.ok).count();
        let _ = writeln!(
            s,
            "| {name} | {expected} | {} | {ok} | {:.1} ms | {:.1} ms |",
            rs.len(),
            percentile(&lat, 0.5).as_secs_f64() * 1e3,
            percentile(&lat, 0.99).as_secs_f64() * 1e3
        );
    }
    for r in o.records.iter().filter(|r| !r.ok).take(5) {
        let _ = writeln!(s, "\nunexpected: {} ended {}", r.kind, r.status);
    }
    let (b, a) = (&o.before, &o.after);
    let _ = writeln!(
        s,
        "\n| resource (host view) | before | after |\n|---|---|---|\n| descriptors | {} | {} |\n| processes (descendants, fork server aside) | {} | {} |\n| per-run cgroups | {} | {} |\n| mounts | {} | {} |\n| stockade temp entries | {} | {} |",
        b.fds,
        a.fds,
        b.processes,
        a.processes,
        b.cgroups,
        a.cgroups,
        b.mounts,
        a.mounts,
        b.temp_entries,
        a.temp_entries
    );
    if let (Some((bc, bv, bi)), Some((ac, av, ai))) = (b.docker, a.docker) {
        let _ = writeln!(
            s,
            "| stockade containers (docker CLI) | {bc} | {ac} |\n| stockade volumes | {bv} | {av} |\n| images | {bi} | {ai} |"
        );
    }
    let [rss0, rss10, rss_end] = o.rss;
    // The start is after the warm-up (every kind ran once); the 10% sample is shown, but it
    // may fall while memory bombs are in flight.
    let flat = rss_end <= rss0 + (rss0 / 10).max(4096);
    let _ = writeln!(
        s,
        "\nSupervisor RSS: {:.1} MiB at the start, {:.1} MiB at 10%, {:.1} MiB at the end ({}).",
        rss0 as f64 / 1024.0,
        rss10 as f64 / 1024.0,
        rss_end as f64 / 1024.0,
        if flat {
            "within 10% or 4 MiB of the start, after warm-up"
        } else {
            "GREW by more than 10% and 4 MiB after warm-up"
        }
    );
    if o.panics > 0 {
        let _ = writeln!(s, "\nPANICKED: {} panics on this process's threads (see stderr).", o.panics);
    }
    (s, unexpected == 0 && a == b && flat && o.panics == 0)
}

async fn soak(args: Args, server: Option<u32>) -> Result<bool> {
    let scratch = std::env::temp_dir().join(format!("soak-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let mut doc = String::new();
    let mut ok = true;
    for tier in &args.tiers {
        if tier.starts_with("docker")
            && args.defaulted
            && std::env::var_os("STOCKADE_REQUIRE_ALL").is_none()
            && let Err(e) = DockerTier::connect().await
        {
            println!("**{tier}**: SKIPPED: no docker engine answers ({e}); `--tier {tier}` requires it.\n");
            continue;
        }
        if tier == "serve" {
            let bin = args.stockade.clone().context("--tier serve needs --stockade PATH (the stockade binary)")?;
            // Half the runs, as sandbox cycles: each is a create, an exec, a transfer each
            // way and a kill.
            let (runs, concurrency) = ((args.runs / 2).max(20), args.concurrency.min(4));
            let (table, passed) = tokio::task::spawn_blocking(move || serve::soak(&bin, runs, concurrency)).await??;
            println!("{table}");
            ok &= passed;
            doc.push_str(&table);
            doc.push('\n');
            continue;
        }
        let outcome = soak_tier(tier, &args, server, &scratch).await;
        let outcome = match outcome {
            Ok(o) => o,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&scratch);
                return Err(e);
            }
        };
        let (table, passed) = judge(&outcome);
        println!("{table}");
        ok &= passed;
        doc.push_str(&table);
        doc.push('\n');
    }
    let _ = std::fs::remove_dir_all(&scratch);
    if let Some(path) = &args.markdown {
        let header = format!(
            "`stockade-soak --runs {}{} --concurrency {} --seed {}` ({}):\n\n",
            args.runs,
            args.docker_runs.map(|d| format!(" --docker-runs {d}")).unwrap_or_default(),
            args.concurrency,
            args.seed,
            if ok { "passed" } else { "FAILED" }
        );
        std::fs::write(path, format!("{header}{doc}"))?;
    }
    Ok(ok)
}

fn main() -> ExitCode {
    stockade_process::helper_main();
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICS.fetch_add(1, Ordering::Relaxed);
        report(info);
    }));
    // First, while single-threaded: every process-tier run's helper is cloned from it.
    let server = ForkServer::start().ok();
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("stockade-soak: {e:#}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("stockade-soak: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(soak(args, server)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("stockade-soak: FAILED (an unexpected outcome, a leaked resource or growing RSS; see above)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("stockade-soak: {e:#}");
            ExitCode::FAILURE
        }
    }
}
