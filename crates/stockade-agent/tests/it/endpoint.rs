//! The endpoint client: G6 (caps, deadlines, retries, no redirects, validation) and G7 (the key).

use std::time::{Duration, Instant};

use serde_json::json;
use stockade_agent::protocol::chat::{ChatMessage, ChatRequest, Role, Tool as ChatTool};
use stockade_agent::{AgentError, ApiKey, Endpoint, EndpointError, Trace};
use stockade_test_support::{MockLlm, Reply};

use crate::support::{World, agent, block_on, builder, policy};

fn request() -> ChatRequest {
    ChatRequest::new("m", vec![ChatMessage::text(Role::User, "hi")])
}

fn complete(endpoint: &Endpoint, within: Duration) -> Result<stockade_agent::Exchange, EndpointError> {
    block_on(endpoint.complete(&request(), Instant::now() + within, None, 1))
}

#[test]
fn g6_5xx_and_dropped_connections_are_retried_then_succeed() {
    let mock = MockLlm::script(vec![
        Reply::raw(500, b"boom".to_vec()),
        Reply::hang_up(),
        Reply::raw(503, vec![]),
        Reply::text("hello"),
    ])
    .unwrap();
    let endpoint = Endpoint::new(&mock.url(), "m").unwrap().retries(3);
    let ex = complete(&endpoint, Duration::from_secs(30)).unwrap();
    assert_eq!(ex.completion.text.as_deref(), Some("hello"));
    assert_eq!(ex.attempts, 4);
    assert_eq!(mock.received().len(), 4);
}

#[test]
fn g6_retries_stop_at_their_budget() {
    let mock = MockLlm::start(|_, _| Reply::raw(502, b"bad gateway".to_vec())).unwrap();
    let endpoint = Endpoint::new(&mock.url(), "m").unwrap().retries(2);
    let err = complete(&endpoint, Duration::from_secs(30)).unwrap_err();
    assert!(matches!(err, EndpointError::Server { status: 502, attempts: 3, .. }), "{err:?}");
    assert_eq!(mock.received().len(), 3);
    // A closed port: connection refused, retried, then typed.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let endpoint = Endpoint::new(&format!("http://127.0.0.1:{port}/v1"), "m").unwrap().retries(1);
    let err = complete(&endpoint, Duration::from_secs(30)).unwrap_err();
    assert!(matches!(err, EndpointError::Unreachable { attempts: 2, .. }), "{err:?}");
}

#[test]
fn g6_429_is_retried_only_with_a_retry_after_inside_the_deadline() {
    let mock = MockLlm::script(vec![Reply::raw(429, vec![]).header("retry-after", "1"), Reply::text("ok")]).unwrap();
    let endpoint = Endpoint::new(&mock.url(), "m").unwrap();
    let t0 = Instant::now();
    assert!(complete(&endpoint, Duration::from_secs(30)).is_ok());
    assert!(t0.elapsed() >= Duration::from_secs(1));
    for reply in [Reply::raw(429, vec![]), Reply::raw(429, vec![]).header("retry-after", "60")] {
        let mock = MockLlm::script(vec![reply, Reply::text("ok")]).unwrap();
        let endpoint = Endpoint::new(&mock.url(), "m").unwrap();
        let err = complete(&endpoint, Duration::from_secs(5)).unwrap_err();
        assert!(matches!(err, EndpointError::RateLimited { .. }), "{err:?}");
        assert_eq!(mock.received().len(), 1);
    }
}

#[test]
fn g6_bodies_are_capped_before_parsing_and_redirects_are_not_followed() {
    let mock = MockLlm::script(vec![Reply::raw(200, vec![b' '; 2 << 20])]).unwrap();
    let endpoint = Endpoint::new(&mock.url(), "m").unwrap().max_response_bytes(1 << 20);
    assert!(
        matches!(complete(&endpoint, Duration::from_secs(10)), Err(EndpointError::TooLarge { max, .. }) if max == 1 << 20)
    );
    let mut body_lies = Reply::text("hello");
    body_lies.claimed_len = Some(body_lies.body.len() + 100);
    let mock = MockLlm::script(vec![body_lies]).unwrap();
    let endpoint = Endpoint::new(&mock.url(), "m").unwrap().retries(0);
    let err = complete(&endpoint, Duration::from_secs(10)).unwrap_err();
    assert!(matches!(err, EndpointError::Unreachable { .. }), "{err:?}");
    let other = MockLlm::script(vec![Reply::text("elsewhere")]).unwrap();
    let mock =
        MockLlm::script(vec![Reply::raw(307, vec![]).header("location", &format!("{}/chat/completions", other.url()))])
            .unwrap();
    let endpoint = Endpoint::new(&mock.url(), "m").unwrap();
    let err = complete(&endpoint, Duration::from_secs(10)).unwrap_err();
    assert!(matches!(err, EndpointError::Rejected { status: 307, .. }), "{err:?}");
    assert!(other.received().is_empty(), "the redirect was not followed");
}

