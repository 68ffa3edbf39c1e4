//! agent-fleet: the fleet model that every edge of the update server drives.
//!
//! It owns what moves agents: the staged rollouts of bundles and of configuration sets
//! (plans, waves, pure step decisions, the rows that record them), the deployments that
//! say which release each agent follows and the policy that edits them as live data,
//! the configuration sets themselves, maintenance windows, and the outage spool that
//! holds writes while the database is away. [`Fleet`] bundles them for an edge: it
//! writes what agents tell (now, or queued) and keeps the settings read.
//!
//! The database and the records no rollout decides (agents, credentials, labels,
//! settings, operators, audit, approvals, webhooks, commands, telemetry, releases) are
//! `fleet-store`'s; this crate re-exports its modules under the paths they always had,
//! so an edge names one crate.
//!
//! It must not touch HTTP: no axum, hyper or http types in its signatures, no status
//! codes, no sockets. An edge (the native JSON API in `update-server`, and any other
//! protocol) translates requests into calls here and [`FleetError`]s into answers. It
//! never reads the served bundle's files; an edge tells it what is served
//! ([`rollout::Served`]). Decisions (a rollout's next step, an agent's wave, a
//! deployment's choice) stay pure functions, unit tested without a database.

pub use fleet_store::{
    FleetError, approvals, audit, backup, chores, commands, credentials, db, error, history,
    labels, news, opamp, operators, releases, sessions, settings, telemetry, webhooks,
};

pub mod config;
mod deployment_table;
pub mod deployments;
pub mod fleet;
pub mod maintenance;
pub mod outage;
pub mod policy;
pub mod rollout;

pub use fleet::Fleet;
