//! The decision core ([`Core`]) on its own: what the loop hears goes in with a made-up clock,
//! effects come out, and no terminal, relay or runtime is involved. One test per decision,
//! named as the behaviour; the property test at the end checks that every accepted delivery
//! is typed once or failed with a reason, across random output, keys, receipts and restarts.
//!
//! A [`World`] plays the shell: it carries out the effects that answer back (a person's
//! activity, an Enter a stopped wrapper did not press) and records all of them. A restarted
//! wrapper's core starts from what the shell would have written: the ledger replayed from the
//! [`Effect::Record`]s of every earlier life (as `state::load_injected` reads them back from
//! `injected.log`, whose round trip `state.rs` tests), and under tmux the last checkpoint
//! saved. No file is read or written here.

use std::time::{Duration, Instant};

use relay_client::Delivered;
use relay_parse::Directive;
use relay_parse::transcript::Origin;
use relay_protocol::{DeliveryState, TerminalState};

use super::Core;
use crate::decide::effect::Effect;
use crate::decide::ledger::{Ledger, Record};
use crate::decide::outbox::Gate;
use crate::decide::resume::Resume;
use crate::decide::testing::{BUSY, IDLE, config, screen};
use crate::format::Delivery;
use crate::state::Checkpoint;

/// The checkpoint a tmux wrapper starts from, the session's first.
const FIRST_CHECKPOINT: Checkpoint = Checkpoint {
    offset: 0,
    at_ms: 1,
};

/// One wrapper's core on a made-up clock, and everything it asked for.
struct World {
    dir: std::path::PathBuf,
    core: Core,
    now: Instant,
    /// The person's keys come through the wrapper (a PTY).
    sees_keys: bool,
    /// Every effect, in order, over every life of the wrapper.
    effects: Vec<Effect>,
    /// What the terminal shows as the cursor's row (tmux checkpoints).
    row: u64,
    /// The terminal outlives the wrapper (tmux), with this history: every text typed into it.
    kept: Option<String>,
}

impl World {
    /// A PTY wrapper keeping its files in `dir`, given messages by `delivery`.
    fn new(dir: &std::path::Path, delivery: Delivery) -> Self {
        Self::with_gate(dir, delivery, None)
    }

    fn with_gate(dir: &std::path::Path, delivery: Delivery, gate: Option<Box<dyn Gate>>) -> Self {
        let now = relay_protocol::now_instant();
        let core = Core::new(config(dir, delivery), Ledger::default(), gate, 24, now);
        Self {
            dir: dir.to_owned(),
            core,
            now,
            sees_keys: true,
            effects: Vec::new(),
            row: 0,
            kept: None,
        }
    }

    /// A tmux wrapper: the pane outlives it, and the person's keys do not come through.
    fn tmux(dir: &std::path::Path) -> Self {
        let mut w = Self::new(dir, Delivery::Each);
        w.sees_keys = false;
        w.kept = Some(String::new());
        w.core.resume = Some(Resume::new(FIRST_CHECKPOINT, "s".into()));
        w
    }

    /// The wrapper restarted (a PTY agent restarted with it), from what the shell wrote: the
    /// ledger's records and, under tmux, the last checkpoint.
    fn restart(&mut self) {
        let delivery = self.core.cfg.delivery;
        let mut ledger = Ledger::default();
        for e in &self.effects {
            if let Effect::Record(r) = e {
                ledger.load(r.clone());
            }
        }
        self.core = Core::new(config(&self.dir, delivery), ledger, None, 24, self.now);
        if self.kept.is_some() {
            let saved = self.effects.iter().rev().find_map(|e| match e {
                Effect::SaveCheckpoint(c) => Some(*c),
                _ => None,
            });
            self.core.resume = Some(Resume::new(saved.unwrap_or(FIRST_CHECKPOINT), "s".into()));
        }
    }

    /// Carries out the effects that answer back, records all of them.
    fn collect(&mut self) {
        loop {
            let effects = self.core.take_effects();
            if effects.is_empty() {
                return;
            }
            for e in effects {
                match &e {
                    Effect::Type(text) => {
                        if let Some(history) = &mut self.kept {
                            history.push_str(text);
                            history.push('\n');
                        }
                    }
                    Effect::ReadActivity => self.core.person_activity(None),
                    Effect::NoteActivity => self.core.chain_entered(None),
                    Effect::EnterReplayed(m) => self.core.replayed_given(m.clone()),
                    _ => {}
                }
                self.effects.push(e);
            }
        }
    }

