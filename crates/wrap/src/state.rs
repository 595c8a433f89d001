//! What a wrapper remembers on disk, in `<data>/team/<name>/`, so that a restarted wrapper
//! neither types a message twice nor forgets where it was:
//!
//! - `injected.log`: one line per message typed (`T <id>`, before the text is typed), per
//!   Enter pressed for it (`E <id>`, before the Enter is written) and per outcome
//!   (`D <id> <state>`), each appended and flushed in one write.
//! - `inbox.md` (with `--inbox`): every message for the agent, for it to read if typing ever
//!   fails; rewritten atomically (temporary file, then rename).
//! - `checkpoint` (tmux backend): down to which pane row the output has been read with every directive
//!   in it relayed.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use relay_protocol::file::{Durability, write_atomic};
use relay_protocol::text;

/// Ids remembered; older ones are dropped when the log is compacted.
const REMEMBER: usize = 10_000;

/// How far a remembered message got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Typed {
    /// Typing started, Enter not pressed yet (the wrapper stopped in between): the text
    /// went no further than the agent's input line.
    Started,
    /// Enter was pressed (or about to be) and no outcome recorded: the agent may have
    /// taken the message.
    Entered,
    /// Submitted and seen on the screen.
    Verified,
    /// Typed but not seen submitted.
    Failed,
}

/// The ids this agent's terminal has been given, persisted.
#[derive(Debug)]
pub struct InjectedLog {
    path: PathBuf,
    ids: HashMap<String, Typed>,
    order: std::collections::VecDeque<String>,
    lines: usize,
    /// Texts typed, with the checkpoint's pane row when typing began (tmux).
    typed_at: Vec<(u64, String)>,
}

