//! The server name in a TLS ClientHello (G4), read from the first handshake record.

/// A TLS record header: type, version, length.
const RECORD_HEADER: usize = 5;
/// Largest TLS plaintext record (RFC 8446 §5.1).
pub(crate) const MAX_RECORD: usize = 1 << 14;

/// What the first bytes of a tunnel say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Hello {
    /// Not all of the first record has arrived: at least this many bytes in all are needed.
    NeedMore(usize),
    /// A ClientHello naming this server (lower case, no trailing dot).
    Sni(String),
    /// A ClientHello with no server name.
    NoSni,
    /// Not a TLS ClientHello (or a malformed one): the reason.
    NotTls(&'static str),
}

/// Reads the ClientHello at the start of `buf`. The whole ClientHello must be in the first
/// record (clients send it so; one record holds 16 KiB).
pub(crate) fn client_hello(buf: &[u8]) -> Hello {
    match buf.first() {
        None => return Hello::NeedMore(1),
        Some(0x16) => {}
        Some(_) => return Hello::NotTls("the first record is not a TLS handshake"),
    }
    if buf.len() < RECORD_HEADER {
        return Hello::NeedMore(RECORD_HEADER);
    }
    if buf[1] != 0x03 {
        return Hello::NotTls("the record's version is not TLS");
    }
    let len = usize::from(u16::from_be_bytes([buf[3], buf[4]]));
    if len == 0 || len > MAX_RECORD {
        return Hello::NotTls("the first record's length is out of range");
    }
    if buf.len() < RECORD_HEADER + len {
        return Hello::NeedMore(RECORD_HEADER + len);
    }
    match parse(&buf[RECORD_HEADER..RECORD_HEADER + len]) {
        Ok(Some(name)) => Hello::Sni(name),
        Ok(None) => Hello::NoSni,
        Err(why) => Hello::NotTls(why),
    }
}

/// Follows one direction of a tunnel's TLS record layer until its first application-data
/// record (G4): every record before it must have a TLS record header (content type 20 to
/// 23, version 3.x, a length within [`MAX_RECORD`] plus the 2048 bytes TLS 1.2 allows for
/// protection), and, for the server's side, the first record must be a handshake record
/// whose first message is a ServerHello. A non-TLS service answers nothing of the kind, so
/// a tunnel to a name cannot carry another protocol past its ClientHello.
#[derive(Debug)]
pub(crate) struct RecordWatch {
    // The current record's header bytes so far (0 to 5), or its body still to pass.
    header: [u8; RECORD_HEADER],
    have: usize,
    body_left: usize,
    // The server's first record: its first body byte must be a ServerHello (2).
    expect_server_hello: bool,
    first: bool,
    done: bool,
}

impl RecordWatch {
    /// A watch of the client's records (after its ClientHello) or, with `server`, of the
    /// upstream's.
    pub(crate) fn new(server: bool) -> Self {
        Self {
            header: [0; RECORD_HEADER],
            have: 0,
            body_left: 0,
            expect_server_hello: server,
            first: true,
            done: false,
        }
    }

    /// Whether the first application-data record has been seen (nothing more is checked).
    pub(crate) fn done(&self) -> bool {
        self.done
    }

    /// Whether the server's ServerHello has been seen (always true of a client's watch).
    pub(crate) fn hello_seen(&self) -> bool {
        !self.expect_server_hello || !self.first
    }

