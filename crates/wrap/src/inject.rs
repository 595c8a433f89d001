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
    pub fn on_person_input(&mut self, bytes: &[u8], now: Instant) {
        self.last_output = now;
        for &b in bytes {
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
