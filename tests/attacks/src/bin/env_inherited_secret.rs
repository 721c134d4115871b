//! Look for host secrets in the inherited environment.
//! Catalogue row: 4 (`research/process-tier.md` section 4).

fn main() {
    let env: Vec<String> = std::env::vars().map(|(k, v)| format!("{k}={v}")).collect();
    println!("ATTEMPT environ {}", if env.is_empty() { "EMPTY" } else { "ok" });
    println!("DATA {}", env.join(" "));
}
