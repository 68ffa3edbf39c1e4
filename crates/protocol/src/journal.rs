//! The update journal and the agent's health file: the contract between the agent, the
//! updater and the wrapper. Stored as JSON; the I/O (atomic replace) lives elsewhere.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::version::AgentVersion;
use crate::wire::AgentHealth;

/// Where an update transaction stands. Each phase is written before the step it names
/// is taken, so recovery knows which steps may be half done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// The agent verified the bundle and is about to start the updater.
    Prepared,
    /// The new version is unpacked and complete beside the old one; the updater is
    /// stopping the old agent (which, seeing this phase, exits by itself).
    Stopping,
    /// The old agent is stopped; `current` still points at it.
    Unpacked,
    /// `current` points at the new version, which is being started and watched.
    Switched,
    /// The new version was healthy; the transaction is done.
    Committed,
    /// The new version failed; `current` is being pointed back at the old one.
    RollingBack,
    /// The old version is back; the transaction is done.
    RolledBack,
}

impl Phase {
    pub fn is_final(self) -> bool {
        matches!(self, Phase::Committed | Phase::RolledBack)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Journal {
    pub from: AgentVersion,
    pub to: AgentVersion,
    /// sha256 of the bundle, the name remembered in `bad-versions` if it fails.
    pub bundle_sha256: String,
    /// The verified bundle file the updater runs from.
    pub bundle_path: String,
    pub phase: Phase,
    /// Unix seconds at which the agent prepared the update.
    pub started_at: u64,
    /// How many times the new version was started before it committed.
    #[serde(default)]
    pub boot_count: u32,
    /// Why a rollback happened, in words for an operator.
    #[serde(default)]
    pub reason: Option<String>,
    /// Name of the old version's directory under `versions/` (what rollback returns to).
    /// It differs from `from` when the version was stamped for a skew test.
    #[serde(default)]
    pub from_dir: Option<String>,
    /// A signing-key rotation the bundle carried: applied when the update commits,
    /// never before, so a rollback leaves the trust as it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust: Option<TrustChange>,
    /// Unix seconds at which the transaction reached its final phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<u64>,
    /// Rolled back before `current` was switched: the old version never stopped being the
    /// installed one, and the bundle is not held against (it is tried again).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub abandoned: bool,
    /// The judgement of the new version was cut short by a stop that was asked for (who
    /// asked, and when): not a failure of the version. The next start judges it again,
    /// and that start is not counted in `boot_count`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planned_stop: Option<String>,
}

/// The trust an update hands over to a new signing key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrustChange {
    /// The trusted key file to replace (the agent's `update.public-key`).
    pub key_path: String,
    /// The new key's public key file, exactly as the rotation statement carried it.
    pub new_key: String,
    /// Key ids the rotation passed through, remembered as retired.
    pub retire: Vec<String>,
}

impl Journal {
    pub fn parse(text: &str) -> Result<Self> {
        serde_json::from_str(text).map_err(|e| Error::Journal(e.to_string()))
    }

    pub fn to_json(&self) -> String {
        // A struct of strings and numbers always serialises.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

/// `run/stop-requested` (`layout::STOP_REQUEST_FILE`): a stop of the agent that was asked
/// for, one line `<unix seconds> <who asked>`. Written before the stop, removed by every
/// start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopRequest {
    /// Unix seconds at which the stop was asked for.
    pub at: u64,
    /// Who asked, in words: `agent-wrapper.sh stop`, `the service manager`.
    pub by: String,
}

impl StopRequest {
    pub fn parse(text: &str) -> Option<Self> {
        let line = text.lines().next()?.trim();
        let (at, by) = line.split_once(' ').unwrap_or((line, ""));
        let by = by.trim();
        Some(Self {
            at: at.parse().ok()?,
            by: if by.is_empty() {
                "an unnamed stop".to_owned()
            } else {
                by.to_owned()
            },
        })
    }

    pub fn to_line(&self) -> String {
        format!("{} {}\n", self.at, self.by)
    }

