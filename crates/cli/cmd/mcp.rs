//! `agent-relay mcp`: the relay as an MCP server over stdio, so that an agent sends and reads
//! relay messages through tool calls (exact text, lines and all) instead of printed directives.
//!
//! It is an ordinary client of the daemon: every send goes through the daemon's admission
//! (names, ids, budgets, rate limits, access rules, traces, exactly-once), and the tool result
//! is the daemon's ACK or NACK.
//!
//! Who it speaks as comes from the agent's session, never from a name alone (issue 23.1/23.2,
//! `docs/SECURITY.md` "Doors"). Started by a wrapped agent (its CLI runs it, with the wrapper's
//! environment: `AGENT_RELAY_NAME` and the door key `AGENT_RELAY_SESSION`), it joins the
//! wrapper's identity: it sends through the wrapper's door with that key and reads the inbox
//! from the store, without a second agent connection (`docs/DESIGN` §11, one agent, several
//! doors). With no session (no key), `--name` (or `AGENT_RELAY_NAME`) is the name of an agent
//! that has none yet: the server connects as that agent, so that it is a routable, online name
//! whose messages wait for it; a name a wrapper or another connection holds is refused.
//!
//! What was handed to the model is recorded in the relay's store, never in this process: a
//! server that holds the name keeps the relay's deliveries unacknowledged until `relay_inbox`
//! shows them to the model, oldest first and page by page, and acknowledges each then as
//! verified by this door (`trace` says so). A server that stops, or a relay that restarts,
//! leaves what was not shown waiting in the store, for the next server or the agent's wrapper.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use relay_client::paths::Paths;
use relay_client::{Client, ClientConfig, ClientError, Delivered, Outgoing};
use relay_protocol::query::{HistoryFilter, MessageRecord, QueryRequest, QueryResult};
use relay_protocol::text::for_terminal;
use relay_protocol::{AckStatus, Kind};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::{ServerHandler, ServiceExt, schemars, tool, tool_handler, tool_router};
use serde::Deserialize;

use crate::cmd::mailbox::Mailbox;

/// Arguments of `agent-relay mcp`.
#[derive(Debug, clap::Args)]
pub(crate) struct McpArgs {
    /// The name of an agent with no wrapper (no session yet): messages sent through this
    /// server are from it, and its inbox is read. Leave it out for wrapped agents: a wrapped
    /// agent's CLI starts the server with the wrapper's environment ($AGENT_RELAY_NAME and
    /// its door key), which names it; a name another agent's wrapper or connection holds is
    /// refused.
    #[arg(short = 'n', long, value_name = "NAME")]
    pub(crate) name: Option<String>,
}

/// Who this server speaks as: the agent's name, and the door key when it runs in a wrapped
/// agent's session.
struct Identity {
    name: String,
    key: Option<String>,
}

/// The identity from `--name` and the environment a wrapper gives its agent.
fn identity(args: &McpArgs) -> anyhow::Result<Identity> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let session = env("AGENT_RELAY_NAME");
    let key = env(relay_wrap::DOOR_KEY_ENV);
    let name = match (&args.name, &session, &key) {
        // In a wrapped agent's session: that agent, whatever a shared set-up names.
        (Some(given), Some(own), Some(_)) if given != own => {
            return Err(crate::exit::usage(format!(
                "this MCP server runs in the session of the wrapped agent {own} \
                 ($AGENT_RELAY_NAME and its door key come from {own}'s wrapper), which speaks \
                 only as {own}; it cannot speak as {given:?}. Take --name out of the MCP \
                 set-up, which every agent of the project shares: \
                 `claude mcp remove relay; claude mcp add relay -- agent-relay mcp`"
            )));
        }
        (Some(given), _, _) => given.clone(),
        (None, Some(own), _) => own.clone(),
        (None, None, _) => {
            return Err(crate::exit::usage(
                "no agent name: run this server from a wrapped agent (`agent-relay -n NAME \
                 claude`; its CLI starts the server with the wrapper's environment), or give \
                 --name NAME for an agent with no wrapper",
            ));
        }
    };
    relay_protocol::validate_agent_name(&name)
        .map_err(|e| crate::exit::usage(format!("--name {name:?}: {e}")))?;
    // A key with no name of its session (`--name` given, AGENT_RELAY_NAME unset) is no
    // session's.
    let key = key.filter(|_| session.as_deref() == Some(name.as_str()));
    Ok(Identity { name, key })
}

/// What the server says about itself to the model at `initialize`.
const INSTRUCTIONS: &str = "Tools of agent-relay, which connects you with other AI agents \
working in other terminals. relay_send sends a message (the result is the relay's receipt or \
its refusal; an answer to a message relay_inbox showed you is sent as a reply to it); \
relay_inbox shows the messages sent to you that you have not seen, oldest first, a page at a \
time (call it again while it says more are waiting); relay_read shows one message in full; relay_agents lists the agents; relay_search searches the history; relay_spawn starts a worker \
agent with a task (its answers come back to you) and relay_release stops it.";

/// Runs the MCP server on stdin/stdout until the client closes it.
pub(crate) fn run(paths: &Paths, args: &McpArgs) -> anyhow::Result<()> {
    let who = identity(args)?;
    // As a wrapper would: the relay starts if it is not running, with the project's settings.
    let (settings, _) = crate::settings::for_project(paths, &crate::settings::Flags::new())?;
    crate::cmd::up::start_background(paths, &settings.settings)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let door = paths
        .data_dir
        .join("team")
        .join(&who.name)
        .join(relay_wrap::DOOR_SOCKET);
    rt.block_on(serve(paths.socket.clone(), who, door))
}

