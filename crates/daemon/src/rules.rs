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
//! `from` and `to` are agent names where `*` stands for any run of characters. The rule with
//! the highest `priority` that matches decides (equal priorities: the one earlier in the file);
//! when none matches, the message is allowed.

use serde::{Deserialize, Serialize};

/// Allow or deny.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Let it through.
    Allow,
    /// Refuse it (`forbidden`) and dead-letter it.
    Deny,
}

/// A name pattern: letters, digits, `.`, `_`, `-`, and `*` for any run of them.
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
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '*')))
        {
            return Err(format!(
                "{s:?}: {c:?} is not allowed in a name pattern (letters, digits, '.', '_', '-', and '*' for any run of them)"
            ));
        }
        Ok(Self(s.to_owned()))
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `name` matches (`*` matches any run of characters, including none).
    pub fn matches(&self, name: &str) -> bool {
        glob(self.0.as_bytes(), name.as_bytes())
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
        let mut best: Option<&Rule> = None;
        for r in &self.rules {
            if r.from.matches(from)
                && r.to.matches(to)
                && best.is_none_or(|b| r.priority > b.priority)
            {
                best = Some(r);
            }
        }
        best
    }

    /// Whether a message from `from` to `to` may pass (no matching rule: yes).
    pub fn allows(&self, from: &str, to: &str) -> bool {
        self.decide(from, to)
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
