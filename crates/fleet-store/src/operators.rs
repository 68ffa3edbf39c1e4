//! Operators: named tokens with a role each, kept as hashes in the fleet database.
//!
//! A person gets a token of their own (`viewer`, `operator` or `admin`); a person who
//! leaves is revoked without anyone else changing theirs. Only the sha256 of a token is
//! stored, so a copy of the database opens nothing; every request looks its token up
//! in the database (a revocation on one server of a fleet holds on all of them at once),
//! and `last_used_at` is written at most once a minute per token, so reading the API is
//! not a write per request. `admin.token` from the configuration stays as the bootstrap
//! admin, named [`BOOTSTRAP`].
//!
//! What a role may do is [`Role::may`], a pure function: the edges ask it for each
//! [`Action`] and answer `403` when it says no.

use std::fmt;
use std::str::FromStr;

use sqlx::Row;

use crate::credentials::{hash_token, new_token};
use crate::db::{Db, now_ms};
use crate::error::FleetError;

/// The name `admin.token` acts under in the audit log.
pub const BOOTSTRAP: &str = "admin.token";
/// Token names: short, printable, no spaces (they appear in logs and on the page).
const MAX_NAME: usize = 64;
/// `last_used_at` is written again only after this long.
const LAST_USED_EVERY_MS: i64 = 60_000;

/// What a token may do, each role including the one before.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Reads the API and the page.
    Viewer,
    /// Also halts, resumes and advances rollouts, pushes configuration, changes
    /// auto-update and the download limit.
    Operator,
    /// Also manages tokens.
    Admin,
}

/// Something a request does, as far as roles are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Read,
    /// Halt, resume, advance; push or delete configuration; auto-update, download
    /// limit; forget an agent's credentials.
    Change,
    ManageTokens,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Viewer, Role::Operator, Role::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }

    /// Whether this role may do `action`.
    pub fn may(self, action: Action) -> bool {
        let needs = match action {
            Action::Read => Role::Viewer,
            Action::Change => Role::Operator,
            Action::ManageTokens => Role::Admin,
        };
        self >= needs
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = FleetError;

    fn from_str(s: &str) -> Result<Self, FleetError> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| {
                FleetError::Invalid(format!("role {s:?} is not one of viewer, operator, admin"))
            })
    }
}

/// Who a request is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator {
    pub name: String,
    pub role: Role,
}

/// A token as `token list` shows it: never the token.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TokenInfo {
    pub name: String,
    pub role: String,
    /// Unix milliseconds.
    pub created_at: i64,
    pub last_used_at: Option<i64>,
    /// When it stops opening anything (unix milliseconds); `None`: never.
    pub expires_at: Option<i64>,
}

/// Whether a token that lapses at `expires_at` is refused at `now_ms` (pure).
pub fn expired(expires_at: Option<i64>, now_ms: i64) -> bool {
    expires_at.is_some_and(|at| now_ms >= at)
}

/// Checks a new token's name: what to do when it cannot be one.
pub fn check_name(name: &str) -> Result<(), FleetError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'@'))
        && name != BOOTSTRAP
        && !name.starts_with("server:");
    if ok {
        Ok(())
    } else {
        Err(FleetError::Invalid(format!(
            "token name {name:?} is not allowed: use 1 to {MAX_NAME} letters, digits and - _ . @ (not {BOOTSTRAP:?} nor server:…)"
        )))
    }
}

/// Whether `last_used_at` is worth writing again.
pub fn touch_due(last_used_at: Option<i64>, now_ms: i64) -> bool {
    last_used_at.is_none_or(|t| now_ms - t >= LAST_USED_EVERY_MS)
}

/// The operators' tokens in the fleet database.
#[derive(Clone)]
pub struct Operators {
    db: Db,
}

impl Operators {
    pub fn new(db: Db) -> Self {
        Self { db }
    }

    /// Creates the token `name` with `role`, refused from `expires_at` (unix ms) on when
    /// one is given; returns the token, which is not kept.
    pub async fn create(
        &self,
        name: &str,
        role: Role,
        expires_at: Option<i64>,
    ) -> Result<String, FleetError> {
        check_name(name)?;
        let token = new_token()
            .map_err(|e| FleetError::Invalid(format!("no randomness for a token: {e}")))?;
        let hash = hash_token(&token);
        let inserted = sqlx::query(
            "INSERT INTO operator_tokens (name, role, token_hash, created_at, expires_at) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (name) DO NOTHING",
        )
        .bind(name)
        .bind(role.as_str())
        .bind(&hash)
        .bind(now_ms())
        .bind(expires_at)
        .execute(self.db.pool())
        .await?
        .rows_affected();
        if inserted == 0 {
            return Err(FleetError::Conflict(format!(
                "a token named {name:?} exists; revoke it first or choose another name"
            )));
        }
        Ok(token)
    }

