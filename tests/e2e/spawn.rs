//! A lead spawns, watches and releases workers (issue 25.1–25.4): `agent-relay spawn` and
//! `release` with the real binary, daemon and tmux (a private tmux server per test); the
//! workers are small shell scripts.

use std::time::Duration;

use serde_json::Value;

use crate::support::*;

/// A worker: answers each relayed message to Lead (its answer answers the message typed
/// last: the wrapper threads it); on a message with "exit" in it, exits 3 after saying so.
const WORKER: &str = r#"echo "I am $AGENT_RELAY_NAME"
while IFS= read -r line; do
  case "$line" in
    *exit*) echo "giving up on it"; exit 3 ;;
    *scribble*) echo notes > notes.txt; echo "@relay:Lead scribbled in $(pwd)"; echo ;;
    *"Relay message from"*) echo "@relay:Lead finished: ${line##*: }"; echo ;;
  esac
done
"#;

/// `spawn ARGS -- sh worker.sh` (the worker script written to the relay's directory).
fn spawn(relay: &Relay, args: &[&str]) -> std::process::Output {
    let file = relay.dir.path().join("worker.sh");
    if !file.exists() {
        std::fs::write(&file, WORKER).unwrap();
    }
    let mut all = vec!["spawn"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--", "sh", file.to_str().unwrap()]);
    wrap_cmd(relay, &all).output().unwrap()
}

/// `spawn --json ARGS`, which must succeed: its document.
fn spawned(relay: &Relay, args: &[&str]) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let out = spawn(relay, &all);
    serde_json::from_str(&ok_stdout(&out)).unwrap()
}

/// `agent-relay ARGS` with the test's tmux server (`release` stops a tmux session).
fn release(relay: &Relay, args: &[&str]) -> std::process::Output {
    wrap_cmd(relay, args).output().unwrap()
}

/// Every stored message, oldest first.
fn messages(relay: &Relay) -> Vec<Value> {
    let h: Value =
        serde_json::from_slice(&relay.cli(&["history", "--json", "--limit", "1000"]).stdout)
            .unwrap_or_default();
    let mut v = h.as_array().cloned().unwrap_or_default();
    v.reverse();
    v
}

/// The stored message from `from` to `to` whose body contains `text`, once there is one.
fn message_with(relay: &Relay, from: &str, to: &str, text: &str) -> Value {
    let mut found = Value::Null;
    wait_for(
        Duration::from_secs(60),
        &format!("a message from {from} to {to} with {text:?}"),
        || {
            found = messages(relay)
                .into_iter()
                .find(|m| {
                    m["from"] == from
                        && m["to"] == to
                        && m["body"].as_str().is_some_and(|b| b.contains(text))
                })
                .unwrap_or(Value::Null);
            !found.is_null()
        },
    );
    found
}

