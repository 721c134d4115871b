//! The model proxy: a run's model grant (`stockade_runtime::ModelService`). Sandboxed code
//! speaks OpenAI-compatible HTTP/1.1 to `model.sock` in its grants directory with a per-run
//! placeholder key; the proxy checks the key, validates the body with protocol's strict chat
//! validator, rebuilds the request from the validated fields only, sends it to the one
//! configured upstream with the real key (this crate's [`Endpoint`]: no redirects, no proxy
//! from the environment, bounded), and answers with a response rebuilt from the decoded
//! completion, with the real key scrubbed from anything it returns.
//!
//! Nothing from the sandbox configures the proxy: the upstream, the model and the key come
//! from the host. The guest's `model` must be the configured one (or absent). Streaming
//! (`stream: true`) is answered as server-sent events once the upstream's answer is whole:
//! one content chunk, one chunk per tool call, the finish reason, the usage, `[DONE]`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};
use stockade_protocol::GrantOutcome;
use stockade_protocol::chat::ChatRequest;
use stockade_protocol::completion::Completion;
use stockade_runtime::{ModelRun, ModelService};

use crate::endpoint::Endpoint;

/// Largest request body the proxy reads: 1 MiB.
pub const MAX_PROXY_BODY: usize = 1 << 20;

/// Default tokens per run: 100,000.
pub const DEFAULT_RUN_TOKENS: u64 = 100_000;

/// The model proxy. Cheap to clone.
#[derive(Clone, Debug)]
pub struct ModelProxy {
    endpoint: Endpoint,
    max_tokens: u64,
    request_timeout: Duration,
}

impl ModelProxy {
    /// A proxy to `endpoint` (its base URL, model and key), with [`DEFAULT_RUN_TOKENS`] per
    /// run and a 120 s limit per request.
    #[must_use]
    pub fn new(endpoint: Endpoint) -> Self {
        Self { endpoint, max_tokens: DEFAULT_RUN_TOKENS, request_timeout: Duration::from_secs(120) }
    }

    /// Sets the tokens one run may use (the upstream's reported usage, summed).
    #[must_use]
    pub fn max_tokens(mut self, n: u64) -> Self {
        self.max_tokens = n;
        self
    }

    /// Sets the time limit of one request.
    #[must_use]
    pub fn request_timeout(mut self, d: Duration) -> Self {
        self.request_timeout = d;
        self
    }

    fn scrub(&self, text: &str) -> String {
        match self.endpoint.key() {
            Some(k) => k.scrub(text),
            None => text.to_owned(),
        }
    }

    /// One request: the response, and what to record (outcome, rule).
    async fn handle(
        &self,
        req: Request<hyper::body::Incoming>,
        run: &ModelRun,
    ) -> (Response<Full<Bytes>>, GrantOutcome, &'static str) {
        let presented =
            req.headers().get(AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
        let authorised = presented.is_some_and(|k| run.placeholder_matches(k));
        let route = (req.method().clone(), req.uri().path().to_owned());
        if !authorised {
            let r = error(
                StatusCode::UNAUTHORIZED,
                "invalid_api_key",
                "the broker accepts only this run's placeholder key",
            );
            return (r, GrantOutcome::Denied, "model-placeholder-key");
        }
        if let Err(why) = run.begin() {
            return (error(StatusCode::TOO_MANY_REQUESTS, "refused", &why), GrantOutcome::Refused, "model-bound");
        }
        match (route.0, route.1.as_str()) {
            (Method::GET, "/v1/models") => {
                let body = json!({"object": "list", "data": [{"id": self.endpoint.model(), "object": "model", "owned_by": "stockade"}]});
                (ok_json(&body), GrantOutcome::Ok, "model-list")
            }
            (Method::POST, "/v1/chat/completions") => self.chat(req, run).await,
            _ => (
                error(
                    StatusCode::NOT_FOUND,
                    "not_found",
                    "the broker serves POST /v1/chat/completions and GET /v1/models",
                ),
                GrantOutcome::Denied,
                "model-route",
            ),
        }
    }

    async fn chat(
        &self,
        req: Request<hyper::body::Incoming>,
        run: &ModelRun,
    ) -> (Response<Full<Bytes>>, GrantOutcome, &'static str) {
        let body = match Limited::new(req.into_body(), MAX_PROXY_BODY).collect().await {
            Ok(b) => b.to_bytes(),
            Err(_) => {
                let msg = format!("the request body is over {MAX_PROXY_BODY} bytes, or was cut short");
                return (error(StatusCode::PAYLOAD_TOO_LARGE, "too_large", &msg), GrantOutcome::Refused, "model-body");
            }
        };
        let mut request = match ChatRequest::parse(&body) {
            Ok(r) => r,
            Err(e) => {
                return (
                    error(StatusCode::BAD_REQUEST, "invalid_request_error", &e.to_string()),
                    GrantOutcome::Denied,
                    "model-validator",
                );
            }
        };
        if !request.model.is_empty() && request.model != self.endpoint.model() {
            let msg = format!("this run may use the model {:?} only", self.endpoint.model());
            return (error(StatusCode::FORBIDDEN, "model_not_allowed", &msg), GrantOutcome::Denied, "model-allowlist");
        }
        request.model = self.endpoint.model().to_owned();
        if run.tokens() >= self.max_tokens {
            let msg = format!("this run's {} tokens are spent", self.max_tokens);
            return (
                error(StatusCode::TOO_MANY_REQUESTS, "tokens_spent", &msg),
                GrantOutcome::Refused,
                "model-token-budget",
            );
        }
        let stream = request.stream == Some(true);
        request.stream = None;
        request.stream_options = None;
        let deadline = Instant::now() + self.request_timeout;
        let exchange = match self.endpoint.complete(&request, deadline, None, 0).await {
            Ok(x) => x,
            Err(e) => {
                let msg = self.scrub(&e.to_string());
                return (
                    error(StatusCode::BAD_GATEWAY, "upstream_error", &msg),
                    GrantOutcome::Failed,
                    "model-upstream",
                );
            }
        };
        let c = &exchange.completion;
        if let Some(u) = &c.usage {
            run.add_tokens(u.total_tokens);
        }
        let model = self.endpoint.model();
        let text = if stream { sse(c, model) } else { rebuilt(c, model).to_string() };
        let text = self.scrub(&text);
        let content_type = if stream { "text/event-stream" } else { "application/json" };
        let response = Response::builder()
            .status(StatusCode::OK)
            .header(CONTENT_TYPE, content_type)
            .body(Full::new(Bytes::from(text)))
            .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())));
        (response, GrantOutcome::Ok, "model")
    }
}