    /// Does whatever is due now, as the loop does after each event.
    fn drive(&mut self) {
        self.core.drive_output(self.now, self.sees_keys);
        self.collect();
        if self.core.checkpoint_due() {
            self.core.checkpoint_at(self.row, 1);
            self.collect();
        }
        self.core.drive_typing(self.now, self.sees_keys);
        self.collect();
    }

    fn print(&mut self, bytes: &[u8]) {
        self.core.output_read(bytes.len(), self.now);
        self.core.on_output(bytes, self.now);
        self.collect();
        self.drive();
    }

    fn keys(&mut self, keys: &[u8]) {
        self.core.on_keys(keys, self.now);
        self.drive();
    }

    fn deliver(&mut self, m: Delivered) {
        let kept = self.kept.is_some();
        let history = self
            .kept
            .clone()
            .filter(|_| self.core.needs_history(&m, kept));
        self.core.on_message(m, kept, history.as_deref());
        self.collect();
        self.drive();
    }

    fn receipt(&mut self) {
        self.core.on_receipt();
        self.drive();
    }

    /// Lets `ms` of made-up time pass, waking up whenever the core asked to.
    fn pass(&mut self, ms: u64) {
        let until = self.now + Duration::from_millis(ms);
        while let Some(wake) = self.core.next_wake().filter(|w| *w <= until) {
            self.now = self.now.max(wake);
            self.drive();
            if self.core.next_wake() == Some(wake) {
                // Nothing was due after all: on to the next moment.
                break;
            }
        }
        self.now = until;
        self.drive();
    }

    fn texts(&self) -> Vec<&str> {
        self.effects
            .iter()
            .filter_map(|e| match e {
                Effect::Type(t) => Some(t.as_str()),
                _ => None,
            })
            .collect()
    }

    fn enters(&self) -> usize {
        self.effects.iter().filter(|e| **e == Effect::Enter).count()
    }

    /// Acknowledgements: the message's id and its outcome (with the reason of a failure).
    fn acks(&self) -> Vec<(String, DeliveryState, Option<String>)> {
        self.effects
            .iter()
            .filter_map(|e| match e {
                Effect::Ack(m, state) => Some((m.id.clone(), *state, None)),
                Effect::AckShown(m, _) => Some((m.id.clone(), DeliveryState::Verified, None)),
                Effect::Fail(m, why) => {
                    Some((m.id.clone(), DeliveryState::Failed, Some(why.clone())))
                }
                _ => None,
            })
            .collect()
    }

    /// Directives relayed: to, body, in reply to.
    fn relayed(&self) -> Vec<(String, String, Option<String>)> {
        self.effects
            .iter()
            .filter_map(|e| match e {
                Effect::Relay { msg, to } => Some((
                    to.clone(),
                    msg.payload.body.clone(),
                    msg.payload.in_reply_to.clone(),
                )),
                _ => None,
            })
            .collect()
    }
}

fn message(id: &str, from: &str, body: &str) -> Delivered {
    let mut m = crate::decide::testing::message(id, from, None);
    body.clone_into(&mut m.payload.body);
    m
}

fn verified(id: &str) -> (String, DeliveryState, Option<String>) {
    (id.to_owned(), DeliveryState::Verified, None)
}

#[test]
fn a_message_waits_while_the_agent_is_busy_and_is_typed_once_it_is_idle() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = World::new(dir.path(), Delivery::Each);
    w.print(&screen(BUSY));
    w.deliver(message("m-busy", "Bob", "hello"));
    w.pass(60_000);
    assert!(w.texts().is_empty(), "typed into a busy agent");
    assert_eq!(
        w.core.terminal_report(w.now),
        Some((TerminalState::Busy, Some("esc to interrupt".into())))
    );
    w.print(&screen(IDLE));
    w.pass(499);
    assert!(w.texts().is_empty(), "typed before the output was quiet");
    w.pass(1);
    assert_eq!(w.texts().len(), 1);
    assert!(w.texts()[0].ends_with("hello"));
    // Enter 100 ms after the text; checked 300 ms after it: the input line is empty.
    w.pass(99);
    assert_eq!(w.enters(), 0);
    w.pass(1);
    assert_eq!(w.enters(), 1);
    w.pass(300);
    assert_eq!(w.acks(), vec![verified("m-busy")]);
    assert_eq!(w.enters(), 1);
}

