//! The bundle store: the one release this server serves.
//!
//! The operator drops a release into the download directory: `agent-bundle-V-<target>`
//! (and its `.minisig`) per platform, or a lone `agent-bundle-V` (a release of the one
//! platform its properties name), and the Windows MSI `agent-V-<target>.msi` with its
//! `.minisig` when the release carries one. A scan, every second, notices a change and hands it
//! over as [`Dropped`]: it is a publish like any other, checked and recorded in the
//! release history first ([`crate::publish`]), and nothing of it is served until then.
//! A release taken (published, followed, or a hand drop that passed) is ingested, each
//! changed bundle into a private, read-only copy under `<home>/cache/`, hashed in the
//! same pass; the copy is memory-mapped and served from there. The bundles' own
//! properties say what they are: bundles of different versions or builds, or two for
//! one platform, are no release, and nothing is served until the operator fixes it. An operator's later `cp` over the dropped file
//! cannot change bytes under a running download: running downloads keep their map of
//! the old copy until they end.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use agent_extract::atomic;
use agent_extract::payload::Payload;
use agent_extract::verify::{self, Trust};
use agent_protocol::AgentVersion;
use agent_protocol::digest::MultiHasher;
use agent_protocol::minisign::{PublicKey, Signature};
use agent_protocol::properties::Properties;
use agent_protocol::wire::VersionInfo;
use agent_protocol::{layout, platform};
use bytes::Bytes;

/// The version cache, beside the bundle in the download directory.
pub const VERSION_CACHE: &str = "server-agent-versions.properties";

/// A bundle ready to serve.
#[derive(Debug)]
pub struct ServedBundle {
    pub info: VersionInfo,
    /// The platform (target triple) its properties name.
    pub platform: String,
    pub data: Bytes,
    pub signature: Option<String>,
    pub last_modified: SystemTime,
    /// Quoted sha256, as sent in `ETag`.
    pub etag: String,
}

impl ServedBundle {
    pub fn version(&self) -> &AgentVersion {
        &self.info.agent
    }
}

/// A release's Windows MSI, ready to serve at `/agentupdate/agent.msi`.
#[derive(Debug)]
pub struct ServedMsi {
    /// `agent-<version>-<target>.msi`.
    pub filename: String,
    /// The Windows platform of the bundle it installs.
    pub platform: String,
    /// The release it was signed for.
    pub version: AgentVersion,
    pub sha256: String,
    pub data: Bytes,
    pub signature: String,
    pub last_modified: SystemTime,
    /// Quoted sha256, as sent in `ETag`.
    pub etag: String,
}

/// One version and build for one or several platforms: what the server serves.
#[derive(Debug)]
pub struct Release {
    /// Its primary bundle first (see [`Release::assemble`]), then by platform.
    bundles: Vec<Arc<ServedBundle>>,
    /// Its Windows MSI, if it carries one ([`Release::with_msi`]).
    msi: Option<Arc<ServedMsi>>,
    /// Each bundle's `/agentupdate/version` answer, made at its first request: the most
    /// asked question of a fleet costs a copy of a few hundred bytes, not a properties
    /// map built, filled and printed every time.
    version_texts: Vec<std::sync::OnceLock<Bytes>>,
}

impl Release {
    /// The bundles of one release: one version and build, one bundle per platform.
    /// The primary bundle (whose facts a plain `/agentupdate/version` answers) is the
    /// one for `own` (the server's own platform) if there is one, else the first by
    /// platform.
    pub fn assemble(mut bundles: Vec<Arc<ServedBundle>>, own: &str) -> Result<Self, String> {
        bundles.sort_by(|a, b| {
            (a.platform != own, &a.platform).cmp(&(b.platform != own, &b.platform))
        });
        let Some(first) = bundles.first() else {
            return Err("no bundle".into());
        };
        let describe = |b: &ServedBundle| {
            format!("{} is {} for {}", b.info.filename, b.info.agent, b.platform)
        };
        if let Some(other) = bundles.iter().find(|b| b.info.agent != first.info.agent) {
            return Err(format!(
                "bundles of different versions side by side ({}; {}): a release is one version and build; remove all but one release",
                describe(first),
                describe(other)
            ));
        }
        if let Some(pair) = bundles.windows(2).find(|w| w[0].platform == w[1].platform) {
            return Err(format!(
                "two bundles for one platform ({}; {}): remove one of them",
                describe(&pair[0]),
                describe(&pair[1])
            ));
        }
        let version_texts = bundles.iter().map(|_| std::sync::OnceLock::new()).collect();
        Ok(Self {
            bundles,
            msi: None,
            version_texts,
        })
    }

    /// The release with its Windows MSI: one signed for this version and build, for a
    /// platform it has a bundle of.
    pub fn with_msi(mut self, msi: Arc<ServedMsi>) -> Result<Self, String> {
        if msi.version != *self.version() {
            return Err(format!(
                "{} is the MSI of {}, beside bundles of {}: a release is one version and build; remove the other release's MSI",
                msi.filename,
                msi.version,
                self.version()
            ));
        }
        if !self.bundles.iter().any(|b| b.platform == msi.platform) {
            return Err(format!(
                "{} installs {}'s bundle, which is not beside it: put the Windows bundle it was built from with it",
                msi.filename, msi.platform
            ));
        }
        self.msi = Some(msi);
        Ok(self)
    }

    /// Its Windows MSI, if it carries one.
    pub fn msi(&self) -> Option<&Arc<ServedMsi>> {
        self.msi.as_ref()
    }

