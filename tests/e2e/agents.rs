//! Real agent CLIs end to end: Claude Code TUIs, each wrapped by the real `agent-relay wrap`
//! in a person's terminal (a private tmux server), each talking to its own local stand-in for
//! the Anthropic API (`relay-standin`), all through a real daemon. What each instance was
//! really asked is read back from its stand-in's request log.
//!
//! The CLIs come from `scripts/install-agents` (run by `.ci/run`): a missing CLI fails the
//! test with the command to install it; nothing here skips.

use std::time::Duration;

use relay_standin::{Rule, Script};
use serde_json::Value;

use crate::support::*;

/// The text an agent is given for a relayed message: `Relay message from FROM [SHORT]: BODY`,
/// with ` (thread T)` before the colon for an answer (its thread is the id of the message it
/// answers); ids shown as their last 8 characters (`relay_protocol::short_id`).
fn relayed(from: &str, id: &str, thread: &str, body: &str) -> String {
    let short = relay_protocol::short_id(id);
    if thread.is_empty() {
        format!("Relay message from {from} [{short}]: {body}")
    } else {
        let t = relay_protocol::short_id(thread);
        format!("Relay message from {from} [{short}] (thread {t}): {body}")
    }
}

const TO_BOB: &str = "Please list what is missing from the 2.0 release notes.";
const TO_ALICE: &str = "The migration steps and the changelog link are missing.";

/// A person gives Alice a task; Alice's reply asks Bob; Bob, busy with his own person's task,
/// gets the message as a submitted prompt only once that turn is over; he answers Alice, and
/// she gets it. Each message once, in order, whole.
#[test]
fn claude_code_instances_converse_through_the_relay() {
    let relay = Relay::start();
    let alice = Agent::claude(
        &relay,
        "Alice",
        Script::new(vec![
            Rule::contains(
                "Plan the release",
                &format!("I will ask Bob.\n\n@relay:Bob {TO_BOB}"),
            ),
            Rule::contains("Relay message from Bob", "Thanks, noted."),
        ]),
    );
    let bob = Agent::claude(
        &relay,
        "Bob",
        Script::new(vec![
            Rule::contains(
                "Relay message from Alice",
                &format!("Checking.\n\n@relay:Alice {TO_ALICE}"),
            ),
            // Bob's own task keeps him busy (spinner) until the test lets the reply go.
            Rule::contains("Index the repository", "Indexed.").held(),
        ]),
    );
    alice.wait_ready();
    bob.wait_ready();

    bob.person_types("Index the repository");
    bob.wait_prompts(1);
    alice.person_types("Plan the release");
    wait_for(LONG, "Alice's directive reaches the relay", || {
        !history(&relay).is_empty()
    });
    let to_bob = history(&relay)[0].clone();
    assert_eq!(to_bob.line(), ("Alice", "Bob", TO_BOB));
    // Bob is still working: he is asked nothing else, and his wrapper types nothing. Its
    // injector looks at the screen when the message is due (output quiet, or a recheck):
    // wait until it has looked, with the message queued, and said "not ready". A wrapper
    // that typed into a busy agent would type at that moment instead.
    alice.wait_replies_done();
    let typed_for_bob = format!("id={}", to_bob.id);
    let mut held = false;
    wait_for(
        LONG,
        "Bob's wrapper looks at the screen for Alice's message",
        || {
            let log = bob.wrap_log();
            let Some(queued) = log.find("a message waits to be typed").filter(|&at| {
                log[at..]
                    .lines()
                    .next()
                    .is_some_and(|l| l.contains(&typed_for_bob))
            }) else {
                return false;
            };
            let after = &log[queued..];
            held = after.contains("not ready for a message why=Busy");
            held || after.contains("typing a message")
        },
    );
    assert!(
        held,
        "typed into a working Claude Code:\n{}",
        bob.wrap_log()
    );
    assert!(bob.pane().contains("esc to interrupt"), "{}", bob.pane());
    assert_eq!(bob.prompts(), ["Index the repository"]);
    assert!(
        !bob.wrap_log()
            .lines()
            .any(|l| l.contains("typing a message") && l.contains(&typed_for_bob)),
        "typed into a working Claude Code:\n{}",
        bob.wrap_log()
    );

    bob.standin.release();
    let alice_prompts = alice.wait_prompts(2);
    let h = history(&relay);
    assert_eq!(h.len(), 2, "{h:?}");
    let to_alice = &h[1];
    assert_eq!(
        (
            to_alice.from.as_str(),
            to_alice.to.as_str(),
            to_alice.body.as_str()
        ),
        ("Bob", "Alice", TO_ALICE)
    );
    assert_eq!(
        alice_prompts,
        [
            "Plan the release".to_owned(),
            relayed("Bob", &to_alice.id, &to_alice.thread, TO_ALICE)
        ]
    );
    assert_eq!(
        bob.prompts(),
        [
            "Index the repository".to_owned(),
            relayed("Alice", &to_bob.id, &to_bob.thread, TO_BOB)
        ]
    );
    // The relayed prompt went to the model only after Bob's own turn was over.
    let bob_log: Vec<_> = bob
        .standin
        .requests()
        .into_iter()
        .filter(|r| r.kind == relay_standin::Kind::Main)
        .collect();
    assert!(bob_log[1].received >= bob_log[0].finished.unwrap());
    // And the wrapper typed it only once that turn had ended.
    let typed = logged_at(&relay, "Bob", "typing a message", &to_bob.id);
    let turn_over = wall_ms(bob_log[0].finished_wall().unwrap());
    assert!(
        typed + 1.0 >= turn_over,
        "typed at {typed}, turn over at {turn_over}"
    );
    // Each wrapper saw its prompt submitted on the screen and said so.
    wait_for(LONG, "both deliveries are reported verified", || {
        delivery_status(&relay, &to_bob.id) == "verified"
            && delivery_status(&relay, &to_alice.id) == "verified"
    });
    // Nothing more trickles in once the last reply is out (a repaint read twice would): each
    // wrapper has relayed all its agent printed, the last reply included.
    alice.wait_replies_done();
    bob.wait_replies_done();
    alice.wait_all_relayed("Thanks, noted.");
    bob.wait_all_relayed("changelog link are missing.");
    assert_eq!(history(&relay).len(), 2);
    assert_eq!(alice.prompts().len(), 2);
    assert_eq!(bob.prompts().len(), 2);
}

