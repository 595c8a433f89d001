//! Acknowledgement state as a watermark plus exceptions, per recipient: the pure decisions,
//! no I/O (the SQLite store carries them out; schema v9).
//!
//! A recipient's deliveries are positions of the message table. Every delivery at or below its
//! watermark whose row says nothing of its own (code 0) is in the state of the one range that
//! covers it: ranges are `(after, through]`, each starting where the previous one ended, so
//! they never overlap. Above the watermark a plain row is queued. Everything else is an
//! exception written in the delivery's own row: an acknowledgement out of order, a failure, an
//! expiry, a later state, and a delivery queued again below the watermark (which must say so,
//! or the range under it would read it as acknowledged).
//!
//! So an in-order run of acknowledgements of one recipient in one group commit is one range
//! row, where it was an update of every delivery's row.

use std::collections::VecDeque;

use relay_protocol::query::DeliveryStatus;

use crate::names::FxHashMap;

/// A queued delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Waiting {
    /// Message position.
    pub(crate) pos: i64,
    /// When it was queued (Unix ms): kept so that expiry needs no table scan.
    pub(crate) queued_at: i64,
}

/// What settling a run of deliveries in order moved: the watermark went from `after` to
/// `through`, over `count` queued deliveries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Moved {
    /// The watermark before.
    pub(crate) after: i64,
    /// The watermark now.
    pub(crate) through: i64,
    /// Queued deliveries it covered (the rest of `(after, through]` are exceptions).
    pub(crate) count: u64,
}

/// One recipient's acknowledgement state: what is queued, and the watermark.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Stream {
    /// Every plain delivery at or below it is in the state of the range that covers it.
    pub(crate) through: i64,
    /// Queued deliveries, by ascending position: exactly those that read as queued.
    pub(crate) queued: VecDeque<Waiting>,
}

impl Stream {
    /// A new delivery. Positions only grow, so the list stays sorted.
    pub(crate) fn push(&mut self, w: Waiting) {
        self.queued.push_back(w);
    }

    /// Index of `pos` in the queued list, if it is queued.
    fn index_of(&self, pos: i64) -> Option<usize> {
        let i = self.queued.partition_point(|w| w.pos < pos);
        self.queued
            .get(i)
            .is_some_and(|w| w.pos == pos)
            .then_some(i)
    }

    /// Whether a plain row at `pos` reads through a range (rather than as queued).
    pub(crate) fn covers(&self, pos: i64) -> bool {
        pos <= self.through
    }

    /// The delivery at `pos` was acknowledged (acked or verified). When it is queued, above
    /// the watermark and no queued delivery lies between the watermark and it, it is taken
    /// off the list and the watermark moves to it: the caller writes (or extends) a range.
    /// Otherwise nothing changes here and `None` says the caller must write an exception.
    pub(crate) fn settle(&mut self, pos: i64) -> Option<Moved> {
        let i = self.index_of(pos)?;
        let in_order = pos > self.through
            && (i == 0
                || self
                    .queued
                    .get(i - 1)
                    .is_some_and(|w| w.pos <= self.through));
        if !in_order {
            return None;
        }
        self.queued.remove(i);
        let after = self.through;
        self.through = pos;
        Some(Moved {
            after,
            through: pos,
            count: 1,
        })
    }

    /// Every queued delivery at or below `through` was acknowledged: those above the watermark
    /// move it (one range), those queued again below it are exceptions (returned, ascending).
    pub(crate) fn settle_through(&mut self, through: i64) -> (Option<Moved>, Vec<i64>) {
        let mut moved: Option<Moved> = None;
        let mut rows = Vec::new();
        while let Some(&w) = self.queued.front() {
            if w.pos > through {
                break;
            }
            self.queued.pop_front();
            if w.pos > self.through {
                let m = moved.get_or_insert(Moved {
                    after: self.through,
                    through: w.pos,
                    count: 0,
                });
                m.through = w.pos;
                m.count += 1;
            } else {
                rows.push(w.pos);
            }
        }
        if let Some(m) = moved {
            self.through = m.through;
        }
        (moved, rows)
    }

