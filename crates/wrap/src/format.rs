//! How a delivered message becomes text typed into an agent's terminal.

use relay_protocol::text::{typed, typed_lines};

/// Programs that read commands from their terminal: whatever is typed into one is run, so it is
/// given text only as a [`Form::ShellNoOp`].
pub const SHELLS: &[&str] = &[
    "sh", "bash", "dash", "zsh", "ksh", "mksh", "pdksh", "ash", "yash", "posh", "fish",
];

/// How text is put into an agent's input line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// As written: an agent CLI reads it as a prompt.
    Plain,
    /// As a shell command that does nothing: `: '…'`, see [`shell_no_op`]. A shell runs every
    /// line it is given, so a body like `x; rm -rf ~` or `$(…)` typed plainly would run.
    ShellNoOp,
}

impl Form {
    /// The form for an agent run with `profile` as `command`: a shell no-op when the profile is
    /// `shell` (a person can name it for any program) or the program is a shell that reads its
    /// commands from the terminal (see [`reads_commands`]), whatever profile was chosen for it;
    /// plain otherwise. A shell started later by the agent (`sh -c 'exec bash'`, a program
    /// that spawns one) cannot be seen from here: `--profile shell` covers it.
    pub fn for_agent(profile: &str, command: &[String]) -> Self {
        if profile == "shell" || reads_commands(command) {
            Self::ShellNoOp
        } else {
            Self::Plain
        }
    }

    /// `text` in this form, on one line with no control characters.
    pub fn apply(self, text: &str) -> String {
        match self {
            Self::Plain => typed(text),
            Self::ShellNoOp => shell_no_op(text),
        }
    }
}

/// Whether `command` is a shell (by its program's file name, see [`SHELLS`]) that reads its
/// commands from the terminal: no `-c` and no script operand, or `-s`. Options that take a
/// value (`-o`, `-O`, `--rcfile`, fish's `-C`...) are skipped with it. When in doubt the answer
/// is yes: a quoted message to a script costs nothing, a plain one to a shell runs.
pub fn reads_commands(command: &[String]) -> bool {
    let Some(program) = command.first() else {
        return false;
    };
    let program = program.rsplit('/').next().unwrap_or(program);
    if !SHELLS.contains(&program) {
        return false;
    }
    let fish = program == "fish";
    let mut stdin = false;
    let mut args = command[1..].iter();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--" => return stdin || args.next().is_none(),
            "--rcfile" | "--init-file" | "--init-command" | "--emulate" => {
                args.next();
            }
            "--command" => return false,
            long if long.starts_with("--") => {}
            short if short.len() > 1 && (short.starts_with('-') || short.starts_with('+')) => {
                let flags = &short[1..];
                if flags.contains('c') {
                    // `-c STRING`: it runs that string, not what it reads.
                    return false;
                }
                stdin |= flags.contains('s');
                // Each of these takes the next argument as its value.
                let takes = flags.chars().filter(|f| matches!(f, 'o' | 'O')).count()
                    + usize::from(fish && flags.contains('C'));
                for _ in 0..takes {
                    args.next();
                }
            }
            // A script (its arguments follow): it reads commands from that file, unless `-s`
            // made these positional parameters.
            _ => return stdin,
        }
    }
    true
}

/// `text` as a command no shell executes: the no-op `:` with the text as its one argument, in
/// single quotes. Inside single quotes nothing is special to a POSIX shell (no `$(…)`, no
/// backticks, no `;`, no `!` history expansion in bash or zsh); a `'` in the text ends the quote,
/// is typed as `\'` outside it and the quote starts again (`'\''`). A backslash is written the
/// same way (`'\\'`), because fish, unlike POSIX shells, reads `\'` and `\\` inside single
/// quotes as escapes. Control characters are dropped and line breaks become spaces first (see
/// [`typed`]), so the text is one line and cannot submit early: the shell sees one complete
/// command, and the person or agent reading the screen sees the text.
pub fn shell_no_op(text: &str) -> String {
    let text = typed(text);
    let mut s = String::with_capacity(text.len() + 8);
    s.push_str(": '");
    for c in text.chars() {
        match c {
            '\'' => s.push_str("'\\''"),
            '\\' => s.push_str("'\\\\'"),
            c => s.push(c),
        }
    }
    s.push('\'');
    s
}

