//! `/admin/webhooks` (an admin's): register, list, remove and test webhooks and read
//! their deliveries; and `GET /admin/audit/export`, the audit log streamed as JSON
//! lines or CSV. Every change is recorded in the audit log (never a secret).

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use agent_fleet::audit::{Format, Range, parse_time};
use agent_fleet::db::now_ms;
use agent_fleet::operators::Action;

use super::operators::Auth;
use super::{AppState, json_body};
use crate::error::ApiError;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NewWebhook {
    url: String,
    events: Vec<String>,
    secret: String,
}

/// `GET /admin/webhooks`: every webhook with its outbox's counts (never a secret).
pub(super) async fn list(State(state): State<AppState>, auth: Auth) -> Result<Response, ApiError> {
    let s = &state.inner;
    auth.require(s, Action::ManageTokens, "webhook.list")
        .await?;
    Ok(Json(s.governance.webhooks.list().await?).into_response())
}

/// `POST /admin/webhooks` `{"url", "events": [...], "secret"}`.
pub(super) async fn add(
    State(state): State<AppState>,
    auth: Auth,
    body: Result<Json<NewWebhook>, JsonRejection>,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    let caller = auth.require(s, Action::ManageTokens, "webhook.add").await?;
    let new = json_body(body)?;
    let hook = match s
        .governance
        .webhooks
        .add(&new.url, &new.events, &new.secret, &caller.name, now_ms())
        .await
    {
        Ok(hook) => hook,
        Err(e @ agent_fleet::FleetError::Invalid(_)) => {
            caller
                .refused(
                    s,
                    "webhook.add",
                    serde_json::json!({ "url": new.url, "reason": e.to_string() }),
                )
                .await;
            return Err(e.into());
        }
        Err(e) => return Err(e.into()),
    };
    tracing::info!(id = hook.id, url = %hook.url, by = %caller.name, "webhook added");
    caller
        .record(
            s,
            "webhook.add",
            serde_json::json!({ "id": hook.id, "url": hook.url, "events": hook.events }),
        )
        .await;
    Ok((StatusCode::CREATED, Json(hook)).into_response())
}

fn no_such(id: i64) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no webhook has the id {id}; `update-server webhook list` shows them"),
    )
}

/// `DELETE /admin/webhooks/{id}`: it, its waiting events and its attempts.
pub(super) async fn remove(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<i64>,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    let caller = auth
        .require(s, Action::ManageTokens, "webhook.remove")
        .await?;
    if !s.governance.webhooks.remove(id).await? {
        return Err(no_such(id));
    }
    tracing::info!(id, by = %caller.name, "webhook removed");
    caller
        .record(s, "webhook.remove", serde_json::json!({ "id": id }))
        .await;
    Ok(Json(serde_json::json!({ "id": id, "removed": true })).into_response())
}

/// `POST /admin/webhooks/{id}/test`: a `webhook.test` event queued for it alone.
pub(super) async fn test(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<i64>,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    let caller = auth
        .require(s, Action::ManageTokens, "webhook.test")
        .await?;
    let Some(event_id) = s
        .governance
        .webhooks
        .test(id, &caller.name, now_ms())
        .await?
    else {
        return Err(no_such(id));
    };
    s.governance.wake.notify_one();
    caller
        .record(
            s,
            "webhook.test",
            serde_json::json!({ "id": id, "event_id": event_id }),
        )
        .await;
    Ok((
        StatusCode::ACCEPTED,
        Json(serde_json::json!({ "id": id, "event_id": event_id })),
    )
        .into_response())
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct DeliveriesQuery {
    limit: Option<i64>,
}

/// `GET /admin/webhooks/{id}/deliveries?limit=`: its latest attempts, newest first.
pub(super) async fn deliveries(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<i64>,
    Query(q): Query<DeliveriesQuery>,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    auth.require(s, Action::ManageTokens, "webhook.deliveries")
        .await?;
    let Some(hook) = s.governance.webhooks.get(id).await? else {
        return Err(no_such(id));
    };
    let attempts = s
        .governance
        .webhooks
        .deliveries(id, q.limit.unwrap_or(50))
        .await?;
    Ok(Json(serde_json::json!({ "webhook": hook, "attempts": attempts })).into_response())
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct ExportQuery {
    since: Option<String>,
    until: Option<String>,
    format: Option<String>,
}

/// Entries read from the database per chunk of an export.
const EXPORT_PAGE: i64 = 500;

/// `GET /admin/audit/export?since=&until=&format=jsonl|csv`: the entries of the range,
/// oldest first, streamed a page at a time (never the whole log in memory). The export
/// is itself recorded.
pub(super) async fn export(
    State(state): State<AppState>,
    auth: Auth,
    Query(q): Query<ExportQuery>,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    let caller = auth.require(s, Action::Read, "audit.export").await?;
    let now = now_ms();
    let time = |t: &Option<String>| t.as_deref().map(|t| parse_time(t, now)).transpose();
    let range = Range {
        since: time(&q.since)?,
        until: time(&q.until)?,
    };
    let format: Format = q.format.as_deref().unwrap_or("jsonl").parse()?;
    caller
        .record(
            s,
            "audit.export",
            serde_json::json!({
                "since": range.since,
                "until": range.until,
                "format": q.format.as_deref().unwrap_or("jsonl"),
            }),
        )
        .await;
    let audit = s.fleet.audit();
    let header = Some(format.header());
    let pages = futures_util::stream::unfold(
        (audit, 0i64, header, false),
        move |(audit, after, header, done)| async move {
            if let Some(h) = header.filter(|h| !h.is_empty()) {
                return Some((
                    Ok(bytes::Bytes::from_static(h.as_bytes())),
                    (audit, after, None, done),
                ));
            }
            if done {
                return None;
            }
            match audit.export_page(range, after, EXPORT_PAGE).await {
                Ok(entries) if entries.is_empty() => None,
                Ok(entries) => {
                    let last = entries.last().map_or(after, |e| e.id);
                    let end = i64::try_from(entries.len()).unwrap_or(0) < EXPORT_PAGE;
                    let text: String = entries.iter().map(|e| format.line(e)).collect();
                    Some((Ok(bytes::Bytes::from(text)), (audit, last, None, end)))
                }
                Err(e) => {
                    // The answer breaks off: an export is whole or visibly cut.
                    tracing::error!("audit export stopped after entry {after}: {e}");
                    Some((
                        Err(std::io::Error::other(e.to_string())),
                        (audit, after, None, true),
                    ))
                }
            }
        },
    );
    Ok((
        [(header::CONTENT_TYPE, format.content_type())],
        Body::from_stream(pages),
    )
        .into_response())
}
