//! The PTY backend: the agent runs on the slave side of a pseudo-terminal we own. One thread
//! reads its output into a channel (PTY reads block); one writer, kept for the child's whole
//! life, takes every write (portable-pty's writer sends EOF when dropped).

use std::io::{Read, Write};
use std::sync::{Arc, Mutex};

use portable_pty::{Child, CommandBuilder, MasterPty, PtySize, native_pty_system};
use tokio::sync::mpsc;

use crate::WrapError;

/// A running agent in a PTY.
pub(crate) struct Pty {
    master: Box<dyn MasterPty + Send>,
    writer: Arc<Mutex<Box<dyn Write + Send>>>,
    /// Taken by [`Pty::wait`].
    child: Option<Box<dyn Child + Send + Sync>>,
}

impl Pty {
    /// The agent's process id (its CLI, or what starts it).
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(|c| c.process_id())
    }
}

fn pty_err(what: &str, e: impl std::fmt::Display) -> WrapError {
    WrapError::Pty(format!("{what}: {e}"))
}

/// Starts `command` in a new PTY of `rows` × `cols`. Output arrives on the returned channel;
/// it closes when the agent's side of the terminal is closed (the agent exited).
pub(crate) fn spawn(
    command: &[String],
    env: &[(String, String)],
    rows: u16,
    cols: u16,
) -> Result<(Pty, mpsc::Receiver<Vec<u8>>), WrapError> {
    let (program, args) = command
        .split_first()
        .ok_or_else(|| WrapError::Pty("no command to run".into()))?;
    let pair = native_pty_system()
        .openpty(PtySize {
            rows,
            cols,
            pixel_width: 0,
            pixel_height: 0,
        })
        .map_err(|e| pty_err("cannot open a pseudo-terminal", e))?;
    let mut cmd = CommandBuilder::new(program);
    cmd.args(args);
    if let Ok(dir) = std::env::current_dir() {
        cmd.cwd(dir);
    }
    if std::env::var_os("TERM").is_none() {
        cmd.env("TERM", "xterm-256color");
    }
    for k in crate::NOT_INHERITED {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = pair
        .slave
        .spawn_command(cmd)
        .map_err(|e| pty_err(&format!("cannot start {program:?}"), e))?;
    // Our copy of the slave must close, or the master never sees the agent's side close.
    drop(pair.slave);
    let mut reader = pair
        .master
        .try_clone_reader()
        .map_err(|e| pty_err("cannot read the pseudo-terminal", e))?;
    let writer = pair
        .master
        .take_writer()
        .map_err(|e| pty_err("cannot write the pseudo-terminal", e))?;
    let (tx, rx) = mpsc::channel(256);
    std::thread::Builder::new()
        .name("relay-pty-read".into())
        .spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match reader.read(&mut buf) {
                    // EOF, or EIO once the agent's side is closed.
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if tx.blocking_send(buf[..n].to_vec()).is_err() {
                            break;
                        }
                    }
                }
            }
        })
        .map_err(|e| pty_err("cannot start the reader thread", e))?;
    Ok((
        Pty {
            master: pair.master,
            writer: Arc::new(Mutex::new(writer)),
            child: Some(child),
        },
        rx,
    ))
}

impl Pty {
    /// Writes `bytes` to the agent's input. Blocking (a PTY accepts a few KiB before the agent
    /// reads), so it runs on the blocking pool.
    pub(crate) async fn write(&self, bytes: Vec<u8>) -> Result<(), WrapError> {
        let writer = self.writer.clone();
        tokio::task::spawn_blocking(move || {
            let mut w = writer
                .lock()
                .map_err(|_| WrapError::Pty("writer poisoned".into()))?;
            w.write_all(&bytes)
                .and_then(|()| w.flush())
                .map_err(|e| pty_err("write to the agent failed", e))
        })
        .await
        .map_err(|e| pty_err("write task failed", e))?
    }

    /// Follows a change of the person's terminal size.
    pub(crate) fn resize(&self, rows: u16, cols: u16) -> Result<(), WrapError> {
        self.master
            .resize(PtySize {
                rows,
                cols,
                pixel_width: 0,
                pixel_height: 0,
            })
            .map_err(|e| pty_err("cannot resize", e))
    }

    /// Ends the agent (the wrapper is being stopped).
    pub(crate) fn kill(&mut self) {
        if let Some(c) = &mut self.child
            && let Err(e) = c.kill()
        {
            // Already gone, most often; the wait that follows reports how it ended.
            tracing::debug!(error = %e, "cannot kill the agent");
        }
    }

