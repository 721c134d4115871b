//! Pseudo-terminals: a private pty pair for a run that asked for a terminal.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::check;

/// The window size (rows, columns) of the terminal on `fd`, if it is one and has a size.
pub(crate) fn window_size(fd: BorrowedFd<'_>) -> Option<(u16, u16)> {
    let w = rustix::termios::tcgetwinsize(fd).ok()?;
    (w.ws_row > 0 && w.ws_col > 0).then_some((w.ws_row, w.ws_col))
}

/// A new pty: the master (for the supervisor) and the slave (the guest's stdin, stdout and
/// stderr), with the window size `size` (rows, columns), or 0x0. Without `echo`, echo is off,
/// so a run's stdin, typed in whole, does not reappear as its output; with it, the line
/// discipline is the kernel's default, as a terminal someone types into has it.
pub(crate) fn open_pty(size: Option<(u16, u16)>, echo: bool) -> io::Result<(OwnedFd, OwnedFd)> {
    let master: OwnedFd = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY | libc::O_CLOEXEC)
        .open("/dev/ptmx")?
        .into();
    let unlock: libc::c_int = 0;
    // SAFETY: TIOCSPTLCK reads one int, which lives on this frame.
    check(unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSPTLCK, &unlock) })?;
    // SAFETY: TIOCGPTPEER takes open flags by value and returns a new descriptor for the
    // slave side of this master (no path lookup, so no other pty can be named).
    let slave = check(unsafe {
        libc::ioctl(master.as_raw_fd(), libc::TIOCGPTPEER, libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC)
    })?;
    // SAFETY: the kernel just returned this descriptor; we own it.
    let slave = unsafe { OwnedFd::from_raw_fd(slave) };
    if !echo {
        // SAFETY: an all-zero termios is a valid value of this plain C struct; tcgetattr fills it.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: tcgetattr writes one termios into `t`, which lives on this frame.
        check(unsafe { libc::tcgetattr(slave.as_raw_fd(), &mut t) })?;
        t.c_lflag &= !(libc::ECHO | libc::ECHONL);
        // SAFETY: tcsetattr reads one termios from `t`.
        check(unsafe { libc::tcsetattr(slave.as_raw_fd(), libc::TCSANOW, &t) })?;
    }
    if let Some((rows, cols)) = size {
        set_window_size(master.as_fd(), rows, cols)?;
    }
    Ok((master, slave))
}

/// Sets the window size (rows, columns) of the terminal whose master (or slave) is `fd`;
/// the kernel signals its foreground process group `SIGWINCH`.
pub(crate) fn set_window_size(fd: BorrowedFd<'_>, ws_row: u16, ws_col: u16) -> io::Result<()> {
    rustix::termios::tcsetwinsize(fd, rustix::termios::Winsize { ws_row, ws_col, ws_xpixel: 0, ws_ypixel: 0 })
        .map_err(io::Error::from)
}

/// Makes the terminal on `fd` the calling process's controlling terminal (after `setsid`).
pub(crate) fn set_controlling(fd: RawFd) -> io::Result<()> {
    // SAFETY: TIOCSCTTY takes an integer (0: do not steal) and touches no memory of ours.
    check(unsafe { libc::ioctl(fd, libc::TIOCSCTTY, 0) }).map(drop)
}

/// The master side of a pty, read and written asynchronously. Reading ends (`Ok(0)`) when
/// every slave descriptor is closed, which the kernel reports as EIO.
pub(crate) struct Master(AsyncFd<File>);

impl Master {
    pub(crate) fn new(fd: OwnedFd) -> io::Result<Self> {
        // SAFETY: F_GETFL/F_SETFL take integers; the descriptor is ours.
        let flags = check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
        // SAFETY: as above.
        check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) })?;
        register(File::from(fd))
    }

    /// A second handle on the same master (for the stdin writer).
    pub(crate) fn try_clone(&self) -> io::Result<Self> {
        register(self.0.get_ref().try_clone()?)
    }

    /// A plain descriptor for the same master (for its window size).
    pub(crate) fn raw_clone(&self) -> io::Result<OwnedFd> {
        self.0.get_ref().try_clone().map(OwnedFd::from)
    }
}

fn register(file: File) -> io::Result<Master> {
    // SAFETY: the `File` owns one open descriptor for its whole life, `as_raw_fd` always
    // returns that number, and it is closed only when the `AsyncFd` drops it.
    unsafe { AsyncFd::register(file) }.map(Master).map_err(|e| e.into())
}

fn raw_read(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: read writes at most `buf.len()` bytes into `buf`, which we borrow mutably.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 { Err(io::Error::last_os_error()) } else { Ok(n as usize) }
}

fn raw_write(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: write reads at most `buf.len()` bytes from `buf`.
    let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
    if n < 0 { Err(io::Error::last_os_error()) } else { Ok(n as usize) }
}

impl AsyncRead for Master {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.0.poll_read_ready(cx))?;
            match guard.try_io(|fd| raw_read(fd.get_ref().as_raw_fd(), buf.initialize_unfilled())) {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                // Every slave descriptor is closed: the end of the output.
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Poll::Ready(Ok(())),
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => {}
            }
        }
    }
}

impl AsyncWrite for Master {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = ready!(self.0.poll_write_ready(cx))?;
            match guard.try_io(|fd| raw_write(fd.get_ref().as_raw_fd(), buf)) {
                Ok(r) => return Poll::Ready(r),
                Err(_would_block) => {}
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Puts the terminal on `fd` in raw mode (no line editing, echo or signal keys: each byte
/// goes through as typed); returns its settings before, for [`restore`].
pub(crate) fn make_raw(fd: BorrowedFd<'_>) -> io::Result<rustix::termios::Termios> {
    let saved = rustix::termios::tcgetattr(fd)?;
    let mut raw = saved.clone();
    raw.make_raw();
    rustix::termios::tcsetattr(fd, rustix::termios::OptionalActions::Now, &raw)?;
    Ok(saved)
}

/// Gives the terminal on `fd` the settings `saved` back.
pub(crate) fn restore(fd: BorrowedFd<'_>, saved: &rustix::termios::Termios) -> io::Result<()> {
    rustix::termios::tcsetattr(fd, rustix::termios::OptionalActions::Now, saved).map_err(io::Error::from)
}
