//! Spin on the CPU forever.
//! Catalogue row: 40 (`research/process-tier.md` section 4).

fn main() {
    let mut x = 0u64;
    loop {
        x = std::hint::black_box(x.wrapping_add(1));
    }
}
