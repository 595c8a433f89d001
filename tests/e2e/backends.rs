//! Scenarios that run the same body on both terminal backends (`--backend pty` and
//! `--backend tmux`): one function per scenario taking the [`Backend`], and a thin `#[test]`
//! per backend.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::support::*;

/// An agent's own record of what it read (its `got:` lines, and its start line), written by
/// the scenario scripts beside what they print: a pane's or a PTY's text is gone once the
/// agent exits, its file is not.
fn seen(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(format!("{name}.seen"))).unwrap_or_default()
}

/// Bob: says who he is and whether he sees CI's variables, answers Alice's message, and ends
/// when told goodbye.
const BOB: &str = r#"echo "I am $AGENT_RELAY_NAME, CI=[${CI-unset}] CONTINUOUS_INTEGRATION=[${CONTINUOUS_INTEGRATION-unset}]" | tee -a Bob.seen
while IFS= read -r line; do
  echo "got: $line" | tee -a Bob.seen
  case "$line" in
    *"Relay message from Alice"*) echo "@relay:Alice thanks for the hello"; echo;;
    *goodbye*) exit 0;;
  esac
done
"#;

/// Alice: says hello to Bob, and exits 7 once she hears back.
const ALICE: &str = r#"echo "@relay:Bob hello from alice"
echo
while IFS= read -r line; do
  echo "got: $line" | tee -a Alice.seen
  case "$line" in *"Relay message from Bob"*) sleep 0.5; exit 7;; esac
done
"#;

/// Two agents converse: Alice's directive is typed into Bob's terminal once, Bob's answer
/// (in the thread of Alice's message, as its reply) into Alice's; each directive is relayed
/// once; the agents get `AGENT_RELAY_NAME` and not CI's variables; the exit status of the
/// agent is the wrapper's (tmux: its session ends with it and its relaying process leaves);
/// `--inbox` keeps Bob's messages whole in a file, and the delivery is seen submitted.
fn conversation(backend: Backend) {
    let relay = Relay::start();
    let tmux = relay.tmux();
    let dir = relay.dir.path();
    // Started as on a CI machine, whose variables the agent must not see (they make agent
    // CLIs act as if no person were at the terminal; `relay_wrap::NOT_INHERITED`).
    let ci = [("CI", "true"), ("CONTINUOUS_INTEGRATION", "1")];
    let mut bob = backend.start(&relay, "Bob", BOB, &["--inbox"], &ci, false);
    wait_online(&relay, "Bob");
    // The shorthand form, with no terminal on stdin.
    let mut alice = backend.start(&relay, "Alice", ALICE, &[], &[], true);
    let (alice_code, _) = alice.exit(&relay, &tmux);
    assert_eq!(
        alice_code,
        7,
        "the agent's exit code is the wrapper's\n{}",
        dump(&relay, &tmux)
    );
    let (bob_seen, alice_seen) = (seen(dir, "Bob"), seen(dir, "Alice"));
    assert!(
        bob_seen.contains("I am Bob, CI=[unset] CONTINUOUS_INTEGRATION=[unset]"),
        "the agent gets AGENT_RELAY_NAME, not CI:\n{bob_seen}"
    );
    // Bob's agent received Alice's directive as typed input, in the relay's format, once.
    assert!(
        bob_seen.contains("got: Relay message from Alice [")
            && bob_seen.contains("]: hello from alice"),
        "{bob_seen}"
    );
    assert_eq!(
        bob_seen.matches("got: Relay message from Alice [").count(),
        1,
        "{bob_seen}"
    );
    // Bob's answer is in the thread of Alice's message (shown by its short id).
    let alice_id = {
        let start = bob_seen.find("got: Relay message from Alice [").unwrap() + 31;
        bob_seen[start..start + 8].to_owned()
    };
    assert!(
        alice_seen.contains("got: Relay message from Bob [")
            && alice_seen.contains(&format!("] (thread {alice_id}): thanks for the hello")),
        "{alice_seen}"
    );
    // Each directive was relayed exactly once (the echoes were not relayed again).
    assert_eq!(
        history(&relay).iter().map(Stored::line).collect::<Vec<_>>(),
        vec![
            ("Alice", "Bob", "hello from alice"),
            ("Bob", "Alice", "thanks for the hello"),
        ]
    );
    let h: Value = serde_json::from_slice(&relay.cli(&["history", "--json"]).stdout).unwrap();
    // Printed after Alice's message was typed in: Bob's directive answers it.
    let (reply, first) = (&h[0], &h[1]);
    assert_eq!(reply["in_reply_to"], first["id"], "{h:#}");
    assert_eq!(reply["thread"], first["id"], "{h:#}");
    assert!(
        first["in_reply_to"].is_null(),
        "a fresh message starts fresh"
    );
    // --inbox: Bob's messages are also in a file, whole.
    let inbox = std::fs::read_to_string(relay.data_dir().join("team/Bob/inbox.md")).unwrap();
    assert!(
        inbox.contains("## From Alice [") && inbox.contains("\n\nhello from alice\n"),
        "{inbox}"
    );
    // The delivery was seen submitted on Bob's screen.
    let read: Value = serde_json::from_str(&ok_stdout(&relay.cli(&[
        "read",
        first["id"].as_str().unwrap(),
        "--json",
    ])))
    .unwrap();
    assert_eq!(read["deliveries"][0]["status"], "verified", "{read:#}");
    // What Bob's terminal showed: his pane while he runs (tmux), what the wrapper mirrored
    // (PTY).
    let pane = bob.session.as_ref().map(|s| tmux.pane(s));
    ok_stdout(&relay.cli(&["send", "--from", "Carol", "Bob", "goodbye"]));
    let (bob_code, printed) = bob.exit(&relay, &tmux);
    assert_eq!(bob_code, 0);
    let shown = pane.unwrap_or(printed);
    for line in bob_seen.lines() {
        assert!(shown.contains(line), "{line:?} not shown:\n{shown}");
    }
}

