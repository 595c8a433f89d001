//! The router: the single owner of who is connected, who subscribes to what, and where each
//! recipient's delivery stream stands.
//!
//! Connections send it [`RouterMsg`]s over one bounded channel; the store actor answers on one
//! FIFO channel. Nothing else touches routing state, so there are no locks.
//!
//! Per online agent the router keeps a *window* of DELIVERs sent but not acknowledged. While the
//! agent keeps up, messages go out live right after their commit. When the window fills, or when
//! the agent has just connected, the agent is *catching up*: new messages stay queued in the
//! store and the router loads them in pages, oldest first. Because the store reports in command
//! order, the page that comes back short (caught up) already includes everything committed
//! before it, and everything committed after it arrives as a live result: no gap, no duplicate.
//!
//! Acknowledgements move a per-recipient watermark: everything at or below
//! `min(in flight) - 1` (or the last sent position when nothing is in flight) is acked, and the
//! store records that as one range update per batch.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use relay_protocol::events::{RelayEvent, Watch, excerpt, excerpt_of};
use relay_protocol::file::{Durability, write_atomic};
use relay_protocol::query::{DeliveryStatus, QueryRequest, QueryResult};
use relay_protocol::{
    Ack, AckStatus, Budget, Busy, DeliveryState, Envelope, ErrorCode, ErrorPayload, Hello, Nack,
    NackCode, Payload, Role, Send, ServerInfo, TerminalReport, Welcome, topic_matches,
    validate_agent_name, validate_topic, validate_topic_pattern,
};
use relay_store::{
    AppendOutcome, DeadNotice, NewMessage, Recipient, RetryOutcome, StoredMessage, WriteOp,
    WriteResult,
};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::Config;
use crate::clock::now_ms;
use crate::feed::{Answer, Feed, LiveAgent, Subscription};
use crate::limits::{Hops, RateLimiter};
use crate::rules::Rules;
use crate::store_actor::{StoreCmd, StoreEvent};

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
    /// Tell the router once this DELIVER is written to the socket: for a connection that said
    /// `ack: false`, writing it is its acknowledgement (queued is not: a recipient that stops
    /// reading and leaves would lose what sat in its queue).
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
    /// The connection is gone.
    Unregister { conn_id: u64 },
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
    /// DELIVERs at these positions (asked with `confirm`) were written to the socket of a
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

/// Hop counts of this many recent replies are kept (and reloaded at start).
pub(crate) const HOPS_REMEMBERED: usize = 100_000;

/// Room a DELIVER's header needs beyond its payload (ids, names, topic, session, seq): a
/// payload larger than the frame limit less this is refused at SEND.
const DELIVER_HEADROOM: usize = 2048;

/// The name the daemon sends notices as; no agent or tool may use it (in any case).
pub(crate) const RELAY: &str = "relay";

/// Connection id of the daemon's own sends (notices, retries): answers to it go nowhere.
/// Connection ids start at 1.
const NO_CONN: u64 = 0;

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
    /// A SEND: acknowledge to the sender and deliver to the recipients.
    Send {
        conn_id: u64,
        env_id: String,
        recipients: Vec<String>,
        raw: Option<Raw>,
    },
}

/// The live record of the agent connection `conn_id` speaks for, with the agent's name;
/// `None` if it is gone or was taken over by a newer connection. (Over the two maps, not
/// `&mut self`, so that callers can still reach the router's other fields.)
fn online_mut<'a>(
    conns: &HashMap<u64, Conn>,
    agents: &'a mut HashMap<String, Agent>,
    conn_id: u64,
) -> Option<(String, &'a mut Online)> {
    let name = conns.get(&conn_id)?.name.clone();
    let on = agents
        .get_mut(&name)?
        .online
        .as_mut()
        .filter(|o| o.conn_id == conn_id)?;
    Some((name, on))
}

/// The store write an operator action (`dlq retry`, `dlq purge`) makes; `None` for a read.
fn admin_op(req: &QueryRequest) -> Option<WriteOp> {
    match req {
        QueryRequest::DlqRetry { dlq_id } => Some(WriteOp::Retry { dlq_id: *dlq_id }),
        QueryRequest::DlqPurge => Some(WriteOp::Purge),
        QueryRequest::ForgetAgent { name } => Some(WriteOp::ForgetAgent { name: name.clone() }),
        _ => None,
    }
}

/// Who a SEND is routed for.
#[derive(Debug)]
struct Origin {
    /// Where answers go ([`NO_CONN`] for the daemon's own).
    conn_id: u64,
    /// Sender name.
    from: String,
    /// Sender's session, if an online agent.
    session_id: Option<String>,
    /// Already past budgets and rate limits (a retried dead letter).
    checked: bool,
}

/// Context carried through the store with a query.
#[derive(Debug)]
pub(crate) struct QueryCtx {
    conn_id: u64,
    env_id: String,
    kind: QueryKind,
    /// Set for [`RouterMsg::Ask`]: the answer goes here instead of to a connection.
    reply: Option<oneshot::Sender<Answer>>,
}

#[derive(Debug, Clone, Copy)]
enum QueryKind {
    Status,
    Agents,
    Other,
}

#[derive(Debug)]
struct Conn {
    name: String,
    role: Role,
    tx: mpsc::Sender<Outbound>,
    killer: Killer,
    /// Stops this connection's `watch` forwarder when the connection goes.
    watch: Option<DropGuard>,
}

#[derive(Debug, PartialEq, Eq)]
enum Mode {
    /// Messages go out as soon as they are committed.
    Live,
    /// Messages wait in the store; `loading` while a page is being fetched.
    CatchUp { loading: bool },
}

#[derive(Debug)]
struct Online {
    conn_id: u64,
    /// How its wrapper last said the agent's terminal looks (a wrapped agent only).
    terminal: Option<TerminalReport>,
    /// When the live feed was last told of it, and whether a newer report waits to be told
    /// (at most one `agent_state` per [`STATE_EVERY`]; the rest on the next second's tick).
    terminal_told: Option<Instant>,
    terminal_pending: bool,
    tx: mpsc::Sender<Outbound>,
    killer: Killer,
    session_id: Arc<str>,
    resume_token: String,
    ack_required: bool,
    window: usize,
    mode: Mode,
    /// Highest position handed to the connection in this session.
    last_sent: i64,
    /// Sent, not yet acknowledged: position → (message id, seq).
    inflight: BTreeMap<i64, (String, u64)>,
    /// Highest watermark sent to the store.
    acked_through: i64,
    /// Stored for it while catching up and not yet loaded (approximate, for BUSY).
    backlog: u64,
    busy_told: HashMap<String, Instant>,
    /// Highest position recorded in the trace as handed to this session.
    traced_through: i64,
    /// When the first DELIVER after `traced_through` was written (none since: `None`).
    trace_since: Option<u64>,
    /// Failure reports in a row.
    failures: u32,
    /// The circuit breaker.
    circuit: Circuit,
}

/// A recipient's circuit breaker: after repeated failure reports its messages wait in the
/// store instead of being handed to an agent that cannot take them; after a cool-down one
/// message is tried (the probe), and its success closes the circuit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Circuit {
    Closed,
    Open { until: Instant, cooldown: Duration },
    HalfOpen { cooldown: Duration },
}

/// Longest cool-down of a circuit that keeps failing its probes.
const MAX_COOLDOWN: Duration = Duration::from_secs(600);

#[derive(Debug, Default)]
struct Agent {
    cli: Option<String>,
    topics: BTreeSet<String>,
    online: Option<Online>,
    connected_at: u64,
    /// Messages stored for it while offline since it last connected (approximate: counted
    /// from this daemon's start), for the high-water warning.
    offline_backlog: u64,
    /// Messages sent and received since the daemon started (for the dashboard).
    sent: u64,
    received: u64,
}

/// Why a DELIVER could not be queued.
struct SlowConsumer;

impl Online {
    /// The terminal report to tell the live feed at `now`: the newest one not yet told, unless
    /// one was told within [`STATE_EVERY`] (then a later call tells it: a client flipping its
    /// state cannot flood watchers and dashboards).
    fn terminal_due(&mut self, now: Instant) -> Option<TerminalReport> {
        let recently = self
            .terminal_told
            .is_some_and(|t| now.duration_since(t) < STATE_EVERY);
        if !self.terminal_pending || recently {
            return None;
        }
        self.terminal_pending = false;
        self.terminal_told = Some(now);
        self.terminal.clone()
    }

    fn can_send_live(&self) -> bool {
        self.mode == Mode::Live && self.inflight.len() < self.room_limit()
    }

    /// How many DELIVERs may be unacknowledged: the window, or none while the circuit is
    /// open, or one (the probe) while it is half open.
    fn room_limit(&self) -> usize {
        match self.circuit {
            Circuit::Closed => self.window,
            Circuit::Open { .. } => 0,
            Circuit::HalfOpen { .. } => 1,
        }
    }

