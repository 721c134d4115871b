//! Connect to an abstract unix socket the harness bound.
//! Catalogue row: 21 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(arg("abstract").as_bytes());
    report(
        "abstract_connect",
        addr.and_then(|a| std::os::unix::net::UnixStream::connect_addr(&a))
            .and_then(|mut s| std::io::Write::write_all(&mut s, b"x")),
    );
}
