//! The grants rows: what the harness grants an attack, and how it judges the run from the
//! host's side (the `log` grant's own side-effect log, the report's grants section, the
//! grant's canary key), never from the attack's words.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use stockade_protocol::Report;
use stockade_runtime::policy::allow::{Permit, Policy};
use stockade_runtime::{FunctionGrant, GrantLimits, Grants};

/// Most calls one attack run may make (the broker's bound).
pub const MAX_CALLS: u32 = 256;

/// How long the harness waits after a run before reading the log of an attack that leaves
/// a daemon behind to call later (it calls 1.5 s after the run began).
pub const LATE_CALL_WAIT: Duration = Duration::from_millis(2500);

/// The policy: `log` may be called with a message of the form `ok-...`, nothing else.
pub const POLICY: &str = r#"
version = 1
default = "deny"
[[rule]]
id = "log-ok-messages"
tool = "log"
effect = "allow"
args.msg = { pattern = "ok-[a-z0-9-]+" }
"#;

/// A hostile upstream for the model grant: it answers every request with the
/// `Authorization` header it received (so a proxy that forgot to scrub would hand the real
/// key to the guest) and records what reached it.
pub fn upstream() -> anyhow::Result<stockade_test_support::MockLlm> {
    Ok(stockade_test_support::MockLlm::start(|_, r| {
        stockade_test_support::Reply::text(&format!("you sent {}", r.header("authorization").unwrap_or("nothing")))
    })?)
}

/// The model grant: the proxy to `upstream_url` (model `smol`) with `key` as its real key.
pub fn model(upstream_url: &str, key: &str) -> anyhow::Result<Arc<dyn stockade_runtime::ModelService>> {
    let key = stockade_agent::ApiKey::new(key.to_owned()).ok_or_else(|| anyhow::anyhow!("unusable key"))?;
    let endpoint = stockade_agent::Endpoint::new(upstream_url, "smol")?.with_key(key).retries(0);
    Ok(Arc::new(stockade_agent::ModelProxy::new(endpoint)))
}

/// What reached the upstream that should not have: a request with a field or part the
/// broker must refuse, or more requests than the attack's valid ones.
#[must_use]
pub fn upstream_changed(attack: &str, received: &[stockade_test_support::Received]) -> Option<String> {
    for r in received {
        let body = r.body.to_string();
        if ["image_url", "$ref", "base_url", "gpt-elsewhere"].iter().any(|bad| body.contains(bad))
            || r.body["model"] != "smol"
        {
            return Some(format!("a request the broker must refuse reached the upstream: {body}"));
        }
    }
    let allowed = if attack == "grant_model" {
        2
    } else if attack == "grant_key_search" {
        1
    } else {
        0
    };
    (received.len() > allowed)
        .then(|| format!("{} requests reached the upstream, at most {allowed} were valid", received.len()))
}

/// The grants of one attack run: data `rows`, and `log`, which appends each message it is
/// allowed to write to `log` on the host and holds `key` as a credential would (the key
/// never leaves the host process).
pub fn grants(log: &Path, key: &str) -> anyhow::Result<Grants> {
    let log = log.to_path_buf();
    let key = Arc::new(key.to_owned());
    let schema = json!({"type": "object", "properties": {"msg": {"type": "string"}}, "required": ["msg"], "additionalProperties": false});
    let f = FunctionGrant::new("log", schema, move |permit: Permit| {
        let (log, key) = (log.clone(), key.clone());
        async move {
            let msg = permit.call().args_json()["msg"].as_str().unwrap_or_default().to_owned();
            let mut file =
                std::fs::OpenOptions::new().create(true).append(true).open(&log).map_err(|e| e.to_string())?;
            writeln!(file, "{msg}").map_err(|e| e.to_string())?;
            // The credential is used on the host side only: the guest learns its length.
            Ok(json!({"logged": msg, "signed_with_key_of_len": key.len()}))
        }
    })?;
    let g = Grants::new().data("rows", json!([1, 2, 3]))?.function(f)?;
    let policy = Policy::from_toml(POLICY, &g.registry()).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(g.policy(policy).limits(GrantLimits::default().max_calls(MAX_CALLS)))
}

/// The lines the `log` grant wrote.
#[must_use]
pub fn logged(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log).unwrap_or_default().lines().map(str::to_owned).collect()
}

/// Evidence of an escape through the grants, if the host finds any: a call that ran though
/// the policy forbids it, more calls than the bound, a call after the run, a call into
/// another run's broker, the key in anything the guest printed, or a session the broker
/// should have ended.
#[must_use]
pub fn judge(attack: &str, report: &Report, output: &[u8], log: &Path, key: &str, victim_log: &Path) -> Option<String> {
    let lines = logged(log);
    if let Some(bad) = lines.iter().find(|l| !l.starts_with("ok-")) {
        return Some(format!("the log grant ran a call its policy denies: {bad:?}"));
    }
    if String::from_utf8_lossy(output).contains(key) {
        return Some("the grant's key appeared in the guest's output".into());
    }
    let victim = logged(victim_log);
    if !victim.is_empty() {
        return Some(format!("another run's broker ran this run's calls: {victim:?}"));
    }
    let g = report.grants.clone().unwrap_or_default();
    match attack {
        "grant_ungranted" | "grant_lying_length" if !lines.is_empty() => {
            Some(format!("calls ran that should not have: {lines:?}"))
        }
        "grant_flood" if lines.len() > MAX_CALLS as usize => {
            Some(format!("{} calls ran, more than the bound of {MAX_CALLS}", lines.len()))
        }
        "grant_after_deadline" if lines.iter().any(|l| l == "ok-late") => {
            Some("a call ran after the run had ended".into())
        }
        "grant_lying_length" | "grant_flood" if g.session_ended.is_none() => {
            Some(format!("the broker kept the session open: {g:?}"))
        }
        _ => None,
    }
}

/// A random-enough canary key for one harness run.
#[must_use]
pub fn key() -> String {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    format!("CANARY-GRANT-KEY-sk-{:x}{:x}", t.as_nanos(), std::process::id())
}