impl InjectedLog {
    /// Loads `dir/injected.log` (creating `dir`).
    ///
    /// # Errors
    /// The directory cannot be created or the file read.
    pub fn open(dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join("injected.log");
        let mut log = Self {
            path,
            ids: HashMap::new(),
            order: std::collections::VecDeque::new(),
            lines: 0,
            typed_at: Vec::new(),
        };
        match std::fs::read_to_string(&log.path) {
            Ok(text) => {
                // A last line without its newline was cut short by a crash: ignore it, and
                // end it so that the next line starts on a line of its own.
                let whole = text.rfind('\n').map_or("", |end| &text[..end]);
                if !text.is_empty() && !text.ends_with('\n') {
                    std::fs::OpenOptions::new()
                        .append(true)
                        .open(&log.path)?
                        .write_all(b"\n")?;
                }
                for line in whole.lines() {
                    log.lines += 1;
                    let mut parts = line.splitn(4, ' ');
                    match (parts.next(), parts.next(), parts.next()) {
                        (Some("T"), Some(id), offset) => {
                            log.remember(id, Typed::Started);
                            if let (Some(Ok(at)), Some(text)) =
                                (offset.map(str::parse), parts.next())
                            {
                                log.typed_at.push((at, text.to_owned()));
                            }
                        }
                        (Some("E"), Some(id), _) => log.remember(id, Typed::Entered),
                        (Some("D"), Some(id), Some("verified")) => {
                            log.remember(id, Typed::Verified);
                        }
                        (Some("D"), Some(id), Some(_)) => log.remember(id, Typed::Failed),
                        // A line cut short by a crash: ignore it.
                        _ => {}
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        if log.lines > 4 * REMEMBER {
            log.compact()?;
        }
        Ok(log)
    }

    fn remember(&mut self, id: &str, state: Typed) {
        if self.ids.insert(id.to_owned(), state).is_none() {
            self.order.push_back(id.to_owned());
            if self.order.len() > REMEMBER
                && let Some(old) = self.order.pop_front()
            {
                self.ids.remove(&old);
            }
        }
    }

    /// What is remembered about `id`.
    pub fn get(&self, id: &str) -> Option<Typed> {
        self.ids.get(id).copied()
    }

    fn append(&mut self, line: &str) -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        // One write: a crash leaves a whole line or a cut one (ignored on load).
        f.write_all(format!("{line}\n").as_bytes())?;
        self.lines += 1;
        Ok(())
    }

    /// Records that typing `id` starts now. Call before the first byte is typed.
    ///
    /// # Errors
    /// The log cannot be written (the caller should not type, or risk typing twice later).
    pub fn started(&mut self, id: &str) -> std::io::Result<()> {
        line_safe(id)?;
        self.append(&format!("T {id}"))?;
        self.remember(id, Typed::Started);
        Ok(())
    }

    /// Like [`InjectedLog::started`], also recording the text and the checkpoint's pane row
    /// `at` when typing began, so that a wrapper re-reading the pane from before that point
    /// knows the echo of `text` for what it is (see [`InjectedLog::typed_since`]).
    ///
    /// # Errors
    /// The log cannot be written.
    pub fn started_at(&mut self, id: &str, at: u64, text: &str) -> std::io::Result<()> {
        line_safe(id)?;
        // The text is one line (see `format::injected_text`); keep it so, whatever the caller
        // passes: a line break in it would make a second log line.
        let text = text::typed(text);
        self.append(&format!("T {id} {at} {text}"))?;
        self.remember(id, Typed::Started);
        Ok(())
    }

    /// Records that Enter is about to be pressed for `id` (typed before, see
    /// [`InjectedLog::started`]). Call before the Enter is written: from then on a restarted
    /// wrapper counts the message as possibly taken, and does not type it again.
    ///
    /// # Errors
    /// The log cannot be written (the caller should not press Enter, or risk typing twice
    /// later).
    pub fn entered(&mut self, id: &str) -> std::io::Result<()> {
        self.append(&format!("E {id}"))?;
        self.remember(id, Typed::Entered);
        Ok(())
    }

    /// The texts typed at or after checkpoint row `from`, oldest first, as recorded by
    /// earlier wrappers.
    pub fn typed_since(&self, from: u64) -> Vec<(u64, String)> {
        let mut v: Vec<_> = self
            .typed_at
            .iter()
            .filter(|(at, _)| *at >= from)
            .cloned()
            .collect();
        v.sort_by_key(|(at, _)| *at);
        v
    }

    /// Records how typing `id` ended.
    ///
    /// # Errors
    /// The log cannot be written.
    pub fn finished(&mut self, id: &str, verified: bool) -> std::io::Result<()> {
        line_safe(id)?;
        let state = if verified { "verified" } else { "failed" };
        self.append(&format!("D {id} {state}"))?;
        let t = if verified {
            Typed::Verified
        } else {
            Typed::Failed
        };
        if let Some(s) = self.ids.get_mut(id) {
            *s = t;
        } else {
            self.remember(id, t);
        }
        Ok(())
    }

    /// Rewrites the log with only what is remembered.
    fn compact(&mut self) -> std::io::Result<()> {
        let mut text = String::new();
        for id in &self.order {
            match self.ids.get(id) {
                Some(Typed::Started) => text.push_str(&format!("T {id}\n")),
                Some(Typed::Entered) => text.push_str(&format!("E {id}\n")),
                Some(Typed::Verified) => text.push_str(&format!("D {id} verified\n")),
                Some(Typed::Failed) => text.push_str(&format!("D {id} failed\n")),
                None => {}
            }
        }
        write_atomically(&self.path, text.as_bytes())?;
        self.lines = self.order.len();
        Ok(())
    }
}

/// An id goes into `injected.log` only when it is one word of the relay's id alphabet: a space
/// or a line break in it would make a line that says something else (`x\nD other verified`).
fn line_safe(id: &str) -> std::io::Result<()> {
    relay_protocol::validate_message_id(id)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
}

/// Writes `bytes` to `path` so that readers, and a wrapper restarted after a crash, see the
/// old file or the new one, never a part; the file is the owner's alone (0600).
///
/// No fsync ([`Durability::ProcessCrash`]): these files must survive the wrapper being killed,
/// which the page cache guarantees; surviving a power cut is not worth the wait. (An fsync here
/// once held the relaying loop, and the messages it had just handed to the client, for over a
/// second on a busy disk.)
///
/// # Errors
/// Any I/O error.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_atomic(path, bytes, Durability::ProcessCrash)
}

/// One message as the file inbox shows it.
#[derive(Debug)]
pub struct InboxEntry<'a> {
    /// Message id.
    pub id: &'a str,
    /// Sender.
    pub from: &'a str,
    /// When it was stored (Unix ms).
    pub ts: u64,
    /// Thread, if any.
    pub thread: Option<&'a str>,
    /// The text (control characters are shown escaped here, see
    /// [`relay_protocol::text::for_terminal`]).
    pub body: &'a str,
}

/// Appends `entry` to `<dir>/inbox.md`, replacing the file atomically.
///
/// # Errors
/// Any I/O error.
pub fn append_inbox(dir: &Path, entry: &InboxEntry<'_>) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join("inbox.md");
    let mut text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            "# Relay inbox\n\nMessages sent to this agent through agent-relay, oldest first.\n"
                .to_owned()
        }
        Err(e) => return Err(e),
    };
    // The file is read by the agent and by people (`cat inbox.md`): relay-supplied text has its
    // control characters shown, never raw; the heading stays one line.
    let thread = entry
        .thread
        .map(|t| format!(" (thread {})", text::one_line(t, 200)))
        .unwrap_or_default();
    text.push_str(&format!(
        "\n## From {} [{}]{} at {}\n\n{}\n",
        text::one_line(entry.from, 200),
        text::one_line(entry.id, 200),
        thread,
        rfc3339(entry.ts),
        text::for_terminal(entry.body).trim_end()
    ));
    write_atomically(&path, text.as_bytes())
}