    /// Takes the next bytes of the direction: `Err` names what is not TLS.
    pub(crate) fn feed(&mut self, mut bytes: &[u8]) -> Result<(), &'static str> {
        while !self.done && !bytes.is_empty() {
            if self.body_left > 0 {
                if self.expect_server_hello && self.first {
                    if bytes[0] != 0x02 {
                        return Err("the upstream's first handshake message is not a ServerHello");
                    }
                    self.first = false;
                }
                let n = self.body_left.min(bytes.len());
                self.body_left -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (RECORD_HEADER - self.have).min(bytes.len());
            self.header[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have < RECORD_HEADER {
                return Ok(());
            }
            self.have = 0;
            let [kind, major, _, hi, lo] = self.header;
            let len = usize::from(u16::from_be_bytes([hi, lo]));
            if !(20..=23).contains(&kind) || major != 0x03 || len == 0 || len > MAX_RECORD + 2048 {
                return Err("a record that is not TLS");
            }
            if self.expect_server_hello && self.first && kind != 0x16 {
                return Err("the upstream's first record is not a TLS handshake");
            }
            if kind == 23 {
                self.done = true;
            }
            self.body_left = len;
        }
        Ok(())
    }
}

/// A cursor over a byte slice that fails rather than reads past the end.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], &'static str> {
        if self.0.len() < n {
            return Err("the ClientHello is cut short");
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<usize, &'static str> {
        Ok(usize::from(self.take(1)?[0]))
    }
    fn u16(&mut self) -> Result<usize, &'static str> {
        let b = self.take(2)?;
        Ok(usize::from(u16::from_be_bytes([b[0], b[1]])))
    }
    fn u24(&mut self) -> Result<usize, &'static str> {
        let b = self.take(3)?;
        Ok((usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2]))
    }
    /// A vector with a length prefix of `width` bytes.
    fn vec(&mut self, width: usize) -> Result<Reader<'a>, &'static str> {
        let n = match width {
            1 => self.u8()?,
            2 => self.u16()?,
            _ => self.u24()?,
        };
        Ok(Reader(self.take(n)?))
    }
}

fn parse(record: &[u8]) -> Result<Option<String>, &'static str> {
    let mut r = Reader(record);
    if r.u8()? != 1 {
        return Err("the first handshake message is not a ClientHello");
    }
    let mut hello = r.vec(3)?;
    hello.take(2 + 32)?; // legacy_version, random
    hello.vec(1)?; // legacy_session_id
    hello.vec(2)?; // cipher_suites
    hello.vec(1)?; // legacy_compression_methods
    if hello.0.is_empty() {
        return Ok(None);
    }
    let mut extensions = hello.vec(2)?;
    let mut found = None;
    while !extensions.0.is_empty() {
        let kind = extensions.u16()?;
        let mut body = extensions.vec(2)?;
        if kind != 0 {
            continue;
        }
        if found.is_some() {
            return Err("the ClientHello has two server_name extensions");
        }
        let mut names = body.vec(2)?;
        while !names.0.is_empty() {
            let name_type = names.u8()?;
            let name = names.vec(2)?.0;
            if name_type != 0 {
                continue;
            }
            if found.is_some() {
                return Err("the ClientHello names two hosts");
            }
            let name = std::str::from_utf8(name).map_err(|_| "the server name is not ASCII")?;
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b)) {
                return Err("the server name is not a DNS name");
            }
            found = Some(name.trim_end_matches('.').to_ascii_lowercase());
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::{Hello, client_hello};

    use stockade_test_support::{tls_client_hello as record, tls_sni_extension as sni};

    #[test]
    fn the_server_name_is_read_and_every_malformation_is_refused() {
        let mut ext = vec![0x00, 0x2b, 0x00, 0x03, 0x02, 0x03, 0x04]; // supported_versions first
        ext.extend(sni(&["Pypi.org."]));
        let good = record(&ext);
        assert_eq!(client_hello(&good), Hello::Sni("pypi.org".into()));
        assert!(matches!(client_hello(b"g"), Hello::NotTls(_)), "one byte that is not a handshake is enough to tell");
        for cut in [0, 3, 5, 40, good.len() - 1] {
            assert!(matches!(client_hello(&good[..cut]), Hello::NeedMore(n) if n > cut), "{cut}");
        }
        assert_eq!(client_hello(&record(&[])), Hello::NoSni);
        assert!(matches!(client_hello(&record(&sni(&["a.org", "b.org"]))), Hello::NotTls(_)));
        let mut twice = sni(&["a.org"]);
        twice.extend(sni(&["b.org"]));
        assert!(matches!(client_hello(&record(&twice)), Hello::NotTls(_)));
        assert!(matches!(client_hello(&record(&sni(&["evil\0.org"]))), Hello::NotTls(_)));
        assert!(matches!(client_hello(b"GET / HTTP/1.1\r\n\r\n"), Hello::NotTls(_)));
        // A lying inner length is cut short, never read past.
        let mut lie = good.clone();
        lie[7] = 0xff;
        assert!(matches!(client_hello(&lie), Hello::NotTls(_)));
    }
}
