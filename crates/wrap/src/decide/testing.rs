//! What the wrapper's unit tests share: a made-up CLI's profile and screens, its
//! configuration, and messages.

use relay_client::Delivered;
use relay_protocol::{Kind, Send};

use crate::WrapConfig;
use crate::format::Delivery;
use crate::profile::{Overrides, Profile};

/// Readiness rules for a made-up CLI: its input line is `> text`, it is busy while it shows
/// "esc to interrupt", and "Do you want to" is a dialog. Timings as the generic profile's:
/// quiet 500 ms, Enter 100 ms after the text, checked 300 ms after Enter, one retry.
pub(crate) fn profile() -> Profile {
    let o: Overrides = toml::from_str(
        r#"
prompt = '^> ?(.*)$'
busy = ["esc to interrupt"]
dialogs = ["Do you want to"]
"#,
    )
    .unwrap();
    Profile::load_with("generic", Some((&o, "<test>")), None).unwrap()
}

/// A screen drawn afresh: cleared, then `rows`.
pub(crate) fn screen(rows: &str) -> Vec<u8> {
    let mut out = b"\x1b[2J\x1b[H".to_vec();
    out.extend_from_slice(rows.replace('\n', "\r\n").as_bytes());
    out
}

/// The made-up CLI at work.
pub(crate) const BUSY: &str = "thinking... (esc to interrupt)\n";
/// The made-up CLI idle at an empty input line.
pub(crate) const IDLE: &str = "done.\n> ";

/// Agent Alice running the made-up CLI, its files in `dir`, given messages by `delivery`.
pub(crate) fn config(dir: &std::path::Path, delivery: Delivery) -> WrapConfig {
    WrapConfig {
        name: "Alice".to_owned(),
        command: vec!["made-up-cli".to_owned()],
        profile: profile(),
        socket: dir.join("no.sock"),
        max_body: 4000,
        interactive: false,
        team_dir: dir.to_owned(),
        inbox: None,
        intro: false,
        delivery,
        door_key: None,
        report_start: false,
        topics: Vec::new(),
    }
}

/// A message `id` from `from` to Alice, saying "hi", in `thread`.
pub(crate) fn message(id: &str, from: &str, thread: Option<&str>) -> Delivered {
    Delivered {
        id: id.to_owned(),
        from: from.to_owned(),
        to: "Alice".to_owned(),
        topic: None,
        ts: 0,
        seq: 1,
        attempt: 1,
        payload: Send {
            origin: None,
            kind: Kind::Message,
            body: "hi".to_owned(),
            data: None,
            thread: thread.map(str::to_owned),
            in_reply_to: None,
            budget: None,
            urgent: false,
        },
    }
}
