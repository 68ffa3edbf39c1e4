//! The fleet database: the auto-update switch, this server's download limit, every agent,
//! and the rollouts (see `rollout::store`).
//!
//! One set of queries for SQLite (the embedded default, one server) and PostgreSQL (a
//! server cloud), through sqlx's `Any` driver: placeholders are `$1`, `$2`... (both
//! engines read them), types are kept to integers and text, and the few statements that
//! differ (taking the write lock, the placeholders of a batch of contacts) ask
//! [`Db::backend`]. Each backend has its own migrations, and the schema migrates itself
//! on start.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agent_protocol::wire::Report;
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::migrate::Migrator;
use sqlx::{AnyPool, Connection, Row};

use crate::error::FleetError;
use crate::migrations;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

#[derive(Clone)]
pub struct Db {
    pool: AnyPool,
    backend: Backend,
    progress: Arc<Progress>,
}

/// How long a query waits for a free PostgreSQL connection before it is answered from
/// memory (see `outage`).
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

/// How long a pooled PostgreSQL connection may sit idle before it is checked again
/// before use.
const IDLE_CHECKED_AFTER: Duration = Duration::from_secs(5);

/// What the pool's `after_release` returns: whether to keep the connection.
type Kept<'c> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<bool, sqlx::Error>> + Send + 'c>>;

/// The pool's `after_release`: stamps the progress, keeps the connection.
fn on_release(
    progress: Arc<Progress>,
) -> impl for<'c> Fn(&'c mut sqlx::AnyConnection, sqlx::pool::PoolConnectionMetadata) -> Kept<'c>
+ Send
+ Sync
+ 'static {
    move |_, _| {
        progress.answered(now_ms());
        Box::pin(async { Ok(true) })
    }
}

/// When a connection last came back to the pool (unix milliseconds; 0: never), and
/// where a probe connection goes: together they tell a busy database from one that is
/// away (see `outage`).
#[derive(Debug, Default)]
pub struct Progress {
    last_ms: AtomicI64,
    url: std::sync::OnceLock<String>,
}

/// How long a probe connection, opened beside the pool, may take to answer.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

impl Progress {
    /// Probes `url` (see [`Progress::probe`]).
    pub fn for_url(url: &str) -> Self {
        let progress = Self::default();
        let _ = progress.url.set(url.to_owned());
        progress
    }

    pub fn answered(&self, at_ms: i64) {
        self.last_ms.store(at_ms, Ordering::Relaxed);
    }

    pub fn last_ms(&self) -> i64 {
        self.last_ms.load(Ordering::Relaxed)
    }

    /// Opens one connection outside the pool and runs a query on it. A database that is
    /// up answers, however busy its pool is (an error it answers with, such as too many
    /// clients, is an answer too); one stopped or refusing fails at once. No answer
    /// within [`PROBE_TIMEOUT`] tells nothing: a machine so loaded that a new connection
    /// takes that long is not a database gone (and a hung one is found away when no
    /// query comes back either). Without a URL there is nothing to probe: answered.
    pub async fn probe(&self) -> Probe {
        let Some(url) = self.url.get() else {
            return Probe::Answered;
        };
        let attempt = async {
            let mut conn = sqlx::AnyConnection::connect(url).await?;
            sqlx::query("SELECT 1").execute(&mut conn).await?;
            let _ = conn.close().await;
            Ok::<(), sqlx::Error>(())
        };
        match tokio::time::timeout(PROBE_TIMEOUT, attempt).await {
            Ok(Ok(())) | Ok(Err(sqlx::Error::Database(_))) => Probe::Answered,
            Ok(Err(e)) => Probe::Refused(e.to_string()),
            Err(_) => Probe::NoAnswer,
        }
    }
}

/// What a probe connection found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    Answered,
    Refused(String),
    NoAnswer,
}

pub fn now_secs() -> i64 {
    now_ms() / 1000
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// `sqlite://` URL of a file path, with the characters the URL parser would take for
/// its own percent-encoded.
/// Creates the SQLite file readable by its owner alone (it holds agents' token hashes
/// and the audit log), or makes an existing one so. SQLite gives its `-wal` and `-shm`
/// files the database file's mode.
fn owner_only(path: &Path) -> Result<(), FleetError> {
    let io = |e: std::io::Error| FleetError::Config(format!("{}: {e}", path.display()));
    // Made empty first: nothing is in it before its mode is set.
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io)?;
    agent_extract::os::set_path_mode(path, 0o600).map_err(io)
}

fn sqlite_url(path: &Path) -> String {
    let mut url = String::from("sqlite://");
    for b in path.display().to_string().bytes() {
        match b {
            b'%' | b'?' | b'#' | b' ' => url.push_str(&format!("%{b:02X}")),
            _ => url.push(char::from(b)),
        }
    }
    url.push_str("?mode=rwc");
    url
}

/// What a register or connect says of an agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Contact<'a> {
    pub id: &'a str,
    pub name: &'a str,
    pub platform: &'a str,
    pub version: &'a str,
    /// Kept as recorded unless the agent says one (a register).
    pub group: Option<&'a str>,
    /// The configuration set it runs; kept as recorded unless given.
    pub config_hash: Option<&'a str>,
    /// The labels it reports (JSON, see `labels::to_json`); kept as recorded unless given.
    pub labels: Option<&'a str>,
    /// Unix seconds.
    pub at: i64,
}

/// One agent row, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentRow {
    pub id: String,
    pub name: String,
    pub platform: String,
    pub version: String,
    pub group: String,
    pub last_contact: i64,
    pub update_status: Option<String>,
    pub update_error: Option<String>,
    /// The configuration set it runs (empty: none).
    pub config_hash: String,
    /// `APPLYING`, `APPLIED` or `FAILED`, of the set it was last sent.
    pub config_status: Option<String>,
    pub config_error: Option<String>,
    /// The `"health"` object it last reported (JSON), if any.
    pub health: Option<String>,
    /// The labels it reported last (none from an agent from before labels).
    pub labels: crate::labels::Labels,
    /// The labels operators set on the server, which win on the same key.
    pub server_labels: crate::labels::Labels,
}

