//! `agent run`: register, heartbeat, and follow the version directive.

use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_protocol::AgentVersion;
use agent_protocol::busy;
use agent_protocol::journal::{Health, WaitingWindow};
use agent_protocol::layout::{self, AgentHome};
use agent_protocol::wire::{self, AgentHello, Report, UpdateStatus};
use agent_updater::{lock, state};
use rand::Rng;
use tokio::sync::watch;

use crate::commands;
use crate::config::{Config, Reload, parse_reload};
use crate::contact::backoff::change_jitter;
use crate::contact::client::{Answer, Client, Directive, Hold, Trust};
use crate::contact::identity;
use crate::contact::pacing::{self, LastContact};
use crate::remote_config::live::LiveWorkload;
use crate::remote_config::{self, Dirs, decide};
use crate::sleep;
use crate::state::health::HealthBoard;
use crate::state::home::Installation;
use crate::state::last_errors;
use crate::update::ahead::Ahead;
use crate::update::locks;
use crate::update::retry::{self, Failure, Gate, Offer, Retry};
use crate::update::{self, Outcome, UpdateContext};
use crate::workload::spec::Spec;

/// How `agent run` ended; the wrapper reads the exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunEnd {
    /// Asked to stop (TERM/INT). Exit 0.
    Stopped,
    /// The updater runs and will start the new version. Exit 0.
    HandedOff { to: AgentVersion },
    /// Refused by the server with updates disabled. Exit 3: do not restart.
    RefusedUpdatesDisabled { expected: String },
    /// An operator asked for a restart: the supervisor starts the agent again at once.
    Restart,
}

impl RunEnd {
    pub fn exit_code(&self) -> u8 {
        match self {
            RunEnd::Stopped | RunEnd::HandedOff { .. } => 0,
            RunEnd::RefusedUpdatesDisabled { .. } => layout::EXIT_REFUSED,
            RunEnd::Restart => layout::EXIT_RESTART,
        }
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
            // A server from before a status (RETRYING) refuses it as malformed, and
            // always will: said once and dropped, so it never blocks the reports after.
            Err(crate::contact::client::CommError::Status { status: code, .. })
                if matches!(code, 400 | 422) =>
            {
                tracing::warn!(
                    "the server refuses the report {} of {} -> {} ({code}); dropped",
                    report.status.as_str(),
                    report.from,
                    report.to
                );
                if let Err(e) = state::remove_report(&path) {
                    tracing::warn!("{e}");
                }
            }
            Err(e) => {
                tracing::info!(
                    "report {} kept in the outbox, sent again within {}s: {e}",
                    report.status.as_str(),
                    UNSENT_RETRY.as_secs()
                );
                return;
            }
        }
    }
}

/// Runs the agent: its workload first (whatever any server says), then the conversation
/// with the servers; the workload is stopped before this returns, unless the agent hands
/// over to the updater, which leaves it serving until the next agent replaces it.
pub async fn run(install: Installation, config: Config) -> anyhow::Result<RunEnd> {
    // Before anything shows this agent as up (its health file, its pid): a TERM from
    // then on is a request to stop, never a crash.
    let (stop_tx, stop_rx) = watch::channel(false);
    let stop_signal = crate::os::stop_signal();
    tokio::spawn(async move {
        stop_signal.await;
        let _ = stop_tx.send(true);
    });
    let home = install.home.clone();
    let spec = Spec::new(&config.workload, home.root(), &install.version_dir);
    let board = Arc::new(HealthBoard::new(
        home.clone(),
        Health {
            version: install.version.clone(),
            pid: std::process::id(),
            components_started: true,
            last_contact: None,
            refused_by_server: None,
            workload: Some(crate::workload::initial_report(&spec)),
            waiting_window: None,
            deployment: None,
        },
    ));
    let dirs = Dirs::new(&home, &config.workload.config_dir);
    if let Ok(dirs) = &dirs {
        // Before the workload reads it: a set half-applied when the agent died is mended.
        dirs.recover(&home);
    }
    let mut workload = LiveWorkload::start(
        spec,
        home.clone(),
        Arc::clone(&board),
        parse_reload(&config.workload.reload).unwrap_or(Reload::Restart),
        config.workload.check_command.clone(),
    );
    let end = serve(&install, &config, &board, &dirs, &mut workload, stop_rx).await;
    // Its last figures go before it leaves (the update it hands over, say).
    crate::telemetry::finish().await;
    match end {
        // The workload serves on through the switch: the new version's agent stops it
        // just before it starts its own (or this version's again, after a rollback).
        Ok(RunEnd::HandedOff { .. }) => workload.leave().await,
        _ => workload.stop().await,
    }
    end
}

