//! One long-lived tmux control-mode client (`tmux -C attach-session`) per wrapped agent: every
//! command the wrapper gives the agent's pane (type, Enter, leave copy mode, read the screen)
//! goes down its stdin as one line, and its answer comes back as a `%begin ... %end` (or
//! `%error`) block on stdout. No process is started per action: under CPU load (the agents
//! themselves load the machine) starting `tmux` for each command was the wrapper's largest
//! cost.
//!
//! The same pipe brings the pane's output: tmux sends what the pane prints as `%output %ID
//! DATA` notifications, DATA with every byte below 32 and `\` as a three-digit octal escape.
//! They are decoded here and passed on unchanged (split UTF-8 sequences and escape sequences
//! included: the parser takes any chunking).

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use super::TmuxError;
use crate::WrapError;

/// How long a command may take before the client is taken for stuck (bounds a hang only).
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// A command's answer: its output lines, or tmux's error text.
type Answer = Result<Vec<u8>, String>;

/// The waiting commands' reply slots, oldest first: tmux answers commands in order. Each
/// answer comes with the number of notes read before it (see [`Notes`]).
type Waiting = Arc<Mutex<VecDeque<mpsc::Sender<(Answer, u64)>>>>;

/// Where the notes of one pane's control clients go, numbered in the order they were read
/// (one count for every client the pane has had). tmux writes a pane's `%output` and the
/// answers to commands on one stream, in order: a capture's answer tells, by the count of
/// notes read before it, which output the capture holds and which came after it (issue 23.17).
#[derive(Clone, Debug)]
pub(crate) struct Notes {
    tx: tokio::sync::mpsc::UnboundedSender<(u64, Note)>,
    count: Arc<std::sync::atomic::AtomicU64>,
}

impl Notes {
    /// A new channel of numbered notes, from 0.
    pub(crate) fn channel() -> (Self, tokio::sync::mpsc::UnboundedReceiver<(u64, Note)>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let count = Arc::default();
        (Self { tx, count }, rx)
    }

    /// Passes `note` on with its number; an error when nothing reads any more.
    fn send(&self, note: Note) -> Result<(), ()> {
        let n = self.count.fetch_add(1, Ordering::AcqRel);
        self.tx.send((n, note)).map_err(|_| ())
    }

    /// How many notes were passed on so far.
    fn sent(&self) -> u64 {
        self.count.load(Ordering::Acquire)
    }
}

/// Where the client's reader passes what it learns for the wrapper's loop.
#[derive(Debug)]
pub(crate) enum Note {
    /// Bytes the pane printed.
    Output(Vec<u8>),
    /// The pane's size changed (its window was resized, or split): from a `%layout-change`
    /// notification, in order with the output, so what the pane prints after a resize is
    /// read at its new width.
    Resized {
        /// Height.
        rows: u16,
        /// Width.
        cols: u16,
    },
    /// The client ended: its session or the tmux server went away, or it was killed.
    Gone,
}

/// A running control-mode client attached to one session.
pub(crate) struct Control {
    /// Taken when dropped (see `Drop`).
    child: Option<Child>,
    /// Taken when dropped: closing it detaches the client.
    stdin: Option<ChildStdin>,
    waiting: Waiting,
    alive: Arc<AtomicBool>,
    /// Set when the wrapper ends this client itself: its end is then no news for the loop.
    retired: Arc<AtomicBool>,
}

