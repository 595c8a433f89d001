//! The wrapper's loop (`serve`) and its core against a fake terminal and a fake relay, under
//! tokio's paused clock: what the end-to-end tests could only show by waiting and hoping
//! nothing happened (a message not typed while the agent is busy, over a person's line or a
//! dialog; nothing typed twice) is shown here deterministically. `settle` lets every timer
//! due within the given time fire, in virtual time, before the test looks.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use relay_client::{Delivered, Event};
use relay_protocol::{DeliveryState, TerminalState};
use tokio::sync::mpsc;

use super::{Core, Ended, WrapError, door};
use crate::decide::resume::Resume;
use crate::decide::testing::{BUSY, IDLE, config, screen};
use crate::fake_relay as fake;
use crate::shell::Shell;
use crate::state::Checkpoint;
use crate::terminal::Snapshot;
use crate::terminal::{Fake, Kept, TermEvent, Typed};

fn message(id: &str, body: &str) -> Delivered {
    let mut m = crate::decide::testing::message(id, "Bob", None);
    body.clone_into(&mut m.payload.body);
    m
}

/// One wrapper: its loop runs on a task, over a fake terminal and a fake relay.
struct Rig {
    term: mpsc::UnboundedSender<TermEvent>,
    typed: Arc<Mutex<Vec<Typed>>>,
    relay: mpsc::UnboundedSender<Event>,
    log: Arc<Mutex<fake::Log>>,
    task: tokio::task::JoinHandle<Result<Ended, WrapError>>,
}

impl Rig {
    /// A wrapper keeping its files in `dir` (a second rig on the same `dir` is the wrapper
    /// restarted). `sees_keys`: a PTY (the person's keys come through) or tmux (they do not).
    fn start(dir: &std::path::Path, sees_keys: bool) -> Self {
        Self::start_with(dir, sees_keys, None)
    }

    /// A wrapper of a tmux agent whose pane answers from `pane`, resuming from the checkpoint
    /// in `dir`. As `serve_tmux` does, it reads the pane first, before its loop: `seen` rows
    /// above the checkpoint, `unseen` from it on.
    fn start_tmux(
        dir: &std::path::Path,
        pane: &Arc<Mutex<Kept>>,
        seen: &str,
        unseen: &str,
    ) -> Self {
        Self::start_with(dir, false, Some((pane.clone(), snapshot(seen, unseen))))
    }

    fn start_with(
        dir: &std::path::Path,
        sees_keys: bool,
        tmux: Option<(Arc<Mutex<Kept>>, Snapshot)>,
    ) -> Self {
        let (pane, first) = tmux.unzip();
        let (relay, relay_tx, log) = fake::Relay::new();
        let (term, term_tx, typed) = Fake::new(sees_keys);
        let term = match &pane {
            Some(p) => term.keeping(p.clone()),
            None => term,
        };
        let resume = pane.map(|_| {
            let mut checkpoint = Checkpoint::load(dir);
            if checkpoint.at_ms == 0 {
                checkpoint.at_ms = 1_700_000_000_000;
                checkpoint.save(dir).unwrap();
            }
            Resume::new(checkpoint, "fake".to_owned())
        });
        let cfg = config(dir, crate::format::Delivery::default());
        let task = tokio::spawn(async move {
            let ledger = super::load_ledger(&cfg)?;
            let mut core = Core::new(cfg, ledger, None, 24, super::now());
            let mut shell = Shell::new(relay);
            core.resume = resume;
            let mut term = term;
            if let Some(snap) = first {
                core.resync(snap, super::now());
                shell.apply(&mut core, &mut term).await?;
            }
            let mut door = door::open(&core.cfg.team_dir, "Alice", "test-key");
            let ended = shell.serve(&mut core, &mut term, &mut door).await;
            shell.end(&mut core, &mut term).await;
            ended
        });
        Self {
            term: term_tx,
            typed,
            relay: relay_tx,
            log,
            task,
        }
    }

