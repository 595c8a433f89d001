//! Issue 15, every door into an agent: directives that keep their lines, the MCP server, the
//! automatic teaching.

use std::process::{Command, Stdio};

use serde_json::Value;

use crate::support::*;

/// What an agent prints: a directive followed by text at its own indentation, one with a
/// code block and a list under it, one in a later indented paragraph.
const CONTINUATIONS: &str = "@relay:Bob hi\nDone.\n\n@relay:Bob run this:\n    fn main() {\n        println!(\"x\");\n    }\n- then test\nThat is all.\n\n  @relay:Carol steps:\n  1. build\n    more detail\n  Thanks.\n";

fn expected_bodies() -> Vec<(String, String)> {
    [
        ("Bob", "hi"),
        (
            "Bob",
            "run this:\n    fn main() {\n        println!(\"x\");\n    }\n- then test",
        ),
        ("Carol", "steps:\n1. build\n  more detail"),
    ]
    .into_iter()
    .map(|(a, b)| (a.to_owned(), b.to_owned()))
    .collect()
}

#[test]
fn continuation_lines_keep_their_breaks_and_a_line_at_the_directives_indent_ends_it() {
    let out = ok_stdout(&output_with_input(
        Command::new(BIN).args(["parse", "--json"]),
        CONTINUATIONS.replace('\n', "\r\n").as_bytes(),
    ));
    let got: Vec<(String, String)> = out
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (
                v["to"].as_str().unwrap().to_owned(),
                v["body"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(got, expected_bodies());
}

#[test]
fn a_wrapped_agents_directive_ends_at_a_line_at_its_own_indentation() {
    let relay = Relay::start();
    // Known recipients (a message for a name the relay never saw is refused).
    let _bob = relay.agent("Bob");
    let _carol = relay.agent("Carol");
    let script = format!("cat <<'EOF'\n{CONTINUATIONS}EOF\n");
    let out = relay.run_wrapped("Alice", "alice.sh", &script);
    assert!(out.status.success(), "{out:?}");
    let h: Value = serde_json::from_slice(&relay.cli(&["history", "--json"]).stdout).unwrap();
    // Newest first.
    let mut got = field_pairs(&h, "to", "body");
    got.reverse();
    assert_eq!(got, expected_bodies());
}

/// A 40-line indented code block: what a flattening door would mangle.
/// Message `id`, handed to wrapped Claude Code `bob` by one of its hooks, ends verified, its
/// trace delivered, then injected, then verified; `bob` has answered and its wrapper relayed
/// all it printed, and its model was asked `prompts` times. Returns the wrapper's log.
fn handed_over_by_a_hook(relay: &Relay, bob: &Agent<'_>, id: &str, prompts: usize) -> String {
    wait_for(
        std::time::Duration::from_secs(60),
        "the delivery is verified",
        || delivery_status(relay, id) == "verified",
    );
    let events = trace_events(relay, id);
    let states: Vec<&str> = events.iter().filter_map(|e| e["state"].as_str()).collect();
    let at = |s: &str| states.iter().position(|x| *x == s);
    assert!(
        at("delivered") < at("injected")
            && at("injected") < at("verified")
            && at("delivered").is_some(),
        "{states:?}"
    );
    bob.wait_replies_done();
    bob.wait_all_relayed("OK.");
    assert_eq!(
        bob.prompts().len(),
        prompts,
        "asked once: {:#?}",
        bob.prompts()
    );
    bob.wrap_log()
}

/// The commands of Claude Code settings `v`'s hooks for `event`, in order.
fn hook_commands<'a>(v: &'a Value, event: &str) -> Vec<&'a str> {
    v["hooks"][event]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["hooks"].as_array().unwrap())
        .map(|h| h["command"].as_str().unwrap())
        .collect()
}

/// `head`, `count` lines `line(i)` indented by `indent` and 4 × (i mod 3) spaces, and `tail`.
fn indented(
    head: &str,
    count: usize,
    indent: usize,
    line: fn(usize) -> String,
    tail: &str,
) -> String {
    let body: String = (0..count)
        .map(|i| format!("{}{}\n", " ".repeat(indent + 4 * (i % 3)), line(i)))
        .collect();
    format!("{head}{body}{tail}")
}

fn code_block() -> String {
    indented(
        "Here is the fix:\n\n```rust\nfn main() {\n",
        36,
        4,
        |i| format!("let x{i} = {i}; // step"),
        "}\n```",
    )
}

