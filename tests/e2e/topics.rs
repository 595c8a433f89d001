//! Issue 25.6's leftovers: a wrapped agent's MCP server subscribes through its wrapper's door,
//! and the `-n NAME <cli>` shorthand takes `--subscribe`.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::*;

/// `name`'s topics in `agents --json`.
fn topics_of(relay: &Relay, name: &str) -> Vec<String> {
    let v: Value = serde_json::from_str(&ok_stdout(&relay.cli(&["agents", "--json"]))).unwrap();
    v.as_array()
        .and_then(|a| a.iter().find(|x| x["name"] == name).cloned())
        .and_then(|a| serde_json::from_value(a["topics"].clone()).ok())
        .unwrap_or_default()
}

/// A topic message to `topic`; how many it reached.
fn topic_send(relay: &Relay, topic: &str, body: &str) -> u64 {
    let out = relay.cli(&["send", "--topic", topic, "*", body, "--json"]);
    let v: Value = serde_json::from_str(&ok_stdout(&out)).unwrap();
    v["recipients"].as_u64().unwrap()
}

/// `relay_subscribe` from a wrapped agent's MCP server subscribes the wrapper's connection (the
/// agent's one identity) through its door. Before, it refused: "this agent is wrapped: its
/// subscriptions are its wrapper's; start it with `agent-relay wrap --subscribe ...`".
#[test]
fn relay_subscribe_under_a_wrapper_subscribes_through_its_door() {
    let relay = Relay::start();
    let (mut wrapper, mut ada, fifos) = pty_wrapped_mcp(&relay, "Ada");
    let (err, said) = ada.tool("relay_subscribe", json!({"pattern": "build..x"}));
    assert!(err, "{said}");
    let (err, said) = ada.tool("relay_subscribe", json!({"pattern": "build.*"}));
    assert!(!err, "{said}\n{}", fifos.server_log());
    assert!(said.starts_with("Subscribed to build.*"), "{said}");
    assert_eq!(topics_of(&relay, "Ada"), ["build.*"]);
    assert_eq!(topic_send(&relay, "build.linux", "green"), 1);
    drop(ada);
    kill9_child(&mut wrapper);
}

/// `agent-relay -n NAME --subscribe PATTERN <cli>`: the shorthand subscribes like `wrap
/// --subscribe`. Before, `--subscribe` was not an option of the shorthand.
#[test]
fn the_name_shorthand_takes_subscribe() {
    let relay = Relay::start();
    let script = relay.dir.path().join("quiet.sh");
    std::fs::write(
        &script,
        "echo ready\nwhile read -r l; do echo \"got: $l\"; done\n",
    )
    .unwrap();
    let mut child = relay
        .command()
        .args([
            "-n",
            "Joe",
            "--subscribe",
            "build.*",
            "--backend",
            "pty",
            "sh",
        ])
        .arg(&script)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(Duration::from_secs(30), "Joe subscribed", || {
        topics_of(&relay, "Joe") == ["build.*"]
    });
    assert_eq!(topic_send(&relay, "build.linux", "green"), 1);
    kill9_child(&mut child);
}
