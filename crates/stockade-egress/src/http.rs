//! HTTP/1.1 request heads as a forward proxy reads them (G1, G5), and the response head it
//! passes back.

/// Most headers a head may carry.
const MAX_HEADERS: usize = 100;

/// Headers that belong to one hop and are not forwarded (RFC 9110 §7.6.1), plus the proxy's own.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
];

/// Whether the header `name` (lower case) is the proxy's own: one a request is decided or
/// framed by (`Host`, its length or coding), a hop-by-hop one, any `Proxy-` one, or
/// `Accept-Encoding`, which a secret host's request must keep as the proxy sets it.
/// Nothing from outside the proxy (a secret) may set one.
pub(crate) fn proxy_owned(name: &str) -> bool {
    HOP_BY_HOP.contains(&name)
        || name.starts_with("proxy-")
        || matches!(name, "host" | "content-length" | "transfer-encoding" | "accept-encoding")
}

/// How a request's body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Body {
    /// No body, or exactly this many bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// What a request asks the proxy for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Request {
    /// `CONNECT host:port`.
    Connect { host: String, port: u16 },
    /// A request in absolute form: `head` is what goes upstream (origin form, the
    /// hop-by-hop headers gone, `Connection: close` added). `tls`: the URL is `https://`,
    /// and the proxy speaks TLS to the upstream itself (busybox wget asks this way).
    Forward { method: String, host: String, port: u16, path: String, head: Vec<u8>, body: Body, tls: bool },
}

/// Why a request is refused: the status to answer with, and the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) status: u16,
    pub(crate) reason: String,
}

fn refuse<T>(status: u16, reason: impl Into<String>) -> Result<T, Refusal> {
    Err(Refusal { status, reason: reason.into() })
}

/// The end of the head in `buf` (the index just past `\r\n\r\n`), if it is there.
pub(crate) fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// Reads the request head `head` (up to and including its blank line).
pub(crate) fn parse_request(head: &[u8]) -> Result<Request, Refusal> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    parse_head(&mut req, head)?;
    // HTTP/1.0 too: urllib3 (pip, requests) sends its CONNECT as 1.0.
    let (Some(method), Some(target), Some(0 | 1)) = (req.method, req.path, req.version) else {
        return refuse(505, "only HTTP/1.0 and HTTP/1.1 are served");
    };
    if method == "CONNECT" {
        let (host, port) = authority(target).ok_or_else(|| Refusal {
            status: 400,
            reason: format!("CONNECT needs host:port, not {:?}", cut(target)),
        })?;
        return Ok(Request::Connect { host, port });
    }
    let (tls, rest) = match (target.strip_prefix("http://"), target.strip_prefix("https://")) {
        (Some(rest), _) => (false, rest),
        (None, Some(rest)) => (true, rest),
        _ => return refuse(400, format!("a proxy request names an http:// or https:// URL, not {:?}", cut(target))),
    };
    let default = if tls { 443 } else { 80 };
    let (auth, path) = match rest.find(['/', '?']) {
        Some(i) if rest.as_bytes()[i] == b'/' => (&rest[..i], &rest[i..]),
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if auth.contains('@') {
        return refuse(400, "a URL with credentials is not forwarded");
    }
    let path = if path.starts_with('?') { format!("/{path}") } else { path.to_owned() };
    if path.contains('#') {
        return refuse(400, "a request target has no fragment");
    }
    let (host, port) = authority_or(auth, default)
        .ok_or_else(|| Refusal { status: 400, reason: format!("the URL's host is not valid: {:?}", cut(auth)) })?;
    let path = normalize_path(&path)?;
    let (head, body) = rebuild(method, &path, &req, (&host, port, default), None)?;
    Ok(Request::Forward { method: method.to_owned(), host, port, path, head, body, tls })
}

/// Parses a complete request head into `req`, or the refusal.
fn parse_head<'h, 'b>(req: &mut httparse::Request<'h, 'b>, head: &'b [u8]) -> Result<(), Refusal> {
    match req.parse(head) {
        Ok(httparse::Status::Complete(_)) => Ok(()),
        Ok(httparse::Status::Partial) => refuse(400, "the request head is incomplete"),
        Err(httparse::Error::TooManyHeaders) => refuse(431, "the request has over 100 headers"),
        Err(e) => refuse(400, format!("the request head is malformed: {e}")),
    }
}

