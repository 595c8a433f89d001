//! Helpers shared by both stores, so that they agree on every detail that a caller can see.

use relay_protocol::query::{
    DeadLetter, DeliveryRecord, DeliveryStatus, HistoryFilter, MessageRecord, TraceEvent,
    TraceState,
};

use crate::{Recipient, StoredMessage};

/// Default number of messages `history` returns.
pub(crate) const HISTORY_DEFAULT_LIMIT: usize = 50;
/// Most messages one `history` call returns, whatever the filter asks.
pub(crate) const HISTORY_MAX_LIMIT: usize = 1000;

/// Unix ms and counters are `u64` in the API but SQLite integers are `i64`; real values are far
/// below `i64::MAX`, so saturating is only a guard against nonsense input.
pub(crate) fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Inverse of [`to_i64`]; a negative value can only come from a corrupt row, read as 0.
pub(crate) fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// The effective `history` limit.
pub(crate) fn history_limit(filter: &HistoryFilter) -> usize {
    filter
        .limit
        .map_or(HISTORY_DEFAULT_LIMIT, |l| {
            usize::try_from(l).unwrap_or(HISTORY_MAX_LIMIT)
        })
        .min(HISTORY_MAX_LIMIT)
}

/// The smallest string greater than every string that starts with `prefix`, or `None` when
/// there is none (empty prefix, or only `char::MAX`s). With it a prefix search is an index range
/// `id >= prefix AND id < bound`, which LIKE would not give us (LIKE is case-insensitive and
/// treats `%`/`_` specially). Both SQLite's BINARY collation and Rust's `str` order compare
/// UTF-8 bytes, and UTF-8 preserves code point order, so bumping the last code point works.
pub(crate) fn prefix_upper_bound(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let mut next = u32::from(last) + 1;
        // Skip the surrogate gap, which holds no chars.
        if (0xD800..=0xDFFF).contains(&next) {
            next = 0xE000;
        }
        if let Some(c) = char::from_u32(next) {
            chars.push(c);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

/// Index of an earlier recipient with the same name as `recipients[i]`, if any. A recipient
/// listed twice gets one delivery (the first one's `live` flag) and the same seq twice, rather
/// than failing the whole batch on the deliveries primary key.
pub(crate) fn earlier_duplicate(recipients: &[Recipient], i: usize) -> Option<usize> {
    let name = &recipients[i].name;
    recipients[..i].iter().position(|r| &r.name == name)
}

/// A [`MessageRecord`] for a stored message and its deliveries.
pub(crate) fn record(m: &StoredMessage, deliveries: Vec<DeliveryRecord>) -> MessageRecord {
    MessageRecord {
        pos: m.pos,
        id: m.id.clone(),
        ts: m.ts,
        from: m.from.clone(),
        to: m.to.clone(),
        topic: m.topic.clone(),
        kind: m.payload.kind,
        body: m.payload.body.clone(),
        data: m.payload.data.clone(),
        thread: m.payload.thread.clone(),
        in_reply_to: m.payload.in_reply_to.clone(),
        origin: m.payload.origin.clone(),
        deliveries,
    }
}

/// The trace event a delivery's new status adds, with its explanation.
pub(crate) fn status_event(status: DeliveryStatus) -> Option<(TraceState, &'static str)> {
    Some(match status {
        // Queued: a retry records itself. Acked: the delivery row holds the time, and a later
        // status that overwrites it records it then.
        DeliveryStatus::Queued | DeliveryStatus::Acked => return None,
        DeliveryStatus::Verified => (TraceState::Verified, "seen on the agent's screen"),
        DeliveryStatus::Failed => (
            TraceState::Failed,
            "the recipient reported that it could not hand the message to its agent",
        ),
        DeliveryStatus::Expired => (TraceState::Expired, "time to live ran out"),
    })
}

/// The trace events a dead letter stands for: refused (if it never was stored), dead-lettered,
/// and for a refused one, sent again (a stored one records its retry as an event).
pub(crate) fn dead_letter_events(d: &DeadLetter, out: &mut Vec<TraceEvent>) {
    let who = (d.recipient != "*").then(|| d.recipient.clone());
    if d.pos.is_none() {
        out.push(TraceEvent {
            ts: d.ts,
            recipient: None,
            state: TraceState::Rejected,
            detail: Some(format!("{}: {}", d.code, d.reason)),
        });
    }
    out.push(TraceEvent {
        ts: d.ts,
        recipient: who.clone(),
        state: TraceState::DeadLettered,
        detail: Some(format!("dead letter {} ({})", d.dlq_id, d.code)),
    });
    if let (Some(at), None) = (d.retried_at, d.pos) {
        out.push(TraceEvent {
            ts: at,
            recipient: who,
            state: TraceState::Retried,
            detail: Some(format!("dead letter {} sent again", d.dlq_id)),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upper_bound_bumps_last_char() {
        assert_eq!(prefix_upper_bound("abc").as_deref(), Some("abd"));
        assert_eq!(prefix_upper_bound(""), None);
        assert_eq!(prefix_upper_bound("a\u{10FFFF}").as_deref(), Some("b"));
        assert_eq!(prefix_upper_bound("\u{D7FF}").as_deref(), Some("\u{E000}"));
        let b = prefix_upper_bound("01J9").unwrap();
        assert!("01J9ZZZZ" < b.as_str() && "01J9" < b.as_str() && "01JA" >= b.as_str());
    }
}
