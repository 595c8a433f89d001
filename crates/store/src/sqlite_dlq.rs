//! The SQLite store's delivery trace and dead-letter queue (schema v4): the writes a batch
//! makes for them and the reads behind `trace`, `dlq` and the `status` figures. Everything
//! here is off the common path of a message except [`Batch::sent`], one row per recipient
//! per router flush.

use std::sync::Arc;

use relay_protocol::Send;
use relay_protocol::query::{DeadLetter, DeliveryFigures, DeliveryStatus, TraceEvent, TraceState};
use rusqlite::{Connection, OptionalExtension, Row, params};

use super::{Batch, Effective, MSG_COLS, MSG_NCOLS, QUEUED_BELOW, Queued, RawMessage, effective};
use crate::common::{prefix_upper_bound, to_i64, to_u64};
use crate::watermark::Waiting;
use crate::{
    DeadNotice, NewMessage, PendingDelivery, RetryOutcome, StoreError, WriteResult, retried, stage,
};

/// Columns of a dead letter, in the order [`dead_letter_row`] reads them. The body comes from
/// the stored message, or from the refused SEND's JSON.
const DLQ_COLS: &str = "d.id, d.ts, d.msg_id, d.pos, d.sender, d.recipient, d.topic, d.code, \
                        d.reason, d.retried_at, coalesce(m.body, d.message)";
const DLQ_FROM: &str = "dead_letters d LEFT JOIN messages m ON m.pos = d.pos";

/// What a refused SEND keeps, as JSON in `dead_letters.message`.
#[derive(serde::Serialize, serde::Deserialize)]
struct Refused {
    to: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    topic: Option<String>,
    payload: Send,
}

fn dead_letter_row(r: &Row<'_>) -> rusqlite::Result<DeadLetter> {
    let body: Option<String> = r.get(10)?;
    let pos: Option<i64> = r.get(3)?;
    // A refused SEND's column holds JSON; show its text.
    let body = match (pos, body) {
        (None, Some(json)) => serde_json::from_str::<Refused>(&json)
            .map(|f| f.payload.body)
            .unwrap_or(json),
        (_, b) => b.unwrap_or_default(),
    };
    Ok(DeadLetter {
        dlq_id: r.get(0)?,
        ts: to_u64(r.get(1)?),
        msg_id: r.get(2)?,
        pos,
        from: r.get(4)?,
        recipient: r.get(5)?,
        topic: r.get(6)?,
        code: r.get(7)?,
        reason: r.get(8)?,
        retried_at: r.get::<_, Option<i64>>(9)?.map(to_u64),
        body,
    })
}

fn state_of(code: i64) -> Result<TraceState, StoreError> {
    TraceState::from_code(code)
        .ok_or_else(|| StoreError::Corrupt(format!("unknown trace state {code}")))
}

