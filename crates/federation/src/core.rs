//! The pure decisions of the federation, no I/O: names of subjects and buckets, the
//! deduplication id of a publish, what a message looks like between nodes, who holds a name in
//! the directory, and whether a delivery to a stand-in is published to another node.

use std::collections::BTreeMap;

use relay_protocol::Send;
use relay_protocol::query::{TraceEvent, TraceRecord, TraceState};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The JetStream stream every node's messages go through (one subject per node).
pub const STREAM: &str = "AGENT_RELAY";
/// Subjects are `agent-relay.node.<node>`.
pub const SUBJECT_PREFIX: &str = "agent-relay.node";
/// The KV bucket of the directory: key = agent name, value = [`Entry`].
pub const BUCKET: &str = "agent_relay_directory";
/// The `cli` a stand-in for a remote agent says in its HELLO: `remote@<node>`.
pub const STANDIN_CLI_PREFIX: &str = "remote@";
/// The name of the link's own tool connection (role `client`: never a recipient).
pub const TOOL_NAME: &str = "federation";

/// A node name that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "node name {0:?}: use 1 to 64 ASCII letters, digits, `-` or `_` (it is a NATS subject token)"
)]
pub struct BadNode(pub String);

/// Checks a node name: it becomes one token of a NATS subject and of a consumer name, so no
/// `.`, `*`, `>` or space.
///
/// # Errors
/// [`BadNode`].
pub fn validate_node(node: &str) -> Result<(), BadNode> {
    let ok = !node.is_empty()
        && node.len() <= 64
        && node
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(BadNode(node.to_owned()))
    }
}

/// The servers of a `--cluster` value: comma-separated URLs, blanks dropped.
pub fn servers(cluster: &str) -> Vec<String> {
    cluster
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Why a federation connection is exposed: `None` when it is authenticated (a credentials
/// file, or a user in a server URL) or local-only (every server on loopback); else what
/// anyone who can reach those servers can do, and what to do about it.
pub fn exposure(cluster: &str, creds: bool) -> Option<String> {
    let urls = servers(cluster);
    let rest = |u: &str| u.split_once("://").map_or(u, |(_, r)| r).to_owned();
    let user = urls.iter().any(|u| {
        let r = rest(u);
        r.split('/').next().is_some_and(|auth| auth.contains('@'))
    });
    let local = !urls.is_empty()
        && urls.iter().all(|u| {
            let r = rest(u);
            let hostport = r.split('/').next().unwrap_or_default();
            let host = if let Some(v6) = hostport.strip_prefix('[') {
                v6.split(']').next().unwrap_or_default()
            } else {
                hostport.split(':').next().unwrap_or_default()
            };
            host.eq_ignore_ascii_case("localhost")
                || host
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        });
    if creds || user || local {
        return None;
    }
    Some(format!(
        "the federation connection ({cluster}) is neither authenticated (no --cluster-creds, no \
         user in the URL) nor local-only: anyone who can reach that NATS server can send to this \
         relay's agents as any agent of another node, broadcast to `*`, and rewrite the \
         directory. Give each relay a credentials file (--cluster-creds) and TLS \
         (--cluster-ca): docs/FEDERATION.md, Running on real hosts"
    ))
}

/// The subject a node consumes.
pub fn subject(node: &str) -> String {
    format!("{SUBJECT_PREFIX}.{node}")
}

/// The durable consumer of a node.
pub fn consumer(node: &str) -> String {
    format!("node-{node}")
}

/// The `Nats-Msg-Id` of the message `(from, id)` published to `node`: the same for every
/// re-publish (after a crash, a lost PubAck, or one stand-in per recipient of a broadcast on
/// that node), so JetStream keeps one copy. The node is part of it because one stream holds
/// every node's subject and deduplicates across all of them.
pub fn msg_id(from: &str, id: &str, node: &str) -> String {
    let mut h = Sha256::new();
    for part in [from, id, node] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    h.finalize()
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The KV bucket of node names: key = node name, value = [`NodeLease`]: the one relay that
/// runs under that name now.
pub const NODES_BUCKET: &str = "agent_relay_nodes";
/// How often the owner of a node name renews its lease.
pub const LEASE_RENEW_MS: u64 = 1_000;
/// A lease not renewed for this long belongs to a relay that is gone: another may take it.
pub const LEASE_LAPSE_MS: u64 = 5_000;

/// Who runs under a node name: written by its relay when it takes the name, renewed every
/// [`LEASE_RENEW_MS`] (each renewal a KV update that expects the revision it last wrote, so
/// two relays can never both believe they hold it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeLease {
    /// The relay's identity: a random id kept in its data directory, so the same relay
    /// restarted (after a crash, say) takes its name back at once.
    pub owner: String,
    /// The host it runs on (for the error another relay gets).
    pub host: String,
    /// Its process id there.
    pub pid: u32,
    /// Its data directory there.
    #[serde(default)]
    pub data_dir: String,
    /// Renewals so far (each changes the value, so a watcher sees it alive).
    #[serde(default)]
    pub renewals: u64,
}

/// Whether a relay of identity `me` may take a node name whose lease is `current`: absent, its
/// own (a restart of the same relay), or `lapsed` (not renewed for [`LEASE_LAPSE_MS`]).
pub fn may_take_node(me: &str, current: Option<&NodeLease>, lapsed: bool) -> bool {
    match current {
        None => true,
        Some(l) => l.owner == me || lapsed,
    }
}

/// The refusal a relay gets when another holds its node name: what is going on and what to
/// do. `from_host`: the name was not given (`--node` unset) and is the host name.
pub fn node_taken_message(node: &str, holder: &NodeLease, from_host: bool) -> String {
    let lapse = LEASE_LAPSE_MS / 1000;
    let who = format!(
        "a relay on host {} (pid {}, data directory {})",
        holder.host,
        holder.pid,
        if holder.data_dir.is_empty() {
            "unknown"
        } else {
            &holder.data_dir
        }
    );
    if from_host {
        format!(
            "node name {node} is already held in the federation by {who}. --node was not given, \
             so this relay's node name is its host name, and another host with the same host \
             name (a cloned machine?) already runs under it: two relays under one node name \
             would split that node's messages between them. Give each relay its own name: \
             agent-relay up --node NAME (or `node = \"NAME\"` in .agent-relay/config.toml)"
        )
    } else {
        format!(
            "node name {node} is already held in the federation by {who}: two relays under one \
             node name would split that node's messages between them. Choose another name \
             (--node NAME), or stop that relay first (if it is gone, its claim lapses {lapse} s \
             after its last renewal and this relay can start)"
        )
    }
}

/// A message between nodes: what the far node's SEND needs, and where it came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Wire {
    /// Format version (1).
    pub v: u32,
    /// The node the sender is on.
    pub origin: String,
    /// Sender (an agent of `origin`).
    pub from: String,
    /// The SEND id: the DELIVER id on the far node too.
    pub id: String,
    /// Recipient as addressed (`*` for a broadcast).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// Topic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// The payload as delivered on the origin node.
    pub payload: Send,
    /// The sender is a tool or a person (`agent-relay send`: a client connection), not an
    /// agent: the far node sends it through a client connection, which never holds the name
    /// (so its own `send` under the same name keeps working).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tool: bool,
    /// The id of the message from the same sender to the same recipient that the publishing
    /// stand-in published just before this one (direct messages only; none for the first of a
    /// stand-in's session). Publishes are pipelined, so JetStream may store this one before
    /// that one (a PubAck lost in a failover, then re-published); the receiving node holds
    /// this one until that one has gone to its relay ([`Reorder`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prev: Option<String>,
    /// When the message expires (Unix ms): its acceptance on the origin node plus that node's
    /// inbox TTL. The far node's SEND carries it (`budget.expires_at`), so the time it waited
    /// in the origin's outbox counts and its TTL does not start again there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
}

impl Wire {
    /// The payload of the far node's SEND: as delivered on the origin node, with the
    /// expiry it had there.
    pub fn send_payload(&self) -> Send {
        let mut p = self.payload.clone();
        if let Some(at) = self.expires_at {
            p.budget
                .get_or_insert(relay_protocol::Budget {
                    hops: 0,
                    max_hops: 0,
                    expires_at: None,
                })
                .expires_at = Some(at);
        }
        p
    }
}

/// A message of another node that will not be delivered: sent back to the node its sender is
/// on, whose relay then dead-letters its own copy (the delivery to the far recipient's
/// stand-in) with this reason, and tells the sender as for a local dead letter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// The node where it failed.
    pub node: String,
    /// The sender: an agent (or tool) of the node this goes to.
    pub from: String,
    /// The message id.
    pub id: String,
    /// The recipient that did not get it: an agent of `node`.
    pub recipient: String,
    /// What the far node says: `expired`, `failed`, `forbidden`, `rate_limited`,
    /// `budget_exceeded`, `unknown_target`...
    pub code: String,
    /// Its reason there.
    pub reason: String,
}

