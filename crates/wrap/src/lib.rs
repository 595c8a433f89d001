//! The wrapper: runs an agent CLI in a pseudo-terminal or a tmux session without modifying
//! it, relays the directives it prints, and types in the messages it receives.
//!
//! ```text
//! agent output ──► PTY / tmux %output ─────► person's terminal (PTY: mirrored unchanged)
//!                                      └──► relay_parse::Parser ──► directives ──► Client::send
//! Client DELIVER ──► format::injected_text ──► inject::Injector (profile: quiet, prompt empty,
//!                    no spinner or dialog, no person mid-line) ──► type, Enter, verify ──► ACK
//! ```
//!
//! The pure parts (`format`, `inject`, `profile`) are unit tested, the profiles against
//! screens recorded from the real CLIs. One loop (`serve`) drives the core over a
//! `terminal::Terminal`: the PTY, tmux, or in unit tests a fake under tokio's paused clock
//! (`serve_tests.rs`). [`run_pty`] and [`serve_tmux`] set a backend up, run the loop and end
//! it; they are tested end to end with the real binary.

mod deliver;
mod door;
pub mod format;
pub mod inject;
mod link;
pub mod profile;
mod pty;
pub mod state;
mod terminal;
pub mod tmux;
/// The door's socket file name in the team directory (see `door.rs`).
pub use door::SOCKET as DOOR_SOCKET;
/// The door key's variable in the agent's environment, and how a wrapper makes one (see
/// `door.rs`).
pub use door::{KEY_ENV as DOOR_KEY_ENV, new_key as new_door_key};

/// The door a message handed to a Claude Code hook is verified by, in its trace.
const HOOK_DOOR: &str = "handed to the model by Claude Code's hook (through the wrapper)";
/// The door a message the agent's own tool showed is verified by, in its trace.
const TOOL_DOOR: &str = "shown to the model by the agent's MCP tool (relay_inbox, relay_read)";

/// The most message text one Claude Code hook answer hands over (bytes, one message at least):
/// Claude Code replaces longer hook output with a file path and a short preview, which the
/// model would take for the messages. What does not fit waits for the next hook or typing.
pub const HOOK_TEXT_MAX: usize = 9000;
mod transcript;
mod turn;

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use relay_client::{ClientConfig, ClientError, Delivered, Event, Outgoing};
use relay_parse::{Directive, Parser, ScreenText, Target};
use relay_protocol::{DeliveryState, Send, TerminalReport, TerminalState, now_ms, text};
use tokio::sync::mpsc;

use crate::inject::{Action, Injector, Look, Timing};
use crate::link::Link;
use crate::profile::{NotReady, Profile};
use crate::state::{Checkpoint, InboxEntry, InjectedLog, Typed as Remembered};
use crate::terminal::{TermEvent, Terminal};

/// Variables the agent does not inherit from the wrapper. Each tells command-line programs that
/// no person is at the terminal, and the agent under the relay is in a terminal a person can
/// attach to: with `CI` set, Gemini CLI exits at start and Claude Code draws without colour
/// (a code block then looks like prose, and a directive shown in one like a real one).
pub const NOT_INHERITED: &[&str] = &["CI", "CONTINUOUS_INTEGRATION"];

/// Output running this long (no quiet spell of the profile's settle time) reports the agent
/// busy to the relay.
const BUSY_AFTER: Duration = Duration::from_secs(1);
/// How long after output went quiet Claude Code's transcript is looked at once more (it may
/// write a reply there after drawing it).
const TRANSCRIPT_RECHECK: Duration = Duration::from_secs(1);
/// How often Claude Code's transcript is read while a directive waits for its reply there.
const HELD_RECHECK: Duration = Duration::from_millis(5);
/// Longest a directive of Codex's or Gemini's waits for their record of the reply while the
/// output goes on (they write it when the reply ends; see [`Core::release_held`]).
const HELD_MAX: Duration = Duration::from_secs(10);

/// A warning for the person when the agent will draw without colour although its parser
/// relies on colour: Claude Code's code blocks have no fences on screen, only colour tells
/// them from prose. `NO_COLOR` is the person's choice, so it is passed on, not removed.
/// `var` reads the environment (injectable for tests).
pub fn colour_warning(
    parse: &relay_parse::Profile,
    var: impl Fn(&str) -> Option<String>,
) -> Option<String> {
    let no_color = var("NO_COLOR").is_some_and(|v| !v.is_empty());
    (parse.name() == "claude" && no_color).then(|| {
        "NO_COLOR is set, so Claude Code draws without colour and the relay cannot tell its \
         code blocks from prose: a @relay: line shown inside a code block will be sent. Unset \
         NO_COLOR for this agent to avoid that."
            .to_owned()
    })
}

/// Wrapper failures.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WrapError {
    /// The pseudo-terminal, tmux or the agent process failed.
    #[error("{0}")]
    Pty(String),
    /// The relay could not be reached or refused us.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The person's terminal could not be set up.
    #[error("terminal: {0}")]
    Terminal(String),
    /// The wrapper's files in the data directory could not be used.
    #[error("{0}")]
    State(String),
    /// The agent's tmux session ended without its exit status: the session was killed (or
    /// the status file is unreadable), so whether the agent succeeded is unknown.
    #[error(
        "the agent's tmux session {session} ended without an exit status (was the session or \
         the tmux server killed?); whether the agent succeeded is unknown: check its work"
    )]
    ExitUnknown {
        /// The tmux session.
        session: String,
    },
}

/// How to run one agent.
#[derive(Debug, Clone)]
pub struct WrapConfig {
    /// The agent's relay name.
    pub name: String,
    /// The agent command and its arguments.
    pub command: Vec<String>,
    /// Readiness rules and how to read the screen.
    pub profile: Profile,
    /// The relay's socket.
    pub socket: PathBuf,
    /// Longest body typed in full; longer ones are cut with a hint to `agent-relay read`.
    pub max_body: usize,
    /// Put the person's terminal in raw mode and pass keystrokes through (when stdin is a
    /// terminal). Off, the agent gets no input but relayed messages (scripts, tests).
    pub interactive: bool,
    /// This agent's wrapper files: `<data>/team/<name>/`.
    pub team_dir: PathBuf,
    /// Also append every message to `inbox.md` in this directory.
    pub inbox: Option<PathBuf>,
    /// Type [`intro`] into the agent once it is ready.
    pub intro: bool,
    /// Each message as its own prompt, waiting ones as one digest, or only a notice (see
    /// [`format::Delivery`]).
    pub delivery: format::Delivery,
    /// The key the agent's own doors (its MCP server, its hooks) present to this wrapper's
    /// door, put in the agent's environment as [`DOOR_KEY_ENV`] (see `door.rs`). `None`: a
    /// PTY wrapper makes one; a tmux relaying process reads the one its session was started
    /// with.
    pub door_key: Option<String>,
    /// Tell the command that started this wrapper how the start goes, one word a line on
    /// stdout: `connected` (the relay accepted the agent's name), then `started` (the agent
    /// printed and went quiet: it is past its start). `agent-relay --detached` waits for
    /// them; an agent that exits first is reported by its exit status and last lines.
    pub report_start: bool,
}

/// A note telling an agent how to use the relay, typed in with `--intro`: one line (Enter
/// submits it), with no directive at a line start (its echo is noted, and is never sent).
pub fn intro(name: &str) -> String {
    format!(
        "agent-relay: you are {name}, one of several AI agents connected by agent-relay. To \
         message another agent, write a line that starts with @relay: and its name (or \
         @relay:* for everyone), then the message; it ends at the next blank line. Messages \
         for you arrive as prompts starting with \"Relay message from NAME [ID]:\" (or \
         \"Relay message from NAME [ID] (thread T):\" in a conversation); answer \
         with @relay:NAME only when an answer is needed (never just to thank), and \
         `agent-relay read ID` prints a shortened message in full. To show the syntax without \
         sending, write it in inline code. No answer is needed to this note."
    )
}

/// Restores the person's terminal when dropped, on every way out (errors, panics).
struct RawMode {
    saved: rustix::termios::Termios,
}

