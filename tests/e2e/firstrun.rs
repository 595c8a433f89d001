//! The first ten minutes (issue 24's set-up points): `--detached` returns once the agent is
//! connected, a start that fails is shown with its status and last lines, and a typo that
//! runs a command is not kept as an agent nor announced to later agents.

use std::time::Duration;

use serde_json::Value;

use crate::support::*;

/// A CLI that refuses its flag at start, as `claude --bogus-flag` does.
const BOGUS: &str = r#"echo "error: unknown option '--bogus-flag'" >&2
echo "(Did you mean --bogus?)" >&2
exit 1
"#;

/// Every agent the relay lists, as (name, online).
fn agents(relay: &Relay) -> Vec<(String, bool)> {
    let v: Value =
        serde_json::from_slice(&relay.cli(&["agents", "--json"]).stdout).unwrap_or_default();
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|x| {
                    (
                        x["name"].as_str().unwrap_or("").to_owned(),
                        x["online"] == true,
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `name` is online, asked over `probe`, a connection already open (a fresh CLI
/// process would give a relaying process that connects late the time to do so).
fn online_now(probe: &mut crate::support::Raw, name: &str) -> bool {
    probe.send_env(
        "QUERY",
        serde_json::json!({}),
        serde_json::json!({"what": "agents"}),
    );
    let result = probe.expect("RESULT");
    result["payload"]["agents"]
        .as_array()
        .is_some_and(|a| a.iter().any(|x| x["name"] == name && x["online"] == true))
}

/// `agent-relay -n NAME --detached -- sh FILE` under tmux returns only once the agent is
/// connected: asked at once over a connection already open, the relay lists it online, and a
/// `send` right after is delivered. Before, `--detached` returned as soon as the relaying
/// process was started, and the name was unknown for a moment (issue 24.4: a `send` right
/// after was refused in 4 of 6 runs). Three agents, each checked at once.
#[test]
fn detached_returns_once_the_agent_is_connected() {
    let relay = Relay::start();
    let _tmux = relay.tmux();
    let (mut probe, _) = relay.agent("Probe");
    relay.write("gus.sh", ECHOER);
    for name in ["Gus", "Gus2", "Gus3"] {
        let out = wrap_cmd(
            &relay,
            &[
                "--backend",
                "tmux",
                "-n",
                name,
                "--detached",
                "--",
                "sh",
                "gus.sh",
            ],
        )
        .output()
        .unwrap();
        let online = online_now(&mut probe, name);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        assert!(
            online,
            "{name} is not online right after --detached returned: {err}"
        );
        assert!(err.contains("is connected"), "{err}");
        let sent = relay.cli(&["send", name, "hi"]);
        assert!(
            sent.status.success(),
            "{}",
            String::from_utf8_lossy(&sent.stderr)
        );
    }
}

/// A CLI that fails at start (a bad flag) under tmux with `--detached`: the command says it
/// exited, with its status and its last lines, and exits with the agent's status; the
/// relaying process's log has the lines too. Before, it said "Zoe runs detached" and exited
/// 0 (issue 24.5).
#[test]
fn a_detached_agent_that_fails_at_start_is_shown_with_its_status_and_last_lines() {
    let relay = Relay::start();
    let _tmux = relay.tmux();
    relay.write("zoe.sh", BOGUS);
    let out = wrap_cmd(
        &relay,
        &[
            "--backend",
            "tmux",
            "-n",
            "Zoe",
            "--detached",
            "--",
            "sh",
            "zoe.sh",
        ],
    )
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("Zoe exited with status 1"), "{err}");
    assert!(err.contains("unknown option '--bogus-flag'"), "{err}");
    assert!(!err.contains("runs detached"), "{err}");
    let log = std::fs::read_to_string(relay.data_dir().join("team/Zoe/wrap.log")).unwrap();
    assert!(log.contains("unknown option '--bogus-flag'"), "{log}");
}

/// The same under the PTY backend: the agent's output is on the person's terminal, and its
/// status is said (and is the command's), never an empty `agent-relay:` line nor the
/// relay-not-running hint an exit status of 3 used to bring (issue 24.5 and 24.12).
#[test]
fn a_pty_agent_that_fails_says_its_status_and_status_3_is_not_the_relay_not_running() {
    let relay = Relay::start();
    relay.write("zoe.sh", BOGUS);
    relay.write("three.sh", "echo bye\nexit 3\n");
    // `sh SCRIPT` wrapped as `name`: its exit code and what the wrapper said.
    let run = |name: &str, script: &str| {
        let out = relay.cli(&wrap_args(name, &["--no-input"], &["sh", script]));
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run("Zoe", "zoe.sh");
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("agent-relay: Zoe exited with status 1"),
        "{err}"
    );
    let (code, err) = run("Tri", "three.sh");
    assert_eq!(code, Some(3), "{err}");
    assert!(
        err.contains("agent-relay: Tri exited with status 3"),
        "{err}"
    );
    assert!(!err.contains("project root"), "{err}");
    assert!(
        !err.lines().any(|l| l.trim() == "agent-relay:"),
        "an empty error line: {err}"
    );
}

/// `agent-relay ls` (a typo of a subcommand that is also a program) runs `ls` with a
/// generated name; it exits at once, took part in nothing and is no agent CLI: it is not kept
/// in `agents` (PTY), and `stat` under tmux with `--detached` is reported as exited and not
/// kept either. Before, both stayed listed (issue 24.6).
#[test]
fn a_command_that_exits_at_once_is_not_kept_as_an_agent() {
    let relay = Relay::start();
    let _tmux = relay.tmux();
    let out = relay.cli(&["ls"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("this agent is"), "{err}");
    assert_eq!(agents(&relay), Vec::new(), "{err}");
    let out = wrap_cmd(&relay, &["--backend", "tmux", "--detached", "stat"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("exited"), "{err}");
    assert_eq!(agents(&relay), Vec::new(), "{err}");
}

/// The agents announced to a new agent are those online: one that took part and stopped
/// stays in `agents` (offline) but is not named to the next agent as someone on the relay
/// (issue 24.6). The new agent is a stand-in `claude` that keeps its arguments.
#[test]
fn the_announcement_names_only_agents_that_are_online() {
    let relay = Relay::start();
    let dir = relay.dir.path();
    std::fs::write(dir.join("stays.sh"), ECHOER).unwrap();
    let stays = spawn_wrapped(
        &relay,
        &["wrap", "--no-input", "-n", "Stays", "--", "sh", "stays.sh"],
    );
    wait_for(Duration::from_secs(20), "Stays is online", || {
        is_online(&relay, "Stays")
    });
    // Took part (sent a message), then stopped: kept, offline.
    let (code, out) = output_of(spawn_wrapped(
        &relay,
        &wrap_args(
            "Gone",
            &["--no-input"],
            &["sh", "-c", "echo '@relay:Stays hello'"],
        ),
    ));
    assert_eq!(code, 0, "{out}");
    assert!(
        agents(&relay).contains(&("Gone".to_owned(), false)),
        "{:?}",
        agents(&relay)
    );
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let claude = bin.join("claude");
    std::fs::write(
        &claude,
        format!(
            "#!/bin/sh\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done > '{}'\n",
            dir.join("args.txt").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&claude, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = relay
        .command()
        .args(["wrap", "--no-input", "-n", "New", "--"])
        .arg(&claude)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let args = std::fs::read_to_string(dir.join("args.txt")).unwrap_or_default();
    assert!(
        args.contains("Other agents on the relay when you started: Stays."),
        "{err}\n{args}"
    );
    assert!(!args.contains("Gone"), "{args}");
    let mut stays = stays;
    let _ = stays.kill();
    let _ = stays.wait();
}

/// README's first command (issue 24.9): it stays "run the relay", but for the person's own
/// project, not for the clone (where `up` served agent-relay's own source tree and held port
/// 3888). Run as written, with this binary for the installed one, in a copy of the clone's
/// README folder and a project elsewhere: the relay it starts serves that project.
#[test]
fn readme_first_command_starts_the_relay_for_your_project_not_the_clone() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let block = readme
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .unwrap();
    let mut lines = block.lines();
    let first = lines.next().unwrap();
    let command = first.split("  #").next().unwrap().trim();
    assert!(
        lines.next().is_some_and(|l| l.starts_with("scripts/test")),
        "{block}"
    );
    let install = "cargo install --locked --path . && ";
    let rest = command
        .strip_prefix(install)
        .unwrap_or_else(|| panic!("the first command does not install agent-relay: {command}"));
    // `cargo install --path .` installs this package's binary.
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    assert!(
        manifest.contains("[[bin]]\nname = \"agent-relay\""),
        "the root package's binary is not agent-relay"
    );
    let tmp = tempfile::Builder::new().prefix("ar").tempdir().unwrap();
    let home = tmp.path().join("home");
    let project = home.join("your-project");
    let clone = tmp.path().join("agent-relay");
    for d in [&project, &clone] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::create_dir_all(project.join(".git")).unwrap();
    std::fs::create_dir_all(clone.join(".git")).unwrap();
    let bin = tmp.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(crate::support::BIN, bin.join("agent-relay")).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let env = |c: &mut Command| {
        c.env("HOME", &home)
            .env("PATH", &path)
            .env("XDG_RUNTIME_DIR", tmp.path().join("run"))
            .env("AGENT_RELAY_DASHBOARD_PORT", "0")
            .env_remove("XDG_DATA_HOME")
            .env_remove("AGENT_RELAY_DATA_DIR")
            .env_remove("AGENT_RELAY_SOCKET")
            .env_remove("AGENT_RELAY_STORAGE_PATH");
    };
    use std::process::Command;
    let mut run = Command::new("sh");
    run.args(["-c", rest]).current_dir(&clone);
    env(&mut run);
    let out = run.output().unwrap();
    assert!(
        out.status.success(),
        "{rest}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = |dir: &std::path::Path| {
        let mut c = Command::new(crate::support::BIN);
        c.args(["status", "--json"]).current_dir(dir);
        env(&mut c);
        c.output().unwrap()
    };
    let v: Value = serde_json::from_slice(&status(&project).stdout).unwrap();
    assert_eq!(v["running"], true, "{v:#}");
    assert_eq!(
        v["project_root"].as_str(),
        Some(project.to_str().unwrap()),
        "{v:#}"
    );
    assert_eq!(
        status(&clone).status.code(),
        Some(3),
        "a relay runs for the clone"
    );
    let mut down = Command::new(crate::support::BIN);
    down.arg("down").current_dir(&project);
    env(&mut down);
    assert!(down.output().unwrap().status.success());
}

/// `doctor` with no Claude Code, Codex or Gemini CLI installed: each is "missing" (not "ok"),
/// with the install of the version its profile was tested with, pinned (issue 24.12: it said
/// `ok claude not installed` and suggested an unpinned install).
#[test]
fn doctor_says_a_missing_agent_cli_is_missing_with_the_pinned_install() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let run = |json: bool| {
        let mut c = std::process::Command::new(crate::support::BIN);
        c.arg("doctor")
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("AGENT_RELAY_DATA_DIR", &data)
            .env("AGENT_RELAY_SOCKET", tmp.path().join("r.sock"))
            .env_remove("AGENT_RELAY_CLAUDE")
            .env_remove("AGENT_RELAY_CODEX")
            .env_remove("AGENT_RELAY_GEMINI");
        if json {
            c.arg("--json");
        }
        c.output().unwrap()
    };
    let out = run(true);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let claude = find_row(&v, "check", "claude");
    assert_eq!(claude["level"], "missing", "{claude}");
    let fix = claude["fix"].as_str().unwrap_or("");
    assert!(
        fix.starts_with("npm install -g @anthropic-ai/claude-code@2."),
        "{fix}"
    );
    let text = String::from_utf8_lossy(&run(false).stdout).into_owned();
    let line = text
        .lines()
        .find(|l| l.contains(" claude "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.starts_with("missing"), "{text}");
    assert!(!text.contains("ok      claude"), "{text}");
}

/// `attach alice` when the agent is Alice: "did you mean `agent-relay attach Alice`?" (exit 4),
/// not only "no tmux session" (issue 24.12).
#[test]
fn attach_with_the_wrong_case_suggests_the_agent() {
    let relay = Relay::start();
    let _tmux = relay.tmux();
    crate::support::start_tmux_agent(&relay, "Alice", ECHOER, &[]);
    let out = wrap_cmd(&relay, &["attach", "alice"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        err.contains("did you mean `agent-relay attach Alice`?"),
        "{err}"
    );
}

/// `down --all` with a people adapter configured: the relay's own connection for the person
/// ends with the relay, and is not warned about as "not run by a wrapper" (issue 24.12).
#[test]
fn down_all_does_not_warn_about_the_relays_own_person_connection() {
    let hook = relay_standin::people::WebhookStandIn::start().unwrap();
    let mut relay = Relay::unstarted();
    let secret = relay.dir.path().join("hook.secret");
    std::fs::write(&secret, "webhook-shared-secret").unwrap();
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let config = relay.dir.path().join(".agent-relay");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("config.toml"),
        format!(
            "[people.ops]\nwebhook = true\n\n[adapters.webhook]\nurl = \"{}\"\nsecret_file = \"hook.secret\"\n",
            hook.url()
        ),
    )
    .unwrap();
    relay.spawn();
    wait_for(Duration::from_secs(20), "ops is connected", || {
        is_online(&relay, "ops")
    });
    let out = relay.cli(&["down", "--all"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("ops is still connected"), "{err}");
    if let Some(mut c) = relay.child.take() {
        c.wait().unwrap();
    }
}

/// `attach` from inside one's own tmux switches that client to the agent's session, where
/// Ctrl-b d would detach the person's whole client: it says Ctrl-b L (back to their own
/// session) instead, and `attach --help` says so (issue 24.12).
#[test]
fn attach_inside_tmux_says_how_to_go_back_without_detaching() {
    let relay = Relay::start();
    let tmux = relay.tmux();
    crate::support::start_tmux_agent(&relay, "Alice", ECHOER, &[]);
    // Inside tmux: TMUX names the server (here the test's, with no client to switch).
    let socket = String::from_utf8_lossy(&tmux.run(&["display", "-p", "#{socket_path}"]).stdout)
        .trim()
        .to_owned();
    let out = wrap_cmd(&relay, &["attach", "Alice"])
        .env("TMUX", format!("{socket},1,0"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("back to your own with Ctrl-b L"), "{err}");
    let help = String::from_utf8_lossy(&relay.cli(&["attach", "--help"]).stdout).into_owned();
    assert!(help.contains("Ctrl-b L"), "{help}");
}

/// A person attached to an agent's tmux session when `agent-relay stop` ends it: tmux shows
/// them `[exited]`, and the command they attached with says who stopped the agent (issue
/// 24.12: only `[exited]`).
#[test]
fn a_person_attached_to_a_stopped_agent_is_told_who_stopped_it() {
    let relay = Relay::start();
    let _tmux = relay.tmux();
    crate::support::start_tmux_agent(&relay, "Alice", ECHOER, &[]);
    // The person's terminal (a tmux pane of its own server) attaches to Alice's session.
    let term = person_terminal_here(
        &relay,
        "person",
        "{bin} attach Alice; echo \"attach ended: $?\"",
    );
    term.wait_shows(Duration::from_secs(20), "I am Alice");
    let out = wrap_cmd(&relay, &["stop", "Alice"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let s = term.wait_shows(Duration::from_secs(20), "attach ended:");
    assert!(
        s.contains("Alice was stopped by `agent-relay stop Alice`"),
        "{s}"
    );
}

/// `.agent-relay/config.toml` takes `[up]` keys with underscores and `[profiles]` keys with
/// dashes as well as the documented spelling (issue 24.12: `[up]` used dashes, `[profiles]`
/// underscores, and the other spelling was refused).
#[test]
fn config_keys_may_use_dashes_or_underscores() {
    let relay = Relay::unstarted();
    configure(
        &relay,
        "[up]\ninbox_ttl = 600\nmax-hops = 4\n\n[profiles.generic]\nquiet-ms = 50\nsettle_ms = 300\n",
    );
    let out = relay.cli(&["config", "--json"]);
    let s: Value = serde_json::from_str(&crate::support::ok_stdout(&out)).unwrap();
    assert_eq!(s["up"]["inbox-ttl"]["value"], "600", "{s:#}");
    assert_eq!(s["profiles"]["generic"]["quiet_ms"]["value"], "50", "{s:#}");
    assert_eq!(
        s["profiles"]["generic"]["settle_ms"]["value"], "300",
        "{s:#}"
    );
}

/// `config` says where the running relay uses another value than the file now gives (the
/// file changed after it started): `running` in `--json`, and a note with how to apply it
/// (issue 24.12).
#[test]
fn config_says_when_the_running_relay_uses_another_value() {
    let relay = Relay::start();
    let before: Value = serde_json::from_str(&crate::support::ok_stdout(
        &relay.cli(&["config", "--json"]),
    ))
    .unwrap();
    let hops = before["up"]["max-hops"]["value"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        before["up"]["max-hops"].get("running").is_none(),
        "{before:#}"
    );
    configure(&relay, "[up]\nmax-hops = 3\n");
    let v: Value = serde_json::from_str(&crate::support::ok_stdout(
        &relay.cli(&["config", "--json"]),
    ))
    .unwrap();
    assert_eq!(v["up"]["max-hops"]["value"], "3", "{v:#}");
    assert_eq!(v["up"]["max-hops"]["running"], hops.as_str(), "{v:#}");
    let text = crate::support::ok_stdout(&relay.cli(&["config"]));
    let line = text.lines().find(|l| l.contains("max-hops")).unwrap();
    assert!(
        line.contains(&format!(
            "the running relay uses {hops}; restart it to apply"
        )),
        "{text}"
    );
}

/// The same failed start with the person attached (a real terminal, tmux backend): tmux shows
/// `[exited]`, and then the command says the agent's status and its last lines, and exits
/// with the status (issue 24.5).
#[test]
fn an_attached_agent_that_fails_at_start_is_shown_with_its_status_and_last_lines() {
    let relay = Relay::start();
    let _tmux = relay.tmux();
    relay.write("zoe.sh", BOGUS);
    let term = person_terminal_here(
        &relay,
        "person",
        "{bin} --backend tmux -n Zoe -- sh zoe.sh; echo \"ended: $?\"",
    );
    let s = term.wait_shows(Duration::from_secs(30), "ended:");
    assert!(s.contains("Zoe exited with status 1"), "{s}");
    assert!(s.contains("unknown option '--bogus-flag'"), "{s}");
    assert!(s.contains("ended: 1"), "{s}");
}

/// Alice in README's order: she asks Bob before Bob is started, then reads Bob's answer.
const WALK_ALICE: &str = r#"echo "I am $AGENT_RELAY_NAME"
echo "@relay:Bob Can you review auth.ts?"
echo
while IFS= read -r line; do echo "got: $line"; done
"#;

/// Bob answers Alice's review request and the person's question, each to its sender.
fn walk_bob() -> String {
    script_agent(
        I_AM,
        true,
        r#"    *"Relay message from Alice"*) echo "@relay:Alice Reviewed auth.ts: looks good"; echo;;
    *"Relay message from human"*) echo "@relay:human All good"; echo;;"#,
    )
}

/// README's walk-through (issue 24, Done means), in README's order, with scripted agents under
/// tmux: the relay is up; Alice starts and asks Bob, who has not run yet (the message waits,
/// no refusal); Bob starts and answers her; the person asks Bob (`send`), Bob answers
/// `@relay:human`, and the answer is in the person's `inbox`. Every message ends verified,
/// nothing is dead-lettered or refused.
#[test]
fn readme_walk_through_two_agents_and_a_person_all_verified_with_no_refusal() {
    let relay = Relay::start();
    let _tmux = relay.tmux();
    crate::support::start_tmux_agent(&relay, "Alice", WALK_ALICE, &["--profile", "generic"]);
    // Alice's question waits for Bob, who has not connected yet.
    wait_for(
        Duration::from_secs(30),
        "Alice's question is stored",
        || {
            history(&relay)
                .iter()
                .any(|m| m.from == "Alice" && m.to == "Bob")
        },
    );
    crate::support::start_tmux_agent(&relay, "Bob", &walk_bob(), &["--profile", "generic"]);
    wait_for(Duration::from_secs(60), "Bob answers Alice", || {
        history(&relay)
            .iter()
            .any(|m| m.from == "Bob" && m.to == "Alice")
    });
    let out = relay.cli(&["send", "Bob", "status?"]);
    assert!(out.status.success(), "{out:?}");
    let answer = wait_for_value(Duration::from_secs(60), "the answer in the inbox", || {
        let out = relay.cli(&["inbox", "--json"]);
        serde_json::from_slice::<Vec<Value>>(&out.stdout)
            .unwrap_or_default()
            .into_iter()
            .find(|m| m["from"] == "Bob" && m["body"] == "All good")
    });
    assert_eq!(answer["to"], "human", "{answer:#}");
    // Every message reaches its recipient's door and is verified there.
    // Four messages and the relay's one notice to Alice that Bob had not connected yet (her
    // question waited; nothing was refused), each verified by its recipient's door.
    let verified = |all: &[Stored]| {
        all.len() == 5
            && all.iter().all(|m| {
                m.json["deliveries"]
                    .as_array()
                    .is_some_and(|d| !d.is_empty() && d.iter().all(|d| d["status"] == "verified"))
            })
    };
    wait_for(Duration::from_secs(60), "every message verified", || {
        verified(&history(&relay))
    });
    let all = history(&relay);
    let pairs: Vec<(String, String)> = all.iter().map(|m| (m.from.clone(), m.to.clone())).collect();
    let notices: Vec<&Stored> = all.iter().filter(|m| m.from == "relay").collect();
    assert_eq!(notices.len(), 1, "{all:#?}");
    assert_eq!(notices[0].to, "Alice");
    assert!(
        notices[0].body.contains("Bob has not connected yet"),
        "{:#?}",
        notices[0]
    );
    for pair in [
        ("Alice", "Bob"),
        ("Bob", "Alice"),
        ("human", "Bob"),
        ("Bob", "human"),
    ] {
        assert!(
            pairs.contains(&(pair.0.to_owned(), pair.1.to_owned())),
            "{pair:?} missing from {pairs:?}"
        );
    }
    let dlq = relay.cli(&["dlq", "--json"]);
    assert!(dlq.status.success(), "{dlq:?}");
    let dlq: Value = serde_json::from_slice(&dlq.stdout).unwrap_or(Value::Null);
    assert!(
        dlq["dead_letters"].as_array().is_some_and(Vec::is_empty),
        "a dead letter on the way: {dlq:#}"
    );
}

/// Waits until `f` gives a value (bounded by `limit`).
fn wait_for_value<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let mut found = None;
    wait_for(limit, what, || {
        found = f();
        found.is_some()
    });
    found.unwrap()
}
