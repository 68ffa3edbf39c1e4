//! `POST /agent/register`, `/agent/connect` (the version directive, as the rollout says,
//! and the configuration set the agent should run) and `/agentupdate/report`.

use agent_protocol::AgentVersion;
use agent_protocol::wire::{self, AgentHello, ConnectBody, NotSupported, Report};
use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use agent_fleet::credentials::{self, Verdict};
use agent_fleet::db::{Credentials, now_ms, now_secs};
use agent_fleet::outage::Deferred;
use agent_fleet::rollout::Answer;

use super::{AppState, Shared, json_body, ready};
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

pub(super) fn check_id(id: &str) -> Result<(), ApiError> {
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

fn check_config_hash(hash: &str) -> Result<(), ApiError> {
    if hash.len() > 64 {
        return Err(ApiError::bad_request(
            "config_hash is longer than 64 characters",
        ));
    }
    Ok(())
}

/// `POST /agent/register` and `/agent/connect`: the version directive.
pub(super) async fn register(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Json<ConnectBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    let ConnectBody { hello, config_hash } = json_body(body)?;
    check_hello(&hello)?;
    check_config_hash(&config_hash)?;
    let agent_version = agent_version_header(&headers)?;
    let bundle = match ready(s) {
        Ok(b) => b,
        Err(r) => return Ok(*r),
    };
    let issue = match authenticate(s, &hello.id, &headers).await? {
        Verdict::Allow { issue } => issue,
        Verdict::Deny(why) => return Err(unauthorized(&hello.id, why)),
    };
    s.fleet
        .save(Deferred::Contact {
            id: hello.id.clone(),
            name: hello.name.clone(),
            platform: hello.platform.clone(),
            version: agent_version.to_string(),
            group: hello.group.clone(),
            config_hash: Some(config_hash.clone()),
            at: now_secs(),
        })
        .await?;
    let answer = directive(s, &hello, &agent_version).await?;
    // Before the first rollout is read (a bundle just dropped), the bundle speaks alone.
    let (accepted, expected) = match answer {
        Some(a) => (a.accepted, a.expected),
        None => (
            s.policy.accepts(bundle.version(), &agent_version),
            bundle.version().clone(),
        ),
    };
    // Credentials are issued once, in the database; while it is away, the agent gets
    // its token at a later register.
    let token = if issue && !s.fleet.outage.is_down() {
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
        if let Some(set) = config_directive(s, &hello, &config_hash).await? {
            inc(&s.metrics.configs_sent);
            body["config"] = serde_json::to_value(set).unwrap_or_default();
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

/// The directive for this agent, from the database, or from what this server last read
/// when the database is away.
async fn directive(
    s: &Shared,
    hello: &AgentHello,
    version: &AgentVersion,
) -> Result<Option<Answer>, ApiError> {
    if !s.fleet.outage.is_down() {
        let group = hello.group.as_deref().unwrap_or("");
        match s.fleet.rollouts.answer(&hello.id, group, version).await {
            Ok(answer) => return Ok(answer),
            Err(e) if e.is_unavailable() => s.fleet.outage.went_down(&e),
            Err(e) => return Err(e.into()),
        }
    }
    let (answer, told) = s.fleet.rollouts.answer_offline(&hello.id, version);
    if let Some(rollout) = told {
        s.fleet.outage.defer(Deferred::Told {
            rollout,
            agent: hello.id.clone(),
            at_ms: now_ms(),
        });
    }
    Ok(answer)
}

/// The configuration set this agent should run, if it runs another. While the database
/// is away no set is sent: an agent keeps the set it has until the fleet's record of
/// who was sent what can be written.
async fn config_directive(
    s: &Shared,
    hello: &AgentHello,
    running: &str,
) -> Result<Option<wire::ConfigPayload>, ApiError> {
    if s.fleet.outage.is_down() {
        return Ok(None);
    }
    let group = hello.group.as_deref().unwrap_or("");
    match s.fleet.configs.answer(&hello.id, group, running).await {
        Ok(set) => Ok(set),
        Err(e) if e.is_unavailable() => {
            s.fleet.outage.went_down(&e);
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

/// What the fleet knows of the id's credentials: from the database, or, while it is
/// away, as this server last read them. An id this server never checked cannot be
/// checked then: `503`, and the agent tries again (or another server).
async fn known_credentials(s: &Shared, id: &str) -> Result<Credentials, ApiError> {
    if !s.fleet.outage.is_down() {
        match s.fleet.db.credentials(id).await {
            Ok(known) => {
                s.fleet.outage.remember_credentials(id, &known);
                return Ok(known);
            }
            Err(e) if e.is_unavailable() => s.fleet.outage.went_down(&e),
            Err(e) => return Err(e.into()),
        }
    }
    s.fleet.outage.known_credentials(id).ok_or_else(|| {
        ApiError::unavailable(
            "the fleet database is unreachable and this server has not seen this agent yet; try again shortly",
            s.retry_after,
        )
    })
}

/// `Authorization: Bearer <token>`, if sent.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

/// Whether this request may speak for the id (see [`agent_fleet::credentials`]).
pub(super) async fn authenticate(
    s: &Shared,
    id: &str,
    headers: &HeaderMap,
) -> Result<Verdict, ApiError> {
    let known = known_credentials(s, id).await?;
    let enrollment = headers
        .get(wire::ENROLLMENT_HEADER)
        .and_then(|v| v.to_str().ok());
    Ok(credentials::decide(
        &known,
        bearer(headers),
        &s.enrollment_token,
        enrollment,
    ))
}

pub(super) fn unauthorized(id: &str, why: &'static str) -> ApiError {
    tracing::warn!(agent = %id, "refused a call without the agent's credentials: {why}");
    ApiError::new(StatusCode::UNAUTHORIZED, why)
}

/// A token for an id that has none; `None` if another server just gave it one.
async fn issue_token(s: &Shared, id: &str) -> Result<Option<String>, ApiError> {
    let token = credentials::new_token().map_err(|e| {
        tracing::error!("no randomness for a token: {e}");
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "no randomness")
    })?;
    let hash = credentials::hash_token(&token);
    match s.fleet.db.issue_token(id, &hash).await {
        Ok(true) => {
            tracing::info!(agent = %id, "issued the agent its credentials");
            s.fleet
                .outage
                .remember_credentials(id, &Credentials::Hash(hash));
            Ok(Some(token))
        }
        Ok(false) => Ok(None),
        Err(e) if e.is_unavailable() => {
            s.fleet.outage.went_down(&e);
            Ok(None)
        }
        Err(e) => Err(e.into()),
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
    state
        .inner
        .fleet
        .save(Deferred::Report {
            report,
            at_ms: now_ms(),
        })
        .await?;
    // Queued or written, it is the server's now: the agent may forget it.
    let status = if state.inner.fleet.outage.is_down() {
        "queued"
    } else {
        "recorded"
    };
    Ok(Json(serde_json::json!({ "status": status })).into_response())
}
