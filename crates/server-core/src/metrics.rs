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
    /// Body bytes written of Windows MSIs (`/agentupdate/agent.msi`, ranges included).
    pub msi_bytes_sent: AtomicU64,
    /// `/agentupdate/delta` answers, by [`DELTA_ANSWERS`].
    pub delta_answers: [AtomicU64; DELTA_ANSWERS.len()],
    /// Deltas the worker made, found not worth sending, or failed to make.
    /// The release model's delta maker counts into these.
    pub deltas: std::sync::Arc<agent_releases::deltas::DeltaCounts>,
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
    /// The transport's counts of connections (opened, closed by which clock, evicted).
    pub conns: std::sync::Arc<server_transport::ConnCounters>,
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
    /// A release's Windows MSI: its answers count with the bundles' downloads (one
    /// download limit guards both), its bytes apart.
    Msi,
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
            Sent::Bundle | Sent::Msi => match status {
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
            Sent::Msi => &self.msi_bytes_sent,
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

// One counter increment for the server's counters and the transport's.
pub use server_transport::counters::inc;

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
        let mut text = String::new();
        let out = &mut text;
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        gauge(
            "agentupdate_downloads_in_flight",
            "Bundle downloads holding a slot now.",
        )
        .one(out, in_flight);
        gauge(
            "agentupdate_downloads_in_flight_peak",
            "Most downloads ever in flight at once.",
        )
        .one(out, peak);
        counter(
            "agentupdate_downloads_total",
            "Download requests by answer.",
        )
        .write(
            out,
            counted(
                "code",
                [
                    ("200", &self.downloads_200),
                    ("206", &self.downloads_206),
                    ("304", &self.downloads_304),
                    ("412", &self.downloads_412),
                    ("403", &self.downloads_403),
                    ("416", &self.downloads_416),
                    ("503", &self.downloads_503),
                ],
            ),
        );
        counter(
            "agentupdate_bytes_sent_total",
            "Body bytes written to agents, ranges included: of bundles, of deltas, and of Windows MSIs.",
        )
        .write(
            out,
            counted(
                "kind",
                [
                    ("bundle", &self.bytes_sent),
                    ("delta", &self.delta_bytes_sent),
                    ("msi", &self.msi_bytes_sent),
                ],
            ),
        );
        counter(
            "agentupdate_delta_requests_total",
            "Delta requests by answer.",
        )
        .write(
            out,
            counted("answer", DELTA_ANSWERS.iter().zip(&self.delta_answers)),
        );
        counter(
            "agentupdate_deltas_made_total",
            "Deltas made, by outcome: ready to send, not worth sending (over half the bundle), or failed.",
        )
        .write(
            out,
            counted(
                "outcome",
                [
                    ("ready", &self.deltas.made),
                    ("not_worth", &self.deltas.not_worth),
                    ("failed", &self.deltas.failed),
                ],
            ),
        );
        counter(
            "agentupdate_registrations_total",
            "Register and connect requests by outcome.",
        )
        .write(
            out,
            counted(
                "outcome",
                [
                    ("accepted", &self.registrations_accepted),
                    ("refused", &self.registrations_refused),
                ],
            ),
        );
        counter("agentupdate_reports_total", "Update reports received.")
            .one(out, get(&self.reports));
        counter(
            "agentupdate_source_downloads_total",
            "Bundles agents reported taking from downloads.public-url (from=\"source\"), and from this server after the source failed them (from=\"server\").",
        )
        .write(
            out,
            counted(
                "from",
                [
                    ("source", &self.from_source),
                    ("server", &self.source_fallbacks),
                ],
            ),
        );
        gauge("agentupdate_agents", "Known agents by version.").write(
            out,
            by_version
                .iter()
                .map(|(version, n)| (label("version", version), n)),
        );
        gauge(
            "agentupdate_agents_by_update_status",
            "Known agents by last update status.",
        )
        .write(
            out,
            by_status
                .iter()
                .map(|(status, n)| (label("status", status), n)),
        );
        counter(
            "agentupdate_downloads_stalled_total",
            "Downloads ended because their client took no bytes for downloads.stall-timeout (their slots freed).",
        )
        .one(out, get(&self.stalled));
        counter(
            "agentupdate_connections_closed_total",
            "Connections the server closed on a clock, by clock.",
        )
        .write(
            out,
            counted(
                "reason",
                [
                    ("header-timeout", &self.conns.header_timeouts),
                    ("idle-timeout", &self.conns.idle_closed),
                    ("stall-timeout", &self.conns.stall_closed),
                    ("evicted", &self.conns.evicted),
                ],
            ),
        );
        counter(
            "agentupdate_panics_total",
            "Panics the server caught and went on after (each is in its log with a backtrace).",
        )
        .one(out, crate::panics::count());
        gauge(
            "agentupdate_connections_open",
            "Client connections open now.",
        )
        .one(out, get(&self.conns.connections_open));
        counter(
            "agentupdate_connections_total",
            "Client connections accepted.",
        )
        .one(out, get(&self.conns.connections_total));
        gauge(
            "agentupdate_connects_held",
            "Long-polling connects held now (agents waiting for news).",
        )
        .one(out, get(&self.connects_held));
        counter(
            "agentupdate_held_connects_total",
            "Long-polling connects held.",
        )
        .one(out, get(&self.held_connects));
        render_rollout(out, rollout);
        render_database(out, database);
        text
    }
}

