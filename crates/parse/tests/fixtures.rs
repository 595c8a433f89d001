//! Snapshot tests over the fixture corpus in `tests/fixtures/`.
//!
//! Every `NAME.bin` there is a raw terminal byte stream; `NAME.expected.jsonl` holds the
//! directives it must give, one JSON object per line: for real captures, what the wrapper
//! reports replaying the capture with its pauses (see `Fixture::reference`). The profile is the first word of the
//! name (after `synthetic-`). Real captures also have `NAME.timing` (written by `record.py`):
//! when each read arrived, the terminal height at the start and after each resize, and what
//! the relay injected, which the harness passes on with `set_rows` and `note_injected` as the
//! wrapper would. Run with `UPDATE_FIXTURES=1` to
//! rewrite the expectations, then review the diff.
#![allow(
    clippy::expect_used,
    reason = "tests and benchmarks fail loudly on purpose"
)]

use std::path::{Path, PathBuf};

use proptest::prelude::*;
use relay_parse::{Directive, Parser, Profile};

struct Fixture {
    path: PathBuf,
    bytes: Vec<u8>,
    profile: Profile,
    /// (byte offset, milliseconds) of every read, for real captures.
    reads: Vec<(usize, u64)>,
    /// (byte offset, rows): the terminal height from there on, for real captures.
    sizes: Vec<(usize, usize)>,
    /// (byte offset, text): what the relay injected there (a bracketed paste).
    injections: Vec<(usize, String)>,
}

impl Fixture {
    fn name(&self) -> String {
        self.path.display().to_string()
    }

    /// Whether the program draws on the alternate screen (a full-screen TUI such as Codex
    /// CLI): text that scrolls inside it never leaves the live region, so it is read only at
    /// the pauses a wrapper sees, not from the file alone.
    fn full_screen(&self) -> bool {
        self.bytes.windows(8).any(|w| w == b"\x1b[?1049h")
    }

    /// The reference result: what the wrapper would report (settling after pauses of 500 ms)
    /// for real captures, the whole file read at once for the others.
    fn reference(&self) -> Vec<Directive> {
        let quiet = (!self.reads.is_empty()).then_some(500);
        run(self, &[], quiet, None)
    }

    fn is_synthetic_claude(&self) -> bool {
        self.path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("synthetic-claude"))
    }
}

/// The parse profile `name` with the busy markers of the wrapper's profile file of that name
/// (`crates/wrap/profiles/NAME.toml`), where they are written once.
fn profile(name: &str) -> Profile {
    let base = Profile::by_name(name).unwrap_or_else(|| panic!("no profile {name}"));
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../wrap/profiles/{name}.toml"));
    let text = std::fs::read_to_string(&file).expect("profile file");
    let table: toml::Table = toml::from_str(&text).expect("profile TOML");
    let busy = table
        .get("busy")
        .and_then(toml::Value::as_array)
        .map(|v| v.iter().filter_map(toml::Value::as_str).collect::<Vec<_>>())
        .unwrap_or_default();
    base.with_busy_markers(busy)
}

fn fixtures() -> Vec<Fixture> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("fixtures dir")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "bin"))
        .collect();
    paths.sort();
    assert!(paths.len() >= 5, "fixture corpus is missing: {paths:?}");
    paths
        .into_iter()
        .map(|path| {
            let bytes = std::fs::read(&path).expect("read fixture");
            let stem = path
                .file_stem()
                .and_then(|s| s.to_str())
                .expect("utf-8 name");
            let stem = stem.strip_prefix("synthetic-").unwrap_or(stem);
            let first = stem.split('-').next().unwrap_or("");
            let profile = profile(first);
            let timing = std::fs::read_to_string(path.with_extension("timing")).unwrap_or_default();
            let mut reads = Vec::new();
            let mut sizes = Vec::new();
            let mut injections = Vec::new();
            for line in timing.lines() {
                let mut words = line.splitn(3, ' ');
                let offset: usize = words.next().and_then(|w| w.parse().ok()).expect("offset");
                let ms: u64 = words.next().and_then(|w| w.parse().ok()).expect("ms");
                match words.next() {
                    None => reads.push((offset, ms)),
                    Some(w) => {
                        if let Some(rows) = w.strip_prefix("rows=") {
                            sizes.push((offset, rows.parse().expect("rows")));
                        } else if let Some(json) = w.strip_prefix("inject=") {
                            injections.push((offset, serde_json::from_str(json).expect("json")));
                        }
                    }
                }
            }
            Fixture {
                path,
                bytes,
                profile,
                reads,
                sizes,
                injections,
            }
        })
        .collect()
}

