//! The wrapper's decision core, `Core`: what the loop hears goes in with `now` (output, a
//! person's keys, a resize, a re-read pane, a delivered message, a receipt, a notice, a door's
//! request, the clock), and what to do comes out as data ([`Effect`]), with the next wake-up
//! and the terminal's state. The shell (`shell.rs`) reads the terminal, the relay, the door and
//! the files, and carries the effects out. Here nothing awaits, reads a clock, or holds a
//! terminal, a socket or a file: `decide/tests.rs` checks these sources for them.
//!
//! - `mod.rs`: `Core`, its events and the clock's part (the output, the typing, checkpoints).
//! - `deliver.rs`: typing and acknowledging messages one by one, as a digest or a notice, and
//!   the doors that hand messages over instead (the agent's tool).
//! - `tests.rs`: unit tests, one per decision, and the property test across restarts.

mod deliver;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use relay_client::{Delivered, Outgoing};
use relay_parse::{Directive, Parser, ScreenText};
use relay_protocol::{DeliveryState, Send, TerminalState, text};

use crate::decide::chain::Chain;
use crate::decide::effect::Effect;
use crate::decide::ledger::{self, Admission, Ledger, Record, Replayed};
use crate::decide::notices::Notices;
use crate::decide::outbox::{Gate, Outbox, recipient};
use crate::decide::quiet::Quiet;
use crate::decide::resume::Resume;
use crate::format;
use crate::inject::{Action, Injector, Look, Timing};
use crate::profile::{NotReady, Profile};
use crate::terminal::Snapshot;
use crate::{HOOK_TEXT_MAX, WrapConfig, intro};

