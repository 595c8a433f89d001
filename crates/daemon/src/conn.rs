//! The I/O shell around one connection: a reader that decodes frames and drives the
//! [`Session`] core, and a writer that drains the connection's bounded outbound queue, encoding
//! as many queued frames as are ready into one write.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use relay_protocol::{
    DecodeError, Envelope, ErrorCode, ErrorPayload, FrameError, Header, MessageType, Nack,
    NackCode, Payload, Ping, encode_frame, encode_with, frame_len,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::Config;
use crate::clock::now_ms;
use crate::msg::{ConnHandle, DeliverItem, Killer, Outbound, RouterMsg};
use crate::session::{Session, Tick, Timing, Verdict};

/// Serves one accepted connection until it closes.
pub(crate) async fn serve(
    stream: UnixStream,
    conn_id: u64,
    cfg: Arc<Config>,
    router: mpsc::Sender<RouterMsg>,
    shutdown: CancellationToken,
    in_process: bool,
) {
    let (rd, wr) = stream.into_split();
    // The relay's own process may open a federation link, which carries the deliveries of
    // every name of another node (each its own window): room for many windows (the channel
    // allocates as it fills, not up front).
    let queue = if in_process {
        cfg.outbound_queue.saturating_mul(LINK_QUEUE_FACTOR)
    } else {
        cfg.outbound_queue
    };
    let (tx, rx) = mpsc::channel(queue);
    let killer = Killer::default();
    let writer = tokio::spawn(write_loop(
        wr,
        rx,
        killer.clone(),
        cfg.max_frame_bytes,
        conn_id,
        router.clone(),
    ));
    let mut reader = Reader {
        conn_id,
        cfg: cfg.clone(),
        router: router.clone(),
        tx,
        killer: killer.clone(),
        session: Session::new(
            Timing {
                heartbeat: cfg.heartbeat,
                timeout: cfg.heartbeat_timeout,
                handshake: cfg.handshake_timeout,
            },
            relay_protocol::now_instant(),
        ),
        registered: false,
        in_process,
        said_bye: false,
        link: None,
    };
    let exit = reader.run(rd, shutdown).await;
    // A link's names end with it (their sessions' deliveries stay pending for the next).
    if exit != Exit::Shutdown
        && let Some(link) = reader.link.take()
    {
        for (_, id) in link.names {
            if router
                .send(RouterMsg::Unregister {
                    conn_id: id,
                    bye: false,
                })
                .await
                .is_err()
            {
                tracing::debug!(conn = id, "router gone before a link's name was released");
            }
        }
    }
    // On shutdown the router says BYE to every registered connection and closes it; an
    // Unregister now could race ahead of that and leave the peer without its BYE.
    if reader.registered
        && exit != Exit::Shutdown
        && router
            .send(RouterMsg::Unregister {
                conn_id,
                bye: reader.said_bye,
            })
            .await
            .is_err()
    {
        // Only when the router has stopped: the daemon is going down, and the store keeps
        // what this connection held (its in-flight messages are replayed on reconnect).
        tracing::debug!(
            conn = conn_id,
            "router gone before the connection was unregistered"
        );
    }
    // Dropping the reader drops its queue sender; the writer flushes what is queued and ends.
    drop(reader);
    if let Err(e) = writer.await {
        tracing::error!(conn = conn_id, error = %e, "connection writer task failed");
    }
}

/// How many times the usual outbound queue a connection of the relay's own process gets (a
/// federation link carries every remote name's window).
const LINK_QUEUE_FACTOR: usize = 16;

/// Connection ids of the names a federation link takes (issue 28.8): each is a session of
/// its own in the router, far above the accepted connections' ids (counted from 1).
static NEXT_LINK_NAME: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1 << 62);

/// A federation link's connection: the names it speaks for, each a session of its own in the
/// router under its own connection id, sharing this connection's socket.
#[derive(Debug)]
struct Link {
    /// The `cli` of the link's HELLO (`remote@<node>`), given to each of its names.
    cli: Option<String>,
    /// Name -> the connection id of its session.
    names: std::collections::HashMap<String, u64>,
}

