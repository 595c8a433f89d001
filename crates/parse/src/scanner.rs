//! The directive scanner: a line-oriented state machine over final screen rows.
//!
//! It keeps the state that spans lines (fenced code, `<thinking>` blocks, a `[[RELAY]]` block
//! being collected, a directive whose body continues on the next lines, the echo of injected
//! text) and turns lines into [`Found`] directives. It never sees a row twice unless the
//! screen showed it twice; that case is the business of [`crate::dedupe`].

use std::collections::VecDeque;

use relay_protocol::Kind;

use crate::screen::CommittedLine;
use crate::{Directive, Profile, Target};

/// Longest body kept for an inline directive, in bytes; continuation stops there.
pub(crate) const MAX_BODY: usize = 16 * 1024;
/// Largest `[[RELAY]]` block, in bytes; a larger one is reported cut (if its target can be
/// read from its start) and never sent.
pub(crate) const MAX_BLOCK: usize = 64 * 1024;
/// Most lines a `[[RELAY]]` block may span.
const MAX_BLOCK_LINES: u32 = 400;
/// Most lines a `<thinking>` block or a code fence may hide before it is taken as unclosed.
const MAX_HIDDEN_LINES: u32 = 2000;
/// How many injected texts are remembered for echo suppression.
const MAX_INJECTED: usize = 16;

const OPEN_BLOCK: &str = "[[RELAY]]";
const CLOSE_BLOCK: &str = "[[/RELAY]]";
const ALIASES: [(&str, Kind); 4] = [
    ("@relay:", Kind::Message),
    ("@thinking:", Kind::Thinking),
    ("->relay:", Kind::Message),
    ("->thinking:", Kind::Thinking),
];

/// A directive and where it started.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Found {
    pub(crate) directive: Directive,
    /// Absolute screen row of its first line.
    pub(crate) row: u64,
    /// Commit sequence number of its first line.
    pub(crate) seq: u64,
}

// One per scanner (the directive being read), so its size costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Pending {
    None,
    Inline {
        found: Found,
        /// The directive's line start (its leading whitespace; a TUI's `● ` is on the line):
        /// a line indented deeper, or a list item at least as deep, continues it.
        indent: usize,
        /// Column where the directive's text starts (after decoration): the lines of its body
        /// keep their indentation relative to it.
        text_col: usize,
        /// Length in cells of the last row read into it, to tell a row the TUI wrapped.
        last_len: usize,
    },
    /// The echo of text the relay injected: swallowed like a directive's continuation.
    Echo {
        indent: usize,
    },
}

#[derive(Debug)]
struct Block {
    text: String,
    lines: u32,
    row: u64,
    seq: u64,
}

/// Scanner state between lines.
#[derive(Debug)]
pub(crate) struct Scanner {
    profile: Profile,
    fence: Option<u32>,
    thinking: Option<u32>,
    pending: Pending,
    block: Option<Block>,
    injected: VecDeque<String>,
    /// The terminal's width, when the wrapper or `parse --cols` said it.
    cols: Option<usize>,
}

/// How a line continues a directive's body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Join {
    /// A new line of the body (deeper indentation, a list item): the line break is kept.
    Line,
    /// The rest of a row the TUI wrapped: joined with a space, as it was written.
    Wrap,
}

/// Cells a TUI may leave free at the right edge when it wraps (its margins and padding, and
/// a word that did not fit): a row this close to the width is taken as wrapped.
const WRAP_SLACK: usize = 8;

/// What a line looks like, computed once.
struct Shape<'a> {
    text: &'a str,
    /// Leading whitespace, in cells.
    indent: usize,
    /// The text after decoration.
    rest: &'a str,
    /// Character index where `rest` starts.
    rest_idx: usize,
    blank: bool,
}

fn is_decoration(c: char) -> bool {
    c.is_whitespace()
        || matches!(
            c,
            '>' | '$'
                | '%'
                | '#'
                | '●'
                | '•'
                | '◦'
                | '‣'
                | '⁃'
                | '-'
                | '*'
                | '⏺'
                | '◆'
                | '◇'
                | '○'
                | '□'
                | '■'
                | '→'
                | '➜'
                | '›'
                | '»'
                | '✦'
                | '│'
                | '┃'
        )
}

fn shape(text: &str) -> Shape<'_> {
    let indent = text.chars().take_while(|&c| is_margin(c)).count();
    let mut rest_idx = 0;
    let mut rest = text;
    loop {
        if ALIASES[2..].iter().any(|(p, _)| rest.starts_with(p)) {
            break;
        }
        let mut chars = rest.chars();
        match chars.next() {
            Some(c) if is_decoration(c) => {
                rest = chars.as_str();
                rest_idx += 1;
            }
            _ => break,
        }
    }
    Shape {
        text,
        indent,
        rest,
        rest_idx,
        blank: rest.chars().all(is_margin),
    }
}

/// Whitespace and the vertical bars of a box drawn around text.
fn is_margin(c: char) -> bool {
    c.is_whitespace() || c == '│' || c == '┃'
}

/// Lines that start a new turn or a new element of a TUI: they end any continuation.
fn is_prompt(text: &str) -> bool {
    let t = text.trim_start();
    if t.starts_with('❯')
        || t.starts_with(">>> ")
        || t == ">>>"
        || t.starts_with("$ ")
        || t.starts_with("% ")
        || t.starts_with("> ")
    {
        return true;
    }
    // A shell prompt like `user@host:~/dir$ cmd`.
    let first = t.split_whitespace().next().unwrap_or("");
    first.len() > 1 && first.ends_with(['$', '#', '%']) && first.contains(['@', ':', '~', '/'])
}

/// TUI markers that begin a new element (message bullet, spinner, tool result).
fn is_marker_line(text: &str) -> bool {
    matches!(
        text.trim_start().chars().next(),
        Some(
            '●' | '⏺'
                | '✦'
                | '✻'
                | '✶'
                | '✳'
                | '✢'
                | '✽'
                | '·'
                | '⎿'
                | '└'
                | '❯'
                | '╭'
                | '╰'
                | '─'
        )
    )
}

fn is_fence(text: &str) -> bool {
    let t = text.trim_start_matches(is_margin);
    t.starts_with("```") || t.starts_with("~~~")
}

fn is_list_item(text: &str) -> bool {
    let t = text.trim_start();
    if t.starts_with("- ") || t.starts_with("* ") || t.starts_with("• ") {
        return true;
    }
    let digits = t.chars().take_while(char::is_ascii_digit).count();
    digits > 0 && (t[digits..].starts_with(". ") || t[digits..].starts_with(") "))
}

