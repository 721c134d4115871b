//! Which resolved addresses a connection may reach (G3).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// `Ok` if a name may resolve to `addr` and be connected there; `Err` names the kind of
/// address it is (loopback, private, link-local, CGNAT, multicast, unspecified, broadcast,
/// documentation, benchmarking, reserved, ULA, IPv4-mapped or -translated, 6to4 or Teredo
/// to one of those). A grant that names an address literally, or a [`crate::Resolve`]
/// entry, is the one way past this.
pub fn reachable(addr: IpAddr) -> Result<(), &'static str> {
    match addr {
        IpAddr::V4(v4) => reachable_v4(v4),
        IpAddr::V6(v6) => reachable_v6(v6),
    }
}

/// The one form of `addr` every rule and address check sees (G3): an IPv4 address carried
/// in IPv6, IPv4-mapped (`::ffff:a.b.c.d`) or IPv4-compatible (`::a.b.c.d`, but not `::`
/// or `::1`), is that IPv4 address. Without it an IPv6 rule (`::/0`) would count as naming
/// the host's IPv4 loopback, which the kernel connects a mapped literal to.
#[must_use]
pub(crate) fn canonical(addr: IpAddr) -> IpAddr {
    let IpAddr::V6(v6) = addr else { return addr };
    if let Some(v4) = v6.to_ipv4_mapped() {
        return IpAddr::V4(v4);
    }
    let s = v6.segments();
    if s[..6] == [0; 6] && !v6.is_unspecified() && !v6.is_loopback() {
        return IpAddr::V4(Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8));
    }
    addr
}

fn reachable_v4(a: Ipv4Addr) -> Result<(), &'static str> {
    let [o0, o1, o2, _] = a.octets();
    let kind = match (o0, o1, o2) {
        (0, ..) => "unspecified (0.0.0.0/8)",
        (10, ..) => "private (10.0.0.0/8)",
        (100, 64..=127, _) => "CGNAT (100.64.0.0/10)",
        (127, ..) => "loopback (127.0.0.0/8)",
        (169, 254, _) => "link-local (169.254.0.0/16)",
        (172, 16..=31, _) => "private (172.16.0.0/12)",
        (192, 0, 0) => "IETF protocol assignments (192.0.0.0/24)",
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => "documentation",
        (192, 88, 99) => "6to4 relay anycast (192.88.99.0/24)",
        (192, 168, _) => "private (192.168.0.0/16)",
        (198, 18..=19, _) => "benchmarking (198.18.0.0/15)",
        (224..=239, ..) => "multicast (224.0.0.0/4)",
        (240..=255, ..) => "reserved or broadcast (240.0.0.0/4)",
        _ => return Ok(()),
    };
    Err(kind)
}

fn reachable_v6(a: Ipv6Addr) -> Result<(), &'static str> {
    let s = a.segments();
    if a.is_unspecified() {
        return Err("unspecified (::)");
    }
    if a.is_loopback() {
        return Err("loopback (::1)");
    }
    if let Some(v4) = a.to_ipv4_mapped() {
        return reachable_v4(v4).and(Err("IPv4-mapped (::ffff:0:0/96)"));
    }
    let kind = match s[0] {
        0x0000 if s[1..6] == [0; 5] => "IPv4-compatible (::/96)",
        0x0064 if s[1] == 0xff9b => "NAT64 (64:ff9b::/96)",
        0x0100 if s[1..4] == [0; 3] => "discard-only (100::/64)",
        0x2001 if s[1] == 0 => "Teredo (2001::/32)",
        0x2001 if s[1] == 0x0db8 => "documentation (2001:db8::/32)",
        0x2001 if s[1] & 0xfff0 == 0x0010 || s[1] & 0xfff0 == 0x0020 => "ORCHID (2001:10::/28, 2001:20::/28)",
        0x2002 => "6to4 (2002::/16)",
        0x3fff if s[1] & 0xf000 == 0 => "documentation (3fff::/20)",
        x if x & 0xfe00 == 0xfc00 => "unique local (fc00::/7)",
        x if x & 0xffc0 == 0xfe80 => "link-local (fe80::/10)",
        x if x & 0xffc0 == 0xfec0 => "site-local (fec0::/10)",
        x if x & 0xff00 == 0xff00 => "multicast (ff00::/8)",
        _ => return Ok(()),
    };
    Err(kind)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use super::{canonical, reachable};

    #[test]
    fn an_ipv4_address_carried_in_ipv6_is_seen_as_ipv4() {
        for (given, seen) in [
            ("::ffff:127.0.0.1", "127.0.0.1"),
            ("0:0:0:0:0:ffff:7f00:1", "127.0.0.1"),
            ("::127.0.0.1", "127.0.0.1"),
            ("::ffff:10.0.0.1", "10.0.0.1"),
            ("::1", "::1"),
            ("::", "::"),
            ("2606:4700::1111", "2606:4700::1111"),
            ("8.8.8.8", "8.8.8.8"),
        ] {
            assert_eq!(canonical(given.parse().unwrap()).to_string(), seen, "{given}");
        }
    }

    #[test]
    fn every_way_back_in_is_refused_and_the_internet_is_not() {
        for bad in [
            "0.0.0.0",
            "10.1.2.3",
            "100.64.0.1",
            "100.127.255.255",
            "127.0.0.1",
            "127.5.5.5",
            "169.254.169.254",
            "172.16.0.1",
            "172.31.255.255",
            "192.0.0.170",
            "192.0.2.1",
            "192.168.1.1",
            "198.18.0.1",
            "224.0.0.251",
            "255.255.255.255",
            "::",
            "::1",
            "::ffff:127.0.0.1",
            "::ffff:8.8.8.8",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2001::1",
            "2001:db8::1",
            "2002:7f00:1::",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "fec0::1",
            "ff02::1",
        ] {
            assert!(reachable(bad.parse().unwrap()).is_err(), "{bad}");
        }
        for ok in ["1.1.1.1", "8.8.8.8", "100.63.255.255", "100.128.0.0", "172.32.0.1", "2606:4700::1111", "2a00::1"] {
            assert_eq!(reachable(ok.parse().unwrap()), Ok(()), "{ok}");
        }
    }
}