/// The line typed into the recipient's terminal for one message:
/// `Relay message from Alice [5DZ82MJ3]: body` (with ` (thread T)` when there is one).
///
/// The text is one line: control characters from the sender (escape sequences, bells,
/// carriage returns) are dropped and line breaks become spaces (see
/// [`relay_protocol::text::typed`]), in the body and in every other relay-supplied part (the
/// sender, the id, the thread), so nothing a peer sends can drive the recipient's terminal or
/// submit early. The daemon accepts only ids of a safe alphabet, but the wrapper does not rely
/// on that. A body longer than `max_body` characters is cut, with a hint to read the rest. The
/// line starts with `Relay message from`, which the parser never reads as a directive, so its
/// echo cannot be relayed again. (For a shell, it is then put in a [`Form::ShellNoOp`].)
///
/// With `lines` (a CLI that takes a multi-line bracketed paste as one prompt, see
/// [`crate::profile::Profile::multiline`]), a body of several lines keeps them, and its
/// indentation, after a line of its own: `Relay message from Alice [5DZ82MJ3]:` then the
/// body; only control characters are dropped (see [`relay_protocol::text::typed_lines`]).
/// Without, a body of several lines is flattened and the text says so, with where the exact
/// text is. A body line that could pass for a header is quoted first (see
/// [`relay_protocol::text::quote_headers`]): a body cannot forge a second message.
pub fn injected_text(
    from: &str,
    id: &str,
    thread: Option<&str>,
    body: &str,
    max_body: usize,
    lines: bool,
) -> String {
    let id = typed(id);
    let from = typed(from);
    let short = relay_protocol::short_id(&id);
    let multi = body.trim_end().contains(['\n', '\r']);
    // No line of the body may start like a header (issue 23.4).
    let body = relay_protocol::text::quote_headers(body);
    let body = if lines && multi {
        typed_lines(&body)
    } else {
        typed(&body)
    };
    let clean: String = body.chars().take(max_body).collect();
    // `clean` is a prefix of `body`: shorter means cut.
    let cut = clean.len() < body.len();
    let thread = thread
        .map(|t| {
            // A thread the relay started is the id of its first message: its short id is
            // enough (and `agent-relay read` takes it).
            let t: String = if ulid::Ulid::from_string(t).is_ok() {
                relay_protocol::short_id(t).to_owned()
            } else {
                typed(t).chars().take(64).collect()
            };
            format!(" (thread {t})")
        })
        .unwrap_or_default();
    let sep = if lines && multi { "\n" } else { " " };
    let mut text = format!(
        "Relay message from {from} [{short}]{thread}:{sep}{}",
        clean.trim_end()
    );
    if cut {
        text.push_str(&format!(" … (truncated; full text: agent-relay read {id})"));
    } else if multi && !lines {
        text.push_str(&format!(
            " (its line breaks are shown as spaces here; exact text: agent-relay read {id})"
        ));
    }
    text
}

/// How a wrapper hands messages that arrive for its agent over (`wrap --delivery`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Delivery {
    /// Each message typed as its own prompt (the default).
    #[default]
    Each,
    /// Messages that waited for a busy agent typed as one prompt when it is next ready (see
    /// [`digest`]); urgent ones first and alone. Each is still acknowledged on its own.
    Digest,
    /// Only a one-line notice is typed (see [`notice`]); the agent reads the messages with its
    /// MCP tools (`relay_inbox`, `relay_read`), which tell the wrapper what they showed.
    Notice,
}

/// Several messages typed as one prompt: a header line, `3 relay messages:`, then each
/// message's text as [`injected_text`] made it. With `lines` (a CLI that takes a multi-line
/// paste as one prompt) each message starts on a line of its own; without, all is one line,
/// the messages separated by ` | ` (a multi-line body's text already says where its exact
/// text is).
pub fn digest(texts: &[String], lines: bool) -> String {
    let head = format!("{} relay messages:", texts.len());
    if lines {
        std::iter::once(head)
            .chain(texts.iter().cloned())
            .collect::<Vec<_>>()
            .join("\n")
    } else {
        format!("{head} {}", texts.join(" | "))
    }
}

