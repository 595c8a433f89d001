//! The wrapper's shell: the one loop (`serve`) that hears the terminal, the relay, the door,
//! the receipts and the clock, hands each to the decision core ([`Core`]) with `now`, and
//! carries out the core's effects ([`Effect`]) in order. Every `.await` of the wrapper's
//! relaying is here; the core decides without one.

use std::time::{Duration, Instant};

use relay_client::{ClientError, Event, Outgoing};
use relay_protocol::{DeliveryState, TerminalReport, now_ms, text};
use tokio::sync::mpsc;

use crate::decide::effect::Effect;
use crate::decide::outbox::Gate;
use crate::decide::resume::Resume;
use crate::link::Relay;
use crate::state::{self, InboxEntry};
use crate::terminal::{TermEvent, Terminal};
use crate::{Core, Ended, WrapConfig, WrapError, door, now, refusal_notice, transcript};

/// How long the shell lets the last receipts arrive before saying goodbye.
const LAST_RECEIPTS: Duration = Duration::from_millis(50);

/// A receipt came back (or never will) for a relayed directive.
struct ReceiptDone;

/// The agent's own record of its replies for `cfg`'s profile, if it keeps one (see
/// `transcript.rs`), read from the wrapper's working directory.
pub(crate) fn transcript_gate(cfg: &WrapConfig) -> Option<Box<dyn Gate>> {
    let source = cfg.profile.transcript.as_ref()?;
    let t = std::env::current_dir()
        .ok()
        .and_then(|cwd| transcript::Transcript::new(source, &cwd));
    if t.is_none() {
        tracing::warn!(
            dir = %source.dir,
            "no working directory, or the profile's transcript_dir names an unset variable: the agent's own record of its replies cannot be read; directives go as the screen shows them"
        );
    }
    t.map(|t| Box::new(t) as Box<dyn Gate>)
}

/// The shell's side of one wrapper: the relay connection, and the channels the receipt
/// tasks answer on.
pub(crate) struct Shell<R> {
    link: R,
    /// Refusals of relayed directives, to be typed into the agent as notices.
    notices: mpsc::UnboundedReceiver<String>,
    notices_tx: mpsc::UnboundedSender<String>,
    receipts: mpsc::UnboundedReceiver<ReceiptDone>,
    receipts_tx: mpsc::UnboundedSender<ReceiptDone>,
}

impl<R: Relay> Shell<R> {
    /// The shell over relay connection `link`.
    pub(crate) fn new(link: R) -> Self {
        let (notices_tx, notices) = mpsc::unbounded_channel();
        let (receipts_tx, receipts) = mpsc::unbounded_channel();
        Self {
            link,
            notices,
            notices_tx,
            receipts,
            receipts_tx,
        }
    }

