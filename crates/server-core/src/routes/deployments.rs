//! `/admin/deployments`: who gets which release (see [`agent_fleet::deployments`]). Every
//! change is an operator action ([`crate::actions`]): role checked, audited, refused in
//! words; reading needs a viewer.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use agent_fleet::deployments::{self, Change, Deployment, NewDeployment};
use agent_fleet::operators::Action;
use agent_fleet::rollout::plan::Plan;

use super::admin::halt_reason;
use super::operators::Auth;
use super::{AppState, Shared, json_body};
use crate::actions::{self, Act, DeploymentAct, Done, Step, Target};
use crate::error::ApiError;

/// A deployment's rollout policy as the API and the CLI write it: what is left out keeps
/// its value (the deployment's own, else `[rollout]`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(super) struct PolicyBody {
    waves: Option<Vec<String>>,
    wave_wait: Option<u64>,
    max_failures: Option<String>,
    agent_deadline: Option<u64>,
}

impl PolicyBody {
    fn is_empty(&self) -> bool {
        self.waves.is_none()
            && self.wave_wait.is_none()
            && self.max_failures.is_none()
            && self.agent_deadline.is_none()
    }

    /// The plan `base` becomes with these values, checked as `[rollout]` is; `None` when
    /// none is given.
    fn over(&self, base: &Plan) -> Result<Option<Plan>, ApiError> {
        if self.is_empty() {
            return Ok(None);
        }
        let waves: Vec<String> = match &self.waves {
            Some(w) => w.clone(),
            None => base.waves.iter().map(ToString::to_string).collect(),
        };
        let max_failures = match &self.max_failures {
            Some(m) => m.clone(),
            None => base.max_failures.to_string(),
        };
        Plan::new(
            &waves,
            self.wave_wait.unwrap_or(base.wave_wait),
            &max_failures,
            self.agent_deadline.unwrap_or(base.agent_deadline),
        )
        .map(Some)
        .map_err(ApiError::bad_request)
    }
}

/// `POST /admin/deployments`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CreateBody {
    name: String,
    #[serde(default)]
    selector: String,
    release: String,
    #[serde(default)]
    priority: i64,
    #[serde(default)]
    policy: PolicyBody,
}

/// `PATCH /admin/deployments/<name>`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SetBody {
    selector: Option<String>,
    release: Option<String>,
    priority: Option<i64>,
    #[serde(default)]
    policy: PolicyBody,
}

/// A deployment as the API shows it: its row, how many agents follow it, its rollout.
async fn json_of(s: &Shared, d: &Deployment) -> Result<serde_json::Value, ApiError> {
    let mut value = d.to_json();
    let rollout = match s.fleet.deployments.rollouts(&d.name) {
        Some(rollouts) => rollouts.status().await?,
        None => None,
    };
    value["rollout"] = rollout.unwrap_or(serde_json::Value::Null);
    if d.is_default() {
        // default's release is the fleet's current one.
        if let crate::store::Current::Ready(release) = s.store.current() {
            value["release"] = serde_json::json!(release.version().to_string());
        }
    }
    Ok(value)
}

/// How many agents follow each deployment, from their labels as the fleet has them.
async fn agent_counts(s: &Shared) -> Result<std::collections::HashMap<String, u64>, ApiError> {
    s.fleet.flush_contacts().await;
    let rows = s.fleet.db.agents(None, None).await?;
    let opamp = s.fleet.db.opamp_agents().await?;
    let mut counts = std::collections::HashMap::new();
    for a in rows {
        let labels = a.labels_as_seen(opamp.get(&a.id).map(|o| o.view.as_str()));
        *counts
            .entry(s.fleet.deployments.follows(&labels))
            .or_insert(0) += 1;
    }
    Ok(counts)
}

