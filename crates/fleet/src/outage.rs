//! Answering agents while the fleet database is unreachable.
//!
//! A PostgreSQL restart must never turn into `500`s for a fleet. When a query fails for
//! want of the database (not because of a bad statement), the server marks the database
//! down: agents are then answered from what this server last read (the credentials it
//! checked, the rollout and each agent's place in it) and what they ask to be written
//! (contacts, reports, the first `409` of a rollout) waits in a [`Spool`], in order. The
//! drain (in [`crate::fleet`]) writes the spool back as soon as the database answers, and only
//! once it is empty do calls go to the database again, so nothing written later can
//! overtake what was queued earlier.
//!
//! Reports and `409` records are also appended to `<home>/spool.jsonl`, so a server
//! killed during an outage writes them when it starts again (replaying is harmless:
//! every queued write is idempotent). Contacts are kept in memory only: they say when
//! an agent was last heard, which its next heartbeat says again.
//!
//! It owns the spool file and nothing else; it never decides a directive itself.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use agent_protocol::wire::{ConfigStatus, Report};
use serde::{Deserialize, Serialize};

use crate::db::{Credentials, Probe, Progress};
use crate::error::FleetError;

/// Most entries kept; past it, new contacts are dropped (reports and `409` records never
/// are: they are few, and also on disk).
pub const MAX_SPOOLED: usize = 1_000_000;

/// A write that waits for the database.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Deferred {
    /// A register or connect: the agent row as of `at` (unix seconds).
    Contact {
        id: String,
        name: String,
        platform: String,
        version: String,
        group: Option<String>,
        /// The configuration set it runs; absent in spools from before remote
        /// configuration (kept as recorded).
        #[serde(default)]
        config_hash: Option<String>,
        /// The labels it reports, as JSON (`labels::to_json`); absent from an agent from
        /// before labels, and in spools from before them (kept as recorded).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        labels: Option<String>,
        at: i64,
        /// The agent's and its workload's health, when it reported one.
        #[serde(default)]
        health: Option<agent_protocol::wire::AgentHealth>,
    },
    /// A report, received at `at_ms`.
    Report { report: Report, at_ms: i64 },
    /// What an agent made of a configuration set, received at `at_ms`.
    ConfigStatus { status: ConfigStatus, at_ms: i64 },
    /// The first `409` of rollout `rollout` to `agent`, at `at_ms`.
    Told {
        rollout: i64,
        agent: String,
        at_ms: i64,
    },
}

impl Deferred {
    /// The agent this write is about.
    pub fn agent(&self) -> &str {
        match self {
            Deferred::Contact { id, .. } => id,
            Deferred::Report { report, .. } => &report.id,
            Deferred::Told { agent, .. } => agent,
            Deferred::ConfigStatus { status, .. } => &status.id,
        }
    }

    /// When an agent's rollout deadline may wait for this write, its arrival (unix
    /// milliseconds): an outcome, or the first `409` that starts the deadline. A contact
    /// settles no deadline.
    pub fn awaited_since_ms(&self) -> Option<i64> {
        match self {
            Deferred::Contact { .. } => None,
            Deferred::Report { at_ms, .. }
            | Deferred::ConfigStatus { at_ms, .. }
            | Deferred::Told { at_ms, .. } => Some(*at_ms),
        }
    }

    /// Kept on disk: what a later heartbeat would not say again.
    fn durable(&self) -> bool {
        !matches!(self, Deferred::Contact { .. })
    }
}

/// The queued writes, oldest first. An agent's contact replaces its queued contact
/// when nothing of that agent was queued after it, so a long outage keeps one contact
/// per agent, not one per heartbeat, and the order of each agent's writes is kept.
#[derive(Debug, Default)]
pub struct Spool {
    entries: BTreeMap<u64, Deferred>,
    next: u64,
    /// Sequence number of each agent's latest entry, and of its latest contact.
    latest: HashMap<String, u64>,
    contact: HashMap<String, u64>,
    /// How many writes of each agent are queued.
    held: HashMap<String, usize>,
    dropped: u64,
}

