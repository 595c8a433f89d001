//! The relay's MCP server as an agent's client speaks to it: JSON-RPC over stdio.

use super::*;

/// Agent `name` under a PTY wrapper whose agent command is its MCP server (in its session, with
/// its door key): the wrapper, the MCP client on the server, and the server's pipes; returns
/// once the relay has the agent online.
pub(crate) fn pty_wrapped_mcp(relay: &Relay, name: &str) -> (Child, Mcp, SessionPipes) {
    let fifos = SessionPipes::new(relay, name);
    let command = fifos.command();
    let command: Vec<&str> = command.iter().map(String::as_str).collect();
    let wrapper = relay
        .command()
        .args(wrap_args(
            name,
            &["--no-input", "--backend", "pty"],
            &command,
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mcp = fifos.connect();
    wait_online(relay, name);
    (wrapper, mcp, fifos)
}

/// The line of `text` that starts with `prefix` ("" when none does): an agent's row in
/// `relay_agents`' answer, say.
pub(crate) fn line_starting<'a>(text: &'a str, prefix: &str) -> &'a str {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_default()
}

/// An MCP client on `agent-relay mcp`'s stdio: JSON-RPC, one message per line.
pub(crate) struct Mcp {
    /// The server, when this test started it (else it runs inside a wrapped agent).
    child: Option<std::process::Child>,
    stdin: Box<dyn Write + Send>,
    stdout: std::io::BufReader<Box<dyn std::io::Read + Send>>,
    next: u64,
}

impl Mcp {
    pub(crate) fn start(relay: &Relay, name: &str) -> Self {
        let mut child = relay
            .command()
            .args(["mcp", "--name", name])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        Self::over(Some(child), Box::new(stdin), Box::new(stdout))
    }

    /// A client of the server whose stdin is `stdin` and stdout `stdout`, initialized.
    pub(crate) fn over(
        child: Option<std::process::Child>,
        stdin: Box<dyn Write + Send>,
        stdout: Box<dyn std::io::Read + Send>,
    ) -> Self {
        let mut mcp = Self {
            child,
            stdin,
            stdout: std::io::BufReader::new(stdout),
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
    pub(crate) fn call(&mut self, method: &str, params: Value) -> Value {
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
    pub(crate) fn tool(&mut self, name: &str, args: Value) -> (bool, String) {
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
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Pipes for an MCP server run inside a wrapped agent (so that it has the agent's environment,
/// as a CLI's MCP server has): the agent's command is `agent-relay mcp` reading `in` and
/// writing `out`.
pub(crate) struct SessionPipes {
    dir: PathBuf,
}

impl SessionPipes {
    pub(crate) fn new(relay: &Relay, name: &str) -> Self {
        let dir = relay.dir.path().join(format!("fifos-{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in ["in", "out"] {
            let ok = Command::new("mkfifo")
                .arg(dir.join(f))
                .status()
                .unwrap()
                .success();
            assert!(ok, "mkfifo");
        }
        Self { dir }
    }

    /// The agent's command: its MCP server on the pipes (the server's log in `err`).
    pub(crate) fn command(&self) -> Vec<String> {
        let p = |f: &str| self.dir.join(f).to_string_lossy().into_owned();
        vec![
            "sh".into(),
            "-c".into(),
            // Not `exec`: the shell keeps the terminal open (a PTY wrapper takes its closing
            // for the agent's end).
            r#""$0" mcp <"$1" >"$2" 2>>"$3""#.into(),
            BIN.into(),
            p("in"),
            p("out"),
            p("err"),
        ]
    }

    /// Starts agent `name` detached in tmux (`wrap --backend tmux --detached`), its command
    /// [`SessionPipes::command`]: a wrapped agent whose MCP server the test speaks to.
    pub(crate) fn wrap_in_tmux(&self, relay: &Relay, name: &str) {
        let command = self.command();
        let command: Vec<&str> = command.iter().map(String::as_str).collect();
        let out = wrap_cmd(relay, &wrap_args(name, TMUX_DETACHED, &command))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A shell line that starts the server in the background (for an agent script that goes
    /// on reading its terminal).
    pub(crate) fn background(&self) -> String {
        let p = |f: &str| self.dir.join(f).display().to_string();
        format!(
            "'{BIN}' mcp <'{}' >'{}' 2>>'{}' &",
            p("in"),
            p("out"),
            p("err")
        )
    }

    /// The MCP client on the pipes, once the agent's server opened them.
    pub(crate) fn connect(&self) -> Mcp {
        let (tx, rx) = std::sync::mpsc::channel();
        let (inp, out) = (self.dir.join("in"), self.dir.join("out"));
        std::thread::spawn(move || {
            // Each open waits for the server's end of its pipe.
            let w = std::fs::OpenOptions::new().write(true).open(inp).unwrap();
            let r = std::fs::File::open(out).unwrap();
            let _ = tx.send((w, r));
        });
        let (w, r) = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("the agent's MCP server never opened its pipes"));
        Mcp::over(None, Box::new(w), Box::new(r))
    }

    pub(crate) fn server_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("err")).unwrap_or_default()
    }
}
