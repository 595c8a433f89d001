//! Admission of a delivered message against what this terminal was already given: the relay
//! delivers a message again after a reconnect or a wrapper's restart, and `injected.log` (the
//! replay ledger, [`crate::state::InjectedLog`]) says how far it got before. A message is
//! never typed twice: one the ledger knows is acknowledged with what is known of it, and only
//! one that never reached the agent is typed (again).
//!
//! Pure: the shell reads the ledger and the terminal and passes what it read.

use relay_protocol::DeliveryState;

use crate::format::Delivery;
use crate::state::Typed;

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
