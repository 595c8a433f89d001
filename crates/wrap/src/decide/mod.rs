//! The wrapper's decision core: [`core::Core`] and its decisions, each in a module of its own
//! with one owner. No I/O here: no `.await`, no clock (every method takes `now`), no terminal,
//! socket or file. The shell (`shell.rs`, and the run functions in `lib.rs`) reads the
//! terminal, the relay, the door and the files, passes what it read, and carries out what the
//! core decides ([`effect::Effect`]); `tests.rs` checks these sources for the calls and types
//! that would break that.
//!
//! - [`core`]: `Core`, which takes every event with `now` and returns effects, its deliveries
//!   (`core/deliver.rs`), and its unit and property tests (`core/tests.rs`).
//! - [`quiet`]: when the agent's output counts as settled, busy printing, or due a look.
//! - [`chain`]: which relayed message what the agent prints answers (reply chains).
//! - [`ledger`]: the replay ledger (what this terminal was given, recorded as effects), and a
//!   delivered message admitted against it.
//! - [`outbox`]: directives on their way out, behind the agent's record of its replies.
//! - [`notices`]: notice delivery's bookkeeping.
//! - [`effect`]: what the core asks the shell to do, as data.
//! - [`resume`]: where relaying resumes in a terminal that outlives its wrapper (tmux).

pub(crate) mod chain;
pub(crate) mod core;
pub(crate) mod effect;
pub(crate) mod ledger;
pub(crate) mod notices;
pub(crate) mod outbox;
pub(crate) mod quiet;
pub(crate) mod resume;
#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;