impl Failure {
    /// The reason the origin node's dead letter gives: where, what, and why.
    pub fn reason_here(&self) -> String {
        format!(
            "not delivered on node {} ({}): {}",
            self.node, self.code, self.reason
        )
    }
}

/// What comes in on a node's subject: a message, or a failure of one this node sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Record {
    /// A failure on another node (`{"failure": {...}}`).
    Failure {
        /// It.
        failure: Failure,
    },
    /// A message.
    Message(Wire),
}

/// Several messages to one node in one JetStream message (issue 28.7): a node's link gathers
/// what its stand-ins publish to that node while a publish is on its way, so JetStream stores,
/// acknowledges and hands out one message for many. Each message keeps its own id (the far
/// store's (from, id) dedupe is what makes a second copy harmless).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Batch {
    /// The messages, in the order their stand-ins published them.
    pub batch: Vec<Wire>,
}

/// Most messages in one batch.
pub const BATCH_MAX: usize = 64;
/// A batch stays within this size: NATS refuses a payload over its `max_payload` (1 MiB by
/// default), and one relay message is at most a frame (1 MiB).
pub const BATCH_BYTES: usize = 256 * 1024;

/// Whether a message of `next` bytes joins a batch of `count` messages and `size` bytes; if not,
/// it starts the next one (a message larger than [`BATCH_BYTES`] goes alone, as before
/// batches).
pub fn joins_batch(count: usize, size: usize, next: usize) -> bool {
    count < BATCH_MAX && size.saturating_add(next) <= BATCH_BYTES
}

/// The body of a batch from the messages' own encodings (each a [`Wire`] as JSON), without
/// decoding them again.
pub fn batch_body<'a>(wires: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut out = b"{\"batch\":[".to_vec();
    for (i, w) in wires.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(w);
    }
    out.extend_from_slice(b"]}");
    out
}

