//! What a user meets after the first message (issue 19): each test reproduces a defect an
//! ordinary afternoon ran into, against the real binary.

use std::process::Stdio;

use serde_json::Value;

use crate::support::*;

/// The hand-overs `trace` shows for a message to `recipient`.
fn delivered_events(relay: &Relay, id: &str) -> usize {
    trace_events(relay, id)
        .iter()
        .filter(|e| e["state"] == "delivered")
        .count()
}

/// A message handed over once shows one delivery, however often its recipient reconnects
/// afterwards: before the fix, every later session's trace range started at position 0 and
/// claimed every earlier message (four "delivered" after three reconnects, and a
/// `stored_to_delivered` figure measured from the newest of them).
#[test]
fn trace_shows_each_hand_over_once_across_reconnects() {
    let relay = Relay::start();
    let (mut alice, _) = relay.agent("Alice");
    let mut ids = Vec::new();
    for round in 0..4 {
        let (mut bob, _) = relay.agent("Bob");
        let id = alice.send("Bob", &format!("round {round}"));
        alice.expect("ACK");
        let d = bob.expect("DELIVER");
        assert_eq!(d["id"], id.as_str());
        bob.ack(&d);
        ids.push(id);
        // Leaving ends the session, which records what it was handed.
        drop(bob);
        wait_for(
            std::time::Duration::from_secs(20),
            "Bob's session to end",
            || {
                let agents = ok_stdout(&relay.cli(&["agents", "--json"]));
                let v: Value = serde_json::from_str(&agents).unwrap();
                v.as_array()
                    .unwrap()
                    .iter()
                    .any(|a| a["name"] == "Bob" && a["online"] == false)
            },
        );
    }
    let last = ids.last().unwrap();
    wait_for(
        std::time::Duration::from_secs(20),
        "the last hand-over in the trace",
        || delivered_events(&relay, last) >= 1,
    );
    for id in &ids {
        assert_eq!(delivered_events(&relay, id), 1, "{id}");
    }
}

/// `send --from Alice` while Alice is connected would put words in her mouth: refused, and
/// nothing reaches Bob. Once Alice has left, a person may sign as Alice again (the name is
/// free). Before the fix the spoof was accepted and shown to Bob as from Alice.
#[test]
fn a_tool_cannot_speak_as_a_connected_agent() {
    let (relay, [alice, mut bob]) = Relay::with_agents(&[], ["Alice", "Bob"]);
    let spoof = relay.cli(&["send", "--from", "Alice", "Bob", "spoof"]);
    assert!(!spoof.status.success(), "{spoof:?}");
    let err = String::from_utf8_lossy(&spoof.stderr);
    assert!(err.contains("Alice is a connected agent"), "{err}");
    // The next thing Bob receives is Carol's message, not the spoof.
    ok_stdout(&relay.cli(&["send", "--from", "Carol", "Bob", "real"]));
    let d = bob.expect("DELIVER");
    assert_eq!(
        (d["from"].as_str(), d["payload"]["body"].as_str()),
        (Some("Carol"), Some("real"))
    );
    bob.ack(&d);
    drop(alice);
    wait_for(
        std::time::Duration::from_secs(20),
        "Alice to be offline",
        || {
            let v: Value =
                serde_json::from_str(&ok_stdout(&relay.cli(&["agents", "--json"]))).unwrap();
            v.as_array()
                .unwrap()
                .iter()
                .any(|a| a["name"] == "Alice" && a["online"] == false)
        },
    );
    ok_stdout(&relay.cli(&["send", "--from", "Alice", "Bob", "signed"]));
    let d = bob.expect("DELIVER");
    assert_eq!(d["payload"]["body"], "signed");
}

/// A directive longer than a screen row used to keep (2,048 cells) lost its end without a
/// word (issue 19.1): taken whole now up to the body limit, and one past it is marked cut.
#[test]
fn a_long_directive_is_taken_whole_or_reported_as_cut() {
    let dir = tempfile::tempdir().unwrap();
    let parse = |body_len: usize| -> Value {
        let path = dir.path().join(format!("l{body_len}.bin"));
        let raw = format!("@relay:Bob {} END\r\n\r\n$ ", "x".repeat(body_len));
        std::fs::write(&path, raw).unwrap();
        let out = std::process::Command::new(crate::support::BIN)
            .args(["parse", "--json"])
            .arg(&path)
            .output()
            .unwrap();
        serde_json::from_str(ok_stdout(&out).trim()).unwrap()
    };
    let whole = parse(3000);
    let body = whole["body"].as_str().unwrap();
    assert!(body.ends_with(" END"), "{} chars", body.len());
    assert_eq!(body.len(), 3004);
    assert!(whole.get("truncated").is_none(), "{whole}");
    let cut = parse(40_000);
    assert_eq!(cut["truncated"], true);
}

/// A wrapped agent that prints a directive past the limit is told, and nothing is sent:
/// never the start of it as if whole.
#[test]
fn a_directive_past_the_limit_is_not_sent_and_the_agent_is_told() {
    past_the_limit_is_told(
        r#"printf '@relay:Bob %s END\n' "$(head -c 40000 /dev/zero | tr '\0' x)""#,
        "got: relay: your message to Bob was not sent: it is longer than 16384 bytes",
    );
}

