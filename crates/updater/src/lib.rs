//! The updater: `agent-bundle-<v> --update[=AGENT_HOME] [--wait-pid=PID] [--recover]`.
//!
//! It owns `versions/`, `current`, `run/update.lock`, the journal and `logs/update.log`:
//! it waits for the old agent, unpacks the new version beside the old one, merges the
//! configuration, flips `current`, starts the new agent through its wrapper, judges its
//! health and commits or rolls back. It never writes to the operator's `conf/` except
//! the merge (which keeps `agent.toml.bak`), and never deletes `data/` or `logs/`.
//! The state files it shares with the agent are in [`state`]; what to do after a
//! failure is decided in [`outcome`], and every way out leaves an agent running.

pub mod effects;
pub mod error;
#[cfg(any(feature = "failpoints", test))]
mod faults;
pub mod health;
pub mod launcher;
pub mod lock;
pub mod log;
pub mod logfiles;
pub mod merge;
pub mod outcome;
pub mod process;
pub mod settings;
pub mod state;
pub mod txn;

use std::path::{Path, PathBuf};

use agent_extract::payload::{self, Payload};
use agent_extract::verify;
use agent_protocol::journal::{Journal, Phase};
use agent_protocol::layout::AgentHome;
use agent_protocol::minisign::{PublicKey, Signature};

pub use error::{Result, UpdateError};

use crate::effects::Effects;
use crate::lock::UpdateLock;
use crate::log::UpdateLog;
use crate::settings::Settings;
use crate::txn::{Transaction, Verdict};

pub struct Request<'a> {
    /// The running bundle (the updater is the bundle's own stub).
    pub bundle: &'a Path,
    pub home: &'a Path,
    pub wait_pid: Option<u32>,
    /// Only finish or roll back an interrupted update; never start a new one.
    pub recover: bool,
}

/// Runs the update (or the recovery) to its end. `Ok` with a one-line summary when
/// the installation is in a final state the caller can be told about; an error when
/// the update was rolled back or could not run.
pub fn run_update(req: &Request<'_>) -> Result<String> {
    #[cfg(feature = "failpoints")]
    let _faults = faults::setup(req.home);

    // Outlive the agent that started us, and its session.
    process::detach();
    run_update_with(req, &effects::Live)
}

/// [`run_update`] with its state writes and agent starts going through `fx`. Once it
/// holds the lock, no way out of it (an error of its own included) leaves an agent
/// that was handed to it, or a transaction it took up, without an agent running.
pub fn run_update_with(req: &Request<'_>, fx: &dyn Effects) -> Result<String> {
    let home = agent_extract::os::canonical(req.home).map_err(|e| {
        UpdateError::Failed(format!(
            "no agent installed at {}: {e}; pass --update=AGENT_HOME",
            req.home.display()
        ))
    })?;
    let home = AgentHome::new(home);
    if agent_extract::current::read_name(&home.current()).is_err() {
        return Err(UpdateError::Failed(format!(
            "{} has no current version; install with --install first",
            home.root().display()
        )));
    }
    let mut log = UpdateLog::open(&home.update_log());
    let mut began = false;
    let result = locked(req, &home, fx, &mut log, &mut began);
    if let Err(e) = &result
        && !matches!(e, UpdateError::Locked { .. })
        && outcome::must_leave_an_agent(req.wait_pid.is_some(), req.recover, began)
    {
        log.step(&format!(
            "the update stops here: {}",
            outcome::explain(&e.to_string())
        ));
        leave_an_agent(&home, fx, &mut log);
    }
    result
}

