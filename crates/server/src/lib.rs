//! update-server: the HTTP edge of the fleet. It serves one signed agent bundle,
//! answers agents with the version directive, and gives operators the admin API, the
//! metrics and the CLI; the fleet's state and every decision about it live in the fleet
//! model ([`agent_fleet`]), which this crate drives.
//!
//! It owns its home directory (download dir, private bundle copies, the bases and deltas
//! made from them, the spool file and the lock), the accept loop ([`conn`]), TLS, the routes, the bundle store and the
//! download limiter. It never modifies the operator's dropped bundle files, never
//! serves a byte that is not in its private immutable copy, and never holds a bundle
//! whole in memory (it maps it). It must not touch the fleet database but through
//! [`agent_fleet`], nor decide a rollout step or a credentials verdict itself.

pub mod actions;
pub mod cli;
pub mod config;
pub mod error;
pub mod maintenance;
pub mod metrics;
pub mod opamp;
pub mod panics;
pub mod reload;
pub mod routes;
pub mod signals;
pub mod state;
// The release and bundle model lives in its own crate (no HTTP); its modules keep
// their paths here.
pub use agent_releases::publish as releases;
pub use agent_releases::{deltas, refusal, store};
pub mod transport;
pub mod web;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use agent_fleet::config::Configs;
use agent_fleet::db::Db;
use agent_fleet::outage::Outage;
use agent_fleet::{Fleet, rollout};
use agent_protocol::minisign::PublicKey;
use transport::{conn, pacer, tls};

pub use config::{Config, ConfigSource};
pub use error::ServerError;
pub use state::AppState;

/// Writes queued while the fleet database was away, under the server's home.
pub const SPOOL_FILE: &str = "spool.jsonl";

pub use agent_releases::{SCAN_INTERVAL, served};

/// The whole HTTP interface over one state: the native routes and OpAMP's, each edge
/// built on its own (neither imports the other), a tower `Router` tests drive without a
/// socket.
pub fn app(state: AppState) -> axum::Router {
    // OpAMP bodies have their own (larger) limit, checked again after gzip.
    let opamp = opamp::router().route_layer(axum::extract::DefaultBodyLimit::max(
        opamp::http::MAX_WIRE_BODY,
    ));
    routes::router(&state)
        .merge(opamp)
        .layer(axum::extract::DefaultBodyLimit::max(routes::MAX_BODY))
        .with_state(state)
}

