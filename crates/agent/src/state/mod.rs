//! What the agent keeps and shows on the machine: where it is installed, its health
//! file, its last errors, its logs, and `agent status` over them.

pub mod health;
pub mod home;
pub mod last_errors;
pub mod logfiles;
pub mod status;
