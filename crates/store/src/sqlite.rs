//! The SQLite store: one WAL database file, one connection owned by the store actor.
//!
//! Throughput comes from keeping the per-message work small: one `messages` row (two index
//! entries) and one `deliveries` row per recipient, in a batch that is one transaction. Stream
//! sequence numbers live in memory (loaded at open) and are written to `streams` every
//! [`STREAMS_FLUSH_EVERY`] batches; open replays the deliveries stored since.
//!
//! What a commit costs is mostly how many pages it writes to the WAL, so every hot b-tree grows
//! at its end: `messages` by position, and `deliveries` by position too (not by recipient, which
//! would dirty one page per active recipient per batch). Each recipient's queued positions are
//! kept in memory instead (rebuilt at open by scanning from the lowest queued position), which
//! turns ack-through, hand-outs, expiry and replay into primary-key lookups and pending counts
//! into list lengths.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use relay_protocol::query::{
    AgentInfo, AgentState, DeliveryRecord, DeliveryStatus, HistoryFilter, MessageRecord,
};
use relay_protocol::{Kind, Send};
use rusqlite::types::Value;
use rusqlite::{
    CachedStatement, Connection, OptionalExtension, Row, Transaction, TransactionBehavior, params,
};

#[path = "sqlite_dlq.rs"]
mod dlq;

use crate::common::{earlier_duplicate, history_limit, prefix_upper_bound, record, to_i64, to_u64};
use crate::names::{FxHashMap, FxHashSet, Names};
use crate::watermark::{Runs, Stream, Waiting};
use crate::{
    AppendOutcome, KnownAgent, NewMessage, PendingDelivery, Stats, Store, StoreError,
    StoredMessage, WriteOp, WriteResult,
};

/// `(recipient, topic or 0, sender)` as [`Names`] ids: one gapless seq stream.
type StreamKey = (i64, i64, i64);

/// The topic part of a [`StreamKey`] for messages without one (name ids start at 1).
const NO_TOPIC: i64 = 0;

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
    // v2: the hot b-trees key on integers and grow at their end.
    //
    // Agent names (and topics, in `streams`) are interned in `names`, and `deliveries`,
    // `streams` and the `(id, sender)` dedupe index key on the ids: every append and ack walks
    // those b-trees, and comparing TEXT keys byte by byte at each level was a large part of the
    // store thread's time. The message id stays first in the dedupe index so that `find` by id
    // or id prefix is still a range of it. `agents`, `sessions` and `subscriptions` are off the
    // hot path and keep their names.
    //
    // `deliveries` is keyed (msg, recipient): a batch's new rows, and the acks of the previous
    // batch, land on the last few pages instead of on the last page of every recipient's range
    // (measured: 147 WAL frames per batch of 256 messages to 64 recipients that way, 37 this
    // way). Per-recipient order lives in memory (`SqliteStore::queued`), loaded at open by
    // scanning from `meta.queued_from`, below which nothing is queued. (A partial index of the
    // queued rows would bound that scan better, but maintaining it cost ~1 µs per message.)
    // The ack cursors of v1 only bounded per-recipient scans, which are gone, so they go too.
    //
    // `streams` is written every `STREAMS_FLUSH_EVERY` batches rather than every batch (256
    // upserts per batch of 256 messages to 64 recipients from 64 senders). It is exact as of
    // position `meta.streams_through`; the seqs of later deliveries are in `deliveries`, and
    // open replays them.
    r"
CREATE TABLE names (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE
);
INSERT OR IGNORE INTO names (name) SELECT sender FROM messages;
INSERT OR IGNORE INTO names (name) SELECT recipient FROM deliveries;
INSERT OR IGNORE INTO names (name) SELECT recipient FROM streams;
INSERT OR IGNORE INTO names (name) SELECT sender FROM streams;
INSERT OR IGNORE INTO names (name) SELECT topic FROM streams WHERE topic <> '';

CREATE TABLE messages_v2 (
    pos INTEGER PRIMARY KEY,
    id TEXT NOT NULL,
    ts INTEGER NOT NULL,
    sender INTEGER NOT NULL,
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
INSERT INTO messages_v2 SELECT m.pos, m.id, m.ts, n.id, m.recipient, m.topic, m.kind, m.body,
    m.data, m.thread, m.in_reply_to, m.budget, m.session_id, m.fanout
    FROM messages m JOIN names n ON n.name = m.sender;
DROP TABLE messages;
ALTER TABLE messages_v2 RENAME TO messages;
CREATE UNIQUE INDEX messages_id_sender ON messages (id, sender);
CREATE INDEX messages_topic ON messages (topic) WHERE topic IS NOT NULL;

CREATE TABLE deliveries_v2 (
    recipient INTEGER NOT NULL,
    msg INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    status INTEGER NOT NULL,
    attempts INTEGER NOT NULL,
    queued_at INTEGER NOT NULL,
    updated_at INTEGER,
    PRIMARY KEY (msg, recipient)
) WITHOUT ROWID;
INSERT INTO deliveries_v2 SELECT n.id, d.msg, d.seq, d.status, d.attempts, d.queued_at,
    coalesce(d.updated_at, -1 - d.queued_at) FROM deliveries d JOIN names n ON n.name = d.recipient;
DROP TABLE deliveries;
ALTER TABLE deliveries_v2 RENAME TO deliveries;

CREATE TABLE streams_v2 (
    recipient INTEGER NOT NULL,
    topic INTEGER NOT NULL,
    sender INTEGER NOT NULL,
    last_seq INTEGER NOT NULL,
    PRIMARY KEY (recipient, topic, sender)
) WITHOUT ROWID;
INSERT INTO streams_v2 SELECT r.id, coalesce(t.id, 0), f.id, s.last_seq
    FROM streams s JOIN names r ON r.name = s.recipient JOIN names f ON f.name = s.sender
    LEFT JOIN names t ON t.name = s.topic AND s.topic <> '';
DROP TABLE streams;
ALTER TABLE streams_v2 RENAME TO streams;
CREATE TABLE meta (
    key TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO meta (key, value)
    VALUES ('streams_through', (SELECT coalesce(max(pos), 0) FROM messages)),
           ('queued_from', (SELECT coalesce(min(msg), 0) FROM deliveries WHERE status = 0));

DROP TABLE cursors;
",
    // v3: urgent messages (the recipient's wrapper types them before the others).
    "ALTER TABLE messages ADD COLUMN urgent INTEGER NOT NULL DEFAULT 0;",
    // v4: delivery traces and the dead-letter queue.
    //
    // The common path of a delivery (stored, handed over, acknowledged) is already in
    // `messages.ts`, `deliveries.queued_at` and the acknowledgement's `updated_at`; what is
    // added per message is nothing. Handing over is recorded in `sent` as one range of
    // positions per recipient and router flush (not one row per DELIVER), and the rare changes
    // (verified, failed, expired, an acknowledgement overwritten by a later state) as rows of
    // `events`. `dead_letters` keeps what was not delivered with its reason; for a SEND
    // refused before it was stored, `message` keeps its content (JSON) so it can be retried.
    // Its ids never come back after a purge (AUTOINCREMENT): a sender's notice is named after
    // its dead letter, so that telling it again after a crash is a duplicate, not a second
    // notice; `notified` marks those told (a refusal is told by its NACK).
    // The partial index on budgets lets the daemon reload recent hop counts at start without
    // scanning every message (only replies carry a budget).
    r"
CREATE TABLE events (
    id INTEGER PRIMARY KEY,
    msg INTEGER NOT NULL,
    recipient INTEGER NOT NULL,
    ts INTEGER NOT NULL,
    state INTEGER NOT NULL,
    detail TEXT
);
CREATE INDEX events_msg ON events (msg);
CREATE TABLE sent (
    id INTEGER PRIMARY KEY,
    recipient INTEGER NOT NULL,
    after INTEGER NOT NULL,
    through INTEGER NOT NULL,
    session_id TEXT NOT NULL,
    at INTEGER NOT NULL
);
CREATE INDEX sent_recipient ON sent (recipient, through);
CREATE TABLE dead_letters (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ts INTEGER NOT NULL,
    msg_id TEXT NOT NULL,
    pos INTEGER,
    sender TEXT NOT NULL,
    recipient TEXT NOT NULL,
    topic TEXT,
    code TEXT NOT NULL,
    reason TEXT NOT NULL,
    message TEXT,
    retried_at INTEGER,
    notified INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX dead_letters_unnotified ON dead_letters (id) WHERE notified = 0;
CREATE INDEX dead_letters_pos ON dead_letters (pos) WHERE pos IS NOT NULL;
CREATE INDEX dead_letters_msg_id ON dead_letters (msg_id) WHERE pos IS NULL;
CREATE TABLE counters (
    key TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO counters (key, value) VALUES ('rejected', 0);
CREATE INDEX messages_budget ON messages (pos) WHERE budget IS NOT NULL;
",
    // v5: the number of stored messages and of deliveries in each state, kept by the
    // transactions that change them (one update per counter per batch), so that `status` reads
    // six rows instead of counting two tables (1.8 s at 10 million messages:
    // docs/PERFORMANCE.md). Counted once here, on upgrade.
    r"
INSERT INTO counters (key, value) VALUES ('messages', (SELECT count(*) FROM messages)),
    ('deliveries.queued', 0), ('deliveries.acked', 0), ('deliveries.verified', 0),
    ('deliveries.failed', 0), ('deliveries.expired', 0);
UPDATE counters SET value = g.n
    FROM (SELECT status, count(*) AS n FROM deliveries GROUP BY status) AS g
    WHERE counters.key = 'deliveries.' || CASE g.status WHEN 0 THEN 'queued' WHEN 1 THEN 'acked'
        WHEN 2 THEN 'verified' WHEN 3 THEN 'failed' WHEN 4 THEN 'expired' END;
",
    // v6: spawned workers and their parents (issue 25): the caps on live spawned agents and on
    // depth, and who may release a worker, hold across a restart of the daemon.
    r"
CREATE TABLE spawned (
    name TEXT PRIMARY KEY,
    parent TEXT NOT NULL,
    depth INTEGER NOT NULL,
    at INTEGER NOT NULL,
    worktree TEXT,
    notify_idle INTEGER NOT NULL DEFAULT 0,
    ended_at INTEGER
) WITHOUT ROWID;
",
    // v7: claims (issue 25.7): an agent's paths, until they expire or it releases them; kept
    // across restarts, so that a claim the others were told about holds after one.
    r"
CREATE TABLE claims (
    agent TEXT NOT NULL,
    path TEXT NOT NULL,
    since INTEGER NOT NULL,
    until INTEGER NOT NULL,
    PRIMARY KEY (agent, path)
) WITHOUT ROWID;
",
    // v8: the federation node a message came from (a stand-in's SEND; NULL for local senders).
    "ALTER TABLE messages ADD COLUMN origin TEXT;",
    // v9: acknowledgements as a watermark per recipient plus exceptions (issue 26;
    // `watermark.rs`). A delivery row whose status is 0 and whose position is at or below its
    // recipient's watermark is in the state of the `acks` range that covers it, since that
    // range's `at`; above the watermark it is queued. An in-order run of acknowledgements in
    // one commit is one `acks` row instead of an update of every delivery row. `acks` is keyed
    // by `through` first so that a commit's rows go to the end of its b-tree (positions only
    // grow), not to one page per recipient; finding a delivery's range is a short walk from
    // its position. Exceptions stay in the delivery rows (status 5: queued again below the
    // watermark). Every existing database starts with its watermarks at 0: its rows with
    // status 0 are exactly its queued deliveries, as before.
    r"
CREATE TABLE acks (
    through INTEGER NOT NULL,
    recipient INTEGER NOT NULL,
    after INTEGER NOT NULL,
    state INTEGER NOT NULL,
    at INTEGER NOT NULL,
    detail TEXT,
    PRIMARY KEY (through, recipient)
) WITHOUT ROWID;
CREATE TABLE watermarks (
    recipient INTEGER PRIMARY KEY,
    through INTEGER NOT NULL
) WITHOUT ROWID;
",
];

/// The delivery states counted in `counters` (`deliveries.<name>`), indexed by their code.
pub(crate) const COUNTED_STATES: [DeliveryStatus; 5] = [
    DeliveryStatus::Queued,
    DeliveryStatus::Acked,
    DeliveryStatus::Verified,
    DeliveryStatus::Failed,
    DeliveryStatus::Expired,
];

/// Newest schema version this build knows.
pub(crate) const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Batches between two writes of the `streams` table. Open replays the deliveries stored since
/// the last write, so this bounds that work (and the table write is amortised over this many
/// batches).
const STREAMS_FLUSH_EVERY: u32 = 64;

/// Message columns in the order [`RawMessage::from_row`] reads them.
const MSG_COLS: &str = "m.pos, m.id, m.ts, (SELECT n.name FROM names n WHERE n.id = m.sender) \
                        AS sender_name, m.recipient, m.topic, m.kind, m.body, m.data, \
                        m.thread, m.in_reply_to, m.budget, m.fanout, m.urgent, m.origin";
/// [`Store::find`] past an exact match: `?1` the query, `?2` the bound of its prefix range,
/// `?3` whether it is as long as a short id, `?4` the limit.
///
/// The prefix is a range of the `(id, sender)` index. The short id (the id's *end*) has no
/// index of its own: an index on random keys cost a fifth of the store's append throughput
/// (docs/PERFORMANCE.md), and `read` is a person's command. It scans the `(id, sender)` index,
/// which holds every id and is a small fraction of the table (`sqlite_find_scans_no_table` in
/// the tests checks the plan).
fn find_sql() -> String {
    format!(
        "SELECT {MSG_COLS} FROM messages m WHERE m.pos IN (
             SELECT pos FROM messages WHERE id >= ?1 AND id < ?2
             UNION SELECT pos FROM messages WHERE ?3 AND substr(id, -8) = ?1)
         ORDER BY m.id, sender_name LIMIT ?4"
    )
}

/// Number of columns in [`MSG_COLS`].
const MSG_NCOLS: usize = 15;

/// `DeliveryStatus::Queued.code()`. The SQL below also spells out `1` (acked) and `4`
/// (expired); `status_codes_match_sql` in the tests pins them.
const QUEUED: i64 = 0;

// The three statements of the hot path, prepared once per batch rather than looked up in the
// statement cache (which hashes the SQL text) once per message.

/// The messages already stored under an id, with their senders: an id is one message's
/// (issue 24.7), so a second sender's message with the same id is refused, and the same
/// sender's is a duplicate. A probe of the (id, sender) index, whose pages the insert that
/// follows touches anyway; it also sees rows inserted earlier in the same transaction.
const FIND_ID: &str = "SELECT m.pos, n.name FROM messages m JOIN names n ON n.id = m.sender
    WHERE m.id = ?1 LIMIT 8";
/// The unique (id, sender) index keeps the dedupe whole even without the probe.
const INSERT_MESSAGE: &str = "INSERT INTO messages (id, ts, sender, recipient, topic, kind, body,
    data, thread, in_reply_to, budget, session_id, fanout, urgent, origin)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)
    ON CONFLICT (id, sender) DO NOTHING";
