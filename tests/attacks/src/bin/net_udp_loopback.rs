//! Send a datagram to a UDP listener the harness opened on 127.0.0.1 of the host.
//! Catalogue row: 16 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    let port = arg("udp");
    report(
        "udp_send",
        std::net::UdpSocket::bind("0.0.0.0:0").and_then(|s| s.send_to(b"exfil", format!("127.0.0.1:{port}"))),
    );
}
