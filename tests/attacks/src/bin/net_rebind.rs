//! Ask the proxy for names that resolve to the host's loopback: `localhost` in several
//! spellings, the forms of 127.0.0.1 that the C resolver accepts as names (`127.1`,
//! `2130706433`, `0x7f000001`, `0177.0.0.1`), over CONNECT, plain HTTP and SOCKS5. The
//! harness's policy allows any host on the world's port, so the policy says yes: the
//! address check after resolving must say no. Network row (issue 35, DNS rebinding's
//! end state: an allowed name that answers with an inside address).
use stockade_attacks::net::{baseline, exchange, report_http, socks, socks_name, tunnel};
use stockade_attacks::*;

fn main() {
    baseline();
    let tcp = arg("tcp");
    let port: u16 = tcp.parse().unwrap_or(9);
    let names = ["localhost", "LocalHost.", "ip6-localhost", "127.1", "2130706433", "0x7f000001", "0177.0.0.1"];
    for name in names {
        tunnel(&format!("connect_{name}"), &format!("{name}:{tcp}"), b"forbidden-rebind", 1);
        socks(&format!("socks_{name}"), 1, 3, &socks_name(name), port, b"forbidden-rebind");
    }
    report_http(
        "plain_localhost",
        exchange(format!("GET http://localhost:{tcp}/forbidden HTTP/1.1\r\nHost: localhost:{tcp}\r\n\r\n").as_bytes()),
    );
}
