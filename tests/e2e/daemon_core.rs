//! The daemon's core under many agents (issue 13).

use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::support::*;

/// Connecting agents does not rewrite `agents.json` once per connection: each rewrite costs
/// O(agents), which made connecting 10,000 agents quadratic (~65 connections a second at the
/// end; measured in docs/PERFORMANCE.md). The file follows membership at most once a second,
/// and ends up listing everyone.
#[test]
fn agents_json_is_rewritten_at_most_once_a_second_however_many_connect() {
    const N: usize = 300;
    let relay = Relay::start_with(&["--max-connections", "1000"]);
    let path = relay.data_dir().join("agents.json");
    // Each rewrite is a rename of a new file over the old one: a new inode. Counted by a
    // watcher while the agents connect (it may miss some; it never sees more than there were).
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (path, stop) = (path.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut seen = 0usize;
            let mut last = None;
            while !stop.load(Ordering::Relaxed) {
                let ino = std::fs::metadata(&path).ok().map(|m| m.ino());
                if ino.is_some() && ino != last {
                    seen += 1;
                    last = ino;
                }
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            seen
        })
    };
    let start = relay_protocol::now_instant();
    let conns: Vec<_> = (0..N).map(|i| relay.agent(&format!("a{i}")).0).collect();
    wait_for(
        std::time::Duration::from_secs(20),
        "agents.json to list every agent",
        || {
            std::fs::read_to_string(&path).is_ok_and(|t| {
                serde_json::from_str::<serde_json::Value>(&t)
                    .is_ok_and(|v| v["agents"].as_array().is_some_and(|a| a.len() == N))
            })
        },
    );
    let secs = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let writes = watcher.join().unwrap();
    // The first version seen, then at most one per second of connecting (plus the tick in
    // progress).
    assert!(
        (writes as f64) <= secs.ceil() + 2.0,
        "{writes} rewrites of agents.json in {secs:.1} s for {N} connections"
    );
    drop(conns);
}
