// G1, G4: a Verified cannot be built with a struct literal outside the crate.
use stockade_verify::Verified;

fn main() {
    let _v: Verified<u32> = Verified { value: 42, report: todo!() };
}