#[test]
fn a_persons_half_written_line_holds_a_message_back_until_their_enter() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = World::new(dir.path(), Delivery::Each);
    w.print(&screen(IDLE));
    w.keys(b"fix the");
    w.deliver(message("m-person", "Bob", "hello"));
    w.pass(60_000);
    assert!(w.texts().is_empty());
    assert_eq!(
        w.core.terminal_report(w.now),
        Some((TerminalState::Blocked, Some("a person is typing".into())))
    );
    w.keys(b" tests\r");
    w.print(&screen(IDLE));
    w.pass(1_000);
    assert_eq!(w.texts().len(), 1);
    assert_eq!(w.acks(), vec![verified("m-person")]);
}

#[test]
fn a_dialog_holds_a_message_back_until_it_closes() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = World::new(dir.path(), Delivery::Each);
    w.print(&screen("Do you want to run `rm x`?\n 1. Yes\n 2. No\n> "));
    w.deliver(message("m-dialog", "Bob", "hello"));
    w.pass(60_000);
    assert!(w.texts().is_empty(), "typed into a dialog");
    w.print(&screen(IDLE));
    w.pass(1_000);
    assert_eq!(w.texts().len(), 1);
}

#[test]
fn a_text_left_in_the_input_line_gets_enter_again_then_is_reported_failed_with_why() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = World::new(dir.path(), Delivery::Each);
    w.print(&screen(IDLE));
    w.deliver(message("m-stuck", "Bob", "hello"));
    w.pass(500);
    let text = w.texts()[0].to_owned();
    w.print(&screen(&format!("done.\n> {text}")));
    w.pass(1_000);
    assert_eq!(w.enters(), 2);
    let acks = w.acks();
    assert_eq!(acks.len(), 1, "{acks:?}");
    assert_eq!(acks[0].1, DeliveryState::Failed);
    assert!(
        acks[0]
            .2
            .as_deref()
            .is_some_and(|why| why.contains("not submitted")),
        "{acks:?}"
    );
    w.pass(60_000);
    assert_eq!(w.texts().len(), 1, "typed again");
}

#[test]
fn a_replayed_message_is_acknowledged_from_the_ledger_and_not_typed_again() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = World::new(dir.path(), Delivery::Each);
    w.print(&screen(BUSY));
    w.deliver(message("m-once", "Bob", "hello"));
    w.deliver(message("m-once", "Bob", "hello"));
    w.print(&screen(IDLE));
    w.pass(2_000);
    assert_eq!(w.texts().len(), 1, "queued twice");
    w.deliver(message("m-once", "Bob", "hello"));
    w.restart();
    w.print(&screen(IDLE));
    w.deliver(message("m-once", "Bob", "hello"));
    w.pass(5_000);
    assert_eq!(w.texts().len(), 1, "typed again after a restart");
    assert_eq!(w.acks(), vec![verified("m-once"); 3]);
}

#[test]
fn a_restarted_pty_wrapper_types_again_only_what_was_never_entered() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = World::new(dir.path(), Delivery::Each);
    w.print(&screen(IDLE));
    w.deliver(message("m-typed", "Bob", "one"));
    w.pass(550);
    assert_eq!((w.texts().len(), w.enters()), (1, 0));
    w.restart();
    w.print(&screen(IDLE));
    w.deliver(message("m-entered", "Bob", "two"));
    w.pass(700);
    assert_eq!(w.enters(), 1);
    w.restart();
    w.print(&screen(IDLE));
    w.deliver(message("m-typed", "Bob", "one"));
    w.deliver(message("m-entered", "Bob", "two"));
    w.pass(5_000);
    let texts = w.texts();
    assert_eq!(texts.len(), 3, "{texts:?}");
    assert!(texts[2].ends_with("one"), "{texts:?}");
    let acks = w.acks();
    assert!(acks.contains(&verified("m-typed")), "{acks:?}");
    assert!(
        acks.iter().any(|(id, state, why)| id == "m-entered"
            && *state == DeliveryState::Failed
            && why.as_deref() == Some(crate::decide::ledger::READ_UNKNOWN)),
        "{acks:?}"
    );
}

