//! The router: the async shell around the routing core ([`crate::routing::Core`]).
//!
//! Connections send it [`RouterMsg`]s over one bounded channel; the store actor answers on one
//! FIFO channel. For each input the shell reads the clock once, calls the core, and sends the
//! store commands the core decided, in order (the core itself queues frames on connections'
//! channels, which never waits). Nothing else touches routing state, so there are no locks.
//!
//! What the core cannot do is here: waiting on channels and timers, answering in-process
//! questions on their oneshots, starting `watch` forwarders, and the file I/O, which is kept
//! off this task: the rules file is read by a watcher task (on the blocking pool) that sends
//! the parsed rules in, and `agents.json` is written by a thread that the shell hands a
//! snapshot of the agent list.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use relay_protocol::events::Watch;
use relay_protocol::file::{Durability, write_atomic};
use relay_protocol::query::{QueryRequest, QueryResult, TraceRecord};
use relay_protocol::{DeliveryState, Envelope, Payload};
use relay_store::{DeadNotice, WriteOp, WriteResult};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::Config;
use crate::clock::now_ms;
use crate::feed::{Feed, Subscription};
use crate::msg::{
    Answer, Outbound, QueryCtx, QueryKind, RouterMsg, StoreCmd, StoreEvent, WriteCtx,
};
use crate::routing::{Core, NO_CONN, Now, Submitted};
use crate::rules::Rules;

pub(crate) use crate::routing::HOPS_REMEMBERED;

/// The store write an operator action (`dlq retry`, `dlq purge`) makes; `None` for a read.
fn admin_op(req: &QueryRequest) -> Option<WriteOp> {
    match req {
        QueryRequest::DlqRetry { dlq_id } => Some(WriteOp::Retry { dlq_id: *dlq_id }),
        QueryRequest::DlqPurge => Some(WriteOp::Purge),
        QueryRequest::ForgetAgent { name } => Some(WriteOp::ForgetAgent { name: name.clone() }),
        QueryRequest::ChainExtend { thread, hops } => Some(WriteOp::ExtendChain {
            thread: thread.clone(),
            hops: *hops,
        }),
        _ => None,
    }
}

/// The time now, read once per input.
fn now() -> Now {
    Now {
        at: relay_protocol::now_instant(),
        ms: now_ms(),
    }
}

/// The router task's state.
pub(crate) struct Router {
    cfg: Arc<Config>,
    core: Core,
    store: mpsc::Sender<StoreCmd>,
    feed: Feed,
    started: Instant,
    db_location: String,
    storage: String,
    /// Events handled since the last flush.
    since_flush: u32,
    /// The thread writing `agents.json` (while running, when there is a file).
    agents_file: Option<AgentsFile>,
}