    /// Waits for the agent to exit (on the blocking pool); its exit code.
    pub(crate) async fn wait(&mut self) -> Result<i32, WrapError> {
        let Some(mut child) = self.child.take() else {
            return Err(pty_err("cannot wait for the agent", "waited for already"));
        };
        let status = tokio::task::spawn_blocking(move || child.wait())
            .await
            .map_err(|e| pty_err("wait task failed", e))?
            .map_err(|e| pty_err("cannot wait for the agent", e))?;
        Ok(i32::try_from(status.exit_code()).unwrap_or(1))
    }
}

/// The PTY backend as the wrapper's loop drives it (see [`crate::terminal::Terminal`]): the
/// agent's PTY, the person's terminal around it (keys in, output mirrored, size followed) and
/// the signals that stop the wrapper.
pub(crate) struct PtyTerminal {
    pub(crate) pty: Pty,
    output: mpsc::Receiver<Vec<u8>>,
    keys: mpsc::Receiver<Vec<u8>>,
    paste: crate::format::PasteMode,
    stdout: std::io::Stdout,
    /// Showing output on the person's terminal failed once (said once, see `show`).
    stdout_failed: bool,
    winch: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
}

impl PtyTerminal {
    /// The terminal of `pty`, whose output arrives on `output`, with the person's keys on
    /// `keys` (closed when there is no person).
    pub(crate) fn new(
        pty: Pty,
        output: mpsc::Receiver<Vec<u8>>,
        keys: mpsc::Receiver<Vec<u8>>,
    ) -> Result<Self, WrapError> {
        use tokio::signal::unix::{SignalKind, signal};
        let signal_of = |kind| signal(kind).map_err(|e| WrapError::Terminal(e.to_string()));
        // Stopping the wrapper stops the agent and, through `RawMode`'s drop, gives the person
        // their terminal back as it was. In raw mode the keyboard sends no SIGINT or SIGQUIT
        // (its Ctrl-C and Ctrl-\ go to the agent as bytes), so those come from outside, like
        // SIGTERM: left to their default action they would end the wrapper with the terminal
        // still raw.
        Ok(Self {
            pty,
            output,
            keys,
            paste: crate::format::PasteMode::default(),
            stdout: std::io::stdout(),
            stdout_failed: false,
            winch: signal_of(SignalKind::window_change())?,
            term: signal_of(SignalKind::terminate())?,
            hup: signal_of(SignalKind::hangup())?,
            int: signal_of(SignalKind::interrupt())?,
            quit: signal_of(SignalKind::quit())?,
        })
    }
}

impl crate::terminal::Terminal for PtyTerminal {
    fn backend(&self) -> &'static str {
        "pty"
    }

    async fn next_event(
        &mut self,
        _checkpoint: Option<u64>,
    ) -> Result<crate::terminal::TermEvent, WrapError> {
        use crate::terminal::TermEvent;
        // Every branch is a channel or signal receive: cancel-safe.
        Ok(tokio::select! {
            chunk = self.output.recv() => match chunk {
                Some(bytes) => TermEvent::Output(bytes),
                // The agent's side of the terminal closed: it exited.
                None => TermEvent::Ended,
            },
            Some(k) = self.keys.recv() => TermEvent::Keys(k),
            _ = self.winch.recv() => {
                let (rows, cols) = crate::terminal_size();
                TermEvent::Resized { rows, cols }
            }
            _ = self.term.recv() => TermEvent::Stopped(15),
            _ = self.hup.recv() => TermEvent::Stopped(1),
            _ = self.int.recv() => TermEvent::Stopped(2),
            _ = self.quit.recv() => TermEvent::Stopped(3),
        })
    }

    fn show(&mut self, bytes: &[u8]) {
        // The person sees exactly what the agent printed. Their terminal gone (closed, a pipe
        // whose reader left) changes nothing for the relaying, which reads the agent's output
        // itself: said once.
        if let Err(e) = self
            .stdout
            .write_all(bytes)
            .and_then(|()| self.stdout.flush())
            && !self.stdout_failed
        {
            self.stdout_failed = true;
            tracing::info!(error = %e, "cannot show the agent's output on this terminal; relaying goes on");
        }
        self.paste.feed(bytes);
    }

    async fn type_text(&mut self, text: &str) -> Result<(), WrapError> {
        self.pty.write(self.paste.wrap(text)).await
    }

    async fn write_keys(&mut self, keys: Vec<u8>) -> Result<(), WrapError> {
        self.pty.write(keys).await
    }

    async fn enter(&mut self) -> Result<(), WrapError> {
        self.pty.write(b"\r".to_vec()).await
    }

    fn resize(&mut self, rows: u16, cols: u16) -> Result<(), WrapError> {
        self.pty.resize(rows, cols)
    }

    fn sees_keys(&self) -> bool {
        true
    }

    fn typing_errors_end(&self) -> bool {
        true
    }
}