/// `updated_at` starts as `-1 - queued_at`, read back as "never updated" (NULL in v1): a
/// negative of the same magnitude has the same encoded size as the time that replaces it, so
/// the ack (status 0 → 1, also same size) rewrites the row in place instead of deleting and
/// re-inserting it in the b-tree (measured ~0.5 µs per message).
const INSERT_DELIVERY: &str = "INSERT INTO deliveries (recipient, msg, seq, status, attempts,
    queued_at, updated_at) VALUES (?1, ?2, ?3, 0, ?4, ?5, -1 - ?5)";
/// A delivery queued again below its recipient's watermark, acknowledged by an ack-through
/// (an exception: the range under it does not apply to it).
const ACK_ONE: &str = "UPDATE deliveries SET status = 1, updated_at = ?1
    WHERE msg = ?2 AND recipient = ?3 AND status = 5";

/// The row code of a delivery queued again at or below its recipient's watermark: it reads as
/// queued, where a plain row (0) there would read through the range that covers it. Never
/// leaves the store (`DeliveryStatus` has no such state).
pub(crate) const QUEUED_BELOW: i64 = 5;

/// One range of a recipient's acknowledgements ([`watermark::Run`], written).
const INSERT_RANGE: &str = "INSERT INTO acks (through, recipient, after, state, at, detail)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6)";
/// The range of recipient `?2` that covers position `?1` (the first of its ranges that ends
/// at or after it: ranges follow each other without gaps).
const RANGE_AT: &str = "SELECT after, state, at, detail FROM acks
    WHERE through >= ?1 AND recipient = ?2 ORDER BY through LIMIT 1";

/// Each recipient id's acknowledgement state: its queued deliveries (exactly those that read
/// as queued) and its watermark.
type Queued = FxHashMap<i64, Stream>;

/// A delivery's state as readers see it: its row's own, or its range's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Effective {
    /// The state.
    pub(crate) status: DeliveryStatus,
    /// When it was last changed, as stored (negative: never; see `INSERT_DELIVERY`).
    pub(crate) updated_at: i64,
    /// A range's detail (a verified delivery's door), when the state is the range's.
    pub(crate) detail: Option<String>,
    /// Whether the state comes from a range (the row itself says nothing).
    pub(crate) from_range: bool,
}

/// The state of `rid`'s delivery at `pos` whose row has status `code` and `updated_at`.
pub(crate) fn effective(
    conn: &Connection,
    queued: &Queued,
    rid: i64,
    pos: i64,
    code: i64,
    updated_at: i64,
) -> Result<Effective, StoreError> {
    let plain = |status| Effective {
        status,
        updated_at,
        detail: None,
        from_range: false,
    };
    if code == QUEUED_BELOW {
        return Ok(plain(DeliveryStatus::Queued));
    }
    if code != QUEUED || !queued.get(&rid).is_some_and(|s| s.covers(pos)) {
        return Ok(plain(decode_status(code)?));
    }
    let range: Option<(i64, i64, i64, Option<String>)> = conn
        .prepare_cached(RANGE_AT)?
        .query_row(params![pos, rid], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })
        .optional()?;
    match range {
        Some((after, state, at, detail)) if after < pos => Ok(Effective {
            status: decode_status(state)?,
            updated_at: at,
            detail,
            from_range: true,
        }),
        _ => Err(StoreError::Corrupt(format!(
            "delivery {pos} to name {rid} is below its watermark but no range covers it"
        ))),
    }
}

