//! How the messages an agent is given are typed and acknowledged, one by one or several as one
//! prompt (`wrap --delivery`, see [`format::Delivery`]):
//!
//! - `each`: every message is its own prompt, acknowledged verified once its submission is
//!   seen.
//! - `digest`: messages that waited (the agent busy, a person typing) go in as one prompt, a
//!   header line and each message in its usual form ([`format::digest`]); the injector groups
//!   them ([`crate::inject::group_len`]): up to the body limit, urgent ones first and alone.
//!   Each message is still recorded (`injected.log`) and acknowledged on its own.
//! - `notice`: only a line naming the senders and ids is typed ([`format::notice`]); each
//!   message is acknowledged injected when it is submitted, and verified when the agent's MCP
//!   server (`agent-relay mcp`, through the wrapper's door) tells the wrapper that
//!   `relay_inbox` or `relay_read` showed it to the model.

use std::collections::HashSet;

use relay_client::Delivered;
use relay_protocol::DeliveryState;

use super::{Core, Item, TOOL_DOOR};
use crate::WrapConfig;
use crate::decide::ledger::{Record, Typed as Remembered};
use crate::format::{self, Delivery, Form};
use crate::inject::{Joiner, Outcome};

/// The text typed for `messages` (one, or several typed as one prompt).
fn text_of(
    delivery: Delivery,
    lines: bool,
    form: Form,
    max_body: usize,
    messages: &[Delivered],
    urgent: bool,
) -> String {
    if delivery == Delivery::Notice {
        let pairs: Vec<(&str, &str)> = messages
            .iter()
            .map(|m| (m.from.as_str(), m.id.as_str()))
            .collect();
        return form.apply(&format::notice(&pairs, urgent));
    }
    let mut texts: Vec<String> = messages
        .iter()
        .map(|m| {
            format::injected_text(
                &m.from,
                &m.id,
                m.payload.thread.as_deref(),
                &m.payload.body,
                max_body,
                lines,
            )
        })
        .collect();
    let text = if texts.len() == 1 {
        texts.remove(0)
    } else {
        format::digest(&texts, lines)
    };
    // Lines kept for a CLI that takes a multi-line paste as one prompt; a shell gets one
    // quoted line.
    if lines { text } else { form.apply(&text) }
}

/// Lines kept: a CLI that takes a multi-line paste as one prompt, and not a shell.
fn lines(cfg: &WrapConfig, form: Form) -> bool {
    cfg.profile.multiline && form == Form::Plain
}

/// How waiting messages are joined for `cfg`'s delivery, if they are.
pub(super) fn joiner(cfg: &WrapConfig, form: Form) -> Option<Joiner<Item>> {
    let delivery = cfg.delivery;
    let (lines, max_body) = (lines(cfg, form), cfg.max_body);
    let max_chars = match delivery {
        Delivery::Each => return None,
        // A digest is typed whole: over the body limit it splits.
        Delivery::Digest => max_body,
        // A notice is one short line whatever it names.
        Delivery::Notice => usize::MAX,
    };
    Some(Joiner {
        max_chars,
        joinable: Box::new(|item| matches!(item, Item::Messages(_))),
        join: Box::new(move |group| {
            let messages: Vec<Delivered> = group
                .into_iter()
                .flat_map(|(_, item)| match item {
                    Item::Messages(m) => m,
                    Item::Notice => Vec::new(),
                })
                .collect();
            let text = text_of(delivery, lines, form, max_body, &messages, false);
            (text, Item::Messages(messages))
        }),
    })
}

impl Core {
    /// The text typed for `messages` in this agent's delivery and form.
    pub(super) fn text_for(&self, messages: &[Delivered], urgent: bool) -> String {
        text_of(
            self.cfg.delivery,
            lines(&self.cfg, self.form),
            self.form,
            self.cfg.max_body,
            messages,
            urgent,
        )
    }

