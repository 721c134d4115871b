//! Fill the disk: one huge file, then many small ones.
//! Catalogue row: 42 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    let chunk = vec![0u8; 1 << 20];
    let r = std::fs::File::create("/tmp/fill").and_then(|mut f| {
        for _ in 0..8192 {
            std::io::Write::write_all(&mut f, &chunk)?;
        }
        Ok(())
    });
    report("huge_file", r);
    let r = (0..200_000).try_for_each(|n| std::fs::write(format!("/tmp/f{n}"), b"x"));
    report("many_files", r);
}
