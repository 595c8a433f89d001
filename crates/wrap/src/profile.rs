//! Per-CLI readiness rules, as data: when may a message be typed into an agent's terminal,
//! and did Enter submit it?
//!
//! Each CLI has a TOML file in `crates/wrap/profiles/`, embedded in the binary. A person can
//! override any field with a file of the same name in `$AGENT_RELAY_PROFILE_DIR` (default
//! `~/.config/agent-relay/profiles/`); fields the override leaves out keep the defaults. The
//! rules are pure functions of a [`ScreenText`], tested against screens recorded from the
//! real CLIs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use regex_lite::Regex;
use relay_parse::ScreenText;
use serde::Deserialize;

/// Rows of a profile's `starting` patterns, one after another, that make a start-up screen.
pub const STARTING_ROWS: usize = 3;

/// The embedded defaults, by profile name.
const DEFAULTS: [(&str, &str); 5] = [
    ("claude", include_str!("../profiles/claude.toml")),
    ("codex", include_str!("../profiles/codex.toml")),
    ("gemini", include_str!("../profiles/gemini.toml")),
    ("shell", include_str!("../profiles/shell.toml")),
    ("generic", include_str!("../profiles/generic.toml")),
];

/// A profile that cannot be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProfileError {
    /// No such profile.
    #[error("unknown profile {name:?}; known: claude, codex, gemini, shell, generic")]
    Unknown {
        /// The name asked for.
        name: String,
    },
    /// A profile file is not valid.
    #[error("{path}: {message}")]
    Invalid {
        /// The file (or `<embedded NAME>`).
        path: String,
        /// What is wrong, with the line when known.
        message: String,
    },
}

/// The fields of a profile file; every one optional so that an override can name just one.
/// Public so that the project configuration file's `[profiles.NAME]` tables (read by the
/// CLI) take exactly these fields, under these names.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Overrides {
    parse: Option<String>,
    settle_ms: Option<u64>,
    turn_settle_ms: Option<u64>,
    quiet_ms: Option<u64>,
    enter_delay_ms: Option<u64>,
    enter_on_echo: Option<bool>,
    verify_after_ms: Option<u64>,
    enter_retries: Option<u32>,
    busy: Option<Vec<String>>,
    busy_patterns: Option<Vec<String>>,
    dialogs: Option<Vec<String>>,
    prompt: Option<String>,
    placeholders: Option<Vec<String>>,
    starting: Option<Vec<String>>,
    tested_versions: Option<Vec<String>>,
    args: Option<Vec<String>>,
    multiline: Option<bool>,
    transcript: Option<String>,
    transcript_dir: Option<String>,
    shell_line: Option<bool>,
}

/// The profile files' own name for their fields, kept for the code that reads them.
type File = Overrides;

impl Overrides {
    /// Replaces each field `o` sets with its value.
    pub fn overlay(&mut self, o: Overrides) {
        macro_rules! take {
            ($($f:ident),*) => { $( if o.$f.is_some() { self.$f = o.$f; } )* };
        }
        take!(
            parse,
            settle_ms,
            turn_settle_ms,
            quiet_ms,
            enter_delay_ms,
            enter_on_echo,
            verify_after_ms,
            enter_retries,
            busy,
            busy_patterns,
            dialogs,
            prompt,
            placeholders,
            starting,
            tested_versions,
            args,
            multiline,
            transcript,
            transcript_dir,
            shell_line
        );
    }
}

/// How a CLI's own record of its replies is read (the code differs per CLI; see
/// `transcript.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TranscriptFormat {
    /// Claude Code: `<dir>/projects/<cwd slug>/<session>.jsonl`, the sessions found from
    /// `<dir>/sessions/<pid>.json`.
    Claude,
    /// Codex CLI: `<dir>/YYYY/MM/DD/rollout-*.jsonl`, those whose header names the working
    /// directory.
    Codex,
    /// Gemini CLI: `<dir>/tmp/<project>/chats/*.jsonl`, the project named for the working
    /// directory in `<dir>/projects.json` (or the SHA-256 of its path).
    Gemini,
}