/// How often the rules file is checked for changes (and circuits and held-back terminal
/// reports are looked at, and a changed agent list is written).
const RULES_CHECK: Duration = Duration::from_secs(1);

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
        let core = Core::new(
            cfg.clone(),
            feed.clone(),
            known,
            recent_hops,
            Rules::default(),
            now(),
        );
        Self {
            cfg,
            core,
            store,
            feed,
            started: relay_protocol::now_instant(),
            db_location,
            storage,
            since_flush: 0,
            agents_file: None,
        }
    }

    /// The spawned workers' records (loaded at start).
    pub(crate) fn set_spawned(&mut self, records: Vec<relay_protocol::query::SpawnRecord>) {
        self.core.load_spawned(records);
    }

    /// The hop-budget extensions stored per thread (loaded at start).
    pub(crate) fn set_chains(&mut self, chains: Vec<(String, u32)>) {
        for (thread, extra) in chains {
            self.core.chain_extended(thread, extra);
        }
    }

    /// The claims stored (loaded at start; expired ones dropped).
    pub(crate) fn set_claims(&mut self, claims: Vec<relay_protocol::claims::ClaimInfo>) {
        self.core.set_claims(claims);
    }

    /// Runs until `rx` closes or `shutdown` fires; then says BYE to every connection.
    pub(crate) async fn run(
        mut self,
        mut rx: mpsc::Receiver<RouterMsg>,
        mut events: mpsc::UnboundedReceiver<StoreEvent>,
        shutdown: CancellationToken,
        untold: Vec<DeadNotice>,
    ) {
        // The rules in force from the first message on, as when they were read on this task.
        let (rules_tx, mut rules_rx) = mpsc::channel(4);
        if let Some(path) = self.cfg.rules_file.clone() {
            let watched = RulesFile::default();
            let first = {
                let path = path.clone();
                tokio::task::spawn_blocking(move || {
                    let mut w = watched;
                    let change = w.check(&path);
                    (w, change)
                })
                .await
            };
            match first {
                Ok((watched, change)) => {
                    if let Some(RulesChange { rules, error }) = change {
                        self.core.set_rules(rules, error);
                    }
                    tokio::spawn(watch_rules(path, watched, rules_tx, shutdown.clone()));
                }
                Err(e) => tracing::error!(error = %e, "could not read the rules file"),
            }
        }
        self.agents_file = self.cfg.agents_file.clone().map(AgentsFile::start);
        if !untold.is_empty() {
            tracing::info!(
                count = untold.len(),
                "telling senders about dead letters made before the last stop"
            );
        }
        self.core.notify(untold);
        self.perform().await;
        // Not at once: after a restart, agents that were connected get a sweep interval to
        // come back before anything of theirs can expire.
        let mut sweep = tokio::time::interval_at(
            tokio::time::Instant::now() + self.cfg.sweep_interval,
            self.cfg.sweep_interval,
        );
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut tick = tokio::time::interval(RULES_CHECK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        self.write_agents_file();
        loop {
            tokio::select! {
                biased;
                Some(ev) = events.recv() => self.on_store_event(ev),
                msg = rx.recv() => match msg {
                    Some(m) => self.on_msg(m),
                    None => break,
                },
                Some(RulesChange { rules, error }) = rules_rx.recv() => {
                    self.core.set_rules(rules, error);
                }
                _ = sweep.tick() => self.core.sweep(now()),
                _ = tick.tick() => {
                    if self.core.take_agents_changed() {
                        self.write_agents_file();
                    }
                    self.core.tick(now());
                }
                () = shutdown.cancelled() => break,
                // Lowest priority: runs only when nothing else is ready.
                () = std::future::ready(()), if self.core.has_dirty() => self.flush_watermarks(),
            }
            self.since_flush += 1;
            if self.since_flush >= FLUSH_EVERY {
                self.flush_watermarks();
            }
            self.perform().await;
        }
        self.core.shutdown(now());
        self.perform().await;
        self.write_agents_file();
        if let Some(f) = self.agents_file.take() {
            f.finish().await;
        }
    }

    /// Hands the writer thread the agent list as it is now. Called on membership changes
    /// only (at most once a second): never per message or heartbeat.
    fn write_agents_file(&self) {
        if let Some(f) = &self.agents_file {
            f.write(self.core.agents_doc());
        }
    }

    /// Sends the store commands the core decided, in order.
    async fn perform(&mut self) {
        for cmd in self.core.take_commands() {
            if self.store.send(cmd).await.is_err() {
                tracing::error!("store actor is gone");
            }
        }
    }

    fn flush_watermarks(&mut self) {
        self.since_flush = 0;
        self.core.flush_watermarks();
    }

    fn on_msg(&mut self, msg: RouterMsg) {
        match msg {
            RouterMsg::Register { conn, hello, reply } => {
                let session_id: Arc<str> = ulid::Ulid::new().to_string().into();
                let resume_token = format!("{:032x}", rand::random::<u128>());
                let res = self
                    .core
                    .register(conn, hello, session_id, resume_token, now());
                if reply.send(res).is_err() {
                    // The connection went while registering: its Unregister follows.
                    tracing::debug!("connection gone before its HELLO was answered");
                }
            }
            RouterMsg::Unregister { conn_id, bye } => {
                if bye {
                    self.core.left(conn_id, now());
                }
                self.core.unregister(conn_id, now());
            }
            RouterMsg::Terminal { conn_id, report } => {
                self.core.on_terminal(conn_id, report, now());
            }
            RouterMsg::Send {
                conn_id,
                id,
                to,
                topic,
                payload,
                raw,
            } => {
                let send = Submitted {
                    id,
                    to,
                    topic,
                    payload,
                    raw,
                };
                self.core.on_send(conn_id, send, now());
            }
            RouterMsg::Ack { conn_id, ack } => {
                self.core.on_ack(
                    conn_id,
                    &ack.ack_id,
                    ack.seq,
                    ack.state,
                    ack.cumulative,
                    // A failure's reason, as a NACK's (the store keeps it only with a failure).
                    ack.reason
                        .as_deref()
                        .map(|r| relay_protocol::text::one_line(r, 600))
                        .filter(|r| !r.is_empty()),
                    now(),
                );
            }
            RouterMsg::Nack { conn_id, nack } => {
                self.core.on_ack(
                    conn_id,
                    &nack.ack_id,
                    None,
                    Some(DeliveryState::Failed),
                    false,
                    Some(relay_protocol::text::one_line(&nack.reason, 600))
                        .filter(|r| !r.is_empty()),
                    now(),
                );
            }
            RouterMsg::Written { conn_id, positions } => {
                self.core.on_written(conn_id, &positions, now());
            }
            RouterMsg::Subscribe {
                conn_id,
                id,
                pattern,
                on,
            } => {
                self.core.on_subscribe(conn_id, id, pattern, on, now());
            }
            RouterMsg::Query {
                conn_id,
                id,
                req: QueryRequest::Watch(filter),
            } => self.watch(conn_id, id, Watch::new(filter)),
            RouterMsg::Query { conn_id, id, req } => self.answer(conn_id, id, req, None),
            RouterMsg::Ask { req, reply } => {
                self.answer(NO_CONN, String::new(), req, Some(reply));
            }
        }
    }

    /// A QUERY from a connection, or an in-process ask (`reply`): an operator action
    /// (`dlq retry`, `dlq purge`) goes to the store as a write and is answered once done;
    /// anything else is a read.
    fn answer(
        &mut self,
        conn_id: u64,
        env_id: String,
        req: QueryRequest,
        reply: Option<oneshot::Sender<Answer>>,
    ) {
        if let QueryRequest::ChainExtend { thread, hops } = &req
            && let Err(message) = crate::routing::check_extension(thread, *hops)
        {
            let result = QueryResult::Error {
                code: "invalid".into(),
                message,
            };
            self.answer_with(conn_id, env_id, reply, result);
            return;
        }
        match &req {
            QueryRequest::Spawn(spawn) => {
                let result = match self.core.spawn(conn_id, spawn, now_ms()) {
                    Ok(record) if spawn.check => QueryResult::Spawn {
                        record,
                        task_id: None,
                    },
                    Ok(record) => {
                        let task_id = spawn.task.as_ref().map(|_| ulid::Ulid::new().to_string());
                        let op = WriteOp::Spawned {
                            record: record.clone(),
                            task_id: task_id.clone(),
                        };
                        let ctx = WriteCtx::Admin {
                            conn_id,
                            env_id,
                            reply,
                        };
                        // Answered once the store has written the record (`on_admin`).
                        self.core.push_command(StoreCmd::Write(op, ctx));
                        if let (Some(task), Some(id)) = (spawn.task.clone(), task_id) {
                            self.core.spawn_task(&record, task, id);
                        }
                        return;
                    }
                    Err((code, message)) => QueryResult::Error {
                        code: code.into(),
                        message,
                    },
                };
                self.answer_with(conn_id, env_id, reply, result);
                return;
            }
            QueryRequest::Release { name } => {
                let result = match self.core.release(conn_id, name, now_ms()) {
                    Ok(record) => QueryResult::Release { record },
                    Err((code, message)) => QueryResult::Error {
                        code: code.into(),
                        message,
                    },
                };
                self.answer_with(conn_id, env_id, reply, result);
                return;
            }
            QueryRequest::SpawnExited {
                name,
                status,
                lines,
            } => {
                let told = self.core.spawn_exited(name, *status, lines, now_ms());
                self.answer_with(conn_id, env_id, reply, QueryResult::SpawnExited { told });
                return;
            }
            _ => {}
        }
        // The asker's reply goes either into the store write's context (the closure, called
        // at most once: FnOnce) or, when nothing is written, to the answers below.
        let mut asker = Some((env_id, reply));
        let answer = self.core.on_claim_query(conn_id, &req, now(), |result| {
            let (env_id, reply) = asker.take().unwrap_or_default();
            WriteCtx::Answer {
                conn_id,
                env_id,
                reply,
                result: Box::new(result),
            }
        });
        match answer {
            Some(crate::routing::ClaimAnswer::Now(result)) => {
                if let Some((env_id, reply)) = asker.take() {
                    self.answer_with(conn_id, env_id, reply, *result);
                }
                return;
            }
            Some(crate::routing::ClaimAnswer::Stored) => return,
            None => {}
        }
        let Some((env_id, reply)) = asker else {
            return;
        };
        if let QueryRequest::ForgetAgent { name } = &req
            && let Err((code, message)) = self.core.forget(name)
        {
            let result = QueryResult::Error {
                code: code.into(),
                message,
            };
            self.answer_with(conn_id, env_id, reply, result);
            return;
        }
        let cmd = if let Some(op) = admin_op(&req) {
            let ctx = WriteCtx::Admin {
                conn_id,
                env_id,
                reply,
            };
            StoreCmd::Write(op, ctx)
        } else {
            let kind = match req {
                QueryRequest::Status => QueryKind::Status,
                QueryRequest::Agents => QueryKind::Agents,
                QueryRequest::Trace { .. } => QueryKind::Trace,
                _ => QueryKind::Other,
            };
            let ctx = QueryCtx {
                conn_id,
                env_id,
                kind,
                reply,
            };
            StoreCmd::Query(req, ctx)
        };
        // Sent with the core's commands, after any it decided before.
        self.core.push_command(cmd);
    }

    /// Starts forwarding the feed to a connection that sent `QUERY watch`, as RESULT frames
    /// carrying the query's id, until the connection goes.
    fn watch(&mut self, conn_id: u64, env_id: String, filter: Watch) {
        let stop = CancellationToken::new();
        // A second watch on the same connection replaces the first.
        let Some(tx) = self.core.watch(conn_id, stop.clone().drop_guard()) else {
            return;
        };
        tokio::spawn(forward_feed(
            self.feed.subscribe(),
            filter,
            tx,
            env_id,
            stop,
        ));
    }

    fn on_store_event(&mut self, ev: StoreEvent) {
        match self.core.on_store_event(ev, now()) {
            Some(StoreEvent::Written(
                WriteCtx::Admin {
                    conn_id,
                    env_id,
                    reply,
                },
                res,
            )) => self.on_admin(conn_id, env_id, reply, res),
            Some(StoreEvent::Written(
                WriteCtx::Answer {
                    conn_id,
                    env_id,
                    reply,
                    result,
                },
                res,
            )) => {
                let result = match res {
                    Ok(_) => *result,
                    Err(e) => QueryResult::Error {
                        code: "internal".into(),
                        message: format!("not stored: {e}"),
                    },
                };
                self.answer_with(conn_id, env_id, reply, result);
            }
            Some(StoreEvent::Query(ctx, result, stats, figures)) => {
                self.on_query_result(*ctx, result.map(|r| *r), stats, figures);
            }
            Some(other) => tracing::error!(?other, "store result the router does not expect"),
            None => {}
        }
    }

    /// Answers `dlq retry` and `dlq purge` once the store has done them.
    fn on_admin(
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
            Ok(WriteResult::Retried(o)) => self.core.retried(*o, now()),
            Ok(WriteResult::Spawned(record, task_id)) => {
                tracing::info!(worker = %record.name, parent = %record.parent, depth = record.depth, "spawned a worker");
                QueryResult::Spawn { record, task_id }
            }
            Ok(WriteResult::ChainExtended(thread, extra)) => {
                let max_hops = self.core.chain_extended(thread.clone(), extra);
                tracing::info!(%thread, extra, max_hops, "a person extended a reply chain's hop budget");
                QueryResult::ChainExtend {
                    thread,
                    extra,
                    max_hops,
                }
            }
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
        } else {
            let env = Envelope::new(env_id, now_ms(), Payload::Result(result));
            self.core.send_to(conn_id, Outbound::Frame(Box::new(env)));
        }
    }

    fn on_query_result(
        &self,
        mut ctx: QueryCtx,
        result: Option<QueryResult>,
        stats: relay_store::Stats,
        delivery: Option<Box<relay_protocol::query::DeliveryFigures>>,
    ) {
        if let (QueryKind::Trace, Some(QueryResult::Trace { trace }), Some(ask)) =
            (ctx.kind, &result, &self.cfg.federation_trace)
        {
            self.far_trace(ctx, trace.clone(), ask.clone());
            return;
        }
        let result = match (ctx.kind, result) {
            (QueryKind::Status, None) => {
                let (agents, known_agents) = self.core.agent_counts();
                let (rules, rules_error) = self.core.rules_status();
                QueryResult::Status(relay_protocol::query::StatusInfo {
                    running: true,
                    pid: std::process::id(),
                    socket: self.cfg.socket_path.display().to_string(),
                    db: self.db_location.clone(),
                    storage: self.storage.clone(),
                    uptime_s: self.started.elapsed().as_secs(),
                    agents,
                    known_agents,
                    messages: stats.messages,
                    pending: stats.pending,
                    version: env!("CARGO_PKG_VERSION").to_owned(),
                    rules,
                    rules_error,
                    delivery: delivery.map(|d| *d),
                    federation: self.cfg.federation.as_ref().and_then(|f| match f.lock() {
                        Ok(g) => g.clone().map(Box::new),
                        Err(_) => None,
                    }),
                })
            }
            (QueryKind::Agents, Some(QueryResult::Agents { mut agents })) => {
                self.core.complete_agents(&mut agents);
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
                (QueryResult::Agents { .. }, QueryKind::Agents) => self.core.live_agents(),
                _ => Vec::new(),
            };
            if reply.send(Answer { result, live }).is_err() {
                tracing::debug!("the dashboard request that asked for this is gone");
            }
            return;
        }
        // RESULT answers carry the question's id in `id` so the client can match them.
        let env = Envelope::new(ctx.env_id, now_ms(), Payload::Result(result));
        self.core
            .send_to(ctx.conn_id, Outbound::Frame(Box::new(env)));
    }
}

