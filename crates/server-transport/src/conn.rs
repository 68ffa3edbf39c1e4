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
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::time::{Instant, Sleep};
use tower::ServiceExt;

use crate::counters::{ConnCounters, inc};
use crate::held;

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
    /// The client's address, for the audit log (`None` in tests without a socket).
    peer: Option<std::net::IpAddr>,
}

/// The address a request came from, as the connection's peer: handlers read it as an
/// extension (the audit log says from where a change was made).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddr(pub std::net::IpAddr);

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
            peer: None,
        }
    }

    fn with_peer(mut self, peer: std::net::IpAddr) -> Self {
        self.peer = Some(peer);
        self
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
        self.request_finished_at(self.now());
    }

    /// `now`: milliseconds since the connection opened (the clock is an argument for
    /// the tests).
    fn request_finished_at(&self, now: u64) {
        if self.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.idle_since.store(now, Ordering::Release);
        }
    }

    fn bytes_read(&self) {
        self.bytes_read_at(self.now());
    }

    fn bytes_read_at(&self, now: u64) {
        if self.active.load(Ordering::Acquire) == 0 {
            let _ =
                self.head_since
                    .compare_exchange(NONE, now, Ordering::AcqRel, Ordering::Acquire);
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
    metrics: Arc<ConnCounters>,
    read_timer: Pin<Box<Sleep>>,
    write_timer: Pin<Box<Sleep>>,
    /// When a write last made progress (or the stall clock was last reset).
    last_write: u64,
}

impl<T> Guarded<T> {
    fn new(
        inner: T,
        state: Arc<ConnState>,
        timeouts: Timeouts,
        metrics: Arc<ConnCounters>,
    ) -> Self {
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
async fn handle<B>(
    router: Router,
    state: Arc<ConnState>,
    req: Request<B>,
) -> Result<Response<GuardedBody>, Infallible>
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    state.request_started();
    let guard = RequestGuard(Arc::clone(&state));
    let mut req = req.map(Body::new);
    req.extensions_mut().insert(ConnHold(Arc::clone(&state)));
    if let Some(peer) = state.peer {
        req.extensions_mut().insert(ClientAddr(peer));
    }
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
        // The keys are read once, here: other connections change `head_since` while
        // this sorts, and a sort whose keys change under it panics (it took a server of
        // 20,000 agents down at its connection limit).
        let candidates: Vec<(EvictionKey, Arc<ConnState>)> = self
            .lock()
            .values()
            .filter(|c| c.active.load(Ordering::Acquire) == 0)
            .map(|c| (EvictionKey::of(c), Arc::clone(c)))
            .collect();
        for c in eviction_order(candidates) {
            if c.claim_for_eviction() {
                c.evict.notify_one();
                return true;
            }
        }
        false
    }
}

/// What an eviction orders connections by, read once per connection: idle (no byte of
/// a head yet) before half-sent heads, then oldest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct EvictionKey {
    sending_head: bool,
    opened: Instant,
}

impl EvictionKey {
    fn of(c: &ConnState) -> Self {
        let head_since = c.head_since.load(Ordering::Acquire);
        Self {
            sending_head: head_since != 0 && head_since != NONE,
            opened: c.opened,
        }
    }
}

/// The candidates in the order they are evicted (pure: keys are a snapshot).
fn eviction_order<T>(mut candidates: Vec<(EvictionKey, T)>) -> impl Iterator<Item = T> {
    candidates.sort_by_key(|(key, _)| *key);
    candidates.into_iter().map(|(_, c)| c)
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
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        handle(router.clone(), Arc::clone(&state), req)
    });
    let conn = builder
        .serve_connection_with_upgrades(TokioIo::new(io), service)
        .into_owned();
    let _ = watcher.watch(conn).await;
}

