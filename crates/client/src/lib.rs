//! The agent-relay client, used by the wrapper and by every CLI command that talks to the daemon.
//!
//! [`Client::connect`] opens the socket and completes HELLO/WELCOME; a background driver task
//! then owns the connection. It answers PINGs, matches ACK/NACK/RESULT frames to the calls that
//! wait for them, hands DELIVERs to [`Client::next_event`] (each `(from, id)` once, however often
//! the daemon replays it), and — when [`ClientConfig::reconnect`] is set — reconnects with
//! [`Backoff`] after the daemon goes away, presents its resume token, re-subscribes, and
//! re-sends every SEND not yet acknowledged. Message ids are chosen here (ULIDs) and the daemon
//! treats a re-sent id as a duplicate, so re-sending never delivers twice.

mod backoff;
pub mod paths;

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use relay_protocol::query::{QueryRequest, QueryResult};
use relay_protocol::{
    Ack, AckStatus, Busy, Capabilities, DeliveryState, Envelope, ErrorCode, ErrorPayload, Hello,
    Kind, MAX_FRAME_BYTES, NackCode, Payload, Ping, Role, Send, SubscribePayload, TerminalReport,
    encode_frame, frame_len, now_ms,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};

pub use backoff::Backoff;

/// How long [`Client::connect`] waits for a name still held by a closing connection.
const NAME_RELEASE_WAIT: Duration = Duration::from_secs(3);

/// How many delivered `(from, id)` pairs are remembered to drop replays.
const DEDUPE_CAPACITY: usize = 65_536;

/// Client failures.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// Nothing listens on the socket.
    #[error("relay is not running (no daemon at {socket}) — start it with `agent-relay up`")]
    NotRunning {
        /// The socket tried.
        socket: PathBuf,
        /// The connect error.
        #[source]
        source: std::io::Error,
    },
    /// The process listening on the socket is another user's: it would read everything sent
    /// to it, so nothing is.
    #[error(
        "the relay at {socket} is run by another user (uid {uid}), not you; nothing was sent to it. \
         Set AGENT_RELAY_SOCKET to a path in a directory of yours (or remove that socket if it is yours to remove)"
    )]
    ForeignDaemon {
        /// The socket tried.
        socket: PathBuf,
        /// The uid of the process listening on it.
        uid: u32,
    },
    /// The daemon refused the handshake.
    #[error("the relay refused the connection: {message}")]
    Refused {
        /// Why, for programs (`name_in_use`, `bad_name`, `forbidden`...).
        code: ErrorCode,
        /// Why, for people.
        message: String,
    },
    /// The daemon refused a SEND or SUBSCRIBE.
    #[error("{reason}")]
    Rejected {
        /// Why, for programs.
        code: NackCode,
        /// Why, for people.
        reason: String,
    },
    /// A query could not be answered.
    #[error("{message}")]
    Query {
        /// `not_found`, `ambiguous`, `invalid`, `internal`.
        code: String,
        /// Says what to do.
        message: String,
    },
    /// The relay did not answer a request within the client's deadline
    /// ([`ClientConfig::request_timeout`]).
    #[error(
        "the relay did not answer {what} within {secs} s; it may be overloaded or stuck: see \
         `agent-relay status` and the relay's log (AGENT_RELAY_REQUEST_TIMEOUT, in seconds, \
         sets this limit){after}"
    )]
    Timeout {
        /// What was asked (`the query`, `the send`, `the subscription`).
        what: &'static str,
        /// The deadline, in seconds.
        secs: u64,
        /// What became of the request, when that matters (`; the message may still be
        /// stored`).
        after: &'static str,
    },
    /// The connection dropped before an answer came (queries are not retried).
    #[error("the connection to the relay was lost")]
    Disconnected,
    /// The client was closed.
    #[error("the client is closed")]
    Closed,
    /// The daemon sent something this client cannot use.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// Socket I/O failed.
    #[error("i/o error talking to the relay: {0}")]
    Io(#[from] std::io::Error),
}

/// How to connect.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The daemon's socket.
    pub socket: PathBuf,
    /// Agent (or tool) name.
    pub name: String,
    /// CLI name reported in HELLO.
    pub cli: Option<String>,
    /// Agent (routable) or client (send and query only).
    pub role: Role,
    /// Unacknowledged DELIVERs accepted at once.
    pub max_inflight: u32,
    /// Whether DELIVERs are acknowledged explicitly with [`Client::ack`]. When false the
    /// daemon treats a written DELIVER as acknowledged.
    pub ack: bool,
    /// Keep reconnecting after the connection drops.
    pub reconnect: bool,
    /// Topic patterns subscribed on every (re)connection.
    pub topics: Vec<String>,
    /// Drop re-deliveries of a `(from, id)` already handed over (on by default). Off, every
    /// DELIVER on the wire becomes an event: the bench uses that to count duplicates honestly.
    pub dedupe: bool,
    /// How long a query, a subscription or [`Client::send`] waits for the relay's answer
    /// before it fails with [`ClientError::Timeout`]: default 30 s, or
    /// `AGENT_RELAY_REQUEST_TIMEOUT` seconds. A `watch` is a stream and has none.
    pub request_timeout: Duration,
}

/// The request deadline when `AGENT_RELAY_REQUEST_TIMEOUT` does not set one.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The request deadline: `AGENT_RELAY_REQUEST_TIMEOUT` (whole seconds, at least 1) when it is
/// set to one, else [`DEFAULT_REQUEST_TIMEOUT`]. A value that is not a number is logged and
/// the default used.
pub fn request_timeout_from_env() -> Duration {
    match std::env::var("AGENT_RELAY_REQUEST_TIMEOUT") {
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(secs) => Duration::from_secs(secs.max(1)),
            Err(_) => {
                tracing::warn!(
                    value = %relay_protocol::text::one_line(&v, 40),
                    "AGENT_RELAY_REQUEST_TIMEOUT is not a number of seconds; using 30"
                );
                DEFAULT_REQUEST_TIMEOUT
            }
        },
        Err(_) => DEFAULT_REQUEST_TIMEOUT,
    }
}

impl ClientConfig {
    /// An agent connection named `name` on `socket`, with reconnection on.
    pub fn agent(socket: impl Into<PathBuf>, name: impl Into<String>) -> Self {
        Self {
            socket: socket.into(),
            name: name.into(),
            cli: None,
            role: Role::Agent,
            max_inflight: 256,
            ack: true,
            reconnect: true,
            topics: Vec::new(),
            dedupe: true,
            request_timeout: request_timeout_from_env(),
        }
    }

    /// A one-shot tool connection (send and query), without reconnection.
    pub fn tool(socket: impl Into<PathBuf>, name: impl Into<String>) -> Self {
        Self {
            role: Role::Client,
            reconnect: false,
            ..Self::agent(socket, name)
        }
    }
}

