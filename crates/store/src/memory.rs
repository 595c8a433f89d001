//! The in-memory store: same behaviour as the SQLite store, nothing survives the process.
//! Used with `--memory` and as the reference the SQLite store is tested against.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use relay_protocol::query::{
    AgentInfo, AgentState, DeliveryRecord, DeliveryStatus, HistoryFilter, MessageRecord,
};

#[path = "memory_dlq.rs"]
mod dlq;

use crate::common::{earlier_duplicate, history_limit, prefix_upper_bound, record};
use crate::{
    AppendOutcome, KnownAgent, NewMessage, PendingDelivery, Stats, Store, StoreError,
    StoredMessage, WriteOp, WriteResult,
};

/// `(recipient, topic or "", sender)`: one gapless seq stream.
type StreamKey = (String, String, String);

#[derive(Debug)]
struct MemMessage {
    message: Arc<StoredMessage>,
    /// Recipient names in the order given, without duplicates.
    recipients: Vec<String>,
    /// Kept for parity with the SQLite store, which records it.
    #[allow(dead_code)]
    session_id: Option<String>,
}

#[derive(Debug, Clone)]
struct MemDelivery {
    seq: u64,
    status: DeliveryStatus,
    attempts: u32,
    queued_at: u64,
    updated_at: Option<u64>,
}

#[derive(Debug)]
struct MemAgent {
    cli: Option<String>,
    first_seen: u64,
    last_seen: u64,
}

#[derive(Debug)]
#[allow(dead_code)] // Written for parity with the SQLite store; nothing reads sessions yet.
struct MemSession {
    agent: String,
    started_at: u64,
    ended_at: Option<u64>,
}

/// In-memory [`Store`].
#[derive(Debug, Default)]
pub struct MemoryStore {
    /// `messages[i]` has position `i + 1`, as SQLite rowids would.
    messages: Vec<MemMessage>,
    /// `(id, sender)` → position; ordered so that an id prefix is a range.
    by_id: BTreeMap<(String, String), i64>,
    /// recipient → position → delivery.
    deliveries: HashMap<String, BTreeMap<i64, MemDelivery>>,
    streams: HashMap<StreamKey, u64>,
    /// Same invariant as the SQLite store: nothing at or below a recipient's cursor is queued.
    cursors: HashMap<String, i64>,
    agents: BTreeMap<String, MemAgent>,
    sessions: HashMap<String, MemSession>,
    subscriptions: BTreeMap<String, BTreeSet<String>>,
    /// Trace events and dead letters.
    journal: dlq::Journal,
    /// Hop-budget extensions per thread.
    chains: BTreeMap<String, u32>,
    /// Spawned workers by name ([`WriteOp::Spawned`]).
    spawned: BTreeMap<String, relay_protocol::query::SpawnRecord>,
    /// (agent, path) → (since, until).
    claims: BTreeMap<(String, String), (u64, u64)>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn cursor(&self, recipient: &str) -> i64 {
        self.cursors.get(recipient).copied().unwrap_or(0)
    }

    fn max_pos(&self) -> i64 {
        i64::try_from(self.messages.len()).unwrap_or(i64::MAX)
    }

    fn message(&self, pos: i64) -> Option<&MemMessage> {
        usize::try_from(pos - 1)
            .ok()
            .and_then(|i| self.messages.get(i))
    }

    fn pending_count(&self, recipient: &str) -> u64 {
        let after = self.cursor(recipient);
        self.deliveries.get(recipient).map_or(0, |ds| {
            ds.range(after + 1..)
                .filter(|(_, d)| d.status == DeliveryStatus::Queued)
                .count() as u64
        })
    }

    fn to_record(&self, m: &MemMessage) -> MessageRecord {
        let pos = m.message.pos;
        let deliveries = m
            .recipients
            .iter()
            .filter_map(|r| {
                let d = self.deliveries.get(r)?.get(&pos)?;
                Some(DeliveryRecord {
                    recipient: r.clone(),
                    seq: d.seq,
                    status: d.status,
                    queued_at: d.queued_at,
                    updated_at: d.updated_at,
                })
            })
            .collect();
        record(&m.message, deliveries)
    }

