//! How a delivered message becomes text typed into an agent's terminal.

/// Shortest id prefix shown; `agent-relay read` accepts it (or the whole id when shorter).
const SHORT_ID: usize = 8;

/// The line typed into the recipient's terminal for one message:
/// `Relay message from Alice [01JB2K7Q]: body` (with ` (thread T)` when there is one).
///
/// The text is one line: control characters from the sender (escape sequences, bells,
/// carriage returns) are dropped and line breaks become spaces, so nothing a peer sends can
/// drive the recipient's terminal or submit early. A body longer than `max_body` characters is
/// cut, with a hint to read the rest. The line starts with `Relay message from`, which the
/// parser never reads as a directive, so its echo cannot be relayed again.
pub fn injected_text(
    from: &str,
    id: &str,
    thread: Option<&str>,
    body: &str,
    max_body: usize,
) -> String {
    let short: String = id.chars().take(SHORT_ID).collect();
    let mut clean = String::with_capacity(body.len().min(max_body + 16));
    let mut count = 0;
    let mut cut = false;
    for c in body.chars() {
        let c = match c {
            '\n' | '\r' | '\t' => ' ',
            c if c.is_control() => continue,
            c => c,
        };
        if count == max_body {
            cut = true;
            break;
        }
        clean.push(c);
        count += 1;
    }
    let thread = thread
        .map(|t| {
            let t: String = t.chars().filter(|c| !c.is_control()).take(64).collect();
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

#[cfg(test)]
mod tests {
    use super::*;

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
            "Relay message from Alice [01JB2K7Q]: Can you review auth.ts?"
        );
        assert_eq!(
            injected_text("Bob", "m7", Some("t1"), "ok", 1000),
            "Relay message from Bob [m7] (thread t1): ok"
        );
    }

    #[test]
    fn control_characters_never_reach_the_terminal() {
        let t = injected_text("A", "x", None, "a\u{1b}[2J\u{7}b\r\nc\u{1b}]0;t\u{7}", 1000);
        assert!(!t.chars().any(char::is_control), "{t:?}");
        assert!(t.ends_with("a[2Jb  c]0;t"), "{t:?}");
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
