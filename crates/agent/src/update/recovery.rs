//! Updates that no updater finishes: a journal left open (an updater that could not
//! record the end on a full disk, or one that died) while no updater holds
//! `run/update.lock`. The running agent asks the updater to finish it
//! (`<updater> --update=HOME --recover`), which closes it around this agent: before the
//! switch it abandons the update (this agent keeps running and tries again later), after
//! it it judges the running version and commits or rolls back. The wrapper does the same
//! at every start; this covers the agent that is already running.
//!
//! Its own backoff grows to minutes while the journal cannot be closed (a disk still
//! full). The daemon does not wait that long when its retry of the update is due: it
//! nudges this task ([`Nudge`]), which then looks at once, so an update abandoned on a
//! full disk goes through within the retry's backoff of the space returning.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use agent_protocol::journal::{Journal, Phase};
use agent_protocol::layout::{self, AgentHome};
use agent_updater::{lock, state};

use crate::contact::backoff::Backoff;
use crate::update::reap;

/// How often the journal is looked at; an open one must be seen twice in a row with no
/// updater before anything is done (an agent's own hand-off takes the lock within
/// milliseconds of writing the journal).
const LOOK_EVERY: Duration = Duration::from_secs(5);

/// What one look found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Look {
    /// Nothing is left open, or an updater is at work.
    Settled,
    /// An open journal with no updater: its identity, to see it again unchanged.
    Open((Phase, u64, u32)),
}

pub fn look(journal: Option<&Journal>, updater_running: bool) -> Look {
    match journal {
        Some(j) if !j.phase.is_final() && !updater_running => {
            Look::Open((j.phase, j.started_at, j.boot_count))
        }
        _ => Look::Settled,
    }
}

/// Asks [`finish_interrupted`] to look now, past its backoff: the daemon, which is not
/// handing off (it would hold the lock), wants the open journal closed to try again.
#[derive(Debug, Clone, Default)]
pub struct Nudge(Arc<Notify>);

impl Nudge {
    pub fn now(&self) {
        self.0.notify_one();
    }
}

/// Runs for the life of the agent: finishes what no updater finishes, with backoff.
pub async fn finish_interrupted(home: AgentHome, nudge: Nudge) {
    let mut last = Look::Settled;
    let mut backoff = Backoff::new(LOOK_EVERY, Duration::from_secs(300));
    let mut not_before = Instant::now();
    let mut said_no_updater = false;
    loop {
        let nudged = tokio::select! {
            () = tokio::time::sleep(LOOK_EVERY) => false,
            () = nudge.0.notified() => true,
        };
        let journal = state::open_transaction(&home).ok().flatten();
        let now = look(
            journal.as_ref(),
            lock::holder(&home.update_lock()).is_some(),
        );
        // A nudge stands for the second look: the daemon knows it is not handing off.
        let seen_twice = now != Look::Settled && (now == last || nudged);
        last = now;
        let Some(journal) = journal.filter(|_| seen_twice) else {
            if last == Look::Settled {
                backoff.reset();
                said_no_updater = false;
            }
            continue;
        };
        if !nudged && Instant::now() < not_before {
            continue;
        }
        not_before = Instant::now() + backoff.next_wait(&mut rand::rng());
        let Some(updater) = updater(&home, &journal) else {
            if !said_no_updater {
                said_no_updater = true;
                tracing::error!(
                    "the update {} -> {} stopped at phase {:?} and no updater is left to finish it ({} and {} are gone); run agent-bundle-<version> --update={} --recover",
                    journal.from,
                    journal.to,
                    journal.phase,
                    home.update_dir()
                        .join(layout::updater_file_name())
                        .display(),
                    journal.bundle_path,
                    home.root().display()
                );
            }
            continue;
        };
        tracing::warn!(
            "the update {} -> {} stopped at phase {:?} and no updater runs; asking {} to finish it",
            journal.from,
            journal.to,
            journal.phase,
            updater.display()
        );
        if let Err(e) = spawn_recovery(&home, &updater) {
            tracing::error!("{e}");
        }
    }
}

/// The link the agent made at hand-off or, for an update started by hand, the bundle the
/// journal names.
fn updater(home: &AgentHome, journal: &Journal) -> Option<PathBuf> {
    let link = home.update_dir().join(layout::updater_file_name());
    let bundle = PathBuf::from(&journal.bundle_path);
    [link, bundle].into_iter().find(|p| p.is_file())
}

fn spawn_recovery(home: &AgentHome, updater: &std::path::Path) -> Result<(), String> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(home.logs().join("update.out"));
    let (stdout, stderr) = match out.and_then(|f| Ok((f.try_clone()?, f))) {
        Ok((a, b)) => (Stdio::from(a), Stdio::from(b)),
        // A full disk may refuse even this file; the updater logs to update.log too.
        Err(_) => (Stdio::null(), Stdio::null()),
    };
    let mut cmd = Command::new(updater);
    crate::os::detach(&mut cmd);
    let child = cmd
        .arg(format!("--update={}", home.root().display()))
        .arg("--recover")
        .current_dir(home.root())
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", updater.display()))?;
    reap(child);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn journal(phase: Phase) -> Journal {
        Journal {
            from: "1.0.0+1".parse().unwrap(),
            to: "2.0.0+2".parse().unwrap(),
            bundle_sha256: "ab".repeat(32),
            bundle_path: "/x".into(),
            phase,
            started_at: 7,
            boot_count: 1,
            reason: None,
            from_dir: None,
            trust: None,
            ended_at: None,
            abandoned: false,
            planned_stop: None,
        }
    }

    #[test]
    fn only_an_open_journal_with_no_updater_needs_finishing() {
        assert_eq!(look(None, false), Look::Settled);
        assert_eq!(look(Some(&journal(Phase::Committed)), false), Look::Settled);
        assert_eq!(
            look(Some(&journal(Phase::RolledBack)), false),
            Look::Settled
        );
        assert_eq!(look(Some(&journal(Phase::Unpacked)), true), Look::Settled);
        assert_eq!(
            look(Some(&journal(Phase::Unpacked)), false),
            Look::Open((Phase::Unpacked, 7, 1))
        );
        // Another phase is another look: the journal moved, somebody is at work.
        assert_ne!(
            look(Some(&journal(Phase::Prepared)), false),
            look(Some(&journal(Phase::Unpacked)), false)
        );
    }
}
