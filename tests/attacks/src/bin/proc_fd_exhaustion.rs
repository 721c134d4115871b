//! Open file descriptors until something gives.
//! Catalogue row: 43 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    let mut fds = Vec::new();
    let r = loop {
        match std::fs::File::open("/dev/null") {
            Ok(f) => {
                fds.push(f);
                if fds.len() > 1_000_000 {
                    break Ok(());
                }
            }
            Err(e) => break Err(e),
        }
    };
    report("open_1m_fds", r);
}
