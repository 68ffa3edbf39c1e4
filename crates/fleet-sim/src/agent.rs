//! One simulated agent: it registers, heartbeats with jitter, obeys `409` and
//! `Retry-After`, fetches the bundle (whole, or `HEAD` and its first bytes), reports
//! `INSTALLING`, waits out a simulated install, then reports `INSTALLED` (and runs the
//! new version) or, with the chosen probability, `INSTALL_FAILED` (and never retries that
//! bundle, as a real agent would not). It runs the configuration set the server sends
//! it: it says `APPLIED` at once and sends the set's hash from then on. With `--deltas` it
//! asks for a delta from the bundle it runs before the bundle itself, as real agents do.
//! Told of a release behind its maintenance window (a `200` carrying `"window"`), it
//! fetches it ahead as a real agent with `update.download-ahead` does, says so in its next
//! held connects (`ahead=`), and installs without fetching again when the window opens.
//! Its reports go through an outbox, as a real agent's do: one no server takes (a `503`
//! while the fleet database is busy) is sent again, in order, until one does.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_protocol::AgentVersion;
use agent_protocol::busy::{self, AfterBusy};
use agent_protocol::wire::{
    self, AgentHello, ConfigOutcome, ConfigPayload, ConfigStatus, ConnectBody, NotSupported,
    Report, UpdateStatus, WindowOffer,
};
use futures_util::StreamExt;
use rand::Rng;
use reqwest::{Method, StatusCode};

use crate::{DownloadMode, Shared};

/// How many times a download is tried (through `503`s) before waiting for the next
/// heartbeat.
const DOWNLOAD_TRIES: u32 = 20;
/// Longest random pause before reconnecting to a server that let a held connect go
/// early with nothing new, as real agents do.
const RECONNECT_JITTER: Duration = Duration::from_secs(5);
/// The first bytes fetched in `head` mode.
const FIRST_BYTES: u64 = 64 * 1024;
/// After a report no server took, the next try is this much later (a real agent's
/// outbox waits as long).
const UNSENT_RETRY: Duration = Duration::from_secs(5);

pub struct SimAgent {
    pub index: usize,
    pub id: String,
    pub group: Option<String>,
    pub version: AgentVersion,
    token: Option<String>,
    bad: HashSet<String>,
    server: usize,
    registered: bool,
    /// The configuration set it runs (empty: none).
    config_hash: String,
    /// The last directive: accepted, or refused with which bundle.
    last: Option<Option<String>>,
    /// The platform it says it runs on (a Rust target triple).
    pub platform: String,
    /// The sha256 of the bundle it runs, when known: what it asks a delta from.
    running: Option<String>,
    /// The sha256 of the bundle it ran before (`versions/<v>/bundle` of a real agent): a
    /// way back to it takes no download.
    kept: Option<String>,
    /// The release behind a maintenance window it last acted on (fetched ahead, or
    /// failed to): what its held connects say with `ahead=`.
    ahead_acted: Option<String>,
    /// The release it holds fetched ahead: installed without fetching it again.
    ahead_ready: Option<String>,
    /// A fetch ahead of a window is under way: its bytes are counted as such too.
    fetching_ahead: bool,
    /// Busy answers in a row from its current server.
    busy_in_a_row: u32,
    /// Reports no server took yet, oldest first, with where the bundle came from: a real
    /// agent's `data/outbox/`, sent in order until one is refused for a while.
    outbox: VecDeque<(Report, Option<&'static str>)>,
}

/// What a register or connect came back with.
struct Hello {
    directive: Option<Result<(), NotSupported>>,
    /// The server held the connect (it honours long polls).
    held: bool,
    /// The directive differs from the one before, or a configuration set came.
    changed: bool,
    /// Accepted until its maintenance window opens: the release it installs then.
    window: Option<WindowOffer>,
    /// The server was busy and asked to be asked again after this (`Retry-After`).
    busy: Option<Duration>,
}

/// One request to make.
struct Call<'a> {
    endpoint: &'static str,
    method: Method,
    path: &'a str,
    json: Option<serde_json::Value>,
    headers: &'a [(&'a str, String)],
    /// Count the body's bytes instead of keeping it (a bundle or a delta).
    drain: Option<Drain>,
}

