//! Reply chains, the shell's part: reads the terminal for the decisions of
//! `decide/chain.rs` (where a chain ends, and why).

use crate::Core;
use crate::terminal::Terminal;

impl Core {
    /// A terminal that does not pass the person's keys through (tmux): ends the reply chain
    /// if the agent's turn for the message typed last is over, as the parser's screen (fed by
    /// the pane's output: nothing is captured) shows it.
    pub(crate) fn end_turn_if_idle(&mut self) {
        let (profile, parser) = (&self.cfg.profile, &self.parser);
        self.chain.end_if_turn_over(
            self.quiet.settled(),
            self.injector.current().is_some(),
            profile.knows_prompt(),
            || profile.waiting_for_input(&parser.screen()),
        );
    }

    /// A profile without a known input line, on a terminal that tells a person's activity:
    /// remembers it as the relayed message typed last is entered.
    pub(crate) async fn note_chain_start(&mut self, term: &mut impl Terminal) {
        if term.sees_keys() || self.cfg.profile.knows_prompt() {
            return;
        }
        let at = match term.person_activity().await {
            Ok(at) => at,
            Err(e) => {
                // Without it a person's turn is not seen: the chain goes on (the safe side).
                tracing::warn!(error = %e, "cannot read the session's activity; a person's turn will not end this reply chain");
                None
            }
        };
        self.chain.entered(at);
    }

    /// Ends the reply chain if a person pressed a key in the terminal since the message typed
    /// last was entered (see [`Core::note_chain_start`]).
    pub(crate) async fn end_chain_if_person_typed(&mut self, term: &mut impl Terminal) {
        if self.chain.activity_wanted().is_none() {
            return;
        }
        match term.person_activity().await {
            Ok(Some(at)) => self.chain.person_activity(at),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the session's activity; the reply chain goes on")
            }
        }
    }
}
