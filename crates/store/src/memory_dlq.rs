//! The memory store's delivery trace and dead-letter queue: the same behaviour as
//! `sqlite_dlq.rs`, kept in vectors.

use std::sync::Arc;

use relay_protocol::query::{DeadLetter, DeliveryFigures, DeliveryStatus, TraceEvent, TraceState};

use super::MemoryStore;
use crate::common::prefix_upper_bound;
use crate::{DeadNotice, NewMessage, PendingDelivery, RetryOutcome, WriteResult, retried, stage};

/// The trace and dead-letter state of a [`MemoryStore`].
#[derive(Debug, Default)]
pub(super) struct Journal {
    /// `(position, recipient, event)`.
    events: Vec<(i64, String, TraceEvent)>,
    /// `(recipient, after, through, session, at)`.
    sent: Vec<(String, i64, i64, String, u64)>,
    dlq: Vec<(DeadLetter, Option<NewMessage>)>,
    next_dlq: i64,
    rejected: u64,
    /// Dead letters whose sender was told (refusals are told by their NACK).
    notified: std::collections::HashSet<i64>,
}

impl MemoryStore {
    fn event(&mut self, pos: i64, recipient: &str, ts: u64, state: TraceState, detail: &str) {
        self.journal.events.push((
            pos,
            recipient.to_owned(),
            TraceEvent {
                ts,
                recipient: Some(recipient.to_owned()),
                state,
                detail: Some(detail.to_owned()),
            },
        ));
    }

    fn push_dlq(&mut self, entry: DeadLetter, message: Option<NewMessage>) -> i64 {
        self.journal.next_dlq += 1;
        let id = self.journal.next_dlq;
        self.journal.dlq.push((
            DeadLetter {
                dlq_id: id,
                ..entry
            },
            message,
        ));
        id
    }

    fn dead_letter(
        &mut self,
        pos: i64,
        recipient: &str,
        code: &str,
        reason: &str,
        now: u64,
    ) -> Option<DeadNotice> {
        let m = Arc::clone(&self.message(pos)?.message);
        let dlq_id = self.push_dlq(
            DeadLetter {
                dlq_id: 0,
                ts: now,
                msg_id: m.id.clone(),
                pos: Some(pos),
                from: m.from.clone(),
                recipient: recipient.to_owned(),
                topic: m.topic.clone(),
                code: code.to_owned(),
                reason: reason.to_owned(),
                body: m.payload.body.clone(),
                retried_at: None,
            },
            None,
        );
        Some(DeadNotice {
            dlq_id,
            msg_id: m.id.clone(),
            from: m.from.clone(),
            recipient: recipient.to_owned(),
            code: code.to_owned(),
            reason: reason.to_owned(),
        })
    }

    /// As `Batch::status_changed` in the SQLite store.
    pub(super) fn status_changed(
        &mut self,
        pos: i64,
        recipient: &str,
        old: (DeliveryStatus, Option<u64>),
        status: DeliveryStatus,
        reason: Option<&str>,
        now: u64,
    ) -> WriteResult {
        if let (DeliveryStatus::Acked, Some(at)) = old
            && status != DeliveryStatus::Acked
        {
            self.event(
                pos,
                recipient,
                at,
                TraceState::Injected,
                "acknowledged by the recipient",
            );
        }
        let Some((state, detail)) = crate::common::status_event(status) else {
            return WriteResult::Done;
        };
        let detail = reason.unwrap_or(detail);
        self.event(pos, recipient, now, state, detail);
        if status == DeliveryStatus::Failed {
            return WriteResult::DeadLettered(
                self.dead_letter(pos, recipient, "failed", detail, now)
                    .into_iter()
                    .collect(),
            );
        }
        WriteResult::Done
    }

    pub(super) fn expired(&mut self, pos: i64, recipient: &str, now: u64) -> Option<DeadNotice> {
        let reason = format!("{recipient} did not take it before its time to live ran out");
        self.event(pos, recipient, now, TraceState::Expired, &reason);
        self.dead_letter(pos, recipient, "expired", &reason, now)
    }

