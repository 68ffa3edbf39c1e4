//! The schema's migrations, compiled into the server from `migrations/<backend>/`.
//!
//! sqlx's `migrate!` macro would embed the same files, but it pulls in sqlx's macro
//! crates, which compile sqlx's drivers a second time for the build machine: a tenth of
//! a cold build. These are read the way sqlx reads a directory of them (a file
//! `<version>_<description>.sql`), so a database migrated by either has the same
//! versions and checksums. A test holds this list to the directories.

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;

use sqlx::error::BoxDynError;
use sqlx::migrate::{Migration, MigrationSource, MigrationType};

/// Adding a migration: its file in both directories, and its name here.
macro_rules! migrations {
    ($($file:literal),+ $(,)?) => {
        /// The SQLite backend's migrations.
        pub(crate) const SQLITE: Embedded = Embedded {
            files: &[$(($file, include_str!(concat!("../migrations/sqlite/", $file, ".sql")))),+],
        };
        /// The PostgreSQL backend's migrations.
        pub(crate) const POSTGRES: Embedded = Embedded {
            files: &[$(($file, include_str!(concat!("../migrations/postgres/", $file, ".sql")))),+],
        };
    };
}

migrations!(
    "0001_fleet",
    "0002_rollouts",
    "0003_credentials",
    "0004_config",
    "0005_health",
    "0006_opamp",
    "0007_one_rollout_family",
    "0008_operators",
    "0009_leaving",
    "0010_releases",
    "0011_labels",
    "0012_page_sessions",
    "0013_deployments",
    "0014_governance",
    "0015_approvals",
    "0016_commands",
    "0017_fleet_policy",
    "0018_telemetry",
    "0019_release_msi",
);

/// One backend's migrations, as a source for sqlx's `Migrator`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Embedded {
    files: &'static [(&'static str, &'static str)],
}

impl Embedded {
    fn migrations(self) -> Result<Vec<Migration>, BoxDynError> {
        self.files
            .iter()
            .map(|&(file, sql)| migration(file, sql))
            .collect()
    }
}

type Resolved = Pin<Box<dyn Future<Output = Result<Vec<Migration>, BoxDynError>> + Send>>;

impl MigrationSource<'static> for Embedded {
    fn resolve(self) -> Resolved {
        Box::pin(std::future::ready(self.migrations()))
    }
}

/// As sqlx reads `<version>_<description>.sql`: the description with spaces for
/// underscores, and a script starting `-- no-transaction` run outside one.
fn migration(file: &str, sql: &'static str) -> Result<Migration, BoxDynError> {
    let (version, description) = file
        .split_once('_')
        .ok_or_else(|| format!("migration {file:?} is not named <version>_<description>"))?;
    let version: i64 = version
        .parse()
        .map_err(|e| format!("migration {file:?}: its version is not a number: {e}"))?;
    Ok(Migration::new(
        version,
        Cow::Owned(description.replace('_', " ")),
        MigrationType::Simple,
        Cow::Borrowed(sql),
        sql.starts_with("-- no-transaction"),
    ))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    /// What sqlx itself reads from the directory is what the server runs: the same
    /// versions in order, descriptions, checksums (which a migrated database keeps and
    /// checks) and transaction choice. A file added to a directory but not to the list
    /// fails here.
    #[tokio::test]
    async fn each_backend_runs_what_sqlx_reads_from_its_directory() {
        for (embedded, dir) in [(SQLITE, "sqlite"), (POSTGRES, "postgres")] {
            let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("migrations")
                .join(dir);
            let read = path.resolve().await.expect("sqlx reads the directory");
            let embedded = embedded.migrations().expect("embedded");
            let key = |m: &Migration| {
                (
                    m.version,
                    m.description.to_string(),
                    m.checksum.to_vec(),
                    m.no_tx,
                    m.migration_type,
                )
            };
            assert_eq!(
                embedded.iter().map(key).collect::<Vec<_>>(),
                read.iter().map(key).collect::<Vec<_>>(),
                "{dir}"
            );
            assert_eq!(embedded.len(), 19, "{dir}");
        }
    }

    #[test]
    fn a_misnamed_file_is_an_error_not_a_panic() {
        assert!(migration("fleet", "").is_err());
        assert!(migration("one_fleet", "").is_err());
    }
}
