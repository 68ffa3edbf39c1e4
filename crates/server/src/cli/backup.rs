//! `update-server backup --out FILE`: a copy of the fleet database, read beside a
//! running server (no admin API).

/// `update-server backup --out FILE`: a consistent copy of the SQLite fleet database,
/// taken beside a running server (see `agent_fleet::backup`); returns what to print.
/// PostgreSQL is refused with the `pg_dump` command line to use.
pub async fn backup(config: &crate::Config, out: &std::path::Path) -> anyhow::Result<String> {
    let url = config.database.url.trim();
    if agent_fleet::backup::is_postgres(url) {
        anyhow::bail!("{}", agent_fleet::backup::pg_dump_advice(url, out));
    }
    // Opening a missing database would make an empty one and back that up.
    let file = match url.strip_prefix("sqlite:") {
        None if url.is_empty() => Some(config.server.home.join("fleet.db")),
        Some(rest) if !rest.starts_with(":memory:") => {
            let path = rest.trim_start_matches("//");
            Some(std::path::PathBuf::from(
                path.split('?').next().unwrap_or(path),
            ))
        }
        _ => None,
    };
    if let Some(file) = &file
        && !file.is_file()
    {
        anyhow::bail!(
            "no fleet database at {}: check server.home and database.url (--config FILE)",
            file.display()
        );
    }
    let db = agent_fleet::db::Db::open(url, &config.server.home, 1).await?;
    let written = agent_fleet::backup::sqlite_backup(&db, out).await?;
    db.pool().close().await;
    Ok(format!(
        "wrote a backup of the fleet database ({} bytes) to {}; to restore it: stop the server, copy it over {}, remove fleet.db-wal and fleet.db-shm beside it, start the server",
        written.bytes,
        written.path.display(),
        file.map_or_else(|| "the database file".into(), |f| f.display().to_string())
    ))
}
