//! Notices to people (pure; time is an argument): an agent blocked behind a dialog for longer
//! than a person's threshold, an agent's message to a person still unanswered, something
//! dead-lettered. Each becomes at most one short notice per subject and quiet period, and a
//! person gets at most [`Notifier::MAX_PER_MINUTE`] notices a minute (the rest are counted and
//! mentioned in the next one): a person is told, never flooded.

use std::collections::{BTreeMap, HashMap, VecDeque};

use serde::Deserialize;

/// What a person can be told about.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, serde::Serialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum NoticeKind {
    /// An agent blocked (a dialog, a permission prompt) for too long.
    Blocked,
    /// An agent's message to this person is waiting for an answer.
    Waiting,
    /// A message was dead-lettered.
    Dead,
    /// Agents' exchanges, for a person who watches them (`mirror = true`).
    Mirror,
}

/// One person's notice settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wants {
    /// The person.
    pub person: String,
    /// Which notices.
    pub kinds: Vec<NoticeKind>,
    /// Blocked longer than this (ms) is told.
    pub blocked_after_ms: u64,
    /// Unanswered longer than this (ms) is told.
    pub waiting_after_ms: u64,
    /// Told a one-line summary of each message between agents (batched).
    pub mirror: bool,
}

/// A notice to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// To whom.
    pub person: String,
    /// About what.
    pub kind: NoticeKind,
    /// The one-line text.
    pub text: String,
}

/// What the notifier hears (built by the shell from the relay's live feed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Heard {
    /// An agent's terminal state changed; `blocked` with why.
    AgentState {
        /// The agent.
        agent: String,
        /// Why it is blocked, or `None` when it is not blocked any more.
        blocked: Option<String>,
    },
    /// A message was stored from `from` to `to`.
    Message {
        /// Sender.
        from: String,
        /// Recipient.
        to: String,
        /// Its id.
        id: String,
        /// Its text's start, for a mirror line.
        preview: String,
    },
    /// A message was dead-lettered.
    Dead {
        /// Its id.
        id: String,
        /// Whose message.
        from: String,
        /// Why.
        why: String,
    },
    /// The agent went away (nothing it blocked on is waiting any more).
    Gone {
        /// The agent.
        agent: String,
    },
}

/// The notifier's state.
#[derive(Debug)]
pub struct Notifier {
    wants: Vec<Wants>,
    /// Agent → (blocked since, why, people told).
    blocked: BTreeMap<String, (u64, String, Vec<String>)>,
    /// (person, agent) → (since, message id, told).
    waiting: BTreeMap<(String, String), (u64, String, bool)>,
    /// (person, subject) → last told.
    told: HashMap<(String, String), u64>,
    /// Person → (first line's time, mirror lines waiting, lines past the quoted ones).
    mirror: BTreeMap<String, (u64, Vec<String>, u64)>,
    /// Person → times of recent notices, and what was held back for the next one (at most
    /// [`Notifier::MAX_HELD_TEXTS`] texts, and how many more).
    recent: HashMap<String, (VecDeque<u64>, Held)>,
    quiet_ms: u64,
}

/// Notices held back by the per-minute limit: told, summarised, in the next notice.
#[derive(Debug, Default)]
struct Held {
    kind: Option<NoticeKind>,
    texts: Vec<String>,
    more: u64,
}

impl Held {
    fn is_empty(&self) -> bool {
        self.texts.is_empty() && self.more == 0
    }
}

impl Notifier {
    /// At most this many notices a minute per person.
    pub const MAX_PER_MINUTE: usize = 5;

    /// At most this many notices are quoted in one summary; the rest are counted.
    pub const MAX_HELD_TEXTS: usize = 20;

    /// Agents' exchanges are gathered this long (ms) into one mirror notice.
    pub const MIRROR_BATCH_MS: u64 = 5_000;

    /// A notifier for these people; a subject is told again only after `quiet_ms`.
    pub fn new(wants: Vec<Wants>, quiet_ms: u64) -> Self {
        Self {
            wants,
            blocked: BTreeMap::new(),
            waiting: BTreeMap::new(),
            told: HashMap::new(),
            mirror: BTreeMap::new(),
            recent: HashMap::new(),
            quiet_ms,
        }
    }

    fn is_person(&self, name: &str) -> bool {
        self.wants.iter().any(|w| w.person == name)
    }

