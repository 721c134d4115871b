//! Smuggle a request past the proxy's decision, over plain HTTP to the allowed upstream:
//! both Content-Length and Transfer-Encoding, obfuscated and doubled codings, differing
//! lengths, a second request riding on a kept-alive or pipelined connection, a Host header
//! for another name, credentials and a fragment in the URL, an obsolete folded header, and
//! a chunked body followed by a request (after its empty line, or after a bare LF), a
//! padded chunk size, and a Connection header that names Content-Length or Host. Network row (issue 35): every request that reaches
//! the upstream was decided, and framed as it was decided.
use stockade_attacks::net::{ALLOWED, baseline, exchange, report_http, up};

fn main() {
    baseline();
    let p = up();
    let a = format!("{ALLOWED}:{p}");
    let hidden = "GET /forbidden HTTP/1.1\r\nHost: forbidden.test\r\n\r\n";
    let second = format!("GET http://forbidden.test:{p}/forbidden HTTP/1.1\r\nHost: forbidden.test:{p}\r\n\r\n");
    let post = |extra: &str, body: &str| format!("POST http://{a}/ HTTP/1.1\r\nHost: {a}\r\n{extra}\r\n{body}");
    let chunked_hidden = format!("0\r\n\r\n{hidden}");
    let cases = [
        (
            "cl_and_te",
            post(
                &format!("Content-Length: {}\r\nTransfer-Encoding: chunked\r\n", chunked_hidden.len()),
                &chunked_hidden,
            ),
        ),
        ("te_obfuscated", post("Transfer-Encoding: xchunked\r\n", &chunked_hidden)),
        ("te_space_before_colon", post("Transfer-Encoding : chunked\r\n", &chunked_hidden)),
        ("te_doubled", post("Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n", &chunked_hidden)),
        ("te_list", post("Transfer-Encoding: chunked, identity\r\n", &chunked_hidden)),
        ("cl_differing", post(&format!("Content-Length: 0\r\nContent-Length: {}\r\n", hidden.len()), hidden)),
        ("cl_list", post(&format!("Content-Length: 0, {}\r\n", hidden.len()), hidden)),
        ("keep_alive_second", format!("GET http://{a}/ok-first HTTP/1.1\r\nHost: {a}\r\n\r\n{second}")),
        ("pipelined_after_body", format!("{}{second}", post("Content-Length: 2\r\n", "ok"))),
        ("chunked_then_request", format!("{}{second}", post("Transfer-Encoding: chunked\r\n", "2\r\nok\r\n0\r\n\r\n"))),
        // The trailer section ended by a bare LF, then a request: a lenient reader upstream
        // reads a second request the proxy never decided.
        ("chunked_bare_lf_then_request", post("Transfer-Encoding: chunked\r\n", &format!("0\r\n\n{hidden}"))),
        ("chunk_size_padded", post("Transfer-Encoding: chunked\r\n", &format!("0 \r\n\r\n{hidden}"))),
        // Framing or the Host named hop-by-hop: a proxy that drops what the Connection
        // header names would send the body as a second request, or no Host at all.
        (
            "connection_names_content_length",
            post(&format!("Content-Length: {}\r\nConnection: content-length\r\n", hidden.len()), hidden),
        ),
        (
            "connection_names_host",
            format!("GET http://{a}/forbidden HTTP/1.1\r\nHost: {a}\r\nConnection: host\r\n\r\n"),
        ),
        ("host_mismatch", format!("GET http://{a}/forbidden HTTP/1.1\r\nHost: forbidden.test:{p}\r\n\r\n")),
        ("host_twice", format!("GET http://{a}/forbidden HTTP/1.1\r\nHost: {a}\r\nHost: forbidden.test:{p}\r\n\r\n")),
        (
            "url_credentials",
            format!("GET http://{a}@forbidden.test:{p}/forbidden HTTP/1.1\r\nHost: forbidden.test:{p}\r\n\r\n"),
        ),
        ("url_fragment", format!("GET http://forbidden.test:{p}#@{a}/ HTTP/1.1\r\nHost: {a}\r\n\r\n")),
        (
            "folded_header",
            format!("GET http://{a}/forbidden HTTP/1.1\r\nHost: {a}\r\nX-A: b\r\n forbidden: folded\r\n\r\n"),
        ),
        (
            "upgrade",
            format!("GET http://{a}/forbidden HTTP/1.1\r\nHost: {a}\r\nConnection: upgrade\r\nUpgrade: h2c\r\n\r\n"),
        ),
    ];
    for (what, bytes) in cases {
        let answer = exchange(bytes.as_bytes());
        if what == "keep_alive_second" || what.ends_with("then_request") || what.starts_with("pipelined") {
            // The first request is allowed and answered: the attempt is the second one,
            // `ok` only if it got an answer of its own.
            let answers = answer.as_ref().map(|a| a.windows(9).filter(|w| w == b"HTTP/1.1 ").count()).unwrap_or(0);
            println!("ATTEMPT {what} {}", if answers > 1 { "ok" } else { "one-answer-then-closed" });
        } else {
            report_http(what, answer);
        }
    }
}