    /// Takes `pos` off the queued list (a state written in its row: failed, an
    /// acknowledgement out of order...); whether it was queued.
    pub(crate) fn take(&mut self, pos: i64) -> bool {
        match self.index_of(pos) {
            Some(i) => {
                self.queued.remove(i);
                true
            }
            None => false,
        }
    }

    /// Queues `pos` again (a retried dead letter, a state set back to queued). Returns whether
    /// it lies at or below the watermark: then its row must say "queued" explicitly.
    pub(crate) fn requeue(&mut self, w: Waiting) -> bool {
        let i = self.queued.partition_point(|q| q.pos < w.pos);
        if self.queued.get(i).is_none_or(|q| q.pos != w.pos) {
            self.queued.insert(i, w);
        }
        self.covers(w.pos)
    }

    /// Takes off the list every delivery queued before `cutoff` (they expire, each an
    /// exception); their positions, ascending.
    pub(crate) fn expire(&mut self, cutoff: i64) -> Vec<i64> {
        let due: Vec<i64> = self
            .queued
            .iter()
            .filter(|w| w.queued_at < cutoff)
            .map(|w| w.pos)
            .collect();
        if !due.is_empty() {
            self.queued.retain(|w| w.queued_at >= cutoff);
        }
        due
    }
}

/// A range to write: the plain deliveries of `rid` in `(after, through]` are `state` since the
/// batch's time, with `detail` (a verified delivery's door) for the trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Run {
    /// Recipient id.
    pub(crate) rid: i64,
    /// The watermark it starts from.
    pub(crate) after: i64,
    /// The watermark it moves to.
    pub(crate) through: i64,
    /// Acked or verified.
    pub(crate) state: DeliveryStatus,
    /// The trace's detail for a verified run.
    pub(crate) detail: Option<String>,
}

/// The ranges one batch builds, at most one open per recipient: consecutive settlements of
/// the same state and detail extend it, anything else closes it (to be written).
#[derive(Debug, Default)]
pub(crate) struct Runs {
    open: FxHashMap<i64, Run>,
}

impl Runs {
    /// Adds a move of `rid`'s watermark in `state`. Returns the run it closes, which the
    /// caller writes now (a run of another state or detail, or one it does not continue).
    pub(crate) fn add(
        &mut self,
        rid: i64,
        moved: Moved,
        state: DeliveryStatus,
        detail: Option<&str>,
    ) -> Option<Run> {
        if let Some(run) = self.open.get_mut(&rid)
            && run.through == moved.after
            && run.state == state
            && run.detail.as_deref() == detail
        {
            run.through = moved.through;
            return None;
        }
        self.open.insert(
            rid,
            Run {
                rid,
                after: moved.after,
                through: moved.through,
                state,
                detail: detail.map(str::to_owned),
            },
        )
    }

    /// Closes `rid`'s open run, if any (before anything reads or writes its rows one by one).
    pub(crate) fn close(&mut self, rid: i64) -> Option<Run> {
        self.open.remove(&rid)
    }

