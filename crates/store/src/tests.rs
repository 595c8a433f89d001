//! Behaviour tests, written once over [`Store`] and run against both implementations.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

use relay_protocol::query::{DeliveryStatus, HistoryFilter};
use relay_protocol::{Budget, Kind, Send};

use crate::{
    AppendOutcome, KnownAgent, MemoryStore, NewMessage, Recipient, SqliteStore, Stats, Store,
    StoreError, StoredMessage, WriteOp, WriteResult,
};

/// Makes stores for a test, and "reopens" one (SQLite: close and open the same file; memory: the
/// same store, since nothing outlives it).
pub(crate) trait Backend {
    type S: Store;
    fn open(&mut self) -> Self::S;
    fn reopen(&mut self, s: Self::S) -> Self::S;
}

pub(crate) struct SqliteBackend {
    dir: tempfile::TempDir,
}

impl SqliteBackend {
    pub(crate) fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }
    pub(crate) fn path(&self) -> PathBuf {
        self.dir.path().join("sub/dir/relay.db")
    }
}

impl Backend for SqliteBackend {
    type S = SqliteStore;
    fn open(&mut self) -> SqliteStore {
        SqliteStore::open(&self.path()).unwrap()
    }
    fn reopen(&mut self, s: SqliteStore) -> SqliteStore {
        drop(s);
        self.open()
    }
}

pub(crate) struct MemoryBackend;

impl Backend for MemoryBackend {
    type S = MemoryStore;
    fn open(&mut self) -> MemoryStore {
        MemoryStore::new()
    }
    fn reopen(&mut self, s: MemoryStore) -> MemoryStore {
        s
    }
}

pub(crate) fn rcpt(name: &str) -> Recipient {
    Recipient { name: name.into() }
}

pub(crate) fn msg(id: &str, from: &str, to: &str, recipients: &[&str]) -> NewMessage {
    NewMessage {
        id: id.into(),
        from: from.into(),
        to: to.into(),
        topic: None,
        payload: Send {
            origin: None,
            kind: Kind::Message,
            body: format!("body of {id}"),
            data: None,
            thread: None,
            in_reply_to: None,
            budget: None,
            urgent: false,
        },
        session_id: Some("sess".into()),
        recipients: recipients.iter().map(|r| rcpt(r)).collect(),
        queued_at: None,
    }
}

fn on_topic(mut m: NewMessage, topic: &str) -> NewMessage {
    m.topic = Some(topic.into());
    m
}

fn ack(recipient: &str, through: i64) -> WriteOp {
    WriteOp::AckThrough {
        recipient: recipient.into(),
        through,
    }
}

/// Appends one message in its own batch; returns (pos, seqs).
fn put(s: &mut impl Store, m: NewMessage, now: u64) -> (i64, Vec<u64>) {
    match s.write_batch(&[WriteOp::Append(m)], now).unwrap().remove(0) {
        WriteResult::Appended(AppendOutcome::Stored { message, seqs }) => (message.pos, seqs),
        other => panic!("not stored: {other:?}"),
    }
}

fn stored(r: &WriteResult) -> (Arc<StoredMessage>, Vec<u64>) {
    match r {
        WriteResult::Appended(AppendOutcome::Stored { message, seqs }) => {
            (Arc::clone(message), seqs.clone())
        }
        other => panic!("not stored: {other:?}"),
    }
}

fn pending_ids(s: &mut impl Store, r: &str) -> Vec<String> {
    s.take_pending(r, 0, 10_000)
        .unwrap()
        .iter()
        .map(|p| p.message.id.clone())
        .collect()
}

// ---------------------------------------------------------------------------------------------

fn dedupe<B: Backend>(mut b: B) {
    let mut s = b.open();
    let res = s
        .write_batch(
            &[
                WriteOp::Append(msg("m1", "alice", "bob", &["bob"])),
                WriteOp::Append(msg("m1", "alice", "bob", &["bob"])),
                // Same id, other sender: refused, an id names one message (issue 24.7).
                WriteOp::Append(msg("m1", "carol", "bob", &["bob"])),
                WriteOp::Append(msg("c1", "carol", "bob", &["bob"])),
            ],
            10,
        )
        .unwrap();
    let (first, seqs) = stored(&res[0]);
    assert_eq!(seqs, vec![1]);
    assert_eq!(first.ts, 10);
    assert_eq!(
        res[1],
        WriteResult::Appended(AppendOutcome::Duplicate { pos: first.pos })
    );
    assert_eq!(
        res[2],
        WriteResult::Appended(AppendOutcome::Taken {
            owner: "alice".into()
        })
    );
    let (third, seqs) = stored(&res[3]);
    assert_eq!(seqs, vec![1], "carol's stream to bob is separate");
    assert!(third.pos > first.pos);

    let again = s
        .write_batch(&[WriteOp::Append(msg("m1", "alice", "bob", &["bob"]))], 11)
        .unwrap();
    assert_eq!(
        again[0],
        WriteResult::Appended(AppendOutcome::Duplicate { pos: first.pos })
    );

    let mut s = b.reopen(s);
    let again = s
        .write_batch(
            &[
                WriteOp::Append(msg("m1", "alice", "bob", &["bob"])),
                WriteOp::Append(msg("m1", "dave", "bob", &["bob"])),
            ],
            12,
        )
        .unwrap();
    assert_eq!(
        again[0],
        WriteResult::Appended(AppendOutcome::Duplicate { pos: first.pos })
    );
    assert_eq!(
        again[1],
        WriteResult::Appended(AppendOutcome::Taken {
            owner: "alice".into()
        })
    );
    // The duplicate consumed no seq.
    let (_, seqs) = put(&mut s, msg("m2", "alice", "bob", &["bob"]), 13);
    assert_eq!(seqs, vec![2]);
    assert_eq!(
        s.stats().unwrap(),
        Stats {
            messages: 3,
            pending: 3
        }
    );
}

fn seqs_gapless_per_stream_across_reopen<B: Backend>(mut b: B) {
    let mut s = b.open();
    let mut ops = Vec::new();
    for i in 0..5 {
        ops.push(WriteOp::Append(msg(
            &format!("a{i}"),
            "alice",
            "bob",
            &["bob"],
        )));
        ops.push(WriteOp::Append(on_topic(
            msg(&format!("t{i}"), "alice", "*", &["bob"]),
            "ci",
        )));
        ops.push(WriteOp::Append(msg(
            &format!("c{i}"),
            "carol",
            "bob",
            &["bob"],
        )));
    }
    let res = s.write_batch(&ops, 1).unwrap();
    let seqs: Vec<u64> = res.iter().map(|r| stored(r).1[0]).collect();
    assert_eq!(seqs, vec![1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4, 5, 5, 5]);
    let positions: Vec<i64> = res.iter().map(|r| stored(r).0.pos).collect();
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "positions increase: {positions:?}"
    );

    let mut s = b.reopen(s);
    assert_eq!(
        put(&mut s, msg("a5", "alice", "bob", &["bob"]), 2).1,
        vec![6]
    );
    assert_eq!(
        put(&mut s, on_topic(msg("t5", "alice", "*", &["bob"]), "ci"), 2).1,
        vec![6]
    );
    assert_eq!(
        put(
            &mut s,
            on_topic(msg("x0", "alice", "*", &["bob"]), "other"),
            2
        )
        .1,
        vec![1]
    );
    assert_eq!(
        put(&mut s, msg("d0", "alice", "dave", &["dave"]), 2).1,
        vec![1]
    );
    let mut s = b.reopen(s);
    assert_eq!(
        put(&mut s, msg("a6", "alice", "bob", &["bob"]), 3).1,
        vec![7]
    );
}

