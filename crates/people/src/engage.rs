//! Which agent a person's chat message is for (pure), after seed 004's engage modes:
//!
//! - a reply to a message the bot relayed answers the agent that sent it (threaded to it);
//! - `@Name text` (a mention) reaches agent `Name`, in every mode;
//! - otherwise the chat's engage mode decides: `mention` drops it; `mention-sticky` sends it to
//!   the agent this chat last talked with (a mention or a relayed message starts that session);
//!   `pattern` sends it to the configured agent when the text matches the pattern (`.` always).
//!
//! A message that engages no agent is dropped, or, with the `accumulate` policy, kept (bounded)
//! and handed over as context with the chat's next message that does.
//!
//! Sender scope comes first: `known` lets only declared people through; `all` also lets any
//! member of a configured group chat through, speaking as the person that chat belongs to.

use std::collections::HashMap;

use serde::Deserialize;

/// How a message that names no agent is treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EngageMode {
    /// Matching the pattern engages the configured agent.
    Pattern,
    /// Only a mention (or a reply) reaches an agent.
    #[default]
    Mention,
    /// A mention, or the agent the chat last talked with.
    MentionSticky,
}

/// Whose messages are relayed at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SenderScope {
    /// Only the Telegram user ids of declared people.
    #[default]
    Known,
    /// Anyone in a configured group chat (the chat's person speaks for them).
    All,
}

/// The engage rules of one bot.
#[derive(Debug, Clone)]
pub struct Rules {
    /// The mode.
    pub mode: EngageMode,
    /// With [`EngageMode::Pattern`]: the pattern and the agent it engages.
    pub pattern: Option<(regex::Regex, String)>,
    /// The sender scope.
    pub senders: SenderScope,
    /// What becomes of a message that engages no agent.
    pub ignored: IgnoredPolicy,
}

/// What becomes of a chat message that engages no agent (seed 004's ignored-message policy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum IgnoredPolicy {
    /// Dropped.
    #[default]
    Drop,
    /// Kept (the last [`ACCUMULATED`] per chat) and handed, as context before its text, to
    /// the next message from that chat that engages an agent.
    Accumulate,
}

/// Unaddressed messages kept per chat under [`IgnoredPolicy::Accumulate`].
pub const ACCUMULATED: usize = 20;

/// Characters kept of each accumulated message.
const ACCUMULATED_CHARS: usize = 500;

/// A chat message, as far as routing cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incoming<'a> {
    /// Telegram user id of the sender.
    pub user: i64,
    /// The chat it was written in.
    pub chat: i64,
    /// Its text.
    pub text: &'a str,
    /// The relayed message it replies to, if it replies to one the bot sent: (agent, id,
    /// thread); the id and thread are unknown for a message relayed before a restart.
    pub reply_to: Option<(&'a str, Option<&'a str>, Option<&'a str>)>,
}

/// What to do with a chat message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Send as `person` to `to`.
    Send {
        /// The person it is from.
        person: String,
        /// The agent.
        to: String,
        /// The body.
        body: String,
        /// The relayed message it answers.
        in_reply_to: Option<String>,
        /// Its thread.
        thread: Option<String>,
    },
    /// Refused: the sender may not reach agents (nothing is stored).
    Refuse(String),
    /// Not for any agent under the chat's engage mode (dropped).
    Ignore,
}

/// The routing state of one bot: who is who, and each chat's sticky agent.
#[derive(Debug, Clone)]
pub struct Router {
    rules: Rules,
    /// Telegram user id → person name.
    people: HashMap<i64, String>,
    /// Group chat id → the person who speaks for its members (scope `all`).
    groups: HashMap<i64, String>,
    sticky: HashMap<i64, String>,
    /// Chat → unaddressed messages kept (accumulate policy).
    kept: HashMap<i64, std::collections::VecDeque<String>>,
}

impl Router {
    /// Rules, declared people (user id, name) and group chats (chat id, person).
    pub fn new(rules: Rules, people: HashMap<i64, String>, groups: HashMap<i64, String>) -> Self {
        Self {
            rules,
            people,
            groups,
            sticky: HashMap::new(),
            kept: HashMap::new(),
        }
    }

    /// The person a Telegram user id belongs to.
    pub fn person(&self, user: i64) -> Option<&str> {
        self.people.get(&user).map(String::as_str)
    }

    /// Notes that `agent` wrote into `chat` (a relayed message): the sticky session.
    pub fn note_relayed(&mut self, chat: i64, agent: &str) {
        self.sticky.insert(chat, agent.to_owned());
    }