    /// Counts a failure report; opens the circuit after `threshold` in a row (or again after
    /// a failed probe, for twice as long). True when it opened now.
    fn failed(&mut self, threshold: u32, cooldown: Duration, now: Instant) -> bool {
        self.failures += 1;
        let next = match self.circuit {
            Circuit::HalfOpen { cooldown } => (cooldown * 2).min(MAX_COOLDOWN),
            Circuit::Closed if threshold > 0 && self.failures >= threshold => cooldown,
            _ => return false,
        };
        self.circuit = Circuit::Open {
            until: now + next,
            cooldown: next,
        };
        if self.mode == Mode::Live {
            self.mode = Mode::CatchUp { loading: false };
        }
        true
    }

    /// A successful hand-over closes the circuit.
    fn succeeded(&mut self) -> bool {
        self.failures = 0;
        let was_probing = matches!(self.circuit, Circuit::HalfOpen { .. });
        self.circuit = Circuit::Closed;
        was_probing
    }

    /// Queues a DELIVER. `Ok(true)` when it is the first since the trace was last written
    /// (the caller marks the recipient for the next flush).
    fn dispatch(
        &mut self,
        msg: Arc<StoredMessage>,
        seq: u64,
        attempt: u32,
        raw: Option<Raw>,
    ) -> Result<bool, SlowConsumer> {
        let pos = msg.pos;
        let id = msg.id.clone();
        let item = DeliverItem {
            msg,
            seq,
            attempt,
            session_id: self.session_id.clone(),
            raw,
            confirm: !self.ack_required,
        };
        if self.tx.try_send(Outbound::Deliver(item)).is_err() {
            return Err(SlowConsumer);
        }
        if pos > self.last_sent && self.traced_through == self.last_sent {
            // The next trace range starts at what is really handed over now: a session's
            // first range would otherwise start at 0 and claim every earlier message as
            // delivered again (and its time as theirs).
            self.traced_through = pos - 1;
        }
        self.last_sent = self.last_sent.max(pos);
        // In flight until acknowledged, or for an `ack: false` connection until written.
        self.inflight.insert(pos, (id, seq));
        let first = self.trace_since.is_none();
        if first {
            self.trace_since = Some(now_ms());
        }
        Ok(first)
    }

    /// The trace range for what was handed out since the last one, if anything was.
    fn take_trace(&mut self, recipient: &str) -> Option<WriteOp> {
        let at = self.trace_since.take()?;
        if self.last_sent <= self.traced_through {
            return None;
        }
        let op = WriteOp::Sent {
            recipient: recipient.to_owned(),
            session_id: self.session_id.to_string(),
            after: self.traced_through,
            through: self.last_sent,
            at,
        };
        self.traced_through = self.last_sent;
        Some(op)
    }

    /// The position through which everything sent has been acknowledged.
    fn watermark(&self) -> i64 {
        match self.inflight.first_key_value() {
            Some((pos, _)) => pos - 1,
            None => self.last_sent,
        }
    }

    /// Finds the in-flight position of an acknowledged id; acks usually come in order, so the
    /// oldest entry is tried first.
    fn find(&self, id: &str, seq: Option<u64>) -> Option<i64> {
        let hit = |(_, (i, s)): &(&i64, &(String, u64))| i == id && seq.is_none_or(|q| q == *s);
        if let Some(first) = self.inflight.iter().next().filter(|e| hit(e)) {
            return Some(*first.0);
        }
        self.inflight.iter().find(|e| hit(e)).map(|(p, _)| *p)
    }
}

/// The router task's state.
pub(crate) struct Router {
    cfg: Arc<Config>,
    store: mpsc::Sender<StoreCmd>,
    conns: HashMap<u64, Conn>,
    agents: HashMap<String, Agent>,
    started: Instant,
    db_location: String,
    storage: String,
    /// Recipients whose acknowledgement watermark moved since the last flush to the store.
    dirty: std::collections::HashSet<String>,
    /// Events handled since the last flush.
    since_flush: u32,
    /// Membership changed since `agents.json` was last written. The file is rewritten at most
    /// once a second: rewriting it on every connect cost O(agents) each, and made connecting
    /// 10,000 agents quadratic (about 65 connections a second at the end).
    agents_changed: bool,
    /// Sliding-window rate limits.
    limiter: RateLimiter,
    /// Hop counts of recent replies.
    hops: Hops,
    /// Access rules in force.
    rules: Rules,
    /// The rules file's modification time and length when last read.
    rules_stamp: Option<(Option<std::time::SystemTime>, u64)>,
    /// Why the rules file could not be loaded, if it could not.
    rules_error: Option<String>,
    /// The live event feed and counters.
    feed: Feed,
}

/// How often the rules file is checked for changes.
const RULES_CHECK: Duration = Duration::from_secs(1);

/// At most one `agent_state` event per agent this often; a newer report waits for the next
/// [`RULES_CHECK`] tick.
const STATE_EVERY: Duration = Duration::from_millis(250);

/// Flush watermarks at least this often under sustained load (they are also flushed whenever
/// the router runs out of work).
const FLUSH_EVERY: u32 = 1024;

impl Router {
    pub(crate) fn new(
        cfg: Arc<Config>,
        store: mpsc::Sender<StoreCmd>,
        known: Vec<relay_store::KnownAgent>,
        recent_hops: Vec<(String, u32)>,
        db_location: String,
        storage: String,
        feed: Feed,
    ) -> Self {
        let mut hops = Hops::new(HOPS_REMEMBERED);
        // Newest first from the store; oldest first here so eviction order is kept.
        for (id, h) in recent_hops.into_iter().rev() {
            hops.record(&id, h);
        }
        let limiter = RateLimiter::new(cfg.rates.clone());
        let agents = known
            .into_iter()
            .map(|k| {
                (
                    k.name,
                    Agent {
                        topics: k.topics.into_iter().collect(),
                        ..Agent::default()
                    },
                )
            })
            .collect();
        Self {
            cfg,
            store,
            conns: HashMap::new(),
            agents,
            started: Instant::now(),
            db_location,
            storage,
            dirty: std::collections::HashSet::new(),
            since_flush: 0,
            agents_changed: false,
            limiter,
            hops,
            rules: Rules::default(),
            rules_stamp: None,
            rules_error: None,
            feed,
        }
    }

    /// Runs until `rx` closes or `shutdown` fires; then says BYE to every connection.
    pub(crate) async fn run(
        mut self,
        mut rx: mpsc::Receiver<RouterMsg>,
        mut events: mpsc::UnboundedReceiver<StoreEvent>,
        shutdown: CancellationToken,
        untold: Vec<DeadNotice>,
    ) {
        if !untold.is_empty() {
            tracing::info!(
                count = untold.len(),
                "telling senders about dead letters made before the last stop"
            );
        }
        self.notify(untold).await;
        // Not at once: after a restart, agents that were connected get a sweep interval to
        // come back before anything of theirs can expire.
        let mut sweep = tokio::time::interval_at(
            tokio::time::Instant::now() + self.cfg.sweep_interval,
            self.cfg.sweep_interval,
        );
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut rules_check = tokio::time::interval(RULES_CHECK);
        rules_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        self.write_agents_file();
        loop {
            tokio::select! {
                biased;
                Some(ev) = events.recv() => self.on_store_event(ev).await,
                msg = rx.recv() => match msg {
                    Some(m) => self.on_msg(m).await,
                    None => break,
                },
                _ = sweep.tick() => self.on_sweep().await,
                _ = rules_check.tick() => {
                    if std::mem::take(&mut self.agents_changed) {
                        self.write_agents_file();
                    }
                    self.reload_rules();
                    self.probe_circuits().await;
                    self.flush_terminal_states();
                }
                () = shutdown.cancelled() => break,
                // Lowest priority: runs only when nothing else is ready.
                () = std::future::ready(()), if !self.dirty.is_empty() => self.flush_watermarks().await,
            }
            self.since_flush += 1;
            if self.since_flush >= FLUSH_EVERY {
                self.flush_watermarks().await;
            }
        }
        self.flush_watermarks().await;
        for conn in self.conns.values() {
            let bye = Payload::Bye(relay_protocol::Bye {
                reason: Some("daemon shutting down".into()),
            });
            if conn.tx.try_send(Outbound::Control(Box::new(bye))).is_err()
                || conn.tx.try_send(Outbound::Close(None)).is_err()
            {
                conn.killer
                    .kill(ErrorCode::ShuttingDown, "daemon shutting down".into());
            }
        }
        let online: Vec<(String, Online)> = self
            .agents
            .iter_mut()
            .filter_map(|(name, a)| a.online.take().map(|o| (name.clone(), o)))
            .collect();
        for (name, on) in online {
            self.end_session(&name, &on).await;
        }
        self.write_agents_file();
    }

    async fn to_store(&self, cmd: StoreCmd) {
        if self.store.send(cmd).await.is_err() {
            tracing::error!("store actor is gone");
        }
    }

