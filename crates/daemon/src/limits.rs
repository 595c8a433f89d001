//! Loop and flood protection, as pure cores that take `now`: the sliding-window rate limiter
//! (per sender and per ordered pair of agents) and the hop budget of reply chains.

use std::collections::{HashMap, VecDeque};

/// At most `max` messages in any `window_ms`; `max == 0` means no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// Messages allowed per window (0: unlimited).
    pub max: u32,
    /// Window length in milliseconds.
    pub window_ms: u64,
}

impl Limit {
    /// No limit.
    pub const OFF: Self = Self {
        max: 0,
        window_ms: 60_000,
    };
}

/// Rate-limit settings of a daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateConfig {
    /// Per sender (default: [`crate::defaults::RATE_LIMIT`] per [`crate::defaults::RATE_WINDOW`]).
    pub sender: Limit,
    /// Per ordered pair of agents (catches two agents trading acknowledgements).
    pub pair: Limit,
    /// Per-sender replacements of `sender`.
    pub overrides: HashMap<String, u32>,
}

impl Default for RateConfig {
    fn default() -> Self {
        Self {
            sender: Limit {
                max: crate::defaults::RATE_LIMIT,
                window_ms: window_ms(crate::defaults::RATE_WINDOW),
            },
            pair: Limit {
                max: crate::defaults::PAIR_RATE_LIMIT,
                window_ms: window_ms(crate::defaults::RATE_WINDOW),
            },
            overrides: HashMap::new(),
        }
    }
}

/// A window in whole milliseconds (saturating: no window is that long).
fn window_ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Why a message was refused by the limiter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Says which limit, for the NACK.
    pub reason: String,
    /// When the oldest counted message leaves the window.
    pub retry_after_ms: u64,
}

/// Sliding-window log: the times of the messages counted in the current window.
#[derive(Debug, Default)]
struct Window(VecDeque<u64>);

impl Window {
    /// Drops times that left the window; `Some(wait)` when full.
    fn full(&mut self, limit: Limit, now: u64) -> Option<u64> {
        while self
            .0
            .front()
            .is_some_and(|t| now.saturating_sub(*t) >= limit.window_ms)
        {
            self.0.pop_front();
        }
        if limit.max == 0 || self.0.len() < limit.max as usize {
            return None;
        }
        let oldest = self.0.front().copied().unwrap_or(now);
        Some((oldest + limit.window_ms).saturating_sub(now).max(1))
    }
}

/// Counts messages per sender and per (sender, recipient) pair.
#[derive(Debug, Default)]
pub struct RateLimiter {
    cfg: RateConfig,
    senders: HashMap<String, Window>,
    pairs: HashMap<(String, String), Window>,
    /// Calls since idle windows were last dropped.
    calls: u32,
}

impl RateLimiter {
    /// A limiter with these settings.
    pub fn new(cfg: RateConfig) -> Self {
        Self {
            cfg,
            ..Self::default()
        }
    }

    fn sender_limit(&self, from: &str) -> Limit {
        match self.cfg.overrides.get(from) {
            Some(&max) => Limit {
                max,
                ..self.cfg.sender
            },
            None => self.cfg.sender,
        }
    }

    /// Counts a message from `from` to `to` (a direct recipient; `None` for broadcasts, which
    /// count only against the sender) at `now`, or refuses it without counting it.
    pub fn check(&mut self, from: &str, to: Option<&str>, now: u64) -> Result<(), Refusal> {
        self.calls += 1;
        if self.calls >= 4096 {
            self.calls = 0;
            self.forget_idle(now);
        }
        let limit = self.sender_limit(from);
        if limit.max > 0 {
            let w = self.senders.entry(from.to_owned()).or_default();
            if let Some(wait) = w.full(limit, now) {
                return Err(Refusal {
                    reason: format!(
                        "{from} sent {} messages in the last {} s (the limit); wait {} ms",
                        limit.max,
                        limit.window_ms / 1000,
                        wait
                    ),
                    retry_after_ms: wait,
                });
            }
        }
        let pair = self.cfg.pair;
        if let (Some(to), true) = (to, pair.max > 0) {
            let w = self
                .pairs
                .entry((from.to_owned(), to.to_owned()))
                .or_default();
            if let Some(wait) = w.full(pair, now) {
                return Err(Refusal {
                    reason: format!(
                        "{from} sent {to} {} messages in the last {} s (the per-pair limit, which stops two agents answering each other forever); wait {} ms",
                        pair.max,
                        pair.window_ms / 1000,
                        wait
                    ),
                    retry_after_ms: wait,
                });
            }
            w.0.push_back(now);
        }
        if limit.max > 0
            && let Some(w) = self.senders.get_mut(from)
        {
            w.0.push_back(now);
        }
        Ok(())
    }

