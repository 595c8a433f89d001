//! Real agent CLIs (Claude Code, Codex, Gemini) under the real wrapper, against the local
//! stand-in API: how each is set up and started, and what its turns show.

use super::*;
use relay_standin::{Script, StandIn};

/// Any key does for the stand-in; Claude Code asks once per key unless it is pre-approved.
pub(crate) const KEY: &str = "sk-ant-api03-standin-00000000000000000000abcdefghij";

/// Generous: an agent CLI's start-up and a few turns on a loaded 2-core machine. Only bounds a
/// hang.
pub(crate) const LONG: Duration = Duration::from_secs(90);

/// The agent CLIs these tests run, at the versions `scripts/install-agents` pins.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Cli {
    Claude,
    Codex,
    Gemini,
}

impl Cli {
    /// (npm package, version, executable, variable naming it, install argument).
    fn install(
        self,
    ) -> (
        &'static str,
        &'static str,
        &'static str,
        &'static str,
        &'static str,
    ) {
        match self {
            Self::Claude => (
                "@anthropic-ai/claude-code",
                "2.1.328",
                "claude",
                "AGENT_RELAY_CLAUDE",
                "claude",
            ),
            Self::Codex => (
                "@openai/codex",
                "0.169.0",
                "codex",
                "AGENT_RELAY_CODEX",
                "codex",
            ),
            Self::Gemini => (
                "@google/gemini-cli",
                "0.61.0",
                "gemini",
                "AGENT_RELAY_GEMINI",
                "gemini",
            ),
        }
    }

    /// The executable: `$AGENT_RELAY_<CLI>`, else where `scripts/install-agents` puts it.
    /// Missing, the test fails saying how to install it.
    pub(crate) fn path(self) -> PathBuf {
        let (package, version, exe, var, arg) = self.install();
        if let Some(p) = std::env::var_os(var) {
            let p = PathBuf::from(p);
            assert!(
                p.exists(),
                "{var}={} does not exist; run `eval \"$(scripts/install-agents {arg})\"`",
                p.display()
            );
            return p;
        }
        let cache = std::env::var_os("AGENT_RELAY_AGENTS_DIR")
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/agent-relay/agents"))
            })
            .unwrap_or_default();
        let p = cache.join(format!("{package}@{version}/node_modules/.bin/{exe}"));
        assert!(
            p.exists(),
            "{package} {version} is not installed (looked for ${var} and {}).\n\
             Install it with `eval \"$(scripts/install-agents {arg})\"` (downloads it from the \
             npm registry once; .ci/run does this).",
            p.display()
        );
        p
    }

    /// Writes the CLI's configuration into `home` for a returning user who trusts `work` and
    /// talks to `url`; returns the environment to start it with.
    pub(crate) fn setup(self, home: &Path, work: &Path, url: &str) -> String {
        match self {
            Self::Claude => {
                let approved = &KEY[KEY.len() - 20..];
                let config = serde_json::json!({
                    "hasCompletedOnboarding": true,
                    "customApiKeyResponses": {"approved": [approved], "rejected": []},
                    "projects": {work.to_str().unwrap(): {
                        "hasTrustDialogAccepted": true,
                        "hasCompletedProjectOnboarding": true,
                    }},
                });
                std::fs::write(home.join(".claude.json"), config.to_string()).unwrap();
                format!(
                    "ANTHROPIC_BASE_URL='{url}' ANTHROPIC_API_KEY='{KEY}' DISABLE_AUTOUPDATER=1 \
                     CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1"
                )
            }
            Self::Codex => {
                // A custom provider on the Responses API (Codex 0.169 has no other wire API
                // for custom providers).
                let config = format!(
                    "model = \"gpt-standin\"\nmodel_provider = \"standin\"\n\
                     check_for_update_on_startup = false\n\n\
                     [model_providers.standin]\nname = \"standin\"\nbase_url = \"{url}/v1\"\n\
                     env_key = \"STANDIN_API_KEY\"\nwire_api = \"responses\"\n\n\
                     [projects.\"{}\"]\ntrust_level = \"trusted\"\n\n\
                     [tui]\nscreen_reader_detection_done = true\n",
                    work.display()
                );
                std::fs::write(home.join("config.toml"), config).unwrap();
                format!("CODEX_HOME='{}' STANDIN_API_KEY=standin", home.display())
            }
            Self::Gemini => {
                std::fs::create_dir_all(home.join(".gemini")).unwrap();
                let settings = serde_json::json!({
                    "security": {"auth": {"selectedType": "gemini-api-key"},
                                 "folderTrust": {"enabled": false}},
                    "ui": {"theme": "Default"},
                    "general": {"disableAutoUpdate": true, "disableUpdateNag": true},
                    "privacy": {"usageStatisticsEnabled": false},
                });
                std::fs::write(home.join(".gemini/settings.json"), settings.to_string()).unwrap();
                format!("GEMINI_API_KEY=standin GOOGLE_GEMINI_BASE_URL='{url}'")
            }
        }
    }

    fn profile(self) -> &'static str {
        match self {
            Self::Claude => "claude",
            Self::Codex => "codex",
            Self::Gemini => "gemini",
        }
    }
}

