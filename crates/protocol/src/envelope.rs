//! The envelope and its typed payloads.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::query::{QueryRequest, QueryResult};

/// The protocol version this crate speaks (`v` in every envelope).
pub const PROTOCOL_VERSION: u32 = 1;

/// The `type` of an envelope: the 13 types of protocol v1 plus the `QUERY`/`RESULT` extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageType {
    /// Client → daemon: identify and start a session.
    Hello,
    /// Daemon → client: the session is active.
    Welcome,
    /// Client → daemon: a message for another agent, everyone (`*`) or a topic.
    Send,
    /// Daemon → client: a message from another agent.
    Deliver,
    /// Both: positive acknowledgement.
    Ack,
    /// Both: negative acknowledgement.
    Nack,
    /// Heartbeat request (either side may send it).
    Ping,
    /// Heartbeat answer.
    Pong,
    /// Daemon → client: a protocol error.
    Error,
    /// Daemon → client: backpressure signal.
    Busy,
    /// Client → daemon: subscribe to a topic pattern.
    Subscribe,
    /// Client → daemon: unsubscribe from a topic pattern.
    Unsubscribe,
    /// Both: graceful disconnect.
    Bye,
    /// Extension, client → daemon: a read-only query (status, agents, history, read).
    Query,
    /// Extension, daemon → client: the answer to a `QUERY`.
    Result,
}

impl MessageType {
    /// The wire spelling of this type.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hello => "HELLO",
            Self::Welcome => "WELCOME",
            Self::Send => "SEND",
            Self::Deliver => "DELIVER",
            Self::Ack => "ACK",
            Self::Nack => "NACK",
            Self::Ping => "PING",
            Self::Pong => "PONG",
            Self::Error => "ERROR",
            Self::Busy => "BUSY",
            Self::Subscribe => "SUBSCRIBE",
            Self::Unsubscribe => "UNSUBSCRIBE",
            Self::Bye => "BYE",
            Self::Query => "QUERY",
            Self::Result => "RESULT",
        }
    }

    /// Parses the wire spelling; `None` for a type this crate does not know.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "HELLO" => Self::Hello,
            "WELCOME" => Self::Welcome,
            "SEND" => Self::Send,
            "DELIVER" => Self::Deliver,
            "ACK" => Self::Ack,
            "NACK" => Self::Nack,
            "PING" => Self::Ping,
            "PONG" => Self::Pong,
            "ERROR" => Self::Error,
            "BUSY" => Self::Busy,
            "SUBSCRIBE" => Self::Subscribe,
            "UNSUBSCRIBE" => Self::Unsubscribe,
            "BYE" => Self::Bye,
            "QUERY" => Self::Query,
            "RESULT" => Self::Result,
            _ => return None,
        })
    }
}

/// What a connection is for. Agents are registered, routable and receive broadcasts; clients
/// (the `send`, `read`, `status`... commands) only send and query. Extension field; v1 peers are
/// agents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A routable agent (the default).
    #[default]
    Agent,
    /// A short-lived tool connection: can send and query, is never a recipient.
    Client,
    /// A federation link (issue 28.8): one connection that speaks for several names, the
    /// agents of one other node. Each name is taken by a further HELLO on the connection
    /// (answered by a WELCOME naming it in `agent`, or a NACK of that HELLO's id), and every
    /// SEND, ACK, NACK, SUBSCRIBE or BYE after names the one it is for in the envelope's
    /// `from`. Only the relay's own process may open one (its peer credentials): a local
    /// client cannot claim to speak for several names.
    Link,
}

/// What a client says it can do (HELLO `capabilities`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    /// The client acknowledges each DELIVER. When false the daemon treats a DELIVER written to
    /// the socket as acknowledged.
    #[serde(default = "yes")]
    pub ack: bool,
    /// The client understands resume tokens.
    #[serde(default)]
    pub resume: bool,
    /// How many unacknowledged DELIVERs the client accepts at once.
    #[serde(default = "default_inflight")]
    pub max_inflight: u32,
    /// The client may SUBSCRIBE to topics.
    #[serde(default)]
    pub supports_topics: bool,
}

