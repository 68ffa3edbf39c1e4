//! The update transaction, phase by phase. Every phase is recorded in the journal
//! before the next begins, and every step is safe to repeat, so a run that dies
//! anywhere is finished (or rolled back) by the next run from the journal alone.
//!
//! At no instant is there no runnable agent on disk: the new version is unpacked beside
//! the old one, `current` is flipped by renaming a symlink, and the old version is
//! removed only after a later update commits.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agent_extract::atomic;
use agent_extract::payload::{self, Payload};
use agent_extract::unpack::{self, Options};
use agent_protocol::AgentVersion;
use agent_protocol::journal::{Health, Journal, Phase};
use agent_protocol::layout::{self, AgentHome};
use agent_protocol::minisign::{KeyId, PublicKey};
use agent_protocol::wire::{Report, UpdateStatus};

use crate::error::{Result, UpdateError};
use crate::health::{self, Judge, Judgement, Observation};
use crate::log::UpdateLog;
use crate::merge;
use crate::process::{self, Stopped};
use crate::settings::Settings;
use crate::state::{self, io_at};

/// How long the wrapper's `start` may wait for the new agent to report itself; the judge
/// keeps watching after that, up to the health timeout.
const WRAPPER_START_WAIT: Duration = Duration::from_secs(5);

/// The operator's `conf/agent.toml` as it was before this update's merge; restored on
/// rollback (the old version may not know the new keys).
const CONF_BEFORE: &str = "agent.toml.before";

pub struct Transaction<'a> {
    pub home: &'a AgentHome,
    pub journal: Journal,
    pub settings: Settings,
    pub log: &'a mut UpdateLog,
    /// The old agent to wait for (`--wait-pid`).
    pub wait_pid: Option<u32>,
    /// This run picks up a journal left by a run that died.
    pub recovering: bool,
}

/// True while `data/update/` still holds the recovery link of an update.
pub fn has_leftovers(home: &AgentHome) -> bool {
    fs::symlink_metadata(home.update_dir().join("updater")).is_ok()
}

/// How a transaction ended.
pub enum Verdict {
    Committed,
    RolledBack(String),
}

/// A fault point for the crash tests (`--features failpoints`, `FAILPOINTS=<name>=return`):
/// the process dies on the spot, like `kill -9`, with no cleanup.
macro_rules! fault {
    ($name:expr) => {
        fail::fail_point!($name, |_| {
            eprintln!("fault point {} reached: dying", $name);
            std::process::abort()
        })
    };
}

