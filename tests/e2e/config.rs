//! The project configuration file, `.agent-relay/config.toml` (issue 12): its place in the
//! order flag > environment > file > default, as `agent-relay config` shows it and as the
//! daemon (started by `up` or by a wrapper) runs with it; its line-numbered errors; and its
//! profile overrides reaching a wrapped agent.

use std::process::{Output, Stdio};

use serde_json::{Value, json};

use crate::support::*;

const FILE: &str = ".agent-relay/config.toml";

fn write_config(relay: &Relay, text: &str) {
    let path = relay.dir.path().join(FILE);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// `agent-relay config --json` in the relay's project with extra environment.
fn config(relay: &Relay, env: &[(&str, &str)]) -> Value {
    let out = relay
        .command()
        .args(["config", "--json"])
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    serde_json::from_str(&ok_stdout(&out)).unwrap()
}

fn status(relay: &Relay) -> Value {
    serde_json::from_str(&ok_stdout(&relay.cli(&["status", "--json"]))).unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Each level of the order in turn: a default, the file over it, the environment over the
/// file, an option over the environment, shown by `agent-relay config --json` with its source
/// and obeyed by the daemon (`status` reports the store it opened; a file's `rate-limit = 1`
/// refuses a sender's second message). `up` then refuses to join the running relay once the
/// file says otherwise, naming the file's line.
#[test]
fn the_config_file_sits_between_defaults_and_the_environment_and_options_beat_both() {
    let mut relay = Relay::unstarted();
    let v = config(&relay, &[]);
    assert_eq!(v["file"], Value::Null, "{v}");
    assert_eq!(
        v["up"]["rate-limit"],
        json!({"value": "100", "source": "default"})
    );
    assert_eq!(
        v["up"]["storage"],
        json!({"value": "sqlite", "source": "default"})
    );

    // The file overrides the defaults.
    write_config(
        &relay,
        "# this project's relay\n[up]\nrate-limit = 1\nstorage = \"memory\"\n",
    );
    let v = config(&relay, &[]);
    assert_eq!(
        v["up"]["rate-limit"],
        json!({"value": "1", "source": format!("file {FILE}:3")})
    );
    assert_eq!(
        v["up"]["storage"],
        json!({"value": "memory", "source": format!("file {FILE}:4")})
    );
    assert_eq!(
        v["up"]["max-hops"],
        json!({"value": "10", "source": "default"})
    );
    relay.spawn();
    assert_storage_and_rate_limit(&relay, "memory", "1");
    let (_bob, _) = relay.agent("Bob");
    ok_stdout(&relay.cli(&["send", "--from", "Alice", "Bob", "one"]));
    let second = relay.cli(&["send", "--from", "Alice", "Bob", "two"]);
    assert_eq!(second.status.code(), Some(5), "{second:?}");
    assert!(
        stderr(&second).contains("Alice sent 1 messages in the last 60 s"),
        "{second:?}"
    );

    // The file changed while the relay runs: `up` says the file asks for something else.
    write_config(
        &relay,
        "# this project's relay\n[up]\nrate-limit = 2\nstorage = \"memory\"\n",
    );
    let out = relay.cli(&["up"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "--rate-limit: it runs with 1, you asked for 2 (file {FILE}:3)"
        )) && !err.contains("--storage:")
            && err.contains("agent-relay down && agent-relay up\n"),
        "{err}"
    );
    relay.stop();

    // The environment overrides the file.
    let env = [("AGENT_RELAY_STORAGE_TYPE", "sqlite")];
    let v = config(&relay, &env);
    assert_eq!(
        v["up"]["storage"],
        json!({"value": "sqlite", "source": "env AGENT_RELAY_STORAGE_TYPE"})
    );
    assert_eq!(v["up"]["rate-limit"]["source"], format!("file {FILE}:3"));
    relay.env = vec![("AGENT_RELAY_STORAGE_TYPE".into(), "sqlite".into())];
    relay.spawn();
    assert_eq!(status(&relay)["storage"], "sqlite");
    relay.stop();

    // An option overrides the environment.
    relay.extra = vec!["--storage".into(), "memory".into()];
    relay.spawn();
    assert_storage_and_rate_limit(&relay, "memory", "2");
}

/// The running relay's storage and rate limit are `storage` and `rate_limit` (its `status`).
fn assert_storage_and_rate_limit(relay: &Relay, storage: &str, rate_limit: &str) {
    let s = status(relay);
    assert_eq!(
        (&s["storage"], &s["settings"]["rate-limit"]),
        (&json!(storage), &json!(rate_limit)),
        "{s}"
    );
}

/// A wrapper that finds no relay starts one with the project's file, as `up` would.
#[test]
fn a_relay_a_wrapper_starts_runs_with_the_config_file() {
    let relay = Relay::unstarted();
    write_config(&relay, "[up]\nmax-hops = 4\ninbox-ttl = \"10m\"\n");
    let _down = Down(&relay);
    let out = relay
        .command()
        .args(["-n", "Solo", "sh", "-c", "echo working"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let s = status(&relay);
    assert_eq!(
        (&s["settings"]["max-hops"], &s["settings"]["inbox-ttl"]),
        (&json!("4"), &json!("600")),
        "{s}"
    );
}

/// An unknown key and a value of the wrong kind are refused with exit 2 (bad usage), naming
/// the file, the line and the column, and what is allowed; `up` starts nothing then.
#[test]
fn config_file_errors_name_the_line_and_what_is_allowed() {
    let relay = Relay::unstarted();
    let path = relay.dir.path().join(FILE);
    let path = path.display();
    let cases = [
        (
            "[up]\nmax-hops = 4\n\ninbox-tll = 600\n",
            format!("{path}:4:1: unknown setting \"inbox-tll\" in [up];"),
            "the settings are: storage, durability, inbox-ttl",
        ),
        (
            "# limits\n[up]\nmax-hops = \"ten\"\n",
            format!("{path}:3:12: max-hops = \"ten\": expected a whole number from 0 to"),
            "without quotes",
        ),
        (
            "[up]\nstorage = \"sqlite\"\n\n[profiles.claude]\nquiet_ms = 800\nquiet = 1\n",
            format!("{path}:6:1: [profiles.claude] quiet: unknown field `quiet`"),
            "`quiet_ms`",
        ),
        (
            "[cluster]\nurls = \"nats://a\"\n",
            format!("{path}:1:2: unknown field `cluster`"),
            "[up]",
        ),
    ];
    for (text, starts, allowed) in &cases {
        write_config(&relay, text);
        for cmd in [&["config"][..], &["up"][..]] {
            let out = relay.cli(cmd);
            let err = stderr(&out);
            assert_eq!(out.status.code(), Some(2), "{cmd:?} {text:?}: {err}");
            assert!(
                err.starts_with(&format!("agent-relay: {starts}")) && err.contains(allowed),
                "{cmd:?} {text:?}: {err}"
            );
        }
    }
    assert_eq!(
        relay.cli(&["status"]).status.code(),
        Some(3),
        "nothing started"
    );
    // A file named by AGENT_RELAY_CONFIG must exist.
    let out = relay
        .command()
        .arg("config")
        .env("AGENT_RELAY_CONFIG", relay.dir.path().join("nowhere.toml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(stderr(&out).contains("nowhere.toml"), "{out:?}");
}

/// `[profiles.generic] busy = []` takes "esc to interrupt" out of the generic profile's busy
/// markers: an agent whose screen keeps showing it (which would hold every message back by
/// default) gets its message typed in.
#[test]
fn a_profile_override_in_the_config_file_reaches_the_wrapped_agent() {
    let mut relay = Relay::unstarted();
    write_config(&relay, "[profiles.generic]\nbusy = []\n");
    relay.spawn();
    let v = config(&relay, &[]);
    assert_eq!(
        v["profiles"]["generic"]["busy"],
        json!({"value": "[]", "source": format!("file {FILE}:2")})
    );
    let agent = spawn_script(
        &relay,
        "Stuck",
        PTY_GENERIC,
        "printf '* Working (esc to interrupt)\\n'\n\
         while IFS= read -r l; do echo \"got: $l\"; exit 0; done\n",
    );
    wait_online(&relay, "Stuck");
    ok_stdout(&relay.cli(&["send", "Stuck", "typed despite the marker"]));
    let (code, out) = output_of(agent);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("got: Relay message from human [")
            && out.contains("]: typed despite the marker"),
        "{out}"
    );
}
