//! Test support: a real `agent-relay` daemon process on a private temporary directory, raw
//! protocol-v1 connections over its real Unix socket, and CLI invocations against it. The one
//! support tree of the e2e tests: test modules import helpers from here only, never from each
//! other.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

mod browser;
mod clis;
mod history;
mod mcp;
mod people;
mod raw;
mod terminals;
mod wrapped;

pub(crate) use browser::*;
pub(crate) use clis::*;
pub(crate) use history::*;
pub(crate) use mcp::*;
pub(crate) use people::*;
pub(crate) use raw::*;
pub(crate) use terminals::*;
pub(crate) use wrapped::*;

pub const BIN: &str = env!("CARGO_BIN_EXE_agent-relay");

/// `up` arguments that turn the rate limits off, for tests that move volume through one
/// sender or one pair (they test something else; the limits have their own tests).
pub const UNLIMITED: &[&str] = &["--rate-limit", "0", "--pair-rate-limit", "0"];

/// A daemon under test. Killed (SIGKILL) when dropped.
pub struct Relay {
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub child: Option<Child>,
    /// Extra `up --foreground` arguments for the daemon process.
    pub extra: Vec<String>,
    /// Extra environment for the daemon process.
    pub env: Vec<(String, String)>,
}

impl Relay {
    /// Starts a daemon with SQLite storage.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a daemon with extra `up --foreground` arguments.
    pub fn start_with(extra: &[&str]) -> Self {
        Self::start_with_env(extra, &[])
    }

    /// Starts a daemon with extra `up --foreground` arguments and environment.
    pub fn start_with_env(extra: &[&str], env: &[(&str, &str)]) -> Self {
        let mut relay = Self::unstarted();
        relay.extra = extra.iter().map(|s| s.to_string()).collect();
        relay.env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        relay.spawn();
        relay
    }

    /// A daemon started with extra `up --foreground` arguments, and raw agents `names`
    /// connected to it in that order (their WELCOMEs read).
    pub fn with_agents<const N: usize>(extra: &[&str], names: [&str; N]) -> (Self, [Raw; N]) {
        let relay = Self::start_with(extra);
        let agents = names.map(|name| relay.agent(name).0);
        (relay, agents)
    }

    /// A relay's directory (the project: files written there before [`Relay::spawn`] are
    /// there when the daemon starts), with no daemon yet.
    pub fn unstarted() -> Self {
        let dir = tempfile::Builder::new().prefix("ar").tempdir().unwrap();
        let socket = dir.path().join("r.sock");
        Self {
            dir,
            socket,
            child: None,
            extra: Vec::new(),
            env: Vec::new(),
        }
    }

