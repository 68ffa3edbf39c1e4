//! `/agentupdate/version`, `/agentupdate/download` (ranges, conditional requests, the
//! download limit) and `/agentupdate/download.minisig`, each for the bundle of the
//! platform asked with `?platform=<target>` (or the static musl one of its architecture).
//! Without `platform`, a release of one bundle answers for it, as a server always did; a
//! release of several answers `/version` for its primary bundle, and the download and
//! signature with `300 Multiple Choices`: which platforms exist and how to ask, never a
//! bundle a machine might not run.
//!
//! `/agentupdate/agent.msi` and `/agentupdate/agent.msi.minisig` serve the release's
//! Windows MSI (`?release=` as for bundles), guarded as the bundle download is: what
//! `msiexec /i https://SERVER/agentupdate/agent.msi /qn SERVER_URL=… ENROLL_TOKEN=…` fetches.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use agent_protocol::{layout, platform, wire};
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::Stream;

use super::{AppState, ready, unavailable};
use crate::error::ApiError;
use crate::metrics::{Metrics, Sent, inc};
use crate::state::Shared;
use crate::store::{Release, ServedBundle, ServedMsi};
use crate::transport::limiter::Slot;
use serde::Deserialize;

/// Size of the pieces a bundle body is sent in (slices of the mapped file, not copies).
const BODY_CHUNK: usize = 512 * 1024;

/// `?platform=<target triple>&release=<version>+<build>`, or `&deployment=<name>` for
/// the release that deployment runs.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Ask {
    pub(super) platform: Option<String>,
    /// A release other than the current one: a deployment's.
    pub(super) release: Option<String>,
    /// A deployment, for its release (a Windows machine's `msiexec /i
    /// …/agent.msi?deployment=prod` installs what prod runs).
    pub(super) deployment: Option<String>,
}

/// The release a deployment runs: its pinned one, or `None` when it follows the
/// current release; `404` naming the deployments when there is no such deployment.
fn deployment_release(s: &Shared, name: &str) -> Result<Option<String>, Box<Response>> {
    let table = s.fleet.deployments.table().get();
    match table.iter().find(|d| d.name == name) {
        Some(d) => Ok(d.release.clone()),
        None if name == agent_fleet::deployments::DEFAULT => Ok(None),
        None => {
            let mut names: Vec<&str> = table.iter().map(|d| d.name.as_str()).collect();
            names.push(agent_fleet::deployments::DEFAULT);
            names.sort_unstable();
            names.dedup();
            Err(Box::new(
                ApiError::new(
                    StatusCode::NOT_FOUND,
                    format!(
                        "no deployment {name:?} in this fleet; there are {} (`update-server deployment list` shows them)",
                        names.join(", ")
                    ),
                )
                .into_response(),
            ))
        }
    }
}

/// The release `ask` names: the current one when it names none (or the current one),
/// else the kept release a deployment names (by `release`, or the deployment by name),
/// else `404` saying what is served.
pub(super) fn asked_release(s: &Shared, ask: &Ask) -> Result<Arc<Release>, Box<Response>> {
    let current = ready(s)?;
    // A `+` written plainly in a query is a space once decoded.
    let named = ask
        .release
        .as_deref()
        .map(|r| r.trim().replace(' ', "+"))
        .filter(|r| !r.is_empty());
    let named = match (named, ask.deployment.as_deref().map(str::trim)) {
        (Some(id), _) => Some(id),
        (None, Some(name)) if !name.is_empty() => deployment_release(s, name)?,
        (None, _) => None,
    };
    let Some(id) = named else {
        return Ok(current);
    };
    if current.version().to_string() == id {
        return Ok(current);
    }
    s.catalog.get(&id).ok_or_else(|| {
        let mut served = vec![current.version().to_string()];
        served.extend(
            s.fleet
                .deployments
                .table()
                .get()
                .iter()
                .filter_map(|d| d.release.clone()),
        );
        served.sort();
        served.dedup();
        Box::new(
            ApiError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "release {id} is not served here: this server serves {} (the current release and those deployments name)",
                    served.join(", ")
                ),
            )
            .into_response(),
        )
    })
}