/// The same conversation with both agents under the tmux backend: the relaying goes on in
/// the background processes, and each message reaches the other Claude Code once.
#[test]
fn claude_code_instances_converse_under_the_tmux_backend() {
    let relay = Relay::start();
    let alice = Agent::claude_in_tmux(
        &relay,
        "Alice",
        Script::new(vec![
            Rule::contains(
                "Plan the release",
                &format!("I will ask Bob.\n\n@relay:Bob {TO_BOB}"),
            ),
            Rule::contains("Relay message from Bob", "Thanks, noted."),
        ]),
    );
    let bob = Agent::claude_in_tmux(
        &relay,
        "Bob",
        Script::new(vec![Rule::contains(
            "Relay message from Alice",
            &format!("Checking.\n\n@relay:Alice {TO_ALICE}"),
        )]),
    );
    alice.wait_ready();
    bob.wait_ready();
    // The tmux backend is the one at work: a checkpoint of the pane's rows, and no file the
    // pane's output grows.
    for name in ["Alice", "Bob"] {
        let team = relay.data_dir().join(format!("team/{name}"));
        assert!(team.join("checkpoint").exists(), "{team:?}");
        assert!(!team.join("pane.log").exists(), "{team:?}");
    }
    alice.person_types("Plan the release");
    let alice_prompts = alice.wait_prompts(2);
    let h = history(&relay);
    assert_eq!(h.len(), 2, "{h:?}");
    let (to_bob, to_alice) = (&h[0], &h[1]);
    assert_eq!(to_bob.line(), ("Alice", "Bob", TO_BOB));
    assert_eq!(
        alice_prompts,
        [
            "Plan the release".to_owned(),
            relayed("Bob", &to_alice.id, &to_alice.thread, TO_ALICE)
        ]
    );
    assert_eq!(
        bob.prompts(),
        [relayed("Alice", &to_bob.id, &to_bob.thread, TO_BOB)]
    );
    wait_for(LONG, "both deliveries are reported verified", || {
        delivery_status(&relay, &to_bob.id) == "verified"
            && delivery_status(&relay, &to_alice.id) == "verified"
    });
    alice.wait_replies_done();
    bob.wait_replies_done();
    alice.wait_all_relayed("Thanks, noted.");
    bob.wait_all_relayed("changelog link are missing.");
    assert_eq!(history(&relay).len(), 2);
    assert_eq!(bob.prompts().len(), 1);
}

const LONG_BODY: &str = "Please review the authentication module, especially the token refresh \
path and the session expiry handling that changed this week. I need your answer before the \
release branch is cut tomorrow morning, so a short list of problems is better than a long essay; \
mark anything that blocks the release.";
const FYI: &str = "FYI: Bob is reviewing the authentication module.";
const ALL: &str = "Carol here: the review has started, questions to me.";

