//! Durable storage for agent-relay: messages, per-recipient deliveries, stream sequence numbers,
//! agents, sessions and subscriptions.
//!
//! The [`Store`] trait is synchronous and takes `&mut self`: exactly one thread (the daemon's
//! store actor) owns a store. Writes come in batches through [`Store::write_batch`], and a batch
//! is one transaction — that is the group commit that keeps persistence from capping throughput.
//!
//! The store, not the router, allocates sequence numbers: inside the same transaction that
//! inserts a message it gives each recipient the next `seq` of its `(recipient, topic, sender)`
//! stream. A duplicate `(from, id)` is detected in that transaction too and gets no seq, so the
//! streams stay gapless whatever clients re-send.
//!
//! Two implementations: [`SqliteStore`] (WAL, versioned migrations, fsync per commit unless
//! [`Durability::Normal`] is asked for) and [`MemoryStore`].

mod common;
mod memory;
mod names;
mod sqlite;
#[cfg(test)]
mod tests;
mod watermark;

use std::sync::Arc;

use relay_protocol::Send;
use relay_protocol::query::{
    AgentInfo, DeadLetter, DeliveryFigures, DeliveryStatus, HistoryFilter, MessageRecord,
    TraceEvent,
};

pub use memory::MemoryStore;
pub use sqlite::{Durability, SqliteStore};

/// Store failures.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// SQLite said no.
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The database was written by a newer agent-relay.
    #[error(
        "database schema version {found} is newer than this agent-relay supports ({supported}); upgrade agent-relay"
    )]
    SchemaTooNew {
        /// Version in the file.
        found: i64,
        /// Newest version this build knows.
        supported: i64,
    },
    /// Stored data that does not decode (corruption or a bug).
    #[error("corrupt stored data: {0}")]
    Corrupt(String),
    /// Could not create the database's directory.
    #[error("cannot create {path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// One recipient of a message being appended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recipient {
    /// Agent name.
    pub name: String,
}

/// A message to store, with its recipients already resolved by the router.
#[derive(Debug, Clone, PartialEq)]
pub struct NewMessage {
    /// Sender-chosen id; `(from, id)` is unique.
    pub id: String,
    /// Sender (stamped by the daemon from the connection).
    pub from: String,
    /// Recipient name or `*`.
    pub to: String,
    /// Topic, if any.
    pub topic: Option<String>,
    /// Kind, body, data, thread, in_reply_to, budget.
    pub payload: Send,
    /// Sender's session.
    pub session_id: Option<String>,
    /// Who gets a copy; may be empty (a broadcast nobody hears is still stored).
    pub recipients: Vec<Recipient>,
    /// When its deliveries count as queued (Unix ms), if earlier than now: a message from
    /// another node of a federation was accepted there first, and its time to live runs from
    /// then (docs/FEDERATION.md). `None`: now.
    pub queued_at: Option<u64>,
}

/// A message as stored, shared by every recipient's delivery.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredMessage {
    /// Store position; increases with every stored message.
    pub pos: i64,
    /// Sender-chosen id.
    pub id: String,
    /// When it was stored (Unix ms).
    pub ts: u64,
    /// Sender.
    pub from: String,
    /// Recipient name or `*`.
    pub to: String,
    /// Topic.
    pub topic: Option<String>,
    /// Payload as sent.
    pub payload: Send,
}

/// What became of one appended message.
#[derive(Debug, Clone, PartialEq)]
pub enum AppendOutcome {
    /// Stored now. `seqs[i]` is the seq given to `recipients[i]`.
    Stored {
        /// The message as stored.
        message: Arc<StoredMessage>,
        /// One seq per recipient, same order as [`NewMessage::recipients`].
        seqs: Vec<u64>,
    },
    /// `(from, id)` was stored before (possibly earlier in the same batch); nothing was written.
    Duplicate {
        /// Position of the original.
        pos: i64,
    },
    /// Another sender's message has this id; nothing was written. An id names one message
    /// (issue 24.7: a full id always resolves), so the sender must choose another.
    Taken {
        /// The sender whose message has the id.
        owner: String,
    },
}

