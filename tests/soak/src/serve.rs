//! `--tier serve`: the server soak. A real `stockade serve --listen` (the binary named by
//! `--stockade`), driven through E2B's API by `--runs` sandbox cycles (create, an exec whose
//! output is checked, an upload and its download compared, a kill), `--concurrency` at a
//! time, while hostile clients run beside them for the whole soak:
//! - a slow reader: a sandbox streaming `yes` to a client that reads 1 KiB and then nothing;
//! - an anonymous flood: 300 connections that send nothing, opened again as the server
//!   drops them;
//! - stalled headers: 20 connections that send half a request line and stop;
//! - a fifo: a sandbox's fifo downloaded again and again (each must be refused, 400);
//! - a create race at the start: 16 creates at once under a cap of 8 sandboxes.
//!
//! The owner is judged from the host before the hostile clients start (after a warm-up),
//! once it has warmed up beside them (200 cycles or a tenth of `--runs`, whichever is more,
//! and the flood cycled through the server once) and at the end of `--runs` more cycles
//! (its RSS must not grow between those two), and after
//! the hostile clients have gone and every sandbox was killed (everything back to where it
//! was before): its RSS, descriptors and threads
//! (`/proc/PID/status`, `/proc/PID/fd`), its mounts (`/proc/PID/mountinfo`: each home is a
//! tmpfs the owner mounts), its CPU while idle (`/proc/PID/stat`, over 2 s), the sessions'
//! directories and the bytes under its state directory, and `df` for that filesystem; then
//! SIGTERM must end it within 15 s.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

const KEY: &str = "soak-serve-api-key-0123456789";

/// The fewest cycles run beside the hostile clients before the owner's RSS is taken as
/// warmed up (a long run warms up over a tenth of its cycles).
const WARM_UP_CYCLES: u64 = 200;

/// The server's cap on live sandboxes, for the create race.
const MAX_SANDBOXES: usize = 8;

struct Server {
    child: Child,
    addr: String,
    state: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.state);
    }
}