/// Three Claude Code instances. Alice's one reply, after a thinking block with a directive in
/// it (Claude Code shows it collapsed, "Thought for 1s"; not sent), holds a directive that wraps over several screen lines, a directive inside a
/// code block and one quoted inline (neither is sent), and
/// a second directive to another agent; Carol answers with a broadcast that reaches the other
/// two.
#[test]
fn claude_code_directives_wrap_hide_in_code_and_broadcast() {
    let relay = Relay::start();
    let reply = format!(
        "I will split the work.\n\n@relay:Bob {LONG_BODY}\n\nFor reference, the syntax:\n\n\
         ```python\n@relay:Carol this line is code, not a directive\nprint(1)\n```\n\n\
         Writing `@relay:Carol hi` in backticks sends nothing.\n\n@relay:Carol {FYI}\n\nDone."
    );
    let alice = Agent::claude(
        &relay,
        "Alice",
        Script::new(vec![Rule::contains("Start the review", &reply).thinking(
            "Who should review?\n\n@relay:Carol this thought is not a message\n\nBob, then.",
        )]),
    );
    // (A fence with no language is not hidden: Claude Code draws it like prose, see
    // docs/PARSING.md; a fence with one is drawn coloured.)
    let bob = Agent::claude(&relay, "Bob", Script::default());
    let carol = Agent::claude(
        &relay,
        "Carol",
        Script::new(vec![Rule::contains(
            "Relay message from Alice",
            &format!("@relay:* {ALL}"),
        )]),
    );
    alice.wait_ready();
    bob.wait_ready();
    carol.wait_ready();
    alice.person_types("Start the review");
    let alice_prompts = alice.wait_prompts(2);
    let bob_prompts = bob.wait_prompts(2);
    let h = history(&relay);
    let summary: Vec<(&str, &str, &str)> = h.iter().map(Stored::line).collect();
    assert_eq!(
        summary,
        [
            ("Alice", "Bob", LONG_BODY),
            ("Alice", "Carol", FYI),
            ("Carol", "*", ALL)
        ]
    );
    assert_eq!(
        bob_prompts,
        [
            relayed("Alice", &h[0].id, &h[0].thread, LONG_BODY),
            relayed("Carol", &h[2].id, &h[2].thread, ALL)
        ]
    );
    assert_eq!(
        carol.wait_prompts(1),
        [relayed("Alice", &h[1].id, &h[1].thread, FYI)]
    );
    assert_eq!(
        alice_prompts,
        [
            "Start the review".to_owned(),
            relayed("Carol", &h[2].id, &h[2].thread, ALL)
        ]
    );
    for c in [&alice, &bob, &carol] {
        c.wait_replies_done();
    }
    alice.wait_all_relayed("Done.");
    bob.wait_all_relayed("OK.");
    carol.wait_all_relayed("questions to me.");
    assert_eq!(history(&relay).len(), 3);
    assert_eq!(
        (
            alice.prompts().len(),
            bob.prompts().len(),
            carol.prompts().len()
        ),
        (2, 2, 1)
    );
}

const SLOW_BODY: &str = "Please check the release checklist against the tag.";

/// A terminal resized while Alice's reply streams does not send her directive twice, and a
/// person half-way through a line in Bob's input box is never interrupted: Alice's message
/// waits until the person submits, then follows as its own prompt.
#[test]
fn claude_code_resize_and_a_person_typing_do_not_disturb_relaying() {
    let relay = Relay::start();
    let filler = "This answer streams slowly so that the terminal can be resized while it is \
                  still being written. ";
    let reply = format!(
        "{}\n\n@relay:Bob {SLOW_BODY}\n\n{}\n\nThat is all.",
        filler.repeat(2),
        filler.repeat(2)
    );
    let alice = Agent::claude(
        &relay,
        "Alice",
        Script::new(vec![Rule::contains("Slow answer", &reply)]),
    );
    // About five seconds of streaming.
    alice.standin.set_pace(6, Duration::from_millis(60));
    let bob = Agent::claude(&relay, "Bob", Script::default());
    alice.wait_ready();
    bob.wait_ready();
    // The person at Bob's terminal starts a line and does not finish it yet.
    bob.tmux(&["send-keys", "-l", "half a thought"]);
    wait_for(LONG, "Bob's person's typing shows", || {
        bob.pane().contains("half a thought")
    });
    alice.person_types("Slow answer");
    wait_for(LONG, "Alice's reply is streaming", || {
        alice
            .standin
            .requests()
            .iter()
            .any(|r| r.kind == relay_standin::Kind::Main && r.finished.is_none())
    });
    std::thread::sleep(Duration::from_millis(1200));
    alice.tmux(&["resize-window", "-x", "80", "-y", "30"]);
    std::thread::sleep(Duration::from_millis(800));
    alice.tmux(&["resize-window", "-x", "110", "-y", "24"]);
    assert!(
        alice
            .standin
            .requests()
            .iter()
            .any(|r| r.finished.is_none()),
        "the resizes came after the reply (machine too slow for this test's premise)"
    );
    alice.wait_replies_done();
    wait_for(LONG, "Alice's directive reaches the relay", || {
        !history(&relay).is_empty()
    });
    // Alice's wrapper has relayed all she printed: anything the resizes made it read twice
    // would be in the history now.
    alice.wait_all_relayed("That is all.");
    let h = history(&relay);
    assert_eq!(h.len(), 1, "sent once despite the resizes: {h:?}");
    assert_eq!((h[0].to.as_str(), h[0].body.as_str()), ("Bob", SLOW_BODY));
    // Bob's wrapper held the message at the moment it came due (output quiet), for the
    // person's half-written line: a wrapper that typed over a person would type then.
    let queued = format!("a message waits to be typed id={}", h[0].id);
    wait_for(
        LONG,
        "Bob's wrapper holds the message for the person",
        || {
            let log = bob.wrap_log();
            log.find(&queued).is_some_and(|at| {
                log[at..].contains("a message is due; held while a person has a half-written line")
            })
        },
    );
    assert!(bob.prompts().is_empty(), "{:?}", bob.prompts());
    let pane = bob.pane();
    assert!(
        pane.contains("half a thought") && !pane.contains("Relay message"),
        "{pane}"
    );
    let held = delivery_status(&relay, &h[0].id);
    assert!(!matches!(held.as_str(), "acked" | "verified"), "{held}");
    // The person submits: their line goes as they wrote it, then the message on its own.
    bob.tmux(&["send-keys", "Enter"]);
    assert_eq!(
        bob.wait_prompts(2),
        [
            "half a thought".to_owned(),
            relayed("Alice", &h[0].id, &h[0].thread, SLOW_BODY)
        ]
    );
    bob.wait_replies_done();
    bob.wait_all_relayed("OK.");
    assert_eq!(history(&relay).len(), 1);
    assert_eq!(bob.prompts().len(), 2);
}

