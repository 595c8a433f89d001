//! The routing core: every decision the router makes, as plain functions of (state, input,
//! now), with no `await`, no clock and no file.
//!
//! [`Core`] owns who is connected, who subscribes to what, where each recipient's delivery
//! stream stands, the circuit breakers, the hop counts, the rate limiters and the access rules
//! in force. Its entry points (`register`, `on_send`, `on_appended`, `on_ack`, `on_pending`,
//! `tick`, `sweep`, ...) take the time as a [`Now`] and leave their effects behind as data:
//! store commands in [`Core::take_commands`] (the shell in `router.rs` sends them to the store
//! thread in order), frames queued on the connections' channels (a `try_send`, never a wait;
//! a full queue is the slow-consumer decision, taken here), and live-feed events and counters
//! (built only while someone watches).
//!
//! Per online agent the core keeps a *window* of DELIVERs sent but not acknowledged. While the
//! agent keeps up, messages go out live right after their commit. When the window fills, or when
//! the agent has just connected, the agent is *catching up*: new messages stay queued in the
//! store and the core asks for them in pages, oldest first. Because the store reports in
//! command order, the page that comes back short (caught up) already includes everything
//! committed before it, and everything committed after it arrives as a live result: no gap, no
//! duplicate.
//!
//! Acknowledgements move a per-recipient watermark: everything at or below
//! `min(in flight) - 1` (or the last sent position when nothing is in flight) is acked, and the
//! store records that as one range update per batch.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use relay_protocol::events::{RelayEvent, excerpt, excerpt_of};
use relay_protocol::query::{AgentState, DeliveryStatus, QueryResult};
use relay_protocol::{
    AckStatus, Budget, Busy, DeliveryState, ErrorCode, Hello, Nack, NackCode, Payload, Role, Send,
    ServerInfo, TerminalReport, TerminalState, Welcome, topic_matches, validate_agent_name,
    validate_topic, validate_topic_pattern,
};
use relay_store::{
    AppendOutcome, DeadNotice, NewMessage, Recipient, RetryOutcome, StoredMessage, WriteOp,
    WriteResult,
};
use tokio::sync::mpsc;
use tokio_util::sync::DropGuard;

use crate::Config;
use crate::feed::Feed;
use crate::limits::{Hops, RateLimiter};
use crate::msg::{
    ConnHandle, DeliverItem, Killer, LiveAgent, Outbound, Raw, StoreCmd, StoreEvent, WriteCtx,
};
use crate::rules::Rules;

mod claims;
pub(crate) use claims::ClaimAnswer;
mod names;
mod spawn;

#[cfg(test)]
mod harness;
#[cfg(test)]
mod model;
#[cfg(test)]
mod tests;

/// The time an entry point runs at: the monotonic instant (circuit breakers, rate of state
/// events, BUSY) and the wall clock in Unix ms (stored and shown times, rate limits, expiry).
/// The shell reads both once per input; tests make them up.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Now {
    /// Monotonic time.
    pub(crate) at: Instant,
    /// Unix ms.
    pub(crate) ms: u64,
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
pub(crate) const NO_CONN: u64 = 0;

/// Why a reply over the hop budget is refused, and how a person lets the chain go on: short
/// enough to reach an agent whole in a notice (issue 24.8).
fn budget_reason(hops: u32, max_hops: u32, thread: Option<&str>) -> String {
    let go_on = match thread {
        Some(t) => format!(
            "to go on, a person runs `agent-relay chain extend {t} 10` (no restart) or starts a new message"
        ),
        None => "to go on, a person starts a new message".to_owned(),
    };
    format!(
        "this reply would be hop {hops} of a chain of replies; the limit is {max_hops}, so agents cannot answer each other forever; {go_on}"
    )
}

