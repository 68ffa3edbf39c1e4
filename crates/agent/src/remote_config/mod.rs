//! Remote configuration, the agent's side: a set of files the server offers for the
//! workload is checked, written beside `config-dir`, validated by `check-command`,
//! swapped in with one rename (the previous set kept as `<config-dir>.prev`), taken up
//! by the workload (restart or signal), and kept only if the workload comes up healthy;
//! otherwise the previous set is put back. The outcome is reported, and kept in
//! `data/` until a server hears it.
//!
//! Writes only under `config-dir`'s parent, in directories named after `config-dir`;
//! never `conf/agent.toml`, keys, the CA or anything the agent trusts. [`decide`] holds
//! the decisions (pure); this module acts.

pub mod decide;
pub mod live;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use agent_extract::{atomic, os};
use agent_protocol::config_set;
use agent_protocol::layout::AgentHome;
use agent_protocol::wire::{ConfigOutcome, ConfigPayload, ConfigStatus};

/// `data/config-hash`: the set the agent runs.
pub fn running_hash_file(home: &AgentHome) -> PathBuf {
    home.data().join("config-hash")
}

/// `data/config-failed`: the set that failed here, not tried again until another is
/// offered.
pub fn failed_hash_file(home: &AgentHome) -> PathBuf {
    home.data().join("config-failed")
}

/// `data/config-applying`: the set being swapped in, until its outcome is known; an
/// agent that dies before then finds it at its next start and puts the set before back.
pub fn applying_file(home: &AgentHome) -> PathBuf {
    home.data().join("config-applying")
}

/// `data/config-status.json`: the outcome no server has heard yet.
pub fn pending_status_file(home: &AgentHome) -> PathBuf {
    home.data().join("config-status.json")
}

fn read_hash(path: &Path) -> Option<String> {
    atomic::read_text(path, 256)
        .ok()
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty())
}

fn write_small(path: &Path, text: &[u8]) -> Result<(), String> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    atomic::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// The hash of the set the agent runs; empty if none.
pub fn running_hash(home: &AgentHome) -> String {
    read_hash(&running_hash_file(home)).unwrap_or_default()
}

pub fn failed_hash(home: &AgentHome) -> Option<String> {
    read_hash(&failed_hash_file(home))
}

/// The outcome waiting to be sent, if any.
pub fn pending_status(home: &AgentHome) -> Option<ConfigStatus> {
    let text = atomic::read_text(&pending_status_file(home), 256 * 1024).ok()?;
    serde_json::from_str(&text).ok()
}

/// Keeps an outcome until a server hears it (a newer outcome replaces an older one:
/// the server only cares about the set the agent runs now).
pub fn keep_status(home: &AgentHome, status: &ConfigStatus) {
    let json = serde_json::to_vec(status).unwrap_or_default();
    if let Err(e) = write_small(&pending_status_file(home), &json) {
        tracing::error!("cannot keep the configuration status for the server: {e}");
    }
}

/// The server heard `status`.
pub fn status_sent(home: &AgentHome, status: &ConfigStatus) {
    if pending_status(home).as_ref() == Some(status) {
        let _ = std::fs::remove_file(pending_status_file(home));
    }
}

/// Where the sets live: `config-dir`, and beside it the previous set and new ones.
#[derive(Debug, Clone)]
pub struct Dirs {
    pub config_dir: PathBuf,
    parent: PathBuf,
    name: String,
}