impl Spool {
    pub fn push(&mut self, write: Deferred) {
        let agent = write.agent().to_owned();
        if let Deferred::Contact { .. } = write {
            if let Some(&seq) = self.contact.get(&agent)
                && self.latest.get(&agent) == Some(&seq)
                && self.entries.contains_key(&seq)
            {
                self.entries.insert(seq, write);
                return;
            }
            if self.entries.len() >= MAX_SPOOLED {
                self.dropped += 1;
                return;
            }
        }
        let seq = self.next;
        self.next += 1;
        if let Deferred::Contact { .. } = write {
            self.contact.insert(agent.clone(), seq);
        }
        *self.held.entry(agent.clone()).or_default() += 1;
        self.latest.insert(agent, seq);
        self.entries.insert(seq, write);
    }

    /// The oldest write, to be written next.
    pub fn front(&self) -> Option<(u64, Deferred)> {
        self.entries
            .first_key_value()
            .map(|(seq, w)| (*seq, w.clone()))
    }

    /// Up to `max` queued contacts that may be written now, together, oldest first: none
    /// of an agent with an older write of another kind still queued, which must go
    /// first. A spool is mostly heartbeats, and written one by one it may fill faster
    /// than it empties (a fleet of 100,000 calls in thousands of times a second).
    pub fn front_contacts(&self, max: usize) -> Vec<(u64, Deferred)> {
        let mut waiting: HashSet<&str> = HashSet::new();
        let mut run = Vec::new();
        // Bounded, so a spool of reports is not walked whole for a few contacts.
        for (seq, w) in self.entries.iter().take(max.saturating_mul(4)) {
            if run.len() >= max {
                break;
            }
            match w {
                Deferred::Contact { .. } if !waiting.contains(w.agent()) => {
                    run.push((*seq, w.clone()));
                }
                Deferred::Contact { .. } => {}
                _ => {
                    waiting.insert(w.agent());
                }
            }
        }
        run
    }

    /// The oldest `max` writes, whatever their kind: each agent's in its order.
    pub fn front_run(&self, max: usize) -> Vec<(u64, Deferred)> {
        self.entries
            .iter()
            .take(max)
            .map(|(seq, w)| (*seq, w.clone()))
            .collect()
    }

    /// The arrival of the oldest queued write a rollout deadline may wait for.
    pub fn oldest_awaited_ms(&self) -> Option<i64> {
        self.entries
            .values()
            .filter_map(Deferred::awaited_since_ms)
            .min()
    }

    /// Whether a write of `agent` is queued.
    pub fn holds(&self, agent: &str) -> bool {
        self.held.contains_key(agent)
    }

