//! HTTP replies and request bodies shared by the planes: JSON and error replies, bodies read
//! under a cap within a deadline, paged lists.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{CONTENT_TYPE, HeaderMap};
use hyper::{Request, Response, StatusCode};
use stockade_protocol::e2b::{self as wire, ConnectError};
use subtle::ConstantTimeEq;

#[allow(clippy::wildcard_imports, reason = "the server's own items")]
use super::*;

pub(crate) fn whole(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Full::new(body.into()).map_err(|never| match never {}).boxed());
    *r.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(CONTENT_TYPE, v);
    }
    r
}

pub(crate) fn json(status: StatusCode, v: &impl serde::Serialize) -> Response<Body> {
    whole(status, "application/json", serde_json::to_vec(v).unwrap_or_default())
}

/// A control-plane error, `{"code": N, "message": "..."}`.
pub(crate) fn api_error(status: StatusCode, message: &str) -> Response<Body> {
    json(status, &wire::api_error(status.as_u16(), message))
}

/// What E2B's proxy answers for a sandbox that is not running: 502, "... was not found"
/// (the SDKs raise `SandboxNotRunningException` on it, and `is_running()` is false).
pub(crate) fn not_running(id: &str) -> Response<Body> {
    api_error(StatusCode::BAD_GATEWAY, &format!("the sandbox {id:?} was not found"))
}

/// A unary Connect error: the code's HTTP status and its JSON.
pub(crate) fn rpc_error(e: &ConnectError) -> Response<Body> {
    let status = StatusCode::from_u16(e.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json(status, &e.to_json())
}

pub(crate) fn no_content() -> Response<Body> {
    whole(StatusCode::NO_CONTENT, "text/plain", Bytes::new())
}

pub(crate) fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

pub(crate) fn constant_eq(a: &str, b: &str) -> bool {
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

pub(crate) fn query(req: &Request<hyper::body::Incoming>) -> HashMap<String, String> {
    req.uri().query().map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect()).unwrap_or_default()
}

/// How long a request body (but an upload's) may take to arrive: a client that trickles one
/// is cut off.
pub(crate) const BODY_WITHIN: Duration = Duration::from_secs(30);

/// How long one `/files` transfer (an upload's body, or a streamed download) may take.
pub(crate) const TRANSFER_WITHIN: Duration = Duration::from_secs(600);

/// Reads a body of at most `max` bytes that arrives within `within`.
pub(crate) async fn read_body_within(
    body: hyper::body::Incoming,
    max: usize,
    within: Duration,
) -> Result<Bytes, String> {
    match tokio::time::timeout(within, Limited::new(body, max).collect()).await {
        Err(_) => Err(format!("the body did not arrive within {within:?}")),
        Ok(Ok(c)) => Ok(c.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            Err(format!("the body is over the {max}-byte limit"))
        }
        Ok(Err(e)) => Err(format!("reading the body: {e}")),
    }
}

/// Reads a body of at most `max` bytes that arrives within [`BODY_WITHIN`].
pub(crate) async fn read_body(body: hyper::body::Incoming, max: usize) -> Result<Bytes, String> {
    read_body_within(body, max, BODY_WITHIN).await
}

/// A list item's place in the order pages follow: its start, then its id.
pub(crate) fn page_key(t: SystemTime, id: &str) -> String {
    let nanos = t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{nanos:020}.{id}")
}

/// One page of `items` (each with its [`page_key`]): those after the request's `nextToken`,
/// at most its `limit` (1 to 100; 100 when absent), in order; when more follow, the last
/// one's key is the next page's token, in `x-next-token`, as E2B's API pages.
pub(crate) fn page<T: serde::Serialize>(q: &HashMap<String, String>, mut items: Vec<(String, T)>) -> Response<Body> {
    let limit = match q.get("limit").map(|l| (l, l.parse::<usize>())) {
        None => MAX_PAGE,
        Some((_, Ok(n))) if (1..=MAX_PAGE).contains(&n) => n,
        Some((l, _)) => return api_error(StatusCode::BAD_REQUEST, &format!("limit {l:?}: must be 1 to {MAX_PAGE}")),
    };
    items.sort_by(|a, b| a.0.cmp(&b.0));
    let after = q.get("nextToken");
    items.retain(|(k, _)| after.is_none_or(|a| k > a));
    let more = items.len() > limit;
    items.truncate(limit);
    let next = items.last().map(|(k, _)| k.clone()).filter(|_| more);
    let out: Vec<T> = items.into_iter().map(|(_, v)| v).collect();
    let mut r = json(StatusCode::OK, &out);
    if let Some(v) = next.and_then(|k| k.parse().ok()) {
        r.headers_mut().insert("x-next-token", v);
    }
    r
}

/// Most items one page of a list holds, and the default.
pub(crate) const MAX_PAGE: usize = 100;