async fn serve(
    install: &Installation,
    config: &Config,
    board: &Arc<HealthBoard>,
    dirs: &Result<Dirs, String>,
    workload: &mut LiveWorkload,
    stop_rx: watch::Receiver<bool>,
) -> anyhow::Result<RunEnd> {
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
        group: config.agent.group(),
        health: None,
        labels: Some(config.agent.labels.clone()),
        capabilities: Some(
            agent_protocol::wire::CAPABILITIES
                .iter()
                .map(|c| (*c).to_owned())
                .collect(),
        ),
        endpoint: None,
    };
    let mut client = Client::new(
        config.server.urls.clone(),
        install.version.clone(),
        hello,
        Trust::of(config, &home),
    )?;

    let restarts = {
        let board = Arc::clone(board);
        Arc::new(move || board.agent_health().restarts)
    };
    let mut telemetry = crate::telemetry::Telemetry::start(
        &home,
        client.http().clone(),
        &id,
        &install.version.to_string(),
        restarts,
    );

    // A failure told for the version this agent now runs is over.
    if last_errors::last_told(&home).is_some_and(|(_, told)| told.to == install.version.to_string())
    {
        last_errors::forget_told(&home);
    }
    let nudge = crate::update::recovery::Nudge::default();
    tokio::spawn(crate::update::recovery::finish_interrupted(
        home.clone(),
        nudge.clone(),
    ));
    let mut health_changed = board.subscribe();
    tracing::info!(
        "agent {} started (id {id}, home {}, servers {})",
        install.version,
        home.root().display(),
        config.server.urls.join(", ")
    );
    if let Some(route) = client.proxies().describe() {
        tracing::info!("proxy: {route}");
    }

    let heartbeat = config.agent.heartbeat.max(Duration::from_millis(100));
    let mut retry = Retry::new(heartbeat, config.update.max_retry_after)
        .with_max_defer(config.update.max_defer);
    let mut unsent = Unsent::default();
    let mut first = true;
    let mut shutdown = stop_rx.clone();
    let mut pace = Pace::default();
    let mut ahead = Ahead::default();
    loop {
        if !first && unsent.due(&home) {
            unsent.flushed(flush_unsent(&home, &client).await);
        }
        // Never held: the first contact (a register), and any contact with long polls off.
        // A failed round that is due again ends the hold: the server has nothing new to
        // say while a full disk empties.
        let asked = Instant::now();
        let hold = (config.agent.long_poll && !first).then(|| Hold {
            wait: retry::bounded(heartbeat, retry.next_due(asked), asked),
            known_offer: pace.known_offer.clone(),
            ahead: ahead.query(config),
        });
        client.set_health(board.agent_health());
        client.set_config_hash(remote_config::running_hash(&home));
        client.set_telemetry_hash(telemetry.hash());
        let stays_away_from = retry.quiet_bad.clone();
        let contact = tokio::select! {
            answer = client.contact(first, hold.as_ref()) => answer,
            _ = shutdown.wait_for(|stop| *stop) => {
                tracing::info!("stopping on request");
                return Ok(RunEnd::Stopped);
            }
            // A held connect carries the health of when it was sent: a change of the
            // workload's is told at once, with a new one.
            _ = health_changed.changed(), if hold.is_some() => continue,
            // So does a report the updater wrote meanwhile: it is sent at once, not when
            // the hold ends.
            () = unsent.written(&home), if hold.is_some() => continue,
            // `agent update --clear-bad` forgot the bundle this hold stays away from: the
            // server is asked again at once, and says it is news.
            // The update locks that held an update off are released: it starts now.
            () = locks_released(&home, held_off(&home, &retry)), if hold.is_some() => {
                tracing::info!("the update locks are released; updating");
                pace.known_offer = None;
                continue;
            }
            () = bad_cleared(&home, stays_away_from.as_deref()), if hold.is_some() => {
                tracing::info!("data/bad-versions no longer names the server's bundle; asking for it again");
                retry.reset();
                pace.known_offer = None;
                continue;
            }
        };
        let mut wait = heartbeat;
        match contact {
            Ok(mut answer) => {
                if first {
                    tracing::info!("registered with {}", client.base());
                }
                let registered = first;
                first = false;
                let contact = state::now_secs();
                unsent.flushed(flush_unsent(&home, &client).await);
                let offered = answer.config.take();
                let window = answer.window.take();
                let deployment = answer.deployment.take();
                if deployment.is_some() {
                    board.update(|h| h.deployment.clone_from(&deployment));
                }
                let command = answer.command.take();
                let endpoint = answer.endpoint.take();
                if let Some(destination) = answer.telemetry.take() {
                    telemetry.apply(destination);
                }
                wait = pace.answered(
                    &answer,
                    hold.as_ref(),
                    asked.elapsed(),
                    heartbeat,
                    client.base(),
                    registered && config.agent.long_poll,
                );
                // Learnt the moment it happened: no need to spread the fleet over a
                // heartbeat's worth of jitter before acting.
                let prompt = hold.is_some() && answer.server_holds;
                match answer.directive {
                    Directive::Accepted => {
                        board.update(|h| {
                            h.last_contact = Some(contact);
                            h.refused_by_server = None;
                            h.waiting_window = window.as_ref().map(|w| WaitingWindow {
                                expected: w.expected.clone(),
                                opens_at: w.opens_at,
                            });
                        });
                        retry.reset();
                        // Accepted as it runs, with no window to wait for: whatever it
                        // said of moving to another release (retrying it, held off) is
                        // over, on the machine as on the server.
                        if window.is_none()
                            && last_errors::last_told(&home).is_some_and(|(_, told)| {
                                matches!(
                                    told.status,
                                    UpdateStatus::Retrying
                                        | UpdateStatus::Deferred
                                        | UpdateStatus::WaitingWindow
                                )
                            })
                        {
                            last_errors::forget_told(&home);
                        }
                        if let Some(set) = offered {
                            take_config(&home, &client, &id, dirs, workload, &set).await;
                        }
                        if let Some(window) = &window {
                            ahead
                                .told(install, config, &client, &id, window, &stop_rx)
                                .await;
                        }
                        if let Some(offer) = endpoint {
                            take_move(&home, &mut client, offer).await;
                        }
                        if let Some(command) = command
                            && let Some(end) = take_command(&home, &client, workload, command).await
                        {
                            return Ok(end);
                        }
                    }
                    Directive::Refused(ns) => {
                        board.update(|h| {
                            h.last_contact = Some(contact);
                            h.refused_by_server = Some(ns.expected.clone());
                            h.waiting_window = None;
                        });
                        let offer = Offer {
                            expected: ns.expected.clone(),
                            sha256: ns.sha256.clone(),
                        };
                        if let Some(end) = on_refused(
                            install,
                            config,
                            &client,
                            &id,
                            Told {
                                offer: &offer,
                                prompt,
                                override_locks: ns.override_locks,
                            },
                            &mut retry,
                            Signals {
                                stop: &stop_rx,
                                nudge: &nudge,
                            },
                        )
                        .await
                        {
                            return Ok(end);
                        }
                    }
                }
            }
            Err(e) => {
                last_errors::record(&home, last_errors::Kind::Contact, &e.why());
                // A busy server is asked again when it asked to be, if that is sooner.
                if let Some(asked_for) = e.busy_for() {
                    wait = busy::busy_wait(asked_for, heartbeat, rand::rng().random::<f64>());
                }
                tracing::warn!("{e}; trying again in {:.1}s", wait.as_secs_f64())
            }
        }
        // The heartbeat is the longest silence: a change of the workload's health, a
        // report written for the server and a retry that is due do not wait for it.
        let now = Instant::now();
        let wait = retry::bounded(wait, retry.next_due(now), now);
        tokio::select! {
            stop = sleep::sleep_or_shutdown(wait, &mut shutdown) => {
                if stop {
                    tracing::info!("stopping on request");
                    return Ok(RunEnd::Stopped);
                }
            }
            _ = health_changed.changed() => {}
            () = locks_released(&home, held_off(&home, &retry)) => {}
            // Sent with the register, once there is one.
            () = unsent.written(&home), if !first => {}
        }
    }
}