/// The states a rollout (of the bundle, or of a group's configuration) can be in: each
/// gets a sample, 1 for the state it is in and 0 for the others, so that a dashboard
/// sees a state's series even while no rollout is in it.
const ROLLOUT_STATES: [&str; 4] = ["running", "soaking", "halted", "completed"];

fn render_rollout(out: &mut String, r: &RolloutGauges) {
    gauge(
        "agentupdate_rollout_state",
        "The fleet's rollout is in this state (1) or not (0).",
    )
    .write(
        out,
        ROLLOUT_STATES.map(|state| (label("state", state), u8::from(r.state == Some(state)))),
    );
    gauge(
        "agentupdate_rollout_wave",
        "Waves of the fleet's rollout opened so far.",
    )
    .one(out, r.wave);
    gauge(
        "agentupdate_rollout_wave_agents",
        "Agents of each wave of the fleet's rollout, by outcome.",
    )
    .write(
        out,
        // Waves are numbered from 1.
        (1_usize..).zip(&r.waves).flat_map(|(wave, w)| {
            [
                ("pending", w.pending()),
                ("installed", w.installed),
                ("failed", w.failed),
                ("timed_out", w.timed_out),
                ("no_bundle", w.no_bundle),
            ]
            .map(|(status, n)| {
                (
                    vec![("wave", wave.to_string()), ("status", status.to_owned())],
                    n,
                )
            })
        }),
    );
    counter(
        "agentupdate_rollout_halts_total",
        "Rollouts this server halted, by cause.",
    )
    .write(
        out,
        r.halts.iter().map(|(cause, n)| (label("cause", cause), n)),
    );
    gauge(
        "agentupdate_bundle_mismatch",
        "This server's bundle is not the fleet's rollout.",
    )
    .one(out, u8::from(r.mismatch));
}

fn render_database(out: &mut String, d: &agent_fleet::outage::Status) {
    gauge(
        "agentupdate_database_up",
        "1 when the fleet database answers; 0 while agents are answered from memory.",
    )
    .one(out, u8::from(d.up));
    gauge(
        "agentupdate_database_queued_writes",
        "Writes waiting for the fleet database.",
    )
    .one(out, d.queued);
    counter(
        "agentupdate_database_outages_total",
        "Times the fleet database was found unreachable.",
    )
    .one(out, d.outages);
    counter(
        "agentupdate_database_dropped_contacts_total",
        "Contacts not queued because the queue was full.",
    )
    .one(out, d.dropped);
}

/// The config rollouts' gauges, after the rest of `/metrics`.
pub fn render_config(
    out: &mut String,
    metrics: &Metrics,
    gauges: &agent_fleet::config::ConfigGauges,
) {
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    counter(
        "agentupdate_config_sent_total",
        "Answers to agents that carried a configuration set.",
    )
    .one(out, get(&metrics.configs_sent));
    counter(
        "agentupdate_config_status_total",
        "Configuration statuses agents reported.",
    )
    .one(out, get(&metrics.config_statuses));
    gauge(
        "agentupdate_config_rollout_state",
        "Each group's config rollout is in this state (1) or not (0).",
    )
    .write(
        out,
        gauges.states.iter().flat_map(|(group, state)| {
            ROLLOUT_STATES.map(|s| {
                (
                    vec![("group", group.clone()), ("state", s.to_owned())],
                    u8::from(*state == s),
                )
            })
        }),
    );
    gauge(
        "agentupdate_config_agents",
        "Agents of each group's config rollout, by status.",
    )
    .write(
        out,
        gauges
            .agents
            .iter()
            .flat_map(|(group, applied, failed, pending)| {
                [
                    ("applied", applied),
                    ("failed", failed),
                    ("pending", pending),
                ]
                .map(|(status, n)| {
                    (
                        vec![("group", group.clone()), ("status", status.to_owned())],
                        n,
                    )
                })
            }),
    );
    counter(
        "agentupdate_config_rollout_halts_total",
        "Config rollouts this server halted, by cause.",
    )
    .write(
        out,
        gauges
            .halts
            .iter()
            .map(|(cause, n)| (label("cause", cause), n)),
    );
}

