//! One connection to the local relay per far node (issue 28.8): a *link* session
//! ([`relay_protocol::Role::Link`]) that speaks for every agent of that node. Each name is taken
//! by a HELLO on the connection (the relay's names decision applies: a name held here is
//! refused), and is a session of its own in the relay (its window, its acknowledgements); every
//! SEND, ACK, NACK, SUBSCRIBE and BYE names the one it is for in the envelope's `from`, and each
//! DELIVER comes with the `session_id` of the name it is for. Only the relay's own process may
//! open such a connection; this link runs in it.
//!
//! Before, every agent of another node had a connection of its own (a *stand-in*): 64 remote
//! agents were 64 sockets, 64 reader and writer tasks on each side, and 64 small writes where
//! one carries many frames now.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Buf, BytesMut};
use relay_client::{ClientError, Delivered};
use relay_protocol::query::{QueryRequest, QueryResult};
use relay_protocol::{
    Ack, Capabilities, DeliveryState, Envelope, Hello, Nack, NackCode, Payload, Role, Send,
    SubscribePayload, encode_frame, frame_len,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

/// DELIVERs the relay may have in flight to one name of a link (its window): all of a node's
/// names share the link's one queue in the relay.
pub(crate) const NAME_WINDOW: u32 = 128;

/// The largest frame the link writes or reads (the relay's limit is announced in its WELCOME;
/// this bounds what the link accepts before it knows).
const MAX_FRAME: usize = 16 * 1024 * 1024;

/// How the relay answered something the link asked.
#[derive(Debug)]
enum Answer {
    /// A name taken (its WELCOME).
    Welcome,
    /// Accepted (a SEND's receipt, a SUBSCRIBE's).
    Ack,
    /// Refused, with the reason.
    Nack(Nack),
    /// A query's answer.
    Result(Box<QueryResult>),
}

/// A name the link speaks for: where its DELIVERs go. `generation` tells a name taken again
/// from its earlier session (whose DELIVERs still on their way are dropped: that session's
/// unacknowledged messages are delivered again to the new one).
struct Route {
    generation: u64,
    tx: mpsc::Sender<Delivered>,
    hello_id: String,
}

/// What the link's reader and its users share.
#[derive(Default)]
struct State {
    routes: HashMap<String, Route>,
    pending: HashMap<String, oneshot::Sender<Answer>>,
    /// Session id -> (name, generation), from each WELCOME.
    sessions: HashMap<String, (String, u64)>,
    closed: bool,
}

/// What goes to the writer.
enum Cmd {
    Frame(Box<Envelope>),
    /// A plain acknowledgement of a name's DELIVER, in that name's delivery order: the writer
    /// sends the last of a name's run as one cumulative ACK.
    Ack {
        name: String,
        id: String,
        seq: u64,
    },
}

/// Why a name could not be taken.
#[derive(Debug)]
pub(crate) enum AttachError {
    /// The relay refuses it for good (a person's name, reserved...): the reason.
    Refused(String),
    /// The name is in use (a session of it that is ending, or a local agent that a directory
    /// pass will see): tried again later.
    InUse(String),
    /// The link's connection is gone.
    Closed,
}

/// The link's connection to the local relay, for one far node.
pub(crate) struct LinkConn {
    cmds: mpsc::Sender<Cmd>,
    state: Arc<Mutex<State>>,
    ids: AtomicU64,
    generation: AtomicU64,
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl LinkConn {
    /// Opens the link of `node` on the relay's socket: HELLO as a link, WELCOME.
    pub(crate) async fn connect(socket: &Path, node: &str) -> Result<Arc<Self>, String> {
        let stream = relay_client::connect_socket(socket)
            .await
            .map_err(|e| e.to_string())?;
        let (mut rd, mut wr) = stream.into_split();
        let hello = Hello {
            agent: "link".into(),
            cli: Some(crate::core::standin_cli(node)),
            capabilities: Capabilities::default(),
            resume_token: None,
            role: Role::Link,
        };
        let mut buf = Vec::new();
        encode_frame(
            &Envelope::new(
                "link-hello",
                relay_protocol::now_ms(),
                Payload::Hello(hello),
            ),
            &mut buf,
            MAX_FRAME,
        )
        .map_err(|e| e.to_string())?;
        wr.write_all(&buf).await.map_err(|e| e.to_string())?;
        let mut inbuf = BytesMut::with_capacity(64 * 1024);
        match read_frame(&mut rd, &mut inbuf).await?.payload {
            Payload::Welcome(_) => {}
            Payload::Error(e) => return Err(format!("{:?}: {}", e.code, e.message)),
            other => return Err(format!("unexpected answer to the link's HELLO: {other:?}")),
        }
        let state = Arc::new(Mutex::new(State::default()));
        let (cmds, rx) = mpsc::channel(4096);
        tokio::spawn(write_loop(wr, rx));
        tokio::spawn(read_loop(rd, inbuf, state.clone(), cmds.clone()));
        Ok(Arc::new(Self {
            cmds,
            state,
            ids: AtomicU64::new(1),
            generation: AtomicU64::new(1),
        }))
    }

    /// Whether the connection is gone (a new one is made for the next name).
    pub(crate) fn is_closed(&self) -> bool {
        lock(&self.state).closed || self.cmds.is_closed()
    }

    fn next_id(&self) -> String {
        format!("L{}", self.ids.fetch_add(1, Ordering::Relaxed))
    }

    async fn frame(&self, env: Envelope) -> Result<(), ClientError> {
        self.cmds
            .send(Cmd::Frame(Box::new(env)))
            .await
            .map_err(|_| ClientError::Closed)
    }

    /// Sends `env` and returns where its answer comes (by its id).
    async fn ask(&self, env: Envelope) -> Result<oneshot::Receiver<Answer>, ClientError> {
        let (tx, rx) = oneshot::channel();
        {
            let mut st = lock(&self.state);
            if st.closed {
                return Err(ClientError::Closed);
            }
            st.pending.insert(env.id.clone(), tx);
        }
        self.frame(env).await?;
        Ok(rx)
    }

    /// Takes `name` on the link: its DELIVERs come on the returned receiver.
    pub(crate) async fn attach(
        &self,
        name: &str,
    ) -> Result<mpsc::Receiver<Delivered>, AttachError> {
        let hello_id = self.next_id();
        let generation = self.generation.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(NAME_WINDOW as usize * 2 + 64);
        lock(&self.state).routes.insert(
            name.to_owned(),
            Route {
                generation,
                tx,
                hello_id: hello_id.clone(),
            },
        );
        let hello = Hello {
            agent: name.to_owned(),
            cli: None,
            capabilities: Capabilities {
                ack: true,
                max_inflight: NAME_WINDOW,
                ..Capabilities::default()
            },
            resume_token: None,
            role: Role::Agent,
        };
        let env = Envelope::new(hello_id, relay_protocol::now_ms(), Payload::Hello(hello));
        let answer = match self.ask(env).await {
            Ok(rx) => rx.await,
            Err(_) => return Err(AttachError::Closed),
        };
        match answer {
            Ok(Answer::Welcome) => Ok(rx),
            Ok(Answer::Nack(n)) => {
                self.forget(name, generation);
                if n.code == NackCode::Unavailable {
                    Err(AttachError::InUse(n.reason))
                } else {
                    Err(AttachError::Refused(n.reason))
                }
            }
            Ok(other) => {
                self.forget(name, generation);
                Err(AttachError::Refused(format!(
                    "unexpected answer: {other:?}"
                )))
            }
            Err(_) => Err(AttachError::Closed),
        }
    }

    fn forget(&self, name: &str, generation: u64) {
        let mut st = lock(&self.state);
        if st
            .routes
            .get(name)
            .is_some_and(|r| r.generation == generation)
        {
            st.routes.remove(name);
        }
    }

    /// Gives `name` up (a BYE for it): its session ends in the relay, and what it held
    /// unacknowledged waits for the next. Nothing if the link does not speak for it.
    pub(crate) async fn detach(&self, name: &str) {
        if lock(&self.state).routes.remove(name).is_none() {
            return;
        }
        let mut env = Envelope::new(
            self.next_id(),
            relay_protocol::now_ms(),
            Payload::Bye(Default::default()),
        );
        env.from = Some(name.to_owned());
        if self.frame(env).await.is_err() {
            tracing::debug!(%name, "federation: link gone before a name was given up");
        }
    }

    /// Subscribes `name` to a topic pattern (answered once the relay has it).
    pub(crate) async fn subscribe(&self, name: &str, pattern: &str) -> Result<(), ClientError> {
        let mut env = Envelope::new(
            self.next_id(),
            relay_protocol::now_ms(),
            Payload::Subscribe(SubscribePayload {
                topic: Some(pattern.to_owned()),
            }),
        );
        env.from = Some(name.to_owned());
        env.topic = Some(pattern.to_owned());
        match self.ask(env).await?.await {
            Ok(Answer::Ack) => Ok(()),
            Ok(Answer::Nack(n)) => Err(ClientError::Rejected {
                code: n.code,
                reason: n.reason,
            }),
            _ => Err(ClientError::Closed),
        }
    }

    /// SENDs a message as `from` (a name the link speaks for) with its id, pipelined: the
    /// returned future is its receipt.
    pub(crate) async fn send(
        &self,
        from: &str,
        id: String,
        to: Option<String>,
        topic: Option<String>,
        payload: Send,
    ) -> Result<futures_util::future::BoxFuture<'static, Result<(), ClientError>>, ClientError>
    {
        let mut env = Envelope::new(id, relay_protocol::now_ms(), Payload::Send(payload));
        env.from = Some(from.to_owned());
        env.to = to;
        env.topic = topic;
        let rx = self.ask(env).await?;
        Ok(Box::pin(async move {
            match rx.await {
                Ok(Answer::Ack) => Ok(()),
                Ok(Answer::Nack(n)) => Err(ClientError::Rejected {
                    code: n.code,
                    reason: n.reason,
                }),
                _ => Err(ClientError::Closed),
            }
        }))
    }

    /// Asks the relay (on this connection: answered after everything the link sent before).
    pub(crate) async fn query(&self, req: QueryRequest) -> Result<QueryResult, ClientError> {
        let env = Envelope::new(
            self.next_id(),
            relay_protocol::now_ms(),
            Payload::Query(req),
        );
        match self.ask(env).await?.await {
            Ok(Answer::Result(r)) => Ok(*r),
            _ => Err(ClientError::Closed),
        }
    }

    /// Acknowledges a DELIVER to `name` (in that name's delivery order), with a state if any.
    pub(crate) async fn ack(
        &self,
        name: &str,
        d: &Delivered,
        state: Option<DeliveryState>,
    ) -> Result<(), ClientError> {
        if state.is_none() {
            return self
                .cmds
                .send(Cmd::Ack {
                    name: name.to_owned(),
                    id: d.id.clone(),
                    seq: d.seq,
                })
                .await
                .map_err(|_| ClientError::Closed);
        }
        self.ack_frame(name, d, state, None).await
    }

    /// Acknowledges a DELIVER to `name` as failed, with why.
    pub(crate) async fn ack_failed(
        &self,
        name: &str,
        d: &Delivered,
        reason: &str,
    ) -> Result<(), ClientError> {
        self.ack_frame(
            name,
            d,
            Some(DeliveryState::Failed),
            Some(reason.to_owned()),
        )
        .await
    }

    async fn ack_frame(
        &self,
        name: &str,
        d: &Delivered,
        state: Option<DeliveryState>,
        reason: Option<String>,
    ) -> Result<(), ClientError> {
        let ack = Ack::of_delivery(d.id.clone(), d.seq, state, false, reason);
        let mut env = Envelope::new(self.next_id(), relay_protocol::now_ms(), Payload::Ack(ack));
        env.from = Some(name.to_owned());
        self.frame(env).await
    }

    /// Reports a message delivered to `name` earlier as failed after all (a NACK).
    pub(crate) async fn fail(&self, name: &str, id: &str, reason: &str) -> Result<(), ClientError> {
        let nack = Nack {
            ack_id: id.to_owned(),
            code: NackCode::Other,
            reason: reason.to_owned(),
        };
        let mut env = Envelope::new(
            self.next_id(),
            relay_protocol::now_ms(),
            Payload::Nack(nack),
        );
        env.from = Some(name.to_owned());
        self.frame(env).await
    }
}

/// Reads one whole frame (before the reader task runs: the WELCOME).
async fn read_frame(
    rd: &mut tokio::net::unix::OwnedReadHalf,
    buf: &mut BytesMut,
) -> Result<Envelope, String> {
    loop {
        if let Some(n) = frame_len(buf, MAX_FRAME).map_err(|e| e.to_string())? {
            let env = Envelope::from_json(&buf[4..n]).map_err(|e| e.to_string());
            buf.advance(n);
            return env;
        }
        if rd.read_buf(buf).await.map_err(|e| e.to_string())? == 0 {
            return Err("the relay closed the link's connection".into());
        }
    }
}

/// Writes what the link sends, as many frames per write as are ready. A name's plain
/// acknowledgements in a row become one cumulative ACK of the last (each name's DELIVERs are
/// acknowledged in their order); anything else for that name is written after it.
async fn write_loop(mut wr: tokio::net::unix::OwnedWriteHalf, mut rx: mpsc::Receiver<Cmd>) {
    let mut buf = Vec::new();
    let mut acks: HashMap<String, (String, u64)> = HashMap::new();
    let mut ids = 0u64;
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        while let Some(cmd) = next.take() {
            match cmd {
                Cmd::Ack { name, id, seq } => {
                    acks.insert(name, (id, seq));
                }
                Cmd::Frame(env) => {
                    if env.from.as_deref().is_some_and(|n| acks.contains_key(n)) {
                        flush_acks(&mut acks, &mut buf, &mut ids);
                    }
                    if let Err(e) = encode_frame(&env, &mut buf, MAX_FRAME) {
                        tracing::error!(error = %e, "federation: cannot encode a frame for the relay");
                    }
                }
            }
            if buf.len() < 64 * 1024 {
                next = rx.try_recv().ok();
            }
        }
        flush_acks(&mut acks, &mut buf, &mut ids);
        if let Err(e) = wr.write_all(&buf).await {
            tracing::debug!(error = %e, "federation: the link's connection is gone");
            return;
        }
        buf.clear();
    }
    if let Err(e) = wr.shutdown().await {
        tracing::debug!(error = %e, "federation: link socket shutdown");
    }
}

fn flush_acks(acks: &mut HashMap<String, (String, u64)>, buf: &mut Vec<u8>, ids: &mut u64) {
    for (name, (id, seq)) in acks.drain() {
        *ids += 1;
        let ack = Ack::of_delivery(id, seq, None, true, None);
        let mut env = Envelope::new(
            format!("A{ids}"),
            relay_protocol::now_ms(),
            Payload::Ack(ack),
        );
        env.from = Some(name);
        if let Err(e) = encode_frame(&env, buf, MAX_FRAME) {
            tracing::error!(error = %e, "federation: cannot encode an ACK for the relay");
        }
    }
}

/// Reads the relay's frames: answers to their askers, DELIVERs to their name's stand-in.
/// When the connection ends every name's receiver ends with it (its stand-in stops and is
/// started again, on a new connection, by the next directory pass).
async fn read_loop(
    mut rd: tokio::net::unix::OwnedReadHalf,
    mut buf: BytesMut,
    state: Arc<Mutex<State>>,
    cmds: mpsc::Sender<Cmd>,
) {
    let mut parts: HashMap<String, relay_protocol::parts::Joiner> = HashMap::new();
    let why = loop {
        let env = match frame_len(&buf, MAX_FRAME) {
            Ok(Some(n)) => {
                let env = Envelope::from_json(&buf[4..n]);
                buf.advance(n);
                match env {
                    Ok(e) => e,
                    Err(e) => {
                        tracing::warn!(error = %e, "federation: unreadable frame from the relay");
                        continue;
                    }
                }
            }
            Ok(None) => match rd.read_buf(&mut buf).await {
                Ok(0) => break "the relay closed it".to_owned(),
                Ok(_) => continue,
                Err(e) => break e.to_string(),
            },
            Err(e) => break e.to_string(),
        };
        match env.payload {
            Payload::Deliver(payload) => {
                let Some(delivery) = env.delivery else {
                    continue;
                };
                let tx = {
                    let st = lock(&state);
                    st.sessions
                        .get(&delivery.session_id)
                        .and_then(|(name, g)| st.routes.get(name).filter(|r| r.generation == *g))
                        .map(|r| r.tx.clone())
                };
                // A session given up: its unacknowledged messages go to the next one.
                let Some(tx) = tx else { continue };
                // The relay names the sender of every DELIVER; one without is forwarded all
                // the same, so that the far node answers it (a dead letter with its reason)
                // rather than the relay offering it to the link again and again.
                let from = env.from.unwrap_or_else(|| {
                    tracing::warn!(id = %env.id, "federation: a DELIVER without its sender");
                    String::new()
                });
                let d = Delivered::of_deliver(
                    (env.id, from, env.to, env.topic, env.ts),
                    &delivery,
                    payload,
                );
                if tx.send(d).await.is_err() {
                    tracing::debug!("federation: a delivery for a stand-in that stopped");
                }
            }
            Payload::Welcome(w) => {
                let mut st = lock(&state);
                let Some(name) = w.agent else { continue };
                let Some((generation, hello_id)) = st
                    .routes
                    .get(&name)
                    .map(|r| (r.generation, r.hello_id.clone()))
                else {
                    continue;
                };
                st.sessions.insert(w.session_id, (name, generation));
                if let Some(p) = st.pending.remove(&hello_id)
                    && p.send(Answer::Welcome).is_err()
                {
                    tracing::debug!("federation: a name taken for a stand-in that stopped");
                }
            }
            Payload::Ack(a) => answer(&state, &a.ack_id, Answer::Ack),
            Payload::Nack(n) => answer(&state, &n.ack_id.clone(), Answer::Nack(n)),
            // A large answer (the agent list of a big federation) comes in parts: joined.
            Payload::Result(QueryResult::Part {
                part,
                parts: of,
                data,
            }) => {
                match parts
                    .entry(env.id.clone())
                    .or_default()
                    .push(part, of, &data)
                {
                    Ok(None) => {}
                    Ok(Some(r)) => {
                        parts.remove(&env.id);
                        answer(&state, &env.id, Answer::Result(Box::new(r)));
                    }
                    Err(e) => {
                        // Its asker gets no answer (`Closed`) and tries again later.
                        parts.remove(&env.id);
                        tracing::warn!(error = %e, "federation: an answer in parts could not be joined");
                        lock(&state).pending.remove(&env.id);
                    }
                }
            }
            Payload::Result(r) => answer(&state, &env.id, Answer::Result(Box::new(r))),
            Payload::Ping(p) => {
                let pong = Envelope::new("link-pong", relay_protocol::now_ms(), Payload::Pong(p));
                if cmds.try_send(Cmd::Frame(Box::new(pong))).is_err() {
                    tracing::debug!("federation: link PONG not queued");
                }
            }
            Payload::Error(e) if e.fatal => break format!("{:?}: {}", e.code, e.message),
            Payload::Error(e) => {
                tracing::warn!(code = ?e.code, message = %e.message, "federation: the relay says");
            }
            Payload::Bye(_) => break "the relay said BYE".to_owned(),
            _ => {}
        }
    };
    tracing::info!(%why, "federation: a link's connection to the relay ended");
    let mut st = lock(&state);
    st.closed = true;
    st.routes.clear();
    st.pending.clear();
    st.sessions.clear();
}

fn answer(state: &Mutex<State>, id: &str, a: Answer) {
    if let Some(p) = lock(state).pending.remove(id)
        && p.send(a).is_err()
    {
        // The asker stopped waiting (its stand-in stopped): nothing to tell.
        tracing::debug!(%id, "federation: an answer for a stand-in that stopped");
    }
}
