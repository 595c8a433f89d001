//! The load generator's connections: plain protocol-v1 loops over the socket, kept lean so
//! that the generator, which shares the machine, takes as little CPU as it can from the relay
//! it measures. Frames are real protocol frames; only the bookkeeping is minimal: SENDs are
//! formatted from a template, ACKs and DELIVERs are decoded into the few fields counted.

use std::borrow::Cow;
use std::collections::HashSet;
use std::hash::{BuildHasher, Hasher};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::{Buf, BytesMut};
use relay_protocol::{Envelope, MAX_FRAME_BYTES, Payload, frame_len, now_ms};
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::{Mutex, Semaphore};

use crate::args::AckMode;

/// What one sender saw.
#[derive(Default)]
pub(super) struct SenderResult {
    pub(super) accepted: usize,
    pub(super) refused: usize,
    pub(super) first_error: Option<String>,
}

/// What one receiver saw.
pub(super) struct ReceiverResult {
    pub(super) unique: usize,
    pub(super) duplicates: usize,
    pub(super) latencies_ns: Vec<u64>,
    pub(super) last: Option<Instant>,
}

/// The fields of a daemon frame the generator looks at.
#[derive(Deserialize)]
struct Lite<'a> {
    #[serde(rename = "type", borrow)]
    ty: Cow<'a, str>,
    #[serde(default, borrow)]
    id: Cow<'a, str>,
    #[serde(default)]
    delivery: Option<LiteDelivery>,
    #[serde(default, borrow)]
    payload: Option<LitePayload<'a>>,
}

#[derive(Deserialize)]
struct LiteDelivery {
    seq: u64,
}

#[derive(Deserialize, Default)]
struct LitePayload<'a> {
    #[serde(default, borrow)]
    status: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    body: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    nonce: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    reason: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    message: Option<Cow<'a, str>>,
    #[serde(default)]
    fatal: bool,
}

/// Appends one frame holding `json`.
fn push_frame(out: &mut Vec<u8>, json: &str) {
    out.extend_from_slice(&(json.len() as u32).to_be_bytes());
    out.extend_from_slice(json.as_bytes());
}

/// Connects and completes HELLO/WELCOME; returns the stream and any bytes read past WELCOME.
async fn connect(
    socket: &Path,
    name: &str,
    role: &str,
    max_inflight: u32,
) -> anyhow::Result<(UnixStream, BytesMut)> {
    let mut stream = relay_client::connect_socket(socket)
        .await
        .with_context(|| format!("cannot connect to {}", socket.display()))?;
    let hello = serde_json::json!({
        "v": 1, "type": "HELLO", "id": format!("h-{name}"), "ts": now_ms(),
        "payload": {"agent": name, "cli": "bench", "role": role,
                    "capabilities": {"ack": true, "max_inflight": max_inflight}},
    });
    let mut out = Vec::new();
    push_frame(&mut out, &hello.to_string());
    stream.write_all(&out).await?;
    let mut buf = BytesMut::with_capacity(64 * 1024);
    loop {
        if let Some(n) = frame_len(&buf, MAX_FRAME_BYTES)? {
            let env = Envelope::from_json(&buf[4..n])?;
            buf.advance(n);
            return match env.payload {
                Payload::Welcome(_) => Ok((stream, buf)),
                Payload::Error(e) => anyhow::bail!("{name}: the relay refused: {}", e.message),
                other => anyhow::bail!(
                    "{name}: expected WELCOME, got {}",
                    other.message_type().as_str()
                ),
            };
        }
        if stream.read_buf(&mut buf).await? == 0 {
            anyhow::bail!("{name}: the relay closed the connection during the handshake");
        }
    }
}

fn pong(out: &mut Vec<u8>, nonce: Option<&str>) {
    let json = match nonce {
        Some(n) => {
            serde_json::json!({"v":1,"type":"PONG","id":"p","ts":now_ms(),"payload":{"nonce":n}})
        }
        None => serde_json::json!({"v":1,"type":"PONG","id":"p","ts":now_ms(),"payload":{}}),
    };
    push_frame(out, &json.to_string());
}

