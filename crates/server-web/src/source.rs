//! The page's reads from the fleet model (`agent-fleet`), and the operator's actions on
//! it: the one file that knows where the fleet's rows come from. The actions call the
//! very functions `/admin/rollout/...` and `/admin/config/<group>/...` call.

use agent_fleet::FleetError;
use agent_fleet::db::AgentRow;
pub use agent_fleet::history::HistoryLine;
use serde::Deserialize;

use super::model::{Agent, health_of};
use server_core::state::Shared;

fn agent_of(a: AgentRow) -> Agent {
    let nonempty = |s: String| if s.is_empty() { None } else { Some(s) };
    // The "health" the agent last reported, as the connect body carried it.
    let (health, health_detail) = a
        .health
        .as_deref()
        .and_then(|h| serde_json::from_str::<agent_protocol::wire::AgentHealth>(h).ok())
        .map(|h| {
            let (label, detail) = health_of(
                h.healthy,
                h.workload.as_str(),
                h.restarts,
                h.last_error.as_deref(),
            );
            (Some(label), Some(detail))
        })
        .unwrap_or_default();
    Agent {
        health,
        health_detail,
        id: a.id,
        name: a.name,
        platform: a.platform,
        version: a.version,
        group: a.group,
        last_contact: a.last_contact,
        update_status: a.update_status,
        update_error: a.update_error,
        config_hash: nonempty(a.config_hash),
        config_status: a.config_status,
        config_error: a.config_error,
        ..Agent::default()
    }
}

/// Every agent of the fleet, by id, as `/admin/agents` lists them but for their wave
/// (a second read of every agent; [`add_waves`] adds it to the few shown).
pub async fn agents(s: &Shared) -> Result<Vec<Agent>, FleetError> {
    // What people read is as fresh as what the server heard.
    s.fleet.flush_contacts().await;
    let opamp = s.fleet.db.opamp_agents().await?;
    Ok(s.fleet
        .db
        .agents(None, None)
        .await?
        .into_iter()
        .map(|a| {
            let labels = a.labels_as_seen(opamp.get(&a.id).map(|o| o.view.as_str()));
            let mut agent = agent_of(a);
            agent.deployment = s.fleet.deployments.follows(&labels);
            agent.labels = labels;
            if opamp.contains_key(&agent.id) {
                agent.protocol = OPAMP.to_owned();
            }
            agent
        })
        .collect())
}

/// The protocol label of agents that speak OpAMP (the others are "native").
const OPAMP: &str = "opamp";

/// Fills in each agent's wave and `told_at` in its deployment's rollout.
pub async fn add_waves(s: &Shared, agents: &mut [Agent]) -> Result<(), FleetError> {
    for (deployment, rollouts) in s.fleet.deployments.all() {
        let Some(rollout) = rollouts.current() else {
            continue;
        };
        let ids: Vec<&str> = agents
            .iter()
            .filter(|a| a.deployment.is_empty() || a.deployment == deployment.name)
            .map(|a| a.id.as_str())
            .collect();
        if ids.is_empty() {
            continue;
        }
        let found = agent_fleet::history::waves(&s.fleet.db, rollout.id, &ids).await?;
        for a in agents.iter_mut() {
            if let Some((wave, told)) = found.get(&a.id) {
                a.wave = Some(*wave);
                a.told_at = told.map(|ms| ms as f64 / 1000.0);
            }
        }
    }
    Ok(())
}

/// Every deployment but `default` with its rollout, as the page shows them.
pub async fn deployments(
    s: &Shared,
) -> Result<Vec<(agent_fleet::deployments::Deployment, Option<Rollout>)>, FleetError> {
    let mut out = Vec::new();
    for (deployment, rollouts) in s.fleet.deployments.all() {
        if deployment.is_default() {
            continue;
        }
        let rollout = match rollouts.status().await? {
            Some(status) => serde_json::from_value(status)
                .map_err(|e| tracing::error!("a deployment's rollout did not read back: {e}"))
                .ok(),
            None => None,
        };
        out.push((deployment, rollout));
    }
    Ok(out)
}

/// One agent, if the fleet knows it.
pub async fn agent(s: &Shared, id: &str) -> Result<Option<Agent>, FleetError> {
    s.fleet.flush_contacts().await;
    let Some(a) = s.fleet.db.agent(id).await? else {
        return Ok(None);
    };
    let stored = s.fleet.db.opamp_agent(id).await?;
    let labels = a.labels_as_seen(stored.as_ref().map(|o| o.view.as_str()));
    let mut agent = agent_of(a);
    agent.deployment = s.fleet.deployments.follows(&labels);
    agent.labels = labels;
    if stored.is_some() {
        agent.protocol = OPAMP.to_owned();
    }
    let mut one = [agent];
    add_waves(s, &mut one).await?;
    let [agent] = one;
    Ok(Some(agent))
}

/// The agent's part in every rollout, bundle and configuration, the latest first.
pub async fn history(s: &Shared, id: &str) -> Result<Vec<HistoryLine>, FleetError> {
    agent_fleet::history::history(&s.fleet.db, id).await
}

/// A rollout as the admin API answers it: the fleet's bundle rollout (`GET
/// /admin/rollout`), or a set's config rollout (`GET /admin/config`), which names no
/// version and counts `applied` where a bundle's counts `installed`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Rollout {
    #[serde(default)]
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
    #[serde(alias = "applied")]
    pub installed: u64,
    pub failed: u64,
    pub timed_out: u64,
    /// Agents whose platform the release has no bundle for (`NO_BUNDLE`): they keep their
    /// version, are no failure and are not waited for. Left out of the document when
    /// none, and never in a configuration rollout's.
    #[serde(default)]
    pub no_bundle: u64,
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
pub async fn rollout(s: &Shared) -> Result<Option<Rollout>, FleetError> {
    let Some(status) = s.fleet.rollouts.status().await? else {
        return Ok(None);
    };
    // The admin API's own document: a field it lacks is a bug there, not here.
    Ok(serde_json::from_value(status)
        .map_err(|e| tracing::error!("the rollout status did not read back: {e}"))
        .ok())
}

/// `GET /admin/config`: the configuration sets, each with its config rollout.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ConfigSets {
    #[serde(default)]
    pub sets: Vec<ConfigSet>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ConfigSet {
    pub group: String,
    pub hash: String,
    pub created_at: f64,
    #[serde(default)]
    pub files: Vec<String>,
    #[serde(default)]
    pub applied: u64,
    #[serde(default)]
    pub applying: u64,
    #[serde(default)]
    pub failed: u64,
    #[serde(default)]
    pub timed_out: u64,
    /// `None` before the set's rollout starts.
    pub rollout: Option<Rollout>,
}

/// Every configuration set with its config rollout, by group.
pub async fn config_sets(s: &Shared) -> Result<ConfigSets, FleetError> {
    let status = s.fleet.configs.status().await?;
    Ok(serde_json::from_value(status)
        .map_err(|e| tracing::error!("the configuration status did not read back: {e}"))
        .unwrap_or_default())
}