fn yes() -> bool {
    true
}

fn default_inflight() -> u32 {
    256
}

impl Default for Capabilities {
    fn default() -> Self {
        Self {
            ack: true,
            resume: true,
            max_inflight: default_inflight(),
            supports_topics: true,
        }
    }
}

/// HELLO payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// The agent's name, validated by [`crate::validate_agent_name`].
    pub agent: String,
    /// Which CLI the agent is (`claude`, `codex`, ...), informational.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cli: Option<String>,
    /// What the client can do.
    #[serde(default)]
    pub capabilities: Capabilities,
    /// Extension: a token from an earlier WELCOME; lets this connection take over a live session
    /// with the same name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_token: Option<String>,
    /// Extension: agent (default) or client.
    #[serde(default)]
    pub role: Role,
}

/// Limits the server announces in WELCOME.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerInfo {
    /// The largest frame the daemon accepts.
    pub max_frame_bytes: u32,
    /// How often the daemon sends PING.
    pub heartbeat_ms: u64,
}

/// WELCOME payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    /// This session's id.
    pub session_id: String,
    /// Present this in a later HELLO to take over this name while the old connection lingers.
    pub resume_token: String,
    /// Server limits.
    pub server: ServerInfo,
    /// Extension: true when the HELLO's resume token took over an existing session.
    #[serde(default)]
    pub resumed: bool,
    /// Extension: on a link connection ([`Role::Link`]), the name this session is for (each
    /// name it speaks for has a session of its own; its DELIVERs carry that `session_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
}

/// The semantic kind of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// General communication (default).
    #[default]
    Message,
    /// A request to do something.
    Action,
    /// A status update.
    State,
    /// Shared reasoning.
    Thinking,
}

impl Kind {
    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Message => "message",
            Self::Action => "action",
            Self::State => "state",
            Self::Thinking => "thinking",
        }
    }

    /// Parses the wire spelling.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "message" => Self::Message,
            "action" => Self::Action,
            "state" => Self::State,
            "thinking" => Self::Thinking,
            _ => return None,
        })
    }
}

/// Loop-control budget carried with a message (extension).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budget {
    /// Hops taken so far in this thread.
    pub hops: u32,
    /// Hops allowed in this thread.
    pub max_hops: u32,
    /// Unix ms after which an undelivered message expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
}

/// SEND (and DELIVER) payload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Send {
    /// What kind of message this is.
    #[serde(default)]
    pub kind: Kind,
    /// The text.
    pub body: String,
    /// Structured data attached by the sender, stored and passed on untouched. A JSON `null`
    /// means no data, and is never written.
    #[serde(default, skip_serializing_if = "no_data")]
    pub data: Option<serde_json::Value>,
    /// Extension: conversation thread id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread: Option<String>,
    /// Extension: the message id this answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_reply_to: Option<String>,
    /// Extension: loop-control budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
    /// Extension: the sender marked this urgent; a recipient's wrapper types it before the
    /// other messages waiting for that terminal.
    #[serde(default, skip_serializing_if = "is_false")]
    pub urgent: bool,
    /// Extension: the node of a federation the message came from (`up --cluster`). Set by the
    /// relay that stores it, and only on a message a stand-in of that node sent; whatever a
    /// sender writes here is replaced (a local sender's message has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
}

/// Delivery metadata on a DELIVER envelope (extension, top level like the seed's example).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    /// Sequence number in the recipient's (topic, sender) stream: 1, 2, 3... without gaps.
    pub seq: u64,
    /// The recipient's session.
    pub session_id: String,
    /// 1 for the first delivery, more when replayed after a reconnect or restart.
    #[serde(default = "one")]
    pub attempt: u32,
}

