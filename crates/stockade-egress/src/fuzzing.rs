//! The proxy's readers as the fuzz targets drive them (`fuzz/fuzz_targets/proxy_request.rs`,
//! `proxy_relay.rs`, `fetch_response.rs`), each with the properties it must keep, checked
//! here so that the unit tests run the same checks on the seed corpus. Not an API: hidden,
//! and compiled only for tests and with the `fuzzing` feature.
//!
//! The properties are the crate's rule, "what the policy decided on is what goes on the
//! wire", made checkable on one input:
//! - a request the proxy forwards leaves as exactly one request that a strict reader
//!   (httparse, and a canonical chunked decoder written here apart from the proxy's) reads
//!   with the decided method, host and path, the path already canonical, and nothing after
//!   its body;
//! - every byte that goes up is charged (`bytes_up` equals the bytes sent);
//! - a secret's value never comes back through the scrubber, wherever the pieces split it;
//! - no reader panics on any input.

#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    clippy::panic,
    reason = "a property check fails by panicking, which is how libFuzzer learns of it"
)]

use std::sync::Arc;

use tokio::io::AsyncWriteExt;

use crate::http::{self, Body, Request};
use crate::proxy::{Egress, Prefixed};
use crate::{NetGrant, NetLimits, NetPolicy};

/// What the proxy would send upstream for one plain-HTTP request.
#[derive(Debug)]
pub struct Forwarded {
    pub method: String,
    pub host: String,
    pub port: u16,
    pub path: String,
    /// The URL is `https://`.
    pub tls: bool,
    /// The head and body as they would go upstream.
    pub sent: Vec<u8>,
    /// The bytes charged to the connection going up.
    pub charged: u64,
    /// Why the body was cut, if it was.
    pub cut: Option<&'static str>,
}

/// The largest head (and trailer section) the fuzzed proxy reads.
const HEAD: usize = 4096;

fn egress() -> Egress {
    let limits = NetLimits { max_head_bytes: HEAD, ..NetLimits::default() };
    NetGrant::new(NetPolicy::allow(&[]).expect("an empty allow list")).limits(limits).start()
}

thread_local! {
    static RT: Arc<tokio::runtime::Runtime> = Arc::new(
        tokio::runtime::Builder::new_current_thread().enable_time().build().expect("a current-thread runtime"),
    );
}

/// Reads `client` (a guest's bytes on a fresh connection) as the proxy reads a plain-HTTP
/// request: its head, then its body by its framing, into what would go upstream. `Ok(None)`:
/// a CONNECT or SOCKS request, which carries no request upstream; `Err`: the refusal.
pub fn request_up(client: &[u8]) -> Result<Option<Forwarded>, String> {
    let end = http::head_end(&client[..client.len().min(HEAD)]).ok_or("no complete head")?;
    let (method, host, port, path, head, body, tls) = match http::parse_request(&client[..end]).map_err(|r| r.reason)? {
        Request::Connect { .. } => return Ok(None),
        Request::Forward { method, host, port, path, head, body, tls } => (method, host, port, path, head, body, tls),
    };
    let egress = egress();
    let mut sent = Vec::new();
    let (charged, cut) = RT.with(|rt| {
        rt.block_on(async {
            let mut from = Prefixed::new(client[end..].to_vec(), tokio::io::empty());
            egress.body_up(&head, body, &mut from, &mut sent).await
        })
    });
    Ok(Some(Forwarded { method, host, port, path, tls, sent, charged, cut }))
}

/// Panics unless [`request_up`] of `client` keeps the properties of the module header.
pub fn check_request(client: &[u8]) {
    let Ok(Some(f)) = request_up(client) else { return };
    assert_eq!(f.charged, f.sent.len() as u64, "every byte sent up is charged");
    let mut headers = [httparse::EMPTY_HEADER; 128];
    let mut req = httparse::Request::new(&mut headers);
    let Ok(httparse::Status::Complete(n)) = req.parse(&f.sent) else {
        panic!("the head sent up does not parse: {:?}", String::from_utf8_lossy(&f.sent));
    };
    assert_eq!(req.method, Some(f.method.as_str()), "the method decided is the method sent");
    assert_eq!(req.path, Some(f.path.as_str()), "the path decided is the path sent");
    assert_eq!(http::normalize_path(&f.path).ok().as_deref(), Some(f.path.as_str()), "the path is canonical");
    let named = |name: &str| req.headers.iter().filter(|h| h.name.eq_ignore_ascii_case(name)).count();
    let hosts: Vec<_> = req.headers.iter().filter(|h| h.name.eq_ignore_ascii_case("host")).collect();
    assert_eq!(hosts.len(), 1, "one Host");
    let given = std::str::from_utf8(hosts[0].value).expect("a Host in ASCII").to_ascii_lowercase();
    let read = http::authority_or(&given, if f.tls { 443 } else { 80 });
    assert!(read.is_some_and(|(h, p)| h == f.host && p == f.port), "the Host sent is the host decided: {given}");
    for hop in ["upgrade", "te", "trailer", "keep-alive", "proxy-connection", "proxy-authorization"] {
        assert_eq!(named(hop), 0, "no {hop} goes up");
    }
    let chunked = req.headers.iter().any(|h| h.name.eq_ignore_ascii_case("transfer-encoding"));
    assert!(!(chunked && named("content-length") > 0), "one framing");
    check_secret_head(&f.sent[..n], &f.host, f.port);
    let body = &f.sent[n..];
    if chunked {
        match canonical_chunked(body) {
            Ok(()) => assert!(f.cut.is_none(), "a whole body was cut: {:?}", f.cut),
            Err(Short) => assert!(f.cut.is_some(), "an unfinished body was not cut"),
        }
    } else {
        let len =
            req.headers.iter().find(|h| h.name.eq_ignore_ascii_case("content-length")).map_or(0, |h| {
                std::str::from_utf8(h.value).ok().and_then(|v| v.parse::<usize>().ok()).expect("a length")
            });
        assert!(body.len() <= len, "nothing follows a body: {} bytes after {len}", body.len() - len);
        assert_eq!(body.len() == len, f.cut.is_none(), "a body is cut exactly when it is short");
    }
}