/// Another CLI under the relay, against its own stand-in (Codex: the OpenAI Responses API),
/// with Claude Code as Alice: it is given Alice's message as a
/// submitted prompt, and the directive in its reply is read off its screen and relayed back.
fn converses_with_claude_code(cli: Cli, name: &str) {
    let to_it = format!("{name}, please check the build scripts.");
    let from_it = format!("The build scripts are fine ({cli:?}).");
    let relay = Relay::start();
    let alice = Agent::claude(
        &relay,
        "Alice",
        Script::new(vec![Rule::contains(
            "Ask the other agent",
            &format!("Asking.\n\n@relay:{name} {to_it}"),
        )]),
    );
    let other = Agent::start(
        &relay,
        cli,
        name,
        Script::new(vec![Rule::contains(
            "Relay message from Alice",
            &format!("Checked.\n\n@relay:Alice {from_it}"),
        )]),
    );
    alice.wait_ready();
    other.wait_ready();
    alice.person_types("Ask the other agent");
    let alice_prompts = alice.wait_prompts(2);
    let h = history(&relay);
    // Once seen in a loaded whole-suite run with one message stored: what each was asked
    // tells which second prompt Alice had.
    assert_eq!(
        h.len(),
        2,
        "{h:?}\nAlice was asked {alice_prompts:?}\n{name} was asked {:?}",
        other.prompts()
    );
    assert_eq!(h[0].line(), ("Alice", name, to_it.as_str()));
    assert_eq!(h[1].line(), (name, "Alice", from_it.as_str()));
    assert_eq!(
        other.prompts(),
        [relayed("Alice", &h[0].id, &h[0].thread, &to_it)]
    );
    assert_eq!(
        alice_prompts,
        [
            "Ask the other agent".to_owned(),
            relayed(name, &h[1].id, &h[1].thread, &from_it)
        ]
    );
    alice.wait_replies_done();
    other.wait_replies_done();
    alice.wait_all_relayed("OK.");
    other.wait_all_relayed(&from_it);
    assert_eq!(history(&relay).len(), 2);
    assert_eq!((alice.prompts().len(), other.prompts().len()), (2, 1));
}

#[test]
fn codex_converses_with_claude_code() {
    converses_with_claude_code(Cli::Codex, "Cody");
}

/// A message for Codex that arrives while it is still starting (its input box is drawn half a
/// second in, its session configured seconds later) is typed once Codex can run it, and runs
/// once. Typed too early, it was left waiting under "Waiting for startup", and in CI was never
/// run at all and came back as a dead letter.
#[test]
fn codex_gets_a_message_sent_while_it_starts() {
    let relay = Relay::start();
    let body = "Cody, are you there?";
    let cody = Agent::start(
        &relay,
        Cli::Codex,
        "Cody",
        Script::new(vec![Rule::contains("are you there", "Yes, here.")]),
    );
    wait_online(&relay, "Cody");
    let id = cli_send(&relay, "Cody", body);
    wait_for(LONG, "the delivery is reported verified", || {
        delivery_status(&relay, &id) == "verified"
    });
    let prompts = cody.wait_prompts(1);
    assert_eq!(prompts, [relayed("human", &id, "", body)]);
    cody.wait_replies_done();
    // Its wrapper has relayed all Codex printed, the reply included; the delivery is verified,
    // so the injector is done with the message: nothing more can be typed from it.
    cody.wait_all_relayed("Yes, here.");
    assert_eq!(cody.prompts().len(), 1, "asked once");
}