tests_of! {
    conversation {
        two_agents_converse_in_a_pty(Backend::Pty);
        two_agents_converse_in_tmux_sessions(Backend::Tmux);
    }
}

/// The pane a person sees the agent in, and types into: under the PTY backend a person's
/// terminal (a private tmux server) running `agent-relay -n NAME ...`, under tmux the agent's
/// own session.
struct PersonPane<'a> {
    relay: &'a Relay,
    /// (tmux server for `-L`, target): the person's terminal, or the agent's session.
    server: Option<&'static str>,
    target: String,
    _terminal: Option<crate::support::PersonTerminal>,
}

impl PersonPane<'_> {
    fn run(&self, args: &[&str]) -> std::process::Output {
        let dir = self.relay.dir.path();
        match self.server {
            Some(server) => crate::support::tmux_in(dir, server, args),
            // The test's server (as `Tmux::run`; a `Tmux` here would kill it when dropped).
            None => std::process::Command::new("tmux")
                .env("TMUX_TMPDIR", dir)
                .env_remove("TMUX")
                .args(args)
                .output()
                .unwrap(),
        }
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", &self.target];
        args.extend_from_slice(keys);
        let out = self.run(&args);
        assert!(out.status.success(), "{args:?}: {out:?}");
    }

    fn text(&self) -> String {
        let out = self.run(&["capture-pane", "-p", "-J", "-S", "-", "-t", &self.target]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// A person's half-written line is never typed over: a message that comes due meanwhile
/// waits (the dashboard shows the agent blocked, and why, never the text), then follows the
/// person's finished line, once, and is reported verified; under tmux a pane a person left in
/// copy mode is taken out of it before typing. (Under the PTY backend copy mode does not
/// apply: the wrapper writes into the agent's own pseudo-terminal, whatever the person's
/// terminal shows.)
fn a_persons_line(backend: Backend) {
    let relay = Relay::start();
    let dir = relay.dir.path();
    let profiles = dir.join("profiles");
    std::fs::create_dir_all(&profiles).unwrap();
    std::fs::write(profiles.join("generic.toml"), "prompt = '^> ?(.*)$'\n").unwrap();
    let script = dir.join("Dana.sh");
    std::fs::write(
        &script,
        "while printf '> ' && IFS= read -r line; do echo \"got: $line\"; done\n",
    )
    .unwrap();
    let pane = match backend {
        Backend::Pty => PersonPane {
            relay: &relay,
            server: Some("relayperson"),
            target: String::new(),
            _terminal: Some(crate::support::person_terminal(
                &relay,
                "relayperson",
                &format!(
                    "AGENT_RELAY_LOG=relay_wrap=debug AGENT_RELAY_PROFILE_DIR='{}' {{bin}} wrap -n Dana --profile generic -- sh '{}'",
                    profiles.display(),
                    script.display()
                ),
            )),
        },
        Backend::Tmux => {
            let profiles = profiles.to_str().unwrap();
            let script = std::fs::read_to_string(&script).unwrap();
            let dana = backend.start(
                &relay,
                "Dana",
                &script,
                &["--profile", "generic"],
                &[("AGENT_RELAY_PROFILE_DIR", profiles)],
                false,
            );
            PersonPane {
                relay: &relay,
                server: None,
                target: format!("={}:", dana.session.as_ref().unwrap()),
                _terminal: None,
            }
        }
    };
    let tmux = Tmux { dir };
    wait_online(&relay, "Dana");
    crate::support::wait_or_dump(&relay, &tmux, "Dana's prompt", || {
        pane.text().contains("> ")
    });

    // A person starts a line and stops to think.
    pane.keys(&["-l", "half a thought"]);
    crate::support::wait_or_dump(&relay, &tmux, "the person's text shows", || {
        pane.text().contains("> half a thought")
    });
    let first_id = cli_send(&relay, "Dana", "first relayed note");
    crate::support::held_for_a_person(&relay, &tmux, "Dana", &first_id);
    let shown = pane.text();
    assert!(
        !shown.contains("Relay message"),
        "typed over a person:\n{shown}"
    );
    assert!(
        shown.lines().any(|l| l.trim_end() == "> half a thought"),
        "the person's line changed:\n{shown}"
    );
    let status = |id: &str| delivery_status(&relay, id);
    assert_eq!(status(&first_id), "queued");
    // The dashboard says why (never what the person typed).
    let (port, token) = crate::support::dashboard(&relay);
    let dana = crate::support::wait_shown(port, &token, "Dana", "blocked");
    let (name, why) = match backend {
        Backend::Pty => ("pty", "a person is typing"),
        Backend::Tmux => ("tmux", "text in its input line"),
    };
    assert_eq!(
        (&dana["backend"], &dana["why"]),
        (&serde_json::json!(name), &serde_json::json!(why)),
        "{dana}"
    );

    // They finish it: their line goes in whole, then the message as a line of its own.
    pane.keys(&["-l", " and more"]);
    pane.keys(&["Enter"]);
    crate::support::wait_or_dump(&relay, &tmux, "the relayed note arrives", || {
        pane.text().contains("first relayed note")
    });
    crate::support::wait_or_dump(&relay, &tmux, "the note is reported verified", || {
        status(&first_id) == "verified"
    });
    let short = relay_protocol::short_id(&first_id);
    let shown = pane.text();
    let got: Vec<&str> = shown
        .lines()
        .filter_map(|l| l.strip_prefix("got: "))
        .collect();
    assert_eq!(
        got,
        [
            "half a thought and more".to_owned(),
            format!("Relay message from human [{short}]: first relayed note"),
        ],
        "{shown}"
    );
    crate::support::wait_shown(port, &token, "Dana", "idle");
    if backend == Backend::Pty {
        return;
    }

    // A person scrolls back (copy mode) and leaves the pane so: the wrapper takes it out of
    // copy mode and types the next message into the agent, once.
    pane.run(&["copy-mode", "-t", &pane.target]);
    let in_mode = || {
        let out = pane.run(&[
            "display-message",
            "-p",
            "-t",
            &pane.target,
            "#{pane_in_mode}",
        ]);
        String::from_utf8_lossy(&out.stdout).trim() == "1"
    };
    assert!(in_mode(), "the pane is in copy mode");
    let second_id = cli_send(&relay, "Dana", "second relayed note");
    let line = format!(
        "got: Relay message from human [{}]: second relayed note",
        relay_protocol::short_id(&second_id)
    );
    crate::support::wait_or_dump(&relay, &tmux, "the second note is submitted", || {
        pane.text().lines().any(|l| l == line)
    });
    assert!(!in_mode(), "copy mode was left");
    let shown = pane.text();
    assert_eq!(
        shown.matches("got: Relay message from human").count(),
        2,
        "{shown}"
    );
}

tests_of! {
    a_persons_line {
        a_persons_line_in_a_pty_is_never_typed_over(Backend::Pty);
        a_persons_line_and_copy_mode_in_a_tmux_pane_are_respected(Backend::Tmux);
    }
}

/// The parser reads the agent's terminal at its width, and follows a resize: a TUI (the
/// `codex` parse profile breaks its own lines) prints a directive whose next row, at the
/// directive's indentation, is a new line at one width and the rest of a wrapped line at a
/// narrower one. PTY: the person's terminal is resized (the wrapper hears SIGWINCH); tmux: the
/// agent's window (the relaying process hears `%layout-change`).
fn a_resized_terminal(backend: Backend) {
    let relay = Relay::start();
    let dir = relay.dir.path();
    // The test's tmux server (the agent's session, under tmux), killed with the test: without
    // it the session and its relaying process outlived every run.
    let _tmux = Tmux { dir };
    let (mut bob, _) = relay.agent("Bob");
    bob.read_timeout(Duration::from_secs(30));
    let mut heard = || {
        let m = bob.expect("DELIVER");
        bob.ack(&m);
        m["payload"]["body"].as_str().unwrap().to_owned()
    };
    let script = r#"read -r go
printf '  @relay:Bob hi\n  Done.\n\n'
read -r go
printf '  @relay:Bob %s\n  Done.\n\n' xxxxxxxxxxxxxxxxxxxxxxxxx
while IFS= read -r line; do :; done
"#;
    let pane = match backend {
        Backend::Pty => {
            std::fs::write(dir.join("Alice.sh"), script).unwrap();
            PersonPane {
                relay: &relay,
                server: Some("relayresize"),
                target: String::new(),
                _terminal: Some(crate::support::person_terminal(
                    &relay,
                    "relayresize",
                    &format!(
                        "AGENT_RELAY_LOG=relay_wrap=debug {{bin}} wrap -n Alice --profile codex --no-teach -- sh '{}'",
                        dir.join("Alice.sh").display()
                    ),
                )),
            }
        }
        Backend::Tmux => {
            let alice = backend.start(
                &relay,
                "Alice",
                script,
                &["--profile", "codex", "--no-teach"],
                &[],
                false,
            );
            PersonPane {
                relay: &relay,
                server: None,
                target: format!("={}:", alice.session.as_ref().unwrap()),
                _terminal: None,
            }
        }
    };
    wait_online(&relay, "Alice");
    let log = relay.data_dir().join("team/Alice/wrap.log");
    let logged = |what: &str| {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .matches(what)
            .count()
    };
    // The wrapper's loop has run (it logs the relay's first event): its terminal is set up, the
    // PTY wrapper listening for SIGWINCH, the tmux one's control client attached. Online alone
    // is earlier (the relay connection comes first), and a resize then went unheard.
    wait_for(Duration::from_secs(20), "the wrapper's loop runs", || {
        logged("relay event") > 0
    });
    let resized = || logged("the terminal was resized");
    // Each resize is waited for in the wrapper's log before the agent prints: the output is
    // then read at the new width, whatever order the signal and the keys arrive in.
    let resize = |cols: &str| {
        let before = resized();
        let out = pane.run(&["resize-window", "-t", &pane.target, "-x", cols, "-y", "20"]);
        assert!(out.status.success(), "{out:?}");
        wait_for(
            Duration::from_secs(20),
            "the wrapper hears the resize",
            || resized() > before,
        );
    };
    // 100 columns: `Done.` would have fitted after `hi`, so it is a line of its own.
    resize("100");
    pane.keys(&["go", "Enter"]);
    assert_eq!(heard(), "hi", "{}", pane.text());
    // 40 columns: the 38-column row could not take `Done.`, so the TUI wrapped it there.
    resize("40");
    pane.keys(&["go", "Enter"]);
    let x = "x".repeat(25);
    assert_eq!(heard(), format!("{x} Done."), "{}", pane.text());
}

tests_of! {
    a_resized_terminal {
        a_resized_pty_is_read_at_its_new_width(Backend::Pty);
        a_resized_tmux_window_is_read_at_its_new_width(Backend::Tmux);
    }
}

/// The restart scenario's agent: notes `start` in `Bob.seen` each time it starts, and every
/// line it reads; answers a relayed message, and a person's `person:` line, with a directive
/// to Carol.
const RESTARTED: &str = r#"echo start >> Bob.seen
echo "I am $AGENT_RELAY_NAME"
while IFS= read -r line; do
  echo "got: $line" | tee -a Bob.seen
  case "$line" in
    *"Relay message from"*) echo "@relay:Carol ack ${line##*: }"; echo;;
    person:*) echo "@relay:Carol ack ${line#person:}"; echo;;
  esac
