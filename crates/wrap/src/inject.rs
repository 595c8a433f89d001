//! When to type an incoming message into the agent's terminal, and whether it was submitted:
//! a pure state machine that is told about output and time, asks a [`Look`] about the
//! screen, and answers what to write.
//!
//! One message at a time:
//! 1. wait until the output has been quiet for the profile's time, the person at the
//!    terminal has no half-written line, and the screen says the agent is ready (prompt
//!    empty, no spinner, no dialog);
//! 2. type the text;
//! 3. press Enter as a separate write (agents that get text and Enter in one write often leave
//!    the text unsubmitted): as soon as the text shows in the input line when the profile can
//!    tell ([`Timing::enter_on_echo`]), else (or when it never shows) after a pause;
//! 4. a moment later look whether the input line let go of the text; if not, press Enter
//!    again, a bounded number of times; then report the outcome, verified or failed.
//!
//! With a [`Joiner`] (digest or notice delivery), the messages waiting when the agent is next
//! ready go in as one prompt instead: every joinable one from the front of the queue up to a
//! size limit ([`group_len`]); urgent ones go first and alone.
//!
//! Nothing here sends Escape or erases anything: a busy agent or a person's text is waited
//! for, never cleared.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::profile::NotReady;

/// Timing of injection (from the profile).
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Output must have been quiet this long before typing.
    pub quiet: Duration,
    /// Output quiet this long, the screen is asked already: ready, the message is typed
    /// without waiting for `quiet` (the profile's `turn_settle`: the screen shows the agent
    /// waiting at an empty input line); not ready, it waits for `quiet` as before.
    pub ready_quiet: Option<Duration>,
    /// Pause between the text and its Enter; with `enter_on_echo`, the longest wait for the
    /// text to show.
    pub enter_delay: Duration,
    /// Press Enter as soon as [`Look::echoed`] sees the typed text in the input line: the
    /// agent took it as input, so the Enter cannot join the paste.
    pub enter_on_echo: bool,
    /// How long after Enter to check that it submitted.
    pub verify_after: Duration,
    /// Extra Enters when the text is still in the input box.
    pub enter_retries: u32,
    /// After the screen said "not ready", look again this long later even if nothing was
    /// printed (a dialog closed by a person's click, say).
    pub recheck: Duration,
}

/// The screen, as the injector needs to see it. The wrapper answers from its screen model
/// (PTY) or a pane capture (tmux); tests answer from recorded screens.
pub trait Look {
    /// Whether the agent may be given a message now.
    ///
    /// # Errors
    /// Why not.
    fn ready(&mut self) -> Result<(), NotReady>;
    /// Whether `typed` was submitted (the input line let go of it).
    fn submitted(&mut self, typed: &str) -> bool;
    /// Whether `typed`, Enter not yet pressed, shows in the input line (the agent took it).
    fn echoed(&mut self, typed: &str) -> bool;
    /// Whether a message may be typed before the full quiet time when the screen says ready
    /// (the agent is set to take it: for a CLI that takes multi-line pastes, bracketed paste
    /// is on). Otherwise the full quiet time decides, as it did before the early path.
    fn early_ok(&mut self) -> bool {
        true
    }
}

/// How typing one message ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Typed, Enter pressed, and the screen shows it submitted.
    Verified,
    /// Typed, but the screen still shows it in the input line after every Enter.
    Failed(String),
}

/// What to do now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action<T> {
    /// Write this text (no Enter yet).
    Type(String),
    /// Press Enter (the first time, or again when the text did not submit).
    Enter,
    /// This message is finished: report the outcome.
    Done(T, Outcome),
}

#[derive(Debug)]
enum State<T> {
    Idle,
    Typed {
        at: Instant,
        text: String,
        item: T,
    },
    Entered {
        at: Instant,
        text: String,
        item: T,
        enters: u32,
    },
}

/// Makes the text and item of two or more queued entries typed as one prompt.
pub type JoinFn<T> = Box<dyn Fn(Vec<(String, T)>) -> (String, T) + Send + Sync>;

/// How several waiting messages are typed as one prompt (digest or notice delivery).
pub struct Joiner<T> {
    /// The most characters the waiting texts of one joined prompt may add up to; beyond it the
    /// rest waits for the next prompt. A message alone is typed whatever its length (its body
    /// was cut to the wrapper's limit already).
    pub max_chars: usize,
    /// Whether an entry may be joined with others (a relay's own notice may not; urgent
    /// messages never are).
    pub joinable: Box<dyn Fn(&T) -> bool + Send + Sync>,
    /// The text and item of two or more entries typed as one prompt, in queue order.
    pub join: JoinFn<T>,
}

impl<T> std::fmt::Debug for Joiner<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Joiner")
            .field("max_chars", &self.max_chars)
            .finish_non_exhaustive()
    }
}

