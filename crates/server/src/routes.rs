//! The HTTP interface of DESIGN.md, as an axum `Router` that tests drive without a socket.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};

use agent_protocol::wire::{self, AgentHello, NotSupported, Report};
use agent_protocol::{AcceptPolicy, AgentVersion};
use axum::body::Body;
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use futures_util::Stream;
use serde::Deserialize;
use subtle::ConstantTimeEq;

use crate::db::Db;
use crate::error::ApiError;
use crate::limiter::{DownloadLimiter, Slot};
use crate::metrics::{Metrics, inc};
use crate::store::{BundleStore, Current, ServedBundle};

/// Largest JSON body accepted; larger ones get `413`.
pub const MAX_BODY: usize = 64 * 1024;
/// Size of the pieces a bundle body is sent in (slices of the mapped file, not copies).
const BODY_CHUNK: usize = 512 * 1024;

pub const SETTING_AUTO_UPDATE: &str = "auto-update";
pub const SETTING_DOWNLOAD_LIMIT: &str = "downloads.limit";

/// Everything the handlers share.
#[derive(Clone)]
pub struct AppState {
    pub inner: Arc<Shared>,
}

pub struct Shared {
    pub store: Arc<BundleStore>,
    pub db: Db,
    pub limiter: Arc<DownloadLimiter>,
    pub metrics: Arc<Metrics>,
    pub policy: AcceptPolicy,
    pub admin_token: String,
    pub auto_update: AtomicBool,
    pub download_limit: AtomicUsize,
    pub max_connections: usize,
    pub retry_after: u64,
}

pub fn app(state: AppState) -> Router {
    Router::new()
        .route(wire::VERSION_PATH, get(version))
        .route(wire::DOWNLOAD_PATH, get(download).head(download))
        .route(wire::SIGNATURE_PATH, get(signature))
        .route(wire::REGISTER_PATH, post(register))
        .route(wire::CONNECT_PATH, post(register))
        .route(wire::REPORT_PATH, post(report))
        .route(
            "/admin/settings",
            get(admin_settings)
                .put(admin_update_settings)
                .patch(admin_update_settings),
        )
        .route("/admin/agents", get(admin_agents))
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(state)
}

fn unavailable(problem: &str, retry_after: u64) -> Response {
    let mut r = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, problem).into_response();
    // The generic 5xx text would hide what the operator must fix; this one is safe to show.
    *r.body_mut() = Body::from(serde_json::json!({ "error": problem }).to_string());
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(retry_after));
    r
}

/// The bundle to serve, or the `503` that says why there is none.
fn ready(state: &Shared) -> Result<Arc<ServedBundle>, Box<Response>> {
    match state.store.current() {
        Current::Ready(b) => Ok(b),
        Current::Unavailable(problem) => Err(Box::new(unavailable(&problem, state.retry_after))),
    }
}

async fn version(State(state): State<AppState>) -> Response {
    let bundle = match ready(&state.inner) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    (
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        bundle.info.to_properties().to_text(),
    )
        .into_response()
}

async fn signature(State(state): State<AppState>) -> Response {
    let bundle = match ready(&state.inner) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    match &bundle.signature {
        Some(sig) => (
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            sig.clone(),
        )
            .into_response(),
        None => ApiError::new(
            StatusCode::NOT_FOUND,
            "the served bundle has no .minisig beside it",
        )
        .into_response(),
    }
}

/// A single `bytes=` range, resolved against `size`.
#[derive(Debug, PartialEq, Eq)]
enum RangeAsk {
    Whole,
    Part(u64, u64),
    Unsatisfiable,
}

fn parse_range(value: &str, size: u64) -> RangeAsk {
    let Some(spec) = value.trim().strip_prefix("bytes=") else {
        return RangeAsk::Whole;
    };
    if spec.contains(',') {
        return RangeAsk::Whole; // several ranges: the whole file is a valid answer
    }
    let Some((start, end)) = spec.trim().split_once('-') else {
        return RangeAsk::Whole;
    };
    let (start, end) = (start.trim(), end.trim());
    let parsed = if start.is_empty() {
        match end.parse::<u64>() {
            Ok(0) | Err(_) => return RangeAsk::Unsatisfiable,
            Ok(suffix) => (size.saturating_sub(suffix), size.saturating_sub(1)),
        }
    } else {
        let Ok(first) = start.parse::<u64>() else {
            return RangeAsk::Whole;
        };
        let last = if end.is_empty() {
            size.saturating_sub(1)
        } else {
            match end.parse::<u64>() {
                Ok(last) if last >= first => last.min(size.saturating_sub(1)),
                _ => return RangeAsk::Whole,
            }
        };
        (first, last)
    };
    if size == 0 || parsed.0 >= size {
        RangeAsk::Unsatisfiable
    } else {
        RangeAsk::Part(parsed.0, parsed.1)
    }
}

