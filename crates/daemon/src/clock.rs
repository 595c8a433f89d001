//! Wall-clock time and frame ids: the one place the daemon reads the system clock, so the pure
//! cores can take time as an argument.

use std::sync::atomic::{AtomicU64, Ordering};

/// The workspace's one clock ([`relay_protocol::now_ms`]), named here so the daemon's shells
/// read time through this module.
pub(crate) use relay_protocol::now_ms;

static NEXT_FRAME: AtomicU64 = AtomicU64::new(1);

/// An id for a frame the daemon originates (ACK, PING, WELCOME...). Unique within this daemon
/// process; prefixed so it can never be mistaken for a client's message id.
pub(crate) fn frame_id() -> String {
    format!(
        "d{}-{}",
        std::process::id(),
        NEXT_FRAME.fetch_add(1, Ordering::Relaxed)
    )
}
