//! The update's state files under `data/`, shared by the agent (which writes the first
//! journal entry and delivers the outbox) and the updater (which drives the rest).
//!
//! - `data/update-journal.json`: the transaction, rewritten atomically at every phase.
//! - `data/bad-versions`: sha256 of bundles that failed to come up; never retried.
//! - `data/outbox/*.json`: reports waiting to be delivered to the server.
//! - `data/retired-keys`: signing keys a rotation retired; bundles they sign are refused.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use agent_extract::atomic;
use agent_protocol::journal::{Journal, TrustChange};
use agent_protocol::layout::AgentHome;
use agent_protocol::minisign::KeyId;
use agent_protocol::rotation::{self, Chain};
use agent_protocol::wire::Report;

use crate::error::{Result, UpdateError};

const MAX_STATE_FILE: u64 = 1024 * 1024;

pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The journal, if an update was ever recorded. A journal that does not parse is an
/// error, never "no update": guessing could leave the wrong version current.
pub fn read_journal(home: &AgentHome) -> Result<Option<Journal>> {
    let path = home.journal();
    match atomic::read_text(&path, MAX_STATE_FILE) {
        Ok(text) => Journal::parse(&text)
            .map(Some)
            .map_err(|e| UpdateError::State(format!("{}: {e}", path.display()))),
        Err(agent_extract::Error::Io { source, .. })
            if source.kind() == io::ErrorKind::NotFound =>
        {
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

/// The journal of an update still under way (not committed and not rolled back).
pub fn open_transaction(home: &AgentHome) -> Result<Option<Journal>> {
    Ok(read_journal(home)?.filter(|j| !j.phase.is_final()))
}

/// Temp file, fsync, rename, fsync the directory.
pub fn write_journal(home: &AgentHome, journal: &Journal) -> Result<()> {
    fs::create_dir_all(home.data()).map_err(|e| io_at(home.data(), e))?;
    atomic::write(&home.journal(), journal.to_json().as_bytes())?;
    Ok(())
}

/// One bad bundle per line: `<sha256> <version> <unix seconds> <reason>`.
pub fn bad_versions(home: &AgentHome) -> Result<Vec<String>> {
    match atomic::read_text(&home.bad_versions(), MAX_STATE_FILE) {
        Ok(text) => Ok(text
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|s| !s.starts_with('#'))
            .map(str::to_ascii_lowercase)
            .collect()),
        Err(agent_extract::Error::Io { source, .. })
            if source.kind() == io::ErrorKind::NotFound =>
        {
            Ok(Vec::new())
        }
        Err(e) => Err(e.into()),
    }
}

pub fn is_bad(home: &AgentHome, sha256: &str) -> Result<bool> {
    let sha256 = sha256.to_ascii_lowercase();
    Ok(bad_versions(home)?.contains(&sha256))
}

pub fn add_bad(home: &AgentHome, sha256: &str, version: &str, reason: &str) -> Result<()> {
    if is_bad(home, sha256)? {
        return Ok(());
    }
    fs::create_dir_all(home.data()).map_err(|e| io_at(home.data(), e))?;
    let path = home.bad_versions();
    let mut text = atomic::read_text(&path, MAX_STATE_FILE).unwrap_or_default();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    let reason: String = reason
        .chars()
        .map(|c| if c == '\n' { ' ' } else { c })
        .collect();
    text.push_str(&format!("{sha256} {version} {} {reason}\n", now_secs()));
    atomic::write(&path, text.as_bytes())?;
    Ok(())
}

/// Forgets every bad bundle; returns how many there were.
pub fn clear_bad(home: &AgentHome) -> Result<usize> {
    let n = bad_versions(home)?.len();
    match fs::remove_file(home.bad_versions()) {
        Ok(()) => Ok(n),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(io_at(home.bad_versions(), e)),
    }
}

/// Keys retired by earlier rotations. A missing file is none; an unreadable one is an
/// error, so a failure to read it never quietly trusts a retired key again.
pub fn retired_keys(home: &AgentHome) -> Result<Vec<KeyId>> {
    match atomic::read_text(&home.retired_keys(), MAX_STATE_FILE) {
        Ok(text) => Ok(rotation::parse_retired(&text)),
        Err(agent_extract::Error::Io { source, .. })
            if source.kind() == io::ErrorKind::NotFound =>
        {
            Ok(Vec::new())
        }
        Err(e) => Err(e.into()),
    }
}

/// Adds `keys` to `data/retired-keys` (`<key id> retired-at=<secs> for=<new key id>`);
/// keys already there are not repeated. Returns the ones added.
pub fn retire_keys(home: &AgentHome, keys: &[KeyId], new_key: KeyId) -> Result<Vec<KeyId>> {
    let known = retired_keys(home)?;
    let added: Vec<KeyId> = keys
        .iter()
        .filter(|k| !known.contains(k) && **k != new_key)
        .copied()
        .collect();
    if added.is_empty() {
        return Ok(added);
    }
    fs::create_dir_all(home.data()).map_err(|e| io_at(home.data(), e))?;
    let path = home.retired_keys();
    let mut text = atomic::read_text(&path, MAX_STATE_FILE).unwrap_or_default();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    for key in &added {
        text.push_str(&format!("{key} retired-at={} for={new_key}\n", now_secs()));
    }
    atomic::write(&path, text.as_bytes())?;
    Ok(added)
}

/// The trust change an update along `chain` makes when it commits.
pub fn trust_change(chain: &Chain, key_path: &Path) -> TrustChange {
    TrustChange {
        key_path: key_path.display().to_string(),
        new_key: String::from_utf8_lossy(&chain.end_file).into_owned(),
        retire: chain.retired().iter().map(ToString::to_string).collect(),
    }
}

/// Queues a report; the agent delivers it on its next contact with a server.
pub fn enqueue_report(home: &AgentHome, report: &Report) -> Result<PathBuf> {
    let dir = home.outbox();
    fs::create_dir_all(&dir).map_err(|e| io_at(&dir, e))?;
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let path = dir.join(format!("{nanos:020}-{}.json", report.status.as_str()));
    let json = serde_json::to_vec(report).map_err(|e| UpdateError::State(e.to_string()))?;
    atomic::write(&path, &json)?;
    Ok(path)
}

/// Whether a report waits in the outbox: one directory listing, nothing parsed (the
/// agent asks this a few times a second).
pub fn has_pending_reports(home: &AgentHome) -> bool {
    fs::read_dir(home.outbox()).is_ok_and(|entries| {
        entries
            .filter_map(|e| e.ok())
            .any(|e| e.path().extension().is_some_and(|x| x == "json"))
    })
}

/// Reports waiting in the outbox, oldest first. A file that does not parse is moved
/// aside (`.bad`), so one damaged report never blocks the rest.
pub fn pending_reports(home: &AgentHome) -> Result<Vec<(PathBuf, Report)>> {
    let dir = home.outbox();
    let entries = match fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_at(&dir, e)),
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    let mut out = Vec::new();
    for path in paths {
        let parsed = atomic::read_limited(&path, MAX_STATE_FILE)
            .ok()
            .and_then(|b| serde_json::from_slice::<Report>(&b).ok());
        match parsed {
            Some(report) => out.push((path, report)),
            None => {
                let _ = fs::rename(&path, path.with_extension("bad"));
            }
        }
    }
    Ok(out)
}

pub fn remove_report(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_at(path, e)),
    }
}

