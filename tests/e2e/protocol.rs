//! The daemon speaks protocol v1 over its real socket: raw frames written by hand.

use serde_json::json;

use std::time::Duration;

use crate::support::*;

#[test]
fn handshake_gives_welcome_with_server_limits() {
    let relay = Relay::start();
    let (_c, welcome) = relay.agent("Alice");
    let p = &welcome["payload"];
    assert_eq!(welcome["v"], 1);
    assert!(p["session_id"].as_str().is_some_and(|s| !s.is_empty()));
    assert!(p["resume_token"].as_str().is_some_and(|s| s.len() >= 16));
    assert_eq!(p["server"]["max_frame_bytes"], 1_048_576);
    assert_eq!(p["server"]["heartbeat_ms"], 60_000);
}

#[test]
fn thousand_messages_exactly_once_in_order_with_gapless_seq() {
    let (_relay, [mut bob, mut alice]) = Relay::with_agents(UNLIMITED, ["Bob", "Alice"]);
    let ids: Vec<String> = (0..1000)
        .map(|i| alice.send("Bob", &format!("message {i}")))
        .collect();
    let mut acks = 0;
    for (i, id) in ids.iter().enumerate() {
        let d = bob.expect("DELIVER");
        assert_eq!(d["id"], id.as_str(), "delivery {i} out of order");
        assert_eq!(d["from"], "Alice");
        assert_eq!(d["payload"]["body"], format!("message {i}"));
        assert_eq!(d["delivery"]["seq"], i as u64 + 1);
        assert_eq!(d["delivery"]["attempt"], 1);
        bob.ack(&d);
    }
    while acks < 1000 {
        let a = alice.expect("ACK");
        assert_eq!(a["payload"]["ack_id"], ids[acks].as_str());
        assert_eq!(a["payload"]["status"], "accepted");
        acks += 1;
    }
    // Nothing more arrives for Bob: a PING round trip proves the stream is drained.
    bob.send_env("PING", json!({}), json!({"nonce": "n1"}));
    let pong = bob.expect("PONG");
    assert_eq!(pong["payload"]["nonce"], "n1");
}

#[test]
fn broadcast_reaches_everyone_but_the_sender() {
    let (_relay, [mut alice, mut bob, mut carol]) =
        Relay::with_agents(&[], ["Alice", "Bob", "Carol"]);
    let id = alice.send("*", "hello all");
    let ack = alice.expect("ACK");
    assert_eq!(ack["payload"]["recipients"], 2);
    for c in [&mut bob, &mut carol] {
        let d = c.expect("DELIVER");
        assert_eq!(d["id"], id.as_str());
        assert_eq!(d["to"], "*");
        c.ack(&d);
    }
    alice.send_env("PING", json!({}), json!({}));
    alice.expect("PONG"); // no DELIVER of its own broadcast came first
}

#[test]
fn topics_with_nats_wildcards() {
    let relay = Relay::start();
    let (mut alice, _) = relay.agent("Alice");
    let mut subs = Vec::new();
    for (name, pattern) in [("Bob", "build.*"), ("Carol", "build.>"), ("Dave", "review")] {
        let (mut c, _) = relay.agent(name);
        let id = c.send_env("SUBSCRIBE", json!({"topic": pattern}), json!({}));
        let ack = c.expect("ACK");
        assert_eq!(ack["payload"]["ack_id"], id.as_str());
        subs.push(c);
    }
    let send = |a: &mut crate::support::Raw, topic: &str| {
        let id = a.send_env(
            "SEND",
            json!({"to": "*", "topic": topic}),
            json!({"body": topic}),
        );
        let ack = a.expect("ACK");
        assert_eq!(ack["payload"]["ack_id"], id.as_str());
        ack["payload"]["recipients"].as_u64().unwrap()
    };
    assert_eq!(send(&mut alice, "build.linux"), 2);
    assert_eq!(send(&mut alice, "build.linux.x86"), 1);
    assert_eq!(send(&mut alice, "review"), 1);
    assert_eq!(send(&mut alice, "deploy"), 0);
    let got = |c: &mut crate::support::Raw| {
        let mut topics = Vec::new();
        c.send_env("PING", json!({}), json!({"nonce": "end"}));
        loop {
            let f = c.read().unwrap();
            match f["type"].as_str().unwrap() {
                "DELIVER" => {
                    // Each topic here is its own (topic, sender) stream with one message.
                    assert_eq!(f["delivery"]["seq"], 1, "{f}");
                    topics.push(f["topic"].as_str().unwrap().to_owned());
                    c.ack(&f);
                }
                "PONG" if f["payload"]["nonce"] == "end" => return topics,
                _ => {}
            }
        }
    };
    // Deliveries race the PING only if they were not yet routed; wait until each has its share.
    let expect = [
        vec!["build.linux"],
        vec!["build.linux", "build.linux.x86"],
        vec!["review"],
    ];
    for (c, want) in subs.iter_mut().zip(expect) {
        let mut all = Vec::new();
        wait_for(
            std::time::Duration::from_secs(10),
            "topic deliveries",
            || {
                all.extend(got(c));
                all.len() >= want.len()
            },
        );
        assert_eq!(all, want);
    }
}

