//! Keep running after the supervisor is killed (the harness kills a stand-in supervisor
//! process mid-run and checks, from the host, that this program is gone).
//! Catalogue row: 47 (`research/process-tier.md` section 4).

fn main() {
    println!("ATTEMPT waiting ok");
    std::thread::sleep(std::time::Duration::from_secs(1_000_000));
}