/// Makes `name` a known agent, offline: a worker's answer to it waits in its inbox (a name
/// never seen would have the relay tell the worker so, which it would answer too).
fn known_offline(relay: &Relay, name: &str) {
    let (raw, _) = relay.agent(name);
    drop(raw);
    wait_for(Duration::from_secs(10), &format!("{name} offline"), || {
        !crate::support::is_online(relay, name)
    });
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A lead (here Lead, not connected: its messages wait in its inbox) spawns three workers with
/// tasks: each is named `Lead-wN`, recorded with Lead as its parent, gets its task as its
/// first message from Lead (never in an argv), and its answer reaches Lead in reply to the
/// task. `wait --until idle` returns for all three. The relay restarts; the records survive
/// it: a release by another agent is refused naming the parent, Lead's own release stops its
/// worker once idle, a person's releases the others (one `--now`); their messages stay
/// stored. Before, there was no `spawn` or `release` (issue 25.1, 25.3).
#[test]
fn a_lead_spawns_three_workers_gets_their_answers_threaded_and_releases_them() {
    let mut relay = Relay::start();
    let dir = relay.dir.path().to_path_buf();
    let tmux = Tmux { dir: &dir };
    known_offline(&relay, "Lead");
    let mut workers = Vec::new();
    for part in ["part one", "part two", "part three"] {
        let doc = spawned(&relay, &["--from", "Lead", "--task", part]);
        assert_eq!(doc["parent"], "Lead", "{doc}");
        assert_eq!(doc["depth"], 1, "{doc}");
        let task_id = doc["task_id"].as_str().unwrap().to_owned();
        workers.push((doc["name"].as_str().unwrap().to_owned(), task_id, part));
    }
    let names: Vec<&str> = workers.iter().map(|w| w.0.as_str()).collect();
    assert_eq!(names, ["Lead-w1", "Lead-w2", "Lead-w3"]);
    for (name, task_id, part) in &workers {
        assert!(tmux.has(&session_of(&relay, name)), "{name}'s session");
        // The task is a stored message from Lead, never on a command line.
        let task = message_with(&relay, "Lead", name, part);
        assert_eq!(task["id"], task_id.as_str(), "{task}");
        let answer = message_with(&relay, name, "Lead", &format!("finished: {part}"));
        assert_eq!(answer["in_reply_to"], task_id.as_str(), "{answer}");
    }
    let ps = std::process::Command::new("ps")
        .args(["-eo", "args"])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&ps.stdout).contains("part two"),
        "a task in an argv"
    );
    let mut wait = vec!["wait"];
    wait.extend_from_slice(&names);
    wait.extend_from_slice(&["--until", "idle", "--timeout", "60"]);
    let out = relay.cli(&wait);
    assert_eq!(out.status.code(), Some(0), "{out:?}");

    // The parent records are in the store: they outlive a restart of the relay.
    relay.stop();
    relay.spawn();
    for name in &names {
        crate::support::wait_online(&relay, name);
    }
    let out = release(&relay, &["release", "Lead-w1", "--from", "Other"]);
    assert_eq!(out.status.code(), Some(5), "{out:?}");
    assert!(
        stderr(&out).contains("was spawned by Lead"),
        "{}",
        stderr(&out)
    );
    assert!(tmux.has(&session_of(&relay, "Lead-w1")));

    let out = release(&relay, &["release", "Lead-w1", "--from", "Lead"]);
    assert!(out.status.success(), "{out:?}");
    assert!(ok_stdout(&out).starts_with("released Lead-w1"), "{out:?}");
    let out = release(&relay, &["release", "Lead-w2", "--json"]);
    let doc: Value = serde_json::from_str(&ok_stdout(&out)).unwrap();
    assert_eq!(doc["waited_for"], "idle", "{doc}");
    let out = release(&relay, &["release", "Lead-w3", "--now"]);
    assert!(out.status.success(), "{out:?}");
    for name in &names {
        assert!(!tmux.has(&session_of(&relay, name)), "{name} still runs");
    }
    // Released, not exited on its own: Lead is told nothing; the messages stay.
    let all = messages(&relay);
    assert!(
        !all.iter()
            .any(|m| m["from"] == "relay" && m["to"] == "Lead"),
        "{all:?}"
    );
    assert_eq!(
        all.iter()
            .filter(|m| m["to"] == "Lead" && m["in_reply_to"].is_string())
            .count(),
        3
    );
    // Released twice: said.
    let out = release(&relay, &["release", "Lead-w1"]);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
}