fn broadcast_to_several<B: Backend>(mut b: B) {
    let mut s = b.open();
    let mut m = msg("b1", "alice", "*", &["bob", "carol", "dave"]);
    m.payload.data = Some(serde_json::json!({"k": [1, 2, {"x": null}]}));
    m.payload.budget = Some(Budget {
        hops: 1,
        max_hops: 5,
        expires_at: Some(99),
    });
    m.payload.thread = Some("th".into());
    m.payload.in_reply_to = Some("m0".into());
    m.payload.kind = Kind::Action;
    put(&mut s, msg("pre", "alice", "carol", &["carol"]), 1);
    let (pos, seqs) = put(&mut s, m.clone(), 5);
    assert_eq!(seqs, vec![1, 2, 1]);
    // An empty broadcast is still stored.
    let (empty_pos, seqs) = put(&mut s, msg("b2", "alice", "*", &[]), 6);
    assert!(seqs.is_empty());

    let mut s = b.reopen(s);
    let rec = s.find("b1", 10).unwrap();
    assert_eq!(rec.len(), 1);
    let rec = &rec[0];
    assert_eq!(
        (rec.pos, rec.ts, rec.to.as_str(), rec.kind),
        (pos, 5, "*", Kind::Action)
    );
    assert_eq!(rec.data, m.payload.data);
    assert_eq!(rec.thread.as_deref(), Some("th"));
    assert_eq!(rec.in_reply_to.as_deref(), Some("m0"));
    let ds: Vec<(&str, u64, DeliveryStatus, u64)> = rec
        .deliveries
        .iter()
        .map(|d| (d.recipient.as_str(), d.seq, d.status, d.queued_at))
        .collect();
    assert_eq!(
        ds,
        vec![
            ("bob", 1, DeliveryStatus::Queued, 5),
            ("carol", 2, DeliveryStatus::Queued, 5),
            ("dave", 1, DeliveryStatus::Queued, 5)
        ]
    );
    assert!(rec.deliveries.iter().all(|d| d.updated_at.is_none()));
    let empty = s.find("b2", 10).unwrap();
    assert_eq!((empty[0].pos, empty[0].deliveries.len()), (empty_pos, 0));

    // Budget survives storage (it is not in MessageRecord, but replays carry it).
    let p = s.take_pending("dave", 0, 10).unwrap();
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].message.payload, m.payload);
    assert_eq!((p[0].seq, p[0].attempt), (1, 1));
    // A session of carol's ended holding the broadcast: its replay is attempt 2, the earlier
    // message (outside the handed-out range) stays at 1.
    s.write_batch(
        &[WriteOp::HandedOut {
            recipient: "carol".into(),
            after: pos - 1,
            through: pos,
        }],
        7,
    )
    .unwrap();
    let p = s.take_pending("carol", 0, 10).unwrap();
    assert_eq!(
        p.iter().map(|p| (p.seq, p.attempt)).collect::<Vec<_>>(),
        vec![(1, 1), (2, 2)]
    );
}

fn duplicate_recipient_gets_one_delivery<B: Backend>(mut b: B) {
    let mut s = b.open();
    let (_, seqs) = put(&mut s, msg("d1", "alice", "*", &["bob", "bob", "carol"]), 1);
    assert_eq!(seqs, vec![1, 1, 1]);
    assert_eq!(s.find("d1", 1).unwrap()[0].deliveries.len(), 2);
    assert_eq!(
        put(&mut s, msg("d2", "alice", "bob", &["bob"]), 1).1,
        vec![2]
    );
}

fn ack_through_and_take_pending<B: Backend>(mut b: B) {
    let mut s = b.open();
    let mut pos = Vec::new();
    for i in 0..6 {
        let m = msg(&format!("m{i}"), "alice", "bob", &["bob"]);
        pos.push(put(&mut s, m, 100 + i).0);
    }
    // A message to someone else in between must not disturb bob.
    put(&mut s, msg("x", "alice", "carol", &["carol"]), 200);

    s.write_batch(&[ack("bob", pos[2])], 300).unwrap();
    let p = s.take_pending("bob", 0, 100).unwrap();
    assert_eq!(
        p.iter()
            .map(|p| (p.message.id.as_str(), p.seq, p.attempt))
            .collect::<Vec<_>>(),
        vec![("m3", 4, 1), ("m4", 5, 1), ("m5", 6, 1)]
    );
    // Reading does not count as an attempt; a session that ended holding m0..m4 does
    // (m0..m2 are acked already and stay as they are).
    s.write_batch(
        &[WriteOp::HandedOut {
            recipient: "bob".into(),
            after: 0,
            through: pos[4],
        }],
        300,
    )
    .unwrap();
    // after_pos above the cursor narrows further; limit bounds.
    let p = s.take_pending("bob", pos[3], 1).unwrap();
    assert_eq!(
        p.iter()
            .map(|p| (p.message.id.as_str(), p.attempt))
            .collect::<Vec<_>>(),
        vec![("m4", 2)]
    );
    // after_pos below the cursor does not bring acked ones back.
    assert_eq!(pending_ids(&mut s, "bob"), vec!["m3", "m4", "m5"]);

    let mut s = b.reopen(s);
    // Acking through an older position changes nothing; the cursor survives reopen.
    s.write_batch(&[ack("bob", pos[0])], 301).unwrap();
    let p = s.take_pending("bob", 0, 100).unwrap();
    assert_eq!(
        p.iter().map(|p| p.attempt).collect::<Vec<_>>(),
        vec![2, 2, 1]
    );
    let rec = s.find("m1", 1).unwrap();
    assert_eq!(rec[0].deliveries[0].status, DeliveryStatus::Acked);
    assert_eq!(rec[0].deliveries[0].updated_at, Some(300));
    assert_eq!(
        s.stats().unwrap(),
        Stats {
            messages: 7,
            pending: 4
        }
    );

    // Ack past the end: later messages are still pending.
    s.write_batch(&[ack("bob", pos[5] + 100)], 302).unwrap();
    assert!(pending_ids(&mut s, "bob").is_empty());
    let (p7, _) = put(&mut s, msg("m7", "alice", "bob", &["bob"]), 400);
    assert!(p7 <= pos[5] + 100);
    assert_eq!(pending_ids(&mut s, "bob"), vec!["m7"]);
    let mut s = b.reopen(s);
    assert_eq!(pending_ids(&mut s, "bob"), vec!["m7"]);
    assert_eq!(pending_ids(&mut s, "carol"), vec!["x"]);
    assert!(pending_ids(&mut s, "nobody").is_empty());
}

fn ack_and_append_in_one_batch<B: Backend>(mut b: B) {
    let mut s = b.open();
    let res = s
        .write_batch(
            &[
                WriteOp::Append(msg("m1", "alice", "bob", &["bob"])),
                WriteOp::Append(msg("m2", "alice", "bob", &["bob"])),
                ack("bob", 1),
                WriteOp::Append(msg("m3", "alice", "bob", &["bob"])),
            ],
            1,
        )
        .unwrap();
    assert_eq!(res[2], WriteResult::Done);
    assert_eq!(stored(&res[3]).1, vec![3]);
    assert_eq!(pending_ids(&mut s, "bob"), vec!["m2", "m3"]);
}

fn set_status<B: Backend>(mut b: B) {
    let mut s = b.open();
    let (p1, _) = put(&mut s, msg("m1", "alice", "bob", &["bob"]), 1);
    let (p2, _) = put(&mut s, msg("m2", "alice", "bob", &["bob"]), 1);
    let res = s
        .write_batch(
            &[
                WriteOp::SetStatus {
                    recipient: "bob".into(),
                    pos: p2,
                    status: DeliveryStatus::Failed,
                    reason: None,
                },
                // Unknown rows: no error, no effect.
                WriteOp::SetStatus {
                    recipient: "bob".into(),
                    pos: 999,
                    status: DeliveryStatus::Acked,
                    reason: None,
                },
                WriteOp::SetStatus {
                    recipient: "zed".into(),
                    pos: p1,
                    status: DeliveryStatus::Acked,
                    reason: None,
                },
            ],
            7,
        )
        .unwrap();
    match &res[0] {
        WriteResult::DeadLettered(n) => {
            assert_eq!(n.len(), 1);
            assert_eq!((n[0].msg_id.as_str(), n[0].code.as_str()), ("m2", "failed"));
        }
        other => panic!("a failure is dead-lettered: {other:?}"),
    }
    assert_eq!(res[1..], [WriteResult::Done, WriteResult::Done]);
    assert_eq!(pending_ids(&mut s, "bob"), vec!["m1"]);
    let d = &s.find("m2", 1).unwrap()[0].deliveries[0];
    assert_eq!((d.status, d.updated_at), (DeliveryStatus::Failed, Some(7)));
    assert_eq!(s.stats().unwrap().pending, 1);

    // Verified after acked; re-queue below the cursor makes it pending again.
    s.write_batch(&[ack("bob", p2)], 8).unwrap();
    assert!(pending_ids(&mut s, "bob").is_empty());
    s.write_batch(
        &[WriteOp::SetStatus {
            recipient: "bob".into(),
            pos: p1,
            status: DeliveryStatus::Verified,
            reason: None,
        }],
        9,
    )
    .unwrap();
    assert_eq!(
        s.find("m1", 1).unwrap()[0].deliveries[0].status,
        DeliveryStatus::Verified
    );
    s.write_batch(
        &[WriteOp::SetStatus {
            recipient: "bob".into(),
            pos: p1,
            status: DeliveryStatus::Queued,
            reason: None,
        }],
        10,
    )
    .unwrap();
    let mut s = b.reopen(s);
    assert_eq!(pending_ids(&mut s, "bob"), vec!["m1"]);
    assert_eq!(s.stats().unwrap().pending, 1);
}

