//! `POST /agent/register`, `/agent/connect` (the version directive, as the rollout says)
//! and `/agentupdate/report`.

use agent_protocol::AgentVersion;
use agent_protocol::wire::{self, AgentHello, NotSupported, Report};
use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use super::{AppState, json_body, ready};
use crate::error::ApiError;
use crate::metrics::inc;

fn agent_version_header(headers: &HeaderMap) -> Result<AgentVersion, ApiError> {
    let raw = headers.get(wire::AGENT_VERSION_HEADER).ok_or_else(|| {
        ApiError::bad_request(format!(
            "missing {} header (VERSION+BUILD)",
            wire::AGENT_VERSION_HEADER
        ))
    })?;
    let text = raw.to_str().map_err(|_| {
        ApiError::bad_request(format!("{} header is not text", wire::AGENT_VERSION_HEADER))
    })?;
    text.parse()
        .map_err(|e| ApiError::bad_request(format!("{} header: {e}", wire::AGENT_VERSION_HEADER)))
}

fn check_id(id: &str) -> Result<(), ApiError> {
    if id.trim().is_empty() || id.len() > 128 {
        return Err(ApiError::bad_request("id must be 1 to 128 characters"));
    }
    Ok(())
}

fn check_hello(hello: &AgentHello) -> Result<(), ApiError> {
    check_id(&hello.id)?;
    if hello.name.len() > 256 || hello.platform.len() > 128 {
        return Err(ApiError::bad_request("name or platform is too long"));
    }
    if hello.group.as_ref().is_some_and(|g| g.len() > 64) {
        return Err(ApiError::bad_request("group is longer than 64 characters"));
    }
    Ok(())
}

/// `POST /agent/register` and `/agent/connect`: the version directive.
pub(super) async fn register(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Json<AgentHello>, JsonRejection>,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    let hello = json_body(body)?;
    check_hello(&hello)?;
    let agent_version = agent_version_header(&headers)?;
    let bundle = match ready(s) {
        Ok(b) => b,
        Err(r) => return Ok(*r),
    };
    s.db.touch_agent(
        &hello.id,
        &hello.name,
        &hello.platform,
        &agent_version.to_string(),
        hello.group.as_deref(),
    )
    .await?;
    let answer = s
        .rollouts
        .answer(
            &hello.id,
            hello.group.as_deref().unwrap_or(""),
            &agent_version,
        )
        .await?;
    // Before the first rollout is read (a bundle just dropped), the bundle speaks alone.
    let (accepted, expected) = match answer {
        Some(a) => (a.accepted, a.expected),
        None => (
            s.policy.accepts(bundle.version(), &agent_version),
            bundle.version().clone(),
        ),
    };
    if accepted {
        inc(&s.metrics.registrations_accepted);
        return Ok(Json(
            serde_json::json!({ "status": "accepted", "expected": expected.to_string() }),
        )
        .into_response());
    }
    inc(&s.metrics.registrations_refused);
    tracing::info!(agent = %hello.id, version = %agent_version, expected = %expected, "refused agent");
    let body = NotSupported {
        error: wire::NOT_SUPPORTED.to_owned(),
        expected: expected.to_string(),
        download: wire::DOWNLOAD_PATH.to_owned(),
        sha256: Some(bundle.info.sha256.clone()),
    };
    Ok((StatusCode::CONFLICT, Json(body)).into_response())
}

/// `POST /agentupdate/report`, from any version.
pub(super) async fn report(
    State(state): State<AppState>,
    body: Result<Json<Report>, JsonRejection>,
) -> Result<Response, ApiError> {
    let report = json_body(body)?;
    check_id(&report.id)?;
    if report.error.as_ref().is_some_and(|e| e.len() > 4096) {
        return Err(ApiError::bad_request(
            "error text is longer than 4096 bytes",
        ));
    }
    inc(&state.inner.metrics.reports);
    tracing::info!(agent = %report.id, from = %report.from, to = %report.to, status = report.status.as_str(), error = ?report.error, "update report");
    state.inner.db.record_report(&report).await?;
    state.inner.rollouts.report(&report).await?;
    Ok(Json(serde_json::json!({ "status": "recorded" })).into_response())
}
