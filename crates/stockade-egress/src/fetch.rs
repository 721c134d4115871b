//! `fetch(url, init)` for guests without sockets (the wasm tier's JavaScript): one request,
//! made by the host as a client *of the run's own proxy*, over an in-memory stream. So a
//! fetch is decided, resolved, checked, bounded, given its secret and recorded exactly as a
//! socket guest's connection is (G1–G8): there is no second path to the network.

use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::http;
use crate::proxy::Egress;

/// Most bytes of a fetch's response (head and body) held for the guest.
pub const MAX_FETCH_RESPONSE: usize = 1 << 20;

/// Most bytes of a fetch's request body.
pub const MAX_FETCH_BODY: usize = 1 << 20;

/// Why a fetch failed: the guest sees it as a thrown error with this kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FetchError {
    /// The request is not one fetch can make (the URL, method, a header, the body).
    #[error("{0}")]
    BadRequest(String),
    /// The proxy refused it (the policy, the address check, a bound): its one line.
    #[error("{0}")]
    Refused(String),
    /// The connection or the upstream failed.
    #[error("{0}")]
    Failed(String),
}

struct Parsed {
    https: bool,
    authority: String,
    host: String,
    path: String,
    method: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

fn parse(args: &Value) -> Result<Parsed, FetchError> {
    let bad = |m: &str| FetchError::BadRequest(m.to_owned());
    let url = args.get("url").and_then(Value::as_str).ok_or_else(|| bad("fetch needs a url string"))?;
    let (https, rest) = match (url.strip_prefix("https://"), url.strip_prefix("http://")) {
        (Some(r), _) => (true, r),
        (None, Some(r)) => (false, r),
        _ => return Err(bad("fetch takes an http:// or https:// URL")),
    };
    let (authority, path) = match rest.find(['/', '?', '#']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let path = path.split('#').next().unwrap_or("/");
    let path = if path.starts_with('?') { format!("/{path}") } else { path.to_owned() };
    if authority.contains('@') {
        return Err(bad("a URL with credentials is not fetched"));
    }
    let (host, port) = http::authority_or(authority, if https { 443 } else { 80 })
        .ok_or_else(|| bad(&format!("the URL's host is not valid: {:?}", http::cut(authority))))?;
    if path.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err(bad("the URL's path holds spaces or control characters"));
    }
    let init = args.get("init").filter(|v| !v.is_null()).unwrap_or(&Value::Null);
    let method = init.get("method").and_then(Value::as_str).unwrap_or("GET").to_ascii_uppercase();
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_alphabetic()) || method == "CONNECT" {
        return Err(bad("the method is not one fetch sends"));
    }
    let mut headers = Vec::new();
    match init.get("headers") {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) => {
            for (k, v) in m {
                headers.push((k.clone(), v.as_str().map_or_else(|| v.to_string(), str::to_owned)));
            }
        }
        Some(Value::Array(pairs)) => {
            for p in pairs {
                match p.as_array().map(Vec::as_slice) {
                    Some([Value::String(k), Value::String(v)]) => headers.push((k.clone(), v.clone())),
                    _ => return Err(bad("headers as a list are [name, value] string pairs")),
                }
            }
        }
        Some(_) => return Err(bad("headers are an object or a list of [name, value] pairs")),
    }
    for (k, v) in &headers {
        let name_ok = !k.is_empty() && k.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if !name_ok || v.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f) {
            return Err(bad(&format!("the header {:?} is not one a request may carry", http::cut(k))));
        }
        // The framing and the connection are fetch's to set.
        if ["host", "content-length", "transfer-encoding", "connection", "upgrade"].contains(&&*k.to_ascii_lowercase())
        {
            return Err(bad(&format!("fetch sets {k} itself")));
        }
    }
    let body = match init.get("body") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => s.clone().into_bytes(),
        Some(_) => return Err(bad("the body is a string")),
    };
    if body.len() > MAX_FETCH_BODY {
        return Err(bad(&format!("the body is over {MAX_FETCH_BODY} bytes")));
    }
    let authority = if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") };
    Ok(Parsed { https, authority, host, path, method, headers, body })
}