fn expire_with_except<B: Backend>(mut b: B) {
    let mut s = b.open();
    put(&mut s, msg("acked-dave", "alice", "dave", &["dave"]), 50);
    put(&mut s, msg("old-bob", "alice", "bob", &["bob"]), 100);
    put(&mut s, msg("old-carol", "alice", "carol", &["carol"]), 100);
    put(
        &mut s,
        msg("old-all", "alice", "*", &["bob", "carol", "dave"]),
        150,
    );
    put(&mut s, msg("new-bob", "alice", "bob", &["bob"]), 300);
    let dave_pos = s.find("acked-dave", 1).unwrap()[0].pos;
    s.write_batch(&[ack("dave", dave_pos)], 60).unwrap();
    let _ = s.take_pending("dave", 0, 1);

    let res = s
        .write_batch(
            &[WriteOp::Expire {
                queued_before: 200,
                except: vec!["carol".into()],
            }],
            500,
        )
        .unwrap();
    // old-bob, old-all→bob, old-all→dave; not carol's, not new-bob, not the acked one.
    assert!(matches!(res.as_slice(), [WriteResult::Expired(n)] if n.len() == 3));
    assert_eq!(pending_ids(&mut s, "bob"), vec!["new-bob"]);
    assert_eq!(pending_ids(&mut s, "carol"), vec!["old-carol", "old-all"]);
    assert!(pending_ids(&mut s, "dave").is_empty());
    let all = s.find("old-all", 1).unwrap();
    let st: Vec<_> = all[0]
        .deliveries
        .iter()
        .map(|d| (d.status, d.updated_at))
        .collect();
    assert_eq!(
        st,
        vec![
            (DeliveryStatus::Expired, Some(500)),
            (DeliveryStatus::Queued, None),
            (DeliveryStatus::Expired, Some(500))
        ]
    );
    assert_eq!(
        s.find("acked-dave", 1).unwrap()[0].deliveries[0].status,
        DeliveryStatus::Acked
    );
    let res = s
        .write_batch(
            &[WriteOp::Expire {
                queued_before: 200,
                except: vec![],
            }],
            501,
        )
        .unwrap();
    assert!(matches!(res.as_slice(), [WriteResult::Expired(n)] if n.len() == 2));
    assert_eq!(s.stats().unwrap().pending, 1);
}

fn find_exact_prefix_ambiguous_none<B: Backend>(mut b: B) {
    let mut s = b.open();
    put(&mut s, msg("01ABCDEF", "alice", "bob", &["bob"]), 1);
    put(&mut s, msg("01ABCXYZ", "alice", "bob", &["bob"]), 2);
    put(&mut s, msg("01ABC", "alice", "bob", &["bob"]), 3);
    // An id names one message: carol's with alice's id is refused (issue 24.7).
    assert_eq!(
        s.write_batch(
            &[WriteOp::Append(msg("01ABC", "carol", "bob", &["bob"]))],
            4
        )
        .unwrap(),
        vec![WriteResult::Appended(AppendOutcome::Taken {
            owner: "alice".into()
        })]
    );
    put(&mut s, msg("02%_", "alice", "bob", &["bob"]), 5);
    put(&mut s, msg("01abcdef", "alice", "bob", &["bob"]), 6);

    let ids = |r: Vec<relay_protocol::query::MessageRecord>| {
        r.into_iter().map(|m| (m.id, m.from)).collect::<Vec<_>>()
    };
    let exact = ids(s.find("01ABCDEF", 10).unwrap());
    assert_eq!(exact, vec![("01ABCDEF".into(), "alice".into())]);
    // Exact matches only, even though longer ids share the prefix.
    let exact = ids(s.find("01ABC", 10).unwrap());
    assert_eq!(exact, vec![("01ABC".into(), "alice".into())]);
    let exact = ids(s.find("01ABC", 1).unwrap());
    assert_eq!(exact.len(), 1);
    // Prefix, case-sensitive, in id order.
    let pre = ids(s.find("01ABCD", 10).unwrap());
    assert_eq!(pre, vec![("01ABCDEF".into(), "alice".into())]);
    let pre = ids(s.find("01AB", 10).unwrap());
    assert_eq!(
        pre.iter().map(|p| p.0.as_str()).collect::<Vec<_>>(),
        vec!["01ABC", "01ABCDEF", "01ABCXYZ"]
    );
    assert_eq!(s.find("01AB", 2).unwrap().len(), 2);
    // LIKE wildcards are plain characters.
    assert!(s.find("02_", 10).unwrap().is_empty());
    assert_eq!(ids(s.find("02%", 10).unwrap()).len(), 1);
    assert!(s.find("03", 10).unwrap().is_empty());
    assert!(s.find("01ABCDEFG", 10).unwrap().is_empty());
    assert_eq!(s.find("", 100).unwrap().len(), 5);
    let rec = &s.find("01ABCXYZ", 1).unwrap()[0];
    assert_eq!(
        (rec.ts, rec.body.as_str(), rec.deliveries[0].seq),
        (2, "body of 01ABCXYZ", 2)
    );
}

/// Short ids (the last 8 characters) find what the typed line and `history` show, even when
/// the ids share their first characters (ULIDs of one second, a tmux wrapper's derived ids).
fn find_by_short_id<B: Backend>(mut b: B) {
    let mut s = b.open();
    let (a, c) = ("01M80TF6Q3XABCDE12345678XY", "01M80TF6Q3XABCDE87654321ZW");
    put(&mut s, msg(a, "alice", "bob", &["bob"]), 1);
    put(&mut s, msg(c, "alice", "bob", &["bob"]), 2);
    // An id that starts with another's short id.
    put(&mut s, msg("654321ZW-other", "carol", "bob", &["bob"]), 3);
    put(&mut s, msg("m-1", "alice", "bob", &["bob"]), 4);
    let ids = |r: Vec<relay_protocol::query::MessageRecord>| {
        r.into_iter().map(|m| m.id).collect::<Vec<_>>()
    };
    assert_eq!(ids(s.find(relay_protocol::short_id(a), 10).unwrap()), [a]);
    // The short id of one and the prefix of another: both, in id order.
    assert_eq!(ids(s.find("654321ZW", 10).unwrap()), [c, "654321ZW-other"]);
    // Eight characters from the middle of an id match nothing.
    assert!(s.find("12345678", 10).unwrap().is_empty());
    // The prefix both ULIDs share is ambiguous, as before.
    assert_eq!(ids(s.find("01M80TF6", 10).unwrap()), [a, c]);
    assert_eq!(s.find("01M80TF6", 1).unwrap().len(), 1);
    // Shorter than a short id: a prefix only, never a tail.
    assert!(s.find("45678XY", 10).unwrap().is_empty());
    assert_eq!(ids(s.find("m-1", 10).unwrap()), ["m-1"]);
}

