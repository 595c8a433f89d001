//! Claude Code's transcript, read to tell a directive a reply says from one it only quotes.
//!
//! Claude Code draws a ```` ```text ```` code block like prose, so a `@relay:` line shown in
//! one cannot be told from a directive on the screen (see `relay_parse::transcript`). It
//! writes each reply as Markdown to
//! `${CLAUDE_CONFIG_DIR:-~/.claude}/projects/<working directory, non-alphanumerics as ->/<session>.jsonl`;
//! before a directive from the screen is sent, the files there are read on from where they
//! were left, and a directive the replies only quote is not sent.
//!
//! It is also where a reply taller than the screen is read whole: Claude Code draws only the
//! last screenful of a reply that arrives at once, so a directive above it never reaches the
//! terminal. Each time the output goes quiet the wrapper sends what the replies said and the
//! screen did not show ([`Transcript::take_unseen`]); each directive is sent once, from
//! whichever showed it first.
//!
//! One person's agents in one repository share that folder, so only this agent's own
//! transcripts are read: Claude Code records each running process in
//! `${CLAUDE_CONFIG_DIR:-~/.claude}/sessions/<pid>.json` with its `sessionId` (the transcript's
//! file name), and the wrapper takes the sessions of the agent's process and its descendants.
//! Until one is found nothing is read (the screen alone decides, as without a transcript):
//! reading the folder whole sent another agent's directives as this agent's.
//!
//! Codex CLI and Gemini CLI keep such records too (the profile's `transcript`): Codex its
//! session rollout, `${CODEX_HOME:-~/.codex}/sessions/YYYY/MM/DD/rollout-*.jsonl`, whose first
//! line names the session's working directory; Gemini its chat recording,
//! `~/.gemini/tmp/<project>/chats/session-*.jsonl`, `<project>` the name `projects.json` gives
//! the working directory (older versions: the SHA-256 of its path). For them the record only
//! gives a directive the screen showed its exact text (their screens draw every line of a
//! reply, but not as the model wrote it): nothing is sent from it alone, so each directive is
//! sent once, by the screen. Neither records which process wrote a file: two agents of one
//! person in one working directory share them (a screen's directive may then take the other's
//! text of the same directive).

mod rollouts;

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use relay_parse::Directive;
use relay_parse::transcript::{
    Origin, ReplySource, claude_reply_text, codex_reply_text, codex_user_turn, gemini_reply_text,
    gemini_user_turn,
};

use crate::profile::{TranscriptFormat, TranscriptSource};

/// A record line's reply text, if it is a reply (by the CLI's format).
type ReplyText = fn(&str) -> Option<String>;
/// Whether a record line is a prompt (by the CLI's format).
type UserTurn = fn(&str) -> bool;

/// Longest slug Claude Code uses as is; longer ones are cut and given a hash suffix.
const MAX_SLUG: usize = 200;
/// At most this much of a transcript that is already long is read the first time (a resumed
/// session): only its recent replies can be on the screen.
const FIRST_READ: u64 = 8 << 20;

/// A profile's `transcript_dir` as a path: a leading `${VAR:-default}` is `$VAR` when set and
/// not empty, else `default` (expanded the same way); a leading `~` is `$HOME`. `None` when a
/// variable it needs (HOME) is not set.
pub(crate) fn expand(pattern: &str) -> Option<PathBuf> {
    if let Some(rest) = pattern.strip_prefix("${") {
        let end = rest.find('}')?;
        let (inner, tail) = (&rest[..end], &rest[end + 1..]);
        let (var, default) = inner.split_once(":-").unwrap_or((inner, ""));
        let base = match std::env::var_os(var).filter(|v| !v.is_empty()) {
            Some(v) => PathBuf::from(v),
            None if default.is_empty() => return None,
            None => expand(default)?,
        };
        let tail = tail.trim_start_matches('/');
        return Some(if tail.is_empty() {
            base
        } else {
            base.join(tail)
        });
    }
    if pattern == "~" || pattern.starts_with("~/") {
        let home = PathBuf::from(std::env::var_os("HOME")?);
        let tail = pattern[1..].trim_start_matches('/');
        return Some(if tail.is_empty() {
            home
        } else {
            home.join(tail)
        });
    }
    Some(PathBuf::from(pattern))
}

