//! Flood stdout.
//! Catalogue row: 44 (`research/process-tier.md` section 4).

fn main() {
    let chunk = vec![b'A'; 1 << 16];
    while std::io::Write::write_all(&mut std::io::stdout(), &chunk).is_ok() {}
}
