//! What the agent really wrote, from the transcript its CLI keeps, to tell a directive the
//! agent said from one it only quoted in a code block.
//!
//! Claude Code draws a fenced code block without its fences, and a block whose language
//! highlights nothing (```` ```text ````, ```` ```sh ```` with plain words in it; 2.1.197 also a
//! fence with no language) in the default colour, exactly like prose: on the screen, its
//! `@relay:` line cannot be told from a directive (fixtures `claude-fences-328`,
//! `claude-fences-197`). Claude Code also writes every reply, as Markdown, to a JSONL
//! transcript (`~/.claude/projects/<cwd with non-alphanumerics as ->/<session>.jsonl`). The
//! wrapper reads it (the I/O is the wrapper's; this module is pure) and asks
//! [`ReplySource::check`] about each directive found on the screen before sending it.

use std::collections::VecDeque;

use crate::scanner::Scanner;
use crate::screen::CommittedLine;
use crate::{Directive, Kind, Profile};

/// How many directives each of [`ReplySource`]'s lists remembers (the oldest go first).
const REMEMBERED: usize = 256;

/// The Markdown text of the agent's reply in one line of a Claude Code transcript: the `text`
/// blocks of an `assistant` entry of the main conversation, joined by blank lines. `None` for
/// every other entry (the person's prompts, tool results, thinking, sub-agents' side chains,
/// the CLI's own bookkeeping) and for a line that is not JSON.
pub fn claude_reply_text(line: &str) -> Option<String> {
    let entry: serde_json::Value = serde_json::from_str(line).ok()?;
    if entry.get("type")?.as_str()? != "assistant"
        || entry
            .get("isSidechain")
            .and_then(serde_json::Value::as_bool)
            == Some(true)
    {
        return None;
    }
    let content = entry.get("message")?.get("content")?;
    let texts: Vec<&str> = match content {
        serde_json::Value::String(s) => vec![s.as_str()],
        serde_json::Value::Array(blocks) => blocks
            .iter()
            .filter(|b| b.get("type").and_then(serde_json::Value::as_str) == Some("text"))
            .filter_map(|b| b.get("text").and_then(serde_json::Value::as_str))
            .collect(),
        _ => return None,
    };
    (!texts.is_empty()).then(|| texts.join("\n\n"))
}

/// The directives in Markdown text: those it says (outside fenced code) and those it only
/// quotes (the `@relay:` lines inside fenced code, and escaped ones, `\@relay:`, read as if
/// they were plain).
pub fn markdown_directives(markdown: &str) -> (Vec<Directive>, Vec<Directive>) {
    let said = scan(markdown, false);
    let mut quoted = scan(markdown, true);
    for d in &said {
        if let Some(i) = quoted.iter().position(|q| q == d) {
            quoted.remove(i);
        }
    }
    (said, quoted)
}

/// Scans `text` as plain lines; `open_fences`: fence lines count as blank lines, so that what
/// is inside a fence is read too.
fn scan(text: &str, open_fences: bool) -> Vec<Directive> {
    let mut scanner = Scanner::new(Profile::generic());
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        let fence = t.starts_with("```") || t.starts_with("~~~");
        let text = if !open_fences {
            line.to_owned()
        } else if fence {
            String::new()
        } else if let Some(unescaped) = t.strip_prefix('\\') {
            // `\@relay:` is Markdown for `@relay:`: Claude Code draws it without the
            // backslash, so on the screen it looks said. It is quoted.
            unescaped.to_owned()
        } else {
            line.to_owned()
        };
        let line = CommittedLine {
            row: i as u64,
            text,
            code: Vec::new(),
            seen: false,
            overflow: false,
        };
        scanner.line(&line, i as u64, &mut out);
    }
    scanner.flush(&mut out);
    out.into_iter().map(|f| f.directive).collect()
}

/// What a directive found on the screen is, according to the agent's own text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The reply says it (outside code): send it.
    Said,
    /// The reply shows it only inside a fenced code block: it is not a message.
    Quoted,
    /// Not in the text read so far (no transcript, not written yet, or drawn differently from
    /// its Markdown, e.g. with emphasis): the screen is all there is to go by.
    Unknown,
}

