//! Names: who may take a name, and what a name nobody has taken yet means (issue 23.3,
//! issue 24.3; DESIGN §12–13). Every admission decision about a name is here, so that the
//! rest of the core asks one place.
//!
//! - Names that differ only by case are one name: `alice` beside a known (or live) `Alice` is
//!   refused, as a connection's name and as a recipient ("did you mean Alice").
//! - A person's names (`human` and every declared `[people.NAME]`, [`crate::Config`]'s
//!   `person_names`) belong to the person's doors: the CLI (a tool connection) and the
//!   adapters and dashboard this daemon process runs. No agent connection from another
//!   process takes them.
//! - A recipient nobody has connected as yet is accepted and waits (for the inbox TTL), as for
//!   an offline agent, unless it is within an edit or two of a known name: that is a typo, and
//!   refused with the name meant.

use relay_protocol::{ErrorCode, NackCode, Role};

use super::{Core, RELAY};

/// The most edits (insertions, deletions, substitutions, swaps of neighbours) between a name
/// and a known one for it to be taken as a typo of it. Short names allow one: two edits turn
/// most three-letter names into another.
fn typo_edits(len: usize) -> usize {
    if len <= 4 { 1 } else { 2 }
}

/// Edits between `a` and `b` ignoring case (optimal string alignment: a swap of neighbours
/// counts one, as in `Bbo` for `Bob`), or `None` once it is sure to exceed `max`.
fn edits_within(a: &str, b: &str, max: usize) -> Option<usize> {
    let a: Vec<u8> = a.bytes().map(|c| c.to_ascii_lowercase()).collect();
    let b: Vec<u8> = b.bytes().map(|c| c.to_ascii_lowercase()).collect();
    if a.len().abs_diff(b.len()) > max {
        return None;
    }
    // Three rows of the distance table: two back (for swaps), previous, current.
    let mut back: Vec<usize> = vec![0; b.len() + 1];
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur: Vec<usize> = vec![0; b.len() + 1];
    for i in 1..=a.len() {
        cur[0] = i;
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut d = (prev[j] + 1).min(cur[j - 1] + 1).min(prev[j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d = d.min(back[j - 2] + 1);
            }
            cur[j] = d;
        }
        if cur.iter().min().is_some_and(|m| *m > max) {
            return None;
        }
        std::mem::swap(&mut back, &mut prev);
        std::mem::swap(&mut prev, &mut cur);
    }
    Some(prev[b.len()]).filter(|d| *d <= max)
}

/// The name `name` would be taken for among `known`: one equal up to case, or else the
/// nearest within [`typo_edits`] (ties: the first in name order). `None`: it is a name of its
/// own.
fn meant<'a>(name: &str, known: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let max = typo_edits(name.len());
    let mut best: Option<(usize, &str)> = None;
    for k in known {
        if k == name {
            return None;
        }
        let Some(d) = edits_within(name, k, max) else {
            continue;
        };
        let better = match best {
            None => true,
            Some((bd, bk)) => d < bd || (d == bd && k < bk),
        };
        if better {
            best = Some((d, k));
        }
    }
    best.map(|(_, k)| k)
}

/// What the core knows of a recipient's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Recipient {
    /// An agent that has connected (online or not).
    Known,
    /// A person's name (always addressable).
    Person,
    /// A name nobody has connected as yet: the message waits for it.
    NotYetSeen,
}

impl Core {
    /// Whether `name` is one of the person's names (exactly as declared).
    pub(super) fn is_person(&self, name: &str) -> bool {
        self.cfg.person_names.iter().any(|p| p == name)
    }

    /// Every name the relay knows: agents that have connected, and the person's names.
    fn known_iter(&self) -> impl Iterator<Item = &str> {
        self.agents
            .keys()
            .map(String::as_str)
            .chain(self.cfg.person_names.iter().map(String::as_str))
    }

    /// The known name equal to `name` up to case but spelled otherwise, if any (from the
    /// folded index: a HELLO must not scan every known agent).
    fn case_twin(&self, name: &str) -> Option<&str> {
        if self.agents.contains_key(name) || self.is_person(name) {
            return None;
        }
        self.cfg
            .person_names
            .iter()
            .map(String::as_str)
            .find(|k| k.eq_ignore_ascii_case(name))
            .or_else(|| {
                self.folded
                    .get(&name.to_ascii_lowercase())
                    .map(String::as_str)
            })
    }

