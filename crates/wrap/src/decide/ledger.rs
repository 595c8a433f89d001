//! The replay ledger: what this terminal was given, and how far each message got. The relay
//! delivers a message again after a reconnect or a wrapper's restart; the ledger says how far it
//! got before. A message is never typed twice: one the ledger knows is acknowledged with what is
//! known of it, and only one that never reached the agent is typed (again).
//!
//! Pure. The core keeps the ledger in memory ([`Ledger`]) and records each step as a
//! [`Record`], which it hands to the shell as an effect ([`crate::decide::effect::Effect::Record`])
//! before the effects it guards (the text typed, the Enter pressed, the acknowledgement); the
//! shell appends it to `injected.log` (`state.rs`, which also reads the file back into a
//! [`Ledger`] when a wrapper starts).

use std::collections::{HashMap, VecDeque};

use relay_protocol::DeliveryState;

use crate::format::Delivery;

/// Ids remembered; older ones are forgotten (and dropped when the file is compacted).
pub(crate) const REMEMBER: usize = 10_000;

/// How far a remembered message got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Typed {
    /// Typing started, Enter not pressed yet (the wrapper stopped in between): the text
    /// went no further than the agent's input line.
    Started,
    /// Enter was pressed (or about to be) and no outcome recorded: the agent may have
    /// taken the message.
    Entered,
    /// Submitted and seen on the screen.
    Verified,
    /// Typed but not seen submitted.
    Failed,
}

/// One step of a message in the ledger: one line of `injected.log`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Record {
    /// Typing `id` starts: recorded before the first byte is typed. Under tmux the first
    /// message of a text also has the checkpoint's pane row when typing began and the text,
    /// so that a wrapper re-reading the pane from before that row knows its echo for what it
    /// is ([`Ledger::typed_since`]).
    Started {
        /// The message.
        id: String,
        /// The checkpoint's row and the text typed.
        at: Option<(u64, String)>,
    },
    /// Enter is about to be pressed for `id`: recorded before the Enter is written. From then
    /// on a restarted wrapper counts the message as possibly taken, and does not type it again.
    Entered {
        /// The message.
        id: String,
    },
    /// How typing (or handing over) `id` ended.
    Finished {
        /// The message.
        id: String,
        /// Seen submitted (or shown to the model by a door); else typed and not submitted.
        verified: bool,
    },
}

impl Record {
    /// The message recorded.
    pub(crate) fn id(&self) -> &str {
        match self {
            Record::Started { id, .. } | Record::Entered { id } | Record::Finished { id, .. } => id,
        }
    }

    /// How far the message got, by this record.
    fn state(&self) -> Typed {
        match self {
            Record::Started { .. } => Typed::Started,
            Record::Entered { .. } => Typed::Entered,
            Record::Finished { verified: true, .. } => Typed::Verified,
            Record::Finished {
                verified: false, ..
            } => Typed::Failed,
        }
    }

    /// What it means when this record could not be written to `injected.log`: this wrapper
    /// goes on as recorded (its ledger in memory has it), a restarted one does not know it.
    pub(crate) fn if_lost(&self) -> &'static str {
        match self {
            Record::Started { .. } => {
                "if this wrapper stops before the message is acknowledged, a restarted one does                  not know it was typed and may type it again"
            }
            Record::Entered { .. } => {
                "if this wrapper stops before the message is acknowledged, a restarted one takes                  it as never entered and may type it again"
            }
            Record::Finished { .. } => {
                "a restarted wrapper finds the message typed without an outcome: it does not type                  it again, and decides its outcome from the terminal"
            }
        }
    }
}

/// What this terminal was given, in memory: read back from `injected.log` when the wrapper
/// starts, then kept by the core as it records.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    ids: HashMap<String, Typed>,
    order: VecDeque<String>,
    /// Texts earlier wrappers typed, with the checkpoint's pane row when typing began (tmux).
    typed_at: Vec<(u64, String)>,
}

impl Ledger {
    /// What is remembered about `id`.
    pub(crate) fn get(&self, id: &str) -> Option<Typed> {
        self.ids.get(id).copied()
    }

    /// A record read back from `injected.log` (an earlier wrapper's): remembered, and a text
    /// typed with its row kept for [`Ledger::typed_since`].
    pub(crate) fn load(&mut self, record: Record) {
        self.remember(&record);
        if let Record::Started { at: Some(at), .. } = record {
            self.typed_at.push(at);
        }
    }