/// Serves a plain connection: agents' API requests here (see `crate::held`: a held connect
/// keeps no buffers), and from its first other request on, everything through hyper.
async fn serve_plain(
    builder: auto::Builder<TokioExecutor>,
    mut io: Guarded<tokio::net::TcpStream>,
    router: Router,
    state: Arc<ConnState>,
    watcher: hyper_util::server::graceful::Watcher,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) {
    let mut buf = Vec::new();
    loop {
        let next = tokio::select! {
            next = held::next_request(&mut io, &mut buf, MAX_HEAD) => next,
            // Between requests a stopping server just closes, as hyper does.
            _ = stopping.wait_for(|s| *s), if buf.is_empty() => return,
        };
        let (request, asked_close) = match next {
            Ok(held::Next::Agent { request, close }) => (request, close),
            Ok(held::Next::Hyper) => {
                let io = held::Prefixed::new(buf, io);
                // Boxed: hyper's connection is kilobytes, and a connection served here
                // should not carry room for it.
                return Box::pin(serve_io(builder, io, router, state, watcher)).await;
            }
            Ok(held::Next::Closed) | Err(_) => return,
        };
        let call = std::pin::pin!(handle(router.clone(), Arc::clone(&state), *request));
        let Some(response) = answer_unless_gone(call, &mut io, &mut buf).await else {
            return;
        };
        let (parts, mut body) = response.into_parts();
        // Collected through a borrow: the body holds the request's guard until written.
        let bytes = match http_body_util::BodyExt::collect(&mut body).await {
            Ok(collected) => collected.to_bytes(),
            Err(e) => {
                tracing::debug!("an agent's answer failed: {e}");
                return;
            }
        };
        let close = asked_close || held::closes(&parts) || *stopping.borrow();
        let written = io.write_all(&held::encode(&parts, &bytes, close)).await;
        // The request is done once its answer is written (the body holds its guard).
        drop(body);
        if written.is_err() || close {
            let _ = io.shutdown().await;
            return;
        }
    }
}

/// Runs a held request to its answer, or ends it when its client goes away meanwhile (as
/// hyper does when it reads the end of a connection under a running request). Bytes the
/// client sends ahead are kept in `buf` for the next request.
async fn answer_unless_gone<F, R>(
    mut call: Pin<&mut F>,
    io: &mut Guarded<tokio::net::TcpStream>,
    buf: &mut Vec<u8>,
) -> Option<R>
where
    F: Future<Output = Result<R, Infallible>>,
{
    loop {
        tokio::select! {
            answer = &mut call => return match answer {
                Ok(r) => Some(r),
                Err(never) => match never {},
            },
            read = read_ahead(io, buf) => if !read { return None },
        }
    }
}

