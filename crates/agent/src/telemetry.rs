//! This agent's own telemetry (docs/commands.md, "Own telemetry"): its metrics (and its
//! log lines) exported with OTLP/HTTP (protobuf) to the destination the server names.
//!
//! The server says the destination in a connect answer (`"telemetry"`) when it differs
//! from the one the agent has, which the agent says in each hello (its hash). The agent
//! keeps it in `data/telemetry.json` (0600: its headers may be credentials), so an agent
//! that starts again exports at once; a destination cleared stops the export and removes
//! the file. Nothing in `conf/` changes.
//!
//! The exporter is the OpenTelemetry crates' (`opentelemetry-otlp`, HTTP protobuf), with
//! the SDK's periodic reader and batch log processor on their own threads; its requests
//! go through this agent's own HTTP client ([`ViaAgent`]), so its proxies and trusted CAs
//! apply. The figures are process-wide counters ([`downloaded`], [`update_failed`], …)
//! that the update path bumps whether or not anything is exported; the instruments read
//! them when the reader collects. An export that fails is said once, and once more when
//! exports work again; it is never fatal and never waits in an update's way.
//!
//! Metrics: `agent.update.duration` (gauge, s; `phase` = download, verify, total: the
//! last update this agent made), `agent.update.failures`, `agent.update.retries`,
//! `agent.workload.restarts` and `agent.download.bytes` (counters), with the resource
//! attributes `service.name` = `agent`, `service.instance.id` = the agent's id and
//! `service.version`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use agent_protocol::layout::AgentHome;
use agent_protocol::wire::TelemetryOffer;
use opentelemetry::KeyValue;
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::logs::SdkLoggerProvider;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};

/// How often metrics are exported, as the OpAMP specification recommends; the
/// standard `OTEL_METRIC_EXPORT_INTERVAL` (milliseconds) in the agent's environment wins.
const INTERVAL: Duration = Duration::from_secs(10);
/// One export's clock: a receiver that does not answer costs no more.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an agent that stops waits for its last export (a hand-over to the updater
/// included): a dead receiver delays the switch by at most this.
const LAST_EXPORT: Duration = Duration::from_secs(2);
/// Largest `data/telemetry.json` read.
const MAX_FILE: u64 = 64 * 1024;

static DOWNLOADED: AtomicU64 = AtomicU64::new(0);
static FAILURES: AtomicU64 = AtomicU64::new(0);
static RETRIES: AtomicU64 = AtomicU64::new(0);
/// Seconds of the last update's download, verification and whole round.
static LAST_UPDATE: Mutex<Option<[f64; 3]>> = Mutex::new(None);

/// `bytes` of a bundle or delta arrived.
pub fn downloaded(bytes: u64) {
    DOWNLOADED.fetch_add(bytes, Ordering::Relaxed);
}

/// The last update round ended without the switch: the next one is a retry.
static LAST_FAILED: AtomicBool = AtomicBool::new(false);

/// An update round ended without the switch.
pub fn update_failed() {
    FAILURES.fetch_add(1, Ordering::Relaxed);
    LAST_FAILED.store(true, Ordering::Relaxed);
}

/// An update round begins: a retry if the last one failed.
pub fn round_began() {
    if LAST_FAILED.swap(false, Ordering::Relaxed) {
        RETRIES.fetch_add(1, Ordering::Relaxed);
    }
}

/// An update reached the hand-over: how long its download, its verification and the
/// whole round took.
pub fn update_timed(download: Duration, verify: Duration, total: Duration) {
    let times = [
        download.as_secs_f64(),
        verify.as_secs_f64(),
        total.as_secs_f64(),
    ];
    *LAST_UPDATE.lock().unwrap_or_else(|p| p.into_inner()) = Some(times);
}

/// The log bridge while logs are exported: the agent's tracing layer ([`layer`]) hands
/// each event to it.
type Bridge = opentelemetry_appender_tracing::layer::OpenTelemetryTracingBridge<
    SdkLoggerProvider,
    opentelemetry_sdk::logs::SdkLogger,
>;
static LOG_BRIDGE: RwLock<Option<Bridge>> = RwLock::new(None);

/// The tracing layer that exports this agent's log lines while a destination names a
/// logs URL (and does nothing otherwise).
pub fn layer() -> LogLayer {
    LogLayer
}

pub struct LogLayer;

