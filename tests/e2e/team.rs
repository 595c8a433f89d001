//! A team, not only a bus (issue 25): every agent's state (idle, busy since when, blocked
//! why, offline) with its thread and last activity in `agents --json` and `relay_agents`,
//! and `wait NAME... --until idle|exit` for scripts and lead agents.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::support::*;

/// A worker: a message with "work" in it keeps it printing (busy) until the file `gate`
/// exists, then it says "done"; the file `quit` makes it exit 3 instead.
const WORKER: &str = r#"echo "I am $AGENT_RELAY_NAME"
while IFS= read -r line; do
  case "$line" in
    *work*)
      echo working
      while [ ! -e gate ]; do
        if [ -e quit ]; then echo bye; exit 3; fi
        echo .
        sleep 0.1
      done
      echo done ;;
  esac
done
"#;

/// `name`'s row in `agents --json`.
fn row(relay: &Relay, name: &str) -> Value {
    let v: Value = serde_json::from_str(&ok_stdout(&relay.cli(&["agents", "--json"]))).unwrap();
    v.as_array()
        .and_then(|a| a.iter().find(|x| x["name"] == name).cloned())
        .unwrap_or(Value::Null)
}

/// `relay_agents`'s line for `name`.
fn tool_line(mcp: &mut Mcp, name: &str) -> String {
    let (err, text) = mcp.tool("relay_agents", serde_json::json!({}));
    assert!(!err, "{text}");
    text.lines()
        .find(|l| l.starts_with(&format!("{name} — ")))
        .unwrap_or_default()
        .to_owned()
}

/// Starts `agent-relay wait ARGS` and returns once it said it waits (its first look found the
/// agents not there yet).
fn waiting(relay: &Relay, args: &[&str]) -> Child {
    let mut child = relay.spawn_cli(&[&["wait"], args].concat(), Stdio::piped());
    let mut first = String::new();
    BufReader::new(child.stderr.as_mut().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("agent-relay: waiting ("), "{first:?}");
    child
}

