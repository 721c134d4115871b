#![allow(missing_docs, reason = "criterion_group generates undocumented items")]
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a bench fails loudly")]
//! Sessions (`ProcessTier::session`), from a multi-threaded embedder that started the fork
//! server first thing in `main`, each beside its baseline measured in the same run:
//! - `session_create`: make a session (and kill it, untimed) against `docker run -d` of the
//!   busybox image `cargo xtask images` builds (skipped, and said so, without an engine or
//!   the image), and a bare spawn of `/bin/true` for scale;
//! - `session_exec_true`: `/bin/true` as one exec of a live session, against a bare spawn of
//!   `/bin/true` from this program (`tokio::process`) and `docker exec` of `true` in a running
//!   container of that image;
//! - `session_files_1mib`: write then read 1 MiB through the files API (`files::Files`, as a
//!   session's owner serves it), against `cp` of the same file on the host.
//!
//! It also prints the p50 and p99 of execs in one session, quiet and beside a fork bomb in
//! another session (held at its pids limit), and the memory of 100 live idle sessions: this program's RSS before and after
//! making them, and the RSS of every process they add (helper, init), summed from the host's
//! `/proc`.

use std::time::{Duration, Instant};

mod common;

use common::spawn;
use criterion::Criterion;
use stockade_process::files::Files;
use stockade_process::{ForkServer, Helper, ProcessSession, ProcessTier, SessionConfig};
use stockade_protocol::{Job, Limits, LiveIo, Status};

const IMAGE: &str = "stockade-busybox:local";

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn home(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("stockade-bench-session-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn config(home: &std::path::Path) -> SessionConfig {
    SessionConfig { limits: Limits::default(), home: Some(home.to_path_buf()), ..SessionConfig::default() }
}

/// A running container of the busybox image, removed when dropped; `None` without an engine
/// or the image.
struct Container(String);

impl Container {
    fn start() -> Option<Self> {
        let out = std::process::Command::new("docker")
            .args(["run", "-d", "--rm", "--network", "none", IMAGE, "sleep", "3600"])
            .output()
            .ok()?;
        out.status.success().then(|| Self(String::from_utf8_lossy(&out.stdout).trim().to_owned()))
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker").args(["rm", "-f", &self.0]).output();
    }
}

fn tier() -> ProcessTier {
    ProcessTier::new(Helper::fork())
}

fn create(c: &mut Criterion, rt: &tokio::runtime::Runtime) {
    let mut g = c.benchmark_group("session_create");
    g.sample_size(50).measurement_time(Duration::from_secs(10));
    let tier = tier();
    let dir = home("create");
    g.bench_function("baseline_bare_spawn", |b| b.iter(|| rt.block_on(spawn("/bin/true", &[]))));
    g.bench_function("stockade_session", |b| {
        b.iter_custom(|n| {
            rt.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..n {
                    let start = Instant::now();
                    let s = tier.session(config(&dir)).await.unwrap();
                    total += start.elapsed();
                    let _ = s.kill().await;
                }
                total
            })
        });
    });
    if Container::start().is_some() {
        g.bench_function("docker_run_d", |b| {
            b.iter_custom(|n| {
                let mut total = Duration::ZERO;
                for _ in 0..n {
                    let start = Instant::now();
                    let c = Container::start().unwrap();
                    total += start.elapsed();
                    drop(c);
                }
                total
            });
        });
    } else {
        eprintln!("session_create: docker_run_d skipped: no engine or no {IMAGE} (cargo xtask images)");
    }
    g.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

fn exec(c: &mut Criterion, rt: &tokio::runtime::Runtime) {
    let mut g = c.benchmark_group("session_exec_true");
    g.sample_size(100).measurement_time(Duration::from_secs(10));
    let dir = home("exec");
    let session: ProcessSession = rt.block_on(tier().session(config(&dir))).unwrap();
    let job = Job::command("/bin/true", Vec::<String>::new()).unwrap();
    g.bench_function("baseline_bare_spawn", |b| b.iter(|| rt.block_on(spawn("/bin/true", &[]))));
    g.bench_function("stockade_session_exec", |b| {
        b.iter(|| {
            let r = rt.block_on(session.exec(&job, None, LiveIo::default())).unwrap();
            assert_eq!(r.status, Status::Exited { code: 0 });
        });
    });
    match Container::start() {
        Some(c) => {
            let id = c.0.clone();
            g.bench_function("docker_exec", |b| b.iter(|| rt.block_on(spawn("docker", &["exec", &id, "true"]))));
        }
        None => eprintln!("session_exec_true: docker_exec skipped: no engine or no {IMAGE} (cargo xtask images)"),
    }
    g.finish();
    let _ = rt.block_on(session.kill());
    let _ = std::fs::remove_dir_all(&dir);
}

fn files(c: &mut Criterion) {
    let mut g = c.benchmark_group("session_files_1mib");
    g.sample_size(100).measurement_time(Duration::from_secs(5));
    let dir = home("files");
    let data = vec![7u8; 1 << 20];
    std::fs::write(dir.join("src.bin"), &data).unwrap();
    let files = Files::default().serve("/home/user", &dir, true, false).unwrap();
    g.bench_function("baseline_host_cp", |b| {
        b.iter(|| {
            let ok = std::process::Command::new("cp")
                .arg(dir.join("src.bin"))
                .arg(dir.join("copy.bin"))
                .status()
                .unwrap()
                .success();
            assert!(ok);
        });
    });
    g.bench_function("stockade_files_write_read", |b| {
        b.iter(|| {
            files.write("/home/user/f.bin", &mut data.as_slice(), 2 << 20).unwrap();
            assert_eq!(files.read("/home/user/f.bin", 2 << 20).unwrap().len(), 1 << 20);
        });
    });
    g.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

/// RSS in KiB of `pid`, from the host's `/proc`.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or(0)
}

