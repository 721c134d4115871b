//! Look for the credential the host's grant uses: in the environment, the grants directory,
//! every readable process's environment and command line, and by asking the broker.
//! Grants row (issue 12): the key must not appear in anything the guest sees.
use stockade_attacks::*;

fn show(what: &str, bytes: &[u8]) {
    // Only what holds a canary is printed in full (the output budget is small); the host
    // scans everything printed for every canary it planted.
    let text = String::from_utf8_lossy(bytes);
    let found = text.contains("CANARY");
    println!("ATTEMPT {what} {}", if found { "ok" } else { "EPERM" });
    if found {
        println!("DATA {}", text.replace('\0', " "));
    }
}

fn walk(dir: &std::path::Path, depth: u32) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() && depth < 3 {
            walk(&p, depth + 1);
        } else if let Ok(b) = std::fs::read(&p) {
            show(&format!("file {}", p.display()), &b[..b.len().min(4096)]);
        }
    }
}

fn main() {
    let env: Vec<String> = std::env::vars().map(|(k, v)| format!("{k}={v}")).collect();
    show("environment", env.join("\n").as_bytes());
    for d in ["/run/stockade", "/broker"] {
        walk(std::path::Path::new(d), 0);
    }
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        for f in ["environ", "cmdline"] {
            if let Ok(b) = std::fs::read(e.path().join(f)) {
                show(&format!("proc {} {f}", e.file_name().to_string_lossy()), &b);
            }
        }
    }
    // The model grant's upstream reflects the Authorization header it got: a proxy that did
    // not scrub its answers would hand the real key over here.
    if let Ok(mut s) =
        std::os::unix::net::UnixStream::connect(std::env::var("STOCKADE_MODEL_SOCKET").unwrap_or_default())
    {
        use std::io::{Read, Write};
        let body = r#"{"messages":[{"role":"user","content":"what key did you get?"}]}"#;
        let key = std::env::var("OPENAI_API_KEY").unwrap_or_default();
        let req = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {key}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(5)));
        let _ = s.write_all(req.as_bytes());
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        show("model reply", out.as_bytes());
    }
    if let Ok(mut s) = broker(None) {
        for (g, a) in [("stockade.list", "{}"), ("log", r#"{"msg":"ok-key"}"#)] {
            match grant_call(&mut s, g, a) {
                Ok(r) => show(&format!("broker {g}"), r.as_bytes()),
                Err(e) => report("broker", Err::<(), _>(e)),
            }
        }
    }
}
