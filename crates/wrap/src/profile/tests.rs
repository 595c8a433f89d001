//! The profiles against screens recorded from the real CLIs
//! (`crates/parse/tests/fixtures/*.bin`), replayed into the parser up to a byte offset.

use super::*;
use relay_parse::Parser;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../parse/tests/fixtures");

/// The screen of fixture `name` after its first `bytes` bytes, on a terminal of `rows`.
fn screen_at(name: &str, bytes: usize, rows: usize) -> ScreenText {
    let data = std::fs::read(format!("{FIXTURES}/{name}.bin")).unwrap();
    let mut p = Parser::new(relay_parse::Profile::generic());
    p.set_rows(rows);
    p.feed(&data[..bytes.min(data.len())]);
    p.screen()
}

fn claude() -> Profile {
    Profile::builtin("claude").unwrap()
}

#[test]
fn claude_with_a_persons_text_in_its_input_box_is_not_ready() {
    let s = screen_at("claude-session", 1262, 30);
    assert_eq!(
        claude().ready(&s),
        Err(NotReady::InputNotEmpty("ask Bob to review auth.ts".into()))
    );
    // And that text, typed by the wrapper, is not submitted yet.
    assert!(!claude().submitted(&s, "ask Bob to review auth.ts"));
}

/// Enter follows the text once it shows in the input line, and the turn is seen over once the
/// input line is back and empty with nothing working: on recorded screens.
#[test]
fn claude_shows_typed_text_and_the_end_of_its_turn() {
    let typed = screen_at("claude-session", 1262, 30);
    assert!(claude().echoed(&typed, "ask Bob to review auth.ts"));
    assert!(!claude().echoed(&typed, "something else entirely"));
    let idle = screen_at("claude-session", 30440, 30);
    assert!(!claude().echoed(&idle, "ask Bob to review auth.ts"));
    assert!(claude().waiting_for_input(&idle));
    assert!(!claude().waiting_for_input(&screen_at("claude-session", 6342, 30)));
    assert!(!claude().waiting_for_input(&typed));
    // A big paste shows collapsed.
    let pasted = ScreenText::from_text("● Done.\n\n❯ [Pasted text #1 +41 lines]\n", 2, 30);
    assert!(claude().echoed(&pasted, "Relay message from Alice [01ABCDEF]:\nline\n"));
    let c = claude();
    assert_eq!(c.turn_settle, Some(Duration::from_millis(30)));
    assert!(c.enter_on_echo);
    // Without a prompt rule neither applies: quiet output proves nothing there.
    let generic = Profile::builtin("generic").unwrap();
    assert_eq!((generic.turn_settle, generic.enter_on_echo), (None, false));
    let s = ScreenText::from_text("$ ask Bob", 0, 9);
    assert!(!generic.echoed(&s, "ask Bob"));
}

/// Gemini CLI 0.61 collapses a big paste to `[Pasted Text: N lines]` in its input box: the
/// text is still there, not submitted (an Enter it missed is pressed again), though none of
/// the typed characters show.
#[test]
fn a_paste_gemini_collapsed_in_its_input_box_is_not_submitted() {
    let gemini = Profile::builtin("gemini").unwrap();
    let pasted = ScreenText::from_text(" > [Pasted Text: 43 lines]\n", 0, 30);
    let typed = "Relay message from human [01ABCDEF]:\nline\n";
    assert!(!gemini.submitted(&pasted, typed));
    assert!(gemini.echoed(&pasted, typed));
}