    /// Takes in what happened at `now` (ms); returns notices due at once.
    pub fn hear(&mut self, heard: Heard, now: u64) -> Vec<Notice> {
        let mut out = Vec::new();
        self.hear_into(heard, now, &mut out);
        self.release(out, now)
    }

    /// Takes in several things that happened at once: what they make due is told together,
    /// one notice per person.
    pub fn hear_all(&mut self, heard: Vec<Heard>, now: u64) -> Vec<Notice> {
        let mut out = Vec::new();
        for h in heard {
            self.hear_into(h, now, &mut out);
        }
        self.release(out, now)
    }

    fn hear_into(&mut self, heard: Heard, now: u64, out: &mut Vec<Pending>) {
        match heard {
            Heard::AgentState { agent, blocked } => match blocked {
                Some(why) => {
                    self.blocked.entry(agent).or_insert((now, why, Vec::new()));
                }
                None => {
                    self.blocked.remove(&agent);
                }
            },
            Heard::Gone { agent } => {
                self.blocked.remove(&agent);
            }
            Heard::Message {
                from,
                to,
                id,
                preview,
            } => {
                if !self.is_person(&from) && !self.is_person(&to) && from != "relay" {
                    let line = relay_protocol::text::one_line(
                        &format!(
                            "{from} → {to} [{}]: {preview}",
                            relay_protocol::short_id(&id)
                        ),
                        120,
                    );
                    for w in self.wants.iter().filter(|w| w.mirror) {
                        let (_, lines, more) =
                            self.mirror
                                .entry(w.person.clone())
                                .or_insert((now, Vec::new(), 0));
                        if lines.len() < Self::MAX_HELD_TEXTS {
                            lines.push(line.clone());
                        } else {
                            *more += 1;
                        }
                    }
                }
                if self.is_person(&from) {
                    // The person answered (or wrote first): nothing waits on them from `to`.
                    self.waiting.remove(&(from, to));
                } else if self.is_person(&to) && from != "relay" {
                    // (The relay's own notices expect no answer.)
                    self.waiting.entry((to, from)).or_insert((now, id, false));
                }
            }
            Heard::Dead { id, from, why } => {
                let short = relay_protocol::short_id(&id).to_owned();
                for w in self.wants.clone() {
                    if w.kinds.contains(&NoticeKind::Dead) && w.person != from {
                        let text = format!(
                            "relay: {from}'s message [{short}] was dead-lettered: {why} (agent-relay dlq)"
                        );
                        self.push(
                            out,
                            &w.person,
                            NoticeKind::Dead,
                            format!("dead:{from}:{short}"),
                            text,
                            now,
                        );
                    }
                }
            }
        }
    }

    /// Notices that came due by `now`.
    pub fn tick(&mut self, now: u64) -> Vec<Notice> {
        let mut out = Vec::new();
        let wants = self.wants.clone();
        let mut due = Vec::new();
        for (agent, (since, why, told)) in &mut self.blocked {
            for w in &wants {
                if !told.contains(&w.person)
                    && w.kinds.contains(&NoticeKind::Blocked)
                    && now.saturating_sub(*since) >= w.blocked_after_ms
                {
                    told.push(w.person.clone());
                    let secs = now.saturating_sub(*since) / 1000;
                    due.push((
                        w.person.clone(),
                        NoticeKind::Blocked,
                        format!("blocked:{agent}"),
                        format!("relay: {agent} has been blocked for {secs} s ({why})"),
                    ));
                }
            }
        }
        for ((person, agent), (since, id, told)) in &mut self.waiting {
            let Some(w) = wants.iter().find(|w| &w.person == person) else {
                continue;
            };
            if !*told
                && w.kinds.contains(&NoticeKind::Waiting)
                && now.saturating_sub(*since) >= w.waiting_after_ms
            {
                *told = true;
                let short = relay_protocol::short_id(id);
                due.push((
                    person.clone(),
                    NoticeKind::Waiting,
                    format!("waiting:{agent}"),
                    format!("relay: {agent} is waiting for your answer to [{short}] (reply to it to answer)"),
                ));
            }
        }
        for (person, kind, subject, text) in due {
            self.push(&mut out, &person, kind, subject, text, now);
        }
        let batches: Vec<String> = self
            .mirror
            .iter()
            .filter(|(_, (since, _, _))| now.saturating_sub(*since) >= Self::MIRROR_BATCH_MS)
            .map(|(p, _)| p.clone())
            .collect();
        for person in batches {
            let Some((_, lines, more)) = self.mirror.remove(&person) else {
                continue;
            };
            let n = lines.len() as u64 + more;
            let text = if n == 1 {
                format!("relay: {}", lines.concat())
            } else {
                let mut t = format!("relay: {n} exchanges between agents:");
                for l in &lines {
                    t.push_str("\n- ");
                    t.push_str(l);
                }
                if more > 0 {
                    t.push_str(&format!("\n- and {more} more (agent-relay history)"));
                }
                t
            };
            // Each batch is its own subject: the quiet period is for repeated alarms.
            self.push(
                &mut out,
                &person,
                NoticeKind::Mirror,
                format!("mirror:{now}"),
                text,
                now,
            );
        }
        self.release(out, now)
    }

