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
//! Making one reads both bundles whole and runs bsdiff on changed files (see
//! [`agent_delta::make`]): about 135 MB and 1–2 s for two 13 MB bundles, so one is made at
//! a time, on a blocking thread. It decides nothing about who may download: the route
//! ([`crate::routes`]) answers under the download limit.

use std::collections::{HashMap, VecDeque};
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use agent_protocol::digest::Digests;
use agent_protocol::properties::Properties;
use bytes::Bytes;

use crate::error::ServerError;
use crate::metrics::{Metrics, inc};
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

#[derive(Debug, Default)]
struct State {
    bases: Vec<Base>,
    /// The release identity last planned for.
    planned: Option<String>,
    queue: VecDeque<Pair>,
    making: Option<Pair>,
    ready: HashMap<Pair, Arc<DeltaFile>>,
    none: HashMap<Pair, String>,
    failed: HashMap<Pair, String>,
}

/// The bases, the deltas and the worker's queue.
pub struct Deltas {
    root: PathBuf,
    bases_dir: PathBuf,
    state: Mutex<State>,
    wake: tokio::sync::Notify,
    metrics: Arc<Metrics>,
}

/// What one job of the worker came to.
enum Outcome {
    Ready(Arc<DeltaFile>),
    NotWorth(String),
}

impl Deltas {
    /// The deltas under `<home>/deltas`; the directories are made if missing.
    pub fn new(home: &Path, metrics: Arc<Metrics>) -> Result<Self, ServerError> {
        let root = home.join("deltas");
        let bases_dir = root.join("bases");
        fs::create_dir_all(&bases_dir)
            .map_err(|e| ServerError::Io(format!("{}: {e}", bases_dir.display())))?;
        let me = Self {
            root,
            bases_dir,
            state: Mutex::new(State::default()),
            wake: tokio::sync::Notify::new(),
            metrics,
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
        if state.failed.contains_key(&pair) {
            return Lookup::Failed;
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
                    let done = tokio::task::spawn_blocking(move || worker.refresh(&release)).await;
                    match done {
                        Ok(Err(e)) if e.to_string() != last_error => {
                            tracing::error!("deltas: {e}; trying again each second");
                            last_error = e.to_string();
                        }
                        Ok(Ok(())) => last_error.clear(),
                        _ => {}
                    }
                }
                if let Some(pair) = me.next_job() {
                    let worker = Arc::clone(&me);
                    let job = pair.clone();
                    let done = tokio::task::spawn_blocking(move || worker.make(&job)).await;
                    let result = done.unwrap_or_else(|e| {
                        Err(ServerError::Io(format!("the delta maker stopped: {e}")))
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

    fn next_job(&self) -> Option<Pair> {
        let mut state = self.lock();
        let pair = state.queue.pop_front()?;
        state.making = Some(pair.clone());
        Some(pair)
    }

    fn finish(&self, pair: Pair, result: Result<Outcome, ServerError>) {
        let mut state = self.lock();
        state.making = None;
        match result {
            Ok(Outcome::Ready(file)) => {
                inc(&self.metrics.deltas_made);
                state.ready.insert(pair, file);
            }
            Ok(Outcome::NotWorth(line)) => {
                inc(&self.metrics.deltas_not_worth);
                state.none.insert(pair, line);
            }
            Err(e) => {
                inc(&self.metrics.deltas_failed);
                tracing::error!(
                    from = %pair.from,
                    to = %pair.to,
                    "cannot make the delta: {e}; agents asking for it download the bundle"
                );
                state.failed.insert(pair, e.to_string());
            }
        }
    }

    /// Keeps the served bundles as bases, drops old bases and deltas no longer wanted,
    /// and plans the deltas of `release`. Blocking.
    fn refresh(&self, release: &Release) -> Result<(), ServerError> {
        let first = self.lock().planned.is_none();
        if first {
            remove_temps(&self.root);
            remove_temps(&self.bases_dir);
        }
        let mut bases = self.read_bases();
        for bundle in release.bundles() {
            if !bases.iter().any(|b| b.sha256 == bundle.info.sha256) {
                bases.push(self.keep_base(bundle)?);
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
            } else if let Some(why) = failed.get(pair) {
                next.failed.insert(pair.clone(), why.clone());
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
    fn keep_base(&self, bundle: &store::ServedBundle) -> Result<Base, ServerError> {
        let sha = &bundle.info.sha256;
        let path = self.bases_dir.join(sha);
        let io = |e: std::io::Error| ServerError::Io(format!("{}: {e}", path.display()));
        let mut tmp = tempfile::Builder::new()
            .prefix(TEMP_PREFIX)
            .tempfile_in(&self.bases_dir)
            .map_err(io)?;
        tmp.write_all(&bundle.data).map_err(io)?;
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
            .map_err(|e| ServerError::Io(format!("{}: {e}", record_path.display())))?;
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
    fn make(&self, pair: &Pair) -> Result<Outcome, ServerError> {
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
            |path: &Path, e: std::io::Error| ServerError::Io(format!("{}: {e}", path.display()));
        let mut tmp = tempfile::Builder::new()
            .prefix(TEMP_PREFIX)
            .tempfile_in(&self.root)
            .map_err(|e| io(&self.root, e))?;
        let tmp_path = tmp.path().to_path_buf();
        let made = {
            let mut out = BufWriter::new(tmp.as_file_mut());
            let made = agent_delta::make::make(&old, &new, &mut out, Default::default())
                .map_err(|e| ServerError::Io(e.to_string()))?;
            out.flush().map_err(|e| io(&tmp_path, e))?;
            made
        };
        let took = started.elapsed();
        let pct = percent(made.size, made.bundle_size);
        if !worth_sending(made.size, made.bundle_size) {
            let line = not_worth_line(made.size, made.bundle_size);
            let path = self.root.join(pair.none_name());
            agent_extract::atomic::write(&path, format!("{line}\n").as_bytes())
                .map_err(|e| ServerError::Io(format!("{}: {e}", path.display())))?;
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
fn load(path: &Path) -> Result<DeltaFile, ServerError> {
    let io = |e: std::io::Error| ServerError::Io(format!("{}: {e}", path.display()));
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
