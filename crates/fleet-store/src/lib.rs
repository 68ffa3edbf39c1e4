//! fleet-store: the fleet database and the records kept in it that no rollout decides.
//!
//! It owns the database (SQLite or PostgreSQL, its schema and [`migrations`], the pool,
//! the group commit of writes), the fleet's one error type ([`FleetError`]), every agent's
//! row with its labels and credentials, the fleet-wide settings and their names, the
//! news revision that wakes held connects, and the records people keep: operators and
//! their sessions, the audit log, approvals, webhooks, commands, where agents export
//! their own telemetry, the published releases and backups.
//!
//! It must not touch HTTP (no axum, hyper or http types, no status codes, no sockets)
//! and must not decide a rollout: rollouts, deployments, configuration sets, maintenance
//! windows and the outage spool are `agent-fleet`'s, which stands on this crate and
//! re-exports its modules under the paths they always had. Decisions here (the
//! credentials verdict, a label selector's match) are pure functions, unit tested
//! without a database.

pub mod approvals;
pub mod audit;
pub mod backup;
pub mod chores;
pub mod commands;
pub mod credentials;
pub mod db;
pub mod error;
pub mod group;
pub mod history;
pub mod labels;
mod migrations;
pub mod news;
pub mod opamp;
pub mod operators;
pub mod releases;
pub mod sessions;
pub mod settings;
pub mod telemetry;
pub mod webhooks;

pub use error::FleetError;
