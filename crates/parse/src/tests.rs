//! Whole-pipeline tests: bytes in, directives out.

use super::*;

fn run(profile: Profile, input: &[u8]) -> Vec<Directive> {
    let mut p = Parser::new(profile);
    let mut out = p.feed(input);
    out.extend(p.finish());
    out
}

fn bodies(ds: &[Directive]) -> Vec<String> {
    ds.iter().map(|d| format!("{}:{}", d.to, d.body)).collect()
}

#[test]
fn directive_split_across_chunks_at_every_byte() {
    let input = "\x1b[38;5;12m●\x1b[39m @relay:Bób héllo wörld\r\n$ ".as_bytes();
    let whole = run(Profile::claude(), input);
    assert_eq!(bodies(&whole), ["Bób:héllo wörld"]);
    for cut in 0..input.len() {
        let mut p = Parser::new(Profile::claude());
        let mut out = p.feed(&input[..cut]);
        out.extend(p.feed(&input[cut..]));
        out.extend(p.finish());
        assert_eq!(out, whole, "cut at {cut}");
    }
}

#[test]
fn cursor_forward_between_words_keeps_the_space() {
    let out = run(
        Profile::generic(),
        b"@relay:Bob\x1b[1Chello\x1b[1Cthere\r\n",
    );
    assert_eq!(bodies(&out), ["Bob:hello there"]);
}

#[test]
fn a_spinner_redraw_reports_the_directive_once() {
    let mut input = "\u{25cf} @relay:Bob done\r\n\r\n* Working\r\n"
        .as_bytes()
        .to_vec();
    for i in 0..20 {
        input.extend_from_slice(
            format!("\x1b[1A\x1b[2K\r* Working {i} (esc to interrupt)\r\n").as_bytes(),
        );
    }
    let out = run(Profile::claude(), &input);
    assert_eq!(bodies(&out), ["Bob:done"]);
}

#[test]
fn a_redrawn_live_region_is_read_when_it_settles_and_not_again() {
    // Ink style: the live region is erased and drawn again on every frame.
    let mut p = Parser::new(Profile::claude());
    let frame = |text: &str| {
        let erase = "\x1b[2K\x1b[1A".repeat(3);
        format!("{erase}\x1b[2K\r{text}\r\n\r\n\u{273b} status\r\n")
    };
    let mut out = p.feed(b"\r\n\r\n\r\n");
    out.extend(p.feed(frame("\u{25cf} @relay:Bob Can you rev").as_bytes()));
    out.extend(p.feed(frame("\u{25cf} @relay:Bob Can you review auth.ts?").as_bytes()));
    assert!(
        out.is_empty(),
        "nothing is final while it is redrawn: {out:?}"
    );
    out.extend(p.settle());
    assert_eq!(bodies(&out), ["Bob:Can you review auth.ts?"]);
    // More frames with the same text, then quiet again: nothing new.
    out.extend(p.feed(frame("\u{25cf} @relay:Bob Can you review auth.ts?").as_bytes()));
    out.extend(p.settle());
    out.extend(p.finish());
    assert_eq!(out.len(), 1);
}

#[test]
fn a_reprint_after_clear_screen_is_not_reported_again() {
    let turn = "\u{276f} ping\r\n\r\n\u{25cf} @relay:Bob pong\r\n\r\n";
    let mut p = Parser::new(Profile::claude());
    let mut out = p.feed(turn.as_bytes());
    out.extend(p.feed(turn.as_bytes()));
    out.extend(p.settle());
    assert_eq!(
        out.len(),
        2,
        "the same directive in two turns is two directives"
    );
    // Resize: clear everything and print the transcript again, at once.
    out.extend(p.feed(format!("\x1b[2J\x1b[3J\x1b[H{turn}{turn}").as_bytes()));
    out.extend(p.settle());
    assert_eq!(out.len(), 2, "the re-print is not new: {out:?}");
    // A later turn printing it again is new.
    out.extend(p.feed(turn.as_bytes()));
    out.extend(p.finish());
    assert_eq!(out.len(), 3);
}

#[test]
fn a_reprint_with_new_content_reports_only_the_new_part() {
    let mut p = Parser::new(Profile::generic());
    let mut out = p.feed(b"@relay:Bob one\r\n\r\n");
    out.extend(p.settle());
    out.extend(p.feed(b"\x1bc@relay:Bob one\r\n\r\n@relay:Bob two\r\n\r\n"));
    out.extend(p.finish());
    assert_eq!(bodies(&out), ["Bob:one", "Bob:two"]);
}

#[test]
fn rereading_a_pane_after_begin_replay_reports_nothing_old() {
    let pane = b"$ ./agent\r\n@relay:Bob a\r\n\r\n@relay:Carol b\r\n$ ";
    let mut p = Parser::new(Profile::shell());
    let mut out = p.feed(pane);
    out.extend(p.settle());
    assert_eq!(out.len(), 2);
    p.begin_replay();
    out.extend(p.feed(b"\r\n"));
    out.extend(p.feed(pane));
    out.extend(p.feed(b"\r\n@relay:Dave c\r\n"));
    out.extend(p.finish());
    assert_eq!(bodies(&out), ["Bob:a", "Carol:b", "Dave:c"]);
}

