//! The web dashboard, served by the daemon on loopback: one page (embedded in the binary, no
//! network at run time), a JSON API under `/api/`, a Server-Sent Events stream of the live
//! feed, and Prometheus `/metrics`. Every request must name the dashboard's own host, a change
//! must come from its own page (or no page), and every request must present the token (see
//! [`auth`]).
//!
//! Reads go through [`relay_daemon::Handle::ask`], the same path as a tool's `QUERY`: the
//! router forwards them to the store thread and is never blocked by them. The live stream
//! subscribes to the daemon's feed only while a page is open, so a daemon nobody watches builds
//! no events at all. Endpoints are documented in `docs/DASHBOARD.md`.

pub mod auth;
mod handlers;
pub mod metrics;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use relay_daemon::Handle;
use relay_protocol::now_ms;
use tokio::sync::watch;

use crate::metrics::{Rate, Samples, Totals};

/// The default port (the original relay's).
pub const DEFAULT_PORT: u16 = 3888;

/// Dashboard failures.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DashboardError {
    /// No loopback port could be bound.
    #[error("cannot listen on 127.0.0.1 for the dashboard: {0}")]
    Bind(std::io::Error),
}

/// A bound dashboard listener and whether it is the port asked for.
#[derive(Debug)]
pub struct Bound {
    /// The listener (non-blocking, ready for tokio).
    pub listener: std::net::TcpListener,
    /// The port it listens on.
    pub port: u16,
    /// False when the port asked for was taken and another was chosen.
    pub preferred: bool,
}

/// Binds `127.0.0.1:port`; when that port is taken (another relay, say: one per project), any
/// free loopback port. Port 0 means any free port.
///
/// # Errors
/// [`DashboardError::Bind`] when no port can be bound at all.
pub fn bind(port: u16) -> Result<Bound, DashboardError> {
    let at = |p: u16| std::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, p)));
    let (listener, preferred) = match at(port) {
        Ok(l) => (l, true),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            (at(0).map_err(DashboardError::Bind)?, port == 0)
        }
        Err(e) => return Err(DashboardError::Bind(e)),
    };
    listener
        .set_nonblocking(true)
        .map_err(DashboardError::Bind)?;
    let port = listener.local_addr().map_err(DashboardError::Bind)?.port();
    Ok(Bound {
        listener,
        port,
        preferred,
    })
}

/// The URL to print: the page with its token.
pub fn url(port: u16, token: &str) -> String {
    format!("http://127.0.0.1:{port}/?token={token}")
}

/// State shared by the handlers.
pub(crate) struct App {
    pub(crate) token: String,
    /// The port the dashboard listens on: the only one a `Host` or `Origin` may name.
    pub(crate) port: u16,
    pub(crate) daemon: Handle,
    pub(crate) samples: Mutex<Samples>,
    /// The latest counters; streams send them on when they change.
    pub(crate) totals: watch::Receiver<(Totals, Option<Rate>)>,
    /// The people adapters, when any are configured.
    pub(crate) people: Option<relay_people::Hub>,
}

/// Serves the dashboard on `listener` until the daemon stops.
///
/// # Errors
/// An I/O error from the listener.
pub async fn serve(
    listener: std::net::TcpListener,
    token: String,
    daemon: Handle,
) -> std::io::Result<()> {
    serve_with(listener, token, daemon, None).await
}

