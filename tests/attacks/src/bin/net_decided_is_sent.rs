//! Make the proxy decide on one thing and send another, through `paths.test`, which the
//! harness's policy allows under `/pub` only and for 10,000 bytes: paths whose percent-
//! encoded dot segments, encoded slashes or path parameters climb out of `/pub` as the
//! upstream reads them, and a chunked body whose trailer section carries past the rule's
//! byte budget (trailers went uncounted once). Network row (issue 53): every byte that
//! reaches the upstream was decided and counted; what carries `forbidden` must never arrive.
use stockade_attacks::net::{baseline, exchange, report_http, up};

fn main() {
    baseline();
    let a = format!("paths.test:{}", up());
    let get = |path: &str| format!("GET http://{a}{path} HTTP/1.1\r\nHost: {a}\r\n\r\n");
    // For the record: the rule works for a path inside /pub.
    let own = exchange(get("/pub/ok-pub").as_bytes());
    println!("DATA own_path {}", own.map(|a| stockade_attacks::net::status(&a)).unwrap_or_default());
    for (what, path) in [
        ("encoded_dots", "/pub/%2e%2e/forbidden"),
        ("encoded_dots_upper", "/pub/%2E%2E/forbidden"),
        ("half_encoded_dots", "/pub/.%2e/forbidden"),
        ("encoded_slash", "/pub%2f..%2fforbidden"),
        ("path_parameter", "/pub/..;/forbidden"),
        ("backslash", "/pub/..%5cforbidden"),
        ("two_up", "/pub/x/%2e%2e/%2e%2e/forbidden"),
    ] {
        report_http(what, exchange(get(path).as_bytes()));
    }
    // 12,000 bytes of trailer fields, then one that carries the word: past the rule's
    // 10,000-byte budget, so it must never reach the upstream.
    let mut body = String::from("0\r\n");
    for i in 0..200 {
        body.push_str(&format!("X-Pad-{i:03}: {}\r\n", "a".repeat(48)));
    }
    body.push_str("X-Forbidden: trailer past the budget\r\n\r\n");
    let post = format!("POST http://{a}/pub/up HTTP/1.1\r\nHost: {a}\r\nTransfer-Encoding: chunked\r\n\r\n{body}");
    report_http("trailers_past_budget", exchange(post.as_bytes()));
}