/// Which bundle of a release answers a request.
#[derive(Debug)]
enum Pick<'a> {
    Bundle(&'a Arc<ServedBundle>),
    /// Several platforms and none asked: the client must choose.
    Choose,
    /// The platform asked for is no plain target triple.
    BadPlatform,
    /// The release has no bundle the platform runs.
    NoBundle,
}

/// The bundle for `asked`: its own, else the static musl one of its architecture; with
/// nothing asked, the one bundle of a one-bundle release, or `primary_ok` the primary
/// one (what `/version` describes), else [`Pick::Choose`].
fn pick<'a>(release: &'a Release, asked: Option<&str>, primary_ok: bool) -> Pick<'a> {
    match asked {
        None | Some("") if release.is_single() || primary_ok => Pick::Bundle(release.primary()),
        None | Some("") => Pick::Choose,
        Some(p) if !platform::is_target(p) => Pick::BadPlatform,
        Some(p) => release.for_platform(p).map_or(Pick::NoBundle, Pick::Bundle),
    }
}

/// The bundle to serve for `ask`, or the answer that says why there is none.
pub(super) fn choose<'a>(
    s: &Shared,
    release: &'a Release,
    ask: &Ask,
    path: &str,
    primary_ok: bool,
) -> Result<&'a Arc<ServedBundle>, Box<Response>> {
    // Only a refusal names the platforms: the common answer (every `/version` an agent
    // polls) allocates nothing here.
    let platforms = || release.platforms().join(", ");
    let asked = ask.platform.as_deref();
    match pick(release, asked, primary_ok) {
        Pick::Bundle(b) => Ok(b),
        Pick::Choose => Err(Box::new(multiple_choices(&s.public_url, release, path))),
        Pick::BadPlatform => Err(Box::new(
            ApiError::bad_request(format!(
            "platform must be a Rust target triple such as {}; this release has {}",
            layout::PLATFORM,
            platforms()
        ))
            .into_response(),
        )),
        Pick::NoBundle => Err(Box::new(
            ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "this release ({}) has no bundle for {} nor a static musl one of its architecture; it has {}",
                release.version(),
                asked.unwrap_or_default(),
                platforms()
            ),
        )
            .into_response(),
        )),
    }
}

/// `300 Multiple Choices`: the platforms of the release and the URL of each.
fn multiple_choices(public_url: &str, release: &Release, path: &str) -> Response {
    let base = public_url.trim_end_matches('/');
    let mut text = format!(
        "this release ({}) has bundles for several platforms: {}\nask for the one your machine runs with ?{}=<target triple>:\n",
        release.version(),
        release.platforms().join(", "),
        wire::PLATFORM_QUERY
    );
    for p in release.platforms() {
        text.push_str(&format!("  {base}{}\n", wire::for_platform(path, p)));
    }
    text.push_str(&format!(
        "for example: wget --content-disposition '{base}{}'\n",
        wire::for_platform(path, release.primary().platform.as_str())
    ));
    (
        StatusCode::MULTIPLE_CHOICES,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        text,
    )
        .into_response()
}

pub(super) async fn version(State(state): State<AppState>, Query(ask): Query<Ask>) -> Response {
    let release = match asked_release(&state.inner, &ask) {
        Ok(r) => r,
        Err(r) => return *r,
    };
    let bundle = match choose(&state.inner, &release, &ask, wire::VERSION_PATH, true) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let text = release.version_text(bundle, state.inner.download_source.as_deref());
    (
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        text,
    )
        .into_response()
}

pub(super) async fn signature(State(state): State<AppState>, Query(ask): Query<Ask>) -> Response {
    let release = match asked_release(&state.inner, &ask) {
        Ok(r) => r,
        Err(r) => return *r,
    };
    let bundle = match choose(&state.inner, &release, &ask, wire::SIGNATURE_PATH, false) {
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

/// The conditional headers of a request (RFC 9110 §13).
#[derive(Debug, Default, Clone, Copy)]
struct Preconditions<'a> {
    if_match: Option<&'a str>,
    if_none_match: Option<&'a str>,
    if_unmodified_since: Option<&'a str>,
    if_modified_since: Option<&'a str>,
}

#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Proceed,
    /// `304`
    NotModified,
    /// `412`
    Failed,
}

/// `W/"x"` → (weak, `"x"`).
fn entity_tag(tag: &str) -> (bool, &str) {
    let tag = tag.trim();
    match tag.strip_prefix("W/") {
        Some(rest) => (true, rest),
        None => (false, tag),
    }
}

