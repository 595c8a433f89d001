//! The messages the daemon's tasks send each other: connections to the router
//! ([`RouterMsg`]), the router to connections ([`Outbound`]), the router to the store thread
//! ([`StoreCmd`]) and back ([`StoreEvent`]), and the in-process answers ([`Answer`]).
//!
//! They live here, apart from the tasks that exchange them, so that `router.rs`,
//! `store_actor.rs`, `feed.rs` and `conn.rs` each depend on this module and not on each other.

use std::sync::{Arc, Mutex};

use relay_protocol::query::{QueryRequest, QueryResult};
use relay_protocol::{
    Ack, AckStatus, Envelope, ErrorCode, ErrorPayload, Hello, Nack, Payload, Send, TerminalReport,
};
use relay_store::{PendingDelivery, StoredMessage, WriteOp, WriteResult};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// One DELIVER waiting in a connection's queue; the connection's writer encodes it.
#[derive(Debug)]
pub(crate) struct DeliverItem {
    pub(crate) msg: Arc<StoredMessage>,
    pub(crate) seq: u64,
    pub(crate) attempt: u32,
    pub(crate) session_id: Arc<str>,
    /// The payload exactly as the sender's SEND carried it, when delivering live: written as
    /// is instead of serializing `msg.payload` again (which was the costliest step per
    /// DELIVER). Replays from the store have none.
    pub(crate) raw: Option<Raw>,
    /// Tell the router once the peer has read this DELIVER off the socket (`unread.rs`): for
    /// a connection that said `ack: false`, that is its acknowledgement (queued is not, nor
    /// written: a recipient that stops reading and leaves would lose what sat in the daemon's
    /// queue or in its own socket buffer).
    pub(crate) confirm: bool,
}

/// A payload's JSON text as received.
pub(crate) type Raw = Arc<serde_json::value::RawValue>;

/// What a connection's writer is asked to write. Kept small (about 48 bytes): every message
/// passes through two of these queues, and tokio's channels move values in and out by copy.
#[derive(Debug)]
pub(crate) enum Outbound {
    /// A frame built by the router or the reader (rare: WELCOME, RESULT, BYE).
    Frame(Box<Envelope>),
    /// A daemon-originated frame with no routing fields; the writer stamps its id and time.
    Control(Box<Payload>),
    /// The receipt for a SEND (the one control frame sent per message).
    Receipt {
        ack_id: String,
        status: AckStatus,
        recipients: Option<u32>,
    },
    /// A DELIVER.
    Deliver(DeliverItem),
    /// Write this error (if any) after everything queued, then close.
    Close(Option<Box<ErrorPayload>>),
}

/// Cuts a connection short from outside (slow consumer, takeover, shutdown).
#[derive(Debug, Clone, Default)]
pub(crate) struct Killer {
    token: CancellationToken,
    reason: Arc<Mutex<Option<ErrorPayload>>>,
}

impl Killer {
    pub(crate) fn kill(&self, code: ErrorCode, message: String) {
        if let Ok(mut r) = self.reason.lock() {
            r.get_or_insert(ErrorPayload {
                code,
                message,
                fatal: true,
            });
        }
        self.token.cancel();
    }

    pub(crate) async fn killed(&self) {
        self.token.cancelled().await;
    }

    pub(crate) fn reason(&self) -> Option<ErrorPayload> {
        self.reason.lock().ok().and_then(|r| r.clone())
    }
}

/// A connection's handle, given to the router with its HELLO.
#[derive(Debug, Clone)]
pub(crate) struct ConnHandle {
    pub(crate) id: u64,
    pub(crate) tx: mpsc::Sender<Outbound>,
    pub(crate) killer: Killer,
    /// The peer is this daemon's own process (its people adapters, its federation link):
    /// only such a connection takes a person's name as an agent (`routing/names.rs`).
    pub(crate) in_process: bool,
    /// A name taken on a federation link's connection (a HELLO on a `link` connection,
    /// `conn.rs`): its WELCOME names it, since the link speaks for many.
    pub(crate) attach: bool,
}

