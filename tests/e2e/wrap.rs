//! The wrapper: agents run in real PTYs under `agent-relay`, talking through a real daemon.

use std::process::{Child, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::*;

/// `NO_COLOR` is the person's to set, and passed on; where it hides what the parser relies
/// on (Claude Code's code blocks), the wrapper says so at start.
#[test]
fn no_color_with_the_claude_parser_is_warned_about_and_passed_on() {
    let relay = Relay::start();
    let run = |profile: &str| {
        relay
            .command()
            .current_dir(relay.dir.path())
            .env("NO_COLOR", "1")
            .args(["wrap", "--no-input", "-n", "Nc", "--profile", profile, "--"])
            .args(["sh", "-c", "echo \"NO_COLOR=[$NO_COLOR]\""])
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let out = run("claude");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("NO_COLOR=[1]"), "{stdout}");
    assert!(
        stderr.contains("warning: NO_COLOR is set") && stderr.contains("code block"),
        "{stderr}"
    );
    let out = run("codex");
    assert!(!String::from_utf8_lossy(&out.stderr).contains("NO_COLOR"));
}

#[test]
fn the_wrapper_starts_the_relay_when_it_is_not_running() {
    let dir = tempfile::Builder::new().prefix("ar").tempdir().unwrap();
    let run = |args: &[&str]| {
        std::process::Command::new(BIN)
            .args(args)
            .current_dir(dir.path())
            .env("AGENT_RELAY_DATA_DIR", dir.path().join("data"))
            .env("AGENT_RELAY_SOCKET", dir.path().join("r.sock"))
            .env_remove("AGENT_RELAY_STORAGE_PATH")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let out = run(&["-n", "Solo", "sh", "-c", "echo working; exit 3"]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("working"));
    let status: Value = serde_json::from_str(&ok_stdout(&run(&["status", "--json"]))).unwrap();
    assert_eq!(status["running"], true);
    // A command that exits at once, took part in nothing and is no agent CLI is not kept as
    // an agent (issue 24.6).
    assert_eq!(status["known_agents"], 0);
    ok_stdout(&run(&["down"]));
}

/// A person at a real terminal (a private tmux server): keystrokes reach the agent, and the
/// terminal is back in its normal mode once the wrapper exits.
#[test]
fn keystrokes_pass_through_and_the_terminal_is_restored() {
    let relay = Relay::start();
    let dir = relay.dir.path();
    let stty_file = dir.join("stty.txt");
    let _terminal = person_terminal(
        &relay,
        "relaytest",
        &format!(
            "{{bin}} -n Carol sh -c 'read x; echo \"you typed $x\"; sleep 1'\n\
             echo \"wrapper exit $?\"\n\
             stty -a > '{stty}.tmp' && mv '{stty}.tmp' '{stty}'",
            stty = stty_file.display(),
        ),
    );
    let tmux = |args: &[&str]| tmux_in(dir, "relaytest", args);
    let pane = || String::from_utf8_lossy(&tmux(&["capture-pane", "-p"]).stdout).into_owned();
    wait_online(&relay, "Carol");
    tmux(&["send-keys", "-l", "hello there"]);
    tmux(&["send-keys", "Enter"]);
    wait_for(
        Duration::from_secs(20),
        "the agent echoes what was typed",
        || pane().contains("you typed hello there"),
    );
    let stty = stty_file;
    wait_for(Duration::from_secs(20), "the wrapper exits", || {
        stty.exists()
    });
    let pane_text = pane();
    assert!(pane_text.contains("wrapper exit 0"), "{pane_text}");
    let modes = std::fs::read_to_string(&stty).unwrap();
    let words: Vec<&str> = modes.split_whitespace().collect();
    for mode in ["icanon", "echo", "isig", "icrnl"] {
        assert!(
            words.contains(&mode),
            "terminal not restored: {mode} is off\n{modes}"
        );
    }
    tmux(&["kill-server"]);
}

/// Stopping the wrapper with a signal (SIGTERM, or SIGINT or SIGQUIT sent from outside: in raw
/// mode the keyboard's Ctrl-C goes to the agent as a byte) stops the agent and gives the
/// terminal back as it was.
#[test]
fn a_signal_to_the_wrapper_restores_the_terminal() {
    use rustix::process::Signal;
    let relay = Relay::start();
    let dir = relay.dir.path();
    for (signal, number, secs) in [
        (Signal::Term, 15, 59),
        (Signal::Int, 2, 58),
        (Signal::Quit, 3, 57),
    ] {
        let name = format!("Eve{secs}");
        let server = format!("relaysig{secs}");
        let stty = dir.join(format!("stty-{secs}.txt"));
        let _terminal = person_terminal(
            &relay,
            &server,
            &format!(
                "{{bin}} -n {name} sleep {secs}\n\
                 echo \"wrapper exit $?\"\n\
                 stty -a > '{stty}.tmp' && mv '{stty}.tmp' '{stty}'",
                stty = stty.display(),
            ),
        );
        wait_online(&relay, &name);
        let agent = format!("^sleep {secs}$");
        let agent_running = || {
            let out = std::process::Command::new("pgrep")
                .args(["-f", &agent])
                .output()
                .unwrap();
            !String::from_utf8_lossy(&out.stdout).trim().is_empty()
        };
        wait_for(Duration::from_secs(20), "the agent runs", agent_running);
        let pids = std::process::Command::new("pgrep")
            .args(["-f", "--", &format!("-n {name} sleep {secs}")])
            .output()
            .unwrap();
        let pid: i32 = String::from_utf8_lossy(&pids.stdout)
            .lines()
            .next()
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        crate::support::signal_pid(pid, signal);
        wait_for(Duration::from_secs(20), "the wrapper exits", || {
            stty.exists()
        });
        let modes = std::fs::read_to_string(&stty).unwrap();
        let words: Vec<&str> = modes.split_whitespace().collect();
        for mode in ["icanon", "echo", "isig", "icrnl"] {
            assert!(
                words.contains(&mode),
                "{signal:?}: terminal not restored: {mode} is off\n{modes}"
            );
        }
        // Its exit status says which signal, as a shell reports one that a signal ended.
        let screen =
            String::from_utf8_lossy(&tmux_in(dir, &server, &["capture-pane", "-p"]).stdout)
                .into_owned();
        assert!(
            screen.contains(&format!("wrapper exit {}", 128 + number)),
            "{signal:?}:\n{screen}"
        );
        // The agent went with it.
        wait_for(Duration::from_secs(10), "the agent is gone", || {
            !agent_running()
        });
        tmux_in(dir, &server, &["kill-server"]);
    }
}

#[test]
fn a_refused_message_comes_back_to_the_agent_as_a_notice() {
    let relay = Relay::start();
    let (_bob, _) = relay.agent("Bob");
    let out = relay.run_wrapped(
        "Alice",
        "typo.sh",
        r#"echo "@relay:Bobb are you there?"
while IFS= read -r line; do
  echo "got: $line"
  case "$line" in *"was not sent"*) exit 5;; esac
done
"#,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(5), "{text}");
    assert!(
        text.contains("got: relay: your message to Bobb was not sent: no agent named \"Bobb\"; did you mean \"Bob\"?"),
        "{text}"
    );
    // Nothing was stored, and the notice's echo was not sent anywhere either.
    let h: Value = serde_json::from_slice(&relay.cli(&["history", "--json"]).stdout).unwrap();
    assert_eq!(h.as_array().unwrap().len(), 0, "{h}");
}

/// An agent showing a dialog (a marker of its profile's `dialogs`) gets nothing typed in: a
/// message waits, and the dashboard shows the agent blocked and why, until a person answers
/// and the dialog is gone; then the message is typed, once.
#[test]
fn an_agent_showing_a_dialog_is_blocked_until_a_person_answers() {
    let relay = Relay::start();
    let dir = relay.dir.path();
    let profiles = dialog_profiles(&relay);
    let script = dir.join("dialog.sh");
    // Like a TUI, it redraws the screen once the dialog is answered (here: clears it).
    std::fs::write(
        &script,
        "printf 'Allow command? [y/n] '\nread -r answer\nprintf '\\033[2J\\033[H'\n\
         echo \"answered: $answer\"\nwhile IFS= read -r l; do echo \"got: $l\"; done\n",
    )
    .unwrap();
    let _terminal = person_terminal(
        &relay,
        "relaydialog",
        &format!(
            "AGENT_RELAY_PROFILE_DIR='{}' {{bin}} wrap -n Dora --profile generic -- sh '{}'",
            profiles.display(),
            script.display()
        ),
    );
    let tmux = |args: &[&str]| tmux_in(dir, "relaydialog", args);
    let pane = || String::from_utf8_lossy(&tmux(&["capture-pane", "-p"]).stdout).into_owned();
    wait_online(&relay, "Dora");
    wait_for(Duration::from_secs(10), "the dialog shows", || {
        pane().contains("Allow command?")
    });
    let sent: Value = serde_json::from_str(&ok_stdout(&relay.cli(&[
        "send",
        "Dora",
        "please run the tests",
        "--json",
    ])))
    .unwrap();
    let id = sent["id"].as_str().unwrap().to_owned();
    let (port, token) = crate::support::dashboard(&relay);
    let dora = wait_shown(port, &token, "Dora", "blocked");
    assert_eq!(
        (&dora["backend"], &dora["why"]),
        (&json!("pty"), &json!("dialog open: allow command?")),
        "{dora}"
    );
    assert!(
        !pane().contains("Relay message"),
        "typed into a dialog:\n{}",
        pane()
    );

    // A person answers; the dialog is gone and the message goes in.
    tmux(&["send-keys", "-l", "y"]);
    tmux(&["send-keys", "Enter"]);
    let short = relay_protocol::short_id(&id);
    let line = format!("got: Relay message from human [{short}]: please run the tests");
    wait_for(Duration::from_secs(20), "the message is typed in", || {
        pane().lines().any(|l| l == line)
    });
    assert!(pane().contains("answered: y"), "{}", pane());
    wait_shown(port, &token, "Dora", "idle");
    assert_eq!(
        pane().matches("got: Relay message").count(),
        1,
        "{}",
        pane()
    );
    tmux(&["kill-server"]);
}

#[test]
fn an_agent_that_enabled_bracketed_paste_gets_the_message_as_a_paste() {
    let relay = Relay::start();
    relay.write(
        "paste.py",
        "import sys\n\
         sys.stdout.write('\\x1b[?2004hready\\r\\n'); sys.stdout.flush()\n\
         line = sys.stdin.readline()\n\
         print('raw:', repr(line)); sys.stdout.flush()\n",
    );
    let mut agent = spawn_wrapped(
        &relay,
        &wrap_args("Paula", &["--no-input"], &["python3", "paste.py"]),
    );
    wait_online(&relay, "Paula");
    // The premise: the agent has turned bracketed paste on. Under load Python may start after
    // the wrapper is online; a message that comes first is typed (failed so, 3 of 3 on a
    // loaded machine: `raw: 'Relay message from human [...]: pasted text\n'`).
    read_until(&mut agent, "ready");
    ok_stdout(&relay.cli(&["send", "Paula", "pasted text"]));
    let (code, out) = output_of(agent);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(r"raw: '\x1b[200~Relay message from human [")
            && out.contains(r"]: pasted text\x1b[201~\n'"),
        "{out}"
    );
}

#[test]
fn a_broadcast_reaches_three_wrapped_agents_once_each() {
    let relay = Relay::start();
    let listeners: Vec<(&str, Child)> = ["Carol", "Dave", "Erin"]
        .into_iter()
        .map(|n| (n, listener(&relay, n, "all hands")))
        .collect();
    for (n, _) in &listeners {
        wait_online(&relay, n);
    }
    let alice = relay
        .command()
        .args(wrap_args(
            "Alice",
            &["--no-input"],
            &["sh", "-c", "echo '@relay:* all hands at noon'"],
        ))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(alice.status.success());
    for (n, child) in listeners {
        let (code, out) = output_of(child);
        assert_eq!(code, 0, "{n}: {out}");
        assert_eq!(
            out.matches("got: Relay message from Alice [").count(),
            1,
            "{n}: {out}"
        );
        assert!(out.contains("]: all hands at noon"), "{n}: {out}");
    }
    let h: Value = serde_json::from_slice(&relay.cli(&["history", "--json"]).stdout).unwrap();
    let h = h.as_array().unwrap();
    assert_eq!(h.len(), 1, "stored once: {h:?}");
    assert_eq!(h[0]["to"], "*");
    assert_eq!(h[0]["deliveries"].as_array().unwrap().len(), 3);
}

#[test]
fn an_agent_started_after_a_message_was_sent_for_it_still_gets_it() {
    let relay = Relay::start();
    // Hank has been here before, so messages for him are kept while he is away.
    relay.known_offline("Hank");
    let sent: Value = serde_json::from_str(&ok_stdout(&relay.cli(&[
        "send",
        "Hank",
        "while you were out",
        "--json",
    ])))
    .unwrap();
    assert_eq!(sent["status"], "queued");
    let (code, out) = output_of(listener(&relay, "Hank", "while you were out"));
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("got: Relay message from human [") && out.contains("]: while you were out"),
        "{out}"
    );
}