    /// The `/agentupdate/version` answer for `bundle` (one of this release's), naming
    /// `source` as where its bytes may be fetched. The server's source never changes
    /// while it runs, so the text is made once.
    pub fn version_text(&self, bundle: &Arc<ServedBundle>, source: Option<&str>) -> Bytes {
        let make = || {
            let mut props = bundle.info.to_properties();
            if let Some(source) = source {
                props.set(agent_protocol::wire::PROP_DOWNLOAD_SOURCE, source);
            }
            props.set(
                agent_protocol::layout::PROP_LATEST_PLATFORM,
                &bundle.platform,
            );
            props.set(
                agent_protocol::wire::PROP_LATEST_PLATFORMS,
                &self.platforms().join(","),
            );
            Bytes::from(props.to_text())
        };
        match self.bundles.iter().position(|b| Arc::ptr_eq(b, bundle)) {
            Some(i) => self.version_texts[i].get_or_init(make).clone(),
            None => make(),
        }
    }

    /// The bundle a plain `/agentupdate/version` describes.
    pub fn primary(&self) -> &Arc<ServedBundle> {
        // `assemble` never makes an empty release.
        &self.bundles[0]
    }

    pub fn bundles(&self) -> &[Arc<ServedBundle>] {
        &self.bundles
    }

    pub fn version(&self) -> &AgentVersion {
        self.primary().version()
    }

    /// Its platforms, sorted.
    pub fn platforms(&self) -> Vec<&str> {
        let mut all: Vec<&str> = self.bundles.iter().map(|b| b.platform.as_str()).collect();
        all.sort_unstable();
        all
    }

    /// Whether it is a release of one bundle (served as a server always served one).
    pub fn is_single(&self) -> bool {
        self.bundles.len() == 1
    }

    /// The bundle a machine of `platform` runs: its own, else the static musl one of its
    /// architecture, else none ([`platform::choose`]).
    pub fn for_platform(&self, machine: &str) -> Option<&Arc<ServedBundle>> {
        let platforms: Vec<&str> = self.bundles.iter().map(|b| b.platform.as_str()).collect();
        let chosen = platform::choose(&platforms, machine)?;
        self.bundles.iter().find(|b| b.platform == *chosen)
    }

    /// What the rollout engine knows the release by: the sha256 of its bundle when it
    /// has one (as before releases had several), else the sha256 over each bundle's
    /// `<platform> <sha256>` line, so that a change to any one of them is a new rollout.
    pub fn identity(&self) -> String {
        identity_of(
            self.bundles
                .iter()
                .map(|b| (b.platform.as_str(), b.info.sha256.as_str())),
        )
    }
}

/// A release's identity from its bundles' platforms and sha256 (see [`Release::identity`]).
pub fn identity_of<'a>(bundles: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let bundles: Vec<(&str, &str)> = bundles.into_iter().collect();
    if let [(_, sha256)] = bundles.as_slice() {
        return (*sha256).to_owned();
    }
    let mut lines: Vec<String> = bundles
        .iter()
        .map(|(platform, sha256)| format!("{platform} {sha256}\n"))
        .collect();
    lines.sort();
    let mut hasher = MultiHasher::new();
    hasher.update(lines.concat().as_bytes());
    hasher.finish().sha256_hex()
}

/// What the store can serve right now.
#[derive(Debug, Clone)]
pub enum Current {
    Ready(Arc<Release>),
    Unavailable(Problem),
}

/// Why nothing is served: what any client may be told (no paths, no names of files
/// under the server's home), and the detail for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub public: String,
    pub detail: String,
}

impl Problem {
    fn new(public: &str, detail: String) -> Self {
        Self {
            public: public.to_owned(),
            detail,
        }
    }
}

/// What a look at the download directory found.
enum Look {
    /// The bundles of the directory, by name.
    Found(Vec<SourceId>),
    /// The directory says there is nothing to serve (none, or several).
    Nothing(Problem),
    /// The directory could not be read just now (out of descriptors, say): this says
    /// nothing about the bundle, which stays served if it was.
    Failed(String),
}

/// Why a bundle could not be taken in.
enum Refused {
    /// Its content: said once, and not tried again until the file changes.
    Content(String),
    /// Reading or copying it failed: tried again at the next scan.
    Io(String),
}

/// What the download directory holds that the store has not taken: a release put there
/// by hand (or the server's own, found again at start). Nothing of it is served until
/// the publisher has checked it and the store takes it ([`BundleStore::take_now`]), or
/// it is refused ([`BundleStore::refuse`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    /// The bundles' names and those of the signatures beside them, sorted.
    pub names: Vec<String>,
    sources: Vec<SourceId>,
}

impl Dropped {
    fn of(sources: Vec<SourceId>) -> Self {
        let mut names = Vec::with_capacity(sources.len() * 2);
        for source in &sources {
            let Some(name) = source.path.file_name().map(|n| n.to_string_lossy()) else {
                continue;
            };
            if source.signature_mtime.is_some() {
                names.push(layout::signature_file_name(&name));
            }
            names.push(name.into_owned());
        }
        names.sort();
        Self { names, sources }
    }
}

/// Identity of the dropped files, to notice when they change.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SourceId {
    path: PathBuf,
    size: u64,
    mtime: i64,
    mtime_nsec: i64,
    ino: u64,
    signature_mtime: Option<(i64, i64)>,
}

impl SourceId {
    /// Whether it is the release's MSI, not a bundle.
    fn is_msi(&self) -> bool {
        self.path
            .file_name()
            .is_some_and(|n| layout::is_msi_file_name(&n.to_string_lossy()))
    }
}

