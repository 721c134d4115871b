//! Ignore the proxy the run was granted: connect straight to the allowed upstream's real
//! address, to a listener no rule allows, to the host's 127.0.0.1 and ::1, and send a
//! datagram to a stand-in resolver. Network row (issue 35): a grant opens the proxy, never
//! a route.
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

use stockade_attacks::net::{baseline, up};
use stockade_attacks::*;

fn direct(what: &str, addr: &str) {
    let r = addr
        .parse::<SocketAddr>()
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))
        .and_then(|a| TcpStream::connect_timeout(&a, Duration::from_secs(2)))
        .and_then(|mut s| std::io::Write::write_all(&mut s, b"GET /forbidden-direct HTTP/1.1\r\n\r\n"));
    report(what, r);
}

fn main() {
    baseline();
    let tcp = arg("tcp");
    direct("upstream_address", &format!("127.0.0.2:{}", up()));
    direct("upstream_mapped_v6", &format!("[::ffff:127.0.0.2]:{}", up()));
    direct("forbidden_listener", &arg("forbidden"));
    direct("host_loopback", &format!("127.0.0.1:{tcp}"));
    direct("host_loopback_v6", &format!("[::1]:{tcp}"));
    // A datagram is sent whether or not anyone listens: `ok` only if an answer came back.
    let udp = UdpSocket::bind("0.0.0.0:0").and_then(|s| {
        s.set_read_timeout(Some(Duration::from_secs(1)))?;
        s.send_to(b"forbidden-direct-datagram", arg("dns"))?;
        let mut b = [0u8; 512];
        s.recv(&mut b)
    });
    report("udp_resolver", udp);
}