/// How many entries from the front of the queue go in as one prompt, given each entry's size
/// in characters, or `None` for one that cannot be joined (urgent, or a relay notice): a
/// first entry that cannot be joined goes alone; otherwise the joinable ones that follow it,
/// up to the first that cannot be joined or would take the sum over `max_chars`. Always at
/// least one.
pub fn group_len(sizes: impl IntoIterator<Item = Option<usize>>, max_chars: usize) -> usize {
    let mut n = 0;
    let mut total = 0usize;
    for size in sizes {
        let Some(size) = size else { break };
        if n > 0 && total.saturating_add(size) > max_chars {
            break;
        }
        total = total.saturating_add(size);
        n += 1;
    }
    n.max(1)
}

/// The injection queue of one terminal. `T` is whatever identifies a message to its owner.
#[derive(Debug)]
pub struct Injector<T> {
    timing: Timing,
    /// Text, item, urgent.
    queue: VecDeque<(String, T, bool)>,
    /// Digest or notice delivery: how waiting messages are joined.
    joiner: Option<Joiner<T>>,
    state: State<T>,
    last_output: Instant,
    /// Characters the person has typed on the current input line (0: nothing pending).
    person_line: usize,
    /// When the screen last said "not ready", and why.
    blocked: Option<(Instant, NotReady)>,
    /// Output came since the screen last said "not ready": look again once it is quiet.
    changed: bool,
    /// Output came since the typed text was last looked for in the input line.
    echo_due: bool,
    /// The screen was asked early (`ready_quiet`) since the last output.
    early_looked: bool,
    /// A message came due (output quiet) while the person had a half-written line, since
    /// they last submitted or cleared it: held, and not woken up for again.
    person_held: bool,
    /// `person_held` became true and the owner was not told yet (see
    /// [`Injector::take_held_for_person`]).
    person_held_news: bool,
}

impl<T> Injector<T> {
    /// An empty injector; `now` counts as the last output.
    pub fn new(timing: Timing, now: Instant) -> Self {
        Self {
            timing,
            queue: VecDeque::new(),
            joiner: None,
            state: State::Idle,
            last_output: now,
            person_line: 0,
            blocked: None,
            changed: false,
            echo_due: false,
            early_looked: false,
            person_held: false,
            person_held_news: false,
        }
    }

    /// The person typed `bytes` at `now` (they go to the agent). A line in progress holds every
    /// injection back until it is submitted (Enter) or cleared (Ctrl-C, Ctrl-U, backspaced
    /// away): the relay never types into the middle of someone's sentence.
    ///
    /// Replies the person's terminal sends on its own to the agent's queries (device
    /// attributes, version, colours, cursor position, focus) come in on the same input but are
    /// not typing: they are left out. (Claude Code asks for device attributes again after each
    /// submitted prompt; counted as typing, the reply held every message back for good.)
    pub fn on_person_input(&mut self, bytes: &[u8], now: Instant) {
        self.on_output(now);
        for b in without_terminal_reports(bytes) {
            match b {
                b'\r' | b'\n' | 0x03 | 0x15 => self.person_line = 0,
                0x7f | 0x08 => self.person_line = self.person_line.saturating_sub(1),
                // Anything else (letters, escape sequences of arrow keys...) means the person is
                // at the line; only submitting or clearing it gives the terminal back.
                _ => self.person_line += 1,
            }
        }
        if self.person_line == 0 {
            self.person_held = false;
        }
    }

    /// Whether the person has a half-written line.
    pub fn person_typing(&self) -> bool {
        self.person_line > 0
    }

    /// Whether a message came due and was held for the person's half-written line since this
    /// was last asked: the moment it would have been typed without them. Tests wait for the
    /// wrapper's log of it to prove that nothing was typed over a person (an event, not an
    /// observation window).
    pub fn take_held_for_person(&mut self) -> bool {
        std::mem::take(&mut self.person_held_news)
    }

    /// Queues `text` for typing; `urgent` goes before everything else waiting but the urgent
    /// ones queued before it.
    pub fn push(&mut self, text: String, item: T, urgent: bool) {
        if urgent {
            let at = self.queue.iter().take_while(|(_, _, u)| *u).count();
            self.queue.insert(at, (text, item, true));
        } else {
            self.queue.push_back((text, item, false));
        }
    }

    /// From now on, messages waiting when the agent is next ready are typed as one prompt
    /// (see [`Joiner`], [`group_len`]).
    pub fn set_joiner(&mut self, joiner: Joiner<T>) {
        self.joiner = Some(joiner);
    }

