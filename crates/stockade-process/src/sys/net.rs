//! The run's loopback interface, for a model grant's listener (see `helper`).

use std::io;

/// Brings `lo` up in the calling process's network namespace (`SIOCSIFFLAGS` with
/// `IFF_UP | IFF_LOOPBACK | IFF_RUNNING`); needs `CAP_NET_ADMIN` over that namespace, which
/// the helper has in the user namespace it just created.
pub(crate) fn loopback_up() -> io::Result<()> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: socket takes integers only.
    let fd = super::check(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: the kernel just returned this descriptor; we own it and close it on drop.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: an all-zero ifreq is a valid value of this plain C struct (empty name, no flags).
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo") {
        *dst = *src as libc::c_char;
    }
    req.ifr_ifru.ifru_flags = (libc::IFF_UP | libc::IFF_LOOPBACK | libc::IFF_RUNNING) as libc::c_short;
    // SAFETY: SIOCSIFFLAGS reads one ifreq, which lives on this frame and is NUL-terminated
    // (the name is two bytes of a zeroed sixteen-byte array).
    super::check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) }).map(drop)
}

/// Listens on `127.0.0.1:port` in the network namespace of process `pid` (a container's),
/// from a short-lived thread that joins that namespace (`setns` changes only the calling
/// thread's network namespace) and ends; the listening socket stays in that namespace.
/// Needs `CAP_SYS_ADMIN` over the namespace's owner (root, for an engine's containers).
///
/// The process is pinned with a pidfd before its namespace is opened, and must still be
/// alive once it is: so the namespace opened is that process's, not a later one's that took
/// its pid (the caller, which got `pid` from elsewhere, checks the pid was still its own
/// after this returns). A namespace that is this process's own is refused: the listener
/// would be on the host's loopback.
pub(crate) fn listen_in_netns(pid: u32, port: u16) -> io::Result<std::net::TcpListener> {
    in_netns(pid, move || std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, port)))
}

/// Connects to `127.0.0.1:port` in the network namespace of process `pid` (a session's
/// init), the way [`listen_in_netns`] listens there: the socket is made in that namespace,
/// so its loopback is the session's own. A connect on loopback does not wait: nothing
/// listening is `ECONNREFUSED` at once.
pub(crate) fn connect_in_netns(pid: u32, port: u16) -> io::Result<std::net::TcpStream> {
    in_netns(pid, move || {
        std::net::TcpStream::connect_timeout(
            &(std::net::Ipv4Addr::LOCALHOST, port).into(),
            std::time::Duration::from_secs(5),
        )
    })
}

/// Runs `f` on a short-lived thread in the network namespace of process `pid` (pinned by a
/// pidfd, alive after its namespace was opened, and not this process's own namespace).
fn in_netns<T: Send + 'static>(pid: u32, f: impl FnOnce() -> io::Result<T> + Send + 'static) -> io::Result<T> {
    use std::os::fd::{AsFd, AsRawFd};
    use std::os::unix::fs::MetadataExt;
    let raw = libc::pid_t::try_from(pid).map_err(|_| io::Error::other(format!("pid {pid} is out of range")))?;
    let pinned = super::process::pidfd_open(raw)?;
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/net"))?;
    if super::fs::polls_ready(pinned.as_fd()) {
        return Err(io::Error::other(format!("process {pid} ended before its network namespace was opened")));
    }
    let (theirs, ours) = (ns.metadata()?, std::fs::metadata("/proc/self/ns/net")?);
    if (theirs.dev(), theirs.ino()) == (ours.dev(), ours.ino()) {
        return Err(io::Error::other(format!(
            "process {pid} is in this process's own network namespace: a socket there would be on the host's loopback"
        )));
    }
    std::thread::spawn(move || {
        // SAFETY: setns takes a descriptor we hold open and a flag; it changes only this
        // thread's network namespace, and this thread does nothing else before it ends.
        super::check(unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) })?;
        f()
    })
    .join()
    .map_err(|_| io::Error::other("the namespace thread panicked"))?
}