async fn serve(socket: PathBuf, who: Identity, door: PathBuf) -> anyhow::Result<()> {
    let Identity { name, key } = who;
    let agent = match &key {
        // The agent's own session: its wrapper holds the name (or will again, when it is
        // restarting); every call goes through its door. A door that refuses the key is not
        // this session's: say so now rather than at every call.
        Some(key) => {
            check_key(&door, &name, key).await?;
            None
        }
        None if tokio::net::UnixStream::connect(&door).await.is_ok() => {
            return Err(crate::exit::usage(format!(
                "{name} is a wrapped agent (its wrapper's door {} answers), and only its own \
                 session speaks as it: this process has not its door key. A wrapped agent's \
                 CLI starts its MCP server with the wrapper's environment (AGENT_RELAY_NAME and \
                 {}), so set the server up with no name: `claude mcp add relay -- agent-relay \
                 mcp` (Codex: `codex mcp add relay -- agent-relay mcp`, and pass the two \
                 variables through), then start the agent with `agent-relay -n {name} claude`",
                door.display(),
                relay_wrap::DOOR_KEY_ENV
            )));
        }
        None => match Mailbox::open(&socket, &name, "mcp", true, true).await? {
            Some(mailbox) => Some(Arc::new(mailbox)),
            None => {
                return Err(crate::exit::usage(format!(
                    "{name} is connected to the relay (another agent's session holds the name: \
                     a wrapper, or another `agent-relay mcp`), and only that session speaks as \
                     it. Choose another --name, or, for a wrapped agent, set the server up with \
                     no name so that the agent's own session starts it: `claude mcp add relay \
                     -- agent-relay mcp`"
                )));
            }
        },
    };
    // Holding the name, this server has the agent's messages: Claude Code's hooks (no
    // wrapper) ask it for a page through a socket in the agent's team directory.
    let _hook_door = match &agent {
        Some(mailbox) => hook_door(&door, Arc::clone(mailbox)),
        None => None,
    };
    let server = RelayMcp {
        socket,
        name,
        door,
        key,
        agent,
        replying_to: Arc::new(Mutex::new(HashMap::new())),
        tool_router: RelayMcp::tool_router(),
    };
    let running = server.serve(rmcp::transport::stdio()).await?;
    running.waiting().await?;
    Ok(())
}

/// Asks the wrapper's door who it belongs to, with `key`: a door that refuses it belongs to
/// another session (the server is not started). A door that does not answer yet (the wrapper
/// is starting, or restarting) is tried again at each call.
async fn check_key(door: &std::path::Path, name: &str, key: &str) -> anyhow::Result<()> {
    match door_exchange(door, &serde_json::json!({"hello": true, "key": key})).await {
        Ok(v) if v["agent"].as_str() == Some(name) => Ok(()),
        Ok(v) => Err(crate::exit::usage(format!(
            "{name}'s wrapper refused this MCP server's door key ({}): it was not started by \
             {name}'s own session. Start the agent with `agent-relay -n {name} claude`, and set \
             the server up with no name: `claude mcp add relay -- agent-relay mcp`",
            for_terminal(v["error"].as_str().unwrap_or("no answer"))
        ))),
        Err(e) => {
            tracing::info!(agent = name, error = %e, "the wrapper's door does not answer yet; sends go to it when it does");
            Ok(())
        }
    }
}

/// One request to the wrapper's door and its answer: one JSON line each way.
async fn door_exchange(
    door: &std::path::Path,
    request: &serde_json::Value,
) -> std::io::Result<serde_json::Value> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let stream = tokio::net::UnixStream::connect(door).await?;
    let (read, mut write) = stream.into_split();
    write.write_all(format!("{request}\n").as_bytes()).await?;
    let mut line = String::new();
    tokio::io::BufReader::new(read).read_line(&mut line).await?;
    serde_json::from_str(&line).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("the wrapper's answer is not JSON ({e}): {line:?}"),
        )
    })
}

/// Removes the hook door's socket when the server ends.
struct HookDoor(PathBuf);

impl Drop for HookDoor {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.0) {
            tracing::debug!(error = %e, "cannot remove the hook door's socket");
        }
    }
}

/// Whether the process at the other end of `stream` is of this agent's own session: the agent
/// CLI that started this server (its parent, `session`) or one of that CLI's descendants (the
/// hooks Claude Code runs). The wrapper's door asks for the door key its wrapper put in the
/// session's environment; an unwrapped agent has no wrapper to give one, so the session is
/// told by the process tree instead, the same rule (issue 24, item noticed: any local process
/// took the agent's waiting page). `Err`: why the caller is refused.
fn of_session(stream: &tokio::net::UnixStream, session: u32) -> Result<(), String> {
    let pid = stream
        .peer_cred()
        .map_err(|e| format!("cannot tell who is asking ({e})"))?
        .pid()
        .and_then(|p| u32::try_from(p).ok())
        .ok_or("cannot tell which process is asking")?;
    if relay_wrap::descends_from(pid, session) {
        Ok(())
    } else {
        Err(format!(
            "process {pid} is not of this agent's session (its CLI, process {session}, and what \
             that runs): only the agent's own hooks are handed its messages"
        ))
    }
}

