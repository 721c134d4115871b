//! Leave a setsid daemon behind and exit cleanly.
//! Catalogue row: 46 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    match fork() {
        Ok(0) => {
            let _ = syscall(libc::SYS_setsid, [0; 6]);
            let _ = std::process::Command::new("/usr/bin/sleep").arg(arg("marker")).status();
            std::process::exit(0);
        }
        r => report("fork_daemon", r),
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
}
