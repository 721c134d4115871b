//! run_code in the wasm tier, in process (G9); the process tier's python and sh are walked
//! through `stockade agent` in stockade-cli's tests, where the CLI is the sandbox helper.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use stockade_agent::protocol::Limits;
use stockade_agent::runtime::Sandbox;
use stockade_agent::{Agent, Endpoint, RunCode};
use stockade_test_support::{MockLlm, Reply};

use crate::support::{block_on, tool_messages};

const POLICY: &str = "version = 1\ndefault = \"deny\"\n[[rule]]\nid = \"code\"\ntool = \"run_code\"\neffect = \"allow\"\nargs.language = { one_of = [\"javascript\", \"python\", \"sh\"] }\n";

/// A run_code with javascript, if this host has the wasm tier's guest (CI builds it; a skip
/// fails there).
fn javascript_tool(limits: Limits) -> Option<RunCode> {
    match stockade_agent::runtime::wasm::guests::javascript() {
        Ok(_) => {}
        Err(e) if std::env::var_os("STOCKADE_REQUIRE_ALL").is_some() => panic!("the JavaScript guest is required: {e}"),
        Err(e) => {
            eprintln!("SKIPPED run_code javascript: {e} (cargo xtask guests)");
            return None;
        }
    }
    let tier = stockade_agent::runtime::wasm::WasmTier::new().unwrap();
    let sandbox = Arc::new(Sandbox::builder().tier(tier).build().unwrap());
    Some(RunCode::new(limits).javascript(sandbox))
}

fn run_js(code: &str, limits: Limits) -> Option<String> {
    Some(one_call(javascript_tool(limits)?, "javascript", code))
}

/// Has the model call `run_code` once with `language` and `code`; returns the call's result.
fn one_call(tool: RunCode, language: &str, code: &str) -> String {
    let mock = MockLlm::script(vec![
        Reply::calls(&[("run_code", json!({"language": language, "code": code}))]),
        Reply::text("ok"),
    ])
    .unwrap();
    let agent = Agent::builder(Endpoint::new(&mock.url(), "m").unwrap())
        .tool(Arc::new(tool))
        .policy_toml(POLICY)
        .unwrap()
        .build()
        .unwrap();
    block_on(agent.run("compute")).unwrap();
    tool_messages(&mock.received()[1]).remove(0).1
}

#[test]
fn g9_verified_output_comes_back_marked() {
    let Some(text) = run_js("console.log(6*7, '<tag>')", Limits::new()) else { return };
    assert!(text.contains("[provenance source=\"run_code\""), "{text}");
    assert!(text.contains("42 &lt;tag&gt;"), "{text}");
}

#[test]
fn g9_refusals_are_the_calls_result() {
    let short = Limits::new().with_wall(Duration::from_millis(300)).unwrap();
    let Some(text) = run_js("while (true) {}", short) else { return };
    assert!(text.starts_with("Error: the run was refused (wasm tier)"), "{text}");
    assert!(text.contains("timed out") || text.contains("cpu"), "{text}");
    let small = Limits::new().with_stdout(1024).unwrap();
    let Some(text) = run_js("for (let i = 0; i < 1000; i++) console.log('flood flood flood')", small) else { return };
    assert!(text.contains("output too large"), "{text}");
    let Some(text) = run_js("throw new Error('<boom>')", Limits::new()) else { return };
    assert!(text.starts_with("Error: the run was refused"), "{text}");
    assert!(!text.contains("<boom>"), "the guest's stderr excerpt is marked: {text}");
}

#[test]
fn g9_a_language_this_host_cannot_run_is_refused_as_a_result() {
    let text = one_call(RunCode::new(Limits::new()), "python", "print(1)");
    assert!(text.starts_with("Error: python is not available on this host"), "{text}");
}
