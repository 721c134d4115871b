//! Length-prefixed frames: a `u32` big-endian length, then that many payload bytes; and
//! bounded newline-delimited messages ([`read_line`]).
//!
//! The length is checked against the codec's maximum before a single payload byte is
//! allocated, and the payload buffer then grows only as bytes actually arrive, in steps of
//! at most [`READ_CHUNK`]. A peer that announces a large frame and then stalls or hangs up
//! costs the host at most one chunk, never the announced length.

use std::io::{self, Read, Write};

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Default largest payload a [`FrameCodec`] accepts: 1 MiB.
///
/// The peer chooses the length prefix, so without a cap a single frame header could make
/// the host allocate 4 GiB. One mebibyte is far above any broker message or tool call we
/// exchange and small enough that a few hundred concurrent readers cannot exhaust memory.
pub const MAX_FRAME_LEN: u32 = 1 << 20;

/// Largest step by which a payload buffer grows while a frame is read.
///
/// Growth tracks bytes received rather than bytes announced, so a lying length prefix is
/// cheap for the host.
pub const READ_CHUNK: usize = 64 * 1024;

/// Size of the length prefix, in bytes.
pub const HEADER_LEN: usize = 4;

/// One newline-delimited message, as MCP's stdio transport frames them ([`read_line`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    /// The line, without its newline.
    Text(Vec<u8>),
    /// Over the limit: this many bytes were read and dropped, up to the newline.
    TooLong(usize),
    /// The end of the input, with no partial line.
    Eof,
}

/// Reads one line of at most `max` bytes; a longer line is read through and dropped without
/// being held, so a peer cannot make the reader buffer an unbounded message.
pub async fn read_line<R: AsyncBufRead + Unpin>(r: &mut R, max: usize) -> io::Result<Line> {
    let (mut buf, mut seen, mut over) = (Vec::new(), 0usize, false);
    loop {
        let avail = r.fill_buf().await?;
        if avail.is_empty() {
            return Ok(match (seen, over) {
                (0, _) => Line::Eof,
                (n, true) => Line::TooLong(n),
                _ => Line::Text(buf),
            });
        }
        let newline = avail.iter().position(|b| *b == b'\n');
        let chunk = &avail[..newline.unwrap_or(avail.len())];
        seen += chunk.len();
        if !over && buf.len() + chunk.len() > max {
            over = true;
            buf = Vec::new();
        }
        if !over {
            buf.extend_from_slice(chunk);
        }
        let used = newline.map_or(avail.len(), |i| i + 1);
        r.consume(used);
        if newline.is_some() {
            return Ok(if over { Line::TooLong(seen) } else { Line::Text(buf) });
        }
    }
}

/// Encodes and decodes length-prefixed frames with a fixed maximum payload length.
///
/// The codec holds no buffers and no I/O handle; every call works on the reader or writer
/// it is handed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameCodec {
    max_len: u32,
}

/// Reading a frame failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The peer announced a payload longer than this codec accepts; nothing was allocated.
    #[error("frame of {len} bytes exceeds the maximum of {max} bytes")]
    #[non_exhaustive]
    TooLarge {
        /// The announced payload length.
        len: u32,
        /// The codec's maximum.
        max: u32,
    },
    /// The stream ended inside a frame (in the header or in the payload).
    #[error("stream ended after {got} of {expected} bytes of a frame")]
    #[non_exhaustive]
    Truncated {
        /// How many bytes the frame (header or payload) needed.
        expected: usize,
        /// How many arrived before the end of the stream.
        got: usize,
    },
    /// The underlying reader failed.
    #[error("i/o error while reading a frame")]
    Io(#[source] io::Error),
}

/// Writing a frame failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// The payload is longer than this codec may send; nothing was written.
    #[error("payload of {len} bytes exceeds the maximum frame of {max} bytes")]
    #[non_exhaustive]
    TooLarge {
        /// The payload length.
        len: usize,
        /// The codec's maximum.
        max: u32,
    },
    /// The underlying writer failed.
    #[error("i/o error while writing a frame")]
    Io(#[source] io::Error),
}

impl Default for FrameCodec {
    /// A codec with the [`MAX_FRAME_LEN`] maximum.
    fn default() -> Self {
        Self::new(MAX_FRAME_LEN)
    }
}

impl FrameCodec {
    /// A codec that accepts payloads of at most `max_len` bytes.
    #[must_use]
    pub const fn new(max_len: u32) -> Self {
        Self { max_len }
    }

    /// The largest payload this codec reads or writes.
    #[must_use]
    pub const fn max_len(&self) -> u32 {
        self.max_len
    }

    /// Checks `len` against the maximum and returns the 4-byte header for it.
    fn header(&self, len: usize) -> Result<[u8; HEADER_LEN], EncodeError> {
        match u32::try_from(len) {
            Ok(n) if n <= self.max_len => Ok(n.to_be_bytes()),
            _ => Err(EncodeError::TooLarge { len, max: self.max_len }),
        }
    }

    /// Checks an announced length before anything is allocated.
    fn announced(&self, header: [u8; HEADER_LEN]) -> Result<usize, DecodeError> {
        let len = u32::from_be_bytes(header);
        if len > self.max_len {
            return Err(DecodeError::TooLarge { len, max: self.max_len });
        }
        usize::try_from(len).map_err(|_| DecodeError::TooLarge { len, max: self.max_len })
    }

