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
//! (`stream: true`) is relayed as server-sent events while the upstream streams: each piece
//! of text as a content chunk as it arrives (held back by at most the key's length, so a key
//! split across pieces is still scrubbed), then one chunk per tool call, the finish reason,
//! the usage and `[DONE]` once the upstream's answer is whole.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
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

/// A response body: whole, or relayed from a channel as the upstream streams.
type ProxyBody = BoxBody<Bytes, Infallible>;

/// A response, and what to record for it (`None`: the relay task records it).
type Handled = (Response<ProxyBody>, Option<(GrantOutcome, &'static str)>);

fn whole(text: impl Into<Bytes>) -> ProxyBody {
    Full::new(text.into()).boxed()
}

/// A body fed by a channel (the relay task), ending when the task drops its sender.
pub(crate) struct ChannelBody(pub(crate) tokio::sync::mpsc::UnboundedReceiver<Bytes>);

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|o| o.map(|b| Ok(hyper::body::Frame::data(b))))
    }
}

/// Scrubs the key from a text that arrives in pieces: holds back the last `key.len() - 1`
/// bytes of what it has seen, so a key split across pieces is still found.
struct Scrubber {
    key: Option<Arc<crate::secret::ApiKey>>,
    pending: String,
}

impl Scrubber {
    fn push(&mut self, piece: &str) -> String {
        self.pending.push_str(piece);
        let Some(key) = &self.key else { return std::mem::take(&mut self.pending) };
        let scrubbed = key.scrub(&self.pending);
        let mut keep = scrubbed.len().saturating_sub(key.len().saturating_sub(1));
        while !scrubbed.is_char_boundary(keep) {
            keep -= 1;
        }
        self.pending = scrubbed[keep..].to_owned();
        scrubbed[..keep].to_owned()
    }

    fn finish(&mut self) -> String {
        scrub(self.key.as_deref(), &std::mem::take(&mut self.pending))
    }
}

/// `value` with the key (if there is one) replaced by `[redacted]` wherever it appears in its
/// JSON text (the replacement has no character JSON escapes, so the text stays valid).
fn scrub_value(key: Option<&crate::secret::ApiKey>, value: Value) -> Value {
    let Some(key) = key else { return value };
    let text = value.to_string();
    let scrubbed = key.scrub(&text);
    if scrubbed == text {
        return value;
    }
    serde_json::from_str(&scrubbed)
        .unwrap_or_else(|_| json!({"type": "function", "function": {"name": "[redacted]", "arguments": "{}"}}))
}

/// `text` with the key (if there is one) replaced by `[redacted]`.
fn scrub(key: Option<&crate::secret::ApiKey>, text: &str) -> String {
    key.map_or_else(|| text.to_owned(), |k| k.scrub(text))
}

/// The model proxy. Cheap to clone.
#[derive(Clone, Debug)]
pub struct ModelProxy {
    endpoint: Endpoint,
    max_tokens: u64,
    max_requests: u64,
    request_timeout: Duration,
}

impl ModelProxy {
    /// A proxy to `endpoint` (its base URL, model and key), with [`DEFAULT_RUN_TOKENS`] per
    /// run and a 120 s limit per request.
    #[must_use]
    pub fn new(endpoint: Endpoint) -> Self {
        Self {
            endpoint,
            max_tokens: DEFAULT_RUN_TOKENS,
            max_requests: u64::MAX,
            request_timeout: Duration::from_secs(120),
        }
    }

    /// Sets the chat requests one run may make (an agent's turns), counted here, on the
    /// host: past them a request is refused (429) and nothing goes upstream.
    #[must_use]
    pub fn max_requests(mut self, n: u64) -> Self {
        self.max_requests = n;
        self
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
        scrub(self.endpoint.key().as_deref(), text)
    }