#[test]
fn mcp_tools_send_exactly_once_read_the_inbox_and_carry_the_relays_refusals() {
    let relay = Relay::start();
    let (mut bob, _) = relay.agent("Bob");
    let mut mcp = Mcp::start(&relay, "Alice");
    let tools = mcp.call("tools/list", serde_json::json!({}));
    let mut names: Vec<&str> = field_strs(&tools["tools"], "name");
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "relay_agents",
            "relay_claim",
            "relay_inbox",
            "relay_read",
            "relay_release",
            "relay_search",
            "relay_send",
            "relay_spawn",
            "relay_subscribe"
        ]
    );

    // Send: the body arrives byte for byte, once; the result is the relay's ACK.
    let body = code_block();
    let (err, ack) = mcp.tool(
        "relay_send",
        serde_json::json!({"to": "Bob", "body": body, "thread": "T-1", "urgent": true}),
    );
    assert!(!err && ack.starts_with("ACK ["), "{ack}");
    assert!(ack.contains("accepted"), "{ack}");
    let d = bob.expect("DELIVER");
    assert_eq!(d["from"], "Alice");
    assert_eq!(d["payload"]["body"].as_str().unwrap(), body);
    assert_eq!(d["payload"]["thread"], "T-1");
    assert_eq!(d["payload"]["urgent"], true);
    bob.ack(&d);

    // A refusal is the tool's error, with the relay's reason.
    let (err, nack) = mcp.tool(
        "relay_send",
        serde_json::json!({"to": "bad name!", "body": "x"}),
    );
    assert!(err && nack.starts_with("NACK "), "{nack}");

    // Alice is a known, online agent (the MCP server holds her name), so Bob can answer.
    let (_, agents) = mcp.tool("relay_agents", serde_json::json!({}));
    let alice = line_starting(&agents, "Alice (you) — ");
    assert!(
        (alice.contains("— idle since") || alice.contains("— busy since"))
            && alice.contains(", mcp"),
        "{agents}"
    );
    let answer = "Looks good.\n  - one nit:\n      indent this";
    let id = bob.send("Alice", answer);
    let ack = bob.expect("ACK");
    assert_eq!(ack["payload"]["ack_id"], id, "{ack}");
    let (_, inbox) = mcp.tool("relay_inbox", serde_json::json!({}));
    assert!(
        inbox.starts_with("1 relay message:")
            && inbox.contains(&format!("[{id}] from Bob to Alice:\n{answer}")),
        "{inbox}"
    );
    let (_, again) = mcp.tool("relay_inbox", serde_json::json!({}));
    assert_eq!(again, "No new relay messages.");
    let (_, read) = mcp.tool("relay_read", serde_json::json!({"id": &id[..10]}));
    assert!(read.ends_with(answer), "{read}");
    let (_, found) = mcp.tool("relay_search", serde_json::json!({"text": "one nit"}));
    assert!(found.contains(&id) && !found.contains("step"), "{found}");

    // Stored once each: the message to Bob and Bob's answer.
    let h: Value = serde_json::from_slice(&relay.cli(&["history", "--json"]).stdout).unwrap();
    assert_eq!(h.as_array().unwrap().len(), 2, "{h:#}");
}

/// Real Claude Code with the relay's MCP server (`--mcp-config`, as `claude mcp add` would
/// write it): the model calls relay_send with a 40-line code block; Bob gets it once, byte
/// for byte, and Claude Code hands the relay's ACK back to the model as the tool result.
#[test]
fn claude_code_sends_through_the_mcp_server_exactly_once() {
    let relay = Relay::start();
    let (bob, _) = relay.agent("Bob");
    // Bob reads from the start, answering PINGs: Claude Code may take longer than the
    // heartbeat's grace to start and send (as Gemini did under load, see
    // cli_sends_through_the_mcp_server_exactly_once).
    let bob = bob.expect_on_a_thread("DELIVER");
    let body = code_block();
    let standin = relay_standin::StandIn::start(relay_standin::Script::new(vec![
        relay_standin::Rule::contains("send Bob the fix", "Sending it to Bob.").calling(
            "mcp__relay__relay_send",
            &serde_json::json!({"to": "Bob", "body": body}),
        ),
        relay_standin::Rule::contains("check the relay", "Checking.")
            .calling("mcp__relay__relay_inbox", &serde_json::json!({})),
    ]))
    .unwrap();
    let config = serde_json::json!({"mcpServers": {"relay": {
        "type": "stdio",
        "command": BIN,
        "args": ["mcp", "--name", "Alice"],
        "env": {
            "AGENT_RELAY_SOCKET": &relay.socket,
            "AGENT_RELAY_DATA_DIR": relay.data_dir(),
        },
    }}});
    let config = config.to_string();
    let args = [
        "--mcp-config",
        &config,
        "--strict-mcp-config",
        "--allowedTools",
        "mcp__relay__relay_send,mcp__relay__relay_inbox",
    ];
    claude_print(&relay, &standin, &args, "send Bob the fix");
    let (mut bob, d) = bob
        .join()
        .expect("Bob's connection stays open until the DELIVER");
    assert_eq!(d["from"], "Alice");
    assert_eq!(d["payload"]["body"].as_str().unwrap(), body);
    bob.ack(&d);
    // The tool result Claude Code sent back to the model is the relay's receipt.
    let results = crate::support::tool_results(&standin, 0);
    assert!(
        results
            .iter()
            .any(|r| r.contains("ACK [") && r.contains("accepted")),
        "{results:?}"
    );
    let h: Value = serde_json::from_slice(&relay.cli(&["history", "--json"]).stdout).unwrap();
    let h = h.as_array().unwrap();
    assert_eq!(h.len(), 1, "sent once: {h:#?}");
    assert_eq!(h[0]["body"].as_str().unwrap(), body);

    // Bob answers while Alice's session is closed; her next session reads it with relay_inbox.
    let answer = "Thanks. Two nits:\n  - rename x0\n      (it shadows)";
    bob.send("Alice", answer);
    let ack = bob.expect("ACK");
    assert_eq!(ack["payload"]["status"], "queued", "{ack}");
    claude_print(&relay, &standin, &args, "check the relay");
    let last = standin.requests().last().unwrap().body.to_string();
    let want = serde_json::to_string(&format!("from Bob to Alice:\n{answer}")).unwrap();
    assert!(last.contains(want.trim_matches('"')), "{last}");
}

