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
//! typed messages. Nothing here blocks, allocates without a bound, or panics on input.

pub mod codec;
mod envelope;
pub mod events;
mod names;
pub mod query;

pub use codec::{FrameError, MAX_FRAME_BYTES, encode_frame, encode_with, frame_len};
pub use envelope::{
    Ack, AckStatus, Budget, Busy, Bye, Capabilities, DecodeError, Delivery, DeliveryState,
    Envelope, ErrorCode, ErrorPayload, Header, Hello, Kind, MessageType, Nack, NackCode,
    PROTOCOL_VERSION, Payload, Ping, Role, Send, ServerInfo, SubscribePayload, Welcome,
};
pub use names::{
    NameError, topic_matches, validate_agent_name, validate_topic, validate_topic_pattern,
};
