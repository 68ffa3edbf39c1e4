//! The updater's writes of shared state and its starts of agents, behind one trait: the
//! seam through which the exit-path tests give it a disk that refuses every write.
//! [`Live`] is the real thing; nothing else in the crate writes the journal, the outbox
//! or `data/bad-versions`, or starts an agent, except through it.

use std::path::Path;
use std::time::Duration;

use agent_protocol::journal::Journal;
use agent_protocol::layout::AgentHome;
use agent_protocol::wire::Report;

use crate::error::Result;
use crate::{process, state};

pub trait Effects {
    fn write_journal(&self, home: &AgentHome, journal: &Journal) -> Result<()>;
    fn enqueue_report(&self, home: &AgentHome, report: &Report) -> Result<()>;
    fn add_bad(&self, home: &AgentHome, sha256: &str, version: &str, reason: &str) -> Result<()>;
    /// The running agent of this installation, if any.
    fn running_agent(&self, home: &AgentHome) -> Option<u32>;
    /// The wrapper's supervisor, alive (between restarts of a crashed agent, say).
    fn supervisor_running(&self, home: &AgentHome) -> bool;
    /// `<version_dir>/bin/agent-wrapper.sh start`, waiting at most `within` when given.
    fn start_agent(
        &self,
        home: &AgentHome,
        version_dir: &Path,
        within: Option<Duration>,
    ) -> Result<String, String>;
    /// Bytes free on the installation's filesystem, if known.
    fn free_bytes(&self, home: &AgentHome) -> Option<u64>;
}

/// The real files and processes.
pub struct Live;

impl Effects for Live {
    fn write_journal(&self, home: &AgentHome, journal: &Journal) -> Result<()> {
        state::write_journal(home, journal)
    }

    fn enqueue_report(&self, home: &AgentHome, report: &Report) -> Result<()> {
        state::enqueue_report(home, report).map(|_| ())
    }

    fn add_bad(&self, home: &AgentHome, sha256: &str, version: &str, reason: &str) -> Result<()> {
        state::add_bad(home, sha256, version, reason)
    }

    fn running_agent(&self, home: &AgentHome) -> Option<u32> {
        process::running_agent(home)
    }

    fn supervisor_running(&self, home: &AgentHome) -> bool {
        process::running_supervisor(home).is_some()
    }

    fn start_agent(
        &self,
        home: &AgentHome,
        version_dir: &Path,
        within: Option<Duration>,
    ) -> Result<String, String> {
        process::wrapper_within(home, version_dir, "start", within)
    }

    fn free_bytes(&self, home: &AgentHome) -> Option<u64> {
        state::free_bytes(home.root())
    }
}