#[test]
fn a_long_body_is_cut_with_a_hint_to_read_the_rest() {
    let relay = Relay::start();
    let agent = spawn_script(
        &relay,
        "Ivy",
        &["--no-input", "--max-body", "20"],
        r#"IFS= read -r l; echo "got: $l""#,
    );
    wait_online(&relay, "Ivy");
    let long = "0123456789".repeat(10);
    let id = &cli_send(&relay, "Ivy", &long);
    let (_, out) = output_of(agent);
    assert!(
        out.contains(&format!(
            "]: 01234567890123456789 … (truncated; full text: agent-relay read {id})"
        )),
        "{out}"
    );
    // The whole text is there to read.
    assert!(ok_stdout(&relay.cli(&["read", id])).contains(&long));
}

/// An agent that works (a spinner with "esc to interrupt", then a silent stretch with the
/// status still shown) gets its messages only once it is idle, the urgent one first.
#[test]
fn a_busy_agent_gets_its_messages_once_idle_urgent_first() {
    let relay = Relay::start();
    let agent = spawn_script(
        &relay,
        "Busy",
        PTY_GENERIC,
        r#"i=0
while [ $i -lt 15 ]; do printf '\r* Working %d (esc to interrupt)' $i; i=$((i+1)); sleep 0.1; done
sleep 1.5
printf '\r\033[2Kdone working\n'
while IFS= read -r l; do echo "got: $l"; case "$l" in *second*) exit 0;; esac; done
"#,
    );
    wait_online(&relay, "Busy");
    ok_stdout(&relay.cli(&["send", "Busy", "first"]));
    ok_stdout(&relay.cli(&["send", "Busy", "second"]));
    ok_stdout(&relay.cli(&["send", "Busy", "third", "--urgent"]));
    let (code, out) = output_of(agent);
    assert_eq!(code, 0, "{out}");
    let done = out
        .find("done working")
        .expect("the agent finished working");
    let typed = out.find("Relay message").expect("messages were typed");
    assert!(done < typed, "typed while the agent was busy:\n{out}");
    let got: Vec<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("got: Relay message from human ["))
        .map(|l| l.rsplit(": ").next().unwrap_or("").trim_end())
        .collect();
    assert_eq!(got, ["third", "first", "second"], "{out}");
}