/// `agent-relay [WRAP_ARGS] -n Alice CLAUDE -p PROMPT`: real Claude Code wrapped by the
/// shorthand, in print mode (it answers once and exits, and the wrapper with it), working in
/// `work` (a folder under the relay's directory), talking to `standin`.
fn wrapped_claude_print(
    relay: &Relay,
    standin: &relay_standin::StandIn,
    wrap_args: &[&str],
    work: &str,
) {
    let dir = relay.dir.path();
    let (home, work) = (dir.join(format!("home-{work}")), dir.join(work));
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    let env = crate::support::Cli::Claude.setup(&home, &work, &standin.base_url());
    let mut cmd = relay.command();
    for pair in env.split_whitespace() {
        let (k, v) = pair.split_once('=').unwrap();
        cmd.env(k, v.trim_matches('\''));
    }
    let claude = crate::support::Cli::Claude.path();
    cmd.env("HOME", &home)
        .env("AGENT_RELAY_BACKEND", "pty")
        .current_dir(&work)
        .args(wrap_args)
        .args(["-n", "Alice"])
        .arg(&claude)
        .args(["-p", "hello there"])
        .stdin(Stdio::null());
    ok_stdout(&cmd.output().unwrap());
}

/// The system prompt of the conversation turn Claude Code sent for "hello there".
fn system_prompt_of_the_turn(standin: &relay_standin::StandIn) -> String {
    let turn = standin
        .requests()
        .into_iter()
        .rev()
        .find(|r| r.user_text.contains("hello there") && r.kind == relay_standin::Kind::Main)
        .expect("Claude Code asked about the prompt");
    relay_standin::messages::system_text(&turn.body)
}

#[test]
fn claude_code_is_taught_its_name_the_syntax_and_the_other_agents_unless_told_not_to() {
    let relay = Relay::start();
    let (_bob, _) = relay.agent("Bob");
    let standin = relay_standin::StandIn::start(relay_standin::Script::default()).unwrap();

    wrapped_claude_print(&relay, &standin, &[], "work");
    let system = system_prompt_of_the_turn(&standin);
    assert!(
        system.contains("Your name on the relay is Alice.")
            && system.contains("Other agents on the relay when you started: Bob.")
            && system.contains("@relay:Bob Please review auth.ts"),
        "{system}"
    );

    wrapped_claude_print(&relay, &standin, &["--no-teach"], "work");
    let system = system_prompt_of_the_turn(&standin);
    assert!(!system.contains("agent-relay"), "{system}");

    // The project's own text replaces the built-in one.
    let work = relay.dir.path().join("work-own");
    std::fs::create_dir_all(work.join(".agent-relay")).unwrap();
    std::fs::write(
        work.join(".agent-relay/teach.md"),
        "House rules for {name}: talk to {agents} with @relay:NAME.\n",
    )
    .unwrap();
    wrapped_claude_print(&relay, &standin, &[], "work-own");
    let system = system_prompt_of_the_turn(&standin);
    assert!(
        system.contains("House rules for Alice: talk to Bob with @relay:NAME.")
            && !system.contains("Your name on the relay is"),
        "{system}"
    );
}