impl Parsed {
    fn head(&self, target: &str) -> Vec<u8> {
        let mut h = format!("{} {target} HTTP/1.1\r\nHost: {}\r\n", self.method, self.authority);
        for (k, v) in &self.headers {
            h.push_str(&format!("{k}: {v}\r\n"));
        }
        if !self.body.is_empty() || !matches!(self.method.as_str(), "GET" | "HEAD") {
            h.push_str(&format!("Content-Length: {}\r\n", self.body.len()));
        }
        h.push_str("Connection: close\r\n\r\n");
        let mut out = h.into_bytes();
        out.extend_from_slice(&self.body);
        out
    }
}

impl Egress {
    /// Makes one request for a guest without sockets, through this run's proxy, and returns
    /// `{status, statusText, headers: [[name, value]...], body}` (`body_base64` for a body
    /// that is not UTF-8). `args` is `{url, init: {method, headers, body}}`.
    pub async fn fetch(&self, args: &Value) -> Result<Value, FetchError> {
        let req = parse(args)?;
        let (mut guest, proxy_end) = tokio::io::duplex(64 << 10);
        let egress = self.clone();
        tokio::spawn(async move { egress.serve(proxy_end).await });
        let answer = if req.https {
            guest
                .write_all(format!("CONNECT {0} HTTP/1.1\r\nHost: {0}\r\n\r\n", req.authority).as_bytes())
                .await
                .map_err(failed)?;
            let head = read_head(&mut guest).await?;
            if !head.starts_with(b"HTTP/1.1 200") {
                let mut rest = Vec::new();
                let _ = (&mut guest).take(4096).read_to_end(&mut rest).await;
                return Err(FetchError::Refused(proxy_reason(&[head, rest].concat())));
            }
            let name = rustls::pki_types::ServerName::try_from(req.host.clone())
                .map_err(|e| FetchError::BadRequest(format!("{}: {e}", req.host)))?;
            let config = self.fetch_tls().map_err(FetchError::Failed)?;
            let mut tls = tokio_rustls::TlsConnector::from(config)
                .connect(name, guest)
                .await
                .map_err(|e| FetchError::Failed(format!("TLS with {}: {e}", req.host)))?;
            tls.write_all(&req.head(&req.path)).await.map_err(failed)?;
            read_all(&mut tls).await?
        } else {
            guest.write_all(&req.head(&format!("http://{}{}", req.authority, req.path))).await.map_err(failed)?;
            let answer = read_all(&mut guest).await?;
            if is_proxy_refusal(&answer) {
                return Err(FetchError::Refused(proxy_reason(&answer)));
            }
            answer
        };
        response(&answer)
    }
}

fn failed(e: std::io::Error) -> FetchError {
    FetchError::Failed(e.to_string())
}

/// A response head, read byte by byte so nothing after it is consumed.
async fn read_head<S: AsyncRead + Unpin>(s: &mut S) -> Result<Vec<u8>, FetchError> {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 16 << 10 || s.read(&mut b).await.map_err(failed)? == 0 {
            return Err(FetchError::Failed("the proxy's answer ended early".into()));
        }
        head.push(b[0]);
    }
    Ok(head)
}

/// Everything until the far end closes (every response through the proxy closes), at
/// most [`MAX_FETCH_RESPONSE`] bytes.
async fn read_all<S: AsyncRead + Unpin>(s: &mut S) -> Result<Vec<u8>, FetchError> {
    let mut out = Vec::new();
    let cap = MAX_FETCH_RESPONSE as u64 + 1;
    // A TLS peer that closes without close_notify is an error to rustls; what was read stands.
    let _ = s.take(cap).read_to_end(&mut out).await;
    if out.len() > MAX_FETCH_RESPONSE {
        return Err(FetchError::Failed(format!("the response is over {MAX_FETCH_RESPONSE} bytes")));
    }
    if out.is_empty() {
        return Err(FetchError::Failed("the connection closed without a response".into()));
    }
    Ok(out)
}