/// The one line typed for messages in notice delivery: who sent them and their short ids,
/// and where to read them: `2 relay messages from Bob [K7Q4ZXYZ] [5DZ82MJ3] — call
/// relay_inbox to read them`. `messages` are (sender, id) in arrival order; senders are named
/// in the order they first appear. Relay-supplied parts are cleaned like a message's.
pub fn notice(messages: &[(&str, &str)], urgent: bool) -> String {
    let mut senders: Vec<(String, Vec<String>)> = Vec::new();
    for (from, id) in messages {
        let from = typed(from);
        let short = format!("[{}]", relay_protocol::short_id(&typed(id)));
        match senders.iter_mut().find(|(f, _)| *f == from) {
            Some((_, ids)) => ids.push(short),
            None => senders.push((from, vec![short])),
        }
    }
    let named: Vec<String> = senders
        .iter()
        .map(|(from, ids)| format!("{from} {}", ids.join(" ")))
        .collect();
    let named = match named.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => named.join(""),
    };
    let n = messages.len();
    let (plural, them) = if n == 1 { ("", "it") } else { ("s", "them") };
    let urgent = if urgent { "urgent " } else { "" };
    format!("{n} {urgent}relay message{plural} from {named} — call relay_inbox to read {them}")
}

/// Follows whether the agent has turned bracketed paste on (`ESC[?2004h`) or off
/// (`ESC[?2004l`) in its output, across chunk boundaries.
#[derive(Debug, Default)]
pub struct PasteMode {
    on: bool,
    tail: Vec<u8>,
}

const PASTE_ON: &[u8] = b"\x1b[?2004h";
const PASTE_OFF: &[u8] = b"\x1b[?2004l";

impl PasteMode {
    /// Notes a chunk of the agent's output.
    pub fn feed(&mut self, bytes: &[u8]) {
        let mut window = std::mem::take(&mut self.tail);
        window.extend_from_slice(bytes);
        // The last marker in the output decides.
        let last = |m: &[u8]| window.windows(m.len()).rposition(|w| w == m);
        match (last(PASTE_ON), last(PASTE_OFF)) {
            (Some(a), Some(b)) => self.on = a > b,
            (Some(_), None) => self.on = true,
            (None, Some(_)) => self.on = false,
            (None, None) => {}
        }
        let keep = window.len().saturating_sub(PASTE_ON.len() - 1);
        self.tail = window.split_off(keep);
    }

    /// Whether the agent currently wants pastes bracketed.
    pub fn is_on(&self) -> bool {
        self.on
    }

