//! Deltas: every bundle this server serves is kept as a possible base, and one worker
//! makes the delta from each kept base to the bundle served now, off the request path.
//!
//! Under `<home>/deltas/`:
//!
//! - `bases/<sha256>`: a copy of a bundle once served (a copy, not a link: an operator may
//!   overwrite the dropped file in place), written to a temp name then renamed;
//! - `bases/<sha256>.base`: its platform, version and when it was first seen. The
//!   [`KEEP_PER_PLATFORM`] most recent bases of each platform are kept; older ones go.
//! - `<from>-<to>.delta`: the delta from base `from` to served bundle `to`, made once;
//! - `<from>-<to>.none`: one line saying why no delta is sent (it came out larger than
//!   [`WORTH_PERCENT`] % of the bundle: the agent downloads the bundle instead).
//!
//! Deltas whose `to` is no longer served are removed. A delta is made from the copies
//! under `bases/`, never from the operator's files, and a made delta is never written
//! again (only unlinked), so a running answer's map of it cannot change.
//!
//! Making one reads both bundles a piece at a time and runs bsdiff on changed files (see
//! [`agent_delta::make`]): its memory is bounded by bsdiff's limit on one file (64 MiB a
//! side), whatever the bundles' sizes or what they inflate to; 1–2 s for two 13 MB
//! bundles, so one is made at a time, on a blocking thread. The served bundle is taken
//! apart (read, inflated, hashed) once for all the deltas to it, not once per base. A delta whose making failed (a disk
//! full, a base unreadable) is made again after [`retry_wait`], without a restart;
//! meanwhile agents asking for it download the bundle. The worker decides nothing about
//! who may download: the route (`update-server`'s routes) answers under the download limit.

use std::collections::{HashMap, VecDeque};
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use agent_protocol::digest::Digests;
use agent_protocol::properties::Properties;
use bytes::Bytes;

use crate::ReleaseError;
use crate::store::{self, BundleStore, Current, Release};

/// Bases kept per platform: the most recent by when first seen (a served one always).
pub const KEEP_PER_PLATFORM: usize = 4;
/// A delta larger than this share of its bundle is not worth sending: applying it costs
/// the agent work and the bundle is barely larger.
pub const WORTH_PERCENT: u64 = 50;
/// `Retry-After` (seconds) while the delta asked for is being made: making one takes a
/// second or two.
pub const MAKING_RETRY_AFTER: u64 = 2;
/// Prefix of the temp files of this module, removed if a crash left them.
const TEMP_PREFIX: &str = ".making-";
/// The wait before a failed delta is made again; it doubles with each failure in a row.
pub const RETRY_FIRST: Duration = Duration::from_secs(30);
/// The longest wait between two attempts at a delta that keeps failing.
pub const RETRY_MAX: Duration = Duration::from_secs(30 * 60);

/// How long after its `failures`-th failure in a row a delta is made again: `first`,
/// doubled for each failure after the first, never more than [`RETRY_MAX`].
pub fn retry_wait(failures: u32, first: Duration) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    first
        .saturating_mul(1 << doublings)
        .min(RETRY_MAX.max(first))
}

/// A bundle once served, kept to make deltas from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Base {
    pub sha256: String,
    pub platform: String,
    /// `VERSION+BUILD`, for logs.
    pub version: String,
    /// Milliseconds since the epoch when this server first served it.
    pub first_seen: u64,
}

/// A delta from base `from` to served bundle `to` (both sha256 hex).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Pair {
    pub from: String,
    pub to: String,
}

impl Pair {
    pub fn new(from: &str, to: &str) -> Self {
        Self {
            from: from.to_owned(),
            to: to.to_owned(),
        }
    }

    /// `<from>-<to>.delta`
    pub fn delta_name(&self) -> String {
        format!("{}-{}.delta", self.from, self.to)
    }

    /// `<from>-<to>.none`
    pub fn none_name(&self) -> String {
        format!("{}-{}.none", self.from, self.to)
    }

    /// The pair a file of the deltas directory is named for, if it is one.
    pub fn of_file_name(name: &str) -> Option<Pair> {
        let stem = name
            .strip_suffix(".delta")
            .or_else(|| name.strip_suffix(".none"))?;
        let (from, to) = stem.split_once('-')?;
        (is_sha256(from) && is_sha256(to)).then(|| Pair::new(from, to))
    }
}

/// 64 lowercase hex digits, as this server writes a sha256.
pub fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Whether a delta of `delta` bytes is worth sending instead of a `bundle`-byte bundle.
pub fn worth_sending(delta: u64, bundle: u64) -> bool {
    u128::from(delta) * 100 <= u128::from(bundle) * u128::from(WORTH_PERCENT)
}

