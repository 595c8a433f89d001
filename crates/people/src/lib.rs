//! People in the loop: a person is an addressable name (`[people.NAME]` in the project's
//! configuration) whose messages go out through adapters (a signed webhook, a Telegram bot),
//! and whose answers come back in as messages from that person, threaded to what they answer.
//!
//! ```text
//!  agent ─SEND to human─► daemon ─DELIVER─► person connection "human" (this crate)
//!                                              ├─► webhook: signed POST, retried, then failed
//!                                              └─► Telegram: sendMessage
//!  Telegram getUpdates / signed POST ─► engage rules ─► SEND from "human" (in_reply_to) ─► agent
//!  live feed ─► notifier (blocked, waiting, dead letters) ─► one short notice, rate-limited
//! ```
//!
//! Each person is one ordinary agent connection on the daemon's socket (`cli: "person"`), so
//! everything the relay promises agents holds for people: stored before acknowledged, delivered
//! once, and a delivery the adapters could not make is acknowledged `failed`, which
//! dead-letters it, tells its sender and feeds the recipient's circuit breaker. The decisions
//! are pure and take the time as an argument: [`sign`] (signatures and replay refusal),
//! [`engage`] (who a chat message is for), [`notify`] (what a person is told, and how often);
//! the rest is a thin shell of tasks around them.

pub mod config;
pub mod engage;
pub mod http;
pub mod notify;
pub mod sign;
pub mod telegram;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use relay_client::{Client, ClientConfig, ClientError, Delivered, Event, Outgoing};
use relay_daemon::Handle;
use relay_protocol::events::RelayEvent;
use relay_protocol::{DeliveryState, TerminalState, now_ms};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

pub use config::PeopleConfig;

/// The `cli` a person's connection gives in HELLO: tools (`agent-relay send --from NAME`) may
/// speak as a connected person, since the person at the terminal is the same person.
pub const PERSON_CLI: &str = relay_protocol::PERSON_CLI;

/// Failures starting the adapters.
#[derive(Debug, thiserror::Error)]
pub enum PeopleError {
    /// A secret file is missing, unreadable or not private.
    #[error("{0}")]
    Secret(String),
    /// An engage pattern does not compile.
    #[error("[adapters.telegram] pattern: {0}")]
    Pattern(String),
}

/// How an adapter is doing, for `agent-relay adapters` and the dashboard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AdapterStatus {
    /// `webhook` or `telegram`.
    pub name: String,
    /// `starting`, `connected` or `failing`.
    pub state: String,
    /// The last error, cleaned (never a secret).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When it last worked (Unix ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_ok: Option<u64>,
    /// Messages and notices sent out.
    pub sent: u64,
    /// Messages taken in and relayed.
    pub received: u64,
    /// Inbound requests refused (bad signature, replay, unknown sender).
    pub refused: u64,
    /// The people it reaches.
    pub people: Vec<String>,
}

/// A SEND a person makes through an adapter.
struct PersonSend {
    msg: Outgoing,
    reply: oneshot::Sender<Result<String, String>>,
}

/// The file, beside the adapters' state file, that keeps the webhook signatures accepted
/// within the tolerance (one `TIMESTAMP SIGNATURE` a line, mode 0600): one line appended per
/// accepted request, the whole rewritten without its stale lines only now and then.
pub const SEEN_FILE: &str = "webhook-seen";

/// The longest a delivery waits in all for peers that ask it to (a 429's `retry_after`)
/// before it counts as failed.
pub const MAX_PEER_WAIT: Duration = Duration::from_secs(600);

/// Keeps an accepted webhook signature in `path` as [`sign::Keep`] says: one line appended
/// (created 0600, synced before the request is acted on), or the file replaced atomically.
fn keep_seen(path: &std::path::Path, keep: &sign::Keep) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    match keep {
        sign::Keep::Append(line) => {
            let new = !path.exists();
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .mode(0o600)
                .open(path)?;
            f.write_all(line.as_bytes())?;
            f.sync_data()?;
            // A new file's name is durable only once its directory is synced.
            match path.parent() {
                Some(dir) if new => std::fs::File::open(dir)?.sync_all(),
                _ => Ok(()),
            }
        }
        sign::Keep::Rewrite(text) => relay_protocol::file::write_atomic(
            path,
            text.as_bytes(),
            relay_protocol::file::Durability::PowerLoss,
        ),
    }
}

/// What a relayed Telegram message was: (agent, message id, thread).
type Relayed = (String, String, Option<String>);