pub struct BundleStore {
    dir: PathBuf,
    cache_dir: PathBuf,
    public_key: Option<PublicKey>,
    server_version: String,
    server_build: String,
    current: RwLock<Current>,
    /// The files last looked at (served, or refused for their content).
    source: RwLock<Option<Vec<SourceId>>>,
    /// The bundles taken in, by their files, so an unchanged one is not read again.
    ingested: RwLock<Vec<(SourceId, Arc<ServedBundle>)>>,
    /// The MSI taken in, likewise.
    ingested_msi: RwLock<Option<(SourceId, Arc<ServedMsi>)>>,
    last_problem: RwLock<Option<String>>,
    /// Why the bundle in the download directory is not served, until one is: what
    /// `/healthz` calls degraded.
    refused: RwLock<Option<String>>,
    /// A change of the download directory seen, and since when it has held still: a
    /// release copied in file by file is taken once whole, never half.
    settling: std::sync::Mutex<Option<(Option<Vec<SourceId>>, std::time::Instant)>>,
    /// Held by a scan, and by a publish while it writes the directory.
    scanning: std::sync::Mutex<()>,
    scanned_once: std::sync::atomic::AtomicBool,
}

/// How long the download directory must hold still before a change to it is taken.
pub const SETTLE: std::time::Duration = std::time::Duration::from_secs(1);

impl BundleStore {
    pub fn new(dir: PathBuf, home: &Path, public_key: Option<PublicKey>) -> io::Result<Self> {
        let cache_dir = home.join("cache");
        fs::create_dir_all(&dir)?;
        fs::create_dir_all(&cache_dir)?;
        Ok(Self {
            dir,
            cache_dir,
            public_key,
            server_version: env!("CARGO_PKG_VERSION").to_owned(),
            server_build: option_env!("UPDATE_SERVER_BUILD").unwrap_or("0").to_owned(),
            current: RwLock::new(Current::Unavailable(Problem::new(
                "the server is starting; retry shortly",
                "the bundle store has not been scanned yet".into(),
            ))),
            source: RwLock::new(None),
            ingested: RwLock::new(Vec::new()),
            ingested_msi: RwLock::new(None),
            last_problem: RwLock::new(None),
            refused: RwLock::new(None),
            settling: std::sync::Mutex::new(None),
            scanning: std::sync::Mutex::new(()),
            scanned_once: std::sync::atomic::AtomicBool::new(false),
        })
    }