/// A message to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Outgoing {
    /// Message id; a ULID is chosen when `None`. Re-using an id makes the SEND a duplicate.
    pub id: Option<String>,
    /// Recipient name or `*`.
    pub to: Option<String>,
    /// Topic.
    pub topic: Option<String>,
    /// Payload.
    pub payload: Send,
}

impl Outgoing {
    /// A plain message to `to` (`*` for everyone).
    pub fn new(to: impl Into<String>, body: impl Into<String>) -> Self {
        Self {
            id: None,
            to: Some(to.into()),
            topic: None,
            payload: Send {
                kind: Kind::Message,
                body: body.into(),
                data: None,
                thread: None,
                in_reply_to: None,
                budget: None,
                urgent: false,
                origin: None,
            },
        }
    }
}

/// The daemon's answer to a SEND.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt {
    /// The message id.
    pub id: String,
    /// Accepted, queued or duplicate.
    pub status: AckStatus,
    /// Recipients it was stored for (absent for duplicates).
    pub recipients: Option<u32>,
    /// What the relay adds about it (the ACK's `reason`): for a recipient that has not
    /// connected yet, that the message waits for it.
    pub note: Option<String>,
}

/// A message delivered to this client.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivered {
    /// Message id (chosen by the sender).
    pub id: String,
    /// Sender.
    pub from: String,
    /// Recipient as addressed (`*` for broadcasts).
    pub to: String,
    /// Topic.
    pub topic: Option<String>,
    /// When the daemon stored it (Unix ms).
    pub ts: u64,
    /// Sequence number in this client's (topic, sender) stream.
    pub seq: u64,
    /// 1 for a first delivery.
    pub attempt: u32,
    /// Payload.
    pub payload: Send,
}

impl Delivered {
    /// The message a DELIVER carries: its envelope's id, sender, addressee, topic and time,
    /// its delivery header and payload.
    pub fn of_deliver(
        env: (String, String, Option<String>, Option<String>, u64),
        delivery: &relay_protocol::Delivery,
        payload: Send,
    ) -> Self {
        let (id, from, to, topic, ts) = env;
        Self {
            id,
            from,
            to: to.unwrap_or_default(),
            topic,
            ts,
            seq: delivery.seq,
            attempt: delivery.attempt,
            payload,
        }
    }

    /// The message as the relay's query records show it (`read`, `history`): what a door that
    /// hands it to a model shows (no store position or deliveries: it came on a connection).
    pub fn record(&self) -> relay_protocol::query::MessageRecord {
        relay_protocol::query::MessageRecord {
            pos: 0,
            id: self.id.clone(),
            ts: self.ts,
            from: self.from.clone(),
            to: self.to.clone(),
            topic: self.topic.clone(),
            kind: self.payload.kind,
            body: self.payload.body.clone(),
            data: self.payload.data.clone(),
            thread: self.payload.thread.clone(),
            in_reply_to: self.payload.in_reply_to.clone(),
            origin: self.payload.origin.clone(),
            deliveries: Vec::new(),
        }
    }
}

/// Something that happened on the connection.
#[derive(Debug, Clone, PartialEq)]
#[expect(
    clippy::large_enum_variant,
    reason = "Message is the common variant; boxing it would allocate per delivery"
)]
pub enum Event {
    /// A message arrived (first time for this `(from, id)`).
    Message(Delivered),
    /// (Re)connected.
    Connected {
        /// New session id.
        session_id: String,
        /// The resume token took over a lingering session.
        resumed: bool,
    },
    /// The connection dropped; with reconnection on, the client is retrying.
    Disconnected {
        /// Why.
        reason: String,
    },
    /// A recipient is far behind.
    Busy(Busy),
    /// The daemon reported an error.
    Error(ErrorPayload),
}

type Reply<T> = oneshot::Sender<Result<T, ClientError>>;

enum Cmd {
    /// A SEND, already encoded by the caller (so the driver only copies bytes).
    Send(Unsent),
    Query(Envelope, Reply<QueryResult>),
    Subscribe(Envelope, Reply<()>),
    Ack {
        from: String,
        id: String,
        seq: u64,
        state: Option<DeliveryState>,
        /// With a failed state: why.
        reason: Option<String>,
    },
    /// How the agent's terminal looks now (a wrapper's report, sent in PONGs).
    Terminal(TerminalReport),
    /// A NACK of a message delivered earlier: it failed after all, for `reason`.
    Fail {
        id: String,
        reason: String,
    },
    Close(oneshot::Sender<()>),
}

/// A SEND not yet acknowledged: kept, encoded, to be re-sent after a reconnect.
struct Unsent {
    id: String,
    frame: Vec<u8>,
    reply: Reply<Receipt>,
}

/// A SEND whose receipt has not arrived yet.
pub struct PendingReceipt(oneshot::Receiver<Result<Receipt, ClientError>>);

impl PendingReceipt {
    /// Waits for the daemon's ACK or NACK.
    ///
    /// # Errors
    /// [`ClientError::Rejected`] for a NACK, [`ClientError::Closed`] if the client went away.
    pub async fn wait(self) -> Result<Receipt, ClientError> {
        self.0.await.map_err(|_| ClientError::Closed)?
    }
}

/// The events of a [`Client`], taken with [`Client::take_events`].
pub struct Events(mpsc::Receiver<Event>);

impl Events {
    /// The next event; `None` once the client has stopped for good.
    pub async fn next(&mut self) -> Option<Event> {
        self.0.recv().await
    }
}

/// A connected client. Dropping it closes the connection (without BYE); prefer
/// [`Client::close`].
pub struct Client {
    cmds: mpsc::Sender<Cmd>,
    events: mpsc::Receiver<Event>,
    session_id: String,
    request_timeout: Duration,
}

fn new_id() -> String {
    ulid::Ulid::new().to_string()
}

