//! The decision core's sources name no I/O. A text check, not a proof (a fully qualified path
//! spelt another way would pass it): it keeps the room's rule from eroding one convenient
//! call at a time. Comment lines are skipped (they may say what the room does not do), and so
//! is a file's inline unit-test module (tests may take a real clock's `now` to start from).

/// Every source file of the room except the tests' own, by path.
const SOURCES: &[(&str, &str)] = &[
    ("mod.rs", include_str!("mod.rs")),
    ("chain.rs", include_str!("chain.rs")),
    ("effect.rs", include_str!("effect.rs")),
    ("ledger.rs", include_str!("ledger.rs")),
    ("notices.rs", include_str!("notices.rs")),
    ("outbox.rs", include_str!("outbox.rs")),
    ("quiet.rs", include_str!("quiet.rs")),
    ("resume.rs", include_str!("resume.rs")),
    ("core/mod.rs", include_str!("core/mod.rs")),
    ("core/deliver.rs", include_str!("core/deliver.rs")),
];

/// What the core must not name: waiting, a runtime, a clock read, files, sockets, processes,
/// threads, tmux, and the wrapper's own file and terminal calls.
const FORBIDDEN: &[&str] = &[
    ".await",
    "async ",
    "tokio",
    "Instant::now",
    "SystemTime",
    "now_ms(",
    "now_instant(",
    "std::fs",
    "std::io",
    "std::net",
    "std::os",
    "std::process",
    "std::thread",
    "UnixStream",
    "UnixListener",
    "tmux::",
    "Pane",
    "crate::pty",
    "crate::tmux",
    "crate::door",
    "crate::link",
    "crate::shell",
    "crate::transcript",
    "terminal::Terminal",
    "load_injected",
    "append_injected",
    "append_inbox",
    "write_atomically",
    ".save(",
    "Checkpoint::load",
];

#[test]
fn the_decision_core_names_no_await_clock_file_socket_or_terminal() {
    let mut found = Vec::new();
    for (file, text) in SOURCES {
        let code = text
            .split("#[cfg(test)]\nmod tests {")
            .next()
            .unwrap_or(text);
        for (n, line) in code.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            for word in FORBIDDEN {
                if line.contains(word) {
                    found.push(format!("decide/{file}:{}: {word}: {}", n + 1, line.trim()));
                }
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}
