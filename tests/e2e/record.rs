//! The relay's store as the one record of what each door handed over (issue 23, points 5–9;
//! issue 24, point 1): every door reads and advances that record through the daemon, oldest
//! first, page by page, and a restart of any process resumes from it.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::*;

/// Bob sends `bodies` to `to`, each stored before the next.
fn bob_sends(relay: &Relay, to: &str, bodies: &[String]) -> Vec<String> {
    let (mut bob, _) = relay.agent("Bob");
    bodies
        .iter()
        .map(|b| {
            let id = bob.send(to, b);
            let ack = bob.expect("ACK");
            assert_eq!(ack["payload"]["ack_id"], id.as_str(), "{ack}");
            id
        })
        .collect()
}

/// The bodies a `relay_inbox` answer shows, in its order (each message's body is one line
/// here, after its header line).
fn shown_bodies(inbox: &str) -> Vec<String> {
    inbox
        .lines()
        .filter(|l| l.starts_with("msg "))
        .map(str::to_owned)
        .collect()
}

/// The trace events of `id` in `state`, with their details.
fn trace_details(relay: &Relay, id: &str, state: &str) -> Vec<String> {
    trace_events(relay, id)
        .iter()
        .filter(|e| e["state"] == state)
        .map(|e| e["detail"].as_str().unwrap_or("").to_owned())
        .collect()
}

/// Issue 23.6 and 23.5: with 25 messages waiting, `relay_inbox` shows the 20 oldest, oldest
/// first, and says 5 more wait; after the MCP server and the relay restart, a new server shows
/// the rest page by page (`limit: 1` skips nothing), never one shown before; `trace` names the
/// door. Before: the newest 20 were shown, the next call said "no new messages", and every new
/// server showed everything again (its position was in memory).
#[test]
fn relay_inbox_pages_oldest_first_and_a_new_server_resumes_from_the_store() {
    let mut relay = Relay::start();
    relay.known_offline("Alice");
    let bodies: Vec<String> = (0..25).map(|i| format!("msg {i:02}")).collect();
    let ids = bob_sends(&relay, "Alice", &bodies);

    let mut mcp = Mcp::start(&relay, "Alice");
    let (err, first) = mcp.tool("relay_inbox", json!({}));
    assert!(!err, "{first}");
    assert!(first.starts_with("20 relay messages:"), "{first}");
    assert_eq!(shown_bodies(&first), bodies[..20], "{first}");
    assert!(first.contains("5 more waiting"), "{first}");
    drop(mcp);

    // Both processes restart: what was shown is in the store, not in either of them.
    relay.stop();
    relay.spawn();
    let mut mcp = Mcp::start(&relay, "Alice");
    for body in &bodies[20..22] {
        let (_, one) = mcp.tool("relay_inbox", json!({"limit": 1}));
        assert_eq!(shown_bodies(&one), std::slice::from_ref(body), "{one}");
    }
    let (_, rest) = mcp.tool("relay_inbox", json!({}));
    assert_eq!(shown_bodies(&rest), bodies[22..], "{rest}");
    assert!(!rest.contains("more waiting"), "{rest}");
    let (_, none) = mcp.tool("relay_inbox", json!({}));
    assert_eq!(none, "No new relay messages.");
    drop(mcp);

    // Each was handed over once, verified by the MCP door.
    for id in [&ids[0], &ids[21], &ids[24]] {
        let verified = trace_details(&relay, id, "verified");
        assert_eq!(
            verified,
            ["shown to the model by relay_inbox (MCP server)"],
            "{id}"
        );
    }
}

