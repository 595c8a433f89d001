//! Issue 15, digests and notices (`wrap --delivery digest|notice`): messages that waited for a
//! busy agent go in as one prompt, each still recorded and acknowledged on its own; with the
//! MCP door, only a one-line notice is typed and the tool hands the message over exactly.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use relay_standin::{Rule, Script};

use crate::support::*;

/// Bounds a hang only (an agent CLI starting on a loaded 2-core machine).
const LONG: Duration = Duration::from_secs(90);

/// A wrapper child process, killed when dropped (a failing test leaves nothing running).
struct Wrapped {
    child: Child,
    log: PathBuf,
    out: PathBuf,
}

impl Wrapped {
    /// `agent-relay wrap --no-input --backend pty -n NAME WRAP_ARGS -- sh SCRIPT`, its output
    /// (what the agent printed, and the echo of what was typed) and its debug log in files.
    fn start(relay: &Relay, name: &str, wrap_args: &[&str], script: &str) -> Self {
        let dir = relay.dir.path();
        let file = dir.join(format!("{name}.sh"));
        std::fs::write(&file, script).unwrap();
        let (out, log) = (
            dir.join(format!("{name}.out")),
            dir.join(format!("{name}.log")),
        );
        let child = relay
            .command()
            .env("AGENT_RELAY_LOG", "debug")
            .args(["wrap", "--no-input", "--backend", "pty", "-n", name])
            .args(wrap_args)
            .arg("--")
            .arg("sh")
            .arg(&file)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Self { child, log, out }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The lines the agent printed that start with `got: ` (what it read), in order.
    fn got(&self) -> Vec<String> {
        read_lines(&self.out)
            .into_iter()
            .filter_map(|l| l.strip_prefix("got: ").map(str::to_owned))
            .collect()
    }
}

impl Drop for Wrapped {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "---- agent output ----\n{}\n---- wrapper log ----\n{}",
                read_lines(&self.out).join("\n"),
                self.log()
            );
        }
    }
}

fn read_lines(path: &Path) -> Vec<String> {
    String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default())
        .split(['\r', '\n'])
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

fn short(id: &str) -> &str {
    relay_protocol::short_id(id)
}

/// How many log lines say `what` for message `id`.
fn logged(log: &str, what: &str, id: &str) -> usize {
    let id = format!("id={id}");
    log.lines()
        .filter(|l| l.contains(what) && l.contains(&id))
        .count()
}

const BODIES: [&str; 3] = [
    "First: rename the crate.",
    "Second:\n  - update the docs\n  - bump the version",
    "Third: tag the release.",
];

/// A scripted agent (generic profile: one line per prompt) shows a busy marker until the test
/// lets it go; three messages arrive meanwhile. With `--delivery digest` it reads them as one
/// line, a header and each message in its usual form (the multi-line one flattened, with
/// where its exact text is), and each is reported verified, once. Before digests, it read
/// three lines.
#[test]
fn a_busy_scripted_agent_gets_three_waiting_messages_as_one_prompt() {
    let relay = Relay::start();
    let go = relay.dir.path().join("go");
    let script = format!(
        "printf 'working (esc to interrupt)'\n\
         while [ ! -e '{}' ]; do sleep 0.05; done\n\
         printf '\\r\\033[K'\n\
         while IFS= read -r line; do echo \"got: $line\"; done\n",
        go.display()
    );
    let bob = Wrapped::start(&relay, "Bob", &["--delivery", "digest"], &script);
    wait_online(&relay, "Bob");
    let ids: Vec<String> = BODIES.iter().map(|b| cli_send(&relay, "Bob", b)).collect();
    // All three wait in the wrapper (the busy marker holds them); then the agent is let go.
    wait_for(LONG, "the wrapper holds the three messages", || {
        let log = bob.log();
        ids.iter()
            .all(|id| logged(&log, "a message waits to be typed", id) == 1)
    });
    std::fs::write(&go, "").unwrap();
    wait_for(LONG, "each message is reported verified", || {
        ids.iter()
            .all(|id| delivery_status(&relay, id) == "verified")
    });
    let [s0, s1, s2] = [0, 1, 2].map(|i| short(&ids[i]));
    let ([b0, _, b2], id1) = (BODIES, &ids[1]);
    let expected = format!(
        "3 relay messages: Relay message from human [{s0}]: {b0} | \
         Relay message from human [{s1}]: Second:   - update the docs   - bump the version (its \
         line breaks are shown as spaces here; exact text: agent-relay read {id1}) | \
         Relay message from human [{s2}]: {b2}"
    );
    assert_eq!(bob.got(), [expected], "one prompt with all three");
    let log = bob.log();
    for id in &ids {
        assert_eq!(logged(&log, "typing a message", id), 1, "typed once: {id}");
    }
    let h = history(&relay);
    assert_eq!(h.len(), 3, "{h:?}");
    assert!(
        h.iter()
            .zip(BODIES)
            .all(|(m, body)| m.to == "Bob" && m.body == body),
        "{h:?}"
    );
}