#[test]
fn a_directive_printed_after_a_typed_message_is_relayed_once_in_reply_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = World::new(dir.path(), Delivery::Each);
    w.print(&screen(IDLE));
    w.deliver(message("m-ask", "Bob", "what now?"));
    w.pass(1_000);
    assert_eq!(w.acks(), vec![verified("m-ask")]);
    w.print(&screen("@relay:Bob the tests pass\n\n> "));
    w.pass(600);
    // Redrawn: relayed once.
    w.print(&screen("@relay:Bob the tests pass\n\n> "));
    w.pass(2_000);
    assert_eq!(
        w.relayed(),
        vec![("Bob".into(), "the tests pass".into(), Some("m-ask".into()))]
    );
}

#[test]
fn a_directive_after_a_persons_enter_answers_no_relayed_message() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = World::new(dir.path(), Delivery::Each);
    w.print(&screen(IDLE));
    w.deliver(message("m-ask", "Bob", "what now?"));
    w.pass(1_000);
    w.keys(b"do something else\r");
    w.print(&screen("@relay:Bob done\n\n> "));
    w.pass(2_000);
    assert_eq!(w.relayed(), vec![("Bob".into(), "done".into(), None)]);
}

#[test]
fn messages_that_waited_are_typed_as_one_digest_and_acknowledged_each() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = World::new(dir.path(), Delivery::Digest);
    w.print(&screen(BUSY));
    w.deliver(message("m-1", "Bob", "one"));
    w.deliver(message("m-2", "Carol", "two"));
    w.print(&screen(IDLE));
    w.pass(2_000);
    let texts = w.texts();
    assert_eq!(texts.len(), 1, "{texts:?}");
    assert!(
        texts[0].contains("one") && texts[0].contains("two"),
        "{texts:?}"
    );
    assert_eq!(w.acks(), vec![verified("m-1"), verified("m-2")]);
    // A directive to one of the senders answers that sender's message.
    w.print(&screen("@relay:Bob ok\n\n> "));
    w.pass(2_000);
    assert_eq!(
        w.relayed(),
        vec![("Bob".into(), "ok".into(), Some("m-1".into()))]
    );
}

#[test]
fn a_malformed_directive_is_not_relayed_and_the_agent_is_told_why() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = World::new(dir.path(), Delivery::Each);
    w.print(&screen("@relay:Bob! hi\n\n> "));
    w.pass(2_000);
    assert!(w.relayed().is_empty());
    let texts = w.texts();
    assert_eq!(texts.len(), 1, "{texts:?}");
    assert!(texts[0].starts_with("relay: "), "{texts:?}");
}

/// Claude Code's record of its replies as the wrapper reads it (the pure part: what the
/// replies said, and what went from where).
struct Replies(relay_parse::transcript::ReplySource);

impl Gate for Replies {
    fn knows(&mut self, d: &Directive) -> bool {
        self.0.knows(d)
    }
    fn check(&mut self, d: &Directive) -> Origin {
        self.0.check(d)
    }
    fn sends_unseen(&self) -> bool {
        true
    }
    fn writes_at_reply_end(&self) -> bool {
        false
    }
    fn look_for_own(&mut self) {}
    fn take_unseen(&mut self) -> Vec<Directive> {
        self.0.take_unseen()
    }
    fn files(&self) -> usize {
        1
    }
    fn cli(&self) -> &'static str {
        "Claude Code"
    }
    fn folder(&self) -> std::path::PathBuf {
        std::path::PathBuf::from("/nowhere")
    }
    fn set_agent_pid(&mut self, _pid: u32) {}
    fn new_turn(&mut self) {
        self.0.new_turn();
    }
}

#[test]
fn a_line_the_transcript_says_the_reply_only_quotes_is_not_relayed() {
    let dir = tempfile::tempdir().unwrap();
    let mut record = relay_parse::transcript::ReplySource::new();
    record.add_reply("@relay:Bob real\n\n```text\n@relay:Bob syntax\n```");
    let mut w = World::with_gate(dir.path(), Delivery::Each, Some(Box::new(Replies(record))));
    w.print(&screen("@relay:Bob syntax\n\n@relay:Bob real\n\n> "));
    w.pass(2_000);
    assert_eq!(w.relayed(), vec![("Bob".into(), "real".into(), None)]);
}