/// A secret's header: with a placeholder, its value's placeholder is replaced, in that
/// header only, with the real value (a `--net-secret`); without one, the header is set to
/// the value, and whatever the guest sent in it is dropped (a header secret).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Inject<'a> {
    /// The header's name, in lower case.
    pub(crate) header: &'a str,
    /// What the guest holds, if it holds anything.
    pub(crate) placeholder: Option<&'a [u8]>,
    /// What the upstream gets instead.
    pub(crate) value: &'a [u8],
}

/// One origin-form request read inside a tunnel the proxy terminates for `host:port`
/// (a `--net-secret` host): the head that goes upstream, with `inject` done, and its body's
/// framing. The same checks as a forwarded request: one `Host`, equal to the tunnel's host;
/// unambiguous framing; no upgrade.
pub(crate) fn parse_origin(
    head: &[u8],
    host: &str,
    port: u16,
    inject: &[Inject<'_>],
) -> Result<(Vec<u8>, Body), Refusal> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    parse_head(&mut req, head)?;
    let (Some(method), Some(path), Some(0 | 1)) = (req.method, req.path, req.version) else {
        return refuse(505, "only HTTP/1.0 and HTTP/1.1 are served");
    };
    if method == "CONNECT" || !path.starts_with('/') {
        return refuse(400, format!("inside the tunnel a request names a path, not {:?}", cut(path)));
    }
    // A secret host is a closed door: no method that reflects the request (TRACE) or
    // opens another channel; the value would come back in the answer.
    if !SECRET_METHODS.contains(&method) {
        return refuse(405, format!("{} to a secret host: only {} are sent", cut(method), SECRET_METHODS.join(", ")));
    }
    let path = normalize_path(path)?;
    rebuild(method, &path, &req, (host, port, 443), Some(inject))
}

/// A request target's path in the one form the policy decides on and the upstream is sent
/// (G1), its query kept as sent: percent-escapes of unreserved characters decoded, other
/// escapes (and any non-ASCII byte) in upper-case hex, then dot segments removed as RFC 3986
/// §5.2.4 does, never above the root. What servers read in more than one way is refused: an
/// escape of `/`, `\` or NUL, a raw `\`, a malformed escape, or a dot segment with path
/// parameters (`..;`, which some servers strip to `..`).
pub(crate) fn normalize_path(target: &str) -> Result<String, Refusal> {
    let (path, query) = target.find('?').map_or((target, ""), |i| target.split_at(i));
    if !path.starts_with('/') {
        return refuse(400, format!("a request's path starts with `/`, not {:?}", cut(path)));
    }
    if path.contains('\\') {
        return refuse(400, "a path with `\\` is refused: servers read it as `/` or as a character");
    }
    let bytes = path.as_bytes();
    let mut decoded = String::with_capacity(path.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b != b'%' {
            if b.is_ascii() {
                decoded.push(char::from(b));
            } else {
                decoded.push_str(&format!("%{b:02X}"));
            }
            i += 1;
            continue;
        }
        let escaped = bytes.get(i + 1..i + 3).filter(|h| h.iter().all(u8::is_ascii_hexdigit));
        let Some(v) = escaped.and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok()) else {
            return refuse(400, "a malformed percent-escape in the path");
        };
        match v {
            b'/' | b'\\' | 0 => {
                return refuse(400, "a path that encodes `/`, `\\` or NUL is refused: servers read it differently");
            }
            c if c.is_ascii_alphanumeric() || b"-._~".contains(&c) => decoded.push(char::from(c)),
            c => decoded.push_str(&format!("%{c:02X}")),
        }
        i += 3;
    }
    let segments: Vec<&str> = decoded[1..].split('/').collect();
    let last = segments.len() - 1;
    let mut out: Vec<&str> = Vec::with_capacity(segments.len());
    for (k, seg) in segments.iter().enumerate() {
        let bare = seg.split(';').next().unwrap_or("");
        if (bare == "." || bare == "..") && bare != *seg {
            return refuse(400, "a dot segment with path parameters (`..;`) is refused: servers read it differently");
        }
        if bare == "." || bare == ".." {
            if bare == ".." {
                out.pop();
            }
            if k == last {
                out.push("");
            }
        } else {
            out.push(seg);
        }
    }
    Ok(format!("/{}{query}", out.join("/")))
}

