//! What the agent keeps and shows on the machine: where it is installed, its health
//! file, its last errors, and `agent status` over them (its logs rotate through
//! `agent_updater::logfiles`, which every program of an installed agent shares).

pub use agent_workload::health;
pub mod home;
pub mod last_errors;
pub mod status;
