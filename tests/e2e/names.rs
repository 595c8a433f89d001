//! Names and ids (issue 23.3, issue 24.3, issue 24.7): a person's names belong to the person's
//! doors, names that differ only by case are one name, a message to an agent that has not run
//! yet waits for it (its sender told once) unless the name is a typo of a known one, and a
//! message's id names it: short ids do not repeat across an agent's runs, and an id with its
//! sender always resolves.

use std::process::Stdio;
use std::time::Duration;

use serde_json::json;

use crate::support::*;

/// A raw HELLO as agent `name`: the daemon's ERROR (code, message), or `None` if welcomed.
fn hello_refusal(relay: &Relay, name: &str) -> Option<(String, String)> {
    let mut c = relay.connect();
    c.send_env("HELLO", json!({}), json!({"agent": name, "cli": "test"}));
    let f = c.read().expect("an answer to HELLO");
    if f["type"] == "WELCOME" {
        return None;
    }
    assert_eq!(f["type"], "ERROR", "{f}");
    Some((
        f["payload"]["code"].as_str().unwrap().to_owned(),
        f["payload"]["message"].as_str().unwrap().to_owned(),
    ))
}

/// `human` and a declared person's name are the person's: a raw agent HELLO, `mcp --name`
/// and a wrapper cannot take them (in any case), so the person's own `send` still works and
/// nothing reaches an agent as "from human" that the person did not send. Before the fix the
/// squatter took `human` and the person's `send` was refused.
#[test]
fn a_persons_names_are_not_taken_by_any_agent_connection() {
    let hook = relay_standin::people::WebhookStandIn::start().unwrap();
    // The relay's own adapter connection holds the declared person's name.
    let relay = webhook_relay(&hook, "", &[]);
    let (mut bob, _) = relay.agent("Bob");
    for name in ["human", "Human", "OPS"] {
        let (code, message) =
            hello_refusal(&relay, name).unwrap_or_else(|| panic!("{name} was taken"));
        assert_eq!(code, "bad_name", "{name}: {message}");
        assert!(message.contains("the person's"), "{name}: {message}");
    }
    // An MCP server and a wrapped agent asking for the name are refused with the reason.
    let mcp = relay
        .command()
        .args(["mcp", "--name", "human"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&mcp.stderr);
    assert!(!mcp.status.success(), "{err}");
    assert!(err.contains("is the person's"), "{err}");
    let wrapped = relay.run_wrapped(
        "human",
        "squat.sh",
        "echo '@relay:Bob this is the person speaking'\nsleep 5\n",
    );
    let err = String::from_utf8_lossy(&wrapped.stderr);
    assert!(!wrapped.status.success(), "{err}");
    assert!(err.contains("is the person's"), "{err}");
    // The person's own door still speaks as the person.
    ok_stdout(&relay.cli(&["send", "Bob", "from the real person"]));
    let d = bob.expect("DELIVER");
    assert_eq!(
        (d["from"].as_str(), d["payload"]["body"].as_str()),
        (Some("human"), Some("from the real person")),
        "{d}"
    );
    assert_eq!(
        history(&relay).iter().map(Stored::line).collect::<Vec<_>>(),
        [("human", "Bob", "from the real person")]
    );
}

/// `alice` beside a live `Alice` is the same name: refused as a connection; and still once
/// Alice has gone (she is known), and as a sender's name on the CLI. Before the fix `alice`
/// connected as a second agent.
#[test]
fn names_that_differ_only_by_case_are_one_name() {
    let relay = Relay::start();
    let (mut alice, _) = relay.agent("Alice");
    let (code, message) = hello_refusal(&relay, "alice").expect("alice was taken beside Alice");
    assert_eq!(code, "bad_name", "{message}");
    assert!(message.contains("same name as \"Alice\""), "{message}");
    alice.bye();
    let (code, message) = hello_refusal(&relay, "ALICE").expect("ALICE was taken");
    assert_eq!(code, "bad_name", "{message}");
    // Alice herself comes back.
    assert_eq!(hello_refusal(&relay, "Alice"), None);
    let (_bob, _) = relay.agent("Bob");
    let out = relay.cli(&["send", "--from", "alice", "Bob", "hi"]);
    assert_eq!(out.status.code(), Some(5), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("same name as \"Alice\""), "{err}");
    assert!(history(&relay).is_empty());
}

/// README's order: Alice starts first (PTY) and speaks to Bob, who has never run. The message
/// waits; Alice is told once that Bob has not connected yet (not for her second message); the
/// person's `send Bob` says the same on its line and succeeds. Bob starts later (tmux) and
/// gets all three. A typo of a known name is refused with the name meant. Before the fix
/// Alice's first message was refused and `send Bob` exited 5.
#[test]
fn a_message_to_an_agent_not_started_yet_waits_for_it_and_a_typo_is_refused() {
    let relay = Relay::start();
    let tmux = relay.tmux();
    relay.write(
        "alice.sh",
        r#"echo "@relay:Bob first, before you started"
while IFS= read -r line; do
  echo "got: $line"
  case "$line" in
    *"has not connected yet"*) echo "@relay:Bob second"; echo;;
    *"was not sent"*) exit 5;;
    *"marker"*) exit 0;;
  esac