done
"#;

/// A wrapper killed (-9) and started again, twice, at moments named by events: a message
/// typed into the agent before its wrapper died is not typed again, and every message that
/// was still waiting (in the wrapper, behind the one being typed, or at the relay while no
/// wrapper ran) is typed exactly once; every directive is relayed once.
///
/// Under the PTY backend the agent is the wrapper's child and dies with it (a new one starts
/// with the new wrapper); under tmux it runs on in its session, a person makes it print a
/// directive while no process relays for it, and the wrapper run again picks the session up.
/// The two kills: (1) after a message was entered and read by the agent (its answer relayed)
/// but before the wrapper checked and acknowledged it, another message waiting behind it; (2)
/// after a message was typed and before its Enter. The profile's delays hold each moment open
/// (ten minutes) until the kill.
fn a_restarted_wrapper(backend: Backend) {
    let relay = Relay::start();
    let dir = relay.dir.path();
    let tmux = Tmux { dir };
    // Carol is known (offline): Bob's answers wait in her inbox.
    drop(relay.agent("Carol"));
    let profiles = dir.join("profiles");
    std::fs::create_dir_all(&profiles).unwrap();
    let profile = |toml: &str| std::fs::write(profiles.join("generic.toml"), toml).unwrap();
    let env = [("AGENT_RELAY_PROFILE_DIR", profiles.to_str().unwrap())];
    let start = || {
        backend.start(
            &relay,
            "Bob",
            RESTARTED,
            &["--profile", "generic"],
            &env,
            false,
        )
    };
    let restart = || {
        let bob = start();
        if backend == Backend::Tmux {
            assert!(bob.said.contains("picking it up"), "{}", bob.said);
        }
        wait_online(&relay, "Bob");
        bob
    };
    let team = relay.data_dir().join("team/Bob");
    let read = |file: &str| std::fs::read_to_string(team.join(file)).unwrap_or_default();
    let send = |body: &str| cli_send(&relay, "Bob", body);
    let status = |id: &str| delivery_status(&relay, id);
    // How many times the agent (all its lives) read `body`, and Bob relayed `body`.
    let got = |body: &str| {
        seen(dir, "Bob")
            .lines()
            .filter(|l| {
                l.starts_with("got: Relay message from human [")
                    && l.ends_with(&format!("]: {body}"))
            })
            .count()
    };
    let relayed = |body: &str| {
        history(&relay)
            .iter()
            .filter(|m| m.from == "Bob" && m.body == body)
            .count()
    };
    // After a kill: a message waits at the relay; under tmux, after the first, a person makes
    // the agent (which runs on) print a directive (under the PTY there is no agent until the
    // restart; after the second kill the agent's input line holds the wrapper's text).
    let away = |round: usize| {
        send(&format!("while away {round}"));
        if let Some(session) = backend_session(backend, &relay).filter(|_| round == 1) {
            let target = format!("={session}:");
            tmux.run(&[
                "send-keys",
                "-t",
                &target,
                "-l",
                &format!("person:p{round}"),
            ]);
            tmux.run(&["send-keys", "-t", &target, "Enter"]);
            wait_or_dump(&relay, &tmux, "the agent answers the person", || {
                tmux.pane(&session)
                    .contains(&format!("@relay:Carol ack p{round}"))
            });
        }
    };

    // Life 1: an Enter is checked (and the message acknowledged) only ten minutes after it.
    profile("verify_after_ms = 600000\n");
    let mut bob = start();
    wait_online(&relay, "Bob");
    let first = send("first note");
    wait_or_dump(
        &relay,
        &tmux,
        "Bob reads the first note and answers it",
        || got("first note") == 1 && relayed("ack first note") == 1,
    );
    let second = send("second note");
    wait_or_dump(
        &relay,
        &tmux,
        "the second note waits in the wrapper",
        || read("wrap.log").contains(&format!("a message waits to be typed id={second}")),
    );
    assert_eq!(status(&first), "queued", "acknowledged before the kill");
    assert!(
        read("injected.log").contains(&format!("E {first}")),
        "{}",
        read("injected.log")
    );
    bob.kill9(&relay);
    away(1);

    // Life 2: the text is typed, and its Enter comes ten minutes later. The first note, given
    // again by the relay, is answered from `injected.log`, not typed.
    profile("enter_delay_ms = 600000\nenter_on_echo = false\n");
    let mut bob = restart();
    wait_or_dump(
        &relay,
        &tmux,
        "the restarted wrapper acknowledges the first note without typing it",
        || !["queued", ""].contains(&status(&first).as_str()),
    );
    wait_or_dump(
        &relay,
        &tmux,
        "the second note is typed, not entered",
        || {
            read("injected.log")
                .lines()
                .any(|l| l.starts_with(&format!("T {second}")))
                && backend_session(backend, &relay)
                    .is_none_or(|s| tmux.pane(&s).contains("]: second note"))
        },
    );
    assert!(
        !read("injected.log").contains(&format!("E {second}")),
        "{}",
        read("injected.log")
    );
    bob.kill9(&relay);
    away(2);

    // Life 3: the default profile.
    std::fs::remove_file(profiles.join("generic.toml")).unwrap();
    let _bob = restart();
    let bodies = ["first note", "second note", "while away 1", "while away 2"];
    let mut acks: Vec<String> = bodies.iter().map(|b| format!("ack {b}")).collect();
    if backend == Backend::Tmux {
        acks.push("ack p1".to_owned());
    }
    wait_or_dump(&relay, &tmux, "every message is read and answered", || {
        bodies.iter().all(|b| got(b) > 0) && acks.iter().all(|a| relayed(a) > 0)
    });
    let ids: Vec<String> = {
        let h: Value =
            serde_json::from_slice(&relay.cli(&["history", "--json", "--limit", "1000"]).stdout)
                .unwrap();
        h.as_array()
            .unwrap()
            .iter()
            .filter(|m| m["from"] == "human")
            .map(|m| m["id"].as_str().unwrap().to_owned())
            .collect()
    };
    wait_or_dump(&relay, &tmux, "every delivery is settled", || {
        ids.iter()
            .all(|id| !["queued", ""].contains(&status(id).as_str()))
    });

    // Everything exactly once.
    for body in bodies {
        assert_eq!(
            got(body),
            1,
            "{body:?} read {} times:\n{}",
            got(body),
            seen(dir, "Bob")
        );
    }
    for ack in &acks {
        assert_eq!(
            relayed(ack),
            1,
            "{ack:?} relayed {} times: {:#?}",
            relayed(ack),
            history(&relay)
        );
    }
    let h = history(&relay);
    assert_eq!(
        h.iter().filter(|m| m.from == "Bob").count(),
        acks.len(),
        "{h:#?}"
    );
    assert_eq!(
        h.iter().filter(|m| m.from == "human").count(),
        bodies.len(),
        "{h:#?}"
    );
    let starts = seen(dir, "Bob").lines().filter(|l| *l == "start").count();
    // The first note was entered before the kill: under tmux the pane's history shows it was
    // given (acknowledged as injected); under the PTY whether the agent that died read it is unknown to the
    // wrapper, so it is reported failed (a dead letter: its sender is told). The second was
    // typed, never entered: tmux's pane still held it (the restarted wrapper pressed its
    // Enter); under the PTY it was typed into the new agent.
    let (lives, first_state, second_state) = match backend {
        Backend::Pty => (3, "failed", "verified"),
        Backend::Tmux => (1, "acked", "acked"),
    };
    assert_eq!(starts, lives, "{}", seen(dir, "Bob"));
    assert_eq!(status(&first), first_state);
    assert_eq!(status(&second), second_state);
    if backend == Backend::Pty {
        let dlq: Value =
            serde_json::from_str(&ok_stdout(&relay.cli(&["dlq", "list", "--json"]))).unwrap();
        let dead = dlq["dead_letters"].as_array().unwrap();
        assert!(
            dead.iter().any(|d| d["msg_id"] == first.as_str()
                && d["reason"].as_str().is_some_and(|r| {
                    r.contains("ended with its wrapper") && r.contains("unknown")
                })),
            "{dlq:#}"
        );
    }
    for id in &ids[..] {
        if *id != first && *id != second {
            assert_eq!(status(id), "verified", "{id}");
        }
    }
    if backend == Backend::Pty {
        return;
    }
    // One relaying process at a time: running the command again while one runs starts none
    // (it says so; the process it would start is spawned before it returns, so there is no
    // moment to wait for), and the lock still names the running one.
    let lock = team.join("relay.lock");
    let before = std::fs::read_to_string(&lock).unwrap();
    let again = start();
    assert!(
        again
            .said
            .contains("a process already relays for Bob; none started"),
        "{}",
        again.said
    );
    assert_eq!(std::fs::read_to_string(&lock).unwrap(), before);
    assert!(is_online(&relay, "Bob"));
}

