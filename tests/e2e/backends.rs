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