    /// One request: the response, and what to record (outcome, rule); `None` when a relay
    /// task records the request itself once the stream has ended.
    async fn handle(&self, req: Request<hyper::body::Incoming>, run: &ModelRun) -> Handled {
        let (head, body) = req.into_parts();
        // Read before any answer, refusals included: an answer sent while the client is still
        // writing its body closes the connection under it, and the client sees a broken pipe
        // (EPIPE) instead of the refusal (the CLI's key test met it with Python's http.client).
        let body = Limited::new(body, MAX_PROXY_BODY).collect().await.ok().map(http_body_util::Collected::to_bytes);
        let presented =
            head.headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
        let authorised = presented.is_some_and(|k| run.placeholder_matches(k));
        if !authorised {
            let msg = "the broker accepts only this run's placeholder key";
            return (
                error(StatusCode::UNAUTHORIZED, "invalid_api_key", msg),
                Some((GrantOutcome::Denied, "model-placeholder-key")),
            );
        }
        if let Err(why) = run.begin() {
            return (
                error(StatusCode::TOO_MANY_REQUESTS, "refused", &why),
                Some((GrantOutcome::Refused, "model-bound")),
            );
        }
        match (&head.method, head.uri.path()) {
            (&Method::GET, "/v1/models") => {
                let body = json!({"object": "list", "data": [{"id": self.endpoint.model(), "object": "model", "owned_by": "stockade"}]});
                (ok_json(&body), Some((GrantOutcome::Ok, "model-list")))
            }
            (&Method::POST, "/v1/chat/completions") => self.chat(body, run).await,
            _ => {
                let msg = "the broker serves POST /v1/chat/completions and GET /v1/models";
                (error(StatusCode::NOT_FOUND, "not_found", msg), Some((GrantOutcome::Denied, "model-route")))
            }
        }
    }

