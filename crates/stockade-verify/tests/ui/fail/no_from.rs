// G4: no From<T> for Verified<T>, so `.into()` cannot mint one.
use stockade_verify::Verified;

fn main() {
    let _v: Verified<u32> = 42u32.into();
}
