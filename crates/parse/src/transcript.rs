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

/// The Markdown text of the agent's reply in one line of a Codex CLI session rollout
/// (`$CODEX_HOME/sessions/YYYY/MM/DD/rollout-*.jsonl`, 0.169.0): the `output_text` parts of a
/// `response_item` that is an `assistant` message. `None` for every other line (the session's
/// header, the person's and the developer's messages, events, the same reply repeated as an
/// `event_msg`) and for a line that is not JSON.
pub fn codex_reply_text(line: &str) -> Option<String> {
    let entry: serde_json::Value = serde_json::from_str(line).ok()?;
    if entry.get("type")?.as_str()? != "response_item" {
        return None;
    }
    let payload = entry.get("payload")?;
    if payload.get("type")?.as_str()? != "message" || payload.get("role")?.as_str()? != "assistant"
    {
        return None;
    }
    let texts: Vec<&str> = payload
        .get("content")?
        .as_array()?
        .iter()
        .filter(|b| b.get("type").and_then(serde_json::Value::as_str) == Some("output_text"))
        .filter_map(|b| b.get("text").and_then(serde_json::Value::as_str))
        .collect();
    (!texts.is_empty()).then(|| texts.concat())
}

/// Whether one line of a Codex rollout is a user message (a turn's prompt, or the context
/// Codex sends with it): a new turn has begun.
pub fn codex_user_turn(line: &str) -> bool {
    let Ok(entry) = serde_json::from_str::<serde_json::Value>(line) else {
        return false;
    };
    let payload = entry.get("payload");
    entry.get("type").and_then(serde_json::Value::as_str) == Some("response_item")
        && payload
            .and_then(|p| p.get("type"))
            .and_then(serde_json::Value::as_str)
            == Some("message")
        && payload
            .and_then(|p| p.get("role"))
            .and_then(serde_json::Value::as_str)
            == Some("user")
}

/// Whether one line of a Gemini CLI chat recording is the person's message: a new turn.
pub fn gemini_user_turn(line: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(line)
        .ok()
        .and_then(|e| {
            e.get("type")
                .and_then(serde_json::Value::as_str)
                .map(|t| t == "user")
        })
        .unwrap_or(false)
}

/// The Markdown text of the model's reply in one line of a Gemini CLI chat recording
/// (`~/.gemini/tmp/<project>/chats/session-*.jsonl`, 0.61.0): the `content` of a `gemini`
/// message (a string, or parts with `text`). `None` for every other line (the session's
/// header, `$set` updates, the person's messages) and for a line that is not JSON.
pub fn gemini_reply_text(line: &str) -> Option<String> {
    let entry: serde_json::Value = serde_json::from_str(line).ok()?;
    if entry.get("type")?.as_str()? != "gemini" {
        return None;
    }
    let text = match entry.get("content")? {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(serde_json::Value::as_str))
            .collect(),
        _ => return None,
    };
    (!text.is_empty()).then_some(text)
}