/// Opens the socket `hooks.rs` asks (`team/NAME/mcp-door.sock`, next to where a wrapper's door
/// would be): one JSON line `{"hook": "stop"|"prompt"}`, answered by one JSON line, a page of
/// messages taken from `mailbox` (see `hooks::answer_from`), for the agent's own session only
/// ([`of_session`]). A door that cannot open is logged: the hooks then hand nothing over while
/// this server holds the name.
fn hook_door(wrapper_door: &std::path::Path, mailbox: Arc<Mailbox>) -> Option<HookDoor> {
    // The agent CLI that started this server (Claude Code runs its MCP servers itself).
    let session = std::os::unix::process::parent_id();
    use std::os::unix::fs::DirBuilderExt;
    let dir = wrapper_door.parent()?;
    if let Err(e) = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
    {
        tracing::warn!(error = %e, dir = %dir.display(), "cannot create the team directory for the hooks' door");
        return None;
    }
    let path = dir.join(crate::cmd::hooks::MCP_DOOR);
    // A socket left by a server that died: this server holds the name now.
    if let Err(e) = std::fs::remove_file(&path)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(error = %e, "cannot remove an old hook door socket");
    }
    let listener = match tokio::net::UnixListener::bind(&path) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, path = %path.display(), "cannot open the door for Claude Code's hooks");
            return None;
        }
    };
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "the hooks' door stopped accepting");
                    return;
                }
            };
            let mailbox = Arc::clone(&mailbox);
            tokio::spawn(async move {
                use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
                let refused = of_session(&stream, session).err();
                let (read, mut write) = stream.into_split();
                let mut line = String::new();
                let read = tokio::io::BufReader::new(read.take(4096))
                    .read_line(&mut line)
                    .await;
                let answer = match (read, refused) {
                    // Refused before anything is taken from the mailbox.
                    (Ok(_), Some(why)) => {
                        tracing::warn!(%why, "the hooks' door refused a caller");
                        serde_json::json!({"error": format!("refused: {why}")})
                    }
                    (Ok(_), None) => match serde_json::from_str::<serde_json::Value>(&line) {
                        // The PostToolUse hook's edit, on the connection that holds the name.
                        Ok(v) if v.get("query").is_some() => {
                            edited_by_hook(&mailbox, v["query"].clone()).await
                        }
                        Ok(v) => {
                            let hook = v["hook"].as_str().unwrap_or("");
                            crate::cmd::hooks::answer_from(&mailbox, hook).await
                        }
                        Err(e) => serde_json::json!({"error": format!("not a hook request: {e}")}),
                    },
                    (Err(e), _) => {
                        serde_json::json!({"error": format!("cannot read the request: {e}")})
                    }
                };
                if let Err(e) = write.write_all(format!("{answer}\n").as_bytes()).await {
                    tracing::warn!(error = %e, "the hook left before its answer: the messages it was handed are recorded as handed over");
                }
            });
        }
    });
    Some(HookDoor(path))
}

/// The hooks' door asked the relay a question on the agent's connection: only `edited` (the
/// PostToolUse hook's report), answered `{"result": RESULT}` or `{"error"}`.
async fn edited_by_hook(mailbox: &Mailbox, query: serde_json::Value) -> serde_json::Value {
    match serde_json::from_value::<QueryRequest>(query) {
        Ok(req @ QueryRequest::Edited { .. }) => match mailbox.client().query(req).await {
            Ok(result) => serde_json::json!({ "result": result }),
            Err(e) => serde_json::json!({"error": e.to_string()}),
        },
        Ok(_) => serde_json::json!({"error": "the hooks' door asks only edited"}),
        Err(e) => serde_json::json!({"error": format!("not a query: {e}")}),
    }
}

/// The door's name in a delivery's trace.
const DOOR: &str = "shown to the model by relay_inbox (MCP server)";

/// Arguments of `relay_send`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct SendParams {
    /// The recipient agent's name, or "*" for every agent.
    to: String,
    /// The message, exactly as it should arrive (several lines, code and indentation are kept).
    body: String,
    /// A topic, for a message to everyone subscribed to it (with to = "*").
    #[serde(default)]
    topic: Option<String>,
    /// The conversation it belongs to: the id of the thread's first message (as shown in
    /// relay_inbox), to answer within it.
    #[serde(default)]
    thread: Option<String>,
    /// Deliver before other waiting messages.
    #[serde(default)]
    urgent: bool,
    /// The id of the message this answers (or its first 8 or more characters, as shown in
    /// brackets): the answer joins its thread and counts in the conversation's hop budget.
    /// Without it, a message to an agent whose message relay_inbox showed you last is an
    /// answer to that message.
    #[serde(default)]
    reply_to: Option<String>,
}

/// Arguments of `relay_inbox`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct InboxParams {
    /// Show the latest messages to you, whether shown before or not (nothing is marked read).
    #[serde(default)]
    all: bool,
    /// At most this many messages (default 20); call again for the next ones.
    #[serde(default)]
    limit: Option<u32>,
}

/// Arguments of `relay_subscribe`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct SubscribeParams {
    /// A topic pattern: `build.linux`, `build.*` (one level), `build.>` (any depth).
    pattern: String,
}

/// Arguments of `relay_spawn`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct SpawnParams {
    /// The worker's command and its arguments, e.g. ["claude"] or ["codex", "--model", "o4"].
    command: Vec<String>,
    /// Its task: its first message, from you (its answer comes back to you as a reply).
    #[serde(default)]
    task: Option<String>,
    /// Its name (default: yours with -w1, -w2...).
    #[serde(default)]
    name: Option<String>,
    /// Give it its own git worktree and branch relay/NAME.
    #[serde(default)]
    worktree: bool,
    /// Be told each time it becomes idle after a turn.
    #[serde(default)]
    notify_idle: bool,
}

