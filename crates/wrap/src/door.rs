//! The wrapper's door for the agent's own tools: `agent-relay mcp --name NAME`, run by the
//! wrapped agent NAME (Claude Code starts it), sends through the wrapper's connection, so one
//! agent is one identity on the relay whatever door it uses (the relay refuses a second
//! connection speaking as a connected agent).
//!
//! A Unix socket `door.sock` in the agent's private team directory (0700, created by the CLI),
//! one request per connection: a JSON line `{"to", "body", "topic"?, "thread"?, "in_reply_to"?,
//! "urgent"?}`, answered by one JSON line, the receipt `{"id", "status", "recipients"?}` or the refusal
//! `{"nack", "reason"}` or `{"error"}`; or `{"read": [ids]}`, the messages the agent's tool
//! just showed the model in full (notice delivery verifies them, see `decide/core/deliver.rs`), answered
//! `{"verified": N}`.
//!
//! Claude Code's Stop hook (`agent-relay hooks stop`, run by the wrapped Claude Code at the end
//! of each turn) comes in by the same door: `{"hook": "stop", "active": bool}` (`active`:
//! Claude Code's `stop_hook_active`, the turn was one a Stop hook continued), answered by
//! `{"messages": [TEXT, ...]}`, the messages that waited to be typed, handed to the model
//! instead (see `Core::hook_stop`). Its UserPromptSubmit hook (`agent-relay hooks prompt`, run
//! when a prompt is submitted) sends `{"hook": "prompt"}`, answered the same way: the messages
//! go in with the person's prompt, as that turn's context (see `Core::hook_prompt`).
//! `{"hello": true}` is answered `{"agent": NAME}`: how the MCP server checks, at its start,
//! that it belongs to this agent. `{"query": QUERY}` asks the relay on the agent's own
//! connection, as the agent, the questions that speak for it (`spawn` and `release`, issue 25:
//! `agent-relay spawn`/`release` run by the agent, its MCP server's `relay_spawn`/`relay_release`;
//! `claim`, `unclaim`, `claims`, `edited`: the MCP server's `relay_claim`, the PostToolUse hook),
//! answered `{"result": RESULT}` or `{"error": TEXT, "code"?: CODE}`. `{"subscribe": PATTERN}`
//! subscribes the agent's connection to a topic pattern (the MCP server's `relay_subscribe`;
//! kept for its reconnections and in the relay's store), answered `{"subscribed": PATTERN}` or
//! `{"error"}`.
//!
//! Every request carries `"key"`, the door key the wrapper put in its agent's environment
//! (`AGENT_RELAY_SESSION`, see [`new_key`]): only a process of the agent's own session (its
//! MCP server, its hooks) has it. A request without it, or with another, is refused with
//! `{"error": "refused: ..."}` and logged: a name on a command line (`mcp --name`), or one
//! line written to the socket by any local process, does not make it that agent (issue 23.1).

use std::path::{Path, PathBuf};

use relay_client::{ClientError, Outgoing, Receipt};
use relay_protocol::Kind;
use serde::Deserialize;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};

/// The socket's file name in the team directory.
pub const SOCKET: &str = "door.sock";
/// The variable that carries the door key into the agent's environment (never its command
/// line, never a file another agent's processes are told of). Its name has none of the words
/// (`KEY`, `TOKEN`, `SECRET`, `AUTH`...) for which an agent CLI keeps a variable from the MCP
/// servers it starts: Gemini CLI 0.61 drops those.
pub const KEY_ENV: &str = "AGENT_RELAY_SESSION";

/// A new door key: 256 random bits, hex.
pub fn new_key() -> String {
    format!(
        "{:032x}{:032x}",
        rand::random::<u128>(),
        rand::random::<u128>()
    )
}