impl RawMode {
    fn enter() -> Result<Self, WrapError> {
        let stdin = std::io::stdin();
        let saved = rustix::termios::tcgetattr(&stdin)
            .map_err(|e| WrapError::Terminal(format!("cannot read terminal settings: {e}")))?;
        let mut raw = saved.clone();
        raw.make_raw();
        rustix::termios::tcsetattr(&stdin, rustix::termios::OptionalActions::Now, &raw)
            .map_err(|e| WrapError::Terminal(format!("cannot set raw mode: {e}")))?;
        Ok(Self { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = rustix::termios::tcsetattr(
            std::io::stdin(),
            rustix::termios::OptionalActions::Now,
            &self.saved,
        );
    }
}

/// The person's terminal size, or a roomy default when there is none.
pub fn terminal_size() -> (u16, u16) {
    match rustix::termios::tcgetwinsize(std::io::stdout()) {
        Ok(ws) if ws.ws_row > 0 && ws.ws_col > 0 => (ws.ws_row, ws.ws_col),
        _ => (40, 120),
    }
}

/// What the injector types: relayed messages (one, or several typed as one digest or notice,
/// each acknowledged on its own once the outcome is known) or a notice from the relay itself
/// (a refusal the agent should learn about).
#[derive(Debug)]
enum Item {
    Messages(Vec<Delivered>),
    Notice,
}

/// The notice typed into the agent when the relay refuses one of its messages: the reason
/// is cut to [`NOTICE_REASON`] characters at a word's end (issue 24.8: a cut word cost the
/// model a turn to ask what was meant).
fn refusal_notice(to: &str, reason: &str) -> String {
    format!(
        "relay: your message to {} was not sent: {}",
        text::typed(to),
        cut_at_word(&text::typed(reason), NOTICE_REASON)
    )
}

/// The longest refusal reason typed whole into an agent.
const NOTICE_REASON: usize = 400;

/// `s` if it has at most `max` characters, else its longest start of whole words within
/// `max - 1` characters and `…`.
fn cut_at_word(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let head: String = s.chars().take(max.saturating_sub(1)).collect();
    // A word cut in two is dropped; one with no space before it at all is cut anyway.
    let whole = match head.rfind(char::is_whitespace) {
        Some(at) if at > 0 => head[..at].trim_end().to_owned(),
        _ => head,
    };
    format!("{whole}…")
}

/// A receipt came back (or never will) for a relayed directive.
struct ReceiptDone;

/// Now, on tokio's clock: paused (and advanced by hand) in the loop's unit tests.
fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// The screen seen through a profile, for the injector: the parser's own screen model, fed by
/// the agent's output on both backends (one screen: nothing is captured to decide).
struct ProfileLook<'a> {
    profile: &'a Profile,
    parser: &'a Parser,
    /// The agent has been seen started (its profile's start-up screen gone) at least once:
    /// from then on that screen's rule no longer applies (see [`Profile::starting`]).
    started: &'a mut bool,
    /// The agent has bracketed paste on (see [`Look::early_ok`]).
    paste_on: bool,
}

impl ProfileLook<'_> {
    fn screen(&mut self) -> Option<ScreenText> {
        Some(self.parser.screen())
    }
}

impl Look for ProfileLook<'_> {
    fn ready(&mut self) -> Result<(), NotReady> {
        let verdict = match self.screen() {
            Some(s) if !*self.started && self.profile.starting(&s) => {
                Err(NotReady::Busy("starting up".into()))
            }
            Some(s) => {
                *self.started = true;
                self.profile.ready(&s)
            }
            None => Err(NotReady::NoPrompt),
        };
        if let Err(why) = &verdict {
            tracing::debug!(?why, "not ready for a message");
        }
        verdict
    }

    fn submitted(&mut self, typed: &str) -> bool {
        self.screen()
            .is_some_and(|s| self.profile.submitted(&s, typed))
    }

    fn echoed(&mut self, typed: &str) -> bool {
        self.screen()
            .is_some_and(|s| self.profile.echoed(&s, typed))
    }

    fn early_ok(&mut self) -> bool {
        // Gemini CLI 0.61.0 draws its prompt before it turns bracketed paste on: a multi-line
        // body typed early in that moment lost its line breaks.
        !self.profile.multiline || self.paste_on
    }
}

/// The state both backends share: the relay connection, the parser, the injector and what
/// the wrapper remembers on disk.
struct Core {
    cfg: WrapConfig,
    client: Link,
    parser: Parser,
    injector: Injector<Item>,
    log: InjectedLog,
    notices: mpsc::UnboundedSender<String>,
    receipts: mpsc::UnboundedSender<ReceiptDone>,
    /// Directives relayed whose receipt has not come back.
    unacked: usize,
    /// The message typed last: what the agent prints next answers it.
    replying_to: Option<(String, Option<String>)>,
    /// tmux: the pane was looked at for the end of the agent's turn since its last output
    /// (see `turn.rs`).
    turn_looked: bool,
    /// tmux, a profile that does not know the CLI's input line: the session's person activity
    /// (see [`tmux::Pane::person_activity`]) when the message typed last was entered; a
    /// person's key after it ends the reply chain (see `turn.rs`).
    chain_activity: Option<u64>,
    /// Ids queued in the injector (a replay after a reconnect must not queue them twice).
    queued: HashSet<String>,
    last_output: Instant,
    settled: bool,
    /// The screen was looked at for the end of the agent's turn since the last output (see
    /// [`Profile::turn_settle`]).
    turn_checked: bool,
    /// Bytes of the agent's output read so far by this wrapper. Logged
    /// with each burst and each settling, so a test can tell which output an event follows.
    read: u64,
    /// Output read since the log last said everything read was settled and relayed
    /// (see [`Core::tell_if_relayed`]).
    relayed_told: bool,
    /// tmux: where relaying can resume.
    resume: Option<Resume>,
    /// What the relay was last told of the terminal (see [`Core::report_terminal`]).
    reported: Option<(TerminalState, Option<String>)>,
    /// When the current run of output (no quiet spell of the settle time in it) began.
    burst_start: Instant,
    /// The agent has been seen past its start-up screen (see [`ProfileLook::started`]).
    started: bool,
    /// The agent printed and then went quiet once: it is past its start (see
    /// [`WrapConfig::report_start`]). An agent that exits before is a command that exits at
    /// once (see [`Core::fleeting`]).
    shown: bool,
    /// A message was handed to the agent or a directive read from it: it took part.
    exchanged: bool,
    /// Whether the agent has turned bracketed paste on, as its output says: a multi-line text
    /// typed before that has its line breaks flattened (PTY) or submitted (tmux).
    paste: format::PasteMode,
    /// Notice delivery: messages whose notice was typed (acknowledged as injected), by id,
    /// until the agent's tool shows them (then verified; see `deliver.rs`).
    noticed: std::collections::HashMap<String, Delivered>,
    /// Notice delivery: ids the agent's tool showed while their notice was being typed.
    read_early: HashSet<String>,
    /// Notice delivery: ids the agent's tool showed before their delivery reached this
    /// wrapper (the latest few): they need no notice.
    shown_unseen: std::collections::VecDeque<String>,
    /// The senders of the digest typed last, with the id and thread of each one's latest
    /// message in it: a directive to one of them answers that message.
    digest_senders: Vec<(String, String, Option<String>)>,
    /// How text is typed into this agent: as a shell no-op when it is a shell.
    form: format::Form,
    /// Claude Code's transcript: tells a directive its reply says from one it only quotes in a
    /// code block drawn like prose (`claude` profile).
    transcript: Option<transcript::Transcript>,
    /// When to look at the transcript once more after output went quiet: Claude Code may
    /// write the reply there after it drew its last screen.
    transcript_due: Option<Instant>,
    /// Directives read off the screen (while a transcript is kept): a reply was given.
    screen_directives: u64,
    /// The log was told that no transcript is to be found.
    transcript_missing_told: bool,
    /// Directives read off the screen before Claude Code's transcript had their reply, in
    /// order, each with the time it is sent all the same (see [`Core::release_held`]).
    held: std::collections::VecDeque<(Directive, Instant)>,
    /// When to look at the transcript again for the held directives.
    held_due: Option<Instant>,
    /// Messages Claude Code's Stop hook handed to the model (acknowledged injected), verified
    /// when its next Stop hook runs: the turn they started has ended.
    hooked: Vec<Delivered>,
}

/// tmux: the checkpoint relaying resumes from, and what was read since.
struct Resume {
    checkpoint: Checkpoint,
    session: String,
    /// Directives found since the checkpoint, by (to, body): how many.
    seen: std::collections::HashMap<(String, String), u32>,
    /// Output was read since the checkpoint was saved.
    dirty: bool,
}

