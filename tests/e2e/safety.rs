//! Safety and honesty: hop budgets stop agents answering each other forever, rate limits stop
//! a flood without touching other senders, everything not delivered is in the dead-letter
//! queue with its reason (and its sender is told), and `trace` tells each message's story.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::*;

/// The states in a message's trace, in order, as `state` or `state@recipient`.
fn stages(relay: &Relay, id: &str) -> Vec<String> {
    trace_events(relay, id)
        .iter()
        .map(|e| match e["recipient"].as_str() {
            Some(r) => format!("{}@{r}", e["state"].as_str().unwrap()),
            None => e["state"].as_str().unwrap().to_owned(),
        })
        .collect()
}

/// Waits until the trace of `id` holds every one of `want` (the router writes a session's
/// hand-over range when it is idle, so it can trail the acknowledgement by a moment).
fn wait_stages(relay: &Relay, id: &str, want: &[&str]) -> Vec<String> {
    let deadline = relay_protocol::now_instant() + Duration::from_secs(20);
    loop {
        let last = stages(relay, id);
        if want.iter().all(|w| last.iter().any(|s| s == w)) {
            return last;
        }
        assert!(
            relay_protocol::now_instant() < deadline,
            "trace of {id}: want {want:?}, have {last:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Reads until a frame of type `ty`, answering PINGs and collecting notices (DELIVERs from
/// `relay`) on the way.
fn expect_noting(c: &mut Raw, ty: &str, notices: &mut Vec<Value>) -> Value {
    loop {
        let f = c.read().expect("connection open");
        if f["type"] == "PING" {
            c.send_env("PONG", json!({}), json!({}));
        } else if f["type"] == "DELIVER" && f["from"] == "relay" && ty != "DELIVER" {
            c.ack(&f);
            notices.push(f);
        } else if f["type"] == ty {
            return f;
        } else {
            panic!("expected {ty}, got {f}");
        }
    }
}

/// The daemon's answer to a SEND: the next ACK or NACK (PINGs answered).
fn answer(c: &mut Raw) -> Value {
    loop {
        let f = c.read().expect("connection open");
        match f["type"].as_str().unwrap() {
            "PING" => {
                c.send_env("PONG", json!({}), json!({}));
            }
            "ACK" | "NACK" => return f,
            _ => {}
        }
    }
}

#[test]
fn trace_shows_every_stage_and_dead_letters_are_listed_retried_and_purged() {
    let relay = Relay::start_with(&["--inbox-ttl", "1"]);
    // Carol is known but offline: what is sent to her expires.
    relay.known_offline("Carol");
    let (mut bob, _) = relay.agent("Bob");
    let (mut alice, _) = relay.agent("Alice");
    let mut notices = Vec::new();

    // Delivered, injected, then verified (a second ACK with a later state).
    let ok = alice.send("Bob", "please review");
    expect_noting(&mut alice, "ACK", &mut notices);
    let d = bob.expect("DELIVER");
    bob.ack(&d);
    bob.send_env(
        "ACK",
        json!({}),
        json!({"ack_id": ok, "seq": d["delivery"]["seq"], "state": "verified"}),
    );
    // Failed: the recipient reports it could not hand the message over.
    let failed = alice.send("Bob", "this one fails");
    expect_noting(&mut alice, "ACK", &mut notices);
    let d = bob.expect("DELIVER");
    bob.send_env(
        "ACK",
        json!({}),
        json!({"ack_id": failed, "seq": d["delivery"]["seq"], "state": "failed"}),
    );
    // Expired: Carol never comes back within the TTL.
    let late = alice.send("Carol", "you will not see this in time");
    assert_eq!(
        expect_noting(&mut alice, "ACK", &mut notices)["payload"]["status"],
        "queued"
    );

    let s = wait_stages(
        &relay,
        &ok,
        &[
            "accepted",
            "queued@Bob",
            "delivered@Bob",
            "injected@Bob",
            "verified@Bob",
        ],
    );
    assert_eq!(s.first().map(String::as_str), Some("accepted"), "{s:?}");
    assert!(!s.iter().any(|x| x.starts_with("dead")), "{s:?}");
    wait_stages(
        &relay,
        &failed,
        &[
            "accepted",
            "queued@Bob",
            "delivered@Bob",
            "failed@Bob",
            "dead_lettered@Bob",
        ],
    );
    let s = wait_stages(
        &relay,
        &late,
        &[
            "accepted",
            "queued@Carol",
            "expired@Carol",
            "dead_lettered@Carol",
        ],
    );
    assert!(!s.iter().any(|x| x.starts_with("delivered")), "{s:?}");
    // The human-readable story.
    let text = ok_stdout(&relay.cli(&["trace", &late]));
    assert!(text.contains("expired") && text.contains("Carol"), "{text}");

    // The sender is told about both, by a notice in its inbox that answers the message.
    while notices.len() < 2 {
        let f = alice.read().expect("notice");
        if f["type"] == "DELIVER" {
            assert_eq!(f["from"], "relay", "{f}");
            alice.ack(&f);
            notices.push(f);
        } else if f["type"] == "PING" {
            alice.send_env("PONG", json!({}), json!({}));
        }
    }
    let answered: HashSet<&str> = notices
        .iter()
        .map(|n| n["payload"]["in_reply_to"].as_str().unwrap())
        .collect();
    assert_eq!(answered, HashSet::from([failed.as_str(), late.as_str()]));
    for n in &notices {
        let code = n["payload"]["data"]["relay_notice"]["code"]
            .as_str()
            .unwrap();
        assert!(code == "failed" || code == "expired", "{n}");
        assert!(
            n["payload"]["body"].as_str().unwrap().contains("dlq retry"),
            "{n}"
        );
    }

    // Listed with reasons, newest first.
    let list = cli_json(&relay, &["dlq", "list"]);
    let dl = list["dead_letters"].as_array().unwrap();
    assert_eq!(dl.len(), 2, "{list}");
    let expired = dl.iter().find(|d| d["code"] == "expired").unwrap();
    assert_eq!(expired["msg_id"], late.as_str());
    assert_eq!(expired["recipient"], "Carol");
    assert_eq!(expired["body"], "you will not see this in time");
    let text = ok_stdout(&relay.cli(&["dlq"]));
    assert!(
        text.contains("expired") && text.contains("failed"),
        "{text}"
    );
    let n = expired["dlq_id"].as_i64().unwrap().to_string();
    let show = cli_json(&relay, &["dlq", "show", &n]);
    assert_eq!(show["dead_letter"]["reason"], expired["reason"]);
    assert_eq!(cli_json(&relay, &["status"])["delivery"]["dead_letters"], 2);

    // Retried: queued for Carol again with a fresh TTL, and she gets it when she connects.
    let retry = cli_json(&relay, &["dlq", "retry", &n]);
    assert!(
        retry["outcome"].as_str().unwrap().contains("queued again"),
        "{retry}"
    );
    let (mut carol, _) = relay.agent("Carol");
    let d = carol.expect("DELIVER");
    assert_eq!(d["id"], late.as_str());
    carol.ack(&d);
    wait_stages(&relay, &late, &["retried@Carol", "injected@Carol"]);
    // A second retry is refused with a reason.
    let again = relay.cli(&["dlq", "retry", &n]);
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("already retried"),
        "{again:?}"
    );
    assert_eq!(
        cli_json(&relay, &["dlq", "list"])["dead_letters"]
            .as_array()
            .unwrap()
            .len(),
        1
    );

    // Nothing dropped silently: everything acknowledged, or waiting in the DLQ.
    wait_no_pending(&relay);
    let (acked, dead) = assert_nothing_dropped(&relay, &[], &[]);
    assert_eq!(acked, 4, "ok, the retried one and the two notices");
    assert_eq!(dead, 1, "the failed one");

    // Purged.
    let purge = cli_json(&relay, &["dlq", "purge"]);
    assert_eq!(purge["removed"], 2);
    assert!(
        cli_json(&relay, &["dlq", "list", "--all"])["dead_letters"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    // Status has the aggregate figures.
    let st = cli_json(&relay, &["status"]);
    assert_eq!(st["delivery"]["by_state"]["failed"], 1, "{st}");
    let stage_names: Vec<&str> = field_strs(&st["delivery"]["latency"], "stage");
    assert_eq!(
        stage_names,
        [
            "stored_to_delivered",
            "delivered_to_acknowledged",
            "stored_to_acknowledged"
        ]
    );
    let text = ok_stdout(&relay.cli(&["status"]));
    assert!(
        text.contains("dead letters") && text.contains("latency"),
        "{text}"
    );
}

/// The message that ends [`answer_everything`] without a refusal.
const THAT_IS_ALL: &str = "that is all";

/// An agent that answers every message it gets with a reply to it, as an agent left alone
/// does. Returns the NACK that stopped it, if one came within `rounds` messages, or `None` at
/// [`THAT_IS_ALL`] (or a read timing out: a hang bound).
fn answer_everything(
    c: &mut Raw,
    peer: &str,
    rounds: usize,
    hops_seen: &mut Vec<u64>,
) -> Option<Value> {
    for _ in 0..rounds {
        let f = c.read()?;
        match f["type"].as_str().unwrap() {
            "PING" => {
                c.send_env("PONG", json!({}), json!({}));
            }
            "DELIVER" => {
                c.ack(&f);
                if f["from"] == "relay" {
                    continue;
                }
                // The person's word that the exchange is over, sent after the refusal: what
                // the exchange delivered to this agent came before it.
                if f["payload"]["body"] == THAT_IS_ALL {
                    return None;
                }
                hops_seen.push(f["payload"]["budget"]["hops"].as_u64().unwrap_or(0));
                // The sender claims a fresh budget; the daemon must not believe it.
                c.send_env(
                    "SEND",
                    json!({"to": peer}),
                    json!({"body": "acknowledged!", "in_reply_to": f["id"], "thread": "t1",
                           "budget": {"hops": 0, "max_hops": 1000}}),
                );
            }
            "NACK" => return Some(f),
            _ => {}
        }
    }
    None
}

#[test]
fn two_agents_answering_each_other_are_stopped_by_the_hop_budget() {
    let (relay, [mut a, mut b]) = Relay::with_agents(&["--max-hops", "4"], ["Ann", "Ben"]);
    // Hang bounds only: the one not refused stops at the person's closing word.
    a.read_timeout(Duration::from_secs(20));
    b.read_timeout(Duration::from_secs(20));
    // Each in its own thread, answering whatever arrives, as two scripted agents would.
    let ta = std::thread::spawn(move || {
        let mut hops = Vec::new();
        let nack = answer_everything(&mut a, "Ben", 200, &mut hops);
        (nack, hops)
    });
    let tb = std::thread::spawn(move || {
        let mut hops = Vec::new();
        let nack = answer_everything(&mut b, "Ann", 200, &mut hops);
        (nack, hops)
    });
    // A person starts the exchange.
    ok_stdout(&relay.cli(&["send", "Ann", "start"]));
    // Replies 1..=4 go through; Ann's reply to hop 4 would be hop 5.
    let (nack_a, hops_a) = ta.join().unwrap();
    // Refused, Ann sends nothing more: Ben's last delivery from her was stored before the
    // person's word, which ends his listening (instead of a quiet spell hoping nothing came).
    ok_stdout(&relay.cli(&["send", "Ben", THAT_IS_ALL]));
    let (nack_b, hops_b) = tb.join().unwrap();
    let (nack, stopped) = match (nack_a, nack_b) {
        (Some(n), None) => (n, "Ann"),
        (None, Some(n)) => (n, "Ben"),
        other => panic!("exactly one agent is refused: {other:?}"),
    };
    assert_eq!(stopped, "Ann", "hop 5 would be Ann's");
    assert_eq!(nack["payload"]["code"], "budget_exceeded", "{nack}");
    let reason = nack["payload"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("limit is 4") && reason.contains("dead-letter"),
        "{reason}"
    );
    // Ann saw the person's message (0) and Ben's replies (2, 4); Ben saw 1 and 3.
    assert_eq!(hops_a, vec![0, 2, 4]);
    assert_eq!(hops_b, vec![1, 3]);
    // The person can see what was stopped and why.
    let dl = cli_json(&relay, &["dlq", "list"]);
    let dl = dl["dead_letters"].as_array().unwrap();
    assert_eq!(dl.len(), 1);
    assert_eq!(dl[0]["code"], "budget_exceeded");
    assert_eq!(dl[0]["from"], "Ann");
    let refused = dl[0]["msg_id"].as_str().unwrap().to_owned();
    let s = stages(&relay, &refused);
    assert_eq!(s, ["rejected", "dead_lettered@Ben"]);
    // Exactly the person's message, four replies and the person's closing word were stored.
    assert_eq!(cli_json(&relay, &["history"]).as_array().unwrap().len(), 6);
    assert_nothing_dropped(&relay, &["Ann", "Ben"], std::slice::from_ref(&refused));
    // A person may send the refused reply anyway: it is stored as Ann's, for Ben.
    let n = dl[0]["dlq_id"].as_i64().unwrap().to_string();
    let retry = cli_json(&relay, &["dlq", "retry", &n]);
    assert!(
        retry["outcome"]
            .as_str()
            .unwrap()
            .contains("sent again as Ann"),
        "{retry}"
    );
    let s = wait_stages(
        &relay,
        &refused,
        &["rejected", "retried@Ben", "accepted", "queued@Ben"],
    );
    assert_eq!(s[0], "rejected", "{s:?}");
    let (mut ben, _) = relay.agent("Ben");
    let d = ben.expect("DELIVER");
    assert_eq!(d["id"], refused.as_str());
    assert_eq!(d["from"], "Ann");
    assert_eq!(
        d["payload"]["budget"]["hops"], 5,
        "past the budget, by a person's decision"
    );
    ben.ack(&d);
    // A person's new message starts a fresh budget.
    let out = ok_stdout(&relay.cli(&["send", "Ben", "new topic", "--json"]));
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_ne!(v["status"], "refused", "{v}");
}

#[test]
fn a_flood_from_one_agent_is_limited_without_affecting_another() {
    let (relay, [mut bob, mut flood, mut carol]) = Relay::with_agents(
        &["--rate-limit", "20", "--pair-rate-limit", "0"],
        ["Bob", "Flood", "Carol"],
    );
    let mut accepted = Vec::new();
    let mut refused = Vec::new();
    for i in 0..50 {
        let id = flood.send("Bob", &format!("spam {i}"));
        let f = answer(&mut flood);
        match f["type"].as_str().unwrap() {
            "ACK" => accepted.push(id),
            "NACK" => {
                assert_eq!(f["payload"]["code"], "rate_limited", "{f}");
                refused.push(id);
            }
            other => panic!("{other}: {f}"),
        }
        // Carol, sending at the same time, is never limited.
        if i % 10 == 0 {
            carol.send("Bob", &format!("carol {i}"));
            assert_eq!(carol.expect("ACK")["type"], "ACK");
        }
    }
    assert_eq!(accepted.len(), 20);
    assert_eq!(refused.len(), 30);
    // Bob gets exactly the accepted ones and Carol's.
    let mut got = 0;
    while got < 25 {
        let d = bob.expect("DELIVER");
        bob.ack(&d);
        got += 1;
    }
    let dl = cli_json(&relay, &["dlq", "list", "--limit", "100"]);
    assert_eq!(dl["dead_letters"].as_array().unwrap().len(), 30);
    assert_eq!(cli_json(&relay, &["status"])["delivery"]["rejected"], 30);
    wait_no_pending(&relay);
    let (acked, _) = assert_nothing_dropped(&relay, &[], &refused);
    assert_eq!(acked, 25);
}

#[test]
fn a_pair_trading_messages_is_limited_while_the_sender_can_still_reach_others() {
    let (_relay, [_bob, _carol, mut alice]) =
        Relay::with_agents(&["--pair-rate-limit", "5"], ["Bob", "Carol", "Alice"]);
    let mut codes = Vec::new();
    for i in 0..8 {
        alice.send("Bob", &format!("ok {i}"));
        let f = answer(&mut alice);
        codes.push(f["payload"]["code"].as_str().unwrap_or("ok").to_owned());
    }
    assert_eq!(codes.iter().filter(|c| *c == "ok").count(), 5, "{codes:?}");
    assert_eq!(codes.iter().filter(|c| *c == "rate_limited").count(), 3);
    alice.send("Carol", "still fine");
    assert_eq!(alice.expect("ACK")["payload"]["status"], "accepted");
}

#[test]
fn a_denied_pair_never_gets_through_and_a_malformed_rules_file_keeps_the_previous_rules() {
    let (relay, [mut bob, mut carol, mut mallory]) =
        Relay::with_agents(&[], ["Bob", "Carol", "Mallory"]);
    ok_stdout(&relay.cli(&[
        "rules",
        "add",
        "--from",
        "Mall*",
        "--to",
        "Bob",
        "--action",
        "deny",
        "--priority",
        "5",
    ]));
    // A lower-priority allow-all does not override it.
    ok_stdout(&relay.cli(&[
        "rules", "add", "--from", "*", "--to", "*", "--action", "allow",
    ]));
    let listed = cli_json(&relay, &["rules", "list"]);
    assert_eq!(listed["rules"].as_array().unwrap().len(), 2, "{listed}");
    wait_for(Duration::from_secs(20), "rules loaded", || {
        cli_json(&relay, &["status"])["rules"] == 2
    });
    let mut refused = Vec::new();
    for i in 0..5 {
        let id = mallory.send("Bob", &format!("let me in {i}"));
        let f = answer(&mut mallory);
        assert_eq!(f["type"], "NACK", "{f}");
        assert_eq!(f["payload"]["code"], "forbidden", "{f}");
        refused.push(id);
    }
    // A broadcast reaches Carol, not Bob; Mallory can still reach Carol directly.
    mallory.send("*", "hello all");
    assert_eq!(answer(&mut mallory)["payload"]["recipients"], 1);
    mallory.send("Carol", "hi Carol");
    assert_eq!(answer(&mut mallory)["type"], "ACK");
    for _ in 0..2 {
        let d = carol.expect("DELIVER");
        assert_eq!(d["from"], "Mallory");
        carol.ack(&d);
    }
    // Carol talks to Bob: allowed.
    carol.send("Bob", "from Carol");
    assert_eq!(answer(&mut carol)["type"], "ACK");
    let d = bob.expect("DELIVER");
    assert_eq!(d["from"], "Carol", "Bob never gets Mallory's messages: {d}");
    bob.ack(&d);
    let to_bob = cli_json(&relay, &["history", "--to", "Bob", "--from", "Mallory"]);
    assert!(to_bob.as_array().unwrap().is_empty(), "{to_bob}");
    // Each refusal, and the broadcast's copy for Bob, is a dead letter.
    let dl = cli_json(&relay, &["dlq", "list"]);
    let dl = dl["dead_letters"].as_array().unwrap();
    assert_eq!(dl.len(), 6, "{dl:?}");
    assert!(
        dl.iter()
            .all(|d| d["code"] == "forbidden" && d["recipient"] == "Bob")
    );

    // A malformed file: a clear error naming the line, and the previous rules stay.
    let file = relay.data_dir().join("rules.json");
    std::fs::write(
        &file,
        "{\"rules\": [\n  {\"from\": \"*\", \"to\": \"*\", \"action\": \"allow\"},\n  {\"from\": \"Mallory\", \"to\": \"Bob\", \"action\": \"perhaps\"}\n]}\n",
    )
    .unwrap();
    wait_for(Duration::from_secs(20), "rules error reported", || {
        cli_json(&relay, &["status"])["rules_error"]
            .as_str()
            .is_some_and(|e| e.contains("line 3"))
    });
    let out = relay.cli(&["rules", "list"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 3") && err.contains("perhaps"), "{err}");
    mallory.send("Bob", "now?");
    assert_eq!(answer(&mut mallory)["payload"]["code"], "forbidden");
    // Fixed: the deny is gone and Mallory gets through.
    std::fs::write(&file, "{\"rules\": []}\n").unwrap();
    wait_for(Duration::from_secs(20), "rules reloaded", || {
        let st = cli_json(&relay, &["status"]);
        st["rules"] == 0 && st["rules_error"].is_null()
    });
    mallory.send("Bob", "finally");
    assert_eq!(answer(&mut mallory)["type"], "ACK");
    assert_eq!(bob.expect("DELIVER")["from"], "Mallory");
    assert_nothing_dropped(&relay, &["Bob"], &refused);
}

#[test]
fn a_recipient_that_keeps_failing_is_paused_then_probed_and_nothing_is_lost() {
    let (relay, [mut bob, mut alice]) = Relay::with_agents(
        &["--breaker-failures", "2", "--breaker-cooldown-ms", "300"],
        ["Bob", "Alice"],
    );
    let fail = |bob: &mut Raw, d: &Value| {
        bob.send_env(
            "ACK",
            json!({}),
            json!({"ack_id": d["id"], "seq": d["delivery"]["seq"], "state": "failed"}),
        );
    };
    // Two failures in a row open Bob's circuit.
    for i in 0..2 {
        alice.send("Bob", &format!("will fail {i}"));
        answer(&mut alice);
        let d = bob.expect("DELIVER");
        fail(&mut bob, &d);
    }
    wait_for(Duration::from_secs(20), "circuit open", || {
        relay.log().contains("circuit open")
    });
    // What is sent now waits in Bob's inbox instead of being handed to him.
    let waiting: Vec<String> = (0..4)
        .map(|i| alice.send("Bob", &format!("waits {i}")))
        .collect();
    for _ in 0..4 {
        assert_eq!(answer(&mut alice)["type"], "ACK");
    }
    let pending = || {
        cli_json(&relay, &["agents"])
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["name"] == "Bob")
            .unwrap()["pending"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(pending(), 4);
    // After the cool-down, one message is tried (the probe). That it stays the only one until
    // it is taken, however long, is shown in virtual time by the routing core's test
    // (`the_breaker_opens_after_failures_half_opens_after_the_cooldown_and_closes_on_success`),
    // not by listening here for a while.
    bob.read_timeout(Duration::from_secs(20));
    let probe = bob.expect("DELIVER");
    assert_eq!(probe["id"], waiting[0].as_str());
    // Take the probe: the circuit closes and the rest follows, in order.
    bob.ack(&probe);
    for id in &waiting[1..] {
        let d = bob.expect("DELIVER");
        assert_eq!(d["id"], id.as_str());
        bob.ack(&d);
    }
    wait_for(Duration::from_secs(20), "acks recorded", || pending() == 0);
    // Alice has not read her two notices (one per failure): they wait in her inbox.
    let notices = cli_json(&relay, &["history", "--from", "relay", "--to", "Alice"]);
    assert_eq!(notices.as_array().unwrap().len(), 2);
    let (acked, dead) = assert_nothing_dropped(&relay, &["Alice"], &[]);
    assert_eq!((acked, dead), (4, 2));
    assert!(relay.log().contains("circuit half open"));
}

#[test]
fn an_offline_inbox_past_its_high_water_mark_warns_and_tells_the_sender() {
    let relay = Relay::start_with(&["--busy-high-water", "5"]);
    relay.known_offline("Bob");
    let (mut alice, _) = relay.agent("Alice");
    let mut busy = Vec::new();
    // A BUSY follows the ACK of the message that crossed the mark, in the same router step:
    // the ninth message's ACK comes after any BUSY for the eighth (no quiet spell to wait out).
    for i in 0..9 {
        alice.send("Bob", &format!("m{i}"));
        loop {
            let f = alice.read().unwrap();
            match f["type"].as_str().unwrap() {
                "ACK" => break,
                "BUSY" => busy.push(f),
                _ => {}
            }
        }
    }
    // Once, at the crossing (the BUSY follows the fifth message's ACK).
    assert_eq!(busy.len(), 1, "{busy:?}");
    assert_eq!(busy[0]["payload"]["target"], "Bob");
    assert_eq!(busy[0]["payload"]["pending"], 5);
    assert!(relay.log().contains("passed the high-water mark"));
    // Nothing was dropped: all nine wait for Bob.
    let (mut bob, _) = relay.agent("Bob");
    for _ in 0..9 {
        let d = bob.expect("DELIVER");
        bob.ack(&d);
    }
}

#[test]
fn two_wrapped_agents_answering_each_other_are_stopped_and_the_agent_is_told() {
    let relay = Relay::start_with(&["--max-hops", "3"]);
    relay.write("ann.sh", answering_agent("Ben"));
    relay.write("ben.sh", answering_agent("Ann"));
    let spawn = |name: &str, script: &str| {
        spawn_wrapped(&relay, &wrap_args(name, &["--no-input"], &["sh", script]))
    };
    let ann = spawn("Ann", "ann.sh");
    let ben = spawn("Ben", "ben.sh");
    crate::support::wait_online(&relay, "Ann");
    crate::support::wait_online(&relay, "Ben");
    // A person starts it; the wrappers mark each answer as a reply to what was typed in.
    ok_stdout(&relay.cli(&["send", "Ann", "please sync with Ben"]));
    // Hop 1 Ann→Ben, 2 Ben→Ann, 3 Ann→Ben; Ben's answer would be hop 4: refused, and the
    // refusal is typed into Ben's terminal, where the script sees it and stops.
    let (ben_code, ben_out) = crate::support::output_of(ben);
    assert_eq!(ben_code, 5, "{ben_out}");
    assert!(
        ben_out.contains("got: relay: your message to Ann was not sent")
            && ben_out.contains("the limit is 3"),
        "{ben_out}"
    );
    // Ann heard nothing more; stop her.
    let mut ann = ann;
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(ann.id() as i32).unwrap(),
        rustix::process::Signal::Term,
    )
    .unwrap();
    let _ = ann.wait();
    let h = cli_json(&relay, &["history"]);
    let h = h.as_array().unwrap();
    assert_eq!(h.len(), 4, "the person's message and three replies: {h:?}");
    // Newest first: each reply answers the message before it.
    for w in h.windows(2) {
        assert_eq!(w[0]["in_reply_to"], w[1]["id"], "{h:?}");
    }
    let dl = cli_json(&relay, &["dlq", "list"]);
    let dl = dl["dead_letters"].as_array().unwrap();
    assert_eq!(dl.len(), 1);
    assert_eq!(
        (dl[0]["from"].as_str(), dl[0]["code"].as_str()),
        (Some("Ben"), Some("budget_exceeded"))
    );
    assert_eq!(dl[0]["body"], "acknowledged 2");
}

/// `rules remove N` takes a rule away without a restart: the pair it denied gets through
/// again. A number that is not a rule gets an error saying how rules are numbered.
#[test]
fn a_removed_rule_no_longer_applies() {
    let (relay, [mut bob, mut mallory]) = Relay::with_agents(&[], ["Bob", "Mallory"]);
    ok_stdout(&relay.cli(&[
        "rules", "add", "--from", "Mallory", "--to", "Bob", "--action", "deny",
    ]));
    wait_for(Duration::from_secs(20), "rule loaded", || {
        cli_json(&relay, &["status"])["rules"] == 1
    });
    let refused = mallory.send("Bob", "let me in");
    assert_eq!(answer(&mut mallory)["payload"]["code"], "forbidden");

    let out = relay.cli(&["rules", "remove", "5"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("there is no rule 5") && err.contains("rules list"),
        "{err}"
    );
    let text = ok_stdout(&relay.cli(&["rules", "remove", "1"]));
    assert!(text.contains("rule 1 removed"), "{text}");
    assert_eq!(
        cli_json(&relay, &["rules", "list"])["rules"],
        json!([]),
        "the file has no rule left"
    );
    wait_for(Duration::from_secs(20), "rules reloaded", || {
        cli_json(&relay, &["status"])["rules"] == 0
    });
    mallory.send("Bob", "now?");
    assert_eq!(answer(&mut mallory)["type"], "ACK");
    let d = bob.expect("DELIVER");
    assert_eq!(
        (d["from"].as_str(), d["payload"]["body"].as_str()),
        (Some("Mallory"), Some("now?"))
    );
    bob.ack(&d);
    assert_nothing_dropped(&relay, &["Bob"], &[refused]);
}

/// `--rate-override NAME=N` gives one sender its own limit; everyone else keeps the default.
#[test]
fn a_rate_override_lifts_one_senders_limit_only() {
    let relay = Relay::start_with(&[
        "--rate-limit",
        "5",
        "--pair-rate-limit",
        "0",
        "--rate-override",
        "Boss=50",
    ]);
    let (_bob, _) = relay.agent("Bob");
    let (mut boss, _) = relay.agent("Boss");
    let (mut worker, _) = relay.agent("Worker");
    let count = |agent: &mut Raw| {
        let mut accepted = 0;
        for i in 0..20 {
            agent.send("Bob", &format!("update {i}"));
            let f = answer(agent);
            match f["type"].as_str() {
                Some("ACK") => accepted += 1,
                _ => assert_eq!(f["payload"]["code"], "rate_limited", "{f}"),
            }
        }
        accepted
    };
    assert_eq!(count(&mut boss), 20, "Boss's own limit is 50");
    assert_eq!(count(&mut worker), 5, "the default still holds for Worker");
}
