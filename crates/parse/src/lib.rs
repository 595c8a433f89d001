//! relay-parse: from the raw bytes an agent's terminal shows to relay directives, each exactly
//! once.
//!
//! This crate is pure: no I/O, no clock, no async runtime. The wrapper owns one [`Parser`] per
//! agent terminal, hands it every chunk of output with [`Parser::feed`], tells it when the
//! output has gone quiet ([`Parser::settle`]) or ended ([`Parser::finish`]), and sends the
//! [`Directive`]s it returns.
//!
//! Three stages, one module each:
//! - `screen`: a [`vte::Perform`] keeping a bounded model of the live (rewritable) part of
//!   the screen; rows become *final* when they leave it, when the stream goes quiet, or at
//!   the end.
//! - `scanner`: a line state machine over final rows for `@relay:NAME body`,
//!   `[[RELAY]]{json}[[/RELAY]]` and their continuation, ignoring code, thinking, escaped
//!   lines and the echo of injected text.
//! - `dedupe`: the exactly-once policy for repaints (a redraw, a re-print after a resize, a
//!   pane read again).
//!
//! What "printed once" means is written down in `README.md` beside this crate and in
//! `docs/PARSING.md`.
//!
//! ```
//! use relay_parse::{Parser, Profile, Target};
//!
//! let mut parser = Parser::new(Profile::generic());
//! let mut found = parser.feed(b"\x1b[1m@relay:Bob\x1b[0m Can you review");
//! found.extend(parser.feed(b" auth.ts?\r\n$ "));
//! found.extend(parser.finish());
//! assert_eq!(found.len(), 1);
//! assert_eq!(found[0].to, Target::Agent("Bob".into()));
//! assert_eq!(found[0].body, "Can you review auth.ts?");
//! ```

mod dedupe;
mod profile;
mod scanner;
mod screen;
pub mod transcript;

pub use profile::Profile;
pub use relay_protocol::Kind;

use serde::Serialize;

/// Who a directive is for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    /// One agent, by name.
    Agent(String),
    /// Everyone (`*`).
    Broadcast,
    /// The subscribers of a topic (`@relay:#build.linux text`): held as written, `#` first.
    Topic(String),
}