    /// Drops windows with nothing left in them, so memory follows the active senders.
    fn forget_idle(&mut self, now: u64) {
        let (sw, pw) = (self.cfg.sender.window_ms, self.cfg.pair.window_ms);
        self.senders
            .retain(|_, w| w.0.back().is_some_and(|t| now.saturating_sub(*t) < sw));
        self.pairs
            .retain(|_, w| w.0.back().is_some_and(|t| now.saturating_sub(*t) < pw));
    }
}

/// Hop counts of recent messages, by id, for the budget of reply chains. Bounded: the oldest
/// entries are forgotten first (a reply to a forgotten message counts from 1 again).
#[derive(Debug, Default)]
pub struct Hops {
    by_id: HashMap<String, u32>,
    order: VecDeque<String>,
    cap: usize,
    /// Counts of messages admitted whose append the store has not answered yet, by id, with
    /// the connection that sent each: a DELIVER the store thread hands over can be answered
    /// before the router sees the commit, and the reply must count from its parent already.
    /// Kept apart from `by_id` until the store says the message was stored, so that a SEND it
    /// refuses (an id another sender holds) leaves no count behind.
    pending: HashMap<String, Vec<(u64, u32)>>,
}

impl Hops {
    /// Remembers at most `cap` messages.
    pub fn new(cap: usize) -> Self {
        Self {
            cap,
            ..Self::default()
        }
    }

    /// The hop count of a reply to `parent`: the parent's plus one (a message nobody replied
    /// to, or one forgotten, has 0).
    pub fn reply_hops(&self, parent: &str) -> u32 {
        let pending = self
            .pending
            .get(parent)
            .and_then(|p| p.iter().map(|&(_, h)| h).max());
        self.by_id
            .get(parent)
            .copied()
            .max(pending)
            .unwrap_or(0)
            .saturating_add(1)
    }

    /// A message admitted from connection `conn` with `hops`, its append sent to the store:
    /// replies count from it from now on, until [`Hops::settled`].
    pub fn admitted(&mut self, id: &str, conn: u64, hops: u32) {
        if hops == 0 || self.cap == 0 {
            return;
        }
        self.pending
            .entry(id.to_owned())
            .or_default()
            .push((conn, hops));
    }

    /// The store answered the append of `id` from connection `conn`: `stored` with its hop
    /// count (remembered), or `None` (refused or failed: forgotten).
    pub fn settled(&mut self, id: &str, conn: u64, stored: Option<u32>) {
        if let Some(p) = self.pending.get_mut(id) {
            if let Some(at) = p.iter().position(|&(c, _)| c == conn) {
                p.swap_remove(at);
            }
            if p.is_empty() {
                self.pending.remove(id);
            }
        }
        if let Some(hops) = stored {
            self.record(id, hops);
        }
    }

