//! Where relaying resumes in a terminal that outlives its wrapper (tmux): the checkpoint,
//! the cursor's row below which nothing was read unrelayed, and the ids of the directives
//! found since it. A restarted wrapper reads from the checkpoint and derives the same ids
//! for the same directives, so the relay drops those it has already. Pure: the shell reads
//! the cursor's row when a checkpoint is due and saves the file.

use std::collections::HashMap;

use crate::state::Checkpoint;

/// The checkpoint relaying resumes from, and what was read since.
#[derive(Debug)]
pub(crate) struct Resume {
    checkpoint: Checkpoint,
    /// The tmux session (part of every derived id).
    session: String,
    /// Directives found since the checkpoint, by (to, body): how many.
    seen: HashMap<(String, String), u32>,
    /// Output was read since the checkpoint was saved.
    dirty: bool,
}

impl Resume {
    /// Resuming from `checkpoint` in `session`.
    pub(crate) fn new(checkpoint: Checkpoint, session: String) -> Self {
        Self {
            checkpoint,
            session,
            seen: HashMap::new(),
            dirty: false,
        }
    }

    /// The checkpoint's row.
    pub(crate) fn offset(&self) -> u64 {
        self.checkpoint.offset
    }

    /// Output was read.
    pub(crate) fn output(&mut self) {
        self.dirty = true;
    }

    /// The terminal is read afresh from the checkpoint: the directives found in it get the
    /// ids they had.
    pub(crate) fn reread(&mut self) {
        self.seen.clear();
    }

    /// Whether a new checkpoint is due: output was read since the last, it is all settled
    /// (`settled`), and every directive in it was relayed and acknowledged (`relayed`).
    pub(crate) fn due(&self, settled: bool, relayed: bool) -> bool {
        self.dirty && settled && relayed
    }

    /// The checkpoint moves to `row` (the cursor's, read when it was due) at `at_ms`; the
    /// checkpoint to save.
    pub(crate) fn moved(&mut self, row: u64, at_ms: u64) -> &Checkpoint {
        self.dirty = false;
        self.checkpoint = Checkpoint { offset: row, at_ms };
        self.seen.clear();
        &self.checkpoint
    }

    /// The id of a directive to `to` saying `body`, found since the checkpoint: the same for
    /// the same directive read again from the same checkpoint.
    pub(crate) fn directive_id(&mut self, to: &str, body: &str) -> String {
        let n = self
            .seen
            .entry((to.to_owned(), body.to_owned()))
            .or_insert(0);
        let id = self.checkpoint.directive_id(&self.session, to, body, *n);
        *n += 1;
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resume() -> Resume {
        Resume::new(
            Checkpoint {
                offset: 3,
                at_ms: 1_700_000_000_000,
            },
            "s".to_owned(),
        )
    }

    #[test]
    fn the_same_directive_read_again_from_the_checkpoint_gets_the_same_id() {
        let mut r = resume();
        let first = r.directive_id("Bob", "hi");
        let second = r.directive_id("Bob", "hi");
        assert_ne!(first, second, "a repeat is a new message");
        r.reread();
        assert_eq!(r.directive_id("Bob", "hi"), first);
        assert_eq!(r.directive_id("Bob", "hi"), second);
    }

    #[test]
    fn a_checkpoint_is_due_only_after_output_all_settled_and_relayed() {
        let mut r = resume();
        assert!(!r.due(true, true), "nothing read since");
        r.output();
        assert!(!r.due(false, true));
        assert!(!r.due(true, false));
        assert!(r.due(true, true));
        let saved = *r.moved(9, 5);
        assert_eq!((saved.offset, saved.at_ms), (9, 5));
        assert_eq!(r.offset(), 9);
        assert!(!r.due(true, true));
    }

    #[test]
    fn ids_after_a_moved_checkpoint_start_again() {
        let mut r = resume();
        let before = r.directive_id("Bob", "hi");
        r.output();
        r.moved(9, 5);
        assert_ne!(r.directive_id("Bob", "hi"), before);
    }
}
