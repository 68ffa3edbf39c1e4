//! `/admin/...` (bearer token): settings, agents and the rollout; and the unauthenticated
//! `/metrics` and `/healthz`.

use std::sync::atomic::Ordering;

use agent_protocol::wire::AgentRecord;
use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use agent_fleet::labels;
use agent_fleet::rollout::step::HaltCause;
use agent_protocol::selector::Selector;

use super::operators::Auth;
use super::{AppState, Shared, json_body};
use crate::actions::{self, Act, Actor, Done, Step, Target};
use crate::error::ApiError;
use crate::metrics::RolloutGauges;
use agent_fleet::operators::Action;

fn settings_json(s: &Shared) -> serde_json::Value {
    serde_json::json!({
        "auto_update": s.fleet.auto_update(),
        "downloads_limit": s.download_limit.load(Ordering::Relaxed),
        "max_connections": s.max_connections,
        "downloads_in_flight": s.limiter.in_flight(),
        "server": s.server_name,
    })
}

pub(super) async fn settings(
    State(state): State<AppState>,
    auth: Auth,
) -> Result<Response, ApiError> {
    auth.require(&state.inner, Action::Read, "settings.read")
        .await?;
    Ok(Json(settings_json(&state.inner)).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SettingsChange {
    auto_update: Option<bool>,
    downloads_limit: Option<usize>,
}

pub(super) async fn update_settings(
    State(state): State<AppState>,
    auth: Auth,
    body: Result<Json<SettingsChange>, JsonRejection>,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    let caller = auth.require(s, Action::Change, "settings.change").await?;
    let change = json_body(body)?;
    if let Some(limit) = change.downloads_limit {
        if limit > s.max_connections {
            return Err(ApiError::bad_request(format!(
                "downloads_limit may not exceed server.max-connections ({})",
                s.max_connections
            )));
        }
        s.fleet.set_download_limit(&s.server_name, limit).await?;
        let old = s.download_limit.swap(limit, Ordering::Relaxed);
        tracing::info!(limit, by = %caller.name, "download limit changed");
        caller
            .record(
                s,
                "settings.downloads_limit",
                serde_json::json!({ "server": s.server_name, "old": old, "new": limit }),
            )
            .await;
    }
    if let Some(enabled) = change.auto_update {
        let old = s.fleet.auto_update();
        s.fleet.set_auto_update(enabled).await?;
        tracing::info!(enabled, by = %caller.name, "fleet-wide auto-update changed");
        caller
            .record(
                s,
                "settings.auto_update",
                serde_json::json!({ "old": old, "new": enabled }),
            )
            .await;
    }
    Ok(Json(settings_json(s)).into_response())
}

#[derive(Debug, Deserialize)]
pub(super) struct AgentFilter {
    version: Option<String>,
    status: Option<String>,
    /// `agent.group`; `default` also matches agents with no group.
    group: Option<String>,
    /// A label selector (`env=prod,region in (eu)`; see `agent_protocol::selector`).
    selector: Option<String>,
    /// The deployment the agents follow.
    deployment: Option<String>,
}

/// `?selector=`, read: a bad one is a `400` that names the column.
fn selector_of(text: Option<&str>) -> Result<Selector, ApiError> {
    Selector::parse(text.unwrap_or("")).map_err(|e| ApiError::bad_request(format!("selector: {e}")))
}

/// Whether an agent of `group` is in the group `wanted` asks for.
fn in_group(group: &str, wanted: Option<&str>) -> bool {
    match wanted {
        None | Some("") => true,
        Some(w) => group == w || (w == "default" && group.is_empty()),
    }
}

pub(super) async fn agents(
    State(state): State<AppState>,
    auth: Auth,
    Query(filter): Query<AgentFilter>,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    auth.require(s, Action::Read, "agents.read").await?;
    let status = filter
        .status
        .as_deref()
        .filter(|s| !s.is_empty())
        .map(agent_protocol::wire::UpdateStatus::filter_name)
        .transpose()
        .map_err(ApiError::bad_request)?;
    let selector = selector_of(filter.selector.as_deref())?;
    // What people read is as fresh as what the server heard.
    s.fleet.flush_contacts().await;
    let rows = s
        .fleet
        .db
        .agents(filter.version.as_deref(), status.as_deref())
        .await?;
    // Each agent's wave is in the rollout of the deployment it follows.
    let mut members = std::collections::HashMap::new();
    for (deployment, rollouts) in s.fleet.deployments.all() {
        members.insert(deployment.name, rollouts.members().await?);
    }
    let opamp = s.fleet.db.opamp_agents().await?;
    let extras = s.fleet.db.agent_extras().await?;
    let last_commands = s.fleet.db.last_commands().await?;
    let now = agent_fleet::db::now_ms();
    // Each row is written as it is made: at 100,000 agents a JSON value per agent, all
    // held before the first was written, took a server from 330 to 654 MiB.
    let mut body = Vec::with_capacity(rows.len() * 320 + 2);
    body.push(b'[');
    let listed = rows
        .into_iter()
        .filter(|a| in_group(&a.group, filter.group.as_deref()));
    let mut first = true;
    for a in listed {
        let stored = opamp.get(&a.id);
        let labels = a.labels_as_seen(stored.map(|o| o.view.as_str()));
        if !selector.matches(&labels) {
            continue;
        }
        let deployment = s.fleet.deployments.follows(&labels);
        if filter
            .deployment
            .as_deref()
            .is_some_and(|d| !d.is_empty() && d != deployment)
        {
            continue;
        }
        let member = members.get(&deployment).and_then(|m| m.get(&a.id));
        let row_id = a.id.clone();
        let record = AgentRecord {
            last_contact: httpdate::fmt_http_date(
                std::time::UNIX_EPOCH
                    + std::time::Duration::from_secs(a.last_contact.max(0) as u64),
            ),
            wave: member.map(|m| m.0),
            told_at: member.and_then(|m| m.1),
            id: a.id,
            name: a.name,
            platform: a.platform,
            version: a.version,
            group: a.group,
            update_status: a.update_status,
            update_error: a.update_error,
            config_hash: a.config_hash,
            config_status: a.config_status,
            config_error: a.config_error,
            health: a.health.and_then(|h| serde_json::from_str(&h).ok()),
        };
        let mut row = serde_json::to_value(record).unwrap_or_default();
        crate::routes::opamp_fields::add_fields(&mut row, stored, now);
        add_command_fields(
            &mut row,
            extras.get(&row_id),
            last_commands.get(&row_id),
            stored.is_some(),
            s,
            now / 1000,
        );
        row["labels"] = serde_json::to_value(labels).unwrap_or_default();
        row["deployment"] = serde_json::json!(deployment);
        if !first {
            body.push(b',');
        }
        first = false;
        serde_json::to_writer(&mut body, &row).map_err(|e| {
            tracing::error!("an agent's row would not serialize: {e}");
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
        })?;
    }
    body.push(b']');
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// `"capabilities"`, `"credential_age_s"`, `"endpoint"` and `"last_command"` of a row:
/// what the agent takes, how old its credential is, where it talks to, and the last
/// command asked of it with how it ended. An OpAMP agent's capabilities are the ones
/// it declared (`add_fields` put them in); its endpoint is this server's OpAMP URL.
fn add_command_fields(
    row: &mut serde_json::Value,
    extras: Option<&agent_fleet::commands::Extras>,
    last: Option<&agent_fleet::commands::Command>,
    opamp: bool,
    s: &Shared,
    now: i64,
) {
    let extras = extras.cloned().unwrap_or_default();
    if !opamp {
        row["capabilities"] = serde_json::json!(extras.capabilities.unwrap_or_default());
    }
    row["credential_age_s"] = serde_json::json!(extras.credential_at.map(|at| (now - at).max(0)));
    row["endpoint"] = match (opamp, extras.endpoint) {
        (false, endpoint) => serde_json::json!(endpoint),
        (true, _) => serde_json::json!(format!("{}{}", s.public_url, agent_opamp::OPAMP_PATH)),
    };
    row["last_command"] = last.map(|c| c.to_json()).unwrap_or(serde_json::Value::Null);
}

/// `DELETE /admin/agents/{id}/token`: the agent lost its credentials (its `data/` was
/// wiped); its next register gets new ones.
pub(super) async fn forget_token(
    State(state): State<AppState>,
    auth: Auth,
    axum::extract::Path(agent): axum::extract::Path<String>,
) -> Result<Response, ApiError> {
    let act = Act::ForgetToken {
        agent: agent.clone(),
    };
    let Done::TokenForgotten { next } = perform_api(&state.inner, auth, act).await? else {
        return Err(unexpected());
    };
    Ok(
        Json(serde_json::json!({ "id": agent, "token": "forgotten", "next": next }))
            .into_response(),
    )
}

/// `DELETE /admin/agents/{id}`: forgets a lost machine. Its credentials are refused from
/// now on.
pub(super) async fn remove_agent(
    State(state): State<AppState>,
    auth: Auth,
    axum::extract::Path(agent): axum::extract::Path<String>,
) -> Result<Response, ApiError> {
    let act = Act::RemoveAgent {
        agent: agent.clone(),
    };
    perform_api(&state.inner, auth, act).await?;
    Ok(Json(serde_json::json!({ "id": agent, "status": "REMOVED" })).into_response())
}

/// `POST /admin/agents/{id}/override-locks`: the agent's update locks no longer hold off
/// the bundle the fleet rolls out now; it updates at once (its held connect is answered).
pub(super) async fn override_locks(
    State(state): State<AppState>,
    auth: Auth,
    axum::extract::Path(agent): axum::extract::Path<String>,
) -> Result<Response, ApiError> {
    let act = Act::OverrideLocks {
        agent: agent.clone(),
    };
    let Done::LocksOverridden { release } = perform_api(&state.inner, auth, act).await? else {
        return Err(unexpected());
    };
    Ok(Json(serde_json::json!({ "id": agent, "override_locks": release })).into_response())
}

/// `POST /admin/agents/{id}/labels` `{"set": {…}, "remove": […]}`: the server's own
/// labels of the agent, which win over what the agent says on the same key (an
/// operator's; audited, a refusal too). Answers the agent's server labels and its
/// effective ones.
pub(super) async fn set_labels(
    State(state): State<AppState>,
    auth: Auth,
    axum::extract::Path(agent): axum::extract::Path<String>,
    body: Result<Json<labels::Edit>, JsonRejection>,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    let actor = auth.actor(s, "agent.labels").await?;
    let edit = json_body(body)?;
    let act = Act::Labels {
        agent: agent.clone(),
        edit,
    };
    let Done::Labelled {
        server_labels,
        labels,
    } = actions::perform(s, &actor, act).await?
    else {
        return Err(unexpected());
    };
    Ok(
        Json(serde_json::json!({ "id": agent, "server_labels": server_labels, "labels": labels }))
            .into_response(),
    )
}

/// The body of `POST /admin/agents/{id}/restart` (optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RestartBody {
    #[serde(default)]
    workload: bool,
}

/// `POST /admin/agents/{id}/restart` `{"workload": bool}`: the agent restarts (or only
/// its workload) at its next contact, and says when it did (`last_command` in
/// `/admin/agents`). An operator's; audited.
pub(super) async fn restart_agent(
    State(state): State<AppState>,
    auth: Auth,
    axum::extract::Path(agent): axum::extract::Path<String>,
    body: Option<Json<RestartBody>>,
) -> Result<Response, ApiError> {
    let workload = body.map(|Json(b)| b.workload).unwrap_or_default();
    let act = Act::Restart { agent, workload };
    commanded(perform_api(&state.inner, auth, act).await?)
}

/// `POST /admin/agents/{id}/rotate-credentials`: the agent is offered a new credential
/// at its next contact; the old one is refused once it proves the new.
pub(super) async fn rotate_credentials(
    State(state): State<AppState>,
    auth: Auth,
    axum::extract::Path(agent): axum::extract::Path<String>,
) -> Result<Response, ApiError> {
    let act = Act::RotateCredentials { agent };
    commanded(perform_api(&state.inner, auth, act).await?)
}

/// The body of `POST /admin/agents/{id}/move`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MoveBody {
    to: String,
}

/// `POST /admin/agents/{id}/move` `{"to": URL}`: the agent tries that server and keeps it
/// only if it answers there.
pub(super) async fn move_agent(
    State(state): State<AppState>,
    auth: Auth,
    axum::extract::Path(agent): axum::extract::Path<String>,
    body: Result<Json<MoveBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let MoveBody { to } = json_body(body)?;
    let act = Act::Move { agent, to };
    commanded(perform_api(&state.inner, auth, act).await?)
}

/// The answer to an asked command: its row as `last_command` shows it.
fn commanded(done: Done) -> Result<Response, ApiError> {
    let Done::Commanded(command) = done else {
        return Err(unexpected());
    };
    let mut body = command.to_json();
    body["agent"] = serde_json::json!(command.agent);
    Ok(Json(body).into_response())
}

/// An operator action asked through the API, by whoever the request's token names.
async fn perform_api(s: &Shared, auth: Auth, act: Act) -> Result<Done, ApiError> {
    let actor = auth.actor(s, act.name()).await?;
    Ok(actions::perform(s, &actor, act).await?)
}

/// An action answered with another action's result: a bug of this server.
fn unexpected() -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "the server answered an action with another's result; please report this",
    )
}