/// Parameters shared by every sender.
pub(super) struct SendPlan {
    pub(super) socket: std::path::PathBuf,
    pub(super) receivers: Arc<Vec<String>>,
    pub(super) bytes: usize,
    pub(super) window: usize,
    /// Time between two sends of one sender, when rate-limited.
    pub(super) period: Option<Duration>,
    pub(super) base: Instant,
}

/// Sender `i`: sends `count` messages, its j-th to receiver `(i + j) % R`, keeping at most
/// `window` unacknowledged, and counts the receipts.
pub(super) async fn sender(
    plan: Arc<SendPlan>,
    i: usize,
    count: usize,
) -> anyhow::Result<SenderResult> {
    let name = format!("bench-s{i}");
    let (stream, mut buf) = connect(&plan.socket, &name, "client", 256).await?;
    let (mut rd, wr) = stream.into_split();
    let wr = Arc::new(Mutex::new(wr));
    let window = Arc::new(Semaphore::new(plan.window));
    let writer = {
        let (plan, wr, window) = (plan.clone(), wr.clone(), window.clone());
        tokio::spawn(async move { send_loop(&plan, i, count, &wr, &window).await })
    };
    let mut res = SenderResult::default();
    let mut out = Vec::new();
    while res.accepted + res.refused < count {
        while let Some(n) = frame_len(&buf, MAX_FRAME_BYTES)? {
            let f: Lite<'_> = serde_json::from_slice(&buf[4..n])?;
            match f.ty.as_ref() {
                "ACK" => {
                    match f.payload.and_then(|p| p.status) {
                        Some(s) if s == "accepted" || s == "queued" => res.accepted += 1,
                        other => {
                            res.refused += 1;
                            res.first_error
                                .get_or_insert(format!("unexpected receipt {other:?}"));
                        }
                    }
                    window.add_permits(1);
                }
                "NACK" => {
                    res.refused += 1;
                    let reason = f.payload.and_then(|p| p.reason).unwrap_or_default();
                    res.first_error.get_or_insert(reason.into_owned());
                    window.add_permits(1);
                }
                "PING" => pong(
                    &mut out,
                    f.payload.as_ref().and_then(|p| p.nonce.as_deref()),
                ),
                "ERROR" => {
                    let p = f.payload.unwrap_or_default();
                    let msg = p.message.unwrap_or_default().into_owned();
                    res.first_error.get_or_insert(msg);
                    if p.fatal {
                        buf.clear();
                        break;
                    }
                }
                _ => {}
            }
            buf.advance(n);
        }
        if !out.is_empty() {
            wr.lock().await.write_all(&out).await?;
            out.clear();
        }
        if res.accepted + res.refused >= count || rd.read_buf(&mut buf).await? == 0 {
            break;
        }
    }
    writer.abort();
    Ok(res)
}

async fn send_loop(
    plan: &SendPlan,
    i: usize,
    count: usize,
    wr: &Mutex<OwnedWriteHalf>,
    window: &Semaphore,
) -> anyhow::Result<()> {
    let pad = "x".repeat(plan.bytes - 21);
    let r_count = plan.receivers.len();
    let t0 = tokio::time::Instant::now();
    let mut out: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut j = 0;
    while j < count {
        // Take every free slot of the window at once (at least one), so frames go out in
        // batches; with a rate, one at a time.
        let take = if plan.period.is_some() || window.available_permits() == 0 {
            if !out.is_empty() {
                wr.lock().await.write_all(&out).await?;
                out.clear();
            }
            window.acquire().await?.forget();
            1
        } else {
            let k = window.available_permits().min(count - j).min(128);
            window.try_acquire_many(k as u32)?.forget();
            k
        };
        for _ in 0..take {
            if let Some(p) = plan.period {
                tokio::time::sleep_until(t0 + p.mul_f64(j as f64)).await;
            }
            let id = ulid::Ulid::new();
            let sent = plan.base.elapsed().as_nanos() as u64;
            // Only digits, a space and 'x' in the body: nothing to escape.
            let json = format!(
                r#"{{"v":1,"type":"SEND","id":"{id}","ts":{},"to":"{}","payload":{{"kind":"message","body":"{sent:020} {pad}"}}}}"#,
                now_ms(),
                plan.receivers[(i + j) % r_count],
            );
            push_frame(&mut out, &json);
            j += 1;
        }
        if plan.period.is_some() || out.len() >= 32 * 1024 || j == count {
            wr.lock().await.write_all(&out).await?;
            out.clear();
        }
    }
    Ok(())
}

