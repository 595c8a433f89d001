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

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use relay_protocol::query::{QueryRequest, QueryResult};
use relay_protocol::{
    Ack, AckStatus, Busy, Capabilities, DeliveryState, Envelope, ErrorPayload, Hello, Kind,
    MAX_FRAME_BYTES, NackCode, Payload, Ping, Role, Send, SubscribePayload, encode_frame,
    frame_len,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};

pub use backoff::Backoff;

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
    /// The daemon refused the handshake.
    #[error("the relay refused the connection: {0}")]
    Refused(String),
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
    Send(Envelope, Reply<Receipt>),
    Query(Envelope, Reply<QueryResult>),
    Subscribe(Envelope, Reply<()>),
    Ack {
        id: String,
        seq: u64,
        state: Option<DeliveryState>,
    },
    Close(oneshot::Sender<()>),
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

/// A connected client. Dropping it closes the connection (without BYE); prefer
/// [`Client::close`].
pub struct Client {
    cmds: mpsc::Sender<Cmd>,
    events: mpsc::Receiver<Event>,
    session_id: String,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
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
    pub async fn connect(cfg: ClientConfig) -> Result<Self, ClientError> {
        let (conn, welcome) = handshake(&cfg, None).await?;
        let (cmds_tx, cmds_rx) = mpsc::channel(1024);
        let (events_tx, events_rx) = mpsc::channel(1024);
        let session_id = welcome.session_id.clone();
        let driver = Driver {
            cfg,
            cmds: cmds_rx,
            events: events_tx,
            outbox: VecDeque::new(),
            waiting_sends: HashMap::new(),
            queries: HashMap::new(),
            subs: HashMap::new(),
            seen: Dedupe::new(DEDUPE_CAPACITY),
            resume_token: Some(welcome.resume_token.clone()),
            heartbeat: Duration::from_millis(welcome.server.heartbeat_ms.max(100)),
        };
        tokio::spawn(driver.run(conn, welcome));
        Ok(Self {
            cmds: cmds_tx,
            events: events_rx,
            session_id,
        })
    }

    /// The session id of the first connection.
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// Queues a SEND and returns at once; await the receipt with [`PendingReceipt::wait`].
    /// With reconnection on, an unacknowledged SEND is re-sent after a reconnect.
    ///
    /// # Errors
    /// [`ClientError::Closed`] if the client is closed.
    pub async fn send_nowait(
        &self,
        msg: Outgoing,
    ) -> Result<(String, PendingReceipt), ClientError> {
        let id = msg.id.unwrap_or_else(new_id);
        let mut env = Envelope::new(id.clone(), now_ms(), Payload::Send(msg.payload));
        env.to = msg.to;
        env.topic = msg.topic;
        let (tx, rx) = oneshot::channel();
        self.cmds
            .send(Cmd::Send(env, tx))
            .await
            .map_err(|_| ClientError::Closed)?;
        Ok((id, PendingReceipt(rx)))
    }

    /// Sends and waits for the receipt.
    ///
    /// # Errors
    /// [`ClientError::Rejected`] for a NACK; [`ClientError::Closed`].
    pub async fn send(&self, msg: Outgoing) -> Result<Receipt, ClientError> {
        self.send_nowait(msg).await?.1.wait().await
    }