fn start(bin: &Path) -> Result<Server> {
    let state = std::env::temp_dir().join(format!("soak-serve-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&state);
    std::fs::create_dir_all(&state)?;
    let config = state.join("serve.toml");
    std::fs::write(&config, format!("[limits]\nmax_sandboxes = {MAX_SANDBOXES}\n[template.base]\ndisk = \"64M\"\n"))?;
    let mut child = Command::new(bin)
        .args(["serve", "--socket"])
        .arg(state.join("run/serve.sock"))
        .args(["--listen", "127.0.0.1:0", "--api-key-env", "SOAK_E2B_KEY", "--config"])
        .arg(&config)
        .env("SOAK_E2B_KEY", KEY)
        .env("STOCKADE_STATE_DIR", &state)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let mut lines = BufReader::new(child.stderr.take().context("no stderr")?).lines();
    let addr = loop {
        let Some(line) = lines.next() else { bail!("stockade serve exited before it listened") };
        if let Some(a) = line?.strip_prefix("stockade serve: E2B API on http://") {
            break a.trim().to_owned();
        }
    };
    // Its log is read to the end, so that it never blocks on a full pipe (and is dropped).
    std::thread::spawn(move || lines.for_each(drop));
    Ok(Server { child, addr, state })
}

/// One request on a new connection; the status and the body (`Connection: close`).
fn request(addr: &str, head: &str, body: &[u8]) -> Result<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut req =
        format!("{head}Host: soak\r\nConnection: close\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes();
    req.extend_from_slice(body);
    s.write_all(&req)?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    let status = String::from_utf8_lossy(&out).split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = out.windows(4).position(|w| w == b"\r\n\r\n").map(|i| out[i + 4..].to_vec()).unwrap_or_default();
    Ok((status, body))
}

fn create(addr: &str) -> Result<Result<(String, String), u16>> {
    let head = format!("POST /v2/sandboxes HTTP/1.1\r\nX-API-Key: {KEY}\r\nContent-Type: application/json\r\n");
    let (status, body) = request(addr, &head, br#"{"templateID":"base","timeout":300}"#)?;
    if status != 201 {
        return Ok(Err(status));
    }
    let v: serde_json::Value = serde_json::from_slice(&body)?;
    let field = |k: &str| v[k].as_str().map(str::to_owned).context("a create's reply");
    Ok(Ok((field("sandboxID")?, field("envdAccessToken")?)))
}

fn kill(addr: &str, id: &str) -> Result<u16> {
    Ok(request(addr, &format!("DELETE /sandboxes/{id} HTTP/1.1\r\nX-API-Key: {KEY}\r\n"), b"")?.0)
}

fn envd(id: &str, token: &str) -> String {
    format!("E2b-Sandbox-Id: {id}\r\nX-Access-Token: {token}\r\n")
}

/// envd's Start of `sh -c script`: the stream's body (base64 output in JSON events).
fn sh(addr: &str, id: &str, token: &str, script: &str) -> Result<String> {
    let start = serde_json::json!({"process": {"cmd": "/bin/sh", "args": ["-c", script]}});
    let msg = start.to_string();
    let mut env = vec![0u8];
    env.extend_from_slice(&u32::try_from(msg.len())?.to_be_bytes());
    env.extend_from_slice(msg.as_bytes());
    let head = format!(
        "POST /process.Process/Start HTTP/1.1\r\n{}Content-Type: application/connect+json\r\n",
        envd(id, token)
    );
    let (status, body) = request(addr, &head, &env)?;
    if status != 200 {
        bail!("Start answered {status}");
    }
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// One sandbox's life: create, exec, upload, download, kill. `Err` names what went wrong.
fn cycle(addr: &str, n: u64) -> Result<(), String> {
    let (id, token) = loop {
        match create(addr).map_err(|e| format!("create: {e}"))? {
            Ok(pair) => break pair,
            // Over the cap (the hostile sandboxes hold two places): wait for a place.
            Err(429) => std::thread::sleep(Duration::from_millis(50)),
            Err(s) => return Err(format!("create answered {s}")),
        }
    };
    let result = (|| {
        let out = sh(addr, &id, &token, "echo $((6*7))").map_err(|e| format!("exec: {e}"))?;
        if !out.contains("NDIK") {
            return Err(format!("exec printed something else: {out:.200}"));
        }
        let data: Vec<u8> = (0..65_536u64).map(|i| (i.wrapping_mul(31).wrapping_add(n) % 251) as u8).collect();
        let path = format!("/files?path=/home/user/f{n}.bin");
        let head = format!("POST {path} HTTP/1.1\r\n{}Content-Type: application/octet-stream\r\n", envd(&id, &token));
        let (s, b) = request(addr, &head, &data).map_err(|e| format!("upload: {e}"))?;
        if s != 200 {
            return Err(format!("upload answered {s}: {}", String::from_utf8_lossy(&b)));
        }
        let (s, got) = request(addr, &format!("GET {path} HTTP/1.1\r\n{}", envd(&id, &token)), b"")
            .map_err(|e| format!("download: {e}"))?;
        if s != 200 || got != data {
            return Err(format!("download answered {s} with {} bytes", got.len()));
        }
        Ok(())
    })();
    let killed = kill(addr, &id).map_err(|e| format!("kill: {e}"))?;
    result?;
    if killed != 204 {
        return Err(format!("kill answered {killed}"));
    }
    Ok(())
}

/// The owner as the host sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    rss_kib: u64,
    fds: usize,
    threads: u64,
    mounts: usize,
    sessions: usize,
    state_bytes: u64,
    df_used_kib: u64,
}

fn status_field(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix(key))?.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest.split_whitespace().filter_map(|x| x.parse().ok()).collect();
    f.get(10).copied().unwrap_or(0) + f.get(11).copied().unwrap_or(0)
}

fn bytes_under(p: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![p.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => stack.push(e.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}

fn df_used_kib(p: &Path) -> u64 {
    Command::new("df")
        .args(["-k", "--output=used"])
        .arg(p)
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).lines().nth(1)?.trim().parse().ok())
        .unwrap_or(0)
}

fn seen(server: &Server) -> Seen {
    let pid = server.child.id();
    let sessions = std::fs::read_dir(server.state.join("sessions"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|owner| std::fs::read_dir(owner.path()).map(|d| d.count()).unwrap_or(0))
        .sum();
    Seen {
        rss_kib: status_field(pid, "VmRSS:"),
        fds: std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0),
        threads: status_field(pid, "Threads:"),
        mounts: std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).map(|m| m.lines().count()).unwrap_or(0),
        sessions,
        state_bytes: bytes_under(&server.state.join("sessions")),
        df_used_kib: df_used_kib(&server.state),
    }
}

/// The hostile clients, each on a thread of its own until `stop`; what they saw.
#[derive(Default)]
struct Hostile {
    fifo_refused: AtomicU64,
    fifo_other: AtomicU64,
    flood_opened: AtomicU64,
    slow_read: AtomicU64,
}

fn hostile(
    addr: &str,
    stop: &Arc<AtomicBool>,
    seen: &Arc<Hostile>,
) -> Result<(Vec<std::thread::JoinHandle<()>>, Vec<String>)> {
    let mut threads = Vec::new();
    let mut ids = Vec::new();
    // The slow reader.
    let (slow, slow_token) = create(addr)?.map_err(|s| anyhow::anyhow!("the slow reader's create answered {s}"))?;
    ids.push(slow.clone());
    {
        let (addr, stop, seen) = (addr.to_owned(), Arc::clone(stop), Arc::clone(seen));
        threads.push(std::thread::spawn(move || {
            let start = serde_json::json!({"process": {"cmd": "/bin/sh", "args": ["-c", "yes"]}}).to_string();
            let mut body = vec![0u8];
            body.extend_from_slice(&(start.len() as u32).to_be_bytes());
            body.extend_from_slice(start.as_bytes());
            let Ok(mut s) = TcpStream::connect(&addr) else { return };
            let head = format!(
                "POST /process.Process/Start HTTP/1.1\r\nHost: soak\r\n{}Content-Type: application/connect+json\r\nContent-Length: {}\r\n\r\n",
                envd(&slow, &slow_token),
                body.len()
            );
            let _ = s.write_all(head.as_bytes()).and_then(|()| s.write_all(&body));
            let mut buf = [0u8; 1024];
            if let Ok(n) = s.read(&mut buf) {
                seen.slow_read.fetch_add(n as u64, Ordering::Relaxed);
            }
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(100));
            }
        }));
    }
    // The fifo.
    let (fifo, fifo_token) = create(addr)?.map_err(|s| anyhow::anyhow!("the fifo's create answered {s}"))?;
    ids.push(fifo.clone());
    sh(addr, &fifo, &fifo_token, "mkfifo /home/user/pipe")?;
    {
        let (addr, stop, seen) = (addr.to_owned(), Arc::clone(stop), Arc::clone(seen));
        threads.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let head = format!("GET /files?path=/home/user/pipe HTTP/1.1\r\n{}", envd(&fifo, &fifo_token));
                match request(&addr, &head, b"") {
                    Ok((400, _)) => seen.fifo_refused.fetch_add(1, Ordering::Relaxed),
                    _ => seen.fifo_other.fetch_add(1, Ordering::Relaxed),
                };
                std::thread::sleep(Duration::from_millis(20));
            }
        }));
    }
    // The anonymous flood, and the stalled headers.
    {
        let (addr, stop, seen) = (addr.to_owned(), Arc::clone(stop), Arc::clone(seen));
        threads.push(std::thread::spawn(move || {
            let mut held: Vec<TcpStream> = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                held.retain(|s| {
                    let mut b = [0u8; 1];
                    let _ = s.set_nonblocking(true);
                    !matches!((&*s).read(&mut b), Ok(0))
                });
                while held.len() < 300 {
                    let Ok(mut s) = TcpStream::connect(&addr) else { break };
                    if held.len() < 20 {
                        let _ = s.write_all(b"GET /health HT");
                    }
                    seen.flood_opened.fetch_add(1, Ordering::Relaxed);
                    held.push(s);
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }));
    }
    Ok((threads, ids))
}