impl AgentRow {
    /// Its labels as a selector sees them: its own, the server's, the built-ins.
    pub fn effective_labels(&self) -> crate::labels::Labels {
        self.labels_as_seen(None)
    }

    /// Its effective labels as listed and selected: [`Self::effective_labels`], but for
    /// an OpAMP agent (`opamp_view`: its stored view) the attributes it reports
    /// ([`crate::labels::from_opamp_view`]) stand for its own.
    pub fn labels_as_seen(&self, opamp_view: Option<&str>) -> crate::labels::Labels {
        let from_view = opamp_view.map(crate::labels::from_opamp_view);
        crate::labels::effective(
            from_view.as_ref().unwrap_or(&self.labels),
            &self.server_labels,
            crate::labels::built_in(&self.platform, &self.group, &self.version),
        )
    }
}

/// Where a PostgreSQL URL points, for messages: never its password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgTarget {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub database: String,
}

impl PgTarget {
    pub fn parse(url: &str) -> Result<Self, FleetError> {
        use std::str::FromStr;
        let options = sqlx::postgres::PgConnectOptions::from_str(url).map_err(|e| {
            FleetError::Config(format!(
                "database.url is not a valid PostgreSQL URL ({e}); write postgres://USER:PASSWORD@HOST:PORT/DATABASE"
            ))
        })?;
        Ok(Self {
            host: options.get_host().to_owned(),
            port: options.get_port(),
            user: options.get_username().to_owned(),
            database: options
                .get_database()
                .unwrap_or(options.get_username())
                .to_owned(),
        })
    }

    /// Why connecting failed, in words that say what to do.
    pub fn explain(&self, e: &sqlx::Error) -> String {
        let Self {
            host,
            port,
            user,
            database,
        } = self;
        let at = format!("PostgreSQL at {host}:{port}");
        match e {
            sqlx::Error::Io(io) => format!(
                "cannot reach {at} ({io}); is it running, and listening there (listen_addresses, port)?"
            ),
            sqlx::Error::Tls(tls) => {
                format!(
                    "TLS to {at} failed ({tls}); check sslmode and the certificates in database.url"
                )
            }
            sqlx::Error::PoolTimedOut => {
                format!("{at} did not answer in time; is it running and reachable?")
            }
            sqlx::Error::Database(db) => match db.code().as_deref() {
                Some("28P01" | "28000") => format!(
                    "{at} refused the login of user {user:?} ({}); check the user and password in database.url, and pg_hba.conf",
                    db.message()
                ),
                Some("3D000") => format!(
                    "database {database:?} does not exist on {at}; create it (createdb -h {host} -p {port} -U {user} {database}) or fix database.url"
                ),
                Some("53300") => format!(
                    "{at} has no connection left for this server ({}); raise max_connections there or lower database.pool-size",
                    db.message()
                ),
                _ => format!("{at}: {}", db.message()),
            },
            other => format!("{at}: {other}"),
        }
    }
}

impl Db {
    /// Opens (creating if needed) the database and migrates its schema. `pool_size`
    /// bounds the connections to PostgreSQL.
    pub async fn open(url: &str, home: &Path, pool_size: u32) -> Result<Self, FleetError> {
        sqlx::any::install_default_drivers();
        let (url, backend) = if url.is_empty() {
            let path = home.join("fleet.db");
            owner_only(&path)?;
            (sqlite_url(&path), Backend::Sqlite)
        } else if let Some(rest) = url.strip_prefix("sqlite:") {
            let path = rest.trim_start_matches("//");
            let path = path.split('?').next().unwrap_or(path);
            if !path.starts_with(":memory:") {
                owner_only(Path::new(path))?;
            }
            (sqlite_url(Path::new(path)), Backend::Sqlite)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            (url.to_owned(), Backend::Postgres)
        } else {
            return Err(FleetError::Config(format!(
                "database.url {url:?}: use a postgres:// URL, a sqlite: URL, or leave it empty for a file under the server's home"
            )));
        };
        let progress = Arc::new(Progress::for_url(&url));
        let released = on_release(Arc::clone(&progress));
        let pool = match backend {
            Backend::Sqlite => {
                AnyPoolOptions::new()
                    .max_connections(4)
                    .after_release(released)
                    // WAL lets readers run beside the writer; NORMAL syncs at checkpoints,
                    // which WAL makes safe against corruption (a power cut loses at most
                    // the last commits, never the file).
                    .after_connect(|conn, _| {
                        Box::pin(async move {
                            sqlx::query("PRAGMA journal_mode = WAL")
                                .execute(&mut *conn)
                                .await?;
                            sqlx::query("PRAGMA synchronous = NORMAL")
                                .execute(&mut *conn)
                                .await?;
                            Ok(())
                        })
                    })
                    .connect(&url)
                    .await?
            }
            Backend::Postgres => {
                let target = PgTarget::parse(&url)?;
                // One plain connection first: the pool would retry a refused connection
                // until its timeout and then say only that it timed out.
                let first = sqlx::AnyConnection::connect(&url).await;
                let first = first.map_err(|e| FleetError::Config(target.explain(&e)))?;
                let _ = sqlx::Connection::close(first).await;
                AnyPoolOptions::new()
                    .max_connections(pool_size)
                    // Opened at start and kept: a pool that opens connections while
                    // thousands of queries wait for one times them out as it opens them
                    // (sqlx #3132).
                    .min_connections(pool_size)
                    // A connection is checked (a round trip) before it is handed out only
                    // when it sat idle long enough for the database to have restarted
                    // meanwhile. sqlx checks every one by default: under load that was a
                    // third of the round trips, and a check cut short by the acquire
                    // timeout closed its connection, so the pools of the 100,000-agent
                    // run shrank to 20 connections of 80 while queries waited.
                    .test_before_acquire(false)
                    .before_acquire(|conn, meta| {
                        Box::pin(async move {
                            if meta.idle_for < IDLE_CHECKED_AFTER {
                                return Ok(true);
                            }
                            Ok(sqlx::Connection::ping(conn).await.is_ok())
                        })
                    })
                    // Short: while the database is away, agents are answered from memory
                    // once a query has waited this long (see `outage`).
                    .acquire_timeout(ACQUIRE_TIMEOUT)
                    .after_release(released)
                    .connect(&url)
                    .await
                    .map_err(|e| FleetError::Config(target.explain(&e)))?
            }
        };
        let embedded = match backend {
            Backend::Sqlite => migrations::SQLITE,
            Backend::Postgres => migrations::POSTGRES,
        };
        Migrator::new(embedded).await?.run(&pool).await?;
        Ok(Self {
            pool,
            backend,
            progress,
        })
    }

