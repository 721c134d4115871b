// G9: a Permit cannot be cloned to cover a second execution.
use stockade_policy::allow::Permit;

fn twice(p: Permit) -> (Permit, Permit) {
    (p.clone(), p)
}

fn main() {}
