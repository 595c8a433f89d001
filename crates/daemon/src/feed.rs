//! The live event feed and the relay's counters, and the [`Handle`] through which code running
//! beside the daemon (the web dashboard) watches and questions it.
//!
//! The router is the only writer of both. Routing must not pay for a feed nobody reads, so an
//! event is built only while someone subscribes: [`Feed::emit`] takes a closure and checks a
//! watcher count (one relaxed atomic load) before calling it. The counters are always kept;
//! each is a plain load and store, since the router is their only writer.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use relay_protocol::events::RelayEvent;
use relay_protocol::query::QueryRequest;
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::msg::RouterMsg;
pub use crate::msg::{Answer, LiveAgent};

/// Events buffered per watcher before a slow one starts missing events (it is told how many).
const FEED_CAPACITY: usize = 4096;

/// A counter written by one task and read by others.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`. A load and a store rather than a locked add: the router is the only writer,
    /// so no increment can be lost, and readers only need a recent value.
    pub(crate) fn add(&self, n: u64) {
        self.0.store(
            self.0.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    }

    /// The current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Totals since the daemon started.
#[derive(Debug, Default)]
pub struct Counters {
    /// Messages stored.
    pub accepted: Counter,
    /// SENDs that repeated a stored `(from, id)` (nothing new stored).
    pub duplicates: Counter,
    /// NACKs sent (refused SENDs and SUBSCRIBEs).
    pub refused: Counter,
    /// DELIVERs queued to recipients' connections (live and replayed).
    pub delivered: Counter,
    /// Deliveries acknowledged (typed in, verified or failed).
    pub acked: Counter,
    /// Of those, reported failed by the recipient.
    pub failed: Counter,
    /// Deliveries expired before their recipient came back.
    pub expired: Counter,
    /// Agent sessions started.
    pub connects: Counter,
}

/// The router's side of the feed.
#[derive(Debug, Clone)]
pub(crate) struct Feed {
    tx: broadcast::Sender<Arc<RelayEvent>>,
    watchers: Arc<AtomicUsize>,
    pub(crate) counters: Arc<Counters>,
}

impl Feed {
    pub(crate) fn new() -> Self {
        let (tx, _) = broadcast::channel(FEED_CAPACITY);
        Self {
            tx,
            watchers: Arc::new(AtomicUsize::new(0)),
            counters: Arc::new(Counters::default()),
        }
    }

    /// Whether anyone watches; when not, events are not even built.
    #[inline]
    pub(crate) fn watched(&self) -> bool {
        self.watchers.load(Ordering::Relaxed) > 0
    }

    /// Publishes the event `make` builds, if anyone watches.
    #[inline]
    pub(crate) fn emit(&self, make: impl FnOnce() -> RelayEvent) {
        if self.watched() {
            // A broadcast send fails only when the last watcher left since `watched()` was
            // read: then nobody wanted the event.
            if self.tx.send(Arc::new(make())).is_err() {
                tracing::trace!("live event with no watcher left");
            }
        }
    }

    /// A new watcher.
    pub(crate) fn subscribe(&self) -> Subscription {
        self.watchers.fetch_add(1, Ordering::Relaxed);
        Subscription {
            rx: self.tx.subscribe(),
            watchers: self.watchers.clone(),
        }
    }
}

/// One watcher's view of the feed; dropping it stops the events it caused to be built.
#[derive(Debug)]
pub struct Subscription {
    rx: broadcast::Receiver<Arc<RelayEvent>>,
    watchers: Arc<AtomicUsize>,
}

impl Subscription {
    /// The next event; a [`RelayEvent::Lagged`] when this watcher fell behind and missed some;
    /// `None` once the daemon has stopped.
    pub async fn recv(&mut self) -> Option<Arc<RelayEvent>> {
        match self.rx.recv().await {
            Ok(ev) => Some(ev),
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                Some(Arc::new(RelayEvent::Lagged { missed }))
            }
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.watchers.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The daemon stopped before it answered.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the relay daemon is stopping")]
pub struct Stopped;

/// A handle on a running daemon for code running in the same process: watch the feed, read
/// the counters, ask the questions tools ask with `QUERY` (answered through the same store
/// thread, so the router never waits for a read).
#[derive(Debug, Clone)]
pub struct Handle {
    pub(crate) feed: Feed,
    pub(crate) router: mpsc::Sender<RouterMsg>,
    pub(crate) stop: CancellationToken,
}

impl Handle {
    /// Starts watching the live feed.
    pub fn subscribe(&self) -> Subscription {
        self.feed.subscribe()
    }

    /// Totals since the daemon started.
    pub fn counters(&self) -> &Counters {
        &self.feed.counters
    }

    /// Asks what a `QUERY` asks (`status`, `agents`, `read`, `history`, `trace`, `dlq_list`,
    /// ...; `watch` is [`Handle::subscribe`]), the operator actions `dlq_retry` and
    /// `dlq_purge` included: those are done, through the store, before the answer comes.
    ///
    /// # Errors
    /// [`Stopped`] when the daemon is shutting down.
    pub async fn ask(&self, req: QueryRequest) -> Result<Answer, Stopped> {
        let (reply, answer) = oneshot::channel();
        self.router
            .send(RouterMsg::Ask { req, reply })
            .await
            .map_err(|_| Stopped)?;
        answer.await.map_err(|_| Stopped)
    }

    /// Completes when the daemon starts shutting down.
    pub async fn stopped(&self) {
        self.stop.cancelled().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn events_are_built_only_while_watched() {
        let feed = Feed::new();
        let mut built = 0;
        feed.emit(|| {
            built += 1;
            RelayEvent::Lagged { missed: 0 }
        });
        assert_eq!(built, 0);
        let mut sub = feed.subscribe();
        feed.emit(|| {
            built += 1;
            RelayEvent::Expired {
                ts: 1,
                deliveries: 2,
            }
        });
        assert_eq!(built, 1);
        assert_eq!(
            sub.recv().await.as_deref(),
            Some(&RelayEvent::Expired {
                ts: 1,
                deliveries: 2
            })
        );
        drop(sub);
        assert!(!feed.watched());
    }

    #[tokio::test]
    async fn a_slow_watcher_is_told_what_it_missed() {
        let feed = Feed::new();
        let mut sub = feed.subscribe();
        for i in 0..(FEED_CAPACITY as u64 + 3) {
            feed.emit(|| RelayEvent::Expired {
                ts: i,
                deliveries: 1,
            });
        }
        assert_eq!(
            sub.recv().await.as_deref(),
            Some(&RelayEvent::Lagged { missed: 3 })
        );
    }

    #[test]
    fn counters_add_up() {
        let c = Counter::default();
        c.add(2);
        c.add(3);
        assert_eq!(c.get(), 5);
    }
}
