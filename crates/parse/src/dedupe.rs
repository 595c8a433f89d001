//! The exactly-once policy.
//!
//! The screen model already keeps a row that is rewritten with the same text from being read
//! twice. What is left are *repaints*: a clear screen followed by a re-print of the transcript
//! (a resize), a TUI moving the cursor up over rows it showed before and drawing them again
//! shifted or re-wrapped, or the wrapper feeding a pane it has read before. A repaint shows
//! old directives again, in their old order.
//!
//! So the policy remembers the last [`MAX_HISTORY`] reported directives (a hash of their
//! content and the screen row they started on). A repaint from row `R` opens a *replay*:
//! directives that start after it are matched, in order, against the remembered ones that
//! were shown at row `R` or below. A match is the same directive shown again and is dropped;
//! the first directive that does not match is new, is reported, and ends the replay. A replay
//! also ends when every candidate has been matched, when the stream goes quiet
//! ([`crate::Parser::settle`]) and when the wrapper injects text (a new turn). Outside a
//! replay every directive is reported, so an agent that prints the same directive again in a
//! later turn is heard again.

use std::collections::VecDeque;
use std::hash::{Hash, Hasher};

use crate::Directive;
use crate::scanner::Found;

/// How many reported directives are remembered.
pub(crate) const MAX_HISTORY: usize = 1024;

#[derive(Debug, Clone, Copy)]
struct Seen {
    row: u64,
    key: u64,
}

#[derive(Debug, Clone, Copy)]
struct Replay {
    from_row: u64,
    /// Directives whose first line was committed before this sequence number are older than
    /// the repaint and not part of it.
    since_seq: u64,
    /// Index in `history` where matching goes on.
    next: usize,
}

#[derive(Debug, Default)]
pub(crate) struct Dedupe {
    history: VecDeque<Seen>,
    replay: Option<Replay>,
}

fn key(d: &Directive) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    match &d.to {
        crate::Target::Agent(name) | crate::Target::Topic(name) => name.hash(&mut h),
        crate::Target::Broadcast => "*\0broadcast".hash(&mut h),
    }
    d.kind.as_str().hash(&mut h);
    d.body.hash(&mut h);
    d.thread.hash(&mut h);
    d.data.as_ref().map(ToString::to_string).hash(&mut h);
    d.subscribe.hash(&mut h);
    d.claim.hash(&mut h);
    h.finish()
}

impl Dedupe {
    pub(crate) fn buffered_bytes(&self) -> usize {
        self.history.capacity() * size_of::<Seen>()
    }

    fn has_candidate(&self, r: &Replay) -> bool {
        self.history
            .iter()
            .skip(r.next)
            .any(|s| s.row >= r.from_row)
    }

    /// What follows, from commit sequence number `since_seq` on, may re-show rows from
    /// `from_row` on.
    ///
    /// A repaint during a replay widens it (the earliest row and sequence number win) and
    /// restarts the matching, since a TUI may draw the same rows again on every frame.
    pub(crate) fn begin_replay(&mut self, from_row: u64, since_seq: u64) {
        let (from_row, since_seq) = self.replay.map_or((from_row, since_seq), |r| {
            (r.from_row.min(from_row), r.since_seq.min(since_seq))
        });
        let r = Replay {
            from_row,
            since_seq,
            next: 0,
        };
        self.replay = self.has_candidate(&r).then_some(r);
    }

    pub(crate) fn end_replay(&mut self) {
        self.replay = None;
    }

    /// Whether [`Dedupe::accept`] would drop `found` as shown again (and not change state).
    pub(crate) fn would_drop(&self, found: &Found) -> bool {
        let Some(r) = &self.replay else { return false };
        if found.seq < r.since_seq {
            return false;
        }
        let key = key(&found.directive);
        self.history
            .iter()
            .skip(r.next)
            .any(|s| s.row >= r.from_row && s.key == key)
    }

    /// Whether `found` is to be reported; remembers it if so.
    pub(crate) fn accept(&mut self, found: &Found) -> bool {
        let key = key(&found.directive);
        if let Some(r) = &mut self.replay {
            if found.seq >= r.since_seq {
                let hit = self
                    .history
                    .iter()
                    .skip(r.next)
                    .position(|s| s.row >= r.from_row && s.key == key);
                match hit {
                    Some(i) => {
                        r.next += i + 1;
                        let r = *r;
                        if !self.has_candidate(&r) {
                            self.replay = None;
                        }
                        return false;
                    }
                    None => self.replay = None,
                }
            }
        }
        if self.history.len() == MAX_HISTORY {
            self.history.pop_front();
            if let Some(r) = &mut self.replay {
                r.next = r.next.saturating_sub(1);
            }
        }
        self.history.push_back(Seen {
            row: found.row,
            key,
        });
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Target;

    fn found(body: &str, row: u64, seq: u64) -> Found {
        let directive = Directive::message(Target::Agent("Bob".into()), body);
        Found {
            directive,
            row,
            seq,
        }
    }

    #[test]
    fn repeats_outside_a_replay_are_reported() {
        let mut d = Dedupe::default();
        assert!(d.accept(&found("a", 1, 1)));
        assert!(d.accept(&found("a", 5, 5)));
    }

    #[test]
    fn a_replay_drops_what_it_shows_again_in_order_then_reports_new() {
        let mut d = Dedupe::default();
        assert!(d.accept(&found("a", 1, 1)));
        assert!(d.accept(&found("a", 3, 3)));
        assert!(d.accept(&found("b", 5, 5)));
        d.begin_replay(0, 10);
        assert!(!d.accept(&found("a", 11, 11)));
        assert!(!d.accept(&found("a", 13, 13)));
        assert!(!d.accept(&found("b", 15, 15)));
        // Every candidate matched: the replay is over and a repeat is new again.
        assert!(d.accept(&found("b", 17, 17)));
    }

    #[test]
    fn a_replay_only_covers_rows_from_its_top() {
        let mut d = Dedupe::default();
        assert!(d.accept(&found("a", 1, 1)));
        d.begin_replay(4, 10);
        assert!(d.accept(&found("a", 6, 11)));
    }

    #[test]
    fn a_directive_started_before_the_repaint_is_not_part_of_it() {
        let mut d = Dedupe::default();
        assert!(d.accept(&found("a", 1, 1)));
        d.begin_replay(0, 10);
        assert!(d.accept(&found("a", 2, 2)));
    }

    #[test]
    fn a_repaint_during_a_replay_widens_it() {
        let mut d = Dedupe::default();
        assert!(d.accept(&found("a", 1, 1)));
        d.begin_replay(0, 10);
        d.begin_replay(20, 30);
        // Started after the first repaint, completed after the second: still shown again.
        assert!(!d.accept(&found("a", 11, 11)));
    }

    #[test]
    fn a_mismatch_ends_the_replay() {
        let mut d = Dedupe::default();
        assert!(d.accept(&found("a", 1, 1)));
        d.begin_replay(0, 10);
        assert!(d.accept(&found("new", 11, 11)));
        assert!(d.accept(&found("a", 12, 12)));
    }

    #[test]
    fn memory_is_bounded() {
        let mut d = Dedupe::default();
        for i in 0..(MAX_HISTORY as u64 * 3) {
            d.accept(&found(&i.to_string(), i, i));
        }
        assert_eq!(d.history.len(), MAX_HISTORY);
    }
}