    /// When [`Notifier::tick`] next has something to do, if anything waits.
    pub fn next_due(&self) -> Option<u64> {
        let blocked = self.blocked.values().flat_map(|(since, _, told)| {
            self.wants
                .iter()
                .filter(move |w| {
                    w.kinds.contains(&NoticeKind::Blocked) && !told.contains(&w.person)
                })
                .map(move |w| since + w.blocked_after_ms)
        });
        let waiting =
            self.waiting
                .iter()
                .filter(|(_, v)| !v.2)
                .filter_map(|((p, _), (since, _, _))| {
                    self.wants
                        .iter()
                        .find(|w| &w.person == p && w.kinds.contains(&NoticeKind::Waiting))
                        .map(|w| since + w.waiting_after_ms)
                });
        // Held-back notices are told when the person's minute has room again.
        let held = self
            .recent
            .values()
            .filter(|(_, h)| !h.is_empty())
            .map(|(times, _)| times.front().map_or(0, |t| t + 60_000));
        let mirror = self
            .mirror
            .values()
            .map(|(since, _, _)| since + Self::MIRROR_BATCH_MS);
        blocked.chain(waiting).chain(held).chain(mirror).min()
    }

    /// Adds a notice about `subject` to `out`, unless that subject was told within the quiet
    /// period.
    fn push(
        &self,
        out: &mut Vec<Pending>,
        person: &str,
        kind: NoticeKind,
        subject: String,
        text: String,
        now: u64,
    ) {
        let key = (person.to_owned(), subject);
        if self
            .told
            .get(&key)
            .is_some_and(|&at| now.saturating_sub(at) < self.quiet_ms)
            || out.iter().any(|p| p.key == key)
        {
            return;
        }
        out.push(Pending { key, kind, text });
    }

    /// Turns what came due at `now` into notices: one per person (several due at once are
    /// one summary), at most [`Notifier::MAX_PER_MINUTE`] a minute; what the limit holds back
    /// is told in the next notice, which [`Notifier::next_due`] schedules. Nothing is dropped.
    fn release(&mut self, pending: Vec<Pending>, now: u64) -> Vec<Notice> {
        let mut by_person: BTreeMap<String, Vec<Pending>> = BTreeMap::new();
        for p in pending {
            self.told.insert(p.key.clone(), now);
            by_person.entry(p.key.0.clone()).or_default().push(p);
        }
        // People with held-back notices are due too, once their minute has room.
        for (person, (_, held)) in &self.recent {
            if !held.is_empty() {
                by_person.entry(person.clone()).or_default();
            }
        }
        let mut out = Vec::new();
        for (person, items) in by_person {
            let (times, held) = self.recent.entry(person.clone()).or_default();
            while times
                .front()
                .is_some_and(|&t| now.saturating_sub(t) >= 60_000)
            {
                times.pop_front();
            }
            for p in items {
                held.kind.get_or_insert(p.kind);
                if held.texts.len() < Self::MAX_HELD_TEXTS {
                    held.texts.push(p.text);
                } else {
                    held.more += 1;
                }
            }
            if held.is_empty() || times.len() >= Self::MAX_PER_MINUTE {
                continue;
            }
            times.push_back(now);
            let held = std::mem::take(held);
            let kind = held.kind.unwrap_or(NoticeKind::Dead);
            let text = if held.texts.len() == 1 && held.more == 0 {
                held.texts.into_iter().next().unwrap_or_default()
            } else {
                let n = held.texts.len() as u64 + held.more;
                let mut text = format!("relay: {n} notices:");
                for t in &held.texts {
                    text.push_str("\n- ");
                    text.push_str(t.strip_prefix("relay: ").unwrap_or(t));
                }
                if held.more > 0 {
                    text.push_str(&format!("\n- and {} more (agent-relay status)", held.more));
                }
                text
            };
            out.push(Notice { person, kind, text });
        }
        out
    }
}