    /// When this pool last had a connection back from a query.
    pub fn progress(&self) -> Arc<Progress> {
        Arc::clone(&self.progress)
    }

    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// A transaction that holds the database's write lock from its first statement, so
    /// that a decision read and written in it is taken once. SQLite takes the lock at
    /// `BEGIN IMMEDIATE`; PostgreSQL callers lock the row they decide about.
    pub async fn begin_write(&self) -> Result<sqlx::Transaction<'static, sqlx::Any>, sqlx::Error> {
        match self.backend {
            Backend::Sqlite => self.pool.begin_with("BEGIN IMMEDIATE").await,
            Backend::Postgres => self.pool.begin().await,
        }
    }

    /// A round trip to the database: is it there?
    pub async fn ping(&self) -> Result<(), FleetError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    pub async fn setting(&self, key: &str) -> Result<Option<String>, FleetError> {
        let row = sqlx::query("SELECT value FROM settings WHERE key = $1")
            .bind(key)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| r.get::<String, _>(0)))
    }

    /// Every setting whose key starts with `prefix` (of plain characters: no `%` or `_`
    /// meant literally).
    pub async fn settings_with_prefix(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, String)>, FleetError> {
        let rows = sqlx::query("SELECT key, value FROM settings WHERE key LIKE $1")
            .bind(format!("{prefix}%"))
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .iter()
            .map(|r| (r.get::<String, _>(0), r.get::<String, _>(1)))
            .collect())
    }

    pub async fn set_setting(&self, key: &str, value: &str) -> Result<(), FleetError> {
        sqlx::query(
            "INSERT INTO settings (key, value) VALUES ($1, $2)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        )
        .bind(key)
        .bind(value)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Records a contact. A contact older than the one recorded changes nothing (it was
    /// queued during an outage that another server did not have).
    pub async fn touch_agent(&self, c: &Contact<'_>) -> Result<(), FleetError> {
        self.touch_agents(&[(*c, None)]).await
    }

    /// Records many contacts (with the health each reported, if any) in one transaction
    /// of a few multi-row statements: a fleet of long-polling agents costs the database
    /// one commit per batch, and the server a round trip to it per [`TOUCH_CHUNK`]
    /// contacts, not one per held connect.
    pub async fn touch_agents(
        &self,
        contacts: &[(Contact<'_>, Option<&agent_protocol::wire::AgentHealth>)],
    ) -> Result<(), FleetError> {
        let statements: Vec<_> = touch_batches(contacts)
            .into_iter()
            .map(|(shape, rows)| (touch_sql(self.backend, shape, rows.len(), false), rows))
            .collect();
        retrying_lost_races(|| async {
            match statements.as_slice() {
                [] => {}
                // One statement is a transaction of its own: no lock taken for a register.
                [(sql, rows)] => {
                    touch_query(sql, rows).execute(&self.pool).await?;
                }
                _ => {
                    let mut tx = self.begin_write().await?;
                    for (sql, rows) in &statements {
                        touch_query(sql, rows).execute(&mut *tx).await?;
                    }
                    tx.commit().await?;
                }
            }
            Ok(())
        })
        .await
    }

    /// (agents whose last reported health is unhealthy, workload restarts the agents
    /// last reported in all), for /metrics.
    pub async fn health_counts(&self) -> Result<(i64, i64), FleetError> {
        let row = sqlx::query(
            // PostgreSQL sums BIGINT as NUMERIC: cast back, for both backends alike.
            "SELECT CAST(COALESCE(SUM(CASE WHEN healthy = 0 THEN 1 ELSE 0 END), 0) AS BIGINT),
                    CAST(COALESCE(SUM(workload_restarts), 0) AS BIGINT) FROM agents",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok((row.get(0), row.get(1)))
    }

    /// Records a report received at `at` (unix seconds).
    pub async fn record_report(&self, report: &Report, at: i64) -> Result<(), FleetError> {
        self.record_reports(&[(report, at)]).await
    }

    /// Records reports (each with when it was received, unix seconds), oldest first, a
    /// statement per [`REPORT_CHUNK`] agents: an agent's last report is what its row
    /// keeps, as if each had been written in turn. A report older than the agent's last
    /// contact sets its update status, not its version: a report queued on a busy
    /// server must not set back the version a later contact recorded.
    pub async fn record_reports(&self, reports: &[(&Report, i64)]) -> Result<(), FleetError> {
        let mut latest = latest_per_agent(reports, |(r, _)| r.id.as_str());
        // Rows in one order in every statement that writes many: two servers' writes
        // then wait for each other's rows, never each for the other's.
        latest.sort_by(|(a, _), (b, _)| a.id.cmp(&b.id));
        for chunk in latest.chunks(REPORT_CHUNK) {
            let sql = format!(
                "INSERT INTO agents (id, name, platform, version, last_contact, update_status, update_error)
                 VALUES {}
                 ON CONFLICT (id) DO UPDATE SET
                   version = CASE WHEN agents.last_contact <= excluded.last_contact
                             THEN excluded.version ELSE agents.version END,
                   last_contact = CASE WHEN agents.last_contact <= excluded.last_contact
                                  THEN excluded.last_contact ELSE agents.last_contact END,
                   update_status = excluded.update_status, update_error = excluded.update_error",
                value_rows(self.backend, chunk.len(), &["$", "''", "''", "$", "$", "$", "$"])
            );
            let sql = &sql;
            retrying_lost_races(|| async {
                let mut query = sqlx::query(sql).persistent(chunk.len() == 1);
                for (report, at) in chunk {
                    let version = match report.status {
                        agent_protocol::wire::UpdateStatus::Installed => &report.to,
                        _ => &report.from,
                    };
                    query = query
                        .bind(&report.id)
                        .bind(version)
                        .bind(*at)
                        .bind(report.status.as_str())
                        .bind(&report.error);
                }
                Ok(query.execute(&self.pool).await?)
            })
            .await?;
        }
        Ok(())
    }

    /// One agent, if known.
    pub async fn agent(&self, id: &str) -> Result<Option<AgentRow>, FleetError> {
        let row = sqlx::query(&format!("{AGENT_COLUMNS} WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.as_ref().map(agent_row))
    }

    pub async fn agents(
        &self,
        version: Option<&str>,
        status: Option<&str>,
    ) -> Result<Vec<AgentRow>, FleetError> {
        let rows = sqlx::query(&format!(
            "{AGENT_COLUMNS} WHERE ($1 = '' OR version = $1) AND ($2 = '' OR update_status = $2) ORDER BY id"
        ))
        .bind(version.unwrap_or(""))
        .bind(status.unwrap_or(""))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(agent_row).collect())
    }

    /// An operator's change to the agent's server labels (see [`crate::labels::Edit`]),
    /// read and written in one write transaction: the labels before and after, or `None`
    /// if the fleet does not know the agent. A change that breaks the rules is
    /// [`FleetError::Invalid`], naming the label.
    pub async fn set_server_labels(
        &self,
        id: &str,
        edit: &crate::labels::Edit,
    ) -> Result<Option<(crate::labels::Labels, crate::labels::Labels)>, FleetError> {
        let mut tx = self.begin_write().await?;
        let lock = match self.backend {
            Backend::Postgres => " FOR UPDATE",
            Backend::Sqlite => "",
        };
        let row = sqlx::query(&format!(
            "SELECT server_labels FROM agents WHERE id = $1{lock}"
        ))
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let before = crate::labels::from_json(row.get::<Option<String>, _>(0).as_deref());
        let after = edit.apply(&before).map_err(FleetError::Invalid)?;
        sqlx::query("UPDATE agents SET server_labels = $2 WHERE id = $1")
            .bind(id)
            .bind(crate::labels::to_json(&after))
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO settings (key, value) VALUES ($1, $2)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        )
        .bind(crate::settings::LABELS_REVISION)
        .bind(format!("{}-{id}", now_ms()))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Some((before, after)))
    }

    /// (label, count) of agents by version and by last update status, for /metrics.
    pub async fn fleet_counts(
        &self,
    ) -> Result<(Vec<(String, i64)>, Vec<(String, i64)>), FleetError> {
        let by_version = sqlx::query(
            // Agents that left are listed, not counted.
            "SELECT version, COUNT(*) FROM agents WHERE id NOT IN (SELECT id FROM agents_revoked) GROUP BY version",
        )
            .fetch_all(&self.pool)
            .await?
            .into_iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let by_status = sqlx::query(
            "SELECT COALESCE(update_status, 'NONE'), COUNT(*) FROM agents GROUP BY COALESCE(update_status, 'NONE')",
        )
        .fetch_all(&self.pool)
        .await?
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
        Ok((by_version, by_status))
    }
}

/// What the fleet knows of an id's credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    /// The id was never seen.
    Unknown,
    /// Known, but from before credentials (or its token was forgotten by an operator).
    None,
    /// The sha256 (hex) of its token.
    Hash(String),
    /// It left the fleet, or an operator removed it: nothing it presents is accepted.
    Revoked(Revocation),
}

/// How an agent stopped being part of the fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Revocation {
    /// `agent uninstall` told the server (`POST /agent/leave`): listed as `LEFT`.
    Left,
    /// An operator forgot a lost machine (`DELETE /admin/agents/<id>`).
    Removed,
}

impl Revocation {
    pub fn as_str(self) -> &'static str {
        match self {
            Revocation::Left => "LEFT",
            Revocation::Removed => "REMOVED",
        }
    }

    fn parse(text: &str) -> Self {
        if text == "LEFT" {
            Revocation::Left
        } else {
            Revocation::Removed
        }
    }
}

impl Db {
    pub async fn credentials(&self, id: &str) -> Result<Credentials, FleetError> {
        // One round trip: a register asks this of every agent it does not know, and a
        // fleet coming up registers all of them at once. A known agent without a token
        // reads as '' (a token's hash is never empty), one the fleet never saw as NULL.
        let row = sqlx::query(
            "SELECT (SELECT how FROM agents_revoked WHERE id = $1),
                    (SELECT COALESCE(token_hash, '') FROM agents WHERE id = $1)",
        )
        .bind(id)
        .fetch_one(&self.pool)
        .await?;
        if let Some(how) = row.get::<Option<String>, _>(0) {
            return Ok(Credentials::Revoked(Revocation::parse(&how)));
        }
        Ok(match row.get::<Option<String>, _>(1) {
            None => Credentials::Unknown,
            Some(hash) if hash.is_empty() => Credentials::None,
            Some(hash) => Credentials::Hash(hash),
        })
    }

    /// Gives the id its token, unless it has one (another server may have just issued
    /// it): true if this call did.
    pub async fn issue_token(&self, id: &str, hash: &str) -> Result<bool, FleetError> {
        let done =
            sqlx::query("UPDATE agents SET token_hash = $2, credential_at = $3 WHERE id = $1 AND token_hash IS NULL")
                .bind(id)
                .bind(hash)
                .bind(now_secs())
                .execute(&self.pool)
                .await?;
        Ok(done.rows_affected() == 1)
    }

    /// A first contact and its credentials in one statement: the agent's row is made
    /// (or its contact recorded) with `hash` as its token, unless it has one (another
    /// server, or a concurrent try of the same register, just gave it one). True if the
    /// id now holds `hash`. This is [`Db::touch_agents`] and [`Db::issue_token`] in one
    /// round trip: a fleet coming up enrolls every agent at once.
    pub async fn enroll(
        &self,
        contact: &Contact<'_>,
        health: Option<&agent_protocol::wire::AgentHealth>,
        hash: &str,
    ) -> Result<bool, FleetError> {
        let row = (*contact, health);
        let sql = touch_sql(self.backend, TouchShape::of(&row), 1, true);
        let held = touch_query(&sql, &[&row])
            .bind(hash)
            .bind(contact.at)
            .fetch_optional(&self.pool)
            .await?;
        match held {
            Some(r) => Ok(r.get::<Option<String>, _>(0).as_deref() == Some(hash)),
            // A newer contact is recorded (the row was left as it was): the token alone.
            None => self.issue_token(contact.id, hash).await,
        }
    }

    /// An operator's reset: the id's next register gets a new token. False if unknown.
    /// The credentials revision moves with it, so no server of the fleet keeps trusting
    /// the old token from memory.
    pub async fn forget_token(&self, id: &str) -> Result<bool, FleetError> {
        let mut tx = self.begin_write().await?;
        let done = sqlx::query(
            "UPDATE agents SET token_hash = NULL, token_candidate = NULL WHERE id = $1",
        )
        .bind(id)
        .execute(&mut *tx)
        .await?;
        credentials_changed(&mut tx, id).await?;
        tx.commit().await?;
        Ok(done.rows_affected() == 1)
    }

    /// The agent leaves the fleet, or is removed from it, at `at` (unix seconds): its
    /// credentials are refused from then on, it leaves every rollout's waves (none waits
    /// for it), a removed agent is forgotten and one that left is listed `LEFT`. The
    /// credentials revision moves, so no server keeps trusting its token from memory.
    /// False if the fleet never knew it.
    pub async fn revoke(&self, id: &str, how: Revocation, at: i64) -> Result<bool, FleetError> {
        let mut tx = self.begin_write().await?;
        let known = sqlx::query("SELECT id FROM agents WHERE id = $1")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?
            .is_some();
        if !known {
            return Ok(false);
        }
        sqlx::query(
            "INSERT INTO agents_revoked (id, how, at) VALUES ($1, $2, $3)
             ON CONFLICT (id) DO UPDATE SET how = excluded.how, at = excluded.at",
        )
        .bind(id)
        .bind(how.as_str())
        .bind(at)
        .execute(&mut *tx)
        .await?;
        // Bundle and configuration rollouts alike keep their members here.
        sqlx::query("DELETE FROM rollout_agents WHERE agent_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        match how {
            Revocation::Left => {
                sqlx::query(
                    "UPDATE agents SET token_hash = NULL, update_status = 'LEFT', update_error = NULL WHERE id = $1",
                )
                .bind(id)
                .execute(&mut *tx)
                .await?;
            }
            Revocation::Removed => {
                for sql in [
                    "DELETE FROM agent_opamp WHERE agent_id = $1",
                    "DELETE FROM agent_commands WHERE agent_id = $1",
                    "DELETE FROM agents WHERE id = $1",
                ] {
                    sqlx::query(sql).bind(id).execute(&mut *tx).await?;
                }
            }
        }
        credentials_changed(&mut tx, id).await?;
        tx.commit().await?;
        Ok(true)
    }
}

/// Moves the credentials revision (in `tx`, with the change to `id`'s credentials), so
/// every server of the fleet drops the tokens it trusts from memory.
pub async fn credentials_changed(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    id: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO settings (key, value) VALUES ($1, $2)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
    )
    .bind(crate::settings::CREDENTIALS_REVISION)
    .bind(format!("{}-{id}", now_ms()))
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Contacts per statement: a flush of a second of 20,000 long-polling agents is a few
/// statements, none large (11 parameters a contact, far below SQLite's 32,766 and
/// PostgreSQL's 65,535).
const TOUCH_CHUNK: usize = 100;

/// Runs `write` again (up to [`LOST_RACE_TRIES`] in all) while PostgreSQL ends it for
/// a deadlock or a serialization failure: five servers' batches of contacts and
/// reports meet on the agents' rows, and the one PostgreSQL picks to end would go the
/// next time.
pub async fn retrying_lost_races<T, F, Fut>(mut write: F) -> Result<T, FleetError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, FleetError>>,
{
    let mut tries = 1;
    loop {
        match write().await {
            Err(FleetError::Database(e))
                if tries < LOST_RACE_TRIES && crate::error::is_lost_race(&e) =>
            {
                tries += 1;
            }
            other => return other,
        }
    }
}

/// How many times a write that lost a race for rows is tried.
const LOST_RACE_TRIES: u32 = 3;

/// Reports per statement of [`Db::record_reports`] (5 parameters each).
const REPORT_CHUNK: usize = 500;

/// `items` with each key's last one only, in the order of those last ones: what a
/// statement that may not touch a row twice (PostgreSQL's upsert) writes of them.
pub fn latest_per_agent<T: Copy, K: Eq + std::hash::Hash>(
    items: &[T],
    key: impl Fn(&T) -> K,
) -> Vec<T> {
    let mut last: HashMap<K, usize> = HashMap::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        last.insert(key(item), i);
    }
    items
        .iter()
        .enumerate()
        .filter(|(i, item)| last.get(&key(item)) == Some(i))
        .map(|(_, item)| *item)
        .collect()
}

