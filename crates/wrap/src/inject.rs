//! When to type an incoming message into the agent's terminal: a pure state machine that is
//! told about output and time, and answers what to write.
//!
//! One message at a time: wait until the agent's output has been quiet for the profile's
//! time and the person at the terminal has no half-written line, type the text, wait a
//! moment, then press Enter as a separate write (agents that get text and Enter in one write
//! often leave the text unsubmitted), and only then report the message as handed over.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Timing of injection.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Output must have been quiet this long before typing.
    pub quiet: Duration,
    /// Pause between the text and its Enter.
    pub enter_delay: Duration,
}

/// What to do now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action<T> {
    /// Write this text (no Enter yet).
    Type(String),
    /// Write Enter, then acknowledge the message: it is handed over.
    Submit(T),
}

#[derive(Debug)]
enum State<T> {
    Idle,
    Typed { at: Instant, item: T },
}

/// The injection queue of one terminal. `T` is whatever identifies a message to its owner.
#[derive(Debug)]
pub struct Injector<T> {
    timing: Timing,
    queue: VecDeque<(String, T)>,
    state: State<T>,
    last_output: Instant,
    /// Characters the person has typed on the current input line (0: nothing pending).
    person_line: usize,
}

impl<T> Injector<T> {
    /// An empty injector; `now` counts as the last output.
    pub fn new(timing: Timing, now: Instant) -> Self {
        Self {
            timing,
            queue: VecDeque::new(),
            state: State::Idle,
            last_output: now,
            person_line: 0,
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
        self.last_output = now;
        for b in without_terminal_reports(bytes) {
            match b {
                b'\r' | b'\n' | 0x03 | 0x15 => self.person_line = 0,
                0x7f | 0x08 => self.person_line = self.person_line.saturating_sub(1),
                // Anything else (letters, escape sequences of arrow keys...) means the person is
                // at the line; only submitting or clearing it gives the terminal back.
                _ => self.person_line += 1,
            }
        }
    }

    /// Queues `text` for typing.
    pub fn push(&mut self, text: String, item: T) {
        self.queue.push_back((text, item));
    }

    /// The agent printed something at `now`.
    pub fn on_output(&mut self, now: Instant) {
        self.last_output = now;
    }

    /// Messages waiting (including the one being typed).
    pub fn pending(&self) -> usize {
        self.queue.len() + usize::from(matches!(self.state, State::Typed { .. }))
    }

    /// What to do at `now`, if anything. Call repeatedly until it returns `None`.
    pub fn poll(&mut self, now: Instant) -> Option<Action<T>> {
        match std::mem::replace(&mut self.state, State::Idle) {
            State::Typed { at, item } if now.duration_since(at) >= self.timing.enter_delay => {
                Some(Action::Submit(item))
            }
            State::Typed { at, item } => {
                self.state = State::Typed { at, item };
                None
            }
            State::Idle => {
                if self.person_line > 0 || now.duration_since(self.last_output) < self.timing.quiet
                {
                    return None;
                }
                let (text, item) = self.queue.pop_front()?;
                self.state = State::Typed { at: now, item };
                Some(Action::Type(text))
            }
        }
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

    #[test]
    fn a_half_written_line_holds_injection_back_until_submitted_or_cleared() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut inj = Injector::new(timing(), t0);
        inj.push("msg".into(), 1);
        inj.on_person_input(b"half", ms(0));
        assert_eq!(inj.poll(ms(10_000)), None, "never types over a person");
        inj.on_person_input(b"\x7f\x7f\x7f", ms(10_000));
        assert_eq!(inj.poll(ms(20_000)), None, "one character left");
        inj.on_person_input(b"\x7f", ms(20_000));
        assert_eq!(
            inj.poll(ms(20_600)),
            Some(Action::Type("msg".into())),
            "line cleared"
        );
        let mut inj = Injector::new(timing(), t0);
        inj.push("msg".into(), 1);
        inj.on_person_input(b"ls -l\r", ms(0));
        assert_eq!(inj.poll(ms(400)), None, "still the quiet time");
        assert_eq!(
            inj.poll(ms(600)),
            Some(Action::Type("msg".into())),
            "line submitted"
        );
        let mut inj = Injector::new(timing(), t0);
        inj.push("msg".into(), 1);
        inj.on_person_input(b"oops\x15", ms(0));
        assert_eq!(
            inj.poll(ms(600)),
            Some(Action::Type("msg".into())),
            "Ctrl-U cleared it"
        );
    }

    #[test]
    fn terminal_replies_to_the_agent_are_not_a_half_written_line() {
        let t0 = Instant::now();
        let mut inj = Injector::new(timing(), t0);
        inj.push("msg".into(), 1);
        // What tmux answered Claude Code 2.1.197 right after a prompt was submitted.
        inj.on_person_input(b"\r", t0);
        inj.on_person_input(b"\x1bP>|tmux 3.3a\x1b\\\x1b[?1;2c", t0);
        inj.on_person_input(
            b"\x1b]11;rgb:0000/0000/0000\x07\x1b[12;40R\x1b[I\x1b[?1u",
            t0,
        );
        assert_eq!(
            inj.poll(t0 + Duration::from_millis(600)),
            Some(Action::Type("msg".into()))
        );
        // Keys a person presses still count.
        for keys in [&b"\x1b[A"[..], b"\x1b[1;5D", b"\x1bb", b"x", b"\x1b[?1;2"] {
            let mut inj = Injector::new(timing(), t0);
            inj.push("msg".into(), 1);
            inj.on_person_input(keys, t0);
            assert_eq!(inj.poll(t0 + Duration::from_secs(60)), None, "{keys:?}");
        }
    }

    fn timing() -> Timing {
        Timing {
            quiet: Duration::from_millis(500),
            enter_delay: Duration::from_millis(100),
        }
    }

    #[test]
    fn waits_for_quiet_then_types_then_enters_one_at_a_time() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut inj = Injector::new(timing(), t0);
        inj.push("one".into(), 1);
        inj.push("two".into(), 2);
        assert_eq!(inj.poll(ms(100)), None, "output not quiet yet");
        inj.on_output(ms(300));
        assert_eq!(inj.poll(ms(700)), None, "quiet since 300 only");
        assert_eq!(inj.poll(ms(800)), Some(Action::Type("one".into())));
        assert_eq!(inj.poll(ms(850)), None, "Enter waits for its delay");
        assert_eq!(inj.poll(ms(900)), Some(Action::Submit(1)));
        // The agent reacts to the message: the next waits for quiet again.
        inj.on_output(ms(950));
        assert_eq!(inj.poll(ms(1000)), None);
        assert_eq!(inj.poll(ms(1450)), Some(Action::Type("two".into())));
        assert_eq!(inj.pending(), 1);
        assert_eq!(inj.poll(ms(1550)), Some(Action::Submit(2)));
        assert_eq!(inj.pending(), 0);
        assert_eq!(inj.poll(ms(5000)), None);
    }
}
