//! Chores one server does for the whole fleet (the audit log's retention): each has a
//! row in `fleet_chores` saying when it is next due; a server claims it with one UPDATE
//! that only one statement can win, so a PostgreSQL fleet of several servers does each
//! chore once per period, not once per server.

use std::time::Duration;

use crate::db::Db;
use crate::error::FleetError;

/// Claims chore `name` for `server` if it is due at `now` (unix milliseconds), and makes
/// it due again `every` later. True: this server does it now.
pub async fn claim(
    db: &Db,
    name: &str,
    server: &str,
    every: Duration,
    now: i64,
) -> Result<bool, FleetError> {
    sqlx::query(
        "INSERT INTO fleet_chores (name, due_at, held_by) VALUES ($1, 0, '') ON CONFLICT (name) DO NOTHING",
    )
    .bind(name)
    .execute(db.pool())
    .await?;
    let every = i64::try_from(every.as_millis()).unwrap_or(i64::MAX);
    let won = sqlx::query(
        "UPDATE fleet_chores SET due_at = $2, held_by = $3 WHERE name = $1 AND due_at <= $4",
    )
    .bind(name)
    .bind(now.saturating_add(every))
    .bind(server)
    .bind(now)
    .execute(db.pool())
    .await?
    .rows_affected();
    Ok(won == 1)
}

/// How often the audit log's retention runs for `keep`: a tenth of it, at least every
/// second and at most every hour (an entry outlives `keep` by at most that).
pub fn retention_every(keep: Duration) -> Duration {
    (keep / 10).clamp(Duration::from_secs(1), Duration::from_secs(3600))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_runs_hourly_for_a_long_keep_and_often_for_a_short_one() {
        assert_eq!(
            retention_every(Duration::from_secs(400 * 86_400)),
            Duration::from_secs(3600)
        );
        assert_eq!(
            retention_every(Duration::from_secs(60)),
            Duration::from_secs(6)
        );
        assert_eq!(
            retention_every(Duration::from_secs(2)),
            Duration::from_secs(1)
        );
    }

    #[tokio::test]
    async fn a_chore_is_claimed_by_one_server_per_period() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open("", dir.path(), 2).await.unwrap();
        let hour = Duration::from_secs(3600);
        assert!(claim(&db, "c", "a", hour, 1_000).await.unwrap());
        assert!(!claim(&db, "c", "b", hour, 1_001).await.unwrap());
        assert!(!claim(&db, "c", "a", hour, 2_000).await.unwrap());
        // Another chore is its own.
        assert!(claim(&db, "d", "b", hour, 2_000).await.unwrap());
        assert!(claim(&db, "c", "b", hour, 1_000 + 3_600_000).await.unwrap());
    }
}
