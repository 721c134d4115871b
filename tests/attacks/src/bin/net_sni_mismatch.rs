//! Open an allowed tunnel (CONNECT and SOCKS5 to `allowed.test`), then speak TLS for
//! another name: a ClientHello naming `forbidden.test`, none, two names, two server_name
//! extensions, one split into single-byte writes, one split across two TLS records, plain
//! text, and a valid ClientHello for its own name followed by plain text. Network row (issue 35): what enters a tunnel is TLS for its own name, or
//! nothing reaches the upstream.
use stockade_attacks::net::{
    ALLOWED, baseline, socks, socks_name, tls_client_hello, tls_sni_extension, tunnel, tunnel_result, up,
};

fn main() {
    baseline();
    let target = format!("{ALLOWED}:{}", up());
    let hello = |names: &[&str]| tls_client_hello(&tls_sni_extension(names));
    // For the record: the tunnel works for its own name.
    println!("DATA own_name {}", tunnel_result(&target, &hello(&[ALLOWED]), 1));
    let forbidden = hello(&["forbidden.test"]);
    let mut two_exts = tls_sni_extension(&[ALLOWED]);
    two_exts.extend(tls_sni_extension(&["forbidden.test"]));
    // The forbidden ClientHello's handshake message split across two records.
    let msg = &forbidden[5..];
    let (a, b) = msg.split_at(msg.len() / 2);
    let mut split = Vec::new();
    for part in [a, b] {
        split.extend_from_slice(&[0x16, 3, 1]);
        split.extend_from_slice(&u16::try_from(part.len()).unwrap_or(0).to_be_bytes());
        split.extend_from_slice(part);
    }
    for (what, bytes, pieces) in [
        ("other_name", forbidden.clone(), 1),
        ("no_name", [tls_client_hello(&[]), b"forbidden".to_vec()].concat(), 1),
        ("two_names", hello(&[ALLOWED, "forbidden.test"]), 1),
        ("two_names_reversed", hello(&["forbidden.test", ALLOWED]), 1),
        ("two_extensions", tls_client_hello(&two_exts), 1),
        ("byte_by_byte", forbidden.clone(), forbidden.len()),
        ("two_records", split, 1),
        ("plain_text", b"GET /forbidden HTTP/1.1\r\nHost: forbidden.test\r\n\r\n".to_vec(), 1),
        // A valid ClientHello for the tunnel's own name, then plain text: the upstream must
        // answer TLS before anything more of the guest's reaches it.
        (
            "own_hello_then_plain_text",
            [hello(&[ALLOWED]), b"GET /forbidden HTTP/1.1\r\nHost: forbidden.test\r\n\r\n".to_vec()].concat(),
            2,
        ),
    ] {
        tunnel(what, &target, &bytes, pieces);
    }
    socks("socks_other_name", 1, 3, &socks_name(ALLOWED), up(), &forbidden);
}
