//! The live event feed **(ext)**: what happens in the relay as it happens, for watchers (the
//! web dashboard and `agent-relay watch`). A tool asks for it with `QUERY {what:"watch"}` and
//! then receives one `RESULT {what:"event", event}` per event, all carrying the query's id, until
//! it disconnects. Events are a view, never a record: a watcher that falls behind is told how
//! many it missed (`lagged`) rather than slowing the relay down.

use std::collections::{HashSet, VecDeque};

use serde::{Deserialize, Serialize};

use crate::{DeliveryStatus, Kind};

/// Longest body excerpt an [`RelayEvent::Accepted`] carries, in characters.
pub const EXCERPT_CHARS: usize = 200;

/// One thing that happened in the relay. `ts` is the daemon's Unix time in milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RelayEvent {
    /// An agent completed its handshake.
    AgentConnected {
        /// When.
        ts: u64,
        /// Its name.
        agent: String,
        /// The CLI it said it was.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cli: Option<String>,
        /// It took over a lingering session with its resume token.
        resumed: bool,
    },
    /// An agent's connection ended.
    AgentDisconnected {
        /// When.
        ts: u64,
        /// Its name.
        agent: String,
    },
    /// A wrapped agent's terminal changed, as its wrapper sees it (idle, busy, blocked).
    AgentState {
        /// When the daemon heard it.
        ts: u64,
        /// Its name.
        agent: String,
        /// `pty` or `tmux`.
        backend: String,
        /// The new state.
        state: crate::TerminalState,
        /// Why, when known (a busy marker, a dialog, a person's line...).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        why: Option<String>,
    },
    /// A message was stored (and is being delivered to those of its recipients online).
    Accepted {
        /// When it was stored.
        ts: u64,
        /// Message id.
        id: String,
        /// Store position.
        pos: i64,
        /// Sender.
        from: String,
        /// Recipient name or `*`.
        to: String,
        /// Topic, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        topic: Option<String>,
        /// Kind.
        kind: Kind,
        /// Thread id, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        thread: Option<String>,
        /// The first [`EXCERPT_CHARS`] characters of the body.
        body: String,
        /// Whether the body was cut.
        truncated: bool,
        /// Who gets a copy.
        recipients: Vec<String>,
    },
    /// A SEND (or SUBSCRIBE) was refused with a NACK.
    Refused {
        /// When.
        ts: u64,
        /// The refused envelope's id.
        id: String,
        /// Who sent it.
        from: String,
        /// The NACK code (`unknown_target`, `too_large`, `invalid`, ...).
        code: String,
        /// The NACK's reason.
        reason: String,
    },
    /// A DELIVER was queued for a recipient's connection.
    Delivered {
        /// When.
        ts: u64,
        /// Message id.
        id: String,
        /// Store position.
        pos: i64,
        /// Recipient.
        recipient: String,
        /// Seq in the recipient's stream.
        seq: u64,
        /// Attempt number (1 unless an earlier session was handed it).
        attempt: u32,
    },
    /// A recipient acknowledged a delivery (`acked`: typed in; `verified`; `failed`).
    Acked {
        /// When.
        ts: u64,
        /// Message id.
        id: String,
        /// Store position.
        pos: i64,
        /// Recipient.
        recipient: String,
        /// The delivery's new state.
        state: DeliveryStatus,
    },
    /// Deliveries waiting for offline recipients ran out of time (inbox TTL).
    Expired {
        /// When.
        ts: u64,
        /// How many deliveries expired.
        deliveries: u64,
    },
    /// This watcher fell behind and missed this many events.
    Lagged {
        /// Events missed.
        missed: u64,
    },
}

impl RelayEvent {
    /// The message this event is about, if any.
    pub fn message_id(&self) -> Option<&str> {
        match self {
            Self::Accepted { id, .. }
            | Self::Delivered { id, .. }
            | Self::Acked { id, .. }
            | Self::Refused { id, .. } => Some(id),
            _ => None,
        }
    }
}

/// The body excerpt for [`RelayEvent::Accepted`]: at most [`EXCERPT_CHARS`] characters, and
/// whether it was cut.
pub fn excerpt(body: &str) -> (String, bool) {
    excerpt_of(body, EXCERPT_CHARS)
}