/// The read buffer a connection starts with (it grows with the frames that arrive).
const INITIAL_READ_BUFFER: usize = 1024;

/// Read buffer capacity a connection may keep while nothing is buffered.
const MAX_IDLE_READ_BUFFER: usize = 64 * 1024;

/// Write buffer capacity kept after a write; a burst may grow it further for its duration.
const KEEP_WRITE_BUFFER: usize = 16 * 1024;

/// Largest frame a connection may declare before its HELLO is accepted. A HELLO is a few
/// hundred bytes; without this cap, a 4-byte header claiming the frame limit would make an
/// unauthenticated peer's buffer grow to it.
pub(crate) const MAX_HANDSHAKE_FRAME: usize = 64 * 1024;

/// How much to reserve for a partly received frame of `want` bytes of which `have` are
/// here: at most as much again as has arrived (never the declared length at once), so memory
/// follows the bytes a peer actually sends.
fn room_for(want: usize, have: usize) -> usize {
    want.saturating_sub(have).min(have.max(8 * 1024))
}

struct Reader {
    conn_id: u64,
    cfg: Arc<Config>,
    router: mpsc::Sender<RouterMsg>,
    tx: mpsc::Sender<Outbound>,
    killer: Killer,
    session: Session,
    registered: bool,
    /// The peer is this daemon's own process.
    in_process: bool,
    /// The peer said BYE: it left on purpose (an agent's claims are released).
    said_bye: bool,
    /// Set once a federation link's HELLO is accepted.
    link: Option<Link>,
}

/// Why the reader stopped.
#[derive(Debug, PartialEq, Eq)]
enum Exit {
    /// The peer left, broke the protocol, or was cut off.
    Closed,
    /// The daemon is shutting down.
    Shutdown,
}

/// Whether to keep reading.
enum Flow {
    Continue,
    Stop,
}