/// The `Nats-Msg-Id` of a batch to `node`: from its messages' own ids, so the same batch
/// published again (its PubAck lost) is kept once by JetStream.
pub fn batch_msg_id<'a>(msg_ids: impl IntoIterator<Item = &'a str>, node: &str) -> String {
    let mut h = Sha256::new();
    for id in msg_ids {
        h.update((id.len() as u64).to_be_bytes());
        h.update(id.as_bytes());
    }
    let all: String = h
        .finalize()
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect();
    msg_id("batch", &all, node)
}

/// What one JetStream message on a node's subject carries: a batch of messages, a failure, or
/// one message.
///
/// # Errors
/// The JSON error when it is none of them.
pub fn parse_records(bytes: &[u8]) -> Result<Vec<Record>, serde_json::Error> {
    if bytes.starts_with(b"{\"batch\"") {
        let b: Batch = serde_json::from_slice(bytes)?;
        return Ok(b.batch.into_iter().map(Record::Message).collect());
    }
    serde_json::from_slice::<Record>(bytes).map(|r| vec![r])
}

/// The `Nats-Msg-Id` of a failure: one per (far node, sender, message, recipient), so a
/// failure published again (a crash before the ack) is kept once by JetStream.
pub fn failure_msg_id(f: &Failure, to_node: &str) -> String {
    msg_id(
        &format!("failure@{}", f.node),
        &format!("{}\u{0}{}\u{0}{}", f.from, f.id, f.recipient),
        to_node,
    )
}

/// A notice of this node's relay (a DELIVER from `relay` carrying `data.relay_notice`) that
/// reached the stand-in of `name`, an agent of `node`: a message `name` sent from `node` is a
/// dead letter here. Returns the failure to send back to `node`; `None` for anything else.
pub fn failure_of_notice(me: &str, name: &str, d: Delivered<'_>) -> Option<Failure> {
    if !d.from.eq_ignore_ascii_case("relay") {
        return None;
    }
    let n = d.payload.data.as_ref()?.get("relay_notice")?;
    let text = |k: &str| n.get(k).and_then(|v| v.as_str()).map(str::to_owned);
    let dlq = n.get("dlq_id").and_then(serde_json::Value::as_i64);
    // The relay's notices always say why; one that does not still says where it failed.
    let reason = text("reason").unwrap_or_else(|| format!("no reason given by node {me}"));
    Some(Failure {
        node: me.to_owned(),
        from: name.to_owned(),
        id: text("msg_id")?,
        recipient: text("recipient")?,
        code: text("code").unwrap_or_else(|| "failed".into()),
        reason: match dlq {
            Some(n) => format!("{reason} (dead letter {n} there)"),
            None => reason,
        },
    })
}

/// The subject a node's link answers `trace` questions on (core NATS request/reply, outside
/// the stream's subjects).
pub fn trace_subject(node: &str) -> String {
    format!("agent-relay.trace.{node}")
}

/// What one link asks another about a message: its story there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceAsk {
    /// Sender.
    pub from: String,
    /// Message id.
    pub id: String,
}

/// The answer: the far relay's trace of that message, or why there is none.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TraceAnswer {
    /// The story there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceRecord>,
    /// Why not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The nodes to ask about a trace: those of its recipients that are agents of other nodes
/// (`nodes`: remote agent -> its node).
pub fn far_nodes(
    trace: &TraceRecord,
    nodes: &std::collections::HashMap<String, String>,
) -> std::collections::BTreeSet<String> {
    trace
        .events
        .iter()
        .filter_map(|e| nodes.get(e.recipient.as_deref()?))
        .cloned()
        .collect()
}

/// A trace with the cross-node legs: the local delivery to a remote agent's stand-in
/// acknowledged (after JetStream's PubAck) becomes `published` (with the stream sequence when
/// this link still has it: `seqs`, node -> seq), and each far node's story follows, its
/// recipients named `NAME@node` (`@node` for the message there: `accepted` = stored on that
/// node). A node that did not answer is said on the last local line for it.
pub fn merge_trace(
    mut local: TraceRecord,
    nodes: &std::collections::HashMap<String, String>,
    seqs: &BTreeMap<String, u64>,
    far: Vec<(String, Result<TraceRecord, String>)>,
) -> TraceRecord {
    for e in &mut local.events {
        let Some(node) = e.recipient.as_deref().and_then(|r| nodes.get(r)) else {
            continue;
        };
        match e.state {
            TraceState::Injected => {
                e.state = TraceState::Published;
                e.detail = Some(match seqs.get(node) {
                    Some(seq) => {
                        format!("to node {node}: JetStream stored it (stream {STREAM}, seq {seq})")
                    }
                    None => format!("to node {node}: JetStream stored it (PubAck)"),
                });
            }
            TraceState::Delivered => {
                let d = e.detail.take().unwrap_or_default();
                e.detail = Some(
                    format!("{d} (the stand-in of an agent of node {node})")
                        .trim()
                        .to_owned(),
                );
            }
            _ => {}
        }
    }
    for (node, answer) in far {
        match answer {
            Ok(t) => local
                .events
                .extend(t.events.into_iter().map(|e| TraceEvent {
                    recipient: Some(match e.recipient {
                        Some(r) => format!("{r}@{node}"),
                        None => format!("@{node}"),
                    }),
                    detail: match (e.state, e.detail) {
                        (TraceState::Accepted, None) => Some(format!("stored on node {node}")),
                        (_, d) => d,
                    },
                    ..e
                })),
            Err(why) => {
                if let Some(e) = local
                    .events
                    .iter_mut()
                    .rev()
                    .find(|e| e.recipient.as_deref().and_then(|r| nodes.get(r)) == Some(&node))
                {
                    let d = e.detail.take().unwrap_or_default();
                    e.detail = Some(format!("{d}; node {node} not asked: {why}"));
                }
            }
        }
    }
    // Stable: equal times keep the order above.
    local.events.sort_by_key(|e| e.ts);
    local
}