done
"#,
    );
    let alice = spawn_wrapped(
        &relay,
        &["wrap", "--no-input", "-n", "Alice", "--", "sh", "alice.sh"],
    );
    wait_for(Duration::from_secs(30), "Alice's two messages", || {
        history(&relay)
            .iter()
            .filter(|m| m.from == "Alice" && m.to == "Bob")
            .count()
            == 2
    });
    let out = relay.cli(&["send", "Bob", "from the person"]);
    let text = ok_stdout(&out);
    assert!(
        text.contains("queued (Bob has not connected yet; the message waits"),
        "{text}"
    );
    // After everything above in the store's order: Alice has been told all she will be.
    ok_stdout(&relay.cli(&["send", "Alice", "marker"]));
    let (code, said) = output_of(alice);
    assert_eq!(code, 0, "{said}");
    let told = said
        .lines()
        .filter(|l| l.starts_with("got: ") && l.contains("has not connected yet"))
        .count();
    assert_eq!(told, 1, "told once:\n{said}");
    assert!(
        said.contains("to Bob is kept: Bob has not connected yet"),
        "{said}"
    );
    // Bob starts under tmux and gets all three, in order.
    let session = start_tmux_agent(
        &relay,
        "Bob",
        r#"while IFS= read -r line; do echo "got: $line"; done
"#,
        &[],
    );
    wait_for(Duration::from_secs(30), "Bob gets the three", || {
        tmux.pane(&session).contains("]: from the person")
    });
    let pane = tmux.pane(&session);
    let at = |s: &str| {
        pane.find(s)
            .unwrap_or_else(|| panic!("{s:?} not on Bob's screen:\n{pane}"))
    };
    assert!(
        at("]: first, before you started") < at(": second"),
        "{pane}"
    );
    assert!(at(": second") < at("]: from the person"), "{pane}");
    // Now Bob is known: near names are typos, refused with the name meant; nothing stored.
    let before = history(&relay).len();
    for typo in ["bob", "Bobb", "Bo"] {
        let out = relay.cli(&["send", typo, "hello"]);
        assert_eq!(out.status.code(), Some(5), "{typo}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("did you mean \"Bob\""), "{typo}: {err}");
    }
    assert_eq!(history(&relay).len(), before);
    wait_online(&relay, "Bob");
}

/// An agent started again (tmux: a new session under the same name) printing the same line
/// gets new ids, short ids included, so `read SHORT` names one message; and a full id names one
/// message: a second sender choosing it is refused. Before the fix the second run's directive had the
/// first's short id (`read` said "matches 2 messages").
#[test]
fn a_restarted_agent_gets_new_short_ids_and_a_full_id_always_resolves() {
    let relay = Relay::start();
    let tmux = relay.tmux();
    let (mut bob, _) = relay.agent("Bob");
    let script = r#"echo "@relay:Bob the very same words"
while IFS= read -r line; do
  echo "got: $line"
  case "$line" in *"time to quit"*) exit 0;; esac