/// The methods a request to a secret host may use (G8).
pub(crate) const SECRET_METHODS: [&str; 6] = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"];

/// The checks every request the proxy sends on makes, and its head as it goes upstream:
/// exactly one `Host`, equal to `host:port` (`default` when the header names no port);
/// unambiguous framing; no upgrade; the hop-by-hop headers gone and `Connection: close`.
fn rebuild(
    method: &str,
    path: &str,
    req: &httparse::Request<'_, '_>,
    (host, port, default): (&str, u16, u16),
    inject: Option<&[Inject<'_>]>,
) -> Result<(Vec<u8>, Body), Refusal> {
    let value = |name: &str| -> Vec<&[u8]> {
        req.headers.iter().filter(|h| h.name.eq_ignore_ascii_case(name)).map(|h| h.value).collect()
    };
    // The Host header must be the target (RFC 9112 §3.2.2 lets a proxy replace it; refusing
    // a mismatch instead keeps what the upstream sees equal to what was decided).
    let hosts = value("host");
    let [given] = hosts.as_slice() else {
        return refuse(400, "a request needs exactly one Host header");
    };
    let given = std::str::from_utf8(given).unwrap_or("").to_ascii_lowercase();
    if authority_or(&given, default) != Some((host.to_owned(), port)) {
        return refuse(400, format!("the Host header {:?} is not the request's target {host}:{port}", cut(&given)));
    }
    let body = framing(&value("content-length"), &value("transfer-encoding"))?;
    if !value("upgrade").is_empty() {
        return refuse(400, "a forwarded request cannot upgrade the connection");
    }
    // Headers the Connection header names are hop-by-hop too.
    let named: Vec<String> = value("connection")
        .iter()
        .flat_map(|v| std::str::from_utf8(v).unwrap_or("").split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .collect();
    // What the request was decided and framed by is end to end: dropping it as hop-by-hop
    // would send no Host (the upstream's default site) or a body without its framing (read
    // upstream as a second request).
    if let Some(n) = named.iter().find(|n| matches!(n.as_str(), "host" | "content-length" | "transfer-encoding")) {
        return refuse(400, format!("the Connection header names {n}, which the request is decided or framed by"));
    }
    // Nor may it drop a header a secret puts in.
    if let Some(n) = named.iter().find(|n| inject.is_some_and(|i| i.iter().any(|i| i.header == n.as_str()))) {
        return refuse(400, format!("the Connection header names {n}, which the proxy sets for this host"));
    }
    let dropped = |name: &str| HOP_BY_HOP.contains(&name) || named.iter().any(|n| n == name);
    let head = match inject {
        None => closing_head(&format!("{method} {path} HTTP/1.1"), req.headers, dropped),
        Some(inject) => {
            let secret = |name: &str| inject.iter().find(|i| name.eq_ignore_ascii_case(i.header));
            // A header secret's header is the proxy's alone: the guest's is dropped.
            let kept = req.headers.iter().filter(|h| secret(h.name).is_none_or(|i| i.placeholder.is_some()));
            let replaced: Vec<(&str, Vec<u8>)> = kept
                .map(|h| match secret(h.name).and_then(|i| Some((i.placeholder?, i.value))) {
                    Some((placeholder, value)) => (h.name, replace_all(h.value, placeholder, value)),
                    None => (h.name, h.value.to_vec()),
                })
                .collect();
            let mut headers: Vec<httparse::Header<'_>> =
                replaced.iter().map(|(name, v)| httparse::Header { name, value: v }).collect();
            for i in inject.iter().filter(|i| i.placeholder.is_none()) {
                headers.push(httparse::Header { name: i.header, value: i.value });
            }
            // The answer is scrubbed of the value (G8), which a compressed body would hide.
            headers.retain(|h| !h.name.eq_ignore_ascii_case("accept-encoding"));
            headers.push(httparse::Header { name: "Accept-Encoding", value: b"identity" });
            closing_head(&format!("{method} {path} HTTP/1.1"), &headers, dropped)
        }
    };
    Ok((head, body))
}

/// `haystack` with every `needle` replaced by `with`.
fn replace_all(haystack: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(haystack.len() + with.len());
    let mut i = 0;
    while i < haystack.len() {
        if !needle.is_empty() && haystack[i..].starts_with(needle) {
            out.extend_from_slice(with);
            i += needle.len();
        } else {
            out.push(haystack[i]);
            i += 1;
        }
    }
    out
}

/// The body framing of a request, or the refusal of an ambiguous one (G5).
fn framing(lengths: &[&[u8]], encodings: &[&[u8]]) -> Result<Body, Refusal> {
    match (lengths, encodings) {
        ([], []) => Ok(Body::Length(0)),
        ([], [te]) if te.eq_ignore_ascii_case(b"chunked") => Ok(Body::Chunked),
        ([], _) => refuse(501, "the only transfer coding forwarded is a single `chunked`"),
        (_, []) => {
            let mut n = None;
            for v in lengths {
                let Some(len) = std::str::from_utf8(v)
                    .ok()
                    .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|s| s.parse::<u64>().ok())
                else {
                    return refuse(400, "a Content-Length is not a number");
                };
                if n.is_some_and(|n| n != len) {
                    return refuse(400, "two Content-Lengths differ");
                }
                n = Some(len);
            }
            Ok(Body::Length(n.unwrap_or(0)))
        }
        _ => refuse(400, "a request with both Content-Length and Transfer-Encoding is refused (request smuggling)"),
    }
}

/// The size a chunk-size line (without its CRLF) announces, read strictly (G5): 1 to 16
/// hex digits, then nothing or chunk extensions (`;` and visible ASCII only). No space,
/// sign or `0x` is read past, so no reader downstream can see another size in the same
/// line; the proxy forwards only the canonical `{size:x}` and drops the extensions.
pub(crate) fn chunk_size(line: &[u8]) -> Option<u64> {
    let end = line.iter().position(|b| !b.is_ascii_hexdigit()).unwrap_or(line.len());
    let (digits, ext) = line.split_at(end);
    if digits.is_empty() || digits.len() > 16 {
        return None;
    }
    if !ext.is_empty() && (ext[0] != b';' || !ext.iter().all(|b| (0x21..=0x7e).contains(b))) {
        return None;
    }
    u64::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()
}

/// Trailer fields a chunked body may not carry (RFC 9110 §6.5.1): framing, routing,
/// authentication and connection control belong to the head, where they were decided.
const NO_TRAILER: [&str; 12] = [
    "authorization",
    "cache-control",
    "connection",
    "content-encoding",
    "content-length",
    "content-range",
    "content-type",
    "host",
    "proxy-authorization",
    "set-cookie",
    "te",
    "transfer-encoding",
];

/// One trailer field line (without its CRLF) in its canonical form, `name: value`, or
/// `None` for a malformed one or a field the head alone may carry ([`NO_TRAILER`]).
pub(crate) fn trailer_field(line: &[u8]) -> Option<Vec<u8>> {
    let colon = line.iter().position(|b| *b == b':')?;
    let (name, value) = (&line[..colon], &line[colon + 1..]);
    let token = |b: &u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(b);
    if name.is_empty() || !name.iter().all(token) {
        return None;
    }
    let value = value.trim_ascii();
    if value.iter().any(|b| (*b < 0x20 && *b != b'\t') || *b == 0x7f) {
        return None;
    }
    let lower = String::from_utf8_lossy(name).to_ascii_lowercase();
    if NO_TRAILER.contains(&lower.as_str()) {
        return None;
    }
    Some([name, b": ", value].concat())
}

/// [`authority`] of `s`, with port `default` when it names none (an URL's or a `Host`
/// header's form).
pub(crate) fn authority_or(s: &str, default: u16) -> Option<(String, u16)> {
    let bracketed = s.starts_with('[');
    if bracketed && !s.contains("]:") || !bracketed && !s.contains(':') {
        authority(&format!("{s}:{default}"))
    } else {
        authority(s)
    }
}

/// `host:port` (an IPv6 host in brackets) as a lower-case host without brackets and a port.
pub(crate) fn authority(s: &str) -> Option<(String, u16)> {
    let (host, port) = match s.strip_prefix('[') {
        Some(rest) => {
            let (h, p) = rest.split_once("]:")?;
            h.parse::<std::net::Ipv6Addr>().ok()?;
            (h, p)
        }
        None => s.rsplit_once(':')?,
    };
    if !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let port = port.parse::<u16>().ok().filter(|p| *p != 0)?;
    // An address is decided on, and connected to, in its one canonical form.
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return Some((crate::addr::canonical(ip).to_string(), port));
    }
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let ok = !host.is_empty()
        && host.len() <= 253
        && host.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_');
    ok.then_some((host, port))
}

