//! Configuration sets in the fleet database: the `config_sets` rows and each agent's
//! configuration columns. A set's rollout is a row of [`crate::rollout::store`] like a
//! bundle's (its kind `config`).

use std::collections::BTreeMap;
use std::sync::Arc;

use sqlx::any::AnyRow;
use sqlx::{Any, Executor, Row};

/// A group's configuration set as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetRow {
    pub group: String,
    pub hash: String,
    pub files: Arc<BTreeMap<String, String>>,
    /// Unix milliseconds.
    pub created_at: i64,
}

fn decode(what: &str, e: impl std::fmt::Display) -> sqlx::Error {
    sqlx::Error::Decode(format!("{what}: {e}").into())
}

fn set_row(r: &AnyRow) -> Result<SetRow, sqlx::Error> {
    let files: String = r.try_get(2)?;
    Ok(SetRow {
        group: r.try_get(0)?,
        hash: r.try_get(1)?,
        files: Arc::new(serde_json::from_str(&files).map_err(|e| decode("config_sets.files", e))?),
        created_at: r.try_get(3)?,
    })
}

const SET_COLUMNS: &str = "SELECT agent_group, hash, files, created_at FROM config_sets";

pub async fn sets<'e>(e: impl Executor<'e, Database = Any>) -> Result<Vec<SetRow>, sqlx::Error> {
    sqlx::query(&format!("{SET_COLUMNS} ORDER BY agent_group"))
        .fetch_all(e)
        .await?
        .iter()
        .map(set_row)
        .collect()
}

/// Every set's (group, hash, created_at), without its files.
pub async fn set_heads<'e>(
    e: impl Executor<'e, Database = Any>,
) -> Result<Vec<(String, String, i64)>, sqlx::Error> {
    Ok(
        sqlx::query("SELECT agent_group, hash, created_at FROM config_sets ORDER BY agent_group")
            .fetch_all(e)
            .await?
            .into_iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect(),
    )
}

pub async fn set<'e>(
    e: impl Executor<'e, Database = Any>,
    group: &str,
) -> Result<Option<SetRow>, sqlx::Error> {
    sqlx::query(&format!("{SET_COLUMNS} WHERE agent_group = $1"))
        .bind(group)
        .fetch_optional(e)
        .await?
        .as_ref()
        .map(set_row)
        .transpose()
}

/// Stores `files` as `group`'s set (replacing the one it had).
pub async fn put_set(
    tx: &mut sqlx::Transaction<'static, Any>,
    group: &str,
    hash: &str,
    files: &BTreeMap<String, String>,
    now: i64,
) -> Result<(), sqlx::Error> {
    let files = serde_json::to_string(files).map_err(|e| decode("files", e))?;
    sqlx::query(
        "INSERT INTO config_sets (agent_group, hash, files, created_at) VALUES ($1, $2, $3, $4)
         ON CONFLICT (agent_group) DO UPDATE SET hash = excluded.hash, files = excluded.files,
           created_at = excluded.created_at",
    )
    .bind(group)
    .bind(hash)
    .bind(files)
    .bind(now)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Removes `group`'s set; false if it had none.
pub async fn delete_set(
    tx: &mut sqlx::Transaction<'static, Any>,
    group: &str,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query("DELETE FROM config_sets WHERE agent_group = $1")
        .bind(group)
        .execute(&mut **tx)
        .await?;
    Ok(done.rows_affected() > 0)
}

/// Agents heard from since `since_secs` that run `group`'s set: (id, group, config
/// hash). For `default`, the agents whose group has no set of its own.
pub async fn group_agents<'e>(
    e: impl Executor<'e, Database = Any>,
    group: &str,
    since_secs: i64,
) -> Result<Vec<(String, String, String)>, sqlx::Error> {
    let sql = if group == super::directive::DEFAULT_GROUP {
        "SELECT id, agent_group, config_hash FROM agents WHERE last_contact >= $1
           AND (agent_group = $2 OR agent_group = ''
                OR agent_group NOT IN (SELECT agent_group FROM config_sets))
           AND (protocol <> 'opamp' OR id IN (SELECT agent_id FROM agent_opamp WHERE accepts_remote_config = 1))
           AND id NOT IN (SELECT id FROM agents_revoked)
         ORDER BY id"
    } else {
        // OpAMP agents that do not accept remote configuration are never sent a set.
        "SELECT id, agent_group, config_hash FROM agents WHERE last_contact >= $1 AND agent_group = $2
           AND (protocol <> 'opamp' OR id IN (SELECT agent_id FROM agent_opamp WHERE accepts_remote_config = 1))
           AND id NOT IN (SELECT id FROM agents_revoked)
         ORDER BY id"
    };
    Ok(sqlx::query(sql)
        .bind(since_secs)
        .bind(group)
        .fetch_all(e)
        .await?
        .into_iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect())
}

/// Records what the agent made of set `hash` (`APPLYING` when it is sent it). An
/// `APPLIED` set is the one it runs.
pub async fn set_agent_status<'e>(
    e: impl Executor<'e, Database = Any>,
    agent: &str,
    hash: &str,
    status: &str,
    error: Option<&str>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE agents SET config_status_hash = $2, config_status = $3, config_error = $4,
           config_hash = CASE WHEN $3 = 'APPLIED' THEN $2 ELSE config_hash END
         WHERE id = $1",
    )
    .bind(agent)
    .bind(hash)
    .bind(status)
    .bind(error)
    .execute(e)
    .await?;
    Ok(())
}

/// An agent a config rollout may place when sets are keyed by selectors: what decides
/// its set.
#[derive(Debug, Clone)]
pub struct LabelledAgent {
    pub id: String,
    pub group: String,
    pub config_hash: String,
    /// Its own labels, the server's, the built-ins (see [`crate::labels::effective`]).
    pub labels: crate::labels::Labels,
}

/// Agents heard from since `since_secs` that take configuration sets, with their labels.
pub async fn labelled_agents<'e>(
    e: impl Executor<'e, Database = Any>,
    since_secs: i64,
) -> Result<Vec<LabelledAgent>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT id, agent_group, version, platform, labels, server_labels, config_hash FROM agents
         WHERE last_contact >= $1
           AND (protocol <> 'opamp' OR id IN (SELECT agent_id FROM agent_opamp WHERE accepts_remote_config = 1))
           AND id NOT IN (SELECT id FROM agents_revoked)
         ORDER BY id",
    )
    .bind(since_secs)
    .fetch_all(e)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let (id, group, version, platform): (String, String, String, String) =
                (r.get(0), r.get(1), r.get(2), r.get(3));
            let labels = crate::labels::of_columns(
                r.get::<Option<String>, _>(4).as_deref(),
                r.get::<Option<String>, _>(5).as_deref(),
                &platform,
                &group,
                &version,
            );
            LabelledAgent {
                id,
                group,
                config_hash: r.get(6),
                labels,
            }
        })
        .collect())
}

/// An agent's group, as recorded.
pub async fn agent_group<'e>(
    e: impl Executor<'e, Database = Any>,
    agent: &str,
) -> Result<Option<String>, sqlx::Error> {
    Ok(sqlx::query("SELECT agent_group FROM agents WHERE id = $1")
        .bind(agent)
        .fetch_optional(e)
        .await?
        .map(|r| r.get(0)))
}