    /// A chat request, whose body `handle` read within [`MAX_PROXY_BODY`] (or could not).
    async fn chat(&self, body: Option<Bytes>, run: &ModelRun) -> Handled {
        let body = match body {
            Some(b) => b,
            None => {
                let msg = format!("the request body is over {MAX_PROXY_BODY} bytes, or was cut short");
                return Refused::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "too_large",
                    msg,
                    GrantOutcome::Refused,
                    "model-body",
                )
                .handled();
            }
        };
        let (request, stream) = match self.prepare(&body, run) {
            Ok(r) => r,
            Err(r) => return r.handled(),
        };
        let deadline = Instant::now() + self.request_timeout;
        if stream {
            return (self.relay(request, deadline, run.clone()), None);
        }
        match self.once(&request, deadline, run).await {
            Ok(text) => {
                let response = Response::builder()
                    .status(StatusCode::OK)
                    .header(CONTENT_TYPE, "application/json")
                    .body(whole(text))
                    .unwrap_or_else(|_| Response::new(whole(Bytes::new())));
                (response, Some((GrantOutcome::Ok, "model")))
            }
            Err(r) => r.handled(),
        }
    }

    /// Validates a chat request's body for this run: the strict validator, the configured
    /// model only, the run's token budget. Returns the request to send and whether the
    /// guest asked for a stream.
    fn prepare(&self, body: &[u8], run: &ModelRun) -> Result<(ChatRequest, bool), Refused> {
        let mut request = ChatRequest::parse(body).map_err(|e| {
            Refused::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                e.to_string(),
                GrantOutcome::Denied,
                "model-validator",
            )
        })?;
        if !request.model.is_empty() && request.model != self.endpoint.model() {
            let msg = format!("this run may use the model {:?} only", self.endpoint.model());
            return Err(Refused::new(
                StatusCode::FORBIDDEN,
                "model_not_allowed",
                msg,
                GrantOutcome::Denied,
                "model-allowlist",
            ));
        }
        request.model = self.endpoint.model().to_owned();
        run.witness_request(&request.messages);
        if run.tokens() >= self.max_tokens {
            let msg = format!("this run's {} tokens are spent", self.max_tokens);
            return Err(Refused::new(
                StatusCode::TOO_MANY_REQUESTS,
                "tokens_spent",
                msg,
                GrantOutcome::Refused,
                "model-token-budget",
            ));
        }
        if run.begin_request() > self.max_requests {
            let msg = format!("this run's {} model calls are spent", self.max_requests);
            return Err(Refused::new(
                StatusCode::TOO_MANY_REQUESTS,
                "turns_spent",
                msg,
                GrantOutcome::Refused,
                "model-turn-budget",
            ));
        }
        let stream = request.stream == Some(true);
        request.stream = None;
        request.stream_options = None;
        Ok((request, stream))
    }

    /// Sends a validated request upstream once and returns the rebuilt response's JSON,
    /// with the real key scrubbed.
    async fn once(&self, request: &ChatRequest, deadline: Instant, run: &ModelRun) -> Result<String, Refused> {
        let exchange = self.endpoint.complete(request, deadline, None, 0).await.map_err(|e| {
            let msg = self.scrub(&e.to_string());
            Refused::new(StatusCode::BAD_GATEWAY, "upstream_error", msg, GrantOutcome::Failed, "model-upstream")
        })?;
        let c = &exchange.completion;
        if let Some(u) = &c.usage {
            run.add_tokens(u.total_tokens);
        }
        witness(run, self.endpoint.key().as_deref(), c);
        Ok(self.scrub(&rebuilt(c, self.endpoint.model()).to_string()))
    }

    /// Streams the upstream's answer to the guest as it arrives (see the module docs); the
    /// relay task records the request when it ends, and stops when the guest hangs up.
    fn relay(&self, request: ChatRequest, deadline: Instant, run: ModelRun) -> Response<ProxyBody> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
        let endpoint = self.endpoint.clone();
        let model = endpoint.model().to_owned();
        let t0 = Instant::now();
        tokio::spawn(async move {
            let scrubber = std::sync::Mutex::new(Scrubber { key: endpoint.key(), pending: String::new() });
            let send = |v: Value| {
                let _ = tx.send(Bytes::from(format!("data: {v}\n\n")));
            };
            send(chunk(&model, json!({"role": "assistant", "content": ""}), None));
            let on_text = |piece: &str| {
                let out = scrubber.lock().map(|mut s| s.push(piece)).unwrap_or_default();
                if !out.is_empty() {
                    send(chunk(&model, json!({"content": out}), None));
                }
            };
            let result = tokio::select! {
                r = endpoint.complete_streamed(&request, deadline, None, 0, &on_text) => r,
                () = tx.closed() => return run.record(GrantOutcome::Failed, "model-guest-hung-up", (0, 0), t0.elapsed()),
            };
            let rest = scrubber.lock().map(|mut s| s.finish()).unwrap_or_default();
            if !rest.is_empty() {
                send(chunk(&model, json!({"content": rest}), None));
            }
            let outcome = match result {
                Ok(x) => {
                    let c = x.completion;
                    witness(&run, endpoint.key().as_deref(), &c);
                    for (i, call) in tool_calls(&c).into_iter().enumerate() {
                        // A tool call's name and arguments are the upstream's text too: an
                        // upstream that echoes the key into them must not hand it over.
                        let mut call = scrub_value(endpoint.key().as_deref(), call);
                        call["index"] = json!(i);
                        send(chunk(&model, json!({"tool_calls": [call]}), None));
                    }
                    send(chunk(&model, json!({}), Some(c.finish_reason.as_deref().unwrap_or("stop"))));
                    if let Some(u) = &c.usage {
                        run.add_tokens(u.total_tokens);
                        send(
                            json!({"id": "chatcmpl-stockade", "object": "chat.completion.chunk", "created": created(), "model": model, "choices": [], "usage": usage(&c)}),
                        );
                    }
                    (GrantOutcome::Ok, "model")
                }
                Err(e) => {
                    let msg = scrub(endpoint.key().as_deref(), &e.to_string());
                    send(json!({"error": {"message": msg, "type": "upstream_error"}}));
                    (GrantOutcome::Failed, "model-upstream")
                }
            };
            let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n"));
            run.record(outcome.0, outcome.1, (0, 0), t0.elapsed());
        });
        Response::builder()
            .status(StatusCode::OK)
            .header(CONTENT_TYPE, "text/event-stream")
            .body(ChannelBody(rx).boxed())
            .unwrap_or_else(|_| Response::new(whole(Bytes::new())))
    }
}