fn no_data(d: &Option<serde_json::Value>) -> bool {
    matches!(d, None | Some(serde_json::Value::Null))
}

fn one() -> u32 {
    1
}

/// ACK status, daemon → sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AckStatus {
    /// Stored; at least one recipient is online and will get it now.
    Accepted,
    /// This (from, id) was stored before; nothing new was stored or delivered.
    Duplicate,
    /// Stored; every recipient is offline and will get it when it connects.
    Queued,
}

/// Delivery state a recipient reports in its ACK (extension).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeliveryState {
    /// Received and handed to the agent (typed into its terminal).
    Injected,
    /// Seen on the agent's screen after injection.
    Verified,
    /// Could not be handed to the agent.
    Failed,
}

/// ACK payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    /// The id of the envelope acknowledged.
    pub ack_id: String,
    /// Recipient → daemon: the DELIVER's seq.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// Daemon → sender: what happened to the SEND.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<AckStatus>,
    /// Daemon → sender: how many recipients the message was stored for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recipients: Option<u32>,
    /// Recipient → daemon: injected (default), verified or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<DeliveryState>,
    /// Extension, recipient → daemon: this acknowledges every DELIVER received on this
    /// connection up to and including `ack_id`, so a burst of acknowledgements takes one frame.
    #[serde(default, skip_serializing_if = "is_false")]
    pub cumulative: bool,
    /// Extension, recipient → daemon, with `state: failed`: why the message could not be
    /// handed to the agent (kept as the dead letter's reason, told to its sender).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Ack {
    /// A recipient's acknowledgement of the DELIVER `ack_id` (its `seq`), with a state and a
    /// reason if any; `cumulative`: of every DELIVER before it on the session too.
    pub fn of_delivery(
        ack_id: String,
        seq: u64,
        state: Option<DeliveryState>,
        cumulative: bool,
        reason: Option<String>,
    ) -> Self {
        Self {
            ack_id,
            seq: Some(seq),
            status: None,
            recipients: None,
            state,
            cumulative,
            reason,
        }
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// Why a SEND was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NackCode {
    /// No agent of that name has ever connected.
    UnknownTarget,
    /// The body or frame exceeds the limit.
    TooLarge,
    /// The connection has not completed its handshake.
    NotActive,
    /// The SEND is malformed (no target, bad topic, bad payload).
    Invalid,
    /// An access rule forbids it.
    Forbidden,
    /// The sender is over its rate limit.
    RateLimited,
    /// The thread's hop budget is spent.
    BudgetExceeded,
    /// The daemon could not store it; retry later.
    Unavailable,
    /// A code this version does not know.
    #[serde(other)]
    Other,
}

/// NACK payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Nack {
    /// The id of the envelope refused.
    pub ack_id: String,
    /// Machine-readable reason.
    pub code: NackCode,
    /// Human-readable reason, saying what to do.
    pub reason: String,
}

/// PING / PONG payload.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Ping {
    /// Echoed back in the PONG.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonce: Option<String>,
    /// Extension, in a PONG from a wrapper: how its agent's terminal looks. A wrapper also
    /// sends an unasked PONG when this changes, so the daemon learns at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminal: Option<TerminalReport>,
}

/// How a wrapped agent's terminal looks to its wrapper (extension, carried in PONG).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TerminalReport {
    /// `pty` or `tmux`.
    pub backend: String,
    /// What the wrapper sees.
    pub state: TerminalState,
    /// Why, for `busy` and `blocked` (a busy marker, a dialog, a person's line...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// A wrapped agent's terminal, as its wrapper sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TerminalState {
    /// Quiet, and nothing waits to be typed (or it could be typed now).
    Idle,
    /// Printing, or showing that it works (a spinner, a busy marker).
    Busy,
    /// Messages wait and cannot be typed: a dialog or menu is open, a person has a line half
    /// written, or the agent's input line is not on screen.
    Blocked,
}

