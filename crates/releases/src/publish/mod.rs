//! Releases as objects: publish (checked before any agent can see it), the history, a
//! rollback to a kept release, and every server of a fleet following the fleet's current
//! release.
//!
//! A published release is kept under `<home>/releases/<version>+<build>/` (its bundles
//! and signatures) and recorded in the fleet database ([`agent_fleet::releases`]), which
//! with PostgreSQL also holds its bytes. Each server follows the newest history entry:
//! when one appears that it has not installed, it writes that release into its download
//! directory whole (hidden names, then renames, while the store's scans are held off) and
//! takes it at once. The download directory stays the store's one source.
//!
//! A release dropped there by hand is a publish too ([`Publisher::take_hand_drop`]): the
//! same checks, the same history entry (by [`HAND_DROP_WHO`]), so `release list` shows
//! it and `release rollback` can return to it; one that fails them is refused and
//! nothing of it is served. Without a key of its own, a server checks a hand drop
//! against the key each bundle ships ([`check::Trusted::Shipped`]).
//!
//! This module reads and writes files and the fleet database; the checks are in
//! [`check`], and the HTTP edge is `routes::releases`.

pub mod check;

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use agent_extract::atomic;
use agent_fleet::FleetError;
use agent_fleet::releases::{FileRecord, HistoryEntry, Kind, ReleaseRecord, Releases};
use agent_protocol::digest::Digests;
use agent_protocol::layout;
use agent_protocol::minisign::PublicKey;

use crate::store::{BundleStore, Current, Dropped};
use check::{Checked, Refused};

/// Where this server noted the history entry it last installed.
const INSTALLED_FILE: &str = "installed";

/// Who the history names for a release dropped into the download directory by hand.
pub const HAND_DROP_WHO: &str = "server";

/// What became of a release found in the download directory.
#[derive(Debug)]
pub enum HandDrop {
    /// It passed a publish's checks and is the fleet's current release now.
    Published(HistoryEntry),
    /// It is a release this server installed from the history (found again at start,
    /// or put back as it was): served as it is, nothing new recorded.
    Installed(String),
    /// It fails a publish's checks: nothing of it is served. The reasons name the files.
    Refused(String),
    /// It is no longer there as it was found (a publish replaced it meanwhile, or the
    /// operator is still at work): the next look finds what is there.
    Gone,
}

/// Why a publish or rollback did not happen. Nothing changed in any of these cases.
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    #[error("{0}")]
    Refused(Refused),
    /// The server has no key to check a release against.
    #[error(
        "this server trusts no key to check a release against: set releases.trusted-keys (public key files) or bundle.public-key in server.toml"
    )]
    NoTrust,
    #[error("{0}")]
    NotKept(String),
    /// A rollback's signatures are missing or not newer than the served release's.
    #[error("{0}")]
    Signatures(String),
    #[error(transparent)]
    Fleet(#[from] FleetError),
    #[error("{0}")]
    Io(String),
}

fn io_error(what: &Path, e: impl std::fmt::Display) -> ReleaseError {
    ReleaseError::Io(format!("{}: {e}", what.display()))
}

pub struct Publisher {
    /// `<home>/releases`.
    dir: PathBuf,
    store: Arc<BundleStore>,
    releases: Releases,
    keys: Vec<PublicKey>,
    served_key: Option<PublicKey>,
    keep: usize,
    /// Bytes a published bundle's distribution may inflate to (`releases.max-unpacked`).
    max_unpacked: u64,
    /// Uploads being received or checked now, at most [`UPLOADS_AT_ONCE`].
    uploads: Arc<tokio::sync::Semaphore>,
    /// One publish, rollback or follow at a time on this server.
    busy: tokio::sync::Mutex<()>,
    /// The history entry this server last installed ([`INSTALLED_FILE`], read once at
    /// start; `follow` asks every second); [`NONE_INSTALLED`] for none.
    installed: AtomicI64,
}

const NONE_INSTALLED: i64 = i64::MIN;