#[test]
fn injected_text_echo_is_not_a_directive_and_starts_a_turn() {
    let mut p = Parser::new(Profile::claude());
    p.note_injected("Relay message from Alice: please ask\n@relay:Carol what time is it");
    let mut out = p.feed(
        "\u{276f} Relay message from Alice: please ask\r\n  @relay:Carol what time is it\r\n\r\n"
            .as_bytes(),
    );
    out.extend(p.feed(b"@relay:Carol what time is it\r\n\r\n"));
    out.extend(p.feed("\u{25cf} @relay:Alice it is noon\r\n".as_bytes()));
    out.extend(p.finish());
    assert_eq!(bodies(&out), ["Alice:it is noon"]);
}

#[test]
fn code_block_shown_without_fences_in_a_colour_is_code() {
    let input = "\u{25cf} Example:\r\n\r\n  \x1b[38;5;246m@relay:Bob not me\x1b[39m\r\n\r\n  @relay:Bob me\r\n";
    assert_eq!(
        bodies(&run(Profile::claude(), input.as_bytes())),
        ["Bob:me"]
    );
    assert_eq!(
        bodies(&run(Profile::generic(), input.as_bytes())),
        ["Bob:not me", "Bob:me"]
    );
}

#[test]
fn fence_state_is_kept_across_chunks() {
    let mut p = Parser::new(Profile::generic());
    let mut out = p.feed(b"``");
    out.extend(p.feed(b"`py\r\n@relay:Bob no\r\n"));
    out.extend(p.feed(b"```\r\n@relay:Bob yes\r\n"));
    out.extend(p.finish());
    assert_eq!(bodies(&out), ["Bob:yes"]);
}

#[test]
fn directive_serializes_to_the_documented_json() {
    let out = run(
        Profile::generic(),
        br#"[[RELAY]]{"to":"*","type":"state","body":"green","thread":"t"}[[/RELAY]]"#,
    );
    let json = serde_json::to_string(&out[0]).unwrap();
    assert_eq!(
        json,
        r#"{"to":"*","kind":"state","body":"green","thread":"t"}"#
    );
    let out = run(Profile::generic(), b"@thinking:Bob hmm\n");
    assert_eq!(
        serde_json::to_string(&out[0]).unwrap(),
        r#"{"to":"Bob","kind":"thinking","body":"hmm"}"#
    );
}

#[test]
fn lines_scrolling_out_are_reported_without_settle() {
    let mut p = Parser::new(Profile::generic());
    p.set_rows(5);
    let mut input = b"@relay:Bob early\r\n\r\n".to_vec();
    for i in 0..10 {
        input.extend_from_slice(format!("line {i}\r\n").as_bytes());
    }
    assert_eq!(bodies(&p.feed(&input)), ["Bob:early"]);
}

#[test]
fn memory_stays_bounded_on_long_output() {
    let mut p = Parser::new(Profile::claude());
    let line = "x".repeat(5000);
    for _ in 0..2000 {
        p.feed(line.as_bytes());
        p.feed(b"\r\n\x1b[1A\x1b[2K@relay:Bob y\r\n");
        p.feed(b"[[RELAY]]{\"to\":\"Bob\",\"body\":\"");
    }
    assert!(p.buffered_bytes() < 8 << 20, "{}", p.buffered_bytes());
}

/// The fast path in `Parser::advance` must do exactly what vte does.
#[test]
fn fast_path_matches_plain_vte_on_every_fixture_and_on_noise() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut inputs: Vec<Vec<u8>> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "bin"))
        .map(|p| std::fs::read(p).unwrap())
        .collect();
    inputs.push(
        b"a\xe2\x97\x8f\xe2\x97b\xc2\x9b1A\x90q\x9c\x7f\x18\x1b[31m\x1b]0;t\x1b\\@relay:Bob x\r\n"
            .to_vec(),
    );
    for input in inputs {
        for chunk in [1, 3, 7, 4096] {
            let mut fast = Parser::new(Profile::claude());
            let mut slow = Parser::new(Profile::claude());
            slow.fast_path = false;
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for piece in input.chunks(chunk) {
                a.extend(fast.feed(piece));
                b.extend(slow.feed(piece));
                assert_eq!(fast.screen.out, slow.screen.out);
            }
            a.extend(fast.finish());
            b.extend(slow.finish());
            assert_eq!(a, b);
            assert_eq!(format!("{:?}", fast.screen), format!("{:?}", slow.screen));
        }
    }
}

#[test]
fn a_clear_screen_ends_an_open_fence() {
    let out = run(
        Profile::generic(),
        b"```\r\n@relay:Bob no\r\n\x1b[2J\x1b[H@relay:Bob yes\r\n",
    );
    assert_eq!(bodies(&out), ["Bob:yes"]);
}

