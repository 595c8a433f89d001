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
//! Two implementations: [`SqliteStore`] (WAL, versioned migrations) and [`MemoryStore`].

mod common;
mod memory;
mod names;
mod sqlite;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use relay_protocol::Send;
use relay_protocol::query::{AgentInfo, DeliveryStatus, HistoryFilter, MessageRecord};

pub use memory::MemoryStore;
pub use sqlite::SqliteStore;

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
    /// `except` become expired.
    Expire {
        /// Cut-off time.
        queued_before: u64,
        /// Recipients to leave alone (those online now).
        except: Vec<String>,
    },
}

/// Result of one [`WriteOp`], same position in the batch.
#[derive(Debug, Clone, PartialEq)]
pub enum WriteResult {
    /// For [`WriteOp::Append`].
    Appended(AppendOutcome),
    /// For [`WriteOp::Expire`]: how many deliveries expired.
    Expired(u64),
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

    /// Messages whose id equals `id_or_prefix` or starts with it, at most `limit`, with their
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
}