    /// [`WriteOp::SetStatus`] (and [`WriteOp::MarkById`], with the recipient's reason).
    fn set_status(
        &mut self,
        recipient: &str,
        pos: i64,
        status: DeliveryStatus,
        reason: Option<&str>,
        now: u64,
    ) -> WriteResult {
        let cursor = self.cursor(recipient);
        let mut old = None;
        if let Some(d) = self
            .deliveries
            .get_mut(recipient)
            .and_then(|ds| ds.get_mut(&pos))
        {
            // As in the SQLite store: a state already recorded is not recorded again,
            // and an acknowledgement never overwrites.
            if status != DeliveryStatus::Queued && d.status == status {
                return WriteResult::Done;
            }
            if status == DeliveryStatus::Acked && d.status != DeliveryStatus::Queued {
                return WriteResult::Done;
            }
            old = Some((d.status, d.updated_at));
            d.status = status;
            d.updated_at = Some(now);
            if status == DeliveryStatus::Queued && pos <= cursor {
                self.cursors.insert(recipient.to_owned(), pos - 1);
            }
        }
        match old {
            Some(old) => self.status_changed(pos, recipient, old, status, reason, now),
            None => WriteResult::Done,
        }
    }

    fn append(&mut self, m: &NewMessage, now: u64) -> AppendOutcome {
        let key = (m.id.clone(), m.from.clone());
        if let Some(&pos) = self.by_id.get(&key) {
            return AppendOutcome::Duplicate { pos };
        }
        // An id names one message (issue 24.7): another sender's is refused.
        if let Some(((_, owner), _)) = self
            .by_id
            .range((m.id.clone(), String::new())..)
            .next()
            .filter(|((id, _), _)| *id == m.id)
        {
            return AppendOutcome::Taken {
                owner: owner.clone(),
            };
        }
        let pos = self.max_pos() + 1;
        let topic = m.topic.clone().unwrap_or_default();
        let mut seqs = Vec::with_capacity(m.recipients.len());
        let mut names = Vec::with_capacity(m.recipients.len());
        for (i, r) in m.recipients.iter().enumerate() {
            if let Some(j) = earlier_duplicate(&m.recipients, i) {
                seqs.push(seqs[j]);
                continue;
            }
            let last = self
                .streams
                .entry((r.name.clone(), topic.clone(), m.from.clone()))
                .or_insert(0);
            *last += 1;
            let seq = *last;
            self.deliveries.entry(r.name.clone()).or_default().insert(
                pos,
                MemDelivery {
                    seq,
                    status: DeliveryStatus::Queued,
                    attempts: 0,
                    queued_at: m.queued_at.map_or(now, |q| q.min(now)),
                    updated_at: None,
                },
            );
            names.push(r.name.clone());
            seqs.push(seq);
        }
        let message = Arc::new(StoredMessage {
            pos,
            id: m.id.clone(),
            ts: now,
            from: m.from.clone(),
            to: m.to.clone(),
            topic: m.topic.clone(),
            payload: m.payload.clone(),
        });
        self.by_id.insert(key, pos);
        self.messages.push(MemMessage {
            message: Arc::clone(&message),
            recipients: names,
            session_id: m.session_id.clone(),
        });
        AppendOutcome::Stored { message, seqs }
    }