/// A directive, as compared between screen and transcript: its whitespace left out, since a
/// TUI wraps long lines (inside a word, too) and the scanner joins the rows with a space.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Key {
    to: String,
    kind: Kind,
    body: String,
}

impl Key {
    fn of(d: &Directive) -> Self {
        Self {
            to: d.to.as_str().to_owned(),
            kind: d.kind,
            body: d.body.chars().filter(|c| !c.is_whitespace()).collect(),
        }
    }
}

/// The directives the agent's replies said and quoted, as read from its transcript; each
/// answers [`ReplySource::check`] once (a reply that says and quotes the same line has it
/// sent once).
#[derive(Debug, Default)]
pub struct ReplySource {
    said: VecDeque<Key>,
    quoted: VecDeque<Key>,
}

impl ReplySource {
    /// Nothing read yet: every directive is [`Origin::Unknown`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Remembers the directives of one reply (its Markdown text).
    pub fn add_reply(&mut self, markdown: &str) {
        let (said, quoted) = markdown_directives(markdown);
        for (list, found) in [(&mut self.said, said), (&mut self.quoted, quoted)] {
            for d in &found {
                if list.len() == REMEMBERED {
                    list.pop_front();
                }
                list.push_back(Key::of(d));
            }
        }
    }

    /// Where `d`, found on the screen, comes from. A match is used up: the screen shows a
    /// line once per time the reply has it (re-prints are dropped by the parser before this).
    pub fn check(&mut self, d: &Directive) -> Origin {
        let key = Key::of(d);
        for (list, origin) in [
            (&mut self.said, Origin::Said),
            (&mut self.quoted, Origin::Quoted),
        ] {
            if let Some(i) = list.iter().position(|k| *k == key) {
                list.remove(i);
                return origin;
            }
        }
        Origin::Unknown
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Target;

    fn msg(to: &str, body: &str) -> Directive {
        Directive {
            to: Target::Agent(to.into()),
            kind: Kind::Message,
            body: body.into(),
            thread: None,
            data: None,
            truncated: false,
        }
    }

    #[test]
    fn fenced_lines_are_quoted_whatever_the_language() {
        let md = "Like this:\n\n```text\n@relay:Bob quoted\n```\n\n~~~\n@relay:Bob tilde\n~~~\n\n\
                  ```sh\n@relay:Bob shell\n```\n\n@relay:Carol said\n\n\\@relay:Bob escaped\n\nDone.";
        let (said, quoted) = markdown_directives(md);
        assert_eq!(said, [msg("Carol", "said")]);
        assert_eq!(
            quoted,
            [
                msg("Bob", "quoted"),
                msg("Bob", "tilde"),
                msg("Bob", "shell"),
                msg("Bob", "escaped")
            ]
        );
    }

    #[test]
    fn a_line_said_and_quoted_is_sent_once() {
        let mut src = ReplySource::new();
        src.add_reply("```text\n@relay:Bob hi\n```\n\n@relay:Bob hi");
        assert_eq!(src.check(&msg("Bob", "hi")), Origin::Said);
        assert_eq!(src.check(&msg("Bob", "hi")), Origin::Quoted);
        assert_eq!(src.check(&msg("Bob", "hi")), Origin::Unknown);
    }

    #[test]
    fn a_wrapped_line_matches_its_source() {
        let mut src = ReplySource::new();
        src.add_reply("```text\n@relay:Bob a long line wrapped inside aword\n```");
        assert_eq!(
            src.check(&msg("Bob", "a long line wrapped inside a word")),
            Origin::Quoted
        );
    }

    #[test]
    fn only_main_conversation_replies_are_read() {
        let reply = r#"{"type":"assistant","isSidechain":false,"message":{"content":[{"type":"thinking","thinking":"@relay:Bob no"},{"type":"text","text":"@relay:Bob yes"}]}}"#;
        assert_eq!(claude_reply_text(reply).as_deref(), Some("@relay:Bob yes"));
        let side = r#"{"type":"assistant","isSidechain":true,"message":{"content":[{"type":"text","text":"x"}]}}"#;
        assert_eq!(claude_reply_text(side), None);
        let user = r#"{"type":"user","message":{"content":"@relay:Bob typed"}}"#;
        assert_eq!(claude_reply_text(user), None);
        assert_eq!(claude_reply_text("{not json"), None);
    }
}