    /// Decides where `m` goes.
    pub fn decide(&mut self, m: &Incoming<'_>) -> Decision {
        let person = match (self.people.get(&m.user), self.rules.senders) {
            (Some(p), _) => p.clone(),
            (None, SenderScope::All) => match self.groups.get(&m.chat) {
                Some(p) => p.clone(),
                None => {
                    return Decision::Refuse(format!(
                        "Telegram user {} is not a declared person",
                        m.user
                    ));
                }
            },
            (None, SenderScope::Known) => {
                return Decision::Refuse(format!(
                    "Telegram user {} is not a declared person",
                    m.user
                ));
            }
        };
        let text = m.text.trim();
        let (to, body, in_reply_to, thread) = if let Some((agent, id, thread)) = m.reply_to {
            (
                Some(agent.to_owned()),
                text,
                id.map(str::to_owned),
                thread.map(str::to_owned),
            )
        } else if let Some((agent, rest)) = mention(text) {
            (Some(agent.to_owned()), rest, None, None)
        } else {
            (self.engaged(m.chat, text), text, None, None)
        };
        let Some(to) = to else {
            if self.rules.ignored == IgnoredPolicy::Accumulate {
                let kept = self.kept.entry(m.chat).or_default();
                if kept.len() == ACCUMULATED {
                    kept.pop_front();
                }
                kept.push_back(text.chars().take(ACCUMULATED_CHARS).collect());
            }
            return Decision::Ignore;
        };
        self.sticky.insert(m.chat, to.clone());
        let body = match self.kept.remove(&m.chat) {
            Some(kept) if !kept.is_empty() => {
                let lines: Vec<String> = kept.into_iter().map(|k| format!("- {k}")).collect();
                format!(
                    "(earlier in this chat, addressed to no agent:\n{})\n{body}",
                    lines.join("\n")
                )
            }
            _ => body.to_owned(),
        };
        Decision::Send {
            person,
            to,
            body,
            in_reply_to,
            thread,
        }
    }

    /// The agent a message naming none engages under the chat's engage mode.
    fn engaged(&self, chat: i64, text: &str) -> Option<String> {
        match self.rules.mode {
            EngageMode::Mention => None,
            EngageMode::MentionSticky => self.sticky.get(&chat).cloned(),
            EngageMode::Pattern => self
                .rules
                .pattern
                .as_ref()
                .filter(|(re, _)| re.is_match(text))
                .map(|(_, agent)| agent.clone()),
        }
    }
}

/// The agent a message the bot relayed came from, read from its text (`Alice [5DZ82MJ3]: ...`,
/// the form [`crate::Hub`] sends): for a reply to a message relayed before the daemon restarted,
/// whose id the bot no longer remembers.
pub fn relayed_from(text: &str) -> Option<&str> {
    let (name, rest) = text.split_once(" [")?;
    rest.split_once("]: ")?;
    relay_protocol::validate_agent_name(name).ok()?;
    (name != "relay").then_some(name)
}

