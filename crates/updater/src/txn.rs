//! The update transaction, phase by phase. Every phase is recorded in the journal
//! before the next begins, and every step is safe to repeat, so a run that dies
//! anywhere is finished (or rolled back) by the next run from the journal alone.
//!
//! At no instant is there no runnable agent on disk: the new version is unpacked beside
//! the old one, `current` is flipped by renaming a symlink, and the old version is
//! removed only after a later update commits.
//!
//! Every way out of a failed transaction ([`Transaction::run`] never fails) puts the old
//! version back and starts it *before* it writes the outbox, `data/bad-versions` or the
//! journal's last phase; those writes may fail (a full disk) and are then logged, never
//! a reason to leave the machine without an agent. A journal that could not record the
//! end still names the transaction, and the updater's link stays in `data/update/`, so
//! the agent or the next start finishes it from what is on disk.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agent_extract::payload::{self, Payload};
use agent_extract::unpack::{self, Options};
use agent_extract::{atomic, current};
use agent_protocol::AgentVersion;
use agent_protocol::journal::{Health, Journal, Phase, StopRequest};
use agent_protocol::layout::{self, AgentHome};
use agent_protocol::minisign::{KeyId, PublicKey};
use agent_protocol::wire::{Report, UpdateStatus};

use crate::effects::Effects;
use crate::error::{Result, UpdateError};
use crate::health::{self, Judge, Judgement, Observation};
use crate::log::UpdateLog;
use crate::merge;
use crate::outcome::{self, Blame, Resume};
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
    /// The journal, the outbox, bad versions and agent starts go through here.
    pub fx: &'a dyn Effects,
}

/// True while `data/update/` still holds the recovery link of an update.
pub fn has_leftovers(home: &AgentHome) -> bool {
    fs::symlink_metadata(home.update_dir().join(layout::updater_file_name())).is_ok()
}

/// How a transaction ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Committed,
    RolledBack(String),
    /// The new version is healthy and runs, but the journal could not record the commit
    /// (the reason): it stays, and a later recovery records it.
    Unrecorded(String),
    /// A stop that was asked for ended the judgement (the reason): the new version stays
    /// installed and stopped, and its next start judges it. Nothing is reported or held
    /// against the bundle.
    PutOff(String),
}

/// What watching one start of the new version found.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Judged {
    Healthy,
    Failed(String),
    /// Stopped on request before a verdict.
    Stopped(String),
}

/// Starts of the old version through its wrapper before the updater gives up (a second
/// later each): a wrapper can fail where a moment later it would not (its own files on a
/// disk that is being freed).
const START_ATTEMPTS: u32 = 3;