    /// The injector is about to type `text`: each message in it is recorded first, so that a
    /// restarted wrapper does not type it again.
    pub(super) fn typing(&mut self, text: &str) {
        let Some(Item::Messages(messages)) = self.injector.current() else {
            return;
        };
        if messages.len() > 1 {
            let ids: Vec<&str> = messages.iter().map(|m| m.id.as_str()).collect();
            tracing::debug!(?ids, delivery = ?self.cfg.delivery, "typing several messages as one prompt");
        }
        let mut records = Vec::with_capacity(messages.len());
        for (i, m) in messages.iter().enumerate() {
            // The stages between delivery and verification, for latency figures
            // (`claude_relay_latency_in_parts` reads them from the log).
            tracing::debug!(id = %m.id, "typing a message");
            // The text once (tmux notes its echo after a restart), with the first id.
            let at = match (&self.resume, i) {
                (Some(r), 0) => Some((r.offset(), text.to_owned())),
                _ => None,
            };
            records.push(Record::Started {
                id: m.id.clone(),
                at,
            });
        }
        // What the agent prints next answers the message typed last (after a digest, the one
        // from whom it goes to: see `decide/chain.rs`).
        self.chain.typed(messages);
        for r in records {
            self.record(r);
        }
    }

    /// The injector is about to press Enter for the text typed.
    pub(super) fn entering(&mut self) {
        let Some(Item::Messages(messages)) = self.injector.current() else {
            return;
        };
        let mut records = Vec::with_capacity(messages.len());
        for m in messages {
            tracing::debug!(id = %m.id, "pressing Enter");
            // Recorded before the Enter is written: until then the text is only in the agent's
            // input line, and a PTY agent killed with its wrapper never took it (a restarted
            // wrapper types it again); from here on it may have (a restarted wrapper does not).
            if self.ledger.get(&m.id) == Some(Remembered::Started) {
                records.push(Record::Entered { id: m.id.clone() });
            }
        }
        for r in records {
            self.record(r);
        }
    }

    /// Typing `messages` (as one prompt) ended with `outcome`: each is recorded and
    /// acknowledged on its own. A notice submitted leaves its messages injected, waiting for
    /// the agent's tool to show them.
    pub(super) fn finished(&mut self, messages: Vec<Delivered>, outcome: Outcome) {
        let verified = outcome == Outcome::Verified;
        for m in messages {
            if self.noticed.take_taken_early(&m.id) {
                // The agent's tool took it while its notice was typed: recorded and
                // acknowledged then.
                self.queued.remove(&m.id);
                continue;
            }
            if let Outcome::Failed(why) = &outcome {
                tracing::warn!(id = %m.id, %why, "a message was typed but not submitted");
            }
            self.record_outcome(&m.id, verified);
            self.queued.remove(&m.id);
            let state = if self.noticed.take_read_early(&m.id) {
                // The agent's tool showed it while its notice was typed.
                DeliveryState::Verified
            } else if let Outcome::Failed(why) = &outcome {
                self.fail(
                    &m,
                    &format!("typed into the agent but not submitted: {why}"),
                );
                continue;
            } else if self.cfg.delivery == Delivery::Notice {
                tracing::debug!(id = %m.id, "notice submitted: the message waits for the agent's tool");
                self.ack(&m, DeliveryState::Injected);
                self.noticed.noticed(m);
                continue;
            } else {
                DeliveryState::Verified
            };
            self.ack(&m, state);
        }
    }

    /// Notice delivery: the agent's MCP server showed the model the messages `ids`
    /// (`relay_inbox`, `relay_read`): each this wrapper gave a notice for is verified, and one
    /// whose notice is still waiting needs none any more. Returns how many were verified
    /// here. Other deliveries type the whole text, so a tool's read changes nothing.
    pub(crate) fn shown_by_tool(&mut self, ids: &[String]) -> usize {
        if self.cfg.delivery != Delivery::Notice {
            return 0;
        }
        let mut n = 0;
        for id in ids {
            if let Some(m) = self.noticed.take_noticed(id) {
                tracing::debug!(id = %m.id, "the agent's tool showed it: verified");
                self.ack_door(&m, TOOL_DOOR);
                n += 1;
            }
        }
        let wanted: HashSet<&str> = ids.iter().map(String::as_str).collect();
        let shown = |item: &Item| match item {
            Item::Messages(ms) => ms.iter().all(|m| wanted.contains(m.id.as_str())),
            Item::Notice => false,
        };
        for item in self.injector.remove_queued(shown) {
            let Item::Messages(messages) = item else {
                continue;
            };
            for m in messages {
                tracing::debug!(id = %m.id, "the agent's tool showed it before its notice was typed: verified, no notice");
                self.record_outcome(&m.id, true);
                self.queued.remove(&m.id);
                self.ack_door(&m, TOOL_DOOR);
                n += 1;
            }
        }
        let mut current = HashSet::new();
        if let Some(Item::Messages(ms)) = self.injector.current() {
            for m in ms {
                if wanted.contains(m.id.as_str()) {
                    self.noticed.read_while_typed(&m.id);
                    current.insert(m.id.as_str());
                }
            }
        }
        // Shown before this wrapper was handed it (the tool reads the store): no notice
        // when it comes. Ids it already dealt with are not kept; nor more than a few.
        let ledger = &self.ledger;
        self.noticed.shown_before_delivery(
            ids.iter().filter(|id| !current.contains(id.as_str())),
            |id| ledger.get(id).is_some(),
        );
        n
    }

