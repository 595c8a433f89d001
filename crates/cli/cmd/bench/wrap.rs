//! `agent-relay bench --wrap pty|tmux`: how long a directive takes from the moment an agent
//! prints it to the moment its text reaches the recipient's terminal, both agents wrapped.
//!
//! Two scripted agents (this binary's hidden `bench-agent`): the sender prints
//! `@relay:BenchB lat <seq> <unix ns>` every `--interval-ms`; the recipient puts its
//! terminal in raw mode and notes the time at which the first byte of each typed message
//! arrives. Both read the same clock. The profile's quiet times are set to zero through a
//! profile override, so the figures exclude them by construction (with real profiles, add
//! `settle_ms` on the sender's side and `quiet_ms` on the recipient's); Enter and its delay
//! come after the measured moment. The interval must exceed the recipient's Enter and
//! verification cycle (50 ms here), or queueing is measured instead.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;

use crate::args::{Backend, BenchAgentArgs, BenchArgs};
use crate::out::{json, line};

/// The wall clock in nanoseconds: a hop's two ends are in different processes, so only the
/// wall clock compares them, finer than `now_ms`.
#[expect(
    clippy::disallowed_methods,
    reason = "a cross-process latency needs the wall clock in nanoseconds"
)]
fn unix_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// The hidden `bench-agent`: sends with `--to`, else receives.
pub(crate) fn agent(args: &BenchAgentArgs) -> anyhow::Result<()> {
    match &args.to {
        Some(to) => {
            let mut out = std::io::stdout();
            // Let the recipient's wrapper connect and go quiet first.
            std::thread::sleep(Duration::from_millis(500));
            for seq in 0..args.count {
                write!(out, "@relay:{to} lat {seq} {}\r\n", unix_ns())?;
                out.flush()?;
                std::thread::sleep(Duration::from_millis(args.interval_ms));
            }
            // Stay until stopped: the wrapper ends with the agent.
            std::thread::sleep(Duration::from_secs(3600));
            Ok(())
        }
        None => receive(
            args.out
                .as_deref()
                .context("--out is required to receive")?,
        ),
    }
}

fn receive(out: &Path) -> anyhow::Result<()> {
    let stdin = std::io::stdin();
    if let Ok(mut t) = rustix::termios::tcgetattr(&stdin) {
        t.make_raw();
        let _ = rustix::termios::tcsetattr(&stdin, rustix::termios::OptionalActions::Now, &t);
    }
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(out)?;
    let mut buf = [0u8; 4096];
    let mut line: Vec<u8> = Vec::new();
    let mut first_byte_at: Option<u128> = None;
    let mut stdin = stdin.lock();
    let mut stdout = std::io::stdout();
    loop {
        let n = stdin.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        let at = unix_ns();
        for &b in &buf[..n] {
            if b == b'\r' || b == b'\n' {
                let text = String::from_utf8_lossy(&line);
                // "... lat <seq> <ns>" (bracketed-paste markers around it are ignored).
                let mut words = text.split(|c: char| c.is_whitespace() || c == '\x1b');
                if words.any(|w| w == "lat") {
                    let _seq = words.next();
                    let sent: Option<u128> = words.next().and_then(|w| {
                        w.trim_end_matches(|c: char| !c.is_ascii_digit())
                            .parse()
                            .ok()
                    });
                    if let (Some(sent), Some(first)) = (sent, first_byte_at) {
                        writeln!(file, "{}", first.saturating_sub(sent) / 1000)?;
                    }
                }
                line.clear();
                first_byte_at = None;
                // Move to a new line, as a line-reading program would: the wrapper sees the
                // input submitted.
                stdout.write_all(b"\r\n")?;
                stdout.flush()?;
            } else {
                if first_byte_at.is_none() {
                    first_byte_at = Some(at);
                }
                line.push(b);
            }
        }
    }
}

/// Kills what the bench started, on every way out.
struct Cleanup {
    children: Vec<std::process::Child>,
    /// tmux: the private server's directory, and the team directory whose relaying processes
    /// (started by `wrap --detached`, not children of the bench) end with their sessions.
    tmux_dir: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some((dir, team)) = &self.tmux_dir {
            // Cleaning up on the way out: a failure here has nothing left to lose, but is said.
            match Command::new("tmux")
                .env("TMUX_TMPDIR", dir)
                .arg("kill-server")
                .output()
            {
                Ok(out) if out.status.success() => {}
                Ok(out) => tracing::debug!(
                    stderr = %String::from_utf8_lossy(&out.stderr),
                    "tmux kill-server"
                ),
                Err(e) => eprintln!("agent-relay: cannot stop the bench's tmux server: {e}"),
            }
            // The relaying processes notice their sessions ended and exit; waited for so that
            // none of them is left asking tmux about a session in a directory removed under it.
            let deadline = relay_protocol::now_instant() + Duration::from_secs(10);
            while relaying_lives(team) && relay_protocol::now_instant() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        for c in &mut self.children {
            if let Err(e) = c.kill().and_then(|()| c.wait().map(drop)) {
                eprintln!("agent-relay: cannot stop a bench wrapper: {e}");
            }
        }
    }
}

/// Whether a relaying process still holds one of the relay locks under `team`.
fn relaying_lives(team: &Path) -> bool {
    use rustix::fs::{FlockOperation, flock};
    let Ok(entries) = std::fs::read_dir(team) else {
        return false;
    };
    entries.flatten().any(|e| {
        std::fs::File::open(e.path().join("relay.lock")).is_ok_and(|f| {
            flock(&f, FlockOperation::NonBlockingLockShared) == Err(rustix::io::Errno::WOULDBLOCK)
        })
    })
}