/// The `VALUES` rows of a statement of `rows` rows shaped by `row`: each `"$"` is a
/// parameter, anything else is written as it is. SQLite gets anonymous `?`
/// placeholders: it looks up each named one (`$7`) among those before it, which makes
/// a statement of thousands quadratic.
pub fn value_rows(backend: Backend, rows: usize, row: &[&str]) -> String {
    let mut sql = String::with_capacity(rows * row.len() * 6);
    let mut n = 0;
    for r in 0..rows {
        sql.push_str(if r == 0 { "(" } else { ", (" });
        for (i, field) in row.iter().enumerate() {
            if i > 0 {
                sql.push_str(", ");
            }
            if *field != "$" {
                sql.push_str(field);
                continue;
            }
            n += 1;
            match backend {
                Backend::Sqlite => sql.push('?'),
                Backend::Postgres => {
                    sql.push('$');
                    sql.push_str(&n.to_string());
                }
            }
        }
        sql.push(')');
    }
    sql
}

/// Which of a contact's optional fields it gives: those it does not give keep what is
/// recorded. Contacts of one shape share a statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct TouchShape {
    group: bool,
    config_hash: bool,
    labels: bool,
    health: bool,
}

impl TouchShape {
    fn of((contact, health): &(Contact<'_>, Option<&agent_protocol::wire::AgentHealth>)) -> Self {
        TouchShape {
            group: contact.group.is_some(),
            config_hash: contact.config_hash.is_some(),
            labels: contact.labels.is_some(),
            health: health.is_some(),
        }
    }
}

type TouchRow<'a, 'b> = &'b (Contact<'a>, Option<&'a agent_protocol::wire::AgentHealth>);

/// The contacts by shape, in statements of at most [`TOUCH_CHUNK`], an agent at most once
/// in each (PostgreSQL refuses a statement that updates a row twice): its latest contact.
fn touch_batches<'a, 'b>(
    contacts: &'b [(Contact<'a>, Option<&'a agent_protocol::wire::AgentHealth>)],
) -> Vec<(TouchShape, Vec<TouchRow<'a, 'b>>)> {
    use std::collections::hash_map::Entry;
    let mut kept: Vec<TouchRow<'a, 'b>> = Vec::with_capacity(contacts.len());
    let mut place: std::collections::HashMap<&str, usize> =
        std::collections::HashMap::with_capacity(contacts.len());
    for row in contacts {
        match place.entry(row.0.id) {
            Entry::Occupied(at) => {
                let earlier = &mut kept[*at.get()];
                if row.0.at >= earlier.0.at {
                    *earlier = row;
                }
            }
            Entry::Vacant(at) => {
                at.insert(kept.len());
                kept.push(row);
            }
        }
    }
    // One order of rows in every statement (see `Db::record_reports`).
    kept.sort_by(|a, b| a.0.id.cmp(b.0.id));
    let mut by_shape: std::collections::BTreeMap<TouchShape, Vec<TouchRow<'a, 'b>>> =
        std::collections::BTreeMap::new();
    for row in kept {
        by_shape.entry(TouchShape::of(row)).or_default().push(row);
    }
    by_shape
        .into_iter()
        .flat_map(|(shape, rows)| {
            rows.chunks(TOUCH_CHUNK)
                .map(|chunk| (shape, chunk.to_vec()))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The statement of [`touch_sql`] with its contacts bound.
fn touch_query<'q>(
    sql: &'q str,
    rows: &[TouchRow<'q, '_>],
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>> {
    let mut query = sqlx::query(sql).persistent(false);
    for (c, health) in rows {
        query = query
            .bind(c.id)
            .bind(c.name)
            .bind(c.platform)
            .bind(c.version)
            .bind(c.at)
            .bind(c.group.unwrap_or(""))
            .bind(c.config_hash.unwrap_or(""))
            .bind(c.labels)
            .bind(health.map(|h| serde_json::to_string(h).unwrap_or_default()))
            .bind(health.map(|h| i64::from(h.healthy)))
            .bind(health.map(|h| i64::try_from(h.restarts).unwrap_or(i64::MAX)));
    }
    query
}

/// An upsert of `rows` contacts of one shape. A contact older than the one recorded
/// changes nothing (it was queued during an outage that another server did not have).
/// With `token`, a statement of one row also binds a token's hash after the row's
/// fields: the row gets it unless it has one, and the statement returns the row's token.
fn touch_sql(backend: Backend, shape: TouchShape, rows: usize, token: bool) -> String {
    const FIELDS: usize = 11;
    // With a token, its hash and when it was set.
    let per_row = FIELDS + 2 * usize::from(token);
    let mut sql = String::with_capacity(400 + rows * 48);
    sql.push_str(
        "INSERT INTO agents (id, name, platform, version, last_contact, agent_group, config_hash, \
         labels, health, healthy, workload_restarts",
    );
    sql.push_str(if token {
        ", token_hash, credential_at) VALUES "
    } else {
        ") VALUES "
    });
    sql.push_str(&value_rows(backend, rows, &vec!["$"; per_row]));
    let given = |yes: bool, column: &str| {
        if yes {
            format!("{column} = excluded.{column}")
        } else {
            format!("{column} = agents.{column}")
        }
    };
    sql.push_str(
        " ON CONFLICT (id) DO UPDATE SET name = excluded.name, platform = excluded.platform, \
         version = excluded.version, last_contact = excluded.last_contact, ",
    );
    let updates = [
        given(shape.group, "agent_group"),
        given(shape.config_hash, "config_hash"),
        given(shape.labels, "labels"),
        given(shape.health, "health"),
        given(shape.health, "healthy"),
        given(shape.health, "workload_restarts"),
    ];
    sql.push_str(&updates.join(", "));
    if token {
        sql.push_str(
            ", token_hash = COALESCE(agents.token_hash, excluded.token_hash), \
             credential_at = CASE WHEN agents.token_hash IS NULL THEN excluded.credential_at \
             ELSE agents.credential_at END",
        );
    }
    sql.push_str(" WHERE agents.last_contact <= excluded.last_contact");
    if token {
        sql.push_str(" RETURNING token_hash");
    }
    sql
}

const AGENT_COLUMNS: &str = "SELECT id, name, platform, version, agent_group, last_contact, update_status, update_error, config_hash, config_status, config_error, health, labels, server_labels FROM agents";

fn agent_row(r: &AnyRow) -> AgentRow {
    AgentRow {
        id: r.get(0),
        name: r.get(1),
        platform: r.get(2),
        version: r.get(3),
        group: r.get(4),
        last_contact: r.get(5),
        update_status: r.get(6),
        update_error: r.get(7),
        config_hash: r.get(8),
        config_status: r.get(9),
        config_error: r.get(10),
        health: r.get(11),
        labels: crate::labels::from_json(r.get::<Option<String>, _>(12).as_deref()),
        server_labels: crate::labels::from_json(r.get::<Option<String>, _>(13).as_deref()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_postgres_target_keeps_no_password_and_names_what_to_fix() {
        let t = PgTarget::parse("postgres://fleet:s3cret@db.internal:6432/fleetdb").unwrap();
        assert_eq!(
            t,
            PgTarget {
                host: "db.internal".into(),
                port: 6432,
                user: "fleet".into(),
                database: "fleetdb".into(),
            }
        );
        let refused = t.explain(&sqlx::Error::Io(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )));
        assert!(
            refused.contains("cannot reach PostgreSQL at db.internal:6432"),
            "{refused}"
        );
        assert!(!format!("{t:?}").contains("s3cret"));
        assert!(PgTarget::parse("postgres://x@host:port/db").is_err());
    }

    fn contact<'a>(id: &'a str, at: i64) -> Contact<'a> {
        Contact {
            id,
            name: "host",
            platform: "linux-x86_64",
            version: "1.0.0+1",
            group: None,
            config_hash: None,
            labels: None,
            at,
        }
    }

    #[tokio::test]
    async fn reports_written_together_keep_each_agents_last_and_never_set_a_version_back() {
        use agent_protocol::wire::UpdateStatus;
        let home = tempfile::tempdir().unwrap();
        let db = Db::open("", home.path(), 1).await.unwrap();
        // `a` called in on 2.0.0 at 100; its INSTALLING of 90 was queued meanwhile.
        db.touch_agents(&[(
            Contact {
                version: "2.0.0",
                ..contact("a", 100)
            },
            None,
        )])
        .await
        .unwrap();
        let report = |id: &str, status| Report {
            id: id.into(),
            from: "1.0.0".into(),
            to: "2.0.0".into(),
            status,
            error: None,
        };
        let (a, b1, b2) = (
            report("a", UpdateStatus::Installing),
            report("b", UpdateStatus::Installing),
            report("b", UpdateStatus::Installed),
        );
        // More than a statement's worth, `b` twice: PostgreSQL refuses an upsert that
        // touches a row twice.
        let many: Vec<Report> = (0..REPORT_CHUNK + 3)
            .map(|i| report(&format!("c{i}"), UpdateStatus::Installed))
            .collect();
        let mut rows = vec![(&a, 90), (&b1, 90), (&b2, 95)];
        rows.extend(many.iter().map(|r| (r, 95)));
        db.record_reports(&rows).await.unwrap();
        let a = db.agent("a").await.unwrap().unwrap();
        assert_eq!(
            (
                a.version.as_str(),
                a.last_contact,
                a.update_status.as_deref()
            ),
            ("2.0.0", 100, Some("INSTALLING"))
        );
        let b = db.agent("b").await.unwrap().unwrap();
        assert_eq!(
            (
                b.version.as_str(),
                b.last_contact,
                b.update_status.as_deref()
            ),
            ("2.0.0", 95, Some("INSTALLED"))
        );
        let (by_version, _) = db.fleet_counts().await.unwrap();
        let installed = i64::try_from(REPORT_CHUNK + 3 + 2).unwrap();
        assert_eq!(by_version, vec![("2.0.0".to_owned(), installed)]);
    }

    /// A PostgreSQL error with SQLSTATE `code`.
    #[derive(Debug)]
    struct Pg(&'static str);

    impl std::fmt::Display for Pg {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "SQLSTATE {}", self.0)
        }
    }

    impl std::error::Error for Pg {}

    impl sqlx::error::DatabaseError for Pg {
        fn message(&self) -> &str {
            self.0
        }
        fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
            Some(self.0.into())
        }
        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }

    #[tokio::test]
    async fn a_write_that_lost_a_race_for_rows_is_tried_again_and_no_other_failure_is() {
        let fails = |code: &'static str, times: u32| {
            let tries = std::cell::Cell::new(0);
            async move {
                let result = retrying_lost_races(|| {
                    tries.set(tries.get() + 1);
                    let fail = tries.get() <= times;
                    async move {
                        if fail {
                            return Err(FleetError::Database(sqlx::Error::Database(Box::new(Pg(
                                code,
                            )))));
                        }
                        Ok(())
                    }
                })
                .await;
                (result.is_ok(), tries.get())
            }
        };
        // A deadlock, then a serialization failure: the third try goes.
        assert_eq!(fails("40P01", 2).await, (true, 3));
        assert_eq!(fails("40001", 1).await, (true, 2));
        // Three lost races in a row are the caller's; a unique violation is never tried again.
        assert_eq!(fails("40P01", 5).await, (false, LOST_RACE_TRIES));
        assert_eq!(fails("23505", 1).await, (false, 1));
    }