    fn print(&self, bytes: Vec<u8>) {
        self.term.send(TermEvent::Output(bytes)).unwrap();
    }

    fn keys(&self, keys: &[u8]) {
        self.term.send(TermEvent::Keys(keys.to_vec())).unwrap();
    }

    fn deliver(&self, m: Delivered) {
        self.relay.send(Event::Message(m)).unwrap();
    }

    fn typed(&self) -> Vec<Typed> {
        self.typed.lock().unwrap().clone()
    }

    /// The texts typed (not Enters or keys).
    fn texts(&self) -> Vec<String> {
        self.typed()
            .into_iter()
            .filter_map(|t| match t {
                Typed::Text(s) => Some(s),
                _ => None,
            })
            .collect()
    }

    fn enters(&self) -> usize {
        self.typed().iter().filter(|t| **t == Typed::Enter).count()
    }

    fn acks(&self) -> Vec<(String, Option<DeliveryState>)> {
        self.log.lock().unwrap().acks.clone()
    }

    /// The reasons given with failures: message id and reason.
    fn reasons(&self) -> Vec<(String, String)> {
        self.log.lock().unwrap().reasons.clone()
    }

    /// The last terminal state reported to the relay, and why.
    fn reported(&self) -> Option<(TerminalState, Option<String>)> {
        self.log
            .lock()
            .unwrap()
            .reports
            .last()
            .map(|r| (r.state, r.why.clone()))
    }

    /// Ends the agent (its side of the terminal closes) and waits for the wrapper to finish.
    async fn end(self) {
        self.term.send(TermEvent::Ended).unwrap();
        assert_eq!(self.task.await.unwrap().unwrap(), Ended::Exited);
    }
}

