//! The `QUERY`/`RESULT` extension: read-only questions the command-line tools ask the daemon,
//! and the records that answer them. The store returns the same records, so `agent-relay
//! history --json` prints exactly what the store holds.

use serde::{Deserialize, Serialize};

use crate::Kind;
/// Re-exported where it was first defined; it lives in its own module so that [`crate::events`]
/// can use it without importing this module (which imports `events`).
pub use crate::status::DeliveryStatus;

/// A read-only question (QUERY payload), tagged by `what`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "what", rename_all = "snake_case")]
pub enum QueryRequest {
    /// Daemon status and counters.
    Status,
    /// Connected and known-offline agents.
    Agents,
    /// One message by id or unique id prefix (at least 8 characters).
    Read {
        /// Full id or prefix.
        id: String,
        /// Only the message of this sender: ids are unique per sender, so `(from, id)` always
        /// names one message (two senders may choose the same id).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from: Option<String>,
    },
    /// Stored messages matching a filter, newest first.
    History(HistoryFilter),
    /// The delivery story of one message by id or unique id prefix (at least 8 characters).
    Trace {
        /// Full id or prefix.
        id: String,
        /// Only the message of this sender (as for `Read`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from: Option<String>,
    },
    /// The dead-letter queue, newest first.
    DlqList {
        /// Include entries already retried.
        #[serde(default)]
        all: bool,
        /// At most this many (default 50, at most 1000).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<u32>,
    },
    /// One dead letter.
    DlqShow {
        /// Its number.
        dlq_id: i64,
    },
    /// Put a dead letter back: a stored message is queued again for its recipient (and
    /// delivered at once if it is online); a refused SEND is sent again as its sender, past
    /// rate limits and budgets but not past access rules. (An operator action, not a read.)
    DlqRetry {
        /// Its number.
        dlq_id: i64,
    },
    /// Empty the dead-letter queue. (An operator action, not a read.)
    DlqPurge,
    /// Remove an agent that is not connected from the agent list, with its subscriptions;
    /// messages stored for it stay. Refused (`connected`) while it is connected. (An operator
    /// action, not a read.)
    ForgetAgent {
        /// Its name.
        name: String,
    },
    /// Lets the reply chain of `thread` run `hops` more replies than the hop budget allows
    /// (added to any earlier extension), from now on and across restarts: a person's way to
    /// let a long conversation go on. (An operator action, not a read.)
    ChainExtend {
        /// The chain's thread (what `budget_exceeded` names).
        thread: String,
        /// Replies more (1 to 1,000).
        hops: u32,
    },
    /// The live event feed: answered by one [`QueryResult::Event`] per event, until the
    /// connection closes (see [`crate::events`]).
    Watch(crate::events::WatchFilter),
    /// The asker (the connection's name) spawns a worker: the relay decides (access rule
    /// `deny-spawn`, the caps on live spawned agents and on depth), reserves the name, records
    /// the asker as its parent (kept across restarts) and stores `task` as a message from the
    /// asker to it. The asker then starts the worker's wrapper. Answered by
    /// [`QueryResult::Spawn`]. (A write, not a read.)
    Spawn(SpawnRequest),
    /// The asker releases a worker it spawned (a person, or a rule `allow-release`, may
    /// release any): its record ends, so its exit is not reported as on its own. Answered by
    /// [`QueryResult::Release`]; the asker then stops it.
    Release {
        /// The worker's name.
        name: String,
    },
    /// A wrapper says its agent exited on its own (it was not stopped): when the agent is a
    /// spawned worker not released, its record ends and its parent is told, with `status` and
    /// `lines`. Answered by [`QueryResult::SpawnExited`].
    SpawnExited {
        /// The agent's name (it must not be connected).
        name: String,
        /// Its exit status, when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<i32>,
        /// The last lines its terminal showed.
        #[serde(default)]
        lines: Vec<String>,
    },
    /// (issue 25.7) Claims `paths` for the connection's name for `for_ms` (default
    /// [`crate::claims::DEFAULT_CLAIM_MS`]); a path claimed again is renewed. Others' claims
    /// of the same files are named in the answer, and both sides are told by a relay notice.
    Claim {
        /// Paths in normal form ([`crate::claims::validate_claim_path`]).
        paths: Vec<String>,
        /// How long, in ms (at most [`crate::claims::MAX_CLAIM_MS`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        for_ms: Option<u64>,
    },
    /// (issue 25.7) Releases the connection's name's claims of `paths` (all of them when empty).
    Unclaim {
        /// Paths in normal form; empty: every claim of the name.
        #[serde(default)]
        paths: Vec<String>,
    },
    /// (issue 25.7) Every claim held now.
    Claims,
    /// (issue 25.7) The connection's name edited `paths` (Claude Code's PostToolUse hook): the
    /// editor and the holder of a claim on them, or another agent that edited one within a
    /// minute, are told, once.
    Edited {
        /// Paths in normal form.
        paths: Vec<String>,
    },
}