impl Target {
    /// The name as written: the agent's name, `*`, or `#` and the topic.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Agent(name) | Self::Topic(name) => name,
            Self::Broadcast => "*",
        }
    }

    /// Where a SEND for it goes: `(to, topic)` — the agent's name or `*`, and for a topic
    /// `*` with the topic (its subscribers).
    pub fn route(&self) -> (String, Option<String>) {
        match self {
            Self::Agent(name) => (name.clone(), None),
            Self::Broadcast => ("*".to_owned(), None),
            Self::Topic(written) => (
                "*".to_owned(),
                Some(written.trim_start_matches('#').to_owned()),
            ),
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Target {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// A message an agent asked the relay to send.
///
/// Serializes as `{"to": "Bob" | "*", "kind": "message", "body": ..., "thread"?: ..., "data"?: ...}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Directive {
    /// The recipient.
    pub to: Target,
    /// Message, action, state or thinking (`@thinking:` gives thinking).
    pub kind: Kind,
    /// The text, continuation lines joined.
    pub body: String,
    /// Conversation thread, from a `[[RELAY]]` block.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thread: Option<String>,
    /// Structured data, from a `[[RELAY]]` block.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
    /// The agent printed more than one directive may carry (16 KiB of body for a line, 64 KiB
    /// for a `[[RELAY]]` block): `body` is only its start (empty for a block). Never send such
    /// a directive as if whole; tell the agent instead.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    /// The agent printed what starts like a directive but is not one (`@relay:Bob!`,
    /// `@relay:proj:Bob`, a `[[RELAY]]` block whose JSON does not parse): why, in a sentence
    /// for the agent (issue 23.18). `to` is then the name as written (`Agent`, possibly not a
    /// valid name) and `body` the start of what was written. Never send such a directive;
    /// tell the agent instead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub malformed: Option<String>,
    /// A team verb, not a message: a `[[RELAY]]` block `{"subscribe": "build.*"}` asks the
    /// relay to subscribe the agent to that topic pattern (issue 25.6; `to` is then `*` and
    /// `body` empty). Never send such a directive as a message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subscribe: Option<String>,
    /// A team verb, not a message: a `[[RELAY]]` block `{"spawn": {...}}` or `{"release":
    /// ...}` (issue 25.4; `to` is then `*` and `body` empty). Never send such a directive as a
    /// message: the agent could not mean an agent named "spawn".
    /// Boxed: rare, and it would make every directive bigger.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub team: Option<Box<TeamVerb>>,
    /// A team verb, not a message: a `[[RELAY]]` block `{"claim": [PATHS], "for": "1h"}` or
    /// `{"unclaim": [PATHS]}` claims or releases paths for the agent (issue 25.7; `to` is then
    /// `*` and `body` empty). Never send such a directive as a message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim: Option<Box<ClaimVerb>>,
}

/// A lead's team verb written as a `[[RELAY]]` block (see `docs/PARSING.md`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TeamVerb {
    /// `{"spawn": {"command": ["claude"], "task"?: TEXT, "name"?: NAME, "worktree"?: bool,
    /// "notify"?: "idle"}}`: start a worker with a task.
    Spawn {
        /// The worker's command and its arguments.
        command: Vec<String>,
        /// Its task (its first message, from the agent).
        #[serde(skip_serializing_if = "Option::is_none")]
        task: Option<String>,
        /// Its name, when chosen.
        #[serde(skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        /// Its own git worktree.
        worktree: bool,
        /// Tell the agent each time the worker is idle after a turn.
        notify_idle: bool,
    },
    /// `{"release": NAME}` or `{"release": {"name": NAME, "now"?: bool}}`: stop a worker.
    Release {
        /// The worker.
        name: String,
        /// At once rather than once idle.
        now: bool,
    },
}

/// What a `claim` or `unclaim` block asks for (see [`Directive::claim`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct ClaimVerb {
    /// The paths as the agent wrote them (relative to its directory, or absolute): the wrapper
    /// puts them in the relay's normal form. Empty with `release`: every claim of the agent.
    pub paths: Vec<String>,
    /// How long (`"for"`: `90s`, `30m`, `2h`), in ms; the relay's default when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub for_ms: Option<u64>,
    /// `unclaim`: release them.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub release: bool,
}

impl Directive {
    /// A plain message to `to` (no thread, no data), as `@relay:NAME body` gives.
    pub fn message(to: Target, body: impl Into<String>) -> Self {
        Self {
            to,
            kind: Kind::Message,
            body: body.into(),
            thread: None,
            data: None,
            truncated: false,
            malformed: None,
            subscribe: None,
            team: None,
            claim: None,
        }
    }

    /// What the agent wrote that starts like a directive but is not one (see
    /// [`Directive::malformed`]): `to` as written, the start of what was `written`, and why it
    /// was not sent.
    pub fn malformed(
        to: impl Into<String>,
        written: impl Into<String>,
        why: impl Into<String>,
    ) -> Self {
        Self {
            malformed: Some(why.into()),
            ..Self::message(Target::Agent(to.into()), written)
        }
    }
}

/// Longest body a printed directive may have, in bytes; a longer one is reported as
/// [`Directive::truncated`].
pub const MAX_DIRECTIVE_BODY: usize = scanner::MAX_BODY;

/// Largest `[[RELAY]]` block, in bytes; a larger one is reported as [`Directive::truncated`]
/// (with an empty body) when its start names the recipient.
pub const MAX_BLOCK_BYTES: usize = scanner::MAX_BLOCK;