    async fn on_msg(&mut self, msg: RouterMsg) {
        match msg {
            RouterMsg::Register { conn, hello, reply } => {
                let res = self.register(conn, hello).await;
                if reply.send(res).is_err() {
                    // The connection went while registering: its Unregister follows.
                    tracing::debug!("connection gone before its HELLO was answered");
                }
            }
            RouterMsg::Unregister { conn_id } => self.unregister(conn_id).await,
            RouterMsg::Terminal { conn_id, report } => self.on_terminal(conn_id, report),
            RouterMsg::Send {
                conn_id,
                id,
                to,
                topic,
                payload,
                raw,
            } => {
                self.on_send(conn_id, id, to, topic, payload, raw).await;
            }
            RouterMsg::Ack { conn_id, ack } => {
                self.on_ack(conn_id, &ack.ack_id, ack.seq, ack.state, ack.cumulative)
                    .await;
            }
            RouterMsg::Nack { conn_id, nack } => {
                self.on_ack(
                    conn_id,
                    &nack.ack_id,
                    None,
                    Some(DeliveryState::Failed),
                    false,
                )
                .await;
            }
            RouterMsg::Written { conn_id, positions } => {
                self.on_written(conn_id, &positions).await;
            }
            RouterMsg::Subscribe {
                conn_id,
                id,
                pattern,
                on,
            } => {
                self.on_subscribe(conn_id, id, pattern, on).await;
            }
            RouterMsg::Query {
                conn_id,
                id,
                req: QueryRequest::Watch(filter),
            } => self.watch(conn_id, id, Watch::new(filter)),
            RouterMsg::Query { conn_id, id, req } => self.answer(conn_id, id, req, None).await,
            RouterMsg::Ask { req, reply } => {
                self.answer(NO_CONN, String::new(), req, Some(reply)).await;
            }
        }
    }

    /// A QUERY from a connection, or an in-process ask (`reply`): an operator action
    /// (`dlq retry`, `dlq purge`) goes to the store as a write and is answered once done;
    /// anything else is a read.
    async fn answer(
        &mut self,
        conn_id: u64,
        env_id: String,
        req: QueryRequest,
        reply: Option<oneshot::Sender<Answer>>,
    ) {
        if let QueryRequest::ForgetAgent { name } = &req {
            // Checked here, where the live state is: forgetting a connected agent would list
            // it offline while it talks.
            let refusal = match self.agents.get(name) {
                Some(a) if a.online.is_some() => Some((
                    "connected",
                    format!(
                        "{name} is connected; only an agent that is not can be forgotten \
                         (`agent-relay stop {name}` stops a wrapped agent)"
                    ),
                )),
                Some(_) => None,
                None => Some((
                    "not_found",
                    format!("no agent {name} is known (`agent-relay agents` lists them)"),
                )),
            };
            if let Some((code, message)) = refusal {
                let result = QueryResult::Error {
                    code: code.into(),
                    message,
                };
                self.answer_with(conn_id, env_id, reply, result);
                return;
            }
            // Gone from routing now: a broadcast no longer queues for it. Should it connect
            // again, its HELLO comes after this in the store's order and lists it again.
            self.agents.remove(name);
        }
        if let Some(op) = admin_op(&req) {
            let ctx = WriteCtx::Admin {
                conn_id,
                env_id,
                reply,
            };
            self.to_store(StoreCmd::Write(op, ctx)).await;
        } else {
            self.query(conn_id, env_id, req, reply).await;
        }
    }

    async fn query(
        &self,
        conn_id: u64,
        env_id: String,
        req: QueryRequest,
        reply: Option<oneshot::Sender<Answer>>,
    ) {
        let kind = match req {
            QueryRequest::Status => QueryKind::Status,
            QueryRequest::Agents => QueryKind::Agents,
            _ => QueryKind::Other,
        };
        let ctx = QueryCtx {
            conn_id,
            env_id,
            kind,
            reply,
        };
        self.to_store(StoreCmd::Query(req, ctx)).await;
    }

    /// Starts forwarding the feed to a connection that sent `QUERY watch`, as RESULT frames
    /// carrying the query's id, until the connection goes.
    fn watch(&mut self, conn_id: u64, env_id: String, filter: Watch) {
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        let stop = CancellationToken::new();
        // A second watch on the same connection replaces the first.
        conn.watch = Some(stop.clone().drop_guard());
        tokio::spawn(forward_feed(
            self.feed.subscribe(),
            filter,
            conn.tx.clone(),
            env_id,
            stop,
        ));
    }

    async fn register(
        &mut self,
        conn: ConnHandle,
        hello: Hello,
    ) -> Result<(), (ErrorCode, String)> {
        let session_id: Arc<str> = ulid::Ulid::new().to_string().into();
        let resume_token = format!("{:032x}", rand::random::<u128>());
        let mut resumed = false;
        // Reserved in any case: `Relay` would read as the relay's notices on every screen.
        if hello.agent.eq_ignore_ascii_case(RELAY) {
            return Err((
                ErrorCode::BadName,
                format!(
                    "the name {RELAY:?} is reserved for the relay's own notices; choose another"
                ),
            ));
        }
        let live = self
            .agents
            .get(&hello.agent)
            .and_then(|a| a.online.as_ref());
        if hello.role == Role::Agent
            && let Some(old) = live
        {
            if hello.resume_token.as_deref() != Some(old.resume_token.as_str()) {
                return Err((
                    ErrorCode::NameInUse,
                    format!(
                        "an agent named {:?} is already connected; choose another name or stop the other one",
                        hello.agent
                    ),
                ));
            }
            old.killer.kill(
                ErrorCode::NameInUse,
                "replaced by a new connection presenting this session's resume token".into(),
            );
            self.conns.remove(&old.conn_id);
            if let Some(old) = self
                .agents
                .get_mut(&hello.agent)
                .and_then(|a| a.online.take())
            {
                self.end_session(&hello.agent, &old).await;
            }
            resumed = true;
        }
        let welcome = Payload::Welcome(Welcome {
            session_id: session_id.to_string(),
            resume_token: resume_token.clone(),
            server: ServerInfo {
                max_frame_bytes: u32::try_from(self.cfg.max_frame_bytes).unwrap_or(u32::MAX),
                heartbeat_ms: u64::try_from(self.cfg.heartbeat.as_millis()).unwrap_or(u64::MAX),
            },
            resumed,
        });
        if conn
            .tx
            .try_send(Outbound::Control(Box::new(welcome)))
            .is_err()
        {
            return Err((ErrorCode::Internal, "connection queue unavailable".into()));
        }
        self.conns.insert(
            conn.id,
            Conn {
                name: hello.agent.clone(),
                role: hello.role,
                tx: conn.tx.clone(),
                killer: conn.killer.clone(),
                watch: None,
            },
        );
        if hello.role == Role::Client {
            return Ok(());
        }
        let window = (hello.capabilities.max_inflight as usize).clamp(1, self.cfg.max_window);
        let agent = self.agents.entry(hello.agent.clone()).or_default();
        agent.cli = hello.cli.clone();
        agent.connected_at = now_ms();
        agent.offline_backlog = 0;
        agent.online = Some(Online {
            conn_id: conn.id,
            terminal: None,
            terminal_told: None,
            terminal_pending: false,
            tx: conn.tx,
            killer: conn.killer,
            session_id: session_id.clone(),
            resume_token,
            ack_required: hello.capabilities.ack,
            window,
            mode: Mode::CatchUp { loading: true },
            last_sent: 0,
            inflight: BTreeMap::new(),
            acked_through: 0,
            backlog: 0,
            busy_told: HashMap::new(),
            traced_through: 0,
            trace_since: None,
            failures: 0,
            circuit: Circuit::Closed,
        });
        tracing::info!(agent = %hello.agent, cli = ?hello.cli, resumed, "agent connected");
        self.feed.counters.connects.add(1);
        self.feed.emit(|| RelayEvent::AgentConnected {
            ts: now_ms(),
            agent: hello.agent.clone(),
            cli: hello.cli.clone(),
            resumed,
        });
        self.to_store(StoreCmd::Write(
            WriteOp::AgentConnected {
                name: hello.agent.clone(),
                cli: hello.cli,
                session_id: session_id.to_string(),
            },
            WriteCtx::None,
        ))
        .await;
        // Replay whatever waits for it (offline inbox, unacknowledged deliveries).
        self.to_store(StoreCmd::TakePending {
            recipient: hello.agent,
            conn_id: conn.id,
            after: 0,
            limit: window,
        })
        .await;
        self.agents_changed = true;
        Ok(())
    }

    async fn unregister(&mut self, conn_id: u64) {
        let Some(conn) = self.conns.remove(&conn_id) else {
            return;
        };
        if conn.role == Role::Client {
            return;
        }
        let Some(agent) = self.agents.get_mut(&conn.name) else {
            return;
        };
        let Some(online) = agent.online.take_if(|o| o.conn_id == conn_id) else {
            return;
        };
        tracing::info!(agent = %conn.name, inflight = online.inflight.len(), "agent disconnected");
        self.end_session(&conn.name, &online).await;
        self.to_store(StoreCmd::Write(
            WriteOp::AgentDisconnected {
                name: conn.name,
                session_id: online.session_id.to_string(),
            },
            WriteCtx::None,
        ))
        .await;
        self.agents_changed = true;
    }