impl Reader {
    async fn run(&mut self, mut rd: OwnedReadHalf, shutdown: CancellationToken) -> Exit {
        // Small to start: most connections are idle agents exchanging heartbeats, and the
        // buffer grows with what arrives (see `room_for`); 10,000 of them must stay cheap.
        let mut buf = BytesMut::with_capacity(INITIAL_READ_BUFFER);
        // One timer, armed for when the session next has something to do (a PING every
        // heartbeat, the timeouts): with 10,000 idle connections, waking each once a second
        // just to find nothing due cost more than the heartbeats themselves.
        let due = |s: &Session| {
            s.next_due().map_or_else(
                || tokio::time::Instant::now() + Duration::from_secs(86_400),
                tokio::time::Instant::from_std,
            )
        };
        let mut armed = due(&self.session);
        let timer = tokio::time::sleep_until(armed);
        tokio::pin!(timer);
        loop {
            // Handle every complete frame already buffered before reading more.
            loop {
                let limit = if self.registered {
                    self.cfg.max_frame_bytes
                } else {
                    self.cfg.max_frame_bytes.min(MAX_HANDSHAKE_FRAME)
                };
                match frame_len(&buf, limit) {
                    Ok(Some(n)) => {
                        let flow = self.on_frame(&buf[4..n]).await;
                        buf.advance(n);
                        if let Flow::Stop = flow {
                            return Exit::Closed;
                        }
                    }
                    Ok(None) => {
                        // A frame is partly here and its length already passed the limit
                        // check: grow geometrically towards it as bytes arrive, so a large
                        // frame takes few reads, and a header that only claims a large frame
                        // costs nothing.
                        if buf.len() >= 4 {
                            let want =
                                u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize + 4;
                            buf.reserve(room_for(want, buf.len()));
                        }
                        break;
                    }
                    Err(e) => {
                        let code = match e {
                            FrameError::TooLarge { .. } => ErrorCode::FrameTooLarge,
                            _ => ErrorCode::BadFrame,
                        };
                        self.fatal(code, e.to_string()).await;
                        return Exit::Closed;
                    }
                }
            }
            if buf.is_empty() && buf.capacity() > MAX_IDLE_READ_BUFFER {
                // A large frame has been handled: give its room back.
                buf = BytesMut::with_capacity(INITIAL_READ_BUFFER);
            } else if buf.capacity() - buf.len() < INITIAL_READ_BUFFER / 4 {
                buf.reserve(INITIAL_READ_BUFFER);
            }
            // Deadlines only move later as frames arrive (a tick before one is harmless), except
            // when HELLO makes the session active: then the first PING is due sooner.
            let next = due(&self.session);
            if next < armed {
                armed = next;
                timer.as_mut().reset(armed);
            }
            let spare = buf.capacity() - buf.len();
            tokio::select! {
                r = rd.read_buf(&mut buf) => match r {
                    Ok(0) => {
                        if !buf.is_empty() {
                            tracing::debug!(conn = self.conn_id, bytes = buf.len(), "peer closed mid-frame");
                        }
                        return Exit::Closed;
                    }
                    Ok(n) => {
                        // A read that filled the buffer means more is waiting (a busy sender):
                        // read more at a time, up to 64 KiB.
                        if n == spare && buf.capacity() < MAX_IDLE_READ_BUFFER {
                            buf.reserve(buf.capacity().min(MAX_IDLE_READ_BUFFER));
                        }
                    }
                    Err(e) => {
                        tracing::debug!(conn = self.conn_id, error = %e, "read failed");
                        return Exit::Closed;
                    }
                },
                () = &mut timer => {
                    let tick = self.session.on_tick(relay_protocol::now_instant());
                    armed = due(&self.session);
                    timer.as_mut().reset(armed);
                    match tick {
                        Tick::Idle => {}
                        Tick::Ping => {
                            self.queue(Outbound::Control(Box::new(Payload::Ping(Ping::default())))).await;
                        }
                        Tick::Expired(code, message) => {
                            tracing::info!(conn = self.conn_id, %message, "closing connection");
                            self.fatal(code, message).await;
                            return Exit::Closed;
                        }
                    }
                }
                () = self.killer.killed() => return Exit::Closed,
                () = shutdown.cancelled() => {
                    // The router says BYE to registered connections; close the others here.
                    if !self.registered {
                        self.fatal(ErrorCode::ShuttingDown, "daemon shutting down".into()).await;
                    }
                    return Exit::Shutdown;
                }
            }
        }
    }

    async fn queue(&self, out: Outbound) {
        if self.tx.send(out).await.is_err() {
            // The writer has ended (the socket failed or the connection was cut short), so
            // the peer cannot be told anything more; the reader stops on its next read.
            tracing::debug!(
                conn = self.conn_id,
                "writer gone; frame for the peer dropped"
            );
        }
    }

    async fn error(&self, code: ErrorCode, message: String, fatal: bool) {
        let err = ErrorPayload {
            code,
            message,
            fatal,
        };
        let out = if fatal {
            Outbound::Close(Some(Box::new(err)))
        } else {
            Outbound::Control(Box::new(Payload::Error(err)))
        };
        self.queue(out).await;
    }

    async fn fatal(&mut self, code: ErrorCode, message: String) {
        tracing::debug!(conn = self.conn_id, ?code, %message, "fatal protocol error");
        self.session.close();
        self.error(code, message, true).await;
    }

