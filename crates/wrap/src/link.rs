//! The wrapper's side of the relay, as the shell (`shell.rs`) uses it: the real [`Client`]
//! implements [`Relay`]; the loop's unit tests put a recording stand-in in its place
//! (`serve_tests.rs`).

use std::future::Future;
use std::pin::Pin;

use relay_client::{Client, ClientError, Delivered, Event, Outgoing, Receipt};
use relay_protocol::query::{QueryRequest, QueryResult};
use relay_protocol::{DeliveryState, TerminalReport};

/// A receipt to wait for, off the loop (see [`Relay::send_nowait`]).
pub(crate) type Pending = Pin<Box<dyn Future<Output = Result<Receipt, ClientError>> + Send>>;

/// A query's answer to wait for, off the loop (see [`Relay::query_nowait`]).
pub(crate) type PendingQuery =
    Pin<Box<dyn Future<Output = Result<relay_protocol::query::QueryResult, ClientError>> + Send>>;

/// The relay connection the shell talks through; the methods are the client's.
pub(crate) trait Relay {
    /// See [`Client::next_event`].
    async fn next_event(&mut self) -> Option<Event>;

    /// See [`Client::send_nowait`]: the id sent, and its receipt to wait for.
    async fn send_nowait(&self, msg: Outgoing) -> Result<(String, Pending), ClientError>;

    /// See [`Client::ack`].
    async fn ack(&self, msg: &Delivered, state: Option<DeliveryState>) -> Result<(), ClientError>;

    /// See [`Client::ack_shown`].
    async fn ack_shown(&self, msg: &Delivered, door: &str) -> Result<(), ClientError>;

    /// See [`Client::ack_failed`].
    async fn ack_failed(&self, msg: &Delivered, reason: &str) -> Result<(), ClientError>;

    /// See [`Client::subscribe`].
    async fn subscribe(&self, pattern: String) -> Result<(), ClientError>;

    /// See [`Client::report_terminal`].
    async fn report_terminal(&self, report: TerminalReport) -> Result<(), ClientError>;

    /// See [`Client::query`]: a question asked on the agent's own connection (claims speak
    /// for the connection's name), its answer awaited here.
    async fn query(&self, req: QueryRequest) -> Result<QueryResult, ClientError>;

    /// See [`Client::query_nowait`]: the answer to wait for, off the loop.
    async fn query_nowait(
        &self,
        req: relay_protocol::query::QueryRequest,
    ) -> Result<PendingQuery, ClientError>;

    /// See [`Client::close`].
    async fn close(self);
}

impl Relay for Client {
    async fn next_event(&mut self) -> Option<Event> {
        Client::next_event(self).await
    }

    async fn send_nowait(&self, msg: Outgoing) -> Result<(String, Pending), ClientError> {
        let (id, pending) = Client::send_nowait(self, msg).await?;
        Ok((id, Box::pin(pending.wait())))
    }

    async fn ack(&self, msg: &Delivered, state: Option<DeliveryState>) -> Result<(), ClientError> {
        Client::ack(self, msg, state).await
    }

    async fn ack_shown(&self, msg: &Delivered, door: &str) -> Result<(), ClientError> {
        Client::ack_shown(self, msg, door).await
    }

    async fn ack_failed(&self, msg: &Delivered, reason: &str) -> Result<(), ClientError> {
        Client::ack_failed(self, msg, reason).await
    }

    async fn subscribe(&self, pattern: String) -> Result<(), ClientError> {
        Client::subscribe(self, pattern).await
    }

    async fn report_terminal(&self, report: TerminalReport) -> Result<(), ClientError> {
        Client::report_terminal(self, report).await
    }

    async fn query(&self, req: QueryRequest) -> Result<QueryResult, ClientError> {
        Client::query(self, req).await
    }

    async fn query_nowait(
        &self,
        req: relay_protocol::query::QueryRequest,
    ) -> Result<PendingQuery, ClientError> {
        Ok(Box::pin(Client::query_nowait(self, req).await?))
    }

    async fn close(self) {
        Client::close(self).await;
    }
}
