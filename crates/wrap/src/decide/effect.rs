//! What the decision core asks the shell to do, as data: the shell (`Shell::serve` in `shell.rs`)
//! carries each out in order, and owns every `.await` it takes.

use relay_client::{Delivered, Outgoing};
use relay_protocol::DeliveryState;

use crate::decide::ledger::Record;
use crate::state::Checkpoint;

/// One thing for the shell to do.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Effect {
    /// Relay a directive the agent printed to `to`; its receipt comes back to the core
    /// ([`crate::Core::on_receipt`]) whatever it says (a refusal also as a notice).
    Relay {
        /// The message.
        msg: Outgoing,
        /// Who it goes to, as the agent wrote it (`*`: everyone), for the log and a notice.
        to: String,
    },
    /// Append a step of a message to the replay ledger's file (`injected.log`), before the
    /// effects after it are carried out: the core records a message typed before its text is
    /// typed, entered before its Enter, and its outcome before its acknowledgement (see
    /// `decide/ledger.rs`). A record that cannot be written is logged with what that means
    /// ([`Record::if_lost`]); the core's ledger in memory has it all the same.
    Record(Record),
    /// Acknowledge a delivered message with its outcome.
    Ack(Delivered, DeliveryState),
    /// Acknowledge a delivered message verified because a door showed it to the model whole
    /// (a hook's answer, the agent's own tool), named in its trace.
    AckShown(Delivered, &'static str),
    /// Report a delivered message failed, saying why (the dead letter's reason).
    Fail(Delivered, String),
    /// Append a delivered message to the inbox file.
    AppendInbox(Delivered),
    /// Type this text into the agent's input line (no Enter).
    Type(String),
    /// Press Enter for the text typed.
    Enter,
    /// Press the Enter a stopped wrapper did not for this message, whose text waits in the
    /// input line, then tell the core ([`crate::Core::replayed_given`]); a failure to press
    /// it is only logged (a person can still submit the text).
    EnterReplayed(Delivered),
    /// Read a person's activity in the terminal for the reply chain just entered
    /// ([`crate::Core::chain_entered`]); nothing where the person's keys come through.
    NoteActivity,
    /// Read a person's activity in the terminal before the directives waiting for it go
    /// ([`crate::Core::person_activity`]).
    ReadActivity,
    /// Save the tmux checkpoint.
    SaveCheckpoint(Checkpoint),
    /// Tell the relay the terminal's state now, if it changed since it was last told
    /// ([`crate::Core::terminal_report`]): before acknowledgements that must not find it idle.
    ReportState,
    /// Subscribe the agent's connection to a topic pattern (a `[[RELAY]]` block
    /// `{"subscribe": PATTERN}`), and tell the agent how it went (a notice).
    Subscribe(String),
    /// A team verb (a `[[RELAY]]` block `{"spawn": ...}` or `{"release": ...}`): run
    /// `agent-relay spawn`/`release` as the agent (through its door) off the loop, and tell
    /// the agent how it went (a notice).
    Team(Box<relay_parse::TeamVerb>),
    /// Claim or release paths for the agent (a `[[RELAY]]` block `{"claim": ...}` or
    /// `{"unclaim": ...}`), and tell the agent how it went (a notice).
    Claim(Box<relay_parse::ClaimVerb>),
    /// Tell the command that started this wrapper how the start goes (a word on stdout).
    ReportStart(&'static str),
}