/// Messages to the router.
#[derive(Debug)]
pub(crate) enum RouterMsg {
    /// A HELLO passed validation; register the connection and queue WELCOME.
    Register {
        conn: ConnHandle,
        hello: Hello,
        reply: oneshot::Sender<Result<(), (ErrorCode, String)>>,
    },
    /// The connection is gone; `bye`: its peer said BYE first (left on purpose).
    Unregister { conn_id: u64, bye: bool },
    /// A wrapper reported how its agent's terminal looks (in a PONG).
    Terminal {
        conn_id: u64,
        report: TerminalReport,
    },
    /// A SEND.
    Send {
        conn_id: u64,
        id: String,
        to: Option<String>,
        topic: Option<String>,
        payload: Send,
        raw: Option<Raw>,
    },
    /// A recipient acknowledged a DELIVER.
    Ack { conn_id: u64, ack: Ack },
    /// A recipient refused a DELIVER.
    Nack { conn_id: u64, nack: Nack },
    /// DELIVERs at these positions (asked with `confirm`) were read off the socket by a
    /// connection that does not acknowledge: they count as acknowledged now.
    Written { conn_id: u64, positions: Vec<i64> },
    /// SUBSCRIBE (`on`) or UNSUBSCRIBE.
    Subscribe {
        conn_id: u64,
        id: String,
        pattern: Option<String>,
        on: bool,
    },
    /// A QUERY.
    Query {
        conn_id: u64,
        id: String,
        req: QueryRequest,
    },
    /// A question from inside the process (the dashboard), answered on `reply`.
    Ask {
        req: QueryRequest,
        reply: oneshot::Sender<Answer>,
    },
}

/// Context carried through the store with a write, returned with its result.
#[derive(Debug)]
pub(crate) enum WriteCtx {
    /// Nobody waits for this result.
    None,
    /// The result may name dead letters whose senders must be told.
    Notify,
    /// An operator action (`dlq retry`, `dlq purge`) answered with a RESULT, or through
    /// `reply` when asked in process (the dashboard's retry button).
    Admin {
        conn_id: u64,
        env_id: String,
        reply: Option<oneshot::Sender<Answer>>,
    },
    /// A claim or release (issue 25.7): `result` is answered once the write is committed (so a
    /// claim the asker was told of outlives a crash), an error instead if it failed.
    Answer {
        conn_id: u64,
        env_id: String,
        reply: Option<oneshot::Sender<Answer>>,
        result: Box<QueryResult>,
    },
    /// An agent's HELLO: its WELCOME is sent once the agent is committed as known, so that a
    /// name the relay told a connection it holds is still known after a crash (a SEND to it
    /// is then never taken for a typo of a neighbour's name, as `agent2` of `agent1`).
    Welcome { conn_id: u64, welcome: Box<Payload> },
    /// A SEND: acknowledge to the sender and deliver to the recipients.
    Send {
        conn_id: u64,
        env_id: String,
        recipients: Vec<String>,
        raw: Option<Raw>,
        /// One per recipient that was online when the router sent the append (issue 26
        /// point 2): those with a writer were pre-approved for the store thread to hand the
        /// DELIVER to themselves right after the commit (`store_actor.rs`). A boxed slice, not
        /// a `Vec`: every store command is as large as its largest kind.
        online: Box<[Handover]>,
    },
}

/// An online recipient of an append, as the router saw it when it sent the append. With a
/// `writer`, the router pre-approved it (live, window room, nothing of it waiting for the
/// router: `routing/delivery.rs` `handover`): the store thread queues the DELIVER on the
/// writer itself right after the commit and sets `handed`; the router then records it as sent
/// without sending it again. Without one, the router delivers as before.
#[derive(Debug)]
pub(crate) struct Handover {
    /// The recipient's index in the append's recipients (and in the stored seqs).
    pub(crate) index: usize,
    /// The connection it was online on.
    pub(crate) conn_id: u64,
    /// Where the store thread may queue its DELIVER.
    pub(crate) writer: Option<Writer>,
    /// Set by the store thread once the DELIVER is queued.
    pub(crate) handed: bool,
}