/// Panics unless `head` (an origin-form request head the proxy would send), read inside a
/// secret host's tunnel with a header secret and a placeholder secret, goes up with the
/// header secret's value exactly once, in its own header, and the placeholder replaced.
fn check_secret_head(head: &[u8], host: &str, port: u16) {
    const VALUE: &[u8] = b"fuzz-real-value";
    let inject = [
        http::Inject { header: "x-token", placeholder: None, value: VALUE },
        http::Inject { header: "authorization", placeholder: Some(b"fuzz-placeholder"), value: b"fuzz-real-auth" },
    ];
    let Ok((up, _)) = http::parse_origin(head, host, port, &inject) else { return };
    let mut headers = [httparse::EMPTY_HEADER; 130];
    let mut req = httparse::Request::new(&mut headers);
    assert!(matches!(req.parse(&up), Ok(httparse::Status::Complete(_))), "the secret head does not parse");
    let tokens: Vec<&[u8]> =
        req.headers.iter().filter(|h| h.name.eq_ignore_ascii_case("x-token")).map(|h| h.value).collect();
    assert_eq!(tokens, [VALUE], "a header secret goes up once, as the proxy's value");
    let auth = req.headers.iter().filter(|h| h.name.eq_ignore_ascii_case("authorization"));
    assert!(
        auth.clone().all(|h| !h.value.windows(16).any(|w| w == b"fuzz-placeholder")),
        "the placeholder was replaced"
    );
}

/// A chunked body that is not yet whole (its bytes so far are all canonical).
#[derive(Debug)]
pub struct Short;

/// Reads `body` as the canonical chunked form the proxy sends, apart from the proxy's own
/// reader: sizes in lower-case hex with no leading zero and no extension, each chunk's CRLF,
/// trailer fields as `name: value`, the empty line, and nothing after it. Panics on a byte
/// out of that form; `Err(Short)` if the body stops early.
pub fn canonical_chunked(mut body: &[u8]) -> Result<(), Short> {
    loop {
        let line_end = body.windows(2).position(|w| w == b"\r\n").ok_or(Short)?;
        let line = &body[..line_end];
        assert!(
            !line.is_empty()
                && line.iter().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
                && (line == b"0" || line[0] != b'0'),
            "a size line that is not canonical: {:?}",
            String::from_utf8_lossy(line)
        );
        let size = usize::from_str_radix(std::str::from_utf8(line).expect("hex"), 16).expect("a size that fits");
        body = &body[line_end + 2..];
        if size == 0 {
            break;
        }
        let data_end = size.checked_add(2).expect("no overflow");
        if body.len() < data_end {
            assert!(body.len() <= size || body[size] == b'\r', "a chunk's data runs past its size");
            return Err(Short);
        }
        assert_eq!(&body[size..data_end], b"\r\n", "a chunk ends in CRLF");
        body = &body[data_end..];
    }
    // The trailer section: fields, then the empty line, then nothing.
    loop {
        let line_end = body.windows(2).position(|w| w == b"\r\n").ok_or(Short)?;
        let line = &body[..line_end];
        body = &body[line_end + 2..];
        if line.is_empty() {
            assert!(body.is_empty(), "{} bytes follow the body", body.len());
            return Ok(());
        }
        assert_eq!(http::trailer_field(line).as_deref(), Some(line), "a trailer field that is not canonical");
    }
}

