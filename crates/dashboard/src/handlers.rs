//! The page, the JSON API and the event stream.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use futures_util::Stream;
use relay_daemon::{LiveAgent, Subscription};
use relay_protocol::events::excerpt_of;
use relay_protocol::query::{AgentInfo, HistoryFilter, QueryRequest, QueryResult};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::watch;

use crate::App;
use crate::metrics::{Rate, Totals};

const PAGE: &str = include_str!("../assets/index.html");
const SCRIPT: &str = include_str!("../assets/app.js");
const STYLE: &str = include_str!("../assets/app.css");

/// Dead letters listed (the newest; `agent-relay dlq --limit` reaches further back).
const DEAD_LIMIT: u32 = 200;

/// Characters of each dead letter's body in the list.
const DEAD_EXCERPT: usize = 300;

type Failure = (StatusCode, Json<serde_json::Value>);

fn failure(status: StatusCode, code: &str, message: impl Into<String>) -> Failure {
    (
        status,
        Json(json!({"error": {"code": code, "message": message.into()}})),
    )
}

async fn ask(app: &App, req: QueryRequest) -> Result<relay_daemon::Answer, Failure> {
    let answer = app.daemon.ask(req).await.map_err(|e| {
        failure(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            e.to_string(),
        )
    })?;
    if let QueryResult::Error { code, message } = &answer.result {
        let status = match code.as_str() {
            "not_found" => StatusCode::NOT_FOUND,
            "ambiguous" => StatusCode::CONFLICT,
            "invalid" => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        return Err(failure(status, code, message.clone()));
    }
    Ok(answer)
}

fn unexpected() -> Failure {
    failure(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        "unexpected answer from the daemon",
    )
}

/// `GET /`: the page. Its assets need the token too, so it is written into their URLs.
pub(crate) async fn page(State(app): State<Arc<App>>) -> Html<String> {
    Html(PAGE.replace("{{TOKEN}}", &app.token.value()))
}

pub(crate) async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        SCRIPT,
    )
        .into_response()
}

pub(crate) async fn style() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE).into_response()
}

/// An agent as the dashboard shows it: what the daemon says of it (its `state`, `since`,
/// `why`, `thread` and `last_activity` included: one reading of an agent's state for
/// `agents`, `relay_agents`, `wait` and this page) and the live counters.
#[derive(Debug, Serialize)]
struct AgentView {
    #[serde(flatten)]
    info: AgentInfo,
    /// `pty` or `tmux` for a wrapped agent.
    #[serde(skip_serializing_if = "Option::is_none")]
    backend: Option<String>,
    sent: u64,
    received: u64,
    inflight: u64,
}

/// `GET /api/agents`.
pub(crate) async fn agents(
    State(app): State<Arc<App>>,
) -> Result<Json<serde_json::Value>, Failure> {
    let answer = ask(&app, QueryRequest::Agents).await?;
    let QueryResult::Agents { agents } = answer.result else {
        return Err(unexpected());
    };
    let live: HashMap<String, LiveAgent> = answer
        .live
        .into_iter()
        .map(|l| (l.name.clone(), l))
        .collect();
    let views: Vec<AgentView> = agents
        .into_iter()
        .map(|info| {
            let l = live.get(&info.name).cloned().unwrap_or_default();
            let terminal = l.terminal.filter(|_| info.online);
            AgentView {
                info,
                backend: terminal.map(|t| t.backend),
                sent: l.sent,
                received: l.received,
                inflight: l.inflight,
            }
        })
        .collect();
    Ok(Json(json!({ "agents": views })))
}

/// Query parameters of `GET /api/messages`.
#[derive(Debug, Deserialize)]
pub(crate) struct MessagesQuery {
    from: Option<String>,
    to: Option<String>,
    topic: Option<String>,
    text: Option<String>,
    since: Option<u64>,
    until: Option<u64>,
    before: Option<i64>,
    limit: Option<u32>,
}

fn non_empty(s: Option<String>) -> Option<String> {
    s.map(|s| s.trim().to_owned()).filter(|s| !s.is_empty())
}

