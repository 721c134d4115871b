// G1: a permit names one call; its call cannot be swapped for another.
use stockade_agent::policy::allow::{Permit, ToolCall};

fn retarget(mut permit: Permit) -> Permit {
    permit.call = ToolCall::new("send_raven");
    permit
}

fn main() {}
