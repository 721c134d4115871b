//! Policy loader: arbitrary text must never panic the TOML loader, and any policy that loads
//! must decide a call without panicking.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use stockade_policy::allow::{ArgType, Context, Ledger, Policy, Registry, Source, ToolCall, ToolSpec};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let registry = Registry::new()
        .with(ToolSpec::new("read_scroll").arg("name", ArgType::String, true))
        .with(ToolSpec::new("send_raven").arg("to", ArgType::String, true).arg("body", ArgType::String, false));
    if let Ok(policy) = Policy::from_toml(text, &registry) {
        let call = ToolCall::new("send_raven").arg("to", serde_json::json!("riverhold"), Source::User);
        let ledger = Ledger::new();
        let _ = policy.authorize(&call, &Context::new(&ledger, Duration::ZERO)).effect();
    }
});
