// G5: a rejected value is a diagnostic string only; no accessor returns the value.
use stockade_verify::Rejected;

fn recover(r: Rejected) -> u32 {
    r.value
}

fn recover2(r: &Rejected) -> &u32 {
    r.value()
}

fn main() {}