#[test]
fn a_topic_seq_counts_per_topic_and_sender() {
    let relay = Relay::start();
    let (mut bob, _) = relay.agent("Bob");
    bob.send_env("SUBSCRIBE", json!({"topic": ">"}), json!({}));
    bob.expect("ACK");
    let (mut alice, _) = relay.agent("Alice");
    let (mut carol, _) = relay.agent("Carol");
    for (who, topic) in [(0, "a"), (0, "a"), (1, "a"), (0, "b")] {
        let c = if who == 0 { &mut alice } else { &mut carol };
        c.send_env("SEND", json!({"topic": topic}), json!({"body": "x"}));
        c.expect("ACK");
    }
    let mut seen = Vec::new();
    for _ in 0..4 {
        let d = bob.expect("DELIVER");
        seen.push((
            d["from"].as_str().unwrap().to_owned(),
            d["topic"].as_str().unwrap().to_owned(),
            d["delivery"]["seq"].as_u64().unwrap(),
        ));
        bob.ack(&d);
    }
    seen.sort();
    assert_eq!(
        seen,
        vec![
            ("Alice".into(), "a".into(), 1),
            ("Alice".into(), "a".into(), 2),
            ("Alice".into(), "b".into(), 1),
            ("Carol".into(), "a".into(), 1)
        ]
    );
}

#[test]
fn offline_agent_gets_its_inbox_on_reconnect() {
    let relay = Relay::start();
    relay.known_offline("Bob");
    let (mut alice, _) = relay.agent("Alice");
    let id = alice.send("Bob", "while you were out");
    let ack = alice.expect("ACK");
    assert_eq!(ack["payload"]["status"], "queued");
    let (mut bob, _) = relay.agent("Bob");
    let d = bob.expect("DELIVER");
    assert_eq!(d["id"], id.as_str());
    assert_eq!(d["payload"]["body"], "while you were out");
    assert_eq!(d["delivery"]["seq"], 1);
}

#[test]
fn unacked_deliveries_are_replayed_after_a_dropped_connection() {
    let (relay, [mut alice, mut bob]) = Relay::with_agents(&[], ["Alice", "Bob"]);
    let first = alice.send("Bob", "one");
    let second = alice.send("Bob", "two");
    let d1 = bob.expect("DELIVER");
    bob.ack(&d1);
    let d2 = bob.expect("DELIVER");
    assert_eq!(d2["id"], second.as_str());
    // Drop the connection without acknowledging the second message.
    drop(bob);
    wait_for(
        std::time::Duration::from_secs(10),
        "Bob is seen offline",
        || {
            let out = relay.cli(&["agents", "--json"]);
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            v.as_array()
                .is_some_and(|a| a.iter().any(|x| x["name"] == "Bob" && x["online"] == false))
        },
    );
    let (mut bob, _) = relay.agent("Bob");
    let again = bob.expect("DELIVER");
    assert_eq!(
        again["id"],
        second.as_str(),
        "only the unacknowledged one comes back"
    );
    assert_eq!(again["delivery"]["seq"], 2, "same seq as before");
    assert!(
        again["delivery"]["attempt"].as_u64().unwrap() >= 2,
        "replay is marked: {again}"
    );
    assert_ne!(again["id"], first.as_str());
}

