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

/// What a relayed Telegram message was: (agent, message id, thread).
type Relayed = (String, String, Option<String>);

struct Inner {
    cfg: PeopleConfig,
    socket: PathBuf,
    status_file: Option<PathBuf>,
    status: Mutex<BTreeMap<String, AdapterStatus>>,
    webhook_secret: Option<Vec<u8>>,
    verifier: Mutex<Option<sign::Verifier>>,
    bot: Option<telegram::Bot>,
    engage: Mutex<engage::Router>,
    /// (chat, Telegram message id) → the relayed message it carried.
    relayed: Mutex<HashMap<(i64, i64), Relayed>>,
    senders: Mutex<HashMap<String, mpsc::Sender<PersonSend>>>,
}

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
        let (webhook_secret, verifier) = match &cfg.webhook {
            Some(w) => {
                let secret = config::read_secret(&w.secret_file)
                    .map_err(PeopleError::Secret)?
                    .into_bytes();
                status.insert("webhook".into(), fresh("webhook", reach(&|p| p.webhook)));
                (
                    Some(secret.clone()),
                    Some(sign::Verifier::new(secret, w.tolerance_s)),
                )
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
        Ok(Self {
            inner: Arc::new(Inner {
                cfg,
                socket,
                status_file,
                status: Mutex::new(status),
                webhook_secret,
                verifier: Mutex::new(verifier),
                bot,
                engage: Mutex::new(engage::Router::new(rules, people, groups)),
                relayed: Mutex::new(HashMap::new()),
                senders: Mutex::new(HashMap::new()),
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
        loop {
            tokio::select! {
                ev = client.next_event() => match ev {
                    Some(Event::Message(d)) => {
                        let state = match self.deliver(&person, &d).await {
                            Ok(()) => DeliveryState::Verified,
                            Err(e) => {
                                tracing::warn!(person = %person.name, id = %d.id, error = %e, "could not reach the person: failed (dead-lettered)");
                                DeliveryState::Failed
                            }
                        };
                        if let Err(e) = client.ack(&d, Some(state)).await {
                            tracing::warn!(id = %d.id, error = %e, "acknowledgement not sent: the relay will deliver it again");
                        }
                    }
                    Some(_) => {}
                    None => return,
                },
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
                                let r = match pending.wait().await {
                                    Ok(_) => Ok(id),
                                    Err(ClientError::Rejected { reason, .. }) => Err(reason),
                                    Err(e) => Err(e.to_string()),
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
                    client.close().await;
                    return;
                }
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

    /// Hands a message to every channel of `person`; fine when at least one took it.
    async fn deliver(&self, person: &config::Person, d: &Delivered) -> Result<(), String> {
        let mut errors = Vec::new();
        let mut reached = false;
        if let (Some(chat), Some(bot)) = (person.telegram, &self.inner.bot) {
            let short = relay_protocol::short_id(&d.id);
            let text = format!("{} [{short}]: {}", d.from, d.payload.body);
            match self
                .retrying("telegram", || async {
                    bot.send(chat, &text).await.map_err(|e| e.to_string())
                })
                .await
            {
                Ok(mid) => {
                    reached = true;
                    lock(&self.inner.relayed).insert(
                        (chat, mid),
                        (d.from.clone(), d.id.clone(), d.payload.thread.clone()),
                    );
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
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }

    /// Runs `attempt` up to the configured number of times with doubling delays, keeping the
    /// adapter's state.
    async fn retrying<T, F, Fut>(&self, adapter: &str, mut attempt: F) -> Result<T, String>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, String>>,
    {
        let (tries, mut delay) = self
            .inner
            .cfg
            .webhook
            .as_ref()
            .map_or((4, 500), |w| (w.attempts, w.backoff_ms));
        let mut last = String::new();
        for n in 1..=tries {
            match attempt().await {
                Ok(v) => {
                    self.ok(adapter);
                    self.update(adapter, |s| s.sent += 1);
                    return Ok(v);
                }
                Err(e) => {
                    self.failing(adapter, &e);
                    last = e;
                    if n < tries {
                        tokio::time::sleep(Duration::from_millis(delay)).await;
                        delay = delay.saturating_mul(2).min(60_000);
                    }
                }
            }
        }
        Err(format!("{last} (after {tries} attempts)"))
    }

    async fn post_webhook(&self, body: String) -> Result<(), String> {
        let (Some(w), Some(secret)) = (&self.inner.cfg.webhook, &self.inner.webhook_secret) else {
            return Err("no webhook configured".into());
        };
        let ts = now_ms() / 1000;
        let headers = [
            (sign::TIMESTAMP_HEADER, ts.to_string()),
            (
                sign::SIGNATURE_HEADER,
                sign::header_value(secret, ts, body.as_bytes()),
            ),
        ];
        match http::post_json(&w.url, &headers, body.into_bytes(), Duration::from_secs(10)).await {
            Ok((status, _)) if (200..300).contains(&status) => Ok(()),
            Ok((status, _)) => Err(format!("HTTP {status}")),
            Err(e) => Err(e.to_string()),
        }
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
        let checked = match lock(&self.inner.verifier).as_mut() {
            Some(v) => v.verify(timestamp, signature, body, now_ms() / 1000),
            None => return (404, json!({"error": "no webhook adapter is configured"})),
        };
        if let Err(e) = checked {
            let status = if e == sign::Refusal::Replayed {
                409
            } else {
                401
            };
            return refused(self, status, e.to_string());
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
                            self.on_telegram(&bot, m).await;
                        }
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

    async fn on_telegram(&self, bot: &telegram::Bot, m: telegram::Message) {
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
                        let text = format!("relay: not sent to {to}: {why}");
                        if let Err(e) = bot.send(m.chat.id, &text).await {
                            tracing::warn!(error = %e, "cannot tell the chat a message was not sent");
                        }
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
        if let (Some(chat), Some(bot)) = (p.telegram, &self.inner.bot) {
            match bot.send(chat, text).await {
                Ok(_) => self.update("telegram", |s| s.sent += 1),
                Err(e) => self.failing("telegram", &format!("notice: {e}")),
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
            })
            .collect();
        let mut core = notify::Notifier::new(wants, 10 * 60 * 1000);
        loop {
            let due = core.next_due();
            let wake = async {
                match due {
                    Some(at) => {
                        tokio::time::sleep(Duration::from_millis(at.saturating_sub(now_ms()))).await
                    }
                    None => std::future::pending().await,
                }
            };
            let notices = tokio::select! {
                ev = feed.recv() => match ev {
                    Some(ev) => match heard(&ev) {
                        Some(h) => core.hear(h, now_ms()),
                        None => continue,
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
            ..
        } if recipients.len() == 1 => Some(notify::Heard::Message {
            from: from.clone(),
            to: recipients[0].clone(),
            id: id.clone(),
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
