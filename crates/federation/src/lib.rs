//! agent-relay federation (issue 16): relays on several hosts joined through NATS JetStream.
//!
//! Each relay stays the authority for its own agents, its own store and its own deliveries.
//! The link this crate runs next to the daemon (`agent-relay up --cluster URL --node NAME`)
//! adds, over the daemon's own socket and protocol:
//!
//! - **the directory**: every local agent is claimed in a JetStream KV bucket (the first node to
//!   claim a name keeps it), and every agent of another node gets a *stand-in* here: a
//!   session under its name (`cli: remote@<node>`, its topics subscribed) on the one link
//!   connection this process keeps to its relay for that node ([`link`], issue 28.8). The
//!   stand-in holds the name, so a local HELLO under it is refused `name_in_use`, and `agents`
//!   lists it with its node;
//! - **out**: the local store delivers a message for a remote agent to its stand-in, like to any
//!   agent, once committed (the sender's ACK already meant durable: the store is the outbox).
//!   The stand-in publishes it to the target node's subject with `Nats-Msg-Id` derived from
//!   (from, id, node) and acknowledges the DELIVER only after JetStream's PubAck; until then
//!   it stays unacknowledged in the store, and is replayed after any crash;
//! - **in**: a durable pull consumer per node takes its subject's messages and SENDs each one
//!   through the stand-in of its sender, with the original id; JetStream's message is
//!   acknowledged only after the local relay's ACK (stored, or `duplicate`: the store's
//!   (from, id) dedupe catches every redelivery).
//!
//! The decisions are in [`core`] (pure); this file is the I/O around them. docs/FEDERATION.md
//! has the design, the guarantees and their limits.

pub mod core;
mod link;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer::PullConsumer, kv};
use futures_util::StreamExt;
use futures_util::stream::FuturesOrdered;
use relay_client::{Client, ClientConfig, ClientError, Delivered, Event, Outgoing};
use relay_protocol::DeliveryState;
use relay_protocol::query::{
    FederationStatus, QueryRequest, QueryResult, RemoteAgent, TraceRecord,
};
use tokio::sync::mpsc;

use crate::core::{Claim, Entry, Forward, Local, Wire};

/// Where the link keeps its state for the daemon's `status` (the daemon's `FederationCell`).
pub type Cell = Arc<Mutex<Option<FederationStatus>>>;

/// The daemon's `trace` answers, each to be completed with the legs on other nodes (the other
/// end of the daemon's `TraceAsk`).
pub type TraceRequests = mpsc::Receiver<(TraceRecord, tokio::sync::oneshot::Sender<TraceRecord>)>;

/// How to join the federation.
#[derive(Debug, Clone)]
pub struct Options {
    /// `--cluster`: comma-separated NATS URLs.
    pub cluster: String,
    /// `--node`: this relay's name in the federation.
    pub node: String,
    /// The local daemon's socket.
    pub socket: PathBuf,
    /// A NATS credentials file (`.creds`: JWT and NKey seed).
    pub creds: Option<PathBuf>,
    /// A CA certificate file (PEM): TLS is required and the servers are checked against it.
    pub ca: Option<PathBuf>,
    /// How long JetStream keeps a message no node has consumed (a node down that long misses
    /// it: it is the limit of "a node that was down receives what was sent meanwhile").
    pub retention: Duration,
    /// Replicas of the stream and the bucket; 0: min(3, servers the cluster advertises).
    pub replicas: usize,
    /// This relay's inbox TTL: a message published to another node expires there when it
    /// would have here (its acceptance here plus this), not a TTL after it arrives.
    pub inbox_ttl: Duration,
    /// The names of this node's people (`human` and the configured ones): no other node
    /// speaks as them here.
    pub people: Vec<String>,
    /// This relay's identity (a random id kept in its data directory): the same relay
    /// restarted takes its node name back at once; another relay never does while it lives.
    pub instance: String,
    /// The host name (shown to a relay refused this node name).
    pub host: String,
    /// The data directory (shown likewise).
    pub data_dir: String,
    /// The node name was not given and is the host name: a refusal says so.
    pub node_from_host: bool,
    /// JetStream publishes this link may have written and not yet seen the PubAck of, across
    /// every far node ([`PUBLISH_SLOTS`] unless a test lowers it to reach the wait for a slot
    /// with few messages: `AGENT_RELAY_TEST_PUBLISH_SLOTS`).
    pub publish_slots: usize,
}

/// JetStream publishes in flight on one link by default (async-nats's own default).
pub const PUBLISH_SLOTS: usize = 5_000;