/// Bob, a scripted agent with his MCP server in his session (as his CLI would start it, issue
/// 23.1), under `--delivery DELIVERY`, shows a busy marker; a message comes and waits in the
/// wrapper; relay_inbox shows it, exactly, and it is verified; then Bob is let go. Returns
/// Bob, his MCP client and the message's id.
fn shown_while_busy(relay: &Relay, delivery: &str) -> (Wrapped, crate::support::Mcp, String) {
    let go = relay.dir.path().join("go");
    let pipes = crate::support::SessionPipes::new(relay, "Bob");
    let script = format!(
        "{}\n\
         printf 'working (esc to interrupt)'\n\
         while [ ! -e '{}' ]; do sleep 0.05; done\n\
         printf '\\r\\033[K'\n\
         while IFS= read -r line; do echo \"got: $line\"; done\n",
        pipes.background(),
        go.display()
    );
    let bob = Wrapped::start(relay, "Bob", &["--delivery", delivery], &script);
    let mut mcp = pipes.connect();
    wait_online(relay, "Bob");
    // Busy: the message waits in the wrapper; the tool shows it first.
    let early = cli_send(relay, "Bob", BODIES[0]);
    wait_for(LONG, "the wrapper holds the message", || {
        logged(&bob.log(), "a message waits to be typed", &early) == 1
    });
    let (error, text) = mcp.tool("relay_inbox", serde_json::json!({}));
    assert!(!error, "{text}");
    assert!(
        text.contains(&format!("[{early}] from human to Bob:\n{}", BODIES[0])),
        "{text}"
    );
    assert_eq!(delivery_status(relay, &early), "verified");
    std::fs::write(&go, "").unwrap();
    (bob, mcp, early)
}

/// With `--delivery notice`, a scripted agent is typed only a one-line notice; the message
/// is recorded injected (acked) until the agent's MCP server, under the wrapper, shows it with
/// relay_inbox, exactly, and then verified; a second relay_inbox shows nothing new. A message
/// the tool showed while the agent was busy (its notice not typed yet) is verified and gets no
/// notice. Before, the whole message was typed.
#[test]
fn a_notice_is_typed_and_relay_inbox_hands_the_message_over_and_verifies_it() {
    let relay = Relay::start();
    let (bob, mut mcp, early) = shown_while_busy(&relay, "notice");

    let body = BODIES[1];
    let id = cli_send(&relay, "Bob", body);
    let notice = format!(
        "1 relay message from human [{}] — call relay_inbox to read it",
        short(&id)
    );
    wait_for(LONG, "the notice is typed and injected", || {
        !bob.got().is_empty() && delivery_status(&relay, &id) == "acked"
    });
    // Only the second message's notice: the first needed none.
    assert_eq!(bob.got(), std::slice::from_ref(&notice));
    let (error, text) = mcp.tool("relay_inbox", serde_json::json!({}));
    assert!(!error, "{text}");
    assert!(
        text.starts_with("1 relay message:")
            && text.contains(&format!("[{id}] from human to Bob:\n{body}")),
        "{text}"
    );
    // The wrapper was told before the tool answered.
    assert_eq!(delivery_status(&relay, &id), "verified");
    assert_eq!(
        mcp.tool("relay_inbox", serde_json::json!({})).1,
        "No new relay messages."
    );
    assert_eq!(bob.got(), [notice], "no body typed, nothing typed twice");
    assert_eq!(logged(&bob.log(), "typing a message", &early), 0);
    assert_eq!(history(&relay).len(), 2);
}

/// One record whatever the door, with `--delivery each` (the default): a message waiting in
/// the wrapper (the agent busy) that the agent's MCP server shows with relay_inbox is handed
/// over by the wrapper itself, verified by the tool's door, and never typed after; once the
/// agent is free a later message is typed (store order: everything before it was dealt with),
/// and relay_inbox shows nothing again. Before, relay_inbox showed it from the store and the
/// wrapper typed it too.
#[test]
fn relay_inbox_under_a_wrapper_takes_a_message_the_wrapper_then_never_types() {
    let relay = Relay::start();
    let (bob, mut mcp, early) = shown_while_busy(&relay, "each");
    let later = cli_send(&relay, "Bob", BODIES[2]);
    wait_for(LONG, "the later message is typed and verified", || {
        delivery_status(&relay, &later) == "verified"
    });
    let got = bob.got();
    assert!(
        got.iter().any(|l| l.contains(BODIES[2])) && !got.iter().any(|l| l.contains(BODIES[0])),
        "typed: {got:?}"
    );
    assert_eq!(logged(&bob.log(), "typing a message", &early), 0);
    assert_eq!(
        mcp.tool("relay_inbox", serde_json::json!({})).1,
        "No new relay messages."
    );
}

