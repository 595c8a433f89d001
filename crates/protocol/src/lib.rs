//! The agent-relay wire protocol, version 1.
//!
//! A connection carries *frames*: a `u32` big-endian length followed by that many bytes of UTF-8
//! JSON, at most [`MAX_FRAME_BYTES`]. Each frame holds one [`Envelope`]
//! `{v, type, id, ts, from?, to?, topic?, delivery?, payload}`. The thirteen v1 message types are
//! in [`MessageType`]; our extensions are optional fields (so v1 peers ignore them) plus the
//! `QUERY`/`RESULT` pair used by the command-line tools. `docs/PROTOCOL.md` is the prose
//! specification; this crate is its executable form.
//!
//! The crate is sans-IO: [`codec`] turns bytes into frames and back, [`Envelope`] turns frames into
//! typed messages. Nothing here blocks, allocates without a bound, or panics on input. The two
//! exceptions are the small helpers every crate shares so that each exists once: the wall
//! [`clock`] and [`file::write_atomic`].

pub mod claims;
pub mod clock;
pub mod codec;
mod envelope;
pub mod events;
pub mod file;
mod names;
pub mod parts;
pub mod query;
mod status;
pub mod text;

pub use clock::{now_instant, now_ms};
pub use codec::{FrameError, MAX_FRAME_BYTES, encode_frame, encode_with, frame_len};
pub use envelope::{
    Ack, AckStatus, Budget, Busy, Bye, Capabilities, DecodeError, Delivery, DeliveryState,
    Envelope, ErrorCode, ErrorPayload, Header, Hello, Kind, MAX_JSON_DEPTH, MessageType, Nack,
    NackCode, PROTOCOL_VERSION, Payload, Ping, Role, Send, ServerInfo, SubscribePayload,
    TerminalReport, TerminalState, Welcome,
};
pub use names::{
    MAX_NAME_LEN, NameError, topic_matches, validate_agent_name, validate_topic,
    validate_topic_pattern,
};
pub use status::DeliveryStatus;
pub use text::{IdError, MAX_MESSAGE_ID_BYTES, validate_message_id};

/// The `cli` a person's connection gives in HELLO (`relay-people`: a person reached through
/// adapters). A tool may send as a connected person (the person at the terminal is that same
/// person), never as a connected agent.
pub const PERSON_CLI: &str = "person";

/// The `cli` the HELLO of a Claude Code hook gives when it holds an unwrapped agent's name for a
/// moment (`agent-relay hooks`): its BYE is the hook ending, not the agent leaving (the agent's
/// claims stay).
pub const HOOK_CLI: &str = "claude-hook";

/// The person at the terminal: the name `agent-relay send` signs with by default, and a
/// mailbox that can always be addressed.
pub const HUMAN: &str = "human";

/// Characters in a [`short_id`].
pub const SHORT_ID_LEN: usize = 8;

/// The short form of a message id that people and agents see (`Relay message from Alice
/// [6Q3XAB2M]: ...`, notices, `history`, `watch`): its last [`SHORT_ID_LEN`] characters. For a
/// ULID those are 40 of its 80 random bits; its first characters are the time, the same for
/// every message sent within about a second (and, for ids a tmux wrapper derives from its
/// checkpoint, for all of them). `read`, `trace` and `dlq` accept a short id. An id of at most
/// [`SHORT_ID_LEN`] characters is its own short id.
#[must_use]
pub fn short_id(id: &str) -> &str {
    match id.char_indices().rev().nth(SHORT_ID_LEN - 1) {
        Some((at, _)) => &id[at..],
        None => id,
    }
}

/// Whether the query `q` has the length of a [`short_id`] (so a lookup by id also tries the
/// ids' ends).
#[must_use]
pub fn is_short_id_len(q: &str) -> bool {
    q.chars().count() == SHORT_ID_LEN
}

#[cfg(test)]
mod tests {
    use super::short_id;

    /// `query` carries `events` (a watch filter, a feed event); `events` must not import
    /// `query` back, or the two modules can only be read, and changed, together.
    #[test]
    fn events_does_not_import_query() {
        let events = include_str!("events.rs");
        assert!(!events.contains("query::"), "events.rs names crate::query");
    }

    #[test]
    fn short_id_is_the_last_eight_characters() {
        assert_eq!(short_id("01M80TF75ZPNAE1B5DZ82MJ3M2"), "Z82MJ3M2");
        assert_eq!(short_id("12345678"), "12345678");
        assert_eq!(short_id("m-1"), "m-1");
        assert_eq!(short_id(""), "");
        // Characters, not bytes: the same as SQLite's substr(id, -8) on the stored id.
        assert_eq!(short_id("éééééééééé"), "éééééééé");
    }
}
