//! The server's state, built from its configuration: the database opened, the live
//! settings loaded, the keys read, the bundle store scanned once.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use crate::background::{contact_refresh, take_hand_drop};
use crate::{SPOOL_FILE, deltas, releases, served, store};
use agent_fleet::config::Configs;
use agent_fleet::db::Db;
use agent_fleet::outage::Outage;
use agent_fleet::{Fleet, rollout};
use agent_protocol::minisign::PublicKey;

use crate::{AppState, Config, ServerError, metrics, state};

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
    // server.toml's [rollout] and [[maintenance]] become the fleet's policy for
    // `default` once, when the fleet is new; after that the fleet's are followed.
    let file_plan = config.rollout_plan().map_err(ServerError::Config)?;
    let file_windows = config.maintenance_windows().map_err(ServerError::Config)?;
    if agent_fleet::policy::seed(&db, &file_plan, &file_windows).await? {
        tracing::info!(
            "the fleet's policy for deployment default is seeded from this server's [rollout] and [[maintenance]]; from now on change it with `update-server deployment set default` and `update-server maintenance add|remove`"
        );
    }
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
    let webhook_db = db.clone();
    seed_approval(&db, config).await?;
    let fleet = Fleet::new(db, outage, rollouts, configs)
        .await?
        .with_contact_refresh(contact_refresh(config.agents.heartbeat));
    fleet.deployments.set_file_policy(file_plan, file_windows);
    fleet.deployments.refresh().await?;
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
            catalog: Arc::default(),
            deltas,
            fleet: Arc::new(fleet),
            server_name,
            limiter: Arc::default(),
            metrics,
            policy,
            admin_token: config.admin.token.clone(),
            enrollment_token: config.agents.enrollment_token.clone(),
            rotate_every: (config.agents.rotate_every > 0)
                .then(|| Duration::from_secs(config.agents.rotate_every)),
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
            governance: Arc::new(crate::governance::Governance::new(
                agent_fleet::webhooks::Webhooks::new(webhook_db, config.server_name()),
                Duration::from_secs(config.audit.keep),
                Duration::from_secs(config.webhooks.retry_for),
            )),
            approval_expires: Duration::from_secs(config.approval.expires),
        }),
    })
}

/// `[approval] required` seeds the fleet's switch when the fleet has none (a new fleet
/// database); after that the fleet's own holds, and a file that disagrees is said.
async fn seed_approval(db: &Db, config: &Config) -> Result<(), ServerError> {
    if config.approval.expires == 0 {
        return Err(ServerError::Config(
            "approval.expires is 0: a change would lapse before anyone could approve it; give a duration such as \"24h\"".into(),
        ));
    }
    let wanted = config.approval.required;
    let fleet = agent_fleet::approvals::Approvals::new(db.clone())
        .seed(wanted)
        .await?;
    if fleet != wanted {
        tracing::warn!(
            "approval.required is {wanted} in this server's configuration, but the fleet's switch is {fleet}: the fleet's holds (`update-server approval require on|off` changes it)"
        );
    }
    Ok(())
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
