//! Connect to a TCP listener the harness opened on 127.0.0.1 of the host.
//! Catalogue row: 15 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    let port: u16 = arg("tcp").parse().unwrap_or(9);
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    report(
        "tcp_connect",
        std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(2))
            .and_then(|mut s| std::io::Write::write_all(&mut s, b"exfil")),
    );
}
