//! A sandbox's ports (`get_host(port)`, and the code interpreter's `E2b-Sandbox-Port`): a
//! request routed by `E2b-Sandbox-Id` and `E2b-Sandbox-Port`, or by a host name
//! `PORT-ID.DOMAIN`, is forwarded to `127.0.0.1:PORT` on the sandbox's own loopback (a socket
//! made in its network namespace), over HTTP/1.1, streamed both ways.
//!
//! A port is never public: a request presents the sandbox's traffic token
//! (`E2B-Traffic-Access-Token`, which create and connect return and the SDKs send) or its
//! envd token (`X-Access-Token`), compared in constant time, and neither token, nor the API
//! key, nor the routing headers, reaches the guest's server. The response's head must come
//! within [`HEAD_WITHIN`]; its body then streams with the client's pace (hyper's
//! back-pressure: nothing is buffered here beyond a read). A paused sandbox answers as
//! not running, unless it resumes on traffic. WebSocket upgrades are not forwarded. A
//! sandbox made with `network.maskRequestHost` has each forwarded request's `Host` set to the
//! mask, `${PORT}` replaced by the port (E2B's default keeps the host the client used).

use hyper::header::{HeaderName, HeaderValue};
use stockade_runtime::protocol::RunError;

#[allow(clippy::wildcard_imports, reason = "the server's own items")]
use super::*;

/// envd's port: requests for it are envd's, served by this server.
pub(crate) const ENVD_PORT: u16 = 49983;

/// How long the guest's server has to answer with its response's head.
pub(crate) const HEAD_WITHIN: Duration = Duration::from_secs(120);

/// Headers that are this hop's, or credentials for this server: never forwarded.
const DROPPED: [&str; 12] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "te",
    "trailer",
    "upgrade",
    "x-access-token",
    "e2b-traffic-access-token",
    "x-api-key",
    "e2b-sandbox-id",
    "e2b-sandbox-port",
];

/// The sandbox and port a request is for, if it names one.
pub(crate) fn routed(req: &Request<hyper::body::Incoming>) -> Option<(String, u16)> {
    let h = req.headers();
    if let Some(port) = header(h, "e2b-sandbox-port") {
        let port = port.trim().parse::<u16>().ok()?;
        return Some((header(h, "e2b-sandbox-id")?.to_owned(), port));
    }
    let host = header(h, "host")?;
    let (label, _) = host.split_once('.')?;
    let (port, id) = label.split_once('-')?;
    let id_ok = stockade_runtime::session::is_session_id(id);
    let port = port.parse::<u16>().ok().filter(|_| id_ok)?;
    Some((id.to_owned(), port))
}

/// The SDKs' message for a running sandbox whose port has no listener (`SandboxUnreachable`).
fn port_not_open(id: &str, port: u16) -> Response<Body> {
    api_error(StatusCode::BAD_GATEWAY, &format!("the sandbox {id} is running but port is not open: {port}"))
}

impl E2bServer {
    /// Forwards one request to `port` of sandbox `id`.
    pub(crate) async fn port(&self, req: Request<hyper::body::Incoming>, id: &str, port: u16) -> Response<Body> {
        let Some(b) = self.sandbox(id) else { return not_running(id) };
        let h = req.headers();
        let traffic = header(h, "e2b-traffic-access-token").is_some_and(|t| constant_eq(t, &b.traffic));
        let envd = header(h, "x-access-token").is_some_and(|t| constant_eq(t, &b.token));
        if !traffic && !envd {
            return api_error(
                StatusCode::UNAUTHORIZED,
                "a request to a sandbox's port presents its traffic token (E2B-Traffic-Access-Token)",
            );
        }
        if !b.awake().await {
            return not_running(id);
        }
        let stream = match b.session.connect(port).await {
            Ok(s) => s,
            Err(RunError::Misconfigured(_)) => return port_not_open(id, port),
            Err(e) => return api_error(StatusCode::BAD_GATEWAY, &format!("sandbox {id}, port {port}: {e}")),
        };
        let host = b.mask_host.as_ref().map(|m| m.replace("${PORT}", &port.to_string()));
        match forward(stream, req, host).await {
            Ok(r) => r,
            Err(why) => api_error(StatusCode::BAD_GATEWAY, &format!("sandbox {id}, port {port}: {why}")),
        }
    }
}

/// Whether `mask` is a `Host` a request can carry once `${PORT}` is replaced: a name or
/// address, with a port if it likes, in the characters a host has.
pub(crate) fn check_mask(mask: &str) -> Result<(), &'static str> {
    let host = mask.replace("${PORT}", "1");
    let ok = !host.is_empty()
        && host.len() <= 253
        && host.bytes().all(|b| b.is_ascii_alphanumeric() || b"-.:[]_".contains(&b))
        && HeaderValue::from_str(&host).is_ok();
    if ok { Ok(()) } else { Err("not a host name (letters, digits, `-`, `.`, `:`, `[]` and `${PORT}`)") }
}

/// Sends `req` (its head cleaned, its target origin-form, its `Host` the mask if one is
/// given) over `stream`, and streams the answer back.
async fn forward(
    stream: std::net::TcpStream,
    req: Request<hyper::body::Incoming>,
    host: Option<String>,
) -> Result<Response<Body>, String> {
    use http_body_util::BodyExt as _;
    stream.set_nonblocking(true).map_err(|e| e.to_string())?;
    let tcp = tokio::net::TcpStream::from_std(stream).map_err(|e| e.to_string())?;
    let io = hyper_util::rt::TokioIo::new(tcp);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let (mut parts, body) = req.into_parts();
    let target = parts.uri.path_and_query().map_or("/", hyper::http::uri::PathAndQuery::as_str);
    parts.uri = target.parse().map_err(|e: hyper::http::uri::InvalidUri| e.to_string())?;
    for name in DROPPED {
        parts.headers.remove(HeaderName::from_static(name));
    }
    if let Some(host) = host {
        let value = HeaderValue::from_str(&host).map_err(|e| e.to_string())?;
        parts.headers.insert(hyper::header::HOST, value);
    }
    let sent = tokio::time::timeout(HEAD_WITHIN, sender.send_request(Request::from_parts(parts, body))).await;
    let resp = match sent {
        Err(_) => return Err(format!("no answer within {HEAD_WITHIN:?}")),
        Ok(Err(e)) => return Err(format!("the sandbox's server: {e}")),
        Ok(Ok(r)) => r,
    };
    let (mut parts, body) = resp.into_parts();
    for name in ["connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade"] {
        parts.headers.remove(HeaderName::from_static(name));
    }
    Ok(Response::from_parts(parts, body.map_err(std::io::Error::other).boxed()))
}
