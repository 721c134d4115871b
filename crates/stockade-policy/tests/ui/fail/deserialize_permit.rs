// G9: a Permit cannot come off the wire.
use stockade_policy::allow::Permit;

fn main() {
    let _p: Permit = serde_json::from_str("{}").unwrap();
}