    /// Asks the daemon a read-only question.
    ///
    /// # Errors
    /// [`ClientError::Query`] when the daemon cannot answer; [`ClientError::Disconnected`].
    pub async fn query(&self, req: QueryRequest) -> Result<QueryResult, ClientError> {
        let env = Envelope::new(new_id(), now_ms(), Payload::Query(req));
        let (tx, rx) = oneshot::channel();
        self.cmds
            .send(Cmd::Query(env, tx))
            .await
            .map_err(|_| ClientError::Closed)?;
        match rx.await.map_err(|_| ClientError::Closed)?? {
            QueryResult::Error { code, message } => Err(ClientError::Query { code, message }),
            other => Ok(other),
        }
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
        rx.await.map_err(|_| ClientError::Closed)?
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
                id: msg.id.clone(),
                seq: msg.seq,
                state,
            })
            .await
            .map_err(|_| ClientError::Closed)
    }

    /// The next event; `None` once the client has stopped for good.
    pub async fn next_event(&mut self) -> Option<Event> {
        self.events.recv().await
    }

    /// Says BYE and closes. Unacknowledged SENDs are abandoned (their receipts fail).
    pub async fn close(self) {
        let (tx, rx) = oneshot::channel();
        if self.cmds.send(Cmd::Close(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }
}

/// A bounded memory of recently delivered `(from, id)` pairs.
struct Dedupe {
    set: HashSet<(String, String)>,
    order: VecDeque<(String, String)>,
    cap: usize,
}

impl Dedupe {
    fn new(cap: usize) -> Self {
        Self {
            set: HashSet::new(),
            order: VecDeque::new(),
            cap,
        }
    }

    /// True when the pair is new (and remembers it).
    fn insert(&mut self, from: &str, id: &str) -> bool {
        let key = (from.to_owned(), id.to_owned());
        if self.set.contains(&key) {
            return false;
        }
        if self.order.len() == self.cap
            && let Some(old) = self.order.pop_front()
        {
            self.set.remove(&old);
        }
        self.set.insert(key.clone());
        self.order.push_back(key);
        true
    }
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

async fn handshake(
    cfg: &ClientConfig,
    resume_token: Option<String>,
) -> Result<(Conn, relay_protocol::Welcome), ClientError> {
    let stream =
        UnixStream::connect(&cfg.socket)
            .await
            .map_err(|source| ClientError::NotRunning {
                socket: cfg.socket.clone(),
                source,
            })?;
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
    write_env(
        &mut conn.stream,
        &Envelope::new(new_id(), now_ms(), Payload::Hello(hello)),
    )
    .await?;
    let answer = tokio::time::timeout(Duration::from_secs(10), read_env(&mut conn))
        .await
        .map_err(|_| ClientError::Refused("no WELCOME within 10 s".into()))??;
    match answer.map(|e| e.payload) {
        Some(Payload::Welcome(w)) => Ok((conn, w)),
        Some(Payload::Error(e)) => Err(ClientError::Refused(e.message)),
        Some(other) => Err(ClientError::Protocol(format!(
            "expected WELCOME, got {}",
            other.message_type().as_str()
        ))),
        None => Err(ClientError::Refused(
            "the relay closed the connection during the handshake".into(),
        )),
    }
}

/// The background task that owns the connection.
struct Driver {
    cfg: ClientConfig,
    cmds: mpsc::Receiver<Cmd>,
    events: mpsc::Sender<Event>,
    /// Unacknowledged SENDs in send order, re-sent after a reconnect.
    outbox: VecDeque<Envelope>,
    waiting_sends: HashMap<String, Reply<Receipt>>,
    queries: HashMap<String, Reply<QueryResult>>,
    subs: HashMap<String, Reply<()>>,
    seen: Dedupe,
    resume_token: Option<String>,
    heartbeat: Duration,
}

/// Why a connection ended.
enum End {
    /// The application closed the client.
    Closed,
    /// The connection was lost.
    Lost(String),
}

impl Driver {
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
                        for (_, s) in self.waiting_sends.drain() {
                            let _ = s.send(Err(ClientError::Disconnected));
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
            Cmd::Send(env, reply) => {
                self.waiting_sends.insert(env.id.clone(), reply);
                self.outbox.push_back(env);
            }
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
            // The daemon replays unacknowledged messages; the dedupe set drops the copy and
            // acknowledges it then.
            Cmd::Ack { .. } | Cmd::Close(_) => {}
        }
    }

    /// After a reconnect: re-subscribe, then re-send the outbox in order.
    async fn replay(&mut self, conn: &mut Conn) -> Result<(), ClientError> {
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
        for env in &self.outbox {
            encode_frame(env, &mut out, MAX_FRAME_BYTES)
                .map_err(|e| ClientError::Protocol(e.to_string()))?;
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
        let _ = write_env(&mut conn.stream, &bye).await;
        for (_, s) in self.waiting_sends.drain() {
            let _ = s.send(Err(ClientError::Closed));
        }
    }

    fn encode(out: &mut Vec<u8>, env: &Envelope) {
        if let Err(e) = encode_frame(env, out, MAX_FRAME_BYTES) {
            tracing::error!(error = %e, "cannot encode frame");
        }
    }

    fn on_cmd(&mut self, cmd: Cmd, out: &mut Vec<u8>) {
        match cmd {
            Cmd::Send(env, reply) => {
                Self::encode(out, &env);
                self.waiting_sends.insert(env.id.clone(), reply);
                self.outbox.push_back(env);
            }
            Cmd::Query(env, reply) => {
                Self::encode(out, &env);
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
            Cmd::Ack { id, seq, state } => {
                let ack = Ack {
                    ack_id: id,
                    seq: Some(seq),
                    status: None,
                    recipients: None,
                    state,
                };
                Self::encode(out, &Envelope::new(new_id(), now_ms(), Payload::Ack(ack)));
            }
            Cmd::Close(_) => {}
        }
    }

    fn settle_send(&mut self, id: &str, result: Result<Receipt, ClientError>) {
        if let Some(reply) = self.waiting_sends.remove(id) {
            // Usually the oldest; otherwise search.
            if self.outbox.front().is_some_and(|e| e.id == id) {
                self.outbox.pop_front();
            } else if let Some(i) = self.outbox.iter().position(|e| e.id == id) {
                self.outbox.remove(i);
            }
            let _ = reply.send(result);
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
                if self.cfg.dedupe && !self.seen.insert(&from, &env.id) {
                    // A replay of something already handed over: acknowledge it again so the
                    // daemon's watermark moves, and do not surface it twice.
                    let ack = Ack {
                        ack_id: env.id,
                        seq: Some(delivery.seq),
                        status: None,
                        recipients: None,
                        state: None,
                    };
                    Self::encode(out, &Envelope::new(new_id(), now_ms(), Payload::Ack(ack)));
                    return Ok(());
                }
                let msg = Delivered {
                    id: env.id,
                    from,
                    to: env.to.unwrap_or_default(),
                    topic: env.topic,
                    ts: env.ts,
                    seq: delivery.seq,
                    attempt: delivery.attempt,
                    payload,
                };
                if self.events.send(Event::Message(msg)).await.is_err() {
                    return Err("client dropped".into());
                }
            }
            Payload::Ping(p) => {
                Self::encode(
                    out,
                    &Envelope::new(new_id(), now_ms(), Payload::Pong(Ping { nonce: p.nonce })),
                );
            }
            Payload::Result(r) => {
                if let Some(q) = self.queries.remove(&env.id) {
                    let _ = q.send(Ok(r));
                }
            }
            Payload::Busy(b) => {
                let _ = self.events.try_send(Event::Busy(b));
            }
            Payload::Error(e) => {
                let fatal = e.fatal;
                let message = e.message.clone();
                let _ = self.events.try_send(Event::Error(e));
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