    async fn on_frame(&mut self, frame: &[u8]) -> Flow {
        let (env, raw) = match Envelope::from_json_with_payload(frame) {
            Ok(decoded) => decoded,
            Err(e) if e.is_fatal() => {
                let code = match e {
                    DecodeError::BadVersion(_) => ErrorCode::BadVersion,
                    _ => ErrorCode::BadFrame,
                };
                self.fatal(code, e.to_string()).await;
                return Flow::Stop;
            }
            Err(DecodeError::UnknownType { ty, .. }) if !self.registered => {
                // PROTOCOL.md: the first frame must be HELLO; an unknown type is not one.
                self.fatal(
                    ErrorCode::BadState,
                    format!(
                        "unknown message type {:?} before HELLO: the first frame on a connection must be HELLO",
                        relay_protocol::text::one_line(&ty, 64)
                    ),
                )
                .await;
                return Flow::Stop;
            }
            Err(DecodeError::UnknownType { id, ty }) => {
                self.error(
                    ErrorCode::UnknownType,
                    format!("unknown message type {ty:?} (envelope {id:?}); ignored"),
                    false,
                )
                .await;
                return Flow::Continue;
            }
            Err(DecodeError::BadPayload { id, ty, reason }) => {
                // The type is known even if its payload is not: a frame the session refuses
                // (a server-only type, anything after BYE) is refused as such.
                if let Some(t) = MessageType::parse(ty)
                    && let Verdict::Fatal(code, message) =
                        self.session.on_frame(t, relay_protocol::now_instant())
                {
                    self.fatal(code, message).await;
                    return Flow::Stop;
                }
                if self.registered && ty == "SEND" {
                    let nack = Nack {
                        ack_id: id,
                        code: NackCode::Invalid,
                        reason: format!("bad SEND payload: {reason}"),
                    };
                    self.queue(Outbound::Control(Box::new(Payload::Nack(nack))))
                        .await;
                    return Flow::Continue;
                }
                if !self.registered {
                    self.fatal(ErrorCode::BadPayload, format!("bad {ty} payload: {reason}"))
                        .await;
                    return Flow::Stop;
                }
                self.error(
                    ErrorCode::BadPayload,
                    format!("bad {ty} payload in {id:?}: {reason}"),
                    false,
                )
                .await;
                return Flow::Continue;
            }
            Err(e) => {
                self.fatal(ErrorCode::BadFrame, e.to_string()).await;
                return Flow::Stop;
            }
        };
        // A link's BYE for one of its names ends that name's session, not the connection.
        if let (Some(link), Payload::Bye(_), Some(name)) =
            (&mut self.link, &env.payload, env.from.as_deref())
        {
            self.session.heard(relay_protocol::now_instant());
            if let Some(id) = link.names.remove(name)
                && self
                    .router
                    .send(RouterMsg::Unregister {
                        conn_id: id,
                        bye: true,
                    })
                    .await
                    .is_err()
            {
                self.fatal(ErrorCode::ShuttingDown, "daemon shutting down".into())
                    .await;
                return Flow::Stop;
            }
            return Flow::Continue;
        }
        if let Verdict::Fatal(code, message) = self
            .session
            .on_frame(env.message_type(), relay_protocol::now_instant())
        {
            if env.message_type() == MessageType::Send && !self.registered {
                // Tell the sender about its message before closing the connection.
                let nack = Nack {
                    ack_id: env.id,
                    code: NackCode::NotActive,
                    reason: "not stored: the connection has not completed its handshake (send HELLO first)".into(),
                };
                self.queue(Outbound::Control(Box::new(Payload::Nack(nack))))
                    .await;
            }
            self.fatal(code, message).await;
            return Flow::Stop;
        }
        let conn_id = match self.link_conn(&env).await {
            Some(id) => id,
            None => return Flow::Continue,
        };
        let ty = env.message_type();
        let msg = match env.payload {
            Payload::Hello(hello) if self.link.is_some() => {
                return self.attach(env.id, hello).await;
            }
            Payload::Hello(hello) => return self.on_hello(hello).await,
            Payload::Send(payload) => RouterMsg::Send {
                conn_id,
                id: env.id,
                to: env.to,
                topic: env.topic,
                payload,
                // Forwarded verbatim to live recipients: already validated by the typed parse.
                raw: raw.map(|r| crate::msg::Raw::from(r.to_owned())),
            },
            Payload::Ack(ack) => RouterMsg::Ack { conn_id, ack },
            Payload::Nack(nack) => RouterMsg::Nack { conn_id, nack },
            Payload::Subscribe(p) | Payload::Unsubscribe(p) => RouterMsg::Subscribe {
                conn_id,
                on: ty == MessageType::Subscribe,
                id: env.id,
                pattern: env.topic.or(p.topic),
            },
            Payload::Query(req) => RouterMsg::Query {
                conn_id,
                id: env.id,
                req,
            },
            Payload::Ping(p) => {
                self.queue(Outbound::Control(Box::new(Payload::Pong(p))))
                    .await;
                return Flow::Continue;
            }
            Payload::Bye(_) => {
                self.said_bye = true;
                self.queue(Outbound::Control(Box::new(
                    Payload::Bye(Default::default()),
                )))
                .await;
                self.queue(Outbound::Close(None)).await;
                return Flow::Stop;
            }
            // A wrapper's view of its terminal rides on its PONGs (extension).
            Payload::Pong(Ping {
                terminal: Some(report),
                ..
            }) => RouterMsg::Terminal { conn_id, report },
            Payload::Pong(_) | Payload::Error(_) => return Flow::Continue,
            Payload::Welcome(_) | Payload::Deliver(_) | Payload::Result(_) | Payload::Busy(_) => {
                // The session core refused these already.
                return Flow::Stop;
            }
        };
        if self.router.send(msg).await.is_err() {
            self.fatal(ErrorCode::ShuttingDown, "daemon shutting down".into())
                .await;
            return Flow::Stop;
        }
        Flow::Continue
    }

