#![allow(missing_docs, reason = "criterion_main generates an undocumented main")]
#![allow(clippy::unwrap_used, reason = "a bench fails loudly")]
//! A granted call's round trip, each next to a baseline measured in the same run:
//! - `grants_socket_round_trip`: a client on the run's real broker socket (the path a
//!   process- or docker-tier guest uses) calling `add` (parse, authorise, run, reply), next
//!   to the same client against a bare frame echo server on a unix socket;
//! - `grants_in_process`: `Broker::call` (the wasm tier's `host.call` path), next to parsing
//!   the call frame and serialising a reply;
//! - `grants_wasm_js` (with `--features wasm` and the JavaScript guest): one run of 1000
//!   `add(1, 2)` calls in JavaScript, next to one run of 1000 calls of a local function;
//! - `grants_mcp`: `McpServer::call` of a host MCP server's tool (the raw stdio server of the
//!   runtime's tests, in python3), next to a bare client writing the same `tools/call` line
//!   to that server's stdin and reading its answer line.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::json;
use stockade_policy::allow::{Permit, Policy};
use stockade_protocol::broker::{BrokerFrame, ReplyBody};
use stockade_protocol::{FrameCodec, Job, Report, Status};
use stockade_runtime::{Broker, FunctionGrant, GrantLimits, Grants, RunError, RunRequest, Sandbox, Tier};

const POLICY: &str = "version = 1\ndefault = \"deny\"\n[[rule]]\nid = \"adders\"\ntool = \"add\"\neffect = \"allow\"\nargs.a = { maximum = 1000000 }\n";

fn grants() -> Arc<Grants> {
    let schema = json!({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"required":["a","b"],"additionalProperties":false});
    let add = FunctionGrant::new("add", schema, |p: Permit| async move {
        let a = p.call().args_json();
        Ok(json!(a["a"].as_i64().unwrap_or(0) + a["b"].as_i64().unwrap_or(0)))
    })
    .unwrap();
    let g = Grants::new().function(add).unwrap();
    let policy = Policy::from_toml(POLICY, &g.registry()).unwrap();
    Arc::new(g.policy(policy).limits(GrantLimits::default().max_calls(u32::MAX)))
}

fn frame() -> Vec<u8> {
    serde_json::to_vec(&json!({"type":"call","id":1,"grant":"add","args":{"a":1,"b":2}})).unwrap()
}

/// `iters` calls on `socket`, timed by the client.
fn client_loop(socket: &std::path::Path, iters: u64) -> Duration {
    let mut s = UnixStream::connect(socket).unwrap();
    let body = frame();
    let mut msg = (body.len() as u32).to_be_bytes().to_vec();
    msg.extend_from_slice(&body);
    let mut buf = vec![0u8; 4096];
    let start = Instant::now();
    for _ in 0..iters {
        s.write_all(&msg).unwrap();
        let mut len = [0u8; 4];
        s.read_exact(&mut len).unwrap();
        let n = u32::from_be_bytes(len) as usize;
        s.read_exact(&mut buf[..n]).unwrap();
    }
    start.elapsed()
}

#[derive(Debug, Clone, Default)]
struct Timed {
    iters: Arc<Mutex<u64>>,
    elapsed: Arc<Mutex<Duration>>,
    in_process: bool,
}

#[async_trait]
impl Tier for Timed {
    fn name(&self) -> &'static str {
        "bench"
    }
    async fn run(&self, _job: &Job) -> Result<Report, RunError> {
        Ok(Report::new(Status::Exited { code: 0 }, Duration::ZERO))
    }
    async fn run_granted(&self, _job: &Job, broker: &Broker) -> Result<Report, RunError> {
        let iters = *self.iters.lock().unwrap();
        let elapsed = if self.in_process {
            let body = frame();
            let start = Instant::now();
            for _ in 0..iters {
                std::hint::black_box(broker.call(&body).await.unwrap());
            }
            start.elapsed()
        } else {
            let socket = broker.socket_dir()?.join("grants.sock");
            tokio::task::spawn_blocking(move || client_loop(&socket, iters)).await.unwrap()
        };
        *self.elapsed.lock().unwrap() = elapsed;
        Ok(Report::new(Status::Exited { code: 0 }, Duration::ZERO))
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap()
}

fn timed_runs(c: &mut Criterion, group: &str, name: &str, in_process: bool) {
    let rt = rt();
    let tier = Timed { in_process, ..Timed::default() };
    let sandbox = Sandbox::builder().tier(tier.clone()).build().unwrap();
    let job = Job::command("bench", Vec::<String>::new()).unwrap();
    let grants = grants();
    c.benchmark_group(group).bench_function(name, |b| {
        b.iter_custom(|iters| {
            *tier.iters.lock().unwrap() = iters;
            rt.block_on(sandbox.report(RunRequest::new(&job).grants(grants.clone()))).unwrap();
            *tier.elapsed.lock().unwrap()
        });
    });
}

