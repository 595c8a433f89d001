//! A mailbox door: a connection that holds a name (an agent's, for `agent-relay mcp`; a
//! person's, for `agent-relay inbox`) and keeps the relay's deliveries unacknowledged until
//! the door shows them (to a model, to a person), oldest first; each shown one is then
//! acknowledged verified with the door's name, which `trace` prints. Nothing about what was
//! shown is kept in this process: the store's acknowledgements are the record, so whatever a
//! door held when it stopped is handed over again by the next one (or by the agent's wrapper).

use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use relay_client::{Client, ClientConfig, ClientError, Delivered, Event};
use relay_protocol::ErrorCode;
use relay_protocol::query::{QueryRequest, QueryResult};

/// Deliveries a mailbox accepts at once (the relay's window for it).
const WINDOW: u32 = 256;
/// How long [`Mailbox::take`] waits for the deliveries the relay still has to hand over (the
/// catch-up right after the door connected), at most.
const CATCH_UP: Duration = Duration::from_secs(3);

/// The deliveries held, in the order the relay handed them over (store order, oldest first).
#[derive(Default)]
struct Held {
    messages: Mutex<VecDeque<Delivered>>,
    /// Woken at each delivery.
    arrived: tokio::sync::Notify,
    /// Acknowledged by this door since it connected.
    acked: AtomicU64,
}

