//! Claims (issue 25.7): an agent claims paths for a while; another agent's claim or edit of
//! them is told to both, once; claims outlive a daemon restart, expire, and are released when
//! their agent leaves; hostile paths are refused.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::*;

/// Reads frames (acknowledging DELIVERs, answering PINGs) until a RESULT and `notices`
/// notices from the relay have come; returns them.
fn result_and_notices(c: &mut Raw, notices: usize) -> (Value, Vec<Value>) {
    let (mut result, mut told) = (None, Vec::new());
    while result.is_none() || told.len() < notices {
        let f = c.read().expect("connection closed");
        match f["type"].as_str() {
            Some("RESULT") => result = Some(f),
            Some("DELIVER") => {
                c.ack(&f);
                told.push(f);
            }
            Some("PING") => {
                c.send_env("PONG", json!({}), json!({}));
            }
            _ => {}
        }
    }
    (result.unwrap(), told)
}

/// The next DELIVER (acknowledged).
fn next_deliver(c: &mut Raw) -> Value {
    let d = c.expect("DELIVER");
    c.ack(&d);
    d
}

fn query(c: &mut Raw, payload: Value) -> String {
    c.send_env("QUERY", json!({}), payload)
}

fn claims_listed(relay: &Relay) -> Vec<(String, String)> {
    let out = ok_stdout(&relay.cli(&["claim", "--list", "--json"]));
    let v: Value = serde_json::from_str(&out).unwrap();
    field_pairs(&v["claims"], "agent", "path")
}

#[test]
fn a_claim_of_a_claimed_path_is_told_to_both_once() {
    let (relay, [mut alice, mut bob]) = Relay::with_agents(&[], ["Alice", "Bob"]);
    query(&mut alice, json!({"what": "claim", "paths": ["src/"]}));
    let (r, _) = result_and_notices(&mut alice, 0);
    assert_eq!(r["payload"]["claims"][0]["path"], "src/", "{r}");
    assert_eq!(r["payload"]["collisions"], json!([]), "{r}");

    query(&mut bob, json!({"what": "claim", "paths": ["src/auth.rs"]}));
    let (r, told) = result_and_notices(&mut bob, 1);
    assert_eq!(r["payload"]["collisions"][0]["agent"], "Alice", "{r}");
    assert_eq!(r["payload"]["collisions"][0]["claimed"], "src/", "{r}");
    let body = told[0]["payload"]["body"].as_str().unwrap();
    assert_eq!(told[0]["from"], "relay");
    assert!(body.contains("src/auth.rs is claimed by Alice"), "{body}");
    let d = next_deliver(&mut alice);
    assert_eq!(d["from"], "relay");
    let body = d["payload"]["body"].as_str().unwrap();
    assert!(body.contains("Bob claimed src/auth.rs"), "{body}");

    // Claimed again (renewed): nobody is told a second time. A marker shows what comes next.
    query(&mut bob, json!({"what": "claim", "paths": ["src/auth.rs"]}));
    let (r, _) = result_and_notices(&mut bob, 0);
    assert_eq!(r["payload"]["collisions"][0]["agent"], "Alice", "{r}");
    ok_stdout(&relay.cli(&["send", "Alice", "marker-a"]));
    ok_stdout(&relay.cli(&["send", "Bob", "marker-b"]));
    assert_eq!(next_deliver(&mut alice)["payload"]["body"], "marker-a");
    assert_eq!(next_deliver(&mut bob)["payload"]["body"], "marker-b");

    // A person's claim from the command line names both holders.
    let out = ok_stdout(&relay.cli(&["claim", "--as", "carol", "src/auth.rs", "--json"]));
    let v: Value = serde_json::from_str(&out).unwrap();
    let mut who: Vec<&str> = field_strs(&v["collisions"], "agent");
    who.sort();
    assert_eq!(who, ["Alice", "Bob"], "{out}");
    let told = next_deliver(&mut alice);
    assert!(
        told["payload"]["body"]
            .as_str()
            .unwrap()
            .contains("carol claimed src/auth.rs"),
        "{told}"
    );
}