impl Client {
    /// Connects and completes the handshake.
    ///
    /// # Errors
    /// [`ClientError::NotRunning`] when no daemon listens; [`ClientError::Refused`] when the
    /// daemon refuses the HELLO (name in use, invalid name).
    pub async fn connect(mut cfg: ClientConfig) -> Result<Self, ClientError> {
        // A process that restarts under its old name can get here before the daemon has
        // seen its previous connection close: give the name a moment to come free.
        let deadline = tokio::time::Instant::now() + NAME_RELEASE_WAIT;
        let (conn, welcome) = loop {
            match handshake(&cfg, None).await {
                Err(ClientError::Refused {
                    code: ErrorCode::NameInUse,
                    ..
                }) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                other => break other?,
            }
        };
        let (cmds_tx, cmds_rx) = mpsc::channel(1024);
        let (events_tx, events_rx) = mpsc::channel(1024);
        let session_id = welcome.session_id.clone();
        let request_timeout = cfg.request_timeout;
        // Subscribed below, on this first connection too (the driver keeps them for the next
        // ones as each subscription is made).
        let topics = std::mem::take(&mut cfg.topics);
        let driver = Driver {
            cfg,
            cmds: cmds_rx,
            events: events_tx,
            outbox: VecDeque::new(),
            queries: HashMap::new(),
            parts: HashMap::new(),
            subs: HashMap::new(),
            seen: Dedupe::new(DEDUPE_CAPACITY),
            unacked: VecDeque::new(),
            ack_due: None,
            terminal: None,
            resume_token: Some(welcome.resume_token.clone()),
            heartbeat: Duration::from_millis(welcome.server.heartbeat_ms.max(100)),
            missed: 0,
        };
        tokio::spawn(driver.run(conn, welcome));
        let client = Self {
            cmds: cmds_tx,
            events: events_rx,
            session_id,
            request_timeout,
        };
        for t in topics {
            client.subscribe(t).await?;
        }
        Ok(client)
    }

    /// The session id of the first connection.
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// Queues a SEND and returns at once; await the receipt with [`PendingReceipt::wait`].
    /// With reconnection on, an unacknowledged SEND is re-sent after a reconnect.
    ///
    /// # Errors
    /// [`ClientError::Rejected`] for an id the relay would refuse; [`ClientError::Closed`] if
    /// the client is closed.
    pub async fn send_nowait(
        &self,
        msg: Outgoing,
    ) -> Result<(String, PendingReceipt), ClientError> {
        let id = msg.id.unwrap_or_else(new_id);
        // The relay refuses such an id with a NACK that cannot name it (it echoes a cleaned
        // copy): refused here, so the caller is answered instead of waiting for ever.
        if let Err(e) = relay_protocol::validate_message_id(&id) {
            return Err(ClientError::Rejected {
                code: NackCode::Invalid,
                reason: e.to_string(),
            });
        }
        let mut env = Envelope::new(id.clone(), now_ms(), Payload::Send(msg.payload));
        env.to = msg.to;
        env.topic = msg.topic;
        // Encoded here, in the caller's task: the driver stays a thin I/O loop.
        let mut frame = Vec::with_capacity(256);
        encode_frame(&env, &mut frame, MAX_FRAME_BYTES)
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let (tx, rx) = oneshot::channel();
        self.cmds
            .send(Cmd::Send(Unsent {
                id: id.clone(),
                frame,
                reply: tx,
            }))
            .await
            .map_err(|_| ClientError::Closed)?;
        Ok((id, PendingReceipt(rx)))
    }

    /// Sends and waits for the receipt.
    ///
    /// # Errors
    /// [`ClientError::Rejected`] for a NACK; [`ClientError::Closed`].
    pub async fn send(&self, msg: Outgoing) -> Result<Receipt, ClientError> {
        let pending = self.send_nowait(msg).await?.1;
        self.deadline(
            "the send",
            "; the message may still be stored: see `agent-relay history`",
            pending.wait(),
        )
        .await?
    }

    /// Waits for `answer` up to [`ClientConfig::request_timeout`].
    async fn deadline<T>(
        &self,
        what: &'static str,
        after: &'static str,
        answer: impl Future<Output = T>,
    ) -> Result<T, ClientError> {
        tokio::time::timeout(self.request_timeout, answer)
            .await
            .map_err(|_| ClientError::Timeout {
                what,
                secs: self.request_timeout.as_secs(),
                after,
            })
    }

    /// Asks the daemon a read-only question.
    ///
    /// # Errors
    /// [`ClientError::Query`] when the daemon cannot answer; [`ClientError::Disconnected`];
    /// [`ClientError::Timeout`] when it does not answer within the deadline.
    pub async fn query(&self, req: QueryRequest) -> Result<QueryResult, ClientError> {
        let env = Envelope::new(new_id(), now_ms(), Payload::Query(req));
        let (tx, rx) = oneshot::channel();
        self.cmds
            .send(Cmd::Query(env, tx))
            .await
            .map_err(|_| ClientError::Closed)?;
        let answer = self.deadline("the query", "", rx).await?;
        match answer.map_err(|_| ClientError::Closed)?? {
            QueryResult::Error { code, message } => Err(ClientError::Query { code, message }),
            other => Ok(other),
        }
    }

    /// Asks the daemon as [`Client::query`] does, but returns once the question is handed to
    /// the connection: the answer is the returned future's (with the same deadline), which
    /// does not borrow the client (a loop that owns it goes on meanwhile).
    ///
    /// # Errors
    /// [`ClientError::Closed`] when the client is gone; the future's as [`Client::query`].
    pub async fn query_nowait(
        &self,
        req: QueryRequest,
    ) -> Result<
        impl Future<Output = Result<QueryResult, ClientError>> + std::marker::Send + 'static,
        ClientError,
    > {
        let env = Envelope::new(new_id(), now_ms(), Payload::Query(req));
        let (tx, rx) = oneshot::channel();
        self.cmds
            .send(Cmd::Query(env, tx))
            .await
            .map_err(|_| ClientError::Closed)?;
        let limit = self.request_timeout;
        Ok(async move {
            let answer =
                tokio::time::timeout(limit, rx)
                    .await
                    .map_err(|_| ClientError::Timeout {
                        what: "the query",
                        secs: limit.as_secs(),
                        after: "",
                    })?;
            match answer.map_err(|_| ClientError::Closed)?? {
                QueryResult::Error { code, message } => Err(ClientError::Query { code, message }),
                other => Ok(other),
            }
        })
    }

    /// Subscribes to a topic pattern (kept across reconnections).
    ///
    /// # Errors
    /// [`ClientError::Rejected`] for an invalid pattern.
    pub async fn subscribe(&self, pattern: impl Into<String>) -> Result<(), ClientError> {
        let mut env = Envelope::new(
            new_id(),
            now_ms(),
            Payload::Subscribe(SubscribePayload::default()),
        );
        env.topic = Some(pattern.into());
        let (tx, rx) = oneshot::channel();
        self.cmds
            .send(Cmd::Subscribe(env, tx))
            .await
            .map_err(|_| ClientError::Closed)?;
        self.deadline("the subscription", "", rx)
            .await?
            .map_err(|_| ClientError::Closed)?
    }

    /// Acknowledges a delivered message (after handing it to the agent). `state` may report it
    /// verified or failed.
    ///
    /// # Errors
    /// [`ClientError::Closed`].
    pub async fn ack(
        &self,
        msg: &Delivered,
        state: Option<DeliveryState>,
    ) -> Result<(), ClientError> {
        self.cmds
            .send(Cmd::Ack {
                from: msg.from.clone(),
                id: msg.id.clone(),
                seq: msg.seq,
                state,
                reason: None,
            })
            .await
            .map_err(|_| ClientError::Closed)
    }