/// The caps and the rule: with `--max-spawned 2` a third live worker is refused naming the
/// limit (exit 5), and once one is released a new one may start; `rules add --from
/// 'worker-*' --action deny-spawn` refuses worker-1's spawn naming the rule; a message rule is
/// not one (worker-1 still sends). When a worker exits on its own its parent is told, with
/// the exit status and its last lines, and the cap counts it no more. Before: no caps, no
/// rule, no notice (issue 25.2, 25.3).
#[test]
fn caps_and_deny_spawn_refuse_naming_the_limit_and_an_exit_is_told_to_the_parent() {
    let relay = Relay::start_with(&["--max-spawned", "2"]);
    let dir = relay.dir.path().to_path_buf();
    let _tmux = Tmux { dir: &dir };
    known_offline(&relay, "Lead");
    let a = spawned(&relay, &["--from", "Lead", "-n", "Ann"]);
    assert_eq!(a["name"], "Ann");
    spawned(&relay, &["--from", "Lead", "-n", "Ben"]);
    let out = spawn(&relay, &["--from", "Lead", "-n", "Cy"]);
    assert_eq!(out.status.code(), Some(5), "{out:?}");
    assert!(
        stderr(&out).contains("limit of live spawned agents is 2 (max_spawned)"),
        "{}",
        stderr(&out)
    );
    // A name taken by a live worker.
    let out = spawn(&relay, &["--from", "Lead", "-n", "Ann"]);
    assert_ne!(out.status.code(), Some(0), "{out:?}");

    // Ben exits on its own: Lead is told, with its status and last lines.
    relay.cli(&["send", "Ben", "exit now"]);
    let told = message_with(&relay, "relay", "Lead", "Ben exited on its own");
    let body = told["body"].as_str().unwrap();
    assert!(body.contains("status 3"), "{body}");
    assert!(body.contains("giving up on it"), "{body}");
    // Its place is free again.
    spawned(&relay, &["--from", "Lead", "-n", "Cy"]);

    let out = relay.cli(&[
        "rules",
        "add",
        "--from",
        "worker-*",
        "--action",
        "deny-spawn",
    ]);
    assert!(out.status.success(), "{out:?}");
    release(&relay, &["release", "Cy", "--now"]);
    wait_for(Duration::from_secs(10), "the rule in force", || {
        let status: Value =
            serde_json::from_str(&ok_stdout(&relay.cli(&["status", "--json"]))).unwrap();
        status["rules"] == 1
    });
    let out = spawn(&relay, &["--from", "worker-1", "-n", "Dee"]);
    assert_eq!(out.status.code(), Some(5), "{out:?}");
    assert!(
        stderr(&out).contains("forbids worker-1 to spawn (deny-spawn from worker-* to *"),
        "{}",
        stderr(&out)
    );
    // Not a message rule.
    let out = relay.cli(&["send", "Ann", "hello", "--from", "worker-1"]);
    assert!(out.status.success(), "{out:?}");
    // Lead is not concerned by it.
    spawned(&relay, &["--from", "Lead", "-n", "Dee"]);
}

