//! The quiet clock: when the agent's output counts as settled (its directives go out, its
//! turn may be over), when a run of output counts as the agent busy printing, and when the
//! loop must wake up to look again. Pure: every method takes `now`.
//!
//! Output settles after the profile's settle time of quiet, or earlier, after its short turn
//! settle time, when the screen shows the turn over (the agent back at an empty input line,
//! nothing working, no dialog): the screen is looked at once per quiet spell for that.

use std::time::{Duration, Instant};

/// Output running this long (no quiet spell of the settle time in it) reports the agent
/// busy to the relay.
pub(crate) const BUSY_AFTER: Duration = Duration::from_secs(1);

/// The quiet clock of one agent's output.
#[derive(Debug)]
pub(crate) struct Quiet {
    /// Quiet this long settles the output.
    settle: Duration,
    /// Quiet this long settles it when the screen shows the turn over (see
    /// [`crate::profile::Profile::turn_settle`]).
    turn_settle: Option<Duration>,
    /// When the agent printed last.
    last_output: Instant,
    /// When the current run of output (no quiet spell of the settle time in it) began.
    burst_start: Instant,
    /// Everything printed has settled.
    settled: bool,
    /// The screen was looked at for the end of the agent's turn since the last output.
    turn_checked: bool,
    /// Bytes of the agent's output read so far (logged with each burst and each settling, so
    /// a test can tell which output an event follows).
    read: u64,
}

impl Quiet {
    /// A clock with nothing printed yet (settled) at `now`.
    pub(crate) fn new(settle: Duration, turn_settle: Option<Duration>, now: Instant) -> Self {
        Self {
            settle,
            turn_settle,
            last_output: now,
            burst_start: now,
            settled: true,
            turn_checked: false,
            read: 0,
        }
    }

    /// `n` bytes were read at `now`, the total now `read` (`None`: `n` more than before).
    /// Returns whether they start a new burst (output after a quiet spell).
    pub(crate) fn on_read(&mut self, n: usize, read: Option<u64>, now: Instant) -> bool {
        if n == 0 {
            return false;
        }
        self.read = read.unwrap_or(self.read + n as u64);
        let new_burst = self.settled;
        if new_burst {
            self.burst_start = now;
        }
        self.last_output = now;
        self.settled = false;
        new_burst
    }

    /// Output (counted by [`Quiet::on_read`]) was handled at `now`: the turn is looked at
    /// again once it is quiet.
    pub(crate) fn on_output(&mut self, now: Instant) {
        self.last_output = now;
        self.settled = false;
        self.turn_checked = false;
    }

    /// Bytes read so far.
    pub(crate) fn read(&self) -> u64 {
        self.read
    }

    /// Everything printed has settled.
    pub(crate) fn settled(&self) -> bool {
        self.settled
    }

    /// When the agent printed last.
    pub(crate) fn last_output(&self) -> Instant {
        self.last_output
    }

    /// When the output counts as settled if nothing more comes (`None`: it has): after the
    /// turn settle time until the screen was looked at, then after the settle time.
    pub(crate) fn due(&self) -> Option<Instant> {
        if self.settled {
            return None;
        }
        Some(match self.turn_settle {
            Some(t) if !self.turn_checked => self.last_output + t,
            _ => self.last_output + self.settle,
        })
    }

    /// Whether the output settles at `now`; `turn_over` reads the screen, asked at most once
    /// per quiet spell, after the turn settle time. Once it says yes, the clock is settled
    /// until the next output.
    pub(crate) fn settles(&mut self, now: Instant, turn_over: impl FnOnce() -> bool) -> bool {
        if self.settled {
            return false;
        }
        let settles = if now >= self.last_output + self.settle {
            true
        } else {
            match self.turn_settle {
                Some(t) if !self.turn_checked && now >= self.last_output + t => {
                    self.turn_checked = true;
                    let over = turn_over();
                    if over {
                        tracing::debug!("the screen shows the turn over: settled early");
                    }
                    over
                }
                _ => false,
            }
        };
        if settles {
            self.settled = true;
        }
        settles
    }

    /// Whether the agent is printing for a while at `now` (a run of output of
    /// [`BUSY_AFTER`] or more, still going): a person's typing echoed back or a one-line
    /// answer is not.
    pub(crate) fn printing(&self, now: Instant) -> bool {
        now < self.last_output + self.settle && now.duration_since(self.burst_start) >= BUSY_AFTER
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn clock() -> (Quiet, Instant) {
        let t0 = relay_protocol::now_instant();
        (Quiet::new(500 * MS, Some(100 * MS), t0), t0)
    }

    #[test]
    fn nothing_printed_is_settled_and_needs_no_wake_up() {
        let (q, _) = clock();
        assert!(q.settled());
        assert_eq!(q.due(), None);
    }

    #[test]
    fn output_settles_after_the_settle_time_of_quiet() {
        let (mut q, t0) = clock();
        assert!(q.on_read(5, None, t0));
        q.on_output(t0);
        // The screen does not show the turn over: looked at once, not settled early.
        let mut looked = 0;
        assert!(!q.settles(t0 + 100 * MS, || {
            looked += 1;
            false
        }));
        assert!(!q.settles(t0 + 200 * MS, || {
            looked += 1;
            false
        }));
        assert_eq!(looked, 1, "the screen is looked at once per quiet spell");
        assert_eq!(q.due(), Some(t0 + 500 * MS));
        assert!(!q.settles(t0 + 499 * MS, || unreachable!()));
        assert!(q.settles(t0 + 500 * MS, || unreachable!()));
        assert!(q.settled());
        assert!(!q.settles(t0 + 600 * MS, || unreachable!()), "settles once");
    }

    #[test]
    fn a_screen_showing_the_turn_over_settles_after_the_short_turn_time() {
        let (mut q, t0) = clock();
        q.on_read(5, None, t0);
        q.on_output(t0);
        assert_eq!(q.due(), Some(t0 + 100 * MS));
        assert!(!q.settles(t0 + 99 * MS, || unreachable!()));
        assert!(q.settles(t0 + 100 * MS, || true));
    }

    #[test]
    fn more_output_starts_no_new_burst_until_the_output_settled() {
        let (mut q, t0) = clock();
        assert!(q.on_read(1, None, t0));
        assert!(!q.on_read(1, None, t0 + 10 * MS));
        assert_eq!(q.read(), 2);
        q.on_output(t0 + 10 * MS);
        assert!(q.settles(t0 + 510 * MS, || false));
        assert!(q.on_read(3, Some(40), t0 + 600 * MS));
        assert_eq!(q.read(), 40);
        assert!(
            !q.on_read(0, None, t0 + 700 * MS),
            "nothing read is no output"
        );
    }

    #[test]
    fn printing_is_output_running_a_second_without_a_quiet_spell() {
        let (mut q, t0) = clock();
        q.on_read(1, None, t0);
        q.on_output(t0);
        assert!(
            !q.printing(t0 + 400 * MS),
            "a moment of output is not printing"
        );
        for step in 1..=10 {
            let at = t0 + step * 100 * MS;
            q.on_read(1, None, at);
            q.on_output(at);
        }
        assert!(q.printing(t0 + 1000 * MS));
        // Quiet for the settle time: no longer printing.
        assert!(!q.printing(t0 + 1500 * MS));
    }
}