impl TerminalState {
    /// Lower-case name, as in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::Busy => "busy",
            Self::Blocked => "blocked",
        }
    }
}

/// ERROR codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The frame's length exceeds the limit.
    FrameTooLarge,
    /// The frame is not UTF-8 JSON or not an envelope.
    BadFrame,
    /// Unsupported `v`.
    BadVersion,
    /// A `type` the daemon does not know (not fatal).
    UnknownType,
    /// A payload that does not fit its type.
    BadPayload,
    /// A frame that is not allowed in this connection state (e.g. before HELLO).
    BadState,
    /// The agent name is invalid.
    BadName,
    /// The agent name is held by another live connection.
    NameInUse,
    /// No PONG arrived in time.
    HeartbeatTimeout,
    /// The connection does not read its frames fast enough.
    SlowConsumer,
    /// The peer's uid differs from the daemon's.
    Forbidden,
    /// The daemon is shutting down.
    ShuttingDown,
    /// Something failed inside the daemon.
    Internal,
    /// A code this version does not know.
    #[serde(other)]
    Other,
}

/// ERROR payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorPayload {
    /// Machine-readable code.
    pub code: ErrorCode,
    /// Human-readable message.
    pub message: String,
    /// The daemon closes the connection after a fatal error.
    #[serde(default)]
    pub fatal: bool,
}

/// BUSY payload: a recipient is far behind; slow down.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Busy {
    /// Suggested wait before sending more to that recipient.
    pub retry_after_ms: u64,
    /// The recipient that is behind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Messages stored for it and not yet acknowledged.
    #[serde(default)]
    pub pending: u64,
}

/// SUBSCRIBE / UNSUBSCRIBE payload. The pattern may also be given as the envelope's `topic`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SubscribePayload {
    /// Topic pattern; `*` matches one segment and `>` the rest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
}

/// BYE payload.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Bye {
    /// Why the peer is leaving.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A typed payload; the variant always matches the envelope's [`MessageType`].
#[derive(Debug, Clone, PartialEq)]
pub enum Payload {
    /// HELLO.
    Hello(Hello),
    /// WELCOME.
    Welcome(Welcome),
    /// SEND.
    Send(Send),
    /// DELIVER (same payload as SEND).
    Deliver(Send),
    /// ACK.
    Ack(Ack),
    /// NACK.
    Nack(Nack),
    /// PING.
    Ping(Ping),
    /// PONG.
    Pong(Ping),
    /// ERROR.
    Error(ErrorPayload),
    /// BUSY.
    Busy(Busy),
    /// SUBSCRIBE.
    Subscribe(SubscribePayload),
    /// UNSUBSCRIBE.
    Unsubscribe(SubscribePayload),
    /// BYE.
    Bye(Bye),
    /// QUERY (extension).
    Query(QueryRequest),
    /// RESULT (extension).
    Result(QueryResult),
}

impl Payload {
    /// The message type this payload belongs to.
    pub fn message_type(&self) -> MessageType {
        match self {
            Self::Hello(_) => MessageType::Hello,
            Self::Welcome(_) => MessageType::Welcome,
            Self::Send(_) => MessageType::Send,
            Self::Deliver(_) => MessageType::Deliver,
            Self::Ack(_) => MessageType::Ack,
            Self::Nack(_) => MessageType::Nack,
            Self::Ping(_) => MessageType::Ping,
            Self::Pong(_) => MessageType::Pong,
            Self::Error(_) => MessageType::Error,
            Self::Busy(_) => MessageType::Busy,
            Self::Subscribe(_) => MessageType::Subscribe,
            Self::Unsubscribe(_) => MessageType::Unsubscribe,
            Self::Bye(_) => MessageType::Bye,
            Self::Query(_) => MessageType::Query,
            Self::Result(_) => MessageType::Result,
        }
    }
}