/// Panics if the scrubber of `secret` lets it through `data` cut into pieces at `cuts`
/// (offsets, taken modulo the length), or changes the length.
pub fn check_scrub(secret: &[u8], data: &[u8], cuts: &[u8]) {
    if secret.is_empty() {
        return;
    }
    let mut s = crate::secret::Scrub::new(vec![secret]);
    let mut at = 0;
    let mut out = Vec::new();
    for c in cuts {
        let next = (at + usize::from(*c)).min(data.len());
        out.extend(s.feed(&data[at..next]));
        at = next;
    }
    out.extend(s.feed(&data[at..]));
    out.extend(s.finish());
    assert_eq!(out.len(), data.len(), "the scrubber keeps the length");
    assert!(!out.windows(secret.len()).any(|w| w == secret), "the secret came through");
}

/// Panics if a response head the proxy rewrites does not read back as one closing head, or
/// a record watch fed `data` in two pieces reads it differently from whole.
pub fn check_relay(data: &[u8], cut: usize) {
    if let Some(end) = http::head_end(data)
        && let Some(head) = http::rewrite_response(&data[..end])
    {
        let mut headers = [httparse::EMPTY_HEADER; 128];
        let mut res = httparse::Response::new(&mut headers);
        assert!(matches!(res.parse(&head), Ok(httparse::Status::Complete(n)) if n == head.len()), "one head");
        let close = res.headers.iter().filter(|h| h.name.eq_ignore_ascii_case("connection")).count();
        assert_eq!(close, 1, "one Connection: close");
        let _ = http::response_encoded(&head);
    }
    for server in [false, true] {
        let mut whole = crate::tls::RecordWatch::new(server);
        let mut split = crate::tls::RecordWatch::new(server);
        let cut = cut.min(data.len());
        let a = whole.feed(data);
        let b = split.feed(&data[..cut]).and_then(|()| split.feed(&data[cut..]));
        assert_eq!(a, b, "the record watch reads the same bytes the same way however they arrive");
        assert_eq!(whole.done(), split.done());
    }
    let _ = crate::tls::client_hello(data);
}

/// `fetch`'s reading of an upstream's answer; must never panic.
pub fn check_fetch(answer: &[u8]) {
    if let Ok(v) = crate::fetch::response(answer)
        && let Some(body) = v["body"].as_str()
    {
        assert!(body.len() <= answer.len(), "a body longer than the answer");
    }
}

impl Egress {
    /// Writes `head`, then copies one body framed as `body` from `from`, to `to` as the
    /// relay sends it upstream; the bytes charged going up and the cut, if any.
    pub(crate) async fn body_up<C: tokio::io::AsyncRead + Unpin, U: tokio::io::AsyncWrite + Unpin>(
        &self,
        head: &[u8],
        body: Body,
        from: &mut C,
        to: &mut U,
    ) -> (u64, Option<&'static str>) {
        let mut conn = self.conn();
        let mut cut = self.send_up(&mut conn, to, head).await.err();
        if cut.is_none() {
            cut = self.send_body(&mut conn, from, to, body).await.err();
        }
        let _ = to.flush().await;
        (conn.bytes_up(), cut)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every seed of the three targets, and the findings' own inputs, keep the properties.
    #[test]
    fn the_seed_corpus_keeps_every_property() {
        let seeds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds");
        let mut n = 0;
        for (target, check) in [
            ("proxy_request", check_request as fn(&[u8])),
            ("proxy_relay", |d: &[u8]| check_relay(d, d.len() / 2)),
            ("fetch_response", check_fetch),
        ] {
            for entry in std::fs::read_dir(seeds.join(target)).expect("the seeds") {
                check(&std::fs::read(entry.expect("a seed").path()).expect("a seed"));
                n += 1;
            }
        }
        assert!(n >= 12, "{n} seeds");
    }

    #[test]
    fn a_forwarded_body_is_canonical_charged_and_alone() {
        let post = |body: &str| {
            format!("POST http://h.test/p/./q HTTP/1.1\r\nHost: h.test\r\nTransfer-Encoding: chunked\r\n\r\n{body}")
        };
        let f = request_up(post("0005;x=1\r\nhello\r\n0\r\nX-A:  b \r\n\r\nGET /second HTTP/1.1\r\n\r\n").as_bytes())
            .unwrap()
            .unwrap();
        assert_eq!(f.path, "/p/q");
        assert!(
            f.sent.ends_with(b"\r\n\r\n5\r\nhello\r\n0\r\nX-A: b\r\n\r\n"),
            "{:?}",
            String::from_utf8_lossy(&f.sent)
        );
        assert_eq!(f.charged, f.sent.len() as u64);
        for bad in ["0\r\n\nGET /s HTTP/1.1\r\n\r\n", "5\r\nhello\n0\r\n\r\n", "5\r\nhel"] {
            let f = request_up(post(bad).as_bytes()).unwrap().unwrap();
            assert!(f.cut.is_some(), "{bad:?}");
            check_request(post(bad).as_bytes());
        }
        check_scrub(b"s3cr3t", b"xx s3cr3t s3cr3ts3cr3t", &[1, 4, 2, 9]);
    }
}
