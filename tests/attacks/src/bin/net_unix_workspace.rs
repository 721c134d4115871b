//! Connect to a host daemon's unix socket that sits inside a granted read-write workspace
//! (mode 0666), and send it bytes. Landlock ABI 7 cannot stop a connect to a pathname
//! socket, and a bind mount does not either.
//! Catalogue row: 20b (newcomer issue, item 6).
use stockade_attacks::*;

fn main() {
    report(
        "workspace_socket",
        std::os::unix::net::UnixStream::connect("/workspace/run/daemon.sock")
            .and_then(|mut s| std::io::Write::write_all(&mut s, b"guest bytes")),
    );
}
