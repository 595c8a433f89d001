//! A test world around the core: the real store logic (the memory store, driven by the store
//! thread's own `run_commands`, so results come back in command order as in the daemon),
//! connections as plain channels, and a clock the test moves. No runtime, no sleeps.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use relay_protocol::{
    AckStatus, Capabilities, DeliveryState, ErrorCode, Hello, Kind, NackCode, Payload, Role, Send,
};
use relay_store::{MemoryStore, Store};
use tokio::sync::mpsc;

use super::{Core, Now, Submitted};
use crate::Config;
use crate::feed::Feed;
use crate::msg::{ConnHandle, DeliverItem, Killer, Outbound, StoreCmd, StoreEvent};
use crate::rules::Rules;

/// A DELIVER as a connection received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Got {
    pub(super) id: String,
    pub(super) from: String,
    pub(super) pos: i64,
    pub(super) seq: u64,
    pub(super) attempt: u32,
    pub(super) topic: Option<String>,
    /// The federation node it came from, as stored.
    pub(super) origin: Option<String>,
}

/// What a connection was sent, sorted by kind.
#[derive(Debug, Default)]
pub(super) struct Frames {
    pub(super) delivers: Vec<Got>,
    /// Receipts: (id, status, recipients).
    pub(super) receipts: Vec<(String, AckStatus, Option<u32>)>,
    /// NACKs: (id, code, reason).
    pub(super) nacks: Vec<(String, NackCode, String)>,
    /// BUSY targets.
    pub(super) busy: Vec<String>,
    /// Anything else (WELCOME, BYE, RESULT, close).
    pub(super) other: usize,
}

struct Conn {
    rx: mpsc::Receiver<Outbound>,
    killer: Killer,
}

pub(super) struct World {
    pub(super) core: Core,
    pub(super) store: MemoryStore,
    cfg: Arc<Config>,
    pub(super) feed: Feed,
    t0: Instant,
    /// Time since the start (monotonic), and the wall clock at the start.
    pub(super) elapsed: Duration,
    wall0: u64,
    conns: HashMap<u64, Conn>,
    next_conn: u64,
    events_tx: mpsc::UnboundedSender<StoreEvent>,
    events_rx: mpsc::UnboundedReceiver<StoreEvent>,
    /// Frames queued per connection before it counts as not reading.
    pub(super) queue: usize,
    /// The store thread's connections closed to handing over.
    closed: crate::store_actor::Closed,
}

/// A configuration with no rate limits unless a test sets them.
pub(super) fn config() -> Config {
    let mut cfg = Config::new("/nonexistent/relay.sock".into());
    cfg.rates.sender.max = 0;
    cfg.rates.pair.max = 0;
    cfg
}

pub(super) fn payload(body: &str) -> Send {
    Send {
        origin: None,
        kind: Kind::Message,
        body: body.into(),
        data: None,
        thread: None,
        in_reply_to: None,
        budget: None,
        urgent: false,
    }
}

/// A reply to `parent` (the daemon counts its hops from it).
pub(super) fn reply_to(parent: &str) -> Send {
    Send {
        in_reply_to: Some(parent.into()),
        ..payload(&format!("re {parent}"))
    }
}

impl World {
    pub(super) fn new(cfg: Config) -> Self {
        Self::with_rules(cfg, Rules::default())
    }

    pub(super) fn with_rules(cfg: Config, rules: Rules) -> Self {
        let cfg = Arc::new(cfg);
        let feed = Feed::new();
        let t0 = relay_protocol::now_instant();
        // The store thread stamps writes with the real clock: start from it.
        let wall0 = crate::clock::now_ms();
        let now = Now { at: t0, ms: wall0 };
        let core = Core::new(
            cfg.clone(),
            feed.clone(),
            Vec::new(),
            Vec::new(),
            rules,
            now,
        );
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        Self {
            core,
            store: MemoryStore::new(),
            cfg,
            feed,
            t0,
            elapsed: Duration::ZERO,
            wall0,
            conns: HashMap::new(),
            next_conn: 1,
            events_tx,
            events_rx,
            queue: 8192,
            closed: crate::store_actor::Closed::default(),
        }
    }

    pub(super) fn now(&self) -> Now {
        Now {
            at: self.t0 + self.elapsed,
            ms: self.wall0 + self.elapsed.as_millis() as u64,
        }
    }

    pub(super) fn advance(&mut self, d: Duration) {
        self.elapsed += d;
    }

