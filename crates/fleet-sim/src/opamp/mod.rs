//! `--protocol opamp`: each simulated agent is an OpAMP client of its own (opamp-spec
//! v0.18, the types of `agent-opamp`), over plain HTTP (`POST /v1/opamp` at every
//! heartbeat, as opamp-go's HTTP client polls) or over one WebSocket per agent (held
//! open, a heartbeat message every heartbeat, pushes answered at once).
//!
//! It reports status, health, its effective configuration, its remote configuration
//! status and its packages; applies a remote configuration at once (`APPLIED`);
//! on an offer of the `agent` package fetches it with the offered URL and headers,
//! checks it ([`package`]), waits out the simulated install and reports `INSTALLED`
//! (the new version in its description) or, with the chosen odds, `INSTALL_FAILED`.
//! Throttling is obeyed: `503`/`429` with `Retry-After` over HTTP, `UNAVAILABLE` with
//! `RetryInfo` over a WebSocket. What it decides is [`state`]; this file carries bytes.

pub mod package;
pub mod state;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_opamp::codec::CONTENT_TYPE;
use agent_opamp::proto::{AgentToServer, ServerToAgent};
use agent_protocol::AgentVersion;
use futures_util::{SinkExt, StreamExt};
use prost::Message as _;
use rand::Rng;
use reqwest::StatusCode;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use crate::Shared;
use package::Fetched;
use state::{AgentState, Offer, Reaction};

/// How an OpAMP agent reaches the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Http,
    WebSocket,
}

/// Fallback wait when a server throttles without saying how long.
const DEFAULT_RETRY: Duration = Duration::from_secs(30);
/// Longest random pause before reconnecting a WebSocket that was closed.
const RECONNECT_JITTER: Duration = Duration::from_secs(5);

/// Where an install stands, as the install task tells the agent.
enum Progress {
    Fetched(Offer, Fetched),
    Done(Offer, Result<(), String>),
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// `heartbeat × (1 ± jitter)`.
fn jittered(shared: &Shared) -> Duration {
    let jitter = shared.options.jitter;
    let factor = 1.0 + jitter * (2.0 * rand::rng().random::<f64>() - 1.0);
    shared.options.heartbeat.mul_f64(factor.max(0.0))
}

/// At least `told`, spread over half as long again, so a throttled fleet does not come
/// back at one instant.
fn spread(told: Duration) -> Duration {
    told + told.mul_f64(rand::rng().random::<f64>() / 2.0)
}

/// One simulated OpAMP agent.
pub struct OpampAgent {
    index: usize,
    state: AgentState,
    progress_tx: mpsc::UnboundedSender<Progress>,
    progress: mpsc::UnboundedReceiver<Progress>,
}

impl OpampAgent {
    pub fn new(index: usize, version: AgentVersion, group: Option<String>) -> Self {
        let uid = *uuid::Uuid::now_v7().as_bytes();
        let (progress_tx, progress) = mpsc::unbounded_channel();
        Self {
            index,
            state: AgentState::new(uid, index, version, group, now_ns()),
            progress_tx,
            progress,
        }
    }

    /// This agent describes itself as running on `platform` (a Rust target triple): its
    /// `os.type` and `host.arch`, by which the server offers a release's bundle.
    pub fn on(mut self, platform: &str) -> Self {
        self.state = self.state.on(platform);
        self
    }

    /// Runs until the simulation ends.
    pub async fn run(self, shared: Arc<Shared>, start_after: Duration) {
        if shared.sleep(start_after).await {
            return;
        }
        shared.joined(&self.state.version);
        match shared.options.transport {
            Transport::Http => self.run_http(&shared).await,
            Transport::WebSocket => self.run_ws(&shared).await,
        }
    }