impl TranscriptFormat {
    /// The names a profile file gives (`transcript = "..."`).
    pub const NAMES: [&'static str; 3] = ["claude", "codex", "gemini"];

    fn by_name(name: &str) -> Option<Self> {
        match name {
            "claude" => Some(Self::Claude),
            "codex" => Some(Self::Codex),
            "gemini" => Some(Self::Gemini),
            _ => None,
        }
    }
}

/// Where and how the wrapper reads a CLI's record of its replies, to send a directive with
/// the reply's own text (profile fields `transcript` and `transcript_dir`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TranscriptSource {
    /// How the files are found and read.
    pub format: TranscriptFormat,
    /// Their folder, as the profile gives it: `${VAR:-default}` and a leading `~` are
    /// expanded when the wrapper starts (see `transcript::expand`).
    pub dir: String,
}

/// Why an agent is not ready for a message now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotReady {
    /// A busy marker is showing (the text that matched).
    Busy(String),
    /// A dialog or menu is open (the text that matched).
    Dialog(String),
    /// The profile's input line is not on screen.
    NoPrompt,
    /// Someone has typed into the input line.
    InputNotEmpty(String),
}

/// Readiness and submission rules for one CLI.
#[derive(Debug, Clone)]
pub struct Profile {
    name: String,
    /// How the parser reads this CLI's screen.
    pub parse: relay_parse::Profile,
    /// Output quiet this long lets the parser treat the screen as settled.
    pub settle: Duration,
    /// Output quiet this long, with the screen showing the agent's turn over (its input line
    /// back and empty, no busy marker, no dialog: [`Profile::waiting_for_input`]), settles
    /// the parser without waiting for [`Profile::settle`]: a reply's directive is sent as soon
    /// as the turn ends. `None`: only the settle time does (profiles without a prompt rule,
    /// where quiet output proves nothing).
    pub turn_settle: Option<Duration>,
    /// Output quiet this long before a message is typed.
    pub quiet: Duration,
    /// Pause between typed text and its Enter; with [`Profile::enter_on_echo`], the longest
    /// wait for the text to show before Enter is pressed all the same.
    pub enter_delay: Duration,
    /// Enter is pressed as soon as the typed text shows in the input line
    /// ([`Profile::echoed`]): the agent has taken the paste, so Enter is a key of its own.
    pub enter_on_echo: bool,
    /// How long after Enter to check that it submitted.
    pub verify_after: Duration,
    /// Extra Enters allowed when the text is still in the input box.
    pub enter_retries: u32,
    busy: Vec<String>,
    busy_patterns: Vec<Regex>,
    dialogs: Vec<String>,
    prompt: Option<Regex>,
    placeholders: Vec<Regex>,
    starting: Vec<Regex>,
    /// The CLI versions these rules were checked against (`agent-relay doctor` compares).
    pub tested_versions: Vec<String>,
    /// Arguments the wrapper adds to the CLI's command line, each unless it is there already
    /// (see [`Profile::command`]).
    args: Vec<String>,
    /// The CLI takes a bracketed paste of several lines as one prompt (measured per CLI): a
    /// message's body is typed with its lines. Otherwise it is flattened to one line.
    pub multiline: bool,
    /// The CLI's record of its replies, read for a directive's exact text; `None`: the
    /// screen alone (`transcript = "none"`, or a profile without one).
    pub transcript: Option<TranscriptSource>,
    /// The input line is a shell's: whatever prompt, the row under the cursor after it holds
    /// a person's text or not (`shell_line.rs`; issue 23.16).
    shell_line: bool,
}

fn ms(v: Option<u64>, default: u64) -> Duration {
    Duration::from_millis(v.unwrap_or(default))
}

fn parse_file(text: &str, path: &str) -> Result<File, ProfileError> {
    toml::from_str(text).map_err(|e| ProfileError::Invalid {
        path: path.to_owned(),
        // toml's message names the line and column.
        message: e.to_string().trim_end().to_owned(),
    })
}

fn regex(p: &str, path: &str) -> Result<Regex, ProfileError> {
    Regex::new(p).map_err(|e| ProfileError::Invalid {
        path: path.to_owned(),
        message: format!("pattern {p:?}: {e}"),
    })
}

