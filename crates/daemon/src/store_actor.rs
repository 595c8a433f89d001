//! The store actor: a dedicated thread that owns the [`Store`] and commits writes in groups.
//!
//! It takes commands from a bounded channel, gathers every write that is waiting (up to
//! [`MAX_BATCH`]) into one transaction, and reports results to the router on a single FIFO
//! channel, in command order. The router relies on that order: a pending-load answer always
//! comes after the results of every write committed before it, which is what lets a recipient
//! switch from "catching up from the store" to "live" without a gap or a duplicate.
//!
//! Right after a commit returns, it queues the DELIVER of each committed message on the
//! writer of every recipient the router pre-approved ([`Handover`], issue 26 point 2), before
//! telling the router: the message goes out without waiting for the router task to wake up.
//! A queue it cannot put a DELIVER on (full or closed) is *closed* to it: it hands that
//! connection nothing more until the router, having sent the rest itself in order, reopens it
//! ([`StoreCmd::Reopen`]).

use std::collections::{HashMap, HashSet};
use std::thread::JoinHandle;

use relay_protocol::query::{QueryRequest, QueryResult};
use relay_store::{AppendOutcome, Store, WriteOp, WriteResult};
use tokio::sync::mpsc;

use crate::clock::now_ms;
use crate::msg::{DeliverItem, Handover, Outbound, StoreCmd, StoreEvent, WriteCtx};

/// Acknowledged deliveries the `status` latency percentiles are computed over.
const LATENCY_SAMPLE: usize = 1000;

/// Most writes committed in one transaction.
pub(crate) const MAX_BATCH: usize = 4096;

/// A previous batch this large means the daemon is under load (at light load a batch holds a
/// message and an acknowledgement or two).
const UNDER_LOAD: usize = 16;
/// Below this many waiting commands (under load), wait [`GATHER_WAIT`] for more.
const GATHER_TARGET: usize = 256;
/// How long to wait for a fuller batch under load.
const GATHER_WAIT: std::time::Duration = std::time::Duration::from_micros(1000);

fn drain(rx: &mut mpsc::Receiver<StoreCmd>, cmds: &mut Vec<StoreCmd>) {
    while cmds.len() < MAX_BATCH {
        match rx.try_recv() {
            Ok(c) => cmds.push(c),
            Err(_) => break,
        }
    }
}

/// Connections the store thread hands no DELIVER to until the router reopens them: one of
/// their DELIVERs could not be queued, and the router sends it (and everything after it until
/// it reopens the connection), so one handed here would overtake it.
#[derive(Debug, Default)]
pub(crate) struct Closed(HashSet<u64>);

/// Starts the store thread.
pub(crate) fn spawn(
    mut store: Box<dyn Store>,
    mut rx: mpsc::Receiver<StoreCmd>,
    events: mpsc::UnboundedSender<StoreEvent>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("relay-store".into())
        .spawn(move || {
            let mut cmds: Vec<StoreCmd> = Vec::with_capacity(MAX_BATCH);
            let mut last_batch = 0usize;
            let mut closed = Closed::default();
            while let Some(first) = rx.blocking_recv() {
                cmds.push(first);
                drain(&mut rx, &mut cmds);
                // Under load, a commit per handful of writes rewrites the same hot pages into
                // the WAL over and over; waiting a moment for more makes each commit carry
                // more (measured: ~85k -> ~103k msgs/s). At light load writes are committed at
                // once.
                if last_batch >= UNDER_LOAD && cmds.len() < GATHER_TARGET {
                    std::thread::sleep(GATHER_WAIT);
                    drain(&mut rx, &mut cmds);
                }
                last_batch = cmds.len();
                run_commands(store.as_mut(), &mut cmds, &events, &mut closed);
            }
            tracing::debug!("store actor: channel closed, exiting");
        })
}