impl Core {
    fn new(
        cfg: WrapConfig,
        client: Link,
        notices: mpsc::UnboundedSender<String>,
        receipts: mpsc::UnboundedSender<ReceiptDone>,
        rows: u16,
    ) -> Result<Self, WrapError> {
        let log = InjectedLog::open(&cfg.team_dir).map_err(|e| {
            WrapError::State(format!(
                "{}: {e}",
                cfg.team_dir.join("injected.log").display()
            ))
        })?;
        let mut parser = Parser::new(cfg.profile.parse.clone());
        parser.set_rows(usize::from(rows));
        let timing = Timing {
            quiet: cfg.profile.quiet,
            ready_quiet: cfg.profile.turn_settle,
            enter_delay: cfg.profile.enter_delay,
            enter_on_echo: cfg.profile.enter_on_echo,
            verify_after: cfg.profile.verify_after,
            enter_retries: cfg.profile.enter_retries,
            recheck: Duration::from_secs(2),
        };
        let now = now();
        let mut injector = Injector::new(timing, now);
        let form = format::Form::for_agent(cfg.profile.name(), &cfg.command);
        if form == format::Form::ShellNoOp {
            tracing::info!(
                "the agent is a shell: messages are typed as `: '...'`, which runs nothing"
            );
        }
        if cfg.intro {
            injector.push(form.apply(&intro(&cfg.name)), Item::Notice, false);
        }
        if let Some(joiner) = deliver::joiner(&cfg, form) {
            injector.set_joiner(joiner);
        }
        let transcript = match &cfg.profile.transcript {
            Some(source) => {
                let t = std::env::current_dir()
                    .ok()
                    .and_then(|cwd| transcript::Transcript::new(source, &cwd));
                if t.is_none() {
                    tracing::warn!(
                        dir = %source.dir,
                        "no working directory, or the profile's transcript_dir names an unset variable: the agent's own record of its replies cannot be read; directives go as the screen shows them"
                    );
                }
                t
            }
            None => None,
        };
        Ok(Self {
            injector,
            cfg,
            client,
            parser,
            log,
            notices,
            receipts,
            unacked: 0,
            replying_to: None,
            turn_looked: false,
            chain_activity: None,
            queued: HashSet::new(),
            last_output: now,
            settled: true,
            turn_checked: false,
            read: 0,
            relayed_told: false,
            resume: None,
            reported: None,
            burst_start: now,
            started: false,
            shown: false,
            exchanged: false,
            paste: format::PasteMode::default(),
            noticed: std::collections::HashMap::new(),
            read_early: HashSet::new(),
            shown_unseen: std::collections::VecDeque::new(),
            digest_senders: Vec::new(),
            form,
            transcript,
            transcript_due: None,
            screen_directives: 0,
            transcript_missing_told: false,
            held: std::collections::VecDeque::new(),
            held_due: None,
            hooked: Vec::new(),
        })
    }

    /// How the terminal looks, from what the wrapper already knows (no screen is read for
    /// this): `blocked` when messages wait behind a dialog, a person's half-written line or a
    /// missing input line; `busy` when they wait behind a busy marker or the agent printed
    /// for a second or more without a quiet spell; else `idle`. A person's text is never
    /// repeated.
    fn terminal_view(&self, now: Instant) -> (TerminalState, Option<String>) {
        if self.injector.pending() > 0 {
            let held = if self.injector.person_typing() {
                Some((TerminalState::Blocked, "a person is typing".to_owned()))
            } else {
                self.injector.blocked_by().map(|why| match why {
                    NotReady::Dialog(m) => (TerminalState::Blocked, format!("dialog open: {m}")),
                    NotReady::InputNotEmpty(_) => {
                        (TerminalState::Blocked, "text in its input line".to_owned())
                    }
                    NotReady::NoPrompt => {
                        (TerminalState::Blocked, "no input line on screen".to_owned())
                    }
                    NotReady::Busy(m) => (TerminalState::Busy, m.clone()),
                })
            };
            if let Some((state, why)) = held {
                return (state, Some(why));
            }
        }
        // Printing for a while, not a moment: a person's typing echoed back or a one-line
        // answer is not worth telling anyone about.
        let printing = now < self.last_output + self.cfg.profile.settle
            && now.duration_since(self.burst_start) >= BUSY_AFTER;
        if printing {
            (TerminalState::Busy, Some("printing".into()))
        } else {
            (TerminalState::Idle, None)
        }
    }

    /// Tells the relay how the terminal looks when that changed since it was last told (the
    /// dashboard's agent state); nothing is sent while it stays the same.
    async fn report_terminal(&mut self, backend: &str, now: Instant) {
        let view = self.terminal_view(now);
        if self.reported.as_ref() == Some(&view) {
            return;
        }
        let (state, why) = view.clone();
        let report = TerminalReport {
            backend: backend.to_owned(),
            state,
            why,
        };
        if self.client.report_terminal(report).await.is_ok() {
            self.reported = Some(view);
        }
    }

    /// The agent's process: where its CLI's own transcript is found (see `transcript.rs`).
    fn set_agent_pid(&mut self, pid: Option<u32>) {
        match (&mut self.transcript, pid) {
            (Some(t), Some(pid)) => t.set_agent_pid(pid),
            // Claude Code's sessions are found from its process; Codex's and Gemini's records
            // from the working directory.
            (Some(t), None) if t.sends_unseen() => tracing::warn!(
                "the agent's process id is unknown: its Claude Code transcript is not read, and a @relay: line in a ```text code block would be sent"
            ),
            (_, _) => {}
        }
    }

    /// Sends a directive read off the screen; with Claude Code's transcript, once the
    /// transcript has its reply (a turn's end is seen on the screen before Claude Code has
    /// written the reply there, and only the transcript tells a line a ```text block quotes
    /// from one the reply says), waiting at most the settle time for it.
    async fn send_directive(&mut self, d: Directive, now: Instant, term: &mut impl Terminal) {
        if let Some(t) = &mut self.transcript
            && (!self.held.is_empty() || !t.knows(&d))
        {
            self.held.push_back((d, now + self.cfg.profile.settle));
            self.held_due.get_or_insert(now + HELD_RECHECK);
            return;
        }
        self.send_checked(d, term).await;
    }

    /// Sends the held directives whose reply the transcript has now, or whose wait is over,
    /// in the order the screen showed them.
    async fn release_held(&mut self, now: Instant, term: &mut impl Terminal) {
        if self.held_due.is_none_or(|due| now < due) {
            return;
        }
        // Codex and Gemini write a reply to their record when it ends, and Codex draws a long
        // reply for a while after a directive at its top showed: their directives wait until
        // the output has been quiet the settle time (at most HELD_MAX).
        let at_reply_end = self.transcript.as_ref().is_some_and(|t| !t.sends_unseen());
        let quiet_at = self.last_output + self.cfg.profile.settle;
        while let Some((d, until)) = self.held.front() {
            let known = self.transcript.as_mut().is_some_and(|t| t.knows(d));
            let until = if at_reply_end {
                (*until).max(quiet_at.min(*until + HELD_MAX))
            } else {
                *until
            };
            if !known && now < until {
                break;
            }
            if !known {
                let cli = self.transcript.as_ref().map_or("", |t| t.cli());
                tracing::debug!(
                    cli,
                    "the agent's transcript does not have a directive's reply yet; it goes by the screen"
                );
            }
            if let Some((d, _)) = self.held.pop_front() {
                self.send_checked(d, term).await;
            }
        }
        self.held_due = (!self.held.is_empty()).then(|| now + HELD_RECHECK);
    }

    async fn send_checked(&mut self, mut d: Directive, term: &mut impl Terminal) {
        self.exchanged = true;
        self.end_chain_if_person_typed(term).await;
        let to = match &d.to {
            Target::Agent(name) => name.clone(),
            Target::Broadcast => "*".to_owned(),
        };
        if let Some(t) = &mut self.transcript {
            self.screen_directives += 1;
            let cli = t.cli();
            match t.check(&d) {
                relay_parse::transcript::Origin::Quoted => {
                    // Not a message: the agent showed the syntax, in a code block or escaped.
                    tracing::info!(%to, cli, body = %text::one_line(&d.body, 200), "not sent: the reply only quotes this line, in a code block or escaped (the agent's transcript)");
                    return;
                }
                relay_parse::transcript::Origin::Sent => {
                    // The transcript was read first and it went from there, or (Codex, Gemini)
                    // it went with the reply's text and the screen shows it again.
                    tracing::debug!(%to, cli, body = %text::one_line(&d.body, 200), "already sent from or with the agent's transcript; the screen shows it now");
                    return;
                }
                relay_parse::transcript::Origin::Said(exact) => {
                    // The screen shows what the CLI drew of the reply's Markdown (a code block
                    // without fences, lines re-wrapped or re-indented, marks dropped; Codex:
                    // only a directive's first line): the reply's own text goes.
                    tracing::debug!(%to, cli, same = (exact.body == d.body), "sent with the reply's own text from the agent's transcript");
                    d = exact;
                }
                relay_parse::transcript::Origin::Unknown => {
                    tracing::debug!(%to, cli, body = %text::one_line(&d.body, 200), "directive not in the agent's transcript: sent as the screen shows it")
                }
            }
        }
        self.relay_directive(d, to).await;
    }