    fn reply(&self, conn_id: u64, payload: Payload) {
        if let Some(conn) = self.conns.get(&conn_id) {
            send_or_kill(&conn.tx, &conn.killer, Outbound::Control(Box::new(payload)));
        }
    }

    /// Acknowledges a SEND (or SUBSCRIBE) to its sender.
    fn receipt(&self, conn_id: u64, ack_id: String, status: AckStatus, recipients: Option<u32>) {
        if let Some(conn) = self.conns.get(&conn_id) {
            send_or_kill(
                &conn.tx,
                &conn.killer,
                Outbound::Receipt {
                    ack_id,
                    status,
                    recipients,
                },
            );
        }
    }

    fn nack(&self, conn_id: u64, ack_id: String, code: NackCode, reason: String) {
        self.feed.counters.refused.add(1);
        self.feed.emit(|| RelayEvent::Refused {
            ts: now_ms(),
            id: ack_id.clone(),
            from: self
                .conns
                .get(&conn_id)
                .map(|c| c.name.clone())
                .unwrap_or_default(),
            code: serde_json::to_value(code)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            reason: reason.clone(),
        });
        self.reply(
            conn_id,
            Payload::Nack(Nack {
                ack_id,
                code,
                reason,
            }),
        );
    }

    fn known_names(&self) -> String {
        let mut names: Vec<&str> = self.agents.keys().map(String::as_str).collect();
        names.sort_unstable();
        if names.is_empty() {
            return "no agents have connected yet".into();
        }
        let more = names.len().saturating_sub(20);
        names.truncate(20);
        let mut s = format!("known: {}", names.join(", "));
        if more > 0 {
            s.push_str(&format!(" and {more} more"));
        }
        s
    }

    /// Decides who gets a SEND.
    fn resolve(
        &self,
        from: &str,
        to: Option<&str>,
        topic: Option<&str>,
    ) -> Result<(String, Vec<String>), (NackCode, String)> {
        if let Some(t) = topic {
            validate_topic(t).map_err(|e| (NackCode::Invalid, format!("bad topic: {e}")))?;
        }
        match (to, topic) {
            (Some("*"), None) => {
                let names = self
                    .agents
                    .keys()
                    .filter(|n| n.as_str() != from)
                    .cloned()
                    .collect();
                Ok(("*".into(), names))
            }
            (None | Some("*"), Some(t)) => {
                let names = self
                    .agents
                    .iter()
                    .filter(|(n, a)| {
                        n.as_str() != from && a.topics.iter().any(|p| topic_matches(p, t))
                    })
                    .map(|(n, _)| n.clone())
                    .collect();
                Ok(("*".into(), names))
            }
            (Some(name), _) => {
                validate_agent_name(name)
                    .map_err(|e| (NackCode::Invalid, format!("bad recipient: {e}")))?;
                if !self.agents.contains_key(name) {
                    return Err((
                        NackCode::UnknownTarget,
                        format!("no agent named {name:?}; {}", self.known_names()),
                    ));
                }
                Ok((name.to_owned(), vec![name.to_owned()]))
            }
            (None, None) => Err((
                NackCode::Invalid,
                "SEND needs `to` (an agent name or \"*\") or a `topic`".into(),
            )),
        }
    }

    async fn on_send(
        &mut self,
        conn_id: u64,
        id: String,
        to: Option<String>,
        topic: Option<String>,
        payload: Send,
        raw: Option<Raw>,
    ) {
        let Some(conn) = self.conns.get(&conn_id) else {
            return;
        };
        // Ids are typed into terminals and printed by every command: only a safe alphabet.
        if let Err(e) = relay_protocol::text::validate_message_id(&id) {
            // The echo is cleaned: the id is what was hostile.
            let echo = relay_protocol::text::one_line(&id, 160);
            self.nack(conn_id, echo, NackCode::Invalid, e.to_string());
            return;
        }
        if payload.body.len() > self.cfg.max_body_bytes {
            let reason = format!(
                "body is {} bytes; the limit is {} bytes. Put long content in a file and send its path",
                payload.body.len(),
                self.cfg.max_body_bytes
            );
            self.nack(conn_id, id, NackCode::TooLarge, reason);
            return;
        }
        // The whole payload (unknown fields too) goes out again inside a DELIVER, whose
        // header is larger than the SEND's: refuse here what could not be delivered.
        let payload_len = raw.as_ref().map_or(payload.body.len(), |r| r.get().len());
        let deliverable = self.cfg.max_frame_bytes.saturating_sub(DELIVER_HEADROOM);
        if payload_len > deliverable {
            let reason = format!(
                "payload is {payload_len} bytes; a DELIVER must carry it within {} bytes. Put long content in a file and send its path",
                deliverable
            );
            self.nack(conn_id, id, NackCode::TooLarge, reason);
            return;
        }
        // A tool (`send --from NAME`) may not speak as an agent that is connected: only that
        // agent's own connection does, so a message shown as from Alice is from Alice.
        if conn.role == Role::Client
            && self
                .agents
                .get(&conn.name)
                .is_some_and(|a| a.online.is_some())
        {
            let reason = format!(
                "{name} is a connected agent, and only its own connection speaks as it; send as yourself (agent-relay send --from YOUR_NAME ...) or print the directive in {name}'s terminal",
                name = conn.name
            );
            self.nack(conn_id, id, NackCode::Forbidden, reason);
            return;
        }
        let from = conn.name.clone();
        let session_id = self
            .agents
            .get(&from)
            .and_then(|a| a.online.as_ref())
            .filter(|o| o.conn_id == conn_id)
            .map(|o| o.session_id.to_string());
        let origin = Origin {
            conn_id,
            from,
            session_id,
            checked: false,
        };
        self.route(origin, id, to, topic, payload, raw).await;
    }

    /// Resolves, checks (budget, rate limits) and stores a SEND. Refusals are answered with a
    /// NACK and kept in the dead-letter queue.
    async fn route(
        &mut self,
        origin: Origin,
        id: String,
        to: Option<String>,
        topic: Option<String>,
        mut payload: Send,
        mut raw: Option<Raw>,
    ) {
        let Origin {
            conn_id,
            from,
            session_id,
            checked,
        } = origin;
        let (to_name, mut names) = match self.resolve(&from, to.as_deref(), topic.as_deref()) {
            Ok(r) => r,
            Err((code, reason)) if conn_id == NO_CONN => {
                // The daemon's own send (a retried dead letter) has nobody to answer: it goes
                // back to the dead-letter queue rather than vanish.
                let message = NewMessage {
                    id,
                    from,
                    to: to.unwrap_or_else(|| "*".into()),
                    topic,
                    payload,
                    session_id,
                    recipients: Vec::new(),
                };
                let code = serde_json::to_value(code)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_else(|| "invalid".into());
                self.to_store(StoreCmd::Write(
                    WriteOp::Reject {
                        message: Box::new(message),
                        code,
                        reason,
                    },
                    WriteCtx::None,
                ))
                .await;
                return;
            }
            Err((code, reason)) => {
                self.nack(conn_id, id, code, reason);
                return;
            }
        };
        // Access rules: a denied recipient never gets it. A message every recipient is
        // denied is refused; a broadcast goes to the others, and each denied copy is
        // dead-lettered.
        let denied: Vec<String> = names
            .iter()
            .filter(|n| !self.rules.allows(&from, n))
            .cloned()
            .collect();
        if !denied.is_empty() {
            names.retain(|n| !denied.contains(n));
            let all = names.is_empty();
            for d in &denied {
                let reason = format!(
                    "an access rule forbids {from} to send to {d} (`agent-relay rules list`)"
                );
                if all && denied.len() == 1 {
                    self.nack(
                        conn_id,
                        id.clone(),
                        NackCode::Forbidden,
                        format!("{reason}; kept in the dead-letter queue"),
                    );
                }
                let message = NewMessage {
                    id: id.clone(),
                    from: from.clone(),
                    to: d.clone(),
                    topic: topic.clone(),
                    payload: payload.clone(),
                    session_id: session_id.clone(),
                    recipients: Vec::new(),
                };
                self.to_store(StoreCmd::Write(
                    WriteOp::Reject {
                        message: Box::new(message),
                        code: "forbidden".to_owned(),
                        reason,
                    },
                    WriteCtx::None,
                ))
                .await;
            }
            if all {
                if denied.len() > 1 {
                    self.nack(
                        conn_id,
                        id,
                        NackCode::Forbidden,
                        format!("access rules forbid {from} to send to any of {} (`agent-relay rules list`); kept in the dead-letter queue", denied.join(", ")),
                    );
                }
                return;
            }
        }
        // The daemon, not the sender, decides a message's hop count: a reply has one more
        // than what it answers; anything else starts a fresh chain.
        let hops = payload
            .in_reply_to
            .as_deref()
            .map_or(0, |parent| self.hops.reply_hops(parent));
        let budget = (hops > 0).then_some(Budget {
            hops,
            max_hops: self.cfg.max_hops,
            expires_at: None,
        });
        if payload.budget != budget {
            payload.budget = budget;
            // The DELIVER must carry the daemon's budget, not the sender's text.
            raw = None;
        }
        let refusal = if checked {
            None
        } else if hops > self.cfg.max_hops {
            Some((
                NackCode::BudgetExceeded,
                "budget_exceeded",
                format!(
                    "this reply would be hop {hops} of a chain of replies; the limit is {} (a relay started with `agent-relay up --max-hops N` allows more; the running one must be stopped first with `agent-relay down`). The chain is stopped so agents cannot answer each other forever; a person can start a new one",
                    self.cfg.max_hops
                ),
            ))
        } else {
            let direct = (names.len() == 1 && to_name != "*").then_some(to_name.as_str());
            self.limiter
                .check(&from, direct, now_ms())
                .err()
                .map(|r| (NackCode::RateLimited, "rate_limited", r.reason))
        };
        let new = NewMessage {
            id: id.clone(),
            from,
            to: to_name,
            topic,
            payload,
            session_id,
            recipients: names
                .iter()
                .map(|n| Recipient { name: n.clone() })
                .collect(),
        };
        if let Some((code, word, reason)) = refusal {
            tracing::info!(from = %new.from, to = %new.to, id = %id, code = word, "SEND refused; dead-lettered");
            self.nack(
                conn_id,
                id,
                code,
                format!("{reason} (kept in the dead-letter queue: `agent-relay dlq list`)"),
            );
            self.to_store(StoreCmd::Write(
                WriteOp::Reject {
                    message: Box::new(new),
                    code: word.to_owned(),
                    reason,
                },
                WriteCtx::None,
            ))
            .await;
            return;
        }
        self.to_store(StoreCmd::Write(
            WriteOp::Append(new),
            WriteCtx::Send {
                conn_id,
                env_id: id,
                recipients: names,
                raw,
            },
        ))
        .await;
    }

