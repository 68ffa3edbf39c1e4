//! Counters behind `/metrics` (Prometheus text format).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use agent_fleet::rollout::step::WaveStatus;

#[derive(Debug, Default)]
pub struct Metrics {
    pub downloads_200: AtomicU64,
    pub downloads_206: AtomicU64,
    pub downloads_304: AtomicU64,
    pub downloads_412: AtomicU64,
    pub downloads_403: AtomicU64,
    pub downloads_416: AtomicU64,
    pub downloads_503: AtomicU64,
    /// Body bytes written of bundles (ranges included).
    pub bytes_sent: AtomicU64,
    /// Body bytes written of deltas (ranges included).
    pub delta_bytes_sent: AtomicU64,
    /// `/agentupdate/delta` answers, by [`DELTA_ANSWERS`].
    pub delta_answers: [AtomicU64; DELTA_ANSWERS.len()],
    /// Deltas the worker made, found not worth sending, or failed to make.
    pub deltas_made: AtomicU64,
    pub deltas_not_worth: AtomicU64,
    pub deltas_failed: AtomicU64,
    pub registrations_accepted: AtomicU64,
    pub registrations_refused: AtomicU64,
    pub reports: AtomicU64,
    /// Agents that reported taking a bundle's bytes from `downloads.public-url`, and
    /// from this server after that source failed them.
    pub from_source: AtomicU64,
    pub source_fallbacks: AtomicU64,
    /// `POST /agent/config-status` calls.
    pub config_statuses: AtomicU64,
    /// Answers that carried a configuration set.
    pub configs_sent: AtomicU64,
    /// Downloads whose client took no bytes for `downloads.stall-timeout` (slots freed).
    pub stalled: AtomicU64,
    /// Connections closed because a write made no progress for `downloads.stall-timeout`.
    pub stall_closed: AtomicU64,
    /// Connections closed for want of a whole request head in `server.header-timeout`.
    pub header_timeouts: AtomicU64,
    /// Keep-alive connections closed after `server.idle-timeout`.
    pub idle_closed: AtomicU64,
    /// Idle connections closed to make room for a new one at `server.max-connections`.
    pub evicted: AtomicU64,
    pub connections_total: AtomicU64,
    pub connections_open: AtomicU64,
    /// Long-polling connects held now, and held in all.
    pub connects_held: AtomicU64,
    pub held_connects: AtomicU64,
}

/// The statuses `/agentupdate/delta` answers, as its counter's labels.
pub const DELTA_ANSWERS: [u16; 10] = [200, 206, 300, 304, 400, 403, 404, 412, 416, 503];

/// What a download route sends: counted apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    Bundle,
    Delta,
}

impl Metrics {
    /// Counts where a report says the agent took the bundle's bytes (its
    /// `Agent-Bundle-From` header); a report without one, or with another word, counts
    /// nowhere.
    pub fn bundle_from(&self, from: Option<&str>) {
        match from.map(str::trim) {
            Some(agent_protocol::wire::FROM_SOURCE) => inc(&self.from_source),
            Some(agent_protocol::wire::FROM_SERVER) => inc(&self.source_fallbacks),
            _ => {}
        }
    }

    /// Counts one answer of a download route by its status.
    pub fn answered(&self, sent: Sent, status: u16) {
        let counter = match sent {
            Sent::Bundle => match status {
                200 => &self.downloads_200,
                206 => &self.downloads_206,
                304 => &self.downloads_304,
                403 => &self.downloads_403,
                412 => &self.downloads_412,
                416 => &self.downloads_416,
                503 => &self.downloads_503,
                _ => return,
            },
            Sent::Delta => match DELTA_ANSWERS.iter().position(|c| *c == status) {
                Some(i) => &self.delta_answers[i],
                None => return,
            },
        };
        inc(counter);
    }