    /// Runs what the core asked of the store and hands the results back, until nothing is
    /// left (the store thread and the router's event loop, in one).
    pub(super) fn settle(&mut self) {
        loop {
            self.router_wakes();
            if !self.store_runs() {
                break;
            }
        }
    }

    /// The store thread runs what the core asked of it (committing, and handing the
    /// pre-approved DELIVERs to the connections), and the router has not yet seen its results
    /// (they wait for the next [`World::settle`]). False when nothing was asked.
    pub(super) fn store_runs(&mut self) -> bool {
        let mut cmds: Vec<StoreCmd> = self.core.take_commands().collect();
        if cmds.is_empty() {
            return false;
        }
        crate::store_actor::run_commands(
            &mut self.store,
            &mut cmds,
            &self.events_tx,
            &mut self.closed,
        );
        true
    }

    /// The router handles the store's results waiting for it, in order.
    pub(super) fn router_wakes(&mut self) {
        while let Ok(ev) = self.events_rx.try_recv() {
            let now = self.now();
            // Operator answers and queries are the shell's; none are asked here.
            assert!(self.core.on_store_event(ev, now).is_none());
        }
    }

    /// [`World::settle`], then the flush the router does when it runs out of work.
    pub(super) fn idle(&mut self) {
        self.settle();
        self.core.flush_watermarks();
        self.settle();
    }

    fn hello(name: &str, role: Role, window: u32, ack: bool, token: Option<String>) -> Hello {
        Hello {
            agent: name.into(),
            cli: None,
            capabilities: Capabilities {
                ack,
                resume: true,
                max_inflight: window,
                supports_topics: true,
            },
            resume_token: token,
            role,
        }
    }

    /// A connection says HELLO; its WELCOME is read off (its resume token returned).
    pub(super) fn open(
        &mut self,
        name: &str,
        role: Role,
        window: u32,
        ack: bool,
        token: Option<String>,
    ) -> Result<(u64, String), (ErrorCode, String)> {
        self.open_hello(Self::hello(name, role, window, ack, token))
    }

    /// A federation stand-in for `name`, an agent of node `node` (its HELLO's cli is
    /// `remote@NODE`, as `relay-federation` says).
    pub(super) fn standin(&mut self, name: &str, node: &str) -> u64 {
        let hello = Hello {
            cli: Some(format!("remote@{node}")),
            ..Self::hello(name, Role::Agent, 256, true, None)
        };
        self.open_hello(hello).expect("stand-in connects").0
    }

    fn open_hello(&mut self, hello: Hello) -> Result<(u64, String), (ErrorCode, String)> {
        let id = self.next_conn;
        self.next_conn += 1;
        let (tx, mut rx) = mpsc::channel(self.queue);
        let killer = Killer::default();
        let handle = ConnHandle {
            id,
            tx,
            killer: killer.clone(),
            in_process: false,
            attach: false,
        };
        let session: Arc<str> = format!("session-{id}").into();
        let token = format!("token-{id}");
        let now = self.now();
        self.core
            .register(handle, hello, session, token.clone(), now)?;
        // An agent's WELCOME waits for its registration's write: the store runs first, and
        // WELCOME is still the first frame (before any replayed DELIVER).
        self.settle();
        match rx.try_recv() {
            Ok(Outbound::Control(p)) if matches!(*p, Payload::Welcome(_)) => {}
            other => panic!("expected WELCOME, got {other:?}"),
        }
        self.conns.insert(id, Conn { rx, killer });
        Ok((id, token))
    }

    /// An agent with a window of `window` that acknowledges.
    pub(super) fn agent(&mut self, name: &str, window: u32) -> u64 {
        self.open(name, Role::Agent, window, true, None)
            .expect("agent connects")
            .0
    }

    /// A tool connection speaking as `name`.
    pub(super) fn client(&mut self, name: &str) -> u64 {
        self.open(name, Role::Client, 256, true, None)
            .expect("client connects")
            .0
    }

    pub(super) fn send_full(
        &mut self,
        conn: u64,
        id: &str,
        to: Option<&str>,
        topic: Option<&str>,
        payload: Send,
    ) {
        self.submit(conn, id, to, topic, payload);
        self.settle();
    }

    /// A SEND the core decides on, whose store commands have not run yet (the next step that
    /// settles runs them; a crash first loses them, as a daemon killed with them in its
    /// channel does).
    pub(super) fn send_unsettled(&mut self, conn: u64, id: &str, to: &str) {
        self.submit(conn, id, Some(to), None, payload(id));
    }