/// A notice come due, before the per-person limit.
#[derive(Debug)]
struct Pending {
    /// (person, subject).
    key: (String, String),
    kind: NoticeKind,
    text: String,
}

/// Refusals told back to people in their chats ("not sent to Bob: ..."), bounded: in each chat
/// the first of a window is told at once, the rest are counted and told in one summary when
/// the window ends. 300 messages refused make a handful of answers, not 300.
#[derive(Debug)]
pub struct Replies {
    window_ms: u64,
    /// Chat → (window start, refusals held back, the last one held back).
    chats: HashMap<i64, (u64, u64, String)>,
}

impl Replies {
    /// Refusals bounded to one a `window_ms` per chat, plus one summary.
    pub fn new(window_ms: u64) -> Self {
        Self {
            window_ms,
            chats: HashMap::new(),
        }
    }

    /// A refusal `text` for `chat` at `now`: the text to send now, or `None` when it is held
    /// back for the window's summary.
    pub fn refusal(&mut self, chat: i64, text: String, now: u64) -> Option<String> {
        match self.chats.get_mut(&chat) {
            Some((since, held, last)) if now.saturating_sub(*since) < self.window_ms => {
                *held += 1;
                *last = text;
                None
            }
            _ => {
                self.chats.insert(chat, (now, 0, String::new()));
                Some(text)
            }
        }
    }