/// Reads what a client sends while its request runs; false once it has closed. A client
/// that pipelines more than a head's worth is not read further until it is answered.
async fn read_ahead(io: &mut Guarded<tokio::net::TcpStream>, buf: &mut Vec<u8>) -> bool {
    if buf.len() >= MAX_HEAD {
        return std::future::pending().await;
    }
    // Small: it is part of every held connect, and a client rarely sends ahead.
    let mut chunk = [0u8; 64];
    match io.read(&mut chunk).await {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            true
        }
    }
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
    metrics: Arc<ConnCounters>,
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
    let stopping = tokio::sync::watch::Sender::new(false);
    let (live, mut until_done) = tokio::sync::mpsc::channel::<()>(1);
    let mut next_id = 0u64;
    let mut last_accept_error = String::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => (stream, peer.ip()),
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
                if crate::panics::catch("choosing a connection to evict", || registry.evict_one())
                    == Some(true)
                {
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
        let state = Arc::new(ConnState::new(next_id).with_peer(peer));
        registry.lock().insert(state.id, Arc::clone(&state));
        let watched = Arc::clone(&state);
        let registered = Arc::clone(&registry);
        let io = Guarded::new(stream, Arc::clone(&state), timeouts, Arc::clone(&metrics));
        let router = router.clone();
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let acceptor = acceptor.clone();
        let metrics = Arc::clone(&metrics);
        let stopping = stopping.subscribe();
        let live = live.clone();
        metrics.connections_open.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            let serve = async {
                match acceptor {
                    None => serve_plain(builder, io, router, state, watcher, stopping).await,
                    // The handshake is part of the head: it gets the header clock.
                    // Boxed: a TLS session is kilobytes, and a plain connection should not
                    // carry room for one.
                    Some(acceptor) => {
                        Box::pin(async {
                            match tokio::time::timeout(timeouts.header, acceptor.accept(io)).await {
                                Ok(Ok(tls)) => serve_io(builder, tls, router, state, watcher).await,
                                Ok(Err(e)) => tracing::debug!("TLS handshake failed: {e}"),
                                Err(_) => inc(&metrics.header_timeouts),
                            }
                        })
                        .await
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
            drop(live);
        });
    }
    drop(listener);
    stopping.send_replace(true);
    // Hyper's connections are watched by `graceful`; connects served beside it hold a
    // sender each, and the channel closes when the last one is done.
    drop(live);
    let all_done = async {
        graceful.shutdown().await;
        let _ = until_done.recv().await;
    };
    tokio::select! {
        () = all_done => {}
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

    /// At the limit, connections change their heads while an eviction looks at them:
    /// the choice is made on a snapshot, and never panics (a sort on live keys did).
    #[test]
    fn eviction_survives_connections_that_change_while_it_chooses() {
        let registry = Arc::new(Registry::default());
        let conns: Vec<Arc<ConnState>> = (0..3000).map(|i| Arc::new(ConnState::new(i))).collect();
        for c in &conns {
            registry.lock().insert(c.id, Arc::clone(c));
        }
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let changers: Vec<_> = (0..2)
            .map(|t| {
                let conns = conns.clone();
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    let mut n: u64 = t;
                    while !stop.load(Ordering::Relaxed) {
                        for c in &conns {
                            n = n.wrapping_mul(6364136223846793005).wrapping_add(1);
                            let value = match n >> 62 {
                                0 => 0,
                                1 => NONE,
                                _ => n >> 40,
                            };
                            c.head_since.store(value, Ordering::Release);
                        }
                    }
                })
            })
            .collect();
        for _ in 0..300 {
            assert!(
                registry.evict_one(),
                "an idle connection is always there to evict"
            );
            // Let the evicted one serve again, so every round chooses among them all.
            for c in &conns {
                let _ = c
                    .active
                    .compare_exchange(EVICTED, 0, Ordering::AcqRel, Ordering::Acquire);
            }
        }
        stop.store(true, Ordering::Relaxed);
        for t in changers {
            t.join().expect("a changer thread");
        }
    }

    #[test]
    fn eviction_orders_idle_before_half_sent_heads_then_oldest_first() {
        let t0 = Instant::now();
        let key = |sending_head, after_ms| EvictionKey {
            sending_head,
            opened: t0 + Duration::from_millis(after_ms),
        };
        let order: Vec<&str> = eviction_order(vec![
            (key(true, 1), "old head"),
            (key(false, 5), "new idle"),
            (key(false, 2), "old idle"),
            (key(true, 9), "new head"),
        ])
        .collect();
        assert_eq!(order, ["old idle", "new idle", "old head", "new head"]);
    }

    #[test]
    fn the_connection_cap_fits_the_file_limit() {
        assert_eq!(fit_connections(1024, 65_536), (1024, None));
        let (fitted, why) = fit_connections(4096, 1024);
        assert_eq!(fitted, 1024 - FD_RESERVE as usize);
        assert!(why.unwrap().contains("file limit"));
        assert_eq!(fit_connections(10, 0).0, 1);
    }

    #[tokio::test]
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
        io.state.request_finished_at(5_000);
        assert_eq!(io.read_deadline(), Some((65_000, Expired::Idle)));
        io.state.bytes_read_at(15_000);
        assert_eq!(io.read_deadline(), Some((45_000, Expired::Header)));
    }
}
#[cfg(test)]
mod served_beside_hyper {
    //! The agents' requests taken off hyper (`crate::held`), over real sockets.

    use std::sync::atomic::AtomicBool;

    use axum::routing::{get, post};
    use tokio::net::TcpStream;

    use super::*;

    /// Drops set a flag: a handler's future was ended.
    struct Dropped(Arc<AtomicBool>);

    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    struct Server {
        port: u16,
        started: Arc<AtomicBool>,
        ended: Arc<AtomicBool>,
        stop: Option<tokio::sync::oneshot::Sender<()>>,
        done: tokio::task::JoinHandle<()>,
    }