/// Where a CLI other than Claude Code keeps its records, and which are this agent's.
enum Other {
    /// Codex's `sessions` folder; its rollouts' first lines say whether they are this working
    /// directory's (`Some(true)`), once read.
    Codex {
        sessions: PathBuf,
        owned: HashMap<PathBuf, bool>,
        /// The rollouts the agent's own processes have open (see [`rollouts`]), and when they
        /// were last looked for: found, only they are read, and a directive a reply has that
        /// the screen never drew (Codex on its alternate screen) is sent from there.
        open: Vec<PathBuf>,
        looked: Option<std::time::Instant>,
    },
    /// Gemini's folder (`~/.gemini`).
    Gemini { root: PathBuf },
}

/// The transcripts of this agent's CLI sessions (in one working directory).
pub(crate) struct Transcript {
    /// Codex or Gemini: where their records are (`None`: Claude Code's, the fields below).
    other: Option<Other>,
    /// The working directory, as the wrapper's process has it.
    cwd: PathBuf,
    projects: PathBuf,
    /// Where Claude Code records its running processes (`<pid>.json`).
    sessions: PathBuf,
    slug: String,
    /// The agent's process (the wrapper's child, or the tmux pane's); its Claude Code may be
    /// a descendant.
    agent_pid: Option<u32>,
    /// The Claude Code process found to be this agent's, once found: its record is read again
    /// at each look (a `/clear` starts a new session, so a new transcript).
    claude_pid: Option<u32>,
    /// This agent's session ids, in the order found.
    own: Vec<String>,
    /// Size of each transcript when the wrapper started: up to there it is history (a resumed
    /// session), to judge what the screen shows again, never sent from.
    start_len: HashMap<PathBuf, u64>,
    /// Bytes of each file read so far (up to its last complete line).
    read: HashMap<PathBuf, u64>,
    source: ReplySource,
    /// Transcript files found so far.
    files: usize,
}

