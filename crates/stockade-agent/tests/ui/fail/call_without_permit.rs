// G1: a tool cannot be called with a bare call; only a Permit will do.
use stockade_agent::Tool;
use stockade_agent::policy::allow::ToolCall;

async fn run(tool: &dyn Tool) {
    let call = ToolCall::new("send_raven");
    let _ = tool.call(call).await;
}

fn main() {}