fn history_filters_and_paging<B: Backend>(mut b: B) {
    let mut s = b.open();
    // pos 1..=20: alternate senders, a broadcast every 5th, topic on every 4th.
    for i in 1..=20u64 {
        let from = if i % 2 == 0 { "alice" } else { "bob" };
        let mut m = if i % 5 == 0 {
            msg(&format!("m{i:02}"), from, "*", &["carol", "dave"])
        } else {
            msg(&format!("m{i:02}"), from, "carol", &["carol"])
        };
        if i % 4 == 0 {
            m.topic = Some("build".into());
        }
        m.payload.body = if i % 3 == 0 {
            format!("needle {i}")
        } else {
            format!("hay {i}")
        };
        put(&mut s, m, i * 10);
    }
    let mut s = b.reopen(s);
    let ids = |s: &mut B::S, f: HistoryFilter| -> Vec<String> {
        s.history(&f).unwrap().into_iter().map(|m| m.id).collect()
    };
    let all = s.history(&HistoryFilter::default()).unwrap();
    assert_eq!(all.len(), 20);
    assert_eq!(all[0].id, "m20");
    assert!(all.windows(2).all(|w| w[0].pos > w[1].pos));
    assert_eq!(all[0].deliveries.len(), 2);

    assert_eq!(
        ids(
            &mut s,
            HistoryFilter {
                to: Some("dave".into()),
                ..Default::default()
            }
        ),
        vec!["m20", "m15", "m10", "m05"]
    );
    assert_eq!(
        ids(
            &mut s,
            HistoryFilter {
                to: Some("*".into()),
                ..Default::default()
            }
        ),
        vec!["m20", "m15", "m10", "m05"]
    );
    assert_eq!(
        ids(
            &mut s,
            HistoryFilter {
                to: Some("carol".into()),
                ..Default::default()
            }
        )
        .len(),
        20
    );
    assert_eq!(
        ids(
            &mut s,
            HistoryFilter {
                topic: Some("build".into()),
                ..Default::default()
            }
        ),
        vec!["m20", "m16", "m12", "m08", "m04"]
    );
    assert_eq!(
        ids(
            &mut s,
            HistoryFilter {
                from: Some("alice".into()),
                text: Some("needle".into()),
                ..Default::default()
            }
        ),
        vec!["m18", "m12", "m06"]
    );
    assert!(
        ids(
            &mut s,
            HistoryFilter {
                text: Some("NEEDLE".into()),
                ..Default::default()
            }
        )
        .is_empty()
    );
    assert_eq!(
        ids(
            &mut s,
            HistoryFilter {
                since_ms: Some(50),
                until_ms: Some(80),
                ..Default::default()
            }
        ),
        vec!["m07", "m06", "m05"]
    );
    // Paging with before_pos.
    let mut seen = Vec::new();
    let mut before = None;
    loop {
        let page = s
            .history(&HistoryFilter {
                limit: Some(7),
                before_pos: before,
                ..Default::default()
            })
            .unwrap();
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 7);
        before = page.last().map(|m| m.pos);
        seen.extend(page.into_iter().map(|m| m.id));
    }
    assert_eq!(seen, all.iter().map(|m| m.id.clone()).collect::<Vec<_>>());
    assert!(
        ids(
            &mut s,
            HistoryFilter {
                before_pos: Some(1),
                ..Default::default()
            }
        )
        .is_empty()
    );
    assert!(
        ids(
            &mut s,
            HistoryFilter {
                before_pos: Some(-5),
                ..Default::default()
            }
        )
        .is_empty()
    );
    assert_eq!(
        ids(
            &mut s,
            HistoryFilter {
                limit: Some(0),
                ..Default::default()
            }
        )
        .len(),
        0
    );
}

fn history_limits<B: Backend>(mut b: B) {
    let mut s = b.open();
    let ops: Vec<WriteOp> = (0..1100)
        .map(|i| WriteOp::Append(msg(&format!("m{i}"), "a", "b", &["b"])))
        .collect();
    s.write_batch(&ops, 1).unwrap();
    assert_eq!(s.history(&HistoryFilter::default()).unwrap().len(), 50);
    let big = HistoryFilter {
        limit: Some(5000),
        ..Default::default()
    };
    assert_eq!(s.history(&big).unwrap().len(), 1000);
}

fn agents_and_subscriptions<B: Backend>(mut b: B) {
    let mut s = b.open();
    s.write_batch(
        &[
            WriteOp::AgentConnected {
                name: "bob".into(),
                cli: Some("claude".into()),
                session_id: "s1".into(),
            },
            WriteOp::Subscribe {
                agent: "bob".into(),
                pattern: "ci.>".into(),
            },
            WriteOp::Subscribe {
                agent: "bob".into(),
                pattern: "ci.>".into(),
            },
            WriteOp::Subscribe {
                agent: "bob".into(),
                pattern: "alerts".into(),
            },
            WriteOp::AgentConnected {
                name: "alice".into(),
                cli: None,
                session_id: "s2".into(),
            },
        ],
        100,
    )
    .unwrap();
    put(&mut s, msg("m1", "alice", "bob", &["bob"]), 150);
    put(&mut s, msg("m2", "alice", "bob", &["bob"]), 150);
    s.write_batch(
        &[
            WriteOp::AgentDisconnected {
                name: "bob".into(),
                session_id: "s1".into(),
            },
            WriteOp::Unsubscribe {
                agent: "bob".into(),
                pattern: "alerts".into(),
            },
            WriteOp::Unsubscribe {
                agent: "bob".into(),
                pattern: "nope".into(),
            },
            WriteOp::Unsubscribe {
                agent: "alice".into(),
                pattern: "x".into(),
            },
        ],
        200,
    )
    .unwrap();
    s.write_batch(
        &[
            // Reconnect without a cli keeps the one we know.
            WriteOp::AgentConnected {
                name: "bob".into(),
                cli: None,
                session_id: "s3".into(),
            },
            ack("bob", 1),
        ],
        300,
    )
    .unwrap();
    let mut s = b.reopen(s);
    assert_eq!(
        s.known_agents().unwrap(),
        vec![
            KnownAgent {
                name: "alice".into(),
                topics: vec![]
            },
            KnownAgent {
                name: "bob".into(),
                topics: vec!["ci.>".into()]
            },
        ]
    );
    let agents = s.agents().unwrap();
    assert_eq!(agents.len(), 2);
    let bob = &agents[1];
    assert_eq!(bob.name, "bob");
    assert_eq!(bob.cli.as_deref(), Some("claude"));
    assert!(!bob.online);
    assert_eq!((bob.first_seen, bob.last_seen, bob.pending), (100, 300, 1));
    assert_eq!(bob.topics, vec!["ci.>".to_string()]);
    let alice = &agents[0];
    assert_eq!(
        (
            alice.cli.as_deref(),
            alice.first_seen,
            alice.last_seen,
            alice.pending
        ),
        (None, 100, 100, 0)
    );
}

fn empty_store<B: Backend>(mut b: B) {
    let mut s = b.open();
    assert_eq!(s.stats().unwrap(), Stats::default());
    assert!(s.known_agents().unwrap().is_empty());
    assert!(s.agents().unwrap().is_empty());
    assert!(s.history(&HistoryFilter::default()).unwrap().is_empty());
    assert!(s.find("x", 10).unwrap().is_empty());
    assert!(s.take_pending("x", 0, 10).unwrap().is_empty());
    assert_eq!(s.write_batch(&[], 1).unwrap(), vec![]);
    assert_eq!(
        s.write_batch(
            &[
                ack("x", 5),
                WriteOp::Expire {
                    queued_before: 9,
                    except: vec![]
                }
            ],
            1
        )
        .unwrap(),
        vec![WriteResult::Done, WriteResult::Expired(vec![])]
    );
    // An ack before any message must not hide the first message.
    put(&mut s, msg("m1", "a", "x", &["x"]), 2);
    assert_eq!(pending_ids(&mut s, "x"), vec!["m1"]);
}

/// The urgent mark survives storage (an offline inbox is typed in urgent-first too).
fn urgent_survives_reopen<B: Backend>(mut b: B) {
    let mut s = b.open();
    let mut m = msg("u1", "a", "x", &["x"]);
    m.payload.urgent = true;
    put(&mut s, m, 1);
    put(&mut s, msg("n1", "a", "x", &["x"]), 2);
    let mut s = b.reopen(s);
    let pending = s.take_pending("x", 0, 10).unwrap();
    let marks: Vec<(&str, bool)> = pending
        .iter()
        .map(|p| (p.message.id.as_str(), p.message.payload.urgent))
        .collect();
    assert_eq!(marks, vec![("u1", true), ("n1", false)]);
}

