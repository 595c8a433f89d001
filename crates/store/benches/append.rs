//! Write throughput of the stores under the daemon's load shape: each batch (one transaction)
//! appends `n` messages with one recipient each and acks, per recipient, everything the previous
//! batch stored (acks lag one batch behind, as they do when the router hands messages out after
//! the commit). `cargo bench -p relay-store` prints messages per second as "item/s", and for the
//! SQLite benches also the store thread's CPU time per message (on stderr), which a shared
//! machine disturbs much less than wall time. `sqlite_real_pattern` is the shape of
//! `agent-relay bench` (64 senders to 64 receivers); `cargo bench -p relay-store --
//! sqlite_real_pattern` runs it alone.
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
                origin: None,
                kind: Kind::Message,
                body: "please run the test suite again and report the failures".into(),
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
            through: ack_through,
        });
    }
    ops
}

fn run<S: Store>(bencher: Bencher<'_, '_>, store: S, n: usize) {
    let store = RefCell::new(store);
    let next_id = Cell::new(0u64);
    let now = Cell::new(1_700_000_000_000u64);
    let cpu = CpuMeter::default();
    bencher
        .counter(ItemsCount::new(n))
        .with_inputs(|| {
            // Positions are dense from 1, so the previous batch ended at `next_id`.
            let through = i64::try_from(next_id.get()).unwrap();
            batch(&next_id, n, through)
        })
        .bench_local_values(|ops| {
            now.set(now.get() + 1);
            cpu.measure(n, || {
                store.borrow_mut().write_batch(&ops, now.get()).unwrap()
            })
        });
    cpu.report(&format!("append_and_ack({n})"));
}

/// Store-thread CPU time per message, summed over the timed calls only. Wall time on a shared
/// machine includes waiting for a core; CPU time does not, so it is the steadier number.
#[derive(Default)]
struct CpuMeter {
    ns: Cell<u64>,
    msgs: Cell<u64>,
}

impl CpuMeter {
    fn measure<T>(&self, msgs: usize, f: impl FnOnce() -> T) -> T {
        let t0 = thread_cpu_ns();
        let out = f();
        self.ns
            .set(self.ns.get() + thread_cpu_ns().saturating_sub(t0));
        self.msgs.set(self.msgs.get() + msgs as u64);
        out
    }

    fn report(&self, name: &str) {
        if self.msgs.get() > 0 {
            eprintln!(
                "{name}: {:.2} µs of store-thread CPU per message ({} messages)",
                self.ns.get() as f64 / 1000.0 / self.msgs.get() as f64,
                self.msgs.get()
            );
        }
    }
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

// --- The daemon's real load --------------------------------------------------------------------
//
// What `agent-relay bench` puts on the store thread: 64 senders (`bench-s17`) each sending to
// 64 receivers (`bench-r17`) round-robin, 26-char ULID ids (millisecond prefix, random tail),
// 200-byte bodies, a 26-char session id per message; batches of 256 appends plus one
// ack-through per receiver for everything the previous batch stored. The database is a real file
// that already holds `PREFILL` messages, so the b-trees are deep as they are mid-run.

const REAL_SENDERS: u64 = 64;
const REAL_RECEIVERS: u64 = 64;
const REAL_BATCH: usize = 256;
const PREFILL: usize = 100_000;

/// Crockford base32, as ULIDs are spelled.
const CROCKFORD: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/// The generator state of the real-pattern bench.
struct RealLoad {
    /// Messages generated so far (also the last position stored, positions being dense).
    n: u64,
    rng: u64,
    ms: u64,
    sessions: Vec<String>,
    body: String,
}

impl RealLoad {
    fn new() -> Self {
        let mut load = Self {
            n: 0,
            rng: 0x9E37_79B9_7F4A_7C15,
            ms: 1_700_000_000_000,
            sessions: Vec::new(),
            body: String::new(),
        };
        load.sessions = (0..REAL_SENDERS).map(|_| load.ulid()).collect();
        load.body = format!("{:020} {}", 0, "x".repeat(179));
        load
    }

    fn next_rand(&mut self) -> u64 {
        // xorshift64*: any cheap, well-spread sequence will do.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A ULID: 48-bit millisecond time, 80 random bits.
    fn ulid(&mut self) -> String {
        let hi = self.next_rand();
        let lo = self.next_rand();
        let v: u128 =
            (u128::from(self.ms) << 80) | (u128::from(hi & 0xFFFF) << 64) | u128::from(lo);
        (0..26)
            .map(|i| char::from(CROCKFORD[((v >> (125 - 5 * i)) & 31) as usize]))
            .collect()
    }

    /// The next batch; `ack` adds the ack-throughs of the previous batch.
    fn batch(&mut self, ack: bool) -> Vec<WriteOp> {
        let through = i64::try_from(self.n).unwrap();
        // About 2 batches per millisecond at the target rate.
        self.ms += 1;
        let mut ops = Vec::with_capacity(REAL_BATCH + REAL_RECEIVERS as usize);
        for _ in 0..REAL_BATCH {
            let i = self.n;
            self.n += 1;
            let s = i % REAL_SENDERS;
            let to = format!("bench-r{}", (s + i / REAL_SENDERS) % REAL_RECEIVERS);
            let mut body = self.body.clone();
            body.replace_range(0..20, &format!("{i:020}"));
            ops.push(WriteOp::Append(NewMessage {
                id: self.ulid(),
                from: format!("bench-s{s}"),
                to: to.clone(),
                topic: None,
                payload: Send {
                    origin: None,
                    kind: Kind::Message,
                    body,
                    data: None,
                    thread: None,
                    in_reply_to: None,
                    budget: None,
                    urgent: false,
                },
                session_id: Some(self.sessions[s as usize].clone()),
                recipients: vec![Recipient { name: to }],
                queued_at: None,
            }));
        }
        if ack {
            for r in 0..REAL_RECEIVERS {
                ops.push(WriteOp::AckThrough {
                    recipient: format!("bench-r{r}"),
                    through,
                });
            }
        }
        ops
    }
}

/// `item/s` is messages per second; time per message is the median divided by 256.
#[divan::bench(sample_count = 40, sample_size = 10)]
fn sqlite_real_pattern(bencher: Bencher<'_, '_>) {
    let dir = tempfile::tempdir().unwrap();
    let mut store = SqliteStore::open(&dir.path().join("bench.db")).unwrap();
    let mut load = RealLoad::new();
    let mut now = 1_700_000_000_000u64;
    for i in 0..PREFILL / REAL_BATCH {
        now += 1;
        store.write_batch(&load.batch(i > 0), now).unwrap();
    }
    let store = RefCell::new(store);
    let load = RefCell::new(load);
    let now = Cell::new(now);
    let cpu = CpuMeter::default();
    bencher
        .counter(ItemsCount::new(REAL_BATCH))
        .with_inputs(|| load.borrow_mut().batch(true))
        .bench_local_values(|ops| {
            now.set(now.get() + 1);
            cpu.measure(REAL_BATCH, || {
                store.borrow_mut().write_batch(&ops, now.get()).unwrap()
            })
        });
    cpu.report("sqlite_real_pattern");
}

/// CPU time (user + system) of the calling thread, from Linux's schedstat; 0 elsewhere.
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}