impl Batch<'_> {
    fn event(
        &self,
        pos: i64,
        rid: i64,
        ts: i64,
        state: TraceState,
        detail: &str,
    ) -> Result<(), StoreError> {
        self.tx
            .prepare_cached(
                "INSERT INTO events (msg, recipient, ts, state, detail) VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute(params![pos, rid, ts, state.code(), detail])?;
        Ok(())
    }

    /// Dead-letters the copy of message `pos` for `recipient` and says whom to tell.
    fn dead_letter(
        &self,
        pos: i64,
        recipient: &str,
        code: &str,
        reason: &str,
    ) -> Result<DeadNotice, StoreError> {
        let (msg_id, sender, topic): (String, String, Option<String>) = self
            .tx
            .prepare_cached(
                "SELECT m.id, (SELECT n.name FROM names n WHERE n.id = m.sender), m.topic
                 FROM messages m WHERE m.pos = ?1",
            )?
            .query_row([pos], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        self.tx
            .prepare_cached(
                "INSERT INTO dead_letters (ts, msg_id, pos, sender, recipient, topic, code, reason)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )?
            .execute(params![
                self.now, msg_id, pos, sender, recipient, topic, code, reason
            ])?;
        Ok(DeadNotice {
            dlq_id: self.tx.last_insert_rowid(),
            msg_id,
            from: sender,
            recipient: recipient.to_owned(),
            code: code.to_owned(),
            reason: reason.to_owned(),
        })
    }

    /// Records a status change of one delivery in the trace: the new state, and the
    /// acknowledgement it overwrites (its time would otherwise be lost). A failure also goes
    /// to the dead-letter queue.
    pub(super) fn status_changed(
        &self,
        pos: i64,
        rid: i64,
        recipient: &str,
        old: &Effective,
        status: DeliveryStatus,
        reason: Option<&str>,
    ) -> Result<WriteResult, StoreError> {
        if old.status == DeliveryStatus::Acked
            && status != DeliveryStatus::Acked
            && old.updated_at >= 0
        {
            self.event(
                pos,
                rid,
                old.updated_at,
                TraceState::Injected,
                "acknowledged by the recipient",
            )?;
        }
        // A verified state its range held is read from the range; once the row has a state of
        // its own the range no longer applies to it, so its event is kept as a row.
        if old.from_range && old.status == DeliveryStatus::Verified && status != old.status {
            let (state, detail) = verified_event(old.detail.as_deref());
            self.event(pos, rid, old.updated_at, state, detail)?;
        }
        let Some((state, detail)) = crate::common::status_event(status) else {
            return Ok(WriteResult::Done);
        };
        let detail = reason.unwrap_or(detail);
        self.event(pos, rid, self.now, state, detail)?;
        if status == DeliveryStatus::Failed {
            let notice = self.dead_letter(pos, recipient, "failed", detail)?;
            return Ok(WriteResult::DeadLettered(vec![notice]));
        }
        Ok(WriteResult::Done)
    }

    /// Trace and dead letter for a delivery the expiry sweep took.
    pub(super) fn expired(&self, pos: i64, rid: i64) -> Result<DeadNotice, StoreError> {
        let recipient: String = self
            .tx
            .prepare_cached("SELECT name FROM names WHERE id = ?1")?
            .query_row([rid], |r| r.get(0))?;
        let reason = format!("{recipient} did not take it before its time to live ran out");
        self.event(pos, rid, self.now, TraceState::Expired, &reason)?;
        self.dead_letter(pos, &recipient, "expired", &reason)
    }

    pub(super) fn sent(
        &mut self,
        recipient: &str,
        session_id: &str,
        after: i64,
        through: i64,
        at: u64,
    ) -> Result<WriteResult, StoreError> {
        let Some(rid) = self.names.get(recipient) else {
            return Ok(WriteResult::Done);
        };
        self.tx
            .prepare_cached(
                "INSERT INTO sent (recipient, after, through, session_id, at) VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute(params![rid, after, through, session_id, to_i64(at)])?;
        Ok(WriteResult::Done)
    }

    pub(super) fn reject(
        &self,
        m: &NewMessage,
        code: &str,
        reason: &str,
    ) -> Result<WriteResult, StoreError> {
        let refused = Refused {
            to: m.to.clone(),
            topic: m.topic.clone(),
            payload: m.payload.clone(),
        };
        let json = serde_json::to_string(&refused)
            .map_err(|e| StoreError::Corrupt(format!("cannot encode a refused message: {e}")))?;
        self.tx
            .prepare_cached(
                "INSERT INTO dead_letters (ts, msg_id, pos, sender, recipient, topic, code, reason, message, notified)
                 VALUES (?1, ?2, NULL, ?3, ?4, ?5, ?6, ?7, ?8, 1)",
            )?
            .execute(params![self.now, m.id, m.from, m.to, m.topic, code, reason, json])?;
        self.tx
            .prepare_cached("UPDATE counters SET value = value + 1 WHERE key = 'rejected'")?
            .execute([])?;
        Ok(WriteResult::Done)
    }

    pub(super) fn retry(&mut self, dlq_id: i64) -> Result<WriteResult, StoreError> {
        let sql = format!("SELECT {DLQ_COLS}, d.message FROM {DLQ_FROM} WHERE d.id = ?1");
        let row = self
            .tx
            .prepare_cached(&sql)?
            .query_row([dlq_id], |r| {
                Ok((dead_letter_row(r)?, r.get::<_, Option<String>>(11)?))
            })
            .optional()?;
        let Some((mut entry, message)) = row else {
            return Ok(retried(RetryOutcome::NotFound));
        };
        if entry.retried_at.is_some() {
            return Ok(retried(RetryOutcome::AlreadyRetried(entry)));
        }
        self.tx
            .prepare_cached("UPDATE dead_letters SET retried_at = ?1 WHERE id = ?2")?
            .execute(params![self.now, dlq_id])?;
        entry.retried_at = Some(to_u64(self.now));
        let Some(pos) = entry.pos else {
            let refused: Refused = serde_json::from_str(message.as_deref().unwrap_or("null"))
                .map_err(|e| StoreError::Corrupt(format!("dead letter {dlq_id}: {e}")))?;
            let message = NewMessage {
                id: entry.msg_id.clone(),
                from: entry.from.clone(),
                to: refused.to,
                topic: refused.topic,
                payload: refused.payload,
                session_id: None,
                recipients: Vec::new(),
                queued_at: None,
            };
            return Ok(retried(RetryOutcome::Resend { message, entry }));
        };
        let Some(rid) = self.names.get(&entry.recipient) else {
            return Ok(retried(RetryOutcome::NotFound));
        };
        // The state it leaves, for the state counters (failed and expired are always the
        // row's own).
        let old: Option<i64> = self
            .tx
            .prepare_cached("SELECT status FROM deliveries WHERE msg = ?1 AND recipient = ?2")?
            .query_row(params![pos, rid], |r| r.get(0))
            .optional()?;
        // Back to queued with a fresh time to live; the attempt count stays. At or below the
        // watermark the row says "queued" explicitly (a plain row there reads as its range).
        let below = self.queued.get(&rid).is_some_and(|q| q.covers(pos));
        let code = if below {
            QUEUED_BELOW
        } else {
            DeliveryStatus::Queued.code()
        };
        let sql = format!(
            "UPDATE deliveries SET status = ?4, queued_at = ?1, updated_at = -1 - ?1
             WHERE msg = ?2 AND recipient = ?3 AND status IN ({}, {})",
            DeliveryStatus::Failed.code(),
            DeliveryStatus::Expired.code()
        );
        let changed = self
            .tx
            .prepare_cached(&sql)?
            .execute(params![self.now, pos, rid, code])?;
        if changed == 0 {
            return Ok(retried(RetryOutcome::AlreadyRetried(entry)));
        }
        if let Some(old) = old {
            self.moved(old, DeliveryStatus::Queued.code());
        }
        self.queued.entry(rid).or_default().requeue(Waiting {
            pos,
            queued_at: self.now,
        });
        self.event(
            pos,
            rid,
            self.now,
            TraceState::Retried,
            &format!("dead letter {dlq_id} retried"),
        )?;
        let sql = format!(
            "SELECT {MSG_COLS}, d.seq, d.attempts FROM deliveries d JOIN messages m ON m.pos = d.msg
             WHERE d.msg = ?1 AND d.recipient = ?2"
        );
        let (raw, seq, attempts) =
            self.tx
                .prepare_cached(&sql)?
                .query_row(params![pos, rid], |r| {
                    Ok((
                        RawMessage::from_row(r, 0)?,
                        r.get::<_, i64>(MSG_NCOLS)?,
                        r.get::<_, i64>(MSG_NCOLS + 1)?,
                    ))
                })?;
        let (m, _) = raw.decode()?;
        let delivery = PendingDelivery {
            message: Arc::new(m),
            seq: to_u64(seq),
            attempt: u32::try_from(attempts.saturating_add(1)).unwrap_or(u32::MAX),
        };
        Ok(retried(RetryOutcome::Requeued {
            recipient: entry.recipient.clone(),
            delivery,
            entry,
        }))
    }

    pub(super) fn purge(&self) -> Result<WriteResult, StoreError> {
        let n = self
            .tx
            .prepare_cached("DELETE FROM dead_letters")?
            .execute([])?;
        Ok(WriteResult::Purged(n as u64))
    }
}

/// The trace event of a verified delivery, with the door that showed it when one was named.
fn verified_event(detail: Option<&str>) -> (TraceState, &str) {
    let (state, default) = crate::common::status_event(DeliveryStatus::Verified)
        .unwrap_or((TraceState::Verified, "verified"));
    (state, detail.unwrap_or(default))
}

/// [`crate::Store::events`] for SQLite.
pub(super) fn events(
    conn: &Connection,
    queued: &Queued,
    pos: Option<i64>,
    msg_id: &str,
    from: &str,
) -> Result<Vec<TraceEvent>, StoreError> {
    let mut out = Vec::new();
    if let Some(pos) = pos {
        let mut stmt = conn.prepare_cached(
            "SELECT (SELECT n.name FROM names n WHERE n.id = e.recipient), e.ts, e.state, e.detail
             FROM events e WHERE e.msg = ?1 ORDER BY e.id",
        )?;
        let rows = stmt.query_map([pos], |r| {
            Ok((
                r.get::<_, Option<String>>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, Option<String>>(3)?,
            ))
        })?;
        for row in rows {
            let (recipient, ts, state, detail) = row?;
            out.push(TraceEvent {
                ts: to_u64(ts),
                recipient,
                state: state_of(state)?,
                detail,
            });
        }
        // Handed over: every range of a recipient's sessions that covers the position.
        let recipients: Vec<(i64, String, i64, i64)> = {
            let mut stmt = conn.prepare_cached(
                "SELECT d.recipient, (SELECT n.name FROM names n WHERE n.id = d.recipient),
                        d.status, coalesce(d.updated_at, -1)
                 FROM deliveries d WHERE d.msg = ?1",
            )?;
            let rows =
                stmt.query_map([pos], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?;
            rows.collect::<Result<_, _>>()?
        };
        // Verified as part of a range: the range holds what an event row would.
        for (rid, name, code, updated_at) in &recipients {
            let state = effective(conn, queued, *rid, pos, *code, *updated_at)?;
            if state.from_range && state.status == DeliveryStatus::Verified {
                let (st, detail) = verified_event(state.detail.as_deref());
                out.push(TraceEvent {
                    ts: to_u64(state.updated_at),
                    recipient: Some(name.clone()),
                    state: st,
                    detail: Some(detail.to_owned()),
                });
            }
        }
        let mut stmt = conn.prepare_cached(
            "SELECT session_id, at FROM sent WHERE recipient = ?1 AND through >= ?2 AND after < ?2
             ORDER BY id",
        )?;
        for (rid, name, _, _) in recipients {
            let rows = stmt.query_map(params![rid, pos], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))
            })?;
            for row in rows {
                let (session, at) = row?;
                out.push(TraceEvent {
                    ts: to_u64(at),
                    recipient: Some(name.clone()),
                    state: TraceState::Delivered,
                    detail: Some(format!("to session {session}")),
                });
            }
        }
    }
    let sql = format!(
        "SELECT {DLQ_COLS} FROM {DLQ_FROM} WHERE d.pos = ?1
         UNION ALL SELECT {DLQ_COLS} FROM {DLQ_FROM}
         WHERE d.pos IS NULL AND d.msg_id = ?2 AND d.sender = ?3"
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let rows = stmt.query_map(params![pos.unwrap_or(-1), msg_id, from], dead_letter_row)?;
    for row in rows {
        let d = row?;
        crate::common::dead_letter_events(&d, &mut out);
    }
    Ok(out)
}

/// [`crate::Store::find_rejected`] for SQLite.
pub(super) fn find_rejected(
    conn: &Connection,
    prefix: &str,
    limit: usize,
) -> Result<Vec<DeadLetter>, StoreError> {
    let hi = prefix_upper_bound(prefix).unwrap_or_else(|| "\u{10FFFF}".repeat(2));
    let short = relay_protocol::is_short_id_len(prefix);
    let sql = format!(
        "SELECT {DLQ_COLS} FROM {DLQ_FROM} WHERE d.id IN (
             SELECT id FROM dead_letters WHERE pos IS NULL AND msg_id >= ?1 AND msg_id < ?2
             UNION SELECT id FROM dead_letters WHERE pos IS NULL AND ?3 AND substr(msg_id, -8) = ?1)
         ORDER BY d.id LIMIT ?4"
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let rows = stmt.query_map(
        params![prefix, hi, short, to_i64(limit as u64)],
        dead_letter_row,
    )?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// [`crate::Store::dead_letters`] for SQLite.
pub(super) fn dead_letters(
    conn: &Connection,
    all: bool,
    limit: usize,
) -> Result<Vec<DeadLetter>, StoreError> {
    let filter = if all {
        ""
    } else {
        "WHERE d.retried_at IS NULL"
    };
    let sql = format!("SELECT {DLQ_COLS} FROM {DLQ_FROM} {filter} ORDER BY d.id DESC LIMIT ?1");
    let mut stmt = conn.prepare_cached(&sql)?;
    let rows = stmt.query_map([to_i64(limit as u64)], dead_letter_row)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// [`crate::Store::dead_letter`] for SQLite.
pub(super) fn dead_letter(
    conn: &Connection,
    dlq_id: i64,
) -> Result<Option<DeadLetter>, StoreError> {
    let sql = format!("SELECT {DLQ_COLS} FROM {DLQ_FROM} WHERE d.id = ?1");
    Ok(conn
        .prepare_cached(&sql)?
        .query_row([dlq_id], dead_letter_row)
        .optional()?)
}

/// [`crate::Store::delivery_figures`] for SQLite.
pub(super) fn delivery_figures(
    conn: &Connection,
    queued: &Queued,
    sample: usize,
) -> Result<DeliveryFigures, StoreError> {
    let mut figures = DeliveryFigures::default();
    {
        // Kept by the batches (schema v5), not counted here: this runs for every `status`.
        let mut stmt = conn.prepare_cached(
            "SELECT substr(key, 12), value FROM counters WHERE key LIKE 'deliveries.%'",
        )?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
        for row in rows {
            let (name, n) = row?;
            // Only the states some delivery is in, as a count by state would list them.
            if n != 0 {
                figures.by_state.insert(name, to_u64(n));
            }
        }
    }
    figures.dead_letters = to_u64(conn.query_row(
        "SELECT count(*) FROM dead_letters WHERE retried_at IS NULL",
        [],
        |r| r.get(0),
    )?);
    figures.rejected = to_u64(conn.query_row(
        "SELECT value FROM counters WHERE key = 'rejected'",
        [],
        |r| r.get(0),
    )?);
    // The newest acknowledged deliveries (their own state or their range's: newest first,
    // past those still queued), each with the time its range was handed over.
    let mut acked_rows: Vec<(i64, i64, i64, i64)> = Vec::new();
    {
        let mut stmt = conn.prepare_cached(
            "SELECT d.recipient, d.msg, d.status, d.queued_at, d.updated_at
             FROM deliveries d WHERE d.status IN (0, 1, 2) ORDER BY d.msg DESC",
        )?;
        let mut rows = stmt.query([])?;
        while acked_rows.len() < sample {
            let Some(r) = rows.next()? else { break };
            let (rid, pos, code, queued_at): (i64, i64, i64, i64) =
                (r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?);
            let state = effective(conn, queued, rid, pos, code, r.get(4)?)?;
            if matches!(
                state.status,
                DeliveryStatus::Acked | DeliveryStatus::Verified
            ) {
                acked_rows.push((rid, pos, queued_at, state.updated_at));
            }
        }
    }
    let mut sent_at = conn.prepare_cached(
        "SELECT s.at FROM sent s WHERE s.recipient = ?1 AND s.through >= ?2
         AND s.after < ?2 ORDER BY s.id DESC LIMIT 1",
    )?;
    let (mut to_sent, mut to_ack, mut total) = (Vec::new(), Vec::new(), Vec::new());
    for (rid, pos, queued, acked) in acked_rows {
        let sent: Option<i64> = sent_at
            .query_row(params![rid, pos], |r| r.get(0))
            .optional()?;
        total.push(to_u64(acked - queued));
        if let Some(sent) = sent {
            to_sent.push(to_u64(sent - queued));
            to_ack.push(to_u64(acked - sent));
        }
    }
    figures.latency = vec![
        stage("stored_to_delivered", to_sent),
        stage("delivered_to_acknowledged", to_ack),
        stage("stored_to_acknowledged", total),
    ];
    Ok(figures)
}

/// [`crate::Store::recent_hops`] for SQLite.
pub(super) fn recent_hops(
    conn: &Connection,
    limit: usize,
) -> Result<Vec<(String, u32)>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, budget FROM messages WHERE budget IS NOT NULL ORDER BY pos DESC LIMIT ?1",
    )?;
    let rows = stmt.query_map([to_i64(limit as u64)], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (id, budget) = row?;
        if let Ok(b) = serde_json::from_str::<relay_protocol::Budget>(&budget) {
            out.push((id, b.hops));
        }
    }
    Ok(out)
}

/// [`crate::Store::unnotified`] for SQLite.
pub(super) fn unnotified(conn: &Connection, limit: usize) -> Result<Vec<DeadNotice>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, msg_id, sender, recipient, code, reason FROM dead_letters
         WHERE notified = 0 ORDER BY id LIMIT ?1",
    )?;
    let rows = stmt.query_map([to_i64(limit as u64)], |r| {
        Ok(DeadNotice {
            dlq_id: r.get(0)?,
            msg_id: r.get(1)?,
            from: r.get(2)?,
            recipient: r.get(3)?,
            code: r.get(4)?,
            reason: r.get(5)?,
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}
