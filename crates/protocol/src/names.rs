//! Validation of agent names and topics, and NATS-style topic matching.
//!
//! Names end up in file names, terminal text and log lines, so they are deliberately narrow:
//! ASCII letters, digits, `-`, `_` and `.`, starting with a letter or digit, at most 64 bytes.

/// Longest agent name accepted.
pub const MAX_NAME_LEN: usize = 64;
/// Longest topic accepted.
pub const MAX_TOPIC_LEN: usize = 128;

/// Why a name or topic was refused.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum NameError {
    /// Empty string.
    #[error("name is empty")]
    Empty,
    /// Over the length limit.
    #[error("{what} is {len} bytes long; the limit is {max}")]
    TooLong {
        /// "name" or "topic".
        what: &'static str,
        /// Actual length.
        len: usize,
        /// Limit.
        max: usize,
    },
    /// A character outside the allowed set.
    #[error("{what} {value:?} contains {ch:?}; use letters, digits, '-', '_' and '.'")]
    BadChar {
        /// "name" or "topic".
        what: &'static str,
        /// The offending value (debug-escaped when shown).
        value: String,
        /// The first bad character.
        ch: char,
    },
    /// Must start with a letter or digit.
    #[error("name {0:?} must start with a letter or digit")]
    BadStart(String),
    /// Empty segment or misplaced wildcard in a topic.
    #[error(
        "topic {0:?} is malformed: segments are separated by single dots, '*' stands for one whole segment and '>' only for the last"
    )]
    BadTopic(String),
}

fn name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

/// Checks an agent name.
///
/// # Errors
/// [`NameError`] saying what is wrong.
pub fn validate_agent_name(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > MAX_NAME_LEN {
        return Err(NameError::TooLong {
            what: "name",
            len: name.len(),
            max: MAX_NAME_LEN,
        });
    }
    if let Some(ch) = name.chars().find(|c| !name_char(*c)) {
        return Err(NameError::BadChar {
            what: "name",
            value: name.to_owned(),
            ch,
        });
    }
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err(NameError::BadStart(name.to_owned()));
    }
    Ok(())
}

fn check_topic(topic: &str, wildcards: bool) -> Result<(), NameError> {
    if topic.is_empty() {
        return Err(NameError::Empty);
    }
    if topic.len() > MAX_TOPIC_LEN {
        return Err(NameError::TooLong {
            what: "topic",
            len: topic.len(),
            max: MAX_TOPIC_LEN,
        });
    }
    let segments: Vec<&str> = topic.split('.').collect();
    let last = segments.len() - 1;
    for (i, seg) in segments.iter().enumerate() {
        match *seg {
            "" => return Err(NameError::BadTopic(topic.to_owned())),
            "*" if wildcards => {}
            ">" if wildcards && i == last => {}
            s => {
                if let Some(ch) = s
                    .chars()
                    .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_')))
                {
                    return if matches!(ch, '*' | '>') {
                        Err(NameError::BadTopic(topic.to_owned()))
                    } else {
                        Err(NameError::BadChar {
                            what: "topic",
                            value: topic.to_owned(),
                            ch,
                        })
                    };
                }
            }
        }
    }
    Ok(())
}

/// Checks a concrete topic (what a SEND carries): dot-separated segments, no wildcards.
///
/// # Errors
/// [`NameError`] saying what is wrong.
pub fn validate_topic(topic: &str) -> Result<(), NameError> {
    check_topic(topic, false)
}

/// Checks a subscription pattern: like a topic, plus `*` (one segment) and a final `>` (the rest).
///
/// # Errors
/// [`NameError`] saying what is wrong.
pub fn validate_topic_pattern(pattern: &str) -> Result<(), NameError> {
    check_topic(pattern, true)
}

/// NATS-style matching: `*` matches exactly one segment, a final `>` one or more.
pub fn topic_matches(pattern: &str, topic: &str) -> bool {
    let mut pat = pattern.split('.');
    let mut top = topic.split('.');
    loop {
        match (pat.next(), top.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(_)) => {}
            (Some(p), Some(t)) if p == t => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["Alice", "bob-2", "a.b_c", "9lives"] {
            validate_agent_name(ok).unwrap();
        }
        for bad in [
            "",
            "*",
            "-x",
            "a b",
            "a/b",
            "../x",
            "a\u{1b}[2J",
            "é",
            &"x".repeat(65),
        ] {
            assert!(validate_agent_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn topics_and_patterns() {
        validate_topic("build.linux").unwrap();
        assert!(validate_topic("build.*").is_err());
        assert!(validate_topic("a..b").is_err());
        validate_topic_pattern("build.*.x").unwrap();
        validate_topic_pattern("build.>").unwrap();
        assert!(validate_topic_pattern("build.>.x").is_err());
        assert!(validate_topic_pattern("bu*ld").is_err());
    }

    #[test]
    fn matching() {
        assert!(topic_matches("build.*", "build.linux"));
        assert!(!topic_matches("build.*", "build.linux.x86"));
        assert!(topic_matches("build.>", "build.linux.x86"));
        assert!(!topic_matches("build.>", "build"));
        assert!(topic_matches("*.linux", "build.linux"));
        assert!(topic_matches("review", "review"));
        assert!(!topic_matches("review", "reviews"));
        assert!(topic_matches(">", "anything.at.all"));
    }
}
