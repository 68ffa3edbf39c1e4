//! The server's own work beside the requests: the rollout loop (deadlines, soaks,
//! waves), the pacer that spaces held agents' turns, and the scan of the download
//! directory (a settled change is taken as a publish).

use std::sync::Arc;
use std::time::Duration;

use crate::transport::pacer;
use crate::{SCAN_INTERVAL, releases, served, store};

use crate::{AppState, panics};

/// How often the rollout is looked at (deadlines, soaks, another server's decisions),
/// besides soon after a report.
pub const ROLLOUT_INTERVAL: Duration = Duration::from_secs(1);
/// Looks a second the loop makes at once when reports wake it; past that, a woken look
/// waits for the second to end. Each look counts the rollout's agents in the database,
/// and while a wave of 90,000 installs every server is woken by reports many times a
/// second (looks back to back kept PostgreSQL busy); a few reports are looked at at once.
pub(crate) const ROLLOUT_LOOKS_PER_SECOND: usize = 4;

/// When a look that a report woke at `now` begins, given when the last looks began
/// (oldest first): at once, unless [`ROLLOUT_LOOKS_PER_SECOND`] of them began within the
/// last second; then once that second has passed since the earliest of those.
pub(crate) fn woken_look_at(
    recent: &std::collections::VecDeque<tokio::time::Instant>,
    now: tokio::time::Instant,
) -> tokio::time::Instant {
    match recent.len().checked_sub(ROLLOUT_LOOKS_PER_SECOND) {
        Some(i) => (recent[i] + Duration::from_secs(1)).max(now),
        None => now,
    }
}

/// How often an agent's unchanged contact is written, in half heartbeats: every
/// heartbeat and a half. A long-polling agent re-holds every heartbeat, so its row is
/// written every other connect and is at most two and a half heartbeats old: under the
/// silence the page calls stale.
pub const CONTACT_REFRESH_HALF_BEATS: u64 = 3;

pub(crate) fn contact_refresh(heartbeat_secs: u64) -> Duration {
    Duration::from_secs(heartbeat_secs.saturating_mul(CONTACT_REFRESH_HALF_BEATS) / 2)
}

/// How often credentials are looked at for `agents.rotate-every`.
const ROTATION_LOOK: Duration = Duration::from_secs(60);

/// With `agents.rotate-every` set, asks a rotation of every credential older than that
/// (see [`agent_fleet::commands`]), as the server itself (audited as `server:<name>`).
/// Several servers of a fleet may ask the same one: a rotation under way is not asked
/// again, and a second ask replaces the first before it was carried.
pub fn spawn_rotations(state: &AppState) {
    let Some(every) = state.inner.rotate_every else {
        return;
    };
    let s = Arc::clone(&state.inner);
    panics::spawn_restarting("rotations", move || {
        let s = Arc::clone(&s);
        async move {
            let mut tick = tokio::time::interval(ROTATION_LOOK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if s.fleet.outage.is_down() {
                    continue;
                }
                if let Err(e) = rotate_old(&s, every).await {
                    tracing::warn!("agents.rotate-every: {e}");
                }
            }
        }
    });
}

async fn rotate_old(
    s: &crate::state::Shared,
    every: Duration,
) -> Result<(), agent_fleet::FleetError> {
    let now = agent_fleet::db::now_secs();
    s.fleet.db.start_credential_clocks(now).await?;
    let every = i64::try_from(every.as_secs()).unwrap_or(i64::MAX);
    for agent in s
        .fleet
        .db
        .credentials_older_than(now.saturating_sub(every))
        .await?
    {
        let kind = agent_fleet::commands::Kind::RotateCredentials;
        let Some(command) = s.fleet.request_command(&agent, kind, "").await? else {
            continue;
        };
        let who = format!("server:{}", s.server_name);
        crate::actions::audit(
            s,
            &agent_fleet::audit::Change {
                who: &who,
                address: "",
                action: "agent.rotate_credentials",
                outcome: agent_fleet::audit::Outcome::Done,
                details: serde_json::json!({
                    "agent": agent,
                    "command": command.id,
                    "reason": "agents.rotate-every",
                }),
            },
        )
        .await;
    }
    Ok(())
}

/// Hands held agents their turns to be told, as download slots free up (see [`pacer`]).
pub fn spawn_pacer(state: &AppState) {
    let s = Arc::clone(&state.inner);
    panics::spawn_restarting("pacer", move || {
        let s = Arc::clone(&s);
        async move {
            s.pacer
                .run(|| {
                    pacer::free_slots(
                        s.download_limit.load(std::sync::atomic::Ordering::Relaxed),
                        s.limiter.in_flight(),
                        s.fleet.auto_update(),
                    )
                })
                .await;
        }
    });
}

