//! Published releases: what each release is (its files, their sha256 and signatures),
//! and the history of publishes and rollbacks, whose newest entry is the fleet's current
//! release.
//!
//! A release is known by `<version>+<build>`: one build number is one set of bytes, so a
//! second publish of the same id with other bytes is a [`FleetError::Conflict`]. With
//! PostgreSQL each file's bytes are kept in the database, so every server of the fleet
//! can serve a release another server took in; with SQLite (one server) the edge keeps
//! them under its home and passes none. The checks that make a release publishable (its
//! signatures, one version, one bundle per platform) belong to the edge that reads the
//! files; this module stores what passed them.

use serde::Serialize;
use sqlx::Row;

use crate::db::{Db, now_ms};
use crate::error::FleetError;

/// Releases kept before the current one, unless configured (`releases.keep`).
pub const DEFAULT_KEEP: usize = 5;

/// One file of a release: a bundle, with its signature's text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileRecord {
    pub name: String,
    pub platform: String,
    pub sha256: String,
    pub size: u64,
    #[serde(skip)]
    pub signature: String,
}

/// A release as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseRecord {
    /// `<version>+<build>`.
    pub id: String,
    /// What the rollout engine knows it by (the served release's identity): its bundles'.
    pub identity: String,
    /// Its bundles.
    pub files: Vec<FileRecord>,
    /// Its Windows MSI (`agent-<version>-<target>.msi`), if it carries one: served to
    /// install machines, never offered to agents, so no part of the identity.
    pub msi: Option<FileRecord>,
}

impl ReleaseRecord {
    /// Its bundles and its MSI: every file kept for it (each with a `.minisig`).
    pub fn all_files(&self) -> impl Iterator<Item = &FileRecord> {
        self.files.iter().chain(self.msi.iter())
    }
}

/// `release_files.kind` of a bundle.
const KIND_BUNDLE: &str = "bundle";
/// `release_files.kind` of a release's MSI.
const KIND_MSI: &str = "msi";

/// How a release became the current one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Publish,
    Rollback,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Publish => "publish",
            Kind::Rollback => "rollback",
        }
    }

    fn parse(text: &str) -> Self {
        if text == "rollback" {
            Kind::Rollback
        } else {
            Kind::Publish
        }
    }
}

/// One entry of the history: a release made current, when and by whom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryEntry {
    /// Grows with every entry: a server that served entry `seq` follows any greater one.
    pub seq: i64,
    pub kind: Kind,
    /// Unix milliseconds.
    pub at: i64,
    pub who: String,
    pub release: ReleaseRecord,
}

/// The releases of a fleet database.
#[derive(Clone)]
pub struct Releases {
    db: Db,
}

/// The refusal of a release id published before with other bytes.
pub fn other_bytes(id: &str) -> FleetError {
    FleetError::Conflict(format!(
        "release {id} was published before with other bytes: one build number is one set of bytes; give the new build its own build number"
    ))
}

/// Why `new` cannot be kept as the release `known` (the same id, kept before): other
/// bundles, or another MSI than the one it carries. `None` when it is the same bytes
/// (fresh signatures, or an MSI it did not carry yet).
pub fn conflict(known: &ReleaseRecord, new: &ReleaseRecord) -> Option<FleetError> {
    if known.identity != new.identity {
        return Some(other_bytes(&new.id));
    }
    match (&known.msi, &new.msi) {
        (Some(k), Some(n)) if k.sha256 != n.sha256 => Some(other_msi(&new.id)),
        _ => None,
    }
}

fn other_msi(id: &str) -> FleetError {
    FleetError::Conflict(format!(
        "release {id} was published before with another MSI: one build number is one set of bytes; give the new build its own build number"
    ))
}

impl Releases {
    pub fn new(db: Db) -> Self {
        Self { db }
    }

    /// Whether this fleet keeps release bytes in the database (PostgreSQL) rather than
    /// under one server's home.
    pub fn keeps_bytes(&self) -> bool {
        self.db.backend() == crate::db::Backend::Postgres
    }

