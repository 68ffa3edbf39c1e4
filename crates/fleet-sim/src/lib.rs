//! fleet-sim: a fleet of simulated agents over real HTTP, to load update-servers and to
//! time rollouts.
//!
//! Each simulated agent speaks the wire protocol as a real one does (register, connect
//! with `Agent-Version`, the `409` directive, `Retry-After`, reports, credentials), but
//! installs nothing: the install is a wait, and its outcome a coin with the chosen odds.
//! It prints a progress line while it runs and a summary at the end: calls per second,
//! latency percentiles per endpoint, errors by kind, bytes received as bundles and as
//! deltas (`--deltas`), and of them fetched ahead of a maintenance window, and the time
//! to the rollout's end.
//!
//! It never writes a file except the `--json` summary it is asked for.

pub mod agent;
pub mod cli;
pub mod opamp;
pub mod stats;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_protocol::AgentVersion;
use rand::Rng;
use serde::Serialize;
use tokio::sync::watch;

use crate::agent::SimAgent;
use crate::opamp::{OpampAgent, Transport};
use crate::stats::{Stats, Summary};

/// How much of the bundle an agent fetches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DownloadMode {
    /// The whole bundle (what real agents do; bandwidth-bound at scale).
    Full,
    /// `HEAD` and the first 64 KiB: the download slot and the request path are exercised
    /// without moving gigabytes across loopback.
    Head,
}

/// What the simulated agents speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// This project's own protocol (`/agent/register`, `/agent/connect`, …).
    Native,
    /// OpAMP on `/v1/opamp` ([`opamp`]).
    Opamp,
}

#[derive(Debug, Clone)]
pub struct Options {
    pub servers: Vec<String>,
    pub agents: usize,
    pub version: AgentVersion,
    pub heartbeat: Duration,
    /// Each heartbeat waits `heartbeat × (1 ± jitter)`.
    pub jitter: f64,
    pub download: DownloadMode,
    pub install_time: Duration,
    pub fail_rate: f64,
    /// Agents start spread over this long.
    pub ramp: Duration,
    /// `(group, share 0–1)`: that share of the agents say they are in the group.
    pub groups: Vec<(String, f64)>,
    /// `(target triple, share 0–1)`: that share of the agents run on that platform; the
    /// rest on this machine's.
    pub platforms: Vec<(String, f64)>,
    /// Stop after this long (unless the rollout ends first with `until_rollout_end`).
    pub duration: Option<Duration>,
    pub until_rollout_end: bool,
    pub admin_token: Option<String>,
    pub progress: Duration,
    /// Latencies of the first this-long are not counted (a ramp, a transition).
    pub warmup: Duration,
    /// Connect as agents do by default: a long poll (`connect?wait=`), held by the
    /// server until something changes for the agent.
    pub long_poll: bool,
    pub protocol: Protocol,
    /// How OpAMP agents reach the server.
    pub transport: Transport,
    /// OpAMP agents check an offered package's signature with this key.
    pub trust_key: Option<agent_protocol::minisign::PublicKey>,
    /// OpAMP agents send it as their bearer (`agents.enrollment-token`).
    pub enrollment_token: Option<String>,
    /// Native agents ask `/agentupdate/delta` from the bundle they run first, and download
    /// the bundle only when the server has no delta (`404`).
    pub deltas: bool,
    /// Native agents take a whole bundle from the download source `/agentupdate/version`
    /// names (`downloads.public-url`), the server when it fails.
    pub download_source: bool,
    /// Native agents told of a release behind their maintenance window fetch it then
    /// (`update.download-ahead`, on by default in real agents), not when it opens.
    pub download_ahead: bool,
    /// Native agents' requests to the servers go over this many HTTP/2 connections (h2c
    /// with prior knowledge, or ALPN over TLS), agent `i` on connection `i mod n`: a
    /// process can then hold more agents than it has file descriptors, each agent still
    /// its own requests and held connects. 0: HTTP/1.1, a connection per request in
    /// flight, as real agents connect.
    pub http2_connections: usize,
}

