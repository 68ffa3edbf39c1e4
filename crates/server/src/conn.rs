//! Connections: the accept loop, and what one client may hold.
//!
//! A client holds at most one of `server.max-connections` open connections (counted while
//! open, not only while a request runs), and each connection is watched on the clock:
//!
//! - a request head must arrive whole within `server.header-timeout` of its first byte (or
//!   of the connection opening), and may not exceed 16 KiB (`431`);
//! - a connection between requests is closed after `server.idle-timeout` (keep-alive);
//! - a response its client takes no bytes of for `downloads.stall-timeout` is ended, and
//!   with it the download and its slot;
//! - an HTTP/1.1 request without exactly one `Host` is answered `400`.
//!
//! The timers live in the I/O under hyper (so they count the bytes that really move), and
//! the connection's service tells them when a request starts and when its response ends.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, Response, StatusCode, Version, header};
use http_body::Frame;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};
use tower::ServiceExt;

use crate::metrics::{Metrics, inc};

/// Largest request head (request line and headers) a client may send.
pub const MAX_HEAD: usize = 16 * 1024;
/// File descriptors kept for the server's own files (database, bundle scans, logs)
/// beyond its connections.
pub const FD_RESERVE: u64 = 128;

/// The clocks a connection is held to.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub header: Duration,
    pub idle: Duration,
    pub stall: Duration,
}