#[test]
fn a_tool_cannot_claim_for_a_connected_agent() {
    let relay = Relay::start();
    let (_alice, _) = relay.agent("Alice");
    let out = relay.cli(&["claim", "--as", "Alice", "src/x.rs"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("only its own connection claims for it"),
        "{err}"
    );
    assert!(claims_listed(&relay).is_empty());
}

#[test]
fn claims_survive_a_restart_and_expire() {
    let mut relay = Relay::start();
    std::fs::create_dir_all(relay.dir.path().join("src/db")).unwrap();
    ok_stdout(&relay.cli(&["claim", "--as", "dora", "src/x.rs", "src/db", "--for", "1h"]));
    ok_stdout(&relay.cli(&["claim", "--as", "eve", "notes.md", "--for", "3s"]));
    relay.stop();
    relay.spawn();
    let listed = claims_listed(&relay);
    assert!(
        listed.contains(&("dora".into(), "src/x.rs".into())),
        "{listed:?}"
    );
    // An existing directory is claimed as one (what it holds is covered).
    assert!(
        listed.contains(&("dora".into(), "src/db/".into())),
        "{listed:?}"
    );
    // After the restart the claim still collides.
    let out = ok_stdout(&relay.cli(&["claim", "--as", "fay", "src/db/schema.sql"]));
    assert!(out.contains("also claimed by dora (src/db/"), "{out}");
    // Eve's claim ends by itself; Dora's stays.
    wait_for(Duration::from_secs(30), "eve's claim expired", || {
        !claims_listed(&relay).iter().any(|(a, _)| a == "eve")
    });
    assert!(claims_listed(&relay).iter().any(|(a, _)| a == "dora"));
    // Released from the command line.
    let out = ok_stdout(&relay.cli(&["claim", "--as", "dora", "--release"]));
    assert!(out.contains("released src/x.rs"), "{out}");
    assert!(!claims_listed(&relay).iter().any(|(a, _)| a == "dora"));
}

#[test]
fn an_agent_that_leaves_releases_its_claims_and_a_lost_one_keeps_them_until_forgotten() {
    let (relay, [mut alice, mut carol]) = Relay::with_agents(&[], ["Alice", "Carol"]);
    query(&mut alice, json!({"what": "claim", "paths": ["a.rs"]}));
    result_and_notices(&mut alice, 0);
    query(&mut carol, json!({"what": "claim", "paths": ["c.rs"]}));
    result_and_notices(&mut carol, 0);
    // Carol's connection is lost (no BYE): her claim stays until it expires.
    drop(carol);
    wait_for(Duration::from_secs(20), "Carol offline", || {
        let out = ok_stdout(&relay.cli(&["agents", "--json"]));
        let v: Value = serde_json::from_str(&out).unwrap();
        v.as_array()
            .or(v["agents"].as_array())
            .unwrap()
            .iter()
            .any(|a| a["name"] == "Carol" && a["online"] == false)
    });
    // Alice says BYE (stopped, or exited): hers are released.
    alice.bye();
    wait_for(Duration::from_secs(20), "Alice's claim released", || {
        !claims_listed(&relay).iter().any(|(a, _)| a == "Alice")
    });
    assert_eq!(claims_listed(&relay), [("Carol".into(), "c.rs".into())]);
    // Forgotten (she will not come back): her claims go with her.
    ok_stdout(&relay.cli(&["agents", "forget", "Carol"]));
    assert!(claims_listed(&relay).is_empty());
}

#[test]
fn hostile_paths_are_refused_with_a_clear_error() {
    let relay = Relay::start();
    let long = "a".repeat(10 * 1024);
    for (path, says) in [
        ("../../etc/passwd", "outside the project"),
        ("/etc/passwd", "outside the project"),
        ("src/\x1b[2Jevil.rs", "control character"),
        ("src/*.rs", "not a pattern"),
        (long.as_str(), "claim its directory instead"),
        (".", "whole project"),
    ] {
        let out = relay.cli(&["claim", "--as", "mallory", path]);
        assert_eq!(out.status.code(), Some(2), "{path:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{path:?}: {err}");
        assert!(
            !err.contains('\x1b'),
            "the escape is shown, not sent: {err:?}"
        );
    }
    // The daemon checks what a client sends, whatever the client.
    let (mut m, _) = relay.agent("Mallory");
    for path in [
        "../../etc/passwd",
        "/etc/passwd",
        "a\u{1b}[2J",
        "src/../../x",
    ] {
        query(&mut m, json!({"what": "claim", "paths": [path]}));
        let r = m.expect("RESULT");
        assert_eq!(r["payload"]["what"], "error", "{path:?}: {r}");
        assert_eq!(r["payload"]["code"], "invalid", "{r}");
    }
    assert!(claims_listed(&relay).is_empty());
}

/// A stand-in agent: echoes every line it reads, and runs the shell `action` on a line that
/// contains `trigger`.
fn agent_script(trigger: &str, action: &str) -> String {
    script_agent(I_AM, true, &format!("*{trigger}*) {action} ;;"))
}

/// A wrapped agent claims from its screen with a `[[RELAY]]` block: it is told, the claim is
/// the agent's (not a message to anyone), another agent's claim of the path is typed into it
/// as the relay's notice, and `agent-relay stop` releases its claims.
#[test]
fn a_wrapped_agent_claims_from_its_screen_and_stop_releases_it() {
    let relay = Relay::start();
    let tmux = relay.tmux();
    // On "please-claim", claims src/auth.rs with a `[[RELAY]]` block.
    let claimer = agent_script(
        "please-claim",
        r#"echo '[[RELAY]]{"claim": ["src/auth.rs"], "for": "1h"}[[/RELAY]]'"#,
    );
    let kim = crate::support::start_tmux_agent(&relay, "Kim", &claimer, &[]);
    ok_stdout(&relay.cli(&["send", "Kim", "please-claim"]));
    wait_for(Duration::from_secs(30), "Kim told she claimed", || {
        tmux.pane(&kim)
            .contains("relay: claimed src/auth.rs for 60 min")
    });
    assert_eq!(
        claims_listed(&relay),
        [("Kim".into(), "src/auth.rs".into())]
    );
    // Nothing was sent for the block.
    let h: Value =
        serde_json::from_slice(&relay.cli(&["history", "--from", "Kim", "--json"]).stdout).unwrap();
    assert_eq!(h.as_array().map(Vec::len), Some(0), "{h}");

    let (mut bob, _) = relay.agent("Bob");
    query(&mut bob, json!({"what": "claim", "paths": ["src/"]}));
    let (r, told) = result_and_notices(&mut bob, 1);
    assert_eq!(r["payload"]["collisions"][0]["agent"], "Kim", "{r}");
    assert!(
        told[0]["payload"]["body"]
            .as_str()
            .unwrap()
            .contains("src/ is claimed by Kim"),
        "{told:?}"
    );
    wait_for(Duration::from_secs(30), "Kim told of Bob's claim", || {
        tmux.pane(&kim).contains("Bob claimed src/")
    });

    ok_stdout(&relay.cli(&["stop", "Kim"]));
    wait_for(Duration::from_secs(30), "Kim's claim released", || {
        !claims_listed(&relay).iter().any(|(a, _)| a == "Kim")
    });
    assert_eq!(claims_listed(&relay), [("Bob".into(), "src/".into())]);
}

/// The MCP tool `relay_claim`: an unwrapped agent's server claims on its own connection; a
/// wrapped agent's server claims through its wrapper's door (the wrapper's connection holds the
/// name), lists and releases.
#[test]
fn relay_claim_claims_lists_and_releases_with_and_without_a_wrapper() {
    let relay = Relay::start();
    let mut sam = crate::support::Mcp::start(&relay, "Sam");
    let (err, said) = sam.tool("relay_claim", json!({"paths": ["docs/a.md"], "for": "10m"}));
    assert!(
        !err && said.starts_with("claimed docs/a.md until"),
        "{said}"
    );
    let (err, said) = sam.tool("relay_claim", json!({"paths": ["../../etc/passwd"]}));
    assert!(err && said.contains("outside the project"), "{said}");

    let (mut ada_wrapper, mut ada, fifos) = pty_wrapped_mcp(&relay, "Ada");
    let (err, said) = ada.tool("relay_claim", json!({"paths": ["docs/"]}));
    assert!(!err, "{said}\n{}", fifos.server_log());
    assert!(said.contains("claimed docs/ until"), "{said}");
    assert!(
        said.contains("docs/ is also claimed by Sam (docs/a.md"),
        "{said}"
    );
    let (err, said) = ada.tool("relay_claim", json!({"list": true}));
    assert!(!err, "{said}");
    assert!(said.contains("docs/ claimed by Ada"), "{said}");
    assert!(said.contains("docs/a.md claimed by Sam"), "{said}");
    let (err, said) = ada.tool("relay_claim", json!({"release": true}));
    assert!(!err && said.contains("released docs/"), "{said}");
    assert_eq!(claims_listed(&relay), [("Sam".into(), "docs/a.md".into())]);
    drop(ada);
    kill9_child(&mut ada_wrapper);
}

/// What Claude Code writes on a PostToolUse hook's stdin after an edit (its hooks reference:
/// `session_id`, `transcript_path`, `cwd`, `permission_mode`, `hook_event_name`, `tool_name`,
/// `tool_input`, `tool_response`), for `tool` editing `file` from `cwd`.
fn post_tool_use(cwd: &std::path::Path, tool: &str, file: &str) -> String {
    let file_path = cwd.join(file).display().to_string();
    let tool_input = match tool {
        "Write" => json!({"file_path": file_path, "content": "fn main() {}\n"}),
        "MultiEdit" => json!({"file_path": file_path, "edits": [
            {"old_string": "a", "new_string": "b"}
        ]}),
        _ => json!({"file_path": file_path, "old_string": "a", "new_string": "b",
            "replace_all": false}),
    };
    json!({
        "session_id": "00893aaf-19fa-41d2-8238-13269b9b3ca0",
        "transcript_path": "/tmp/transcript.jsonl",
        "cwd": cwd.display().to_string(),
        "permission_mode": "default",
        "hook_event_name": "PostToolUse",
        "tool_name": tool,
        "tool_input": tool_input,
        "tool_response": {"filePath": file_path, "success": true}
    })
    .to_string()
}

/// Runs `agent-relay hooks edited` as Claude Code runs it for agent `name` (unwrapped).
fn hook_edited(relay: &Relay, name: &str, input: &str) {
    let (out, err) = run_hook(relay, name, "edited", input.as_bytes());
    // The hook hands nothing to the model: the relay's notices do the telling.
    assert!(out.is_empty(), "{out}");
    assert!(!err.contains("not reported"), "{err}");
}

/// The relay's notices to `name` whose body contains `text`.
fn notices_to(relay: &Relay, name: &str, text: &str) -> Vec<String> {
    let out = ok_stdout(&relay.cli(&["history", "--to", name, "--from", "relay", "--json"]));
    let v: Value = serde_json::from_str(&out).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["body"].as_str())
        .filter(|b| b.contains(text))
        .map(str::to_owned)
        .collect()
}