#[test]
fn second_connection_with_a_live_name_needs_the_resume_token() {
    let relay = Relay::start();
    let (mut bob, welcome) = relay.agent("Bob");
    let token = welcome["payload"]["resume_token"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut impostor = relay.connect();
    impostor.send_env("HELLO", json!({}), json!({"agent": "Bob"}));
    let err = impostor.expect("ERROR");
    assert_eq!(err["payload"]["code"], "name_in_use");
    assert_eq!(err["payload"]["fatal"], true);
    assert!(impostor.closed());
    let mut successor = relay.connect();
    let w = successor.hello("Bob", json!({"resume_token": token}));
    assert_eq!(w["payload"]["resumed"], true);
    // The old connection is told and closed.
    let old = bob.expect("ERROR");
    assert_eq!(old["payload"]["code"], "name_in_use");
    assert!(bob.closed());
    let (mut alice, _) = relay.agent("Alice");
    alice.send("Bob", "to the new one");
    assert_eq!(
        successor.expect("DELIVER")["payload"]["body"],
        "to the new one"
    );
}

#[test]
fn a_resent_send_id_is_stored_and_delivered_once() {
    let (relay, [mut bob, mut alice]) = Relay::with_agents(&[], ["Bob", "Alice"]);
    for _ in 0..3 {
        alice.send_as_id("same-id-1", "Bob", "once");
    }
    let statuses: Vec<String> = (0..3)
        .map(|_| {
            alice.expect("ACK")["payload"]["status"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(statuses, ["accepted", "duplicate", "duplicate"]);
    let d = bob.expect("DELIVER");
    assert_eq!(d["id"], "same-id-1");
    bob.ack(&d);
    bob.send_env("PING", json!({}), json!({}));
    bob.expect("PONG");
    let out = relay.cli(&["history", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 1, "stored once: {v}");
}

#[test]
fn a_client_cannot_speak_as_another_agent() {
    let (_relay, [mut bob, mut alice]) = Relay::with_agents(&[], ["Bob", "Alice"]);
    alice.send_env(
        "SEND",
        json!({"to": "Bob", "from": "Carol"}),
        json!({"body": "it was me"}),
    );
    let d = bob.expect("DELIVER");
    assert_eq!(d["from"], "Alice");
}

#[test]
fn unknown_target_and_oversize_body_are_refused_with_reasons() {
    let (_relay, [_bob, mut alice]) = Relay::with_agents(&[], ["Bob", "Alice"]);
    let id = alice.send("Bobb", "typo");
    let nack = alice.expect("NACK");
    assert_eq!(nack["payload"]["ack_id"], id.as_str());
    assert_eq!(nack["payload"]["code"], "unknown_target");
    let reason = nack["payload"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("Bobb") && reason.contains("Bob"),
        "{reason}"
    );
    let big = "x".repeat(600 * 1024);
    alice.send("Bob", &big);
    assert_eq!(alice.expect("NACK")["payload"]["code"], "too_large");
    alice.send_env("SEND", json!({}), json!({"body": "to nobody"}));
    assert_eq!(alice.expect("NACK")["payload"]["code"], "invalid");
    alice.send_env(
        "SEND",
        json!({"to": "Bob"}),
        json!({"body": "x", "kind": "bogus"}),
    );
    assert_eq!(alice.expect("NACK")["payload"]["code"], "invalid");
}

#[test]
fn bad_frames_get_an_error_and_only_that_connection_closes() {
    let relay = Relay::start();
    let (mut bystander, _) = relay.agent("Bystander");

    // Oversize length: refused before any allocation, fatal.
    let mut c = relay.connect();
    c.write_bytes(&(64u32 * 1024 * 1024).to_be_bytes());
    let e = c.expect("ERROR");
    assert_eq!(e["payload"]["code"], "frame_too_large");
    assert_eq!(e["payload"]["fatal"], true);
    assert!(c.closed());

    // Invalid JSON: fatal.
    let mut c = relay.connect();
    let junk = b"{not json";
    c.write_bytes(&(junk.len() as u32).to_be_bytes());
    c.write_bytes(junk);
    assert_eq!(c.expect("ERROR")["payload"]["code"], "bad_frame");
    assert!(c.closed());

    // Invalid UTF-8: fatal.
    let mut c = relay.connect();
    let bad = [0xffu8, 0xfe, 0x00, 0x41];
    c.write_bytes(&(bad.len() as u32).to_be_bytes());
    c.write_bytes(&bad);
    assert_eq!(c.expect("ERROR")["payload"]["code"], "bad_frame");
    assert!(c.closed());

    // A SEND before HELLO: NACK not_active for the message, then a fatal ERROR.
    let mut c = relay.connect();
    let id = c.send_env(
        "SEND",
        json!({"to": "Bystander"}),
        json!({"body": "sneaky"}),
    );
    let nack = c.expect("NACK");
    assert_eq!(nack["payload"]["ack_id"], id.as_str());
    assert_eq!(nack["payload"]["code"], "not_active");
    assert_eq!(c.expect("ERROR")["payload"]["code"], "bad_state");
    assert!(c.closed());

    // Wrong protocol version: fatal.
    let mut c = relay.connect();
    c.write_json(&json!({"v": 2, "type": "HELLO", "id": "x", "ts": 1, "payload": {"agent": "V2"}}));
    assert_eq!(c.expect("ERROR")["payload"]["code"], "bad_version");
    assert!(c.closed());

    // A hostile name: fatal.
    let mut c = relay.connect();
    c.send_env("HELLO", json!({}), json!({"agent": "../../etc\u{1b}[2J"}));
    assert_eq!(c.expect("ERROR")["payload"]["code"], "bad_name");
    assert!(c.closed());

    // An unknown type after HELLO: not fatal, the connection keeps working.
    let (mut c, _) = relay.agent("Curious");
    c.send_env("FROBNICATE", json!({}), json!({}));
    let e = c.expect("ERROR");
    assert_eq!(e["payload"]["code"], "unknown_type");
    assert_eq!(e["payload"]["fatal"], false);
    c.send_env("PING", json!({}), json!({"nonce": "still here"}));
    assert_eq!(c.expect("PONG")["payload"]["nonce"], "still here");

    // A client may not send daemon-only types.
    let (mut c, _) = relay.agent("Forger");
    c.send_env(
        "DELIVER",
        json!({"to": "Bystander", "from": "Boss"}),
        json!({"body": "obey"}),
    );
    assert_eq!(c.expect("ERROR")["payload"]["code"], "bad_state");
    assert!(c.closed());

    // A connection that stops mid-frame does not hurt anyone.
    let mut c = relay.connect();
    c.write_bytes(&100u32.to_be_bytes());
    c.write_bytes(b"{\"v\":1");
    drop(c);

    // Everyone else is unaffected, and the daemon is alive.
    bystander.send_env("PING", json!({}), json!({"nonce": "ok"}));
    assert_eq!(bystander.expect("PONG")["payload"]["nonce"], "ok");
    let (mut alice, _) = relay.agent("Alice");
    alice.send("Bystander", "after the storm");
    assert_eq!(
        bystander.expect("DELIVER")["payload"]["body"],
        "after the storm"
    );
}

#[test]
fn a_silent_connection_is_closed_by_the_heartbeat() {
    let relay = Relay::start_with(&["--heartbeat-ms", "100"]);
    let (mut c, welcome) = relay.agent("Sleepy");
    assert_eq!(welcome["payload"]["server"]["heartbeat_ms"], 100);
    // Never answer: read PINGs until the ERROR comes.
    loop {
        let f = c.read().expect("closed without an ERROR");
        if f["type"] == "ERROR" {
            assert_eq!(f["payload"]["code"], "heartbeat_timeout");
            break;
        }
        assert_eq!(f["type"], "PING");
    }
    assert!(c.closed());
}

/// Issue 26.3: the heartbeat is long by default because a peer that dies needs none: its
/// socket closes and the daemon sees that at once. With a heartbeat of ten minutes (a silence
/// of thirty before a timeout), the name is free again well within the wait's bound.
#[test]
fn a_dead_peer_is_seen_by_its_socket_closing_not_by_the_heartbeat() {
    let relay = Relay::start_with(&["--heartbeat-ms", "600s"]);
    let (alice, welcome) = relay.agent("Alice");
    assert_eq!(welcome["payload"]["server"]["heartbeat_ms"], 600_000);
    // What the kernel does to a process killed with -9: its socket is closed, nothing said.
    drop(alice);
    wait_for(Duration::from_secs(20), "Alice to be offline", || {
        let v: serde_json::Value =
            serde_json::from_str(&ok_stdout(&relay.cli(&["agents", "--json"]))).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .any(|a| a["name"] == "Alice" && a["online"] == false)
    });
    // The name is free again: a new HELLO without the resume token is welcomed.
    let (_again, w) = relay.agent("Alice");
    assert_eq!(w["type"], "WELCOME");
}

#[test]
fn busy_is_signalled_while_a_slow_recipient_loses_nothing() {
    let relay = Relay::start_with(&["--busy-high-water", "5", "--pair-rate-limit", "0"]);
    let mut bob = relay.connect();
    bob.hello(
        "Bob",
        json!({"capabilities": {"ack": true, "max_inflight": 2}}),
    );
    let (mut alice, _) = relay.agent("Alice");
    let ids: Vec<String> = (0..40)
        .map(|i| alice.send("Bob", &format!("m{i}")))
        .collect();
    let mut acked = 0;
    let mut busy = 0;
    while acked < ids.len() {
        let f = alice.read().unwrap();
        match f["type"].as_str().unwrap() {
            "ACK" => acked += 1,
            "BUSY" => {
                assert_eq!(f["payload"]["target"], "Bob");
                busy += 1;
            }
            _ => {}
        }
    }
    assert!(busy >= 1, "no BUSY while Bob was 38 messages behind");
    for (i, id) in ids.iter().enumerate() {
        let d = bob.expect("DELIVER");
        assert_eq!(d["id"], id.as_str(), "message {i}");
        assert_eq!(d["delivery"]["seq"], i as u64 + 1);
        bob.ack(&d);
    }
}

/// Issue 26 point 2: the store thread queues each committed DELIVER on its recipient's writer
/// itself; when that queue is full, the router takes the message back (here the slow-consumer
/// rule closes the connection, the messages stay queued). Bob watches the live feed and reads
/// nothing, so the feed's frames fill his queue while Alice talks to Carol; Alice's messages to
/// Bob then find it full. Bob connects again and reads: every message once, in order.
#[test]
fn a_reader_whose_queue_filled_gets_every_message_once_and_in_order_when_it_reads_again() {
    let relay = Relay::start_with(&["--rate-limit", "0", "--pair-rate-limit", "0"]);
    let mut slow = relay.connect();
    slow.hello(
        "Bob",
        json!({"capabilities": {"ack": true, "max_inflight": 1024}}),
    );
    slow.send_env("QUERY", json!({}), json!({"what": "watch"}));
    let (mut carol, _) = relay.agent("Carol");
    let carol = std::thread::spawn(move || {
        loop {
            let d = carol.expect("DELIVER");
            carol.ack(&d);
            if d["payload"]["body"] == "stop" {
                break;
            }
        }
    });
    let (mut alice, _) = relay.agent("Alice");
    // Traffic to Carol (three feed events each) until a message to Bob finds his queue full
    // and the relay closes his connection; bounded, so a relay that never does fails here.
    let mut to_bob = Vec::new();
    let mut rounds = 0;
    while is_online(&relay, "Bob") {
        rounds += 1;
        assert!(
            rounds <= 100,
            "Bob's connection was never closed as a slow reader"
        );
        for i in 0..200 {
            alice.send("Carol", &format!("filler {rounds}.{i}"));
        }
        for _ in 0..200 {
            alice.expect("ACK");
        }
        to_bob.push(alice.send("Bob", &format!("to Bob {}", to_bob.len())));
        alice.expect("ACK");
    }
    // And some while he is away.
    for _ in 0..5 {
        to_bob.push(alice.send("Bob", &format!("to Bob {}", to_bob.len())));
        alice.expect("ACK");
    }
    alice.send("Carol", "stop");
    carol.join().unwrap();
    drop(slow);
    let (mut bob, _) = relay.agent("Bob");
    for (i, id) in to_bob.iter().enumerate() {
        let d = bob.expect("DELIVER");
        assert_eq!(d["id"], id.as_str(), "message {i} of {}", to_bob.len());
        assert_eq!(d["delivery"]["seq"], i as u64 + 1);
        bob.ack(&d);
    }
    // Nothing after them: a PING answered proves the queue is empty.
    bob.send_env("PING", json!({}), json!({"nonce": "end"}));
    assert_eq!(bob.expect("PONG")["payload"]["nonce"], "end");
}

#[test]
fn agents_json_follows_membership() {
    let relay = Relay::start();
    let path = relay.data_dir().join("agents.json");
    let (bob, _) = relay.agent("Bob");
    let read = || {
        std::fs::read_to_string(&path)
            .ok()
            .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
    };
    wait_for(
        std::time::Duration::from_secs(10),
        "agents.json lists Bob online",
        || {
            read().is_some_and(|v| {
                v["agents"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|x| x["name"] == "Bob" && x["online"] == true))
            })
        },
    );
    drop(bob);
    wait_for(
        std::time::Duration::from_secs(10),
        "agents.json shows Bob offline",
        || {
            read().is_some_and(|v| {
                v["agents"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|x| x["name"] == "Bob" && x["online"] == false))
            })
        },
    );
}

#[test]
fn a_message_waiting_for_an_offline_agent_expires_after_the_inbox_ttl() {
    let relay = Relay::start_with(&["--inbox-ttl", "1"]);
    relay.known_offline("Bob");
    let (mut alice, _) = relay.agent("Alice");
    let id = alice.send("Bob", "too late");
    assert_eq!(alice.expect("ACK")["payload"]["status"], "queued");
    let mut last = String::new();
    let expired = (0..200).any(|_| {
        let out = relay.cli(&["read", &id, "--json"]);
        last = format!(
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let done = v["deliveries"][0]["status"] == "expired";
        if !done {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        done
    });
    assert!(
        expired,
        "the delivery did not show as expired; last `read`:\n{last}"
    );
    // Bob comes back: nothing is replayed.
    let (mut bob, _) = relay.agent("Bob");
    bob.send_env("PING", json!({}), json!({"nonce": "n"}));
    assert_eq!(bob.expect("PONG")["payload"]["nonce"], "n");
}

#[test]
fn unsubscribe_stops_topic_deliveries() {
    let relay = Relay::start();
    let (mut bob, _) = relay.agent("Bob");
    bob.send_env("SUBSCRIBE", json!({"topic": "build.*"}), json!({}));
    bob.expect("ACK");
    let (mut alice, _) = relay.agent("Alice");
    let send = |a: &mut crate::support::Raw| {
        a.send_env(
            "SEND",
            json!({"topic": "build.linux"}),
            json!({"body": "x"}),
        );
        a.expect("ACK")["payload"]["recipients"].as_u64().unwrap()
    };
    assert_eq!(send(&mut alice), 1);
    let d = bob.expect("DELIVER");
    bob.ack(&d);
    bob.send_env("UNSUBSCRIBE", json!({"topic": "build.*"}), json!({}));
    bob.expect("ACK");
    assert_eq!(send(&mut alice), 0);
    let v: serde_json::Value =
        serde_json::from_slice(&relay.cli(&["agents", "--json"]).stdout).unwrap();
    let bob_info = find_row(&v, "name", "Bob");
    assert_eq!(bob_info["topics"], json!([]));
}