/// A 40-line code block with indentation, sent to a wrapped agent CLI, reaches its model's
/// request byte for byte: typed as one bracketed paste with its lines (the profile's
/// `multiline`), submitted once. Returns the prompt the model was given.
fn code_block_reaches(cli: crate::support::Cli, name: &str) {
    let relay = Relay::start();
    let agent = crate::support::Agent::start(&relay, cli, name, relay_standin::Script::default());
    agent.wait_ready();
    let body = code_block();
    let id = cli_send(&relay, name, &body);
    let prompts = agent.wait_prompts(1);
    let short = &id[id.len() - 8..];
    // Claude Code 2.1.328 hands a long paste to the model inside its own
    // `<pasted_content id="...">` tags; between them, the text is exactly what was typed.
    let expected = format!("Relay message from human [{short}]:\n{body}");
    let inner = pasted_inner(&prompts[0]);
    assert_eq!(inner, expected, "the prompt {name} sent: {:?}", prompts[0]);
    agent.wait_replies_done();
    agent.wait_all_relayed("OK.");
    assert_eq!(agent.prompts().len(), 1, "submitted once");
    let h: Value = serde_json::from_slice(&relay.cli(&["history", "--json"]).stdout).unwrap();
    assert_eq!(
        h.as_array().unwrap().len(),
        1,
        "nothing of the echo relayed: {h:#}"
    );
}

tests_of! {
    code_block_reaches {
        claude_code_gets_a_40_line_code_block_byte_for_byte(Cli::Claude, "Bob");
        codex_gets_a_40_line_code_block_byte_for_byte(Cli::Codex, "Cody");
        gemini_gets_a_40_line_code_block_byte_for_byte(Cli::Gemini, "Gemma");
    }
}

/// The body of a directive with a 40-line indented code block under it (the continuation
/// rule keeps its lines). Under a directive's line it is no Markdown code block but the
/// paragraph's continuation, so Claude Code draws its Markdown marks (`**`, `__`) as bold
/// text without them: the screen's copy differs from what the model wrote.
fn directive_code_block() -> String {
    indented(
        "Here is the fix:\n    fn main() {\n",
        38,
        8,
        |i| format!("let x{i} = f(\"__init__\"); // **{i}**"),
        "    }",
    )
}

tests_of! {
    directive_code_block_arrives {
        /// A directive whose body is a 40-line indented code block, written by Alice's model under
        /// real Claude Code (wrapped), reaches Bob's model (real Claude Code, wrapped) byte for
        /// byte, once. The whole reply fits Alice's screen, so the directive is read off it, but
        /// the screen shows what Claude Code drew of the Markdown; the wrapper sends the reply's
        /// own text from Claude Code's transcript (before, the screen's copy went: lines and marks
        /// not as written).
        claude_code_directive_with_a_40_line_code_block_arrives_byte_for_byte(Cli::Claude, "Alice");
        /// The same from Codex CLI: its screen draws the block's lines at the directive's own
        /// indentation, so the screen's copy ends after `Here is the fix:`; the wrapper sends the
        /// reply's text from Codex's session rollout (before, Bob got the first line only).
        codex_directive_with_a_40_line_code_block_arrives_byte_for_byte(Cli::Codex, "Cody");
        /// The same from Gemini CLI: its screen keeps the lines but drops the Markdown marks
        /// (`__init__` shows as `init`); the wrapper sends the reply's text from Gemini's chat
        /// recording (before, Bob got the drawn text).
        gemini_directive_with_a_40_line_code_block_arrives_byte_for_byte(Cli::Gemini, "Gemma");
    }
}