/// The response head `head` with its hop-by-hop headers gone and `Connection: close`.
pub(crate) fn rewrite_response(head: &[u8]) -> Option<Vec<u8>> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut res = httparse::Response::new(&mut headers);
    if !matches!(res.parse(head), Ok(httparse::Status::Complete(_))) {
        return None;
    }
    // A status outside 100..=599 is invalid (RFC 9110 §15); `000` would be re-sent as `0`,
    // which a client reads another way, or not at all.
    let (code, reason) = (res.code.filter(|c| (100..=599).contains(c))?, res.reason.unwrap_or(""));
    Some(closing_head(&format!("HTTP/1.1 {code} {reason}"), res.headers, |name| {
        matches!(name, "connection" | "keep-alive" | "proxy-connection")
    }))
}

/// A head of `first` line and `headers` but those `dropped` names (given in lower case),
/// ending with `Connection: close`.
fn closing_head(first: &str, headers: &[httparse::Header<'_>], dropped: impl Fn(&str) -> bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(first.len() + headers.len() * 32 + 24);
    out.extend_from_slice(first.as_bytes());
    out.extend_from_slice(b"\r\n");
    for h in headers {
        if dropped(&h.name.to_ascii_lowercase()) {
            continue;
        }
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out
}

/// Whether a response head declares a content coding other than `identity` (a body that
/// cannot be scrubbed as it passes).
pub(crate) fn response_encoded(head: &[u8]) -> bool {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut res = httparse::Response::new(&mut headers);
    if !matches!(res.parse(head), Ok(httparse::Status::Complete(_))) {
        return true;
    }
    res.headers.iter().any(|h| {
        h.name.eq_ignore_ascii_case("content-encoding")
            && !h.value.split(|b| *b == b',').all(|v| v.trim_ascii().eq_ignore_ascii_case(b"identity"))
    })
}

/// The `Proxy-Status` (RFC 9209) the proxy's own error replies carry, so a client can tell
/// them from an upstream's.
pub(crate) const PROXY_STATUS: &str = "stockade";

/// A reply the proxy writes itself.
pub(crate) fn reply(status: u16, reason: &str) -> Vec<u8> {
    let phrase = match status {
        200 => "Connection established",
        400 => "Bad Request",
        403 => "Forbidden",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => "Error",
    };
    if status == 200 {
        return b"HTTP/1.1 200 Connection established\r\n\r\n".to_vec();
    }
    let body = format!("stockade: {reason}\n");
    format!(
        "HTTP/1.1 {status} {phrase}\r\nProxy-Status: {PROXY_STATUS}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// At most 80 characters of guest text, for a message.
pub(crate) fn cut(s: &str) -> String {
    s.chars().take(80).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use super::{Body, Request, authority, chunk_size, normalize_path, parse_request, trailer_field};

    /// Found by the fuzz target `proxy_relay`: an upstream's status `000` was relayed as
    /// `HTTP/1.1 0 OK`, a head no strict reader parses; an invalid status is a bad response.
    #[test]
    fn a_response_status_outside_100_to_599_is_not_relayed() {
        for bad in ["000", "099", "600", "999"] {
            let head = format!("HTTP/1.1 {bad} OK\r\nContent-Length: 0\r\n\r\n");
            assert_eq!(super::rewrite_response(head.as_bytes()), None, "{bad}");
        }
        let ok = super::rewrite_response(b"HTTP/1.1 204 No Content\r\nKeep-Alive: 5\r\n\r\n").unwrap();
        assert_eq!(ok, b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n");
    }

    /// Found by the fuzz target `proxy_request`: a `Connection` header that names `Host`
    /// dropped the decided host from what went upstream, and one that names
    /// `Content-Length` dropped the body's framing, so the upstream read the body as a
    /// second request.
    #[test]
    fn a_connection_header_cannot_drop_the_host_or_the_framing() {
        for named in ["host", "Content-Length", "transfer-encoding", "keep-alive, HOST"] {
            let head = format!(
                "POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5\r\nConnection: {named}\r\n\r\n"
            );
            let r = parse_request(head.as_bytes());
            assert!(matches!(&r, Err(e) if e.status == 400), "{named}: {r:?}");
        }
        let ok = "GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nConnection: keep-alive, x-drop\r\nX-Drop: 1\r\n\r\n";
        let Ok(Request::Forward { head, .. }) = parse_request(ok.as_bytes()) else { panic!() };
        assert_eq!(head, b"GET / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n");
    }

    #[test]
    fn a_path_is_decided_and_sent_in_one_normal_form_or_refused() {
        for (given, sent) in [
            ("/pub/%2e%2e/secret.txt", "/secret.txt"),
            ("/pub/%2E%2e/%2e/x", "/x"),
            ("/pub/../../../etc", "/etc"),
            ("/a/./b/.", "/a/b/"),
            ("/a/b/..", "/a/"),
            ("/..", "/"),
            ("/", "/"),
            ("/a//b", "/a//b"),
            ("/%7euser/%41%20b", "/~user/A%20b"),
            ("/a%3fb?x=../y&z=%2F", "/a%3Fb?x=../y&z=%2F"),
            ("/caf\u{e9}", "/caf%C3%A9"),
        ] {
            assert_eq!(normalize_path(given).map_err(|r| r.reason), Ok(sent.to_owned()), "{given}");
        }
        for bad in
            ["/pub%2f..%2fsecret", "/a%5c..", "/a\\b", "/a%00", "/a%zz", "/a%4", "/pub/..;/secret", "/.;x/a", "x"]
        {
            let r = normalize_path(bad).unwrap_err();
            assert_eq!(r.status, 400, "{bad}");
        }
    }

    #[test]
    fn chunk_sizes_and_trailers_are_read_strictly() {
        assert_eq!(chunk_size(b"1a"), Some(26));
        assert_eq!(chunk_size(b"0"), Some(0));
        assert_eq!(chunk_size(b"5;name=value"), Some(5));
        assert_eq!(chunk_size(b"ffffffffffffffff"), Some(u64::MAX));
        for bad in [&b""[..], b" 5", b"5 ", b"+5", b"0x5", b"5 ;x", b"5\t", b"10000000000000000", b"-1", b"5;a b"] {
            assert_eq!(chunk_size(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
        assert_eq!(trailer_field(b"X-Checksum:  abc ").as_deref(), Some(&b"X-Checksum: abc"[..]));
        for bad in [
            &b"Host: other"[..],
            b"Content-Length: 5",
            b"Transfer-Encoding: chunked",
            b"no colon",
            b"Bad Name: x",
            b": x",
        ] {
            assert_eq!(trailer_field(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    fn forward(head: &str) -> Request {
        parse_request(head.as_bytes()).unwrap()
    }

    #[test]
    fn connect_and_absolute_requests_parse_and_are_rewritten_for_the_upstream() {
        assert_eq!(
            forward("CONNECT PyPI.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n"),
            Request::Connect { host: "pypi.org".into(), port: 443 }
        );
        assert_eq!(
            forward("CONNECT [2001:db8::1]:8443 HTTP/1.1\r\n\r\n"),
            Request::Connect { host: "2001:db8::1".into(), port: 8443 }
        );
        let Request::Forward { method, host, port, path, head, body, .. } = forward(
            "POST http://a.test:8080/x?y=1 HTTP/1.1\r\nHost: a.test:8080\r\nProxy-Connection: keep-alive\r\nConnection: X-Secret\r\nX-Secret: 1\r\nContent-Length: 3\r\n\r\n",
        ) else {
            panic!()
        };
        assert_eq!(
            (method.as_str(), host.as_str(), port, path.as_str(), body),
            ("POST", "a.test", 8080, "/x?y=1", Body::Length(3))
        );
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "POST /x?y=1 HTTP/1.1\r\nHost: a.test:8080\r\nContent-Length: 3\r\nConnection: close\r\n\r\n"
        );
        let Request::Forward { port, path, .. } = forward("GET http://a.test HTTP/1.1\r\nHost: a.test\r\n\r\n") else {
            panic!()
        };
        assert_eq!((port, path.as_str()), (80, "/"));
    }

    #[test]
    fn ambiguous_or_mismatched_requests_are_refused() {
        for (head, status) in [
            ("GET http://a.test/ HTTP/1.1\r\nHost: b.test\r\n\r\n", 400),
            ("GET http://a.test/ HTTP/1.1\r\nHost: a.test:81\r\n\r\n", 400),
            ("GET http://a.test/ HTTP/1.1\r\n\r\n", 400),
            ("GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nHost: a.test\r\n\r\n", 400),
            (
                "POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n",
                400,
            ),
            ("POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\n", 400),
            ("POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\nContent-Length: +4\r\n\r\n", 400),
            ("POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501),
            (
                "POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
                501,
            ),
            ("GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nUpgrade: websocket\r\n\r\n", 400),
            ("GET http://user@a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n", 400),
            ("GET /origin-form HTTP/1.1\r\nHost: a.test\r\n\r\n", 400),
            ("GET ftp://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n", 400),
            ("GET https://a.test/ HTTP/1.1\r\nHost: a.test:80\r\n\r\n", 400),
            ("GET http://a.test/ HTTP/2.0\r\nHost: a.test\r\n\r\n", 400),
            ("CONNECT a.test HTTP/1.1\r\n\r\n", 400),
            ("CONNECT a.test:0 HTTP/1.1\r\n\r\n", 400),
            ("GET http://a.test/ HTTP/1.1\r\nHost : a.test\r\n\r\n", 400),
        ] {
            let r = parse_request(head.as_bytes()).unwrap_err();
            assert_eq!(r.status, status, "{head:?}: {}", r.reason);
        }
    }

    #[test]
    fn authorities_are_names_or_addresses_with_a_port() {
        assert_eq!(authority("Example.ORG.:443"), Some(("example.org".into(), 443)));
        assert_eq!(authority("[::1]:80"), Some(("::1".into(), 80)));
        for bad in ["a.test", ":443", "a b:1", "a.test:65536", "[zz]:1", "evil/x:80"] {
            assert_eq!(authority(bad), None, "{bad}");
        }
    }

    /// A header secret (E2B's `transform` rules): the upstream gets the proxy's value in
    /// that header whatever the guest sent in it (one header, once), beside a placeholder
    /// secret of the same host replaced in its own header only.
    #[test]
    fn a_header_secret_replaces_what_the_guest_sent_in_its_header() {
        let inject = [
            super::Inject { header: "x-token", placeholder: None, value: b"real-token" },
            super::Inject { header: "authorization", placeholder: Some(b"ph-1"), value: b"real-auth" },
        ];
        let head = b"GET /a HTTP/1.1\r\nHost: api.test\r\nX-Token: guest-made\r\nx-token: again\r\n\
            Authorization: Bearer ph-1\r\nX-Other: ph-1\r\n\r\n";
        let (up, _) = super::parse_origin(head, "api.test", 443, &inject).unwrap();
        let up = String::from_utf8(up).unwrap();
        assert!(!up.contains("guest-made") && !up.contains("again"), "{up}");
        assert_eq!(up.matches("real-token").count(), 1, "{up}");
        assert!(up.contains("\r\nx-token: real-token\r\n"), "{up}");
        assert!(up.contains("Authorization: Bearer real-auth\r\n") && up.contains("X-Other: ph-1\r\n"), "{up}");
        // The guest cannot have it dropped as hop-by-hop.
        let named = b"GET / HTTP/1.1\r\nHost: api.test\r\nConnection: X-Token\r\n\r\n";
        let r = super::parse_origin(named, "api.test", 443, &inject).unwrap_err();
        assert!(r.status == 400 && r.reason.contains("x-token"), "{}", r.reason);
        // Without a header of its own in the request, it is still set.
        let (up, _) =
            super::parse_origin(b"GET / HTTP/1.1\r\nHost: api.test\r\n\r\n", "api.test", 443, &inject).unwrap();
        assert!(String::from_utf8(up).unwrap().contains("x-token: real-token"));
    }
}
