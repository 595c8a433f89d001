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

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use relay_parse::Directive;
use relay_parse::transcript::{Origin, ReplySource, claude_reply_text};

/// Longest slug Claude Code uses as is; longer ones are cut and given a hash suffix.
const MAX_SLUG: usize = 200;
/// At most this much of a transcript that is already long is read the first time (a resumed
/// session): only its recent replies can be on the screen.
const FIRST_READ: u64 = 8 << 20;

/// The transcripts of this agent's Claude Code sessions (in one working directory).
pub(crate) struct Transcript {
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
/// shell, the CLI).
fn descends_from(pid: u32, root: u32) -> bool {
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

impl Transcript {
    /// The transcripts of a Claude Code started in `cwd` with this process's environment
    /// (`CLAUDE_CONFIG_DIR`, else `$HOME/.claude`); `None` without either.
    pub(crate) fn for_claude(cwd: &Path) -> Option<Self> {
        let root = std::env::var_os("CLAUDE_CONFIG_DIR")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".claude")))?;
        Some(Self::for_claude_in(&root, cwd))
    }

    /// The transcripts under Claude Code's configuration folder `root`.
    fn for_claude_in(root: &Path, cwd: &Path) -> Self {
        let mut t = Self {
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
        };
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
        self.projects.join(&self.slug)
    }

    /// Where `d` (found on the screen) comes from, after reading what was added to the
    /// transcripts since the last look.
    /// Whether this agent's replies, read on now, have `d` (see [`ReplySource::knows`]).
    pub(crate) fn knows(&mut self, d: &Directive) -> bool {
        self.read_new();
        self.source.knows(d)
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

    /// Reads what was added to this agent's transcripts.
    fn read_new(&mut self) {
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
            if let Some(reply) = std::str::from_utf8(line)
                .ok()
                .and_then(|l| claude_reply_text(l.trim_end()))
            {
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
        let mut t = Transcript {
            projects: dir.join("projects"),
            sessions: dir.join("sessions"),
            slug: slug(cwd),
            agent_pid: None,
            claude_pid: None,
            own: Vec::new(),
            start_len: HashMap::new(),
            read: HashMap::new(),
            source: ReplySource::new(),
            files: 0,
        };
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
    fn a_process_descends_from_itself_and_its_parent() {
        let me = std::process::id();
        assert!(descends_from(me, me));
        let parent = parent_of(me).unwrap();
        assert!(descends_from(me, parent));
        assert!(!descends_from(parent, me));
    }
}
