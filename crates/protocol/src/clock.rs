//! The wall clock, in the unit the protocol uses (`ts` is Unix milliseconds).
//!
//! The one definition of "now" for every crate. Only I/O shells call it: pure cores (the
//! session state machine, the store's `write_batch`, rate limits) take the time as an argument
//! so that tests can drive them without a clock.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch: 0 if the system clock is set before 1970, `u64::MAX`
/// past the year 584 million.
#[must_use]
#[expect(
    clippy::disallowed_methods,
    reason = "the one wall clock (clippy.toml allows std clocks only here)"
)]
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The monotonic clock, for deadlines and elapsed times in I/O shells, benchmarks and tests
/// (async shells that tests drive with a paused clock use `tokio::time::Instant` instead).
#[must_use]
#[expect(
    clippy::disallowed_methods,
    reason = "the one monotonic clock (clippy.toml allows std clocks only here)"
)]
pub fn now_instant() -> Instant {
    Instant::now()
}

#[cfg(test)]
mod tests {
    use super::now_ms;

    #[test]
    fn now_ms_is_after_2020_and_does_not_go_back_within_a_call_pair() {
        let a = now_ms();
        let b = now_ms();
        assert!(a > 1_577_836_800_000, "{a}");
        assert!(b >= a);
    }
}
