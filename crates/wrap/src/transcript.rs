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

/// The transcripts of the Claude Code sessions started in one working directory.
pub(crate) struct Transcript {
    projects: PathBuf,
    slug: String,
    /// Bytes of each file read so far (up to its last complete line).
    read: HashMap<PathBuf, u64>,
    source: ReplySource,
    /// Transcript files found so far.
    files: usize,
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
        let mut t = Self {
            projects: root.join("projects"),
            slug: slug(cwd),
            read: HashMap::new(),
            source: ReplySource::new(),
            files: 0,
        };
        // What a resumed session said before the wrapper started: already sent (or not) by
        // an earlier wrapper; only to judge what the screen shows again.
        t.read_new(true);
        Some(t)
    }

    /// The directives the replies said that the screen did not show, after reading what was
    /// added to the transcripts: to be sent now (each once; see [`ReplySource::take_unseen`]).
    pub(crate) fn take_unseen(&mut self) -> Vec<Directive> {
        self.read_new(false);
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
    pub(crate) fn check(&mut self, d: &Directive) -> Origin {
        self.read_new(false);
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

    /// Reads what was added to the transcripts; `history`: written before the wrapper started.
    fn read_new(&mut self, history: bool) {
        for folder in self.folders() {
            let entries = match std::fs::read_dir(&folder) {
                Ok(e) => e,
                // No reply written yet (the folder comes with the first prompt).
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => {
                    tracing::debug!(folder = %folder.display(), error = %e, "cannot list Claude Code's transcripts; code blocks are told by colour only");
                    continue;
                }
            };
            for entry in entries.flatten() {
                let path = entry.path();
                if path.extension().is_none_or(|x| x != "jsonl") {
                    continue;
                }
                if let Err(e) = self.read_file(&path, history) {
                    tracing::debug!(file = %path.display(), error = %e, "cannot read Claude Code's transcript; code blocks are told by colour only");
                }
            }
        }
    }

    fn read_file(&mut self, path: &Path, history: bool) -> std::io::Result<()> {
        let mut file = std::fs::File::open(path)?;
        let len = file.metadata()?.len();
        let known = self.read.get(path).copied();
        let mut from = match known {
            Some(n) if n <= len => n,
            // There when the wrapper started: its recent part (only recent replies can be
            // on the screen).
            _ if history => len.saturating_sub(FIRST_READ),
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
        for line in text[..whole].split(|&b| b == b'\n') {
            if let Some(reply) = std::str::from_utf8(line).ok().and_then(claude_reply_text) {
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

    #[test]
    fn reads_whole_lines_as_they_are_added() {
        let dir = tempfile::tempdir().unwrap();
        let cwd = Path::new("/w");
        let folder = dir.path().join("projects/-w");
        std::fs::create_dir_all(&folder).unwrap();
        let mut t = Transcript {
            projects: dir.path().join("projects"),
            slug: slug(cwd),
            read: HashMap::new(),
            source: ReplySource::new(),
            files: 0,
        };
        assert_eq!(t.check(&msg("before")), Origin::Unknown);
        let reply = r#"{"type":"assistant","message":{"content":[{"type":"text","text":"```text\n@relay:Bob quoted\n```\n\n@relay:Bob said"}]}}"#;
        let file = folder.join("s.jsonl");
        // Half a line: not read yet.
        std::fs::write(&file, &reply[..20]).unwrap();
        assert_eq!(t.take_unseen(), []);
        std::fs::write(&file, format!("{reply}\n")).unwrap();
        assert_eq!(t.check(&msg("quoted")), Origin::Quoted);
        assert_eq!(t.check(&msg("said")), Origin::Said);
        assert_eq!(t.check(&msg("said")), Origin::Unknown);
    }
}
