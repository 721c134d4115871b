//! Seeing a client hang up while hyper is busy writing to it.
//!
//! hyper reads a connection only between requests, so a client that leaves during a stream
//! (a command's, a directory watch's) would be noticed only when a write to it failed, and
//! what the stream holds would stay held until then; Go's server, envd's, notices the same
//! way. [`peer_closed`] watches a second descriptor of the socket for the client's FIN or
//! reset while hyper owns the first.
//!
//! That second descriptor is made only once the connection has authenticated ([`Watched`]):
//! an unauthenticated connection cannot start a stream, and a flood of idle anonymous
//! connections must cost the server one descriptor each, not two.

use std::io::IoSlice;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::oneshot;

use super::ConnState;

/// A connection's byte stream, and the socket under it.
pub(crate) trait Socket: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    fn socket(&self) -> BorrowedFd<'_>;
}

impl Socket for tokio::net::TcpStream {
    fn socket(&self) -> BorrowedFd<'_> {
        self.as_fd()
    }
}

#[cfg(feature = "tls")]
impl Socket for tokio_rustls::server::TlsStream<tokio::net::TcpStream> {
    fn socket(&self) -> BorrowedFd<'_> {
        self.get_ref().0.as_fd()
    }
}

/// A connection as hyper sees it. On its first write after the connection authenticated
/// (the response to that request), it hands a duplicate of its socket to [`peer_closed`].
pub(crate) struct Watched<I> {
    io: I,
    conn: Arc<ConnState>,
    peer: Option<oneshot::Sender<OwnedFd>>,
}

impl<I: Socket> Watched<I> {
    pub(crate) fn new(io: I, conn: Arc<ConnState>, peer: oneshot::Sender<OwnedFd>) -> Self {
        Watched { io, conn, peer: Some(peer) }
    }

    /// The connection's standing.
    pub(crate) fn conn(&self) -> Arc<ConnState> {
        Arc::clone(&self.conn)
    }

    fn hand_over(&mut self) {
        if self.peer.is_some() && self.conn.is_authed() {
            let peer = self.peer.take();
            // Without a descriptor to spare, the hang-up is seen at the next failed write.
            if let (Some(tx), Ok(fd)) = (peer, self.io.socket().try_clone_to_owned()) {
                let _ = tx.send(fd);
            }
        }
    }
}

impl<I: Socket> AsyncRead for Watched<I> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<I: Socket> AsyncWrite for Watched<I> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.hand_over();
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.hand_over();
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Ends when the client closes its side of the connection (its FIN, or a reset), seen on
/// the descriptor [`Watched`] hands over once the connection authenticated. Never ends
/// before that, nor if the socket cannot be watched.
pub(crate) async fn peer_closed(fd: oneshot::Receiver<OwnedFd>) {
    let watched = fd.await.ok().and_then(|fd| stockade_runtime::process::async_readable(fd).ok());
    let Some(afd) = watched else { return std::future::pending().await };
    loop {
        let Ok(mut ready) = afd.readable().await else { return std::future::pending().await };
        if ready.ready().is_read_closed() {
            return;
        }
        // Data (the next request) is hyper's to read: wait for the next change.
        ready.clear_ready_matching(tokio::io::Ready::READABLE);
    }
}