/// True if `list` (a comma-separated list of tags, or `*`) matches `etag`.
fn tag_matches(list: &str, etag: &str, strong: bool) -> bool {
    list.split(',').any(|candidate| {
        if candidate.trim() == "*" {
            return true;
        }
        let (weak, opaque) = entity_tag(candidate);
        let (ours_weak, ours) = entity_tag(etag);
        opaque == ours && !(strong && (weak || ours_weak))
    })
}

impl Preconditions<'_> {
    /// The order of RFC 9110 §13.2.2: If-Match (strong), else If-Unmodified-Since; then
    /// If-None-Match (weak), else If-Modified-Since. Dates that do not parse are ignored.
    fn evaluate(&self, etag: &str, last_modified: std::time::SystemTime) -> Outcome {
        // HTTP dates have whole seconds.
        let modified = httpdate::HttpDate::from(last_modified);
        let date = |v: &str| v.trim().parse::<httpdate::HttpDate>().ok();
        if let Some(list) = self.if_match {
            if !tag_matches(list, etag, true) {
                return Outcome::Failed;
            }
        } else if let Some(since) = self.if_unmodified_since.and_then(date)
            && modified > since
        {
            return Outcome::Failed;
        }
        if let Some(list) = self.if_none_match {
            if tag_matches(list, etag, false) {
                return Outcome::NotModified;
            }
        } else if let Some(since) = self.if_modified_since.and_then(date)
            && modified <= since
        {
            return Outcome::NotModified;
        }
        Outcome::Proceed
    }
}

/// `1*DIGIT` only: `u64::from_str` would take `+1`.
fn digits(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
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
        match digits(end) {
            Some(0) => return RangeAsk::Unsatisfiable,
            None => return RangeAsk::Whole,
            Some(suffix) => (size.saturating_sub(suffix), size.saturating_sub(1)),
        }
    } else {
        let Some(first) = digits(start) else {
            return RangeAsk::Whole;
        };
        let last = if end.is_empty() {
            size.saturating_sub(1)
        } else {
            match digits(end) {
                Some(last) if last >= first => last.min(size.saturating_sub(1)),
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

/// `403` when downloads are off (`downloads.limit = 0`, or auto-update disabled for the
/// whole fleet), else the limit: bundles and deltas alike.
pub(super) fn download_limit(s: &Shared, sent: Sent) -> Result<usize, Box<Response>> {
    let limit = s.download_limit.load(Ordering::Relaxed);
    if limit == 0 || !s.fleet.auto_update() {
        s.metrics.answered(sent, 403);
        let why = if limit == 0 {
            "agent downloads are disabled on this server (downloads.limit = 0)"
        } else {
            "agent auto-update is disabled for the whole fleet"
        };
        return Err(Box::new(
            ApiError::new(StatusCode::FORBIDDEN, why).into_response(),
        ));
    }
    Ok(limit)
}

pub(super) async fn download(
    State(state): State<AppState>,
    Query(ask): Query<Ask>,
    method: Method,
    headers: HeaderMap,
) -> Response {
    let s = &state.inner;
    let limit = match download_limit(s, Sent::Bundle) {
        Ok(limit) => limit,
        Err(r) => return *r,
    };
    let release = match asked_release(s, &ask) {
        Ok(r) => r,
        Err(r) => return *r,
    };
    let bundle = match choose(s, &release, &ask, wire::DOWNLOAD_PATH, false) {
        Ok(b) => Arc::clone(b),
        Err(r) => return *r,
    };
    let file = Servable {
        data: bundle.data.clone(),
        etag: &bundle.etag,
        last_modified: bundle.last_modified,
        filename: &bundle.info.filename,
        sent: Sent::Bundle,
    };
    serve(s, limit, file, &method, &headers)
}

/// The MSI of the release `ask` names, or the `404` that says it carries none.
fn asked_msi(s: &Shared, ask: &Ask) -> Result<Arc<ServedMsi>, Box<Response>> {
    let release = asked_release(s, ask)?;
    release.msi().cloned().ok_or_else(|| {
        Box::new(
            ApiError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "release {} carries no Windows MSI: publish it with its agent-{}-x86_64-pc-windows-gnu.msi and .msi.minisig (scripts/build-dist.sh --target x86_64-pc-windows-gnu writes them), or install with the bundle (/install.sh)",
                    release.version(),
                    release.version().version_str()
                ),
            )
            .into_response(),
        )
    })
}

/// `GET /agentupdate/agent.msi`: the release's Windows MSI, as the bundle download is
/// sent (the download limit, ranges, conditional requests).
pub(super) async fn msi(
    State(state): State<AppState>,
    Query(ask): Query<Ask>,
    method: Method,
    headers: HeaderMap,
) -> Response {
    let s = &state.inner;
    let limit = match download_limit(s, Sent::Msi) {
        Ok(limit) => limit,
        Err(r) => return *r,
    };
    let msi = match asked_msi(s, &ask) {
        Ok(m) => m,
        Err(r) => return *r,
    };
    let file = Servable {
        data: msi.data.clone(),
        etag: &msi.etag,
        last_modified: msi.last_modified,
        filename: &msi.filename,
        sent: Sent::Msi,
    };
    let mut response = serve(s, limit, file, &method, &headers);
    if response.status().is_success() {
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-msi"),
        );
    }
    response
}