    fn apply(&mut self, op: &WriteOp, now: u64) -> WriteResult {
        match op {
            WriteOp::Append(m) => WriteResult::Appended(self.append(m, now)),
            WriteOp::AckThrough { recipient, through } => {
                let cursor = self.cursor(recipient);
                if *through > cursor {
                    if let Some(ds) = self.deliveries.get_mut(recipient) {
                        for d in ds.range_mut(cursor + 1..=*through).map(|(_, d)| d) {
                            if d.status == DeliveryStatus::Queued {
                                d.status = DeliveryStatus::Acked;
                                d.updated_at = Some(now);
                            }
                        }
                    }
                    // Never past the last message, as in the SQLite store.
                    let new = (*through).min(self.max_pos());
                    if new > cursor {
                        self.cursors.insert(recipient.clone(), new);
                    }
                }
                WriteResult::Done
            }
            WriteOp::HandedOut {
                recipient,
                after,
                through,
            } => {
                let from = (*after).max(self.cursor(recipient));
                if let Some(ds) = self
                    .deliveries
                    .get_mut(recipient)
                    .filter(|_| *through > from)
                {
                    for d in ds.range_mut(from + 1..=*through).map(|(_, d)| d) {
                        if d.status == DeliveryStatus::Queued {
                            d.attempts = d.attempts.saturating_add(1);
                        }
                    }
                }
                WriteResult::Done
            }
            WriteOp::SetStatus {
                recipient,
                pos,
                status,
                reason,
            } => self.set_status(recipient, *pos, *status, reason.as_deref(), now),
            WriteOp::AgentConnected {
                name,
                cli,
                session_id,
            } => {
                let a = self.agents.entry(name.clone()).or_insert(MemAgent {
                    cli: None,
                    first_seen: now,
                    last_seen: now,
                });
                if cli.is_some() {
                    a.cli.clone_from(cli);
                }
                a.last_seen = now;
                self.sessions.insert(
                    session_id.clone(),
                    MemSession {
                        agent: name.clone(),
                        started_at: now,
                        ended_at: None,
                    },
                );
                WriteResult::Done
            }
            WriteOp::AgentDisconnected { name, session_id } => {
                if let Some(a) = self.agents.get_mut(name) {
                    a.last_seen = now;
                }
                if let Some(s) = self.sessions.get_mut(session_id) {
                    s.ended_at = Some(now);
                }
                WriteResult::Done
            }
            WriteOp::Subscribe { agent, pattern } => {
                self.subscriptions
                    .entry(agent.clone())
                    .or_default()
                    .insert(pattern.clone());
                WriteResult::Done
            }
            WriteOp::Unsubscribe { agent, pattern } => {
                if let Some(set) = self.subscriptions.get_mut(agent) {
                    set.remove(pattern);
                    if set.is_empty() {
                        self.subscriptions.remove(agent);
                    }
                }
                WriteResult::Done
            }
            WriteOp::Expire {
                queued_before,
                except,
            } => {
                let mut due: Vec<(i64, String)> = Vec::new();
                for (r, ds) in &mut self.deliveries {
                    if except.iter().any(|e| e == r) {
                        continue;
                    }
                    let after = self.cursors.get(r).copied().unwrap_or(0);
                    for (pos, d) in ds.range_mut(after + 1..) {
                        if d.status == DeliveryStatus::Queued && d.queued_at < *queued_before {
                            d.status = DeliveryStatus::Expired;
                            d.updated_at = Some(now);
                            due.push((*pos, r.clone()));
                        }
                    }
                }
                due.sort_unstable();
                let notices = due
                    .into_iter()
                    .filter_map(|(pos, r)| self.expired(pos, &r, now))
                    .collect();
                WriteResult::Expired(notices)
            }
            WriteOp::Sent {
                recipient,
                session_id,
                after,
                through,
                at,
            } => {
                self.sent(recipient, session_id, *after, *through, *at);
                WriteResult::Done
            }
            WriteOp::Reject {
                message,
                code,
                reason,
            } => {
                self.reject(message, code, reason, now);
                WriteResult::Done
            }
            WriteOp::Retry { dlq_id } => self.retry(*dlq_id, now),
            WriteOp::Notified { dlq_id } => {
                self.mark_notified(*dlq_id);
                WriteResult::Done
            }
            WriteOp::MarkById {
                recipient,
                msg_id,
                status,
                reason,
            } => {
                let lo = (msg_id.clone(), String::new());
                let pos = self
                    .by_id
                    .range(lo..)
                    .take_while(|((id, _), _)| id == msg_id)
                    .map(|(_, &p)| p)
                    .filter(|p| {
                        self.deliveries
                            .get(recipient)
                            .is_some_and(|ds| ds.contains_key(p))
                    })
                    .max();
                match pos {
                    Some(pos) => self.set_status(recipient, pos, *status, reason.as_deref(), now),
                    None => WriteResult::Done,
                }
            }
            WriteOp::Purge => self.purge(),
            WriteOp::ForgetAgent { name } => {
                self.claims.retain(|(agent, _), _| agent != name);
                self.subscriptions.remove(name);
                self.agents.remove(name);
                WriteResult::Forgot(name.clone())
            }
            WriteOp::ExtendChain { thread, hops } => {
                let extra = self.chains.entry(thread.clone()).or_insert(0);
                *extra = extra.saturating_add(*hops);
                WriteResult::ChainExtended(thread.clone(), *extra)
            }
            WriteOp::Spawned { record, task_id } => {
                self.spawned.insert(record.name.clone(), record.clone());
                WriteResult::Spawned(record.clone(), task_id.clone())
            }
            WriteOp::SpawnEnded { name, at } => {
                if let Some(r) = self.spawned.get_mut(name)
                    && r.ended_at.is_none()
                {
                    r.ended_at = Some(*at);
                }
                WriteResult::Done
            }
            WriteOp::Claim {
                agent,
                path,
                since,
                until,
            } => {
                self.claims
                    .insert((agent.clone(), path.clone()), (*since, *until));
                WriteResult::Done
            }
            WriteOp::Unclaim { agent, paths } => {
                self.claims
                    .retain(|(a, p), _| a != agent || !(paths.is_empty() || paths.contains(p)));
                WriteResult::Done
            }
        }
    }
}