/// A real CLI under `--delivery digest`, kept busy by a held reply while three messages come:
/// its next model request holds the three in one prompt, byte for byte, each typed once and
/// reported verified, stored once.
fn digest_of_three_sent_while_busy(cli: Cli, name: &str) {
    let relay = Relay::start();
    let bob = Agent::start_with(
        &relay,
        cli,
        name,
        Script::new(vec![
            Rule::contains("Index the repository", "Indexed.").held(),
        ]),
        ("--delivery digest", ""),
    );
    bob.wait_ready();
    bob.person_types("Index the repository");
    bob.wait_prompts(1);
    let ids: Vec<String> = BODIES.iter().map(|b| cli_send(&relay, name, b)).collect();
    // All three wait in the wrapper, none typed: the CLI is busy (a wrapper that looks at
    // the screen while it is sees it busy; Codex's busy screen animates faster than its
    // settle time, so there the wrapper does not even look). Were one typed before the
    // release, the single prompt below would not hold all three.
    wait_for(
        LONG,
        &format!("{name}'s wrapper holds the three while busy"),
        || {
            let log = bob.wrap_log();
            ids.iter().all(|id| {
                logged(&log, "a message waits to be typed", id) == 1
                    && logged(&log, "typing a message", id) == 0
            })
        },
    );
    bob.standin().release();
    let prompts = bob.wait_prompts(2);
    let [s0, s1, s2] = [0, 1, 2].map(|i| short(&ids[i]));
    let [b0, b1, b2] = BODIES;
    let expected = format!(
        "3 relay messages:\nRelay message from human [{s0}]: {b0}\nRelay message from human [{s1}]:\n{b1}\nRelay message from human [{s2}]: {b2}"
    );
    // Claude Code may hand a paste to the model inside its own `<pasted_content>` tags.
    let inner = pasted_inner(&prompts[1]);
    assert_eq!(inner, expected, "the prompt {name} sent: {:?}", prompts[1]);
    wait_for(LONG, "each message is reported verified", || {
        ids.iter()
            .all(|id| delivery_status(&relay, id) == "verified")
    });
    bob.wait_replies_done();
    bob.wait_all_relayed("OK.");
    assert_eq!(bob.prompts().len(), 2, "one prompt for the three");
    let log = bob.wrap_log();
    for id in &ids {
        assert_eq!(logged(&log, "typing a message", id), 1, "typed once: {id}");
    }
    assert_eq!(history(&relay).len(), 3);
}

tests_of! {
    digest_of_three_sent_while_busy {
        /// Real Claude Code 2.1.328 with `--delivery digest`: Bob works on a person's task (the
        /// stand-in holds the reply, so Claude Code shows its spinner); three messages arrive. When
        /// the turn is over, Bob's next model request holds all three in one prompt (a header, then
        /// each message as usual, the multi-line one with its lines), each is reported verified and
        /// stored once. Before digests, each was a prompt of its own.
        claude_code_gets_a_digest_of_three_messages_sent_while_it_was_busy(Cli::Claude, "Bob");
        /// [`claude_code_gets_a_digest_of_three_messages_sent_while_it_was_busy`] with Codex CLI
        /// 0.169.0 (busy: `esc to interrupt`).
        codex_gets_a_digest_of_three_messages_sent_while_it_was_busy(Cli::Codex, "Cody");
        /// [`claude_code_gets_a_digest_of_three_messages_sent_while_it_was_busy`] with Gemini CLI
        /// 0.61.0 (busy: `esc to cancel`).
        gemini_gets_a_digest_of_three_messages_sent_while_it_was_busy(Cli::Gemini, "Gemma");
    }
    reads_a_noticed_message_with_relay_inbox {
        /// Real Claude Code with the relay's MCP server (`--mcp-config`) under a wrapper with
        /// `--delivery notice`: the wrapper types only the one-line notice, the model calls
        /// relay_inbox (scripted by the stand-in), gets the exact multi-line body as the tool's
        /// result, and the message is reported verified, stored once, its body never typed.
        claude_code_reads_a_noticed_message_with_relay_inbox(Cli::Claude, "Bob");
        /// [`claude_code_reads_a_noticed_message_with_relay_inbox`] with Codex CLI 0.169.0: the
        /// server given with `-c mcp_servers.relay={...}` (what `codex mcp add` writes, and its
        /// tools approved), the stand-in calling `relay_inbox` in namespace `mcp__relay`.
        codex_reads_a_noticed_message_with_relay_inbox(Cli::Codex, "Cody");
        /// [`claude_code_reads_a_noticed_message_with_relay_inbox`] with Gemini CLI 0.61.0: the
        /// server in the project's `.gemini/settings.json` (what `gemini mcp add` writes, with
        /// `trust: true` so that Gemini does not ask), the stand-in calling
        /// `mcp_relay_relay_inbox`.
        gemini_reads_a_noticed_message_with_relay_inbox(Cli::Gemini, "Gemma");
    }
}

