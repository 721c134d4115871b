//! Block on stdin, then sleep past any deadline.
//! Catalogue row: 41 (`research/process-tier.md` section 4).

fn main() {
    let mut buf = [0u8; 1];
    let n = std::io::Read::read(&mut std::io::stdin(), &mut buf).unwrap_or(0);
    println!("ATTEMPT stdin_read {}", if n == 0 { "EOF" } else { "ok" });
    std::thread::sleep(std::time::Duration::from_secs(1_000_000));
}