/// Its exit code and stdout.
fn finish(child: Child) -> (Option<i32>, String) {
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// A wrapped worker is idle after its start; a message typed into it makes it busy (since
/// then, why: answering it) with the message as its thread, in `agents --json` and in the MCP
/// `relay_agents`; `wait --until idle` waits until its output settles after the answer; when
/// it exits, it is offline, `wait --until exit` returns 0 and `wait --until idle` 10; a
/// `--timeout` that passes is 11 and an unknown name 4. Before, `agents` said only
/// online/offline and there was no `wait` (issue 25.5).
#[test]
fn state_follows_busy_idle_offline_and_wait_returns_on_idle_and_on_exit() {
    let relay = Relay::start();
    let _tmux = relay.tmux();
    start_tmux_agent(&relay, "Wes", WORKER, &[]);
    let mut mcp = Mcp::start(&relay, "Lead");

    // Idle once its start has settled.
    let out = relay.cli(&[
        "wait",
        "Wes",
        "--until",
        "idle",
        "--timeout",
        "60",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["state"], "idle", "{v}");
    let idle = row(&relay, "Wes");
    assert_eq!(idle["state"], "idle", "{idle}");
    assert!(idle["since"].as_u64().is_some(), "{idle}");
    assert!(
        tool_line(&mut mcp, "Wes").starts_with("Wes — idle since"),
        "{}",
        tool_line(&mut mcp, "Wes")
    );

    // A message typed in: busy, since then, answering it, in its thread.
    let id = cli_send(&relay, "Wes", "work on it");
    wait_for(Duration::from_secs(30), "Wes busy", || {
        row(&relay, "Wes")["state"] == "busy"
    });
    let busy = row(&relay, "Wes");
    assert_eq!(busy["thread"], id.as_str(), "{busy}");
    assert!(
        busy["since"].as_u64() >= idle["since"].as_u64(),
        "{busy} after {idle}"
    );
    assert!(busy["last_activity"].as_u64().is_some(), "{busy}");
    let line = tool_line(&mut mcp, "Wes");
    assert!(line.starts_with("Wes — busy since"), "{line}");
    assert!(line.contains(&format!("thread {id}")), "{line}");

    // `wait --until idle` waits while it works, and returns once it is done.
    let wait = waiting(&relay, &["Wes", "--until", "idle", "--timeout", "120"]);
    relay.write("gate", "");
    let (code, stdout) = finish(wait);
    assert_eq!(code, Some(0), "{stdout}");
    assert_eq!(stdout.trim(), "Wes: idle", "{stdout}");
    assert_eq!(row(&relay, "Wes")["state"], "idle");
    assert!(
        tool_line(&mut mcp, "Wes").starts_with("Wes — idle since"),
        "{}",
        tool_line(&mut mcp, "Wes")
    );

    // Busy again; it exits while two waits wait: one for idle (10), one for exit (0).
    std::fs::remove_file(relay.dir.path().join("gate")).unwrap();
    relay.cli(&["send", "Wes", "more work"]);
    wait_for(Duration::from_secs(30), "Wes busy again", || {
        row(&relay, "Wes")["state"] == "busy"
    });
    let for_idle = waiting(&relay, &["Wes", "--until", "idle", "--timeout", "120"]);
    let for_exit = waiting(&relay, &["Wes", "--until", "exit", "--timeout", "120"]);
    relay.write("quit", "");
    let (code, stdout) = finish(for_exit);
    assert_eq!(code, Some(0), "{stdout}");
    assert_eq!(stdout.trim(), "Wes: offline");
    let (code, stdout) = finish(for_idle);
    assert_eq!(code, Some(10), "{stdout}");
    assert_eq!(row(&relay, "Wes")["state"], "offline");
    assert!(
        tool_line(&mut mcp, "Wes").starts_with("Wes — offline"),
        "{}",
        tool_line(&mut mcp, "Wes")
    );

    // A timeout that passes, and a name nobody has.
    let out = relay.cli(&["wait", "Lead", "--until", "exit", "--timeout", "1"]);
    assert_eq!(out.status.code(), Some(11), "{out:?}");
    let out = relay.cli(&["wait", "Nobody", "--until", "idle"]);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
}

/// On "announce", sends to the topic `build.linux` from its screen.
fn announcer() -> String {
    script_agent(
        I_AM,
        false,
        r#"*announce*) echo "@relay:#build.linux from-pat" ;;"#,
    )
}

/// A wrapped agent started with `--subscribe 'build.*'` gets a message sent to `build.linux`
/// exactly once, again after the relay restarted (the wrapper subscribes on every connection);
/// an agent not subscribed gets none; another agent's `@relay:#build.linux` line reaches it
/// once; `send --topic` to a topic nobody subscribes to says so.
/// Before, a wrapped agent could not subscribe at all and such a send said "accepted" (issue
/// 25.6).
#[test]
fn a_wrapped_agent_subscribed_to_a_topic_gets_its_messages_once_across_a_restart() {
    let mut relay = Relay::start();
    let dir = relay.dir.path().to_path_buf();
    let tmux = Tmux { dir: &dir };
    let tia = start_tmux_agent(&relay, "Tia", ECHOER, &["--subscribe", "build.*"]);
    let ned = start_tmux_agent(&relay, "Ned", ECHOER, &[]);
    start_tmux_agent(&relay, "Pat", &announcer(), &[]);
    let shown = |session: &str, text: &str| {
        tmux.pane(session)
            .lines()
            .filter(|l| l.starts_with("got: ") && l.contains(text))
            .count()
    };
    let topic_send = |relay: &Relay, body: &str| {
        let out = relay.cli(&["send", "--topic", "build.linux", "*", body, "--json"]);
        let v: Value = serde_json::from_str(&ok_stdout(&out)).unwrap();
        assert_eq!(v["recipients"], 1, "{v}");
    };
    topic_send(&relay, "green-one");
    wait_for(Duration::from_secs(30), "Tia got green-one", || {
        shown(&tia, "green-one") == 1
    });

    // The relay restarts; Tia's wrapper connects again and is still subscribed.
    relay.stop();
    relay.spawn();
    wait_for(Duration::from_secs(30), "Tia back online", || {
        row(&relay, "Tia")["online"] == true
    });
    topic_send(&relay, "green-two");
    // An agent sends to the topic from its screen: `@relay:#build.linux ...`.
    relay.cli(&["send", "Pat", "announce"]);
    wait_for(
        Duration::from_secs(30),
        "Tia got Pat's announcement",
        || shown(&tia, "from-pat") == 1,
    );
    // Markers sent after everything: deliveries are in store order, so once a marker is
    // shown everything before it was too.
    relay.cli(&["send", "Tia", "marker-tia"]);
    relay.cli(&["send", "Ned", "marker-ned"]);
    wait_for(Duration::from_secs(30), "markers shown", || {
        shown(&tia, "marker-tia") == 1 && shown(&ned, "marker-ned") == 1
    });
    assert_eq!(shown(&tia, "green-one"), 1, "{}", tmux.pane(&tia));
    assert_eq!(shown(&tia, "green-two"), 1, "{}", tmux.pane(&tia));
    assert_eq!(shown(&tia, "from-pat"), 1, "{}", tmux.pane(&tia));
    assert_eq!(shown(&ned, "green-"), 0, "{}", tmux.pane(&ned));
    assert_eq!(shown(&ned, "from-pat"), 0, "{}", tmux.pane(&ned));

    // A topic nobody subscribes to.
    let out = relay.cli(&["send", "--topic", "nobody.here", "*", "hello?"]);
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no agent subscribes to topic nobody.here"),
        "{err}"
    );
}

/// An MCP agent subscribes with `relay_subscribe` and reads a topic message in its inbox once,
/// again after the relay restarted (the subscription is stored); a bad pattern is refused.
/// Before, no MCP tool could subscribe (issue 25.6).
#[test]
fn an_mcp_agent_subscribes_with_relay_subscribe_and_reads_topic_messages_once() {
    let mut relay = Relay::start();
    let mut sam = Mcp::start(&relay, "Sam");
    let (err, said) = sam.tool(
        "relay_subscribe",
        serde_json::json!({"pattern": "build..x"}),
    );
    assert!(err, "{said}");
    let (err, said) = sam.tool("relay_subscribe", serde_json::json!({"pattern": "build.*"}));
    assert!(!err && said.starts_with("Subscribed to build.*"), "{said}");
    let send = |relay: &Relay, body: &str| {
        let out = relay.cli(&["send", "--topic", "build.linux", "*", body, "--json"]);
        let v: Value = serde_json::from_str(&ok_stdout(&out)).unwrap();
        assert_eq!(v["recipients"], 1, "{v}");
    };
    send(&relay, "green-one");
    relay.stop();
    relay.spawn();
    wait_for(Duration::from_secs(30), "Sam back online", || {
        row(&relay, "Sam")["online"] == true
    });
    send(&relay, "green-two");
    let mut seen = String::new();
    wait_for(Duration::from_secs(30), "both in Sam's inbox", || {
        let (err, inbox) = sam.tool("relay_inbox", serde_json::json!({}));
        assert!(!err, "{inbox}");
        seen.push_str(&inbox);
        seen.contains("green-two")
    });
    assert_eq!(seen.matches("green-one").count(), 1, "{seen}");
    assert_eq!(seen.matches("green-two").count(), 1, "{seen}");
}

/// On "join", subscribes to `build.*` with a `[[RELAY]]` block; echoes everything.
fn joiner() -> String {
    script_agent(
        I_AM,
        true,
        r#"*join*) echo '[[RELAY]]{"subscribe": "build.*"}[[/RELAY]]' ;;"#,
    )
}

/// A wrapped agent subscribes from its screen with a `[[RELAY]]` block `{"subscribe": ...}`:
/// it is told it is subscribed, gets a topic message once, and no message goes to anyone for
/// the block. Before, the block was reported malformed ("it has no \"to\"") (issue 25.6).
#[test]
fn a_wrapped_agent_subscribes_from_its_screen_with_a_relay_block() {
    let relay = Relay::start();
    let tmux = relay.tmux();
    let joy = start_tmux_agent(&relay, "Joy", &joiner(), &[]);
    relay.cli(&["send", "Joy", "please join"]);
    wait_for(
        Duration::from_secs(30),
        "Joy told she is subscribed",
        || tmux.pane(&joy).contains("subscribed to build.*"),
    );
    let out = relay.cli(&["send", "--topic", "build.linux", "*", "green-joy", "--json"]);
    let v: Value = serde_json::from_str(&ok_stdout(&out)).unwrap();
    assert_eq!(v["recipients"], 1, "{v}");
    relay.cli(&["send", "Joy", "marker-joy"]);
    wait_for(Duration::from_secs(30), "marker shown", || {
        tmux.pane(&joy).contains("got: ") && tmux.pane(&joy).contains("marker-joy")
    });
    let pane = tmux.pane(&joy);
    let got = pane
        .lines()
        .filter(|l| l.starts_with("got: ") && l.contains("green-joy"))
        .count();
    assert_eq!(got, 1, "{pane}");
    // Nothing was sent for the block: the store holds only the messages sent here.
    let h: Value =
        serde_json::from_slice(&relay.cli(&["history", "--from", "Joy", "--json"]).stdout).unwrap();
    assert_eq!(h.as_array().map(Vec::len), Some(0), "{h}");
}
