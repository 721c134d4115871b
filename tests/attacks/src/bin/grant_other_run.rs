//! Reach the broker of another run that is going on at the same time: by the host path of
//! its grants directory (which the harness passes), through /proc, and by searching.
//! Grants row (issue 12): the other run's side-effect log must stay empty.
use stockade_attacks::*;

fn try_socket(what: &str, path: &str) {
    report_grant(what, broker(Some(path)).and_then(|mut s| grant_call(&mut s, "log", r#"{"msg":"ok-stolen"}"#)));
}

fn main() {
    if arg("role") == "victim" {
        std::thread::sleep(std::time::Duration::from_millis(2500));
        return;
    }
    let parent = arg("victim_grants");
    for e in std::fs::read_dir(&parent).into_iter().flatten().flatten() {
        try_socket("victim_by_host_path", &format!("{}/grants.sock", e.path().display()));
    }
    try_socket("victim_guessed_host_path", &format!("{parent}/grants.sock"));
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        for d in ["run/stockade", "broker"] {
            let p = format!("{}/root/{d}/grants.sock", e.path().display());
            if std::path::Path::new(&p).exists() && !p.starts_with("/proc/self") {
                try_socket(&format!("proc_root {}", e.file_name().to_string_lossy()), &p);
            }
        }
    }
    for d in ["/tmp", "/run", "/var/run"] {
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            try_socket(&format!("scan {}", e.path().display()), &format!("{}/grants.sock", e.path().display()));
        }
    }
}