/// Arguments of `relay_release`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct ReleaseParams {
    /// The worker's name (one you spawned).
    name: String,
    /// Stop it at once, busy or not (default: once it is idle).
    #[serde(default)]
    now: bool,
}

/// Arguments of `relay_claim`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct ClaimParams {
    /// Files or directories (a directory covers what it holds), relative to your directory or
    /// absolute, inside the project. With release and none: all of your claims.
    #[serde(default)]
    paths: Vec<String>,
    /// How long: "90s", "30m", "2h" (default 30m, at most 24h). Claiming again renews.
    #[serde(default, rename = "for")]
    for_: Option<String>,
    /// Release the paths instead of claiming them.
    #[serde(default)]
    release: bool,
    /// List every claim (paths are then ignored).
    #[serde(default)]
    list: bool,
}

/// Arguments of `relay_read`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct ReadParams {
    /// The message's id, or its first 8 or more characters (as shown in brackets).
    id: String,
}

/// Arguments of `relay_search`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct SearchParams {
    /// Text the message's body contains.
    #[serde(default)]
    text: Option<String>,
    /// Only messages from this agent.
    #[serde(default)]
    from: Option<String>,
    /// Only messages to this agent (broadcasts included).
    #[serde(default)]
    to: Option<String>,
    /// At most this many messages, newest first (default 20).
    #[serde(default)]
    limit: Option<u32>,
}

/// A message the model was shown, as an answer to it names it: (id, thread).
type Answered = (String, Option<String>);

/// The MCP server of one agent.
#[derive(Clone)]
struct RelayMcp {
    socket: PathBuf,
    name: String,
    /// The wrapper's door (`relay_wrap` `door.rs`): under a wrapper that holds the name, sends
    /// go through the wrapper's connection.
    door: PathBuf,
    /// The door key, when this server runs in a wrapped agent's session: every request to the
    /// door carries it.
    key: Option<String>,
    /// The agent's own connection, when this server holds the name (only it may send as the
    /// agent), with the deliveries it holds.
    agent: Option<Arc<Mailbox>>,
    /// Per sender, the latest of its messages the model was shown (id, thread): a message to
    /// that sender is an answer to it.
    replying_to: Arc<Mutex<HashMap<String, Answered>>>,
    tool_router: ToolRouter<Self>,
}

fn text(t: impl Into<String>) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(t)])
}

fn failed(t: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(t)])
}

/// One message for the model: a header line, then the body as it was sent (control
/// characters shown escaped, lines and indentation kept, a line that could pass for a header
/// quoted: `relay_protocol::text::quote_headers`).
fn show(m: &MessageRecord) -> String {
    let mut head = format!(
        "[{}] from {} to {}",
        for_terminal(&m.id),
        for_terminal(&m.from),
        for_terminal(&m.to)
    );
    if let Some(t) = &m.topic {
        head.push_str(&format!(" (topic {})", for_terminal(t)));
    }
    if let Some(t) = &m.thread {
        head.push_str(&format!(" (thread {})", for_terminal(t)));
    }
    if m.kind != Kind::Message {
        head.push_str(&format!(" ({})", m.kind.as_str()));
    }
    // No line of the body may start like a header (issue 23.4).
    format!(
        "{head}:\n{}",
        for_terminal(&relay_protocol::text::quote_headers(&m.body))
    )
}

fn show_all(messages: &[MessageRecord]) -> String {
    messages.iter().map(show).collect::<Vec<_>>().join("\n\n")
}

impl RelayMcp {
    /// A short-lived client connection for one call: a restarted relay is simply used by the
    /// next call.
    async fn client(&self) -> Result<Client, ClientError> {
        Client::connect(ClientConfig::tool(self.socket.clone(), self.name.clone())).await
    }

    /// Sends through the wrapper that holds the name, with the session's door key.
    async fn door_send(&self, to: &str, key: &str, msg: Outgoing) -> CallToolResult {
        let request = serde_json::json!({
            "key": key,
            "to": to,
            "body": msg.payload.body,
            "topic": msg.topic,
            "thread": msg.payload.thread,
            "in_reply_to": msg.payload.in_reply_to,
            "urgent": msg.payload.urgent,
        });
        let v = match door_exchange(&self.door, &request).await {
            Ok(v) => v,
            Err(e) => return failed(format!("not sent: cannot reach the wrapper's door: {e}")),
        };
        if let Some(id) = v["id"].as_str() {
            let n = v["recipients"]
                .as_u64()
                .map(|n| format!(", {n} recipient{}", if n == 1 { "" } else { "s" }))
                .unwrap_or_default();
            return text(format!(
                "ACK [{}] to {}: {}{n}",
                for_terminal(id),
                for_terminal(to),
                for_terminal(v["status"].as_str().unwrap_or("accepted"))
            ));
        }
        if let Some(code) = v["nack"].as_str() {
            return failed(format!(
                "NACK {code}: not sent: {}",
                for_terminal(v["reason"].as_str().unwrap_or(""))
            ));
        }
        failed(format!(
            "not sent: {}",
            for_terminal(v["error"].as_str().unwrap_or("no answer from the wrapper"))
        ))
    }