fn is_echo_start(rest: &str) -> bool {
    rest.trim_start_matches(['❯', ' '])
        .starts_with("Relay message from")
}

fn starts_directive(rest: &str) -> bool {
    ALIASES.iter().any(|(p, _)| rest.starts_with(p))
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn parse_target(name: &str) -> Option<Target> {
    let name = name.strip_suffix(':').unwrap_or(name);
    if name == "*" {
        Some(Target::Broadcast)
    } else if let Some(topic) = name.strip_prefix('#') {
        // `@relay:#build.linux`: the subscribers of a topic (never an agent's name, which
        // has no `#`).
        relay_protocol::validate_topic(topic)
            .is_ok()
            .then(|| Target::Topic(name.to_string()))
    } else if valid_name(name) {
        Some(Target::Agent(name.to_string()))
    } else {
        None
    }
}

/// `@relay:NAME body` (or an alias) at the start of `rest`.
fn parse_inline(rest: &str) -> Option<(Kind, Target, &str)> {
    let (kind, after) = ALIASES
        .iter()
        .find_map(|(p, k)| rest.strip_prefix(p).map(|a| (*k, a)))?;
    let end = after.find(char::is_whitespace).unwrap_or(after.len());
    let to = parse_target(&after[..end])?;
    let body = after[end..].trim_matches(is_margin);
    if body.is_empty() {
        return None;
    }
    Some((kind, to, body))
}

/// The JSON of a `[[RELAY]]` block, or why it is not a valid directive (a sentence for the
/// agent).
fn parse_block(json: &str) -> Result<Directive, String> {
    let value: serde_json::Value =
        serde_json::from_str(json.trim()).map_err(|e| format!("its JSON does not parse ({e})"))?;
    let obj = value
        .as_object()
        .ok_or("it is not a JSON object ({\"to\": NAME, \"body\": TEXT})")?;
    // A team verb instead of `to` (shared DESIGN.md §13): never a message to an agent named
    // after the verb.
    if !obj.contains_key("to")
        && let Some(pattern) = obj.get("subscribe")
    {
        let pattern = pattern
            .as_str()
            .filter(|p| relay_protocol::validate_topic_pattern(p).is_ok())
            .ok_or("its \"subscribe\" is not a topic pattern (build.linux, build.*, build.>)")?;
        return Ok(Directive {
            subscribe: Some(pattern.to_owned()),
            ..Directive::message(Target::Broadcast, "")
        });
    }
    if !obj.contains_key("to")
        && let Some(verb) = team_verb(obj)?
    {
        return Ok(Directive {
            team: Some(Box::new(verb)),
            ..Directive::message(Target::Broadcast, "")
        });
    }
    if !obj.contains_key("to")
        && let Some((verb, paths)) = obj
            .get("claim")
            .map(|p| ("claim", p))
            .or_else(|| obj.get("unclaim").map(|p| ("unclaim", p)))
    {
        return claim_block(obj, verb, paths);
    }
    let to = obj
        .get("to")
        .ok_or("it has no \"to\"")?
        .as_str()
        .ok_or("its \"to\" is not a string")?;
    let to = parse_target(to).ok_or_else(|| not_a_name(to))?;
    let kind = match obj.get("type") {
        None => Kind::Message,
        Some(t) => t
            .as_str()
            .and_then(Kind::parse)
            .ok_or("its \"type\" is not one the relay knows (message, action, state, thinking)")?,
    };
    let body = obj
        .get("body")
        .or_else(|| obj.get("text"))
        .and_then(|b| b.as_str())
        .unwrap_or("");
    let data = obj.get("data").filter(|d| !d.is_null()).cloned();
    if body.trim().is_empty() && data.is_none() {
        return Err("it has no \"body\" (nor \"data\")".to_owned());
    }
    let thread = match obj.get("thread") {
        None | Some(serde_json::Value::Null) => None,
        Some(t) => Some(
            t.as_str()
                .ok_or("its \"thread\" is not a string")?
                .to_string(),
        ),
    };
    Ok(Directive {
        to,
        kind,
        body: body.trim().to_string(),
        thread,
        data,
        truncated: false,
        malformed: None,
        subscribe: None,
        team: None,
        claim: None,
    })
}

/// A `{"spawn": ...}` or `{"release": ...}` block (issue 25.4), or why it is not one (a
/// sentence for the agent); `None` for a block that is neither.
fn team_verb(
    obj: &serde_json::Map<String, serde_json::Value>,
) -> Result<Option<crate::TeamVerb>, String> {
    if let Some(spawn) = obj.get("spawn") {
        let spawn = spawn.as_object().ok_or(
            "its \"spawn\" is not an object ({\"command\": [\"claude\"], \"task\": TEXT})",
        )?;
        let command: Vec<String> = match spawn.get("command") {
            Some(serde_json::Value::String(s)) => s.split_whitespace().map(str::to_owned).collect(),
            Some(serde_json::Value::Array(a)) => a
                .iter()
                .map(|w| w.as_str().map(str::to_owned))
                .collect::<Option<_>>()
                .ok_or("its \"command\" has a word that is not a string")?,
            _ => Vec::new(),
        };
        if command.is_empty() {
            return Err(
                "its \"spawn\" has no \"command\" (the worker's CLI, e.g. [\"claude\"])".into(),
            );
        }
        let text = |k: &str| -> Result<Option<String>, String> {
            match spawn.get(k) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(v) => v
                    .as_str()
                    .map(|s| Some(s.to_owned()))
                    .ok_or_else(|| format!("its \"{k}\" is not a string")),
            }
        };
        let name = text("name")?;
        if let Some(n) = &name {
            relay_protocol::validate_agent_name(n).map_err(|e| format!("its \"name\": {e}"))?;
        }
        return Ok(Some(crate::TeamVerb::Spawn {
            command,
            task: text("task")?.filter(|t| !t.trim().is_empty()),
            name,
            worktree: spawn.get("worktree").and_then(serde_json::Value::as_bool) == Some(true),
            notify_idle: spawn.get("notify").and_then(serde_json::Value::as_str) == Some("idle"),
        }));
    }
    if let Some(release) = obj.get("release") {
        let (name, now) = match release {
            serde_json::Value::String(n) => (n.as_str(), false),
            serde_json::Value::Object(o) => (
                o.get("name")
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or(""),
                o.get("now").and_then(serde_json::Value::as_bool) == Some(true),
            ),
            _ => ("", false),
        };
        relay_protocol::validate_agent_name(name)
            .map_err(|e| format!("its \"release\" names no worker ({e})"))?;
        return Ok(Some(crate::TeamVerb::Release {
            name: name.to_owned(),
            now,
        }));
    }
    Ok(None)
}

