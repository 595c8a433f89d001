//! The dashboard in a real browser: a script of `tests/browser/` run by node, driving Debian's
//! Chromium with playwright-core, that tells the test what it saw a line at a time.

use super::*;
use std::io::BufRead;
use std::sync::mpsc;

/// A running browser script: its lines arrive on a channel, the test's cues go to its stdin.
/// Killed when dropped, so a failing test leaves no browser behind.
pub(crate) struct Browser {
    node: Child,
    lines: mpsc::Receiver<String>,
}

impl Browser {
    /// Runs `node tests/browser/SCRIPT ARGS...` (playwright-core must be installed there).
    pub(crate) fn start<S: AsRef<std::ffi::OsStr>>(script: &str, args: &[S]) -> Self {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/browser");
        assert!(
            dir.join("node_modules/playwright-core").exists(),
            "playwright-core is missing: `npm ci --prefix tests/browser` (.ci/run and scripts/test run it)"
        );
        let mut node = Command::new("node")
            .arg(dir.join(script))
            .args(args)
            .current_dir(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("node is missing: install Node.js (Debian: apt-get install nodejs npm)");
        let out = node.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Self { node, lines }
    }

    /// The script's next line, which should say `what` (bounded at 90 s: a browser on a loaded
    /// machine is slow).
    pub(crate) fn next(&self, what: &str) -> String {
        self.lines
            .recv_timeout(Duration::from_secs(90))
            .unwrap_or_else(|_| panic!("the browser script did not say {what}"))
    }

    /// Tells the script `line` (it waits for the test's cues on stdin).
    pub(crate) fn say(&mut self, line: &str) {
        writeln!(self.node.stdin.as_mut().unwrap(), "{line}").unwrap();
    }

    /// Waits for the script to end; true when all its checks passed.
    pub(crate) fn passed(&mut self) -> bool {
        self.node.wait().unwrap().success()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if self.node.try_wait().ok().flatten().is_none() {
            let _ = self.node.kill();
            let _ = self.node.wait();
        }
    }
}
