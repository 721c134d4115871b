//! Leave a daemon behind that calls a grant 1.5 s later, after the run has ended.
//! Grants row (issue 12): the host's log must hold no call made after the run ended.
use stockade_attacks::*;

fn main() {
    match fork() {
        Ok(0) => {
            let _ = syscall(libc::SYS_setsid, [0; 6]);
            std::thread::sleep(std::time::Duration::from_millis(1500));
            let _ = broker(None).and_then(|mut s| grant_call(&mut s, "log", r#"{"msg":"ok-late"}"#));
            std::process::exit(0);
        }
        r => report("fork_daemon", r),
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
}
