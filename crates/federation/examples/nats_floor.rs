//! What NATS JetStream alone does on this machine with the federation's durability: a file
//! stream, publishes with `Nats-Msg-Id` and a PubAck each (pipelined, `WINDOW` in flight),
//! then a durable pull consumer acknowledging each message with a confirmed ack (as the link
//! does). No relay: the floor under `agent-relay bench --cluster`.
//!
//! `cargo run --release -p relay-federation --example nats_floor -- nats://127.0.0.1:4222 50000 256`

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::PullConsumer};
use futures_util::StreamExt;
use futures_util::stream::FuturesOrdered;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let url = args.get(1).map_or("nats://127.0.0.1:4222", String::as_str);
    let n: usize = args.get(2).map_or(Ok(50_000), |s| s.parse())?;
    let window: usize = args.get(3).map_or(Ok(256), |s| s.parse())?;
    let client = async_nats::connect(url).await?;
    let js = jetstream::new(client);
    let name = format!("FLOOR_{}", std::process::id());
    let subject = format!("floor.{}", std::process::id());
    let stream = js
        .create_stream(jetstream::stream::Config {
            name: name.clone(),
            subjects: vec![subject.clone()],
            storage: jetstream::stream::StorageType::File,
            duplicate_window: Duration::from_secs(600),
            ..Default::default()
        })
        .await?;
    let body = bytes::Bytes::from(vec![b'x'; 400]);
    let start = Instant::now();
    let mut inflight = FuturesOrdered::new();
    for i in 0..n {
        if inflight.len() >= window
            && let Some(r) = inflight.next().await
        {
            let _: jetstream::publish::PublishAck = r?;
        }
        let m = jetstream::message::PublishMessage::build()
            .payload(body.clone())
            .message_id(format!("m{i}"));
        inflight.push_back(std::future::IntoFuture::into_future(
            js.send_publish(subject.clone(), m).await?,
        ));
    }
    while let Some(r) = inflight.next().await {
        r.map_err(|e| e.to_string())?;
    }
    let publish = start.elapsed();
    let consumer: PullConsumer = stream
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some("floor".into()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            max_ack_pending: 4096,
            ..Default::default()
        })
        .await?;
    let start = Instant::now();
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(512)
        .messages()
        .await?;
    let mut acks = FuturesOrdered::new();
    let mut got = 0;
    while got < n {
        let Some(m) = messages.next().await else {
            break;
        };
        let m = m?;
        got += 1;
        acks.push_back(async move { m.double_ack().await });
        if acks.len() >= window
            && let Some(r) = acks.next().await
        {
            r.map_err(|e| e.to_string())?;
        }
    }
    while let Some(r) = acks.next().await {
        r.map_err(|e| e.to_string())?;
    }
    let consume = start.elapsed();
    println!(
        "nats alone, {n} messages × 400 B, file storage, window {window}: publish (PubAck each) {:.0} msg/s; consume (confirmed ack each) {:.0} msg/s",
        n as f64 / publish.as_secs_f64(),
        got as f64 / consume.as_secs_f64()
    );
    js.delete_stream(&name).await?;
    Ok(())
}