/// A write; a batch of them is one transaction.
// Appends are most of the ops in a batch, so boxing the large variant would add an allocation
// per message and save no memory.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum WriteOp {
    /// Store a message and one queued delivery per recipient.
    Append(NewMessage),
    /// Every queued delivery to `recipient` with position `<= through` is now acked.
    AckThrough {
        /// Recipient.
        recipient: String,
        /// Highest position covered.
        through: i64,
    },
    /// A session of `recipient` ended after being handed every delivery in positions
    /// `(after, through]`; those still queued count one more attempt, so their replay says so.
    /// (Recorded once per ended session rather than once per delivery: cheap, and a daemon
    /// crash can only make a replay's attempt number too low, never too high.)
    HandedOut {
        /// Recipient.
        recipient: String,
        /// Positions above this...
        after: i64,
        /// ...up to and including this.
        through: i64,
    },
    /// Set one delivery's status (verified, failed, an out-of-order ack...).
    SetStatus {
        /// Recipient.
        recipient: String,
        /// Message position.
        pos: i64,
        /// New status.
        status: DeliveryStatus,
        /// Why, for a failure (the recipient's NACK reason): the dead letter's reason.
        reason: Option<String>,
    },
    /// Like [`WriteOp::SetStatus`], for the newest message with id `msg_id` that has a
    /// delivery to `recipient` (a later state reported after the message was acknowledged,
    /// when the daemon no longer has its position at hand).
    MarkById {
        /// Recipient.
        recipient: String,
        /// Message id.
        msg_id: String,
        /// New status.
        status: DeliveryStatus,
        /// Why, for a failure (the recipient's NACK reason): the dead letter's reason.
        reason: Option<String>,
    },
    /// An agent connected (creates it on first sight).
    AgentConnected {
        /// Name.
        name: String,
        /// CLI it reported.
        cli: Option<String>,
        /// New session id.
        session_id: String,
    },
    /// An agent's session ended.
    AgentDisconnected {
        /// Name.
        name: String,
        /// The session that ended.
        session_id: String,
    },
    /// Add a subscription (idempotent).
    Subscribe {
        /// Agent.
        agent: String,
        /// Topic pattern.
        pattern: String,
    },
    /// Remove a subscription (idempotent).
    Unsubscribe {
        /// Agent.
        agent: String,
        /// Topic pattern.
        pattern: String,
    },
    /// Queued deliveries stored before `queued_before` (Unix ms) to any recipient not in
    /// `except` become expired, and each goes to the dead-letter queue.
    Expire {
        /// Cut-off time.
        queued_before: u64,
        /// Recipients to leave alone (those online now).
        except: Vec<String>,
    },
    /// A session of `recipient` was handed the deliveries in positions `(after, through]`
    /// at about `at` (Unix ms): the "delivered" stage of the trace, recorded as one range per
    /// flush instead of one row per message.
    Sent {
        /// Recipient.
        recipient: String,
        /// Its session.
        session_id: String,
        /// Positions above this...
        after: i64,
        /// ...up to and including this.
        through: i64,
        /// When the first of them was written to the connection.
        at: u64,
    },
    /// A SEND refused before it was stored (access rule, rate limit, budget): goes to the
    /// dead-letter queue with its content, so it can be retried.
    Reject {
        /// The refused message (its recipients are ignored). Boxed: a rare op should not make
        /// every write bigger.
        message: Box<NewMessage>,
        /// `forbidden`, `rate_limited`, `budget_exceeded`.
        code: String,
        /// Says why.
        reason: String,
    },
    /// Takes a dead letter out of the queue (see [`RetryOutcome`]).
    Retry {
        /// Its number.
        dlq_id: i64,
    },
    /// Removes every dead letter.
    Purge,
    /// Forgets an agent: it leaves the agent list and its subscriptions are removed. Messages
    /// stored for it stay (they are delivered if it connects again, or expire).
    ForgetAgent {
        /// Name.
        name: String,
    },
    /// The reply chain of `thread` may run `hops` more replies (added to what it had).
    ExtendChain {
        /// The chain's thread.
        thread: String,
        /// Replies more.
        hops: u32,
    },
    /// A spawned worker's record (a name spawned again replaces its old one). `task_id` is
    /// not stored: it is handed back in [`WriteResult::Spawned`] for the answer.
    Spawned {
        /// The record.
        record: relay_protocol::query::SpawnRecord,
        /// The id of its task message.
        task_id: Option<String>,
    },
    /// A spawned worker was released or exited: its record ends (once).
    SpawnEnded {
        /// Its name.
        name: String,
        /// When (Unix ms).
        at: u64,
    },
    /// `agent` claims `path` from `since` until `until` (Unix ms); a claim of the same path by
    /// the same agent is replaced (renewed).
    Claim {
        /// The agent.
        agent: String,
        /// The path, in normal form.
        path: String,
        /// When claimed.
        since: u64,
        /// When it expires.
        until: u64,
    },
    /// `agent` releases its claims of `paths` (every claim it holds when empty).
    Unclaim {
        /// The agent.
        agent: String,
        /// Paths; empty: all.
        paths: Vec<String>,
    },
    /// The sender of this dead letter has been told (its notice is stored).
    Notified {
        /// Its number.
        dlq_id: i64,
    },
}