/// What every simulated agent shares.
pub struct Shared {
    pub options: Options,
    pub servers: Vec<String>,
    pub http: reqwest::Client,
    /// The HTTP/2 clients agents' requests to the servers share (`http2_connections`);
    /// empty: `http` for everything.
    pub http2: Vec<reqwest::Client>,
    pub stats: Stats,
    stop: watch::Receiver<bool>,
    measuring: std::sync::atomic::AtomicBool,
    versions: Mutex<BTreeMap<String, usize>>,
    /// Per version, when a server last took an agent's INSTALLED of it (unix seconds).
    last_installed: Mutex<BTreeMap<String, f64>>,
    bytes: AtomicU64,
    delta_bytes: AtomicU64,
    /// Of the bytes of bundles and deltas, those fetched ahead of a maintenance window;
    /// and how many agents had their release so before their window opened.
    ahead_bytes: AtomicU64,
    ahead_taken: AtomicU64,
    /// Updates that came as a delta, and delta requests answered `404` (the bundle then).
    deltas_taken: AtomicU64,
    /// Updates to a bundle the agent kept (a rollback): nothing fetched.
    kept_taken: AtomicU64,
    delta_fallbacks: AtomicU64,
    busy: AtomicU64,
    failed: AtomicU64,
    refused: AtomicU64,
    unavailable: AtomicU64,
}

impl Shared {
    /// The client agent `index` sends its requests to the servers with.
    pub fn client(&self, index: usize) -> &reqwest::Client {
        match self.http2.len() {
            0 => &self.http,
            n => &self.http2[index % n],
        }
    }

    /// Sleeps, or returns true at once when the simulation ends.
    pub async fn sleep(&self, wait: Duration) -> bool {
        let mut stop = self.stop.clone();
        if *stop.borrow() {
            return true;
        }
        tokio::select! {
            () = tokio::time::sleep(wait) => false,
            _ = stop.changed() => true,
        }
    }

    /// A download refused as busy (`503`/`429`): counts it and waits out its
    /// `Retry-After` (30 s when it names none), never earlier than told, spread over half
    /// as long again. True if the simulation stopped meanwhile.
    pub async fn wait_out_busy(&self, headers: &reqwest::header::HeaderMap) -> bool {
        let told = retry_after(headers).unwrap_or(Duration::from_secs(30));
        self.count_busy();
        let spread = told.mul_f64(0.5 * rand::rng().random::<f64>());
        self.sleep(told + spread).await
    }

    /// False during the warm-up: latencies are not counted then.
    pub fn measuring(&self) -> bool {
        self.measuring.load(Ordering::Relaxed)
    }

    pub fn add_bytes(&self, n: u64) {
        self.bytes.fetch_add(n, Ordering::Relaxed);
    }

    /// Bytes of deltas received.
    pub fn add_delta_bytes(&self, n: u64) {
        self.delta_bytes.fetch_add(n, Ordering::Relaxed);
    }

    /// Bytes (of a bundle or a delta) fetched ahead of a maintenance window.
    pub fn add_ahead_bytes(&self, n: u64) {
        self.ahead_bytes.fetch_add(n, Ordering::Relaxed);
    }

