//! The one terminal seam: everything the wrapper asks of the agent's terminal, whatever holds
//! it: its events, typing, Enter, and what it can tell (the history it shows, the cursor's row,
//! a person's activity, a fresh snapshot). Implemented by the PTY backend
//! ([`crate::pty::PtyTerminal`]), the tmux backend ([`crate::tmux::TmuxTerminal`], one
//! control-mode client; its blocking commands run off the loop's thread) and, for unit tests
//! of the loop under tokio's paused clock, `Fake`, which records what was typed and lets a
//! test feed output, resizes and the agent's exit, and set what it tells.

use crate::WrapError;

/// Something that happened at the terminal.
#[derive(Debug)]
pub(crate) enum TermEvent {
    /// Bytes the agent printed.
    Output(Vec<u8>),
    /// Keys a person pressed at the wrapper's own terminal (PTY): they go to the agent, and a
    /// half-written line holds relayed messages back.
    Keys(Vec<u8>),
    /// The person's terminal has a new size: the agent's terminal follows it.
    Resized {
        /// Rows.
        rows: u16,
        /// Columns.
        cols: u16,
    },
    /// The terminal was read afresh (tmux: a control client attached again after the last one
    /// ended while the session lives): the core reads it from its checkpoint.
    Reread(Snapshot),
    /// The agent's side ended: the agent exited (tmux: the session is gone).
    Ended,
    /// A signal stopped the wrapper (its number).
    Stopped(i32),
}

/// The agent's terminal, as the wrapper's loop drives it.
pub(crate) trait Terminal {
    /// The backend's name, as reported to the relay (`pty`, `tmux`).
    fn backend(&self) -> &'static str;

    /// The next event. Cancel-safe: the loop polls it in a `select!`. `checkpoint` is where
    /// a terminal read afresh is read from (see [`TermEvent::Reread`]).
    async fn next_event(&mut self, checkpoint: Option<u64>) -> Result<TermEvent, WrapError>;

    /// Shows `bytes` the agent printed to the person (PTY: mirrored unchanged; tmux: the
    /// person's own tmux client shows them). Called after the core counted them and before
    /// it parses them.
    fn show(&mut self, _bytes: &[u8]) {}

    /// Types `text` into the agent's input line, without Enter: pasted (bracketed when the
    /// agent asked for bracketed paste).
    async fn type_text(&mut self, text: &str) -> Result<(), WrapError>;

    /// Writes a person's keys as they are.
    async fn write_keys(&mut self, keys: Vec<u8>) -> Result<(), WrapError>;

    /// Presses Enter.
    async fn enter(&mut self) -> Result<(), WrapError>;

    /// Gives the agent's terminal a new size.
    fn resize(&mut self, rows: u16, cols: u16) -> Result<(), WrapError>;

    /// Whether the person's keys reach the wrapper ([`TermEvent::Keys`]): a person's Enter
    /// ends a reply chain there. When they do not (tmux), the chain ends where the agent's
    /// turn ends (see `Core::end_turn_if_idle` in `decide/core/mod.rs`).
    fn sees_keys(&self) -> bool;

    /// Whether a failure to type ends the wrapper (PTY: the agent's terminal is gone) or is
    /// only logged (tmux: the control client is attached again when its end is heard of).
    fn typing_errors_end(&self) -> bool;

    /// Whether the terminal outlives the wrapper (tmux: the pane lives on in its session), so
    /// that a restarted wrapper finds in its [`Terminal::history`] what the last one typed.
    /// A PTY agent ends with its wrapper.
    fn outlives_wrapper(&self) -> bool {
        false
    }

    /// Everything the terminal's history and screen hold, as text (tmux; `None` where the
    /// terminal keeps none): whether a stopped wrapper's message got there.
    async fn history(&mut self) -> Result<Option<String>, WrapError> {
        Ok(None)
    }

    /// The row the cursor is on, counted from the oldest row the terminal keeps (tmux; `None`
    /// where it keeps none): where a restarted wrapper starts reading.
    async fn cursor_row(&mut self) -> Result<Option<u64>, WrapError> {
        Ok(None)
    }

    /// When a person last pressed a key in the terminal, in whole seconds (tmux's session
    /// activity, which the wrapper's own typing does not move; `None` where the person's keys
    /// come through the wrapper instead, see [`Terminal::sees_keys`]): a person's turn ends a
    /// reply chain (see `decide/chain.rs`).
    async fn person_activity(&mut self) -> Result<Option<u64>, WrapError> {
        Ok(None)
    }

    /// The terminal read afresh from row `from` of its history (tmux; `None` where there is
    /// nothing to read back): see [`Snapshot`].
    async fn snapshot(&mut self, _from: Option<u64>) -> Result<Option<Snapshot>, WrapError> {
        Ok(None)
    }
}