    /// Takes out of the queue the entries (not the one being typed) that satisfy `f`.
    pub fn remove_queued(&mut self, mut f: impl FnMut(&T) -> bool) -> Vec<T> {
        let mut out = Vec::new();
        let mut kept = VecDeque::with_capacity(self.queue.len());
        for (text, item, urgent) in self.queue.drain(..) {
            if f(&item) {
                out.push(item);
            } else {
                kept.push_back((text, item, urgent));
            }
        }
        self.queue = kept;
        out
    }

    /// The next prompt: the front entry, or (with a joiner) it and the entries joined to it.
    fn take_next(&mut self) -> Option<(String, T)> {
        let n = match &self.joiner {
            None => 1,
            Some(j) => group_len(
                self.queue.iter().map(|(text, item, urgent)| {
                    (!urgent && (j.joinable)(item)).then(|| text.chars().count())
                }),
                j.max_chars,
            ),
        };
        if n <= 1 {
            return self.queue.pop_front().map(|(text, item, _)| (text, item));
        }
        let group: Vec<(String, T)> = self
            .queue
            .drain(..n)
            .map(|(text, item, _)| (text, item))
            .collect();
        let join = &self.joiner.as_ref()?.join;
        Some(join(group))
    }

    /// Takes out the queued messages (not the one being typed) that `f` picks, given each
    /// one's text, in their order: another door handed them to the agent, so they are not
    /// typed.
    pub fn take_queued(&mut self, mut f: impl FnMut(&str, &T) -> bool) -> Vec<(String, T)> {
        let mut taken = Vec::new();
        let mut kept = VecDeque::with_capacity(self.queue.len());
        for (text, item, urgent) in self.queue.drain(..) {
            if f(&text, &item) {
                taken.push((text, item));
            } else {
                kept.push_back((text, item, urgent));
            }
        }
        self.queue = kept;
        taken
    }

    /// The agent printed something at `now`.
    pub fn on_output(&mut self, now: Instant) {
        self.last_output = now;
        // The screen changed: what blocked typing may be gone, the typed text may show.
        self.changed = true;
        self.echo_due = true;
        self.early_looked = false;
    }

    /// Messages waiting (including the one being typed).
    pub fn pending(&self) -> usize {
        self.queue.len() + usize::from(!matches!(self.state, State::Idle))
    }

    /// The message being typed, entered or checked, if any.
    pub fn current(&self) -> Option<&T> {
        match &self.state {
            State::Idle => None,
            State::Typed { item, .. } | State::Entered { item, .. } => Some(item),
        }
    }

    /// Whether a queued or current message satisfies `f`.
    pub fn holds(&self, mut f: impl FnMut(&T) -> bool) -> bool {
        self.current().is_some_and(&mut f) || self.queue.iter().any(|(_, t, _)| f(t))
    }

    /// Why the next message waits, if the screen said so last time it was asked.
    pub fn blocked_by(&self) -> Option<&NotReady> {
        self.blocked.as_ref().map(|(_, r)| r)
    }

    /// When [`Injector::poll`] next has something to do, if anything waits.
    pub fn next_deadline(&self) -> Option<Instant> {
        match &self.state {
            // The screen changed since the text was typed: look for it at once.
            State::Typed { at, .. } if self.timing.enter_on_echo && self.echo_due => {
                Some(self.last_output.max(*at))
            }
            State::Typed { at, .. } => Some(*at + self.timing.enter_delay),
            State::Entered { at, .. } => Some(*at + self.timing.verify_after),
            State::Idle if self.queue.is_empty() || self.person_held => None,
            State::Idle => {
                let quiet = self.last_output + self.timing.quiet;
                if let Some(q) = self.timing.ready_quiet.filter(|_| !self.early_looked) {
                    return Some(self.last_output + q);
                }
                Some(match &self.blocked {
                    Some((at, _)) if !self.changed => quiet.max(*at + self.timing.recheck),
                    _ => quiet,
                })
            }
        }
    }