/// Issue 23.7: an MCP server that holds the name of an offline (wrapped) agent does not
/// acknowledge its queued mail: what the model was not shown is still there for the agent's
/// next connection. Before: the server acknowledged every delivery on arrival (`trace` said
/// injected) and the agent never got them.
#[test]
fn an_mcp_server_holding_an_offline_agents_name_leaves_what_it_did_not_show() {
    let relay = Relay::start();
    relay.known_offline("Alice");
    let bodies: Vec<String> = (1..=3).map(|i| format!("msg {i}")).collect();
    let ids = bob_sends(&relay, "Alice", &bodies);

    let mut mcp = Mcp::start(&relay, "Alice");
    let (_, one) = mcp.tool("relay_inbox", json!({"limit": 1}));
    assert_eq!(shown_bodies(&one), [bodies[0].clone()], "{one}");
    assert!(one.contains("2 more waiting"), "{one}");
    drop(mcp);
    wait_for(Duration::from_secs(20), "the MCP server is gone", || {
        !crate::support::is_online(&relay, "Alice")
    });

    // Alice's own connection gets the two the model was not shown, in order, and only them.
    let (mut alice, _) = relay.agent("Alice");
    for (id, body) in ids[1..].iter().zip(&bodies[1..]) {
        let d = alice.expect("DELIVER");
        assert_eq!(
            (d["id"].as_str(), d["payload"]["body"].as_str()),
            (Some(id.as_str()), Some(body.as_str()))
        );
        alice.ack(&d);
    }
    // A marker sent after everything: nothing else came before it.
    let marker = bob_sends(&relay, "Alice", &["marker".to_owned()]);
    let d = alice.expect("DELIVER");
    assert_eq!(d["id"], marker[0].as_str(), "{d}");
    assert!(trace_details(&relay, &ids[1], "verified").is_empty());
    assert_eq!(
        trace_details(&relay, &ids[0], "verified"),
        ["shown to the model by relay_inbox (MCP server)"]
    );
}

/// Issue 23.9: an answer through `relay_send` to the agent whose message `relay_inbox` showed
/// is a reply (`in_reply_to`, `thread`), so the relay's hop budget stops two MCP agents that
/// answer each other forever. Before: replies carried neither and the chain never ended.
#[test]
fn answers_through_mcp_are_replies_and_count_in_the_hop_budget() {
    let relay = Relay::start_with(&["--max-hops", "3"]);
    let mut alice = Mcp::start(&relay, "Alice");
    let mut bob = Mcp::start(&relay, "Bob");
    let (err, ack) = alice.tool("relay_send", json!({"to": "Bob", "body": "ping 0"}));
    assert!(!err, "{ack}");
    let first = ack
        .strip_prefix("ACK [")
        .and_then(|r| r.split(']').next())
        .unwrap()
        .to_owned();
    let mut turn = [&mut bob, &mut alice];
    let mut refused = None;
    for hop in 1..=6 {
        let (me, other) = if hop % 2 == 1 {
            ("Bob", "Alice")
        } else {
            ("Alice", "Bob")
        };
        let mcp = &mut turn[(hop + 1) % 2];
        let (_, inbox) = mcp.tool("relay_inbox", json!({}));
        assert!(inbox.starts_with("1 relay message:"), "{me}: {inbox}");
        // The first answer names what it answers; the others are answers by default.
        let args = if hop == 1 {
            json!({"to": other, "body": format!("pong {hop}"), "reply_to": &first[..10]})
        } else {
            json!({"to": other, "body": format!("pong {hop}")})
        };
        let (err, ack) = mcp.tool("relay_send", args);
        if err {
            refused = Some((hop, ack));
            break;
        }
    }
    let (hop, nack) = refused.expect("the chain of answers was never stopped");
    assert_eq!(hop, 4, "{nack}");
    assert!(nack.contains("NACK budget_exceeded"), "{nack}");
    let h: Value = serde_json::from_slice(&relay.cli(&["history", "--json"]).stdout).unwrap();
    let replies: Vec<&Value> = h
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["body"].as_str().unwrap().starts_with("pong"))
        .collect();
    assert_eq!(replies.len(), 3, "{h:#}");
    for m in replies {
        assert_eq!(m["thread"], first.as_str(), "{m:#}");
        assert!(m["in_reply_to"].is_string(), "{m:#}");
    }
}

/// Issue 23.5 with real Claude Code: two `claude -p` runs in a row, each starting its own MCP
/// server (and the relay restarted between them), read the inbox; the message waiting is
/// shown to the first only. Before: the second run's new server showed it again.
#[test]
fn two_claude_code_runs_in_a_row_get_a_waiting_message_once() {
    let mut relay = Relay::start();
    relay.known_offline("Alice");
    let body = "please run the database migration once";
    bob_sends(&relay, "Alice", &[body.to_owned()]);
    let standin = relay_standin::StandIn::start(relay_standin::Script::new(vec![
        relay_standin::Rule::contains("check the relay", "Checking.")
            .calling("mcp__relay__relay_inbox", &json!({})),
    ]))
    .unwrap();
    let config = json!({"mcpServers": {"relay": {
        "type": "stdio",
        "command": crate::support::BIN,
        "args": ["mcp", "--name", "Alice"],
        "env": {
            "AGENT_RELAY_SOCKET": &relay.socket,
            "AGENT_RELAY_DATA_DIR": relay.data_dir(),
        },
    }}})
    .to_string();
    let args = [
        "--mcp-config",
        &config,
        "--strict-mcp-config",
        "--allowedTools",
        "mcp__relay__relay_inbox",
    ];
    crate::support::claude_print(&relay, &standin, &args, "check the relay");
    let first = tool_results(&standin, 0);
    assert!(first.iter().any(|r| r.contains(body)), "{first:?}");

    relay.stop();
    relay.spawn();
    let seen = standin.requests().len();
    crate::support::claude_print(&relay, &standin, &args, "check the relay");
    let second = tool_results(&standin, seen);
    assert!(
        second.iter().any(|r| r.contains("No new relay messages.")),
        "{second:?}"
    );
    assert!(!second.iter().any(|r| r.contains(body)), "{second:?}");
}

