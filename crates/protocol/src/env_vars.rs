//! Environment variables that more than one program of an installation reads: the
//! process-level knobs an operator sets in `conf/agent-env.sh` (the wrapper reads it;
//! the supervisor, the agent and the updater inherit them), and what the updater tells
//! the wrapper it starts.

/// The installation the programs act on (`AGENT_HOME`); the wrapper sets it from where
/// it lies.
pub const AGENT_HOME: &str = "AGENT_HOME";
/// Set by the updater on the wrapper (or service) commands it runs: `start` runs no
/// recovery (the updater owns the transaction) and judges no contact, `stop` writes no
/// stop request (a rollback's stop was not asked for by anyone).
pub const AGENT_UPDATER_ACTIVE: &str = "AGENT_UPDATER_ACTIVE";
/// Set (`1`) by the supervisor (`agent-wrapper.sh`'s, or the Windows service) on the
/// agent it runs: an agent asked to restart exits with `layout::EXIT_RESTART` and is
/// started again; one run by hand has nobody to start it again and says so instead.
pub const AGENT_SUPERVISED: &str = "AGENT_SUPERVISED";
/// Seconds `start` waits for the agent to report itself.
pub const AGENT_START_TIMEOUT: &str = "AGENT_START_TIMEOUT";
/// Seconds `stop` waits for the agent to end after TERM before it KILLs.
pub const AGENT_STOP_TIMEOUT: &str = "AGENT_STOP_TIMEOUT";
/// The longest pause, in seconds, between restarts of a crashing agent.
pub const AGENT_RESTART_BACKOFF_MAX: &str = "AGENT_RESTART_BACKOFF_MAX";
/// Seconds `start` waits for the agent's first contact with a server, to say at once
/// when there is none and why.
pub const AGENT_START_CONTACT_WAIT: &str = "AGENT_START_CONTACT_WAIT";