    /// What to do at `now`, if anything; `look` is asked about the screen only when needed.
    /// Call repeatedly until it returns `None`.
    pub fn poll(&mut self, now: Instant, look: &mut dyn Look) -> Option<Action<T>> {
        match std::mem::replace(&mut self.state, State::Idle) {
            State::Typed { at, text, item }
                if now >= at + self.timing.enter_delay || self.echo_seen(&text, look) =>
            {
                self.state = State::Entered {
                    at: now,
                    text,
                    item,
                    enters: 1,
                };
                Some(Action::Enter)
            }
            State::Entered {
                at,
                text,
                item,
                enters,
            } if now >= at + self.timing.verify_after => {
                if look.submitted(&text) {
                    return Some(Action::Done(item, Outcome::Verified));
                }
                if enters <= self.timing.enter_retries {
                    self.state = State::Entered {
                        at: now,
                        text,
                        item,
                        enters: enters + 1,
                    };
                    return Some(Action::Enter);
                }
                Some(Action::Done(
                    item,
                    Outcome::Failed(format!(
                        "the text was still in the input line after Enter was pressed {enters} times"
                    )),
                ))
            }
            state @ (State::Typed { .. } | State::Entered { .. }) => {
                self.state = state;
                None
            }
            State::Idle => {
                let due = self.next_deadline()?;
                if now < due {
                    return None;
                }
                if self.person_line > 0 {
                    // Due, but never typed over a person: held until they submit or clear
                    // their line, with no more wake-ups until then.
                    self.person_held = true;
                    self.person_held_news = true;
                    return None;
                }
                if now < self.last_output + self.timing.quiet {
                    // Early: typed only if the screen says ready now; else the full quiet.
                    self.early_looked = true;
                    if !look.early_ok() || look.ready().is_err() {
                        return None;
                    }
                } else {
                    self.changed = false;
                    if let Err(why) = look.ready() {
                        self.blocked = Some((now, why));
                        return None;
                    }
                }
                self.blocked = None;
                let (text, item) = self.take_next()?;
                self.state = State::Typed {
                    at: now,
                    text: text.clone(),
                    item,
                };
                // Only output after the text was written can be its echo.
                self.echo_due = false;
                Some(Action::Type(text))
            }
        }
    }
}

impl<T> Injector<T> {
    /// Whether the typed text shows in the input line now, looked at only when the profile
    /// can tell and output came since the last look.
    fn echo_seen(&mut self, text: &str, look: &mut dyn Look) -> bool {
        if !self.timing.enter_on_echo || !std::mem::take(&mut self.echo_due) {
            return false;
        }
        look.echoed(text)
    }
}