async fn download(State(state): State<AppState>, method: Method, headers: HeaderMap) -> Response {
    let s = &state.inner;
    let limit = s.download_limit.load(Ordering::Relaxed);
    if limit == 0 || !s.auto_update.load(Ordering::Relaxed) {
        inc(&s.metrics.downloads_403);
        let why = if limit == 0 {
            "agent downloads are disabled on this server (downloads.limit = 0)"
        } else {
            "agent auto-update is disabled for the whole fleet"
        };
        return ApiError::new(StatusCode::FORBIDDEN, why).into_response();
    }
    let bundle = match ready(s) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let size = bundle.data.len() as u64;
    let last_modified = httpdate::fmt_http_date(bundle.last_modified);
    let mut base = HeaderMap::new();
    let disposition = format!("attachment; filename=\"{}\"", bundle.info.filename);
    if let Ok(v) = HeaderValue::from_str(&disposition) {
        base.insert(header::CONTENT_DISPOSITION, v);
    }
    if let Ok(v) = HeaderValue::from_str(&bundle.etag) {
        base.insert(header::ETAG, v);
    }
    if let Ok(v) = HeaderValue::from_str(&last_modified) {
        base.insert(header::LAST_MODIFIED, v);
    }
    base.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    base.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );

    let header_str = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(inm) = header_str(header::IF_NONE_MATCH)
        && inm
            .split(',')
            .any(|t| t.trim() == bundle.etag || t.trim() == "*")
    {
        inc(&s.metrics.downloads_304);
        return (StatusCode::NOT_MODIFIED, base).into_response();
    }
    // If-Range: the range applies only if the client's copy is this bundle.
    let range_applies = match header_str(header::IF_RANGE) {
        None => true,
        Some(v) => v.trim() == bundle.etag || v.trim() == last_modified,
    };
    let ask = match header_str(header::RANGE) {
        Some(r) if range_applies => parse_range(r, size),
        _ => RangeAsk::Whole,
    };
    let (status, start, end) = match ask {
        RangeAsk::Whole => (StatusCode::OK, 0, size),
        RangeAsk::Part(first, last) => (StatusCode::PARTIAL_CONTENT, first, last + 1),
        RangeAsk::Unsatisfiable => {
            inc(&s.metrics.downloads_416);
            let mut r = (StatusCode::RANGE_NOT_SATISFIABLE, base).into_response();
            if let Ok(v) = HeaderValue::from_str(&format!("bytes */{size}")) {
                r.headers_mut().insert(header::CONTENT_RANGE, v);
            }
            return r;
        }
    };
    if status == StatusCode::PARTIAL_CONTENT
        && let Ok(v) = HeaderValue::from_str(&format!("bytes {start}-{}/{size}", end - 1))
    {
        base.insert(header::CONTENT_RANGE, v);
    }
    base.insert(header::CONTENT_LENGTH, HeaderValue::from(end - start));
    if method == Method::HEAD {
        return (status, base).into_response();
    }
    let Some(slot) = s.limiter.try_acquire(limit) else {
        inc(&s.metrics.downloads_503);
        let mut r = unavailable(
            &format!("{limit} downloads are in flight, the most this server allows; retry later"),
            s.retry_after,
        );
        r.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return r;
    };
    inc(if status == StatusCode::OK {
        &s.metrics.downloads_200
    } else {
        &s.metrics.downloads_206
    });
    let body = SlotBody {
        data: bundle.data.slice(start as usize..end as usize),
        sent: 0,
        _slot: slot,
        _bundle: Arc::clone(&bundle),
        metrics: Arc::clone(&s.metrics),
    };
    let mut response = Response::new(Body::from_stream(body));
    *response.status_mut() = status;
    *response.headers_mut() = base;
    response
}

/// The body of a download: zero-copy slices of the mapped bundle. Holds the download slot
/// until it is dropped, which hyper does when the last byte is written or the client
/// goes away.
struct SlotBody {
    data: Bytes,
    sent: usize,
    _slot: Slot,
    _bundle: Arc<ServedBundle>,
    metrics: Arc<Metrics>,
}

impl Stream for SlotBody {
    type Item = Result<Bytes, std::convert::Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.sent >= self.data.len() {
            return Poll::Ready(None);
        }
        let end = (self.sent + BODY_CHUNK).min(self.data.len());
        let chunk = self.data.slice(self.sent..end);
        self.metrics
            .bytes_sent
            .fetch_add(chunk.len() as u64, Ordering::Relaxed);
        self.sent = end;
        Poll::Ready(Some(Ok(chunk)))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self
            .data
            .len()
            .saturating_sub(self.sent)
            .div_ceil(BODY_CHUNK);
        (left, Some(left))
    }
}

fn json_body<T>(body: Result<Json<T>, JsonRejection>) -> Result<T, ApiError> {
    match body {
        Ok(Json(v)) => Ok(v),
        Err(JsonRejection::BytesRejection(e)) => Err(ApiError::new(
            e.status(),
            format!("body refused: {}", e.body_text()),
        )),
        Err(e) => Err(ApiError::bad_request(format!(
            "malformed JSON body: {}",
            e.body_text()
        ))),
    }
}

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

