//! The wrapper: runs an agent CLI in a pseudo-terminal without modifying it, relays the
//! directives it prints, and types in the messages it receives.
//!
//! ```text
//! agent output ──► PTY ──► person's terminal (unchanged)
//!                     └──► relay_parse::Parser ──► directives ──► relay_client::Client::send
//! client DELIVER ──► format::injected_text ──► inject::Injector (waits for quiet) ──► PTY input ──► ACK
//! ```
//!
//! The pure parts (`format`, `inject`) are unit tested; `run` is the I/O shell around them and
//! is tested end to end with the real binary.

pub mod format;
pub mod inject;
mod pty;

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use relay_client::{Client, ClientConfig, ClientError, Delivered, Event, Outgoing};
use relay_parse::{Directive, Parser, Profile, Target};
use relay_protocol::Send;
use tokio::sync::mpsc;

use crate::inject::{Action, Injector, Timing};

/// Wrapper failures.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WrapError {
    /// The pseudo-terminal or the agent process failed.
    #[error("{0}")]
    Pty(String),
    /// The relay could not be reached or refused us.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The person's terminal could not be set up.
    #[error("terminal: {0}")]
    Terminal(String),
}

/// How to run one agent.
#[derive(Debug, Clone)]
pub struct WrapConfig {
    /// The agent's relay name.
    pub name: String,
    /// The agent command and its arguments.
    pub command: Vec<String>,
    /// How to read the agent's screen.
    pub profile: Profile,
    /// The relay's socket.
    pub socket: PathBuf,
    /// Injection timing.
    pub timing: Timing,
    /// Output quiet this long lets the parser read what is on screen.
    pub settle_after: Duration,
    /// Longest body typed in full; longer ones are cut with a hint to `agent-relay read`.
    pub max_body: usize,
    /// Put the person's terminal in raw mode and pass keystrokes through (when stdin is a
    /// terminal). Off, the agent gets no input but relayed messages (scripts, tests).
    pub interactive: bool,
}

/// Restores the person's terminal when dropped, on every way out (errors, panics).
struct RawMode {
    saved: rustix::termios::Termios,
}