    /// Remembers a stored message's hop count (only replies are worth remembering).
    pub fn record(&mut self, id: &str, hops: u32) {
        if hops == 0 || self.cap == 0 {
            return;
        }
        // Ids are unique per sender, not globally: keep the larger count, so nobody can lower
        // a chain's count by reusing an id.
        let e = self.by_id.entry(id.to_owned()).or_insert(0);
        if *e == 0 {
            self.order.push_back(id.to_owned());
        }
        *e = (*e).max(hops);
        while self.order.len() > self.cap {
            if let Some(old) = self.order.pop_front() {
                self.by_id.remove(&old);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(sender: u32, pair: u32) -> RateLimiter {
        RateLimiter::new(RateConfig {
            sender: Limit {
                max: sender,
                window_ms: 1000,
            },
            pair: Limit {
                max: pair,
                window_ms: 1000,
            },
            overrides: HashMap::from([("bulk".to_owned(), 5)]),
        })
    }

    #[test]
    fn sliding_window_refuses_then_recovers() {
        let mut l = limiter(3, 0);
        for t in [0, 10, 20] {
            assert!(l.check("a", Some("b"), t).is_ok());
        }
        let r = l.check("a", Some("b"), 500).unwrap_err();
        assert_eq!(r.retry_after_ms, 500);
        // Refused messages are not counted: at 1000 the first one left the window.
        assert!(l.check("a", Some("b"), 1000).is_ok());
        assert!(l.check("a", Some("b"), 1005).is_err());
        assert!(l.check("a", Some("b"), 1010).is_ok());
    }

    #[test]
    fn one_sender_does_not_limit_another() {
        let mut l = limiter(2, 0);
        assert!(l.check("a", None, 0).is_ok());
        assert!(l.check("a", None, 0).is_ok());
        assert!(l.check("a", None, 0).is_err());
        assert!(l.check("b", None, 0).is_ok());
        assert!(l.check("b", None, 0).is_ok());
    }

    #[test]
    fn pairs_are_limited_separately_and_overrides_apply() {
        let mut l = limiter(100, 2);
        assert!(l.check("a", Some("b"), 0).is_ok());
        assert!(l.check("a", Some("b"), 0).is_ok());
        let r = l.check("a", Some("b"), 0).unwrap_err();
        assert!(r.reason.contains("per-pair"), "{}", r.reason);
        assert!(l.check("a", Some("c"), 0).is_ok());
        assert!(l.check("b", Some("a"), 0).is_ok());
        let mut l = limiter(1, 0);
        for _ in 0..5 {
            assert!(l.check("bulk", None, 0).is_ok());
        }
        assert!(l.check("bulk", None, 0).is_err());
    }

    #[test]
    fn zero_means_unlimited() {
        let mut l = limiter(0, 0);
        for t in 0..10_000 {
            assert!(l.check("a", Some("b"), t / 100).is_ok());
        }
    }

    #[test]
    fn hops_count_up_and_are_bounded() {
        let mut h = Hops::new(2);
        assert_eq!(h.reply_hops("m0"), 1);
        h.record("m1", 1);
        assert_eq!(h.reply_hops("m1"), 2);
        h.record("m2", 2);
        h.record("m1", 0);
        assert_eq!(h.reply_hops("m1"), 2);
        h.record("m3", 3);
        // m1 was the oldest: forgotten.
        assert_eq!(h.reply_hops("m1"), 1);
        assert_eq!(h.reply_hops("m3"), 4);
    }

    #[test]
    fn an_admitted_count_holds_until_the_store_answers_and_a_refused_one_is_forgotten() {
        let mut h = Hops::new(8);
        // Stored: counted from admission on, and after.
        h.admitted("m1", 1, 3);
        assert_eq!(h.reply_hops("m1"), 4);
        h.settled("m1", 1, Some(3));
        assert_eq!(h.reply_hops("m1"), 4);
        // Refused by the store (the id is another sender's, whose message has no count):
        // nothing is left of it.
        h.admitted("x", 1, 9);
        assert_eq!(h.reply_hops("x"), 10);
        h.settled("x", 1, None);
        assert_eq!(h.reply_hops("x"), 1);
        // Two admitted under one id: each answer settles its own.
        h.admitted("y", 1, 2);
        h.admitted("y", 2, 5);
        h.settled("y", 2, None);
        assert_eq!(h.reply_hops("y"), 3);
        h.settled("y", 1, Some(2));
        assert_eq!(h.reply_hops("y"), 3);
        assert!(h.pending.is_empty());
    }
}
