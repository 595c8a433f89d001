//! Raw-frame agents and the accounting that proves nothing was dropped.

use super::*;
use std::collections::{HashMap, HashSet};

/// Connects as `Bob` with `ack: false` (the daemon may still be closing his previous
/// connection: the name is tried again until it is free).
pub(crate) fn connect_bob(relay: &Relay) -> Raw {
    loop {
        let mut c = relay.connect();
        c.send_env(
            "HELLO",
            json!({}),
            json!({"agent": "Bob", "cli": "test", "capabilities": {"ack": false}}),
        );
        let f = c.read().expect("an answer to HELLO");
        if f["type"] == "WELCOME" {
            return c;
        }
        assert_eq!(f["payload"]["code"], "name_in_use", "{f}");
    }
}

impl Raw {
    /// Reads frames, answering PINGs and passing over the rest, until one of type `ty`; fails
    /// once `deadline` has passed, saying `why()`.
    pub(crate) fn next_of(
        &mut self,
        ty: &str,
        deadline: std::time::Instant,
        why: impl Fn() -> String,
    ) -> Value {
        loop {
            assert!(relay_protocol::now_instant() < deadline, "{}", why());
            let f = self
                .read()
                .unwrap_or_else(|| panic!("the connection closed: {}", why()));
            if f["type"] == ty {
                return f;
            }
            if f["type"] == "PING" {
                self.send_env("PONG", json!({}), json!({}));
            }
        }
    }
}

/// Alice sends `n` messages to Bob (ids `m000000`...) and waits until every one is stored
/// (ACKed); her ACKs are read on a thread as she sends, so her connection never backs up.
/// Returns the ids.
pub(crate) fn alice_sends_bob(relay: &Relay, n: usize) -> HashSet<String> {
    let (mut alice, _) = relay.agent("Alice");
    let mut reader = alice.reader();
    let acks = std::thread::spawn(move || {
        let mut acked = 0;
        while acked < n {
            let f = reader.read().expect("Alice's connection stays open");
            match f["type"].as_str() {
                Some("ACK") => acked += 1,
                Some("PING" | "BUSY") => {}
                _ => panic!("unexpected frame for Alice: {f}"),
            }
        }
    });
    let mut sent = HashSet::new();
    for i in 0..n {
        let id = format!("m{i:06}");
        alice.send_env("SEND", json!({"id": id, "to": "Bob"}), json!({"body": "x"}));
        sent.insert(id);
    }
    acks.join().unwrap();
    sent
}

/// Waits until no agent has a delivery pending: every acknowledgement is recorded.
pub(crate) fn wait_no_pending(relay: &Relay) {
    wait_for(Duration::from_secs(20), "acks recorded", || {
        cli_json(relay, &["agents"])
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a["pending"] == 0)
    });
}

/// Reads frames until Bob holds `until` distinct messages (answering PINGs), counting each
/// DELIVER by id in `got`; `before` (how many he had read before he dropped) is for the
/// failure's message.
pub(crate) fn read_deliveries_until(
    bob: &mut Raw,
    got: &mut HashMap<String, usize>,
    until: usize,
    before: usize,
) {
    let end = relay_protocol::now_instant() + Duration::from_secs(120);
    while got.len() < until {
        let f = bob.next_of("DELIVER", end, || {
            format!(
                "Bob has {} of {until} messages ({before} read before he dropped); the rest were lost",
                got.len()
            )
        });
        *got.entry(f["id"].as_str().unwrap().to_owned()).or_default() += 1;
    }
}

/// The invariant that catches a silent drop anywhere: every (message, recipient) stored ended
/// acknowledged (acked/verified), or is in the dead-letter queue with a reason, or is still
/// queued for a recipient in `may_wait`; and every refusal the senders were told about (`nacked`
/// ids) is in the dead-letter queue too. Returns (acknowledged, dead-lettered) counts.
pub fn assert_nothing_dropped(relay: &Relay, may_wait: &[&str], nacked: &[String]) -> (u64, u64) {
    let dlq = cli_json(relay, &["dlq", "list", "--all", "--limit", "1000"]);
    let dead: Vec<&Value> = dlq["dead_letters"].as_array().unwrap().iter().collect();
    for d in &dead {
        assert!(
            !d["reason"].as_str().unwrap().is_empty() && !d["code"].as_str().unwrap().is_empty(),
            "a dead letter without a reason: {d}"
        );
    }
    let in_dlq: HashSet<(String, String)> =
        field_pairs(&dlq["dead_letters"], "msg_id", "recipient")
            .into_iter()
            .collect();
    let refused_ids: HashSet<&str> = dead
        .iter()
        .filter(|d| d["pos"].is_null())
        .map(|d| d["msg_id"].as_str().unwrap())
        .collect();
    for id in nacked {
        assert!(
            refused_ids.contains(id.as_str()),
            "{id} was refused but is not in the dead-letter queue"
        );
    }
    let (mut acked, mut dead_count) = (0, 0);
    // One page per sender (a page holds at most 1,000): every known agent, people and the
    // relay's own notices.
    let agents = cli_json(relay, &["agents"]);
    let mut senders: Vec<String> = agents
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap().to_owned())
        .collect();
    senders.extend(["relay".to_owned(), "human".to_owned()]);
    for sender in &senders {
        let page = cli_json(relay, &["history", "--from", sender, "--limit", "1000"]);
        let page = page.as_array().unwrap();
        assert!(
            page.len() < 1000,
            "more messages from {sender} than one page: extend this check"
        );
        for m in page {
            for d in m["deliveries"].as_array().unwrap() {
                let r = d["recipient"].as_str().unwrap();
                match d["status"].as_str().unwrap() {
                    "acked" | "verified" => acked += 1,
                    "failed" | "expired" => {
                        let key = (m["id"].as_str().unwrap().to_owned(), r.to_owned());
                        assert!(
                            in_dlq.contains(&key),
                            "{key:?} was not delivered and is not in the dead-letter queue"
                        );
                        dead_count += 1;
                    }
                    "queued" => assert!(
                        may_wait.contains(&r),
                        "message {} to {r} is still queued: {m}",
                        m["id"]
                    ),
                    other => panic!("unknown status {other}"),
                }
            }
        }
    }
    (acked, dead_count)
}

/// An agent (a shell script under the real wrapper) that answers every relayed message from
/// `peer`, as agents left alone do, and stops only when the relay refuses it.
pub(crate) fn answering_agent(peer: &str) -> String {
    format!(
        r#"n=0
while IFS= read -r line; do
  echo "got: $line"
  case "$line" in
    *"was not sent"*) exit 5;;
    *"Relay message from {peer}"*|*"Relay message from human"*) n=$((n+1)); echo "@relay:{peer} acknowledged $n";;
  esac
done
"#
    )
}

/// Runs a CLI command with `--json` and parses its output.
pub(crate) fn cli_json(relay: &Relay, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    serde_json::from_str(&ok_stdout(&relay.cli(&all))).unwrap()
}