fn check_hello(hello: &AgentHello) -> Result<(), ApiError> {
    if hello.id.trim().is_empty() || hello.id.len() > 128 {
        return Err(ApiError::bad_request("id must be 1 to 128 characters"));
    }
    if hello.name.len() > 256 || hello.platform.len() > 128 {
        return Err(ApiError::bad_request("name or platform is too long"));
    }
    Ok(())
}

/// `POST /agent/register` and `/agent/connect`: the version directive.
async fn register(
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
    let expected = bundle.version();
    s.db.touch_agent(
        &hello.id,
        &hello.name,
        &hello.platform,
        &agent_version.to_string(),
    )
    .await?;
    if s.policy.accepts(expected, &agent_version) {
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

async fn report(
    State(state): State<AppState>,
    body: Result<Json<Report>, JsonRejection>,
) -> Result<Response, ApiError> {
    let report = json_body(body)?;
    if report.id.trim().is_empty() || report.id.len() > 128 {
        return Err(ApiError::bad_request("id must be 1 to 128 characters"));
    }
    if report.error.as_ref().is_some_and(|e| e.len() > 4096) {
        return Err(ApiError::bad_request(
            "error text is longer than 4096 bytes",
        ));
    }
    inc(&state.inner.metrics.reports);
    tracing::info!(agent = %report.id, from = %report.from, to = %report.to, status = report.status.as_str(), error = ?report.error, "update report");
    state.inner.db.record_report(&report).await?;
    Ok(Json(serde_json::json!({ "status": "recorded" })).into_response())
}

fn authorize(state: &Shared, headers: &HeaderMap) -> Result<(), ApiError> {
    if state.admin_token.is_empty() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "the admin API is off: set admin.token (or UPDATE_SERVER_ADMIN_TOKEN) to turn it on",
        ));
    }
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if given.as_bytes().ct_eq(state.admin_token.as_bytes()).into() {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "missing or wrong bearer token",
        ))
    }
}

fn settings_json(s: &Shared) -> serde_json::Value {
    serde_json::json!({
        "auto_update": s.auto_update.load(Ordering::Relaxed),
        "downloads_limit": s.download_limit.load(Ordering::Relaxed),
        "max_connections": s.max_connections,
        "downloads_in_flight": s.limiter.in_flight(),
    })
}

async fn admin_settings(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    authorize(&state.inner, &headers)?;
    Ok(Json(settings_json(&state.inner)).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SettingsChange {
    auto_update: Option<bool>,
    downloads_limit: Option<usize>,
}

async fn admin_update_settings(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Json<SettingsChange>, JsonRejection>,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    authorize(s, &headers)?;
    let change = json_body(body)?;
    if let Some(limit) = change.downloads_limit {
        if limit > s.max_connections {
            return Err(ApiError::bad_request(format!(
                "downloads_limit may not exceed server.max-connections ({})",
                s.max_connections
            )));
        }
        s.db.set_setting(SETTING_DOWNLOAD_LIMIT, &limit.to_string())
            .await?;
        s.download_limit.store(limit, Ordering::Relaxed);
        tracing::info!(limit, "download limit changed");
    }
    if let Some(enabled) = change.auto_update {
        s.db.set_setting(SETTING_AUTO_UPDATE, if enabled { "true" } else { "false" })
            .await?;
        s.auto_update.store(enabled, Ordering::Relaxed);
        tracing::info!(enabled, "fleet-wide auto-update changed");
    }
    Ok(Json(settings_json(s)).into_response())
}

#[derive(Debug, Deserialize)]
struct AgentFilter {
    version: Option<String>,
    status: Option<String>,
}

async fn admin_agents(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(filter): Query<AgentFilter>,
) -> Result<Response, ApiError> {
    authorize(&state.inner, &headers)?;
    let agents = state
        .inner
        .db
        .agents(filter.version.as_deref(), filter.status.as_deref())
        .await?;
    Ok(Json(agents).into_response())
}

async fn metrics(State(state): State<AppState>) -> Result<Response, ApiError> {
    let s = &state.inner;
    let (by_version, by_status) = s.db.fleet_counts().await?;
    let text = s.metrics.render(
        s.limiter.in_flight(),
        s.limiter.peak(),
        &by_version,
        &by_status,
    );
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(parse_range("bytes=0-9", 100), RangeAsk::Part(0, 9));
        assert_eq!(parse_range("bytes=90-", 100), RangeAsk::Part(90, 99));
        assert_eq!(parse_range("bytes=-10", 100), RangeAsk::Part(90, 99));
        assert_eq!(parse_range("bytes=50-500", 100), RangeAsk::Part(50, 99));
        assert_eq!(parse_range("bytes=100-", 100), RangeAsk::Unsatisfiable);
        assert_eq!(parse_range("bytes=0-1,5-6", 100), RangeAsk::Whole);
        assert_eq!(parse_range("items=0-1", 100), RangeAsk::Whole);
        assert_eq!(parse_range("bytes=9-1", 100), RangeAsk::Whole);
    }
}