pub(super) async fn list(State(state): State<AppState>, auth: Auth) -> Result<Response, ApiError> {
    let s = &state.inner;
    auth.require(s, Action::Read, "deployments.read").await?;
    let counts = agent_counts(s).await?;
    let mut out = Vec::new();
    for d in deployments::list(&s.fleet.db).await? {
        let mut value = json_of(s, &d).await?;
        value["agents"] = serde_json::json!(counts.get(&d.name).copied().unwrap_or(0));
        out.push(value);
    }
    Ok(Json(serde_json::json!({ "deployments": out })).into_response())
}

pub(super) async fn show(
    State(state): State<AppState>,
    auth: Auth,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    auth.require(s, Action::Read, "deployments.read").await?;
    let Some(d) = deployments::get(&s.fleet.db, &name).await? else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no deployment {name:?}; list them with `update-server deployment list`"),
        ));
    };
    let counts = agent_counts(s).await?;
    let mut value = json_of(s, &d).await?;
    value["agents"] = serde_json::json!(counts.get(&d.name).copied().unwrap_or(0));
    Ok(Json(value).into_response())
}

/// Answers a done deployment action with the deployment as it is now.
async fn answer(
    s: &Shared,
    auth: Auth,
    act: Act,
    status: StatusCode,
) -> Result<Response, ApiError> {
    let actor = auth.actor(s, act.name()).await?;
    let d = match actions::perform(s, &actor, act).await? {
        Done::Deployment(d) => d,
        Done::Parked(approval) => return Ok(super::parked(&approval)),
        _ => return Err(super::other_result()),
    };
    let mut value = json_of(s, &d).await?;
    if status == StatusCode::OK && deployments::get(&s.fleet.db, &d.name).await?.is_none() {
        value["removed"] = serde_json::json!(true);
    }
    Ok((status, Json(value)).into_response())
}

pub(super) async fn create(
    State(state): State<AppState>,
    auth: Auth,
    body: Result<Json<CreateBody>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    let body = json_body(body)?;
    let policy = body.policy.over(&s.fleet.rollouts.plan())?;
    let act = Act::Deployment(DeploymentAct::Create(NewDeployment {
        name: body.name,
        selector: body.selector,
        release: body.release,
        priority: body.priority,
        policy,
    }));
    answer(s, auth, act, StatusCode::CREATED).await
}

pub(super) async fn set(
    State(state): State<AppState>,
    auth: Auth,
    Path(name): Path<String>,
    body: Result<Json<SetBody>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    let body = json_body(body)?;
    // What is not given keeps the deployment's own value, else `[rollout]`'s.
    let base = match deployments::get(&s.fleet.db, &name).await? {
        Some(Deployment {
            policy: Some(own), ..
        }) => own,
        _ => (*s.fleet.rollouts.plan()).clone(),
    };
    let policy = body.policy.over(&base)?;
    let act = Act::Deployment(DeploymentAct::Set {
        name,
        change: Change {
            selector: body.selector,
            release: body.release,
            priority: body.priority,
            policy,
        },
    });
    answer(s, auth, act, StatusCode::OK).await
}

pub(super) async fn remove(
    State(state): State<AppState>,
    auth: Auth,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let act = Act::Deployment(DeploymentAct::Remove { name });
    answer(&state.inner, auth, act, StatusCode::OK).await
}

/// `POST /admin/deployments/<name>/halt|resume|advance`: the deployment's rollout.
pub(super) async fn step(
    State(state): State<AppState>,
    auth: Auth,
    Path((name, step)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    let step = match step.as_str() {
        "halt" => Step::Halt {
            reason: halt_reason(&body)?,
        },
        "resume" => Step::Resume,
        "advance" => Step::Advance,
        other => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!("no step {other:?}: POST …/halt, …/resume or …/advance"),
            ));
        }
    };
    let target = if name == deployments::DEFAULT {
        Target::Bundle
    } else {
        Target::Deployment(name.clone())
    };
    let act = Act::Rollout { target, step };
    let actor = auth.actor(s, act.name()).await?;
    actions::perform(s, &actor, act).await?;
    let Some(d) = deployments::get(&s.fleet.db, &name).await? else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no deployment {name:?}"),
        ));
    };
    Ok(Json(json_of(s, &d).await?).into_response())
}
