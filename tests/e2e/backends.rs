//! Scenarios that run the same body on both terminal backends (`--backend pty` and
//! `--backend tmux`): one function per scenario taking the [`Backend`], and a thin `#[test]`
//! per backend.

use std::path::Path;
use std::process::Child;
use std::time::Duration;

use serde_json::Value;

use crate::support::{Relay, ok_stdout, wait_for};
use crate::tmux::{Tmux, dump, history, session_of, wrap_cmd};
use crate::wrap::{is_online, output_of, wait_online};

/// Which terminal the agents run in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Backend {
    /// In a pseudo-terminal inside the wrapper's process (no terminal on stdin: `--no-input`).
    Pty,
    /// In a tmux session on the test's private server, relayed by a background process.
    Tmux,
}

/// A wrapped agent on either backend.
pub(crate) struct Agent {
    name: String,
    /// The wrapper's process (PTY).
    child: Option<Child>,
    /// The agent's session (tmux).
    session: Option<String>,
}

impl Backend {
    /// Starts `sh <name>.sh` (written from `script`) as agent `name`, with `args` before the
    /// command (`wrap` options) and `env` for the wrapper and the agent. `shorthand`: the
    /// `agent-relay -n NAME <cli>` form instead of `wrap ... --`.
    pub(crate) fn start(
        self,
        relay: &Relay,
        name: &str,
        script: &str,
        args: &[&str],
        env: &[(&str, &str)],
        shorthand: bool,
    ) -> Agent {
        let file = format!("{name}.sh");
        std::fs::write(relay.dir.path().join(&file), script).unwrap();
        let mut all: Vec<&str> = Vec::new();
        if !shorthand {
            all.push("wrap");
        }
        match self {
            // The PTY backend is the default without a terminal on stdin.
            Backend::Pty if shorthand => {}
            Backend::Pty => all.push("--no-input"),
            Backend::Tmux => all.extend(["--backend", "tmux", "--detached"]),
        }
        all.extend(["-n", name]);
        all.extend_from_slice(args);
        if !shorthand {
            all.push("--");
        }
        all.extend(["sh", &file]);
        let mut cmd = wrap_cmd(relay, &all);
        cmd.envs(env.iter().copied());
        match self {
            Backend::Pty => Agent {
                name: name.to_owned(),
                child: Some(cmd.stdout(std::process::Stdio::piped()).spawn().unwrap()),
                session: None,
            },
            Backend::Tmux => {
                let out = cmd.output().unwrap();
                let err = String::from_utf8_lossy(&out.stderr);
                assert!(out.status.success(), "{err}");
                assert!(
                    err.contains(&format!("attach with: agent-relay attach {name}")),
                    "{err}"
                );
                Agent {
                    name: name.to_owned(),
                    child: None,
                    session: Some(session_of(relay, name)),
                }
            }
        }
    }
}

impl Agent {
    /// Waits for the agent to exit and its relaying to end; its exit status (the wrapper's
    /// under the PTY, the one the session's shell kept under tmux) and, for the PTY, what it
    /// printed.
    pub(crate) fn exit(&mut self, relay: &Relay, tmux: &Tmux<'_>) -> (i32, String) {
        if let Some(child) = self.child.take() {
            return output_of(child);
        }
        let session = self.session.clone().unwrap();
        crate::tmux::wait_or_dump(relay, tmux, &format!("{} exits", self.name), || {
            !tmux.has(&session)
        });
        let exit =
            std::fs::read_to_string(relay.data_dir().join(format!("team/{}/exit", self.name)))
                .unwrap();
        wait_for(
            Duration::from_secs(20),
            &format!("{}'s relaying process says goodbye", self.name),
            || !is_online(relay, &self.name),
        );
        (exit.trim().parse().unwrap(), String::new())
    }
}

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
    let tmux = Tmux {
        dir: relay.dir.path(),
    };
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
        history(&relay),
        vec![
            ("Alice".into(), "Bob".into(), "hello from alice".into()),
            ("Bob".into(), "Alice".into(), "thanks for the hello".into()),
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

#[test]
fn two_agents_converse_in_a_pty() {
    conversation(Backend::Pty);
}

#[test]
fn two_agents_converse_in_tmux_sessions() {
    conversation(Backend::Tmux);
}

/// The pane a person sees the agent in, and types into: under the PTY backend a person's
/// terminal (a private tmux server) running `agent-relay -n NAME ...`, under tmux the agent's
/// own session.
struct PersonPane<'a> {
    relay: &'a Relay,
    /// (tmux server for `-L`, target): the person's terminal, or the agent's session.
    server: Option<&'static str>,
    target: String,
    _terminal: Option<crate::wrap::PersonTerminal>,
}

