//! Fleet state: the auto-update switch, this server's download limit, and every agent.
//! SQLite through sqlx, so that a PostgreSQL pool can replace it for servers that share
//! one fleet without changing the queries' shape.

use std::path::Path;
use std::str::FromStr;
use std::time::{SystemTime, UNIX_EPOCH};

use agent_protocol::wire::{AgentRecord, Report};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{Row, SqlitePool};

use crate::error::ServerError;

#[derive(Clone)]
pub struct Db {
    pool: SqlitePool,
}

pub fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

impl Db {
    /// Opens (creating if needed) the database and migrates its schema.
    pub async fn open(url: &str, home: &Path) -> Result<Self, ServerError> {
        let options = if url.is_empty() {
            SqliteConnectOptions::new()
                .filename(home.join("fleet.db"))
                .create_if_missing(true)
        } else if url.starts_with("sqlite:") {
            SqliteConnectOptions::from_str(url)?.create_if_missing(true)
        } else {
            return Err(ServerError::Config(format!(
                "database.url {url:?}: only sqlite: URLs are supported by this build; leave it empty for a file under the server's home"
            )));
        };
        let options = options
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(std::time::Duration::from_secs(5));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await?;
        sqlx::migrate!("./migrations").run(&pool).await?;
        Ok(Self { pool })
    }

    pub async fn setting(&self, key: &str) -> Result<Option<String>, sqlx::Error> {
        let row = sqlx::query("SELECT value FROM settings WHERE key = ?")
            .bind(key)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| r.get::<String, _>(0)))
    }

    pub async fn set_setting(&self, key: &str, value: &str) -> Result<(), sqlx::Error> {
        sqlx::query("INSERT INTO settings (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value")
            .bind(key)
            .bind(value)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub async fn touch_agent(
        &self,
        id: &str,
        name: &str,
        platform: &str,
        version: &str,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO agents (id, name, platform, version, last_contact) VALUES (?, ?, ?, ?, ?)
             ON CONFLICT(id) DO UPDATE SET name = excluded.name, platform = excluded.platform,
               version = excluded.version, last_contact = excluded.last_contact",
        )
        .bind(id)
        .bind(name)
        .bind(platform)
        .bind(version)
        .bind(now_secs())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn record_report(&self, report: &Report) -> Result<(), sqlx::Error> {
        let version = match report.status {
            agent_protocol::wire::UpdateStatus::Installed => &report.to,
            _ => &report.from,
        };
        sqlx::query(
            "INSERT INTO agents (id, name, platform, version, last_contact, update_status, update_error)
             VALUES (?, '', '', ?, ?, ?, ?)
             ON CONFLICT(id) DO UPDATE SET version = excluded.version, last_contact = excluded.last_contact,
               update_status = excluded.update_status, update_error = excluded.update_error",
        )
        .bind(&report.id)
        .bind(version)
        .bind(now_secs())
        .bind(report.status.as_str())
        .bind(&report.error)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn agents(
        &self,
        version: Option<&str>,
        status: Option<&str>,
    ) -> Result<Vec<AgentRecord>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT id, name, platform, version, last_contact, update_status, update_error FROM agents
             WHERE (?1 IS NULL OR version = ?1) AND (?2 IS NULL OR update_status = ?2) ORDER BY id",
        )
        .bind(version)
        .bind(status)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| AgentRecord {
                id: r.get(0),
                name: r.get(1),
                platform: r.get(2),
                version: r.get(3),
                last_contact: httpdate::fmt_http_date(
                    UNIX_EPOCH + std::time::Duration::from_secs(r.get::<i64, _>(4).max(0) as u64),
                ),
                update_status: r.get(5),
                update_error: r.get(6),
            })
            .collect())
    }

    /// (label, count) of agents by version and by last update status, for /metrics.
    pub async fn fleet_counts(
        &self,
    ) -> Result<(Vec<(String, i64)>, Vec<(String, i64)>), sqlx::Error> {
        let by_version = sqlx::query("SELECT version, COUNT(*) FROM agents GROUP BY version")
            .fetch_all(&self.pool)
            .await?
            .into_iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let by_status =
            sqlx::query("SELECT COALESCE(update_status, 'NONE'), COUNT(*) FROM agents GROUP BY 1")
                .fetch_all(&self.pool)
                .await?
                .into_iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect();
        Ok((by_version, by_status))
    }
}
