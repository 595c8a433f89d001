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

mod claim;
mod decide;
mod deliver;
mod door;
pub mod format;
pub mod inject;
mod link;
pub mod profile;
mod pty;
mod shell;
mod shell_line;
pub mod state;
mod terminal;
pub mod tmux;
/// The door's socket file name in the team directory (see `door.rs`).
pub use door::SOCKET as DOOR_SOCKET;
/// The door key's variable in the agent's environment, and how a wrapper makes one (see
/// `door.rs`).
pub use door::{KEY_ENV as DOOR_KEY_ENV, new_key as new_door_key};
pub use transcript::descends_from;

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

use relay_client::{ClientConfig, ClientError, Delivered, Outgoing};
use relay_parse::{Directive, Parser, ScreenText};
use relay_protocol::{DeliveryState, Send, TerminalState, now_ms, text};
use tokio::sync::mpsc;

use crate::decide::chain::Chain;
use crate::decide::effect::Effect;
use crate::decide::ledger::{self, Admission, Replayed};
use crate::decide::notices::Notices;
use crate::decide::outbox::{Gate, Outbox, recipient};
use crate::decide::quiet::Quiet;
use crate::decide::resume::Resume;
use crate::inject::{Action, Injector, Look, Timing};
use crate::profile::{NotReady, Profile};
use crate::state::{Checkpoint, InjectedLog};
use crate::terminal::Terminal;

/// Variables the agent does not inherit from the wrapper. Each tells command-line programs that
/// no person is at the terminal, and the agent under the relay is in a terminal a person can
/// attach to: with `CI` set, Gemini CLI exits at start and Claude Code draws without colour
/// (a code block then looks like prose, and a directive shown in one like a real one).
pub const NOT_INHERITED: &[&str] = &["CI", "CONTINUOUS_INTEGRATION"];

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
    /// The pseudo-terminal or the agent process failed.
    #[error("{0}")]
    Pty(String),
    /// tmux failed (the tmux backend).
    #[error(transparent)]
    Tmux(#[from] tmux::TmuxError),
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
    /// Topic patterns the agent subscribes to (`wrap --subscribe`), on every (re)connection.
    pub topics: Vec<String>,
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
    parser: Parser,
    injector: Injector<Item>,
    log: InjectedLog,
    /// What the shell is to do, in order (see [`Core::take_effects`]).
    out: Vec<Effect>,
    /// Directives checked and waiting for a person's activity to be read (see
    /// [`Effect::ReadActivity`]), in order.
    parked: std::collections::VecDeque<(Directive, String)>,
    /// A person's activity was asked for and has not come back.
    asked_activity: bool,
    /// Directives relayed whose receipt has not come back.
    unacked: usize,
    /// The quiet clock of the agent's output (see `decide/quiet.rs`).
    quiet: Quiet,
    /// Which relayed message what the agent prints answers (see `decide/chain.rs`).
    chain: Chain,
    /// Ids queued in the injector (a replay after a reconnect must not queue them twice).
    queued: HashSet<String>,
    /// Output read since the log last said everything read was settled and relayed
    /// (see [`Core::tell_if_relayed`]).
    relayed_told: bool,
    /// tmux: where relaying can resume (see `decide/resume.rs`).
    resume: Option<Resume>,
    /// What the relay was last told of the terminal (see [`Core::terminal_report`]).
    reported: Option<(TerminalState, Option<String>)>,
    /// When a message was last typed into the agent, until its output settles after it: the
    /// agent is answering (busy), for `agents`, `wait` and `--notify idle` (see
    /// [`Core::answer_over`]).
    answering: Option<Instant>,
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
    /// Notice delivery's bookkeeping (see `decide/notices.rs` and `deliver.rs`).
    noticed: Notices,
    /// How text is typed into this agent: as a shell no-op when it is a shell.
    form: format::Form,
    /// Directives on their way out, behind the agent's own record of its replies (Claude
    /// Code's transcript, Codex's rollout, Gemini's chat; see `decide/outbox.rs`).
    outbox: Outbox,
    /// Messages Claude Code's Stop hook handed to the model (acknowledged injected), verified
    /// when its next Stop hook runs: the turn they started has ended.
    hooked: Vec<Delivered>,
}

