//! Reply chains and the hop budget (issue 24.8): the agent stopped by the budget is told
//! whole how the chain can go on, and a person extends a live chain's budget without a
//! restart, kept across one.

use std::time::Duration;

use serde_json::json;

use crate::support::*;

/// Alice (tmux) answers Bob until a reply of hers is over the budget (`--max-hops 2`): the
/// notice typed to her is whole and names `chain extend THREAD`; a person runs it, the relay
/// restarts, and the chain goes on past the old limit. Before the fix the notice was cut
/// mid-word ("a person can start a new one (kept in th") and only a restart with another
/// `--max-hops` let the chain go on.
#[test]
fn a_chain_stopped_by_the_budget_is_told_whole_and_a_person_extends_it() {
    let mut relay = Relay::start_with(&["--max-hops", "2"]);
    let dir = relay.dir.path().to_path_buf();
    let tmux = Tmux { dir: &dir };
    let session = start_tmux_agent(
        &relay,
        "Alice",
        r#"while IFS= read -r line; do
  echo "got: $line"
  case "$line" in *"Relay message from Bob"*) echo "@relay:Bob answering you"; echo;; esac
done
"#,
        &[],
    );
    crate::support::wait_online(&relay, "Alice");
    let (mut bob, _) = relay.agent("Bob");
    let first = bob.send("Alice", "shall we talk at length?");
    bob.expect("ACK");
    // Alice's reply is hop 1, Bob's answer to it hop 2 (the limit), Alice's next hop 3.
    let d = bob.expect("DELIVER");
    bob.ack(&d);
    assert_eq!(d["payload"]["in_reply_to"], first.as_str(), "{d}");
    let thread = d["payload"]["thread"].as_str().unwrap().to_owned();
    let second = bob.send_env(
        "SEND",
        json!({"to": "Alice"}),
        json!({"body": "go on", "in_reply_to": d["id"], "thread": thread}),
    );
    bob.expect("ACK");
    wait_for(
        Duration::from_secs(30),
        "Alice is told her reply was not sent",
        || {
            tmux.pane(&session)
                .contains("got: relay: your message to Bob was not sent")
        },
    );
    let pane = tmux.pane(&session);
    let notice = pane
        .lines()
        .find(|l| l.starts_with("got: relay: your message to Bob was not sent"))
        .unwrap();
    assert!(
        notice.contains(&format!("`agent-relay chain extend {thread} 10`"))
            && notice.ends_with(
                "or starts a new message (kept in the dead-letter queue: `agent-relay dlq list`)"
            )
            && !notice.contains('…'),
        "{notice}"
    );
    // A person extends the chain; the extension is kept across a restart of the relay.
    let out = ok_stdout(&relay.cli(&["chain", "extend", &thread, "10"]));
    assert!(out.contains("may now run 12 replies"), "{out}");
    drop(bob);
    relay.stop();
    relay.spawn();
    let (mut bob, _) = relay.agent("Bob");
    // Hop 3 of the chain, over the relay's own limit: accepted now.
    bob.send_env(
        "SEND",
        json!({"to": "Alice"}),
        json!({"body": "and on", "in_reply_to": second, "thread": thread}),
    );
    // `expect` fails on a NACK: the relay's own limit (2) no longer stops this chain.
    bob.expect("ACK");
    let h: serde_json::Value =
        serde_json::from_slice(&relay.cli(&["history", "--json"]).stdout).unwrap();
    assert!(
        h.as_array().unwrap().iter().any(|m| m["body"] == "and on"),
        "not stored: {h}"
    );
    // From the dashboard: the dead letter names the thread (its button extends the chain
    // through this endpoint), and the extension adds up.
    let (port, token) = crate::support::dashboard(&relay);
    let dead = crate::support::api(port, &token, "/api/dead");
    assert!(
        dead["dead_letters"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["code"] == "budget_exceeded"
                && d["reason"]
                    .as_str()
                    .unwrap()
                    .contains(&format!("chain extend {thread} 10"))),
        "{dead}"
    );
    let (status, body) = crate::support::http(
        port,
        "POST",
        &format!("/api/chains/{thread}/extend?hops=5&token={token}"),
        &[],
    );
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (v["extra"].as_u64(), v["max_hops"].as_u64()),
        (Some(15), Some(17)),
        "{v}"
    );
    // A bad extension is bad usage.
    let out = relay.cli(&["chain", "extend", &thread, "0"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}