    /// Asked for at or after `since` (unix seconds): an older request is stale, left by a
    /// stop whose start did not remove it, and explains nothing after `since`.
    pub fn since(&self, since: u64) -> bool {
        self.at >= since
    }
}

/// `run/health.json`, written by a running agent after each contact with a server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    pub version: AgentVersion,
    pub pid: u32,
    pub components_started: bool,
    /// Unix seconds of the last successful register or connect.
    pub last_contact: Option<u64>,
    /// Set when a server refused this version: the version it expects instead.
    #[serde(default)]
    pub refused_by_server: Option<String>,
    /// The workload as the agent supervises it; absent from agents before workloads
    /// (which the updater judges as having none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<WorkloadReport>,
    /// The release the server holds for this agent's maintenance window, as the server
    /// said it at the last contact (`agent status` and `agent update --check` show it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_window: Option<WaitingWindow>,
    /// The deployment the server said this agent follows at the last contact (`agent
    /// status` shows it); absent before deployments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment: Option<String>,
}

/// A release held for a maintenance window that is not open yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitingWindow {
    pub expected: String,
    /// Unix seconds.
    pub opens_at: i64,
}

/// A window's opening (unix seconds) as an HTTP date (UTC), as the agent's log and
/// `agent status` show it.
pub fn opening(secs: i64) -> String {
    u64::try_from(secs)
        .ok()
        .map(|s| httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_secs(s)))
        .unwrap_or_else(|| secs.to_string())
}

impl WaitingWindow {
    /// "2.0.0+2 waits for the maintenance window: it opens Sun, 29 Nov 2026 02:00:00
    /// GMT (in 3h 5m)", at `now` (unix seconds).
    pub fn describe(&self, now: u64) -> String {
        let when = opening(self.opens_at);
        let left = u64::try_from(self.opens_at)
            .unwrap_or(0)
            .saturating_sub(now);
        let relative = if left == 0 {
            "now".to_owned()
        } else {
            format!("in {}h {}m", left / 3600, left % 3600 / 60)
        };
        format!(
            "{} waits for this machine's maintenance window: it opens {when} ({relative})",
            self.expected
        )
    }
}

/// The workload in `run/health.json`: what `connect` reports, and what `agent status`
/// and the updater need besides.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkloadReport {
    #[serde(flatten)]
    pub health: AgentHealth,
    /// The workload's process (the leader of its process group), while it runs.
    #[serde(default)]
    pub pid: Option<u32>,
    /// Unix seconds at which the running workload started.
    #[serde(default)]
    pub since: Option<u64>,
    /// How its last run ended ("exited with code 1", "killed by signal 9").
    #[serde(default)]
    pub last_exit: Option<String>,
    /// `workload.start-timeout`, in milliseconds.
    #[serde(default)]
    pub start_timeout_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_round_trips() {
        let j = Journal {
            from: "1.0.0+1".parse().unwrap(),
            to: "2.0.0+2".parse().unwrap(),
            bundle_sha256: "ab".repeat(32),
            bundle_path: "/x/data/update/agent-bundle-2.0.0".into(),
            phase: Phase::Switched,
            started_at: 1,
            boot_count: 2,
            reason: None,
            from_dir: None,
            trust: Some(TrustChange {
                key_path: "/x/conf/update.pub".into(),
                new_key: "untrusted comment: k\nRWQ\n".into(),
                retire: vec!["0807060504030201".into()],
            }),
            ended_at: Some(2),
            abandoned: true,
            planned_stop: Some("agent-wrapper.sh stop".into()),
        };
        assert_eq!(Journal::parse(&j.to_json()).unwrap(), j);
        assert!(Journal::parse("{").is_err());
        assert!(Phase::Committed.is_final() && !Phase::Switched.is_final());
        // A journal from before planned stops reads as none.
        let old = j.to_json().replace("\"planned_stop\"", "\"unknown_field\"");
        assert_eq!(Journal::parse(&old).unwrap().planned_stop, None);
    }

    #[test]
    fn stop_requests_round_trip_and_stale_ones_are_told_apart() {
        let r = StopRequest::parse("1700000000 agent-wrapper.sh stop\n").unwrap();
        assert_eq!(r.at, 1_700_000_000);
        assert_eq!(r.by, "agent-wrapper.sh stop");
        assert_eq!(StopRequest::parse(&r.to_line()), Some(r.clone()));
        assert_eq!(StopRequest::parse("17").unwrap().by, "an unnamed stop");
        assert_eq!(StopRequest::parse(""), None);
        assert_eq!(StopRequest::parse("soon stop"), None);
        assert!(r.since(1_700_000_000) && !r.since(1_700_000_001));
    }
}