/// A `{"claim": PATHS, "for"?: DURATION}` or `{"unclaim": PATHS}` block (issue 25.7): PATHS
/// is one path or a list (empty for `unclaim`: all of the agent's).
fn claim_block(
    obj: &serde_json::Map<String, serde_json::Value>,
    verb: &str,
    paths: &serde_json::Value,
) -> Result<Directive, String> {
    let release = verb == "unclaim";
    let bad = || {
        format!("its \"{verb}\" is not a path or a list of paths ([\"src/auth.rs\", \"src/db/\"])")
    };
    let paths: Vec<String> = match paths {
        serde_json::Value::String(p) => vec![p.clone()],
        serde_json::Value::Array(ps) => ps
            .iter()
            .map(|p| p.as_str().map(str::to_owned))
            .collect::<Option<_>>()
            .ok_or_else(bad)?,
        _ => return Err(bad()),
    };
    if paths.is_empty() && !release {
        return Err("its \"claim\" names no path".into());
    }
    let for_ms = match obj.get("for") {
        None => None,
        Some(d) => Some(
            d.as_str()
                .and_then(duration_ms)
                .ok_or("its \"for\" is not a duration (\"90s\", \"30m\", \"2h\")")?,
        ),
    };
    Ok(Directive {
        claim: Some(Box::new(crate::ClaimVerb {
            paths,
            for_ms,
            release,
        })),
        ..Directive::message(Target::Broadcast, "")
    })
}

/// `90s`, `30m`, `2h` in ms (the one reading of durations, `relay_protocol`'s); zero is none.
fn duration_ms(s: &str) -> Option<u64> {
    relay_protocol::clock::parse_duration_ms(s).filter(|&ms| ms > 0)
}

/// Why `written` is no recipient, for the agent.
fn not_a_name(written: &str) -> String {
    let shown: String = written.chars().take(40).collect();
    let other = if written.contains(':') {
        " (an agent of another project or relay is not addressed with a prefix)"
    } else {
        ""
    };
    format!(
        "{shown:?} is not a name{other}: a name is letters, digits, '-', '_' and '.', or * for \
         everyone, or # and a topic (#build.linux) for its subscribers"
    )
}

/// What starts like an inline directive (`@relay:` or an alias) at the start of `rest` but is
/// not one (see [`Directive::malformed`]). A bare `@relay:` or `@relay:NAME` with no message
/// is not reported (nothing was lost).
fn malformed_inline(rest: &str) -> Option<Directive> {
    let (prefix, after) = ALIASES
        .iter()
        .find_map(|(p, _)| rest.strip_prefix(p).map(|a| (*p, a)))?;
    let end = after.find(char::is_whitespace).unwrap_or(after.len());
    let (written, body) = (&after[..end], after[end..].trim_matches(is_margin));
    let line: String = rest.chars().take(60).collect();
    let why = if written.is_empty() {
        if body.is_empty() {
            return None;
        }
        format!("no name right after {prefix}")
    } else if parse_target(written).is_none() {
        not_a_name(written)
    } else {
        return None;
    };
    let why = format!(
        "your message {line:?} was not sent: {why}. Write {prefix}NAME and the message on one \
         line"
    );
    Some(Directive::malformed(written, line, why))
}

/// The target of a `[[RELAY]]` block too big to parse whole: its `"to"` string, read from the
/// block's start.
fn block_target(json: &str) -> Option<Target> {
    let at = json.find("\"to\"")?;
    let rest = json[at + 4..].trim_start().strip_prefix(':')?.trim_start();
    let rest = rest.strip_prefix('"')?;
    parse_target(&rest[..rest.find('"')?])
}

/// The longest start of `text` of at most `max` bytes, cut at a character boundary.
fn cut_to(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    &text[..cut]
}

