// G4: Verified is not Clone and does not deref to its value.
use stockade_verify::Verified;

fn copy(v: &Verified<u32>) -> (Verified<u32>, u32) {
    (v.clone(), *v)
}

fn main() {}
