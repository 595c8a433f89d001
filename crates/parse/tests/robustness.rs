//! Random and mutated input: the parser never panics and its memory stays bounded.
#![allow(
    clippy::expect_used,
    reason = "tests and benchmarks fail loudly on purpose"
)]

use proptest::prelude::*;
use relay_parse::{Parser, Profile};

/// What a parser may hold, whatever it is fed (see `Parser::buffered_bytes`).
const BOUND: usize = 8 << 20;

fn fixture_bytes() -> Vec<Vec<u8>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("fixtures dir") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "bin") {
            out.push(std::fs::read(path).expect("read"));
        }
    }
    out.sort();
    out
}

/// Bytes that are likely to matter: escapes, controls, UTF-8 pieces, directive syntax.
fn terminalish() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        any::<u8>().prop_map(|b| vec![b]),
        Just(b"\x1b[".to_vec()),
        Just(b"\x1b]".to_vec()),
        Just(b"\x1bP".to_vec()),
        Just(b"\x1b\\".to_vec()),
        Just(b"\x07".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(b"\x1b[1A\x1b[2K".to_vec()),
        Just(b"\x1b[2J".to_vec()),
        Just(b"\x1b[999;999H".to_vec()),
        Just(b"\x1b[38;5;".to_vec()),
        Just(b"\x1b[65535@".to_vec()),
        Just(b"\x1b[65535L".to_vec()),
        Just(b"\x1b[?1049h".to_vec()),
        Just(b"\x1b[?1049l".to_vec()),
        Just(b"@relay:Bob ".to_vec()),
        Just(b"[[RELAY]]{\"to\":\"Bob\",\"body\":\"".to_vec()),
        Just(b"[[/RELAY]]".to_vec()),
        Just(b"```".to_vec()),
        Just(b"<thinking>".to_vec()),
        Just("\u{25cf} ".as_bytes().to_vec()),
        Just(vec![0xe2, 0x97]),
        "[a-z ]{0,40}".prop_map(String::into_bytes),
    ];
    proptest::collection::vec(piece, 0..300).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn random_bytes_never_panic_and_stay_bounded(bytes in proptest::collection::vec(any::<u8>(), 0..4096), cut in 0usize..4096) {
        for profile in Profile::NAMES {
            let mut p = Parser::new(Profile::by_name(profile).expect("profile"));
            let cut = cut.min(bytes.len());
            p.feed(&bytes[..cut]);
            p.settle();
            p.feed(&bytes[cut..]);
            p.finish();
            prop_assert!(p.buffered_bytes() < BOUND);
        }
    }

    #[test]
    fn terminal_like_noise_never_panics_and_stays_bounded(bytes in terminalish(), injected in "[ -~]{0,80}") {
        let mut p = Parser::new(Profile::claude());
        p.note_injected(&injected);
        p.set_rows(7);
        for chunk in bytes.chunks(97) {
            p.feed(chunk);
            prop_assert!(p.buffered_bytes() < BOUND);
        }
        p.begin_replay();
        p.feed(&bytes);
        p.finish();
        prop_assert!(p.buffered_bytes() < BOUND);
    }

    #[test]
    fn mutated_fixtures_never_panic(seed in any::<u64>(), flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..64)) {
        let all = fixture_bytes();
        let mut bytes = all[(seed as usize) % all.len()].clone();
        for (at, b) in flips {
            let i = at % bytes.len().max(1);
            match b % 3 {
                0 => bytes[i] = b,
                1 => { bytes.insert(i, b); }
                _ => { bytes.remove(i); }
            }
        }
        let mut p = Parser::new(Profile::claude());
        p.feed(&bytes);
        p.finish();
        prop_assert!(p.buffered_bytes() < BOUND);
    }
}

/// Hours of output in a few seconds: a long-running agent does not grow the parser.
#[test]
fn memory_does_not_grow_with_the_length_of_the_stream() {
    let all = fixture_bytes();
    let mut p = Parser::new(Profile::claude());
    let mut peak = 0;
    for round in 0..200 {
        for f in &all {
            p.feed(f);
        }
        p.feed(b"\x1b[38;5;1m");
        p.feed("x".repeat(10_000).as_bytes());
        p.feed(b"[[RELAY]]{\"to\":\"Bob\",\"body\":\"unterminated\r\n");
        if round % 10 == 0 {
            p.settle();
        }
        peak = peak.max(p.buffered_bytes());
    }
    assert!(peak < BOUND, "peak {peak}");
}

/// The worst case: the largest live region, every row full, on both screens.
#[test]
fn memory_bound_holds_in_the_worst_case() {
    let mut p = Parser::new(Profile::claude());
    p.set_rows(10_000);
    let line = format!("{}\r\n", "\u{25cf}".repeat(3000));
    for screen in [&b"\x1b[?1049l"[..], b"\x1b[?1049h"] {
        p.feed(screen);
        for _ in 0..300 {
            p.feed(line.as_bytes());
            p.feed(b"\x1b[5@\x1b[1A\x1b[999C\t\tx\r\n");
        }
        p.feed("@relay:Bob ".as_bytes());
        p.feed("y ".repeat(20_000).as_bytes());
        p.feed(b"\r\n[[RELAY]]{\"to\":\"Bob\",\"body\":\"");
        for _ in 0..1000 {
            p.feed("z".repeat(100).as_bytes());
            p.feed(b"\r\n");
        }
    }
    for i in 0..100 {
        p.note_injected(&"w".repeat(20_000 + i));
    }
    assert!(p.buffered_bytes() < BOUND, "{}", p.buffered_bytes());
}
