//! When to type an incoming message into the agent's terminal: a pure state machine that is
//! told about output and time, and answers what to write.
//!
//! One message at a time: wait until the agent's output has been quiet for the profile's
//! time, type the text, wait a moment, then press Enter as a separate write (agents that get
//! text and Enter in one write often leave the text unsubmitted), and only then report the
//! message as handed over.

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
}

impl<T> Injector<T> {
    /// An empty injector; `now` counts as the last output.
    pub fn new(timing: Timing, now: Instant) -> Self {
        Self {
            timing,
            queue: VecDeque::new(),
            state: State::Idle,
            last_output: now,
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
                if now.duration_since(self.last_output) < self.timing.quiet {
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
