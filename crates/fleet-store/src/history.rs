//! Reads for people looking at the fleet (the fleet page): the waves of a few agents,
//! and one agent's part in every rollout. Nothing here decides or writes.

use std::collections::HashMap;

use sqlx::Row;

use crate::FleetError;
use crate::db::Db;

/// Each of `ids`' wave and `told_at` (unix milliseconds) in bundle rollout `rollout`;
/// ids not placed in it are left out. For a page of agents, not the whole fleet.
pub async fn waves(
    db: &Db,
    rollout: i64,
    ids: &[&str],
) -> Result<HashMap<String, (u32, Option<i64>)>, FleetError> {
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    let marks: Vec<String> = (0..ids.len()).map(|i| format!("${}", i + 2)).collect();
    let sql = format!(
        "SELECT agent_id, wave, told_at FROM rollout_agents WHERE rollout_id = $1 AND agent_id IN ({})",
        marks.join(", ")
    );
    let mut query = sqlx::query(&sql).bind(rollout);
    for id in ids {
        query = query.bind(*id);
    }
    Ok(query
        .fetch_all(db.pool())
        .await?
        .iter()
        .map(|r| {
            (
                r.get::<String, _>(0),
                (u32::try_from(r.get::<i64, _>(1)).unwrap_or(0), r.get(2)),
            )
        })
        .collect())
}

/// One line of an agent's history: what a rollout asked of it and what came of it.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryLine {
    /// `bundle` or `config`.
    pub kind: &'static str,
    /// The bundle's version, or the configuration set's group and short hash.
    pub target: String,
    pub wave: u32,
    /// Unix milliseconds.
    pub told_at: Option<i64>,
    /// `INSTALLED`, `INSTALL_FAILED`, `TIMED_OUT` (`APPLIED`, `FAILED` for a set).
    pub outcome: Option<String>,
    pub outcome_at: Option<i64>,
    pub error: Option<String>,
}

/// The agent's part in its last 50 bundle and 50 configuration rollouts, the latest
/// first.
pub async fn history(db: &Db, id: &str) -> Result<Vec<HistoryLine>, FleetError> {
    let mut lines = Vec::new();
    // What each kind's line names: the bundle's version, the set's group and short hash.
    for (kind, target) in [
        ("bundle", "r.version"),
        ("config", "r.agent_group || ' ' || SUBSTR(r.target, 1, 12)"),
    ] {
        let sql = format!(
            "SELECT {target}, ra.wave, ra.told_at, ra.outcome, ra.outcome_at, ra.error \
             FROM rollout_agents ra JOIN rollouts r ON r.id = ra.rollout_id \
             WHERE ra.agent_id = $1 AND r.rollout_kind = '{kind}' ORDER BY r.id DESC LIMIT 50"
        );
        lines.extend(read(db, kind, &sql, id).await?);
    }
    let at = |h: &HistoryLine| h.outcome_at.or(h.told_at).unwrap_or(i64::MAX);
    lines.sort_by_key(|h| std::cmp::Reverse(at(h)));
    Ok(lines)
}

async fn read(
    db: &Db,
    kind: &'static str,
    sql: &str,
    id: &str,
) -> Result<Vec<HistoryLine>, FleetError> {
    Ok(sqlx::query(sql)
        .bind(id)
        .fetch_all(db.pool())
        .await?
        .iter()
        .map(|r| HistoryLine {
            kind,
            target: r.get(0),
            wave: u32::try_from(r.get::<i64, _>(1)).unwrap_or(0),
            told_at: r.get(2),
            outcome: r.get(3),
            outcome_at: r.get(4),
            error: r.get(5),
        })
        .collect())
}