    /// A record this wrapper makes now, remembered (the shell writes it). The text of a
    /// `Started` record is not kept for [`Ledger::typed_since`]: that is for what earlier
    /// wrappers typed (this one's parser noted its own texts as it typed them).
    pub(crate) fn remember(&mut self, record: &Record) {
        let id = record.id();
        if self.ids.insert(id.to_owned(), record.state()).is_none() {
            self.order.push_back(id.to_owned());
            if self.order.len() > REMEMBER
                && let Some(old) = self.order.pop_front()
            {
                self.ids.remove(&old);
            }
        }
    }

    /// The texts typed at or after checkpoint row `from`, oldest first, as recorded by
    /// earlier wrappers.
    pub(crate) fn typed_since(&self, from: u64) -> Vec<(u64, String)> {
        let mut v: Vec<_> = self
            .typed_at
            .iter()
            .filter(|(at, _)| *at >= from)
            .cloned()
            .collect();
        v.sort_by_key(|(at, _)| *at);
        v
    }

    /// One record per id remembered, in the order first seen, saying how far it got (texts
    /// typed are not kept): what a compacted `injected.log` holds.
    pub(crate) fn compacted(&self) -> impl Iterator<Item = Record> + '_ {
        self.order.iter().filter_map(|id| {
            let id = id.clone();
            Some(match self.ids.get(&id)? {
                Typed::Started => Record::Started { id, at: None },
                Typed::Entered => Record::Entered { id },
                Typed::Verified => Record::Finished { id, verified: true },
                Typed::Failed => Record::Finished {
                    id,
                    verified: false,
                },
            })
        })
    }
}

/// The reason given with a message the ledger says was typed and not submitted.
pub(crate) const FAILED_BEFORE: &str =
    "typed into the agent earlier and not submitted (recorded in injected.log)";

/// The reason given with a message submitted to a PTY agent that ended with its wrapper.
pub(crate) const READ_UNKNOWN: &str = "submitted to an agent that ended with its wrapper before \
     the wrapper saw it taken; whether the agent read it is unknown";

/// What becomes of a delivered message, judged by the ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Admission {
    /// It waits in the queue already (a replay while it waits): nothing more.
    Queued,
    /// Not typed, reported failed with this reason: its id is not one the relay accepts.
    BadId(String),
    /// Given before: acknowledged with this state, not typed.
    Known(DeliveryState),
    /// Notice delivery: its notice was typed and the agent's tool has not shown it yet:
    /// acknowledged injected, waiting for the tool.
    Noticed,
    /// Reported failed again with [`FAILED_BEFORE`], not typed.
    FailedBefore,
    /// A wrapper stopped between typing it and checking it: see [`replayed`].
    Interrupted(Typed),
    /// Never given: typed.
    New,
}

/// Admits a delivered message: `queued` whether it waits to be typed already, `id` whether its
/// id is one the relay accepts (why not), `known` what the ledger says of it.
pub(crate) fn admit(
    queued: bool,
    id: Result<(), String>,
    known: Option<Typed>,
    delivery: Delivery,
) -> Admission {
    if queued {
        return Admission::Queued;
    }
    // The daemon refuses such ids, but the wrapper does not rely on it: an id with a space, a
    // line break or a control character would corrupt `injected.log` (one id per line) and
    // could end a typed line early.
    if let Err(why) = id {
        return Admission::BadId(format!(
            "not typed: its id is not one the relay accepts ({why})"
        ));
    }
    match known {
        Some(Typed::Verified) if delivery == Delivery::Notice => Admission::Noticed,
        Some(Typed::Verified) => Admission::Known(DeliveryState::Verified),
        Some(Typed::Failed) => Admission::FailedBefore,
        Some(state @ (Typed::Started | Typed::Entered)) => Admission::Interrupted(state),
        None => Admission::New,
    }
}

/// What becomes of a message a stopped wrapper typed and did not check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Replayed {
    /// It never reached the agent: typed (again, which types it once).
    TypeAgain,
    /// It is in a terminal that outlived the wrapper: acknowledged injected, after pressing
    /// the Enter the stopped wrapper did not when its text still waits in the input line.
    Given {
        /// The text waits in the input line.
        press_enter: bool,
    },
    /// Entered into a PTY agent that ended with its wrapper: whether it read it is unknown,
    /// and typing twice is the worse error: reported failed with [`READ_UNKNOWN`].
    Unknown,
}