/// `--intro` types a note on using the relay into the agent once, and its `@relay:` mentions
/// are never sent.
#[test]
fn intro_tells_the_agent_how_to_use_the_relay_and_sends_nothing() {
    let relay = Relay::start();
    let agent = spawn_script(
        &relay,
        "Ivy",
        &["--backend", "pty", "--no-input", "--intro"],
        r#"IFS= read -r l; echo "got: $l"; sleep 1"#,
    );
    let (code, out) = output_of(agent);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("got: agent-relay: you are Ivy,") && out.contains("@relay:* for everyone"),
        "{out}"
    );
    let h: Value = serde_json::from_slice(&relay.cli(&["history", "--json"]).stdout).unwrap();
    assert_eq!(h.as_array().map(Vec::len), Some(0), "{h}");
}

/// Run with no name, an agent gets a generated one (printed); it runs in the caller's working
/// directory, at the caller's terminal size, with `AGENT_RELAY_NAME`; with
/// `AGENT_RELAY_INBOX_DIR` set, every message for it is also written to
/// `<dir>/team/<name>/inbox.md`.
#[test]
fn a_nameless_agent_gets_a_generated_name_the_callers_directory_size_and_an_inbox() {
    let relay = Relay::start();
    let dir = relay.dir.path();
    let work = dir.join("work");
    let inboxes = dir.join("inboxes");
    std::fs::create_dir_all(&work).unwrap();
    let script = dir.join("where.sh");
    std::fs::write(
        &script,
        "echo \"cwd: $(pwd)\"\necho \"size: $(stty size)\"\necho \"name: $AGENT_RELAY_NAME\"\n\
         while IFS= read -r l; do echo \"got: $l\"; done\n",
    )
    .unwrap();
    let err = dir.join("wrap-stderr.txt");
    let _terminal = person_terminal(
        &relay,
        "relaynameless",
        &format!(
            "cd '{}' && AGENT_RELAY_INBOX_DIR='{}' {{bin}} sh '{}' 2> '{}'",
            work.display(),
            inboxes.display(),
            script.display(),
            err.display()
        ),
    );
    let tmux = |args: &[&str]| tmux_in(dir, "relaynameless", args);
    let pane = || String::from_utf8_lossy(&tmux(&["capture-pane", "-p"]).stdout).into_owned();
    wait_for(Duration::from_secs(20), "the agent starts", || {
        pane().contains("name: ")
    });
    let said = std::fs::read_to_string(&err).unwrap();
    let name = said
        .split("this agent is ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no generated name announced: {said:?}"))
        .to_owned();
    assert!(
        name.len() >= 4
            && name.chars().all(|c| c.is_ascii_alphabetic())
            && name.starts_with(|c: char| c.is_ascii_uppercase()),
        "{name:?}"
    );
    wait_online(&relay, &name);
    let text = pane();
    for line in [
        format!("cwd: {}", work.display()),
        "size: 30 120".to_owned(),
        format!("name: {name}"),
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} missing:\n{text}");
    }
    let sent: Value = serde_json::from_str(&ok_stdout(&relay.cli(&[
        "send",
        &name,
        "check the inbox too",
        "--json",
    ])))
    .unwrap();
    let short = relay_protocol::short_id(sent["id"].as_str().unwrap()).to_owned();
    wait_for(Duration::from_secs(20), "the message is typed in", || {
        pane().contains("got: Relay message from human [")
    });
    let inbox = std::fs::read_to_string(inboxes.join("team").join(&name).join("inbox.md"))
        .unwrap_or_else(|e| panic!("no inbox for {name} under {}: {e}", inboxes.display()));
    assert!(
        inbox.contains("check the inbox too") && inbox.contains(&short),
        "{inbox}"
    );
    tmux(&["kill-server"]);
}

