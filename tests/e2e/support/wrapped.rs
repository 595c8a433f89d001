//! Wrapped agents as tests run them: small shell-script agents under `agent-relay wrap`,
//! their output and exit, and whether the relay sees them online.

use super::*;

/// The line most script agents start with: their name, which a test can wait for.
pub(crate) const I_AM: &str = r#"echo "I am $AGENT_RELAY_NAME""#;

/// A profile directory in the relay's directory whose `generic` profile knows the dialog
/// "allow command?" (for `AGENT_RELAY_PROFILE_DIR`).
pub(crate) fn dialog_profiles(relay: &Relay) -> PathBuf {
    let profiles = relay.dir.path().join("profiles");
    std::fs::create_dir_all(&profiles).unwrap();
    relay.write("profiles/generic.toml", "dialogs = [\"allow command?\"]\n");
    profiles
}

/// Says who it is, then echoes what it reads.
pub(crate) const ECHOER: &str = r#"echo "I am $AGENT_RELAY_NAME"
while IFS= read -r line; do echo "got: $line"; done
"#;

/// A shell-script agent: runs `start`, then reads its terminal a line at a time, printing each
/// as `got: LINE` when `echo`, and runs the `case` arms `arms` (`PATTERN) COMMANDS;;` lines) on
/// it.
pub(crate) fn script_agent(start: &str, echo: bool, arms: &str) -> String {
    let echo = if echo { "  echo \"got: $line\"\n" } else { "" };
    format!(
        "{start}\nwhile IFS= read -r line; do\n{echo}  case \"$line\" in\n{arms}\n  esac\ndone\n"
    )
}

/// Bob: thanks Alice for her message and exits 0.
pub(crate) fn bob_script() -> String {
    script_agent(
        I_AM,
        true,
        r#"*"Relay message from Alice"*) echo "@relay:Alice thanks for the hello"; exit 0;;"#,
    )
}

/// Alice: says hello to Bob and exits 7 once he answers.
pub(crate) fn alice_script() -> String {
    script_agent(
        r#"echo "@relay:Bob hello from alice""#,
        true,
        r#"*"Relay message from Bob"*) exit 7;;"#,
    )
}

/// Starts `agent-relay ARGS` in the relay's directory (the agent scripts live there), with no
/// terminal and its output captured: a wrapped agent for [`output_of`]. Its log (stderr) goes
/// to the test's.
pub(crate) fn spawn_wrapped(relay: &Relay, args: &[&str]) -> Child {
    relay.spawn_cli(args, Stdio::inherit())
}

/// Writes `script` to `NAME.sh` in the relay's directory and starts `sh NAME.sh` wrapped as
/// `name` with `options` ([`spawn_wrapped`]: no terminal, its output captured).
pub(crate) fn spawn_script(relay: &Relay, name: &str, options: &[&str], script: &str) -> Child {
    let file = format!("{name}.sh");
    relay.write(&file, script);
    spawn_wrapped(relay, &wrap_args(name, options, &["sh", &file]))
}

/// `wrap` options: the PTY backend with no terminal on stdin and the generic profile.
pub(crate) const PTY_GENERIC: &[&str] = &["--backend", "pty", "--no-input", "--profile", "generic"];

/// `wrap` options: the tmux backend, returning once the agent runs in its session.
pub(crate) const TMUX_DETACHED: &[&str] = &["--backend", "tmux", "--detached"];

/// `wrap OPTIONS -n NAME -- COMMAND...`: the arguments that run `command` as agent `name`.
pub(crate) fn wrap_args<'a>(
    name: &'a str,
    options: &[&'a str],
    command: &[&'a str],
) -> Vec<&'a str> {
    let mut all = vec!["wrap"];
    all.extend_from_slice(options);
    all.extend(["-n", name, "--"]);
    all.extend_from_slice(command);
    all
}

/// Waits for a wrapped agent to exit (killing it after 90 s, so a lost message fails the test
/// instead of hanging it); its exit code and what it printed.
pub(crate) fn output_of(mut child: Child) -> (i32, String) {
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        let _ = stdout.read_to_string(&mut out);
        out
    });
    let deadline = relay_protocol::now_instant() + Duration::from_secs(90);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if relay_protocol::now_instant() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the wrapped agent did not exit within 90 s; it printed:\n{}",
                reader.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status.code().unwrap_or(-1), reader.join().unwrap())
}

/// Reads what the wrapped agent `child` (from [`spawn_wrapped`]) prints until `text` shows,
/// bounded at 60 s, and returns it; the rest is left for [`output_of`]. For a test whose
/// premise is something the agent does at its start (turning a terminal mode on): a loaded
/// machine may start the agent after the relay has it online and a message for it.
pub(crate) fn read_until(child: &mut Child, text: &str) -> String {
    let mut stdout = child.stdout.take().expect("the agent's output is captured");
    let want = text.as_bytes().to_vec();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (mut seen, mut byte) = (Vec::new(), [0u8; 1]);
        while !seen.ends_with(&want) && matches!(stdout.read(&mut byte), Ok(1)) {
            seen.push(byte[0]);
        }
        // The test may have given up waiting.
        tx.send((stdout, seen)).ok();
    });
    let (stdout, seen) = rx
        .recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("the wrapped agent did not print {text:?} within 60 s"));
    child.stdout = Some(stdout);
    let seen = String::from_utf8_lossy(&seen).into_owned();
    assert!(
        seen.contains(text),
        "the agent ended before it printed {text:?}: {seen}"
    );
    seen
}

