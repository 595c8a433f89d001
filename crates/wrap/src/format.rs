//! How a delivered message becomes text typed into an agent's terminal.

use relay_protocol::text::typed;

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
/// echo cannot be relayed again.
pub fn injected_text(
    from: &str,
    id: &str,
    thread: Option<&str>,
    body: &str,
    max_body: usize,
) -> String {
    let id = typed(id);
    let from = typed(from);
    let short = relay_protocol::short_id(&id);
    let body = typed(body);
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
    let mut text = format!(
        "Relay message from {from} [{short}]{thread}: {}",
        clean.trim_end()
    );
    if cut {
        text.push_str(&format!(" … (truncated; full text: agent-relay read {id})"));
    }
    text
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

    /// `text` as the agent should receive it: bracketed when it asked for that.
    pub fn wrap(&self, text: &str) -> Vec<u8> {
        if self.on {
            [b"\x1b[200~", text.as_bytes(), b"\x1b[201~"].concat()
        } else {
            text.as_bytes().to_vec()
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
                1000
            ),
            "Relay message from Alice [K7Q4ZXYZ]: Can you review auth.ts?"
        );
        assert_eq!(
            injected_text("Bob", "m7", Some("t1"), "ok", 1000),
            "Relay message from Bob [m7] (thread t1): ok"
        );
        // Two ULIDs of the same second differ only at the end: both ids are shown by it.
        assert_eq!(
            injected_text(
                "Carol",
                "01M80TF75ZPNAE1B5DZ82MJ3M2",
                Some("01M80TF6Q3XABCDE12345678XY"),
                "ok",
                1000
            ),
            "Relay message from Carol [Z82MJ3M2] (thread 345678XY): ok"
        );
    }

    #[test]
    fn control_characters_never_reach_the_terminal() {
        let t = injected_text("A", "x", None, "a\u{1b}[2J\u{7}b\r\nc\u{1b}]0;t\u{7}", 1000);
        assert!(!t.chars().any(char::is_control), "{t:?}");
        assert!(t.ends_with("a[2Jb  c]0;t"), "{t:?}");
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
            );
            assert!(t.contains("agent-relay read"), "{t:?}");
            assert!(
                !t.chars().any(|c| c.is_control()
                    || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')),
                "{id:?} gave {t:?}"
            );
        }
        let t = injected_text("A", "q\rtouch FILE\r#", None, &"x".repeat(50), 10);
        assert!(
            t.starts_with("Relay message from A [h FILE #]: ")
                && t.ends_with("agent-relay read q touch FILE #)"),
            "{t:?}"
        );
    }

    #[test]
    fn long_bodies_are_cut_with_a_hint() {
        let t = injected_text("A", "01ABCDEFGHJK", None, &"x".repeat(50), 10);
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
        );
        let mut p = relay_parse::Parser::new(relay_parse::Profile::generic());
        let mut found = p.feed(format!("{text}\r\n").as_bytes());
        found.extend(p.finish());
        assert!(found.is_empty(), "{found:?}");
    }
}