/// A copy of a message that will not be delivered, for telling its sender.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadNotice {
    /// Its dead-letter number.
    pub dlq_id: i64,
    /// Message id.
    pub msg_id: String,
    /// Sender.
    pub from: String,
    /// Recipient that did not get it.
    pub recipient: String,
    /// `expired` or `failed`.
    pub code: String,
    /// Says why.
    pub reason: String,
}

/// What [`WriteOp::Retry`] did.
// Rare (an operator's command), so the size of the message variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum RetryOutcome {
    /// A stored copy is queued again for its recipient (with a fresh time to live).
    Requeued {
        /// Recipient.
        recipient: String,
        /// The delivery, to hand over at once if the recipient is online.
        delivery: PendingDelivery,
        /// The entry, now marked retried.
        entry: DeadLetter,
    },
    /// A refused SEND: the caller sends it again.
    Resend {
        /// The message as it was sent.
        message: NewMessage,
        /// The entry, now marked retried.
        entry: DeadLetter,
    },
    /// The entry was retried before; nothing was done.
    AlreadyRetried(DeadLetter),
    /// No such entry.
    NotFound,
}

/// Result of one [`WriteOp`], same position in the batch.
#[derive(Debug, Clone, PartialEq)]
pub enum WriteResult {
    /// For [`WriteOp::Append`].
    Appended(AppendOutcome),
    /// For [`WriteOp::Expire`]: the deliveries that expired.
    Expired(Vec<DeadNotice>),
    /// For [`WriteOp::SetStatus`] to failed: the dead letter made.
    DeadLettered(Vec<DeadNotice>),
    /// For [`WriteOp::Retry`].
    Retried(Box<RetryOutcome>),
    /// For [`WriteOp::Purge`]: entries removed.
    Purged(u64),
    /// For [`WriteOp::ForgetAgent`]: the agent's name.
    Forgot(String),
    /// For [`WriteOp::ExtendChain`]: the thread and its extension in all.
    ChainExtended(String, u32),
    /// For [`WriteOp::Spawned`]: the record and its task's id.
    Spawned(relay_protocol::query::SpawnRecord, Option<String>),
    /// For every other op.
    Done,
}

/// A stored delivery waiting for its recipient.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingDelivery {
    /// The message.
    pub message: Arc<StoredMessage>,
    /// Its seq in the recipient's stream.
    pub seq: u64,
    /// 1 + how many ended sessions were handed it without acknowledging it.
    pub attempt: u32,
}