impl Store for MemoryStore {
    fn write_batch(
        &mut self,
        ops: &[WriteOp],
        now_ms: u64,
    ) -> Result<Vec<WriteResult>, StoreError> {
        // No operation can fail in memory, so there is nothing to roll back.
        Ok(ops.iter().map(|op| self.apply(op, now_ms)).collect())
    }

    fn take_pending(
        &mut self,
        recipient: &str,
        after_pos: i64,
        limit: usize,
    ) -> Result<Vec<PendingDelivery>, StoreError> {
        let after = after_pos.max(self.cursor(recipient));
        let Some(ds) = self.deliveries.get(recipient) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for (&pos, d) in ds.range(after.saturating_add(1)..) {
            if out.len() >= limit {
                break;
            }
            if d.status != DeliveryStatus::Queued {
                continue;
            }
            let Some(m) = usize::try_from(pos - 1)
                .ok()
                .and_then(|i| self.messages.get(i))
            else {
                return Err(StoreError::Corrupt(format!(
                    "delivery to {recipient} of missing message {pos}"
                )));
            };
            out.push(PendingDelivery {
                message: Arc::clone(&m.message),
                seq: d.seq,
                attempt: d.attempts.saturating_add(1),
            });
        }
        Ok(out)
    }

    fn known_agents(&mut self) -> Result<Vec<KnownAgent>, StoreError> {
        Ok(self
            .agents
            .keys()
            .map(|name| KnownAgent {
                name: name.clone(),
                topics: self.topics(name),
            })
            .collect())
    }

    fn agents(&mut self) -> Result<Vec<AgentInfo>, StoreError> {
        Ok(self
            .agents
            .iter()
            .map(|(name, a)| AgentInfo {
                name: name.clone(),
                cli: a.cli.clone(),
                online: false,
                first_seen: a.first_seen,
                last_seen: a.last_seen,
                pending: self.pending_count(name),
                topics: self.topics(name),
                state: AgentState::Offline,
                since: None,
                why: None,
                thread: None,
                last_activity: None,
            })
            .collect())
    }

    fn find(&mut self, id_or_prefix: &str, limit: usize) -> Result<Vec<MessageRecord>, StoreError> {
        let lo = (id_or_prefix.to_owned(), String::new());
        let exact: Vec<i64> = self
            .by_id
            .range(lo.clone()..)
            .take_while(|((id, _), _)| id == id_or_prefix)
            .take(limit)
            .map(|(_, &pos)| pos)
            .collect();
        let positions = if exact.is_empty() {
            // Prefix matches, and short-id matches for a query of that length, in id order.
            let hi = prefix_upper_bound(id_or_prefix);
            let mut found: BTreeMap<(&str, &str), i64> = self
                .by_id
                .range(lo..)
                .take_while(|((id, _), _)| hi.as_deref().is_none_or(|hi| id.as_str() < hi))
                .take(limit)
                .map(|((id, from), &pos)| ((id.as_str(), from.as_str()), pos))
                .collect();
            if relay_protocol::is_short_id_len(id_or_prefix) {
                // A scan, as in the SQLite store: no index of random keys to keep on append.
                found.extend(
                    self.by_id
                        .iter()
                        .filter(|((id, _), _)| relay_protocol::short_id(id) == id_or_prefix)
                        .map(|((id, from), &pos)| ((id.as_str(), from.as_str()), pos)),
                );
            }
            found.into_values().take(limit).collect()
        } else {
            exact
        };
        Ok(positions
            .into_iter()
            .filter_map(|p| self.message(p))
            .map(|m| self.to_record(m))
            .collect())
    }

