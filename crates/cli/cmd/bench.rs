//! `agent-relay bench`: a load generator that measures what a user would feel.
//!
//! S sender connections send N messages of B bytes to R receiving agents, keeping up to
//! `--window` SENDs unacknowledged each; receivers acknowledge what they receive as a wrapper
//! does (one `verified` ACK per message, each a store write), or with `--acks lean` one
//! cumulative ACK per read, or with `--acks plain` one v1 ACK per message. Each body starts
//! with the send time (nanoseconds since the bench started, same process clock), so latency is
//! SEND written → DELIVER read. Receivers do not de-duplicate, so a duplicate on the wire is
//! counted, and lost = accepted by the relay − distinct messages received.
//!
//! The connections are lean protocol loops (`bench/wire.rs`), not the client library: the
//! generator shares the machine with the relay, and every cycle it spends is one the relay
//! cannot use.
//!
//! Without `--target` it starts a private daemon (the real binary, `up --foreground`) on a
//! temporary directory and stops it afterwards; it commits durably (`up --durability full`,
//! the relay's default) unless `--durability normal` is asked for.

mod wire;
pub(crate) mod wrap;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use relay_client::paths::Paths;

use crate::args::BenchArgs;
use crate::out::{json, line};

/// The private daemon's process and directory, stopped and removed on drop.
struct PrivateDaemon {
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for PrivateDaemon {
    fn drop(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.child.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::Term);
        }
        let _ = self.child.wait();
    }
}

