//! `GET|HEAD /agentupdate/delta?from=<sha256>&platform=<target>`: the delta from the
//! bundle an agent runs to the bundle `/agentupdate/download` serves for that platform,
//! sent as a download is (the same limit, `Range`, `ETag`, stall timeout), or `404` when
//! there is none worth sending, so the agent downloads the bundle. Deltas are made by the
//! worker of [`crate::deltas`]; this route only reads what it made.

use std::sync::Arc;

use agent_protocol::wire;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::download::{Ask, Servable, asked_release, choose, download_limit, serve};
use super::{AppState, ready};
use crate::deltas::{self, Lookup};
use crate::error::ApiError;
use crate::metrics::Sent;
use crate::state::Shared;

/// `?from=<sha256>&platform=<target triple>`.
#[derive(Debug, Default, Deserialize)]
pub(super) struct DeltaAsk {
    from: Option<String>,
    platform: Option<String>,
    release: Option<String>,
}

pub(super) async fn delta(
    State(state): State<AppState>,
    Query(ask): Query<DeltaAsk>,
    method: Method,
    headers: HeaderMap,
) -> Response {
    let s = &state.inner;
    let mut response = answer(s, ask, &method, &headers);
    // The answers `serve` gives (200, 206, 304, 412, 416, 503 over the limit) and the
    // 403 of downloads off are counted where they are made.
    if response.extensions_mut().remove::<Counted>().is_none() {
        s.metrics.answered(Sent::Delta, response.status().as_u16());
    }
    response
}

/// Marks an answer already counted.
#[derive(Debug, Clone, Copy)]
struct Counted;

fn counted(mut r: Response) -> Response {
    r.extensions_mut().insert(Counted);
    r
}

fn not_found(message: String) -> Response {
    ApiError::new(StatusCode::NOT_FOUND, message).into_response()
}

fn answer(s: &Shared, ask: DeltaAsk, method: &Method, headers: &HeaderMap) -> Response {
    let from = ask.from.as_deref().unwrap_or_default().to_ascii_lowercase();
    if !deltas::is_sha256(&from) {
        return ApiError::bad_request(format!(
            "{} must be the sha256 (64 hex digits) of the bundle the agent runs",
            wire::DELTA_FROM_QUERY
        ))
        .into_response();
    }
    let limit = match download_limit(s, Sent::Delta) {
        Ok(limit) => limit,
        Err(r) => return counted(*r),
    };
    let current = match ready(s) {
        Ok(r) => r,
        Err(r) => return *r,
    };
    let platform = Ask {
        platform: ask.platform,
        release: ask.release,
        deployment: None,
    };
    let release = match asked_release(s, &platform) {
        Ok(r) => r,
        Err(r) => return *r,
    };
    if !Arc::ptr_eq(&release, &current) {
        // Deltas are made toward the current release only (off the request path); a
        // deployment's other release is downloaded whole.
        return not_found(format!(
            "this server makes deltas toward its current release ({}) only; download {} from {}",
            current.version(),
            release.version(),
            wire::for_release(
                wire::DOWNLOAD_PATH,
                platform.platform.as_deref().unwrap_or_default(),
                &release.version().to_string()
            )
        ));
    }
    let bundle = match choose(s, &release, &platform, wire::DELTA_PATH, false) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let to = &bundle.info.sha256;
    let file = match s.deltas.lookup(&from, to, &bundle.platform) {
        Lookup::Ready(file) => file,
        Lookup::AlreadyServed => {
            return not_found(format!(
                "{from} is already the served bundle ({}); there is nothing to update",
                bundle.info.agent
            ));
        }
        Lookup::NoBase => {
            return not_found(format!(
                "this server has no delta from bundle {from} (it keeps none of that bundle for {}); download the bundle from {}",
                bundle.platform,
                wire::DOWNLOAD_PATH
            ));
        }
        Lookup::NotWorth(line) => {
            return not_found(format!(
                "{line}; download the bundle from {}",
                wire::DOWNLOAD_PATH
            ));
        }
        Lookup::Failed => {
            return not_found(format!(
                "this server could not make the delta from {from} (its log says why); download the bundle from {}",
                wire::DOWNLOAD_PATH
            ));
        }
        Lookup::Making => {
            let mut r = ApiError::unavailable(
                format!(
                    "the delta from {from} to {} is being made; retry in {} s",
                    bundle.info.agent,
                    deltas::MAKING_RETRY_AFTER
                ),
                deltas::MAKING_RETRY_AFTER,
            )
            .into_response();
            r.headers_mut()
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            return r;
        }
    };
    let filename = format!("{}.from-{}.delta", bundle.info.filename, &from[..12]);
    let servable = Servable {
        data: file.data.clone(),
        etag: &file.etag,
        last_modified: file.last_modified,
        filename: &filename,
        sent: Sent::Delta,
    };
    counted(serve(s, limit, servable, method, headers))
}
