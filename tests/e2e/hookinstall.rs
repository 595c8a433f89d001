//! `agent-relay hooks install claude` as a newcomer meets it (issue 24.11): the person's own
//! settings file by default, `--shared` with the command from PATH, no stray files, and a
//! hand-over real Claude Code does not call a problem.

use serde_json::Value;

use crate::support::*;

/// The files in `dir`, sorted.
fn files_in(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The hook commands of `event` in settings file `file`.
fn hook_commands(file: &std::path::Path, event: &str) -> Vec<String> {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    v["hooks"][event]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["hooks"].as_array().unwrap().clone())
        .map(|h| h["command"].as_str().unwrap().to_owned())
        .collect()
}

/// `hooks install claude` writes the person's own `.claude/settings.local.json` (never the
/// shared `.claude/settings.json`, and no backup file beside it); `--shared` writes the shared
/// file with the command `agent-relay` as found on PATH, not this binary's absolute path (a
/// teammate's is elsewhere). Uninstall leaves `.claude` as it was. Before, install wrote the
/// absolute path into the shared file and left an empty backup file (issue 24.11).
#[test]
fn hooks_install_writes_the_persons_settings_and_shared_runs_agent_relay_from_path() {
    let relay = Relay::start();
    let dir = relay.dir.path().join("proj");
    let claude = dir.join(".claude");
    std::fs::create_dir_all(&claude).unwrap();
    hooks(&relay, &dir, &["install", "claude"]);
    assert_eq!(files_in(&claude), vec!["settings.local.json".to_owned()]);
    let local = claude.join("settings.local.json");
    let stop = hook_commands(&local, "Stop");
    assert_eq!(stop.len(), 1, "{stop:?}");
    assert!(stop[0].ends_with("agent-relay' hooks stop"), "{stop:?}");
    hooks(&relay, &dir, &["uninstall", "claude"]);
    assert_eq!(files_in(&claude), Vec::<String>::new());

    // The shared file: a person's own settings in it stay, byte for byte after uninstall.
    let original = "{\n  \"model\": \"opus\"\n}\n";
    std::fs::write(claude.join("settings.json"), original).unwrap();
    let out = hooks(&relay, &dir, &["install", "claude", "--shared"]);
    assert!(out.contains("settings.json"), "{out}");
    assert_eq!(files_in(&claude), vec!["settings.json".to_owned()]);
    let shared = claude.join("settings.json");
    assert_eq!(
        hook_commands(&shared, "Stop"),
        vec!["agent-relay hooks stop".to_owned()]
    );
    assert_eq!(
        hook_commands(&shared, "UserPromptSubmit"),
        vec!["agent-relay hooks prompt".to_owned()]
    );
    hooks(&relay, &dir, &["uninstall", "claude", "--shared"]);
    assert_eq!(files_in(&claude), vec!["settings.json".to_owned()]);
    assert_eq!(std::fs::read_to_string(&shared).unwrap(), original);
}

/// Real Claude Code (print mode, offline against the stand-in) with the relay's hooks, a
/// message waiting when its turn ends: the Stop hook hands it over, the model goes on with it
/// (asked once, byte for byte), and Claude Code records no hook error for that Stop (its
/// `stop_hook_summary` has no `hookErrors`: a `{"decision": "block"}` is one, which Claude
/// Code 2.1 shows as "stop hook reported a problem"; issue 24.11).
#[test]
fn claude_code_does_not_call_a_stop_hook_hand_over_a_problem() {
    let relay = Relay::start();
    drop(relay.agent("Alice"));
    let (mut bob, _) = relay.agent("Bob");
    let body = "Please look at:\n  - auth.ts line 40";
    let (id, _, standin) = claude_print_with_hooks(&relay, || {
        let id = bob.send("Alice", body);
        bob.expect("ACK");
        id
    });
    let short = &id[id.len() - 8..];
    let turns = crate::support::turns(&standin);
    let with_it = turns
        .iter()
        .filter(|t| t.contains(&format!("Relay message from Bob [{short}]:\n{body}")))
        .count();
    assert_eq!(with_it, 1, "{turns:#?}");
    // Claude Code's own record of the session: each Stop hook's summary.
    let mut summaries = Vec::new();
    let projects = relay.dir.path().join("home-print/.claude/projects");
    for dir in std::fs::read_dir(&projects).unwrap().filter_map(Result::ok) {
        for file in std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(Result::ok)
        {
            let text = std::fs::read_to_string(file.path()).unwrap_or_default();
            for line in text.lines() {
                let v: Value = serde_json::from_str(line).unwrap_or_default();
                if v["subtype"] == "stop_hook_summary" {
                    summaries.push(v);
                }
            }
        }
    }
    assert!(
        !summaries.is_empty(),
        "no stop_hook_summary in {projects:?}"
    );
    for s in &summaries {
        assert!(
            s["hookErrors"].as_array().is_none_or(Vec::is_empty),
            "Claude Code recorded a hook error: {s:#}"
        );
    }
}