fn memory(rt: &tokio::runtime::Runtime, noisy: &str) {
    let me = std::process::id();
    let before = rss_kib(me);
    let dir = home("memory");
    let sessions: Vec<ProcessSession> = rt.block_on(async {
        let tier = tier();
        let mut v = Vec::new();
        for i in 0..100 {
            let h = dir.join(i.to_string());
            std::fs::create_dir_all(&h).unwrap();
            v.push(tier.session(config(&h)).await.unwrap());
        }
        v
    });
    std::thread::sleep(Duration::from_millis(200));
    let after = rss_kib(me);
    let server = stockade_process::ForkServer::pid();
    let added: Vec<u32> = stockade_test_support::descendants(me).into_iter().filter(|p| Some(*p) != server).collect();
    let sum: u64 = added.iter().map(|p| rss_kib(*p)).sum();
    let per_owner = after.saturating_sub(before) as f64 / 100.0;
    let per_session = sum as f64 / 100.0;
    println!(
        "session_memory_100_idle: supervisor RSS {before} KiB before, {after} KiB with 100 live sessions ({per_owner:.1} KiB each); the sessions' {} processes hold {sum} KiB RSS ({per_session:.1} KiB per session, shared pages counted in each)",
        added.len(),
    );
    // Rows for the bench table (`cargo xtask bench session`).
    if let Some(out) = std::env::var_os("STOCKADE_BENCH_MEMORY_OUT") {
        let rows = noisy.to_owned()
            + &format!(
                "| session_memory_100_idle | supervisor RSS growth per live session | {per_owner:.1} KiB | | {before} KiB before, {after} KiB with 100 |\n| session_memory_100_idle | RSS of each session's processes (helper, init) | {per_session:.1} KiB | | {} processes, shared pages counted in each |\n",
                added.len()
            );
        std::fs::write(out, rows).unwrap();
    }
    rt.block_on(async {
        for s in sessions {
            let _ = s.kill().await;
        }
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// p50 and p99 of `n` execs of `/bin/true` in `session`.
async fn exec_percentiles(session: &ProcessSession, n: usize) -> (Duration, Duration) {
    let job = Job::command("/bin/true", Vec::<String>::new()).unwrap();
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let r = session.exec(&job, None, LiveIo::default()).await.unwrap();
        assert_eq!(r.status, Status::Exited { code: 0 });
        times.push(t.elapsed());
    }
    times.sort();
    (times[n / 2], times[n * 99 / 100])
}

/// A fork bomb in one session beside execs in another: their p50 and p99, quiet and with the
/// bomb running (held at its session's pids limit), in the same run.
fn noisy_neighbour(rt: &tokio::runtime::Runtime) -> String {
    let dir = home("noisy");
    let (quiet, noisy) = rt.block_on(async {
        let tier = tier();
        let (ha, hb) = (dir.join("a"), dir.join("b"));
        std::fs::create_dir_all(&ha).unwrap();
        std::fs::create_dir_all(&hb).unwrap();
        let a = tier.session(config(&ha)).await.unwrap();
        let b = tier.session(config(&hb)).await.unwrap();
        let _ = exec_percentiles(&a, 20).await;
        let quiet = exec_percentiles(&a, 300).await;
        // The bomb forks until its session's pids limit holds it, and keeps trying.
        let bomb = Job::command("sh", ["-c", "b() { b | b & }; b; sleep 60"])
            .unwrap()
            .with_limits(Limits::default().with_wall(Duration::from_secs(120)).unwrap());
        let bombing = b.exec(&bomb, None, LiveIo::default());
        let measure = async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let noisy = exec_percentiles(&a, 300).await;
            b.terminate();
            noisy
        };
        let (_, noisy) = tokio::join!(bombing, measure);
        let _ = a.kill().await;
        let _ = b.kill().await;
        (quiet, noisy)
    });
    let _ = std::fs::remove_dir_all(&dir);
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "session_noisy_neighbour: exec of /bin/true in one session, quiet p50 {:.2} ms p99 {:.2} ms; beside a fork bomb in another session p50 {:.2} ms p99 {:.2} ms ({:.2}x the quiet p99)",
        ms(quiet.0),
        ms(quiet.1),
        ms(noisy.0),
        ms(noisy.1),
        ms(noisy.1) / ms(quiet.1)
    );
    format!(
        "| session_noisy_neighbour | exec of `/bin/true` p99 beside a fork bomb in another session | {:.2} ms | {:.2}x | quiet p99 {:.2} ms (same run); p50 {:.2} ms quiet, {:.2} ms beside it |\n",
        ms(noisy.1),
        ms(noisy.1) / ms(quiet.1),
        ms(quiet.1),
        ms(quiet.0),
        ms(noisy.0)
    )
}

fn main() {
    ForkServer::start().expect("the fork server starts first thing");
    let rt = rt();
    let mut c = Criterion::default().configure_from_args();
    create(&mut c, &rt);
    exec(&mut c, &rt);
    files(&mut c);
    let noisy = noisy_neighbour(&rt);
    memory(&rt, &noisy);
    c.final_summary();
}
