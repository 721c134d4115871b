//! Ask the proxy for the host's own loopback by address, in every spelling and protocol:
//! CONNECT to 127.0.0.1, ::1, ::ffff:127.0.0.1 and 0.0.0.0, plain HTTP to 127.0.0.1, SOCKS5
//! by IPv4, IPv6 and a name that is an address, and the upstream's address on another
//! port. The harness's policy is careless on purpose: it allows any host on the world's
//! port. Network row (issue 35): only a rule that names an address opens it.
use stockade_attacks::net::{baseline, exchange, report_http, socks, socks_name, tunnel};
use stockade_attacks::*;

fn main() {
    baseline();
    let tcp = arg("tcp");
    let port: u16 = tcp.parse().unwrap_or(9);
    for (what, target) in [
        ("connect_v4", format!("127.0.0.1:{tcp}")),
        ("connect_v6", format!("[::1]:{tcp}")),
        ("connect_mapped", format!("[::ffff:127.0.0.1]:{tcp}")),
        ("connect_compatible", format!("[::127.0.0.1]:{tcp}")),
        ("connect_mapped_hex", format!("[::ffff:7f00:1]:{tcp}")),
        ("connect_unspecified", format!("0.0.0.0:{tcp}")),
        ("connect_other_loopback", format!("127.0.0.2:{tcp}")),
        ("connect_forbidden", arg("forbidden")),
    ] {
        tunnel(what, &target, b"forbidden-through-proxy", 1);
    }
    report_http(
        "plain_v4",
        exchange(format!("GET http://127.0.0.1:{tcp}/forbidden HTTP/1.1\r\nHost: 127.0.0.1:{tcp}\r\n\r\n").as_bytes()),
    );
    report_http(
        "plain_v6",
        exchange(format!("GET http://[::1]:{tcp}/forbidden HTTP/1.1\r\nHost: [::1]:{tcp}\r\n\r\n").as_bytes()),
    );
    socks("socks_v4", 1, 1, &[127, 0, 0, 1], port, b"forbidden-through-socks");
    let mut v6 = [0u8; 16];
    v6[15] = 1;
    socks("socks_v6", 1, 4, &v6, port, b"forbidden-through-socks");
    socks("socks_name_is_address", 1, 3, &socks_name("127.0.0.1"), port, b"forbidden-through-socks");
}