/// The parent of process `pid`, if it can be read.
#[cfg(target_os = "linux")]
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid ...`: comm may hold spaces and parentheses; the last `)` ends it.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The parent of process `pid`, if it can be read (no `/proc`: ask `ps`, which every Unix has).
#[cfg(not(target_os = "linux"))]
fn parent_of(pid: u32) -> Option<u32> {
    let out = std::process::Command::new("ps")
        .args(["-o", "ppid=", "-p", &pid.to_string()])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

/// Whether `pid` is `root` or one of its descendants (a few levels: a launcher script, a
/// shell, the CLI). Also what the MCP server's hook door asks of a caller (`agent-relay mcp`).
pub fn descends_from(pid: u32, root: u32) -> bool {
    let mut p = pid;
    for _ in 0..16 {
        if p == root {
            return true;
        }
        match parent_of(p) {
            Some(parent) if parent > 1 && parent != p => p = parent,
            _ => return false,
        }
    }
    false
}

/// A Claude Code process record: `(pid, sessionId)`.
fn session_record(path: &Path) -> Option<(u32, String)> {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    let pid = u32::try_from(v.get("pid")?.as_u64()?).ok()?;
    let id = v.get("sessionId")?.as_str()?;
    // A file name, nothing else: the id names a file in the transcripts' folder.
    let safe = !id.is_empty()
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    safe.then(|| (pid, id.to_owned()))
}

/// Claude Code's name for a working directory's folder: every character that is not an ASCII
/// letter or digit becomes `-` (one per UTF-16 unit, as its JavaScript does).
fn slug(cwd: &Path) -> String {
    cwd.to_string_lossy()
        .chars()
        .flat_map(|c| {
            let n = if c.is_ascii_alphanumeric() {
                0
            } else {
                c.len_utf16()
            };
            std::iter::repeat_n('-', n).chain((n == 0).then_some(c))
        })
        .collect()
}

/// Whether the first line of a Codex rollout names `cwd` as its session's working directory;
/// `None` while that line is not written whole.
fn codex_rollout_of(path: &Path, cwd: &Path) -> Option<bool> {
    // The header carries Codex's base instructions: tens of kilobytes.
    const MAX_HEADER: u64 = 1 << 20;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(MAX_HEADER)
        .read_to_end(&mut bytes)
        .ok()?;
    let Some(end) = bytes.iter().position(|&b| b == b'\n') else {
        return (bytes.len() as u64 >= MAX_HEADER).then_some(false);
    };
    let v: serde_json::Value = match serde_json::from_slice(&bytes[..end]) {
        Ok(v) => v,
        Err(_) => return Some(false),
    };
    let Some(theirs) = v
        .get("payload")
        .and_then(|p| p.get("cwd"))
        .and_then(serde_json::Value::as_str)
    else {
        return Some(false);
    };
    let theirs = Path::new(theirs);
    // The same folder, however either side spelled it (a symlink such as macOS's /tmp).
    let same = theirs == cwd
        || matches!(
            (theirs.canonicalize(), cwd.canonicalize()),
            (Ok(a), Ok(b)) if a == b
        );
    Some(same)
}

/// The sub-folders of `dir` (names sorted), the last `n` of them.
fn last_dirs(dir: &Path, n: usize) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect();
    names.sort();
    let skip = names.len().saturating_sub(n);
    names.split_off(skip)
}

/// The `.jsonl` files in `dir` whose names start with `prefix`.
fn jsonl_files(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.extension().is_some_and(|x| x == "jsonl")
                    && p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
            })
            .collect(),
        Err(_) => Vec::new(),
    }
}

impl Transcript {
    /// The records a CLI started in `cwd` with this process's environment keeps, as the
    /// profile says; `None` when its folder cannot be named (no HOME, no variable it needs).
    pub(crate) fn new(source: &TranscriptSource, cwd: &Path) -> Option<Self> {
        let root = expand(&source.dir)?;
        Some(match source.format {
            TranscriptFormat::Claude => Self::for_claude_in(&root, cwd),
            TranscriptFormat::Codex => Self::for_other(
                Other::Codex {
                    sessions: root,
                    owned: HashMap::new(),
                    open: Vec::new(),
                    looked: None,
                },
                cwd,
            ),
            TranscriptFormat::Gemini => Self::for_other(Other::Gemini { root }, cwd),
        })
    }

    /// The records of Codex or Gemini, those there already remembered as history.
    fn for_other(other: Other, cwd: &Path) -> Self {
        // Codex ends a directive with a block under it after its first line: held until the
        // rollout has it, any start matches (see `ReplySource::with_min_prefix`).
        // Both have every reply in their record once the output went quiet, and the wrapper
        // waits that long: a directive shown again after it went is a re-print.
        let source = match other {
            Other::Codex { .. } => ReplySource::with_min_prefix(1),
            Other::Gemini { .. } => ReplySource::new(),
        }
        .dropping_reprints();
        let mut t = Self {
            source,
            ..Self::empty(Some(other), Path::new(""), cwd)
        };
        for path in t.other_files() {
            if let Ok(m) = std::fs::metadata(&path) {
                t.start_len.insert(path, m.len());
            }
        }
        t
    }

    /// Whether directives the record has and the screen never showed are sent from it
    /// (Claude Code: it draws only the last screenful of a reply that arrives at once). Codex
    /// and Gemini draw every line: their records only give the screen's directives their text.
    ///
    /// Codex when its own rollout is known (open in the agent's processes): on its alternate
    /// screen (Codex's default, when `--no-alt-screen` is not given) a reply taller than the
    /// screen scrolls inside it and its first lines are never drawn (issue 23.17).
    pub(crate) fn sends_unseen(&self) -> bool {
        match &self.other {
            None => true,
            Some(Other::Codex { open, .. }) => !open.is_empty(),
            Some(Other::Gemini { .. }) => false,
        }
    }

    /// Looks for the records that are this agent's own, where they are told by its process
    /// (Codex's rollouts; Claude Code's sessions are looked for at each read).
    pub(crate) fn look_for_own(&mut self) {
        self.find_open_rollouts();
    }

    /// Whether the CLI writes a reply to its record only once the reply ends (Codex, Gemini):
    /// a directive the screen showed waits for the output to go quiet before it goes.
    pub(crate) fn writes_at_reply_end(&self) -> bool {
        self.other.is_some()
    }

    /// The CLI's name, for log lines.
    pub(crate) fn cli(&self) -> &'static str {
        match self.other {
            None => "Claude Code",
            Some(Other::Codex { .. }) => "Codex",
            Some(Other::Gemini { .. }) => "Gemini CLI",
        }
    }

    /// The record files of Codex or Gemini that may be this agent's (Codex: in the two latest
    /// day folders, so that a session over midnight is found).
    fn other_files(&self) -> Vec<PathBuf> {
        match &self.other {
            None => Vec::new(),
            Some(Other::Codex { sessions, .. }) => {
                let mut out = Vec::new();
                let mut days = Vec::new();
                for year in last_dirs(sessions, 2) {
                    for month in last_dirs(&year, 2) {
                        days.extend(last_dirs(&month, 2));
                    }
                }
                days.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
                let skip = days.len().saturating_sub(2);
                for day in &days[skip..] {
                    out.extend(jsonl_files(day, "rollout-"));
                }
                out
            }
            Some(Other::Gemini { root }) => {
                let mut projects = Vec::new();
                // 0.61.0: a short name per working directory, in `projects.json`.
                if let Ok(bytes) = std::fs::read(root.join("projects.json"))
                    && let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes)
                    && let Some(name) = v
                        .get("projects")
                        .and_then(|p| p.get(self.cwd.to_string_lossy().as_ref()))
                        .and_then(serde_json::Value::as_str)
                    && !name.is_empty()
                    && name != ".."
                    && !name.contains(['/', '\\'])
                {
                    projects.push(name.to_owned());
                }
                // Before: the SHA-256 of the path, in hex.
                use sha2::Digest;
                let hash = sha2::Sha256::digest(self.cwd.to_string_lossy().as_bytes());
                projects.push(hash.iter().map(|b| format!("{b:02x}")).collect());
                projects
                    .iter()
                    .flat_map(|p| jsonl_files(&root.join("tmp").join(p).join("chats"), ""))
                    .collect()
            }
        }
    }

    /// The transcripts under Claude Code's configuration folder `root`.
    fn for_claude_in(root: &Path, cwd: &Path) -> Self {
        let mut t = Self::empty(None, root, cwd);
        // What a resumed session said before the wrapper started: already sent (or not) by
        // an earlier wrapper; only to judge what the screen shows again.
        for folder in t.folders() {
            let Ok(entries) = std::fs::read_dir(&folder) else {
                continue;
            };
            for e in entries.flatten() {
                if let Ok(m) = e.metadata() {
                    t.start_len.insert(e.path(), m.len());
                }
            }
        }
        t
    }

    /// Nothing read or found yet.
    fn empty(other: Option<Other>, root: &Path, cwd: &Path) -> Self {
        Self {
            other,
            cwd: cwd.to_owned(),
            projects: root.join("projects"),
            sessions: root.join("sessions"),
            slug: slug(cwd),
            agent_pid: None,
            claude_pid: None,
            own: Vec::new(),
            start_len: HashMap::new(),
            read: HashMap::new(),
            source: ReplySource::new(),
            files: 0,
        }
    }

    /// The agent's process: only the transcripts of Claude Code sessions it (or a descendant)
    /// runs are read.
    pub(crate) fn set_agent_pid(&mut self, pid: u32) {
        self.agent_pid = Some(pid);
    }

    /// The directives the replies said that the screen did not show, after reading what was
    /// added to the transcripts: to be sent now (each once; see [`ReplySource::take_unseen`]).
    pub(crate) fn take_unseen(&mut self) -> Vec<Directive> {
        self.read_new();
        self.source.take_unseen()
    }

    /// How many transcript files were found so far.
    pub(crate) fn files(&self) -> usize {
        self.files
    }

    /// Where the transcripts are looked for (for a log line).
    pub(crate) fn folder(&self) -> PathBuf {
        match &self.other {
            None => self.projects.join(&self.slug),
            Some(Other::Codex { sessions, .. }) => sessions.clone(),
            Some(Other::Gemini { root }) => root.join("tmp"),
        }
    }

    /// Where `d` (found on the screen) comes from, after reading what was added to the
    /// transcripts since the last look.
    /// Whether this agent's replies, read on now, have `d` (see [`ReplySource::knows`]).
    pub(crate) fn knows(&mut self, d: &Directive) -> bool {
        self.read_new();
        self.source.knows(d)
    }

    /// A prompt was submitted (the wrapper's Enter, a person's under the PTY): what the screen
    /// shows from now on is a new turn's (see [`ReplySource::new_turn`]).
    pub(crate) fn new_turn(&mut self) {
        // What the record has of the turns before goes to them.
        self.read_new();
        self.source.new_turn();
    }

    pub(crate) fn check(&mut self, d: &Directive) -> Origin {
        self.read_new();
        self.source.check(d)
    }

    fn folders(&self) -> Vec<PathBuf> {
        if self.slug.len() <= MAX_SLUG {
            return vec![self.projects.join(&self.slug)];
        }
        // A long path: `<first 200>-<hash>`, the hash of Claude Code's own making.
        let prefix = format!("{}-", &self.slug[..MAX_SLUG]);
        match std::fs::read_dir(&self.projects) {
            Ok(entries) => entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                .map(|e| e.path())
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    /// Finds this agent's sessions: its Claude Code's record once known, else every record of
    /// a process descending from the agent's.
    fn find_own(&mut self) {
        let Some(root) = self.agent_pid else { return };
        let records: Vec<PathBuf> = match self.claude_pid {
            Some(pid) => vec![self.sessions.join(format!("{pid}.json"))],
            None => match std::fs::read_dir(&self.sessions) {
                Ok(entries) => entries
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "json"))
                    .collect(),
                // Not there yet: Claude Code writes it as it starts.
                Err(_) => return,
            },
        };
        for path in records {
            let Some((pid, id)) = session_record(&path) else {
                continue;
            };
            let ours = match self.claude_pid {
                Some(known) => pid == known,
                None => descends_from(pid, root),
            };
            if !ours {
                continue;
            }
            self.claude_pid = Some(pid);
            if !self.own.contains(&id) {
                tracing::debug!(pid, session = %id, "a Claude Code session of this agent's");
                self.own.push(id);
            }
        }
    }

    /// Codex: looks for the rollouts the agent's processes have open: at each read until one
    /// is found (Codex opens it with the first prompt), then at most every few seconds (a new
    /// session opens another).
    fn find_open_rollouts(&mut self) {
        let Some(root) = self.agent_pid else { return };
        let Some(Other::Codex {
            sessions,
            open,
            looked,
            ..
        }) = &mut self.other
        else {
            return;
        };
        let now = relay_protocol::now_instant();
        if !open.is_empty()
            && looked.is_some_and(|at| now.duration_since(at) < std::time::Duration::from_secs(5))
        {
            return;
        }
        *looked = Some(now);
        let found = rollouts::open_in(root, sessions);
        for path in &found {
            if !open.contains(path) {
                tracing::info!(file = %path.display(), "this agent's own Codex rollout (open in its process): directives its replies have that the screen never drew are sent from it");
            }
        }
        // Those found before stay (one closed by a new session has nothing more to read).
        for path in found {
            if !open.contains(&path) {
                open.push(path);
            }
        }
    }

    /// Reads what was added to this agent's transcripts.
    fn read_new(&mut self) {
        if self.other.is_some() {
            self.read_new_other();
            return;
        }
        self.find_own();
        for folder in self.folders() {
            for i in 0..self.own.len() {
                let path = folder.join(format!("{}.jsonl", self.own[i]));
                match self.read_file(&path) {
                    Ok(()) => {}
                    // Not written yet (the file comes with the first prompt).
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        tracing::debug!(file = %path.display(), error = %e, "cannot read Claude Code's transcript; code blocks are told by colour only");
                    }
                }
            }
        }
    }

    /// Reads what was added to Codex's or Gemini's records of this working directory (Codex:
    /// only the agent's own rollouts, once they are found open in its processes).
    fn read_new_other(&mut self) {
        self.find_open_rollouts();
        if let Some(Other::Codex { open, .. }) = &self.other
            && !open.is_empty()
        {
            for path in open.clone() {
                if let Err(e) = self.read_file(&path) {
                    tracing::debug!(file = %path.display(), error = %e, "cannot read this agent's Codex rollout; the screen's copy goes");
                }
            }
            return;
        }
        for path in self.other_files() {
            if let Some(Other::Codex { owned, .. }) = &mut self.other {
                let ours = match owned.get(&path) {
                    Some(&ours) => ours,
                    None => match codex_rollout_of(&path, &self.cwd) {
                        Some(ours) => {
                            if ours {
                                tracing::debug!(file = %path.display(), "a Codex session of this working directory");
                            }
                            owned.insert(path.clone(), ours);
                            ours
                        }
                        // Its header is not written whole yet.
                        None => false,
                    },
                };
                if !ours {
                    continue;
                }
            }
            match self.read_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::debug!(file = %path.display(), error = %e, "cannot read the CLI's record of its replies; the screen's copy goes");
                }
            }
        }
    }

    fn read_file(&mut self, path: &Path) -> std::io::Result<()> {
        let mut file = std::fs::File::open(path)?;
        let len = file.metadata()?.len();
        let known = self.read.get(path).copied();
        let at_start = self.start_len.get(path).copied();
        let mut from = match (known, at_start) {
            (Some(n), _) if n <= len => n,
            // There when the wrapper started: its recent part (only recent replies can be
            // on the screen).
            (_, Some(n)) => n.min(len).saturating_sub(FIRST_READ),
            // New since (or rewritten): all of it.
            _ => 0,
        };
        if from == len {
            return Ok(());
        }
        file.seek(SeekFrom::Start(from))?;
        let mut bytes = Vec::new();
        file.take(len - from).read_to_end(&mut bytes)?;
        let mut text = &bytes[..];
        if known.is_none() && from > 0 {
            // Started mid-file: skip to the next whole line.
            let skip = text
                .iter()
                .position(|&b| b == b'\n')
                .map_or(text.len(), |i| i + 1);
            text = &text[skip..];
            from += skip as u64;
        }
        // Only whole lines: the last one may still be being written.
        let whole = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let mut at = from;
        for line in text[..whole].split_inclusive(|&b| b == b'\n') {
            // Written before the wrapper started: history.
            let history = at_start.is_some_and(|n| at < n);
            at += line.len() as u64;
            let (reply_text, user_turn): (ReplyText, UserTurn) = match self.other {
                None => (claude_reply_text, |_| false),
                Some(Other::Codex { .. }) => (codex_reply_text, codex_user_turn),
                Some(Other::Gemini { .. }) => (gemini_reply_text, gemini_user_turn),
            };
            let line = std::str::from_utf8(line).ok().map(str::trim_end);
            if !history && line.is_some_and(user_turn) {
                // A prompt the record has (a person's, under tmux, included): a new turn.
                self.source.prompt_recorded();
            }
            if let Some(reply) = line.and_then(reply_text) {
                if history {
                    self.source.add_history(&reply);
                } else {
                    self.source.add_reply(&reply);
                }
            }
        }
        if self
            .read
            .insert(path.to_owned(), from + whole as u64)
            .is_none()
        {
            self.files += 1;
        }
        Ok(())
    }
}

/// The outbox's gate (see `decide/outbox.rs`): the record read from the files.
impl crate::decide::outbox::Gate for Transcript {
    fn knows(&mut self, d: &Directive) -> bool {
        Transcript::knows(self, d)
    }
    fn check(&mut self, d: &Directive) -> Origin {
        Transcript::check(self, d)
    }
    fn sends_unseen(&self) -> bool {
        Transcript::sends_unseen(self)
    }
    fn writes_at_reply_end(&self) -> bool {
        Transcript::writes_at_reply_end(self)
    }
    fn look_for_own(&mut self) {
        Transcript::look_for_own(self);
    }
    fn take_unseen(&mut self) -> Vec<Directive> {
        Transcript::take_unseen(self)
    }
    fn files(&self) -> usize {
        Transcript::files(self)
    }
    fn cli(&self) -> &'static str {
        Transcript::cli(self)
    }
    fn folder(&self) -> PathBuf {
        Transcript::folder(self)
    }
    fn set_agent_pid(&mut self, pid: u32) {
        Transcript::set_agent_pid(self, pid);
    }
    fn new_turn(&mut self) {
        Transcript::new_turn(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use relay_parse::Target;

    fn msg(body: &str) -> Directive {
        Directive::message(Target::Agent("Bob".into()), body)
    }

    #[test]
    fn slug_is_claude_codes() {
        assert_eq!(slug(Path::new("/tmp/rec328/work")), "-tmp-rec328-work");
        assert_eq!(slug(Path::new("/a b/é_x")), "-a-b---x");
        assert_eq!(slug(Path::new("/😀")), "---");
    }

    fn transcript(dir: &Path, cwd: &Path) -> Transcript {
        let mut t = Transcript::for_claude_in(dir, cwd);
        t.set_agent_pid(std::process::id());
        t
    }

    /// Claude Code's record of process `pid` running session `id`.
    fn record(dir: &Path, pid: u32, id: &str) {
        std::fs::write(
            dir.join(format!("sessions/{pid}.json")),
            format!(r#"{{"pid":{pid},"sessionId":"{id}","cwd":"/w"}}"#),
        )
        .unwrap();
    }

    const REPLY: &str = r#"{"type":"assistant","message":{"content":[{"type":"text","text":"```text\n@relay:Bob quoted\n```\n\n@relay:Bob said"}]}}"#;

    #[test]
    fn reads_whole_lines_as_they_are_added() {
        let dir = tempfile::tempdir().unwrap();
        let cwd = Path::new("/w");
        let folder = dir.path().join("projects/-w");
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::create_dir_all(dir.path().join("sessions")).unwrap();
        let mut t = transcript(dir.path(), cwd);
        assert_eq!(t.check(&msg("before")), Origin::Unknown);
        // This process stands for the agent's Claude Code.
        let me = std::process::id();
        record(dir.path(), me, "s1");
        let file = folder.join("s1.jsonl");
        // Half a line: not read yet.
        std::fs::write(&file, &REPLY[..20]).unwrap();
        assert_eq!(t.take_unseen(), []);
        std::fs::write(&file, format!("{REPLY}\n")).unwrap();
        assert_eq!(t.check(&msg("quoted")), Origin::Quoted);
        assert_eq!(t.check(&msg("said")), Origin::Said(msg("said")));
        assert_eq!(t.check(&msg("said")), Origin::Unknown);
        assert_eq!(t.files(), 1);
    }

    /// Another agent's Claude Code in the same folder (a process that is not the agent's
    /// descendant): its transcript is never read, so nothing it says is sent from here.
    #[test]
    fn another_processs_transcript_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let cwd = Path::new("/w");
        let folder = dir.path().join("projects/-w");
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::create_dir_all(dir.path().join("sessions")).unwrap();
        let mut t = transcript(dir.path(), cwd);
        // pid 1 is no descendant of this process.
        record(dir.path(), 1, "other");
        std::fs::write(folder.join("other.jsonl"), format!("{REPLY}\n")).unwrap();
        assert_eq!(t.take_unseen(), []);
        assert_eq!(t.check(&msg("said")), Origin::Unknown);
        assert_eq!(t.files(), 0);
        // Found with this agent's own record, in one look: still not read.
        let me = std::process::id();
        record(dir.path(), me, "mine");
        assert_eq!(t.take_unseen(), []);
        assert_eq!(t.own, ["mine"]);
        // A session id that is not a plain file name is not followed.
        let me = std::process::id();
        record(dir.path(), me, "../-w/other");
        assert_eq!(t.take_unseen(), []);
    }

    /// What a resumed session's transcript held when the wrapper started is history: never
    /// sent from; what is added after is.
    #[test]
    fn what_was_there_at_start_is_history() {
        let dir = tempfile::tempdir().unwrap();
        let cwd = Path::new("/w");
        let folder = dir.path().join("projects/-w");
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::create_dir_all(dir.path().join("sessions")).unwrap();
        let old = REPLY.replace("said", "earlier");
        std::fs::write(folder.join("s1.jsonl"), format!("{old}\n")).unwrap();
        let mut t = Transcript::for_claude_in(dir.path(), cwd);
        t.set_agent_pid(std::process::id());
        let me = std::process::id();
        record(dir.path(), me, "s1");
        assert_eq!(t.take_unseen(), []);
        std::fs::write(folder.join("s1.jsonl"), format!("{old}\n{REPLY}\n")).unwrap();
        assert_eq!(t.take_unseen(), [msg("said")]);
        assert_eq!(t.check(&msg("earlier")), Origin::Said(msg("earlier")));
    }

    #[test]
    fn a_profiles_folder_is_expanded() {
        let home = std::env::var("HOME").unwrap();
        assert_eq!(
            expand("~/.gemini"),
            Some(PathBuf::from(format!("{home}/.gemini")))
        );
        assert_eq!(
            expand("${RELAY_TEST_SURELY_UNSET:-~/.codex}/sessions"),
            Some(PathBuf::from(format!("{home}/.codex/sessions")))
        );
        assert_eq!(
            expand("${HOME:-/x}/y"),
            Some(PathBuf::from(format!("{home}/y")))
        );
        assert_eq!(expand("${RELAY_TEST_SURELY_UNSET}/y"), None);
        assert_eq!(expand("/abs"), Some(PathBuf::from("/abs")));
    }

    /// Codex: only rollouts whose header names this working directory are read, and only
    /// what was added after the wrapper started is more than history.
    #[test]
    fn codex_reads_this_working_directorys_rollouts() {
        let dir = tempfile::tempdir().unwrap();
        let day = dir.path().join("2026/11/26");
        std::fs::create_dir_all(&day).unwrap();
        let header =
            |cwd: &str| format!(r#"{{"type":"session_meta","payload":{{"cwd":"{cwd}"}}}}"#);
        let reply = |text: &str| {
            format!(
                r#"{{"type":"response_item","payload":{{"type":"message","role":"assistant","content":[{{"type":"output_text","text":"{text}"}}]}}}}"#
            )
        };
        std::fs::write(
            day.join("rollout-other.jsonl"),
            format!("{}\n{}\n", header("/elsewhere"), reply("@relay:Bob theirs")),
        )
        .unwrap();
        let source = TranscriptSource {
            format: TranscriptFormat::Codex,
            dir: dir.path().display().to_string(),
        };
        let mut t = Transcript::new(&source, Path::new("/w")).unwrap();
        assert!(!t.sends_unseen());
        std::fs::write(
            day.join("rollout-mine.jsonl"),
            format!(
                "{}\n{}\n",
                header("/w"),
                reply("@relay:Bob Here:\\n    x()")
            ),
        )
        .unwrap();
        assert!(!t.knows(&msg("theirs")));
        assert!(t.knows(&msg("Here:")));
        assert_eq!(t.check(&msg("Here:")), Origin::Said(msg("Here:\n    x()")));
    }

    /// Gemini: the chats of the project `projects.json` names for this working directory.
    #[test]
    fn gemini_reads_its_projects_chats() {
        let dir = tempfile::tempdir().unwrap();
        let chats = dir.path().join("tmp/work/chats");
        std::fs::create_dir_all(&chats).unwrap();
        std::fs::write(
            dir.path().join("projects.json"),
            r#"{"projects":{"/w":"work"}}"#,
        )
        .unwrap();
        let source = TranscriptSource {
            format: TranscriptFormat::Gemini,
            dir: dir.path().display().to_string(),
        };
        let mut t = Transcript::new(&source, Path::new("/w")).unwrap();
        std::fs::write(
            chats.join("session-1.jsonl"),
            "{\"id\":\"1\",\"type\":\"gemini\",\"content\":\"@relay:Bob a **bold** step, long enough to match\"}\n",
        )
        .unwrap();
        assert_eq!(
            t.check(&msg("a bold step, long enough to match")),
            Origin::Said(msg("a **bold** step, long enough to match"))
        );
    }

    #[test]
    fn a_process_descends_from_itself_and_its_parent() {
        let me = std::process::id();
        assert!(descends_from(me, me));
        let parent = parent_of(me).unwrap();
        assert!(descends_from(me, parent));
        assert!(!descends_from(parent, me));
    }
}