/// SQLite-backed [`Store`].
///
/// It must be the only writer of its file (the daemon's lock file ensures that): names, stream
/// seqs and queued positions are cached in memory at open. Readers in other processes are fine.
pub struct SqliteStore {
    /// Declared before `conn` so that it stops (and closes its connection) first: the last
    /// connection to close is the one that checkpoints and removes the WAL.
    checkpointer: Checkpointer,
    conn: Connection,
    path: PathBuf,
    /// The `names` table, cached.
    names: Names,
    /// Last seq of every stream, as committed.
    streams: FxHashMap<StreamKey, u64>,
    /// Streams whose committed seq is not yet in the `streams` table.
    unflushed: FxHashSet<StreamKey>,
    /// Committed batches since the `streams` table was last written.
    batches_since_flush: u32,
    /// Each recipient's queued positions. A batch edits this in place as it goes, so after a
    /// failed batch it no longer matches the database: `queued_stale` says so, and the next
    /// call reloads it (a failed batch is rare; copying this per batch would not be).
    queued: Queued,
    queued_stale: bool,
    /// `meta.queued_from` as committed; `None` after a failed batch (rewritten by the next).
    queued_from: Option<i64>,
    /// `counters.messages` as committed: the number of stored messages.
    messages: u64,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// What a committed batch (and so an ACK) survives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// `synchronous=FULL`: the WAL is fsynced at every commit, so an acknowledged message
    /// survives a power cut or an OS crash. The default: an ACK means "on disk".
    #[default]
    Full,
    /// `synchronous=NORMAL`: commits survive the relay being killed, but the last ones before
    /// a power cut or an OS crash may be lost. Faster; for those who choose it.
    Normal,
}

impl Durability {
    /// The `PRAGMA synchronous` statement for this level.
    #[must_use]
    pub fn pragma(self) -> &'static str {
        match self {
            Self::Full => "PRAGMA synchronous = FULL;",
            Self::Normal => "PRAGMA synchronous = NORMAL;",
        }
    }

    /// The level's name as the command line spells it (`full`, `normal`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::Normal => "normal",
        }
    }
}

