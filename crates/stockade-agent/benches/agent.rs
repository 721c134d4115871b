#![allow(missing_docs, reason = "criterion_main generates an undocumented main")]
#![allow(clippy::unwrap_used, reason = "a bench fails loudly")]
//! The loop's own cost per tool call: decode the completion, check and authorise the call,
//! dispatch it to an in-process tool, mark its untrusted output, and build and validate the
//! next request. The model and the tool's work are excluded. Next to it, in the same run, a
//! bare `serde_json` parse of the same response bytes.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use futures_util::FutureExt;
use serde_json::json;
use stockade_agent::protocol::completion::decode_completion;
use stockade_agent::{Action, Agent, Endpoint, FnTool, Step, ToolDef, ToolOutput, Trust};

const POLICY: &str = include_str!("../../stockade-policy/policies/steward.toml");

fn bench(c: &mut Criterion) {
    let scroll = FnTool::new(
        ToolDef::new(
            "read_scroll",
            "Reads a delivery.",
            json!({"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}),
            Trust::Untrusted,
        ),
        |_| {
            ToolOutput::Text(
                "To the steward, from riverhold: the harvest is in. Send word of yours <b>soon</b>.".into(),
            )
        },
    );
    let ledger = FnTool::new(
        ToolDef::new(
            "read_ledger",
            "Reads the ledger.",
            json!({"type": "object", "properties": {"page": {"type": "integer"}}, "required": ["page"]}),
            Trust::Trusted,
        ),
        |_| ToolOutput::Text("{}".into()),
    );
    let raven = FnTool::new(
        ToolDef::new(
            "send_raven",
            "Sends a raven.",
            json!({"type": "object", "properties": {"to": {"type": "string"}, "text": {"type": "string"}}, "required": ["to", "text"]}),
            Trust::Trusted,
        ),
        |_| ToolOutput::Text("flew".into()),
    );
    let run_code = stockade_agent::RunCode::new(stockade_agent::protocol::Limits::new());
    let endpoint = Endpoint::new("http://127.0.0.1:9/v1", "m").unwrap();
    let agent = Agent::builder(endpoint)
        .tool(Arc::new(scroll))
        .tool(Arc::new(ledger))
        .tool(Arc::new(raven))
        .tool(Arc::new(run_code))
        .policy_toml(POLICY)
        .unwrap()
        .build()
        .unwrap();
    let tools = {
        let mut t = stockade_agent::ToolBox::new();
        t.insert(Arc::new(FnTool::new(
            ToolDef::new(
                "read_scroll",
                "",
                json!({"type": "object", "properties": {"name": {"type": "string"}}}),
                Trust::Untrusted,
            ),
            |_| {
                ToolOutput::Text(
                    "To the steward, from riverhold: the harvest is in. Send word of yours <b>soon</b>.".into(),
                )
            },
        )));
        t
    };
    let body = serde_json::to_vec(&json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null,
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "read_scroll", "arguments": "{\"name\":\"north\"}"}}]}}],
        "usage": {"prompt_tokens": 120, "completion_tokens": 12, "total_tokens": 132}
    }))
    .unwrap();
    let mut g = c.benchmark_group("agent_loop_per_call");
    g.bench_function("baseline_serde_json_parse", |b| {
        b.iter(|| black_box(serde_json::from_slice::<serde_json::Value>(black_box(&body)).unwrap()));
    });
    g.bench_function("loop_one_call", |b| {
        b.iter_batched(
            || {
                let mut run = agent.start("Three deliveries reached the gate today.");
                let Step::CallModel(_) = run.next_step() else { unreachable!() };
                run
            },
            |mut run| {
                let completion = decode_completion(black_box(&body)).unwrap();
                let Step::CallTools(mut d) = run.on_completion(completion, Duration::ZERO) else { unreachable!() };
                let Some(dispatch) = d.pop() else { unreachable!() };
                let Action::Run(permit) = dispatch.action else { unreachable!() };
                let output = tools.dispatch(permit).now_or_never().unwrap();
                run.tool_result(dispatch.slot, output);
                let Step::CallModel(next) = run.finish_tools() else { unreachable!() };
                next.validate().unwrap();
                black_box(next)
            },
            BatchSize::SmallInput,
        );
    });
    g.finish();
}