fn socket(c: &mut Criterion) {
    // The baseline: a bare frame echo server on a unix socket, in the same runtime.
    let rt = rt();
    let dir = std::env::temp_dir().join(format!("stockade-bench-echo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("echo.sock");
    let listener = rt.block_on(async { tokio::net::UnixListener::bind(&path) }).unwrap();
    rt.spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let codec = FrameCodec::default();
                while let Ok(Some(p)) = codec.read_frame_async(&mut s).await {
                    if codec.write_frame_async(&mut s, &p).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    c.benchmark_group("grants_socket_round_trip").bench_function("baseline_unix_frame_echo", |b| {
        b.iter_custom(|iters| client_loop(&path, iters));
    });
    timed_runs(c, "grants_socket_round_trip", "broker_call", false);
    let _ = std::fs::remove_dir_all(&dir);
}

fn in_process(c: &mut Criterion) {
    let body = frame();
    c.benchmark_group("grants_in_process").bench_function("baseline_parse_and_reply", |b| {
        b.iter(|| {
            let f = BrokerFrame::parse(std::hint::black_box(&body)).unwrap();
            let BrokerFrame::Call { id, .. } = f else { unreachable!() };
            BrokerFrame::Reply { id, body: ReplyBody::Result(json!(3)) }.to_bytes()
        });
    });
    timed_runs(c, "grants_in_process", "broker_call", true);
}

#[cfg(feature = "wasm")]
fn wasm_js(c: &mut Criterion) {
    let Ok(tier) = stockade_runtime::wasm::WasmTier::new() else { return };
    let rt = rt();
    let sandbox = Sandbox::builder().tier(tier).build().unwrap();
    let job = |src: &str| stockade_runtime::wasm::javascript_job(src.to_owned()).unwrap();
    let (local, granted) = (
        job("function f(a, b) { return a + b } let s = 0; for (let i = 0; i < 1000; i++) s += f(1, 2); console.log(s)"),
        job("let s = 0; for (let i = 0; i < 1000; i++) s += add(1, 2); console.log(s)"),
    );
    let grants = grants();
    // Compile and cache the guest first.
    rt.block_on(sandbox.report(RunRequest::new(&local).grants(grants.clone()))).unwrap();
    let mut g = c.benchmark_group("grants_wasm_js");
    g.sample_size(30);
    g.bench_function("baseline_1000_local_calls", |b| {
        b.iter(|| rt.block_on(sandbox.report(RunRequest::new(&local).grants(grants.clone()))).unwrap())
    });
    g.bench_function("granted_1000_add_calls", |b| {
        b.iter(|| {
            let r = rt.block_on(sandbox.report(RunRequest::new(&granted).grants(grants.clone()))).unwrap();
            assert_eq!(r.stdout.bytes, b"3000\n");
        })
    });
}

#[cfg(not(feature = "wasm"))]
fn wasm_js(_c: &mut Criterion) {}

fn mcp(c: &mut Criterion) {
    use std::io::BufRead;
    use stockade_runtime::mcp::{McpCommand, McpServer};
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/mcp_server.py");
    let mut g = c.benchmark_group("grants_mcp");
    // The baseline: the server alone, driven over its pipes by hand.
    let mut child = std::process::Command::new("python3")
        .args([script, "ok"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let line = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"echo\",\"arguments\":{\"text\":\"hi\"}}}\n";
    let mut answer = String::new();
    g.bench_function("baseline_bare_stdio_client", |b| {
        b.iter(|| {
            stdin.write_all(line).unwrap();
            answer.clear();
            stdout.read_line(&mut answer).unwrap();
        })
    });
    drop(stdin);
    let _ = child.wait();
    let rt = rt();
    let server = rt.block_on(McpServer::start(McpCommand::new("raw", "python3", [script, "ok"]).unwrap())).unwrap();
    let grants = Grants::new().mcp(&server).unwrap();
    let policy = Policy::from_toml(
        "version = 1\ndefault = \"deny\"\n[[rule]]\nid = \"echo\"\ntool = \"raw.echo\"\neffect = \"allow\"\n",
        &grants.registry(),
    )
    .unwrap();
    let mut gate = stockade_policy::allow::Gate::new(policy);
    let call = stockade_policy::allow::ToolCall::from_json(
        "raw.echo",
        &json!({"text": "hi"}),
        &stockade_policy::allow::Source::Sandbox,
    )
    .unwrap();
    g.bench_function("mcp_server_call", |b| {
        b.iter_custom(|iters| {
            let permits: Vec<Permit> =
                (0..iters).map(|_| gate.decide_unattended(&call, Duration::ZERO).unwrap()).collect();
            let start = Instant::now();
            rt.block_on(async {
                for p in permits {
                    server.call(p).await.unwrap();
                }
            });
            start.elapsed()
        })
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = socket, in_process, wasm_js, mcp
}
criterion_main!(benches);