    /// The summaries due by `now`, as (chat, text).
    pub fn due(&mut self, now: u64) -> Vec<(i64, String)> {
        let mut out = Vec::new();
        let window = self.window_ms;
        self.chats.retain(|chat, (since, held, last)| {
            if now.saturating_sub(*since) < window {
                return true;
            }
            if *held == 0 {
                return false;
            }
            out.push((
                *chat,
                format!(
                    "relay: {held} more messages were not sent; the last: {}",
                    last.strip_prefix("relay: ").unwrap_or(last)
                ),
            ));
            // A flood that goes on gets one summary a window.
            *since = now;
            *held = 0;
            true
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_storm_of_refusals_is_one_answer_and_one_summary_a_window() {
        let mut r = Replies::new(10_000);
        assert!(
            r.refusal(42, "relay: not sent to Bob: slow down".into(), 0)
                .is_some()
        );
        for i in 1..300 {
            assert!(
                r.refusal(42, format!("relay: not sent to Bob: {i}"), i)
                    .is_none()
            );
        }
        assert!(
            r.refusal(7, "relay: not sent".into(), 5).is_some(),
            "per chat"
        );
        assert!(r.due(9_999).is_empty());
        let due = r.due(10_000);
        assert_eq!(due.len(), 1, "{due:?}");
        assert_eq!(due[0].0, 42);
        assert!(
            due[0]
                .1
                .starts_with("relay: 299 more messages were not sent"),
            "{}",
            due[0].1
        );
        assert!(r.due(30_000).is_empty());
        assert!(r.refusal(42, "relay: again".into(), 30_001).is_some());
    }

    fn notifier() -> Notifier {
        Notifier::new(
            vec![Wants {
                person: "human".into(),
                kinds: vec![NoticeKind::Blocked, NoticeKind::Waiting, NoticeKind::Dead],
                blocked_after_ms: 30_000,
                waiting_after_ms: 60_000,
                mirror: false,
            }],
            600_000,
        )
    }

    fn blocked(agent: &str) -> Heard {
        Heard::AgentState {
            agent: agent.into(),
            blocked: Some("dialog open: allow?".into()),
        }
    }

    #[test]
    fn a_blocked_agent_is_told_once_after_the_threshold() {
        let mut n = notifier();
        assert!(n.hear(blocked("Dora"), 1_000).is_empty());
        assert_eq!(n.next_due(), Some(31_000));
        assert!(n.tick(30_999).is_empty());
        let told = n.tick(31_000);
        assert_eq!(told.len(), 1);
        assert_eq!(
            told[0].text,
            "relay: Dora has been blocked for 30 s (dialog open: allow?)"
        );
        assert!(n.tick(40_000).is_empty());
        assert!(n.tick(1_000_000).is_empty());
        // Repeated reports of the same state change nothing.
        assert!(n.hear(blocked("Dora"), 50_000).is_empty());
        assert!(n.tick(200_000).is_empty());
        assert_eq!(n.next_due(), None);
    }

    #[test]
    fn unblocked_in_time_is_never_told() {
        let mut n = notifier();
        n.hear(blocked("Dora"), 0);
        n.hear(
            Heard::AgentState {
                agent: "Dora".into(),
                blocked: None,
            },
            10_000,
        );
        assert!(n.tick(100_000).is_empty());
    }

    #[test]
    fn an_unanswered_message_is_told_once_and_an_answer_clears_it() {
        let mut n = notifier();
        let msg = |from: &str, to: &str| Heard::Message {
            from: from.into(),
            to: to.into(),
            id: "01HZZZZZZZABCDEFGH".into(),
            preview: "hi".into(),
        };
        n.hear(msg("Alice", "human"), 0);
        n.hear(msg("relay", "human"), 0);
        n.hear(msg("Bob", "human"), 0);
        n.hear(msg("human", "Bob"), 1_000);
        let told = n.tick(60_000);
        assert_eq!(told.len(), 1, "{told:?}");
        assert!(
            told[0].text.starts_with("relay: Alice is waiting"),
            "{}",
            told[0].text
        );
        assert!(n.tick(120_000).is_empty());
    }

    #[test]
    fn dead_letters_are_rate_limited_per_subject_and_per_minute() {
        let mut n = notifier();
        let dead = |from: &str| Heard::Dead {
            id: "X".into(),
            from: from.into(),
            why: "expired".into(),
        };
        assert_eq!(n.hear(dead("Alice"), 0).len(), 1);
        assert!(
            n.hear(dead("Alice"), 1_000).is_empty(),
            "same subject, quiet period"
        );
        for (i, who) in ["B1", "B2", "B3", "B4"].iter().enumerate() {
            assert_eq!(n.hear(dead(who), 2_000 + i as u64).len(), 1);
        }
        assert!(n.hear(dead("B5"), 3_000).is_empty(), "past five a minute");
        assert!(n.hear(dead("B6"), 4_000).is_empty(), "past five a minute");
        assert_eq!(n.next_due(), Some(60_000), "held back, not dropped");
        let later = n.tick(60_000);
        assert_eq!(later.len(), 1);
        assert!(
            later[0].text.starts_with("relay: 2 notices:")
                && later[0].text.contains("B5's message")
                && later[0].text.contains("B6's message"),
            "{}",
            later[0].text
        );
        assert_eq!(n.next_due(), None);
    }

    #[test]
    fn a_watching_person_gets_exchanges_batched() {
        let mut n = Notifier::new(
            vec![Wants {
                person: "human".into(),
                kinds: vec![],
                blocked_after_ms: 0,
                waiting_after_ms: 0,
                mirror: true,
            }],
            600_000,
        );
        for i in 0..30 {
            let h = Heard::Message {
                from: "Alice".into(),
                to: "Bob".into(),
                id: format!("0000000{i:02}"),
                preview: format!("step {i}\u{1b}[2J"),
            };
            assert!(n.hear(h, i).is_empty(), "batched");
        }
        assert!(
            n.hear(
                Heard::Message {
                    from: "human".into(),
                    to: "Bob".into(),
                    id: "x".into(),
                    preview: "a person's own".into()
                },
                40
            )
            .is_empty()
        );
        assert_eq!(n.next_due(), Some(Notifier::MIRROR_BATCH_MS));
        let told = n.tick(Notifier::MIRROR_BATCH_MS);
        assert_eq!(told.len(), 1, "{told:?}");
        let t = &told[0].text;
        assert!(t.starts_with("relay: 30 exchanges between agents:"), "{t}");
        assert!(
            t.contains("- Alice → Bob [") && t.contains("and 10 more"),
            "{t}"
        );
        assert!(
            !t.contains('\u{1b}') && !t.contains("a person's own"),
            "{t}"
        );
        assert_eq!(n.next_due(), None);
    }

    #[test]
    fn twelve_agents_blocked_at_once_are_one_notice_naming_all() {
        let mut n = notifier();
        let agents: Vec<String> = (1..=12).map(|i| format!("A{i}")).collect();
        for a in &agents {
            n.hear(blocked(a), 0);
        }
        let told = n.tick(30_000);
        assert_eq!(told.len(), 1, "{told:?}");
        for a in &agents {
            assert!(
                told[0].text.contains(&format!("- {a} has been blocked")),
                "{}",
                told[0].text
            );
        }
    }
}