/// One agent in the directory (the value under its name).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The node that holds the name.
    pub node: String,
    /// Connected to that node (as it last said).
    pub online: bool,
    /// Topic patterns it subscribed to: its stand-ins subscribe to the same on other nodes.
    #[serde(default)]
    pub topics: Vec<String>,
}

/// An agent of this node, as the local relay lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Local {
    /// Name.
    pub name: String,
    /// Connected now.
    pub online: bool,
    /// Subscriptions.
    pub topics: Vec<String>,
}

/// What to do with a local agent's directory entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Nobody holds the name: create the entry (only if still absent: the first holder keeps
    /// a name, DESIGN.md §11).
    Create(Entry),
    /// Ours, and changed: write it.
    Update(Entry),
    /// Ours and as it is.
    Keep,
    /// Another node holds the name: this agent is refused in the federation.
    Conflict {
        /// The node that holds it.
        owner: String,
    },
}

/// Decides about a local agent's entry given the directory's current one.
pub fn claim(me: &str, local: &Local, existing: Option<&Entry>) -> Claim {
    let mut topics = local.topics.clone();
    topics.sort();
    let want = Entry {
        node: me.to_owned(),
        online: local.online,
        topics,
    };
    match existing {
        None => Claim::Create(want),
        Some(e) if e.node != me => Claim::Conflict {
            owner: e.node.clone(),
        },
        Some(e) if *e == want => Claim::Keep,
        Some(_) => Claim::Update(want),
    }
}

/// The stand-ins this node should hold: every directory entry of another node, except names
/// an agent of this node already has (a conflict: never merged into one).
pub fn standins<'a>(
    me: &str,
    directory: &'a BTreeMap<String, Entry>,
    local_names: &std::collections::BTreeSet<String>,
) -> BTreeMap<&'a str, &'a Entry> {
    directory
        .iter()
        .filter(|(name, e)| e.node != me && !local_names.contains(*name))
        .map(|(name, e)| (name.as_str(), e))
        .collect()
}

/// A stand-in running here, as a directory pass sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    /// The node it stands for.
    pub node: String,
    /// The topics it subscribed to.
    pub topics: Vec<String>,
    /// Its task has ended (its name was taken here, or it failed).
    pub finished: bool,
}

/// What a directory pass does with the stand-ins: `stop` those whose agent moved node or
/// changed topics (they are started again), ended, or whose name is no longer wanted; `start`
/// every wanted name with none running (after the stops).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StandinPlan {
    /// Running stand-ins to stop.
    pub stop: Vec<String>,
    /// Wanted names to start a stand-in for.
    pub start: Vec<String>,
}

/// Decides a pass over the stand-ins: `wanted` ([`standins`]) against what is `running`. A
/// stand-in started for a sender the directory does not list yet (an inbound message came
/// before the directory's entry) is kept until the directory lists the name or it becomes
/// local.
pub fn plan_standins(
    wanted: &BTreeMap<&str, &Entry>,
    running: &BTreeMap<String, Running>,
    directory: &BTreeMap<String, Entry>,
    local_names: &std::collections::BTreeSet<String>,
) -> StandinPlan {
    let mut plan = StandinPlan::default();
    for (name, r) in running {
        let keep = !r.finished
            && match wanted.get(name.as_str()) {
                Some(e) => e.node == r.node && e.topics == r.topics,
                None => !directory.contains_key(name) && !local_names.contains(name),
            };
        if !keep {
            plan.stop.push(name.clone());
        }
    }
    for name in wanted.keys() {
        let kept = running.contains_key(*name) && !plan.stop.iter().any(|s| s == name);
        if !kept {
            plan.start.push((*name).to_owned());
        }
    }
    plan
}

/// What a stand-in does with a message delivered to it.
#[derive(Debug, Clone, PartialEq)]
pub enum Forward {
    /// Publish to the recipient's node, then acknowledge locally.
    Publish {
        /// Subject.
        subject: String,
        /// `Nats-Msg-Id`.
        msg_id: String,
        /// Body (boxed: the other variants are empty).
        wire: Box<Wire>,
    },
    /// Acknowledge without publishing: the message came from another node, whose relay
    /// published it to every node that needs it (publishing it again would echo it back).
    Skip,
    /// The sender's name is held by another node (a conflict): report the delivery failed,
    /// so it is a dead letter here and its sender is told.
    Refuse,
}

/// A message delivered to the stand-in of an agent of `node`.
#[derive(Debug, Clone, Copy)]
pub struct Delivered<'a> {
    /// Sender.
    pub from: &'a str,
    /// Message id.
    pub id: &'a str,
    /// As addressed.
    pub to: &'a str,
    /// Topic.
    pub topic: Option<&'a str>,
    /// Payload.
    pub payload: &'a Send,
    /// When it expires on this node (Unix ms): stored here at `ts`, plus this relay's inbox TTL.
    pub expires_at: Option<u64>,
}