/// Which byte count a drained body adds to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Drain {
    Bundle,
    Delta,
}

impl<'a> Call<'a> {
    fn new(endpoint: &'static str, method: Method, path: &'a str) -> Self {
        Self {
            endpoint,
            method,
            path,
            json: None,
            headers: &[],
            drain: None,
        }
    }

    fn json(self, json: Option<serde_json::Value>) -> Self {
        Self { json, ..self }
    }

    fn headers(self, headers: &'a [(&'a str, String)]) -> Self {
        Self { headers, ..self }
    }

    fn drain(self) -> Self {
        Self {
            drain: Some(Drain::Bundle),
            ..self
        }
    }

    fn drain_delta(self) -> Self {
        Self {
            drain: Some(Drain::Delta),
            ..self
        }
    }
}

/// What a call came back with.
struct Answer {
    status: StatusCode,
    headers: reqwest::header::HeaderMap,
    body: Vec<u8>,
}

impl SimAgent {
    pub fn new(index: usize, version: AgentVersion, group: Option<String>) -> Self {
        Self {
            index,
            id: uuid::Uuid::now_v7().to_string(),
            group,
            version,
            // As a real agent: its own secret from the first register on, so an answer
            // lost under load does not lock it out.
            token: agent_protocol::credentials::new_agent_token().ok(),
            bad: HashSet::new(),
            server: index,
            registered: false,
            last: None,
            config_hash: String::new(),
            platform: agent_protocol::layout::PLATFORM.to_owned(),
            running: None,
            kept: None,
            ahead_acted: None,
            ahead_ready: None,
            fetching_ahead: false,
            busy_in_a_row: 0,
            outbox: VecDeque::new(),
        }
    }

    /// This agent says it runs on `platform` and asks for that platform's bundle (a
    /// server that serves one bundle ignores the query).
    pub fn on(mut self, platform: String) -> Self {
        self.platform = platform;
        self
    }

