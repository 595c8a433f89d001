//! What a wrapper remembers on disk, in `<data>/team/<name>/`, so that a restarted wrapper
//! neither types a message twice nor forgets where it was:
//!
//! - `injected.log`: the replay ledger (`decide/ledger.rs`), one line per record the core
//!   makes and the shell writes: a message typed (`T <id>`, before the text is typed), the
//!   Enter pressed for it (`E <id>`, before the Enter is written) and its outcome
//!   (`D <id> <state>`), each appended in one write; read back when a wrapper starts.
//! - `inbox.md` (with `--inbox`): every message for the agent, for it to read if typing ever
//!   fails; rewritten atomically (temporary file, then rename).
//! - `checkpoint` (tmux backend): down to which pane row the output has been read with every directive
//!   in it relayed.

use std::io::Write;
use std::path::Path;

use relay_protocol::file::{Durability, write_atomic};
use relay_protocol::text;

use crate::decide::ledger::{Ledger, REMEMBER, Record};

/// Reads `dir/injected.log` back into a ledger (creating `dir`); a file grown past four times
/// what is remembered is compacted to one line per id remembered.
///
/// # Errors
/// The directory cannot be created, or the file read or compacted.
pub(crate) fn load_injected(dir: &Path) -> std::io::Result<Ledger> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join("injected.log");
    let mut ledger = Ledger::default();
    let mut lines = 0;
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            // A last line without its newline was cut short by a crash: ignore it, and
            // end it so that the next line starts on a line of its own.
            let whole = text.rfind('\n').map_or("", |end| &text[..end]);
            if !text.is_empty() && !text.ends_with('\n') {
                std::fs::OpenOptions::new()
                    .append(true)
                    .open(&path)?
                    .write_all(b"\n")?;
            }
            for line in whole.lines() {
                lines += 1;
                // A line cut short by a crash says nothing.
                if let Some(record) = parse_line(line) {
                    ledger.load(record);
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    if lines > 4 * REMEMBER {
        let text: String = ledger.compacted().map(|r| line_of(&r) + "\n").collect();
        write_atomically(&path, text.as_bytes())?;
    }
    Ok(ledger)
}

/// Appends `record` to `dir/injected.log` (the shell, carrying out the core's
/// [`crate::decide::effect::Effect::Record`]), in one write: a crash leaves a whole line or a
/// cut one (ignored when read back).
///
/// # Errors
/// The file cannot be written, or the id is not one of the relay's (see [`line_safe`]).
pub(crate) fn append_injected(dir: &Path, record: &Record) -> std::io::Result<()> {
    line_safe(record.id())?;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("injected.log"))?;
    f.write_all(format!("{}\n", line_of(record)).as_bytes())
}

/// A record as its line in `injected.log`: `T <id>` (tmux: `T <id> <row> <text>`), `E <id>`,
/// `D <id> verified|failed`.
fn line_of(record: &Record) -> String {
    match record {
        Record::Started { id, at: None } => format!("T {id}"),
        // The text is one line (see `format::injected_text`); keep it so, whatever the core
        // passes: a line break in it would make a second log line.
        Record::Started {
            id,
            at: Some((row, typed)),
        } => format!("T {id} {row} {}", text::typed(typed)),
        Record::Entered { id } => format!("E {id}"),
        Record::Finished { id, verified } => {
            format!("D {id} {}", if *verified { "verified" } else { "failed" })
        }
    }
}

/// The record a line of `injected.log` says, if it is whole.
fn parse_line(line: &str) -> Option<Record> {
    let mut parts = line.splitn(4, ' ');
    let (kind, id) = (parts.next()?, parts.next()?.to_owned());
    match kind {
        "T" => {
            let at = match (parts.next().map(str::parse), parts.next()) {
                (Some(Ok(row)), Some(typed)) => Some((row, typed.to_owned())),
                _ => None,
            };
            Some(Record::Started { id, at })
        }
        "E" => Some(Record::Entered { id }),
        "D" => Some(Record::Finished {
            id,
            verified: parts.next()? == "verified",
        }),
        _ => None,
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
    use crate::decide::ledger::Typed;

    fn started(id: &str) -> Record {
        Record::Started {
            id: id.to_owned(),
            at: None,
        }
    }

    fn started_at(id: &str, row: u64, typed: &str) -> Record {
        Record::Started {
            id: id.to_owned(),
            at: Some((row, typed.to_owned())),
        }
    }

    fn finished(id: &str, verified: bool) -> Record {
        Record::Finished {
            id: id.to_owned(),
            verified,
        }
    }

    #[test]
    fn the_log_survives_a_restart_and_a_cut_line() {
        let dir = tempfile::tempdir().unwrap();
        let write = |r: Record| append_injected(dir.path(), &r).unwrap();
        write(started("A"));
        write(finished("A", true));
        write(started("B"));
        write(started("C"));
        write(finished("C", false));
        write(started("G"));
        write(Record::Entered { id: "G".into() });
        // A crash in the middle of a line.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join("injected.log"))
            .unwrap();
        f.write_all(b"D B verif").unwrap();
        let log = load_injected(dir.path()).unwrap();
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
        write(started_at("E", 500, "Relay message from X [E]: one"));
        write(started_at("F", 90, "Relay message from X [F]: two"));
        let log = load_injected(dir.path()).unwrap();
        assert_eq!(
            log.typed_since(100),
            vec![(500, "Relay message from X [E]: one".to_owned())]
        );
        assert_eq!(log.typed_since(0).len(), 2);
    }

    #[test]
    fn a_log_grown_past_four_times_what_is_remembered_is_compacted_to_one_line_an_id() {
        let dir = tempfile::tempdir().unwrap();
        let mut text = String::new();
        for n in 0..=(2 * REMEMBER) {
            text.push_str(&format!("T id{n}\nD id{n} verified\n"));
        }
        std::fs::write(dir.path().join("injected.log"), text).unwrap();
        let log = load_injected(dir.path()).unwrap();
        assert_eq!(log.get("id0"), None, "the oldest is forgotten");
        let last = format!("id{}", 2 * REMEMBER);
        assert_eq!(log.get(&last), Some(Typed::Verified));
        let text = std::fs::read_to_string(dir.path().join("injected.log")).unwrap();
        assert_eq!(text.lines().count(), REMEMBER);
        assert!(
            text.ends_with(&format!("D {last} verified\n")),
            "{text:.80}"
        );
        assert_eq!(
            load_injected(dir.path()).unwrap().get(&last),
            Some(Typed::Verified)
        );
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
        append_injected(dir.path(), &started("B")).unwrap();
        append_injected(dir.path(), &started_at("E", 5, "one\nD B verified\x1b[2J")).unwrap();
        let log = load_injected(dir.path()).unwrap();
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
        append_injected(dir.path(), &started("B")).unwrap();
        for bad in ["x\nD B verified", "x D", "x\rD B verified"] {
            for r in [
                started(bad),
                started_at(bad, 1, "t"),
                Record::Entered { id: bad.into() },
                finished(bad, true),
            ] {
                assert!(append_injected(dir.path(), &r).is_err(), "{r:?}");
            }
        }
        let log = load_injected(dir.path()).unwrap();
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