/// [`serve`], with the people adapters: `/api/adapters` lists them, and `POST /hooks/webhook`
/// takes signed webhook requests (authenticated by their signature, not the token).
///
/// # Errors
/// An I/O error from the listener.
pub async fn serve_with(
    listener: std::net::TcpListener,
    token: String,
    daemon: Handle,
    people: Option<relay_people::Hub>,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let port = listener.local_addr()?.port();
    let first = Totals::read(daemon.counters(), now_ms());
    let mut samples = Samples::default();
    samples.push(first);
    let (totals_tx, totals_rx) = watch::channel((first, None));
    let app = Arc::new(App {
        token,
        port,
        daemon: daemon.clone(),
        samples: Mutex::new(samples),
        totals: totals_rx,
        people,
    });
    tokio::spawn(sample(app.clone(), totals_tx));
    let router = Router::new()
        .route("/", get(handlers::page))
        .route("/app.js", get(handlers::script))
        .route("/app.css", get(handlers::style))
        .route("/api/agents", get(handlers::agents))
        .route("/api/messages", get(handlers::messages))
        .route("/api/messages/{id}", get(handlers::message))
        .route("/api/dead", get(handlers::dead))
        .route("/api/dead/{n}/retry", post(handlers::retry))
        .route("/api/chains/{thread}/extend", post(handlers::extend_chain))
        .route("/api/stats", get(handlers::stats))
        .route("/api/events", get(handlers::events))
        .route("/metrics", get(handlers::prometheus))
        .route("/api/adapters", get(handlers::adapters))
        .route("/api/inbox", get(handlers::inbox))
        .route("/api/reply", post(handlers::reply))
        .layer(middleware::from_fn_with_state(app.clone(), guard))
        // Outside the token guard: a webhook sender has the shared secret, not the token.
        // The handler checks the host, then the signature, before reading anything else.
        .merge(Router::new().route("/hooks/webhook", post(handlers::webhook)))
        .with_state(app);
    let stop = daemon.clone();
    axum::serve(listener, router)
        .with_graceful_shutdown(async move { stop.stopped().await })
        .await
}

/// Reads the counters once a second for the throughput chart.
async fn sample(app: Arc<App>, tx: watch::Sender<(Totals, Option<Rate>)>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = app.daemon.stopped() => return,
        }
        let now = Totals::read(app.daemon.counters(), now_ms());
        let rate = match app.samples.lock() {
            Ok(mut s) => s.push(now),
            Err(_) => return,
        };
        let _ = tx.send((now, rate));
    }
}

/// Refuses requests addressed to another host (421: a DNS-rebinding page), state changes from
/// another page (403) and requests without the token (401), in that order, so a foreign page
/// is refused whether or not it has the token; and adds the headers every answer carries.
async fn guard(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let headers = req.headers();
    let text = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    // HTTP/2 carries the host in the URI's authority instead of a Host header.
    let host = text(header::HOST).or_else(|| req.uri().authority().map(|a| a.as_str()));
    let changes = !matches!(*req.method(), Method::GET | Method::HEAD);
    let mut res = if !auth::loopback_host(host, app.port) {
        (
            StatusCode::MISDIRECTED_REQUEST,
            format!(
                "agent-relay dashboard: this server answers only to 127.0.0.1:{0} and localhost:{0}.\n",
                app.port
            ),
        )
            .into_response()
    } else if changes && !auth::same_origin(text(header::ORIGIN), app.port) {
        (
            StatusCode::FORBIDDEN,
            "agent-relay dashboard: changes are accepted only from the dashboard's own page.\n",
        )
            .into_response()
    } else if auth::presented(req.uri().query(), text(header::AUTHORIZATION))
        .is_some_and(|t| auth::same_token(t.as_bytes(), app.token.as_bytes()))
    {
        next.run(req).await
    } else {
        (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "agent-relay dashboard: missing or wrong token. Open the URL printed by `agent-relay up` (or shown by `agent-relay status`).\n",
        )
            .into_response()
    };
    let h = res.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    // The token is in the page's URL: never send it to anyone in a Referer.
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
        ),
    );
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_port_falls_back_to_a_free_one() {
        let first = bind(0).unwrap();
        assert!(first.preferred);
        let second = bind(first.port).unwrap();
        assert!(!second.preferred);
        assert_ne!(second.port, first.port);
    }

    #[test]
    fn url_carries_the_token() {
        assert_eq!(url(3888, "ab"), "http://127.0.0.1:3888/?token=ab");
    }
}