fn start_private(
    storage: &str,
    durability: crate::args::DurabilityKind,
    extra: &[String],
) -> anyhow::Result<(PathBuf, PrivateDaemon)> {
    let dir = tempfile::Builder::new().prefix("relay-bench").tempdir()?;
    let socket = dir.path().join("r.sock");
    let exe = std::env::current_exe()?;
    let log = std::fs::File::create(dir.path().join("daemon.log"))?;
    let child = Command::new(exe)
        .args(["up", "--foreground", "--storage", storage])
        .args(["--durability", durability.as_str()])
        // A load generator is a flood by design: the private daemon has no rate limits.
        .args(["--rate-limit", "0", "--pair-rate-limit", "0"])
        .args(extra)
        .env("AGENT_RELAY_DATA_DIR", dir.path())
        .env("AGENT_RELAY_SOCKET", &socket)
        .env_remove("AGENT_RELAY_STORAGE_PATH")
        .env("AGENT_RELAY_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("cannot start a private daemon")?;
    let daemon = PrivateDaemon { child, _dir: dir };
    let deadline = relay_protocol::now_instant() + Duration::from_secs(15);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        if relay_protocol::now_instant() > deadline {
            anyhow::bail!("the private daemon did not start within 15 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok((socket, daemon))
}

/// Waits until the sending node lists every receiver as an agent of the other node (its
/// stand-in is connected): before that a SEND to it would be refused as unknown.
async fn wait_for_standins(
    socket: &std::path::Path,
    names: &[String],
    deadline: tokio::time::Instant,
) -> anyhow::Result<()> {
    use relay_protocol::query::{QueryRequest, QueryResult};
    let tool =
        relay_client::Client::connect(relay_client::ClientConfig::tool(socket, "bench")).await?;
    loop {
        if let QueryResult::Agents { agents } = tool.query(QueryRequest::Agents).await? {
            let remote = agents
                .iter()
                .filter(|a| {
                    a.online && relay_federation::core::standin_node(a.cli.as_deref()).is_some()
                })
                .filter(|a| names.contains(&a.name))
                .count();
            if remote == names.len() {
                tool.close().await;
                return Ok(());
            }
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the receivers did not appear on the sending node (is JetStream on at the --cluster servers?)"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Peak resident memory of a process, in KiB (Linux).
fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

pub(crate) fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn ms(ns: u64) -> String {
    format!("{:.3} ms", ns as f64 / 1e6)
}

/// The node name of one of `bench --cluster`'s two private relays (`side`: `send`, `recv`):
/// unique to this run, since a federation keeps a node name for the relay that holds it.
fn bench_node(side: &str) -> String {
    format!("bench-{}-{side}", std::process::id())
}

/// `agent-relay bench`. With `--cluster`, the run's two nodes are removed from the federation
/// afterwards (their agents' directory entries, leases and consumers), whether it succeeded,
/// failed or was interrupted (Ctrl-C): left there, its receivers were shown online on every
/// node for ever.
pub(crate) async fn bench(paths: &Paths, args: BenchArgs) -> anyhow::Result<()> {
    let cluster = args.cluster.clone();
    let result = tokio::select! {
        r = bench_run(paths, args) => r,
        // The private daemons (same process group) take the Ctrl-C too; dropping the run
        // stops and waits for them before the clean-up below.
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("bench interrupted")),
    };
    if let Some(cluster) = cluster {
        let nodes = [bench_node("send"), bench_node("recv")];
        if let Err(e) = relay_federation::forget_nodes(&cluster, &nodes).await {
            eprintln!(
                "agent-relay bench: warning: cannot remove this run's nodes ({}) from the federation's directory: {e}",
                nodes.join(", ")
            );
        }
    }
    result
}

async fn bench_run(_paths: &Paths, args: BenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.senders >= 1 && args.receivers >= 1,
        "--senders and --receivers must be at least 1"
    );
    anyhow::ensure!(args.messages >= 1, "--messages must be at least 1");
    anyhow::ensure!(
        args.bytes >= 24,
        "--bytes must be at least 24 (the body carries a timestamp)"
    );
    anyhow::ensure!(args.window >= 1, "--window must be at least 1");
    let (s_count, r_count, n) = (args.senders, args.receivers, args.messages);
    // Names unique to this run: a federation's directory keeps a name for the node that
    // first held it, and an earlier run's receivers may still be in it.
    let tag = if args.cluster.is_some() {
        format!("-{}", std::process::id())
    } else {
        String::new()
    };
    let receiver_names: Vec<String> = (0..r_count).map(|r| format!("bench-r{r}{tag}")).collect();
    let (socket, daemon, far) = match (&args.target, &args.cluster) {
        (Some(_), Some(_)) => anyhow::bail!("--cluster starts its own relays: leave out --target"),
        (Some(s), None) => (s.clone(), None, None),
        (None, None) => {
            let (s, d) = start_private(args.storage.as_str(), args.durability, &[])?;
            (s, Some(d), None)
        }
        (None, Some(cluster)) => {
            let node = |side: &str| {
                vec![
                    "--cluster".to_owned(),
                    cluster.clone(),
                    "--node".to_owned(),
                    bench_node(side),
                    "--no-dashboard".to_owned(),
                ]
            };
            let (near, d) = start_private(args.storage.as_str(), args.durability, &node("send"))?;
            let (far, f) = start_private(args.storage.as_str(), args.durability, &node("recv"))?;
            (near, Some(d), Some((far, f)))
        }
    };
    // Senders on `socket`; receivers on the far node when federated.
    let receiver_socket = far
        .as_ref()
        .map_or_else(|| socket.clone(), |(s, _)| s.clone());
    // Sender i sends its j-th message to receiver (i + j) % R.
    let per_sender: Vec<usize> = (0..s_count)
        .map(|i| n / s_count + usize::from(i < n % s_count))
        .collect();
    let mut expected = vec![0usize; r_count];
    for (i, &c) in per_sender.iter().enumerate() {
        for j in 0..c {
            expected[(i + j) % r_count] += 1;
        }
    }
    let base = relay_protocol::now_instant();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.timeout);

    let mut receivers = Vec::with_capacity(r_count);
    for (r, &want) in expected.iter().enumerate() {
        receivers.push(
            wire::receiver(
                receiver_socket.clone(),
                receiver_names[r].clone(),
                want,
                base,
                deadline,
                args.acks,
            )
            .await?,
        );
    }
    if far.is_some() {
        wait_for_standins(&socket, &receiver_names, deadline).await?;
    }
    let start = relay_protocol::now_instant();
    let plan = std::sync::Arc::new(wire::SendPlan {
        socket: socket.clone(),
        receivers: std::sync::Arc::new(receiver_names.clone()),
        bytes: args.bytes,
        window: args.window,
        period: (args.rate > 0).then(|| Duration::from_secs_f64(s_count as f64 / args.rate as f64)),
        base,
    });
    let mut senders = Vec::with_capacity(s_count);
    for (i, &count) in per_sender.iter().enumerate() {
        senders.push(tokio::spawn(wire::sender(plan.clone(), i, count)));
    }

    let mut sent = wire::SenderResult::default();
    for s in senders {
        let r = s.await??;
        sent.accepted += r.accepted;
        sent.refused += r.refused;
        if sent.first_error.is_none() {
            sent.first_error = r.first_error;
        }
    }
    let mut unique = 0;
    let mut duplicates = 0;
    let mut lat = Vec::with_capacity(n);
    let mut last = start;
    for r in receivers {
        let r = r.await??;
        unique += r.unique;
        duplicates += r.duplicates;
        lat.extend(r.latencies_ns);
        if let Some(t) = r.last {
            last = last.max(t);
        }
    }
    lat.sort_unstable();
    let elapsed = last.duration_since(start).as_secs_f64().max(1e-9);
    let lost = sent.accepted.saturating_sub(unique);
    let rate = unique as f64 / elapsed;
    let rss = daemon.as_ref().and_then(|d| peak_rss_kib(d.child.id()));
    // What JetStream alone sustains on the same servers, measured now with the relays stopped
    // (so they take none of the machine): the ceiling the cross-node figure is compared to.
    drop(daemon);
    drop(far);
    let floor = match &args.cluster {
        Some(cluster) => {
            match relay_federation::jetstream_floor(cluster, n, args.bytes, 256).await {
                Ok(f) => Some(f),
                Err(e) => {
                    eprintln!("agent-relay bench: warning: JetStream alone not measured: {e}");
                    None
                }
            }
        }
        None => None,
    };
    // The slower of JetStream's two halves: every cross-node message is published once and
    // consumed once.
    let ceiling = floor.map(|f| f.publish_per_s.min(f.consume_per_s));
    let storage = if args.target.is_some() {
        "external".to_owned()
    } else if args.cluster.is_some() {
        format!("{} on two nodes through NATS", args.storage.as_str())
    } else {
        args.storage.as_str().to_owned()
    };
    // Durability is the private daemon's; a given daemon's is whatever it was started with.
    let durability = match (&args.target, args.storage) {
        (Some(_), _) => "external",
        (None, crate::args::StorageKind::Memory) => "none",
        (None, crate::args::StorageKind::Sqlite) => args.durability.as_str(),
    };
    if args.json {
        json(&serde_json::json!({
            "senders": s_count, "receivers": r_count, "messages": n, "bytes": args.bytes,
            "rate_target": args.rate, "window": args.window, "storage": storage,
            "durability": durability, "acks": args.acks.as_str(),
            "accepted": sent.accepted, "refused": sent.refused, "delivered": unique,
            "lost": lost, "duplicated": duplicates,
            "elapsed_s": elapsed, "msgs_per_s": rate,
            "latency_ms": {
                "p50": percentile(&lat, 0.50) as f64 / 1e6,
                "p90": percentile(&lat, 0.90) as f64 / 1e6,
                "p99": percentile(&lat, 0.99) as f64 / 1e6,
                "max": lat.last().copied().unwrap_or(0) as f64 / 1e6,
            },
            "daemon_peak_rss_kib": rss,
            "jetstream_alone": floor.map(|f| serde_json::json!({
                "publish_msgs_per_s": f.publish_per_s,
                "consume_msgs_per_s": f.consume_per_s,
            })),
            "ratio_to_jetstream": ceiling.map(|c| rate / c),
            "error": sent.first_error,
        }))?;
    } else {
        line(format!(
            "agent-relay bench: {s_count} senders → {r_count} receivers, {n} messages × {} B, storage {storage} (durability {durability}), acks {}{}",
            args.bytes,
            args.acks.as_str(),
            if args.rate > 0 {
                format!(", target {} msgs/s", args.rate)
            } else {
                String::new()
            }
        ))?;
        line(format!(
            "  delivered   {unique}/{} accepted (lost {lost}, duplicated {duplicates}, refused {})",
            sent.accepted, sent.refused
        ))?;
        line(format!("  throughput  {rate:.0} msgs/s ({elapsed:.2} s)"))?;
        line(format!(
            "  latency     p50 {}  p90 {}  p99 {}  max {}",
            ms(percentile(&lat, 0.50)),
            ms(percentile(&lat, 0.90)),
            ms(percentile(&lat, 0.99)),
            ms(lat.last().copied().unwrap_or(0))
        ))?;
        if let Some(kib) = rss {
            line(format!(
                "  daemon      peak RSS {:.1} MiB",
                kib as f64 / 1024.0
            ))?;
        }
        if let (Some(f), Some(c)) = (floor, ceiling) {
            line(format!(
                "  JetStream alone (same servers, same run, file storage, PubAck and confirmed ack each): publish {:.0} msgs/s, consume {:.0} msgs/s; cross-node is {:.0} % of the slower",
                f.publish_per_s,
                f.consume_per_s,
                100.0 * rate / c
            ))?;
        }
        if let Some(e) = &sent.first_error {
            line(format!("  error       {e}"))?;
        }
    }
    if lost > 0 || duplicates > 0 || sent.accepted < n {
        anyhow::bail!(
            "bench failed: {} of {n} accepted, {lost} lost, {duplicates} duplicated",
            sent.accepted
        );
    }
    Ok(())
}