impl Router {
    /// Answers a trace once the federation link has added the legs on other nodes (it asks
    /// their links over NATS, off this task), or with this relay's legs alone if it cannot
    /// within [`FAR_TRACE_WAIT`].
    fn far_trace(&self, ctx: QueryCtx, trace: TraceRecord, ask: crate::TraceAsk) {
        let conn = if ctx.reply.is_some() {
            None
        } else {
            self.core.outbound(ctx.conn_id)
        };
        tokio::spawn(async move {
            let (tx, rx) = oneshot::channel();
            let asked = async {
                ask.send((trace.clone(), tx)).await.ok()?;
                rx.await.ok()
            };
            let trace = match tokio::time::timeout(FAR_TRACE_WAIT, asked).await {
                Ok(Some(t)) => t,
                Ok(None) | Err(_) => {
                    tracing::debug!("the federation link did not answer a trace in time");
                    trace
                }
            };
            let result = QueryResult::Trace { trace };
            if let Some(reply) = ctx.reply {
                if reply
                    .send(Answer {
                        result,
                        live: Vec::new(),
                    })
                    .is_err()
                {
                    tracing::debug!("the dashboard request that asked for this is gone");
                }
            } else if let Some((tx, killer)) = conn {
                let env = Envelope::new(ctx.env_id, now_ms(), Payload::Result(result));
                crate::routing::send_or_kill(&tx, &killer, Outbound::Frame(Box::new(env)));
            }
        });
    }
}