#[test]
fn a_directive_the_transcript_lacks_waits_the_settle_time_then_goes_by_the_screen() {
    let dir = tempfile::tempdir().unwrap();
    let record = relay_parse::transcript::ReplySource::new();
    let mut w = World::with_gate(dir.path(), Delivery::Each, Some(Box::new(Replies(record))));
    w.print(b"@relay:Bob hi\r\n\r\n");
    w.pass(100);
    assert!(w.relayed().is_empty(), "went before its wait");
    w.pass(2_000);
    assert_eq!(w.relayed(), vec![("Bob".into(), "hi".into(), None)]);
}

/// Which way a directive goes is timing, and both ways send the reply's own text, once: the
/// screen draws it before the output goes quiet (the screen's copy, drawn without the
/// Markdown marks, is given the reply's text), or Claude Code, slowed on a loaded machine, has
/// written its record but not drawn the reply when the output has been quiet the settle time
/// (it goes from the record, and the screen's copy drawn later is not sent again). The
/// second is what `doors::claude_code_directive_with_a_40_line_code_block_arrives_byte_for_byte`
/// saw twice under load.
#[test]
fn a_directive_goes_once_with_the_reply_s_text_whether_the_screen_or_the_record_is_first() {
    let said = "apply the **patch** in src/lib.rs before the release";
    let drawn = "@relay:Bob apply the patch in src/lib.rs before the release\n\ndone.\n> ";
    let record = || {
        let mut r = relay_parse::transcript::ReplySource::new();
        r.add_reply(&format!("Here.\n\n@relay:Bob {said}\n\nThat is all."));
        Some(Box::new(Replies(r)) as Box<dyn Gate>)
    };
    let want = vec![("Bob".to_owned(), said.to_owned(), None)];
    // The screen first.
    let dir = tempfile::tempdir().unwrap();
    let mut w = World::with_gate(dir.path(), Delivery::Each, record());
    w.print(&screen(drawn));
    w.pass(2_000);
    assert_eq!(w.relayed(), want, "the screen first");
    // The record first: the output goes quiet before the reply is drawn.
    let dir = tempfile::tempdir().unwrap();
    let mut w = World::with_gate(dir.path(), Delivery::Each, record());
    w.print(&screen(BUSY));
    w.pass(2_000);
    assert_eq!(
        w.relayed(),
        want,
        "from the record, before the screen drew it"
    );
    w.print(&screen(drawn));
    w.pass(2_000);
    assert_eq!(
        w.relayed(),
        want,
        "the screen's copy drawn later is not sent again"
    );
}

#[test]
fn a_tmux_checkpoint_moves_only_once_every_directive_is_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = World::new(dir.path(), Delivery::Each);
    w.sees_keys = false;
    w.core.resume = Some(Resume::new(
        Checkpoint {
            offset: 0,
            at_ms: 1,
        },
        "s".into(),
    ));
    w.row = 3;
    w.print(b"@relay:Bob first\r\n\r\n> ");
    w.pass(2_000);
    let saved = |w: &World| {
        w.effects
            .iter()
            .filter(|e| matches!(e, Effect::SaveCheckpoint(_)))
            .count()
    };
    assert_eq!(w.relayed().len(), 1);
    assert_eq!(saved(&w), 0, "saved before the receipt came");
    w.receipt();
    assert_eq!(saved(&w), 1);
    assert!(w.effects.contains(&Effect::SaveCheckpoint(Checkpoint {
        offset: 3,
        at_ms: 1
    })));
}

#[test]
fn the_agent_printing_for_a_second_is_reported_busy_and_then_idle() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = World::new(dir.path(), Delivery::Each);
    for _ in 0..11 {
        w.print(b"x");
        w.pass(100);
    }
    assert_eq!(
        w.core.terminal_report(w.now),
        Some((TerminalState::Busy, Some("printing".into())))
    );
    w.pass(1_000);
    assert_eq!(
        w.core.terminal_report(w.now),
        Some((TerminalState::Idle, None))
    );
}