/// Decides on a message the ledger has as `state` (typed, or typed and entered). A terminal
/// that outlives the wrapper (`kept`, tmux) tells by its history whether the text got there
/// (`in_history`; `None`: it could not be read, taken as there: typing twice is worse);
/// `waiting` reads whether its text still waits in the input line. A PTY agent ended with
/// the wrapper: before its Enter the text was only in the input line of an agent now gone.
pub(crate) fn replayed(
    state: Typed,
    kept: bool,
    in_history: Option<bool>,
    waiting: impl FnOnce() -> bool,
) -> Replayed {
    let shown = if kept {
        in_history.unwrap_or(true)
    } else {
        state == Typed::Entered
    };
    match (shown, kept) {
        (false, _) => Replayed::TypeAgain,
        (true, true) => Replayed::Given {
            press_enter: waiting(),
        },
        (true, false) => Replayed::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admit_known(known: Option<Typed>, delivery: Delivery) -> Admission {
        admit(false, Ok(()), known, delivery)
    }

    #[test]
    fn a_message_waiting_in_the_queue_is_not_queued_again() {
        assert_eq!(
            admit(true, Err("bad".into()), None, Delivery::Each),
            Admission::Queued
        );
    }

    #[test]
    fn a_message_with_an_id_the_relay_refuses_is_reported_failed_not_typed() {
        let Admission::BadId(why) = admit(false, Err("a space".into()), None, Delivery::Each)
        else {
            panic!("admitted");
        };
        assert!(why.contains("a space"), "{why}");
    }

    #[test]
    fn a_message_never_given_is_typed() {
        assert_eq!(admit_known(None, Delivery::Each), Admission::New);
    }

    #[test]
    fn a_verified_message_is_acknowledged_again_and_not_typed() {
        assert_eq!(
            admit_known(Some(Typed::Verified), Delivery::Each),
            Admission::Known(DeliveryState::Verified)
        );
        assert_eq!(
            admit_known(Some(Typed::Verified), Delivery::Digest),
            Admission::Known(DeliveryState::Verified)
        );
    }

    #[test]
    fn under_notice_delivery_a_noticed_message_waits_for_the_agents_tool() {
        assert_eq!(
            admit_known(Some(Typed::Verified), Delivery::Notice),
            Admission::Noticed
        );
    }

    #[test]
    fn a_message_typed_and_not_submitted_before_is_reported_failed_again() {
        assert_eq!(
            admit_known(Some(Typed::Failed), Delivery::Each),
            Admission::FailedBefore
        );
    }

    #[test]
    fn a_message_a_stopped_wrapper_typed_is_looked_at_again() {
        for state in [Typed::Started, Typed::Entered] {
            assert_eq!(
                admit_known(Some(state), Delivery::Each),
                Admission::Interrupted(state)
            );
        }
    }

    #[test]
    fn a_pty_text_never_entered_is_typed_into_the_new_agent() {
        assert_eq!(
            replayed(Typed::Started, false, None, || unreachable!()),
            Replayed::TypeAgain
        );
    }

    #[test]
    fn a_pty_text_entered_before_the_wrapper_stopped_is_reported_failed() {
        assert_eq!(
            replayed(Typed::Entered, false, None, || unreachable!()),
            Replayed::Unknown
        );
    }

    #[test]
    fn a_tmux_text_the_history_shows_is_given_with_its_missing_enter() {
        assert_eq!(
            replayed(Typed::Started, true, Some(true), || true),
            Replayed::Given { press_enter: true }
        );
        assert_eq!(
            replayed(Typed::Entered, true, Some(true), || false),
            Replayed::Given { press_enter: false }
        );
    }

    #[test]
    fn a_tmux_text_the_history_does_not_show_is_typed_again() {
        assert_eq!(
            replayed(Typed::Entered, true, Some(false), || unreachable!()),
            Replayed::TypeAgain
        );
    }

    #[test]
    fn a_tmux_history_that_cannot_be_read_counts_as_showing_the_text() {
        assert_eq!(
            replayed(Typed::Started, true, None, || false),
            Replayed::Given { press_enter: false }
        );
    }
}