/// `agent`'s row in the dashboard's `/api/agents`.
fn agent_view(port: u16, token: &str, agent: &str) -> Value {
    crate::support::api(port, token, "/api/agents")["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == agent)
        .cloned()
        .unwrap_or_default()
}

/// A person's half-written line is never typed over: the relayed message waits until the
/// line is submitted, then follows it.
/// Waits until the dashboard shows `agent` as `state`; returns its row then.
pub(crate) fn wait_shown(port: u16, token: &str, agent: &str, state: &str) -> Value {
    wait_for(
        Duration::from_secs(10),
        &format!("{agent} shows {state}"),
        || agent_view(port, token, agent)["state"] == state,
    );
    agent_view(port, token, agent)
}

pub(crate) fn is_online(relay: &Relay, name: &str) -> bool {
    let v: Value =
        serde_json::from_slice(&relay.cli(&["agents", "--json"]).stdout).unwrap_or_default();
    v.as_array()
        .is_some_and(|a| a.iter().any(|x| x["name"] == name && x["online"] == true))
}

pub(crate) fn wait_online(relay: &Relay, name: &str) {
    wait_for(
        Duration::from_secs(20),
        &format!("{name} is connected"),
        || is_online(relay, name),
    );
}

/// A wrapped agent that prints what it reads and exits once it has read `until`.
pub(crate) fn listener(relay: &Relay, name: &str, until: &str) -> Child {
    relay
        .command()
        .args(["wrap", "--no-input", "-n", name, "--", "sh", "-c"])
        .arg(format!(
            r#"while IFS= read -r l; do echo "got: $l"; case "$l" in *"{until}"*) exit 0;; esac; done"#
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Which terminal the agents run in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Backend {
    /// In a pseudo-terminal inside the wrapper's process (no terminal on stdin: `--no-input`).
    Pty,
    /// In a tmux session on the test's private server, relayed by a background process.
    Tmux,
}

/// A wrapped agent on either backend.
pub(crate) struct ScriptAgent {
    pub(crate) name: String,
    /// The wrapper's process (PTY).
    pub(crate) child: Option<Child>,
    /// The agent's session (tmux).
    pub(crate) session: Option<String>,
    /// What the command said (tmux: it returns once a process relays for the session).
    pub(crate) said: String,
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
    ) -> ScriptAgent {
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
            Backend::Pty => ScriptAgent {
                name: name.to_owned(),
                child: Some({
                    // Its log where the tmux backend's relaying process keeps its own (a PTY
                    // wrapper with no terminal logs to stderr), for the scenarios to wait on.
                    let team = relay.data_dir().join(format!("team/{name}"));
                    std::fs::create_dir_all(&team).unwrap();
                    let log = append_log(&team.join("wrap.log"));
                    cmd.stdout(std::process::Stdio::piped())
                        .stderr(log)
                        .spawn()
                        .unwrap()
                }),
                session: None,
                said: String::new(),
            },
            Backend::Tmux => {
                let out = cmd.output().unwrap();
                let err = String::from_utf8_lossy(&out.stderr);
                assert!(out.status.success(), "{err}");
                assert!(
                    err.contains(&format!("attach with: agent-relay attach {name}")),
                    "{err}"
                );
                ScriptAgent {
                    name: name.to_owned(),
                    child: None,
                    session: Some(session_of(relay, name)),
                    said: err.into_owned(),
                }
            }
        }
    }
}

impl ScriptAgent {
    /// Waits for the agent to exit and its relaying to end; its exit status (the wrapper's
    /// under the PTY, the one the session's shell kept under tmux) and, for the PTY, what it
    /// printed.
    pub(crate) fn exit(&mut self, relay: &Relay, tmux: &Tmux<'_>) -> (i32, String) {
        if let Some(child) = self.child.take() {
            return output_of(child);
        }
        let session = self.session.clone().unwrap();
        crate::support::wait_or_dump(relay, tmux, &format!("{} exits", self.name), || {
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

    /// SIGKILL, no cleanup, to the wrapper (PTY: the agent, its child on a terminal it owns,
    /// ends with it) or to the process relaying for the session (tmux: the agent runs on in
    /// it); returns once the relay has seen the agent go.
    pub(crate) fn kill9(&mut self, relay: &Relay) {
        match self.child.take() {
            Some(mut child) => {
                kill9_child(&mut child);
            }
            None => {
                let lock = relay
                    .data_dir()
                    .join(format!("team/{}/relay.lock", self.name));
                signal_pid(pid_in(&lock), rustix::process::Signal::Kill);
            }
        }
        wait_for(
            Duration::from_secs(20),
            &format!("{} is seen offline", self.name),
            || !is_online(relay, &self.name),
        );
    }
}

impl Drop for ScriptAgent {
    /// A wrapper still running when the test ends (or fails) is killed: nothing is left behind.
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
