//! `listen_in_netns`: the model grant's listener in another process's network namespace
//! (the docker tier's holder container), judged from the host's own loopback.

use std::time::Duration;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn a_process_in_this_namespace_is_refused_since_the_listener_would_be_on_the_hosts_loopback() {
    let port = free_port();
    let e = stockade_process::listen_in_netns(std::process::id(), port).unwrap_err();
    assert!(e.to_string().contains("own network namespace"), "{e}");
    // Nothing listens on the host's loopback.
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
}

#[test]
fn a_process_that_is_gone_is_refused() {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    assert!(stockade_process::listen_in_netns(pid, free_port()).is_err());
}

#[test]
fn the_listener_is_in_the_other_namespace_and_not_on_the_hosts_loopback() {
    // Needs CAP_SYS_ADMIN for `unshare --net` and for joining the namespace (root, as a
    // docker-tier supervisor is when it uses this).
    if not_root() {
        eprintln!("SKIPPED the_listener_is_in_the_other_namespace: needs root");
        return;
    }
    let mut holder = std::process::Command::new("unshare").args(["--net", "--", "sleep", "30"]).spawn().unwrap();
    // `unshare` execs `sleep` in the new namespace; wait until the pid's namespace differs.
    let pid = holder.id();
    let ours = std::fs::read_link("/proc/self/ns/net").unwrap();
    for _ in 0..200 {
        if std::fs::read_link(format!("/proc/{pid}/ns/net")).is_ok_and(|ns| ns != ours) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let port = free_port();
    let listener = stockade_process::listen_in_netns(pid, port).unwrap();
    assert_eq!(listener.local_addr().unwrap(), std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    // From the host's own loopback, nothing answers on that port.
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err(), "the listener is on the host's loopback");
    holder.kill().unwrap();
    holder.wait().unwrap();
}

fn not_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").map(|m| m.uid() != 0).unwrap_or(true)
}
