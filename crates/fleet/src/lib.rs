//! agent-fleet: the fleet model that every edge of the update server drives.
//!
//! It owns the fleet database (SQLite or PostgreSQL, its schema and migrations), every
//! agent's row, their credentials, the fleet-wide settings and their names, the changes
//! waiting for a second operator's approval ([`approvals`]), the staged
//! rollouts of bundles and of configuration sets (plans, waves, pure step decisions,
//! the rows that record them), the configuration sets themselves, and the outage spool that holds writes while the database is away. [`Fleet`] bundles them
//! for an edge: it writes what agents tell (now, or queued) and keeps the settings read.
//!
//! It must not touch HTTP: no axum, hyper or http types in its signatures, no status
//! codes, no sockets. An edge (the native JSON API in `update-server`, and any other
//! protocol) translates requests into calls here and [`FleetError`]s into answers. It
//! never reads the served bundle's files; an edge tells it what is served
//! ([`rollout::Served`]). Decisions (a rollout's next step, an agent's wave, the
//! credentials verdict) stay pure functions, unit tested without a database.

pub mod approvals;
pub mod audit;
pub mod backup;
pub mod chores;
pub mod commands;
pub mod config;
pub mod credentials;
pub mod db;
mod deployment_table;
pub mod deployments;
pub mod error;
pub mod fleet;
mod group;
pub mod history;
pub mod labels;
pub mod maintenance;
mod migrations;
pub mod news;
pub mod opamp;
pub mod operators;
pub mod outage;
pub mod policy;
pub mod releases;
pub mod rollout;
pub mod sessions;
pub mod settings;
pub mod telemetry;
pub mod webhooks;

pub use error::FleetError;
pub use fleet::Fleet;
