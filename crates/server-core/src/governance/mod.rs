//! Governance's background work on this server: webhook events fed from the fleet's
//! records and delivered ([`delivery`]), the audit log kept for `audit.keep`
//! ([`retention`]), and changes that waited too long for approval recorded as lapsed
//! ([`lapse`]). The decisions (what is an event, when to try again, which server
//! does a fleet-wide chore) are the fleet model's ([`agent_fleet::webhooks`],
//! [`agent_fleet::chores`]); these modules run them on clocks (started by
//! [`crate::background::spawn_governance`]) and speak HTTP to the receivers.

pub mod delivery;
pub mod lapse;
pub mod retention;

use std::time::Duration;

use agent_fleet::webhooks::Webhooks;

/// What governance holds for the server's lifetime.
pub struct Governance {
    pub webhooks: Webhooks,
    /// `audit.keep`; zero keeps entries for ever.
    pub audit_keep: Duration,
    /// `webhooks.retry-for`.
    pub retry_for: Duration,
    /// Wakes the delivery loop (an event queued here, a delivery done).
    pub wake: tokio::sync::Notify,
}

impl Governance {
    pub fn new(webhooks: Webhooks, audit_keep: Duration, retry_for: Duration) -> Self {
        Self {
            webhooks,
            audit_keep,
            retry_for,
            wake: tokio::sync::Notify::new(),
        }
    }
}