struct Inner {
    cfg: PeopleConfig,
    socket: PathBuf,
    status_file: Option<PathBuf>,
    status: Mutex<BTreeMap<String, AdapterStatus>>,
    webhook_secret: Option<Vec<u8>>,
    verifier: Mutex<Option<sign::Verifier>>,
    /// Where the signatures accepted are kept (beside `status_file`), so that a replay is
    /// refused after a restart too.
    seen_file: Option<PathBuf>,
    bot: Option<telegram::Bot>,
    engage: Mutex<engage::Router>,
    /// (chat, Telegram message id) → the relayed message it carried.
    relayed: Mutex<HashMap<(i64, i64), Relayed>>,
    senders: Mutex<HashMap<String, mpsc::Sender<PersonSend>>>,
    /// Refusals told back in Telegram chats, bounded per chat.
    replies: Mutex<notify::Replies>,
    /// Answers to chats (refusals, their summaries), sent by their own task so that a slow
    /// Bot API never holds the poller.
    reply_tx: mpsc::Sender<(i64, String)>,
    reply_rx: Mutex<Option<mpsc::Receiver<(i64, String)>>>,
}

/// How long a chat's refusals are held back after the first one told, for one summary.
pub const REPLY_WINDOW: Duration = Duration::from_secs(10);

/// The running adapters. Cheap to clone.
#[derive(Clone)]
pub struct Hub {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub").finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these small maps leaves it usable: every change is a
    // single insert or remove.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Hub {
    /// Reads the secrets (refusing files others can read) and prepares the adapters; nothing
    /// runs until [`Hub::start`]. `status_file` (`<data>/adapters.json`) is rewritten (0600)
    /// whenever an adapter's state changes.
    ///
    /// # Errors
    /// [`PeopleError`].
    pub fn new(
        cfg: PeopleConfig,
        socket: PathBuf,
        status_file: Option<PathBuf>,
    ) -> Result<Self, PeopleError> {
        let mut status = BTreeMap::new();
        let reach = |f: &dyn Fn(&config::Person) -> bool| {
            cfg.people
                .iter()
                .filter(|p| f(p))
                .map(|p| p.name.clone())
                .collect::<Vec<_>>()
        };
        let fresh = |name: &str, people: Vec<String>| AdapterStatus {
            name: name.to_owned(),
            state: "starting".into(),
            last_error: None,
            last_ok: None,
            sent: 0,
            received: 0,
            refused: 0,
            people,
        };
        let seen_file = status_file
            .as_ref()
            .and_then(|f| f.parent())
            .map(|d| d.join(SEEN_FILE));
        let (webhook_secret, verifier) = match &cfg.webhook {
            Some(w) => {
                let secret = config::read_secret(&w.secret_file)
                    .map_err(PeopleError::Secret)?
                    .into_bytes();
                status.insert("webhook".into(), fresh("webhook", reach(&|p| p.webhook)));
                let mut verifier = sign::Verifier::new(secret.clone(), w.tolerance_s);
                if let Some(path) = &seen_file {
                    match std::fs::read_to_string(path) {
                        Ok(text) => {
                            let skipped = verifier.load_text(&text, now_ms() / 1000);
                            if skipped > 0 {
                                tracing::warn!(path = %path.display(), skipped, "lines of the webhook's seen signatures were not understood");
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => {
                            return Err(PeopleError::Secret(format!(
                                "cannot read the webhook's seen signatures {}: {e}",
                                path.display()
                            )));
                        }
                    }
                }
                (Some(secret), Some(verifier))
            }
            None => (None, None),
        };
        let (bot, rules, groups) = match &cfg.telegram {
            Some(t) => {
                let token = config::read_secret(&t.token_file).map_err(PeopleError::Secret)?;
                status.insert(
                    "telegram".into(),
                    fresh("telegram", reach(&|p| p.telegram.is_some())),
                );
                let pattern = match &t.pattern {
                    Some((p, agent)) => Some((
                        regex::Regex::new(p).map_err(|e| PeopleError::Pattern(e.to_string()))?,
                        agent.clone(),
                    )),
                    None => None,
                };
                (
                    Some(telegram::Bot::new(t.api.clone(), token)),
                    engage::Rules {
                        mode: t.engage,
                        pattern,
                        senders: t.senders,
                        ignored: t.ignored,
                    },
                    t.groups.clone().into_iter().collect(),
                )
            }
            None => (
                None,
                engage::Rules {
                    mode: engage::EngageMode::Mention,
                    pattern: None,
                    senders: engage::SenderScope::Known,
                    ignored: engage::IgnoredPolicy::Drop,
                },
                HashMap::new(),
            ),
        };
        let people = cfg
            .people
            .iter()
            .filter_map(|p| p.telegram.map(|id| (id, p.name.clone())))
            .collect();
        let (reply_tx, reply_rx) = mpsc::channel(64);
        Ok(Self {
            inner: Arc::new(Inner {
                cfg,
                socket,
                status_file,
                status: Mutex::new(status),
                webhook_secret,
                verifier: Mutex::new(verifier),
                seen_file,
                bot,
                engage: Mutex::new(engage::Router::new(rules, people, groups)),
                relayed: Mutex::new(HashMap::new()),
                senders: Mutex::new(HashMap::new()),
                replies: Mutex::new(notify::Replies::new(REPLY_WINDOW.as_millis() as u64)),
                reply_tx,
                reply_rx: Mutex::new(Some(reply_rx)),
            }),
        })
    }

    /// Starts a connection per person, the Telegram poller and the notifier, on the daemon
    /// `daemon` (whose socket the connections use). They stop when the daemon stops.
    pub fn start(&self, daemon: &Handle) {
        self.write_status();
        // A person with no adapter has no connection here: messages to them wait in their
        // mailbox in the store (`agent-relay inbox`, the dashboard).
        for person in self.inner.cfg.people.clone() {
            if !person.reachable() {
                continue;
            }
            let (tx, rx) = mpsc::channel(64);
            lock(&self.inner.senders).insert(person.name.clone(), tx);
            tokio::spawn(self.clone().person(person, rx, daemon.clone()));
        }
        if self.inner.bot.is_some() {
            tokio::spawn(self.clone().poll_telegram(daemon.clone()));
            if let Some(rx) = lock(&self.inner.reply_rx).take() {
                tokio::spawn(self.clone().replier(rx, daemon.clone()));
            }
        }
        // Subscribed now, before any agent can connect and block, so nothing is missed.
        let feed = daemon.subscribe();
        tokio::spawn(self.clone().notifier(feed, daemon.clone()));
    }

    /// Every adapter's state.
    pub fn adapters(&self) -> Vec<AdapterStatus> {
        lock(&self.inner.status).values().cloned().collect()
    }

    fn update(&self, adapter: &str, f: impl FnOnce(&mut AdapterStatus)) {
        let changed = {
            let mut all = lock(&self.inner.status);
            let Some(s) = all.get_mut(adapter) else {
                return;
            };
            let before = s.clone();
            f(s);
            // Written on every change: changes come with messages to and from people and
            // with adapter failures, never with agents' own traffic.
            before != *s
        };
        if changed {
            self.write_status();
        }
    }

    fn ok(&self, adapter: &str) {
        self.update(adapter, |s| {
            s.state = "connected".into();
            s.last_error = None;
            s.last_ok = Some(now_ms());
        });
    }

    fn failing(&self, adapter: &str, e: &str) {
        tracing::warn!(adapter, error = %e, "adapter failing");
        self.update(adapter, |s| {
            s.state = "failing".into();
            s.last_error = Some(relay_protocol::text::one_line(e, 300));
        });
    }

    fn write_status(&self) {
        let Some(path) = &self.inner.status_file else {
            return;
        };
        let text = match relay_protocol::text::json_pretty(&json!({ "adapters": self.adapters() }))
        {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "cannot encode the adapters' state");
                return;
            }
        };
        if let Err(e) = relay_protocol::file::write_atomic(
            path,
            text.as_bytes(),
            relay_protocol::file::Durability::ProcessCrash,
        ) {
            tracing::warn!(error = %e, path = %path.display(), "cannot write the adapters' state");
        }
    }

