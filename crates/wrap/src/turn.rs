//! Reply chains under tmux: which relayed message what the agent prints answers.
//!
//! A directive the agent prints while answering a relayed message is a reply to it (the
//! relay counts the hops of such chains and stops agents that answer each other forever). A
//! turn someone else started is not: what the agent prints for a person's new prompt starts
//! a new chain. The PTY loop sees a person's Enter and ends the chain there. Under tmux the
//! wrapper sees no keystrokes (a person types through their own tmux client, or with
//! `send-keys`), so it ends the chain where the agent's turn ends: once the agent, after the
//! message typed last, sits quiet at an empty input line with nothing working (see
//! [`Profile::waiting_for_input`](crate::profile::Profile::waiting_for_input)), whatever it
//! prints next was started by someone else. A message the wrapper types starts a chain again.
//!
//! Only a profile that knows the CLI's input line can tell a turn is over that way (claude,
//! codex, gemini, or a `prompt` in an override): for the others quiet output proves nothing
//! (a program may think without printing). For those the wrapper asks tmux instead whether a
//! person pressed a key in the session (or attached to it) since the message typed last was
//! entered ([`Terminal::person_activity`], which the wrapper's own typing does not move): if
//! so, the person took a turn and what the agent prints next starts a new chain, as a
//! person's Enter does under a PTY. tmux keeps that time in whole seconds, so a key pressed in
//! the same second as the wrapper's Enter is not seen and the chain goes on: the safe side of
//! the budget.

use crate::Core;
use crate::terminal::Terminal;

impl Core {
    /// tmux: ends the reply chain if the agent's turn for the message typed last is over.
    /// The pane is looked at once per quiet spell, only while a chain is open and no typing of
    /// the wrapper's is under way (its own text in the input line is not a turn's end).
    pub(crate) fn end_turn_if_idle(&mut self) {
        if self.replying_to.is_none()
            || self.turn_looked
            || !self.settled
            || self.injector.current().is_some()
            || !self.cfg.profile.knows_prompt()
        {
            return;
        }
        self.turn_looked = true;
        // The parser's screen, fed by the pane's output: nothing is captured.
        if self.cfg.profile.waiting_for_input(&self.parser.screen())
            && let Some((id, _)) = self.replying_to.take()
        {
            tracing::debug!(%id, "the agent's turn is over: what it prints next starts a new reply chain");
        }
    }
}

impl Core {
    /// tmux, a profile without a known input line: remembers the session's person activity as
    /// the relayed message typed last is entered.
    pub(crate) async fn note_chain_start(&mut self, term: &mut impl Terminal) {
        if term.sees_keys() || self.cfg.profile.knows_prompt() {
            return;
        }
        self.chain_activity = match term.person_activity().await {
            Ok(at) => at,
            Err(e) => {
                // Without it a person's turn is not seen: the chain goes on (the safe side).
                tracing::warn!(error = %e, "cannot read the session's activity; a person's turn will not end this reply chain");
                None
            }
        };
    }

    /// tmux: ends the reply chain if a person pressed a key in the session since the message
    /// typed last was entered (see [`Core::note_chain_start`]).
    pub(crate) async fn end_chain_if_person_typed(&mut self, term: &mut impl Terminal) {
        let (Some(since), Some(_)) = (self.chain_activity, &self.resume) else {
            return;
        };
        if self.replying_to.is_none() {
            self.chain_activity = None;
            return;
        }
        match term.person_activity().await {
            Ok(Some(at)) if at > since => {
                self.chain_activity = None;
                if let Some((id, _)) = self.replying_to.take() {
                    tracing::debug!(%id, "a person typed into the session: what the agent prints now starts a new reply chain");
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the session's activity; the reply chain goes on")
            }
        }
    }
}