impl Dirs {
    /// `config-dir` (relative to AGENT_HOME), refused when it holds or is anything the
    /// agent itself needs.
    pub fn new(home: &AgentHome, config_dir: &str) -> Result<Self, String> {
        let written = config_dir.trim();
        let rel = Path::new(written);
        let plain = !written.is_empty()
            && rel.is_relative()
            && rel
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)));
        if !plain {
            return Err(format!(
                "workload.config-dir {written:?} is not a relative path inside AGENT_HOME; set it to e.g. conf/workload"
            ));
        }
        let dir = home.root().join(rel);
        let protected = [
            home.agent_toml(),
            home.data(),
            home.run(),
            home.logs(),
            home.versions(),
            home.current(),
            home.identity(),
            home.agent_token(),
        ];
        if let Some(p) = protected.iter().find(|p| p.starts_with(&dir)) {
            return Err(format!(
                "workload.config-dir {written:?} holds {}, which remote configuration must never replace; give the workload a directory of its own, e.g. conf/workload",
                p.display()
            ));
        }
        let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
            return Err(format!("workload.config-dir {written:?} has no parent"));
        };
        Ok(Self {
            parent: parent.to_path_buf(),
            name: name.to_string_lossy().into_owned(),
            config_dir: dir.clone(),
        })
    }

    /// `<config-dir>.prev`: the set before the one in `config-dir`.
    pub fn prev(&self) -> PathBuf {
        self.parent.join(format!("{}.prev", self.name))
    }

    fn new_prefix(&self) -> String {
        format!(".{}.new-", self.name)
    }

    fn staging(&self, hash: &str) -> PathBuf {
        let short: String = hash.chars().take(12).collect();
        self.parent.join(format!("{}{short}", self.new_prefix()))
    }

    /// After a crash: a half-made new set is removed, a `config-dir` that is missing
    /// while the previous set exists gets it back, and a set swapped in whose outcome was
    /// never known is swapped out again (the server offers it again).
    pub fn recover(&self, home: &AgentHome) {
        // A marker left beside a recorded verdict: the set was applied, nothing to undo.
        let applying = read_hash(&applying_file(home)).filter(|h| *h != running_hash(home));
        let swapped_in = |hash: &str| {
            read_set(&self.config_dir).is_some_and(|files| config_set::hash(&files) == hash)
        };
        let prev = self.prev();
        crate::os::finish_exchange(&self.config_dir, &prev);
        // Died between the exchange and keeping the set before: the staging directory,
        // named after the new set, holds the set before, complete (it was `config-dir`).
        if let Some(hash) = applying.as_deref()
            && swapped_in(hash)
            && std::fs::symlink_metadata(&prev).is_err()
            && self.staging(hash).is_dir()
        {
            match std::fs::rename(self.staging(hash), &prev) {
                Ok(()) => tracing::warn!(
                    "kept the set before {hash} as {}, where the agent left it",
                    prev.display()
                ),
                Err(e) => tracing::error!(
                    "cannot keep the set before {hash} as {}: {e}",
                    prev.display()
                ),
            }
        }
        if let Ok(entries) = std::fs::read_dir(&self.parent) {
            for entry in entries.flatten() {
                if entry
                    .file_name()
                    .to_string_lossy()
                    .starts_with(&self.new_prefix())
                {
                    tracing::warn!(
                        "removing {}, a configuration set left half-applied",
                        entry.path().display()
                    );
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
        if std::fs::symlink_metadata(&self.config_dir).is_err() && prev.is_dir() {
            match std::fs::rename(&prev, &self.config_dir) {
                Ok(()) => tracing::warn!(
                    "{} was missing; put the previous set back from {}",
                    self.config_dir.display(),
                    prev.display()
                ),
                Err(e) => tracing::error!(
                    "{} is missing and {} cannot be put back: {e}",
                    self.config_dir.display(),
                    prev.display()
                ),
            }
        }
        if let Some(applying) = applying {
            if swapped_in(&applying) && prev.is_dir() {
                match swap_back(self, true) {
                    Ok(()) => tracing::warn!(
                        "configuration set {applying} was being applied when the agent stopped; put the set before it back"
                    ),
                    Err(e) => tracing::error!("{e}"),
                }
            }
        }
        let _ = std::fs::remove_file(applying_file(home));
    }
}

/// The workload as the apply sees it: made to read the set now in `config-dir`.
#[allow(async_fn_in_trait)]
pub trait Workload {
    /// The `{home}`/`{version_dir}` fill of `check-command`, with `{config_dir}` = `dir`.
    fn check_argv(&self, dir: &Path) -> Vec<String>;
    /// Makes the workload take up the set in `config-dir` (restart or signal).
    async fn reload(&mut self) -> Result<(), String>;
    /// Waits up to `start-timeout` for the workload to be healthy on it; else its words.
    async fn wait_healthy(&mut self) -> Result<(), String>;
    /// Restarts the workload on whatever `config-dir` holds now.
    async fn restart(&mut self);
}

/// The regular files of `dir` as a set (`None` if it cannot be read as one).
fn read_set(dir: &Path) -> Option<BTreeMap<String, String>> {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(dir).ok()? {
        let entry = entry.ok()?;
        if !entry.file_type().ok()?.is_file() {
            continue;
        }
        let name = entry.file_name().into_string().ok()?;
        let text = atomic::read_text(&entry.path(), config_set::MAX_BYTES as u64 + 1).ok()?;
        files.insert(name, text);
    }
    Some(files)
}

/// Applies an offered set; the outcome, as reported to the server.
pub async fn apply(
    home: &AgentHome,
    dirs: Result<&Dirs, &str>,
    id: &str,
    set: &ConfigPayload,
    workload: &mut impl Workload,
) -> ConfigStatus {
    let status = |outcome, error: Option<String>| ConfigStatus {
        id: id.to_owned(),
        hash: set.hash.clone(),
        status: outcome,
        error,
    };
    let applying = applying_file(home);
    let outcome = apply_inner(dirs, set, workload, &applying).await;
    // The verdict is recorded before the marker goes: an agent that dies between the
    // two must not find a set it runs unrecorded (it would apply it again, over its own
    // `prev`) nor a recorded one marked unfinished (it would swap it out).
    match outcome {
        Ok(()) => {
            if let Err(e) = write_small(&running_hash_file(home), set.hash.as_bytes()) {
                tracing::error!("cannot record the configuration set in use: {e}");
            }
            let _ = std::fs::remove_file(&applying);
            let _ = std::fs::remove_file(failed_hash_file(home));
            tracing::info!(
                "applied configuration set {} ({} file(s))",
                set.hash,
                set.files.len()
            );
            status(ConfigOutcome::Applied, None)
        }
        Err(why) => {
            if let Err(e) = write_small(&failed_hash_file(home), set.hash.as_bytes()) {
                tracing::error!("cannot remember the failed configuration set: {e}");
            }
            let _ = std::fs::remove_file(&applying);
            tracing::error!(
                "configuration set {} not applied: {why}; the workload stays on the set it had",
                set.hash
            );
            status(ConfigOutcome::Failed, Some(why))
        }
    }
}

async fn apply_inner(
    dirs: Result<&Dirs, &str>,
    set: &ConfigPayload,
    workload: &mut impl Workload,
    applying: &Path,
) -> Result<(), String> {
    let dirs = dirs.map_err(str::to_owned)?;
    verify(&set.files, &set.hash)?;
    let staging = dirs.staging(&set.hash);
    if let Err(e) = write_set(&staging, &set.files) {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(e);
    }
    let argv = workload.check_argv(&staging);
    if !argv.is_empty()
        && let Err(e) = run_check(&argv, &staging).await
    {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(e);
    }
    write_small(applying, set.hash.as_bytes())?;
    let had_set = swap_in(dirs, &staging)?;
    let taken = match workload.reload().await {
        Ok(()) => workload.wait_healthy().await,
        Err(e) => Err(e),
    };
    let Err(why) = taken else {
        return Ok(());
    };
    if let Err(e) = swap_back(dirs, had_set) {
        tracing::error!("{e}");
    }
    workload.restart().await;
    Err(why)
}

/// The names are plain and the files hash to the offered hash.
pub fn verify(files: &BTreeMap<String, String>, hash: &str) -> Result<(), String> {
    config_set::check_set(files).map_err(|e| format!("the set is refused: {e}"))?;
    let actual = config_set::hash(files);
    if actual != hash {
        return Err(format!(
            "the files hash to {actual}, not to the offered {hash}: the set was damaged on the way"
        ));
    }
    Ok(())
}

/// Writes the set into `dir`, which must not exist yet, and makes it durable.
fn write_set(dir: &Path, files: &BTreeMap<String, String>) -> Result<(), String> {
    let err = |p: &Path, e: std::io::Error| format!("cannot write {}: {e}", p.display());
    if std::fs::symlink_metadata(dir).is_ok() {
        std::fs::remove_dir_all(dir).map_err(|e| err(dir, e))?;
    }
    os::create_dir_with_mode(dir, 0o755).map_err(|e| err(dir, e))?;
    for (name, text) in files {
        config_set::check_name(name).map_err(|e| format!("the set is refused: {e}"))?;
        let path = dir.join(name);
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create_new(true);
        os::with_mode(&mut opts, 0o644);
        let mut file = os::no_follow(&mut opts)
            .open(&path)
            .map_err(|e| err(&path, e))?;
        file.write_all(text.as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(|e| err(&path, e))?;
    }
    atomic::fsync_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if let Some(parent) = dir.parent() {
        atomic::fsync_dir(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    Ok(())
}

/// How long `check-command` may take.
const CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

async fn run_check(argv: &[String], dir: &Path) -> Result<(), String> {
    let output = tokio::process::Command::new(&argv[0])
        .args(&argv[1..])
        .current_dir(dir)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = match tokio::time::timeout(CHECK_TIMEOUT, output).await {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => {
            return Err(format!(
                "workload.check-command {:?} cannot run: {e}; fix it in conf/agent.toml",
                argv[0]
            ));
        }
        Err(_) => {
            return Err(format!(
                "workload.check-command took longer than {CHECK_TIMEOUT:?}"
            ));
        }
    };
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(10)..].join("\n");
    decide::check_outcome(output.status.code(), &tail)
}

/// Puts `staging` in as `config-dir` (never missing on the way) and the set it held as
/// the previous one. Whether there was a set before.
fn swap_in(dirs: &Dirs, staging: &Path) -> Result<bool, String> {
    let had_set = std::fs::symlink_metadata(&dirs.config_dir).is_ok();
    if had_set {
        // The set before the previous one goes first, renamed to a name that recovery
        // removes: `prev` is never half deleted, and never older than the set before
        // when the agent dies after the exchange (recovery keeps `staging` as `prev`).
        let prev = dirs.prev();
        if std::fs::symlink_metadata(&prev).is_ok() {
            let old = dirs.parent.join(format!("{}old", dirs.new_prefix()));
            if std::fs::symlink_metadata(&old).is_ok() {
                let _ = std::fs::remove_dir_all(&old);
            }
            std::fs::rename(&prev, &old)
                .map_err(|e| format!("cannot move {} aside: {e}", prev.display()))?;
            if let Err(e) = std::fs::remove_dir_all(&old) {
                tracing::warn!("cannot remove {}: {e}", old.display());
            }
        }
        if let Err(e) = crate::os::exchange(staging, &dirs.config_dir) {
            let _ = std::fs::remove_dir_all(staging);
            return Err(e);
        }
        // `staging` now holds the set of before.
        std::fs::rename(staging, &prev)
            .map_err(|e| format!("cannot keep the previous set as {}: {e}", prev.display()))?;
    } else {
        std::fs::rename(staging, &dirs.config_dir).map_err(|e| {
            let _ = std::fs::remove_dir_all(staging);
            format!("cannot put {} in place: {e}", dirs.config_dir.display())
        })?;
    }
    atomic::fsync_dir(&dirs.parent).map_err(|e| format!("{}: {e}", dirs.parent.display()))?;
    Ok(had_set)
}

/// The previous set back in `config-dir`; the refused one removed.
fn swap_back(dirs: &Dirs, had_set: bool) -> Result<(), String> {
    let prev = dirs.prev();
    let refused = dirs.parent.join(format!("{}refused", dirs.new_prefix()));
    if had_set {
        crate::os::exchange(&prev, &dirs.config_dir)?;
        std::fs::rename(&prev, &refused)
            .map_err(|e| format!("cannot move the refused set aside: {e}"))?;
    } else {
        std::fs::rename(&dirs.config_dir, &refused)
            .map_err(|e| format!("cannot move the refused set aside: {e}"))?;
    }
    let _ = std::fs::remove_dir_all(&refused);
    atomic::fsync_dir(&dirs.parent).map_err(|e| format!("{}: {e}", dirs.parent.display()))
}

#[cfg(test)]
mod tests;