    /// `seq` was written (or is given up): forget it.
    pub fn done(&mut self, seq: u64) {
        if let Some(write) = self.entries.remove(&seq) {
            let agent = write.agent();
            if self.latest.get(agent) == Some(&seq) {
                self.latest.remove(agent);
            }
            if self.contact.get(agent) == Some(&seq) {
                self.contact.remove(agent);
            }
            if let Some(n) = self.held.get_mut(agent) {
                *n -= 1;
                if *n == 0 {
                    self.held.remove(agent);
                }
            }
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Contacts dropped because the spool was full.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

/// What `/healthz` and `/metrics` say about the database.
#[derive(Debug, Clone, PartialEq)]
pub struct Status {
    pub up: bool,
    /// Seconds since the database was found unreachable.
    pub down_for: Option<f64>,
    pub reason: Option<String>,
    pub queued: usize,
    pub dropped: u64,
    pub outages: u64,
}

pub struct Outage {
    down: AtomicBool,
    since: Mutex<Option<(Instant, String)>>,
    spool: Mutex<Spool>,
    file: Option<PathBuf>,
    /// The credentials last read for each agent: the only way to check a caller while
    /// the database is away.
    credentials: Mutex<HashMap<String, Credentials>>,
    outages: AtomicU64,
    /// The pool's last answered query, and the probe beside it: they tell a busy
    /// database from one that is away.
    progress: Option<Arc<Progress>>,
    probe: Arc<ProbeState>,
    /// Queries answered from memory because every connection was busy, and when that
    /// was last said.
    busy: AtomicU64,
    busy_said: Mutex<Option<Instant>>,
}

/// What a probe connection (see [`Progress::probe`]) last found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probed {
    Never,
    InFlight,
    Answered { at_ms: i64 },
    Failed { at_ms: i64 },
}

/// What a query that failed for want of the database means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The database answers, there are more queries than connections: answer this one
    /// from memory and stay with the database.
    Busy,
    /// Stopped, refusing, cut off or hung: an outage.
    Away,
    /// No probe says which yet: busy while one is made.
    Probe,
}

/// Whether a failure means a busy database rather than one that is away. Only a query
/// that found no connection free within the acquire timeout can be busy, and only while
/// a connection came back from a query within the last `window_ms`. Then a probe
/// connection opened beside the pool decides: it answers from a busy database and not
/// from one stopped or refusing (whose pool still holds connections it has not yet
/// found dead). What a probe found holds for [`PROBE_FRESH_MS`].
pub fn busy_or_away(
    e: &FleetError,
    last_answer_ms: i64,
    probed: Probed,
    now_ms: i64,
    window_ms: i64,
) -> Verdict {
    let fresh = |at_ms: i64| now_ms.saturating_sub(at_ms) <= PROBE_FRESH_MS;
    if !matches!(e, FleetError::Database(sqlx::Error::PoolTimedOut))
        || last_answer_ms <= 0
        || now_ms.saturating_sub(last_answer_ms) > window_ms
    {
        return Verdict::Away;
    }
    match probed {
        Probed::InFlight => Verdict::Busy,
        Probed::Answered { at_ms } if fresh(at_ms) => Verdict::Busy,
        Probed::Failed { at_ms } if fresh(at_ms) => Verdict::Away,
        _ => Verdict::Probe,
    }
}

/// A database that answered a query this recently may be busy, not away. Five acquire
/// timeouts: 100,000 agents coming up on five servers and a PostgreSQL sharing two
/// cores had statements take over 3 s, and a window of one timeout sent every server in
/// and out of outage mode every 40 s. A hung database is still found away within it.
const BUSY_WINDOW: std::time::Duration = std::time::Duration::from_secs(15);
const _: () = assert!(BUSY_WINDOW.as_secs() >= crate::db::ACQUIRE_TIMEOUT.as_secs());

/// How long a probe's finding holds: about one acquire timeout, so a busy server probes
/// every few seconds, and a database that stops while busy is found away soon after.
const PROBE_FRESH_MS: i64 = 3_000;

/// The latest probe of this server's database.
#[derive(Debug, Default)]
struct ProbeState {
    in_flight: AtomicBool,
    answered_ms: AtomicI64,
    failed_ms: AtomicI64,
    /// Why the last probe failed.
    failure: Mutex<String>,
}

impl ProbeState {
    fn probed(&self) -> Probed {
        if self.in_flight.load(Ordering::Acquire) {
            return Probed::InFlight;
        }
        let answered = self.answered_ms.load(Ordering::Acquire);
        let failed = self.failed_ms.load(Ordering::Acquire);
        match (answered, failed) {
            (0, 0) => Probed::Never,
            (a, f) if a >= f => Probed::Answered { at_ms: a },
            (_, f) => Probed::Failed { at_ms: f },
        }
    }
}

/// How often a busy database is said in the log.
const BUSY_SAID_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Outage {
    /// With `file`, durable writes are also appended there, and what a previous process
    /// left in it is queued again.
    pub fn new(file: Option<PathBuf>) -> Self {
        let mut spool = Spool::default();
        if let Some(path) = &file {
            for write in read_spool_file(path) {
                spool.push(write);
            }
            if !spool.is_empty() {
                tracing::info!(
                    "{} writes queued during an earlier outage are written to the database",
                    spool.len()
                );
            }
        }
        Self {
            down: AtomicBool::new(false),
            since: Mutex::new(None),
            spool: Mutex::new(spool),
            file,
            credentials: Mutex::new(HashMap::new()),
            outages: AtomicU64::new(0),
            progress: None,
            probe: Arc::default(),
            busy: AtomicU64::new(0),
            busy_said: Mutex::new(None),
        }
    }

    /// Tells a busy database from one that is away by the pool's progress.
    pub fn watching(mut self, progress: Arc<Progress>) -> Self {
        self.progress = Some(progress);
        self
    }

    /// Queries answered from memory because the database was busy (not away).
    pub fn busy_count(&self) -> u64 {
        self.busy.load(Ordering::Relaxed)
    }

    /// True from the first failure for want of the database until the spool is
    /// written back.
    pub fn is_down(&self) -> bool {
        self.down.load(Ordering::Acquire)
    }

    /// A query failed for want of the database: say so once, and answer from memory.
    /// A busy database (see [`busy_or_away`]) is not an outage: this one query is
    /// answered from memory, and the server stays with its database.
    pub fn went_down(&self, e: &FleetError) {
        if let Some(progress) = &self.progress {
            let verdict = busy_or_away(
                e,
                progress.last_ms(),
                self.probe.probed(),
                crate::db::now_ms(),
                i64::try_from(BUSY_WINDOW.as_millis()).unwrap_or(i64::MAX),
            );
            if verdict == Verdict::Probe {
                self.start_probe(progress);
            }
            if verdict != Verdict::Away {
                self.said_busy();
                return;
            }
        }
        if self.down.swap(true, Ordering::AcqRel) {
            return;
        }
        self.outages.fetch_add(1, Ordering::Relaxed);
        let reason = match e {
            FleetError::Database(e @ sqlx::Error::PoolTimedOut) => match self.probe.probed() {
                Probed::Failed { .. } => {
                    format!("{e}, and a new connection: {}", lock(&self.probe.failure))
                }
                _ => e.to_string(),
            },
            FleetError::Database(e) => e.to_string(),
            other => other.to_string(),
        };
        tracing::error!(
            "the fleet database is unreachable ({reason}); answering agents from what this server knows and queueing their writes until it is back"
        );
        *lock(&self.since) = Some((Instant::now(), reason));
    }

    /// Opens a probe connection in the background unless one is open; what it finds
    /// decides the next failure (see [`busy_or_away`]).
    fn start_probe(&self, progress: &Arc<Progress>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.probe.in_flight.swap(true, Ordering::AcqRel) {
            return;
        }
        let (progress, state) = (Arc::clone(progress), Arc::clone(&self.probe));
        runtime.spawn(async move {
            let found = progress.probe().await;
            let at_ms = crate::db::now_ms();
            match found {
                Probe::Answered => state.answered_ms.store(at_ms, Ordering::Release),
                Probe::Refused(e) => {
                    *lock(&state.failure) = e;
                    state.failed_ms.store(at_ms, Ordering::Release);
                }
                // Nothing learnt: the next timeout probes again, and the busy window
                // decides meanwhile.
                Probe::NoAnswer => {}
            }
            state.in_flight.store(false, Ordering::Release);
        });
    }

    fn said_busy(&self) {
        self.busy.fetch_add(1, Ordering::Relaxed);
        let mut said = lock(&self.busy_said);
        if said.is_none_or(|at| at.elapsed() >= BUSY_SAID_EVERY) {
            *said = Some(Instant::now());
            tracing::warn!(
                "the fleet database is busy: no connection came free within {:?} while queries are being answered ({} answered from memory so far); raise database.pool-size if PostgreSQL has room, or add servers",
                crate::db::ACQUIRE_TIMEOUT,
                self.busy_count()
            );
        }
    }

    /// Queues a write for the database.
    pub fn defer(&self, write: Deferred) {
        if write.durable()
            && let Some(path) = &self.file
            && let Err(e) = append(path, &write)
        {
            tracing::warn!(
                "{}: {e}; the queued write is kept in memory only",
                path.display()
            );
        }
        lock(&self.spool).push(write);
    }

    /// The oldest queued write.
    pub fn front(&self) -> Option<(u64, Deferred)> {
        lock(&self.spool).front()
    }

    /// Queued contacts to write together (see [`Spool::front_contacts`]).
    pub fn front_contacts(&self, max: usize) -> Vec<(u64, Deferred)> {
        lock(&self.spool).front_contacts(max)
    }

    /// See [`Spool::oldest_awaited_ms`].
    pub fn oldest_awaited_ms(&self) -> Option<i64> {
        lock(&self.spool).oldest_awaited_ms()
    }

    /// The oldest queued writes (see [`Spool::front_run`]).
    pub fn front_run(&self, max: usize) -> Vec<(u64, Deferred)> {
        lock(&self.spool).front_run(max)
    }

    /// See [`Spool::holds`].
    pub fn holds(&self, agent: &str) -> bool {
        lock(&self.spool).holds(agent)
    }

    pub fn written(&self, seq: u64) {
        lock(&self.spool).done(seq);
    }

    /// Called when the database answers and the spool was written: calls go to the
    /// database again. False while something is still queued.
    pub fn came_back(&self) -> bool {
        let spool = lock(&self.spool);
        if !spool.is_empty() {
            return false;
        }
        // Everything in the file was written: a later start must not queue it again.
        if let Some(path) = &self.file {
            let _ = std::fs::remove_file(path);
        }
        if self.down.swap(false, Ordering::AcqRel) {
            let since = lock(&self.since).take();
            tracing::info!(
                "the fleet database is back after {:.1}s; every queued write is in it",
                since.map_or(0.0, |(at, _)| at.elapsed().as_secs_f64())
            );
        }
        true
    }

    pub fn queued(&self) -> usize {
        lock(&self.spool).len()
    }

    pub fn remember_credentials(&self, id: &str, credentials: &Credentials) {
        let mut known = lock(&self.credentials);
        if known.get(id) != Some(credentials) {
            known.insert(id.to_owned(), credentials.clone());
        }
    }

    pub fn known_credentials(&self, id: &str) -> Option<Credentials> {
        lock(&self.credentials).get(id).cloned()
    }

    pub fn status(&self) -> Status {
        let since = lock(&self.since).clone();
        let spool = lock(&self.spool);
        Status {
            up: !self.is_down(),
            down_for: since.as_ref().map(|(at, _)| at.elapsed().as_secs_f64()),
            reason: since.map(|(_, r)| r),
            queued: spool.len(),
            dropped: spool.dropped(),
            outages: self.outages.load(Ordering::Relaxed),
        }
    }
}

fn append(path: &Path, write: &Deferred) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(write).map_err(std::io::Error::other)?;
    line.push(b'\n');
    let mut file = OpenOptions::new().create(true).append(true).open(path)?;
    file.write_all(&line)
}