    async fn server() -> Server {
        let started = Arc::new(AtomicBool::new(false));
        let ended = Arc::new(AtomicBool::new(false));
        let (s, e) = (Arc::clone(&started), Arc::clone(&ended));
        let router = Router::new()
            .route(
                "/agent/echo",
                post(|body: String| async move { ([("x-seen", "yes")], format!("echo {body}")) }),
            )
            .route(
                "/agent/hold",
                post(move || async move {
                    let _dropped = Dropped(e);
                    s.store(true, Ordering::SeqCst);
                    std::future::pending::<()>().await;
                }),
            )
            .route("/other", get(|| async { "from hyper" }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let done = tokio::spawn(serve(
            Listener {
                listener,
                max_connections: 64,
                timeouts: Timeouts {
                    header: Duration::from_secs(5),
                    idle: Duration::from_secs(5),
                    stall: Duration::from_secs(5),
                },
                tls: None,
            },
            router,
            Arc::new(ConnCounters::default()),
            async {
                let _ = stopped.await;
            },
            Duration::from_secs(5),
        ));
        Server {
            port,
            started,
            ended,
            stop: Some(stop),
            done,
        }
    }

    /// Reads one response: its head (lower-cased) and its body, by its content-length.
    async fn response(stream: &mut TcpStream, pending: &mut Vec<u8>) -> (String, String) {
        loop {
            if let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8(pending[..end].to_vec())
                    .unwrap()
                    .to_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .map_or(0, |v| v.trim().parse().unwrap());
                let start = end + 4;
                while pending.len() < start + length {
                    assert!(stream.read_buf(pending).await.unwrap() > 0, "cut short");
                }
                let body = String::from_utf8(pending[start..start + length].to_vec()).unwrap();
                pending.drain(..start + length);
                return (head, body);
            }
            assert!(
                stream.read_buf(pending).await.unwrap() > 0,
                "closed before a head"
            );
        }
    }

    /// A new connection that has sent `text`.
    async fn sent(port: u16, text: &str) -> TcpStream {
        let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        c.write_all(text.as_bytes()).await.unwrap();
        c
    }

    fn request(path: &str, body: &str, extra: &str) -> String {
        format!(
            "POST {path} HTTP/1.1\r\nHost: t\r\n{extra}Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
    }

    async fn wait_for(flag: &AtomicBool, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !flag.load(Ordering::SeqCst) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn agents_requests_are_answered_in_order_then_hyper_takes_the_connection_on() {
        let server = server().await;
        // Two pipelined in one write, then a request that is hyper's.
        let two = format!(
            "{}{}",
            request("/agent/echo", "one", ""),
            request("/agent/echo", "two", "")
        );
        let mut c = sent(server.port, &two).await;
        let mut pending = Vec::new();
        let (head, body) = response(&mut c, &mut pending).await;
        assert!(head.starts_with("http/1.1 200 ok\r\n"), "{head}");
        assert!(head.contains("\r\nx-seen: yes"), "{head}");
        assert!(head.contains("\r\ndate: "), "{head}");
        assert_eq!(body, "echo one");
        assert_eq!(response(&mut c, &mut pending).await.1, "echo two");
        // The router still refuses what it refuses, here as it would through hyper.
        c.write_all(b"POST /agent/echo HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
            .await
            .unwrap();
        let (head, _) = response(&mut c, &mut pending).await;
        assert!(head.starts_with("http/1.1 400 "), "no Host: {head}");
        assert!(head.contains("connection: close"), "{head}");
        let mut c = sent(server.port, &request("/agent/echo", "three", "")).await;
        assert_eq!(response(&mut c, &mut pending).await.1, "echo three");
        c.write_all(b"GET /other HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .unwrap();
        let (head, body) = response(&mut c, &mut pending).await;
        assert!(head.starts_with("http/1.1 200 ok"), "{head}");
        assert_eq!(body, "from hyper");
        // And from then on, hyper answers the agents' requests too, the same way.
        c.write_all(request("/agent/echo", "four", "").as_bytes())
            .await
            .unwrap();
        assert_eq!(response(&mut c, &mut pending).await.1, "echo four");
    }

    #[tokio::test]
    async fn connection_close_is_answered_and_honoured() {
        let server = server().await;
        let mut c = sent(
            server.port,
            &request("/agent/echo", "x", "Connection: close\r\n"),
        )
        .await;
        let mut pending = Vec::new();
        let (head, body) = response(&mut c, &mut pending).await;
        assert!(head.contains("\r\nconnection: close"), "{head}");
        assert_eq!(body, "echo x");
        assert_eq!(c.read_buf(&mut pending).await.unwrap(), 0, "closed after");
    }

    #[tokio::test]
    async fn a_client_that_goes_away_ends_its_held_request() {
        let server = server().await;
        let c = sent(server.port, &request("/agent/hold", "", "")).await;
        wait_for(&server.started, "the request to be held").await;
        assert!(!server.ended.load(Ordering::SeqCst));
        drop(c);
        wait_for(&server.ended, "the held request to be ended").await;
    }

    #[tokio::test]
    async fn a_stopping_server_closes_its_idle_agents_connections() {
        let mut server = server().await;
        let mut c = sent(server.port, &request("/agent/echo", "x", "")).await;
        let mut pending = Vec::new();
        assert_eq!(response(&mut c, &mut pending).await.1, "echo x");
        let _ = server.stop.take().unwrap().send(());
        assert_eq!(c.read_buf(&mut pending).await.unwrap(), 0, "closed");
        tokio::time::timeout(Duration::from_secs(10), server.done)
            .await
            .expect("the server stops once its connections are done")
            .unwrap();
    }
}