/// `cli`'s agent `name` (wrapped) replies with a directive to Bob (Claude Code, wrapped) whose
/// body is a 40-line indented code block; Bob's model is asked it byte for byte, once.
fn directive_code_block_arrives(cli: crate::support::Cli, name: &str) {
    let relay = Relay::start();
    let body = directive_code_block();
    // Lines and all, short of the 2,000 characters typed in full.
    assert!(body.lines().count() == 41 && body.len() < 1900);
    let reply = format!("Sending the fix to Bob.\n\n@relay:Bob {body}\n\nThat is all.");
    let alice = Agent::start(
        &relay,
        cli,
        name,
        relay_standin::Script::new(vec![relay_standin::Rule::contains("Send the fix", &reply)]),
    );
    let bob = Agent::start(&relay, Cli::Claude, "Bob", relay_standin::Script::default());
    // Tall enough for the whole reply: the directive is on the screen (the premise).
    alice.resize(160, 70);
    alice.wait_ready();
    bob.wait_ready();
    alice.person_types("Send the fix");
    let prompts = bob.wait_prompts(1);
    let h: Value = serde_json::from_str(&ok_stdout(&relay.cli(&["history", "--json"]))).unwrap();
    let sent = &h.as_array().unwrap()[0];
    let id = sent["id"].as_str().unwrap();
    let short = &id[id.len() - 8..];
    let expected = format!("Relay message from {name} [{short}]:\n{body}");
    let inner = pasted_inner(&prompts[0]);
    assert_eq!(
        inner,
        expected,
        "what Bob's model was asked; {name}'s screen:\n{}",
        alice.screen()
    );
    assert_eq!(sent["body"].as_str(), Some(body.as_str()));
    alice.wait_replies_done();
    bob.wait_replies_done();
    alice.wait_all_relayed("That is all.");
    bob.wait_all_relayed("OK.");
    let h: Value = serde_json::from_str(&ok_stdout(&relay.cli(&["history", "--json"]))).unwrap();
    assert_eq!(
        h.as_array().unwrap().len(),
        1,
        "sent once: {h:#}\n{name}'s wrapper: {}",
        alice.wrap_log()
    );
    assert_eq!(bob.prompts().len(), 1, "asked once");
    // It went once, with the reply's own text from the agent's record, never as the screen
    // drew it. Which of the record's two ways took it is timing, and both send the same bytes
    // once (asserted above): normally the screen's copy is given the reply's text; but on a
    // loaded machine the CLI may have written its record and not drawn the reply yet when its
    // output has been quiet the settle time, and the wrapper then sends it from the record
    // ("the screen did not show it") and drops the screen's copy once drawn. (Claude Code
    // failed so twice under load with this assertion requiring the first way.)
    let log = alice.wrap_log();
    let with_text = log
        .matches("sent with the reply's own text from the agent's transcript")
        .count();
    let from_record = log.matches("the screen did not show it").count();
    assert!(
        with_text + from_record == 1 && !log.contains("sent as the screen shows it"),
        "the directive went other than once with the reply's own text: {log}"
    );
}

/// `hooks install claude` merges into a person's settings (their keys, their own Stop hook
/// kept; twice is once); `hooks uninstall claude` gives the file back byte for byte, or, when
/// the person changed it since, takes out only the relay's hook; with no file before, none after.
#[test]
fn hooks_install_merges_into_a_persons_settings_and_uninstall_restores_them() {
    let relay = Relay::start();
    let dir = relay.dir.path().join("proj");
    std::fs::create_dir_all(dir.join(".claude")).unwrap();
    let file = dir.join(".claude/settings.local.json");
    let original = "{\n  \"permissions\": {\"allow\": [\"Bash(ls)\"]},\n  \"hooks\": {\n    \"Stop\": [{\"hooks\": [{\"type\": \"command\", \"command\": \"notify-send done\"}]}],\n    \"UserPromptSubmit\": [{\"hooks\": [{\"type\": \"command\", \"command\": \"log-prompt\"}]}]\n  },\n  \"model\": \"opus\"\n}\n";
    std::fs::write(&file, original).unwrap();
    hooks(&relay, &dir, &["install", "claude"]);
    hooks(&relay, &dir, &["install", "claude"]);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(v["model"], "opus");
    assert_eq!(v["permissions"]["allow"][0], "Bash(ls)");
    let commands = hook_commands(&v, "Stop");
    assert_eq!(commands.len(), 2, "{commands:?}");
    assert_eq!(commands[0], "notify-send done");
    assert!(
        commands[1].ends_with("agent-relay' hooks stop"),
        "{commands:?}"
    );
    let on_prompt = hook_commands(&v, "UserPromptSubmit");
    assert_eq!(on_prompt.len(), 2, "{on_prompt:?}");
    assert_eq!(on_prompt[0], "log-prompt");
    assert!(
        on_prompt[1].ends_with("agent-relay' hooks prompt"),
        "{on_prompt:?}"
    );
    hooks(&relay, &dir, &["uninstall", "claude"]);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), original);

    // Changed by the person while installed: only the relay's hook goes.
    hooks(&relay, &dir, &["install", "claude"]);
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    v["theme"] = "dark".into();
    std::fs::write(&file, v.to_string()).unwrap();
    hooks(&relay, &dir, &["uninstall", "claude"]);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let mut want: Value = serde_json::from_str(original).unwrap();
    want["theme"] = "dark".into();
    assert_eq!(v, want);

    // No settings before: none after.
    let empty = relay.dir.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    hooks(&relay, &empty, &["install", "claude"]);
    assert!(empty.join(".claude/settings.local.json").exists());
    hooks(&relay, &empty, &["uninstall", "claude"]);
    assert!(!empty.join(".claude/settings.local.json").exists());
}