    /// Sends what Claude Code's replies said and its screen did not show: the start of a
    /// reply taller than the screen, which Claude Code never draws when the reply arrives at
    /// once (issue 19.2).
    async fn send_from_transcript(&mut self) {
        let Some(t) = &mut self.transcript else {
            return;
        };
        // Codex and Gemini draw every line of a reply: their records only give the screen's
        // directives their text, so each is sent once, by the screen.
        if !t.sends_unseen() {
            return;
        }
        let unseen = t.take_unseen();
        if t.files() == 0 && self.screen_directives > 0 && !self.transcript_missing_told {
            // Replies with directives, but no transcript where it should be: a directive above
            // the last screenful of a tall reply is lost, and nothing can tell.
            self.transcript_missing_told = true;
            tracing::warn!(folder = %t.folder().display(), "no Claude Code transcript of this agent's found: a directive in a reply taller than the screen is lost if its start is never drawn, and a @relay: line in a ```text code block is sent");
            // The agent is the sender of what may be lost: it is told once, and how to avoid it.
            let notice = "relay: this agent's Claude Code transcript was not found, so a @relay: line at the top of a reply taller than the screen is lost if it scrolls away before it is drawn. Keep @relay: lines short and near the end of a reply";
            if self.notices.send(notice.to_owned()).is_err() {
                tracing::warn!(
                    "the notice about the missing transcript could not be queued (wrapper stopping)"
                );
            }
        }
        for d in unseen {
            let to = match &d.to {
                Target::Agent(name) => name.clone(),
                Target::Broadcast => "*".to_owned(),
            };
            tracing::info!(%to, body = %text::one_line(&d.body, 200), "sent from Claude Code's transcript: the screen did not show it (a reply taller than the screen)");
            self.relay_directive(d, to).await;
        }
    }

    /// Relays a directive found on the screen or in the transcript (already checked).
    async fn relay_directive(&mut self, d: Directive, to: String) {
        if let Some(why) = &d.malformed {
            // Not a directive the relay can send (a bad name, a block that does not parse):
            // the agent meant to send something, and is told what was not sent and why.
            tracing::warn!(%to, %why, "a malformed directive was printed; not sent, the agent is told");
            let why: String = text::typed(why).chars().take(400).collect();
            if self.notices.send(format!("relay: {why}")).is_err() {
                tracing::warn!(%to, "the notice about a malformed directive could not be queued (wrapper stopping)");
            }
            return;
        }
        if d.truncated {
            // Sending the start of it as if whole would be a silent cut: tell the agent.
            // A block is cut with nothing parsed; a line keeps the start of its body.
            let limit = relay_parse::MAX_DIRECTIVE_BODY;
            let reason = if d.body.is_empty() {
                let block = relay_parse::MAX_BLOCK_BYTES;
                format!(
                    "it is longer than a [[RELAY]] block may be ({block} bytes, {limit} on one line); nothing was sent. Put long content in a file and send its path"
                )
            } else {
                format!(
                    "it is longer than {limit} bytes, the most one printed message may carry; nothing was sent. Put long content in a file and send its path"
                )
            };
            tracing::warn!(%to, %reason, "a directive longer than the limit was printed; not sent, the agent is told");
            let notice = refusal_notice(&to, &reason);
            if self.notices.send(notice).is_err() {
                tracing::warn!(%to, "the notice about a message too long could not be queued (wrapper stopping)");
            }
            return;
        }
        // Printed after a relayed message arrived: an answer to it, in its thread. After a
        // digest, the message from the one it goes to (else the digest's last).
        let from_digest = self
            .digest_senders
            .iter()
            .find(|(from, _, _)| *from == to)
            .map(|(_, id, thread)| (id.clone(), thread.clone()));
        let replying_to = match (&self.replying_to, from_digest) {
            (Some(_), Some(answered)) => Some(answered),
            (r, _) => r.clone(),
        };
        let (in_reply_to, thread) = match &replying_to {
            Some((id, thread)) => (
                Some(id.clone()),
                d.thread
                    .or_else(|| thread.clone())
                    .or_else(|| Some(id.clone())),
            ),
            None => (None, d.thread),
        };
        // tmux: ids repeatable from the checkpoint, so a wrapper restarted there re-sends
        // the same ids and the relay drops them as duplicates.
        let id = self.resume.as_mut().map(|r| {
            let n = r.seen.entry((to.clone(), d.body.clone())).or_insert(0);
            let id = r.checkpoint.directive_id(&r.session, &to, &d.body, *n);
            *n += 1;
            id
        });
        let msg = Outgoing {
            id,
            to: Some(to.clone()),
            topic: None,
            payload: Send {
                kind: d.kind,
                body: d.body,
                data: d.data,
                thread,
                in_reply_to,
                budget: None,
                urgent: false,
            },
        };
        // The receipt is awaited off the loop; a refusal goes back to the agent as a notice, so
        // it learns (a misspelt name, a message too large...).
        match self.client.send_nowait(msg).await {
            Ok((id, pending)) => {
                tracing::debug!(%id, %to, "relaying a directive");
                self.unacked += 1;
                let notices = self.notices.clone();
                let receipts = self.receipts.clone();
                tokio::spawn(async move {
                    match pending.wait().await {
                        Ok(r) => tracing::debug!(%id, %to, status = ?r.status, "relayed"),
                        Err(ClientError::Rejected { reason, .. }) => {
                            let shown = text::one_line(&reason, 300);
                            tracing::warn!(%id, %to, reason = %shown, "relay refused a message");
                            if notices.send(refusal_notice(&to, &reason)).is_err() {
                                tracing::debug!(%id, "the wrapper has ended; the refusal is only logged");
                            }
                        }
                        Err(e) => tracing::warn!(%id, %to, error = %e, "no receipt for a message"),
                    }
                    if receipts.send(ReceiptDone).is_err() {
                        tracing::debug!(%id, "the wrapper has ended before the receipt came");
                    }
                });
            }
            Err(e) => tracing::warn!(%to, error = %e, "could not relay a message"),
        }
    }

    /// `n` bytes of output were read at `now`, the total now `read` (`None`: `n` more than
    /// before). PTY: called before the bytes are shown to the person, so a test that sees
    /// them on the screen knows this was logged (see [`Core::tell_if_relayed`]).
    fn on_read(&mut self, n: usize, read: Option<u64>, now: Instant) {
        if n == 0 {
            return;
        }
        self.read = read.unwrap_or(self.read + n as u64);
        if self.settled {
            // Output after a quiet spell: a new burst.
            self.burst_start = now;
            tracing::debug!(read = self.read, "output after a quiet spell");
        }
        self.relayed_told = false;
        self.last_output = now;
        self.settled = false;
    }

    /// Bytes read (counted by [`Core::on_read`] first): fed to the parser, each directive in
    /// them relayed.
    async fn on_output(&mut self, bytes: &[u8], now: Instant, term: &mut impl Terminal) {
        self.paste.feed(bytes);
        self.injector.on_output(now);
        self.last_output = now;
        self.settled = false;
        self.turn_checked = false;
        self.turn_looked = false;
        for d in self.parser.feed(bytes) {
            self.send_directive(d, now, term).await;
        }
    }

    /// tmux: bytes the pane printed.
    async fn on_pane_output(&mut self, bytes: &[u8], now: Instant, term: &mut impl Terminal) {
        self.on_read(bytes.len(), None, now);
        if let Some(r) = &mut self.resume {
            r.dirty = true;
        }
        self.on_output(bytes, now, term).await;
    }

    /// tmux: reads what a snapshot of the pane holds (see [`tmux::Pane::snapshot`]), with a
    /// new parser: the rows earlier wrappers read, with what they make the parser find
    /// dropped (it was relayed), then the texts typed since the checkpoint noted (their echo
    /// is no directive), then the rows no wrapper read, whose directives are relayed with the
    /// ids they would have had (the relay drops those sent already).
    async fn resync(&mut self, snap: tmux::Snapshot, now: Instant, term: &mut impl Terminal) {
        let mut parser = Parser::new(self.cfg.profile.parse.clone());
        parser.set_rows(usize::from(snap.rows));
        parser.set_cols(usize::from(snap.cols));
        self.parser = parser;
        let Some(r) = &mut self.resume else {
            return;
        };
        r.seen.clear();
        let typed = self.log.typed_since(r.checkpoint.offset);
        if !snap.seen.is_empty() {
            self.parser.feed(&snap.seen);
            let dropped = self.parser.finish();
            tracing::debug!(
                directives = dropped.len(),
                "rows above the checkpoint read again (relayed before)"
            );
        }
        for (_, text) in typed {
            self.parser.note_injected(&text);
        }
        tracing::debug!(
            bytes = snap.unseen.len(),
            "reading what the pane shows since the checkpoint"
        );
        self.on_pane_output(&snap.unseen, now, term).await;
    }

