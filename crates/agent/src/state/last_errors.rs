//! `data/last-errors.json`: the last error of each kind the running agent met (reaching
//! a server, updating, applying a configuration set) with its time, and for an update
//! the report the server was told of it (a failure, a deferral, a wait), so that `agent
//! status` and `agent-wrapper.sh start` can say why, and what the server knows, without
//! anyone reading the log. One record: an update's failure is written once.
//! Written only by the running agent; a write that fails is logged and changes nothing
//! else (the log has the error too).

use std::collections::BTreeMap;
use std::path::PathBuf;

use agent_extract::atomic;
use agent_protocol::layout::AgentHome;
use agent_protocol::wire::{Report, UpdateStatus};
use serde::{Deserialize, Serialize};

/// What the agent was doing when it failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Registering or connecting with a server.
    Contact,
    /// Fetching, verifying or handing over an update.
    Update,
    /// Applying a configuration set.
    Configuration,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Contact, Kind::Update, Kind::Configuration];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Contact => "contact",
            Kind::Update => "update",
            Kind::Configuration => "configuration",
        }
    }
}

/// One error and when it happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastError {
    /// Unix seconds.
    pub at: u64,
    pub error: String,
    /// An update's: the report the server was told of it, until the server accepts
    /// the agent as it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub told: Option<Report>,
}

/// The longest message kept: a line for `agent status`, the log has the rest.
const MAX_MESSAGE: usize = 2000;

pub fn file(home: &AgentHome) -> PathBuf {
    home.last_errors()
}

/// The last error of each kind, as recorded; empty when none was (or the file is
/// unreadable: it only ever explains, it decides nothing).
pub fn read(home: &AgentHome) -> BTreeMap<Kind, LastError> {
    atomic::read_text(&file(home), 64 * 1024)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default()
}

/// Records `error` as the last of its kind, now.
pub fn record(home: &AgentHome, kind: Kind, error: &str) {
    let mut all = read(home);
    let error: String = error.chars().take(MAX_MESSAGE).collect();
    let now = agent_updater::state::now_secs();
    all.insert(
        kind,
        LastError {
            at: now,
            error,
            told: None,
        },
    );
    write(home, &all);
}

/// Records that the server was told `report` (the update's last error, with what the
/// server now knows of it).
pub fn told(home: &AgentHome, report: &Report) {
    let mut all = read(home);
    let error = report.error.as_deref().unwrap_or_default();
    all.insert(
        Kind::Update,
        LastError {
            at: agent_updater::state::now_secs(),
            error: error.chars().take(MAX_MESSAGE).collect(),
            told: Some(report.clone()),
        },
    );
    write(home, &all);
}

/// The report the server was last told of an update, and when.
pub fn last_told(home: &AgentHome) -> Option<(u64, Report)> {
    let update = read(home).remove(&Kind::Update)?;
    update.told.map(|report| (update.at, report))
}

/// Forgets what the server was told once it accepts the agent as it runs (the error
/// itself stays the last of its kind).
pub fn forget_told(home: &AgentHome) {
    let mut all = read(home);
    if let Some(update) = all.get_mut(&Kind::Update)
        && update.told.take().is_some()
    {
        write(home, &all);
    }
}

fn write(home: &AgentHome, all: &BTreeMap<Kind, LastError>) {
    let json = serde_json::to_vec_pretty(all).unwrap_or_default();
    let written = std::fs::create_dir_all(home.data())
        .map_err(|e| e.to_string())
        .and_then(|()| atomic::write(&file(home), &json).map_err(|e| e.to_string()));
    if let Err(e) = written {
        tracing::warn!("cannot write {}: {e}", file(home).display());
    }
}

/// The label of `agent status`'s line on what was told: a deferral or a wait is not a
/// failure.
pub fn told_label(report: &Report) -> &'static str {
    match report.status {
        UpdateStatus::InstallFailed => "failed:",
        UpdateStatus::Retrying => "retrying:",
        UpdateStatus::Deferred => "deferred:",
        UpdateStatus::WaitingWindow => "waiting:",
        UpdateStatus::Installing | UpdateStatus::Installed => "told:",
    }
}

/// `agent status`'s line on what was told, how long ago.
pub fn describe_told(at: u64, report: &Report, now: u64) -> String {
    let blame = match report.status {
        UpdateStatus::InstallFailed => "the bundle is at fault; it counts against the rollout",
        UpdateStatus::Deferred => "held off on this machine; no failure",
        _ => "the machine is at fault; tried again on a backoff",
    };
    format!(
        "{} -> {} {} ({}s ago; {blame}): {}",
        report.from,
        report.to,
        report.status.as_str(),
        now.saturating_sub(at),
        report.error.as_deref().unwrap_or("")
    )
}

/// `agent status`'s line for `kind`: `none`, or how long ago, when, and the message on
/// one line (a check's output may span several).
pub fn describe(last: Option<&LastError>, now: u64) -> String {
    match last {
        None => "none".to_owned(),
        Some(e) => format!(
            "{}s ago ({}): {}",
            now.saturating_sub(e.at),
            httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_secs(e.at)),
            e.error
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>()
                .join(" ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_was_told_is_the_updates_last_error_until_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let home = AgentHome::new(dir.path());
        assert!(last_told(&home).is_none());
        let report = Report {
            id: "a".into(),
            from: "1.0.0+1".into(),
            to: "2.0.0+2".into(),
            status: UpdateStatus::InstallFailed,
            error: Some("the release is missing its .minisig".into()),
        };
        told(&home, &report);
        let (at, kept) = last_told(&home).unwrap();
        assert_eq!(kept, report);
        assert_eq!(
            read(&home)[&Kind::Update].error,
            "the release is missing its .minisig"
        );
        let line = describe_told(at, &kept, at + 5);
        assert!(
            line.starts_with("1.0.0+1 -> 2.0.0+2 INSTALL_FAILED (5s ago; the bundle is at fault"),
            "{line}"
        );
        assert!(line.ends_with("missing its .minisig"), "{line}");
        assert_eq!(told_label(&kept), "failed:");
        forget_told(&home);
        assert!(last_told(&home).is_none());
        // The error stays the last of its kind.
        assert!(read(&home).contains_key(&Kind::Update));
    }

    #[test]
    fn each_kind_keeps_its_last_error_and_status_says_when() {
        let dir = tempfile::tempdir().unwrap();
        let home = AgentHome::new(dir.path());
        assert!(read(&home).is_empty());
        record(&home, Kind::Contact, "first");
        record(&home, Kind::Contact, "cannot reach http://127.0.0.1:1");
        record(
            &home,
            Kind::Configuration,
            "check-command failed:\n  forbidden\n",
        );
        let all = read(&home);
        assert_eq!(all.len(), 2);
        assert_eq!(all[&Kind::Contact].error, "cannot reach http://127.0.0.1:1");
        let line = describe(all.get(&Kind::Contact), all[&Kind::Contact].at + 3);
        assert!(
            line.starts_with("3s ago (") && line.ends_with("127.0.0.1:1"),
            "{line}"
        );
        assert_eq!(describe(all.get(&Kind::Update), 0), "none");
        let config = describe(all.get(&Kind::Configuration), 0);
        assert!(
            config.ends_with("check-command failed: forbidden"),
            "{config}"
        );
    }
}