/// Where a person's profile overrides live: `$AGENT_RELAY_PROFILE_DIR`, else
/// `$XDG_CONFIG_HOME/agent-relay/profiles`, else `~/.config/agent-relay/profiles`.
pub fn override_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("AGENT_RELAY_PROFILE_DIR") {
        return Some(PathBuf::from(d));
    }
    let config = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(config.join("agent-relay").join("profiles"))
}

impl Profile {
    /// The names with embedded defaults.
    pub const NAMES: [&'static str; 5] = ["claude", "codex", "gemini", "shell", "generic"];

    /// The profile called `name`: the embedded defaults, overlaid with `<dir>/<name>.toml`
    /// when `overrides` names a directory holding one.
    ///
    /// # Errors
    /// [`ProfileError`] for an unknown name or an invalid file (the message names the file
    /// and line).
    pub fn load(name: &str, overrides: Option<&Path>) -> Result<Self, ProfileError> {
        Self::load_with(name, None, overrides)
    }

    /// The profile called `name`: the embedded defaults, overlaid first with `project` (the
    /// project configuration file's `[profiles.NAME]` table, with where it came from), then
    /// with `<dir>/<name>.toml` when `overrides` names a directory holding one: a person's own
    /// tuning on this machine wins over the project's shared file.
    ///
    /// # Errors
    /// [`ProfileError`] for an unknown name or an invalid file or pattern (the message names
    /// the file and line).
    pub fn load_with(
        name: &str,
        project: Option<(&Overrides, &str)>,
        overrides: Option<&Path>,
    ) -> Result<Self, ProfileError> {
        let (_, text) =
            DEFAULTS
                .iter()
                .find(|(n, _)| *n == name)
                .ok_or_else(|| ProfileError::Unknown {
                    name: name.to_owned(),
                })?;
        let mut file = parse_file(text, &format!("<embedded {name}.toml>"))?;
        let mut source = format!("<embedded {name}.toml>");
        if let Some((o, from)) = project {
            file.overlay(o.clone());
            source = from.to_owned();
        }
        if let Some(dir) = overrides {
            let path = dir.join(format!("{name}.toml"));
            match std::fs::read_to_string(&path) {
                Ok(text) => {
                    source = path.display().to_string();
                    file.overlay(parse_file(&text, &source)?);
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(ProfileError::Invalid {
                        path: path.display().to_string(),
                        message: e.to_string(),
                    });
                }
            }
        }
        Self::from_file(name, file, &source)
    }

    /// The built-in profile called `name`, without overrides.
    ///
    /// # Errors
    /// [`ProfileError::Unknown`] for a name not in [`Profile::NAMES`].
    pub fn builtin(name: &str) -> Result<Self, ProfileError> {
        Self::load(name, None)
    }

    /// The profile for a command line (the program and its arguments), by its program's file
    /// name (see [`relay_parse::Profile::for_command`]); a shell is `shell` only when it reads
    /// its commands from the terminal ([`crate::format::reads_commands`]): one that runs a
    /// script or a `-c` string runs a program, which gets `generic` like any other.
    pub fn name_for_command(command: &[String]) -> &'static str {
        let program = command.first().map_or("", String::as_str);
        match relay_parse::Profile::for_command(program).name() {
            "shell" if !crate::format::reads_commands(command) => "generic",
            name => name,
        }
    }