    /// Circuits whose cool-down is over go half open: one message is tried.
    async fn probe_circuits(&mut self) {
        let now = Instant::now();
        let mut due = Vec::new();
        for (name, a) in &mut self.agents {
            if let Some(on) = a.online.as_mut()
                && let Circuit::Open { until, cooldown } = on.circuit
                && until <= now
            {
                on.circuit = Circuit::HalfOpen { cooldown };
                due.push(name.clone());
            }
        }
        for name in due {
            tracing::info!(agent = %name, "circuit half open: trying one message");
            self.advance_watermark(&name).await;
        }
    }

    /// Loads the rules file if it changed. A file that does not parse leaves the rules in
    /// force as they were (and `status` says why).
    fn reload_rules(&mut self) {
        let Some(path) = &self.cfg.rules_file else {
            return;
        };
        let stamp = std::fs::metadata(path)
            .ok()
            .map(|m| (m.modified().ok(), m.len()));
        if stamp == self.rules_stamp {
            return;
        }
        self.rules_stamp = stamp;
        if stamp.is_none() {
            if !self.rules.rules.is_empty() {
                tracing::info!(path = %path.display(), "rules file removed: everything is allowed");
            }
            self.rules = Rules::default();
            self.rules_error = None;
            return;
        }
        let parsed = std::fs::read_to_string(path)
            .map_err(|e| e.to_string())
            .and_then(|t| Rules::parse(&t));
        match parsed {
            Ok(rules) => {
                tracing::info!(count = rules.rules.len(), path = %path.display(), "access rules loaded");
                self.rules = rules;
                self.rules_error = None;
            }
            Err(e) => {
                tracing::warn!(error = %e, path = %path.display(), "rules file is invalid; keeping the previous rules");
                self.rules_error = Some(format!("{}: {e}", path.display()));
            }
        }
    }

    /// Tells the senders of undelivered messages, with a message from [`RELAY`] stored in
    /// their inbox like any other (so an offline sender gets it when it comes back). Never for
    /// a notice, so notices cannot beget notices. Each is then marked told; one made just
    /// before a crash is told at the next start (`unnotified`), and because a notice's id is
    /// its dead letter's number, telling it twice stores it once.
    async fn notify(&mut self, notices: Vec<DeadNotice>) {
        for n in notices {
            let told = WriteOp::Notified { dlq_id: n.dlq_id };
            if n.from == RELAY || !self.agents.contains_key(&n.from) {
                self.to_store(StoreCmd::Write(told, WriteCtx::None)).await;
                continue;
            }
            let short = relay_protocol::short_id(&n.msg_id);
            let body = format!(
                "relay: your message [{short}] to {} was not delivered ({}): {}. It is dead letter {}; `agent-relay dlq retry {}` sends it again.",
                n.recipient, n.code, n.reason, n.dlq_id, n.dlq_id
            );
            let data = serde_json::json!({"relay_notice": {
                "msg_id": n.msg_id, "recipient": n.recipient, "code": n.code,
                "reason": n.reason, "dlq_id": n.dlq_id,
            }});
            let hops = self.hops.reply_hops(&n.msg_id);
            let payload = Send {
                kind: relay_protocol::Kind::Message,
                body,
                data: Some(data),
                thread: None,
                in_reply_to: Some(n.msg_id.clone()),
                budget: Some(Budget {
                    hops,
                    max_hops: self.cfg.max_hops,
                    expires_at: None,
                }),
                urgent: false,
            };
            let id = format!("dead-letter-{}", n.dlq_id);
            let new = NewMessage {
                id: id.clone(),
                from: RELAY.to_owned(),
                to: n.from.clone(),
                topic: None,
                payload,
                session_id: None,
                recipients: vec![Recipient {
                    name: n.from.clone(),
                }],
            };
            self.to_store(StoreCmd::Write(
                WriteOp::Append(new),
                WriteCtx::Send {
                    conn_id: NO_CONN,
                    env_id: id,
                    recipients: vec![n.from],
                    raw: None,
                },
            ))
            .await;
            // After the notice in command order, so at worst a crash repeats the notice
            // (stored once), never loses it.
            self.to_store(StoreCmd::Write(told, WriteCtx::None)).await;
        }
    }

    /// Answers `dlq retry` and `dlq purge` once the store has done them.
    async fn on_admin(
        &mut self,
        conn_id: u64,
        env_id: String,
        reply: Option<oneshot::Sender<Answer>>,
        res: Result<WriteResult, String>,
    ) {
        let result = match res {
            Ok(WriteResult::Purged(removed)) => QueryResult::DlqPurge { removed },
            Ok(WriteResult::Forgot(name)) => {
                self.write_agents_file();
                QueryResult::ForgetAgent { name }
            }
            Ok(WriteResult::Retried(o)) => self.retried(*o).await,
            Ok(other) => QueryResult::Error {
                code: "internal".into(),
                message: format!("unexpected store answer {other:?}"),
            },
            Err(e) => QueryResult::Error {
                code: "internal".into(),
                message: e,
            },
        };
        self.answer_with(conn_id, env_id, reply, result);
    }

    /// Sends `result` to whoever asked: the in-process `reply`, or the connection.
    fn answer_with(
        &self,
        conn_id: u64,
        env_id: String,
        reply: Option<oneshot::Sender<Answer>>,
        result: QueryResult,
    ) {
        if let Some(reply) = reply {
            // The asker may have gone (a closed page): nothing to tell then.
            if reply
                .send(Answer {
                    result,
                    live: Vec::new(),
                })
                .is_err()
            {
                tracing::debug!("the dashboard request that asked for this is gone");
            }
        } else if let Some(conn) = self.conns.get(&conn_id) {
            let env = Envelope::new(env_id, now_ms(), Payload::Result(result));
            send_or_kill(&conn.tx, &conn.killer, Outbound::Frame(Box::new(env)));
        }
    }

    /// Acts on a dead letter taken out of the queue, and says what was done.
    async fn retried(&mut self, outcome: RetryOutcome) -> QueryResult {
        match outcome {
            RetryOutcome::Requeued {
                recipient,
                delivery,
                entry,
            } => {
                let outcome = self.redeliver(&recipient, delivery).await;
                QueryResult::DlqRetry {
                    dead_letter: entry,
                    outcome,
                }
            }
            RetryOutcome::Resend { message, entry } => {
                let origin = Origin {
                    conn_id: NO_CONN,
                    from: message.from.clone(),
                    session_id: None,
                    checked: true,
                };
                let to = Some(message.to.clone()).filter(|t| t != "*" || message.topic.is_none());
                self.route(origin, message.id, to, message.topic, message.payload, None)
                    .await;
                QueryResult::DlqRetry {
                    outcome: format!(
                        "sent again as {} (past rate limits and budgets); `agent-relay trace {}` shows what became of it",
                        entry.from, entry.msg_id
                    ),
                    dead_letter: entry,
                }
            }
            RetryOutcome::AlreadyRetried(entry) => QueryResult::Error {
                code: "invalid".into(),
                message: format!(
                    "dead letter {} was already retried; `agent-relay trace {}` shows what became of it",
                    entry.dlq_id, entry.msg_id
                ),
            },
            RetryOutcome::NotFound => QueryResult::Error {
                code: "not_found".into(),
                message: "no such dead letter; `agent-relay dlq list` shows them".into(),
            },
        }
    }