pub(super) async fn rollout(
    State(state): State<AppState>,
    auth: Auth,
) -> Result<Response, ApiError> {
    auth.require(&state.inner, Action::Read, "rollout.read")
        .await?;
    rollout_json(&state.inner).await
}

async fn rollout_json(s: &Shared) -> Result<Response, ApiError> {
    match s.fleet.rollouts.status().await? {
        Some(mut status) => {
            // Config rollouts run beside the bundle's: one look shows both.
            let configs = s.fleet.configs.status().await?;
            status["config"] = configs["sets"].clone();
            Ok(Json(status).into_response())
        }
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "no rollout yet: no bundle has been served; drop one into the download directory",
        )),
    }
}

/// The body of `POST /admin/rollout/halt` (optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct HaltBody {
    reason: Option<String>,
}

pub(super) async fn rollout_halt(
    State(state): State<AppState>,
    auth: Auth,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    let actor = auth.actor(s, "rollout.halt").await?;
    let reason = halt_reason(&body)?;
    rollout_step(s, &actor, Step::Halt { reason }).await
}

pub(super) async fn rollout_resume(
    State(state): State<AppState>,
    auth: Auth,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    let actor = auth.actor(s, "rollout.resume").await?;
    rollout_step(s, &actor, Step::Resume).await
}