/// Lets virtual time pass: every timer due within `ms` fires, and the loop handles it.
async fn settle(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

#[tokio::test(start_paused = true)]
async fn a_message_waits_while_the_agent_is_busy_and_is_typed_once_it_is_idle() {
    let dir = tempfile::tempdir().unwrap();
    let rig = Rig::start(dir.path(), true);
    rig.print(screen(BUSY));
    rig.deliver(message("m-busy", "hello"));
    // Quiet for a minute, still showing its busy marker: looked at again and again, never
    // typed into.
    settle(60_000).await;
    assert_eq!(rig.typed(), vec![], "typed into a busy agent");
    assert_eq!(
        rig.reported(),
        Some((TerminalState::Busy, Some("esc to interrupt".into())))
    );
    // Idle: typed once the output has been quiet for the profile's 500 ms, not before.
    rig.print(screen(IDLE));
    settle(400).await;
    assert_eq!(rig.typed(), vec![], "typed before the output was quiet");
    settle(200).await;
    let texts = rig.texts();
    assert_eq!(texts.len(), 1, "{texts:?}");
    assert!(
        texts[0].starts_with("Relay message from Bob ["),
        "{texts:?}"
    );
    assert!(texts[0].ends_with("hello"), "{texts:?}");
    // Enter 100 ms later, as a separate write; checked 300 ms after it: the input line is
    // empty (the fake never echoes), so it is verified.
    assert_eq!(rig.enters(), 0);
    settle(100).await;
    assert_eq!(rig.enters(), 1);
    settle(300).await;
    assert_eq!(
        rig.acks(),
        vec![("m-busy".to_owned(), Some(DeliveryState::Verified))]
    );
    assert_eq!(
        rig.enters(),
        1,
        "Enter pressed again after a verified submit"
    );
    rig.end().await;
}

/// A message held back while the terminal is not the agent's to type into: who holds it,
/// what the wrapper reports, and what lets it go.
struct Hold {
    /// What the case is, for a failure's message.
    case: &'static str,
    /// The PTY backend (the person's keys come through the wrapper) or tmux (they do not).
    pty: bool,
    /// What the terminal shows, and the person's keys, before the message comes.
    before: fn(&Rig),
    /// The person's keys `before` passes through to the agent (all it may be given while held).
    keys: &'static [u8],
    /// The blocked state's reason, as reported.
    why: &'static str,
    /// What ends the hold.
    release: fn(&Rig),
    /// Whether the agent then works (on the person's line): nothing is typed meanwhile.
    works_after: bool,
}

/// Every way a message is held back: nothing typed in a minute, the state reported blocked
/// with its reason, and the message typed once after the hold ends.
const HOLDS: &[Hold] = &[
    Hold {
        case: "a person's half-written line is never typed over",
        pty: true,
        before: |rig| {
            rig.print(screen(IDLE));
            // The person starts a line at the wrapper's terminal; it goes to the agent.
            rig.keys(b"fix the");
        },
        keys: b"fix the",
        why: "a person is typing",
        // They finish it; the agent works on it (below: then is idle).
        release: |rig| {
            rig.keys(b" tests\r");
            rig.print(screen(BUSY));
        },
        works_after: true,
    },
    Hold {
        // tmux: the person's keys do not come through the wrapper; their half-written line is
        // seen on the screen, in the input line.
        case: "text in the input line holds a message back under tmux",
        pty: false,
        before: |rig| rig.print(screen("done.\n> fix the")),
        keys: b"",
        why: "text in its input line",
        // Submitted (or cleared): the input line is empty again.
        release: |rig| rig.print(screen(IDLE)),
        works_after: false,
    },
    Hold {
        case: "a dialog blocks typing until it closes (typed into, it would pick an option)",
        pty: true,
        before: |rig| rig.print(screen("Do you want to run `rm x`?\n 1. Yes\n 2. No\n> ")),
        keys: b"",
        why: "dialog open: do you want to",
        release: |rig| rig.print(screen(IDLE)),
        works_after: false,
    },
];

#[tokio::test(start_paused = true)]
async fn a_message_is_held_while_the_terminal_is_not_the_agents_and_typed_once_after() {
    for hold in HOLDS {
        let dir = tempfile::tempdir().unwrap();
        let rig = Rig::start(dir.path(), hold.pty);
        (hold.before)(&rig);
        let keys: Vec<Typed> = [hold.keys]
            .iter()
            .filter(|k| !k.is_empty())
            .map(|k| Typed::Keys(k.to_vec()))
            .collect();
        rig.deliver(message("m-held", "hello"));
        settle(60_000).await;
        assert_eq!(rig.typed(), keys, "{}: typed while held", hold.case);
        assert_eq!(
            rig.reported(),
            Some((TerminalState::Blocked, Some(hold.why.into()))),
            "{}",
            hold.case
        );
        (hold.release)(&rig);
        settle(5_000).await;
        let expected = if hold.works_after { 0 } else { 1 };
        assert_eq!(
            rig.texts().len(),
            expected,
            "{}: typed while the agent works, or not once it is free",
            hold.case
        );
        // Idle after whatever the release started: typed once, and acknowledged.
        rig.print(screen(IDLE));
        settle(1_000).await;
        assert_eq!(rig.texts().len(), 1, "{}", hold.case);
        assert_eq!(rig.acks().len(), 1, "{}", hold.case);
        rig.end().await;
    }
}

#[tokio::test(start_paused = true)]
async fn an_unsubmitted_text_gets_enter_again_then_is_reported_failed() {
    let dir = tempfile::tempdir().unwrap();
    let rig = Rig::start(dir.path(), true);
    rig.print(screen(IDLE));
    rig.deliver(message("m-stuck", "hello"));
    settle(600).await;
    let texts = rig.texts();
    assert_eq!(texts.len(), 1);
    // The agent shows the text in its input line and never lets go of it.
    rig.print(screen(&format!("done.\n> {}", texts[0])));
    settle(100).await;
    assert_eq!(rig.enters(), 1);
    // Checked 300 ms after Enter: still there, so Enter again (the profile allows one retry).
    settle(300).await;
    assert_eq!(rig.enters(), 2);
    assert_eq!(rig.acks(), vec![]);
    // Still there after the retry: reported failed, and nothing more is pressed or typed.
    settle(300).await;
    assert_eq!(
        rig.acks(),
        vec![("m-stuck".to_owned(), Some(DeliveryState::Failed))]
    );
    // With why: the dead letter's reason, told to the sender.
    assert_eq!(
        rig.reasons(),
        vec![(
            "m-stuck".to_owned(),
            "typed into the agent but not submitted: the text was still in the input line \
             after Enter was pressed 2 times"
                .to_owned()
        )]
    );
    settle(60_000).await;
    assert_eq!(rig.enters(), 2);
    assert_eq!(rig.texts().len(), 1);
    rig.end().await;
}

#[tokio::test(start_paused = true)]
async fn a_text_the_agent_lets_go_of_after_a_second_enter_is_verified() {
    let dir = tempfile::tempdir().unwrap();
    let rig = Rig::start(dir.path(), true);
    rig.print(screen(IDLE));
    rig.deliver(message("m-second", "hello"));
    settle(600).await;
    let text = rig.texts().remove(0);
    rig.print(screen(&format!("done.\n> {text}")));
    settle(400).await;
    assert_eq!(rig.enters(), 2);
    // The second Enter took it.
    rig.print(screen(BUSY));
    settle(300).await;
    assert_eq!(
        rig.acks(),
        vec![("m-second".to_owned(), Some(DeliveryState::Verified))]
    );
    rig.end().await;
}

#[tokio::test(start_paused = true)]
async fn a_replayed_message_is_not_typed_twice_by_the_same_or_a_restarted_wrapper() {
    let dir = tempfile::tempdir().unwrap();
    let rig = Rig::start(dir.path(), true);
    rig.print(screen(BUSY));
    // Delivered twice while it waits (a replay after a reconnect): queued once.
    rig.deliver(message("m-once", "hello"));
    rig.deliver(message("m-once", "hello"));
    settle(5_000).await;
    rig.print(screen(IDLE));
    settle(2_000).await;
    assert_eq!(rig.texts().len(), 1);
    assert_eq!(
        rig.acks(),
        vec![("m-once".to_owned(), Some(DeliveryState::Verified))]
    );
    // Delivered again after it was typed: acknowledged from injected.log, not typed.
    rig.deliver(message("m-once", "hello"));
    settle(2_000).await;
    assert_eq!(rig.texts().len(), 1);
    assert_eq!(rig.acks().len(), 2);
    rig.end().await;

    // The wrapper restarted on the same files, the relay delivering it again.
    let again = Rig::start(dir.path(), true);
    again.print(screen(IDLE));
    again.deliver(message("m-once", "hello"));
    settle(5_000).await;
    assert_eq!(again.typed(), vec![], "typed again after a restart");
    assert_eq!(
        again.acks(),
        vec![("m-once".to_owned(), Some(DeliveryState::Verified))]
    );
    again.end().await;
}

#[tokio::test(start_paused = true)]
async fn a_restarted_wrapper_types_again_only_what_was_never_entered() {
    let dir = tempfile::tempdir().unwrap();
    let rig = Rig::start(dir.path(), true);
    rig.print(screen(IDLE));
    rig.deliver(message("m-typed", "one"));
    // Typed, and the wrapper stops before its Enter (at +100 ms).
    settle(550).await;
    assert_eq!(rig.texts().len(), 1);
    assert_eq!(rig.enters(), 0);
    rig.end().await;
    let rig = Rig::start(dir.path(), true);
    rig.print(screen(IDLE));
    rig.deliver(message("m-entered", "two"));
    // Typed and entered, and the wrapper stops before it was checked (at +300 ms).
    settle(700).await;
    assert_eq!(rig.enters(), 1);
    assert_eq!(rig.acks(), vec![]);
    rig.end().await;

    // Restarted (a PTY agent ends with its wrapper): the text never entered is typed into the
    // new agent; the one entered may have been read, so it is not typed twice but reported
    // failed (its sender is told).
    let rig = Rig::start(dir.path(), true);
    rig.print(screen(IDLE));
    rig.deliver(message("m-typed", "one"));
    rig.deliver(message("m-entered", "two"));
    settle(5_000).await;
    let texts = rig.texts();
    assert_eq!(texts.len(), 1, "{texts:?}");
    assert!(texts[0].ends_with("one"), "{texts:?}");
    let acks = rig.acks();
    assert!(
        acks.contains(&("m-entered".to_owned(), Some(DeliveryState::Failed))),
        "{acks:?}"
    );
    let reasons = rig.reasons();
    assert!(
        reasons
            .iter()
            .any(|(id, why)| id == "m-entered"
                && why.contains("whether the agent read it is unknown")),
        "{reasons:?}"
    );
    assert!(
        acks.contains(&("m-typed".to_owned(), Some(DeliveryState::Verified))),
        "{acks:?}"
    );
    rig.end().await;
}

/// A PTY wrapper in `dir` whose `injected.log` cannot be written: a directory is put where it
/// goes once the loop has started, having read no ledger (there is none yet).
async fn start_unrecorded(dir: &std::path::Path) -> Rig {
    let rig = Rig::start(dir, true);
    settle(1).await;
    std::fs::create_dir(dir.join("injected.log")).unwrap();
    rig
}

/// `injected.log` that cannot be written (here a directory stands where it goes): each record
/// the shell cannot write is logged with what it means, the message is typed once and
/// acknowledged all the same, and a replay to the same wrapper is not typed again (its ledger
/// in memory has the record the file refused).
#[tokio::test(start_paused = true)]
async fn a_ledger_file_that_cannot_be_written_types_nothing_twice_in_the_same_wrapper() {
    let dir = tempfile::tempdir().unwrap();
    let rig = start_unrecorded(dir.path()).await;
    rig.print(screen(IDLE));
    rig.deliver(message("m-unwritten", "hello"));
    settle(2_000).await;
    assert_eq!(rig.texts().len(), 1);
    let verified = ("m-unwritten".to_owned(), Some(DeliveryState::Verified));
    assert_eq!(rig.acks(), vec![verified.clone()]);
    rig.deliver(message("m-unwritten", "hello"));
    settle(2_000).await;
    assert_eq!(rig.texts().len(), 1, "typed again");
    assert_eq!(rig.acks(), vec![verified.clone(), verified]);
    rig.end().await;
}

/// Asks the rig's door as Claude Code's Stop hook does: the texts it is handed.
async fn stop_hook(dir: &std::path::Path) -> Vec<String> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let stream = tokio::net::UnixStream::connect(dir.join(door::SOCKET))
        .await
        .unwrap();
    let (read, mut write) = stream.into_split();
    write
        .write_all(b"{\"hook\": \"stop\", \"active\": false, \"key\": \"test-key\"}\n")
        .await
        .unwrap();
    let mut line = String::new();
    tokio::io::BufReader::new(read)
        .read_line(&mut line)
        .await
        .unwrap();
    let answer: serde_json::Value = serde_json::from_str(&line).unwrap();
    serde_json::from_value(answer["messages"].clone()).unwrap_or_else(|_| panic!("{line}"))
}