/// Decides whether a delivery to a stand-in goes out. `remote_sender` is true when `from` is
/// a stand-in here (an agent of another node) or the relay itself; `conflict` when `from` is
/// a local agent whose name another node holds; `tool` when `from` is no agent here at all
/// (a client connection: a person's `send`, a script).
pub fn forward(
    me: &str,
    node: &str,
    d: Delivered<'_>,
    remote_sender: bool,
    conflict: bool,
    tool: bool,
) -> Forward {
    if remote_sender || d.from.eq_ignore_ascii_case("relay") {
        return Forward::Skip;
    }
    if conflict {
        return Forward::Refuse;
    }
    Forward::Publish {
        subject: subject(node),
        msg_id: msg_id(d.from, d.id, node),
        wire: Box::new(Wire {
            v: 1,
            origin: me.to_owned(),
            from: d.from.to_owned(),
            id: d.id.to_owned(),
            to: Some(d.to.to_owned()).filter(|t| !t.is_empty()),
            topic: d.topic.map(str::to_owned),
            payload: d.payload.clone(),
            tool,
            prev: None,
            expires_at: d.expires_at,
        }),
    }
}

/// Why a message from `name`, an agent of `me` whose name `owner` holds in the directory, does
/// not go to other nodes: the reason its dead letter gives (and its sender is told).
pub fn conflict_reason(name: &str, me: &str, owner: &str) -> String {
    format!(
        "name conflict: {name} is held by node {owner} in the federation, so {name} of node {me} \
         reaches no other node (both took the name while they could not see each other); \
         reconnect this agent under another name"
    )
}

/// Why a message from `from` of node `origin` cannot be handed over on node `me`: an agent
/// of `me` has that name (a name conflict, or an impostor). Its sender's node is told.
pub fn held_here_reason(from: &str, origin: &str, me: &str) -> String {
    format!(
        "name conflict: node {me} has its own agent named {from}, so a message from {from} of \
         node {origin} cannot be delivered there under that name; the agent of one of the \
         two nodes must reconnect under another name"
    )
}

/// Why a message from `from` that says it comes from node `origin` cannot be handed over on
/// node `me`: the directory gives `from` to node `owner`, and only that node speaks as it.
pub fn other_nodes_agent_reason(from: &str, origin: &str, me: &str, owner: &str) -> String {
    format!(
        "{from} is an agent of node {owner} in the federation's directory; node {origin} \
         cannot send as {from} to node {me}"
    )
}

/// Why a message from `from` of node `origin` cannot be handed over on node `me`: `person` is
/// one of `me`'s people, and only a person's own doors speak as them.
pub fn person_here_reason(from: &str, origin: &str, me: &str, person: &str) -> String {
    format!(
        "{from:?} is a person of node {me} ({person:?}); node {origin} cannot send as them \
         there (a person of another node sends under a name of its own: agent-relay send --from NAME)"
    )
}

/// The `cli` a stand-in reports, and back: the node of a stand-in's `cli`.
pub fn standin_cli(node: &str) -> String {
    format!("{STANDIN_CLI_PREFIX}{node}")
}

/// The node a stand-in's `cli` names, if it is one.
pub fn standin_node(cli: Option<&str>) -> Option<&str> {
    cli.and_then(|c| c.strip_prefix(STANDIN_CLI_PREFIX))
}

/// Restores each sender's order on the receiving node: a message is released (sent to the
/// local relay) only after the message its `prev` names, so neither pipelined publishes nor a
/// consumer with many messages in flight can reorder a sender's messages to one recipient.
///
/// Senders are keyed by `(origin, from)`. The set of released messages is bounded (`cap`);
/// a `prev` not in it is asked of the local store by the caller ([`Reorder::check`] says
/// [`Check::Ask`]), which is the case after a restart. Pure: time is an argument.
#[derive(Debug)]
pub struct Reorder<T> {
    released: std::collections::HashSet<(String, String)>,
    order: std::collections::VecDeque<(String, String)>,
    cap: usize,
    /// Messages waiting, by (sender, the id they wait for).
    waiting: std::collections::HashMap<(String, String), Vec<Held<T>>>,
}

/// A message held back: its id, the item, since when (ms).
type Held<T> = (String, T, u64);

/// What to do with an arriving message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// Release it now.
    Ready,
    /// Its predecessor is not known to have been released here: ask the local store whether
    /// it holds it; if not, [`Reorder::hold`] it.
    Ask,
}

impl<T> Reorder<T> {
    /// Remembers at most `cap` released messages.
    pub fn new(cap: usize) -> Self {
        Self {
            released: Default::default(),
            order: Default::default(),
            cap: cap.max(1),
            waiting: Default::default(),
        }
    }

    /// Whether `id` from `sender`, sent after `prev`, can go now.
    pub fn check(&self, sender: &str, id: &str, prev: Option<&str>) -> Check {
        match prev {
            None => Check::Ready,
            Some(p) if self.is_released(sender, p) || self.is_released(sender, id) => Check::Ready,
            Some(_) => Check::Ask,
        }
    }

    fn is_released(&self, sender: &str, id: &str) -> bool {
        self.released.contains(&(sender.to_owned(), id.to_owned()))
    }

    /// Keeps `item` (message `id`) until `prev` is released. A second copy of a message already
    /// waiting (a JetStream redelivery) replaces the first: the newest handle acknowledges it.
    pub fn hold(&mut self, sender: &str, id: &str, prev: &str, item: T, now_ms: u64) {
        let list = self
            .waiting
            .entry((sender.to_owned(), prev.to_owned()))
            .or_default();
        match list.iter_mut().find(|(i, _, _)| i == id) {
            Some(slot) => slot.1 = item,
            None => list.push((id.to_owned(), item, now_ms)),
        }
    }

