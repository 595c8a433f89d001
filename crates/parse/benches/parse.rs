//! Parsing throughput on a large realistic capture: the fixture corpus repeated to ~24 MB.
//!
//! Run: `CARGO_BUILD_JOBS=1 cargo bench -p relay-parse`.
#![allow(
    clippy::expect_used,
    reason = "tests and benchmarks fail loudly on purpose"
)]

use divan::counter::BytesCount;
use relay_parse::{Parser, Profile};

fn main() {
    divan::main();
}

fn corpus(prefixes: &[&str]) -> Vec<u8> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("fixtures dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "bin")
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| prefixes.iter().any(|pre| n.starts_with(pre)))
        })
        .collect();
    files.sort();
    let one: Vec<u8> = files
        .iter()
        .flat_map(|p| std::fs::read(p).expect("read"))
        .collect();
    let mut out = Vec::with_capacity(24 << 20);
    while out.len() < 24 << 20 {
        out.extend_from_slice(&one);
    }
    out
}

fn run(profile: Profile, input: &[u8]) -> usize {
    let mut p = Parser::new(profile);
    let mut n = 0;
    for chunk in input.chunks(64 * 1024) {
        n += p.feed(chunk).len();
    }
    n + p.finish().len()
}

/// Claude Code output: the real capture and the synthetic Ink-style ones (spinner redraws, a
/// live region erased on every frame, cursor-addressed diffs, resizes).
#[divan::bench(sample_count = 10)]
fn claude_style(bencher: divan::Bencher<'_, '_>) {
    let input = corpus(&["claude-", "synthetic-claude"]);
    bencher
        .counter(BytesCount::of_slice(&input))
        .bench(|| run(Profile::claude(), divan::black_box(&input)));
}

/// The whole corpus: real Claude Code, bash and Python captures plus the synthetic ones.
#[divan::bench(sample_count = 10)]
fn all_fixtures(bencher: divan::Bencher<'_, '_>) {
    let input = corpus(&[""]);
    bencher
        .counter(BytesCount::of_slice(&input))
        .bench(|| run(Profile::generic(), divan::black_box(&input)));
}