    /// The session a frame is for: this connection's, or on a federation link the one of the
    /// name in its `from` (SEND, ACK, NACK, SUBSCRIBE). `None`: refused here (told to the
    /// peer), nothing more to do.
    async fn link_conn(&mut self, env: &Envelope) -> Option<u64> {
        let Some(link) = &self.link else {
            return Some(self.conn_id);
        };
        let for_a_name = matches!(
            env.payload,
            Payload::Send(_)
                | Payload::Ack(_)
                | Payload::Nack(_)
                | Payload::Subscribe(_)
                | Payload::Unsubscribe(_)
        );
        if !for_a_name {
            return Some(self.conn_id);
        }
        if let Some(id) = env.from.as_deref().and_then(|n| link.names.get(n)) {
            return Some(*id);
        }
        let why = match env.from.as_deref() {
            Some(name) => format!(
                "this link does not speak for {:?}: take the name with a HELLO first",
                relay_protocol::text::one_line(name, 64)
            ),
            None => "a link speaks for the names it took: say which one in `from`".to_owned(),
        };
        if env.message_type() == MessageType::Send {
            let nack = Nack {
                ack_id: env.id.clone(),
                code: NackCode::Forbidden,
                reason: why,
            };
            self.queue(Outbound::Control(Box::new(Payload::Nack(nack))))
                .await;
        } else {
            self.error(ErrorCode::Forbidden, why, false).await;
        }
        None
    }