    pub fn current(&self) -> Current {
        match self.current.read() {
            Ok(c) => c.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// This server's private, write-once copy of the served bundle `sha256` (what its
    /// bytes are mapped from).
    pub fn private_copy(&self, sha256: &str) -> PathBuf {
        self.cache_dir.join(format!("bundle-{sha256}"))
    }

    /// Where this server's private copies of bundles live (`<home>/cache`).
    pub fn cache_dir(&self) -> &Path {
        &self.cache_dir
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Why the bundle the operator put in the download directory is refused (its
    /// signature, its facts, a second release beside it), while it is.
    pub fn refusal(&self) -> Option<String> {
        self.refused
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn set_refusal(&self, why: Option<String>) {
        *self.refused.write().unwrap_or_else(|p| p.into_inner()) = why;
    }

    /// Looks at the download directory: a change that has held still for [`SETTLE`] (at
    /// once on the first scan) is handed over, not taken; an emptied directory serves
    /// nothing. Blocking: call from a blocking thread.
    pub fn scan(&self) -> Option<Dropped> {
        let _scanning = self.scanning.lock().unwrap_or_else(|p| p.into_inner());
        self.scan_locked(false)
    }

    /// Whether the download directory still holds `dropped`, not taken: a publish may
    /// have replaced it meanwhile.
    pub fn holds(&self, dropped: &Dropped) -> bool {
        let _scanning = self.scanning.lock().unwrap_or_else(|p| p.into_inner());
        let taken = self
            .source
            .read()
            .map(|s| s.as_ref() == Some(&dropped.sources))
            .unwrap_or(false);
        !taken && matches!(self.look(), Look::Found(sources) if sources == dropped.sources)
    }

    /// Refuses what was dropped, for `why`: said in the log and in `/healthz` (which
    /// reports degraded), and not looked at again until a file of it changes. What was
    /// served goes on being served.
    pub fn refuse(&self, dropped: &Dropped, why: &str) {
        let _scanning = self.scanning.lock().unwrap_or_else(|p| p.into_inner());
        self.set_source(Some(dropped.sources.clone()));
        let dropped_into = format!(
            "the release dropped into {} by hand is not served",
            self.dir.display()
        );
        let detail = match self.current() {
            Current::Ready(release) => format!(
                "{dropped_into}: {why}; still serving {} ({})",
                release.version(),
                release.primary().info.filename
            ),
            Current::Unavailable(_) => format!("{dropped_into}: {why}; nothing is served"),
        };
        self.set_refusal(Some(detail.clone()));
        match self.current() {
            Current::Ready(_) => self.log_problem(detail),
            Current::Unavailable(_) => self.set(Current::Unavailable(Problem::new(
                "the release in the download directory is refused: the operator must fix it (the server's log and /healthz say why)",
                detail,
            ))),
        }
    }

    /// Holds off scans while the caller writes a whole release into the download
    /// directory; [`Self::take_now`] then takes it with the guard still held.
    pub fn hold(&self) -> std::sync::MutexGuard<'_, ()> {
        self.scanning.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes what the download directory holds now, without waiting for it to settle:
    /// for a writer that holds [`Self::hold`] and has just put a whole release there.
    pub fn take_now(&self, _held: &std::sync::MutexGuard<'_, ()>) {
        self.scan_locked(true);
    }

    /// With `take`, ingests what the directory holds and serves it; without, hands a
    /// settled change over instead.
    fn scan_locked(&self, take: bool) -> Option<Dropped> {
        let looked = self.look();
        let first = !self
            .scanned_once
            .swap(true, std::sync::atomic::Ordering::AcqRel);
        if !take && !first && !self.settled(&looked) {
            return None;
        }
        let sources = match looked {
            Look::Found(sources) => sources,
            Look::Nothing(problem) => {
                self.set_source(None);
                self.set_refusal(None);
                self.set(Current::Unavailable(problem));
                return None;
            }
            Look::Failed(detail) => {
                match self.current() {
                    Current::Ready(release) => self.log_problem(format!(
                        "{detail}; still serving {}",
                        release.primary().info.filename
                    )),
                    Current::Unavailable(_) => self.set(Current::Unavailable(Problem::new(
                        "the bundle cannot be read just now; retry later",
                        detail,
                    ))),
                }
                return None;
            }
        };
        let unchanged = self
            .source
            .read()
            .map(|s| s.as_ref() == Some(&sources))
            .unwrap_or(false);
        if unchanged {
            return None;
        }
        if !take {
            return Some(Dropped::of(sources));
        }
        let known = self.ingested.read().map(|i| i.clone()).unwrap_or_default();
        let known_msi = self
            .ingested_msi
            .read()
            .map(|i| i.clone())
            .unwrap_or_default();
        let mut taken = Vec::with_capacity(sources.len());
        let mut msi = None;
        for source in &sources {
            let ingested = if source.is_msi() {
                match &known_msi {
                    Some((s, served)) if s == source => Ok(Arc::clone(served)),
                    _ => self.ingest_msi(source).map(Arc::new),
                }
                .map(|served| msi = Some((source.clone(), served)))
            } else if let Some((_, bundle)) = known.iter().find(|(s, _)| s == source) {
                taken.push((source.clone(), Arc::clone(bundle)));
                Ok(())
            } else {
                self.ingest(source)
                    .map(|bundle| taken.push((source.clone(), Arc::new(bundle))))
            };
            match ingested {
                Ok(()) => {}
                Err(refused) => {
                    let detail = match refused {
                        Refused::Content(detail) => {
                            // Not read again until a file changes.
                            self.set_source(Some(sources.clone()));
                            self.set_refusal(Some(detail.clone()));
                            detail
                        }
                        Refused::Io(detail) => detail,
                    };
                    // Keep serving what was good; say once what is wrong with the new file.
                    if matches!(self.current(), Current::Unavailable(_)) {
                        self.set(Current::Unavailable(Problem::new(
                            "the bundle in the download directory cannot be served; the operator must fix it (the server's log says why)",
                            detail.clone(),
                        )));
                    }
                    self.log_problem(detail);
                    return None;
                }
            }
        }
        *self.ingested.write().unwrap_or_else(|p| p.into_inner()) = taken.clone();
        *self.ingested_msi.write().unwrap_or_else(|p| p.into_inner()) = msi.clone();
        self.set_source(Some(sources));
        let bundles = taken.into_iter().map(|(_, b)| b).collect();
        let assembled =
            Release::assemble(bundles, layout::PLATFORM).and_then(|release| match msi {
                Some((_, msi)) => release.with_msi(msi),
                None => Ok(release),
            });
        let release = match assembled {
            Ok(release) => release,
            Err(why) => {
                let detail = format!("{why} (in {})", self.dir.display());
                self.set_refusal(Some(detail.clone()));
                self.set(Current::Unavailable(Problem::new(
                    "the download directory holds no single release: the operator must leave one version and build, one bundle per platform",
                    detail,
                )));
                return None;
            }
        };
        for bundle in release.bundles() {
            tracing::info!(
                version = %bundle.info.agent,
                platform = %bundle.platform,
                sha256 = %bundle.info.sha256,
                size = bundle.info.size,
                "serving {}",
                bundle.info.filename
            );
        }
        let keep: Vec<PathBuf> = release
            .bundles()
            .iter()
            .map(|b| self.cache_dir.join(format!("bundle-{}", b.info.sha256)))
            .chain(
                release
                    .msi()
                    .map(|m| self.cache_dir.join(format!("msi-{}", m.sha256))),
            )
            .collect();
        self.remove_stale_copies(&keep);
        self.write_cache(&release);
        *self.last_problem.write().unwrap_or_else(|p| p.into_inner()) = None;
        self.set_refusal(None);
        self.set(Current::Ready(Arc::new(release)));
        None
    }

    /// Whether what `looked` found is what was last taken, or has held still for
    /// [`SETTLE`].
    fn settled(&self, looked: &Look) -> bool {
        let seen = match looked {
            Look::Found(sources) => Some(sources.clone()),
            Look::Nothing(_) => None,
            Look::Failed(_) => return true,
        };
        let taken = self.source.read().map(|s| s.clone()).unwrap_or_default();
        let mut settling = self.settling.lock().unwrap_or_else(|p| p.into_inner());
        if seen == taken {
            *settling = None;
            return true;
        }
        match settling.as_ref() {
            Some((pending, since)) if *pending == seen => since.elapsed() >= SETTLE,
            _ => {
                *settling = Some((seen, std::time::Instant::now()));
                false
            }
        }
    }

    fn set(&self, current: Current) {
        if let Current::Unavailable(problem) = &current {
            self.log_problem(problem.detail.clone());
        }
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = current;
    }

    fn set_source(&self, source: Option<Vec<SourceId>>) {
        *self.source.write().unwrap_or_else(|p| p.into_inner()) = source;
    }

    fn log_problem(&self, problem: String) {
        let mut last = self.last_problem.write().unwrap_or_else(|p| p.into_inner());
        if last.as_deref() != Some(problem.as_str()) {
            tracing::error!("{problem}");
            *last = Some(problem);
        }
    }

    fn look(&self) -> Look {
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) => {
                return Look::Failed(format!(
                    "cannot read the download directory {}: {e}",
                    self.dir.display()
                ));
            }
        };
        let mut bundles = Vec::new();
        let mut msis = Vec::new();
        for entry in entries {
            let entry = match entry {
                Ok(e) => e,
                Err(e) => {
                    return Look::Failed(format!(
                        "cannot list the download directory {}: {e}",
                        self.dir.display()
                    ));
                }
            };
            let name = entry.file_name().to_string_lossy().into_owned();
            let is_file = entry.file_type().map(|t| t.is_file()).unwrap_or(false);
            if name.starts_with("agent-bundle-") && !name.ends_with(".minisig") && is_file {
                bundles.push(name);
            } else if layout::is_msi_file_name(&name) && is_file {
                msis.push(name);
            }
        }
        bundles.sort();
        // An MSI alone is nothing to serve; beside bundles it is one more file of their
        // release, checked with them.
        if !bundles.is_empty() {
            msis.sort();
            bundles.extend(msis);
        }
        match bundles.as_slice() {
            [] => Look::Nothing(Problem::new(
                "no bundle to serve yet: the operator must drop agent-bundle-<version> and its .minisig into the server's download directory",
                format!(
                    "no bundle to serve: drop agent-bundle-<version> and its .minisig into {}",
                    self.dir.display()
                ),
            )),
            names => {
                let mut sources = Vec::with_capacity(names.len());
                for name in names {
                    let path = self.dir.join(name);
                    let meta = match fs::metadata(&path) {
                        Ok(m) => m,
                        Err(e) => return Look::Failed(format!("{}: {e}", path.display())),
                    };
                    let signature_mtime =
                        fs::metadata(self.dir.join(layout::signature_file_name(name)))
                            .ok()
                            .map(|m| (m.mtime(), m.mtime_nsec()));
                    sources.push(SourceId {
                        path,
                        size: meta.len(),
                        mtime: meta.mtime(),
                        mtime_nsec: meta.mtime_nsec(),
                        ino: meta.ino(),
                        signature_mtime,
                    });
                }
                Look::Found(sources)
            }
        }
    }

    /// Copies and hashes `source` in one pass into a private file only this server
    /// writes, not yet persisted.
    fn copy_in(
        &self,
        source: &SourceId,
    ) -> Result<(tempfile::NamedTempFile, agent_protocol::digest::Digests), Refused> {
        let shown = source.path.display().to_string();
        let mut input =
            File::open(&source.path).map_err(|e| Refused::Io(format!("{shown}: {e}")))?;
        let mut tmp = tempfile::Builder::new()
            .prefix(".ingest-")
            .tempfile_in(&self.cache_dir)
            .map_err(|e| Refused::Io(format!("{}: {e}", self.cache_dir.display())))?;
        let mut hasher = MultiHasher::new();
        let mut buf = vec![0u8; agent_protocol::digest::CHUNK];
        loop {
            let n = input
                .read(&mut buf)
                .map_err(|e| Refused::Io(format!("{shown}: {e}")))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            tmp.write_all(&buf[..n])
                .map_err(|e| Refused::Io(format!("{}: {e}", self.cache_dir.display())))?;
        }
        tmp.as_file()
            .sync_all()
            .map_err(|e| Refused::Io(format!("{}: {e}", self.cache_dir.display())))?;
        Ok((tmp, hasher.finish()))
    }

    /// Persists a copy made by [`Self::copy_in`] read-only as `<cache>/<name>` and maps it.
    fn persist(
        &self,
        tmp: tempfile::NamedTempFile,
        name: &str,
        size: u64,
        shown: &str,
    ) -> Result<Bytes, Refused> {
        let private = self.cache_dir.join(name);
        read_only(tmp.as_file());
        tmp.persist(&private)
            .map_err(|e| Refused::Io(format!("{}: {}", private.display(), e.error)))?;
        let file =
            File::open(&private).map_err(|e| Refused::Io(format!("{}: {e}", private.display())))?;
        let data = map(&file)
            .map_err(|e| Refused::Io(format!("cannot map {}: {e}", private.display())))?;
        if data.len() as u64 != size {
            return Err(Refused::Io(format!(
                "{shown} changed while it was read; it will be read again"
            )));
        }
        Ok(data)
    }

    /// Takes in the release's MSI. What reaches the store passed a publish's checks
    /// (`publish::check`), which verified its signature under the key that signed the
    /// release's bundles; here it must still be these bytes (its claim's sha256) and
    /// name the release it was signed for, which [`Release::with_msi`] holds it to.
    /// Unlike a bundle's, its signer is not checked against `bundle.public-key` again:
    /// no agent checks an MSI, and that key may be reached from the bundles' signer only
    /// through a rotation chain that the bundles carry and the MSI does not.
    fn ingest_msi(&self, source: &SourceId) -> Result<ServedMsi, Refused> {
        let shown = source.path.display().to_string();
        let (tmp, digests) = self.copy_in(source)?;
        let sig_path = PathBuf::from(format!("{shown}.minisig"));
        let content = |why: String| {
            Refused::Content(format!(
                "{why}; the MSI is not served (sign it with agent-bundle sign --key K, its bundle beside it)"
            ))
        };
        let text = match verify::read_signature_file(&sig_path) {
            Ok(text) => text,
            Err(agent_extract::Error::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                return Err(content(format!(
                    "{shown} has no signature {}",
                    sig_path.display()
                )));
            }
            Err(agent_extract::Error::Io { source, .. })
                if source.kind() == std::io::ErrorKind::InvalidData =>
            {
                return Err(content(format!("{}: {source}", sig_path.display())));
            }
            Err(e) => return Err(Refused::Io(e.to_string())),
        };
        let claim = Signature::parse(&text)
            .and_then(|sig| agent_protocol::minisign::BundleClaim::parse(sig.trusted_comment()))
            .map_err(|e| content(format!("{}: {e}", sig_path.display())))?;
        if claim.sha256 != digests.sha256_hex() {
            return Err(content(format!(
                "{shown} has sha256 {}, but its signature vouches for {}",
                digests.sha256_hex(),
                claim.sha256
            )));
        }
        let name = format!("msi-{}", digests.sha256_hex());
        let data = self.persist(tmp, &name, digests.size, &shown)?;
        Ok(ServedMsi {
            filename: source
                .path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            platform: claim.platform,
            version: claim.version,
            sha256: digests.sha256_hex(),
            data,
            signature: text,
            last_modified: SystemTime::UNIX_EPOCH
                + std::time::Duration::from_secs(source.mtime.max(0) as u64),
            etag: format!("\"{}\"", digests.sha256_hex()),
        })
    }

    fn ingest(&self, source: &SourceId) -> Result<ServedBundle, Refused> {
        let shown = source.path.display().to_string();
        let (tmp, digests) = self.copy_in(source)?;

        let sig_path = PathBuf::from(format!("{shown}.minisig"));
        // Read no further than a signature can be long: a huge file beside a bundle is
        // refused, never held.
        let signature_text = match verify::read_signature_file(&sig_path) {
            Ok(text) => Some(text),
            Err(agent_extract::Error::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                None
            }
            Err(agent_extract::Error::Io { source, .. })
                if source.kind() == std::io::ErrorKind::InvalidData =>
            {
                return Err(Refused::Content(format!(
                    "{}: {source}, which no minisign signature is (a few hundred bytes); {shown} is not served until it has its own .minisig",
                    sig_path.display()
                )));
            }
            Err(e) => return Err(Refused::Io(e.to_string())),
        };
        if let Some(key) = &self.public_key {
            let Some(text) = &signature_text else {
                return Err(Refused::Content(format!(
                    "{shown} has no signature {}; it is not served (bundle.public-key is set)",
                    sig_path.display()
                )));
            };
            let signature = Signature::parse(text).map_err(|e| {
                Refused::Content(format!(
                    "{}: {e}; the bundle is not served",
                    sig_path.display()
                ))
            })?;
            let verified =
                verify::verify_with_digests(tmp.path(), &digests, &signature, &Trust::key(key))
                    .map_err(|e| {
                        Refused::Content(format!(
                            "{shown} failed verification: {}; the bundle is not served",
                            crate::refusal::in_servers_words(&e)
                        ))
                    })?;
            if let Some(chain) = &verified.chain {
                tracing::info!(
                    "{shown} is signed by key {} through the key rotation {chain}; agents that trust key {} will follow it (set bundle.public-key to the new key once the fleet has moved)",
                    signature.key_id(),
                    key.key_id()
                );
            }
        }
        let facts = self
            .facts(tmp.path(), &digests.sha256_hex(), &shown)
            .map_err(Refused::Content)?;

        let name = format!("bundle-{}", digests.sha256_hex());
        let data = self.persist(tmp, &name, digests.size, &shown)?;
        let filename = source
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        Ok(ServedBundle {
            etag: format!("\"{}\"", digests.sha256_hex()),
            info: VersionInfo {
                server_version: self.server_version.clone(),
                server_build: self.server_build.clone(),
                agent: facts.version,
                md5: digests.md5_hex(),
                sha256: digests.sha256_hex(),
                size: digests.size,
                filename,
                // Named per answer, from the configuration (routes/download.rs).
                download_source: None,
            },
            platform: facts.platform,
            data,
            signature: signature_text,
            last_modified: SystemTime::UNIX_EPOCH
                + std::time::Duration::from_secs(source.mtime.max(0) as u64),
        })
    }

    /// Version facts from the cache when it describes this content, else from the bundle.
    fn facts(&self, bundle: &Path, sha256: &str, shown: &str) -> Result<Facts, String> {
        let cache_path = self.dir.join(VERSION_CACHE);
        if let Ok(text) = atomic::read_text(&cache_path, 64 * 1024)
            && let Ok(props) = Properties::parse(&text)
            && let Some(facts) = cached_facts(&props, sha256)
        {
            return Ok(facts);
        }
        let facts = Payload::open(bundle)
            .and_then(|mut p| p.facts())
            .map_err(|e| format!("{shown} is not a usable bundle: {e}"))?;
        if !platform::is_target(&facts.platform) {
            return Err(format!(
                "{shown} names no plain platform ({}={:?}); it is not served",
                layout::PROP_LATEST_PLATFORM,
                facts.platform
            ));
        }
        Ok(Facts {
            version: facts.version,
            platform: facts.platform,
        })
    }

    /// Writes the version cache for the served release: each bundle's facts under its
    /// sha256, and the primary one's also as a lone bundle's were written before.
    fn write_cache(&self, release: &Release) {
        let cache_path = self.dir.join(VERSION_CACHE);
        let mut props = Properties::new();
        let primary = release.primary();
        props.set("bundle.sha256", &primary.info.sha256);
        props.set(
            layout::PROP_LATEST_VERSION,
            &primary.info.agent.version_str(),
        );
        props.set(layout::PROP_LATEST_BUILD, primary.info.agent.build());
        props.set(layout::PROP_LATEST_PLATFORM, &primary.platform);
        for b in release.bundles() {
            let key = |k: &str| format!("{}.{k}", b.info.sha256);
            props.set(
                &key(layout::PROP_LATEST_VERSION),
                &b.info.agent.version_str(),
            );
            props.set(&key(layout::PROP_LATEST_BUILD), b.info.agent.build());
            props.set(&key(layout::PROP_LATEST_PLATFORM), &b.platform);
        }
        let text = props.to_text();
        if atomic::read_text(&cache_path, 64 * 1024).ok().as_deref() == Some(text.as_str()) {
            return;
        }
        if let Err(e) = atomic::write(&cache_path, text.as_bytes()) {
            tracing::warn!("cannot write the version cache: {e}");
        }
    }

    fn remove_stale_copies(&self, keep: &[PathBuf]) {
        remove_cache_files(&self.cache_dir, |path, name| {
            !keep.iter().any(|k| k == path)
                && (name.starts_with("bundle-") || name.starts_with("msi-"))
        });
    }
}

/// Removes the files of the cache `dir` that `unwanted` (the path, the file name) says
/// go. Running downloads keep their mapping of a removed copy; the name is all that goes.
pub(crate) fn remove_cache_files(dir: &Path, unwanted: impl Fn(&Path, &str) -> bool) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if unwanted(&path, &name) {
            let _ = fs::remove_file(&path);
        }
    }
}

struct Facts {
    version: AgentVersion,
    platform: String,
}

/// A bundle's facts from the version cache: under its sha256, or in the unprefixed keys
/// a lone bundle's cache had before releases.
fn cached_facts(props: &Properties, sha256: &str) -> Option<Facts> {
    let keyed = |k: &str| props.get(&format!("{sha256}.{k}"));
    let (version, build, platform) = match keyed(layout::PROP_LATEST_VERSION) {
        Some(version) => (
            version,
            keyed(layout::PROP_LATEST_BUILD)?,
            keyed(layout::PROP_LATEST_PLATFORM)?,
        ),
        None if props.get("bundle.sha256") == Some(sha256) => (
            props.get(layout::PROP_LATEST_VERSION)?,
            props.get(layout::PROP_LATEST_BUILD)?,
            props.get(layout::PROP_LATEST_PLATFORM)?,
        ),
        None => return None,
    };
    if !platform::is_target(platform) {
        return None;
    }
    Some(Facts {
        version: AgentVersion::new(version, build).ok()?,
        platform: platform.to_owned(),
    })
}

/// Makes a private copy read-only (0444) before it is mapped: nothing writes it again.
pub(crate) fn read_only(file: &File) {
    use std::os::unix::fs::PermissionsExt;
    let _ = file.set_permissions(fs::Permissions::from_mode(0o444));
}

/// Maps one of this server's private, write-once files read-only: a bundle's copy, or a
/// made delta ([`crate::deltas`]).
#[allow(unsafe_code)]
pub(crate) fn map(file: &File) -> io::Result<Bytes> {
    if file.metadata()?.len() == 0 {
        return Ok(Bytes::new());
    }
    // SAFETY: the file is this server's private copy under <home>/cache (or a delta under
    // <home>/deltas), made read-only (0444) when written and never written again; it is
    // only ever unlinked, which leaves the mapping intact. So the mapped bytes cannot
    // change while they are borrowed.
    let mmap = unsafe { memmap2::Mmap::map(file)? };
    Ok(Bytes::from_owner(mmap))
}

/// A served bundle with made-up digests and no bytes: what the tests of the answers
/// given from a release (here and in `update-server`'s edges) build releases from.
pub fn sample_bundle(agent: AgentVersion, platform: &str) -> Arc<ServedBundle> {
    let sha256 = format!("{:0>64}", format!("{}{}", agent.build(), platform.len()));
    Arc::new(ServedBundle {
        info: VersionInfo {
            server_version: "1.0.0".into(),
            server_build: "1".into(),
            md5: "0".repeat(32),
            sha256: sha256.clone(),
            size: 0,
            filename: format!("agent-bundle-{}-{platform}", agent.version_str()),
            download_source: None,
            agent,
        },
        platform: platform.into(),
        data: Bytes::new(),
        signature: None,
        last_modified: SystemTime::UNIX_EPOCH,
        etag: format!("\"{sha256}\""),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundle(version: &str, platform: &str) -> Arc<ServedBundle> {
        sample_bundle(version.parse().unwrap(), platform)
    }

    const GNU: &str = "x86_64-unknown-linux-gnu";
    const MUSL: &str = "x86_64-unknown-linux-musl";
    const ARM: &str = "aarch64-unknown-linux-gnu";

    #[test]
    fn a_release_is_one_version_and_one_bundle_per_platform() {
        let r =
            Release::assemble(vec![bundle("2.0.0+7", MUSL), bundle("2.0.0+7", GNU)], GNU).unwrap();
        assert_eq!(r.primary().platform, GNU, "the server's own platform first");
        assert_eq!(r.platforms(), [GNU, MUSL]);
        assert!(!r.is_single());
        let r =
            Release::assemble(vec![bundle("2.0.0+7", MUSL), bundle("2.0.0+7", ARM)], GNU).unwrap();
        assert_eq!(r.primary().platform, ARM, "else the first by platform");

        let e = Release::assemble(vec![bundle("2.0.0+7", GNU), bundle("2.0.0+8", MUSL)], GNU)
            .unwrap_err();
        assert!(e.contains("different versions"), "{e}");
        let e = Release::assemble(vec![bundle("2.0.0+7", GNU), bundle("2.0.0+7", GNU)], GNU)
            .unwrap_err();
        assert!(e.contains("two bundles for one platform"), "{e}");
        assert!(Release::assemble(Vec::new(), GNU).is_err());
    }

    fn msi(version: &str, platform: &str) -> Arc<ServedMsi> {
        let version: AgentVersion = version.parse().unwrap();
        Arc::new(ServedMsi {
            filename: layout::msi_file_name(&version, platform),
            platform: platform.into(),
            version,
            sha256: "a".repeat(64),
            data: Bytes::from_static(b"msi"),
            signature: String::new(),
            last_modified: SystemTime::UNIX_EPOCH,
            etag: format!("\"{}\"", "a".repeat(64)),
        })
    }

    #[test]
    fn a_release_carries_the_msi_of_its_build_and_windows_bundle_and_it_is_no_bundle() {
        const WINDOWS: &str = "x86_64-pc-windows-gnu";
        let release = || {
            Release::assemble(
                vec![bundle("2.0.0+7", GNU), bundle("2.0.0+7", WINDOWS)],
                GNU,
            )
            .unwrap()
        };
        let bare = release();
        assert!(bare.msi().is_none());
        let with = release().with_msi(msi("2.0.0+7", WINDOWS)).unwrap();
        assert_eq!(with.msi().unwrap().platform, WINDOWS);
        assert_eq!(
            with.identity(),
            bare.identity(),
            "the MSI is no part of the rollout"
        );
        assert_eq!(with.platforms(), bare.platforms());

        let e = release().with_msi(msi("2.0.0+8", WINDOWS)).unwrap_err();
        assert!(
            e.contains("is the MSI of 2.0.0+8, beside bundles of 2.0.0+7"),
            "{e}"
        );
        let e = Release::assemble(vec![bundle("2.0.0+7", GNU)], GNU)
            .unwrap()
            .with_msi(msi("2.0.0+7", WINDOWS))
            .unwrap_err();
        assert!(e.contains("which is not beside it"), "{e}");
    }

    #[test]
    fn each_platform_gets_its_own_bundle_else_static_musl_of_its_arch_else_none() {
        let r =
            Release::assemble(vec![bundle("2.0.0+7", MUSL), bundle("2.0.0+7", GNU)], GNU).unwrap();
        assert_eq!(r.for_platform(GNU).unwrap().platform, GNU);
        assert_eq!(r.for_platform(MUSL).unwrap().platform, MUSL);
        assert!(r.for_platform(ARM).is_none());
        let r = Release::assemble(vec![bundle("2.0.0+7", MUSL)], GNU).unwrap();
        assert_eq!(r.for_platform(GNU).unwrap().platform, MUSL);
        let r = Release::assemble(vec![bundle("2.0.0+7", GNU)], GNU).unwrap();
        assert!(r.for_platform(MUSL).is_none(), "glibc never runs on musl");
    }

    #[test]
    fn a_release_of_one_bundle_is_known_by_its_sha256_and_of_several_by_all() {
        let one = Release::assemble(vec![bundle("2.0.0+7", GNU)], GNU).unwrap();
        assert_eq!(one.identity(), one.primary().info.sha256);
        let two =
            Release::assemble(vec![bundle("2.0.0+7", GNU), bundle("2.0.0+7", MUSL)], GNU).unwrap();
        let again =
            Release::assemble(vec![bundle("2.0.0+7", MUSL), bundle("2.0.0+7", GNU)], GNU).unwrap();
        assert_eq!(two.identity(), again.identity());
        assert_ne!(two.identity(), one.identity());
        assert_eq!(two.identity().len(), 64);
    }

    #[test]
    fn a_drop_names_each_bundle_and_the_signature_beside_it() {
        let source = |name: &str, signed: bool| SourceId {
            path: PathBuf::from("/srv/downloads/agent").join(name),
            size: 1,
            mtime: 0,
            mtime_nsec: 0,
            ino: 0,
            signature_mtime: signed.then_some((0, 0)),
        };
        let dropped = Dropped::of(vec![
            source(&format!("agent-bundle-2.0.0-{MUSL}"), false),
            source(&format!("agent-bundle-2.0.0-{GNU}"), true),
        ]);
        assert_eq!(
            dropped.names,
            [
                format!("agent-bundle-2.0.0-{GNU}"),
                format!("agent-bundle-2.0.0-{GNU}.minisig"),
                format!("agent-bundle-2.0.0-{MUSL}"),
            ]
        );
    }

    #[test]
    fn cached_facts_are_per_bundle_and_read_the_old_form() {
        let mut p = Properties::new();
        p.set("bundle.sha256", "aa");
        p.set(layout::PROP_LATEST_VERSION, "1.0.0");
        p.set(layout::PROP_LATEST_BUILD, "1");
        p.set(layout::PROP_LATEST_PLATFORM, GNU);
        p.set("bb.agent.latest.version", "1.0.0");
        p.set("bb.agent.latest.build-number", "1");
        p.set("bb.agent.latest.platform", MUSL);
        assert_eq!(cached_facts(&p, "aa").unwrap().platform, GNU);
        assert_eq!(cached_facts(&p, "bb").unwrap().platform, MUSL);
        assert!(cached_facts(&p, "cc").is_none());
    }
}