    /// Counts body bytes written.
    pub fn sent(&self, sent: Sent, bytes: u64) {
        let counter = match sent {
            Sent::Bundle => &self.bytes_sent,
            Sent::Delta => &self.delta_bytes_sent,
        };
        counter.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// Counts one held connect for as long as it lives (however it ends: answered, or
/// dropped when its client goes away).
pub struct Holding<'a>(&'a AtomicU64);

impl<'a> Holding<'a> {
    pub fn new(gauge: &'a AtomicU64) -> Self {
        gauge.fetch_add(1, Ordering::Relaxed);
        Self(gauge)
    }
}

impl Drop for Holding<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

pub fn inc(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// What `/metrics` says of the fleet's rollout.
#[derive(Debug, Default)]
pub struct RolloutGauges {
    /// `None` before the first rollout.
    pub state: Option<&'static str>,
    /// Waves opened so far.
    pub wave: u32,
    pub waves: Vec<WaveStatus>,
    /// Halts this server decided, by cause.
    pub halts: Vec<(&'static str, u64)>,
    /// This server's bundle is not the fleet's rollout.
    pub mismatch: bool,
}

impl Metrics {
    pub fn render(
        &self,
        in_flight: usize,
        peak: usize,
        by_version: &[(String, i64)],
        by_status: &[(String, i64)],
        rollout: &RolloutGauges,
        database: &agent_fleet::outage::Status,
    ) -> String {
        let mut out = String::new();
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "# HELP agentupdate_downloads_in_flight Bundle downloads holding a slot now."
        );
        let _ = writeln!(out, "# TYPE agentupdate_downloads_in_flight gauge");
        let _ = writeln!(out, "agentupdate_downloads_in_flight {in_flight}");
        let _ = writeln!(
            out,
            "# HELP agentupdate_downloads_in_flight_peak Most downloads ever in flight at once."
        );
        let _ = writeln!(out, "# TYPE agentupdate_downloads_in_flight_peak gauge");
        let _ = writeln!(out, "agentupdate_downloads_in_flight_peak {peak}");
        let _ = writeln!(
            out,
            "# HELP agentupdate_downloads_total Download requests by answer."
        );
        let _ = writeln!(out, "# TYPE agentupdate_downloads_total counter");
        for (code, c) in [
            ("200", &self.downloads_200),
            ("206", &self.downloads_206),
            ("304", &self.downloads_304),
            ("412", &self.downloads_412),
            ("403", &self.downloads_403),
            ("416", &self.downloads_416),
            ("503", &self.downloads_503),
        ] {
            let _ = writeln!(
                out,
                "agentupdate_downloads_total{{code=\"{code}\"}} {}",
                get(c)
            );
        }
        let _ = writeln!(
            out,
            "# HELP agentupdate_bytes_sent_total Body bytes written to agents, ranges included: of bundles, and of deltas."
        );
        let _ = writeln!(out, "# TYPE agentupdate_bytes_sent_total counter");
        for (kind, c) in [
            ("bundle", &self.bytes_sent),
            ("delta", &self.delta_bytes_sent),
        ] {
            let _ = writeln!(
                out,
                "agentupdate_bytes_sent_total{{kind=\"{kind}\"}} {}",
                get(c)
            );
        }
        let _ = writeln!(
            out,
            "# HELP agentupdate_delta_requests_total Delta requests by answer."
        );
        let _ = writeln!(out, "# TYPE agentupdate_delta_requests_total counter");
        for (code, c) in DELTA_ANSWERS.iter().zip(&self.delta_answers) {
            let _ = writeln!(
                out,
                "agentupdate_delta_requests_total{{answer=\"{code}\"}} {}",
                get(c)
            );
        }
        let _ = writeln!(
            out,
            "# HELP agentupdate_deltas_made_total Deltas made, by outcome: ready to send, not worth sending (over half the bundle), or failed."
        );
        let _ = writeln!(out, "# TYPE agentupdate_deltas_made_total counter");
        for (outcome, c) in [
            ("ready", &self.deltas_made),
            ("not_worth", &self.deltas_not_worth),
            ("failed", &self.deltas_failed),
        ] {
            let _ = writeln!(
                out,
                "agentupdate_deltas_made_total{{outcome=\"{outcome}\"}} {}",
                get(c)
            );
        }
        let _ = writeln!(
            out,
            "# HELP agentupdate_registrations_total Register and connect requests by outcome."
        );
        let _ = writeln!(out, "# TYPE agentupdate_registrations_total counter");
        let _ = writeln!(
            out,
            "agentupdate_registrations_total{{outcome=\"accepted\"}} {}",
            get(&self.registrations_accepted)
        );
        let _ = writeln!(
            out,
            "agentupdate_registrations_total{{outcome=\"refused\"}} {}",
            get(&self.registrations_refused)
        );
        let _ = writeln!(
            out,
            "# HELP agentupdate_reports_total Update reports received."
        );
        let _ = writeln!(out, "# TYPE agentupdate_reports_total counter");
        let _ = writeln!(out, "agentupdate_reports_total {}", get(&self.reports));
        let _ = writeln!(
            out,
            "# HELP agentupdate_source_downloads_total Bundles agents reported taking from downloads.public-url (from=\"source\"), and from this server after the source failed them (from=\"server\")."
        );
        let _ = writeln!(out, "# TYPE agentupdate_source_downloads_total counter");
        for (from, n) in [
            ("source", &self.from_source),
            ("server", &self.source_fallbacks),
        ] {
            let _ = writeln!(
                out,
                "agentupdate_source_downloads_total{{from=\"{from}\"}} {}",
                get(n)
            );
        }
        let _ = writeln!(out, "# HELP agentupdate_agents Known agents by version.");
        let _ = writeln!(out, "# TYPE agentupdate_agents gauge");
        for (version, n) in by_version {
            let _ = writeln!(
                out,
                "agentupdate_agents{{version=\"{}\"}} {n}",
                escape(version)
            );
        }
        let _ = writeln!(
            out,
            "# HELP agentupdate_agents_by_update_status Known agents by last update status."
        );
        let _ = writeln!(out, "# TYPE agentupdate_agents_by_update_status gauge");
        for (status, n) in by_status {
            let _ = writeln!(
                out,
                "agentupdate_agents_by_update_status{{status=\"{}\"}} {n}",
                escape(status)
            );
        }
        let _ = writeln!(
            out,
            "# HELP agentupdate_downloads_stalled_total Downloads ended because their client took no bytes for downloads.stall-timeout (their slots freed)."
        );
        let _ = writeln!(out, "# TYPE agentupdate_downloads_stalled_total counter");
        let _ = writeln!(
            out,
            "agentupdate_downloads_stalled_total {}",
            get(&self.stalled)
        );
        let _ = writeln!(
            out,
            "# HELP agentupdate_connections_closed_total Connections the server closed on a clock, by clock."
        );
        let _ = writeln!(out, "# TYPE agentupdate_connections_closed_total counter");
        for (why, c) in [
            ("header-timeout", &self.header_timeouts),
            ("idle-timeout", &self.idle_closed),
            ("stall-timeout", &self.stall_closed),
            ("evicted", &self.evicted),
        ] {
            let _ = writeln!(
                out,
                "agentupdate_connections_closed_total{{reason=\"{why}\"}} {}",
                get(c)
            );
        }
        let _ = writeln!(
            out,
            "# HELP agentupdate_panics_total Panics the server caught and went on after (each is in its log with a backtrace)."
        );
        let _ = writeln!(out, "# TYPE agentupdate_panics_total counter");
        let _ = writeln!(out, "agentupdate_panics_total {}", crate::panics::count());
        let _ = writeln!(
            out,
            "# HELP agentupdate_connections_open Client connections open now."
        );
        let _ = writeln!(out, "# TYPE agentupdate_connections_open gauge");
        let _ = writeln!(
            out,
            "agentupdate_connections_open {}",
            get(&self.connections_open)
        );
        let _ = writeln!(
            out,
            "# HELP agentupdate_connections_total Client connections accepted."
        );
        let _ = writeln!(out, "# TYPE agentupdate_connections_total counter");
        let _ = writeln!(
            out,
            "agentupdate_connections_total {}",
            get(&self.connections_total)
        );
        let _ = writeln!(
            out,
            "# HELP agentupdate_connects_held Long-polling connects held now (agents waiting for news)."
        );
        let _ = writeln!(out, "# TYPE agentupdate_connects_held gauge");
        let _ = writeln!(
            out,
            "agentupdate_connects_held {}",
            get(&self.connects_held)
        );
        let _ = writeln!(
            out,
            "# HELP agentupdate_held_connects_total Long-polling connects held."
        );
        let _ = writeln!(out, "# TYPE agentupdate_held_connects_total counter");
        let _ = writeln!(
            out,
            "agentupdate_held_connects_total {}",
            get(&self.held_connects)
        );
        render_rollout(&mut out, rollout);
        render_database(&mut out, database);
        out
    }
}

fn render_rollout(out: &mut String, r: &RolloutGauges) {
    let _ = writeln!(
        out,
        "# HELP agentupdate_rollout_state The fleet's rollout is in this state (1) or not (0)."
    );
    let _ = writeln!(out, "# TYPE agentupdate_rollout_state gauge");
    for state in ["running", "soaking", "halted", "completed"] {
        let _ = writeln!(
            out,
            "agentupdate_rollout_state{{state=\"{state}\"}} {}",
            u8::from(r.state == Some(state))
        );
    }
    let _ = writeln!(
        out,
        "# HELP agentupdate_rollout_wave Waves of the fleet's rollout opened so far."
    );
    let _ = writeln!(out, "# TYPE agentupdate_rollout_wave gauge");
    let _ = writeln!(out, "agentupdate_rollout_wave {}", r.wave);
    let _ = writeln!(
        out,
        "# HELP agentupdate_rollout_wave_agents Agents of each wave of the fleet's rollout, by outcome."
    );
    let _ = writeln!(out, "# TYPE agentupdate_rollout_wave_agents gauge");
    for (i, w) in r.waves.iter().enumerate() {
        for (status, n) in [
            ("pending", w.pending()),
            ("installed", w.installed),
            ("failed", w.failed),
            ("timed_out", w.timed_out),
            ("no_bundle", w.no_bundle),
        ] {
            let _ = writeln!(
                out,
                "agentupdate_rollout_wave_agents{{wave=\"{}\",status=\"{status}\"}} {n}",
                i + 1
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP agentupdate_rollout_halts_total Rollouts this server halted, by cause."
    );
    let _ = writeln!(out, "# TYPE agentupdate_rollout_halts_total counter");
    for (cause, n) in &r.halts {
        let _ = writeln!(
            out,
            "agentupdate_rollout_halts_total{{cause=\"{cause}\"}} {n}"
        );
    }
    let _ = writeln!(
        out,
        "# HELP agentupdate_bundle_mismatch This server's bundle is not the fleet's rollout."
    );
    let _ = writeln!(out, "# TYPE agentupdate_bundle_mismatch gauge");
    let _ = writeln!(out, "agentupdate_bundle_mismatch {}", u8::from(r.mismatch));
}

fn render_database(out: &mut String, d: &agent_fleet::outage::Status) {
    let _ = writeln!(
        out,
        "# HELP agentupdate_database_up 1 when the fleet database answers; 0 while agents are answered from memory."
    );
    let _ = writeln!(out, "# TYPE agentupdate_database_up gauge");
    let _ = writeln!(out, "agentupdate_database_up {}", u8::from(d.up));
    let _ = writeln!(
        out,
        "# HELP agentupdate_database_queued_writes Writes waiting for the fleet database."
    );
    let _ = writeln!(out, "# TYPE agentupdate_database_queued_writes gauge");
    let _ = writeln!(out, "agentupdate_database_queued_writes {}", d.queued);
    let _ = writeln!(
        out,
        "# HELP agentupdate_database_outages_total Times the fleet database was found unreachable."
    );
    let _ = writeln!(out, "# TYPE agentupdate_database_outages_total counter");
    let _ = writeln!(out, "agentupdate_database_outages_total {}", d.outages);
    let _ = writeln!(
        out,
        "# HELP agentupdate_database_dropped_contacts_total Contacts not queued because the queue was full."
    );
    let _ = writeln!(
        out,
        "# TYPE agentupdate_database_dropped_contacts_total counter"
    );
    let _ = writeln!(
        out,
        "agentupdate_database_dropped_contacts_total {}",
        d.dropped
    );
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The config rollouts' gauges, after the rest of `/metrics`.
pub fn render_config(
    out: &mut String,
    metrics: &Metrics,
    gauges: &agent_fleet::config::ConfigGauges,
) {
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let _ = writeln!(
        out,
        "# HELP agentupdate_config_sent_total Answers to agents that carried a configuration set."
    );
    let _ = writeln!(out, "# TYPE agentupdate_config_sent_total counter");
    let _ = writeln!(
        out,
        "agentupdate_config_sent_total {}",
        get(&metrics.configs_sent)
    );
    let _ = writeln!(
        out,
        "# HELP agentupdate_config_status_total Configuration statuses agents reported."
    );
    let _ = writeln!(out, "# TYPE agentupdate_config_status_total counter");
    let _ = writeln!(
        out,
        "agentupdate_config_status_total {}",
        get(&metrics.config_statuses)
    );
    let _ = writeln!(
        out,
        "# HELP agentupdate_config_rollout_state Each group's config rollout is in this state (1) or not (0)."
    );
    let _ = writeln!(out, "# TYPE agentupdate_config_rollout_state gauge");
    for (group, state) in &gauges.states {
        for s in ["running", "soaking", "halted", "completed"] {
            let _ = writeln!(
                out,
                "agentupdate_config_rollout_state{{group=\"{group}\",state=\"{s}\"}} {}",
                u8::from(*state == s)
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP agentupdate_config_agents Agents of each group's config rollout, by status."
    );
    let _ = writeln!(out, "# TYPE agentupdate_config_agents gauge");
    for (group, applied, failed, pending) in &gauges.agents {
        for (status, n) in [
            ("applied", applied),
            ("failed", failed),
            ("pending", pending),
        ] {
            let _ = writeln!(
                out,
                "agentupdate_config_agents{{group=\"{group}\",status=\"{status}\"}} {n}"
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP agentupdate_config_rollout_halts_total Config rollouts this server halted, by cause."
    );
    let _ = writeln!(out, "# TYPE agentupdate_config_rollout_halts_total counter");
    for (cause, n) in &gauges.halts {
        let _ = writeln!(
            out,
            "agentupdate_config_rollout_halts_total{{cause=\"{cause}\"}} {n}"
        );
    }
}

/// The fleet's health as its agents last reported it.
pub fn health(unhealthy: i64, restarts: i64) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# HELP agentupdate_agents_unhealthy Agents whose last reported health is unhealthy (agent or workload)."
    );
    let _ = writeln!(out, "# TYPE agentupdate_agents_unhealthy gauge");
    let _ = writeln!(out, "agentupdate_agents_unhealthy {unhealthy}");
    let _ = writeln!(
        out,
        "# HELP agentupdate_workload_restarts Workload restarts the agents last reported, summed (each agent counts since it started)."
    );
    let _ = writeln!(out, "# TYPE agentupdate_workload_restarts gauge");
    let _ = writeln!(out, "agentupdate_workload_restarts {restarts}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_counts_where_the_bundle_came_from() {
        let m = Metrics::default();
        for from in [
            Some("source"),
            Some("server"),
            Some("source"),
            None,
            Some("x"),
        ] {
            m.bundle_from(from);
        }
        let get = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!((get(&m.from_source), get(&m.source_fallbacks)), (2, 1));
    }
}
