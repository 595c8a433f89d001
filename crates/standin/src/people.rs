//! Stand-ins for what the people adapters talk to (`relay-people`): the Telegram Bot API
//! ([`TelegramStandIn`]: records what the bot sent, scripts what people write) and a webhook
//! receiver ([`WebhookStandIn`]: records each POST with its headers, answers with a chosen
//! status). Each is a real HTTP server on `127.0.0.1:0` on its own thread and runtime, like
//! [`crate::StandIn`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::Notify;

use crate::StandInError;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A server on its own thread; stops when dropped.
struct Server {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Server {
    fn start(app: axum::Router) -> Result<Self, StandInError> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name(format!("standin-{}", addr.port()))
            .spawn(move || {
                rt.block_on(async move {
                    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                        return;
                    };
                    let served = axum::serve(listener, app)
                        .with_graceful_shutdown(async {
                            // Dropped without a send: the owner is gone, stop as well.
                            stopped.await.ok();
                        })
                        .await;
                    if let Err(e) = served {
                        eprintln!("relay-standin: the stand-in server stopped: {e}");
                    }
                });
            })?;
        Ok(Self {
            addr,
            stop: Some(stop),
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            // The server's thread may have ended already (it says why): nothing to stop.
            stop.send(()).ok();
        }
    }
}

/// A message the bot sent (`sendMessage`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BotMessage {
    /// The chat it went to.
    pub chat_id: i64,
    /// Its text.
    pub text: String,
    /// The id the stand-in gave it (what a person's reply refers to).
    pub message_id: i64,
}

#[derive(Default)]
struct Bot {
    token: String,
    updates: Vec<Value>,
    sent: Vec<BotMessage>,
    next_message_id: i64,
    /// The highest `offset` a `getUpdates` asked for: every update below it was handled.
    asked_from: i64,
    bad_token_calls: u64,
    /// The next `getUpdates` is answered with this many bytes (a valid start, then blanks).
    huge_answer: Option<usize>,
    /// How long each `sendMessage` takes to answer.
    send_delay: Duration,
    /// While true, every `sendMessage` waits (see [`TelegramStandIn::hold_sends`]).
    held: bool,
    /// `sendMessage` calls waiting while held.
    waiting_sends: u64,
    /// `sendMessage` calls still to refuse with 429 and this `retry_after` (seconds).
    limited: (u32, u64),
    /// `sendMessage` calls refused (429, or 400 for a text over Telegram's limit).
    refused_sends: Vec<(u16, String)>,
    /// `getUpdates` calls answered.
    polls: u64,
}

/// Telegram's limit on a message's text, in characters (UTF-16 units in Telegram's count;
/// the same for the texts tests send).
pub const TELEGRAM_TEXT_LIMIT: usize = 4096;

type BotState = Arc<(Mutex<Bot>, Notify, Notify)>;

/// A stand-in of the Telegram Bot API: `getUpdates` (long polling, answered as soon as an
/// update is scripted) and `sendMessage`, for one bot token.
pub struct TelegramStandIn {
    state: BotState,
    server: Server,
}

impl TelegramStandIn {
    /// Starts a Bot API stand-in that accepts `token`.
    ///
    /// # Errors
    /// [`StandInError::Io`] when it cannot bind or start its thread.
    pub fn start(token: &str) -> Result<Self, StandInError> {
        let state: BotState = Arc::new((
            Mutex::new(Bot {
                token: token.to_owned(),
                next_message_id: 1000,
                ..Bot::default()
            }),
            Notify::new(),
            Notify::new(),
        ));
        let app = axum::Router::new()
            .route("/{bot}/{method}", axum::routing::post(bot_call))
            .with_state(state.clone());
        Ok(Self {
            state,
            server: Server::start(app)?,
        })
    }