/// Whether `given` is `key`, compared in time that does not depend on where they differ.
fn key_matches(given: &str, key: &str) -> bool {
    given.len() == key.len()
        && given
            .bytes()
            .zip(key.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}
/// The longest request line read (a body is at most 512 KiB on the relay).
const MAX_REQUEST: u64 = 1024 * 1024;

/// A send asked for through the door, and where its receipt goes.
pub(crate) struct SendRequest {
    pub(crate) msg: Outgoing,
    pub(crate) reply: oneshot::Sender<Result<Receipt, ClientError>>,
}

/// What the agent's own tool asks of the wrapper.
pub(crate) enum Request {
    /// Send as the agent.
    Send(SendRequest),
    /// The tool showed the model these messages in full; the answer is how many that
    /// verified.
    Read {
        ids: Vec<String>,
        reply: oneshot::Sender<usize>,
    },
    /// Claude Code's Stop hook (`active`: the turn was one a Stop hook continued); the texts
    /// it hands to the model.
    Stop {
        active: bool,
        reply: oneshot::Sender<Vec<String>>,
    },
    /// Claude Code's UserPromptSubmit hook: a prompt was submitted; the texts that go in with
    /// it as the turn's context.
    Prompt { reply: oneshot::Sender<Vec<String>> },
    /// The agent's tool (`relay_inbox`) asks for the messages waiting for it, at most `limit`,
    /// oldest first: the wrapper hands them over (never typed after) and answers with them and
    /// how many more wait.
    Inbox {
        limit: usize,
        reply: oneshot::Sender<(Vec<relay_client::Delivered>, usize)>,
    },
    /// Subscribe the agent's connection to a topic pattern.
    Subscribe {
        pattern: String,
        reply: oneshot::Sender<Result<(), ClientError>>,
    },
    /// A question for the relay asked on the agent's connection, as the agent (a worker it spawns
    /// or releases, its claims and edits speak for it).
    Query {
        req: relay_protocol::query::QueryRequest,
        reply: oneshot::Sender<Result<relay_protocol::query::QueryResult, ClientError>>,
    },
}

/// The door's requests, for the wrapper's loop.
pub(crate) struct Door {
    rx: mpsc::Receiver<Request>,
    /// Kept when the socket could not be bound, so that `recv` waits forever instead of
    /// ending.
    _idle: Option<mpsc::Sender<Request>>,
    path: Option<PathBuf>,
}

impl Door {
    /// The next request.
    pub(crate) async fn recv(&mut self) -> Option<Request> {
        self.rx.recv().await
    }
}

impl Drop for Door {
    fn drop(&mut self) {
        if let Some(p) = &self.path
            && let Err(e) = std::fs::remove_file(p)
        {
            tracing::debug!(error = %e, "cannot remove the door socket");
        }
    }
}

#[derive(Deserialize)]
struct Wire {
    to: String,
    body: String,
    #[serde(default)]
    topic: Option<String>,
    #[serde(default)]
    thread: Option<String>,
    /// The message this answers: the reply counts in its chain's hop budget.
    #[serde(default)]
    in_reply_to: Option<String>,
    #[serde(default)]
    urgent: bool,
}

/// Who the door belongs to: the agent's name, and the key its requests must carry.
#[derive(Clone)]
struct Owner {
    name: String,
    key: String,
}

/// Opens agent `name`'s door in `team_dir`, answering only requests that carry `key`. A door
/// that cannot open is logged and stays shut: the agent still has every other door.
pub(crate) fn open(team_dir: &Path, name: &str, key: &str) -> Door {
    let owner = Owner {
        name: name.to_owned(),
        key: key.to_owned(),
    };
    let (tx, rx) = mpsc::channel(64);
    let path = team_dir.join(SOCKET);
    // A socket left by a wrapper that died: this wrapper holds the name now.
    if let Err(e) = std::fs::remove_file(&path)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(error = %e, "cannot remove an old door socket");
    }
    let listener = match tokio::net::UnixListener::bind(&path) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, path = %path.display(), "cannot open the door for the agent's own tools");
            return Door {
                rx,
                _idle: Some(tx),
                path: None,
            };
        }
    };
    tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    tokio::spawn(serve(stream, tx.clone(), owner.clone()));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the door stopped accepting");
                    return;
                }
            }
        }
    });
    Door {
        rx,
        _idle: None,
        path: Some(path),
    }
}

