//! A relay for the loop's unit tests (`serve_tests.rs`): it accepts every send, records
//! everything the wrapper did on its connection, and lets a test deliver messages.

use std::sync::{Arc, Mutex, MutexGuard};

use relay_client::{ClientError, Delivered, Event, Outgoing, Receipt};
use relay_protocol::{DeliveryState, TerminalReport};

use crate::link::{Pending, Relay as Link};

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
    pub(crate) reports: Vec<TerminalReport>,
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
        let pending: Pending = if held {
            Box::pin(std::future::pending())
        } else {
            Box::pin(std::future::ready(Ok(receipt)))
        };
        (id, pending)
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

impl Link for Relay {
    async fn next_event(&mut self) -> Option<Event> {
        self.events.recv().await
    }

    async fn send_nowait(&self, msg: Outgoing) -> Result<(String, Pending), ClientError> {
        Ok(self.send(msg))
    }

    async fn ack(&self, msg: &Delivered, state: Option<DeliveryState>) -> Result<(), ClientError> {
        Relay::ack(self, msg, state);
        Ok(())
    }

    /// Recorded as verified.
    async fn ack_shown(&self, msg: &Delivered, _door: &str) -> Result<(), ClientError> {
        Relay::ack(self, msg, Some(DeliveryState::Verified));
        Ok(())
    }

    async fn ack_failed(&self, msg: &Delivered, reason: &str) -> Result<(), ClientError> {
        Relay::ack_failed(self, msg, reason);
        Ok(())
    }

    async fn subscribe(&self, _pattern: String) -> Result<(), ClientError> {
        Ok(())
    }

    async fn report_terminal(&self, report: TerminalReport) -> Result<(), ClientError> {
        self.log().reports.push(report);
        Ok(())
    }

    /// No relay behind it: refused.
    async fn query_nowait(
        &self,
        _req: relay_protocol::query::QueryRequest,
    ) -> Result<crate::link::PendingQuery, ClientError> {
        Err(ClientError::Protocol(
            "the fake relay answers no queries".into(),
        ))
    }

    /// No relay behind it: refused.
    async fn query(
        &self,
        _req: relay_protocol::query::QueryRequest,
    ) -> Result<relay_protocol::query::QueryResult, ClientError> {
        Err(ClientError::Protocol(
            "the fake relay answers no queries".into(),
        ))
    }

    async fn close(self) {
        self.log().closed = true;
    }
}