/// `--worktree`: each worker runs in its own git worktree `.agent-relay/worktrees/NAME` on
/// branch `relay/NAME`; on release a clean one is removed (the branch stays), a dirty one is
/// kept and named. `--notify idle`: the lead is told each time the worker is idle after a
/// turn, once per turn. Before: no worktrees, no notice (issue 25.3, 25.5).
#[test]
fn worktrees_are_made_and_removed_when_clean_and_notify_idle_tells_once_per_turn() {
    let relay = Relay::start();
    let dir = relay.dir.path().to_path_buf();
    let _tmux = Tmux { dir: &dir };
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .args(["-c", "user.email=t@example.com", "-c", "user.name=t"])
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    git(&["init", "-q"]);
    std::fs::write(
        dir.join(".gitignore"),
        "*\n!.gitignore\n!README\n!notes.txt\n",
    )
    .unwrap();
    std::fs::write(dir.join("README"), "project\n").unwrap();
    git(&["add", ".gitignore", "README"]);
    git(&["commit", "-qm", "start"]);
    known_offline(&relay, "Lead");

    let clean = spawned(
        &relay,
        &[
            "--from",
            "Lead",
            "--worktree",
            "--notify",
            "idle",
            "--task",
            "look",
        ],
    );
    let dirty = spawned(
        &relay,
        &["--from", "Lead", "--worktree", "--task", "scribble"],
    );
    let (c, d) = (
        clean["name"].as_str().unwrap().to_owned(),
        dirty["name"].as_str().unwrap().to_owned(),
    );
    let c_dir = dir.join(".agent-relay/worktrees").join(&c);
    let d_dir = dir.join(".agent-relay/worktrees").join(&d);
    assert_eq!(clean["worktree"], c_dir.to_str().unwrap(), "{clean}");
    assert!(c_dir.join("README").exists());
    let branches = git(&["branch", "--list", "relay/*"]);
    assert!(branches.contains(&format!("relay/{c}")), "{branches}");
    // The worker runs in its worktree.
    message_with(
        &relay,
        &d,
        "Lead",
        &format!("scribbled in {}", d_dir.display()),
    );

    // Idle after its turn: told once; a second turn, told again.
    message_with(
        &relay,
        "relay",
        "Lead",
        &format!("{c} is idle after a turn"),
    );
    relay.cli(&["send", c.as_str(), "look again"]);
    message_with(&relay, c.as_str(), "Lead", "finished: look again");
    let idle_notices = |relay: &Relay| {
        messages(relay)
            .iter()
            .filter(|m| {
                m["from"] == "relay"
                    && m["body"]
                        .as_str()
                        .is_some_and(|b| b.contains(&format!("{c} is idle after a turn")))
            })
            .count()
    };
    wait_for(Duration::from_secs(60), "a second idle notice", || {
        idle_notices(&relay) >= 2
    });
    let out = relay.cli(&["wait", c.as_str(), "--until", "idle", "--timeout", "60"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(idle_notices(&relay), 2);
    // The other was spawned without --notify: nothing about it.
    assert!(
        !messages(&relay)
            .iter()
            .any(|m| m["from"] == "relay" && m["body"].as_str().is_some_and(|b| b.contains(&d))),
    );

    let out = release(&relay, &["release", c.as_str(), "--json"]);
    let doc: Value = serde_json::from_str(&ok_stdout(&out)).unwrap();
    assert_eq!(doc["worktree"]["removed"], true, "{doc}");
    assert!(!c_dir.exists());
    assert!(git(&["branch", "--list", "relay/*"]).contains(&format!("relay/{c}")));
    let out = release(&relay, &["release", d.as_str()]);
    let text = ok_stdout(&out);
    assert!(
        text.contains(&format!(
            "worktree {} was kept (it has uncommitted changes)",
            d_dir.display()
        )),
        "{text}"
    );
    assert!(d_dir.join("notes.txt").exists());
}

/// A worker that, on "delegate", spawns a worker of its own from its shell (`agent-relay
/// spawn` with no `--from`: asked through its wrapper, as itself) and tells Lead what came of
/// it.
fn delegate() -> String {
    script_agent(
        I_AM,
        false,
        r#"    *delegate*)
      if out=$("$BIN" spawn --task "delegate further" -- sh "$SCRIPT" 2>"err-$AGENT_RELAY_NAME"); then
        echo "@relay:Lead $AGENT_RELAY_NAME spawned $out"
      else
        echo "@relay:Lead $AGENT_RELAY_NAME could not: $(tail -n 1 "err-$AGENT_RELAY_NAME")"
      fi
      echo ;;"#,
    )
}

/// A worker spawns from its own shell, through its wrapper, as itself: its worker is at depth
/// 2 with it as the parent (Lead may not release it); that worker's own spawn would be at
/// depth 3 and is refused naming the limit. Before, a wrapped agent had no way to spawn as
/// itself (a tool connection may not speak as a connected agent), and no depth limit (issue
/// 25.2, 25.4).
#[test]
fn a_worker_spawns_as_itself_through_its_wrapper_and_depth_three_is_refused() {
    let relay = Relay::start();
    let dir = relay.dir.path().to_path_buf();
    let _tmux = Tmux { dir: &dir };
    known_offline(&relay, "Lead");
    let script = dir.join("delegate.sh");
    std::fs::write(
        &script,
        delegate()
            .replace("$BIN", crate::support::BIN)
            .replace("$SCRIPT", script.to_str().unwrap()),
    )
    .unwrap();
    let out = wrap_cmd(
        &relay,
        &[
            "spawn",
            "--from",
            "Lead",
            "--task",
            "delegate",
            "--json",
            "--",
            "sh",
            script.to_str().unwrap(),
        ],
    )
    .output()
    .unwrap();
    let doc: Value = serde_json::from_str(&ok_stdout(&out)).unwrap();
    assert_eq!(doc["name"], "Lead-w1");
    message_with(&relay, "Lead-w1", "Lead", "Lead-w1 spawned Lead-w1-w1");
    let refused = message_with(&relay, "Lead-w1-w1", "Lead", "Lead-w1-w1 could not");
    let body = refused["body"].as_str().unwrap();
    assert!(
        body.contains("the spawn depth limit is 2 (max_spawn_depth)"),
        "{body}"
    );
    // Lead-w1-w1's parent is Lead-w1: Lead did not spawn it.
    let out = release(&relay, &["release", "Lead-w1-w1", "--from", "Lead"]);
    assert_eq!(out.status.code(), Some(5), "{out:?}");
    assert!(
        stderr(&out).contains("spawned by Lead-w1"),
        "{}",
        stderr(&out)
    );
}

/// From an agent's MCP server (`relay_spawn`, `relay_release`), under its wrapper: a wrapped
/// Lead spawns a worker with a task (its answer reaches Lead in reply to it) and releases it;
/// it may not release a worker the person spawned; an MCP server without a wrapper says what to
/// do. Before, there were no such tools (issue 25.4).
#[test]
fn a_wrapped_lead_spawns_and_releases_through_its_mcp_server() {
    let relay = Relay::start();
    let dir = relay.dir.path().to_path_buf();
    let tmux = Tmux { dir: &dir };
    std::fs::write(dir.join("worker.sh"), WORKER).unwrap();
    let pipes = crate::support::SessionPipes::new(&relay, "Lead");
    pipes.wrap_in_tmux(&relay, "Lead");
    let mut mcp = pipes.connect();
    crate::support::wait_online(&relay, "Lead");

    let worker = dir.join("worker.sh");
    let (err, said) = mcp.tool(
        "relay_spawn",
        serde_json::json!({"command": ["sh", worker.to_str().unwrap()], "task": "part one"}),
    );
    assert!(!err, "{said}");
    assert!(said.starts_with("Spawned Lead-w1"), "{said}");
    assert!(tmux.has(&session_of(&relay, "Lead-w1")));
    let task = message_with(&relay, "Lead", "Lead-w1", "part one");
    let answer = message_with(&relay, "Lead-w1", "Lead", "finished: part one");
    assert_eq!(answer["in_reply_to"], task["id"], "{answer}");

    // A worker the person spawned is not Lead's to release.
    spawned(&relay, &["-n", "Solo"]);
    let (err, said) = mcp.tool("relay_release", serde_json::json!({"name": "Solo"}));
    assert!(err, "{said}");
    assert!(said.contains("was spawned by human"), "{said}");
    let (err, said) = mcp.tool("relay_release", serde_json::json!({"name": "Lead-w1"}));
    assert!(!err, "{said}");
    assert!(said.starts_with("released Lead-w1"), "{said}");
    assert!(!tmux.has(&session_of(&relay, "Lead-w1")));

    // Without a wrapper: said what to do.
    let mut bare = crate::support::Mcp::start(&relay, "Bare");
    let (err, said) = bare.tool(
        "relay_spawn",
        serde_json::json!({"command": ["sh", worker.to_str().unwrap()]}),
    );
    assert!(
        err && said.contains("not running under agent-relay's wrapper")
            && said.contains("only a wrapped agent spawns and releases through this tool"),
        "{said}"
    );
}

/// A lead that uses the directive form: on "kickoff" it prints a spawn block, on its worker's
/// answer a release block, on "twin" a spawn block under its own (taken) name.
fn lead() -> String {
    script_agent(
        I_AM,
        false,
        r#"    *kickoff*) echo '[[RELAY]]{"spawn": {"command": ["sh", "WORKER"], "task": "part one"}}[[/RELAY]]' ;;
    *"finished: part one"*) echo '[[RELAY]]{"release": "Lead-w1"}[[/RELAY]]' ;;
    *twin*) echo '[[RELAY]]{"spawn": {"command": ["sh", "WORKER"], "name": "Lead"}}[[/RELAY]]' ;;"#,
    )
}

