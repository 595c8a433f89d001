//! Whether a shell's input line holds a person's text, judged from the screen (issue 23.16).
//!
//! A count of the bytes a person typed cannot tell: Up recalls a whole command from the
//! history in three bytes, and four Backspaces then bring the count to 0 while the line still
//! holds most of the command; a message typed then lands on it, and its Enter runs it. What
//! the shell shows is the truth: the row under the cursor, after the prompt. Any shell prompt
//! is allowed (none is configured), so the prompt's end is the first prompt glyph (`$`, `#`,
//! `%`, `>`, `❯`, `»`) followed by a space or the end of the row. A row under the cursor with
//! no such glyph is a long command's continuation, or a program's half-printed line: text,
//! unless the row is blank. A right-hand prompt (zsh's `RPROMPT`) would count as text; the
//! built-in profiles' shells draw none.
//!
//! Pure: the screen in, the verdict out. Called from [`crate::profile::Profile::ready`] for
//! profiles with `shell_line = true` (the shell profile), on both backends (the wrapper's
//! own screen model is fed by the agent's output under PTY and tmux alike).

use relay_parse::ScreenText;

/// The characters a shell prompt commonly ends with.
const PROMPT_ENDS: [char; 6] = ['$', '#', '%', '>', '❯', '»'];

/// The text on the shell's input line (the row under the cursor, after the prompt), trimmed;
/// empty when the line holds nothing.
pub fn person_text(screen: &ScreenText) -> String {
    let row = screen.cursor_line().replace('\u{a0}', " ");
    let chars: Vec<char> = row.chars().collect();
    let end = chars
        .iter()
        .enumerate()
        .position(|(i, c)| PROMPT_ENDS.contains(c) && chars.get(i + 1).is_none_or(|n| *n == ' '));
    let after: String = match end {
        Some(i) => chars[i + 1..].iter().collect(),
        None => row,
    };
    after.trim().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at_cursor(rows: &str) -> String {
        let lines: Vec<&str> = rows.lines().collect();
        let row = lines.len() - 1;
        let col = lines[row].chars().count();
        person_text(&ScreenText::from_text(rows, row, col))
    }

    #[test]
    fn an_empty_prompt_holds_nothing() {
        for prompt in [
            "$ ",
            "$",
            "bash-5.2$ ",
            "user@host:~/src$ ",
            "root@host:/# ",
            "host% ",
            "PS C:\\> ",
            "~/src ❯ ",
        ] {
            let screen = format!("earlier output\n$ ls\nfile\n{prompt}");
            assert_eq!(at_cursor(&screen), "", "{prompt:?}");
        }
    }

    #[test]
    fn a_recalled_and_partly_erased_command_is_text() {
        // Up recalled `echo hello-from-history`, four Backspaces erased "tory".
        assert_eq!(
            at_cursor("$ echo hello-from-history\nhello-from-history\n$ echo hello-from-his"),
            "echo hello-from-his"
        );
        assert_eq!(at_cursor("bash-5.2$ x"), "x");
        assert_eq!(at_cursor("host% git st"), "git st");
    }

    #[test]
    fn the_prompt_ends_at_its_first_glyph_before_a_space() {
        // A `$` inside the prompt (not before a space) is not its end; one in the command is
        // after it.
        assert_eq!(at_cursor("a$b:~$ echo $ HOME"), "echo $ HOME");
        assert_eq!(at_cursor("a>b $ "), "");
    }

    #[test]
    fn a_row_without_a_prompt_is_text_unless_blank() {
        // A long command's continuation row, or a program's half-printed line.
        assert_eq!(at_cursor("$ echo aaaaaaaa\nbbbb"), "bbbb");
        let screen = ScreenText::from_text("$ sleep 5\n", 1, 0);
        assert_eq!(person_text(&screen), "");
    }

    #[test]
    fn only_the_cursor_row_counts() {
        // Text on an earlier prompt row (a command already run) is not the person's line.
        let screen = ScreenText::from_text("$ make\nbuilt\n$ \nlater", 2, 2);
        assert_eq!(person_text(&screen), "");
        // Non-breaking spaces drawn after a prompt glyph count as spaces.
        let screen = ScreenText::from_text("$\u{a0}half", 0, 6);
        assert_eq!(person_text(&screen), "half");
    }
}
