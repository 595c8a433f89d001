//! Write throughput of the stores under the daemon's load shape: each batch (one transaction)
//! appends `n` messages with one recipient each and acks, per recipient, everything the previous
//! batch stored (acks lag one batch behind, as they do when the router hands messages out after
//! the commit). `cargo bench -p relay-store` prints messages per second as "item/s".
#![allow(missing_docs, clippy::unwrap_used)]

use std::cell::{Cell, RefCell};

use divan::Bencher;
use divan::counter::ItemsCount;
use relay_protocol::{Kind, Send};
use relay_store::{MemoryStore, NewMessage, Recipient, SqliteStore, Store, WriteOp};

fn main() {
    divan::main();
}

const RECIPIENTS: usize = 8;

/// A batch of `n` appends plus one ack-through per recipient for the previous batch.
fn batch(next_id: &Cell<u64>, n: usize, ack_through: i64) -> Vec<WriteOp> {
    let mut ops = Vec::with_capacity(n + RECIPIENTS);
    for _ in 0..n {
        let i = next_id.get();
        next_id.set(i + 1);
        let to = format!("agent-{}", i % RECIPIENTS as u64);
        ops.push(WriteOp::Append(NewMessage {
            id: format!("01J{i:020}"),
            from: format!("sender-{}", i % 3),
            to: to.clone(),
            topic: None,
            payload: Send {
                kind: Kind::Message,
                body: "please run the test suite again and report the failures".into(),
                data: None,
                thread: None,
                in_reply_to: None,
                budget: None,
            },
            session_id: Some("01JSESSION0000000000000000".into()),
            recipients: vec![Recipient { name: to }],
        }));
    }
    for r in 0..RECIPIENTS {
        ops.push(WriteOp::AckThrough {
            recipient: format!("agent-{r}"),
            through: ack_through,
        });
    }
    ops
}

fn run<S: Store>(bencher: Bencher<'_, '_>, store: S, n: usize) {
    let store = RefCell::new(store);
    let next_id = Cell::new(0u64);
    let now = Cell::new(1_700_000_000_000u64);
    bencher
        .counter(ItemsCount::new(n))
        .with_inputs(|| {
            // Positions are dense from 1, so the previous batch ended at `next_id`.
            let through = i64::try_from(next_id.get()).unwrap();
            batch(&next_id, n, through)
        })
        .bench_local_values(|ops| {
            now.set(now.get() + 1);
            store.borrow_mut().write_batch(&ops, now.get()).unwrap()
        });
}

#[divan::bench(args = [100, 1000, 4000], sample_count = 30, sample_size = 10)]
fn sqlite_append_and_ack(bencher: Bencher<'_, '_>, n: usize) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("bench.db")).unwrap();
    run(bencher, store, n);
}

#[divan::bench(args = [1000], sample_count = 30, sample_size = 10)]
fn memory_append_and_ack(bencher: Bencher<'_, '_>, n: usize) {
    run(bencher, MemoryStore::new(), n);
}