#[test]
fn g6_a_stalled_server_is_cut_at_the_request_timeout() {
    let mock = MockLlm::start(|_, _| Reply::text("late").delayed(Duration::from_secs(10))).unwrap();
    let endpoint = Endpoint::new(&mock.url(), "m").unwrap().request_timeout(Duration::from_millis(300));
    let t0 = Instant::now();
    assert!(matches!(complete(&endpoint, Duration::from_secs(30)), Err(EndpointError::Timeout { .. })));
    assert!(t0.elapsed() < Duration::from_secs(2));
}

#[test]
fn g6_requests_are_validated_before_they_are_sent() {
    let mock = MockLlm::script(vec![Reply::text("never")]).unwrap();
    let endpoint = Endpoint::new(&mock.url(), "m").unwrap();
    let mut bad = request();
    bad.tools = vec![ChatTool::function("t", "d", json!({"type": "object", "$ref": "https://example.invalid/s.json"}))];
    let err = block_on(endpoint.complete(&bad, Instant::now() + Duration::from_secs(5), None, 1)).unwrap_err();
    assert!(matches!(err, EndpointError::Invalid(_)), "{err:?}");
    assert!(mock.received().is_empty());
}

#[test]
fn g6_urls_that_reach_elsewhere_are_refused() {
    for (url, what) in [
        ("http://user:pw@127.0.0.1:1/v1", "credentials"),
        ("ftp://127.0.0.1/v1", "http://"),
        ("http://127.0.0.1:1/v1?x=1", "query"),
    ] {
        let err = Endpoint::new(url, "m").unwrap_err();
        assert!(err.to_string().contains(what), "{url}: {err}");
    }
    assert!(Endpoint::new("https://x.invalid/v1", "m").is_ok(), "https is built in (the tls feature)");
}

#[test]
fn g7_the_key_goes_only_into_the_authorization_header() {
    const KEY: &str = "sk-test-0123456789abcdefSECRET";
    let world = World::default();
    let mock = MockLlm::script(vec![
        Reply::calls(&[("read_scroll", json!({"name": "north"}))]),
        Reply::raw(401, format!("{{\"error\":\"bad key {KEY}\"}}").into_bytes()),
    ])
    .unwrap();
    let dir = std::env::temp_dir().join(format!("stockade-agent-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace_path = dir.join("trace.jsonl");
    let endpoint = Endpoint::new(&mock.url(), "m").unwrap().with_key(ApiKey::new(KEY.into()).unwrap());
    assert!(!format!("{endpoint:?}").contains(KEY));
    let agent = stockade_agent::Agent::builder(endpoint);
    let mut agent = agent.system_prompt("s");
    for t in crate::support::steward_tools(&world) {
        agent = agent.tool(t);
    }
    let agent =
        agent.policy_toml(&policy()).unwrap().trace(Trace::create_ambient(&trace_path).unwrap()).build().unwrap();
    assert!(!format!("{agent:?}").contains(KEY));
    let err = block_on(agent.run("go")).unwrap_err();
    assert!(matches!(err, AgentError::Endpoint(EndpointError::Auth { status: 401, .. })), "{err:?}");
    assert!(!err.to_string().contains(KEY) && !format!("{err:?}").contains(KEY));
    let got = mock.received();
    assert_eq!(got.len(), 2);
    for r in &got {
        assert_eq!(r.header("authorization"), Some(format!("Bearer {KEY}").as_str()));
        assert!(!r.body.to_string().contains(KEY));
        assert!(r.headers.iter().filter(|(k, _)| k != "authorization").all(|(_, v)| !v.contains(KEY)));
    }
    let trace = std::fs::read_to_string(&trace_path).unwrap();
    assert!(trace.lines().count() >= 5, "{trace}");
    assert!(!trace.contains(KEY), "the trace holds the key: the 401 body echoed it and was scrubbed");
    assert!(trace.contains("[redacted]"));
    for line in trace.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(v["event"].is_string() && v["t_ms"].is_u64(), "{line}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
    // No key configured: no Authorization header at all.
    let world = World::default();
    let mock = MockLlm::script(vec![Reply::text("hi")]).unwrap();
    block_on(agent_without_key(&mock.url(), &world)).unwrap();
    assert_eq!(mock.received()[0].header("authorization"), None);
    let _ = builder;
}

async fn agent_without_key(url: &str, world: &World) -> Result<stockade_agent::Answer, AgentError> {
    agent(url, world).run("hi").await
}

#[test]
fn g7_a_key_is_read_from_the_named_variable_only() {
    let err = ApiKey::from_env_ambient("STOCKADE_TEST_SURELY_UNSET_VARIABLE").unwrap_err();
    assert!(err.to_string().contains("STOCKADE_TEST_SURELY_UNSET_VARIABLE"));
    assert!(ApiKey::new(String::new()).is_none());
    assert!(ApiKey::new("has space".into()).is_none());
    assert!(ApiKey::new("line\nbreak".into()).is_none());
    assert_eq!(format!("{:?}", ApiKey::new("sk-x".into()).unwrap()), "ApiKey([redacted])");
}

fn chunk(delta: serde_json::Value, finish: Option<&str>) -> serde_json::Value {
    json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
}

#[test]
fn g6_a_streamed_answer_is_shown_as_it_arrives_and_assembled() {
    use std::sync::{Arc, Mutex};
    let world = World::default();
    let mock = MockLlm::script(vec![
        Reply::sse(
            &[
                chunk(json!({"role": "assistant", "content": "Reading "}), None),
                chunk(json!({"tool_calls": [{"index": 0, "id": "a", "type": "function", "function": {"name": "read_ledger", "arguments": "{\"pa"}}]}), None),
                chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": "ge\": 1}"}}]}), Some("tool_calls")),
            ],
            true,
        ),
        Reply::sse(&[chunk(json!({"content": "The ledger "}), None), chunk(json!({"content": "is read."}), Some("stop"))], true),
    ])
    .unwrap();
    let shown = Arc::new(Mutex::new(Vec::<String>::new()));
    let sink = shown.clone();
    let agent = builder(&mock.url(), &world)
        .policy_toml(&policy())
        .unwrap()
        .stream(Arc::new(move |t: &str| sink.lock().unwrap().push(t.to_owned())))
        .build()
        .unwrap();
    let answer = block_on(agent.run("go")).unwrap();
    assert_eq!(answer.text, "The ledger is read.");
    assert_eq!(*shown.lock().unwrap(), ["Reading ", "The ledger ", "is read."]);
    assert_eq!(world.runs(), ["read_ledger"]);
    let got = mock.received();
    assert_eq!(got[0].body["stream"], json!(true));
    assert_eq!(got[0].body["stream_options"], json!({"include_usage": true}));
}