    /// Every token, oldest first.
    pub async fn list(&self) -> Result<Vec<TokenInfo>, FleetError> {
        let rows = sqlx::query(
            "SELECT name, role, created_at, last_used_at, expires_at FROM operator_tokens ORDER BY created_at, name",
        )
        .fetch_all(self.db.pool())
        .await?;
        rows.iter()
            .map(|r| {
                Ok(TokenInfo {
                    name: r.try_get("name")?,
                    role: r.try_get("role")?,
                    created_at: r.try_get("created_at")?,
                    last_used_at: r.try_get("last_used_at")?,
                    expires_at: r.try_get("expires_at")?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(FleetError::from)
    }

    /// Revokes `name`; false when there is no such token.
    pub async fn revoke(&self, name: &str) -> Result<bool, FleetError> {
        let gone = sqlx::query("DELETE FROM operator_tokens WHERE name = $1")
            .bind(name)
            .execute(self.db.pool())
            .await?
            .rows_affected();
        Ok(gone > 0)
    }

    /// The operator `token` belongs to, if any; notes its use.
    pub async fn authenticate(&self, token: &str) -> Result<Option<Operator>, FleetError> {
        self.by_hash(&hash_token(token)).await
    }

    /// The operator whose token hashes to `hash`, if it is neither revoked nor expired;
    /// notes its use.
    pub async fn by_hash(&self, hash: &str) -> Result<Option<Operator>, FleetError> {
        let row = sqlx::query(
            "SELECT name, role, last_used_at, expires_at FROM operator_tokens WHERE token_hash = $1",
        )
        .bind(hash)
        .fetch_optional(self.db.pool())
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let name: String = row.try_get("name")?;
        let role: String = row.try_get("role")?;
        let last_used: Option<i64> = row.try_get("last_used_at")?;
        let now = now_ms();
        if expired(row.try_get("expires_at")?, now) {
            return Ok(None);
        }
        if touch_due(last_used, now) {
            sqlx::query("UPDATE operator_tokens SET last_used_at = $1 WHERE name = $2")
                .bind(now)
                .bind(&name)
                .execute(self.db.pool())
                .await?;
        }
        Ok(Some(Operator {
            name,
            role: role.parse()?,
        }))
    }

    /// Whether any named token exists (the admin API is on without `admin.token`).
    pub async fn any(&self) -> Result<bool, FleetError> {
        let n: i64 = sqlx::query("SELECT COUNT(*) AS n FROM operator_tokens")
            .fetch_one(self.db.pool())
            .await?
            .try_get("n")?;
        Ok(n > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_role_may_what_the_one_below_may_and_more() {
        assert!(Role::Viewer.may(Action::Read));
        assert!(!Role::Viewer.may(Action::Change));
        assert!(!Role::Viewer.may(Action::ManageTokens));
        assert!(Role::Operator.may(Action::Change));
        assert!(!Role::Operator.may(Action::ManageTokens));
        assert!(Role::Admin.may(Action::ManageTokens));
        for role in Role::ALL {
            assert_eq!(role.as_str().parse::<Role>().ok(), Some(role));
        }
        assert!("root".parse::<Role>().is_err());
    }

    #[test]
    fn names_are_plain_and_never_the_bootstrap_or_a_server() {
        assert!(check_name("alice").is_ok());
        assert!(check_name("ci-bot_2@ops.example").is_ok());
        for bad in [
            "",
            "a b",
            "<script>",
            BOOTSTRAP,
            "server:x",
            &"x".repeat(65),
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn last_use_is_written_once_a_minute() {
        assert!(touch_due(None, 0));
        assert!(!touch_due(Some(1_000), 30_000));
        assert!(touch_due(Some(1_000), 61_000));
    }

    async fn db() -> (tempfile::TempDir, Db) {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open("", dir.path(), 2).await.unwrap();
        (dir, db)
    }

    #[tokio::test]
    async fn a_token_is_shown_once_stored_hashed_and_revoked_at_once() {
        let (_dir, db) = db().await;
        let ops = Operators::new(db.clone());
        assert!(!ops.any().await.unwrap());
        let token = ops.create("alice", Role::Operator, None).await.unwrap();
        assert!(ops.any().await.unwrap());
        let stored: Vec<String> = sqlx::query("SELECT token_hash FROM operator_tokens")
            .fetch_all(db.pool())
            .await
            .unwrap()
            .iter()
            .map(|r| r.get("token_hash"))
            .collect();
        assert_eq!(stored, vec![hash_token(&token)]);
        assert!(!stored[0].contains(&token));
        assert!(matches!(
            ops.create("alice", Role::Admin, None).await,
            Err(FleetError::Conflict(_))
        ));
        let who = ops.authenticate(&token).await.unwrap().unwrap();
        assert_eq!(who.name, "alice");
        assert_eq!(who.role, Role::Operator);
        assert_eq!(ops.authenticate("not-a-token").await.unwrap(), None);
        let listed = ops.list().await.unwrap();
        assert_eq!(listed.len(), 1);
        assert!(listed[0].last_used_at.is_some());
        assert!(ops.revoke("alice").await.unwrap());
        assert!(!ops.revoke("alice").await.unwrap());
        assert_eq!(ops.authenticate(&token).await.unwrap(), None);
    }

    #[test]
    fn a_token_lapses_at_its_expiry_and_one_without_never() {
        assert!(!expired(None, i64::MAX));
        assert!(!expired(Some(1_000), 999));
        assert!(expired(Some(1_000), 1_000));
    }

    #[tokio::test]
    async fn an_expired_token_opens_nothing() {
        let (_dir, db) = db().await;
        let ops = Operators::new(db);
        let lapsed = ops
            .create("old", Role::Admin, Some(now_ms() - 1))
            .await
            .unwrap();
        let fresh = ops
            .create("new", Role::Viewer, Some(now_ms() + 3_600_000))
            .await
            .unwrap();
        assert_eq!(ops.authenticate(&lapsed).await.unwrap(), None);
        assert_eq!(ops.authenticate(&fresh).await.unwrap().unwrap().name, "new");
        let listed = ops.list().await.unwrap();
        assert!(listed.iter().all(|t| t.expires_at.is_some()), "{listed:?}");
    }
}
