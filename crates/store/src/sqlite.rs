//! The SQLite store: one WAL database file, one connection owned by the store actor.
//!
//! Throughput comes from keeping the per-message work small: one `messages` row (two index
//! entries) and one `deliveries` row per recipient, in a batch that is one transaction. Stream
//! sequence numbers and ack cursors live in memory (loaded at open) and are upserted once per
//! touched key per batch instead of once per message.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use relay_protocol::query::{
    AgentInfo, DeliveryRecord, DeliveryStatus, HistoryFilter, MessageRecord,
};
use relay_protocol::{Kind, Send};
use rusqlite::types::Value;
use rusqlite::{
    CachedStatement, Connection, OptionalExtension, Row, Transaction, TransactionBehavior, params,
};

use crate::common::{earlier_duplicate, history_limit, prefix_upper_bound, record, to_i64, to_u64};
use crate::{
    AppendOutcome, KnownAgent, NewMessage, PendingDelivery, Stats, Store, StoreError,
    StoredMessage, WriteOp, WriteResult,
};

/// `(recipient, topic or "", sender)`: one gapless seq stream.
type StreamKey = (String, String, String);

/// Schema migrations; entry `i` takes `user_version` from `i` to `i + 1`. Never edit a shipped
/// entry: add a new one, so that existing databases upgrade in place.
const MIGRATIONS: &[&str] = &[
    // v1.
    //
    // `messages.pos` is the rowid, so appends go to the end of the table b-tree. `fanout` is NULL
    // when the only recipient is `recipient` (the usual direct message) and otherwise a JSON
    // array of the recipient names: it lets `find`/`history` fetch deliveries by primary key
    // without a second index on `deliveries(msg)` that every append would have to maintain.
    //
    // `deliveries` is keyed (recipient, msg) WITHOUT ROWID so that one recipient's deliveries
    // are contiguous and in position order: ack-through, replay and expiry are range scans.
    r"
CREATE TABLE messages (
    pos INTEGER PRIMARY KEY,
    id TEXT NOT NULL,
    ts INTEGER NOT NULL,
    sender TEXT NOT NULL,
    recipient TEXT NOT NULL,
    topic TEXT,
    kind TEXT NOT NULL,
    body TEXT NOT NULL,
    data TEXT,
    thread TEXT,
    in_reply_to TEXT,
    budget TEXT,
    session_id TEXT,
    fanout TEXT
);
CREATE UNIQUE INDEX messages_id_sender ON messages (id, sender);
CREATE INDEX messages_topic ON messages (topic) WHERE topic IS NOT NULL;
CREATE TABLE deliveries (
    recipient TEXT NOT NULL,
    msg INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    status INTEGER NOT NULL,
    attempts INTEGER NOT NULL,
    queued_at INTEGER NOT NULL,
    updated_at INTEGER,
    PRIMARY KEY (recipient, msg)
) WITHOUT ROWID;
CREATE TABLE streams (
    recipient TEXT NOT NULL,
    topic TEXT NOT NULL,
    sender TEXT NOT NULL,
    last_seq INTEGER NOT NULL,
    PRIMARY KEY (recipient, topic, sender)
) WITHOUT ROWID;
CREATE TABLE cursors (
    recipient TEXT PRIMARY KEY,
    through INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE agents (
    name TEXT PRIMARY KEY,
    cli TEXT,
    first_seen INTEGER NOT NULL,
    last_seen INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    agent TEXT NOT NULL,
    started_at INTEGER NOT NULL,
    ended_at INTEGER
) WITHOUT ROWID;
CREATE TABLE subscriptions (
    agent TEXT NOT NULL,
    pattern TEXT NOT NULL,
    PRIMARY KEY (agent, pattern)
) WITHOUT ROWID;
",
];

/// Newest schema version this build knows.
const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Message columns in the order [`RawMessage::from_row`] reads them.
const MSG_COLS: &str = "m.pos, m.id, m.ts, m.sender, m.recipient, m.topic, m.kind, m.body, m.data, \
                        m.thread, m.in_reply_to, m.budget, m.fanout";
/// Number of columns in [`MSG_COLS`].
const MSG_NCOLS: usize = 13;

/// `DeliveryStatus::Queued.code()`. The SQL below also spells out `1` (acked) and `4`
/// (expired); `status_codes_match_sql` in the tests pins them.
const QUEUED: i64 = 0;

// The three statements of the hot path, prepared once per batch rather than looked up in the
// statement cache (which hashes the SQL text) once per message.

/// The unique (id, sender) index is the dedupe check: no separate lookup on the common path,
/// and it also sees rows inserted earlier in the same transaction.
const INSERT_MESSAGE: &str = "INSERT INTO messages (id, ts, sender, recipient, topic, kind, body,
    data, thread, in_reply_to, budget, session_id, fanout)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)
    ON CONFLICT (id, sender) DO NOTHING";