    /// The wrapper's one loop, over any [`Terminal`]: the agent's output is counted, shown
    /// and parsed (its directives relayed), messages from the relay and notices are queued
    /// for the injector, the door's requests answered, and after each event whatever is due
    /// is done and the terminal's state reported. Returns when the agent's side ends or a
    /// signal stops the wrapper.
    pub(crate) async fn serve(
        &mut self,
        core: &mut Core,
        term: &mut impl Terminal,
        door: &mut door::Door,
    ) -> Result<Ended, WrapError> {
        let mut relay_open = true;
        loop {
            let wake = core.next_wake();
            let checkpoint = core.resume.as_ref().map(Resume::offset);
            tokio::select! {
                ev = term.next_event(checkpoint) => match ev? {
                    TermEvent::Output(bytes) => {
                        let now = now();
                        // Counted before the person sees them: a test that sees them knows the
                        // wrapper has read them (see `Core::tell_if_relayed`).
                        core.output_read(bytes.len(), now);
                        term.show(&bytes);
                        core.on_output(&bytes, now);
                    }
                    TermEvent::Keys(k) => {
                        core.on_keys(&k, now());
                        term.write_keys(k).await?;
                    }
                    TermEvent::Resized { rows, cols } => {
                        tracing::debug!(rows, cols, "the terminal was resized");
                        term.resize(rows, cols)?;
                        core.on_resize(rows, cols);
                    }
                    TermEvent::Reread(snap) => core.resync(snap, now()),
                    TermEvent::Ended => return Ok(Ended::Exited),
                    TermEvent::Stopped(signal) => return Ok(Ended::Stopped(signal)),
                },
                Some(req) = door.recv() => self.door_request(core, term, req).await?,
                ev = self.link.next_event(), if relay_open => match ev {
                    Some(Event::Message(m)) => {
                        let kept = term.outlives_wrapper();
                        let history = if core.needs_history(&m, kept) {
                            match term.history().await {
                                Ok(h) => h,
                                Err(e) => {
                                    tracing::warn!(id = %m.id, error = %e, "cannot read the terminal's history; the message is taken as typed");
                                    None
                                }
                            }
                        } else {
                            None
                        };
                        core.on_message(m, kept, history.as_deref());
                    }
                    Some(other) => tracing::debug!(?other, "relay event"),
                    None => {
                        // The agent keeps running; it just is not relayed any more.
                        tracing::warn!("relay client stopped");
                        relay_open = false;
                    }
                },
                Some(notice) = self.notices.recv() => core.push_notice(&notice),
                Some(ReceiptDone) = self.receipts.recv() => core.on_receipt(),
                // Only when something is due (unread output, a queued message): an idle agent
                // costs the wrapper no wake-ups.
                () = sleep_until(wake) => {}
            }
            self.apply(core, term).await?;
            self.drive(core, term, now()).await?;
            self.report(core, term).await;
        }
    }

    /// Tells the relay how the terminal looks now, if that changed since it was last told.
    async fn report(&mut self, core: &mut Core, term: &impl Terminal) {
        if let Some(view) = core.terminal_report(now()) {
            let (state, why) = view.clone();
            let report = TerminalReport {
                backend: term.backend().to_owned(),
                state,
                why,
            };
            if self.link.report_terminal(report).await.is_ok() {
                core.reported(view);
            }
        }
    }

    /// Does whatever is due at `now`: the output's part, a checkpoint, then the typing.
    async fn drive(
        &mut self,
        core: &mut Core,
        term: &mut impl Terminal,
        now: Instant,
    ) -> Result<(), WrapError> {
        let sees_keys = term.sees_keys();
        core.drive_output(now, sees_keys);
        self.apply(core, term).await?;
        self.checkpoint(core, term).await;
        core.drive_typing(now, sees_keys);
        self.apply(core, term).await
    }