impl Transaction<'_> {
    fn version_dir(&self, v: &AgentVersion) -> PathBuf {
        self.home.version_dir(v)
    }

    fn relative(v: &AgentVersion) -> PathBuf {
        Path::new("versions").join(v.to_string())
    }

    /// Where the new version is unpacked before it is renamed into `versions/`.
    fn staging_dir(&self) -> PathBuf {
        self.home
            .versions()
            .join(format!(".staging-{}", self.journal.to))
    }

    /// The old version's directory name under `versions/`.
    fn old_dir_name(&self) -> String {
        self.journal
            .from_dir
            .clone()
            .filter(|n| !n.contains('/') && n != ".." && n != ".")
            .unwrap_or_else(|| self.journal.from.to_string())
    }

    fn record(&mut self, phase: Phase) -> Result<()> {
        self.journal.phase = phase;
        state::write_journal(self.home, &self.journal)
    }

    /// Drives the journal to a final phase. A failure before the switch closes the
    /// transaction with the old version untouched and running.
    pub fn run(&mut self) -> Result<Verdict> {
        match self.drive() {
            Ok(v) => Ok(v),
            Err(e) if self.journal.phase < Phase::Switched => self.abandon(e.to_string()),
            Err(e) => Err(e),
        }
    }

    fn drive(&mut self) -> Result<Verdict> {
        loop {
            match self.journal.phase {
                // The new version is unpacked while the old agent still runs (it waits for
                // this phase before it exits), so the downtime is only stop, switch, start.
                Phase::Prepared => {
                    self.check_bundle()?;
                    self.unpack()?;
                    self.record(Phase::Stopping)?;
                    fault!("updater-stopping");
                }
                Phase::Stopping => {
                    self.unpack()?; // a no-op unless a crash lost it
                    self.stop_old();
                    self.record(Phase::Unpacked)?;
                    fault!("updater-unpacked");
                }
                Phase::Unpacked => {
                    self.merge_conf().map_err(UpdateError::Failed)?;
                    let to = Self::relative(&self.journal.to);
                    atomic::replace_symlink(&self.home.current(), &to)?;
                    self.journal.boot_count = 0;
                    self.record(Phase::Switched)?;
                    self.log.step(&format!("current -> {}", to.display()));
                    fault!("updater-switched");
                }
                Phase::Switched => {
                    if self.recovering {
                        self.journal.boot_count += 1;
                        self.record(Phase::Switched)?;
                        if self.journal.boot_count > self.settings.max_boots {
                            let reason = format!(
                                "the new version did not commit after {} starts (it crashes or the updater died each time)",
                                self.settings.max_boots
                            );
                            return self.rollback(reason);
                        }
                    }
                    match self.start_and_judge() {
                        Ok(()) => return self.commit(),
                        Err(reason) => return self.rollback(reason),
                    }
                }
                Phase::RollingBack => {
                    let reason = self
                        .journal
                        .reason
                        .clone()
                        .unwrap_or_else(|| "an earlier rollback was interrupted".into());
                    return self.rollback(reason);
                }
                Phase::Committed => {
                    if has_leftovers(self.home) {
                        self.finish_commit();
                    }
                    return Ok(Verdict::Committed);
                }
                Phase::RolledBack => {
                    return Ok(Verdict::RolledBack(
                        self.journal.reason.clone().unwrap_or_default(),
                    ));
                }
            }
        }
    }

    fn bundle(&self) -> PathBuf {
        PathBuf::from(&self.journal.bundle_path)
    }

    /// The bytes about to be unpacked are the bytes the agent verified.
    fn check_bundle(&mut self) -> Result<()> {
        let bundle = self.bundle();
        let file = fs::File::open(&bundle).map_err(|e| io_at(&bundle, e))?;
        let digests =
            agent_protocol::digest::Digests::of_reader(file).map_err(|e| io_at(&bundle, e))?;
        if digests.sha256_hex() != self.journal.bundle_sha256 {
            return Err(UpdateError::Failed(format!(
                "{} changed since it was verified (sha256 {} instead of {}); refusing it",
                bundle.display(),
                digests.sha256_hex(),
                self.journal.bundle_sha256
            )));
        }
        self.log.step(&format!(
            "bundle {} checked (sha256 {})",
            bundle.display(),
            self.journal.bundle_sha256
        ));
        Ok(())
    }

    fn stop_old(&mut self) {
        let pid = self.wait_pid.or_else(|| process::running_agent(self.home));
        let how = process::stop_agent(self.home, pid, self.settings.stop_patience);
        let what = match how {
            Stopped::NotRunning => "the old agent had already stopped".to_owned(),
            Stopped::Exited => format!("the old agent (pid {}) exited", pid.unwrap_or(0)),
            Stopped::Terminated => format!(
                "the old agent (pid {}) did not exit within {:?}; stopped it with TERM",
                pid.unwrap_or(0),
                self.settings.stop_patience
            ),
            Stopped::Killed => format!(
                "the old agent (pid {}) ignored TERM; killed it",
                pid.unwrap_or(0)
            ),
        };
        self.log.step(&what);
    }

    /// Unpacks into a staging directory on the same filesystem, marks it complete, and
    /// renames it into `versions/<to>`. A complete directory from an earlier run is kept.
    fn unpack(&mut self) -> Result<()> {
        let to = self.journal.to.clone();
        let dest = self.version_dir(&to);
        if dest.join(layout::COMPLETE_MARKER).is_file()
            && payload::installed_version(&dest).ok() == Some(to.clone())
        {
            self.log
                .step(&format!("{} already unpacked", dest.display()));
            return Ok(());
        }
        let current = fs::canonicalize(self.home.current()).ok();
        if dest.exists() {
            if current.as_deref() == fs::canonicalize(&dest).ok().as_deref() {
                return Err(UpdateError::Failed(format!(
                    "{} is incomplete but current points at it; repair the installation by hand",
                    dest.display()
                )));
            }
            fs::remove_dir_all(&dest).map_err(|e| io_at(&dest, e))?;
        }
        let staging = self.staging_dir();
        if staging.exists() {
            fs::remove_dir_all(&staging).map_err(|e| io_at(&staging, e))?;
        }
        let bundle = self.bundle();
        let mut payload = Payload::open(&bundle)?;
        let facts = payload.facts()?;
        if facts.version != to {
            return Err(UpdateError::Failed(format!(
                "{} carries {}, the journal expects {to}",
                bundle.display(),
                facts.version
            )));
        }
        let written = unpack::unpack_tar_gz(
            payload.dist(&facts.version)?,
            &staging,
            Options {
                root: Some(layout::DIST_ROOT),
                sync: true,
                ..Options::default()
            },
        )?;
        let inside = payload::installed_version(&staging)?;
        if inside != to {
            let _ = fs::remove_dir_all(&staging);
            return Err(UpdateError::Failed(format!(
                "the distribution says it is {inside}, the bundle says {to}; refusing it"
            )));
        }
        // The signature travels with the version: the agent's defence against replays.
        let sig_name = format!("{}.minisig", bundle.display());
        let sig = Path::new(&sig_name);
        if sig.is_file() {
            atomic::copy_file(sig, &staging.join(layout::VERSION_SIGNATURE_FILE))?;
        }
        atomic::write(&staging.join(layout::COMPLETE_MARKER), b"")?;
        fs::rename(&staging, &dest).map_err(|e| io_at(&dest, e))?;
        atomic::fsync_dir(&self.home.versions())?;
        self.log.step(&format!(
            "unpacked {to} into {} ({} entries, {} bytes)",
            dest.display(),
            written.entries,
            written.bytes
        ));
        Ok(())
    }

    fn conf_before(&self) -> PathBuf {
        self.home.update_dir().join(CONF_BEFORE)
    }

    /// Merges from the pre-update copy, so repeating the merge gives the same file.
    fn merge_conf(&mut self) -> std::result::Result<(), String> {
        let conf = self.home.agent_toml();
        let before_path = self.conf_before();
        let before = match atomic::read_text(&before_path, 1 << 20) {
            Ok(t) => t,
            Err(_) => {
                let original = match fs::read_to_string(&conf) {
                    Ok(t) => t,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
                    Err(e) => return Err(format!("{}: {e}", conf.display())),
                };
                fs::create_dir_all(self.home.update_dir()).map_err(|e| e.to_string())?;
                atomic::write(&before_path, original.as_bytes()).map_err(|e| e.to_string())?;
                original
            }
        };
        let new_dir = self.version_dir(&self.journal.to);
        let defaults =
            fs::read_to_string(new_dir.join("conf.default/agent.toml")).unwrap_or_default();
        let (merged, added) = merge::merge(&before, &defaults)?;
        fs::create_dir_all(self.home.conf()).map_err(|e| e.to_string())?;
        atomic::write(&self.home.conf().join("agent.toml.bak"), before.as_bytes())
            .map_err(|e| e.to_string())?;
        atomic::write(&conf, merged.as_bytes()).map_err(|e| e.to_string())?;
        // Files new in conf.default (but never the operator's key or env) are added.
        if let Ok(entries) = fs::read_dir(new_dir.join("conf.default")) {
            for entry in entries.flatten() {
                let target = self.home.conf().join(entry.file_name());
                if !target.exists() && entry.path().is_file() {
                    atomic::copy_file(&entry.path(), &target).map_err(|e| e.to_string())?;
                }
                // The workload's configuration, for a first version that has one; an
                // existing conf/workload/ is never touched.
                if entry.file_name() == "workload"
                    && entry.path().is_dir()
                    && fs::symlink_metadata(&target).is_err()
                {
                    atomic::copy_tree(&entry.path(), &target).map_err(|e| e.to_string())?;
                }
            }
        }
        self.log.step(&if added.is_empty() {
            "configuration kept (no new keys); previous copy in conf/agent.toml.bak".to_owned()
        } else {
            format!(
                "configuration merged: added {}; operator values kept; previous copy in conf/agent.toml.bak",
                added.join(", ")
            )
        });
        Ok(())
    }

    fn restore_conf(&mut self) {
        let before = self.conf_before();
        if let Ok(text) = atomic::read_text(&before, 1 << 20) {
            match atomic::write(&self.home.agent_toml(), text.as_bytes()) {
                Ok(()) => self
                    .log
                    .step("configuration restored to what it was before the update"),
                Err(e) => self
                    .log
                    .step(&format!("could not restore conf/agent.toml: {e}")),
            }
        }
    }

    /// Starts the new version through its wrapper and waits for a verdict (step 5).
    fn start_and_judge(&mut self) -> std::result::Result<(), String> {
        let to = self.journal.to.clone();
        let _ = fs::remove_file(self.home.health_file());
        let start = Instant::now();
        if process::running_agent(self.home).is_none() {
            // The wrapper only launches it; the judge below watches it come up, so
            // `start` need not wait long for a slow one.
            let within = self.settings.health_timeout.min(WRAPPER_START_WAIT);
            let out =
                process::wrapper_within(self.home, &self.version_dir(&to), "start", Some(within))
                    .map_err(|e| format!("{to} did not start through its wrapper: {e}"))?;
            self.log
                .step(&format!("started {to} through its wrapper: {out}"));
        }
        let mut judge = Judge::new(
            to.clone(),
            self.settings.health_timeout,
            self.settings.stability_window,
        );
        loop {
            let observation = self.observe(start.elapsed());
            match judge.observe(&observation) {
                Judgement::Wait => {}
                Judgement::Healthy { pid } => {
                    self.log.step(&format!(
                        "{to} healthy (pid {pid}): version, components and {:?} of stability",
                        self.settings.stability_window
                    ));
                    return Ok(());
                }
                Judgement::Failed(reason) if judge.workload_failed() => {
                    return Err(with_workload_log(self.home, reason));
                }
                Judgement::Failed(reason) => return Err(reason),
            }
            if !judge.announced
                && let Some((pid, since)) = judge.stable_since()
            {
                judge.announced = true;
                self.log.step(&format!(
                    "{to} is up (pid {pid}) {:.2}s after start; watching it for {:?}",
                    since.as_secs_f64(),
                    self.settings.stability_window
                ));
            }
            // Polled often: this loop's latency is part of the update's downtime.
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What the judge needs to know, read from `run/`.
    fn observe(&self, elapsed: Duration) -> Observation {
        let health = atomic::read_text(&self.home.health_file(), 64 * 1024)
            .ok()
            .and_then(|t| serde_json::from_str::<Health>(&t).ok());
        let health_pid_alive = health.as_ref().is_some_and(|h| process::is_alive(h.pid));
        let agent_pid = process::recorded_agent_pid(self.home);
        let last_exit = atomic::read_text(&self.home.exit_file(), 1024)
            .ok()
            .and_then(|t| health::parse_exit_file(&t));
        Observation {
            elapsed,
            health,
            health_pid_alive,
            agent_pid,
            agent_alive: agent_pid.is_some_and(process::is_alive),
            last_exit,
        }
    }

    fn agent_id(&self) -> String {
        atomic::read_text(&self.home.identity(), 1024)
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| "unknown".into())
    }

    fn report(&mut self, status: UpdateStatus, error: Option<String>) {
        let report = Report {
            id: self.agent_id(),
            from: self.journal.from.to_string(),
            to: self.journal.to.to_string(),
            status,
            error,
        };
        if let Err(e) = state::enqueue_report(self.home, &report) {
            // A report is never a reason to change the verdict.
            self.log.step(&format!(
                "could not queue the {} report: {e}",
                status.as_str()
            ));
        }
    }

    fn commit(&mut self) -> Result<Verdict> {
        self.record(Phase::Committed)?;
        fault!("updater-committed");
        self.log.step(&format!(
            "committed: {} is the installed version",
            self.journal.to
        ));
        self.finish_commit();
        Ok(Verdict::Committed)
    }

    /// After the commit record: report, prune, clean. Repeatable: recovery runs it again
    /// while `data/update/` still holds this update's files.
    fn finish_commit(&mut self) {
        if let Err(e) = self.apply_trust() {
            // The old key stays trusted, and the chain the bundle carried still leads
            // from it: the next update along the chain tries again.
            self.log
                .step(&format!("could not hand trust to the new signing key: {e}"));
        }
        self.report(UpdateStatus::Installed, None);
        self.remove_old_versions();
        self.clean_update_dir();
    }

    /// A rotated signing key takes over: the trusted key file becomes the new key (the
    /// old file kept as `<file>.prev`), and the keys the chain passed are retired.
    /// Repeatable: a key file that already holds the new key is left alone.
    fn apply_trust(&mut self) -> std::result::Result<(), String> {
        let Some(change) = self.journal.trust.clone() else {
            return Ok(());
        };
        let new_key = PublicKey::parse(&change.new_key).map_err(|e| e.to_string())?;
        let key_path = PathBuf::from(&change.key_path);
        let current = atomic::read_text(&key_path, 64 * 1024).ok();
        let current_id = current
            .as_deref()
            .and_then(|t| PublicKey::parse(t).ok())
            .map(|k| k.key_id());
        if current_id != Some(new_key.key_id()) {
            let prev = PathBuf::from(format!("{}.prev", key_path.display()));
            if let Some(text) = &current {
                atomic::write_with_mode(&prev, text.as_bytes(), Some(0o644))
                    .map_err(|e| e.to_string())?;
            }
            atomic::write_with_mode(&key_path, change.new_key.as_bytes(), Some(0o644))
                .map_err(|e| e.to_string())?;
            self.log.step(&format!(
                "signing key rotated: {} now trusts key {} (the previous key {} is kept in {})",
                key_path.display(),
                new_key.key_id(),
                current_id.map_or_else(|| "?".to_owned(), |k| k.to_string()),
                prev.display()
            ));
        }
        let retire: Vec<KeyId> = change
            .retire
            .iter()
            .filter_map(|k| k.parse().ok())
            .collect();
        let added =
            state::retire_keys(self.home, &retire, new_key.key_id()).map_err(|e| e.to_string())?;
        if !added.is_empty() {
            let names: Vec<String> = added.iter().map(ToString::to_string).collect();
            self.log.step(&format!(
                "retired signing key {} (data/retired-keys): bundles it signs are refused",
                names.join(", ")
            ));
        }
        Ok(())
    }

    /// Keeps the new version and the previous one (for the next rollback).
    fn remove_old_versions(&mut self) {
        let keep = [self.journal.to.to_string(), self.old_dir_name()];
        let Ok(entries) = fs::read_dir(self.home.versions()) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if keep.contains(&name) {
                continue;
            }
            match fs::remove_dir_all(entry.path()) {
                Ok(()) => self.log.step(&format!("removed old version {name}")),
                Err(e) => self
                    .log
                    .step(&format!("could not remove old version {name}: {e}")),
            }
        }
    }

    fn clean_update_dir(&mut self) {
        let dir = self.home.update_dir();
        let Ok(entries) = fs::read_dir(&dir) else {
            return;
        };
        for entry in entries.flatten() {
            let _ = fs::remove_file(entry.path());
        }
    }

    /// Nothing was switched yet: `current` still names the old version. Close the
    /// journal, undo the merge, and make sure the old agent runs again. The bundle is
    /// not marked bad: the failure was not proven to be the bundle's.
    fn abandon(&mut self, reason: String) -> Result<Verdict> {
        self.log
            .step(&format!("update abandoned before the switch: {reason}"));
        self.restore_old(&reason)?;
        Ok(Verdict::RolledBack(reason))
    }

    /// Puts the old version back: `current`, the configuration, no trace of the new
    /// version; reports `INSTALL_FAILED` (before the journal closes, so a crash repeats
    /// the report rather than losing it), closes the journal and starts the old agent
    /// unless one runs. Shared by the rollback and by an abandon before the switch.
    fn restore_old(&mut self, reason: &str) -> Result<()> {
        let from = self.journal.from.clone();
        let to = self.journal.to.clone();
        let from_name = self.old_dir_name();
        let old_dir = self.home.versions().join(&from_name);
        atomic::replace_symlink(
            &self.home.current(),
            &Path::new("versions").join(&from_name),
        )?;
        self.log.step(&format!("current -> versions/{from_name}"));
        self.restore_conf();
        self.report(UpdateStatus::InstallFailed, Some(reason.to_owned()));
        let _ = fs::remove_dir_all(self.staging_dir());
        let new_dir = self.version_dir(&to);
        if to.to_string() != from_name && new_dir.exists() {
            let _ = fs::remove_dir_all(&new_dir);
        }
        self.journal.reason = Some(reason.to_owned());
        self.record(Phase::RolledBack)?;
        self.clean_update_dir();
        if process::running_agent(self.home).is_none() {
            match process::wrapper(self.home, &old_dir, "start") {
                Ok(out) => self.log.step(&format!("started {from} again: {out}")),
                Err(e) => self.log.step(&format!("could not start {from}: {e}")),
            }
        }
        Ok(())
    }

    /// Step 6: back to the old version, remembered as bad, reported.
    fn rollback(&mut self, reason: String) -> Result<Verdict> {
        self.journal.reason = Some(reason.clone());
        self.record(Phase::RollingBack)?;
        self.log.step(&format!("rolling back: {reason}"));
        fault!("updater-rolling-back");
        let old_dir = self.home.versions().join(self.old_dir_name());
        let pid = process::running_agent(self.home);
        // A supervisor between restarts of a crashing agent must go too, or it would
        // start the next one.
        if pid.is_some() || process::running_supervisor(self.home).is_some() {
            let _ = process::wrapper(self.home, &old_dir, "stop");
            process::stop_agent(self.home, pid, Duration::ZERO);
            self.log.step(&match pid {
                Some(pid) => format!("stopped the new agent (pid {pid}) and its supervisor"),
                None => "stopped the new agent's supervisor (between restarts)".to_owned(),
            });
        }
        if let Err(e) = state::add_bad(
            self.home,
            &self.journal.bundle_sha256,
            &self.journal.to.to_string(),
            &reason,
        ) {
            self.log
                .step(&format!("could not record the bad bundle: {e}"));
        }
        self.restore_old(&reason)?;
        self.log.step(&format!(
            "rolled back to {}; bundle {} is in data/bad-versions and will not be retried",
            self.journal.from, self.journal.bundle_sha256
        ));
        Ok(Verdict::RolledBack(reason))
    }
}

/// A workload's failure with the last lines it wrote, so the report says why.
fn with_workload_log(home: &AgentHome, reason: String) -> String {
    let tail = atomic::tail_lines(&home.logs().join("workload.log"), 5);
    if tail.trim().is_empty() {
        reason
    } else {
        format!("{reason}; last lines of logs/workload.log:\n{tail}")
    }
}
