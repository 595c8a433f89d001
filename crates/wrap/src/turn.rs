//! Reply chains, the core's part: what `decide/chain.rs` needs of the screen and the
//! injector to tell a turn's end.

use crate::Core;

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
}