#[test]
fn gemini_converses_with_claude_code() {
    converses_with_claude_code(Cli::Gemini, "Gemma");
}

/// Milliseconds since the epoch.
fn wall_ms(t: std::time::SystemTime) -> f64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
        * 1000.0
}

/// Unix ms of a log line's timestamp (`2026-11-22T08:32:26.917934Z`, UTC, as the wrapper's
/// log writes it).
fn log_ms(stamp: &str) -> f64 {
    let t: jiff::Timestamp = stamp.parse().unwrap();
    t.as_nanosecond() as f64 / 1e6
}

/// When `agent`'s wrapper logged `what` for message `id` (its first such line), Unix ms.
fn logged_at(relay: &Relay, agent: &str, what: &str, id: &str) -> f64 {
    let log = std::fs::read_to_string(relay.data_dir().join(format!("team/{agent}/wrap.log")))
        .unwrap_or_default();
    let needle = format!("id={id}");
    let line = log
        .lines()
        .find(|l| l.contains(what) && l.split_whitespace().any(|w| w == needle))
        .unwrap_or_else(|| panic!("{agent}'s wrapper did not log {what:?} for {id}:\n{log}"));
    log_ms(line.split_whitespace().next().unwrap())
}

/// When the stored delivery trace of `id` says `state` for `recipient`, Unix ms.
fn traced_at(relay: &Relay, id: &str, state: &str, recipient: &str) -> f64 {
    let events = trace_events(relay, id);
    events
        .iter()
        .find(|e| e["state"] == state && e["recipient"] == recipient)
        .unwrap_or_else(|| panic!("no {state}@{recipient} in {events:?}"))["ts"]
        .as_f64()
        .unwrap()
}

#[test]
fn log_timestamps_read_as_unix_ms() {
    for (stamp, ms) in [
        ("1970-01-01T00:00:01.5Z", 1500.0),
        ("2026-11-22T08:32:26.917934Z", 1_795_336_346_917.934),
        ("2000-03-01T00:00:00.0Z", 951_868_800_000.0),
    ] {
        assert!(
            (log_ms(stamp) - ms).abs() < 0.001,
            "{stamp}: {}",
            log_ms(stamp)
        );
    }
}

tests_of! {
    relay_latency_in_parts {
        /// For an idle recipient, the time from Alice's reply being printed to Bob's prompt being
        /// submitted, in parts, from the clocks of one machine: the stand-in's end of Alice's reply
        /// (printed), the message's `ts` (sent), its delivery's `queued_at` (stored), the trace's
        /// `delivered` (handed to Bob's wrapper), Bob's wrapper log (typing started, Enter
        /// pressed), Bob's request at his stand-in (submitted). Checks the parts come in that order
        /// (1 ms clock resolution) and the delivery is verified; prints the figures
        /// (docs/PERFORMANCE.md). More rounds:
        /// `AGENT_RELAY_LATENCY_ROUNDS=20 cargo nextest run --test e2e --no-capture -E 'test(claude_relay_latency)'`
        claude_relay_latency_in_parts(Cli::Claude);
        /// [`claude_relay_latency_in_parts`] with two Codex CLIs (`test(codex_relay_latency)`).
        codex_relay_latency_in_parts(Cli::Codex);
    }
}

