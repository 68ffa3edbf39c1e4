//! Writing what agents tell the server into the fleet database, now or, while the
//! database is away, later (see [`crate::outage`]): the one place that knows how each
//! queued write is applied, used by the handlers and by the drain alike.
//!
//! It owns the drain task and the settings poll (the fleet-wide switch another server
//! may have turned). It never answers a request.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::db::Db;
use crate::outage::{self, Deferred, Outage};
use crate::rollout::Rollouts;
use crate::routes::{SETTING_AUTO_UPDATE, Shared};

/// How often the drain looks at the database while it is away (and at the spool).
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// How often the fleet-wide settings are read again: a change made on another server
/// is in force here within this (DESIGN.md asks for 5 s).
pub const SETTINGS_INTERVAL: Duration = Duration::from_secs(2);

/// Applies one write. Every write is idempotent, so a replay after a crash is harmless.
pub async fn write(db: &Db, rollouts: &Rollouts, w: &Deferred) -> Result<(), sqlx::Error> {
    match w {
        Deferred::Contact {
            id,
            name,
            platform,
            version,
            group,
            at,
            health,
        } => {
            db.touch_agent(id, name, platform, version, group.as_deref(), *at)
                .await?;
            match health {
                Some(health) => db.record_health(id, health, *at).await,
                None => Ok(()),
            }
        }
        Deferred::Report { report, at_ms } => {
            db.record_report(report, at_ms / 1000).await?;
            rollouts.report(report, *at_ms).await
        }
        Deferred::Told {
            rollout,
            agent,
            at_ms,
        } => rollouts.record_told(*rollout, agent, *at_ms).await,
    }
}

/// Writes `w` now, or queues it when the database is away (or goes away now). An
/// error only for a fault that is not the database's absence.
pub async fn save(s: &Shared, w: Deferred) -> Result<(), sqlx::Error> {
    if s.outage.is_down() {
        s.outage.defer(w);
        return Ok(());
    }
    match write(&s.db, &s.rollouts, &w).await {
        Ok(()) => Ok(()),
        Err(e) if outage::is_unavailable(&e) => {
            s.outage.went_down(&e);
            s.outage.defer(w);
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Writes the spool back, oldest first, while the database answers; then lets calls go
/// to the database again.
pub async fn drain(db: &Db, rollouts: &Rollouts, outage: &Outage) {
    if outage.is_down() && outage.queued() == 0 {
        if let Err(e) = db.ping().await {
            if !outage::is_unavailable(&e) {
                tracing::warn!("database probe: {e}");
            }
            return;
        }
    }
    while let Some((seq, w)) = outage.front() {
        match write(db, rollouts, &w).await {
            Ok(()) => outage.written(seq),
            Err(e) if outage::is_unavailable(&e) => {
                outage.went_down(&e);
                return;
            }
            Err(e) => {
                // A write the database refuses for good would block the spool for ever.
                tracing::error!(
                    "a queued write is refused by the database ({e}); dropping it: {w:?}"
                );
                outage.written(seq);
            }
        }
    }
    outage.came_back();
}

/// Drains the spool every [`PROBE_INTERVAL`] when there is something to write or the
/// database is away.
pub fn spawn_drain(shared: &Arc<Shared>) {
    let shared = Arc::clone(shared);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(PROBE_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if shared.outage.is_down() || shared.outage.queued() > 0 {
                drain(&shared.db, &shared.rollouts, &shared.outage).await;
            }
        }
    });
}

/// Reads the fleet-wide switch again every [`SETTINGS_INTERVAL`], so that a change made
/// on another server of the fleet is in force here.
pub fn spawn_settings_poll(shared: &Arc<Shared>) {
    let shared = Arc::clone(shared);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(SETTINGS_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if shared.outage.is_down() {
                continue;
            }
            match shared.db.setting(SETTING_AUTO_UPDATE).await {
                Ok(value) => {
                    let on = value.is_none_or(|v| v != "false");
                    let was = shared.auto_update.swap(on, Ordering::Relaxed);
                    if was != on {
                        tracing::info!(
                            "auto_update is now {on} (changed on another server of the fleet)"
                        );
                    }
                }
                Err(e) if outage::is_unavailable(&e) => shared.outage.went_down(&e),
                Err(e) => tracing::warn!("reading the fleet's settings: {e}"),
            }
        }
    });
}