    /// A HELLO on a federation link: one more name it speaks for, a session of its own in the
    /// router (the names decision applies as to any agent: a name held here is refused). The
    /// WELCOME names it; a refusal is a NACK of the HELLO's envelope id, and the link goes on.
    async fn attach(&mut self, hello_id: String, mut hello: relay_protocol::Hello) -> Flow {
        let Some(link) = &self.link else {
            return Flow::Continue;
        };
        let refused = if let Verdict::Fatal(_, message) = self.session.check_hello(&hello) {
            Some(message)
        } else if link.names.contains_key(&hello.agent) {
            Some(format!("this link speaks for {:?} already", hello.agent))
        } else {
            None
        };
        if let Some(reason) = refused {
            let nack = Nack {
                ack_id: hello_id,
                code: NackCode::Invalid,
                reason,
            };
            self.queue(Outbound::Control(Box::new(Payload::Nack(nack))))
                .await;
            return Flow::Continue;
        }
        // Every name is an agent of the link's node, acknowledging each delivery.
        hello.role = relay_protocol::Role::Agent;
        hello.cli.clone_from(&link.cli);
        hello.capabilities.ack = true;
        hello.resume_token = None;
        let name = hello.agent.clone();
        let id = NEXT_LINK_NAME.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let conn = ConnHandle {
            id,
            tx: self.tx.clone(),
            killer: self.killer.clone(),
            in_process: self.in_process,
            attach: true,
        };
        match self.register(conn, hello).await {
            None => Flow::Stop,
            Some(Ok(())) => {
                if let Some(link) = &mut self.link {
                    link.names.insert(name, id);
                }
                Flow::Continue
            }
            Some(Err((code, reason))) => {
                // A name in use may be this link's own session of it that is still ending
                // (the connection it was on closed a moment ago): the link tries again. Any
                // other refusal is for good.
                let code = if code == ErrorCode::NameInUse {
                    NackCode::Unavailable
                } else {
                    NackCode::Forbidden
                };
                let nack = Nack {
                    ack_id: hello_id,
                    code,
                    reason,
                };
                self.queue(Outbound::Control(Box::new(Payload::Nack(nack))))
                    .await;
                Flow::Continue
            }
        }
    }

    /// Hands a HELLO to the router and waits for its decision; `None` when the daemon is
    /// shutting down (the peer is told, fatally).
    async fn register(
        &mut self,
        conn: ConnHandle,
        hello: relay_protocol::Hello,
    ) -> Option<Result<(), (ErrorCode, String)>> {
        let (reply, answer) = oneshot::channel();
        let sent = self
            .router
            .send(RouterMsg::Register { conn, hello, reply })
            .await;
        match (sent, answer.await) {
            (Ok(()), Ok(decision)) => Some(decision),
            _ => {
                self.fatal(ErrorCode::ShuttingDown, "daemon shutting down".into())
                    .await;
                None
            }
        }
    }

    async fn on_hello(&mut self, hello: relay_protocol::Hello) -> Flow {
        if let Verdict::Fatal(code, message) = self.session.check_hello(&hello) {
            self.fatal(code, message).await;
            return Flow::Stop;
        }
        let conn = ConnHandle {
            id: self.conn_id,
            tx: self.tx.clone(),
            killer: self.killer.clone(),
            in_process: self.in_process,
            attach: false,
        };
        let link = (hello.role == relay_protocol::Role::Link).then(|| Link {
            cli: hello.cli.clone(),
            names: std::collections::HashMap::new(),
        });
        match self.register(conn, hello).await {
            None => Flow::Stop,
            Some(Ok(())) => {
                self.registered = true;
                if link.is_some() {
                    self.session.activate_link();
                    self.link = link;
                } else {
                    self.session.activate();
                }
                Flow::Continue
            }
            Some(Err((code, message))) => {
                self.fatal(code, message).await;
                Flow::Stop
            }
        }
    }
}

/// Ids for frames this connection's writer originates: unique within the daemon process.
struct FrameIds {
    prefix: String,
    next: u64,
    buf: String,
}

impl FrameIds {
    fn new(conn_id: u64) -> Self {
        Self {
            prefix: format!("d{}-{conn_id}-", std::process::id()),
            next: 0,
            buf: String::new(),
        }
    }

    fn next(&mut self) -> &str {
        use std::fmt::Write;
        self.next += 1;
        self.buf.clear();
        self.buf.push_str(&self.prefix);
        // Writing to a String cannot fail.
        write!(self.buf, "{}", self.next).ok();
        &self.buf
    }
}