/// `@Name rest` → (`Name`, `rest`) when `Name` is a valid agent name. A bot mention such as
/// `@my_bot` is not an agent name only when it is not valid; agents named like the bot should
/// not exist.
pub fn mention(text: &str) -> Option<(&str, &str)> {
    let rest = text.strip_prefix('@')?;
    let end = rest
        .find(|c: char| c.is_whitespace() || c == ':' || c == ',')
        .unwrap_or(rest.len());
    let name = &rest[..end];
    relay_protocol::validate_agent_name(name).ok()?;
    let body = rest[end..].trim_start_matches([':', ',']).trim();
    Some((name, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router(mode: EngageMode, senders: SenderScope) -> Router {
        let pattern = Some((regex::Regex::new("(?i)deploy").unwrap(), "Ops".to_owned()));
        Router::new(
            Rules {
                mode,
                pattern,
                senders,
                ignored: IgnoredPolicy::Drop,
            },
            HashMap::from([(7, "human".to_owned())]),
            HashMap::from([(-100, "team".to_owned())]),
        )
    }

    fn msg(user: i64, chat: i64, text: &str) -> Incoming<'_> {
        Incoming {
            user,
            chat,
            text,
            reply_to: None,
        }
    }

    fn to(d: &Decision) -> Option<&str> {
        match d {
            Decision::Send { to, .. } => Some(to),
            _ => None,
        }
    }

    #[test]
    fn a_mention_reaches_the_agent_in_every_mode() {
        for mode in [
            EngageMode::Mention,
            EngageMode::MentionSticky,
            EngageMode::Pattern,
        ] {
            let mut r = router(mode, SenderScope::Known);
            let d = r.decide(&msg(7, -100, "@Alice: please rebase"));
            assert_eq!(
                d,
                Decision::Send {
                    person: "human".into(),
                    to: "Alice".into(),
                    body: "please rebase".into(),
                    in_reply_to: None,
                    thread: None
                }
            );
        }
    }

    #[test]
    fn a_reply_answers_the_agent_that_sent_the_relayed_message() {
        let mut r = router(EngageMode::Mention, SenderScope::Known);
        let mut m = msg(7, 7, "yes, go ahead");
        m.reply_to = Some(("Alice", Some("01ABC"), Some("T1")));
        assert_eq!(
            r.decide(&m),
            Decision::Send {
                person: "human".into(),
                to: "Alice".into(),
                body: "yes, go ahead".into(),
                in_reply_to: Some("01ABC".into()),
                thread: Some("T1".into())
            }
        );
    }

    #[test]
    fn engage_modes_decide_unaddressed_messages() {
        let mut r = router(EngageMode::Mention, SenderScope::Known);
        r.decide(&msg(7, 7, "@Alice hi"));
        assert_eq!(r.decide(&msg(7, 7, "and then?")), Decision::Ignore);

        let mut r = router(EngageMode::MentionSticky, SenderScope::Known);
        assert_eq!(r.decide(&msg(7, 7, "anyone?")), Decision::Ignore);
        r.decide(&msg(7, 7, "@Alice hi"));
        assert_eq!(to(&r.decide(&msg(7, 7, "and then?"))), Some("Alice"));
        r.note_relayed(7, "Bob");
        assert_eq!(to(&r.decide(&msg(7, 7, "you?"))), Some("Bob"));

        let mut r = router(EngageMode::Pattern, SenderScope::Known);
        assert_eq!(to(&r.decide(&msg(7, 7, "please Deploy now"))), Some("Ops"));
        assert_eq!(r.decide(&msg(7, 7, "hello")), Decision::Ignore);
    }

    #[test]
    fn accumulated_messages_go_with_the_next_engaging_one() {
        let mut r = router(EngageMode::Mention, SenderScope::Known);
        r.rules.ignored = IgnoredPolicy::Accumulate;
        assert_eq!(r.decide(&msg(7, 7, "the build is red")), Decision::Ignore);
        assert_eq!(r.decide(&msg(7, 7, "since 10:00")), Decision::Ignore);
        let Decision::Send { body, to, .. } = r.decide(&msg(7, 7, "@Bob can you look?")) else {
            panic!("not sent");
        };
        assert_eq!(to, "Bob");
        assert_eq!(
            body,
            "(earlier in this chat, addressed to no agent:\n- the build is red\n- since 10:00)\ncan you look?"
        );
        let Decision::Send { body, .. } = r.decide(&msg(7, 7, "@Bob thanks")) else {
            panic!("not sent");
        };
        assert_eq!(body, "thanks", "handed over once");
        for i in 0..30 {
            r.decide(&msg(7, 7, &format!("chatter {i}")));
        }
        let Decision::Send { body, .. } = r.decide(&msg(7, 7, "@Bob x")) else {
            panic!("not sent");
        };
        assert_eq!(body.lines().count(), ACCUMULATED + 2, "bounded");
    }

    #[test]
    fn sender_scope_refuses_unknown_users() {
        let mut r = router(EngageMode::Mention, SenderScope::Known);
        assert!(matches!(
            r.decide(&msg(99, -100, "@Alice hi")),
            Decision::Refuse(_)
        ));
        let mut r = router(EngageMode::Mention, SenderScope::All);
        assert!(matches!(
            r.decide(&msg(99, 99, "@Alice hi")),
            Decision::Refuse(_)
        ));
        let d = r.decide(&msg(99, -100, "@Alice hi"));
        assert!(
            matches!(&d, Decision::Send { person, .. } if person == "team"),
            "{d:?}"
        );
    }

    #[test]
    fn the_sender_of_a_relayed_message_is_read_from_its_text() {
        assert_eq!(relayed_from("Alice [5DZ82MJ3]: may I?"), Some("Alice"));
        assert_eq!(relayed_from("relay: Dora has been blocked"), None);
        assert_eq!(relayed_from("just text [x]: y"), None);
    }

    #[test]
    fn mentions_need_a_valid_agent_name() {
        assert_eq!(mention("@Alice, look"), Some(("Alice", "look")));
        assert_eq!(mention("@Al\u{1b}ce hi"), None);
        assert_eq!(mention("hi @Alice"), None);
    }
}