impl Control {
    /// Attaches a control-mode client to session `session` (an exact name); the output of
    /// its pane `pane` (a `%N` id; any pane's while `None`) goes to `notes`, and so does the
    /// client's end.
    pub(crate) fn attach(
        session: &str,
        pane: Option<String>,
        notes: Notes,
    ) -> Result<Self, WrapError> {
        // Held until the client has answered a first command, that is until tmux has set it
        // up as a control client (see [`super::guard`]).
        let guard = super::guard::take("attach a control client");
        let mut child = Command::new("tmux")
            .args(["-C", "attach-session", "-t", &format!("={session}")])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| TmuxError::Start {
                command: "tmux -C attach-session".into(),
                source,
            })?;
        let stdin = child
            .stdin
            .take()
            .ok_or(TmuxError::Control("its stdin is not piped"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or(TmuxError::Control("its stdout is not piped"))?;
        let waiting: Waiting = Arc::default();
        let alive = Arc::new(AtomicBool::new(true));
        let stderr = child.stderr.take();
        let retired = Arc::new(AtomicBool::new(false));
        let (w, a, r) = (waiting.clone(), alive.clone(), retired.clone());
        std::thread::Builder::new()
            .name("relay-tmux-control".into())
            .spawn(move || {
                read_answers(BufReader::new(stdout), &w, &a, pane.as_deref(), &notes);
                if r.load(Ordering::Acquire) {
                    return;
                }
                // Why tmux ended it, when it says (read once it has ended: a few lines).
                let mut why = String::new();
                if let Some(mut e) = stderr {
                    use std::io::Read;
                    if let Err(err) = e.read_to_string(&mut why) {
                        tracing::debug!(error = %err, "cannot read the tmux control client's errors");
                    }
                }
                tracing::info!(stderr = %why.trim(), "the tmux control client ended");
                if notes.send(Note::Gone).is_err() {
                    tracing::debug!("the tmux control client ended after the wrapper's loop");
                }
            })
            .map_err(|e| TmuxError::io("control client: reader thread", e))?;
        let mut control = Self {
            child: Some(child),
            stdin: Some(stdin),
            waiting,
            alive,
            retired,
        };
        // The answer comes once the client is identified and attached. Without one (the
        // session went, say) the client's end reaches the loop through `notes`, as ever.
        if let Err(e) = control.run("display-message -p relay") {
            tracing::debug!(error = %e, "the new tmux control client did not answer");
        }
        drop(guard);
        Ok(control)
    }

    /// Whether the client still runs (tmux ends it when its session or server goes).
    pub(crate) fn alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Runs one command line (already quoted, see [`quote`]); its output.
    pub(crate) fn run(&mut self, line: &str) -> Result<Vec<u8>, WrapError> {
        self.run_counted(line).map(|(out, _)| out)
    }

    /// [`Control::run`], with the number of notes read before its answer (see [`Notes`]).
    pub(crate) fn run_counted(&mut self, line: &str) -> Result<(Vec<u8>, u64), WrapError> {
        // One command per line, no `;` lists: each command gets its own answer block.
        debug_assert!(!line.contains('\n'), "one command per line");
        let (tx, rx) = mpsc::channel();
        {
            // Queued before it is written: the reader may see the answer at once.
            let mut waiting = self.waiting.lock().map_err(|_| TmuxError::Poisoned)?;
            waiting.push_back(tx);
        }
        let Some(stdin) = self.stdin.as_mut() else {
            return Err(TmuxError::Control("closed").into());
        };
        let written = stdin
            .write_all(line.as_bytes())
            .and_then(|()| stdin.write_all(b"\n"))
            .and_then(|()| stdin.flush());
        if let Err(e) = written {
            self.alive.store(false, Ordering::Release);
            return Err(TmuxError::io("control client: write", e).into());
        }
        match rx.recv_timeout(ANSWER_WITHIN) {
            Ok((Ok(out), at)) => Ok((out, at)),
            Ok((Err(msg), _)) => Err(TmuxError::Refused {
                command: line
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_owned(),
                message: msg.trim().to_owned(),
            }
            .into()),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                Err(TmuxError::Control("it ended (the session or the tmux server is gone)").into())
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                // Answers may now be out of step with commands: this client is done.
                self.alive.store(false, Ordering::Release);
                Err(TmuxError::NoAnswer(ANSWER_WITHIN).into())
            }
        }
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        self.retired.store(true, Ordering::Release);
        // Closing its stdin detaches the client, which then exits: it is not killed, since
        // tmux 3.3a's server was seen to crash (SIGSEGV) when control clients with output
        // pending were killed. It is reaped off the loop.
        let Some(mut child) = self.child.take() else {
            return;
        };
        let stdin = self.stdin.take();
        // Its detaching is announced to every control client: it is done under the lock
        // (see [`super::guard`]), off the loop, and the lock is held until it has gone. The
        // process waits for it before it ends ([`wait_detached`]): ending first would close
        // `stdin` outside the lock.
        let reaped = std::thread::Builder::new()
            .name("relay-tmux-reap".into())
            .spawn(move || {
                let _guard = super::guard::take("detach a control client");
                drop(stdin);
                if let Err(e) = child.wait() {
                    tracing::debug!(error = %e, "cannot reap the tmux control client");
                }
            });
        match reaped {
            Ok(handle) => match DETACHING.lock() {
                Ok(mut pending) => pending.push(handle),
                Err(_) => tracing::warn!(
                    "cannot record a tmux control client's detaching; the process may end before it"
                ),
            },
            // The thread (and with it `stdin`) is gone: the client detaches all the same.
            Err(e) => {
                tracing::debug!(error = %e, "cannot start a thread to reap the tmux control client");
            }
        }
    }
}

