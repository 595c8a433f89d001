//! The wrapper's decisions, each in a module of its own with one owner and no I/O: no
//! `.await`, no clock (every method takes `now`), no terminal, socket or file. The shell
//! (`Core` and `serve` in `lib.rs`) reads the terminal, the relay and the files, passes what
//! it read, and carries out what these decide.
//!
//! - [`quiet`]: when the agent's output counts as settled, busy printing, or due a look.
//! - [`chain`]: which relayed message what the agent prints answers (reply chains).
//! - [`ledger`]: a delivered message admitted against what this terminal was given before.
//! - [`outbox`]: directives on their way out, behind the agent's record of its replies.
//! - [`notices`]: notice delivery's bookkeeping.
//! - [`effect`]: what the core asks the shell to do, as data.
//! - [`resume`]: where relaying resumes in a terminal that outlives its wrapper (tmux).

pub(crate) mod chain;
pub(crate) mod effect;
pub(crate) mod ledger;
pub(crate) mod notices;
pub(crate) mod outbox;
pub(crate) mod quiet;
pub(crate) mod resume;
#[cfg(test)]
pub(crate) mod testing;
