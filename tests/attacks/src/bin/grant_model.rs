//! Aim the model grant elsewhere: another model, an absolute request target naming another
//! upstream, a `base_url` in the body, an image URL, a non-local `$ref`, a direct connection
//! to the harness's listener (what a guest-set `OPENAI_BASE_URL` would do).
//! Grants row (issue 12): only valid requests reach the configured upstream, rebuilt, and
//! nothing reaches any other address.
use std::io::{Read, Write};

use stockade_attacks::*;

/// One HTTP/1.1 request on the model socket; the status line's code, or the error.
fn post(target: &str, host: &str, body: &str) -> Result<(u16, String), std::io::Error> {
    let mut s = std::os::unix::net::UnixStream::connect(std::env::var("STOCKADE_MODEL_SOCKET").unwrap_or_default())?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
    let key = std::env::var("OPENAI_API_KEY").unwrap_or_default();
    let req = format!(
        "POST {target} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes())?;
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let code = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    Ok((code, out))
}

fn attempt(what: &str, r: Result<(u16, String), std::io::Error>) {
    match r {
        Ok((200, out)) => {
            println!("ATTEMPT {what} ok");
            println!("DATA {}", out.lines().last().unwrap_or_default());
        }
        Ok((code, _)) => println!("ATTEMPT {what} http{code}"),
        Err(e) => println!("ATTEMPT {what} {}", errno_name(&e)),
    }
}

fn main() {
    let user = r#"{"role":"user","content":"hello"}"#;
    let tcp = arg("tcp");
    // Allowed, and shown for the record (the reply must not carry the real key).
    if let Ok((code, out)) = post("/v1/chat/completions", "localhost", &format!(r#"{{"messages":[{user}]}}"#)) {
        println!("DATA valid {code} {}", out.lines().last().unwrap_or_default());
    }
    // Served, but by the configured upstream whatever the target says.
    if let Ok((code, _)) = post(
        &format!("http://127.0.0.1:{tcp}/v1/chat/completions"),
        &format!("127.0.0.1:{tcp}"),
        &format!(r#"{{"messages":[{user}]}}"#),
    ) {
        println!("DATA absolute_target {code}");
    }
    attempt(
        "other_model",
        post("/v1/chat/completions", "localhost", &format!(r#"{{"model":"gpt-elsewhere","messages":[{user}]}}"#)),
    );
    attempt(
        "body_base_url",
        post(
            "/v1/chat/completions",
            "localhost",
            &format!(r#"{{"base_url":"http://127.0.0.1:{tcp}/v1","messages":[{user}]}}"#),
        ),
    );
    attempt(
        "image_url",
        post(
            "/v1/chat/completions",
            "localhost",
            &format!(
                r#"{{"messages":[{{"role":"user","content":[{{"type":"image_url","image_url":{{"url":"http://127.0.0.1:{tcp}/x.png"}}}}]}}]}}"#
            ),
        ),
    );
    attempt(
        "remote_ref",
        post(
            "/v1/chat/completions",
            "localhost",
            &format!(
                r#"{{"messages":[{user}],"response_format":{{"type":"json_schema","json_schema":{{"name":"x","schema":{{"$ref":"http://127.0.0.1:{tcp}/s.json"}}}}}}}}"#
            ),
        ),
    );
    report("direct_upstream", std::net::TcpStream::connect(format!("127.0.0.1:{tcp}")));
}
