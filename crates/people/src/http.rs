//! A small HTTP/1.1 client on hyper's connection API: one connection per request (webhook
//! posts and long polls are few), a deadline on each, no pooling, no redirects. Only `http://`
//! URLs are spoken here; an `https://` URL is refused with an error that says so (see
//! docs/SECURITY.md: put a TLS-terminating proxy on loopback in front, for now).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;

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
}

/// A parsed `http://host:port/path` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    host: String,
    port: u16,
    path: String,
}

fn parse(url: &str) -> Result<Target, HttpError> {
    if url.starts_with("https://") {
        return Err(HttpError::Url(
            "https:// is not built in yet: point the URL at a TLS-terminating proxy on loopback (http://127.0.0.1:PORT)".into(),
        ));
    }
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| HttpError::Url("expected an http:// URL".into()))?;
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
        None => (authority, 80),
    };
    if host.is_empty() {
        return Err(HttpError::Url("no host in URL".into()));
    }
    Ok(Target {
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

async fn exchange(
    url: &str,
    headers: &[(&str, String)],
    body: Vec<u8>,
) -> Result<(u16, Bytes), HttpError> {
    let t = parse(url)?;
    let io = |what: &str, e: &dyn std::fmt::Display| {
        HttpError::Io(format!("{what} {}:{}: {e}", t.host, t.port))
    };
    let stream = tokio::net::TcpStream::connect((t.host.as_str(), t.port))
        .await
        .map_err(|e| io("cannot connect to", &e))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| io("handshake with", &e))?;
    let driver = tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "http connection ended");
        }
    });
    let mut req = Request::post(t.path.as_str())
        .header(hyper::header::HOST, format!("{}:{}", t.host, t.port))
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
        .map_err(|e| io("no answer from", &e))?;
    let status = res.status().as_u16();
    let bytes = res
        .into_body()
        .collect()
        .await
        .map_err(|e| io("reading the answer of", &e))?
        .to_bytes();
    driver.abort();
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
                host: "127.0.0.1".into(),
                port: 8080,
                path: "/bot1:x/getUpdates".into()
            }
        );
        assert_eq!(parse("http://h").unwrap().path, "/");
        assert!(parse("https://api.telegram.org/x").is_err());
        assert!(parse("ftp://x").is_err());
    }
}