#[test]
fn a_directive_cut_by_a_clear_is_reported_whole_from_the_reprint() {
    // A TUI that wraps its own rows, width unknown: the indented rows are the rest of the line.
    let mut p = Parser::new(Profile::claude());
    p.set_rows(3);
    // The head scrolls out (final); the continuation is still live when the screen clears.
    let mut out = p.feed(b"@relay:Bob one two\r\n  three four\r\n\r\n");
    out.extend(p.feed(b"\x1b[2J\x1b[3J\x1b[H@relay:Bob one two three\r\n  four\r\n\r\n"));
    out.extend(p.finish());
    assert_eq!(bodies(&out), ["Bob:one two three four"]);
}

#[test]
fn a_directive_cut_by_a_clear_without_reprint_is_still_reported() {
    let mut p = Parser::new(Profile::generic());
    p.set_rows(2);
    let mut out = p.feed(b"@relay:Bob head\r\n  tail\r\n");
    out.extend(p.feed(b"\x1b[2J\x1b[H@relay:Carol other\r\n"));
    out.extend(p.finish());
    assert_eq!(bodies(&out), ["Bob:head", "Carol:other"]);
}

#[test]
fn settle_reads_nothing_while_the_agent_shows_it_is_working() {
    let mut p = Parser::new(Profile::claude().with_busy_markers(["Esc to interrupt"]));
    p.set_rows(10);
    let status = "\u{273d} Working\u{2026} (esc to interrupt)";
    let mut out = p.feed(format!("\u{25cf} @relay:Bob first half\r\n{status}\r\n").as_bytes());
    out.extend(p.settle());
    assert!(
        out.is_empty(),
        "a pause while working is not the end: {out:?}"
    );
    // The reply goes on over the status line; then the pause means done.
    out.extend(
        p.feed("\x1b[1A\x1b[2K  and the second half\r\n\r\n\u{273b} Worked for 2s\r\n".as_bytes()),
    );
    out.extend(p.settle());
    assert_eq!(bodies(&out), ["Bob:first half and the second half"]);
}

#[test]
fn a_profile_without_busy_markers_settles_whatever_the_screen_shows() {
    // Busy markers are data handed in by whoever loaded the profile file, none by default.
    let mut p = Parser::new(Profile::claude());
    p.set_rows(10);
    let status = "\u{273d} Working\u{2026} (esc to interrupt)";
    let mut out = p.feed(format!("\u{25cf} @relay:Bob first half\r\n{status}\r\n").as_bytes());
    out.extend(p.settle());
    assert_eq!(bodies(&out), ["Bob:first half"]);
}

#[test]
fn settle_keeps_a_directive_open_while_its_next_line_is_still_being_written() {
    let mut p = Parser::new(Profile::generic());
    let mut out = p.feed(b"  @relay:Bob one\r\n    two");
    out.extend(p.settle());
    assert!(out.is_empty());
    out.extend(p.feed(b" three\r\n\r\n"));
    out.extend(p.settle());
    assert_eq!(bodies(&out), ["Bob:one\n  two three"]);
}

#[test]
fn settle_completes_a_directive_followed_by_a_prompt() {
    for prompt in ["$ ", "dev@box:~/proj$ ", ">>> ", "\u{276f} "] {
        let mut p = Parser::new(Profile::shell());
        let out = [
            p.feed(format!("@relay:Bob hi\r\n{prompt}").as_bytes()),
            p.settle(),
        ]
        .concat();
        assert_eq!(bodies(&out), ["Bob:hi"], "prompt {prompt:?}");
    }
}

fn same_as_plain_vte(input: &[u8], chunk: usize) {
    let mut fast = Parser::new(Profile::claude());
    let mut slow = Parser::new(Profile::claude());
    slow.fast_path = false;
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for piece in input.chunks(chunk.max(1)) {
        a.extend(fast.feed(piece));
        b.extend(slow.feed(piece));
    }
    a.extend(fast.finish());
    b.extend(slow.finish());
    assert_eq!(a, b);
    assert_eq!(format!("{:?}", fast.screen), format!("{:?}", slow.screen));
}

proptest::proptest! {
    #[test]
    fn fast_path_matches_plain_vte_on_escape_noise(
        pieces in proptest::collection::vec(
            proptest::prop_oneof![
                "[a-z @:]{0,12}",
                "\x1b\\[[0-9;]{0,30}[@-~]",
                "\x1b\\[[0-9;:?<>=!]{0,12}[ -/]?[@-~]",
                "\x1b\\[[0-9]{1,7}[A-HJKm]",
                "\x1b\\[3[0-9];5;[0-9]{1,3}m",
                "[\r\n\t\x08\x07\x00\x18\x1a\x7f]",
                "\x1b[]P_X^][^\x07\x1b]{0,8}(\x07|\x1b\\\\)?",
                "\x1b[78cDEM]",
                "[●❯─é]{1,3}",
            ],
            0..60,
        ),
        chunk in 1usize..50,
    ) {
        let input: Vec<u8> = pieces.concat().into_bytes();
        same_as_plain_vte(&input, chunk);
        same_as_plain_vte(&input, 4096);
    }
}
