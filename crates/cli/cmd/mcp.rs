//! `agent-relay mcp`: the relay as an MCP server over stdio, so that an agent sends and reads
//! relay messages through tool calls (exact text, lines and all) instead of printed directives.
//!
//! It is an ordinary client of the daemon: every send goes through the daemon's admission
//! (names, ids, budgets, rate limits, access rules, traces, exactly-once), and the tool result
//! is the daemon's ACK or NACK. At start it also tries to connect as the agent itself, so that
//! an agent with no wrapper is a routable, online name whose messages wait for it; when a
//! wrapper already holds the name (the same agent, wrapped), it joins that identity instead:
//! it sends as that name on a client connection and reads the inbox from the store, without a
//! second agent connection (`docs/DESIGN` §11, one agent, several doors).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use relay_client::paths::Paths;
use relay_client::{Client, ClientConfig, ClientError, Event, Outgoing};
use relay_protocol::query::{HistoryFilter, MessageRecord, QueryRequest, QueryResult};
use relay_protocol::text::for_terminal;
use relay_protocol::{AckStatus, ErrorCode, Kind};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::{ServerHandler, ServiceExt, schemars, tool, tool_handler, tool_router};
use serde::Deserialize;

/// Arguments of `agent-relay mcp`.
#[derive(Debug, clap::Args)]
pub(crate) struct McpArgs {
    /// The agent's relay name: messages sent through this server are from it, and its inbox
    /// is read (default: $AGENT_RELAY_NAME, which a wrapper sets for the agent it runs).
    #[arg(short = 'n', long, env = "AGENT_RELAY_NAME", value_name = "NAME")]
    pub(crate) name: String,
}

/// What the server says about itself to the model at `initialize`.
const INSTRUCTIONS: &str = "Tools of agent-relay, which connects you with other AI agents \
working in other terminals. relay_send sends a message (the result is the relay's receipt or \
its refusal); relay_inbox lists messages sent to you that you have not seen; relay_read shows \
one message in full; relay_agents lists the agents; relay_search searches the history.";

/// Runs the MCP server on stdin/stdout until the client closes it.
pub(crate) fn run(paths: &Paths, args: &McpArgs) -> anyhow::Result<()> {
    relay_protocol::validate_agent_name(&args.name)
        .map_err(|e| crate::exit::usage(format!("--name {:?}: {e}", args.name)))?;
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
        .join(&args.name)
        .join(relay_wrap::DOOR_SOCKET);
    rt.block_on(serve(paths.socket.clone(), args.name.clone(), door))
}

async fn serve(socket: PathBuf, name: String, door: PathBuf) -> anyhow::Result<()> {
    // A wrapper answering on its door holds the name: join it at once (asking the relay for
    // the name would wait for it to come free, as for a restarting agent, before joining).
    let wrapped = tokio::net::UnixStream::connect(&door).await.is_ok();
    let held = if wrapped {
        tracing::info!(agent = %name, "a wrapper holds the name (its door answers): joining it");
        None
    } else {
        hold_name(&socket, &name).await?
    };
    let (agent, reader) = match held {
        Some((client, reader)) => (Some(client), Some(reader)),
        None => (None, None),
    };
    let server = RelayMcp {
        socket,
        name,
        door,
        agent,
        seen_pos: Arc::new(AtomicI64::new(0)),
        tool_router: RelayMcp::tool_router(),
    };
    let running = server.serve(rmcp::transport::stdio()).await?;
    let quit = running.waiting().await;
    if let Some(reader) = reader {
        reader.abort();
    }
    quit?;
    Ok(())
}

/// Connects as the agent `name` when no one holds the name, so that it is a known, online
/// agent and its messages are stored for it; deliveries are acknowledged as they arrive (the
/// model reads them from the store with `relay_inbox`). `None` when a wrapper holds the name.
async fn hold_name(
    socket: &std::path::Path,
    name: &str,
) -> anyhow::Result<Option<(Arc<Client>, tokio::task::JoinHandle<()>)>> {
    let cfg = ClientConfig {
        cli: Some("mcp".to_owned()),
        ..ClientConfig::agent(socket.to_path_buf(), name)
    };
    let mut client = match Client::connect(cfg).await {
        Ok(c) => c,
        Err(ClientError::Refused {
            code: ErrorCode::NameInUse,
            ..
        }) => {
            tracing::info!(agent = name, "the name is held (a wrapper): joining it");
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    let mut events = client.take_events();
    let client = Arc::new(client);
    let acker = Arc::clone(&client);
    let reader = tokio::spawn(async move {
        while let Some(event) = events.next().await {
            if let Event::Message(msg) = event {
                // Stored, and read from the store by relay_inbox: the delivery is done.
                if let Err(e) = acker.ack(&msg, None).await {
                    tracing::warn!(error = %e, id = %msg.id, "cannot acknowledge a delivery; the relay will deliver it again");
                }
            }
        }
    });
    Ok(Some((client, reader)))
}

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
}

/// Arguments of `relay_inbox`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct InboxParams {
    /// Also show messages already shown by an earlier relay_inbox call.
    #[serde(default)]
    all: bool,
    /// At most this many messages (default 20).
    #[serde(default)]
    limit: Option<u32>,
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

/// The MCP server of one agent.
#[derive(Clone)]
struct RelayMcp {
    socket: PathBuf,
    name: String,
    /// The wrapper's door (`relay_wrap` `door.rs`): under a wrapper that holds the name, sends
    /// go through the wrapper's connection.
    door: PathBuf,
    /// The agent's own connection, when this server holds the name: only it may send as the
    /// agent.
    agent: Option<Arc<Client>>,
    /// The newest store position `relay_inbox` has shown.
    seen_pos: Arc<AtomicI64>,
    tool_router: ToolRouter<Self>,
}

fn text(t: impl Into<String>) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(t)])
}

