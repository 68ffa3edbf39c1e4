//! Signed-in people of the fleet page: their sessions, kept in the fleet database.
//!
//! A session lived in one server's memory before: a restart (to change a maintenance
//! window, say) signed every operator out, and on a fleet of several servers a person
//! was known only to the server they signed in to. Kept here, a session outlives its
//! server's process and is the same on every server of a PostgreSQL fleet.
//!
//! Only the sha256 of a session id (the cookie's value) is stored, so a copy of the
//! database opens no session. The CSRF token is stored as it is: every page sends it in
//! its forms, and without the cookie it opens nothing. A session ends after
//! [`IDLE_MS`] unused or [`MAX_AGE_MS`] after sign-in, whichever comes first, at sign-out,
//! and when the sessions outnumber [`MAX_SESSIONS`] (the least recently used first).
//! Whether one is live is [`live`], a pure function; times are passed in.

use sqlx::Row;

use crate::credentials::{hash_token, new_token};
use crate::db::Db;
use crate::error::FleetError;
use crate::operators::Role;

/// A session unused this long ends (8 hours).
pub const IDLE_MS: i64 = 8 * 3600 * 1000;
/// A session ends this long after sign-in, used or not (24 hours).
pub const MAX_AGE_MS: i64 = 24 * 3600 * 1000;
/// Sessions kept at most; the least recently used goes first.
pub const MAX_SESSIONS: usize = 1024;
/// A session's last use is written again only after this long: reading the page is not
/// a write per request. Idle expiry is eight hours, so a minute late is no matter.
const SEEN_EVERY_MS: i64 = 60_000;

/// Who a session is: the operator's name and role, and for a named token its hash, so
/// every request can ask whether it was revoked meanwhile (the token itself is never
/// kept).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedIn {
    pub name: String,
    pub role: Role,
    pub token_hash: Option<String>,
}

/// A live session as a request finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// The token every form of this session must carry.
    pub csrf: String,
    pub who: SignedIn,
}

/// Whether a session begun at `started` and last used at `seen` is live at `now` (unix
/// milliseconds each).
pub fn live(started: i64, seen: i64, now: i64) -> bool {
    now.saturating_sub(seen) < IDLE_MS && now.saturating_sub(started) < MAX_AGE_MS
}

/// Whether a use at `now` is worth writing over the recorded `seen`.
fn seen_due(seen: i64, now: i64) -> bool {
    now.saturating_sub(seen) >= SEEN_EVERY_MS
}

/// The page's sessions in the fleet database.
#[derive(Clone)]
pub struct Sessions {
    db: Db,
}

impl Sessions {
    pub fn new(db: Db) -> Self {
        Self { db }
    }

    /// A new session for `who` at `now`: its id (the cookie's value, not kept) and its
    /// CSRF token. Ended sessions are deleted first, and the least recently used ones
    /// while [`MAX_SESSIONS`] are kept.
    pub async fn start(&self, who: &SignedIn, now: i64) -> Result<(String, String), FleetError> {
        let fresh = || {
            new_token().map_err(|e| {
                FleetError::Invalid(format!(
                    "no randomness for a session: {e}; the operating system's random source failed, try again"
                ))
            })
        };
        let (id, csrf) = (fresh()?, fresh()?);
        self.delete_ended(now).await?;
        let kept: i64 = sqlx::query("SELECT COUNT(*) AS n FROM page_sessions")
            .fetch_one(self.db.pool())
            .await?
            .try_get("n")?;
        let over = usize::try_from(kept)
            .unwrap_or(0)
            .saturating_add(1)
            .saturating_sub(MAX_SESSIONS);
        if over > 0 {
            sqlx::query(
                "DELETE FROM page_sessions WHERE id_hash IN
                 (SELECT id_hash FROM page_sessions ORDER BY seen_at, started_at LIMIT $1)",
            )
            .bind(i64::try_from(over).unwrap_or(i64::MAX))
            .execute(self.db.pool())
            .await?;
        }
        sqlx::query(
            "INSERT INTO page_sessions (id_hash, csrf, name, role, token_hash, started_at, seen_at)
             VALUES ($1, $2, $3, $4, $5, $6, $6)",
        )
        .bind(hash_token(&id))
        .bind(&csrf)
        .bind(&who.name)
        .bind(who.role.as_str())
        .bind(who.token_hash.as_deref())
        .bind(now)
        .execute(self.db.pool())
        .await?;
        Ok((id, csrf))
    }

