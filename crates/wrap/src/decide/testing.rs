//! What the decision modules' unit tests share.

use relay_client::Delivered;
use relay_protocol::{Kind, Send};

/// A message `id` from `from` to Alice, saying "hi", in `thread`.
pub(crate) fn message(id: &str, from: &str, thread: Option<&str>) -> Delivered {
    Delivered {
        id: id.to_owned(),
        from: from.to_owned(),
        to: "Alice".to_owned(),
        topic: None,
        ts: 0,
        seq: 1,
        attempt: 1,
        payload: Send {
            kind: Kind::Message,
            body: "hi".to_owned(),
            data: None,
            thread: thread.map(str::to_owned),
            in_reply_to: None,
            budget: None,
            urgent: false,
        },
    }
}