/// How long a trace waits for the legs on other nodes.
const FAR_TRACE_WAIT: Duration = Duration::from_secs(5);

/// A change of the rules file: the rules to put in force (`None`: keep the ones in force) and
/// why the file could not be used, if it could not.
#[derive(Debug)]
struct RulesChange {
    rules: Option<Rules>,
    error: Option<String>,
}

/// The rules file as last read: its modification time and length, and whether it held rules.
#[derive(Debug, Default, Clone, Copy)]
struct RulesFile {
    stamp: Option<(Option<std::time::SystemTime>, u64)>,
    had_rules: bool,
}

impl RulesFile {
    /// Reads the rules file if it changed (blocking: run on the blocking pool). A file that
    /// does not parse leaves the rules in force as they were (and `status` says why); a
    /// removed file allows everything.
    fn check(&mut self, path: &std::path::Path) -> Option<RulesChange> {
        let stamp = std::fs::metadata(path)
            .ok()
            .map(|m| (m.modified().ok(), m.len()));
        if stamp == self.stamp {
            return None;
        }
        self.stamp = stamp;
        if stamp.is_none() {
            if self.had_rules {
                tracing::info!(path = %path.display(), "rules file removed: everything is allowed");
            }
            self.had_rules = false;
            return Some(RulesChange {
                rules: Some(Rules::default()),
                error: None,
            });
        }
        let parsed = std::fs::read_to_string(path)
            .map_err(|e| e.to_string())
            .and_then(|t| Rules::parse(&t));
        Some(match parsed {
            Ok(rules) => {
                tracing::info!(count = rules.rules.len(), path = %path.display(), "access rules loaded");
                self.had_rules = !rules.rules.is_empty();
                RulesChange {
                    rules: Some(rules),
                    error: None,
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, path = %path.display(), "rules file is invalid; keeping the previous rules");
                RulesChange {
                    rules: None,
                    error: Some(format!("{}: {e}", path.display())),
                }
            }
        })
    }
}

