//! Fault injection: the daemon is killed with SIGKILL at random moments, again and again,
//! during a long exchange between several agents (client-library agents that reconnect,
//! re-send and de-duplicate as wrappers do). Afterwards every accepted message reached its
//! recipient exactly once or is in the dead-letter queue with a reason, and the SQLite file
//! passes `PRAGMA integrity_check`. (Killing wrappers is covered with the wrapper's tests.)

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use relay_client::{Event, Outgoing};
use relay_protocol::AckStatus;

use crate::support::*;

const AGENTS: usize = 4;
const PER_AGENT: usize = 200;
const KILLS: usize = 10;

/// (recipient) -> every (sender, id) its agent was handed, in order, repeats included.
type Received = Arc<Mutex<HashMap<String, Vec<(String, String)>>>>;

#[test]
fn kill9_at_random_moments_during_a_multi_agent_exchange_loses_and_doubles_nothing() {
    let seed = fault_seed("fault-injection");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    // A short inbox TTL: what is sent to the agent that never comes back expires during the
    // run, so dead-lettering and the senders' notices are crossed by kills too.
    let mut args = UNLIMITED.to_vec();
    args.extend(["--inbox-ttl", "1"]);
    let mut relay = Relay::start_with(&args);
    let rt = rt();
    let mut names: Vec<String> = (0..AGENTS).map(|i| format!("agent{i}")).collect();
    names.push("sleeper".into());
    let received: Received = Arc::default();
    let (accepted, statuses) = rt.block_on(async {
        // Known, then gone for good.
        relay.client("sleeper").await
            .close()
            .await;
        let mut clients = Vec::new();
        for n in &names[..AGENTS] {
            clients.push(relay.client(n).await);
        }
        // Each agent both receives (acknowledging everything) and sends; a client is one
        // task's, so each agent's sending goes through a channel to that task.
        let mut senders = Vec::new();
        let mut tasks = Vec::new();
        for (i, mut client) in clients.into_iter().enumerate() {
            let me = names[i].clone();
            let received = received.clone();
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, String)>();
            senders.push(tx);
            tasks.push(tokio::spawn(async move {
                let mut pending = Vec::new();
                let mut open = true;
                loop {
                    tokio::select! {
                        out = rx.recv(), if open => match out {
                            Some((to, body)) => {
                                let (id, p) = client.send_nowait(Outgoing::new(to.clone(), body)).await.unwrap();
                                pending.push((id, to, p));
                            }
                            None => open = false,
                        },
                        ev = client.next_event() => match ev {
                            Some(Event::Message(m)) => {
                                received.lock().unwrap().entry(me.clone()).or_default().push((m.from.clone(), m.id.clone()));
                                client.ack(&m, None).await.unwrap();
                            }
                            Some(_) => {}
                            None => break,
                        },
                        // Quiet for a while with nothing left to send: done receiving.
                        () = tokio::time::sleep(Duration::from_secs(15)), if !open => break,
                    }
                }
                let mut out = Vec::new();
                for (id, to, p) in pending {
                    let r = tokio::time::timeout(Duration::from_secs(120), p.wait())
                        .await
                        .expect("every SEND is acknowledged in the end")
                        .unwrap_or_else(|e| panic!("no SEND is refused: {me} to {to}: {e}"));
                    out.push((me.clone(), id, to, r.status));
                }
                client.close().await;
                out
            }));
        }
        // The exchange: every agent sends to random others, spread out over the kills.
        let plan: Vec<(usize, usize, u64)> = (0..AGENTS * PER_AGENT)
            .map(|k| {
                let from = k % AGENTS;
                // One in ten to the sleeper.
                let to = if rng.gen_range(0..10) == 0 {
                    AGENTS
                } else {
                    (from + rng.gen_range(1..AGENTS)) % AGENTS
                };
                (from, to, rng.gen_range(0..3))
            })
            .collect();
        let kill_after: Vec<usize> = {
            let mut v: Vec<usize> = (0..KILLS)
                .map(|_| rng.gen_range(0..AGENTS * PER_AGENT))
                .collect();
            v.sort_unstable();
            v
        };
        eprintln!("kills after messages {kill_after:?}");
        let mut kills = 0;
        for (k, (from, to, pause)) in plan.into_iter().enumerate() {
            senders[from]
                .send((names[to].clone(), format!("message {k}")))
                .unwrap();
            if pause > 0 {
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
            while kills < kill_after.len() && kill_after[kills] == k {
                relay.kill9();
                kills += 1;
                relay.spawn();
            }
        }
        drop(senders);
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        let statuses: Vec<AckStatus> = all.iter().map(|(_, _, _, s)| *s).collect();
        let accepted: Vec<(String, String, String)> = all
            .into_iter()
            .map(|(from, id, to, _)| (from, id, to))
            .collect();
        (accepted, statuses)
    });
    assert_eq!(accepted.len(), AGENTS * PER_AGENT);
    assert!(statuses.iter().all(|s| matches!(
        s,
        AckStatus::Accepted | AckStatus::Queued | AckStatus::Duplicate
    )));

    // Every accepted message: handed to its recipient's agent exactly once, or dead-lettered.
    let received = received.lock().unwrap().clone();
    let dlq: serde_json::Value = serde_json::from_slice(
        &relay
            .cli(&["dlq", "list", "--all", "--limit", "1000", "--json"])
            .stdout,
    )
    .unwrap();
    let dead: HashSet<(String, String)> = field_pairs(&dlq["dead_letters"], "msg_id", "recipient")
        .into_iter()
        .collect();
    // Notices from the relay are counted apart: one per dead letter, to its sender.
    let mut notices: HashMap<String, usize> = HashMap::new();
    let mut received: HashMap<String, Vec<(String, String)>> = received;
    for v in received.values_mut() {
        v.retain(|(f, i)| {
            if f == "relay" {
                *notices.entry(i.clone()).or_default() += 1;
            }
            f != "relay"
        });
    }
    let (mut delivered, mut dead_lettered, mut lost, mut doubled) = (0, 0, 0, 0);
    for (from, id, to) in &accepted {
        let n = received.get(to).map_or(0, |v| {
            v.iter().filter(|(f, i)| f == from && i == id).count()
        });
        match n {
            1 => delivered += 1,
            0 if dead.contains(&(id.clone(), to.clone())) => dead_lettered += 1,
            0 => lost += 1,
            _ => doubled += 1,
        }
    }
    let extra: usize = received.values().map(Vec::len).sum::<usize>() - delivered - doubled;
    let to_sleeper = accepted.iter().filter(|(_, _, to)| to == "sleeper").count();
    eprintln!(
        "fault injection: {KILLS} kills, {} accepted ({to_sleeper} to an agent that never came back), {delivered} delivered once, {dead_lettered} dead-lettered, {lost} lost, {doubled} doubled, {extra} unexpected; {} notices to senders",
        accepted.len(),
        notices.len()
    );
    assert_eq!((lost, doubled, extra), (0, 0, 0), "seed {seed}");
    assert_eq!(delivered + dead_lettered, accepted.len());
    // Everything for the sleeper is dead-lettered. (With a one-second TTL, a message in
    // flight to an agent still reconnecting after a kill may expire too: it is then a dead
    // letter with its reason, the other allowed outcome.)
    let sleeper_dead = accepted
        .iter()
        .filter(|(_, id, to)| to == "sleeper" && dead.contains(&(id.clone(), to.clone())))
        .count();
    assert_eq!(
        sleeper_dead, to_sleeper,
        "what the sleeper never took is dead-lettered"
    );
    // Every dead letter's sender was told exactly once, whatever the kills interrupted.
    assert_eq!(notices.len(), dead.len(), "seed {seed}: {notices:?}");
    assert!(
        notices.values().all(|n| *n == 1),
        "seed {seed}: {notices:?}"
    );
    // And the store agrees: nothing is left undelivered without a dead letter.
    let deadline = relay_protocol::now_instant() + Duration::from_secs(30);
    loop {
        let agents: serde_json::Value =
            serde_json::from_slice(&relay.cli(&["agents", "--json"]).stdout).unwrap();
        if agents.as_array().unwrap().iter().all(|a| a["pending"] == 0) {
            break;
        }
        assert!(
            relay_protocol::now_instant() < deadline,
            "acknowledgements not recorded: {agents}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_nothing_dropped(&relay, &[], &[]);

    // The database survived the SIGKILLs.
    let status = relay.stop();
    assert!(status.success(), "{status}");
    let db = relay.data_dir().join("messages.sqlite");
    // SQLite's own full check (the bundled library, so it runs wherever the tests build):
    // one row "ok", or one row per problem found.
    let conn =
        rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let mut check = conn.prepare("PRAGMA integrity_check").unwrap();
    let rows: Vec<String> = check
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(rows, ["ok"], "integrity check of {}", db.display());
    println!("integrity check after the kills: {}", rows.join(", "));
}

/// The stand-in agent CLI of the wrapper torture: `sh torture.sh INDEX AGENTS HOPS DIR`. It
/// appends every relayed line it reads to `DIR/NAME.got` (after a `start` line for each life,
/// so what each life saw can be told apart) and answers a chain message `cK hN` by printing a
/// directive for `cK hN+1` to another agent (now and then to the sleeper, which never comes
/// back), until hop HOPS; each directive printed is appended to `DIR/NAME.sent` first.
const TORTURE_AGENT: &str = r#"i=$1; n=$2; hops=$3; dir=$4; me=$AGENT_RELAY_NAME
echo "start" >> "$dir/$me.got"
echo "stand-in $me ready"
while IFS= read -r line; do
  case "$line" in
    "Relay message from "*)
      printf '%s\n' "$line" >> "$dir/$me.got"
      body=${line##*: }
      case "$body" in
        c[0-9]*" h"[0-9]*)
          k=${body%% *}; k=${k#c}; h=${body##* h}
          if [ "$h" -lt "$hops" ]; then
            if [ $(( (k * 7 + h) % 13 )) -eq 0 ]; then to=sleeper
            else to=a$(( (i + 1 + (k + h) % (n - 1)) % n )); fi
            echo "$to c$k h$((h + 1))" >> "$dir/$me.sent"
            echo "@relay:$to c$k h$((h + 1))"
            echo
          fi;;
      esac;;
  esac
done
"#;

const TORTURE_AGENTS: usize = 4;
const TORTURE_HOPS: u32 = 6;
const TORTURE_ROUNDS: usize = 50;
const CHAINS_PER_ROUND: usize = 2;

/// xorshift64*: a seeded generator small enough to replay a run from its printed seed.
struct XorShift(u64);

impl XorShift {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

/// The torture's wrapped agents: `agent-relay wrap` processes, killed when dropped so that a
/// failing run leaves nothing behind.
struct Wrappers {
    relay_dir: std::path::PathBuf,
    procs: Vec<Option<std::process::Child>>,
}

impl Wrappers {
    fn name(i: usize) -> String {
        format!("a{i}")
    }

    /// Starts agent `i`'s wrapper (PTY backend) around the stand-in.
    fn spawn(&mut self, relay: &Relay, i: usize) {
        let dir = &self.relay_dir;
        let name = Self::name(i);
        let err = append_log(&dir.join(format!("{name}.wrap.log")));
        let child = relay
            .command()
            .current_dir(dir)
            .env("AGENT_RELAY_PROFILE_DIR", dir.join("profiles"))
            .env(
                "AGENT_RELAY_LOG",
                "relay_wrap=debug,relay_client=debug,warn",
            )
            .args(wrap_args(&name, PTY_GENERIC, &["sh", "torture.sh"]))
            .args([
                i.to_string(),
                TORTURE_AGENTS.to_string(),
                TORTURE_HOPS.to_string(),
                dir.join("seen").display().to_string(),
            ])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(err)
            .spawn()
            .unwrap();
        self.procs[i] = Some(child);
    }

    fn kill9(&mut self, i: usize) {
        let mut c = self.procs[i].take().expect("running");
        kill9_child(&mut c);
        // Each life's log ends with this line, for a failure's story.
        let mut log = std::fs::OpenOptions::new()
            .append(true)
            .open(self.relay_dir.join(format!("{}.wrap.log", Self::name(i))))
            .unwrap();
        std::io::Write::write_all(&mut log, b"---- killed by the test (SIGKILL)\n").unwrap();
    }
}

impl Drop for Wrappers {
    fn drop(&mut self) {
        for mut c in self.procs.iter_mut().filter_map(Option::take) {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            for i in 0..self.procs.len() {
                let name = Self::name(i);
                let log = std::fs::read_to_string(self.relay_dir.join(format!("{name}.wrap.log")))
                    .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(60).collect();
                eprintln!("---- {name}'s wrapper log (last lines, newest first) ----");
                for l in tail {
                    eprintln!("{l}");
                }
            }
        }
    }
}

/// Whether agent `name` is connected, from `agents --json`.
fn online(relay: &Relay, name: &str) -> bool {
    let out = relay.cli(&["agents", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v.as_array()
        .is_some_and(|a| a.iter().any(|x| x["name"] == name && x["online"] == true))
}

/// One stored message: (id, from, to, body, delivery statuses).
type Stored = (String, String, String, String, Vec<String>);

/// Every stored message to `to` (one page: the test stays under 1,000 per recipient).
fn stored_to(relay: &Relay, to: &str) -> Vec<Stored> {
    let out = crate::support::ok_stdout(
        &relay.cli(&["history", "--to", to, "--limit", "1000", "--json"]),
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let page = v.as_array().unwrap();
    assert!(page.len() < 1000, "more than a page for {to}");
    page.iter()
        .map(|m| {
            let s = |k: &str| m[k].as_str().unwrap_or_default().to_owned();
            let statuses = m["deliveries"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["recipient"] == to)
                .map(|d| d["status"].as_str().unwrap().to_owned())
                .collect();
            (s("id"), s("from"), s("to"), s("body"), statuses)
        })
        .collect()
}

/// Lines agent `name`'s stand-ins read, by life (each `start` line begins one).
fn lives(seen: &std::path::Path, name: &str) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(seen.join(format!("{name}.got"))).unwrap_or_default();
    let mut lives: Vec<Vec<String>> = Vec::new();
    for l in text.lines() {
        if l == "start" {
            lives.push(Vec::new());
        } else if let Some(life) = lives.last_mut() {
            life.push(l.to_owned());
        }
    }
    lives
}

/// The chain step `cK hN` a relayed line carries, if any.
fn chain_step(line: &str) -> Option<(u64, u32)> {
    let body = line.rsplit(": ").next()?;
    let (k, h) = body.split_once(' ')?;
    Some((
        k.strip_prefix('c')?.parse().ok()?,
        h.strip_prefix('h')?.parse().ok()?,
    ))
}

/// The wrapper torture: several agents, each a real `agent-relay wrap` (PTY backend) around a
/// scripted stand-in CLI, pass hundreds of chain messages among themselves while the daemon
/// and the wrappers are killed with SIGKILL at random moments (seeded: the seed is printed,
/// `AGENT_RELAY_FAULT_SEED` replays it), round after round. A killed wrapper takes its agent
/// with it (the PTY closes) and is started again, as a person would. After everything has
/// settled, every stored (accepted) message was read by its recipient's stand-in exactly once
/// or is in the dead-letter queue with its reason; nothing was read or relayed twice; and the
/// last life of every agent (which no kill cut short, though daemon kills crossed it) relayed
/// every directive it printed. The counts are printed on one `torture:` line.
///
/// It found the PTY wrapper losing messages: one killed after it started typing a message and
/// before its Enter left the restarted wrapper counting the message as typed (acknowledged,
/// never seen by any agent). `injected.log` now records the Enter too (`E <id>`).
#[test]
fn torture_wrapped_agents_through_random_kill9_of_daemon_and_wrappers() {
    let started = relay_protocol::now_instant();
    let seed = fault_seed("torture");
    let mut rng = XorShift(seed | 1);
    // A short inbox TTL: what goes to the sleeper is dead-lettered during the run, and its
    // senders' notices are crossed by the kills too.
    let mut args = UNLIMITED.to_vec();
    args.extend(["--inbox-ttl", "2"]);
    let mut relay = Relay::start_with(&args);
    let dir = relay.dir.path().to_path_buf();
    let seen = dir.join("seen");
    std::fs::create_dir_all(&seen).unwrap();
    std::fs::create_dir_all(dir.join("profiles")).unwrap();
    // The generic profile, faster: the torture is about faults, not about waiting for quiet.
    std::fs::write(
        dir.join("profiles/generic.toml"),
        "settle_ms = 100\nquiet_ms = 100\nenter_delay_ms = 30\nverify_after_ms = 100\n",
    )
    .unwrap();
    std::fs::write(dir.join("torture.sh"), TORTURE_AGENT).unwrap();
    // Known, then gone for good.
    drop(relay.agent("sleeper"));
    let mut wrappers = Wrappers {
        relay_dir: dir.clone(),
        procs: (0..TORTURE_AGENTS).map(|_| None).collect(),
    };
    let wait = |relay: &Relay, what: &str, cond: &mut dyn FnMut() -> bool| {
        let deadline = relay_protocol::now_instant() + Duration::from_secs(60);
        while !cond() {
            assert!(
                relay_protocol::now_instant() < deadline,
                "seed {seed}: timed out waiting until {what}\n{}",
                relay
                    .log()
                    .lines()
                    .rev()
                    .take(40)
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    for i in 0..TORTURE_AGENTS {
        wrappers.spawn(&relay, i);
        wait(&relay, "the agent is connected", &mut || {
            online(&relay, &Wrappers::name(i))
        });
    }
    let (mut daemon_kills, mut wrapper_kills) = (0usize, 0usize);
    // Chains started by the test (as `human`): (chain, first recipient, accepted).
    let mut started_chains = 0u64;
    let mut driver_sent = 0usize;
    let mut driver_accepted = 0usize;
    for _round in 0..TORTURE_ROUNDS {
        for _ in 0..CHAINS_PER_ROUND {
            let k = started_chains;
            started_chains += 1;
            let to = Wrappers::name(rng.below(TORTURE_AGENTS as u64) as usize);
            driver_sent += 1;
            if relay
                .cli(&["send", &to, &format!("c{k} h0")])
                .status
                .success()
            {
                driver_accepted += 1;
            }
        }
        // A random moment: messages are being typed, printed and relayed meanwhile.
        std::thread::sleep(Duration::from_millis(150 + rng.below(900)));
        let victim = rng.below(3);
        if victim == 0 || victim == 2 && rng.below(2) == 0 {
            relay.kill9();
            daemon_kills += 1;
            relay.spawn();
        }
        if victim != 0 {
            let i = rng.below(TORTURE_AGENTS as u64) as usize;
            wrappers.kill9(i);
            wrapper_kills += 1;
            let name = Wrappers::name(i);
            wait(&relay, "the killed wrapper is seen gone", &mut || {
                !online(&relay, &name)
            });
            // Sometimes the agent stays away a while (its messages wait for it).
            std::thread::sleep(Duration::from_millis(rng.below(400)));
            wrappers.spawn(&relay, i);
            wait(&relay, "the restarted wrapper is connected", &mut || {
                online(&relay, &name)
            });
        }
    }
    let kills_done = relay_protocol::now_instant();

    // Settling, event by event: every chain step the last life of each stand-in read has its
    // next step stored (lives killed may have died before printing or relaying it), and no
    // delivery is still queued. Then a marker through each agent: a stand-in reads in order,
    // so once it has read the marker it has written down everything typed before it.
    let names: Vec<String> = (0..TORTURE_AGENTS).map(Wrappers::name).collect();
    let mut recipients = names.clone();
    recipients.push("sleeper".into());
    let settled = |relay: &Relay| -> bool {
        let all: Vec<Stored> = recipients
            .iter()
            .flat_map(|r| stored_to(relay, r))
            .collect();
        let bodies: HashSet<&str> = all.iter().map(|m| m.3.as_str()).collect();
        let queued = all.iter().any(|m| m.4.iter().any(|s| s == "queued"));
        let broken = names.iter().any(|n| {
            lives(&seen, n).last().is_some_and(|life| {
                life.iter().filter_map(|l| chain_step(l)).any(|(k, h)| {
                    h < TORTURE_HOPS && !bodies.contains(format!("c{k} h{}", h + 1).as_str())
                })
            })
        });
        !queued && !broken
    };
    wait(
        &relay,
        "everything is delivered or dead-lettered",
        &mut || settled(&relay),
    );
    for n in &names {
        ok_stdout(&relay.cli(&["send", n, "settle marker"]));
        driver_sent += 1;
        driver_accepted += 1;
    }
    wait(&relay, "every stand-in has read its marker", &mut || {
        names.iter().all(|n| {
            lives(&seen, n)
                .last()
                .is_some_and(|l| l.iter().any(|x| x.ends_with(": settle marker")))
        })
    });
    wait(
        &relay,
        "everything is settled after the markers",
        &mut || settled(&relay),
    );

    // The counts.
    let all: Vec<Stored> = recipients
        .iter()
        .flat_map(|r| stored_to(&relay, r))
        .collect();
    let dlq: serde_json::Value = serde_json::from_str(&ok_stdout(
        &relay.cli(&["dlq", "list", "--all", "--limit", "1000", "--json"]),
    ))
    .unwrap();
    let mut dead: HashMap<(String, String), String> = HashMap::new();
    for d in dlq["dead_letters"].as_array().unwrap() {
        let reason = d["reason"].as_str().unwrap_or_default();
        let code = d["code"].as_str().unwrap_or_default();
        assert!(
            !reason.is_empty() && !code.is_empty(),
            "seed {seed}: a dead letter without a reason: {d}"
        );
        dead.insert(
            (
                d["msg_id"].as_str().unwrap().to_owned(),
                d["recipient"].as_str().unwrap().to_owned(),
            ),
            format!("{code}: {reason}"),
        );
    }
    let read: HashMap<&str, Vec<String>> = names
        .iter()
        .map(|n| (n.as_str(), lives(&seen, n).concat()))
        .collect();
    let (mut once, mut dead_lettered, mut once_and_dead) = (0, 0, 0);
    let mut lost: Vec<&Stored> = Vec::new();
    let mut doubled: Vec<(&Stored, usize)> = Vec::new();
    let mut matched = 0;
    for m in &all {
        let (id, from, to, body, _) = m;
        let prefix = format!(
            "Relay message from {from} [{}]",
            relay_protocol::short_id(id)
        );
        // Typed as the wrapper shows any body: a line that could pass for a header (a relay
        // notice's own "relay: ...") behind "> " (issue 23.4).
        let suffix = format!(": {}", relay_protocol::text::quote_headers(body));
        let n = read.get(to.as_str()).map_or(0, |lines| {
            lines
                .iter()
                .filter(|l| l.starts_with(&prefix) && l.ends_with(&suffix))
                .count()
        });
        matched += n;
        let in_dlq = dead.contains_key(&(id.clone(), to.clone()));
        match n {
            1 if in_dlq => once_and_dead += 1,
            1 => once += 1,
            0 if in_dlq => dead_lettered += 1,
            0 => lost.push(m),
            n => doubled.push((m, n)),
        }
    }
    // Nothing read that was not stored, and no directive relayed twice.
    let read_total: usize = read.values().map(Vec::len).sum();
    let mut relayed: HashMap<&str, usize> = HashMap::new();
    for m in all.iter().filter(|m| m.1 != "relay" && m.1 != "human") {
        *relayed.entry(m.3.as_str()).or_default() += 1;
    }
    let relayed_twice: Vec<_> = relayed.iter().filter(|(_, n)| **n > 1).collect();
    let printed: usize = names
        .iter()
        .map(|n| {
            std::fs::read_to_string(seen.join(format!("{n}.sent")))
                .unwrap_or_default()
                .lines()
                .count()
        })
        .sum();
    let notices = all.iter().filter(|m| m.1 == "relay").count();
    let directives = all
        .iter()
        .filter(|m| m.1 != "relay" && m.1 != "human")
        .count();
    // Directives a stand-in printed that were never relayed: only a killed wrapper loses
    // those (its last lives relayed everything, as the settling checked), and they were never
    // accepted, so no sender was told they were.
    let summary = format!(
        "torture: seed {seed}; {TORTURE_ROUNDS} rounds, kills: daemon {daemon_kills}, wrappers \
         {wrapper_kills}; sent {} ({driver_sent} by the test, {printed} directives printed by \
         the agents, {} of them cut off by their wrapper's kill before it relayed them), \
         accepted {} ({driver_accepted} of the test's, {directives} directives, {notices} relay \
         notices), typed once {once}, dead-lettered with reasons {dead_lettered}, typed once \
         and also dead-lettered {once_and_dead}, doubled {}, lost {}; kills took {:.0?}, \
         settling {:.0?}",
        driver_sent + printed,
        printed.saturating_sub(directives),
        all.len(),
        doubled.len() + relayed_twice.len(),
        lost.len(),
        kills_done - started,
        kills_done.elapsed(),
    );
    // One line for PERFORMANCE.md and SECURITY.md to quote (nextest shows it: .config/nextest.toml).
    println!("{summary}");
    assert_eq!(
        driver_accepted, driver_sent,
        "seed {seed}: a send by the test failed"
    );
    // For a failure: what the recipient's wrapper remembered and logged of each message.
    let story = |id: &str, to: &str| -> String {
        let grep = |path: std::path::PathBuf| -> Vec<String> {
            std::fs::read_to_string(&path)
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains(id) || l.contains("killed by the test"))
                .map(str::to_owned)
                .collect()
        };
        format!(
            "{id} to {to}: injected.log {:?}\nwrapper log {:#?}",
            grep(relay.data_dir().join(format!("team/{to}/injected.log"))),
            grep(dir.join(format!("{to}.wrap.log")))
        )
    };
    let stories: Vec<String> = lost
        .iter()
        .map(|m| story(&m.0, &m.2))
        .chain(doubled.iter().map(|(m, _)| story(&m.0, &m.2)))
        .collect();
    assert!(
        lost.is_empty() && doubled.is_empty() && relayed_twice.is_empty(),
        "seed {seed}: lost {lost:#?}\ndoubled {doubled:#?}\nrelayed twice {relayed_twice:?}\n{}",
        stories.join("\n")
    );
    assert_eq!(
        matched, read_total,
        "seed {seed}: a stand-in read a line that matches no stored message: {read:#?}"
    );
    crate::support::assert_nothing_dropped(&relay, &[], &[]);
    drop(wrappers);
    let status = relay.stop();
    assert!(status.success(), "{status}");
}
