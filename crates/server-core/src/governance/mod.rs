//! Governance's background work on this server: webhook events fed from the fleet's
//! records and delivered ([`delivery`]), the audit log kept for `audit.keep`
//! ([`retention`]), and changes that waited too long for approval recorded as lapsed
//! ([`lapse`]). The decisions (what is an event, when to try again, which server
//! does a fleet-wide chore) are the fleet model's ([`agent_fleet::webhooks`],
//! [`agent_fleet::chores`]); this module runs them on clocks and speaks HTTP to the
//! receivers.

pub mod delivery;
pub mod lapse;
pub mod retention;

use std::sync::Arc;
use std::time::Duration;

use agent_fleet::webhooks::Webhooks;

use crate::state::AppState;

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

/// Starts the delivery loop, the retention chore and the approvals' lapse.
pub fn spawn(state: &AppState) {
    let s = Arc::clone(&state.inner);
    crate::panics::spawn_restarting("webhook delivery", move || delivery::run(Arc::clone(&s)));
    let s = Arc::clone(&state.inner);
    crate::panics::spawn_restarting("audit retention", move || retention::run(Arc::clone(&s)));
    let s = Arc::clone(&state.inner);
    crate::panics::spawn_restarting("approval lapse", move || lapse::run(Arc::clone(&s)));
}