/// `agent-relay inbox --json` (or with `--as NAME`): one JSON array, as every `--json` list.
fn inbox_json(relay: &Relay, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["inbox", "--json"];
    all.extend_from_slice(args);
    let out = ok_stdout(&relay.cli(&all));
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("not one JSON array ({e}): {out}"))
}

/// Issue 24.1: the person always has a mailbox. `send Bob` signs as `human`; Bob's answer to
/// `human` waits in the store (no adapter), across a relay restart; `inbox` shows it once and
/// marks it read through the store's record (`trace` names the door); `reply` answers it in
/// its thread; `inbox --follow` shows what comes next. Before: Bob's answer was refused ("no
/// agent named human") and lost.
#[test]
fn the_persons_mailbox_keeps_an_answer_and_reply_is_threaded() {
    let mut relay = Relay::start();
    let (mut bob, _) = relay.agent("Bob");
    let question = ok_stdout(&relay.cli(&["send", "Bob", "status?", "--json"]));
    let question: Value = serde_json::from_str(&question).unwrap();
    let d = bob.expect("DELIVER");
    assert_eq!(
        (d["from"].as_str(), d["id"].as_str()),
        (Some("human"), question["id"].as_str())
    );
    bob.ack(&d);
    let answer = bob.send_env(
        "SEND",
        json!({"to": "human"}),
        json!({"kind": "message", "body": "All good", "in_reply_to": d["id"]}),
    );
    let ack = bob.expect("ACK");
    assert_eq!(ack["payload"]["status"], "queued", "{ack}");
    drop(bob);

    relay.stop();
    relay.spawn();
    let shown = inbox_json(&relay, &[]);
    assert_eq!(shown.len(), 1, "{shown:?}");
    assert_eq!(
        (
            shown[0]["id"].as_str(),
            shown[0]["from"].as_str(),
            shown[0]["body"].as_str()
        ),
        (Some(answer.as_str()), Some("Bob"), Some("All good"))
    );
    assert_eq!(shown[0]["unread"], true);
    assert_eq!(
        ok_stdout(&relay.cli(&["inbox"])).trim(),
        "No new messages for human."
    );
    assert_eq!(
        trace_details(&relay, &answer, "verified"),
        ["shown to the person by agent-relay inbox"]
    );
    let read = inbox_json(&relay, &["--all"]);
    assert_eq!(read.len(), 1, "{read:?}");
    assert_eq!(read[0]["unread"], false);

    // The person answers by the short id the inbox showed; Bob gets it threaded.
    let (mut bob, _) = relay.agent("Bob");
    let short = &answer[answer.len() - 8..];
    ok_stdout(&relay.cli(&["reply", short, "thanks"]));
    let d = bob.expect("DELIVER");
    assert_eq!(d["from"], "human");
    assert_eq!(d["payload"]["body"], "thanks");
    assert_eq!(d["payload"]["in_reply_to"], answer.as_str(), "{d}");
    assert_eq!(d["payload"]["thread"], answer.as_str(), "{d}");
    bob.ack(&d);

    // Following: a message sent while `inbox --follow` runs is shown as it comes.
    let mut follow = relay
        .command()
        .args(["inbox", "--follow", "--json"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(follow.stdout.take().unwrap());
    crate::support::wait_online(&relay, "human");
    bob.send("human", "one more thing");
    bob.expect("ACK");
    let mut l = String::new();
    std::io::BufRead::read_line(&mut out, &mut l).unwrap();
    let v: Value = serde_json::from_str(&l).unwrap();
    assert_eq!(
        (v["body"].as_str(), v["unread"].as_bool()),
        (Some("one more thing"), Some(true))
    );
    kill9_child(&mut follow);
}

/// Issue 24.1: a declared person needs no adapter: `[people.Kim]` alone is accepted, Kim can
/// be addressed before any door of hers ever connected, and `inbox --as Kim` shows it. Before:
/// the configuration was refused ("no way to reach this person") and the relay did not start.
#[test]
fn a_declared_person_without_an_adapter_is_a_mailbox() {
    let mut relay = Relay::unstarted();
    let dir = relay.dir.path().join(".agent-relay");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.toml"), "[people.Kim]\n").unwrap();
    relay.spawn();
    let ids = bob_sends(&relay, "Kim", &["msg for Kim".to_owned()]);
    let shown = inbox_json(&relay, &["--as", "Kim"]);
    assert_eq!(shown.len(), 1, "{shown:?}");
    assert_eq!(shown[0]["id"], ids[0].as_str());
    assert_eq!(shown[0]["body"], "msg for Kim");
    assert!(inbox_json(&relay, &["--as", "Kim"]).is_empty());
}

/// Issue 24.1, the dashboard: `/api/inbox` lists the messages to `human` (a mailbox that
/// always exists), unread marked, and `POST /api/reply` answers one in its thread, as
/// `agent-relay reply` does. Before: neither existed (404).
#[test]
fn the_dashboard_shows_the_persons_inbox_and_replies_in_the_thread() {
    let relay = Relay::start();
    let (mut bob, _) = relay.agent("Bob");
    let asked = bob.send_env(
        "SEND",
        json!({"to": "human"}),
        json!({"kind": "message", "body": "may I deploy?", "thread": "deploy-1"}),
    );
    let ack = bob.expect("ACK");
    assert_eq!(ack["payload"]["status"], "queued", "{ack}");
    let (port, token) = crate::support::dashboard(&relay);
    let inbox = crate::support::api(port, &token, "/api/inbox");
    let listed = inbox["messages"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{inbox}");
    assert_eq!(
        (listed[0]["id"].as_str(), listed[0]["unread"].as_bool()),
        (Some(asked.as_str()), Some(true))
    );
    let body = json!({"id": asked, "body": "yes, go"}).to_string();
    let (status, answer) =
        crate::support::post(port, &format!("/api/reply?token={token}"), &[], &body);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["to"], "Bob", "{answer}");
    let d = bob.expect("DELIVER");
    assert_eq!(
        (
            d["from"].as_str(),
            d["payload"]["body"].as_str(),
            d["payload"]["in_reply_to"].as_str(),
            d["payload"]["thread"].as_str()
        ),
        (
            Some("human"),
            Some("yes, go"),
            Some(asked.as_str()),
            Some("deploy-1")
        )
    );
}

/// `agent-relay hooks stop` run as Claude Code runs it, for `name`, without a wrapper: its
/// stdout (a block decision, or nothing).
fn stop_hook(relay: &Relay, name: &str) -> String {
    stop_hook_said(relay, name).0
}

/// [`stop_hook`], with what the hook wrote on stderr.
fn stop_hook_said(relay: &Relay, name: &str) -> (String, String) {
    run_hook(relay, name, "stop", br#"{"stop_hook_active": false}"#)
}

/// Issue 23.8, the unwrapped hook: 3 large messages and 100 small ones wait; each Stop hook
/// hands over the oldest that fit its bound (Claude Code shows longer output only as a
/// preview), the relay restarted between two of them; together they hand over every message
/// once, in order, and `relay_inbox` then shows none again (one record for both doors).
/// Before: the hook handed over 2 of the 3 large ones and skipped the third, dropped what was
/// past the newest 100, and relay_inbox showed what a hook had handed over.
#[test]
fn the_unwrapped_hook_hands_over_everything_once_oldest_first_within_its_bound() {
    let mut relay = Relay::start_with(crate::support::UNLIMITED);
    relay.known_offline("Alice");
    let mut bodies: Vec<String> = (0..3)
        .map(|i| format!("<<large {i}>> {}", "x".repeat(4000)))
        .collect();
    bodies.extend((0..100).map(|i| format!("<<small {i:03}>>")));
    bob_sends(&relay, "Alice", &bodies);
    let marker = |b: &str| b.split(">>").next().unwrap().to_owned() + ">>";
    let mut seen: Vec<String> = Vec::new();
    for round in 0.. {
        assert!(round < 50, "the hooks never ran dry");
        if round == 1 {
            relay.stop();
            relay.spawn();
        }
        let out = stop_hook(&relay, "Alice");
        if out.trim().is_empty() {
            break;
        }
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["hookSpecificOutput"]["hookEventName"], "Stop", "{v}");
        let reason = v["hookSpecificOutput"]["additionalContext"]
            .as_str()
            .unwrap();
        assert!(
            reason.len() <= 10_000,
            "round {round}: {} bytes",
            reason.len()
        );
        let mut here: Vec<(usize, String)> = bodies
            .iter()
            .map(|b| marker(b))
            .filter_map(|m| reason.find(&m).map(|at| (at, m)))
            .collect();
        here.sort();
        for (_, m) in here {
            let whole = bodies.iter().find(|b| marker(b) == m).unwrap();
            assert!(reason.contains(whole.as_str()), "{m} cut in round {round}");
            seen.push(m);
        }
    }
    let want: Vec<String> = bodies.iter().map(|b| marker(b)).collect();
    assert_eq!(seen, want);
    let mut mcp = Mcp::start(&relay, "Alice");
    let (_, none) = mcp.tool("relay_inbox", json!({}));
    assert_eq!(none, "No new relay messages.");
}

/// Issue 23.8, the wrapped hook door, with real Claude Code: 15 messages of 1.2 KB wait while
/// Bob works; the Stop hook hands over as many as fit its bound, and the rest are typed (or
/// handed over by a later hook): the model gets every one whole, each verified once. Before:
/// one hook answer held all 15, Claude Code kept it in a file and showed the model a preview,
/// and all 15 were recorded verified.
#[test]
fn a_wrapped_claude_codes_stop_hook_hands_over_a_bounded_page_and_nothing_is_lost() {
    let relay = Relay::start_with(crate::support::UNLIMITED);
    let bob = crate::support::claude_bob_held_in_a_turn(&relay);
    let bodies: Vec<String> = (0..15)
        .map(|i| format!("note {i:02}: {}", "abcdefghij".repeat(120)))
        .collect();
    let mut ids = Vec::new();
    for b in &bodies {
        ids.push(cli_send(&relay, "Bob", b));
    }
    wait_for(
        Duration::from_secs(60),
        "the messages wait in Bob's wrapper",
        || {
            let log = bob.wrap_log();
            ids.iter()
                .all(|id| log.contains(&format!("a message waits to be typed id={id}")))
        },
    );
    bob.standin().release();
    let deadline = relay_protocol::now_instant() + Duration::from_secs(120);
    loop {
        // The Stop hook's hand-over reaches the model as a reminder (see `doors::turns`).
        let prompts = crate::support::turns(bob.standin()).join("\n");
        let missing: Vec<usize> = (0..15)
            .filter(|&i| !prompts.contains(bodies[i].as_str()))
            .collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            relay_protocol::now_instant() < deadline,
            "never reached the model whole: {missing:?}\nprompts:\n{}\nwrap log:\n{}",
            prompts.chars().take(6000).collect::<String>(),
            bob.wrap_log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    wait_for(Duration::from_secs(60), "every message is verified", || {
        ids.iter()
            .all(|id| delivery_status(&relay, id) == "verified")
    });
    let log = bob.wrap_log();
    let hooked = ids
        .iter()
        .filter(|id| {
            log.contains(&format!(
                "handed to Claude Code's hook instead of typing id={id}"
            ))
        })
        .count();
    assert!(
        hooked > 0 && hooked < 15,
        "{hooked} of 15 handed to the hook at once"
    );
    // `trace` names the door that handed it over.
    assert_eq!(
        trace_details(&relay, &ids[0], "verified"),
        ["handed to the model by Claude Code's hook (through the wrapper)"]
    );
}

/// The MCP server's hook door answers its own agent's session only: a stand-in for an
/// unwrapped agent CLI (a shell) runs `agent-relay mcp --name Alice` and, when told, its Stop
/// hook; a hook run by any other process with `AGENT_RELAY_NAME=Alice`, and a raw request to
/// `team/Alice/mcp-door.sock`, are refused and take nothing; the session's own hook is handed
/// the waiting message. Before the fix the door took no key: the first outsider took the page.
#[test]
fn the_mcp_servers_hook_door_answers_only_its_own_agents_session() {
    let relay = Relay::start();
    relay.known_offline("Alice");
    let dir = relay.dir.path();
    let go = dir.join("go");
    let fifo = |p: &std::path::Path| {
        let out = std::process::Command::new("mkfifo")
            .arg(p)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    };
    fifo(&go);
    // The server's stdin is the test's pipe (the MCP client's side, never written), so it
    // runs until the test lets go of it; it is started as a simple command, so its parent is
    // the shell (the agent CLI).
    // (`<&0` alone: an asynchronous command's stdin is /dev/null before its redirections.)
    let script = r#"exec 3<&0
"$BIN" mcp --name Alice <&3 3<&- >/dev/null 2>mcp.err &
while read -r cmd < go; do
  case "$cmd" in
    hook) printf '{"stop_hook_active": false}' | "$BIN" hooks stop >hook.out 2>hook.err; echo done >hook.done ;;
    quit) kill $!; exit 0 ;;
  esac
done
"#;
    /// The stand-in agent, killed if the test fails; its server ends as its stdin closes.
    struct Agent(std::process::Child);
    impl Drop for Agent {
        fn drop(&mut self) {
            drop(self.0.stdin.take());
            if let Err(e) = self.0.kill() {
                eprintln!("the stand-in agent: {e}");
            }
            if let Err(e) = self.0.wait() {
                eprintln!("the stand-in agent: {e}");
            }
        }
    }
    let template = relay.command();
    let mut agent = Agent(
        std::process::Command::new("sh")
            .arg("-c")
            .arg(script)
            .envs(
                template
                    .get_envs()
                    .filter_map(|(k, v)| v.map(|v| (k.to_owned(), v.to_owned()))),
            )
            .env("BIN", crate::support::BIN)
            .env("AGENT_RELAY_NAME", "Alice")
            .current_dir(dir)
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    crate::support::wait_online(&relay, "Alice");
    let door = relay.data_dir().join("team/Alice/mcp-door.sock");
    wait_for(Duration::from_secs(20), "the hook door opens", || {
        door.exists()
    });
    bob_sends(&relay, "Alice", &["for Alice's own hooks".to_owned()]);
    // An outsider's hook: nothing handed over, and it says why (the door's refusal, not
    // "another door holds").
    let (out, said) = stop_hook_said(&relay, "Alice");
    assert!(out.trim().is_empty(), "{out}");
    assert!(
        said.contains("nothing handed over") && said.contains("not of this agent's session"),
        "{said}"
    );
    // A raw request: refused, and says why.
    let answer = {
        use std::io::{BufRead, Write};
        let mut s = std::os::unix::net::UnixStream::connect(&door).unwrap();
        s.write_all(b"{\"hook\": \"stop\"}\n").unwrap();
        let mut line = String::new();
        std::io::BufReader::new(s).read_line(&mut line).unwrap();
        line
    };
    let v: Value = serde_json::from_str(&answer).unwrap();
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|e| e.contains("not of this agent's session"))
            && v.get("messages").is_none(),
        "{answer}"
    );
    // The session's own hook gets the message.
    std::fs::write(&go, "hook\n").unwrap();
    wait_for(Duration::from_secs(20), "the agent's own hook ran", || {
        dir.join("hook.done").exists()
    });
    let out = std::fs::read_to_string(dir.join("hook.out")).unwrap();
    assert!(
        out.contains("for Alice's own hooks"),
        "{out}\n{}",
        std::fs::read_to_string(dir.join("hook.err")).unwrap_or_default()
    );
    std::fs::write(&go, "quit\n").unwrap();
    assert!(agent.0.wait().unwrap().success());
}

/// Issue 23.8, two doors of one unwrapped agent: while its MCP server holds the name (and so
/// its messages), the Stop hook asks that server for a page; what the hook handed over,
/// `relay_inbox` does not show again. Before: the hook read the history past its own position
/// file and relay_inbox showed the same messages again.
#[test]
fn the_hook_and_the_mcp_server_of_one_agent_never_hand_a_message_over_twice() {
    let relay = Relay::start();
    relay.known_offline("Alice");
    let mut mcp = Mcp::start(&relay, "Alice");
    crate::support::wait_online(&relay, "Alice");
    let bodies: Vec<String> = (1..=2).map(|i| format!("msg {i}")).collect();
    bob_sends(&relay, "Alice", &bodies);
    let out = stop_hook(&relay, "Alice");
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    let reason = v["hookSpecificOutput"]["additionalContext"]
        .as_str()
        .unwrap();
    assert!(
        reason.contains(":\nmsg 1\n") && reason.ends_with(":\nmsg 2"),
        "{reason}"
    );
    let (_, none) = mcp.tool("relay_inbox", json!({}));
    assert_eq!(none, "No new relay messages.");
    assert!(stop_hook(&relay, "Alice").trim().is_empty());
}