/// A Stop hook is handed the waiting message even when `injected.log` cannot be written
/// (a directory stands where it goes): its records are the shell's to write, and a failure is
/// logged with what it means; it is acknowledged injected and never typed after.
#[tokio::test(start_paused = true)]
async fn a_stop_hook_is_handed_a_message_whose_ledger_line_cannot_be_written() {
    let dir = tempfile::tempdir().unwrap();
    let rig = start_unrecorded(dir.path()).await;
    rig.print(screen(BUSY));
    rig.deliver(message("m-hooked", "hello"));
    settle(1_000).await;
    let texts = stop_hook(dir.path()).await;
    assert_eq!(texts.len(), 1, "{texts:?}");
    assert!(texts[0].ends_with("hello"), "{texts:?}");
    rig.print(screen(IDLE));
    settle(5_000).await;
    assert_eq!(
        rig.texts(),
        Vec::<String>::new(),
        "typed after a hook took it"
    );
    assert_eq!(
        rig.acks(),
        vec![("m-hooked".to_owned(), Some(DeliveryState::Injected))]
    );
    rig.end().await;
}

#[tokio::test(start_paused = true)]
async fn a_resize_reaches_the_agents_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let rig = Rig::start(dir.path(), true);
    rig.term
        .send(TermEvent::Resized { rows: 50, cols: 90 })
        .unwrap();
    settle(10).await;
    assert_eq!(rig.typed(), vec![Typed::Resize(50, 90)]);
    rig.end().await;
}

