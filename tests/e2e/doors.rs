//! Issue 15, every door into an agent: directives that keep their lines, the MCP server, the
//! automatic teaching.

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::support::{BIN, Relay, ok_stdout};

/// What an agent prints: a directive followed by text at its own indentation, one with a
/// code block and a list under it, one in a later indented paragraph.
const CONTINUATIONS: &str = "@relay:Bob hi\nDone.\n\n@relay:Bob run this:\n    fn main() {\n        println!(\"x\");\n    }\n- then test\nThat is all.\n\n  @relay:Carol steps:\n  1. build\n    more detail\n  Thanks.\n";

fn expected_bodies() -> Vec<(String, String)> {
    [
        ("Bob", "hi"),
        (
            "Bob",
            "run this:\n    fn main() {\n        println!(\"x\");\n    }\n- then test",
        ),
        ("Carol", "steps:\n1. build\n  more detail"),
    ]
    .into_iter()
    .map(|(a, b)| (a.to_owned(), b.to_owned()))
    .collect()
}

#[test]
fn continuation_lines_keep_their_breaks_and_a_line_at_the_directives_indent_ends_it() {
    let mut child = Command::new(BIN)
        .args(["parse", "--json"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(CONTINUATIONS.replace('\n', "\r\n").as_bytes())
        .unwrap();
    let out = ok_stdout(&child.wait_with_output().unwrap());
    let got: Vec<(String, String)> = out
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (
                v["to"].as_str().unwrap().to_owned(),
                v["body"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(got, expected_bodies());
}

#[test]
fn a_wrapped_agents_directive_ends_at_a_line_at_its_own_indentation() {
    let relay = Relay::start();
    // Known recipients (a message for a name the relay never saw is refused).
    let _bob = relay.agent("Bob");
    let _carol = relay.agent("Carol");
    let script = format!("cat <<'EOF'\n{CONTINUATIONS}EOF\n");
    let out = relay.run_wrapped("Alice", "alice.sh", &script);
    assert!(out.status.success(), "{out:?}");
    let h: Value = serde_json::from_slice(&relay.cli(&["history", "--json"]).stdout).unwrap();
    // Newest first.
    let mut got: Vec<(String, String)> = h
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["to"].as_str().unwrap().to_owned(),
                m["body"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    got.reverse();
    assert_eq!(got, expected_bodies());
}

/// An MCP client on `agent-relay mcp`'s stdio: JSON-RPC, one message per line.
struct Mcp {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
    next: u64,
}

impl Mcp {
    fn start(relay: &Relay, name: &str) -> Self {
        let mut child = relay
            .command()
            .args(["mcp", "--name", name])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut mcp = Self {
            child,
            stdin,
            stdout,
            next: 1,
        };
        let init = mcp.call(
            "initialize",
            serde_json::json!({
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "e2e", "version": "1"}
            }),
        );
        assert_eq!(init["serverInfo"]["name"], "agent-relay", "{init}");
        assert!(init["capabilities"]["tools"].is_object(), "{init}");
        mcp.notify("notifications/initialized");
        mcp
    }

    fn notify(&mut self, method: &str) {
        let msg = serde_json::json!({"jsonrpc": "2.0", "method": method});
        writeln!(self.stdin, "{msg}").unwrap();
    }

    /// One request and its result (every line on stdout must be JSON-RPC).
    fn call(&mut self, method: &str, params: Value) -> Value {
        use std::io::BufRead;
        let id = self.next;
        self.next += 1;
        let msg =
            serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        writeln!(self.stdin, "{msg}").unwrap();
        loop {
            let mut line = String::new();
            assert!(
                self.stdout.read_line(&mut line).unwrap() > 0,
                "the MCP server closed stdout"
            );
            let v: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("not JSON-RPC on stdout ({e}): {line:?}"));
            if v["id"] == id {
                assert!(v["error"].is_null(), "{v}");
                return v["result"].clone();
            }
        }
    }

    /// A tool call: (is_error, text).
    fn tool(&mut self, name: &str, args: Value) -> (bool, String) {
        let r = self.call(
            "tools/call",
            serde_json::json!({"name": name, "arguments": args}),
        );
        let text = r["content"][0]["text"].as_str().unwrap_or("").to_owned();
        (r["isError"] == true, text)
    }
}

impl Drop for Mcp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A 40-line indented code block: what a flattening door would mangle.
pub(crate) fn code_block() -> String {
    let mut s = String::from("Here is the fix:\n\n```rust\nfn main() {\n");
    for i in 0..36 {
        s.push_str(&format!(
            "{}let x{i} = {i}; // step\n",
            " ".repeat(4 + 4 * (i % 3))
        ));
    }
    s.push_str("}\n```");
    s
}

#[test]
fn mcp_tools_send_exactly_once_read_the_inbox_and_carry_the_relays_refusals() {
    let relay = Relay::start();
    let (mut bob, _) = relay.agent("Bob");
    let mut mcp = Mcp::start(&relay, "Alice");
    let tools = mcp.call("tools/list", serde_json::json!({}));
    let mut names: Vec<&str> = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "relay_agents",
            "relay_inbox",
            "relay_read",
            "relay_search",
            "relay_send"
        ]
    );

    // Send: the body arrives byte for byte, once; the result is the relay's ACK.
    let body = code_block();
    let (err, ack) = mcp.tool(
        "relay_send",
        serde_json::json!({"to": "Bob", "body": body, "thread": "T-1", "urgent": true}),
    );
    assert!(!err && ack.starts_with("ACK ["), "{ack}");
    assert!(ack.contains("accepted"), "{ack}");
    let d = bob.expect("DELIVER");
    assert_eq!(d["from"], "Alice");
    assert_eq!(d["payload"]["body"].as_str().unwrap(), body);
    assert_eq!(d["payload"]["thread"], "T-1");
    assert_eq!(d["payload"]["urgent"], true);
    bob.ack(&d);

    // A refusal is the tool's error, with the relay's reason.
    let (err, nack) = mcp.tool(
        "relay_send",
        serde_json::json!({"to": "bad name!", "body": "x"}),
    );
    assert!(err && nack.starts_with("NACK "), "{nack}");

    // Alice is a known, online agent (the MCP server holds her name), so Bob can answer.
    let (_, agents) = mcp.tool("relay_agents", serde_json::json!({}));
    assert!(agents.contains("Alice (you) — online, mcp"), "{agents}");
    let answer = "Looks good.\n  - one nit:\n      indent this";
    let id = bob.send("Alice", answer);
    let ack = bob.expect("ACK");
    assert_eq!(ack["payload"]["ack_id"], id, "{ack}");
    let (_, inbox) = mcp.tool("relay_inbox", serde_json::json!({}));
    assert!(
        inbox.starts_with("1 relay message:")
            && inbox.contains(&format!("[{id}] from Bob to Alice:\n{answer}")),
        "{inbox}"
    );
    let (_, again) = mcp.tool("relay_inbox", serde_json::json!({}));
    assert_eq!(again, "No new relay messages.");
    let (_, read) = mcp.tool("relay_read", serde_json::json!({"id": &id[..10]}));
    assert!(read.ends_with(answer), "{read}");
    let (_, found) = mcp.tool("relay_search", serde_json::json!({"text": "one nit"}));
    assert!(found.contains(&id) && !found.contains("step"), "{found}");

    // Stored once each: the message to Bob and Bob's answer.
    let h: Value = serde_json::from_slice(&relay.cli(&["history", "--json"]).stdout).unwrap();
    assert_eq!(h.as_array().unwrap().len(), 2, "{h:#}");
}
