//! `/agentupdate/version`, `/agentupdate/download` (ranges, conditional requests, the
//! download limit) and `/agentupdate/download.minisig`.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::Stream;

use super::{AppState, ready, unavailable};
use crate::error::ApiError;
use crate::limiter::Slot;
use crate::metrics::{Metrics, inc};
use crate::store::ServedBundle;

/// Size of the pieces a bundle body is sent in (slices of the mapped file, not copies).
const BODY_CHUNK: usize = 512 * 1024;

pub(super) async fn version(State(state): State<AppState>) -> Response {
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

pub(super) async fn signature(State(state): State<AppState>) -> Response {
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

pub(super) async fn download(
    State(state): State<AppState>,
    method: Method,
    headers: HeaderMap,
) -> Response {
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