/// Receiver `name` (`bench-r{r}`): takes `want` distinct messages, acknowledging them as `acks` says
/// (a wrapper's `verified` ACK per message, one cumulative ACK per read, or a plain v1 ACK per
/// message), and measures latency from the send time in each body.
pub(super) async fn receiver(
    socket: std::path::PathBuf,
    name: String,
    want: usize,
    base: Instant,
    deadline: tokio::time::Instant,
    acks: AckMode,
) -> anyhow::Result<tokio::task::JoinHandle<anyhow::Result<ReceiverResult>>> {
    let per_message = acks != AckMode::Lean;
    let state = (acks == AckMode::Wrapper).then_some("verified");
    let (mut stream, mut buf) = connect(&socket, &name, "agent", 1024).await?;
    let task = tokio::spawn(async move {
        let hasher = std::collections::hash_map::RandomState::new();
        // 64-bit hashes of the ids: no allocation per message; a false "duplicate" would need
        // a collision among a few hundred thousand ids (odds ~1e-9).
        let mut seen: HashSet<u64> = HashSet::with_capacity(want);
        let mut res = ReceiverResult {
            unique: 0,
            duplicates: 0,
            latencies_ns: Vec::with_capacity(want),
            last: None,
        };
        let mut out = Vec::with_capacity(4096);
        let mut linger_until: Option<tokio::time::Instant> = None;
        loop {
            let mut last: Option<(String, u64)> = None;
            while let Some(n) = frame_len(&buf, MAX_FRAME_BYTES)? {
                let f: Lite<'_> = serde_json::from_slice(&buf[4..n])?;
                match f.ty.as_ref() {
                    "DELIVER" => {
                        let now = base.elapsed().as_nanos() as u64;
                        let body = f
                            .payload
                            .as_ref()
                            .and_then(|p| p.body.as_deref())
                            .unwrap_or("");
                        let sent: u64 = body.get(..20).and_then(|s| s.parse().ok()).unwrap_or(now);
                        res.latencies_ns.push(now.saturating_sub(sent));
                        let mut h = hasher.build_hasher();
                        h.write(f.id.as_bytes());
                        if seen.insert(h.finish()) {
                            res.unique += 1;
                        } else {
                            res.duplicates += 1;
                        }
                        let seq = f.delivery.map(|d| d.seq).unwrap_or(0);
                        if per_message {
                            ack(&mut out, &f.id, seq, false, state);
                        } else {
                            last = Some((f.id.into_owned(), seq));
                        }
                    }
                    "PING" => pong(
                        &mut out,
                        f.payload.as_ref().and_then(|p| p.nonce.as_deref()),
                    ),
                    _ => {}
                }
                buf.advance(n);
            }
            if let Some((id, seq)) = last {
                ack(&mut out, &id, seq, true, None);
                res.last = Some(relay_protocol::now_instant());
            } else if per_message && !out.is_empty() {
                res.last = Some(relay_protocol::now_instant());
            }
            if !out.is_empty() {
                stream.write_all(&out).await?;
                out.clear();
            }
            if res.unique >= want && linger_until.is_none() {
                // Stay a moment to catch late duplicates.
                linger_until = Some(tokio::time::Instant::now() + Duration::from_millis(200));
            }
            let until = linger_until.unwrap_or(deadline).min(deadline);
            match tokio::time::timeout_at(until, stream.read_buf(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
                Ok(Ok(_)) => {}
            }
        }
        Ok(res)
    });
    Ok(task)
}

fn ack(out: &mut Vec<u8>, id: &str, seq: u64, cumulative: bool, state: Option<&str>) {
    let mut payload = serde_json::json!({"ack_id": id, "seq": seq, "cumulative": cumulative});
    if let Some(state) = state {
        payload["state"] = state.into();
    }
    let json = serde_json::json!({
        "v": 1, "type": "ACK", "id": "a", "ts": now_ms(), "payload": payload,
    });
    push_frame(out, &json.to_string());
}