    /// `http://127.0.0.1:PORT`: the Bot API base URL to configure.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.server.addr)
    }

    /// Scripts a text message from Telegram user `user` in `chat` (a private chat's id is the
    /// user's), optionally replying to the bot's message `reply_to`; its update id.
    pub fn say(&self, user: i64, chat: i64, text: &str, reply_to: Option<i64>) -> i64 {
        let mut bot = lock(&self.state.0);
        let update_id = i64::try_from(bot.updates.len()).unwrap_or(i64::MAX) + 1;
        let message_id = bot.next_message_id;
        bot.next_message_id += 1;
        let mut message = json!({
            "message_id": message_id,
            "date": 0,
            "from": {"id": user, "is_bot": false, "first_name": "P"},
            "chat": {"id": chat, "type": if chat == user { "private" } else { "group" }},
            "text": text,
        });
        if let Some(r) = reply_to {
            let original = bot.sent.iter().find(|m| m.message_id == r).cloned();
            message["reply_to_message"] = json!({
                "message_id": r,
                "date": 0,
                "chat": {"id": chat, "type": "private"},
                "text": original.map(|m| m.text).unwrap_or_default(),
            });
        }
        bot.updates
            .push(json!({"update_id": update_id, "message": message}));
        drop(bot);
        self.state.1.notify_waiters();
        update_id
    }

    /// What the bot sent, in order.
    pub fn sent(&self) -> Vec<BotMessage> {
        lock(&self.state.0).sent.clone()
    }

    /// Whether the bot has asked for the updates after `update_id`: it has handled it.
    pub fn handled(&self, update_id: i64) -> bool {
        lock(&self.state.0).asked_from > update_id
    }

    /// Calls made with a token other than the bot's.
    pub fn bad_token_calls(&self) -> u64 {
        lock(&self.state.0).bad_token_calls
    }

    /// Answers the next `getUpdates` with `bytes` bytes: a Bot API answer's start followed by
    /// blanks, streamed (the stand-in never holds it), as a broken or hostile server might.
    pub fn huge_answer(&self, bytes: usize) {
        lock(&self.state.0).huge_answer = Some(bytes);
    }

    /// While `held`, every `sendMessage` waits without answering (a Bot API that hangs);
    /// released, they all answer.
    pub fn hold_sends(&self, held: bool) {
        lock(&self.state.0).held = held;
        self.state.2.notify_waiters();
    }

    /// `sendMessage` calls waiting now because sends are held.
    pub fn waiting_sends(&self) -> u64 {
        lock(&self.state.0).waiting_sends
    }

    /// Makes every `sendMessage` take `delay` before it answers (a slow Bot API).
    pub fn send_delay(&self, delay: Duration) {
        lock(&self.state.0).send_delay = delay;
    }

    /// Refuses the next `calls` `sendMessage` calls with 429 Too Many Requests and
    /// `retry_after` seconds, as Telegram does under its flood limits.
    pub fn rate_limit(&self, calls: u32, retry_after_s: u64) {
        lock(&self.state.0).limited = (calls, retry_after_s);
    }

    /// The `sendMessage` calls refused, with their status and description.
    pub fn refused_sends(&self) -> Vec<(u16, String)> {
        lock(&self.state.0).refused_sends.clone()
    }

    /// `getUpdates` calls answered so far.
    pub fn polls(&self) -> u64 {
        lock(&self.state.0).polls
    }
}

/// A Bot API error answer.
fn bot_error(status: StatusCode, description: &str, retry_after: Option<u64>) -> Response {
    let mut body = json!({"ok": false, "error_code": status.as_u16(), "description": description});
    if let Some(s) = retry_after {
        body["parameters"] = json!({"retry_after": s});
    }
    (status, Json(body)).into_response()
}

/// `bytes` bytes of an answer that starts like a Bot API answer, streamed in 1 MiB pieces.
fn huge(bytes: usize) -> Response {
    const PIECE: usize = 1024 * 1024;
    let start = b"{\"ok\":true,\"result\":[".to_vec();
    let blank = Bytes::from(vec![b' '; PIECE]);
    let mut pieces = vec![Bytes::from(start)];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(PIECE);
        pieces.push(blank.slice(..n));
        left -= n;
    }
    let stream = futures_util::stream::iter(pieces.into_iter().map(Ok::<_, std::io::Error>));
    axum::body::Body::from_stream(stream).into_response()
}