impl RawMode {
    fn enter() -> Result<Self, WrapError> {
        let stdin = std::io::stdin();
        let saved = rustix::termios::tcgetattr(&stdin)
            .map_err(|e| WrapError::Terminal(format!("cannot read terminal settings: {e}")))?;
        let mut raw = saved.clone();
        raw.make_raw();
        rustix::termios::tcsetattr(&stdin, rustix::termios::OptionalActions::Now, &raw)
            .map_err(|e| WrapError::Terminal(format!("cannot set raw mode: {e}")))?;
        Ok(Self { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = rustix::termios::tcsetattr(
            std::io::stdin(),
            rustix::termios::OptionalActions::Now,
            &self.saved,
        );
    }
}

/// The person's terminal size, or a roomy default when there is none.
fn terminal_size() -> (u16, u16) {
    match rustix::termios::tcgetwinsize(std::io::stdout()) {
        Ok(ws) if ws.ws_row > 0 && ws.ws_col > 0 => (ws.ws_row, ws.ws_col),
        _ => (40, 120),
    }
}

/// What the injector types: a relayed message (acknowledged once typed) or a notice from the
/// relay itself (a refusal the agent should learn about).
enum Typed {
    Message(Box<Delivered>),
    Notice,
}

/// The notice typed into the agent when the relay refuses one of its messages.
fn refusal_notice(to: &str, reason: &str) -> String {
    let reason: String = reason
        .chars()
        .filter(|c| !c.is_control())
        .take(300)
        .collect();
    format!("relay: your message to {to} was not sent: {reason}")
}

async fn send_directive(client: &Client, d: Directive, notices: &mpsc::UnboundedSender<String>) {
    let to = match d.to {
        Target::Agent(name) => name,
        Target::Broadcast => "*".to_owned(),
    };
    let msg = Outgoing {
        id: None,
        to: Some(to.clone()),
        topic: None,
        payload: Send {
            kind: d.kind,
            body: d.body,
            data: d.data,
            thread: d.thread,
            in_reply_to: None,
            budget: None,
        },
    };
    // The receipt is awaited off the loop; a refusal goes back to the agent as a notice, so it
    // learns (a misspelt name, a message too large...).
    match client.send_nowait(msg).await {
        Ok((id, pending)) => {
            let notices = notices.clone();
            tokio::spawn(async move {
                match pending.wait().await {
                    Ok(r) => tracing::debug!(%id, %to, status = ?r.status, "relayed"),
                    Err(ClientError::Rejected { reason, .. }) => {
                        tracing::warn!(%id, %to, %reason, "relay refused a message");
                        let _ = notices.send(refusal_notice(&to, &reason));
                    }
                    Err(e) => tracing::warn!(%id, %to, error = %e, "no receipt for a message"),
                }
            });
        }
        Err(e) => tracing::warn!(%to, error = %e, "could not relay a message"),
    }
}

/// Runs the agent until it exits; returns its exit code.
///
/// # Errors
/// [`WrapError`] when the agent cannot start or the relay cannot be reached at start.
pub async fn run(cfg: WrapConfig) -> Result<i32, WrapError> {
    let interactive = cfg.interactive && rustix::termios::isatty(std::io::stdin());
    let mut client = Client::connect(ClientConfig {
        cli: cfg.command.first().cloned(),
        ..ClientConfig::agent(cfg.socket.clone(), cfg.name.clone())
    })
    .await?;
    let (rows, cols) = terminal_size();
    let env = vec![("AGENT_RELAY_NAME".to_owned(), cfg.name.clone())];
    let (pty, mut output) = pty::spawn(&cfg.command, &env, rows, cols)?;
    let _raw = if interactive {
        Some(RawMode::enter()?)
    } else {
        None
    };
    let (keys_tx, mut keys) = mpsc::channel::<Vec<u8>>(64);
    if interactive {
        std::thread::Builder::new()
            .name("relay-stdin".into())
            .spawn(move || {
                use std::io::Read;
                let mut buf = [0u8; 4096];
                let mut stdin = std::io::stdin();
                while let Ok(n) = stdin.read(&mut buf) {
                    if n == 0 || keys_tx.blocking_send(buf[..n].to_vec()).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| WrapError::Terminal(e.to_string()))?;
    } else {
        drop(keys_tx);
    }
    use tokio::signal::unix::{SignalKind, signal};
    let signal_of = |kind| signal(kind).map_err(|e| WrapError::Terminal(e.to_string()));
    let mut winch = signal_of(SignalKind::window_change())?;
    // Stopping the wrapper stops the agent and, through `RawMode`'s drop, gives the person
    // their terminal back as it was.
    let mut term = signal_of(SignalKind::terminate())?;
    let mut hup = signal_of(SignalKind::hangup())?;
    let mut stopped = false;
    let mut paste = format::PasteMode::default();
    let mut parser = Parser::new(cfg.profile.clone());
    parser.set_rows(usize::from(rows));
    let mut injector: Injector<Typed> = Injector::new(cfg.timing, Instant::now());
    let (notice_tx, mut notices) = mpsc::unbounded_channel::<String>();
    let mut last_output = Instant::now();
    let mut settled = true;
    let mut relay_open = true;
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stdout = std::io::stdout();
    loop {
        tokio::select! {
            chunk = output.recv() => {
                let Some(bytes) = chunk else { break };
                // The person sees exactly what the agent printed.
                let _ = stdout.write_all(&bytes).and_then(|()| stdout.flush());
                let now = Instant::now();
                paste.feed(&bytes);
                injector.on_output(now);
                last_output = now;
                settled = false;
                for d in parser.feed(&bytes) {
                    send_directive(&client, d, &notice_tx).await;
                }
            }
            ev = client.next_event(), if relay_open => match ev {
                Some(Event::Message(m)) => {
                    let text = format::injected_text(
                        &m.from, &m.id, m.payload.thread.as_deref(), &m.payload.body, cfg.max_body,
                    );
                    injector.push(text, Typed::Message(Box::new(m)));
                }
                Some(other) => tracing::debug!(?other, "relay event"),
                None => {
                    // The agent keeps running; it just is not relayed any more.
                    tracing::warn!("relay client stopped");
                    relay_open = false;
                }
            },
            Some(k) = keys.recv() => {
                injector.on_person_input(&k, Instant::now());
                pty.write(k).await?;
            }
            Some(notice) = notices.recv() => injector.push(notice, Typed::Notice),
            _ = term.recv() => { stopped = true; break; }
            _ = hup.recv() => { stopped = true; break; }
            _ = winch.recv() => {
                let (r, c) = terminal_size();
                pty.resize(r, c)?;
                parser.set_rows(usize::from(r));
            }
            // Only while something waits (unread output or a queued message): an idle agent
            // costs the wrapper no wake-ups.
            _ = tick.tick(), if !settled || injector.pending() > 0 => {
                let now = Instant::now();
                if !settled && now.duration_since(last_output) >= cfg.settle_after {
                    settled = true;
                    for d in parser.settle() {
                        send_directive(&client, d, &notice_tx).await;
                    }
                }
                while let Some(action) = injector.poll(now) {
                    match action {
                        Action::Type(text) => {
                            parser.note_injected(&text);
                            pty.write(paste.wrap(&text)).await?;
                        }
                        Action::Submit(item) => {
                            pty.write(b"\r".to_vec()).await?;
                            if let Typed::Message(m) = item {
                                let _ = client.ack(&m, None).await;
                            }
                        }
                    }
                }
            }
        }
    }
    for d in parser.finish() {
        send_directive(&client, d, &notice_tx).await;
    }
    let mut pty = pty;
    if stopped {
        tracing::info!("stopped by a signal: ending the agent");
        pty.kill();
    }
    let code = tokio::task::spawn_blocking(move || pty.wait())
        .await
        .map_err(|e| WrapError::Pty(e.to_string()))??;
    // Let the last receipts arrive before saying goodbye.
    tokio::time::sleep(Duration::from_millis(50)).await;
    client.close().await;
    Ok(code)
}