    /// Under a wrapper (it holds the name and has a door): tells it which messages the model
    /// was just shown in full, before the tool's result goes back. With `--delivery notice`
    /// the wrapper typed only a notice for them, and this is when they count as verified.
    /// A wrapper that cannot be told is logged: the messages stay injected, the model has them.
    async fn tell_shown(&self, ids: Vec<String>) {
        let Some(key) = &self.key else {
            return;
        };
        if ids.is_empty() {
            return;
        }
        let request = serde_json::json!({ "read": ids, "key": key });
        match door_exchange(&self.door, &request).await {
            Ok(answer) => {
                tracing::debug!(%answer, "the wrapper was told what the model was shown")
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot tell the wrapper which messages the model was shown; they stay recorded as injected")
            }
        }
    }

    async fn query(&self, req: QueryRequest) -> Result<QueryResult, ClientError> {
        if let Some(mailbox) = &self.agent {
            return mailbox.client().query(req).await;
        }
        let client = self.client().await?;
        let res = client.query(req).await;
        client.close().await;
        res
    }

    async fn history(&self, filter: HistoryFilter) -> Result<Vec<MessageRecord>, ClientError> {
        match self.query(QueryRequest::History(filter)).await? {
            QueryResult::History { messages } => Ok(messages),
            other => Err(ClientError::Protocol(format!(
                "unexpected answer to history: {other:?}"
            ))),
        }
    }
    /// What a message to `to` answers, as (id, thread): the message `reply_to` names, or else
    /// the latest message from `to` this server showed the model. The thread is the answered
    /// message's own thread, or the answered message itself (so the conversation has one).
    async fn answers(
        &self,
        to: &str,
        reply_to: Option<&str>,
    ) -> Result<Option<(String, Option<String>)>, String> {
        let threaded = |id: String, thread: Option<String>| {
            let thread = thread.unwrap_or_else(|| id.clone());
            Some((id, Some(thread)))
        };
        if let Some(wanted) = reply_to {
            return match self
                .query(QueryRequest::Read {
                    id: wanted.to_owned(),
                    from: None,
                })
                .await
            {
                Ok(QueryResult::Read { message }) => Ok(threaded(message.id, message.thread)),
                Ok(QueryResult::Error { message, .. }) => Err(format!(
                    "reply_to {}: {}",
                    for_terminal(wanted),
                    for_terminal(&message)
                )),
                Ok(other) => Err(format!("reply_to: unexpected answer {other:?}")),
                Err(e) => Err(format!("reply_to {}: {e}", for_terminal(wanted))),
            };
        }
        let shown = self
            .replying_to
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Ok(shown
            .get(to)
            .and_then(|(id, thread)| threaded(id.clone(), thread.clone())))
    }

    /// The latest `limit` messages to this agent, oldest first, shown or not (nothing is
    /// marked).
    async fn latest(&self, limit: usize) -> Result<Vec<MessageRecord>, ClientError> {
        let filter = HistoryFilter {
            to: Some(self.name.clone()),
            limit: Some(u32::try_from(limit).unwrap_or(1000)),
            ..HistoryFilter::default()
        };
        let mut messages: Vec<MessageRecord> = self
            .history(filter)
            .await?
            .into_iter()
            .filter(|m| m.from != self.name)
            .collect();
        messages.reverse();
        Ok(messages)
    }

    /// Runs `agent-relay ARGS` as this agent (through its wrapper's door: the relay takes
    /// this agent as the asker), `stdin` on its standard input: its stdout, or its error.
    /// Only under a wrapper: the command starts the worker's own wrapper, and asks as this
    /// agent through this agent's.
    async fn team_command(&self, args: &[String], stdin: Option<&str>) -> Result<String, String> {
        let Some(key) = &self.key else {
            return Err(format!(
                "{} is not running under agent-relay's wrapper, and only a wrapped agent spawns \
                 and releases through this tool (start it with `agent-relay -n {} <cli>`), or \
                 run `agent-relay spawn` in a terminal",
                for_terminal(&self.name),
                for_terminal(&self.name)
            ));
        };
        let exe = std::env::current_exe().map_err(|e| format!("cannot find agent-relay: {e}"))?;
        let mut cmd = std::process::Command::new(exe);
        cmd.args(args)
            .env("AGENT_RELAY_NAME", &self.name)
            .env(relay_wrap::DOOR_KEY_ENV, key)
            .env("AGENT_RELAY_SOCKET", &self.socket)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        // The data directory is the door's: `<data>/team/<name>/door.sock`.
        if let Some(data) = self
            .door
            .parent()
            .and_then(std::path::Path::parent)
            .and_then(std::path::Path::parent)
        {
            cmd.env("AGENT_RELAY_DATA_DIR", data);
        }
        let input = stdin.map(str::to_owned);
        // It waits for the worker to start (seconds): off the server's threads.
        let out = tokio::task::spawn_blocking(move || {
            let mut child = cmd.spawn()?;
            if let Some(mut pipe) = child.stdin.take() {
                use std::io::Write;
                if let Some(t) = input {
                    pipe.write_all(t.as_bytes())?;
                }
            }
            child.wait_with_output()
        })
        .await
        .map_err(|e| format!("agent-relay did not finish: {e}"))?
        .map_err(|e| format!("cannot run agent-relay: {e}"))?;
        if out.status.success() {
            return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        let err = String::from_utf8_lossy(&out.stderr);
        let why = err
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("agent-relay: "))
            .unwrap_or(err.trim());
        Err(for_terminal(why))
    }

