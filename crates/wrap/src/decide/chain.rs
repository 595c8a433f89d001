//! Reply chains: which relayed message what the agent prints answers.
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
//! (a program may think without printing). For those the wrapper asks the terminal instead
//! whether a person pressed a key in the session (or attached to it) since the message typed
//! last was entered ([`Terminal::person_activity`](crate::terminal::Terminal::person_activity),
//! which the wrapper's own typing does not move): if so, the person took a turn and what the
//! agent prints next starts a new chain, as a person's Enter does under a PTY. tmux keeps that
//! time in whole seconds, so a key pressed in the same second as the wrapper's Enter is not
//! seen and the chain goes on: the safe side of the budget.
//!
//! After a digest (several messages typed as one prompt), a directive to one of its senders
//! answers that sender's latest message in it; any other answers the digest's last message.
//!
//! Pure: the shell reads the terminal and passes what it read.

use relay_client::Delivered;

/// The reply chain of one agent.
#[derive(Debug, Default)]
pub(crate) struct Chain {
    /// The message typed last (its id and thread): what the agent prints next answers it.
    replying_to: Option<(String, Option<String>)>,
    /// The senders of the digest typed last, with the id and thread of each one's latest
    /// message in it.
    digest_senders: Vec<(String, String, Option<String>)>,
    /// A person's activity in the terminal when the message typed last was entered (a
    /// profile that does not know the CLI's input line, on a terminal that tells it).
    activity: Option<u64>,
    /// The screen was looked at for the end of the agent's turn since its last output.
    turn_looked: bool,
}

impl Chain {
    /// `messages` (one, or a digest) are being typed: what the agent prints next answers
    /// them. The person's activity is measured again once they are entered.
    pub(crate) fn typed(&mut self, messages: &[Delivered]) {
        self.replying_to = messages
            .last()
            .map(|m| (m.id.clone(), m.payload.thread.clone()));
        self.digest_senders = if messages.len() > 1 {
            let mut senders: Vec<(String, String, Option<String>)> = Vec::new();
            for m in messages {
                senders.retain(|(from, _, _)| *from != m.from);
                senders.push((m.from.clone(), m.id.clone(), m.payload.thread.clone()));
            }
            senders
        } else {
            Vec::new()
        };
        self.activity = None;
    }

    /// `m` was handed to the model by a Claude Code hook: the turn answers it.
    pub(crate) fn handed(&mut self, m: &Delivered) {
        self.replying_to = Some((m.id.clone(), m.payload.thread.clone()));
    }

    /// A person pressed Enter at the wrapper's terminal (PTY): a new conversation.
    pub(crate) fn person_entered(&mut self) {
        self.replying_to = None;
    }

    /// The agent printed: its turn is looked at again once it is quiet.
    pub(crate) fn on_output(&mut self) {
        self.turn_looked = false;
    }

    /// The `in_reply_to` and thread of a directive to `to` that names `thread` (or none).
    pub(crate) fn answer(
        &self,
        to: &str,
        thread: Option<String>,
    ) -> (Option<String>, Option<String>) {
        let from_digest = self
            .digest_senders
            .iter()
            .find(|(from, _, _)| from == to)
            .map(|(_, id, thread)| (id.clone(), thread.clone()));
        let replying_to = match (&self.replying_to, from_digest) {
            (Some(_), Some(answered)) => Some(answered),
            (r, _) => r.clone(),
        };
        match replying_to {
            Some((id, their)) => {
                let thread = thread.or(their).or_else(|| Some(id.clone()));
                (Some(id), thread)
            }
            None => (None, thread),
        }
    }

    /// A terminal that does not pass the person's keys through (tmux): ends the chain if the
    /// agent's turn is over. Looked at once per quiet spell (`quiet`), only while a chain is
    /// open, no typing of the wrapper's is under way (its own text in the input line is no
    /// turn's end) and the profile knows the CLI's input line; `waiting_for_input` reads the
    /// screen.
    pub(crate) fn end_if_turn_over(
        &mut self,
        quiet: bool,
        typing: bool,
        knows_prompt: bool,
        waiting_for_input: impl FnOnce() -> bool,
    ) {
        if self.replying_to.is_none() || self.turn_looked || !quiet || typing || !knows_prompt {
            return;
        }
        self.turn_looked = true;
        if waiting_for_input()
            && let Some((id, _)) = self.replying_to.take()
        {
            tracing::debug!(%id, "the agent's turn is over: what it prints next starts a new reply chain");
        }
    }

    /// The message typed last was entered, with a person's activity in the terminal then
    /// (`None`: unknown, or the terminal does not tell it).
    pub(crate) fn entered(&mut self, activity: Option<u64>) {
        self.activity = activity;
    }

    /// Whether a person's activity must be read before a directive is sent: the activity
    /// when the chain's message was entered, while the chain is open.
    pub(crate) fn activity_wanted(&mut self) -> Option<u64> {
        let since = self.activity?;
        if self.replying_to.is_none() {
            self.activity = None;
            return None;
        }
        Some(since)
    }