/// Opens the database, loads the live settings and scans the bundle store once.
pub async fn build_state(config: &Config) -> Result<AppState, ServerError> {
    let home = &config.server.home;
    std::fs::create_dir_all(home)
        .map_err(|e| ServerError::Io(format!("{}: {e}", home.display())))?;
    let public_key = if config.bundle.public_key.is_empty() {
        None
    } else {
        Some(read_key("bundle.public-key", &config.bundle.public_key)?)
    };
    let trusted_keys = config
        .releases
        .trusted_keys
        .iter()
        .map(|path| read_key("releases.trusted-keys", path))
        .collect::<Result<Vec<_>, _>>()?;
    let store = store::BundleStore::new(config.download_dir(), home, public_key.clone())
        .map_err(|e| ServerError::Io(format!("{}: {e}", config.download_dir().display())))?;
    let store = Arc::new(store);

    let db = Db::open(&config.database.url, home, config.database.pool_size).await?;
    let publisher = releases::Publisher::new(
        home,
        Arc::clone(&store),
        agent_fleet::releases::Releases::new(db.clone()),
        trusted_keys,
        public_key,
        config.releases.keep,
    )
    .map_err(|e| ServerError::Io(format!("{}: {e}", home.join("releases").display())))?
    .with_max_unpacked(config.releases.max_unpacked_bytes());
    // A release published while this server was away is served from its first answer,
    // and so is what the download directory holds (this server's own release, or one
    // dropped there by hand while it was away, once it passes a publish's checks).
    if let Err(e) = publisher.follow().await {
        tracing::error!("cannot serve the fleet's published release: {e}");
    }
    let audit = agent_fleet::audit::Audit::new(db.clone());
    if let Err(e) = take_hand_drop(&store, &publisher, &audit, &config.server_name()).await {
        tracing::error!(
            "cannot take the release in {} (tried again every second): {e}",
            store.dir().display()
        );
    }
    let policy = config
        .accept_policy()
        .map_err(|e| ServerError::Config(e.to_string()))?;
    let rollouts = Arc::new(
        rollout::Rollouts::new(
            db.clone(),
            config.rollout_plan().map_err(ServerError::Config)?,
            policy.clone(),
            config.server_name(),
        )
        .with_maintenance(config.maintenance_schedule().map_err(ServerError::Config)?),
    );
    rollouts.refresh().await?;
    if let store::Current::Ready(release) = store.current() {
        rollouts.serve(served(&release)).await?;
    }
    let outage = Arc::new(Outage::new(Some(home.join(SPOOL_FILE))).watching(db.progress()));
    let configs = Arc::new(Configs::new(
        db.clone(),
        config.rollout_plan().map_err(ServerError::Config)?,
        config.server_name(),
        Arc::clone(rollouts.news()),
    ));
    configs.refresh().await?;
    let fleet = Fleet::new(db, outage, rollouts, configs)
        .await?
        .with_contact_refresh(contact_refresh(config.agents.heartbeat));
    let server_name = config.server_name();
    let metrics: Arc<metrics::Metrics> = Arc::default();
    let deltas = Arc::new(deltas::Deltas::new(home, Arc::clone(&metrics.deltas))?);
    let download_limit = fleet
        .download_limit(&server_name)
        .await?
        .unwrap_or(config.downloads.limit);
    Ok(AppState {
        inner: Arc::new(state::Shared {
            store,
            releases: Arc::new(publisher),
            deltas,
            fleet: Arc::new(fleet),
            server_name,
            limiter: Arc::default(),
            metrics,
            policy,
            admin_token: config.admin.token.clone(),
            enrollment_token: config.agents.enrollment_token.clone(),
            download_limit: AtomicUsize::new(download_limit.min(config.max_connections())),
            max_connections: config.max_connections(),
            retry_after: config.downloads.retry_after,
            request_timeout: Duration::from_secs(config.server.header_timeout),
            stall_timeout: Duration::from_secs(config.downloads.stall_timeout),
            max_wait: Duration::from_secs(config.agents.max_wait),
            public_url: config.public_url(),
            download_source: config.download_source(),
            opamp_sockets: Default::default(),
            pacer: Arc::default(),
            agent_ca: read_agent_ca(config)?,
        }),
    })
}

/// A minisign public key file named by the configuration key `what`.
fn read_key(what: &str, path: &str) -> Result<PublicKey, ServerError> {
    let path = std::path::Path::new(path);
    let text = std::fs::read_to_string(path)
        .map_err(|e| ServerError::Config(format!("{what} {}: {e}", path.display())))?;
    PublicKey::parse(&text)
        .map_err(|e| ServerError::Config(format!("{what} {}: {e}", path.display())))
}

/// `tls.agent-ca`: a PEM certificate, read once at start so that a wrong path stops the
/// server rather than every `/install.sh`.
fn read_agent_ca(config: &Config) -> Result<Option<String>, ServerError> {
    if config.tls.agent_ca.is_empty() {
        return Ok(None);
    }
    let path = std::path::Path::new(&config.tls.agent_ca);
    let text = agent_extract::atomic::read_text(path, 1024 * 1024)
        .map_err(|e| ServerError::Config(format!("tls.agent-ca {}: {e}", path.display())))?;
    if !text.contains("-----BEGIN CERTIFICATE-----") {
        return Err(ServerError::Config(format!(
            "tls.agent-ca {}: no PEM certificate in it (-----BEGIN CERTIFICATE-----)",
            path.display()
        )));
    }
    Ok(Some(text))
}

/// How often the rollout is looked at (deadlines, soaks, another server's decisions),
/// besides soon after a report.
pub const ROLLOUT_INTERVAL: Duration = Duration::from_secs(1);
/// Looks a second the loop makes at once when reports wake it; past that, a woken look
/// waits for the second to end. Each look counts the rollout's agents in the database,
/// and while a wave of 90,000 installs every server is woken by reports many times a
/// second (looks back to back kept PostgreSQL busy); a few reports are looked at at once.
const ROLLOUT_LOOKS_PER_SECOND: usize = 4;