enum Step {
    Rows(usize),
    Settle,
    Inject(String),
}

/// Feeds a fixture: in pieces of `chunks` (cycled; empty: whole), with the recorded terminal
/// heights (or a fixed `rows`), calling `settle` after recorded pauses of `quiet_ms` or more.
fn run(
    f: &Fixture,
    chunks: &[usize],
    quiet_ms: Option<u64>,
    rows: Option<usize>,
) -> Vec<Directive> {
    let (mut out, rest) = run_split(f, chunks, quiet_ms, rows);
    out.extend(rest);
    out
}

/// Like [`run`], but returns what came before `finish` and what `finish` added apart.
fn run_split(
    f: &Fixture,
    chunks: &[usize],
    quiet_ms: Option<u64>,
    rows: Option<usize>,
) -> (Vec<Directive>, Vec<Directive>) {
    let mut p = Parser::new(f.profile.clone());
    let mut steps: Vec<(usize, Step)> = Vec::new();
    match rows {
        Some(r) => p.set_rows(r),
        None => steps.extend(f.sizes.iter().map(|&(o, r)| (o, Step::Rows(r)))),
    }
    if let Some(q) = quiet_ms {
        for w in f.reads.windows(2) {
            if w[1].1.saturating_sub(w[0].1) >= q {
                steps.push((w[1].0, Step::Settle));
            }
        }
    }
    steps.extend(
        f.injections
            .iter()
            .map(|(o, t)| (*o, Step::Inject(t.clone()))),
    );
    steps.sort_by_key(|s| s.0);
    let len = f.bytes.len();
    let mut out = Vec::new();
    let (mut pos, mut ci, mut si) = (0, 0, 0);
    loop {
        while si < steps.len() && steps[si].0 <= pos {
            match steps[si].1 {
                Step::Rows(r) => p.set_rows(r),
                Step::Settle => out.extend(p.settle()),
                Step::Inject(ref text) => p.note_injected(text),
            }
            si += 1;
        }
        if pos >= len {
            break;
        }
        let mut end = len;
        if !chunks.is_empty() {
            end = end.min(pos + chunks[ci % chunks.len()].max(1));
            ci += 1;
        }
        if let Some((o, _)) = steps.get(si) {
            end = end.min(*o);
        }
        out.extend(p.feed(&f.bytes[pos..end]));
        pos = end;
        assert!(p.buffered_bytes() < 8 << 20);
    }
    (out, p.finish())
}

fn to_jsonl(ds: &[Directive]) -> String {
    ds.iter()
        .map(|d| serde_json::to_string(d).expect("json") + "\n")
        .collect()
}