/// The writes a previous process queued; lines that do not parse (a torn last line)
/// are skipped.
fn read_spool_file(path: &Path) -> Vec<Deferred> {
    let Ok(file) = File::open(path) else {
        return Vec::new();
    };
    BufReader::new(file)
        .lines()
        .map_while(Result::ok)
        .filter_map(|line| serde_json::from_str(&line).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_protocol::wire::UpdateStatus;

    #[test]
    fn a_pool_with_no_connection_free_is_busy_while_queries_come_back_and_a_probe_answers() {
        let timed_out = FleetError::Database(sqlx::Error::PoolTimedOut);
        // At 10 s, with a window of 3 s: `last` is when a query last came back.
        let verdict = |e: &FleetError, last: i64, probed: Probed| {
            busy_or_away(e, last, probed, 10_000, 3_000)
        };
        let answered = Probed::Answered { at_ms: 9_500 };
        // A query came back 1 s ago, a probe answered: busy.
        assert_eq!(verdict(&timed_out, 9_000, answered), Verdict::Busy);
        assert_eq!(verdict(&timed_out, 7_000, answered), Verdict::Busy);
        // A probe on its way: busy until it says otherwise.
        assert_eq!(verdict(&timed_out, 9_000, Probed::InFlight), Verdict::Busy);
        // No probe yet, or its finding is old: make one.
        assert_eq!(verdict(&timed_out, 9_000, Probed::Never), Verdict::Probe);
        let old = Probed::Answered {
            at_ms: 10_000 - PROBE_FRESH_MS - 1,
        };
        assert_eq!(verdict(&timed_out, 9_000, old), Verdict::Probe);
        // The probe found no database (stopped, refusing), however recent the last answer.
        let failed = Probed::Failed { at_ms: 9_900 };
        assert_eq!(verdict(&timed_out, 9_999, failed), Verdict::Away);
        // Nothing came back for longer than the window (hung, cut off): away.
        assert_eq!(verdict(&timed_out, 6_999, answered), Verdict::Away);
        // Nothing ever came back: away.
        assert_eq!(verdict(&timed_out, 0, answered), Verdict::Away);
        // A refused or broken connection is away however recent the last answer.
        let refused = FleetError::Database(sqlx::Error::Io(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )));
        assert_eq!(verdict(&refused, 9_999, answered), Verdict::Away);
        let closed = FleetError::Database(sqlx::Error::PoolClosed);
        assert_eq!(verdict(&closed, 9_999, answered), Verdict::Away);
    }

    /// Waits until the probe `outage` started has come back.
    async fn probe_back(outage: &Outage) {
        for _ in 0..500 {
            if !matches!(outage.probe.probed(), Probed::InFlight | Probed::Never) {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("the probe did not come back: {:?}", outage.probe.probed());
    }

    #[tokio::test]
    async fn a_busy_database_answers_from_memory_without_an_outage() {
        // An in-memory SQLite database always takes a new connection: the probe answers.
        sqlx::any::install_default_drivers();
        let progress = Arc::new(Progress::for_url("sqlite::memory:"));
        let outage = Outage::new(None).watching(Arc::clone(&progress));
        progress.answered(crate::db::now_ms());
        outage.went_down(&FleetError::Database(sqlx::Error::PoolTimedOut));
        assert!(!outage.is_down());
        assert_eq!(outage.busy_count(), 1);
        probe_back(&outage).await;
        assert!(matches!(outage.probe.probed(), Probed::Answered { .. }));
        // Slow statements (the last answer 10 s ago) are still a busy database.
        progress.answered(crate::db::now_ms() - 10_000);
        outage.went_down(&FleetError::Database(sqlx::Error::PoolTimedOut));
        assert!(!outage.is_down());
        // Then nothing answers for longer than the window: away.
        progress.answered(crate::db::now_ms() - 20_000);
        outage.went_down(&FleetError::Database(sqlx::Error::PoolTimedOut));
        assert!(outage.is_down());
    }

    #[tokio::test]
    async fn a_probe_that_gets_no_answer_in_time_leaves_the_database_busy() {
        // Something accepts connections there and says nothing: a machine too loaded
        // to start a PostgreSQL backend within the probe's timeout.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        let port = silent.local_addr().expect("its address").port();
        sqlx::any::install_default_drivers();
        let progress = Arc::new(Progress::for_url(&format!(
            "postgres://fleet@127.0.0.1:{port}/fleet"
        )));
        assert_eq!(progress.probe().await, Probe::NoAnswer);
        let outage = Outage::new(None).watching(Arc::clone(&progress));
        progress.answered(crate::db::now_ms());
        outage.went_down(&FleetError::Database(sqlx::Error::PoolTimedOut));
        // The probe learns nothing: the next timeout is busy again, and probes again.
        while outage.probe.in_flight.load(Ordering::Acquire) {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert_eq!(outage.probe.probed(), Probed::Never);
        outage.went_down(&FleetError::Database(sqlx::Error::PoolTimedOut));
        assert!(!outage.is_down());
        assert_eq!(outage.busy_count(), 2);
    }

    #[tokio::test]
    async fn a_pool_timeout_from_a_stopped_database_is_an_outage_once_the_probe_is_refused() {
        // Nothing listens there: a stopped PostgreSQL whose pool still holds connections.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        sqlx::any::install_default_drivers();
        let progress = Arc::new(Progress::for_url(&format!(
            "postgres://fleet@127.0.0.1:{port}/fleet"
        )));
        let outage = Outage::new(None).watching(Arc::clone(&progress));
        progress.answered(crate::db::now_ms());
        // The first timeout cannot tell yet: answered from memory, and a probe goes out.
        outage.went_down(&FleetError::Database(sqlx::Error::PoolTimedOut));
        assert!(!outage.is_down());
        probe_back(&outage).await;
        assert!(matches!(outage.probe.probed(), Probed::Failed { .. }));
        outage.went_down(&FleetError::Database(sqlx::Error::PoolTimedOut));
        assert!(outage.is_down());
        let status = outage.status();
        assert!(
            status
                .reason
                .as_deref()
                .is_some_and(|r| r.contains("a new connection")),
            "{status:?}"
        );
    }

    fn contact(id: &str, version: &str, at: i64) -> Deferred {
        Deferred::Contact {
            id: id.into(),
            name: "n".into(),
            platform: "p".into(),
            version: version.into(),
            group: None,
            config_hash: None,
            labels: None,
            at,
            health: None,
        }
    }

    fn report(id: &str, at_ms: i64) -> Deferred {
        Deferred::Report {
            report: Report {
                id: id.into(),
                from: "1.0.0+1".into(),
                to: "2.0.0+2".into(),
                status: UpdateStatus::Installed,
                error: None,
            },
            at_ms,
        }
    }

    fn drain(spool: &mut Spool) -> Vec<Deferred> {
        let mut out = Vec::new();
        while let Some((seq, w)) = spool.front() {
            spool.done(seq);
            out.push(w);
        }
        out
    }

    #[test]
    fn heartbeats_of_one_agent_keep_one_contact_the_latest() {
        let mut spool = Spool::default();
        for at in 1..=100 {
            spool.push(contact("a", "1.0.0+1", at));
            spool.push(contact("b", "1.0.0+1", at));
        }
        assert_eq!(spool.len(), 2);
        assert_eq!(
            drain(&mut spool),
            vec![contact("a", "1.0.0+1", 100), contact("b", "1.0.0+1", 100)]
        );
    }

    #[test]
    fn contacts_are_taken_together_except_behind_their_agents_report() {
        let mut spool = Spool::default();
        spool.push(contact("a", "1.0.0+1", 1));
        spool.push(report("b", 2000));
        spool.push(contact("c", "1.0.0+1", 2));
        spool.push(contact("b", "2.0.0+2", 3));
        spool.push(contact("d", "1.0.0+1", 4));
        let run: Vec<_> = spool
            .front_contacts(10)
            .into_iter()
            .map(|(_, w)| w)
            .collect();
        assert_eq!(
            run,
            vec![
                contact("a", "1.0.0+1", 1),
                contact("c", "1.0.0+1", 2),
                contact("d", "1.0.0+1", 4)
            ]
        );
        assert_eq!(spool.front_contacts(2).len(), 2);
        for (seq, _) in spool.front_contacts(10) {
            spool.done(seq);
        }
        // What is left keeps b's order: its report, then its contact.
        assert_eq!(
            drain(&mut spool),
            vec![report("b", 2000), contact("b", "2.0.0+2", 3)]
        );
    }

    #[test]
    fn a_contact_after_a_report_does_not_jump_ahead_of_it() {
        let mut spool = Spool::default();
        spool.push(contact("a", "1.0.0+1", 1));
        spool.push(report("a", 2000));
        spool.push(contact("a", "2.0.0+2", 3));
        spool.push(contact("a", "2.0.0+2", 4));
        assert_eq!(
            drain(&mut spool),
            vec![
                contact("a", "1.0.0+1", 1),
                report("a", 2000),
                contact("a", "2.0.0+2", 4)
            ]
        );
    }

    #[test]
    fn a_written_contact_is_not_replaced_afterwards() {
        let mut spool = Spool::default();
        spool.push(contact("a", "1.0.0+1", 1));
        let (seq, _) = spool.front().unwrap();
        spool.done(seq);
        spool.push(contact("a", "1.0.0+1", 2));
        assert_eq!(drain(&mut spool), vec![contact("a", "1.0.0+1", 2)]);
    }

    #[test]
    fn a_spool_from_before_configuration_sets_still_reads_and_statuses_are_kept() {
        let old = r#"{"kind":"contact","id":"a","name":"n","platform":"p","version":"1.0.0+1","group":null,"at":5}"#;
        let write: Deferred = serde_json::from_str(old).unwrap();
        assert!(matches!(
            write,
            Deferred::Contact {
                config_hash: None,
                ..
            }
        ));
        let status = Deferred::ConfigStatus {
            status: agent_protocol::wire::ConfigStatus {
                id: "a".into(),
                hash: "h".into(),
                status: agent_protocol::wire::ConfigOutcome::Failed,
                error: Some("check failed".into()),
            },
            at_ms: 7,
        };
        assert!(status.durable());
        let line = serde_json::to_string(&status).unwrap();
        assert_eq!(serde_json::from_str::<Deferred>(&line).unwrap(), status);
    }

    #[test]
    fn durable_writes_survive_a_restart_and_contacts_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spool.jsonl");
        let outage = Outage::new(Some(path.clone()));
        outage.defer(contact("a", "1.0.0+1", 1));
        outage.defer(report("a", 2000));
        outage.defer(Deferred::Told {
            rollout: 3,
            agent: "b".into(),
            at_ms: 2500,
        });
        // A torn last line, as a kill in the middle of an append leaves it.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"{\"kind\":\"rep")
            .unwrap();
        let again = Outage::new(Some(path.clone()));
        assert_eq!(again.queued(), 2);
        while let Some((seq, _)) = again.front() {
            again.written(seq);
        }
        assert!(again.came_back());
        assert!(!path.exists());
    }
}