/// `bytes` without the reports a terminal sends by itself: DCS and OSC strings, and CSI
/// sequences ending in `c` (device attributes), `R` (cursor position), `n` (status), `y`
/// (mode report), `I`/`O` (focus), or `?...u` (keyboard flags). Keys a person presses (arrows,
/// function keys, Alt-letters) are kept. A report cut across two reads is kept too: counted
/// as typing, it only holds messages back until the next Enter.
fn without_terminal_reports(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != 0x1b || i + 1 >= bytes.len() {
            out.push(bytes[i]);
            i += 1;
            continue;
        }
        match bytes[i + 1] {
            // DCS / OSC: up to ST (ESC \) or BEL.
            b'P' | b']' => {
                let end = (i + 2..bytes.len())
                    .find(|&j| bytes[j] == 0x07 || (bytes[j] == b'\\' && bytes[j - 1] == 0x1b));
                match end {
                    Some(j) => i = j + 1,
                    None => {
                        out.extend_from_slice(&bytes[i..]);
                        i = bytes.len();
                    }
                }
            }
            b'[' => {
                let fin = (i + 2..bytes.len()).find(|&j| (0x40..=0x7e).contains(&bytes[j]));
                let Some(j) = fin else {
                    out.extend_from_slice(&bytes[i..]);
                    break;
                };
                let private = bytes.get(i + 2) == Some(&b'?');
                let report = match bytes[j] {
                    b'c' | b'R' | b'n' | b'y' | b'I' | b'O' => true,
                    b'u' => private,
                    _ => false,
                };
                if !report {
                    out.extend_from_slice(&bytes[i..=j]);
                }
                i = j + 1;
            }
            _ => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A screen that answers from fields the test sets.
    #[derive(Default)]
    struct Fake {
        not_ready: Option<NotReady>,
        stuck: bool,
        looks: usize,
        /// The typed text shows in the input line.
        shown: bool,
        echo_looks: usize,
        /// Not set to take a message early (bracketed paste not on yet).
        not_early: bool,
    }

    impl Look for Fake {
        fn ready(&mut self) -> Result<(), NotReady> {
            self.looks += 1;
            self.not_ready.clone().map_or(Ok(()), Err)
        }
        fn submitted(&mut self, _typed: &str) -> bool {
            !self.stuck
        }
        fn echoed(&mut self, _typed: &str) -> bool {
            self.echo_looks += 1;
            self.shown
        }
        fn early_ok(&mut self) -> bool {
            !self.not_early
        }
    }

    fn timing() -> Timing {
        Timing {
            quiet: Duration::from_millis(500),
            enter_delay: Duration::from_millis(100),
            enter_on_echo: false,
            ready_quiet: None,
            verify_after: Duration::from_millis(300),
            enter_retries: 2,
            recheck: Duration::from_millis(2000),
        }
    }

    #[test]
    fn a_half_written_line_holds_injection_back_until_submitted_or_cleared() {
        let t0 = relay_protocol::now_instant();
        let ms = |n| t0 + Duration::from_millis(n);
        let look = &mut Fake::default();
        let mut inj = Injector::new(timing(), t0);
        inj.push("msg".into(), 1, false);
        inj.on_person_input(b"half", ms(0));
        assert_eq!(
            inj.next_deadline(),
            Some(ms(500)),
            "due after the quiet time"
        );
        assert!(!inj.take_held_for_person());
        assert_eq!(
            inj.poll(ms(10_000), look),
            None,
            "never types over a person"
        );
        assert!(inj.take_held_for_person(), "held at the moment it was due");
        assert!(!inj.take_held_for_person(), "told once");
        assert_eq!(inj.next_deadline(), None, "nothing to wake up for");
        assert_eq!(
            look.looks, 0,
            "the screen is not asked while a person types"
        );
        inj.on_person_input(b"\x7f\x7f\x7f", ms(10_000));
        assert_eq!(inj.poll(ms(20_000), look), None, "one character left");
        inj.on_person_input(b"\x7f", ms(20_000));
        assert_eq!(
            inj.poll(ms(20_600), look),
            Some(Action::Type("msg".into())),
            "line cleared"
        );
        let mut inj = Injector::new(timing(), t0);
        inj.push("msg".into(), 1, false);
        inj.on_person_input(b"ls -l\r", ms(0));
        assert_eq!(inj.poll(ms(400), look), None, "still the quiet time");
        assert_eq!(
            inj.poll(ms(600), look),
            Some(Action::Type("msg".into())),
            "line submitted"
        );
        let mut inj = Injector::new(timing(), t0);
        inj.push("msg".into(), 1, false);
        inj.on_person_input(b"oops\x15", ms(0));
        assert_eq!(
            inj.poll(ms(600), look),
            Some(Action::Type("msg".into())),
            "Ctrl-U cleared it"
        );
    }

    #[test]
    fn waits_for_quiet_then_types_enters_verifies_one_at_a_time() {
        let t0 = relay_protocol::now_instant();
        let ms = |n| t0 + Duration::from_millis(n);
        let look = &mut Fake::default();
        let mut inj = Injector::new(timing(), t0);
        inj.push("one".into(), 1, false);
        inj.push("two".into(), 2, false);
        assert_eq!(inj.poll(ms(100), look), None, "output not quiet yet");
        inj.on_output(ms(300));
        assert_eq!(inj.next_deadline(), Some(ms(800)));
        assert_eq!(inj.poll(ms(700), look), None, "quiet since 300 only");
        assert_eq!(inj.poll(ms(800), look), Some(Action::Type("one".into())));
        assert_eq!(inj.poll(ms(850), look), None, "Enter waits for its delay");
        assert_eq!(inj.poll(ms(900), look), Some(Action::Enter));
        // The agent reacts to the message.
        inj.on_output(ms(950));
        assert_eq!(inj.poll(ms(1100), look), None, "verification waits");
        assert_eq!(
            inj.poll(ms(1200), look),
            Some(Action::Done(1, Outcome::Verified))
        );
        assert_eq!(inj.poll(ms(1300), look), None, "quiet since 950 only");
        assert_eq!(inj.poll(ms(1450), look), Some(Action::Type("two".into())));
        assert_eq!(inj.pending(), 1);
        assert_eq!(inj.poll(ms(1550), look), Some(Action::Enter));
        assert_eq!(
            inj.poll(ms(1850), look),
            Some(Action::Done(2, Outcome::Verified))
        );
        assert_eq!(inj.pending(), 0);
        assert_eq!(inj.poll(ms(5000), look), None);
        assert_eq!(inj.next_deadline(), None);
    }

    #[test]
    fn enter_is_retried_a_bounded_number_of_times_then_the_failure_is_reported() {
        let t0 = relay_protocol::now_instant();
        let ms = |n| t0 + Duration::from_millis(n);
        let look = &mut Fake {
            stuck: true,
            ..Fake::default()
        };
        let mut inj = Injector::new(timing(), t0);
        inj.push("text".into(), 7, false);
        assert_eq!(inj.poll(ms(500), look), Some(Action::Type("text".into())));
        assert_eq!(inj.poll(ms(600), look), Some(Action::Enter));
        assert_eq!(inj.poll(ms(900), look), Some(Action::Enter), "retry 1");
        assert_eq!(inj.poll(ms(1200), look), Some(Action::Enter), "retry 2");
        match inj.poll(ms(1500), look) {
            Some(Action::Done(7, Outcome::Failed(why))) => assert!(why.contains("3 times")),
            other => panic!("{other:?}"),
        }
        // A retry that works ends verified.
        let mut inj = Injector::new(timing(), t0);
        inj.push("text".into(), 8, false);
        inj.poll(ms(500), look);
        inj.poll(ms(600), look);
        assert_eq!(inj.poll(ms(900), look), Some(Action::Enter));
        look.stuck = false;
        assert_eq!(
            inj.poll(ms(1200), look),
            Some(Action::Done(8, Outcome::Verified))
        );
    }

    #[test]
    fn a_busy_screen_holds_the_message_and_is_looked_at_again_after_output_or_a_while() {
        let t0 = relay_protocol::now_instant();
        let ms = |n| t0 + Duration::from_millis(n);
        let look = &mut Fake {
            not_ready: Some(NotReady::Busy("esc to interrupt".into())),
            ..Fake::default()
        };
        let mut inj = Injector::new(timing(), t0);
        inj.push("m".into(), 1, false);
        assert_eq!(inj.poll(ms(500), look), None);
        assert_eq!(look.looks, 1);
        assert_eq!(
            inj.blocked_by(),
            Some(&NotReady::Busy("esc to interrupt".into()))
        );
        // Nothing printed: the screen is not captured again before the recheck time.
        assert_eq!(inj.next_deadline(), Some(ms(2500)));
        assert_eq!(inj.poll(ms(1000), look), None);
        assert_eq!(look.looks, 1, "no look before the recheck");
        // Output came: look again once it is quiet.
        inj.on_output(ms(1100));
        assert_eq!(inj.next_deadline(), Some(ms(1600)));
        look.not_ready = None;
        assert_eq!(inj.poll(ms(1600), look), Some(Action::Type("m".into())));
        assert_eq!(look.looks, 2);
    }

    #[test]
    fn enter_follows_as_soon_as_the_text_shows_and_after_the_delay_when_it_never_does() {
        let t0 = relay_protocol::now_instant();
        let ms = |n| t0 + Duration::from_millis(n);
        let on_echo = Timing {
            enter_on_echo: true,
            ..timing()
        };
        let look = &mut Fake::default();
        let mut inj = Injector::new(on_echo, t0);
        inj.push("one".into(), 1, false);
        inj.push("two".into(), 2, false);
        assert_eq!(inj.poll(ms(500), look), Some(Action::Type("one".into())));
        assert_eq!(
            inj.next_deadline(),
            Some(ms(600)),
            "no output yet: the delay"
        );
        // The agent draws something that is not the text yet: looked at once, no Enter.
        inj.on_output(ms(510));
        assert_eq!(inj.next_deadline(), Some(ms(510)), "output: look at once");
        assert_eq!(inj.poll(ms(511), look), None);
        assert_eq!(look.echo_looks, 1);
        assert_eq!(inj.poll(ms(520), look), None, "nothing new to look at");
        assert_eq!(look.echo_looks, 1);
        assert_eq!(inj.next_deadline(), Some(ms(600)));
        // The text shows: Enter now, not at the delay.
        look.shown = true;
        inj.on_output(ms(530));
        assert_eq!(inj.poll(ms(531), look), Some(Action::Enter));
        inj.on_output(ms(540));
        assert_eq!(
            inj.poll(ms(831), look),
            Some(Action::Done(1, Outcome::Verified))
        );
        // Output before the next text is typed is not its echo.
        assert_eq!(inj.poll(ms(1040), look), Some(Action::Type("two".into())));
        assert_eq!(inj.next_deadline(), Some(ms(1140)));
        // It never shows: Enter after the delay all the same.
        look.shown = false;
        inj.on_output(ms(1050));
        assert_eq!(inj.poll(ms(1050), look), None);
        assert_eq!(inj.poll(ms(1140), look), Some(Action::Enter));
        // Off (a profile that cannot tell), the screen is not looked at and the delay holds.
        let look = &mut Fake {
            shown: true,
            ..Fake::default()
        };
        let mut inj = Injector::new(timing(), t0);
        inj.push("one".into(), 1, false);
        assert_eq!(inj.poll(ms(500), look), Some(Action::Type("one".into())));
        inj.on_output(ms(510));
        assert_eq!(inj.next_deadline(), Some(ms(600)));
        assert_eq!(inj.poll(ms(520), look), None);
        assert_eq!(look.echo_looks, 0);
        assert_eq!(inj.poll(ms(600), look), Some(Action::Enter));
    }

    #[test]
    fn a_screen_ready_after_a_short_quiet_is_typed_into_at_once_else_after_the_quiet_time() {
        let t0 = relay_protocol::now_instant();
        let ms = |n| t0 + Duration::from_millis(n);
        let early = Timing {
            ready_quiet: Some(Duration::from_millis(30)),
            ..timing()
        };
        let look = &mut Fake::default();
        let mut inj = Injector::new(early, t0);
        inj.push("one".into(), 1, false);
        inj.on_output(ms(100));
        assert_eq!(inj.next_deadline(), Some(ms(130)));
        assert_eq!(inj.poll(ms(130), look), Some(Action::Type("one".into())));
        // Not ready at the short quiet: looked at once, then the full quiet as before.
        let look = &mut Fake {
            not_ready: Some(NotReady::Busy("esc to interrupt".into())),
            ..Fake::default()
        };
        let mut inj = Injector::new(early, t0);
        inj.push("one".into(), 1, false);
        inj.on_output(ms(100));
        assert_eq!(inj.poll(ms(130), look), None);
        assert_eq!(look.looks, 1);
        assert_eq!(inj.next_deadline(), Some(ms(600)));
        assert_eq!(
            inj.blocked_by(),
            None,
            "not blocked yet: the quiet time decides"
        );
        look.not_ready = None;
        assert_eq!(inj.poll(ms(600), look), Some(Action::Type("one".into())));
        // A person's half-written line holds it all the same.
        let look = &mut Fake::default();
        let mut inj = Injector::new(early, t0);
        inj.push("one".into(), 1, false);
        inj.on_person_input(b"half", ms(100));
        assert_eq!(inj.poll(ms(130), look), None);
        assert_eq!(look.looks, 0);
        // Ready, but not set to take it early (a CLI that has not turned bracketed paste on
        // yet): the full quiet time, as before the early path.
        let look = &mut Fake {
            not_early: true,
            ..Fake::default()
        };
        let mut inj = Injector::new(early, t0);
        inj.push("one".into(), 1, false);
        inj.on_output(ms(100));
        assert_eq!(inj.poll(ms(130), look), None);
        assert_eq!(inj.next_deadline(), Some(ms(600)));
        assert_eq!(inj.poll(ms(600), look), Some(Action::Type("one".into())));
    }

    #[test]
    fn queued_messages_taken_by_another_door_are_not_typed() {
        let t0 = relay_protocol::now_instant();
        let look = &mut Fake::default();
        let mut inj = Injector::new(timing(), t0);
        inj.push("a".into(), 1, false);
        inj.push("b".into(), 2, false);
        inj.push("c".into(), 3, false);
        let at = t0 + Duration::from_secs(1);
        assert_eq!(inj.poll(at, look), Some(Action::Type("a".into())));
        // The one being typed stays; the others go, in order.
        let taken = inj.take_queued(|_, _| true);
        assert_eq!(taken, vec![("b".to_owned(), 2), ("c".to_owned(), 3)]);
        assert_eq!(inj.pending(), 1);
        assert_eq!(inj.current(), Some(&1));
    }

    #[test]
    fn an_urgent_message_goes_first() {
        let t0 = relay_protocol::now_instant();
        let look = &mut Fake::default();
        let mut inj = Injector::new(timing(), t0);
        inj.push("a".into(), 1, false);
        inj.push("b".into(), 2, false);
        inj.push("urgent".into(), 3, true);
        let at = t0 + Duration::from_secs(1);
        assert_eq!(inj.poll(at, look), Some(Action::Type("urgent".into())));
    }

    #[test]
    fn group_len_takes_joinable_entries_up_to_the_limit_and_a_lone_first_otherwise() {
        // Three small messages: one prompt.
        assert_eq!(group_len([Some(10), Some(10), Some(10)], 100), 3);
        // Over the limit: split, the rest waits for the next prompt.
        assert_eq!(group_len([Some(40), Some(40), Some(40)], 100), 2);
        assert_eq!(group_len([Some(40), Some(60), Some(1)], 100), 2);
        // A message longer than the limit still goes, alone.
        assert_eq!(group_len([Some(500), Some(10)], 100), 1);
        assert_eq!(group_len([Some(10), Some(500)], 100), 1);
        // One that cannot be joined (urgent, a notice) goes alone when first, and ends a group.
        assert_eq!(group_len([None, Some(10), Some(10)], 100), 1);
        assert_eq!(group_len([Some(10), None, Some(10)], 100), 1);
        assert_eq!(group_len([Some(10), Some(10), None, Some(10)], 100), 2);
        assert_eq!(group_len(std::iter::empty(), 100), 1);
    }

    /// A joiner that joins texts with `+` and items into their sum; odd items are notices.
    fn joiner(max_chars: usize) -> Joiner<u32> {
        Joiner {
            max_chars,
            joinable: Box::new(|i: &u32| i.is_multiple_of(2)),
            join: Box::new(|group: Vec<(String, u32)>| {
                let text = group
                    .iter()
                    .map(|(t, _)| t.as_str())
                    .collect::<Vec<_>>()
                    .join("+");
                (text, group.iter().map(|(_, i)| i).sum())
            }),
        }
    }

    #[test]
    fn messages_waiting_for_a_busy_agent_go_in_as_one_prompt_urgent_first_and_alone() {
        let t0 = relay_protocol::now_instant();
        let ms = |n| t0 + Duration::from_millis(n);
        let look = &mut Fake {
            not_ready: Some(NotReady::Busy("esc to interrupt".into())),
            ..Fake::default()
        };
        let mut inj = Injector::new(timing(), t0);
        inj.set_joiner(joiner(100));
        inj.push("a".into(), 2, false);
        assert_eq!(inj.poll(ms(500), look), None, "busy");
        inj.push("b".into(), 4, false);
        inj.push("U1".into(), 100, true);
        inj.push("c".into(), 6, false);
        inj.push("U2".into(), 200, true);
        assert_eq!(inj.pending(), 5);
        look.not_ready = None;
        inj.on_output(ms(600));
        // Urgent ones first, each alone, in the order they came.
        assert_eq!(inj.poll(ms(1100), look), Some(Action::Type("U1".into())));
        assert_eq!(inj.poll(ms(1200), look), Some(Action::Enter));
        assert_eq!(
            inj.poll(ms(1500), look),
            Some(Action::Done(100, Outcome::Verified))
        );
        assert_eq!(inj.poll(ms(2000), look), Some(Action::Type("U2".into())));
        assert_eq!(inj.poll(ms(2100), look), Some(Action::Enter));
        assert_eq!(
            inj.poll(ms(2400), look),
            Some(Action::Done(200, Outcome::Verified))
        );
        // Then everything else that waited, as one prompt and one item.
        assert_eq!(inj.poll(ms(2900), look), Some(Action::Type("a+b+c".into())));
        assert_eq!(inj.current(), Some(&12));
        assert_eq!(inj.pending(), 1);
        assert_eq!(inj.poll(ms(3000), look), Some(Action::Enter));
        assert_eq!(
            inj.poll(ms(3300), look),
            Some(Action::Done(12, Outcome::Verified))
        );
        assert_eq!(inj.pending(), 0);
    }

    #[test]
    fn a_digest_over_the_limit_splits_and_a_notice_goes_alone() {
        let t0 = relay_protocol::now_instant();
        let look = &mut Fake::default();
        let mut inj = Injector::new(timing(), t0);
        inj.set_joiner(joiner(8));
        for (text, item) in [
            ("aaaa", 2),
            ("bbbb", 4),
            ("cccc", 6),
            ("note", 1),
            ("dd", 8),
        ] {
            inj.push(text.into(), item, false);
        }
        let mut typed = Vec::new();
        let mut at = t0;
        while inj.pending() > 0 {
            at += Duration::from_millis(100);
            if let Some(Action::Type(t)) = inj.poll(at + Duration::from_secs(1), look) {
                typed.push(t);
            }
        }
        assert_eq!(typed, ["aaaa+bbbb", "cccc", "note", "dd"]);
        // Without a joiner, one at a time as before.
        let mut inj = Injector::new(timing(), t0);
        inj.push("a".into(), 2, false);
        inj.push("b".into(), 4, false);
        assert_eq!(
            inj.poll(t0 + Duration::from_secs(1), look),
            Some(Action::Type("a".into()))
        );
    }

    #[test]
    fn queued_entries_can_be_taken_out() {
        let t0 = relay_protocol::now_instant();
        let mut inj = Injector::new(timing(), t0);
        inj.push("a".into(), 2, false);
        inj.push("b".into(), 4, false);
        assert_eq!(inj.remove_queued(|i| *i == 4), [4]);
        assert_eq!(inj.pending(), 1);
        assert!(!inj.holds(|i| *i == 4));
    }

    #[test]
    fn terminal_replies_to_the_agent_are_not_a_half_written_line() {
        let t0 = relay_protocol::now_instant();
        let look = &mut Fake::default();
        let mut inj = Injector::new(timing(), t0);
        inj.push("msg".into(), 1, false);
        // What tmux answered Claude Code 2.1.197 right after a prompt was submitted.
        inj.on_person_input(b"\r", t0);
        inj.on_person_input(b"\x1bP>|tmux 3.3a\x1b\\\x1b[?1;2c", t0);
        inj.on_person_input(
            b"\x1b]11;rgb:0000/0000/0000\x07\x1b[12;40R\x1b[I\x1b[?1u",
            t0,
        );
        assert_eq!(
            inj.poll(t0 + Duration::from_millis(600), look),
            Some(Action::Type("msg".into()))
        );
        // Keys a person presses still count.
        for keys in [&b"\x1b[A"[..], b"\x1b[1;5D", b"\x1bb", b"x", b"\x1b[?1;2"] {
            let mut inj = Injector::new(timing(), t0);
            inj.push("msg".into(), 1, false);
            inj.on_person_input(keys, t0);
            assert_eq!(
                inj.poll(t0 + Duration::from_secs(60), look),
                None,
                "{keys:?}"
            );
        }
    }
}
