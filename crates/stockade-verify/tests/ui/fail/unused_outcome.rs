// G7: an Outcome cannot be dropped without being looked at.
#![deny(unused_must_use)]
use std::time::Duration;
use stockade_protocol::{Report, Status};
use stockade_verify::{Budget, Contract, accept_any, verify};

fn main() {
    let contract = Contract::<String>::text(Budget::new(Duration::from_secs(1), 10), accept_any);
    verify(Report::new(Status::Exited { code: 0 }, Duration::ZERO), &contract);
}
