//! What NATS JetStream alone does on this machine with the federation's durability: a file
//! stream, publishes with `Nats-Msg-Id` and a PubAck each (pipelined, `WINDOW` in flight),
//! then a durable pull consumer acknowledging each message with a confirmed ack (as the link
//! does). No relay: the floor under `agent-relay bench --cluster` (which measures it too, in
//! the same run: `relay_federation::jetstream_floor`).
//!
//! `cargo run --release -p relay-federation --example nats_floor -- nats://127.0.0.1:4222 50000 256`

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let url = args.get(1).map_or("nats://127.0.0.1:4222", String::as_str);
    let n: usize = args.get(2).map_or(Ok(50_000), |s| s.parse())?;
    let window: usize = args.get(3).map_or(Ok(256), |s| s.parse())?;
    let f = relay_federation::jetstream_floor(url, n, 400, window).await?;
    println!(
        "nats alone, {n} messages × 400 B, file storage, window {window}: publish (PubAck each) {:.0} msg/s; consume (confirmed ack each) {:.0} msg/s",
        f.publish_per_s, f.consume_per_s
    );
    Ok(())
}