    fn from_file(name: &str, f: File, source: &str) -> Result<Self, ProfileError> {
        let parse_name = f.parse.as_deref().unwrap_or(name);
        let parse =
            relay_parse::Profile::by_name(parse_name).ok_or_else(|| ProfileError::Invalid {
                path: source.to_owned(),
                message: format!(
                    "parse = {parse_name:?}: known: {}",
                    relay_parse::Profile::NAMES.join(", ")
                ),
            })?;
        // The parser's busy markers are this file's `busy` list: one source for both.
        let busy = lowercase(f.busy.unwrap_or_default());
        let parse = parse.with_busy_markers(&busy);
        let regexes = |v: Option<Vec<String>>| -> Result<Vec<Regex>, ProfileError> {
            v.unwrap_or_default()
                .iter()
                .map(|p| regex(p, source))
                .collect()
        };
        let transcript = match f.transcript.as_deref() {
            None | Some("none") => None,
            Some(t) => {
                let format = TranscriptFormat::by_name(t).ok_or_else(|| ProfileError::Invalid {
                    path: source.to_owned(),
                    message: format!(
                        "transcript = {t:?}: known: none, {}",
                        TranscriptFormat::NAMES.join(", ")
                    ),
                })?;
                let dir = f
                    .transcript_dir
                    .clone()
                    .ok_or_else(|| ProfileError::Invalid {
                        path: source.to_owned(),
                        message: format!("transcript = {t:?} needs transcript_dir"),
                    })?;
                Some(TranscriptSource { format, dir })
            }
        };
        Ok(Self {
            name: name.to_owned(),
            parse,
            settle: ms(f.settle_ms, 400),
            // Only a known input line can show a turn over.
            turn_settle: f
                .turn_settle_ms
                .filter(|_| f.prompt.is_some())
                .map(Duration::from_millis),
            quiet: ms(f.quiet_ms, 500),
            enter_delay: ms(f.enter_delay_ms, 100),
            enter_on_echo: f.enter_on_echo.unwrap_or(false) && f.prompt.is_some(),
            verify_after: ms(f.verify_after_ms, 300),
            enter_retries: f.enter_retries.unwrap_or(1),
            busy,
            busy_patterns: regexes(f.busy_patterns)?,
            dialogs: lowercase(f.dialogs.unwrap_or_default()),
            prompt: f.prompt.as_deref().map(|p| regex(p, source)).transpose()?,
            placeholders: regexes(f.placeholders)?,
            starting: regexes(f.starting)?,
            tested_versions: f.tested_versions.unwrap_or_default(),
            args: f.args.unwrap_or_default(),
            multiline: f.multiline.unwrap_or(false),
            transcript,
            shell_line: f.shell_line.unwrap_or(false),
        })
    }

    /// The command line to run: `command` with the profile's `args` added, each one the person
    /// did not give already (none in the built-in profiles; an override may set them).
    pub fn command(&self, command: &[String]) -> Vec<String> {
        let mut out = command.to_vec();
        for a in &self.args {
            if !command.iter().skip(1).any(|c| c == a) {
                out.push(a.clone());
            }
        }
        out
    }

    /// The profile's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The input line's text, if the profile knows what its input line looks like and it is
    /// on screen: the last visible row matching the prompt pattern. A placeholder counts as
    /// empty.
    fn input(&self, screen: &ScreenText) -> Option<Option<String>> {
        let prompt = self.prompt.as_ref()?;
        let found = screen.lines.iter().rev().find_map(|row| {
            let row = normalize(row);
            prompt
                .captures(&row)
                .map(|c| c.get(1).map_or("", |m| m.as_str()).trim().to_owned())
        });
        Some(found.map(|text| {
            if self.placeholders.iter().any(|p| p.is_match(&text)) {
                String::new()
            } else {
                text
            }
        }))
    }

    /// Whether `screen` is the CLI's start-up screen: [`STARTING_ROWS`] or more rows in a row
    /// matching the profile's `starting` patterns (Codex's logo, drawn until its session is
    /// configured). The wrapper asks this only until it has once seen the agent started, and
    /// it never counts as "submitted": a message whose text happens to draw such rows later
    /// cannot hold the agent back or pass for a submitted one.
    pub fn starting(&self, screen: &ScreenText) -> bool {
        if self.starting.is_empty() {
            return false;
        }
        let mut run = 0;
        for row in &screen.lines {
            let row = normalize(row);
            let row = row.trim();
            if !row.is_empty() && self.starting.iter().any(|p| p.is_match(row)) {
                run += 1;
                if run >= STARTING_ROWS {
                    return true;
                }
            } else {
                run = 0;
            }
        }
        false
    }

