//! The PTY backend: the agent runs on the slave side of a pseudo-terminal we own. The wrapper's
//! loop reads the master side itself, non-blocking, in tokio's reactor: the agent's output
//! wakes the loop directly (no reader thread, no channel between them), and a message is typed
//! by a non-blocking write from the loop (no hand-off to the blocking pool). Issue 26 point 4;
//! the figures are in docs/PERFORMANCE.md.

use std::collections::VecDeque;
use std::io::Write;
use std::os::fd::{BorrowedFd, OwnedFd};

use portable_pty::{Child, CommandBuilder, MasterPty, PtySize, native_pty_system};
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

use crate::WrapError;

/// The most the agent's output is read in one go.
const READ_CHUNK: usize = 64 * 1024;

/// A running agent in a PTY.
pub(crate) struct Pty {
    /// portable-pty's side: resizing. Its writer is never taken: dropped, it would type an EOF
    /// into the agent (`\n` and `VEOF`); every write goes through `io`.
    master: Box<dyn MasterPty + Send>,
    /// A duplicate of the master's descriptor, non-blocking, registered with the reactor. The
    /// one reader and the one writer of the agent's terminal, for its whole life.
    io: AsyncFd<OwnedFd>,
    /// Where the output is read into.
    buf: Box<[u8]>,
    /// Output read while a write waited for the agent to take its input (see
    /// [`Pty::write`]), handed out by [`Pty::read`] before anything newer.
    held: VecDeque<Vec<u8>>,
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

/// The master side of `master` on a descriptor of its own (portable-pty exposes only the raw
/// number, and keeps its own descriptor for resizing), non-blocking, registered with the
/// runtime's reactor. Must run inside the tokio runtime.
#[allow(unsafe_code)]
fn watch_master(master: &dyn MasterPty) -> Result<AsyncFd<OwnedFd>, WrapError> {
    let raw = master
        .as_raw_fd()
        .ok_or_else(|| WrapError::Pty("the pseudo-terminal has no descriptor".into()))?;
    // SAFETY: `raw` is the descriptor `master` owns and keeps open while it lives; `master` is
    // borrowed for the whole of this function, and this borrow ends with the `dup` below.
    let borrowed = unsafe { BorrowedFd::borrow_raw(raw) };
    let fd = rustix::io::fcntl_dupfd_cloexec(borrowed, 0)
        .map_err(|e| pty_err("cannot duplicate the pseudo-terminal's descriptor", e))?;
    // Non-blocking: the duplicate shares its open file with portable-pty's descriptor, which
    // only resizes through it (an ioctl, unaffected).
    rustix::io::ioctl_fionbio(&fd, true)
        .map_err(|e| pty_err("cannot make the pseudo-terminal non-blocking", e))?;
    // SAFETY: an `OwnedFd` is a valid open descriptor that stays open, the same one, until it
    // is dropped, which the `AsyncFd` owning it does last.
    unsafe { AsyncFd::register(fd) }.map_err(|e| pty_err("cannot watch the pseudo-terminal", e))
}

/// Starts `command` in a new PTY of `rows` × `cols`. Must run inside the tokio runtime (the
/// PTY's descriptor joins its reactor). Its output comes from [`Pty::read`], which says when
/// the agent's side of the terminal closed (the agent exited).
pub(crate) fn spawn(
    command: &[String],
    env: &[(String, String)],
    rows: u16,
    cols: u16,
) -> Result<Pty, WrapError> {
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
    let io = watch_master(pair.master.as_ref())?;
    Ok(Pty {
        master: pair.master,
        io,
        buf: vec![0u8; READ_CHUNK].into_boxed_slice(),
        held: VecDeque::new(),
        child: Some(child),
    })
}

/// What one non-blocking read of the master side gave.
enum Read {
    /// Bytes the agent printed, this many at the start of the buffer.
    Bytes(usize),
    /// Nothing more will come: the agent's side closed (EIO on Linux, or end of file).
    Closed,
}

/// Reads once from `fd` into `buf`; `WouldBlock` when nothing is there (the caller's
/// readiness guard is cleared by `try_io`).
fn read_once(fd: &OwnedFd, buf: &mut [u8]) -> std::io::Result<Read> {
    loop {
        return match rustix::io::read(fd, buf) {
            Ok(0) => Ok(Read::Closed),
            Ok(n) => Ok(Read::Bytes(n)),
            Err(rustix::io::Errno::INTR) => continue,
            Err(rustix::io::Errno::AGAIN) => Err(std::io::ErrorKind::WouldBlock.into()),
            // EIO once the agent's side is closed; any other error ends the reading too (as
            // the reader thread before it did).
            Err(e) => {
                if e != rustix::io::Errno::IO {
                    tracing::debug!(error = %e, "reading the agent's terminal failed; taken as its end");
                }
                Ok(Read::Closed)
            }
        };
    }
}

/// Writes once to `fd`; `WouldBlock` when the agent's input buffer is full.
fn write_once(fd: &OwnedFd, bytes: &[u8]) -> std::io::Result<usize> {
    loop {
        return match rustix::io::write(fd, bytes) {
            Err(rustix::io::Errno::INTR) => continue,
            Err(rustix::io::Errno::AGAIN) => Err(std::io::ErrorKind::WouldBlock.into()),
            other => other.map_err(std::io::Error::from),
        };
    }
}

impl Pty {
    /// The agent's next output, as soon as there is some; `None` once its side of the
    /// terminal closed (it exited). Cancel-safe: nothing is read until the descriptor is
    /// readable, and a read completes without awaiting.
    pub(crate) async fn read(&mut self) -> Option<Vec<u8>> {
        if let Some(held) = self.held.pop_front() {
            return Some(held);
        }
        loop {
            let mut guard = match self.io.readable().await {
                Ok(g) => g,
                Err(e) => {
                    tracing::debug!(error = %e, "cannot wait for the agent's output; taken as its end");
                    return None;
                }
            };
            match guard.try_io(|fd| read_once(fd.get_ref(), &mut self.buf)) {
                Ok(Ok(Read::Bytes(n))) => {
                    if n < self.buf.len() {
                        // A short read emptied the PTY: the next read waits for new output
                        // instead of finding nothing (one syscall less per chunk, before the
                        // loop gets to relay it). Cleared only if no newer event came, as
                        // tokio's own sockets do.
                        guard.clear_ready();
                    }
                    return Some(self.buf[..n].to_vec());
                }
                Ok(Ok(Read::Closed) | Err(_)) => return None,
                // Nothing there after all (the readiness was stale): cleared, wait again.
                Err(_would_block) => {}
            }
        }
    }