#[test]
fn claude_working_is_busy_by_its_status_line_or_its_spinner() {
    let s = screen_at("claude-session", 6342, 30);
    assert_eq!(
        claude().ready(&s),
        Err(NotReady::Busy("esc to interrupt".into()))
    );
    // Once it is working the prompt it was given is gone from the input box.
    assert!(claude().submitted(&s, "ask Bob to review auth.ts"));
    match claude().ready(&screen_at("claude-session", 6607, 30)) {
        Err(NotReady::Busy(row)) => assert!(row.starts_with("· Contemplating…"), "{row}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn claude_idle_with_an_empty_prompt_is_ready() {
    assert_eq!(
        claude().ready(&screen_at("claude-session", 30440, 30)),
        Ok(())
    );
    assert_eq!(
        claude().ready(&screen_at("claude-injected", 6561, 30)),
        Ok(())
    );
}

#[test]
fn only_an_empty_prompt_with_nothing_working_is_waiting_for_input() {
    // Idle at its prompt: a turn is over.
    assert!(claude().waiting_for_input(&screen_at("claude-session", 30440, 30)));
    // Working, or holding a person's text: not.
    assert!(!claude().waiting_for_input(&screen_at("claude-session", 6342, 30)));
    assert!(!claude().waiting_for_input(&screen_at("claude-session", 1262, 30)));
    // Without a prompt rule quiet output proves nothing.
    let generic = Profile::builtin("generic").unwrap();
    assert!(!generic.waiting_for_input(&ScreenText::from_text("$ ", 0, 2)));
}

#[test]
fn claude_showing_a_dialog_is_not_ready() {
    let s = ScreenText::from_text(
        " Bash command\n\n   rm -rf build\n\n Do you want to proceed?\n ❯ 1. Yes\n   2. No\n\n Esc to cancel\n",
        5,
        3,
    );
    assert_eq!(
        claude().ready(&s),
        Err(NotReady::Dialog("do you want to".into()))
    );
}

#[test]
fn codex_placeholder_counts_as_empty_and_typed_text_does_not() {
    let codex = Profile::builtin("codex").unwrap();
    assert_eq!(codex.ready(&screen_at("codex-session", 20928, 30)), Ok(()));
    assert_eq!(
        codex.ready(&screen_at("codex-session", 39544, 30)),
        Err(NotReady::InputNotEmpty("ping Bob".into()))
    );
}

#[test]
fn without_a_prompt_rule_submission_is_the_cursor_leaving_the_line() {
    let generic = Profile::builtin("generic").unwrap();
    let typed = "Relay message from Alice [01ABCDEF]: hello";
    let before = ScreenText::from_text(&format!("$ run\n{typed}"), 1, typed.len());
    assert!(!generic.submitted(&before, typed));
    let after = ScreenText::from_text(&format!("$ run\n{typed}\ngot it\n"), 3, 0);
    assert!(generic.submitted(&after, typed));
    assert_eq!(generic.ready(&after), Ok(()));
}

#[test]
fn a_persons_override_changes_only_the_fields_it_names() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("claude.toml"),
        "# mine\nquiet_ms = 1500\nbusy = [\"thinking hard\"]\n",
    )
    .unwrap();
    let p = Profile::load("claude", Some(dir.path())).unwrap();
    assert_eq!(p.quiet, Duration::from_millis(1500));
    assert_eq!(p.enter_delay, claude().enter_delay, "kept");
    let s = ScreenText::from_text("❯ \n  Thinking hard · 3s\n", 0, 2);
    assert_eq!(p.ready(&s), Err(NotReady::Busy("thinking hard".into())));
    // The prompt rule is still the embedded one.
    let s = ScreenText::from_text("❯ half a line\n", 0, 2);
    assert_eq!(
        p.ready(&s),
        Err(NotReady::InputNotEmpty("half a line".into()))
    );
}

