// G4: Verified does not implement Deserialize, so it cannot come off the wire.
use stockade_verify::Verified;

fn main() {
    let _v: Verified<u32> = serde_json::from_str("42").unwrap();
}