const INSERT_DELIVERY: &str = "INSERT INTO deliveries (recipient, msg, seq, status, attempts,
    queued_at) VALUES (?1, ?2, ?3, 0, ?4, ?5)";
/// A primary-key range from the recipient's cursor.
const ACK_THROUGH: &str = "UPDATE deliveries SET status = 1, updated_at = ?1
    WHERE recipient = ?2 AND msg > ?3 AND msg <= ?4 AND status = 0";

/// SQLite-backed [`Store`].
///
/// It must be the only writer of its file (the daemon's lock file ensures that): stream seqs and
/// ack cursors are cached in memory at open. Readers in other processes are fine.
pub struct SqliteStore {
    /// Declared before `conn` so that it stops (and closes its connection) first: the last
    /// connection to close is the one that checkpoints and removes the WAL.
    checkpointer: Checkpointer,
    conn: Connection,
    path: PathBuf,
    /// Last seq of every stream, as committed.
    streams: HashMap<StreamKey, u64>,
    /// Per-recipient ack cursor, as committed. Invariant: no delivery to the recipient at a
    /// position `<=` its cursor is queued, so scans for queued rows can start after it.
    cursors: HashMap<String, i64>,
    /// Highest message position committed.
    max_pos: i64,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path`: creates the parent directories,
    /// switches to WAL with `synchronous=NORMAL`, and migrates the schema.
    ///
    /// # Errors
    /// [`StoreError::Io`] if the directory cannot be created, [`StoreError::SchemaTooNew`] for a
    /// database from a newer agent-relay, [`StoreError::Sqlite`] otherwise.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| StoreError::Io {
                path: dir.display().to_string(),
                source,
            })?;
        }
        let mut conn = Connection::open(path)?;
        // Another process (a second daemon being refused, a CLI reading) may hold the lock
        // briefly; wait rather than fail.
        conn.busy_timeout(Duration::from_secs(5))?;
        // `journal_mode` answers with a row, so it is a query, not an update.
        let _mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
        // NORMAL in WAL mode is durable against process crashes and loses at most the last
        // commits on power loss; FULL would fsync every batch. A 32 MiB page cache (default
        // 2 MiB) keeps the hot ends of the b-trees (newest messages, each recipient's newest
        // deliveries, the id index) in memory as the database grows.
        conn.execute_batch(
            "PRAGMA synchronous = NORMAL;
             PRAGMA temp_store = MEMORY;
             PRAGMA cache_size = -32768;",
        )?;
        // history builds a few SQL variants; keep them all prepared.
        conn.set_prepared_statement_cache_capacity(64);
        migrate(&mut conn)?;
        conn.execute_batch(&format!(
            "PRAGMA wal_autocheckpoint = {FALLBACK_CHECKPOINT_PAGES};"
        ))?;
        let checkpointer = Checkpointer::start(path)?;

        let mut streams = HashMap::new();
        {
            let mut stmt =
                conn.prepare("SELECT recipient, topic, sender, last_seq FROM streams")?;
            let mut rows = stmt.query([])?;
            while let Some(r) = rows.next()? {
                streams.insert((r.get(0)?, r.get(1)?, r.get(2)?), to_u64(r.get(3)?));
            }
        }
        let mut cursors = HashMap::new();
        {
            let mut stmt = conn.prepare("SELECT recipient, through FROM cursors")?;
            let mut rows = stmt.query([])?;
            while let Some(r) = rows.next()? {
                cursors.insert(r.get(0)?, r.get(1)?);
            }
        }
        let max_pos: i64 =
            conn.query_row("SELECT coalesce(max(pos), 0) FROM messages", [], |r| {
                r.get(0)
            })?;
        Ok(Self {
            checkpointer,
            conn,
            path: path.to_path_buf(),
            streams,
            cursors,
            max_pos,
        })
    }

    /// The ack cursor of `recipient` as committed (0 if none).
    fn cursor(&self, recipient: &str) -> i64 {
        self.cursors.get(recipient).copied().unwrap_or(0)
    }

    /// Every recipient that ever had a delivery (each has at least one stream).
    fn recipients(&self) -> BTreeSet<&str> {
        self.streams.keys().map(|k| k.0.as_str()).collect()
    }

    /// Queued deliveries to `recipient`, counted from its cursor.
    fn pending_count(&self, recipient: &str) -> Result<u64, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT count(*) FROM deliveries WHERE recipient = ?1 AND msg > ?2 AND status = 0",
        )?;
        let n: i64 = stmt.query_row(params![recipient, self.cursor(recipient)], |r| r.get(0))?;
        Ok(to_u64(n))
    }

    /// The deliveries of one message, in recipient order.
    fn deliveries_of(
        &self,
        m: &StoredMessage,
        fanout: Option<&[String]>,
    ) -> Result<Vec<DeliveryRecord>, StoreError> {
        let single = [m.to.clone()];
        let names = fanout.unwrap_or(&single);
        let mut stmt = self.conn.prepare_cached(
            "SELECT seq, status, queued_at, updated_at FROM deliveries
             WHERE recipient = ?1 AND msg = ?2",
        )?;
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let row = stmt
                .query_row(params![name, m.pos], |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, i64>(2)?,
                        r.get::<_, Option<i64>>(3)?,
                    ))
                })
                .optional()?;
            // A direct message whose recipient was not resolved has no delivery row.
            let Some((seq, status, queued_at, updated_at)) = row else {
                continue;
            };
            out.push(DeliveryRecord {
                recipient: name.clone(),
                seq: to_u64(seq),
                status: decode_status(status)?,
                queued_at: to_u64(queued_at),
                updated_at: updated_at.map(to_u64),
            });
        }
        Ok(out)
    }

    /// Runs a message query (whose columns start with [`MSG_COLS`]) and attaches deliveries.
    fn records(&self, sql: &str, args: &[Value]) -> Result<Vec<MessageRecord>, StoreError> {
        let raws = {
            let mut stmt = self.conn.prepare_cached(sql)?;
            let rows = stmt.query_map(rusqlite::params_from_iter(args), |r| {
                RawMessage::from_row(r, 0)
            })?;
            rows.collect::<Result<Vec<_>, _>>()?
        };
        let mut out = Vec::with_capacity(raws.len());
        for raw in raws {
            let (m, fanout) = raw.decode()?;
            let deliveries = self.deliveries_of(&m, fanout.as_deref())?;
            out.push(record(&m, deliveries));
        }
        Ok(out)
    }
}

/// WAL size (pages) at which a commit checkpoints by itself; only reached if the background
/// checkpointer falls behind, so the WAL stays bounded even then.
const FALLBACK_CHECKPOINT_PAGES: u32 = 16_384;
/// How long the background checkpointer lets commits accumulate before a checkpoint.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(100);

/// A thread with its own connection that checkpoints the WAL shortly after commits.
///
/// SQLite's automatic checkpoint runs inside the commit that crosses the threshold, so every
/// ~1000 pages one batch would also copy the WAL into the database and fsync it. Measured here
/// over 1M messages in batches of 1000: ~100k msg/s that way, ~160k msg/s with this thread. A
/// PASSIVE checkpoint on another connection does not block the writer, so that work moves off
/// the store thread.
/// The thread sleeps while nothing is written (no idle wake-ups).
struct Checkpointer {
    /// A commit happened; capacity 1, so signals coalesce and sending never blocks.
    wake: Option<mpsc::SyncSender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Checkpointer {
    fn start(path: &Path) -> Result<Self, StoreError> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(Duration::from_secs(5))?;
        let (wake, rx) = mpsc::sync_channel::<()>(1);
        let thread = std::thread::Builder::new()
            .name("relay-checkpoint".into())
            .spawn(move || {
                // Until the store closes (the sender is dropped): wait for a commit, let more
                // pile up for a moment, then copy them all in one checkpoint.
                while rx.recv().is_ok() {
                    let until = Instant::now() + CHECKPOINT_EVERY;
                    loop {
                        match rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
                            Ok(()) => {}
                            Err(mpsc::RecvTimeoutError::Timeout) => break,
                            Err(mpsc::RecvTimeoutError::Disconnected) => return,
                        }
                    }
                    // Errors (busy, I/O) are left to the next round and to the fallback
                    // auto-checkpoint; there is nobody here to report them to.
                    let _ = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
                }
            })
            .map_err(|source| StoreError::Io {
                path: path.display().to_string(),
                source,
            })?;
        Ok(Self {
            wake: Some(wake),
            thread: Some(thread),
        })
    }

    /// Tells the thread that something was committed.
    fn committed(&self) {
        if let Some(w) = &self.wake {
            // Full means a wake-up is already pending; disconnected cannot happen before drop.
            let _ = w.try_send(());
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        // Closing the channel wakes the thread, which then returns and closes its connection.
        drop(self.wake.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Brings the schema up to [`SCHEMA_VERSION`], one transaction per step. The version is read
/// inside each step's write transaction so two processes opening a fresh file do not both run
/// the same step.
fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    loop {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let found: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        if found > SCHEMA_VERSION {
            return Err(StoreError::SchemaTooNew {
                found,
                supported: SCHEMA_VERSION,
            });
        }
        let Some(step) = usize::try_from(found).ok().and_then(|i| MIGRATIONS.get(i)) else {
            return Ok(());
        };
        tx.execute_batch(step)?;
        tx.pragma_update(None, "user_version", found + 1)?;
        tx.commit()?;
    }
}

fn decode_status(code: i64) -> Result<DeliveryStatus, StoreError> {
    DeliveryStatus::from_code(code)
        .ok_or_else(|| StoreError::Corrupt(format!("unknown delivery status {code}")))
}

/// serde_json cannot fail to encode the values we give it (no maps with non-string keys), but
/// if it ever does the batch fails cleanly instead of storing a half message.
fn encode_err(what: &'static str) -> impl Fn(serde_json::Error) -> StoreError {
    move |e| StoreError::Corrupt(format!("cannot encode {what}: {e}"))
}

fn decode_err(what: &'static str, pos: i64) -> impl Fn(serde_json::Error) -> StoreError {
    move |e| StoreError::Corrupt(format!("message {pos}: bad {what}: {e}"))
}

/// A `messages` row before its JSON columns are decoded (decoding errors are ours, not
/// rusqlite's, so they cannot happen inside a row closure).
struct RawMessage {
    pos: i64,
    id: String,
    ts: i64,
    sender: String,
    recipient: String,
    topic: Option<String>,
    kind: String,
    body: String,
    data: Option<String>,
    thread: Option<String>,
    in_reply_to: Option<String>,
    budget: Option<String>,
    fanout: Option<String>,
}

impl RawMessage {
    fn from_row(r: &Row<'_>, base: usize) -> rusqlite::Result<Self> {
        Ok(Self {
            pos: r.get(base)?,
            id: r.get(base + 1)?,
            ts: r.get(base + 2)?,
            sender: r.get(base + 3)?,
            recipient: r.get(base + 4)?,
            topic: r.get(base + 5)?,
            kind: r.get(base + 6)?,
            body: r.get(base + 7)?,
            data: r.get(base + 8)?,
            thread: r.get(base + 9)?,
            in_reply_to: r.get(base + 10)?,
            budget: r.get(base + 11)?,
            fanout: r.get(base + 12)?,
        })
    }

    fn decode(self) -> Result<(StoredMessage, Option<Vec<String>>), StoreError> {
        let pos = self.pos;
        let kind = Kind::parse(&self.kind).ok_or_else(|| {
            StoreError::Corrupt(format!("message {pos}: unknown kind {:?}", self.kind))
        })?;
        let data = match self.data.as_deref() {
            Some(s) => Some(serde_json::from_str(s).map_err(decode_err("data", pos))?),
            None => None,
        };
        let budget = match self.budget.as_deref() {
            Some(s) => Some(serde_json::from_str(s).map_err(decode_err("budget", pos))?),
            None => None,
        };
        let fanout = match self.fanout.as_deref() {
            Some(s) => Some(serde_json::from_str(s).map_err(decode_err("fanout", pos))?),
            None => None,
        };
        let m = StoredMessage {
            pos,
            id: self.id,
            ts: to_u64(self.ts),
            from: self.sender,
            to: self.recipient,
            topic: self.topic,
            payload: Send {
                kind,
                body: self.body,
                data,
                thread: self.thread,
                in_reply_to: self.in_reply_to,
                budget,
            },
        };
        Ok((m, fanout))
    }
}

/// One `write_batch` in progress: the transaction plus the counter changes made so far, which
/// reach the store's maps only after the commit.
struct Batch<'a> {
    tx: &'a Transaction<'a>,
    insert_message: CachedStatement<'a>,
    insert_delivery: CachedStatement<'a>,
    ack_through: CachedStatement<'a>,
    now: i64,
    committed_streams: &'a HashMap<StreamKey, u64>,
    committed_cursors: &'a HashMap<String, i64>,
    streams: HashMap<StreamKey, u64>,
    cursors: HashMap<String, i64>,
    max_pos: i64,
}

impl Batch<'_> {
    fn cursor(&self, recipient: &str) -> i64 {
        self.cursors
            .get(recipient)
            .or_else(|| self.committed_cursors.get(recipient))
            .copied()
            .unwrap_or(0)
    }

    fn next_seq(&mut self, key: StreamKey) -> u64 {
        if let Some(s) = self.streams.get_mut(&key) {
            *s += 1;
            return *s;
        }
        let s = self.committed_streams.get(&key).copied().unwrap_or(0) + 1;
        self.streams.insert(key, s);
        s
    }

    fn apply(&mut self, op: &WriteOp) -> Result<WriteResult, StoreError> {
        let tx = self.tx;
        let now = self.now;
        match op {
            WriteOp::Append(m) => self.append(m).map(WriteResult::Appended),
            WriteOp::AckThrough { recipient, through } => {
                let cursor = self.cursor(recipient);
                if *through > cursor {
                    self.ack_through
                        .execute(params![now, recipient, cursor, through])?;
                    // Never move the cursor past the last stored message: a later message
                    // below it would be invisible to take_pending.
                    let new = (*through).min(self.max_pos);
                    if new > cursor {
                        self.cursors.insert(recipient.clone(), new);
                    }
                }
                Ok(WriteResult::Done)
            }
            WriteOp::HandedOut {
                recipient,
                after,
                through,
            } => {
                let from = (*after).max(self.cursor(recipient));
                if *through > from {
                    tx.prepare_cached(
                        "UPDATE deliveries SET attempts = attempts + 1
                         WHERE recipient = ?1 AND msg > ?2 AND msg <= ?3 AND status = 0",
                    )?
                    .execute(params![recipient, from, through])?;
                }
                Ok(WriteResult::Done)
            }
            WriteOp::SetStatus {
                recipient,
                pos,
                status,
            } => {
                let changed = tx
                    .prepare_cached(
                        "UPDATE deliveries SET status = ?1, updated_at = ?2
                         WHERE recipient = ?3 AND msg = ?4",
                    )?
                    .execute(params![status.code(), now, recipient, pos])?;
                // Re-queueing below the cursor would break its invariant; pull it back.
                if changed > 0
                    && *status == DeliveryStatus::Queued
                    && *pos <= self.cursor(recipient)
                {
                    self.cursors.insert(recipient.clone(), pos - 1);
                }
                Ok(WriteResult::Done)
            }
            WriteOp::AgentConnected {
                name,
                cli,
                session_id,
            } => {
                tx.prepare_cached(
                    "INSERT INTO agents (name, cli, first_seen, last_seen) VALUES (?1, ?2, ?3, ?3)
                     ON CONFLICT (name) DO UPDATE
                     SET cli = coalesce(excluded.cli, cli), last_seen = excluded.last_seen",
                )?
                .execute(params![name, cli, now])?;
                tx.prepare_cached(
                    "INSERT INTO sessions (id, agent, started_at) VALUES (?1, ?2, ?3)
                     ON CONFLICT (id) DO UPDATE
                     SET agent = excluded.agent, started_at = excluded.started_at, ended_at = NULL",
                )?
                .execute(params![session_id, name, now])?;
                Ok(WriteResult::Done)
            }
            WriteOp::AgentDisconnected { name, session_id } => {
                tx.prepare_cached("UPDATE agents SET last_seen = ?1 WHERE name = ?2")?
                    .execute(params![now, name])?;
                tx.prepare_cached("UPDATE sessions SET ended_at = ?1 WHERE id = ?2")?
                    .execute(params![now, session_id])?;
                Ok(WriteResult::Done)
            }
            WriteOp::Subscribe { agent, pattern } => {
                tx.prepare_cached(
                    "INSERT INTO subscriptions (agent, pattern) VALUES (?1, ?2)
                     ON CONFLICT DO NOTHING",
                )?
                .execute(params![agent, pattern])?;
                Ok(WriteResult::Done)
            }
            WriteOp::Unsubscribe { agent, pattern } => {
                tx.prepare_cached("DELETE FROM subscriptions WHERE agent = ?1 AND pattern = ?2")?
                    .execute(params![agent, pattern])?;
                Ok(WriteResult::Done)
            }
            WriteOp::Expire {
                queued_before,
                except,
            } => {
                let mut recipients: BTreeSet<&str> = self
                    .committed_streams
                    .keys()
                    .map(|k| k.0.as_str())
                    .collect();
                recipients.extend(self.streams.keys().map(|k| k.0.as_str()));
                let mut stmt = tx.prepare_cached(
                    "UPDATE deliveries SET status = 4, updated_at = ?1
                     WHERE recipient = ?2 AND msg > ?3 AND status = 0 AND queued_at < ?4",
                )?;
                let mut n = 0u64;
                for r in recipients {
                    if except.iter().any(|e| e == r) {
                        continue;
                    }
                    let changed =
                        stmt.execute(params![now, r, self.cursor(r), to_i64(*queued_before)])?;
                    n += changed as u64;
                }
                Ok(WriteResult::Expired(n))
            }
        }
    }

    fn append(&mut self, m: &NewMessage) -> Result<AppendOutcome, StoreError> {
        let tx = self.tx;
        let p = &m.payload;
        let data = match &p.data {
            Some(d) => Some(serde_json::to_string(d).map_err(encode_err("data"))?),
            None => None,
        };
        let budget = match &p.budget {
            Some(b) => Some(serde_json::to_string(b).map_err(encode_err("budget"))?),
            None => None,
        };
        let fanout = match m.recipients.as_slice() {
            [only] if only.name == m.to => None,
            rs => {
                let mut names: Vec<&str> = Vec::with_capacity(rs.len());
                for r in rs {
                    if !names.contains(&r.name.as_str()) {
                        names.push(&r.name);
                    }
                }
                Some(serde_json::to_string(&names).map_err(encode_err("recipients"))?)
            }
        };
        let inserted = self.insert_message.execute(params![
            m.id,
            self.now,
            m.from,
            m.to,
            m.topic,
            p.kind.as_str(),
            p.body,
            data,
            p.thread,
            p.in_reply_to,
            budget,
            m.session_id,
            fanout,
        ])?;
        if inserted == 0 {
            let pos: i64 = tx
                .prepare_cached("SELECT pos FROM messages WHERE id = ?1 AND sender = ?2")?
                .query_row(params![m.id, m.from], |r| r.get(0))?;
            return Ok(AppendOutcome::Duplicate { pos });
        }
        let pos = tx.last_insert_rowid();
        self.max_pos = self.max_pos.max(pos);

        let topic = m.topic.clone().unwrap_or_default();
        let mut seqs = Vec::with_capacity(m.recipients.len());
        for (i, r) in m.recipients.iter().enumerate() {
            if let Some(j) = earlier_duplicate(&m.recipients, i) {
                seqs.push(seqs[j]);
                continue;
            }
            let seq = self.next_seq((r.name.clone(), topic.clone(), m.from.clone()));
            self.insert_delivery
                .execute(params![r.name, pos, to_i64(seq), 0i64, self.now])?;
            seqs.push(seq);
        }
        let message = Arc::new(StoredMessage {
            pos,
            id: m.id.clone(),
            ts: to_u64(self.now),
            from: m.from.clone(),
            to: m.to.clone(),
            topic: m.topic.clone(),
            payload: p.clone(),
        });
        Ok(AppendOutcome::Stored { message, seqs })
    }

    /// The counter changes to apply once committed (and the statements let go of the
    /// transaction).
    fn into_changes(self) -> (HashMap<StreamKey, u64>, HashMap<String, i64>, i64) {
        (self.streams, self.cursors, self.max_pos)
    }

    /// Writes the touched streams and cursors, once each.
    fn flush(&self) -> Result<(), StoreError> {
        let mut stmt = self.tx.prepare_cached(
            "INSERT INTO streams (recipient, topic, sender, last_seq) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (recipient, topic, sender) DO UPDATE SET last_seq = excluded.last_seq",
        )?;
        for ((r, t, s), seq) in &self.streams {
            stmt.execute(params![r, t, s, to_i64(*seq)])?;
        }
        let mut stmt = self.tx.prepare_cached(
            "INSERT INTO cursors (recipient, through) VALUES (?1, ?2)
             ON CONFLICT (recipient) DO UPDATE SET through = excluded.through",
        )?;
        for (r, through) in &self.cursors {
            stmt.execute(params![r, through])?;
        }
        Ok(())
    }
}

impl Store for SqliteStore {
    fn write_batch(
        &mut self,
        ops: &[WriteOp],
        now_ms: u64,
    ) -> Result<Vec<WriteResult>, StoreError> {
        // IMMEDIATE takes the write lock up front, so a busy database is waited for (busy
        // timeout) at BEGIN instead of failing halfway through the batch.
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut batch = Batch {
            tx: &tx,
            insert_message: tx.prepare_cached(INSERT_MESSAGE)?,
            insert_delivery: tx.prepare_cached(INSERT_DELIVERY)?,
            ack_through: tx.prepare_cached(ACK_THROUGH)?,
            now: to_i64(now_ms),
            committed_streams: &self.streams,
            committed_cursors: &self.cursors,
            streams: HashMap::new(),
            cursors: HashMap::new(),
            max_pos: self.max_pos,
        };
        let mut results = Vec::with_capacity(ops.len());
        for op in ops {
            // On error `tx` is dropped, which rolls back, and the scratch maps are discarded.
            results.push(batch.apply(op)?);
        }
        batch.flush()?;
        let (streams, cursors, max_pos) = batch.into_changes();
        tx.commit()?;
        self.checkpointer.committed();
        self.streams.extend(streams);
        self.cursors.extend(cursors);
        self.max_pos = max_pos;
        Ok(results)
    }

    fn take_pending(
        &mut self,
        recipient: &str,
        after_pos: i64,
        limit: usize,
    ) -> Result<Vec<PendingDelivery>, StoreError> {
        let after = after_pos.max(self.cursor(recipient));
        let sql = format!(
            "SELECT {MSG_COLS}, d.seq, d.attempts FROM deliveries d
             JOIN messages m ON m.pos = d.msg
             WHERE d.recipient = ?1 AND d.msg > ?2 AND d.status = {QUEUED}
             ORDER BY d.msg LIMIT ?3"
        );
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = stmt.query_map(params![recipient, after, limit], |r| {
            Ok((
                RawMessage::from_row(r, 0)?,
                r.get::<_, i64>(MSG_NCOLS)?,
                r.get::<_, i64>(MSG_NCOLS + 1)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (raw, seq, attempts) = row?;
            let (m, _) = raw.decode()?;
            out.push(PendingDelivery {
                message: Arc::new(m),
                seq: to_u64(seq),
                attempt: u32::try_from(attempts.saturating_add(1)).unwrap_or(u32::MAX),
            });
        }
        Ok(out)
    }

    fn known_agents(&mut self) -> Result<Vec<KnownAgent>, StoreError> {
        let names: Vec<String> = {
            let mut stmt = self
                .conn
                .prepare_cached("SELECT name FROM agents ORDER BY name")?;
            let rows = stmt.query_map([], |r| r.get(0))?;
            rows.collect::<Result<_, _>>()?
        };
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let topics = self.topics(&name)?;
            out.push(KnownAgent { name, topics });
        }
        Ok(out)
    }

    fn agents(&mut self) -> Result<Vec<AgentInfo>, StoreError> {
        let rows: Vec<(String, Option<String>, i64, i64)> = {
            let mut stmt = self.conn.prepare_cached(
                "SELECT name, cli, first_seen, last_seen FROM agents ORDER BY name",
            )?;
            let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?;
            rows.collect::<Result<_, _>>()?
        };
        let mut out = Vec::with_capacity(rows.len());
        for (name, cli, first_seen, last_seen) in rows {
            let topics = self.topics(&name)?;
            let pending = self.pending_count(&name)?;
            out.push(AgentInfo {
                name,
                cli,
                online: false,
                first_seen: to_u64(first_seen),
                last_seen: to_u64(last_seen),
                pending,
                topics,
            });
        }
        Ok(out)
    }

    fn find(&mut self, id_or_prefix: &str, limit: usize) -> Result<Vec<MessageRecord>, StoreError> {
        let limit = Value::Integer(i64::try_from(limit).unwrap_or(i64::MAX));
        let exact = self.records(
            &format!(
                "SELECT {MSG_COLS} FROM messages m WHERE m.id = ?1 ORDER BY m.sender LIMIT ?2"
            ),
            &[Value::Text(id_or_prefix.to_owned()), limit.clone()],
        )?;
        if !exact.is_empty() {
            return Ok(exact);
        }
        let lo = Value::Text(id_or_prefix.to_owned());
        match prefix_upper_bound(id_or_prefix) {
            Some(hi) => self.records(
                &format!(
                    "SELECT {MSG_COLS} FROM messages m WHERE m.id >= ?1 AND m.id < ?2
                     ORDER BY m.id, m.sender LIMIT ?3"
                ),
                &[lo, Value::Text(hi), limit],
            ),
            None => self.records(
                &format!(
                    "SELECT {MSG_COLS} FROM messages m WHERE m.id >= ?1
                     ORDER BY m.id, m.sender LIMIT ?2"
                ),
                &[lo, limit],
            ),
        }
    }

    fn history(&mut self, filter: &HistoryFilter) -> Result<Vec<MessageRecord>, StoreError> {
        let mut sql = format!("SELECT {MSG_COLS} FROM messages m WHERE 1");
        let mut args: Vec<Value> = Vec::new();
        // Appends a bind value and returns its `?N` placeholder.
        let mut bind = |v: Value| {
            args.push(v);
            format!("?{}", args.len())
        };
        if let Some(from) = &filter.from {
            sql += &format!(" AND m.sender = {}", bind(Value::Text(from.clone())));
        }
        if let Some(to) = &filter.to {
            // A broadcast's `to` is `*`; its delivery row (a primary-key probe) is what ties it
            // to the recipient.
            let p = bind(Value::Text(to.clone()));
            sql += &format!(
                " AND (m.recipient = {p} OR EXISTS \
                 (SELECT 1 FROM deliveries d WHERE d.recipient = {p} AND d.msg = m.pos))"
            );
        }
        if let Some(topic) = &filter.topic {
            sql += &format!(" AND m.topic = {}", bind(Value::Text(topic.clone())));
        }
        if let Some(text) = &filter.text {
            // instr, not LIKE: a plain case-sensitive substring, like str::contains.
            sql += &format!(
                " AND instr(m.body, {}) > 0",
                bind(Value::Text(text.clone()))
            );
        }
        if let Some(since) = filter.since_ms {
            sql += &format!(" AND m.ts >= {}", bind(Value::Integer(to_i64(since))));
        }
        if let Some(until) = filter.until_ms {
            sql += &format!(" AND m.ts < {}", bind(Value::Integer(to_i64(until))));
        }
        if let Some(before) = filter.before_pos {
            sql += &format!(" AND m.pos < {}", bind(Value::Integer(before)));
        }
        let limit = i64::try_from(history_limit(filter)).unwrap_or(i64::MAX);
        sql += &format!(" ORDER BY m.pos DESC LIMIT {}", bind(Value::Integer(limit)));
        self.records(&sql, &args)
    }

    fn stats(&mut self) -> Result<Stats, StoreError> {
        let messages: i64 = self
            .conn
            .prepare_cached("SELECT count(*) FROM messages")?
            .query_row([], |r| r.get(0))?;
        let mut pending = 0;
        for r in self.recipients() {
            pending += self.pending_count(r)?;
        }
        Ok(Stats {
            messages: to_u64(messages),
            pending,
        })
    }

    fn location(&self) -> String {
        self.path.display().to_string()
    }
}

impl SqliteStore {
    /// An agent's subscription patterns, sorted.
    fn topics(&self, agent: &str) -> Result<Vec<String>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT pattern FROM subscriptions WHERE agent = ?1 ORDER BY pattern",
        )?;
        let rows = stmt.query_map([agent], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}