/// `delta` as a percentage of `bundle`, for logs and answers.
pub fn percent(delta: u64, bundle: u64) -> f64 {
    if bundle == 0 {
        return 0.0;
    }
    delta as f64 * 100.0 / bundle as f64
}

/// The line a `.none` file holds, which the route answers as it is.
pub fn not_worth_line(delta: u64, bundle: u64) -> String {
    format!(
        "not worth sending: {delta} bytes, {:.1} % of the bundle (over {WORTH_PERCENT} %)",
        percent(delta, bundle)
    )
}

/// The bases to delete: of each platform, all but the `keep` most recently first seen;
/// a base being served is never deleted (and counts among the kept).
pub fn bases_to_drop(bases: &[Base], served: &[&str], keep: usize) -> Vec<String> {
    let mut sorted: Vec<&Base> = bases.iter().collect();
    let serving = |b: &Base| served.contains(&b.sha256.as_str());
    // Served ones first, then newest first; the sha breaks ties so the choice does not
    // depend on listing order.
    sorted.sort_by(|a, b| {
        (&a.platform, !serving(a), b.first_seen, &a.sha256).cmp(&(
            &b.platform,
            !serving(b),
            a.first_seen,
            &b.sha256,
        ))
    });
    let mut kept: HashMap<&str, usize> = HashMap::new();
    let mut drop = Vec::new();
    for base in sorted {
        let n = kept.entry(base.platform.as_str()).or_default();
        if serving(base) || *n < keep {
            *n += 1;
        } else {
            drop.push(base.sha256.clone());
        }
    }
    drop
}

/// The deltas the served bundles `(sha256, platform)` want: from every kept base of the
/// same platform but themselves, the most recent base first (the previous release is
/// what most agents run).
pub fn plan(served: &[(&str, &str)], bases: &[Base]) -> Vec<Pair> {
    let mut newest: Vec<&Base> = bases.iter().collect();
    newest.sort_by(|a, b| (b.first_seen, &a.sha256).cmp(&(a.first_seen, &b.sha256)));
    let mut pairs = Vec::new();
    for (to, platform) in served {
        for base in &newest {
            if base.platform == *platform && base.sha256 != *to {
                pairs.push(Pair::new(&base.sha256, to));
            }
        }
    }
    pairs
}

/// A delta ready to send: mapped, and known by its own sha256.
#[derive(Debug)]
pub struct DeltaFile {
    pub data: Bytes,
    /// Quoted sha256 of the delta file, as sent in `ETag`.
    pub etag: String,
    pub last_modified: SystemTime,
}

/// What the server has from base `from` to the served bundle.
#[derive(Debug)]
pub enum Lookup {
    /// `from` is the served bundle itself.
    AlreadyServed,
    /// `from` is no base of this platform kept here.
    NoBase,
    /// Queued or being made now.
    Making,
    /// Made, and larger than it is worth: the line says how large.
    NotWorth(String),
    /// Making it failed (the log says why); the agent downloads the bundle.
    Failed,
    Ready(Arc<DeltaFile>),
}

/// A delta whose making failed (the log says why): how many times in a row, and when
/// last.
#[derive(Debug, Clone)]
struct Failure {
    failures: u32,
    at: Instant,
}

impl Failure {
    fn due(&self, now: Instant, first: Duration) -> bool {
        now.saturating_duration_since(self.at) >= retry_wait(self.failures, first)
    }
}

#[derive(Debug, Default)]
struct State {
    bases: Vec<Base>,
    /// The release identity last planned for.
    planned: Option<String>,
    queue: VecDeque<Pair>,
    making: Option<Pair>,
    ready: HashMap<Pair, Arc<DeltaFile>>,
    none: HashMap<Pair, String>,
    failed: HashMap<Pair, Failure>,
}

/// The bases, the deltas and the worker's queue.
pub struct Deltas {
    root: PathBuf,
    bases_dir: PathBuf,
    state: Mutex<State>,
    wake: tokio::sync::Notify,
    counts: Arc<DeltaCounts>,
    /// The served bundle taken apart, kept while deltas to it are queued (the worker's
    /// alone: jobs run one at a time).
    target: Mutex<Option<Arc<agent_delta::make::Target>>>,
    /// How many times a served bundle was taken apart (tests count them).
    taken_apart: std::sync::atomic::AtomicU64,
    /// [`RETRY_FIRST`], shorter in tests.
    retry_first: Duration,
}

/// How the deltas made have ended, for the server's metrics
/// (`agentupdate_deltas_made_total`).
#[derive(Debug, Default)]
pub struct DeltaCounts {
    pub made: AtomicU64,
    pub not_worth: AtomicU64,
    pub failed: AtomicU64,
}