/// One protocol message.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope {
    /// Protocol version, [`PROTOCOL_VERSION`].
    pub v: u32,
    /// Chosen by the sender; for SEND it is the message id (idempotent per sender).
    pub id: String,
    /// Unix time in milliseconds, set by whoever wrote the envelope.
    pub ts: u64,
    /// Sender name. Set by the daemon on DELIVER; ignored by the daemon when a client sets it.
    pub from: Option<String>,
    /// Recipient name, or `*` for everyone.
    pub to: Option<String>,
    /// Topic (SEND/DELIVER) or topic pattern (SUBSCRIBE/UNSUBSCRIBE).
    pub topic: Option<String>,
    /// Delivery metadata (DELIVER only).
    pub delivery: Option<Delivery>,
    /// The typed payload.
    pub payload: Payload,
}

/// Why a frame's bytes are not a usable envelope.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// Not JSON, not UTF-8, or missing `v`/`type`/`id`/`ts`. The stream cannot be trusted.
    #[error("frame is not a valid envelope: {0}")]
    BadFrame(String),
    /// `v` is not 1.
    #[error("unsupported protocol version {0} (this daemon speaks v1)")]
    BadVersion(u64),
    /// A well-formed envelope of a type we do not know; answer and carry on.
    #[error("unknown message type {ty:?}")]
    UnknownType {
        /// The envelope id, to reference in the answer.
        id: String,
        /// The type as sent.
        ty: String,
    },
    /// A known type whose payload does not fit; answer and carry on.
    #[error("bad {ty} payload: {reason}")]
    BadPayload {
        /// The envelope id.
        id: String,
        /// The type.
        ty: &'static str,
        /// What serde said.
        reason: String,
    },
}

impl DecodeError {
    /// Whether the connection must be closed after this error.
    pub fn is_fatal(&self) -> bool {
        matches!(self, Self::BadFrame(_) | Self::BadVersion(_))
    }
}

#[derive(Deserialize)]
struct WireIn<'a> {
    v: u64,
    #[serde(rename = "type", borrow)]
    ty: std::borrow::Cow<'a, str>,
    id: String,
    ts: u64,
    #[serde(default)]
    from: Option<String>,
    #[serde(default)]
    to: Option<String>,
    #[serde(default)]
    topic: Option<String>,
    #[serde(default)]
    delivery: Option<Delivery>,
    #[serde(default, borrow)]
    payload: Option<&'a RawValue>,
}

/// Borrowed envelope fields, for writing a frame without building an [`Envelope`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Header<'a> {
    /// Envelope id.
    pub id: &'a str,
    /// Unix ms.
    pub ts: u64,
    /// Sender.
    pub from: Option<&'a str>,
    /// Recipient.
    pub to: Option<&'a str>,
    /// Topic.
    pub topic: Option<&'a str>,
    /// `(seq, session_id, attempt)` for DELIVER.
    pub delivery: Option<(u64, &'a str, u32)>,
}

#[derive(Serialize)]
struct DeliveryOut<'a> {
    seq: u64,
    session_id: &'a str,
    attempt: u32,
}

fn write_parts<W: std::io::Write, P: Serialize + ?Sized>(
    out: W,
    ty: MessageType,
    h: &Header<'_>,
    payload: &P,
) -> Result<(), serde_json::Error> {
    serde_json::to_writer(
        out,
        &WireOut {
            v: PROTOCOL_VERSION,
            ty: ty.as_str(),
            id: h.id,
            ts: h.ts,
            from: h.from,
            to: h.to,
            topic: h.topic,
            delivery: h.delivery.map(|(seq, session_id, attempt)| DeliveryOut {
                seq,
                session_id,
                attempt,
            }),
            payload,
        },
    )
}