    /// Writes `text` to `file` in the relay's directory (where agents' scripts and the project
    /// live).
    pub fn write(&self, file: impl AsRef<Path>, text: impl AsRef<[u8]>) {
        std::fs::write(self.dir.path().join(file), text).unwrap();
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// A command for the binary with this relay's environment.
    pub fn command(&self) -> Command {
        let mut c = Command::new(BIN);
        c.env("AGENT_RELAY_DATA_DIR", self.data_dir())
            .env("AGENT_RELAY_SOCKET", &self.socket)
            .env_remove("AGENT_RELAY_STORAGE_PATH")
            .env_remove("AGENT_RELAY_STORAGE_TYPE")
            .env("AGENT_RELAY_LOG", "debug,relay_daemon=trace")
            // Tests run many daemons at once: each dashboard on a free port of its own.
            .env("AGENT_RELAY_DASHBOARD_PORT", "0")
            .current_dir(self.dir.path());
        c
    }

    /// (Re)starts the daemon process and waits until it accepts connections.
    pub fn spawn(&mut self) {
        let log = append_log(&self.dir.path().join("daemon-test.log"));
        let child = self
            .command()
            .args(["up", "--foreground"])
            .args(&self.extra)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        wait_for(
            Duration::from_secs(20),
            "daemon accepts connections",
            || UnixStream::connect(&self.socket).is_ok(),
        );
    }

    /// The `up --foreground` arguments of the next [`Relay::spawn`].
    pub fn set_args(&mut self, extra: &[&str]) {
        self.extra = extra.iter().map(|s| s.to_string()).collect();
    }

    /// SIGKILL, no cleanup: what a crash looks like.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            kill9_child(&mut c);
        }
    }

    /// SIGTERM and wait.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("running");
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(c.id() as i32).unwrap(),
            rustix::process::Signal::Term,
        )
        .unwrap();
        c.wait().unwrap()
    }

    /// Runs `script` (shell text, saved as `file`) wrapped as agent `name` on a PTY with no
    /// input, to its end: the stand-in agent decides when the test has seen enough.
    pub fn run_wrapped(&self, name: &str, file: &str, script: &str) -> Output {
        std::fs::write(self.dir.path().join(file), script).unwrap();
        self.command()
            .args(["wrap", "--no-input", "-n", name, "--", "sh", file])
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// Starts the CLI with `args` against this relay, with no input and its stdout piped to
    /// the test; `stderr` says where its stderr goes (a wrapper with no terminal logs there).
    pub fn spawn_cli(&self, args: &[&str], stderr: Stdio) -> Child {
        self.command()
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap()
    }

    /// Runs the CLI with `args` against this relay.
    pub fn cli(&self, args: &[&str]) -> Output {
        self.command()
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("daemon-test.log")).unwrap_or_default()
    }

    pub fn connect(&self) -> Raw {
        Raw::connect(&self.socket)
    }

    /// Makes agent `name` known to the relay and leaves it offline: what is sent to it is
    /// kept for it (or expires) instead of being refused as sent to nobody.
    pub fn known_offline(&self, name: &str) {
        self.agent(name).0.bye();
        wait_for(
            Duration::from_secs(20),
            &format!("{name} is offline"),
            || !is_online(self, name),
        );
    }

    /// A client-crate connection to this relay as agent `name`.
    pub async fn client(&self, name: &str) -> relay_client::Client {
        let config = relay_client::ClientConfig::agent(self.socket.clone(), name);
        relay_client::Client::connect(config).await.unwrap()
    }

    /// A client-crate connection to this relay as tool `name` (it may send, and is handed
    /// nothing).
    pub async fn tool_client(&self, name: &str) -> relay_client::Client {
        let config = relay_client::ClientConfig::tool(self.socket.clone(), name);
        relay_client::Client::connect(config).await.unwrap()
    }

    /// A raw connection that completed HELLO/WELCOME as agent `name`.
    pub fn agent(&self, name: &str) -> (Raw, Value) {
        let mut c = self.connect();
        let welcome = c.hello(name, json!({}));
        (c, welcome)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            eprintln!("---- daemon log ----\n{}", self.log());
        }
    }
}