    /// Hands a re-queued delivery to its recipient at once if it is online (it is below what
    /// the session has been sent, so paging would not find it); otherwise it waits in the
    /// inbox for the next connection.
    async fn redeliver(&mut self, recipient: &str, d: relay_store::PendingDelivery) -> String {
        let Some(on) = self
            .agents
            .get_mut(recipient)
            .and_then(|a| a.online.as_mut())
        else {
            return format!(
                "queued again for {recipient}, who is offline: it is delivered when {recipient} connects"
            );
        };
        let pos = d.message.pos;
        let session_id = on.session_id.to_string();
        match on.dispatch(d.message, d.seq, d.attempt, None) {
            Err(SlowConsumer) => {
                self.drop_slow(recipient).await;
                format!("queued again for {recipient}")
            }
            Ok(_) => {
                // Below the session's trace range: recorded on its own.
                self.to_store(StoreCmd::Write(
                    WriteOp::Sent {
                        recipient: recipient.to_owned(),
                        session_id,
                        after: pos - 1,
                        through: pos,
                        at: now_ms(),
                    },
                    WriteCtx::None,
                ))
                .await;
                self.dirty.insert(recipient.to_owned());
                format!("queued again for {recipient} and delivered (online)")
            }
        }
    }

    async fn on_store_event(&mut self, ev: StoreEvent) {
        match ev {
            StoreEvent::Written(
                WriteCtx::Send {
                    conn_id,
                    env_id,
                    recipients,
                    raw,
                },
                res,
            ) => {
                self.on_appended(conn_id, env_id, recipients, raw, res)
                    .await;
            }
            StoreEvent::Written(WriteCtx::None | WriteCtx::Notify, Err(e)) => {
                tracing::warn!(error = %e, "store write failed");
            }
            StoreEvent::Written(WriteCtx::None, Ok(_)) => {}
            StoreEvent::Written(WriteCtx::Notify, Ok(res)) => match res {
                WriteResult::Expired(notices) => {
                    let n = notices.len() as u64;
                    if n > 0 {
                        tracing::info!(
                            count = n,
                            "undelivered messages expired and dead-lettered; telling their senders"
                        );
                        self.feed.counters.expired.add(n);
                        self.feed.emit(|| RelayEvent::Expired {
                            ts: now_ms(),
                            deliveries: n,
                        });
                    }
                    self.notify(notices).await;
                }
                WriteResult::DeadLettered(notices) => {
                    if !notices.is_empty() {
                        tracing::info!(
                            count = notices.len(),
                            "undelivered messages dead-lettered; telling their senders"
                        );
                    }
                    self.notify(notices).await;
                }
                _ => {}
            },
            StoreEvent::Written(
                WriteCtx::Admin {
                    conn_id,
                    env_id,
                    reply,
                },
                res,
            ) => {
                self.on_admin(conn_id, env_id, reply, res).await;
            }
            StoreEvent::Pending {
                recipient,
                conn_id,
                deliveries,
                limit,
            } => {
                self.on_pending(recipient, conn_id, deliveries, limit).await;
            }
            StoreEvent::Query(ctx, result, stats, figures) => {
                self.on_query_result(*ctx, result.map(|r| *r), stats, figures);
            }
        }
    }

    async fn on_appended(
        &mut self,
        conn_id: u64,
        env_id: String,
        recipients: Vec<String>,
        raw: Option<Raw>,
        res: Result<WriteResult, String>,
    ) {
        let outcome = match res {
            Ok(WriteResult::Appended(o)) => o,
            Ok(other) => {
                tracing::error!(?other, "append answered with a non-append result");
                self.nack(
                    conn_id,
                    env_id,
                    NackCode::Unavailable,
                    "internal error; retry".into(),
                );
                return;
            }
            Err(e) => {
                self.nack(
                    conn_id,
                    env_id,
                    NackCode::Unavailable,
                    format!("the message could not be stored ({e}); nothing was delivered; retry"),
                );
                return;
            }
        };
        let (message, seqs) = match outcome {
            AppendOutcome::Duplicate { .. } => {
                self.feed.counters.duplicates.add(1);
                self.receipt(conn_id, env_id, AckStatus::Duplicate, None);
                return;
            }
            AppendOutcome::Stored { message, seqs } => (message, seqs),
        };
        if let Some(b) = &message.payload.budget {
            self.hops.record(&message.id, b.hops);
        }
        self.feed.counters.accepted.add(1);
        self.feed.emit(|| {
            let (body, truncated) = excerpt(&message.payload.body);
            RelayEvent::Accepted {
                ts: message.ts,
                id: message.id.clone(),
                pos: message.pos,
                from: message.from.clone(),
                to: message.to.clone(),
                topic: message.topic.clone(),
                kind: message.payload.kind,
                thread: message.payload.thread.clone(),
                body,
                truncated,
                recipients: recipients.clone(),
            }
        });
        if let Some(sender) = self.agents.get_mut(&message.from) {
            sender.sent += 1;
        }
        let mut any_online = false;
        let mut busy: Vec<(String, u64)> = Vec::new();
        let mut slow: Vec<String> = Vec::new();
        for (name, seq) in recipients.iter().zip(seqs) {
            let Some(agent) = self.agents.get_mut(name) else {
                continue;
            };
            agent.received += 1;
            let Some(on) = agent.online.as_mut() else {
                // An offline inbox passing the high-water mark: warn once per crossing and
                // tell the sender, as for an online recipient far behind.
                agent.offline_backlog += 1;
                if agent.offline_backlog == self.cfg.busy_high_water {
                    tracing::warn!(
                        agent = %name,
                        pending = agent.offline_backlog,
                        "an offline agent's inbox passed the high-water mark; its messages wait (and expire after the inbox TTL)"
                    );
                    busy.push((name.clone(), agent.offline_backlog));
                }
                continue;
            };
            any_online = true;
            if on.can_send_live() {
                match on.dispatch(message.clone(), seq, 1, raw.clone()) {
                    Err(SlowConsumer) => slow.push(name.clone()),
                    Ok(dirty) => {
                        if dirty {
                            self.dirty.insert(name.clone());
                        }
                        self.feed.counters.delivered.add(1);
                        self.feed.emit(|| delivered_event(&message, name, seq, 1));
                    }
                }
            } else {
                if on.mode == Mode::Live {
                    on.mode = Mode::CatchUp { loading: false };
                }
                on.backlog += 1;
                if on.backlog >= self.cfg.busy_high_water {
                    let sender = self
                        .conns
                        .get(&conn_id)
                        .map(|c| c.name.clone())
                        .unwrap_or_default();
                    let told = on
                        .busy_told
                        .get(&sender)
                        .is_some_and(|t| t.elapsed() < Duration::from_secs(1));
                    if !told {
                        on.busy_told.insert(sender, Instant::now());
                        busy.push((name.clone(), on.backlog));
                    }
                }
            }
        }
        let status = if recipients.is_empty() || any_online {
            AckStatus::Accepted
        } else {
            AckStatus::Queued
        };
        self.receipt(
            conn_id,
            env_id,
            status,
            Some(u32::try_from(recipients.len()).unwrap_or(u32::MAX)),
        );
        for (target, pending) in busy {
            tracing::warn!(%target, pending, "recipient is far behind; telling sender BUSY");
            self.reply(
                conn_id,
                Payload::Busy(Busy {
                    retry_after_ms: 1000,
                    target: Some(target),
                    pending,
                }),
            );
        }
        for name in slow {
            self.drop_slow(&name).await;
        }
    }

    async fn drop_slow(&mut self, name: &str) {
        if let Some(on) = self.agents.get_mut(name).and_then(|a| a.online.take()) {
            tracing::warn!(agent = %name, "connection does not read its frames: closing it (its messages stay queued)");
            on.killer.kill(
                ErrorCode::SlowConsumer,
                "this connection did not read its frames; reconnect to receive the queued messages"
                    .into(),
            );
            self.end_session(name, &on).await;
        }
    }

    /// Records what an ending session had been handed without acknowledging: its acknowledged
    /// watermark, and one more attempt for everything it held above it. Everything at or below
    /// `last_sent` was handed out (live and catch-up sends both go in position order).
    async fn end_session(&mut self, name: &str, on: &Online) {
        self.feed.emit(|| RelayEvent::AgentDisconnected {
            ts: now_ms(),
            agent: name.to_owned(),
        });
        self.dirty.remove(name);
        if let Some(at) = on.trace_since
            && on.last_sent > on.traced_through
        {
            self.to_store(StoreCmd::Write(
                WriteOp::Sent {
                    recipient: name.to_owned(),
                    session_id: on.session_id.to_string(),
                    after: on.traced_through,
                    through: on.last_sent,
                    at,
                },
                WriteCtx::None,
            ))
            .await;
        }
        let through = on.watermark();
        if through > on.acked_through {
            self.to_store(StoreCmd::Write(
                WriteOp::AckThrough {
                    recipient: name.to_owned(),
                    through,
                },
                WriteCtx::None,
            ))
            .await;
        }
        if on.last_sent > through {
            self.to_store(StoreCmd::Write(
                WriteOp::HandedOut {
                    recipient: name.to_owned(),
                    after: through,
                    through: on.last_sent,
                },
                WriteCtx::None,
            ))
            .await;
        }
    }