#[test]
fn a_restarted_tmux_wrapper_presses_the_missing_enter_and_never_types_a_shown_message_again() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = World::tmux(dir.path());
    w.print(&screen(IDLE));
    w.deliver(message("m-shown", "Bob", "one"));
    w.pass(550);
    assert_eq!((w.texts().len(), w.enters()), (1, 0));
    let text = w.texts()[0].to_owned();
    // The pane lives on with the text waiting in its input line; a new wrapper reads it.
    w.restart();
    w.print(&screen(&format!("done.\n> {text}")));
    let before = w.effects.len();
    w.deliver(message("m-shown", "Bob", "one"));
    let after: Vec<&Effect> = w.effects[before..].iter().collect();
    assert!(
        matches!(after.first(), Some(Effect::EnterReplayed(m)) if m.id == "m-shown"),
        "{after:?}"
    );
    assert_eq!(w.texts().len(), 1, "typed again");
    assert_eq!(
        w.acks(),
        vec![("m-shown".to_owned(), DeliveryState::Injected, None)]
    );
}

#[test]
fn a_re_read_pane_relays_what_follows_the_checkpoint_with_the_ids_it_had_and_nothing_above() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = World::tmux(dir.path());
    w.print(b"@relay:Bob first\r\n\r\n> \r\n@relay:Bob second\r\n\r\n> ");
    w.pass(2_000);
    let ids = |w: &World| -> Vec<(String, Option<String>)> {
        w.effects
            .iter()
            .filter_map(|e| match e {
                Effect::Relay { msg, .. } => Some((msg.payload.body.clone(), msg.id.clone())),
                _ => None,
            })
            .collect()
    };
    let before = ids(&w);
    assert_eq!(before.len(), 2, "{before:?}");
    // The control client was replaced: the pane is read again from the checkpoint (the
    // session's start: no receipt came, so it never moved), the first row above it.
    w.core.resync(
        crate::terminal::Snapshot {
            seen: b"@relay:Bob first\r\n\r\n".to_vec(),
            unseen: b"> \r\n@relay:Bob second\r\n\r\n> ".to_vec(),
            rows: 24,
            cols: 80,
            notes_before: 0,
        },
        w.now,
    );
    w.collect();
    w.pass(2_000);
    let after = ids(&w);
    assert_eq!(after.len(), 3, "{after:?}");
    assert_eq!(after[2], before[1], "the same directive, the same id");
}

#[test]
fn a_stop_hook_hands_the_waiting_messages_over_and_the_next_one_verifies_them() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = World::new(dir.path(), Delivery::Each);
    w.print(&screen(BUSY));
    w.deliver(message("m-hook", "Bob", "hello"));
    // A Stop hook that continued a turn takes nothing.
    assert!(w.core.hook_stop(true).is_empty());
    let texts = w.core.hook_stop(false);
    w.collect();
    assert_eq!(texts.len(), 1);
    assert!(texts[0].ends_with("hello"), "{texts:?}");
    assert_eq!(
        w.acks(),
        vec![("m-hook".to_owned(), DeliveryState::Injected, None)]
    );
    // Never typed after, and verified when the turn it started ends.
    w.print(&screen(IDLE));
    w.pass(5_000);
    assert!(w.texts().is_empty(), "typed after a hook took it");
    assert!(w.core.hook_stop(false).is_empty());
    w.collect();
    assert_eq!(w.acks().last(), Some(&verified("m-hook")));
    // Its answer is in reply to it.
    w.print(&screen("@relay:Bob thanks\n\n> "));
    w.pass(2_000);
    assert_eq!(
        w.relayed(),
        vec![("Bob".into(), "thanks".into(), Some("m-hook".into()))]
    );
}

#[test]
fn under_notice_delivery_a_message_is_verified_when_the_agents_tool_shows_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = World::new(dir.path(), Delivery::Notice);
    w.print(&screen(IDLE));
    w.deliver(message("m-note", "Bob", "the long story"));
    w.pass(1_000);
    let texts = w.texts();
    assert_eq!(texts.len(), 1);
    assert!(
        !texts[0].contains("the long story"),
        "a notice names, it does not tell"
    );
    assert_eq!(
        w.acks(),
        vec![("m-note".to_owned(), DeliveryState::Injected, None)]
    );
    assert_eq!(w.core.shown_by_tool(&["m-note".to_owned()]), 1);
    w.collect();
    assert_eq!(w.acks().last(), Some(&verified("m-note")));
    // Shown before its delivery came: no notice at all.
    assert_eq!(w.core.shown_by_tool(&["m-early".to_owned()]), 0);
    w.deliver(message("m-early", "Bob", "hi"));
    w.pass(1_000);
    assert_eq!(w.texts().len(), 1, "a notice for a message already shown");
    assert_eq!(w.acks().last(), Some(&verified("m-early")));
}