impl<S> tracing_subscriber::Layer<S> for LogLayer
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_event(&self, event: &tracing::Event<'_>, ctx: tracing_subscriber::layer::Context<'_, S>) {
        // try_read: an event said while the bridge is being replaced is not exported,
        // rather than waiting for it.
        if let Ok(bridge) = LOG_BRIDGE.try_read()
            && let Some(bridge) = bridge.as_ref()
        {
            tracing_subscriber::Layer::<S>::on_event(bridge, event, ctx);
        }
    }
}

/// What this agent is, for the resource every export carries, its HTTP client, and the
/// destination it was told.
pub struct Telemetry {
    home: AgentHome,
    http: reqwest::Client,
    resource: Resource,
    restarts: Arc<dyn Fn() -> u64 + Send + Sync>,
    /// The hash of the destination told (empty: none), exported to or not: one that
    /// cannot be exported to is not asked for again and again.
    told: String,
}

/// The export under way, process-wide so that the agent's end ([`finish`]) sends the
/// last figures whichever way it ends.
static RUNNING: Mutex<Option<Running>> = Mutex::new(None);

/// An export under way to one destination.
struct Running {
    meters: SdkMeterProvider,
    logs: Option<SdkLoggerProvider>,
}

impl Telemetry {
    /// The agent `id` of `version`; `restarts` reads its workload's restarts. Exports at
    /// once to the destination `data/telemetry.json` keeps, if any.
    pub fn start(
        home: &AgentHome,
        http: reqwest::Client,
        id: &str,
        version: &str,
        restarts: Arc<dyn Fn() -> u64 + Send + Sync>,
    ) -> Self {
        let resource = Resource::builder_empty()
            .with_attributes([
                KeyValue::new("service.name", "agent"),
                KeyValue::new("service.instance.id", id.to_owned()),
                KeyValue::new("service.version", version.to_owned()),
            ])
            .build();
        let mut telemetry = Self {
            home: home.clone(),
            http,
            resource,
            restarts,
            told: String::new(),
        };
        if let Some(kept) = read(home) {
            telemetry.told.clone_from(&kept.hash);
            telemetry.export_to(&kept);
        }
        telemetry
    }

    /// The hash of the destination this agent was told (empty: none), as its hello
    /// says it.
    pub fn hash(&self) -> String {
        self.told.clone()
    }

    /// The server named `offer` (off: none): kept, and exported to from now on.
    pub fn apply(&mut self, offer: TelemetryOffer) {
        if offer.hash == self.told {
            return;
        }
        self.told.clone_from(&offer.hash);
        stop(false);
        let path = self.home.telemetry_file();
        if offer.is_off() {
            tracing::info!(
                "the server cleared this agent's telemetry destination; exporting nothing"
            );
            if let Err(e) = std::fs::remove_file(&path)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!("cannot remove {}: {e}", path.display());
            }
            return;
        }
        let text = serde_json::to_vec_pretty(&offer).unwrap_or_default();
        let _ = std::fs::create_dir_all(self.home.data());
        if let Err(e) = agent_extract::atomic::write_with_mode(&path, &text, Some(0o600)) {
            // Exported all the same; an agent that starts again asks the server anew.
            tracing::warn!(
                "cannot keep the telemetry destination in {}: {e}",
                path.display()
            );
        }
        self.export_to(&offer);
    }

    fn export_to(&mut self, offer: &TelemetryOffer) {
        match self.providers(offer) {
            Ok(running) => {
                tracing::info!(
                    "exporting this agent's own metrics to {}{}",
                    offer.metrics,
                    offer
                        .logs
                        .as_deref()
                        .map(|l| format!(" and its log lines to {l}"))
                        .unwrap_or_default()
                );
                *RUNNING.lock().unwrap_or_else(|p| p.into_inner()) = Some(running);
            }
            Err(e) => tracing::warn!(
                "cannot export this agent's telemetry to {}: {e}; an operator can set another destination (update-server telemetry set)",
                offer.metrics
            ),
        }
    }

    fn providers(&self, offer: &TelemetryOffer) -> Result<Running, String> {
        let headers: HashMap<String, String> = offer.headers.clone().into_iter().collect();
        let client = ViaAgent::new(self.http.clone()).map_err(|e| e.to_string())?;
        let exporter = opentelemetry_otlp::MetricExporter::builder()
            .with_http()
            .with_http_client(client.clone())
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(offer.metrics.clone())
            .with_headers(headers.clone())
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| e.to_string())?;
        let mut reader = PeriodicReader::builder(exporter);
        if std::env::var_os("OTEL_METRIC_EXPORT_INTERVAL").is_none() {
            reader = reader.with_interval(INTERVAL);
        }
        let meters = SdkMeterProvider::builder()
            .with_resource(self.resource.clone())
            .with_reader(reader.build())
            .build();
        instruments(&meters, Arc::clone(&self.restarts));
        let logs = match offer.logs.as_deref().filter(|l| !l.is_empty()) {
            None => None,
            Some(url) => {
                let exporter = opentelemetry_otlp::LogExporter::builder()
                    .with_http()
                    .with_http_client(client)
                    .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                    .with_endpoint(url.to_owned())
                    .with_headers(headers)
                    .with_timeout(EXPORT_TIMEOUT)
                    .build()
                    .map_err(|e| e.to_string())?;
                let provider = SdkLoggerProvider::builder()
                    .with_resource(self.resource.clone())
                    .with_batch_exporter(exporter)
                    .build();
                *LOG_BRIDGE.write().unwrap_or_else(|p| p.into_inner()) =
                    Some(Bridge::new(&provider));
                Some(provider)
            }
        };
        Ok(Running { meters, logs })
    }
}