/// A known agent and its subscriptions, for the router at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownAgent {
    /// Name.
    pub name: String,
    /// Topic patterns.
    pub topics: Vec<String>,
}

/// Counters for `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    /// Messages stored.
    pub messages: u64,
    /// Deliveries still queued.
    pub pending: u64,
}

/// Durable storage. One owner; see the crate docs.
pub trait Store: std::marker::Send {
    /// Applies `ops` in order as one transaction. On error nothing of the batch is kept
    /// (including sequence numbers handed out inside it).
    ///
    /// # Errors
    /// [`StoreError`] when the transaction fails.
    fn write_batch(&mut self, ops: &[WriteOp], now_ms: u64)
    -> Result<Vec<WriteResult>, StoreError>;

    /// Up to `limit` queued deliveries to `recipient` with position `> after_pos`, oldest first.
    /// Reads only: hand-outs are recorded with [`WriteOp::HandedOut`] when a session ends.
    ///
    /// # Errors
    /// [`StoreError`].
    fn take_pending(
        &mut self,
        recipient: &str,
        after_pos: i64,
        limit: usize,
    ) -> Result<Vec<PendingDelivery>, StoreError>;

    /// Every agent ever connected, with its subscriptions.
    ///
    /// # Errors
    /// [`StoreError`].
    fn known_agents(&mut self) -> Result<Vec<KnownAgent>, StoreError>;

    /// Agent details for `agents`; `online` is false in every entry (the daemon fills it in).
    ///
    /// # Errors
    /// [`StoreError`].
    fn agents(&mut self) -> Result<Vec<AgentInfo>, StoreError>;

    /// Messages whose id equals `id_or_prefix`, or else starts with it or (for a query of
    /// [`relay_protocol::SHORT_ID_LEN`] characters) has it as its
    /// [short id](relay_protocol::short_id), at most `limit`, in id order, with their
    /// deliveries. An exact match, when present, is the only result.
    ///
    /// # Errors
    /// [`StoreError`].
    fn find(&mut self, id_or_prefix: &str, limit: usize) -> Result<Vec<MessageRecord>, StoreError>;

    /// Messages matching `filter`, newest first, with their deliveries.
    ///
    /// # Errors
    /// [`StoreError`].
    fn history(&mut self, filter: &HistoryFilter) -> Result<Vec<MessageRecord>, StoreError>;

    /// Counters.
    ///
    /// # Errors
    /// [`StoreError`].
    fn stats(&mut self) -> Result<Stats, StoreError>;

    /// Where the data lives (`:memory:` for the memory store).
    fn location(&self) -> String;

    /// The recorded state changes of the message at `pos` (delivered, verified, failed,
    /// expired, dead-lettered, retried) and of refused SENDs with id `msg_id` from `from`.
    /// States derived from the message and delivery rows (accepted, queued, injected) are
    /// added by [`trace_of`].
    ///
    /// # Errors
    /// [`StoreError`].
    fn events(
        &mut self,
        pos: Option<i64>,
        msg_id: &str,
        from: &str,
    ) -> Result<Vec<TraceEvent>, StoreError>;