#[test]
fn every_fixture_matches_its_snapshot() {
    let update = std::env::var_os("UPDATE_FIXTURES").is_some();
    let mut failures = Vec::new();
    for f in fixtures() {
        let got = to_jsonl(&f.reference());
        let expected_path = f.path.with_extension("expected.jsonl");
        if update {
            std::fs::write(&expected_path, &got).expect("write snapshot");
            continue;
        }
        let expected = std::fs::read_to_string(&expected_path).unwrap_or_default();
        if got != expected {
            failures.push(format!(
                "{}:\n--- expected\n{expected}--- got\n{got}",
                f.name()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Claude Code draws a ```` ```text ```` or ```` ```sh ```` block like prose (fixtures
/// `claude-fences-*`: their snapshots hold the lines read off the screen, quoted ones
/// included). Checked against the reply's Markdown in the session's transcript, only what the
/// reply says is left: the quoted lines are dropped, and a line both quoted and said is sent
/// once. The wrapper does the same with the live transcript.
#[test]
fn claude_transcript_drops_what_a_reply_only_quotes() {
    use relay_parse::transcript::{Origin, ReplySource, claude_reply_text};
    let mut checked = 0;
    for f in fixtures() {
        let transcript = f.path.with_extension("transcript.jsonl");
        let Ok(lines) = std::fs::read_to_string(&transcript) else {
            continue;
        };
        let mut source = ReplySource::new();
        for line in lines.lines() {
            if let Some(reply) = claude_reply_text(line) {
                source.add_reply(&reply);
            }
        }
        // Of two identical lines, one quoted and one said, the first shown is the one sent:
        // same recipient, same text, so which cannot matter; compare sorted.
        let mut sent: Vec<String> = f
            .reference()
            .into_iter()
            .filter(|d| source.check(d) != Origin::Quoted)
            .map(|d| format!("{} {}", d.to, d.body))
            .collect();
        sent.sort();
        assert_eq!(
            sent,
            ["Bob Please review auth.ts", "Carol the real one"],
            "{}",
            f.name()
        );
        // Everything the reply says was on the screen: nothing is left to send from the
        // transcript (issue 19.2), whether it was read before the screen ...
        assert_eq!(source.take_unseen(), [], "{}", f.name());
        // ... or after.
        let mut late = ReplySource::new();
        for d in f.reference() {
            assert_eq!(late.check(&d), Origin::Unknown);
        }
        for line in lines.lines() {
            if let Some(reply) = claude_reply_text(line) {
                late.add_reply(&reply);
            }
        }
        assert_eq!(late.take_unseen(), [], "{}", f.name());
        checked += 1;
    }
    assert_eq!(checked, 2, "claude-fences-328 and claude-fences-197");
}

#[test]
fn every_fixture_gives_the_same_result_fed_one_byte_at_a_time() {
    for f in fixtures() {
        let whole = run(&f, &[], None, None);
        assert_eq!(run(&f, &[1], None, None), whole, "{}", f.name());
    }
}

/// Real captures: feeding the reads as they came and calling `settle` wherever the output
/// paused for 150 ms to 1 s, as the wrapper does, gives the same directives; and unless the
/// program is full-screen, so does reading the whole file at once.
#[test]
fn replaying_the_recorded_pauses_with_settle_changes_nothing() {
    for f in fixtures() {
        if f.reads.is_empty() {
            continue;
        }
        let whole = f.reference();
        if !f.full_screen() {
            let file = run(&f, &[], None, None);
            assert_eq!(to_jsonl(&file), to_jsonl(&whole), "{} read whole", f.name());
        }
        for quiet_ms in [150, 300, 1000] {
            let got = run(&f, &[], Some(quiet_ms), None);
            assert_eq!(
                to_jsonl(&got),
                to_jsonl(&whole),
                "{} settling after {quiet_ms} ms",
                f.name()
            );
        }
    }
}

/// With the wrapper's settle after a quarter second of quiet, every directive of a real capture
/// is delivered while the program runs: nothing waits for the end of the stream.
#[test]
fn pauses_alone_deliver_every_directive() {
    for f in fixtures() {
        if f.reads.is_empty() {
            continue;
        }
        let (before, at_finish) = run_split(&f, &[], Some(250), None);
        assert!(!before.is_empty(), "{}", f.name());
        assert_eq!(
            at_finish,
            [],
            "{}: waited for the end of the stream",
            f.name()
        );
    }
}

/// The synthetic Claude-style fixtures go quiet after each finished turn; a wrapper would call
/// `settle` there, and that must not change what is reported.
#[test]
fn settling_at_the_end_of_each_synthetic_turn_changes_nothing() {
    for f in fixtures() {
        if !f.is_synthetic_claude() {
            continue;
        }
        let bytes = &f.bytes;
        let whole = run(&f, &[], None, None);
        let mut p = Parser::new(f.profile.clone());
        let mut out = Vec::new();
        let idle = b"? for shortcuts\x1b[0m\r\n";
        let baked = "Baked for".as_bytes();
        let mut start = 0;
        let mut seen_baked = false;
        for i in 0..bytes.len() {
            if bytes[i..].starts_with(baked) {
                seen_baked = true;
            }
            if seen_baked && bytes[..=i].ends_with(idle) {
                out.extend(p.feed(&bytes[start..=i]));
                out.extend(p.settle());
                start = i + 1;
                seen_baked = false;
            }
        }
        out.extend(p.feed(&bytes[start..]));
        out.extend(p.finish());
        assert_eq!(to_jsonl(&out), to_jsonl(&whole), "{}", f.name());
    }
}

/// Fixtures without a recorded size: with a real terminal's height, rows scroll out of the
/// live region and become final while the stream goes on (instead of at the end); the
/// directives must be the same.
#[test]
fn a_small_live_region_gives_the_same_result() {
    for f in fixtures() {
        if !f.sizes.is_empty() {
            continue;
        }
        let whole = run(&f, &[], None, None);
        for rows in [24, 40] {
            let got = run(&f, &[], None, Some(rows));
            assert_eq!(
                to_jsonl(&got),
                to_jsonl(&whole),
                "{} with {rows} rows",
                f.name()
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn any_chunking_of_any_fixture_gives_the_same_result(
        sizes in proptest::collection::vec(1usize..400, 1..40),
    ) {
        for f in fixtures() {
            let whole = run(&f, &[], None, None);
            prop_assert_eq!(run(&f, &sizes, None, None), whole, "{}", f.name());
        }
    }

    #[test]
    fn any_terminal_height_and_chunking_gives_the_same_result(
        rows in 20usize..150,
        sizes in proptest::collection::vec(1usize..400, 1..40),
    ) {
        for f in fixtures() {
            if !f.sizes.is_empty() {
                continue;
            }
            let whole = run(&f, &[], None, None);
            let got = run(&f, &sizes, None, Some(rows));
            prop_assert_eq!(to_jsonl(&got), to_jsonl(&whole), "{} with {} rows", f.name(), rows);
        }
    }

    #[test]
    fn settling_at_recorded_pauses_in_any_chunking_changes_nothing(
        quiet_ms in 50u64..2000,
        sizes in proptest::collection::vec(1usize..400, 1..40),
    ) {
        for f in fixtures() {
            if f.reads.is_empty() {
                continue;
            }
            let whole = f.reference();
            let got = run(&f, &sizes, Some(quiet_ms), None);
            prop_assert_eq!(to_jsonl(&got), to_jsonl(&whole), "{} settling after {} ms", f.name(), quiet_ms);
        }
    }
}

/// What the screen model shows must be what a real terminal shows, or readiness and the check
/// that a typed message was submitted read the wrong rows. `NAME.screens.txt` holds what tmux
/// showed (`capture-pane`, and the cursor) after being fed the capture up to given offsets,
/// resized where the capture was: blocks of `@@ offset=N rows=R cursor=ROW,COL` and R rows.
/// Codex CLI drawn inline (`codex-inline`, `--no-alt-screen`) writes its history through a
/// scrolling region above its input box: a model without scrolling regions showed the box
/// rows scrambled.
#[test]
fn screens_match_what_a_real_terminal_showed() {
    let mut checked = 0;
    for f in fixtures() {
        let Ok(text) = std::fs::read_to_string(f.path.with_extension("screens.txt")) else {
            continue;
        };
        // (offset, rows, cursor, the rows tmux showed)
        type Block = (usize, usize, (usize, usize), Vec<String>);
        let mut blocks: Vec<Block> = Vec::new();
        for line in text.lines() {
            if let Some(head) = line.strip_prefix("@@ ") {
                let field = |k: &str| {
                    head.split(' ')
                        .find_map(|kv| kv.strip_prefix(k))
                        .unwrap_or_else(|| panic!("{}: no {k} in {head}", f.name()))
                };
                let (r, c) = field("cursor=").split_once(',').expect("cursor=ROW,COL");
                blocks.push((
                    field("offset=").parse().expect("offset"),
                    field("rows=").parse().expect("rows"),
                    (r.parse().expect("row"), c.parse().expect("col")),
                    Vec::new(),
                ));
            } else if let Some(b) = blocks.last_mut() {
                b.3.push(line.to_owned());
            }
        }
        let mut parser = Parser::new(f.profile.clone());
        let mut at = 0;
        for (offset, rows, cursor, expected) in blocks {
            // Feed read by read, resizing where the capture did, as the wrapper would.
            let mut cuts: Vec<usize> = f.reads.iter().map(|r| r.0).collect();
            cuts.extend(f.sizes.iter().map(|s| s.0));
            cuts.push(offset);
            cuts.sort_unstable();
            cuts.dedup();
            let from = at;
            for cut in cuts.into_iter().filter(|&c| c > from && c <= offset) {
                if let Some(&(_, r)) = f.sizes.iter().rev().find(|s| s.0 <= at) {
                    parser.set_rows(r);
                }
                parser.feed(&f.bytes[at..cut]);
                at = cut;
            }
            let screen = parser.screen();
            let mut got = screen.lines.clone();
            got.resize(rows, String::new());
            assert_eq!(
                got.join("\n"),
                expected.join("\n"),
                "{} at byte {offset}",
                f.name()
            );
            assert_eq!(
                (screen.cursor_row, screen.cursor_col),
                cursor,
                "{} cursor at byte {offset}",
                f.name()
            );
            checked += 1;
        }
    }
    assert!(checked >= 3, "no screens were checked");
}