    /// One person's connection: takes their messages to the adapters and their adapters'
    /// messages to the relay.
    async fn person(
        self,
        person: config::Person,
        mut sends: mpsc::Receiver<PersonSend>,
        daemon: Handle,
    ) {
        let mut cfg = ClientConfig::agent(&self.inner.socket, &person.name);
        cfg.cli = Some(PERSON_CLI.to_owned());
        // One message at a time: a person reads in order, and a retry holds the next back.
        cfg.max_inflight = 1;
        let mut client = loop {
            match Client::connect(cfg.clone()).await {
                Ok(c) => break c,
                Err(e) => {
                    tracing::warn!(person = %person.name, error = %e, "person cannot connect yet");
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_millis(200)) => {}
                        () = daemon.stopped() => return,
                    }
                }
            }
        };
        tracing::info!(person = %person.name, "person connected");
        // Handing messages to the adapters (slow, retried, waiting out a 429) runs on its own
        // task: what the person sends meanwhile goes in at once.
        let (out_tx, out_rx) = mpsc::channel::<Delivered>(4);
        let (done_tx, mut done) = mpsc::channel::<(Delivered, Result<(), String>)>(4);
        let worker = tokio::spawn(self.clone().outbound(person.clone(), out_rx, done_tx));
        loop {
            tokio::select! {
                ev = client.next_event() => match ev {
                    Some(Event::Message(d)) => {
                        if out_tx.send(d).await.is_err() {
                            tracing::error!(person = %person.name, "the adapters' task ended; the relay will deliver the message again");
                            return;
                        }
                    }
                    Some(_) => {}
                    None => return,
                },
                Some((d, handed)) = done.recv() => {
                    let acked = match handed {
                        Ok(()) => client.ack(&d, Some(DeliveryState::Verified)).await,
                        Err(e) => {
                            tracing::warn!(person = %person.name, id = %d.id, error = %e, "could not reach the person: failed (dead-lettered)");
                            client.ack_failed(&d, &relay_protocol::text::one_line(&e, 400)).await
                        }
                    };
                    if let Err(e) = acked {
                        tracing::warn!(id = %d.id, error = %e, "acknowledgement not sent: the relay will deliver it again");
                    }
                }
                Some(mut send) = sends.recv() => {
                    // An answer belongs to the thread of what it answers (or starts it there).
                    if send.msg.payload.thread.is_none()
                        && let Some(parent) = send.msg.payload.in_reply_to.clone()
                    {
                        let asker = send.msg.to.clone();
                        send.msg.payload.thread = Some(thread_of(&client, parent, asker).await);
                    }
                    match client.send_nowait(send.msg).await {
                        Ok((id, pending)) => {
                            tokio::spawn(async move {
                                // Bounded: the request that waits for this is answered.
                                let limit = relay_client::request_timeout_from_env();
                                let r = match tokio::time::timeout(limit, pending.wait()).await {
                                    Ok(Ok(_)) => Ok(id),
                                    Ok(Err(ClientError::Rejected { reason, .. })) => Err(reason),
                                    Ok(Err(e)) => Err(e.to_string()),
                                    Err(_) => Err(format!(
                                        "the relay did not answer within {} s; the message may still be stored",
                                        limit.as_secs()
                                    )),
                                };
                                if send.reply.send(r).is_err() {
                                    tracing::debug!("nobody waits for a person's receipt");
                                }
                            });
                        }
                        Err(e) => {
                            if send.reply.send(Err(e.to_string())).is_err() {
                                tracing::debug!("nobody waits for a person's receipt");
                            }
                        }
                    }
                }
                () = daemon.stopped() => {
                    worker.abort();
                    client.close().await;
                    return;
                }
            }
        }
    }

    /// Hands each message to the person's adapters, in order, and says how it went.
    async fn outbound(
        self,
        person: config::Person,
        mut rx: mpsc::Receiver<Delivered>,
        done: mpsc::Sender<(Delivered, Result<(), String>)>,
    ) {
        while let Some(d) = rx.recv().await {
            let handed = self.deliver(&person, &d).await;
            if done.send((d, handed)).await.is_err() {
                return;
            }
        }
    }

    /// Sends a SEND as `person`; the message id, or why it was refused.
    async fn send_as(&self, person: &str, msg: Outgoing) -> Result<String, String> {
        let tx = lock(&self.inner.senders)
            .get(person)
            .cloned()
            .ok_or_else(|| format!("{person} is not a declared person"))?;
        let (reply, answer) = oneshot::channel();
        tx.send(PersonSend { msg, reply })
            .await
            .map_err(|_| "the relay is stopping".to_owned())?;
        answer
            .await
            .map_err(|_| "the relay is stopping".to_owned())?
    }

    /// Hands a message to every channel of `person`; fine when at least one took it (a
    /// channel that failed is logged and shown in `agent-relay adapters`).
    async fn deliver(&self, person: &config::Person, d: &Delivered) -> Result<(), String> {
        let mut errors = Vec::new();
        let mut reached = false;
        if let (Some(chat), Some(bot)) = (person.telegram, &self.inner.bot) {
            let short = relay_protocol::short_id(&d.id);
            let text = format!("{} [{short}]: {}", d.from, d.payload.body);
            match self.send_telegram(bot, chat, &text).await {
                Ok(ids) => {
                    reached = true;
                    // A reply to any piece answers the message.
                    let mut relayed = lock(&self.inner.relayed);
                    for mid in ids {
                        relayed.insert(
                            (chat, mid),
                            (d.from.clone(), d.id.clone(), d.payload.thread.clone()),
                        );
                    }
                    drop(relayed);
                    lock(&self.inner.engage).note_relayed(chat, &d.from);
                }
                Err(e) => errors.push(format!("telegram: {e}")),
            }
        }
        if person.webhook {
            let body = json!({
                "type": "message",
                "id": d.id,
                "from": d.from,
                "to": person.name,
                "body": d.payload.body,
                "thread": d.payload.thread,
                "in_reply_to": d.payload.in_reply_to,
                "ts": d.ts,
            })
            .to_string();
            match self
                .retrying("webhook", || self.post_webhook(body.clone()))
                .await
            {
                Ok(()) => reached = true,
                Err(e) => errors.push(format!("webhook: {e}")),
            }
        }
        if reached {
            if !errors.is_empty() {
                tracing::warn!(person = %person.name, id = %d.id, errors = %errors.join("; "), "one of the person's channels did not take the message; another did");
            }
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }

    /// Sends `text` to a Telegram chat, in as many pieces as Telegram's limit needs, each
    /// retried as the Bot API says; the ids of the messages sent.
    async fn send_telegram(
        &self,
        bot: &telegram::Bot,
        chat: i64,
        text: &str,
    ) -> Result<Vec<i64>, String> {
        let mut ids = Vec::new();
        for piece in telegram::split_text(text) {
            let id = self.retrying("telegram", || bot.send(chat, &piece)).await?;
            ids.push(id);
        }
        Ok(ids)
    }

    /// Runs `attempt` up to the configured number of times with doubling delays, keeping the
    /// adapter's state. A refusal that trying again cannot change (a 4xx other than 408 and
    /// 429) ends at once with the peer's reason; a peer that asks to wait (429 with
    /// `retry_after`) is waited for, without using up an attempt, up to [`MAX_PEER_WAIT`] in
    /// all.
    async fn retrying<T, F, Fut>(&self, adapter: &str, mut attempt: F) -> Result<T, String>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, http::HttpError>>,
    {
        let (tries, mut delay) = self
            .inner
            .cfg
            .webhook
            .as_ref()
            .map_or((4, 500), |w| (w.attempts, w.backoff_ms));
        let mut last = String::new();
        let mut waited = Duration::ZERO;
        let mut n = 0;
        while n < tries {
            match attempt().await {
                Ok(v) => {
                    self.ok(adapter);
                    self.update(adapter, |s| s.sent += 1);
                    return Ok(v);
                }
                Err(e) if e.is_permanent() => {
                    self.failing(adapter, &e.to_string());
                    return Err(format!("{e} (refused by the peer; not retried)"));
                }
                Err(e) => {
                    self.failing(adapter, &e.to_string());
                    last = e.to_string();
                    if let Some(wait) = e.retry_after()
                        && waited + wait <= MAX_PEER_WAIT
                    {
                        tracing::info!(
                            adapter,
                            wait_s = wait.as_secs(),
                            "the peer asked to wait before trying again"
                        );
                        waited += wait;
                        tokio::time::sleep(wait).await;
                        continue;
                    }
                    n += 1;
                    if n < tries {
                        tokio::time::sleep(Duration::from_millis(delay)).await;
                        delay = delay.saturating_mul(2).min(60_000);
                    }
                }
            }
        }
        Err(format!("{last} (after {tries} attempts)"))
    }

    async fn post_webhook(&self, body: String) -> Result<(), http::HttpError> {
        let (Some(w), Some(secret)) = (&self.inner.cfg.webhook, &self.inner.webhook_secret) else {
            return Err(http::HttpError::Url("no webhook configured".into()));
        };
        let ts = now_ms() / 1000;
        let headers = [
            (sign::TIMESTAMP_HEADER, ts.to_string()),
            (
                sign::SIGNATURE_HEADER,
                sign::header_value(secret, ts, body.as_bytes()),
            ),
        ];
        let (status, answer) =
            http::post_json(&w.url, &headers, body.into_bytes(), Duration::from_secs(10)).await?;
        if (200..300).contains(&status) {
            return Ok(());
        }
        Err(http::HttpError::Status {
            status,
            reason: relay_protocol::text::one_line(&String::from_utf8_lossy(&answer), 200),
            retry_after: None,
        })
    }

    /// An inbound webhook request (the dashboard's listener hands it over): checked, then sent
    /// as a message from the person it names. The HTTP status and JSON answer.
    pub async fn inbound_webhook(
        &self,
        timestamp: Option<&str>,
        signature: Option<&str>,
        body: &[u8],
    ) -> (u16, Value) {
        let refused = |hub: &Self, status: u16, why: String| {
            tracing::warn!(status, why = %why, "inbound webhook refused; nothing stored");
            hub.update("webhook", |s| s.refused += 1);
            (status, json!({ "error": why }))
        };
        // The signature is kept before anything is sent, so that after a restart the same
        // request is still refused; under the verifier's lock, so that a rewrite of the kept
        // file never races an append to it.
        let kept = {
            let mut guard = lock(&self.inner.verifier);
            let Some(v) = guard.as_mut() else {
                return (404, json!({"error": "no webhook adapter is configured"}));
            };
            match v.verify_and_keep(timestamp, signature, body, now_ms() / 1000) {
                Ok(keep) => match &self.inner.seen_file {
                    Some(path) => keep_seen(path, &keep).map_err(|e| (path.clone(), e)),
                    None => Ok(()),
                },
                Err(e) => {
                    drop(guard);
                    let status = if e == sign::Refusal::Replayed {
                        409
                    } else {
                        401
                    };
                    return refused(self, status, e.to_string());
                }
            }
        };
        if let Err((path, e)) = kept {
            tracing::error!(path = %path.display(), error = %e, "cannot keep the webhook's seen signatures");
            return (
                503,
                json!({"error": "the relay cannot record the request's signature; nothing was sent, try again later"}),
            );
        }
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct In {
            from: String,
            to: String,
            body: String,
            #[serde(default)]
            id: Option<String>,
            #[serde(default)]
            in_reply_to: Option<String>,
            #[serde(default)]
            thread: Option<String>,
        }
        let msg: In = match serde_json::from_slice(body) {
            Ok(m) => m,
            Err(e) => {
                return refused(
                    self,
                    400,
                    format!("expected {{from, to, body[, id, in_reply_to, thread]}}: {e}"),
                );
            }
        };
        if !self
            .inner
            .cfg
            .people
            .iter()
            .any(|p| p.webhook && p.name == msg.from)
        {
            return refused(
                self,
                403,
                format!(
                    "unknown sender {:?}: not a person with webhook = true",
                    relay_protocol::text::one_line(&msg.from, 60)
                ),
            );
        }
        let mut out = Outgoing::new(msg.to, msg.body);
        out.id = msg.id;
        out.payload.in_reply_to = msg.in_reply_to;
        out.payload.thread = msg.thread;
        match self.send_as(&msg.from, out).await {
            Ok(id) => {
                self.update("webhook", |s| s.received += 1);
                (202, json!({ "id": id }))
            }
            Err(why) => (422, json!({ "error": why })),
        }
    }

    /// Long-polls the bot's updates and relays what declared people write.
    async fn poll_telegram(self, daemon: Handle) {
        let Some(bot) = self.inner.bot.clone() else {
            return;
        };
        let wait = Duration::from_secs(
            self.inner
                .cfg
                .telegram
                .as_ref()
                .map_or(25, |t| t.poll_timeout_s),
        );
        let mut offset = 0;
        let mut backoff = relay_client::Backoff::default();
        loop {
            let got = tokio::select! {
                r = bot.updates(offset, wait) => r,
                () = daemon.stopped() => return,
            };
            match got {
                Ok(updates) => {
                    self.ok("telegram");
                    backoff = relay_client::Backoff::default();
                    for u in updates {
                        offset = offset.max(u.update_id + 1);
                        if let Some(m) = u.message {
                            self.on_telegram(m).await;
                        }
                    }
                    let due = lock(&self.inner.replies).due(now_ms());
                    for (chat, text) in due {
                        self.queue_reply(chat, text);
                    }
                }
                Err(e) => {
                    self.failing("telegram", &e.to_string());
                    let delay = backoff.next_delay(rand_draw());
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        () = daemon.stopped() => return,
                    }
                }
            }
        }
    }

    /// Sends the chat answers queued by [`Hub::queue_reply`], one after the other.
    async fn replier(self, mut rx: mpsc::Receiver<(i64, String)>, daemon: Handle) {
        let Some(bot) = self.inner.bot.clone() else {
            return;
        };
        loop {
            let (chat, text) = tokio::select! {
                r = rx.recv() => match r {
                    Some(r) => r,
                    None => return,
                },
                () = daemon.stopped() => return,
            };
            if let Err(e) = self.send_telegram(&bot, chat, &text).await {
                tracing::warn!(chat, error = %e, "cannot tell the chat a message was not sent");
            }
        }
    }

    /// Queues an answer to a chat; when the queue is full (the Bot API is that slow) the
    /// answer is logged instead.
    fn queue_reply(&self, chat: i64, text: String) {
        if let Err(e) = self.inner.reply_tx.try_send((chat, text)) {
            let (mpsc::error::TrySendError::Full((_, text))
            | mpsc::error::TrySendError::Closed((_, text))) = e;
            tracing::warn!(chat, text = %relay_protocol::text::one_line(&text, 200), "answer to the chat not sent: too many waiting");
        }
    }

    /// Tells `person` (in their own private chat, never in a group: a refusal can name
    /// agents) that what they wrote was not sent, bounded by [`REPLY_WINDOW`].
    fn refuse_to(&self, person: &str, text: String) {
        let Some(chat) = self
            .inner
            .cfg
            .people
            .iter()
            .find(|p| p.name == person)
            .and_then(|p| p.telegram)
        else {
            tracing::warn!(person, text = %text, "a refusal for a person without a Telegram chat");
            return;
        };
        let now = lock(&self.inner.replies).refusal(chat, text, now_ms());
        if let Some(text) = now {
            self.queue_reply(chat, text);
        }
    }

    async fn on_telegram(&self, m: telegram::Message) {
        let (Some(user), Some(text)) = (m.from.as_ref().map(|u| u.id), m.text.as_deref()) else {
            return;
        };
        let original = m.reply_to_message.as_deref();
        let reply_to = original.and_then(|r| {
            lock(&self.inner.relayed)
                .get(&(m.chat.id, r.message_id))
                .cloned()
        });
        // Not remembered (relayed before a restart): its text still names the agent.
        let from_text = original
            .and_then(|r| r.text.as_deref())
            .and_then(engage::relayed_from);
        let decision = lock(&self.inner.engage).decide(&engage::Incoming {
            user,
            chat: m.chat.id,
            text,
            reply_to: match (&reply_to, from_text) {
                (Some((a, id, t)), _) => Some((a.as_str(), Some(id.as_str()), t.as_deref())),
                (None, Some(agent)) => Some((agent, None, None)),
                (None, None) => None,
            },
        });
        match decision {
            engage::Decision::Send {
                person,
                to,
                body,
                in_reply_to,
                thread,
            } => {
                let mut out = Outgoing::new(to.clone(), body);
                // The update's identity makes a re-read update a duplicate, not a second message.
                // (A group's id is negative: `tg-100-5` and `tg100-5` are different chats.)
                out.id = Some(format!("tg{}-{}", m.chat.id, m.message_id));
                out.payload.in_reply_to = in_reply_to;
                out.payload.thread = thread;
                match self.send_as(&person, out).await {
                    Ok(_) => self.update("telegram", |s| s.received += 1),
                    Err(why) => {
                        tracing::warn!(person = %person, to = %to, why = %why, "a person's Telegram message was not sent");
                        self.refuse_to(&person, format!("relay: not sent to {to}: {why}"));
                    }
                }
            }
            engage::Decision::Refuse(why) => {
                tracing::warn!(user, chat = m.chat.id, why = %why, "Telegram message refused; nothing stored");
                self.update("telegram", |s| s.refused += 1);
            }
            engage::Decision::Ignore => {
                tracing::debug!(
                    chat = m.chat.id,
                    "Telegram message for no agent under the engage mode; dropped"
                );
            }
        }
    }

    /// Sends a notice straight to a person's channels (not stored as a message: a notice about
    /// the relay must not itself become something to notify about).
    async fn notice(&self, person: &str, text: &str) {
        let Some(p) = self.inner.cfg.people.iter().find(|p| p.name == person) else {
            return;
        };
        // What a notice quotes (an agent's screen, a peer's reason) may hold escape sequences.
        let text = relay_protocol::text::for_terminal(text);
        let text = text.as_str();
        if let (Some(chat), Some(bot)) = (p.telegram, &self.inner.bot) {
            // `send_telegram` counts what it sends and keeps the adapter's state.
            if let Err(e) = self.send_telegram(bot, chat, text).await {
                self.failing("telegram", &format!("notice: {e}"));
            }
        }
        if p.webhook {
            let body =
                json!({"type": "notice", "to": person, "body": text, "ts": now_ms()}).to_string();
            match self.post_webhook(body).await {
                Ok(()) => self.update("webhook", |s| s.sent += 1),
                Err(e) => self.failing("webhook", &format!("notice: {e}")),
            }
        }
    }

    /// Turns the live feed into notices.
    async fn notifier(self, mut feed: relay_daemon::Subscription, daemon: Handle) {
        let wants = self
            .inner
            .cfg
            .people
            .iter()
            .map(|p| notify::Wants {
                person: p.name.clone(),
                kinds: p.notify.clone(),
                blocked_after_ms: p.blocked_after_s.saturating_mul(1000),
                waiting_after_ms: p.waiting_after_s.saturating_mul(1000),
                mirror: p.mirror,
            })
            .collect();
        let mut core = notify::Notifier::new(wants, 10 * 60 * 1000);
        loop {
            let due = core.next_due();
            let wake = async {
                match due {
                    // A moment later than due: what comes due together (agents blocked by
                    // one event) is told in one notice.
                    Some(at) => {
                        tokio::time::sleep(Duration::from_millis(
                            at.saturating_sub(now_ms()) + GATHER_MS,
                        ))
                        .await
                    }
                    None => std::future::pending().await,
                }
            };
            let notices = tokio::select! {
                ev = feed.recv() => match ev {
                    Some(ev) => match &*ev {
                        RelayEvent::Expired { deliveries, .. } => {
                            let dead = self.expired(&daemon, *deliveries).await;
                            core.hear_all(dead, now_ms())
                        }
                        ev => match heard(ev) {
                            Some(h) => core.hear(h, now_ms()),
                            None => continue,
                        },
                    },
                    None => return,
                },
                () = wake => core.tick(now_ms()),
                () = daemon.stopped() => return,
            };
            for n in notices {
                tracing::info!(person = %n.person, kind = ?n.kind, "notice");
                self.notice(&n.person, &n.text).await;
            }
        }
    }
}