/// Keeps the fleet's rollouts moving (the bundle's and each configuration set's):
/// follows the served bundle, times out agents, opens and completes waves.
pub fn spawn_rollout_loop(state: &AppState) {
    let s = Arc::clone(&state.inner);
    panics::spawn_restarting("rollout loop", move || rollout_loop(Arc::clone(&s)));
}

pub(crate) async fn rollout_loop(s: Arc<crate::state::Shared>) {
    let store = Arc::clone(&s.store);
    let rollouts = Arc::clone(&s.fleet.rollouts);
    let outage = Arc::clone(&s.fleet.outage);
    let configs = Arc::clone(&s.fleet.configs);
    let deployments = Arc::clone(&s.fleet.deployments);
    {
        let mut tick = tokio::time::interval(ROLLOUT_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_error = String::new();
        // What was last said of each deployment's release that would not load.
        let mut said = std::collections::HashMap::new();
        let mut recent = std::collections::VecDeque::with_capacity(ROLLOUT_LOOKS_PER_SECOND + 1);
        loop {
            let woken = tokio::select! {
                _ = tick.tick() => false,
                () = rollouts.woken() => true,
                () = configs.woken() => true,
            };
            if woken {
                // Reports that come meanwhile are in this look too: their wake-ups
                // coalesce while it waits.
                tokio::time::sleep_until(woken_look_at(&recent, tokio::time::Instant::now())).await;
            }
            recent.push_back(tokio::time::Instant::now());
            if recent.len() > ROLLOUT_LOOKS_PER_SECOND {
                recent.pop_front();
            }
            let result = async {
                if let store::Current::Ready(release) = store.current() {
                    rollouts.serve(served(&release)).await?;
                }
                rollouts.refresh().await?;
                rollouts.decide().await?;
                // The other deployments: each serves the release it names.
                deployments.refresh().await?;
                serve_deployments(&s, &mut said).await;
                deployments.decide().await?;
                // Config rollouts beside it: a set pushed on another server, its waves.
                configs.refresh().await?;
                configs.decide().await
            }
            .await;
            match result {
                Ok(()) => last_error.clear(),
                // Said once by the outage itself; the rollout waits for the database.
                Err(e) if e.is_unavailable() => outage.went_down(&e),
                Err(e) => {
                    let e = e.to_string();
                    if e != last_error {
                        tracing::error!("rollout: {e}; trying again");
                        last_error = e;
                    }
                }
            }
        }
    }
}

/// Every deployment but `default` serves the kept release it names: loaded (from the
/// fleet database if another server published it) and handed to its rollouts. What
/// fails is said once (`said`, by deployment) and tried again at every look.
async fn serve_deployments(
    s: &crate::state::Shared,
    said: &mut std::collections::HashMap<String, String>,
) {
    let mut named = Vec::new();
    for (deployment, rollouts) in s.fleet.deployments.all() {
        let Some(id) = deployment.release.as_deref() else {
            continue;
        };
        named.push(id.to_owned());
        let failed = match s.catalog.load(&s.releases, id).await {
            Ok(release) => match rollouts.serve(served(&release)).await {
                Ok(()) => None,
                Err(e) => Some(format!("cannot start the rollout of {id}: {e}")),
            },
            Err(e) => Some(format!("cannot serve release {id}: {e}")),
        };
        match failed {
            Some(why) if said.get(&deployment.name) != Some(&why) => {
                tracing::warn!(deployment = %deployment.name, "{why}; trying again every second");
                said.insert(deployment.name.clone(), why);
            }
            Some(_) => {}
            None => {
                if said.remove(&deployment.name).is_some() {
                    tracing::info!(deployment = %deployment.name, "release {id} is served again");
                }
            }
        }
    }
    said.retain(|name, _| s.fleet.deployments.rollouts(name).is_some());
    s.catalog.retain(&named, &s.releases.cache_dir());
}

/// Looks at the download directory once: a release put there by hand is published by
/// [`releases::HAND_DROP_WHO`] when it passes a publish's checks, and refused when it
/// does not (logged, `/healthz` degraded, nothing of it served, no rollout). Both are in
/// the audit log as `server:<name>`'s. Returns the history entry it published, if any.
pub(crate) async fn take_hand_drop(
    store: &Arc<store::BundleStore>,
    publisher: &releases::Publisher,
    audit: &agent_fleet::audit::Audit,
    server: &str,
) -> Result<Option<agent_fleet::releases::HistoryEntry>, releases::ReleaseError> {
    use agent_fleet::audit::{Change, Outcome};
    let scanned = Arc::clone(store);
    let Some(dropped) = tokio::task::spawn_blocking(move || scanned.scan())
        .await
        .map_err(|e| releases::ReleaseError::Io(format!("the bundle scan stopped: {e}")))?
    else {
        return Ok(None);
    };
    let who = format!("server:{server}");
    let dir = store.dir().display().to_string();
    let (outcome, details, published) = match publisher.take_hand_drop(&dropped).await? {
        releases::HandDrop::Installed(id) => {
            tracing::debug!("{dir} holds release {id} as this server installed it");
            return Ok(None);
        }
        releases::HandDrop::Gone => return Ok(None),
        releases::HandDrop::Refused(why) => {
            let refusing = Arc::clone(store);
            let (refused, said) = (dropped.clone(), why.clone());
            // Takes the store's scan lock, which a publish may hold while it writes.
            let _ = tokio::task::spawn_blocking(move || refusing.refuse(&refused, &said)).await;
            let details = serde_json::json!({
                "files": dropped.names,
                "source": "download-dir",
                "reason": why,
            });
            (Outcome::Refused, details, None)
        }
        releases::HandDrop::Published(entry) => {
            tracing::info!(
                release = %entry.release.id,
                by = releases::HAND_DROP_WHO,
                "the release dropped into {dir} by hand passed a publish's checks and is published as {}: it is in the release history (`update-server release list`), `release rollback` can return to it, and its rollout starts under [rollout]",
                entry.release.id
            );
            let details = serde_json::json!({
                "release": entry.release.id,
                "files": dropped.names,
                "source": "download-dir",
            });
            (Outcome::Done, details, Some(entry))
        }
    };
    let change = Change {
        who: &who,
        address: "",
        action: "release.publish",
        outcome,
        details,
    };
    if let Err(e) = audit.record(&change).await {
        tracing::error!(who = %who, "cannot write the audit log: {e}");
    }
    Ok(published)
}

/// Follows the fleet's published release and takes what is dropped into the download
/// directory, each second.
pub async fn release_scan(
    store: Arc<store::BundleStore>,
    publisher: Arc<releases::Publisher>,
    audit: agent_fleet::audit::Audit,
    server: String,
    news: Arc<agent_fleet::news::News>,
) {
    let mut tick = tokio::time::interval(SCAN_INTERVAL);
    let mut said: Option<String> = None;
    let mut said_drop: Option<String> = None;
    loop {
        tick.tick().await;
        // A release published on another server of the fleet, then the directory.
        match publisher.follow().await {
            Err(e) if said.as_deref() != Some(e.to_string().as_str()) => {
                tracing::error!(
                    "cannot serve the fleet's published release (tried again every second): {e}"
                );
                said = Some(e.to_string());
            }
            Err(_) => {}
            Ok(_) => said = None,
        }
        match take_hand_drop(&store, &publisher, &audit, &server).await {
            Ok(published) => {
                said_drop = None;
                if published.is_some() {
                    news.publish("a release dropped by hand was published");
                }
            }
            Err(e) if said_drop.as_deref() != Some(e.to_string().as_str()) => {
                tracing::error!(
                    "cannot take the release in {} (tried again every second): {e}",
                    store.dir().display()
                );
                said_drop = Some(e.to_string());
            }
            Err(_) => {}
        }
    }
}

/// Starts the delivery loop, the retention chore and the approvals' lapse.
pub fn spawn_governance(state: &AppState) {
    let s = Arc::clone(&state.inner);
    crate::panics::spawn_restarting("webhook delivery", move || {
        crate::governance::delivery::run(Arc::clone(&s))
    });
    let s = Arc::clone(&state.inner);
    crate::panics::spawn_restarting("audit retention", move || {
        crate::governance::retention::run(Arc::clone(&s))
    });
    let s = Arc::clone(&state.inner);
    crate::panics::spawn_restarting("approval lapse", move || {
        crate::governance::lapse::run(Arc::clone(&s))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_few_reports_are_looked_at_at_once_and_a_stream_of_them_a_few_times_a_second() {
        let t0 = tokio::time::Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut recent = std::collections::VecDeque::new();
        // Fewer looks than the second allows: at once.
        for n in 0..ROLLOUT_LOOKS_PER_SECOND as u64 {
            assert_eq!(woken_look_at(&recent, ms(n * 10)), ms(n * 10));
            recent.push_back(ms(n * 10));
        }
        // The second is used up: the next waits until a second after its first look.
        assert_eq!(woken_look_at(&recent, ms(50)), ms(1000));
        // Woken after that: at once.
        assert_eq!(woken_look_at(&recent, ms(1200)), ms(1200));
        // The window slides: once the oldest is dropped, the second's earliest is 10 ms.
        recent.pop_front();
        recent.push_back(ms(1000));
        assert_eq!(woken_look_at(&recent, ms(1001)), ms(1010));
    }
}
