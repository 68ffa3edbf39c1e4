//! What the page knows of one agent, and the staleness rule. Plain data: built by
//! [`super::source`] from the fleet model, read by the counts, the filters and the views.

use std::time::Duration;

/// How many heartbeats an agent may miss before the page calls it stale.
pub const STALE_HEARTBEATS: u32 = 3;
// The server writes an unchanged contact at most this often: always within the silence
// the page calls stale.
const _: () =
    assert!(server_core::background::CONTACT_REFRESH_HALF_BEATS + 2 < 2 * STALE_HEARTBEATS as u64);

/// One agent as `/admin/agents` reports it. Every string came from the agent (or from
/// whoever holds its id): untrusted text, escaped by the templates.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Agent {
    pub id: String,
    pub name: String,
    pub platform: String,
    pub version: String,
    pub group: String,
    /// `native` or `opamp`.
    pub protocol: String,
    /// Unix seconds.
    pub last_contact: i64,
    /// `INSTALLING`, `INSTALLED`, `INSTALL_FAILED`, `TIMED_OUT`; `None` before any report.
    pub update_status: Option<String>,
    pub update_error: Option<String>,
    /// Its wave in the fleet's rollout.
    pub wave: Option<u32>,
    /// Unix seconds.
    pub told_at: Option<f64>,
    /// The workload's health (`healthy`, `unhealthy`, …), when the fleet model knows it.
    pub health: Option<String>,
    /// Why it is unhealthy, in the agent's words.
    pub health_detail: Option<String>,
    pub config_hash: Option<String>,
    /// `APPLIED`, `APPLYING`, `FAILED`, when the agent has a configuration set.
    pub config_status: Option<String>,
    pub config_error: Option<String>,
    /// Its effective labels (its own, the server's, the built-ins), for the selector.
    pub labels: std::collections::BTreeMap<String, String>,
    /// The deployment it follows (by its labels).
    pub deployment: String,
}

/// The label the counts and filters use for an agent that has not said.
pub const NONE: &str = "NONE";

impl Agent {
    pub fn update_label(&self) -> &str {
        self.update_status.as_deref().unwrap_or(NONE)
    }

    pub fn health_label(&self) -> &str {
        self.health.as_deref().unwrap_or("unknown")
    }

    pub fn config_label(&self) -> &str {
        self.config_status.as_deref().unwrap_or(NONE)
    }

    pub fn protocol_label(&self) -> &str {
        if self.protocol.is_empty() {
            "native"
        } else {
            &self.protocol
        }
    }

    /// The platform (target triple) the agent said, `unknown` when it said none.
    pub fn platform_label(&self) -> &str {
        if self.platform.is_empty() {
            "unknown"
        } else {
            &self.platform
        }
    }

    /// A failed update or configuration, as the agent reported it.
    pub fn failed(&self) -> bool {
        matches!(self.update_label(), "INSTALL_FAILED" | "TIMED_OUT")
            || self.config_label() == "FAILED"
    }
}

/// The health label and its detail from what an agent reports of its workload
/// (`healthy`, the workload's state, its restarts, its last error): `healthy` or
/// `unhealthy`, so that the counts and the filter have few values; the rest is detail.
pub fn health_of(
    healthy: bool,
    workload: &str,
    restarts: u64,
    last_error: Option<&str>,
) -> (String, String) {
    let label = if healthy { "healthy" } else { "unhealthy" };
    let mut detail = format!("workload {workload}");
    if restarts > 0 {
        detail.push_str(&format!(", {restarts} restarts"));
    }
    if let Some(e) = last_error.filter(|e| !e.is_empty()) {
        detail.push_str(": ");
        detail.push_str(e);
    }
    (label.to_owned(), detail)
}

/// Stale: not heard from for more than [`STALE_HEARTBEATS`] heartbeats. A long-polling
/// agent's held connect counts as contact and the heartbeat is its longest silence, so
/// a live agent is never this quiet. A contact in the future (another server's clock)
/// is not stale.
pub fn is_stale(last_contact: i64, heartbeat: Duration, now: i64) -> bool {
    let allowed = heartbeat
        .as_secs()
        .saturating_mul(u64::from(STALE_HEARTBEATS));
    let silent = now.saturating_sub(last_contact);
    silent > 0 && silent.unsigned_abs() > allowed
}