/// What [`QueryRequest::Spawn`] asks for.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SpawnRequest {
    /// The worker's name; `None`: the relay makes one (`<parent>-w1`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its first message, stored as from the asker (never in any argv).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// The directory under which its git worktree is made (`<dir>/<name>`), when it gets one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worktree_in: Option<String>,
    /// Tell the parent each time the worker becomes idle after a turn.
    #[serde(default)]
    pub notify_idle: bool,
    /// Only decide and answer; reserve and record nothing (a dry run).
    #[serde(default)]
    pub check: bool,
}

/// A spawned worker as the relay records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpawnRecord {
    /// The worker's name.
    pub name: String,
    /// Who spawned it.
    pub parent: String,
    /// 1 for a worker of an agent that was not spawned, 2 for a worker's worker...
    pub depth: u32,
    /// When (Unix ms).
    pub at: u64,
    /// Its git worktree, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worktree: Option<String>,
    /// Its parent is told when it becomes idle after a turn.
    #[serde(default)]
    pub notify_idle: bool,
    /// When it was released or exited (Unix ms); `None` while it is live.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<u64>,
}

/// Filter for [`QueryRequest::History`]. Every field narrows the result.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct HistoryFilter {
    /// Only messages from this sender.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// Only messages delivered (or queued) to this recipient, broadcasts included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// Only messages on this topic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// Only messages whose body contains this text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Only messages stored at or after this Unix ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<u64>,
    /// Only messages stored before this Unix ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until_ms: Option<u64>,
    /// Only messages stored before this position (paging: pass the last `pos` seen).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before_pos: Option<i64>,
    /// At most this many (default 50, at most 1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// One recipient's copy of a stored message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryRecord {
    /// Recipient name.
    pub recipient: String,
    /// Sequence number in the recipient's (topic, sender) stream.
    pub seq: u64,
    /// Current state.
    pub status: DeliveryStatus,
    /// When it was stored for this recipient (Unix ms).
    pub queued_at: u64,
    /// When its state last changed (Unix ms), if it changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<u64>,
}

/// A stored message with its deliveries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageRecord {
    /// Store position: increases with every stored message (paging key).
    pub pos: i64,
    /// The sender-chosen id.
    pub id: String,
    /// When the daemon stored it (Unix ms).
    pub ts: u64,
    /// Sender.
    pub from: String,
    /// Recipient name or `*`; for a topic broadcast `*` with `topic` set.
    pub to: String,
    /// Topic, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// Kind.
    pub kind: Kind,
    /// Text.
    pub body: String,
    /// Structured data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
    /// Thread id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread: Option<String>,
    /// The message this answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_reply_to: Option<String>,
    /// The federation node it came from (a message of another node's agent or tool).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    /// One entry per recipient.
    #[serde(default)]
    pub deliveries: Vec<DeliveryRecord>,
}