/// The screen and history of a terminal read afresh (tmux: a pane, read at once when a
/// wrapper attaches; see [`crate::tmux::Pane::snapshot`]).
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    /// Rows a previous wrapper read and relayed (above its checkpoint, on the screen): fed to
    /// the parser so that its screen is whole, with what they make it find dropped.
    pub(crate) seen: Vec<u8>,
    /// Rows no wrapper has read: from the checkpoint (or the session's start) to the end of
    /// the screen, then the cursor put where tmux has it.
    pub(crate) unseen: Vec<u8>,
    /// Screen height.
    pub(crate) rows: u16,
    /// Screen width (the parser's continuation rule needs it).
    pub(crate) cols: u16,
    /// tmux: how many of the pane's notes were read before the screen's capture answered:
    /// those show on the captured screen, the later ones came after it (see `tmux.rs`,
    /// `after_capture`).
    pub(crate) notes_before: u64,
}

#[cfg(test)]
pub(crate) use fake::{Fake, Kept, Typed};

#[cfg(test)]
mod fake {
    use std::sync::{Arc, Mutex};

    use tokio::sync::mpsc;

    use super::{TermEvent, Terminal};
    use crate::WrapError;

    /// What the wrapper did to the fake terminal, in order.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub(crate) enum Typed {
        /// Text typed (pasted) into the input line.
        Text(String),
        /// A person's keys passed on.
        Keys(Vec<u8>),
        /// Enter.
        Enter,
        /// A resize.
        Resize(u16, u16),
    }

    /// What a terminal that outlives its wrapper (as tmux) tells, set by the test.
    #[derive(Debug, Default)]
    pub(crate) struct Kept {
        /// Its history and screen, as text.
        pub(crate) history: String,
        /// The cursor's row from the oldest kept.
        pub(crate) row: u64,
        /// When a person last pressed a key in it.
        pub(crate) activity: u64,
    }

    /// A terminal with no process behind it: a test feeds it events and reads what was typed.
    pub(crate) struct Fake {
        events: mpsc::UnboundedReceiver<TermEvent>,
        typed: Arc<Mutex<Vec<Typed>>>,
        sees_keys: bool,
        /// As tmux: what it keeps and tells.
        kept: Option<Arc<Mutex<Kept>>>,
    }

    impl Fake {
        /// A fake terminal, the sender a test feeds it through, and what it was given.
        /// `sees_keys`: as a PTY (true) or as tmux (false).
        pub(crate) fn new(
            sees_keys: bool,
        ) -> (
            Self,
            mpsc::UnboundedSender<TermEvent>,
            Arc<Mutex<Vec<Typed>>>,
        ) {
            let (tx, events) = mpsc::unbounded_channel();
            let typed = Arc::new(Mutex::new(Vec::new()));
            (
                Self {
                    events,
                    typed: typed.clone(),
                    sees_keys,
                    kept: None,
                },
                tx,
                typed,
            )
        }

        /// As tmux: it outlives the wrapper and tells what `kept` holds.
        pub(crate) fn keeping(mut self, kept: Arc<Mutex<Kept>>) -> Self {
            self.kept = Some(kept);
            self
        }

        fn record(&self, t: Typed) {
            self.typed.lock().unwrap().push(t);
        }
    }

    impl Terminal for Fake {
        fn backend(&self) -> &'static str {
            "fake"
        }

        async fn next_event(&mut self, _checkpoint: Option<u64>) -> Result<TermEvent, WrapError> {
            Ok(self.events.recv().await.unwrap_or(TermEvent::Ended))
        }

        async fn type_text(&mut self, text: &str) -> Result<(), WrapError> {
            self.record(Typed::Text(text.to_owned()));
            Ok(())
        }

        async fn write_keys(&mut self, keys: Vec<u8>) -> Result<(), WrapError> {
            self.record(Typed::Keys(keys));
            Ok(())
        }

        async fn enter(&mut self) -> Result<(), WrapError> {
            self.record(Typed::Enter);
            Ok(())
        }

        fn resize(&mut self, rows: u16, cols: u16) -> Result<(), WrapError> {
            self.record(Typed::Resize(rows, cols));
            Ok(())
        }

        fn sees_keys(&self) -> bool {
            self.sees_keys
        }

        fn typing_errors_end(&self) -> bool {
            true
        }

        fn outlives_wrapper(&self) -> bool {
            self.kept.is_some()
        }

        async fn history(&mut self) -> Result<Option<String>, WrapError> {
            Ok(self
                .kept
                .as_ref()
                .map(|k| k.lock().unwrap().history.clone()))
        }

        async fn cursor_row(&mut self) -> Result<Option<u64>, WrapError> {
            Ok(self.kept.as_ref().map(|k| k.lock().unwrap().row))
        }

        async fn person_activity(&mut self) -> Result<Option<u64>, WrapError> {
            Ok(self.kept.as_ref().map(|k| k.lock().unwrap().activity))
        }
    }
}