/// One agent CLI under the relay, in its own tmux terminal, with its own stand-in.
pub(crate) struct Agent<'r> {
    relay: &'r Relay,
    name: String,
    home: PathBuf,
    server: String,
    /// `pty` or `tmux`: the wrapper's backend.
    backend: String,
    pub(crate) standin: StandIn,
    /// Kills the terminal's tmux server last (after `Drop` has shown its screen on failure).
    _terminal: PersonTerminal,
}

/// Where and how an [`Agent`] runs: its backend, its HOME and working directory (folders under
/// the relay's directory), and more options for `wrap` and for the CLI (pieces of shell
/// command line).
struct Place<'a> {
    backend: &'a str,
    home: &'a str,
    work: &'a str,
    wrap_args: &'a str,
    cli_args: &'a str,
}

impl<'r> Agent<'r> {
    /// Claude Code under the relay.
    pub(crate) fn claude(relay: &'r Relay, name: &str, script: Script) -> Self {
        Self::start(relay, Cli::Claude, name, script)
    }

    /// Claude Code under the relay's tmux backend: run from a terminal that is itself a tmux
    /// pane, the wrapper starts the agent's session on that tmux server and switches the
    /// person's client to it, as it would for someone working inside tmux.
    pub(crate) fn claude_in_tmux(relay: &'r Relay, name: &str, script: Script) -> Self {
        Self::start_on(relay, Cli::Claude, name, script, "tmux")
    }

    /// Starts `agent-relay wrap -n NAME --profile P -- CLI` in a fresh terminal, with a private
    /// HOME set up as a returning user (no onboarding, trusted folder, approved key).
    pub(crate) fn start(relay: &'r Relay, cli: Cli, name: &str, script: Script) -> Self {
        Self::start_on(relay, cli, name, script, "pty")
    }

    pub(crate) fn start_on(
        relay: &'r Relay,
        cli: Cli,
        name: &str,
        script: Script,
        backend: &str,
    ) -> Self {
        let (home, work) = (format!("home-{name}"), format!("work-{name}"));
        Self::start_in(relay, cli, name, script, backend, (&home, &work))
    }

    /// [`Agent::start_on`] with HOME and working directory `(home, work)` (folders under the
    /// relay's temporary directory), which other agents may share, as one person's agents in
    /// one repository do.
    pub(crate) fn start_in(
        relay: &'r Relay,
        cli: Cli,
        name: &str,
        script: Script,
        backend: &str,
        (home, work): (&str, &str),
    ) -> Self {
        let place = Place {
            backend,
            home,
            work,
            wrap_args: "",
            cli_args: "",
        };
        Self::start_args(relay, cli, name, script, place)
    }