/// How often the agent looks for what others wrote for the server (the updater's
/// reports): a directory listing a quarter of a second costs nothing measurable, and no
/// report waits for a held connect to end.
const UNSENT_POLL: Duration = Duration::from_millis(250);
/// After a send that failed, the next try is this much later (or at the next contact).
const UNSENT_RETRY: Duration = Duration::from_secs(5);

/// What the agent or the updater wrote for the server and no server heard yet: update
/// reports (`data/outbox/`) and the configuration status.
#[derive(Debug, Default)]
struct Unsent {
    /// The last send failed: looked at again from this instant, not in a loop.
    not_before: Option<Instant>,
}

impl Unsent {
    /// Whether something waits to be sent, and may be tried now.
    fn due(&self, home: &AgentHome) -> bool {
        self.not_before.is_none_or(|t| Instant::now() >= t) && has_unsent(home)
    }

    /// Resolves once something waits to be sent; never, while a failed send's pause lasts.
    async fn written(&self, home: &AgentHome) {
        if let Some(t) = self.not_before {
            tokio::time::sleep_until(t.into()).await;
        }
        while !has_unsent(home) {
            tokio::time::sleep(UNSENT_POLL).await;
        }
    }

    fn flushed(&mut self, all_sent: bool) {
        self.not_before = (!all_sent).then(|| Instant::now() + UNSENT_RETRY);
    }
}

