//! The relay's stored messages as tests read them: one typed `history`, oldest first.

use serde_json::Value;

use super::{Relay, ok_stdout};

/// One stored message, as `agent-relay history --json` lists it.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    /// Its id.
    pub(crate) id: String,
    /// Its sender.
    pub(crate) from: String,
    /// Its recipient (`*` for a broadcast).
    pub(crate) to: String,
    /// Its text.
    pub(crate) body: String,
    /// Its thread, or "" when it starts none.
    pub(crate) thread: String,
    /// The whole record, for fields a test reads once.
    pub(crate) json: Value,
}

/// Every stored message, oldest first (`history --all --json`, which lists newest first).
pub(crate) fn history(relay: &Relay) -> Vec<Stored> {
    let v: Value = serde_json::from_str(&ok_stdout(&relay.cli(&["history", "--all", "--json"])))
        .expect("history --json is one JSON array");
    let mut all: Vec<Stored> = v
        .as_array()
        .expect("history --json is one JSON array")
        .iter()
        .map(|m| {
            let s = |k: &str| m[k].as_str().unwrap_or_default().to_owned();
            Stored {
                id: s("id"),
                from: s("from"),
                to: s("to"),
                body: s("body"),
                thread: s("thread"),
                json: m.clone(),
            }
        })
        .collect();
    all.reverse();
    all
}

impl Stored {
    /// (from, to, body): what most tests compare.
    pub(crate) fn line(&self) -> (&str, &str, &str) {
        (&self.from, &self.to, &self.body)
    }
}

/// The status of message `id`'s first delivery (`read ID --json`), or "" while it cannot be
/// read.
pub(crate) fn delivery_status(relay: &Relay, id: &str) -> String {
    let v: Value =
        serde_json::from_slice(&relay.cli(&["read", id, "--json"]).stdout).unwrap_or_default();
    v["deliveries"][0]["status"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Fields `a` and `b` (strings) of every object in the JSON array `rows`, in its order.
pub(crate) fn field_pairs(rows: &Value, a: &str, b: &str) -> Vec<(String, String)> {
    let text = |row: &Value, k: &str| {
        row[k]
            .as_str()
            .unwrap_or_else(|| panic!("no string {k:?} in {row}"))
            .to_owned()
    };
    rows.as_array()
        .unwrap_or_else(|| panic!("not a JSON array: {rows}"))
        .iter()
        .map(|row| (text(row, a), text(row, b)))
        .collect()
}

/// Field `k` (a string) of every object in the JSON array `rows`, in its order.
pub(crate) fn field_strs<'a>(rows: &'a Value, k: &str) -> Vec<&'a str> {
    rows.as_array()
        .unwrap_or_else(|| panic!("not a JSON array: {rows}"))
        .iter()
        .map(|row| {
            row[k]
                .as_str()
                .unwrap_or_else(|| panic!("no string {k:?} in {row}"))
        })
        .collect()
}

/// The object in the JSON array `rows` whose field `k` is `value`.
pub(crate) fn find_row<'a>(rows: &'a Value, k: &str, value: &str) -> &'a Value {
    rows.as_array()
        .unwrap_or_else(|| panic!("not a JSON array: {rows}"))
        .iter()
        .find(|row| row[k] == value)
        .unwrap_or_else(|| panic!("no {k} = {value:?} in {rows}"))
}

/// The events of message `id`'s delivery trace (`trace ID --json`), in order.
pub(crate) fn trace_events(relay: &Relay, id: &str) -> Vec<Value> {
    let t: Value = serde_json::from_str(&ok_stdout(&relay.cli(&["trace", id, "--json"])))
        .unwrap_or_else(|e| panic!("trace {id}: {e}"));
    t["events"]
        .as_array()
        .unwrap_or_else(|| panic!("no events in {t}"))
        .clone()
}

/// `agent-relay send TO BODY` (from `human`); the id of the stored message.
pub(crate) fn cli_send(relay: &Relay, to: &str, body: &str) -> String {
    let v: Value =
        serde_json::from_str(&ok_stdout(&relay.cli(&["send", to, body, "--json"]))).unwrap();
    v["id"].as_str().unwrap().to_owned()
}

/// Fields `keys` of `v` as strings (`None` where one is missing or no string), in order: what
/// a test compares of a JSON event in one assertion.
pub(crate) fn str_fields<'a, const N: usize>(
    v: &'a Value,
    keys: [&str; N],
) -> [Option<&'a str>; N] {
    keys.map(|k| v[k].as_str())
}
