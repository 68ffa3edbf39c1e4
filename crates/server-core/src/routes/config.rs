//! Remote configuration at the edge: `/admin/config...` (bearer token) to push, list,
//! delete and steer sets, and `POST /agent/config-status` for agents' answers. The
//! fleet model ([`agent_fleet::config`]) decides; this translates.

use std::collections::BTreeMap;

use crate::actions::{self, Act, Step, Target};
use agent_fleet::config::directive;
use agent_fleet::config::guard::Consent;
use agent_fleet::db::now_ms;
use agent_fleet::outage::Deferred;
use agent_protocol::config_set;
use agent_protocol::wire::ConfigStatus;
use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::agents::{authenticate_enrolled, check_id, checked_error};
use super::operators::Auth;
use super::{AppState, Shared, json_body};
use crate::error::ApiError;
use crate::metrics::inc;
use agent_fleet::operators::Action;

/// Largest `PUT /admin/config/<group>` body: a full set, JSON-escaped (every byte of
/// text may take six), and room for the names.
pub(super) const MAX_CONFIG_BODY: usize = 6 * config_set::MAX_BYTES + 64 * 1024;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PutSet {
    files: BTreeMap<String, String>,
    /// A set with no files is meant (it empties the agents' conf/workload/).
    #[serde(default)]
    allow_empty: bool,
    /// A set that keeps none of the group's current file names is meant.
    #[serde(default)]
    replace_all: bool,
}

/// `?allow_empty=true&replace_all=true`, the same consents as the body's fields.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PutQuery {
    #[serde(default)]
    allow_empty: bool,
    #[serde(default)]
    replace_all: bool,
}

/// A group's name, or `selector:S` for the agents a selector chooses.
fn check_group(group: &str) -> Result<(), ApiError> {
    directive::check_key(group).map_err(ApiError::bad_request)
}

/// `PUT /admin/config/<group>`.
pub(super) async fn put(
    State(state): State<AppState>,
    auth: Auth,
    Path(group): Path<String>,
    query: Result<Query<PutQuery>, QueryRejection>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    let caller = auth.require(s, Action::Change, "config.push").await?;
    let Query(query) = query.map_err(|e| {
        ApiError::bad_request(format!(
            "the query takes allow_empty=true and replace_all=true only: {}",
            e.body_text()
        ))
    })?;
    check_group(&group)?;
    // Parsed here, not by an extractor, so that text that is not UTF-8 or a set that is
    // not `{"files": {name: text}}` gets a 400 that says so.
    let put: PutSet = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(format!(
            "body must be {{\"files\": {{\"<name>\": \"<UTF-8 text>\", ...}}}}: {e}"
        ))
    })?;
    let consent = Consent {
        allow_empty: put.allow_empty || query.allow_empty,
        replace_all: put.replace_all || query.replace_all,
    };
    let act = Act::ConfigPush {
        group,
        files: put.files,
        consent,
    };
    match actions::perform(s, &caller.actor(), act).await? {
        actions::Done::ConfigPushed(pushed) => Ok(Json(serde_json::json!({
            "group": pushed.group,
            "hash": pushed.hash,
            "created_at": pushed.created_at as f64 / 1000.0,
        }))
        .into_response()),
        actions::Done::Parked(approval) => Ok(super::parked(&approval)),
        _ => Err(super::other_result()),
    }
}

/// `GET /admin/config`.
pub(super) async fn list(State(state): State<AppState>, auth: Auth) -> Result<Response, ApiError> {
    auth.require(&state.inner, Action::Read, "config.list")
        .await?;
    Ok(Json(state.inner.fleet.configs.status().await?).into_response())
}

/// `DELETE /admin/config/<group>`.
pub(super) async fn delete(
    State(state): State<AppState>,
    auth: Auth,
    Path(group): Path<String>,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    let caller = auth.require(s, Action::Change, "config.delete").await?;
    check_group(&group)?;
    if !s.fleet.configs.delete(&group).await? {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("group {group} has no configuration set"),
        ));
    }
    caller
        .record(s, "config.delete", serde_json::json!({ "group": group }))
        .await;
    Ok(Json(serde_json::json!({ "group": group, "deleted": true })).into_response())
}

/// `POST /admin/config/<group>/halt|resume|advance`.
pub(super) async fn steer(
    State(state): State<AppState>,
    auth: Auth,
    Path((group, action)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    let what = format!(
        "config.{}",
        if matches!(action.as_str(), "halt" | "resume" | "advance") {
            action.as_str()
        } else {
            "steer"
        }
    );
    let actor = auth.actor(s, &what).await?;
    check_group(&group)?;
    let step = match action.as_str() {
        "halt" => Step::Halt {
            reason: super::admin::halt_reason(&body)?,
        },
        "resume" => Step::Resume,
        "advance" => Step::Advance,
        other => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!("no action {other:?}: use halt, resume or advance"),
            ));
        }
    };
    let act = Act::Rollout {
        target: Target::Config(group),
        step,
    };
    actions::perform(s, &actor, act).await?;
    Ok(Json(s.fleet.configs.status().await?).into_response())
}

/// `POST /agent/config-status`: what an agent made of a set (its bearer token, as for
/// reports: a forged `FAILED` could halt a config rollout).
pub(super) async fn status(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Json<ConfigStatus>, JsonRejection>,
) -> Result<Response, ApiError> {
    let s: &Shared = &state.inner;
    let mut status = json_body(body)?;
    check_id(&status.id)?;
    authenticate_enrolled(s, &status.id, &headers, super::agents::REPORT_NOT_ENROLLED).await?;
    if status.hash.len() != 64 || !status.hash.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ApiError::bad_request("hash must be 64 hex digits"));
    }
    status.error = checked_error(status.error.take(), "configuration status")?;
    inc(&s.metrics.config_statuses);
    tracing::info!(agent = %status.id, hash = %status.hash, status = status.status.as_str(), error = ?status.error, "configuration status");
    let status = Deferred::ConfigStatus {
        status,
        at_ms: now_ms(),
    };
    let saved = s.fleet.save_within(status, super::ANSWER_WITHIN).await?;
    Ok(Json(serde_json::json!({ "status": saved.as_str() })).into_response())
}