/// The tmux session agent `Bob` runs in, under the tmux backend.
fn backend_session(backend: Backend, relay: &Relay) -> Option<String> {
    (backend == Backend::Tmux).then(|| session_of(relay, "Bob"))
}

tests_of! {
    a_restarted_wrapper {
        a_restarted_pty_wrapper_types_nothing_twice_and_misses_nothing(Backend::Pty);
        a_restarted_tmux_wrapper_picks_up_its_session_typing_nothing_twice(Backend::Tmux);
    }
}

/// The relay dies (-9) and comes back: the agent keeps running, its wrapper (PTY) or relaying
/// process (tmux) reconnects by itself, a message typed before is not typed again, and one
/// sent after is typed once. (What a person's reattach means under tmux, the PTY has no
/// counterpart of: see the terminal layer in docs/ARCHITECTURE.md. This is the part both
/// share: the relaying side of an agent staying attached.)
fn the_relay_coming_back(backend: Backend) {
    let mut relay = Relay::start();
    let dir = relay.dir.path().to_path_buf();
    // The test's tmux server, killed when the test ends (whatever the backend).
    let tmux = Tmux { dir: &dir };
    let script = r#"while IFS= read -r l; do echo "got: $l" | tee -a Gus.seen; case "$l" in *"after the restart"*) exit 0;; esac; done
"#;
    let mut gus = backend.start(&relay, "Gus", script, &[], &[], false);
    wait_online(&relay, "Gus");
    let before: Value = serde_json::from_str(&ok_stdout(&relay.cli(&[
        "send",
        "Gus",
        "before the relay died",
        "--json",
    ])))
    .unwrap();
    let before = before["id"].as_str().unwrap().to_owned();
    wait_for(
        Duration::from_secs(20),
        "the first message is verified",
        || delivery_status(&relay, &before) == "verified",
    );
    relay.kill9();
    relay.spawn();
    wait_for(Duration::from_secs(30), "Gus reconnects by itself", || {
        is_online(&relay, "Gus")
    });
    ok_stdout(&relay.cli(&["send", "Gus", "after the restart"]));
    let (code, printed) = gus.exit(&relay, &tmux);
    assert_eq!(code, 0, "{printed}");
    let seen = seen(&dir, "Gus");
    for body in ["before the relay died", "after the restart"] {
        let n = seen
            .lines()
            .filter(|l| {
                l.starts_with("got: Relay message from human [")
                    && l.ends_with(&format!("]: {body}"))
            })
            .count();
        assert_eq!(n, 1, "{body:?} read {n} times:\n{seen}");
    }
    if backend == Backend::Pty {
        assert!(
            printed.contains("got: Relay message from human [")
                && printed.contains("]: after the restart"),
            "{printed}"
        );
    }
}

tests_of! {
    the_relay_coming_back {
        a_pty_agent_keeps_running_when_the_relay_dies_and_hears_again_after_its_restart(Backend::Pty);
        a_tmux_agent_keeps_running_when_the_relay_dies_and_hears_again_after_its_restart(Backend::Tmux);
    }
}
