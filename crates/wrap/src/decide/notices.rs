//! Notice delivery's bookkeeping (`wrap --delivery notice`, see `core/deliver.rs`): which messages
//! had their notice typed and wait for the agent's own tool to show them, which the tool
//! showed while their notice was being typed, and which it showed before their delivery
//! reached this wrapper (those need no notice). Pure: the shell acknowledges.

use std::collections::{HashMap, HashSet, VecDeque};

use relay_client::Delivered;

/// How many ids shown by the agent's tool before their delivery came are remembered.
pub(crate) const SHOWN_UNSEEN: usize = 256;

/// What notice delivery remembers between a notice and the agent's tool showing its message.
#[derive(Debug, Default)]
pub(crate) struct Notices {
    /// Messages whose notice was typed (acknowledged injected), by id, until the agent's tool
    /// shows them (then verified).
    noticed: HashMap<String, Delivered>,
    /// Ids the agent's tool showed while their notice was being typed.
    read_early: HashSet<String>,
    /// Ids the agent's tool took (`relay_inbox` under the wrapper: recorded and acknowledged
    /// by the tool's door) while their notice was being typed: the notice's end acknowledges
    /// nothing more.
    taken_early: HashSet<String>,
    /// Ids the agent's tool showed before their delivery reached this wrapper (the latest
    /// [`SHOWN_UNSEEN`]).
    shown_unseen: VecDeque<String>,
}

impl Notices {
    /// `m`'s notice was submitted (or was before a restart): it waits for the agent's tool.
    pub(crate) fn noticed(&mut self, m: Delivered) {
        self.noticed.insert(m.id.clone(), m);
    }

    /// Every message whose notice was typed, in no order (the agent's tool takes them; those
    /// it does not are given back with [`Notices::noticed`]).
    pub(crate) fn drain_noticed(&mut self) -> Vec<Delivered> {
        self.noticed.drain().map(|(_, m)| m).collect()
    }

    /// The agent's tool showed `id`: the message if its notice was typed.
    pub(crate) fn take_noticed(&mut self, id: &str) -> Option<Delivered> {
        self.noticed.remove(id)
    }

    /// The agent's tool showed `id` while its notice was being typed.
    pub(crate) fn read_while_typed(&mut self, id: &str) {
        self.read_early.insert(id.to_owned());
    }

    /// Whether the agent's tool showed `id` while its notice was typed (forgotten now).
    pub(crate) fn take_read_early(&mut self, id: &str) -> bool {
        self.read_early.remove(id)
    }

    /// The agent's tool took `id` (handed over and acknowledged by its door) while its notice
    /// was being typed.
    pub(crate) fn taken_while_typed(&mut self, id: &str) {
        self.taken_early.insert(id.to_owned());
    }

    /// Whether the agent's tool took `id` while its notice was typed (forgotten now): then the
    /// notice's end records and acknowledges nothing more.
    pub(crate) fn take_taken_early(&mut self, id: &str) -> bool {
        self.taken_early.remove(id)
    }

    /// The agent's tool showed `ids` before their delivery reached this wrapper, but those
    /// `dealt_with` (typed, in the ledger): no notice when they come. Only the latest
    /// [`SHOWN_UNSEEN`] are kept.
    pub(crate) fn shown_before_delivery<'a>(
        &mut self,
        ids: impl IntoIterator<Item = &'a String>,
        dealt_with: impl Fn(&str) -> bool,
    ) {
        for id in ids {
            if !dealt_with(id) && !self.shown_unseen.contains(id) {
                self.shown_unseen.push_back(id.clone());
            }
        }
        while self.shown_unseen.len() > SHOWN_UNSEEN {
            self.shown_unseen.pop_front();
        }
    }

    /// Whether `id` was shown by the agent's tool before it got here (forgotten now).
    pub(crate) fn take_shown_unseen(&mut self, id: &str) -> bool {
        let Some(at) = self.shown_unseen.iter().position(|s| s == id) else {
            return false;
        };
        self.shown_unseen.remove(at);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::testing;

    fn message(id: &str) -> Delivered {
        testing::message(id, "Bob", None)
    }

    #[test]
    fn a_noticed_message_is_verified_once_when_the_tool_shows_it() {
        let mut n = Notices::default();
        n.noticed(message("m1"));
        assert_eq!(n.take_noticed("m1").map(|m| m.id), Some("m1".to_owned()));
        assert!(n.take_noticed("m1").is_none());
    }

    #[test]
    fn a_message_the_tool_showed_while_its_notice_was_typed_is_remembered_once() {
        let mut n = Notices::default();
        n.read_while_typed("m1");
        assert!(n.take_read_early("m1"));
        assert!(!n.take_read_early("m1"));
    }

    #[test]
    fn a_message_shown_before_its_delivery_needs_no_notice_unless_dealt_with() {
        let mut n = Notices::default();
        let ids = ["m1".to_owned(), "m2".to_owned(), "m1".to_owned()];
        n.shown_before_delivery(&ids, |id| id == "m2");
        assert!(n.take_shown_unseen("m1"));
        assert!(!n.take_shown_unseen("m1"), "remembered once");
        assert!(!n.take_shown_unseen("m2"), "dealt with already");
    }

    #[test]
    fn only_the_latest_ids_shown_before_delivery_are_kept() {
        let mut n = Notices::default();
        let ids: Vec<String> = (0..=SHOWN_UNSEEN).map(|i| format!("m{i}")).collect();
        n.shown_before_delivery(&ids, |_| false);
        assert!(!n.take_shown_unseen("m0"), "the oldest is forgotten");
        assert!(n.take_shown_unseen(&format!("m{SHOWN_UNSEEN}")));
    }
}