/// At most `chars` characters of `text` (cut on a character boundary), and whether it was cut.
pub fn excerpt_of(text: &str, chars: usize) -> (String, bool) {
    match text.char_indices().nth(chars) {
        Some((at, _)) => (text[..at].to_owned(), true),
        None => (text.to_owned(), false),
    }
}

/// `QUERY {what:"watch", from?, to?, topic?}`: which events a watcher wants. Every field
/// narrows; none means everything.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct WatchFilter {
    /// Only messages from this sender (and this agent's connects and disconnects).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// Only messages to this recipient, broadcasts it gets included (and its connects and
    /// disconnects).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// Only messages whose topic matches this pattern (`build.*`, `build.>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
}

/// How many messages a [`Watch`] remembers to follow deliveries and acknowledgements of the
/// messages it let through.
const FOLLOWED: usize = 10_000;

/// Applies a [`WatchFilter`] to a stream of events. Delivery and acknowledgement events name
/// only the message and its recipient, so the messages that passed the filter are remembered
/// (the last [`FOLLOWED`]) and their later events pass too. They are remembered by store
/// position, not id: an id is unique only per sender, and another sender's message with the
/// same id must not pass.
#[derive(Debug, Default)]
pub struct Watch {
    filter: WatchFilter,
    followed: HashSet<i64>,
    order: VecDeque<i64>,
}

impl Watch {
    /// A watch applying `filter`.
    pub fn new(filter: WatchFilter) -> Self {
        Self {
            filter,
            ..Self::default()
        }
    }

    /// Whether `ev` is one the watcher asked for.
    pub fn admits(&mut self, ev: &RelayEvent) -> bool {
        let f = &self.filter;
        if f.from.is_none() && f.to.is_none() && f.topic.is_none() {
            return true;
        }
        match ev {
            RelayEvent::AgentConnected { agent, .. }
            | RelayEvent::AgentDisconnected { agent, .. }
            | RelayEvent::AgentState { agent, .. } => {
                f.topic.is_none()
                    && f.from.as_ref().is_none_or(|n| n == agent)
                    && f.to.as_ref().is_none_or(|n| n == agent)
            }
            RelayEvent::Accepted {
                pos,
                from,
                topic,
                recipients,
                ..
            } => {
                let ok = f.from.as_ref().is_none_or(|n| n == from)
                    && f.to.as_ref().is_none_or(|n| recipients.contains(n))
                    && f.topic.as_ref().is_none_or(|p| {
                        topic.as_deref().is_some_and(|t| crate::topic_matches(p, t))
                    });
                if ok {
                    self.follow(*pos);
                }
                ok
            }
            RelayEvent::Refused { from, .. } => {
                f.topic.is_none() && f.to.is_none() && f.from.as_ref().is_none_or(|n| n == from)
            }
            RelayEvent::Delivered { pos, recipient, .. }
            | RelayEvent::Acked { pos, recipient, .. } => {
                self.followed.contains(pos) && f.to.as_ref().is_none_or(|n| n == recipient)
            }
            RelayEvent::Expired { .. } | RelayEvent::Lagged { .. } => true,
        }
    }