    #[test]
    fn value_rows_number_postgres_parameters_and_leave_sqlites_anonymous() {
        assert_eq!(
            value_rows(Backend::Postgres, 2, &["$", "''", "$"]),
            "($1, '', $2), ($3, '', $4)"
        );
        assert_eq!(
            value_rows(Backend::Sqlite, 2, &["$", "''"]),
            "(?, ''), (?, '')"
        );
        let items = [("a", 1), ("b", 2), ("a", 3)];
        assert_eq!(
            latest_per_agent(&items, |(k, _)| *k),
            vec![("b", 2), ("a", 3)]
        );
    }

    #[tokio::test]
    async fn a_batch_of_contacts_keeps_what_each_does_not_say_and_never_goes_back_in_time() {
        let home = tempfile::tempdir().unwrap();
        let db = Db::open("", home.path(), 1).await.unwrap();
        let sick = agent_protocol::wire::AgentHealth {
            healthy: false,
            restarts: 3,
            ..agent_protocol::wire::AgentHealth::no_workload()
        };
        db.touch_agents(&[
            (
                Contact {
                    group: Some("canary"),
                    config_hash: Some("abc"),
                    ..contact("a", 10)
                },
                Some(&sick),
            ),
            (contact("b", 10), None),
        ])
        .await
        .unwrap();
        // Shapes mixed in one batch; a's group, set and health are not said again.
        db.touch_agents(&[
            (
                Contact {
                    name: "renamed",
                    ..contact("a", 20)
                },
                None,
            ),
            (
                Contact {
                    group: Some(""),
                    ..contact("b", 5)
                },
                Some(&sick),
            ),
        ])
        .await
        .unwrap();
        let a = db.agent("a").await.unwrap().unwrap();
        assert_eq!(
            (a.name.as_str(), a.group.as_str(), a.config_hash.as_str()),
            ("renamed", "canary", "abc")
        );
        assert_eq!(a.last_contact, 20);
        assert!(a.health.unwrap().contains("\"restarts\":3"));
        assert_eq!(db.health_counts().await.unwrap(), (1, 3));
        // b's older contact (from a spool) changed nothing.
        let b = db.agent("b").await.unwrap().unwrap();
        assert_eq!((b.last_contact, b.health), (10, None));
    }