/// `GET /agentupdate/agent.msi.minisig`: the MSI's minisign signature.
pub(super) async fn msi_signature(
    State(state): State<AppState>,
    Query(ask): Query<Ask>,
) -> Response {
    match asked_msi(&state.inner, &ask) {
        Ok(msi) => (
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            msi.signature.clone(),
        )
            .into_response(),
        Err(r) => *r,
    }
}

/// A file a download route sends: a bundle, a delta or an MSI, write-once and mapped.
pub(super) struct Servable<'a> {
    pub(super) data: Bytes,
    /// Quoted strong entity tag: the file's sha256.
    pub(super) etag: &'a str,
    pub(super) last_modified: std::time::SystemTime,
    /// The name `Content-Disposition` gives it.
    pub(super) filename: &'a str,
    pub(super) sent: Sent,
}

/// Sends `file` as a download: conditional requests, one `Range` (206, `If-Range`, 416),
/// `HEAD`, and a slot of the download limit held from the first byte to the last (over
/// the limit: `503` with `Retry-After`), the stall timeout freeing it.
pub(super) fn serve(
    s: &Shared,
    limit: usize,
    file: Servable<'_>,
    method: &Method,
    headers: &HeaderMap,
) -> Response {
    let sent = file.sent;
    let size = file.data.len() as u64;
    let last_modified = httpdate::fmt_http_date(file.last_modified);
    let mut base = HeaderMap::new();
    let disposition = format!("attachment; filename=\"{}\"", file.filename);
    if let Ok(v) = HeaderValue::from_str(&disposition) {
        base.insert(header::CONTENT_DISPOSITION, v);
    }
    if let Ok(v) = HeaderValue::from_str(file.etag) {
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
    let preconditions = Preconditions {
        if_match: header_str(header::IF_MATCH),
        if_none_match: header_str(header::IF_NONE_MATCH),
        if_unmodified_since: header_str(header::IF_UNMODIFIED_SINCE),
        if_modified_since: header_str(header::IF_MODIFIED_SINCE),
    };
    match preconditions.evaluate(file.etag, file.last_modified) {
        Outcome::Proceed => {}
        Outcome::NotModified => {
            s.metrics.answered(sent, 304);
            return (StatusCode::NOT_MODIFIED, base).into_response();
        }
        Outcome::Failed => {
            s.metrics.answered(sent, 412);
            return (StatusCode::PRECONDITION_FAILED, base).into_response();
        }
    }
    // If-Range: the range applies only if the client's copy is this file (a strong
    // comparison: a weak tag never matches).
    let range_applies = match header_str(header::IF_RANGE) {
        None => true,
        Some(v) => {
            let v = v.trim();
            (!v.starts_with("W/") && v == file.etag) || v == last_modified
        }
    };
    let ask = match header_str(header::RANGE) {
        Some(r) if range_applies => parse_range(r, size),
        _ => RangeAsk::Whole,
    };
    let (status, start, end) = match ask {
        RangeAsk::Whole => (StatusCode::OK, 0, size),
        RangeAsk::Part(first, last) => (StatusCode::PARTIAL_CONTENT, first, last + 1),
        RangeAsk::Unsatisfiable => {
            s.metrics.answered(sent, 416);
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
        s.metrics.answered(sent, 503);
        let mut r = unavailable(
            &format!("{limit} downloads are in flight, the most this server allows; retry later"),
            s.retry_after,
        );
        r.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return r;
    };
    s.metrics.answered(sent, status.as_u16());
    let progress = Arc::new(Progress::new());
    watch_for_stall(
        slot.remote(),
        Arc::clone(&progress),
        s.stall_timeout,
        Arc::clone(&s.metrics),
    );
    let body = SlotBody {
        // A slice of the mapped file keeps the whole map alive until the body ends.
        data: file.data.slice(start as usize..end as usize),
        sent: 0,
        slot,
        progress,
        stall: s.stall_timeout,
        kind: sent,
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
    slot: Slot,
    progress: Arc<Progress>,
    stall: Duration,
    /// Which byte counter it adds to.
    kind: Sent,
    metrics: Arc<Metrics>,
}

/// When a download last handed bytes to its connection.
struct Progress {
    started: tokio::time::Instant,
    last: AtomicU64,
    done: AtomicBool,
}

impl Progress {
    fn new() -> Self {
        Self {
            started: tokio::time::Instant::now(),
            last: AtomicU64::new(0),
            done: AtomicBool::new(false),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn touch(&self) {
        self.last.store(self.now(), Ordering::Relaxed);
    }

    fn idle_for(&self) -> Duration {
        Duration::from_millis(self.now().saturating_sub(self.last.load(Ordering::Relaxed)))
    }
}

/// How often a download's stall is looked for.
fn stall_step(stall: Duration) -> Duration {
    (stall / 4).clamp(Duration::from_millis(50), Duration::from_secs(1))
}

/// Frees the slot of a download that hands no bytes to its connection for `stall`. Over
/// HTTP/1.1 the connection's own clock ends it too; over HTTP/2 a client that stops
/// reading stops the body being asked for at all, and only this notices.
fn watch_for_stall(slot: Slot, progress: Arc<Progress>, stall: Duration, metrics: Arc<Metrics>) {
    tokio::spawn(async move {
        let step = stall_step(stall);
        loop {
            tokio::time::sleep(step).await;
            if progress.done.load(Ordering::Relaxed) {
                return;
            }
            if progress.idle_for() >= stall {
                slot.release_after(|| inc(&metrics.stalled));
                return;
            }
        }
    });
}

impl Drop for SlotBody {
    fn drop(&mut self) {
        self.progress.done.store(true, Ordering::Relaxed);
        // Ended for stalling (its connection's clock fired): counted here, once. That clock
        // starts at the last byte written, and hyper may ask for one more chunk after it,
        // so the body's own clock can be short of `stall` by a moment: a watcher's step
        // of slack, since a client that just goes away leaves far sooner than that.
        let slack = stall_step(self.stall);
        let stalled = self.sent < self.data.len() && self.progress.idle_for() + slack >= self.stall;
        self.slot.release_after(|| {
            if stalled {
                inc(&self.metrics.stalled);
            }
        });
    }
}

impl Stream for SlotBody {
    type Item = Result<Bytes, std::convert::Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.sent >= self.data.len() {
            return Poll::Ready(None);
        }
        self.progress.touch();
        let end = (self.sent + BODY_CHUNK).min(self.data.len());
        let chunk = self.data.slice(self.sent..end);
        self.metrics.sent(self.kind, chunk.len() as u64);
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
    use agent_releases::store::sample_bundle;

    fn bundle(v: &str, p: &str) -> std::sync::Arc<agent_releases::store::ServedBundle> {
        sample_bundle(v.parse().unwrap(), p)
    }

    #[test]
    fn a_plain_ask_of_several_platforms_must_choose() {
        let gnu = "x86_64-unknown-linux-gnu";
        let musl = "x86_64-unknown-linux-musl";
        let one = Release::assemble(vec![bundle("2.0.0+7", gnu)], gnu).unwrap();
        assert!(matches!(pick(&one, None, false), Pick::Bundle(b) if b.platform == gnu));
        assert!(matches!(pick(&one, Some(gnu), false), Pick::Bundle(_)));
        assert!(matches!(pick(&one, Some(musl), false), Pick::NoBundle));
        let two =
            Release::assemble(vec![bundle("2.0.0+7", gnu), bundle("2.0.0+7", musl)], gnu).unwrap();
        assert!(matches!(pick(&two, None, false), Pick::Choose));
        assert!(matches!(pick(&two, Some(""), false), Pick::Choose));
        assert!(matches!(pick(&two, None, true), Pick::Bundle(b) if b.platform == gnu));
        assert!(matches!(pick(&two, Some(musl), false), Pick::Bundle(b) if b.platform == musl));
        assert!(matches!(
            pick(&two, Some("x86_64-unknown-linux-gnu\n"), false),
            Pick::BadPlatform
        ));
        assert!(matches!(
            pick(&two, Some("aarch64-unknown-linux-gnu"), false),
            Pick::NoBundle
        ));
        let text = {
            let r = multiple_choices("http://h:1", &two, wire::DOWNLOAD_PATH);
            assert_eq!(r.status(), StatusCode::MULTIPLE_CHOICES);
            r
        };
        drop(text);
    }

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
        // Not ranges at all (RFC 9110 §14.1.1: 1*DIGIT): ignored, the whole file.
        for bad in [
            "bytes=+1-2",
            "bytes=1-+2",
            "bytes=-+5",
            "bytes= -",
            "bytes=0x1-2",
        ] {
            assert_eq!(parse_range(bad, 100), RangeAsk::Whole, "{bad}");
        }
    }

    fn at(secs: u64) -> std::time::SystemTime {
        std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs)
    }

    fn date(secs: u64) -> String {
        httpdate::fmt_http_date(at(secs))
    }

    #[test]
    fn conditional_requests_follow_rfc_9110() {
        let etag = "\"abc\"";
        let modified = at(1_000_000);
        let eval = |p: Preconditions<'_>| p.evaluate(etag, modified);
        let none = Preconditions::default();
        assert_eq!(eval(none), Outcome::Proceed);
        // If-None-Match: weak comparison, so W/"abc" matches.
        for inm in ["\"abc\"", "W/\"abc\"", "\"x\", W/\"abc\"", "*"] {
            let p = Preconditions {
                if_none_match: Some(inm),
                ..none
            };
            assert_eq!(eval(p), Outcome::NotModified, "{inm}");
        }
        let p = Preconditions {
            if_none_match: Some("\"other\""),
            ..none
        };
        assert_eq!(eval(p), Outcome::Proceed);
        // If-Match: strong comparison, so W/"abc" does not match.
        for (im, outcome) in [
            ("\"abc\"", Outcome::Proceed),
            ("*", Outcome::Proceed),
            ("W/\"abc\"", Outcome::Failed),
            ("\"other\"", Outcome::Failed),
        ] {
            let p = Preconditions {
                if_match: Some(im),
                ..none
            };
            assert_eq!(eval(p), outcome, "{im}");
        }
        // If-Unmodified-Since, only without If-Match.
        let earlier = date(999_999);
        let later = date(1_000_001);
        let p = Preconditions {
            if_unmodified_since: Some(&earlier),
            ..none
        };
        assert_eq!(eval(p), Outcome::Failed);
        let p = Preconditions {
            if_unmodified_since: Some(&later),
            ..none
        };
        assert_eq!(eval(p), Outcome::Proceed);
        let p = Preconditions {
            if_match: Some("\"abc\""),
            if_unmodified_since: Some(&earlier),
            ..none
        };
        assert_eq!(eval(p), Outcome::Proceed, "If-Match takes precedence");
        let p = Preconditions {
            if_unmodified_since: Some("not a date"),
            ..none
        };
        assert_eq!(eval(p), Outcome::Proceed, "an invalid date is ignored");
        // If-Modified-Since, only without If-None-Match.
        let same = date(1_000_000);
        let p = Preconditions {
            if_modified_since: Some(&same),
            ..none
        };
        assert_eq!(eval(p), Outcome::NotModified);
        let p = Preconditions {
            if_modified_since: Some(&earlier),
            ..none
        };
        assert_eq!(eval(p), Outcome::Proceed);
        let p = Preconditions {
            if_none_match: Some("\"other\""),
            if_modified_since: Some(&same),
            ..none
        };
        assert_eq!(eval(p), Outcome::Proceed, "If-None-Match takes precedence");
    }
}