/// A fault point for the crash tests (`--features failpoints`, `FAILPOINTS=<name>=return`):
/// the process dies on the spot, like `kill -9`, with no cleanup.
macro_rules! fault {
    ($name:expr) => {
        fail::fail_point!($name, |_| {
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                format!("fault point {} reached: dying\n", $name).as_bytes(),
            );
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

    /// Records `phase`; the phase in memory moves only once the journal says so, so that
    /// a failed write leaves both naming the last phase reached.
    fn record(&mut self, phase: Phase) -> Result<()> {
        let before = self.journal.phase;
        self.journal.phase = phase;
        let written = self.fx.write_journal(self.home, &self.journal);
        if written.is_err() {
            self.journal.phase = before;
        }
        written
    }

    /// Records `phase` where a failure to must not change what happens next; says so.
    fn try_record(&mut self, phase: Phase) -> bool {
        match self.record(phase) {
            Ok(()) => true,
            Err(e) => {
                self.journal.phase = phase;
                self.log.step(&format!(
                    "could not record phase {phase:?} in the journal: {}",
                    outcome::explain(&e.to_string())
                ));
                false
            }
        }
    }

    /// Drives the journal to a final phase. A failure before the switch closes the
    /// transaction with the old version untouched and running; after it, rolls back.
    /// Either way an agent runs when this returns.
    pub fn run(&mut self) -> Verdict {
        if outcome::resume(
            self.journal.phase,
            self.recovering,
            self.fx.running_agent(self.home).is_some(),
        ) == Resume::Abandon
        {
            return self.abandon(format!(
                "an earlier updater stopped at phase {:?} and {} runs again",
                self.journal.phase, self.journal.from
            ));
        }
        match self.drive() {
            Ok(v) => v,
            Err(e) if self.journal.phase < Phase::Switched => self.abandon(e.to_string()),
            Err(e) => self.rollback(format!("the updater failed: {e}"), false),
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
                    current::point(&self.home.current(), &self.journal.to.to_string())?;
                    self.journal.boot_count = 0;
                    self.record(Phase::Switched)?;
                    self.log.step(&format!("current -> {}", to.display()));
                    fault!("updater-switched");
                }
                Phase::Switched => {
                    // A recovery that finds the new version running judges it; only one
                    // that has to start it again counts a start, and not after a stop
                    // that was asked for: that start is the one the stop put off.
                    if let Some(stop) = self.journal.planned_stop.take() {
                        self.log.step(&format!(
                            "judging {} again: its last judgement ended with a stop asked for ({stop}); not counted as a failed start",
                            self.journal.to
                        ));
                        self.try_record(Phase::Switched);
                    } else if self.recovering && self.fx.running_agent(self.home).is_none() {
                        self.journal.boot_count += 1;
                        self.try_record(Phase::Switched);
                        if self.journal.boot_count > self.settings.max_boots {
                            let reason = format!(
                                "the new version did not commit after {} starts (it crashes or the updater died each time)",
                                self.settings.max_boots
                            );
                            return Ok(self.rollback(reason, true));
                        }
                    }
                    return Ok(match self.start_and_judge() {
                        Judged::Healthy => self.commit(),
                        Judged::Stopped(reason) => self.put_off(reason),
                        Judged::Failed(reason) => {
                            match outcome::blame(&reason, self.fx.free_bytes(self.home)) {
                                Blame::Bundle => self.rollback(reason, true),
                                Blame::Disk(reason) => self.rollback(reason, false),
                            }
                        }
                    });
                }
                Phase::RollingBack => {
                    let reason = self
                        .journal
                        .reason
                        .clone()
                        .unwrap_or_else(|| "an earlier rollback was interrupted".into());
                    let bad = !outcome::mentions_full_disk(&reason);
                    return Ok(self.rollback(reason, bad));
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
        let pid = self.wait_pid.or_else(|| self.fx.running_agent(self.home));
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
        let current = current::read_name(&self.home.current()).ok();
        if dest.exists() {
            if current.as_deref() == Some(to.to_string().as_str()) {
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
        fault!("updater-unpacking");
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
        // The bundle stays with its version: the base of the next update's delta. Only a
        // saving, so a version without it (a full disk) is still installed.
        // A copy where a link would be a name of this running program inside versions/
        // (Windows refuses to delete one; an MSI's bundle updating the agent itself).
        let kept = staging.join(layout::KEPT_BUNDLE_FILE);
        let keeping = if process::keep_by_copy(&bundle) {
            atomic::copy_file(&bundle, &kept).map(|_| ())
        } else {
            atomic::link_or_copy(&bundle, &kept)
        };
        if let Err(e) = keeping {
            self.log.step(&format!(
                "not keeping the bundle for deltas ({e}); later updates download whole bundles"
            ));
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
        fault!("updater-merging");
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

    /// Puts back `conf/agent.toml` as it was before the merge, if the merge changed it.
    fn restore_conf(&mut self) {
        let Ok(text) = atomic::read_text(&self.conf_before(), 1 << 20) else {
            return;
        };
        let conf = self.home.agent_toml();
        if fs::read_to_string(&conf).is_ok_and(|now| now == text) {
            return;
        }
        let Err(e) = atomic::write(&conf, text.as_bytes()) else {
            self.log
                .step("configuration restored to what it was before the update");
            return;
        };
        // No room for a copy: the file before the merge is also conf/agent.toml.bak, and
        // a rename writes no byte.
        let bak = self.home.conf().join("agent.toml.bak");
        if fs::read_to_string(&bak).is_ok_and(|b| b == text) && fs::rename(&bak, &conf).is_ok() {
            self.log.step(&format!(
                "configuration restored by moving conf/agent.toml.bak back (no room to copy it: {e})"
            ));
        } else {
            self.log.step(&format!(
                "could not restore conf/agent.toml: {}; the file before the update is in {}",
                outcome::explain(&e.to_string()),
                self.conf_before().display()
            ));
        }
    }

    /// Starts the new version through its wrapper and waits for a verdict (step 5).
    fn start_and_judge(&mut self) -> Judged {
        let to = self.journal.to.clone();
        let _ = fs::remove_file(self.home.health_file());
        let start = Instant::now();
        // A stop asked for from this second on ends the judgement without a verdict.
        let since = state::now_secs();
        if self.fx.running_agent(self.home).is_none() {
            // A stop asked for during this update (the old agent stopped while the new
            // version was unpacked, say) and not ended by a start since: nothing is
            // started, and the next start judges the new version.
            if let Some(by) = self.stop_asked_during_update() {
                return Judged::Stopped(format!(
                    "a stop was asked for ({by}) before {to} was started"
                ));
            }
            // The wrapper only launches it; the judge below watches it come up, so
            // `start` need not wait long for a slow one.
            let within = self.settings.health_timeout.min(WRAPPER_START_WAIT);
            match self
                .fx
                .start_agent(self.home, &self.version_dir(&to), Some(within))
            {
                Ok(out) => self
                    .log
                    .step(&format!("started {to} through its wrapper: {out}")),
                Err(e) => {
                    let failed = format!("{to} did not start through its wrapper: {e}");
                    return match self.stop_requested(since) {
                        Some(by) => {
                            Judged::Stopped(format!("{failed}, while a stop was asked for ({by})"))
                        }
                        None => Judged::Failed(failed),
                    };
                }
            }
        }
        let mut judge = Judge::new(
            to.clone(),
            self.settings.health_timeout,
            self.settings.stability_window,
        );
        let mut superseded_said = false;
        loop {
            let observation = self.observe(start.elapsed(), since);
            match judge.observe(&observation) {
                Judgement::Wait => {}
                Judgement::Healthy { pid } => {
                    self.log.step(&format!(
                        "{to} healthy (pid {pid}): version, components and {:?} of stability",
                        self.settings.stability_window
                    ));
                    return Judged::Healthy;
                }
                Judgement::Failed(reason) if judge.workload_failed() => {
                    return Judged::Failed(with_workload_log(self.home, reason));
                }
                Judgement::Failed(reason) => return Judged::Failed(reason),
                Judgement::Stopped(reason) => return Judged::Stopped(reason),
            }
            if !superseded_said && let Some(newer) = judge.superseded_by() {
                superseded_said = true;
                self.log.step(&format!(
                    "the server now offers {newer}: not a failure of {to}, which is judged to the end and takes {newer} after it commits"
                ));
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

    /// Who asked for a stop of the agent at or after `since` (unix seconds), if anyone
    /// did (`run/stop-requested`).
    fn stop_requested(&self, since: u64) -> Option<String> {
        atomic::read_text(&self.home.stop_request(), 1024)
            .ok()
            .and_then(|t| StopRequest::parse(&t))
            .filter(|r| r.since(since))
            .map(|r| r.by)
    }

    /// A stop asked for since this update began and not ended by a start since (every
    /// start removes the request). None for an update run by hand on an installation
    /// (no agent handed it over, no recovery): running it is asking for a start, even
    /// right after a stop.
    fn stop_asked_during_update(&self) -> Option<String> {
        if self.wait_pid.is_none() && !self.recovering {
            return None;
        }
        self.stop_requested(self.journal.started_at)
    }

    /// What the judge needs to know, read from `run/`; `since`: when the judgement began
    /// (unix seconds), for the stop requests that count.
    fn observe(&self, elapsed: Duration, since: u64) -> Observation {
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
            stop_requested: self.stop_requested(since),
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
        if let Err(e) = self.fx.enqueue_report(self.home, &report) {
            // A report is never a reason to change the verdict.
            self.log.step(&format!(
                "could not queue the {} report: {}",
                status.as_str(),
                outcome::explain(&e.to_string())
            ));
        }
    }

    fn commit(&mut self) -> Verdict {
        self.journal.ended_at = Some(state::now_secs());
        if let Err(e) = self.record(Phase::Committed) {
            // The new version is healthy and serving: rolling it back because a file
            // cannot be written would trade a working agent for nothing. The journal
            // stays at Switched and the updater's link in data/update/, so a recovery
            // (the agent asks for one) judges it again and records the commit.
            self.journal.ended_at = None;
            let reason = outcome::explain(&e.to_string());
            self.log.step(&format!(
                "{} is healthy and runs, but the commit could not be recorded: {reason}; it is recorded (and INSTALLED reported) once the disk has room",
                self.journal.to
            ));
            return Verdict::Unrecorded(reason);
        }
        fault!("updater-committed");
        self.log.step(&format!(
            "committed: {} is the installed version",
            self.journal.to
        ));
        self.finish_commit();
        Verdict::Committed
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
            let _ = agent_extract::os::remove_or_set_aside(&entry.path());
        }
    }

    /// A stop that was asked for (the operator's, systemd's, a shutdown) ended the new
    /// version before a verdict: not its failure. `current` keeps naming it and nothing is
    /// started (a stopped agent stays stopped); the journal stays at `Switched`, saying
    /// why, and the updater's link stays in `data/update/`, so the next start through the
    /// wrapper or the service judges it again (and does not count that start).
    fn put_off(&mut self, reason: String) -> Verdict {
        self.journal.planned_stop = Some(reason.clone());
        self.try_record(Phase::Switched);
        self.log.step(&format!(
            "no verdict on {}: {reason}; it stays installed and stopped, nothing is held against it, and its next start judges it",
            self.journal.to
        ));
        Verdict::PutOff(reason)
    }

    /// Nothing was switched yet: `current` still names the old version. Close the
    /// journal, undo the merge, and make sure the old agent runs again. The bundle is
    /// not marked bad: the failure was not proven to be the bundle's.
    fn abandon(&mut self, reason: String) -> Verdict {
        let reason = outcome::explain(&reason);
        self.log
            .step(&format!("update abandoned before the switch: {reason}"));
        self.journal.abandoned = true;
        self.restore_old(&reason, false);
        Verdict::RolledBack(reason)
    }

    /// Step 6: back to the old version; remembered as bad when `bundle_at_fault`.
    fn rollback(&mut self, reason: String, bundle_at_fault: bool) -> Verdict {
        self.journal.reason = Some(reason.clone());
        // Recorded first so that a crash from here on goes on rolling back; a journal
        // that cannot be written does not stop the rollback.
        self.try_record(Phase::RollingBack);
        self.log.step(&format!("rolling back: {reason}"));
        fault!("updater-rolling-back");
        let old_dir = self.home.versions().join(self.old_dir_name());
        let pid = self.fx.running_agent(self.home);
        // A supervisor between restarts of a crashing agent must go too, or it would
        // start the next one.
        if pid.is_some() || self.fx.supervisor_running(self.home) {
            let _ = process::wrapper(self.home, &old_dir, "stop");
            process::stop_agent(self.home, pid, Duration::ZERO);
            self.log.step(&match pid {
                Some(pid) => format!("stopped the new agent (pid {pid}) and its supervisor"),
                None => "stopped the new agent's supervisor (between restarts)".to_owned(),
            });
        }
        self.restore_old(&reason, bundle_at_fault);
        self.log.step(&if bundle_at_fault {
            format!(
                "rolled back to {}; bundle {} is in data/bad-versions and will not be retried",
                self.journal.from, self.journal.bundle_sha256
            )
        } else {
            format!(
                "rolled back to {}; the bundle is not held against (the disk was full), so it is tried again",
                self.journal.from
            )
        });
        Verdict::RolledBack(reason)
    }

    /// Puts the old version back and starts it, then writes what there is to write.
    /// In order: `current`, no trace of the new version (which frees room), the
    /// configuration, the old agent started unless one runs; then the `INSTALL_FAILED`
    /// report (before the journal closes, so a crash repeats the report rather than
    /// losing it), the bad bundle, and the journal's last phase. Shared by the rollback
    /// and by an abandon before the switch. Nothing here fails: what cannot be done is
    /// logged, and what cannot be recorded is left for the next start to finish.
    fn restore_old(&mut self, reason: &str, bundle_at_fault: bool) {
        let from_name = self.old_dir_name();
        let to = self.journal.to.clone();
        if current::read_name(&self.home.current()).ok().as_deref() != Some(from_name.as_str()) {
            match current::point(&self.home.current(), &from_name) {
                Ok(()) => self.log.step(&format!("current -> versions/{from_name}")),
                Err(e) => self.log.step(&format!(
                    "could not point current back at versions/{from_name}: {}",
                    outcome::explain(&e.to_string())
                )),
            }
        }
        let _ = fs::remove_dir_all(self.staging_dir());
        let new_dir = self.version_dir(&to);
        if to.to_string() != from_name && new_dir.exists() {
            let _ = fs::remove_dir_all(&new_dir);
        }
        self.restore_conf();
        self.start_old();

        // The machine's fault (a full disk, an updater killed before the switch) never
        // counts against the bundle: the agent tries again, and says so.
        let status = if bundle_at_fault {
            UpdateStatus::InstallFailed
        } else {
            UpdateStatus::Retrying
        };
        self.report(status, Some(reason.to_owned()));
        if bundle_at_fault
            && let Err(e) = self.fx.add_bad(
                self.home,
                &self.journal.bundle_sha256,
                &self.journal.to.to_string(),
                reason,
            )
        {
            self.log.step(&format!(
                "could not record the bad bundle: {}",
                outcome::explain(&e.to_string())
            ));
        }
        self.journal.reason = Some(reason.to_owned());
        self.journal.ended_at = Some(state::now_secs());
        if self.try_record(Phase::RolledBack) {
            self.clean_update_dir();
        } else {
            self.log.step(
                "the journal still names this update; the agent, or the next start through the wrapper, closes it from what is on disk (data/update/ is kept for that)",
            );
        }
    }

    /// Starts the old version through its wrapper unless an agent (or a supervisor
    /// about to restart one) runs; tries again while none does.
    fn start_old(&mut self) {
        let from = self.journal.from.clone();
        let old_dir = self.home.versions().join(self.old_dir_name());
        // A stopped agent stays stopped: a stop asked for during this update, and not
        // ended by a start since, outranks the rule that the updater leaves one running.
        if self.fx.running_agent(self.home).is_none()
            && let Some(by) = self.stop_asked_during_update()
        {
            self.log.step(&format!(
                "not starting {from}: a stop was asked for ({by}); the next start runs it"
            ));
            return;
        }
        for attempt in 1..=START_ATTEMPTS {
            if let Some(pid) = self.fx.running_agent(self.home) {
                if attempt == 1 {
                    self.log.step(&format!("{from} runs (pid {pid})"));
                }
                return;
            }
            if attempt == 1 && self.fx.supervisor_running(self.home) {
                self.log.step(&format!(
                    "the wrapper's supervisor is restarting {from}; leaving it to it"
                ));
                return;
            }
            match self.fx.start_agent(self.home, &old_dir, None) {
                Ok(out) => {
                    self.log.step(&format!("started {from} again: {out}"));
                    return;
                }
                Err(e) => self.log.step(&format!(
                    "could not start {from} (attempt {attempt} of {START_ATTEMPTS}): {e}"
                )),
            }
            if attempt < START_ATTEMPTS {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        if self.fx.running_agent(self.home).is_none() {
            self.log.step(&format!(
                "no agent runs: start it with {}",
                process::start_command(self.home, &old_dir)
            ));
        }
    }
}

/// The layout these tests build is Unix's (`current` a symlink; on Windows a file).
#[cfg(test)]
#[cfg(unix)]
mod exit_paths;
/// A workload's failure with the last lines it wrote, so the report says why.
fn with_workload_log(home: &AgentHome, reason: String) -> String {
    let tail = atomic::tail_lines(&home.logs().join("workload.log"), 5);
    if tail.trim().is_empty() {
        reason
    } else {
        format!("{reason}; last lines of logs/workload.log:\n{tail}")
    }
}