    /// Records that `id` from `sender` went to the relay; returns what waited for it (to be
    /// released in turn, each again through this call).
    pub fn released(&mut self, sender: &str, id: &str) -> Vec<(String, T)> {
        let key = (sender.to_owned(), id.to_owned());
        if self.released.insert(key.clone()) {
            self.order.push_back(key.clone());
            while self.order.len() > self.cap {
                if let Some(old) = self.order.pop_front() {
                    self.released.remove(&old);
                }
            }
        }
        self.waiting
            .remove(&key)
            .unwrap_or_default()
            .into_iter()
            .map(|(i, t, _)| (i, t))
            .collect()
    }

    /// Messages that waited longer than `max_ms` for a predecessor that never came (it expired
    /// on its node, say): released anyway, never lost. (sender, id, item).
    pub fn overdue(&mut self, now_ms: u64, max_ms: u64) -> Vec<(String, String, T)> {
        let mut out = Vec::new();
        self.waiting.retain(|(sender, _), list| {
            let (late, keep): (Vec<_>, Vec<_>) = std::mem::take(list)
                .into_iter()
                .partition(|(_, _, since)| now_ms.saturating_sub(*since) > max_ms);
            out.extend(late.into_iter().map(|(i, t, _)| (sender.clone(), i, t)));
            *list = keep;
            !list.is_empty()
        });
        out
    }

