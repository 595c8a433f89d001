//! Per-CLI parse settings.
//!
//! The rules of the scanner are the same for every program; a profile only switches the few
//! that depend on how a program draws its screen. What a program shows while it works (its
//! busy markers) is data, not code: it lives in the wrapper's profile files
//! (`crates/wrap/profiles/*.toml`, overridable by a person), and whoever loads one hands it
//! over with [`Profile::with_busy_markers`], so editing the file changes when the parser
//! settles too.

/// How to read one program's terminal output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    name: &'static str,
    code_by_colour: bool,
    claude_transcript: bool,
    /// Lowercased (see [`Profile::with_busy_markers`]).
    busy_markers: Vec<String>,
    /// The program breaks long lines into rows itself (a TUI laying out text at the
    /// terminal's width), so a row that fills the width may continue on the next one.
    hard_wraps: bool,
}

impl Profile {
    /// The names [`Profile::by_name`] knows.
    pub const NAMES: [&'static str; 5] = ["generic", "shell", "claude", "codex", "gemini"];

    /// Any program: colour means nothing; fences, thinking blocks and the other rules apply.
    pub fn generic() -> Self {
        Self {
            name: "generic",
            code_by_colour: false,
            claude_transcript: false,
            busy_markers: Vec::new(),
            hard_wraps: false,
        }
    }

    /// An interactive shell (bash, zsh, sh, ...).
    pub fn shell() -> Self {
        Self {
            name: "shell",
            code_by_colour: false,
            claude_transcript: false,
            busy_markers: Vec::new(),
            hard_wraps: false,
        }
    }

    /// Claude Code: it renders Markdown without fences; prose is in the default colour, while
    /// syntax-highlighted code and inline code are coloured, so coloured text is code. A block
    /// whose language highlights nothing (```` ```text ````) is drawn like prose, so the
    /// wrapper also checks each directive against the reply's Markdown in Claude Code's
    /// transcript ([`crate::transcript`]). Tested on Claude Code 2.1.197 and 2.1.328
    /// (fixtures `claude-*`; `claude-fences-328` and `claude-fences-197` for code blocks).
    pub fn claude() -> Self {
        Self {
            name: "claude",
            code_by_colour: true,
            claude_transcript: true,
            busy_markers: Vec::new(),
            hard_wraps: true,
        }
    }

    /// Codex CLI: a full-screen TUI on the alternate screen; prose in the default colour, code
    /// and quotes coloured (checked against a capture of 0.169.0).
    pub fn codex() -> Self {
        Self {
            name: "codex",
            code_by_colour: true,
            claude_transcript: false,
            busy_markers: Vec::new(),
            hard_wraps: true,
        }
    }

    /// Gemini CLI: colour says nothing here. 0.61.0 draws its prose in an explicit theme colour
    /// (256-colour 231) and code blocks with line numbers in front (`   1 code`), which no
    /// directive starts with (capture: `tests/fixtures/gemini-session.bin`).
    pub fn gemini() -> Self {
        Self {
            name: "gemini",
            code_by_colour: false,
            claude_transcript: false,
            busy_markers: Vec::new(),
            hard_wraps: true,
        }
    }

    /// The profile called `name` (one of [`Profile::NAMES`]).
    pub fn by_name(name: &str) -> Option<Self> {
        Some(match name {
            "generic" => Self::generic(),
            "shell" => Self::shell(),
            "claude" => Self::claude(),
            "codex" => Self::codex(),
            "gemini" => Self::gemini(),
            _ => return None,
        })
    }

    /// The profile for a command line, chosen by its program's file name: `claude`, `codex`,
    /// `gemini`, a shell (`bash`, `zsh`, `sh`, `dash`, `fish`, `ksh`), else generic.
    pub fn for_command(command: &str) -> Self {
        let program = command.split_whitespace().next().unwrap_or("");
        let base = program.rsplit('/').next().unwrap_or(program);
        match base {
            "claude" => Self::claude(),
            "codex" => Self::codex(),
            "gemini" => Self::gemini(),
            "bash" | "zsh" | "sh" | "dash" | "fish" | "ksh" => Self::shell(),
            _ => Self::generic(),
        }
    }

    /// The profile's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Text a TUI shows near its input while the agent is working (`esc to interrupt`); while
    /// it is on screen, a pause in the output is not the end of anything (see
    /// [`crate::Parser::settle`]). None unless given with [`Profile::with_busy_markers`].
    pub fn busy_markers(&self) -> &[String] {
        &self.busy_markers
    }

    /// This profile with `markers` as its busy markers (matched case-insensitively): the
    /// `busy` list of the loaded profile file (`relay_wrap::profile::Profile` does this), the
    /// one place they are written.
    #[must_use]
    pub fn with_busy_markers<S: AsRef<str>>(
        mut self,
        markers: impl IntoIterator<Item = S>,
    ) -> Self {
        self.busy_markers = markers
            .into_iter()
            .map(|m| m.as_ref().to_lowercase())
            .filter(|m| !m.is_empty())
            .collect();
        self
    }

    /// Whether the program keeps a Claude Code transcript whose replies tell a quoted
    /// directive from a said one ([`crate::transcript::ReplySource`]).
    pub fn claude_transcript(&self) -> bool {
        self.claude_transcript
    }

    /// Whether text shown in an explicit foreground colour counts as code.
    pub fn code_by_colour(&self) -> bool {
        self.code_by_colour
    }

    /// Whether the program breaks long lines into rows itself (Claude Code, Codex, Gemini
    /// lay out their replies at the terminal's width), so that a row filling the width is
    /// continued, without a line break, on the next one.
    pub fn hard_wraps(&self) -> bool {
        self.hard_wraps
    }
}

impl Default for Profile {
    fn default() -> Self {
        Self::generic()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_round_trips() {
        for name in Profile::NAMES {
            assert_eq!(Profile::by_name(name).map(|p| p.name()), Some(name));
        }
        assert_eq!(Profile::by_name("vim"), None);
    }

    #[test]
    fn command_picks_by_program_file_name() {
        assert_eq!(
            Profile::for_command("/usr/local/bin/claude --resume").name(),
            "claude"
        );
        assert_eq!(Profile::for_command("codex").name(), "codex");
        assert_eq!(Profile::for_command("gemini -m x").name(), "gemini");
        assert_eq!(Profile::for_command("/bin/bash -l").name(), "shell");
        assert_eq!(Profile::for_command("zsh").name(), "shell");
        assert_eq!(Profile::for_command("python3").name(), "generic");
        assert_eq!(Profile::for_command("").name(), "generic");
    }
}