/// Stops exporting: what was collected goes once more, within [`LAST_EXPORT`], on a
/// thread of its own (the SDK's shutdown blocks, and its last export needs the runtime
/// this is called from). The thread, if `wait`.
fn stop(wait: bool) -> Option<std::thread::JoinHandle<()>> {
    let running = RUNNING.lock().unwrap_or_else(|p| p.into_inner()).take()?;
    *LOG_BRIDGE.write().unwrap_or_else(|p| p.into_inner()) = None;
    let thread = std::thread::spawn(move || {
        let _ = running.meters.shutdown_with_timeout(LAST_EXPORT);
        if let Some(logs) = running.logs {
            let _ = logs.shutdown_with_timeout(LAST_EXPORT);
        }
    });
    wait.then_some(thread)
}

/// The agent ends: its last figures are sent (the duration of the update it hands over,
/// say), waited for at most twice [`LAST_EXPORT`].
pub async fn finish() {
    let Some(thread) = stop(true) else {
        return;
    };
    let joined = tokio::task::spawn_blocking(move || thread.join());
    let _ = tokio::time::timeout(LAST_EXPORT * 2, joined).await;
}

/// The instruments, read from the process's counters at each collection.
fn instruments(meters: &SdkMeterProvider, restarts: Arc<dyn Fn() -> u64 + Send + Sync>) {
    let meter = meters.meter("agent");
    let counter = |name: &'static str,
                   unit: &'static str,
                   what: &'static str,
                   read: Box<dyn Fn() -> u64 + Send + Sync>| {
        meter
            .u64_observable_counter(name)
            .with_unit(unit)
            .with_description(what)
            .with_callback(move |o| o.observe(read(), &[]))
            .build();
    };
    counter(
        "agent.download.bytes",
        "By",
        "Bytes of bundles and deltas this agent downloaded",
        Box::new(|| DOWNLOADED.load(Ordering::Relaxed)),
    );
    counter(
        "agent.update.failures",
        "{round}",
        "Update rounds that ended without the switch",
        Box::new(|| FAILURES.load(Ordering::Relaxed)),
    );
    counter(
        "agent.update.retries",
        "{round}",
        "Update rounds begun again after one that failed",
        Box::new(|| RETRIES.load(Ordering::Relaxed)),
    );
    counter(
        "agent.workload.restarts",
        "{restart}",
        "Restarts of the workload since the agent started",
        Box::new(move || restarts()),
    );
    meter
        .f64_observable_gauge("agent.update.duration")
        .with_unit("s")
        .with_description("How long the last update's download, verification and whole round took")
        .with_callback(|o| {
            let last = *LAST_UPDATE.lock().unwrap_or_else(|p| p.into_inner());
            if let Some([download, verify, total]) = last {
                o.observe(download, &[KeyValue::new("phase", "download")]);
                o.observe(verify, &[KeyValue::new("phase", "verify")]);
                o.observe(total, &[KeyValue::new("phase", "total")]);
            }
        })
        .build();
}

/// The destination `data/telemetry.json` keeps, if it reads as one.
fn read(home: &AgentHome) -> Option<TelemetryOffer> {
    let text = agent_extract::atomic::read_text(&home.telemetry_file(), MAX_FILE).ok()?;
    let mut offer: TelemetryOffer = serde_json::from_str(&text).ok()?;
    // The hash is what the server compares: recomputed, so an edited file is told anew.
    offer.hash = offer.hash_of();
    (!offer.is_off()).then_some(offer)
}

