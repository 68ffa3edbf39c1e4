//! The bundle store: the one bundle this server serves.
//!
//! The operator drops `agent-bundle-V` (and `agent-bundle-V.minisig`) into the download
//! directory. A scan, every second, notices the change and ingests the bundle into a
//! private, read-only copy under `<home>/cache/`, hashed in the same pass; the copy is
//! memory-mapped and served from there. An operator's later `cp` over the dropped file
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
use agent_protocol::layout;
use agent_protocol::minisign::{PublicKey, Signature};
use agent_protocol::properties::Properties;
use agent_protocol::wire::VersionInfo;
use bytes::Bytes;

/// The version cache, beside the bundle in the download directory.
pub const VERSION_CACHE: &str = "server-agent-versions.properties";

/// A bundle ready to serve.
#[derive(Debug)]
pub struct ServedBundle {
    pub info: VersionInfo,
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

/// What the store can serve right now.
#[derive(Debug, Clone)]
pub enum Current {
    Ready(Arc<ServedBundle>),
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
    Found(SourceId),
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

pub struct BundleStore {
    dir: PathBuf,
    cache_dir: PathBuf,
    public_key: Option<PublicKey>,
    server_version: String,
    server_build: String,
    current: RwLock<Current>,
    source: RwLock<Option<SourceId>>,
    last_problem: RwLock<Option<String>>,
}

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
            last_problem: RwLock::new(None),
        })
    }

    pub fn current(&self) -> Current {
        match self.current.read() {
            Ok(c) => c.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Looks at the download directory and takes in a new bundle if there is one.
    /// Blocking: call from a blocking thread.
    pub fn scan(&self) {
        let source = match self.look() {
            Look::Found(source) => source,
            Look::Nothing(problem) => {
                self.set_source(None);
                self.set(Current::Unavailable(problem));
                return;
            }
            Look::Failed(detail) => {
                match self.current() {
                    Current::Ready(bundle) => self
                        .log_problem(format!("{detail}; still serving {}", bundle.info.filename)),
                    Current::Unavailable(_) => self.set(Current::Unavailable(Problem::new(
                        "the bundle cannot be read just now; retry later",
                        detail,
                    ))),
                }
                return;
            }
        };
        let unchanged = self
            .source
            .read()
            .map(|s| s.as_ref() == Some(&source))
            .unwrap_or(false);
        if unchanged {
            return;
        }
        match self.ingest(&source) {
            Ok(bundle) => {
                tracing::info!(
                    version = %bundle.info.agent,
                    sha256 = %bundle.info.sha256,
                    size = bundle.info.size,
                    "serving {}",
                    bundle.info.filename
                );
                self.set_source(Some(source));
                *self.last_problem.write().unwrap_or_else(|p| p.into_inner()) = None;
                self.set(Current::Ready(Arc::new(bundle)));
            }
            Err(refused) => {
                let detail = match refused {
                    Refused::Content(detail) => {
                        // Not read again until the file changes.
                        self.set_source(Some(source));
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
            }
        }
    }

    fn set(&self, current: Current) {
        if let Current::Unavailable(problem) = &current {
            self.log_problem(problem.detail.clone());
        }
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = current;
    }

    fn set_source(&self, source: Option<SourceId>) {
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
            if name.starts_with("agent-bundle-")
                && !name.ends_with(".minisig")
                && entry.file_type().map(|t| t.is_file()).unwrap_or(false)
            {
                bundles.push(name);
            }
        }
        bundles.sort();
        match bundles.as_slice() {
            [] => Look::Nothing(Problem::new(
                "no bundle to serve yet: the operator must drop agent-bundle-<version> and its .minisig into the server's download directory",
                format!(
                    "no bundle to serve: drop agent-bundle-<version> and its .minisig into {}",
                    self.dir.display()
                ),
            )),
            [one] => {
                let path = self.dir.join(one);
                let meta = match fs::metadata(&path) {
                    Ok(m) => m,
                    Err(e) => return Look::Failed(format!("{}: {e}", path.display())),
                };
                let signature_mtime = fs::metadata(self.dir.join(layout::signature_file_name(one)))
                    .ok()
                    .map(|m| (m.mtime(), m.mtime_nsec()));
                Look::Found(SourceId {
                    path,
                    size: meta.len(),
                    mtime: meta.mtime(),
                    mtime_nsec: meta.mtime_nsec(),
                    ino: meta.ino(),
                    signature_mtime,
                })
            }
            many => Look::Nothing(Problem::new(
                "several bundles are in the download directory: the operator must leave only the one to serve",
                format!(
                    "{} bundles in {} ({}); remove all but the one to serve",
                    many.len(),
                    self.dir.display(),
                    many.join(", ")
                ),
            )),
        }
    }

    fn ingest(&self, source: &SourceId) -> Result<ServedBundle, Refused> {
        let shown = source.path.display().to_string();
        // Copy and hash in one pass into a private file only this server writes.
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
        let digests = hasher.finish();

        let sig_path = PathBuf::from(format!("{shown}.minisig"));
        let signature_text = match fs::read_to_string(&sig_path) {
            Ok(text) => Some(text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(Refused::Io(format!("{}: {e}", sig_path.display()))),
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
                            "{shown} failed verification: {e}; the bundle is not served"
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

        let private = self
            .cache_dir
            .join(format!("bundle-{}", digests.sha256_hex()));
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = tmp
                .as_file()
                .set_permissions(fs::Permissions::from_mode(0o444));
        }
        tmp.persist(&private)
            .map_err(|e| Refused::Io(format!("{}: {}", private.display(), e.error)))?;
        self.remove_stale_copies(&private);
        let file =
            File::open(&private).map_err(|e| Refused::Io(format!("{}: {e}", private.display())))?;
        let data = map(&file)
            .map_err(|e| Refused::Io(format!("cannot map {}: {e}", private.display())))?;
        if data.len() as u64 != digests.size {
            return Err(Refused::Io(format!(
                "{shown} changed while it was read; it will be read again"
            )));
        }
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
            },
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
            && props.get("bundle.sha256") == Some(sha256)
            && let Ok(version) = AgentVersion::new(
                props.get(layout::PROP_LATEST_VERSION).unwrap_or_default(),
                props.get(layout::PROP_LATEST_BUILD).unwrap_or_default(),
            )
        {
            return Ok(Facts { version });
        }
        let facts = Payload::open(bundle)
            .and_then(|mut p| p.facts())
            .map_err(|e| format!("{shown} is not a usable bundle: {e}"))?;
        let mut props = Properties::new();
        props.set("bundle.sha256", sha256);
        props.set(layout::PROP_LATEST_VERSION, &facts.version.version_str());
        props.set(layout::PROP_LATEST_BUILD, facts.version.build());
        props.set(layout::PROP_LATEST_PLATFORM, &facts.platform);
        if let Err(e) = atomic::write(&cache_path, props.to_text().as_bytes()) {
            tracing::warn!("cannot write the version cache: {e}");
        }
        Ok(Facts {
            version: facts.version,
        })
    }

    fn remove_stale_copies(&self, keep: &Path) {
        let Ok(entries) = fs::read_dir(&self.cache_dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path != keep && name.starts_with("bundle-") {
                // Running downloads keep their mapping; the name is all that goes.
                let _ = fs::remove_file(&path);
            }
        }
    }
}

struct Facts {
    version: AgentVersion,
}

/// Maps the private copy read-only.
#[allow(unsafe_code)]
fn map(file: &File) -> io::Result<Bytes> {
    if file.metadata()?.len() == 0 {
        return Ok(Bytes::new());
    }
    // SAFETY: the file is this server's private copy under <home>/cache, made read-only
    // (0444) on ingest and never written again; it is only ever unlinked, which leaves
    // the mapping intact. So the mapped bytes cannot change while they are borrowed.
    let mmap = unsafe { memmap2::Mmap::map(file)? };
    Ok(Bytes::from_owner(mmap))
}