/// The directives in Markdown text: those it says (outside fenced code and block quotes) and
/// those it only quotes (the `@relay:` lines inside fenced code or a `>` block quote, and
/// escaped ones, `\@relay:`, read as if they were plain).
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
        // A Markdown block quote: Claude Code draws it as a quote (2.1.197: not as prose, so
        // the screen never sent it), and what the reply quotes it does not say.
        let quote = t.starts_with('>');
        let text = if quote {
            if open_fences {
                t.trim_start_matches(|c: char| c == '>' || c.is_whitespace())
                    .to_owned()
            } else {
                String::new()
            }
        } else if !open_fences {
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
#[derive(Debug, Clone, PartialEq)]
pub enum Origin {
    /// The reply says it (outside code): send it, as the reply wrote it. The screen's copy is
    /// only what the CLI drew of the Markdown (a code block without its fences, lines
    /// re-wrapped or re-indented, marks dropped); this one is the model's text, read with the
    /// same continuation rule, so a body's lines and indentation arrive byte for byte.
    Said(Directive),
    /// The reply shows it only inside a fenced code block: it is not a message.
    Quoted,
    /// Already sent from the transcript ([`ReplySource::take_unseen`]) before the screen
    /// showed it: sending it again would send it twice.
    Sent,
    /// Not in the text read so far (no transcript, not written yet, or drawn differently from
    /// its Markdown): the screen is all there is to go by. It is remembered as sent from the
    /// screen, so that the transcript, read later, does not send it again.
    Unknown,
}

/// Fewest letters and digits the shorter of two bodies needs for one being the start of the
/// other to count as the same directive (the screen can end a body earlier than its Markdown,
/// e.g. at a continuation line that starts with inline code).
const PREFIX_MATCH: usize = 24;

/// A directive, as compared between screen and transcript: only its letters and digits, since
/// a TUI wraps long lines (inside a word, too), the scanner joins the rows with a space, and
/// the screen shows Markdown without its marks (`**`, `` ` ``, `_`).
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
            body: d.body.chars().filter(|c| c.is_alphanumeric()).collect(),
        }
    }

    /// The same directive, or one body the start of the other, the shorter at least
    /// `min_prefix` letters and digits long (not to be chance).
    fn similar(&self, other: &Key, min_prefix: usize) -> bool {
        if self.to != other.to || self.kind != other.kind {
            return false;
        }
        let (a, b) = if self.body.len() <= other.body.len() {
            (&self.body, &other.body)
        } else {
            (&other.body, &self.body)
        };
        !a.is_empty() && a.chars().count() >= min_prefix && b.starts_with(a.as_str())
    }
}

/// Takes the entry matching `key` out of `list`: an equal one first, else a similar one.
fn take<T>(
    list: &mut VecDeque<T>,
    key: &Key,
    min_prefix: usize,
    of: impl Fn(&T) -> &Key,
) -> Option<T> {
    let i = list
        .iter()
        .position(|x| of(x) == key)
        .or_else(|| list.iter().position(|x| of(x).similar(key, min_prefix)))?;
    list.remove(i)
}

/// Appends to a bounded list (the oldest goes first).
fn push<T>(list: &mut VecDeque<T>, item: T) {
    if list.len() == REMEMBERED {
        list.pop_front();
    }
    list.push_back(item);
}

/// A directive a reply says, not seen on the screen yet.
#[derive(Debug)]
struct Said {
    key: Key,
    directive: Directive,
    /// Written after the wrapper started: sent from the transcript if the screen never shows
    /// it. (What a resumed session said before is only used to judge what the screen shows.)
    sendable: bool,
}

/// The directives the agent's replies said and quoted, as read from its transcript, and what
/// was sent from where: each directive a reply says is sent once, from the screen when the
/// screen shows it, else from the transcript (a reply taller than the screen: Claude Code
/// draws only its last screenful of a reply that arrives at once).
#[derive(Debug)]
pub struct ReplySource {
    /// Fewest letters and digits a body the start of another needs to match it.
    min_prefix: usize,
    said: VecDeque<Said>,
    quoted: VecDeque<Key>,
    /// Sent from the screen before the transcript had them.
    screen_sent: VecDeque<Key>,
    /// Sent from the transcript before the screen showed them.
    transcript_sent: VecDeque<Key>,
    /// Whether a directive the screen shows again after it went with the reply's text is a
    /// re-print ([`ReplySource::dropping_reprints`]).
    drop_reprints: bool,
    /// Sent with the reply's text ([`Origin::Said`]), while re-prints are dropped.
    said_sent: VecDeque<Key>,
}

impl Default for ReplySource {
    fn default() -> Self {
        Self::with_min_prefix(PREFIX_MATCH)
    }
}

impl ReplySource {
    /// Nothing read yet: every directive is [`Origin::Unknown`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Like [`ReplySource::new`], with a screen's body that is the start of a reply's (or the
    /// other way round) matching it from `min_prefix` letters and digits on (at least one).
    /// Codex CLI ends a directive with an indented block under it after its first line (it
    /// draws the block at the directive's own indentation), often shorter than the default
    /// 24; its wrapper asks only about directives the screen showed, each once, so a short
    /// start is enough there.
    pub fn with_min_prefix(min_prefix: usize) -> Self {
        Self {
            min_prefix: min_prefix.max(1),
            said: VecDeque::new(),
            quoted: VecDeque::new(),
            screen_sent: VecDeque::new(),
            transcript_sent: VecDeque::new(),
            drop_reprints: false,
            said_sent: VecDeque::new(),
        }
    }

