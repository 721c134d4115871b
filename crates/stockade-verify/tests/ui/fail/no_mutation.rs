// G4: no DerefMut, no get_mut, no public field: a verified value cannot be changed in place.
use stockade_verify::Verified;

fn tamper(v: &mut Verified<u32>) {
    *v.value_mut() = 7;
    **v = 7;
    v.value = 7;
}

fn main() {}