pub(super) async fn rollout_advance(
    State(state): State<AppState>,
    auth: Auth,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    let actor = auth.actor(s, "rollout.advance").await?;
    rollout_step(s, &actor, Step::Advance).await
}

/// The optional `{"reason": …}` of a halt (an empty body is no reason).
pub(super) fn halt_reason(body: &[u8]) -> Result<Option<String>, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let halt: HaltBody = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("malformed JSON body: {e}")))?;
    if halt.reason.as_ref().is_some_and(|r| r.len() > 1024) {
        return Err(ApiError::bad_request("reason is longer than 1024 bytes"));
    }
    Ok(halt.reason)
}

/// The bundle's rollout after an operator's step, or why it could not be taken.
async fn rollout_step(s: &Shared, actor: &Actor, step: Step) -> Result<Response, ApiError> {
    let act = Act::Rollout {
        target: Target::Bundle,
        step,
    };
    actions::perform(s, actor, act).await?;
    rollout_json(s).await
}

pub(super) async fn metrics(State(state): State<AppState>) -> Result<Response, ApiError> {
    let s = &state.inner;
    // While the database is away, what this server itself counted is still worth
    // scraping; the fleet's counts are left out.
    let (by_version, by_status, waves, health) = if s.fleet.outage.is_down() {
        Default::default()
    } else {
        without_a_busy_database(fleet_counts(s).await)?
    };
    let current = s.fleet.rollouts.current();
    let gauges = RolloutGauges {
        state: current.as_ref().map(|r| r.state.as_str()),
        wave: current.as_ref().map_or(0, |r| r.opened),
        waves,
        halts: HaltCause::ALL
            .iter()
            .map(|c| (c.as_str(), s.fleet.rollouts.halts(*c)))
            .collect(),
        mismatch: s.fleet.rollouts.mismatch().is_some(),
    };
    let config_gauges = if s.fleet.outage.is_down() {
        Default::default()
    } else {
        without_a_busy_database(s.fleet.configs.gauges().await)?
    };
    let mut text = s.metrics.render(
        s.limiter.in_flight(),
        s.limiter.peak(),
        &by_version,
        &by_status,
        &gauges,
        &s.fleet.outage.status(),
    );
    crate::metrics::render_config(&mut text, &s.metrics, &config_gauges);
    let text = match health {
        Some((unhealthy, restarts)) => text + &crate::metrics::health(unhealthy, restarts),
        None => text,
    };
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response())
}