    /// Notes a name the agents' map now holds, for [`Core::case_twin`].
    pub(super) fn fold_in(&mut self, name: &str) {
        self.folded
            .entry(name.to_ascii_lowercase())
            .or_insert_with(|| name.to_owned());
    }

    /// Forgets a name the agents' map no longer holds.
    pub(super) fn fold_out(&mut self, name: &str) {
        let key = name.to_ascii_lowercase();
        if self.folded.get(&key).is_some_and(|n| n == name) {
            self.folded.remove(&key);
            // Another spelling still known (legacy data) takes its place.
            if let Some(other) = self.agents.keys().find(|k| k.to_ascii_lowercase() == key) {
                let other = other.clone();
                self.folded.insert(key, other);
            }
        }
    }

    /// Whether a HELLO may take `name` with `role`: refused when it is the relay's own name,
    /// a person's name taken by an agent connection from outside this process, or a known
    /// name spelled with other case. `in_process`: the connection's peer is this daemon's own
    /// process (its people adapters, its federation link). `person_door`: the HELLO says it
    /// is one of the person's doors (`cli` is [`relay_protocol::PERSON_CLI`]: `agent-relay
    /// inbox`); no agent's door (a wrapper, an MCP server) says so.
    pub(super) fn may_take(
        &self,
        name: &str,
        role: Role,
        in_process: bool,
        person_door: bool,
    ) -> Result<(), (ErrorCode, String)> {
        // Reserved in any case: `Relay` would read as the relay's notices on every screen.
        if name.eq_ignore_ascii_case(RELAY) {
            return Err((
                ErrorCode::BadName,
                format!(
                    "the name {RELAY:?} is reserved for the relay's own notices; choose another"
                ),
            ));
        }
        if role == Role::Agent
            && !in_process
            && !person_door
            && let Some(person) = self
                .cfg
                .person_names
                .iter()
                .find(|p| p.eq_ignore_ascii_case(name))
        {
            return Err((
                ErrorCode::BadName,
                format!(
                    "the name {name:?} is the person's ({person:?}): only the person's own doors (agent-relay send, inbox and reply, the dashboard, the adapters) speak as it; an agent or MCP server chooses another name (agent-relay -n NAME ...)"
                ),
            ));
        }
        // A tool connection (the CLI) says who sends only when it sends: checked then
        // ([`Core::may_sign`]), so that queries under any name keep working.
        if role == Role::Agent
            && let Some(twin) = self.case_twin(name)
        {
            return Err((
                ErrorCode::BadName,
                format!(
                    "{name:?} is the same name as {twin:?} (names that differ only by case are one name); use {twin:?} or choose another name"
                ),
            ));
        }
        Ok(())
    }

    /// Whether a tool connection named `name` may sign a message with it: not a known name
    /// spelled with other case (`--from alice` beside `Alice`).
    pub(super) fn may_sign(&self, name: &str) -> Result<(), String> {
        match self.case_twin(name) {
            Some(twin) => Err(format!(
                "{name:?} is the same name as {twin:?} (names that differ only by case are one name); send as {twin:?} or as another name"
            )),
            None => Ok(()),
        }
    }

    /// What `name` is as a recipient, or why a message to it is refused: the relay itself, or
    /// a name so close to a known one that it is taken for a typo of it.
    pub(super) fn admit_recipient(&self, name: &str) -> Result<Recipient, (NackCode, String)> {
        if self.agents.contains_key(name) {
            return Ok(Recipient::Known);
        }
        if self.is_person(name) {
            return Ok(Recipient::Person);
        }
        if name.eq_ignore_ascii_case(RELAY) {
            return Err((
                NackCode::UnknownTarget,
                format!("{RELAY:?} is the relay's own name for its notices; it takes no messages"),
            ));
        }
        if let Some(k) = meant(name, self.known_iter()) {
            return Err((
                NackCode::UnknownTarget,
                format!(
                    "no agent named {name:?}; did you mean {k:?}? (a name that has never connected is accepted and waits for it, but one this close to a known name is taken for a typo; {})",
                    self.known_names()
                ),
            ));
        }
        Ok(Recipient::NotYetSeen)
    }

