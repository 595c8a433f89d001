//! A small HTTP/1.1 client on hyper's connection API: one connection per request (webhook
//! posts and long polls are few), a deadline on each, no pooling, no redirects. `https://` goes
//! through rustls (ring) with Mozilla's root certificates compiled in (`webpki-roots`), so
//! certificates are checked the same way on every machine, whatever its certificate store.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use std::sync::{Arc, OnceLock};
use tokio_rustls::rustls;

/// The largest answer read from a remote end (a Bot API answer, a webhook receiver's): 8 MiB.
/// A bigger one is an error, and is not read past the limit: a hostile or broken peer cannot
/// make the relay hold what it sends.
pub const MAX_ANSWER_BYTES: usize = 8 * 1024 * 1024;

/// An HTTP failure. Its text never contains the request's URL path, which may carry a secret
/// (the Telegram bot token is part of the Bot API's paths).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpError {
    /// The URL is not one this client speaks.
    #[error("{0}")]
    Url(String),
    /// Connecting, writing or reading failed.
    #[error("{0}")]
    Io(String),
    /// No answer in time.
    #[error("no answer within {0} s")]
    Timeout(u64),
    /// The peer answered with an error: its status, its reason (cleaned, short) and, for a
    /// 429, how long it asked to wait.
    #[error("HTTP {status}: {reason}")]
    Status {
        /// The HTTP (or Bot API `error_code`) status.
        status: u16,
        /// What the peer said.
        reason: String,
        /// Seconds the peer asked to wait before trying again (a 429's `retry_after`).
        retry_after: Option<u64>,
    },
}

impl HttpError {
    /// Whether trying again cannot help: a 4xx other than 408 (timeout) and 429 (too many
    /// requests). Such a failure is reported at once with the peer's reason.
    pub fn is_permanent(&self) -> bool {
        matches!(self, Self::Status { status, .. }
            if (400..500).contains(status) && *status != 408 && *status != 429)
    }

    /// How long the peer asked to wait, if it did.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Status {
                retry_after: Some(s),
                ..
            } => Some(Duration::from_secs(*s)),
            _ => None,
        }
    }
}

/// A parsed `http(s)://host:port/path` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    tls: bool,
    host: String,
    port: u16,
    path: String,
}

fn parse(url: &str) -> Result<Target, HttpError> {
    let (tls, rest) = if let Some(rest) = url.strip_prefix("https://") {
        (true, rest)
    } else if let Some(rest) = url.strip_prefix("http://") {
        (false, rest)
    } else {
        return Err(HttpError::Url("expected an http:// or https:// URL".into()));
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (
            h,
            p.parse()
                .map_err(|_| HttpError::Url("bad port in URL".into()))?,
        ),
        None => (authority, if tls { 443 } else { 80 }),
    };
    if host.is_empty() {
        return Err(HttpError::Url("no host in URL".into()));
    }
    Ok(Target {
        tls,
        host: host.to_owned(),
        port,
        path: path.to_owned(),
    })
}

/// POSTs `body` (JSON) to `url` with `headers`; the status and the answer's body.
///
/// # Errors
/// [`HttpError`].
pub async fn post_json(
    url: &str,
    headers: &[(&str, String)],
    body: Vec<u8>,
    timeout: Duration,
) -> Result<(u16, Bytes), HttpError> {
    tokio::time::timeout(timeout, exchange(url, headers, body))
        .await
        .map_err(|_| HttpError::Timeout(timeout.as_secs()))?
}

/// The TLS settings, built once: ring, TLS 1.2 and 1.3, Mozilla's roots.
fn tls() -> Result<Arc<rustls::ClientConfig>, HttpError> {
    static CONFIG: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let mut roots = rustls::RootCertStore::empty();
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
            rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .map(|b| Arc::new(b.with_root_certificates(roots).with_no_client_auth()))
            .map_err(|e| e.to_string())
        })
        .clone()
        .map_err(|e| HttpError::Io(format!("TLS settings: {e}")))
}

async fn exchange(
    url: &str,
    headers: &[(&str, String)],
    body: Vec<u8>,
) -> Result<(u16, Bytes), HttpError> {
    let t = parse(url)?;
    let tcp = tokio::net::TcpStream::connect((t.host.as_str(), t.port))
        .await
        .map_err(|e| t.io("cannot connect to", &e))?;
    if t.tls {
        let name = rustls::pki_types::ServerName::try_from(t.host.clone())
            .map_err(|e| HttpError::Url(format!("bad host name for TLS: {e}")))?;
        let stream = tokio_rustls::TlsConnector::from(tls()?)
            .connect(name, tcp)
            .await
            .map_err(|e| t.io("TLS with", &e))?;
        request(&t, stream, headers, body).await
    } else {
        request(&t, tcp, headers, body).await
    }
}

impl Target {
    fn io(&self, what: &str, e: &dyn std::fmt::Display) -> HttpError {
        HttpError::Io(format!("{what} {}:{}: {e}", self.host, self.port))
    }
}

async fn request<S>(
    t: &Target,
    stream: S,
    headers: &[(&str, String)],
    body: Vec<u8>,
) -> Result<(u16, Bytes), HttpError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| t.io("handshake with", &e))?;
    let driver = tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "http connection ended");
        }
    });
    let host = if t.port == if t.tls { 443 } else { 80 } {
        t.host.clone()
    } else {
        format!("{}:{}", t.host, t.port)
    };
    let mut req = Request::post(t.path.as_str())
        .header(hyper::header::HOST, host)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .header(hyper::header::USER_AGENT, "agent-relay");
    for (k, v) in headers {
        req = req.header(*k, v.as_str());
    }
    let req = req
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| HttpError::Url(format!("bad request: {e}")))?;
    let res = sender
        .send_request(req)
        .await
        .map_err(|e| t.io("no answer from", &e))?;
    let status = res.status().as_u16();
    let too_big = || {
        HttpError::Io(format!(
            "the answer of {}:{} is over {} MiB; not read",
            t.host,
            t.port,
            MAX_ANSWER_BYTES / (1024 * 1024)
        ))
    };
    let announced = res
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|n| n > MAX_ANSWER_BYTES as u64) {
        driver.abort();
        return Err(too_big());
    }
    let read = http_body_util::Limited::new(res.into_body(), MAX_ANSWER_BYTES)
        .collect()
        .await;
    // Done with the connection either way: nothing more is read from it.
    driver.abort();
    let bytes = read
        .map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                too_big()
            } else {
                t.io("reading the answer of", &e)
            }
        })?
        .to_bytes();
    Ok((status, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            parse("http://127.0.0.1:8080/bot1:x/getUpdates").unwrap(),
            Target {
                tls: false,
                host: "127.0.0.1".into(),
                port: 8080,
                path: "/bot1:x/getUpdates".into()
            }
        );
        assert_eq!(parse("http://h").unwrap().path, "/");
        let t = parse("https://api.telegram.org/x").unwrap();
        assert_eq!((t.tls, t.port), (true, 443));
        assert!(tls().is_ok());
        assert!(parse("ftp://x").is_err());
    }
}
