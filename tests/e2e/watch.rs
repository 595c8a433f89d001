//! `agent-relay watch`: the live feed in the terminal, against a real daemon with raw-frame
//! agents exchanging messages.

use std::io::BufRead;
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::*;

/// A running `agent-relay watch` whose stdout lines arrive on a channel.
struct Watcher {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Watcher {
    fn start(relay: &Relay, args: &[&str]) -> Self {
        let mut child = relay.spawn_cli(&[&["watch"], args].concat(), Stdio::inherit());
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self { child, lines }
    }

    /// The next line that `keep` does not skip (the deadline only bounds a hang).
    fn next(&self, skip: impl Fn(&str) -> bool) -> String {
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(20))
                .expect("watch printed nothing within 20 s");
            if !skip(&line) {
                return line;
            }
        }
    }

    /// Sends probes from `probe` until the watch prints one: from then on it is subscribed.
    fn wait_subscribed(&self, probe: &mut Raw, send_probe: impl Fn(&mut Raw)) {
        for _ in 0..200 {
            send_probe(probe);
            probe.expect("ACK");
            if self.lines.recv_timeout(Duration::from_millis(100)).is_ok() {
                return;
            }
        }
        panic!("watch never showed a probe");
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn is_probe_json(line: &str) -> bool {
    serde_json::from_str::<Value>(line).is_ok_and(|v| v["body"] == "probe")
}

fn client(relay: &Relay, name: &str) -> Raw {
    let mut c = relay.connect();
    c.hello(name, json!({"role": "client"}));
    c
}

#[test]
fn watch_json_follows_a_conversation() {
    let relay = Relay::start();
    let watch = Watcher::start(&relay, &["--json"]);
    let mut prober = client(&relay, "prober");
    watch.wait_subscribed(&mut prober, |p| {
        p.send_env("SEND", json!({"to": "*"}), json!({"body": "probe"}));
    });
    let next = || -> Value { serde_json::from_str(&watch.next(is_probe_json)).unwrap() };

    let (mut bob, _) = relay.agent("Bob");
    let ev = next();
    assert_eq!(
        str_fields(&ev, ["type", "agent", "cli"]),
        [Some("agent_connected"), Some("Bob"), Some("test")]
    );
    let (mut alice, _) = relay.agent("Alice");
    assert_eq!(next()["agent"], "Alice");

    let id = alice.send_env(
        "SEND",
        json!({"to": "Bob", "topic": "review"}),
        json!({"kind": "action", "body": "please review auth.rs", "thread": "t-42"}),
    );
    alice.expect("ACK");
    let ev = next();
    assert_eq!(ev["type"], "accepted", "{ev}");
    assert_eq!(ev["id"], id.as_str());
    assert_eq!(ev["from"], "Alice");
    assert_eq!(ev["to"], "Bob");
    assert_eq!(ev["topic"], "review");
    assert_eq!(ev["kind"], "action");
    assert_eq!(ev["thread"], "t-42");
    assert_eq!(ev["body"], "please review auth.rs");
    assert_eq!(ev["recipients"], json!(["Bob"]));
    let ev = next();
    assert_eq!(
        str_fields(&ev, ["type", "id", "recipient"]),
        [Some("delivered"), Some(id.as_str()), Some("Bob")],
        "{ev}"
    );
    assert_eq!(ev["seq"], 1);

    let deliver = bob.expect("DELIVER");
    bob.ack(&deliver);
    let ev = next();
    assert_eq!(
        str_fields(&ev, ["type", "recipient", "state"]),
        [Some("acked"), Some("Bob"), Some("acked")],
        "{ev}"
    );
    assert_eq!(ev["id"], id.as_str());

    // A typo of a known name (a name never seen would wait for its agent).
    alice.send("Bobb", "anyone there?");
    alice.expect("NACK");
    let ev = next();
    assert_eq!(
        str_fields(&ev, ["type", "from", "code"]),
        [Some("refused"), Some("Alice"), Some("unknown_target")],
        "{ev}"
    );

    drop(bob);
    let ev = next();
    assert_eq!(
        str_fields(&ev, ["type", "agent"]),
        [Some("agent_disconnected"), Some("Bob")],
        "{ev}"
    );
}

#[test]
fn watch_filters_by_sender_and_prints_clean_lines() {
    let (relay, [mut bob, mut alice, mut carol]) =
        Relay::with_agents(&[], ["Bob", "Alice", "Carol"]);
    // Probes go to an agent of their own, so that however many it takes, Bob gets none and
    // every line about them names Sink.
    let (_sink, _) = relay.agent("Sink");
    let watch = Watcher::start(&relay, &["--from", "Alice"]);
    watch.wait_subscribed(&mut alice, |a| {
        a.send("Sink", "probe");
    });
    let skip = |l: &str| l.contains("Sink");

    let id = alice.send("Bob", "hi Bob \x1b[31mred\x1b[0m");
    alice.expect("ACK");
    // Carol cannot reuse Alice's id (an id names one message, issue 24.7): refused, nothing
    // stored. Her own message to Bob, whose delivery and acknowledgement must not show.
    carol.send_as_id(&id, "Bob", "carol speaking");
    let nack = carol.expect("NACK");
    assert_eq!(nack["payload"]["code"], "invalid", "{nack}");
    carol.send("Bob", "carol speaking");
    carol.expect("ACK");
    let line = watch.next(skip);
    assert!(line.contains("Alice → Bob"), "{line}");
    assert!(
        line.contains("hi Bob \\u{1b}[31mred"),
        "control characters are shown, not sent to the terminal: {line:?}"
    );
    assert!(
        !line.contains('\x1b'),
        "no colour when stdout is not a terminal: {line:?}"
    );
    let line = watch.next(skip);
    assert!(line.contains("delivered to Bob"), "{line}");

    // Bob acknowledges Alice's message and then Carol's: only Alice's shows.
    for _ in 0..2 {
        let d = bob.expect("DELIVER");
        bob.ack(&d);
    }
    let line = watch.next(skip);
    assert!(line.contains("Bob acked"), "not Carol's delivery: {line}");
    // Events reach the watch in order: if Carol's acknowledgement showed, it would come
    // before this marker.
    alice.send("Sink", "marker");
    alice.expect("ACK");
    let line = watch.next(|l| l.contains("Sink") && !l.contains("marker"));
    assert!(
        line.contains("Alice → Sink") && line.contains("marker"),
        "nothing of Carol's shows: {line}"
    );
}

#[test]
fn watch_refuses_bad_filters_and_a_missing_relay() {
    let relay = Relay::start();
    // Bad values on the command line are bad usage (exit 2).
    let out = relay.cli(&["watch", "--from", "no/slash"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("bad agent name"));
    let out = relay.cli(&["watch", "--topic", "a..b"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let mut relay = relay;
    relay.stop();
    let out = relay.cli(&["watch"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("agent-relay up"));
}

#[test]
fn watch_ends_when_the_relay_stops() {
    let mut relay = Relay::start();
    let watch = Watcher::start(&relay, &[]);
    let mut prober = client(&relay, "prober");
    watch.wait_subscribed(&mut prober, |p| {
        p.send_env("SEND", json!({"to": "*"}), json!({"body": "probe"}));
    });
    relay.stop();
    let line = watch.next(|l| l.contains("probe"));
    assert_eq!(line, "relay stopped");
    let mut watch = watch;
    let status = watch.child.wait().unwrap();
    assert!(status.success(), "{status}");
}

#[test]
fn watch_and_dashboard_report_expired_deliveries() {
    let relay = Relay::start_with(&["--inbox-ttl", "1"]);
    let (bob, _) = relay.agent("Bob");
    drop(bob);
    crate::support::wait_for(Duration::from_secs(20), "Bob is offline", || {
        let out = crate::support::ok_stdout(&relay.cli(&["agents", "--json"]));
        let agents: Value = serde_json::from_str(&out).unwrap();
        agents[0]["online"] == false
    });
    let watch = Watcher::start(&relay, &["--json"]);
    let mut prober = client(&relay, "prober");
    watch.wait_subscribed(&mut prober, |p| {
        p.send_env("SEND", json!({"topic": "probe"}), json!({"body": "probe"}));
    });
    let mut alice = client(&relay, "Alice");
    let id = alice.send("Bob", "are you there?");
    let receipt = alice.expect("ACK");
    assert_eq!(receipt["payload"]["status"], "queued", "Bob is offline");
    let next = || -> Value { serde_json::from_str(&watch.next(is_probe_json)).unwrap() };
    // Bob's disconnect may come before or after the subscription; skip to the message.
    let mut ev = next();
    while ev["type"] == "agent_disconnected" {
        ev = next();
    }
    assert_eq!(
        str_fields(&ev, ["type", "id"]),
        [Some("accepted"), Some(id.as_str())]
    );
    let ev = next();
    assert_eq!(ev["type"], "expired", "{ev}");
    assert_eq!(ev["deliveries"], 1);

    let (port, token) = crate::support::dashboard(&relay);
    let dead = crate::support::api(port, &token, "/api/dead");
    assert_eq!(dead["dead_letters"][0]["msg_id"], id.as_str(), "{dead}");
    assert_eq!(dead["dead_letters"][0]["code"], "expired");
    let stats = crate::support::api(port, &token, "/api/stats");
    assert_eq!(stats["totals"]["expired"], 1);
}

/// `--to` shows only what is sent to that agent, `--topic` only messages on matching topics
/// (with their deliveries); neither shows the rest.
#[test]
fn watch_filters_by_recipient_and_by_topic() {
    let (relay, [mut bob, mut carol, mut alice]) =
        Relay::with_agents(&[], ["Bob", "Carol", "Alice"]);
    let to_bob = Watcher::start(&relay, &["--json", "--to", "Bob"]);
    to_bob.wait_subscribed(&mut alice, |a| {
        a.send("Bob", "probe");
    });
    let builds = Watcher::start(&relay, &["--json", "--topic", "build.*"]);
    builds.wait_subscribed(&mut alice, |a| {
        a.send_env(
            "SEND",
            json!({"to": "Carol", "topic": "build.probe"}),
            json!({"body": "probe"}),
        );
    });

    alice.send("Carol", "for carol");
    alice.expect("ACK");
    alice.send("Bob", "for bob");
    alice.expect("ACK");
    let green = alice.send_env(
        "SEND",
        json!({"to": "Carol", "topic": "build.linux"}),
        json!({"body": "green"}),
    );
    alice.expect("ACK");
    // Everyone acknowledges everything (probes included): three messages besides probes.
    let mut acked = 0;
    let deadline = relay_protocol::now_instant() + Duration::from_secs(20);
    while acked < 3 {
        assert!(
            relay_protocol::now_instant() < deadline,
            "only {acked} of 3 delivered"
        );
        for agent in [&mut bob, &mut carol] {
            agent.read_timeout(Duration::from_millis(200));
            while let Some(f) = agent.read() {
                if f["type"] == "DELIVER" {
                    agent.ack(&f);
                    if f["payload"]["body"] != "probe" {
                        acked += 1;
                    }
                }
            }
        }
    }
    // A marker both watches show, ordered after everything that came before: Carol sends it
    // after her last ACK on the same connection, and Bob acknowledges it after his last ACK
    // on his. The feed follows the relay's order, so once a watch prints the marker's
    // acknowledgement it has printed everything the three messages could show.
    let marker = carol.send_env(
        "SEND",
        json!({"to": "Bob", "topic": "build.end"}),
        json!({"body": "marker"}),
    );
    carol.expect("ACK");
    bob.read_timeout(Duration::from_secs(20));
    let d = loop {
        let f = bob.expect("DELIVER");
        if f["payload"]["body"] == "marker" {
            break f;
        }
        bob.ack(&f);
    };
    bob.ack(&d);
    // What each printed, probes and the marker aside, up to the marker's acknowledgement.
    let drain = |w: &Watcher| -> Vec<Value> {
        let mut out = Vec::new();
        loop {
            let v: Value = serde_json::from_str(&w.next(|_| false)).unwrap();
            if v["id"] == marker.as_str() {
                if v["type"] == "acked" {
                    return out;
                }
            } else if v["body"] != "probe" {
                out.push(v);
            }
        }
    };
    let bodies = |evs: &[Value]| -> Vec<String> {
        evs.iter()
            .filter(|e| e["type"] == "accepted")
            .map(|e| e["body"].as_str().unwrap().to_owned())
            .collect()
    };
    let seen = drain(&to_bob);
    assert_eq!(bodies(&seen), ["for bob"], "{seen:?}");
    assert!(
        seen.iter()
            .filter(|e| e["type"] == "delivered" || e["type"] == "acked")
            .all(|e| e["recipient"] == "Bob"),
        "{seen:?}"
    );
    let seen = drain(&builds);
    assert_eq!(bodies(&seen), ["green"], "{seen:?}");
    assert!(
        seen.iter().any(|e| e["type"] == "acked"
            && e["id"] == green.as_str()
            && e["recipient"] == "Carol"),
        "its delivery is followed: {seen:?}"
    );
}