/// The directive form (docs/PARSING.md): a wrapped lead prints `[[RELAY]]{"spawn": ...}` and
/// its worker starts with the task from it (the answer threads back), the lead is told
/// "relay: spawned Lead-w1"; its `{"release": ...}` block stops the worker; a refused spawn is
/// told too, naming why. Nothing of it is a message to an agent named "spawn". Before, such a
/// block was refused as a directive without "to" (issue 25.4).
#[test]
fn a_lead_spawns_and_releases_with_relay_blocks_and_is_told_how_it_went() {
    let relay = Relay::start();
    let dir = relay.dir.path().to_path_buf();
    let tmux = Tmux { dir: &dir };
    let worker = dir.join("worker.sh");
    std::fs::write(&worker, WORKER).unwrap();
    let lead = crate::support::start_tmux_agent(
        &relay,
        "Lead",
        &lead().replace("WORKER", worker.to_str().unwrap()),
        &[],
    );
    crate::support::wait_online(&relay, "Lead");
    relay.cli(&["send", "Lead", "kickoff"]);
    let task = message_with(&relay, "Lead", "Lead-w1", "part one");
    let answer = message_with(&relay, "Lead-w1", "Lead", "finished: part one");
    assert_eq!(answer["in_reply_to"], task["id"], "{answer}");
    wait_for(Duration::from_secs(60), "Lead told of its worker", || {
        tmux.pane(&lead).contains("relay: spawned Lead-w1")
    });
    wait_for(Duration::from_secs(60), "Lead-w1 released", || {
        tmux.pane(&lead).contains("relay: released Lead-w1")
    });
    assert!(!tmux.has(&session_of(&relay, "Lead-w1")));
    relay.cli(&["send", "Lead", "twin"]);
    wait_for(Duration::from_secs(60), "Lead told of the refusal", || {
        tmux.pane(&lead)
            .contains("relay: not spawned: Lead is a connected agent")
    });
    assert!(
        !messages(&relay)
            .iter()
            .any(|m| m["to"] == "spawn" || m["to"] == "release"),
        "a verb sent as a message"
    );
}