/// A wasm `run_code` call end to end, in process: authorise, dispatch, run `console.log(6*7)`
/// in the wasm tier, verify, next to the same job run straight through `Sandbox::run`.
#[cfg(feature = "wasm")]
fn run_code_wasm(c: &mut Criterion) {
    use stockade_agent::policy::allow::{Context, Decision, Ledger, Policy, ToolCall};
    use stockade_agent::runtime::Sandbox;
    use stockade_agent::runtime::verify::{Budget, Contract, accept_any};
    if let Err(e) = stockade_agent::runtime::wasm::guests::javascript() {
        eprintln!("SKIPPED agent_run_code_wasm: {e}");
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let sandbox =
        Arc::new(Sandbox::builder().tier(stockade_agent::runtime::wasm::WasmTier::new().unwrap()).build().unwrap());
    let limits = stockade_agent::protocol::Limits::new();
    let mut tools = stockade_agent::ToolBox::new();
    tools.insert(Arc::new(stockade_agent::RunCode::new(limits).javascript(sandbox.clone())));
    let policy = Policy::from_toml(
        "version = 1\ndefault = \"deny\"\n[[rule]]\nid = \"c\"\ntool = \"run_code\"\neffect = \"allow\"\n",
        &tools.registry().unwrap(),
    )
    .unwrap();
    let call = ToolCall::from_json(
        "run_code",
        &json!({"language": "javascript", "code": "console.log(6*7)"}),
        &stockade_agent::policy::allow::Source::User,
    )
    .unwrap();
    let job = stockade_agent::runtime::wasm::javascript_job(b"console.log(6*7)".to_vec()).unwrap().with_limits(limits);
    let contract = Contract::bytes(Budget::new(limits.wall(), limits.stdout_bytes()), accept_any);
    // Warm the module cache and the engine.
    let _warm = rt.block_on(sandbox.run(&job, &contract)).unwrap().into_result().unwrap();
    let mut g = c.benchmark_group("agent_run_code_wasm");
    g.bench_function("baseline_sandbox_run", |b| {
        b.iter(|| black_box(rt.block_on(sandbox.run(&job, &contract)).unwrap().is_verified()));
    });
    g.bench_function("run_code_call", |b| {
        let ledger = Ledger::new();
        b.iter(|| {
            let Decision::Allow(permit) = policy.authorize(&call, &Context::new(&ledger, Duration::ZERO)) else {
                unreachable!()
            };
            black_box(rt.block_on(tools.dispatch(permit)))
        });
    });
    g.finish();
}

#[cfg(not(feature = "wasm"))]
fn run_code_wasm(_c: &mut Criterion) {
    eprintln!("SKIPPED agent_run_code_wasm: build with --features wasm");
}

/// One HTTP/1.1 POST on a fresh connection; reads the head and `content-length` bytes.
fn post_raw(mut s: impl std::io::Read + std::io::Write, key: &str, body: &str) -> usize {
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
    assert!(text.starts_with("http/1.1 200"), "{text}");
    let len: usize =
        text.lines().find_map(|l| l.strip_prefix("content-length:")).and_then(|v| v.trim().parse().ok()).unwrap();
    let mut rest = vec![0u8; len];
    s.read_exact(&mut rest).unwrap();
    head.len() + len
}

/// A tier whose "guest" times `iters` requests to the run's model socket.
#[derive(Debug, Clone, Default)]
struct ProxyTimer(Arc<std::sync::Mutex<(u64, Duration)>>);

#[async_trait::async_trait]
impl stockade_agent::runtime::Tier for ProxyTimer {
    fn name(&self) -> &'static str {
        "bench"
    }
    async fn run(
        &self,
        _job: &stockade_agent::protocol::Job,
    ) -> Result<stockade_agent::protocol::Report, stockade_agent::runtime::RunError> {
        unreachable!()
    }
    async fn run_granted(
        &self,
        job: &stockade_agent::protocol::Job,
        broker: &stockade_agent::runtime::Broker,
    ) -> Result<stockade_agent::protocol::Report, stockade_agent::runtime::RunError> {
        let sock = broker.socket_dir()?.join("model.sock");
        let job = broker.guest_job(job, "/run/stockade")?;
        let key = job.env().iter().find(|v| v.key() == "OPENAI_API_KEY").map(|v| v.value().to_owned()).unwrap();
        let iters = self.0.lock().unwrap().0;
        let elapsed = tokio::task::spawn_blocking(move || {
            let start = std::time::Instant::now();
            for _ in 0..iters {
                black_box(post_raw(std::os::unix::net::UnixStream::connect(&sock).unwrap(), &key, BODY));
            }
            start.elapsed()
        })
        .await
        .unwrap();
        self.0.lock().unwrap().1 = elapsed;
        Ok(stockade_agent::protocol::Report::new(stockade_agent::protocol::Status::Exited { code: 0 }, Duration::ZERO))
    }
}

const BODY: &str = r#"{"messages":[{"role":"user","content":"What is 6*7?"}]}"#;

/// The model proxy's overhead: the same raw HTTP client posting the same body to the mock
/// upstream on 127.0.0.1 directly, and through a run's `model.sock` (placeholder check,
/// validator, rebuild, `Endpoint`, rebuilt and scrubbed answer).
fn model_proxy(c: &mut Criterion) {
    let mock = stockade_test_support::MockLlm::start(|_, _| stockade_test_support::Reply::text("42")).unwrap();
    let addr = mock.url().trim_start_matches("http://").trim_end_matches("/v1").to_owned();
    let mut g = c.benchmark_group("agent_model_proxy");
    g.bench_function("baseline_direct_to_upstream", |b| {
        b.iter(|| post_raw(std::net::TcpStream::connect(&addr).unwrap(), "sk-real", BODY))
    });
    let endpoint = Endpoint::new(&mock.url(), "smol").unwrap().retries(0);
    let proxy = stockade_agent::ModelProxy::new(endpoint).max_tokens(u64::MAX);
    let limits = stockade_agent::runtime::GrantLimits::default().max_calls(u32::MAX);
    let grants = Arc::new(stockade_agent::runtime::Grants::new().model(Arc::new(proxy)).limits(limits));
    let timer = ProxyTimer::default();
    let sandbox = stockade_agent::runtime::Sandbox::builder().tier(timer.clone()).build().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let job = stockade_agent::protocol::Job::command("bench", Vec::<String>::new()).unwrap();
    g.bench_function("through_the_proxy", |b| {
        b.iter_custom(|iters| {
            timer.0.lock().unwrap().0 = iters;
            rt.block_on(sandbox.report(stockade_agent::runtime::RunRequest::new(&job).grants(grants.clone()))).unwrap();
            timer.0.lock().unwrap().1
        })
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(5));
    targets = bench, run_code_wasm, model_proxy
}
criterion_main!(benches);
