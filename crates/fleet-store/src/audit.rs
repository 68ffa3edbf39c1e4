//! The audit log: every change to the fleet, by a person or by a server, appended to the
//! fleet database and never rewritten.
//!
//! An entry says when, who (a token's name, [`crate::operators::BOOTSTRAP`], or
//! `server:<name>` for a server's own decisions such as a rollout halting on failures),
//! from which address, what, whether it was done or refused, and its details (a
//! configuration set's hash and file names, a halt's reason, a limit's old and new
//! value). Nothing secret goes in: callers pass names, never tokens.
//!
//! It is kept for `audit.keep`: [`Audit::prune`] deletes what is older, in the same
//! transaction as the entry that says so, and one server of the fleet at a time does it
//! (see [`crate::chores`]). [`Audit::export_page`] reads a time range in pages by id, so
//! an export streams however long the log is; [`Format`] writes its lines.

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
    /// Entries done to this: an agent's id, a group, a deployment, a release, a token's
    /// name… (any text value of the details, whole: see [`target_pattern`]).
    pub target: Option<String>,
    /// 1-based.
    pub page: i64,
    pub per_page: i64,
}

/// The `LIKE` pattern (with `ESCAPE '\'`) of details that hold `target` as a whole text
/// value: the details are stored as compact JSON, so a value is its JSON string, quotes
/// included; what `LIKE` would read as a wildcard is escaped. Pure.
pub fn target_pattern(target: &str) -> String {
    let quoted = serde_json::Value::String(target.to_owned()).to_string();
    let mut pattern = String::with_capacity(quoted.len() + 8);
    pattern.push('%');
    for c in quoted.chars() {
        if matches!(c, '\\' | '%' | '_') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push('%');
    pattern
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
        let target = filter.target.clone().unwrap_or_default();
        let clause = "($1 = '' OR who = $1) AND ($2 = '' OR action = $2 OR action LIKE $3) \
             AND ($4 = '' OR details LIKE $5 ESCAPE '\\')";
        let prefix = format!("{}.%", action.replace(['%', '_'], ""));
        let pattern = target_pattern(&target);
        let total: i64 = sqlx::query(&format!(
            "SELECT COUNT(*) AS n FROM audit_log WHERE {clause}"
        ))
        .bind(&who)
        .bind(&action)
        .bind(&prefix)
        .bind(&target)
        .bind(&pattern)
        .fetch_one(self.db.pool())
        .await?
        .try_get("n")?;
        let rows = sqlx::query(&format!(
            "SELECT id, at, who, address, action, outcome, details FROM audit_log WHERE {clause} ORDER BY id DESC LIMIT $6 OFFSET $7"
        ))
        .bind(&who)
        .bind(&action)
        .bind(&prefix)
        .bind(&target)
        .bind(&pattern)
        .bind(per_page)
        .bind(offset)
        .fetch_all(self.db.pool())
        .await?;
        let entries = rows
            .iter()
            .map(entry_of)
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        Ok((entries, total))
    }
}

/// The chore of deleting entries older than `audit.keep` ([`crate::chores`]).
pub const PRUNE_CHORE: &str = "audit.prune";

/// The action an audit retention is recorded as.
pub const PRUNE_ACTION: &str = "audit.prune";

/// Entries from `since` (inclusive) to `until` (exclusive), unix milliseconds; `None`
/// leaves that end open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Range {
    pub since: Option<i64>,
    pub until: Option<i64>,
}

impl Audit {
    /// Deletes the entries older than `before` (unix milliseconds) and, when there were
    /// any, records that `who` did, with `keep` as the setting said, in one transaction.
    /// Returns how many were deleted.
    pub async fn prune(&self, before: i64, who: &str, keep: &str) -> Result<u64, FleetError> {
        let mut tx = self.db.begin_write().await?;
        let deleted = sqlx::query("DELETE FROM audit_log WHERE at < $1")
            .bind(before)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if deleted > 0 {
            let change = Change {
                who,
                address: "",
                action: PRUNE_ACTION,
                outcome: Outcome::Done,
                details: serde_json::json!({
                    "deleted": deleted,
                    "before": before,
                    "keep": keep,
                }),
            };
            record_in(&mut tx, &change).await?;
        }
        tx.commit().await?;
        Ok(deleted)
    }

    /// Up to `limit` entries of `range` whose id is above `after`, oldest first: an
    /// export's next page (pass the last id read), never the whole log at once.
    pub async fn export_page(
        &self,
        range: Range,
        after: i64,
        limit: i64,
    ) -> Result<Vec<Entry>, FleetError> {
        let rows = sqlx::query(
            "SELECT id, at, who, address, action, outcome, details FROM audit_log
             WHERE id > $1 AND at >= $2 AND at < $3 ORDER BY id LIMIT $4",
        )
        .bind(after)
        .bind(range.since.unwrap_or(i64::MIN))
        .bind(range.until.unwrap_or(i64::MAX))
        .bind(limit.clamp(1, MAX_PAGE))
        .fetch_all(self.db.pool())
        .await?;
        Ok(rows
            .iter()
            .map(entry_of)
            .collect::<Result<Vec<_>, sqlx::Error>>()?)
    }
}