/// Alice and Bob, both `cli`: the rounds of [`claude_relay_latency_in_parts`].
fn relay_latency_in_parts(cli: Cli) {
    let rounds: usize = std::env::var("AGENT_RELAY_LATENCY_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let relay = Relay::start();
    let rules = (1..=rounds)
        .map(|i| {
            Rule::contains(
                &format!("round {i} "),
                &format!("@relay:Bob ping number {i}"),
            )
        })
        .collect();
    let alice = Agent::start(&relay, cli, "Alice", Script::new(rules));
    let bob = Agent::start(&relay, cli, "Bob", Script::default());
    alice.wait_ready();
    bob.wait_ready();
    let mut rows = Vec::new();
    for i in 1..=rounds {
        alice.person_types(&format!("round {i} go"));
        bob.wait_prompts(i);
        bob.wait_replies_done();
        alice.wait_replies_done();
        let main = |a: &Agent<'_>| {
            a.standin
                .requests()
                .into_iter()
                .filter(|r| r.kind == relay_standin::Kind::Main)
                .nth(i - 1)
                .unwrap()
        };
        let (reply, asked) = (main(&alice), main(&bob));
        let h: Value =
            serde_json::from_str(&ok_stdout(&relay.cli(&["history", "--json"]))).unwrap();
        let m = &h[0];
        assert_eq!(m["body"], format!("ping number {i}"));
        let id = m["id"].as_str().unwrap().to_owned();
        wait_for(LONG, "the delivery is reported verified", || {
            delivery_status(&relay, &id) == "verified"
        });
        let times = [
            wall_ms(reply.finished_wall().unwrap()),
            m["ts"].as_f64().unwrap(),
            m["deliveries"][0]["queued_at"].as_f64().unwrap(),
            traced_at(&relay, &id, "delivered", "Bob"),
            logged_at(&relay, "Bob", "typing a message", &id),
            logged_at(&relay, "Bob", "pressing Enter", &id),
            wall_ms(asked.received_wall),
        ];
        // In that order, to the clocks' 1 ms resolution.
        for w in times.windows(2) {
            assert!(w[0] <= w[1] + 1.0, "out of order: {times:?}");
        }
        let mut row: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).collect();
        row.push(times[6] - times[0]);
        rows.push(row);
        // Idle again before the next round.
        std::thread::sleep(Duration::from_secs(1));
    }
    let names = [
        "detection: printed -> directive sent (parser settle)",
        "routing: sent -> stored for Bob (store commit)",
        "delivery: stored -> handed to Bob's wrapper",
        "readiness wait: handed over -> typing starts (quiet time, screen checks)",
        "typing: typing starts -> Enter pressed (paste, Enter delay)",
        "submit: Enter pressed -> Bob's request at the stand-in (the CLI)",
        "total: printed -> Bob's prompt submitted",
    ];
    println!("{cli:?}, rounds: {rounds} (milliseconds; wall clock, 1 ms resolution)");
    for (k, name) in names.iter().enumerate() {
        let mut v: Vec<f64> = rows.iter().map(|r| r[k]).collect();
        v.sort_by(f64::total_cmp);
        // Nearest rank: the smallest value at or above 95% of the rounds.
        let p95 = v[(v.len() * 95).div_ceil(100).saturating_sub(1)];
        println!(
            "{name}: median {:.0}, p95 {p95:.0}, min {:.0}, max {:.0}",
            v[v.len() / 2],
            v[0],
            v[v.len() - 1]
        );
    }
}

/// Claude Code's detailed transcript (Ctrl+O) redraws the whole conversation, thinking
/// expanded; toggled on and off by a person, it must not send anything again.
#[test]
fn claude_code_transcript_view_sends_nothing_again() {
    let relay = Relay::start();
    let alice = Agent::claude(
        &relay,
        "Alice",
        Script::new(vec![Rule::contains(
            "Split the work",
            "I will split the work.\n\n@relay:Bob please review auth.ts\n\n@relay:Carol please check the tests\n\nDone.",
        )
        .thinking("Who should do what?\n\n@relay:Carol this thought is not a message\n\nBob, then Carol.")]),
    );
    let bob = Agent::claude(&relay, "Bob", Script::default());
    let carol = Agent::claude(&relay, "Carol", Script::default());
    alice.wait_ready();
    bob.wait_ready();
    carol.wait_ready();
    alice.person_types("Split the work");
    bob.wait_prompts(1);
    carol.wait_prompts(1);
    alice.wait_replies_done();
    assert_eq!(history(&relay).len(), 2);
    // After each toggle, once the screen shows the view (the thinking, with its directive,
    // is drawn only in the transcript view), Alice's wrapper has relayed all it read of the
    // redraw: anything sent again from it is in the history by then.
    const THOUGHT: &str = "this thought is not a message";
    for _ in 0..2 {
        alice.tmux(&["send-keys", "C-o"]);
        alice.wait_all_relayed_when("the transcript view", |p| p.contains(THOUGHT));
        assert_eq!(history(&relay).len(), 2, "{}", alice.pane());
        alice.tmux(&["send-keys", "C-o"]);
        alice.wait_all_relayed_when("the prompt view", |p| !p.contains(THOUGHT));
        assert_eq!(history(&relay).len(), 2, "{}", alice.pane());
    }
    let h = history(&relay);
    assert_eq!(h.len(), 2, "{h:#?}\n{}", alice.pane());
}

const SHOWN: &str = "Please review auth.ts";
const MEANT: &str = "The release notes are ready for your review.";

