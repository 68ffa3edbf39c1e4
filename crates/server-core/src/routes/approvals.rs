//! `/admin/approvals` and `/admin/approval`: the changes waiting for a second operator's
//! approval, deciding them, and the fleet's switch. Every decision and switch is an
//! operator action ([`crate::actions`]): role checked, applied or refused, audited.

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use agent_fleet::approvals::Decision;
use agent_fleet::db::now_ms;
use agent_fleet::operators::Action;

use super::admin::halt_reason;
use super::operators::Auth;
use super::{AppState, Shared, json_body};
use crate::actions::{self, Act, Done};
use crate::error::ApiError;

/// `GET /admin/approvals` (a viewer's): the switch, how long a change waits, and the
/// changes, waiting ones first.
pub(super) async fn list(State(state): State<AppState>, auth: Auth) -> Result<Response, ApiError> {
    let s = &state.inner;
    auth.require(s, Action::Read, "approval.list").await?;
    Ok(Json(list_json(s).await?).into_response())
}

/// The list as the API and the CLI show it.
pub(crate) async fn list_json(s: &Shared) -> Result<serde_json::Value, ApiError> {
    let approvals = s.fleet.approvals();
    let now = now_ms();
    let listed: Vec<serde_json::Value> = approvals
        .list()
        .await?
        .iter()
        .map(|a| a.to_json(now))
        .collect();
    Ok(serde_json::json!({
        "required": approvals.required().await?,
        "expires": s.approval_expires.as_secs(),
        "approvals": listed,
    }))
}

/// `GET /admin/approvals/<id>` (an operator's: those who decide): the change and, as
/// `change`, exactly what approving it applies (a configuration set's files, a
/// deployment's change, the kept release), so that it is read before it is approved.
pub(super) async fn show(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    auth.require(s, Action::Change, "approval.show").await?;
    let not_found = || {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "no approval {:?}; `update-server approval list` shows them",
                agent_protocol::shown::shown(&id, 40)
            ),
        )
    };
    let id: i64 = id.parse().map_err(|_| not_found())?;
    let Some(approval) = s.fleet.approvals().get(id).await? else {
        return Err(not_found());
    };
    let mut value = approval.to_json(now_ms());
    value["change"] = approval.payload.clone();
    Ok(Json(value).into_response())
}

/// `POST /admin/approvals/<id>/approve|reject`, with `{"reason": "…"}` optionally.
pub(super) async fn decide(
    State(state): State<AppState>,
    auth: Auth,
    Path((id, decision)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    let decision = match decision.as_str() {
        "approve" => Decision::Approve,
        "reject" => Decision::Reject,
        other => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!("no decision {other:?}: POST …/approve or …/reject"),
            ));
        }
    };
    let Ok(id) = id.parse::<i64>() else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "no approval {:?}: approvals are numbered; `update-server approval list` shows them",
                agent_protocol::shown::shown(&id, 40)
            ),
        ));
    };
    let reason = halt_reason(&body)?;
    let act = Act::Decide {
        id,
        decision,
        reason,
    };
    let actor = auth.actor(s, act.name()).await?;
    match actions::perform(s, &actor, act).await? {
        Done::Decided { approval, applied } => {
            let mut value = approval.to_json(now_ms());
            value["applied"] = serde_json::json!(applied.is_some());
            Ok(Json(value).into_response())
        }
        _ => Err(super::other_result()),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Switch {
    required: bool,
}

/// `PUT /admin/approval` `{"required": true}` (an admin's): the fleet's switch, on every
/// server at once.
pub(super) async fn require(
    State(state): State<AppState>,
    auth: Auth,
    body: Result<Json<Switch>, JsonRejection>,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    let switch = json_body(body)?;
    let act = Act::RequireApproval {
        on: switch.required,
    };
    let actor = auth.actor(s, act.name()).await?;
    actions::perform(s, &actor, act).await?;
    Ok(Json(serde_json::json!({
        "required": s.fleet.approvals().required().await?,
        "expires": s.approval_expires.as_secs(),
    }))
    .into_response())
}
