//! A consistent copy of the fleet database while the server runs (`update-server backup`).
//!
//! SQLite: `VACUUM INTO` through the pool, a snapshot of one read transaction that the
//! running server's writers do not wait for. It is written beside the target as
//! `<FILE>.part` (made empty, owner-only, before SQLite fills it), synced, and renamed
//! to `<FILE>` only once complete: a backup that was cut short never looks like one. An
//! existing `<FILE>` is refused, never overwritten. PostgreSQL is backed up with its own
//! tool: [`pg_dump_advice`] says how.

use std::path::{Path, PathBuf};

use crate::db::{Backend, Db};
use crate::error::FleetError;

/// What a finished backup wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    pub path: PathBuf,
    pub bytes: u64,
}

/// Whether `url` (`database.url`) names a PostgreSQL database, which this command does
/// not copy.
pub fn is_postgres(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// The `pg_dump` command line that backs up the PostgreSQL database at `url` into
/// `out`, with the password left out of the URL (pg_dump reads it from `PGPASSWORD` or
/// `~/.pgpass`), and how to restore it.
pub fn pg_dump_advice(url: &str, out: &Path) -> String {
    format!(
        "the fleet database is PostgreSQL: back it up with its own tool, e.g.\n  pg_dump --format=custom --file={} '{}'\n(the password from PGPASSWORD or ~/.pgpass), and restore it with pg_restore --clean --dbname=URL {}",
        out.display(),
        without_password(url),
        out.display()
    )
}

/// `url` with the password of its `user:password@` part removed.
fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}@{host}{path}")
        }
        None => url.to_owned(),
    }
}

/// `<out>.part`, where the copy is written before it is complete.
pub fn part_path(out: &Path) -> PathBuf {
    let mut name = out.as_os_str().to_owned();
    name.push(".part");
    PathBuf::from(name)
}

/// Copies the SQLite fleet database behind `db` into `out` (see the module doc).
pub async fn sqlite_backup(db: &Db, out: &Path) -> Result<Written, FleetError> {
    if db.backend() != Backend::Sqlite {
        return Err(FleetError::Invalid(
            "the fleet database is PostgreSQL: back it up with pg_dump".into(),
        ));
    }
    if out.exists() {
        return Err(FleetError::Conflict(format!(
            "{} exists; a backup never overwrites a file: name a new one, or remove it first",
            out.display()
        )));
    }
    let io =
        |path: &Path, e: std::io::Error| FleetError::Invalid(format!("{}: {e}", path.display()));
    let part = part_path(out);
    create_owner_only(&part).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            FleetError::Conflict(format!(
                "{} exists: another backup is being written, or one was cut short (remove it then)",
                part.display()
            ))
        } else {
            io(&part, e)
        }
    })?;
    let Some(target) = part.to_str() else {
        let _ = std::fs::remove_file(&part);
        return Err(FleetError::Invalid(format!(
            "{}: the path is not UTF-8; name a backup file SQLite can open",
            out.display()
        )));
    };
    let copied = sqlx::query("VACUUM INTO $1")
        .bind(target.to_owned())
        .execute(db.pool())
        .await;
    if let Err(e) = copied {
        let _ = std::fs::remove_file(&part);
        return Err(e.into());
    }
    let finished = (|| {
        std::fs::File::open(&part)?.sync_all()?;
        if out.exists() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "appeared while the backup was written; the copy is left out of its way",
            ));
        }
        std::fs::rename(&part, out)?;
        std::fs::metadata(out).map(|m| m.len())
    })();
    match finished {
        Ok(bytes) => Ok(Written {
            path: out.to_owned(),
            bytes,
        }),
        Err(e) => {
            let _ = std::fs::remove_file(&part);
            Err(io(out, e))
        }
    }
}

/// An empty file only its owner may read: SQLite fills an existing empty file and keeps
/// its mode (the database holds agents' credential hashes).
fn create_owner_only(path: &Path) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options.open(path).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_backup_is_a_database_with_the_same_rows_and_never_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open("", dir.path(), 1).await.unwrap();
        sqlx::query("CREATE TABLE backup_probe (name TEXT NOT NULL)")
            .execute(db.pool())
            .await
            .unwrap();
        for name in ["a", "b", "c"] {
            sqlx::query("INSERT INTO backup_probe (name) VALUES ($1)")
                .bind(name)
                .execute(db.pool())
                .await
                .unwrap();
        }
        let out = dir.path().join("copy.db");
        let written = sqlite_backup(&db, &out).await.unwrap();
        assert_eq!(written.path, out);
        assert_eq!(written.bytes, std::fs::metadata(&out).unwrap().len());
        assert!(written.bytes > 0);
        assert!(!part_path(&out).exists());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&out).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{mode:o}");
        }

        let restored = Db::open(&format!("sqlite:{}", out.display()), dir.path(), 1)
            .await
            .unwrap();
        let rows: Vec<(String,)> = sqlx::query_as("SELECT name FROM backup_probe ORDER BY name")
            .fetch_all(restored.pool())
            .await
            .unwrap();
        let names: Vec<_> = rows.into_iter().map(|(n,)| n).collect();
        assert_eq!(names, ["a", "b", "c"]);

        // An existing file is left as it is.
        let before = std::fs::read(&out).unwrap();
        let err = sqlite_backup(&db, &out).await.unwrap_err().to_string();
        assert!(err.contains("exists"), "{err}");
        assert_eq!(std::fs::read(&out).unwrap(), before);

        // A leftover .part is named, not overwritten.
        let other = dir.path().join("other.db");
        std::fs::write(part_path(&other), b"half").unwrap();
        let err = sqlite_backup(&db, &other).await.unwrap_err().to_string();
        assert!(err.contains("other.db.part"), "{err}");
        assert!(!other.exists());
    }

    #[test]
    fn postgres_is_pointed_at_pg_dump_without_its_password() {
        let url = "postgres://fleet:s3cret@db.example:5432/fleet?sslmode=require";
        assert!(is_postgres(url) && is_postgres("postgresql://x/y"));
        assert!(!is_postgres("") && !is_postgres("sqlite:/x/fleet.db"));
        let advice = pg_dump_advice(url, Path::new("/backups/fleet.dump"));
        assert!(
            advice.contains(
                "pg_dump --format=custom --file=/backups/fleet.dump 'postgres://fleet@db.example:5432/fleet?sslmode=require'"
            ),
            "{advice}"
        );
        assert!(!advice.contains("s3cret"), "{advice}");
        assert!(advice.contains("pg_restore"), "{advice}");
        assert_eq!(
            without_password("postgres://db.example/fleet"),
            "postgres://db.example/fleet"
        );
    }
}
