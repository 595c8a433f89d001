//! `agent-relay bench`: a load generator that measures what a user would feel.
//!
//! S sender connections send N messages of B bytes to R receiving agents, keeping up to
//! `--window` SENDs unacknowledged each; receivers acknowledge every DELIVER. Each body starts
//! with the send time (nanoseconds since the bench started, same process clock), so latency is
//! SEND written → DELIVER read. Receivers do not de-duplicate, so a duplicate on the wire is
//! counted, and lost = accepted by the relay − distinct messages received.
//!
//! Without `--target` it starts a private daemon (the real binary, `up --foreground`) on a
//! temporary directory and stops it afterwards.

use std::collections::{HashSet, VecDeque};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use relay_client::paths::Paths;
use relay_client::{Client, ClientConfig, Event, Outgoing};
use relay_protocol::AckStatus;

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

fn start_private(storage: &str) -> anyhow::Result<(PathBuf, PrivateDaemon)> {
    let dir = tempfile::Builder::new().prefix("relay-bench").tempdir()?;
    let socket = dir.path().join("r.sock");
    let exe = std::env::current_exe()?;
    let log = std::fs::File::create(dir.path().join("daemon.log"))?;
    let child = Command::new(exe)
        .args(["up", "--foreground", "--storage", storage])
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
    let deadline = Instant::now() + Duration::from_secs(15);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        if Instant::now() > deadline {
            anyhow::bail!("the private daemon did not start within 15 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok((socket, daemon))
}

/// Peak resident memory of a process, in KiB (Linux).
fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

struct ReceiverResult {
    unique: usize,
    duplicates: usize,
    latencies_ns: Vec<u64>,
    last: Option<Instant>,
}

#[derive(Default)]
struct SenderResult {
    accepted: usize,
    refused: usize,
    first_error: Option<String>,
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn ms(ns: u64) -> String {
    format!("{:.3} ms", ns as f64 / 1e6)
}

/// `agent-relay bench`.
pub(crate) async fn bench(_paths: &Paths, args: BenchArgs) -> anyhow::Result<()> {
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
    let (socket, daemon) = match &args.target {
        Some(s) => (s.clone(), None),
        None => {
            let (s, d) = start_private(args.storage.as_str())?;
            (s, Some(d))
        }
    };
    let (s_count, r_count, n) = (args.senders, args.receivers, args.messages);
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
    let base = Instant::now();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.timeout);

    let mut receivers = Vec::with_capacity(r_count);
    for (r, &want) in expected.iter().enumerate() {
        let cfg = ClientConfig {
            max_inflight: 1024,
            reconnect: false,
            dedupe: false,
            ..ClientConfig::agent(socket.clone(), format!("bench-r{r}"))
        };
        let mut client = Client::connect(cfg)
            .await
            .context("receiver cannot connect")?;
        let hasher = std::collections::hash_map::RandomState::new();
        receivers.push(tokio::spawn(async move {
            // 64-bit hashes of the ids: no allocation per message, and a false "duplicate"
            // would need a collision among a few hundred thousand ids (odds ~1e-9).
            let mut seen: HashSet<u64> = HashSet::with_capacity(want);
            let id_hash = |id: &str| {
                use std::hash::{BuildHasher, Hasher};
                let mut h = hasher.build_hasher();
                h.write(id.as_bytes());
                h.finish()
            };
            let mut res = ReceiverResult {
                unique: 0,
                duplicates: 0,
                latencies_ns: Vec::with_capacity(want),
                last: None,
            };
            while res.unique < want {
                let ev = match tokio::time::timeout_at(deadline, client.next_event()).await {
                    Ok(Some(ev)) => ev,
                    _ => break,
                };
                let Event::Message(m) = ev else { continue };
                let now = base.elapsed().as_nanos() as u64;
                let sent: u64 = m
                    .payload
                    .body
                    .get(..20)
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(now);
                res.latencies_ns.push(now.saturating_sub(sent));
                if seen.insert(id_hash(&m.id)) {
                    res.unique += 1;
                } else {
                    res.duplicates += 1;
                }
                res.last = Some(Instant::now());
                if client.ack(&m, None).await.is_err() {
                    break;
                }
            }
            // Catch late duplicates for a moment before leaving.
            while let Ok(Some(ev)) =
                tokio::time::timeout(Duration::from_millis(200), client.next_event()).await
            {
                if let Event::Message(m) = ev {
                    if !seen.insert(id_hash(&m.id)) {
                        res.duplicates += 1;
                    }
                    let _ = client.ack(&m, None).await;
                }
            }
            client.close().await;
            res
        }));
    }

    let start = Instant::now();
    let names: std::sync::Arc<Vec<String>> =
        std::sync::Arc::new((0..r_count).map(|r| format!("bench-r{r}")).collect());
    let mut senders = Vec::with_capacity(s_count);
    for (i, &count) in per_sender.iter().enumerate() {
        let client = Client::connect(ClientConfig::tool(socket.clone(), format!("bench-s{i}")))
            .await
            .context("sender cannot connect")?;
        let window = args.window;
        let bytes = args.bytes;
        let names = names.clone();
        let period =
            (args.rate > 0).then(|| Duration::from_secs_f64(s_count as f64 / args.rate as f64));
        senders.push(tokio::spawn(async move {
            let mut res = SenderResult::default();
            let mut inflight = VecDeque::with_capacity(window);
            let pad = "x".repeat(bytes - 21);
            let t0 = tokio::time::Instant::now();
            for j in 0..count {
                if let Some(p) = period {
                    tokio::time::sleep_until(t0 + p.mul_f64(j as f64)).await;
                }
                let body = format!("{:020} {pad}", base.elapsed().as_nanos() as u64);
                let to = names[(i + j) % r_count].clone();
                match client.send_nowait(Outgoing::new(to, body)).await {
                    Ok((_, pending)) => inflight.push_back(pending),
                    Err(e) => {
                        res.first_error.get_or_insert(e.to_string());
                        break;
                    }
                }
                if inflight.len() >= window {
                    if let Some(p) = inflight.pop_front() {
                        tally(&mut res, p.wait().await);
                    }
                }
            }
            for p in inflight {
                tally(&mut res, p.wait().await);
            }
            client.close().await;
            res
        }));
    }

    let mut sent = SenderResult::default();
    for s in senders {
        let r = s.await?;
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
        let r = r.await?;
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
    let storage = if args.target.is_some() {
        "external".to_owned()
    } else {
        args.storage.as_str().to_owned()
    };
    if args.json {
        json(&serde_json::json!({
            "senders": s_count, "receivers": r_count, "messages": n, "bytes": args.bytes,
            "rate_target": args.rate, "window": args.window, "storage": storage,
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
            "error": sent.first_error,
        }))?;
    } else {
        line(format!(
            "agent-relay bench: {s_count} senders → {r_count} receivers, {n} messages × {} B, storage {storage}{}",
            args.bytes,
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
        if let Some(e) = &sent.first_error {
            line(format!("  error       {e}"))?;
        }
    }
    drop(daemon);
    if lost > 0 || duplicates > 0 || sent.accepted < n {
        anyhow::bail!(
            "bench failed: {} of {n} accepted, {lost} lost, {duplicates} duplicated",
            sent.accepted
        );
    }
    Ok(())
}

fn tally(res: &mut SenderResult, r: Result<relay_client::Receipt, relay_client::ClientError>) {
    match r {
        Ok(rc) if rc.status != AckStatus::Duplicate => res.accepted += 1,
        Ok(_) => {}
        Err(e) => {
            res.refused += 1;
            res.first_error.get_or_insert(e.to_string());
        }
    }
}