/// Bytes free for unprivileged writers on the filesystem holding `path`.
pub fn free_bytes(path: &Path) -> Option<u64> {
    agent_extract::os::free_bytes(path).ok()
}

pub(crate) fn io_at(path: impl Into<PathBuf>, source: io::Error) -> UpdateError {
    UpdateError::Extract(agent_extract::Error::Io {
        path: path.into(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_protocol::wire::UpdateStatus;

    #[test]
    fn bad_versions_add_is_idempotent_and_clear_forgets() {
        let dir = tempfile::tempdir().unwrap();
        let home = AgentHome::new(dir.path());
        let sha = "ab".repeat(32);
        assert!(!is_bad(&home, &sha).unwrap());
        add_bad(&home, &sha, "2.0.0+2", "never came up\nhealthy").unwrap();
        add_bad(&home, &sha, "2.0.0+2", "again").unwrap();
        assert!(is_bad(&home, &sha.to_uppercase()).unwrap());
        assert_eq!(bad_versions(&home).unwrap().len(), 1);
        assert_eq!(clear_bad(&home).unwrap(), 1);
        assert!(!is_bad(&home, &sha).unwrap());
    }

    #[test]
    fn outbox_keeps_order_and_sets_aside_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let home = AgentHome::new(dir.path());
        let report = |status| Report {
            id: "x".into(),
            from: "1.0.0+1".into(),
            to: "2.0.0+2".into(),
            status,
            error: None,
        };
        assert!(!has_pending_reports(&home));
        enqueue_report(&home, &report(UpdateStatus::Installing)).unwrap();
        assert!(has_pending_reports(&home));
        enqueue_report(&home, &report(UpdateStatus::Installed)).unwrap();
        fs::write(home.outbox().join("0-x.json"), "{").unwrap();
        let pending = pending_reports(&home).unwrap();
        let statuses: Vec<_> = pending.iter().map(|(_, r)| r.status).collect();
        assert_eq!(
            statuses,
            [UpdateStatus::Installing, UpdateStatus::Installed]
        );
        assert!(home.outbox().join("0-x.bad").exists());
        remove_report(&pending[0].0).unwrap();
        assert_eq!(pending_reports(&home).unwrap().len(), 1);
    }

    #[test]
    fn unreadable_journal_is_an_error_not_absence() {
        let dir = tempfile::tempdir().unwrap();
        let home = AgentHome::new(dir.path());
        assert!(read_journal(&home).unwrap().is_none());
        fs::create_dir_all(home.data()).unwrap();
        fs::write(home.journal(), "{ half").unwrap();
        assert!(read_journal(&home).is_err());
    }
}
