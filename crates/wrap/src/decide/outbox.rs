//! The outbox of directives read off the screen, and the gate the agent's own record of its
//! replies keeps in front of it (Claude Code's transcript, Codex's rollout, Gemini's chat
//! recording; see `transcript.rs`).
//!
//! Without a record, a directive goes as the screen shows it. With one, it waits until the
//! record has its reply, at most the settle time (a turn's end is seen on the screen before
//! the CLI has written the reply there; Codex and Gemini write it when the reply ends, so theirs
//! wait until the output was quiet the settle time, at most [`HELD_MAX`] more), and goes in the
//! order the screen showed them: with the reply's own text when the record has it, not at all
//! when the reply only quotes the line (a code block drawn like prose) or it went from the
//! record already. Claude Code's record also gives what a reply taller than the screen said
//! above the last screenful, which the screen never showed: sent from there once the output
//! settles, and looked at once more [`RECHECK`] later.
//!
//! Pure: the gate is a trait (the real record reads files), and every method takes `now`.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use relay_parse::Directive;
use relay_parse::transcript::Origin;
use relay_protocol::text;

/// How long after output went quiet the record is looked at once more (Claude Code may write
/// a reply there after drawing it).
pub(crate) const RECHECK: Duration = Duration::from_secs(1);
/// How often the record is read while a directive waits for its reply there.
pub(crate) const HELD_RECHECK: Duration = Duration::from_millis(5);
/// Longest a directive of Codex's or Gemini's waits for their record of the reply while the
/// output goes on.
pub(crate) const HELD_MAX: Duration = Duration::from_secs(10);

/// The notice an agent gets once when its Claude Code transcript cannot be found although its
/// replies hold directives.
pub(crate) const MISSING_NOTICE: &str = "relay: this agent's Claude Code transcript was not found, so a @relay: line at the top of a reply taller than the screen is lost if it scrolls away before it is drawn. Keep @relay: lines short and near the end of a reply";

/// The agent's own record of its replies, as the outbox asks it.
pub(crate) trait Gate: std::marker::Send + Sync {
    /// Whether the replies recorded so far have `d`.
    fn knows(&mut self, d: &Directive) -> bool;
    /// Where `d` comes from in the replies recorded.
    fn check(&mut self, d: &Directive) -> Origin;
    /// Whether directives the record has and the screen never showed are sent from it.
    fn sends_unseen(&self) -> bool;
    /// Whether the CLI writes a reply to its record only when the reply ends (Codex, Gemini):
    /// a directive then waits for the output to go quiet.
    fn writes_at_reply_end(&self) -> bool;
    /// Looks for the CLI's own record again if it is not found yet (Codex: the rollout it
    /// holds open).
    fn look_for_own(&mut self);
    /// The directives the record has that the screen never showed (each once).
    fn take_unseen(&mut self) -> Vec<Directive>;
    /// How many record files were found.
    fn files(&self) -> usize;
    /// The CLI's name, for log lines.
    fn cli(&self) -> &'static str;
    /// Where the records are looked for, for a log line.
    fn folder(&self) -> PathBuf;
    /// The agent's process: whose records are read (Claude Code's sessions are found from
    /// it).
    fn set_agent_pid(&mut self, pid: u32);
    /// A prompt was submitted: the record's re-print guard starts a new turn (a directive
    /// said again from now on is meant again).
    fn new_turn(&mut self);
}

/// Who a directive goes to, as the relay names it.
pub(crate) fn recipient(d: &Directive) -> String {
    d.to.as_str().to_owned()
}

/// Directives on their way out, behind the agent's record of its replies if it keeps one.
pub(crate) struct Outbox {
    gate: Option<Box<dyn Gate>>,
    /// The output's settle time: the longest a directive waits for the record.
    settle: Duration,
    /// Directives read off the screen before the record had their reply, in order, each with
    /// the time it goes all the same.
    held: VecDeque<(Directive, Instant)>,
    /// When to look at the record again for the held directives.
    held_due: Option<Instant>,
    /// When to look at the record once more after the output went quiet.
    recheck_due: Option<Instant>,
    /// Directives read off the screen while a record is kept: a reply was given.
    screen_directives: u64,
    /// The log was told that no record is to be found.
    missing_told: bool,
}

impl Outbox {
    /// An outbox behind `gate` (none: directives go as the screen shows them).
    pub(crate) fn new(gate: Option<Box<dyn Gate>>, settle: Duration) -> Self {
        Self {
            gate,
            settle,
            held: VecDeque::new(),
            held_due: None,
            recheck_due: None,
            screen_directives: 0,
            missing_told: false,
        }
    }