#[tokio::test(start_paused = true)]
async fn a_directive_the_agent_prints_is_relayed_once_its_output_settles() {
    let dir = tempfile::tempdir().unwrap();
    let rig = Rig::start(dir.path(), true);
    rig.print(screen("@relay:Bob the tests pass\n\n> "));
    settle(2_000).await;
    // Printed once and redrawn: relayed once.
    rig.print(screen("@relay:Bob the tests pass\n\n> "));
    settle(2_000).await;
    let sent: Vec<(Option<String>, String)> = rig
        .log
        .lock()
        .unwrap()
        .sent
        .iter()
        .map(|m| (m.to.clone(), m.payload.body.clone()))
        .collect();
    assert_eq!(sent, vec![(Some("Bob".into()), "the tests pass".into())]);
    rig.end().await;
}

/// The pane read afresh, as a wrapper attaching does: `seen` rows above the checkpoint,
/// `unseen` from it on.
fn snapshot(seen: &str, unseen: &str) -> Snapshot {
    Snapshot {
        seen: seen.replace('\n', "\r\n").into_bytes(),
        unseen: unseen.replace('\n', "\r\n").into_bytes(),
        rows: 24,
        cols: 80,
        notes_before: 0,
    }
}

impl Rig {
    fn sent(&self) -> Vec<(Option<String>, String, Option<String>)> {
        self.log
            .lock()
            .unwrap()
            .sent
            .iter()
            .map(|m| (m.to.clone(), m.payload.body.clone(), m.id.clone()))
            .collect()
    }
}