/// The documented way to show the syntax: a ```` ```text ```` block, which Claude Code draws
/// like prose (no fences, default colour), a ```` ```sh ```` block, and an escaped line
/// (`\@relay:`, Markdown for `@relay:`). None of them is sent; the plain directive after them
/// in the same reply is, once. Before the wrapper checked Claude Code's transcript, all three
/// were sent to Bob: 2.1.328 draws the first two in the default colour and the escaped line
/// without its backslash.
#[test]
fn claude_code_text_code_block_is_not_sent() {
    let relay = Relay::start();
    let reply = format!(
        "To message Bob, write a line like this:\n\n```text\n@relay:Bob {SHOWN}\n```\n\n\
         or in a shell script:\n\n```sh\n@relay:Bob run the tests\n```\n\n\
         \\@relay:Bob escaped, not sent\n\nNow for real:\n\n@relay:Bob {MEANT}\n\nDone."
    );
    let alice = Agent::claude(
        &relay,
        "Alice",
        Script::new(vec![Rule::contains("Show the syntax", &reply)]),
    );
    let bob = Agent::claude(&relay, "Bob", Script::default());
    alice.wait_ready();
    bob.wait_ready();
    alice.person_types("Show the syntax");
    // The real directive comes last on the screen: once Bob has it, the lines above it were
    // read (and the quoted ones logged as not sent).
    let bob_prompts = bob.wait_prompts(1);
    let h = history(&relay);
    let summary: Vec<(&str, &str)> = h.iter().map(|m| (m.to.as_str(), m.body.as_str())).collect();
    assert_eq!(summary, [("Bob", MEANT)], "{}", alice.pane());
    assert_eq!(
        bob_prompts,
        [relayed("Alice", &h[0].id, &h[0].thread, MEANT)]
    );
    let log = std::fs::read_to_string(relay.data_dir().join("team/Alice/wrap.log")).unwrap();
    let dropped = log
        .lines()
        .filter(|l| l.contains("not sent: the reply only quotes this line"))
        .count();
    assert_eq!(dropped, 3, "the ```text, ```sh and escaped lines:\n{log}");
    bob.wait_replies_done();
    alice.wait_replies_done();
    alice.wait_all_relayed("Done.");
    bob.wait_all_relayed("OK.");
    assert_eq!(history(&relay).len(), 1);
    assert_eq!(bob.prompts().len(), 1);
}

tests_of! {
    tall_reply_directive_is_sent_once {
        /// A reply taller than the screen, arriving at once: Claude Code 2.1.328 draws only its
        /// last screenful, so its first paragraph, a directive, never reaches the terminal (issue
        /// 19.2). The wrapper reads it from Claude Code's transcript; Bob gets it once.
        claude_code_directive_above_a_tall_reply_is_sent_once("pty");
        /// The same under the tmux backend.
        claude_code_directive_above_a_tall_reply_is_sent_once_under_tmux("tmux");
    }
}

fn tall_reply_directive_is_sent_once(backend: &str) {
    const FIRST: &str = "The summary is at the top, the details follow.";
    let relay = Relay::start();
    let mut reply = format!("@relay:Bob {FIRST}\n\n");
    for i in 1..=30 {
        reply.push_str(&format!("Paragraph {i} of the details, one line long.\n\n"));
    }
    reply.push_str("That is all.");
    let alice = Agent::start_on(
        &relay,
        Cli::Claude,
        "Alice",
        Script::new(vec![Rule::contains("Write it all", &reply)]),
        backend,
    );
    let bob = Agent::start_on(&relay, Cli::Claude, "Bob", Script::default(), backend);
    alice.wait_ready();
    bob.wait_ready();
    alice.person_types("Write it all");
    let bob_prompts = bob.wait_prompts(1);
    let h = history(&relay);
    let summary: Vec<(&str, &str)> = h.iter().map(|m| (m.to.as_str(), m.body.as_str())).collect();
    assert_eq!(summary, [("Bob", FIRST)], "{}", alice.pane());
    assert_eq!(
        bob_prompts,
        [relayed("Alice", &h[0].id, &h[0].thread, FIRST)]
    );
    // The premise: the screen never showed it (else this tests nothing new).
    let log = std::fs::read_to_string(relay.data_dir().join("team/Alice/wrap.log")).unwrap();
    assert!(
        log.contains("sent from Claude Code's transcript: the screen did not show it"),
        "{log}"
    );
    bob.wait_replies_done();
    alice.wait_replies_done();
    // Both wrappers have relayed all they read (Alice's: from the screen and the transcript).
    alice.wait_all_relayed("That is all.");
    bob.wait_all_relayed("OK.");
    assert_eq!(history(&relay).len(), 1);
    assert_eq!(bob.prompts().len(), 1);
}

tests_of! {
    tall_reply_from {
        /// Gemini CLI given the same tall reply at once writes every line of it to the terminal, so
        /// the directive in its first paragraph is read from the screen, once (issue 19.2: what
        /// holds for tall replies, per CLI).
        gemini_directive_above_a_tall_reply_is_sent_once(Cli::Gemini, "Gemma");
        /// Codex CLI, which the wrapper runs inline (`--no-alt-screen`), writes every line of the
        /// same tall reply above its input box: the directive in its first paragraph is read from
        /// the screen, once. On the alternate screen (Codex's default) that line was never drawn
        /// and the directive was lost (issue 19.2).
        codex_directive_above_a_tall_reply_is_sent_once(Cli::Codex, "Cody");
    }
}

fn tall_reply_from(cli: Cli, name: &str) {
    tall_reply_from_in(&Relay::start(), cli, name);
}

