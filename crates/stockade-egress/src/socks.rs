//! SOCKS5 (RFC 1928) as the proxy serves it: no authentication, `CONNECT` only, a name or an
//! address.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The reply codes the proxy sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reply {
    Succeeded = 0,
    NotAllowed = 2,
    HostUnreachable = 4,
    CommandNotSupported = 7,
    AddressNotSupported = 8,
}

/// Reads the greeting and the request: the target host (lower case) and port, or the reply
/// to refuse with and why. Answers the greeting itself.
pub(crate) async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
) -> std::io::Result<Result<(String, u16), (Reply, &'static str)>> {
    let mut head = [0u8; 2];
    s.read_exact(&mut head).await?;
    let mut methods = vec![0u8; usize::from(head[1])];
    s.read_exact(&mut methods).await?;
    if head[0] != 5 || !methods.contains(&0) {
        s.write_all(&[5, 0xff]).await?;
        return Ok(Err((Reply::NotAllowed, "SOCKS5 without authentication is the only method served")));
    }
    s.write_all(&[5, 0]).await?;
    let mut req = [0u8; 4];
    s.read_exact(&mut req).await?;
    if req[0] != 5 {
        return Ok(Err((Reply::NotAllowed, "not a SOCKS5 request")));
    }
    let host = match req[3] {
        1 => {
            let mut a = [0u8; 4];
            s.read_exact(&mut a).await?;
            std::net::Ipv4Addr::from(a).to_string()
        }
        4 => {
            let mut a = [0u8; 16];
            s.read_exact(&mut a).await?;
            crate::addr::canonical(std::net::Ipv6Addr::from(a).into()).to_string()
        }
        3 => {
            let mut n = [0u8; 1];
            s.read_exact(&mut n).await?;
            let mut name = vec![0u8; usize::from(n[0])];
            s.read_exact(&mut name).await?;
            match String::from_utf8(name) {
                Ok(n) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b)) => {
                    n.trim_end_matches('.').to_ascii_lowercase()
                }
                _ => return Ok(Err((Reply::AddressNotSupported, "the SOCKS5 host is not a DNS name"))),
            }
        }
        _ => return Ok(Err((Reply::AddressNotSupported, "unknown SOCKS5 address type"))),
    };
    let mut port = [0u8; 2];
    s.read_exact(&mut port).await?;
    if req[1] != 1 {
        return Ok(Err((Reply::CommandNotSupported, "only SOCKS5 CONNECT is served (no BIND, no UDP)")));
    }
    let port = u16::from_be_bytes(port);
    if port == 0 {
        return Ok(Err((Reply::NotAllowed, "port 0")));
    }
    Ok(Ok((host, port)))
}

/// The reply frame for `code` (bound address 0.0.0.0:0: the guest learns nothing of the
/// host's side).
pub(crate) fn reply(code: Reply) -> [u8; 10] {
    [5, code as u8, 0, 1, 0, 0, 0, 0, 0, 0]
}