    fn base<'a>(&self, shared: &'a Shared) -> &'a str {
        &shared.servers[self.index % shared.servers.len()]
    }

    /// Fetches, checks and installs `offer` beside the agent's talking, telling it how
    /// far it got.
    fn start_install(&self, shared: &Arc<Shared>, offer: Offer) {
        let tx = self.progress_tx.clone();
        let shared = Arc::clone(shared);
        tokio::spawn(async move {
            let fetched = package::fetch(&shared, &offer).await;
            let good = fetched == Fetched::Good;
            let _ = tx.send(Progress::Fetched(offer.clone(), fetched));
            if !good || shared.sleep(shared.options.install_time).await {
                return;
            }
            let outcome = if rand::rng().random::<f64>() < shared.options.fail_rate {
                Err("simulated: the new version did not come up healthy".to_owned())
            } else {
                Ok(())
            };
            let _ = tx.send(Progress::Done(offer, outcome));
        });
    }

    fn on_progress(&mut self, shared: &Shared, progress: Progress) {
        match progress {
            Progress::Fetched(offer, Fetched::Good) => self.state.installing(&offer),
            Progress::Fetched(offer, Fetched::GaveUp) => self.state.fetch_gave_up(&offer),
            Progress::Fetched(offer, Fetched::Bad(why)) => self.state.install_failed(&offer, why),
            Progress::Done(offer, Ok(())) => {
                let from = self.state.installed(&offer, now_ns());
                shared.moved(&from, &offer.version);
            }
            Progress::Done(offer, Err(why)) => {
                shared.count_failed();
                self.state.install_failed(&offer, why);
            }
        }
    }

    /// Acts on an answer; the wait the server asked for, if any.
    fn react(&mut self, shared: &Arc<Shared>, endpoint: &str, r: Reaction) -> Option<Duration> {
        if let Some(why) = r.refused {
            shared.stats.error(format!("{endpoint}: refused: {why}"));
        }
        if let Some(offer) = r.install {
            self.start_install(shared, offer);
        }
        r.retry_after
    }

    // ---- HTTP ----

    /// One `POST /v1/opamp`.
    async fn post(&self, shared: &Shared, msg: &AgentToServer) -> Posted {
        let url = format!("{}{}", self.base(shared), agent_opamp::OPAMP_PATH);
        let mut request = shared
            .http
            .post(&url)
            .header(reqwest::header::CONTENT_TYPE, CONTENT_TYPE)
            .body(msg.encode_to_vec());
        if let Some(token) = &shared.options.enrollment_token {
            request = request.bearer_auth(token);
        }
        let endpoint = "opamp (http)";
        let started = Instant::now();
        let Some(response) = shared.stats.send(endpoint, request).await else {
            return Posted::Failed;
        };
        let status = response.status();
        let retry_after = crate::retry_after(response.headers());
        let body = match response.bytes().await {
            Ok(b) => b,
            Err(_) => {
                shared.stats.error(format!("{endpoint}: body cut off"));
                return Posted::Failed;
            }
        };
        if shared.measuring() {
            shared.stats.record(endpoint, started.elapsed());
        }
        match status {
            StatusCode::OK => match ServerToAgent::decode(body.as_ref()) {
                Ok(answer) => Posted::Answer(Box::new(answer)),
                Err(_) => {
                    shared
                        .stats
                        .error(format!("{endpoint}: answer does not decode"));
                    Posted::Failed
                }
            },
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS => {
                shared.count_unavailable();
                Posted::Throttled(retry_after.unwrap_or(DEFAULT_RETRY))
            }
            other => {
                shared.stats.error(format!("{endpoint}: {other}"));
                Posted::Failed
            }
        }
    }

    async fn run_http(mut self, shared: &Arc<Shared>) {
        loop {
            let msg = self.state.next_message(false);
            let mut wait = jittered(shared);
            let mut throttled = false;
            match self.post(shared, &msg).await {
                Posted::Answer(answer) => {
                    let reaction = self.state.on_answer(&answer);
                    if let Some(told) = self.react(shared, "opamp (http)", reaction) {
                        self.state.unsent(&msg);
                        shared.count_unavailable();
                        (wait, throttled) = (spread(told), true);
                    }
                }
                Posted::Throttled(told) => {
                    self.state.unsent(&msg);
                    (wait, throttled) = (spread(told), true);
                }
                Posted::Failed => {
                    self.state.unsent(&msg);
                    // Not at once again: the same failure would come back.
                    throttled = true;
                }
            }
            let until = tokio::time::Instant::now() + wait;
            // News (an install's progress, a configuration applied) goes out at once,
            // unless the server asked for quiet.
            loop {
                if self.state.has_news() && !throttled {
                    break;
                }
                tokio::select! {
                    () = tokio::time::sleep_until(until) => break,
                    Some(p) = self.progress.recv() => self.on_progress(shared, p),
                    true = shared.sleep(Duration::MAX) => return,
                }
            }
            if shared.sleep(Duration::ZERO).await {
                return;
            }
        }
    }

    // ---- WebSocket ----

    async fn run_ws(mut self, shared: &Arc<Shared>) {
        let url = format!(
            "{}{}",
            self.base(shared)
                .replacen("http://", "ws://", 1)
                .replacen("https://", "wss://", 1),
            agent_opamp::OPAMP_PATH
        );
        loop {
            let wait = match self.ws_session(shared, &url).await {
                Session::Stopped => return,
                Session::Throttled(told) => spread(told),
                Session::Lost => RECONNECT_JITTER
                    .min(shared.options.heartbeat)
                    .mul_f64(rand::rng().random::<f64>()),
                Session::NotConnected => jittered(shared),
            };
            if shared.sleep(wait).await {
                return;
            }
        }
    }

    /// One connection, from its opening to its loss.
    async fn ws_session(&mut self, shared: &Arc<Shared>, url: &str) -> Session {
        let endpoint = "opamp (ws)";
        let Ok(mut request) = url.into_client_request() else {
            shared.stats.error(format!("{endpoint}: bad URL {url}"));
            return Session::NotConnected;
        };
        if let Some(token) = &shared.options.enrollment_token
            && let Ok(value) = format!("Bearer {token}").parse()
        {
            request.headers_mut().insert("Authorization", value);
        }
        let started = Instant::now();
        let connected = tokio::select! {
            c = tokio_tungstenite::connect_async_with_config(request, Some(ws_config()), true) => c,
            true = shared.sleep(Duration::MAX) => return Session::Stopped,
        };
        let socket = match connected {
            Ok((socket, _)) => socket,
            Err(e) => {
                let kind = match e {
                    tokio_tungstenite::tungstenite::Error::Http(r) => r.status().to_string(),
                    tokio_tungstenite::tungstenite::Error::Io(_) => "connect".to_owned(),
                    _ => "handshake".to_owned(),
                };
                shared.stats.error(format!("{endpoint}: {kind}"));
                return Session::NotConnected;
            }
        };
        if shared.measuring() {
            shared.stats.record("opamp (ws connect)", started.elapsed());
        }
        let (mut sink, mut stream) = socket.split();
        let mut sent: VecDeque<Instant> = VecDeque::new();
        // A new connection starts with everything: the server may have lost track.
        let mut outgoing = Some(self.state.next_message(true));
        let mut next_beat = tokio::time::Instant::now() + jittered(shared);
        loop {
            if outgoing.is_none() && self.state.has_news() {
                outgoing = Some(self.state.next_message(false));
            }
            if let Some(msg) = outgoing.take() {
                let mut bytes = Vec::with_capacity(1 + msg.encoded_len());
                bytes.push(0);
                msg.encode_raw(&mut bytes);
                if sink.send(Message::Binary(bytes.into())).await.is_err() {
                    self.state.unsent(&msg);
                    shared.stats.error(format!("{endpoint}: send failed"));
                    return Session::Lost;
                }
                sent.push_back(Instant::now());
                next_beat = tokio::time::Instant::now() + jittered(shared);
            }
            tokio::select! {
                incoming = stream.next() => {
                    let bytes = match incoming {
                        Some(Ok(Message::Binary(b))) => b,
                        Some(Ok(Message::Close(_))) | None => {
                            shared.stats.error(format!("{endpoint}: closed by the server"));
                            return Session::Lost;
                        }
                        Some(Ok(_)) => continue,
                        Some(Err(_)) => {
                            shared.stats.error(format!("{endpoint}: connection lost"));
                            return Session::Lost;
                        }
                    };
                    if let Some(at) = sent.pop_front()
                        && shared.measuring()
                    {
                        shared.stats.record(endpoint, at.elapsed());
                    }
                    let body = match bytes.split_first() {
                        Some((0, rest)) => rest,
                        _ => &bytes[..],
                    };
                    let Ok(answer) = ServerToAgent::decode(body) else {
                        shared.stats.error(format!("{endpoint}: answer does not decode"));
                        return Session::Lost;
                    };
                    let reaction = self.state.on_answer(&answer);
                    if let Some(told) = self.react(shared, endpoint, reaction) {
                        shared.count_unavailable();
                        let _ = sink.send(Message::Close(None)).await;
                        return Session::Throttled(if told.is_zero() { DEFAULT_RETRY } else { told });
                    }
                }
                () = tokio::time::sleep_until(next_beat) => {
                    outgoing = Some(self.state.next_message(false));
                }
                Some(p) = self.progress.recv() => self.on_progress(shared, p),
                true = shared.sleep(Duration::MAX) => {
                    let _ = sink.send(Message::Close(None)).await;
                    return Session::Stopped;
                }
            }
        }
    }
}

/// Small buffers: the library's default is 128 KiB each way per socket, over a GiB for a
/// fleet of 10,000 on one machine; OpAMP status messages are a few hundred bytes.
fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(4 * 1024)
        .write_buffer_size(0)
}

/// How one `POST` went.
enum Posted {
    Answer(Box<ServerToAgent>),
    /// `503`/`429`: wait this long.
    Throttled(Duration),
    /// Not delivered or not understood (counted as an error).
    Failed,
}

/// How one WebSocket connection ended.
enum Session {
    Stopped,
    Throttled(Duration),
    /// Closed or broken after it opened.
    Lost,
    NotConnected,
}