fn is_proxy_refusal(answer: &[u8]) -> bool {
    let Some(end) = http::head_end(answer) else { return false };
    let head = String::from_utf8_lossy(&answer[..end]).to_ascii_lowercase();
    !head.starts_with("http/1.1 2") && head.contains(&format!("\r\nproxy-status: {}\r\n", http::PROXY_STATUS))
}

/// The one line of a proxy's own reply (its body, `stockade: ...`).
fn proxy_reason(answer: &[u8]) -> String {
    let body = http::head_end(answer).map_or(answer, |end| &answer[end..]);
    let text = String::from_utf8_lossy(body);
    text.trim().trim_start_matches("stockade: ").to_owned()
}

/// The guest's view of a response: status, headers, and the body, de-chunked.
pub(crate) fn response(answer: &[u8]) -> Result<Value, FetchError> {
    let end = http::head_end(answer).ok_or_else(|| FetchError::Failed("the response head is malformed".into()))?;
    let mut headers = [httparse::EMPTY_HEADER; 100];
    let mut res = httparse::Response::new(&mut headers);
    if !matches!(res.parse(&answer[..end]), Ok(httparse::Status::Complete(_))) {
        return Err(FetchError::Failed("the response head is malformed".into()));
    }
    let pairs: Vec<(String, String)> = res
        .headers
        .iter()
        .map(|h| (h.name.to_ascii_lowercase(), String::from_utf8_lossy(h.value).into_owned()))
        .collect();
    let chunked = pairs.iter().any(|(k, v)| k == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked"));
    let raw = &answer[end..];
    let body = if chunked { dechunk(raw)? } else { raw.to_vec() };
    let mut out = json!({
        "status": res.code.unwrap_or(0),
        "statusText": res.reason.unwrap_or(""),
        "headers": pairs.iter().filter(|(k, _)| k != "transfer-encoding").map(|(k, v)| json!([k, v])).collect::<Vec<_>>(),
    });
    match String::from_utf8(body) {
        Ok(text) => out["body"] = json!(text),
        Err(e) => {
            out["body_base64"] = json!(base64::Engine::encode(&base64::engine::general_purpose::STANDARD, e.as_bytes()))
        }
    }
    Ok(out)
}

fn dechunk(mut raw: &[u8]) -> Result<Vec<u8>, FetchError> {
    let bad = || FetchError::Failed("the response's chunked body is malformed".into());
    let mut out = Vec::new();
    loop {
        let line_end = raw.windows(2).position(|w| w == b"\r\n").ok_or_else(bad)?;
        let size = http::chunk_size(&raw[..line_end]).ok_or_else(bad)?;
        raw = &raw[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        // The upstream chooses the size: checked, never trusted to index with.
        let size = usize::try_from(size).map_err(|_| bad())?;
        let end = size.checked_add(2).ok_or_else(bad)?;
        if raw.get(size..end) != Some(&b"\r\n"[..]) {
            return Err(bad());
        }
        out.extend_from_slice(&raw[..size]);
        raw = &raw[end..];
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use super::dechunk;

    #[test]
    fn a_chunked_body_is_read_strictly_and_a_huge_size_is_an_error_not_a_panic() {
        assert_eq!(dechunk(b"5\r\nhello\r\n1;x=y\r\n!\r\n0\r\n\r\n").unwrap(), b"hello!");
        for bad in [
            &b"ffffffffffffffff\r\nabc\r\n0\r\n\r\n"[..],
            b"fffffffffffffffe\r\nabc",
            b"10000000000000000\r\n",
            b"5\r\nhello0\r\n\r\n",
            b" 5\r\nhello\r\n0\r\n\r\n",
            b"+5\r\nhello\r\n0\r\n\r\n",
            b"0x5\r\nhello\r\n0\r\n\r\n",
            b"5 ;x\r\nhello\r\n0\r\n\r\n",
            b"5\r\nhel",
        ] {
            assert!(dechunk(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