    /// A directive the screen shows again after it was sent with a reply's text, which no
    /// later reply read since has, is taken for a re-print of it ([`Origin::Sent`]), not sent
    /// again. For a CLI whose record has every reply once its output went quiet (Codex,
    /// Gemini: their wrapper waits that long before it asks), so a second directive of the
    /// same text in a later reply is in the record by then; Codex 0.169.0 was once seen
    /// drawing a directive a second time at the end of a long reply.
    pub fn dropping_reprints(mut self) -> Self {
        self.drop_reprints = true;
        self
    }

    /// A new turn began (a prompt was submitted: the wrapper's typed message, a person's
    /// line, or the record's next user message): a directive the screen shows from now on is a
    /// new print, not a re-print of one sent with an earlier reply's text. Re-prints (Codex
    /// drawing a directive again at the end of a long reply) happen within their turn; an
    /// agent that says the same line in two turns means it twice (issue 23.17).
    ///
    /// Directives the screen sent that the record still lacks are forgotten too: the caller
    /// has read the record first, and an earlier turn's reply it never had (a record that
    /// lags or lost it) would otherwise take a later turn's reply of the same text for itself,
    /// leaving that turn's directive, and its re-print, to the screen alone.
    /// Only with [`ReplySource::dropping_reprints`]: Claude Code's record sends what the screen
    /// never showed, so forgetting what the screen sent would send it again from there.
    pub fn new_turn(&mut self) {
        if self.drop_reprints {
            self.said_sent.clear();
            self.screen_sent.clear();
        }
    }

    /// The record has a new prompt (read in order with the replies): directives sent with an
    /// earlier reply's text are no longer re-printed. What the screen sent before the record
    /// had it stays: this turn's reply may follow the prompt in the record.
    pub fn prompt_recorded(&mut self) {
        self.said_sent.clear();
    }

    /// Remembers the directives of one reply (its Markdown text), written while the wrapper
    /// runs: what the screen does not show is sent from here ([`ReplySource::take_unseen`]).
    pub fn add_reply(&mut self, markdown: &str) {
        self.add(markdown, true);
    }

    /// Remembers the directives of a reply written before the wrapper started (a resumed
    /// session): only to judge what the screen shows again, never sent from here.
    pub fn add_history(&mut self, markdown: &str) {
        self.add(markdown, false);
    }

    fn add(&mut self, markdown: &str, sendable: bool) {
        let (said, quoted) = markdown_directives(markdown);
        for d in said {
            let key = Key::of(&d);
            // The screen was faster: already sent.
            if take(&mut self.screen_sent, &key, self.min_prefix, |k| k).is_some() {
                continue;
            }
            push(
                &mut self.said,
                Said {
                    key,
                    directive: d,
                    sendable,
                },
            );
        }
        for d in quoted {
            let key = Key::of(&d);
            // Sent from the screen before it was known to be quoted: too late to take back.
            if take(&mut self.screen_sent, &key, self.min_prefix, |k| k).is_some() {
                continue;
            }
            push(&mut self.quoted, key);
        }
    }

    /// Where `d`, found on the screen, comes from. A match is used up: the screen shows a
    /// line once per time the reply has it (re-prints are dropped by the parser before this).
    /// The caller sends the directive `Said` carries (in place of `d`) and `d` when
    /// `Unknown`, and nothing else: each directive once, with the reply's own text when the
    /// transcript has it.
    pub fn check(&mut self, d: &Directive) -> Origin {
        let key = Key::of(d);
        if let Some(said) = take(&mut self.said, &key, self.min_prefix, |s| &s.key) {
            if self.drop_reprints {
                push(&mut self.said_sent, said.key);
            }
            return Origin::Said(said.directive);
        }
        if take(&mut self.quoted, &key, self.min_prefix, |k| k).is_some() {
            return Origin::Quoted;
        }
        if take(&mut self.transcript_sent, &key, self.min_prefix, |k| k).is_some()
            || take(&mut self.said_sent, &key, self.min_prefix, |k| k).is_some()
        {
            return Origin::Sent;
        }
        push(&mut self.screen_sent, key);
        Origin::Unknown
    }

