//! Crash with a large resident set, hoping for a core file on the host.
//! Catalogue row: 48 (`research/process-tier.md` section 4).

fn main() {
    let mut v = vec![0u8; 64 << 20];
    for i in (0..v.len()).step_by(4096) {
        v[i] = 0xAB;
    }
    println!("ATTEMPT touched {}", std::hint::black_box(&v).len());
    std::process::abort();
}