/// The text a terminal shows: its rows (trailing spaces removed) and where the cursor is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScreenText {
    /// The rows, top to bottom.
    pub lines: Vec<String>,
    /// The cursor's row, an index into `lines` (may be `lines.len()` on an empty screen).
    pub cursor_row: usize,
    /// The cursor's column.
    pub cursor_col: usize,
}

impl ScreenText {
    /// A screen from text rows (a `tmux capture-pane` or a test), with the cursor at
    /// `(row, col)`.
    pub fn from_text(text: &str, cursor_row: usize, cursor_col: usize) -> Self {
        Self {
            lines: text.lines().map(|l| l.trim_end().to_owned()).collect(),
            cursor_row,
            cursor_col,
        }
    }

    /// The row under the cursor (empty when there is none).
    pub fn cursor_line(&self) -> &str {
        self.lines.get(self.cursor_row).map_or("", String::as_str)
    }
}

/// One agent terminal's parser. See the crate docs.
pub struct Parser {
    vte: vte::Parser,
    screen: screen::Screen,
    scanner: scanner::Scanner,
    dedupe: dedupe::Dedupe,
    /// Commit sequence number of the next final line.
    seq: u64,
    found: Vec<scanner::Found>,
    /// Off only in tests that check the fast path against plain vte.
    fast_path: bool,
    /// A directive that was pending when the screen was cleared (see `Parser::suspend`).
    suspended: Option<scanner::Found>,
    /// Final lines kept for [`Parser::take_trace`], when tracing is on.
    trace: Option<std::collections::VecDeque<TraceLine>>,
}

/// A final line as the scanner saw it (see [`Parser::set_trace`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceLine {
    /// Absolute screen row (counted from the start of the stream).
    pub row: u64,
    /// The text, trailing spaces removed.
    pub text: String,
    /// Whether any of it was shown in a code colour.
    pub has_code_colour: bool,
}

/// Most trace lines kept; older ones are dropped.
const MAX_TRACE: usize = 10_000;

/// Input is handed to the screen in pieces of this size, so that what it buffers stays small
/// however large a single [`Parser::feed`] is.
const PIECE: usize = 4096;

impl std::fmt::Debug for Parser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parser")
            .field("screen", &self.screen)
            .field("scanner", &self.scanner)
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}

impl Parser {
    /// A parser for a terminal running a program read with `profile`.
    pub fn new(profile: Profile) -> Self {
        Self {
            vte: vte::Parser::new(),
            screen: screen::Screen::new(screen::DEFAULT_ROWS),
            scanner: scanner::Scanner::new(profile),
            dedupe: dedupe::Dedupe::default(),
            seq: 0,
            found: Vec::new(),
            fast_path: true,
            suspended: None,
            trace: None,
        }
    }

    /// Tells the parser the terminal's height, so that it knows which rows cursor movement can
    /// still reach (default 100, at most 200). Rows above it are final.
    pub fn set_rows(&mut self, rows: usize) {
        self.screen.set_rows(rows);
    }

    /// Tells the parser the terminal's width. A TUI that lays out its own lines (the
    /// profile's [`Profile::hard_wraps`]) breaks a long line into rows; a row that filled the
    /// width is joined to the next with a space, while a line the program wrote keeps its
    /// line break in a directive's body. Without it, every such row may be a wrapped one.
    pub fn set_cols(&mut self, cols: usize) {
        self.scanner.set_cols(cols);
    }