async fn serve(stream: tokio::net::UnixStream, tx: mpsc::Sender<Request>, owner: Owner) {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let answer = match BufReader::new(read.take(MAX_REQUEST))
        .read_line(&mut line)
        .await
    {
        Err(e) => serde_json::json!({"error": format!("cannot read the request: {e}")}),
        Ok(_) => match serde_json::from_str::<serde_json::Value>(&line) {
            Ok(v)
                if !v["key"]
                    .as_str()
                    .is_some_and(|k| key_matches(k, &owner.key)) =>
            {
                let why = if v.get("key").is_some() {
                    "with a key that is not this agent's"
                } else {
                    "without the door key"
                };
                tracing::warn!(agent = %owner.name, "refused a door request {why}");
                serde_json::json!({"error": refusal(&owner.name, why)})
            }
            Ok(v) if v["hello"] == true => serde_json::json!({"agent": owner.name}),
            Ok(v) if v.get("read").is_some() => {
                match serde_json::from_value::<Vec<String>>(v["read"].clone()) {
                    Err(e) => serde_json::json!({"error": format!("not a read report: {e}")}),
                    Ok(ids) => shown(ids, &tx).await,
                }
            }
            Ok(v) if v["hook"] == "stop" => {
                let active = v["active"].as_bool().unwrap_or(false);
                hook(|reply| Request::Stop { active, reply }, &tx).await
            }
            Ok(v) if v["hook"] == "prompt" => hook(|reply| Request::Prompt { reply }, &tx).await,
            Ok(v) if v.get("inbox").is_some() => {
                let limit = v["inbox"]
                    .as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .unwrap_or(20)
                    .clamp(1, 1000);
                inbox(limit, &tx).await
            }
            Ok(v) if v.get("query").is_some() => query(v["query"].clone(), &tx).await,
            Ok(v) if v.get("subscribe").is_some() => subscribe(&v["subscribe"], &tx).await,
            _ => match serde_json::from_str::<Wire>(&line) {
                Err(e) => serde_json::json!({"error": format!("not a send request: {e}")}),
                Ok(w) => ask(w, &tx).await,
            },
        },
    };
    let text = format!("{answer}\n");
    if let Err(e) = write.write_all(text.as_bytes()).await {
        tracing::debug!(error = %e, "the door's caller left before its answer");
    }
}

/// Why a request without the agent's key is refused, and what to do instead.
fn refusal(name: &str, why: &str) -> String {
    format!(
        "refused: a request came {why}. This door speaks only for the agent {name}: only \
         processes of its own session (its MCP server, its hooks) may use it, with the key its \
         wrapper put in its environment ({KEY_ENV}). Run `agent-relay mcp` (no --name) or \
         `agent-relay hooks` from inside {name}: set up once per project with \
         `claude mcp add relay -- agent-relay mcp`"
    )
}

async fn shown(ids: Vec<String>, tx: &mpsc::Sender<Request>) -> serde_json::Value {
    let (reply, rx) = oneshot::channel();
    if tx.send(Request::Read { ids, reply }).await.is_err() {
        return serde_json::json!({"error": "the wrapper is ending"});
    }
    match rx.await {
        Ok(n) => serde_json::json!({ "verified": n }),
        Err(_) => serde_json::json!({"error": "the wrapper ended before it answered"}),
    }
}

/// `relay_inbox` under the wrapper: a page of the messages it holds, handed over by it.
async fn inbox(limit: usize, tx: &mpsc::Sender<Request>) -> serde_json::Value {
    let (reply, rx) = oneshot::channel();
    if tx.send(Request::Inbox { limit, reply }).await.is_err() {
        return serde_json::json!({"error": "the wrapper is ending"});
    }
    match rx.await {
        Ok((messages, more)) => {
            let records: Vec<_> = messages
                .iter()
                .map(relay_client::Delivered::record)
                .collect();
            serde_json::json!({ "messages": records, "more": more })
        }
        Err(_) => serde_json::json!({"error": "the wrapper ended before it answered"}),
    }
}