#[tokio::test(start_paused = true)]
async fn a_restarted_tmux_wrapper_presses_the_missing_enter_and_never_types_a_shown_message_again()
{
    let dir = tempfile::tempdir().unwrap();
    let pane = Arc::new(Mutex::new(Kept::default()));
    let rig = Rig::start_tmux(dir.path(), &pane, "", IDLE);
    rig.deliver(message("m-shown", "one"));
    rig.deliver(message("m-lost", "two"));
    // The first is typed, and the wrapper stops before its Enter (due 100 ms later).
    settle(550).await;
    let texts = rig.texts();
    assert_eq!(texts.len(), 1);
    assert_eq!(rig.enters(), 0);
    rig.end().await;

    // The agent lives on in its pane: the text waits in its input line, and the pane's history
    // shows it. The second message was never typed.
    let waiting = format!("done.\n> {}", texts[0]);
    pane.lock().unwrap().history = waiting.clone();
    let again = Rig::start_tmux(dir.path(), &pane, "", &waiting);
    again.deliver(message("m-shown", "one"));
    settle(1_000).await;
    // Not typed again: its missing Enter is pressed in the pane, and it is acknowledged.
    assert_eq!(again.typed(), vec![Typed::Enter]);
    assert_eq!(
        again.acks(),
        vec![("m-shown".to_owned(), Some(DeliveryState::Injected))]
    );
    // The agent takes it, works, and is idle: the never-typed message is typed now, once.
    again.print(screen(BUSY));
    again.deliver(message("m-lost", "two"));
    settle(2_000).await;
    assert_eq!(again.typed(), vec![Typed::Enter]);
    again.print(screen(IDLE));
    settle(2_000).await;
    let texts = again.texts();
    assert_eq!(texts.len(), 1, "{texts:?}");
    assert!(texts[0].ends_with("two"), "{texts:?}");
    again.end().await;
}