/// Claude Code's PostToolUse hook (fed the JSON Claude Code sends) for two unwrapped agents
/// editing one file within a minute, twice each: each is told once (not once per edit); an edit
/// of a file another agent claimed tells both, once.
#[test]
fn two_agents_editing_one_file_are_told_once_each_through_the_post_tool_use_hook() {
    let relay = Relay::start();
    let cwd = relay.dir.path().to_path_buf();
    for (who, tool) in [
        ("Alice", "Edit"),
        ("Bob", "MultiEdit"),
        ("Alice", "Write"),
        ("Bob", "Edit"),
    ] {
        hook_edited(&relay, who, &post_tool_use(&cwd, tool, "src/lib.rs"));
    }
    let to_alice = notices_to(&relay, "Alice", "both edited src/lib.rs");
    let to_bob = notices_to(&relay, "Bob", "both edited src/lib.rs");
    assert_eq!(to_alice.len(), 1, "{to_alice:?}");
    assert_eq!(to_bob.len(), 1, "{to_bob:?}");
    assert!(to_alice[0].starts_with("Bob and you"), "{to_alice:?}");
    assert!(to_bob[0].starts_with("Alice and you"), "{to_bob:?}");

    // Claimed by Carol: Bob's edits of it tell both, once.
    ok_stdout(&relay.cli(&["claim", "--as", "Carol", "src/auth/"]));
    for _ in 0..2 {
        hook_edited(
            &relay,
            "Bob",
            &post_tool_use(&cwd, "Edit", "src/auth/jwt.rs"),
        );
    }
    let to_bob = notices_to(&relay, "Bob", "you edited src/auth/jwt.rs");
    let to_carol = notices_to(&relay, "Carol", "Bob edited src/auth/jwt.rs");
    assert_eq!(to_bob.len(), 1, "{to_bob:?}");
    assert_eq!(to_carol.len(), 1, "{to_carol:?}");
    // A file outside the project is nobody's claim: nothing is reported.
    hook_edited(
        &relay,
        "Bob",
        &post_tool_use(&cwd, "Edit", "../elsewhere.rs"),
    );
}