    /// Acknowledges a delivered message as verified because a door showed it to the agent's
    /// model whole (a tool's result, a hook's output), saying which door: the daemon records
    /// `door` in the message's trace.
    ///
    /// # Errors
    /// [`ClientError::Closed`].
    pub async fn ack_shown(&self, msg: &Delivered, door: &str) -> Result<(), ClientError> {
        self.cmds
            .send(Cmd::Ack {
                from: msg.from.clone(),
                id: msg.id.clone(),
                seq: msg.seq,
                state: Some(DeliveryState::Verified),
                reason: Some(door.to_owned()),
            })
            .await
            .map_err(|_| ClientError::Closed)
    }

    /// Acknowledges a delivered message as failed, saying why: it could not be handed to the
    /// agent. The daemon dead-letters it with `reason` and tells its sender (like
    /// [`Client::ack`] with a failed state, which gives no reason).
    ///
    /// # Errors
    /// [`ClientError::Closed`].
    pub async fn ack_failed(&self, msg: &Delivered, reason: &str) -> Result<(), ClientError> {
        self.cmds
            .send(Cmd::Ack {
                from: msg.from.clone(),
                id: msg.id.clone(),
                seq: msg.seq,
                state: Some(DeliveryState::Failed),
                reason: Some(reason.to_owned()),
            })
            .await
            .map_err(|_| ClientError::Closed)
    }

    /// Reports a message delivered (and acknowledged) earlier as failed after all, with why:
    /// a NACK. The daemon dead-letters it with `reason` and tells its sender. Nothing is kept
    /// across a reconnection: a caller that must know it took asks (a `trace` of `id`, say)
    /// afterwards on this client, whose answer comes after the failure is stored.
    ///
    /// # Errors
    /// [`ClientError::Closed`].
    pub async fn fail(&self, id: &str, reason: &str) -> Result<(), ClientError> {
        self.cmds
            .send(Cmd::Fail {
                id: id.to_owned(),
                reason: reason.to_owned(),
            })
            .await
            .map_err(|_| ClientError::Closed)
    }

    /// Tells the daemon how the agent's terminal looks (a wrapper's view: idle, busy or
    /// blocked, and why). Sent at once in an unasked PONG, and again in every PONG, so a
    /// daemon connected later learns it too. Call it only when the report changes.
    ///
    /// # Errors
    /// [`ClientError::Closed`].
    pub async fn report_terminal(&self, report: TerminalReport) -> Result<(), ClientError> {
        self.cmds
            .send(Cmd::Terminal(report))
            .await
            .map_err(|_| ClientError::Closed)
    }

    /// The next event; `None` once the client has stopped for good.
    pub async fn next_event(&mut self) -> Option<Event> {
        self.events.recv().await
    }

    /// Hands the events over to their own reader, so that one task takes deliveries while
    /// others send and query through a shared `&Client` (the MCP server does). Events must
    /// still be read: the connection waits while 1024 are unread. After this,
    /// [`Client::next_event`] returns `None`.
    pub fn take_events(&mut self) -> Events {
        Events(std::mem::replace(&mut self.events, mpsc::channel(1).1))
    }

    /// Says BYE and closes. Unacknowledged SENDs are abandoned (their receipts fail).
    pub async fn close(self) {
        let (tx, rx) = oneshot::channel();
        if self.cmds.send(Cmd::Close(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }
}

/// A bounded memory of recently delivered `(from, id)` pairs, and whether the application
/// has acknowledged each.
struct Dedupe {
    seen: HashMap<(String, String), bool>,
    order: VecDeque<(String, String)>,
    cap: usize,
}

/// What the dedupe memory says about an arriving DELIVER.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    /// First time: hand it to the application.
    New,
    /// Handed over before and acknowledged by the application: acknowledge the replay.
    Acked,
    /// Handed over before, not yet acknowledged: the application's ACK will cover it.
    Pending,
}

impl Dedupe {
    fn new(cap: usize) -> Self {
        Self {
            seen: HashMap::new(),
            order: VecDeque::new(),
            cap,
        }
    }

    /// Classifies a delivery, remembering it when new.
    fn arrive(&mut self, from: &str, id: &str) -> Seen {
        let key = (from.to_owned(), id.to_owned());
        match self.seen.get(&key) {
            Some(true) => return Seen::Acked,
            Some(false) => return Seen::Pending,
            None => {}
        }
        if self.order.len() == self.cap
            && let Some(old) = self.order.pop_front()
        {
            self.seen.remove(&old);
        }
        self.seen.insert(key.clone(), false);
        self.order.push_back(key);
        Seen::New
    }