/// A real CLI with the relay's MCP server under a wrapper with `--delivery notice`: the
/// wrapper types only the one-line notice, the model calls relay_inbox (scripted by the
/// stand-in), gets the exact multi-line body as the tool's result, and the message is
/// reported verified, stored once, its body never typed.
fn reads_a_noticed_message_with_relay_inbox(cli: Cli, name: &str) {
    let relay = Relay::start();
    let dir = relay.dir.path();
    let env = serde_json::json!({
        "AGENT_RELAY_SOCKET": &relay.socket,
        "AGENT_RELAY_DATA_DIR": relay.data_dir(),
    });
    let (cli_args, tool) = match cli {
        Cli::Claude => {
            let config = dir.join(format!("mcp-{name}.json"));
            let mcp = serde_json::json!({"mcpServers": {"relay": {
                "type": "stdio", "command": BIN, "args": ["mcp", "--name", name], "env": env,
            }}});
            std::fs::write(&config, mcp.to_string()).unwrap();
            let args = format!(
                "--mcp-config '{}' --strict-mcp-config --allowedTools mcp__relay__relay_inbox",
                config.display()
            );
            (args, "mcp__relay__relay_inbox")
        }
        Cli::Codex => {
            // TOML strings written as JSON strings: the paths are plain.
            let server = format!(
                "mcp_servers.relay={{command={}, args=[\"mcp\", \"--name\", \"{name}\"], \
                 env={{AGENT_RELAY_SOCKET={}, AGENT_RELAY_DATA_DIR={}}}, \
                 env_vars=[\"AGENT_RELAY_NAME\", \"AGENT_RELAY_SESSION\"], \
                 default_tools_approval_mode=\"approve\"}}",
                serde_json::json!(BIN),
                env["AGENT_RELAY_SOCKET"],
                env["AGENT_RELAY_DATA_DIR"]
            );
            (format!("-c '{server}'"), "mcp__relay/relay_inbox")
        }
        Cli::Gemini => {
            // The project's settings (Agent::start_with writes the user's).
            let project = dir.join(format!("work-{name}/.gemini"));
            std::fs::create_dir_all(&project).unwrap();
            let settings = serde_json::json!({"mcpServers": {"relay": {
                "command": BIN, "args": ["mcp", "--name", name], "env": env, "trust": true,
            }}});
            std::fs::write(project.join("settings.json"), settings.to_string()).unwrap();
            (String::new(), "mcp_relay_relay_inbox")
        }
    };
    let bob = Agent::start_with(
        &relay,
        cli,
        name,
        Script::new(vec![
            Rule::contains("call relay_inbox", "Reading them.")
                .calling(tool, &serde_json::json!({})),
        ]),
        ("--delivery notice", &cli_args),
    );
    bob.wait_ready();
    let body = BODIES[1];
    let id = cli_send(&relay, name, body);
    let notice = format!(
        "1 relay message from human [{}] — call relay_inbox to read it",
        short(&id)
    );
    let prompts = bob.wait_prompts(1);
    assert_eq!(prompts[0], notice);
    // The tool's result, as Claude Code sent it back to the model.
    let want = serde_json::to_string(&format!("[{id}] from human to {name}:\n{body}")).unwrap();
    let want = want.trim_matches('"');
    wait_for(LONG, "the model is given relay_inbox's result", || {
        bob.standin()
            .requests()
            .iter()
            .any(|r| r.body.to_string().contains(want))
    });
    wait_for(LONG, "the message is reported verified", || {
        delivery_status(&relay, &id) == "verified"
    });
    bob.wait_replies_done();
    bob.wait_all_relayed("OK.");
    // The notice, then the tool's result going back to the model: the body was never typed.
    let prompts = bob.prompts();
    assert_eq!(prompts.len(), 2, "{prompts:#?}");
    assert_eq!(prompts[0], notice);
    let log = bob.wrap_log();
    assert_eq!(logged(&log, "typing a message", &id), 1);
    let h = history(&relay);
    assert_eq!(
        h.iter()
            .map(|m| (m.to.as_str(), m.body.as_str()))
            .collect::<Vec<_>>(),
        [(name, body)]
    );
}