/// The exporter's requests, sent by this agent's HTTP client on its runtime: the SDK's
/// threads have no runtime of their own, and the agent's client carries its proxies and
/// trusted CAs. Says a failure once, and once more when exports work again.
#[derive(Debug, Clone)]
struct ViaAgent {
    http: reqwest::Client,
    runtime: tokio::runtime::Handle,
    failing: Arc<AtomicBool>,
}

impl ViaAgent {
    fn new(http: reqwest::Client) -> Result<Self, tokio::runtime::TryCurrentError> {
        Ok(Self {
            http,
            runtime: tokio::runtime::Handle::try_current()?,
            failing: Arc::new(AtomicBool::new(false)),
        })
    }

    fn said(&self, url: &str, outcome: Result<u16, String>) {
        match outcome {
            Ok(status) if (200..300).contains(&status) => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!("exporting telemetry to {url} works again");
                }
            }
            Ok(status) => self.failed(url, &format!("it answered {status}")),
            Err(e) => self.failed(url, &e),
        }
    }

    fn failed(&self, url: &str, why: &str) {
        if !self.failing.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "cannot export telemetry to {url}: {why}; trying again at each interval (said once)"
            );
        }
    }
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for ViaAgent {
    async fn send_bytes(
        &self,
        request: opentelemetry_http::Request<opentelemetry_http::Bytes>,
    ) -> Result<
        opentelemetry_http::Response<opentelemetry_http::Bytes>,
        opentelemetry_http::HttpError,
    > {
        let url = request.uri().to_string();
        let request = reqwest::Request::try_from(request)?;
        let http = self.http.clone();
        let sent = self.runtime.spawn(async move {
            let resp = tokio::time::timeout(EXPORT_TIMEOUT, http.execute(request))
                .await
                .map_err(|_| format!("no answer within {}s", EXPORT_TIMEOUT.as_secs()))?
                .map_err(|e| crate::contact::client::error_chain(&e))?;
            let status = resp.status();
            let mut answer = opentelemetry_http::Response::builder().status(status.as_u16());
            for (k, v) in resp.headers() {
                answer = answer.header(k, v);
            }
            // The receiver's answer is small (a partial-success note at most).
            let body = tokio::time::timeout(EXPORT_TIMEOUT, resp.bytes())
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or_default();
            answer.body(body).map_err(|e| e.to_string())
        });
        let outcome = sent
            .await
            .map_err(|e| format!("the export was dropped: {e}"))
            .and_then(|r| r);
        self.said(
            &url,
            outcome
                .as_ref()
                .map(|r| r.status().as_u16())
                .map_err(Clone::clone),
        );
        Ok(outcome?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_destination_reads_back_with_its_hash_and_an_edited_one_is_told_anew() {
        let dir = tempfile::tempdir().unwrap();
        let home = AgentHome::new(dir.path());
        assert!(read(&home).is_none());
        std::fs::create_dir_all(home.data()).unwrap();
        let offer = TelemetryOffer::new(
            "http://c:4318/v1/metrics".into(),
            None,
            [("x-tenant".to_owned(), "t".to_owned())].into(),
        );
        std::fs::write(home.telemetry_file(), serde_json::to_vec(&offer).unwrap()).unwrap();
        assert_eq!(read(&home), Some(offer.clone()));
        let mut edited = offer.clone();
        edited.metrics = "http://d:4318/v1/metrics".into();
        std::fs::write(home.telemetry_file(), serde_json::to_vec(&edited).unwrap()).unwrap();
        let back = read(&home).unwrap();
        assert_ne!(back.hash, offer.hash, "its hash follows what it says");
        std::fs::write(home.telemetry_file(), b"{\"metrics\": \"\"}").unwrap();
        assert!(read(&home).is_none(), "off is none");
        std::fs::write(home.telemetry_file(), b"garbage").unwrap();
        assert!(read(&home).is_none());
    }

    #[test]
    fn the_counters_only_grow() {
        let before = DOWNLOADED.load(Ordering::Relaxed);
        downloaded(10);
        assert!(DOWNLOADED.load(Ordering::Relaxed) >= before + 10);
        update_timed(
            Duration::from_millis(1500),
            Duration::from_millis(20),
            Duration::from_secs(3),
        );
        assert_eq!(*LAST_UPDATE.lock().unwrap(), Some([1.5, 0.02, 3.0]));
    }
}