    /// Under a wrapper (which holds the deliveries): the oldest `limit` messages it holds for
    /// the agent and has not typed, handed over by the wrapper itself through its door (it
    /// records each as shown by this tool, verified, and never types it after), with how many
    /// more wait there. The store is the one record of what was handed over (DESIGN §12): no
    /// position is kept here, and a message the wrapper typed is never shown again.
    async fn page_from_wrapper(
        &self,
        key: &str,
        limit: usize,
    ) -> Result<(Vec<MessageRecord>, usize), ClientError> {
        let request = serde_json::json!({ "inbox": limit, "key": key });
        let answer = door_exchange(&self.door, &request)
            .await
            .map_err(|e| ClientError::Protocol(format!("cannot reach the wrapper's door: {e}")))?;
        if let Some(e) = answer["error"].as_str() {
            return Err(ClientError::Protocol(format!(
                "the wrapper: {}",
                for_terminal(e)
            )));
        }
        let messages: Vec<MessageRecord> = serde_json::from_value(answer["messages"].clone())
            .map_err(|e| ClientError::Protocol(format!("the wrapper's answer: {e}")))?;
        let more = answer["more"]
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(0);
        Ok((messages, more))
    }
}

#[tool_router(router = tool_router)]
impl RelayMcp {
    /// Sends a message through the relay.
    #[tool(
        name = "relay_send",
        description = "Send a message to another agent (or \"*\" for all) through agent-relay. The body arrives exactly as written, lines and indentation kept. Returns the relay's receipt (accepted, queued for an offline agent, duplicate) or why it refused."
    )]
    async fn relay_send(&self, Parameters(p): Parameters<SendParams>) -> CallToolResult {
        if p.body.trim().is_empty() {
            return failed("not sent: the body is empty");
        }
        let (in_reply_to, thread) = match self.answers(&p.to, p.reply_to.as_deref()).await {
            Ok(Some((id, thread))) => (Some(id), p.thread.or(thread)),
            Ok(None) => (None, p.thread),
            Err(e) => return failed(format!("not sent: {e}")),
        };
        let msg = Outgoing {
            id: None,
            to: Some(p.to.clone()),
            topic: p.topic,
            payload: relay_protocol::Send {
                origin: None,
                kind: Kind::Message,
                body: p.body,
                data: None,
                thread,
                in_reply_to,
                budget: None,
                urgent: p.urgent,
            },
        };
        let res = match (&self.key, &self.agent) {
            (Some(key), _) => return self.door_send(&p.to, key, msg).await,
            (None, Some(mailbox)) => mailbox.client().send(msg).await,
            (None, None) => match self.client().await {
                Ok(client) => {
                    let res = client.send(msg).await;
                    client.close().await;
                    res
                }
                Err(e) => Err(e),
            },
        };
        match res {
            Ok(r) => {
                let what = match r.status {
                    AckStatus::Accepted => "accepted",
                    AckStatus::Queued => {
                        "queued (the recipient is offline; it gets it when it connects)"
                    }
                    AckStatus::Duplicate => "duplicate (sent before; nothing new was stored)",
                };
                let n = r
                    .recipients
                    .map(|n| format!(", {n} recipient{}", if n == 1 { "" } else { "s" }))
                    .unwrap_or_default();
                text(format!(
                    "ACK [{}] to {}: {what}{n}",
                    for_terminal(&r.id),
                    for_terminal(&p.to)
                ))
            }
            Err(ClientError::Rejected { code, reason }) => failed(format!(
                "NACK {}: not sent: {}",
                serde_json::to_value(code)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default(),
                for_terminal(&reason)
            )),
            Err(e) => failed(format!("not sent: {e}")),
        }
    }

    /// Spawns a worker agent with a task (`agent-relay spawn`, asked as this agent).
    #[tool(
        name = "relay_spawn",
        description = "Start a worker agent (e.g. command [\"claude\"]) detached in its own terminal, with `task` as its first message from you: its answers reach you as replies. Returns its name. You are recorded as its parent; the relay refuses past its limits (live workers, depth) or an access rule, and says which. Release it with relay_release when done."
    )]
    async fn relay_spawn(&self, Parameters(p): Parameters<SpawnParams>) -> CallToolResult {
        if p.command.is_empty() {
            return failed("not spawned: `command` is empty (e.g. [\"claude\"])");
        }
        let mut args: Vec<String> = vec!["spawn".into(), "--json".into()];
        if let Some(n) = &p.name {
            args.extend(["-n".into(), n.clone()]);
        }
        if p.worktree {
            args.push("--worktree".into());
        }
        if p.notify_idle {
            args.extend(["--notify".into(), "idle".into()]);
        }
        if p.task.is_some() {
            // On stdin: a task is never in any argv.
            args.extend(["--task-file".into(), "-".into()]);
        }
        args.push("--".into());
        args.extend(p.command.iter().cloned());
        match self.team_command(&args, p.task.as_deref()).await {
            Ok(out) => {
                let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
                text(format!(
                    "Spawned {} (your worker; its answers reach you as replies). Release it with relay_release when done.",
                    for_terminal(v["name"].as_str().unwrap_or("?"))
                ))
            }
            Err(e) => failed(format!("not spawned: {e}")),
        }
    }

    /// Releases a worker this agent spawned (`agent-relay release`, asked as this agent).
    #[tool(
        name = "relay_release",
        description = "Stop a worker you spawned, once it is idle (now=true: at once). Its messages stay stored. You may release only your own workers."
    )]
    async fn relay_release(&self, Parameters(p): Parameters<ReleaseParams>) -> CallToolResult {
        let mut args: Vec<String> = vec!["release".into(), p.name.clone()];
        if p.now {
            args.push("--now".into());
        } else {
            args.extend(["--timeout".into(), "600".into()]);
        }
        match self.team_command(&args, None).await {
            Ok(out) => text(for_terminal(out.trim())),
            Err(e) => failed(format!("not released: {e}")),
        }
    }

    /// Subscribes this agent to a topic pattern (kept in the relay's store).
    #[tool(
        name = "relay_subscribe",
        description = "Subscribe to a topic pattern (build.linux, build.* for one level, build.> for any depth): every message sent to a matching topic (relay_send with `topic` and to \"*\") reaches you, once; kept across restarts."
    )]
    async fn relay_subscribe(&self, Parameters(p): Parameters<SubscribeParams>) -> CallToolResult {
        if let Err(e) = relay_protocol::validate_topic_pattern(&p.pattern) {
            return failed(format!(
                "{:?} is not a topic pattern: {e}",
                for_terminal(&p.pattern)
            ));
        }
        let Some(mailbox) = &self.agent else {
            // A wrapped agent's connection is its wrapper's: it subscribes through its door.
            let Some(key) = &self.key else {
                return failed("not subscribed: this server holds no agent's connection");
            };
            let request = serde_json::json!({"subscribe": p.pattern, "key": key});
            return match door_exchange(&self.door, &request).await {
                Ok(v) if v.get("subscribed").is_some() => text(format!(
                    "Subscribed to {}: messages to a matching topic reach you once.",
                    for_terminal(&p.pattern)
                )),
                Ok(v) => failed(format!(
                    "not subscribed: {}",
                    for_terminal(v["error"].as_str().unwrap_or("no answer from the wrapper"))
                )),
                Err(e) => failed(format!(
                    "not subscribed: cannot reach the wrapper's door: {e}"
                )),
            };
        };
        match mailbox.client().subscribe(p.pattern.clone()).await {
            Ok(()) => text(format!(
                "Subscribed to {}: messages to a matching topic reach you once.",
                for_terminal(&p.pattern)
            )),
            Err(e) => failed(format!("the relay refused the subscription: {e}")),
        }
    }

    /// The messages sent to this agent that it has not seen, oldest first, a page at a time.
    #[tool(
        name = "relay_inbox",
        description = "Show the relay messages sent to you (to your name or to everyone) that you have not been shown yet, oldest first, each with its id, sender, thread and full body; at most `limit` (default 20) at a time: when it says more are waiting, call it again. Once shown here a message counts as read. all=true shows the latest ones whether shown before or not."
    )]
    async fn relay_inbox(&self, Parameters(p): Parameters<InboxParams>) -> CallToolResult {
        let limit = usize::try_from(p.limit.unwrap_or(20).clamp(1, 1000)).unwrap_or(20);
        let taken = if p.all {
            self.latest(limit).await.map(|m| (m, 0))
        } else if let Some(mailbox) = &self.agent {
            mailbox
                .take(limit, DOOR)
                .await
                .map(|(taken, more)| (taken.iter().map(Delivered::record).collect(), more))
        } else if let Some(key) = &self.key {
            self.page_from_wrapper(key, limit).await
        } else {
            Err(ClientError::Protocol(
                "this server neither holds the agent's name nor has its wrapper's door key".into(),
            ))
        };
        let (shown, more) = match taken {
            Ok(t) => t,
            Err(e) => return failed(format!("cannot read the inbox: {e}")),
        };
        {
            let mut replying = self
                .replying_to
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            for m in &shown {
                replying.insert(m.from.clone(), (m.id.clone(), m.thread.clone()));
            }
        }
        let more = if more > 0 {
            format!("\n\n({more} more waiting: call relay_inbox again for the next ones.)")
        } else {
            String::new()
        };
        if shown.is_empty() {
            return text(format!("No new relay messages.{more}"));
        }
        text(format!(
            "{} relay message{}:\n\n{}{more}",
            shown.len(),
            if shown.len() == 1 { "" } else { "s" },
            show_all(&shown)
        ))
    }

    /// One message in full.
    #[tool(
        name = "relay_read",
        description = "Show one relay message in full, by its id or the first 8 or more characters of it."
    )]
    async fn relay_read(&self, Parameters(p): Parameters<ReadParams>) -> CallToolResult {
        match self
            .query(QueryRequest::Read {
                id: p.id,
                from: None,
            })
            .await
        {
            Ok(QueryResult::Read { message }) => {
                if message.to == self.name || message.to == "*" {
                    self.tell_shown(vec![message.id.clone()]).await;
                    if let Some(mailbox) = &self.agent {
                        mailbox
                            .shown_elsewhere(&message.from, &message.id, DOOR)
                            .await;
                    }
                }
                text(show(&message))
            }
            Ok(other) => failed(format!("unexpected answer: {other:?}")),
            Err(e) => failed(e.to_string()),
        }
    }

    /// The agents the relay knows.
    #[tool(
        name = "relay_agents",
        description = "List the agents the relay knows: name, what each is doing (idle, busy since when, blocked and why, offline), its current thread, last activity, CLI and messages waiting for it."
    )]
    async fn relay_agents(&self) -> CallToolResult {
        match self.query(QueryRequest::Agents).await {
            Ok(QueryResult::Agents { agents }) => {
                let now = relay_protocol::now_ms();
                let ago = |ms: u64| format!("{}s ago", now.saturating_sub(ms) / 1000);
                let lines: Vec<String> = agents
                    .iter()
                    .map(|a| {
                        let mut state = a.state.as_str().to_owned();
                        if let (Some(since), true) = (a.since, a.online) {
                            state.push_str(&format!(" since {}", ago(since)));
                        }
                        if let Some(why) = &a.why {
                            state.push_str(&format!(" ({})", for_terminal(why)));
                        }
                        let thread = a
                            .thread
                            .as_deref()
                            .map(|t| format!(", thread {}", for_terminal(t)))
                            .unwrap_or_default();
                        let active = a
                            .last_activity
                            .map(|t| format!(", last active {}", ago(t)))
                            .unwrap_or_default();
                        format!(
                            "{}{} — {}{}{}{}, {} waiting",
                            for_terminal(&a.name),
                            if a.name == self.name { " (you)" } else { "" },
                            state,
                            a.cli
                                .as_deref()
                                .map(|c| format!(", {}", for_terminal(c)))
                                .unwrap_or_default(),
                            thread,
                            active,
                            a.pending
                        )
                    })
                    .collect();
                if lines.is_empty() {
                    text("No agents yet.")
                } else {
                    text(lines.join("\n"))
                }
            }
            Ok(other) => failed(format!("unexpected answer: {other:?}")),
            Err(e) => failed(e.to_string()),
        }
    }

    /// Claims paths for this agent, releases them, or lists every claim (issue 25.7).
    #[tool(
        name = "relay_claim",
        description = "Claim files or directories you are about to change, for a while (for: \"30m\" by default): another agent that claims or edits them is told, and so are you, once. release=true gives them back (none: all yours); list=true shows every claim. Claims end when they expire or you stop."
    )]
    async fn relay_claim(&self, Parameters(p): Parameters<ClaimParams>) -> CallToolResult {
        let req = if p.list {
            QueryRequest::Claims
        } else {
            let cwd = match std::env::current_dir() {
                Ok(c) => c,
                Err(e) => return failed(format!("not claimed: no working directory ({e})")),
            };
            let root = relay_client::paths::project_root(&cwd);
            let paths = match crate::cmd::claim::normalize(&root, &cwd, &p.paths) {
                Ok(ps) => ps,
                Err(e) => return failed(e),
            };
            if p.release {
                QueryRequest::Unclaim { paths }
            } else {
                if paths.is_empty() {
                    return failed("no path given: name the files or directories to claim");
                }
                let for_ms = match p.for_.as_deref().map(crate::time::parse_duration_ms) {
                    None => None,
                    Some(Some(ms)) => Some(ms),
                    Some(None) => return failed("\"for\" is not a duration: give 90s, 30m or 2h"),
                };
                QueryRequest::Claim { paths, for_ms }
            }
        };
        // Under a wrapper the claim goes on its connection (the agent's one identity).
        let answer = match &self.key {
            Some(key) => {
                let request = serde_json::json!({"query": req, "key": key});
                crate::cmd::hooks::ask_door(&self.door, &request)
                    .await
                    .and_then(|v| Ok(serde_json::from_value::<QueryResult>(v)?))
                    .map_err(|e| format!("{e:#}"))
            }
            None => self.query(req).await.map_err(|e| e.to_string()),
        };
        let lines: Vec<String> = match answer {
            Err(e) => return failed(format!("not done: {}", for_terminal(&e))),
            Ok(QueryResult::Claim { claims, collisions }) => claims
                .iter()
                .map(|c| {
                    format!(
                        "claimed {} until {}",
                        for_terminal(&c.path),
                        crate::time::format_utc(c.until)
                    )
                })
                .chain(collisions.iter().map(crate::cmd::claim::collision_line))
                .collect(),
            Ok(QueryResult::Unclaim { released }) if released.is_empty() => {
                vec!["Nothing to release: no such claim.".into()]
            }
            Ok(QueryResult::Unclaim { released }) => released
                .iter()
                .map(|p| format!("released {}", for_terminal(p)))
                .collect(),
            Ok(QueryResult::Claims { claims }) if claims.is_empty() => vec!["No claims.".into()],
            Ok(QueryResult::Claims { claims }) => claims
                .iter()
                .map(|c| {
                    format!(
                        "{} claimed by {} until {}",
                        for_terminal(&c.path),
                        for_terminal(&c.agent),
                        crate::time::format_utc(c.until)
                    )
                })
                .collect(),
            Ok(other) => return failed(format!("unexpected answer: {other:?}")),
        };
        text(lines.join("\n"))
    }

    /// Searches the history.
    #[tool(
        name = "relay_search",
        description = "Search the relay's stored messages by text in the body, sender or recipient; newest first."
    )]
    async fn relay_search(&self, Parameters(p): Parameters<SearchParams>) -> CallToolResult {
        let filter = HistoryFilter {
            text: p.text,
            from: p.from,
            to: p.to,
            limit: Some(p.limit.unwrap_or(20).clamp(1, 1000)),
            ..HistoryFilter::default()
        };
        match self.history(filter).await {
            Ok(m) if m.is_empty() => text("No messages match."),
            Ok(m) => text(show_all(&m)),
            Err(e) => failed(e.to_string()),
        }
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for RelayMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(
                "agent-relay",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(format!(
                "You are {} on the relay. {INSTRUCTIONS}",
                self.name
            ))
    }
}