type FleetCounts = (
    Vec<(String, i64)>,
    Vec<(String, i64)>,
    Vec<agent_fleet::rollout::step::WaveStatus>,
    Option<(i64, i64)>,
);

/// The fleet's counts for /metrics: agents by version and by update status, the waves,
/// and health.
async fn fleet_counts(s: &Shared) -> Result<FleetCounts, agent_fleet::FleetError> {
    // The batch only: a contact kept aside says what the agent's last written one said,
    // so it changes none of these counts, and writing every one of them at each scrape
    // (20,000 rows on a server holding that many) undid what keeping them aside saves.
    s.fleet.flush_due_contacts().await;
    let (by_version, by_status) = s.fleet.db.fleet_counts().await?;
    let health = Some(s.fleet.db.health_counts().await?);
    Ok((
        by_version,
        by_status,
        s.fleet.rollouts.wave_counts().await?,
        health,
    ))
}

/// A database too busy to count the fleet leaves the fleet's gauges out of this scrape,
/// as an outage does: the server's own counters are what an operator watches then, and
/// a scrape that failed whole would hide them (100,000 agents on five servers did).
fn without_a_busy_database<T: Default>(
    counted: Result<T, agent_fleet::FleetError>,
) -> Result<T, ApiError> {
    match counted {
        Ok(counts) => Ok(counts),
        Err(e) if e.is_unavailable() => {
            tracing::debug!("/metrics without the fleet's counts: {e}");
            Ok(T::default())
        }
        Err(e) => Err(e.into()),
    }
}

/// `ok` (the server serves its bundle and answers agents), or `degraded` with the
/// reason while the bundle in the download directory is refused (it still answers
/// agents: `200` either way, so a supervisor does not restart it over a file); then
/// what an operator should know about its place in the fleet: a bundle that is not the
/// fleet's rollout, a file whose policy the fleet's overrode, a database it cannot reach.
pub(super) async fn healthz(State(state): State<AppState>) -> Response {
    let s = &state.inner;
    let mut text = match s.store.refusal() {
        None => String::from("ok\n"),
        Some(why) => format!("degraded\nbundle refused: {why}\n"),
    };
    if let Some(mismatch) = s.fleet.rollouts.mismatch() {
        text.push_str(&format!("bundle mismatch: {mismatch}\n"));
    }
    if let Some(said) = s.fleet.deployments.disagreement() {
        text.push_str(&format!("policy differs: {said}\n"));
    }
    let database = s.fleet.outage.status();
    if !database.up {
        text.push_str(&format!(
            "database unreachable for {:.0}s ({}); agents are answered from memory, {} writes queued\n",
            database.down_for.unwrap_or(0.0),
            database.reason.unwrap_or_default(),
            database.queued
        ));
    }
    text.into_response()
}
