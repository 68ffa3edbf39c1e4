//! `agent run`: register, heartbeat, and follow the version directive.

use std::time::{Duration, Instant};

use agent_extract::atomic;
use agent_protocol::AgentVersion;
use agent_protocol::journal::Health;
use agent_protocol::layout::{self, AgentHome};
use agent_protocol::wire::AgentHello;
use agent_updater::state;
use tokio::sync::watch;

use crate::backoff::Backoff;
use crate::client::{Client, Directive};
use crate::config::Config;
use crate::home::Installation;
use crate::identity;
use crate::update::{self, Outcome, UpdateContext};

/// How `agent run` ended; the wrapper reads the exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunEnd {
    /// Asked to stop (TERM/INT). Exit 0.
    Stopped,
    /// The updater runs and will start the new version. Exit 0.
    HandedOff { to: AgentVersion },
    /// Refused by the server with updates disabled. Exit 3: do not restart.
    RefusedUpdatesDisabled { expected: String },
}

impl RunEnd {
    pub fn exit_code(&self) -> u8 {
        match self {
            RunEnd::Stopped | RunEnd::HandedOff { .. } => 0,
            RunEnd::RefusedUpdatesDisabled { .. } => 3,
        }
    }
}

/// What the updater reads to judge the new version's health.
fn write_health(home: &AgentHome, health: &Health) {
    let json = serde_json::to_vec_pretty(health).unwrap_or_default();
    if let Err(e) = std::fs::create_dir_all(home.run())
        .map_err(|e| e.to_string())
        .and_then(|()| atomic::write(&home.health_file(), &json).map_err(|e| e.to_string()))
    {
        tracing::warn!("cannot write {}: {e}", home.health_file().display());
    }
}

/// Sends the reports waiting in `data/outbox/`; what cannot be sent stays for later.
pub async fn flush_outbox(home: &AgentHome, client: &Client) {
    let pending = match state::pending_reports(home) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!("cannot read the outbox: {e}");
            return;
        }
    };
    for (path, report) in pending {
        match client.report(&report).await {
            Ok(()) => {
                tracing::info!(
                    "reported {} of {} -> {} to the server",
                    report.status.as_str(),
                    report.from,
                    report.to
                );
                if let Err(e) = state::remove_report(&path) {
                    tracing::warn!("{e}");
                }
            }
            Err(e) => {
                tracing::info!("report {} kept in the outbox: {e}", report.status.as_str());
                return;
            }
        }
    }
}