/// Resolves once `sha` (if any) is no longer in `data/bad-versions`.
async fn bad_cleared(home: &AgentHome, sha: Option<&str>) {
    let Some(sha) = sha else {
        return std::future::pending().await;
    };
    while state::is_bad(home, sha).unwrap_or(true) {
        tokio::time::sleep(UNSENT_POLL).await;
    }
}

fn has_unsent(home: &AgentHome) -> bool {
    state::has_pending_reports(home) || remote_config::pending_status_file(home).exists()
}

/// Sends the outbox and the configuration status; true when nothing is left unsent
/// (read back, not assumed: a report that cannot be removed must not be sent in a loop).
async fn flush_unsent(home: &AgentHome, client: &Client) -> bool {
    flush_outbox(home, client).await;
    flush_config_status(home, client).await;
    flush_command_status(home, client).await;
    !has_unsent(home)
}

/// Tells the server how the last command ended, if no server heard it yet (a restart
/// of the agent is told by the agent that starts after it).
async fn flush_command_status(home: &AgentHome, client: &Client) {
    let Some(mut kept) = commands::read(home).filter(|k| !k.told) else {
        return;
    };
    match client.command_status(&kept.status()).await {
        Ok(()) => {
            tracing::info!(
                "reported command {} ({}) {:?} to the server",
                kept.id,
                kept.what,
                kept.status
            );
            kept.told = true;
            commands::keep(home, &kept);
        }
        // A server that does not know the command (another fleet, or it was replaced)
        // never will: dropped.
        Err(crate::contact::client::CommError::Status { status: code, .. })
            if matches!(code, 400 | 404 | 410 | 422) =>
        {
            tracing::info!(
                "the server does not take the outcome of command {} ({code}); dropped",
                kept.id
            );
            kept.told = true;
            commands::keep(home, &kept);
        }
        Err(e) => tracing::info!(
            "the outcome of command {} is sent again later: {e}",
            kept.id
        ),
    }
}

/// An operator's restart: of the workload alone (done here, told at once), or of the
/// agent (kept as done, and the agent ends for its supervisor to start it again; the
/// next agent tells it). A command carried again is not done again.
async fn take_command(
    home: &AgentHome,
    client: &Client,
    workload: &mut LiveWorkload,
    command: wire::AgentCommand,
) -> Option<RunEnd> {
    match commands::decide(commands::read(home).as_ref(), &command.id) {
        commands::Decision::Nothing => return None,
        commands::Decision::Tell => {
            flush_command_status(home, client).await;
            return None;
        }
        commands::Decision::Act => {}
    }
    let (what, result) = match command.restart {
        Some(wire::Restart::Agent) => {
            if std::env::var_os(agent_protocol::env_vars::AGENT_SUPERVISED).is_none() {
                (
                    "restart agent",
                    Err("this agent was not started by its supervisor (agent-wrapper.sh, or the Windows service), so nothing would start it again; restart it the way it was started".to_owned()),
                )
            } else {
                commands::keep(
                    home,
                    &commands::Kept {
                        id: command.id.clone(),
                        what: "restart agent".into(),
                        status: wire::CommandOutcome::Done,
                        error: None,
                        told: false,
                    },
                );
                tracing::info!(
                    "restarting on an operator's request (command {}): the supervisor starts this agent again",
                    command.id
                );
                return Some(RunEnd::Restart);
            }
        }
        Some(wire::Restart::Workload) => {
            tracing::info!(
                "restarting the workload on an operator's request (command {})",
                command.id
            );
            ("restart workload", workload.restart_now().await)
        }
        None => (
            "unknown",
            Err("a command this agent's release does not know; update the agent".to_owned()),
        ),
    };
    if let Err(why) = &result {
        tracing::warn!("command {} ({what}) failed: {why}", command.id);
    }
    commands::keep(
        home,
        &commands::Kept {
            id: command.id,
            what: what.into(),
            status: if result.is_ok() {
                wire::CommandOutcome::Done
            } else {
                wire::CommandOutcome::Failed
            },
            error: result.err(),
            told: false,
        },
    );
    flush_command_status(home, client).await;
    None
}

