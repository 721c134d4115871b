//! Bounded capture of a byte stream (a guest's stdout or stderr).
//!
//! A capture keeps at most `limit` bytes and, in [`CaptureMode::Drain`], keeps reading and
//! counting after that so the writer never blocks on a full pipe. In
//! [`CaptureMode::FailFast`] it stops at the first byte past the limit and reports
//! [`Flow::OverBudget`], so a tier can kill the writer at once. Either way the host holds
//! at most `limit` bytes plus one read buffer of [`CAPTURE_BUF_LEN`], however long the
//! stream runs.

use std::io::{self, Read};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Size of the read buffer a capture driver allocates once per stream.
///
/// The guest decides how much it writes; the host's memory for one stream is this buffer
/// plus the kept prefix, never the stream's length.
pub const CAPTURE_BUF_LEN: usize = 64 * 1024;

/// What a capture does when the stream goes over its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum CaptureMode {
    /// Keep the first `limit` bytes, count and discard the rest, and read to the end.
    Drain,
    /// Stop reading at the first byte over the limit and report [`Flow::OverBudget`].
    FailFast,
}

/// Whether the caller should keep feeding a [`BoundedSink`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "an over-budget signal is how a tier learns to kill the writer"]
pub enum Flow {
    /// Within budget, or over budget in drain mode: keep reading.
    Continue,
    /// The limit was crossed in fail-fast mode: stop reading and stop the writer.
    OverBudget,
}

/// The captured prefix of a stream and what was seen of the whole.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Captured {
    /// The kept prefix, at most the capture's limit.
    #[serde(with = "crate::bytes_repr")]
    pub bytes: Vec<u8>,
    /// How many bytes the stream delivered before the capture stopped reading.
    pub seen: u64,
    /// True if `seen` exceeds the kept prefix, i.e. bytes were dropped.
    pub truncated: bool,
}

impl Captured {
    /// A capture record with the given fields; `truncated` is derived from the counts.
    #[must_use]
    pub fn new(bytes: Vec<u8>, seen: u64) -> Self {
        let truncated = seen > bytes.len() as u64;
        Self { bytes, seen, truncated }
    }
}

/// A push-based bounded buffer, for tiers that drive their own reads.
#[derive(Debug)]
pub struct BoundedSink {
    limit: usize,
    mode: CaptureMode,
    bytes: Vec<u8>,
    seen: u64,
}

impl BoundedSink {
    /// A sink that keeps at most `limit` bytes.
    #[must_use]
    pub fn new(limit: usize, mode: CaptureMode) -> Self {
        Self { limit, mode, bytes: Vec::new(), seen: 0 }
    }

    /// Feeds one chunk. Keeps what fits under the limit and counts the rest.
    pub fn push(&mut self, chunk: &[u8]) -> Flow {
        self.seen = self.seen.saturating_add(chunk.len() as u64);
        let room = self.limit - self.bytes.len();
        let keep = room.min(chunk.len());
        self.bytes.extend_from_slice(&chunk[..keep]);
        if keep < chunk.len() && self.mode == CaptureMode::FailFast { Flow::OverBudget } else { Flow::Continue }
    }

    /// True once more bytes were seen than kept.
    #[must_use]
    pub fn over_limit(&self) -> bool {
        self.seen > self.bytes.len() as u64
    }

    /// Bytes seen so far.
    #[must_use]
    pub fn seen(&self) -> u64 {
        self.seen
    }

    /// The capture record so far.
    #[must_use]
    pub fn finish(self) -> Captured {
        Captured::new(self.bytes, self.seen)
    }
}

/// Reading the stream failed; what was captured before the failure is kept.
#[derive(Debug, thiserror::Error)]
#[error("i/o error after {} bytes of captured stream", captured.seen)]
#[non_exhaustive]
pub struct CaptureError {
    /// The underlying error.
    #[source]
    pub source: io::Error,
    /// Everything captured before the error.
    pub captured: Captured,
}

/// How a capture driver ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "an over-budget capture means the writer must be stopped"]
#[non_exhaustive]
pub struct CaptureEnd {
    /// The capture record.
    pub captured: Captured,
    /// [`Flow::OverBudget`] if a fail-fast capture stopped at its limit.
    pub flow: Flow,
}