    fn follow(&mut self, pos: i64) {
        if self.followed.insert(pos) {
            self.order.push_back(pos);
            if self.order.len() > FOLLOWED
                && let Some(old) = self.order.pop_front()
            {
                self.followed.remove(&old);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store position per id (distinct ids, distinct positions).
    fn pos_of(id: &str) -> i64 {
        id.bytes().fold(0, |h, b| h * 131 + i64::from(b))
    }

    fn accepted(id: &str, from: &str, recipients: &[&str], topic: Option<&str>) -> RelayEvent {
        RelayEvent::Accepted {
            ts: 1,
            id: id.into(),
            pos: pos_of(id),
            from: from.into(),
            to: if recipients.len() == 1 {
                recipients[0].into()
            } else {
                "*".into()
            },
            topic: topic.map(Into::into),
            kind: Kind::Message,
            thread: None,
            body: "hi".into(),
            truncated: false,
            recipients: recipients.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    fn acked(id: &str, recipient: &str) -> RelayEvent {
        RelayEvent::Acked {
            ts: 2,
            id: id.into(),
            pos: pos_of(id),
            recipient: recipient.into(),
            state: DeliveryStatus::Acked,
        }
    }

    #[test]
    fn no_filter_admits_everything() {
        let mut w = Watch::new(WatchFilter::default());
        assert!(w.admits(&acked("x", "Bob")));
        assert!(w.admits(&RelayEvent::Lagged { missed: 3 }));
    }

    #[test]
    fn from_filter_follows_the_messages_it_admitted() {
        let mut w = Watch::new(WatchFilter {
            from: Some("Alice".into()),
            ..WatchFilter::default()
        });
        assert!(w.admits(&accepted("m1", "Alice", &["Bob"], None)));
        assert!(!w.admits(&accepted("m2", "Carol", &["Bob"], None)));
        assert!(w.admits(&acked("m1", "Bob")));
        assert!(!w.admits(&acked("m2", "Bob")));
    }

    /// Ids are unique per sender only: Carol's message with the id of one of Alice's is a
    /// different message (another position), and its deliveries do not pass `--from Alice`.
    #[test]
    fn another_senders_message_with_the_same_id_is_not_followed() {
        let mut w = Watch::new(WatchFilter {
            from: Some("Alice".into()),
            ..WatchFilter::default()
        });
        assert!(w.admits(&accepted("same", "Alice", &["Bob"], None)));
        let carols = RelayEvent::Delivered {
            ts: 3,
            id: "same".into(),
            pos: pos_of("same") + 1,
            recipient: "Bob".into(),
            seq: 2,
            attempt: 1,
        };
        assert!(!w.admits(&carols));
    }

    #[test]
    fn to_filter_sees_broadcasts_and_only_its_own_deliveries() {
        let mut w = Watch::new(WatchFilter {
            to: Some("Bob".into()),
            ..WatchFilter::default()
        });
        assert!(w.admits(&accepted("b", "Alice", &["Bob", "Carol"], None)));
        assert!(w.admits(&acked("b", "Bob")));
        assert!(!w.admits(&acked("b", "Carol")));
        assert!(!w.admits(&accepted("c", "Alice", &["Carol"], None)));
    }

    #[test]
    fn topic_filter_uses_patterns() {
        let mut w = Watch::new(WatchFilter {
            topic: Some("build.>".into()),
            ..WatchFilter::default()
        });
        assert!(w.admits(&accepted("a", "A", &["B"], Some("build.linux.x86"))));
        assert!(!w.admits(&accepted("b", "A", &["B"], Some("test"))));
        assert!(!w.admits(&accepted("c", "A", &["B"], None)));
        assert!(!w.admits(&RelayEvent::AgentConnected {
            ts: 1,
            agent: "A".into(),
            cli: None,
            resumed: false
        }));
    }

    #[test]
    fn followed_ids_are_bounded() {
        let mut w = Watch::new(WatchFilter {
            from: Some("A".into()),
            ..WatchFilter::default()
        });
        for i in 0..FOLLOWED + 10 {
            assert!(w.admits(&accepted(&format!("m{i}"), "A", &["B"], None)));
        }
        assert_eq!(w.followed.len(), FOLLOWED);
        assert!(!w.admits(&acked("m0", "B")));
        assert!(w.admits(&acked(&format!("m{}", FOLLOWED + 9), "B")));
    }

    #[test]
    fn excerpt_cuts_on_characters() {
        let long: String = "é".repeat(EXCERPT_CHARS + 5);
        let (s, cut) = excerpt(&long);
        assert!(cut);
        assert_eq!(s.chars().count(), EXCERPT_CHARS);
        assert_eq!(excerpt("short"), ("short".into(), false));
        // Cut on a character boundary, at any length.
        assert_eq!(excerpt_of("héllo", 2), ("hé".into(), true));
        assert_eq!(excerpt_of("hé", 2), ("hé".into(), false));
    }

    #[test]
    fn events_round_trip_as_tagged_json() {
        let ev = acked("m", "Bob");
        let text = serde_json::to_string(&ev).unwrap();
        assert!(text.contains(r#""type":"acked""#), "{text}");
        assert_eq!(serde_json::from_str::<RelayEvent>(&text).unwrap(), ev);
    }
}