/// Wrapped agents' PostToolUse hooks report through their wrappers' doors (with the session's
/// door key): two wrapped agents editing one file are each told once, typed into each.
#[test]
fn wrapped_agents_hooks_report_edits_through_their_doors_and_each_is_told_once() {
    let relay = Relay::start();
    let tmux = relay.tmux();
    let input = post_tool_use(relay.dir.path(), "Edit", "src/main.rs");
    relay.write("edit.json", &input);
    // On "edit", runs the hook as Claude Code would, in the agent's own session.
    let editor = agent_script(
        "please-edit",
        &format!(r#"'{BIN}' hooks edited < edit.json && echo "hook ran""#),
    );
    let kim = crate::support::start_tmux_agent(&relay, "Kim", &editor, &[]);
    let lee = crate::support::start_tmux_agent(&relay, "Lee", &editor, &[]);
    for (name, session) in [("Kim", &kim), ("Lee", &lee), ("Kim", &kim), ("Lee", &lee)] {
        let before = tmux.pane(session).matches("hook ran").count();
        ok_stdout(&relay.cli(&["send", name, "please-edit"]));
        wait_for(Duration::from_secs(30), "the hook ran", || {
            tmux.pane(session).matches("hook ran").count() > before
        });
    }
    wait_for(Duration::from_secs(30), "both told", || {
        tmux.pane(&kim)
            .contains("Lee and you both edited src/main.rs")
            && tmux
                .pane(&lee)
                .contains("Kim and you both edited src/main.rs")
    });
    assert_eq!(notices_to(&relay, "Kim", "both edited").len(), 1);
    assert_eq!(notices_to(&relay, "Lee", "both edited").len(), 1);
}

/// `hooks install claude` adds the PostToolUse hook for Claude Code's edits (matcher
/// `Edit|MultiEdit|Write`); uninstall takes it out with the others (no file before, none after).
#[test]
fn hooks_install_adds_the_post_tool_use_hook_for_edits() {
    let relay = Relay::start();
    let dir = relay.dir.path().join("proj");
    std::fs::create_dir_all(&dir).unwrap();
    let hooks = |args: &[&str]| {
        ok_stdout(
            &relay
                .command()
                .current_dir(&dir)
                .arg("hooks")
                .args(args)
                .stdin(std::process::Stdio::null())
                .output()
                .unwrap(),
        )
    };
    let out = hooks(&["install", "claude"]);
    assert!(out.contains("PostToolUse"), "{out}");
    let file = dir.join(".claude/settings.local.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let groups = v["hooks"]["PostToolUse"].as_array().unwrap();
    assert_eq!(groups.len(), 1, "{v:#}");
    assert_eq!(groups[0]["matcher"], "Edit|MultiEdit|Write", "{v:#}");
    let command = groups[0]["hooks"][0]["command"].as_str().unwrap();
    assert!(command.ends_with("agent-relay' hooks edited"), "{command}");
    hooks(&["install", "claude"]);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(
        v["hooks"]["PostToolUse"].as_array().unwrap().len(),
        1,
        "twice is once"
    );
    hooks(&["uninstall", "claude"]);
    assert!(!file.exists());
}

tests_of! {
    claude_code_sessions_edit_one_file {
        /// Real Claude Code (print mode, offline against the stand-in) with the relay's hooks
        /// installed: Alice's and Bob's sessions each write the same file, twice each, one after
        /// the other; Claude Code runs the PostToolUse hook after each Write, and each of them is
        /// told once that the other edited it too (the relay's notice). (The file is removed
        /// between sessions: Claude Code's Write of an existing file wants a Read first, and the
        /// stand-in cannot tell a Read's result from a Write's.)
        real_claude_code_edits_reach_the_relay_through_its_post_tool_use_hook(false);
        /// The same with the relay's MCP server in each session (`mcp --name NAME`, holding the
        /// name): the hook reports through the server's hooks door (`mcp-door.sock`, the session's
        /// own processes only), on the server's connection.
        real_claude_code_with_the_mcp_server_reports_edits_through_its_hooks_door(true);
    }
}

/// Alice's and Bob's Claude Code sessions write one file, twice each; each is told once.
fn claude_code_sessions_edit_one_file(with_mcp: bool) {
    let relay = Relay::start();
    let work = relay.dir.path().join("work-print");
    std::fs::create_dir_all(work.join("src")).unwrap();
    let file = work.join("src/shared.rs");
    let file_path = file.display().to_string();
    let standin = relay_standin::StandIn::start(relay_standin::Script::new(vec![
        relay_standin::Rule::contains("edit the shared file", "Writing it.").calling(
            "Write",
            &json!({ "file_path": file_path, "content": "// shared, edited\n" }),
        ),
    ]))
    .unwrap();
    let out = relay
        .command()
        .current_dir(&work)
        .args(["hooks", "install", "claude"])
        .output()
        .unwrap();
    ok_stdout(&out);
    for name in ["Alice", "Bob", "Alice", "Bob"] {
        let settings = json!({"env": {"AGENT_RELAY_NAME": name}}).to_string();
        let mcp = json!({"mcpServers": {"relay": {
            "type": "stdio",
            "command": BIN,
            "args": ["mcp", "--name", name],
            "env": {
                "AGENT_RELAY_SOCKET": &relay.socket,
                "AGENT_RELAY_DATA_DIR": relay.data_dir(),
            },
        }}})
        .to_string();
        let mut args = vec!["--settings", &settings, "--allowedTools", "Write"];
        if with_mcp {
            args.extend(["--mcp-config", &mcp, "--strict-mcp-config"]);
        }
        crate::support::claude_print(&relay, &standin, &args, "edit the shared file");
        assert!(file.exists(), "Claude Code wrote no file");
        std::fs::remove_file(&file).unwrap();
    }
    let to_alice = notices_to(&relay, "Alice", "both edited src/shared.rs");
    let to_bob = notices_to(&relay, "Bob", "both edited src/shared.rs");
    assert_eq!(to_alice.len(), 1, "{to_alice:?}\n{}", relay.log());
    assert_eq!(to_bob.len(), 1, "{to_bob:?}");
    assert!(to_alice[0].starts_with("Bob and you"), "{to_alice:?}");
}

/// `agent-relay claim` run in a wrapped agent's own shell (its wrapper's environment: the name
/// and the door key) claims for that agent, through its wrapper. Before, the relay refused it
/// as a tool speaking for a connected agent.
#[test]
fn agent_relay_claim_in_a_wrapped_agents_shell_claims_for_it() {
    let relay = Relay::start();
    let tmux = relay.tmux();
    let script = agent_script(
        "shell-claim",
        &format!(r#"'{BIN}' claim notes.md 2>&1; echo "claim exit $?""#),
    );
    let max = crate::support::start_tmux_agent(&relay, "Max", &script, &[]);
    ok_stdout(&relay.cli(&["send", "Max", "shell-claim"]));
    wait_for(Duration::from_secs(30), "the claim ran", || {
        tmux.pane(&max).contains("claim exit")
    });
    let pane = tmux.pane(&max);
    assert!(pane.contains("claimed notes.md until"), "{pane}");
    assert!(pane.contains("claim exit 0"), "{pane}");
    assert_eq!(claims_listed(&relay), [("Max".into(), "notes.md".into())]);
}

/// `agent-relay parse` names a claim block's verb (it is never a message to anyone).
#[test]
fn parse_shows_a_claim_block_as_a_claim() {
    let relay = Relay::unstarted();
    let out = ok_stdout(&output_with_input(
        relay.command().arg("parse"),
        b"[[RELAY]]{\"claim\": [\"src/a.rs\", \"src/b/\"], \"for\": \"2h\"}[[/RELAY]]\n\
          [[RELAY]]{\"unclaim\": []}[[/RELAY]]\n",
    ));
    assert_eq!(out, "claim src/a.rs src/b/ for 7200 s\nunclaim (all)\n");
}
