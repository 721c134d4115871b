//! The client of an OpenAI-compatible `POST {base_url}/chat/completions`.
//!
//! hyper 1 with hyper-util's pooling client (the same crates and features bollard already
//! brings, so no new crate): nothing implicit, so no redirect is followed and no proxy is
//! read from the environment. The response body is read through `http_body_util::Limited`, so
//! a body over the cap is refused before it is buffered whole, let alone parsed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HeaderMap, RETRY_AFTER};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::json;
use stockade_protocol::chat::{ChatError, ChatRequest, StreamOptions};
use stockade_protocol::completion::{
    Completion, CompletionError, StreamAssembler, StreamError, cut, decode_completion,
};

use crate::secret::ApiKey;
use crate::trace::Trace;

/// Default response cap: 4 MiB (a completion is a few KiB; a server that sends more is broken
/// or hostile).
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 4 << 20;

/// Default connect timeout: 5 s.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Default per-request timeout: 120 s (a small local model on two cores takes seconds).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// Default idle timeout of a streamed answer (no byte for this long ends it): 60 s, separate
/// from the request's deadline.
pub const DEFAULT_STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Default number of retries after the first attempt: 3.
pub const DEFAULT_RETRIES: u32 = 3;

/// The connector: TCP, and TLS over it with the `tls` feature.
#[cfg(feature = "tls")]
type Connector = hyper_rustls::HttpsConnector<HttpConnector>;
#[cfg(not(feature = "tls"))]
type Connector = HttpConnector;

/// First backoff: 200 ms, doubling up to [`MAX_BACKOFF`], each with full jitter.
const BACKOFF_BASE: Duration = Duration::from_millis(200);
/// Largest backoff between attempts: 8 s.
const MAX_BACKOFF: Duration = Duration::from_secs(8);