    /// Stores `release` (a new one, or the same bytes again with fresh signatures) and
    /// makes it current. `data` gives each file's bytes when [`Self::keeps_bytes`]; it is
    /// asked once per file and only for a release the database does not hold yet.
    /// Releases that fall out of the last `keep` before the current one are forgotten.
    pub async fn make_current(
        &self,
        release: &ReleaseRecord,
        kind: Kind,
        who: &str,
        keep: usize,
        data: &mut (dyn FnMut(&str) -> Result<Vec<u8>, String> + Send),
    ) -> Result<HistoryEntry, FleetError> {
        let at = now_ms();
        let mut tx = self.db.begin_write().await?;
        self.store(&mut tx, release, at, data).await?;
        sqlx::query(
            "INSERT INTO release_history (release_id, kind, at, who) VALUES ($1, $2, $3, $4)",
        )
        .bind(&release.id)
        .bind(kind.as_str())
        .bind(at)
        .bind(who)
        .execute(&mut *tx)
        .await?;
        let seq: i64 = sqlx::query("SELECT MAX(seq) AS seq FROM release_history")
            .fetch_one(&mut *tx)
            .await?
            .try_get("seq")?;
        forget_beyond(&mut tx, keep).await?;
        tx.commit().await?;
        Ok(HistoryEntry {
            seq,
            kind,
            at,
            who: who.to_owned(),
            release: release.clone(),
        })
    }

    /// Stores `release` (a new one, or the same bytes again with fresh signatures)
    /// without making it current: what `release publish --deployment NAME` keeps for a
    /// deployment to name. Pruning spares a release some deployment names.
    pub async fn keep_release(
        &self,
        release: &ReleaseRecord,
        data: &mut (dyn FnMut(&str) -> Result<Vec<u8>, String> + Send),
    ) -> Result<(), FleetError> {
        let mut tx = self.db.begin_write().await?;
        self.store(&mut tx, release, now_ms(), data).await?;
        tx.commit().await?;
        Ok(())
    }

    /// The rows of `release` and its files, inserted or (same bytes) re-signed.
    async fn store(
        &self,
        tx: &mut sqlx::Transaction<'static, sqlx::Any>,
        release: &ReleaseRecord,
        at: i64,
        data: &mut (dyn FnMut(&str) -> Result<Vec<u8>, String> + Send),
    ) -> Result<(), FleetError> {
        let known = sqlx::query("SELECT identity FROM releases WHERE id = $1")
            .bind(&release.id)
            .fetch_optional(&mut **tx)
            .await?;
        match known {
            Some(row) => {
                let identity: String = row.try_get("identity")?;
                if identity != release.identity {
                    return Err(other_bytes(&release.id));
                }
                for file in &release.files {
                    self.resign(tx, &release.id, file).await?;
                }
                if let Some(msi) = &release.msi {
                    let kept = sqlx::query(
                        "SELECT sha256 FROM release_files WHERE release_id = $1 AND kind = $2",
                    )
                    .bind(&release.id)
                    .bind(KIND_MSI)
                    .fetch_optional(&mut **tx)
                    .await?;
                    match kept {
                        None => self.insert(tx, &release.id, msi, KIND_MSI, data).await?,
                        Some(row) if row.try_get::<String, _>("sha256")? == msi.sha256 => {
                            self.resign(tx, &release.id, msi).await?;
                        }
                        Some(_) => return Err(other_msi(&release.id)),
                    }
                }
            }
            None => {
                sqlx::query("INSERT INTO releases (id, identity, created_at) VALUES ($1, $2, $3)")
                    .bind(&release.id)
                    .bind(&release.identity)
                    .bind(at)
                    .execute(&mut **tx)
                    .await?;
                for file in &release.files {
                    self.insert(tx, &release.id, file, KIND_BUNDLE, data)
                        .await?;
                }
                if let Some(msi) = &release.msi {
                    self.insert(tx, &release.id, msi, KIND_MSI, data).await?;
                }
            }
        }
        Ok(())
    }