/// An operator moves this agent to another server URL: it registers there first, and
/// keeps the URL (in `conf/agent.toml`, and from now on) only if that server speaks to
/// it; otherwise it stays where it is and says why (its log, `agent status`, and the
/// server that asked).
async fn take_move(home: &AgentHome, client: &mut Client, offer: wire::EndpointOffer) {
    match commands::decide(commands::read(home).as_ref(), &offer.id) {
        commands::Decision::Nothing => return,
        commands::Decision::Tell => return flush_command_status(home, client).await,
        commands::Decision::Act => {}
    }
    let url = offer.url.trim_end_matches('/').to_owned();
    let old = client.base().to_owned();
    tracing::info!(
        "an operator moves this agent to {url} (command {}); trying it",
        offer.id
    );
    let result = match client.register_at(&url).await {
        Ok(()) => keep_url(home, &url),
        Err(e) => Err(format!(
            "{url} did not take this agent ({}); it stays with {old}",
            client.explained(&url, &e.why())
        )),
    };
    let mut kept = commands::Kept {
        id: offer.id,
        what: format!("move {url}"),
        status: if result.is_ok() {
            wire::CommandOutcome::Done
        } else {
            wire::CommandOutcome::Failed
        },
        error: result.as_ref().err().cloned(),
        told: false,
    };
    // Told to the server that asked, while this agent still talks to it.
    kept.told = client.command_status_to(&old, &kept.status()).await.is_ok();
    commands::keep(home, &kept);
    match result {
        Ok(()) => {
            client.move_to(&url);
            tracing::info!("moved to {url}: conf/agent.toml keeps it");
        }
        Err(why) => {
            tracing::warn!("not moved: {why}");
            last_errors::record(
                home,
                last_errors::Kind::Contact,
                &format!("not moved: {why}"),
            );
        }
    }
}

/// Writes `url` as the one server URL of `conf/agent.toml`. The environment wins over
/// the file (`AGENT_SERVER_URLS`): said, since a restart would then go back.
fn keep_url(home: &AgentHome, url: &str) -> Result<(), String> {
    let path = home.conf().join("agent.toml");
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let moved = commands::with_url(&text, url).map_err(|e| format!("{}: {e}", path.display()))?;
    agent_extract::atomic::write(&path, moved.as_bytes())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    if std::env::var_os("AGENT_SERVER_URLS").is_some() {
        tracing::warn!(
            "AGENT_SERVER_URLS is set in this agent's environment and wins over conf/agent.toml: the agent goes back to it when it restarts; change it there too"
        );
    }
    Ok(())
}

/// Sends the configuration outcome no server has heard yet; kept and sent again if
/// this server cannot hear it either.
async fn flush_config_status(home: &AgentHome, client: &Client) {
    let Some(status) = remote_config::pending_status(home) else {
        return;
    };
    match client.config_status(&status).await {
        Ok(()) => {
            tracing::info!(
                "reported configuration set {} {} to the server",
                status.hash,
                status.status.as_str()
            );
            remote_config::status_sent(home, &status);
        }
        // The server will never take it (it no longer knows the set): said once, dropped.
        Err(crate::contact::client::CommError::Status { status: code, .. })
            if matches!(code, 400 | 404 | 409 | 410 | 422) =>
        {
            tracing::warn!(
                "the server refuses the configuration status of set {} ({code}); dropped",
                status.hash
            );
            remote_config::status_sent(home, &status);
        }
        Err(e) => {
            tracing::info!(
                "configuration status kept, sent again within {}s: {e}",
                UNSENT_RETRY.as_secs()
            );
        }
    }
}