/// When a look that a report woke at `now` begins, given when the last looks began
/// (oldest first): at once, unless [`ROLLOUT_LOOKS_PER_SECOND`] of them began within the
/// last second; then once that second has passed since the earliest of those.
fn woken_look_at(
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
const CONTACT_REFRESH_HALF_BEATS: u64 = 3;
const _: () = assert!(CONTACT_REFRESH_HALF_BEATS + 2 < 2 * web::model::STALE_HEARTBEATS as u64);

fn contact_refresh(heartbeat_secs: u64) -> Duration {
    Duration::from_secs(heartbeat_secs.saturating_mul(CONTACT_REFRESH_HALF_BEATS) / 2)
}

/// Hands held agents their turns to be told, as download slots free up (see [`pacer`]).
fn spawn_pacer(state: &AppState) {
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
fn spawn_rollout_loop(state: &AppState) {
    let store = Arc::clone(&state.inner.store);
    let rollouts = Arc::clone(&state.inner.fleet.rollouts);
    let outage = Arc::clone(&state.inner.fleet.outage);
    let configs = Arc::clone(&state.inner.fleet.configs);
    panics::spawn_restarting("rollout loop", move || {
        let store = Arc::clone(&store);
        let rollouts = Arc::clone(&rollouts);
        let outage = Arc::clone(&outage);
        let configs = Arc::clone(&configs);
        rollout_loop(store, rollouts, outage, configs)
    });
}

async fn rollout_loop(
    store: Arc<store::BundleStore>,
    rollouts: Arc<agent_fleet::rollout::Rollouts>,
    outage: Arc<agent_fleet::outage::Outage>,
    configs: Arc<agent_fleet::config::Configs>,
) {
    {
        let mut tick = tokio::time::interval(ROLLOUT_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_error = String::new();
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

/// Looks at the download directory once: a release put there by hand is published by
/// [`releases::HAND_DROP_WHO`] when it passes a publish's checks, and refused when it
/// does not (logged, `/healthz` degraded, nothing of it served, no rollout). Both are in
/// the audit log as `server:<name>`'s. Returns the history entry it published, if any.
async fn take_hand_drop(
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
async fn release_scan(
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

/// Serves until `shutdown` resolves, then lets running downloads finish for the grace
/// period. `config` was read from `source`, which a reload signal reads again.
pub async fn serve(
    config: Config,
    source: ConfigSource,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let as_read = config.clone();
    let addr = config.listen_addr().map_err(ServerError::Config)?;
    panics::install_hook();
    // Connections are capped below the file limit, so that a flood of them never leaves
    // the server without a descriptor for its bundle or its database.
    let fd_limit = conn::raise_fd_limit(
        u64::try_from(config.max_connections())
            .unwrap_or(u64::MAX)
            .saturating_add(conn::FD_RESERVE),
    );
    let (max_connections, lowered) = conn::fit_connections(config.max_connections(), fd_limit);
    if let Some(why) = lowered {
        // Only an operator's own number deserves a warning; the default simply takes
        // what the machine allows.
        if config.server.max_connections.is_some() {
            tracing::warn!("{why}");
        } else {
            tracing::info!(
                "server.max-connections (unset) is {max_connections}: what the file limit of {fd_limit} allows, less {} kept for the server's own files",
                conn::FD_RESERVE
            );
        }
    }
    // Nothing under home changes, and no socket is taken, unless both are free: a second
    // server started by mistake must not touch the first one's bundle.
    let mut home_lock = HomeLock::acquire(&config.server.home)?;
    // A certificate that cannot serve is an error before anything listens.
    let tls = match config.tls_files() {
        Some((cert, key)) => {
            let opened = tls::Certificates::open(&cert, &key)
                .and_then(|c| c.server_config().map(|config| (c, config)));
            match opened {
                Ok((certificates, server_config)) => {
                    tls::watch(certificates);
                    Some(server_config)
                }
                Err(e) => {
                    home_lock.abandon();
                    return Err(e);
                }
            }
        }
        None => None,
    };
    let listener = match listen(addr) {
        Ok(listener) => listener,
        Err(e) => {
            home_lock.abandon();
            return Err(ServerError::Io(format!(
                "cannot listen on {addr}: {e}; is another server running there? Nothing was changed"
            )));
        }
    };
    let local = listener
        .local_addr()
        .map_err(|e| ServerError::Io(e.to_string()))?;
    home_lock.describe(&format!("pid {} listening on {local}", std::process::id()));
    // URLs handed to agents name the port really bound (`:0` in tests).
    let mut config = config;
    if config.server.public_url.trim().is_empty() {
        let mut bound = config.clone();
        bound.server.listen = local.to_string();
        config.server.public_url = bound.admin_url();
    }
    let state = build_state(&config).await?;
    let metrics = Arc::clone(&state.inner.metrics);
    let news = Arc::clone(state.inner.fleet.rollouts.news());
    let fleet = Arc::clone(&state.inner.fleet);
    tracing::info!(
        "update-server listening on {}://{local} (home {})",
        if config.tls_files().is_some() {
            "https"
        } else {
            "http"
        },
        config.server.home.display()
    );
    if let Some(source) = &state.inner.download_source {
        tracing::info!(
            "agents fetch bundle bytes from {source}/<bundle file name> (downloads.public-url), from this server when that fails"
        );
    }
    // Tests and scripts read this line to learn the port.
    println!("listening on {local}");

    spawn_rollout_loop(&state);
    maintenance::spawn_waker(Arc::clone(&state.inner.fleet.rollouts));
    reload::spawn(reload::Reloader::new(
        source,
        as_read,
        Arc::clone(&state.inner.fleet.rollouts),
        Arc::clone(&state.inner.fleet.configs),
    ));
    spawn_pacer(&state);
    state.inner.deltas.spawn(Arc::clone(&state.inner.store));
    state.inner.fleet.spawn_drain();
    state.inner.fleet.spawn_contact_flush();
    state.inner.fleet.spawn_settings_poll();
    let store = Arc::clone(&state.inner.store);
    let publisher = Arc::clone(&state.inner.releases);
    let audit = state.inner.fleet.audit();
    let server_name = state.inner.server_name.clone();
    let scan_news = Arc::clone(&news);
    panics::spawn_restarting("release scan", move || {
        release_scan(
            Arc::clone(&store),
            Arc::clone(&publisher),
            audit.clone(),
            server_name.clone(),
            Arc::clone(&scan_news),
        )
    });

    // The page signs people in with admin.token or a named operator token: with
    // neither, its sign-in refuses every token.
    let router = app(state.clone())
        .merge(web::router(state.clone(), page_options(&config)))
        // Outside every route's own layers: it sees their refusals too (a body over the
        // limit, a request past its clock).
        .layer(axum::middleware::from_fn_with_state(
            state,
            routes::refusals::audit,
        ));
    let router = router.layer(
        // 503 (limit) and 409 (directive) are answers the server means to give; a
        // fleet produces thousands, so they are not logged as errors.
        tower_http::trace::TraceLayer::new_for_http()
            .on_failure(tower_http::trace::DefaultOnFailure::new().level(tracing::Level::DEBUG)),
    );
    let grace = Duration::from_secs(config.server.shutdown_grace);
    let announced = async move {
        shutdown.await;
        // Held connects are answered now, so their agents go elsewhere or come back.
        news.close();
        tracing::info!(
            "stopping: no new connections; running downloads get {}s to finish",
            grace.as_secs()
        );
    };
    let listener = conn::Listener {
        listener,
        max_connections,
        timeouts: config.timeouts(),
        tls,
    };
    conn::serve(listener, router, metrics, announced, grace).await;
    // The last contacts heard are written before the server goes.
    fleet.flush_contacts().await;
    Ok(())
}

/// What the fleet page takes from the configuration.
pub fn page_options(config: &Config) -> web::Options {
    web::Options {
        admin_token: config.admin.token.clone(),
        heartbeat: Duration::from_secs(config.agents.heartbeat),
        secure: config.tls_files().is_some(),
    }
}

/// The kernel's queue of connections not yet accepted. Large, so that a burst of
/// connections (a fleet waking up, or a flood the server sheds) waits there instead of
/// having its handshakes dropped and retried a second later. The kernel caps it at
/// `net.core.somaxconn`.
pub const LISTEN_BACKLOG: u32 = 8192;

fn listen(addr: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// `<home>/update-server.lock`: one server per home, held while it runs (the kernel
/// drops it if the process dies). It names the holder for whoever finds it taken.
pub struct HomeLock {
    file: nix::fcntl::Flock<std::fs::File>,
    /// The lock file, when this server made it: a server that gives up before it
    /// serves (its port taken, say) leaves the home as it found it.
    made: Option<std::path::PathBuf>,
}

pub const HOME_LOCK: &str = "update-server.lock";

impl HomeLock {
    pub fn acquire(home: &std::path::Path) -> Result<Self, ServerError> {
        use std::io::{Read, Seek};
        std::fs::create_dir_all(home)
            .map_err(|e| ServerError::Io(format!("{}: {e}", home.display())))?;
        let path = home.join(HOME_LOCK);
        let made = (!path.exists()).then(|| path.clone());
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| ServerError::Io(format!("{}: {e}", path.display())))?;
        // A server killed a moment ago may still hold the lock while the kernel ends its
        // threads (one in the middle of a disk write, say): its pid is then gone or a
        // zombie, and the lock is free within moments. A live holder is refused at once.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut file = file;
        loop {
            match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
                Ok(file) => return Ok(Self { file, made }),
                Err((mut held, _)) => {
                    let mut holder = String::new();
                    let _ = held
                        .rewind()
                        .and_then(|()| held.read_to_string(&mut holder));
                    if holder_is_exiting(&holder) && std::time::Instant::now() < deadline {
                        std::thread::sleep(std::time::Duration::from_millis(50));
                        file = held;
                        continue;
                    }
                    return Err(ServerError::Io(format!(
                        "another update-server ({}) uses the home {}; stop it, or give this one another --home",
                        holder.trim(),
                        home.display()
                    )));
                }
            }
        }
    }

    /// Gives the lock up without having served: a lock file this server made is
    /// removed (the server said it changed nothing).
    pub fn abandon(self) {
        if let Some(path) = &self.made {
            let _ = std::fs::remove_file(path);
        }
    }

    fn describe(&mut self, holder: &str) {
        use std::io::{Seek, Write};
        let _ = self.file.set_len(0);
        let _ = self.file.rewind();
        let _ = writeln!(self.file, "{holder}");
    }
}

/// True when the lock file names a pid that has exited (gone, or a zombie whose threads
/// the kernel is still ending): a holder that lets go by itself.
fn holder_is_exiting(holder: &str) -> bool {
    let Some(pid) = holder
        .split_whitespace()
        .skip_while(|w| *w != "pid")
        .nth(1)
        .and_then(|p| p.parse::<u32>().ok())
    else {
        return false;
    };
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => true,
    }
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    signals::shutdown().await;
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

    #[test]
    fn a_lock_held_for_a_pid_that_exited_is_waited_for_and_a_live_one_is_not() {
        let me = format!("pid {} listening on 127.0.0.1:7080", std::process::id());
        assert!(!holder_is_exiting(&me));
        // Above the kernel's largest pid_max (2^22): never a live process.
        assert!(holder_is_exiting("pid 4194305 listening on 127.0.0.1:7080"));
        assert!(!holder_is_exiting(""));
        assert!(!holder_is_exiting("written by something else"));
    }

    #[test]
    fn a_home_held_by_a_live_server_is_refused_at_once() {
        let home = tempfile::tempdir().expect("tempdir");
        let mut first = HomeLock::acquire(home.path()).expect("first lock");
        first.describe(&format!(
            "pid {} listening on 127.0.0.1:1",
            std::process::id()
        ));
        let asked = std::time::Instant::now();
        let err = HomeLock::acquire(home.path())
            .err()
            .expect("a second lock on a held home");
        assert!(err.to_string().contains("another update-server"), "{err}");
        // Not the ten seconds an exiting holder is given.
        assert!(asked.elapsed() < std::time::Duration::from_secs(5));
    }

    #[test]
    fn a_server_that_gives_up_before_serving_leaves_no_lock_file_it_made() {
        let home = tempfile::tempdir().expect("tempdir");
        let path = home.path().join(HOME_LOCK);
        HomeLock::acquire(home.path()).expect("lock").abandon();
        assert!(!path.exists(), "the lock file this server made is gone");
        // One a server before it made is the home's own: kept.
        std::fs::write(&path, "pid 1 listening on 127.0.0.1:7080").expect("write");
        HomeLock::acquire(home.path()).expect("lock").abandon();
        assert!(path.exists());
    }

    /// A port already taken: the server says nothing changed, and leaves no lock behind.
    #[tokio::test]
    async fn a_port_clash_leaves_no_lock_file() {
        let home = tempfile::tempdir().expect("tempdir");
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = taken.local_addr().expect("addr").port();
        let vars = agent_protocol::settings::VarMap(vec![
            (
                "UPDATE_SERVER_SERVER_HOME".into(),
                home.path().display().to_string(),
            ),
            (
                "UPDATE_SERVER_SERVER_LISTEN".into(),
                format!("127.0.0.1:{port}"),
            ),
        ]);
        let config = Config::load(None, &vars).expect("config");
        let err = serve(config, ConfigSource::default(), std::future::pending())
            .await
            .expect_err("the port is taken");
        assert!(err.to_string().contains("Nothing was changed"), "{err}");
        assert!(!home.path().join(HOME_LOCK).exists());
    }
}
