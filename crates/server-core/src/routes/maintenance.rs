//! `/admin/maintenance`: each deployment's maintenance windows, fleet policy kept in the
//! fleet database (see [`agent_fleet::policy`]). Reading needs a viewer
//! (`?deployment=` picks one deployment's); adding and removing a window is an operator
//! action ([`crate::actions`]): role checked, audited, refused in words.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use agent_fleet::db::now_ms;
use agent_fleet::deployments::DEFAULT;
use agent_fleet::operators::Action;
use agent_fleet::policy::{self, NewWindow};

use super::operators::Auth;
use super::{AppState, json_body};
use crate::actions::{self, Act, Done, MaintenanceAct};
use crate::error::ApiError;

#[derive(Debug, Default, Deserialize)]
pub(super) struct ListQuery {
    deployment: Option<String>,
}

pub(super) async fn list(
    State(state): State<AppState>,
    auth: Auth,
    Query(query): Query<ListQuery>,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    auth.require(s, Action::Read, "maintenance.read").await?;
    let now = now_ms().div_euclid(1000);
    let mut rows = policy::windows(&s.fleet.db).await?;
    if let Some(deployment) = &query.deployment {
        rows.retain(|w| &w.window.deployment == deployment);
    }
    Ok(Json(crate::maintenance::listing(&rows, now)).into_response())
}

/// `POST /admin/maintenance`: a window, as a `[[maintenance]]` table says it, with the
/// deployment it belongs to (`default` when not given).
/// (A key neither knows is refused by the window's own table.)
#[derive(Debug, Deserialize)]
pub(super) struct AddBody {
    #[serde(default)]
    deployment: Option<String>,
    #[serde(flatten)]
    window: crate::maintenance::MaintenanceSection,
}

pub(super) async fn add(
    State(state): State<AppState>,
    auth: Auth,
    body: Result<Json<AddBody>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    let body = json_body(body)?;
    let deployment = body.deployment.unwrap_or_else(|| DEFAULT.to_owned());
    let window: NewWindow = crate::maintenance::windows(std::slice::from_ref(&body.window))
        .map_err(|e| ApiError::bad_request(e.message))?
        .into_iter()
        .next()
        .map(|w| NewWindow { deployment, ..w })
        .ok_or_else(|| ApiError::bad_request("no window given"))?;
    perform(
        s,
        auth,
        Act::Maintenance(MaintenanceAct::Add(window)),
        StatusCode::CREATED,
    )
    .await
}

pub(super) async fn remove(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = id.parse::<i64>().map_err(|_| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no maintenance window {id:?}: windows are numbered; list them with `update-server maintenance list`"),
        )
    })?;
    let act = Act::Maintenance(MaintenanceAct::Remove { id });
    perform(&state.inner, auth, act, StatusCode::OK).await
}

async fn perform(
    s: &crate::state::Shared,
    auth: Auth,
    act: Act,
    status: StatusCode,
) -> Result<Response, ApiError> {
    let actor = auth.actor(s, act.name()).await?;
    let Done::Window(window) = actions::perform(s, &actor, act).await? else {
        return Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the server answered an action with another's result; please report this",
        ));
    };
    let now = now_ms().div_euclid(1000);
    let listed = crate::maintenance::listing(std::slice::from_ref(&*window), now);
    let value = listed["windows"]
        .get(0)
        .cloned()
        .unwrap_or(serde_json::Value::Null);
    Ok((status, Json(value)).into_response())
}