/// Executes commands in order: consecutive writes become one transaction.
pub(crate) fn run_commands(
    store: &mut dyn Store,
    cmds: &mut Vec<StoreCmd>,
    events: &mpsc::UnboundedSender<StoreEvent>,
    closed: &mut Closed,
) {
    let mut ops: Vec<WriteOp> = Vec::new();
    let mut ctxs: Vec<WriteCtx> = Vec::new();
    for cmd in cmds.drain(..) {
        match cmd {
            StoreCmd::Write(op, ctx) => {
                ops.push(op);
                ctxs.push(ctx);
            }
            StoreCmd::TakePending {
                recipient,
                conn_id,
                after,
                limit,
            } => {
                flush(store, &mut ops, &mut ctxs, events, closed);
                let deliveries = store
                    .take_pending(&recipient, after, limit)
                    .map_err(|e| e.to_string());
                send_event(
                    events,
                    StoreEvent::Pending {
                        recipient,
                        conn_id,
                        deliveries,
                        limit,
                    },
                );
            }
            StoreCmd::Query(req, ctx) => {
                flush(store, &mut ops, &mut ctxs, events, closed);
                let (result, stats) = answer(store, &req);
                // The status figures scan the deliveries: only for `status`.
                let figures = matches!(req, QueryRequest::Status)
                    .then(|| store.delivery_figures(LATENCY_SAMPLE).ok())
                    .flatten()
                    .map(Box::new);
                send_event(
                    events,
                    StoreEvent::Query(Box::new(ctx), result.map(Box::new), stats, figures),
                );
            }
            // After the writes before it (rare: a slow reader, or a session that ended with
            // pre-approved DELIVERs outstanding), so that none of those is handed over.
            StoreCmd::Reopen { conn_id } => {
                flush(store, &mut ops, &mut ctxs, events, closed);
                closed.0.remove(&conn_id);
            }
        }
    }
    flush(store, &mut ops, &mut ctxs, events, closed);
}

/// Commits the gathered writes as one batch. Acknowledgement cursors of the same recipient are
/// merged first: only the highest matters, and moving it to the end of the batch is safe
/// because it only covers rows that were stored (and sent) before.
fn flush(
    store: &mut dyn Store,
    ops: &mut Vec<WriteOp>,
    ctxs: &mut Vec<WriteCtx>,
    events: &mpsc::UnboundedSender<StoreEvent>,
    closed: &mut Closed,
) {
    if ops.is_empty() {
        return;
    }
    let mut cursors: HashMap<String, i64> = HashMap::new();
    let mut batch: Vec<WriteOp> = Vec::with_capacity(ops.len());
    let mut batch_ctx: Vec<WriteCtx> = Vec::with_capacity(ops.len());
    for (op, ctx) in ops.drain(..).zip(ctxs.drain(..)) {
        match op {
            WriteOp::AckThrough { recipient, through } => {
                let e = cursors.entry(recipient).or_insert(through);
                *e = (*e).max(through);
            }
            other => {
                batch.push(other);
                batch_ctx.push(ctx);
            }
        }
    }
    for (recipient, through) in cursors {
        batch.push(WriteOp::AckThrough { recipient, through });
        batch_ctx.push(WriteCtx::None);
    }
    match store.write_batch(&batch, now_ms()) {
        Ok(results) => {
            for res in &results {
                if let WriteResult::Expired(n) = res
                    && !n.is_empty()
                {
                    tracing::info!(
                        deliveries = n.len(),
                        "expired undelivered messages (inbox TTL); dead-lettered"
                    );
                }
            }
            // Every DELIVER first, then the router's events: the messages go out while the
            // router task wakes up.
            for (ctx, res) in batch_ctx.iter_mut().zip(&results) {
                if let WriteCtx::Send { online, raw, .. } = ctx
                    && let WriteResult::Appended(AppendOutcome::Stored { message, seqs }) = res
                {
                    hand_over(online, message, seqs, raw.as_ref(), closed);
                }
            }
            for (ctx, res) in batch_ctx.into_iter().zip(results) {
                if !matches!(ctx, WriteCtx::None) {
                    send_event(events, StoreEvent::Written(ctx, Ok(res)));
                }
            }
        }
        Err(e) => {
            tracing::error!(error = %e, ops = batch.len(), "store batch failed");
            let msg = e.to_string();
            for ctx in batch_ctx {
                send_event(events, StoreEvent::Written(ctx, Err(msg.clone())));
            }
        }
    }
}

/// Queues a committed message's DELIVER on the writer of each pre-approved recipient whose
/// connection is not closed; a queue that refuses it closes its connection (see [`Closed`]).
fn hand_over(
    online: &mut [Handover],
    message: &std::sync::Arc<relay_store::StoredMessage>,
    seqs: &[u64],
    raw: Option<&crate::msg::Raw>,
    closed: &mut Closed,
) {
    for h in online {
        let (Some(w), Some(&seq)) = (&h.writer, seqs.get(h.index)) else {
            continue;
        };
        if closed.0.contains(&h.conn_id) {
            continue;
        }
        let item = DeliverItem {
            msg: message.clone(),
            seq,
            attempt: 1,
            session_id: w.session_id.clone(),
            raw: raw.cloned(),
            confirm: w.confirm,
        };
        if w.tx.try_send(Outbound::Deliver(item)).is_ok() {
            h.handed = true;
        } else {
            closed.0.insert(h.conn_id);
        }
    }
}

