//! Throughput samples and the Prometheus text format.

use std::collections::VecDeque;

use relay_daemon::Counters;
use relay_protocol::query::StatusInfo;
use serde::Serialize;

/// Seconds of per-second samples kept for the throughput chart.
pub const SAMPLES: usize = 300;

/// The counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Totals {
    /// Unix ms when read.
    pub ts: u64,
    /// Messages stored.
    pub accepted: u64,
    /// Duplicate SENDs.
    pub duplicates: u64,
    /// NACKs.
    pub refused: u64,
    /// DELIVERs queued.
    pub delivered: u64,
    /// Deliveries acknowledged.
    pub acked: u64,
    /// Deliveries reported failed.
    pub failed: u64,
    /// Deliveries expired.
    pub expired: u64,
    /// Agent sessions started.
    pub connects: u64,
}

impl Totals {
    /// Reads the daemon's counters.
    pub fn read(c: &Counters, ts: u64) -> Self {
        Self {
            ts,
            accepted: c.accepted.get(),
            duplicates: c.duplicates.get(),
            refused: c.refused.get(),
            delivered: c.delivered.get(),
            acked: c.acked.get(),
            failed: c.failed.get(),
            expired: c.expired.get(),
            connects: c.connects.get(),
        }
    }

    /// Whether anything was counted between `self` and `later`.
    pub fn same_counts(&self, later: &Self) -> bool {
        Self { ts: 0, ..*self } == Self { ts: 0, ..*later }
    }
}

/// One second of activity (differences of [`Totals`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Rate {
    /// End of the second (Unix ms).
    pub ts: u64,
    /// Messages stored in it.
    pub accepted: u64,
    /// DELIVERs queued in it.
    pub delivered: u64,
    /// Acknowledgements in it.
    pub acked: u64,
}

/// The last [`SAMPLES`] seconds.
#[derive(Debug, Default)]
pub struct Samples {
    last: Option<Totals>,
    rates: VecDeque<Rate>,
}

impl Samples {
    /// Records a reading; returns the second it closes.
    pub fn push(&mut self, now: Totals) -> Option<Rate> {
        let rate = self.last.map(|prev| Rate {
            ts: now.ts,
            accepted: now.accepted.saturating_sub(prev.accepted),
            delivered: now.delivered.saturating_sub(prev.delivered),
            acked: now.acked.saturating_sub(prev.acked),
        });
        self.last = Some(now);
        if let Some(r) = rate {
            self.rates.push_back(r);
            while self.rates.len() > SAMPLES {
                self.rates.pop_front();
            }
        }
        rate
    }

    /// The kept seconds, oldest first.
    pub fn rates(&self) -> Vec<Rate> {
        self.rates.iter().copied().collect()
    }
}

/// The Prometheus text exposition of the counters and the status gauges.
pub fn prometheus(t: &Totals, s: &StatusInfo) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, value: u64| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        let _ = writeln!(out, "{name} {value}");
    };
    let c = "counter";
    let g = "gauge";
    metric(
        "agent_relay_messages_accepted_total",
        c,
        "Messages stored since the daemon started.",
        t.accepted,
    );
    metric(
        "agent_relay_messages_duplicate_total",
        c,
        "SENDs repeating a stored (from, id); nothing new stored.",
        t.duplicates,
    );
    metric(
        "agent_relay_refused_total",
        c,
        "NACKs sent (refused SENDs and SUBSCRIBEs).",
        t.refused,
    );
    metric(
        "agent_relay_deliveries_sent_total",
        c,
        "DELIVERs queued to recipients (live and replayed).",
        t.delivered,
    );
    metric(
        "agent_relay_deliveries_acked_total",
        c,
        "Deliveries acknowledged by recipients.",
        t.acked,
    );
    metric(
        "agent_relay_deliveries_failed_total",
        c,
        "Deliveries recipients reported failed.",
        t.failed,
    );
    metric(
        "agent_relay_deliveries_expired_total",
        c,
        "Deliveries expired waiting for an offline recipient.",
        t.expired,
    );
    metric(
        "agent_relay_agent_sessions_total",
        c,
        "Agent sessions started.",
        t.connects,
    );
    metric(
        "agent_relay_agents_online",
        g,
        "Agents connected now.",
        s.agents,
    );
    metric(
        "agent_relay_agents_known",
        g,
        "Agents known (connected or not).",
        s.known_agents,
    );
    metric(
        "agent_relay_messages_stored",
        g,
        "Messages in the store.",
        s.messages,
    );
    metric(
        "agent_relay_deliveries_pending",
        g,
        "Deliveries waiting for an acknowledgement.",
        s.pending,
    );
    metric(
        "agent_relay_uptime_seconds",
        g,
        "Seconds since the daemon started.",
        s.uptime_s,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_differences_and_bounded() {
        let mut s = Samples::default();
        assert_eq!(s.push(Totals::default()), None);
        for i in 1..=(SAMPLES as u64 + 5) {
            let r = s
                .push(Totals {
                    ts: i,
                    accepted: i * 3,
                    delivered: i * 6,
                    acked: i * 6,
                    ..Totals::default()
                })
                .unwrap_or_else(|| panic!("second {i}"));
            assert_eq!((r.accepted, r.delivered), (3, 6));
        }
        assert_eq!(s.rates().len(), SAMPLES);
    }

    #[test]
    fn prometheus_text_has_help_type_and_value() {
        let t = Totals {
            accepted: 7,
            ..Totals::default()
        };
        let s = StatusInfo {
            running: true,
            pid: 1,
            socket: String::new(),
            db: String::new(),
            storage: "memory".into(),
            uptime_s: 3,
            agents: 2,
            known_agents: 4,
            messages: 7,
            pending: 1,
            version: "0".into(),
            rules: 0,
            rules_error: None,
            delivery: None,
            federation: None,
        };
        let text = prometheus(&t, &s);
        assert!(text.contains("# TYPE agent_relay_messages_accepted_total counter\nagent_relay_messages_accepted_total 7\n"));
        assert!(text.contains("agent_relay_agents_online 2\n"));
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            assert_eq!(line.split(' ').count(), 2, "{line}");
        }
    }
}