    /// A message arrived for this agent.
    async fn on_message(&mut self, m: Delivered, term: &mut impl Terminal) {
        self.exchanged = true;
        if self.queued.contains(&m.id) {
            return;
        }
        // The daemon refuses such ids, but the wrapper does not rely on it: an id with a space,
        // a line break or a control character would corrupt `injected.log` (one id per line)
        // and could end a typed line early. Such a message is not typed; it is reported failed,
        // so it becomes a dead letter and its sender is told.
        if let Err(e) = relay_protocol::validate_message_id(&m.id) {
            tracing::warn!(
                id = %text::one_line(&m.id, 160),
                error = %e,
                "a message with an id the relay should have refused: not typed, reported failed"
            );
            self.fail(
                &m,
                &format!("not typed: its id is not one the relay accepts ({e})"),
            )
            .await;
            return;
        }
        // Lines kept for a CLI that takes a multi-line paste as one prompt; a shell gets one
        // quoted line.
        let text = self.text_for(std::slice::from_ref(&m), m.payload.urgent);
        // Never typed twice: a message this terminal was given before (a replay after a
        // reconnect or a wrapper restart) is acknowledged with what is known of it.
        match self.log.get(&m.id) {
            Some(Remembered::Verified) if self.cfg.delivery == format::Delivery::Notice => {
                // Its notice was typed; the agent's tool has not shown it (or the relay would
                // not deliver it again).
                self.ack(&m, DeliveryState::Injected).await;
                self.noticed.insert(m.id.clone(), m);
                return;
            }
            Some(Remembered::Verified) => {
                self.ack(&m, DeliveryState::Verified).await;
                return;
            }
            Some(Remembered::Failed) => {
                self.fail(
                    &m,
                    "typed into the agent earlier and not submitted (recorded in injected.log)",
                )
                .await;
                return;
            }
            Some(state @ (Remembered::Started | Remembered::Entered)) => {
                // The wrapper stopped between typing and checking. A tmux pane outlives it:
                // the history says whether the text got there. A PTY agent ended with the
                // wrapper: before its Enter the text was only in the input line of an agent
                // now gone, so the new agent is given it (typing it "again" types it once);
                // after its Enter, what the agent took is unknown, and typing twice is the
                // worse error.
                let kept = term.outlives_wrapper();
                let shown = if kept {
                    let short = relay_protocol::short_id(&m.id);
                    match term.history().await {
                        Ok(Some(h)) => h.contains(&format!("[{short}]")),
                        // Unknown: taken as typed, the safe side (typing twice is worse).
                        Ok(None) | Err(_) => true,
                    }
                } else {
                    state == Remembered::Entered
                };
                if !shown {
                    tracing::info!(id = %m.id, ?state, "typing again a message a stopped wrapper did not submit");
                }
                if shown {
                    // Typed; if the wrapper stopped before its Enter, the text still waits
                    // in the input line: submit it now.
                    if kept {
                        // The parser's screen: read afresh from the pane when this wrapper
                        // attached.
                        let waiting = !self.cfg.profile.submitted(&self.parser.screen(), &text);
                        if waiting {
                            tracing::info!(id = %m.id, "pressing the Enter a stopped wrapper did not");
                            if let Err(e) = term.enter().await {
                                // Acknowledged as injected all the same: the text is in the
                                // agent's input line, where a person can submit it; typing it
                                // again would double it.
                                tracing::warn!(id = %m.id, error = %e, "cannot press that Enter; the text waits in the agent's input line");
                            }
                        }
                    }
                    if let Err(e) = self.log.finished(&m.id, false) {
                        // The ACK below still goes; a later replay finds the id started and,
                        // the text being in the pane's history, acknowledges it again untyped.
                        tracing::warn!(id = %m.id, error = %e, "cannot record an injected message's outcome in injected.log");
                    }
                    // A PTY agent that ended with the wrapper after the Enter may or may not
                    // have read the line: say so (a failure report makes it a dead letter and
                    // tells the sender) rather than call it delivered. A tmux pane's history
                    // showed the text, so there it was given.
                    if kept {
                        self.ack(&m, DeliveryState::Injected).await;
                    } else {
                        tracing::warn!(id = %m.id, "a message was submitted to an agent that ended with its wrapper; whether it read it is unknown, so it is reported as failed");
                        self.fail(
                            &m,
                            "submitted to an agent that ended with its wrapper before the \
                             wrapper saw it taken; whether the agent read it is unknown",
                        )
                        .await;
                    }
                    return;
                }
            }
            None => {}
        }
        if let Some(dir) = &self.cfg.inbox {
            let entry = InboxEntry {
                id: &m.id,
                from: &m.from,
                ts: m.ts,
                thread: m.payload.thread.as_deref(),
                body: &m.payload.body,
            };
            if let Err(e) = state::append_inbox(dir, &entry) {
                tracing::warn!(error = %e, "cannot write the inbox file");
            }
        }
        if self.shown_already(&m).await {
            return;
        }
        let urgent = m.payload.urgent;
        tracing::debug!(id = %m.id, "a message waits to be typed");
        self.queued.insert(m.id.clone());
        self.injector.push(text, Item::Messages(vec![m]), urgent);
    }

    /// Queues a notice from the relay (a refusal) for the agent, in the agent's form.
    fn push_notice(&mut self, notice: &str) {
        self.injector
            .push(self.form.apply(notice), Item::Notice, false);
    }

    /// Sends what the agent's own tool asked for through the door (`door.rs`), on this
    /// agent's connection; the receipt goes back to the tool.
    async fn door_send(&mut self, req: door::Request) {
        self.exchanged = true;
        let req = match req {
            door::Request::Send(req) => req,
            door::Request::Read { ids, reply } => {
                let n = self.shown_by_tool(&ids).await;
                if reply.send(n).is_err() {
                    tracing::debug!("the tool left before its answer");
                }
                return;
            }
            door::Request::Stop { active, reply } => {
                let texts = self.hook_stop(active).await;
                let n = texts.len();
                if reply.send(texts).is_err() {
                    tracing::warn!(
                        n,
                        "the Stop hook left before its answer: the messages it was handed are reported injected but may not have reached the model"
                    );
                }
                return;
            }
            door::Request::Prompt { reply } => {
                let texts = self.hook_prompt().await;
                let n = texts.len();
                if reply.send(texts).is_err() {
                    tracing::warn!(
                        n,
                        "the UserPromptSubmit hook left before its answer: the messages it was handed are reported injected but may not have reached the model"
                    );
                }
                return;
            }
        };
        let door::SendRequest { msg, reply } = req;
        match self.client.send_nowait(msg).await {
            Ok((id, pending)) => {
                tracing::debug!(%id, "sending for the agent's own tool");
                tokio::spawn(async move {
                    if reply.send(pending.wait().await).is_err() {
                        tracing::debug!(%id, "the tool left before its receipt");
                    }
                });
            }
            Err(e) => {
                if reply.send(Err(e)).is_err() {
                    tracing::debug!("the tool left before its answer");
                }
            }
        }
    }

    /// Claude Code ran its Stop hook (`agent-relay hooks stop`, through the door): the turn
    /// it ends is over. Messages an earlier Stop hook handed over started that turn: verified.
    /// Unless this turn was itself one a Stop hook continued (`active`: Claude Code allows only
    /// a few in a row, and might not go on with more), the messages waiting to be typed are
    /// handed over instead: recorded in `injected.log` as typed and entered (never typed
    /// after), acknowledged injected, and returned for the hook's block decision. What no hook
    /// takes is typed once the agent is idle, as before.
    async fn hook_stop(&mut self, active: bool) -> Vec<String> {
        for m in std::mem::take(&mut self.hooked) {
            tracing::debug!(id = %m.id, "the turn the Stop hook started with this message has ended: verified");
            if let Err(e) = self.log.finished(&m.id, true) {
                tracing::warn!(id = %m.id, error = %e, "cannot record a hooked message's outcome in injected.log");
            }
            self.queued.remove(&m.id);
            self.ack_door(&m, HOOK_DOOR).await;
        }
        if active {
            tracing::debug!("a Stop hook continued this turn: messages wait to be typed");
            return Vec::new();
        }
        self.hand_to_hook("Stop").await
    }

    /// Claude Code ran its UserPromptSubmit hook (`agent-relay hooks prompt`, through the
    /// door): a prompt was submitted. Unless the wrapper is typing one of its own (that is the
    /// prompt submitted), a person submitted it: the messages waiting to be typed (held while
    /// the person wrote their line) go in with it, as the turn's context, recorded as for the
    /// Stop hook (injected now, verified when the turn's Stop hook runs) and never typed after.
    async fn hook_prompt(&mut self) -> Vec<String> {
        if self.injector.current().is_some() {
            tracing::debug!(
                "the prompt submitted is the wrapper's own typing: the other messages wait their turn"
            );
            return Vec::new();
        }
        self.hand_to_hook("UserPromptSubmit").await
    }

