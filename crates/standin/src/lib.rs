//! A local stand-in for the Anthropic Messages API, so real agent CLIs (Claude Code) run with
//! no internet in tests, and a test decides what each one "says".
//!
//! ```text
//! Claude Code ──POST /v1/messages──► StandIn ──► Script::choose(latest user message)
//!             ◄──SSE text_delta...──┘   └──► log (which rule, the prompt, main or side request)
//! ```
//!
//! Point the CLI at it with `ANTHROPIC_BASE_URL=http://ADDR` (see [`StandIn::base_url`]).
//! The server runs on its own thread and runtime, so synchronous and asynchronous tests use it
//! alike; it listens on `127.0.0.1:0`, so tests stay parallel-safe. The pure parts are
//! [`script`] (rules) and [`messages`] (the API's shapes).
#![allow(
    clippy::disallowed_methods,
    reason = "test support: the stand-in times its own scripted delays with std clocks"
)]

pub mod gemini;
pub mod messages;
pub mod openai;
pub mod people;
pub mod script;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use axum::body::{Body, Bytes};
use axum::http::{Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

pub use script::{Choice, Matcher, Rule, Script};

/// Stand-in failures.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StandInError {
    /// A rule's regular expression does not compile.
    #[error("bad rule pattern: {0}")]
    Regex(String),
    /// A script file is not valid.
    #[error("bad script (expected {{\"rules\": [{{\"match\", \"reply\"}}...]}}): {0}")]
    Script(String),
    /// The server could not start.
    #[error("cannot start the stand-in: {0}")]
    Io(#[from] std::io::Error),
}

/// Which kind of request the agent made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A turn of the conversation a person sees (Claude Code sends its tools with it).
    Main,
    /// A side request the agent makes on its own: Claude Code 2.1 asks for a session title
    /// after each prompt (a small model, no tools, a JSON `title` wanted). Answered with
    /// [`Script::side`], never by the rules, and never shown as a turn.
    Side,
    /// `POST /v1/messages/count_tokens` (or Gemini's `:countTokens`).
    CountTokens,
    /// Any other path (answered `{}`).
    Other,
}

/// One request the stand-in answered.
#[derive(Debug, Clone)]
pub struct Request {
    /// The path prefix before `/v1/...` (empty normally): giving each agent its own
    /// `ANTHROPIC_BASE_URL=http://ADDR/alice` tells their requests apart in one log.
    pub prefix: String,
    /// The full path.
    pub path: String,
    /// Main conversation turn or a side request.
    pub kind: Kind,
    /// The model asked for.
    pub model: String,
    /// Whether a stream was asked for.
    pub stream: bool,
    /// The latest user message's text (see [`messages::latest_user_text`]).
    pub user_text: String,
    /// The rule that answered (`None`: the default, or not a messages request).
    pub rule: Option<String>,
    /// The reply sent.
    pub reply: String,
    /// The whole request body.
    pub body: Value,
    /// When it arrived.
    pub received: Instant,
    /// When it arrived, by the wall clock (to line up with other processes' logs).
    pub received_wall: SystemTime,
    /// When the last byte of the reply was handed to the connection (`None` while streaming).
    pub finished: Option<Instant>,
}

impl Request {
    /// When the last byte of the reply went out, by the wall clock.
    pub fn finished_wall(&self) -> Option<SystemTime> {
        self.finished
            .map(|f| self.received_wall + f.saturating_duration_since(self.received))
    }
}

struct Shared {
    /// Permits for held replies: [`StandIn::release`] adds one, a held reply takes one.
    gate: Arc<tokio::sync::Semaphore>,
    script: Script,
    log: Vec<Request>,
    chunk: usize,
    chunk_delay: Duration,
}

type State = Arc<Mutex<Shared>>;