/// Uploads a server receives at once: each may write up to the upload limit to disk, so
/// more answer `503` with [`UPLOAD_RETRY_AFTER`].
pub const UPLOADS_AT_ONCE: usize = 2;

/// Seconds a publish turned away because [`UPLOADS_AT_ONCE`] are running is asked to
/// wait.
pub const UPLOAD_RETRY_AFTER: u64 = 10;

/// The right to upload a release now: held until the upload is published or refused.
pub struct UploadSlot {
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Publisher {
    pub fn new(
        home: &Path,
        store: Arc<BundleStore>,
        releases: Releases,
        keys: Vec<PublicKey>,
        served_key: Option<PublicKey>,
        keep: usize,
    ) -> io::Result<Self> {
        let dir = home.join("releases");
        fs::create_dir_all(&dir)?;
        // Uploads a crash left behind.
        if let Ok(entries) = fs::read_dir(&dir) {
            for entry in entries.flatten() {
                if entry
                    .file_name()
                    .to_string_lossy()
                    .starts_with(".incoming-")
                {
                    let _ = fs::remove_dir_all(entry.path());
                }
            }
        }
        let installed = atomic::read_text(&dir.join(INSTALLED_FILE), 64)
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(NONE_INSTALLED);
        Ok(Self {
            dir,
            store,
            releases,
            keys,
            served_key,
            keep,
            max_unpacked: crate::DEFAULT_MAX_UNPACKED_MIB * 1024 * 1024,
            uploads: Arc::new(tokio::sync::Semaphore::new(UPLOADS_AT_ONCE)),
            busy: tokio::sync::Mutex::new(()),
            installed: AtomicI64::new(installed),
        })
    }

    /// Sets the bytes a published bundle's distribution may inflate to
    /// (`releases.max-unpacked`; [`crate::DEFAULT_MAX_UNPACKED_MIB`] unless set).
    #[must_use]
    pub fn with_max_unpacked(mut self, bytes: u64) -> Self {
        self.max_unpacked = bytes;
        self
    }

    pub fn max_unpacked(&self) -> u64 {
        self.max_unpacked
    }

    /// A slot to receive an upload in, if fewer than [`UPLOADS_AT_ONCE`] are running.
    pub fn upload_slot(&self) -> Option<UploadSlot> {
        Arc::clone(&self.uploads)
            .try_acquire_owned()
            .ok()
            .map(|permit| UploadSlot { _permit: permit })
    }

    pub fn releases(&self) -> &Releases {
        &self.releases
    }

    pub fn keep(&self) -> usize {
        self.keep
    }

    /// A private directory for the files of one upload, removed when dropped.
    pub fn incoming(&self) -> Result<tempfile::TempDir, ReleaseError> {
        tempfile::Builder::new()
            .prefix(".incoming-")
            .tempdir_in(&self.dir)
            .map_err(|e| io_error(&self.dir, e))
    }

    /// The uploaded files in `incoming`, checked as a release (refused as a whole, in
    /// words, when they are not one) and moved under `<home>/releases/<id>/`. Called
    /// while `busy` is held.
    async fn check_and_keep(
        &self,
        incoming: tempfile::TempDir,
        names: Vec<String>,
    ) -> Result<ReleaseRecord, ReleaseError> {
        let checked = self
            .check(
                incoming.path(),
                names,
                TrustedKeys::Configured,
                Some(self.max_unpacked),
            )
            .await?;
        let record = record_of(&checked);
        // Before anything is moved over the kept files of the same id.
        if let Some(known) = self.releases.release(&record.id).await?
            && let Some(conflict) = agent_fleet::releases::conflict(&known, &record)
        {
            return Err(conflict.into());
        }
        let kept = self.dir.join(&record.id);
        let incoming_path = incoming.path().to_owned();
        blocking(move || keep_files(&incoming_path, &kept)).await?;
        drop(incoming);
        Ok(record)
    }

    /// Checks the uploaded files in `incoming` as a release (refused as a whole, in words,
    /// when they are not one) and keeps it, in the fleet database too, without making
    /// it the fleet's current one: the first step of every publish. The second is an
    /// operator action, [`Publisher::make_kept_current`] (or naming it for a deployment),
    /// taken at once or once another operator approves it; until then no agent sees it.
    pub async fn keep_upload(
        &self,
        incoming: tempfile::TempDir,
        names: Vec<String>,
    ) -> Result<ReleaseRecord, ReleaseError> {
        if self.keys.is_empty() && self.served_key.is_none() {
            return Err(ReleaseError::NoTrust);
        }
        let _busy = self.busy.lock().await;
        let record = self.check_and_keep(incoming, names).await?;
        self.keep_in_fleet(&record).await?;
        // As stored: the signatures are what the fleet holds.
        Ok(self.releases.release(&record.id).await?.unwrap_or(record))
    }

    /// Records the kept release `record` in the fleet database (its bytes too, on
    /// PostgreSQL) without making it current.
    async fn keep_in_fleet(&self, record: &ReleaseRecord) -> Result<(), ReleaseError> {
        let kept = self.dir.join(&record.id);
        let mut read = |name: &str| {
            let path = kept.join(name);
            fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))
        };
        Ok(self.releases.keep_release(record, &mut read).await?)
    }

    /// `release rollback`'s first step: the kept release `to` with fresh `signatures` (by
    /// bundle file name), checked newer than the served release's, kept with them. The
    /// second is [`Publisher::make_kept_current`] with [`Kind::Rollback`].
    pub async fn keep_rollback(
        &self,
        to: &str,
        signatures: BTreeMap<String, String>,
    ) -> Result<ReleaseRecord, ReleaseError> {
        if self.keys.is_empty() && self.served_key.is_none() {
            return Err(ReleaseError::NoTrust);
        }
        let _busy = self.busy.lock().await;
        let served_signed_at = match self.store.current() {
            Current::Ready(release) => crate::served(&release).signed_at,
            Current::Unavailable(_) => 0,
        };
        let record = self.resign(to, signatures, served_signed_at).await?;
        self.keep_in_fleet(&record).await?;
        Ok(record)
    }

    /// Makes the kept release `id` the fleet's current one (`kind`: how it became so) and
    /// serves it here, from its kept files and signatures as the fleet holds them
    /// (fetched from the fleet database when another server kept them).
    pub async fn make_kept_current(
        &self,
        id: &str,
        kind: Kind,
        who: &str,
    ) -> Result<HistoryEntry, ReleaseError> {
        let _busy = self.busy.lock().await;
        let Some(record) = self.releases.release(id).await? else {
            return Err(ReleaseError::NotKept(format!(
                "release {id} is no longer kept; publish it again"
            )));
        };
        if kind == Kind::Rollback {
            // Its fresh signatures were newer than what was served when it was asked
            // for; a release published while it waited for approval may be newer still,
            // and agents would refuse the rollback as a replay.
            let served = match self.store.current() {
                Current::Ready(release) => crate::served(&release).signed_at,
                Current::Unavailable(_) => 0,
            };
            let signed_at = signed_at_of(&record);
            if signed_at <= served {
                return Err(ReleaseError::Signatures(format!(
                    "the signatures of the rollback to {id} (signed-at {signed_at}) are not newer than the release served now (signed-at {served}), published since the rollback was asked for: agents would refuse them as a replay; sign again with `agent-bundle sign --key K FILE…` and roll back again"
                )));
            }
        }
        self.ensure_local(&record).await?;
        let entry = self.make_current(&record, kind, who).await?;
        self.install_entry(&entry).await?;
        Ok(entry)
    }

    /// `release rollback --deployment NAME`: the kept release `to` with fresh
    /// `signatures` newer than `floor` (the signing time of the release the deployment
    /// runs now), kept with them for the deployment to name; the fleet's current
    /// release stays.
    pub async fn rollback_for_deployment(
        &self,
        to: &str,
        signatures: BTreeMap<String, String>,
        floor: i64,
    ) -> Result<ReleaseRecord, ReleaseError> {
        if self.keys.is_empty() && self.served_key.is_none() {
            return Err(ReleaseError::NoTrust);
        }
        let _busy = self.busy.lock().await;
        let record = self.resign(to, signatures, floor).await?;
        self.keep_in_fleet(&record).await?;
        Ok(record)
    }

    /// The kept release `to` with fresh `signatures` (by bundle file name), checked as a
    /// publish is and newer than `floor`, written beside its kept bundles.
    async fn resign(
        &self,
        to: &str,
        signatures: BTreeMap<String, String>,
        floor: i64,
    ) -> Result<ReleaseRecord, ReleaseError> {
        let Some(mut record) = self.releases.release(to).await? else {
            let kept = self.releases.kept().await?;
            return Err(ReleaseError::NotKept(format!(
                "release {to} is not kept (kept: {}); list them with `update-server release list`",
                if kept.is_empty() {
                    "none".into()
                } else {
                    kept.join(", ")
                }
            )));
        };
        let names: Vec<&str> = record.files.iter().map(|f| f.name.as_str()).collect();
        let missing: Vec<&str> = names
            .iter()
            .copied()
            .filter(|n| !signatures.contains_key(*n))
            .collect();
        if !missing.is_empty() {
            return Err(ReleaseError::Signatures(format!(
                "no fresh signature for {}: agents refuse an older signature, so a rollback needs new ones over the kept bytes; get them with `update-server release export --release {to} --out DIR`, sign with `agent-bundle sign --key K DIR/agent-bundle-*`, then `update-server release rollback --to {to} --signatures DIR`",
                missing.join(", ")
            )));
        }
        self.ensure_local(&record).await?;
        // Checked as a publish would be, in a scratch copy: the kept files are untouched
        // until it passes.
        let scratch = self.incoming()?;
        let kept = self.dir.join(&record.id);
        let mut all = Vec::new();
        for file in &record.files {
            let bundle = scratch.path().join(&file.name);
            fs::hard_link(kept.join(&file.name), &bundle)
                .or_else(|_| fs::copy(kept.join(&file.name), &bundle).map(|_| ()))
                .map_err(|e| io_error(&bundle, e))?;
            let sig_name = layout::signature_file_name(&file.name);
            let sig_path = scratch.path().join(&sig_name);
            fs::write(&sig_path, &signatures[&file.name]).map_err(|e| io_error(&sig_path, e))?;
            all.push(file.name.clone());
            all.push(sig_name);
        }
        // Kept bytes were taken once: a limit lowered since does not stand in the way back.
        let checked = self
            .check(scratch.path(), all, TrustedKeys::Configured, None)
            .await?;
        if i64::try_from(checked.signed_at()).unwrap_or(i64::MAX) <= floor {
            return Err(ReleaseError::Signatures(format!(
                "the signatures given are not newer than the served release's (signed-at {} ≤ {floor}): agents would refuse them as a replay; sign again with `agent-bundle sign --key K FILE…` and retry",
                checked.signed_at()
            )));
        }
        for file in &mut record.files {
            if let Some(bundle) = checked.bundles.iter().find(|b| b.name == file.name) {
                file.signature = bundle.signature.clone();
            }
        }
        for file in &record.files {
            let path = kept.join(layout::signature_file_name(&file.name));
            atomic::write(&path, file.signature.as_bytes()).map_err(|e| io_error(&path, e))?;
        }
        Ok(record)
    }

    /// Takes `dropped`, found in the download directory, as `release publish` would take
    /// it: copied aside, checked, kept, recorded in the history by [`HAND_DROP_WHO`] and
    /// served. A refusal changes nothing; the caller has the store say it
    /// ([`BundleStore::refuse`]). An `Err` is a failure to try again (the database away,
    /// a file gone meanwhile), not a verdict on the files.
    pub async fn take_hand_drop(&self, dropped: &Dropped) -> Result<HandDrop, ReleaseError> {
        let _busy = self.busy.lock().await;
        let store = Arc::clone(&self.store);
        let held = dropped.clone();
        if !blocking(move || Ok(store.holds(&held))).await? {
            return Ok(HandDrop::Gone);
        }
        // The database first: while it is away nothing is copied, every second.
        let current = self.releases.current().await?;
        let installed = match self.installed_seq() {
            Some(seq) if current.as_ref().is_some_and(|c| c.seq != seq) => self
                .releases
                .history(self.keep)
                .await?
                .into_iter()
                .find(|e| e.seq == seq),
            _ => None,
        };
        let incoming = self.incoming()?;
        let from = self.store.dir().to_owned();
        let to = incoming.path().to_owned();
        let names = dropped.names.clone();
        blocking(move || copy_files(&from, &to, &names)).await?;
        for entry in current.iter().chain(installed.iter()) {
            if same_files(incoming.path(), &dropped.names, &entry.release).await? {
                self.adopt(entry).await?;
                return Ok(HandDrop::Installed(entry.release.id.clone()));
            }
        }
        let trusted = if self.keys.is_empty() && self.served_key.is_none() {
            TrustedKeys::Shipped
        } else {
            TrustedKeys::Configured
        };
        let checked = match self
            .check(
                incoming.path(),
                dropped.names.clone(),
                trusted,
                Some(self.max_unpacked),
            )
            .await
        {
            Ok(checked) => checked,
            Err(ReleaseError::Refused(refused)) => {
                return Ok(HandDrop::Refused(refused.reasons()));
            }
            Err(e) => return Err(e),
        };
        let record = record_of(&checked);
        if let Some(known) = self.releases.release(&record.id).await?
            && let Some(conflict) = agent_fleet::releases::conflict(&known, &record)
        {
            return Ok(HandDrop::Refused(conflict.to_string()));
        }
        let kept = self.dir.join(&record.id);
        let incoming_path = incoming.path().to_owned();
        let kept_clone = kept.clone();
        blocking(move || keep_files(&incoming_path, &kept_clone)).await?;
        let entry = self
            .make_current(&record, Kind::Publish, HAND_DROP_WHO)
            .await?;
        drop(incoming);
        self.install_entry(&entry).await?;
        Ok(HandDrop::Published(entry))
    }

    /// Serves what the download directory holds, `entry`'s release as this server
    /// installed it, and notes it installed.
    async fn adopt(&self, entry: &HistoryEntry) -> Result<(), ReleaseError> {
        let store = Arc::clone(&self.store);
        blocking(move || {
            let held = store.hold();
            store.take_now(&held);
            Ok(())
        })
        .await?;
        if self.installed_seq() != Some(entry.seq) {
            let path = self.dir.join(INSTALLED_FILE);
            atomic::write(&path, entry.seq.to_string().as_bytes())
                .map_err(|e| io_error(&path, e))?;
            self.installed.store(entry.seq, Ordering::Release);
        }
        Ok(())
    }

    /// Follows the fleet: installs its current release if this server has not yet.
    /// Returns whether it installed one.
    pub async fn follow(&self) -> Result<bool, ReleaseError> {
        let Some(latest) = self.releases.latest_seq().await? else {
            return Ok(false);
        };
        if self.installed_seq() >= Some(latest) {
            return Ok(false);
        }
        let _busy = self.busy.lock().await;
        let Some(entry) = self.releases.current().await? else {
            return Ok(false);
        };
        if self.installed_seq() >= Some(entry.seq) {
            return Ok(false);
        }
        self.install_entry(&entry).await?;
        Ok(true)
    }

    /// The path of a kept release's file (bundle or signature), fetched from the fleet
    /// database if this server does not hold it yet.
    pub async fn file(&self, id: &str, name: &str) -> Result<Option<PathBuf>, ReleaseError> {
        let Some(record) = self.releases.release(id).await? else {
            return Ok(None);
        };
        let known = record
            .all_files()
            .any(|f| f.name == name || layout::signature_file_name(&f.name) == name);
        if !known {
            return Ok(None);
        }
        self.ensure_local(&record).await?;
        Ok(Some(self.dir.join(id).join(name)))
    }

    async fn check(
        &self,
        dir: &Path,
        names: Vec<String>,
        trusted: TrustedKeys,
        max_unpacked: Option<u64>,
    ) -> Result<Checked, ReleaseError> {
        let dir = dir.to_owned();
        let mut keys = self.keys.clone();
        if keys.is_empty() {
            keys.extend(self.served_key.clone());
        }
        let served_key = self.served_key.clone();
        tokio::task::spawn_blocking(move || {
            let trusted = match trusted {
                TrustedKeys::Configured => check::Trusted::Keys(&keys),
                TrustedKeys::Shipped => check::Trusted::Shipped,
            };
            check::check_dir(&dir, &names, trusted, served_key.as_ref(), max_unpacked)
        })
        .await
        .map_err(|e| ReleaseError::Io(format!("the release check stopped: {e}")))?
        .map_err(ReleaseError::Refused)
    }

    async fn make_current(
        &self,
        record: &ReleaseRecord,
        kind: Kind,
        who: &str,
    ) -> Result<HistoryEntry, ReleaseError> {
        let kept = self.dir.join(&record.id);
        let mut read = |name: &str| {
            let path = kept.join(name);
            fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))
        };
        let entry = self
            .releases
            .make_current(record, kind, who, self.keep, &mut read)
            .await?;
        self.forget_unkept().await;
        Ok(entry)
    }

    /// The kept release `id`, its files under [`Publisher::kept_dir`] (fetched from the
    /// fleet database when another server published it).
    pub async fn kept_locally(&self, id: &str) -> Result<ReleaseRecord, ReleaseError> {
        let Some(record) = self.releases.release(id).await? else {
            return Err(ReleaseError::NotKept(format!(
                "release {id} is not kept; list them with `update-server release list`"
            )));
        };
        self.ensure_local(&record).await?;
        Ok(record)
    }

    /// Where the kept release `id`'s files are.
    pub fn kept_dir(&self, id: &str) -> PathBuf {
        self.dir.join(id)
    }

    /// Where this server's private copies of served bytes live.
    pub fn cache_dir(&self) -> PathBuf {
        self.store.cache_dir().to_owned()
    }

    /// Makes sure every file of `record` is under `<home>/releases/<id>/`, its bundles
    /// with their sha256 and its signatures as recorded.
    async fn ensure_local(&self, record: &ReleaseRecord) -> Result<(), ReleaseError> {
        let kept = self.dir.join(&record.id);
        fs::create_dir_all(&kept).map_err(|e| io_error(&kept, e))?;
        for file in record.all_files() {
            let path = kept.join(&file.name);
            let present = fs::metadata(&path)
                .map(|m| m.len() == file.size)
                .unwrap_or(false);
            if !present {
                let Some(bytes) = self.releases.file_data(&record.id, &file.name).await? else {
                    return Err(ReleaseError::Io(format!(
                        "{} of release {} is neither under {} nor in the fleet database; publish the release again",
                        file.name,
                        record.id,
                        kept.display()
                    )));
                };
                let sha256 = Digests::of_reader(bytes.as_slice())
                    .map_err(|e| io_error(&path, e))?
                    .sha256_hex();
                if sha256 != file.sha256 {
                    return Err(ReleaseError::Io(format!(
                        "{} of release {} in the fleet database has sha256 {sha256}, not {}; publish the release again",
                        file.name, record.id, file.sha256
                    )));
                }
                atomic::write(&path, &bytes).map_err(|e| io_error(&path, e))?;
            }
            let sig = kept.join(layout::signature_file_name(&file.name));
            if atomic::read_text(&sig, 64 * 1024).ok().as_deref() != Some(file.signature.as_str()) {
                atomic::write(&sig, file.signature.as_bytes()).map_err(|e| io_error(&sig, e))?;
            }
        }
        Ok(())
    }

    /// Writes `entry`'s release into the download directory whole and serves it.
    async fn install_entry(&self, entry: &HistoryEntry) -> Result<(), ReleaseError> {
        self.ensure_local(&entry.release).await?;
        let kept = self.dir.join(&entry.release.id);
        let names: Vec<String> = entry.release.all_files().map(|f| f.name.clone()).collect();
        let store = Arc::clone(&self.store);
        blocking(move || install(&store, &kept, &names)).await?;
        let path = self.dir.join(INSTALLED_FILE);
        atomic::write(&path, entry.seq.to_string().as_bytes()).map_err(|e| io_error(&path, e))?;
        self.installed.store(entry.seq, Ordering::Release);
        tracing::info!(
            release = %entry.release.id,
            kind = entry.kind.as_str(),
            by = %entry.who,
            "serving release {} from the fleet's releases",
            entry.release.id
        );
        Ok(())
    }

    fn installed_seq(&self) -> Option<i64> {
        Some(self.installed.load(Ordering::Acquire)).filter(|&seq| seq != NONE_INSTALLED)
    }

    /// Removes the kept directories of releases the history no longer keeps.
    async fn forget_unkept(&self) {
        let Ok(kept) = self.releases.kept().await else {
            return;
        };
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let is_release =
                entry.file_type().map(|t| t.is_dir()).unwrap_or(false) && !name.starts_with('.');
            if is_release && !kept.contains(&name) {
                let _ = fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// The newest `signed-at` of a kept release's signatures (checked when it was kept);
/// 0 for one that cannot be read.
fn signed_at_of(record: &ReleaseRecord) -> i64 {
    record
        .files
        .iter()
        .filter_map(|f| agent_protocol::minisign::Signature::parse(&f.signature).ok())
        .filter_map(|sig| agent_protocol::minisign::BundleClaim::parse(sig.trusted_comment()).ok())
        .map(|claim| i64::try_from(claim.signed_at).unwrap_or(i64::MAX))
        .max()
        .unwrap_or(0)
}

/// Which keys a check holds a release to (see [`check::Trusted`]).
#[derive(Debug, Clone, Copy)]
enum TrustedKeys {
    /// `releases.trusted-keys`, else `bundle.public-key`.
    Configured,
    /// Each bundle's own, for a hand drop on a server without a key of its own.
    Shipped,
}

/// Copies `names` from the download directory into a private directory: what is checked
/// and kept is what was copied, whatever happens to the operator's files meanwhile. Of a
/// signature no more is copied than shows it is too large to be one (the check refuses
/// it): a huge file beside a bundle is never read whole.
fn copy_files(from: &Path, to: &Path, names: &[String]) -> Result<(), ReleaseError> {
    use std::io::Read;
    for name in names {
        let source = from.join(name);
        let most = if name.ends_with(".minisig") {
            agent_extract::verify::MAX_SIGNATURE_FILE + 1
        } else {
            u64::MAX
        };
        let mut input = fs::File::open(&source).map_err(|e| io_error(&source, e))?;
        let target = to.join(name);
        let mut output = fs::File::create(&target).map_err(|e| io_error(&target, e))?;
        io::copy(&mut (&mut input).take(most), &mut output).map_err(|e| io_error(&source, e))?;
    }
    Ok(())
}

/// Whether the files `names` of `dir` are `release`'s: the same names, bundles of the same
/// sha256, the same signatures.
async fn same_files(
    dir: &Path,
    names: &[String],
    release: &ReleaseRecord,
) -> Result<bool, ReleaseError> {
    let mut expected: Vec<String> = release
        .all_files()
        .flat_map(|f| [f.name.clone(), layout::signature_file_name(&f.name)])
        .collect();
    expected.sort();
    if expected != names {
        return Ok(false);
    }
    let dir = dir.to_owned();
    let files: Vec<FileRecord> = release.all_files().cloned().collect();
    blocking(move || {
        for file in &files {
            let sig = dir.join(layout::signature_file_name(&file.name));
            if atomic::read_text(&sig, 64 * 1024).ok().as_deref() != Some(file.signature.as_str()) {
                return Ok(false);
            }
            let path = dir.join(&file.name);
            let digests = fs::File::open(&path)
                .and_then(Digests::of_reader)
                .map_err(|e| io_error(&path, e))?;
            if digests.sha256_hex() != file.sha256 {
                return Ok(false);
            }
        }
        Ok(true)
    })
    .await
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ReleaseError> + Send + 'static,
) -> Result<T, ReleaseError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ReleaseError::Io(format!("stopped: {e}")))?
}