    #[tokio::test]
    async fn an_enrolment_writes_the_contact_and_the_first_token_only() {
        let home = tempfile::tempdir().unwrap();
        let db = Db::open("", home.path(), 1).await.unwrap();
        assert_eq!(db.credentials("a").await.unwrap(), Credentials::Unknown);
        assert!(db.enroll(&contact("a", 10), None, "h1").await.unwrap());
        assert_eq!(db.agent("a").await.unwrap().unwrap().last_contact, 10);
        assert_eq!(
            db.credentials("a").await.unwrap(),
            Credentials::Hash("h1".into())
        );
        // A second try with another token (another server's) keeps the first.
        assert!(!db.enroll(&contact("a", 11), None, "h2").await.unwrap());
        assert_eq!(db.agent("a").await.unwrap().unwrap().last_contact, 11);
        assert_eq!(
            db.credentials("a").await.unwrap(),
            Credentials::Hash("h1".into())
        );
        // Forgotten, it takes the next; a contact older than the one recorded is not
        // written, and the token still is.
        assert!(db.forget_token("a").await.unwrap());
        assert_eq!(db.credentials("a").await.unwrap(), Credentials::None);
        assert!(db.enroll(&contact("a", 5), None, "h3").await.unwrap());
        assert_eq!(db.agent("a").await.unwrap().unwrap().last_contact, 11);
        assert_eq!(
            db.credentials("a").await.unwrap(),
            Credentials::Hash("h3".into())
        );
        assert!(db.revoke("a", Revocation::Left, 12).await.unwrap());
        assert!(matches!(
            db.credentials("a").await.unwrap(),
            Credentials::Revoked(_)
        ));
    }