pub async fn run(install: Installation, config: Config) -> anyhow::Result<RunEnd> {
    let home = install.home.clone();
    let id = identity::load_or_create(&home)?;
    let name = if config.agent.name.is_empty() {
        identity::host_name()
    } else {
        config.agent.name.clone()
    };
    let hello = AgentHello {
        id: id.clone(),
        name,
        platform: layout::PLATFORM.to_owned(),
    };
    let mut client = Client::new(config.server.urls.clone(), install.version.clone(), hello)?;
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        wait_for_stop_signal().await;
        let _ = stop_tx.send(true);
    });

    let mut health = Health {
        version: install.version.clone(),
        pid: std::process::id(),
        components_started: true,
        last_contact: None,
        refused_by_server: None,
    };
    write_health(&home, &health);
    tracing::info!(
        "agent {} started (id {id}, home {}, servers {})",
        install.version,
        home.root().display(),
        config.server.urls.join(", ")
    );

    let heartbeat = config.agent.heartbeat.max(Duration::from_millis(100));
    let mut retry = Backoff::new(heartbeat, Duration::from_secs(15 * 60));
    let mut slow_retry = Backoff::new(heartbeat * 4, config.update.max_retry_after);
    let mut next_try: Option<Instant> = None;
    let mut first = true;
    let mut shutdown = stop_rx.clone();
    loop {
        match client.hello(first).await {
            Ok(directive) => {
                if first {
                    tracing::info!("registered with {}", client.base());
                }
                first = false;
                health.last_contact = Some(state::now_secs());
                flush_outbox(&home, &client).await;
                match directive {
                    Directive::Accepted => {
                        health.refused_by_server = None;
                        write_health(&home, &health);
                        retry.reset();
                        slow_retry.reset();
                        next_try = None;
                    }
                    Directive::Refused(ns) => {
                        health.refused_by_server = Some(ns.expected.clone());
                        write_health(&home, &health);
                        if let Some(end) = on_refused(
                            &install,
                            &config,
                            &client,
                            &id,
                            &ns.expected,
                            &mut next_try,
                            &mut retry,
                            &mut slow_retry,
                            &stop_rx,
                        )
                        .await
                        {
                            return Ok(end);
                        }
                    }
                }
            }
            Err(e) => tracing::warn!("{e}; trying again in {:?}", heartbeat),
        }
        if update::sleep_or_shutdown(heartbeat, &mut shutdown).await {
            tracing::info!("stopping on request");
            return Ok(RunEnd::Stopped);
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn on_refused(
    install: &Installation,
    config: &Config,
    client: &Client,
    id: &str,
    expected: &str,
    next_try: &mut Option<Instant>,
    retry: &mut Backoff,
    slow_retry: &mut Backoff,
    stop: &watch::Receiver<bool>,
) -> Option<RunEnd> {
    match state::open_transaction(&install.home) {
        Ok(Some(j)) => {
            tracing::warn!(
                "the server refuses {} and expects {expected}, while the update {} -> {} is being judged; the updater decides",
                install.version,
                j.from,
                j.to
            );
            return None;
        }
        Ok(None) => {}
        Err(e) => {
            tracing::error!("{e}");
            return None;
        }
    }
    if !config.update.enabled {
        tracing::error!(
            "the server requires agent version {expected} and refuses {}; updates are disabled (update.enabled = false), so this agent stops (exit 3). Enable updates or install {expected}",
            install.version
        );
        return Some(RunEnd::RefusedUpdatesDisabled {
            expected: expected.to_owned(),
        });
    }
    if next_try.is_some_and(|t| Instant::now() < t) {
        return None;
    }
    tracing::info!(
        "the server refuses {} and expects {expected}; updating",
        install.version
    );
    let expected_version = expected.parse::<AgentVersion>().ok();
    let mut ctx = UpdateContext {
        install,
        config,
        client,
        agent_id: id,
        shutdown: stop.clone(),
    };
    let ready = match update::fetch_verified(&mut ctx, expected_version.as_ref()).await {
        Ok(r) => r,
        Err(Outcome::ShuttingDown) => return Some(RunEnd::Stopped),
        Err(Outcome::Degraded { reason, slow }) => {
            let wait = if slow {
                slow_retry.next_wait(&mut rand::rng())
            } else {
                retry.next_wait(&mut rand::rng())
            };
            tracing::warn!(
                "running degraded: {reason}; checking again in {:.0}s",
                wait.as_secs_f64()
            );
            *next_try = Some(Instant::now() + wait);
            return None;
        }
    };
    match update::hand_off(&ctx, &ready).await {
        Ok(pid) => {
            tracing::info!(
                "updater started (pid {pid}) for {} -> {} (download {:.2}s, verify {:.3}s); serving until it has unpacked",
                install.version,
                ready.info.agent,
                ready.timings.download.as_secs_f64(),
                ready.timings.verify.as_secs_f64()
            );
            update::wait_for_unpack(&install.home, pid, Duration::from_secs(300)).await;
            tracing::info!("the new version is on disk; stopping so the updater can switch");
            Some(RunEnd::HandedOff {
                to: ready.info.agent.clone(),
            })
        }
        Err(e) => {
            let wait = retry.next_wait(&mut rand::rng());
            tracing::error!(
                "cannot hand over to the updater: {e}; trying again in {:.0}s",
                wait.as_secs_f64()
            );
            *next_try = Some(Instant::now() + wait);
            None
        }
    }
}

async fn wait_for_stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    match (term, int) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => std::future::pending().await,
    }
}