/// Unix ms as `YYYY-MM-DDTHH:MM:SSZ` (UTC); past the year 9999, the milliseconds themselves.
fn rfc3339(ms: u64) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .map_or_else(
            || format!("{ms} ms"),
            |t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        )
}

/// How far the tmux pane has been relayed: the pane row (counted from the oldest row of its
/// history) above which every directive was sent and acknowledged, and the key that makes
/// directive ids repeatable from there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Checkpoint {
    /// The pane row (`#{history_size}` + `#{cursor_y}` when it was saved).
    pub offset: u64,
    /// Unix ms when this checkpoint was taken; directive ids found after it are derived from
    /// it, so a wrapper that restarts here sends the same ids again (and the relay drops them
    /// as duplicates) instead of new ones.
    pub at_ms: u64,
}

impl Checkpoint {
    /// Loads `dir/checkpoint` (zero when absent or unreadable).
    pub fn load(dir: &Path) -> Self {
        let Ok(text) = std::fs::read_to_string(dir.join("checkpoint")) else {
            return Self::default();
        };
        let mut it = text.split_whitespace().map(str::parse::<u64>);
        match (it.next(), it.next()) {
            (Some(Ok(offset)), Some(Ok(at_ms))) => Self { offset, at_ms },
            _ => Self::default(),
        }
    }

    /// Saves to `dir/checkpoint`, atomically.
    ///
    /// # Errors
    /// Any I/O error.
    pub fn save(&self, dir: &Path) -> std::io::Result<()> {
        write_atomically(
            &dir.join("checkpoint"),
            format!("{} {}\n", self.offset, self.at_ms).as_bytes(),
        )
    }

    /// The id of the `n`-th directive to `to` with text `body` found after this checkpoint in
    /// the session `session`: a ULID whose time is the checkpoint's and whose random part is
    /// a hash of the rest. Keyed by content, not by position: a wrapper that restarts here
    /// reads the log without knowing what its predecessor typed, so it may skip a directive
    /// that its predecessor read (the echo of an injection hides what follows it), and the
    /// ones it does find must still get the ids they had.
    ///
    /// The checkpoint's time is hashed too (issue 24.7): a short id is the random part's end,
    /// and an agent started again (a new session under the same name, its rows counted from 0
    /// again) printing the same lines must not get the short ids of its previous run. A
    /// restarted wrapper loads the same checkpoint, so its ids stay the same.
    pub fn directive_id(&self, session: &str, to: &str, body: &str, n: u32) -> String {
        // SHA-256, not std's hasher: the ids must stay the same across a wrapper upgrade.
        use sha2::Digest;
        let digest = sha2::Sha256::new()
            .chain_update(session.as_bytes())
            .chain_update([0])
            .chain_update(self.at_ms.to_be_bytes())
            .chain_update(self.offset.to_be_bytes())
            .chain_update(to.as_bytes())
            .chain_update([0])
            .chain_update(body.as_bytes())
            .chain_update([0])
            .chain_update(n.to_be_bytes())
            .finalize();
        let mut bytes = [0u8; 16];
        bytes.copy_from_slice(&digest[..16]);
        let random = u128::from_be_bytes(bytes) & ((1u128 << 80) - 1);
        ulid::Ulid::from_parts(self.at_ms, random).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_survives_a_restart_and_a_cut_line() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = InjectedLog::open(dir.path()).unwrap();
        log.started("A").unwrap();
        log.finished("A", true).unwrap();
        log.started("B").unwrap();
        log.started("C").unwrap();
        log.finished("C", false).unwrap();
        log.started("G").unwrap();
        log.entered("G").unwrap();
        // A crash in the middle of a line.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join("injected.log"))
            .unwrap();
        f.write_all(b"D B verif").unwrap();
        let mut log = InjectedLog::open(dir.path()).unwrap();
        assert_eq!(log.get("A"), Some(Typed::Verified));
        assert_eq!(
            log.get("B"),
            Some(Typed::Started),
            "a cut outcome is no outcome"
        );
        assert_eq!(log.get("C"), Some(Typed::Failed));
        assert_eq!(
            log.get("G"),
            Some(Typed::Entered),
            "Enter pressed, no outcome"
        );
        assert_eq!(log.get("D"), None);
        // Texts typed with their pane offsets come back for a re-read from an offset.
        log.started_at("E", 500, "Relay message from X [E]: one")
            .unwrap();
        log.started_at("F", 90, "Relay message from X [F]: two")
            .unwrap();
        let log = InjectedLog::open(dir.path()).unwrap();
        assert_eq!(
            log.typed_since(100),
            vec![(500, "Relay message from X [E]: one".to_owned())]
        );
        assert_eq!(log.typed_since(0).len(), 2);
    }