impl Payload {
    /// Writes a whole envelope carrying this payload, with the fields in `header`.
    ///
    /// # Errors
    /// Only if `out` fails.
    pub fn write_json<W: std::io::Write>(
        &self,
        out: W,
        header: &Header<'_>,
    ) -> Result<(), serde_json::Error> {
        let ty = self.message_type();
        match self {
            Payload::Hello(p) => write_parts(out, ty, header, p),
            Payload::Welcome(p) => write_parts(out, ty, header, p),
            Payload::Send(p) | Payload::Deliver(p) => write_parts(out, ty, header, p),
            Payload::Ack(p) => write_parts(out, ty, header, p),
            Payload::Nack(p) => write_parts(out, ty, header, p),
            Payload::Ping(p) | Payload::Pong(p) => write_parts(out, ty, header, p),
            Payload::Error(p) => write_parts(out, ty, header, p),
            Payload::Busy(p) => write_parts(out, ty, header, p),
            Payload::Subscribe(p) | Payload::Unsubscribe(p) => write_parts(out, ty, header, p),
            Payload::Bye(p) => write_parts(out, ty, header, p),
            Payload::Query(p) => write_parts(out, ty, header, p),
            Payload::Result(p) => write_parts(out, ty, header, p),
        }
    }
}

#[derive(Serialize)]
struct WireOut<'a, P: Serialize + ?Sized> {
    v: u32,
    #[serde(rename = "type")]
    ty: &'static str,
    id: &'a str,
    ts: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    from: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    to: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    topic: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    delivery: Option<DeliveryOut<'a>>,
    payload: &'a P,
}

/// Deepest nesting of arrays and objects a frame may have, in any field (known or not).
pub const MAX_JSON_DEPTH: usize = 128;