    /// [`Agent::start`] (PTY backend) with more options for `wrap` and for the CLI, each a
    /// piece of shell command line.
    pub(crate) fn start_with(
        relay: &'r Relay,
        cli: Cli,
        name: &str,
        script: Script,
        (wrap_args, cli_args): (&str, &str),
    ) -> Self {
        let (home, work) = (format!("home-{name}"), format!("work-{name}"));
        let place = Place {
            backend: "pty",
            home: &home,
            work: &work,
            wrap_args,
            cli_args,
        };
        Self::start_args(relay, cli, name, script, place)
    }

    fn start_args(
        relay: &'r Relay,
        cli: Cli,
        name: &str,
        script: Script,
        place: Place<'_>,
    ) -> Self {
        let Place {
            backend,
            home,
            work,
            wrap_args,
            cli_args,
        } = place;
        let exe = cli.path();
        let standin = StandIn::start(script).unwrap();
        let dir = relay.dir.path();
        let home = dir.join(home);
        let work = dir.join(work);
        std::fs::create_dir_all(&home).unwrap();
        std::fs::create_dir_all(&work).unwrap();
        let env = cli.setup(&home, &work, &standin.base_url());
        let server = format!("agent-{}", name.to_lowercase());
        let terminal = person_terminal(
            relay,
            &server,
            &format!(
                "cd '{work}' && HOME='{home}' {env} AGENT_RELAY_LOG=debug \
                 {{bin}} wrap --backend {backend} -n {name} --profile {profile} {wrap_args} -- '{exe}' {cli_args}",
                work = work.display(),
                home = home.display(),
                profile = cli.profile(),
                exe = exe.display(),
            ),
        );
        Self {
            relay,
            name: name.to_owned(),
            home,
            server,
            backend: backend.to_owned(),
            standin,
            _terminal: terminal,
        }
    }

    /// This agent's stand-in model.
    pub(crate) fn standin(&self) -> &StandIn {
        &self.standin
    }

    pub(crate) fn tmux(&self, args: &[&str]) -> std::process::Output {
        tmux_in(self.relay.dir.path(), &self.server, args)
    }

    pub(crate) fn pane(&self) -> String {
        String::from_utf8_lossy(&self.tmux(&["capture-pane", "-p"]).stdout).into_owned()
    }

    /// Until the agent is connected to the relay and Claude Code shows its empty input box.
    pub(crate) fn wait_ready(&self) {
        wait_online(self.relay, &self.name);
        wait_for(
            LONG,
            &format!("{}'s Claude Code is ready", self.name),
            || {
                // 2.1.197's idle footer; 2.1.328 starts in auto mode and shows that instead.
                let pane = self.pane();
                pane.contains("? for shortcuts") || pane.contains("shift+tab to cycle")
            },
        );
    }

    /// The person's terminal is resized to `cols` × `rows`.
    pub(crate) fn resize(&self, cols: u16, rows: u16) {
        let (x, y) = (cols.to_string(), rows.to_string());
        self.tmux(&["resize-window", "-x", &x, "-y", &y]);
    }

    /// What the person's terminal shows now.
    pub(crate) fn screen(&self) -> String {
        self.pane()
    }

    /// A person types `text` into this terminal and presses Enter (a separate key, once the
    /// text shows).
    pub(crate) fn person_types(&self, text: &str) {
        self.tmux(&["send-keys", "-l", text]);
        wait_for(LONG, &format!("{text:?} shows in {}", self.name), || {
            self.pane().contains(text)
        });
        self.tmux(&["send-keys", "Enter"]);
    }

    /// The conversation turns Claude Code sent so far: what this agent was asked, in order.
    pub(crate) fn prompts(&self) -> Vec<String> {
        self.standin.prompts()
    }

    /// Waits until `n` turns were asked; returns them.
    pub(crate) fn wait_prompts(&self, n: usize) -> Vec<String> {
        wait_for(LONG, &format!("{} is asked {n} prompts", self.name), || {
            self.prompts().len() >= n
        });
        self.prompts()
    }