/// Why a request got no completion: the HTTP answer a socket request gets, and what the
/// run's report records.
struct Refused {
    status: StatusCode,
    kind: &'static str,
    message: String,
    outcome: GrantOutcome,
    rule: &'static str,
}

impl Refused {
    fn new(status: StatusCode, kind: &'static str, message: String, outcome: GrantOutcome, rule: &'static str) -> Self {
        Self { status, kind, message, outcome, rule }
    }

    fn handled(self) -> Handled {
        (error(self.status, self.kind, &self.message), Some((self.outcome, self.rule)))
    }
}

fn error(status: StatusCode, kind: &str, message: &str) -> Response<ProxyBody> {
    let body = json!({"error": {"message": message, "type": kind}});
    Response::builder()
        .status(status)
        .header(CONTENT_TYPE, "application/json")
        .body(whole(body.to_string()))
        .unwrap_or_else(|_| Response::new(whole(Bytes::new())))
}

fn ok_json(v: &Value) -> Response<ProxyBody> {
    Response::builder()
        .header(CONTENT_TYPE, "application/json")
        .body(whole(v.to_string()))
        .unwrap_or_else(|_| Response::new(whole(Bytes::new())))
}

/// One `chat.completion.chunk` event's payload.
fn chunk(model: &str, delta: Value, finish: Option<&str>) -> Value {
    json!({"id": "chatcmpl-stockade", "object": "chat.completion.chunk", "created": created(), "model": model,
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
}

/// Tells the run what it relays of `c` (its text and calls, as the guest receives them:
/// scrubbed of the key), for relayed provenance.
fn witness(run: &ModelRun, key: Option<&crate::secret::ApiKey>, c: &Completion) {
    let calls = tool_calls(c)
        .into_iter()
        .filter_map(|call| {
            let call = scrub_value(key, call);
            let name = call["function"]["name"].as_str()?.to_owned();
            let args = serde_json::from_str(call["function"]["arguments"].as_str()?).ok()?;
            Some((name, args))
        })
        .collect();
    let text = c.text.as_deref().map(|t| scrub(key, t));
    run.witness_response(text.as_deref(), calls);
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

impl ModelService for ModelProxy {
    /// A call to the grant `model` (the wasm tier's `model({...})`): the same checks as a
    /// socket request but the placeholder key (an in-process call carries none), no stream.
    fn complete(&self, request: Value, run: ModelRun) -> stockade_runtime::ModelCall {
        let proxy = self.clone();
        Box::pin(async move {
            let body = serde_json::to_vec(&request).map_err(|e| e.to_string())?;
            if body.len() > MAX_PROXY_BODY {
                return Err(format!("the request is over {MAX_PROXY_BODY} bytes"));
            }
            let (request, stream) = proxy.prepare(&body, &run).map_err(|r| format!("{}: {}", r.kind, r.message))?;
            if stream {
                return Err("invalid_request_error: a call answers once; stream is not available".to_owned());
            }
            let deadline = Instant::now() + proxy.request_timeout;
            let text = proxy.once(&request, deadline, &run).await.map_err(|r| format!("{}: {}", r.kind, r.message))?;
            serde_json::from_str(&text).map_err(|e| e.to_string())
        })
    }

    fn serve(
        &self,
        conn: stockade_runtime::ModelConn,
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
                    let (response, record) = proxy.handle(req, &run).await;
                    if let Some((outcome, rule)) = record {
                        let out = hyper::body::Body::size_hint(response.body()).exact().unwrap_or(0);
                        run.record(outcome, rule, (sent, out), t0.elapsed());
                    }
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