    /// Closes every open run, in recipient order.
    pub(crate) fn close_all(&mut self) -> Vec<Run> {
        let mut runs: Vec<Run> = self.open.drain().map(|(_, r)| r).collect();
        runs.sort_unstable_by_key(|r| r.rid);
        runs
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    fn stream(positions: &[i64]) -> Stream {
        let mut s = Stream::default();
        for &pos in positions {
            s.push(Waiting {
                pos,
                queued_at: pos,
            });
        }
        s
    }

    fn queued(s: &Stream) -> Vec<i64> {
        s.queued.iter().map(|w| w.pos).collect()
    }

    #[test]
    fn in_order_acks_move_the_watermark() {
        let mut s = stream(&[2, 5, 9]);
        assert_eq!(
            s.settle(2),
            Some(Moved {
                after: 0,
                through: 2,
                count: 1
            })
        );
        assert_eq!(
            s.settle(5),
            Some(Moved {
                after: 2,
                through: 5,
                count: 1
            })
        );
        assert_eq!(s.through, 5);
        assert_eq!(queued(&s), vec![9]);
    }

    #[test]
    fn out_of_order_ack_is_an_exception_and_the_watermark_passes_it_later() {
        let mut s = stream(&[2, 5, 9]);
        // 5 before 2: an exception, nothing moves here; the caller takes it off the list.
        assert_eq!(s.settle(5), None);
        assert!(s.take(5));
        assert_eq!(s.through, 0);
        // 2 then moves the watermark, and 9 continues past the exception at 5.
        assert_eq!(s.settle(2).map(|m| m.through), Some(2));
        assert_eq!(
            s.settle(9),
            Some(Moved {
                after: 2,
                through: 9,
                count: 1
            })
        );
        assert!(s.queued.is_empty());
    }

    #[test]
    fn unknown_or_settled_positions_are_left_to_the_row() {
        let mut s = stream(&[3]);
        assert_eq!(s.settle(4), None);
        assert_eq!(s.settle(3).map(|m| m.through), Some(3));
        assert_eq!(s.settle(3), None);
        assert!(!s.take(3));
    }

    #[test]
    fn ack_through_is_one_range_over_the_queued_and_rows_for_those_requeued_below() {
        let mut s = stream(&[2, 5, 9, 12]);
        s.settle_through(5);
        assert_eq!(s.through, 5);
        // 2 is queued again (a retried dead letter): below the watermark, its row says so.
        assert!(s.requeue(Waiting {
            pos: 2,
            queued_at: 50
        }));
        assert!(!s.requeue(Waiting {
            pos: 20,
            queued_at: 50
        }));
        let (moved, rows) = s.settle_through(12);
        assert_eq!(
            moved,
            Some(Moved {
                after: 5,
                through: 12,
                count: 2
            })
        );
        assert_eq!(rows, vec![2]);
        assert_eq!(queued(&s), vec![20]);
        // Nothing at or below: nothing moves.
        assert_eq!(s.settle_through(13), (None, vec![]));
    }

    #[test]
    fn a_requeued_delivery_below_the_watermark_is_settled_as_an_exception() {
        let mut s = stream(&[2, 5]);
        s.settle_through(5);
        s.requeue(Waiting {
            pos: 2,
            queued_at: 9,
        });
        assert_eq!(s.settle(2), None);
        // Above it, a new delivery still moves the watermark although 2 waits below.
        s.push(Waiting {
            pos: 7,
            queued_at: 9,
        });
        assert_eq!(s.settle(7).map(|m| (m.after, m.through)), Some((5, 7)));
        assert_eq!(queued(&s), vec![2]);
    }

    #[test]
    fn expiry_takes_the_old_ones_as_exceptions() {
        let mut s = stream(&[2, 5, 9]);
        assert_eq!(s.expire(6), vec![2, 5]);
        assert_eq!(queued(&s), vec![9]);
        assert_eq!(s.through, 0);
        // The watermark later passes the expired ones.
        assert_eq!(s.settle(9).map(|m| (m.after, m.through)), Some((0, 9)));
    }

    #[test]
    fn runs_extend_while_state_and_detail_hold() {
        let mut runs = Runs::default();
        let mv = |after, through| Moved {
            after,
            through,
            count: 1,
        };
        assert_eq!(runs.add(1, mv(0, 2), DeliveryStatus::Verified, None), None);
        assert_eq!(runs.add(1, mv(2, 4), DeliveryStatus::Verified, None), None);
        assert_eq!(runs.add(2, mv(0, 3), DeliveryStatus::Acked, None), None);
        // Another state closes the run.
        let closed = runs.add(1, mv(4, 6), DeliveryStatus::Acked, None).unwrap();
        assert_eq!((closed.after, closed.through), (0, 4));
        // Another detail too.
        let closed = runs
            .add(1, mv(6, 7), DeliveryStatus::Acked, Some("door"))
            .unwrap();
        assert_eq!(
            (closed.after, closed.through, closed.state),
            (4, 6, DeliveryStatus::Acked)
        );
        let all = runs.close_all();
        assert_eq!(
            all.iter()
                .map(|r| (r.rid, r.after, r.through))
                .collect::<Vec<_>>(),
            vec![(1, 6, 7), (2, 0, 3)]
        );
        assert_eq!(runs.close(1), None);
    }

    // --- Model: the core's writes, carried out on a simulated table, read back as a plain
    // map of delivery states would say. ---

    #[derive(Debug, Clone)]
    enum Op {
        Append,
        Ack(usize, bool),
        Fail(usize),
        AckThrough(usize),
        Expire(i64),
        Requeue(usize),
        Commit,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => Just(Op::Append),
            5 => (0..12usize, any::<bool>()).prop_map(|(i, v)| Op::Ack(i, v)),
            1 => (0..12usize).prop_map(Op::Fail),
            2 => (0..12usize).prop_map(Op::AckThrough),
            1 => (0..40i64).prop_map(Op::Expire),
            1 => (0..12usize).prop_map(Op::Requeue),
            2 => Just(Op::Commit),
        ]
    }