/// Milliseconds on a clock that starts with the connection.
fn millis(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// What a connection is doing, shared by its I/O, its service and the accept loop.
#[derive(Debug)]
struct ConnState {
    id: u64,
    /// Told to close: the accept loop needs its slot for a new connection.
    evict: tokio::sync::Notify,
    opened: Instant,
    /// Requests whose responses are not finished.
    active: AtomicUsize,
    /// When the head being received began (its first byte, or the connection opening);
    /// `u64::MAX` while none is being received.
    head_since: AtomicU64,
    /// When the last response finished.
    idle_since: AtomicU64,
}

const NONE: u64 = u64::MAX;

/// `active` of a connection chosen for eviction: it starts no request any more.
const EVICTED: usize = usize::MAX / 2;

impl ConnState {
    fn new(id: u64) -> Self {
        Self {
            id,
            evict: tokio::sync::Notify::new(),
            opened: Instant::now(),
            active: AtomicUsize::new(0),
            // A new connection owes a request head from the start.
            head_since: AtomicU64::new(0),
            idle_since: AtomicU64::new(0),
        }
    }

    fn now(&self) -> u64 {
        millis(self.opened)
    }

    /// Claims this connection for eviction if it has no request under way.
    fn claim_for_eviction(&self) -> bool {
        self.active
            .compare_exchange(0, EVICTED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    fn request_started(&self) {
        self.active.fetch_add(1, Ordering::AcqRel);
        self.head_since.store(NONE, Ordering::Release);
    }

    fn request_finished(&self) {
        if self.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.idle_since.store(self.now(), Ordering::Release);
        }
    }

    fn bytes_read(&self) {
        if self.active.load(Ordering::Acquire) == 0 {
            let _ = self.head_since.compare_exchange(
                NONE,
                self.now(),
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
    }
}

/// Which clock closed a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expired {
    Header,
    Idle,
    Stall,
}

/// The TCP stream, with the connection's clocks.
struct Guarded<T> {
    inner: T,
    state: Arc<ConnState>,
    timeouts: Timeouts,
    metrics: Arc<Metrics>,
    read_timer: Pin<Box<Sleep>>,
    write_timer: Pin<Box<Sleep>>,
    /// When a write last made progress (or the stall clock was last reset).
    last_write: u64,
}

impl<T> Guarded<T> {
    fn new(inner: T, state: Arc<ConnState>, timeouts: Timeouts, metrics: Arc<Metrics>) -> Self {
        let far = Instant::now() + Duration::from_secs(86_400 * 365);
        Self {
            inner,
            state,
            timeouts,
            metrics,
            read_timer: Box::pin(tokio::time::sleep_until(far)),
            write_timer: Box::pin(tokio::time::sleep_until(far)),
            last_write: 0,
        }
    }

    /// The deadline a pending read is held to, and which clock it is.
    fn read_deadline(&self) -> Option<(u64, Expired)> {
        if self.state.active.load(Ordering::Acquire) > 0 {
            // A request runs: its body is bounded by the routes' own timeout, and hyper
            // may poll for the next head while it writes a long download.
            return None;
        }
        let head = self.state.head_since.load(Ordering::Acquire);
        if head != NONE {
            return Some((head + ms(self.timeouts.header), Expired::Header));
        }
        let idle = self.state.idle_since.load(Ordering::Acquire);
        Some((idle + ms(self.timeouts.idle), Expired::Idle))
    }

    fn expired(&self, why: Expired) -> io::Error {
        let counter = match why {
            Expired::Header => &self.metrics.header_timeouts,
            Expired::Idle => &self.metrics.idle_closed,
            Expired::Stall => &self.metrics.stall_closed,
        };
        inc(counter);
        let what = match why {
            Expired::Header => "no complete request head within server.header-timeout",
            Expired::Idle => "idle for server.idle-timeout",
            Expired::Stall => "the client took no bytes for downloads.stall-timeout",
        };
        io::Error::new(io::ErrorKind::TimedOut, what)
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX / 2)
}

/// Arms `timer` for `deadline` (ms on the connection's clock) and polls it.
fn expired_at(
    timer: &mut Pin<Box<Sleep>>,
    state: &ConnState,
    deadline: u64,
    cx: &mut Context<'_>,
) -> bool {
    let at = state.opened + Duration::from_millis(deadline);
    if timer.deadline() != at {
        timer.as_mut().reset(at);
    }
    timer.as_mut().poll(cx).is_ready()
}

impl<T: AsyncRead + Unpin> AsyncRead for Guarded<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.state.bytes_read();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => match this.read_deadline() {
                Some((deadline, why))
                    if expired_at(&mut this.read_timer, &this.state, deadline, cx) =>
                {
                    Poll::Ready(Err(this.expired(why)))
                }
                _ => Poll::Pending,
            },
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Guarded<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_write(cx, data) {
            Poll::Ready(result) => {
                this.last_write = this.state.now();
                Poll::Ready(result)
            }
            Poll::Pending => this.write_pending(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_write_vectored(cx, bufs) {
            Poll::Ready(result) => {
                this.last_write = this.state.now();
                Poll::Ready(result)
            }
            Poll::Pending => this.write_pending(cx),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<T> Guarded<T> {
    /// A write that cannot proceed: the client is not reading. Since the last progress
    /// (or since the response began, whichever is later), it has `stall` to take bytes.
    fn write_pending<R>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<R>> {
        let since = self
            .last_write
            .max(self.state.idle_since.load(Ordering::Acquire));
        let deadline = since + ms(self.timeouts.stall);
        if expired_at(&mut self.write_timer, &self.state, deadline, cx) {
            Poll::Ready(Err(self.expired(Expired::Stall)))
        } else {
            Poll::Pending
        }
    }
}

/// Ends a request's share of the connection when the response body is done with
/// (written, or dropped because the client went away).
#[derive(Debug)]
struct RequestGuard(Arc<ConnState>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.request_finished();
    }
}

/// A response body that keeps the request counted until hyper drops it.
struct GuardedBody {
    inner: Body,
    _guard: RequestGuard,
}

impl http_body::Body for GuardedBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// `400` for an HTTP/1.1 request with no `Host`, or with several (RFC 9112 §3.2).
fn host_problem<B>(req: &Request<B>) -> Option<&'static str> {
    if req.version() != Version::HTTP_11 {
        return None;
    }
    match req.headers().get_all(header::HOST).iter().count() {
        1 => None,
        0 => Some("an HTTP/1.1 request needs a Host header"),
        _ => Some("an HTTP/1.1 request may carry only one Host header"),
    }
}

fn bad_request(message: &'static str) -> Response<Body> {
    let mut r = Response::new(Body::from(
        serde_json::json!({ "error": message }).to_string(),
    ));
    *r.status_mut() = StatusCode::BAD_REQUEST;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    r.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    r
}

/// Lets a handler that takes its connection over (a WebSocket) keep it counted as
/// busy for as long as it lives: no idle or head timeout, never evicted for room.
#[derive(Debug, Clone)]
pub struct ConnHold(Arc<ConnState>);

/// The connection is busy until this is dropped.
#[derive(Debug)]
pub struct Held(#[allow(dead_code, reason = "held for its Drop")] RequestGuard);

impl ConnHold {
    pub fn hold(&self) -> Held {
        self.0.request_started();
        Held(RequestGuard(Arc::clone(&self.0)))
    }
}

/// Serves one request of a connection through the router, counting it as active.
async fn handle(
    router: Router,
    state: Arc<ConnState>,
    req: Request<Incoming>,
) -> Result<Response<GuardedBody>, Infallible> {
    state.request_started();
    let guard = RequestGuard(Arc::clone(&state));
    let mut req = req.map(Body::new);
    req.extensions_mut().insert(ConnHold(Arc::clone(&state)));
    let response = match host_problem(&req) {
        Some(problem) => bad_request(problem),
        None => match router.oneshot(req).await {
            Ok(r) => r,
            Err(never) => match never {},
        },
    };
    Ok(response.map(|inner| GuardedBody {
        inner,
        _guard: guard,
    }))
}

/// The open connections, so that a full server can make room.
#[derive(Debug, Default)]
struct Registry {
    open: std::sync::Mutex<std::collections::HashMap<u64, Arc<ConnState>>>,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<u64, Arc<ConnState>>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Closes the connection that has waited longest without a request under way (an
    /// idle one first, then one still sending its head); a request under way is never
    /// cut. False if every connection is busy.
    fn evict_one(&self) -> bool {
        let mut candidates: Vec<Arc<ConnState>> = self
            .lock()
            .values()
            .filter(|c| c.active.load(Ordering::Acquire) == 0)
            .cloned()
            .collect();
        // Idle (no byte of a head yet) before half-sent heads, oldest first.
        candidates.sort_by_key(|c| {
            (
                c.head_since.load(Ordering::Acquire) != 0
                    && c.head_since.load(Ordering::Acquire) != NONE,
                c.opened,
            )
        });
        for c in candidates {
            if c.claim_for_eviction() {
                c.evict.notify_one();
                return true;
            }
        }
        false
    }
}

/// Raises this process's soft file limit to its hard limit; returns the soft limit now
/// in force.
pub fn raise_fd_limit(wanted: u64) -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 1024;
    };
    // Past the hard limit only a privileged process may go; try, then settle for it.
    if wanted > hard && setrlimit(Resource::RLIMIT_NOFILE, wanted, wanted).is_ok() {
        return wanted;
    }
    if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        return hard;
    }
    soft
}

/// The connection cap that fits the file limit: `wanted`, or less (with the reason).
pub fn fit_connections(wanted: usize, fd_limit: u64) -> (usize, Option<String>) {
    let room = usize::try_from(fd_limit.saturating_sub(FD_RESERVE)).unwrap_or(usize::MAX);
    if wanted <= room {
        return (wanted, None);
    }
    let fitted = room.max(1);
    (
        fitted,
        Some(format!(
            "server.max-connections = {wanted} does not fit the file limit of {fd_limit} (less {FD_RESERVE} kept for the server's own files); using {fitted}. Raise the limit (ulimit -n, LimitNOFILE=) to allow more"
        )),
    )
}

/// Serves one connection's I/O (plain, or TLS over the guarded stream) until it ends.
async fn serve_io<I>(
    builder: auto::Builder<TokioExecutor>,
    io: I,
    router: Router,
    state: Arc<ConnState>,
    watcher: hyper_util::server::graceful::Watcher,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service =
        hyper::service::service_fn(move |req| handle(router.clone(), Arc::clone(&state), req));
    let conn = builder
        .serve_connection_with_upgrades(TokioIo::new(io), service)
        .into_owned();
    let _ = watcher.watch(conn).await;
}

/// What a server needs to accept connections.
pub struct Listener {
    pub listener: tokio::net::TcpListener,
    pub max_connections: usize,
    pub timeouts: Timeouts,
    /// HTTPS only, when set.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

/// Accepts connections until `shutdown` resolves, at most `max_connections` open at
/// once (the rest wait in the kernel's queue); then stops accepting, lets running
/// requests finish for `grace`, and returns.
pub async fn serve(
    listener: Listener,
    router: Router,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send,
    grace: Duration,
) {
    let Listener {
        listener,
        max_connections,
        timeouts,
        tls,
    } = listener;
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let slots = Arc::new(tokio::sync::Semaphore::new(max_connections));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(None)
        .max_buf_size(MAX_HEAD)
        .keep_alive(true);
    builder.http2().timer(TokioTimer::new());
    let registry = Arc::new(Registry::default());
    let mut next_id = 0u64;
    let mut last_accept_error = String::new();
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, most likely: wait rather than spin.
                    let e = e.to_string();
                    if e != last_accept_error {
                        tracing::warn!("accepting a connection failed: {e}");
                        last_accept_error = e;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        // Full: a connection that waits for nothing gives its slot to this one, so that a
        // flood of idle connections cannot lock clients out. Only when every connection
        // has a request under way does the new one wait.
        let slot = match Arc::clone(&slots).try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                if registry.evict_one() {
                    inc(&metrics.evicted);
                }
                tokio::select! {
                    () = &mut shutdown => break,
                    slot = Arc::clone(&slots).acquire_owned() => match slot {
                        Ok(s) => s,
                        Err(_) => break,
                    },
                }
            }
        };
        let _ = stream.set_nodelay(true);
        inc(&metrics.connections_total);
        next_id += 1;
        let state = Arc::new(ConnState::new(next_id));
        registry.lock().insert(state.id, Arc::clone(&state));
        let watched = Arc::clone(&state);
        let registered = Arc::clone(&registry);
        let io = Guarded::new(stream, Arc::clone(&state), timeouts, Arc::clone(&metrics));
        let router = router.clone();
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let acceptor = acceptor.clone();
        let metrics = Arc::clone(&metrics);
        metrics.connections_open.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            let serve = async {
                match acceptor {
                    None => serve_io(builder, io, router, state, watcher).await,
                    // The handshake is part of the head: it gets the header clock.
                    Some(acceptor) => {
                        match tokio::time::timeout(timeouts.header, acceptor.accept(io)).await {
                            Ok(Ok(tls)) => serve_io(builder, tls, router, state, watcher).await,
                            Ok(Err(e)) => tracing::debug!("TLS handshake failed: {e}"),
                            Err(_) => inc(&metrics.header_timeouts),
                        }
                    }
                }
            };
            tokio::select! {
                () = serve => {}
                () = watched.evict.notified() => {}
            }
            registered.lock().remove(&watched.id);
            metrics.connections_open.fetch_sub(1, Ordering::Relaxed);
            drop(slot);
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(grace) => {
            tracing::warn!("grace period over; closing the remaining downloads");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eviction_takes_the_oldest_idle_connection_and_never_a_busy_one() {
        let registry = Registry::default();
        let busy = Arc::new(ConnState::new(1));
        busy.request_started();
        let old_idle = Arc::new(ConnState::new(2));
        let new_idle = Arc::new(ConnState::new(3));
        for c in [&busy, &old_idle, &new_idle] {
            registry.lock().insert(c.id, Arc::clone(c));
        }
        assert!(registry.evict_one());
        assert_eq!(old_idle.active.load(Ordering::Acquire), EVICTED);
        assert_eq!(busy.active.load(Ordering::Acquire), 1);
        registry.lock().remove(&2);
        assert!(registry.evict_one());
        assert_eq!(new_idle.active.load(Ordering::Acquire), EVICTED);
        registry.lock().remove(&3);
        assert!(!registry.evict_one(), "only a busy connection is left");
    }

    #[test]
    fn the_connection_cap_fits_the_file_limit() {
        assert_eq!(fit_connections(1024, 65_536), (1024, None));
        let (fitted, why) = fit_connections(4096, 1024);
        assert_eq!(fitted, 1024 - FD_RESERVE as usize);
        assert!(why.unwrap().contains("file limit"));
        assert_eq!(fit_connections(10, 0).0, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_is_due_from_its_first_byte_and_an_idle_connection_from_its_last_response() {
        let state = ConnState::new(1);
        let timeouts = Timeouts {
            header: Duration::from_secs(30),
            idle: Duration::from_secs(60),
            stall: Duration::from_secs(60),
        };
        let io = Guarded::new((), Arc::new(state), timeouts, Arc::default());
        // Fresh: a head is owed from the opening.
        assert_eq!(io.read_deadline(), Some((30_000, Expired::Header)));
        io.state.request_started();
        assert_eq!(io.read_deadline(), None, "a request runs");
        tokio::time::advance(Duration::from_secs(5)).await;
        io.state.request_finished();
        assert_eq!(io.read_deadline(), Some((65_000, Expired::Idle)));
        tokio::time::advance(Duration::from_secs(10)).await;
        io.state.bytes_read();
        assert_eq!(io.read_deadline(), Some((45_000, Expired::Header)));
    }
}
