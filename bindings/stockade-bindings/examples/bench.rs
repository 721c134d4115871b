//! The bindings' Rust baseline for `cargo xtask bench bindings`: the same calls the Python
//! and Node packages make (a wasm `run_code` of `console.log(1)`, and one `authorize`), made
//! from Rust through the same core, N times each; prints each call's microseconds as JSON.

#![allow(clippy::unwrap_used, reason = "a bench fails loudly")]

use std::io::Write as _;
use std::time::Instant;

use serde_json::json;

fn main() -> std::io::Result<()> {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(200);
    let (toml, tools) = stockade_bindings_bench_policy();
    let policy = stockade_bindings::BoundPolicy::from_toml(&toml, &tools).unwrap();
    let args = json!({"to": "riverhold", "text": "all quiet"});
    let mut run_us = Vec::with_capacity(n);
    let mut authorize_us = Vec::with_capacity(n);
    for i in 0..n + 20 {
        let opts = serde_json::from_value(json!({"code": "console.log(1)", "language": "javascript"})).unwrap();
        let t = Instant::now();
        let ran = stockade_bindings::runtime().block_on(stockade_bindings::run(opts, None, Vec::new())).unwrap();
        let value = ran.verify(|_| Ok(())).unwrap();
        let took = t.elapsed();
        assert_eq!(value.value, stockade_bindings::Value::Text("1\n".into()));
        let t = Instant::now();
        let d = policy.authorize("send_raven", &args, "user").unwrap();
        let took_auth = t.elapsed();
        assert_eq!(d["effect"], "allow");
        if i >= 20 {
            run_us.push(took.as_secs_f64() * 1e6);
            authorize_us.push(took_auth.as_secs_f64() * 1e6);
        }
    }
    let out = json!({"run_us": run_us, "authorize_us": authorize_us});
    writeln!(std::io::stdout(), "{out}")
}

/// The policy every language's bench decides with: one rule, one tool.
fn stockade_bindings_bench_policy() -> (String, serde_json::Value) {
    let toml = "version = 1\ndefault = \"deny\"\n[[rule]]\nid = \"allies\"\ntool = \"send_raven\"\neffect = \"allow\"\nargs.to = { one_of = [\"riverhold\", \"highcliff\"] }\n";
    let tools = json!({"send_raven": {"type": "object", "properties": {"to": {"type": "string"}, "text": {"type": "string"}}, "required": ["to", "text"]}});
    (toml.to_owned(), tools)
}