    /// Refused SENDs whose id equals `id_or_prefix`, starts with it, or has it as its short id
    /// (as for [`Store::find`]), at most `limit`.
    ///
    /// # Errors
    /// [`StoreError`].
    fn find_rejected(
        &mut self,
        id_or_prefix: &str,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, StoreError>;

    /// Dead letters, newest first; retried ones only with `all`.
    ///
    /// # Errors
    /// [`StoreError`].
    fn dead_letters(&mut self, all: bool, limit: usize) -> Result<Vec<DeadLetter>, StoreError>;

    /// One dead letter.
    ///
    /// # Errors
    /// [`StoreError`].
    fn dead_letter(&mut self, dlq_id: i64) -> Result<Option<DeadLetter>, StoreError>;

    /// Counts by state and latencies over the newest `sample` acknowledged deliveries.
    ///
    /// # Errors
    /// [`StoreError`].
    fn delivery_figures(&mut self, sample: usize) -> Result<DeliveryFigures, StoreError>;

    /// The hop counts of the newest `limit` messages that carry a budget: `(id, hops)`.
    ///
    /// # Errors
    /// [`StoreError`].
    fn recent_hops(&mut self, limit: usize) -> Result<Vec<(String, u32)>, StoreError>;

    /// Dead letters (expired, failed) whose sender has not been told yet, oldest first: those
    /// made just before a crash. The daemon tells them at start.
    ///
    /// # Errors
    /// [`StoreError`].
    fn unnotified(&mut self, limit: usize) -> Result<Vec<DeadNotice>, StoreError>;

    /// Every reply chain's hop-budget extension ([`WriteOp::ExtendChain`]): (thread, replies
    /// more), loaded at start.
    ///
    /// # Errors
    /// [`StoreError`] when the database cannot be read.
    fn chain_extensions(&mut self) -> Result<Vec<(String, u32)>, StoreError>;

    /// Every spawned worker's record ([`WriteOp::Spawned`]), oldest first, loaded at start.
    ///
    /// # Errors
    /// [`StoreError`] when the database cannot be read.
    fn spawned(&mut self) -> Result<Vec<relay_protocol::query::SpawnRecord>, StoreError>;
    /// Every claim stored ([`WriteOp::Claim`]), expired ones included (the daemon drops them),
    /// loaded at start.
    ///
    /// # Errors
    /// [`StoreError`] when the database cannot be read.
    fn claims(&mut self) -> Result<Vec<relay_protocol::claims::ClaimInfo>, StoreError>;
}

/// The whole story of a stored message: accepted, queued per recipient, the recorded events,
/// and the acknowledgement time of copies the recipient acknowledged (injected), in time order.
pub fn trace_of(record: &MessageRecord, events: Vec<TraceEvent>) -> Vec<TraceEvent> {
    use relay_protocol::query::TraceState;
    let mut out = vec![TraceEvent {
        ts: record.ts,
        recipient: None,
        state: TraceState::Accepted,
        detail: None,
    }];
    for d in &record.deliveries {
        out.push(TraceEvent {
            ts: d.queued_at,
            recipient: Some(d.recipient.clone()),
            state: TraceState::Queued,
            detail: Some(format!("seq {}", d.seq)),
        });
        if d.status == DeliveryStatus::Acked
            && let Some(at) = d.updated_at
        {
            out.push(TraceEvent {
                ts: at,
                recipient: Some(d.recipient.clone()),
                state: TraceState::Injected,
                detail: Some("acknowledged by the recipient".into()),
            });
        }
    }
    out.extend(events);
    // Stable: equal times keep the order above (accepted before queued before the rest).
    out.sort_by_key(|e| (e.ts, e.state));
    out
}

/// [`WriteResult::Retried`], boxed.
pub(crate) fn retried(o: RetryOutcome) -> WriteResult {
    WriteResult::Retried(Box::new(o))
}

/// Nearest-rank percentiles of `values` (sorted here) as a [`StageLatency`].
pub(crate) fn stage(name: &str, mut values: Vec<u64>) -> relay_protocol::query::StageLatency {
    values.sort_unstable();
    let at = |q: f64| -> u64 {
        if values.is_empty() {
            return 0;
        }
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let i = ((values.len() as f64) * q).ceil() as usize;
        values[i.clamp(1, values.len()) - 1]
    };
    relay_protocol::query::StageLatency {
        stage: name.to_owned(),
        samples: values.len() as u64,
        p50_ms: at(0.5),
        p90_ms: at(0.9),
        p99_ms: at(0.99),
        max_ms: values.last().copied().unwrap_or(0),
    }
}