    /// The live session whose id is `id`, noting its use; `None` for an unknown, ended
    /// or expired one (an expired one is deleted).
    pub async fn check(&self, id: &str, now: i64) -> Result<Option<Session>, FleetError> {
        let hash = hash_token(id);
        let row = sqlx::query(
            "SELECT csrf, name, role, token_hash, started_at, seen_at FROM page_sessions WHERE id_hash = $1",
        )
        .bind(&hash)
        .fetch_optional(self.db.pool())
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let started: i64 = row.try_get("started_at")?;
        let seen: i64 = row.try_get("seen_at")?;
        if !live(started, seen, now) {
            self.end_hashed(&hash).await?;
            return Ok(None);
        }
        if seen_due(seen, now) {
            sqlx::query("UPDATE page_sessions SET seen_at = $2 WHERE id_hash = $1")
                .bind(&hash)
                .bind(now)
                .execute(self.db.pool())
                .await?;
        }
        let role: String = row.try_get("role")?;
        Ok(Some(Session {
            csrf: row.try_get("csrf")?,
            who: SignedIn {
                name: row.try_get("name")?,
                role: role.parse()?,
                token_hash: row.try_get("token_hash")?,
            },
        }))
    }

    /// Signs out: the cookie is worth nothing from now on, on every server, even
    /// replayed.
    pub async fn end(&self, id: &str) -> Result<(), FleetError> {
        self.end_hashed(&hash_token(id)).await
    }

    async fn end_hashed(&self, hash: &str) -> Result<(), FleetError> {
        sqlx::query("DELETE FROM page_sessions WHERE id_hash = $1")
            .bind(hash)
            .execute(self.db.pool())
            .await?;
        Ok(())
    }

    /// Deletes every session that ended by `now`.
    pub async fn delete_ended(&self, now: i64) -> Result<u64, FleetError> {
        Ok(
            sqlx::query("DELETE FROM page_sessions WHERE seen_at <= $1 OR started_at <= $2")
                .bind(now.saturating_sub(IDLE_MS))
                .bind(now.saturating_sub(MAX_AGE_MS))
                .execute(self.db.pool())
                .await?
                .rows_affected(),
        )
    }