/// `bench --wrap`.
pub(crate) fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let backend = args.wrap.unwrap_or(Backend::Pty);
    let n = args.messages.min(100_000);
    let (socket, daemon) = super::start_private(args.storage.as_str(), args.durability, &[])?;
    let dir = tempfile::Builder::new()
        .prefix("relay-wrapbench")
        .tempdir()?;
    let profiles = dir.path().join("profiles");
    std::fs::create_dir_all(&profiles)?;
    // No quiet times (excluded by construction), and a short Enter/verify cycle so that the
    // recipient is idle again when the next directive comes.
    std::fs::write(
        profiles.join("generic.toml"),
        "settle_ms = 0\nquiet_ms = 0\nenter_delay_ms = 20\nverify_after_ms = 30\n",
    )?;
    let out = dir.path().join("latency.txt");
    let exe = std::env::current_exe()?;
    let mut cleanup = Cleanup {
        children: Vec::new(),
        tmux_dir: (backend == Backend::Tmux)
            .then(|| (dir.path().to_path_buf(), dir.path().join("data/team"))),
    };
    let wrap = |name: &str, agent: &[String]| -> anyhow::Result<Option<std::process::Child>> {
        let mut cmd = Command::new(&exe);
        cmd.args([
            "wrap",
            "--backend",
            backend.as_str(),
            "--profile",
            "generic",
            "-n",
            name,
        ]);
        if backend == Backend::Tmux {
            cmd.arg("--detached");
        } else {
            cmd.arg("--no-input");
        }
        cmd.arg("--")
            .arg(&exe)
            .args(agent)
            .current_dir(dir.path())
            .env("AGENT_RELAY_SOCKET", &socket)
            .env("AGENT_RELAY_DATA_DIR", dir.path().join("data"))
            .env("AGENT_RELAY_PROFILE_DIR", &profiles)
            .env("TMUX_TMPDIR", dir.path())
            .env_remove("TMUX")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // Kept for the error message when an agent never connects.
            .stderr(std::fs::File::create(
                dir.path().join(format!("{name}.stderr")),
            )?);
        if backend == Backend::Tmux {
            let status = cmd.status()?;
            anyhow::ensure!(status.success(), "cannot start {name} in tmux");
            Ok(None)
        } else {
            Ok(Some(cmd.spawn()?))
        }
    };
    let recv = vec![
        "bench-agent".to_owned(),
        "--out".to_owned(),
        out.display().to_string(),
    ];
    cleanup.children.extend(wrap("BenchB", &recv)?);
    // The sender starts once the recipient is connected (a directive to an unknown name is
    // refused).
    let deadline = relay_protocol::now_instant() + Duration::from_secs(60);
    while !agent_online(&exe, &socket, "BenchB") {
        if relay_protocol::now_instant() > deadline {
            anyhow::bail!(
                "the recipient (BenchB, {} backend) did not connect within 60 s.\n{}",
                backend.as_str(),
                wrapper_logs(dir.path())
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let send = vec![
        "bench-agent".to_owned(),
        "--to".to_owned(),
        "BenchB".to_owned(),
        "-n".to_owned(),
        n.to_string(),
        "--interval-ms".to_owned(),
        args.interval_ms.to_string(),
    ];
    cleanup.children.extend(wrap("BenchA", &send)?);
    let deadline = relay_protocol::now_instant() + Duration::from_secs(args.timeout);
    let mut lat: Vec<u64> = loop {
        let got: Vec<u64> = std::fs::read_to_string(&out)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        if got.len() >= n {
            break got;
        }
        if relay_protocol::now_instant() > deadline {
            anyhow::bail!(
                "only {} of {n} messages arrived within {} s.\n{}",
                got.len(),
                args.timeout,
                wrapper_logs(dir.path())
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    drop(cleanup);
    drop(daemon);
    lat.sort_unstable();
    let (p50, p99, max) = (
        super::percentile(&lat, 0.50),
        super::percentile(&lat, 0.99),
        lat.last().copied().unwrap_or(0),
    );
    if args.json {
        return json(&serde_json::json!({
            "backend": backend.as_str(),
            "messages": lat.len(),
            "interval_ms": args.interval_ms,
            "p50_us": p50,
            "p99_us": p99,
            "max_us": max,
        }));
    }
    line(format!(
        "{} backend, {} directives, one every {} ms: printed → typed into the recipient's terminal \
         p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms (profile quiet times set to 0)",
        backend.as_str(),
        lat.len(),
        args.interval_ms,
        p50 as f64 / 1000.0,
        p99 as f64 / 1000.0,
        max as f64 / 1000.0
    ))?;
    Ok(())
}

/// Both wrappers' stderr and relaying logs, for an error that says why.
fn wrapper_logs(dir: &Path) -> String {
    let read = |p: std::path::PathBuf| match std::fs::read_to_string(&p) {
        Ok(text) => text,
        Err(e) => format!("({}: {e})", p.display()),
    };
    ["BenchB", "BenchA"]
        .iter()
        .map(|name| {
            format!(
                "{name}'s wrapper stderr:\n{}\n{name}'s relaying log:\n{}",
                read(dir.join(format!("{name}.stderr"))),
                read(dir.join(format!("data/team/{name}/wrap.log"))),
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn agent_online(exe: &Path, socket: &Path, name: &str) -> bool {
    let Ok(out) = Command::new(exe)
        .args(["agents", "--json"])
        .env("AGENT_RELAY_SOCKET", socket)
        .stdin(Stdio::null())
        .output()
    else {
        return false;
    };
    serde_json::from_slice::<serde_json::Value>(&out.stdout)
        .ok()
        .and_then(|v| v.as_array().cloned())
        .is_some_and(|a| a.iter().any(|x| x["name"] == name && x["online"] == true))
}