#[test]
fn a_broken_override_is_refused_with_its_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("codex.toml");
    std::fs::write(&path, "quiet_ms = 10\nbusy = [unclosed\n").unwrap();
    let e = Profile::load("codex", Some(dir.path()))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&path.display().to_string()) && e.contains("line 2"),
        "{e}"
    );
    std::fs::write(&path, "quiet = 10\n").unwrap();
    let e = Profile::load("codex", Some(dir.path()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown field"), "{e}");
    std::fs::write(&path, "prompt = '(unclosed'\n").unwrap();
    let e = Profile::load("codex", Some(dir.path()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("pattern"), "{e}");
    assert!(
        Profile::load("vim", None)
            .unwrap_err()
            .to_string()
            .contains("unknown profile")
    );
}

#[test]
fn every_embedded_profile_loads() {
    for name in Profile::NAMES {
        let p = Profile::builtin(name).unwrap();
        assert_eq!(p.name(), name);
        assert_eq!(p.parse.name(), name);
    }
}

#[test]
fn a_working_agent_has_taken_the_prompt_even_if_a_prompt_row_shows_it() {
    // Codex while it works: the submitted prompt in the transcript is the last `›` row.
    let codex = Profile::builtin("codex").unwrap();
    let typed = "Relay message from Alice [01ABCDEF]: check the build";
    let s = ScreenText::from_text(
        &format!("› {typed}\n\n• Working (2s • esc to interrupt)\n"),
        3,
        0,
    );
    assert!(codex.submitted(&s, typed));
    // Submitted before the session was configured (seen in a slow start of 0.169.0): no input
    // box under it yet, only Codex saying it will run it once started.
    let s = ScreenText::from_text(
        &format!(
            "  >_ OpenAI Codex (v0.169.0)\n\n› {typed}\n\n  Waiting for startup  · esc cancel\n"
        ),
        4,
        0,
    );
    assert!(codex.submitted(&s, typed));
    assert!(
        codex.ready(&s).is_err(),
        "and nothing more is typed meanwhile"
    );
    // Not working and still in the box: not submitted.
    let s = ScreenText::from_text(&format!("\n› {typed}\n\n  ? for shortcuts\n"), 1, 10);
    assert!(!codex.submitted(&s, typed));
}

/// Gemini CLI 0.61.0 recorded with a reply the stand-in held back 4 s
/// (`gemini-busy.script.json`, `gemini-busy.standin.json`): idle, a pasted message not yet
/// submitted, thinking, then a person's half-typed line.
#[test]
fn gemini_idle_typed_busy_and_a_persons_line() {
    let gemini = Profile::builtin("gemini").unwrap();
    // The input box " >   Type your message or @path/to/file": a placeholder, empty.
    assert_eq!(gemini.ready(&screen_at("gemini-busy", 3800, 30)), Ok(()));
    let typed = screen_at("gemini-busy", 5000, 30);
    assert_eq!(
        gemini.ready(&typed),
        Err(NotReady::InputNotEmpty("a slow question".into()))
    );
    assert!(!gemini.submitted(&typed, "a slow question"));
    // " ⠇ Thinking... (esc to cancel, 0s)", the prompt above it in the transcript.
    let busy = screen_at("gemini-busy", 20000, 30);
    assert_eq!(
        gemini.ready(&busy),
        Err(NotReady::Busy("esc to cancel".into()))
    );
    assert!(gemini.submitted(&busy, "a slow question"));
    // Answered, and a person typing: the last " > " row is the input box, not the transcript.
    assert_eq!(
        gemini.ready(&screen_at("gemini-busy", usize::MAX, 30)),
        Err(NotReady::InputNotEmpty("half typed".into()))
    );
}

/// Codex 0.169.0 draws its input box and `? for shortcuts` about half a second after it starts,
/// but takes its session's configuration seconds later (longer on a slow machine): a prompt
/// submitted before then waits under "Waiting for startup" and, in CI, was never run. Until
/// then its logo (rows of braille art) is on screen; once configured the logo is gone and the
/// footer names the model.
#[test]
fn codex_still_starting_shows_its_logo() {
    let codex = Profile::builtin("codex").unwrap();
    assert!(codex.starting(&screen_at("codex-session", 3600, 30)));
    assert!(codex.starting(&screen_at("codex-session", 5000, 30)));
    let started = screen_at("codex-session", 5640, 30);
    assert!(!codex.starting(&started));
    assert_eq!(codex.ready(&started), Ok(()));
    // Braille a peer or the agent prints is not the logo: fewer than three rows of it, or
    // inside the input line.
    let s = ScreenText::from_text("• a chart\n  ⣿⣿⣿ ⣀⣀\n  ⣿⣿\n\n› ⣿⣿⣿\n", 4, 4);
    assert!(!codex.starting(&s));
    // And the logo never counts as "submitted" (a busy marker does): text typed while it
    // shows is still in the input line.
    let typed = "Relay message from Alice [01ABCDEF]: hi";
    let s = ScreenText::from_text(
        &format!("  ⣀⣤⣤⣀\n ⣠⣶⣿⣿⣶⣄\n ⠻⣿⣿⣿⣿⠟\n   ⠙⠋\n\n› {typed}\n  ? for shortcuts\n"),
        5,
        10,
    );
    assert!(codex.starting(&s));
    assert!(!codex.submitted(&s, typed));
}

#[test]
fn profile_args_are_added_unless_given() {
    let mut codex = Profile::builtin("codex").unwrap();
    let cmd = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<String>>();
    // The built-in codex profile runs it inline (a tall reply's first lines reach the screen).
    assert_eq!(
        codex.command(&cmd(&["codex", "-m", "o3"])),
        cmd(&["codex", "-m", "o3", "--no-alt-screen"])
    );
    let claude = Profile::builtin("claude").unwrap();
    assert_eq!(claude.command(&cmd(&["claude"])), cmd(&["claude"]));
    codex.args = cmd(&["--search"]);
    assert_eq!(
        codex.command(&cmd(&["codex", "-m", "o3"])),
        cmd(&["codex", "-m", "o3", "--search"])
    );
    codex.args = cmd(&["--no-alt-screen"]);
    // Given already: not twice.
    assert_eq!(
        codex.command(&cmd(&["codex", "--no-alt-screen"])),
        cmd(&["codex", "--no-alt-screen"])
    );
}

/// Each of the three CLIs' profiles names the record of its replies; an override can turn it
/// off or point it elsewhere, and an unknown format is refused.
#[test]
fn profiles_name_the_clis_record_of_their_replies() {
    let of = |name: &str| Profile::builtin(name).unwrap().transcript;
    assert_eq!(
        of("codex"),
        Some(TranscriptSource {
            format: TranscriptFormat::Codex,
            dir: "${CODEX_HOME:-~/.codex}/sessions".into()
        })
    );
    assert_eq!(of("gemini").unwrap().format, TranscriptFormat::Gemini);
    assert_eq!(of("claude").unwrap().format, TranscriptFormat::Claude);
    assert_eq!(of("shell"), None);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("codex.toml");
    std::fs::write(&path, "transcript = \"none\"\n").unwrap();
    let p = Profile::load("codex", Some(dir.path())).unwrap();
    assert_eq!(p.transcript, None);
    std::fs::write(&path, "transcript_dir = \"/elsewhere\"\n").unwrap();
    let p = Profile::load("codex", Some(dir.path())).unwrap();
    assert_eq!(p.transcript.unwrap().dir, "/elsewhere");
    std::fs::write(&path, "transcript = \"vim\"\n").unwrap();
    let e = Profile::load("codex", Some(dir.path()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("transcript = \"vim\""), "{e}");
    let generic = dir.path().join("generic.toml");
    std::fs::write(&generic, "transcript = \"codex\"\n").unwrap();
    let e = Profile::load("generic", Some(dir.path()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("needs transcript_dir"), "{e}");
}