/// The threads detaching this process's control clients under the lock (see `Drop`), not yet
/// waited for.
static DETACHING: Mutex<Vec<std::thread::JoinHandle<()>>> = Mutex::new(Vec::new());

/// Waits until every control client this process let go of has detached, each under the lock
/// (see [`super::guard`]). A relaying process calls it before it ends: a client still attached
/// when the process ends detaches when its stdin closes with the process, outside the lock,
/// and tmux announces that detaching to every control client, one that another relaying
/// process is attaching included, which crashes the server (issue 23.19). Bounded: each
/// thread waits at most the lock's limit, then for a client that has lost its input.
pub(crate) fn wait_detached() {
    let pending = match DETACHING.lock() {
        Ok(mut pending) => std::mem::take(&mut *pending),
        Err(_) => {
            tracing::warn!("cannot read the tmux control clients still detaching");
            return;
        }
    };
    for handle in pending {
        if handle.join().is_err() {
            tracing::warn!("a thread detaching a tmux control client panicked");
        }
    }
}

/// Reads the client's stdout: answers go to the oldest waiting command, pane `pane`'s output
/// to `notes`; the client's end (`%exit`, or end of file) drops every waiting slot, which
/// tells its command.
fn read_answers(
    mut out: impl BufRead,
    waiting: &Waiting,
    alive: &AtomicBool,
    pane: Option<&str>,
    notes: &Notes,
) {
    // The block being read: its command number and whether it answers one of ours (flags 1;
    // the attach command's own block has flags 0).
    let mut block: Option<(String, bool)> = None;
    let mut body = Vec::new();
    let mut line = Vec::new();
    loop {
        line.clear();
        match out.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let text = line.strip_suffix(b"\n").unwrap_or(&line);
        if let Some((num, ours)) = &block {
            match guard_line(text) {
                Some((kind @ ("%end" | "%error"), n, _)) if n == num => {
                    if *ours {
                        let answer = if kind == "%end" {
                            Ok(std::mem::take(&mut body))
                        } else {
                            Err(String::from_utf8_lossy(&std::mem::take(&mut body)).into_owned())
                        };
                        let slot = waiting.lock().ok().and_then(|mut w| w.pop_front());
                        if let Some(slot) = slot
                            && slot.send((answer, notes.sent())).is_err()
                        {
                            tracing::debug!("a tmux answer came after its command gave up");
                        }
                    }
                    body.clear();
                    block = None;
                }
                _ => {
                    body.extend_from_slice(text);
                    body.push(b'\n');
                }
            }
            continue;
        }
        if let Some(rest) = text.strip_prefix(b"%output ") {
            let (id, data) = match rest.iter().position(|&b| b == b' ') {
                Some(i) => (&rest[..i], &rest[i + 1..]),
                None => (rest, &[][..]),
            };
            if pane.is_none_or(|p| p.as_bytes() == id)
                && notes.send(Note::Output(unescape(data))).is_err()
            {
                // The loop has ended: nothing reads the pane any more.
                break;
            }
            continue;
        }
        if let Some(rest) = text.strip_prefix(b"%layout-change ") {
            // `%layout-change @WINDOW LAYOUT VISIBLE-LAYOUT FLAGS`: the pane's size is in the
            // window's layout.
            let layout = rest.split(|&b| b == b' ').nth(1).unwrap_or_default();
            let size = std::str::from_utf8(layout)
                .ok()
                .and_then(|l| pane_size(l, pane));
            let Some((cols, rows)) = size else {
                // Another pane's window, or a layout this reader does not know: the parser
                // keeps the size it has.
                tracing::debug!(line = %String::from_utf8_lossy(text), "a layout change without this pane's size");
                continue;
            };
            if notes.send(Note::Resized { rows, cols }).is_err() {
                break;
            }
            continue;
        }
        match guard_line(text) {
            Some(("%begin", n, flags)) => block = Some((n.to_owned(), flags == "1")),
            _ if text.starts_with(b"%exit") => break,
            // Notifications (`%session-changed`, `%window-renamed`, ...): not needed.
            _ => {}
        }
    }
    alive.store(false, Ordering::Release);
    if let Ok(mut w) = waiting.lock() {
        // Dropped slots tell their commands the client is gone.
        w.clear();
    }
}