/// Whether `chain extend THREAD HOPS` makes sense: a thread id (the id alphabet) and 1 to
/// 1,000 replies more.
pub(crate) fn check_extension(thread: &str, hops: u32) -> Result<(), String> {
    relay_protocol::text::validate_message_id(thread).map_err(|e| {
        format!(
            "thread {:?}: {e}",
            relay_protocol::text::one_line(thread, 64)
        )
    })?;
    if !(1..=1000).contains(&hops) {
        return Err(format!("extend by 1 to 1000 replies, not {hops}"));
    }
    Ok(())
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

/// A SEND as a connection submitted it.
#[derive(Debug)]
pub(crate) struct Submitted {
    /// The envelope id (the sender's message id).
    pub(crate) id: String,
    /// An agent name, `*`, or none (with a topic).
    pub(crate) to: Option<String>,
    /// The topic, if any.
    pub(crate) topic: Option<String>,
    /// The payload.
    pub(crate) payload: Send,
    /// The payload's JSON text as received, written again as is when delivering live.
    pub(crate) raw: Option<Raw>,
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

#[derive(Debug)]
struct Conn {
    name: String,
    role: Role,
    /// The node a federation stand-in's connection stands for (its `cli` is
    /// `remote@<node>`); `None` for this relay's own clients and agents.
    remote_node: Option<String>,
    tx: mpsc::Sender<Outbound>,
    killer: Killer,
    /// Stops this connection's `watch` forwarder (the shell's task) when the connection goes.
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
    /// When its terminal entered its current state (Unix ms; connecting counts).
    state_since: u64,
    /// When the deliveries now in flight began to be handed over (Unix ms; meaningful while
    /// `inflight` is not empty).
    handing_since: u64,
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

/// The node a federation stand-in stands for: its `cli` is `remote@<node>` (what
/// `relay-federation` says in its HELLO; this crate does not depend on that one).
fn remote_node(cli: Option<&str>) -> Option<&str> {
    cli.and_then(|c| c.strip_prefix("remote@"))
}

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
    /// When it last sent, was handed a message or changed state (Unix ms; 0: not since
    /// this daemon started).
    activity: u64,
    /// The thread of the message it last sent or was handed (a message that starts one: its
    /// id).
    thread: Option<String>,
}

/// Why a DELIVER could not be queued.
struct SlowConsumer;

/// What an agent is doing, from what the daemon holds of its session: offline without one;
/// busy while messages are being handed to it (delivered, not yet acknowledged) and its
/// terminal shows nothing worse; else its wrapper's last report of its terminal (idle for a
/// client without a wrapper). Returns the state, since when, and why.
fn team_state(online: Option<&Online>) -> (AgentState, Option<u64>, Option<String>) {
    let Some(on) = online else {
        return (AgentState::Offline, None, None);
    };
    let handing = (on.inflight.len(), on.handing_since);
    let (state, since, why) = state_of(on.terminal.as_ref(), on.state_since, handing);
    (state, Some(since), why)
}

/// [`team_state`] of a connected agent, pure: its wrapper's report (if any) and when its
/// state began, and how many deliveries are in flight since when.
fn state_of(
    terminal: Option<&TerminalReport>,
    state_since: u64,
    (inflight, handing_since): (usize, u64),
) -> (AgentState, u64, Option<String>) {
    let (state, why) = match terminal {
        Some(t) => (
            match t.state {
                TerminalState::Idle => AgentState::Idle,
                TerminalState::Busy => AgentState::Busy,
                TerminalState::Blocked => AgentState::Blocked,
            },
            t.why.clone(),
        ),
        None => (AgentState::Idle, None),
    };
    if state == AgentState::Idle && inflight > 0 {
        let s = if inflight == 1 { "" } else { "s" };
        let why = format!("{inflight} message{s} being handed over");
        return (AgentState::Busy, handing_since, Some(why));
    }
    (state, state_since, why)
}

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
        now_ms: u64,
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
        if self.inflight.is_empty() {
            self.handing_since = now_ms;
        }
        // In flight until acknowledged, or for an `ack: false` connection until written.
        self.inflight.insert(pos, (id, seq));
        let first = self.trace_since.is_none();
        if first {
            self.trace_since = Some(now_ms);
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

/// The routing state and its decisions. See the module documentation.
pub(crate) struct Core {
    cfg: Arc<Config>,
    conns: HashMap<u64, Conn>,
    agents: HashMap<String, Agent>,
    /// Every name in `agents`, lowercased, to its spelling there (names that differ only by
    /// case are one name: `names.rs`).
    folded: HashMap<String, String>,
    /// Replies more than `max_hops` that a person allowed a thread's chain
    /// (`agent-relay chain extend`; stored, loaded at start).
    chains: HashMap<String, u32>,
    /// Spawned workers by name, ended ones too (`spawn.rs`; the store's `spawned`).
    spawned: HashMap<String, relay_protocol::query::SpawnRecord>,
    /// (sender, recipient) pairs whose sender was told that the recipient has not connected
    /// yet, while the daemon runs: spares the store a notice it would refuse as a duplicate.
    /// The store keeps the promise across restarts (the notice's id is the pair's).
    told_not_yet: HashSet<(String, String)>,
    /// Claims held (a mirror of the store's, loaded at start) and recent edits (issue 25.7).
    claims: claims::ClaimBook,
    /// The store writes of the claim query being answered (see [`Core::on_claim_query`]).
    claim_writes: Vec<WriteOp>,
    /// Recipients whose acknowledgement watermark moved since the last flush to the store.
    dirty: HashSet<String>,
    /// Membership changed since `agents.json` was last written (the shell writes it at most
    /// once a second: rewriting it on every connect cost O(agents) each, and made connecting
    /// 10,000 agents quadratic).
    agents_changed: bool,
    /// Sliding-window rate limits.
    limiter: RateLimiter,
    /// Hop counts of recent replies.
    hops: Hops,
    /// Access rules in force.
    rules: Rules,
    /// Why the rules file could not be loaded, if it could not.
    rules_error: Option<String>,
    /// The live event feed and counters.
    feed: Feed,
    /// Store commands decided and not yet taken by the shell, in order.
    out: Vec<StoreCmd>,
    /// The time of the entry point running.
    now: Now,
}

/// At most one `agent_state` event per agent this often; a newer report waits for the next
/// [`Core::tick`].
const STATE_EVERY: Duration = Duration::from_millis(250);

impl Core {
    /// The state at start: the agents the store knows (offline, with their subscriptions), the
    /// hop counts of recent replies (newest first, as the store gives them) and the rules.
    pub(crate) fn new(
        cfg: Arc<Config>,
        feed: Feed,
        known: Vec<relay_store::KnownAgent>,
        recent_hops: Vec<(String, u32)>,
        rules: Rules,
        now: Now,
    ) -> Self {
        let mut hops = Hops::new(HOPS_REMEMBERED);
        // Newest first from the store; oldest first here so eviction order is kept.
        for (id, h) in recent_hops.into_iter().rev() {
            hops.record(&id, h);
        }
        let limiter = RateLimiter::new(cfg.rates.clone());
        let agents: HashMap<String, Agent> = known
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
        let mut folded = HashMap::with_capacity(agents.len());
        for name in agents.keys() {
            folded
                .entry(name.to_ascii_lowercase())
                .or_insert_with(|| name.clone());
        }
        Self {
            cfg,
            conns: HashMap::new(),
            agents,
            folded,
            chains: HashMap::new(),
            spawned: HashMap::new(),
            told_not_yet: HashSet::new(),
            claims: claims::ClaimBook::default(),
            claim_writes: Vec::new(),
            dirty: HashSet::new(),
            agents_changed: false,
            limiter,
            hops,
            rules,
            rules_error: None,
            feed,
            out: Vec::new(),
            now,
        }
    }

    /// Queues a store command (the shell sends it).
    fn store(&mut self, cmd: StoreCmd) {
        self.out.push(cmd);
    }

    /// Queues a store command decided by the shell (a query), after those already decided.
    pub(crate) fn push_command(&mut self, cmd: StoreCmd) {
        self.out.push(cmd);
    }

    /// The store commands decided since the last call, in the order they must be sent.
    pub(crate) fn take_commands(&mut self) -> std::vec::Drain<'_, StoreCmd> {
        self.out.drain(..)
    }

    /// A HELLO that passed validation: registers the connection, queues WELCOME (with the
    /// fresh `session_id` and `resume_token` the shell drew; an agent's once the store has it
    /// as known, [`WriteCtx::Welcome`]) and, for an agent, asks the store for what waits for
    /// it. A second connection for a connected agent's name is refused
    /// unless it presents that session's resume token (then it takes over).
    pub(crate) fn register(
        &mut self,
        conn: ConnHandle,
        hello: Hello,
        session_id: Arc<str>,
        resume_token: String,
        now: Now,
    ) -> Result<(), (ErrorCode, String)> {
        self.now = now;
        let mut resumed = false;
        let person_door = hello.cli.as_deref() == Some(relay_protocol::PERSON_CLI);
        self.may_take(&hello.agent, hello.role, conn.in_process, person_door)?;
        let holder = self.agents.get(&hello.agent);
        let live = holder.and_then(|a| a.online.as_ref());
        if hello.role == Role::Agent
            && let Some(old) = live
        {
            if hello.resume_token.as_deref() != Some(old.resume_token.as_str()) {
                // A federation stand-in holds it: the name is an agent's of another node.
                let message = match holder.and_then(|a| remote_node(a.cli.as_deref())) {
                    Some(node) => format!(
                        "the name {:?} is held by node {node} in the federation (an agent of that node has it); choose another name",
                        hello.agent
                    ),
                    None => format!(
                        "an agent named {:?} is already connected; choose another name or stop the other one",
                        hello.agent
                    ),
                };
                return Err((ErrorCode::NameInUse, message));
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
                self.end_session(&hello.agent, &old);
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
        // A tool connection is welcomed at once; an agent once it is stored as known (below).
        if hello.role == Role::Client
            && conn
                .tx
                .try_send(Outbound::Control(Box::new(welcome.clone())))
                .is_err()
        {
            return Err((ErrorCode::Internal, "connection queue unavailable".into()));
        }
        self.conns.insert(
            conn.id,
            Conn {
                name: hello.agent.clone(),
                role: hello.role,
                remote_node: remote_node(hello.cli.as_deref()).map(str::to_owned),
                tx: conn.tx.clone(),
                killer: conn.killer.clone(),
                watch: None,
            },
        );
        if hello.role == Role::Client {
            return Ok(());
        }
        let window = (hello.capabilities.max_inflight as usize).clamp(1, self.cfg.max_window);
        self.fold_in(&hello.agent);
        let agent = self.agents.entry(hello.agent.clone()).or_default();
        agent.cli = hello.cli.clone();
        agent.connected_at = self.now.ms;
        agent.activity = self.now.ms;
        agent.offline_backlog = 0;
        agent.online = Some(Online {
            conn_id: conn.id,
            terminal: None,
            state_since: self.now.ms,
            handing_since: self.now.ms,
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
            ts: self.now.ms,
            agent: hello.agent.clone(),
            cli: hello.cli.clone(),
            resumed,
        });
        self.store(StoreCmd::Write(
            WriteOp::AgentConnected {
                name: hello.agent.clone(),
                cli: hello.cli,
                session_id: session_id.to_string(),
            },
            WriteCtx::Welcome {
                conn_id: conn.id,
                welcome: Box::new(welcome),
            },
        ));
        // Replay whatever waits for it (offline inbox, unacknowledged deliveries).
        self.store(StoreCmd::TakePending {
            recipient: hello.agent,
            conn_id: conn.id,
            after: 0,
            limit: window,
        });
        self.agents_changed = true;
        Ok(())
    }

    /// The connection is gone: its session ends.
    pub(crate) fn unregister(&mut self, conn_id: u64, now: Now) {
        self.now = now;
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
        self.end_session(&conn.name, &online);
        self.store(StoreCmd::Write(
            WriteOp::AgentDisconnected {
                name: conn.name,
                session_id: online.session_id.to_string(),
            },
            WriteCtx::None,
        ));
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
            ts: self.now.ms,
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
                // A known agent, a person, or a name not seen yet (it waits): `names.rs`.
                self.admit_recipient(name)?;
                Ok((name.to_owned(), vec![name.to_owned()]))
            }
            (None, None) => Err((
                NackCode::Invalid,
                "SEND needs `to` (an agent name or \"*\") or a `topic`".into(),
            )),
        }
    }

    /// A SEND from connection `conn_id`: admission (id, size, who may speak as whom), then
    /// [`Core::route`]. Refusals are NACKed; an accepted SEND becomes a store append.
    pub(crate) fn on_send(&mut self, conn_id: u64, send: Submitted, now: Now) {
        self.now = now;
        let Submitted {
            id,
            to,
            topic,
            payload,
            raw,
        } = send;
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
        if names::is_relay_id(&id) {
            let reason = format!(
                "ids starting with {} are the relay's own notices'; nothing was stored; send again with a new id (a ULID)",
                names::RELAY_ID_PREFIXES.join(", ")
            );
            self.nack(conn_id, id, NackCode::Invalid, reason);
            return;
        }
        // A thread is printed in every header a model reads (`(thread T)`): the id rules, so
        // that it cannot carry a line break, an escape sequence or a header of its own.
        if let Some(thread) = &payload.thread
            && let Err(e) = relay_protocol::text::validate_message_id(thread)
        {
            let reason = format!(
                "thread {:?}: {e}; a thread is the id of its first message",
                relay_protocol::text::one_line(thread, 40)
            );
            self.nack(conn_id, id, NackCode::Invalid, reason);
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
        // A person's adapters connection is the exception: the person at the terminal who
        // runs `agent-relay send` is that person.
        if conn.role == Role::Client
            && self.agents.get(&conn.name).is_some_and(|a| {
                a.online.is_some() && a.cli.as_deref() != Some(relay_protocol::PERSON_CLI)
            })
        {
            let reason = format!(
                "{name} is a connected agent, and only its own connection speaks as it; send as yourself (agent-relay send --from YOUR_NAME ...) or print the directive in {name}'s terminal",
                name = conn.name
            );
            self.nack(conn_id, id, NackCode::Forbidden, reason);
            return;
        }
        if conn.role == Role::Client
            && let Err(reason) = self.may_sign(&conn.name)
        {
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
        self.route(origin, id, to, topic, payload, raw);
    }

    /// Resolves, checks (budget, rate limits) and stores a SEND. Refusals are answered with a
    /// NACK and kept in the dead-letter queue.
    fn route(
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
                    queued_at: None,
                };
                let code = serde_json::to_value(code)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_else(|| "invalid".into());
                self.store(StoreCmd::Write(
                    WriteOp::Reject {
                        message: Box::new(message),
                        code,
                        reason,
                    },
                    WriteCtx::None,
                ));
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
        let from_node = self
            .conns
            .get(&conn_id)
            .and_then(|c| c.remote_node.as_deref())
            .or(self.cfg.node.as_deref());
        let denied: Vec<String> = names
            .iter()
            .filter(|n| {
                let to_node = self
                    .agents
                    .get(n.as_str())
                    .and_then(|a| remote_node(a.cli.as_deref()))
                    .or(self.cfg.node.as_deref());
                !self.rules.allows_at((&from, from_node), (n, to_node))
            })
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
                    queued_at: None,
                };
                self.store(StoreCmd::Write(
                    WriteOp::Reject {
                        message: Box::new(message),
                        code: "forbidden".to_owned(),
                        reason,
                    },
                    WriteCtx::None,
                ));
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
        // A stand-in's SEND (a message from another node of a federation) carries when the
        // message expires there: its time to live runs from its acceptance on its origin node,
        // not again from now (time spent in an outbox while NATS was away counts).
        let expires_at = payload
            .budget
            .as_ref()
            .and_then(|b| b.expires_at)
            .filter(|_| {
                self.conns
                    .get(&conn_id)
                    .is_some_and(|c| c.remote_node.is_some())
            });
        let ttl = u64::try_from(self.cfg.inbox_ttl.as_millis()).unwrap_or(u64::MAX);
        // Never later than a message accepted here now would expire: a connection that calls
        // itself a stand-in can shorten its own message's life, not lengthen it.
        let expires_at = expires_at.map(|e| e.min(self.now.ms.saturating_add(ttl)));
        let queued_at = expires_at.map(|e| e.saturating_sub(ttl));
        let max_hops = self.max_hops_in(payload.thread.as_deref());
        let budget = (hops > 0 || expires_at.is_some()).then_some(Budget {
            hops,
            max_hops,
            expires_at,
        });
        if payload.budget != budget {
            payload.budget = budget;
            // The DELIVER must carry the daemon's budget, not the sender's text.
            raw = None;
        }
        let refusal = if checked {
            None
        } else if hops > max_hops {
            Some((
                NackCode::BudgetExceeded,
                "budget_exceeded",
                budget_reason(hops, max_hops, payload.thread.as_deref()),
            ))
        } else {
            let direct = (names.len() == 1 && to_name != "*").then_some(to_name.as_str());
            self.limiter
                .check(&from, direct, self.now.ms)
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
            queued_at,
        };
        if let Some((code, word, reason)) = refusal {
            tracing::info!(from = %new.from, to = %new.to, id = %id, code = word, "SEND refused; dead-lettered");
            self.nack(
                conn_id,
                id,
                code,
                format!("{reason} (kept in the dead-letter queue: `agent-relay dlq list`)"),
            );
            self.store(StoreCmd::Write(
                WriteOp::Reject {
                    message: Box::new(new),
                    code: word.to_owned(),
                    reason,
                },
                WriteCtx::None,
            ));
            return;
        }
        self.store(StoreCmd::Write(
            WriteOp::Append(new),
            WriteCtx::Send {
                conn_id,
                env_id: id,
                recipients: names,
                raw,
            },
        ));
    }

    /// Circuits whose cool-down is over go half open: one message is tried.
    fn probe_circuits(&mut self) {
        let now = self.now.at;
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
            self.advance_watermark(&name);
        }
    }

    /// Tells the senders of undelivered messages, with a message from [`RELAY`] stored in
    /// their inbox like any other (so an offline sender gets it when it comes back). Never for
    /// a notice, so notices cannot beget notices. Each is then marked told; one made just
    /// before a crash is told at the next start (`unnotified`), and because a notice's id is
    /// its dead letter's number, telling it twice stores it once.
    pub(crate) fn notify(&mut self, notices: Vec<DeadNotice>) {
        for n in notices {
            let told = WriteOp::Notified { dlq_id: n.dlq_id };
            if n.from == RELAY || !self.agents.contains_key(&n.from) {
                self.store(StoreCmd::Write(told, WriteCtx::None));
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
            let id = format!("dead-letter-{}", n.dlq_id);
            self.relay_notice(n.from, id, Some(&n.msg_id), body, data);
            // After the notice in command order, so at worst a crash repeats the notice
            // (stored once), never loses it.
            self.store(StoreCmd::Write(told, WriteCtx::None));
        }
    }

    /// Stores a message from [`RELAY`] to `to` about its message `about` (an answer to it, in
    /// its chain; `None`: about no message of theirs, as a claim's or a worker's notice),
    /// delivered like any other. `id` names the notice so that telling it twice
    /// stores it once.
    fn relay_notice(
        &mut self,
        to: String,
        id: String,
        about: Option<&str>,
        body: String,
        data: serde_json::Value,
    ) {
        // A notice about no message (a claim, a spawned worker) starts no chain.
        let hops = about.map_or(0, |a| self.hops.reply_hops(a));
        let payload = Send {
            kind: relay_protocol::Kind::Message,
            body,
            data: Some(data),
            thread: None,
            in_reply_to: about.map(str::to_owned),
            budget: Some(Budget {
                hops,
                max_hops: self.cfg.max_hops,
                expires_at: None,
            }),
            urgent: false,
        };
        let new = NewMessage {
            id: id.clone(),
            from: RELAY.to_owned(),
            to: to.clone(),
            topic: None,
            payload,
            session_id: None,
            recipients: vec![Recipient { name: to.clone() }],
            queued_at: None,
        };
        self.store(StoreCmd::Write(
            WriteOp::Append(new),
            WriteCtx::Send {
                conn_id: NO_CONN,
                env_id: id,
                recipients: vec![to],
                raw: None,
            },
        ));
    }

    /// The chain of `thread` may run `extra` replies beyond `max_hops` (its stored extension
    /// in all); returns its limit now.
    pub(crate) fn chain_extended(&mut self, thread: String, extra: u32) -> u32 {
        self.chains.insert(thread, extra);
        self.cfg.max_hops.saturating_add(extra)
    }

    /// The hop limit of a message in `thread`: the relay's, plus what a person allowed it.
    fn max_hops_in(&self, thread: Option<&str>) -> u32 {
        let extra = thread.and_then(|t| self.chains.get(t)).copied();
        self.cfg.max_hops.saturating_add(extra.unwrap_or(0))
    }

    /// Acts on a dead letter taken out of the queue, and says what was done.
    pub(crate) fn retried(&mut self, outcome: RetryOutcome, now: Now) -> QueryResult {
        self.now = now;
        match outcome {
            RetryOutcome::Requeued {
                recipient,
                delivery,
                entry,
            } => {
                let outcome = self.redeliver(&recipient, delivery);
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
                self.route(origin, message.id, to, message.topic, message.payload, None);
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
    fn redeliver(&mut self, recipient: &str, d: relay_store::PendingDelivery) -> String {
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
        match on.dispatch(d.message, d.seq, d.attempt, None, self.now.ms) {
            Err(SlowConsumer) => {
                self.drop_slow(recipient);
                format!("queued again for {recipient}")
            }
            Ok(_) => {
                // Below the session's trace range: recorded on its own.
                self.store(StoreCmd::Write(
                    WriteOp::Sent {
                        recipient: recipient.to_owned(),
                        session_id,
                        after: pos - 1,
                        through: pos,
                        at: self.now.ms,
                    },
                    WriteCtx::None,
                ));
                self.dirty.insert(recipient.to_owned());
                format!("queued again for {recipient} and delivered (online)")
            }
        }
    }

    /// A result from the store thread. Operator actions and query answers concern the shell
    /// (they answer through channels the core does not hold): those are handed back.
    pub(crate) fn on_store_event(&mut self, ev: StoreEvent, now: Now) -> Option<StoreEvent> {
        self.now = now;
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
                self.on_appended(conn_id, env_id, recipients, raw, res);
            }
            StoreEvent::Written(WriteCtx::None | WriteCtx::Notify, Err(e)) => {
                tracing::warn!(error = %e, "store write failed");
            }
            StoreEvent::Written(WriteCtx::None, Ok(_)) => {}
            // Before any DELIVER of the catch-up: the store answers its TakePending after
            // this write, and live messages wait for the catch-up.
            StoreEvent::Written(WriteCtx::Welcome { conn_id, welcome }, Ok(_)) => {
                self.reply(conn_id, *welcome);
            }
            StoreEvent::Written(WriteCtx::Welcome { conn_id, .. }, Err(e)) => {
                if let Some(conn) = self.conns.get(&conn_id) {
                    conn.killer.kill(
                        ErrorCode::Internal,
                        format!("the relay could not record this agent ({e}); connect again"),
                    );
                }
            }
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
                            ts: self.now.ms,
                            deliveries: n,
                        });
                    }
                    self.notify(notices);
                }
                WriteResult::DeadLettered(notices) => {
                    if !notices.is_empty() {
                        tracing::info!(
                            count = notices.len(),
                            "undelivered messages dead-lettered; telling their senders"
                        );
                    }
                    self.notify(notices);
                }
                _ => {}
            },
            StoreEvent::Pending {
                recipient,
                conn_id,
                deliveries,
                limit,
            } => {
                self.on_pending(recipient, conn_id, deliveries, limit);
            }
            ev @ (StoreEvent::Written(WriteCtx::Admin { .. } | WriteCtx::Answer { .. }, _)
            | StoreEvent::Query(..)) => {
                return Some(ev);
            }
        }
        None
    }

    /// The once-a-second tick: circuits whose cool-down is over go half open, and terminal
    /// reports held back by [`STATE_EVERY`] are told.
    pub(crate) fn tick(&mut self, now: Now) {
        self.now = now;
        self.probe_circuits();
        self.flush_terminal_states();
        self.expire_claims();
    }

    /// Whether acknowledgement watermarks moved since the last [`Core::flush_watermarks`].
    pub(crate) fn has_dirty(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// Whether membership changed since the last call (`agents.json` is then rewritten).
    pub(crate) fn take_agents_changed(&mut self) -> bool {
        std::mem::take(&mut self.agents_changed)
    }

    /// The access rules now in force, and why the file could not be read if it could not
    /// (the previous rules then stay in force).
    pub(crate) fn set_rules(&mut self, rules: Option<Rules>, error: Option<String>) {
        if let Some(rules) = rules {
            self.rules = rules;
        }
        self.rules_error = error;
    }

    /// How many access rules are in force, and why the file could not be loaded.
    pub(crate) fn rules_status(&self) -> (u64, Option<String>) {
        (self.rules.rules.len() as u64, self.rules_error.clone())
    }

    /// Agents online, agents known.
    pub(crate) fn agent_counts(&self) -> (u64, u64) {
        let online = self.agents.values().filter(|a| a.online.is_some()).count();
        (online as u64, self.agents.len() as u64)
    }

    /// Fills in what only the router knows (online, live subscriptions) in the store's agent
    /// list, online first.
    pub(crate) fn complete_agents(&self, agents: &mut [relay_protocol::query::AgentInfo]) {
        for a in agents.iter_mut() {
            if let Some(live) = self.agents.get(&a.name) {
                a.online = live.online.is_some();
                a.topics = live.topics.iter().cloned().collect();
                let (state, since, why) = team_state(live.online.as_ref());
                a.state = state;
                a.since = since;
                a.why = why;
                a.thread.clone_from(&live.thread);
                let activity = since.map_or(live.activity, |s| s.max(live.activity));
                a.last_activity = (activity > 0).then_some(activity);
            }
        }
        agents.sort_by(|a, b| b.online.cmp(&a.online).then_with(|| a.name.cmp(&b.name)));
    }

    /// `forget_agent` is decided here, where the live state is: refused (code, message) for
    /// a connected or unknown agent; otherwise the agent leaves routing at once (a broadcast
    /// no longer queues for it; should it connect again, its HELLO comes after this in the
    /// store's order and lists it again).
    pub(crate) fn forget(&mut self, name: &str) -> Result<(), (&'static str, String)> {
        match self.agents.get(name) {
            Some(a) if a.online.is_some() => Err((
                "connected",
                format!(
                    "{name} is connected; only an agent that is not can be forgotten \
                     (`agent-relay stop {name}` stops a wrapped agent)"
                ),
            )),
            Some(_) => {
                self.agents.remove(name);
                self.fold_out(name);
                self.forget_claims(name);
                Ok(())
            }
            None => Err((
                "not_found",
                format!("no agent {name} is known (`agent-relay agents` lists them)"),
            )),
        }
    }

    /// The connection's outgoing queue, for a `watch` forwarder the shell starts; the guard
    /// stops that forwarder when the connection goes (a second watch replaces the first).
    pub(crate) fn watch(
        &mut self,
        conn_id: u64,
        guard: DropGuard,
    ) -> Option<mpsc::Sender<Outbound>> {
        let conn = self.conns.get_mut(&conn_id)?;
        conn.watch = Some(guard);
        Some(conn.tx.clone())
    }

    /// Where to write frames for connection `conn_id` from another task (an answer that
    /// waits for something else, like the far legs of a trace).
    pub(crate) fn outbound(&self, conn_id: u64) -> Option<(mpsc::Sender<Outbound>, Killer)> {
        self.conns
            .get(&conn_id)
            .map(|c| (c.tx.clone(), c.killer.clone()))
    }

    /// Queues a frame to connection `conn_id` (closing it if its queue is full).
    pub(crate) fn send_to(&self, conn_id: u64, out: Outbound) {
        if let Some(conn) = self.conns.get(&conn_id) {
            send_or_kill(&conn.tx, &conn.killer, out);
        }
    }

    /// The content of `agents.json`: every known agent, name order.
    pub(crate) fn agents_doc(&self) -> String {
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
        doc.to_string()
    }

    /// The daemon stops: BYE to every connection (closing those that do not read), and every
    /// agent's session ends as at a disconnect, so what it held is replayed next time.
    pub(crate) fn shutdown(&mut self, now: Now) {
        self.now = now;
        self.flush_watermarks();
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
            self.end_session(&name, &on);
        }
    }

    fn on_appended(
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
            // The relay's own notice stored before (told once): not a sender's repeat.
            AppendOutcome::Duplicate { .. } if conn_id == NO_CONN => return,
            AppendOutcome::Duplicate { .. } => {
                self.feed.counters.duplicates.add(1);
                self.receipt(conn_id, env_id, AckStatus::Duplicate, None);
                return;
            }
            AppendOutcome::Taken { owner } => {
                // An id names one message, so that a full id always resolves (issue 24.7).
                // Nothing was stored: the sender chooses another id and sends again.
                tracing::warn!(id = %env_id, owner = %owner, "SEND refused: id already another sender's");
                let reason = format!(
                    "the id {:?} is already another sender's message ({}); nothing was stored; send again with a new id (a ULID)",
                    relay_protocol::text::one_line(&env_id, 64),
                    relay_protocol::text::one_line(&owner, 64)
                );
                self.nack(conn_id, env_id, NackCode::Invalid, reason);
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
        let thread = message
            .payload
            .thread
            .clone()
            .unwrap_or_else(|| message.id.clone());
        if let Some(sender) = self.agents.get_mut(&message.from) {
            sender.sent += 1;
            sender.activity = self.now.ms;
            sender.thread = Some(thread.clone());
        }
        // A recipient nobody has connected as yet (`names.rs`): the message waits for it like
        // one for an offline agent, and its sender is told.
        let not_yet = match recipients.as_slice() {
            [only]
                if *only == message.to
                    && !self.agents.contains_key(only)
                    && !self.is_person(only) =>
            {
                Some(only.clone())
            }
            _ => None,
        };
        let mut any_online = false;
        let mut busy: Vec<(String, u64)> = Vec::new();
        let mut slow: Vec<String> = Vec::new();
        for (name, seq) in recipients.iter().zip(seqs) {
            let Some(agent) = self.agents.get_mut(name) else {
                continue;
            };
            agent.received += 1;
            agent.activity = self.now.ms;
            agent.thread = Some(thread.clone());
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
                match on.dispatch(message.clone(), seq, 1, raw.clone(), self.now.ms) {
                    Err(SlowConsumer) => slow.push(name.clone()),
                    Ok(dirty) => {
                        if dirty {
                            self.dirty.insert(name.clone());
                        }
                        self.feed.counters.delivered.add(1);
                        self.feed
                            .emit(|| delivered_event(&message, name, seq, 1, self.now.ms));
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
                        .is_some_and(|t| self.now.at.duration_since(*t) < Duration::from_secs(1));
                    if !told {
                        on.busy_told.insert(sender, self.now.at);
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
        let count = Some(u32::try_from(recipients.len()).unwrap_or(u32::MAX));
        match not_yet {
            Some(name) => self.tell_not_yet(conn_id, env_id, &message, name, count),
            None => self.receipt(conn_id, env_id, status, count),
        }
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
            self.drop_slow(&name);
        }
    }

    /// The receipt for a message to `name`, which has not connected yet, says so (the line
    /// `agent-relay send` prints); an agent that sent it is also told with a notice from the
    /// relay, once per recipient while the daemon runs (its model reads it).
    fn tell_not_yet(
        &mut self,
        conn_id: u64,
        ack_id: String,
        message: &StoredMessage,
        name: String,
        recipients: Option<u32>,
    ) {
        let note = self.not_yet_seen_note(&name);
        self.reply(
            conn_id,
            Payload::Ack(relay_protocol::Ack {
                ack_id,
                seq: None,
                status: Some(AckStatus::Queued),
                recipients,
                state: None,
                cumulative: false,
                reason: Some(note.clone()),
            }),
        );
        let agent_sender = self
            .conns
            .get(&conn_id)
            .is_some_and(|c| c.role == Role::Agent && c.name == message.from);
        if !agent_sender
            || !self
                .told_not_yet
                .insert((message.from.clone(), name.clone()))
        {
            return;
        }
        let short = relay_protocol::short_id(&message.id);
        let body = format!(
            "relay: your message [{short}] to {name} is kept: {note}. Later messages to {name} wait the same way, without this notice."
        );
        let data = serde_json::json!({"relay_notice": {
            "msg_id": message.id, "recipient": name, "code": "not_connected_yet",
        }});
        // Told once per pair, ever: the notice's id is the pair's, so a relay restarted since
        // the first notice finds it stored and stores no second one (the store's dedupe of
        // (sender, id) is the record; no memory of this process is). Its short id is not the
        // message's.
        let id = names::not_yet_notice_id(&message.from, &name);
        self.relay_notice(message.from.clone(), id, Some(&message.id), body, data);
    }

    fn drop_slow(&mut self, name: &str) {
        if let Some(on) = self.agents.get_mut(name).and_then(|a| a.online.take()) {
            tracing::warn!(agent = %name, "connection does not read its frames: closing it (its messages stay queued)");
            on.killer.kill(
                ErrorCode::SlowConsumer,
                "this connection did not read its frames; reconnect to receive the queued messages"
                    .into(),
            );
            self.end_session(name, &on);
        }
    }

    /// Records what an ending session had been handed without acknowledging: its acknowledged
    /// watermark, and one more attempt for everything it held above it. Everything at or below
    /// `last_sent` was handed out (live and catch-up sends both go in position order).
    fn end_session(&mut self, name: &str, on: &Online) {
        self.feed.emit(|| RelayEvent::AgentDisconnected {
            ts: self.now.ms,
            agent: name.to_owned(),
        });
        self.dirty.remove(name);
        if let Some(at) = on.trace_since
            && on.last_sent > on.traced_through
        {
            self.store(StoreCmd::Write(
                WriteOp::Sent {
                    recipient: name.to_owned(),
                    session_id: on.session_id.to_string(),
                    after: on.traced_through,
                    through: on.last_sent,
                    at,
                },
                WriteCtx::None,
            ));
        }
        let through = on.watermark();
        if through > on.acked_through {
            self.store(StoreCmd::Write(
                WriteOp::AckThrough {
                    recipient: name.to_owned(),
                    through,
                },
                WriteCtx::None,
            ));
        }
        if on.last_sent > through {
            self.store(StoreCmd::Write(
                WriteOp::HandedOut {
                    recipient: name.to_owned(),
                    after: through,
                    through: on.last_sent,
                },
                WriteCtx::None,
            ));
        }
    }

    fn on_pending(
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
                .then(|| delivered_event(&d.message, &recipient, d.seq, d.attempt, self.now.ms));
            match on.dispatch(d.message, d.seq, d.attempt, None, self.now.ms) {
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
            self.drop_slow(&recipient);
            return;
        }
        self.advance_watermark(&recipient);
    }

    /// An ACK (or, as `state: failed`, a NACK) of a DELIVER from connection `conn_id`.
    /// `reason`: a NACK's, kept as the dead letter's reason.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn on_ack(
        &mut self,
        conn_id: u64,
        ack_id: &str,
        seq: Option<u64>,
        state: Option<DeliveryState>,
        cumulative: bool,
        reason: Option<String>,
        now: Now,
    ) {
        self.now = now;
        // A federation's stand-in reports failures on another node (a dead letter there), not
        // a recipient that cannot take messages: they never pause its deliveries.
        let standin = self
            .conns
            .get(&conn_id)
            .is_some_and(|c| c.remote_node.is_some());
        let Some((name, on)) = online_mut(&self.conns, &mut self.agents, conn_id) else {
            return;
        };
        let failed = state == Some(DeliveryState::Failed);
        let opened = if failed && !standin {
            on.failed(
                self.cfg.breaker_failures,
                self.cfg.breaker_cooldown,
                self.now.at,
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
                self.store(StoreCmd::Write(
                    WriteOp::MarkById {
                        recipient: name.clone(),
                        msg_id: ack_id.to_owned(),
                        status: DeliveryStatus::Acked,
                        reason: None,
                    },
                    WriteCtx::None,
                ));
            }
            self.store(StoreCmd::Write(
                WriteOp::MarkById {
                    recipient: name,
                    msg_id: ack_id.to_owned(),
                    status,
                    reason,
                },
                WriteCtx::Notify,
            ));
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
            let ts = self.now.ms;
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
            self.store(StoreCmd::Write(
                WriteOp::SetStatus {
                    recipient: name.clone(),
                    pos,
                    status,
                    // A failure's reason, or the door that showed a verified message to
                    // its agent's model (`trace` names it).
                    reason: reason.filter(|_| {
                        matches!(status, DeliveryStatus::Failed | DeliveryStatus::Verified)
                    }),
                },
                WriteCtx::Notify,
            ));
        }
        self.advance_watermark(&name);
    }

    /// DELIVERs read off the socket by a connection that does not acknowledge: that is their
    /// acknowledgement. (What was queued, or written and never read, stays in flight, and
    /// `end_session` leaves it pending for the next connection.)
    pub(crate) fn on_written(&mut self, conn_id: u64, positions: &[i64], now: Now) {
        self.now = now;
        let Some((name, on)) = online_mut(&self.conns, &mut self.agents, conn_id) else {
            return;
        };
        if on.ack_required {
            return;
        }
        let watched = self.feed.watched();
        let ts = self.now.ms;
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
            self.store(StoreCmd::Write(
                WriteOp::SetStatus {
                    recipient: name.clone(),
                    pos,
                    status: DeliveryStatus::Acked,
                    reason: None,
                },
                WriteCtx::None,
            ));
        }
        self.advance_watermark(&name);
    }

    /// Notes a moved acknowledgement watermark (written to the store in the next flush) and
    /// loads the next page when catching up.
    fn advance_watermark(&mut self, name: &str) {
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
            self.store(cmd);
        }
    }

    /// Writes every moved watermark: one range update per recipient instead of one write per
    /// acknowledgement.
    pub(crate) fn flush_watermarks(&mut self) {
        let dirty: Vec<String> = self.dirty.drain().collect();
        for name in dirty {
            let Some(on) = self.agents.get_mut(&name).and_then(|a| a.online.as_mut()) else {
                continue;
            };
            let trace = on.take_trace(&name);
            let through = on.watermark();
            if let Some(op) = trace {
                self.store(StoreCmd::Write(op, WriteCtx::None));
            }
            let Some(on) = self.agents.get_mut(&name).and_then(|a| a.online.as_mut()) else {
                continue;
            };
            if through > on.acked_through {
                on.acked_through = through;
                self.store(StoreCmd::Write(
                    WriteOp::AckThrough {
                        recipient: name,
                        through,
                    },
                    WriteCtx::None,
                ));
            }
        }
    }

    /// SUBSCRIBE (`on`) or UNSUBSCRIBE from connection `conn_id`.
    pub(crate) fn on_subscribe(
        &mut self,
        conn_id: u64,
        id: String,
        pattern: Option<String>,
        on: bool,
        now: Now,
    ) {
        self.now = now;
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
        self.store(StoreCmd::Write(op, WriteCtx::None));
        self.receipt(conn_id, id, AckStatus::Accepted, None);
        self.agents_changed = true;
    }

    pub(crate) fn live_agents(&self) -> Vec<LiveAgent> {
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
    pub(crate) fn on_terminal(&mut self, conn_id: u64, mut report: TerminalReport, now: Now) {
        self.now = now;
        let Some((name, on)) = online_mut(&self.conns, &mut self.agents, conn_id) else {
            return;
        };
        // Shown on a dashboard and in `watch`: short, whatever a client sends.
        report.backend = excerpt_of(&report.backend, 16).0;
        report.why = report.why.map(|w| excerpt_of(&w, 120).0);
        if on.terminal.as_ref() == Some(&report) {
            return;
        }
        let before = on.terminal.as_ref().map(|t| t.state);
        let after = report.state;
        if before != Some(after) {
            on.state_since = self.now.ms;
        }
        on.terminal = Some(report);
        on.terminal_pending = true;
        let due = on.terminal_due(self.now.at);
        if before != Some(after) {
            self.spawn_state_changed(&name, before, after);
        }
        if let Some(report) = due {
            self.emit_terminal(name, report);
        }
    }

    /// Tells the live feed the reports held back by [`STATE_EVERY`] (from the 1 s tick).
    fn flush_terminal_states(&mut self) {
        let now = self.now.at;
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
            ts: self.now.ms,
            agent,
            backend: report.backend,
            state: report.state,
            why: report.why,
        });
    }

    /// The expiry sweep: queued deliveries older than the inbox TTL to agents not online
    /// expire (the store dead-letters them; their senders are told when it answers).
    pub(crate) fn sweep(&mut self, now: Now) {
        self.now = now;
        let except: Vec<String> = self
            .agents
            .iter()
            .filter(|(_, a)| a.online.is_some())
            .map(|(n, _)| n.clone())
            .collect();
        let ttl = u64::try_from(self.cfg.inbox_ttl.as_millis()).unwrap_or(u64::MAX);
        let queued_before = self.now.ms.saturating_sub(ttl);
        tracing::trace!(queued_before, online = except.len(), "expiry sweep");
        self.store(StoreCmd::Write(
            WriteOp::Expire {
                queued_before,
                except,
            },
            WriteCtx::Notify,
        ));
    }
}

fn delivered_event(
    msg: &StoredMessage,
    recipient: &str,
    seq: u64,
    attempt: u32,
    ts: u64,
) -> RelayEvent {
    RelayEvent::Delivered {
        ts,
        id: msg.id.clone(),
        pos: msg.pos,
        recipient: recipient.to_owned(),
        seq,
        attempt,
    }
}

/// Queues a control frame; a connection whose queue is full does not read and is closed.
pub(crate) fn send_or_kill(tx: &mpsc::Sender<Outbound>, killer: &Killer, out: Outbound) {
    if tx.try_send(out).is_err() {
        killer.kill(
            ErrorCode::SlowConsumer,
            "this connection did not read its frames; reconnect (unacknowledged SENDs are safe to re-send)".into(),
        );
    }
}