done
"#;
    let mut ids = Vec::new();
    for run in 0..2 {
        let session = start_tmux_agent(&relay, "Alice", script, &[]);
        let d = bob.expect("DELIVER");
        bob.ack(&d);
        assert_eq!(d["payload"]["body"], "the very same words", "{d}");
        ids.push(d["id"].as_str().unwrap().to_owned());
        // Alice's run ends (her session with it).
        bob.send("Alice", "time to quit");
        bob.expect("ACK");
        wait_for(Duration::from_secs(20), "Alice's session ends", || {
            !tmux.has(&session)
        });
        wait_for(
            Duration::from_secs(20),
            &format!("Alice run {run} is offline"),
            || !crate::support::is_online(&relay, "Alice"),
        );
    }
    let short = |id: &str| relay_protocol::short_id(id).to_owned();
    assert_ne!(short(&ids[0]), short(&ids[1]), "{ids:?}");
    for id in &ids {
        let out = ok_stdout(&relay.cli(&["read", &short(id)]));
        assert!(out.contains("the very same words"), "{out}");
    }
    // Two senders choosing one id: an id names one message, so the second sender's SEND is
    // refused (nothing stored, it says why) and the full id alone resolves, for `read` and
    // `trace`; sent again with its own id, the second message is stored. Before the fix both
    // were stored and `read same-id-0001` said "matches 2 messages".
    let (mut carol, _) = relay.agent("Carol");
    carol.send_as_id("same-id-0001", "Bob", "Carol's words");
    carol.expect("ACK");
    let (mut dave, _) = relay.agent("Dave");
    dave.send_as_id("same-id-0001", "Bob", "Dave's words");
    let nack = dave.expect("NACK");
    assert_eq!(nack["payload"]["code"], "invalid", "{nack}");
    let reason = nack["payload"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("another sender") && reason.contains("new id"),
        "{reason}"
    );
    let out = ok_stdout(&relay.cli(&["read", "same-id-0001"]));
    assert!(
        out.contains("Carol's words") && !out.contains("Dave's"),
        "{out}"
    );
    let out = ok_stdout(&relay.cli(&["trace", "same-id-0001"]));
    assert!(out.contains("Carol"), "{out}");
    // The same sender sending its id again is a duplicate, as before.
    carol.send_as_id("same-id-0001", "Bob", "Carol's words");
    assert_eq!(carol.expect("ACK")["payload"]["status"], "duplicate");
    dave.send_as_id("same-id-0002", "Bob", "Dave's words");
    dave.expect("ACK");
    let out = ok_stdout(&relay.cli(&["read", "same-id-0002"]));
    assert!(out.contains("Dave's words"), "{out}");
    // Bob gets each stored message once, in store order, and Dave's refused one never.
    let mut got = Vec::new();
    while got.last().map(String::as_str) != Some("Dave's words") {
        let d = bob.expect("DELIVER");
        bob.ack(&d);
        let body = d["payload"]["body"].as_str().unwrap().to_owned();
        if body.ends_with("'s words") {
            got.push(body);
        }
    }
    assert_eq!(got, ["Carol's words", "Dave's words"]);
}

/// "Told once" is kept in the store, so a relay restart does not tell again: Alice sends to
/// Zed, who never connected, and is told once that Zed has not connected yet; the relay
/// restarts; her second message to Zed waits too, and she is not told again (a marker sent to
/// her after it, in store order, is the next thing she gets). Before, the pairs told were in
/// the daemon's memory: the restarted relay told her a second time.
#[test]
fn a_sender_told_a_name_has_not_connected_yet_is_not_told_again_after_a_relay_restart() {
    let mut relay = Relay::start();
    {
        let (mut alice, _) = relay.agent("Alice");
        alice.send("Zed", "first");
        let ack = alice.expect("ACK");
        assert_eq!(ack["payload"]["status"], "queued", "{ack}");
        let d = alice.expect("DELIVER");
        alice.ack(&d);
        assert_eq!(d["from"], "relay", "{d}");
        assert!(
            d["payload"]["body"]
                .as_str()
                .unwrap()
                .contains("Zed has not connected yet"),
            "{d}"
        );
    }
    relay.stop();
    relay.spawn();
    let (mut alice, _) = relay.agent("Alice");
    alice.send("Zed", "second");
    let ack = alice.expect("ACK");
    assert_eq!(ack["payload"]["status"], "queued", "{ack}");
    ok_stdout(&relay.cli(&["send", "Alice", "marker"]));
    let d = alice.expect("DELIVER");
    alice.ack(&d);
    assert_eq!(d["payload"]["body"], "marker", "told again: {d}");
    let told = history(&relay)
        .iter()
        .filter(|m| {
            m.from == "relay" && m.to == "Alice" && m.body.contains("has not connected yet")
        })
        .count();
    assert_eq!(told, 1);
}
