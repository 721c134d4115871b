//! Connect to a pathname unix socket standing in for docker.sock.
//! Catalogue row: 20 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    report(
        "unix_connect",
        std::os::unix::net::UnixStream::connect(arg("unix"))
            .and_then(|mut s| std::io::Write::write_all(&mut s, b"GET /containers/json")),
    );
}
