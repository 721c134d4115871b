// G10: an Approval is used up when presented; it cannot be cloned to approve twice.
use stockade_policy::allow::Approval;

fn twice(a: Approval) -> (Approval, Approval) {
    (a.clone(), a)
}

fn main() {}