async fn ask(w: Wire, tx: &mpsc::Sender<Request>) -> serde_json::Value {
    let msg = Outgoing {
        id: None,
        to: Some(w.to),
        topic: w.topic,
        payload: relay_protocol::Send {
            origin: None,
            kind: Kind::Message,
            body: w.body,
            data: None,
            thread: w.thread,
            in_reply_to: w.in_reply_to,
            budget: None,
            urgent: w.urgent,
        },
    };
    let (reply, rx) = oneshot::channel();
    if tx
        .send(Request::Send(SendRequest { msg, reply }))
        .await
        .is_err()
    {
        return serde_json::json!({"error": "the wrapper is ending"});
    }
    match rx.await {
        Ok(Ok(r)) => {
            serde_json::json!({"id": r.id, "status": r.status, "recipients": r.recipients})
        }
        Ok(Err(ClientError::Rejected { code, reason })) => {
            serde_json::json!({"nack": code, "reason": reason})
        }
        Ok(Err(e)) => serde_json::json!({"error": e.to_string()}),
        Err(_) => serde_json::json!({"error": "the wrapper ended before the receipt came"}),
    }
}

/// `relay_subscribe` under the wrapper: the agent's connection subscribes.
async fn subscribe(pattern: &serde_json::Value, tx: &mpsc::Sender<Request>) -> serde_json::Value {
    let Some(pattern) = pattern
        .as_str()
        .filter(|p| relay_protocol::validate_topic_pattern(p).is_ok())
    else {
        return serde_json::json!({"error": "not a topic pattern (build.linux, build.*, build.>)"});
    };
    let (reply, rx) = oneshot::channel();
    let pattern = pattern.to_owned();
    let req = Request::Subscribe {
        pattern: pattern.clone(),
        reply,
    };
    if tx.send(req).await.is_err() {
        return serde_json::json!({"error": "the wrapper is ending"});
    }
    match rx.await {
        Ok(Ok(())) => serde_json::json!({ "subscribed": pattern }),
        Ok(Err(e)) => serde_json::json!({"error": e.to_string()}),
        Err(_) => serde_json::json!({"error": "the wrapper ended before it answered"}),
    }
}

/// A question asked on the agent's connection, as the agent: only those that speak for it (a
/// worker it spawns or releases, its claims and edits); anything else a tool asks on its own
/// connection. `{"result": RESULT}` or `{"error", "code"?}`.
async fn query(v: serde_json::Value, tx: &mpsc::Sender<Request>) -> serde_json::Value {
    use relay_protocol::query::QueryRequest;
    let req = match serde_json::from_value::<QueryRequest>(v) {
        Ok(
            r @ (QueryRequest::Spawn(_)
            | QueryRequest::Release { .. }
            | QueryRequest::Claim { .. }
            | QueryRequest::Unclaim { .. }
            | QueryRequest::Claims
            | QueryRequest::Edited { .. }),
        ) => r,
        Ok(_) => {
            return serde_json::json!({"error": "the door asks only spawn, release, claim, unclaim, claims and edited"});
        }
        Err(e) => return serde_json::json!({"error": format!("not a query: {e}")}),
    };
    let (reply, rx) = oneshot::channel();
    if tx.send(Request::Query { req, reply }).await.is_err() {
        return serde_json::json!({"error": "the wrapper is ending"});
    }
    match rx.await {
        Ok(Ok(result)) => serde_json::json!({ "result": result }),
        Ok(Err(ClientError::Query { code, message })) => {
            serde_json::json!({"error": message, "code": code})
        }
        Ok(Err(e)) => serde_json::json!({"error": e.to_string()}),
        Err(_) => serde_json::json!({"error": "the wrapper ended before it answered"}),
    }
}

/// A hook's request (`request` made with the channel for the answer): the messages the wrapper
/// hands over.
async fn hook(
    request: impl FnOnce(oneshot::Sender<Vec<String>>) -> Request,
    tx: &mpsc::Sender<Request>,
) -> serde_json::Value {
    let (reply, rx) = oneshot::channel();
    if tx.send(request(reply)).await.is_err() {
        return serde_json::json!({"error": "the wrapper is ending"});
    }
    match rx.await {
        Ok(messages) => serde_json::json!({ "messages": messages }),
        Err(_) => serde_json::json!({"error": "the wrapper ended before it answered"}),
    }
}