fn failed(t: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(t)])
}

/// One message for the model: a header line, then the body as it was sent (control
/// characters shown escaped, lines and indentation kept).
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
    format!("{head}:\n{}", for_terminal(&m.body))
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

    /// Sends through the wrapper that holds the name: one JSON line each way.
    async fn door_send(&self, to: &str, msg: Outgoing) -> CallToolResult {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        let request = serde_json::json!({
            "to": to,
            "body": msg.payload.body,
            "topic": msg.topic,
            "thread": msg.payload.thread,
            "urgent": msg.payload.urgent,
        });
        let exchange = async {
            let stream = tokio::net::UnixStream::connect(&self.door).await?;
            let (read, mut write) = stream.into_split();
            write.write_all(format!("{request}\n").as_bytes()).await?;
            let mut line = String::new();
            tokio::io::BufReader::new(read).read_line(&mut line).await?;
            std::io::Result::Ok(line)
        };
        let line = match exchange.await {
            Ok(l) => l,
            Err(e) => return failed(format!("not sent: cannot reach the wrapper's door: {e}")),
        };
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
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
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        if ids.is_empty() || self.agent.is_some() || !self.door.exists() {
            return;
        }
        let request = serde_json::json!({ "read": ids });
        let exchange = async {
            let stream = tokio::net::UnixStream::connect(&self.door).await?;
            let (read, mut write) = stream.into_split();
            write.write_all(format!("{request}\n").as_bytes()).await?;
            let mut line = String::new();
            tokio::io::BufReader::new(read).read_line(&mut line).await?;
            std::io::Result::Ok(line)
        };
        match exchange.await {
            Ok(line) => {
                tracing::debug!(answer = %line.trim_end(), "the wrapper was told what the model was shown")
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot tell the wrapper which messages the model was shown; they stay recorded as injected")
            }
        }
    }

    async fn query(&self, req: QueryRequest) -> Result<QueryResult, ClientError> {
        if let Some(agent) = &self.agent {
            return agent.query(req).await;
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
        let msg = Outgoing {
            id: None,
            to: Some(p.to.clone()),
            topic: p.topic,
            payload: relay_protocol::Send {
                kind: Kind::Message,
                body: p.body,
                data: None,
                thread: p.thread,
                in_reply_to: None,
                budget: None,
                urgent: p.urgent,
            },
        };
        let res = match &self.agent {
            Some(agent) => agent.send(msg).await,
            None if self.door.exists() => return self.door_send(&p.to, msg).await,
            None => match self.client().await {
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

    /// The messages sent to this agent that it has not seen.
    #[tool(
        name = "relay_inbox",
        description = "List the relay messages sent to you (to your name or to everyone) that an earlier relay_inbox call did not show, oldest first, each with its id, sender, thread and full body. all=true shows the latest ones even if already shown."
    )]
    async fn relay_inbox(&self, Parameters(p): Parameters<InboxParams>) -> CallToolResult {
        let filter = HistoryFilter {
            to: Some(self.name.clone()),
            limit: Some(p.limit.unwrap_or(20).clamp(1, 1000)),
            ..HistoryFilter::default()
        };
        let messages = match self.history(filter).await {
            Ok(m) => m,
            Err(e) => return failed(format!("cannot read the inbox: {e}")),
        };
        let seen = self.seen_pos.load(Ordering::Relaxed);
        let mut new: Vec<MessageRecord> = messages
            .into_iter()
            .filter(|m| m.from != self.name && (p.all || m.pos > seen))
            .collect();
        new.reverse();
        if let Some(last) = new.iter().map(|m| m.pos).max() {
            self.seen_pos.fetch_max(last, Ordering::Relaxed);
        }
        if new.is_empty() {
            return text("No new relay messages.");
        }
        self.tell_shown(new.iter().map(|m| m.id.clone()).collect())
            .await;
        text(format!(
            "{} relay message{}:\n\n{}",
            new.len(),
            if new.len() == 1 { "" } else { "s" },
            show_all(&new)
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
        description = "List the agents the relay knows: name, whether online, their CLI, messages waiting for them."
    )]
    async fn relay_agents(&self) -> CallToolResult {
        match self.query(QueryRequest::Agents).await {
            Ok(QueryResult::Agents { agents }) => {
                let lines: Vec<String> = agents
                    .iter()
                    .map(|a| {
                        format!(
                            "{}{} — {}{}, {} waiting",
                            for_terminal(&a.name),
                            if a.name == self.name { " (you)" } else { "" },
                            if a.online { "online" } else { "offline" },
                            a.cli
                                .as_deref()
                                .map(|c| format!(", {}", for_terminal(c)))
                                .unwrap_or_default(),
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