/// A set the server offers: applied unless it runs already or failed here before.
async fn take_config(
    home: &AgentHome,
    client: &Client,
    id: &str,
    dirs: &Result<Dirs, String>,
    workload: &mut LiveWorkload,
    set: &agent_protocol::wire::ConfigPayload,
) {
    let running = remote_config::running_hash(home);
    let failed = remote_config::failed_hash(home);
    match decide::offer(&set.hash, &running, failed.as_deref()) {
        decide::OfferVerdict::Apply => {}
        decide::OfferVerdict::Running => return,
        decide::OfferVerdict::FailedBefore => {
            tracing::debug!(
                "configuration set {} failed here before; waiting for another",
                set.hash
            );
            return;
        }
    }
    tracing::info!(
        "the server offers configuration set {} ({} file(s)); applying it",
        set.hash,
        set.files.len()
    );
    let status = remote_config::apply(
        home,
        dirs.as_ref().map_err(String::as_str),
        id,
        set,
        workload,
    )
    .await;
    if let Some(error) = &status.error {
        last_errors::record(
            home,
            last_errors::Kind::Configuration,
            &format!("configuration set {}: {error}", set.hash),
        );
    }
    remote_config::keep_status(home, &status);
    flush_config_status(home, client).await;
}

/// What the agent knows from its last answers, to pace the next contact.
#[derive(Debug, Default)]
struct Pace {
    last: Option<(bool, Option<String>, Option<String>)>,
    /// The bundle the last `409` named, while the agent stays on its version.
    known_offer: Option<String>,
    /// The server answered a connect at once although asked to hold it (said once).
    said_no_hold: bool,
}

impl Pace {
    /// Records an answer; returns the wait before the next contact.
    fn answered(
        &mut self,
        answer: &Answer,
        hold: Option<&Hold>,
        took: Duration,
        heartbeat: Duration,
        server: &str,
        registered_to_hold: bool,
    ) -> Duration {
        let (accepted, expected, sha) = answer.directive.key();
        let key = (
            accepted,
            expected.map(str::to_owned),
            sha.map(str::to_owned),
        );
        let changed = self.last.as_ref() != Some(&key);
        self.last = Some(key);
        self.known_offer = sha.map(str::to_owned);
        if hold.is_some() && !answer.server_holds && !self.said_no_hold {
            tracing::info!(
                "{server} answers connects at once (it does not hold them); asking it once per heartbeat ({heartbeat:?})"
            );
        }
        self.said_no_hold = hold.is_some() && !answer.server_holds;
        let last = LastContact {
            asked_to_hold: hold.is_some(),
            server_holds: answer.server_holds,
            took,
            wait: hold.map_or(heartbeat, |h| h.wait),
            changed,
            registered_to_hold,
        };
        pacing::next_contact(heartbeat, &last, &mut rand::rng())
    }
}

/// A refusal: the bundle offered, and whether it was learnt from a held connect.
struct Told<'a> {
    offer: &'a Offer,
    prompt: bool,
    /// An operator overrode this agent's update locks for this offer.
    override_locks: bool,
}

/// What an update round tells other tasks, and hears from them.
struct Signals<'a> {
    /// The agent is asked to stop.
    stop: &'a watch::Receiver<bool>,
    /// Asks the recovery task to close an update left open, now.
    nudge: &'a crate::update::recovery::Nudge,
}

/// The longest random wait before acting on a changed offer learnt from a held connect.
/// The download limit (`503` + `Retry-After`) spreads a fleet that learns at once.
const PROMPT_SPREAD: Duration = Duration::from_secs(1);