/// The real Claude Code as the lead, offline (the stand-in API scripts its model), under the
/// relay's wrapper with the relay's MCP server: asked to split the work, the model calls
/// `relay_spawn` three times (each tool result naming the worker it started); each worker (a
/// script) gets its task from Lead and answers, the answer reaches Claude Code in reply to its
/// task, and the model calls `relay_release` for that worker, which stops it. Before, there
/// was no such tool (issue 25, Done means: a lead that is real Claude Code).
#[test]
fn claude_code_spawns_three_workers_through_mcp_and_releases_each_after_its_answer() {
    use relay_standin::{Rule, Script};
    let relay = Relay::start();
    let dir = relay.dir.path().to_path_buf();
    let _tmux = Tmux { dir: &dir };
    // Each worker answers once its own file `gate-NAME` exists: after Lead's turn that spawned
    // it is over, and one at a time (a message typed into Claude Code while its tool runs is
    // merged into the tool's result, which is another test's matter).
    let worker = dir.join("gated.sh");
    std::fs::write(
        &worker,
        format!(
            r#"echo "I am $AGENT_RELAY_NAME"
while IFS= read -r line; do
  case "$line" in
    *"Relay message from"*)
      while [ ! -e "{dir}/gate-$AGENT_RELAY_NAME" ]; do sleep 0.1; done
      echo "@relay:Lead finished: ${{line##*: }}"; echo ;;
  esac
done
"#,
            dir = dir.display()
        ),
    )
    .unwrap();
    let config = dir.join("mcp-Lead.json");
    let mcp = serde_json::json!({"mcpServers": {"relay": {
        "type": "stdio", "command": crate::support::BIN, "args": ["mcp"],
        // Its workers' tmux sessions on the test's own tmux server, not on the server of the
        // terminal Claude Code runs in (whose screen the test reads).
        "env": {"AGENT_RELAY_SOCKET": &relay.socket, "AGENT_RELAY_DATA_DIR": relay.data_dir(),
                "TMUX": "", "TMUX_TMPDIR": &dir},
    }}});
    std::fs::write(&config, mcp.to_string()).unwrap();
    let cli_args = format!(
        "--mcp-config '{}' --strict-mcp-config --allowedTools mcp__relay__relay_spawn,mcp__relay__relay_release",
        config.display()
    );
    let spawn = |part: &str| serde_json::json!({"command": ["sh", worker.to_str().unwrap()], "task": format!("part {part}")});
    let release = |n: u32| serde_json::json!({"name": format!("Lead-w{n}"), "now": true});
    // Rules match the latest user message: the person's prompt, a worker's answer typed in, or
    // (after_tool_result) what a tool answered.
    let lead = crate::support::Agent::start_with(
        &relay,
        crate::support::Cli::Claude,
        "Lead",
        Script::new(vec![
            Rule::contains("split the work", "Starting the first worker.")
                .calling("mcp__relay__relay_spawn", &spawn("one")),
            Rule::after_tool_result("Spawned Lead-w1", "Starting the second worker.")
                .calling("mcp__relay__relay_spawn", &spawn("two")),
            Rule::after_tool_result("Spawned Lead-w2", "Starting the third worker.")
                .calling("mcp__relay__relay_spawn", &spawn("three")),
            Rule::after_tool_result("Spawned Lead-w3", "Three workers started."),
            Rule::contains("finished: part one", "Releasing the first.")
                .calling("mcp__relay__relay_release", &release(1)),
            Rule::contains("finished: part two", "Releasing the second.")
                .calling("mcp__relay__relay_release", &release(2)),
            Rule::contains("finished: part three", "Releasing the third.")
                .calling("mcp__relay__relay_release", &release(3)),
        ]),
        ("", &cli_args),
    );
    lead.wait_ready();
    relay.cli(&["send", "Lead", "split the work"]);
    let tasks: Vec<Value> = ["one", "two", "three"]
        .iter()
        .enumerate()
        .map(|(i, part)| {
            message_with(
                &relay,
                "Lead",
                &format!("Lead-w{}", i + 1),
                &format!("part {part}"),
            )
        })
        .collect();
    lead.wait_all_relayed("Three workers started.");
    for (i, part) in ["one", "two", "three"].iter().enumerate() {
        let name = format!("Lead-w{}", i + 1);
        std::fs::write(dir.join(format!("gate-{name}")), "").unwrap();
        let answer = message_with(&relay, &name, "Lead", &format!("finished: part {part}"));
        assert_eq!(answer["in_reply_to"], tasks[i]["id"], "{answer}");
        // The model was given the worker's answer and released it.
        wait_for(
            Duration::from_secs(120),
            &format!("{name} released"),
            || {
                lead.standin().requests().iter().any(|r| {
                    r.body["messages"]
                        .to_string()
                        .contains(&format!("released {name}"))
                })
            },
        );
        wait_for(Duration::from_secs(30), &format!("{name} offline"), || {
            !crate::support::is_online(&relay, &name)
        });
    }
}