/// A multi-threaded tokio runtime for a test that drives the client crate.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The seed of a fault-injection test's random moments: `AGENT_RELAY_FAULT_SEED`, or a random
/// one; printed (naming `what`) so that a failure can be replayed with it.
pub fn fault_seed(what: &str) -> u64 {
    let seed = std::env::var("AGENT_RELAY_FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("{what} seed: {seed} (AGENT_RELAY_FAULT_SEED={seed} replays the moments)");
    seed
}

/// SIGKILL to `child`, and waits for it: what a crash looks like.
pub fn kill9_child(child: &mut Child) {
    child.kill().unwrap();
    child.wait().unwrap();
}

/// A child process killed (and waited for) when dropped, so a failing test leaves no wrapper
/// or agent running.
pub struct Reaped(pub Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `path` opened to append to (made when missing): a log a process writes across restarts.
pub fn append_log(path: &Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap()
}

/// Fails the test unless it runs as root: a test that acts as another user must never pass
/// without running. CI runs as root; elsewhere `scripts/test` leaves these tests out by name
/// and says so (add the test's name to `ROOT_TESTS` there).
pub fn require_root(to: &str) {
    assert!(
        rustix::process::getuid().is_root(),
        "this test needs root to {to}, and this is uid {}: run it as root (CI does), or leave it \
         out by name (scripts/test does when not root)",
        rustix::process::getuid().as_raw()
    );
}

/// One `#[test]` per case, each calling its `body` with the case's arguments: one test body
/// for each backend or each CLI, under the names the tests are run by. A case's doc comment
/// goes with it; one invocation may list several bodies.
macro_rules! tests_of {
    ($($body:path { $($(#[$attr:meta])* $name:ident($($arg:expr),* $(,)?);)+ })+) => {
        $($(
            $(#[$attr])*
            #[test]
            fn $name() {
                $body($($arg),*);
            }
        )+)+
    };
}
pub(crate) use tests_of;

/// Polls `cond` until it holds or `limit` passes (then panics naming `what`). Deadlines here
/// only bound a hang; no test asserts how fast anything is.
pub fn wait_for(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let end = relay_protocol::now_instant() + limit;
    while !cond() {
        assert!(
            relay_protocol::now_instant() < end,
            "timed out waiting until {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A raw protocol-v1 connection speaking frames by hand.
pub struct Raw {
    pub stream: UnixStream,
}

/// Message ids for every connection of the test process: unique across connections, so
/// that one agent's id is never another's (a test following one message by its id, in a
/// watch feed say, must not find another agent's message under it).
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Raw {
    pub fn connect(socket: &Path) -> Self {
        let stream = UnixStream::connect(socket).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        Self { stream }
    }

    /// A second handle on the same connection (for reading on another thread).
    pub fn reader(&self) -> Raw {
        Raw {
            stream: self.stream.try_clone().unwrap(),
        }
    }

    /// How long a read waits before giving up (20 s by default).
    pub fn read_timeout(&mut self, limit: Duration) {
        self.stream.set_read_timeout(Some(limit)).unwrap();
    }

    pub fn id(&mut self) -> String {
        let n = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        // Long enough to be read back by a prefix too (`read` wants 8 characters of one).
        format!("t{}-{:06}", std::process::id(), n)
    }

    pub fn write_bytes(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    /// Writes one frame holding `json`.
    pub fn write_json(&mut self, v: &Value) {
        let body = serde_json::to_vec(v).unwrap();
        let mut frame = (body.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(&body);
        self.write_bytes(&frame);
    }

    /// Writes an envelope of `ty` with `payload` and extra top-level fields.
    pub fn send_env(&mut self, ty: &str, extra: Value, payload: Value) -> String {
        let id = extra
            .get("id")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .unwrap_or_else(|| self.id());
        let mut env = json!({"v": 1, "type": ty, "id": id, "ts": 1, "payload": payload});
        if let Value::Object(m) = extra {
            for (k, v) in m {
                env[k] = v;
            }
        }
        self.write_json(&env);
        id
    }

    /// Reads one frame; `None` when the daemon closed the connection.
    pub fn read(&mut self) -> Option<Value> {
        let mut len = [0u8; 4];
        if self.stream.read_exact(&mut len).is_err() {
            return None;
        }
        let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
        self.stream.read_exact(&mut body).ok()?;
        Some(serde_json::from_slice(&body).unwrap())
    }

    /// Reads frames, answering PINGs, until one of type `ty` arrives.
    pub fn expect(&mut self, ty: &str) -> Value {
        loop {
            let f = self
                .read()
                .unwrap_or_else(|| panic!("connection closed while waiting for {ty}"));
            if f["type"] == ty {
                return f;
            }
            if f["type"] == "PING" {
                self.send_env("PONG", json!({}), json!({}));
                continue;
            }
            panic!("expected {ty}, got {f}");
        }
    }

    /// [`Raw::expect`] on a thread of its own (reading from now on, answering PINGs): the
    /// connection and the frame once it came.
    pub fn expect_on_a_thread(mut self, ty: &str) -> std::thread::JoinHandle<(Raw, Value)> {
        let ty = ty.to_owned();
        std::thread::spawn(move || {
            let f = self.expect(&ty);
            (self, f)
        })
    }

    /// True when the daemon has closed the connection (reading gives EOF), skipping frames.
    pub fn closed(&mut self) -> bool {
        for _ in 0..1000 {
            if self.read().is_none() {
                return true;
            }
        }
        false
    }

    pub fn hello(&mut self, name: &str, extra_payload: Value) -> Value {
        let mut payload = json!({"agent": name, "cli": "test"});
        if let Value::Object(m) = extra_payload {
            for (k, v) in m {
                payload[k] = v;
            }
        }
        self.send_env("HELLO", json!({}), payload);
        self.expect("WELCOME")
    }

    /// Says BYE and waits until the daemon has closed the connection.
    pub fn bye(&mut self) {
        self.send_env("BYE", json!({}), json!({}));
        assert!(self.closed(), "the connection stays open after BYE");
    }

    /// SEND `body` to `to` under the message id `id` (a test's own, to resend or to refuse).
    pub fn send_as_id(&mut self, id: &str, to: &str, body: &str) -> String {
        self.send_env("SEND", json!({"id": id, "to": to}), json!({"body": body}))
    }

    /// SEND `body` to `to`; returns the id.
    pub fn send(&mut self, to: &str, body: &str) -> String {
        self.send_env(
            "SEND",
            json!({"to": to}),
            json!({"kind": "message", "body": body}),
        )
    }

    pub fn ack(&mut self, deliver: &Value) {
        let seq = deliver["delivery"]["seq"].clone();
        self.send_env(
            "ACK",
            json!({}),
            json!({"ack_id": deliver["id"], "seq": seq}),
        );
    }
}

/// Runs `cmd` with `input` on its stdin (closed after it) and its stdout captured, to its end.
pub fn output_with_input(cmd: &mut Command, input: &[u8]) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

/// stdout of a successful CLI run.
pub fn ok_stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "command failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// The dashboard of `relay`: its port and token, from the URL file the daemon writes.
pub fn dashboard(relay: &Relay) -> (u16, String) {
    let file = relay.data_dir().join("dashboard.url");
    wait_for(Duration::from_secs(20), "the dashboard URL file", || {
        file.exists()
    });
    let url = std::fs::read_to_string(&file).unwrap();
    let url = url.trim();
    let rest = url
        .strip_prefix("http://127.0.0.1:")
        .unwrap_or_else(|| panic!("dashboard URL {url:?} is not on 127.0.0.1"));
    let (port, query) = rest.split_once("/?token=").unwrap();
    (port.parse().unwrap(), query.to_owned())
}

/// A plain HTTP/1.1 GET to the dashboard on 127.0.0.1: (status, body).
pub fn http_get(port: u16, target: &str, headers: &[(&str, &str)]) -> (u16, String) {
    http(port, "GET", target, headers)
}

/// An HTTP/1.1 request with no body; (status, body).
pub fn http(port: u16, method: &str, target: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut req = format!(
        "{method} {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\
         Content-Length: 0\r\n"
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    (status, body.to_owned())
}

/// GET that must answer 200 with JSON.
pub fn api(port: u16, token: &str, path: &str) -> Value {
    let sep = if path.contains('?') { '&' } else { '?' };
    let (status, body) = http_get(port, &format!("{path}{sep}token={token}"), &[]);
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
}

/// Sends `signal` to process `pid`.
pub fn signal_pid(pid: i32, signal: rustix::process::Signal) {
    rustix::process::kill_process(rustix::process::Pid::from_raw(pid).unwrap(), signal).unwrap();
}

/// The pid written in a pid or lock file.
pub fn pid_in(path: &Path) -> i32 {
    std::fs::read_to_string(path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Proves that `client` (agent `to`) is handed nothing more than it has had: a marker is
/// sent to it after everything else, and the next message it surfaces must be the marker
/// (deliveries go out in store order, so a duplicate or a replay would come first). Waiting
/// a while and seeing nothing proves nothing on a loaded machine; the marker is an event.
pub async fn nothing_before_a_marker(socket: &Path, client: &mut relay_client::Client, to: &str) {
    use relay_client::{Client, ClientConfig, Event, Outgoing};
    let marker = Client::connect(ClientConfig::tool(socket.to_path_buf(), "Marker"))
        .await
        .unwrap();
    let body = "marker: sent after everything else";
    marker.send(Outgoing::new(to, body)).await.unwrap();
    loop {
        match tokio::time::timeout(Duration::from_secs(30), client.next_event()).await {
            Ok(Some(Event::Message(m))) if m.payload.body == body => {
                client.ack(&m, None).await.unwrap();
                break;
            }
            Ok(Some(Event::Message(m))) => panic!("delivered before the marker: {m:?}"),
            Ok(Some(_)) => {}
            other => panic!("the marker did not arrive: {other:?}"),
        }
    }
    marker.close().await;
}

/// Runs `down` when dropped: a daemon started in the background (by a wrapper, or by `up`) is
/// no child of the test, and a failing test must not leave it running.
pub(crate) struct Down<'a>(pub(crate) &'a Relay);

impl Drop for Down<'_> {
    fn drop(&mut self) {
        let out = self.0.cli(&["down"]);
        if !out.status.success() {
            eprintln!("down: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
}