    /// The application acknowledged `(from, id)`.
    fn acked(&mut self, from: &str, id: &str) {
        if let Some(flag) = self.seen.get_mut(&(from.to_owned(), id.to_owned())) {
            *flag = true;
        }
    }
}

/// One delivery on the current connection, in arrival order, for cumulative acknowledgement.
struct Unacked {
    id: String,
    seq: u64,
    state: AckState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AckState {
    /// The application has not acknowledged it yet.
    Waiting,
    /// Acknowledged by the application, not yet reported to the daemon.
    Acked,
    /// Already reported to the daemon with its own ACK.
    Reported,
}

struct Conn {
    stream: UnixStream,
    buf: BytesMut,
}

async fn write_env(stream: &mut UnixStream, env: &Envelope) -> Result<(), ClientError> {
    let mut out = Vec::with_capacity(256);
    encode_frame(env, &mut out, MAX_FRAME_BYTES)
        .map_err(|e| ClientError::Protocol(e.to_string()))?;
    stream.write_all(&out).await?;
    Ok(())
}

/// Reads one envelope; `Ok(None)` at end of stream.
async fn read_env(conn: &mut Conn) -> Result<Option<Envelope>, ClientError> {
    loop {
        if let Some(n) = frame_len(&conn.buf, MAX_FRAME_BYTES)
            .map_err(|e| ClientError::Protocol(e.to_string()))?
        {
            let parsed = Envelope::from_json(&conn.buf[4..n]);
            conn.buf.advance(n);
            return parsed
                .map(Some)
                .map_err(|e| ClientError::Protocol(e.to_string()));
        }
        if conn.stream.read_buf(&mut conn.buf).await? == 0 {
            return Ok(None);
        }
    }
}

/// Connects to the relay's socket and checks, before a byte is written, that the process
/// listening is this user's: in a shared directory (`/tmp`) another user could have put a
/// socket of theirs at the path first.
///
/// # Errors
/// [`ClientError::NotRunning`] when nothing listens, [`ClientError::ForeignDaemon`] when
/// another user does.
pub async fn connect_socket(socket: &Path) -> Result<UnixStream, ClientError> {
    let stream = UnixStream::connect(socket)
        .await
        .map_err(|source| ClientError::NotRunning {
            socket: socket.to_path_buf(),
            source,
        })?;
    let uid = stream.peer_cred()?.uid();
    if uid != rustix::process::getuid().as_raw() {
        return Err(ClientError::ForeignDaemon {
            socket: socket.to_path_buf(),
            uid,
        });
    }
    Ok(stream)
}

async fn handshake(
    cfg: &ClientConfig,
    resume_token: Option<String>,
) -> Result<(Conn, relay_protocol::Welcome), ClientError> {
    let stream = connect_socket(&cfg.socket).await?;
    let mut conn = Conn {
        stream,
        buf: BytesMut::with_capacity(16 * 1024),
    };
    let hello = Hello {
        agent: cfg.name.clone(),
        cli: cfg.cli.clone(),
        capabilities: Capabilities {
            ack: cfg.ack,
            resume: true,
            max_inflight: cfg.max_inflight,
            supports_topics: true,
        },
        resume_token,
        role: cfg.role,
    };
    let sent = write_env(
        &mut conn.stream,
        &Envelope::new(new_id(), now_ms(), Payload::Hello(hello)),
    )
    .await;
    if let Err(e) = sent {
        // A daemon that refuses us (another user's relay, too many connections) writes its
        // ERROR and closes, possibly before our HELLO is through: read what it said.
        return match tokio::time::timeout(Duration::from_secs(2), read_env(&mut conn)).await {
            Ok(Ok(Some(Envelope {
                payload: Payload::Error(err),
                ..
            }))) => Err(ClientError::Refused {
                code: err.code,
                message: err.message,
            }),
            _ => Err(e),
        };
    }
    let answer = tokio::time::timeout(Duration::from_secs(10), read_env(&mut conn))
        .await
        .map_err(|_| ClientError::Refused {
            code: ErrorCode::Other,
            message: "no WELCOME within 10 s".into(),
        })??;
    match answer.map(|e| e.payload) {
        Some(Payload::Welcome(w)) => Ok((conn, w)),
        Some(Payload::Error(e)) => Err(ClientError::Refused {
            code: e.code,
            message: e.message,
        }),
        Some(other) => Err(ClientError::Protocol(format!(
            "expected WELCOME, got {}",
            other.message_type().as_str()
        ))),
        None => Err(ClientError::Refused {
            code: ErrorCode::Other,
            message: "the relay closed the connection during the handshake".into(),
        }),
    }
}

/// The background task that owns the connection.
struct Driver {
    cfg: ClientConfig,
    cmds: mpsc::Receiver<Cmd>,
    events: mpsc::Sender<Event>,
    /// Unacknowledged SENDs in send order, re-sent after a reconnect.
    outbox: VecDeque<Unsent>,
    queries: HashMap<String, Reply<QueryResult>>,
    /// Answers arriving in parts, by query id, until their last part.
    parts: HashMap<String, relay_protocol::parts::Joiner>,
    subs: HashMap<String, Reply<()>>,
    seen: Dedupe,
    /// Deliveries on the current connection in arrival order, until acknowledged.
    unacked: VecDeque<Unacked>,
    /// The last of an acknowledged prefix of `unacked`, to report with one cumulative ACK.
    ack_due: Option<(String, u64)>,
    resume_token: Option<String>,
    heartbeat: Duration,
    /// The application's latest terminal report, carried in every PONG.
    terminal: Option<TerminalReport>,
    /// BUSY and ERROR events not handed to the application because its queue was full (each
    /// is logged instead; see [`Driver::notify`]).
    missed: u64,
}

/// Why a connection ended.
enum End {
    /// The application closed the client.
    Closed,
    /// The connection was lost.
    Lost(String),
}

impl Driver {
    /// Hands a BUSY or ERROR to the application without waiting: the driver must keep reading
    /// (a tool that never reads its events, like `agent-relay send`, would otherwise stall its
    /// own receipts once the queue filled). When the queue is full the event is not passed on,
    /// but never silently: it is counted in `missed` and logged with what it said.
    fn notify(&mut self, ev: Event) {
        match self.events.try_send(ev) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(ev)) => {
                self.missed += 1;
                tracing::warn!(
                    missed = self.missed,
                    event = %relay_protocol::text::one_line(&format!("{ev:?}"), 300),
                    "the application is not reading relay events (its queue is full): this \
                     BUSY/ERROR is logged here instead of being handed to it"
                );
            }
            Err(mpsc::error::TrySendError::Closed(ev)) => {
                // The application dropped its client; the driver is about to end.
                tracing::debug!(?ev, "relay event after the client was dropped");
            }
        }
    }