fn error(status: StatusCode, kind: &str, message: &str) -> Response<Full<Bytes>> {
    let body = json!({"error": {"message": message, "type": kind}});
    Response::builder()
        .status(status)
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

fn ok_json(v: &Value) -> Response<Full<Bytes>> {
    Response::builder()
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(v.to_string())))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

/// The decoded calls whose arguments were accepted, as OpenAI `tool_calls`.
fn tool_calls(c: &Completion) -> Vec<Value> {
    c.calls
        .iter()
        .enumerate()
        .filter_map(|(i, call)| {
            let args = call.arguments.as_ref().ok()?;
            Some(json!({
                "id": call.provider_id.clone().unwrap_or_else(|| format!("call_{i}")),
                "type": "function",
                "function": {"name": call.name, "arguments": Value::Object(args.clone()).to_string()},
            }))
        })
        .collect()
}

fn usage(c: &Completion) -> Value {
    c.usage.as_ref().map_or(Value::Null, |u| {
        json!({"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens, "total_tokens": u.total_tokens})
    })
}

fn created() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A `chat.completion` rebuilt from the decoded fields only.
fn rebuilt(c: &Completion, model: &str) -> Value {
    let calls = tool_calls(c);
    let mut message = json!({"role": "assistant", "content": c.text});
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    json!({
        "id": "chatcmpl-stockade",
        "object": "chat.completion",
        "created": created(),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": c.finish_reason.clone().unwrap_or_else(|| "stop".into())}],
        "usage": usage(c),
    })
}

/// The same completion as server-sent `chat.completion.chunk` events.
fn sse(c: &Completion, model: &str) -> String {
    let chunk = |delta: Value, finish: Option<&str>| {
        json!({"id": "chatcmpl-stockade", "object": "chat.completion.chunk", "created": created(), "model": model,
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    let mut events = vec![chunk(json!({"role": "assistant", "content": c.text.clone().unwrap_or_default()}), None)];
    for (i, call) in tool_calls(c).into_iter().enumerate() {
        let mut call = call;
        call["index"] = json!(i);
        events.push(chunk(json!({"tool_calls": [call]}), None));
    }
    events.push(chunk(json!({}), Some(c.finish_reason.as_deref().unwrap_or("stop"))));
    let mut out = String::new();
    for e in events {
        out.push_str(&format!("data: {e}\n\n"));
    }
    if c.usage.is_some() {
        let u = json!({"id": "chatcmpl-stockade", "object": "chat.completion.chunk", "created": created(), "model": model, "choices": [], "usage": usage(c)});
        out.push_str(&format!("data: {u}\n\n"));
    }
    out.push_str("data: [DONE]\n\n");
    out
}

impl ModelService for ModelProxy {
    fn serve(
        &self,
        conn: tokio::net::UnixStream,
        run: ModelRun,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        let proxy = Arc::new(self.clone());
        Box::pin(async move {
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let (proxy, run) = (proxy.clone(), run.clone());
                async move {
                    let t0 = Instant::now();
                    let sent = req
                        .headers()
                        .get(hyper::header::CONTENT_LENGTH)
                        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                        .unwrap_or(0);
                    let (response, outcome, rule) = proxy.handle(req, &run).await;
                    let out = hyper::body::Body::size_hint(response.body()).exact().unwrap_or(0);
                    run.record(outcome, rule, (sent, out), t0.elapsed());
                    Ok::<_, Infallible>(response)
                }
            });
            let io = hyper_util::rt::TokioIo::new(conn);
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .max_buf_size(64 << 10)
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(io, service)
                .await;
        })
    }
}