/// Everything from the lock on; `began` is set once a transaction is taken up.
fn locked(
    req: &Request<'_>,
    home: &AgentHome,
    fx: &dyn Effects,
    log: &mut UpdateLog,
    began: &mut bool,
) -> Result<String> {
    let _lock = match UpdateLock::acquire(&home.update_lock()) {
        Ok(l) => l,
        Err(UpdateError::Locked { holder, .. }) if req.recover => {
            return Ok(format!(
                "an updater (pid {holder}) is running; it finishes the update"
            ));
        }
        Err(e) => return Err(e),
    };
    let (settings, warnings) = Settings::load(home, &|k| std::env::var(k).ok());
    let journal = state::read_journal(home)?;
    let (journal, recovering) = match journal {
        Some(j) if !j.phase.is_final() => {
            // Prepared is where the agent leaves it; anything later means a run died.
            let recovering = req.recover || j.phase > Phase::Prepared;
            (j, recovering)
        }
        // The updater died between the commit and its report: send it, clean up.
        Some(j) if j.phase == Phase::Committed && txn::has_leftovers(home) => (j, true),
        _ if req.recover => return Ok("nothing to recover: no update is under way".into()),
        _ => (new_transaction(home, req.bundle, fx)?, false),
    };
    *began = true;
    log.set_prefix(format!("{} -> {}", journal.from, journal.to));
    if recovering {
        log.step(&format!(
            "recovering an interrupted update (journal phase {:?}, start {})",
            journal.phase,
            journal.boot_count + 1
        ));
    } else {
        log.step(&format!(
            "update starts (updater pid {})",
            std::process::id()
        ));
    }
    for w in warnings {
        log.step(&format!("warning: {w}"));
    }
    let to = journal.to.clone();
    let from = journal.from.clone();
    let mut txn = Transaction {
        home,
        journal,
        settings,
        log,
        wait_pid: req.wait_pid,
        recovering,
        fx,
    };
    match txn.run() {
        Verdict::Committed => Ok(format!("agent updated from {from} to {to}")),
        Verdict::RolledBack(reason) => Err(UpdateError::Failed(format!(
            "update to {to} rolled back, {from} runs again: {reason}. See logs/update.log"
        ))),
        // Ok: the installation is where it was asked to be (stopped); nothing to start.
        Verdict::PutOff(reason) => Ok(format!(
            "the update to {to} is not judged yet: {reason}; the next start judges it"
        )),
        Verdict::Unrecorded(reason) => Err(UpdateError::Failed(format!(
            "{to} is healthy and runs, but the commit could not be recorded: {reason}; it is recorded once the disk has room. See logs/update.log"
        ))),
    }
}

/// The last resort on the way out: the version `current` names is started unless an
/// agent (or a supervisor about to restart one) runs.
fn leave_an_agent(home: &AgentHome, fx: &dyn Effects, log: &mut UpdateLog) {
    if let Some(pid) = fx.running_agent(home) {
        log.step(&format!("an agent runs (pid {pid})"));
        return;
    }
    if fx.supervisor_running(home) {
        log.step("the wrapper's supervisor is restarting the agent");
        return;
    }
    let dir = agent_extract::current::read_dir(&home.current()).unwrap_or_else(|_| home.current());
    match fx.start_agent(home, &dir, None) {
        Ok(out) => log.step(&format!("started the agent in {}: {out}", dir.display())),
        Err(e) => log.step(&format!(
            "could not start the agent: {e}; start it with {}",
            process::start_command(home, &dir)
        )),
    }
}

/// An update started by hand (`agent-bundle-V --update=HOME`), not by the agent: the
/// bundle must verify against the installation's trusted key with the `.minisig`
/// beside it, exactly as the agent would have checked it.
fn new_transaction(home: &AgentHome, bundle: &Path, fx: &dyn Effects) -> Result<Journal> {
    let current = agent_extract::current::read_dir(&home.current())
        .map_err(|e| UpdateError::Failed(e.to_string()))?;
    let from = payload::installed_version(&current)?;
    let facts = Payload::open(bundle)?.facts()?;
    if facts.version == from {
        return Err(UpdateError::Failed(format!(
            "{} already runs {from}; nothing to update",
            home.root().display()
        )));
    }
    let sig_path = PathBuf::from(format!("{}.minisig", bundle.display()));
    let sig_text = agent_extract::atomic::read_text(&sig_path, 4096).map_err(|e| {
        UpdateError::Failed(format!(
            "cannot check the bundle: {e}; put its .minisig beside it"
        ))
    })?;
    let key_path = home.conf().join("update.pub");
    let key = PublicKey::parse(&agent_extract::atomic::read_text(&key_path, 4096)?)?;
    let retired = state::retired_keys(home)?;
    let trust = verify::Trust {
        key: &key,
        retired: &retired,
    };
    let verified = verify::verify_file(bundle, &Signature::parse(&sig_text)?, &trust)?;
    let journal = Journal {
        from,
        to: facts.version,
        bundle_sha256: verified.digests.sha256_hex(),
        bundle_path: bundle.display().to_string(),
        phase: Phase::Prepared,
        started_at: state::now_secs(),
        boot_count: 0,
        reason: None,
        from_dir: current
            .file_name()
            .map(|n| n.to_string_lossy().into_owned()),
        trust: verified
            .chain
            .as_ref()
            .map(|chain| state::trust_change(chain, &key_path)),
        ended_at: None,
        abandoned: false,
        planned_stop: None,
    };
    fx.write_journal(home, &journal)?;
    Ok(journal)
}