/// How long after a notice is due the notifier waits for others due with it.
const GATHER_MS: u64 = 500;

impl Hub {
    /// The dead letters of `count` deliveries that just expired (the newest expired entries
    /// of the dead-letter queue), as the notifier hears them; when the queue cannot be read,
    /// one that says how many.
    async fn expired(&self, daemon: &Handle, count: u64) -> Vec<notify::Heard> {
        let limit = u32::try_from(count.clamp(1, 200)).unwrap_or(200);
        let asked = daemon
            .ask(relay_protocol::query::QueryRequest::DlqList {
                all: false,
                limit: Some(limit),
            })
            .await;
        match asked.map(|a| a.result) {
            Ok(relay_protocol::query::QueryResult::DlqList { dead_letters }) => dead_letters
                .into_iter()
                .filter(|d| d.code == "expired")
                .take(usize::try_from(count).unwrap_or(usize::MAX))
                .map(|d| notify::Heard::Dead {
                    id: d.msg_id,
                    from: d.from,
                    why: format!("{} did not take it in time (expired)", d.recipient),
                })
                .collect(),
            other => {
                tracing::warn!(?other, "cannot read which deliveries expired");
                vec![notify::Heard::Dead {
                    id: String::new(),
                    from: "relay".into(),
                    why: format!("{count} deliveries expired"),
                }]
            }
        }
    }
}