    /// A prompt was submitted (see [`Gate::new_turn`]).
    pub(crate) fn new_turn(&mut self) {
        if let Some(g) = &mut self.gate {
            g.new_turn();
        }
    }

    /// The record, if one is kept.
    pub(crate) fn gate_mut(&mut self) -> Option<&mut (dyn Gate + 'static)> {
        self.gate.as_deref_mut()
    }

    /// A directive read off the screen at `now`: returned when it goes now (to be checked,
    /// see [`Outbox::check`]), held when the record does not have its reply yet (or others
    /// wait before it).
    pub(crate) fn found(&mut self, d: Directive, now: Instant) -> Option<Directive> {
        if let Some(g) = &mut self.gate
            && (!self.held.is_empty() || !g.knows(&d))
        {
            self.held.push_back((d, now + self.settle));
            self.held_due.get_or_insert(now + HELD_RECHECK);
            return None;
        }
        Some(d)
    }

    /// Whether the held directives are due a look at `now` (see [`Outbox::next_released`]).
    pub(crate) fn release_due(&self, now: Instant) -> bool {
        self.held_due.is_some_and(|due| now >= due)
    }

    /// The next held directive that goes at `now` (the record has its reply, or its wait is
    /// over), in the order the screen showed them; `last_output` is when the agent printed
    /// last. Each is checked and sent before the next is asked for (sending reads the record
    /// on); then [`Outbox::released`].
    pub(crate) fn next_released(
        &mut self,
        now: Instant,
        last_output: Instant,
    ) -> Option<Directive> {
        // Codex and Gemini write a reply to their record when it ends, and Codex draws a long
        // reply for a while after a directive at its top showed: their directives wait until
        // the output has been quiet the settle time (at most HELD_MAX).
        let at_reply_end = self.gate.as_ref().is_some_and(|g| g.writes_at_reply_end());
        let quiet_at = last_output + self.settle;
        let (d, until) = self.held.front()?;
        let known = self.gate.as_mut().is_some_and(|g| g.knows(d));
        let until = if at_reply_end {
            (*until).max(quiet_at.min(*until + HELD_MAX))
        } else {
            *until
        };
        if !known && now < until {
            return None;
        }
        if !known {
            let cli = self.gate.as_ref().map_or("", |g| g.cli());
            tracing::debug!(
                cli,
                "the agent's transcript does not have a directive's reply yet; it goes by the screen"
            );
        }
        self.held.pop_front().map(|(d, _)| d)
    }

    /// The held directives due at `now` were released: the rest are looked at again soon.
    pub(crate) fn released(&mut self, now: Instant) {
        self.held_due = (!self.held.is_empty()).then(|| now + HELD_RECHECK);
    }

    /// Every held directive, in order: nothing more will come, they go by the screen.
    pub(crate) fn drain(&mut self) -> Vec<Directive> {
        self.held_due = None;
        self.held.drain(..).map(|(d, _)| d).collect()
    }

    /// A directive from the screen about to go, judged by the record: `None` when it is not
    /// to be sent (the reply only quotes it, or it went from the record already), else what
    /// goes (the reply's own text when the record has it).
    pub(crate) fn check(&mut self, d: Directive) -> Option<Directive> {
        let Some(g) = &mut self.gate else {
            return Some(d);
        };
        self.screen_directives += 1;
        let to = recipient(&d);
        let cli = g.cli();
        match g.check(&d) {
            Origin::Quoted => {
                // Not a message: the agent showed the syntax, in a code block or escaped.
                tracing::info!(%to, cli, body = %text::one_line(&d.body, 200), "not sent: the reply only quotes this line, in a code block or escaped (the agent's transcript)");
                None
            }
            Origin::Sent => {
                // The transcript was read first and it went from there, or (Codex, Gemini)
                // it went with the reply's text and the screen shows it again.
                tracing::debug!(%to, cli, body = %text::one_line(&d.body, 200), "already sent from or with the agent's transcript; the screen shows it now");
                None
            }
            Origin::Said(exact) => {
                // The screen shows what the CLI drew of the reply's Markdown (a code block
                // without fences, lines re-wrapped or re-indented, marks dropped; Codex:
                // only a directive's first line): the reply's own text goes.
                tracing::debug!(%to, cli, same = (exact.body == d.body), "sent with the reply's own text from the agent's transcript");
                Some(exact)
            }
            Origin::Unknown => {
                tracing::debug!(%to, cli, body = %text::one_line(&d.body, 200), "directive not in the agent's transcript: sent as the screen shows it");
                Some(d)
            }
        }
    }

