//! Fills a relay database with many acknowledged messages, through the store API, for measuring
//! start-up and `status` at size (docs/PERFORMANCE.md, "10 million stored messages").
//!
//! ```sh
//! cargo run --release -p relay-store --example fill -- /tmp/big/messages.sqlite 10000000
//! AGENT_RELAY_DATA_DIR=/tmp/big agent-relay up
//! ```
//!
//! Messages go from 3 senders to 64 recipients, 200-byte bodies, in batches of 20,000 (one
//! transaction each, `synchronous = NORMAL`); each batch also acknowledges everything the
//! previous one stored, as a running relay would, so all but the last batch end acknowledged
//! and the last one stays queued. The daemon must not be running on that database.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use relay_protocol::{Kind, Send};
use relay_store::{Durability, NewMessage, Recipient, SqliteStore, Store, WriteOp};

const RECIPIENTS: u64 = 64;
const BATCH: u64 = 20_000;

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(path), Some(n)) = (args.next(), args.next()) else {
        eprintln!("usage: fill DATABASE MESSAGES");
        std::process::exit(2);
    };
    let n: u64 = n.parse().expect("MESSAGES is a number");
    let mut store =
        SqliteStore::open_with(std::path::Path::new(&path), Durability::Normal).expect("open");
    let before = store.stats().expect("stats").messages;
    let body: String = "please run the test suite again and report the failures; "
        .repeat(4)
        .chars()
        .take(200)
        .collect();
    let start = relay_protocol::now_instant();
    let mut done = 0u64;
    // Positions are dense from 1, so the previous batch ended at `before + done`.
    while done < n {
        let take = BATCH.min(n - done);
        let mut ops = Vec::with_capacity(usize::try_from(take + RECIPIENTS).unwrap());
        for i in before + done..before + done + take {
            let to = format!("agent-{}", i % RECIPIENTS);
            ops.push(WriteOp::Append(NewMessage {
                id: format!("01J{i:023}"),
                from: format!("sender-{}", i % 3),
                to: to.clone(),
                topic: None,
                payload: Send {
                    origin: None,
                    kind: Kind::Message,
                    body: body.clone(),
                    data: None,
                    thread: None,
                    in_reply_to: None,
                    budget: None,
                    urgent: false,
                },
                session_id: Some("01JSESSION0000000000000000".into()),
                recipients: vec![Recipient { name: to }],
                queued_at: None,
            }));
        }
        for r in 0..RECIPIENTS {
            ops.push(WriteOp::AckThrough {
                recipient: format!("agent-{r}"),
                through: i64::try_from(before + done).unwrap(),
            });
        }
        store
            .write_batch(&ops, relay_protocol::now_ms())
            .expect("write_batch");
        done += take;
        if done % 1_000_000 < BATCH {
            eprintln!("{done} messages, {:.0} s", start.elapsed().as_secs_f64());
        }
    }
    let stats = store.stats().expect("stats");
    eprintln!(
        "{} messages stored, {} queued, in {:.0} s",
        stats.messages,
        stats.pending,
        start.elapsed().as_secs_f64()
    );
}
