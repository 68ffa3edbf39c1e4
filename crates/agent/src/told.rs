//! The last update failure (or deferral) the agent told the server, kept in
//! `data/update-failure.json` so that `agent status` says what the server was told,
//! and when.

use agent_protocol::layout::AgentHome;
use agent_protocol::wire::Report;
use serde::{Deserialize, Serialize};

const FILE: &str = "update-failure.json";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Told {
    /// Unix seconds.
    pub at: u64,
    pub report: Report,
}

/// Remembers `report`; a failure to write is logged, never fatal.
pub fn remember(home: &AgentHome, report: &Report) {
    let told = Told {
        at: agent_updater::state::now_secs(),
        report: report.clone(),
    };
    let path = home.data().join(FILE);
    let written = serde_json::to_vec(&told)
        .map_err(|e| e.to_string())
        .and_then(|bytes| {
            agent_extract::atomic::write_with_mode(&path, &bytes, Some(0o600))
                .map_err(|e| e.to_string())
        });
    if let Err(e) = written {
        tracing::warn!("cannot keep {}: {e}", path.display());
    }
}

/// Forgets the failure once the server accepts the agent as it runs.
pub fn forget(home: &AgentHome) {
    let path = home.data().join(FILE);
    if path.exists() {
        let _ = std::fs::remove_file(path);
    }
}

pub fn last(home: &AgentHome) -> Option<Told> {
    let text = agent_extract::atomic::read_text(&home.data().join(FILE), 64 * 1024).ok()?;
    serde_json::from_str(&text).ok()
}

/// The label of `agent status`'s line: a deferral or a wait is not a failure.
pub fn label(told: &Told) -> &'static str {
    use agent_protocol::wire::UpdateStatus;
    match told.report.status {
        UpdateStatus::InstallFailed => "failed:",
        UpdateStatus::Retrying => "retrying:",
        UpdateStatus::Deferred => "deferred:",
        UpdateStatus::WaitingWindow => "waiting:",
        UpdateStatus::Installing | UpdateStatus::Installed => "told:",
    }
}

/// `agent status`'s line: what was told, how long ago.
pub fn describe(told: &Told, now: u64) -> String {
    let r = &told.report;
    use agent_protocol::wire::UpdateStatus;
    let blame = match r.status {
        UpdateStatus::InstallFailed => "the bundle is at fault; it counts against the rollout",
        UpdateStatus::Deferred => "held off on this machine; no failure",
        _ => "the machine is at fault; tried again on a backoff",
    };
    format!(
        "{} -> {} {} ({}s ago; {blame}): {}",
        r.from,
        r.to,
        r.status.as_str(),
        now.saturating_sub(told.at),
        r.error.as_deref().unwrap_or("")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_protocol::wire::UpdateStatus;

    #[test]
    fn kept_read_back_described_and_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let home = AgentHome::new(dir.path());
        std::fs::create_dir_all(home.data()).unwrap();
        assert!(last(&home).is_none());
        let report = Report {
            id: "a".into(),
            from: "1.0.0+1".into(),
            to: "2.0.0+2".into(),
            status: UpdateStatus::InstallFailed,
            error: Some("the release is missing its .minisig".into()),
        };
        remember(&home, &report);
        let told = last(&home).unwrap();
        assert_eq!(told.report, report);
        let line = describe(&told, told.at + 5);
        assert!(
            line.starts_with("1.0.0+1 -> 2.0.0+2 INSTALL_FAILED (5s ago; the bundle is at fault"),
            "{line}"
        );
        assert!(line.ends_with("missing its .minisig"), "{line}");
        forget(&home);
        assert!(last(&home).is_none());
    }
}
