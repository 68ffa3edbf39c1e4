//! `/admin/telemetry`: where agents export their own telemetry (see
//! [`agent_fleet::telemetry`]), live fleet data. Reading needs a viewer; setting and
//! clearing a destination is an operator action ([`crate::actions`]): role checked,
//! audited, refused in words.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use agent_fleet::operators::Action;
use agent_fleet::telemetry::NewDestination;

use super::operators::Auth;
use super::{AppState, json_body};
use crate::actions::{self, Act, Done};
use crate::error::ApiError;

/// `GET /admin/telemetry`: `{"destinations": [...]}`, each as
/// [`agent_fleet::telemetry::Destination::to_json`] says it.
pub(super) async fn list(State(state): State<AppState>, auth: Auth) -> Result<Response, ApiError> {
    let s = &state.inner;
    auth.require(s, Action::Read, "telemetry.read").await?;
    let all = s.fleet.db.telemetry_destinations().await?;
    let rows: Vec<_> = all.iter().map(|d| d.to_json()).collect();
    Ok(Json(serde_json::json!({ "destinations": rows })).into_response())
}

/// `POST /admin/telemetry`: `{"selector", "metrics", "logs", "headers": {NAME: VALUE}}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SetBody {
    #[serde(default)]
    selector: String,
    metrics: String,
    #[serde(default)]
    logs: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
}

pub(super) async fn set(
    State(state): State<AppState>,
    auth: Auth,
    body: Result<Json<SetBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let body = json_body(body)?;
    let act = Act::TelemetrySet(NewDestination {
        selector: body.selector,
        metrics: body.metrics,
        logs: body.logs.filter(|l| !l.is_empty()),
        headers: body.headers,
    });
    perform(&state.inner, auth, act).await
}

/// `DELETE /admin/telemetry?selector=S`.
#[derive(Debug, Deserialize)]
pub(super) struct ClearQuery {
    #[serde(default)]
    selector: String,
}

pub(super) async fn clear(
    State(state): State<AppState>,
    auth: Auth,
    Query(query): Query<ClearQuery>,
) -> Result<Response, ApiError> {
    let act = Act::TelemetryClear {
        selector: query.selector,
    };
    perform(&state.inner, auth, act).await
}

async fn perform(s: &crate::state::Shared, auth: Auth, act: Act) -> Result<Response, ApiError> {
    let actor = auth.actor(s, act.name()).await?;
    let Done::Telemetry(destination) = actions::perform(s, &actor, act).await? else {
        return Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the server answered an action with another's result; please report this",
        ));
    };
    Ok(Json(destination.to_json()).into_response())
}
