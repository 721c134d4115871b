//! One message with descriptors over a unix socket (`SCM_RIGHTS`), through rustix's safe
//! `sendmsg`/`recvmsg`: the fork server's requests and a session's exec requests.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer, SendAncillaryMessage,
    SendFlags,
};

/// Most descriptors one message carries.
pub(crate) const MAX_FDS: usize = 5;

/// Sends `bytes` with `fds` (at most [`MAX_FDS`]) as one message, retrying on EINTR.
pub(crate) fn send(sock: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut cmsg = SendAncillaryBuffer::new(&mut space);
    if fds.len() > MAX_FDS || !cmsg.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("too many descriptors for one message"));
    }
    loop {
        match rustix::net::sendmsg(sock, &[IoSlice::new(bytes)], &mut cmsg, SendFlags::NOSIGNAL) {
            Ok(_) => return Ok(()),
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// One received message: its length in the buffer, its descriptors (close-on-exec), and
/// whether the message or its descriptors were cut short (a sender over the limits).
pub(crate) struct Received {
    pub(crate) len: usize,
    pub(crate) fds: Vec<OwnedFd>,
    pub(crate) truncated: bool,
}

/// Receives one message into `buf`, retrying on EINTR. A zero-length message with no
/// descriptor is the peer's end.
pub(crate) fn recv(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Received> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut cmsg = RecvAncillaryBuffer::new(&mut space);
    let msg = loop {
        match rustix::net::recvmsg(sock, &mut [IoSliceMut::new(buf)], &mut cmsg, RecvFlags::CMSG_CLOEXEC) {
            Ok(m) => break m,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    };
    let fds: Vec<OwnedFd> = cmsg
        .drain()
        .filter_map(|m| match m {
            RecvAncillaryMessage::ScmRights(fds) => Some(fds),
            _ => None,
        })
        .flatten()
        .collect();
    Ok(Received { len: msg.bytes, fds, truncated: msg.flags.intersects(ReturnFlags::TRUNC | ReturnFlags::CTRUNC) })
}
