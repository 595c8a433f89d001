//! The wrapper's side of the relay: the real [`Client`], or (in unit tests) a fake that
//! records what the wrapper sends and acknowledges and lets a test deliver messages. The
//! methods are the client's, so the core reads the same either way.

use relay_client::{Client, ClientError, Event, Outgoing, PendingReceipt, Receipt};
use relay_protocol::TerminalReport;

#[cfg(test)]
use relay_client::Delivered;
#[cfg(test)]
use relay_protocol::DeliveryState;

/// The relay connection the core talks through.
pub(crate) enum Link {
    /// A real connection to the relay.
    Client(Client),
    /// A recording stand-in (unit tests of the loop, see `serve_tests.rs`).
    #[cfg(test)]
    Fake(fake::Relay),
}

/// A receipt to wait for (see [`Link::send_nowait`]).
pub(crate) enum Pending {
    Client(PendingReceipt),
    /// The fake relay's receipt, or none ever (it holds receipts back).
    #[cfg(test)]
    Fake(Option<Receipt>),
}

impl Pending {
    /// The relay's answer to a send.
    pub(crate) async fn wait(self) -> Result<Receipt, ClientError> {
        match self {
            Self::Client(p) => p.wait().await,
            #[cfg(test)]
            Self::Fake(Some(r)) => Ok(r),
            #[cfg(test)]
            Self::Fake(None) => std::future::pending().await,
        }
    }
}

impl Link {
    /// See [`Client::next_event`].
    pub(crate) async fn next_event(&mut self) -> Option<Event> {
        match self {
            Self::Client(c) => c.next_event().await,
            #[cfg(test)]
            Self::Fake(f) => f.events.recv().await,
        }
    }

    /// See [`Client::send_nowait`].
    pub(crate) async fn send_nowait(
        &self,
        msg: Outgoing,
    ) -> Result<(String, Pending), ClientError> {
        match self {
            Self::Client(c) => c
                .send_nowait(msg)
                .await
                .map(|(id, p)| (id, Pending::Client(p))),
            #[cfg(test)]
            Self::Fake(f) => Ok(f.send(msg)),
        }
    }

    /// See [`Client::ack`].
    pub(crate) async fn ack(
        &self,
        msg: &relay_client::Delivered,
        state: Option<relay_protocol::DeliveryState>,
    ) -> Result<(), ClientError> {
        match self {
            Self::Client(c) => c.ack(msg, state).await,
            #[cfg(test)]
            Self::Fake(f) => {
                f.ack(msg, state);
                Ok(())
            }
        }
    }

    /// See [`Client::ack_shown`] (the fake records it as verified).
    pub(crate) async fn ack_shown(
        &self,
        msg: &relay_client::Delivered,
        door: &str,
    ) -> Result<(), ClientError> {
        match self {
            Self::Client(c) => c.ack_shown(msg, door).await,
            #[cfg(test)]
            Self::Fake(f) => {
                f.ack(msg, Some(relay_protocol::DeliveryState::Verified));
                Ok(())
            }
        }
    }

    /// See [`Client::ack_failed`].
    pub(crate) async fn ack_failed(
        &self,
        msg: &relay_client::Delivered,
        reason: &str,
    ) -> Result<(), ClientError> {
        match self {
            Self::Client(c) => c.ack_failed(msg, reason).await,
            #[cfg(test)]
            Self::Fake(f) => {
                f.ack_failed(msg, reason);
                Ok(())
            }
        }
    }

    /// See [`Client::subscribe`].
    pub(crate) async fn subscribe(&self, pattern: String) -> Result<(), ClientError> {
        match self {
            Self::Client(c) => c.subscribe(pattern).await,
            #[cfg(test)]
            Self::Fake(_) => Ok(()),
        }
    }

    /// See [`Client::report_terminal`].
    pub(crate) async fn report_terminal(&self, report: TerminalReport) -> Result<(), ClientError> {
        match self {
            Self::Client(c) => c.report_terminal(report).await,
            #[cfg(test)]
            Self::Fake(f) => {
                f.log().reports.push(report);
                Ok(())
            }
        }
    }

    /// See [`Client::close`].
    pub(crate) async fn close(self) {
        match self {
            Self::Client(c) => c.close().await,
            #[cfg(test)]
            Self::Fake(f) => f.log().closed = true,
        }
    }
}

#[cfg(test)]
pub(crate) mod fake {
    use std::sync::{Arc, Mutex, MutexGuard};

    use super::{Delivered, DeliveryState, Event, Outgoing, Pending, Receipt};

    /// What the wrapper did on its relay connection.
    #[derive(Debug, Default)]
    pub(crate) struct Log {
        /// Acknowledgements: message id and the state reported.
        pub(crate) acks: Vec<(String, Option<DeliveryState>)>,
        /// The reasons given with failures: message id and reason.
        pub(crate) reasons: Vec<(String, String)>,
        /// Messages the wrapper sent (directives it relayed).
        pub(crate) sent: Vec<Outgoing>,
        /// Terminal reports.
        pub(crate) reports: Vec<relay_protocol::TerminalReport>,
        /// The connection was closed.
        pub(crate) closed: bool,
        /// Sends from now on get no receipt (the relay is slow to answer).
        pub(crate) hold_receipts: bool,
    }

    /// A relay that accepts every send and records everything.
    pub(crate) struct Relay {
        pub(crate) events: tokio::sync::mpsc::UnboundedReceiver<Event>,
        pub(crate) log: Arc<Mutex<Log>>,
    }

    impl Relay {
        /// A fake relay, the sender a test delivers through, and the shared log.
        pub(crate) fn new() -> (
            Self,
            tokio::sync::mpsc::UnboundedSender<Event>,
            Arc<Mutex<Log>>,
        ) {
            let (tx, events) = tokio::sync::mpsc::unbounded_channel();
            let log = Arc::new(Mutex::new(Log::default()));
            (
                Self {
                    events,
                    log: log.clone(),
                },
                tx,
                log,
            )
        }

        pub(crate) fn log(&self) -> MutexGuard<'_, Log> {
            self.log.lock().unwrap()
        }

        pub(crate) fn send(&self, msg: Outgoing) -> (String, Pending) {
            let id = msg
                .id
                .clone()
                .unwrap_or_else(|| format!("sent-{}", self.log().sent.len()));
            self.log().sent.push(msg);
            let receipt = Receipt {
                id: id.clone(),
                status: relay_protocol::AckStatus::Accepted,
                recipients: Some(1),
                note: None,
            };
            let held = self.log().hold_receipts;
            (id, Pending::Fake((!held).then_some(receipt)))
        }

        pub(crate) fn ack(&self, msg: &Delivered, state: Option<DeliveryState>) {
            self.log().acks.push((msg.id.clone(), state));
        }

        pub(crate) fn ack_failed(&self, msg: &Delivered, reason: &str) {
            let mut log = self.log();
            log.acks.push((msg.id.clone(), Some(DeliveryState::Failed)));
            log.reasons.push((msg.id.clone(), reason.to_owned()));
        }
    }
}