    async fn on_pending(
        &mut self,
        recipient: String,
        conn_id: u64,
        deliveries: Result<Vec<relay_store::PendingDelivery>, String>,
        limit: usize,
    ) {
        let Some(on) = self
            .agents
            .get_mut(&recipient)
            .and_then(|a| a.online.as_mut())
            .filter(|o| o.conn_id == conn_id)
        else {
            return;
        };
        let deliveries = match deliveries {
            Ok(d) => d,
            Err(e) => {
                tracing::error!(error = %e, %recipient, "could not load queued messages; will retry");
                on.mode = Mode::CatchUp { loading: false };
                return;
            }
        };
        let n = deliveries.len();
        let mut slow = false;
        // The circuit may have opened while the page was loading: what is left waits.
        let mut held = false;
        for d in deliveries {
            if d.message.pos <= on.last_sent {
                continue;
            }
            if on.inflight.len() >= on.room_limit() {
                held = true;
                break;
            }
            let event = self
                .feed
                .watched()
                .then(|| delivered_event(&d.message, &recipient, d.seq, d.attempt));
            match on.dispatch(d.message, d.seq, d.attempt, None) {
                Err(SlowConsumer) => {
                    slow = true;
                    break;
                }
                Ok(dirty) => {
                    if dirty {
                        self.dirty.insert(recipient.clone());
                    }
                    self.feed.counters.delivered.add(1);
                    if let Some(ev) = event {
                        self.feed.emit(|| ev);
                    }
                }
            }
        }
        on.backlog = on.backlog.saturating_sub(n as u64);
        if n < limit && !held {
            on.mode = Mode::Live;
            on.backlog = 0;
        } else {
            on.mode = Mode::CatchUp { loading: false };
        }
        if slow {
            self.drop_slow(&recipient).await;
            return;
        }
        self.advance_watermark(&recipient).await;
    }

    async fn on_ack(
        &mut self,
        conn_id: u64,
        ack_id: &str,
        seq: Option<u64>,
        state: Option<DeliveryState>,
        cumulative: bool,
    ) {
        let Some((name, on)) = online_mut(&self.conns, &mut self.agents, conn_id) else {
            return;
        };
        let failed = state == Some(DeliveryState::Failed);
        let opened = if failed {
            on.failed(
                self.cfg.breaker_failures,
                self.cfg.breaker_cooldown,
                Instant::now(),
            )
        } else {
            on.succeeded();
            false
        };
        if opened {
            tracing::warn!(
                agent = %name,
                failures = on.failures,
                "circuit open: the agent keeps failing to take messages; they wait in its inbox until a probe succeeds"
            );
        }
        let Some(pos) = on.find(ack_id, seq) else {
            // A later state (verified, failed) of a message already acknowledged as injected.
            let status = match state {
                Some(DeliveryState::Failed) => DeliveryStatus::Failed,
                Some(DeliveryState::Verified) => DeliveryStatus::Verified,
                Some(DeliveryState::Injected) | None => {
                    tracing::debug!(agent = %name, ack_id, "ACK for nothing in flight (already acknowledged?)");
                    return;
                }
            };
            // Verified means it was injected, and that acknowledgement may still wait in the
            // watermark (range updates are committed after other writes): record it first,
            // so the trace keeps both. (It changes nothing if it is already stored.)
            if status == DeliveryStatus::Verified {
                self.to_store(StoreCmd::Write(
                    WriteOp::MarkById {
                        recipient: name.clone(),
                        msg_id: ack_id.to_owned(),
                        status: DeliveryStatus::Acked,
                    },
                    WriteCtx::None,
                ))
                .await;
            }
            self.to_store(StoreCmd::Write(
                WriteOp::MarkById {
                    recipient: name,
                    msg_id: ack_id.to_owned(),
                    status,
                },
                WriteCtx::Notify,
            ))
            .await;
            return;
        };
        // Below the watermark already written (a retried dead letter): the range update will
        // not come back down for it.
        let below = pos <= on.acked_through;
        let (range, single) = if cumulative {
            // Everything delivered on this connection up to `pos` (deliveries go out in
            // position order).
            let rest = on.inflight.split_off(&(pos + 1));
            (Some(std::mem::replace(&mut on.inflight, rest)), None)
        } else {
            (None, on.inflight.remove_entry(&pos))
        };
        let n_acked = range.as_ref().map_or(1, BTreeMap::len);
        let status = match state {
            Some(DeliveryState::Failed) => Some(DeliveryStatus::Failed),
            Some(DeliveryState::Verified) => Some(DeliveryStatus::Verified),
            Some(DeliveryState::Injected) | None => below.then_some(DeliveryStatus::Acked),
        };
        let counters = &self.feed.counters;
        counters.acked.add(n_acked as u64);
        if status == Some(DeliveryStatus::Failed) {
            counters.failed.add(1);
        }
        if self.feed.watched() {
            let ts = now_ms();
            for (p, (id, _)) in range.into_iter().flatten().chain(single) {
                // A state other than plain acknowledgement applies to `ack_id` only.
                let state = status.filter(|_| p == pos).unwrap_or(DeliveryStatus::Acked);
                self.feed.emit(|| RelayEvent::Acked {
                    ts,
                    id,
                    pos: p,
                    recipient: name.clone(),
                    state,
                });
            }
        }
        if let Some(status) = status {
            self.to_store(StoreCmd::Write(
                WriteOp::SetStatus {
                    recipient: name.clone(),
                    pos,
                    status,
                },
                WriteCtx::Notify,
            ))
            .await;
        }
        self.advance_watermark(&name).await;
    }

    /// DELIVERs written to the socket of a connection that does not acknowledge: that is
    /// their acknowledgement. (What was queued but never written stays in flight, and
    /// `end_session` leaves it pending for the next connection.)
    async fn on_written(&mut self, conn_id: u64, positions: &[i64]) {
        let Some((name, on)) = online_mut(&self.conns, &mut self.agents, conn_id) else {
            return;
        };
        if on.ack_required {
            return;
        }
        let watched = self.feed.watched();
        let ts = now_ms();
        let mut below = Vec::new();
        let mut n = 0u64;
        for &pos in positions {
            let Some((id, _)) = on.inflight.remove(&pos) else {
                continue;
            };
            n += 1;
            // Below the watermark already written (a retried dead letter): the range update
            // will not come back down for it.
            if pos <= on.acked_through {
                below.push(pos);
            }
            if watched {
                self.feed.emit(|| RelayEvent::Acked {
                    ts,
                    id,
                    pos,
                    recipient: name.clone(),
                    state: DeliveryStatus::Acked,
                });
            }
        }
        self.feed.counters.acked.add(n);
        for pos in below {
            self.to_store(StoreCmd::Write(
                WriteOp::SetStatus {
                    recipient: name.clone(),
                    pos,
                    status: DeliveryStatus::Acked,
                },
                WriteCtx::None,
            ))
            .await;
        }
        self.advance_watermark(&name).await;
    }

    /// Notes a moved acknowledgement watermark (written to the store in the next flush) and
    /// loads the next page when catching up.
    async fn advance_watermark(&mut self, name: &str) {
        let Some(on) = self.agents.get_mut(name).and_then(|a| a.online.as_mut()) else {
            return;
        };
        if on.watermark() > on.acked_through && !self.dirty.contains(name) {
            self.dirty.insert(name.to_owned());
        }
        let room = on.room_limit();
        if on.mode == (Mode::CatchUp { loading: false })
            && on.inflight.len() < room
            && (room < on.window || on.inflight.len() <= on.window / 2)
        {
            on.mode = Mode::CatchUp { loading: true };
            let cmd = StoreCmd::TakePending {
                recipient: name.to_owned(),
                conn_id: on.conn_id,
                after: on.last_sent,
                limit: room - on.inflight.len(),
            };
            self.to_store(cmd).await;
        }
    }

    /// Writes every moved watermark: one range update per recipient instead of one write per
    /// acknowledgement.
    async fn flush_watermarks(&mut self) {
        self.since_flush = 0;
        let dirty: Vec<String> = self.dirty.drain().collect();
        for name in dirty {
            let Some(on) = self.agents.get_mut(&name).and_then(|a| a.online.as_mut()) else {
                continue;
            };
            let trace = on.take_trace(&name);
            let through = on.watermark();
            if let Some(op) = trace {
                self.to_store(StoreCmd::Write(op, WriteCtx::None)).await;
            }
            let Some(on) = self.agents.get_mut(&name).and_then(|a| a.online.as_mut()) else {
                continue;
            };
            if through > on.acked_through {
                on.acked_through = through;
                self.to_store(StoreCmd::Write(
                    WriteOp::AckThrough {
                        recipient: name,
                        through,
                    },
                    WriteCtx::None,
                ))
                .await;
            }
        }
    }

