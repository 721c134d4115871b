//! Allocate and touch memory until something gives.
//! Catalogue row: 39 (`research/process-tier.md` section 4).

fn main() {
    let mut blocks = Vec::new();
    for _ in 0..64 {
        let mut v = vec![0u8; 128 << 20];
        for i in (0..v.len()).step_by(4096) {
            v[i] = 1;
        }
        blocks.push(v);
    }
    println!("ATTEMPT allocate_8g ok {}", blocks.len());
}