/// The Stop hook door: real Claude Code (print mode, no wrapper) with the relay's Stop hook
/// installed ends its turn; the hook hands it Bob's waiting message, multi-line, as the
/// reason it goes on with: the model is asked with it, without any typing, once.
#[test]
fn claude_code_gets_a_waiting_message_from_its_stop_hook() {
    let relay = Relay::start();
    // Alice is known to the relay (offline): Bob's message waits for her.
    drop(relay.agent("Alice"));
    let body = "Please look at:\n  - auth.ts line 40\n      (the refresh path)";
    // Bob's message comes while Alice works on her prompt (after its UserPromptSubmit hook
    // found nothing): the Stop hook at the end of the turn hands it over.
    let (id, out, standin) = claude_print_with_hooks(&relay, || {
        // Bob connects only now: a raw connection silent while Claude Code starts (longer
        // than the heartbeat's grace on a loaded machine) would be closed.
        let (mut bob, _) = relay.agent("Bob");
        let id = bob.send("Alice", body);
        bob.expect("ACK");
        id
    });
    let asked: Vec<String> = turns(&standin);
    let short = &id[id.len() - 8..];
    let with_it: Vec<&String> = asked
        .iter()
        .filter(|p| p.contains(&format!("Relay message from Bob [{short}]:\n{body}")))
        .collect();
    assert_eq!(
        with_it.len(),
        1,
        "{asked:#?}\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// The Stop hook door under a wrapper: real Claude Code wrapped (PTY), with the relay's Stop
/// hook installed, is busy with a person's task when a three-line message comes for it. At
/// the end of that turn the hook asks the wrapper, which hands the message over instead of
/// typing it: the model goes on with it (asked once, lines kept), the relay records it
/// injected and, once the turn it started is over (the next Stop hook), verified; the wrapper
/// never types it.
#[test]
fn a_wrapped_claude_code_gets_a_message_from_its_stop_hook_with_its_delivery_states() {
    let relay = Relay::start();
    let bob = claude_bob_held_in_a_turn(&relay);
    let body = "Please look at:\n  - auth.ts line 40\n      (the refresh path)";
    let id = cli_send(&relay, "Bob", body);
    crate::support::wait_for(
        std::time::Duration::from_secs(60),
        "the message waits in Bob's wrapper",
        || {
            bob.wrap_log()
                .contains(&format!("a message waits to be typed id={id}"))
        },
    );
    bob.standin().release();
    bob.wait_prompts(2);
    let prompts = turns(bob.standin());
    let short = &id[id.len() - 8..];
    assert!(
        prompts[1].contains(&format!("Relay message from human [{short}]:\n{body}")),
        "{prompts:#?}"
    );
    let log = handed_over_by_a_hook(&relay, &bob, &id, 2);
    assert!(
        !log.contains(&format!("typing a message id={id}")),
        "the wrapper typed it:\n{log}"
    );
}

/// The UserPromptSubmit door, without a wrapper: real Claude Code (print mode) with the
/// relay's hooks installed, a message waiting for it: the prompt hook hands it over as the
/// turn's additional context, so the model's one request holds it (byte for byte, lines kept)
/// next to the person's prompt; the Stop hook has nothing more to hand over.
#[test]
fn claude_code_gets_a_waiting_message_with_a_prompt_from_its_prompt_hook() {
    let relay = Relay::start();
    drop(relay.agent("Alice"));
    let (mut bob, _) = relay.agent("Bob");
    let body = "Please look at:\n  - auth.ts line 40\n      (the refresh path)";
    let id = bob.send("Alice", body);
    bob.expect("ACK");
    let standin = relay_standin::StandIn::start(relay_standin::Script::default()).unwrap();
    let out = claude_print_as_alice_with_hooks(&relay, &standin);
    let short = &id[id.len() - 8..];
    let want = format!("Relay message from Bob [{short}]:\n{body}");
    let main: Vec<relay_standin::Request> = standin
        .requests()
        .into_iter()
        .filter(|r| r.kind == relay_standin::Kind::Main)
        .collect();
    assert_eq!(
        main.len(),
        1,
        "one turn, not continued by the Stop hook: {:#?}\n{}",
        main.iter().map(|r| &r.user_text).collect::<Vec<_>>(),
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(main[0].user_text, "hello there");
    let told = message_texts(&main[0].body);
    assert_eq!(told.matches(&want).count(), 1, "{told}");
}

/// The UserPromptSubmit door under a wrapper: a person has a half-written line in wrapped
/// real Claude Code's input box when a three-line message comes; the wrapper holds it for
/// them. When they submit, the relay's prompt hook asks the wrapper, which hands the message
/// over with their prompt instead of typing it after: that turn's request holds it (byte for
/// byte) next to the person's line, the relay records it injected and, once that turn's Stop
/// hook runs, verified; it is never typed and never asked again.
#[test]
fn claude_code_gets_a_held_message_with_a_persons_prompt_from_its_prompt_hook() {
    let relay = Relay::start();
    let work = relay.dir.path().join("work-Bob");
    std::fs::create_dir_all(&work).unwrap();
    hooks(&relay, &work, &["install", "claude"]);
    let bob = Agent::start(&relay, Cli::Claude, "Bob", relay_standin::Script::default());
    bob.wait_ready();
    bob.tmux(&["send-keys", "-l", "half a thought"]);
    crate::support::wait_for(
        std::time::Duration::from_secs(60),
        "the person's line shows",
        || bob.screen().contains("half a thought"),
    );
    let body = "Please look at:\n  - auth.ts line 40\n      (the refresh path)";
    let id = cli_send(&relay, "Bob", body);
    let queued = format!("a message waits to be typed id={id}");
    crate::support::wait_for(
        std::time::Duration::from_secs(60),
        "Bob's wrapper holds the message for the person",
        || {
            let log = bob.wrap_log();
            log.find(&queued).is_some_and(|at| {
                log[at..].contains("a message is due; held while a person has a half-written line")
            })
        },
    );
    bob.tmux(&["send-keys", "Enter"]);
    let prompts = bob.wait_prompts(1);
    assert_eq!(prompts[0], "half a thought");
    let short = &id[id.len() - 8..];
    let want = format!("Relay message from human [{short}]:\n{body}");
    let main: Vec<relay_standin::Request> = bob
        .standin()
        .requests()
        .into_iter()
        .filter(|r| r.kind == relay_standin::Kind::Main)
        .collect();
    let told = message_texts(&main[0].body);
    assert_eq!(told.matches(&want).count(), 1, "{told}");
    let log = handed_over_by_a_hook(&relay, &bob, &id, 1);
    assert!(
        !log.contains(&format!("typing a message id={id}"))
            && log.contains(&format!(
                "handed to Claude Code's hook instead of typing id={id} hook=\"UserPromptSubmit\""
            )),
        "the wrapper typed it, or handed it to another door:\n{log}"
    );
}

/// A wrapped agent's own MCP server (same name) is the same agent: it sends through the
/// wrapper's connection (its door), not as a second identity the relay would refuse.
/// Real Codex CLI or Gemini CLI in its one-shot mode (`codex exec`, `gemini -p`), in a fresh
/// home under the relay's directory, with the relay's MCP server added by the documented
/// one-liner (`codex mcp add relay -- agent-relay mcp --name NAME`, `gemini mcp add relay
/// agent-relay mcp -- --name NAME`; `--env`/`-e` point the server at this test's relay). The
/// stand-in scripts a `relay_send` call (`tool`: the name the CLI gives the MCP tool) with a
/// 40-line code block to Bob; Bob gets it once, byte for byte, and the CLI hands the relay's
/// ACK back to the model. Codex 0.169.0 offers the server's tools as one namespace
/// (`mcp__relay`, tools inside) and runs a call that names both (`mcp__relay/relay_send`:
/// `"namespace": "mcp__relay", "name": "relay_send"`); `codex exec` never asks, so the
/// server's tools are approved with `-c mcp_servers.relay.default_tools_approval_mode=approve`
/// (docs/AGENTS.md), else the call fails "requires approval".
fn cli_sends_through_the_mcp_server_exactly_once(cli: crate::support::Cli, name: &str, tool: &str) {
    let relay = Relay::start();
    let (bob, _) = relay.agent("Bob");
    // Bob reads from the start, answering the daemon's PINGs: the CLI may take longer than
    // the heartbeat's grace (three beats) to start and send, above all on a loaded machine,
    // and a peer that reads nothing meanwhile is closed as silent.
    let bob = bob.expect_on_a_thread("DELIVER");
    let body = code_block();
    let standin = relay_standin::StandIn::start(relay_standin::Script::new(vec![
        relay_standin::Rule::contains("send Bob the fix", "Sending it to Bob.")
            .calling(tool, &serde_json::json!({"to": "Bob", "body": body})),
    ]))
    .unwrap();
    let dir = relay.dir.path();
    let (home, work) = (dir.join("home-mcp"), dir.join("work-mcp"));
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    let env = cli.setup(&home, &work, &standin.base_url());
    let command = |args: &[&str]| {
        // Bounds a hang (a CLI calling the tool forever, waiting for an approval).
        let mut cmd = Command::new("timeout");
        cmd.arg("120").arg(cli.path());
        for pair in env.split_whitespace() {
            let (k, v) = pair.split_once('=').unwrap();
            cmd.env(k, v.trim_matches('\''));
        }
        // Output to files, not pipes: Codex leaves a daemon behind that would hold a pipe open.
        let (stdout, stderr) = (dir.join("cli.out"), dir.join("cli.err"));
        let status = cmd
            .env("HOME", &home)
            .env_remove("CI")
            .current_dir(&work)
            .args(args)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .status()
            .unwrap();
        let read = |p: &std::path::Path| std::fs::read_to_string(p).unwrap_or_default();
        assert!(
            status.success(),
            "{cli:?} {args:?} failed: {}\n{}\n{:#?}",
            read(&stdout),
            read(&stderr),
            standin
                .requests()
                .iter()
                .take(6)
                .map(|r| format!("{:?} {}", r.kind, text_of(&r.body["input"])))
                .collect::<Vec<_>>()
        );
    };
    let socket = format!("AGENT_RELAY_SOCKET={}", relay.socket.display());
    let data = format!("AGENT_RELAY_DATA_DIR={}", relay.data_dir().display());
    match cli {
        Cli::Codex => command(&[
            "mcp", "add", "relay", "--env", &socket, "--env", &data, "--", BIN, "mcp", "--name",
            name,
        ]),
        Cli::Gemini => command(&[
            "mcp", "add", "-e", &socket, "-e", &data, "relay", BIN, "mcp", "--", "--name", name,
        ]),
        Cli::Claude => unreachable!("claude_code_sends_through_the_mcp_server_exactly_once"),
    };
    let prompt = "send Bob the fix";
    match cli {
        Cli::Codex => command(&[
            "exec",
            "--skip-git-repo-check",
            "-c",
            "mcp_servers.relay.default_tools_approval_mode=approve",
            prompt,
        ]),
        _ => command(&["-p", prompt, "--yolo"]),
    };
    let tools: Vec<String> = standin
        .requests()
        .iter()
        .filter(|r| r.kind == relay_standin::Kind::Main)
        .flat_map(|r| {
            let b = &r.body;
            let list = b["tools"].as_array().cloned().unwrap_or_default();
            list.iter()
                .flat_map(|t| {
                    // Responses: {name}; Gemini: {functionDeclarations: [{name}]}.
                    let mut names: Vec<String> =
                        t["name"].as_str().map(String::from).into_iter().collect();
                    // Codex: a namespace per MCP server, {name, tools: [{name}]}.
                    names.extend(t["tools"].as_array().into_iter().flatten().filter_map(|f| {
                        Some(format!("{}/{}", t["name"].as_str()?, f["name"].as_str()?))
                    }));
                    names.extend(
                        t["functionDeclarations"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(|f| f["name"].as_str().map(String::from)),
                    );
                    names
                })
                .collect::<Vec<_>>()
        })
        .filter(|n| n.contains("relay"))
        .collect();
    assert!(
        tools.iter().any(|t| t == tool),
        "{cli:?} offered the model these relay tools: {tools:?}\n{}",
        standin
            .requests()
            .iter()
            .filter_map(|r| r.body["tools"].as_array().cloned())
            .flatten()
            .filter(|t| t.to_string().contains("relay_send"))
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
    // The CLI has exited: what it sent is stored (checked first: a call that never reached
    // the server would leave Bob's DELIVER waiting forever).
    let h: Value = serde_json::from_slice(&relay.cli(&["history", "--json"]).stdout).unwrap();
    let h = h.as_array().unwrap();
    assert_eq!(h.len(), 1, "sent once: {h:#?}");
    assert_eq!(h[0]["body"].as_str().unwrap(), body);
    let (mut bob, d) = bob
        .join()
        .expect("Bob's connection stays open until the DELIVER");
    assert_eq!(d["from"], name);
    assert_eq!(d["payload"]["body"].as_str().unwrap(), body);
    bob.ack(&d);
    // The tool's result the CLI sent back to the model (the latest turn of its next request)
    // is the relay's receipt.
    let answered: Vec<String> = standin
        .requests()
        .iter()
        .map(|r| r.user_text.clone())
        .collect();
    assert!(
        answered
            .iter()
            .any(|t| t.contains("ACK [") && t.contains("accepted")),
        "{answered:#?}"
    );
    crate::support::kill_leftovers(&home);
}

#[test]
fn gemini_sends_through_the_mcp_server_exactly_once() {
    cli_sends_through_the_mcp_server_exactly_once(
        crate::support::Cli::Gemini,
        "Gemma",
        "mcp_relay_relay_send",
    );
}

#[test]
fn codex_sends_through_the_mcp_server_exactly_once() {
    cli_sends_through_the_mcp_server_exactly_once(
        crate::support::Cli::Codex,
        "Cody",
        "mcp__relay/relay_send",
    );
}

/// The end of a request's input, for a failure message.
fn text_of(v: &Value) -> String {
    let t = v.to_string();
    t.chars()
        .skip(t.chars().count().saturating_sub(600))
        .collect()
}
