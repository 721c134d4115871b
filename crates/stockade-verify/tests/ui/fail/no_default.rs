// G4: no Default for Verified or Budget: nothing is verified, and no run is unbudgeted, by default.
use stockade_verify::{Budget, Verified};

fn main() {
    let _v: Verified<u32> = Default::default();
    let _b = Budget::default();
}
