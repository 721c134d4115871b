// G1: a permit cannot be made outside stockade-policy, so a tool cannot be given a made-up one.
use stockade_agent::Tool;
use stockade_agent::policy::allow::{Permit, ToolCall};

async fn run(tool: &dyn Tool) {
    let permit = Permit { call: ToolCall::new("send_raven"), rule: String::new(), canonical: String::new() };
    let _ = tool.call(permit).await;
}

fn main() {}