/// An agent the daemon knows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentInfo {
    /// Name.
    pub name: String,
    /// CLI it said it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cli: Option<String>,
    /// Connected right now.
    pub online: bool,
    /// First connection (Unix ms).
    pub first_seen: u64,
    /// Last connect or disconnect (Unix ms).
    pub last_seen: u64,
    /// Messages stored for it and not yet acknowledged.
    pub pending: u64,
    /// Topic patterns it subscribed to.
    #[serde(default)]
    pub topics: Vec<String>,
    /// What it is doing now (extension; `offline` from a daemon that does not say).
    #[serde(default)]
    pub state: AgentState,
    /// When it entered that state (Unix ms): for `busy`, since when it works.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<u64>,
    /// Why it is busy or blocked, when known (a busy marker, a dialog, a person typing,
    /// messages being handed over).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// The thread of the message it last sent or was handed (a message that starts a
    /// thread: its own id), since the daemon started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread: Option<String>,
    /// When it last sent, was handed a message or changed state (Unix ms), since the daemon
    /// started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_activity: Option<u64>,
}

/// What an agent is doing, as `agents`, `relay_agents` and `wait` see it: a wrapped agent's
/// terminal as its wrapper reports it, `busy` while messages are being handed to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentState {
    /// Connected, nothing being handed to it, its terminal quiet.
    Idle,
    /// Working: printing, answering a message typed into it, or being handed messages.
    Busy,
    /// Messages wait and cannot be typed (a dialog, a person typing, no input line).
    Blocked,
    /// Not connected.
    #[default]
    Offline,
}

impl AgentState {
    /// Lower-case name, as in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::Busy => "busy",
            Self::Blocked => "blocked",
            Self::Offline => "offline",
        }
    }
}

/// Daemon status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusInfo {
    /// Always true in an answer from a daemon.
    pub running: bool,
    /// Daemon process id.
    pub pid: u32,
    /// Socket path.
    pub socket: String,
    /// Database path, or `:memory:`.
    pub db: String,
    /// `sqlite` or `memory`.
    pub storage: String,
    /// Seconds since start.
    pub uptime_s: u64,
    /// Agents connected now.
    pub agents: u64,
    /// Agents known (connected or not).
    pub known_agents: u64,
    /// Messages stored.
    pub messages: u64,
    /// Deliveries waiting for an acknowledgement.
    pub pending: u64,
    /// Daemon version.
    pub version: String,
    /// Access rules in force.
    #[serde(default)]
    pub rules: u64,
    /// Why the rules file was not loaded (the previous rules stay in force), if it was not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules_error: Option<String>,
    /// Delivery counts and latencies (absent from older daemons).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<DeliveryFigures>,
    /// The link to the federation, when the relay was started with `--cluster`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub federation: Option<Box<FederationStatus>>,
}

/// How a relay started with `--cluster` sees the federation (docs/FEDERATION.md).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FederationStatus {
    /// This relay's node name.
    pub node: String,
    /// The NATS servers it was given.
    pub cluster: String,
    /// `connected`, `connecting` or `disconnected`.
    pub link: String,
    /// Messages for agents on other nodes stored here and not yet published (the outbox).
    pub backlog: u64,
    /// Messages published to other nodes since the relay started.
    pub published: u64,
    /// Messages received from other nodes and stored here since the relay started.
    pub received: u64,
    /// Agents on other nodes, as the directory has them.
    #[serde(default)]
    pub remote: Vec<RemoteAgent>,
    /// Names connected here that the directory gives to another node: refused in the
    /// federation (their messages to other nodes fail, and nobody elsewhere reaches them).
    #[serde(default)]
    pub conflicts: Vec<RemoteAgent>,
    /// The last error talking to NATS, if the link is not up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// An agent of the federation's directory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteAgent {
    /// Its name.
    pub name: String,
    /// The node that holds the name.
    pub node: String,
    /// Connected to its node, as that node last said.
    pub online: bool,
}