    async fn run(mut self, first: Conn, welcome: relay_protocol::Welcome) {
        let mut conn = first;
        let _ = self
            .events
            .send(Event::Connected {
                session_id: welcome.session_id,
                resumed: welcome.resumed,
            })
            .await;
        let mut backoff = Backoff::default();
        loop {
            match self.serve(&mut conn).await {
                End::Closed => return,
                End::Lost(reason) => {
                    tracing::debug!(%reason, "relay connection lost");
                    for (_, q) in self.queries.drain() {
                        let _ = q.send(Err(ClientError::Disconnected));
                    }
                    for (_, s) in self.subs.drain() {
                        let _ = s.send(Err(ClientError::Disconnected));
                    }
                    let _ = self.events.send(Event::Disconnected { reason }).await;
                    if !self.cfg.reconnect {
                        for u in self.outbox.drain(..) {
                            let _ = u.reply.send(Err(ClientError::Disconnected));
                        }
                        return;
                    }
                }
            }
            // Reconnect, still taking commands (SENDs wait in the outbox meanwhile).
            conn = loop {
                let delay = backoff.next_delay(rand::random::<f64>());
                let sleep = tokio::time::sleep(delay);
                tokio::pin!(sleep);
                loop {
                    tokio::select! {
                        () = &mut sleep => break,
                        cmd = self.cmds.recv() => match cmd {
                            None => return,
                            Some(Cmd::Close(done)) => { let _ = done.send(()); return; }
                            Some(cmd) => self.queue_offline(cmd),
                        },
                    }
                }
                match handshake(&self.cfg, self.resume_token.clone()).await {
                    Ok((mut c, w)) => {
                        backoff.reset();
                        self.resume_token = Some(w.resume_token.clone());
                        self.heartbeat = Duration::from_millis(w.server.heartbeat_ms.max(100));
                        if let Err(e) = self.replay(&mut c).await {
                            tracing::debug!(error = %e, "re-send after reconnect failed");
                            continue;
                        }
                        let _ = self
                            .events
                            .send(Event::Connected {
                                session_id: w.session_id,
                                resumed: w.resumed,
                            })
                            .await;
                        break c;
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, attempt = backoff.attempts(), "reconnect failed")
                    }
                }
            };
        }
    }

    /// Handles a command while disconnected.
    fn queue_offline(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Send(unsent) => self.outbox.push_back(unsent),
            Cmd::Query(_, reply) => {
                let _ = reply.send(Err(ClientError::Disconnected));
            }
            Cmd::Subscribe(env, reply) => {
                if let Some(t) = env.topic
                    && !self.cfg.topics.contains(&t)
                {
                    self.cfg.topics.push(t);
                }
                let _ = reply.send(Ok(()));
            }
            // The daemon will replay it: remember that the application is done with it, so
            // the replay is acknowledged instead of waiting for an ACK that already happened.
            Cmd::Ack { from, id, .. } => {
                if self.cfg.dedupe {
                    self.seen.acked(&from, &id);
                }
            }
            // Carried in the first PONG of the next connection.
            Cmd::Terminal(report) => self.terminal = Some(report),
            // Not kept: the caller checks that it took (see `Client::fail`).
            Cmd::Fail { id, .. } => {
                tracing::debug!(%id, "failure report not sent: disconnected");
            }
            Cmd::Close(_) => {}
        }
    }

    /// After a reconnect: re-subscribe, then re-send the outbox in order.
    async fn replay(&mut self, conn: &mut Conn) -> Result<(), ClientError> {
        // A new session: the daemon replays whatever the old one did not acknowledge.
        self.unacked.clear();
        self.ack_due = None;
        let mut out = Vec::new();
        for t in &self.cfg.topics {
            let mut env = Envelope::new(
                new_id(),
                now_ms(),
                Payload::Subscribe(SubscribePayload::default()),
            );
            env.topic = Some(t.clone());
            encode_frame(&env, &mut out, MAX_FRAME_BYTES)
                .map_err(|e| ClientError::Protocol(e.to_string()))?;
        }
        for u in &self.outbox {
            out.extend_from_slice(&u.frame);
        }
        // The new daemon (or session) learns how the terminal looks at once, not at its
        // first PING.
        if self.terminal.is_some() {
            self.pong(&mut out, None);
        }
        conn.stream.write_all(&out).await?;
        Ok(())
    }

    async fn serve(&mut self, conn: &mut Conn) -> End {
        let mut out: Vec<u8> = Vec::with_capacity(16 * 1024);
        let silence = self.heartbeat * 3;
        let mut deadline = tokio::time::Instant::now() + silence;
        loop {
            // Frames already buffered first.
            loop {
                match frame_len(&conn.buf, MAX_FRAME_BYTES) {
                    Ok(Some(n)) => {
                        deadline = tokio::time::Instant::now() + silence;
                        // Parse in place, then drop the frame: splitting it off would share
                        // the buffer and force a copy on the next read.
                        let parsed = Envelope::from_json(&conn.buf[4..n]);
                        conn.buf.advance(n);
                        match parsed {
                            Ok(env) => {
                                if let Err(reason) = self.on_frame(env, &mut out).await {
                                    return End::Lost(reason);
                                }
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "ignoring undecodable frame from relay")
                            }
                        }
                    }
                    Ok(None) => break,
                    Err(e) => return End::Lost(e.to_string()),
                }
            }
            self.flush_acks(&mut out);
            if !out.is_empty() {
                if let Err(e) = conn.stream.write_all(&out).await {
                    return End::Lost(e.to_string());
                }
                out.clear();
            }
            tokio::select! {
                r = conn.stream.read_buf(&mut conn.buf) => match r {
                    Ok(0) => return End::Lost("the relay closed the connection".into()),
                    Ok(_) => {}
                    Err(e) => return End::Lost(e.to_string()),
                },
                cmd = self.cmds.recv() => {
                    let Some(cmd) = cmd else {
                        self.bye(conn).await;
                        return End::Closed;
                    };
                    if let Cmd::Close(done) = cmd {
                        self.bye(conn).await;
                        let _ = done.send(());
                        return End::Closed;
                    }
                    self.on_cmd(cmd, &mut out);
                    // Batch whatever else is ready into the same write.
                    while out.len() < 64 * 1024 {
                        match self.cmds.try_recv() {
                            Ok(Cmd::Close(done)) => {
                                let _ = conn.stream.write_all(&out).await;
                                self.bye(conn).await;
                                let _ = done.send(());
                                return End::Closed;
                            }
                            Ok(cmd) => self.on_cmd(cmd, &mut out),
                            Err(_) => break,
                        }
                    }
                },
                () = tokio::time::sleep_until(deadline) => {
                    return End::Lost(format!("nothing from the relay for {} ms", silence.as_millis()));
                }
            }
        }
    }

    async fn bye(&mut self, conn: &mut Conn) {
        let bye = Envelope::new(
            new_id(),
            now_ms(),
            Payload::Bye(relay_protocol::Bye {
                reason: Some("client closed".into()),
            }),
        );
        // Acknowledgements still gathered go out first, or the daemon would replay those
        // messages to the next session.
        let mut out = Vec::new();
        self.flush_acks(&mut out);
        Self::encode(&mut out, &bye);
        let _ = conn.stream.write_all(&out).await;
        for u in self.outbox.drain(..) {
            let _ = u.reply.send(Err(ClientError::Closed));
        }
    }

    /// A PONG (`nonce` echoed when it answers a PING), carrying the application's terminal
    /// report when it gave one.
    fn pong(&self, out: &mut Vec<u8>, nonce: Option<String>) {
        let pong = Ping {
            nonce,
            terminal: self.terminal.clone(),
        };
        Self::encode(out, &Envelope::new(new_id(), now_ms(), Payload::Pong(pong)));
    }

    fn encode(out: &mut Vec<u8>, env: &Envelope) {
        if let Err(e) = encode_frame(env, out, MAX_FRAME_BYTES) {
            tracing::error!(error = %e, "cannot encode frame");
        }
    }

    fn on_cmd(&mut self, cmd: Cmd, out: &mut Vec<u8>) {
        match cmd {
            Cmd::Send(unsent) => {
                out.extend_from_slice(&unsent.frame);
                self.outbox.push_back(unsent);
            }
            Cmd::Query(env, reply) => {
                Self::encode(out, &env);
                // Questions whose askers gave up (their deadline passed) are forgotten.
                self.queries.retain(|_, r| !r.is_closed());
                let parts = &mut self.parts;
                parts.retain(|id, _| self.queries.contains_key(id));
                self.queries.insert(env.id.clone(), reply);
            }
            Cmd::Subscribe(env, reply) => {
                if let Some(t) = &env.topic
                    && !self.cfg.topics.contains(t)
                {
                    self.cfg.topics.push(t.clone());
                }
                Self::encode(out, &env);
                self.subs.insert(env.id.clone(), reply);
            }
            Cmd::Ack {
                from,
                id,
                seq,
                state,
                reason,
            } => self.on_app_ack(&from, id, seq, state, reason, out),
            Cmd::Terminal(report) => {
                self.terminal = Some(report);
                self.pong(out, None);
            }
            Cmd::Fail { id, reason } => {
                let nack = relay_protocol::Nack {
                    ack_id: id,
                    code: relay_protocol::NackCode::Other,
                    reason,
                };
                Self::encode(out, &Envelope::new(new_id(), now_ms(), Payload::Nack(nack)));
            }
            Cmd::Close(_) => {}
        }
    }

    /// Hands an answer to the query `id` waits for, if its asker still waits.
    fn answer(&mut self, id: &str, r: Result<QueryResult, ClientError>) {
        if let Some(q) = self.queries.remove(id)
            && q.send(r).is_err()
        {
            tracing::debug!(%id, "an answer came after its asker gave up");
        }
    }

    /// The application acknowledged a delivery. Acknowledgements of the oldest deliveries
    /// (the usual case) are gathered and reported with one cumulative ACK when the pending
    /// output is written; one out of order, or with an explicit state, is reported at once.
    fn on_app_ack(
        &mut self,
        from: &str,
        id: String,
        seq: u64,
        state: Option<DeliveryState>,
        reason: Option<String>,
        out: &mut Vec<u8>,
    ) {
        if self.cfg.dedupe {
            self.seen.acked(from, &id);
        }
        let at = self
            .unacked
            .iter()
            .position(|u| u.state == AckState::Waiting && u.id == id && u.seq == seq);
        if state.is_some() || at != Some(0) {
            let ack = Ack::of_delivery(id, seq, state, false, reason);
            Self::encode(out, &Envelope::new(new_id(), now_ms(), Payload::Ack(ack)));
            if let Some(u) = at.and_then(|i| self.unacked.get_mut(i)) {
                u.state = AckState::Reported;
            }
        } else if let Some(u) = self.unacked.front_mut() {
            u.state = AckState::Acked;
        }
        // Retire the acknowledged prefix; the newest unreported entry in it stands for all.
        while self
            .unacked
            .front()
            .is_some_and(|u| u.state != AckState::Waiting)
        {
            if let Some(u) = self.unacked.pop_front()
                && u.state == AckState::Acked
            {
                self.ack_due = Some((u.id, u.seq));
            }
        }
    }

    /// Adds the cumulative ACK for the acknowledged prefix, if one is due.
    fn flush_acks(&mut self, out: &mut Vec<u8>) {
        if let Some((id, seq)) = self.ack_due.take() {
            let ack = Ack::of_delivery(id, seq, None, true, None);
            Self::encode(out, &Envelope::new(new_id(), now_ms(), Payload::Ack(ack)));
        }
    }

    fn settle_send(&mut self, id: &str, result: Result<Receipt, ClientError>) {
        // Receipts come in send order: usually the oldest; otherwise search.
        let unsent = if self.outbox.front().is_some_and(|u| u.id == id) {
            self.outbox.pop_front()
        } else {
            self.outbox
                .iter()
                .position(|u| u.id == id)
                .and_then(|i| self.outbox.remove(i))
        };
        if let Some(u) = unsent {
            let _ = u.reply.send(result);
        }
    }

    /// Handles one frame from the daemon; `Err` ends the connection.
    async fn on_frame(&mut self, env: Envelope, out: &mut Vec<u8>) -> Result<(), String> {
        match env.payload {
            Payload::Ack(ack) => {
                if let Some(s) = self.subs.remove(&ack.ack_id) {
                    let _ = s.send(Ok(()));
                } else {
                    let receipt = Receipt {
                        id: ack.ack_id.clone(),
                        status: ack.status.unwrap_or(AckStatus::Accepted),
                        recipients: ack.recipients,
                        note: ack.reason,
                    };
                    self.settle_send(&ack.ack_id, Ok(receipt));
                }
            }
            Payload::Nack(nack) => {
                let err = ClientError::Rejected {
                    code: nack.code,
                    reason: nack.reason,
                };
                if let Some(s) = self.subs.remove(&nack.ack_id) {
                    let _ = s.send(Err(err));
                } else {
                    self.settle_send(&nack.ack_id, Err(err));
                }
            }
            Payload::Deliver(payload) => {
                let from = env.from.unwrap_or_default();
                let delivery = env.delivery.unwrap_or(relay_protocol::Delivery {
                    seq: 0,
                    session_id: String::new(),
                    attempt: 1,
                });
                let seen = if self.cfg.dedupe {
                    self.seen.arrive(&from, &env.id)
                } else {
                    Seen::New
                };
                match seen {
                    Seen::Acked => {
                        // A replay of something the application already acknowledged (the
                        // ACK was lost with the connection): acknowledge it again.
                        let ack = Ack {
                            ack_id: env.id,
                            seq: Some(delivery.seq),
                            status: None,
                            recipients: None,
                            state: None,
                            cumulative: false,
                            reason: None,
                        };
                        Self::encode(out, &Envelope::new(new_id(), now_ms(), Payload::Ack(ack)));
                        return Ok(());
                    }
                    Seen::Pending => {
                        // Handed over, not yet acknowledged: do not surface it twice, and do
                        // not acknowledge it for the application either (if it crashed before
                        // handling it, the daemon must still have it). Its ACK will come.
                        self.unacked.push_back(Unacked {
                            id: env.id,
                            seq: delivery.seq,
                            state: AckState::Waiting,
                        });
                        return Ok(());
                    }
                    Seen::New => {}
                }
                self.unacked.push_back(Unacked {
                    id: env.id.clone(),
                    seq: delivery.seq,
                    state: AckState::Waiting,
                });
                let msg = Delivered::of_deliver(
                    (env.id, from, env.to, env.topic, env.ts),
                    &delivery,
                    payload,
                );
                if self.events.send(Event::Message(msg)).await.is_err() {
                    return Err("client dropped".into());
                }
            }
            Payload::Ping(p) => self.pong(out, p.nonce),
            Payload::Result(QueryResult::Part { part, parts, data }) => {
                let joined = self
                    .parts
                    .entry(env.id.clone())
                    .or_default()
                    .push(part, parts, &data);
                match joined {
                    Ok(None) => {}
                    Ok(Some(r)) => {
                        self.parts.remove(&env.id);
                        self.answer(&env.id, Ok(r));
                    }
                    Err(e) => {
                        self.parts.remove(&env.id);
                        self.answer(&env.id, Err(ClientError::Protocol(e)));
                    }
                }
            }
            Payload::Result(r) => self.answer(&env.id, Ok(r)),
            Payload::Busy(b) => self.notify(Event::Busy(b)),
            Payload::Error(e) => {
                let fatal = e.fatal;
                let message = e.message.clone();
                self.notify(Event::Error(e));
                if fatal {
                    return Err(message);
                }
            }
            Payload::Bye(b) => {
                return Err(b.reason.unwrap_or_else(|| "the relay said goodbye".into()));
            }
            Payload::Pong(_) => {}
            other => tracing::debug!(
                ty = other.message_type().as_str(),
                "unexpected frame from relay"
            ),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dedupe_remembers_whether_the_application_acknowledged() {
        let mut d = Dedupe::new(2);
        assert_eq!(d.arrive("A", "1"), Seen::New);
        assert_eq!(d.arrive("A", "1"), Seen::Pending);
        d.acked("A", "1");
        assert_eq!(d.arrive("A", "1"), Seen::Acked);
        assert_eq!(d.arrive("B", "1"), Seen::New, "keyed by sender too");
        // Bounded: the oldest is forgotten.
        assert_eq!(d.arrive("C", "1"), Seen::New);
        assert_eq!(d.arrive("A", "1"), Seen::New);
    }

    fn driver() -> Driver {
        let (_tx, cmds) = mpsc::channel(1);
        let (events, _rx) = mpsc::channel(1);
        Driver {
            cfg: ClientConfig::agent("/nowhere", "T"),
            cmds,
            events,
            outbox: VecDeque::new(),
            queries: HashMap::new(),
            parts: HashMap::new(),
            subs: HashMap::new(),
            seen: Dedupe::new(16),
            unacked: (1..=4)
                .map(|i| Unacked {
                    id: format!("m{i}"),
                    seq: i,
                    state: AckState::Waiting,
                })
                .collect(),
            ack_due: None,
            terminal: None,
            resume_token: None,
            heartbeat: Duration::from_secs(5),
            missed: 0,
        }
    }

    fn acks(out: &[u8]) -> Vec<(String, bool)> {
        let mut buf = BytesMut::from(out);
        let mut v = Vec::new();
        while let Some(n) = frame_len(&buf, MAX_FRAME_BYTES).unwrap() {
            if let Payload::Ack(a) = Envelope::from_json(&buf[4..n]).unwrap().payload {
                v.push((a.ack_id, a.cumulative));
            }
            buf.advance(n);
        }
        v
    }

    #[test]
    fn in_order_acknowledgements_become_one_cumulative_ack() {
        let mut d = driver();
        let mut out = Vec::new();
        for i in 1..=3 {
            d.on_app_ack("A", format!("m{i}"), i, None, None, &mut out);
        }
        assert!(out.is_empty(), "nothing written until the batch is flushed");
        d.flush_acks(&mut out);
        assert_eq!(acks(&out), vec![("m3".to_owned(), true)]);
        assert_eq!(d.unacked.len(), 1);
    }

    #[test]
    fn out_of_order_and_explicit_states_are_reported_at_once() {
        let mut d = driver();
        let mut out = Vec::new();
        d.on_app_ack("A", "m3".into(), 3, None, None, &mut out);
        d.on_app_ack(
            "A",
            "m2".into(),
            2,
            Some(DeliveryState::Failed),
            Some("stuck in the input line".into()),
            &mut out,
        );
        assert_eq!(
            acks(&out),
            vec![("m3".to_owned(), false), ("m2".to_owned(), false)]
        );
        // The failure goes with its reason.
        let mut buf = BytesMut::from(&out[..]);
        let mut reasons = Vec::new();
        while let Some(n) = frame_len(&buf, MAX_FRAME_BYTES).unwrap() {
            if let Payload::Ack(a) = Envelope::from_json(&buf[4..n]).unwrap().payload {
                reasons.push((a.state, a.reason));
            }
            buf.advance(n);
        }
        assert_eq!(
            reasons,
            vec![
                (None, None),
                (
                    Some(DeliveryState::Failed),
                    Some("stuck in the input line".to_owned())
                )
            ]
        );
        out.clear();
        // m1 completes the prefix m1..m3: one cumulative ACK names m1, the newest entry of
        // the prefix not already reported; m2 and m3 were reported on their own.
        d.on_app_ack("A", "m1".into(), 1, None, None, &mut out);
        d.flush_acks(&mut out);
        assert_eq!(acks(&out), vec![("m1".to_owned(), true)]);
        assert_eq!(
            d.unacked.iter().map(|u| u.id.as_str()).collect::<Vec<_>>(),
            ["m4"]
        );
    }

    #[test]
    fn an_acknowledgement_made_while_reconnecting_is_remembered() {
        let mut d = driver();
        assert_eq!(d.seen.arrive("A", "m1"), Seen::New);
        d.queue_offline(Cmd::Ack {
            from: "A".into(),
            id: "m1".into(),
            seq: 1,
            state: None,
            reason: None,
        });
        // The replay after the reconnect is acknowledged, not left waiting for an ACK that
        // already happened (which would stall every later cumulative ACK).
        assert_eq!(d.seen.arrive("A", "m1"), Seen::Acked);
    }

    /// A BUSY or ERROR that finds the application's queue full is counted and logged, never
    /// dropped unseen, and a fatal ERROR still ends the connection.
    #[tokio::test]
    async fn busy_and_errors_that_find_the_queue_full_are_counted_not_lost_silently() {
        let mut d = driver();
        let (events, mut rx) = mpsc::channel(1);
        d.events = events;
        let busy = |n| {
            Envelope::new(
                format!("b{n}"),
                1,
                Payload::Busy(Busy {
                    retry_after_ms: 100,
                    target: Some("Bob".into()),
                    pending: n,
                }),
            )
        };
        let error = |fatal| {
            Envelope::new(
                "e",
                1,
                Payload::Error(ErrorPayload {
                    code: ErrorCode::BadPayload,
                    message: "nope".into(),
                    fatal,
                }),
            )
        };
        let mut out = Vec::new();
        d.on_frame(busy(1), &mut out).await.unwrap();
        d.on_frame(busy(2), &mut out).await.unwrap();
        d.on_frame(error(false), &mut out).await.unwrap();
        assert_eq!(d.missed, 2, "the two that found the queue full");
        assert!(matches!(rx.recv().await, Some(Event::Busy(b)) if b.pending == 1));
        d.on_frame(busy(3), &mut out).await.unwrap();
        assert!(matches!(rx.recv().await, Some(Event::Busy(b)) if b.pending == 3));
        assert_eq!(d.missed, 2);
        assert!(d.on_frame(error(true), &mut out).await.is_err());
    }

    #[test]
    fn an_unknown_acknowledgement_is_sent_plainly() {
        let mut d = driver();
        let mut out = Vec::new();
        d.on_app_ack("A", "elsewhere".into(), 9, None, None, &mut out);
        assert_eq!(acks(&out), vec![("elsewhere".to_owned(), false)]);
        assert_eq!(d.unacked.len(), 4);
    }
}