/// The endpoint could not answer a request.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EndpointError {
    /// The base URL or a setting is wrong.
    #[error("misconfigured endpoint: {0}")]
    Misconfigured(String),
    /// This build cannot speak what the URL asks for.
    #[error("unsupported endpoint ({mechanism}): {reason}")]
    #[non_exhaustive]
    Unsupported {
        /// The mechanism.
        mechanism: &'static str,
        /// Why.
        reason: String,
    },
    /// The request failed protocol's chat validator; it was not sent.
    #[error("the request was not sent: {0}")]
    Invalid(#[from] ChatError),
    /// No connection after every retry.
    #[error("the endpoint is unreachable after {attempts} attempts: {last}")]
    #[non_exhaustive]
    Unreachable {
        /// Attempts made.
        attempts: u32,
        /// The last error.
        last: String,
    },
    /// A 5xx after every retry.
    #[error("the endpoint answered {status} after {attempts} attempts: {excerpt}")]
    #[non_exhaustive]
    Server {
        /// The status.
        status: u16,
        /// Attempts made.
        attempts: u32,
        /// The start of the body (escaped, at most 256 bytes).
        excerpt: String,
    },
    /// 429 with no usable `Retry-After` inside the deadline, or retries spent.
    #[error("the endpoint is rate-limiting (429){}", retry_after.map(|d| format!("; it asked to retry after {d:?}")).unwrap_or_default())]
    #[non_exhaustive]
    RateLimited {
        /// What `Retry-After` said.
        retry_after: Option<Duration>,
    },
    /// 401 or 403.
    #[error("the endpoint refused the credentials ({status}); check the API key's variable")]
    #[non_exhaustive]
    Auth {
        /// The status.
        status: u16,
    },
    /// Another non-success status (a redirect is one: it is not followed).
    #[error("the endpoint answered {status}: {excerpt}")]
    #[non_exhaustive]
    Rejected {
        /// The status.
        status: u16,
        /// The start of the body (escaped, at most 256 bytes).
        excerpt: String,
    },
    /// The body was larger than the cap; it was not parsed.
    #[error("the response body is larger than {max} bytes; it was not read")]
    #[non_exhaustive]
    TooLarge {
        /// The cap.
        max: usize,
    },
    /// The request, or the run, ran out of time.
    #[error("no response within {after:?}")]
    #[non_exhaustive]
    Timeout {
        /// The time allowed.
        after: Duration,
    },
    /// The body is not a usable completion.
    #[error("the response is not a usable completion: {0}")]
    Decode(#[from] CompletionError),
    /// A streamed answer is not a usable completion (never retried: it had begun).
    #[error("the streamed response is not a usable completion: {0}")]
    Stream(#[from] StreamError),
    /// A streamed answer stopped arriving for longer than the idle timeout, or broke off.
    #[error("the streamed response stalled or broke off: {reason}")]
    #[non_exhaustive]
    Broken {
        /// What happened.
        reason: String,
    },
}

impl EndpointError {
    /// Whether another attempt may help.
    fn retryable(&self) -> bool {
        matches!(self, Self::Unreachable { .. } | Self::Server { .. })
    }
}

/// One answered request.
#[derive(Debug)]
#[non_exhaustive]
pub struct Exchange {
    /// The decoded completion.
    pub completion: Completion,
    /// The HTTP status.
    pub status: u16,
    /// Attempts it took.
    pub attempts: u32,
    /// Body bytes read.
    pub bytes: usize,
}

/// An OpenAI-compatible endpoint: one origin, one model, an optional key.
#[derive(Clone)]
pub struct Endpoint {
    base_url: String,
    completions: Uri,
    model: String,
    key: Option<Arc<ApiKey>>,
    connect_timeout: Duration,
    request_timeout: Duration,
    max_response_bytes: usize,
    retries: u32,
    stream_idle_timeout: Duration,
    extra_roots: Vec<Vec<u8>>,
    client: Client<Connector, Full<Bytes>>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("key", &self.key.as_ref().map(|_| "[redacted]"))
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("max_response_bytes", &self.max_response_bytes)
            .field("retries", &self.retries)
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    /// An endpoint at `base_url` (e.g. `http://127.0.0.1:8080/v1`) serving `model`, with no key,
    /// the default timeouts ([`DEFAULT_CONNECT_TIMEOUT`], [`DEFAULT_REQUEST_TIMEOUT`]), cap
    /// ([`DEFAULT_MAX_RESPONSE_BYTES`]) and retries ([`DEFAULT_RETRIES`]).
    ///
    /// `https` needs the `tls` feature (rustls with ring; the server's certificate is checked
    /// against the OS trust store and any roots added with `Endpoint::with_root_pem`); without
    /// it, it is [`EndpointError::Unsupported`], naming TLS. Credentials, a query or a fragment
    /// in the URL are refused.
    pub fn new(base_url: &str, model: impl Into<String>) -> Result<Self, EndpointError> {
        let uri: Uri =
            base_url.parse().map_err(|e| EndpointError::Misconfigured(format!("base URL {base_url:?}: {e}")))?;
        let scheme = match uri.scheme_str() {
            Some("http") => "http",
            Some("https") if cfg!(feature = "tls") => "https",
            Some("https") => {
                return Err(EndpointError::Unsupported {
                    mechanism: "tls",
                    reason: format!(
                        "{base_url} needs TLS, which this build of stockade does not include (the `tls` feature); use an http endpoint on loopback"
                    ),
                });
            }
            _ => {
                return Err(EndpointError::Misconfigured(format!(
                    "base URL {base_url:?} must start with http:// or https://"
                )));
            }
        };
        let authority = uri
            .authority()
            .ok_or_else(|| EndpointError::Misconfigured(format!("base URL {base_url:?} has no host")))?;
        if authority.as_str().contains('@') {
            return Err(EndpointError::Misconfigured(
                "the base URL must not carry credentials; name the key's variable instead".into(),
            ));
        }
        if uri.query().is_some() || base_url.contains('#') {
            return Err(EndpointError::Misconfigured(format!(
                "base URL {base_url:?} must not have a query or fragment"
            )));
        }
        let path = uri.path().trim_end_matches('/');
        let completions: Uri = format!("{scheme}://{authority}{path}/chat/completions")
            .parse()
            .map_err(|e| EndpointError::Misconfigured(format!("base URL {base_url:?}: {e}")))?;
        let model = model.into();
        if model.is_empty() || model.len() > 256 {
            return Err(EndpointError::Misconfigured("the model name must be 1 to 256 bytes".into()));
        }
        let mut endpoint = Self {
            base_url: base_url.trim_end_matches('/').to_owned(),
            completions,
            model,
            key: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            retries: DEFAULT_RETRIES,
            stream_idle_timeout: DEFAULT_STREAM_IDLE_TIMEOUT,
            extra_roots: Vec::new(),
            client: Client::builder(TokioExecutor::new()).build(connector(DEFAULT_CONNECT_TIMEOUT, &[])?),
        };
        endpoint.rebuild_client()?;
        Ok(endpoint)
    }

    fn rebuild_client(&mut self) -> Result<(), EndpointError> {
        let connector = connector(self.connect_timeout, &self.extra_roots)?;
        self.client = Client::builder(TokioExecutor::new()).pool_max_idle_per_host(4).build(connector);
        Ok(())
    }

    /// Also trusts the certificates in `pem` (a private CA, a self-hosted server) for https.
    #[cfg(feature = "tls")]
    pub fn with_root_pem(mut self, pem: &[u8]) -> Result<Self, EndpointError> {
        self.extra_roots.push(pem.to_vec());
        self.rebuild_client()?;
        Ok(self)
    }

    /// Sends `key` as `Authorization: Bearer` to this endpoint (and nowhere else).
    #[must_use]
    pub fn with_key(mut self, key: ApiKey) -> Self {
        self.key = Some(Arc::new(key));
        self
    }

    /// The connect timeout.
    #[must_use]
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        // The roots were read once already; a rebuild with the same roots cannot fail anew.
        if self.rebuild_client().is_err() {
            self.connect_timeout = DEFAULT_CONNECT_TIMEOUT;
        }
        self
    }

    /// The per-request timeout (each attempt; the run's deadline bounds them all).
    #[must_use]
    pub fn request_timeout(mut self, d: Duration) -> Self {
        self.request_timeout = d;
        self
    }

    /// The response body cap.
    #[must_use]
    pub fn max_response_bytes(mut self, n: usize) -> Self {
        self.max_response_bytes = n;
        self
    }

    /// Retries after the first attempt (connection errors and 5xx).
    #[must_use]
    pub fn retries(mut self, n: u32) -> Self {
        self.retries = n;
        self
    }

    /// How long a streamed answer may go without a byte.
    #[must_use]
    pub fn stream_idle_timeout(mut self, d: Duration) -> Self {
        self.stream_idle_timeout = d;
        self
    }

    /// The model name.
    #[must_use]
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The base URL.
    #[must_use]
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    pub(crate) fn key(&self) -> Option<Arc<ApiKey>> {
        self.key.clone()
    }

    /// Validates `request`, sends it, and decodes the answer, retrying where that is safe, all
    /// before `deadline`.
    pub async fn complete(
        &self,
        request: &ChatRequest,
        deadline: Instant,
        trace: Option<&Trace>,
        turn: u32,
    ) -> Result<Exchange, EndpointError> {
        self.exchange(request, deadline, trace, turn, None).await
    }

    /// Like [`Endpoint::complete`], but asks for a streamed answer and hands each piece of text
    /// to `on_text` as it arrives. Retries happen only before the answer begins; the stream
    /// ends with an error when no byte arrives for the idle timeout.
    pub async fn complete_streamed(
        &self,
        request: &ChatRequest,
        deadline: Instant,
        trace: Option<&Trace>,
        turn: u32,
        on_text: &(dyn Fn(&str) + Send + Sync),
    ) -> Result<Exchange, EndpointError> {
        let mut request = request.clone();
        request.stream = Some(true);
        request.stream_options = Some(StreamOptions::with_usage());
        self.exchange(&request, deadline, trace, turn, Some(on_text)).await
    }

    async fn exchange(
        &self,
        request: &ChatRequest,
        deadline: Instant,
        trace: Option<&Trace>,
        turn: u32,
        on_text: Option<&(dyn Fn(&str) + Send + Sync)>,
    ) -> Result<Exchange, EndpointError> {
        request.validate()?;
        let body = Bytes::from(serde_json::to_vec(request).map_err(|e| EndpointError::Misconfigured(e.to_string()))?);
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let now = Instant::now();
            let remaining = deadline.saturating_duration_since(now);
            if remaining.is_zero() {
                return Err(EndpointError::Timeout { after: self.request_timeout });
            }
            let allowed = remaining.min(self.request_timeout);
            if let Some(t) = trace {
                let sent: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                t.event(
                    "request",
                    json!({"turn": turn, "url": self.completions.to_string(), "attempt": attempt, "body": sent}),
                );
            }
            let started = Instant::now();
            let result = match tokio::time::timeout(allowed, self.send(body.clone())).await {
                Err(_) => Err(EndpointError::Timeout { after: allowed }),
                Ok(r) => r,
            };
            let result = match (result, on_text) {
                (Ok(response), Some(sink)) if response.status().is_success() => {
                    // The answer has begun: from here on nothing is retried.
                    let completion = self.read_stream(response.into_body(), deadline, sink).await;
                    if let Some(t) = trace {
                        t.event("response", json!({"turn": turn, "status": 200, "ms": started.elapsed().as_millis() as u64, "streamed": true,
                                                   "error": completion.as_ref().err().map(ToString::to_string)}));
                    }
                    return completion.map(|completion| Exchange {
                        completion,
                        status: 200,
                        attempts: attempt,
                        bytes: 0,
                    });
                }
                (Ok(response), _) => match tokio::time::timeout(allowed, self.collect(response)).await {
                    Err(_) => Err(EndpointError::Timeout { after: allowed }),
                    Ok(r) => r,
                },
                (Err(e), _) => Err(e),
            };
            let (status, headers, bytes) = match result {
                Ok(ok) => ok,
                Err(e) if e.retryable() && attempt <= self.retries => {
                    self.backoff(attempt, deadline).await;
                    continue;
                }
                Err(EndpointError::Unreachable { last, .. }) => {
                    return Err(EndpointError::Unreachable { attempts: attempt, last });
                }
                Err(e) => return Err(e),
            };
            if let Some(t) = trace {
                t.event(
                    "response",
                    json!({"turn": turn, "status": status.as_u16(), "bytes": bytes.len(), "ms": started.elapsed().as_millis() as u64,
                           "body": cut(&String::from_utf8_lossy(&bytes), 64 << 10)}),
                );
            }
            if status.is_success() {
                let completion = decode_completion(&bytes)?;
                return Ok(Exchange { completion, status: status.as_u16(), attempts: attempt, bytes: bytes.len() });
            }
            // Scrubbed whole before it is cut: a key that the cut would split would otherwise
            // leave its first bytes in the excerpt, where exact matching cannot find them.
            let excerpt = match &self.key {
                Some(key) => excerpt(key.scrub(&String::from_utf8_lossy(&bytes)).as_bytes()),
                None => excerpt(&bytes),
            };
            let code = status.as_u16();
            match status {
                StatusCode::TOO_MANY_REQUESTS => {
                    let retry_after = retry_after(&headers);
                    match retry_after {
                        Some(wait) if attempt <= self.retries && Instant::now() + wait < deadline => {
                            tokio::time::sleep(wait).await;
                        }
                        _ => return Err(EndpointError::RateLimited { retry_after }),
                    }
                }
                StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => return Err(EndpointError::Auth { status: code }),
                s if s.is_server_error() => {
                    if attempt > self.retries {
                        return Err(EndpointError::Server { status: code, attempts: attempt, excerpt });
                    }
                    self.backoff(attempt, deadline).await;
                }
                _ => return Err(EndpointError::Rejected { status: code, excerpt }),
            }
        }
    }

    /// Sends one attempt.
    async fn send(&self, body: Bytes) -> Result<hyper::Response<hyper::body::Incoming>, EndpointError> {
        let mut builder = Request::builder()
            .method(Method::POST)
            .uri(self.completions.clone())
            .header(CONTENT_TYPE, "application/json")
            .header("accept", "application/json");
        if let Some(value) = self.key.as_ref().and_then(|k| k.bearer()) {
            builder = builder.header(AUTHORIZATION, value);
        }
        let request = builder.body(Full::new(body)).map_err(|e| EndpointError::Misconfigured(e.to_string()))?;
        self.client.request(request).await.map_err(|e| EndpointError::Unreachable { attempts: 1, last: describe(&e) })
    }

    /// Reads a whole body, at most the cap.
    async fn collect(
        &self,
        response: hyper::Response<hyper::body::Incoming>,
    ) -> Result<(StatusCode, HeaderMap, Bytes), EndpointError> {
        let (parts, incoming) = response.into_parts();
        if let Some(len) =
            parts.headers.get(hyper::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            && len > self.max_response_bytes as u64
        {
            return Err(EndpointError::TooLarge { max: self.max_response_bytes });
        }
        let collected = Limited::new(incoming, self.max_response_bytes).collect().await.map_err(|e| {
            if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() {
                EndpointError::TooLarge { max: self.max_response_bytes }
            } else {
                EndpointError::Unreachable { attempts: 1, last: format!("reading the response: {e}") }
            }
        })?;
        Ok((parts.status, parts.headers, collected.to_bytes()))
    }

    /// Reads a streamed answer: each frame within the idle timeout (and the run's deadline),
    /// at most the cap in all, assembled as it arrives.
    async fn read_stream(
        &self,
        mut body: hyper::body::Incoming,
        deadline: Instant,
        on_text: &(dyn Fn(&str) + Send + Sync),
    ) -> Result<Completion, EndpointError> {
        let mut assembler = StreamAssembler::new();
        let mut total = 0usize;
        loop {
            let until = (Instant::now() + self.stream_idle_timeout).min(deadline);
            let frame = match tokio::time::timeout_at(until.into(), body.frame()).await {
                Err(_) => {
                    return Err(EndpointError::Broken {
                        reason: format!(
                            "no data for {:?}",
                            self.stream_idle_timeout.min(deadline.saturating_duration_since(Instant::now()))
                        ),
                    });
                }
                Ok(None) => break,
                Ok(Some(Err(e))) => return Err(EndpointError::Broken { reason: e.to_string() }),
                Ok(Some(Ok(frame))) => frame,
            };
            let Ok(data) = frame.into_data() else { continue };
            total = total.saturating_add(data.len());
            if total > self.max_response_bytes {
                return Err(EndpointError::TooLarge { max: self.max_response_bytes });
            }
            for piece in assembler.push(&data)? {
                on_text(&piece);
            }
            if assembler.is_done() {
                break;
            }
        }
        Ok(assembler.finish()?)
    }

    async fn backoff(&self, attempt: u32, deadline: Instant) {
        let exp = BACKOFF_BASE.saturating_mul(1u32 << attempt.saturating_sub(1).min(16)).min(MAX_BACKOFF);
        // Full jitter: a uniform wait in [0, exp].
        let frac = getrandom::u64().unwrap_or(u64::MAX / 2) as f64 / u64::MAX as f64;
        let wait = exp.mul_f64(frac);
        let until = (Instant::now() + wait).min(deadline);
        tokio::time::sleep_until(until.into()).await;
    }
}

/// TCP with the connect timeout; with the `tls` feature, TLS for https (rustls, ring, the OS
/// trust store plus `extra_roots`, HTTP/1.1 only; http stays plain).
fn connector(connect_timeout: Duration, extra_roots: &[Vec<u8>]) -> Result<Connector, EndpointError> {
    let mut http = HttpConnector::new();
    http.set_connect_timeout(Some(connect_timeout));
    http.set_nodelay(true);
    #[cfg(feature = "tls")]
    {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        http.enforce_http(false);
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_native_certs::load_native_certs().certs {
            // A certificate the store cannot use is skipped, as the OS's own clients do.
            let _ = roots.add(cert);
        }
        for pem in extra_roots {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| EndpointError::Misconfigured(format!("a root certificate: {e}")))?;
                roots.add(cert).map_err(|e| EndpointError::Misconfigured(format!("a root certificate: {e}")))?;
            }
        }
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| EndpointError::Misconfigured(format!("tls: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(config)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http))
    }
    #[cfg(not(feature = "tls"))]
    {
        let _ = extra_roots;
        Ok(http)
    }
}

fn describe(e: &hyper_util::client::legacy::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

fn excerpt(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(256)]);
    text.chars().flat_map(|c| if c.is_control() { c.escape_default().collect::<Vec<_>>() } else { vec![c] }).collect()
}

/// `Retry-After` in seconds (the HTTP-date form is not honoured: it needs a clock we do not trust).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let secs: u64 = headers.get(RETRY_AFTER)?.to_str().ok()?.trim().parse().ok()?;
    Some(Duration::from_secs(secs.min(3600)))
}
