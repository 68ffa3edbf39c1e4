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
use crate::credentials::{self, Verdict};
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
    let issue = match authenticate(s, &hello.id, &headers).await? {
        Verdict::Allow { issue } => issue,
        Verdict::Deny(why) => return Err(unauthorized(&hello.id, why)),
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
    let token = if issue {
        issue_token(s, &hello.id).await?
    } else {
        None
    };
    if accepted {
        inc(&s.metrics.registrations_accepted);
        let mut body =
            serde_json::json!({ "status": "accepted", "expected": expected.to_string() });
        if let Some(token) = token {
            body["token"] = serde_json::Value::String(token);
        }
        return Ok(Json(body).into_response());
    }
    inc(&s.metrics.registrations_refused);
    tracing::info!(agent = %hello.id, version = %agent_version, expected = %expected, "refused agent");
    let body = NotSupported {
        error: wire::NOT_SUPPORTED.to_owned(),
        expected: expected.to_string(),
        download: wire::DOWNLOAD_PATH.to_owned(),
        sha256: Some(bundle.info.sha256.clone()),
        token,
    };
    Ok((StatusCode::CONFLICT, Json(body)).into_response())
}

/// Whether this request may speak for the id (see [`crate::credentials`]).
async fn authenticate(
    s: &crate::routes::Shared,
    id: &str,
    headers: &HeaderMap,
) -> Result<Verdict, ApiError> {
    let known = s.db.credentials(id).await?;
    let enrollment = headers
        .get(wire::ENROLLMENT_HEADER)
        .and_then(|v| v.to_str().ok());
    Ok(credentials::decide(
        &known,
        credentials::bearer(headers),
        &s.enrollment_token,
        enrollment,
    ))
}

fn unauthorized(id: &str, why: &'static str) -> ApiError {
    tracing::warn!(agent = %id, "refused a call without the agent's credentials: {why}");
    ApiError::new(StatusCode::UNAUTHORIZED, why)
}

/// A token for an id that has none; `None` if another server just gave it one.
async fn issue_token(s: &crate::routes::Shared, id: &str) -> Result<Option<String>, ApiError> {
    let token = credentials::new_token().map_err(|e| {
        tracing::error!("no randomness for a token: {e}");
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "no randomness")
    })?;
    if s.db
        .issue_token(id, &credentials::hash_token(&token))
        .await?
    {
        tracing::info!(agent = %id, "issued the agent its credentials");
        Ok(Some(token))
    } else {
        Ok(None)
    }
}

/// `POST /agentupdate/report`, from any version.
pub(super) async fn report(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Json<Report>, JsonRejection>,
) -> Result<Response, ApiError> {
    let report = json_body(body)?;
    check_id(&report.id)?;
    // Nobody reports for an agent but that agent: a forged failure could halt a rollout.
    if let Verdict::Deny(why) = authenticate(&state.inner, &report.id, &headers).await? {
        return Err(unauthorized(&report.id, why));
    }
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