async fn bot_call(
    State(state): State<BotState>,
    Path((bot, method)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    let args: Value = serde_json::from_slice(&body).unwrap_or_default();
    {
        let mut b = lock(&state.0);
        if bot.strip_prefix("bot") != Some(b.token.as_str()) {
            b.bad_token_calls += 1;
            return (
                StatusCode::UNAUTHORIZED,
                Json(json!({"ok": false, "error_code": 401, "description": "Unauthorized"})),
            )
                .into_response();
        }
    }
    match method.as_str() {
        "getUpdates" => {
            {
                let mut b = lock(&state.0);
                b.polls += 1;
                if let Some(n) = b.huge_answer.take() {
                    return huge(n);
                }
            }
            let offset = args["offset"].as_i64().unwrap_or(0);
            let wait = Duration::from_secs(args["timeout"].as_u64().unwrap_or(0));
            let deadline = tokio::time::Instant::now() + wait;
            loop {
                let notified = state.1.notified();
                {
                    let mut b = lock(&state.0);
                    b.asked_from = b.asked_from.max(offset);
                    let ready: Vec<Value> = b
                        .updates
                        .iter()
                        .filter(|u| u["update_id"].as_i64().unwrap_or(0) >= offset)
                        .cloned()
                        .collect();
                    if !ready.is_empty() || tokio::time::Instant::now() >= deadline {
                        return Json(json!({"ok": true, "result": ready})).into_response();
                    }
                }
                if tokio::time::timeout_at(deadline, notified).await.is_err() {
                    return Json(json!({"ok": true, "result": []})).into_response();
                }
            }
        }
        "sendMessage" => {
            let delay = lock(&state.0).send_delay;
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            loop {
                let released = state.2.notified();
                {
                    let mut b = lock(&state.0);
                    if !b.held {
                        break;
                    }
                    b.waiting_sends += 1;
                }
                released.await;
                lock(&state.0).waiting_sends -= 1;
            }
            let mut b = lock(&state.0);
            let text = args["text"].as_str().unwrap_or("");
            if b.limited.0 > 0 {
                b.limited.0 -= 1;
                let after = b.limited.1;
                let why = format!("Too Many Requests: retry after {after}");
                b.refused_sends.push((429, why.clone()));
                return bot_error(StatusCode::TOO_MANY_REQUESTS, &why, Some(after));
            }
            if text.chars().count() > TELEGRAM_TEXT_LIMIT {
                let why = "Bad Request: message is too long";
                b.refused_sends.push((400, why.to_owned()));
                return bot_error(StatusCode::BAD_REQUEST, why, None);
            }
            let message_id = b.next_message_id;
            b.next_message_id += 1;
            let chat_id = args["chat_id"].as_i64().unwrap_or(0);
            let text = args["text"].as_str().unwrap_or("").to_owned();
            b.sent.push(BotMessage {
                chat_id,
                text: text.clone(),
                message_id,
            });
            Json(json!({"ok": true, "result": {
                "message_id": message_id, "date": 0, "chat": {"id": chat_id}, "text": text,
            }}))
            .into_response()
        }
        _ => (
            StatusCode::NOT_FOUND,
            Json(json!({"ok": false, "error_code": 404, "description": "Not Found"})),
        )
            .into_response(),
    }
}

/// A POST the webhook stand-in received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Posted {
    /// Headers, names in lower case.
    pub headers: BTreeMap<String, String>,
    /// The body.
    pub body: Vec<u8>,
    /// The status it was answered with.
    pub status: u16,
}

#[derive(Default)]
struct Hook {
    posts: Vec<Posted>,
    /// Statuses to answer with, in order; 200 once they run out.
    answers: Vec<u16>,
}

type HookState = Arc<Mutex<Hook>>;

/// A webhook receiver: records each POST, answers 200 (or the statuses scripted).
pub struct WebhookStandIn {
    state: HookState,
    server: Server,
}

impl WebhookStandIn {
    /// Starts a receiver.
    ///
    /// # Errors
    /// [`StandInError::Io`] when it cannot bind or start its thread.
    pub fn start() -> Result<Self, StandInError> {
        let state: HookState = Arc::default();
        let app = axum::Router::new()
            .fallback(hook_call)
            .with_state(state.clone());
        Ok(Self {
            state,
            server: Server::start(app)?,
        })
    }

    /// `http://127.0.0.1:PORT/hook`: the URL to configure.
    pub fn url(&self) -> String {
        format!("http://{}/hook", self.server.addr)
    }

    /// Answers the next POSTs with these statuses, in order (then 200 again).
    pub fn answer_with(&self, statuses: &[u16]) {
        lock(&self.state).answers = statuses.to_vec();
    }

    /// Every POST so far.
    pub fn posts(&self) -> Vec<Posted> {
        lock(&self.state).posts.clone()
    }
}

async fn hook_call(State(state): State<HookState>, headers: HeaderMap, body: Bytes) -> Response {
    let mut h = lock(&state);
    let status = if h.answers.is_empty() {
        200
    } else {
        h.answers.remove(0)
    };
    h.posts.push(Posted {
        headers: headers
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_owned(),
                    v.to_str().unwrap_or_default().to_owned(),
                )
            })
            .collect(),
        body: body.to_vec(),
        status,
    });
    (
        StatusCode::from_u16(status).unwrap_or(StatusCode::OK),
        Json(json!({})),
    )
        .into_response()
}