    /// Writes `bytes` to the agent's input, from the loop: the PTY takes them at once unless
    /// its input buffer is full (the agent not reading). Then the agent's output is read
    /// meanwhile and held for [`Pty::read`]: an agent blocked printing (an echo, a log line)
    /// would otherwise never read its input again, and neither side would move.
    pub(crate) async fn write(&mut self, mut bytes: &[u8]) -> Result<(), WrapError> {
        let (io, buf, held) = (&self.io, &mut self.buf, &mut self.held);
        let mut closed = false;
        while !bytes.is_empty() {
            let readable = async {
                if closed {
                    std::future::pending().await
                } else {
                    io.readable().await
                }
            };
            tokio::select! {
                // Writable is the usual case, at once: the readiness stays set until a write
                // finds the buffer full.
                biased;
                w = io.writable() => {
                    let mut guard = w.map_err(|e| pty_err("cannot wait to write to the agent", e))?;
                    match guard.try_io(|fd| write_once(fd.get_ref(), bytes)) {
                        Ok(Ok(n)) => bytes = &bytes[n..],
                        Ok(Err(e)) => return Err(pty_err("write to the agent failed", e)),
                        // Full: cleared, so the next wait is for the agent to take some.
                        Err(_would_block) => {}
                    }
                }
                r = readable => {
                    let mut guard = r.map_err(|e| pty_err("cannot wait for the agent's output", e))?;
                    match guard.try_io(|fd| read_once(fd.get_ref(), buf)) {
                        Ok(Ok(Read::Bytes(n))) => held.push_back(buf[..n].to_vec()),
                        // The agent's side closed: the next write says so.
                        Ok(Ok(Read::Closed) | Err(_)) => closed = true,
                        Err(_would_block) => {}
                    }
                }
            }
        }
        Ok(())
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
    /// The terminal of `pty`, with the person's keys on `keys` (closed when there is no
    /// person).
    pub(crate) fn new(pty: Pty, keys: mpsc::Receiver<Vec<u8>>) -> Result<Self, WrapError> {
        use tokio::signal::unix::{SignalKind, signal};
        let signal_of = |kind| signal(kind).map_err(|e| WrapError::Terminal(e.to_string()));
        // Stopping the wrapper stops the agent and, through `RawMode`'s drop, gives the person
        // their terminal back as it was. In raw mode the keyboard sends no SIGINT or SIGQUIT
        // (its Ctrl-C and Ctrl-\ go to the agent as bytes), so those come from outside, like
        // SIGTERM: left to their default action they would end the wrapper with the terminal
        // still raw.
        Ok(Self {
            pty,
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
        // Every branch is cancel-safe: a channel or signal receive, or the PTY's read (see
        // `Pty::read`).
        Ok(tokio::select! {
            chunk = self.pty.read() => match chunk {
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
        self.pty.write(&self.paste.wrap(text)).await
    }

    async fn write_keys(&mut self, keys: Vec<u8>) -> Result<(), WrapError> {
        self.pty.write(&keys).await
    }

    async fn enter(&mut self) -> Result<(), WrapError> {
        self.pty.write(b"\r").await
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