/// True if `bytes` nest arrays/objects deeper than `max`. A byte scan that skips strings: it
/// runs before parsing, so it only has to be right for valid JSON (invalid JSON fails later).
fn too_deep(bytes: &[u8], max: usize) -> bool {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &b in bytes {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

fn parse_payload<'a, T: Deserialize<'a> + Default>(
    raw: Option<&'a RawValue>,
) -> Result<T, serde_json::Error> {
    match raw {
        Some(r) if r.get() != "null" => serde_json::from_str(r.get()),
        _ => Ok(T::default()),
    }
}

fn parse_required<'a, T: Deserialize<'a>>(
    raw: Option<&'a RawValue>,
) -> Result<T, serde_json::Error> {
    match raw {
        Some(r) => serde_json::from_str(r.get()),
        None => serde_json::from_str("{}"),
    }
}

impl Envelope {
    /// A new envelope of version 1 with no routing fields.
    pub fn new(id: impl Into<String>, ts: u64, payload: Payload) -> Self {
        Self {
            v: PROTOCOL_VERSION,
            id: id.into(),
            ts,
            from: None,
            to: None,
            topic: None,
            delivery: None,
            payload,
        }
    }

    /// The envelope's type.
    pub fn message_type(&self) -> MessageType {
        self.payload.message_type()
    }

    /// Parses the JSON of one frame.
    ///
    /// # Errors
    /// [`DecodeError`]; [`DecodeError::is_fatal`] says whether the stream can still be trusted.
    pub fn from_json(bytes: &[u8]) -> Result<Self, DecodeError> {
        Self::from_json_with_payload(bytes).map(|(env, _)| env)
    }

    /// Like [`Envelope::from_json`], and also returns the payload's JSON text exactly as it
    /// was received (validated by the typed parse). A relay can forward that text instead of
    /// serializing the payload again.
    ///
    /// # Errors
    /// As [`Envelope::from_json`].
    pub fn from_json_with_payload(bytes: &[u8]) -> Result<(Self, Option<&RawValue>), DecodeError> {
        // serde_json limits nesting for what it parses into types, but skips unknown fields
        // and captures the raw payload without a limit: check the whole frame first.
        if too_deep(bytes, MAX_JSON_DEPTH) {
            return Err(DecodeError::BadFrame(format!(
                "JSON nested deeper than {MAX_JSON_DEPTH} levels"
            )));
        }
        let wire: WireIn<'_> =
            serde_json::from_slice(bytes).map_err(|e| DecodeError::BadFrame(e.to_string()))?;
        if wire.v != u64::from(PROTOCOL_VERSION) {
            return Err(DecodeError::BadVersion(wire.v));
        }
        let Some(ty) = MessageType::parse(&wire.ty) else {
            return Err(DecodeError::UnknownType {
                id: wire.id,
                ty: wire.ty.into_owned(),
            });
        };
        let raw = wire.payload;
        let payload = match ty {
            MessageType::Hello => parse_required(raw).map(Payload::Hello),
            MessageType::Welcome => parse_required(raw).map(Payload::Welcome),
            MessageType::Send => parse_required(raw).map(Payload::Send),
            MessageType::Deliver => parse_required(raw).map(Payload::Deliver),
            MessageType::Ack => parse_required(raw).map(Payload::Ack),
            MessageType::Nack => parse_required(raw).map(Payload::Nack),
            MessageType::Ping => parse_payload(raw).map(Payload::Ping),
            MessageType::Pong => parse_payload(raw).map(Payload::Pong),
            MessageType::Error => parse_required(raw).map(Payload::Error),
            MessageType::Busy => parse_required(raw).map(Payload::Busy),
            MessageType::Subscribe => parse_payload(raw).map(Payload::Subscribe),
            MessageType::Unsubscribe => parse_payload(raw).map(Payload::Unsubscribe),
            MessageType::Bye => parse_payload(raw).map(Payload::Bye),
            MessageType::Query => parse_required(raw).map(Payload::Query),
            MessageType::Result => parse_required(raw).map(Payload::Result),
        }
        .map_err(|e| DecodeError::BadPayload {
            id: wire.id.clone(),
            ty: ty.as_str(),
            reason: e.to_string(),
        })?;
        Ok((
            Self {
                v: PROTOCOL_VERSION,
                id: wire.id,
                ts: wire.ts,
                from: wire.from,
                to: wire.to,
                topic: wire.topic,
                delivery: wire.delivery,
                payload,
            },
            raw,
        ))
    }

    /// Serializes the envelope to JSON, appending to `out`.
    ///
    /// # Errors
    /// Only if `out` fails.
    pub fn write_json<W: std::io::Write>(&self, out: W) -> Result<(), serde_json::Error> {
        let delivery = self
            .delivery
            .as_ref()
            .map(|d| (d.seq, d.session_id.as_str(), d.attempt));
        let header = Header {
            id: &self.id,
            ts: self.ts,
            from: self.from.as_deref(),
            to: self.to.as_deref(),
            topic: self.topic.as_deref(),
            delivery,
        };
        self.payload.write_json(out, &header)
    }

    /// Writes a DELIVER envelope from borrowed parts: the daemon's hot path, which shares one
    /// stored message among recipients and must not clone its body per delivery.
    ///
    /// # Errors
    /// Only if `out` fails.
    pub fn write_deliver_json<W: std::io::Write, P: Serialize + ?Sized>(
        out: W,
        header: &Header<'_>,
        payload: &P,
    ) -> Result<(), serde_json::Error> {
        write_parts(out, MessageType::Deliver, header, payload)
    }

    /// Serializes the envelope to a JSON string (for logs and tests).
    pub fn to_json_string(&self) -> String {
        let mut out = Vec::with_capacity(256);
        // Serializing our own types into a Vec cannot fail.
        let _ = self.write_json(&mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nesting_is_limited_in_unknown_fields_and_not_fooled_by_strings() {
        let deep = |n: usize| format!("{}1{}", "[".repeat(n), "]".repeat(n));
        let frame = |extra: &str| {
            format!(r#"{{"v":1,"type":"PING","id":"p","ts":1,"x":{extra},"payload":{{}}}}"#)
        };
        let bad = frame(&deep(500));
        let err = Envelope::from_json_with_payload(bad.as_bytes());
        assert!(matches!(err, Err(DecodeError::BadFrame(_))), "{err:?}");
        // Depth at the limit is fine (the envelope object itself is one level).
        let ok = frame(&deep(MAX_JSON_DEPTH - 1));
        assert!(Envelope::from_json_with_payload(ok.as_bytes()).is_ok());
        // Brackets inside strings (with escaped quotes) do not count.
        let s = format!(r#""\"{}""#, "[".repeat(500));
        assert!(Envelope::from_json_with_payload(frame(&s).as_bytes()).is_ok());
    }

    #[test]
    fn v1_hello_from_seed_parses() {
        let json = br#"{"v":1,"type":"HELLO","id":"abc","ts":1234,"payload":{"agent":"Alice","cli":"claude","capabilities":{"ack":true,"resume":true,"max_inflight":256,"supports_topics":true}}}"#;
        let env = Envelope::from_json(json).unwrap();
        let Payload::Hello(h) = env.payload else {
            panic!("not hello")
        };
        assert_eq!(h.agent, "Alice");
        assert_eq!(h.capabilities.max_inflight, 256);
        assert_eq!(h.role, Role::Agent);
    }

    #[test]
    fn unknown_fields_are_ignored_and_unknown_type_is_not_fatal() {
        let env = Envelope::from_json(
            br#"{"v":1,"type":"PING","id":"p","ts":1,"extra":5,"payload":{"nonce":"x","more":1}}"#,
        )
        .unwrap();
        assert_eq!(
            env.payload,
            Payload::Ping(Ping {
                nonce: Some("x".into()),
                terminal: None,
            })
        );
        let err = Envelope::from_json(br#"{"v":1,"type":"WHAT","id":"w","ts":1,"payload":{}}"#)
            .unwrap_err();
        assert!(!err.is_fatal());
        assert!(matches!(err, DecodeError::UnknownType { ref id, .. } if id == "w"));
    }

    #[test]
    fn bad_frames_are_fatal() {
        for bad in [
            &b"not json"[..],
            br#"{"v":1}"#,
            br#"{"v":2,"type":"PING","id":"a","ts":1}"#,
        ] {
            assert!(Envelope::from_json(bad).unwrap_err().is_fatal(), "{bad:?}");
        }
    }

    #[test]
    fn bad_payload_is_reported_with_id() {
        let err = Envelope::from_json(
            br#"{"v":1,"type":"SEND","id":"s1","ts":1,"to":"Bob","payload":{"kind":"nope","body":"x"}}"#,
        )
        .unwrap_err();
        assert!(matches!(err, DecodeError::BadPayload { ref id, ty: "SEND", .. } if id == "s1"));
        assert!(!err.is_fatal());
    }

    #[test]
    fn deliver_round_trips_with_delivery_block() {
        let mut env = Envelope::new(
            "01J",
            5,
            Payload::Deliver(Send {
                origin: None,
                kind: Kind::Action,
                body: "hi \u{1b}[31m".into(),
                data: Some(serde_json::json!({"a": [1, 2]})),
                thread: Some("t".into()),
                in_reply_to: None,
                budget: Some(Budget {
                    hops: 1,
                    max_hops: 10,
                    expires_at: Some(9),
                }),
                urgent: true,
            }),
        );
        env.from = Some("Alice".into());
        env.to = Some("Bob".into());
        env.delivery = Some(Delivery {
            seq: 3,
            session_id: "s".into(),
            attempt: 2,
        });
        let json = env.to_json_string();
        assert!(json.contains(r#""type":"DELIVER""#));
        assert_eq!(Envelope::from_json(json.as_bytes()).unwrap(), env);
    }
}