/// What an agent prints after a relayed message answers that message (`in_reply_to`, its
/// thread, one more hop); once a person submits a line of their own, what it prints next
/// starts afresh: no `in_reply_to`, not in that thread, no budget carried over.
#[test]
fn a_persons_line_starts_a_fresh_conversation() {
    let relay = Relay::start();
    let (mut bob, _) = relay.agent("Bob");
    let _terminal = person_terminal(
        &relay,
        "relayfresh",
        "{bin} -n Erin sh -c 'while IFS= read -r l; do case \"$l\" in \
         *\"Relay message\"*) echo \"@relay:Bob answering you\";; \
         *) echo \"@relay:Bob about: $l\";; esac; done'",
    );
    let tmux = |args: &[&str]| tmux_in(relay.dir.path(), "relayfresh", args);
    wait_online(&relay, "Erin");
    // Bob asks; Erin's agent answers: a reply.
    let asked = bob.send("Erin", "can you check?");
    bob.expect("ACK");
    let reply = bob.expect("DELIVER");
    bob.ack(&reply);
    assert_eq!(reply["payload"]["body"], "answering you");
    assert_eq!(reply["payload"]["in_reply_to"], asked.as_str(), "{reply}");
    let thread = reply["payload"]["thread"].as_str().unwrap().to_owned();
    assert_eq!(reply["payload"]["budget"]["hops"], 1, "{reply}");
    // A person gives Erin's agent a task of their own: what it says next is new.
    tmux(&["send-keys", "-l", "plan the release"]);
    tmux(&["send-keys", "Enter"]);
    let fresh = bob.expect("DELIVER");
    bob.ack(&fresh);
    assert_eq!(fresh["payload"]["body"], "about: plan the release");
    // Not a reply, in no thread, so it carries no budget: hop counting starts again.
    assert!(fresh["payload"]["in_reply_to"].is_null(), "{fresh}");
    assert_ne!(
        fresh["payload"]["thread"].as_str(),
        Some(thread.as_str()),
        "{fresh}"
    );
    assert!(fresh["payload"]["budget"].is_null(), "{fresh}");
    tmux(&["kill-server"]);
}