fn normalize(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

impl Scanner {
    pub(crate) fn new(profile: Profile) -> Self {
        Self {
            profile,
            fence: None,
            thinking: None,
            pending: Pending::None,
            block: None,
            injected: VecDeque::new(),
            cols: None,
        }
    }

    /// The terminal's width, for telling rows a TUI wrapped from lines it wrote.
    pub(crate) fn set_cols(&mut self, cols: usize) {
        self.cols = Some(cols);
    }

    /// Whether a row of `last_len` cells followed by `s` is one line the TUI wrapped: the
    /// next row's first word would not have fitted after it.
    fn wrapped(&self, last_len: usize, s: &Shape<'_>) -> bool {
        if !self.profile.hard_wraps() {
            // The terminal wraps for the program; the screen keeps such a line as one row.
            return false;
        }
        let Some(width) = self.cols else {
            // Width unknown: any row may have been wrapped (the rule before widths were known).
            return true;
        };
        let word = s
            .text
            .trim_start_matches(is_margin)
            .chars()
            .take_while(|c| !c.is_whitespace())
            .count();
        last_len + 1 + word + WRAP_SLACK > width
    }

    /// Bytes held between lines (for the memory bound).
    pub(crate) fn buffered_bytes(&self) -> usize {
        let pending = match &self.pending {
            Pending::Inline { found, .. } => found.directive.body.capacity(),
            _ => 0,
        };
        let block = self.block.as_ref().map_or(0, |b| b.text.capacity());
        let injected: usize = self.injected.iter().map(String::capacity).sum();
        pending + block + injected
    }

    pub(crate) fn note_injected(&mut self, text: &str) {
        let mut norm = normalize(text);
        if norm.len() > MAX_BODY {
            let mut cut = MAX_BODY;
            while !norm.is_char_boundary(cut) {
                cut -= 1;
            }
            norm.truncate(cut);
        }
        if norm.is_empty() {
            return;
        }
        if self.injected.len() == MAX_INJECTED {
            self.injected.pop_front();
        }
        self.injected.push_back(norm);
    }

    fn is_injected_echo(&self, rest: &str) -> bool {
        if self.injected.is_empty() {
            return false;
        }
        let norm = normalize(rest);
        norm.len() >= 8 && self.injected.iter().any(|t| t.contains(&norm))
    }

    fn is_code_at(&self, line: &CommittedLine, idx: usize) -> bool {
        self.profile.code_by_colour() && line.code.get(idx).copied().unwrap_or(false)
    }

    /// The screen was cleared: what follows is a new screen, so fences, thinking and blocks
    /// that were open end here. Returns the pending directive: its continuation lines may
    /// have been dropped with the screen, and a re-print may show it whole.
    pub(crate) fn clear(&mut self) -> Option<Found> {
        self.fence = None;
        self.thinking = None;
        self.block = None;
        match std::mem::replace(&mut self.pending, Pending::None) {
            Pending::Inline { found, .. } => Some(found),
            Pending::None | Pending::Echo { .. } => None,
        }
    }

    /// End of a burst: a pending directive is complete.
    pub(crate) fn flush(&mut self, out: &mut Vec<Found>) {
        match std::mem::replace(&mut self.pending, Pending::None) {
            Pending::Inline { found, .. } => out.push(found),
            Pending::None | Pending::Echo { .. } => {}
        }
    }

    /// Scans one final line.
    pub(crate) fn line(&mut self, line: &CommittedLine, seq: u64, out: &mut Vec<Found>) {
        if self.block.is_some() {
            self.block_line(&line.text, line.overflow, out);
            return;
        }
        let s = shape(&line.text);
        let prompt = is_prompt(s.text);

        if line.seen {
            // Context only: it may continue or end what is pending, nothing else.
            if self.fence.is_none() && self.thinking.is_none() && !self.continues(line, &s, prompt)
            {
                self.flush(out);
            }
            return;
        }

        if is_fence(s.text) {
            self.flush(out);
            self.fence = if self.fence.is_some() { None } else { Some(0) };
            return;
        }
        if let Some(n) = &mut self.fence {
            *n += 1;
            if !prompt && *n < MAX_HIDDEN_LINES {
                return;
            }
            self.fence = None;
        }

        if let Some(n) = &mut self.thinking {
            *n += 1;
            if s.text.contains("</thinking>") || prompt || *n >= MAX_HIDDEN_LINES {
                self.thinking = None;
            }
            if !prompt {
                return;
            }
        } else if let Some(at) = s.text.find("<thinking>") {
            self.flush(out);
            if !s.text[at..].contains("</thinking>") {
                self.thinking = Some(0);
            }
            return;
        }

        if self.continues(line, &s, prompt) {
            return;
        }
        self.flush(out);

        if s.blank {
            return;
        }
        let code = self.is_code_at(line, s.rest_idx);
        if is_echo_start(s.rest) {
            let body = s.rest.trim_start_matches(['❯', ' ']);
            let indent = s.text.chars().count() - body.chars().count();
            self.pending = Pending::Echo { indent };
            return;
        }
        if code {
            return;
        }
        if s.rest.starts_with(OPEN_BLOCK) {
            if self.is_injected_echo(s.rest) {
                return;
            }
            self.block = Some(Block {
                text: String::new(),
                lines: 0,
                row: line.row,
                seq,
            });
            self.block_line(&s.rest[OPEN_BLOCK.len()..], line.overflow, out);
            return;
        }
        if let Some((kind, to, body)) = parse_inline(s.rest) {
            if self.is_injected_echo(s.rest) {
                self.pending = Pending::Echo { indent: s.rest_idx };
                return;
            }
            // A row longer than the screen keeps, or a body past the limit: only its start is
            // here, and it is reported as such rather than sent shortened.
            let truncated = line.overflow || body.len() > MAX_BODY;
            let directive = Directive {
                to,
                kind,
                body: cut_to(body, MAX_BODY).to_string(),
                thread: None,
                data: None,
                truncated,
                malformed: None,
                subscribe: None,
                team: None,
                claim: None,
            };
            let found = Found {
                directive,
                row: line.row,
                seq,
            };
            self.pending = Pending::Inline {
                found,
                indent: s.indent,
                text_col: s.rest_idx,
                last_len: line.text.chars().count(),
            };
        } else if let Some(directive) = malformed_inline(s.rest) {
            if self.is_injected_echo(s.rest) {
                return;
            }
            out.push(Found {
                directive,
                row: line.row,
                seq,
            });
        }
    }

    pub(crate) fn profile(&self) -> &Profile {
        &self.profile
    }

    /// Whether a directive is pending and `line`, were it final, would end it.
    pub(crate) fn would_end_pending(&self, line: &CommittedLine) -> bool {
        if !matches!(self.pending, Pending::Inline { .. }) {
            return false;
        }
        let s = shape(&line.text);
        self.join(line, &s, is_prompt(s.text)).is_none()
    }

    /// How `line` continues what is pending (a directive or an echo), if it does.
    ///
    /// A directive's body goes on with a line indented deeper than where the directive
    /// starts, a list item at least as deep, or the rest of a row the TUI wrapped; a line at
    /// the directive's own indentation is the text after it (`@relay:Bob hi` then `Done.`
    /// sends `hi`).
    fn join(&self, line: &CommittedLine, s: &Shape<'_>, prompt: bool) -> Option<Join> {
        let (indent, last_len) = match &self.pending {
            Pending::None => return None,
            Pending::Inline {
                indent, last_len, ..
            } => (*indent, Some(*last_len)),
            Pending::Echo { indent } => (*indent, None),
        };
        let Some(last_len) = last_len else {
            // An echo of injected text.
            if !self.injected.is_empty() {
                // The wrapper told us what it typed: only pieces of that text (a TUI wrapping
                // the echoed prompt) continue the echo. A plain agent's answer on the very
                // next line is its own output, and may be a directive.
                let echo = !s.blank && s.indent >= indent && self.is_injected_echo(s.rest);
                return echo.then_some(Join::Wrap);
            }
            let ends = s.blank
                || prompt
                || is_marker_line(s.text)
                || s.indent < indent
                || is_echo_start(s.rest)
                || self.is_code_at(line, s.indent);
            return (!ends).then_some(Join::Wrap);
        };
        if s.blank
            || prompt
            || is_marker_line(s.text)
            || s.indent < indent
            || starts_directive(s.rest)
            || s.rest.starts_with(OPEN_BLOCK)
            || is_echo_start(s.rest)
            || self.is_code_at(line, s.indent)
        {
            return None;
        }
        if self.wrapped(last_len, s) {
            Some(Join::Wrap)
        } else if s.indent > indent || is_list_item(s.text) {
            Some(Join::Line)
        } else {
            None
        }
    }

    /// Appends `line` to the pending directive if it continues it; true if it did.
    fn continues(&mut self, line: &CommittedLine, s: &Shape<'_>, prompt: bool) -> bool {
        let Some(join) = self.join(line, s, prompt) else {
            return false;
        };
        let Pending::Inline {
            found,
            text_col,
            last_len,
            ..
        } = &mut self.pending
        else {
            return true; // an echo swallows its continuation lines
        };
        *last_len = line.text.chars().count();
        let mut text = s.text.trim_matches(is_margin);
        for (alias, _) in ALIASES {
            if let Some(after) = text.strip_prefix('\\') {
                if after.starts_with(alias) {
                    text = after;
                }
            }
        }
        if line.overflow {
            found.directive.truncated = true;
        }
        // A new line keeps its indentation relative to the directive's start (code, nested
        // lists); a wrapped row's indentation is only the TUI's layout.
        let deeper = match join {
            Join::Line => s.indent.saturating_sub(*text_col),
            Join::Wrap => 0,
        };
        let body = &mut found.directive.body;
        if body.len() + deeper + text.len() + 1 > MAX_BODY {
            // Past the limit: the rest still belongs to this directive (it is not a new
            // paragraph), but is not kept; the directive is reported as cut.
            found.directive.truncated = true;
            return true;
        }
        match join {
            Join::Line => {
                body.push('\n');
                body.extend(std::iter::repeat_n(' ', deeper));
            }
            Join::Wrap => body.push(' '),
        }
        body.push_str(text);
        true
    }

    /// One line of a `[[RELAY]]` block; `overflow`: the row was longer than the screen model
    /// keeps, so its end (and maybe the block's close) is lost.
    fn block_line(&mut self, text: &str, overflow: bool, out: &mut Vec<Found>) {
        let Some(block) = &mut self.block else { return };
        block.lines += 1;
        if let Some(end) = text.find(CLOSE_BLOCK) {
            let mut json = std::mem::take(&mut block.text);
            if !json.is_empty() {
                json.push('\n');
            }
            json.push_str(&text[..end]);
            let (row, seq) = (block.row, block.seq);
            self.block = None;
            let directive = parse_block(&json).or_else(|why| {
                // A TUI may have wrapped a long string: join the lines without the breaks.
                let joined: Vec<&str> = json.lines().map(str::trim).collect();
                parse_block(&joined.join(" ")).map_err(|_| why)
            });
            let directive = directive.unwrap_or_else(|why| {
                // Not sent, and not silently: the agent is told why (the wrapper does that).
                let to = block_target(&json).map_or_else(String::new, |t| t.as_str().to_owned());
                let written: String = json.chars().take(60).collect();
                Directive::malformed(
                    to,
                    written,
                    format!("your [[RELAY]] block was not sent: {why}"),
                )
            });
            out.push(Found {
                directive,
                row,
                seq,
            });
            return;
        }
        if overflow
            || block.text.len() + text.len() + 1 > MAX_BLOCK
            || block.lines >= MAX_BLOCK_LINES
        {
            // Too big to be a block, or never closed: not sent, but not silently either. The
            // agent is told (the wrapper does that for a cut directive) when the start names
            // whom it was for; a block whose target is not in its first 64 KiB names no one.
            let (row, seq) = (block.row, block.seq);
            let to = block_target(&block.text).or_else(|| block_target(text));
            self.block = None;
            if let Some(to) = to {
                let mut directive = Directive::message(to, "");
                directive.truncated = true;
                out.push(Found {
                    directive,
                    row,
                    seq,
                });
            }
            return;
        }
        if !block.text.is_empty() {
            block.text.push('\n');
        }
        block.text.push_str(text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan_with(profile: Profile, lines: &[&str]) -> Vec<Directive> {
        let mut s = Scanner::new(profile);
        let mut out = Vec::new();
        for (i, text) in lines.iter().enumerate() {
            let line = CommittedLine {
                row: i as u64,
                text: (*text).to_string(),
                code: Vec::new(),
                seen: false,
                overflow: false,
            };
            s.line(&line, i as u64, &mut out);
        }
        s.flush(&mut out);
        out.into_iter().map(|f| f.directive).collect()
    }

    fn scan(lines: &[&str]) -> Vec<Directive> {
        scan_with(Profile::generic(), lines)
    }

    fn msg(to: &str, body: &str) -> Directive {
        let to = if to == "*" {
            Target::Broadcast
        } else {
            Target::Agent(to.into())
        };
        Directive::message(to, body)
    }

    #[test]
    fn inline_directive_at_line_start() {
        assert_eq!(
            scan(&["@relay:Bob Can you review auth.ts?"]),
            [msg("Bob", "Can you review auth.ts?")]
        );
    }

    #[test]
    fn decoration_before_a_directive_is_allowed() {
        for prefix in [
            "  ", "> ", "$ ", "% ", "# ", "● ", "• ", "- ", "* ", "⏺ ", "│ ", "┃ ", "» ", "✦ ",
            "➜ ", "→ ", "› ", "◆ ", "■ ", "│ ● ", "> - ", "●",
        ] {
            let line = format!("{prefix}@relay:Bob hi");
            assert_eq!(scan(&[&line]), [msg("Bob", "hi")], "prefix {prefix:?}");
        }
    }

    #[test]
    fn text_or_list_numbers_before_a_directive_prevent_it() {
        assert!(scan(&["say @relay:Bob hi"]).is_empty());
        assert!(scan(&["1. @relay:Bob hi"]).is_empty());
        assert!(scan(&["2) @relay:Bob hi"]).is_empty());
        assert!(scan(&["echo \"@relay:Bob hi\""]).is_empty());
    }

    #[test]
    fn thinking_directive_and_aliases() {
        let d = scan(&["@thinking:Bob pondering"]);
        assert_eq!(d[0].kind, Kind::Thinking);
        assert_eq!(scan(&["->relay:Bob hi"]), [msg("Bob", "hi")]);
        assert_eq!(scan(&["● ->thinking:Bob hm"])[0].kind, Kind::Thinking);
    }

    #[test]
    fn target_rules() {
        assert_eq!(scan(&["@relay:* all hands"]), [msg("*", "all hands")]);
        assert_eq!(scan(&["@relay:Bob: hi"]), [msg("Bob", "hi")]);
        assert_eq!(scan(&["@relay:agent-2_x.y hi"]), [msg("agent-2_x.y", "hi")]);
        // Not directives, and not silently dropped: reported malformed, for the agent.
        for (line, to, why) in [
            ("@relay:Bob! hi", "Bob!", "\"Bob!\" is not a name"),
            ("@relay: hi", "", "no name right after @relay:"),
            ("@relay:Bob:hi", "Bob:hi", "not addressed with a prefix"),
            (
                "@relay:proj:Bob hi",
                "proj:Bob",
                "not addressed with a prefix",
            ),
        ] {
            let got = scan(&[line]);
            assert_eq!(got.len(), 1, "{line}: {got:?}");
            assert_eq!(got[0].to, Target::Agent(to.into()), "{line}");
            let malformed = got[0].malformed.as_deref().unwrap_or_default();
            assert!(
                malformed.contains(why) && malformed.contains("was not sent"),
                "{line}: {malformed}"
            );
        }
        // Nothing was meant to go: not reported.
        assert!(scan(&["@relay:"]).is_empty());
        assert!(scan(&["@relay:Bob"]).is_empty());
    }

    #[test]
    fn a_block_that_does_not_parse_is_reported_malformed_with_why() {
        for (lines, why) in [
            (
                vec!["[[RELAY]]{\"to\": \"Bob\", \"body\": oops}[[/RELAY]]"],
                "does not parse",
            ),
            (
                vec!["[[RELAY]]", "{\"body\": \"hi\"}", "[[/RELAY]]"],
                "no \"to\"",
            ),
            (
                vec!["[[RELAY]]{\"to\": \"a b\", \"body\": \"hi\"}[[/RELAY]]"],
                "not a name",
            ),
            (vec!["[[RELAY]]{\"to\": \"Bob\"}[[/RELAY]]"], "no \"body\""),
        ] {
            let got = scan(&lines);
            assert_eq!(got.len(), 1, "{lines:?}: {got:?}");
            let malformed = got[0].malformed.as_deref().unwrap_or_default();
            assert!(
                malformed.starts_with("your [[RELAY]] block was not sent: ")
                    && malformed.contains(why),
                "{lines:?}: {malformed}"
            );
        }
    }

    #[test]
    fn whitespace_only_body_is_no_directive() {
        assert!(scan(&["@relay:Bob   "]).is_empty());
        assert!(scan(&["@relay:Bob"]).is_empty());
    }

    fn scan_tui(profile: Profile, cols: usize, lines: &[&str]) -> Vec<Directive> {
        let mut s = Scanner::new(profile);
        s.set_cols(cols);
        let mut out = Vec::new();
        for (i, text) in lines.iter().enumerate() {
            let line = CommittedLine {
                row: i as u64,
                text: (*text).to_string(),
                code: Vec::new(),
                seen: false,
                overflow: false,
            };
            s.line(&line, i as u64, &mut out);
        }
        s.flush(&mut out);
        out.into_iter().map(|f| f.directive).collect()
    }

    #[test]
    fn rows_a_tui_wrapped_are_joined_with_a_space() {
        // Claude Code at 60 columns breaks the line itself; the row filled the width.
        let lines = [
            "● @relay:Bob Please review the auth module, especially the",
            "  token refresh path.",
            "",
            "  Next paragraph.",
        ];
        assert_eq!(
            scan_tui(Profile::claude(), 60, &lines),
            [msg(
                "Bob",
                "Please review the auth module, especially the token refresh path."
            )]
        );
        // A directive in a later paragraph, wrapped at its own indentation.
        let lines = [
            "  @relay:Bob Please review the auth module, especially the",
            "  token refresh path.",
            "  Done.",
        ];
        assert_eq!(
            scan_tui(Profile::claude(), 60, &lines),
            [msg(
                "Bob",
                "Please review the auth module, especially the token refresh path."
            )]
        );
    }

    #[test]
    fn a_line_at_the_directives_own_indentation_ends_it() {
        assert_eq!(scan(&["@relay:Bob hi", "Done."]), [msg("Bob", "hi")]);
        assert_eq!(scan(&["  @relay:Bob hi", "  Done."]), [msg("Bob", "hi")]);
        // A short row is not a wrapped one, even in a TUI.
        assert_eq!(
            scan_tui(Profile::codex(), 100, &["  @relay:Bob hi", "  Done."]),
            [msg("Bob", "hi")]
        );
        // Under a TUI's bullet the text is deeper than the line start: it continues, as a line.
        assert_eq!(
            scan_tui(
                Profile::claude(),
                100,
                &["● @relay:Bob hi", "  Done.", "Next."]
            ),
            [msg("Bob", "hi\nDone.")]
        );
    }

    #[test]
    fn deeper_lines_continue_with_their_line_breaks_and_indentation() {
        let lines = [
            "@relay:Bob run this:",
            "    fn main() {",
            "        println!(\"hi\");",
            "    }",
            "Done.",
        ];
        assert_eq!(
            scan(&lines),
            [msg(
                "Bob",
                "run this:\n    fn main() {\n        println!(\"hi\");\n    }"
            )]
        );
        let lines = ["● @relay:Bob two lines:", "    second", "Done."];
        assert_eq!(
            scan_tui(Profile::claude(), 100, &lines),
            [msg("Bob", "two lines:\n  second")]
        );
    }

    #[test]
    fn a_list_item_under_a_directive_continues_it() {
        let lines = ["@relay:Bob Please check:", "- auth.ts", "* db.ts", "Done."];
        assert_eq!(
            scan(&lines),
            [msg("Bob", "Please check:\n- auth.ts\n* db.ts")]
        );
        let lines = ["@relay:Bob steps:", "1. build", "2) test", "done"];
        assert_eq!(scan(&lines), [msg("Bob", "steps:\n1. build\n2) test")]);
    }

    #[test]
    fn continuation_stops_at_less_indentation_prompt_marker_or_directive() {
        assert_eq!(scan(&["  @relay:Bob a", "b"]), [msg("Bob", "a")]);
        assert_eq!(
            scan(&["@relay:Bob a", "user@host:~$ ls"]),
            [msg("Bob", "a")]
        );
        assert_eq!(scan(&["@relay:Bob a", ">>> x = 1"]), [msg("Bob", "a")]);
        assert_eq!(
            scan(&["  @relay:Bob a", "  ✻ Baked for 2s"]),
            [msg("Bob", "a")]
        );
        assert_eq!(
            scan(&["@relay:Bob a", "@relay:Carol b"]),
            [msg("Bob", "a"), msg("Carol", "b")]
        );
    }

    #[test]
    fn list_items_continue_on_their_own_lines() {
        let lines = ["● @relay:Bob Please check:", "  - auth.ts", "  - db.ts"];
        assert_eq!(
            scan(&lines),
            [msg("Bob", "Please check:\n- auth.ts\n- db.ts")]
        );
    }

    #[test]
    fn escaped_directive_is_not_one_and_loses_its_backslash_in_a_body() {
        assert!(scan(&["\\@relay:Bob hi"]).is_empty());
        let lines = ["@relay:Bob write this:", "  \\@relay:Carol hello"];
        assert_eq!(
            scan(&lines),
            [msg("Bob", "write this:\n  @relay:Carol hello")]
        );
    }

    #[test]
    fn fenced_code_hides_directives() {
        let lines = [
            "```",
            "@relay:Bob no",
            "```",
            "@relay:Bob yes",
            "```rust",
            "@relay:Bob no",
            "~~~",
            "```",
        ];
        assert_eq!(scan(&lines), [msg("Bob", "yes")]);
    }

    #[test]
    fn unclosed_fence_ends_at_a_prompt() {
        assert_eq!(
            scan(&["```", "$ ls", "@relay:Bob yes"]),
            [msg("Bob", "yes")]
        );
    }

    #[test]
    fn thinking_blocks_hide_directives() {
        let lines = [
            "<thinking>",
            "@relay:Bob no",
            "</thinking>",
            "@relay:Bob yes",
            "<thinking>@relay:Bob no</thinking>",
        ];
        assert_eq!(scan(&lines), [msg("Bob", "yes")]);
    }

    #[test]
    fn relay_echo_is_never_a_directive() {
        let lines = [
            "❯ Relay message from Alice [t1]: hi",
            "  @relay:Bob forwarded text",
            "",
            "@relay:Bob real",
        ];
        assert_eq!(scan(&lines), [msg("Bob", "real")]);
        assert!(scan(&["Relay message from Alice: @relay:Bob x"]).is_empty());
    }

    #[test]
    fn an_answer_right_after_a_noted_echo_is_read() {
        let mut s = Scanner::new(Profile::generic());
        let injected = "Relay message from Alice [01M]: hello from alice";
        s.note_injected(injected);
        let mut out = Vec::new();
        for (row, text) in [
            injected,
            "got: Relay message from Alice [01M]: hello from alice",
            "@relay:Alice thanks",
        ]
        .into_iter()
        .enumerate()
        {
            let line = CommittedLine {
                row: row as u64,
                text: text.into(),
                code: Vec::new(),
                seen: false,
                overflow: false,
            };
            s.line(&line, 0, &mut out);
        }
        s.flush(&mut out);
        assert_eq!(
            out.iter().map(|f| f.directive.clone()).collect::<Vec<_>>(),
            [msg("Alice", "thanks")]
        );
    }

    #[test]
    fn noted_injected_text_echo_is_ignored() {
        let mut s = Scanner::new(Profile::generic());
        s.note_injected("please run\n@relay:Carol tell me the result");
        let mut out = Vec::new();
        let line = CommittedLine {
            row: 0,
            text: "@relay:Carol tell me the result".into(),
            code: Vec::new(),
            seen: false,
            overflow: false,
        };
        s.line(&line, 0, &mut out);
        s.flush(&mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn code_coloured_text_is_code_for_markdown_tuis() {
        let text = "  @relay:Bob hi";
        let mut code = vec![false; text.chars().count()];
        for c in &mut code[2..] {
            *c = true;
        }
        for (profile, expect) in [(Profile::claude(), 0), (Profile::generic(), 1)] {
            let mut s = Scanner::new(profile);
            let mut out = Vec::new();
            let line = CommittedLine {
                row: 0,
                text: text.into(),
                code: code.clone(),
                seen: false,
                overflow: false,
            };
            s.line(&line, 0, &mut out);
            s.flush(&mut out);
            assert_eq!(out.len(), expect);
        }
    }

    #[test]
    fn block_on_one_line() {
        let d = scan(&[
            r#"[[RELAY]]{"to":"Bob","type":"action","body":"run tests","thread":"t1","data":{"n":1}}[[/RELAY]]"#,
        ]);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].kind, Kind::Action);
        assert_eq!(d[0].body, "run tests");
        assert_eq!(d[0].thread.as_deref(), Some("t1"));
        assert_eq!(d[0].data, Some(serde_json::json!({"n": 1})));
    }

    #[test]
    fn spawn_and_release_blocks_are_verbs_never_messages() {
        let d = scan(&[
            r#"[[RELAY]]{"spawn": {"command": ["claude", "--model", "x"], "task": "fix it", "notify": "idle"}}[[/RELAY]]"#,
            r#"[[RELAY]]{"spawn": {"command": "codex", "name": "W2", "worktree": true}}[[/RELAY]]"#,
            r#"[[RELAY]]{"release": "W2"}[[/RELAY]]"#,
            r#"[[RELAY]]{"release": {"name": "W3", "now": true}}[[/RELAY]]"#,
            r#"[[RELAY]]{"spawn": {"task": "no command"}}[[/RELAY]]"#,
            r#"[[RELAY]]{"to": "spawn", "body": "a message to an agent named spawn"}[[/RELAY]]"#,
        ]);
        assert_eq!(d.len(), 6, "{d:?}");
        assert_eq!(
            d[0].team.as_deref(),
            Some(&crate::TeamVerb::Spawn {
                command: vec!["claude".into(), "--model".into(), "x".into()],
                task: Some("fix it".into()),
                name: None,
                worktree: false,
                notify_idle: true,
            })
        );
        assert!(d[0].malformed.is_none() && d[0].body.is_empty(), "{d:?}");
        assert!(
            matches!(d[1].team.as_deref(), Some(crate::TeamVerb::Spawn { command, name: Some(n), worktree: true, .. }) if command == &["codex"] && n == "W2"),
            "{d:?}"
        );
        assert_eq!(
            d[2].team.as_deref(),
            Some(&crate::TeamVerb::Release {
                name: "W2".into(),
                now: false
            })
        );
        assert_eq!(
            d[3].team.as_deref(),
            Some(&crate::TeamVerb::Release {
                name: "W3".into(),
                now: true
            })
        );
        assert!(d[4].team.is_none());
        assert!(
            d[4].malformed
                .as_deref()
                .unwrap_or_default()
                .contains("no \"command\""),
            "{d:?}"
        );
        assert!(d[5].team.is_none() && d[5].malformed.is_none());
        assert_eq!(d[5].to, Target::Agent("spawn".into()));
    }

    #[test]
    fn a_claim_block_is_a_verb_never_a_message() {
        let d = scan(&[
            r#"[[RELAY]]{"claim": ["src/auth.rs", "src/db/"], "for": "1h"}[[/RELAY]]"#,
            r#"[[RELAY]]{"unclaim": []}[[/RELAY]]"#,
            r#"[[RELAY]]{"claim": 3}[[/RELAY]]"#,
        ]);
        assert_eq!(d.len(), 3, "{d:?}");
        let c = d[0].claim.as_ref().unwrap();
        assert_eq!(c.paths, ["src/auth.rs", "src/db/"]);
        assert_eq!(c.for_ms, Some(3_600_000));
        assert!(!c.release && d[0].body.is_empty() && d[0].malformed.is_none());
        let c = d[1].claim.as_ref().unwrap();
        assert!(c.release && c.paths.is_empty());
        assert!(d[2].claim.is_none());
        let why = d[2].malformed.as_deref().unwrap_or_default();
        assert!(why.contains("not a path or a list of paths"), "{why}");
    }

    #[test]
    fn a_subscribe_block_is_a_verb_never_a_message() {
        let d = scan(&[
            r#"[[RELAY]]{"subscribe": "build.*"}[[/RELAY]]"#,
            r#"[[RELAY]]{"subscribe": "build..x"}[[/RELAY]]"#,
        ]);
        assert_eq!(d.len(), 2, "{d:?}");
        assert_eq!(d[0].subscribe.as_deref(), Some("build.*"));
        assert!(d[0].malformed.is_none() && d[0].body.is_empty(), "{d:?}");
        assert!(d[1].subscribe.is_none());
        let why = d[1].malformed.as_deref().unwrap_or_default();
        assert!(why.contains("not a topic pattern"), "{why}");
    }

    #[test]
    fn a_topic_is_addressed_with_a_hash_and_never_taken_for_a_name() {
        let d = scan(&["@relay:#build.linux green", "@relay:#bad..topic x"]);
        assert_eq!(d.len(), 2, "{d:?}");
        // Not a topic: not sent, and the agent is told (never sent to an agent "#bad..topic").
        let why = d[1].malformed.as_deref().unwrap_or_default();
        assert!(why.contains("# and a topic"), "{why}");
        assert_eq!(d[0].to, Target::Topic("#build.linux".into()));
        assert_eq!(
            d[0].to.route(),
            ("*".to_owned(), Some("build.linux".to_owned()))
        );
        assert_eq!(d[0].body, "green");
        assert_eq!(
            Target::Agent("Bob".into()).route(),
            ("Bob".to_owned(), None)
        );
    }

    #[test]
    fn block_over_several_lines_and_text_field() {
        let lines = [
            "● [[RELAY]]{",
            r#"  "to": "*", "type": "state","#,
            r#"  "text": "tests pass""#,
            "}[[/RELAY]]",
            "@relay:Bob after",
        ];
        let d = scan(&lines);
        assert_eq!(d[0].to, Target::Broadcast);
        assert_eq!(d[0].kind, Kind::State);
        assert_eq!(d[0].body, "tests pass");
        assert_eq!(d[1], msg("Bob", "after"));
    }

    #[test]
    fn block_with_a_wrapped_string_is_joined() {
        let lines = [
            r#"[[RELAY]]{"to":"Bob","body":"a long"#,
            r#"  text"}[[/RELAY]]"#,
        ];
        assert_eq!(scan(&lines), [msg("Bob", "a long text")]);
    }

    #[test]
    fn invalid_blocks_are_reported_malformed_and_oversize_ones_cut() {
        // Never sent; reported for the agent (issue 23.18).
        let got = scan(&[
            "[[RELAY]]{not json}[[/RELAY]]",
            "[[RELAY]]{\"to\":\"Bob\"}[[/RELAY]]",
            "[[RELAY]]{\"to\":\"Bob\",\"type\":\"bogus\",\"body\":\"x\"}[[/RELAY]]",
        ]);
        assert_eq!(got.len(), 3, "{got:?}");
        assert!(got.iter().all(|d| d.malformed.is_some()), "{got:?}");
        assert!(scan(&["x [[RELAY]]{\"to\":\"Bob\",\"body\":\"x\"}[[/RELAY]]"]).is_empty());
        let big = "x".repeat(MAX_BLOCK / 100);
        let mut lines = vec!["[[RELAY]]{\"to\":\"Bob\",\"body\":\""];
        lines.extend(std::iter::repeat_n(big.as_str(), 200));
        lines.push("\"}[[/RELAY]]");
        lines.push("@relay:Bob still works");
        let mut cut = msg("Bob", "");
        cut.truncated = true;
        assert_eq!(scan(&lines), [cut.clone(), msg("Bob", "still works")]);
        // Never closed: reported once it passes the line limit.
        let mut lines = vec!["[[RELAY]]{ \"to\" : \"Bob\", \"body\": \"a"];
        lines.extend(std::iter::repeat_n("more", MAX_BLOCK_LINES as usize));
        assert_eq!(scan(&lines), [cut.clone()]);
        // One row longer than the screen keeps: its close is lost, so it is cut.
        let mut s = Scanner::new(Profile::generic());
        let mut out = Vec::new();
        let line = CommittedLine {
            row: 0,
            text: format!("[[RELAY]]{{\"to\":\"Bob\",\"body\":\"{big}"),
            code: Vec::new(),
            seen: false,
            overflow: true,
        };
        s.line(&line, 0, &mut out);
        assert_eq!(
            out.into_iter().map(|f| f.directive).collect::<Vec<_>>(),
            [cut]
        );
        // No target in its start: nobody to tell, nothing sent.
        let mut lines = vec!["[[RELAY]]{\"body\":\""];
        lines.extend(std::iter::repeat_n(big.as_str(), 200));
        lines.push("\", \"to\": \"Bob\"}[[/RELAY]]");
        assert!(scan(&lines).is_empty());
    }

    #[test]
    fn text_in_a_box_loses_the_box() {
        let lines = [
            "│ @relay:Bob inside a box   │",
            "│   and its second line  │",
            "│                        │",
        ];
        assert_eq!(
            scan(&lines),
            [msg("Bob", "inside a box\n  and its second line")]
        );
    }

    #[test]
    fn several_directives_in_one_reply() {
        let lines = [
            "● Sure.",
            "",
            "  @relay:Bob first",
            "",
            "  @relay:Carol second",
            "  @relay:* third",
        ];
        assert_eq!(
            scan(&lines),
            [
                msg("Bob", "first"),
                msg("Carol", "second"),
                msg("*", "third")
            ]
        );
    }
}