    /// What the replies said and the screen never showed (Claude Code: the start of a reply
    /// taller than the screen), to be sent; and, once, a notice for the agent when its
    /// replies hold directives and no record of them is found.
    pub(crate) fn unseen(&mut self) -> (Vec<Directive>, Option<&'static str>) {
        let Some(g) = &mut self.gate else {
            return (Vec::new(), None);
        };
        // Codex and Gemini draw every line of a reply: their records only give the screen's
        // directives their text, so each is sent once, by the screen. Codex whose own rollout
        // is found is read from it too: on its alternate screen a tall reply is not drawn whole.
        g.look_for_own();
        if !g.sends_unseen() {
            return (Vec::new(), None);
        }
        let unseen = g.take_unseen();
        let mut notice = None;
        if g.files() == 0 && self.screen_directives > 0 && !self.missing_told {
            // Replies with directives, but no transcript where it should be: a directive above
            // the last screenful of a tall reply is lost, and nothing can tell.
            self.missing_told = true;
            tracing::warn!(folder = %g.folder().display(), "no Claude Code transcript of this agent's found: a directive in a reply taller than the screen is lost if its start is never drawn, and a @relay: line in a ```text code block is sent");
            notice = Some(MISSING_NOTICE);
        }
        let cli = g.cli();
        for d in &unseen {
            let (to, body) = (recipient(d), text::one_line(&d.body, 200));
            if cli == "Codex" {
                tracing::info!(%to, %body, "sent from Codex's rollout: the screen did not show it (a reply taller than the alternate screen)");
            } else {
                tracing::info!(%to, %body, "sent from Claude Code's transcript: the screen did not show it (a reply taller than the screen)");
            }
        }
        (unseen, notice)
    }

    /// The output settled at `now`: the record is looked at once more [`RECHECK`] later.
    pub(crate) fn settled(&mut self, now: Instant) {
        self.recheck_due = self.gate.is_some().then(|| now + RECHECK);
    }

    /// Whether the record's second look is due at `now` (then it is no longer).
    pub(crate) fn recheck(&mut self, now: Instant) -> bool {
        if self.recheck_due.is_some_and(|due| now >= due) {
            self.recheck_due = None;
            return true;
        }
        false
    }

    /// Whether everything found was sent or dropped and the record had its last look.
    pub(crate) fn empty(&self) -> bool {
        self.held.is_empty() && self.recheck_due.is_none()
    }

    /// Whether directives wait for the record.
    pub(crate) fn holding(&self) -> bool {
        !self.held.is_empty()
    }

    /// When the outbox must be looked at again, if nothing happens before.
    pub(crate) fn due(&self) -> Option<Instant> {
        [self.recheck_due, self.held_due]
            .into_iter()
            .flatten()
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use relay_parse::Target;

    /// A record that has the replies a test puts in it.
    #[derive(Default)]
    struct Record {
        /// Bodies the replies said.
        said: Vec<String>,
        /// Bodies the replies only quote.
        quoted: Vec<String>,
        /// Directives the screen never showed.
        unseen: Vec<Directive>,
        /// Codex or Gemini (writes the reply when it ends) rather than Claude Code.
        at_reply_end: bool,
        files: usize,
    }

    impl Gate for Record {
        fn knows(&mut self, d: &Directive) -> bool {
            self.said.contains(&d.body) || self.quoted.contains(&d.body)
        }
        fn check(&mut self, d: &Directive) -> Origin {
            if self.quoted.contains(&d.body) {
                Origin::Quoted
            } else if self.said.contains(&d.body) {
                let mut exact = d.clone();
                exact.body = format!("{} (exact)", d.body);
                Origin::Said(exact)
            } else {
                Origin::Unknown
            }
        }
        fn sends_unseen(&self) -> bool {
            !self.at_reply_end
        }
        fn writes_at_reply_end(&self) -> bool {
            self.at_reply_end
        }
        fn look_for_own(&mut self) {}
        fn take_unseen(&mut self) -> Vec<Directive> {
            std::mem::take(&mut self.unseen)
        }
        fn files(&self) -> usize {
            self.files
        }
        fn cli(&self) -> &'static str {
            "test"
        }
        fn folder(&self) -> PathBuf {
            PathBuf::from("/nowhere")
        }
        fn set_agent_pid(&mut self, _pid: u32) {}
        fn new_turn(&mut self) {}
    }

    /// What [`Outbox`] releases at `now`, as the shell takes it.
    fn release(o: &mut Outbox, now: Instant, last_output: Instant) -> Vec<Directive> {
        let mut out = Vec::new();
        if o.release_due(now) {
            while let Some(d) = o.next_released(now, last_output) {
                out.push(d);
            }
            o.released(now);
        }
        out
    }

    fn directive(body: &str) -> Directive {
        Directive::message(Target::Agent("Bob".to_owned()), body)
    }