/// The size (columns, rows) of pane `pane` (`%N`) in a tmux window layout such as
/// `a87d,100x30,0,0,0` or `c08a,100x30,0,0[100x15,0,0,0,100x14,0,16,1]`: each cell is
/// `WxH,X,Y` followed by the pane's number (a pane) or by `{...}`/`[...]` (a split). With
/// `pane` unknown, the window's only pane.
fn pane_size(layout: &str, pane: Option<&str>) -> Option<(u16, u16)> {
    // The layout after its checksum.
    let cells = layout.split_once(',')?.1;
    let tokens: Vec<&str> = cells
        .split([',', '{', '}', '[', ']'])
        .filter(|t| !t.is_empty())
        .collect();
    let size = |t: &str| -> Option<(u16, u16)> {
        let (w, h) = t.split_once('x')?;
        Some((w.parse().ok()?, h.parse().ok()?))
    };
    let mut panes = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let Some(wh) = size(tokens[i]) else {
            i += 1;
            continue;
        };
        // `WxH,X,Y` then, for a pane, its number (a split's first child is a size instead).
        match tokens.get(i + 3) {
            Some(id) if size(id).is_none() && id.bytes().all(|b| b.is_ascii_digit()) => {
                panes.push((*id, wh));
                i += 4;
            }
            _ => i += 3,
        }
    }
    match pane.and_then(|p| p.strip_prefix('%')) {
        Some(id) => panes.iter().find(|(n, _)| *n == id).map(|(_, wh)| *wh),
        None if panes.len() == 1 => Some(panes[0].1),
        None => None,
    }
}

/// `%output` data as the bytes the pane printed: `\ooo` is the byte of octal `ooo`.
fn unescape(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len());
    let mut i = 0;
    while i < data.len() {
        let octal = data
            .get(i + 1..i + 4)
            .filter(|d| data[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                let v = d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0'));
                out.push(u8::try_from(v).unwrap_or(u8::MAX));
                i += 4;
            }
            None => {
                out.push(data[i]);
                i += 1;
            }
        }
    }
    out
}

/// `%begin|%end|%error TIME NUMBER FLAGS` as (keyword, number, flags).
fn guard_line(line: &[u8]) -> Option<(&str, &str, &str)> {
    let line = std::str::from_utf8(line).ok()?;
    let mut it = line.split(' ');
    let kind = it.next()?;
    if !matches!(kind, "%begin" | "%end" | "%error") {
        return None;
    }
    let _time = it.next()?;
    let num = it.next()?;
    let flags = it.next()?;
    (it.next().is_none() && num.bytes().all(|b| b.is_ascii_digit())).then_some((kind, num, flags))
}