    /// Takes the messages waiting to be typed out of the queue for Claude Code's `hook` (named
    /// in the log): recorded in `injected.log` as typed and entered, acknowledged injected, to
    /// be verified by the next Stop hook; their texts are returned for the hook's answer.
    async fn hand_to_hook(&mut self, hook: &str) -> Vec<String> {
        // At most HOOK_TEXT_MAX bytes of text in one answer (always one message at least):
        // Claude Code puts longer hook output in a file and shows the model a preview, so
        // the rest stays queued, in order, for the next hook or for typing.
        let mut used = 0;
        let mut full = false;
        let taken = self.injector.take_queued(|text, item| {
            if full || !matches!(item, Item::Messages(_)) {
                return false;
            }
            if used > 0 && used + text.len() > HOOK_TEXT_MAX {
                full = true;
                return false;
            }
            used += text.len();
            true
        });
        let mut texts = Vec::with_capacity(taken.len());
        for (text, item) in taken {
            // A queued entry holds one message (digests are joined when typed).
            let Item::Messages(messages) = item else {
                continue;
            };
            // Recorded before they are handed over, as before typing: never typed after.
            let recorded = messages.iter().try_for_each(|m| {
                self.log
                    .started(&m.id)
                    .and_then(|()| self.log.entered(&m.id))
            });
            if let Err(e) = recorded {
                tracing::warn!(hook, error = %e, "cannot record a message handed to a hook; it is typed instead");
                self.injector.push(text, Item::Messages(messages), false);
                continue;
            }
            for m in messages {
                tracing::debug!(id = %m.id, hook, "handed to Claude Code's hook instead of typing");
                self.replying_to = Some((m.id.clone(), m.payload.thread.clone()));
                self.ack(&m, DeliveryState::Injected).await;
                self.hooked.push(m);
            }
            texts.push(text);
        }
        texts
    }

    /// Acknowledges `m` with its outcome. A failure means the client has stopped for good
    /// (its driver is gone): the relay will deliver the message again to the next connection
    /// under this name, and `injected.log` keeps it from being typed twice then.
    /// Reports `m` failed, saying why (the dead letter's reason, told to its sender).
    async fn fail(&self, m: &Delivered, why: &str) {
        if let Err(e) = self.client.ack_failed(m, why).await {
            tracing::warn!(
                id = %m.id,
                why,
                error = %e,
                "cannot report a message failed (the relay client stopped); it will be delivered \
                 again after a reconnect and reported from injected.log"
            );
        }
    }

    /// Acknowledges `m` verified because `door` showed it to the model whole (a hook's
    /// answer, the agent's own tool): `trace` names the door.
    async fn ack_door(&self, m: &Delivered, door: &str) {
        if let Err(e) = self.client.ack_shown(m, door).await {
            tracing::warn!(
                id = %m.id,
                door,
                error = %e,
                "cannot acknowledge a message (the relay client stopped); it will be delivered \
                 again after a reconnect and acknowledged from injected.log"
            );
        }
    }

    async fn ack(&self, m: &Delivered, state: DeliveryState) {
        if let Err(e) = self.client.ack(m, Some(state)).await {
            tracing::warn!(
                id = %m.id,
                ?state,
                error = %e,
                "cannot acknowledge a message (the relay client stopped); it will be delivered \
                 again after a reconnect and acknowledged from injected.log"
            );
        }
    }

    /// When the loop must wake up next, if nothing happens before.
    fn next_wake(&self) -> Option<Instant> {
        let settle = (!self.settled).then(|| self.settle_due());
        [
            settle,
            self.injector.next_deadline(),
            self.transcript_due,
            self.held_due,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// When the output counts as settled if nothing more comes: after the profile's short
    /// quiet time for a screen showing the turn over, until that screen was looked at; then
    /// after its settle time.
    fn settle_due(&self) -> Instant {
        match self.cfg.profile.turn_settle {
            Some(t) if !self.turn_checked => self.last_output + t,
            _ => self.last_output + self.cfg.profile.settle,
        }
    }

    /// Whether the output counts as settled at `now`: quiet for the settle time, or for the
    /// turn's short quiet time with the screen showing the agent back at an empty input line,
    /// nothing working and no dialog (its reply is whole: a directive in it goes now rather
    /// than after the settle time).
    fn settles(&mut self, now: Instant) -> bool {
        if self.settled {
            return false;
        }
        if now >= self.last_output + self.cfg.profile.settle {
            return true;
        }
        match self.cfg.profile.turn_settle {
            Some(t) if !self.turn_checked && now >= self.last_output + t => {
                self.turn_checked = true;
                let over = self.cfg.profile.waiting_for_input(&self.parser.screen());
                if over {
                    tracing::debug!("the screen shows the turn over: settled early");
                }
                over
            }
            _ => false,
        }
    }

    /// Does whatever is due at `now`: settle the parser, type, press Enter, check, report.
    async fn drive(&mut self, now: Instant, term: &mut impl Terminal) -> Result<(), WrapError> {
        if self.settles(now) {
            self.settled = true;
            if !self.shown && self.read > 0 {
                self.shown = true;
                tracing::info!("the agent printed and went quiet: it is past its start");
                self.report_start("started");
            }
            for d in self.parser.settle() {
                self.send_directive(d, now, term).await;
            }
            self.send_from_transcript().await;
            self.transcript_due = self.transcript.is_some().then(|| now + TRANSCRIPT_RECHECK);
        }
        self.release_held(now, term).await;
        if self.transcript_due.is_some_and(|due| now >= due) {
            self.transcript_due = None;
            self.send_from_transcript().await;
            tracing::debug!("the transcript was looked at once more after the output went quiet");
        }
        if !term.sees_keys() {
            self.end_turn_if_idle();
        }
        self.maybe_checkpoint(term).await;
        self.tell_if_relayed();
        loop {
            let mut look = ProfileLook {
                profile: &self.cfg.profile,
                parser: &self.parser,
                started: &mut self.started,
                paste_on: self.paste.is_on(),
            };
            let Some(action) = self.injector.poll(now, &mut look) else {
                break;
            };
            tracing::trace!(?action, "injector");
            match action {
                Action::Type(text) => {
                    self.typing(&text);
                    self.parser.note_injected(&text);
                    term.type_text(&text).await?;
                }
                Action::Enter => {
                    self.entering();
                    term.enter().await?;
                    self.note_chain_start(term).await;
                }
                Action::Done(Item::Messages(messages), outcome) => {
                    self.finished(messages, outcome).await;
                }
                Action::Done(Item::Notice, _) => {}
            }
        }
        if self.injector.take_held_for_person() {
            // The moment a message would have been typed, were no one writing a line.
            tracing::debug!(
                waiting = self.injector.pending(),
                "a message is due; held while a person has a half-written line"
            );
        }
        // A message's outcome known: its turn may be over already.
        if !term.sees_keys() {
            self.end_turn_if_idle();
        }
        Ok(())
    }

    /// Logs, once per burst of output, when everything read has settled and every directive
    /// in it was relayed and its receipt came back (the transcript looked at once more, for
    /// Claude Code). Tests wait for this line to prove that nothing more is sent from the
    /// output read so far: `read` says which output it covers (every byte up to there), and
    /// an `output after a quiet spell` line (logged before the person sees those bytes)
    /// says when more came.
    fn tell_if_relayed(&mut self) {
        if self.relayed_told
            || !self.settled
            || self.transcript_due.is_some()
            || self.unacked > 0
            || !self.held.is_empty()
        {
            return;
        }
        self.relayed_told = true;
        tracing::debug!(
            read = self.read,
            "output settled; every directive in it relayed"
        );
    }

    /// tmux: once everything read is settled and every directive in it acknowledged, a
    /// restarted wrapper can start reading from here.
    async fn maybe_checkpoint(&mut self, term: &mut impl Terminal) {
        let Some(r) = &self.resume else {
            return;
        };
        if !self.settled || self.unacked > 0 || !self.held.is_empty() || !r.dirty {
            return;
        }
        // The cursor's row: everything above it was read and relayed (the output is quiet).
        let row = match term.cursor_row().await {
            Ok(Some(row)) => row,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the pane's row; the checkpoint stays");
                return;
            }
        };
        let Some(r) = &mut self.resume else {
            return;
        };
        r.dirty = false;
        r.checkpoint = Checkpoint {
            offset: row,
            at_ms: now_ms(),
        };
        r.seen.clear();
        if let Err(e) = r.checkpoint.save(&self.cfg.team_dir) {
            tracing::warn!(error = %e, "cannot save the relaying checkpoint");
        }
    }

    /// Tells the command that started this wrapper how the start goes (see
    /// [`WrapConfig::report_start`]).
    fn report_start(&self, word: &str) {
        if self.cfg.report_start {
            report_start_line(word);
        }
    }

    /// Whether the agent was a command that exits at once rather than an agent: not a known
    /// agent CLI (the generic profile), it exited before it was past its start, and it took
    /// no part in any exchange. `agent-relay ls` (a typo) runs `ls`; its generated name must
    /// not stay in `agents` nor be announced to the agents that start later.
    fn fleeting(&self) -> bool {
        self.cfg.profile.name() == "generic" && !self.shown && !self.exchanged
    }

    /// Sends what the screen still holds and says goodbye; whether the agent was a command
    /// that exited at once (see [`Core::fleeting`]), judged after those last directives.
    async fn finish(mut self, term: &mut impl Terminal) -> bool {
        let now = now();
        for d in self.parser.finish() {
            self.send_directive(d, now, term).await;
        }
        // Nothing more will come: what waits for the transcript goes by the screen now.
        while let Some((d, _)) = self.held.pop_front() {
            self.send_checked(d, term).await;
        }
        let fleeting = self.fleeting();
        // Let the last receipts arrive before saying goodbye.
        tokio::time::sleep(Duration::from_millis(50)).await;
        self.client.close().await;
        fleeting
    }
}

/// Sleeps until `at`, or forever.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}

async fn connect(cfg: &WrapConfig) -> Result<Link, WrapError> {
    let client = relay_client::Client::connect(ClientConfig {
        cli: cfg.command.first().cloned(),
        ..ClientConfig::agent(cfg.socket.clone(), cfg.name.clone())
    })
    .await?;
    if cfg.report_start {
        report_start_line("connected");
    }
    Ok(Link::Client(client))
}

/// One line on stdout for the command that started this wrapper; it may have gone (it stops
/// reading once the agent started), which is logged, not an error.
fn report_start_line(word: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = writeln!(out, "{word}").and_then(|()| out.flush()) {
        tracing::debug!(error = %e, word, "the starting command no longer listens");
    }
}

/// How often, and how long apart, forgetting a fleeting agent is tried while the relay has
/// not yet seen its connection end (its goodbye and the forget request travel on two
/// connections).
const FORGET_TRIES: u32 = 40;
const FORGET_PAUSE: Duration = Duration::from_millis(50);

/// Removes agent `cfg.name` from the relay's list of agents, once its connection has ended:
/// it was a command that exited at once (see [`Core::fleeting`]). Failures are logged; the
/// person can still `agent-relay agents forget` it.
async fn forget_fleeting(cfg: &WrapConfig) {
    tracing::info!(
        command = %text::one_line(&cfg.command.join(" "), 200),
        "the command exited at once, took no part in any exchange and is no known agent CLI: it is not kept as an agent"
    );
    let client =
        match relay_client::Client::connect(ClientConfig::tool(cfg.socket.clone(), "cli")).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "cannot reach the relay to forget this agent");
                return;
            }
        };
    let mut tries = 0;
    loop {
        tries += 1;
        let res = client
            .query(relay_protocol::query::QueryRequest::ForgetAgent {
                name: cfg.name.clone(),
            })
            .await;
        match res {
            Err(relay_client::ClientError::Query { code, .. })
                if code == "connected" && tries < FORGET_TRIES =>
            {
                tokio::time::sleep(FORGET_PAUSE).await;
            }
            Ok(_) => {
                tracing::info!(name = %cfg.name, "forgotten");
                break;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot forget this agent");
                break;
            }
        }
    }
    client.close().await;
}

