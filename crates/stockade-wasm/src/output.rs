//! Output streams that keep at most their budget and trap on the write that crosses it.
//!
//! wasmtime's `MemoryOutputPipe` returns an error at capacity, and a guest that ignores it
//! keeps running until a CPU fence fires. A budget here ends the run at once: the write
//! that does not fit keeps the prefix that does, records how many bytes the guest tried to
//! write, and returns `StreamError::Trap`.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::Bytes;
use stockade_protocol::Captured;
use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError, StreamResult};

#[derive(Debug, Default)]
struct State {
    bytes: Vec<u8>,
    seen: u64,
    over: bool,
}

/// A capped, trapping output stream. Clones share the buffer.
#[derive(Debug, Clone)]
pub(crate) struct CappedOut {
    cap: usize,
    state: Arc<Mutex<State>>,
}

impl CappedOut {
    pub(crate) fn new(cap: u64) -> Self {
        Self { cap: usize::try_from(cap).unwrap_or(usize::MAX), state: Arc::default() }
    }

    /// Appends what fits; returns false when `bytes` did not fit entirely.
    fn push(&self, bytes: &[u8]) -> bool {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.seen = s.seen.saturating_add(bytes.len() as u64);
        let room = self.cap.saturating_sub(s.bytes.len());
        if bytes.len() <= room && !s.over {
            s.bytes.extend_from_slice(bytes);
            return true;
        }
        let keep = room.min(bytes.len());
        s.bytes.extend_from_slice(&bytes[..keep]);
        s.over = true;
        false
    }

    /// Whether a write crossed the budget.
    pub(crate) fn over(&self) -> bool {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).over
    }

    /// What was captured: the prefix that fit, and every byte the guest tried to write.
    pub(crate) fn captured(&self) -> Captured {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let bytes = std::mem::take(&mut s.bytes);
        let seen = s.seen.max(bytes.len() as u64);
        Captured::new(bytes, seen)
    }
}

impl OutputStream for CappedOut {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        if self.push(&bytes) { Ok(()) } else { Err(StreamError::trap("output budget exceeded")) }
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        // Always report room, so that the write that crosses the budget reaches `write`
        // and traps, instead of the guest spinning on a stream that never drains.
        Ok(1 << 20)
    }
}

#[async_trait::async_trait]
impl Pollable for CappedOut {
    async fn ready(&mut self) {}
}

impl IsTerminal for CappedOut {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CappedOut {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

impl AsyncWrite for CappedOut {
    fn poll_write(self: Pin<&mut Self>, _cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.push(buf) {
            Poll::Ready(Ok(buf.len()))
        } else {
            Poll::Ready(Err(io::Error::new(io::ErrorKind::StorageFull, "output budget exceeded")))
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