#[tokio::test(start_paused = true)]
async fn a_re_read_pane_sends_what_follows_the_checkpoint_with_the_same_ids_and_nothing_above_it() {
    let dir = tempfile::tempdir().unwrap();
    let pane = Arc::new(Mutex::new(Kept::default()));
    let rig = Rig::start_tmux(dir.path(), &pane, "", "");
    // The agent prints a directive; it is relayed once the output settles, its receipt comes,
    // and the checkpoint moves to the cursor's row.
    pane.lock().unwrap().row = 3;
    rig.print(b"@relay:Bob first\r\n\r\n> ".to_vec());
    settle(2_000).await;
    assert_eq!(Checkpoint::load(dir.path()).offset, 3);
    // A second one is relayed, and the wrapper is killed before its receipt came: the
    // checkpoint stays where it was.
    rig.log.lock().unwrap().hold_receipts = true;
    pane.lock().unwrap().row = 6;
    rig.print(b"\r\n@relay:Bob second\r\n\r\n> ".to_vec());
    settle(2_000).await;
    let before = rig.sent();
    assert_eq!(before.len(), 2, "{before:?}");
    assert_eq!(Checkpoint::load(dir.path()).offset, 3);
    rig.task.abort();

    // Restarted: it reads the pane from its checkpoint. The rows above it were relayed and
    // are not sent again; the rows from it on are read as new, and their directive goes out
    // with the id it had (the relay drops it as a duplicate).
    let again = Rig::start_tmux(
        dir.path(),
        &pane,
        "@relay:Bob first\n\n",
        "> \n@relay:Bob second\n\n> ",
    );
    settle(2_000).await;
    assert_eq!(again.sent(), vec![before[1].clone()]);
    assert!(before[1].2.is_some(), "a tmux directive's id is derived");
    again.end().await;
}

#[tokio::test(start_paused = true)]
async fn a_pane_re_read_after_its_control_client_was_replaced_sends_nothing_twice() {
    let dir = tempfile::tempdir().unwrap();
    let pane = Arc::new(Mutex::new(Kept::default()));
    let rig = Rig::start_tmux(dir.path(), &pane, "", "");
    pane.lock().unwrap().row = 3;
    rig.print(b"@relay:Bob first\r\n\r\n> ".to_vec());
    settle(2_000).await;
    assert_eq!(rig.sent().len(), 1);
    // The control client ended with the session alive: a new one read the pane from the
    // checkpoint (see `TmuxTerminal::next_event`).
    rig.term
        .send(TermEvent::Reread(snapshot("@relay:Bob first\n\n", "> ")))
        .unwrap();
    settle(2_000).await;
    assert_eq!(rig.sent().len(), 1, "{:?}", rig.sent());
    // What the agent prints next is read as before.
    pane.lock().unwrap().row = 6;
    rig.print(b"\r\n@relay:Bob second\r\n\r\n> ".to_vec());
    settle(2_000).await;
    let bodies: Vec<String> = rig.sent().into_iter().map(|(_, b, _)| b).collect();
    assert_eq!(bodies, ["first", "second"]);
    rig.end().await;
}