    async fn on_subscribe(&mut self, conn_id: u64, id: String, pattern: Option<String>, on: bool) {
        let Some(conn) = self.conns.get(&conn_id) else {
            return;
        };
        if conn.role != Role::Agent {
            self.nack(
                conn_id,
                id,
                NackCode::Invalid,
                "only agents can subscribe to topics".into(),
            );
            return;
        }
        let Some(pattern) = pattern else {
            self.nack(
                conn_id,
                id,
                NackCode::Invalid,
                "SUBSCRIBE needs a topic pattern in `topic`".into(),
            );
            return;
        };
        if let Err(e) = validate_topic_pattern(&pattern) {
            self.nack(
                conn_id,
                id,
                NackCode::Invalid,
                format!("bad topic pattern: {e}"),
            );
            return;
        }
        let name = conn.name.clone();
        if let Some(agent) = self.agents.get_mut(&name) {
            if on {
                agent.topics.insert(pattern.clone());
            } else {
                agent.topics.remove(&pattern);
            }
        }
        let op = if on {
            WriteOp::Subscribe {
                agent: name,
                pattern,
            }
        } else {
            WriteOp::Unsubscribe {
                agent: name,
                pattern,
            }
        };
        self.to_store(StoreCmd::Write(op, WriteCtx::None)).await;
        self.receipt(conn_id, id, AckStatus::Accepted, None);
        self.agents_changed = true;
    }

    fn on_query_result(
        &self,
        mut ctx: QueryCtx,
        result: Option<QueryResult>,
        stats: relay_store::Stats,
        delivery: Option<Box<relay_protocol::query::DeliveryFigures>>,
    ) {
        let result = match (ctx.kind, result) {
            (QueryKind::Status, None) => QueryResult::Status(relay_protocol::query::StatusInfo {
                running: true,
                pid: std::process::id(),
                socket: self.cfg.socket_path.display().to_string(),
                db: self.db_location.clone(),
                storage: self.storage.clone(),
                uptime_s: self.started.elapsed().as_secs(),
                agents: self.agents.values().filter(|a| a.online.is_some()).count() as u64,
                known_agents: self.agents.len() as u64,
                messages: stats.messages,
                pending: stats.pending,
                version: env!("CARGO_PKG_VERSION").to_owned(),
                rules: self.rules.rules.len() as u64,
                rules_error: self.rules_error.clone(),
                delivery: delivery.map(|d| *d),
            }),
            (QueryKind::Agents, Some(QueryResult::Agents { mut agents })) => {
                for a in &mut agents {
                    if let Some(live) = self.agents.get(&a.name) {
                        a.online = live.online.is_some();
                        a.topics = live.topics.iter().cloned().collect();
                    }
                }
                agents.sort_by(|a, b| b.online.cmp(&a.online).then_with(|| a.name.cmp(&b.name)));
                QueryResult::Agents { agents }
            }
            (_, Some(r)) => r,
            (_, None) => QueryResult::Error {
                code: "internal".into(),
                message: "no answer".into(),
            },
        };
        if let Some(reply) = ctx.reply.take() {
            let live = match (&result, ctx.kind) {
                (QueryResult::Agents { .. }, QueryKind::Agents) => self.live_agents(),
                _ => Vec::new(),
            };
            if reply.send(Answer { result, live }).is_err() {
                tracing::debug!("the dashboard request that asked for this is gone");
            }
            return;
        }
        if let Some(conn) = self.conns.get(&ctx.conn_id) {
            // RESULT answers carry the question's id in `id` so the client can match them.
            let env = Envelope::new(ctx.env_id, now_ms(), Payload::Result(result));
            send_or_kill(&conn.tx, &conn.killer, Outbound::Frame(Box::new(env)));
        }
    }

    fn live_agents(&self) -> Vec<LiveAgent> {
        self.agents
            .iter()
            .map(|(name, a)| LiveAgent {
                name: name.clone(),
                sent: a.sent,
                received: a.received,
                inflight: a.online.as_ref().map_or(0, |o| o.inflight.len() as u64),
                terminal: a.online.as_ref().and_then(|o| o.terminal.clone()),
            })
            .collect()
    }

    /// A wrapper's report of its agent's terminal: kept while it is connected, and told to
    /// the live feed when it changes.
    fn on_terminal(&mut self, conn_id: u64, mut report: TerminalReport) {
        let Some((name, on)) = online_mut(&self.conns, &mut self.agents, conn_id) else {
            return;
        };
        // Shown on a dashboard and in `watch`: short, whatever a client sends.
        report.backend = excerpt_of(&report.backend, 16).0;
        report.why = report.why.map(|w| excerpt_of(&w, 120).0);
        if on.terminal.as_ref() == Some(&report) {
            return;
        }
        on.terminal = Some(report);
        on.terminal_pending = true;
        if let Some(report) = on.terminal_due(Instant::now()) {
            self.emit_terminal(name, report);
        }
    }

    /// Tells the live feed the reports held back by [`STATE_EVERY`] (from the 1 s tick).
    fn flush_terminal_states(&mut self) {
        let now = Instant::now();
        let due: Vec<(String, TerminalReport)> = self
            .agents
            .iter_mut()
            .filter_map(|(name, a)| Some((name.clone(), a.online.as_mut()?.terminal_due(now)?)))
            .collect();
        for (name, report) in due {
            self.emit_terminal(name, report);
        }
    }

    fn emit_terminal(&self, agent: String, report: TerminalReport) {
        self.feed.emit(|| RelayEvent::AgentState {
            ts: now_ms(),
            agent,
            backend: report.backend,
            state: report.state,
            why: report.why,
        });
    }

    async fn on_sweep(&mut self) {
        let except: Vec<String> = self
            .agents
            .iter()
            .filter(|(_, a)| a.online.is_some())
            .map(|(n, _)| n.clone())
            .collect();
        let ttl = u64::try_from(self.cfg.inbox_ttl.as_millis()).unwrap_or(u64::MAX);
        let queued_before = now_ms().saturating_sub(ttl);
        tracing::trace!(queued_before, online = except.len(), "expiry sweep");
        self.to_store(StoreCmd::Write(
            WriteOp::Expire {
                queued_before,
                except,
            },
            WriteCtx::Notify,
        ))
        .await;
    }

    /// Writes `agents.json` atomically (temp file + rename). Called on membership changes only:
    /// never per message or heartbeat.
    fn write_agents_file(&self) {
        let Some(path) = &self.cfg.agents_file else {
            return;
        };
        let mut names: Vec<&String> = self.agents.keys().collect();
        names.sort();
        let doc = serde_json::json!({
            "agents": names.iter().map(|name| {
                let a = &self.agents[*name];
                serde_json::json!({
                    "name": name, "cli": a.cli, "online": a.online.is_some(),
                    "connected_at": a.online.as_ref().map(|_| a.connected_at),
                    "topics": a.topics,
                })
            }).collect::<Vec<_>>(),
        });
        // No fsync: this runs on the router thread, and the file is rewritten at every start.
        match write_atomic(path, doc.to_string().as_bytes(), Durability::ProcessCrash) {
            Ok(()) => tracing::trace!(agents = names.len(), "agents.json written"),
            Err(e) => {
                tracing::warn!(error = %e, path = %path.display(), "could not write agents.json");
            }
        }
    }
}

fn delivered_event(msg: &StoredMessage, recipient: &str, seq: u64, attempt: u32) -> RelayEvent {
    RelayEvent::Delivered {
        ts: now_ms(),
        id: msg.id.clone(),
        pos: msg.pos,
        recipient: recipient.to_owned(),
        seq,
        attempt,
    }
}

/// Forwards feed events that pass `filter` to a watching connection until `stop` fires (the
/// connection went) or the daemon stops. A watcher that does not read only blocks this task;
/// it then misses events and is told how many.
async fn forward_feed(
    mut sub: Subscription,
    mut filter: Watch,
    tx: mpsc::Sender<Outbound>,
    query_id: String,
    stop: CancellationToken,
) {
    loop {
        let ev = tokio::select! {
            ev = sub.recv() => ev,
            () = stop.cancelled() => None,
        };
        let Some(ev) = ev else { break };
        if !filter.admits(&ev) {
            continue;
        }
        let result = QueryResult::Event {
            event: (*ev).clone(),
        };
        let env = Envelope::new(query_id.clone(), now_ms(), Payload::Result(result));
        let sent = tokio::select! {
            r = tx.send(Outbound::Frame(Box::new(env))) => r.is_ok(),
            () = stop.cancelled() => false,
        };
        if !sent {
            break;
        }
    }
}

/// Queues a control frame; a connection whose queue is full does not read and is closed.
fn send_or_kill(tx: &mpsc::Sender<Outbound>, killer: &Killer, out: Outbound) {
    if tx.try_send(out).is_err() {
        killer.kill(
            ErrorCode::SlowConsumer,
            "this connection did not read its frames; reconnect (unacknowledged SENDs are safe to re-send)".into(),
        );
    }
}