    const SETTLE: Duration = Duration::from_millis(500);

    fn outbox(record: Record) -> Outbox {
        Outbox::new(Some(Box::new(record)), SETTLE)
    }

    fn bodies(ds: &[Directive]) -> Vec<&str> {
        ds.iter().map(|d| d.body.as_str()).collect()
    }

    #[test]
    fn without_a_record_a_directive_goes_as_the_screen_shows_it() {
        let mut o = Outbox::new(None, SETTLE);
        let t0 = relay_protocol::now_instant();
        let d = o.found(directive("hi"), t0).expect("goes now");
        assert_eq!(o.check(d).map(|d| d.body), Some("hi".to_owned()));
        assert!(o.empty());
        assert_eq!(o.due(), None);
    }

    #[test]
    fn a_directive_the_record_has_goes_at_once_with_the_replys_own_text() {
        let mut o = outbox(Record {
            said: vec!["hi".into()],
            ..Record::default()
        });
        let d = o
            .found(directive("hi"), relay_protocol::now_instant())
            .expect("goes now");
        assert_eq!(o.check(d).map(|d| d.body), Some("hi (exact)".to_owned()));
    }

    #[test]
    fn a_line_the_reply_only_quotes_is_not_sent() {
        let mut o = outbox(Record {
            quoted: vec!["syntax".into()],
            ..Record::default()
        });
        let d = o
            .found(directive("syntax"), relay_protocol::now_instant())
            .expect("known");
        assert_eq!(o.check(d), None);
    }

    #[test]
    fn a_directive_waits_for_the_record_at_most_the_settle_time_and_keeps_its_order() {
        let mut o = outbox(Record {
            said: vec!["second".into()],
            ..Record::default()
        });
        let t0 = relay_protocol::now_instant();
        assert!(o.found(directive("first"), t0).is_none(), "held");
        // Known, but one waits before it: held too, the order kept.
        assert!(o.found(directive("second"), t0).is_none());
        assert_eq!(o.due(), Some(t0 + HELD_RECHECK));
        assert!(release(&mut o, t0 + HELD_RECHECK, t0).is_empty());
        let out = release(&mut o, t0 + SETTLE, t0);
        assert_eq!(bodies(&out), ["first", "second"]);
        assert!(!o.holding());
        assert_eq!(o.due(), None);
    }

    #[test]
    fn codex_and_gemini_directives_wait_for_the_output_to_go_quiet() {
        let mut o = outbox(Record {
            at_reply_end: true,
            ..Record::default()
        });
        let t0 = relay_protocol::now_instant();
        assert!(o.found(directive("hi"), t0).is_none());
        // The output goes on: past the settle time, still held until quiet the settle time.
        let last_output = t0 + 2 * SETTLE;
        assert!(release(&mut o, t0 + SETTLE, last_output).is_empty());
        assert_eq!(
            bodies(&release(&mut o, last_output + SETTLE, last_output)),
            ["hi"]
        );
        // ... but never longer than HELD_MAX past its own wait.
        assert!(o.found(directive("again"), t0).is_none());
        let never_quiet = t0 + HELD_MAX * 2;
        assert_eq!(
            bodies(&release(&mut o, t0 + SETTLE + HELD_MAX, never_quiet)),
            ["again"]
        );
    }

    #[test]
    fn what_a_tall_reply_never_drew_is_sent_from_the_record() {
        let mut o = outbox(Record {
            unseen: vec![directive("above the screen")],
            files: 1,
            ..Record::default()
        });
        let (unseen, notice) = o.unseen();
        assert_eq!(bodies(&unseen), ["above the screen"]);
        assert_eq!(notice, None);
        assert!(o.unseen().0.is_empty(), "each once");
    }

    #[test]
    fn a_missing_record_is_told_to_the_agent_once_after_a_reply_with_a_directive() {
        let mut o = outbox(Record::default());
        assert_eq!(o.unseen().1, None, "no directive yet");
        let d = o.found(directive("x"), relay_protocol::now_instant());
        assert!(d.is_none());
        for d in o.drain() {
            o.check(d);
        }
        assert_eq!(o.unseen().1, Some(MISSING_NOTICE));
        assert_eq!(o.unseen().1, None);
    }

    #[test]
    fn the_record_is_looked_at_once_more_a_moment_after_the_output_settled() {
        let mut o = outbox(Record::default());
        let t0 = relay_protocol::now_instant();
        o.settled(t0);
        assert!(!o.empty());
        assert_eq!(o.due(), Some(t0 + RECHECK));
        assert!(!o.recheck(t0));
        assert!(o.recheck(t0 + RECHECK));
        assert!(!o.recheck(t0 + RECHECK));
        assert!(o.empty());
    }
}
