//! Wall-clock time and frame ids: the one place the daemon reads the system clock, so the pure
//! cores can take time as an argument.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (0 if the clock is before 1970).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

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
