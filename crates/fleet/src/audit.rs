//! The audit log: every change to the fleet, by a person or by a server, appended to the
//! fleet database and never rewritten.
//!
//! An entry says when, who (a token's name, [`crate::operators::BOOTSTRAP`], or
//! `server:<name>` for a server's own decisions such as a rollout halting on failures),
//! from which address, what, whether it was done or refused, and its details (a
//! configuration set's hash and file names, a halt's reason, a limit's old and new
//! value). Nothing secret goes in: callers pass names, never tokens.

use serde::Serialize;
use sqlx::Row;

use crate::db::{Db, now_ms};
use crate::error::FleetError;

/// Entries per page at most.
pub const MAX_PAGE: i64 = 500;

/// Whether the change was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Done,
    /// Refused: the token's role may not, or there was no valid token.
    Refused,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Done => "done",
            Outcome::Refused => "refused",
        }
    }
}

/// One change, as an edge describes it.
#[derive(Debug, Clone)]
pub struct Change<'a> {
    pub who: &'a str,
    /// The client's address; empty for a server's own decisions.
    pub address: &'a str,
    /// What, as a short verb phrase (`rollout.halt`, `config.push`, `token.revoke`).
    pub action: &'a str,
    pub outcome: Outcome,
    pub details: serde_json::Value,
}

/// One stored entry.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Entry {
    pub id: i64,
    /// Unix milliseconds.
    pub at: i64,
    pub who: String,
    pub address: String,
    pub action: String,
    pub outcome: String,
    pub details: serde_json::Value,
}

/// Which entries to list, newest first.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub who: Option<String>,
    /// Entries whose action starts with this (`rollout` finds every rollout action).
    pub action: Option<String>,
    /// 1-based.
    pub page: i64,
    pub per_page: i64,
}

/// Appends `change` on `conn`: inside the transaction of the change it records, when
/// the fleet model makes it (a rollout halting itself), so neither lands without the
/// other.
pub async fn record_in(
    conn: &mut sqlx::AnyConnection,
    change: &Change<'_>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO audit_log (at, who, address, action, outcome, details) VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(now_ms())
    .bind(change.who)
    .bind(change.address)
    .bind(change.action)
    .bind(change.outcome.as_str())
    .bind(change.details.to_string())
    .execute(conn)
    .await?;
    Ok(())
}

/// The audit log of a fleet database.
#[derive(Clone)]
pub struct Audit {
    db: Db,
}

impl Audit {
    pub fn new(db: Db) -> Self {
        Self { db }
    }

    /// Appends `change`.
    pub async fn record(&self, change: &Change<'_>) -> Result<(), FleetError> {
        let mut conn = self.db.pool().acquire().await?;
        record_in(&mut conn, change).await?;
        Ok(())
    }

    /// A page of entries, newest first, and how many match in all.
    pub async fn list(&self, filter: &Filter) -> Result<(Vec<Entry>, i64), FleetError> {
        let per_page = filter.per_page.clamp(1, MAX_PAGE);
        let offset = (filter.page.max(1) - 1) * per_page;
        // Empty strings match everything: one statement for every filter.
        let who = filter.who.clone().unwrap_or_default();
        let action = filter.action.clone().unwrap_or_default();
        let clause = "($1 = '' OR who = $1) AND ($2 = '' OR action = $2 OR action LIKE $3)";
        let prefix = format!("{}.%", action.replace(['%', '_'], ""));
        let total: i64 = sqlx::query(&format!(
            "SELECT COUNT(*) AS n FROM audit_log WHERE {clause}"
        ))
        .bind(&who)
        .bind(&action)
        .bind(&prefix)
        .fetch_one(self.db.pool())
        .await?
        .try_get("n")?;
        let rows = sqlx::query(&format!(
            "SELECT id, at, who, address, action, outcome, details FROM audit_log WHERE {clause} ORDER BY id DESC LIMIT $4 OFFSET $5"
        ))
        .bind(&who)
        .bind(&action)
        .bind(&prefix)
        .bind(per_page)
        .bind(offset)
        .fetch_all(self.db.pool())
        .await?;
        let entries = rows
            .iter()
            .map(|r| {
                let details: String = r.try_get("details")?;
                Ok(Entry {
                    id: r.try_get("id")?,
                    at: r.try_get("at")?,
                    who: r.try_get("who")?,
                    address: r.try_get("address")?,
                    action: r.try_get("action")?,
                    outcome: r.try_get("outcome")?,
                    details: serde_json::from_str(&details).unwrap_or(serde_json::Value::Null),
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        Ok((entries, total))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn entries_are_appended_and_listed_newest_first_by_who_and_what() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open("", dir.path(), 2).await.unwrap();
        let audit = Audit::new(db);
        for (who, action) in [
            ("alice", "rollout.halt"),
            ("server:a", "rollout.halt"),
            ("bob", "config.push"),
            ("alice", "token.revoke"),
        ] {
            audit
                .record(&Change {
                    who,
                    address: "127.0.0.1",
                    action,
                    outcome: Outcome::Done,
                    details: serde_json::json!({ "reason": "<script>" }),
                })
                .await
                .unwrap();
        }
        let all = Filter {
            page: 1,
            per_page: 10,
            ..Filter::default()
        };
        let (entries, total) = audit.list(&all).await.unwrap();
        assert_eq!(total, 4);
        assert_eq!(entries[0].action, "token.revoke");
        assert_eq!(entries[3].who, "alice");
        assert_eq!(entries[3].details["reason"], "<script>");
        let alice = Filter {
            who: Some("alice".into()),
            ..all.clone()
        };
        assert_eq!(audit.list(&alice).await.unwrap().1, 2);
        let rollouts = Filter {
            action: Some("rollout".into()),
            ..all.clone()
        };
        assert_eq!(audit.list(&rollouts).await.unwrap().1, 2);
        let paged = Filter {
            page: 2,
            per_page: 3,
            ..all
        };
        let (page2, total) = audit.list(&paged).await.unwrap();
        assert_eq!((page2.len(), total), (1, 4));
    }
}
