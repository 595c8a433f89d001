//! Reconnect delays: exponential from 100 ms, doubling to a 30 s cap, each delay spread by
//! ±15 % so that many clients cut off together do not come back together.

use std::time::Duration;

/// Exponential backoff with jitter. Pure: the random draw is passed in.
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    attempt: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(Duration::from_millis(100), Duration::from_secs(30))
    }
}

impl Backoff {
    /// Starts at `base`, doubles per attempt, never exceeds `max` (before jitter).
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max,
            attempt: 0,
        }
    }

    /// The next delay. `unit` is a random draw in `[0, 1)`: 0 gives -15 %, just under 1 gives
    /// +15 %.
    pub fn next_delay(&mut self, unit: f64) -> Duration {
        let exp = self.base.saturating_mul(1u32 << self.attempt.min(20));
        let capped = exp.min(self.max);
        self.attempt = self.attempt.saturating_add(1);
        capped.mul_f64(0.85 + 0.3 * unit.clamp(0.0, 1.0))
    }

    /// Back to the first delay (after a successful connection).
    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    /// Attempts since the last reset.
    pub fn attempts(&self) -> u32 {
        self.attempt
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_with_bounded_jitter() {
        let mut b = Backoff::default();
        let mid: Vec<u128> = (0..12).map(|_| b.next_delay(0.5).as_millis()).collect();
        assert_eq!(&mid[..6], &[100, 200, 400, 800, 1600, 3200]);
        assert_eq!(*mid.last().unwrap(), 30_000);
        let mut b = Backoff::default();
        assert_eq!(b.next_delay(0.0).as_millis(), 85);
        let mut b = Backoff::default();
        assert_eq!(b.next_delay(0.999_999).as_millis(), 114);
        b.reset();
        assert_eq!(b.attempts(), 0);
    }
}
