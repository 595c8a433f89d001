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

/// Parses a length of time written with its unit — `500ms`, `90s`, `10m`, `2h`, `7d` — in
/// milliseconds; `None` for anything else (no unit, another unit, an overflow). The one
/// reading of such durations, for the CLI's options and for what an agent writes in a
/// `[[RELAY]]` block.
#[must_use]
pub fn parse_duration_ms(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    let mult = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    n.checked_mul(mult)
}

#[cfg(test)]
mod tests {
    use super::{now_ms, parse_duration_ms};

    #[test]
    fn durations_are_read_with_their_unit_only() {
        assert_eq!(parse_duration_ms("500ms"), Some(500));
        assert_eq!(parse_duration_ms(" 90s "), Some(90_000));
        assert_eq!(parse_duration_ms("10m"), Some(600_000));
        assert_eq!(parse_duration_ms("2h"), Some(7_200_000));
        assert_eq!(parse_duration_ms("7d"), Some(604_800_000));
        for bad in ["90", "s", "1w", "-1s", "1.5h", "", "99999999999999999999d"] {
            assert_eq!(parse_duration_ms(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn now_ms_is_after_2020_and_does_not_go_back_within_a_call_pair() {
        let a = now_ms();
        let b = now_ms();
        assert!(a > 1_577_836_800_000, "{a}");
        assert!(b >= a);
    }
}
