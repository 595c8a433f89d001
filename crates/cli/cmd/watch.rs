//! `agent-relay watch`: the relay's live feed in the terminal.
//!
//! Transport: the daemon's own Unix socket (so the same uid check guards it and no token is
//! needed). The command connects as a tool (`role: client`), sends `QUERY {what:"watch"}` and
//! then reads one `RESULT {what:"event"}` per event, answering PINGs, until the relay stops or
//! the command is interrupted. Plain frames rather than the client library, which matches one
//! RESULT to each question.

use std::io::IsTerminal;

use anyhow::Context;
use bytes::{Buf, BytesMut};
use relay_client::paths::Paths;
use relay_protocol::events::{RelayEvent, WatchFilter};
use relay_protocol::query::{DeliveryStatus, QueryRequest, QueryResult};
use relay_protocol::text::{for_terminal, one_line};
use relay_protocol::{
    Capabilities, Envelope, Hello, MAX_FRAME_BYTES, Payload, Ping, Role, TerminalState,
    encode_frame, frame_len, validate_agent_name, validate_topic_pattern,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use crate::args::WatchArgs;
use crate::out::line;
use crate::time::{format_utc, now_ms};

/// `agent-relay watch`.
pub(crate) async fn watch(paths: &Paths, args: &WatchArgs) -> anyhow::Result<()> {
    for name in [&args.from, &args.to].into_iter().flatten() {
        validate_agent_name(name)
            .map_err(|e| crate::exit::usage(format!("bad agent name {name:?}: {e}")))?;
    }
    if let Some(t) = &args.topic {
        validate_topic_pattern(t)
            .map_err(|e| crate::exit::usage(format!("bad topic pattern {t:?}: {e}")))?;
    }
    let mut stream = relay_client::connect_socket(&paths.socket).await?;
    let hello = Payload::Hello(Hello {
        agent: "watch".into(),
        cli: Some("agent-relay watch".into()),
        capabilities: Capabilities::default(),
        resume_token: None,
        role: Role::Client,
    });
    write(&mut stream, Envelope::new("watch-hello", now_ms(), hello)).await?;
    let filter = WatchFilter {
        from: args.from.clone(),
        to: args.to.clone(),
        topic: args.topic.clone(),
    };
    let query = Payload::Query(QueryRequest::Watch(filter));
    write(&mut stream, Envelope::new("watch", now_ms(), query)).await?;
    let style = Style::for_stdout();
    if style.color {
        eprintln!(
            "watching the relay at {} (Ctrl-C to stop)",
            for_terminal(&paths.socket.display().to_string())
        );
    }
    let mut buf = BytesMut::with_capacity(16 * 1024);
    loop {
        let env = match next_frame(&mut stream, &mut buf).await? {
            Some(env) => env,
            None => anyhow::bail!("the relay closed the connection"),
        };
        match env.payload {
            Payload::Result(QueryResult::Event { event }) => {
                let text = if args.json {
                    relay_protocol::text::json_line(&event)?
                } else {
                    style.render(&event)
                };
                line(text)?;
            }
            Payload::Result(QueryResult::Error { message, .. }) => {
                anyhow::bail!("the relay refused to watch: {}", for_terminal(&message))
            }
            Payload::Ping(p) => {
                let pong = Payload::Pong(Ping {
                    nonce: p.nonce,
                    terminal: None,
                });
                write(&mut stream, Envelope::new("watch-pong", now_ms(), pong)).await?;
            }
            Payload::Error(e) if e.fatal => {
                anyhow::bail!(
                    "the relay closed the connection: {}",
                    for_terminal(&e.message)
                )
            }
            Payload::Bye(_) => {
                if !args.json {
                    line(style.dim("relay stopped"))?;
                }
                return Ok(());
            }
            _ => {}
        }
    }
}

async fn write(stream: &mut UnixStream, env: Envelope) -> anyhow::Result<()> {
    let mut out = Vec::new();
    encode_frame(&env, &mut out, MAX_FRAME_BYTES)?;
    stream
        .write_all(&out)
        .await
        .context("cannot write to the relay")
}

async fn next_frame(
    stream: &mut UnixStream,
    buf: &mut BytesMut,
) -> anyhow::Result<Option<Envelope>> {
    loop {
        if let Some(n) = frame_len(buf, MAX_FRAME_BYTES)? {
            let env = Envelope::from_json(&buf[4..n]);
            buf.advance(n);
            match env {
                Ok(env) => return Ok(Some(env)),
                // A frame type this build does not know: not ours to judge, skip it.
                Err(e) if !e.is_fatal() => continue,
                Err(e) => anyhow::bail!("bad frame from the relay: {e}"),
            }
        }
        if stream
            .read_buf(buf)
            .await
            .context("cannot read from the relay")?
            == 0
        {
            return Ok(None);
        }
    }
}

/// ANSI colours when stdout is a terminal (and `NO_COLOR` is unset).
struct Style {
    color: bool,
}

impl Style {
    fn for_stdout() -> Self {
        Self {
            color: std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
        }
    }

    fn paint(&self, code: &str, text: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_owned()
        }
    }

    fn dim(&self, text: &str) -> String {
        self.paint("2", text)
    }

    fn name(&self, text: &str) -> String {
        self.paint("1;36", &for_terminal(text))
    }

    /// One line for one event; every text from the relay is cleaned of control characters.
    fn render(&self, ev: &RelayEvent) -> String {
        let time = |ts: u64| self.dim(format_utc(ts).get(11..).unwrap_or_default());
        let short =
            |id: &str| self.dim(&format!("[{}]", for_terminal(relay_protocol::short_id(id))));
        match ev {
            RelayEvent::AgentConnected {
                ts,
                agent,
                cli,
                resumed,
            } => format!(
                "{}  {} {} connected{}{}",
                time(*ts),
                self.paint("32", "+"),
                self.name(agent),
                cli.as_deref()
                    .map(|c| format!(" ({})", one_line(c, 40)))
                    .unwrap_or_default(),
                if *resumed { ", resumed" } else { "" }
            ),
            RelayEvent::AgentDisconnected { ts, agent } => format!(
                "{}  {} {} disconnected",
                time(*ts),
                self.paint("33", "-"),
                self.name(agent)
            ),
            RelayEvent::AgentState {
                ts,
                agent,
                backend,
                state,
                why,
            } => {
                let code = match state {
                    TerminalState::Idle => "32",
                    TerminalState::Busy => "33",
                    TerminalState::Blocked => "31",
                };
                format!(
                    "{}  {} {} is {} ({}){}",
                    time(*ts),
                    self.paint(code, "~"),
                    self.name(agent),
                    self.paint(code, state.as_str()),
                    for_terminal(backend),
                    why.as_deref()
                        .map(|w| format!(": {}", one_line(w, 120)))
                        .unwrap_or_default()
                )
            }
            RelayEvent::Accepted {
                ts,
                id,
                from,
                to,
                topic,
                kind,
                thread,
                body,
                truncated,
                ..
            } => {
                let mut s = format!(
                    "{}  {} → {} {}",
                    time(*ts),
                    self.name(from),
                    self.name(to),
                    short(id)
                );
                if let Some(t) = topic {
                    s.push_str(&self.paint("34", &format!(" #{}", for_terminal(t))));
                }
                if *kind != relay_protocol::Kind::Message {
                    s.push_str(&self.paint("35", &format!(" {}", kind.as_str())));
                }
                if let Some(t) = thread {
                    s.push_str(&self.dim(&format!(" thread {}", one_line(t, 40))));
                }
                let mut text = one_line(body, 120);
                if *truncated && !text.ends_with('…') {
                    text.push('…');
                }
                s.push_str("  ");
                s.push_str(&text);
                s
            }
            RelayEvent::Delivered {
                ts,
                id,
                recipient,
                seq,
                attempt,
                ..
            } => format!(
                "{}    {} delivered to {} {} seq {seq}{}",
                time(*ts),
                self.dim("↳"),
                self.name(recipient),
                short(id),
                if *attempt > 1 {
                    format!(" (attempt {attempt})")
                } else {
                    String::new()
                }
            ),
            RelayEvent::Acked {
                ts,
                id,
                recipient,
                state,
                ..
            } => {
                let (mark, code) = match state {
                    DeliveryStatus::Failed | DeliveryStatus::Expired => ("✗", "31"),
                    _ => ("✓", "32"),
                };
                format!(
                    "{}    {} {} {} {}",
                    time(*ts),
                    self.paint(code, mark),
                    self.name(recipient),
                    self.paint(code, state.as_str()),
                    short(id)
                )
            }
            RelayEvent::Refused {
                ts,
                id,
                from,
                code,
                reason,
            } => format!(
                "{}  {} refused {} from {}: {} {}",
                time(*ts),
                self.paint("31", "!"),
                short(id),
                self.name(from),
                self.paint("31", &for_terminal(code)),
                one_line(reason, 160)
            ),
            RelayEvent::Expired { ts, deliveries } => format!(
                "{}  {} {deliveries} deliveries expired (inbox TTL)",
                time(*ts),
                self.paint("31", "!")
            ),
            RelayEvent::Lagged { missed } => self.paint(
                "33",
                &format!("… missed {missed} events (watch fell behind)"),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_lines_are_clean_and_uncoloured() {
        let style = Style { color: false };
        let ev = RelayEvent::Accepted {
            ts: 0,
            id: "01JB2K7Q4ZABCDEF".into(),
            pos: 1,
            from: "Alice".into(),
            to: "Bob".into(),
            topic: Some("build".into()),
            kind: relay_protocol::Kind::Action,
            thread: None,
            body: "run\x1b[31m it\nnow".into(),
            truncated: false,
            recipients: vec!["Bob".into()],
        };
        let text = style.render(&ev);
        assert_eq!(
            text,
            "00:00:00  Alice → Bob [4ZABCDEF] #build action  run\\u{1b}[31m it now"
        );
        assert!(!text.contains('\x1b'));
    }

    #[test]
    fn colour_wraps_names() {
        let style = Style { color: true };
        let text = style.render(&RelayEvent::AgentDisconnected {
            ts: 0,
            agent: "Bob".into(),
        });
        assert!(text.contains("\x1b[1;36mBob\x1b[0m"), "{text:?}");
    }

    #[test]
    fn a_terminal_state_is_one_clean_line_with_its_reason() {
        let style = Style { color: false };
        let text = style.render(&RelayEvent::AgentState {
            ts: 0,
            agent: "Dora".into(),
            backend: "pty".into(),
            state: TerminalState::Blocked,
            why: Some("dialog open: allow\x1b[2J command?\nyes".into()),
        });
        assert!(!text.contains('\x1b'), "{text:?}");
        assert_eq!(
            text,
            "00:00:00  ~ Dora is blocked (pty): dialog open: allow\\u{1b}[2J command? yes"
        );
    }
}