#[test]
fn g6_a_stalled_stream_ends_at_the_idle_timeout_and_is_not_retried() {
    let mock = MockLlm::script(vec![
        Reply::sse(&[chunk(json!({"content": "half"}), None)], false).stalled(Duration::from_secs(10)),
        Reply::text("retried"),
    ])
    .unwrap();
    let endpoint = Endpoint::new(&mock.url(), "m").unwrap().stream_idle_timeout(Duration::from_millis(300));
    let t0 = Instant::now();
    let err =
        block_on(endpoint.complete_streamed(&request(), Instant::now() + Duration::from_secs(30), None, 1, &|_| {}))
            .unwrap_err();
    assert!(matches!(err, EndpointError::Broken { .. }), "{err:?}");
    assert!(t0.elapsed() < Duration::from_secs(3));
    assert_eq!(mock.received().len(), 1, "a stream that had begun is never retried");
    // A stream that ends without [DONE] or a finish_reason is refused.
    let mock = MockLlm::script(vec![Reply::sse(&[chunk(json!({"content": "half"}), None)], false)]).unwrap();
    let endpoint = Endpoint::new(&mock.url(), "m").unwrap();
    let err =
        block_on(endpoint.complete_streamed(&request(), Instant::now() + Duration::from_secs(30), None, 1, &|_| {}))
            .unwrap_err();
    assert!(matches!(err, EndpointError::Stream(_)), "{err:?}");
}

#[test]
fn g7_https_endpoints_are_verified_before_the_key_is_sent() {
    use stockade_test_support::TEST_CA_PEM;
    const KEY: &str = "sk-tls-test-key";
    let mock = MockLlm::script_tls(vec![Reply::text("over tls")]).unwrap();
    assert!(mock.url().starts_with("https://127.0.0.1:"));
    // Trusted root: the request goes through, key and all.
    let endpoint = Endpoint::new(&mock.url(), "m")
        .unwrap()
        .with_key(ApiKey::new(KEY.into()).unwrap())
        .with_root_pem(TEST_CA_PEM)
        .unwrap();
    let ex = complete(&endpoint, Duration::from_secs(10)).unwrap();
    assert_eq!(ex.completion.text.as_deref(), Some("over tls"));
    assert_eq!(mock.received()[0].header("authorization"), Some(format!("Bearer {KEY}").as_str()));
    // The same server without its root: the handshake fails, and no request (so no key) was sent.
    let mock = MockLlm::script_tls(vec![Reply::text("never")]).unwrap();
    let endpoint = Endpoint::new(&mock.url(), "m").unwrap().with_key(ApiKey::new(KEY.into()).unwrap()).retries(0);
    let err = complete(&endpoint, Duration::from_secs(10)).unwrap_err();
    assert!(
        matches!(&err, EndpointError::Unreachable { last, .. } if last.contains("certificate") || last.contains("Certificate")),
        "{err}"
    );
    assert!(mock.received().is_empty());
    // https to a plain-http server fails; http to it never downgrades anything.
    let plain = MockLlm::script(vec![Reply::text("plain")]).unwrap();
    let endpoint = Endpoint::new(&plain.url().replace("http://", "https://"), "m")
        .unwrap()
        .retries(0)
        .request_timeout(Duration::from_millis(500));
    let err = complete(&endpoint, Duration::from_secs(10)).unwrap_err();
    assert!(matches!(err, EndpointError::Unreachable { .. } | EndpointError::Timeout { .. }), "{err:?}");
    assert!(plain.received().is_empty());
    assert!(
        Endpoint::new("https://127.0.0.1:1/v1", "m")
            .unwrap()
            .with_root_pem(b"-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
            .is_err()
    );
}