/// Issue 23.17: Codex on its alternate screen (its own default; here a person's profile
/// override takes out the `--no-alt-screen` the wrapper adds) never draws the first lines of a
/// reply taller than the screen. The directive at the top of such a reply is read from the
/// agent's own rollout (the one its Codex process has open) and reaches Bob once. Before, it
/// was lost.
#[test]
fn codex_on_its_alternate_screen_sends_a_tall_replys_directive_once() {
    let relay = Relay::start();
    let profiles = relay
        .dir
        .path()
        .join("home-Alto/.config/agent-relay/profiles");
    std::fs::create_dir_all(&profiles).unwrap();
    std::fs::write(profiles.join("codex.toml"), "args = []\n").unwrap();
    let log = tall_reply_from_in(&relay, Cli::Codex, "Alto");
    assert!(
        log.contains("sent from Codex's rollout: the screen did not show it"),
        "the directive was read off the screen, not the rollout: the test did not run Codex \
         on its alternate screen:\n{log}"
    );
}

/// [`tall_reply_from`] on `relay`; the wrapper's log.
fn tall_reply_from_in(relay: &Relay, cli: Cli, name: &str) -> String {
    const FIRST: &str = "The summary is at the top, the details follow.";
    let (mut bob, _) = relay.agent("Bob");
    bob.read_timeout(LONG);
    let mut reply = format!("@relay:Bob {FIRST}\n\n");
    for i in 1..=30 {
        reply.push_str(&format!("Paragraph {i} of the details, one line long.\n\n"));
    }
    reply.push_str("That is all.");
    let agent = Agent::start(
        relay,
        cli,
        name,
        Script::new(vec![Rule::contains("Write it all", &reply)]),
    );
    agent.wait_ready();
    agent.person_types("Write it all");
    // Bob's connection hears a PING every 5 s: wait on the history, which has a deadline.
    wait_for(LONG, "the directive reaches the relay", || {
        !history(relay).is_empty()
    });
    let d = bob.expect("DELIVER");
    assert_eq!(d["payload"]["body"], FIRST, "{}", agent.pane());
    bob.ack(&d);
    agent.wait_replies_done();
    // The reply was drawn to its end and the wrapper has relayed all it read of it.
    agent.wait_all_relayed("That is all.");
    let h = history(relay);
    assert_eq!(h.len(), 1, "{h:?}");
    agent.wrap_log()
}

/// Two Claude Code agents in one working directory (one repository, as people run them)
/// write their transcripts into one folder. Each wrapper must send only what its own agent
/// said: Alice's tall reply reaches Carol once, from Alice, and Bob's wrapper, reading the
/// folder after Bob's own reply, sends nothing of Alice's.
#[test]
fn claude_agents_sharing_a_folder_send_only_their_own_transcripts_directives() {
    const FIRST: &str = "The summary is at the top, the details follow.";
    let relay = Relay::start();
    let (mut carol, _) = relay.agent("Carol");
    carol.read_timeout(LONG);
    let mut reply = format!("@relay:Carol {FIRST}\n\n");
    for i in 1..=30 {
        reply.push_str(&format!("Paragraph {i} of the details, one line long.\n\n"));
    }
    reply.push_str("That is all.");
    let alice = Agent::start_in(
        &relay,
        Cli::Claude,
        "Alice",
        Script::new(vec![Rule::contains("Write it all", &reply)]),
        "pty",
        ("home", "repo"),
    );
    let bob = Agent::start_in(
        &relay,
        Cli::Claude,
        "Bob",
        Script::new(vec![Rule::contains(
            "Say hello",
            "Hello.\n\n@relay:Carol hello from Bob",
        )]),
        "pty",
        ("home", "repo"),
    );
    alice.wait_ready();
    bob.wait_ready();
    alice.person_types("Write it all");
    wait_for(LONG, "Alice's directive reaches the relay", || {
        !history(&relay).is_empty()
    });
    alice.wait_replies_done();
    // Bob answers a prompt after Alice's transcript has her reply: his wrapper reads the
    // shared folder when his output goes quiet.
    bob.person_types("Say hello");
    wait_for(LONG, "Bob's directive reaches the relay", || {
        history(&relay).iter().any(|m| m.from == "Bob")
    });
    bob.wait_replies_done();
    // Bob's wrapper looks at the transcripts when his output goes quiet after his reply, and
    // once more a second later: wait for that second look, logged after his directive.
    let log = relay.data_dir().join("team/Bob/wrap.log");
    wait_for(
        LONG,
        "Bob's wrapper looks at the transcripts after his reply",
        || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            text.find("relaying a directive")
                .is_some_and(|at| text[at..].contains("the transcript was looked at once more"))
        },
    );
    let h = history(&relay);
    let summary: Vec<(&str, &str, &str)> = h
        .iter()
        .map(|m| (m.from.as_str(), m.to.as_str(), m.body.as_str()))
        .collect();
    assert_eq!(
        summary,
        [
            ("Alice", "Carol", FIRST),
            ("Bob", "Carol", "hello from Bob")
        ],
        "{h:?}"
    );
}