    pub(super) fn sent(
        &mut self,
        recipient: &str,
        session: &str,
        after: i64,
        through: i64,
        at: u64,
    ) {
        self.journal
            .sent
            .push((recipient.to_owned(), after, through, session.to_owned(), at));
    }

    pub(super) fn reject(&mut self, m: &NewMessage, code: &str, reason: &str, now: u64) {
        self.journal.rejected += 1;
        let id = self.push_dlq(
            DeadLetter {
                dlq_id: 0,
                ts: now,
                msg_id: m.id.clone(),
                pos: None,
                from: m.from.clone(),
                recipient: m.to.clone(),
                topic: m.topic.clone(),
                code: code.to_owned(),
                reason: reason.to_owned(),
                body: m.payload.body.clone(),
                retried_at: None,
            },
            Some(m.clone()),
        );
        self.journal.notified.insert(id);
    }

    pub(super) fn mark_notified(&mut self, dlq_id: i64) {
        self.journal.notified.insert(dlq_id);
    }

    pub(super) fn not_told(&self, limit: usize) -> Vec<DeadNotice> {
        self.journal
            .dlq
            .iter()
            .filter(|(d, _)| !self.journal.notified.contains(&d.dlq_id))
            .take(limit)
            .map(|(d, _)| DeadNotice {
                dlq_id: d.dlq_id,
                msg_id: d.msg_id.clone(),
                from: d.from.clone(),
                recipient: d.recipient.clone(),
                code: d.code.clone(),
                reason: d.reason.clone(),
            })
            .collect()
    }

    pub(super) fn retry(&mut self, dlq_id: i64, now: u64) -> WriteResult {
        let Some(i) = self
            .journal
            .dlq
            .iter()
            .position(|(d, _)| d.dlq_id == dlq_id)
        else {
            return retried(RetryOutcome::NotFound);
        };
        if self.journal.dlq[i].0.retried_at.is_some() {
            return retried(RetryOutcome::AlreadyRetried(self.journal.dlq[i].0.clone()));
        }
        self.journal.dlq[i].0.retried_at = Some(now);
        let (entry, message) = self.journal.dlq[i].clone();
        let Some(pos) = entry.pos else {
            let Some(mut message) = message else {
                return retried(RetryOutcome::NotFound);
            };
            message.recipients.clear();
            return retried(RetryOutcome::Resend { message, entry });
        };
        let cursor = self.cursors.get(&entry.recipient).copied().unwrap_or(0);
        let Some(d) = self
            .deliveries
            .get_mut(&entry.recipient)
            .and_then(|ds| ds.get_mut(&pos))
        else {
            return retried(RetryOutcome::NotFound);
        };
        if !matches!(d.status, DeliveryStatus::Failed | DeliveryStatus::Expired) {
            return retried(RetryOutcome::AlreadyRetried(entry));
        }
        d.status = DeliveryStatus::Queued;
        d.queued_at = now;
        d.updated_at = None;
        let (seq, attempts) = (d.seq, d.attempts);
        if pos <= cursor {
            self.cursors.insert(entry.recipient.clone(), pos - 1);
        }
        self.event(
            pos,
            &entry.recipient,
            now,
            TraceState::Retried,
            &format!("dead letter {dlq_id} retried"),
        );
        let Some(m) = self.message(pos) else {
            return retried(RetryOutcome::NotFound);
        };
        let delivery = PendingDelivery {
            message: Arc::clone(&m.message),
            seq,
            attempt: attempts.saturating_add(1),
        };
        retried(RetryOutcome::Requeued {
            recipient: entry.recipient.clone(),
            delivery,
            entry,
        })
    }

    pub(super) fn purge(&mut self) -> WriteResult {
        let n = self.journal.dlq.len() as u64;
        self.journal.dlq.clear();
        WriteResult::Purged(n)
    }