    fn history(&mut self, filter: &HistoryFilter) -> Result<Vec<MessageRecord>, StoreError> {
        let limit = history_limit(filter);
        let end = filter.before_pos.map_or(self.messages.len(), |b| {
            usize::try_from(b.saturating_sub(1))
                .unwrap_or(0)
                .min(self.messages.len())
        });
        let matches = |m: &MemMessage| {
            let s = &m.message;
            filter.from.as_ref().is_none_or(|f| &s.from == f)
                && filter
                    .to
                    .as_ref()
                    .is_none_or(|t| &s.to == t || m.recipients.contains(t))
                && filter
                    .topic
                    .as_ref()
                    .is_none_or(|t| s.topic.as_ref() == Some(t))
                && filter
                    .text
                    .as_ref()
                    .is_none_or(|t| s.payload.body.contains(t.as_str()))
                && filter.since_ms.is_none_or(|since| s.ts >= since)
                && filter.until_ms.is_none_or(|until| s.ts < until)
        };
        Ok(self.messages[..end]
            .iter()
            .rev()
            .filter(|m| matches(m))
            .take(limit)
            .map(|m| self.to_record(m))
            .collect())
    }

    fn stats(&mut self) -> Result<Stats, StoreError> {
        Ok(Stats {
            messages: self.messages.len() as u64,
            pending: self.deliveries.keys().map(|r| self.pending_count(r)).sum(),
        })
    }

    fn location(&self) -> String {
        ":memory:".to_owned()
    }

    fn events(
        &mut self,
        pos: Option<i64>,
        msg_id: &str,
        from: &str,
    ) -> Result<Vec<relay_protocol::query::TraceEvent>, StoreError> {
        Ok(self.trace_events(pos, msg_id, from))
    }

    fn find_rejected(
        &mut self,
        id_or_prefix: &str,
        limit: usize,
    ) -> Result<Vec<relay_protocol::query::DeadLetter>, StoreError> {
        Ok(self.rejected_matching(id_or_prefix, limit))
    }

    fn dead_letters(
        &mut self,
        all: bool,
        limit: usize,
    ) -> Result<Vec<relay_protocol::query::DeadLetter>, StoreError> {
        Ok(self.list_dlq(all, limit))
    }

    fn dead_letter(
        &mut self,
        dlq_id: i64,
    ) -> Result<Option<relay_protocol::query::DeadLetter>, StoreError> {
        Ok(self.get_dlq(dlq_id))
    }

    fn delivery_figures(
        &mut self,
        sample: usize,
    ) -> Result<relay_protocol::query::DeliveryFigures, StoreError> {
        Ok(self.figures(sample))
    }

    fn recent_hops(&mut self, limit: usize) -> Result<Vec<(String, u32)>, StoreError> {
        Ok(self.hops(limit))
    }

    fn unnotified(&mut self, limit: usize) -> Result<Vec<crate::DeadNotice>, StoreError> {
        Ok(self.not_told(limit))
    }

    fn chain_extensions(&mut self) -> Result<Vec<(String, u32)>, StoreError> {
        Ok(self.chains.iter().map(|(t, n)| (t.clone(), *n)).collect())
    }

    fn spawned(&mut self) -> Result<Vec<relay_protocol::query::SpawnRecord>, StoreError> {
        let mut v: Vec<_> = self.spawned.values().cloned().collect();
        v.sort_by_key(|r| r.at);
        Ok(v)
    }
    fn claims(&mut self) -> Result<Vec<relay_protocol::claims::ClaimInfo>, StoreError> {
        Ok(self
            .claims
            .iter()
            .map(
                |((agent, path), (since, until))| relay_protocol::claims::ClaimInfo {
                    agent: agent.clone(),
                    path: path.clone(),
                    since: *since,
                    until: *until,
                },
            )
            .collect())
    }
}

impl MemoryStore {
    fn topics(&self, agent: &str) -> Vec<String> {
        self.subscriptions
            .get(agent)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }
}
