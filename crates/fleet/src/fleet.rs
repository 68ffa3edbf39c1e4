//! [`Fleet`]: the model an edge drives. It writes what agents tell the server into the
//! fleet database, now or, while the database is away, later (see [`crate::outage`]):
//! the one place that knows how each queued write is applied, used by the edges and by
//! the drain alike.
//!
//! It owns the drain task and the settings poll (the fleet-wide switch another server
//! may have turned). It never answers a request.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::config::Configs;
use crate::db::{Contact, Db};
use crate::error::FleetError;
use crate::outage::{Deferred, Outage};
use crate::rollout::Rollouts;
use crate::settings;

/// How often the drain looks at the database while it is away (and at the spool).
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// How often the fleet-wide settings are read again: a change made on another server
/// is in force here within this (DESIGN.md asks for 5 s).
pub const SETTINGS_INTERVAL: Duration = Duration::from_secs(2);

/// The fleet as one server sees it: its database, what waits for the database, the
/// rollouts and the fleet-wide switch as last read.
pub struct Fleet {
    pub db: Db,
    /// The database's absence, and what waits for it.
    pub outage: Arc<Outage>,
    pub rollouts: Arc<Rollouts>,
    /// Configuration sets and their config rollouts.
    pub configs: Arc<Configs>,
    auto_update: AtomicBool,
}

impl Fleet {
    /// The fleet over `db`, with the fleet-wide switch read once.
    pub async fn new(
        db: Db,
        outage: Arc<Outage>,
        rollouts: Arc<Rollouts>,
        configs: Arc<Configs>,
    ) -> Result<Self, FleetError> {
        let on = settings::auto_update_on(db.setting(settings::AUTO_UPDATE).await?.as_deref());
        Ok(Self {
            db,
            outage,
            rollouts,
            configs,
            auto_update: AtomicBool::new(on),
        })
    }

    /// The fleet-wide switch as last read or set.
    pub fn auto_update(&self) -> bool {
        self.auto_update.load(Ordering::Relaxed)
    }

    /// Turns the fleet-wide switch, for every server of the fleet.
    pub async fn set_auto_update(&self, on: bool) -> Result<(), FleetError> {
        self.db
            .set_setting(settings::AUTO_UPDATE, if on { "true" } else { "false" })
            .await?;
        if self.auto_update.swap(on, Ordering::Relaxed) != on {
            self.rollouts.news().publish("the fleet switch flipped");
        }
        Ok(())
    }

    /// The download limit stored for `server` (or, from before limits were per server,
    /// the single one), if any.
    pub async fn download_limit(&self, server: &str) -> Result<Option<usize>, FleetError> {
        // A limit set before limits were per server was this server's.
        let own = self
            .db
            .setting(&settings::download_limit_key(server))
            .await?;
        let value = match own {
            Some(v) => Some(v),
            None => self.db.setting(settings::DOWNLOAD_LIMIT).await?,
        };
        Ok(value.and_then(|v| v.parse().ok()))
    }

    pub async fn set_download_limit(&self, server: &str, limit: usize) -> Result<(), FleetError> {
        self.db
            .set_setting(&settings::download_limit_key(server), &limit.to_string())
            .await
    }

    /// Writes `w` now, or queues it when the database is away (or goes away now). An
    /// error only for a fault that is not the database's absence.
    pub async fn save(&self, w: Deferred) -> Result<(), FleetError> {
        if self.outage.is_down() {
            self.outage.defer(w);
            return Ok(());
        }
        match write(&self.db, &self.rollouts, &self.configs, &w).await {
            Ok(()) => Ok(()),
            Err(e) if e.is_unavailable() => {
                self.outage.went_down(&e);
                self.outage.defer(w);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Writes the spool back, oldest first, while the database answers; then lets calls
    /// go to the database again.
    pub async fn drain(&self) {
        drain(&self.db, &self.rollouts, &self.configs, &self.outage).await;
    }

    /// Drains the spool every [`PROBE_INTERVAL`] when there is something to write or the
    /// database is away.
    pub fn spawn_drain(self: &Arc<Self>) {
        let fleet = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(PROBE_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if fleet.outage.is_down() || fleet.outage.queued() > 0 {
                    fleet.drain().await;
                }
            }
        });
    }

    /// Reads the fleet-wide switch again every [`SETTINGS_INTERVAL`], so that a change
    /// made on another server of the fleet is in force here.
    pub fn spawn_settings_poll(self: &Arc<Self>) {
        let fleet = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SETTINGS_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if fleet.outage.is_down() {
                    continue;
                }
                match fleet.db.setting(settings::AUTO_UPDATE).await {
                    Ok(value) => {
                        let on = settings::auto_update_on(value.as_deref());
                        let was = fleet.auto_update.swap(on, Ordering::Relaxed);
                        if was != on {
                            tracing::info!(
                                "auto_update is now {on} (changed on another server of the fleet)"
                            );
                            fleet.rollouts.news().publish("the fleet switch flipped");
                        }
                    }
                    Err(e) if e.is_unavailable() => fleet.outage.went_down(&e),
                    Err(e) => tracing::warn!("reading the fleet's settings: {e}"),
                }
            }
        });
    }
}

/// Applies one write. Every write is idempotent, so a replay after a crash is harmless.
pub async fn write(
    db: &Db,
    rollouts: &Rollouts,
    configs: &Configs,
    w: &Deferred,
) -> Result<(), FleetError> {
    match w {
        Deferred::Contact {
            id,
            name,
            platform,
            version,
            group,
            config_hash,
            at,
            health,
        } => {
            db.touch_agent(&Contact {
                id,
                name,
                platform,
                version,
                group: group.as_deref(),
                config_hash: config_hash.as_deref(),
                at: *at,
            })
            .await?;
            match health {
                Some(health) => db.record_health(id, health, *at).await,
                None => Ok(()),
            }
        }
        Deferred::ConfigStatus { status, at_ms } => configs.report(status, *at_ms).await,
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

/// Writes the spool back, oldest first, while the database answers; then lets calls go
/// to the database again.
pub async fn drain(db: &Db, rollouts: &Rollouts, configs: &Configs, outage: &Outage) {
    if outage.is_down() && outage.queued() == 0 {
        if let Err(e) = db.ping().await {
            if !e.is_unavailable() {
                tracing::warn!("database probe: {e}");
            }
            return;
        }
    }
    while let Some((seq, w)) = outage.front() {
        match write(db, rollouts, configs, &w).await {
            Ok(()) => outage.written(seq),
            Err(e) if e.is_unavailable() => {
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