fn lock(state: &State) -> MutexGuard<'_, Shared> {
    // A panic while holding the lock cannot leave the log half-written (pushes are atomic
    // for our purposes), so a poisoned lock is still usable.
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A running stand-in. Stops when dropped.
pub struct StandIn {
    addr: SocketAddr,
    state: State,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StandIn {
    /// Starts a stand-in on `127.0.0.1:0` answering with `script`.
    ///
    /// # Errors
    /// [`StandInError::Io`] when it cannot bind or start its thread.
    pub fn start(script: Script) -> Result<Self, StandInError> {
        Self::start_on(
            "127.0.0.1:0".parse().map_err(std::io::Error::other)?,
            script,
        )
    }

    /// Starts a stand-in on `addr` (port 0 picks a free one).
    ///
    /// # Errors
    /// [`StandInError::Io`] when it cannot bind or start its thread.
    pub fn start_on(addr: SocketAddr, script: Script) -> Result<Self, StandInError> {
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let state: State = Arc::new(Mutex::new(Shared {
            gate: Arc::new(tokio::sync::Semaphore::new(0)),
            script,
            log: Vec::new(),
            chunk: 16,
            chunk_delay: Duration::from_millis(10),
        }));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let app_state = Arc::clone(&state);
        let thread = std::thread::Builder::new()
            .name(format!("standin-{}", addr.port()))
            .spawn(move || {
                rt.block_on(async move {
                    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                        return;
                    };
                    let app = axum::Router::new().fallback(handle).with_state(app_state);
                    let _ = axum::serve(listener, app)
                        .with_graceful_shutdown(async {
                            let _ = stopped.await;
                        })
                        .await;
                });
            })?;
        Ok(Self {
            addr,
            state,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`: the value for `ANTHROPIC_BASE_URL`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Replaces the script (later requests use the new one).
    pub fn set_script(&self, script: Script) {
        lock(&self.state).script = script;
    }

    /// Streams replies `chars` characters per delta, `delay` apart (default 16 and 10 ms): a
    /// slower stream keeps the agent's screen redrawing for longer.
    pub fn set_pace(&self, chars: usize, delay: Duration) {
        let mut s = lock(&self.state);
        s.chunk = chars.max(1);
        s.chunk_delay = delay;
    }

    /// Lets one held reply (a [`Rule::held`] rule's) go on; a later held reply waits for the
    /// next release.
    pub fn release(&self) {
        lock(&self.state).gate.add_permits(1);
    }

    /// Every request answered so far, in arrival order.
    pub fn requests(&self) -> Vec<Request> {
        lock(&self.state).log.clone()
    }

    /// The prompts of the main conversation turns so far (what the agent was actually asked),
    /// in order.
    pub fn prompts(&self) -> Vec<String> {
        lock(&self.state)
            .log
            .iter()
            .filter(|r| r.kind == Kind::Main)
            .map(|r| r.user_text.clone())
            .collect()
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // Connections an agent keeps open would hold graceful shutdown up; the thread is left
        // to finish on its own rather than blocking the test that drops us.
        drop(self.thread.take());
    }
}

/// The API a request speaks.
#[derive(Debug, Clone, Copy)]
enum Wire {
    /// Anthropic Messages (`/v1/messages`): Claude Code.
    Anthropic,
    /// OpenAI Responses (`/v1/responses`): Codex CLI.
    OpenAi,
    /// Gemini (`/v1beta/models/M:generateContent`): Gemini CLI.
    Gemini { stream: bool },
}

/// Claude Code sends its tool definitions (27 in 2.1.197) with every conversation turn and
/// none with the requests it makes on its own (the session title).
fn classify(body: &Value) -> Kind {
    match body["tools"].as_array() {
        Some(tools) if !tools.is_empty() => Kind::Main,
        _ => Kind::Side,
    }
}

async fn handle(
    axum::extract::State(state): axum::extract::State<State>,
    method: Method,
    uri: Uri,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    let (prefix, api) = match path.find("/v1") {
        Some(i) => (path[..i].trim_matches('/').to_owned(), &path[i..]),
        None => (String::new(), path.as_str()),
    };
    let json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let wire = if method != Method::POST {
        None
    } else if api == "/v1/messages" {
        Some(Wire::Anthropic)
    } else if api.ends_with("/responses") {
        Some(Wire::OpenAi)
    } else if api.ends_with(":streamGenerateContent") {
        Some(Wire::Gemini { stream: true })
    } else if api.ends_with(":generateContent") {
        Some(Wire::Gemini { stream: false })
    } else {
        None
    };
    let kind = match wire {
        Some(_) => classify(&json),
        None if api.ends_with("/count_tokens") || api.ends_with(":countTokens") => {
            Kind::CountTokens
        }
        None => Kind::Other,
    };
    let model = json["model"]
        .as_str()
        .or_else(|| {
            // Gemini names the model in the path: models/NAME:streamGenerateContent.
            api.rsplit('/').next().and_then(|m| m.split(':').next())
        })
        .unwrap_or("standin")
        .to_owned();
    let stream = match wire {
        Some(Wire::Gemini { stream }) => stream,
        _ => json["stream"].as_bool().unwrap_or(false),
    };
    let user_text = match wire {
        Some(Wire::OpenAi) => openai::latest_user_text(&json),
        Some(Wire::Gemini { .. }) => gemini::latest_user_text(&json),
        _ => messages::latest_user_text(&json),
    };
    // What a tool answered, for rules that follow a tool call: the other APIs' user text holds
    // it already.
    let tool_text = match wire {
        Some(Wire::OpenAi | Wire::Gemini { .. }) => user_text.clone(),
        _ => messages::latest_tool_result_text(&json),
    };
    let choice = match kind {
        Kind::Main | Kind::Side if json.is_null() => {
            return (
                StatusCode::BAD_REQUEST,
                axum::Json(json!({"type": "error", "error": {
                        "type": "invalid_request_error", "message": "body is not JSON"}})),
            )
                .into_response();
        }
        Kind::Main => Some(lock(&state).script.choose_after(&user_text, &tool_text)),
        Kind::Side => Some(Choice {
            rule: None,
            reply: lock(&state).script.side.clone(),
            delay: Duration::ZERO,
            hold: false,
            thinking: None,
            tool_use: None,
        }),
        Kind::CountTokens | Kind::Other => None,
    };
    let (index, chunk, chunk_delay, gate) = {
        let mut s = lock(&state);
        s.log.push(Request {
            prefix,
            path: path.clone(),
            kind,
            model: model.clone(),
            stream,
            user_text: user_text.clone(),
            rule: choice.as_ref().and_then(|c| c.rule.clone()),
            reply: choice.as_ref().map(|c| c.reply.clone()).unwrap_or_default(),
            body: json.clone(),
            received: Instant::now(),
            received_wall: SystemTime::now(),
            finished: None,
        });
        (s.log.len() - 1, s.chunk, s.chunk_delay, Arc::clone(&s.gate))
    };
    let finish = {
        let state = Arc::clone(&state);
        move || {
            if let Some(r) = lock(&state).log.get_mut(index) {
                r.finished = Some(Instant::now());
            }
        }
    };
    let (Some(choice), Some(wire)) = (choice, wire) else {
        finish();
        let answer = if kind == Kind::CountTokens {
            let n = user_text.len().div_ceil(4).max(1);
            json!({"input_tokens": n, "totalTokens": n})
        } else {
            json!({})
        };
        return axum::Json(answer).into_response();
    };
    let held = choice.hold;
    let hold = move || async move {
        if held {
            if let Ok(permit) = gate.acquire().await {
                permit.forget();
            }
        }
    };
    if !stream {
        hold().await;
        tokio::time::sleep(choice.delay).await;
        finish();
        let answer = match wire {
            Wire::Gemini { .. } => gemini::reply_message(&choice.reply, choice.tool_use.as_ref()),
            // Codex always streams; a plain message is the closest answer otherwise.
            Wire::Anthropic | Wire::OpenAi => {
                messages::reply_message(&model, &choice.reply, choice.tool_use.as_ref())
            }
        };
        return axum::Json(answer).into_response();
    }
    // The first event goes out at once (the agent shows its spinner), then the hold and the
    // rule's delay, then the text paced like a model streaming. Gemini's stream has no opening
    // event: its first chunk is text (a short reply is one chunk, ending the turn), so the hold
    // and the delay come before it (Gemini shows its spinner while it waits).
    let first = match wire {
        Wire::Gemini { .. } => 0,
        Wire::Anthropic | Wire::OpenAi => 1,
    };
    let frames: Vec<(bool, String)> = match wire {
        Wire::Anthropic => messages::reply_events(
            &model,
            choice.thinking.as_deref(),
            &choice.reply,
            choice.tool_use.as_ref(),
            chunk,
        )
        .into_iter()
        .map(|(name, data)| (name == "content_block_delta", messages::sse(name, &data)))
        .collect(),
        // (Thinking is streamed on the Anthropic API only.)
        Wire::OpenAi => {
            openai::reply_events(&model, &choice.reply, choice.tool_use.as_ref(), chunk)
                .into_iter()
                .map(|(name, data)| {
                    (
                        name == "response.output_text.delta",
                        messages::sse(name, &data),
                    )
                })
                .collect()
        }
        // Gemini's stream has no event names and no opening event: the first chunk opens it.
        Wire::Gemini { .. } => gemini::reply_chunks(&choice.reply, choice.tool_use.as_ref(), chunk)
            .into_iter()
            .map(|data| (true, format!("data: {data}\r\n\r\n")))
            .collect(),
    };
    let frames = frames
        .into_iter()
        .enumerate()
        .map(move |(i, (paced, frame))| {
            let wait = match i {
                _ if i == first => choice.delay,
                0 => Duration::ZERO,
                _ if paced => chunk_delay,
                _ => Duration::ZERO,
            };
            (wait, frame)
        })
        .collect::<Vec<_>>();
    let total = frames.len();
    let body = futures_util::stream::unfold(
        (frames.into_iter().enumerate(), Some(finish), Some(hold)),
        move |(mut it, mut finish, mut hold)| async move {
            let (i, (wait, frame)) = it.next()?;
            if i == first {
                if let Some(h) = hold.take() {
                    h().await;
                }
            }
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            if i + 1 == total {
                if let Some(f) = finish.take() {
                    f();
                }
            }
            Some((Ok::<_, std::convert::Infallible>(frame), (it, finish, hold)))
        },
    );
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}