impl Core {
    /// The core of agent `cfg`, with the agent's record of its replies behind `gate` (see
    /// [`shell::transcript_gate`]), its terminal `rows` high, at `now`.
    fn new(
        cfg: WrapConfig,
        gate: Option<Box<dyn Gate>>,
        rows: u16,
        now: Instant,
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
        Ok(Self {
            injector,
            parser,
            log,
            out: Vec::new(),
            parked: std::collections::VecDeque::new(),
            asked_activity: false,
            unacked: 0,
            quiet: Quiet::new(cfg.profile.settle, cfg.profile.turn_settle, now),
            chain: Chain::default(),
            queued: HashSet::new(),
            relayed_told: false,
            resume: None,
            reported: None,
            answering: None,
            started: false,
            shown: false,
            exchanged: false,
            paste: format::PasteMode::default(),
            noticed: Notices::default(),
            form,
            outbox: Outbox::new(gate, cfg.profile.settle),
            hooked: Vec::new(),
            cfg,
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
        if self.answering.is_some() {
            return (TerminalState::Busy, Some("answering a message".into()));
        }
        // Printing for a while, not a moment: a person's typing echoed back or a one-line
        // answer is not worth telling anyone about.
        if self.quiet.printing(now) {
            (TerminalState::Busy, Some("printing".into()))
        } else {
            (TerminalState::Idle, None)
        }
    }

    /// How the terminal looks at `now`, when that changed since the relay was last told (the
    /// dashboard's agent state; see [`Core::reported`]); nothing while it stays the same.
    fn terminal_report(&self, now: Instant) -> Option<(TerminalState, Option<String>)> {
        let view = self.terminal_view(now);
        (self.reported.as_ref() != Some(&view)).then_some(view)
    }

    /// The relay was told `view` of the terminal.
    fn reported(&mut self, view: (TerminalState, Option<String>)) {
        self.reported = Some(view);
    }

    /// What the shell is to do, in order; the core forgets them.
    fn take_effects(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.out)
    }

    /// The answer to a typed message is over once the output has settled after it was typed
    /// (or, for an agent that printed nothing at all, a settle time after it). Pure: the
    /// caller clears [`Core::answering`].
    fn answer_over(&self, now: Instant) -> bool {
        self.answering.is_some_and(|typed| {
            self.quiet.settled()
                && (self.quiet.last_output() > typed || now >= typed + self.cfg.profile.settle)
        })
    }

    /// The agent's process: where its CLI's own transcript is found (see `transcript.rs`).
    fn set_agent_pid(&mut self, pid: Option<u32>) {
        match (self.outbox.gate_mut(), pid) {
            (Some(t), Some(pid)) => t.set_agent_pid(pid),
            // Claude Code's sessions are found from its process; Codex's and Gemini's records
            // from the working directory.
            (Some(t), None) if t.sends_unseen() => tracing::warn!(
                "the agent's process id is unknown: its Claude Code transcript is not read, and a @relay: line in a ```text code block would be sent"
            ),
            (_, _) => {}
        }
    }

    /// Sends a directive read off the screen, once the agent's record of its replies has its
    /// reply if one is kept (see `decide/outbox.rs`).
    fn send_directive(&mut self, d: Directive, now: Instant) {
        if let Some(d) = self.outbox.found(d, now) {
            self.send_checked(d);
        }
    }

    /// Sends the held directives whose reply the record has now, or whose wait is over, in
    /// the order the screen showed them.
    fn release_held(&mut self, now: Instant) {
        if !self.outbox.release_due(now) {
            return;
        }
        while let Some(d) = self.outbox.next_released(now, self.quiet.last_output()) {
            self.send_checked(d);
        }
        self.outbox.released(now);
    }

    /// Sends a directive from the screen as the agent's record of its replies has it (if it
    /// is to be sent at all), in the reply chain a person's key may have ended: while one
    /// may have (see `decide/chain.rs`), the directive waits for the person's activity to be
    /// read ([`Effect::ReadActivity`]), as do those after it.
    fn send_checked(&mut self, d: Directive) {
        self.exchanged = true;
        let to = recipient(&d);
        let Some(d) = self.outbox.check(d) else {
            return;
        };
        if self.parked.is_empty() && self.chain.activity_wanted().is_none() {
            self.relay_directive(d, to);
            return;
        }
        self.parked.push_back((d, to));
        if !self.asked_activity {
            self.asked_activity = true;
            self.out.push(Effect::ReadActivity);
        }
    }

    /// A person's activity in the terminal, read for the directives waiting for it (`None`:
    /// it could not be read; the chain goes on): they go now.
    fn person_activity(&mut self, at: Option<u64>) {
        self.asked_activity = false;
        if let Some(at) = at {
            self.chain.person_activity(at);
        }
        while let Some((d, to)) = self.parked.pop_front() {
            self.relay_directive(d, to);
        }
    }

    /// Sends what Claude Code's replies said and its screen did not show: the start of a
    /// reply taller than the screen, which Claude Code never draws when the reply arrives at
    /// once (issue 19.2).
    fn send_from_transcript(&mut self) {
        let (unseen, notice) = self.outbox.unseen();
        // The agent is the sender of what may be lost: it is told once, and how to avoid it.
        if let Some(notice) = notice {
            self.push_notice(notice);
        }
        for d in unseen {
            let to = recipient(&d);
            self.relay_directive(d, to);
        }
    }

    /// A prompt is submitted: the transcript's re-print guard starts a new turn (a directive
    /// said again from now on is meant again, issue 23.17).
    fn new_turn(&mut self) {
        self.outbox.new_turn();
    }

    /// Relays a directive found on the screen or in the transcript (already checked).
    fn relay_directive(&mut self, mut d: Directive, to: String) {
        if let (Some(pattern), None) = (&d.subscribe, &d.malformed) {
            // A `[[RELAY]]` block `{"subscribe": PATTERN}`: the agent's connection
            // subscribes, and the agent is told how it went (see [`Effect::Subscribe`]).
            self.out.push(Effect::Subscribe(pattern.clone()));
            return;
        }
        if let (Some(verb), None) = (&d.team, &d.malformed) {
            // A `[[RELAY]]` block `{"spawn": ...}` or `{"release": ...}` (see [`Effect::Team`]).
            self.out.push(Effect::Team(verb.clone()));
            return;
        }
        if let (Some(verb), None) = (&d.claim, &d.malformed) {
            // A `[[RELAY]]` block `{"claim": ...}`/`{"unclaim": ...}` (see [`Effect::Claim`]).
            self.out.push(Effect::Claim(verb.clone()));
            return;
        }
        if let Some(why) = &d.malformed {
            // Not a directive the relay can send (a bad name, a block that does not parse):
            // the agent meant to send something, and is told what was not sent and why.
            tracing::warn!(%to, %why, "a malformed directive was printed; not sent, the agent is told");
            let why: String = text::typed(why).chars().take(400).collect();
            self.push_notice(&format!("relay: {why}"));
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
            self.push_notice(&refusal_notice(&to, &reason));
            return;
        }
        // Printed after a relayed message arrived: an answer to it, in its thread (see
        // `decide/chain.rs`).
        let (in_reply_to, thread) = self.chain.answer(&to, d.thread.take());
        // tmux: ids repeatable from the checkpoint, so a wrapper restarted there re-sends
        // the same ids and the relay drops them as duplicates.
        let id = self.resume.as_mut().map(|r| r.directive_id(&to, &d.body));
        // `to` as written (`#build.linux` for a topic's subscribers); the SEND says `*` and
        // the topic.
        let (send_to, topic) = d.to.route();
        let msg = Outgoing {
            id,
            to: Some(send_to),
            topic,
            payload: Send {
                origin: None,
                kind: d.kind,
                body: d.body,
                data: d.data,
                thread,
                in_reply_to,
                budget: None,
                urgent: false,
            },
        };
        // The receipt is awaited off the loop (see [`Core::on_receipt`]).
        self.unacked += 1;
        self.out.push(Effect::Relay { msg, to });
    }

    /// A directive's receipt came back (or never will).
    fn on_receipt(&mut self) {
        self.unacked = self.unacked.saturating_sub(1);
    }

    /// `n` bytes of output were read at `now`, the total now `read` (`None`: `n` more than
    /// before). PTY: called before the bytes are shown to the person, so a test that sees
    /// them on the screen knows this was logged (see [`Core::tell_if_relayed`]).
    fn on_read(&mut self, n: usize, read: Option<u64>, now: Instant) {
        if n == 0 {
            return;
        }
        if self.quiet.on_read(n, read, now) {
            tracing::debug!(read = self.quiet.read(), "output after a quiet spell");
        }
        self.relayed_told = false;
    }

    /// The agent's output: `n` bytes read at `now` (before the person sees them, see
    /// [`Core::on_read`]).
    fn output_read(&mut self, n: usize, now: Instant) {
        self.on_read(n, None, now);
        if let Some(r) = &mut self.resume {
            r.output();
        }
    }

    /// A person's keys at the wrapper's terminal (PTY), at `now`: a half-written line holds
    /// messages back, and a new line starts a new conversation (what the agent prints next
    /// answers them, not the last relayed message).
    fn on_keys(&mut self, keys: &[u8], now: Instant) {
        self.injector.on_person_input(keys, now);
        if keys.contains(&b'\r') {
            self.chain.person_entered();
            self.new_turn();
        }
    }

    /// The agent's terminal has a new size.
    fn on_resize(&mut self, rows: u16, cols: u16) {
        self.parser.set_rows(usize::from(rows));
        self.parser.set_cols(usize::from(cols));
    }

    /// A person's activity in the terminal as the message typed last was entered (see
    /// [`Effect::NoteActivity`]; `None`: unknown).
    fn chain_entered(&mut self, at: Option<u64>) {
        self.chain.entered(at);
    }

    /// Bytes read (counted by [`Core::on_read`] first): fed to the parser, each directive in
    /// them relayed.
    fn on_output(&mut self, bytes: &[u8], now: Instant) {
        self.paste.feed(bytes);
        self.injector.on_output(now);
        self.quiet.on_output(now);
        self.chain.on_output();
        for d in self.parser.feed(bytes) {
            self.send_directive(d, now);
        }
    }

    /// tmux: bytes the pane printed.
    fn on_pane_output(&mut self, bytes: &[u8], now: Instant) {
        self.output_read(bytes.len(), now);
        self.on_output(bytes, now);
    }

    /// tmux: reads what a snapshot of the pane holds (see [`tmux::Pane::snapshot`]), with a
    /// new parser: the rows earlier wrappers read, with what they make the parser find
    /// dropped (it was relayed), then the texts typed since the checkpoint noted (their echo
    /// is no directive), then the rows no wrapper read, whose directives are relayed with the
    /// ids they would have had (the relay drops those sent already).
    fn resync(&mut self, snap: terminal::Snapshot, now: Instant) {
        let mut parser = Parser::new(self.cfg.profile.parse.clone());
        parser.set_rows(usize::from(snap.rows));
        parser.set_cols(usize::from(snap.cols));
        self.parser = parser;
        let Some(r) = &mut self.resume else {
            return;
        };
        r.reread();
        let typed = self.log.typed_since(r.offset());
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
        self.on_pane_output(&snap.unseen, now);
    }

    /// How message `m` is admitted against what this terminal was given before (see
    /// `decide/ledger.rs`).
    fn admission(&self, m: &Delivered) -> Admission {
        ledger::admit(
            self.queued.contains(&m.id),
            relay_protocol::validate_message_id(&m.id).map_err(|e| e.to_string()),
            self.log.get(&m.id),
            self.cfg.delivery,
        )
    }

    /// Whether the terminal's history must be read before message `m` is admitted: a
    /// stopped wrapper typed it, and the terminal outlives its wrapper (`kept`).
    fn needs_history(&self, m: &Delivered, kept: bool) -> bool {
        kept && matches!(self.admission(m), Admission::Interrupted(_))
    }

    /// A message arrived for this agent: admitted against what this terminal was given
    /// before (see `decide/ledger.rs`), then queued to be typed. `kept`: the terminal
    /// outlives its wrapper; `history`: what it holds, read when [`Core::needs_history`]
    /// said so (`None`: not read, or it could not be).
    fn on_message(&mut self, m: Delivered, kept: bool, history: Option<&str>) {
        self.exchanged = true;
        let admission = self.admission(&m);
        // Lines kept for a CLI that takes a multi-line paste as one prompt; a shell gets one
        // quoted line.
        let text = self.text_for(std::slice::from_ref(&m), m.payload.urgent);
        match admission {
            Admission::Queued => return,
            Admission::BadId(why) => {
                // Reported failed, so it becomes a dead letter and its sender is told.
                tracing::warn!(
                    id = %text::one_line(&m.id, 160),
                    error = %why,
                    "a message with an id the relay should have refused: not typed, reported failed"
                );
                self.fail(&m, &why);
                return;
            }
            Admission::Noticed => {
                self.ack(&m, DeliveryState::Injected);
                self.noticed.noticed(m);
                return;
            }
            Admission::Known(state) => {
                self.ack(&m, state);
                return;
            }
            Admission::FailedBefore => {
                self.fail(&m, ledger::FAILED_BEFORE);
                return;
            }
            Admission::Interrupted(state) => {
                let short = relay_protocol::short_id(&m.id);
                let in_history = history.map(|h| h.contains(&format!("[{short}]")));
                // The parser's screen: read afresh from the pane when this wrapper attached.
                let (profile, parser) = (&self.cfg.profile, &self.parser);
                let waiting = || !profile.submitted(&parser.screen(), &text);
                match ledger::replayed(state, kept, in_history, waiting) {
                    Replayed::TypeAgain => {
                        tracing::info!(id = %m.id, ?state, "typing again a message a stopped wrapper did not submit");
                    }
                    Replayed::Given { press_enter: true } => {
                        tracing::info!(id = %m.id, "pressing the Enter a stopped wrapper did not");
                        self.out.push(Effect::EnterReplayed(m));
                        return;
                    }
                    Replayed::Given { press_enter: false } => {
                        self.replayed_given(m);
                        return;
                    }
                    Replayed::Unknown => {
                        self.record_replayed(&m);
                        tracing::warn!(id = %m.id, "a message was submitted to an agent that ended with its wrapper; whether it read it is unknown, so it is reported as failed");
                        self.fail(&m, ledger::READ_UNKNOWN);
                        return;
                    }
                }
            }
            Admission::New => {}
        }
        if self.cfg.inbox.is_some() {
            self.out.push(Effect::AppendInbox(m.clone()));
        }
        if self.shown_already(&m) {
            return;
        }
        let urgent = m.payload.urgent;
        tracing::debug!(id = %m.id, "a message waits to be typed");
        self.queued.insert(m.id.clone());
        self.injector.push(text, Item::Messages(vec![m]), urgent);
    }

    /// A message a stopped wrapper typed is in the terminal (its missing Enter pressed if it
    /// was; see [`Effect::EnterReplayed`]): recorded and acknowledged injected. A failure to
    /// press the Enter changes nothing: the text is in the agent's input line, where a person
    /// can submit it; typing it again would double it.
    fn replayed_given(&mut self, m: Delivered) {
        self.record_replayed(&m);
        self.ack(&m, DeliveryState::Injected);
    }

    /// Records the outcome of a message a stopped wrapper typed, found given.
    fn record_replayed(&mut self, m: &Delivered) {
        if let Err(e) = self.log.finished(&m.id, false) {
            // The acknowledgement still goes; a later replay finds the id started and, the
            // text being in the pane's history, acknowledges it again untyped.
            tracing::warn!(id = %m.id, error = %e, "cannot record an injected message's outcome in injected.log");
        }
    }

    /// Queues a notice from the relay (a refusal) for the agent, in the agent's form.
    fn push_notice(&mut self, notice: &str) {
        self.injector
            .push(self.form.apply(notice), Item::Notice, false);
    }

    /// The agent's own tool used the door (`door.rs`): it took part.
    fn door_used(&mut self) {
        self.exchanged = true;
    }

    /// Claude Code ran its Stop hook (`agent-relay hooks stop`, through the door): the turn
    /// it ends is over. Messages an earlier Stop hook handed over started that turn: verified.
    /// Unless this turn was itself one a Stop hook continued (`active`: Claude Code allows only
    /// a few in a row, and might not go on with more), the messages waiting to be typed are
    /// handed over instead: recorded in `injected.log` as typed and entered (never typed
    /// after), acknowledged injected, and returned for the hook's block decision. What no hook
    /// takes is typed once the agent is idle, as before.
    fn hook_stop(&mut self, active: bool) -> Vec<String> {
        for m in std::mem::take(&mut self.hooked) {
            tracing::debug!(id = %m.id, "the turn the Stop hook started with this message has ended: verified");
            if let Err(e) = self.log.finished(&m.id, true) {
                tracing::warn!(id = %m.id, error = %e, "cannot record a hooked message's outcome in injected.log");
            }
            self.queued.remove(&m.id);
            self.ack_door(&m, HOOK_DOOR);
        }
        if active {
            tracing::debug!("a Stop hook continued this turn: messages wait to be typed");
            return Vec::new();
        }
        self.hand_to_hook("Stop")
    }

    /// Claude Code ran its UserPromptSubmit hook (`agent-relay hooks prompt`, through the
    /// door): a prompt was submitted. Unless the wrapper is typing one of its own (that is the
    /// prompt submitted), a person submitted it: the messages waiting to be typed (held while
    /// the person wrote their line) go in with it, as the turn's context, recorded as for the
    /// Stop hook (injected now, verified when the turn's Stop hook runs) and never typed after.
    fn hook_prompt(&mut self) -> Vec<String> {
        if self.injector.current().is_some() {
            tracing::debug!(
                "the prompt submitted is the wrapper's own typing: the other messages wait their turn"
            );
            return Vec::new();
        }
        self.hand_to_hook("UserPromptSubmit")
    }

    /// Takes the messages waiting to be typed out of the queue for Claude Code's `hook` (named
    /// in the log): recorded in `injected.log` as typed and entered, acknowledged injected, to
    /// be verified by the next Stop hook; their texts are returned for the hook's answer.
    fn hand_to_hook(&mut self, hook: &str) -> Vec<String> {
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
                self.chain.handed(&m);
                self.ack(&m, DeliveryState::Injected);
                self.hooked.push(m);
            }
            texts.push(text);
        }
        texts
    }

    /// Reports `m` failed, saying why (the dead letter's reason, told to its sender).
    fn fail(&mut self, m: &Delivered, why: &str) {
        self.out.push(Effect::Fail(m.clone(), why.to_owned()));
    }

    /// Acknowledges `m` verified because `door` showed it to the model whole (a hook's
    /// answer, the agent's own tool): the trace names the door.
    fn ack_door(&mut self, m: &Delivered, door: &'static str) {
        self.out.push(Effect::AckShown(m.clone(), door));
    }

    /// Acknowledges `m` with its outcome.
    fn ack(&mut self, m: &Delivered, state: DeliveryState) {
        self.out.push(Effect::Ack(m.clone(), state));
    }

    /// When the loop must wake up next, if nothing happens before.
    fn next_wake(&self) -> Option<Instant> {
        let answered = self
            .answering
            .filter(|_| self.quiet.settled())
            .map(|typed| typed + self.cfg.profile.settle);
        [
            self.quiet.due(),
            answered,
            self.injector.next_deadline(),
            self.outbox.due(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Does whatever of the output is due at `now`: settle the parser, send its directives,
    /// look at the transcript. Then the shell takes a checkpoint if one is due
    /// ([`Core::checkpoint_due`]) and calls [`Core::drive_typing`]. `sees_keys`: the person's
    /// keys come through the wrapper (PTY), so a reply chain ends at their Enter.
    fn drive_output(&mut self, now: Instant, sees_keys: bool) {
        let (profile, parser) = (&self.cfg.profile, &self.parser);
        if self
            .quiet
            .settles(now, || profile.waiting_for_input(&parser.screen()))
        {
            if !self.shown && self.quiet.read() > 0 {
                self.shown = true;
                tracing::info!("the agent printed and went quiet: it is past its start");
                self.report_start("started");
            }
            for d in self.parser.settle() {
                self.send_directive(d, now);
            }
            self.send_from_transcript();
            self.outbox.settled(now);
        }
        self.release_held(now);
        if self.answer_over(now) {
            self.answering = None;
        }
        if self.outbox.recheck(now) {
            self.send_from_transcript();
            tracing::debug!("the transcript was looked at once more after the output went quiet");
        }
        if !sees_keys {
            self.end_turn_if_idle();
        }
    }

    /// Types, presses Enter and checks whatever is due at `now` (after
    /// [`Core::drive_output`]).
    fn drive_typing(&mut self, now: Instant, sees_keys: bool) {
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
                    self.answering = Some(now);
                    self.parser.note_injected(&text);
                    self.out.push(Effect::Type(text));
                }
                Action::Enter => {
                    self.entering();
                    self.new_turn();
                    self.out.push(Effect::Enter);
                    if !self.cfg.profile.knows_prompt() {
                        self.out.push(Effect::NoteActivity);
                    }
                }
                Action::Done(Item::Messages(messages), outcome) => {
                    // The relay hears that the agent is answering before it hears the
                    // messages taken: it never sees it idle in between.
                    self.out.push(Effect::ReportState);
                    self.finished(messages, outcome);
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
        if !sees_keys {
            self.end_turn_if_idle();
        }
    }

    /// Logs, once per burst of output, when everything read has settled and every directive
    /// in it was relayed and its receipt came back (the transcript looked at once more, for
    /// Claude Code). Tests wait for this line to prove that nothing more is sent from the
    /// output read so far: `read` says which output it covers (every byte up to there), and
    /// an `output after a quiet spell` line (logged before the person sees those bytes)
    /// says when more came.
    fn tell_if_relayed(&mut self) {
        if self.relayed_told || !self.quiet.settled() || !self.outbox.empty() || self.unacked > 0 {
            return;
        }
        self.relayed_told = true;
        tracing::debug!(
            read = self.quiet.read(),
            "output settled; every directive in it relayed"
        );
    }

    /// tmux: whether a checkpoint is due (see `decide/resume.rs`): everything read is settled
    /// and every directive in it acknowledged, so a restarted wrapper can start reading from
    /// the cursor's row.
    fn checkpoint_due(&self) -> bool {
        self.resume.as_ref().is_some_and(|r| {
            r.due(
                self.quiet.settled(),
                self.unacked == 0 && !self.outbox.holding() && self.parked.is_empty(),
            )
        })
    }

    /// tmux: the checkpoint moves to the cursor's `row` (read because it was due) at `at_ms`.
    fn checkpoint_at(&mut self, row: u64, at_ms: u64) {
        if let Some(r) = &mut self.resume {
            self.out.push(Effect::SaveCheckpoint(*r.moved(row, at_ms)));
        }
    }

    /// Tells the command that started this wrapper how the start goes (see
    /// [`WrapConfig::report_start`]).
    fn report_start(&mut self, word: &'static str) {
        if self.cfg.report_start {
            self.out.push(Effect::ReportStart(word));
        }
    }

    /// Whether the agent was a command that exits at once rather than an agent: not a known
    /// agent CLI (the generic profile), it exited before it was past its start, and it took
    /// no part in any exchange. `agent-relay ls` (a typo) runs `ls`; its generated name must
    /// not stay in `agents` nor be announced to the agents that start later.
    fn fleeting(&self) -> bool {
        self.cfg.profile.name() == "generic" && !self.shown && !self.exchanged
    }

    /// Sends what the screen still holds: the agent's side ended at `now`.
    fn finish(&mut self, now: Instant) {
        for d in self.parser.finish() {
            self.send_directive(d, now);
        }
        // Nothing more will come: what waits for the transcript goes by the screen now.
        for d in self.outbox.drain() {
            self.send_checked(d);
        }
    }
}

async fn connect(cfg: &WrapConfig) -> Result<relay_client::Client, WrapError> {
    let client = relay_client::Client::connect(ClientConfig {
        cli: cfg.command.first().cloned(),
        topics: cfg.topics.clone(),
        ..ClientConfig::agent(cfg.socket.clone(), cfg.name.clone())
    })
    .await?;
    if cfg.report_start {
        report_start_line("connected");
    }
    Ok(client)
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
    let pty = pty::spawn(&cfg.command, &env, rows, cols)?;
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
    let mut term = pty::PtyTerminal::new(pty, keys)?;
    let gate = shell::transcript_gate(&cfg);
    let mut core = Core::new(cfg, gate, rows, now())?;
    // The width tells a row Claude Code (or Codex, Gemini) wrapped from a line it wrote.
    core.parser.set_cols(usize::from(cols));
    core.set_agent_pid(term.pty.pid());
    // The agent's own `agent-relay spawn` (a team directive) asks through this door with it.
    core.cfg.door_key = Some(key.clone());
    let mut door = door::open(&core.cfg.team_dir, &core.cfg.name, &key);
    let mut shell = shell::Shell::new(client);
    let ended = shell.serve(&mut core, &mut term, &mut door).await?;
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
    let fleeting = shell.end(&mut core, &mut term).await && stopped.is_none();
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
    // SIGTERM is handled from before the first control client starts: its default action
    // would end the process with the client attaching or attached, outside the tmux lock.
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| WrapError::Terminal(e.to_string()))?;
    let served = serve_tmux_with(cfg, session, term).await;
    // Every control client let go of detaches under the tmux lock before the process ends.
    if let Err(e) = tokio::task::spawn_blocking(tmux::wait_detached).await {
        tracing::warn!(error = %e, "cannot wait for the tmux control client to detach");
    }
    served
}

/// [`serve_tmux`] with SIGTERM already handled by `term`.
async fn serve_tmux_with(
    cfg: WrapConfig,
    session: String,
    term: tokio::signal::unix::Signal,
) -> Result<i32, WrapError> {
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
    let gate = shell::transcript_gate(&cfg);
    let mut core = Core::new(cfg, gate, 40, now())?;
    let mut shell = shell::Shell::new(client);
    core.set_agent_pid(match pane.pid() {
        Ok(pid) => Some(pid),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the pane's process");
            None
        }
    });
    let offset = checkpoint.offset;
    core.resume = Some(Resume::new(checkpoint, session.clone()));
    let mut term = tmux::TmuxTerminal::new(pane, output, session.clone(), term);
    // A failure with the session gone is its end, which the loop hears of (`Note::Gone`).
    match Terminal::snapshot(&mut term, Some(offset)).await {
        Ok(Some(snap)) => {
            core.resync(snap, now());
            shell.apply(&mut core, &mut term).await?;
        }
        Ok(None) => {}
        Err(e) if session_lives(&session) => return Err(e),
        Err(_) => {}
    }
    core.cfg.door_key = Some(key.clone());
    let mut door = door::open(&core.cfg.team_dir, &core.cfg.name, &key);
    let ended = shell.serve(&mut core, &mut term, &mut door).await?;
    if let Ended::Stopped(_) = ended {
        // Stopped: the agent keeps running in its session; a new wrapper resumes.
        tracing::info!("stopped by a signal; the agent keeps running in tmux");
        shell.close().await;
        return Ok(0);
    }
    let code = read_exit(&core.cfg.team_dir).await;
    tracing::info!(?code, "the agent exited; ending its session");
    log_last_lines(&core.cfg.team_dir, code);
    shell.checkpoint(&mut core, &mut term).await;
    let cfg = core.cfg.clone();
    let fleeting = shell.end(&mut core, &mut term).await;
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
mod core_tests;
#[cfg(test)]
mod fake_relay;
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