/// RESULT payload, tagged by `what` like the question.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "what", rename_all = "snake_case")]
pub enum QueryResult {
    /// Answer to `status`.
    Status(StatusInfo),
    /// Answer to `agents`.
    Agents {
        /// Known agents, online first.
        agents: Vec<AgentInfo>,
    },
    /// Answer to `read`: the message.
    Read {
        /// The message.
        message: MessageRecord,
    },
    /// Answer to `history`.
    History {
        /// Matching messages, newest first.
        messages: Vec<MessageRecord>,
    },
    /// Answer to `trace`.
    Trace {
        /// The story.
        trace: TraceRecord,
    },
    /// Answer to `dlq_list`.
    DlqList {
        /// Entries, newest first.
        dead_letters: Vec<DeadLetter>,
    },
    /// Answer to `dlq_show`.
    DlqShow {
        /// The entry.
        dead_letter: DeadLetter,
    },
    /// Answer to `dlq_retry`.
    DlqRetry {
        /// The entry as it is now.
        dead_letter: DeadLetter,
        /// What was done.
        outcome: String,
    },
    /// Answer to `dlq_purge`.
    DlqPurge {
        /// Entries removed.
        removed: u64,
    },
    /// Answer to `forget_agent`: the agent is no longer listed.
    ForgetAgent {
        /// Its name.
        name: String,
    },
    /// Answer to `chain_extend`: the thread's chain may now run `max_hops` replies.
    ChainExtend {
        /// The thread.
        thread: String,
        /// Its extension in all (replies beyond the relay's `--max-hops`).
        extra: u32,
        /// Its limit now.
        max_hops: u32,
    },
    /// Answer to `spawn`: the worker's record, and the id of its task message.
    Spawn {
        /// The record.
        record: SpawnRecord,
        /// The id of the task message, when there was a task.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        task_id: Option<String>,
    },
    /// Answer to `release`: the worker's record, now ended.
    Release {
        /// The record.
        record: SpawnRecord,
    },
    /// Answer to `spawn_exited`: whether its parent was told (false: not a live spawned
    /// worker).
    SpawnExited {
        /// Its parent was told.
        told: bool,
    },
    /// Answer to `claim`: the name's claims of the paths as they are now, and the other
    /// agents' claims they run into.
    Claim {
        /// The claims made or renewed.
        claims: Vec<crate::claims::ClaimInfo>,
        /// Others' claims of the same files.
        #[serde(default)]
        collisions: Vec<crate::claims::ClaimCollision>,
    },
    /// Answer to `unclaim`: the paths released.
    Unclaim {
        /// Released paths.
        released: Vec<String>,
    },
    /// Answer to `claims`.
    Claims {
        /// Every claim held, by path.
        claims: Vec<crate::claims::ClaimInfo>,
    },
    /// Answer to `edited`: the others whose claims or recent edits the edit ran into.
    Edited {
        /// Others' claims and edits of the same files.
        #[serde(default)]
        collisions: Vec<crate::claims::ClaimCollision>,
    },
    /// One event of a `watch` (many answers share the query's id).
    Event {
        /// What happened.
        event: crate::events::RelayEvent,
    },
    /// One piece of an answer too large for one frame (see [`crate::parts`]): the pieces'
    /// `data`, joined in order, are the JSON text of the whole RESULT payload. Every piece
    /// carries the query's id; the client answers the question once the last has arrived.
    Part {
        /// This piece's place, from 0.
        part: u32,
        /// How many pieces the answer has.
        parts: u32,
        /// A slice of the answer's JSON text.
        data: String,
    },
    /// The question could not be answered.
    Error {
        /// `not_found`, `ambiguous`, `invalid`, `connected` (an agent to forget is connected),
        /// `too_large` (the answer is over [`crate::parts::MAX_RESULT_BYTES`]: ask for fewer)
        /// or `internal`.
        code: String,
        /// Says what to do.
        message: String,
    },
}

/// A stage in the life of one (message, recipient) pair, as `trace` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceState {
    /// The daemon stored the SEND.
    Accepted,
    /// Stored for a recipient, waiting to be handed over.
    Queued,
    /// Written to the recipient's connection (a DELIVER).
    Delivered,
    /// The recipient acknowledged it: typed into the agent's terminal.
    Injected,
    /// The recipient saw it on the agent's screen.
    Verified,
    /// The recipient reported it could not be handed over.
    Failed,
    /// Its time to live ran out before it was delivered.
    Expired,
    /// Refused at send time (rule, rate limit, budget); never stored as a message.
    Rejected,
    /// Put in the dead-letter queue.
    DeadLettered,
    /// Taken out of the dead-letter queue by `agent-relay dlq retry`.
    Retried,
    /// Federation: published to another node through NATS (JetStream's PubAck came back).
    /// Never stored: `trace` shows it in place of a stand-in's acknowledgement.
    Published,
}