/// How the wrapper's loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// The agent's side ended (it exited; tmux: its session is gone).
    Exited,
    /// A signal stopped the wrapper (its number).
    Stopped(i32),
}

/// The wrapper's one loop, over any [`Terminal`]: the agent's output is counted, shown and
/// parsed (its directives relayed), messages from the relay and notices are queued for the
/// injector, the door's sends go out, and after each event whatever is due is done (see
/// [`Core::drive`]) and the terminal's state reported. Returns when the agent's side ends or
/// a signal stops the wrapper.
async fn serve(
    core: &mut Core,
    term: &mut impl Terminal,
    door: &mut door::Door,
    notices: &mut mpsc::UnboundedReceiver<String>,
    receipts: &mut mpsc::UnboundedReceiver<ReceiptDone>,
) -> Result<Ended, WrapError> {
    let mut relay_open = true;
    loop {
        let wake = core.next_wake();
        let checkpoint = core.resume.as_ref().map(|r| r.checkpoint.offset);
        tokio::select! {
            ev = term.next_event(checkpoint) => match ev? {
                TermEvent::Output(bytes) => {
                    let now = now();
                    // Counted before the person sees them: a test that sees them knows the
                    // wrapper has read them (see `Core::tell_if_relayed`).
                    core.on_read(bytes.len(), None, now);
                    if let Some(r) = &mut core.resume {
                        r.dirty = true;
                    }
                    term.show(&bytes);
                    core.on_output(&bytes, now, term).await;
                }
                TermEvent::Keys(k) => {
                    core.injector.on_person_input(&k, now());
                    // A person's new line starts a new conversation: what the agent prints
                    // next answers them, not the last relayed message.
                    if k.contains(&b'\r') {
                        core.replying_to = None;
                    }
                    term.write_keys(k).await?;
                }
                TermEvent::Resized { rows, cols } => {
                    tracing::debug!(rows, cols, "the terminal was resized");
                    term.resize(rows, cols)?;
                    core.parser.set_rows(usize::from(rows));
                    core.parser.set_cols(usize::from(cols));
                }
                TermEvent::Reread(snap) => core.resync(snap, now(), term).await,
                TermEvent::Ended => return Ok(Ended::Exited),
                TermEvent::Stopped(signal) => return Ok(Ended::Stopped(signal)),
            },
            Some(req) = door.recv() => core.door_send(req).await,
            ev = core.client.next_event(), if relay_open => match ev {
                Some(Event::Message(m)) => core.on_message(m, term).await,
                Some(other) => tracing::debug!(?other, "relay event"),
                None => {
                    // The agent keeps running; it just is not relayed any more.
                    tracing::warn!("relay client stopped");
                    relay_open = false;
                }
            },
            Some(notice) = notices.recv() => core.push_notice(&notice),
            Some(ReceiptDone) = receipts.recv() => core.unacked = core.unacked.saturating_sub(1),
            // Only when something is due (unread output, a queued message): an idle agent
            // costs the wrapper no wake-ups.
            () = sleep_until(wake) => {}
        }
        if let Err(e) = core.drive(now(), term).await {
            if term.typing_errors_end() {
                return Err(e);
            }
            tracing::warn!(error = %e, "typing into the pane failed");
        }
        core.report_terminal(term.backend(), now()).await;
    }
}

