//! The releases served beside the current one: every kept release some deployment names
//! ([`agent_fleet::deployments`]), read from `<home>/releases/<id>/` (fetched from the
//! fleet database first when another server published it) into this server's private
//! copies, and answered by `?release=<version>+<build>` on the version, signature and
//! download endpoints, and on `/agentupdate/agent.msi` when it carries an MSI. The current release stays the store's ([`crate::store`]).
//!
//! A kept release passed a publish's checks when it was taken; it is not checked again
//! here, only its bytes against the sha256 the history holds.

use std::collections::{HashMap, HashSet};
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

/// The name of a private copy of a kept release's file under the cache: this prefix,
/// then its sha256.
const KEPT_PREFIX: &str = "kept-";

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

    /// Forgets the releases no deployment names any more, and removes from `cache` the
    /// private copies (`kept-<sha256>`) that no release still served by name holds:
    /// running downloads keep their map of a removed copy until they end. Without this a
    /// copy outlived its deployment, one per bundle of every release a deployment ever
    /// named.
    pub fn retain(&self, ids: &[String], cache: &Path) {
        let mut releases = self.releases.write().unwrap_or_else(|p| p.into_inner());
        releases.retain(|id, _| ids.contains(id));
        let held: HashSet<String> = releases
            .values()
            .flat_map(|r| {
                r.bundles()
                    .iter()
                    .map(|b| b.info.sha256.clone())
                    .chain(r.msi().map(|m| m.sha256.clone()))
            })
            .collect();
        drop(releases);
        remove_unheld_copies(cache, &held);
    }
}

/// Removes the `kept-<sha256>` files of `cache` whose sha256 is not in `held`.
fn remove_unheld_copies(cache: &Path, held: &HashSet<String>) {
    crate::store::remove_cache_files(cache, |_, name| {
        name.strip_prefix(KEPT_PREFIX)
            .is_some_and(|sha256| !held.contains(sha256))
    });
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
    let path = cache.join(format!("{KEPT_PREFIX}{sha256}"));
    tmp.persist(&path)
        .map_err(|e| ReleaseError::Io(format!("{}: {}", path.display(), e.error)))?;
    let file = File::open(&path).map_err(|e| io(&path, e))?;
    let data = crate::store::map(&file).map_err(|e| io(&path, e))?;
    Ok((data, digests.md5_hex()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sample_bundle;

    const GNU: &str = "x86_64-unknown-linux-gnu";
    const ARM: &str = "aarch64-unknown-linux-gnu";

    fn release(version: &str) -> Arc<Release> {
        let bundles = [GNU, ARM]
            .iter()
            .map(|p| sample_bundle(version.parse().unwrap(), p))
            .collect();
        Arc::new(Release::assemble(bundles, GNU).unwrap())
    }

    fn shas(release: &Release) -> Vec<String> {
        release
            .bundles()
            .iter()
            .map(|b| b.info.sha256.clone())
            .collect()
    }

    #[test]
    fn the_copies_of_a_release_no_deployment_names_are_removed_with_it() {
        let cache = tempfile::tempdir().unwrap();
        let catalog = Catalog::default();
        let (kept, gone) = (release("1.0.0+1"), release("1.1.0+2"));
        for (id, r) in [("1.0.0+1", &kept), ("1.1.0+2", &gone)] {
            catalog
                .releases
                .write()
                .unwrap()
                .insert(id.to_owned(), Arc::clone(r));
            for sha in shas(r) {
                fs::write(cache.path().join(format!("{KEPT_PREFIX}{sha}")), b"x").unwrap();
            }
        }
        // The store's own copies are the store's to remove.
        fs::write(
            cache.path().join(format!("bundle-{}", "e".repeat(64))),
            b"x",
        )
        .unwrap();

        catalog.retain(&["1.0.0+1".to_owned()], cache.path());

        assert!(catalog.get("1.1.0+2").is_none());
        assert!(catalog.get("1.0.0+1").is_some());
        let mut left: Vec<String> = fs::read_dir(cache.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        let mut want: Vec<String> = shas(&kept)
            .into_iter()
            .map(|sha| format!("{KEPT_PREFIX}{sha}"))
            .chain([format!("bundle-{}", "e".repeat(64))])
            .collect();
        want.sort();
        assert_eq!(
            left, want,
            "the forgotten release's copies went, no other file"
        );

        // No deployment left: every copy of a kept release goes.
        catalog.retain(&[], cache.path());
        assert_eq!(fs::read_dir(cache.path()).unwrap().count(), 1);
    }
}