fn record_of(checked: &Checked) -> ReleaseRecord {
    let files: Vec<FileRecord> = checked
        .bundles
        .iter()
        .map(|b| FileRecord {
            name: b.name.clone(),
            platform: b.platform.clone(),
            sha256: b.sha256.clone(),
            size: b.size,
            signature: b.signature.clone(),
        })
        .collect();
    let identity = crate::store::identity_of(
        files
            .iter()
            .map(|f| (f.platform.as_str(), f.sha256.as_str())),
    );
    let msi = checked.msi.as_ref().map(|m| FileRecord {
        name: m.name.clone(),
        platform: m.platform.clone(),
        sha256: m.sha256.clone(),
        size: m.size,
        signature: m.signature.clone(),
    });
    ReleaseRecord {
        id: checked.id(),
        identity,
        files,
        msi,
    }
}

/// Moves the checked files of an upload to the release's kept directory. Bundles the
/// directory already holds (the same release again) stay; signatures are the new ones.
fn keep_files(incoming: &Path, kept: &Path) -> Result<(), ReleaseError> {
    fs::create_dir_all(kept).map_err(|e| io_error(kept, e))?;
    let entries = fs::read_dir(incoming).map_err(|e| io_error(incoming, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| io_error(incoming, e))?;
        let target = kept.join(entry.file_name());
        fs::rename(entry.path(), &target).map_err(|e| io_error(&target, e))?;
    }
    Ok(())
}