    /// Turns a header read of `got` bytes into an empty payload buffer of the announced
    /// length: `None` on a clean end of stream, an error if the header was cut short or
    /// announces too much.
    fn start(&self, header: [u8; HEADER_LEN], got: usize) -> Result<Option<Payload>, DecodeError> {
        match got {
            0 => Ok(None),
            n if n < HEADER_LEN => Err(DecodeError::Truncated { expected: HEADER_LEN, got: n }),
            _ => self.announced(header).map(|len| Some(Payload::new(len))),
        }
    }

    /// Writes one frame to `w`. Fails without writing anything if the payload is too long.
    pub fn write_frame<W: Write>(&self, w: &mut W, payload: &[u8]) -> Result<(), EncodeError> {
        let header = self.header(payload.len())?;
        w.write_all(&header).map_err(EncodeError::Io)?;
        w.write_all(payload).map_err(EncodeError::Io)?;
        Ok(())
    }

    /// Appends one encoded frame to `out`. Fails without touching `out` if the payload is too long.
    pub fn encode_into(&self, payload: &[u8], out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let header = self.header(payload.len())?;
        out.reserve(HEADER_LEN + payload.len());
        out.extend_from_slice(&header);
        out.extend_from_slice(payload);
        Ok(())
    }

    /// Reads one frame from `r`.
    ///
    /// Returns `Ok(None)` on a clean end of stream before the first header byte, and
    /// [`DecodeError::Truncated`] if the stream ends anywhere inside a frame.
    pub fn read_frame<R: Read>(&self, r: &mut R) -> Result<Option<Vec<u8>>, DecodeError> {
        let mut header = [0u8; HEADER_LEN];
        let got = fill(r, &mut header)?;
        let Some(mut payload) = self.start(header, got)? else { return Ok(None) };
        while let Some(chunk) = payload.next_chunk() {
            let got = fill(r, chunk)?;
            payload.commit(got)?;
        }
        Ok(Some(payload.finish()))
    }

    /// Decodes one frame from the front of `buf` without copying more than the payload.
    ///
    /// Returns the payload and the number of bytes consumed, `Ok(None)` if `buf` does not yet
    /// hold a whole frame, or [`DecodeError::TooLarge`] as soon as the header is complete.
    pub fn decode_slice<'a>(&self, buf: &'a [u8]) -> Result<Option<(&'a [u8], usize)>, DecodeError> {
        let Some((header, rest)) = buf.split_first_chunk::<HEADER_LEN>() else {
            return Ok(None);
        };
        let len = self.announced(*header)?;
        Ok(rest.get(..len).map(|payload| (payload, HEADER_LEN + len)))
    }

    /// Writes one frame to an async writer. Fails without writing anything if the payload is too long.
    pub async fn write_frame_async<W: AsyncWrite + Unpin>(&self, w: &mut W, payload: &[u8]) -> Result<(), EncodeError> {
        let header = self.header(payload.len())?;
        w.write_all(&header).await.map_err(EncodeError::Io)?;
        w.write_all(payload).await.map_err(EncodeError::Io)?;
        Ok(())
    }

    /// Reads one frame from an async reader, with the same bounds and errors as [`read_frame`](Self::read_frame).
    pub async fn read_frame_async<R: AsyncRead + Unpin>(&self, r: &mut R) -> Result<Option<Vec<u8>>, DecodeError> {
        let mut header = [0u8; HEADER_LEN];
        let got = fill_async(r, &mut header).await?;
        let Some(mut payload) = self.start(header, got)? else { return Ok(None) };
        while let Some(chunk) = payload.next_chunk() {
            let got = fill_async(r, chunk).await?;
            payload.commit(got)?;
        }
        Ok(Some(payload.finish()))
    }
}

/// A payload buffer that grows by at most [`READ_CHUNK`] per step, as bytes arrive.
struct Payload {
    buf: Vec<u8>,
    len: usize,
    /// Length of the buffer before the chunk handed out last.
    start: usize,
}

impl Payload {
    fn new(len: usize) -> Self {
        Self { buf: Vec::new(), len, start: 0 }
    }

    /// The next zeroed chunk to fill, or `None` once the payload is complete.
    fn next_chunk(&mut self) -> Option<&mut [u8]> {
        self.start = self.buf.len();
        let step = (self.len - self.start).min(READ_CHUNK);
        if step == 0 {
            return None;
        }
        self.buf.reserve_exact(step);
        self.buf.resize(self.start + step, 0);
        Some(&mut self.buf[self.start..])
    }

    /// Records that `got` bytes of the last chunk arrived; a short chunk means the stream ended.
    fn commit(&mut self, got: usize) -> Result<(), DecodeError> {
        if self.start + got < self.buf.len() {
            return Err(DecodeError::Truncated { expected: self.len, got: self.start + got });
        }
        Ok(())
    }

    fn finish(self) -> Vec<u8> {
        self.buf
    }
}

/// Reads until `buf` is full or the stream ends; returns how many bytes were read.
fn fill<R: Read>(r: &mut R, buf: &mut [u8]) -> Result<usize, DecodeError> {
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(DecodeError::Io(e)),
        }
    }
    Ok(filled)
}

/// Async twin of [`fill`].
async fn fill_async<R: AsyncRead + Unpin>(r: &mut R, buf: &mut [u8]) -> Result<usize, DecodeError> {
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(&mut buf[filled..]).await {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(DecodeError::Io(e)),
        }
    }
    Ok(filled)
}