    /// What the sender of a message to `name`, a name nobody has connected as yet, is told.
    pub(super) fn not_yet_seen_note(&self, name: &str) -> String {
        format!(
            "{name} has not connected yet; the message waits and is delivered when {name} connects (for up to {}, the relay's --inbox-ttl)",
            duration_words(self.cfg.inbox_ttl)
        )
    }
}

/// The starts of the ids the relay gives its own notices, made from names, paths and times
/// (and so computable by anyone): a client's SEND may not use them, or an agent could take a
/// notice's id first and the relay's notice would be refused as another sender's (issue 24.7's
/// rule). "Has not connected yet" (`notyet-`), a claim collision (`claim-`), a worker that
/// exited or became idle (`worker-exit-`, `worker-idle-`).
pub(super) const RELAY_ID_PREFIXES: [&str; 3] = ["notyet-", "claim-", "worker-"];

/// Whether `id` is one the relay keeps for its own notices ([`RELAY_ID_PREFIXES`]).
pub(super) fn is_relay_id(id: &str) -> bool {
    RELAY_ID_PREFIXES.iter().any(|p| id.starts_with(p))
}

/// The id of the notice telling `sender` that `recipient` has not connected yet: the same for
/// the pair whenever it is made, so the store keeps it told once across daemon restarts (a
/// second notice is a duplicate of `(relay, id)`). Hashed: names may be long, ids are at most
/// 128 characters of the id alphabet.
pub(super) fn not_yet_notice_id(sender: &str, recipient: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::new()
        .chain_update(b"not_connected_yet\0")
        .chain_update(sender.as_bytes())
        .chain_update([0])
        .chain_update(recipient.as_bytes())
        .finalize();
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("notyet-{hex}")
}

/// `1h`, `90s`, `2h30m`: a duration as a person reads it.
fn duration_words(d: std::time::Duration) -> String {
    let s = d.as_secs();
    if s == 0 {
        return format!("{}ms", d.as_millis());
    }
    let (h, m, s) = (s / 3600, (s % 3600) / 60, s % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if s > 0 {
        out.push_str(&format!("{s}s"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_not_yet_notice_id_is_the_pairs_and_a_valid_id() {
        let id = not_yet_notice_id("Alice", "Bob");
        assert_eq!(id, not_yet_notice_id("Alice", "Bob"));
        assert_ne!(id, not_yet_notice_id("Bob", "Alice"));
        assert_ne!(id, not_yet_notice_id("Alic", "eBob"));
        assert!(
            relay_protocol::text::validate_message_id(&id).is_ok(),
            "{id}"
        );
    }

    #[test]
    fn edits_count_swaps_once_and_ignore_case() {
        assert_eq!(edits_within("Bbo", "Bob", 2), Some(1));
        assert_eq!(edits_within("bob", "Bob", 2), Some(0));
        assert_eq!(edits_within("Bobby", "Bob", 2), Some(2));
        assert_eq!(edits_within("Bobbyy", "Bob", 2), None);
        assert_eq!(edits_within("Carol", "Alice", 2), None);
    }

    #[test]
    fn a_typo_means_the_nearest_known_name_and_a_new_name_means_none() {
        let known = ["Alice", "Bob", "human"];
        assert_eq!(meant("Bobb", known.into_iter()), Some("Bob"));
        assert_eq!(meant("alice", known.into_iter()), Some("Alice"));
        assert_eq!(meant("Alicia", known.into_iter()), Some("Alice"));
        assert_eq!(meant("Human", known.into_iter()), Some("human"));
        assert_eq!(meant("Carol", known.into_iter()), None);
        // Short names allow one edit only: Tom is not a typo of Bob, Bo is.
        assert_eq!(meant("Tom", known.into_iter()), None);
        assert_eq!(meant("Bo", known.into_iter()), Some("Bob"));
        assert_eq!(meant("Bob", known.into_iter()), None);
    }

    #[test]
    fn durations_read_as_words() {
        use std::time::Duration;
        assert_eq!(duration_words(Duration::from_secs(3600)), "1h");
        assert_eq!(duration_words(Duration::from_secs(9000)), "2h30m");
        assert_eq!(duration_words(Duration::from_secs(90)), "1m30s");
        assert_eq!(duration_words(Duration::from_millis(300)), "300ms");
    }
}