fn inc(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// What one job of the worker came to.
enum Outcome {
    Ready(Arc<DeltaFile>),
    NotWorth(String),
}

impl Deltas {
    /// The deltas under `<home>/deltas`; the directories are made if missing.
    pub fn new(home: &Path, counts: Arc<DeltaCounts>) -> Result<Self, ReleaseError> {
        let root = home.join("deltas");
        let bases_dir = root.join("bases");
        fs::create_dir_all(&bases_dir)
            .map_err(|e| ReleaseError::Io(format!("{}: {e}", bases_dir.display())))?;
        let me = Self {
            root,
            bases_dir,
            state: Mutex::new(State::default()),
            wake: tokio::sync::Notify::new(),
            counts,
            target: Mutex::new(None),
            taken_apart: std::sync::atomic::AtomicU64::new(0),
            retry_first: RETRY_FIRST,
        };
        // Known from the first request on, so an agent asking before the worker's first
        // look is told to wait for its delta, not sent to the bundle.
        let bases = me.read_bases();
        me.lock().bases = bases;
        Ok(me)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What there is from `from` to `to` (a served bundle of `platform`). A known base
    /// whose delta is not made yet is queued first.
    pub fn lookup(&self, from: &str, to: &str, platform: &str) -> Lookup {
        if from == to {
            return Lookup::AlreadyServed;
        }
        let mut state = self.lock();
        if !state
            .bases
            .iter()
            .any(|b| b.sha256 == from && b.platform == platform)
        {
            return Lookup::NoBase;
        }
        let pair = Pair::new(from, to);
        if let Some(file) = state.ready.get(&pair) {
            return Lookup::Ready(Arc::clone(file));
        }
        if let Some(line) = state.none.get(&pair) {
            return Lookup::NotWorth(line.clone());
        }
        if let Some(failure) = state.failed.get(&pair) {
            if !failure.due(Instant::now(), self.retry_first) {
                return Lookup::Failed;
            }
            // Its wait is over: this agent's asking queues it again at once.
            state.failed.remove(&pair);
        }
        if state.making.as_ref() != Some(&pair) {
            state.queue.retain(|p| *p != pair);
            state.queue.push_front(pair);
            drop(state);
            self.wake.notify_one();
        }
        Lookup::Making
    }

    /// Runs the worker: on each release change (and at start) keeps the served bundles as
    /// bases and plans their deltas, then makes them one at a time.
    pub fn spawn(self: &Arc<Self>, store: Arc<BundleStore>) {
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(crate::SCAN_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut last_error = String::new();
            loop {
                if let Current::Ready(release) = store.current()
                    && me.lock().planned.as_deref() != Some(release.identity().as_str())
                {
                    let worker = Arc::clone(&me);
                    let copies = Arc::clone(&store);
                    let done = tokio::task::spawn_blocking(move || {
                        worker.refresh(&release, Some(&copies))
                    })
                    .await;
                    match done {
                        Ok(Err(e)) if e.to_string() != last_error => {
                            tracing::error!("deltas: {e}; trying again each second");
                            last_error = e.to_string();
                        }
                        Ok(Ok(())) => last_error.clear(),
                        _ => {}
                    }
                }
                me.requeue_failed(Instant::now());
                if let Some(pair) = me.next_job() {
                    let worker = Arc::clone(&me);
                    let job = pair.clone();
                    let done = tokio::task::spawn_blocking(move || worker.make(&job)).await;
                    let result = done.unwrap_or_else(|e| {
                        Err(ReleaseError::Io(format!("the delta maker stopped: {e}")))
                    });
                    me.finish(pair, result);
                    continue;
                }
                tokio::select! {
                    _ = tick.tick() => {}
                    () = me.wake.notified() => {}
                }
            }
        });
    }

    /// Queues again the failed deltas whose wait is over; true if any was.
    fn requeue_failed(&self, now: Instant) -> bool {
        let mut state = self.lock();
        let due: Vec<Pair> = state
            .failed
            .iter()
            .filter(|(pair, failure)| {
                failure.due(now, self.retry_first) && !state.queue.contains(pair)
            })
            .map(|(pair, _)| pair.clone())
            .collect();
        for pair in &due {
            state.queue.push_back(pair.clone());
        }
        !due.is_empty()
    }

    fn next_job(&self) -> Option<Pair> {
        let mut state = self.lock();
        let pair = state.queue.pop_front()?;
        state.making = Some(pair.clone());
        Some(pair)
    }

    fn finish(&self, pair: Pair, result: Result<Outcome, ReleaseError>) {
        let mut state = self.lock();
        state.making = None;
        let earlier = state.failed.remove(&pair).map_or(0, |f| f.failures);
        match result {
            Ok(Outcome::Ready(file)) => {
                inc(&self.counts.made);
                state.ready.insert(pair.clone(), file);
            }
            Ok(Outcome::NotWorth(line)) => {
                inc(&self.counts.not_worth);
                state.none.insert(pair.clone(), line);
            }
            Err(e) => {
                inc(&self.counts.failed);
                let failures = earlier.saturating_add(1);
                let wait = retry_wait(failures, self.retry_first);
                tracing::error!(
                    from = %pair.from,
                    to = %pair.to,
                    "cannot make the delta: {e}; agents asking for it download the bundle; trying again in {}s",
                    wait.as_secs()
                );
                state.failed.insert(
                    pair.clone(),
                    Failure {
                        failures,
                        at: Instant::now(),
                    },
                );
            }
        }
        // The served bundle's parts are kept only while deltas to it wait.
        if !state.queue.iter().any(|p| p.to == pair.to) {
            *self.target.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
    }

    /// The served bundle `sha` taken apart: the one kept from the last job if it is the
    /// same bundle, else read and taken apart now. Blocking.
    fn target(
        &self,
        sha: &str,
        path: &Path,
    ) -> Result<Arc<agent_delta::make::Target>, ReleaseError> {
        let mut kept = self.target.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(target) = kept.as_ref()
            && target.sha256_hex() == sha
        {
            return Ok(Arc::clone(target));
        }
        *kept = None;
        let target = Arc::new(
            agent_delta::make::Target::open(path).map_err(|e| ReleaseError::Io(e.to_string()))?,
        );
        self.taken_apart
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        *kept = Some(Arc::clone(&target));
        Ok(target)
    }

    /// Keeps the served bundles as bases (copied from `store`'s private copies where it
    /// has them), drops old bases and deltas no longer wanted, and plans the deltas of
    /// `release`. Blocking.
    fn refresh(&self, release: &Release, store: Option<&BundleStore>) -> Result<(), ReleaseError> {
        let first = self.lock().planned.is_none();
        if first {
            remove_temps(&self.root);
            remove_temps(&self.bases_dir);
        }
        let mut bases = self.read_bases();
        for bundle in release.bundles() {
            if !bases.iter().any(|b| b.sha256 == bundle.info.sha256) {
                bases.push(self.keep_base(bundle, store)?);
            }
        }
        let served: Vec<(&str, &str)> = release
            .bundles()
            .iter()
            .map(|b| (b.info.sha256.as_str(), b.platform.as_str()))
            .collect();
        let served_shas: Vec<&str> = served.iter().map(|(sha, _)| *sha).collect();
        for sha in bases_to_drop(&bases, &served_shas, KEEP_PER_PLATFORM) {
            let _ = fs::remove_file(self.bases_dir.join(format!("{sha}.base")));
            let _ = fs::remove_file(self.bases_dir.join(&sha));
            tracing::info!(
                "deltas: base {sha} dropped (only the {KEEP_PER_PLATFORM} most recent of a platform are kept)"
            );
            bases.retain(|b| b.sha256 != sha);
        }
        let pairs = plan(&served, &bases);
        self.remove_unwanted(&pairs);

        // Deltas made before (by this run, or an earlier one) are taken as they are. The
        // state stays as it was meanwhile, so requests are answered from it.
        let (ready, none, failed) = {
            let state = self.lock();
            (
                state.ready.clone(),
                state.none.clone(),
                state.failed.clone(),
            )
        };
        let mut next = State {
            bases,
            planned: Some(release.identity()),
            ..State::default()
        };
        let mut to_make = Vec::new();
        for pair in &pairs {
            if let Some(file) = ready.get(pair) {
                next.ready.insert(pair.clone(), Arc::clone(file));
            } else if let Some(line) = none.get(pair) {
                next.none.insert(pair.clone(), line.clone());
            } else if let Some(failure) = failed.get(pair) {
                next.failed.insert(pair.clone(), failure.clone());
            } else {
                match self.made_before(pair) {
                    Some(Outcome::Ready(file)) => {
                        next.ready.insert(pair.clone(), file);
                    }
                    Some(Outcome::NotWorth(line)) => {
                        next.none.insert(pair.clone(), line);
                    }
                    None => to_make.push(pair.clone()),
                }
            }
        }
        let mut state = self.lock();
        // Pairs agents asked for keep their place at the front.
        for pair in state.queue.iter().filter(|p| to_make.contains(p)) {
            if !next.queue.contains(pair) {
                next.queue.push_back(pair.clone());
            }
        }
        for pair in to_make {
            if !next.queue.contains(&pair) {
                next.queue.push_back(pair);
            }
        }
        next.making = state.making.take();
        *state = next;
        Ok(())
    }

    /// The bases on disk; a base without its record (a crash between the two) is removed.
    fn read_bases(&self) -> Vec<Base> {
        let mut bases = Vec::new();
        let Ok(entries) = fs::read_dir(&self.bases_dir) else {
            return bases;
        };
        let mut names: Vec<String> = entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        for name in &names {
            if let Some(sha) = name.strip_suffix(".base")
                && is_sha256(sha)
            {
                let record = fs::read_to_string(self.bases_dir.join(name))
                    .ok()
                    .and_then(|t| Properties::parse(&t).ok());
                let base = record.as_ref().and_then(|p| {
                    Some(Base {
                        sha256: sha.to_owned(),
                        platform: p.get("platform")?.to_owned(),
                        version: p.get("version").unwrap_or("?").to_owned(),
                        first_seen: p.get("first-seen")?.parse().ok()?,
                    })
                });
                match base {
                    Some(base) if names.iter().any(|n| n == sha) => bases.push(base),
                    _ => {
                        let _ = fs::remove_file(self.bases_dir.join(name));
                    }
                }
            } else if is_sha256(name) && !names.contains(&format!("{name}.base")) {
                let _ = fs::remove_file(self.bases_dir.join(name));
            }
        }
        bases
    }

    /// Copies a served bundle (its verified private bytes) into `bases/`, then its record.
    /// The copy is made file to file from the store's private copy where there is one
    /// (the kernel copies; the mapped bytes are not read into this process), else from
    /// the mapped bytes.
    fn keep_base(
        &self,
        bundle: &store::ServedBundle,
        store: Option<&BundleStore>,
    ) -> Result<Base, ReleaseError> {
        let sha = &bundle.info.sha256;
        let path = self.bases_dir.join(sha);
        let io = |e: std::io::Error| ReleaseError::Io(format!("{}: {e}", path.display()));
        let mut tmp = tempfile::Builder::new()
            .prefix(TEMP_PREFIX)
            .tempfile_in(&self.bases_dir)
            .map_err(io)?;
        let copied = store.is_some_and(|store| {
            fs::copy(store.private_copy(sha), tmp.path())
                .is_ok_and(|len| len == bundle.data.len() as u64)
        });
        if !copied {
            tmp.as_file_mut().set_len(0).map_err(io)?;
            tmp.write_all(&bundle.data).map_err(io)?;
        }
        tmp.as_file().sync_all().map_err(io)?;
        read_only(tmp.as_file());
        tmp.persist(&path).map_err(|e| io(e.error))?;
        let base = Base {
            sha256: sha.clone(),
            platform: bundle.platform.clone(),
            version: bundle.info.agent.to_string(),
            first_seen: SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        };
        let mut record = Properties::new();
        record.set("platform", &base.platform);
        record.set("version", &base.version);
        record.set("first-seen", &base.first_seen.to_string());
        let record_path = self.bases_dir.join(format!("{sha}.base"));
        agent_extract::atomic::write(&record_path, record.to_text().as_bytes())
            .map_err(|e| ReleaseError::Io(format!("{}: {e}", record_path.display())))?;
        tracing::info!(
            version = %base.version,
            platform = %base.platform,
            "deltas: kept {} as a base ({sha})",
            bundle.info.filename
        );
        Ok(base)
    }

    /// Removes deltas that no plan wants (their `to` is no longer served, or their base
    /// was dropped), and what memory holds of them.
    fn remove_unwanted(&self, wanted: &[Pair]) {
        let Ok(entries) = fs::read_dir(&self.root) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(pair) = Pair::of_file_name(&name)
                && !wanted.contains(&pair)
            {
                // A running answer keeps its map; only the name goes.
                let _ = fs::remove_file(entry.path());
            }
        }
    }

    /// A delta (or its `.none`) a run before this one made.
    fn made_before(&self, pair: &Pair) -> Option<Outcome> {
        if let Ok(line) = fs::read_to_string(self.root.join(pair.none_name())) {
            return Some(Outcome::NotWorth(line.trim().to_owned()));
        }
        let path = self.root.join(pair.delta_name());
        if !path.exists() {
            return None;
        }
        match load(&path) {
            Ok(file) => Some(Outcome::Ready(Arc::new(file))),
            Err(e) => {
                tracing::warn!("{e}; making it again");
                let _ = fs::remove_file(&path);
                None
            }
        }
    }

    /// Makes one delta. Blocking, and heavy: see the module's doc.
    fn make(&self, pair: &Pair) -> Result<Outcome, ReleaseError> {
        let (from_version, to_version) = {
            let state = self.lock();
            let version = |sha: &str| {
                state
                    .bases
                    .iter()
                    .find(|b| b.sha256 == sha)
                    .map_or_else(|| "?".to_owned(), |b| b.version.clone())
            };
            (version(&pair.from), version(&pair.to))
        };
        let old = self.bases_dir.join(&pair.from);
        let new = self.bases_dir.join(&pair.to);
        let started = Instant::now();
        let io =
            |path: &Path, e: std::io::Error| ReleaseError::Io(format!("{}: {e}", path.display()));
        let mut tmp = tempfile::Builder::new()
            .prefix(TEMP_PREFIX)
            .tempfile_in(&self.root)
            .map_err(|e| io(&self.root, e))?;
        let tmp_path = tmp.path().to_path_buf();
        let target = self.target(&pair.to, &new)?;
        let made = {
            let mut out = BufWriter::new(tmp.as_file_mut());
            let made = agent_delta::make::make_to(&old, &target, &mut out, Default::default())
                .map_err(|e| ReleaseError::Io(e.to_string()))?;
            out.flush().map_err(|e| io(&tmp_path, e))?;
            made
        };
        let took = started.elapsed();
        let pct = percent(made.size, made.bundle_size);
        if !worth_sending(made.size, made.bundle_size) {
            let line = not_worth_line(made.size, made.bundle_size);
            let path = self.root.join(pair.none_name());
            agent_extract::atomic::write(&path, format!("{line}\n").as_bytes())
                .map_err(|e| ReleaseError::Io(format!("{}: {e}", path.display())))?;
            tracing::info!(
                from = %from_version,
                to = %to_version,
                size = made.size,
                percent = format_args!("{pct:.1}"),
                took_ms = took.as_millis(),
                "delta from {from_version} to {to_version}: {} bytes, {pct:.1} % of the bundle, in {}; not worth sending (over {WORTH_PERCENT} %)",
                made.size,
                seconds(took),
            );
            return Ok(Outcome::NotWorth(line));
        }
        tmp.as_file().sync_all().map_err(|e| io(tmp.path(), e))?;
        read_only(tmp.as_file());
        let path = self.root.join(pair.delta_name());
        tmp.persist(&path).map_err(|e| io(&path, e.error))?;
        let file = load(&path)?;
        tracing::info!(
            from = %from_version,
            to = %to_version,
            size = made.size,
            percent = format_args!("{pct:.2}"),
            took_ms = took.as_millis(),
            "delta from {from_version} to {to_version}: {} bytes, {pct:.2} % of the {}-byte bundle, made in {}",
            made.size,
            made.bundle_size,
            seconds(took),
        );
        Ok(Outcome::Ready(Arc::new(file)))
    }
}

fn seconds(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// Maps a made delta and hashes it for its `ETag`.
fn load(path: &Path) -> Result<DeltaFile, ReleaseError> {
    let io = |e: std::io::Error| ReleaseError::Io(format!("{}: {e}", path.display()));
    let file = File::open(path).map_err(io)?;
    let last_modified = file.metadata().and_then(|m| m.modified()).map_err(io)?;
    let data = store::map(&file).map_err(io)?;
    let digests = Digests::of_reader(&data[..]).map_err(io)?;
    Ok(DeltaFile {
        etag: format!("\"{}\"", digests.sha256_hex()),
        data,
        last_modified,
    })
}

/// A made file is never written again: 0444 says so to anyone looking.
fn read_only(file: &File) {
    use std::os::unix::fs::PermissionsExt;
    let _ = file.set_permissions(fs::Permissions::from_mode(0o444));
}

/// Temp files a crash left behind.
fn remove_temps(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
            let _ = fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GNU: &str = "x86_64-unknown-linux-gnu";
    const ARM: &str = "aarch64-unknown-linux-gnu";

    fn sha(n: u8) -> String {
        format!("{:064x}", n)
    }

    fn base(n: u8, platform: &str, first_seen: u64) -> Base {
        Base {
            sha256: sha(n),
            platform: platform.into(),
            version: format!("1.0.{n}+{n}"),
            first_seen,
        }
    }

    #[test]
    fn the_four_most_recent_bases_of_each_platform_are_kept() {
        let bases: Vec<Base> = (1..=6)
            .map(|n| base(n, GNU, u64::from(n) * 10))
            .chain([base(20, ARM, 1), base(21, ARM, 2)])
            .collect();
        let mut dropped = bases_to_drop(&bases, &[], KEEP_PER_PLATFORM);
        dropped.sort();
        assert_eq!(
            dropped,
            [sha(1), sha(2)],
            "the oldest gnu ones; arm has two"
        );
        // A served base is kept even when old, and counts among the four.
        let served = sha(1);
        let mut dropped = bases_to_drop(&bases, &[served.as_str()], KEEP_PER_PLATFORM);
        dropped.sort();
        assert_eq!(dropped, [sha(2), sha(3)]);
        assert!(bases_to_drop(&bases[..4], &[], KEEP_PER_PLATFORM).is_empty());
    }

    #[test]
    fn deltas_are_planned_from_every_base_of_the_same_platform_newest_first() {
        let bases = [
            base(1, GNU, 10),
            base(2, GNU, 30),
            base(3, GNU, 40),
            base(4, ARM, 20),
        ];
        let to = sha(3);
        let arm_to = sha(9);
        let pairs = plan(&[(to.as_str(), GNU), (arm_to.as_str(), ARM)], &bases);
        assert_eq!(
            pairs,
            [
                Pair::new(&sha(2), &to),
                Pair::new(&sha(1), &to),
                Pair::new(&sha(4), &arm_to),
            ],
            "never from itself, never across platforms"
        );
    }

    #[test]
    fn delta_file_names_say_from_and_to() {
        let pair = Pair::new(&sha(1), &sha(2));
        assert_eq!(pair.delta_name(), format!("{}-{}.delta", sha(1), sha(2)));
        assert_eq!(Pair::of_file_name(&pair.delta_name()), Some(pair.clone()));
        assert_eq!(Pair::of_file_name(&pair.none_name()), Some(pair));
        for other in [
            "bases",
            ".making-abc",
            "x-y.delta",
            &format!("{}.delta", sha(1)),
            &format!("{}-{}.tmp", sha(1), sha(2)),
        ] {
            assert_eq!(Pair::of_file_name(other), None, "{other}");
        }
    }

    #[test]
    fn a_sha256_is_64_lowercase_hex_digits() {
        assert!(is_sha256(&sha(7)));
        assert!(!is_sha256(&sha(7)[1..]));
        assert!(!is_sha256(&sha(7).to_uppercase().replace('0', "A")));
        assert!(!is_sha256(&format!("{}g", &sha(7)[1..])));
        assert!(!is_sha256(""));
    }

    #[test]
    fn a_failed_delta_waits_longer_after_each_failure_up_to_a_cap() {
        let first = Duration::from_secs(30);
        assert_eq!(retry_wait(1, first), first);
        assert_eq!(retry_wait(2, first), first * 2);
        assert_eq!(retry_wait(3, first), first * 4);
        assert_eq!(retry_wait(20, first), RETRY_MAX);
        assert_eq!(retry_wait(u32::MAX, first), RETRY_MAX, "no overflow");
        let failure = Failure {
            failures: 2,
            at: Instant::now(),
        };
        assert!(!failure.due(failure.at + Duration::from_secs(59), first));
        assert!(failure.due(failure.at + Duration::from_secs(60), first));
    }

    /// Bundles packed as the packer packs them, each with its own program.
    fn bundles(dir: &Path, versions: &[&str]) -> Vec<PathBuf> {
        let key = agent_protocol::minisign::SecretKey::generate().expect("key");
        versions
            .iter()
            .enumerate()
            .map(|(i, version)| {
                let dist = dir.join(format!("dist-{i}"));
                fs::create_dir_all(dist.join("bin")).expect("bin");
                let program: Vec<u8> = (0..200_000u32)
                    .map(|n| (n.wrapping_mul(2_654_435_761) >> 13) as u8 ^ (i as u8))
                    .collect();
                fs::write(dist.join("bin/program"), program).expect("program");
                fs::write(
                    dist.join("bin/agent"),
                    format!("#!/bin/sh\necho {version}\n"),
                )
                .expect("agent");
                fs::write(dist.join("README.txt"), "readme\n").expect("readme");
                fs::write(dist.join("LICENSE"), "license\n").expect("license");
                agent_bundle::pack::pack(&agent_bundle::pack::PackRequest {
                    dist: &dist,
                    version: agent_protocol::AgentVersion::new(version, "1").expect("version"),
                    platform: GNU.to_owned(),
                    key: &key,
                    out_dir: &dir.join(format!("out-{i}")),
                    stub: Path::new("/bin/true"),
                    signed_at: Some(1_700_000_000),
                    rotations: &[],
                    allow_other_key: false,
                })
                .expect("pack")
                .bundle
            })
            .collect()
    }

    /// Puts `bundle` under `bases/` with its record, as the worker keeps one; returns its
    /// sha256.
    fn keep(deltas_home: &Path, bundle: &Path, first_seen: u64) -> String {
        let bytes = fs::read(bundle).expect("bundle");
        let sha = Digests::of_reader(&bytes[..]).expect("hash").sha256_hex();
        let bases = deltas_home.join("deltas/bases");
        fs::create_dir_all(&bases).expect("bases");
        fs::write(bases.join(&sha), &bytes).expect("base");
        fs::write(
            bases.join(format!("{sha}.base")),
            format!("platform={GNU}\nversion=x\nfirst-seen={first_seen}\n"),
        )
        .expect("record");
        sha
    }

    /// Runs the worker's queue to its end, as its loop does.
    fn run_queue(deltas: &Deltas) {
        while let Some(pair) = deltas.next_job() {
            let result = deltas.make(&pair);
            deltas.finish(pair, result);
        }
    }

    fn deltas_in(home: &Path) -> Deltas {
        Deltas::new(home, Arc::default()).expect("deltas")
    }

    #[test]
    fn the_served_bundle_is_taken_apart_once_for_the_deltas_from_every_base() {
        let dir = tempfile::tempdir().expect("tempdir");
        let made = bundles(dir.path(), &["1.0.0", "1.1.0", "2.0.0"]);
        let home = dir.path().join("home");
        let one = keep(&home, &made[0], 1);
        let two = keep(&home, &made[1], 2);
        let to = keep(&home, &made[2], 3);
        let deltas = deltas_in(&home);
        for from in [&one, &two] {
            assert!(matches!(deltas.lookup(from, &to, GNU), Lookup::Making));
        }
        run_queue(&deltas);
        for from in [&one, &two] {
            assert!(
                matches!(deltas.lookup(from, &to, GNU), Lookup::Ready(_)),
                "{:?}",
                deltas.lookup(from, &to, GNU)
            );
        }
        assert_eq!(
            deltas
                .taken_apart
                .load(std::sync::atomic::Ordering::Relaxed),
            1,
            "two deltas to one bundle take it apart once"
        );
        assert!(
            deltas.target.lock().expect("target").is_none(),
            "its parts are let go once no delta to it waits"
        );
    }

    #[test]
    fn a_delta_that_failed_is_made_again_after_its_wait_without_a_restart() {
        let dir = tempfile::tempdir().expect("tempdir");
        let made = bundles(dir.path(), &["1.0.0", "2.0.0"]);
        let home = dir.path().join("home");
        let from = keep(&home, &made[0], 1);
        let to = keep(&home, &made[1], 2);
        // The base's bytes are unreadable for the first attempt (a disk error, say).
        let base = home.join("deltas/bases").join(&from);
        fs::write(&base, b"not a bundle").expect("damage");
        let mut deltas = deltas_in(&home);
        deltas.retry_first = Duration::from_secs(60);
        assert!(matches!(deltas.lookup(&from, &to, GNU), Lookup::Making));
        run_queue(&deltas);
        assert!(matches!(deltas.lookup(&from, &to, GNU), Lookup::Failed));
        assert!(
            !deltas.requeue_failed(Instant::now()),
            "not again before its wait"
        );

        // Its wait over, the worker makes it again by itself; it fails again, and waits
        // twice as long.
        assert!(deltas.requeue_failed(Instant::now() + Duration::from_secs(60)));
        run_queue(&deltas);
        assert!(matches!(deltas.lookup(&from, &to, GNU), Lookup::Failed));
        let failures = deltas.lock().failed.values().map(|f| f.failures).max();
        assert_eq!(failures, Some(2));
        assert!(!deltas.requeue_failed(Instant::now() + Duration::from_secs(60)));

        // Repaired, and its wait over: an agent asking queues it at once.
        fs::copy(&made[0], &base).expect("repair");
        deltas.retry_first = Duration::ZERO;
        assert!(matches!(deltas.lookup(&from, &to, GNU), Lookup::Making));
        run_queue(&deltas);
        assert!(
            matches!(deltas.lookup(&from, &to, GNU), Lookup::Ready(_)),
            "{:?}",
            deltas.lookup(&from, &to, GNU)
        );
        assert!(deltas.lock().failed.is_empty());
    }

    #[test]
    fn a_delta_over_half_the_bundle_is_not_worth_sending() {
        assert!(worth_sending(0, 100));
        assert!(worth_sending(50, 100));
        assert!(!worth_sending(51, 100));
        assert!(!worth_sending(1, 0));
        assert!(worth_sending(u64::MAX / 2, u64::MAX), "no overflow");
        assert_eq!(
            not_worth_line(60, 100),
            "not worth sending: 60 bytes, 60.0 % of the bundle (over 50 %)"
        );
    }
}