    pub(super) fn trace_events(
        &self,
        pos: Option<i64>,
        msg_id: &str,
        from: &str,
    ) -> Vec<TraceEvent> {
        let mut out = Vec::new();
        if let Some(pos) = pos {
            out.extend(
                self.journal
                    .events
                    .iter()
                    .filter(|(p, _, _)| *p == pos)
                    .map(|(_, _, e)| e.clone()),
            );
            if let Some(m) = self.message(pos) {
                for r in &m.recipients {
                    for (_, _, _, session, at) in
                        self.journal
                            .sent
                            .iter()
                            .filter(|(name, after, through, _, _)| {
                                name == r && *after < pos && *through >= pos
                            })
                    {
                        out.push(TraceEvent {
                            ts: *at,
                            recipient: Some(r.clone()),
                            state: TraceState::Delivered,
                            detail: Some(format!("to session {session}")),
                        });
                    }
                }
            }
        }
        for (d, _) in &self.journal.dlq {
            let mine = match d.pos {
                Some(p) => Some(p) == pos,
                None => d.msg_id == msg_id && d.from == from,
            };
            if !mine {
                continue;
            }
            crate::common::dead_letter_events(d, &mut out);
        }
        out
    }

    pub(super) fn rejected_matching(&self, prefix: &str, limit: usize) -> Vec<DeadLetter> {
        let hi = prefix_upper_bound(prefix);
        let short = relay_protocol::is_short_id_len(prefix);
        self.journal
            .dlq
            .iter()
            .filter(|(d, _)| {
                d.pos.is_none()
                    && ((d.msg_id.as_str() >= prefix
                        && hi.as_deref().is_none_or(|hi| d.msg_id.as_str() < hi))
                        || (short && relay_protocol::short_id(&d.msg_id) == prefix))
            })
            .take(limit)
            .map(|(d, _)| d.clone())
            .collect()
    }

    pub(super) fn list_dlq(&self, all: bool, limit: usize) -> Vec<DeadLetter> {
        self.journal
            .dlq
            .iter()
            .rev()
            .filter(|(d, _)| all || d.retried_at.is_none())
            .take(limit)
            .map(|(d, _)| d.clone())
            .collect()
    }

    pub(super) fn get_dlq(&self, dlq_id: i64) -> Option<DeadLetter> {
        self.journal
            .dlq
            .iter()
            .find(|(d, _)| d.dlq_id == dlq_id)
            .map(|(d, _)| d.clone())
    }

    pub(super) fn figures(&self, sample: usize) -> DeliveryFigures {
        let mut figures = DeliveryFigures::default();
        // (position, recipient, queued_at, acked_at) of acknowledged deliveries.
        let mut acked: Vec<(i64, &str, u64, u64)> = Vec::new();
        for (r, ds) in &self.deliveries {
            for (pos, d) in ds {
                *figures
                    .by_state
                    .entry(d.status.as_str().to_owned())
                    .or_insert(0) += 1;
                if matches!(d.status, DeliveryStatus::Acked | DeliveryStatus::Verified)
                    && let Some(at) = d.updated_at
                {
                    acked.push((*pos, r, d.queued_at, at));
                }
            }
        }
        figures.dead_letters = self
            .journal
            .dlq
            .iter()
            .filter(|(d, _)| d.retried_at.is_none())
            .count() as u64;
        figures.rejected = self.journal.rejected;
        acked.sort_unstable_by_key(|a| std::cmp::Reverse(a.0));
        acked.truncate(sample);
        let (mut to_sent, mut to_ack, mut total) = (Vec::new(), Vec::new(), Vec::new());
        for (pos, r, queued, at) in acked {
            total.push(at.saturating_sub(queued));
            if let Some((_, _, _, _, sent)) = self
                .journal
                .sent
                .iter()
                .rev()
                .find(|(n, a, t, _, _)| n == r && *a < pos && *t >= pos)
            {
                to_sent.push(sent.saturating_sub(queued));
                to_ack.push(at.saturating_sub(*sent));
            }
        }
        figures.latency = vec![
            stage("stored_to_delivered", to_sent),
            stage("delivered_to_acknowledged", to_ack),
            stage("stored_to_acknowledged", total),
        ];
        figures
    }

    pub(super) fn hops(&self, limit: usize) -> Vec<(String, u32)> {
        self.messages
            .iter()
            .rev()
            .filter_map(|m| {
                Some((
                    m.message.id.clone(),
                    m.message.payload.budget.as_ref()?.hops,
                ))
            })
            .take(limit)
            .collect()
    }
}