    /// Whether the agent on `screen` may be given a message now.
    ///
    /// # Errors
    /// [`NotReady`] with the reason: busy, a dialog, no prompt, or text in the input line.
    pub fn ready(&self, screen: &ScreenText) -> Result<(), NotReady> {
        for row in &screen.lines {
            let row = normalize(row);
            let lower = row.to_lowercase();
            if let Some(m) = self.dialogs.iter().find(|m| lower.contains(m.as_str())) {
                return Err(NotReady::Dialog(m.clone()));
            }
            if let Some(m) = self.busy.iter().find(|m| lower.contains(m.as_str())) {
                return Err(NotReady::Busy(m.clone()));
            }
            if self.busy_patterns.iter().any(|p| p.is_match(row.trim())) {
                return Err(NotReady::Busy(row.trim().to_owned()));
            }
        }
        if self.shell_line {
            // Judged from the screen, not from the bytes a person typed (issue 23.16).
            let text = crate::shell_line::person_text(screen);
            if !text.is_empty() {
                return Err(NotReady::InputNotEmpty(text));
            }
        }
        match self.input(screen) {
            None => Ok(()),
            Some(None) => Err(NotReady::NoPrompt),
            Some(Some(text)) if text.is_empty() => Ok(()),
            Some(Some(text)) => Err(NotReady::InputNotEmpty(text)),
        }
    }

    /// Whether the profile knows what the CLI's input line looks like (a `prompt` rule).
    pub fn knows_prompt(&self) -> bool {
        self.prompt.is_some()
    }

    /// Whether `screen` shows the agent done with its turn, waiting at an empty input line:
    /// the input line on screen and empty, no busy marker, no dialog. Only a profile that
    /// [knows the prompt](Profile::knows_prompt) can tell; without one this is never true,
    /// since quiet output alone is no proof (a program may think without printing).
    pub fn waiting_for_input(&self, screen: &ScreenText) -> bool {
        self.knows_prompt() && self.ready(screen).is_ok()
    }

    /// Whether `typed` (text the wrapper typed, Enter not pressed yet) shows in the input
    /// line: its start or its end, or the CLI's collapsed form of a big paste (`[Pasted text
    /// #1 +3 lines]`). Drawn there, it was taken as input, so an Enter written now is a key of
    /// its own and not part of the paste. Only a profile with a prompt rule can tell; without
    /// one this is never true (the Enter then follows after the delay).
    pub fn echoed(&self, screen: &ScreenText, typed: &str) -> bool {
        match self.input(screen) {
            Some(Some(text)) if !text.is_empty() => shows_typed(&text, typed),
            _ => false,
        }
    }

    /// Whether `typed` (text the wrapper typed before pressing Enter) was submitted: the
    /// input line no longer holds it. Without a prompt rule: the row under the cursor no
    /// longer ends with it (a line-reading program moved to the next line).
    pub fn submitted(&self, screen: &ScreenText, typed: &str) -> bool {
        // Working on it: the prompt went in. (Some TUIs hide the input box while they work,
        // and the last row that looks like a prompt is then the submitted one in the
        // transcript, Codex's `› text`.)
        if matches!(self.ready(screen), Err(NotReady::Busy(_))) {
            return true;
        }
        match self.input(screen) {
            Some(Some(text)) => !shows_typed(&text, typed),
            // The input line is gone (the agent is working, a transcript scrolled...).
            Some(None) => true,
            None => !normalize(screen.cursor_line())
                .trim_end()
                .ends_with(&tail_of(typed)),
        }
    }
}

/// The last 16 characters of `typed`, trailing spaces left out.
fn tail_of(typed: &str) -> String {
    let t = typed.trim_end();
    let n = t.chars().count();
    t.chars().skip(n.saturating_sub(16)).collect()
}

/// Whether input-line text `input` holds `typed`: its first 24 characters or its end (a long
/// text wraps, so the line holds only part of it), or a big paste collapsed (Claude Code:
/// "[Pasted text #1 +3 lines]"; Gemini CLI 0.61: "[Pasted Text: 43 lines]").
fn shows_typed(input: &str, typed: &str) -> bool {
    let head: String = typed.chars().take(24).collect();
    input.contains(&head)
        || input.contains(&tail_of(typed))
        || input
            .get(..12)
            .is_some_and(|start| start.eq_ignore_ascii_case("[pasted text"))
}

fn lowercase(v: Vec<String>) -> Vec<String> {
    v.into_iter().map(|s| s.to_lowercase()).collect()
}

/// TUIs draw non-breaking spaces after prompt glyphs; rules are written with plain spaces.
fn normalize(row: &str) -> std::borrow::Cow<'_, str> {
    if row.contains('\u{a0}') {
        std::borrow::Cow::Owned(row.replace('\u{a0}', " "))
    } else {
        std::borrow::Cow::Borrowed(row)
    }
}

#[cfg(test)]
mod tests;
