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
    child: Box<dyn Child + Send + Sync>,
}

impl Pty {
    /// The agent's process id (its CLI, or what starts it).
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.process_id()
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
            child,
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
        let _ = self.child.kill();
    }

    /// Waits for the agent to exit; its exit code.
    pub(crate) fn wait(mut self) -> Result<i32, WrapError> {
        let status = self
            .child
            .wait()
            .map_err(|e| pty_err("cannot wait for the agent", e))?;
        Ok(i32::try_from(status.exit_code()).unwrap_or(1))
    }
}