#[test]
fn a_refusal_reason_is_cut_at_a_words_end() {
    use super::{cut_at_word, refusal_notice};
    assert_eq!(cut_at_word("short enough", 20), "short enough");
    assert_eq!(
        cut_at_word("kept in the dead-letter queue", 15),
        "kept in the…"
    );
    assert_eq!(cut_at_word("unbreakableword", 8), "unbreak…");
    let notice = refusal_notice("Bob", &"word ".repeat(200));
    assert!(notice.ends_with("word…"), "{notice}");
}

mod model {
    //! Every accepted delivery is typed once or failed with a reason, across random output,
    //! a person's keys, receipts and restarts of the wrapper (a PTY agent restarted with it):
    //!
    //! - a message is never typed twice into one agent, and never entered into two (a text
    //!   typed and not entered before a restart is typed into the new agent: once);
    //! - every failure says why;
    //! - a message is recorded in the ledger typed before its text is typed, entered before
    //!   its Enter, and before its acknowledgement;
    //! - once the person leaves the input line, the agent is idle and the relay delivers what
    //!   it has no outcome for again, every message gets one.
    //!
    //! Run for each delivery (one by one, as a digest, as a notice) on a PTY, and under tmux,
    //! where the pane outlives its wrapper and a message is typed into it at most once over
    //! every restart.