/// Checks the rules file every [`RULES_CHECK`] on the blocking pool and sends what changed
/// to the router, until the daemon stops.
async fn watch_rules(
    path: PathBuf,
    mut file: RulesFile,
    tx: mpsc::Sender<RulesChange>,
    stop: CancellationToken,
) {
    let mut every =
        tokio::time::interval_at(tokio::time::Instant::now() + RULES_CHECK, RULES_CHECK);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            () = stop.cancelled() => break,
        }
        let p = path.clone();
        let checked = tokio::task::spawn_blocking(move || {
            let change = file.check(&p);
            (file, change)
        })
        .await;
        let change = match checked {
            Ok((f, change)) => {
                file = f;
                change
            }
            Err(e) => {
                tracing::error!(error = %e, "rules file check failed; rules are no longer reloaded");
                break;
            }
        };
        if let Some(change) = change
            && tx.send(change).await.is_err()
        {
            break;
        }
    }
}

/// The thread that writes `agents.json`, so that the router never waits for a file system.
/// Snapshots are handed over as text; a thread behind writes only the newest.
struct AgentsFile {
    tx: std::sync::mpsc::Sender<String>,
    thread: std::thread::JoinHandle<()>,
}

impl AgentsFile {
    fn start(path: PathBuf) -> Self {
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let thread = std::thread::spawn(move || {
            while let Ok(mut doc) = rx.recv() {
                // Only the newest snapshot matters.
                while let Ok(newer) = rx.try_recv() {
                    doc = newer;
                }
                // A reader never sees a half-written file; a power loss may lose the newest
                // (it is rewritten at the next change), so no fsync.
                match write_atomic(&path, doc.as_bytes(), Durability::ProcessCrash) {
                    Ok(()) => tracing::trace!("agents.json written"),
                    Err(e) => {
                        tracing::warn!(error = %e, path = %path.display(), "could not write agents.json");
                    }
                }
            }
        });
        Self { tx, thread }
    }

    /// Hands the thread a new snapshot.
    fn write(&self, doc: String) {
        if self.tx.send(doc).is_err() {
            tracing::warn!("agents.json writer is gone; the file is no longer updated");
        }
    }

    /// Waits until the last snapshot is written (at shutdown).
    async fn finish(self) {
        drop(self.tx);
        let thread = self.thread;
        match tokio::task::spawn_blocking(move || thread.join()).await {
            Ok(Ok(())) => {}
            _ => tracing::warn!("agents.json writer failed at shutdown"),
        }
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
