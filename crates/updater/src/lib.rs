//! The updater: `agent-bundle-<v> --update[=AGENT_HOME] [--wait-pid=PID] [--recover]`.
//!
//! It owns `versions/`, `current`, `run/update.lock`, the journal and `logs/update.log`:
//! it waits for the old agent, unpacks the new version beside the old one, merges the
//! configuration, flips `current`, starts the new agent through its wrapper, judges its
//! health and commits or rolls back. It never writes to the operator's `conf/` except
//! the merge (which keeps `agent.toml.bak`), and never deletes `data/` or `logs/`.
//! The state files it shares with the agent are in [`state`].

pub mod error;
pub mod state;

pub use error::{Result, UpdateError};

/// What an update run did, for the one line the CLI prints.
pub fn run_update(
    _bundle: &std::path::Path,
    _home: &std::path::Path,
    _wait_pid: Option<u32>,
) -> Result<String> {
    Err(UpdateError::Failed("the updater is not built yet".into()))
}