/// Encodes one outbound item; `Some` for a Close (with its error, if any).
fn encode(
    out: Outbound,
    buf: &mut Vec<u8>,
    max: usize,
    ids: &mut FrameIds,
    written: &mut Vec<i64>,
) -> Option<Option<ErrorPayload>> {
    let res = match out {
        Outbound::Frame(env) => match encode_frame(&env, buf, max) {
            Err(FrameError::TooLarge { .. }) => encode_result_parts(*env, buf, max),
            other => other,
        },
        Outbound::Control(payload) => {
            let header = Header {
                id: ids.next(),
                ts: now_ms(),
                ..Header::default()
            };
            encode_with(buf, max, |w| payload.write_json(w, &header))
        }
        Outbound::Deliver(DeliverItem {
            msg,
            seq,
            attempt,
            session_id,
            raw,
            confirm,
        }) => {
            if confirm {
                written.push(msg.pos);
            }
            let header = Header {
                id: &msg.id,
                ts: msg.ts,
                from: Some(&msg.from),
                to: Some(&msg.to),
                topic: msg.topic.as_deref(),
                delivery: Some((seq, &session_id, attempt)),
            };
            encode_with(buf, max, |w| match &raw {
                Some(raw) => Envelope::write_deliver_json(w, &header, &**raw),
                None => Envelope::write_deliver_json(w, &header, &msg.payload),
            })
        }
        Outbound::Receipt {
            ack_id,
            status,
            recipients,
        } => {
            let header = Header {
                id: ids.next(),
                ts: now_ms(),
                ..Header::default()
            };
            let ack = Payload::Ack(relay_protocol::Ack {
                ack_id,
                seq: None,
                status: Some(status),
                recipients,
                state: None,
                cumulative: false,
                reason: None,
            });
            encode_with(buf, max, |w| ack.write_json(w, &header))
        }
        Outbound::Close(err) => return Some(err.map(|e| *e)),
    };
    if let Err(e) = res {
        // Our own frames are bounded below the limit by the body limit; log if not.
        tracing::error!(error = %e, "could not encode outbound frame");
    }
    None
}

/// DELIVERs written to a connection that does not acknowledge, waiting until its peer has
/// read them off the socket (`unread.rs`): only then do they count as acknowledged. What is
/// still here when the connection ends stays in flight, and is delivered again on the next
/// connection.
#[derive(Debug)]
struct Unread {
    /// Bytes written to the socket so far.
    written: u64,
    /// Per write holding such DELIVERs, oldest first: where in the byte stream it ended, and
    /// the positions it carried.
    batches: std::collections::VecDeque<(u64, Vec<i64>)>,
    /// When to look again while some are unread (doubling while the peer reads nothing).
    delay: Duration,
}

impl Default for Unread {
    fn default() -> Self {
        Self {
            written: 0,
            batches: std::collections::VecDeque::new(),
            delay: Self::FIRST_DELAY,
        }
    }
}

impl Unread {
    const FIRST_DELAY: Duration = Duration::from_millis(1);
    const MAX_DELAY: Duration = Duration::from_millis(100);

    /// Tells the router which DELIVERs the peer has read since the last look.
    async fn check(&mut self, wr: &OwnedWriteHalf, conn_id: u64, router: &mpsc::Sender<RouterMsg>) {
        let through = crate::unread::read_through(wr.as_ref(), self.written);
        let mut positions = Vec::new();
        while let Some((end, _)) = self.batches.front()
            && through.is_some_and(|t| *end <= t)
        {
            if let Some((_, p)) = self.batches.pop_front() {
                positions.extend(p);
            }
        }
        if positions.is_empty() {
            self.delay = (self.delay * 2).min(Self::MAX_DELAY);
            return;
        }
        self.delay = Self::FIRST_DELAY;
        if router
            .send(RouterMsg::Written { conn_id, positions })
            .await
            .is_err()
        {
            // The daemon is stopping: the deliveries stay unacknowledged in the store and
            // are sent again after restart (at least once beats lost).
            tracing::debug!(conn = conn_id, "router gone; read deliveries not confirmed");
        }
    }
}