    /// The row of `file` of release `id`, of `kind`, with its bytes when
    /// [`Self::keeps_bytes`].
    async fn insert(
        &self,
        tx: &mut sqlx::Transaction<'static, sqlx::Any>,
        id: &str,
        file: &FileRecord,
        kind: &str,
        data: &mut (dyn FnMut(&str) -> Result<Vec<u8>, String> + Send),
    ) -> Result<(), FleetError> {
        let bytes = if self.keeps_bytes() {
            Some(data(&file.name).map_err(FleetError::Invalid)?)
        } else {
            None
        };
        sqlx::query(
            "INSERT INTO release_files (release_id, name, platform, sha256, size, signature, data, kind) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(id)
        .bind(&file.name)
        .bind(&file.platform)
        .bind(&file.sha256)
        .bind(file.size as i64)
        .bind(&file.signature)
        .bind(bytes)
        .bind(kind)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    /// `file`'s signature of release `id` replaced (the same bytes signed again).
    async fn resign(
        &self,
        tx: &mut sqlx::Transaction<'static, sqlx::Any>,
        id: &str,
        file: &FileRecord,
    ) -> Result<(), FleetError> {
        sqlx::query("UPDATE release_files SET signature = $1 WHERE release_id = $2 AND name = $3")
            .bind(&file.signature)
            .bind(id)
            .bind(&file.name)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    /// The newest history entry's number, if any release was ever published: what a
    /// server polls to follow the fleet.
    pub async fn latest_seq(&self) -> Result<Option<i64>, FleetError> {
        let row = sqlx::query("SELECT MAX(seq) AS seq FROM release_history")
            .fetch_one(self.db.pool())
            .await?;
        Ok(row.try_get::<Option<i64>, _>("seq")?)
    }

    /// The current release and up to `before` entries before it, newest first.
    pub async fn history(&self, before: usize) -> Result<Vec<HistoryEntry>, FleetError> {
        let rows = sqlx::query(
            "SELECT h.seq, h.release_id, h.kind, h.at, h.who, r.identity FROM release_history h JOIN releases r ON r.id = h.release_id ORDER BY h.seq DESC LIMIT $1",
        )
        .bind(before as i64 + 1)
        .fetch_all(self.db.pool())
        .await?;
        let mut entries = Vec::with_capacity(rows.len());
        for row in rows {
            let id: String = row.try_get("release_id")?;
            let (files, msi) = self.files(&id).await?;
            entries.push(HistoryEntry {
                seq: row.try_get("seq")?,
                kind: Kind::parse(&row.try_get::<String, _>("kind")?),
                at: row.try_get("at")?,
                who: row.try_get("who")?,
                release: ReleaseRecord {
                    id,
                    identity: row.try_get("identity")?,
                    files,
                    msi,
                },
            });
        }
        Ok(entries)
    }

    /// The current release, if any was published.
    pub async fn current(&self) -> Result<Option<HistoryEntry>, FleetError> {
        Ok(self.history(0).await?.into_iter().next())
    }

    /// A kept release by its id.
    pub async fn release(&self, id: &str) -> Result<Option<ReleaseRecord>, FleetError> {
        let Some(row) = sqlx::query("SELECT identity FROM releases WHERE id = $1")
            .bind(id)
            .fetch_optional(self.db.pool())
            .await?
        else {
            return Ok(None);
        };
        let (files, msi) = self.files(id).await?;
        Ok(Some(ReleaseRecord {
            id: id.to_owned(),
            identity: row.try_get("identity")?,
            files,
            msi,
        }))
    }

    /// The ids of the kept releases, newest first.
    pub async fn kept(&self) -> Result<Vec<String>, FleetError> {
        let rows = sqlx::query("SELECT id FROM releases ORDER BY created_at DESC, id")
            .fetch_all(self.db.pool())
            .await?;
        rows.iter()
            .map(|r| r.try_get::<String, _>("id").map_err(FleetError::from))
            .collect()
    }

    /// A file's bytes, when the database keeps them.
    pub async fn file_data(&self, id: &str, name: &str) -> Result<Option<Vec<u8>>, FleetError> {
        let row = sqlx::query("SELECT data FROM release_files WHERE release_id = $1 AND name = $2")
            .bind(id)
            .bind(name)
            .fetch_optional(self.db.pool())
            .await?;
        match row {
            Some(row) => Ok(row.try_get::<Option<Vec<u8>>, _>("data")?),
            None => Ok(None),
        }
    }

    /// Release `id`'s bundles, and its MSI if it carries one.
    async fn files(&self, id: &str) -> Result<(Vec<FileRecord>, Option<FileRecord>), FleetError> {
        let rows = sqlx::query(
            "SELECT name, platform, sha256, size, signature, kind FROM release_files WHERE release_id = $1 ORDER BY platform, name",
        )
        .bind(id)
        .fetch_all(self.db.pool())
        .await?;
        let mut files = Vec::with_capacity(rows.len());
        let mut msi = None;
        for row in rows {
            let file = FileRecord {
                name: row.try_get("name")?,
                platform: row.try_get("platform")?,
                sha256: row.try_get("sha256")?,
                size: row.try_get::<i64, _>("size")?.max(0) as u64,
                signature: row.try_get("signature")?,
            };
            if row.try_get::<String, _>("kind")? == KIND_MSI {
                msi = Some(file);
            } else {
                files.push(file);
            }
        }
        Ok((files, msi))
    }
}

/// How the fleet's current published release became current, if its identity is
/// `identity`: an operator's act for the whole fleet, which replaces a rollout under way
/// and, when a rollback, rolls an older version out without waiting for `rollout resume`.
pub async fn current_act(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    identity: &str,
) -> Result<Option<Kind>, FleetError> {
    let row = sqlx::query(
        "SELECT h.kind, r.identity FROM release_history h JOIN releases r ON r.id = h.release_id ORDER BY h.seq DESC LIMIT 1",
    )
    .fetch_optional(&mut **tx)
    .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let current: String = row.try_get("identity")?;
    if current != identity {
        return Ok(None);
    }
    Ok(Some(Kind::parse(&row.try_get::<String, _>("kind")?)))
}

/// Forgets history beyond the current entry and `keep` before it, and the releases no
/// kept entry names.
async fn forget_beyond(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    keep: usize,
) -> Result<(), FleetError> {
    let oldest_kept =
        sqlx::query("SELECT seq FROM release_history ORDER BY seq DESC LIMIT 1 OFFSET $1")
            .bind(keep as i64)
            .fetch_optional(&mut **tx)
            .await?;
    let Some(oldest_kept) = oldest_kept else {
        return Ok(());
    };
    let oldest_kept: i64 = oldest_kept.try_get("seq")?;
    sqlx::query("DELETE FROM release_history WHERE seq < $1")
        .bind(oldest_kept)
        .execute(&mut **tx)
        .await?;
    // A release some deployment names stays, however old; so does one a change waiting
    // for approval names (its bytes are what approving it publishes).
    sqlx::query(
        "DELETE FROM release_files WHERE release_id NOT IN (SELECT release_id FROM release_history)
           AND release_id NOT IN (SELECT release_id FROM deployments WHERE release_id IS NOT NULL)
           AND release_id NOT IN (SELECT release_id FROM approvals WHERE state = 'awaiting-approval' AND release_id IS NOT NULL)",
    )
    .execute(&mut **tx)
    .await?;
    sqlx::query(
        "DELETE FROM releases WHERE id NOT IN (SELECT release_id FROM release_history)
           AND id NOT IN (SELECT release_id FROM deployments WHERE release_id IS NOT NULL)
           AND id NOT IN (SELECT release_id FROM approvals WHERE state = 'awaiting-approval' AND release_id IS NOT NULL)",
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn release(id: &str, identity: &str) -> ReleaseRecord {
        ReleaseRecord {
            id: id.into(),
            identity: identity.into(),
            files: vec![FileRecord {
                name: format!("agent-bundle-{id}-x86_64-unknown-linux-gnu"),
                platform: "x86_64-unknown-linux-gnu".into(),
                sha256: identity.into(),
                size: 3,
                signature: format!("sig of {id}"),
            }],
            msi: None,
        }
    }

    fn msi(id: &str, sha256: &str) -> FileRecord {
        let version = id.split('+').next().unwrap_or(id);
        FileRecord {
            name: format!("agent-{version}-x86_64-pc-windows-gnu.msi"),
            platform: "x86_64-pc-windows-gnu".into(),
            sha256: sha256.into(),
            size: 5,
            signature: format!("msi sig of {id}"),
        }
    }

    async fn db() -> (tempfile::TempDir, Releases) {
        let home = tempfile::tempdir().unwrap();
        let db = Db::open("", home.path(), 4).await.unwrap();
        (home, Releases::new(db))
    }

    fn no_bytes(_: &str) -> Result<Vec<u8>, String> {
        Ok(Vec::new())
    }

    #[tokio::test]
    async fn the_newest_entry_is_current_and_history_keeps_the_last_few() {
        let (_home, releases) = db().await;
        assert_eq!(releases.latest_seq().await.unwrap(), None);
        assert!(releases.current().await.unwrap().is_none());
        for build in 1..=4 {
            let id = format!("1.0.0+{build}");
            releases
                .make_current(
                    &release(&id, &format!("{build:064}")),
                    Kind::Publish,
                    "ops",
                    2,
                    &mut no_bytes,
                )
                .await
                .unwrap();
        }
        let history = releases.history(5).await.unwrap();
        let ids: Vec<&str> = history.iter().map(|h| h.release.id.as_str()).collect();
        assert_eq!(
            ids,
            ["1.0.0+4", "1.0.0+3", "1.0.0+2"],
            "the current and 2 before it"
        );
        assert!(
            releases.release("1.0.0+1").await.unwrap().is_none(),
            "forgotten"
        );
        assert_eq!(history[0].who, "ops");
        assert_eq!(releases.latest_seq().await.unwrap(), Some(history[0].seq));
    }

    #[tokio::test]
    async fn a_rollback_makes_a_kept_release_current_with_its_new_signatures() {
        let (_home, releases) = db().await;
        let old = release("1.0.0+1", &"1".repeat(64));
        releases
            .make_current(&old, Kind::Publish, "ops", 5, &mut no_bytes)
            .await
            .unwrap();
        releases
            .make_current(
                &release("1.0.0+2", &"2".repeat(64)),
                Kind::Publish,
                "ops",
                5,
                &mut no_bytes,
            )
            .await
            .unwrap();
        let mut again = old.clone();
        again.files[0].signature = "fresh".into();
        let entry = releases
            .make_current(&again, Kind::Rollback, "alice", 5, &mut no_bytes)
            .await
            .unwrap();
        let current = releases.current().await.unwrap().unwrap();
        assert_eq!(current.seq, entry.seq);
        assert_eq!(current.kind, Kind::Rollback);
        assert_eq!(current.release.id, "1.0.0+1");
        assert_eq!(current.release.files[0].signature, "fresh");
        assert_eq!(releases.history(5).await.unwrap().len(), 3);
    }

    #[tokio::test]
    async fn one_build_number_is_one_set_of_bytes() {
        let (_home, releases) = db().await;
        releases
            .make_current(
                &release("1.0.0+1", &"1".repeat(64)),
                Kind::Publish,
                "ops",
                5,
                &mut no_bytes,
            )
            .await
            .unwrap();
        let e = releases
            .make_current(
                &release("1.0.0+1", &"9".repeat(64)),
                Kind::Publish,
                "ops",
                5,
                &mut no_bytes,
            )
            .await
            .unwrap_err();
        assert!(matches!(e, FleetError::Conflict(_)), "{e}");
        assert_eq!(
            releases.history(5).await.unwrap().len(),
            1,
            "nothing changed"
        );
    }

    #[tokio::test]
    async fn a_release_keeps_its_msi_beside_its_bundles_and_one_build_has_one_msi() {
        let (_home, releases) = db().await;
        let mut with_msi = release("1.0.0+1", &"1".repeat(64));
        with_msi.msi = Some(msi("1.0.0+1", &"a".repeat(64)));
        releases
            .make_current(&with_msi, Kind::Publish, "ops", 5, &mut no_bytes)
            .await
            .unwrap();
        let current = releases.current().await.unwrap().unwrap();
        assert_eq!(
            current.release, with_msi,
            "the MSI is not one of its bundles"
        );
        assert_eq!(current.release.all_files().count(), 2);

        // The same build again with another MSI: refused, nothing changed.
        let mut other = with_msi.clone();
        other.msi = Some(msi("1.0.0+1", &"b".repeat(64)));
        assert!(conflict(&with_msi, &other).is_some());
        assert!(conflict(&with_msi, &with_msi).is_none());
        let mut bare = with_msi.clone();
        bare.msi = None;
        assert!(
            conflict(&bare, &with_msi).is_none(),
            "an MSI it did not carry yet"
        );
        let e = releases
            .keep_release(&other, &mut no_bytes)
            .await
            .unwrap_err();
        assert!(
            matches!(&e, FleetError::Conflict(m) if m.contains("another MSI")),
            "{e}"
        );
        let kept = releases.release("1.0.0+1").await.unwrap().unwrap();
        assert_eq!(kept.msi, with_msi.msi);

        // A kept release without one takes its MSI later; its signature may be renewed.
        let bare = release("1.0.0+2", &"2".repeat(64));
        releases.keep_release(&bare, &mut no_bytes).await.unwrap();
        assert_eq!(
            releases.release("1.0.0+2").await.unwrap().unwrap().msi,
            None
        );
        let mut later = bare.clone();
        later.msi = Some(msi("1.0.0+2", &"c".repeat(64)));
        releases.keep_release(&later, &mut no_bytes).await.unwrap();
        if let Some(m) = later.msi.as_mut() {
            m.signature = "fresh".into();
        }
        releases.keep_release(&later, &mut no_bytes).await.unwrap();
        assert_eq!(
            releases.release("1.0.0+2").await.unwrap().unwrap().msi,
            later.msi
        );
    }
}
