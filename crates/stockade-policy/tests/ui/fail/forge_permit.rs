// G9: a Permit cannot be built outside stockade-policy.
use stockade_policy::allow::{Permit, ToolCall};

fn main() {
    let _p = Permit { call: ToolCall::new("send_raven"), rule: String::from("mine"), canonical: String::new() };
}