impl PersonPane<'_> {
    fn run(&self, args: &[&str]) -> std::process::Output {
        let dir = self.relay.dir.path();
        match self.server {
            Some(server) => crate::wrap::tmux_in(dir, server, args),
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
            _terminal: Some(crate::wrap::person_terminal(
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
                target: format!("={}:", dana.session.unwrap()),
                _terminal: None,
            }
        }
    };
    let tmux = Tmux { dir };
    wait_online(&relay, "Dana");
    crate::tmux::wait_or_dump(&relay, &tmux, "Dana's prompt", || {
        pane.text().contains("> ")
    });

    // A person starts a line and stops to think.
    pane.keys(&["-l", "half a thought"]);
    crate::tmux::wait_or_dump(&relay, &tmux, "the person's text shows", || {
        pane.text().contains("> half a thought")
    });
    let first = ok_stdout(&relay.cli(&["send", "Dana", "first relayed note", "--json"]));
    let first: Value = serde_json::from_str(&first).unwrap();
    let first_id = first["id"].as_str().unwrap().to_owned();
    // The wrapper logs the moment the message came due (output quiet) and was held for the
    // person's line (their keys under the PTY, the input line under tmux): a wrapper that
    // typed over a person would type at that moment instead.
    let log = relay.data_dir().join("team/Dana/wrap.log");
    let queued = format!("a message waits to be typed id={first_id}");
    crate::tmux::wait_or_dump(
        &relay,
        &tmux,
        "the wrapper holds the note for the person",
        || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            text.find(&queued).is_some_and(|at| {
                text[at..].contains("a message is due; held while a person has a half-written line")
                    || text[at..].contains("not ready for a message why=InputNotEmpty")
                    || text[at..].contains("typing a message")
            })
        },
    );
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        !text.contains(&format!("typing a message id={first_id}")),
        "typed over a person:\n{text}"
    );
    let shown = pane.text();
    assert!(
        !shown.contains("Relay message"),
        "typed over a person:\n{shown}"
    );
    assert!(
        shown.lines().any(|l| l.trim_end() == "> half a thought"),
        "the person's line changed:\n{shown}"
    );
    let status = |id: &str| {
        let v: Value =
            serde_json::from_slice(&relay.cli(&["read", id, "--json"]).stdout).unwrap_or_default();
        v["deliveries"][0]["status"]
            .as_str()
            .unwrap_or("")
            .to_owned()
    };
    assert_eq!(status(&first_id), "queued");
    // The dashboard says why (never what the person typed).
    let (port, token) = crate::support::dashboard(&relay);
    let dana = crate::wrap::wait_shown(port, &token, "Dana", "blocked");
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
    crate::tmux::wait_or_dump(&relay, &tmux, "the relayed note arrives", || {
        pane.text().contains("first relayed note")
    });
    crate::tmux::wait_or_dump(&relay, &tmux, "the note is reported verified", || {
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
    crate::wrap::wait_shown(port, &token, "Dana", "idle");
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
    let second = ok_stdout(&relay.cli(&["send", "Dana", "second relayed note", "--json"]));
    let second: Value = serde_json::from_str(&second).unwrap();
    let second_id = second["id"].as_str().unwrap().to_owned();
    let line = format!(
        "got: Relay message from human [{}]: second relayed note",
        relay_protocol::short_id(&second_id)
    );
    crate::tmux::wait_or_dump(&relay, &tmux, "the second note is submitted", || {
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

#[test]
fn a_persons_line_in_a_pty_is_never_typed_over() {
    a_persons_line(Backend::Pty);
}

#[test]
fn a_persons_line_and_copy_mode_in_a_tmux_pane_are_respected() {
    a_persons_line(Backend::Tmux);
}

/// The parser reads the agent's terminal at its width, and follows a resize: a TUI (the
/// `codex` parse profile breaks its own lines) prints a directive whose next row, at the
/// directive's indentation, is a new line at one width and the rest of a wrapped line at a
/// narrower one. PTY: the person's terminal is resized (the wrapper hears SIGWINCH); tmux: the
/// agent's window (the relaying process hears `%layout-change`).
fn a_resized_terminal(backend: Backend) {
    let relay = Relay::start();
    let dir = relay.dir.path();
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
                _terminal: Some(crate::wrap::person_terminal(
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
                target: format!("={}:", alice.session.unwrap()),
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

#[test]
fn a_resized_pty_is_read_at_its_new_width() {
    a_resized_terminal(Backend::Pty);
}

#[test]
fn a_resized_tmux_window_is_read_at_its_new_width() {
    a_resized_terminal(Backend::Tmux);
}
