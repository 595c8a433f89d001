//! Access rules: who may send to whom. A pure core: parsing (with errors that name the line)
//! and matching; the daemon reloads the file when it changes, the CLI edits it.
//!
//! The file (`rules.json` in the data directory):
//!
//! ```json
//! {"rules": [
//!   {"from": "*", "to": "prod-*", "action": "deny", "priority": 10},
//!   {"from": "lead", "to": "prod-*", "action": "allow", "priority": 20}
//! ]}
//! ```
//!
//! `from` and `to` are agent names where `*` stands for any run of characters. In a federation
//! (`up --cluster`) a pattern can also name nodes: `Alice@laptop`, `*@buildbox` (every agent of
//! that node), `ci-*@*`; a pattern without `@` matches the name on any node, and one with `@`
//! matches nothing on a relay outside a federation. The rule with
//! the highest `priority` that matches decides (equal priorities: the one earlier in the file);
//! when none matches, the message is allowed.

use serde::{Deserialize, Serialize};

/// Allow or deny a message; or, for the team verbs (issue 25), refuse a spawn or allow a
/// release.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// Let it through.
    Allow,
    /// Refuse it (`forbidden`) and dead-letter it.
    Deny,
    /// `from` may not spawn workers (`to`: the new worker's name; `*` for any). Messages are
    /// not concerned.
    DenySpawn,
    /// `from` may release the workers `to` even though it did not spawn them. Messages are
    /// not concerned.
    AllowRelease,
}

impl Action {
    /// Whether the action decides messages (`allow`, `deny`) rather than a team verb.
    pub fn is_message_rule(self) -> bool {
        matches!(self, Self::Allow | Self::Deny)
    }

    /// As written in the file and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Deny => "deny",
            Self::DenySpawn => "deny-spawn",
            Self::AllowRelease => "allow-release",
        }
    }
}

/// A name pattern: letters, digits, `.`, `_`, `-`, and `*` for any run of them; optionally
/// `@` and a node pattern (`Alice@laptop`, `*@buildbox`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Pattern(String);

impl Pattern {
    /// Validates `s` as a pattern.
    ///
    /// # Errors
    /// Says which character is not allowed.
    pub fn new(s: &str) -> Result<Self, String> {
        if s.is_empty() || s.len() > 64 {
            return Err(format!("{s:?}: a name pattern has 1 to 64 characters"));
        }
        if let Some(c) = s
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '*' | '@')))
        {
            return Err(format!(
                "{s:?}: {c:?} is not allowed in a name pattern (letters, digits, '.', '_', '-', '*' for any run of them, and NAME@NODE for an agent of a node)"
            ));
        }
        if s.matches('@').count() > 1 || s.starts_with('@') || s.ends_with('@') {
            return Err(format!(
                "{s:?}: write NAME@NODE with one '@' (`Alice@laptop`, `*@buildbox`)"
            ));
        }
        Ok(Self(s.to_owned()))
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `name` matches (`*` matches any run of characters, including none), the node
    /// unknown (a pattern with `@` never matches).
    pub fn matches(&self, name: &str) -> bool {
        self.matches_at(name, None)
    }

    /// Whether `name` of `node` (this relay's node, or the one a stand-in stands for; `None`
    /// outside a federation) matches.
    pub fn matches_at(&self, name: &str, node: Option<&str>) -> bool {
        match self.0.split_once('@') {
            None => glob(self.0.as_bytes(), name.as_bytes()),
            Some((n, at)) => node.is_some_and(|node| {
                glob(n.as_bytes(), name.as_bytes()) && glob(at.as_bytes(), node.as_bytes())
            }),
        }
    }
}

impl<'de> Deserialize<'de> for Pattern {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        // serde_json adds the line and column to this error.
        Self::new(&s).map_err(serde::de::Error::custom)
    }
}