    /// Reads a chunk of terminal output and returns the directives that became final.
    ///
    /// Any chunking of the same bytes, followed by [`Parser::finish`], gives the same
    /// directives in the same order: escape sequences and UTF-8 characters may be split.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<Directive> {
        let mut out = Vec::new();
        for piece in bytes.chunks(PIECE) {
            self.advance(piece);
            self.drain(&mut out);
        }
        out
    }

    /// The output has gone quiet: the wrapper calls this after a short silence.
    ///
    /// Unless the screen shows that the agent is still working (its profile's
    /// [`Profile::busy_markers`], such as Claude Code's `esc to interrupt`, near the cursor),
    /// the rows above the cursor are final now. A directive waiting for continuation lines
    /// is complete if the row under the cursor could not continue it (a prompt, a blank line);
    /// otherwise it waits for more. This also ends any replay (see `docs/PARSING.md`).
    pub fn settle(&mut self) -> Vec<Directive> {
        let mut out = Vec::new();
        if self
            .screen
            .shows_near_cursor(self.scanner.profile().busy_markers())
        {
            return out;
        }
        self.screen.commit_above_cursor();
        self.drain(&mut out);
        if self.scanner.would_end_pending(&self.screen.cursor_line()) {
            self.scanner.flush(&mut self.found);
        }
        self.accept_found(&mut out);
        self.dedupe.end_replay();
        out
    }

    /// End of the stream: every row is final; returns what that completes.
    pub fn finish(&mut self) -> Vec<Directive> {
        let mut out = Vec::new();
        self.screen.commit_all();
        self.drain(&mut out);
        self.scanner.flush(&mut self.found);
        self.accept_found(&mut out);
        self.dedupe.end_replay();
        out
    }

    /// The wrapper typed `text` into this terminal: its echo is never a directive, and a new
    /// turn begins (a later repeat of an earlier directive is new).
    pub fn note_injected(&mut self, text: &str) {
        self.scanner.note_injected(text);
        self.dedupe.end_replay();
    }

    /// What follows may show again what this parser has read before (the wrapper re-reads a
    /// pane, for instance): directives shown again in the same order are not reported twice.
    pub fn begin_replay(&mut self) {
        self.dedupe.begin_replay(0, self.seq);
    }

    /// What the terminal shows now, as text: for deciding whether the agent is ready for
    /// input and whether typed input was submitted.
    pub fn screen(&self) -> ScreenText {
        let (lines, cursor_row, cursor_col) = self.screen.visible();
        ScreenText {
            lines,
            cursor_row,
            cursor_col,
        }
    }

    /// Bytes of state this parser holds; bounded whatever the input (under 8 MiB).
    pub fn buffered_bytes(&self) -> usize {
        self.screen.buffered_bytes()
            + self.scanner.buffered_bytes()
            + self.dedupe.buffered_bytes()
            + self.found.capacity() * size_of::<scanner::Found>()
            + self
                .suspended
                .as_ref()
                .map_or(0, |f| f.directive.body.capacity())
    }

    /// Runs `bytes` through vte into the screen.
    ///
    /// Fast path: while vte is surely in its ground state (the screen saw a print or a
    /// completed sequence since the last ESC or non-ASCII byte), a run of printable text that
    /// is valid UTF-8 is printed directly, CR, LF, TAB and BS are executed directly, and a
    /// plain `ESC [ numbers final` sequence is dispatched directly. That is exactly what vte
    /// does with those bytes in that state, only without its per-byte table walk; everything
    /// else goes through vte.
    fn advance(&mut self, bytes: &[u8]) {
        let mut i = 0;
        while i < bytes.len() {
            if self.fast_path && self.screen.ground {
                let rest = &bytes[i..];
                let run = rest
                    .iter()
                    .position(|&b| b < 0x20 || b == 0x7f)
                    .unwrap_or(rest.len());
                if run > 0 {
                    let text = match std::str::from_utf8(&rest[..run]) {
                        Ok(text) => text,
                        // Valid up to there by construction; a character split across chunks
                        // or invalid bytes go through vte.
                        Err(e) => std::str::from_utf8(&rest[..e.valid_up_to()]).unwrap_or(""),
                    };
                    if !text.is_empty() {
                        self.screen.print_str(text);
                        i += text.len();
                        continue;
                    }
                } else if matches!(rest[0], b'\r' | b'\n' | b'\t' | 0x08) {
                    vte::Perform::execute(&mut self.screen, rest[0]);
                    i += 1;
                    continue;
                } else if rest[0] == 0x1b {
                    let used = self.screen.fast_csi(rest);
                    if used > 0 {
                        i += used;
                        continue;
                    }
                }
            }
            let b = bytes[i];
            if b == 0x1b || b >= 0x80 {
                self.screen.ground = false;
            }
            self.vte.advance(&mut self.screen, b);
            i += 1;
        }
    }

    /// Turns on (or off) keeping a copy of every final line, for debugging what the scanner
    /// sees (`examples/inspect.rs`). At most 10,000 lines are kept until taken.
    pub fn set_trace(&mut self, on: bool) {
        self.trace = on.then(std::collections::VecDeque::new);
    }

    /// The final lines recorded since the last call (empty unless [`Parser::set_trace`] is on).
    pub fn take_trace(&mut self) -> Vec<TraceLine> {
        self.trace
            .as_mut()
            .map(|t| t.drain(..).collect())
            .unwrap_or_default()
    }

    fn drain(&mut self, out: &mut Vec<Directive>) {
        // Taken out (and put back, to keep its allocation) so `self` can be borrowed inside.
        let mut events = std::mem::take(&mut self.screen.out);
        for event in events.drain(..) {
            match event {
                screen::Event::Line(line) => {
                    if let Some(trace) = &mut self.trace {
                        if trace.len() == MAX_TRACE {
                            trace.pop_front();
                        }
                        trace.push_back(TraceLine {
                            row: line.row,
                            text: line.text.clone(),
                            has_code_colour: !line.code.is_empty(),
                        });
                    }
                    self.scanner.line(&line, self.seq, &mut self.found);
                    self.seq += 1;
                }
                screen::Event::Repaint { from_row } => self.dedupe.begin_replay(from_row, self.seq),
                screen::Event::Clear => {
                    if let Some(pending) = self.scanner.clear() {
                        self.suspend(pending, out);
                    }
                }
            }
            let found = std::mem::take(&mut self.found);
            for f in found {
                self.take_found(f, out);
            }
        }
        self.screen.out = events;
    }

    /// A directive's first lines were final when a clear screen dropped the rest. Hold it: if
    /// the re-print that usually follows shows it again, whole, that one is reported instead.
    fn suspend(&mut self, pending: scanner::Found, out: &mut Vec<Directive>) {
        if let Some(held) = self.suspended.take() {
            if extends(&held, &pending) {
                self.suspended = Some(pending);
                return;
            }
            if extends(&pending, &held) {
                self.suspended = Some(held);
                return;
            }
            if self.dedupe.accept(&held) {
                out.push(held.directive);
            }
        }
        self.suspended = Some(pending);
    }

    /// Reports `found` unless it is shown again; settles a suspended directive first.
    fn take_found(&mut self, found: scanner::Found, out: &mut Vec<Directive>) {
        if let Some(held) = self.suspended.take() {
            if extends(&held, &found) {
                // The re-print shows the held directive whole: report that one only.
            } else if self.dedupe.would_drop(&found) {
                // Old directives shown again come first; keep waiting.
                self.suspended = Some(held);
            } else if self.dedupe.accept(&held) {
                out.push(held.directive);
            }
        }
        if self.dedupe.accept(&found) {
            out.push(found.directive);
        }
    }

    fn flush_suspended(&mut self, out: &mut Vec<Directive>) {
        if let Some(held) = self.suspended.take() {
            if self.dedupe.accept(&held) {
                out.push(held.directive);
            }
        }
    }

    fn accept_found(&mut self, out: &mut Vec<Directive>) {
        let found = std::mem::take(&mut self.found);
        for f in found {
            self.take_found(f, out);
        }
        self.flush_suspended(out);
    }
}

/// Whether `later` is `earlier` again, possibly with more of its body.
fn extends(earlier: &scanner::Found, later: &scanner::Found) -> bool {
    let (a, b) = (&earlier.directive, &later.directive);
    a.to == b.to && a.kind == b.kind && a.thread == b.thread && b.body.starts_with(&a.body)
}

#[cfg(test)]
mod tests;
