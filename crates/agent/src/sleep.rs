//! Pauses that end early when the agent is asked to stop: the update path, its delta and
//! the contact loop wait here, so a TERM never sits out a backoff.

use std::time::Duration;

use tokio::sync::watch;

/// Sleeps, or returns true at once when shutdown is asked for.
pub async fn sleep_or_shutdown(wait: Duration, shutdown: &mut watch::Receiver<bool>) -> bool {
    if *shutdown.borrow() {
        return true;
    }
    tokio::select! {
        _ = tokio::time::sleep(wait) => false,
        _ = shutdown.changed() => true,
    }
}