    /// Waits until every reply this agent was given has been streamed out in full.
    pub(crate) fn wait_replies_done(&self) {
        wait_for(LONG, &format!("{}'s replies are out", self.name), || {
            self.standin.requests().iter().all(|r| r.finished.is_some())
        });
    }

    /// This agent's wrapper's log (`AGENT_RELAY_LOG=debug`).
    pub(crate) fn wrap_log(&self) -> String {
        std::fs::read_to_string(
            self.relay
                .data_dir()
                .join(format!("team/{}/wrap.log", self.name)),
        )
        .unwrap_or_default()
    }

    /// Waits until the agent's screen shows `last` (the end of its last reply) and no busy
    /// marker (its turn is over), then until its wrapper has read all that output, let it
    /// settle and relayed every directive in it with its receipt back: the wrapper logs
    /// `output settled; every directive in it relayed read=N` once per burst of output when
    /// that is so, `N` the bytes read, and `output after a quiet
    /// spell read=N` when a new burst starts (PTY: before the person's screen shows any of
    /// it). Whatever the output seen so far could make the wrapper send (a repaint read
    /// twice, a directive from the transcript) is then stored in the relay's history: this
    /// event comes after it, so a test can count the history with no observation window.
    pub(crate) fn wait_all_relayed(&self, last: &str) {
        self.wait_all_relayed_when(&format!("{last:?}, not busy"), |pane| {
            pane.contains(last)
                && !pane.contains("esc to interrupt")
                && !pane.contains("esc to cancel")
        });
    }

    /// [`Agent::wait_all_relayed`] once the screen is as `screen` says (`what`).
    pub(crate) fn wait_all_relayed_when(&self, what: &str, screen: impl Fn(&str) -> bool) {
        wait_for(
            LONG,
            &format!("{}'s screen shows {what}", self.name),
            || screen(&self.pane()),
        );
        const SETTLED: &str = "output settled; every directive in it relayed";
        if self.backend == "tmux" {
            // The wrapper reads the pane's output from its control-mode client as tmux draws
            // it; a settled line after the last burst's start, with the wrapper's checkpoint
            // (saved once all it read is relayed) at the pane's cursor row, comes after it
            // read what the screen showed.
            let team = self.relay.data_dir().join(format!("team/{}", self.name));
            wait_for(
                LONG,
                &format!("{}'s wrapper has relayed all it read", self.name),
                || {
                    // The pane the person's client shows (as `pane` reads it): the agent's.
                    let out = self.tmux(&["display-message", "-p", "#{history_size} #{cursor_y}"]);
                    let row: u64 = String::from_utf8_lossy(&out.stdout)
                        .split_whitespace()
                        .map(|n| n.parse::<u64>().unwrap_or(0))
                        .sum();
                    let checkpoint =
                        std::fs::read_to_string(team.join("checkpoint")).unwrap_or_default();
                    checkpoint.split_whitespace().next() == Some(row.to_string().as_str())
                        && self
                            .wrap_log()
                            .lines()
                            .rev()
                            .find(|l| {
                                l.contains(SETTLED) || l.contains("output after a quiet spell")
                            })
                            .is_some_and(|l| l.contains(SETTLED))
                },
            );
        } else {
            // PTY: every burst's start is logged before its first byte reaches the screen,
            // so a settled line after the last such start was logged after everything the
            // screen showed was read.
            wait_for(
                LONG,
                &format!("{}'s wrapper has relayed all it read", self.name),
                || {
                    self.wrap_log()
                        .lines()
                        .rev()
                        .find(|l| l.contains(SETTLED) || l.contains("output after a quiet spell"))
                        .is_some_and(|l| l.contains(SETTLED))
                },
            );
        }
    }
}

