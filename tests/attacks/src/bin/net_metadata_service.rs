//! Reach a cloud-metadata-style HTTP service on a link-local address. The harness puts that
//! address on an interface inside a network namespace it created, and routes the host's
//! traffic for it there, so a leaking sandbox could only ever reach the harness's listener.
//! Catalogue row: 17 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    let addr = arg("metadata");
    let Ok(addr) = addr.parse::<std::net::SocketAddr>() else {
        println!("ATTEMPT metadata_connect EINVAL");
        return;
    };
    report(
        "metadata_connect",
        std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(2))
            .and_then(|mut s| std::io::Write::write_all(&mut s, b"GET /latest/meta-data/iam/ HTTP/1.0\r\n\r\n")),
    );
}