/// Reads `reader` to its end (or, in fail-fast mode, to the first byte over `limit`).
pub fn capture<R: Read>(reader: &mut R, limit: usize, mode: CaptureMode) -> Result<CaptureEnd, CaptureError> {
    let mut sink = BoundedSink::new(limit, mode);
    let mut buf = vec![0u8; CAPTURE_BUF_LEN];
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => return Ok(end(sink, Flow::Continue)),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(source) => return Err(failed(sink, source)),
        };
        if sink.push(&buf[..n]) == Flow::OverBudget {
            return Ok(end(sink, Flow::OverBudget));
        }
    }
}

/// A run's live stdio, beside the job's own bytes: a stream the guest's stdin is read from
/// as the guest reads it (instead of the job's stdin bytes), and writers that see the
/// guest's stderr and stdout as they arrive (the report still captures both, bounded).
#[derive(Default)]
pub struct LiveIo {
    /// The guest's stdin, streamed.
    pub stdin: Option<Box<dyn AsyncRead + Send + Unpin>>,
    /// A live copy of the guest's stderr.
    pub stderr: Option<Box<dyn std::io::Write + Send>>,
    /// A live copy of the guest's stdout (unverified output: for a caller that shows it as
    /// it comes, as a session's exec does; `stockade run` does not).
    pub stdout: Option<Box<dyn std::io::Write + Send>>,
    /// What paces the reading of stdout and stderr to the copies' consumers (see [`Pace`]);
    /// without it the copies are written as fast as the guest writes.
    pub pace: Option<std::sync::Arc<dyn Pace>>,
}

/// Paces a stream's reading to its slowest live consumer: [`capture_tee_async`] awaits
/// [`Pace::ready`] after each chunk it hands its tee, so a consumer that falls behind stops
/// the reading, the pipe fills and the writer (the guest) blocks on its write. The host
/// holds what the consumers have not taken up to the implementation's bound, never the
/// stream's length, and no reader runs ahead of a consumer by more than that.
pub trait Pace: Send + Sync {
    /// Resolves once the consumers have room for more.
    fn ready(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>>;
}

impl LiveIo {
    /// Whether this stdio can serve `job`: a streamed stdin replaces the job's stdin bytes,
    /// so a job that has its own is refused (`Err`: why).
    pub fn check(&self, job: &crate::Job) -> Result<(), &'static str> {
        if self.stdin.is_some() && !job.stdin().is_empty() {
            return Err("the job has stdin bytes of its own and a streamed stdin");
        }
        Ok(())
    }
}

impl std::fmt::Debug for LiveIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveIo")
            .field("stdin", &self.stdin.is_some())
            .field("stderr", &self.stderr.is_some())
            .field("stdout", &self.stdout.is_some())
            .field("pace", &self.pace.is_some())
            .finish()
    }
}

/// Async twin of [`capture`].
pub async fn capture_async<R: AsyncRead + Unpin>(
    reader: &mut R,
    limit: usize,
    mode: CaptureMode,
) -> Result<CaptureEnd, CaptureError> {
    capture_tee_async(reader, limit, mode, None, None).await
}

/// [`capture_async`], also writing each chunk read to `tee` as it arrives (a live view of
/// the stream, such as a CLI's stderr). A failing `tee` is dropped from then on; the
/// capture goes on. With `pace`, the next read waits until the tee's consumers have room
/// ([`Pace`]), so a slow consumer back-pressures the writer instead of growing the host.
pub async fn capture_tee_async<R: AsyncRead + Unpin>(
    reader: &mut R,
    limit: usize,
    mode: CaptureMode,
    mut tee: Option<Box<dyn std::io::Write + Send>>,
    pace: Option<&dyn Pace>,
) -> Result<CaptureEnd, CaptureError> {
    let mut sink = BoundedSink::new(limit, mode);
    let mut buf = vec![0u8; CAPTURE_BUF_LEN];
    loop {
        let n = match reader.read(&mut buf).await {
            Ok(0) => return Ok(end(sink, Flow::Continue)),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(source) => return Err(failed(sink, source)),
        };
        if let Some(w) = tee.as_mut()
            && w.write_all(&buf[..n]).and_then(|()| w.flush()).is_err()
        {
            tee = None;
        }
        if sink.push(&buf[..n]) == Flow::OverBudget {
            return Ok(end(sink, Flow::OverBudget));
        }
        if let (Some(p), Some(_)) = (pace, tee.as_ref()) {
            p.ready().await;
        }
    }
}

fn end(sink: BoundedSink, flow: Flow) -> CaptureEnd {
    CaptureEnd { captured: sink.finish(), flow }
}

fn failed(sink: BoundedSink, source: io::Error) -> CaptureError {
    CaptureError { source, captured: sink.finish() }
}