/// A `[[RELAY]]` block past 64 KiB was dropped without a word (issue 19): the agent is told,
/// and nothing is sent.
#[test]
fn a_relay_block_past_the_limit_is_not_sent_and_the_agent_is_told() {
    past_the_limit_is_told(
        r#"printf '[[RELAY]]{"to": "Bob", "body": "%s"}[[/RELAY]]\n' "$(head -c 70000 /dev/zero | tr '\0' x)""#,
        "got: relay: your message to Bob was not sent: it is longer than a [[RELAY]] block may be (65536 bytes, 16384 on one line)",
    );
}

/// A wrapped script runs the shell command `print` (printing something too long to send to
/// Bob), then echoes what is typed into it: it must be told `notice`, and nothing is stored.
fn past_the_limit_is_told(print: &str, notice: &str) {
    let relay = Relay::start();
    let (_bob, _) = relay.agent("Bob");
    // The script gives up after 60 s (a hang bound: before the fixes no notice came).
    let out = relay.run_wrapped(
        "Alice",
        "long.sh",
        &format!(
            r#"(sleep 60; kill $$) &
{print}
while IFS= read -r line; do
  echo "got: $line"
  case "$line" in *"was not sent"*) exit 5;; esac
done
"#
        ),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let tail = &text[text.len().saturating_sub(2000)..];
    assert_eq!(out.status.code(), Some(5), "{tail}");
    assert!(text.contains(notice), "{tail}");
    let h: Value = serde_json::from_slice(&relay.cli(&["history", "--json"]).stdout).unwrap();
    assert_eq!(h.as_array().unwrap().len(), 0, "{h}");
}

/// Where a Claude Code agent's transcript cannot be found, a directive above a tall reply's
/// last screenful would be lost without a word (issue 19.2): the agent, its sender, is told
/// once. A script stands in for Claude Code (the `claude` profile, a `❯` input line) with a
/// HOME that holds no Claude Code session records.
#[test]
fn a_claude_agent_whose_transcript_is_not_found_is_told() {
    let relay = Relay::start();
    let (mut bob, _) = relay.agent("Bob");
    bob.read_timeout(std::time::Duration::from_secs(60));
    let home = relay.dir.path().join("empty-home");
    std::fs::create_dir_all(&home).unwrap();
    relay.write(
        "fake-claude.sh",
        r#"(sleep 60; kill $$) &
printf '● @relay:Bob hello from a reply

❯ '
while IFS= read -r line; do
  echo "got: $line"
  case "$line" in *"transcript was not found"*) exit 5;; esac
  printf '❯ '
done
"#,
    );
    let out = relay
        .command()
        .args(wrap_args(
            "Alice",
            &["--no-input", "--profile", "claude"],
            &["sh", "fake-claude.sh"],
        ))
        .env("HOME", &home)
        .env_remove("CLAUDE_CONFIG_DIR")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let tail = &text[text.len().saturating_sub(2000)..];
    assert_eq!(out.status.code(), Some(5), "{tail}");
    assert!(
        text.contains("got: relay: this agent's Claude Code transcript was not found"),
        "{tail}"
    );
    // The directive itself went, from the screen.
    let d = bob.expect("DELIVER");
    assert_eq!(d["payload"]["body"], "hello from a reply");
}

/// Runs the binary in `cwd` with no path overrides, as a user does: the project root decides
/// where the relay lives (its runtime and data directories are kept under `home`).
fn in_folder(home: &std::path::Path, cwd: &std::path::Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(crate::support::BIN)
        .args(args)
        .current_dir(cwd)
        .env_remove("AGENT_RELAY_SOCKET")
        .env_remove("AGENT_RELAY_DATA_DIR")
        .env_remove("AGENT_RELAY_STORAGE_PATH")
        .env("HOME", home)
        .env("XDG_DATA_HOME", home.join("data"))
        .env("XDG_RUNTIME_DIR", home.join("run"))
        .env("AGENT_RELAY_DASHBOARD_PORT", "0")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Stops the relay started from a folder when the test ends, whatever happens.
struct Down<'a>(&'a std::path::Path, &'a std::path::Path);

impl Drop for Down<'_> {
    fn drop(&mut self) {
        in_folder(self.0, self.1, &["down"]);
    }
}

/// A sub-folder with its own `package.json` inside a git repository belongs to the
/// repository's relay (issue 19.10: it used to get a relay of its own and said "not
/// running"); a "not running" answer names the root it chose.
#[test]
fn a_sub_folder_of_a_repository_finds_the_repositorys_relay() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let repo = tmp.path().join("repo");
    let web = repo.join("web/src");
    std::fs::create_dir_all(home.join("run")).unwrap();
    std::fs::create_dir_all(repo.join(".git")).unwrap();
    std::fs::create_dir_all(&web).unwrap();
    std::fs::write(repo.join("web/package.json"), "{}").unwrap();
    let up = in_folder(&home, &repo, &["up", "--json"]);
    let _down = Down(&home, &repo);
    let started: Value = serde_json::from_str(&ok_stdout(&up)).unwrap();
    assert_eq!(started["project_root"], repo.to_str().unwrap(), "{started}");
    // From the sub-project: the same relay.
    let agents = in_folder(&home, &web, &["agents", "--json"]);
    assert!(agents.status.success(), "{agents:?}");
    let status: Value =
        serde_json::from_str(&ok_stdout(&in_folder(&home, &web, &["status", "--json"]))).unwrap();
    assert_eq!(status["project_root"], repo.to_str().unwrap(), "{status}");
    // Elsewhere: not running, and the answer says which root it looked for.
    let other = tmp.path().join("elsewhere");
    std::fs::create_dir_all(&other).unwrap();
    let out = in_folder(&home, &other, &["agents"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("project root: {}", other.display())),
        "{err}"
    );
}