    /// An agent holds its release, fetched ahead of its window.
    pub fn count_ahead(&self) {
        self.ahead_taken.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count_kept(&self) {
        self.kept_taken.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count_delta_taken(&self) {
        self.deltas_taken.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count_delta_fallback(&self) {
        self.delta_fallbacks.fetch_add(1, Ordering::Relaxed);
    }

    /// A `409` to a register or connect: the server refused the agent's version.
    pub fn count_refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// A `503` to a register, connect or report (a server without its database, say).
    pub fn count_unavailable(&self) {
        self.unavailable.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count_busy(&self) {
        self.busy.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count_failed(&self) {
        self.failed.fetch_add(1, Ordering::Relaxed);
    }

    pub fn joined(&self, version: &AgentVersion) {
        *self
            .versions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(version.to_string())
            .or_default() += 1;
    }

    pub fn moved(&self, from: &AgentVersion, to: &AgentVersion) {
        let mut versions = self.versions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = versions.get_mut(&from.to_string()) {
            *n = n.saturating_sub(1);
        }
        *versions.entry(to.to_string()).or_default() += 1;
    }

    /// A server took an agent's INSTALLED of `version` just now.
    pub fn installed(&self, version: &AgentVersion) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        note_latest(
            &mut self
                .last_installed
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
            &version.to_string(),
            now,
        );
    }

    fn versions(&self) -> BTreeMap<String, usize> {
        self.versions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    }
}

/// Keeps in `latest` the later of what it holds for `key` and `at`: reports may be taken
/// out of order across agents, and the last one is what a convergence is timed to.
fn note_latest(latest: &mut BTreeMap<String, f64>, key: &str, at: f64) {
    let entry = latest.entry(key.to_owned()).or_insert(at);
    if at > *entry {
        *entry = at;
    }
}

/// The rollout the simulation watched: the first one of another version than the fleet
/// started on.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RolloutSeen {
    pub version: String,
    pub state: String,
    pub reason: Option<String>,
    /// From its start (as the server recorded it) to its end (as seen here).
    pub seconds: Option<f64>,
    /// Its start and end, unix seconds (the server's record; the end as seen here when
    /// the server gives none).
    pub started_at: Option<f64>,
    pub ended_at: Option<f64>,
    pub wave: u64,
    pub waves: Vec<serde_json::Value>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub agents: usize,
    pub seconds: f64,
    /// After the warm-up: what the latencies and rates cover.
    pub measured_seconds: f64,
    pub endpoints: BTreeMap<&'static str, Summary>,
    pub errors: BTreeMap<String, u64>,
    pub versions: BTreeMap<String, usize>,
    /// Per version, when a server last took an INSTALLED of it from one of these agents
    /// (unix seconds; native agents): with several releases at once (deployments), when
    /// each one's agents here had all reported it.
    pub last_installed: BTreeMap<String, f64>,
    /// Bytes received as whole bundles (`/agentupdate/download`).
    pub bundle_bytes: u64,
    /// Bytes received as deltas (`/agentupdate/delta`, with `--deltas`).
    pub delta_bytes: u64,
    /// Updates that came as a delta.
    pub deltas_taken: u64,
    /// Updates to a bundle the agent kept, with nothing fetched.
    pub kept_taken: u64,
    /// Delta requests answered `404`: those agents downloaded the bundle.
    pub delta_fallbacks: u64,
    /// Bytes of bundles and deltas fetched ahead of a maintenance window (counted in
    /// `bundle_bytes` and `delta_bytes` too), and the agents that fetched their release so.
    pub ahead_bytes: u64,
    pub ahead_taken: u64,
    pub busy_503: u64,
    pub simulated_failures: u64,
    /// `409`s to registers and connects.
    pub refused: u64,
    /// `503`s to registers, connects and reports.
    pub unavailable: u64,
    pub rollout: Option<RolloutSeen>,
}

/// The fleet's rollout as the admin API shows it.
async fn fetch_rollout(
    http: &reqwest::Client,
    server: &str,
    token: &str,
) -> Option<serde_json::Value> {
    let response = http
        .get(format!("{server}/admin/rollout"))
        .bearer_auth(token)
        .send()
        .await
        .ok()?;
    if !response.status().is_success() {
        return None;
    }
    response.json().await.ok()
}

/// Runs the simulation to its end; prints progress to stderr.
/// A `Retry-After` in whole seconds, as the server sends it.
pub fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    headers
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
}

/// Streams update-server (hyper's default) lets one HTTP/2 connection have open.
const H2_STREAMS: usize = 200;

pub async fn run(options: Options) -> anyhow::Result<Report> {
    if options.servers.is_empty() {
        anyhow::bail!("name at least one server (--server URL)");
    }
    if options.protocol == Protocol::Opamp
        && options.transport == Transport::WebSocket
        && options.servers.iter().any(|s| s.starts_with("https://"))
    {
        anyhow::bail!(
            "--transport ws speaks ws:// only; use --transport http against an https server"
        );
    }
    if options.until_rollout_end && options.admin_token.is_none() {
        anyhow::bail!("--until-rollout-end watches /admin/rollout: pass --token");
    }
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .connect_timeout(Duration::from_secs(10))
        .pool_max_idle_per_host(1024)
        // As the agent: let go of idle connections before the server's keep-alive does.
        .pool_idle_timeout(Duration::from_secs(45))
        .build()?;
    if options.http2_connections > 0
        && options.long_poll
        && options.agents.div_ceil(options.http2_connections) > H2_STREAMS
    {
        anyhow::bail!(
            "--http2 {}: {} held agents a connection is more than the {H2_STREAMS} streams update-server allows one; use --http2 {} or more",
            options.http2_connections,
            options.agents.div_ceil(options.http2_connections),
            options.agents.div_ceil(H2_STREAMS * 3 / 4)
        );
    }
    // One client each: a client keeps one HTTP/2 connection per server, and puts every
    // request on it while its streams last.
    let http2 = (0..options.http2_connections)
        .map(|_| {
            reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .connect_timeout(Duration::from_secs(10))
                .http2_prior_knowledge()
                .http2_keep_alive_interval(Duration::from_secs(30))
                .build()
        })
        .collect::<Result<Vec<_>, _>>()?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let shared = Arc::new(Shared {
        servers: options
            .servers
            .iter()
            .map(|s| s.trim_end_matches('/').to_owned())
            .collect(),
        options: options.clone(),
        http: http.clone(),
        http2,
        stats: Stats::default(),
        stop: stop_rx,
        measuring: std::sync::atomic::AtomicBool::new(options.warmup.is_zero()),
        versions: Mutex::new(BTreeMap::new()),
        last_installed: Mutex::new(BTreeMap::new()),
        bytes: AtomicU64::new(0),
        delta_bytes: AtomicU64::new(0),
        ahead_bytes: AtomicU64::new(0),
        ahead_taken: AtomicU64::new(0),
        deltas_taken: AtomicU64::new(0),
        kept_taken: AtomicU64::new(0),
        delta_fallbacks: AtomicU64::new(0),
        busy: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        refused: AtomicU64::new(0),
        unavailable: AtomicU64::new(0),
    });
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(options.agents);
    for index in 0..options.agents {
        let group = group_of(index, options.agents, &options.groups);
        let platform = platform_of(index, &options.platforms);
        let delay = options
            .ramp
            .mul_f64(index as f64 / options.agents.max(1) as f64);
        let shared = Arc::clone(&shared);
        tasks.push(match options.protocol {
            Protocol::Native => tokio::spawn(
                SimAgent::new(index, options.version.clone(), group)
                    .on(platform)
                    .run(shared, delay),
            ),
            Protocol::Opamp => tokio::spawn(
                OpampAgent::new(index, options.version.clone(), group)
                    .on(&platform)
                    .run(shared, delay),
            ),
        });
    }

    let mut rollout: Option<RolloutSeen> = None;
    let mut progress = tokio::time::interval(options.progress);
    progress.tick().await;
    let mut watch = tokio::time::interval(Duration::from_secs(1));
    let mut last_progress = Instant::now();
    let mut measured_from = options.warmup.is_zero().then_some(started);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        tokio::select! {
            _ = &mut ctrl_c => break,
            _ = progress.tick() => {
                let window = last_progress.elapsed().as_secs_f64();
                last_progress = Instant::now();
                eprintln!("{}", progress_line(&shared, started.elapsed(), window, rollout.as_ref()));
            }
            _ = watch.tick() => {
                if !shared.measuring() && started.elapsed() >= options.warmup {
                    shared.measuring.store(true, Ordering::Relaxed);
                    measured_from = Some(Instant::now());
                }
                if let Some(token) = &options.admin_token
                    && let Some(status) = fetch_rollout(&http, &shared.servers[0], token).await
                {
                    let version = status["version"].as_str().unwrap_or_default().to_owned();
                    if version != options.version.to_string() {
                        let seen = rollout.get_or_insert_with(|| RolloutSeen {
                            version: version.clone(),
                            ..RolloutSeen::default()
                        });
                        seen.state = status["state"].as_str().unwrap_or_default().to_owned();
                        seen.reason = status["reason"].as_str().map(str::to_owned);
                        seen.wave = status["wave"].as_u64().unwrap_or(0);
                        seen.waves = status["waves"].as_array().cloned().unwrap_or_default();
                        let ended = matches!(seen.state.as_str(), "completed" | "halted");
                        if ended && seen.seconds.is_none() {
                            let now = std::time::SystemTime::now()
                                .duration_since(std::time::UNIX_EPOCH)
                                .map(|d| d.as_secs_f64())
                                .unwrap_or(0.0);
                            let end = status["completed_at"].as_f64().unwrap_or(now);
                            seen.started_at = status["started_at"].as_f64();
                            seen.ended_at = Some(end);
                            seen.seconds = seen.started_at.map(|s| end - s);
                        }
                        if ended && options.until_rollout_end {
                            break;
                        }
                    }
                }
                if options.duration.is_some_and(|d| started.elapsed() >= d) {
                    break;
                }
            }
        }
    }
    let _ = stop_tx.send(true);
    for task in tasks {
        let _ = task.await;
    }
    let seconds = started.elapsed().as_secs_f64();
    let measured = measured_from.map_or(0.0, |m| m.elapsed().as_secs_f64());
    Ok(Report {
        agents: options.agents,
        seconds,
        measured_seconds: measured,
        endpoints: shared.stats.totals(measured),
        errors: shared.stats.errors(),
        versions: shared.versions(),
        last_installed: shared
            .last_installed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone(),
        bundle_bytes: shared.bytes.load(Ordering::Relaxed),
        delta_bytes: shared.delta_bytes.load(Ordering::Relaxed),
        deltas_taken: shared.deltas_taken.load(Ordering::Relaxed),
        kept_taken: shared.kept_taken.load(Ordering::Relaxed),
        delta_fallbacks: shared.delta_fallbacks.load(Ordering::Relaxed),
        ahead_bytes: shared.ahead_bytes.load(Ordering::Relaxed),
        ahead_taken: shared.ahead_taken.load(Ordering::Relaxed),
        busy_503: shared.busy.load(Ordering::Relaxed),
        simulated_failures: shared.failed.load(Ordering::Relaxed),
        refused: shared.refused.load(Ordering::Relaxed),
        unavailable: shared.unavailable.load(Ordering::Relaxed),
        rollout,
    })
}

/// The platform of agent `index`. Unlike groups (the first shares of the fleet), the
/// platforms are spread over the whole fleet by a low-discrepancy sequence, so that every
/// wave holds each in its share, as a real mixed fleet's would.
pub fn platform_of(index: usize, platforms: &[(String, f64)]) -> String {
    const GOLDEN: f64 = 0.618_033_988_749_894_8;
    let at = ((index as f64 + 0.5) * GOLDEN).fract();
    let mut upto = 0.0;
    for (target, share) in platforms {
        upto += share;
        if at < upto {
            return target.clone();
        }
    }
    agent_protocol::layout::PLATFORM.to_owned()
}

/// The group of agent `index`: the first shares of the fleet go to the groups in order.
pub fn group_of(index: usize, agents: usize, groups: &[(String, f64)]) -> Option<String> {
    let mut upto = 0.0;
    for (name, share) in groups {
        upto += share * agents as f64;
        if (index as f64) < upto.ceil() {
            return Some(name.clone());
        }
    }
    None
}

fn progress_line(
    shared: &Shared,
    elapsed: Duration,
    window: f64,
    rollout: Option<&RolloutSeen>,
) -> String {
    let endpoints = shared.stats.window(window);
    let calls: f64 = endpoints.values().map(|s| s.per_second).sum();
    let mut line = format!("{:>6.0}s  calls/s {calls:>7.0}", elapsed.as_secs_f64());
    for (name, s) in &endpoints {
        if s.count > 0 {
            line.push_str(&format!(
                "  {name} p50 {:.1}ms p99 {:.1}ms",
                s.p50_ms, s.p99_ms
            ));
        }
    }
    let errors: u64 = shared.stats.errors().values().sum();
    line.push_str(&format!("  errors {errors}  versions"));
    for (v, n) in shared.versions() {
        line.push_str(&format!(" {v}:{n}"));
    }
    if let Some(r) = rollout {
        line.push_str(&format!(
            "  rollout of {} {} wave {}",
            r.version, r.state, r.wave
        ));
    }
    line
}

/// The summary a person reads.
pub fn render(report: &Report) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} simulated agents for {:.1}s (latencies of the last {:.1}s)",
        report.agents, report.seconds, report.measured_seconds
    );
    let _ = writeln!(
        out,
        "{:<24} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "endpoint", "calls", "calls/s", "p50 ms", "p90 ms", "p99 ms", "max ms"
    );
    for (name, s) in &report.endpoints {
        let _ = writeln!(
            out,
            "{name:<24} {:>9} {:>9.1} {:>9.2} {:>9.2} {:>9.2} {:>9.2}",
            s.count, s.per_second, s.p50_ms, s.p90_ms, s.p99_ms, s.max_ms
        );
    }
    if report.errors.is_empty() {
        let _ = writeln!(out, "errors: none");
    } else {
        let _ = writeln!(out, "errors:");
        for (kind, n) in &report.errors {
            let _ = writeln!(out, "  {kind}: {n}");
        }
    }
    let versions: Vec<String> = report
        .versions
        .iter()
        .map(|(v, n)| format!("{v}: {n}"))
        .collect();
    let _ = writeln!(out, "agents by version: {}", versions.join(", "));
    if !report.last_installed.is_empty() {
        let last: Vec<String> = report
            .last_installed
            .iter()
            .map(|(v, at)| format!("{v}: {at:.1}"))
            .collect();
        let _ = writeln!(
            out,
            "last INSTALLED taken (unix s), by version: {}",
            last.join(", ")
        );
    }
    let _ = writeln!(
        out,
        "bundle bytes fetched: {}, 503s: {}, simulated install failures: {}",
        report.bundle_bytes, report.busy_503, report.simulated_failures
    );
    if report.delta_bytes > 0 || report.deltas_taken > 0 || report.delta_fallbacks > 0 {
        let _ = writeln!(
            out,
            "delta bytes fetched: {} ({} updates by delta, {} delta requests answered 404 so the bundle was fetched); bytes on the wire in all: {}",
            report.delta_bytes,
            report.deltas_taken,
            report.delta_fallbacks,
            report.bundle_bytes + report.delta_bytes
        );
    }
    if report.ahead_taken > 0 || report.ahead_bytes > 0 {
        let _ = writeln!(
            out,
            "fetched ahead of a maintenance window: {} bytes by {} agents",
            report.ahead_bytes, report.ahead_taken
        );
    }
    let _ = writeln!(
        out,
        "409s to register/connect: {}, 503s to register/connect/report: {}",
        report.refused, report.unavailable
    );
    match &report.rollout {
        Some(r) => {
            let took = r
                .seconds
                .map(|s| format!("{s:.1}s from its start"))
                .unwrap_or_else(|| "not ended".into());
            let _ = writeln!(
                out,
                "rollout of {}: {} at wave {} ({took}){}",
                r.version,
                r.state,
                r.wave,
                r.reason
                    .as_ref()
                    .map(|x| format!("; reason: {x}"))
                    .unwrap_or_default()
            );
        }
        None => {
            let _ = writeln!(out, "rollout: none seen");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn platforms_take_their_share_of_every_part_of_the_fleet() {
        let platforms = vec![
            ("aarch64-unknown-linux-gnu".to_owned(), 0.3),
            ("x86_64-unknown-linux-musl".to_owned(), 0.2),
        ];
        let count = |range: std::ops::Range<usize>, target: &str| {
            range
                .filter(|&i| platform_of(i, &platforms) == target)
                .count()
        };
        // The whole fleet, and its first tenth (a first wave): each share within 2 %.
        assert!((295..=305).contains(&count(0..1000, "aarch64-unknown-linux-gnu")));
        assert!((195..=205).contains(&count(0..1000, "x86_64-unknown-linux-musl")));
        assert!((28..=32).contains(&count(0..100, "aarch64-unknown-linux-gnu")));
        assert!((18..=22).contains(&count(0..100, "x86_64-unknown-linux-musl")));
        assert_eq!(
            count(0..1000, agent_protocol::layout::PLATFORM),
            1000 - count(0..1000, "aarch64-unknown-linux-gnu")
                - count(0..1000, "x86_64-unknown-linux-musl")
        );
        assert_eq!(platform_of(7, &[]), agent_protocol::layout::PLATFORM);
    }

    #[test]
    fn the_last_installed_of_a_version_is_the_latest_taken() {
        let mut latest = BTreeMap::new();
        note_latest(&mut latest, "2.1.0+1", 100.0);
        note_latest(&mut latest, "2.1.0+1", 250.5);
        // Taken out of order: an earlier one does not move it back.
        note_latest(&mut latest, "2.1.0+1", 180.0);
        note_latest(&mut latest, "2.2.0+1", 90.0);
        assert_eq!(latest["2.1.0+1"], 250.5);
        assert_eq!(latest["2.2.0+1"], 90.0);
        assert_eq!(latest.len(), 2);
    }

    #[test]
    fn groups_take_the_first_shares_of_the_fleet() {
        let groups = vec![("canary".to_owned(), 0.01), ("beta".to_owned(), 0.1)];
        let count = |g: &str| {
            (0..1000)
                .filter(|&i| group_of(i, 1000, &groups).as_deref() == Some(g))
                .count()
        };
        assert_eq!(count("canary"), 10);
        assert_eq!(count("beta"), 100);
        assert_eq!(group_of(999, 1000, &groups), None);
        assert_eq!(group_of(0, 0, &[]), None);
    }
}