    /// [`World::send_unsettled`] of a reply to `parent`.
    pub(super) fn reply_unsettled(&mut self, conn: u64, id: &str, to: &str, parent: &str) {
        self.submit(conn, id, Some(to), None, reply_to(parent));
    }

    fn submit(
        &mut self,
        conn: u64,
        id: &str,
        to: Option<&str>,
        topic: Option<&str>,
        payload: Send,
    ) {
        let send = Submitted {
            id: id.into(),
            to: to.map(str::to_owned),
            topic: topic.map(str::to_owned),
            payload,
            raw: None,
        };
        let now = self.now();
        self.core.on_send(conn, send, now);
    }

    pub(super) fn send(&mut self, conn: u64, id: &str, to: &str) {
        self.send_full(conn, id, Some(to), None, payload(&format!("body of {id}")));
    }

    pub(super) fn ack(&mut self, conn: u64, id: &str, state: Option<DeliveryState>) {
        let now = self.now();
        self.core.on_ack(conn, id, None, state, false, None, now);
        self.settle();
    }

    /// An ACK the router handles before the store's results waiting for it.
    pub(super) fn ack_unsettled(&mut self, conn: u64, id: &str) {
        let now = self.now();
        self.core.on_ack(conn, id, None, None, false, None, now);
    }

    pub(super) fn ack_through(&mut self, conn: u64, id: &str) {
        let now = self.now();
        self.core.on_ack(conn, id, None, None, true, None, now);
        self.settle();
    }

    /// The connection goes before the router has seen the store's results waiting for it
    /// (nothing settles; what was queued on it is lost with it).
    pub(super) fn disconnect_unsettled(&mut self, conn: u64) {
        let now = self.now();
        self.core.unregister(conn, now);
        self.conns.remove(&conn);
    }

    pub(super) fn disconnect(&mut self, conn: u64) {
        let now = self.now();
        self.core.unregister(conn, now);
        self.conns.remove(&conn);
        self.settle();
    }

    pub(super) fn killed(&self, conn: u64) -> Option<ErrorCode> {
        self.conns[&conn].killer.reason().map(|r| r.code)
    }

    /// What was queued on a connection since last read.
    pub(super) fn frames(&mut self, conn: u64) -> Frames {
        let mut f = Frames::default();
        let Some(c) = self.conns.get_mut(&conn) else {
            return f;
        };
        while let Ok(out) = c.rx.try_recv() {
            match out {
                Outbound::Deliver(DeliverItem {
                    msg, seq, attempt, ..
                }) => f.delivers.push(Got {
                    id: msg.id.clone(),
                    from: msg.from.clone(),
                    pos: msg.pos,
                    seq,
                    attempt,
                    topic: msg.topic.clone(),
                    origin: msg.payload.origin.clone(),
                }),
                Outbound::Receipt {
                    ack_id,
                    status,
                    recipients,
                } => f.receipts.push((ack_id, status, recipients)),
                Outbound::Control(p) => match *p {
                    Payload::Nack(n) => f.nacks.push((n.ack_id, n.code, n.reason)),
                    Payload::Busy(b) => f.busy.push(b.target.unwrap_or_default()),
                    _ => f.other += 1,
                },
                Outbound::Frame(_) | Outbound::Close(_) => f.other += 1,
            }
        }
        f
    }

    /// The ids delivered to a connection since last read.
    pub(super) fn delivered(&mut self, conn: u64) -> Vec<String> {
        self.frames(conn)
            .delivers
            .into_iter()
            .map(|g| g.id)
            .collect()
    }

    /// The daemon dies: everything the core held is gone, and whatever it had decided but the
    /// store had not run yet. A new core starts from what the store kept, as `run_with` does.
    pub(super) fn crash(&mut self) {
        // Decided, never run.
        drop(self.core.take_commands().collect::<Vec<_>>());
        while self.events_rx.try_recv().is_ok() {}
        self.conns.clear();
        self.closed = crate::store_actor::Closed::default();
        let known = self.store.known_agents().expect("known agents");
        let hops = self
            .store
            .recent_hops(super::HOPS_REMEMBERED)
            .expect("recent hops");
        let untold = self.store.unnotified(100_000).expect("unnotified");
        let now = self.now();
        self.core = Core::new(
            self.cfg.clone(),
            self.feed.clone(),
            known,
            hops,
            Rules::default(),
            now,
        );
        self.core.notify(untold);
        self.settle();
    }
}