async fn on_refused(
    install: &Installation,
    config: &Config,
    client: &Client,
    id: &str,
    told: Told<'_>,
    retry: &mut Retry,
    signals: Signals<'_>,
) -> Option<RunEnd> {
    let Told {
        offer,
        prompt,
        override_locks,
    } = told;
    let Signals { stop, nudge } = signals;
    let expected = offer.expected.as_str();
    match state::open_transaction(&install.home) {
        Ok(Some(j)) => {
            let now = Instant::now();
            // An update left open by an updater that could not close it (a full disk):
            // when the retry is due, the updater is asked to close it now, not when
            // the recovery's own backoff ends; the round after that starts at once.
            if retry.recover_due(now) && lock::holder(&install.home.update_lock()).is_none() {
                let next = retry.recovering(now, &mut rand::rng());
                tracing::warn!(
                    "the update {} -> {} was left open (phase {:?}) and no updater runs; asking the updater to close it, and again in {:.0}s while it stays open",
                    j.from,
                    j.to,
                    j.phase,
                    next.saturating_duration_since(now).as_secs_f64().max(1.0)
                );
                nudge.now();
            } else {
                tracing::warn!(
                    "the server refuses {} and expects {expected}, while the update {} -> {} is being judged; the updater decides",
                    install.version,
                    j.from,
                    j.to
                );
            }
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
    // A server that names its bundle lets a known-bad one be skipped without a request.
    if let Some(sha) = &offer.sha256
        && state::is_bad(&install.home, sha).unwrap_or(false)
    {
        if retry.quiet_bad.as_deref() != Some(sha) {
            tracing::warn!(
                "running degraded: the server's bundle {expected} (sha256 {sha}) failed to come up here before (data/bad-versions); waiting for the server to offer another bundle (agent update --clear-bad forgets)"
            );
            retry.quiet_bad = Some(sha.clone());
        }
        return None;
    }
    let mut shutdown = stop.clone();
    match retry.gate.decide(offer, Instant::now()) {
        Gate::Wait => return None,
        Gate::Go => {}
        Gate::Changed => {
            let spread = if prompt {
                PROMPT_SPREAD.min(config.agent.heartbeat)
            } else {
                config.agent.heartbeat
            };
            let jitter = change_jitter(spread, &mut rand::rng());
            tracing::info!(
                "the server now offers {expected}{}; trying it in {:.1}s instead of waiting out the last failure's backoff",
                offer
                    .sha256
                    .as_ref()
                    .map(|s| format!(" (sha256 {s})"))
                    .unwrap_or_default(),
                jitter.as_secs_f64()
            );
            if sleep::sleep_or_shutdown(jitter, &mut shutdown).await {
                return Some(RunEnd::Stopped);
            }
        }
    }
    tracing::info!(
        "the server refuses {} and expects {expected}; updating",
        install.version
    );
    let round_began = Instant::now();
    crate::telemetry::round_began();
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
        Err(Outcome::Degraded { reason, failure }) => {
            let round = Round {
                install,
                client,
                id,
                offer,
            };
            round_failed(&round, failure, &reason, "running degraded", retry).await;
            return None;
        }
    };
    if !may_start(install, config, client, id, offer, override_locks, retry).await {
        return None;
    }
    match update::hand_off(&ctx, &ready).await {
        Ok(pid) => {
            tracing::info!(
                "updater started (pid {pid}) for {} -> {} (download {:.2}s, verify {:.3}s); serving until it has unpacked",
                install.version,
                ready.info.agent,
                ready.timings.download.as_secs_f64(),
                ready.timings.verify.as_secs_f64()
            );
            let to = &ready.info.agent;
            match update::wait_for_unpack(&install.home, to, pid, Duration::from_secs(300)).await {
                update::HandOff::Leave => {
                    tracing::info!(
                        "the new version is on disk; stopping so the updater can switch"
                    );
                    crate::telemetry::update_timed(
                        ready.timings.download,
                        ready.timings.verify,
                        round_began.elapsed(),
                    );
                    Some(RunEnd::HandedOff { to: to.clone() })
                }
                update::HandOff::Stay(why) => {
                    let round = Round {
                        install,
                        client,
                        id,
                        offer,
                    };
                    let reason = format!(
                        "the update to {to} stopped before the switch: {why}; {} keeps running",
                        install.version
                    );
                    round_failed(&round, Failure::Transient, &reason, "", retry).await;
                    None
                }
            }
        }
        Err(e) => {
            let round = Round {
                install,
                client,
                id,
                offer,
            };
            let reason = format!("cannot hand over to the updater: {e}");
            round_failed(&round, Failure::Transient, &reason, "", retry).await;
            None
        }
    }
}

/// The update round in hand: who, to whom, and for which offer.
struct Round<'a> {
    install: &'a Installation,
    client: &'a Client,
    id: &'a str,
    offer: &'a Offer,
}