    #[test]
    fn inbox_times_are_rfc3339_utc_to_the_second() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400_999), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_795_000_000_000), "2026-11-18T11:06:40Z");
    }

    /// A typed text that could write a line of its own is logged on one line.
    #[test]
    fn a_typed_text_with_a_line_break_stays_one_log_line() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = InjectedLog::open(dir.path()).unwrap();
        log.started("B").unwrap();
        log.started_at("E", 5, "one\nD B verified\x1b[2J").unwrap();
        let log = InjectedLog::open(dir.path()).unwrap();
        assert_eq!(log.get("B"), Some(Typed::Started));
        assert_eq!(
            log.typed_since(0),
            vec![(5, "one D B verified[2J".to_owned())]
        );
    }

    /// An id that could write a line of its own (`x\nD B verified`) never reaches the log.
    #[test]
    fn an_id_outside_the_relay_alphabet_is_not_written_to_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = InjectedLog::open(dir.path()).unwrap();
        log.started("B").unwrap();
        for bad in ["x\nD B verified", "x D", "x\rD B verified"] {
            assert!(log.started(bad).is_err(), "{bad:?}");
            assert!(log.started_at(bad, 1, "t").is_err(), "{bad:?}");
            assert!(log.finished(bad, true).is_err(), "{bad:?}");
        }
        let log = InjectedLog::open(dir.path()).unwrap();
        assert_eq!(log.get("B"), Some(Typed::Started));
        assert_eq!(
            std::fs::read_to_string(dir.path().join("injected.log")).unwrap(),
            "T B\n"
        );
    }

    #[test]
    fn the_inbox_keeps_every_message_in_order_without_control_characters() {
        let dir = tempfile::tempdir().unwrap();
        for (id, body) in [("01A", "first"), ("01B", "second\x1b[2J line\nnext")] {
            append_inbox(
                dir.path(),
                &InboxEntry {
                    id,
                    from: "Alice",
                    ts: 1_700_000_000_000,
                    thread: None,
                    body,
                },
            )
            .unwrap();
        }
        let text = std::fs::read_to_string(dir.path().join("inbox.md")).unwrap();
        let a = text
            .find("## From Alice [01A] at 2023-11-14T22:13:20Z\n\nfirst")
            .unwrap();
        let b = text.find("[01B]").unwrap();
        assert!(a < b, "{text}");
        assert!(!text.contains('\x1b'));
        assert!(text.contains("second\\u{1b}[2J line\nnext"), "{text}");
    }

    #[test]
    fn directive_ids_repeat_from_the_same_checkpoint_and_differ_otherwise() {
        let c = Checkpoint {
            offset: 100,
            at_ms: 1_700_000_000_000,
        };
        let id = |session, to, body, n| c.directive_id(session, to, body, n);
        assert_eq!(id("s", "Bob", "hi", 0), id("s", "Bob", "hi", 0));
        assert_ne!(id("s", "Bob", "hi", 0), id("s", "Bob", "hi", 1));
        assert_ne!(id("s", "Bob", "hi", 0), id("s", "Bo", "bhi", 0));
        assert_ne!(id("s", "Bob", "hi", 0), id("t", "Bob", "hi", 0));
        let other = Checkpoint { offset: 101, ..c };
        assert_ne!(
            id("s", "Bob", "hi", 0),
            other.directive_id("s", "Bob", "hi", 0)
        );
        // Another run of the agent (same session name and row, another checkpoint time):
        // not even the short id repeats.
        let rerun = Checkpoint {
            at_ms: c.at_ms + 1,
            ..c
        };
        assert_ne!(
            relay_protocol::short_id(&id("s", "Bob", "hi", 0)),
            relay_protocol::short_id(&rerun.directive_id("s", "Bob", "hi", 0))
        );
        let id = id("s", "Bob", "hi", 0);
        assert_eq!(id.len(), 26);
        assert!(ulid::Ulid::from_string(&id).is_ok(), "{id}");
        let dir = tempfile::tempdir().unwrap();
        c.save(dir.path()).unwrap();
        assert_eq!(Checkpoint::load(dir.path()), c);
        assert_eq!(
            Checkpoint::load(&dir.path().join("none")),
            Checkpoint::default()
        );
    }
}