    /// A person's activity in the terminal, read before a directive is sent: a key pressed
    /// since the chain's message was entered ends the chain.
    pub(crate) fn person_activity(&mut self, at: u64) {
        let Some(since) = self.activity else {
            return;
        };
        if at > since {
            self.activity = None;
            if let Some((id, _)) = self.replying_to.take() {
                tracing::debug!(%id, "a person typed into the session: what the agent prints now starts a new reply chain");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::testing::message;

    /// Whether a chain is open: a directive now answers a message.
    fn open(chain: &Chain) -> bool {
        chain.answer("Anyone", None).0.is_some()
    }

    fn some(s: &str) -> Option<String> {
        Some(s.to_owned())
    }

    #[test]
    fn a_directive_with_no_message_typed_starts_no_chain() {
        let chain = Chain::default();
        assert_eq!(chain.answer("Bob", None), (None, None));
        assert_eq!(chain.answer("Bob", some("t")), (None, some("t")));
    }

    #[test]
    fn a_directive_after_a_typed_message_answers_it_in_its_thread() {
        let mut chain = Chain::default();
        chain.typed(&[message("m1", "Bob", None)]);
        // No thread: the message's id starts one.
        assert_eq!(chain.answer("Bob", None), (some("m1"), some("m1")));
        chain.typed(&[message("m2", "Bob", Some("t9"))]);
        assert_eq!(chain.answer("Carol", None), (some("m2"), some("t9")));
        // A thread the directive names itself wins.
        assert_eq!(
            chain.answer("Carol", some("own")),
            (some("m2"), some("own"))
        );
    }

    #[test]
    fn after_a_digest_a_directive_to_a_sender_answers_that_senders_latest_message() {
        let mut chain = Chain::default();
        chain.typed(&[
            message("b1", "Bob", None),
            message("c1", "Carol", Some("tc")),
            message("b2", "Bob", Some("tb")),
        ]);
        assert_eq!(chain.answer("Bob", None), (some("b2"), some("tb")));
        assert_eq!(chain.answer("Carol", None), (some("c1"), some("tc")));
        // Anyone else: the digest's last message.
        assert_eq!(chain.answer("Dan", None), (some("b2"), some("tb")));
    }

    #[test]
    fn a_persons_enter_ends_the_chain() {
        let mut chain = Chain::default();
        chain.typed(&[message("m1", "Bob", None)]);
        chain.person_entered();
        assert!(!open(&chain));
        assert_eq!(chain.answer("Bob", None), (None, None));
    }

    #[test]
    fn a_message_handed_to_a_hook_is_answered_like_a_typed_one() {
        let mut chain = Chain::default();
        chain.handed(&message("h1", "Bob", Some("th")));
        assert_eq!(chain.answer("Bob", None), (some("h1"), some("th")));
    }

    #[test]
    fn the_turn_is_looked_at_once_per_quiet_spell_and_its_end_ends_the_chain() {
        let mut chain = Chain::default();
        chain.typed(&[message("m1", "Bob", None)]);
        // Not quiet, typing, or a profile without an input line: not looked at.
        chain.end_if_turn_over(false, false, true, || unreachable!());
        chain.end_if_turn_over(true, true, true, || unreachable!());
        chain.end_if_turn_over(true, false, false, || unreachable!());
        // Looked at: not over. Not looked at again until the agent prints.
        chain.end_if_turn_over(true, false, true, || false);
        chain.end_if_turn_over(true, false, true, || unreachable!());
        assert!(open(&chain));
        chain.on_output();
        chain.end_if_turn_over(true, false, true, || true);
        assert!(!open(&chain));
    }

    #[test]
    fn a_persons_key_since_the_enter_ends_the_chain_and_the_same_second_does_not() {
        let mut chain = Chain::default();
        chain.typed(&[message("m1", "Bob", None)]);
        assert_eq!(chain.activity_wanted(), None, "not entered yet");
        chain.entered(Some(100));
        assert_eq!(chain.activity_wanted(), Some(100));
        chain.person_activity(100);
        assert!(open(&chain), "a key in the same second is not seen");
        chain.person_activity(101);
        assert!(!open(&chain));
        assert_eq!(chain.activity_wanted(), None);
    }

    #[test]
    fn no_activity_is_read_once_the_chain_ended_otherwise() {
        let mut chain = Chain::default();
        chain.typed(&[message("m1", "Bob", None)]);
        chain.entered(Some(100));
        chain.person_entered();
        assert_eq!(chain.activity_wanted(), None);
        // Typing a new message forgets the old activity until its own Enter.
        chain.entered(Some(5));
        chain.typed(&[message("m2", "Bob", None)]);
        assert_eq!(chain.activity_wanted(), None);
    }
}
