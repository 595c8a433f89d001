//! Where a connection's peer has read to (issue 23.10): for a connection that said
//! `ack: false`, a DELIVER counts as handed over only once its peer has read it off the
//! socket. Written is not enough: bytes sitting in the peer's receive queue when it closes are
//! thrown away by the kernel, and were recorded "acknowledged by the recipient" before.
//!
//! On Linux a Unix stream socket's `SIOCOUTQ` is what it has written that the peer has not
//! read yet (counted in the kernel's buffer sizes, which are never less than the bytes they
//! hold: a conservative answer). A peer that closes empties that queue too, so the answer is
//! trusted only while the peer is still there, checked after it is read.

use std::os::fd::AsFd;

/// Bytes written on `fd` (a Unix stream socket) so far: `written`. How far into them the peer
/// has surely read, or `None` if that cannot be known (the peer has shut down or gone; the
/// query failed): then nothing more counts as read.
#[cfg(target_os = "linux")]
pub(crate) fn read_through(fd: impl AsFd, written: u64) -> Option<u64> {
    let fd = fd.as_fd();
    let pending = pending_bytes(fd)?;
    if peer_gone(fd) {
        return None;
    }
    Some(written.saturating_sub(pending))
}

/// Elsewhere there is no way to ask: what is written counts as read (the behaviour before).
#[cfg(not(target_os = "linux"))]
pub(crate) fn read_through(_fd: impl AsFd, written: u64) -> Option<u64> {
    Some(written)
}

/// `SIOCOUTQ`: what `fd` wrote that its peer has not read yet.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn pending_bytes(fd: std::os::fd::BorrowedFd<'_>) -> Option<u64> {
    use rustix::ioctl::{BadOpcode, Getter, ioctl};
    /// `SIOCOUTQ` (the same number as `TIOCOUTQ`).
    const SIOCOUTQ: rustix::ioctl::RawOpcode = 0x5411;
    // SAFETY: SIOCOUTQ on a socket writes one `int` through the pointer, which is what the
    // `Getter` provides; `fd` is a live socket borrowed for the call.
    let got = unsafe { ioctl(fd, Getter::<BadOpcode<SIOCOUTQ>, std::ffi::c_int>::new()) };
    match got {
        Ok(n) => u64::try_from(n).ok(),
        Err(e) => {
            tracing::debug!(error = %e, "SIOCOUTQ failed; nothing more counts as read");
            None
        }
    }
}

/// Whether the peer has shut down or closed (`POLLRDHUP`/`POLLHUP`): from then on an empty
/// queue may be one the kernel emptied, not one the peer read.
#[cfg(target_os = "linux")]
fn peer_gone(fd: std::os::fd::BorrowedFd<'_>) -> bool {
    use rustix::event::{PollFd, PollFlags, poll};
    let mut fds = [PollFd::new(&fd, PollFlags::RDHUP)];
    match poll(&mut fds, 0) {
        Ok(_) => fds[0]
            .revents()
            .intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR),
        Err(e) => {
            tracing::debug!(error = %e, "poll failed; taking the peer as gone");
            true
        }
    }
}