/// Runs the agent in a PTY until it exits; returns its exit code.
///
/// # Errors
/// [`WrapError`] when the agent cannot start or the relay cannot be reached at start.
pub async fn run_pty(cfg: WrapConfig) -> Result<i32, WrapError> {
    let interactive = cfg.interactive && rustix::termios::isatty(std::io::stdin());
    let client = connect(&cfg).await?;
    let (rows, cols) = terminal_size();
    let key = cfg.door_key.clone().unwrap_or_else(door::new_key);
    let env = vec![
        ("AGENT_RELAY_NAME".to_owned(), cfg.name.clone()),
        (door::KEY_ENV.to_owned(), key.clone()),
    ];
    let (pty, output) = pty::spawn(&cfg.command, &env, rows, cols)?;
    let _raw = if interactive {
        Some(RawMode::enter()?)
    } else {
        None
    };
    let (keys_tx, keys) = mpsc::channel::<Vec<u8>>(64);
    if interactive {
        std::thread::Builder::new()
            .name("relay-stdin".into())
            .spawn(move || {
                use std::io::Read;
                let mut buf = [0u8; 4096];
                let mut stdin = std::io::stdin();
                while let Ok(n) = stdin.read(&mut buf) {
                    if n == 0 || keys_tx.blocking_send(buf[..n].to_vec()).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| WrapError::Terminal(e.to_string()))?;
    } else {
        drop(keys_tx);
    }
    let mut term = pty::PtyTerminal::new(pty, output, keys)?;
    let (notice_tx, mut notices) = mpsc::unbounded_channel::<String>();
    let (receipt_tx, mut receipts) = mpsc::unbounded_channel::<ReceiptDone>();
    let mut core = Core::new(cfg, client, notice_tx, receipt_tx, rows)?;
    // The width tells a row Claude Code (or Codex, Gemini) wrapped from a line it wrote.
    core.parser.set_cols(usize::from(cols));
    core.set_agent_pid(term.pty.pid());
    let mut door = door::open(&core.cfg.team_dir, &core.cfg.name, &key);
    let ended = serve(&mut core, &mut term, &mut door, &mut notices, &mut receipts).await?;
    // The signal that stopped the wrapper, if one did: its exit status is then 128 + it, as a
    // shell reports a process a signal ended (so `agent-relay ...; next` stops at a Ctrl-C
    // sent to it, like any other command).
    let stopped = match ended {
        Ended::Stopped(signal) => Some(signal),
        Ended::Exited => None,
    };
    if let Some(signal) = stopped {
        tracing::info!(signal, "stopped by a signal: ending the agent");
        term.pty.kill();
    }
    let code = term.pty.wait().await?;
    let cfg = core.cfg.clone();
    let fleeting = core.finish(&mut term).await && stopped.is_none();
    if fleeting {
        forget_fleeting(&cfg).await;
    }
    Ok(stopped.map_or(code, |signal| 128 + signal))
}

/// Relays for an agent running in tmux session `session` (created by [`tmux::create`])
/// until the agent exits; returns its exit status. Stopping this process leaves the agent
/// running: run again, it picks the session up where the last one stopped, sending nothing
/// twice (see [`state::Checkpoint`]) and missing nothing the agent printed meanwhile that
/// tmux's history still holds.
///
/// # Errors
/// [`WrapError`] when the relay cannot be reached at start or the session cannot be attached.
pub async fn serve_tmux(cfg: WrapConfig, session: String) -> Result<i32, WrapError> {
    let client = connect(&cfg).await?;
    let mut checkpoint = Checkpoint::load(&cfg.team_dir);
    if checkpoint.at_ms == 0 {
        // The first relaying process for this session: ids it derives carry this time.
        checkpoint.at_ms = now_ms();
        checkpoint
            .save(&cfg.team_dir)
            .map_err(|e| WrapError::State(format!("cannot save the checkpoint: {e}")))?;
    }
    let (pane, output) = match tmux::Pane::attach(&session) {
        Ok(attached) => attached,
        // Gone before it could be attached (the agent exited at once, or the session or the
        // server was killed): as if it had gone while attached.
        Err(e) if !session_lives(&session) => {
            tracing::info!(error = %e, "the session is gone before it could be attached");
            client.close().await;
            let code = read_exit(&cfg.team_dir).await;
            log_last_lines(&cfg.team_dir, code);
            // It printed nothing this process saw and took part in nothing.
            if cfg.profile.name() == "generic" {
                forget_fleeting(&cfg).await;
            }
            return code.ok_or(WrapError::ExitUnknown { session });
        }
        Err(e) => return Err(e),
    };
    let key = session_door_key(&pane, cfg.door_key.as_deref());
    let (notice_tx, mut notices) = mpsc::unbounded_channel::<String>();
    let (receipt_tx, mut receipts) = mpsc::unbounded_channel::<ReceiptDone>();
    let mut core = Core::new(cfg, client, notice_tx, receipt_tx, 40)?;
    core.set_agent_pid(match pane.pid() {
        Ok(pid) => Some(pid),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the pane's process");
            None
        }
    });
    let offset = checkpoint.offset;
    core.resume = Some(Resume {
        checkpoint,
        session: session.clone(),
        seen: std::collections::HashMap::new(),
        dirty: false,
    });
    let mut term = tmux::TmuxTerminal::new(pane, output, session.clone())?;
    // A failure with the session gone is its end, which the loop hears of (`Note::Gone`).
    match Terminal::snapshot(&mut term, Some(offset)).await {
        Ok(Some(snap)) => core.resync(snap, now(), &mut term).await,
        Ok(None) => {}
        Err(e) if session_lives(&session) => return Err(e),
        Err(_) => {}
    }
    let mut door = door::open(&core.cfg.team_dir, &core.cfg.name, &key);
    let ended = serve(&mut core, &mut term, &mut door, &mut notices, &mut receipts).await?;
    if let Ended::Stopped(_) = ended {
        // Stopped: the agent keeps running in its session; a new wrapper resumes.
        tracing::info!("stopped by a signal; the agent keeps running in tmux");
        core.client.close().await;
        return Ok(0);
    }
    let code = read_exit(&core.cfg.team_dir).await;
    tracing::info!(?code, "the agent exited; ending its session");
    log_last_lines(&core.cfg.team_dir, code);
    core.maybe_checkpoint(&mut term).await;
    let cfg = core.cfg.clone();
    let fleeting = core.finish(&mut term).await;
    tmux::kill(&session);
    if fleeting {
        forget_fleeting(&cfg).await;
    }
    // Unknown is not success: a killed session must not pass for an agent that exited 0.
    code.ok_or(WrapError::ExitUnknown { session })
}

/// The door key of the agent in `pane`'s session. `given` (by the process that created the
/// session and put it in the agent's environment) is kept in the session's own environment,
/// set through the control client (its input, not a command line), so that a relaying process
/// started later for the same session finds it there. A session with none (started by an older
/// agent-relay) gets a new one: its agent's doors are refused until it is started again, which
/// is logged.
fn session_door_key(pane: &tmux::Pane, given: Option<&str>) -> String {
    if let Some(key) = given {
        if let Err(e) = pane.set_session_env(door::KEY_ENV, key) {
            tracing::warn!(error = %e, "cannot keep the door key in the tmux session; a relaying process started later for it will refuse the agent's MCP server and hooks");
        }
        return key.to_owned();
    }
    match pane.session_env(door::KEY_ENV) {
        Ok(Some(key)) => key,
        Ok(None) => {
            tracing::warn!(
                "the tmux session has no door key (started by an older agent-relay): the agent's MCP server and hooks are refused until it is started again"
            );
            door::new_key()
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the door key of the tmux session: the agent's MCP server and hooks are refused until it is started again");
            door::new_key()
        }
    }
}

/// Logs the pane's last lines when the agent failed (or its status is unknown): the log then
/// says why, not only the status.
fn log_last_lines(team_dir: &std::path::Path, code: Option<i32>) {
    if code == Some(0) {
        return;
    }
    let lines = tmux::last_lines(team_dir, 20);
    if !lines.is_empty() {
        tracing::warn!(?code, last_lines = %lines.join("\n"), "the agent failed; its last lines");
    }
}

/// Whether tmux session `session` still exists, asked up to three times a tenth of a second
/// apart: ending the relaying (and the session) on one failed `has-session` under a loaded
/// machine would end an agent that runs on.
pub(crate) fn session_lives(session: &str) -> bool {
    for attempt in 0..3 {
        if tmux::exists(session) {
            return true;
        }
        if attempt < 2 {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    false
}

/// The agent's exit status, from `<team dir>/exit`: written by the session's shell just before
/// it ends, so it is there by the time the session is gone, unless the session was killed.
/// A moment is given for a write still under way.
async fn read_exit(team_dir: &std::path::Path) -> Option<i32> {
    let exit = team_dir.join("exit");
    for _ in 0..10 {
        if let Ok(text) = std::fs::read_to_string(&exit) {
            return text.trim().parse().ok();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

#[cfg(test)]
mod serve_tests;

#[cfg(test)]
mod colour_tests {
    use super::colour_warning;
    use relay_parse::Profile;

    #[test]
    fn no_color_warns_only_where_colour_tells_code_from_prose() {
        let claude = Profile::by_name("claude").expect("the claude parser");
        let codex = Profile::by_name("codex").expect("the codex parser");
        let set = |v: &str| {
            let v = v.to_owned();
            move |k: &str| (k == "NO_COLOR").then(|| v.clone())
        };
        let warning = colour_warning(&claude, set("1")).expect("a warning");
        assert!(warning.contains("NO_COLOR") && warning.contains("code block"));
        // An empty NO_COLOR is unset (no-color.org); other parsers do not use colour for this.
        assert_eq!(colour_warning(&claude, set("")), None);
        assert_eq!(colour_warning(&claude, |_: &str| None), None);
        assert_eq!(colour_warning(&codex, set("1")), None);
    }

    #[test]
    fn a_refusal_reason_is_cut_at_a_words_end() {
        use crate::{cut_at_word, refusal_notice};
        assert_eq!(cut_at_word("short enough", 20), "short enough");
        assert_eq!(
            cut_at_word("kept in the dead-letter queue", 15),
            "kept in the…"
        );
        assert_eq!(cut_at_word("unbreakableword", 8), "unbreak…");
        let notice = refusal_notice("Bob", &"word ".repeat(200));
        assert!(notice.ends_with("word…"), "{notice}");
    }
}