/// 16 creates at once: how many were made (each killed at once).
fn create_race(addr: &str) -> Result<usize> {
    let made: Vec<Result<Result<(String, String), u16>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..16).map(|_| scope.spawn(|| create(addr))).collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Ok(Err(0)))).collect()
    });
    let mut n = 0;
    for m in made {
        if let Ok((id, _)) = m? {
            n += 1;
            kill(addr, &id)?;
        }
    }
    Ok(n)
}

/// Sandbox cycles numbered `first..first + count`, `concurrency` at a time: each failure's
/// text, and each cycle's time.
fn cycles(
    addr: &str,
    first: u64,
    count: u64,
    concurrency: usize,
    failures: &Mutex<Vec<String>>,
    latencies: &mut Vec<Duration>,
) {
    let next = AtomicU64::new(first);
    let times = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..concurrency {
            let (next, times) = (&next, &times);
            scope.spawn(move || {
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= first + count {
                        break;
                    }
                    let c0 = Instant::now();
                    let r = cycle(addr, n);
                    times.lock().map(|mut l| l.push(c0.elapsed())).ok();
                    if let Err(e) = r {
                        failures.lock().map(|mut f| f.push(e)).ok();
                    }
                }
            });
        }
    });
    latencies.extend(times.into_inner().unwrap_or_else(|e| e.into_inner()));
}