impl TraceState {
    /// Stable small integer used by stores.
    pub fn code(self) -> i64 {
        match self {
            Self::Accepted => 0,
            Self::Queued => 1,
            Self::Delivered => 2,
            Self::Injected => 3,
            Self::Verified => 4,
            Self::Failed => 5,
            Self::Expired => 6,
            Self::Rejected => 7,
            Self::DeadLettered => 8,
            Self::Retried => 9,
            Self::Published => 10,
        }
    }

    /// Inverse of [`TraceState::code`].
    pub fn from_code(code: i64) -> Option<Self> {
        Some(match code {
            0 => Self::Accepted,
            1 => Self::Queued,
            2 => Self::Delivered,
            3 => Self::Injected,
            4 => Self::Verified,
            5 => Self::Failed,
            6 => Self::Expired,
            7 => Self::Rejected,
            8 => Self::DeadLettered,
            9 => Self::Retried,
            10 => Self::Published,
            _ => return None,
        })
    }

    /// Lower-case name, as in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::Queued => "queued",
            Self::Delivered => "delivered",
            Self::Injected => "injected",
            Self::Verified => "verified",
            Self::Failed => "failed",
            Self::Expired => "expired",
            Self::Rejected => "rejected",
            Self::DeadLettered => "dead_lettered",
            Self::Retried => "retried",
            Self::Published => "published",
        }
    }
}

/// One state change in a message's story.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceEvent {
    /// When (Unix ms).
    pub ts: u64,
    /// The recipient it concerns; `None` for the message as a whole (accepted, rejected).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recipient: Option<String>,
    /// The new state.
    pub state: TraceState,
    /// Why, or which session, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// The story of one message: every state change of every recipient's copy, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceRecord {
    /// Message id.
    pub id: String,
    /// Store position; `None` for a SEND refused before it was stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pos: Option<i64>,
    /// Sender.
    pub from: String,
    /// Recipient name or `*`.
    pub to: String,
    /// Topic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// The federation node it came from (a message of another node's agent or tool).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    /// State changes, in time order.
    pub events: Vec<TraceEvent>,
}

/// A message (or one recipient's copy of it) that was not delivered, with the reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// Dead-letter number (what `dlq show`/`retry` take).
    pub dlq_id: i64,
    /// When it was dead-lettered (Unix ms).
    pub ts: u64,
    /// The message id.
    pub msg_id: String,
    /// Store position of the message; `None` if it was refused before being stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pos: Option<i64>,
    /// Sender.
    pub from: String,
    /// The recipient that did not get it (`*` for a refused broadcast).
    pub recipient: String,
    /// Topic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// `expired`, `failed`, `forbidden`, `rate_limited`, `budget_exceeded`.
    pub code: String,
    /// Says what happened.
    pub reason: String,
    /// The message text.
    pub body: String,
    /// When it was retried, if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retried_at: Option<u64>,
}

/// Latency of one stage over recent deliveries, in milliseconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageLatency {
    /// `stored_to_delivered`, `delivered_to_acknowledged`, `stored_to_acknowledged`.
    pub stage: String,
    /// Deliveries measured.
    pub samples: u64,
    /// Median.
    pub p50_ms: u64,
    /// 90th percentile.
    pub p90_ms: u64,
    /// 99th percentile.
    pub p99_ms: u64,
    /// Largest.
    pub max_ms: u64,
}

/// Aggregate delivery figures for `status`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DeliveryFigures {
    /// Deliveries by current state (`queued`, `acked`, `verified`, `failed`, `expired`).
    pub by_state: std::collections::BTreeMap<String, u64>,
    /// Entries in the dead-letter queue not yet retried.
    pub dead_letters: u64,
    /// SENDs refused at send time (rules, rate limits, budgets), all time.
    pub rejected: u64,
    /// Per-stage latencies over the most recent acknowledged (injected or verified) deliveries.
    pub latency: Vec<StageLatency>,
}