impl Drop for Agent<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = std::fs::read_to_string(
                self.relay
                    .data_dir()
                    .join(format!("team/{}/wrap.log", self.name)),
            )
            .unwrap_or_default();
            let requests: Vec<String> = self
                .standin
                .requests()
                .iter()
                .map(|r| format!("{:?} {} {:?}", r.kind, r.path, r.user_text))
                .collect();
            eprintln!(
                "---- {} screen ----\n{}\n---- {} requests ----\n{requests:#?}\n\
                 ---- wrapper log ----\n{log}",
                self.name,
                self.pane(),
                self.name,
            );
        }
        // The wrapper gets SIGHUP and takes the CLI with it.
        self.tmux(&["kill-server"]);
        kill_leftovers(&self.home);
    }
}

/// Kills what an agent CLI left running on its own: Codex 0.169 starts a detached
/// `codex app-server` daemon from `$CODEX_HOME/packages` that outlives its TUI. Anything whose
/// command line names this agent's private HOME (a fresh temporary directory) is one of those.
pub(crate) fn kill_leftovers(home: &Path) {
    let needle = home.to_string_lossy().into_owned();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in procs.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(&needle) {
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::Kill);
            }
        }
    }
}

/// Claude Code in print mode (`claude -p PROMPT`), in a fresh HOME under `dir`, talking to
/// `standin`, with `args` before the prompt; waits for it to exit and returns its output.
pub(crate) fn claude_print(
    relay: &Relay,
    standin: &relay_standin::StandIn,
    args: &[&str],
    prompt: &str,
) -> std::process::Output {
    let dir = relay.dir.path();
    let (home, work) = (dir.join("home-print"), dir.join("work-print"));
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    let env = Cli::Claude.setup(&home, &work, &standin.base_url());
    let mut cmd = Command::new(Cli::Claude.path());
    for pair in env.split_whitespace() {
        let (k, v) = pair.split_once('=').unwrap();
        cmd.env(k, v.trim_matches('\''));
    }
    cmd.env("HOME", &home)
        .env("AGENT_RELAY_SOCKET", &relay.socket)
        .env("AGENT_RELAY_DATA_DIR", relay.data_dir())
        .current_dir(&work)
        .args(args)
        .args(["-p", prompt])
        .stdin(Stdio::null());
    let out = cmd.output().unwrap();
    ok_stdout(&out);
    out
}

/// Real Claude Code wrapped as Bob with the relay's hooks installed, in a turn a person
/// started ("write the report") whose answer the stand-in holds until released.
pub(crate) fn claude_bob_held_in_a_turn(relay: &Relay) -> Agent<'_> {
    use {Agent, Cli};
    let work = relay.dir.path().join("work-Bob");
    std::fs::create_dir_all(&work).unwrap();
    hooks(relay, &work, &["install", "claude"]);
    let bob = Agent::start(
        relay,
        Cli::Claude,
        "Bob",
        relay_standin::Script::new(vec![
            relay_standin::Rule::contains("write the report", "Report written.").held(),
        ]),
    );
    bob.wait_ready();
    bob.person_types("write the report");
    bob.wait_prompts(1);
    bob
}

/// What each main turn asked the model: the newest user message's texts, reminders and all.
/// Claude Code 2.1.328 gives a Stop hook's additional context to the model as a reminder,
/// `Stop hook additional context: TEXT`, in a user message of its own.
pub(crate) fn turns(standin: &relay_standin::StandIn) -> Vec<String> {
    standin
        .requests()
        .iter()
        .filter(|r| r.kind == relay_standin::Kind::Main)
        .map(|r| {
            let last = r.body["messages"]
                .as_array()
                .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
                .cloned()
                .unwrap_or_default();
            message_texts(&serde_json::json!({ "messages": [last] }))
        })
        .collect()
}