    fn base<'a>(&self, shared: &'a Shared) -> &'a str {
        &shared.servers[self.server % shared.servers.len()]
    }

    fn hello_body(&self) -> AgentHello {
        AgentHello {
            id: self.id.clone(),
            name: format!("sim-{:05}", self.index),
            platform: self.platform.clone(),
            group: self.group.clone(),
            health: None,
            labels: None,
            capabilities: None,
            endpoint: None,
        }
    }

    /// One request, timed and counted under its endpoint; an error is counted by kind.
    async fn call(&self, shared: &Shared, call: Call<'_>) -> Option<Answer> {
        let Call {
            endpoint,
            method,
            path,
            json,
            headers,
            drain,
        } = call;
        // A whole URL is a download source: no identity goes there.
        let elsewhere = path.starts_with("http://") || path.starts_with("https://");
        let url = if elsewhere {
            path.to_owned()
        } else {
            format!("{}{path}", self.base(shared))
        };
        // A download source is another host: plain HTTP/1.1, as a real agent fetches it.
        let client = if elsewhere {
            &shared.http
        } else {
            shared.client(self.index)
        };
        let mut request = client.request(method, &url);
        if !elsewhere {
            request = request.header(wire::AGENT_VERSION_HEADER, self.version.to_string());
        }
        if let Some(token) = self.token.as_ref().filter(|_| !elsewhere) {
            request = request.bearer_auth(token);
        }
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        if let Some(json) = json {
            request = request.json(&json);
        }
        let started = Instant::now();
        let response = shared.stats.send(endpoint, request).await?;
        let status = response.status();
        let headers = response.headers().clone();
        let mut body = Vec::new();
        // Only what was asked for is counted as received: a 503's or 404's few words are
        // not bundle or delta bytes.
        let drain = drain.filter(|_| status.is_success());
        let mut stream = response.bytes_stream();
        while let Some(chunk) = stream.next().await {
            match chunk {
                // A whole bundle (or a delta) is counted, not kept.
                Ok(c) if drain.is_some() => {
                    let n = c.len() as u64;
                    match drain {
                        Some(Drain::Delta) => shared.add_delta_bytes(n),
                        _ => shared.add_bytes(n),
                    }
                    if self.fetching_ahead {
                        shared.add_ahead_bytes(n);
                    }
                }
                Ok(c) => body.extend_from_slice(&c),
                Err(_) => {
                    shared.stats.error(format!("{endpoint}: body cut off"));
                    return None;
                }
            }
        }
        if shared.measuring() {
            shared.stats.record(endpoint, started.elapsed());
        }
        // 409 (the directive), 403 (downloads off) and 503 (busy) are answers, not errors.
        // A delta's 404 (none worth sending) sends the agent to the bundle: an answer too.
        let expected = matches!(
            status,
            StatusCode::CONFLICT | StatusCode::FORBIDDEN | StatusCode::SERVICE_UNAVAILABLE
        ) || (status == StatusCode::NOT_FOUND && endpoint == "delta");
        if (status.is_server_error() || status.is_client_error()) && !expected {
            shared.stats.error(format!("{endpoint}: {status}"));
        }
        if matches!(endpoint, "register" | "connect" | "report") {
            match status {
                StatusCode::CONFLICT => shared.count_refused(),
                StatusCode::SERVICE_UNAVAILABLE => shared.count_unavailable(),
                _ => {}
            }
        }
        Some(Answer {
            status,
            headers,
            body,
        })
    }

    /// Keeps a credential the server hands out (on register, or on any hello).
    fn keep_token(&mut self, body: &[u8]) {
        if let Ok(json) = serde_json::from_slice::<serde_json::Value>(body)
            && let Some(token) = json.get("token").and_then(|t| t.as_str())
        {
            self.token = Some(token.to_owned());
        }
    }

    /// Register (first, or after a failover) or connect; the directive if answered.
    async fn hello(&mut self, shared: &Shared) -> Option<Result<(), NotSupported>> {
        self.hello_held(shared).await.directive
    }

    /// Like [`SimAgent::hello`], held by the server when `--long-poll` asks for it: a
    /// connect (never a register) waits until something changes for this agent. A
    /// known-bad bundle is named, so a `409` for it again is no news.
    async fn hello_held(&mut self, shared: &Shared) -> Hello {
        let long_poll = self.registered && shared.options.long_poll;
        let (endpoint, path) = if long_poll {
            let mut path = format!(
                "{}?{}={}",
                wire::CONNECT_PATH,
                wire::WAIT_QUERY,
                shared.options.heartbeat.as_secs().max(1)
            );
            if let Some(Some(sha)) = &self.last
                && self.bad.contains(sha)
            {
                path.push_str(&format!("&{}={sha}", wire::KNOWN_QUERY));
            }
            // As a real agent with `update.download-ahead` (its default): a release
            // behind its window is news until it has fetched that one.
            if shared.options.download_ahead {
                let have = self.ahead_acted.as_deref().unwrap_or("1");
                path.push_str(&format!("&{}={have}", wire::AHEAD_QUERY));
            }
            ("connect (held)", path)
        } else if self.registered {
            ("connect", wire::CONNECT_PATH.to_owned())
        } else {
            ("register", wire::REGISTER_PATH.to_owned())
        };
        let body = serde_json::to_value(ConnectBody {
            hello: self.hello_body(),
            config_hash: self.config_hash.clone(),
            // Simulated agents export no telemetry of their own: told none.
            telemetry_hash: None,
        })
        .ok();
        let answer = self
            .call(shared, Call::new(endpoint, Method::POST, &path).json(body))
            .await;
        let mut hello = Hello {
            directive: None,
            held: false,
            changed: false,
            window: None,
            busy: None,
        };
        let Some(answer) = answer else {
            self.fail_over(shared);
            return hello;
        };
        hello.held = long_poll && answer.headers.contains_key(wire::LONG_POLL_HEADER);
        self.keep_token(&answer.body);
        hello.directive = match answer.status {
            s if s.is_success() => {
                self.registered = true;
                hello.changed = self.apply_config(shared, &answer.body).await;
                hello.window = serde_json::from_slice::<serde_json::Value>(&answer.body)
                    .ok()
                    .and_then(|mut json| json.get_mut("window").map(serde_json::Value::take))
                    .and_then(|w| serde_json::from_value::<WindowOffer>(w).ok());
                hello.changed |= hello
                    .window
                    .as_ref()
                    .is_some_and(|w| self.ahead_acted.as_deref() != Some(w.sha256.as_str()));
                Some(Ok(()))
            }
            StatusCode::CONFLICT => {
                self.registered = true;
                serde_json::from_slice::<NotSupported>(&answer.body)
                    .ok()
                    .map(Err)
            }
            // As a real agent: a busy server is asked again after its wait, and left
            // only when it is busy three times in a row (`agent_protocol::busy`).
            StatusCode::SERVICE_UNAVAILABLE if crate::retry_after(&answer.headers).is_some() => {
                self.busy_in_a_row += 1;
                if busy::after_busy(self.busy_in_a_row, shared.servers.len()) == AfterBusy::AskAgain
                {
                    hello.busy = crate::retry_after(&answer.headers);
                } else {
                    self.fail_over(shared);
                }
                None
            }
            s if s.is_server_error() => {
                self.fail_over(shared);
                None
            }
            _ => None,
        };
        if hello.busy.is_none() {
            self.busy_in_a_row = 0;
        }
        if let Some(directive) = &hello.directive {
            let key = directive
                .as_ref()
                .err()
                .map(|ns| ns.sha256.clone().unwrap_or_else(|| ns.expected.clone()));
            hello.changed |= self.last.as_ref() != Some(&key);
            self.last = Some(key);
        }
        hello
    }

    /// Runs the set a `200` carries, if any: `APPLIED` at once. True if there was one.
    async fn apply_config(&mut self, shared: &Shared, body: &[u8]) -> bool {
        let Some(set) = serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|json| json.get("config").cloned())
            .and_then(|config| serde_json::from_value::<ConfigPayload>(config).ok())
        else {
            return false;
        };
        let status = ConfigStatus {
            id: self.id.clone(),
            hash: set.hash.clone(),
            status: ConfigOutcome::Applied,
            error: None,
        };
        let answer = self
            .call(
                shared,
                Call::new("config-status", Method::POST, wire::CONFIG_STATUS_PATH)
                    .json(serde_json::to_value(status).ok()),
            )
            .await;
        if answer.is_some_and(|a| a.status.is_success()) {
            self.config_hash = set.hash;
        }
        true
    }

    fn fail_over(&mut self, shared: &Shared) {
        if shared.servers.len() > 1 {
            self.server += 1;
            self.registered = false;
        }
    }

    async fn report(
        &mut self,
        shared: &Shared,
        to: &AgentVersion,
        status: UpdateStatus,
        error: Option<String>,
    ) {
        self.report_from(shared, to, status, error, None).await;
    }

    /// [`SimAgent::report`] saying where the bundle's bytes came from: into the outbox,
    /// then one try at sending it (and whatever waits before it).
    async fn report_from(
        &mut self,
        shared: &Shared,
        to: &AgentVersion,
        status: UpdateStatus,
        error: Option<String>,
        bundle_from: Option<&'static str>,
    ) {
        let report = Report {
            id: self.id.clone(),
            from: self.version.to_string(),
            to: to.to_string(),
            status,
            error,
        };
        self.outbox.push_back((report, bundle_from));
        self.flush_outbox(shared).await;
    }

    /// Sends the outbox in order, as a real agent's does: a report leaves it once a
    /// server takes it (or refuses it as malformed, which it always would); the first
    /// that is not taken stays, with those after it. True when nothing is left.
    async fn flush_outbox(&mut self, shared: &Shared) -> bool {
        while let Some((report, from)) = self.outbox.front() {
            let body = serde_json::to_value(report).ok();
            let from: Vec<(&str, String)> = from
                .map(|f| (wire::BUNDLE_FROM_HEADER, f.to_owned()))
                .into_iter()
                .collect();
            let answer = self
                .call(
                    shared,
                    Call::new("report", Method::POST, wire::REPORT_PATH)
                        .json(body)
                        .headers(&from),
                )
                .await;
            let taken = answer.is_some_and(|a| {
                a.status.is_success()
                    || matches!(
                        a.status,
                        StatusCode::BAD_REQUEST | StatusCode::UNPROCESSABLE_ENTITY
                    )
            });
            if !taken {
                return false;
            }
            self.outbox.pop_front();
        }
        true
    }

    /// Sends the outbox until a server takes all of it (or the simulation ends), a try
    /// every [`UNSENT_RETRY`]: an outcome the rollout waits for is never given up.
    async fn deliver_outbox(&mut self, shared: &Shared) {
        while !self.flush_outbox(shared).await {
            if shared.sleep(UNSENT_RETRY).await {
                return;
            }
        }
    }

    /// With `--download-source`: the bundle from the download source the server names,
    /// as a real agent takes it. `None`: the server names none; `Some(FROM_SOURCE)`: taken;
    /// `Some(FROM_SERVER)`: the source failed, the server is next.
    async fn try_source(&self, shared: &Shared, release: &AgentVersion) -> Option<&'static str> {
        if !shared.options.download_source {
            return None;
        }
        let path = release_path(wire::VERSION_PATH, &self.platform, release);
        let answer = self
            .call(shared, Call::new("version", Method::GET, &path))
            .await?;
        let source = std::str::from_utf8(&answer.body)
            .ok()
            .and_then(|text| agent_protocol::properties::Properties::parse(text).ok())
            .and_then(|props| wire::VersionInfo::from_properties(&props).ok())
            .and_then(|info| info.source_url())?;
        let answer = match shared.options.download {
            DownloadMode::Full => {
                self.call(shared, Call::new("source", Method::GET, &source).drain())
                    .await
            }
            DownloadMode::Head => {
                let range = [("Range", format!("bytes=0-{}", FIRST_BYTES - 1))];
                self.call(
                    shared,
                    Call::new("source (first bytes)", Method::GET, &source)
                        .headers(&range)
                        .drain(),
                )
                .await
            }
        };
        Some(match answer {
            Some(a) if a.status.is_success() => wire::FROM_SOURCE,
            _ => wire::FROM_SERVER,
        })
    }

    /// What a real agent that keeps its bundle does first (`--deltas`): learns the sha256
    /// of the bundle it runs, from `/agentupdate/version` while it is the one served.
    async fn learn_running(&mut self, shared: &Shared) {
        let path = wire::for_platform(wire::VERSION_PATH, &self.platform);
        let Some(answer) = self
            .call(shared, Call::new("version", Method::GET, &path))
            .await
        else {
            return;
        };
        let info = std::str::from_utf8(&answer.body)
            .ok()
            .and_then(|text| agent_protocol::properties::Properties::parse(text).ok())
            .and_then(|props| wire::VersionInfo::from_properties(&props).ok());
        match info {
            // Only the bundle of its own version is the one it runs.
            Some(info) if answer.status.is_success() && info.agent == self.version => {
                self.running = Some(info.sha256);
            }
            _ => shared
                .stats
                .error("version: the served bundle is not the one the agents start on (no deltas for them)".into()),
        }
    }

    /// The delta from the bundle it runs to `to`, when it knows that bundle and the server
    /// has one: `Some(true)` taken, `Some(false)` refused for good (downloads off), `None`
    /// the bundle is to be downloaded instead.
    async fn fetch_delta(&self, shared: &Shared, release: &AgentVersion) -> Option<bool> {
        let from = self.running.as_ref()?;
        let path = delta_to(from, &self.platform, release);
        for _ in 0..DOWNLOAD_TRIES {
            let answer = self
                .call(shared, Call::new("delta", Method::GET, &path).drain_delta())
                .await?;
            match answer.status {
                s if s.is_success() => {
                    shared.count_delta_taken();
                    return Some(true);
                }
                // Being made, or the download limit: as the server says.
                StatusCode::SERVICE_UNAVAILABLE => {
                    if shared.wait_out_busy(&answer.headers).await {
                        return Some(false);
                    }
                }
                StatusCode::FORBIDDEN => return Some(false),
                _ => {
                    shared.count_delta_fallback();
                    return None;
                }
            }
        }
        Some(false)
    }

    /// The bundle of `release`, as the download mode says; false if the server would not
    /// give it.
    async fn fetch(&self, shared: &Shared, release: &AgentVersion) -> bool {
        if shared.options.deltas
            && let Some(taken) = self.fetch_delta(shared, release).await
        {
            return taken;
        }
        let path = release_path(wire::DOWNLOAD_PATH, &self.platform, release);
        for _ in 0..DOWNLOAD_TRIES {
            let answer = match shared.options.download {
                DownloadMode::Full => {
                    self.call(shared, Call::new("download", Method::GET, &path).drain())
                        .await
                }
                DownloadMode::Head => {
                    let head = self
                        .call(
                            shared,
                            Call::new("download (HEAD)", Method::HEAD, &path).drain(),
                        )
                        .await;
                    match head {
                        Some(a) if a.status.is_success() => {
                            let range = [("Range", format!("bytes=0-{}", FIRST_BYTES - 1))];
                            self.call(
                                shared,
                                Call::new("download (first bytes)", Method::GET, &path)
                                    .headers(&range)
                                    .drain(),
                            )
                            .await
                        }
                        other => other,
                    }
                }
            };
            match answer.map(|a| (a.status, a.headers)) {
                Some((status, _)) if status.is_success() => return true,
                Some((StatusCode::SERVICE_UNAVAILABLE, headers)) => {
                    if shared.wait_out_busy(&headers).await {
                        return false;
                    }
                }
                _ => return false,
            }
        }
        false
    }

    /// Accepted until `window` opens: fetches its release now, once per release, as a real
    /// agent with `update.download-ahead` does (what it is offered, from
    /// `/agentupdate/version`, then the delta or the bundle). A failure is left to the
    /// update at the opening, which fetches as always.
    async fn fetch_ahead(&mut self, shared: &Shared, window: &WindowOffer) {
        if !shared.options.download_ahead
            || self.ahead_acted.as_deref() == Some(window.sha256.as_str())
        {
            return;
        }
        self.ahead_acted = Some(window.sha256.clone());
        let Ok(expected) = window.expected.parse::<AgentVersion>() else {
            shared
                .stats
                .error("connect: the window names no version".into());
            return;
        };
        if expected == self.version || self.bad.contains(&window.sha256) {
            return;
        }
        let path = release_path(wire::VERSION_PATH, &self.platform, &expected);
        let offered = self
            .call(shared, Call::new("version", Method::GET, &path))
            .await
            .filter(|a| a.status.is_success())
            .and_then(|a| {
                let text = String::from_utf8(a.body).ok()?;
                let props = agent_protocol::properties::Properties::parse(&text).ok()?;
                wire::VersionInfo::from_properties(&props).ok()
            });
        // The bundle may be changing: the update at the opening tries again.
        if offered.is_none_or(|info| info.agent != expected || info.sha256 != window.sha256) {
            return;
        }
        self.fetching_ahead = true;
        let fetched = self.fetch(shared, &expected).await;
        self.fetching_ahead = false;
        if fetched {
            self.ahead_ready = Some(window.sha256.clone());
            shared.count_ahead();
        }
    }

    /// Refused with `ns`: update, unless that very bundle failed here before.
    async fn update(&mut self, shared: &Shared, ns: NotSupported) {
        let Ok(expected) = ns.expected.parse::<AgentVersion>() else {
            shared.stats.error("connect: 409 names no version".into());
            return;
        };
        let sha256 = ns.sha256.clone();
        let bundle = ns.sha256.unwrap_or_else(|| expected.to_string());
        if self.bad.contains(&bundle) {
            return;
        }
        // Fetched ahead of its window, or the version it kept (a rollback): installed
        // from what it has, as a real agent reuses a complete download of the same
        // bundle and switches back to a kept one without a download.
        let kept = sha256.is_some() && self.kept == sha256;
        if kept {
            shared.count_kept();
        }
        let ready = kept || (sha256.is_some() && self.ahead_ready == sha256);
        let bundle_from = if ready {
            None
        } else {
            self.try_source(shared, &expected).await
        };
        if !ready && bundle_from != Some(wire::FROM_SOURCE) && !self.fetch(shared, &expected).await
        {
            return;
        }
        self.report_from(
            shared,
            &expected,
            UpdateStatus::Installing,
            None,
            bundle_from,
        )
        .await;
        if shared.sleep(shared.options.install_time).await {
            return;
        }
        if rand::rng().random::<f64>() < shared.options.fail_rate {
            self.report(
                shared,
                &expected,
                UpdateStatus::InstallFailed,
                Some("simulated: the new version did not come up healthy".into()),
            )
            .await;
            self.deliver_outbox(shared).await;
            self.bad.insert(bundle);
            shared.count_failed();
        } else {
            let from = self.version.clone();
            // The new version starts and registers; its INSTALLED waits in its outbox.
            self.version = expected.clone();
            self.kept = std::mem::replace(&mut self.running, sha256);
            self.ahead_ready = None;
            self.registered = false;
            let report = Report {
                id: self.id.clone(),
                from: from.to_string(),
                to: expected.to_string(),
                status: UpdateStatus::Installed,
                error: None,
            };
            let _ = self.hello(shared).await;
            self.outbox.push_back((report, None));
            self.deliver_outbox(shared).await;
            // Delivered, unless the simulation ended first.
            if self.outbox.is_empty() {
                shared.installed(&expected);
            }
            shared.moved(&from, &expected);
        }
    }

    /// Runs until the simulation ends.
    pub async fn run(mut self, shared: Arc<Shared>, start_after: Duration) {
        if shared.sleep(start_after).await {
            return;
        }
        shared.joined(&self.version);
        if shared.options.deltas {
            self.learn_running(&shared).await;
        }
        let heartbeat = shared.options.heartbeat;
        loop {
            let asked = Instant::now();
            let was_registered = self.registered;
            let hello = tokio::select! {
                hello = self.hello_held(&shared) => hello,
                // A held connect ends with the simulation.
                true = shared.sleep(Duration::MAX) => return,
            };
            let took = asked.elapsed();
            let registered = !was_registered && self.registered;
            match hello.directive {
                Some(Err(ns)) => self.update(&shared, ns).await,
                Some(Ok(())) => {
                    if let Some(window) = &hello.window {
                        self.fetch_ahead(&shared, window).await;
                    }
                }
                None => {}
            }
            let wait = if let Some(asked_for) = hello.busy {
                busy::busy_wait(asked_for, heartbeat, rand::rng().random::<f64>())
            } else if registered && shared.options.long_poll {
                // As real agents do: the first held connect follows the register at once.
                Duration::ZERO
            } else if hello.held {
                // Straight back after news or a hold that ran its course; a server
                // letting go early with nothing new (a restart) gets a random pause.
                if hello.changed || took.as_secs_f64() >= heartbeat.as_secs_f64() * 0.9 {
                    Duration::ZERO
                } else {
                    RECONNECT_JITTER
                        .min(heartbeat)
                        .mul_f64(rand::rng().random::<f64>())
                }
            } else {
                let jitter = shared.options.jitter;
                let factor = 1.0 + jitter * (2.0 * rand::rng().random::<f64>() - 1.0);
                heartbeat.mul_f64(factor.max(0.0))
            };
            if shared.sleep(wait).await {
                return;
            }
        }
    }
}

