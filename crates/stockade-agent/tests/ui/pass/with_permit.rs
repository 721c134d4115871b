// G1: the one way: authorize mints the permit, and the tool box spends it.
use std::time::Duration;

use stockade_agent::ToolBox;
use stockade_agent::policy::allow::{Context, Decision, Ledger, Policy, ToolCall};

async fn run(tools: &ToolBox, policy: &Policy, call: &ToolCall) {
    let ledger = Ledger::new();
    if let Decision::Allow(permit) = policy.authorize(call, &Context::new(&ledger, Duration::ZERO)) {
        let _ = tools.dispatch(permit).await;
    }
}

fn main() {}
