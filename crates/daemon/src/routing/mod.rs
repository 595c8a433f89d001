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
//!
//! Each kind of decision is a file of its own, an `impl Core` block: `online.rs` (HELLOs,
//! sessions, subscriptions, terminal reports), `admission.rs` (a SEND checked and routed),
//! `delivery.rs` (windows, catch-up, redelivery, circuit probes), `acknowledgement.rs` (ACKs,
//! watermarks, dead-letter notices), `names.rs`, `claims.rs` and `spawn.rs`; this file keeps the
//! state, the small entry points and the helpers they share.

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
    ConnHandle, DeliverItem, Handover, Killer, LiveAgent, Outbound, Raw, StoreCmd, StoreEvent,
    WriteCtx, Writer,
};
use crate::rules::Rules;

mod acknowledgement;
mod admission;
mod claims;
mod delivery;
pub(crate) use claims::ClaimAnswer;
mod names;
mod online;
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

/// The live record of agent `name` if its session is still the one on connection `conn_id`.
fn session_on<'a>(
    agents: &'a mut HashMap<String, Agent>,
    name: &str,
    conn_id: u64,
) -> Option<&'a mut Online> {
    agents
        .get_mut(name)?
        .online
        .as_mut()
        .filter(|o| o.conn_id == conn_id)
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
    /// Appends sent to the store with this connection pre-approved for the store thread to
    /// hand their DELIVER over (issue 26 point 2) whose result the router has not processed:
    /// each may be in the writer's queue already, so each takes a place in the window.
    tickets: usize,
    /// Pre-approvals given in this session, and how many of them the router has processed
    /// (the store answers in command order, so they are processed in the order given).
    issued: u64,
    resolved: u64,
    /// Appends sent to the store for this session without a pre-approval whose result the
    /// router has not processed: the router delivers those, so none is given until they are
    /// done (a DELIVER the store thread handed over would overtake them).
    unapproved: u32,
    /// A pre-approved DELIVER came back not handed over: the store thread hands this
    /// connection nothing more until the router reopens it, once `tickets` is 0; no
    /// pre-approval is given meanwhile.
    fallback: bool,
    /// Acknowledgements that came before the store's event saying their DELIVER was handed
    /// over (see [`Held`]).
    held: Vec<Held>,
}

/// What is left of a session that ended while pre-approved DELIVERs were outstanding and
/// acknowledgements were held for them: the client may have acknowledged a DELIVER the store
/// thread handed over just before the connection went, and that acknowledgement must not be
/// lost with the session (the message would be delivered again). While one is outstanding, a
/// new session of the same name does not load its waiting messages: the page would be read
/// before the held acknowledgements are written, and would hand over again what they
/// acknowledge (`online.rs` `register`; loaded once the last orphan of the name is settled).
#[derive(Debug)]
struct Orphan {
    /// The agent whose session it was.
    name: String,
    /// Pre-approvals whose result the router has not yet processed.
    tickets: usize,
    held: Vec<Held>,
}

/// An acknowledgement of nothing in flight that came while pre-approved DELIVERs were
/// outstanding: the store thread may have handed that DELIVER over and the client acknowledged
/// it before the router processed the store's event. It is applied once the DELIVER is
/// recorded as sent, or once every pre-approval outstanding when it came is processed (then it
/// was about something else, and is applied as any such acknowledgement is).
#[derive(Debug, Clone)]
enum Held {
    /// An ACK or a NACK ([`Core::on_ack`]'s arguments).
    Ack {
        ack_id: String,
        seq: Option<u64>,
        state: Option<DeliveryState>,
        cumulative: bool,
        reason: Option<String>,
        until: u64,
    },
    /// A DELIVER read off the socket by an `ack: false` connection ([`Core::on_written`]).
    Written { pos: i64, until: u64 },
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
        self.mode == Mode::Live && self.in_use() < self.room_limit()
    }

    /// Places of the window taken: DELIVERs in flight and pre-approvals outstanding.
    fn in_use(&self) -> usize {
        self.inflight.len() + self.tickets
    }

    /// Whether the store thread may hand this connection the DELIVER of an append sent now:
    /// live with room in the window, and nothing before it that the router will send (an
    /// append without pre-approval outstanding, or a pre-approved one that came back not
    /// handed over), so that it cannot overtake anything.
    fn may_hand_over(&self) -> bool {
        self.can_send_live() && self.unapproved == 0 && !self.fallback
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
        Ok(self.sent(pos, id, seq, now_ms))
    }

    /// Records a DELIVER as handed to the connection (by [`Online::dispatch`], or by the
    /// store thread). True when it is the first since the trace was last written (the caller
    /// marks the recipient for the next flush).
    fn sent(&mut self, pos: i64, id: String, seq: u64, now_ms: u64) -> bool {
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
        first
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
    /// Sessions that ended with pre-approved DELIVERs outstanding and acknowledgements held
    /// for them, by connection: a held acknowledgement is written to the store once the
    /// store's event says its DELIVER was handed to that session ([`Orphan`]).
    orphans: HashMap<u64, Orphan>,
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
            orphans: HashMap::new(),
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
                    online,
                },
                res,
            ) => {
                self.on_appended(conn_id, env_id, recipients, raw, online, res);
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