/// Waits (bounded only as the failure's, 60 s) until no session directory is left.
fn settled(server: &Server) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(60) {
        if seen(server).sessions == 0 {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// The serve soak: its report and whether it passed.
pub(crate) fn soak(bin: &Path, runs: u64, concurrency: usize) -> Result<(String, bool)> {
    let server = start(bin)?;
    let addr = server.addr.clone();
    for n in 0..4 {
        cycle(&addr, n).map_err(|e| anyhow::anyhow!("warm-up: {e}"))?;
    }
    settled(&server);
    let race = create_race(&addr)?;
    settled(&server);
    let before = seen(&server);
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(Hostile::default());
    let (threads, hostile_ids) = hostile(&addr, &stop, &counts)?;
    let failures = Mutex::new(Vec::<String>::new());
    let mut lat = Vec::<Duration>::new();
    // The warm-up, beside the hostile clients: the RSS the owner settles at under this
    // traffic (its allocator's arenas, hyper's buffers, the flood's connections) is reached
    // within the first couple of hundred cycles, so the measured cycles start after that
    // many, and after the flood has been cycled through the server's anonymous share once.
    let warm_up = (runs / 10).max(WARM_UP_CYCLES);
    cycles(&addr, 100, warm_up, concurrency, &failures, &mut Vec::new());
    let t_warm = Instant::now();
    while !(counts.flood_opened.load(Ordering::Relaxed) >= 600 && counts.fifo_refused.load(Ordering::Relaxed) > 0)
        && t_warm.elapsed() < Duration::from_secs(60)
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    let warm = seen(&server);
    let t0 = Instant::now();
    cycles(&addr, 100 + warm_up, runs, concurrency, &failures, &mut lat);
    let during = seen(&server);
    let elapsed = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    for id in &hostile_ids {
        let _ = kill(&addr, id);
    }
    let clean = settled(&server);
    // The runtime's blocking threads (files calls, samples, a session's end) outlive their
    // work by tokio's keep-alive (10 s): the count comes back once they have gone, so it is
    // waited for, bounded as the failure's.
    let t1 = Instant::now();
    let mut after = seen(&server);
    while after.threads > before.threads + 2 && t1.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(200));
        after = seen(&server);
    }
    let pid = server.child.id();
    let c0 = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(2));
    let idle_ticks = cpu_ticks(pid).saturating_sub(c0);
    let term0 = Instant::now();
    let _ = Command::new("kill").args(["-TERM", &pid.to_string()]).status();
    let mut server = server;
    let mut ended = None;
    while term0.elapsed() < Duration::from_secs(15) {
        if let Ok(Some(s)) = server.child.try_wait() {
            ended = Some((s, term0.elapsed()));
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let failures = failures.into_inner().unwrap_or_else(|e| e.into_inner());
    lat.sort();
    let p = |q: f64| crate::percentile(&lat, q).as_secs_f64() * 1e3;
    let rss_flat = during.rss_kib <= warm.rss_kib + (warm.rss_kib / 10).max(8192);
    let checks = [
        ("every cycle as expected", failures.is_empty()),
        ("the create race made at most the cap", race <= MAX_SANDBOXES),
        (
            "every fifo download refused",
            counts.fifo_other.load(Ordering::Relaxed) == 0 && counts.fifo_refused.load(Ordering::Relaxed) > 0,
        ),
        ("no session left", clean && after.sessions == 0 && after.state_bytes == before.state_bytes),
        ("RSS flat from the warm-up's end to the end (within 10% or 8 MiB)", rss_flat),
        ("descriptors back", after.fds <= before.fds + 2),
        ("threads back", after.threads <= before.threads + 2),
        ("mounts back", after.mounts == before.mounts),
        ("idle CPU under 5 ticks in 2 s", idle_ticks < 5),
        ("SIGTERM ends it within 15 s", ended.is_some_and(|(_, d)| d < Duration::from_secs(15))),
    ];
    let passed = checks.iter().all(|(_, ok)| *ok);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "**serve**: {runs} sandbox cycles (create, exec, 64 KiB up and down, kill) through E2B's API in {:.1} s, {:.1} cycles/s, {concurrency} at a time, p50 {:.0} ms, p99 {:.0} ms; {} unexpected. Beside them: a slow reader ({} bytes read, then none), an anonymous flood ({} connections opened), 20 stalled headers, {} fifo downloads (all refused), and a race of 16 creates under a cap of {MAX_SANDBOXES} ({race} made).\n",
        elapsed.as_secs_f64(),
        runs as f64 / elapsed.as_secs_f64(),
        p(0.5),
        p(0.99),
        failures.len(),
        counts.slow_read.load(Ordering::Relaxed),
        counts.flood_opened.load(Ordering::Relaxed),
        counts.fifo_refused.load(Ordering::Relaxed),
    );
    let _ = writeln!(s, "| the owner (host view) | before | warmed up | at the end | after |\n|---|---|---|---|---|");
    let row = |s: &mut String, name: &str, f: &dyn Fn(&Seen) -> String| {
        let _ = writeln!(s, "| {name} | {} | {} | {} | {} |", f(&before), f(&warm), f(&during), f(&after));
    };
    row(&mut s, "RSS", &|x| format!("{:.1} MiB", x.rss_kib as f64 / 1024.0));
    row(&mut s, "descriptors", &|x| x.fds.to_string());
    row(&mut s, "threads", &|x| x.threads.to_string());
    row(&mut s, "mounts it sees", &|x| x.mounts.to_string());
    row(&mut s, "session directories", &|x| x.sessions.to_string());
    row(&mut s, "bytes under its sessions", &|x| x.state_bytes.to_string());
    row(&mut s, "`df` used on its filesystem", &|x| format!("{:.1} MiB", x.df_used_kib as f64 / 1024.0));
    let _ = writeln!(
        s,
        "\nIdle CPU after: {idle_ticks} ticks in 2 s. SIGTERM: {}.\n",
        ended.map_or("did not end within 15 s".to_owned(), |(st, d)| format!("ended in {} ms ({st})", d.as_millis()))
    );
    for (name, ok) in checks {
        let _ = writeln!(s, "- {}: {name}", if ok { "ok" } else { "FAILED" });
    }
    for f in failures.iter().take(5) {
        let _ = writeln!(s, "\nunexpected: {f}");
    }
    Ok((s, passed))
}