fn entry_of(r: &sqlx::any::AnyRow) -> Result<Entry, sqlx::Error> {
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
}

/// A time as an export's `--since`/`--until` takes it: RFC 3339
/// (`2025-03-01T12:00:00Z`), a day (`2025-03-01`, its midnight UTC), or an age before
/// `now` (`30d`, `12h`). Unix milliseconds.
pub fn parse_time(text: &str, now: i64) -> Result<i64, FleetError> {
    let text = text.trim();
    if let Ok(t) = text.parse::<jiff::Timestamp>() {
        return Ok(t.as_millisecond());
    }
    if let Ok(day) = text.parse::<jiff::civil::Date>() {
        if let Ok(t) = day.to_zoned_datetime(jiff::tz::TimeZone::UTC) {
            return Ok(t.timestamp().as_millisecond());
        }
    }
    if let Ok(age) = agent_protocol::settings::parse_duration(text) {
        let age = i64::try_from(age.as_millis()).unwrap_or(i64::MAX);
        return Ok(now.saturating_sub(age));
    }
    Err(FleetError::Invalid(format!(
        "{:?} is not a time: write 2025-03-01T12:00:00Z, 2025-03-01 (midnight UTC) or an age such as 30d",
        agent_protocol::shown::shown(text, 40)
    )))
}

/// The formats of an export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One JSON object per line.
    Jsonl,
    /// RFC 4180, with a header line.
    Csv,
}

impl std::str::FromStr for Format {
    type Err = FleetError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "jsonl" => Ok(Format::Jsonl),
            "csv" => Ok(Format::Csv),
            other => Err(FleetError::Invalid(format!(
                "no export format is called {:?}; use jsonl or csv",
                agent_protocol::shown::shown(other, 20)
            ))),
        }
    }
}

impl Format {
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Jsonl => "application/jsonl",
            Format::Csv => "text/csv; charset=utf-8",
        }
    }

    /// What comes before the first entry.
    pub fn header(self) -> &'static str {
        match self {
            Format::Jsonl => "",
            Format::Csv => "id,at,time,who,address,action,outcome,details\r\n",
        }
    }

    /// One entry, its line ending included.
    pub fn line(self, e: &Entry) -> String {
        let time = jiff::Timestamp::from_millisecond(e.at)
            .map(|t| t.to_string())
            .unwrap_or_default();
        match self {
            Format::Jsonl => {
                let mut line = serde_json::json!({
                    "id": e.id,
                    "at": e.at,
                    "time": time,
                    "who": e.who,
                    "address": e.address,
                    "action": e.action,
                    "outcome": e.outcome,
                    "details": e.details,
                })
                .to_string();
                line.push('\n');
                line
            }
            Format::Csv => {
                let fields = [
                    e.id.to_string(),
                    e.at.to_string(),
                    time,
                    e.who.clone(),
                    e.address.clone(),
                    e.action.clone(),
                    e.outcome.clone(),
                    e.details.to_string(),
                ];
                let mut line = fields
                    .iter()
                    .map(|f| csv_field(f))
                    .collect::<Vec<_>>()
                    .join(",");
                line.push_str("\r\n");
                line
            }
        }
    }
}