/// The fleet's health as its agents last reported it.
pub fn health(unhealthy: i64, restarts: i64) -> String {
    let mut out = String::new();
    gauge(
        "agentupdate_agents_unhealthy",
        "Agents whose last reported health is unhealthy (agent or workload).",
    )
    .one(&mut out, unhealthy);
    gauge(
        "agentupdate_workload_restarts",
        "Workload restarts the agents last reported, summed (each agent counts since it started).",
    )
    .one(&mut out, restarts);
    out
}

/// A metric family's type, as its `# TYPE` line says it.
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// Only goes up (until the server starts again).
    Counter,
    /// Goes up and down.
    Gauge,
}

/// One metric family of `/metrics`: its name, type and help text are written once, on
/// its `# HELP` and `# TYPE` lines, above its samples. The names, the help texts and the
/// labels are a contract with whoever scrapes `/metrics`; a family is declared once,
/// where its samples are, so that no sample can be written under another name.
#[derive(Debug, Clone, Copy)]
struct Family {
    name: &'static str,
    kind: Kind,
    /// Written as it is: these texts are constants here, with neither a backslash nor
    /// a newline, the two things the format would escape on a `# HELP` line.
    help: &'static str,
}

const fn counter(name: &'static str, help: &'static str) -> Family {
    Family {
        name,
        kind: Kind::Counter,
        help,
    }
}

const fn gauge(name: &'static str, help: &'static str) -> Family {
    Family {
        name,
        kind: Kind::Gauge,
        help,
    }
}

/// A sample's labels, (name, value), in the order they are written; values are escaped
/// when written.
type Labels = Vec<(&'static str, String)>;

fn label(name: &'static str, value: impl std::fmt::Display) -> Labels {
    vec![(name, value.to_string())]
}

/// Samples of counters of [`Metrics`], told apart by one label.
fn counted<'a, L: std::fmt::Display>(
    name: &'static str,
    counters: impl IntoIterator<Item = (L, &'a AtomicU64)>,
) -> Vec<(Labels, u64)> {
    counters
        .into_iter()
        .map(|(value, c)| (label(name, value), c.load(Ordering::Relaxed)))
        .collect()
}

impl Family {
    /// Writes the family's `# HELP` and `# TYPE` lines, then a line per sample, in the
    /// order given. A family without samples still gets its two lines.
    fn write<V: std::fmt::Display>(
        self,
        out: &mut String,
        samples: impl IntoIterator<Item = (Labels, V)>,
    ) {
        let kind = match self.kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        };
        // Writing to a String cannot fail: the results are ignored.
        let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(out, "# TYPE {} {kind}", self.name);
        for (labels, value) in samples {
            out.push_str(self.name);
            for (i, (name, text)) in labels.iter().enumerate() {
                out.push(if i == 0 { '{' } else { ',' });
                let _ = write!(out, "{name}=\"{}\"", escape(text));
            }
            if !labels.is_empty() {
                out.push('}');
            }
            let _ = writeln!(out, " {value}");
        }
    }

    /// Writes the family with its one sample, which has no labels.
    fn one(self, out: &mut String, value: impl std::fmt::Display) {
        self.write(out, [(Labels::new(), value)]);
    }
}