/// A failure reported after the acknowledgement (a federation's stand-in reporting a dead
/// letter on another node) keeps its reason, and reported again it is not a second dead
/// letter; a message from another node counts as queued since its acceptance there.
fn a_late_failure_keeps_its_reason_and_counts_once<B: Backend>(mut b: B) {
    let mut s = b.open();
    let (p1, _) = put(&mut s, msg("far-1", "alice", "bob", &["bob"]), 10);
    s.write_batch(&[ack("bob", p1)], 11).unwrap();
    let fail = WriteOp::MarkById {
        recipient: "bob".into(),
        msg_id: "far-1".into(),
        status: DeliveryStatus::Failed,
        reason: Some("not delivered on node n2 (expired): gone".into()),
    };
    let res = s.write_batch(std::slice::from_ref(&fail), 12).unwrap();
    match &res[0] {
        WriteResult::DeadLettered(n) => {
            assert_eq!(n.len(), 1);
            assert_eq!(n[0].reason, "not delivered on node n2 (expired): gone");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(s.write_batch(&[fail], 13).unwrap(), vec![WriteResult::Done]);
    assert_eq!(s.dead_letters(true, 10).unwrap().len(), 1);
    // Queued since its acceptance on its origin node: the expiry sweep counts from then.
    let mut far = msg("far-2", "alice", "carol", &["carol"]);
    far.queued_at = Some(5);
    put(&mut s, far, 20);
    match &s
        .write_batch(
            &[WriteOp::Expire {
                queued_before: 6,
                except: vec![],
            }],
            21,
        )
        .unwrap()[0]
    {
        WriteResult::Expired(n) => assert_eq!(n.len(), 1, "{n:?}"),
        other => panic!("{other:?}"),
    }
}

macro_rules! for_both {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $( #[test] fn $name() { super::$name(super::SqliteBackend::new()) } )*
        }
        mod memory {
            $( #[test] fn $name() { super::$name(super::MemoryBackend) } )*
        }
    };
}

/// Every state change of a delivered, a failed, an expired and a refused message is in its
/// story; dead letters are listed, retried (once) and purged; across reopen.
fn trace_and_dead_letters<B: Backend>(mut b: B) {
    use relay_protocol::query::TraceState as T;
    let mut s = b.open();
    s.write_batch(
        &[WriteOp::AgentConnected {
            name: "bob".into(),
            cli: None,
            session_id: "s1".into(),
        }],
        1,
    )
    .unwrap();
    let (p1, _) = put(&mut s, msg("ok-1", "alice", "bob", &["bob"]), 10);
    let (p2, _) = put(&mut s, msg("fail-2", "alice", "bob", &["bob"]), 10);
    let (p3, _) = put(&mut s, msg("late-3", "alice", "carol", &["carol"]), 10);
    let mut refused = msg("refused-4", "alice", "bob", &[]);
    refused.payload.in_reply_to = Some("ok-1".into());
    s.write_batch(
        &[
            WriteOp::Sent {
                recipient: "bob".into(),
                session_id: "s1".into(),
                after: 0,
                through: p2,
                at: 11,
            },
            ack("bob", p1),
            WriteOp::Reject {
                message: Box::new(refused),
                code: "budget_exceeded".into(),
                reason: "too many hops".into(),
            },
        ],
        12,
    )
    .unwrap();
    // A later state after the acknowledgement, found by id.
    let res = s
        .write_batch(
            &[
                WriteOp::MarkById {
                    recipient: "bob".into(),
                    msg_id: "ok-1".into(),
                    status: DeliveryStatus::Verified,
                    reason: None,
                },
                WriteOp::SetStatus {
                    recipient: "bob".into(),
                    pos: p2,
                    status: DeliveryStatus::Failed,
                    reason: None,
                },
            ],
            13,
        )
        .unwrap();
    assert_eq!(res[0], WriteResult::Done);
    assert!(matches!(&res[1], WriteResult::DeadLettered(n) if n.len() == 1));
    let res = s
        .write_batch(
            &[WriteOp::Expire {
                queued_before: 20,
                except: vec!["bob".into()],
            }],
            30,
        )
        .unwrap();
    match &res[0] {
        WriteResult::Expired(n) => {
            assert_eq!(n.len(), 1);
            assert_eq!(
                (n[0].msg_id.as_str(), n[0].from.as_str()),
                ("late-3", "alice")
            );
            assert_eq!(
                (n[0].recipient.as_str(), n[0].code.as_str()),
                ("carol", "expired")
            );
        }
        other => panic!("{other:?}"),
    }
    let mut s = b.reopen(s);
    let story = |s: &mut B::S, id: &str| -> Vec<(u64, T)> {
        let m = s.find(id, 1).unwrap().remove(0);
        let ev = s.events(Some(m.pos), &m.id, &m.from).unwrap();
        crate::trace_of(&m, ev)
            .into_iter()
            .map(|e| (e.ts, e.state))
            .collect()
    };
    assert_eq!(
        story(&mut s, "ok-1"),
        vec![
            (10, T::Accepted),
            (10, T::Queued),
            (11, T::Delivered),
            (12, T::Injected),
            (13, T::Verified)
        ]
    );
    assert_eq!(
        story(&mut s, "fail-2"),
        vec![
            (10, T::Accepted),
            (10, T::Queued),
            (11, T::Delivered),
            (13, T::Failed),
            (13, T::DeadLettered)
        ]
    );
    assert_eq!(
        story(&mut s, "late-3"),
        vec![
            (10, T::Accepted),
            (10, T::Queued),
            (30, T::Expired),
            (30, T::DeadLettered)
        ]
    );
    let rej: Vec<T> = s
        .events(None, "refused-4", "alice")
        .unwrap()
        .into_iter()
        .map(|e| e.state)
        .collect();
    assert_eq!(rej, vec![T::Rejected, T::DeadLettered]);
    assert_eq!(s.find_rejected("refused", 10).unwrap().len(), 1);
    // By its short id ("refused-4"'s last 8 characters); a shorter tail finds nothing.
    assert_eq!(s.find_rejected("efused-4", 10).unwrap().len(), 1);
    assert!(s.find_rejected("fused-4", 10).unwrap().is_empty());

    // The failure and the expiry wait to be told (the refusal was told by its NACK).
    let untold: Vec<String> = s
        .unnotified(10)
        .unwrap()
        .into_iter()
        .map(|n| n.code)
        .collect();
    assert_eq!(untold, vec!["failed", "expired"]);
    let first = s.unnotified(1).unwrap()[0].dlq_id;
    s.write_batch(&[WriteOp::Notified { dlq_id: first }], 31)
        .unwrap();
    assert_eq!(s.unnotified(10).unwrap().len(), 1);
    // Newest first: the expiry, the failure, the refusal.
    let dl = s.dead_letters(false, 10).unwrap();
    let codes: Vec<&str> = dl.iter().map(|d| d.code.as_str()).collect();
    assert_eq!(codes, vec!["expired", "failed", "budget_exceeded"]);
    assert_eq!(dl[0].body, "body of late-3");
    assert_eq!(dl[2].body, "body of refused-4");
    assert_eq!(dl[2].pos, None);
    let figures = s.delivery_figures(100).unwrap();
    assert_eq!(figures.dead_letters, 3);
    assert_eq!(figures.rejected, 1);
    assert_eq!(figures.by_state.get("expired"), Some(&1));
    assert_eq!(figures.by_state.get("failed"), Some(&1));
    assert_eq!(figures.by_state.get("verified"), Some(&1));

    // Retry: the expired copy is queued again with a fresh time to live.
    let res = s
        .write_batch(
            &[WriteOp::Retry {
                dlq_id: dl[0].dlq_id,
            }],
            40,
        )
        .unwrap();
    let outcome = |r: &WriteResult| match r {
        WriteResult::Retried(o) => o.as_ref().clone(),
        other => panic!("{other:?}"),
    };
    match outcome(&res[0]) {
        crate::RetryOutcome::Requeued {
            recipient,
            delivery,
            entry,
        } => {
            assert_eq!(recipient, "carol");
            assert_eq!(delivery.message.pos, p3);
            assert_eq!(entry.retried_at, Some(40));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(pending_ids(&mut s, "carol"), vec!["late-3"]);
    // Not expired again by a sweep that the old queue time would have matched.
    let res = s
        .write_batch(
            &[WriteOp::Expire {
                queued_before: 35,
                except: vec![],
            }],
            41,
        )
        .unwrap();
    assert_eq!(res[0], WriteResult::Expired(vec![]));
    // A second retry does nothing.
    let res = s
        .write_batch(
            &[WriteOp::Retry {
                dlq_id: dl[0].dlq_id,
            }],
            42,
        )
        .unwrap();
    assert!(matches!(
        outcome(&res[0]),
        crate::RetryOutcome::AlreadyRetried(_)
    ));
    // The refused one comes back as a message to send again, unchanged.
    let res = s
        .write_batch(
            &[WriteOp::Retry {
                dlq_id: dl[2].dlq_id,
            }],
            43,
        )
        .unwrap();
    match outcome(&res[0]) {
        crate::RetryOutcome::Resend { message, .. } => {
            assert_eq!(
                (
                    message.id.as_str(),
                    message.from.as_str(),
                    message.to.as_str()
                ),
                ("refused-4", "alice", "bob")
            );
            assert_eq!(message.payload.in_reply_to.as_deref(), Some("ok-1"));
        }
        other => panic!("{other:?}"),
    }
    let res = s
        .write_batch(&[WriteOp::Retry { dlq_id: 999 }], 44)
        .unwrap();
    assert_eq!(outcome(&res[0]), crate::RetryOutcome::NotFound);
    assert_eq!(s.dead_letters(false, 10).unwrap().len(), 1);
    assert_eq!(s.dead_letters(true, 10).unwrap().len(), 3);
    let story3 = story(&mut s, "late-3");
    assert!(story3.contains(&(40, T::Retried)), "{story3:?}");
    let mut s = b.reopen(s);
    assert_eq!(pending_ids(&mut s, "carol"), vec!["late-3"]);
    let res = s.write_batch(&[WriteOp::Purge], 50).unwrap();
    assert_eq!(res[0], WriteResult::Purged(3));
    assert!(s.dead_letters(true, 10).unwrap().is_empty());
    let _ = p1;
}

/// Hop counts of replies are found again at start, newest first.
fn recent_hops<B: Backend>(mut b: B) {
    let mut s = b.open();
    put(&mut s, msg("fresh", "a", "b", &["b"]), 1);
    for (i, h) in [(1, 1u32), (2, 2)] {
        let mut m = msg(&format!("r{i}"), "b", "a", &["a"]);
        m.payload.in_reply_to = Some("fresh".into());
        m.payload.budget = Some(relay_protocol::Budget {
            hops: h,
            max_hops: 10,
            expires_at: None,
        });
        put(&mut s, m, 2);
    }
    let mut s = b.reopen(s);
    assert_eq!(
        s.recent_hops(10).unwrap(),
        vec![("r2".to_owned(), 2), ("r1".to_owned(), 1)]
    );
    assert_eq!(s.recent_hops(1).unwrap(), vec![("r2".to_owned(), 2)]);
}

/// A spawned worker's record outlives a reopen; it ends once (issue 25).
fn spawned_records_survive_reopen<B: Backend>(mut b: B) {
    use relay_protocol::query::SpawnRecord;
    let mut s = b.open();
    let rec = |name: &str, at: u64| SpawnRecord {
        name: name.into(),
        parent: "Lead".into(),
        depth: 1,
        at,
        worktree: (name == "w2").then(|| "/p/.agent-relay/worktrees/w2".to_owned()),
        notify_idle: name == "w1",
        ended_at: None,
    };
    let out = s
        .write_batch(
            &[
                WriteOp::Spawned {
                    record: rec("w1", 1),
                    task_id: Some("t1".into()),
                },
                WriteOp::Spawned {
                    record: rec("w2", 2),
                    task_id: None,
                },
                WriteOp::SpawnEnded {
                    name: "w1".into(),
                    at: 5,
                },
                WriteOp::SpawnEnded {
                    name: "w1".into(),
                    at: 9,
                },
            ],
            3,
        )
        .unwrap();
    assert_eq!(
        out[0],
        WriteResult::Spawned(rec("w1", 1), Some("t1".into()))
    );
    let mut s = b.reopen(s);
    let mut ended = rec("w1", 1);
    ended.ended_at = Some(5);
    assert_eq!(s.spawned().unwrap(), vec![ended, rec("w2", 2)]);
}

/// Claims (issue 25.7): made, renewed in place, released one by one or all at once, gone with a
/// forgotten agent, kept across reopen.
fn claims_are_kept_renewed_and_released<B: Backend>(mut b: B) {
    let claim = |agent: &str, path: &str, since: u64, until: u64| WriteOp::Claim {
        agent: agent.into(),
        path: path.into(),
        since,
        until,
    };
    let mut s = b.open();
    s.write_batch(
        &[
            claim("alice", "src/a.rs", 1, 100),
            claim("alice", "src/b/", 1, 100),
            claim("bob", "src/a.rs", 2, 200),
            claim("carol", "x.rs", 3, 300),
            // Renewed: one row, the later expiry.
            claim("alice", "src/a.rs", 1, 150),
        ],
        5,
    )
    .unwrap();
    let mut s = b.reopen(s);
    let held = |s: &mut B::S| {
        let mut v: Vec<(String, String, u64)> = s
            .claims()
            .unwrap()
            .into_iter()
            .map(|c| (c.agent, c.path, c.until))
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        held(&mut s),
        [
            ("alice".into(), "src/a.rs".into(), 150),
            ("alice".into(), "src/b/".into(), 100),
            ("bob".into(), "src/a.rs".into(), 200),
            ("carol".into(), "x.rs".into(), 300),
        ]
    );
    s.write_batch(
        &[
            WriteOp::Unclaim {
                agent: "alice".into(),
                paths: vec!["src/b/".into()],
            },
            WriteOp::Unclaim {
                agent: "bob".into(),
                paths: vec![],
            },
            WriteOp::AgentConnected {
                name: "carol".into(),
                cli: None,
                session_id: "s1".into(),
            },
        ],
        6,
    )
    .unwrap();
    s.write_batch(
        &[
            WriteOp::AgentDisconnected {
                name: "carol".into(),
                session_id: "s1".into(),
            },
            WriteOp::ForgetAgent {
                name: "carol".into(),
            },
        ],
        7,
    )
    .unwrap();
    let mut s = b.reopen(s);
    assert_eq!(held(&mut s), [("alice".into(), "src/a.rs".into(), 150)]);
}

for_both!(
    spawned_records_survive_reopen,
    claims_are_kept_renewed_and_released,
    trace_and_dead_letters,
    recent_hops,
    dedupe,
    seqs_gapless_per_stream_across_reopen,
    broadcast_to_several,
    duplicate_recipient_gets_one_delivery,
    ack_through_and_take_pending,
    ack_and_append_in_one_batch,
    set_status,
    expire_with_except,
    find_exact_prefix_ambiguous_none,
    find_by_short_id,
    history_filters_and_paging,
    history_limits,
    agents_and_subscriptions,
    empty_store,
    urgent_survives_reopen,
    a_late_failure_keeps_its_reason_and_counts_once,
);

#[test]
fn status_codes_match_sql() {
    assert_eq!(DeliveryStatus::Queued.code(), 0);
    assert_eq!(DeliveryStatus::Acked.code(), 1);
    assert_eq!(DeliveryStatus::Expired.code(), 4);
    // The row code of a delivery queued again below its watermark is no state's.
    assert!(DeliveryStatus::from_code(crate::sqlite::QUEUED_BELOW).is_none());
    assert_eq!(crate::sqlite::QUEUED_BELOW, 5);
}

// --- SQLite only ------------------------------------------------------------------------------

#[test]
fn sqlite_failed_batch_keeps_nothing() {
    let mut b = SqliteBackend::new();
    let mut s = b.open();
    put(&mut s, msg("m1", "alice", "bob", &["bob"]), 1);
    // A second connection installs a trigger that makes any delivery to "boom" fail: an honest
    // SQLite error in the middle of a batch.
    let other = rusqlite::Connection::open(b.path()).unwrap();
    other
        .execute_batch(
            "CREATE TRIGGER boom BEFORE INSERT ON deliveries WHEN NEW.recipient = (SELECT id FROM names WHERE name = 'boom')
             BEGIN SELECT RAISE(ABORT, 'boom'); END;",
        )
        .unwrap();
    let err = s
        .write_batch(
            &[
                WriteOp::Append(msg("m2", "alice", "bob", &["bob"])),
                ack("bob", 1),
                WriteOp::Append(on_topic(msg("m3", "alice", "*", &["carol"]), "t")),
                WriteOp::AgentConnected {
                    name: "bob".into(),
                    cli: None,
                    session_id: "s".into(),
                },
                WriteOp::Append(msg("m4", "alice", "boom", &["bob", "boom"])),
            ],
            2,
        )
        .unwrap_err();
    assert!(matches!(err, StoreError::Sqlite(_)), "{err}");
    let check = |s: &mut SqliteStore| {
        assert_eq!(
            s.stats().unwrap(),
            Stats {
                messages: 1,
                pending: 1
            }
        );
        assert!(s.known_agents().unwrap().is_empty());
        assert_eq!(pending_ids(s, "bob"), vec!["m1"]);
    };
    check(&mut s);
    // The seqs handed out in the failed batch are handed out again.
    let res = s
        .write_batch(
            &[
                WriteOp::Append(msg("m2", "alice", "bob", &["bob"])),
                WriteOp::Append(on_topic(msg("m3", "alice", "*", &["carol"]), "t")),
            ],
            3,
        )
        .unwrap();
    assert_eq!(stored(&res[0]).1, vec![2]);
    assert_eq!(stored(&res[1]).1, vec![1]);
    other.execute_batch("DROP TRIGGER boom").unwrap();
    let mut s = b.reopen(s);
    assert_eq!(
        put(&mut s, msg("m5", "alice", "bob", &["bob"]), 4).1,
        vec![3]
    );
    assert_eq!(pending_ids(&mut s, "bob"), vec!["m1", "m2", "m5"]);
}

#[test]
fn sqlite_failed_batch_keeps_cursor() {
    let mut b = SqliteBackend::new();
    let mut s = b.open();
    put(&mut s, msg("m1", "alice", "bob", &["bob"]), 1);
    let other = rusqlite::Connection::open(b.path()).unwrap();
    other
        .execute_batch(
            "CREATE TRIGGER boom BEFORE INSERT ON deliveries WHEN NEW.recipient = (SELECT id FROM names WHERE name = 'boom')
             BEGIN SELECT RAISE(ABORT, 'boom'); END;",
        )
        .unwrap();
    s.write_batch(
        &[
            ack("bob", 1),
            WriteOp::Append(msg("m2", "a", "boom", &["boom"])),
        ],
        2,
    )
    .unwrap_err();
    // The ack was rolled back, and so was the in-memory cursor.
    assert_eq!(pending_ids(&mut s, "bob"), vec!["m1"]);
}

#[test]
fn sqlite_refuses_newer_schema() {
    let mut b = SqliteBackend::new();
    drop(b.open());
    let other = rusqlite::Connection::open(b.path()).unwrap();
    other.pragma_update(None, "user_version", 99).unwrap();
    drop(other);
    match SqliteStore::open(&b.path()) {
        Err(StoreError::SchemaTooNew {
            found: 99,
            supported: crate::sqlite::SCHEMA_VERSION,
        }) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn sqlite_settings_and_location() {
    let mut b = SqliteBackend::new();
    let s = b.open();
    assert_eq!(s.location(), b.path().display().to_string());
    let c = rusqlite::Connection::open(b.path()).unwrap();
    let mode: String = c
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    let v: i64 = c
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, crate::sqlite::SCHEMA_VERSION);
    assert_eq!(MemoryStore::new().location(), ":memory:");
}

#[test]
fn sqlite_io_error_for_bad_dir() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    match SqliteStore::open(&file.join("sub/relay.db")) {
        Err(StoreError::Io { .. }) => {}
        other => panic!("{other:?}"),
    }
}

// --- Property test ----------------------------------------------------------------------------

mod prop {
    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Step {
        /// sender, recipients (indexes), topic, id (small range so duplicates happen).
        Append {
            from: usize,
            to: Vec<usize>,
            topic: Option<usize>,
            id: u8,
        },
        /// recipient, through = last pos + delta (may be past the end or behind).
        Ack { rcpt: usize, delta: i64 },
        /// Ends the current batch, then takes up to `limit` pending deliveries.
        Take { rcpt: usize, limit: usize },
        /// A session ended holding positions (through - back, through].
        HandOut { rcpt: usize, back: i64, delta: i64 },
        /// The `nth` delivery of a recipient (in position order) reported as acked (0),
        /// verified (1) or failed (2): in order, out of order, twice, after another state.
        Set {
            rcpt: usize,
            nth: usize,
            state: usize,
        },
        /// Deliveries queued more than `back` batches ago expire (except to `keep`).
        Expire { back: u64, keep: Option<usize> },
        /// Ends the current batch.
        Commit,
        /// Reopen (SQLite) between batches.
        Reopen,
    }

    const NAMES: [&str; 3] = ["r0", "r1", "r2"];
    const SENDERS: [&str; 2] = ["s0", "s1"];

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            6 => (
                0..2usize,
                proptest::collection::vec(0..3usize, 0..3),
                proptest::option::of(0..2usize),
                0..40u8,
            )
                .prop_map(|(from, to, topic, id)| Step::Append { from, to, topic, id }),
            2 => (0..3usize, 0..4usize).prop_map(|(rcpt, limit)| Step::Take { rcpt, limit }),
            3 => (0..3usize, -3..3i64).prop_map(|(rcpt, delta)| Step::Ack { rcpt, delta }),
            2 => (0..3usize, 0..5i64, -3..2i64)
                .prop_map(|(rcpt, back, delta)| Step::HandOut { rcpt, back, delta }),
            4 => (0..3usize, 0..8usize, 0..3usize)
                .prop_map(|(rcpt, nth, state)| Step::Set { rcpt, nth, state }),
            1 => (0..4u64, proptest::option::of(0..3usize))
                .prop_map(|(back, keep)| Step::Expire { back, keep }),
            2 => Just(Step::Commit),
            1 => Just(Step::Reopen),
        ]
    }

    /// (id, seq, no longer queued, times handed out, state, queued at).
    type ModelDelivery = (String, u64, bool, u32, DeliveryStatus, u64);

    /// The expected state, kept by a model that knows nothing of cursors or SQL.
    #[derive(Default)]
    struct Model {
        ids: BTreeMap<(String, String), i64>,
        streams: BTreeMap<(String, String, String), u64>,
        /// recipient → pos → (id, seq, acked, times handed out)
        deliveries: BTreeMap<String, BTreeMap<i64, ModelDelivery>>,
        max_pos: i64,
    }

    /// The dead letter the model expects for `recipient`'s copy of the message at `pos` (the
    /// comparison ignores its number and reason).
    fn notice(
        ids: &BTreeMap<(String, String), i64>,
        pos: i64,
        recipient: &str,
        code: &str,
    ) -> crate::DeadNotice {
        let ((msg_id, from), _) = ids.iter().find(|(_, p)| **p == pos).unwrap();
        crate::DeadNotice {
            dlq_id: 0,
            msg_id: msg_id.clone(),
            from: from.clone(),
            recipient: recipient.to_owned(),
            code: code.to_owned(),
            reason: String::new(),
        }
    }

    fn run<B: Backend>(mut b: B, steps: &[Step]) -> Result<(), TestCaseError> {
        let mut s = Some(b.open());
        let mut model = Model::default();
        let mut batch: Vec<WriteOp> = Vec::new();
        // Model effects of the pending batch are applied as ops are queued (batches never fail).
        let mut expected: Vec<WriteResult> = Vec::new();
        // Each batch is a tick later, so that expiry has ages to tell apart.
        let mut now = 10u64;
        let flush = |s: &mut B::S,
                     batch: &mut Vec<WriteOp>,
                     expected: &mut Vec<WriteResult>,
                     now: &mut u64|
         -> Result<(), TestCaseError> {
            let got = s.write_batch(batch, *now).unwrap();
            *now += 1;
            prop_assert_eq!(got.len(), expected.len());
            for (g, e) in got.iter().zip(expected.iter()) {
                match (g, e) {
                    (
                        WriteResult::Appended(AppendOutcome::Stored {
                            message: gm,
                            seqs: gs,
                        }),
                        WriteResult::Appended(AppendOutcome::Stored {
                            message: em,
                            seqs: es,
                        }),
                    ) => {
                        prop_assert_eq!(gm.pos, em.pos);
                        prop_assert_eq!(gs, es);
                    }
                    // Dead letters: which copies, not their numbers or wording.
                    (WriteResult::DeadLettered(gn), WriteResult::DeadLettered(en))
                    | (WriteResult::Expired(gn), WriteResult::Expired(en)) => {
                        let key = |n: &Vec<crate::DeadNotice>| {
                            let mut k: Vec<(String, String, String)> = n
                                .iter()
                                .map(|d| (d.msg_id.clone(), d.recipient.clone(), d.code.clone()))
                                .collect();
                            k.sort();
                            k
                        };
                        prop_assert_eq!(key(gn), key(en));
                    }
                    _ => prop_assert_eq!(g, e),
                }
            }
            batch.clear();
            expected.clear();
            Ok(())
        };
        let mut next_pos = 1;
        for st in steps {
            match st {
                Step::Append {
                    from,
                    to,
                    topic,
                    id,
                } => {
                    let from = SENDERS[*from];
                    let to_names: Vec<&str> = to.iter().map(|i| NAMES[*i]).collect();
                    let dest = if to_names.len() == 1 {
                        to_names[0]
                    } else {
                        "*"
                    };
                    let mut m = msg(&format!("id{id}"), from, dest, &to_names);
                    m.topic = topic.map(|t| format!("t{t}"));
                    let key = (m.id.clone(), from.to_string());
                    if let Some(&pos) = model.ids.get(&key) {
                        expected.push(WriteResult::Appended(AppendOutcome::Duplicate { pos }));
                    } else if let Some(((_, owner), _)) = model
                        .ids
                        .range((m.id.clone(), String::new())..)
                        .next()
                        .filter(|((i, _), _)| *i == m.id)
                    {
                        // An id names one message: another sender's is refused.
                        expected.push(WriteResult::Appended(AppendOutcome::Taken {
                            owner: owner.clone(),
                        }));
                    } else {
                        let pos = next_pos;
                        next_pos += 1;
                        model.ids.insert(key, pos);
                        model.max_pos = pos;
                        let mut seqs = Vec::new();
                        let mut done: Vec<&str> = Vec::new();
                        for r in &to_names {
                            if let Some(j) = done.iter().position(|d| d == r) {
                                seqs.push(seqs[j]);
                                continue;
                            }
                            let k = (
                                r.to_string(),
                                m.topic.clone().unwrap_or_default(),
                                from.to_string(),
                            );
                            let seq = model.streams.entry(k).or_insert(0);
                            *seq += 1;
                            model.deliveries.entry(r.to_string()).or_default().insert(
                                pos,
                                (m.id.clone(), *seq, false, 0, DeliveryStatus::Queued, now),
                            );
                            seqs.push(*seq);
                            done.push(r);
                        }
                        let message = Arc::new(StoredMessage {
                            pos,
                            id: m.id.clone(),
                            ts: 7,
                            from: m.from.clone(),
                            to: m.to.clone(),
                            topic: m.topic.clone(),
                            payload: m.payload.clone(),
                        });
                        expected.push(WriteResult::Appended(AppendOutcome::Stored {
                            message,
                            seqs,
                        }));
                    }
                    batch.push(WriteOp::Append(m));
                }
                Step::Ack { rcpt, delta } => {
                    let r = NAMES[*rcpt];
                    let through = model.max_pos + delta;
                    if let Some(ds) = model.deliveries.get_mut(r) {
                        for (_, d) in ds.range_mut(..=through) {
                            if !d.2 {
                                d.4 = DeliveryStatus::Acked;
                            }
                            d.2 = true;
                        }
                    }
                    batch.push(ack(r, through));
                    expected.push(WriteResult::Done);
                }
                Step::Set { rcpt, nth, state } => {
                    let r = NAMES[*rcpt];
                    let status = [
                        DeliveryStatus::Acked,
                        DeliveryStatus::Verified,
                        DeliveryStatus::Failed,
                    ][*state];
                    let Some(ds) = model.deliveries.get_mut(r).filter(|ds| !ds.is_empty()) else {
                        continue;
                    };
                    let n = ds.len();
                    let Some((&pos, d)) = ds.iter_mut().nth(*nth % n) else {
                        continue;
                    };
                    // The stores' rules: a state is recorded once, and an acknowledgement
                    // only acknowledges what waits.
                    let changes = d.4 != status
                        && (status != DeliveryStatus::Acked || d.4 == DeliveryStatus::Queued);
                    let mut res = WriteResult::Done;
                    if changes {
                        d.4 = status;
                        d.2 = true;
                        if status == DeliveryStatus::Failed {
                            res = WriteResult::DeadLettered(vec![notice(
                                &model.ids, pos, r, "failed",
                            )]);
                        }
                    }
                    batch.push(WriteOp::SetStatus {
                        recipient: r.into(),
                        pos,
                        status,
                        reason: None,
                    });
                    expected.push(res);
                }
                Step::Expire { back, keep } => {
                    let cutoff = now.saturating_sub(*back);
                    let keep: Vec<String> = keep.iter().map(|k| NAMES[*k].to_owned()).collect();
                    let mut notices = Vec::new();
                    for (r, ds) in &mut model.deliveries {
                        if keep.contains(r) {
                            continue;
                        }
                        for (&pos, d) in ds.iter_mut() {
                            if d.2 || d.5 >= cutoff {
                                continue;
                            }
                            d.2 = true;
                            d.4 = DeliveryStatus::Expired;
                            notices.push(notice(&model.ids, pos, r, "expired"));
                        }
                    }
                    batch.push(WriteOp::Expire {
                        queued_before: cutoff,
                        except: keep,
                    });
                    expected.push(WriteResult::Expired(notices));
                }
                Step::HandOut { rcpt, back, delta } => {
                    let r = NAMES[*rcpt];
                    let through = model.max_pos + delta;
                    let after = through - back;
                    if let Some(ds) = model.deliveries.get_mut(r).filter(|_| through > after) {
                        for (_, d) in ds.range_mut(after + 1..=through) {
                            if !d.2 {
                                d.3 += 1;
                            }
                        }
                    }
                    batch.push(WriteOp::HandedOut {
                        recipient: r.into(),
                        after,
                        through,
                    });
                    expected.push(WriteResult::Done);
                }
                Step::Commit => flush(s.as_mut().unwrap(), &mut batch, &mut expected, &mut now)?,
                Step::Take { rcpt, limit } => {
                    let st = s.as_mut().unwrap();
                    flush(st, &mut batch, &mut expected, &mut now)?;
                    let r = NAMES[*rcpt];
                    let mut want = Vec::new();
                    if let Some(ds) = model.deliveries.get_mut(r) {
                        for d in ds.values().filter(|d| !d.2).take(*limit) {
                            want.push((d.0.clone(), d.1, d.3 + 1));
                        }
                    }
                    let got: Vec<(String, u64, u32)> = st
                        .take_pending(r, 0, *limit)
                        .unwrap()
                        .iter()
                        .map(|p| (p.message.id.clone(), p.seq, p.attempt))
                        .collect();
                    prop_assert_eq!(got, want, "take {} from {}", limit, r);
                }
                Step::Reopen => {
                    flush(s.as_mut().unwrap(), &mut batch, &mut expected, &mut now)?;
                    let old = s.take().unwrap();
                    s = Some(b.reopen(old));
                }
            }
        }
        let s = s.as_mut().unwrap();
        flush(s, &mut batch, &mut expected, &mut now)?;
        // Gapless: each stream's seqs are exactly 1..=n (checked via the model, which the store
        // matched op by op), and take_pending returns exactly the non-acked deliveries.
        for r in NAMES {
            let want: Vec<(String, u64)> = model
                .deliveries
                .get(r)
                .map(|ds| {
                    ds.values()
                        .filter(|d| !d.2)
                        .map(|d| (d.0.clone(), d.1))
                        .collect()
                })
                .unwrap_or_default();
            let got: Vec<(String, u64)> = s
                .take_pending(r, 0, 10_000)
                .unwrap()
                .iter()
                .map(|p| (p.message.id.clone(), p.seq))
                .collect();
            prop_assert_eq!(got, want, "recipient {}", r);
        }
        let mut per_stream: BTreeMap<(String, String, String), BTreeSet<u64>> = BTreeMap::new();
        let mut by_state: BTreeMap<String, u64> = BTreeMap::new();
        for m in s
            .history(&HistoryFilter {
                limit: Some(1000),
                ..Default::default()
            })
            .unwrap()
        {
            for d in m.deliveries {
                // Every delivery's state as the model says, whether the watermark or its row
                // holds it.
                let want = model.deliveries[&d.recipient][&m.pos].4;
                prop_assert_eq!(d.status, want, "{} to {}", m.id, d.recipient);
                prop_assert_eq!(d.updated_at.is_some(), want != DeliveryStatus::Queued);
                *by_state.entry(want.as_str().to_owned()).or_default() += 1;
                let k = (
                    d.recipient,
                    m.topic.clone().unwrap_or_default(),
                    m.from.clone(),
                );
                prop_assert!(
                    per_stream.entry(k).or_default().insert(d.seq),
                    "seq given twice"
                );
            }
        }
        prop_assert_eq!(s.delivery_figures(10).unwrap().by_state, by_state);
        for (k, seqs) in per_stream {
            let n = seqs.len() as u64;
            prop_assert_eq!(
                seqs.into_iter().collect::<Vec<_>>(),
                (1..=n).collect::<Vec<_>>(),
                "stream {:?}",
                k
            );
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        #[test]
        fn interleavings_sqlite(steps in proptest::collection::vec(step(), 1..80)) {
            run(SqliteBackend::new(), &steps)?;
        }

        #[test]
        fn interleavings_memory(steps in proptest::collection::vec(step(), 1..80)) {
            run(MemoryBackend, &steps)?;
        }
    }
}