/// Writes the files of `kept` into the store's download directory under hidden names,
/// renames them into place (each signature before its bundle), removes the bundles and
/// MSI of any other release, and has the store take the result, all while its scans are
/// held off: no scan ever sees half of it.
fn install(store: &BundleStore, kept: &Path, names: &[String]) -> Result<(), ReleaseError> {
    let dir = store.dir().to_owned();
    let held = store.hold();
    let mut staged = Vec::new();
    for name in names {
        for file in [layout::signature_file_name(name), name.clone()] {
            let hidden = dir.join(format!(".publish-{file}"));
            fs::copy(kept.join(&file), &hidden).map_err(|e| io_error(&hidden, e))?;
            fs::File::open(&hidden)
                .and_then(|f| f.sync_all())
                .map_err(|e| io_error(&hidden, e))?;
            staged.push((hidden, dir.join(&file)));
        }
    }
    for (hidden, target) in &staged {
        fs::rename(hidden, target).map_err(|e| io_error(target, e))?;
    }
    let ours: Vec<String> = names
        .iter()
        .flat_map(|n| [n.clone(), layout::signature_file_name(n)])
        .collect();
    let entries = fs::read_dir(&dir).map_err(|e| io_error(&dir, e))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let release_file = name.starts_with("agent-bundle-")
            || layout::is_msi_file_name(name.trim_end_matches(".minisig"));
        if release_file && !ours.contains(&name) {
            let _ = fs::remove_file(entry.path());
        }
    }
    if let Ok(d) = fs::File::open(&dir) {
        let _ = d.sync_all();
    }
    store.take_now(&held);
    Ok(())
}