    /// `relay_inbox` in the agent's own session asks for what waits for it (issue 23, one
    /// record whatever the door): at most `limit` of the messages this wrapper holds and has
    /// not typed, oldest first (those whose notice was typed, then those waiting to be typed).
    /// Each is handed over here: recorded in `injected.log` as done (never typed after) and
    /// acknowledged verified by the tool's door, before the tool shows it. What is being typed
    /// now is the typing door's, except a notice's message (the notice only points at it).
    /// Returns them and how many more wait here.
    pub(crate) fn take_for_tool(&mut self, limit: usize) -> (Vec<Delivered>, usize) {
        let mut noticed: Vec<Delivered> = self.noticed.drain_noticed();
        noticed.sort_by(|a, b| (a.ts, &a.id).cmp(&(b.ts, &b.id)));
        let mut taken: Vec<Delivered> = Vec::new();
        let mut more = 0;
        for m in noticed {
            if taken.len() < limit {
                taken.push(m);
            } else {
                more += 1;
                self.noticed.noticed(m);
            }
        }
        let noticed = taken.len();
        // Under notice delivery, the message whose notice is being typed now is the tool's
        // too: the model may call `relay_inbox` as soon as it reads the notice, before the
        // wrapper's check of the Enter has made the message "noticed". It is handed over here
        // (and the notice's end then acknowledges nothing more); other deliveries type the
        // message itself, which stays the typing door's.
        if self.cfg.delivery == Delivery::Notice
            && let Some(Item::Messages(ms)) = self.injector.current()
        {
            for m in ms {
                if taken.len() < limit {
                    self.noticed.taken_while_typed(&m.id);
                    taken.push(m.clone());
                } else {
                    more += 1;
                }
            }
        }
        let room = limit - taken.len();
        let mut n = 0;
        let queued = self.injector.take_queued(|_, item| match item {
            // A queued entry holds one message (digests are joined when typed).
            Item::Messages(_) if n < room => {
                n += 1;
                true
            }
            Item::Messages(_) => {
                more += 1;
                false
            }
            Item::Notice => false,
        });
        for (_, item) in queued {
            if let Item::Messages(ms) = item {
                taken.extend(ms);
            }
        }
        for (i, m) in taken.iter().enumerate() {
            // Recorded before it is handed over, as a message shown before (or while) its
            // notice: never typed after. (A noticed one's outcome is in the log already.)
            if i >= noticed {
                self.record_outcome(&m.id, true);
            }
            self.queued.remove(&m.id);
            tracing::debug!(id = %m.id, "handed to the agent's tool (relay_inbox) instead of typing");
            self.ack_door(m, TOOL_DOOR);
        }
        (taken, more)
    }

    /// Notice delivery: whether `m` was shown by the agent's tool before it got here; if so it
    /// is recorded and acknowledged verified, with no notice typed.
    pub(super) fn shown_already(&mut self, m: &Delivered) -> bool {
        if !self.noticed.take_shown_unseen(&m.id) {
            return false;
        }
        tracing::debug!(id = %m.id, "the agent's tool showed it before it was delivered here: verified, no notice");
        self.record_outcome(&m.id, true);
        self.ack_door(m, TOOL_DOOR);
        true
    }
}