    /// tmux: takes a checkpoint at the cursor's row if one is due.
    pub(crate) async fn checkpoint(&mut self, core: &mut Core, term: &mut impl Terminal) {
        if !core.checkpoint_due() {
            return;
        }
        // The cursor's row: everything above it was read and relayed (the output is quiet).
        match term.cursor_row().await {
            Ok(Some(row)) => core.checkpoint_at(row, now_ms()),
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the pane's row; the checkpoint stays");
                return;
            }
        }
        self.apply_quietly(core, term).await;
    }

    /// Carries out the core's effects, and those they lead to, in order. A failure to type
    /// ends the wrapper where the terminal says so (PTY: the agent's terminal is gone); else
    /// it is logged and the rest is carried out.
    pub(crate) async fn apply(
        &mut self,
        core: &mut Core,
        term: &mut impl Terminal,
    ) -> Result<(), WrapError> {
        loop {
            let effects = core.take_effects();
            if effects.is_empty() {
                return Ok(());
            }
            for effect in effects {
                if let Err(e) = self.carry_out(effect, core, term).await {
                    if term.typing_errors_end() {
                        return Err(e);
                    }
                    tracing::warn!(error = %e, "typing into the pane failed");
                }
            }
        }
    }

    /// [`Shell::apply`] where a typing failure cannot come (no typing is due): logged.
    async fn apply_quietly(&mut self, core: &mut Core, term: &mut impl Terminal) {
        if let Err(e) = self.apply(core, term).await {
            tracing::warn!(error = %e, "typing into the agent failed");
        }
    }

    /// Carries out one effect; only typing fails.
    async fn carry_out(
        &mut self,
        effect: Effect,
        core: &mut Core,
        term: &mut impl Terminal,
    ) -> Result<(), WrapError> {
        match effect {
            Effect::Relay { msg, to } => self.relay(core, msg, to).await,
            Effect::Record(record) => {
                if let Err(e) = state::append_injected(&core.cfg.team_dir, &record) {
                    tracing::warn!(id = record.id(), error = %e, "cannot write to injected.log: {}", record.if_lost());
                }
            }
            Effect::Ack(m, state) => {
                if let Err(e) = self.link.ack(&m, Some(state)).await {
                    self.lost_ack(&m.id, Some(state), &e);
                }
            }
            Effect::AckShown(m, door) => {
                if let Err(e) = self.link.ack_shown(&m, door).await {
                    self.lost_ack(&m.id, Some(DeliveryState::Verified), &e);
                }
            }
            Effect::Fail(m, why) => {
                if let Err(e) = self.link.ack_failed(&m, &why).await {
                    tracing::warn!(
                        id = %m.id,
                        why,
                        error = %e,
                        "cannot report a message failed (the relay client stopped); it will be delivered \
                         again after a reconnect and reported from injected.log"
                    );
                }
            }
            Effect::AppendInbox(m) => {
                if let Some(dir) = &core.cfg.inbox {
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
            }
            Effect::Type(text) => term.type_text(&text).await?,
            Effect::Enter => term.enter().await?,
            Effect::EnterReplayed(m) => {
                if let Err(e) = term.enter().await {
                    // Acknowledged as injected all the same (see `Core::replayed_given`).
                    tracing::warn!(id = %m.id, error = %e, "cannot press that Enter; the text waits in the agent's input line");
                }
                core.replayed_given(m);
            }
            Effect::NoteActivity => {
                if !term.sees_keys() {
                    let at = match term.person_activity().await {
                        Ok(at) => at,
                        Err(e) => {
                            // Without it a person's turn is not seen: the chain goes on (the
                            // safe side).
                            tracing::warn!(error = %e, "cannot read the session's activity; a person's turn will not end this reply chain");
                            None
                        }
                    };
                    core.chain_entered(at);
                }
            }
            Effect::ReadActivity => {
                let at = match term.person_activity().await {
                    Ok(at) => at,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot read the session's activity; the reply chain goes on");
                        None
                    }
                };
                core.person_activity(at);
            }
            Effect::SaveCheckpoint(checkpoint) => {
                if let Err(e) = checkpoint.save(&core.cfg.team_dir) {
                    tracing::warn!(error = %e, "cannot save the relaying checkpoint");
                }
            }
            Effect::ReportState => self.report(core, term).await,
            Effect::Subscribe(pattern) => {
                let told = match self.link.subscribe(pattern.clone()).await {
                    Ok(()) => format!("relay: subscribed to {}", text::one_line(&pattern, 200)),
                    Err(e) => format!(
                        "relay: not subscribed to {}: {}",
                        text::one_line(&pattern, 200),
                        text::one_line(&e.to_string(), 300)
                    ),
                };
                tracing::info!(%pattern, %told, "a subscribe directive");
                core.push_notice(&told);
            }
            Effect::Team(verb) => team_verb(&core.cfg, *verb, self.notices_tx.clone()),
            Effect::Claim(verb) => {
                let told = match std::env::current_dir() {
                    Err(e) => format!("relay: not claimed: no working directory ({e})"),
                    Ok(cwd) => {
                        let root = relay_client::paths::project_root(&cwd);
                        match crate::claim::request(&verb, &root, &cwd) {
                            Err(why) => format!("relay: {why}"),
                            Ok(req) => match self.link.query(req).await {
                                Ok(result) => crate::claim::told(&result, relay_protocol::now_ms()),
                                Err(e) => format!(
                                    "relay: not claimed: {}",
                                    text::one_line(&e.to_string(), 300)
                                ),
                            },
                        }
                    }
                };
                tracing::info!(%told, "a claim directive");
                core.push_notice(&told);
            }
            Effect::ReportStart(word) => crate::report_start_line(word),
        }
        Ok(())
    }

    /// An acknowledgement that could not go: the client has stopped for good (its driver is
    /// gone), so the relay will deliver the message again to the next connection under this
    /// name, and `injected.log` keeps it from being typed twice then.
    fn lost_ack(&self, id: &str, state: Option<DeliveryState>, e: &ClientError) {
        tracing::warn!(
            id,
            ?state,
            error = %e,
            "cannot acknowledge a message (the relay client stopped); it will be delivered \
             again after a reconnect and acknowledged from injected.log"
        );
    }

    /// Relays a directive to `to`; its receipt is awaited off the loop, and a refusal goes
    /// back to the agent as a notice, so it learns (a misspelt name, a message too large...).
    async fn relay(&mut self, core: &mut Core, msg: Outgoing, to: String) {
        match self.link.send_nowait(msg).await {
            Ok((id, pending)) => {
                tracing::debug!(%id, %to, "relaying a directive");
                let notices = self.notices_tx.clone();
                let receipts = self.receipts_tx.clone();
                tokio::spawn(async move {
                    match pending.await {
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
            Err(e) => {
                tracing::warn!(%to, error = %e, "could not relay a message");
                // No receipt will come.
                core.on_receipt();
            }
        }
    }

    /// Answers what the agent's own tool asked for through the door (`door.rs`): a send on
    /// this agent's connection (the receipt goes back to the tool), or the core's answer to a
    /// read or a hook, once the acknowledgements it leads to are out.
    async fn door_request(
        &mut self,
        core: &mut Core,
        term: &mut impl Terminal,
        req: door::Request,
    ) -> Result<(), WrapError> {
        core.door_used();
        match req {
            door::Request::Send(door::SendRequest { msg, reply }) => {
                match self.link.send_nowait(msg).await {
                    Ok((id, pending)) => {
                        tracing::debug!(%id, "sending for the agent's own tool");
                        tokio::spawn(async move {
                            if reply.send(pending.await).is_err() {
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
            door::Request::Inbox { limit, reply } => {
                let page = core.take_for_tool(limit);
                self.apply(core, term).await?;
                if let Err((taken, _)) = reply.send(page) {
                    tracing::warn!(
                        n = taken.len(),
                        "relay_inbox left before its answer: the messages it was handed are recorded shown"
                    );
                }
            }
            door::Request::Read { ids, reply } => {
                let n = core.shown_by_tool(&ids);
                self.apply(core, term).await?;
                if reply.send(n).is_err() {
                    tracing::debug!("the tool left before its answer");
                }
            }
            door::Request::Stop { active, reply } => {
                let texts = core.hook_stop(active);
                self.apply(core, term).await?;
                let n = texts.len();
                if reply.send(texts).is_err() {
                    tracing::warn!(
                        n,
                        "the Stop hook left before its answer: the messages it was handed are reported injected but may not have reached the model"
                    );
                }
            }
            door::Request::Subscribe { pattern, reply } => {
                let result = self.link.subscribe(pattern.clone()).await;
                tracing::info!(%pattern, ok = result.is_ok(), "a subscription through the door");
                if reply.send(result).is_err() {
                    tracing::debug!("the tool left before its answer");
                }
            }
            door::Request::Query { req, reply } => {
                // The answer is awaited off the loop: the relay may be slow or reconnecting.
                match self.link.query_nowait(req).await {
                    Ok(pending) => {
                        tokio::spawn(async move {
                            if reply.send(pending.await).is_err() {
                                tracing::debug!("the tool left before its answer");
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
            door::Request::Prompt { reply } => {
                let texts = core.hook_prompt();
                self.apply(core, term).await?;
                let n = texts.len();
                if reply.send(texts).is_err() {
                    tracing::warn!(
                        n,
                        "the UserPromptSubmit hook left before its answer: the messages it was handed are reported injected but may not have reached the model"
                    );
                }
            }
        }
        Ok(())
    }

    /// The agent's side ended: sends what the screen still holds, lets the last receipts
    /// arrive and says goodbye. Whether the agent was a command that exited at once (see
    /// [`Core::fleeting`]), judged after those last directives.
    pub(crate) async fn end(mut self, core: &mut Core, term: &mut impl Terminal) -> bool {
        core.finish(now());
        self.apply_quietly(core, term).await;
        let fleeting = core.fleeting();
        tokio::time::sleep(LAST_RECEIPTS).await;
        self.close().await;
        fleeting
    }

    /// Says goodbye to the relay.
    pub(crate) async fn close(self) {
        self.link.close().await;
    }
}

/// Sleeps until `at`, or forever.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}

/// Runs `agent-relay spawn` or `release` for a team directive, as the agent (its name and door
/// key in the command's environment: it asks through this wrapper's door, whose requests the
/// loop answers meanwhile), on a thread of its own (a spawn waits for the worker to start);
/// the agent is told how it went, as a notice. The task goes on the command's stdin, never in
/// its argv.
fn team_verb(
    cfg: &crate::WrapConfig,
    verb: relay_parse::TeamVerb,
    notices: mpsc::UnboundedSender<String>,
) {
    use relay_parse::TeamVerb;
    let (args, task, what): (Vec<String>, Option<String>, String) = match verb {
        TeamVerb::Spawn {
            command,
            task,
            name,
            worktree,
            notify_idle,
        } => {
            let mut a: Vec<String> = vec!["spawn".into()];
            if let Some(n) = name {
                a.extend(["-n".into(), n]);
            }
            if worktree {
                a.push("--worktree".into());
            }
            if notify_idle {
                a.extend(["--notify".into(), "idle".into()]);
            }
            if task.is_some() {
                a.extend(["--task-file".into(), "-".into()]);
            }
            a.push("--".into());
            a.extend(command);
            (a, task, "spawned".into())
        }
        TeamVerb::Release { name, now } => {
            let mut a: Vec<String> = vec!["release".into(), name];
            if now {
                a.push("--now".into());
            }
            (a, None, "released".into())
        }
    };
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            let told = format!("relay: not {what}: cannot find agent-relay ({e})");
            if notices.send(told).is_err() {
                tracing::debug!("the wrapper is ending");
            }
            return;
        }
    };
    let mut cmd = std::process::Command::new(exe);
    cmd.args(&args)
        .env("AGENT_RELAY_NAME", &cfg.name)
        .env("AGENT_RELAY_SOCKET", &cfg.socket)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    if let Some(key) = &cfg.door_key {
        cmd.env(crate::DOOR_KEY_ENV, key);
    }
    // The data directory is the team directory's grandparent (`<data>/team/<name>`).
    if let Some(data) = cfg.team_dir.parent().and_then(std::path::Path::parent) {
        cmd.env("AGENT_RELAY_DATA_DIR", data);
    }
    tracing::info!(?args, "a team directive");
    std::thread::spawn(move || {
        let told = match run_team_command(cmd, task.as_deref()) {
            // `spawn` prints the worker's name; `release` says what it did.
            Ok(out) if what == "spawned" => {
                format!("relay: spawned {}", text::one_line(out.trim(), 300))
            }
            Ok(out) => format!("relay: {}", text::one_line(out.trim(), 300)),
            Err(why) => format!("relay: not {what}: {}", text::one_line(&why, 400)),
        };
        tracing::info!(%told, "a team directive done");
        if notices.send(told).is_err() {
            tracing::debug!("the wrapper ended before the team directive did");
        }
    });
}

/// Runs `cmd` with `stdin` on its standard input: its stdout, or the last thing it said on
/// stderr.
fn run_team_command(mut cmd: std::process::Command, stdin: Option<&str>) -> Result<String, String> {
    use std::io::Write;
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run agent-relay: {e}"))?;
    if let Some(mut pipe) = child.stdin.take()
        && let Some(t) = stdin
    {
        pipe.write_all(t.as_bytes())
            .map_err(|e| format!("cannot hand over the task: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("agent-relay did not finish: {e}"))?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    Err(err
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("agent-relay: "))
        .unwrap_or(err.trim())
        .to_owned())
}
