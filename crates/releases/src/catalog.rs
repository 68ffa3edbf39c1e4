//! The releases served beside the current one: every kept release some deployment names
//! ([`agent_fleet::deployments`]), read from `<home>/releases/<id>/` (fetched from the
//! fleet database first when another server published it) into this server's private
//! copies, and answered by `?release=<version>+<build>` on the version, signature and
//! download endpoints, and on `/agentupdate/agent.msi` when it carries an MSI. The current release stays the store's ([`crate::store`]).
//!
//! A kept release passed a publish's checks when it was taken; it is not checked again
//! here, only its bytes against the sha256 the history holds.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use agent_fleet::releases::ReleaseRecord;
use agent_protocol::AgentVersion;
use agent_protocol::digest::MultiHasher;
use agent_protocol::wire::VersionInfo;
use bytes::Bytes;

use crate::publish::{Publisher, ReleaseError};
use crate::store::{Release, ServedBundle, ServedMsi};

/// The kept releases this server serves by name, as last loaded.
#[derive(Default)]
pub struct Catalog {
    releases: RwLock<HashMap<String, Arc<Release>>>,
}

impl Catalog {
    /// The release `id` (`<version>+<build>`), if loaded.
    pub fn get(&self, id: &str) -> Option<Arc<Release>> {
        self.releases
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    /// The release `id`, loaded the first time it is asked for (and again when its
    /// signatures changed: a rollback re-signs kept bytes).
    pub async fn load(
        &self,
        publisher: &Publisher,
        id: &str,
    ) -> Result<Arc<Release>, ReleaseError> {
        let record = publisher.kept_locally(id).await?;
        if let Some(loaded) = self.get(id)
            && same_signatures(&loaded, &record)
        {
            return Ok(loaded);
        }
        let dir = publisher.kept_dir(id);
        let cache = publisher.cache_dir();
        let own = agent_protocol::layout::PLATFORM;
        let release = tokio::task::spawn_blocking(move || read_release(&dir, &cache, &record, own))
            .await
            .map_err(|e| ReleaseError::Io(format!("stopped: {e}")))??;
        let release = Arc::new(release);
        self.releases
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.to_owned(), Arc::clone(&release));
        Ok(release)
    }

    /// Forgets the releases no deployment names any more.
    pub fn retain(&self, ids: &[String]) {
        self.releases
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|id, _| ids.contains(id));
    }
}

fn same_signatures(loaded: &Release, record: &ReleaseRecord) -> bool {
    let msi = match (loaded.msi(), &record.msi) {
        (None, None) => true,
        (Some(l), Some(r)) => l.sha256 == r.sha256 && l.signature == r.signature,
        _ => false,
    };
    msi && record.files.iter().all(|f| {
        loaded
            .bundles()
            .iter()
            .any(|b| b.info.sha256 == f.sha256 && b.signature.as_deref() == Some(&f.signature))
    })
}

/// Reads the kept release `record` from `dir` into private copies under `cache`.
fn read_release(
    dir: &Path,
    cache: &Path,
    record: &ReleaseRecord,
    own: &str,
) -> Result<Release, ReleaseError> {
    let version: AgentVersion = record.id.parse().map_err(|e| {
        ReleaseError::Io(format!(
            "release id {:?} is not <version>+<build>: {e}",
            record.id
        ))
    })?;
    let mut bundles = Vec::with_capacity(record.files.len());
    for file in &record.files {
        let (data, md5) = private_copy(&dir.join(&file.name), cache, &file.sha256)?;
        let last_modified = fs::metadata(dir.join(&file.name))
            .and_then(|m| m.modified())
            .unwrap_or(SystemTime::UNIX_EPOCH);
        bundles.push(Arc::new(ServedBundle {
            etag: format!("\"{}\"", file.sha256),
            info: VersionInfo {
                server_version: env!("CARGO_PKG_VERSION").to_owned(),
                server_build: option_env!("UPDATE_SERVER_BUILD").unwrap_or("0").to_owned(),
                agent: version.clone(),
                md5,
                sha256: file.sha256.clone(),
                size: data.len() as u64,
                filename: file.name.clone(),
                download_source: None,
            },
            platform: file.platform.clone(),
            data,
            signature: Some(file.signature.clone()),
            last_modified,
        }));
    }
    let release = Release::assemble(bundles, own);
    let release = match &record.msi {
        None => release,
        Some(file) => {
            let path = dir.join(&file.name);
            let (data, _) = private_copy(&path, cache, &file.sha256)?;
            let last_modified = fs::metadata(&path)
                .and_then(|m| m.modified())
                .unwrap_or(SystemTime::UNIX_EPOCH);
            release.and_then(|r| {
                r.with_msi(Arc::new(ServedMsi {
                    filename: file.name.clone(),
                    platform: file.platform.clone(),
                    version: version.clone(),
                    sha256: file.sha256.clone(),
                    data,
                    signature: file.signature.clone(),
                    last_modified,
                    etag: format!("\"{}\"", file.sha256),
                }))
            })
        }
    };
    release.map_err(|e| ReleaseError::Io(format!("release {}: {e}", record.id)))
}

/// This server's write-once copy of `kept` (what its bytes are mapped from, as the
/// store's are), checked against `sha256`; the bytes and their md5.
fn private_copy(kept: &Path, cache: &Path, sha256: &str) -> Result<(Bytes, String), ReleaseError> {
    let io = |what: &Path, e: std::io::Error| ReleaseError::Io(format!("{}: {e}", what.display()));
    let mut input = File::open(kept).map_err(|e| io(kept, e))?;
    let mut tmp = tempfile::Builder::new()
        .prefix(".kept-")
        .tempfile_in(cache)
        .map_err(|e| io(cache, e))?;
    let mut hasher = MultiHasher::new();
    let mut buf = vec![0u8; agent_protocol::digest::CHUNK];
    loop {
        let n = input.read(&mut buf).map_err(|e| io(kept, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        tmp.write_all(&buf[..n]).map_err(|e| io(cache, e))?;
    }
    let digests = hasher.finish();
    if digests.sha256_hex() != sha256 {
        return Err(ReleaseError::Io(format!(
            "{} has sha256 {}, not {sha256} as the release history says; publish the release again",
            kept.display(),
            digests.sha256_hex()
        )));
    }
    tmp.as_file().sync_all().map_err(|e| io(cache, e))?;
    crate::store::read_only(tmp.as_file());
    let path = cache.join(format!("kept-{sha256}"));
    tmp.persist(&path)
        .map_err(|e| ReleaseError::Io(format!("{}: {}", path.display(), e.error)))?;
    let file = File::open(&path).map_err(|e| io(&path, e))?;
    let data = crate::store::map(&file).map_err(|e| io(&path, e))?;
    Ok((data, digests.md5_hex()))
}