/// A round that ended without the switch: remembered for `agent status`, retried on its
/// failure's pace (said in the log, `prefix` first), and told to the server.
async fn round_failed(
    round: &Round<'_>,
    failure: Failure,
    reason: &str,
    prefix: &str,
    retry: &mut Retry,
) {
    last_errors::record(&round.install.home, last_errors::Kind::Update, reason);
    crate::telemetry::update_failed();
    let now = Instant::now();
    let next = retry.failed(round.offer, failure, now, &mut rand::rng());
    let said = if prefix.is_empty() {
        reason.to_owned()
    } else {
        format!("{prefix}: {reason}")
    };
    tracing::warn!("{said}; {}", retry::when_again(next, now));
    tell_failure(round, failure, reason, retry).await;
}

/// Whether update locks let a verified update start now. Held off, the bundle stays
/// verified in `data/update/` (downloaded ahead) and the server is told `DEFERRED` with
/// the locks' names and reasons; past `update.max-defer`, or when an operator overrides,
/// the update goes ahead and the overridden locks are logged.
async fn may_start(
    install: &Installation,
    config: &Config,
    client: &Client,
    id: &str,
    offer: &Offer,
    override_locks: bool,
    retry: &mut Retry,
) -> bool {
    let (held, warnings) = locks::held(&install.home, state::now_secs());
    for warning in warnings {
        tracing::warn!("{warning}");
    }
    let deferred_for = retry.deferred_for(offer, Instant::now());
    match locks::decide(&held, deferred_for, config.update.max_defer, override_locks) {
        locks::Verdict::Go => {
            retry.end_deferral();
            true
        }
        locks::Verdict::Override { why } => {
            tracing::warn!(
                "{why}: updating to {} despite the update locks {}",
                offer.expected,
                locks::describe_all(&held)
            );
            retry.end_deferral();
            true
        }
        locks::Verdict::Defer => {
            let left = config.update.max_defer.saturating_sub(deferred_for);
            let reason = format!(
                "held off by update locks: {}; the update to {} starts when they are released, or in {}s (update.max-defer)",
                locks::describe_all(&held),
                offer.expected,
                left.as_secs()
            );
            if retry.first_deferral_said(&reason) {
                tracing::info!("{reason}; the bundle is verified and waits in data/update/");
            }
            let report = Report {
                id: id.to_owned(),
                from: install.version.to_string(),
                to: offer.expected.clone(),
                status: UpdateStatus::Deferred,
                error: Some(format!(
                    "held off by update locks: {}",
                    locks::describe_for_report(&held)
                )),
            };
            tell(install, client, report, retry).await;
            false
        }
    }
}

/// Whether update locks hold an update off right now (not only when last looked).
fn held_off(home: &AgentHome, retry: &Retry) -> bool {
    retry.deferring() && !locks::held(home, state::now_secs()).0.is_empty()
}

/// Resolves once no update lock is held, while `held_off`; never otherwise.
async fn locks_released(home: &AgentHome, held_off: bool) {
    if !held_off {
        return std::future::pending().await;
    }
    while !locks::held(home, state::now_secs()).0.is_empty() {
        tokio::time::sleep(UNSENT_POLL).await;
    }
}

/// Tells the server at once why a round failed before anything was installed: the
/// bundle's fault as `INSTALL_FAILED` (it counts against the rollout, with the agent's
/// own words), the machine's as `RETRYING`. Through the outbox, so a server that cannot
/// hear it now hears it later; the same words for the same offer are told once.
async fn tell_failure(round: &Round<'_>, failure: Failure, reason: &str, retry: &mut Retry) {
    let Some(status) = retry::report_status(failure) else {
        return;
    };
    let report = Report {
        id: round.id.to_owned(),
        from: round.install.version.to_string(),
        to: round.offer.expected.clone(),
        status,
        error: Some(reason.to_owned()),
    };
    tell(round.install, round.client, report, retry).await;
}

/// Sends `report` through the outbox, once (the same report again is not news).
async fn tell(install: &Installation, client: &Client, report: Report, retry: &mut Retry) {
    let status = report.status;
    if !retry.first_telling(&report) {
        return;
    }
    last_errors::told(&install.home, &report);
    if let Err(e) = state::enqueue_report(&install.home, &report) {
        // A full disk is the likeliest reason: told directly, once, then.
        match client.report(&report).await {
            Ok(()) => tracing::info!(
                "reported {} of {} -> {} to the server (not kept: {e})",
                status.as_str(),
                report.from,
                report.to
            ),
            Err(sent) => tracing::warn!(
                "cannot tell the server {} of {} -> {}: {sent}; nor keep it for later: {e}",
                status.as_str(),
                report.from,
                report.to
            ),
        }
        return;
    }
    flush_outbox(&install.home, client).await;
}