/// The part of a live event the notifier hears.
fn heard(ev: &RelayEvent) -> Option<notify::Heard> {
    match ev {
        RelayEvent::AgentState {
            agent, state, why, ..
        } => Some(notify::Heard::AgentState {
            agent: agent.clone(),
            blocked: (*state == TerminalState::Blocked)
                .then(|| why.clone().unwrap_or_else(|| "blocked".into())),
        }),
        RelayEvent::AgentDisconnected { agent, .. } => Some(notify::Heard::Gone {
            agent: agent.clone(),
        }),
        RelayEvent::Accepted {
            from,
            recipients,
            id,
            body,
            ..
        } if recipients.len() == 1 => Some(notify::Heard::Message {
            from: from.clone(),
            to: recipients[0].clone(),
            id: id.clone(),
            preview: relay_protocol::text::one_line(body, 60),
        }),
        RelayEvent::Acked {
            id,
            recipient,
            state: relay_protocol::DeliveryStatus::Failed,
            ..
        } => Some(notify::Heard::Dead {
            id: id.clone(),
            from: recipient.clone(),
            why: format!("{recipient} could not take it"),
        }),
        RelayEvent::Refused {
            id,
            from,
            code,
            reason,
            ..
        } if matches!(
            code.as_str(),
            "forbidden" | "rate_limited" | "budget_exceeded"
        ) =>
        {
            Some(notify::Heard::Dead {
                id: id.clone(),
                from: from.clone(),
                why: format!("{code}: {}", relay_protocol::text::one_line(reason, 120)),
            })
        }
        _ => None,
    }
}