impl std::fmt::Display for Durability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path` with [`Durability::Full`]: see
    /// [`SqliteStore::open_with`].
    ///
    /// # Errors
    /// As [`SqliteStore::open_with`].
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_with(path, Durability::Full)
    }

    /// Opens (creating if needed) the database at `path`: creates the parent directories,
    /// switches to WAL with the `synchronous` level `durability` asks for, and migrates the
    /// schema.
    ///
    /// # Errors
    /// [`StoreError::Io`] if the directory cannot be created, [`StoreError::SchemaTooNew`] for a
    /// database from a newer agent-relay, [`StoreError::Sqlite`] otherwise.
    pub fn open_with(path: &Path, durability: Durability) -> Result<Self, StoreError> {
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
        // FULL in WAL mode fsyncs the WAL at every commit, so a batch is on disk before its
        // ACKs go out; NORMAL is durable against process crashes only and may lose the last
        // commits on power loss (see `Durability`). A batch is one commit (group commit), so
        // FULL costs one fsync per batch, not per message. A 32 MiB page cache (default
        // 2 MiB) keeps the hot ends of the b-trees (newest messages, each recipient's newest
        // deliveries, the id index) in memory as the database grows.
        conn.execute_batch(durability.pragma())?;
        conn.execute_batch(
            "PRAGMA temp_store = MEMORY;
             PRAGMA cache_size = -32768;",
        )?;
        // history builds a few SQL variants; keep them all prepared.
        conn.set_prepared_statement_cache_capacity(64);
        migrate(&mut conn)?;
        conn.execute_batch(&format!(
            "PRAGMA wal_autocheckpoint = {FALLBACK_CHECKPOINT_PAGES};"
        ))?;
        let checkpointer = Checkpointer::start(path)?;

        let mut names = Names::default();
        {
            let mut stmt = conn.prepare("SELECT id, name FROM names")?;
            let mut rows = stmt.query([])?;
            while let Some(r) = rows.next()? {
                names.insert_committed(r.get(1)?, r.get(0)?);
            }
        }
        let mut streams = FxHashMap::default();
        {
            let mut stmt =
                conn.prepare("SELECT recipient, topic, sender, last_seq FROM streams")?;
            let mut rows = stmt.query([])?;
            while let Some(r) = rows.next()? {
                streams.insert((r.get(0)?, r.get(1)?, r.get(2)?), to_u64(r.get(3)?));
            }
        }
        replay_streams(&conn, &names, &mut streams)?;
        let (queued, queued_from) = load_queued(&conn)?;
        let messages: i64 = conn.query_row(
            "SELECT value FROM counters WHERE key = 'messages'",
            [],
            |r| r.get(0),
        )?;
        Ok(Self {
            checkpointer,
            conn,
            path: path.to_path_buf(),
            names,
            streams,
            unflushed: FxHashSet::default(),
            batches_since_flush: 0,
            queued,
            queued_stale: false,
            queued_from: Some(queued_from),
            messages: to_u64(messages),
        })
    }

    /// Queued deliveries to `recipient` (callers refresh [`SqliteStore::queued`] first).
    fn pending_count(&self, recipient: &str) -> u64 {
        self.names
            .get(recipient)
            .and_then(|rid| self.queued.get(&rid))
            .map_or(0, |q| q.queued.len() as u64)
    }

    /// Reloads [`SqliteStore::queued`] if a failed batch left it out of date.
    fn fresh_queued(&mut self) -> Result<&Queued, StoreError> {
        if self.queued_stale {
            let (queued, from) = load_queued(&self.conn)?;
            self.queued = queued;
            self.queued_from = Some(from);
            self.queued_stale = false;
        }
        Ok(&self.queued)
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
            // A name without an id never had a delivery.
            let Some(id) = self.names.get(name) else {
                continue;
            };
            let row = stmt
                .query_row(params![id, m.pos], |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, i64>(2)?,
                        r.get::<_, Option<i64>>(3)?,
                    ))
                })
                .optional()?;
            // A direct message whose recipient was not resolved has no delivery row.
            let Some((seq, code, queued_at, updated_at)) = row else {
                continue;
            };
            // NULL only in rows a v1 database left (v2 made them negative).
            let state = effective(
                &self.conn,
                &self.queued,
                id,
                m.pos,
                code,
                updated_at.unwrap_or(-1),
            )?;
            out.push(DeliveryRecord {
                recipient: name.clone(),
                seq: to_u64(seq),
                status: state.status,
                queued_at: to_u64(queued_at),
                // Negative: never updated (see INSERT_DELIVERY).
                updated_at: Some(state.updated_at).filter(|t| *t >= 0).map(to_u64),
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
                    let until = relay_protocol::now_instant() + CHECKPOINT_EVERY;
                    loop {
                        match rx.recv_timeout(
                            until.saturating_duration_since(relay_protocol::now_instant()),
                        ) {
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

/// Brings `streams` (as loaded from its table) up to date with the deliveries stored after the
/// table was last written: a stream's last seq is its delivery with the highest seq.
fn replay_streams(
    conn: &Connection,
    names: &Names,
    streams: &mut FxHashMap<StreamKey, u64>,
) -> Result<(), StoreError> {
    let through: i64 = conn.query_row(
        "SELECT value FROM meta WHERE key = 'streams_through'",
        [],
        |r| r.get(0),
    )?;
    let mut stmt = conn.prepare(
        "SELECT d.recipient, m.topic, m.sender, d.seq FROM deliveries d
         JOIN messages m ON m.pos = d.msg WHERE d.msg > ?1",
    )?;
    let mut rows = stmt.query([through])?;
    while let Some(r) = rows.next()? {
        let topic: Option<String> = r.get(1)?;
        let topic = match topic.as_deref() {
            None | Some("") => NO_TOPIC,
            // Interned in the transaction that stored the message.
            Some(t) => names
                .get(t)
                .ok_or_else(|| StoreError::Corrupt(format!("topic {t:?} has no name id")))?,
        };
        let key = (r.get(0)?, topic, r.get(2)?);
        let seq = to_u64(r.get(3)?);
        let last = streams.entry(key).or_insert(0);
        *last = (*last).max(seq);
    }
    Ok(())
}

/// Every recipient's watermark and queued deliveries (in position order, so each recipient's
/// list comes out sorted), and `meta.queued_from`, where the scan for them starts.
fn load_queued(conn: &Connection) -> Result<(Queued, i64), StoreError> {
    let from: i64 = conn.query_row(
        "SELECT value FROM meta WHERE key = 'queued_from'",
        [],
        |r| r.get(0),
    )?;
    let mut queued = Queued::default();
    {
        let mut stmt = conn.prepare("SELECT recipient, through FROM watermarks")?;
        let mut rows = stmt.query([])?;
        while let Some(r) = rows.next()? {
            queued.entry(r.get(0)?).or_default().through = r.get(1)?;
        }
    }
    let mut stmt = conn.prepare(
        "SELECT msg, recipient, queued_at, status FROM deliveries
         WHERE msg >= ?1 AND status IN (0, 5) ORDER BY msg",
    )?;
    let mut rows = stmt.query([from])?;
    while let Some(r) = rows.next()? {
        let waiting = Waiting {
            pos: r.get(0)?,
            queued_at: r.get(2)?,
        };
        let stream = queued.entry(r.get::<_, i64>(1)?).or_default();
        // A plain row at or below the watermark is acknowledged (its range says how).
        if r.get::<_, i64>(3)? == QUEUED_BELOW || !stream.covers(waiting.pos) {
            stream.push(waiting);
        }
    }
    Ok((queued, from))
}

/// The lowest queued position (`i64::MAX` when nothing is queued): what `meta.queued_from`
/// must not exceed.
fn lowest_queued(queued: &Queued) -> i64 {
    queued
        .values()
        .filter_map(|q| q.queued.front())
        .map(|w| w.pos)
        .min()
        .unwrap_or(i64::MAX)
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
    urgent: bool,
    origin: Option<String>,
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
            urgent: r.get(base + 13)?,
            origin: r.get(base + 14)?,
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
                urgent: self.urgent,
                origin: self.origin,
            },
        };
        Ok((m, fanout))
    }
}

/// One `write_batch` in progress: the transaction plus the seq changes made so far, which
/// reach the store's map only after the commit.
struct Batch<'a> {
    tx: &'a Transaction<'a>,
    find_id: CachedStatement<'a>,
    insert_message: CachedStatement<'a>,
    insert_delivery: CachedStatement<'a>,
    ack_one: CachedStatement<'a>,
    insert_range: CachedStatement<'a>,
    now: i64,
    names: &'a mut Names,
    queued: &'a mut Queued,
    /// The ranges this batch is building.
    runs: Runs,
    committed_streams: &'a FxHashMap<StreamKey, u64>,
    streams: FxHashMap<StreamKey, u64>,
    /// Messages stored by this batch (not duplicates).
    appended: u64,
    /// Change in the number of deliveries in each state, indexed by state code.
    by_state: [i64; 5],
}

impl Batch<'_> {
    /// Counts one delivery moving from state code `from` to `to`.
    fn moved(&mut self, from: i64, to: i64) {
        for (code, delta) in [(from, -1), (to, 1)] {
            if let Some(n) = usize::try_from(code)
                .ok()
                .and_then(|i| self.by_state.get_mut(i))
            {
                *n += delta;
            }
        }
    }

    fn next_seq(&mut self, key: StreamKey) -> u64 {
        let committed = self.committed_streams;
        let s = self
            .streams
            .entry(key)
            .or_insert_with(|| committed.get(&key).copied().unwrap_or(0));
        *s += 1;
        *s
    }

    /// The id of `name`, inserted into `names` on first sight.
    fn intern(&mut self, name: &str) -> Result<i64, StoreError> {
        if let Some(id) = self.names.get(name) {
            return Ok(id);
        }
        self.tx
            .prepare_cached("INSERT INTO names (name) VALUES (?1)")?
            .execute([name])?;
        let id = self.tx.last_insert_rowid();
        self.names.insert_uncommitted(name, id);
        Ok(id)
    }

    fn apply(&mut self, op: &WriteOp) -> Result<WriteResult, StoreError> {
        let tx = self.tx;
        let now = self.now;
        match op {
            WriteOp::Append(m) => self.append(m).map(WriteResult::Appended),
            WriteOp::AckThrough { recipient, through } => {
                // A name without an id never had a delivery.
                let Some((rid, q)) = self
                    .names
                    .get(recipient)
                    .and_then(|rid| Some((rid, self.queued.get_mut(&rid)?)))
                else {
                    return Ok(WriteResult::Done);
                };
                // The queued positions up to `through`: those above the watermark move it (one
                // range), those queued again below it are rows of their own.
                let (moved, rows) = q.settle_through(*through);
                for pos in rows {
                    if self.ack_one.execute(params![now, pos, rid])? == 1 {
                        self.moved(QUEUED, DeliveryStatus::Acked.code());
                    }
                }
                if let Some(m) = moved {
                    self.settled(rid, m, DeliveryStatus::Acked, None)?;
                }
                Ok(WriteResult::Done)
            }
            WriteOp::HandedOut {
                recipient,
                after,
                through,
            } => {
                let Some((rid, q)) = self
                    .names
                    .get(recipient)
                    .and_then(|rid| Some((rid, self.queued.get(&rid)?)))
                else {
                    return Ok(WriteResult::Done);
                };
                let q = &q.queued;
                let lo = q.partition_point(|w| w.pos <= *after);
                let hi = q.partition_point(|w| w.pos <= *through);
                if lo < hi {
                    let mut stmt = tx.prepare_cached(
                        "UPDATE deliveries SET attempts = attempts + 1
                         WHERE msg = ?1 AND recipient = ?2",
                    )?;
                    for w in q.range(lo..hi) {
                        stmt.execute(params![w.pos, rid])?;
                    }
                }
                Ok(WriteResult::Done)
            }
            WriteOp::SetStatus {
                recipient,
                pos,
                status,
                reason,
            } => self.set_status(recipient, *pos, *status, reason.as_deref()),
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
                let except: Vec<i64> = except.iter().filter_map(|e| self.names.get(e)).collect();
                let cutoff = to_i64(*queued_before);
                // Each expired delivery is an exception: its row says so. (Queued rows are
                // plain above the watermark, marked below it.)
                let mut stmt = tx.prepare_cached(
                    "UPDATE deliveries SET status = 4, updated_at = ?1
                     WHERE msg = ?2 AND recipient = ?3 AND status IN (0, 5)",
                )?;
                let mut due: Vec<(i64, i64)> = Vec::new();
                let mut expired = 0i64;
                for (rid, q) in &mut *self.queued {
                    if except.contains(rid) {
                        continue;
                    }
                    for pos in q.expire(cutoff) {
                        // One row or none: the count always fits.
                        expired += i64::from(stmt.execute(params![now, pos, rid])? > 0);
                        due.push((pos, *rid));
                    }
                }
                drop(stmt);
                self.by_state[0] -= expired;
                self.by_state[4] += expired;
                due.sort_unstable();
                let mut notices = Vec::with_capacity(due.len());
                for (pos, rid) in due {
                    notices.push(self.expired(pos, rid)?);
                }
                Ok(WriteResult::Expired(notices))
            }
            WriteOp::Sent {
                recipient,
                session_id,
                after,
                through,
                at,
            } => self.sent(recipient, session_id, *after, *through, *at),
            WriteOp::Reject {
                message,
                code,
                reason,
            } => self.reject(message, code, reason),
            WriteOp::Retry { dlq_id } => self.retry(*dlq_id),
            WriteOp::Notified { dlq_id } => {
                tx.prepare_cached("UPDATE dead_letters SET notified = 1 WHERE id = ?1")?
                    .execute([dlq_id])?;
                Ok(WriteResult::Done)
            }
            WriteOp::MarkById {
                recipient,
                msg_id,
                status,
                reason,
            } => {
                let Some(rid) = self.names.get(recipient) else {
                    return Ok(WriteResult::Done);
                };
                let pos: Option<i64> = tx
                    .prepare_cached(
                        "SELECT m.pos FROM messages m JOIN deliveries d
                         ON d.msg = m.pos AND d.recipient = ?2
                         WHERE m.id = ?1 ORDER BY m.pos DESC LIMIT 1",
                    )?
                    .query_row(params![msg_id, rid], |r| r.get(0))
                    .optional()?;
                match pos {
                    Some(pos) => self.set_status(recipient, pos, *status, reason.as_deref()),
                    None => Ok(WriteResult::Done),
                }
            }
            WriteOp::Purge => self.purge(),
            WriteOp::ForgetAgent { name } => {
                tx.prepare_cached("DELETE FROM agents WHERE name = ?1")?
                    .execute([name])?;
                tx.prepare_cached("DELETE FROM subscriptions WHERE agent = ?1")?
                    .execute([name])?;
                tx.prepare_cached("DELETE FROM claims WHERE agent = ?1")?
                    .execute([name])?;
                Ok(WriteResult::Forgot(name.clone()))
            }
            WriteOp::ExtendChain { thread, hops } => {
                // In `meta` (key → integer) under `chain:THREAD`: no new table for a rare,
                // small record (issue 24.8).
                let key = format!("{CHAIN_KEY}{thread}");
                tx.prepare_cached(
                    "INSERT INTO meta (key, value) VALUES (?1, ?2)
                     ON CONFLICT (key) DO UPDATE SET value = min(value + ?2, 4294967295)",
                )?
                .execute(params![key, hops])?;
                let extra: i64 = tx
                    .prepare_cached("SELECT value FROM meta WHERE key = ?1")?
                    .query_row([&key], |r| r.get(0))?;
                Ok(WriteResult::ChainExtended(
                    thread.clone(),
                    u32::try_from(extra).unwrap_or(u32::MAX),
                ))
            }
            WriteOp::Spawned { record, task_id } => {
                // A name spawned again (after its release) replaces its old record.
                tx.prepare_cached(
                    "INSERT OR REPLACE INTO spawned
                     (name, parent, depth, at, worktree, notify_idle, ended_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                )?
                .execute(params![
                    record.name,
                    record.parent,
                    record.depth,
                    i64::try_from(record.at).unwrap_or(i64::MAX),
                    record.worktree,
                    record.notify_idle,
                    record
                        .ended_at
                        .map(|t| i64::try_from(t).unwrap_or(i64::MAX)),
                ])?;
                Ok(WriteResult::Spawned(record.clone(), task_id.clone()))
            }
            WriteOp::SpawnEnded { name, at } => {
                tx.prepare_cached(
                    "UPDATE spawned SET ended_at = ?2 WHERE name = ?1 AND ended_at IS NULL",
                )?
                .execute(params![name, i64::try_from(*at).unwrap_or(i64::MAX)])?;
                Ok(WriteResult::Done)
            }
            WriteOp::Claim {
                agent,
                path,
                since,
                until,
            } => {
                tx.prepare_cached(
                    "INSERT INTO claims (agent, path, since, until) VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT (agent, path) DO UPDATE SET since = ?3, until = ?4",
                )?
                .execute(params![agent, path, since, until])?;
                Ok(WriteResult::Done)
            }
            WriteOp::Unclaim { agent, paths } => {
                if paths.is_empty() {
                    tx.prepare_cached("DELETE FROM claims WHERE agent = ?1")?
                        .execute([agent])?;
                }
                for path in paths {
                    tx.prepare_cached("DELETE FROM claims WHERE agent = ?1 AND path = ?2")?
                        .execute([agent, path])?;
                }
                Ok(WriteResult::Done)
            }
        }
    }

    /// [`WriteOp::SetStatus`] (and [`WriteOp::MarkById`], with the recipient's reason).
    fn set_status(
        &mut self,
        recipient: &str,
        pos: i64,
        status: DeliveryStatus,
        reason: Option<&str>,
    ) -> Result<WriteResult, StoreError> {
        let tx = self.tx;
        let now = self.now;
        let Some(rid) = self.names.get(recipient) else {
            return Ok(WriteResult::Done);
        };
        // The common case: the next queued delivery acknowledged (acked or verified) moves
        // the watermark, and the batch writes one range for the whole run.
        if matches!(status, DeliveryStatus::Acked | DeliveryStatus::Verified)
            && let Some(m) = self.queued.get_mut(&rid).and_then(|q| q.settle(pos))
        {
            // The router passes a reason for failures and verified deliveries only.
            let detail = reason.filter(|_| status == DeliveryStatus::Verified);
            self.settled(rid, m, status, detail)?;
            return Ok(WriteResult::Done);
        }
        // Anything else is written in the delivery's row, so the ranges under it are final.
        self.close_run(rid)?;
        let row: Option<(i64, i64)> = tx
            .prepare_cached(
                "SELECT status, updated_at FROM deliveries WHERE msg = ?1 AND recipient = ?2",
            )?
            .query_row(params![pos, rid], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        let old = match row {
            Some((code, updated_at)) => {
                Some(effective(tx, self.queued, rid, pos, code, updated_at)?)
            }
            None => None,
        };
        // A state already recorded is not recorded again: a report that comes twice
        // (a federation's failure from another node, redelivered) is one dead letter.
        if status != DeliveryStatus::Queued && old.as_ref().is_some_and(|o| o.status == status) {
            return Ok(WriteResult::Done);
        }
        // An acknowledgement only acknowledges what waits: it never overwrites a
        // later state (or the time of an earlier acknowledgement).
        if status == DeliveryStatus::Acked
            && old
                .as_ref()
                .is_some_and(|o| o.status != DeliveryStatus::Queued)
        {
            return Ok(WriteResult::Done);
        }
        let stream = self.queued.entry(rid).or_default();
        // Queued again at or below the watermark: the row must say so (a plain one there
        // reads through its range).
        let code = if status == DeliveryStatus::Queued && stream.covers(pos) {
            QUEUED_BELOW
        } else {
            status.code()
        };
        let queued_at: Option<i64> = tx
            .prepare_cached(
                "UPDATE deliveries SET status = ?1, updated_at = ?2
                         WHERE msg = ?3 AND recipient = ?4 RETURNING queued_at",
            )?
            .query_row(params![code, now, pos, rid], |r| r.get(0))
            .optional()?;
        if let Some(queued_at) = queued_at {
            if status == DeliveryStatus::Queued {
                stream.requeue(Waiting { pos, queued_at });
            } else {
                stream.take(pos);
            }
        }
        let mut result = WriteResult::Done;
        if let (Some(old), Some(_)) = (old, queued_at) {
            self.moved(old.status.code(), status.code());
            result = self.status_changed(pos, rid, recipient, &old, status, reason)?;
        }
        Ok(result)
    }

    /// `rid`'s watermark moved over `m.count` queued deliveries, now `state`: added to the
    /// batch's open run (one range row for the run, written when it closes).
    fn settled(
        &mut self,
        rid: i64,
        m: crate::watermark::Moved,
        state: DeliveryStatus,
        detail: Option<&str>,
    ) -> Result<(), StoreError> {
        let n = i64::try_from(m.count).unwrap_or(i64::MAX);
        self.by_state[0] -= n;
        if let Some(i) = usize::try_from(state.code())
            .ok()
            .and_then(|i| self.by_state.get_mut(i))
        {
            *i += n;
        }
        if let Some(run) = self.runs.add(rid, m, state, detail) {
            self.write_run(&run)?;
        }
        Ok(())
    }

    /// Writes `rid`'s open run, if any.
    fn close_run(&mut self, rid: i64) -> Result<(), StoreError> {
        if let Some(run) = self.runs.close(rid) {
            self.write_run(&run)?;
        }
        Ok(())
    }

    /// One range row, and the recipient's watermark.
    fn write_run(&mut self, run: &crate::watermark::Run) -> Result<(), StoreError> {
        self.insert_range.execute(params![
            run.through,
            run.rid,
            run.after,
            run.state.code(),
            self.now,
            run.detail
        ])?;
        self.tx
            .prepare_cached(
                "INSERT INTO watermarks (recipient, through) VALUES (?1, ?2)
                 ON CONFLICT (recipient) DO UPDATE SET through = excluded.through",
            )?
            .execute(params![run.rid, run.through])?;
        Ok(())
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
        let owners: Vec<(i64, String)> = self
            .find_id
            .query_map([&m.id], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<Result<_, _>>()?;
        if let Some((pos, _)) = owners.iter().find(|(_, s)| *s == m.from) {
            return Ok(AppendOutcome::Duplicate { pos: *pos });
        }
        if let Some((_, owner)) = owners.into_iter().next() {
            return Ok(AppendOutcome::Taken { owner });
        }
        let sender = self.intern(&m.from)?;
        let inserted = self.insert_message.execute(params![
            m.id,
            self.now,
            sender,
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
            p.urgent,
            p.origin,
        ])?;
        if inserted == 0 {
            let pos: i64 = tx
                .prepare_cached("SELECT pos FROM messages WHERE id = ?1 AND sender = ?2")?
                .query_row(params![m.id, sender], |r| r.get(0))?;
            return Ok(AppendOutcome::Duplicate { pos });
        }
        let pos = tx.last_insert_rowid();
        self.appended += 1;

        // An empty topic shares the no-topic stream, as it always has.
        let topic = match m.topic.as_deref() {
            None | Some("") => NO_TOPIC,
            Some(t) => self.intern(t)?,
        };
        // A message from another node counts as queued since its acceptance there.
        let queued_at = m.queued_at.map_or(self.now, |q| to_i64(q).min(self.now));
        let mut seqs = Vec::with_capacity(m.recipients.len());
        for (i, r) in m.recipients.iter().enumerate() {
            if let Some(j) = earlier_duplicate(&m.recipients, i) {
                seqs.push(seqs[j]);
                continue;
            }
            let rid = self.intern(&r.name)?;
            let seq = self.next_seq((rid, topic, sender));
            self.insert_delivery
                .execute(params![rid, pos, to_i64(seq), 0i64, queued_at])?;
            self.by_state[0] += 1;
            // Positions only grow (messages are never deleted), so this keeps the list sorted.
            self.queued
                .entry(rid)
                .or_default()
                .push(Waiting { pos, queued_at });
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

    /// The seq changes to apply once committed (and the statements let go of the
    /// transaction).
    fn into_changes(self) -> FxHashMap<StreamKey, u64> {
        self.streams
    }

    /// Writes every stream changed since the last flush (`unflushed`, or in this batch), and
    /// the position they are exact as of.
    fn flush(&self, unflushed: &FxHashSet<StreamKey>) -> Result<(), StoreError> {
        let mut stmt = self.tx.prepare_cached(
            "INSERT INTO streams (recipient, topic, sender, last_seq) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (recipient, topic, sender) DO UPDATE SET last_seq = excluded.last_seq",
        )?;
        for (key, seq) in &self.streams {
            stmt.execute(params![key.0, key.1, key.2, to_i64(*seq)])?;
        }
        for key in unflushed {
            if self.streams.contains_key(key) {
                continue;
            }
            if let Some(seq) = self.committed_streams.get(key) {
                stmt.execute(params![key.0, key.1, key.2, to_i64(*seq)])?;
            }
        }
        self.tx
            .prepare_cached(
                "UPDATE meta SET value = (SELECT coalesce(max(pos), 0) FROM messages)
                 WHERE key = 'streams_through'",
            )?
            .execute([])?;
        Ok(())
    }
}

impl Store for SqliteStore {
    fn write_batch(
        &mut self,
        ops: &[WriteOp],
        now_ms: u64,
    ) -> Result<Vec<WriteResult>, StoreError> {
        self.fresh_queued()?;
        let result = self.try_write_batch(ops, now_ms);
        match result {
            Ok(_) => self.names.commit(),
            Err(_) => {
                // Names interned by a failed batch were rolled back with it, and the queued
                // lists may have been edited before the failure.
                self.names.rollback();
                self.queued_stale = true;
                self.queued_from = None;
            }
        }
        result
    }

    fn take_pending(
        &mut self,
        recipient: &str,
        after_pos: i64,
        limit: usize,
    ) -> Result<Vec<PendingDelivery>, StoreError> {
        self.fresh_queued()?;
        // A name without an id never had a delivery.
        let Some((rid, q)) = self
            .names
            .get(recipient)
            .and_then(|rid| Some((rid, self.queued.get(&rid)?)))
        else {
            return Ok(Vec::new());
        };
        let q = &q.queued;
        let start = q.partition_point(|w| w.pos <= after_pos);
        let sql = format!(
            "SELECT {MSG_COLS}, d.seq, d.attempts FROM deliveries d
             JOIN messages m ON m.pos = d.msg
             WHERE d.msg = ?1 AND d.recipient = ?2 AND d.status IN ({QUEUED}, {QUEUED_BELOW})"
        );
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let mut out = Vec::new();
        for w in q.range(start..).take(limit) {
            let row = stmt
                .query_row(params![w.pos, rid], |r| {
                    Ok((
                        RawMessage::from_row(r, 0)?,
                        r.get::<_, i64>(MSG_NCOLS)?,
                        r.get::<_, i64>(MSG_NCOLS + 1)?,
                    ))
                })
                .optional()?;
            // Cannot be missing while the list matches the table; if it ever does not, the
            // table is the truth.
            let Some((raw, seq, attempts)) = row else {
                continue;
            };
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
        self.fresh_queued()?;
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
            let pending = self.pending_count(&name);
            out.push(AgentInfo {
                name,
                cli,
                online: false,
                first_seen: to_u64(first_seen),
                last_seen: to_u64(last_seen),
                pending,
                topics,
                state: AgentState::Offline,
                since: None,
                why: None,
                thread: None,
                last_activity: None,
            });
        }
        Ok(out)
    }

    fn find(&mut self, id_or_prefix: &str, limit: usize) -> Result<Vec<MessageRecord>, StoreError> {
        self.fresh_queued()?;
        let limit = Value::Integer(i64::try_from(limit).unwrap_or(i64::MAX));
        let exact = self.records(
            &format!(
                "SELECT {MSG_COLS} FROM messages m WHERE m.id = ?1 ORDER BY sender_name LIMIT ?2"
            ),
            &[Value::Text(id_or_prefix.to_owned()), limit.clone()],
        )?;
        if !exact.is_empty() {
            return Ok(exact);
        }
        // Prefix matches, and short-id matches for a query of that length, in id order.
        let hi = prefix_upper_bound(id_or_prefix).unwrap_or_else(|| "\u{10FFFF}".repeat(2));
        let short = relay_protocol::is_short_id_len(id_or_prefix);
        self.records(
            &find_sql(),
            &[
                Value::Text(id_or_prefix.to_owned()),
                Value::Text(hi),
                Value::Integer(i64::from(short)),
                limit,
            ],
        )
    }

    fn history(&mut self, filter: &HistoryFilter) -> Result<Vec<MessageRecord>, StoreError> {
        self.fresh_queued()?;
        let mut sql = format!("SELECT {MSG_COLS} FROM messages m WHERE 1");
        let mut args: Vec<Value> = Vec::new();
        // Appends a bind value and returns its `?N` placeholder.
        let mut bind = |v: Value| {
            args.push(v);
            format!("?{}", args.len())
        };
        if let Some(from) = &filter.from {
            sql += &format!(
                " AND m.sender = (SELECT id FROM names WHERE name = {})",
                bind(Value::Text(from.clone()))
            );
        }
        if let Some(to) = &filter.to {
            // A broadcast's `to` is `*`; its delivery row (a primary-key probe) is what ties it
            // to the recipient.
            let p = bind(Value::Text(to.clone()));
            sql += &format!(
                " AND (m.recipient = {p} OR EXISTS \
                 (SELECT 1 FROM deliveries d WHERE d.recipient = \
                 (SELECT id FROM names WHERE name = {p}) AND d.msg = m.pos))"
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
        // Both kept as the batches commit: no table is counted (status at 10 million messages).
        let pending = self
            .fresh_queued()?
            .values()
            .map(|q| q.queued.len() as u64)
            .sum();
        Ok(Stats {
            messages: self.messages,
            pending,
        })
    }

    fn location(&self) -> String {
        self.path.display().to_string()
    }

    fn events(
        &mut self,
        pos: Option<i64>,
        msg_id: &str,
        from: &str,
    ) -> Result<Vec<relay_protocol::query::TraceEvent>, StoreError> {
        self.fresh_queued()?;
        dlq::events(&self.conn, &self.queued, pos, msg_id, from)
    }

    fn find_rejected(
        &mut self,
        id_or_prefix: &str,
        limit: usize,
    ) -> Result<Vec<relay_protocol::query::DeadLetter>, StoreError> {
        dlq::find_rejected(&self.conn, id_or_prefix, limit)
    }

    fn dead_letters(
        &mut self,
        all: bool,
        limit: usize,
    ) -> Result<Vec<relay_protocol::query::DeadLetter>, StoreError> {
        dlq::dead_letters(&self.conn, all, limit)
    }

    fn dead_letter(
        &mut self,
        dlq_id: i64,
    ) -> Result<Option<relay_protocol::query::DeadLetter>, StoreError> {
        dlq::dead_letter(&self.conn, dlq_id)
    }

    fn delivery_figures(
        &mut self,
        sample: usize,
    ) -> Result<relay_protocol::query::DeliveryFigures, StoreError> {
        self.fresh_queued()?;
        dlq::delivery_figures(&self.conn, &self.queued, sample)
    }

    fn recent_hops(&mut self, limit: usize) -> Result<Vec<(String, u32)>, StoreError> {
        dlq::recent_hops(&self.conn, limit)
    }

    fn unnotified(&mut self, limit: usize) -> Result<Vec<crate::DeadNotice>, StoreError> {
        dlq::unnotified(&self.conn, limit)
    }

    fn spawned(&mut self) -> Result<Vec<relay_protocol::query::SpawnRecord>, StoreError> {
        self.spawned_rows()
    }

    fn chain_extensions(&mut self) -> Result<Vec<(String, u32)>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT key, value FROM meta WHERE key >= ?1 AND key < ?2")?;
        let rows = stmt.query_map(params![CHAIN_KEY, CHAIN_KEY_END], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (key, extra) = row?;
            if let Some(thread) = key.strip_prefix(CHAIN_KEY) {
                out.push((thread.to_owned(), u32::try_from(extra).unwrap_or(u32::MAX)));
            }
        }
        Ok(out)
    }

    fn claims(&mut self) -> Result<Vec<relay_protocol::claims::ClaimInfo>, StoreError> {
        self.stored_claims()
    }
}

impl SqliteStore {
    /// [`Store::claims`].
    fn stored_claims(&mut self) -> Result<Vec<relay_protocol::claims::ClaimInfo>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT agent, path, since, until FROM claims ORDER BY path, agent")?;
        let rows = stmt.query_map([], |r| {
            Ok(relay_protocol::claims::ClaimInfo {
                agent: r.get(0)?,
                path: r.get(1)?,
                since: r.get(2)?,
                until: r.get(3)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

impl SqliteStore {
    /// [`Store::spawned`].
    fn spawned_rows(&mut self) -> Result<Vec<relay_protocol::query::SpawnRecord>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT name, parent, depth, at, worktree, notify_idle, ended_at FROM spawned
             ORDER BY at",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok(relay_protocol::query::SpawnRecord {
                name: r.get(0)?,
                parent: r.get(1)?,
                depth: r.get(2)?,
                at: u64::try_from(r.get::<_, i64>(3)?).unwrap_or(0),
                worktree: r.get(4)?,
                notify_idle: r.get(5)?,
                ended_at: r
                    .get::<_, Option<i64>>(6)?
                    .map(|t| u64::try_from(t).unwrap_or(0)),
            })
        })?;
        let mut out = Vec::new();
        for row in rows {
            out.push(row?);
        }
        Ok(out)
    }
}

/// The `meta` keys of hop-budget extensions: `chain:THREAD` (and the first key after them).
const CHAIN_KEY: &str = "chain:";
const CHAIN_KEY_END: &str = "chain;";

impl SqliteStore {
    /// [`Store::write_batch`] but for forgetting the names of a failed batch.
    fn try_write_batch(
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
            find_id: tx.prepare_cached(FIND_ID)?,
            insert_message: tx.prepare_cached(INSERT_MESSAGE)?,
            insert_delivery: tx.prepare_cached(INSERT_DELIVERY)?,
            ack_one: tx.prepare_cached(ACK_ONE)?,
            insert_range: tx.prepare_cached(INSERT_RANGE)?,
            now: to_i64(now_ms),
            names: &mut self.names,
            queued: &mut self.queued,
            runs: Runs::default(),
            committed_streams: &self.streams,
            streams: FxHashMap::default(),
            appended: 0,
            by_state: [0; 5],
        };
        let mut results = Vec::with_capacity(ops.len());
        for op in ops {
            // On error `tx` is dropped, which rolls back, and the scratch maps are discarded.
            results.push(batch.apply(op)?);
        }
        for run in batch.runs.close_all() {
            batch.write_run(&run)?;
        }
        let queued_from = lowest_queued(batch.queued);
        if self.queued_from != Some(queued_from) {
            tx.prepare_cached("UPDATE meta SET value = ?1 WHERE key = 'queued_from'")?
                .execute([queued_from])?;
        }
        let flush = self.batches_since_flush + 1 >= STREAMS_FLUSH_EVERY;
        if flush {
            batch.flush(&self.unflushed)?;
        }
        let appended = batch.appended;
        {
            let mut count =
                tx.prepare_cached("UPDATE counters SET value = value + ?2 WHERE key = ?1")?;
            if appended > 0 {
                count.execute(params!["messages", to_i64(appended)])?;
            }
            for (state, delta) in COUNTED_STATES.iter().zip(batch.by_state) {
                if delta != 0 {
                    count.execute(params![format!("deliveries.{}", state.as_str()), delta])?;
                }
            }
        }
        let streams = batch.into_changes();
        tx.commit()?;
        self.messages += appended;
        self.checkpointer.committed();
        self.queued_from = Some(queued_from);
        if flush {
            self.unflushed.clear();
            self.batches_since_flush = 0;
        } else {
            self.unflushed.extend(streams.keys().copied());
            self.batches_since_flush += 1;
        }
        self.streams.extend(streams);
        Ok(results)
    }

    /// An agent's subscription patterns, sorted.
    fn topics(&self, agent: &str) -> Result<Vec<String>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT pattern FROM subscriptions WHERE agent = ?1 ORDER BY pattern",
        )?;
        let rows = stmt.query_map([agent], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use relay_protocol::query::DeliveryStatus;

    use super::*;
    use crate::tests::{Backend, SqliteBackend, msg};

    fn seqs(s: &mut SqliteStore, ops: &[WriteOp], now: u64) -> Vec<Vec<u64>> {
        s.write_batch(ops, now)
            .unwrap()
            .into_iter()
            .filter_map(|r| match r {
                WriteResult::Appended(AppendOutcome::Stored { seqs, .. }) => Some(seqs),
                _ => None,
            })
            .collect()
    }

    /// The kept counts (`status`: messages, deliveries by state) equal counting the tables,
    /// after every kind of change: appends (with a duplicate), acks, verified, failed, expiry,
    /// a retry, a failed batch and a reopen.
    #[test]
    fn kept_counts_equal_the_tables_counts() {
        let mut b = SqliteBackend::new();
        let mut s = b.open();
        let check = |s: &mut SqliteStore, when: &str| {
            let counted: i64 = s
                .conn
                .query_row("SELECT count(*) FROM messages", [], |r| r.get(0))
                .unwrap();
            assert_eq!(s.stats().unwrap().messages, to_u64(counted), "{when}");
            // Each row's state as readers see it: its own, or its watermark range's.
            let mut by_state = std::collections::BTreeMap::new();
            s.fresh_queued().unwrap();
            let mut stmt = s
                .conn
                .prepare("SELECT recipient, msg, status, updated_at FROM deliveries")
                .unwrap();
            let rows: Vec<(i64, i64, i64, i64)> = stmt
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            for (rid, pos, code, at) in rows {
                let state = effective(&s.conn, &s.queued, rid, pos, code, at).unwrap();
                *by_state
                    .entry(state.status.as_str().to_owned())
                    .or_insert(0u64) += 1;
            }
            drop(stmt);
            assert_eq!(s.delivery_figures(10).unwrap().by_state, by_state, "{when}");
        };
        let append = |id: &str, to: &[&str]| WriteOp::Append(msg(id, "alice", "*", to));
        let set = |r: &str, pos, status| WriteOp::SetStatus {
            recipient: r.into(),
            pos,
            status,
            reason: None,
        };
        s.write_batch(
            &[
                append("m1", &["bob", "carol"]),
                append("m2", &["bob"]),
                append("m3", &["bob", "carol"]),
                append("m1", &["bob", "carol"]),
            ],
            10,
        )
        .unwrap();
        check(&mut s, "appended, one duplicate");
        s.write_batch(
            &[
                WriteOp::AckThrough {
                    recipient: "bob".into(),
                    through: 2,
                },
                set("bob", 1, DeliveryStatus::Verified),
                set("carol", 1, DeliveryStatus::Failed),
                // An ack never overwrites a later state: no change.
                set("bob", 1, DeliveryStatus::Acked),
            ],
            20,
        )
        .unwrap();
        check(&mut s, "acked, verified, failed");
        let res = s
            .write_batch(
                &[WriteOp::Expire {
                    queued_before: 15,
                    except: vec![],
                }],
                30,
            )
            .unwrap();
        assert!(matches!(&res[0], WriteResult::Expired(n) if n.len() == 2));
        check(&mut s, "expired");
        let dl = s.dead_letters(false, 10).unwrap();
        s.write_batch(
            &[WriteOp::Retry {
                dlq_id: dl[0].dlq_id,
            }],
            40,
        )
        .unwrap();
        // Retried twice: the second is already retried and changes nothing.
        s.write_batch(
            &[WriteOp::Retry {
                dlq_id: dl[0].dlq_id,
            }],
            41,
        )
        .unwrap();
        check(&mut s, "retried");
        // A failed batch (a recipient name that is not a valid name id cannot fail here, so
        // break the transaction by hand): nothing of it is counted.
        s.conn
            .execute_batch(
                "CREATE TRIGGER boom BEFORE INSERT ON messages WHEN new.id = 'm9'
                            BEGIN SELECT raise(ABORT, 'boom'); END;",
            )
            .unwrap();
        s.write_batch(&[append("m8", &["bob"]), append("m9", &["bob"])], 50)
            .unwrap_err();
        check(&mut s, "after a failed batch");
        let mut s = b.reopen(s);
        check(&mut s, "reopened");
        s.write_batch(&[append("m10", &["carol"])], 60).unwrap();
        check(&mut s, "appended after reopen");
    }

    /// The default is `synchronous=FULL` (2: an ACK means the commit was fsynced);
    /// `Durability::Normal` is the opt-out (1).
    #[test]
    fn durability_sets_synchronous() {
        let b = SqliteBackend::new();
        let level = |s: &SqliteStore| -> i64 {
            s.conn
                .query_row("PRAGMA synchronous", [], |r| r.get(0))
                .unwrap()
        };
        let s = SqliteStore::open(&b.path()).unwrap();
        assert_eq!(level(&s), 2);
        drop(s);
        let s = SqliteStore::open_with(&b.path(), Durability::Full).unwrap();
        assert_eq!(level(&s), 2);
        drop(s);
        let s = SqliteStore::open_with(&b.path(), Durability::Normal).unwrap();
        assert_eq!(level(&s), 1);
        assert_eq!(Durability::default(), Durability::Full);
        assert_eq!(Durability::Normal.as_str(), "normal");
    }

    /// A short-id lookup scans the ids' index, never the table with its bodies: with a
    /// million messages that would hold the store thread (and every commit behind it) for
    /// seconds.
    #[test]
    fn sqlite_find_scans_no_table() {
        let mut b = SqliteBackend::new();
        drop(b.open());
        let conn = Connection::open(b.path()).unwrap();
        let plan: Vec<String> = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {}", find_sql()))
            .unwrap()
            .query_map(params!["01M80TF6", "01M80TF7", true, 10], |r| {
                r.get::<_, String>(3)
            })
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let plan = plan.join("\n");
        let scans: Vec<&str> = plan.lines().filter(|l| l.contains("SCAN")).collect();
        assert!(
            !scans.is_empty() && scans.iter().all(|l| l.contains("COVERING INDEX")),
            "{plan}"
        );
    }

    /// The `streams` table is written only every `STREAMS_FLUSH_EVERY` batches; reopening
    /// before, at and after a flush must continue every stream where it was.
    #[test]
    fn streams_continue_across_flushes_and_reopen() {
        let mut b = SqliteBackend::new();
        let mut s = b.open();
        let total = STREAMS_FLUSH_EVERY * 2 + 5;
        let mut n = 0u64;
        for batch in 0..total {
            let mut topic = msg(&format!("t{batch}"), "alice", "*", &["bob", "carol"]);
            topic.topic = Some("news".into());
            let ops = [
                WriteOp::Append(msg(&format!("d{batch}"), "alice", "bob", &["bob"])),
                WriteOp::Append(topic),
            ];
            n += 1;
            assert_eq!(seqs(&mut s, &ops, n), vec![vec![n], vec![n, n]]);
            if batch == 3 || batch + 1 == STREAMS_FLUSH_EVERY || batch == STREAMS_FLUSH_EVERY + 7 {
                s = b.reopen(s);
            }
        }
        let mut s = b.reopen(s);
        let ops = [WriteOp::Append(msg("last", "alice", "bob", &["bob"]))];
        assert_eq!(seqs(&mut s, &ops, n + 1), vec![vec![n + 1]]);
        assert_eq!(s.stats().unwrap().pending, 3 * n + 1);
    }

    /// Re-queueing an old delivery moves `meta.queued_from` below it, so a reopen still finds it.
    #[test]
    fn requeued_delivery_survives_reopen() {
        let mut b = SqliteBackend::new();
        let mut s = b.open();
        for (i, id) in ["m1", "m2", "m3"].iter().enumerate() {
            let ops = [WriteOp::Append(msg(id, "alice", "bob", &["bob"]))];
            seqs(&mut s, &ops, i as u64 + 1);
        }
        let ack = WriteOp::AckThrough {
            recipient: "bob".into(),
            through: 3,
        };
        s.write_batch(&[ack], 10).unwrap();
        let mut s = b.reopen(s);
        assert!(s.take_pending("bob", 0, 10).unwrap().is_empty());
        let requeue = WriteOp::SetStatus {
            recipient: "bob".into(),
            pos: 2,
            status: DeliveryStatus::Queued,
            reason: None,
        };
        s.write_batch(&[requeue], 11).unwrap();
        let mut s = b.reopen(s);
        let pending: Vec<i64> = s
            .take_pending("bob", 0, 10)
            .unwrap()
            .iter()
            .map(|p| p.message.pos)
            .collect();
        assert_eq!(pending, vec![2]);
        // Expiry sees it too (queued at 2, before 5).
        let expire = WriteOp::Expire {
            queued_before: 5,
            except: Vec::new(),
        };
        assert!(matches!(
            s.write_batch(&[expire], 12).unwrap().as_slice(),
            [WriteResult::Expired(n)] if n.len() == 1
        ));
        let mut s = b.reopen(s);
        assert!(s.take_pending("bob", 0, 10).unwrap().is_empty());
    }

    /// Acks, set-status and re-queueing as `find` and `take_pending` see them, across reopen
    /// (the queued lists are rebuilt from the table).
    #[test]
    fn statuses_survive_reopen() {
        let mut b = SqliteBackend::new();
        let mut s = b.open();
        for (i, id) in ["m1", "m2", "m3"].iter().enumerate() {
            let ops = [WriteOp::Append(msg(id, "alice", "bob", &["bob"]))];
            seqs(&mut s, &ops, i as u64 + 1);
        }
        let status = |s: &mut SqliteStore, id: &str| {
            let d = &s.find(id, 1).unwrap()[0].deliveries[0];
            (d.status, d.updated_at)
        };
        let ack = |through| WriteOp::AckThrough {
            recipient: "bob".into(),
            through,
        };
        let set = |pos, status| WriteOp::SetStatus {
            recipient: "bob".into(),
            pos,
            status,
            reason: None,
        };
        s.write_batch(&[set(2, DeliveryStatus::Failed), ack(1)], 10)
            .unwrap();
        s.write_batch(&[ack(3)], 20).unwrap();
        let mut s = b.reopen(s);
        assert_eq!(status(&mut s, "m1"), (DeliveryStatus::Acked, Some(10)));
        assert_eq!(status(&mut s, "m2"), (DeliveryStatus::Failed, Some(10)));
        assert_eq!(status(&mut s, "m3"), (DeliveryStatus::Acked, Some(20)));
        assert!(s.take_pending("bob", 0, 10).unwrap().is_empty());
        // Re-queue an implicitly acked delivery, then ack it again.
        s.write_batch(&[set(1, DeliveryStatus::Queued)], 30)
            .unwrap();
        assert_eq!(status(&mut s, "m1"), (DeliveryStatus::Queued, Some(30)));
        let mut s = b.reopen(s);
        assert_eq!(s.take_pending("bob", 0, 10).unwrap().len(), 1);
        s.write_batch(&[ack(3)], 40).unwrap();
        let mut s = b.reopen(s);
        assert_eq!(status(&mut s, "m1"), (DeliveryStatus::Acked, Some(40)));
        assert_eq!(status(&mut s, "m3"), (DeliveryStatus::Acked, Some(20)));
        assert!(s.take_pending("bob", 0, 10).unwrap().is_empty());
        assert_eq!(s.stats().unwrap().pending, 0);
    }

    /// A database written by v8 (a row per delivery's state, no watermarks) opens with every
    /// delivery's state and time as it was; new acknowledgements then go to watermarks, and the
    /// old rows still read the same after a reopen.
    #[test]
    fn migrates_v8_database_keeping_every_state() {
        let mut b = SqliteBackend::new();
        std::fs::create_dir_all(b.path().parent().unwrap()).unwrap();
        {
            let c = Connection::open(b.path()).unwrap();
            for step in &MIGRATIONS[..8] {
                c.execute_batch(step).unwrap();
            }
            c.pragma_update(None, "user_version", 8).unwrap();
            c.execute_batch(
                "INSERT INTO names (id, name) VALUES (1, 'alice'), (2, 'bob');
                 INSERT INTO messages (pos, id, ts, sender, recipient, kind, body)
                     VALUES (1, 'm1', 10, 1, 'bob', 'message', 'one'),
                            (2, 'm2', 11, 1, 'bob', 'message', 'two'),
                            (3, 'm3', 12, 1, 'bob', 'message', 'three'),
                            (4, 'm4', 13, 1, 'bob', 'message', 'four'),
                            (5, 'm5', 14, 1, 'bob', 'message', 'five');
                 INSERT INTO deliveries VALUES (2, 1, 1, 1, 0, 10, 20),
                                               (2, 2, 2, 2, 0, 11, 21),
                                               (2, 3, 3, 0, 1, 12, -13),
                                               (2, 4, 4, 3, 0, 13, 23),
                                               (2, 5, 5, 0, 0, 14, -15);
                 UPDATE meta SET value = 5 WHERE key = 'streams_through';
                 UPDATE meta SET value = 3 WHERE key = 'queued_from';
                 UPDATE counters SET value = 5 WHERE key = 'messages';
                 UPDATE counters SET value = 2 WHERE key = 'deliveries.queued';
                 UPDATE counters SET value = 1 WHERE key = 'deliveries.acked';
                 UPDATE counters SET value = 1 WHERE key = 'deliveries.verified';
                 UPDATE counters SET value = 1 WHERE key = 'deliveries.failed';",
            )
            .unwrap();
        }
        let states = |s: &mut SqliteStore| -> Vec<(String, DeliveryStatus, Option<u64>)> {
            let mut h = s.history(&HistoryFilter::default()).unwrap();
            h.reverse();
            h.into_iter()
                .map(|m| (m.id, m.deliveries[0].status, m.deliveries[0].updated_at))
                .collect()
        };
        let before = vec![
            ("m1".to_owned(), DeliveryStatus::Acked, Some(20)),
            ("m2".to_owned(), DeliveryStatus::Verified, Some(21)),
            ("m3".to_owned(), DeliveryStatus::Queued, None),
            ("m4".to_owned(), DeliveryStatus::Failed, Some(23)),
            ("m5".to_owned(), DeliveryStatus::Queued, None),
        ];
        let mut s = b.open();
        assert_eq!(states(&mut s), before);
        assert_eq!(s.stats().unwrap().pending, 2);
        let pending: Vec<(i64, u32)> = s
            .take_pending("bob", 0, 10)
            .unwrap()
            .iter()
            .map(|p| (p.message.pos, p.attempt))
            .collect();
        assert_eq!(pending, vec![(3, 2), (5, 1)]);
        // Verified in order: the watermark takes both.
        let verified = |pos| WriteOp::SetStatus {
            recipient: "bob".into(),
            pos,
            status: DeliveryStatus::Verified,
            reason: None,
        };
        s.write_batch(&[verified(3), verified(5)], 30).unwrap();
        let ranges: i64 = s
            .conn
            .query_row("SELECT count(*) FROM acks", [], |r| r.get(0))
            .unwrap();
        assert_eq!(ranges, 1, "an in-order run is one range");
        let mut s = b.reopen(s);
        let mut after = before;
        after[2] = ("m3".to_owned(), DeliveryStatus::Verified, Some(30));
        after[4] = ("m5".to_owned(), DeliveryStatus::Verified, Some(30));
        assert_eq!(states(&mut s), after);
        assert_eq!(s.stats().unwrap().pending, 0);
        let by_state = s.delivery_figures(10).unwrap().by_state;
        assert_eq!(by_state.get("verified"), Some(&3));
        assert_eq!(by_state.get("acked"), Some(&1));
    }

    /// A database written by v1 (text keys, ack cursors) opens with its messages, deliveries,
    /// streams and acks intact.
    #[test]
    fn migrates_v1_database() {
        let b = SqliteBackend::new();
        std::fs::create_dir_all(b.path().parent().unwrap()).unwrap();
        {
            let c = Connection::open(b.path()).unwrap();
            c.execute_batch(MIGRATIONS[0]).unwrap();
            c.execute_batch(
                "INSERT INTO messages (pos, id, ts, sender, recipient, topic, kind, body)
                     VALUES (1, 'm1', 10, 'alice', 'bob', NULL, 'message', 'one'),
                            (2, 'm2', 11, 'alice', '*', 'news', 'message', 'two'),
                            (3, 'm3', 12, 'alice', 'bob', NULL, 'message', 'three');
                 UPDATE messages SET fanout = '[\"bob\",\"carol\"]' WHERE pos = 2;
                 INSERT INTO deliveries VALUES ('bob', 1, 1, 1, 0, 10, 20),
                                               ('bob', 2, 1, 0, 1, 11, NULL),
                                               ('carol', 2, 1, 0, 0, 11, NULL),
                                               ('bob', 3, 2, 0, 0, 12, NULL);
                 INSERT INTO streams VALUES ('bob', '', 'alice', 2), ('bob', 'news', 'alice', 1),
                                            ('carol', 'news', 'alice', 1);
                 INSERT INTO cursors VALUES ('bob', 1);
                 PRAGMA user_version = 1;",
            )
            .unwrap();
        }
        let mut s = SqliteStore::open(&b.path()).unwrap();
        // Counted once by the v5 migration.
        assert_eq!(s.stats().unwrap().messages, 3);
        let pending: Vec<(String, u64, u32)> = s
            .take_pending("bob", 0, 10)
            .unwrap()
            .into_iter()
            .map(|p| (p.message.id.clone(), p.seq, p.attempt))
            .collect();
        assert_eq!(
            pending,
            vec![("m2".into(), 1, 2), ("m3".into(), 2, 1)],
            "acked m1 is not pending"
        );
        let found = s.find("m2", 10).unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].from, "alice");
        assert_eq!(found[0].deliveries.len(), 2);
        let m1 = s.find("m1", 10).unwrap();
        assert_eq!(m1[0].deliveries[0].status, DeliveryStatus::Acked);
        assert_eq!(m1[0].deliveries[0].updated_at, Some(20));
        let mut news = msg("m4", "alice", "*", &["carol"]);
        news.topic = Some("news".into());
        let ops = [
            WriteOp::Append(msg("m5", "alice", "bob", &["bob"])),
            WriteOp::Append(news),
            WriteOp::Append(msg("m1", "alice", "bob", &["bob"])),
        ];
        let res = s.write_batch(&ops, 30).unwrap();
        assert!(matches!(
            &res[2],
            WriteResult::Appended(AppendOutcome::Duplicate { pos: 1 })
        ));
        let got: Vec<Vec<u64>> = res
            .iter()
            .filter_map(|r| match r {
                WriteResult::Appended(AppendOutcome::Stored { seqs, .. }) => Some(seqs.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(got, vec![vec![3], vec![2]]);
        assert_eq!(s.stats().unwrap().pending, 5);
        // Two stored, the duplicate not counted; and the count is the table's.
        assert_eq!(s.stats().unwrap().messages, 5);
        drop(s);
        let s = SqliteStore::open(&b.path()).unwrap();
        let (kept, counted): (i64, i64) = s
            .conn
            .query_row(
                "SELECT (SELECT value FROM counters WHERE key = 'messages'),
                        (SELECT count(*) FROM messages)",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!((kept, counted), (5, 5));
    }
}