    /// Whether the replies read so far have `d` (said, quoted or sent from here), so that
    /// [`ReplySource::check`] would answer from them rather than [`Origin::Unknown`]. Changes
    /// nothing: the wrapper asks this while it waits a moment for the transcript to catch up
    /// with the screen.
    pub fn knows(&self, d: &Directive) -> bool {
        let key = Key::of(d);
        let has = |k: &Key| k == &key || k.similar(&key, self.min_prefix);
        self.said.iter().any(|s| has(&s.key))
            || self.quoted.iter().any(has)
            || self.transcript_sent.iter().any(has)
    }

    /// The directives replies said that the screen has not shown (yet), to be sent now; each
    /// is remembered, so that the screen showing it later does not send it again.
    pub fn take_unseen(&mut self) -> Vec<Directive> {
        let mut out = Vec::new();
        let mut kept = VecDeque::new();
        for s in self.said.drain(..) {
            if s.sendable {
                push(&mut self.transcript_sent, s.key);
                out.push(s.directive);
            } else {
                kept.push_back(s);
            }
        }
        self.said = kept;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Target;

    fn msg(to: &str, body: &str) -> Directive {
        Directive::message(Target::Agent(to.into()), body)
    }

    #[test]
    fn fenced_lines_are_quoted_whatever_the_language() {
        let md = "Like this:\n\n```text\n@relay:Bob quoted\n```\n\n~~~\n@relay:Bob tilde\n~~~\n\n\
                  ```sh\n@relay:Bob shell\n```\n\n@relay:Carol said\n\n\\@relay:Bob escaped\n\n\
                  > @relay:Bob in a block quote\n\nDone.";
        let (said, quoted) = markdown_directives(md);
        assert_eq!(said, [msg("Carol", "said")]);
        assert_eq!(
            quoted,
            [
                msg("Bob", "quoted"),
                msg("Bob", "tilde"),
                msg("Bob", "shell"),
                msg("Bob", "escaped"),
                msg("Bob", "in a block quote")
            ]
        );
    }

    #[test]
    fn a_line_said_and_quoted_is_sent_once() {
        let mut src = ReplySource::new();
        src.add_reply("```text\n@relay:Bob hi\n```\n\n@relay:Bob hi");
        assert_eq!(src.check(&msg("Bob", "hi")), Origin::Said(msg("Bob", "hi")));
        assert_eq!(src.check(&msg("Bob", "hi")), Origin::Quoted);
        assert_eq!(src.check(&msg("Bob", "hi")), Origin::Unknown);
    }

    #[test]
    fn each_said_directive_is_sent_once_from_screen_or_transcript() {
        let mut src = ReplySource::new();
        // The screen shows the last one before the transcript is written: sent from there.
        assert_eq!(src.check(&msg("Bob", "last")), Origin::Unknown);
        src.add_reply("@relay:Bob first, lost off the screen\n\nfiller\n\n@relay:Bob **last**");
        // Only the one the screen never showed is left to send.
        assert_eq!(
            src.take_unseen(),
            [msg("Bob", "first, lost off the screen")]
        );
        assert_eq!(src.take_unseen(), []);
        // A re-print shows it after all: not sent again.
        assert_eq!(
            src.check(&msg("Bob", "first, lost off the screen")),
            Origin::Sent
        );
        // Said again in a later reply, seen on the screen first: sent again.
        assert_eq!(src.check(&msg("Bob", "last")), Origin::Unknown);
    }

    /// The re-print guard drops a directive shown again within its turn, and sends one an
    /// agent says again in a later turn even when the record has not caught up with it: a
    /// genuine repeat is not a redraw (issue 23.17).
    #[test]
    fn a_repeat_in_a_new_turn_is_sent_and_a_reprint_in_the_same_turn_is_not() {
        let mut src = ReplySource::with_min_prefix(1).dropping_reprints();
        src.add_reply("@relay:Bob the same line");
        let d = msg("Bob", "the same line");
        assert_eq!(src.check(&d), Origin::Said(d.clone()));
        // Drawn again at the end of the same reply: a re-print.
        assert_eq!(src.check(&d), Origin::Sent);
        // Said again, turn after turn, before the record has the new reply.
        src.new_turn();
        assert_eq!(src.check(&d), Origin::Unknown);
        // The record catches up: the screen sent it already.
        src.add_reply("@relay:Bob the same line");
        assert_eq!(src.take_unseen(), []);
        assert!(!src.knows(&d));
        // Sent by the screen in a turn the record never has: the next turn's reply of the
        // same text is that turn's, and its re-print is one.
        src.new_turn();
        assert_eq!(src.check(&d), Origin::Unknown);
        src.new_turn();
        src.prompt_recorded();
        src.add_reply("@relay:Bob the same line");
        assert_eq!(src.check(&d), Origin::Said(d.clone()));
        assert_eq!(src.check(&d), Origin::Sent);
    }

    #[test]
    fn a_new_turn_forgets_nothing_claude_codes_record_would_send_again() {
        let mut src = ReplySource::new();
        let d = msg("Bob", "sent by the screen before the transcript had it");
        assert_eq!(src.check(&d), Origin::Unknown);
        src.new_turn();
        src.add_reply("@relay:Bob sent by the screen before the transcript had it");
        assert_eq!(src.take_unseen(), []);
    }

    #[test]
    fn user_lines_of_codex_and_gemini_records_are_new_turns() {
        assert!(codex_user_turn(
            r#"{"type":"response_item","payload":{"type":"message","role":"user","content":[]}}"#
        ));
        assert!(!codex_user_turn(
            r#"{"type":"response_item","payload":{"type":"message","role":"assistant","content":[]}}"#
        ));
        assert!(!codex_user_turn(
            r#"{"type":"session_meta","payload":{"cwd":"/w"}}"#
        ));
        assert!(!codex_user_turn("not json"));
        assert!(gemini_user_turn(r#"{"type":"user","content":"hi"}"#));
        assert!(!gemini_user_turn(r#"{"type":"gemini","content":"hi"}"#));
    }

    #[test]
    fn history_is_never_sent_from_the_transcript() {
        let mut src = ReplySource::new();
        src.add_history("@relay:Bob old");
        assert_eq!(src.take_unseen(), []);
        assert_eq!(
            src.check(&msg("Bob", "old")),
            Origin::Said(msg("Bob", "old"))
        );
    }

    #[test]
    fn a_body_the_screen_ended_early_is_the_same_directive() {
        let mut src = ReplySource::new();
        assert_eq!(
            src.check(&msg("Bob", "please review the parser changes in")),
            Origin::Unknown
        );
        src.add_reply("@relay:Bob please review the parser changes in\n`crates/parse` today");
        assert_eq!(src.take_unseen(), []);
    }

    /// What the screen shows of a directive with a code block under it is what Claude Code
    /// drew (re-indented, a long line wrapped, marks dropped); the reply's own text is what
    /// is sent.
    #[test]
    fn a_said_directive_carries_the_replys_own_text() {
        let mut src = ReplySource::new();
        let body = "the fix:\n    fn main() {\n        let p = **q; // a long comment here\n    }";
        src.add_reply(&format!("Sending it.\n\n@relay:Bob {body}\n\nDone."));
        let drawn = msg(
            "Bob",
            "the fix: fn main() { let p = q; // a long comment\n  here }",
        );
        assert_eq!(src.check(&drawn), Origin::Said(msg("Bob", body)));
        assert_eq!(src.take_unseen(), []);
        assert_eq!(src.check(&drawn), Origin::Unknown);
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

    /// Codex draws only a directive's first line when an indented block follows it: held until
    /// the rollout has it, the screen's short copy matches the reply's and carries its text.
    #[test]
    fn a_short_start_matches_with_a_small_min_prefix() {
        let body = "Here is the fix:\n    fn main() {}";
        let mut src = ReplySource::with_min_prefix(1);
        src.add_reply(&format!("@relay:Bob {body}"));
        assert!(src.knows(&msg("Bob", "Here is the fix:")));
        assert_eq!(
            src.check(&msg("Bob", "Here is the fix:")),
            Origin::Said(msg("Bob", body))
        );
        // Sent from the screen first (no rollout in time): the rollout's copy is not kept.
        assert_eq!(src.check(&msg("Bob", "Next:")), Origin::Unknown);
        src.add_reply("@relay:Bob Next:\n    more");
        assert!(!src.knows(&msg("Bob", "Next:")));
        // The default needs 24 letters and digits.
        let mut src = ReplySource::new();
        src.add_reply(&format!("@relay:Bob {body}"));
        assert!(!src.knows(&msg("Bob", "Here is the fix:")));
    }

    /// Dropping re-prints: the screen showing a directive again after it went with the
    /// reply's text is not sent again; a later reply saying it again is.
    #[test]
    fn a_reprint_after_the_replys_text_went_is_not_sent_again() {
        let mut src = ReplySource::with_min_prefix(1).dropping_reprints();
        src.add_reply("@relay:Bob Here:\n    x()");
        assert_eq!(
            src.check(&msg("Bob", "Here:")),
            Origin::Said(msg("Bob", "Here:\n    x()"))
        );
        assert!(!src.knows(&msg("Bob", "Here:")));
        assert_eq!(src.check(&msg("Bob", "Here:")), Origin::Sent);
        // Once: a third showing with no reply saying it is the screen's own.
        assert_eq!(src.check(&msg("Bob", "Here:")), Origin::Unknown);
        src.add_reply("@relay:Bob Here:\n    y()");
        src.add_reply("@relay:Bob Here:\n    z()");
        assert_eq!(
            src.check(&msg("Bob", "Here:")),
            Origin::Said(msg("Bob", "Here:\n    z()"))
        );
        // Without it (Claude Code), each showing the transcript lacks goes.
        let mut src = ReplySource::new();
        src.add_reply("@relay:Bob a directive long enough to match by its start");
        assert!(matches!(
            src.check(&msg("Bob", "a directive long enough to match by its start")),
            Origin::Said(_)
        ));
        assert_eq!(
            src.check(&msg("Bob", "a directive long enough to match by its start")),
            Origin::Unknown
        );
    }

    #[test]
    fn codex_and_gemini_replies_are_read() {
        let codex = r#"{"type":"response_item","payload":{"type":"message","role":"assistant","content":[{"type":"output_text","text":"@relay:Bob **hi**"}]}}"#;
        assert_eq!(
            codex_reply_text(codex).as_deref(),
            Some("@relay:Bob **hi**")
        );
        let user = r#"{"type":"response_item","payload":{"type":"message","role":"user","content":[{"type":"input_text","text":"@relay:Bob typed"}]}}"#;
        assert_eq!(codex_reply_text(user), None);
        let event = r#"{"type":"event_msg","payload":{"type":"task_complete","last_agent_message":"@relay:Bob hi"}}"#;
        assert_eq!(codex_reply_text(event), None);
        let gemini = r#"{"id":"1","type":"gemini","content":"@relay:Bob __init__","thoughts":[]}"#;
        assert_eq!(
            gemini_reply_text(gemini).as_deref(),
            Some("@relay:Bob __init__")
        );
        let parts = r#"{"id":"2","type":"gemini","content":[{"text":"a"},{"text":"b"}]}"#;
        assert_eq!(gemini_reply_text(parts).as_deref(), Some("ab"));
        let user = r#"{"id":"3","type":"user","content":[{"text":"@relay:Bob typed"}]}"#;
        assert_eq!(gemini_reply_text(user), None);
        assert_eq!(gemini_reply_text(r#"{"$set":{"lastUpdated":"x"}}"#), None);
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