/// A uniform draw in [0, 1) for the backoff's jitter, from the clock's low bits (no `rand`
/// needed for a jitter).
#[expect(
    clippy::disallowed_methods,
    reason = "a jitter's seed from the clock's nanoseconds, not a time the code acts on"
)]
fn rand_draw() -> f64 {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    f64::from(n % 1000) / 1000.0
}

/// The thread an answer to message `parent` belongs to: `parent`'s own thread, or `parent`
/// itself when it started none (or cannot be read: the answer still names it). `asker`: who
/// sent `parent` (the answer's recipient), so that an id two senders chose names one message.
async fn thread_of(client: &Client, parent: String, asker: Option<String>) -> String {
    match client
        .query(relay_protocol::query::QueryRequest::Read {
            id: parent.clone(),
            from: asker,
        })
        .await
    {
        Ok(relay_protocol::query::QueryResult::Read { message }) => {
            message.thread.unwrap_or(message.id)
        }
        Ok(other) => {
            tracing::debug!(?other, %parent, "the message answered cannot be read; its id is the thread");
            parent
        }
        Err(e) => {
            tracing::warn!(error = %e, %parent, "the message answered cannot be read; its id is the thread");
            parent
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_notifier_hears_blocked_states_single_messages_and_dead_letters() {
        let state = |state, why: Option<&str>| RelayEvent::AgentState {
            ts: 1,
            agent: "Dora".into(),
            backend: "pty".into(),
            state,
            why: why.map(str::to_owned),
        };
        assert_eq!(
            heard(&state(TerminalState::Blocked, Some("dialog open: allow?"))),
            Some(notify::Heard::AgentState {
                agent: "Dora".into(),
                blocked: Some("dialog open: allow?".into())
            })
        );
        assert_eq!(
            heard(&state(TerminalState::Busy, Some("printing"))),
            Some(notify::Heard::AgentState {
                agent: "Dora".into(),
                blocked: None
            })
        );
        let refused = |code: &str| RelayEvent::Refused {
            ts: 1,
            id: "m1".into(),
            from: "Alice".into(),
            code: code.into(),
            reason: "why".into(),
        };
        assert!(matches!(
            heard(&refused("rate_limited")),
            Some(notify::Heard::Dead { .. })
        ));
        assert_eq!(heard(&refused("unknown_target")), None, "not dead-lettered");
        let acked = RelayEvent::Acked {
            ts: 1,
            id: "m2".into(),
            pos: 3,
            recipient: "human".into(),
            state: relay_protocol::DeliveryStatus::Failed,
        };
        assert!(matches!(heard(&acked), Some(notify::Heard::Dead { from, .. }) if from == "human"));
    }
}
