//! The dashboard's token is the project's (issue 24.10): kept (0600) in the data directory
//! across restarts, replaced by `agent-relay dashboard --rotate-token`, and a page whose token
//! is refused says so instead of "reconnecting…" forever.

use crate::support::*;

/// A free loopback port, for a dashboard that must keep its port across a restart.
fn free_port() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port().to_string()
}

/// The same token after a restart (the old URL's token is accepted by the new dashboard, and
/// `agent-relay dashboard` prints it); `--rotate-token` makes a new one that the running
/// dashboard takes at once, refusing the old. Before, every start made a new token.
#[test]
fn the_dashboard_token_is_kept_across_restarts_and_rotated_by_a_command() {
    use std::os::unix::fs::PermissionsExt;
    let mut relay = Relay::start();
    let (port, token) = dashboard(&relay);
    let stats =
        |port: u16, token: &str| http_get(port, &format!("/api/stats?token={token}"), &[]).0;
    assert_eq!(stats(port, &token), 200);
    let file = relay.data_dir().join("dashboard.token");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    relay.stop();
    relay.spawn();
    let (port, again) = dashboard(&relay);
    assert_eq!(again, token, "the token changed at the restart");
    assert_eq!(stats(port, &token), 200);
    let printed = ok_stdout(&relay.cli(&["dashboard"]));
    assert!(
        printed.trim().ends_with(&format!("?token={token}")),
        "{printed}"
    );

    let out = ok_stdout(&relay.cli(&["dashboard", "--rotate-token"]));
    let (_, new) = dashboard(&relay);
    assert_ne!(new, token);
    assert!(out.contains(&new), "{out}");
    assert_eq!(stats(port, &token), 401, "the old token is still accepted");
    assert_eq!(stats(port, &new), 200);
}

/// Real Chromium on the dashboard page; the token is rotated and the relay restarted (on the
/// same port): the page, whose stream the new relay refuses, says its token was refused and
/// which command prints the URL, instead of "reconnecting…" over stale figures.
#[test]
fn a_dashboard_page_whose_token_is_refused_says_so() {
    let port = free_port();
    let mut relay = Relay::start_with_env(&[], &[("AGENT_RELAY_DASHBOARD_PORT", &port)]);
    let url = std::fs::read_to_string(relay.data_dir().join("dashboard.url")).unwrap();
    let mut browser = Browser::start("refused.mjs", &[url.trim()]);
    assert_eq!(browser.next("READY"), "READY");
    ok_stdout(&relay.cli(&["dashboard", "--rotate-token"]));
    relay.stop();
    relay.spawn();
    let (again, _) = dashboard(&relay);
    assert_eq!(
        again.to_string(),
        port,
        "the dashboard is on its port again"
    );
    browser.say("GO");
    let last = browser.next("OK");
    assert!(browser.passed(), "browser checks failed");
    assert_eq!(last, "OK");
}
