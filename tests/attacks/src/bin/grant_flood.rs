//! Make 10,000 grant calls as fast as possible, over several connections.
//! Grants row (issue 12): no more calls may run than the run's bound, and the host goes on.
use stockade_attacks::*;

fn main() {
    let mut ok = 0u32;
    'outer: for _ in 0..8 {
        let Ok(mut s) = broker(None) else { break };
        for i in 0..1250 {
            match grant_call(&mut s, "log", &format!("{{\"msg\":\"ok-{i}\"}}")) {
                Ok(r) if r.contains("\"result\":") => ok += 1,
                _ => continue 'outer,
            }
        }
    }
    println!("ATTEMPT flood {}", if ok >= 10_000 { "ok" } else { "EPERM" });
    println!("DATA {ok} calls answered");
}