/// Why the link cannot start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FederationError {
    /// The node name is not usable.
    #[error(transparent)]
    Node(#[from] core::BadNode),
    /// `--cluster` has no URL.
    #[error("--cluster names no NATS server (expected nats://HOST:PORT[,nats://HOST:PORT...])")]
    NoServers,
    /// The credentials file could not be read.
    #[error("cannot read the NATS credentials file {path}: {source}")]
    Creds {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The NATS client refused the options (a bad URL, say).
    #[error("cannot connect to NATS: {0}")]
    Connect(String),
    /// Another live relay holds this node name (or took it over from this one).
    #[error("{0}")]
    NodeTaken(String),
}

/// Why setting up the link did not succeed.
enum SetupError {
    /// NATS is not ready (unreachable, no leader yet...): tried again.
    Retry(String),
    /// Another live relay holds the node name: the link does not start.
    Taken(String),
}

/// What every task of the link shares.
struct Shared {
    me: String,
    cluster: String,
    client: async_nats::Client,
    js: jetstream::Context,
    /// What the last directory pass decided ([`View`]): written only by that pass
    /// ([`Shared::publish_view`]), read by every other task as one consistent snapshot.
    view: tokio::sync::watch::Sender<Arc<View>>,
    /// Senders the local relay was asked about and does not list as agents (tools, people's
    /// `send`); a name leaves it when a directory pass lists it as an agent. Without it every
    /// delivery of a tool's message asked the relay for its whole agent list, on the store's
    /// thread (measured: it bounded the cross-node rate of tools' messages at ~1,200 msg/s).
    /// A cache beside the view: a stand-in adds to it, a directory pass prunes it.
    tools: Mutex<HashSet<String>>,
    published: AtomicU64,
    received: AtomicU64,
    cell: Cell,
    /// This relay's inbox TTL ([`Options::inbox_ttl`]).
    inbox_ttl: Duration,
    /// JetStream's sequence of recent publishes, by `Nats-Msg-Id` (for `trace`; bounded, and
    /// not kept across a restart).
    pubacks: Mutex<PubAcks>,
    /// Each far node's publisher ([`batcher`]).
    batchers: Mutex<Batchers>,
    /// The local relay's socket.
    socket: PathBuf,
    /// Each far node's link: one connection to the local relay speaking for all its agents
    /// (issue 28.8; made again when it ends).
    links: tokio::sync::Mutex<HashMap<String, Arc<link::LinkConn>>>,
}

/// What a directory pass decided, as every task of the link reads it.
#[derive(Debug, Default)]
struct View {
    /// Names with a stand-in here: agents of other nodes. A delivery from one of them is
    /// never published again (its own node published it to every node).
    remote: HashSet<String>,
    /// Local agents whose name another node holds, and that node.
    conflicts: HashMap<String, String>,
    /// Every agent this relay knows that is its own (online or not): a sender not among them
    /// (and no stand-in) is a tool.
    agents: HashSet<String>,
    /// Agents of other nodes (with a stand-in here) and their node: whom `trace` asks.
    nodes: HashMap<String, String>,
}

/// The names of this relay's own agents (not stand-ins) in an agent list.
fn local_agents(agents: &[relay_protocol::query::AgentInfo]) -> HashSet<String> {
    agents
        .iter()
        .filter(|a| core::standin_node(a.cli.as_deref()).is_none())
        .map(|a| a.name.clone())
        .collect()
}

/// Each far node's publisher: where its stand-ins hand messages, and its task.
type Batchers = HashMap<String, (mpsc::Sender<Out>, tokio::task::AbortHandle)>;

/// Recent PubAcks: `Nats-Msg-Id` -> stream sequence, the oldest forgotten first.
#[derive(Default)]
struct PubAcks {
    seqs: HashMap<String, u64>,
    order: std::collections::VecDeque<String>,
}

impl PubAcks {
    fn insert(&mut self, msg_id: &str, seq: u64) {
        if self.seqs.insert(msg_id.to_owned(), seq).is_none() {
            self.order.push_back(msg_id.to_owned());
            while self.order.len() > REORDER_MEMORY {
                if let Some(old) = self.order.pop_front() {
                    self.seqs.remove(&old);
                }
            }
        }
    }
}

impl Shared {
    /// The publisher of messages to `node` ([`batcher`]), started if needed.
    fn batcher(self: &Arc<Self>, node: &str) -> mpsc::Sender<Out> {
        let mut map = self
            .batchers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((tx, _)) = map.get(node)
            && !tx.is_closed()
        {
            return tx.clone();
        }
        let (tx, rx) = mpsc::channel(core::BATCH_MAX * BATCHES_IN_FLIGHT);
        let task = tokio::spawn(batcher(self.clone(), node.to_owned(), rx));
        map.insert(node.to_owned(), (tx.clone(), task.abort_handle()));
        tx
    }

    /// The connection to the local relay that speaks for `node`'s agents, made if there is
    /// none (or it ended).
    async fn link(&self, node: &str) -> Result<Arc<link::LinkConn>, String> {
        let mut links = self.links.lock().await;
        if let Some(l) = links.get(node)
            && !l.is_closed()
        {
            return Ok(l.clone());
        }
        let l = link::LinkConn::connect(&self.socket, node).await?;
        links.insert(node.to_owned(), l.clone());
        Ok(l)
    }

    /// Gives `name` up on `node`'s link, if it has one (a stand-in stopped or restarted: the
    /// BYE goes before the next HELLO for it).
    async fn detach(&self, node: &str, name: &str) {
        let l = self.links.lock().await.get(node).cloned();
        if let Some(l) = l {
            l.detach(name).await;
        }
    }

    /// Stops every node's publisher (the link stops: another relay holds this node name).
    fn stop_batchers(&self) {
        let mut map = self
            .batchers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (_, (_, task)) in map.drain() {
            task.abort();
        }
    }

    /// JetStream stored these messages (their `Nats-Msg-Id`s) at `seq`: counted, and the
    /// sequence kept for `trace`.
    fn stored_by_jetstream<'a>(&self, msg_ids: impl IntoIterator<Item = &'a str>, seq: u64) {
        let mut p = self
            .pubacks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for id in msg_ids {
            self.published.fetch_add(1, Ordering::Relaxed);
            p.insert(id, seq);
        }
    }

    /// The last directory pass's view (a snapshot: later passes do not change it).
    fn view(&self) -> Arc<View> {
        self.view.borrow().clone()
    }

    /// Publishes a directory pass's view (the one writer: `sync`).
    fn publish_view(&self, view: View) {
        self.view.send_replace(Arc::new(view));
    }

    fn is_remote(&self, name: &str) -> bool {
        self.view().remote.contains(name)
    }

    fn is_conflict(&self, name: &str) -> bool {
        self.view().conflicts.contains_key(name)
    }

    /// The node that holds `name` when a local agent has it too (a name conflict).
    fn conflict_owner(&self, name: &str) -> Option<String> {
        self.view().conflicts.get(name).cloned()
    }

    /// The node the directory gives `name`, an agent of another node.
    fn node_of(&self, name: &str) -> Option<String> {
        self.view().nodes.get(name).cloned()
    }

    fn is_local_agent(&self, name: &str) -> bool {
        self.view().agents.contains(name)
    }

    fn is_known_tool(&self, name: &str) -> bool {
        self.tools_cache().contains(name)
    }

    fn tools_cache(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.tools
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A tool's name that an agent took since is one no more.
    fn forget_tools_now_agents(&self, agents: &[relay_protocol::query::AgentInfo]) {
        let now = local_agents(agents);
        self.tools_cache().retain(|n| !now.contains(n));
    }
}

/// Runs the link until the process ends. Returns early only for options that can never work;
/// NATS being unreachable is not one (the link retries, messages wait in the store).
///
/// # Errors
/// [`FederationError`].
pub async fn run(opts: Options, cell: Cell, traces: TraceRequests) -> Result<(), FederationError> {
    core::validate_node(&opts.node)?;
    let servers = core::servers(&opts.cluster);
    if servers.is_empty() {
        return Err(FederationError::NoServers);
    }
    set_cell(&cell, |s| {
        s.node = opts.node.clone();
        s.cluster = opts.cluster.clone();
        s.link = "connecting".into();
    });
    let co = connect_options(&opts)
        .await?
        .retry_on_initial_connect()
        // The link's state follows the client's own events, the moment they happen: a
        // directory pass can be slow while a server is gone, and must not be what says so.
        .event_callback({
            let cell = cell.clone();
            move |event| {
                let cell = cell.clone();
                async move { on_event(&cell, &event) }
            }
        });
    let client = co
        .connect(servers)
        .await
        .map_err(|e| FederationError::Connect(e.to_string()))?;
    // Publishing waits for a slot (backpressure), never fails for want of one.
    let js = jetstream::ContextBuilder::new()
        .max_ack_inflight(opts.publish_slots.max(1))
        .backpressure_on_inflight(true)
        .build(client.clone());
    let shared = Arc::new(Shared {
        me: opts.node.clone(),
        cluster: opts.cluster.clone(),
        client,
        js,
        view: tokio::sync::watch::Sender::new(Arc::new(View::default())),
        tools: Mutex::new(HashSet::new()),
        published: AtomicU64::new(0),
        received: AtomicU64::new(0),
        cell,
        inbox_ttl: opts.inbox_ttl,
        pubacks: Mutex::new(PubAcks::default()),
        batchers: Mutex::new(HashMap::new()),
        socket: opts.socket.clone(),
        links: tokio::sync::Mutex::new(HashMap::new()),
    });
    tokio::spawn(answer_traces(shared.clone(), traces));
    let mut resume_from = None;
    let (kv, consumer, nodes, lease) = loop {
        match setup(&shared, &opts, &mut resume_from).await {
            Ok(x) => break x,
            Err(SetupError::Taken(why)) => {
                tracing::error!("federation: not joined: {why}");
                set_cell(&shared.cell, |s| {
                    s.link = "refused".into();
                    s.error = Some(why.clone());
                });
                return Err(FederationError::NodeTaken(why));
            }
            Err(SetupError::Retry(e)) => {
                tracing::warn!(error = %e, "federation: NATS not ready; retrying");
                set_cell(&shared.cell, |s| s.error = Some(e.clone()));
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    };
    tracing::info!(node = %opts.node, cluster = %opts.cluster, "federation: joined");
    let tool = loop {
        let mut cfg = ClientConfig::tool(&opts.socket, core::TOOL_NAME);
        cfg.reconnect = true;
        match Client::connect(cfg).await {
            Ok(c) => break c,
            Err(e) => {
                tracing::warn!(error = %e, "federation: cannot reach the local relay; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let (inbound_tx, inbound_rx) = mpsc::channel(1024);
    // Everything that acts for this node runs in one set, stopped at once if another relay
    // takes the node name over (dropping the set aborts its tasks; the stand-ins go with the
    // directory loop that holds them).
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(consume(shared.clone(), consumer, inbound_tx));
    let tool = Arc::new(tool);
    tasks.spawn(serve_traces(shared.clone(), tool.clone()));
    tasks.spawn(manage(shared.clone(), opts.clone(), kv, tool, inbound_rx));
    let why = keep_node(nodes, opts, lease).await;
    tracing::error!("federation: the link stops: {why}");
    tasks.abort_all();
    shared.stop_batchers();
    set_cell(&shared.cell, |s| {
        s.link = "stopped".into();
        s.error = Some(why.clone());
    });
    Err(FederationError::NodeTaken(why))
}

/// The NATS client's options every connection of the link shares: name, reconnection,
/// credentials, TLS.
async fn connect_options(opts: &Options) -> Result<async_nats::ConnectOptions, FederationError> {
    let mut co = async_nats::ConnectOptions::new()
        .name(format!("agent-relay {}", opts.node))
        .max_reconnects(None)
        .connection_timeout(Duration::from_secs(2))
        // Back within a quarter second of a server's return, and never more than 2 s later:
        // the backlog waits for this.
        .reconnect_delay_callback(|n| Duration::from_millis((50u64 << n.min(6)).min(2000)));
    if let Some(path) = &opts.creds {
        co = co
            .credentials_file(path)
            .await
            .map_err(|source| FederationError::Creds {
                path: path.clone(),
                source,
            })?;
    }
    if let Some(ca) = &opts.ca {
        co = co.add_root_certificates(ca.clone()).require_tls(true);
    }
    Ok(co)
}

/// Takes this relay's node name before the relay starts serving, when NATS answers within a
/// few seconds: another live relay holding it is refused here, so `up` fails with what to
/// do. NATS unreachable is no refusal: the link takes the name when it joins (and stops
/// then if the name is held).
///
/// # Errors
/// [`FederationError::NodeTaken`], and the option errors of [`run`].
pub async fn claim_node_at_start(opts: &Options) -> Result<(), FederationError> {
    core::validate_node(&opts.node)?;
    let servers = core::servers(&opts.cluster);
    if servers.is_empty() {
        return Err(FederationError::NoServers);
    }
    let co = connect_options(opts).await?.max_reconnects(Some(1));
    let client = match tokio::time::timeout(Duration::from_secs(3), co.connect(servers)).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "federation: NATS not reachable at start; the link takes node name {} when it joins", opts.node);
            return Ok(());
        }
        Err(_) => {
            tracing::warn!(
                "federation: NATS did not answer within 3 s at start; the link takes node name {} when it joins",
                opts.node
            );
            return Ok(());
        }
    };
    let js = jetstream::new(client.clone());
    let result = async {
        let kv = nodes_bucket(&js, replicas_for(&client, opts)).await?;
        claim_node(&kv, opts).await.map(|_| ())
    }
    .await;
    match result {
        Ok(()) => Ok(()),
        Err(SetupError::Taken(why)) => Err(FederationError::NodeTaken(why)),
        Err(SetupError::Retry(why)) => {
            tracing::warn!(%why, "federation: cannot take the node name at start; the link takes it when it joins");
            Ok(())
        }
    }
}

/// Removes `nodes` from the federation at `cluster` for good: their agents' directory entries
/// (other relays stop their stand-ins), their node-name leases and their durable consumers.
/// For relays that are stopped and will not come back (`bench --cluster`'s private pair):
/// left behind, their agents are shown online for ever. Returns the directory entries removed.
///
/// # Errors
/// [`FederationError::Connect`] when NATS cannot be reached or refuses a step.
pub async fn forget_nodes(cluster: &str, nodes: &[String]) -> Result<usize, FederationError> {
    let servers = core::servers(cluster);
    if servers.is_empty() {
        return Err(FederationError::NoServers);
    }
    let err =
        |what: &str, e: &dyn std::fmt::Display| FederationError::Connect(format!("{what}: {e}"));
    let client = tokio::time::timeout(
        Duration::from_secs(5),
        async_nats::ConnectOptions::new()
            .name("agent-relay forget")
            .connect(servers),
    )
    .await
    .map_err(|_| FederationError::Connect("no answer within 5 s".into()))?
    .map_err(|e| err("connect", &e))?;
    let js = jetstream::new(client);
    let mut removed = 0;
    if let Ok(dir) = js.get_key_value(core::BUCKET).await {
        let mut keys = dir.keys().await.map_err(|e| err("directory", &e))?;
        let mut names = Vec::new();
        while let Some(k) = keys.next().await {
            names.push(k.map_err(|e| err("directory", &e))?);
        }
        for name in names {
            let Some(value) = dir.get(&name).await.map_err(|e| err("directory", &e))? else {
                continue;
            };
            let owned =
                serde_json::from_slice::<Entry>(&value).is_ok_and(|e| nodes.contains(&e.node));
            if owned {
                dir.purge(&name).await.map_err(|e| err("directory", &e))?;
                removed += 1;
            }
        }
    }
    if let Ok(leases) = js.get_key_value(core::NODES_BUCKET).await {
        for node in nodes {
            leases
                .purge(node)
                .await
                .map_err(|e| err("node names", &e))?;
        }
    }
    if let Ok(stream) = js.get_stream(core::STREAM).await {
        for node in nodes {
            // Absent already (never made, or removed) is as good.
            if let Err(e) = stream.delete_consumer(&core::consumer(node)).await {
                tracing::debug!(error = %e, %node, "federation: consumer not removed");
            }
        }
    }
    Ok(removed)
}

/// What JetStream alone sustains ([`jetstream_floor`]), in messages a second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Floor {
    /// Publishes with `Nats-Msg-Id` and a PubAck each, pipelined.
    pub publish_per_s: f64,
    /// A durable pull consumer taking them, a confirmed ack each, pipelined.
    pub consume_per_s: f64,
}

/// Measures what JetStream alone does at `cluster` with the federation's durability: `n`
/// messages of `bytes` to a file stream of its own (deleted afterwards), published with
/// `Nats-Msg-Id` and a PubAck each (`window` in flight), then consumed by a durable pull
/// consumer with a confirmed ack each (as the link does). The ceiling under `bench --cluster`.
///
/// # Errors
/// [`FederationError::Connect`] with the step that failed.
pub async fn jetstream_floor(
    cluster: &str,
    n: usize,
    bytes: usize,
    window: usize,
) -> Result<Floor, FederationError> {
    let e =
        |what: &str, e: &dyn std::fmt::Display| FederationError::Connect(format!("{what}: {e}"));
    let servers = core::servers(cluster);
    if servers.is_empty() {
        return Err(FederationError::NoServers);
    }
    let client = async_nats::ConnectOptions::new()
        .name("agent-relay floor")
        .connect(servers)
        .await
        .map_err(|x| e("connect", &x))?;
    let js = jetstream::new(client);
    let name = format!("FLOOR_{}", std::process::id());
    let subject = format!("agent-relay-floor.{}", std::process::id());
    let stream = js
        .create_stream(jetstream::stream::Config {
            name: name.clone(),
            subjects: vec![subject.clone()],
            storage: jetstream::stream::StorageType::File,
            duplicate_window: Duration::from_secs(600),
            ..Default::default()
        })
        .await
        .map_err(|x| e("stream", &x))?;
    let result = async {
        let body = bytes::Bytes::from(vec![b'x'; bytes]);
        let window = window.max(1);
        let start = relay_protocol::now_instant();
        let mut inflight: FuturesOrdered<
            futures_util::future::BoxFuture<
                'static,
                Result<jetstream::publish::PublishAck, jetstream::context::PublishError>,
            >,
        > = FuturesOrdered::new();
        for i in 0..n {
            if inflight.len() >= window
                && let Some(r) = inflight.next().await
            {
                let _: jetstream::publish::PublishAck = r.map_err(|x| e("publish", &x))?;
            }
            let m = jetstream::message::PublishMessage::build()
                .payload(body.clone())
                .message_id(format!("m{i}"));
            let ack = js
                .send_publish(subject.clone(), m)
                .await
                .map_err(|x| e("publish", &x))?;
            inflight.push_back(Box::pin(std::future::IntoFuture::into_future(ack)));
        }
        while let Some(r) = inflight.next().await {
            r.map_err(|x| e("publish", &x))?;
        }
        let publish = start.elapsed();
        let consumer: PullConsumer = stream
            .create_consumer(jetstream::consumer::pull::Config {
                durable_name: Some("floor".into()),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                max_ack_pending: CONSUMER_IN_FLIGHT,
                ..Default::default()
            })
            .await
            .map_err(|x| e("consumer", &x))?;
        let start = relay_protocol::now_instant();
        let mut messages = consumer
            .stream()
            .max_messages_per_batch(512)
            .messages()
            .await
            .map_err(|x| e("consume", &x))?;
        let mut acks = FuturesOrdered::new();
        let mut got = 0usize;
        while got < n {
            let Some(m) = messages.next().await else {
                break;
            };
            let m = m.map_err(|x| e("consume", &x))?;
            got += 1;
            acks.push_back(async move { m.double_ack().await });
            if acks.len() >= window
                && let Some(r) = acks.next().await
            {
                r.map_err(|x| e("ack", &x))?;
            }
        }
        while let Some(r) = acks.next().await {
            r.map_err(|x| e("ack", &x))?;
        }
        let consume = start.elapsed();
        Ok(Floor {
            publish_per_s: n as f64 / publish.as_secs_f64().max(1e-9),
            consume_per_s: got as f64 / consume.as_secs_f64().max(1e-9),
        })
    }
    .await;
    if let Err(x) = js.delete_stream(&name).await {
        tracing::warn!(error = %x, stream = %name, "federation: the floor's stream is left on the servers");
    }
    result
}

fn replicas_for(client: &async_nats::Client, opts: &Options) -> usize {
    if opts.replicas > 0 {
        opts.replicas
    } else {
        client.server_info().connect_urls.len().clamp(1, 3)
    }
}

/// The stream behind a KV bucket as the directory and the node names need it (made here
/// rather than by `create_key_value`, whose defaults differ between nats-server versions):
/// one value per key, rollups, direct gets, no deletes.
fn kv_stream(bucket: &str, replicas: usize) -> jetstream::stream::Config {
    jetstream::stream::Config {
        name: format!("KV_{bucket}"),
        subjects: vec![format!("$KV.{bucket}.>")],
        max_messages_per_subject: 1,
        storage: jetstream::stream::StorageType::File,
        num_replicas: replicas,
        allow_rollup: true,
        deny_delete: true,
        allow_direct: true,
        discard: jetstream::stream::DiscardPolicy::New,
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    }
}

/// The bucket of node names (made if absent), like the directory's.
async fn nodes_bucket(js: &jetstream::Context, replicas: usize) -> Result<kv::Store, SetupError> {
    js.create_or_update_stream(kv_stream(core::NODES_BUCKET, replicas))
        .await
        .map_err(|e| SetupError::Retry(format!("node names bucket: {e}")))?;
    js.get_key_value(core::NODES_BUCKET)
        .await
        .map_err(|e| SetupError::Retry(format!("node names bucket: {e}")))
}

/// This relay's lease, as it writes it.
fn my_lease(opts: &Options, renewals: u64) -> core::NodeLease {
    core::NodeLease {
        owner: opts.instance.clone(),
        host: opts.host.clone(),
        pid: std::process::id(),
        data_dir: opts.data_dir.clone(),
        renewals,
    }
}

/// The lease under `node` now, with its revision (`None`: nobody holds the name).
async fn read_lease(
    kv: &kv::Store,
    node: &str,
) -> Result<Option<(u64, Option<core::NodeLease>)>, SetupError> {
    let entry = kv
        .entry(node)
        .await
        .map_err(|e| SetupError::Retry(format!("node names: {e}")))?;
    Ok(entry
        .filter(|e| e.operation == kv::Operation::Put)
        .map(|e| (e.revision, serde_json::from_slice(&e.value).ok())))
}

/// Takes the node name: free, this relay's own (restarted), or held by a relay that has not
/// renewed it for [`core::LEASE_LAPSE_MS`] (watched that long). Returns the revision written.
async fn claim_node(kv: &kv::Store, opts: &Options) -> Result<u64, SetupError> {
    for _ in 0..5 {
        let current = read_lease(kv, &opts.node).await?;
        let lapsed = match &current {
            Some((rev, Some(held))) if held.owner != opts.instance => {
                tracing::info!(node = %opts.node, host = %held.host, pid = held.pid,
                    "federation: another relay held this node name; waiting to see whether it is alive");
                lapsed(kv, &opts.node, *rev).await?
            }
            _ => false,
        };
        let held = current.as_ref().and_then(|(_, l)| l.as_ref());
        if let Some(h) = held
            && !core::may_take_node(&opts.instance, Some(h), lapsed)
        {
            return Err(SetupError::Taken(core::node_taken_message(
                &opts.node,
                h,
                opts.node_from_host,
            )));
        }
        let value = serde_json::to_vec(&my_lease(opts, 0))
            .map_err(|e| SetupError::Retry(format!("node lease: {e}")))?;
        let written = match current {
            None => kv
                .create(&opts.node, value.into())
                .await
                .map_err(|e| e.to_string()),
            Some((rev, _)) => kv
                .update(&opts.node, value.into(), rev)
                .await
                .map_err(|e| e.to_string()),
        };
        match written {
            Ok(rev) => return Ok(rev),
            // Another relay wrote meanwhile: read again and decide again.
            Err(e) => tracing::debug!(error = %e, "federation: node name changed while taking it"),
        }
    }
    Err(SetupError::Retry(
        "node name: the lease keeps changing under this relay".into(),
    ))
}

/// Watches a lease for [`core::LEASE_LAPSE_MS`]: true when it was not renewed (its relay is
/// gone), false as soon as it is.
async fn lapsed(kv: &kv::Store, node: &str, rev: u64) -> Result<bool, SetupError> {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(core::LEASE_LAPSE_MS);
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
        match read_lease(kv, node).await? {
            Some((now, _)) if now != rev => return Ok(false),
            Some(_) => {}
            None => return Ok(true),
        }
    }
    Ok(true)
}

/// Renews the lease every [`core::LEASE_RENEW_MS`] for as long as this relay holds its node
/// name; returns why it no longer does (another relay took it over: this one stood still
/// longer than the lapse, or is a copy of it under the same identity). While NATS is away
/// it keeps trying: nobody else can take the name then either.
async fn keep_node(kv: kv::Store, opts: Options, mut rev: u64) -> String {
    let mut tick = tokio::time::interval(Duration::from_millis(core::LEASE_RENEW_MS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut renewals = 0u64;
    loop {
        tick.tick().await;
        renewals += 1;
        let value = match serde_json::to_vec(&my_lease(&opts, renewals)) {
            Ok(v) => v,
            Err(e) => {
                tracing::error!(error = %e, "federation: cannot encode the node lease");
                continue;
            }
        };
        match kv.update(&opts.node, value.into(), rev).await {
            Ok(r) => rev = r,
            Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                match read_lease(&kv, &opts.node).await {
                    // Its own renewal whose answer was lost (a server failing over).
                    Ok(Some((r, Some(l))))
                        if l.owner == opts.instance
                            && l.pid == std::process::id()
                            && l.host == opts.host =>
                    {
                        rev = r;
                    }
                    Ok(Some((_, Some(l)))) => {
                        return format!(
                            "this relay no longer holds node name {}: {}",
                            opts.node,
                            core::node_taken_message(&opts.node, &l, opts.node_from_host)
                        );
                    }
                    Ok(_) => {
                        // Removed (by `bench`'s clean-up, say): taken again.
                        match claim_node(&kv, &opts).await {
                            Ok(r) => rev = r,
                            Err(SetupError::Taken(why)) => return why,
                            Err(SetupError::Retry(why)) => {
                                tracing::debug!(%why, "federation: node lease not renewed; retrying")
                            }
                        }
                    }
                    Err(SetupError::Taken(why) | SetupError::Retry(why)) => {
                        tracing::debug!(%why, "federation: node lease unreadable; retrying")
                    }
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "federation: node lease not renewed (NATS away?); retrying")
            }
        }
    }
}

/// The NATS client's events: the link's state (this is its one writer) and what went wrong.
fn on_event(cell: &Cell, event: &async_nats::Event) {
    let link = match event {
        async_nats::Event::Connected => "connected",
        async_nats::Event::Disconnected => "disconnected",
        async_nats::Event::Closed => "closed",
        other => {
            tracing::warn!(event = %other, "federation: NATS");
            return;
        }
    };
    tracing::info!(link, "federation: NATS link");
    set_cell(cell, |s| s.link = link.into());
}

fn set_cell(cell: &Cell, f: impl FnOnce(&mut FederationStatus)) {
    if let Ok(mut g) = cell.lock() {
        f(g.get_or_insert_with(FederationStatus::default));
    }
}

/// Creates (or finds) the stream, this node's durable consumer and the directory bucket.
///
/// The consumer is made anew at every start, from the first message this node had not
/// acknowledged (`resume_from`, kept across retries): messages a crashed relay had taken but
/// not stored come again first and in order, instead of after the ack wait behind newer
/// ones (which would break a sender's order). What it had stored comes again too and is a
/// `duplicate` here.
async fn setup(
    sh: &Shared,
    opts: &Options,
    resume_from: &mut Option<u64>,
) -> Result<(kv::Store, PullConsumer, kv::Store, u64), SetupError> {
    let replicas = replicas_for(&sh.client, opts);
    // The node name first: a relay that does not hold it must not touch its consumer (a
    // second relay under one name used to recreate it and take half its messages).
    let nodes = nodes_bucket(&sh.js, replicas).await?;
    let lease = claim_node(&nodes, opts).await?;
    let (kv, consumer) = setup_streams(sh, opts, replicas, resume_from)
        .await
        .map_err(SetupError::Retry)?;
    Ok((kv, consumer, nodes, lease))
}

/// The stream, this node's durable consumer and the directory bucket ([`setup`]).
async fn setup_streams(
    sh: &Shared,
    opts: &Options,
    replicas: usize,
    resume_from: &mut Option<u64>,
) -> Result<(kv::Store, PullConsumer), String> {
    sh.js
        .create_or_update_stream(jetstream::stream::Config {
            name: core::STREAM.into(),
            subjects: vec![format!("{}.*", core::SUBJECT_PREFIX)],
            storage: jetstream::stream::StorageType::File,
            max_age: opts.retention,
            num_replicas: replicas,
            // A re-publish after a crash or a partition comes within minutes; past this the
            // receiving store's (from, id) dedupe still catches it.
            duplicate_window: Duration::from_secs(600),
            ..Default::default()
        })
        .await
        .map_err(|e| format!("stream: {e}"))?;
    let stream = sh
        .js
        .get_stream(core::STREAM)
        .await
        .map_err(|e| format!("stream: {e}"))?;
    let durable = core::consumer(&sh.me);
    if resume_from.is_none() {
        match stream.consumer_info(&durable).await {
            Ok(info) => {
                *resume_from = Some(info.ack_floor.stream_sequence + 1);
                stream
                    .delete_consumer(&durable)
                    .await
                    .map_err(|e| format!("consumer: {e}"))?;
            }
            Err(e) if e.kind() == jetstream::context::ConsumerInfoErrorKind::NotFound => {
                *resume_from = Some(1);
            }
            Err(e) => return Err(format!("consumer: {e}")),
        }
    }
    let start_sequence = resume_from.unwrap_or(1);
    let consumer: PullConsumer = stream
        .get_or_create_consumer(
            &durable,
            jetstream::consumer::pull::Config {
                durable_name: Some(durable.clone()),
                deliver_policy: jetstream::consumer::DeliverPolicy::ByStartSequence {
                    start_sequence,
                },
                filter_subject: core::subject(&sh.me),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                ack_wait: Duration::from_secs(10),
                // Many in flight: the relay commits them in groups. A delivery lost with a NATS
                // server that died comes again only after the ack wait, behind later messages;
                // the manager's `Reorder` holds those later ones of the same sender until it
                // has gone (each message names its predecessor).
                max_ack_pending: CONSUMER_IN_FLIGHT,
                ..Default::default()
            },
        )
        .await
        .map_err(|e| format!("consumer: {e}"))?;
    // The bucket's stream is made here as `create_or_update_key_value` would make it (that
    // call first reads the account's info, which async-nats cannot parse from a 2.9 server,
    // Debian's): one value per key, rollups, direct gets.
    sh.js
        .create_or_update_stream(kv_stream(core::BUCKET, replicas))
        .await
        .map_err(|e| format!("directory bucket: {e}"))?;
    let kv = sh
        .js
        .get_key_value(core::BUCKET)
        .await
        .map_err(|e| format!("directory bucket: {e}"))?;
    Ok((kv, consumer))
}

/// Messages this node's consumer has delivered and not yet seen acknowledged.
const CONSUMER_IN_FLIGHT: i64 = 4096;
/// Deliveries of one message by JetStream after which it is dead-lettered (told to its
/// sender's node) instead of put back once more: a message that cannot be handed over must
/// not hold one of the consumer's slots for ever.
const MAX_DELIVERIES: i64 = 50;
/// Messages a stand-in publishes before the first of them has its PubAck.
const PUBLISH_WINDOW: usize = 256;
/// Released messages the receiving side remembers (older ones are asked of the store).
const REORDER_MEMORY: usize = 65_536;
/// How long a message waits for its predecessor before it goes anyway (logged): longer
/// than the consumer's ack wait, after which a lost delivery comes again.
const REORDER_MAX_WAIT: Duration = Duration::from_secs(30);

/// A message from another node, with its JetStream handle (acknowledged once stored here).
struct Inbound {
    wire: Wire,
    msg: Handle,
}

/// The JetStream message a relay message came in, shared by every message of its batch: told
/// to JetStream once each of them has ended here. Put back (`nak`) if any of them is (the
/// others then come again and are duplicates here); ended for good (`Term`) if every one of
/// them was; else acknowledged.
#[derive(Clone)]
struct Handle(Arc<HandleInner>);

struct HandleInner {
    msg: jetstream::Message,
    left: std::sync::atomic::AtomicUsize,
    put_back: std::sync::atomic::AtomicBool,
    acked: std::sync::atomic::AtomicBool,
}

/// How one message of a JetStream message ended here.
#[derive(Clone, Copy, PartialEq, Eq)]
enum End {
    /// Stored here (or a duplicate, or refused and told): acknowledged.
    Ack,
    /// Never to be handed over: not given again.
    Term,
    /// Not handed over now: given again later.
    Nak,
}

impl Handle {
    fn new(msg: jetstream::Message, parts: usize) -> Self {
        Self(Arc::new(HandleInner {
            msg,
            left: std::sync::atomic::AtomicUsize::new(parts.max(1)),
            put_back: Default::default(),
            acked: Default::default(),
        }))
    }

    /// How many times JetStream has given this message.
    fn delivered(&self) -> Option<i64> {
        self.0.msg.info().ok().map(|i| i.delivered)
    }

    /// One of its messages ended; the last one tells JetStream.
    async fn end(&self, how: End, why: &str) {
        let h = &self.0;
        match how {
            End::Ack => h.acked.store(true, Ordering::Relaxed),
            End::Nak => h.put_back.store(true, Ordering::Relaxed),
            End::Term => {}
        }
        if h.left.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        if h.put_back.load(Ordering::Relaxed) {
            nak(&h.msg, why).await;
        } else if h.acked.load(Ordering::Relaxed) {
            if let Err(e) = h.msg.double_ack().await {
                tracing::debug!(error = %e, "federation: ack to JetStream lost; the redelivery will be a duplicate here");
            }
        } else if let Err(e) = h.msg.ack_with(AckKind::Term).await {
            tracing::warn!(error = %e, "federation: cannot end a message in JetStream (it comes again, and is refused again)");
        }
    }
}

/// What comes off this node's subject.
enum Arrival {
    /// A message to SEND here.
    Message(Inbound),
    /// A message sent from here failed on another node; its JetStream handle is acknowledged
    /// once the failure is stored here.
    Failure(core::Failure, Box<jetstream::Message>),
}

/// What a stand-in is handed.
enum ToStandin {
    /// A message its agent sent on its node: SEND it here.
    Send(Inbound),
    /// A message sent here to its agent failed on the agent's node: report the delivery to
    /// the stand-in failed, so it is a dead letter here and its sender is told.
    Fail(core::Failure, Box<jetstream::Message>),
}

/// Takes this node's messages off the stream, in order, and hands each to the manager.
async fn consume(sh: Arc<Shared>, consumer: PullConsumer, tx: mpsc::Sender<Arrival>) {
    loop {
        let mut messages = match consumer
            .stream()
            .max_messages_per_batch(512)
            .heartbeat(Duration::from_secs(15))
            .messages()
            .await
        {
            Ok(m) => m,
            Err(e) => {
                tracing::debug!(error = %e, "federation: cannot pull; retrying");
                tokio::time::sleep(Duration::from_millis(250)).await;
                continue;
            }
        };
        while let Some(next) = messages.next().await {
            let msg = match next {
                Ok(m) => m,
                Err(e) => {
                    // Heartbeats missed while the server is away: the pull is renewed.
                    tracing::debug!(error = %e, "federation: pull interrupted");
                    break;
                }
            };
            let records = match core::parse_records(&msg.payload) {
                Ok(mut r) if r.len() == 1 => match r.pop() {
                    Some(core::Record::Failure { failure }) => {
                        vec![Arrival::Failure(failure, Box::new(msg))]
                    }
                    Some(core::Record::Message(wire)) => vec![Arrival::Message(Inbound {
                        wire,
                        msg: Handle::new(msg, 1),
                    })],
                    None => continue,
                },
                Ok(r) => {
                    // A batch (only messages): one handle for all of them.
                    let handle = Handle::new(msg, r.len());
                    r.into_iter()
                        .filter_map(|rec| match rec {
                            core::Record::Message(wire) => Some(Arrival::Message(Inbound {
                                wire,
                                msg: handle.clone(),
                            })),
                            core::Record::Failure { .. } => None,
                        })
                        .collect()
                }
                Err(e) => {
                    // Nothing can ever make this message readable: it is terminated, and said.
                    tracing::error!(error = %e, "federation: unreadable message from NATS; dropped (term)");
                    if let Err(e) = msg.ack_with(AckKind::Term).await {
                        tracing::warn!(error = %e, "federation: cannot terminate it");
                    }
                    continue;
                }
            };
            for arrival in records {
                if tx.send(arrival).await.is_err() {
                    return;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        if sh.client.connection_state() != async_nats::connection::State::Connected {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// A running stand-in: its inbound queue and what it was started with. Dropped, it stops.
struct Standin {
    tx: mpsc::Sender<ToStandin>,
    node: String,
    topics: Vec<String>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Standin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The directory loop: claims local names, keeps one stand-in per remote agent, routes
/// inbound messages to their sender's stand-in in each sender's order, and refreshes the
/// status.
async fn manage(
    sh: Arc<Shared>,
    opts: Options,
    kv: kv::Store,
    tool: Arc<Client>,
    mut inbound: mpsc::Receiver<Arrival>,
) {
    let standins: Arc<tokio::sync::Mutex<HashMap<String, Standin>>> = Arc::default();
    // Client connections for tools of other nodes (never recipients, never holding a name).
    let mut tools: HashMap<String, Standin> = HashMap::new();
    // The directory pass (KV reads, a query of the local relay) runs on its own task: inbound
    // messages never wait for it. Both tasks end with this one (the set aborts them when
    // dropped).
    let mut tasks = tokio::task::JoinSet::new();
    {
        let (sh, opts, standins, tool) = (sh.clone(), opts.clone(), standins.clone(), tool.clone());
        // The watch is the one writer of the directory's copy; `sync` reads it.
        let (watched, watched_rx) = tokio::sync::watch::channel(Watched::default());
        tasks.spawn(watch_directory(kv.clone(), watched));
        tasks.spawn(async move {
            let mut directory: BTreeMap<String, Entry> = BTreeMap::new();
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                sync(
                    &sh,
                    &opts,
                    &kv,
                    &tool,
                    &watched_rx,
                    &mut directory,
                    &standins,
                )
                .await;
            }
        });
    }
    let mut reorder: core::Reorder<Inbound> = core::Reorder::new(REORDER_MEMORY);
    let mut overdue = tokio::time::interval(Duration::from_secs(1));
    overdue.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let mut ready = Vec::new();
        tokio::select! {
            m = inbound.recv() => {
                let m = match m {
                    None => return,
                    Some(Arrival::Message(m)) => m,
                    Some(Arrival::Failure(f, msg)) => {
                        // Not a message: no order to keep. To the stand-in of its recipient.
                        route_failure(&sh, &opts, &standins, f, msg).await;
                        continue;
                    }
                };
                let sender = sender_key(&m.wire);
                let check = reorder.check(&sender, &m.wire.id, m.wire.prev.as_deref());
                match (check, m.wire.prev.clone()) {
                    (core::Check::Ready, _) | (_, None) => ready.push(m),
                    (core::Check::Ask, Some(prev)) => {
                        if stored_here(&tool, &m.wire.from, &prev).await {
                            // Went to the relay before this run (a restart since).
                            ready.extend(reorder.released(&sender, &prev).into_iter().map(|(_, t)| t));
                            ready.push(m);
                        } else {
                            tracing::debug!(from = %m.wire.from, id = %m.wire.id, %prev,
                                "federation: a message came before the one sent ahead of it; held until that one comes");
                            let id = m.wire.id.clone();
                            reorder.hold(&sender, &id, &prev, m, relay_protocol::now_ms());
                        }
                    }
                }
            }
            _ = overdue.tick() => {
                for (_, id, m) in reorder.overdue(relay_protocol::now_ms(), REORDER_MAX_WAIT.as_millis() as u64) {
                    tracing::warn!(from = %m.wire.from, %id, prev = ?m.wire.prev,
                        "federation: the message sent before this one never came (expired on its node?); this one goes now, so that sender's order may differ here");
                    ready.push(m);
                }
            }
        }
        // Each release may free messages that waited for it: released in turn, in order.
        let mut queue = std::collections::VecDeque::from(ready);
        while let Some(m) = queue.pop_front() {
            let sender = sender_key(&m.wire);
            let id = m.wire.id.clone();
            route(&sh, &opts, &tool, &standins, &mut tools, m).await;
            queue.extend(reorder.released(&sender, &id).into_iter().map(|(_, t)| t));
        }
    }
}

/// The key of a sender across the federation: a tool's name is only unique on its node.
fn sender_key(w: &Wire) -> String {
    format!("{}/{}", w.origin, w.from)
}

/// Whether the local store holds `(from, id)` (it went to the relay before this run).
async fn stored_here(tool: &Client, from: &str, id: &str) -> bool {
    match tool
        .query(QueryRequest::Read {
            id: id.to_owned(),
            from: None,
        })
        .await
    {
        Ok(QueryResult::Read { message }) => message.from == from && message.id == id,
        Ok(_) => false,
        Err(e) => {
            tracing::debug!(error = %e, "federation: cannot ask the store; the message waits for its predecessor");
            false
        }
    }
}

/// Hands an inbound message to the stand-in of its sender (started if needed); SENDs go out
/// on that connection in the order they are handed over.
async fn route(
    sh: &Arc<Shared>,
    opts: &Options,
    tool: &Client,
    standins: &tokio::sync::Mutex<HashMap<String, Standin>>,
    tools: &mut HashMap<String, Standin>,
    m: Inbound,
) {
    let from = m.wire.from.clone();
    let node = m.wire.origin.clone();
    // Only this node's own agents and people speak as their names here: a message from
    // another node under one of them can never be handed over (its stand-in cannot take the
    // name), so it ends now, told to its sender's node, instead of coming back forever.
    if let Some((code, why)) = held_here(sh, opts, &m.wire) {
        dead_letter_inbound(sh, m, code, &why).await;
        return;
    }
    // A message JetStream gave this link many times without it being handed over ends too
    // (whatever the cause), said, instead of taking a slot of the consumer for good.
    if m.msg.delivered().is_some_and(|n| n > MAX_DELIVERIES) {
        // A message of a batch comes as often as its batch does: one already stored here
        // (a sibling was the one put back) is done, not a failure to tell its sender.
        if stored_here(tool, &m.wire.from, &m.wire.id).await {
            m.msg.end(End::Ack, "stored here before").await;
            return;
        }
        let why = format!(
            "node {} could not hand it to its relay in {MAX_DELIVERIES} tries (see that relay's log)",
            sh.me
        );
        dead_letter_inbound(sh, m, "failed", &why).await;
        return;
    }
    let tx = if m.wire.tool {
        if tools.get(&from).is_none_or(|s| s.task.is_finished()) {
            tools.insert(
                from.clone(),
                spawn_standin(sh, opts, &from, &node, Vec::new(), true),
            );
        }
        tools.get(&from).map(|s| s.tx.clone())
    } else {
        let mut map = standins.lock().await;
        // A sender the directory has not shown here yet: its stand-in starts now (the
        // directory pass gives it its topics later).
        if map.get(&from).is_none_or(|s| s.task.is_finished()) {
            map.insert(
                from.clone(),
                spawn_standin(sh, opts, &from, &node, Vec::new(), false),
            );
        }
        map.get(&from).map(|s| s.tx.clone())
    };
    if let Some(tx) = tx
        && let Err(mpsc::error::SendError(ToStandin::Send(m))) = tx.send(ToStandin::Send(m)).await
    {
        // The stand-in ended (its name is taken here): JetStream gives the message
        // again later.
        m.msg
            .end(End::Nak, "its sender's stand-in is not running")
            .await;
    }
}

/// Hands a failure on another node to the stand-in of its recipient (started if needed: its
/// node is the failure's).
async fn route_failure(
    sh: &Arc<Shared>,
    opts: &Options,
    standins: &tokio::sync::Mutex<HashMap<String, Standin>>,
    f: core::Failure,
    msg: Box<jetstream::Message>,
) {
    let tx = {
        let mut map = standins.lock().await;
        if map.get(&f.recipient).is_none_or(|s| s.task.is_finished()) {
            map.insert(
                f.recipient.clone(),
                spawn_standin(sh, opts, &f.recipient, &f.node, Vec::new(), false),
            );
        }
        map.get(&f.recipient).map(|s| s.tx.clone())
    };
    if let Some(tx) = tx
        && let Err(mpsc::error::SendError(ToStandin::Fail(_, msg))) =
            tx.send(ToStandin::Fail(f, msg)).await
    {
        nak(&msg, "its recipient's stand-in is not running").await;
    }
}

/// Why a message from another node cannot be handed over here whoever sent it: its sender's
/// name is one of this node's people (any message), or one of this node's agents (an agent's
/// message; a tool's goes through a client connection, refused at its SEND when an agent has
/// the name). `None`: it may go.
fn held_here(sh: &Shared, opts: &Options, w: &Wire) -> Option<(&'static str, String)> {
    if w.from.eq_ignore_ascii_case("relay") {
        return Some((
            "forbidden",
            format!(
                "node {} takes no message under the name \"relay\" (its relay's own notices) from another node",
                sh.me
            ),
        ));
    }
    // A node speaks for itself only: no message says it comes from this node, and an agent's
    // message says the node the directory gives its name (the link of that node publishes
    // for it; another node cannot speak as it).
    if w.origin == sh.me {
        return Some((
            "forbidden",
            format!(
                "node {} takes no message from another node that says it comes from node {}",
                sh.me, w.origin
            ),
        ));
    }
    if !w.tool
        && let Some(owner) = sh.node_of(&w.from)
        && owner != w.origin
    {
        return Some((
            "forbidden",
            core::other_nodes_agent_reason(&w.from, &w.origin, &sh.me, &owner),
        ));
    }
    if let Some(person) = opts.people.iter().find(|p| p.eq_ignore_ascii_case(&w.from)) {
        return Some((
            "forbidden",
            core::person_here_reason(&w.from, &w.origin, &sh.me, person),
        ));
    }
    (!w.tool && sh.is_local_agent(&w.from)).then(|| {
        (
            "name_in_use",
            core::held_here_reason(&w.from, &w.origin, &sh.me),
        )
    })
}

/// Ends a message from another node that will never be handed over here: its sender's node is
/// told (a failure record, for a message to one agent: its copy there becomes a dead letter
/// with `why`), then JetStream is told never to give it again. Logged here in any case (a
/// broadcast's or topic message's refusal, as locally, is not sent back).
async fn dead_letter_inbound(sh: &Arc<Shared>, m: Inbound, code: &str, why: &str) {
    tracing::warn!(from = %m.wire.from, origin = %m.wire.origin, id = %m.wire.id, code, reason = %why,
        "federation: a message from another node cannot be delivered here; dead-lettered on its sender's node");
    if let Some(to) = m
        .wire
        .to
        .as_deref()
        .filter(|t| *t != "*" && m.wire.topic.is_none())
    {
        let f = core::Failure {
            node: sh.me.clone(),
            from: m.wire.from.clone(),
            id: m.wire.id.clone(),
            recipient: to.to_owned(),
            code: code.to_owned(),
            reason: why.to_owned(),
        };
        publish_failure(sh, &m.wire.origin, f).await;
    }
    m.msg.end(End::Term, why).await;
}

async fn nak(msg: &jetstream::Message, why: &str) {
    tracing::debug!(why, "federation: message put back for later");
    if let Err(e) = msg
        .ack_with(AckKind::Nak(Some(Duration::from_millis(500))))
        .await
    {
        tracing::debug!(error = %e, "federation: cannot put a message back (it comes again after the ack wait)");
    }
}

/// One pass of the directory: local agents claimed, the directory read, stand-ins started
/// and stopped, the status refreshed.
async fn sync(
    sh: &Arc<Shared>,
    opts: &Options,
    kv: &kv::Store,
    tool: &Client,
    watched: &tokio::sync::watch::Receiver<Watched>,
    directory: &mut BTreeMap<String, Entry>,
    standins: &tokio::sync::Mutex<HashMap<String, Standin>>,
) {
    let agents = match tool.query(QueryRequest::Agents).await {
        Ok(QueryResult::Agents { agents }) => agents,
        Ok(_) => Vec::new(),
        Err(e) => {
            tracing::debug!(error = %e, "federation: cannot list local agents");
            return;
        }
    };
    sh.forget_tools_now_agents(&agents);
    let mut backlog = 0u64;
    let mut locals = Vec::new();
    for a in &agents {
        if core::standin_node(a.cli.as_deref()).is_some() {
            backlog += a.pending;
        } else {
            locals.push(Local {
                name: a.name.clone(),
                online: a.online,
                topics: a.topics.clone(),
            });
        }
    }
    let link_up = sh.client.connection_state() == async_nats::connection::State::Connected;
    // The watch's copy, as it stands (the last known one while NATS is gone).
    let error = {
        let w = watched.borrow();
        directory.clone_from(&w.entries);
        w.error.clone()
    };
    let mut conflicts = Vec::new();
    let mut conflict_names = HashMap::new();
    for l in &locals {
        match core::claim(&sh.me, l, directory.get(&l.name)) {
            Claim::Keep => {}
            Claim::Create(e) if link_up => {
                let Some(value) = entry_bytes(&l.name, &e) else {
                    continue;
                };
                match kv.create(&l.name, value.into()).await {
                    Ok(_) => {
                        directory.insert(l.name.clone(), e);
                    }
                    // Another node claimed it first: seen as a conflict on the next pass.
                    Err(err) => {
                        tracing::debug!(name = %l.name, error = %err, "federation: claim not made")
                    }
                }
            }
            Claim::Update(e) if link_up => {
                let Some(value) = entry_bytes(&l.name, &e) else {
                    continue;
                };
                match kv.put(&l.name, value.into()).await {
                    Ok(_) => {
                        directory.insert(l.name.clone(), e);
                    }
                    Err(err) => {
                        tracing::debug!(name = %l.name, error = %err, "federation: directory not updated")
                    }
                }
            }
            Claim::Create(_) | Claim::Update(_) => {}
            Claim::Conflict { owner } => {
                if !sh.is_conflict(&l.name) {
                    tracing::warn!(name = %l.name, owner = %owner,
                        "federation: this name belongs to another node; the agent here is refused in the federation (its messages to other nodes fail, no other node reaches it): reconnect it under another name");
                }
                conflict_names.insert(l.name.clone(), owner.clone());
                conflicts.push(RemoteAgent {
                    name: l.name.clone(),
                    node: owner,
                    online: l.online,
                });
            }
        }
    }
    let local_names: BTreeSet<String> = locals.iter().map(|l| l.name.clone()).collect();
    let wanted = core::standins(&sh.me, directory, &local_names);
    // Stand-ins whose agent moved or changed topics are restarted; those no longer wanted
    // (the name became local here) are stopped (decided in `core::plan_standins`).
    let mut standins = standins.lock().await;
    let running = standins
        .iter()
        .map(|(name, s)| {
            let r = core::Running {
                node: s.node.clone(),
                topics: s.topics.clone(),
                finished: s.task.is_finished(),
            };
            (name.clone(), r)
        })
        .collect();
    let plan = core::plan_standins(&wanted, &running, directory, &local_names);
    for name in &plan.stop {
        // Dropped, a stand-in's task is aborted; its name is given up on its node's link.
        if let Some(old) = standins.remove(name) {
            sh.detach(&old.node, name).await;
        }
    }
    for name in &plan.start {
        if let Some(e) = wanted.get(name.as_str()) {
            standins.insert(
                name.clone(),
                spawn_standin(sh, opts, name, &e.node, e.topics.clone(), false),
            );
        }
    }
    // This pass's view, published whole: every other task reads it, none writes it.
    let mut remote: HashSet<String> = wanted.keys().map(|n| (*n).to_owned()).collect();
    remote.extend(standins.keys().cloned());
    sh.publish_view(View {
        remote,
        conflicts: conflict_names,
        agents: local_agents(&agents),
        nodes: wanted
            .iter()
            .map(|(name, e)| ((*name).to_owned(), e.node.clone()))
            .collect(),
    });
    let remote = wanted
        .iter()
        .map(|(name, e)| RemoteAgent {
            name: (*name).to_owned(),
            node: e.node.clone(),
            online: e.online,
        })
        .collect();
    set_cell(&sh.cell, |s| {
        s.node = sh.me.clone();
        s.cluster = sh.cluster.clone();
        s.backlog = backlog;
        s.published = sh.published.load(Ordering::Relaxed);
        s.received = sh.received.load(Ordering::Relaxed);
        s.remote = remote;
        s.conflicts = conflicts;
        s.error = if link_up {
            error
        } else {
            s.error.take().or(Some("NATS unreachable".into()))
        };
    });
}

/// The directory as the watch has seen it, and why the watch is not running, if it is not.
#[derive(Default)]
struct Watched {
    entries: BTreeMap<String, Entry>,
    error: Option<String>,
}

/// Keeps [`Watched`] current from one watch of the directory bucket: every key's last value
/// first, then each change as it is made. It replaced a read of every key on every pass, which
/// grew with the federation and, while NATS was gone, hung the pass (and the status with it).
/// A watch that fails or ends is made again; its replay brings the copy up to date (a deleted
/// key replays as its delete marker).
async fn watch_directory(kv: kv::Store, watched: tokio::sync::watch::Sender<Watched>) {
    loop {
        let why = match kv.watch_with_history(">").await {
            Ok(mut changes) => {
                set_watch_error(&watched, None);
                loop {
                    match changes.next().await {
                        Some(Ok(change)) => apply_change(&watched, change),
                        Some(Err(e)) => break format!("directory watch: {e}"),
                        None => break "directory watch: ended by the server".to_owned(),
                    }
                }
            }
            Err(e) => format!("directory watch: {e}"),
        };
        tracing::debug!(why = %why, "federation: directory watch made again");
        set_watch_error(&watched, Some(why));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn set_watch_error(watched: &tokio::sync::watch::Sender<Watched>, error: Option<String>) {
    watched.send_modify(|w| w.error = error);
}

fn apply_change(watched: &tokio::sync::watch::Sender<Watched>, change: kv::Entry) {
    watched.send_modify(|w| match change.operation {
        kv::Operation::Put => match serde_json::from_slice::<Entry>(&change.value) {
            Ok(e) => {
                w.entries.insert(change.key, e);
            }
            Err(e) => {
                tracing::warn!(name = %change.key, error = %e, "federation: unreadable directory entry")
            }
        },
        kv::Operation::Delete | kv::Operation::Purge => {
            w.entries.remove(&change.key);
        }
    });
}

/// What becomes of a delivery to a stand-in: acknowledged (with a state, if any), or reported
/// failed with the reason its sender is told.
enum Outcome {
    Done(Option<DeliveryState>),
    Failed(String),
    /// Not published (the link is stopping): left unacknowledged, so the relay delivers it
    /// again and it is published then.
    Again,
}

/// A delivery whose publish is written, waiting for its PubAck (or ready at once).
type Pending = futures_util::future::BoxFuture<'static, (Delivered, Outcome)>;
/// A delivery whose publish is not written yet: resolves to its [`Pending`] once written.
type Starting = futures_util::future::BoxFuture<'static, Pending>;

/// A delivery with nothing to write: its outcome is queued behind the writes before it, so
/// the DELIVERs are still acknowledged in their order.
fn ready_start(p: Pending) -> Starting {
    Box::pin(std::future::ready(p))
}

fn spawn_standin(
    sh: &Arc<Shared>,
    opts: &Options,
    name: &str,
    node: &str,
    topics: Vec<String>,
    tool: bool,
) -> Standin {
    let (tx, rx) = mpsc::channel(1024);
    let task = tokio::spawn(standin(
        sh.clone(),
        opts.socket.clone(),
        name.to_owned(),
        node.to_owned(),
        topics.clone(),
        tool,
        rx,
    ));
    Standin {
        tx,
        node: node.to_owned(),
        topics,
        task,
    }
}

/// A stand-in's connection to the local relay: one name on its node's link, or, for a tool of
/// another node, a client connection of its own (which never holds the name).
enum StandinConn {
    Name {
        link: Arc<link::LinkConn>,
        name: String,
        events: mpsc::Receiver<Delivered>,
    },
    Tool(Client),
}

impl StandinConn {
    /// The next delivery (`Some(None)`: something else happened); `None` once it ended.
    async fn next_delivery(&mut self) -> Option<Option<Delivered>> {
        match self {
            Self::Name { events, .. } => events.recv().await.map(Some),
            Self::Tool(c) => c.next_event().await.map(|ev| match ev {
                Event::Message(d) => Some(d),
                _ => None,
            }),
        }
    }

    async fn subscribe(&self, pattern: &str) -> Result<(), ClientError> {
        match self {
            Self::Name { link, name, .. } => link.subscribe(name, pattern).await,
            Self::Tool(c) => c.subscribe(pattern.to_owned()).await,
        }
    }

    async fn ack(&self, d: &Delivered, state: Option<DeliveryState>) -> Result<(), ClientError> {
        match self {
            Self::Name { link, name, .. } => link.ack(name, d, state).await,
            Self::Tool(c) => c.ack(d, state).await,
        }
    }

    async fn ack_failed(&self, d: &Delivered, reason: &str) -> Result<(), ClientError> {
        match self {
            Self::Name { link, name, .. } => link.ack_failed(name, d, reason).await,
            Self::Tool(c) => c.ack_failed(d, reason).await,
        }
    }

    async fn fail(&self, id: &str, reason: &str) -> Result<(), ClientError> {
        match self {
            Self::Name { link, name, .. } => link.fail(name, id, reason).await,
            Self::Tool(c) => c.fail(id, reason).await,
        }
    }

    /// A query, answered after what this connection sent before it.
    async fn query(&self, req: QueryRequest) -> Result<QueryResult, ClientError> {
        match self {
            Self::Name { link, .. } => link.query(req).await,
            Self::Tool(c) => c.query(req).await,
        }
    }

    /// SENDs a message from another node under its own id (pipelined); the future is its
    /// receipt. The id is an argument, not `out.id`, so that no path can send one without it:
    /// the far store's (from, id) dedupe is what keeps a redelivered message from being stored
    /// twice.
    async fn send(
        &self,
        id: String,
        mut out: Outgoing,
    ) -> Result<futures_util::future::BoxFuture<'static, Result<(), ClientError>>, ClientError>
    {
        match self {
            Self::Name { link, name, .. } => {
                link.send(name, id, out.to, out.topic, out.payload).await
            }
            Self::Tool(c) => {
                out.id = Some(id);
                let (_, receipt) = c.send_nowait(out).await?;
                Ok(Box::pin(async move { receipt.wait().await.map(|_| ()) }))
            }
        }
    }
}

/// A stand-in whose name the relay will not let anyone of another node speak as (an agent of
/// this node holds it, or it is reserved here): every message sent through it ends, told to
/// its sender's node, until it is stopped.
async fn refused(
    sh: &Arc<Shared>,
    name: &str,
    node: &str,
    code: &str,
    message: &str,
    mut inbound: mpsc::Receiver<ToStandin>,
) {
    tracing::warn!(%name, %node, code, %message, "federation: no stand-in can take this name here; its messages are dead-lettered");
    let why = format!(
        "node {} refuses the name {name} to other nodes: {message}",
        sh.me
    );
    while let Some(m) = inbound.recv().await {
        match m {
            ToStandin::Send(m) => dead_letter_inbound(sh, m, code, &why).await,
            ToStandin::Fail(f, msg) => {
                // A failure of a message sent from here to `name` of `node`: the name is local
                // here now, so no stand-in's delivery is left to fail.
                tracing::warn!(id = %f.id, reason = %f.reason, "federation: a failure on another node for a message whose stand-in cannot run here; acknowledged");
                if let Err(e) = msg.double_ack().await {
                    tracing::debug!(error = %e, "federation: ack to JetStream lost");
                }
            }
        }
    }
}

/// The stand-in of `name`, an agent of `node`: an agent connection to the local relay under
/// that name. Deliveries to it are published to `node`; messages `name` sent from `node` are
/// sent through it.
async fn standin(
    sh: Arc<Shared>,
    socket: PathBuf,
    name: String,
    node: String,
    topics: Vec<String>,
    tool: bool,
    mut inbound: mpsc::Receiver<ToStandin>,
) {
    let mut client = if tool {
        // A tool of another node: a client connection, which never holds the name.
        let mut cfg = ClientConfig::tool(&socket, &name);
        cfg.reconnect = true;
        cfg.cli = Some(core::standin_cli(&node));
        // Every re-delivery must reach the publisher: after a crash it is re-published (and
        // deduplicated by JetStream), never assumed done.
        cfg.dedupe = false;
        match Client::connect(cfg).await {
            Ok(c) => StandinConn::Tool(c),
            Err(ClientError::Refused { code, message }) => {
                let code = serde_json::to_value(code)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_else(|| "refused".into());
                refused(&sh, &name, &node, &code, &message, inbound).await;
                return;
            }
            Err(e) => {
                tracing::warn!(%name, %node, error = %e, "federation: stand-in cannot connect; retried");
                return;
            }
        }
    } else {
        // An agent of another node: one more name on that node's link (issue 28.8).
        let link = match sh.link(&node).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(%name, %node, error = %e, "federation: no link to the local relay; retried");
                return;
            }
        };
        // A session of this name the link still holds (its stand-in ended) is given up first.
        link.detach(&name).await;
        match link.attach(&name).await {
            Ok(events) => StandinConn::Name {
                link,
                name: name.clone(),
                events,
            },
            Err(link::AttachError::Refused(message)) => {
                refused(&sh, &name, &node, "forbidden", &message, inbound).await;
                return;
            }
            Err(link::AttachError::InUse(why)) => {
                // Its messages go back to JetStream (given again later); the next directory
                // pass starts the stand-in again, or not if the name is local now.
                tracing::debug!(%name, %node, %why, "federation: name in use here; the stand-in is started again later");
                return;
            }
            Err(link::AttachError::Closed) => {
                tracing::debug!(%name, %node, "federation: the link closed while taking a name; retried");
                return;
            }
        }
    };
    // Subscribed here (a tool's client keeps them for its reconnections): the daemon routes
    // a topic message to this node's stand-in as to the agent itself.
    for t in topics {
        if let Err(e) = client.subscribe(&t).await {
            tracing::warn!(%name, topic = %t, error = %e, "federation: stand-in cannot subscribe; restarted");
            return;
        }
    }
    tracing::debug!(%name, %node, "federation: stand-in connected");
    let ttl_ms = u64::try_from(sh.inbox_ttl.as_millis()).unwrap_or(u64::MAX);
    // Each delivery's outcome, in delivery order: a publish resolves once JetStream has the
    // message (or it is refused), and the DELIVERs are acknowledged in that order.
    //
    // A publish is two steps: writing it (which waits for one of the JetStream context's
    // in-flight slots, shared by every stand-in of this link) and waiting for its PubAck
    // (which frees the slot, but only once its future is polled). The writes go one at a
    // time in delivery order (`starting`), and the PubAck futures already written
    // (`inflight`) are polled in the same select, never held while a write waits: a write
    // waiting for a slot held by this stand-in's own unpolled PubAcks, across every stand-in
    // at once, was the link's deadlock after an outage (issue 28.1).
    let mut inflight: FuturesOrdered<Pending> = FuturesOrdered::new();
    let mut starting: std::collections::VecDeque<Starting> = std::collections::VecDeque::new();
    // The last message each sender sent this agent that went out from this session: the next
    // one names it (`Wire::prev`), so the far node keeps their order.
    let mut last: HashMap<String, String> = HashMap::new();
    loop {
        tokio::select! {
            Some((d, outcome)) = inflight.next(), if !inflight.is_empty() => {
                let acked = match &outcome {
                    Outcome::Done(state) => client.ack(&d, *state).await,
                    Outcome::Failed(reason) => client.ack_failed(&d, reason).await,
                    Outcome::Again => {
                        tracing::debug!("federation: stand-in stops: its node's publisher is gone");
                        return;
                    }
                };
                if let Err(e) = acked {
                    // Unacknowledged, it is delivered again on the next connection and
                    // re-published under the same Nats-Msg-Id.
                    tracing::debug!(error = %e, "federation: stand-in closed before its ack");
                    return;
                }
            }
            written = futures_util::future::poll_fn(|cx| match starting.front_mut() {
                Some(f) => f.as_mut().poll(cx),
                None => std::task::Poll::Pending,
            }), if !starting.is_empty() => {
                starting.pop_front();
                inflight.push_back(written);
            }
            ev = client.next_delivery(), if inflight.len() + starting.len() < PUBLISH_WINDOW => {
                let Some(ev) = ev else { return };
                if let Some(d) = ev {
                    // A dead letter here of a message this stand-in's agent sent from its
                    // node: the relay's notice goes back to that node as a failure.
                    let notice = core::Delivered {
                        from: &d.from,
                        id: &d.id,
                        to: &d.to,
                        topic: d.topic.as_deref(),
                        payload: &d.payload,
                        expires_at: None,
                    };
                    if !tool && let Some(f) = core::failure_of_notice(&sh.me, &name, notice) {
                        let done = publish_failure(&sh, &node, f);
                        starting.push_back(ready_start(Box::pin(async move {
                            done.await;
                            (d, Outcome::Done(None))
                        })));
                        continue;
                    }
                    let remote = sh.is_remote(&d.from);
                    // A sender that is neither remote nor a known agent here: asked again
                    // (an agent's HELLO comes before its SENDs, so a fresh list has it).
                    let mut is_tool = !remote && !sh.is_local_agent(&d.from);
                    if is_tool && !sh.is_known_tool(&d.from) {
                        match client.query(QueryRequest::Agents).await {
                            Ok(QueryResult::Agents { agents }) => {
                                // Its own answer decides; the next directory pass publishes
                                // the list for every task.
                                is_tool = !local_agents(&agents).contains(&d.from);
                                if is_tool {
                                    sh.tools_cache().insert(d.from.clone());
                                }
                            }
                            Ok(_) => {}
                            Err(e) => {
                                tracing::debug!(error = %e, "federation: stand-in cannot list agents; its delivery comes again");
                                return;
                            }
                        }
                    }
                    let conflict = sh.conflict_owner(&d.from);
                    let decision = core::forward(
                        &sh.me,
                        &node,
                        core::Delivered {
                            from: &d.from,
                            id: &d.id,
                            to: &d.to,
                            topic: d.topic.as_deref(),
                            payload: &d.payload,
                            expires_at: Some(d.ts.saturating_add(ttl_ms)),
                        },
                        remote,
                        conflict.is_some(),
                        is_tool,
                    );
                    match decision {
                        Forward::Skip => starting.push_back(ready_start(Box::pin(std::future::ready((d, Outcome::Done(None)))))),
                        Forward::Refuse => {
                            let why = core::conflict_reason(&d.from, &sh.me, conflict.as_deref().unwrap_or("another node"));
                            starting.push_back(ready_start(Box::pin(std::future::ready((d, Outcome::Failed(why))))));
                        }
                        Forward::Publish { msg_id, mut wire, .. } => {
                            // Only a message to this agent alone is chained: a broadcast's or a
                            // topic message's one copy per node may be the one another
                            // stand-in published.
                            if d.to == name && d.topic.is_none() {
                                wire.prev = last.insert(d.from.clone(), d.id.clone()).filter(|p| *p != d.id);
                            }
                            match serde_json::to_vec(&*wire) {
                                Ok(body) => {
                                    let out = sh.batcher(&node);
                                    let body = bytes::Bytes::from(body);
                                    // Handed to the node's batcher in delivery order; yields
                                    // the wait for its PubAck: awaited in `inflight`.
                                    #[allow(clippy::async_yields_async)]
                                    starting.push_back(Box::pin(async move {
                                        let (done, stored) = tokio::sync::oneshot::channel();
                                        let handed = out.send(Out { msg_id, body, done }).await.is_ok();
                                        let acked: Pending = Box::pin(async move {
                                            if handed && stored.await.is_ok() {
                                                (d, Outcome::Done(None))
                                            } else {
                                                (d, Outcome::Again)
                                            }
                                        });
                                        acked
                                    }));
                                }
                                Err(e) => {
                                    // Reported failed: a dead letter, never a silent drop.
                                    tracing::error!(error = %e, "federation: cannot encode a message");
                                    let why = format!("the federation link cannot encode it: {e}");
                                    starting.push_back(ready_start(Box::pin(std::future::ready((d, Outcome::Failed(why))))));
                                }
                            }
                        }
                    }
                }
            }
            m = inbound.recv() => {
                let m = match m {
                    None => return,
                    Some(ToStandin::Send(m)) => m,
                    Some(ToStandin::Fail(f, msg)) => {
                        if !fail_here(&client, &name, &f).await {
                            nak(&msg, "the failure is not stored here yet").await;
                            return;
                        }
                        if let Err(e) = msg.double_ack().await {
                            tracing::debug!(error = %e, "federation: ack to JetStream lost; the failure comes again and is stored once");
                        }
                        continue;
                    }
                };
                let out = Outgoing {
                    id: None,
                    to: m.wire.to.clone(),
                    topic: m.wire.topic.clone(),
                    payload: m.wire.send_payload(),
                };
                match client.send(m.wire.id.clone(), out).await {
                    Ok(receipt) => {
                        let sh = sh.clone();
                        // In order on the socket; the receipts are awaited apart, so the
                        // next SEND does not wait for this one's commit.
                        tokio::spawn(async move {
                            match receipt.await {
                                Ok(_) => {
                                    sh.received.fetch_add(1, Ordering::Relaxed);
                                    m.msg.end(End::Ack, "stored").await;
                                }
                                Err(ClientError::Rejected { code, reason }) => {
                                    if tool && code == relay_protocol::NackCode::Forbidden {
                                        // A tool's name held by an agent here: only that agent
                                        // speaks as it. Not stored, and said.
                                        tracing::warn!(%reason, "federation: a tool's message from another node refused here: an agent of this node has its name");
                                    } else {
                                        // Refused here by rules, budget or rate: a dead letter
                                        // on this node with its reason, like a local SEND
                                        // refused.
                                        tracing::info!(?code, %reason, "federation: message from another node refused here (dead-lettered)");
                                    }
                                    // Its sender's node accepted it: it is told, and its copy
                                    // there becomes a dead letter too. Acknowledged to
                                    // JetStream only once that node has the failure; a crash
                                    // before brings the message again, refused again, and the
                                    // failure published again under the same id.
                                    if let Some(f) = refused_failure(&sh.me, &m.wire, code, &reason) {
                                        publish_failure(&sh, &m.wire.origin, f).await;
                                    }
                                    m.msg.end(End::Ack, "refused here, told").await;
                                }
                                Err(e) => m.msg.end(End::Nak, &e.to_string()).await,
                            }
                        });
                    }
                    Err(e) => {
                        m.msg.end(End::Nak, &e.to_string()).await;
                        return;
                    }
                }
            }
        }
    }
}

/// The failure to send back for a message this node refused at its SEND: only for a message
/// to one agent (a broadcast's or topic message's copies are refused one by one, as locally,
/// and their dead letters stay here).
fn refused_failure(
    me: &str,
    w: &Wire,
    code: relay_protocol::NackCode,
    reason: &str,
) -> Option<core::Failure> {
    let to = w.to.as_deref().filter(|t| *t != "*" && w.topic.is_none())?;
    let code = serde_json::to_value(code)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| "refused".into());
    Some(core::Failure {
        node: me.to_owned(),
        from: w.from.clone(),
        id: w.id.clone(),
        recipient: to.to_owned(),
        code,
        reason: reason.to_owned(),
    })
}

/// Publishes a failure to `node` (the sender's) until JetStream has it.
fn publish_failure(
    sh: &Arc<Shared>,
    node: &str,
    f: core::Failure,
) -> futures_util::future::BoxFuture<'static, ()> {
    let sh = sh.clone();
    let subject = core::subject(node);
    let msg_id = core::failure_msg_id(&f, node);
    Box::pin(async move {
        let body = match serde_json::to_vec(&core::Record::Failure { failure: f }) {
            Ok(b) => bytes::Bytes::from(b),
            Err(e) => {
                tracing::error!(error = %e, "federation: cannot encode a failure; its sender's node is not told");
                return;
            }
        };
        let first = start_publish(&sh, &subject, &msg_id, body.clone()).await;
        let seq = publish(&sh, &subject, &msg_id, body, first).await;
        sh.stored_by_jetstream([msg_id.as_str()], seq);
    })
}

/// Stores here a failure on another node: the stand-in `name` (its recipient) reports the
/// delivery failed, with the far node's reason; true once the local store has it (the trace
/// asked after the report is answered after it is committed, and shows it).
async fn fail_here(client: &StandinConn, name: &str, f: &core::Failure) -> bool {
    if let Err(e) = client.fail(&f.id, &f.reason_here()).await {
        tracing::debug!(error = %e, "federation: cannot report a failure");
        return false;
    }
    match client
        .query(QueryRequest::Trace {
            id: f.id.clone(),
            from: None,
        })
        .await
    {
        Ok(QueryResult::Trace { trace }) => {
            trace.events.iter().any(|e| {
                e.recipient.as_deref() == Some(name)
                    && e.state == relay_protocol::query::TraceState::Failed
            }) || {
                // No delivery of it to this agent here (forgotten, or never sent from here):
                // nothing to fail, and nothing to wait for.
                !trace
                    .events
                    .iter()
                    .any(|e| e.recipient.as_deref() == Some(name))
            }
        }
        Ok(QueryResult::Error { code, message }) if code == "not_found" => {
            tracing::warn!(id = %f.id, %message, "federation: a failure on another node for a message not stored here");
            true
        }
        Ok(other) => {
            tracing::debug!(
                ?other,
                "federation: unexpected answer while storing a failure"
            );
            false
        }
        Err(e) => {
            tracing::debug!(error = %e, "federation: cannot check a failure was stored");
            false
        }
    }
}

/// How long a trace waits for another node's link.
const FAR_TRACE_WAIT: Duration = Duration::from_secs(2);

/// Completes the daemon's traces with the legs on other nodes: each node a recipient is on is
/// asked over NATS (request/reply, all at once); what does not answer in time is said.
async fn answer_traces(sh: Arc<Shared>, mut traces: TraceRequests) {
    while let Some((trace, reply)) = traces.recv().await {
        let sh = sh.clone();
        tokio::spawn(async move {
            let nodes = sh.view().nodes.clone();
            let far = core::far_nodes(&trace, &nodes);
            let ask = core::TraceAsk {
                from: trace.from.clone(),
                id: trace.id.clone(),
            };
            let asks = far.iter().map(|node| {
                let (sh, ask, node) = (sh.clone(), ask.clone(), node.clone());
                async move {
                    let answer = ask_trace(&sh, &node, &ask).await;
                    (node, answer)
                }
            });
            let answers = futures_util::future::join_all(asks).await;
            let seqs = match sh.pubacks.lock() {
                Ok(p) => far
                    .iter()
                    .filter_map(|node| {
                        let id = core::msg_id(&trace.from, &trace.id, node);
                        p.seqs.get(&id).map(|s| (node.clone(), *s))
                    })
                    .collect(),
                Err(_) => BTreeMap::new(),
            };
            let merged = core::merge_trace(trace, &nodes, &seqs, answers);
            if reply.send(merged).is_err() {
                tracing::debug!("federation: the trace's asker is gone");
            }
        });
    }
}

/// Asks `node`'s link for its story of a message.
async fn ask_trace(sh: &Shared, node: &str, ask: &core::TraceAsk) -> Result<TraceRecord, String> {
    let body = serde_json::to_vec(ask).map_err(|e| e.to_string())?;
    let answer = tokio::time::timeout(
        FAR_TRACE_WAIT,
        sh.client.request(core::trace_subject(node), body.into()),
    )
    .await
    .map_err(|_| format!("no answer within {} s", FAR_TRACE_WAIT.as_secs()))?
    .map_err(|e| e.to_string())?;
    let answer: core::TraceAnswer =
        serde_json::from_slice(&answer.payload).map_err(|e| format!("unreadable answer: {e}"))?;
    match (answer.trace, answer.error) {
        (Some(t), _) => Ok(t),
        (None, e) => Err(e.unwrap_or_else(|| "no trace".into())),
    }
}

/// Answers other links' trace questions about messages from their agents: this relay's trace
/// of the message, if it is the one that sender sent.
async fn serve_traces(sh: Arc<Shared>, tool: Arc<Client>) {
    loop {
        let mut questions = match sh.client.subscribe(core::trace_subject(&sh.me)).await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %e, "federation: cannot take trace questions yet; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        while let Some(q) = questions.next().await {
            let Some(to) = q.reply.clone() else { continue };
            let (sh, tool) = (sh.clone(), tool.clone());
            tokio::spawn(async move {
                let answer = match serde_json::from_slice::<core::TraceAsk>(&q.payload) {
                    Ok(ask) => match tool
                        .query(QueryRequest::Trace {
                            id: ask.id.clone(),
                            from: None,
                        })
                        .await
                    {
                        Ok(QueryResult::Trace { trace }) if trace.from == ask.from => {
                            core::TraceAnswer {
                                trace: Some(trace),
                                error: None,
                            }
                        }
                        Ok(QueryResult::Trace { trace }) => core::TraceAnswer {
                            trace: None,
                            error: Some(format!(
                                "its id is another sender's here ({})",
                                trace.from
                            )),
                        },
                        Ok(QueryResult::Error { message, .. }) => core::TraceAnswer {
                            trace: None,
                            error: Some(message),
                        },
                        Ok(_) => core::TraceAnswer::default(),
                        Err(e) => core::TraceAnswer {
                            trace: None,
                            error: Some(format!("its relay did not answer: {e}")),
                        },
                    },
                    Err(e) => core::TraceAnswer {
                        trace: None,
                        error: Some(format!("unreadable question: {e}")),
                    },
                };
                match serde_json::to_vec(&answer) {
                    Ok(body) => {
                        if let Err(e) = sh.client.publish(to, body.into()).await {
                            tracing::debug!(error = %e, "federation: trace answer not sent");
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "federation: cannot encode a trace answer")
                    }
                }
            });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A message a stand-in hands to its node's batcher ([`batcher`]): told once JetStream has it.
struct Out {
    msg_id: String,
    body: bytes::Bytes,
    done: tokio::sync::oneshot::Sender<()>,
}

/// Batches of one node on their way to JetStream at once.
const BATCHES_IN_FLIGHT: usize = 32;

/// Publishes what the stand-ins of agents of `node` hand it, gathered (issue 28.7): whatever
/// waits when a publish can start goes in one JetStream message (up to [`core::BATCH_MAX`]); one
/// waiting alone goes as itself, under its own `Nats-Msg-Id`, as before batches. Each stand-in
/// is told when JetStream has its message, and only then acknowledges its DELIVER: a crash
/// before replays it, published again (maybe in another batch: the far store's (from, id)
/// dedupe keeps one). The batches keep the order they were handed in; one published again
/// after a failure may land after later ones, and the far node restores each sender's order
/// (`Wire::prev`).
async fn batcher(sh: Arc<Shared>, node: String, mut rx: mpsc::Receiver<Out>) {
    let subject = core::subject(&node);
    let mut inflight: futures_util::stream::FuturesUnordered<
        futures_util::future::BoxFuture<'static, ()>,
    > = Default::default();
    // A message that would have made the batch too large: it starts the next one.
    let mut carry: Option<Out> = None;
    loop {
        let first = match carry.take() {
            Some(o) if inflight.len() < BATCHES_IN_FLIGHT => o,
            held => {
                carry = held;
                tokio::select! {
                    Some(()) = inflight.next(), if !inflight.is_empty() => continue,
                    o = rx.recv(), if carry.is_none() && inflight.len() < BATCHES_IN_FLIGHT => match o {
                        Some(o) => o,
                        None => break,
                    },
                }
            }
        };
        let mut size = first.body.len();
        let mut batch = vec![first];
        while batch.len() < core::BATCH_MAX {
            match rx.try_recv() {
                Ok(o) if !core::joins_batch(batch.len(), size, o.body.len()) => {
                    carry = Some(o);
                    break;
                }
                Ok(o) => {
                    size += o.body.len();
                    batch.push(o);
                }
                Err(_) => break,
            }
        }
        // A broadcast or topic message reaches every stand-in of this node with one
        // `Nats-Msg-Id`: one copy goes (the far node fans it out).
        let mut seen = HashSet::new();
        let unique: Vec<&Out> = batch
            .iter()
            .filter(|o| seen.insert(o.msg_id.as_str()))
            .collect();
        let (id, body) = match unique.as_slice() {
            [one] => (one.msg_id.clone(), one.body.clone()),
            many => (
                core::batch_msg_id(many.iter().map(|o| o.msg_id.as_str()), &node),
                bytes::Bytes::from(core::batch_body(many.iter().map(|o| &o.body[..]))),
            ),
        };
        // Writing the publish waits for one of the context's in-flight slots, and only a
        // polled PubAck future frees one: the batches already written are polled while it
        // waits, or a batcher holding every slot itself waits for ever (issue 28.1, as the
        // stand-ins did before 916b844).
        let first_try = {
            let start = start_publish(&sh, &subject, &id, body.clone());
            tokio::pin!(start);
            loop {
                tokio::select! {
                    r = &mut start => break r,
                    Some(()) = inflight.next(), if !inflight.is_empty() => {}
                }
            }
        };
        let (sh, subject) = (sh.clone(), subject.clone());
        inflight.push(Box::pin(async move {
            let seq = publish(&sh, &subject, &id, body, first_try).await;
            sh.stored_by_jetstream(batch.iter().map(|o| o.msg_id.as_str()), seq);
            for o in batch {
                if o.done.send(()).is_err() {
                    // Its stand-in stopped meanwhile: the relay delivers the message again
                    // to the next one, which publishes it again (deduplicated).
                    tracing::debug!(msg_id = %o.msg_id, "federation: published for a stand-in that stopped");
                }
            }
        }));
    }
    while inflight.next().await.is_some() {}
}

/// Writes one publish (in the stand-in's order); its PubAck is awaited by [`publish`].
async fn start_publish(
    sh: &Shared,
    subject: &str,
    msg_id: &str,
    body: bytes::Bytes,
) -> Result<jetstream::context::PublishAckFuture, String> {
    let publish = jetstream::message::PublishMessage::build()
        .payload(body)
        .message_id(msg_id);
    sh.js
        .send_publish(subject.to_owned(), publish)
        .await
        .map_err(|e| e.to_string())
}

/// Waits for the PubAck of a publish started by [`start_publish`], and publishes again under
/// the same `Nats-Msg-Id` until JetStream has it: the DELIVER stays unacknowledged (in the
/// store, the outbox) meanwhile. A message published again may be stored after later ones of
/// its stand-in; the far node restores their order (`Wire::prev`).
async fn publish(
    sh: &Shared,
    subject: &str,
    msg_id: &str,
    body: bytes::Bytes,
    first: Result<jetstream::context::PublishAckFuture, String>,
) -> u64 {
    let mut delay = Duration::from_millis(50);
    let mut attempt = first;
    loop {
        let result = match attempt {
            Ok(ack) => ack.await.map_err(|e| e.to_string()),
            Err(e) => Err(e),
        };
        match result {
            Ok(ack) => return ack.sequence,
            Err(e) => {
                tracing::debug!(error = %e, %subject, "federation: publish failed; retrying (the message waits in the store)");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(1));
            }
        }
        attempt = start_publish(sh, subject, msg_id, body.clone()).await;
    }
}

/// A directory entry as stored in the KV bucket; `None` (logged) when it cannot be encoded,
/// so that an empty value never overwrites an agent's entry.
fn entry_bytes<E: serde::Serialize>(name: &str, e: &E) -> Option<Vec<u8>> {
    match serde_json::to_vec(e) {
        Ok(v) => Some(v),
        Err(err) => {
            tracing::warn!(%name, error = %err, "federation: cannot encode a directory entry; not written");
            None
        }
    }
}