/// `path` (version, download) for `release` on `platform`, as a real agent names it: a
/// deployment's release may be another than the server's current one, which is what a
/// path without `release=` answers.
fn release_path(path: &str, platform: &str, release: &AgentVersion) -> String {
    wire::for_release(path, platform, &release.to_string())
}

/// The delta from the bundle of sha256 `from` to `release` on `platform` (a server makes
/// them toward its current release only, and answers `404` for another: the bundle then).
fn delta_to(from: &str, platform: &str, release: &AgentVersion) -> String {
    wire::delta_path_to(from, platform, &release.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_update_names_the_release_its_directive_names() {
        let release: AgentVersion = "2.3.0+1".parse().unwrap();
        let platform = "x86_64-unknown-linux-gnu";
        assert_eq!(
            release_path(wire::DOWNLOAD_PATH, platform, &release),
            format!(
                "{}?platform={platform}&release=2.3.0%2B1",
                wire::DOWNLOAD_PATH
            )
        );
        assert_eq!(
            release_path(wire::VERSION_PATH, platform, &release),
            format!(
                "{}?platform={platform}&release=2.3.0%2B1",
                wire::VERSION_PATH
            )
        );
        let from = "ab".repeat(32);
        let delta = delta_to(&from, platform, &release);
        assert!(
            delta.starts_with(&wire::delta_path(&from, platform)),
            "{delta}"
        );
        assert!(delta.ends_with("&release=2.3.0%2B1"), "{delta}");
    }
}