/// Hands a result to the router. The router outlives the store thread except while the
/// daemon stops, when nobody is left to act on it (the write itself is committed).
fn send_event(events: &mpsc::UnboundedSender<StoreEvent>, ev: StoreEvent) {
    if events.send(ev).is_err() {
        tracing::debug!("router gone; store result not delivered (daemon stopping)");
    }
}

fn answer(store: &mut dyn Store, req: &QueryRequest) -> (Option<QueryResult>, relay_store::Stats) {
    let internal = |e: relay_store::StoreError| QueryResult::Error {
        code: "internal".into(),
        message: e.to_string(),
    };
    let result = match req {
        QueryRequest::Status => {
            return match store.stats() {
                Ok(stats) => (None, stats),
                Err(e) => (Some(internal(e)), relay_store::Stats::default()),
            };
        }
        QueryRequest::Agents => match store.agents() {
            Ok(agents) => QueryResult::Agents { agents },
            Err(e) => internal(e),
        },
        QueryRequest::Read { id, from } => match store.find(id, 10).map(|f| of_sender(f, from)) {
            // A full id of any length is fine (v1 clients choose their own ids); a prefix must
            // have at least 8 characters so it is unlikely to be ambiguous; a short id has 8.
            Ok(found) if found.len() == 1 && (found[0].id == *id || id.len() >= 8) => {
                let mut found = found;
                QueryResult::Read {
                    message: found.remove(0),
                }
            }
            Ok(_) if id.len() < 8 => QueryResult::Error {
                code: "invalid".into(),
                message: format!(
                    "no message with id {id:?}; as a prefix it is too short: give the short id shown in brackets (8 characters) or at least 8 characters of the id"
                ),
            },
            Ok(found) if found.is_empty() => QueryResult::Error {
                code: "not_found".into(),
                message: format!(
                    "no message with id {id:?}; `agent-relay history` lists recent ids"
                ),
            },
            Ok(found) => ambiguous(
                id,
                &found
                    .iter()
                    .map(|m| (m.id.clone(), m.from.clone()))
                    .collect::<Vec<_>>(),
            ),
            Err(e) => internal(e),
        },
        QueryRequest::History(filter) => match store.history(filter) {
            Ok(messages) => QueryResult::History { messages },
            Err(e) => internal(e),
        },
        QueryRequest::Trace { id, from } => {
            trace(store, id, from.as_deref()).unwrap_or_else(internal)
        }
        QueryRequest::DlqList { all, limit } => {
            let limit = limit.map_or(50, |l| l.clamp(1, 1000) as usize);
            match store.dead_letters(*all, limit) {
                Ok(dead_letters) => QueryResult::DlqList { dead_letters },
                Err(e) => internal(e),
            }
        }
        QueryRequest::DlqShow { dlq_id } => match store.dead_letter(*dlq_id) {
            Ok(Some(dead_letter)) => QueryResult::DlqShow { dead_letter },
            Ok(None) => QueryResult::Error {
                code: "not_found".into(),
                message: format!("no dead letter {dlq_id}; `agent-relay dlq list` shows them"),
            },
            Err(e) => internal(e),
        },
        // Writes: the router sends these as store writes, never as queries.
        QueryRequest::DlqRetry { .. }
        | QueryRequest::DlqPurge
        | QueryRequest::ForgetAgent { .. }
        | QueryRequest::ChainExtend { .. }
        | QueryRequest::Spawn(_)
        | QueryRequest::Release { .. }
        | QueryRequest::SpawnExited { .. } => QueryResult::Error {
            code: "internal".into(),
            message: "not a read".into(),
        },
        // The router answers `watch` and the claims from what it holds; they never reach the
        // store as queries.
        QueryRequest::Watch(_)
        | QueryRequest::Claim { .. }
        | QueryRequest::Unclaim { .. }
        | QueryRequest::Claims
        | QueryRequest::Edited { .. } => QueryResult::Error {
            code: "invalid".into(),
            message: "watch is not a stored-data query".into(),
        },
    };
    (Some(result), relay_store::Stats::default())
}