    /// `text` as the agent should receive it: bracketed when it asked for that. Unbracketed,
    /// a line break would submit what comes before it: they become spaces.
    pub fn wrap(&self, text: &str) -> Vec<u8> {
        if self.on {
            [b"\x1b[200~", text.as_bytes(), b"\x1b[201~"].concat()
        } else {
            text.replace('\n', " ").into_bytes()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paste_mode_follows_the_agent_across_chunks() {
        let mut p = PasteMode::default();
        assert_eq!(p.wrap("x"), b"x");
        p.feed(b"hello \x1b[?20");
        assert!(!p.is_on());
        p.feed(b"04h prompt");
        assert!(p.is_on());
        assert_eq!(p.wrap("x"), b"\x1b[200~x\x1b[201~");
        p.feed(b"\x1b[?2004l\x1b[?2004h\x1b[?2004l");
        assert!(!p.is_on(), "the last marker wins");
        p.feed(b"\x1b[?2004h");
        assert!(p.is_on());
    }

    #[test]
    fn shape_and_short_id() {
        assert_eq!(
            injected_text(
                "Alice",
                "01JB2K7Q4ZXYZ",
                None,
                "Can you review auth.ts?",
                1000,
                false
            ),
            "Relay message from Alice [K7Q4ZXYZ]: Can you review auth.ts?"
        );
        assert_eq!(
            injected_text("Bob", "m7", Some("t1"), "ok", 1000, false),
            "Relay message from Bob [m7] (thread t1): ok"
        );
        // Two ULIDs of the same second differ only at the end: both ids are shown by it.
        assert_eq!(
            injected_text(
                "Carol",
                "01M80TF75ZPNAE1B5DZ82MJ3M2",
                Some("01M80TF6Q3XABCDE12345678XY"),
                "ok",
                1000,
                false
            ),
            "Relay message from Carol [Z82MJ3M2] (thread 345678XY): ok"
        );
    }

    #[test]
    fn control_characters_never_reach_the_terminal() {
        let t = injected_text(
            "A",
            "x",
            None,
            "a\u{1b}[2J\u{7}b\r\nc\u{1b}]0;t\u{7}",
            1000,
            false,
        );
        assert!(!t.chars().any(char::is_control), "{t:?}");
        assert!(t.contains("a[2Jb  c]0;t (its line breaks"), "{t:?}");
        let t = injected_text(
            "A",
            "x",
            None,
            "a\u{1b}[2J\u{7}b\r\nc\u{1b}]0;t\u{7}",
            1000,
            true,
        );
        assert!(!t.chars().any(|c| c.is_control() && c != '\n'), "{t:?}");
        assert!(t.ends_with(":\na[2Jb\nc]0;t"), "{t:?}");
    }

    /// The daemon refuses such ids; the wrapper cleans them anyway (defence in depth): an id
    /// with a carriage return once submitted `touch FILE` to a wrapped shell, and one with an
    /// OSC sequence (ESC or the C1 introducer U+009D) retitled the person's terminal.
    #[test]
    fn hostile_ids_threads_and_names_are_typed_without_controls() {
        for id in [
            "q\rtouch FILE\r#",
            "x\u{1b}]0;pwned\u{7}",
            "x\u{9d}0;pwned\u{9c}",
            "a\nb\u{202e}c",
        ] {
            // Long enough to be cut: the hint repeats the whole id.
            let t = injected_text(
                "Al\u{1b}[2Jice",
                id,
                Some("th\rread\u{9b}"),
                &"x".repeat(50),
                10,
                false,
            );
            assert!(t.contains("agent-relay read"), "{t:?}");
            assert!(
                !t.chars().any(|c| c.is_control()
                    || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')),
                "{id:?} gave {t:?}"
            );
        }
        let t = injected_text("A", "q\rtouch FILE\r#", None, &"x".repeat(50), 10, false);
        assert!(
            t.starts_with("Relay message from A [h FILE #]: ")
                && t.ends_with("agent-relay read q touch FILE #)"),
            "{t:?}"
        );
    }

    #[test]
    fn shells_get_a_no_op_by_profile_or_by_program() {
        let cmd = |c: &str| c.split(' ').map(str::to_owned).collect::<Vec<_>>();
        for (profile, command) in [
            ("shell", "my-repl"),
            ("shell", "sh -c exec-bash"),
            ("generic", "bash --norc --noprofile -i"),
            ("claude", "/usr/bin/zsh"),
            ("generic", "fish"),
            ("generic", "bash --rcfile x.rc"),
            ("generic", "bash -o vi -O extglob"),
            ("generic", "sh -s a b"),
            ("generic", "dash -i"),
            ("generic", "fish -C init"),
            ("generic", "bash -l --"),
        ] {
            assert_eq!(
                Form::for_agent(profile, &cmd(command)),
                Form::ShellNoOp,
                "{profile} {command:?}"
            );
        }
        // A program run by a shell reads its input as it likes: it is not a shell.
        for (profile, command) in [
            ("claude", "claude"),
            ("generic", "python3"),
            ("generic", "sh script.sh"),
            ("generic", "bash -lc agent"),
            ("generic", "sh -- script.sh"),
            ("generic", "fish --command x"),
        ] {
            assert_eq!(
                Form::for_agent(profile, &cmd(command)),
                Form::Plain,
                "{profile} {command:?}"
            );
        }
        assert_eq!(Form::for_agent("generic", &[]), Form::Plain);
    }

    #[test]
    fn the_shell_form_is_one_quoted_argument_of_a_no_op() {
        assert_eq!(shell_no_op("a $(b) `c`; d"), ": 'a $(b) `c`; d'");
        assert_eq!(shell_no_op("it's"), r": 'it'\''s'");
        assert_eq!(shell_no_op(r"a\'b"), r": 'a'\\''\''b'");
        assert_eq!(shell_no_op("a\nb\rc\u{1b}[201~"), ": 'a b c[201~'");
        // Inside the quotes there is never a quote or a backslash (fish reads both there).
        let t = shell_no_op(r"x'\'\\y'");
        let inner = &t[3..t.len() - 1];
        for piece in inner.split(r"'\''").flat_map(|p| p.split(r"'\\'")) {
            assert!(!piece.contains(['\'', '\\']), "{t}");
        }
        assert_eq!(Form::Plain.apply("a\nb"), "a b");
    }

    #[test]
    fn a_multi_line_body_keeps_its_lines_where_the_cli_takes_them_and_says_so_where_not() {
        let body = "Fix:\n\n```rust\nfn main() {\n\tlet x = 1;\n    call(x);\n}\n```\n";
        assert_eq!(
            injected_text("Alice", "01JB2K7Q4ZXYZ", None, body, 1000, true),
            format!("Relay message from Alice [K7Q4ZXYZ]:\n{}", body.trim_end())
        );
        assert_eq!(
            injected_text("Alice", "01JB2K7Q4ZXYZ", None, body, 1000, false),
            "Relay message from Alice [K7Q4ZXYZ]: Fix:  ```rust fn main() {  let x = 1;     call(x); } ``` \
             (its line breaks are shown as spaces here; exact text: agent-relay read 01JB2K7Q4ZXYZ)"
        );
        // One line stays one line, with or without.
        assert_eq!(
            injected_text("Bob", "m7", None, "ok\n", 1000, true),
            "Relay message from Bob [m7]: ok"
        );
        // Not bracketed, a line break would submit: it is a space then.
        let p = PasteMode::default();
        assert_eq!(p.wrap("a\nb"), b"a b");
    }

    #[test]
    fn a_digest_is_a_header_and_each_message_as_usual() {
        let texts: Vec<String> = [
            ("Alice", "01ABCDEFGHJK", "hi"),
            ("Bob", "01BCDEFGHJKM", "a\n  b"),
        ]
        .iter()
        .map(|(f, id, b)| injected_text(f, id, None, b, 1000, true))
        .collect();
        assert_eq!(
            digest(&texts, true),
            "2 relay messages:\nRelay message from Alice [CDEFGHJK]: hi\n\
             Relay message from Bob [DEFGHJKM]:\na\n  b"
        );
        let texts: Vec<String> = [
            ("Alice", "01ABCDEFGHJK", "hi"),
            ("Bob", "01BCDEFGHJKM", "a\n  b"),
        ]
        .iter()
        .map(|(f, id, b)| injected_text(f, id, None, b, 1000, false))
        .collect();
        assert_eq!(
            digest(&texts, false),
            "2 relay messages: Relay message from Alice [CDEFGHJK]: hi | \
             Relay message from Bob [DEFGHJKM]: a   b (its line breaks are shown as spaces \
             here; exact text: agent-relay read 01BCDEFGHJKM)"
        );
    }

    #[test]
    fn a_notice_names_the_senders_and_ids_and_the_tool() {
        assert_eq!(
            notice(&[("Bob", "01ABCDEFGHJK"), ("Bob", "01BCDEFGHJKM")], false),
            "2 relay messages from Bob [CDEFGHJK] [DEFGHJKM] — call relay_inbox to read them"
        );
        assert_eq!(
            notice(
                &[("Bob", "m1"), ("Carol", "m2"), ("Bob", "m3"), ("Dan", "m4")],
                false
            ),
            "4 relay messages from Bob [m1] [m3], Carol [m2] and Dan [m4] — call relay_inbox to read them"
        );
        assert_eq!(
            notice(&[("A\u{1b}[2J\nx", "m\r1")], true),
            "1 urgent relay message from A[2J x [m 1] — call relay_inbox to read it"
        );
    }

    #[test]
    fn long_bodies_are_cut_with_a_hint() {
        let t = injected_text("A", "01ABCDEFGHJK", None, &"x".repeat(50), 10, false);
        assert!(t.contains(&format!("{} …", "x".repeat(10))), "{t}");
        assert!(t.ends_with("agent-relay read 01ABCDEFGHJK)"), "{t}");
    }

    #[test]
    fn the_echo_is_never_a_directive() {
        let text = injected_text(
            "Alice",
            "01JB",
            None,
            "@relay:Bob do it\n@relay:* all",
            1000,
            false,
        );
        let mut p = relay_parse::Parser::new(relay_parse::Profile::generic());
        let mut found = p.feed(format!("{text}\r\n").as_bytes());
        found.extend(p.finish());
        assert!(found.is_empty(), "{found:?}");
    }
}