    /// Messages waiting.
    pub fn waiting(&self) -> usize {
        self.waiting.values().map(Vec::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use relay_protocol::Kind;

    fn payload() -> Send {
        Send {
            origin: None,
            kind: Kind::Message,
            body: "hi".into(),
            data: None,
            thread: None,
            in_reply_to: None,
            budget: None,
            urgent: false,
        }
    }

    #[test]
    fn node_names_are_subject_tokens() {
        assert!(validate_node("laptop-1_b").is_ok());
        for bad in ["", "a.b", "a*", "a>", "a b", &"x".repeat(65)] {
            assert!(validate_node(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn msg_id_is_stable_and_distinct_per_node() {
        assert_eq!(msg_id("A", "1", "n"), msg_id("A", "1", "n"));
        assert_ne!(msg_id("A", "1", "n"), msg_id("A", "1", "m"));
        // Length-prefixed: ("AB","1") and ("A","B1") differ.
        assert_ne!(msg_id("AB", "1", "n"), msg_id("A", "B1", "n"));
        assert_eq!(msg_id("A", "1", "n").len(), 32);
    }

    #[test]
    fn first_holder_keeps_a_name() {
        let l = Local {
            name: "Bob".into(),
            online: true,
            topics: vec!["b".into(), "a".into()],
        };
        let Claim::Create(e) = claim("n1", &l, None) else {
            panic!()
        };
        assert_eq!(e.topics, vec!["a", "b"]);
        assert_eq!(claim("n1", &l, Some(&e)), Claim::Keep);
        let other = Entry {
            node: "n2".into(),
            ..e.clone()
        };
        assert_eq!(
            claim("n1", &l, Some(&other)),
            Claim::Conflict { owner: "n2".into() }
        );
        let off = Entry {
            online: false,
            ..e.clone()
        };
        assert_eq!(claim("n1", &l, Some(&off)), Claim::Update(e));
    }

    #[test]
    fn standins_skip_own_and_conflicting_names() {
        let e = |n: &str| Entry {
            node: n.into(),
            online: true,
            topics: vec![],
        };
        let dir: BTreeMap<String, Entry> = [
            ("A".to_owned(), e("n1")),
            ("B".to_owned(), e("n2")),
            ("C".to_owned(), e("n2")),
        ]
        .into();
        let local = ["C".to_owned()].into();
        let s = standins("n1", &dir, &local);
        assert_eq!(s.keys().copied().collect::<Vec<_>>(), vec!["B"]);
    }

    #[test]
    fn only_local_senders_are_published() {
        let p = payload();
        let d = Delivered {
            from: "Alice",
            id: "m1",
            to: "*",
            topic: None,
            payload: &p,
            expires_at: Some(7),
        };
        match forward("n1", "n2", d, false, false, false) {
            Forward::Publish {
                subject: s,
                msg_id: m,
                wire,
            } => {
                assert_eq!(s, "agent-relay.node.n2");
                assert_eq!(m, msg_id("Alice", "m1", "n2"));
                assert_eq!(wire.to.as_deref(), Some("*"));
                assert_eq!(wire.origin, "n1");
                let back: Wire =
                    serde_json::from_slice(&serde_json::to_vec(&wire).unwrap()).unwrap();
                assert_eq!(back, *wire);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(forward("n1", "n2", d, true, false, false), Forward::Skip);
        assert_eq!(forward("n1", "n2", d, false, true, false), Forward::Refuse);
        let relay = Delivered { from: "relay", ..d };
        assert_eq!(
            forward("n1", "n2", relay, false, false, false),
            Forward::Skip
        );
        match forward("n1", "n2", d, false, false, true) {
            Forward::Publish { wire, .. } => assert!(wire.tool),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn reorder_holds_a_message_until_its_predecessor_went() {
        let mut r: Reorder<u32> = Reorder::new(2);
        assert_eq!(r.check("n1/A", "m1", None), Check::Ready);
        assert!(r.released("n1/A", "m1").is_empty());
        assert_eq!(r.check("n1/A", "m2", Some("m1")), Check::Ready);
        // m3 arrives before m2 (m2's PubAck was lost and it was published again later).
        assert_eq!(r.check("n1/A", "m3", Some("m2")), Check::Ask);
        r.hold("n1/A", "m3", "m2", 3, 0);
        r.hold("n1/A", "m4", "m3", 4, 0);
        // A redelivered copy of m3 replaces the held one.
        r.hold("n1/A", "m3", "m2", 33, 5);
        assert_eq!(r.waiting(), 2);
        assert_eq!(r.released("n1/A", "m2"), vec![("m3".to_owned(), 33)]);
        assert_eq!(r.released("n1/A", "m3"), vec![("m4".to_owned(), 4)]);
        assert_eq!(r.waiting(), 0);
        // Another sender's m2 is another message.
        assert_eq!(r.check("n2/A", "x", Some("m3")), Check::Ask);
        // A redelivery of a message already released goes at once (a duplicate there).
        assert_eq!(r.check("n1/A", "m3", Some("zz")), Check::Ready);
        // Bounded memory: m1 and m2 are forgotten (asked of the store instead).
        assert_eq!(r.check("n1/A", "m9", Some("m1")), Check::Ask);
        r.hold("n1/A", "m9", "m8", 9, 100);
        assert!(r.overdue(1000, 1000).is_empty());
        assert_eq!(
            r.overdue(1101, 1000),
            vec![("n1/A".to_owned(), "m9".to_owned(), 9)]
        );
        assert_eq!(r.waiting(), 0);
    }

    #[test]
    fn a_batch_round_trips_and_its_id_follows_its_messages() {
        let p = payload();
        let d = Delivered {
            from: "Alice",
            id: "m1",
            to: "Bob",
            topic: None,
            payload: &p,
            expires_at: None,
        };
        let Forward::Publish { wire, .. } = forward("n1", "n2", d, false, false, false) else {
            panic!()
        };
        let w2 = Wire {
            id: "m2".into(),
            prev: Some("m1".into()),
            ..(*wire).clone()
        };
        let enc: Vec<Vec<u8>> = [&*wire, &w2]
            .iter()
            .map(|w| serde_json::to_vec(w).unwrap())
            .collect();
        let body = batch_body(enc.iter().map(Vec::as_slice));
        assert_eq!(
            parse_records(&body).unwrap(),
            vec![Record::Message((*wire).clone()), Record::Message(w2)]
        );
        // One message alone, and a failure, as before.
        assert_eq!(
            parse_records(&enc[0]).unwrap(),
            vec![Record::Message((*wire).clone())]
        );
        assert!(parse_records(b"{\"batch\": 3}").is_err());
        assert_eq!(
            batch_msg_id(["m1", "m2"], "n2"),
            batch_msg_id(["m1", "m2"], "n2")
        );
        assert_ne!(batch_msg_id(["m1", "m2"], "n2"), batch_msg_id(["m1"], "n2"));
        assert_ne!(
            batch_msg_id(["m1", "m2"], "n2"),
            batch_msg_id(["m1", "m2"], "n3")
        );
        // Within the size and count, whatever comes first.
        assert!(joins_batch(1, 1_000, 1_000));
        assert!(!joins_batch(BATCH_MAX, 1_000, 1));
        // A large message behind small ones starts a batch of its own: 250 KB + 840 KB would
        // pass NATS's 1 MiB payload limit (published again for ever).
        assert!(!joins_batch(63, 250_000, 840_000));
        assert!(!joins_batch(1, 10, BATCH_BYTES));
    }

    #[test]
    fn a_notice_to_a_standin_becomes_a_failure_for_its_node() {
        let mut p = payload();
        p.data = Some(serde_json::json!({"relay_notice": {
            "msg_id": "m1", "recipient": "Bob", "code": "expired",
            "reason": "Bob did not take it", "dlq_id": 4}}));
        let d = Delivered {
            from: "relay",
            id: "dead-letter-4",
            to: "Alice",
            topic: None,
            payload: &p,
            expires_at: None,
        };
        let f = failure_of_notice("n2", "Alice", d).unwrap();
        assert_eq!((f.node.as_str(), f.from.as_str()), ("n2", "Alice"));
        assert_eq!((f.id.as_str(), f.recipient.as_str()), ("m1", "Bob"));
        assert_eq!(f.reason, "Bob did not take it (dead letter 4 there)");
        assert!(f.reason_here().contains("node n2 (expired)"));
        // Anything else from anyone else is no failure.
        assert!(failure_of_notice("n2", "Alice", Delivered { from: "Carol", ..d }).is_none());
        let plain = payload();
        assert!(
            failure_of_notice(
                "n2",
                "Alice",
                Delivered {
                    payload: &plain,
                    ..d
                }
            )
            .is_none()
        );
        // On the wire: told apart from a message.
        let rec = Record::Failure { failure: f.clone() };
        let back: Record = serde_json::from_slice(&serde_json::to_vec(&rec).unwrap()).unwrap();
        assert_eq!(back, rec);
        let id = failure_msg_id(&f, "n1");
        assert_eq!(id, failure_msg_id(&f.clone(), "n1"));
        assert_ne!(
            id,
            failure_msg_id(
                &Failure {
                    recipient: "Eve".into(),
                    ..f
                },
                "n1"
            )
        );
    }

    #[test]
    fn a_trace_gets_the_far_legs() {
        let ev = |ts, r: Option<&str>, state, d: Option<&str>| TraceEvent {
            ts,
            recipient: r.map(str::to_owned),
            state,
            detail: d.map(str::to_owned),
        };
        let local = TraceRecord {
            origin: None,
            id: "m1".into(),
            pos: Some(1),
            from: "Alice".into(),
            to: "Bob".into(),
            topic: None,
            events: vec![
                ev(1, None, TraceState::Accepted, None),
                ev(1, Some("Bob"), TraceState::Queued, Some("seq 1")),
                ev(2, Some("Bob"), TraceState::Delivered, Some("to session s")),
                ev(
                    4,
                    Some("Bob"),
                    TraceState::Injected,
                    Some("acknowledged by the recipient"),
                ),
            ],
        };
        let nodes = [("Bob".to_owned(), "n2".to_owned())].into();
        assert_eq!(far_nodes(&local, &nodes), ["n2".to_owned()].into());
        let far = TraceRecord {
            events: vec![
                ev(3, None, TraceState::Accepted, None),
                ev(5, Some("Bob"), TraceState::Verified, Some("seen")),
            ],
            ..local.clone()
        };
        let seqs = [("n2".to_owned(), 42)].into();
        let t = merge_trace(local.clone(), &nodes, &seqs, vec![("n2".into(), Ok(far))]);
        let states: Vec<_> = t
            .events
            .iter()
            .map(|e| (e.recipient.clone().unwrap_or_default(), e.state))
            .collect();
        assert_eq!(
            states,
            vec![
                (String::new(), TraceState::Accepted),
                ("Bob".into(), TraceState::Queued),
                ("Bob".into(), TraceState::Delivered),
                ("@n2".into(), TraceState::Accepted),
                ("Bob".into(), TraceState::Published),
                ("Bob@n2".into(), TraceState::Verified),
            ]
        );
        assert!(t.events[4].detail.as_deref().unwrap().contains("seq 42"));
        let t = merge_trace(
            local,
            &nodes,
            &BTreeMap::new(),
            vec![("n2".into(), Err("no answer".into()))],
        );
        assert!(
            t.events[3]
                .detail
                .as_deref()
                .unwrap()
                .contains("node n2 not asked: no answer")
        );
    }

    #[test]
    fn standin_cli_round_trips() {
        assert_eq!(standin_node(Some(&standin_cli("n2"))), Some("n2"));
        assert_eq!(standin_node(Some("claude")), None);
        assert_eq!(
            servers(" nats://a:1, ,nats://b:2"),
            vec!["nats://a:1", "nats://b:2"]
        );
    }

    #[test]
    fn a_node_name_is_taken_only_when_free_own_or_lapsed() {
        let held = NodeLease {
            owner: "x".into(),
            host: "h1".into(),
            pid: 7,
            data_dir: "/d".into(),
            renewals: 3,
        };
        assert!(may_take_node("me", None, false));
        assert!(!may_take_node("me", Some(&held), false));
        assert!(may_take_node("me", Some(&held), true));
        assert!(may_take_node("x", Some(&held), false));
        let m = node_taken_message("b", &held, false);
        assert!(
            m.contains("node name b is already held")
                && m.contains("host h1")
                && m.contains("--node NAME"),
            "{m}"
        );
        let m = node_taken_message("b", &held, true);
        assert!(m.contains("--node was not given"), "{m}");
    }

    #[test]
    fn a_connection_is_exposed_unless_authenticated_or_loopback() {
        assert_eq!(exposure("nats://127.0.0.1:4222", false), None);
        assert_eq!(
            exposure("nats://localhost:4222,nats://[::1]:4223", false),
            None
        );
        assert_eq!(exposure("nats://relay:pw@nats.example:4222", false), None);
        assert_eq!(exposure("tls://nats.example:4222", true), None);
        let w = exposure("nats://127.0.0.1:4222,nats://10.0.0.2:4222", false);
        assert!(w.is_some_and(|w| w.contains("neither authenticated")));
        assert!(exposure("nats.example:4222", false).is_some());
    }
    #[test]
    fn a_pass_restarts_moved_stand_ins_keeps_early_ones_and_starts_the_missing() {
        use std::collections::BTreeSet;
        let entry = |node: &str, topics: &[&str]| Entry {
            node: node.into(),
            online: true,
            topics: topics.iter().map(|t| (*t).to_owned()).collect(),
        };
        let directory: BTreeMap<String, Entry> = [
            ("Ann".to_owned(), entry("b", &[])),
            ("Bob".to_owned(), entry("c", &[])),
            ("Cy".to_owned(), entry("b", &["build.*"])),
            ("Dee".to_owned(), entry("b", &[])),
            ("Me".to_owned(), entry("a", &[])),
        ]
        .into();
        let local: BTreeSet<String> = ["Me".to_owned(), "Dee".to_owned()].into();
        let wanted = standins("a", &directory, &local);
        let running = |node: &str, topics: &[&str], finished: bool| Running {
            node: node.into(),
            topics: topics.iter().map(|t| (*t).to_owned()).collect(),
            finished,
        };
        let running: BTreeMap<String, Running> = [
            // Unchanged: kept.
            ("Ann".to_owned(), running("b", &[], false)),
            // Moved from node b to c: stopped and started again.
            ("Bob".to_owned(), running("b", &[], false)),
            // Its topics changed: the same.
            ("Cy".to_owned(), running("b", &[], false)),
            // Its name is local here now (a conflict): stopped, not started.
            ("Dee".to_owned(), running("b", &[], false)),
            // Started for a sender the directory does not list yet: kept.
            ("Early".to_owned(), running("c", &[], false)),
            // Ended: stopped.
            ("Gone".to_owned(), running("b", &[], true)),
        ]
        .into();
        let plan = plan_standins(&wanted, &running, &directory, &local);
        assert_eq!(plan.stop, ["Bob", "Cy", "Dee", "Gone"]);
        assert_eq!(plan.start, ["Bob", "Cy"]);
    }
}