    use std::collections::{BTreeMap, BTreeSet};

    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Op {
        Deliver(u8),
        Idle,
        Busy,
        Keys(bool),
        Receipt,
        Pass(u16),
        Restart,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0u8..4).prop_map(Op::Deliver),
            2 => Just(Op::Idle),
            1 => Just(Op::Busy),
            1 => any::<bool>().prop_map(Op::Keys),
            1 => Just(Op::Receipt),
            3 => (0u16..1500).prop_map(Op::Pass),
            1 => Just(Op::Restart),
        ]
    }

    fn id(n: u8) -> String {
        format!("message-{n}")
    }

    /// The ids in a typed text.
    fn ids_in(text: &str) -> Vec<String> {
        (0..4)
            .map(id)
            .filter(|id| text.contains(&format!("[{}]", relay_protocol::short_id(id))))
            .collect()
    }

    /// What the effects of one life say: texts typed per id (`typed`: into this terminal, for
    /// the life of the wrapper or, tmux, of the pane), and typings entered per id.
    fn check_life(
        effects: &[Effect],
        typed: &mut BTreeMap<String, u32>,
        entered: &mut BTreeMap<String, u32>,
    ) -> Result<(), TestCaseError> {
        let mut current: Vec<String> = Vec::new();
        let mut counted = false;
        for e in effects {
            match e {
                Effect::Type(t) => {
                    current = ids_in(t);
                    counted = false;
                    for id in &current {
                        *typed.entry(id.clone()).or_default() += 1;
                        prop_assert!(typed[id] <= 1, "{id} typed twice into one terminal");
                    }
                }
                Effect::Enter if !counted => {
                    counted = true;
                    for id in &current {
                        *entered.entry(id.clone()).or_default() += 1;
                        prop_assert!(entered[id] <= 1, "{id} entered into two agents");
                    }
                }
                Effect::Fail(m, why) => {
                    prop_assert!(!why.is_empty(), "{} failed without a reason", m.id)
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The promise the shell keeps by carrying the effects out in order: a message is
    /// recorded in the ledger as typed before its text is typed, as entered before its Enter,
    /// and before its outcome goes to the relay, so that a wrapper stopped between the two
    /// finds it recorded.
    fn check_recorded_first(effects: &[Effect]) -> Result<(), TestCaseError> {
        let mut last: BTreeMap<String, &Record> = BTreeMap::new();
        let mut current: Vec<String> = Vec::new();
        for e in effects {
            match e {
                Effect::Record(r) => {
                    last.insert(r.id().to_owned(), r);
                }
                Effect::Type(t) => {
                    current = ids_in(t);
                    for id in &current {
                        prop_assert!(
                            matches!(last.get(id), Some(Record::Started { .. })),
                            "{id} typed before it was recorded typed"
                        );
                    }
                }
                Effect::Enter => {
                    for id in &current {
                        prop_assert!(
                            matches!(last.get(id), Some(Record::Entered { .. })),
                            "{id} entered before it was recorded entered"
                        );
                    }
                }
                Effect::Ack(m, _) | Effect::AckShown(m, _) | Effect::Fail(m, _) => {
                    prop_assert!(
                        last.contains_key(&m.id),
                        "{} acknowledged before it was recorded",
                        m.id
                    );
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The ids with an outcome (acknowledged or failed) in `effects`.
    fn outcomes(effects: &[Effect]) -> BTreeSet<String> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::Ack(m, _) | Effect::AckShown(m, _) | Effect::Fail(m, _) => {
                    Some(m.id.clone())
                }
                _ => None,
            })
            .collect()
    }

    /// Runs `ops` on a wrapper (PTY, or tmux when `tmux`), then checks the properties.
    fn run(ops: Vec<Op>, tmux: bool, delivery: Delivery) -> Result<(), TestCaseError> {
        let dir = tempfile::tempdir().unwrap();
        let mut w = if tmux {
            World::tmux(dir.path())
        } else {
            World::new(dir.path(), delivery)
        };
        let mut delivered: BTreeSet<String> = BTreeSet::new();
        let mut typed: BTreeMap<String, u32> = BTreeMap::new();
        let mut entered: BTreeMap<String, u32> = BTreeMap::new();
        let mut life_start = 0;
        let mut person_line = false;
        for op in ops {
            match op {
                Op::Deliver(n) => {
                    delivered.insert(id(n));
                    w.deliver(message(&id(n), "Bob", "hello"));
                }
                Op::Idle => w.print(&screen(IDLE)),
                Op::Busy => w.print(&screen(BUSY)),
                // Under tmux the person's keys do not come through the wrapper.
                Op::Keys(_) if tmux => {}
                Op::Keys(enter) => {
                    person_line = !enter;
                    w.keys(if enter { b"go\r" } else { b"half" });
                }
                Op::Receipt => w.receipt(),
                Op::Pass(ms) => w.pass(u64::from(ms)),
                Op::Restart => {
                    check_life(&w.effects[life_start..], &mut typed, &mut entered)?;
                    life_start = w.effects.len();
                    person_line = false;
                    if !tmux {
                        // A new agent: nothing was typed into it yet.
                        typed.clear();
                    }
                    w.restart();
                    // The relay delivers again what it has no outcome for.
                    let done = outcomes(&w.effects);
                    for id in delivered.difference(&done).cloned().collect::<Vec<_>>() {
                        w.deliver(message(&id, "Bob", "hello"));
                    }
                }
            }
        }
        // The person leaves the input line, the agent is idle, the relay delivers again.
        if person_line {
            w.keys(b"\r");
        }
        w.print(&screen(IDLE));
        let done = outcomes(&w.effects);
        for id in delivered.difference(&done).cloned().collect::<Vec<_>>() {
            w.deliver(message(&id, "Bob", "hello"));
        }
        w.pass(60_000);
        check_life(&w.effects[life_start..], &mut typed, &mut entered)?;
        check_recorded_first(&w.effects)?;
        let done = outcomes(&w.effects);
        let missing: Vec<&String> = delivered.difference(&done).collect();
        prop_assert!(missing.is_empty(), "no outcome for {missing:?}");
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

        #[test]
        fn every_accepted_delivery_is_typed_once_or_failed_with_a_reason(
            ops in proptest::collection::vec(op(), 1..40)
        ) {
            run(ops, false, Delivery::Each)?;
        }

        /// Under tmux the pane outlives its wrapper: a message is typed into it at most once
        /// over every restart, its history telling a restarted wrapper what was typed.
        #[test]
        fn every_accepted_delivery_is_typed_once_into_a_pane_that_outlives_its_wrapper(
            ops in proptest::collection::vec(op(), 1..40)
        ) {
            run(ops, true, Delivery::Each)?;
        }

        /// Messages that waited typed as one digest: each still once, each with its outcome.
        #[test]
        fn every_message_of_a_digest_is_typed_once_or_failed_with_a_reason(
            ops in proptest::collection::vec(op(), 1..40)
        ) {
            run(ops, false, Delivery::Digest)?;
        }

        /// Only a notice typed for each: never twice, each with its outcome.
        #[test]
        fn every_noticed_message_is_noticed_once_or_failed_with_a_reason(
            ops in proptest::collection::vec(op(), 1..40)
        ) {
            run(ops, false, Delivery::Notice)?;
        }
    }
}