    #[tokio::test]
    async fn a_batch_larger_than_a_statement_and_an_agent_twice_in_it() {
        let home = tempfile::tempdir().unwrap();
        let db = Db::open("", home.path(), 1).await.unwrap();
        let ids: Vec<String> = (0..TOUCH_CHUNK * 2 + 7)
            .map(|i| format!("agent-{i}"))
            .collect();
        let mut rows: Vec<_> = ids.iter().map(|id| (contact(id, 100), None)).collect();
        // The later of two contacts of one agent wins, in whichever order they come.
        rows.push((contact("agent-0", 300), None));
        rows.push((contact("agent-0", 200), None));
        db.touch_agents(&rows).await.unwrap();
        let all = db.agents(None, None).await.unwrap();
        assert_eq!(all.len(), ids.len());
        let first = all.iter().find(|r| r.id == "agent-0").unwrap();
        assert_eq!(first.last_contact, 300);
        let statements = touch_batches(&rows);
        assert_eq!(statements.len(), 3, "two full statements and the rest");
        assert!(statements.iter().all(|(_, rows)| rows.len() <= TOUCH_CHUNK));
    }

    #[tokio::test]
    async fn labels_an_agent_reports_are_kept_until_it_says_others_and_the_servers_win() {
        let home = tempfile::tempdir().unwrap();
        let db = Db::open("", home.path(), 1).await.unwrap();
        let prod = crate::labels::to_json(&[("env".to_owned(), "prod".to_owned())].into());
        db.touch_agent(&Contact {
            labels: Some(&prod),
            ..contact("a", 10)
        })
        .await
        .unwrap();
        // A contact that says no labels (an agent from before them) keeps them.
        db.touch_agent(&contact("a", 11)).await.unwrap();
        let a = db.agent("a").await.unwrap().unwrap();
        assert_eq!(a.labels["env"], "prod");
        let edit = crate::labels::Edit::parse(&["env=staging", "tier=web"]).unwrap();
        let (before, after) = db.set_server_labels("a", &edit).await.unwrap().unwrap();
        assert!(before.is_empty());
        assert_eq!(after.len(), 2);
        let labels = db.agent("a").await.unwrap().unwrap().effective_labels();
        assert_eq!(
            (labels["env"].as_str(), labels["tier"].as_str()),
            ("staging", "web")
        );
        assert_eq!(labels["version"], "1.0.0+1");
        // The agent says other labels: the server's still win on env.
        db.touch_agent(&Contact {
            labels: Some("{}"),
            ..contact("a", 12)
        })
        .await
        .unwrap();
        let a = db.agent("a").await.unwrap().unwrap();
        assert!(a.labels.is_empty());
        assert_eq!(a.effective_labels()["env"], "staging");
        let remove = crate::labels::Edit::parse(&["env-"]).unwrap();
        db.set_server_labels("a", &remove).await.unwrap().unwrap();
        assert!(
            !db.agent("a")
                .await
                .unwrap()
                .unwrap()
                .effective_labels()
                .contains_key("env")
        );
        assert_eq!(db.set_server_labels("b", &remove).await.unwrap(), None);
        let bad = crate::labels::Edit::parse(&["os-"]);
        assert!(bad.is_err() || db.set_server_labels("a", &bad.unwrap()).await.is_err());
    }

    #[test]
    fn sqlite_urls_escape_what_the_parser_would_eat() {
        assert_eq!(
            sqlite_url(Path::new("/srv/home 1/fleet#1.db")),
            "sqlite:///srv/home%201/fleet%231.db?mode=rwc"
        );
    }
}
