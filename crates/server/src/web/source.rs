//! The page's reads from the fleet model, and the operator's actions on it: the one file
//! that knows where the fleet's rows come from. The actions call the very functions
//! `/admin/rollout/halt`, `/resume` and `/advance` call.

use std::collections::HashMap;

use serde::Deserialize;
use sqlx::Row;

use super::model::Agent;
use crate::routes::Shared;

/// Every agent of the fleet, by id, as `/admin/agents` lists them but for their wave
/// (a second read of every agent; [`add_waves`] adds it to the few shown).
pub async fn agents(s: &Shared) -> Result<Vec<Agent>, sqlx::Error> {
    let rows = s.db.agents(None, None).await?;
    Ok(rows
        .into_iter()
        .map(|a| Agent {
            id: a.id,
            name: a.name,
            platform: a.platform,
            version: a.version,
            group: a.group,
            last_contact: a.last_contact,
            update_status: a.update_status,
            update_error: a.update_error,
            ..Agent::default()
        })
        .collect())
}

/// Fills in each agent's wave and `told_at` in the fleet's rollout.
pub async fn add_waves(s: &Shared, agents: &mut [Agent]) -> Result<(), sqlx::Error> {
    let Some(rollout) = s.rollouts.current() else {
        return Ok(());
    };
    if agents.is_empty() {
        return Ok(());
    }
    let marks: Vec<String> = (0..agents.len()).map(|i| format!("${}", i + 2)).collect();
    let sql = format!(
        "SELECT agent_id, wave, told_at FROM rollout_agents WHERE rollout_id = $1 AND agent_id IN ({})",
        marks.join(", ")
    );
    let mut query = sqlx::query(&sql).bind(rollout.id);
    for a in agents.iter() {
        query = query.bind(a.id.clone());
    }
    let found: HashMap<String, (i64, Option<i64>)> = query
        .fetch_all(s.db.pool())
        .await?
        .iter()
        .map(|r| (r.get::<String, _>(0), (r.get::<i64, _>(1), r.get(2))))
        .collect();
    for a in agents.iter_mut() {
        if let Some((wave, told)) = found.get(&a.id) {
            a.wave = u32::try_from(*wave).ok();
            a.told_at = told.map(|ms| ms as f64 / 1000.0);
        }
    }
    Ok(())
}

/// One agent, if the fleet knows it.
pub async fn agent(s: &Shared, id: &str) -> Result<Option<Agent>, sqlx::Error> {
    let Some(a) = s.db.agent(id).await? else {
        return Ok(None);
    };
    let mut one = [Agent {
        id: a.id,
        name: a.name,
        platform: a.platform,
        version: a.version,
        group: a.group,
        last_contact: a.last_contact,
        update_status: a.update_status,
        update_error: a.update_error,
        ..Agent::default()
    }];
    add_waves(s, &mut one).await?;
    let [agent] = one;
    Ok(Some(agent))
}

/// One line of an agent's history: what each rollout asked of it and what came of it.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryLine {
    pub version: String,
    pub wave: u32,
    /// Unix seconds.
    pub told_at: Option<f64>,
    pub outcome: Option<String>,
    pub outcome_at: Option<f64>,
    pub error: Option<String>,
}

/// The agent's part in every rollout, the latest first.
pub async fn history(s: &Shared, id: &str) -> Result<Vec<HistoryLine>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT r.version, ra.wave, ra.told_at, ra.outcome, ra.outcome_at, ra.error \
         FROM rollout_agents ra JOIN rollouts r ON r.id = ra.rollout_id \
         WHERE ra.agent_id = $1 ORDER BY r.id DESC LIMIT 50",
    )
    .bind(id)
    .fetch_all(s.db.pool())
    .await?;
    let ms = |v: Option<i64>| v.map(|ms| ms as f64 / 1000.0);
    Ok(rows
        .iter()
        .map(|r| HistoryLine {
            version: r.get(0),
            wave: u32::try_from(r.get::<i64, _>(1)).unwrap_or(0),
            told_at: ms(r.get(2)),
            outcome: r.get(3),
            outcome_at: ms(r.get(4)),
            error: r.get(5),
        })
        .collect())
}

/// The fleet's bundle rollout as `GET /admin/rollout` answers it.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Rollout {
    pub version: String,
    pub previous: Option<String>,
    pub state: String,
    pub reason: Option<String>,
    pub wave: u32,
    pub started_at: f64,
    pub completed_at: Option<f64>,
    pub waves: Vec<Wave>,
    #[serde(default)]
    pub events: Vec<Event>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Wave {
    pub size: String,
    pub agents: u64,
    pub installed: u64,
    pub failed: u64,
    pub timed_out: u64,
    pub pending: u64,
    pub opened_at: Option<f64>,
    pub completed_at: Option<f64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Event {
    pub kind: String,
    pub wave: i64,
    pub at: f64,
    pub detail: Option<String>,
    #[serde(default)]
    pub server: String,
}

/// The fleet's latest bundle rollout, if a bundle was ever served.
pub async fn rollout(s: &Shared) -> Result<Option<Rollout>, sqlx::Error> {
    let Some(status) = s.rollouts.status().await? else {
        return Ok(None);
    };
    // The admin API's own document: a field it lacks is a bug there, not here.
    Ok(serde_json::from_value(status)
        .map_err(|e| tracing::error!("the rollout status did not read back: {e}"))
        .ok())
}

/// An operator's button.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Halt,
    Resume,
    Advance,
}

impl Action {
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "halt" => Some(Self::Halt),
            "resume" => Some(Self::Resume),
            "advance" => Some(Self::Advance),
            _ => None,
        }
    }
}

/// Does what the button says; `Err` is the rollout's refusal, in words for the page.
pub async fn act(s: &Shared, action: Action) -> Result<Result<(), String>, sqlx::Error> {
    let result = match action {
        Action::Halt => s.rollouts.halt(Some("from the fleet page")).await?,
        Action::Resume => s.rollouts.resume().await?,
        Action::Advance => s.rollouts.advance().await?,
    };
    Ok(result.map_err(|refusal| refusal.0))
}