/// The `tool_result` texts of the stand-in's requests from `from` on.
pub(crate) fn tool_results(standin: &relay_standin::StandIn, from: usize) -> Vec<String> {
    standin.requests()[from..]
        .iter()
        .flat_map(|r| {
            r.body["messages"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|m| m["content"].as_array().into_iter().flatten())
                .filter(|b| b["type"] == "tool_result")
                .map(|b| b["content"].to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// `agent-relay hooks ARGS` in `dir`; its stdout (it must succeed).
pub(crate) fn hooks(relay: &Relay, dir: &std::path::Path, args: &[&str]) -> String {
    let out = relay
        .command()
        .current_dir(dir)
        .arg("hooks")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    ok_stdout(&out)
}

/// Real Claude Code in print mode as Alice, no wrapper, with the relay's hooks installed (its
/// own settings give its hooks her name, [`claude_print`] the relay), asked "hello there"
/// against `standin`; its output.
pub(crate) fn claude_print_as_alice_with_hooks(relay: &Relay, standin: &StandIn) -> Output {
    let work = relay.dir.path().join("work-print");
    std::fs::create_dir_all(&work).unwrap();
    hooks(relay, &work, &["install", "claude"]);
    // The hook learns the agent's name from AGENT_RELAY_NAME (a wrapper sets it; here Claude
    // Code's own settings give it to its hooks).
    let settings = json!({"env": {"AGENT_RELAY_NAME": "Alice"}}).to_string();
    claude_print(relay, standin, &["--settings", &settings], "hello there")
}

/// [`claude_print_as_alice_with_hooks`] against a stand-in that holds its answer to "hello
/// there": while its model works on that, `meanwhile` runs, then the turn goes on. Returns
/// what `meanwhile` returned, Claude Code's output and the stand-in.
pub(crate) fn claude_print_with_hooks<T: Send>(
    relay: &Relay,
    meanwhile: impl FnOnce() -> T + Send,
) -> (T, Output, StandIn) {
    let standin = StandIn::start(Script::new(vec![
        relay_standin::Rule::contains("Relay message from Bob", "Looked at it."),
        relay_standin::Rule::contains("hello there", "Hello.").held(),
    ]))
    .unwrap();
    let (got, out) = std::thread::scope(|s| {
        let print = s.spawn(|| claude_print_as_alice_with_hooks(relay, &standin));
        wait_for(Duration::from_secs(60), "Alice's model is asked", || {
            !standin.prompts().is_empty()
        });
        let got = meanwhile();
        standin.release();
        (got, print.join().unwrap())
    });
    (got, out, standin)
}

/// Every text of a Messages API request's messages, reminders and all. Claude Code 2.1.328
/// puts a hook's additional context in a `system` message after the prompt:
/// `UserPromptSubmit hook additional context: TEXT`.
pub(crate) fn message_texts(body: &Value) -> String {
    let mut out = Vec::new();
    for msg in body["messages"].as_array().into_iter().flatten() {
        match &msg["content"] {
            Value::String(s) => out.push(s.as_str()),
            Value::Array(blocks) => out.extend(blocks.iter().filter_map(|b| b["text"].as_str())),
            _ => {}
        }
    }
    out.join("\n")
}

/// Runs `agent-relay hooks EVENT` for agent `name` (unwrapped) as Claude Code does: `input` on
/// stdin; fails unless it exits 0. Its stdout and stderr.
pub(crate) fn run_hook(relay: &Relay, name: &str, event: &str, input: &[u8]) -> (String, String) {
    use std::io::Write;
    let mut child = relay
        .command()
        .args(["hooks", event])
        .env("AGENT_RELAY_NAME", name)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The text of a prompt Claude Code sent, inside its own `<pasted_content id="...">` tags when
/// it handed the model a paste (the whole prompt otherwise).
pub(crate) fn pasted_inner(prompt: &str) -> &str {
    prompt
        .split_once("<pasted_content id=")
        .and_then(|(_, rest)| rest.split_once("\">\n"))
        .and_then(|(_, rest)| rest.rsplit_once("\n</pasted_content"))
        .map_or(prompt, |(inner, _)| inner)
}