    /// What the SQLite store keeps: each row's own code (0 plain, 5 queued below the
    /// watermark, else the state) and the written ranges.
    #[derive(Default)]
    struct Table {
        rows: BTreeMap<i64, i64>,
        ranges: Vec<Run>,
    }

    impl Table {
        fn read(&self, s: &Stream, pos: i64) -> DeliveryStatus {
            match self.rows[&pos] {
                5 => DeliveryStatus::Queued,
                0 if s.covers(pos) => {
                    let r: Vec<&Run> = self
                        .ranges
                        .iter()
                        .filter(|r| r.after < pos && pos <= r.through)
                        .collect();
                    assert_eq!(r.len(), 1, "one range covers {pos}");
                    r[0].state
                }
                0 => DeliveryStatus::Queued,
                c => DeliveryStatus::from_code(c).unwrap(),
            }
        }
    }

    fn run(ops: &[Op]) -> Result<(), TestCaseError> {
        let mut s = Stream::default();
        let mut runs = Runs::default();
        let mut t = Table::default();
        // The plain model: position → state.
        let mut model: BTreeMap<i64, DeliveryStatus> = BTreeMap::new();
        // When each was (last) queued.
        let mut queued_at: BTreeMap<i64, i64> = BTreeMap::new();
        let mut next = 1i64;
        let nth = |model: &BTreeMap<i64, DeliveryStatus>, i: usize| {
            model.keys().nth(i % model.len().max(1)).copied()
        };
        for op in ops {
            match op {
                Op::Append => {
                    s.push(Waiting {
                        pos: next,
                        queued_at: next,
                    });
                    t.rows.insert(next, 0);
                    model.insert(next, DeliveryStatus::Queued);
                    queued_at.insert(next, next);
                    // Positions are not contiguous: other recipients' messages lie between.
                    next += 2;
                }
                Op::Ack(i, verified) => {
                    let Some(pos) = nth(&model, *i) else { continue };
                    let state = if *verified {
                        DeliveryStatus::Verified
                    } else {
                        DeliveryStatus::Acked
                    };
                    // The store's rules: an ack only acknowledges what waits; a state is
                    // recorded once.
                    let old = model[&pos];
                    if old == state
                        || (state == DeliveryStatus::Acked && old != DeliveryStatus::Queued)
                    {
                        continue;
                    }
                    if let Some(m) = s.settle(pos) {
                        if let Some(closed) = runs.add(1, m, state, None) {
                            t.ranges.push(closed);
                        }
                    } else {
                        if let Some(closed) = runs.close(1) {
                            t.ranges.push(closed);
                        }
                        s.take(pos);
                        t.rows.insert(pos, state.code());
                    }
                    model.insert(pos, state);
                }
                Op::Fail(i) => {
                    let Some(pos) = nth(&model, *i) else { continue };
                    if let Some(closed) = runs.close(1) {
                        t.ranges.push(closed);
                    }
                    s.take(pos);
                    t.rows.insert(pos, DeliveryStatus::Failed.code());
                    model.insert(pos, DeliveryStatus::Failed);
                }
                Op::AckThrough(i) => {
                    let Some(through) = nth(&model, *i) else {
                        continue;
                    };
                    let (moved, rows) = s.settle_through(through);
                    for pos in rows {
                        t.rows.insert(pos, DeliveryStatus::Acked.code());
                    }
                    if let Some(m) = moved
                        && let Some(closed) = runs.add(1, m, DeliveryStatus::Acked, None)
                    {
                        t.ranges.push(closed);
                    }
                    for (_, st) in model.range_mut(..=through) {
                        if *st == DeliveryStatus::Queued {
                            *st = DeliveryStatus::Acked;
                        }
                    }
                }
                Op::Expire(cutoff) => {
                    for pos in s.expire(*cutoff) {
                        t.rows.insert(pos, DeliveryStatus::Expired.code());
                    }
                    for (pos, st) in &mut model {
                        if *st == DeliveryStatus::Queued && queued_at[pos] < *cutoff {
                            *st = DeliveryStatus::Expired;
                        }
                    }
                }
                Op::Requeue(i) => {
                    // Only a dead letter (failed, expired) is retried.
                    let Some(pos) = nth(&model, *i) else { continue };
                    if !matches!(
                        model[&pos],
                        DeliveryStatus::Failed | DeliveryStatus::Expired
                    ) {
                        continue;
                    }
                    let below = s.requeue(Waiting {
                        pos,
                        queued_at: next,
                    });
                    t.rows.insert(pos, if below { 5 } else { 0 });
                    model.insert(pos, DeliveryStatus::Queued);
                    queued_at.insert(pos, next);
                }
                Op::Commit => t.ranges.extend(runs.close_all()),
            }
            // Mid-batch, the open run is what a read would see after it is written.
            let mut view = Table {
                rows: t.rows.clone(),
                ranges: t.ranges.clone(),
            };
            view.ranges.extend(runs.open.values().cloned());
            for (&pos, &want) in &model {
                prop_assert_eq!(view.read(&s, pos), want, "position {} after {:?}", pos, op);
            }
            let waiting: Vec<i64> = model
                .iter()
                .filter(|(_, st)| **st == DeliveryStatus::Queued)
                .map(|(p, _)| *p)
                .collect();
            prop_assert_eq!(queued(&s), waiting);
        }
        // Ranges never overlap and follow each other.
        t.ranges.extend(runs.close_all());
        for w in t.ranges.windows(2) {
            prop_assert_eq!(w[0].through, w[1].after);
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Acknowledgements in any order, failures, expiry, retries and ack-through, carried
        /// out as the core decides, read back exactly as a map of delivery states says.
        #[test]
        fn watermark_and_exceptions_read_as_the_plain_model(ops in proptest::collection::vec(op(), 1..80)) {
            run(&ops)?;
        }
    }

    #[test]
    fn an_in_order_run_is_one_range() {
        let mut s = stream(&[1, 3, 5, 7]);
        let mut runs = Runs::default();
        for pos in [1, 3, 5, 7] {
            let m = s.settle(pos).unwrap();
            assert_eq!(runs.add(9, m, DeliveryStatus::Verified, None), None);
        }
        let all = runs.close_all();
        assert_eq!(all.len(), 1);
        assert_eq!((all[0].after, all[0].through), (0, 7));
    }
}