impl Held {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Delivered>> {
        // A panic while holding the lock leaves a queue that is still whole.
        self.messages.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A door holding `name`'s deliveries.
pub(crate) struct Mailbox {
    name: String,
    client: Client,
    held: Arc<Held>,
    reader: tokio::task::JoinHandle<()>,
}

impl Mailbox {
    /// Connects as `name` (saying `cli` in HELLO) when no one holds the name; `None` when a
    /// connection already does (a wrapper, the person's adapters, another door). `patient`:
    /// wait a moment for a name that is held to come free, as a door restarting under its old
    /// name must (the relay may not have seen its previous connection close yet); otherwise a
    /// name online now is given up at once.
    pub(crate) async fn open(
        socket: &Path,
        name: &str,
        cli: &str,
        reconnect: bool,
        patient: bool,
    ) -> Result<Option<Self>, ClientError> {
        if !patient {
            let tool = Client::connect(ClientConfig::tool(socket.to_path_buf(), "cli")).await?;
            let agents = tool.query(QueryRequest::Agents).await;
            tool.close().await;
            if let QueryResult::Agents { agents } = agents?
                && agents.iter().any(|a| a.name == name && a.online)
            {
                return Ok(None);
            }
        }
        let cfg = ClientConfig {
            cli: Some(cli.to_owned()),
            max_inflight: WINDOW,
            reconnect,
            ..ClientConfig::agent(socket.to_path_buf(), name)
        };
        let mut client = match Client::connect(cfg).await {
            Ok(c) => c,
            Err(ClientError::Refused {
                code: ErrorCode::NameInUse,
                ..
            }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut events = client.take_events();
        let held = Arc::new(Held::default());
        let holder = Arc::clone(&held);
        let reader = tokio::spawn(async move {
            while let Some(event) = events.next().await {
                if let Event::Message(msg) = event {
                    // Not acknowledged: only a door's showing of it hands it over.
                    holder.lock().push_back(msg);
                    holder.arrived.notify_waiters();
                }
            }
        });
        Ok(Some(Self {
            name: name.to_owned(),
            client,
            held,
            reader,
        }))
    }

    /// The connection, for sends and queries as the name.
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// The oldest `limit` deliveries, after waiting (a bounded time) for those the relay has
    /// still to hand over, each acknowledged verified by `door` before it is returned: once
    /// the caller shows them, the store says who got them. Returns them with how many more
    /// wait.
    pub(crate) async fn take(
        &self,
        limit: usize,
        door: &str,
    ) -> Result<(Vec<Delivered>, usize), ClientError> {
        let mut n = 0;
        self.take_while(
            |_| {
                n += 1;
                n <= limit
            },
            door,
        )
        .await
    }

    /// [`Mailbox::take`], taking the oldest deliveries while `fits` says the next one fits
    /// (the first is always taken: a page is never empty while something waits).
    pub(crate) async fn take_while(
        &self,
        mut fits: impl FnMut(&Delivered) -> bool,
        door: &str,
    ) -> Result<(Vec<Delivered>, usize), ClientError> {
        // Stored for the name and not acknowledged, as the relay counts them (it may still
        // count some this door acknowledged a moment ago: then it waits less, never more).
        let pending = match self.client.query(QueryRequest::Agents).await? {
            QueryResult::Agents { agents } => agents
                .iter()
                .find(|a| a.name == self.name)
                .map_or(0, |a| a.pending),
            other => {
                return Err(ClientError::Protocol(format!(
                    "unexpected answer to agents: {other:?}"
                )));
            }
        };
        let expected = usize::try_from(
            pending
                .saturating_sub(self.held.acked.load(Ordering::Relaxed))
                .min(u64::from(WINDOW)),
        )
        .unwrap_or(usize::MAX);
        let deadline = tokio::time::Instant::now() + CATCH_UP;
        loop {
            let arrived = self.held.arrived.notified();
            // All the relay has for the name, not only a page: the count of what stays
            // waiting is then true too.
            if self.held.lock().len() >= expected {
                break;
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                tracing::debug!(
                    expected,
                    "the relay has not handed over every waiting message yet; showing what came"
                );
                break;
            }
        }
        let (taken, left) = {
            let mut q = self.held.lock();
            let mut n = 0;
            while let Some(m) = q.get(n) {
                if !fits(m) && n > 0 {
                    break;
                }
                n += 1;
            }
            (q.drain(..n).collect::<Vec<_>>(), q.len())
        };
        for m in &taken {
            self.shown(m, door).await;
        }
        if let Some(last) = taken.last() {
            self.committed(last).await;
        }
        let more = left.max(expected.saturating_sub(taken.len()));
        Ok((taken, more))
    }

    /// The next delivery, as soon as the relay hands one over, acknowledged verified by
    /// `door`; `None` when the connection has ended for good.
    pub(crate) async fn next(&self, door: &str) -> Option<Delivered> {
        loop {
            let arrived = self.held.arrived.notified();
            let first = self.held.lock().pop_front();
            if let Some(m) = first {
                self.shown(&m, door).await;
                self.committed(&m).await;
                return Some(m);
            }
            if self.reader.is_finished() {
                return None;
            }
            tokio::select! {
                () = arrived => {}
                // The reader ends with the connection: look once more, then stop.
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    /// The door showed the message `(from, id)` in full by other means (`relay_read`): if it
    /// holds that delivery, it is handed over now, not shown again.
    pub(crate) async fn shown_elsewhere(&self, from: &str, id: &str, door: &str) {
        let taken = {
            let mut q = self.held.lock();
            q.iter()
                .position(|m| m.id == id && m.from == from)
                .and_then(|at| q.remove(at))
        };
        if let Some(m) = taken {
            self.shown(&m, door).await;
            self.committed(&m).await;
        }
    }

    /// Acknowledges `m` verified by `door`. A failed acknowledgement leaves it waiting in the
    /// store (shown again later, never lost).
    async fn shown(&self, m: &Delivered, door: &str) {
        self.held.acked.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.client.ack_shown(m, door).await {
            tracing::warn!(error = %e, id = %m.id, "cannot acknowledge a message that was shown; the relay will hand it over again");
        }
    }

    /// Waits until the relay has committed the acknowledgements this door sent, the last of
    /// them for `last`, before the caller shows what they acknowledge: a door's process may be
    /// killed the moment its answer is out (a CLI stopping its MCP servers), and a message
    /// shown whose acknowledgement had not reached the store would be shown again. A query on
    /// the same connection is the barrier: the relay handles a connection's frames in order,
    /// and the store thread commits the writes decided before a query before answering it.
    async fn committed(&self, last: &Delivered) {
        let req = QueryRequest::Read {
            id: last.id.clone(),
            from: Some(last.from.clone()),
        };
        if let Err(e) = self.client.query(req).await {
            tracing::warn!(error = %e, id = %last.id, "cannot confirm that the relay recorded what was shown; it may be shown again");
        }
    }

    /// Closes the connection after everything acknowledged was written.
    pub(crate) async fn close(self) {
        self.reader.abort();
        self.client.close().await;
    }
}