/// `GET /api/messages`: history, newest first, a page at a time.
pub(crate) async fn messages(
    State(app): State<Arc<App>>,
    Query(q): Query<MessagesQuery>,
) -> Result<Json<serde_json::Value>, Failure> {
    let limit = q.limit.unwrap_or(50);
    if !(1..=1000).contains(&limit) {
        return Err(failure(
            StatusCode::BAD_REQUEST,
            "invalid",
            "limit must be between 1 and 1000",
        ));
    }
    let filter = HistoryFilter {
        from: non_empty(q.from),
        to: non_empty(q.to),
        topic: non_empty(q.topic),
        text: non_empty(q.text),
        since_ms: q.since,
        until_ms: q.until,
        before_pos: q.before,
        limit: Some(limit),
    };
    let answer = ask(&app, QueryRequest::History(filter)).await?;
    let QueryResult::History { messages } = answer.result else {
        return Err(unexpected());
    };
    // A full page may have more behind it.
    let next_before = (messages.len() == limit as usize)
        .then(|| messages.last().map(|m| m.pos))
        .flatten();
    Ok(Json(
        json!({ "messages": messages, "next_before": next_before }),
    ))
}

/// `GET /api/messages/{id}`: one message, its deliveries and its delivery trace (every state
/// change of every recipient's copy, as `agent-relay trace` prints it).
pub(crate) async fn message(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, Failure> {
    let answer = ask(&app, QueryRequest::Read { id, from: None }).await?;
    let QueryResult::Read { message } = answer.result else {
        return Err(unexpected());
    };
    // By the full id: a prefix that was unique a moment ago still names this message.
    let answer = ask(
        &app,
        QueryRequest::Trace {
            id: message.id.clone(),
            from: Some(message.from.clone()),
        },
    )
    .await?;
    let QueryResult::Trace { trace } = answer.result else {
        return Err(unexpected());
    };
    Ok(Json(json!({ "message": message, "trace": trace.events })))
}

/// Query of `GET /api/inbox`.
#[derive(Debug, Deserialize)]
pub(crate) struct InboxQuery {
    /// The person (default `human`).
    person: Option<String>,
}

/// Messages of a person's inbox listed.
const INBOX_LIMIT: u32 = 50;

/// `GET /api/inbox?person=NAME`: the latest messages to a person (`human` by default; a
/// person's mailbox always exists), newest first, each with `unread`: no door of the person
/// (`agent-relay inbox`, an adapter) has handed it over yet. Listing them marks nothing.
pub(crate) async fn inbox(
    State(app): State<Arc<App>>,
    Query(q): Query<InboxQuery>,
) -> Result<Json<serde_json::Value>, Failure> {
    let person = non_empty(q.person).unwrap_or_else(|| relay_protocol::HUMAN.to_owned());
    relay_protocol::validate_agent_name(&person)
        .map_err(|e| failure(StatusCode::BAD_REQUEST, "invalid", format!("person: {e}")))?;
    let filter = HistoryFilter {
        to: Some(person.clone()),
        limit: Some(INBOX_LIMIT),
        ..HistoryFilter::default()
    };
    let answer = ask(&app, QueryRequest::History(filter)).await?;
    let QueryResult::History { messages } = answer.result else {
        return Err(unexpected());
    };
    let listed: Vec<serde_json::Value> = messages
        .into_iter()
        .filter(|m| m.from != person)
        .map(|m| {
            let unread = m.deliveries.iter().any(|d| {
                d.recipient == person && d.status == relay_protocol::query::DeliveryStatus::Queued
            });
            let mut v = json!(m);
            v["unread"] = json!(unread);
            v
        })
        .collect();
    Ok(Json(json!({ "person": person, "messages": listed })))
}

/// Body of `POST /api/reply`.
#[derive(Debug, Deserialize)]
pub(crate) struct ReplyBody {
    /// The message answered (id, short id or prefix).
    id: String,
    /// The answer.
    body: String,
    /// The person answering (default `human`).
    #[serde(default)]
    from: Option<String>,
}

/// `POST /api/reply` `{"id", "body", "from"?}`: answers message `id` as the person, as
/// `agent-relay reply` does: to its sender, with `in_reply_to` and its thread (the message's
/// own, or the message itself). Answered with the relay's receipt, or its refusal.
pub(crate) async fn reply(
    State(app): State<Arc<App>>,
    Json(r): Json<ReplyBody>,
) -> Result<Json<serde_json::Value>, Failure> {
    let from = non_empty(r.from).unwrap_or_else(|| relay_protocol::HUMAN.to_owned());
    relay_protocol::validate_agent_name(&from)
        .map_err(|e| failure(StatusCode::BAD_REQUEST, "invalid", format!("from: {e}")))?;
    if r.body.trim().is_empty() {
        return Err(failure(
            StatusCode::BAD_REQUEST,
            "invalid",
            "the answer is empty",
        ));
    }
    let answer = ask(
        &app,
        QueryRequest::Read {
            id: r.id,
            from: None,
        },
    )
    .await?;
    let QueryResult::Read { message } = answer.result else {
        return Err(unexpected());
    };
    let answer = ask(&app, QueryRequest::Status).await?;
    let QueryResult::Status(status) = answer.result else {
        return Err(unexpected());
    };
    let mut out = relay_client::Outgoing::new(message.from.clone(), r.body);
    out.payload.thread = Some(message.thread.clone().unwrap_or_else(|| message.id.clone()));
    out.payload.in_reply_to = Some(message.id);
    let unavailable = |e: relay_client::ClientError| {
        failure(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            e.to_string(),
        )
    };
    let client = relay_client::Client::connect(relay_client::ClientConfig::tool(
        std::path::PathBuf::from(&status.socket),
        from,
    ))
    .await
    .map_err(unavailable)?;
    let res = client.send(out).await;
    client.close().await;
    match res {
        Ok(receipt) => Ok(Json(json!({
            "id": receipt.id,
            "to": message.from,
            "status": receipt.status,
        }))),
        Err(relay_client::ClientError::Rejected { code, reason }) => Err(failure(
            StatusCode::CONFLICT,
            "refused",
            format!("{code:?}: {reason}"),
        )),
        Err(e) => Err(unavailable(e)),
    }
}

/// `GET /api/dead`: the dead-letter queue (not yet retried), newest first, as `agent-relay
/// dlq` lists it: expired, failed, and refused (rules, rate limits, budgets) alike.
pub(crate) async fn dead(State(app): State<Arc<App>>) -> Result<Json<serde_json::Value>, Failure> {
    let answer = ask(
        &app,
        QueryRequest::DlqList {
            all: false,
            limit: Some(DEAD_LIMIT),
        },
    )
    .await?;
    let QueryResult::DlqList { dead_letters } = answer.result else {
        return Err(unexpected());
    };
    // A list, reloaded whenever something is refused: bodies as excerpts (a body may be 512
    // KiB); the message's detail has the whole text.
    let listed: Vec<serde_json::Value> = dead_letters
        .into_iter()
        .map(|mut d| {
            let truncated;
            (d.body, truncated) = excerpt_of(&d.body, DEAD_EXCERPT);
            let mut v = json!(d);
            v["truncated"] = json!(truncated);
            v
        })
        .collect();
    Ok(Json(json!({ "dead_letters": listed })))
}

/// `POST /api/dead/{n}/retry`: puts dead letter `n` back, as `agent-relay dlq retry n` does.
pub(crate) async fn retry(
    State(app): State<Arc<App>>,
    Path(dlq_id): Path<i64>,
) -> Result<Json<serde_json::Value>, Failure> {
    let answer = ask(&app, QueryRequest::DlqRetry { dlq_id }).await?;
    let QueryResult::DlqRetry {
        dead_letter,
        outcome,
    } = answer.result
    else {
        return Err(unexpected());
    };
    Ok(Json(
        json!({ "dead_letter": dead_letter, "outcome": outcome }),
    ))
}

/// How many replies a `POST /api/chains/{thread}/extend` adds (`?hops=N`, default 10).
#[derive(Debug, Deserialize)]
pub(crate) struct ExtendQuery {
    hops: Option<u32>,
}

/// `POST /api/chains/{thread}/extend?hops=N`: lets the reply chain of `thread` run N more
/// replies (issue 24.8; what `agent-relay chain extend` does), from the dead letter a hop
/// budget made.
pub(crate) async fn extend_chain(
    State(app): State<Arc<App>>,
    Path(thread): Path<String>,
    Query(q): Query<ExtendQuery>,
) -> Result<Json<serde_json::Value>, Failure> {
    let hops = q.hops.unwrap_or(10);
    let answer = ask(&app, QueryRequest::ChainExtend { thread, hops }).await?;
    let QueryResult::ChainExtend {
        thread,
        extra,
        max_hops,
    } = answer.result
    else {
        return Err(unexpected());
    };
    Ok(Json(
        json!({ "thread": thread, "extra": extra, "max_hops": max_hops }),
    ))
}

/// `GET /api/stats`: status, counters and the per-second rates of the last minutes.
pub(crate) async fn stats(State(app): State<Arc<App>>) -> Result<Json<serde_json::Value>, Failure> {
    let answer = ask(&app, QueryRequest::Status).await?;
    let QueryResult::Status(status) = answer.result else {
        return Err(unexpected());
    };
    let totals = Totals::read(app.daemon.counters(), relay_protocol::now_ms());
    let rates = app.samples.lock().map(|s| s.rates()).unwrap_or_default();
    Ok(Json(
        json!({ "status": status, "totals": totals, "rates": rates }),
    ))
}

/// `GET /metrics`: Prometheus text format.
pub(crate) async fn prometheus_text(app: &App) -> Result<String, Failure> {
    let answer = ask(app, QueryRequest::Status).await?;
    let QueryResult::Status(status) = answer.result else {
        return Err(unexpected());
    };
    let totals = Totals::read(app.daemon.counters(), relay_protocol::now_ms());
    Ok(crate::metrics::prometheus(&totals, &status))
}

pub(crate) async fn prometheus(State(app): State<Arc<App>>) -> Result<Response, Failure> {
    let text = prometheus_text(&app).await?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

/// What the event stream is waiting for.
struct Live {
    sub: Subscription,
    totals: watch::Receiver<(Totals, Option<Rate>)>,
    sent: Totals,
    app: Arc<App>,
}

/// `GET /api/events`: Server-Sent Events. Each relay event is one `data:` line of JSON with a
/// `type` (as `agent-relay watch --json` prints); counters follow as a `stats` event each
/// second in which they changed. Nothing is re-sent: the page loads what came before from the
/// API.
pub(crate) async fn events(
    State(app): State<Arc<App>>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let mut totals = app.totals.clone();
    let sent = totals.borrow_and_update().0;
    let live = Live {
        sub: app.daemon.subscribe(),
        totals,
        sent,
        app,
    };
    let stream = futures_util::stream::unfold(live, |mut live| async move {
        loop {
            tokio::select! {
                ev = live.sub.recv() => {
                    let ev = ev?;
                    let data = serde_json::to_string(&*ev).unwrap_or_default();
                    return Some((Ok(Event::default().data(data)), live));
                }
                changed = live.totals.changed() => {
                    changed.ok()?;
                    let (now, rate) = *live.totals.borrow_and_update();
                    if now.same_counts(&live.sent) {
                        continue;
                    }
                    live.sent = now;
                    let data = json!({"type": "stats", "totals": now, "rate": rate}).to_string();
                    return Some((Ok(Event::default().data(data)), live));
                }
                () = live.app.daemon.stopped() => return None,
            }
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

/// `GET /api/adapters`: each people adapter with its state (connected, failing, last error).
pub(crate) async fn adapters(State(app): State<Arc<App>>) -> Json<serde_json::Value> {
    let list = app
        .people
        .as_ref()
        .map(|p| p.adapters())
        .unwrap_or_default();
    Json(json!({ "adapters": list }))
}

/// `POST /hooks/webhook`: a signed message from a person. Only the dashboard's own host is
/// served (as for every request), then the signature and timestamp decide; a refused request
/// stores nothing.
pub(crate) async fn webhook(
    State(app): State<Arc<App>>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if !crate::auth::loopback_host(text("host"), app.port) {
        return (
            StatusCode::MISDIRECTED_REQUEST,
            Json(json!({"error": "this server answers only to its own loopback address"})),
        )
            .into_response();
    }
    let Some(people) = &app.people else {
        return (
            StatusCode::NOT_FOUND,
            Json(json!({"error": "no webhook adapter is configured"})),
        )
            .into_response();
    };
    let (status, answer) = people
        .inbound_webhook(
            text(relay_people::sign::TIMESTAMP_HEADER),
            text(relay_people::sign::SIGNATURE_HEADER),
            &body,
        )
        .await;
    (
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        Json(answer),
    )
        .into_response()
}