/// A CSV field: quoted when it holds a comma, a quote or a line break (quotes doubled),
/// and a text a spreadsheet would run as a formula (`=`, `+`, `-`, `@` first) made text
/// with a leading `'`.
fn csv_field(text: &str) -> String {
    let text = if text.starts_with(['=', '+', '-', '@', '\t', '\r']) && text.parse::<f64>().is_err()
    {
        format!("'{text}")
    } else {
        text.to_owned()
    };
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(who: &str, details: serde_json::Value) -> Entry {
        Entry {
            id: 7,
            at: 1_740_830_400_000,
            who: who.into(),
            address: "10.0.0.1".into(),
            action: "token.create".into(),
            outcome: "done".into(),
            details,
        }
    }

    #[test]
    fn an_export_line_is_one_json_object_or_one_csv_record() {
        let e = entry("alice", serde_json::json!({ "name": "a,\"b\"\nc" }));
        let json = Format::Jsonl.line(&e);
        assert!(
            json.ends_with('\n') && json.matches('\n').count() == 1,
            "{json}"
        );
        let back: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(back["time"], "2025-03-01T12:00:00Z");
        assert_eq!(back["details"]["name"], "a,\"b\"\nc");
        let e = entry("alice", serde_json::json!({ "name": "a,b" }));
        assert_eq!(
            Format::Csv.line(&e),
            "7,1740830400000,2025-03-01T12:00:00Z,alice,10.0.0.1,token.create,done,\"{\"\"name\"\":\"\"a,b\"\"}\"\r\n"
        );
        assert_eq!(Format::Csv.header().split(',').count(), 8);
    }

    #[test]
    fn a_csv_field_a_spreadsheet_would_run_is_made_text() {
        assert_eq!(csv_field("=HYPERLINK(\"x\")"), "\"'=HYPERLINK(\"\"x\"\")\"");
        assert_eq!(csv_field("@SUM"), "'@SUM");
        assert_eq!(csv_field("-5"), "-5");
        assert_eq!(csv_field("server:a"), "server:a");
    }

    #[test]
    fn export_times_are_instants_days_or_ages() {
        let now = 1_740_830_400_000;
        assert_eq!(parse_time("2025-03-01T12:00:00Z", 0).unwrap(), now);
        assert_eq!(parse_time("2025-03-01", 0).unwrap(), now - 12 * 3_600_000);
        assert_eq!(parse_time("1d", now).unwrap(), now - 86_400_000);
        let e = parse_time("yesterday", now).unwrap_err().to_string();
        assert!(e.contains("2025-03-01T12:00:00Z"), "{e}");
        assert!("xml".parse::<Format>().is_err());
    }

    #[tokio::test]
    async fn old_entries_are_pruned_and_the_pruning_is_itself_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open("", dir.path(), 2).await.unwrap();
        let audit = Audit::new(db.clone());
        for _ in 0..3 {
            audit
                .record(&Change {
                    who: "alice",
                    address: "",
                    action: "token.create",
                    outcome: Outcome::Done,
                    details: serde_json::json!({}),
                })
                .await
                .unwrap();
        }
        // Two of them a year old.
        sqlx::query("UPDATE audit_log SET at = at - 31536000000 WHERE id <= 2")
            .execute(db.pool())
            .await
            .unwrap();
        let cutoff = now_ms() - 86_400_000;
        assert_eq!(audit.prune(cutoff, "server:a", "1d").await.unwrap(), 2);
        assert_eq!(audit.prune(cutoff, "server:a", "1d").await.unwrap(), 0);
        let all = Filter {
            page: 1,
            per_page: 10,
            ..Filter::default()
        };
        let (entries, total) = audit.list(&all).await.unwrap();
        assert_eq!(total, 2, "{entries:?}");
        assert_eq!(entries[0].action, PRUNE_ACTION);
        assert_eq!(entries[0].who, "server:a");
        assert_eq!(entries[0].details["deleted"], 2);

        // The export pages through a range by id, oldest first.
        let first = audit.export_page(Range::default(), 0, 1).await.unwrap();
        assert_eq!(first[0].id, 3);
        let rest = audit
            .export_page(Range::default(), first[0].id, 10)
            .await
            .unwrap();
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0].action, PRUNE_ACTION);
        let later = Range {
            since: Some(now_ms() + 60_000),
            until: None,
        };
        assert!(audit.export_page(later, 0, 10).await.unwrap().is_empty());
    }

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
            ..all.clone()
        };
        let (page2, total) = audit.list(&paged).await.unwrap();
        assert_eq!((page2.len(), total), (1, 4));
    }

    #[test]
    fn a_target_is_matched_as_a_whole_json_text_value_wildcards_escaped() {
        assert_eq!(target_pattern("web"), r#"%"web"%"#);
        assert_eq!(target_pattern("a_b%"), r#"%"a\_b\%"%"#);
        assert_eq!(target_pattern(r#"q"x"#), r#"%"q\\"x"%"#);
    }

    #[tokio::test]
    async fn entries_are_filtered_by_what_they_were_done_to() {
        let dir = tempfile::tempdir().unwrap();
        let audit = Audit::new(Db::open("", dir.path(), 2).await.unwrap());
        for details in [
            serde_json::json!({ "group": "web" }),
            serde_json::json!({ "group": "web2" }),
            serde_json::json!({ "agent": "a_1", "reason": "the web group" }),
            serde_json::json!({ "agent": "ab1" }),
        ] {
            audit
                .record(&Change {
                    who: "alice",
                    address: "",
                    action: "config.push",
                    outcome: Outcome::Done,
                    details,
                })
                .await
                .unwrap();
        }
        let of = |target: &str| Filter {
            target: Some(target.into()),
            page: 1,
            per_page: 10,
            ..Filter::default()
        };
        let (web, total) = audit.list(&of("web")).await.unwrap();
        assert_eq!(total, 1, "a whole value, not a part of one: {web:?}");
        assert_eq!(web[0].details["group"], "web");
        let (agent, _) = audit.list(&of("a_1")).await.unwrap();
        assert_eq!(agent.len(), 1, "_ is no wildcard: {agent:?}");
        assert_eq!(audit.list(&of("nobody")).await.unwrap().1, 0);
    }
}