/// A frame over the limit that answers a query: sent as several RESULT parts (or, over the
/// whole limit, as a `too_large` error), so the asker always gets an answer. Anything else
/// over the limit stays an error for the caller to log.
fn encode_result_parts(env: Envelope, buf: &mut Vec<u8>, max: usize) -> Result<(), FrameError> {
    let Payload::Result(result) = &env.payload else {
        return encode_frame(&env, buf, max);
    };
    let parts =
        relay_protocol::parts::split(result, env.id.len(), max).unwrap_or_else(|e| vec![*e]);
    tracing::debug!(id = %env.id, parts = parts.len(), "answer sent in parts");
    let start = buf.len();
    for part in parts {
        let piece = Envelope::new(env.id.clone(), env.ts, Payload::Result(part));
        if let Err(e) = encode_frame(&piece, buf, max) {
            // Cannot happen (parts are cut to fit); never leave half an answer queued.
            buf.truncate(start);
            return Err(e);
        }
    }
    Ok(())
}

async fn write_loop(
    mut wr: OwnedWriteHalf,
    mut rx: mpsc::Receiver<Outbound>,
    killer: Killer,
    max: usize,
    conn_id: u64,
    router: mpsc::Sender<RouterMsg>,
) {
    let mut ids = FrameIds::new(conn_id);
    // Positions of `confirm` DELIVERs in the batch being written.
    let mut written: Vec<i64> = Vec::new();
    // Those written and not yet read by the peer.
    let mut unread = Unread::default();
    // Grows to the largest batch written and shrinks back after a burst, so an idle
    // connection holds little (it is one of up to 10,000).
    let mut buf: Vec<u8> = Vec::new();
    let mut close: Option<Option<ErrorPayload>> = None;
    loop {
        let first = tokio::select! {
            biased;
            item = rx.recv() => item,
            () = killer.killed() => {
                close = Some(killer.reason());
                None
            }
            () = tokio::time::sleep(unread.delay), if !unread.batches.is_empty() => {
                unread.check(&wr, conn_id, &router).await;
                continue;
            }
        };
        let Some(first) = first else {
            // The queue closed; if the connection was cut short, still say why.
            if close.is_none() {
                close = killer.reason().map(Some);
            }
            break;
        };
        close = encode(first, &mut buf, max, &mut ids, &mut written);
        // Batch whatever else is ready into the same write. When little is ready, let the
        // other tasks run once first: under load the router queues more in the meantime, so
        // one write syscall carries many frames; when idle the yield returns at once.
        let mut yielded = false;
        while close.is_none() && buf.len() < 64 * 1024 {
            match rx.try_recv() {
                Ok(item) => close = encode(item, &mut buf, max, &mut ids, &mut written),
                Err(_) if !yielded && buf.len() < 4096 => {
                    yielded = true;
                    tokio::task::yield_now().await;
                }
                Err(_) => break,
            }
        }
        if let Err(e) = wr.write_all(&buf).await {
            // The peer is gone: what was in this batch was not written, stays in flight and
            // is replayed when the agent reconnects.
            tracing::debug!(conn = conn_id, error = %e, "write failed; connection closing");
            return;
        }
        unread.written += buf.len() as u64;
        buf.clear();
        if buf.capacity() > KEEP_WRITE_BUFFER {
            buf.shrink_to(KEEP_WRITE_BUFFER);
        }
        if !written.is_empty() {
            unread
                .batches
                .push_back((unread.written, std::mem::take(&mut written)));
            unread.delay = Unread::FIRST_DELAY;
        }
        if !unread.batches.is_empty() {
            unread.check(&wr, conn_id, &router).await;
        }
        if close.is_some() {
            break;
        }
    }
    if let Some(Some(err)) = close {
        encode(
            Outbound::Control(Box::new(Payload::Error(err))),
            &mut buf,
            max,
            &mut ids,
            &mut written,
        );
        if let Err(e) = wr.write_all(&buf).await {
            tracing::debug!(conn = conn_id, error = %e, "could not write the closing error");
        }
    }
    if let Err(e) = wr.shutdown().await {
        tracing::debug!(conn = conn_id, error = %e, "socket shutdown failed (peer already gone)");
    }
}