    /// Sessions kept now (live or not yet deleted).
    pub async fn count(&self) -> Result<usize, FleetError> {
        let n: i64 = sqlx::query("SELECT COUNT(*) AS n FROM page_sessions")
            .fetch_one(self.db.pool())
            .await?
            .try_get("n")?;
        Ok(usize::try_from(n).unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admin() -> SignedIn {
        SignedIn {
            name: "admin.token".into(),
            role: Role::Admin,
            token_hash: None,
        }
    }

    async fn sessions() -> (tempfile::TempDir, Db, Sessions) {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open("", dir.path(), 2).await.unwrap();
        let sessions = Sessions::new(db.clone());
        (dir, db, sessions)
    }

    #[test]
    fn a_session_lives_until_idle_or_old() {
        assert!(live(0, 0, IDLE_MS - 1));
        assert!(!live(0, 0, IDLE_MS));
        assert!(live(0, MAX_AGE_MS - 10, MAX_AGE_MS - 1));
        assert!(!live(0, MAX_AGE_MS - 10, MAX_AGE_MS));
        assert!(!seen_due(1_000, 30_000));
        assert!(seen_due(1_000, 61_000));
    }

    #[tokio::test]
    async fn a_session_is_stored_hashed_known_until_it_ends_and_survives_a_reopen() {
        let (dir, db, sessions) = sessions().await;
        let who = SignedIn {
            name: "alice".into(),
            role: Role::Operator,
            token_hash: Some("ab".repeat(32)),
        };
        let (id, csrf) = sessions.start(&who, 1_000).await.unwrap();
        assert_ne!(id, csrf);
        let stored: Vec<String> = sqlx::query("SELECT id_hash FROM page_sessions")
            .fetch_all(db.pool())
            .await
            .unwrap()
            .iter()
            .map(|r| r.get("id_hash"))
            .collect();
        assert_eq!(stored, vec![hash_token(&id)], "never the cookie itself");
        assert_eq!(
            sessions.check(&id, 2_000).await.unwrap(),
            Some(Session {
                csrf: csrf.clone(),
                who: who.clone()
            })
        );
        assert_eq!(sessions.check("forged", 2_000).await.unwrap(), None);
        assert_eq!(sessions.check(&hash_token(&id), 2_000).await.unwrap(), None);

        // Another process on the same database (a restart, or a second server).
        drop(sessions);
        db.pool().close().await;
        let reopened = Sessions::new(Db::open("", dir.path(), 2).await.unwrap());
        assert_eq!(
            reopened.check(&id, 3_000).await.unwrap().map(|s| s.csrf),
            Some(csrf)
        );
        reopened.end(&id).await.unwrap();
        assert_eq!(
            reopened.check(&id, 3_000).await.unwrap(),
            None,
            "a replayed cookie after sign-out"
        );
        assert_eq!(reopened.count().await.unwrap(), 0);
    }

    #[tokio::test]
    async fn an_idle_session_expires_and_use_keeps_it_alive_to_its_maximum_age() {
        let (_dir, _db, sessions) = sessions().await;
        let (used, _) = sessions.start(&admin(), 0).await.unwrap();
        let (idle, _) = sessions.start(&admin(), 0).await.unwrap();
        let step = IDLE_MS - 60_000;
        assert!(sessions.check(&used, step).await.unwrap().is_some());
        assert!(sessions.check(&used, step * 2).await.unwrap().is_some());
        assert!(sessions.check(&idle, step * 2).await.unwrap().is_none());
        assert_eq!(
            sessions.count().await.unwrap(),
            1,
            "the expired one is gone"
        );
        let mut t = step * 2;
        while t + step < MAX_AGE_MS {
            t += step;
            assert!(sessions.check(&used, t).await.unwrap().is_some());
        }
        assert!(sessions.check(&used, MAX_AGE_MS).await.unwrap().is_none());
        assert_eq!(sessions.count().await.unwrap(), 0);
    }

    #[tokio::test]
    async fn sessions_are_capped_the_least_recently_used_goes() {
        let (_dir, db, sessions) = sessions().await;
        let (first, _) = sessions.start(&admin(), 0).await.unwrap();
        // The rest at once, as rows: a thousand sign-ins one by one would only be slower.
        for i in 1..MAX_SESSIONS as i64 {
            sqlx::query(
                "INSERT INTO page_sessions (id_hash, csrf, name, role, token_hash, started_at, seen_at)
                 VALUES ($1, 'c', 'admin.token', 'admin', NULL, $2, $2)",
            )
            .bind(format!("h{i}"))
            .bind(i)
            .execute(db.pool())
            .await
            .unwrap();
        }
        assert_eq!(sessions.count().await.unwrap(), MAX_SESSIONS);
        let (newest, _) = sessions.start(&admin(), 5_000).await.unwrap();
        assert_eq!(sessions.count().await.unwrap(), MAX_SESSIONS);
        assert!(sessions.check(&first, 5_000).await.unwrap().is_none());
        assert!(sessions.check(&newest, 5_000).await.unwrap().is_some());
    }
}