/// Iterative glob with one star-backtrack point: linear in practice, no recursion.
fn glob(p: &[u8], s: &[u8]) -> bool {
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, si));
            pi += 1;
        } else if pi < p.len() && p[pi] == s[si] {
            pi += 1;
            si += 1;
        } else if let Some((sp, ss)) = star {
            pi = sp + 1;
            si = ss + 1;
            star = Some((sp, ss + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == b'*')
}

/// One rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Sender pattern.
    pub from: Pattern,
    /// Recipient pattern.
    pub to: Pattern,
    /// What to do.
    pub action: Action,
    /// Higher wins.
    #[serde(default)]
    pub priority: i64,
}

/// The rules file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rules {
    /// In file order.
    pub rules: Vec<Rule>,
}

impl Rules {
    /// Parses a rules file.
    ///
    /// # Errors
    /// What is wrong, with the line and column.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        serde_json::from_str(text).map_err(|e| e.to_string())
    }

    /// The file's text for these rules.
    pub fn to_text(&self) -> String {
        // Serializing plain strings and integers cannot fail.
        let mut s = serde_json::to_string_pretty(self).unwrap_or_default();
        s.push('\n');
        s
    }

    /// The rule that decides a message from `from` to `to`, if any matches.
    pub fn decide(&self, from: &str, to: &str) -> Option<&Rule> {
        self.decide_at((from, None), (to, None))
    }

    /// The rule that decides a message from `from` to `to`, each a name and its node (see
    /// [`Pattern::matches_at`]), if any matches.
    pub fn decide_at(&self, from: (&str, Option<&str>), to: (&str, Option<&str>)) -> Option<&Rule> {
        let mut best: Option<&Rule> = None;
        for r in self.rules.iter().filter(|r| r.action.is_message_rule()) {
            if r.from.matches_at(from.0, from.1)
                && r.to.matches_at(to.0, to.1)
                && best.is_none_or(|b| r.priority > b.priority)
            {
                best = Some(r);
            }
        }
        best
    }

    /// Whether a message from `from` to `to` may pass (no matching rule: yes).
    pub fn allows(&self, from: &str, to: &str) -> bool {
        self.allows_at((from, None), (to, None))
    }

    /// The `deny-spawn` rule that forbids `from` to spawn a worker named `worker`, if any.
    pub fn denies_spawn(&self, from: &str, worker: &str) -> Option<&Rule> {
        self.rules
            .iter()
            .find(|r| r.action == Action::DenySpawn && r.from.matches(from) && r.to.matches(worker))
    }

    /// Whether an `allow-release` rule lets `from` release `worker`, which it did not spawn.
    pub fn allows_release(&self, from: &str, worker: &str) -> bool {
        self.rules.iter().any(|r| {
            r.action == Action::AllowRelease && r.from.matches(from) && r.to.matches(worker)
        })
    }

    /// [`Rules::allows`] with each name's node.
    pub fn allows_at(&self, from: (&str, Option<&str>), to: (&str, Option<&str>)) -> bool {
        self.decide_at(from, to)
            .is_none_or(|r| r.action == Action::Allow)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_matches_runs() {
        let p = |s: &str| Pattern::new(s).unwrap();
        assert!(p("*").matches("anything"));
        assert!(p("prod-*").matches("prod-db"));
        assert!(p("prod-*").matches("prod-"));
        assert!(!p("prod-*").matches("dev-db"));
        assert!(p("*-bot").matches("ci-bot"));
        assert!(p("a*b*c").matches("aXXbYYc"));
        assert!(!p("a*b*c").matches("aXXbYY"));
        assert!(p("Bob").matches("Bob"));
        assert!(!p("Bob").matches("bob"));
    }

    #[test]
    fn highest_priority_wins_then_file_order_default_allow() {
        let r = Rules::parse(
            r#"{"rules": [
                {"from": "*", "to": "prod-*", "action": "deny", "priority": 10},
                {"from": "lead", "to": "prod-*", "action": "allow", "priority": 20},
                {"from": "x", "to": "y", "action": "deny", "priority": 1},
                {"from": "x", "to": "y", "action": "allow", "priority": 1}
            ]}"#,
        )
        .unwrap();
        assert!(!r.allows("dev", "prod-db"));
        assert!(r.allows("lead", "prod-db"));
        assert!(r.allows("dev", "dev-db"));
        assert!(!r.allows("x", "y"), "equal priority: the earlier rule");
        assert!(Rules::parse("").unwrap().allows("a", "b"));
    }

    #[test]
    fn errors_name_the_line() {
        let e = Rules::parse(
            "{\"rules\": [\n  {\"from\": \"a\", \"to\": \"b\", \"action\": \"maybe\"}\n]}",
        )
        .unwrap_err();
        assert!(e.contains("line 2"), "{e}");
        assert!(e.contains("maybe"), "{e}");
        let e = Rules::parse(
            "{\"rules\": [\n\n  {\"from\": \"a/b\", \"to\": \"b\", \"action\": \"deny\"}\n]}",
        )
        .unwrap_err();
        assert!(e.contains("line 3") && e.contains("'/'"), "{e}");
        let e = Rules::parse(
            "{\"rules\": [\n  {\"from\": \"a\", \"to\": \"b\", \"action\": \"deny\",}\n]}",
        )
        .unwrap_err();
        assert!(e.contains("line 2"), "{e}");
        let e =
            Rules::parse("{\"rules\": [{\"from\": \"a\", \"too\": \"b\", \"action\": \"deny\"}]}")
                .unwrap_err();
        assert!(e.contains("too"), "{e}");
    }

    #[test]
    fn patterns_can_name_nodes() {
        let r = Rules::parse(
            r#"{"rules": [
                {"from": "*@laptop", "to": "prod-*", "action": "deny", "priority": 10},
                {"from": "Alice@laptop", "to": "*", "action": "allow", "priority": 20},
                {"from": "*", "to": "Bob@buildbox", "action": "deny", "priority": 5}
            ]}"#,
        )
        .unwrap();
        let at = |n: &'static str, node: &'static str| (n, Some(node));
        assert!(!r.allows_at(at("Carol", "laptop"), at("prod-db", "buildbox")));
        assert!(r.allows_at(at("Carol", "desk"), at("prod-db", "buildbox")));
        assert!(r.allows_at(at("Alice", "laptop"), at("prod-db", "buildbox")));
        assert!(!r.allows_at(at("Carol", "desk"), at("Bob", "buildbox")));
        assert!(r.allows_at(at("Carol", "desk"), at("Bob", "laptop")));
        // Outside a federation a pattern with a node matches nothing.
        assert!(r.allows("Carol", "Bob"));
        for bad in ["@x", "a@", "a@b@c"] {
            assert!(Pattern::new(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn spawn_and_release_rules_leave_messages_alone() {
        let r = Rules::parse(
            r#"{"rules": [
                {"from": "worker-*", "to": "*", "action": "deny-spawn"},
                {"from": "Ops", "to": "Lead-*", "action": "allow-release", "priority": 5}
            ]}"#,
        )
        .unwrap();
        assert!(r.denies_spawn("worker-1", "x").is_some());
        assert!(r.denies_spawn("Lead", "x").is_none());
        assert!(r.allows_release("Ops", "Lead-w1"));
        assert!(!r.allows_release("Ops", "Other"));
        assert!(!r.allows_release("Lead", "Lead-w1"));
        // Not message rules: everything is still allowed.
        assert!(r.allows("worker-1", "anyone"));
        assert!(r.allows("Ops", "Lead-w1"));
        assert_eq!(Rules::parse(&r.to_text()).unwrap(), r);
    }

    #[test]
    fn round_trips() {
        let r = Rules {
            rules: vec![Rule {
                from: Pattern::new("a*").unwrap(),
                to: Pattern::new("b").unwrap(),
                action: Action::Deny,
                priority: 3,
            }],
        };
        assert_eq!(Rules::parse(&r.to_text()).unwrap(), r);
    }
}