/// What the store thread needs to queue a DELIVER on a connection.
#[derive(Debug)]
pub(crate) struct Writer {
    pub(crate) tx: mpsc::Sender<Outbound>,
    pub(crate) session_id: Arc<str>,
    /// As [`DeliverItem::confirm`].
    pub(crate) confirm: bool,
}

/// Context carried through the store with a query.
#[derive(Debug)]
pub(crate) struct QueryCtx {
    pub(crate) conn_id: u64,
    pub(crate) env_id: String,
    pub(crate) kind: QueryKind,
    /// Set for [`RouterMsg::Ask`]: the answer goes here instead of to a connection.
    pub(crate) reply: Option<oneshot::Sender<Answer>>,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum QueryKind {
    Status,
    Agents,
    Trace,
    Other,
}

/// A command for the store thread.
#[derive(Debug)]
pub(crate) enum StoreCmd {
    /// Apply a write; the result comes back as [`StoreEvent::Written`].
    Write(WriteOp, WriteCtx),
    /// Load queued deliveries for a recipient; answered with [`StoreEvent::Pending`].
    TakePending {
        /// Recipient.
        recipient: String,
        /// Connection that asked (the answer is dropped if it is gone).
        conn_id: u64,
        /// Positions after this.
        after: i64,
        /// At most this many.
        limit: usize,
    },
    /// A read-only query; answered with [`StoreEvent::Query`].
    Query(QueryRequest, QueryCtx),
    /// The store thread may hand DELIVERs to connection `conn_id` again: the router has
    /// processed every append it pre-approved for it since one could not be handed (or the
    /// connection is gone). Until then the store thread hands that connection nothing, so a
    /// later DELIVER cannot overtake one the router sends.
    Reopen { conn_id: u64 },
}

/// What the store thread reports to the router.
#[derive(Debug)]
pub(crate) enum StoreEvent {
    /// A write's result.
    Written(WriteCtx, Result<WriteResult, String>),
    /// Queued deliveries for a recipient.
    Pending {
        /// Recipient.
        recipient: String,
        /// Connection that asked.
        conn_id: u64,
        /// The deliveries (or the error).
        deliveries: Result<Vec<PendingDelivery>, String>,
        /// The limit asked for; fewer means caught up.
        limit: usize,
    },
    /// A query's answer. `None` for `status`, which the router builds from the counters and
    /// what only it knows. The context is boxed: answers are rare and this keeps every
    /// write result, which shares the enum, small.
    Query(
        Box<QueryCtx>,
        Option<Box<QueryResult>>,
        relay_store::Stats,
        Option<Box<relay_protocol::query::DeliveryFigures>>,
    ),
}

/// What the router knows about an agent beyond what the store keeps.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct LiveAgent {
    /// Name.
    pub name: String,
    /// Messages it sent since the daemon started.
    pub sent: u64,
    /// Messages stored for it since the daemon started.
    pub received: u64,
    /// DELIVERs handed to its connection and not yet acknowledged (for a wrapped agent:
    /// messages waiting for the agent to be idle enough to type them in).
    pub inflight: u64,
    /// How its wrapper last said the agent's terminal looks (wrapped agents that are online).
    pub terminal: Option<relay_protocol::TerminalReport>,
}

/// The answer to [`Handle::ask`].
#[derive(Debug, Clone)]
pub struct Answer {
    /// What a `QUERY` would have got.
    pub result: QueryResult,
    /// For `agents`: the router's live figures per known agent (empty otherwise).
    pub live: Vec<LiveAgent>,
}