/// Only the messages of sender `from`, when one is given (issue 24.7: ids are unique per
/// sender, so an id and its sender always name one message).
fn of_sender(
    found: Vec<relay_protocol::query::MessageRecord>,
    from: &Option<String>,
) -> Vec<relay_protocol::query::MessageRecord> {
    match from {
        Some(f) => found.into_iter().filter(|m| m.from == *f).collect(),
        None => found,
    }
}

/// The answer when `id` names several messages: each as `ID from SENDER`, and how to name one.
fn ambiguous(id: &str, keys: &[(String, String)]) -> QueryResult {
    let same_id = keys.iter().all(|(i, _)| *i == keys[0].0);
    let hint = match keys.first() {
        // The same id from several senders: only the sender tells them apart.
        Some((i, f)) if same_id => format!(
            "give the sender too, e.g. `--from {}` (`agent-relay read {i} --from {f}`)",
            relay_protocol::text::one_line(f, 64)
        ),
        _ => "give more of the id, or the sender with `--from NAME`".to_owned(),
    };
    QueryResult::Error {
        code: "ambiguous".into(),
        message: format!(
            "{id:?} matches {} messages ({}); {hint}",
            keys.len(),
            keys.iter()
                .map(|(i, f)| format!("{i} from {f}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The story of the message `id` (a whole id or a prefix of at least 8 characters), stored or
/// refused; of sender `from` only, when given.
fn trace(
    store: &mut dyn Store,
    id: &str,
    from: Option<&str>,
) -> Result<QueryResult, relay_store::StoreError> {
    use relay_protocol::query::TraceRecord;
    let stored = store.find(id, 10)?;
    let refused = store.find_rejected(id, 10)?;
    // One candidate per (id, sender): a refused SEND retried and then stored is one story.
    let mut keys: Vec<(String, String)> = stored
        .iter()
        .map(|m| (m.id.clone(), m.from.clone()))
        .collect();
    for r in &refused {
        let k = (r.msg_id.clone(), r.from.clone());
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    if let Some(f) = from {
        keys.retain(|(_, s)| s == f);
    }
    let mut exact: Vec<&(String, String)> = keys.iter().filter(|(i, _)| i == id).collect();
    // A stored message owns its id (issue 24.7): a refused SEND that chose the same id does
    // not make the whole id ambiguous; `--from` names the refused one.
    if exact.len() > 1 && from.is_none() {
        let owned: Vec<&(String, String)> = exact
            .iter()
            .copied()
            .filter(|(i, f)| stored.iter().any(|m| m.id == *i && m.from == *f))
            .collect();
        if owned.len() == 1 {
            exact = owned;
        }
    }
    let chosen = match (exact.as_slice(), keys.as_slice()) {
        ([one], _) => (*one).clone(),
        ([], [one]) if id.len() >= 8 => one.clone(),
        ([], []) | ([], [_]) => {
            return Ok(QueryResult::Error {
                code: if id.len() < 8 { "invalid" } else { "not_found" }.into(),
                message: if id.len() < 8 {
                    format!(
                        "no message with id {id:?}; as a prefix it is too short: give the short id shown in brackets (8 characters) or at least 8 characters of the id"
                    )
                } else {
                    format!("no message with id {id:?}; `agent-relay history` lists recent ids")
                },
            });
        }
        _ => return Ok(ambiguous(id, &keys)),
    };
    let (msg_id, from) = chosen;
    let record = stored
        .into_iter()
        .find(|m| m.id == msg_id && m.from == from);
    let trace = match record {
        Some(m) => {
            let events = store.events(Some(m.pos), &msg_id, &from)?;
            TraceRecord {
                id: m.id.clone(),
                pos: Some(m.pos),
                from: m.from.clone(),
                to: m.to.clone(),
                topic: m.topic.clone(),
                origin: m.origin.clone(),
                events: relay_store::trace_of(&m, events),
            }
        }
        None => {
            let mut events = store.events(None, &msg_id, &from)?;
            events.sort_by_key(|e| (e.ts, e.state));
            let r = refused
                .iter()
                .find(|r| r.msg_id == msg_id && r.from == from);
            TraceRecord {
                id: msg_id.clone(),
                pos: None,
                from: from.clone(),
                to: r.map(|r| r.recipient.clone()).unwrap_or_default(),
                topic: r.and_then(|r| r.topic.clone()),
                origin: None,
                events,
            }
        }
    };
    Ok(QueryResult::Trace { trace })
}