/// `s` as one argument of a tmux command line: double-quoted, with what tmux's parser would
/// read as syntax (`\`, `"`, `$` for environment variables) escaped, and line breaks and
/// other control characters as octal escapes, so the whole command stays on one line.
pub(crate) fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '\\' | '"' | '$' => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c == '\x7f' => {
                out.push_str(&format!("\\{:03o}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_lines_are_told_from_output_that_looks_like_them() {
        assert_eq!(
            guard_line(b"%begin 1795641680 263 0"),
            Some(("%begin", "263", "0"))
        );
        assert_eq!(
            guard_line(b"%end 1795641680 263 1"),
            Some(("%end", "263", "1"))
        );
        assert_eq!(guard_line(b"%end of the story"), None);
        assert_eq!(guard_line(b"%output %1 x"), None);
    }

    #[test]
    fn answers_go_to_the_commands_that_asked_in_order_and_the_attach_block_to_none() {
        let stdout = b"%begin 1 10 0\n%end 1 10 0\n%session-changed $0 s\n\
            %begin 1 11 1\nline one\n%end 1 12 1\n%end 1 11 1\n\
            %begin 1 13 1\nparse error: unknown command: x\n%error 1 13 1\n%exit\n";
        let waiting: Waiting = Arc::default();
        let (a, ra) = mpsc::channel();
        let (b, rb) = mpsc::channel();
        let (c, rc) = mpsc::channel::<(Answer, u64)>();
        waiting.lock().unwrap().extend([a, b, c]);
        let alive = AtomicBool::new(true);
        let (notes, _rx) = Notes::channel();
        read_answers(&stdout[..], &waiting, &alive, None, &notes);
        // A line of output that looks like another block's end is output.
        assert_eq!(ra.recv().unwrap().0.unwrap(), b"line one\n%end 1 12 1\n");
        assert_eq!(
            rb.recv().unwrap().0.unwrap_err(),
            "parse error: unknown command: x\n"
        );
        // The client ended before answering the third: its command is told.
        assert!(rc.recv().is_err());
        assert!(!alive.load(Ordering::Acquire));
    }

    type NoteReceiver = tokio::sync::mpsc::UnboundedReceiver<(u64, Note)>;

    /// What pane `%1`'s client passes on of `stdout`, one command waiting: its answer and the
    /// notes.
    fn read_for_one_command(stdout: &str) -> (mpsc::Receiver<(Answer, u64)>, NoteReceiver) {
        let waiting: Waiting = Arc::default();
        let (a, ra) = mpsc::channel();
        waiting.lock().unwrap().push_back(a);
        let (notes, rx) = Notes::channel();
        read_answers(
            stdout.as_bytes(),
            &waiting,
            &AtomicBool::new(true),
            Some("%1"),
            &notes,
        );
        (ra, rx)
    }

    #[test]
    fn pane_output_is_decoded_and_only_the_agents_pane_is_passed_on() {
        let stdout = "%output %1 a\\134b\\015\\012\\033[1m\u{e9}\n\
            %begin 1 5 1\n%output %1 not output: inside a block\n%end 1 5 1\n\
            %output %2 other pane\n%output %1 \n%output %1 end\\012\n";
        let (ra, mut rx) = read_for_one_command(stdout);
        let mut got = Vec::new();
        while let Ok((_, Note::Output(b))) = rx.try_recv() {
            got.push(b);
        }
        assert_eq!(got, ["a\\b\r\n\x1b[1m\u{e9}".as_bytes(), b"", b"end\n"]);
        assert_eq!(
            ra.recv().unwrap().0.unwrap(),
            b"%output %1 not output: inside a block\n"
        );
    }

    #[test]
    fn an_answer_tells_how_many_notes_came_before_it() {
        // A capture's answer between two pieces of output: the first is on the captured
        // screen, the second came after it (issue 23.17).
        let stdout = "%output %1 before\n%begin 1 5 1\ncaptured\n%end 1 5 1\n%output %1 after\n";
        let (ra, mut rx) = read_for_one_command(stdout);
        let (answer, at) = ra.recv().unwrap();
        assert_eq!(answer.unwrap(), b"captured\n");
        assert_eq!(at, 1);
        let numbers: Vec<u64> = std::iter::from_fn(|| rx.try_recv().ok().map(|(n, _)| n)).collect();
        assert_eq!(numbers, [0, 1]);
    }

    #[test]
    fn a_panes_size_is_read_from_its_windows_layout() {
        assert_eq!(pane_size("a87d,100x30,0,0,0", Some("%0")), Some((100, 30)));
        assert_eq!(pane_size("a87d,100x30,0,0,0", None), Some((100, 30)));
        let split = "c08a,100x30,0,0[100x15,0,0,0,100x14,0,16,1]";
        assert_eq!(pane_size(split, Some("%1")), Some((100, 14)));
        assert_eq!(pane_size(split, Some("%0")), Some((100, 15)));
        assert_eq!(pane_size(split, Some("%7")), None);
        assert_eq!(pane_size(split, None), None);
        let nested = "d1e2,160x48,0,0{80x48,0,0,3,79x48,81,0[79x24,81,0,4,79x23,81,25,5]}";
        assert_eq!(pane_size(nested, Some("%5")), Some((79, 23)));
        assert_eq!(pane_size(nested, Some("%3")), Some((80, 48)));
        assert_eq!(pane_size("garbage", Some("%0")), None);
    }

    #[test]
    fn a_layout_change_tells_the_panes_new_size_in_order_with_its_output() {
        let layout = "c08a,100x30,0,0[100x15,0,0,0,100x14,0,16,1]";
        let stdout =
            format!("%output %1 before\n%layout-change @0 {layout} {layout} *\n%output %1 after\n");
        let (notes, mut rx) = Notes::channel();
        read_answers(
            stdout.as_bytes(),
            &Waiting::default(),
            &AtomicBool::new(true),
            Some("%1"),
            &notes,
        );
        let mut got = Vec::new();
        while let Ok((_, note)) = rx.try_recv() {
            got.push(format!("{note:?}"));
        }
        assert_eq!(
            got,
            [
                format!("{:?}", Note::Output(b"before".to_vec())),
                format!(
                    "{:?}",
                    Note::Resized {
                        rows: 14,
                        cols: 100
                    }
                ),
                format!("{:?}", Note::Output(b"after".to_vec())),
            ]
        );
    }

    #[test]
    fn quoted_text_stays_on_one_line_and_is_read_back_exactly() {
        // (tmux 3.3a reads this back as the original: checked with `save-buffer`.)
        let q = quote("a \"b\" $HOME ~ \\ ; c\nd\te");
        assert!(!q.contains('\n'));
        assert_eq!(q, r#""a \"b\" \$HOME ~ \\ ; c\012d\011e""#);
    }
}