/// "42 s ago", "5 min ago", "3 h ago", "2 d ago": how long ago `then` was; a time to
/// come reads "in 3 h" (a window's opening), and a few seconds ahead (another server's
/// clock) "just now".
pub fn ago(then: i64, now: i64) -> String {
    let secs = now.saturating_sub(then);
    if secs < -CLOCK_SLACK_SECS {
        return format!("in {}", span(secs.saturating_neg()));
    }
    if secs < 0 {
        return "just now".to_owned();
    }
    format!("{} ago", span(secs))
}

/// How far apart two servers' clocks may be before a time reads as the future.
const CLOCK_SLACK_SECS: i64 = 5;

fn span(secs: i64) -> String {
    match secs {
        0..60 => format!("{secs} s"),
        60..3600 => format!("{} min", secs / 60),
        3600..86_400 => format!("{} h", secs / 3600),
        _ => format!("{} d", secs / 86_400),
    }
}

/// The time as an HTTP date (UTC), for the title of an "ago".
pub fn utc(secs: f64) -> String {
    if !secs.is_finite() || secs < 0.0 {
        return String::new();
    }
    httpdate::fmt_http_date(std::time::UNIX_EPOCH + Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEARTBEAT: Duration = Duration::from_secs(30);

    #[test]
    fn an_agent_is_stale_after_three_missed_heartbeats_not_before() {
        let now = 1_000_000;
        assert!(!is_stale(now, HEARTBEAT, now));
        assert!(!is_stale(now - 89, HEARTBEAT, now));
        assert!(!is_stale(now - 90, HEARTBEAT, now));
        assert!(is_stale(now - 91, HEARTBEAT, now));
        assert!(is_stale(0, HEARTBEAT, now));
    }

    #[test]
    fn the_rule_follows_the_heartbeat() {
        let now = 1_000_000;
        assert!(!is_stale(now - 600, Duration::from_secs(300), now));
        assert!(is_stale(now - 901, Duration::from_secs(300), now));
    }

    #[test]
    fn a_contact_from_the_future_is_not_stale() {
        assert!(!is_stale(2_000, HEARTBEAT, 1_000));
    }

    #[test]
    fn labels_for_agents_that_said_nothing() {
        let a = Agent::default();
        assert_eq!(a.update_label(), NONE);
        assert_eq!(a.config_label(), NONE);
        assert_eq!(a.health_label(), "unknown");
        assert_eq!(a.protocol_label(), "native");
        assert!(!a.failed());
    }

    #[test]
    fn failures_are_update_or_config_failures() {
        let timed_out = Agent {
            update_status: Some("TIMED_OUT".into()),
            ..Agent::default()
        };
        let config = Agent {
            config_status: Some("FAILED".into()),
            ..Agent::default()
        };
        let installed = Agent {
            update_status: Some("INSTALLED".into()),
            ..Agent::default()
        };
        assert!(timed_out.failed());
        assert!(config.failed());
        assert!(!installed.failed());
    }

    #[test]
    fn health_is_a_word_and_the_rest_is_detail() {
        assert_eq!(
            health_of(true, "running", 0, None),
            ("healthy".to_owned(), "workload running".to_owned())
        );
        assert_eq!(
            health_of(false, "backoff", 3, Some("exited with 1")),
            (
                "unhealthy".to_owned(),
                "workload backoff, 3 restarts: exited with 1".to_owned()
            )
        );
    }

    #[test]
    fn ago_reads_like_a_person_would_say_it() {
        assert_eq!(ago(100, 142), "42 s ago");
        assert_eq!(ago(0, 300), "5 min ago");
        assert_eq!(ago(0, 3 * 3600 + 5), "3 h ago");
        assert_eq!(ago(0, 2 * 86_400), "2 d ago");
        assert_eq!(ago(103, 100), "just now");
        assert_eq!(ago(100 + 3 * 3600, 100), "in 3 h");
    }

    #[test]
    fn utc_is_an_http_date_and_nothing_for_nonsense() {
        assert_eq!(utc(0.0), "Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(utc(-1.0), "");
        assert_eq!(utc(f64::NAN), "");
    }
}