/// The door a message handed to a Claude Code hook is verified by, in its trace.
const HOOK_DOOR: &str = "handed to the model by Claude Code's hook (through the wrapper)";
/// The door a message the agent's own tool showed is verified by, in its trace.
const TOOL_DOOR: &str = "shown to the model by the agent's MCP tool (relay_inbox, relay_read)";

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
pub(crate) fn refusal_notice(to: &str, reason: &str) -> String {
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

/// The decision core both backends share: the parser, the injector, the replay ledger in
/// memory and every decision's state; what it decides goes out as [`Effect`]s.
pub(crate) struct Core {
    pub(crate) cfg: WrapConfig,
    pub(crate) parser: Parser,
    injector: Injector<Item>,
    /// The replay ledger in memory: what this terminal was given (see `decide/ledger.rs`);
    /// each change goes to the shell as an [`Effect::Record`] too.
    ledger: Ledger,
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
    pub(crate) resume: Option<Resume>,
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
    /// The core of agent `cfg`, remembering what `ledger` says its terminal was given before
    /// (read from `injected.log`, see [`load_ledger`]), with the agent's record of its replies
    /// behind `gate` (see [`shell::transcript_gate`]), its terminal `rows` high, at `now`.
    pub(crate) fn new(
        cfg: WrapConfig,
        ledger: Ledger,
        gate: Option<Box<dyn Gate>>,
        rows: u16,
        now: Instant,
    ) -> Self {
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
        Self {
            injector,
            parser,
            ledger,
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
        }
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
    pub(crate) fn terminal_report(&self, now: Instant) -> Option<(TerminalState, Option<String>)> {
        let view = self.terminal_view(now);
        (self.reported.as_ref() != Some(&view)).then_some(view)
    }

    /// The relay was told `view` of the terminal.
    pub(crate) fn reported(&mut self, view: (TerminalState, Option<String>)) {
        self.reported = Some(view);
    }

    /// What the shell is to do, in order; the core forgets them.
    pub(crate) fn take_effects(&mut self) -> Vec<Effect> {
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
    pub(crate) fn set_agent_pid(&mut self, pid: Option<u32>) {
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
    pub(crate) fn person_activity(&mut self, at: Option<u64>) {
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
    pub(crate) fn on_receipt(&mut self) {
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
    pub(crate) fn output_read(&mut self, n: usize, now: Instant) {
        self.on_read(n, None, now);
        if let Some(r) = &mut self.resume {
            r.output();
        }
    }

    /// A person's keys at the wrapper's terminal (PTY), at `now`: a half-written line holds
    /// messages back, and a new line starts a new conversation (what the agent prints next
    /// answers them, not the last relayed message).
    pub(crate) fn on_keys(&mut self, keys: &[u8], now: Instant) {
        self.injector.on_person_input(keys, now);
        if keys.contains(&b'\r') {
            self.chain.person_entered();
            self.new_turn();
        }
    }

    /// The agent's terminal has a new size.
    pub(crate) fn on_resize(&mut self, rows: u16, cols: u16) {
        self.parser.set_rows(usize::from(rows));
        self.parser.set_cols(usize::from(cols));
    }

    /// A person's activity in the terminal as the message typed last was entered (see
    /// [`Effect::NoteActivity`]; `None`: unknown).
    pub(crate) fn chain_entered(&mut self, at: Option<u64>) {
        self.chain.entered(at);
    }

    /// Bytes read (counted by [`Core::on_read`] first): fed to the parser, each directive in
    /// them relayed.
    pub(crate) fn on_output(&mut self, bytes: &[u8], now: Instant) {
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

    /// tmux: reads what a snapshot of the pane holds (see `Terminal::snapshot` in `terminal.rs`), with a
    /// new parser: the rows earlier wrappers read, with what they make the parser find
    /// dropped (it was relayed), then the texts typed since the checkpoint noted (their echo
    /// is no directive), then the rows no wrapper read, whose directives are relayed with the
    /// ids they would have had (the relay drops those sent already).
    pub(crate) fn resync(&mut self, snap: Snapshot, now: Instant) {
        let mut parser = Parser::new(self.cfg.profile.parse.clone());
        parser.set_rows(usize::from(snap.rows));
        parser.set_cols(usize::from(snap.cols));
        self.parser = parser;
        let Some(r) = &mut self.resume else {
            return;
        };
        r.reread();
        let typed = self.ledger.typed_since(r.offset());
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
            self.ledger.get(&m.id),
            self.cfg.delivery,
        )
    }

    /// Whether the terminal's history must be read before message `m` is admitted: a
    /// stopped wrapper typed it, and the terminal outlives its wrapper (`kept`).
    pub(crate) fn needs_history(&self, m: &Delivered, kept: bool) -> bool {
        kept && matches!(self.admission(m), Admission::Interrupted(_))
    }

    /// A message arrived for this agent: admitted against what this terminal was given
    /// before (see `decide/ledger.rs`), then queued to be typed. `kept`: the terminal
    /// outlives its wrapper; `history`: what it holds, read when [`Core::needs_history`]
    /// said so (`None`: not read, or it could not be).
    pub(crate) fn on_message(&mut self, m: Delivered, kept: bool, history: Option<&str>) {
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
    pub(crate) fn replayed_given(&mut self, m: Delivered) {
        self.record_replayed(&m);
        self.ack(&m, DeliveryState::Injected);
    }

    /// Records the outcome of a message a stopped wrapper typed, found given.
    fn record_replayed(&mut self, m: &Delivered) {
        self.record_outcome(&m.id, false);
    }

    /// Records how typing (or handing over) message `id` ended (see [`Core::record`]).
    fn record_outcome(&mut self, id: &str, verified: bool) {
        self.record(Record::Finished {
            id: id.to_owned(),
            verified,
        });
    }

    /// Records a step of a message in the replay ledger, before the effects it guards: in
    /// memory now, and in `injected.log` by the shell ([`Effect::Record`]).
    fn record(&mut self, record: Record) {
        self.ledger.remember(&record);
        self.out.push(Effect::Record(record));
    }

    /// Queues a notice from the relay (a refusal) for the agent, in the agent's form.
    pub(crate) fn push_notice(&mut self, notice: &str) {
        self.injector
            .push(self.form.apply(notice), Item::Notice, false);
    }

    /// The agent's own tool used the door (`door.rs`): it took part.
    pub(crate) fn door_used(&mut self) {
        self.exchanged = true;
    }

    /// Claude Code ran its Stop hook (`agent-relay hooks stop`, through the door): the turn
    /// it ends is over. Messages an earlier Stop hook handed over started that turn: verified.
    /// Unless this turn was itself one a Stop hook continued (`active`: Claude Code allows only
    /// a few in a row, and might not go on with more), the messages waiting to be typed are
    /// handed over instead: recorded in `injected.log` as typed and entered (never typed
    /// after), acknowledged injected, and returned for the hook's block decision. What no hook
    /// takes is typed once the agent is idle, as before.
    pub(crate) fn hook_stop(&mut self, active: bool) -> Vec<String> {
        for m in std::mem::take(&mut self.hooked) {
            tracing::debug!(id = %m.id, "the turn the Stop hook started with this message has ended: verified");
            self.record_outcome(&m.id, true);
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
    pub(crate) fn hook_prompt(&mut self) -> Vec<String> {
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
            for m in &messages {
                self.record(Record::Started {
                    id: m.id.clone(),
                    at: None,
                });
                self.record(Record::Entered { id: m.id.clone() });
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
    pub(crate) fn next_wake(&self) -> Option<Instant> {
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
    pub(crate) fn drive_output(&mut self, now: Instant, sees_keys: bool) {
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

    /// A terminal that does not pass the person's keys through (tmux): ends the reply chain
    /// if the agent's turn for the message typed last is over, as the parser's screen (fed by
    /// the pane's output: nothing is captured) shows it.
    fn end_turn_if_idle(&mut self) {
        let (profile, parser) = (&self.cfg.profile, &self.parser);
        self.chain.end_if_turn_over(
            self.quiet.settled(),
            self.injector.current().is_some(),
            profile.knows_prompt(),
            || profile.waiting_for_input(&parser.screen()),
        );
    }

    /// Types, presses Enter and checks whatever is due at `now` (after
    /// [`Core::drive_output`]).
    pub(crate) fn drive_typing(&mut self, now: Instant, sees_keys: bool) {
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
    pub(crate) fn tell_if_relayed(&mut self) {
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
    pub(crate) fn checkpoint_due(&self) -> bool {
        self.resume.as_ref().is_some_and(|r| {
            r.due(
                self.quiet.settled(),
                self.unacked == 0 && !self.outbox.holding() && self.parked.is_empty(),
            )
        })
    }

    /// tmux: the checkpoint moves to the cursor's `row` (read because it was due) at `at_ms`.
    pub(crate) fn checkpoint_at(&mut self, row: u64, at_ms: u64) {
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
    pub(crate) fn fleeting(&self) -> bool {
        self.cfg.profile.name() == "generic" && !self.shown && !self.exchanged
    }

    /// Sends what the screen still holds: the agent's side ended at `now`.
    pub(crate) fn finish(&mut self, now: Instant) {
        for d in self.parser.finish() {
            self.send_directive(d, now);
        }
        // Nothing more will come: what waits for the transcript goes by the screen now.
        for d in self.outbox.drain() {
            self.send_checked(d);
        }
    }
}