/// A label value as the text format wants it between its quotes: a backslash, a double
/// quote and a newline escaped (an agent's version or a group's name is whatever it was
/// given).
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
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

    /// Every counter set to a number of its own, so that a counter written under
    /// another's name shows.
    fn counted() -> Metrics {
        let m = Metrics::default();
        let counters = [
            &m.downloads_200,
            &m.downloads_206,
            &m.downloads_304,
            &m.downloads_412,
            &m.downloads_403,
            &m.downloads_416,
            &m.downloads_503,
            &m.bytes_sent,
            &m.delta_bytes_sent,
            &m.deltas.made,
            &m.deltas.not_worth,
            &m.deltas.failed,
            &m.registrations_accepted,
            &m.registrations_refused,
            &m.reports,
            &m.from_source,
            &m.source_fallbacks,
            &m.config_statuses,
            &m.configs_sent,
            &m.stalled,
            &m.conns.stall_closed,
            &m.conns.header_timeouts,
            &m.conns.idle_closed,
            &m.conns.evicted,
            &m.conns.connections_total,
            &m.conns.connections_open,
            &m.connects_held,
            &m.held_connects,
            &m.msi_bytes_sent,
        ];
        for (n, c) in (1..).zip(counters) {
            c.store(n, Ordering::Relaxed);
        }
        for (n, c) in (101..).zip(&m.delta_answers) {
            c.store(n, Ordering::Relaxed);
        }
        m
    }

    /// All of `/metrics` as the admin route puts it together.
    fn rendered(m: &Metrics) -> String {
        let rollout = RolloutGauges {
            state: Some("soaking"),
            wave: 2,
            waves: vec![
                WaveStatus {
                    agents: 10,
                    installed: 7,
                    failed: 1,
                    timed_out: 1,
                    no_bundle: 1,
                    ..WaveStatus::default()
                },
                WaveStatus {
                    agents: 40,
                    installed: 12,
                    failed: 2,
                    timed_out: 3,
                    no_bundle: 4,
                    ..WaveStatus::default()
                },
            ],
            halts: vec![("failures", 1), ("downgrade", 0)],
            mismatch: true,
        };
        let database = agent_fleet::outage::Status {
            up: false,
            down_for: Some(12.5),
            reason: Some("connection refused".to_owned()),
            queued: 9,
            dropped: 4,
            outages: 3,
        };
        let by_version = [
            ("1.2.0".to_owned(), 5),
            ("1.3.0-rc.1".to_owned(), 2),
            ("odd \"1\"\\\n".to_owned(), 1),
        ];
        let by_status = [("installed".to_owned(), 6), ("failed".to_owned(), 2)];
        let mut text = m.render(3, 8, &by_version, &by_status, &rollout, &database);
        let config = agent_fleet::config::ConfigGauges {
            states: vec![
                ("canary".to_owned(), "running"),
                ("prod".to_owned(), "halted"),
            ],
            agents: vec![
                ("canary".to_owned(), 3, 1, 2),
                ("prod".to_owned(), 20, 0, 5),
            ],
            halts: vec![("failures", 2)],
        };
        render_config(&mut text, m, &config);
        text + &health(4, 17)
    }

    /// The panic count is the process's: another test's panic may move it, so its
    /// value is checked for a number and then set aside.
    fn without_panics(text: &str) -> String {
        const PANICS: &str = "agentupdate_panics_total ";
        text.lines()
            .map(|line| match line.strip_prefix(PANICS) {
                Some(n) => {
                    assert!(n.parse::<u64>().is_ok(), "{line}");
                    format!("{PANICS}N\n")
                }
                None => format!("{line}\n"),
            })
            .collect()
    }

    /// The metric names, HELP texts, labels and order are a contract with whoever
    /// scrapes `/metrics`: the text must not move by a byte.
    #[test]
    fn the_metrics_text_is_unchanged() {
        let text = without_panics(&rendered(&counted()));
        assert_eq!(text, include_str!("../tests/fixtures/metrics.txt"));
    }

    /// A label value may be anything an agent or an operator sent: a `"`, a `\` or a
    /// newline in it must not end the value, or the line, early.
    #[test]
    fn a_label_value_is_escaped() {
        let mut out = String::new();
        gauge("x", "An example.").write(
            &mut out,
            [(
                vec![
                    ("a", "say \"hi\"\\n\nthen".to_owned()),
                    ("b", "plain".to_owned()),
                ],
                1,
            )],
        );
        assert_eq!(
            out,
            "# HELP x An example.\n# TYPE x gauge\nx{a=\"say \\\"hi\\\"\\\\n\\nthen\",b=\"plain\"} 1\n"
        );

        let mut out = String::new();
        let config = agent_fleet::config::ConfigGauges {
            halts: vec![],
            states: vec![],
            agents: vec![("a\"b\\c\nd".to_owned(), 1, 2, 3)],
        };
        render_config(&mut out, &Metrics::default(), &config);
        assert!(
            out.contains(
                "agentupdate_config_agents{group=\"a\\\"b\\\\c\\nd\",status=\"applied\"} 1\n"
            ),
            "{out}"
        );
    }
}
