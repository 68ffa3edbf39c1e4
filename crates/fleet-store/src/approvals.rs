//! Approvals: a second pair of eyes on a change that moves agents.
//!
//! While the fleet requires it (the setting [`REQUIRED`], seeded from `[approval]
//! required` and switched live by an admin), a change that moves agents (a release
//! published or rolled back, a deployment's release or selector set, a configuration
//! set pushed) is not applied: it is *parked* here as `awaiting-approval`, with what
//! applying it later needs (its payload; a release's bytes stay with the kept release,
//! which pruning spares while the change waits). Another operator then approves it
//! (the edge applies it, as the change would have been applied) or rejects it; one that
//! waits past its `expires_at` lapses.
//!
//! The decisions are pure and tested without a database: [`Approval::state_at`] (a
//! waiting change lapses as a function of time) and [`Approval::decide`] (who may decide
//! what). The rows change only by a claim, an `UPDATE … WHERE state =
//! 'awaiting-approval'` that one statement wins, so two operators (or two servers of a
//! PostgreSQL fleet) never apply one change twice.
//!
//! This module knows no HTTP and nothing of what a payload means: the edge that parks
//! a change reads its own payload back.

use std::fmt;

use serde::Serialize;
use sqlx::Row;

use crate::db::Db;
use crate::error::FleetError;

/// The fleet-wide switch in the `settings` table: `true` or `false`.
pub const REQUIRED: &str = "approval.required";

/// How long a change waits for approval unless `approval.expires` says otherwise.
pub const DEFAULT_EXPIRES_SECS: u64 = 86_400;

/// Decided changes listed after the waiting ones, at most.
pub const DECIDED_LISTED: i64 = 50;

/// Where a parked change stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    AwaitingApproval,
    /// Approved by another operator and applied.
    Approved,
    Rejected,
    /// It waited longer than its expiry: never applied.
    Expired,
    /// Approved, but the fleet no longer allowed it (a deployment removed meanwhile):
    /// never applied; the reason says why.
    Failed,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::AwaitingApproval => "awaiting-approval",
            State::Approved => "approved",
            State::Rejected => "rejected",
            State::Expired => "expired",
            State::Failed => "failed",
        }
    }

    fn parse(text: &str) -> State {
        match text {
            "approved" => State::Approved,
            "rejected" => State::Rejected,
            "expired" => State::Expired,
            "failed" => State::Failed,
            _ => State::AwaitingApproval,
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an operator decides of a waiting change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Approve,
    Reject,
}

impl Decision {
    pub fn state(self) -> State {
        match self {
            Decision::Approve => State::Approved,
            Decision::Reject => State::Rejected,
        }
    }
}

/// Why a decision is not taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The operator who asked for the change may not approve it.
    OwnChange,
    /// It is not waiting (any more): decided, or lapsed.
    NotWaiting(State),
}

/// One parked change.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Approval {
    pub id: i64,
    /// The action it applies (`release.publish`, `deployment.set`, `config.push`, …).
    pub action: String,
    /// What it is done to, as the audit log says it (shown, never applied).
    pub subject: serde_json::Value,
    /// What applying it needs, as the edge that parked it wrote it.
    #[serde(skip)]
    pub payload: serde_json::Value,
    /// The kept release it names, if any: spared by pruning while the change waits.
    pub release: Option<String>,
    pub requested_by: String,
    /// Unix milliseconds.
    pub requested_at: i64,
    pub expires_at: i64,
    pub state: State,
    pub decided_by: Option<String>,
    pub decided_at: Option<i64>,
    pub reason: Option<String>,
}

impl Approval {
    /// The state at `now` (unix ms): a change still waiting at its `expires_at` has
    /// lapsed, whether or not a server has recorded that yet.
    pub fn state_at(&self, now: i64) -> State {
        if self.state == State::AwaitingApproval && now >= self.expires_at {
            State::Expired
        } else {
            self.state
        }
    }

    /// Whether `who` may take `decision` at `now`: the change must still be waiting,
    /// and the one who asked for it may withdraw it (reject) but never approve it. The
    /// role (an operator's at least) is the edge's to check.
    pub fn decide(&self, who: &str, decision: Decision, now: i64) -> Result<State, Refusal> {
        let state = self.state_at(now);
        if state != State::AwaitingApproval {
            return Err(Refusal::NotWaiting(state));
        }
        if decision == Decision::Approve && who == self.requested_by {
            return Err(Refusal::OwnChange);
        }
        Ok(decision.state())
    }

    /// The JSON the API and the CLI show: the stored row, its state as of `now`.
    pub fn to_json(&self, now: i64) -> serde_json::Value {
        let mut value = serde_json::to_value(self).unwrap_or_default();
        value["state"] = serde_json::json!(self.state_at(now).as_str());
        value
    }
}

/// A change to park.
#[derive(Debug, Clone)]
pub struct NewApproval<'a> {
    pub action: &'a str,
    pub subject: &'a serde_json::Value,
    pub payload: &'a serde_json::Value,
    pub release: Option<&'a str>,
    pub requested_by: &'a str,
    pub now: i64,
    pub expires_at: i64,
}

/// The switch as stored: on only when `true`.
pub fn required_on(value: Option<&str>) -> bool {
    value == Some("true")
}

/// The parked changes of a fleet database.
#[derive(Clone)]
pub struct Approvals {
    db: Db,
}

const COLUMNS: &str = "SELECT id, action, subject, payload, release_id, requested_by, requested_at, expires_at, state, decided_by, decided_at, reason FROM approvals";

fn row_of(r: &sqlx::any::AnyRow) -> Result<Approval, FleetError> {
    let json = |i: usize| -> Result<serde_json::Value, FleetError> {
        let text: String = r.try_get(i)?;
        Ok(serde_json::from_str(&text).unwrap_or_default())
    };
    Ok(Approval {
        id: r.try_get(0)?,
        action: r.try_get(1)?,
        subject: json(2)?,
        payload: json(3)?,
        release: r.try_get(4)?,
        requested_by: r.try_get(5)?,
        requested_at: r.try_get(6)?,
        expires_at: r.try_get(7)?,
        state: State::parse(&r.try_get::<String, _>(8)?),
        decided_by: r.try_get(9)?,
        decided_at: r.try_get(10)?,
        reason: r.try_get(11)?,
    })
}

impl Approvals {
    pub fn new(db: Db) -> Self {
        Self { db }
    }

    /// Whether the fleet requires approval now (read from the database each time: a
    /// switch on one server holds on every server at once).
    pub async fn required(&self) -> Result<bool, FleetError> {
        Ok(required_on(self.db.setting(REQUIRED).await?.as_deref()))
    }

    /// Switches approval on or off for the whole fleet.
    pub async fn set_required(&self, on: bool) -> Result<(), FleetError> {
        self.db
            .set_setting(REQUIRED, if on { "true" } else { "false" })
            .await
    }

    /// Writes `[approval] required` as the fleet's switch if the fleet has none yet (a
    /// new fleet database); returns the fleet's switch as it stands.
    pub async fn seed(&self, on: bool) -> Result<bool, FleetError> {
        sqlx::query(
            "INSERT INTO settings (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING",
        )
        .bind(REQUIRED)
        .bind(if on { "true" } else { "false" })
        .execute(self.db.pool())
        .await?;
        self.required().await
    }

    /// Parks a change as `awaiting-approval`.
    pub async fn park(&self, new: &NewApproval<'_>) -> Result<Approval, FleetError> {
        let row = sqlx::query(
            "INSERT INTO approvals (action, subject, payload, release_id, requested_by, requested_at, expires_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
        )
        .bind(new.action)
        .bind(new.subject.to_string())
        .bind(new.payload.to_string())
        .bind(new.release)
        .bind(new.requested_by)
        .bind(new.now)
        .bind(new.expires_at)
        .fetch_one(self.db.pool())
        .await?;
        let id: i64 = row.try_get(0)?;
        self.get(id)
            .await?
            .ok_or_else(|| FleetError::NotFound(format!("approval {id} went away as it was made")))
    }

    pub async fn get(&self, id: i64) -> Result<Option<Approval>, FleetError> {
        let row = sqlx::query(&format!("{COLUMNS} WHERE id = $1"))
            .bind(id)
            .fetch_optional(self.db.pool())
            .await?;
        row.as_ref().map(row_of).transpose()
    }

    /// The waiting changes, oldest first, then the last [`DECIDED_LISTED`] decided ones,
    /// newest first.
    pub async fn list(&self) -> Result<Vec<Approval>, FleetError> {
        let waiting = sqlx::query(&format!(
            "{COLUMNS} WHERE state = 'awaiting-approval' ORDER BY id"
        ))
        .fetch_all(self.db.pool())
        .await?;
        let decided = sqlx::query(&format!(
            "{COLUMNS} WHERE state <> 'awaiting-approval' ORDER BY id DESC LIMIT $1"
        ))
        .bind(DECIDED_LISTED)
        .fetch_all(self.db.pool())
        .await?;
        waiting.iter().chain(decided.iter()).map(row_of).collect()
    }

    /// Takes the decision `state` on the change `id` if it is still waiting and not
    /// lapsed at `now`: true when this call took it (one call of all the fleet's can).
    pub async fn claim(
        &self,
        id: i64,
        state: State,
        who: &str,
        reason: Option<&str>,
        now: i64,
    ) -> Result<bool, FleetError> {
        let done = sqlx::query(
            "UPDATE approvals SET state = $2, decided_by = $3, decided_at = $4, reason = $5
             WHERE id = $1 AND state = 'awaiting-approval' AND expires_at > $4",
        )
        .bind(id)
        .bind(state.as_str())
        .bind(who)
        .bind(now)
        .bind(reason)
        .execute(self.db.pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// An approved change the fleet would not take after all: `failed`, with why.
    pub async fn failed(&self, id: i64, why: &str) -> Result<(), FleetError> {
        sqlx::query("UPDATE approvals SET state = 'failed', reason = $2 WHERE id = $1")
            .bind(id)
            .bind(why)
            .execute(self.db.pool())
            .await?;
        Ok(())
    }

    /// Records as `expired` the waiting changes whose time ran out by `now`; returns
    /// those this call recorded (each by one call of all the fleet's), for the audit log.
    pub async fn expire_due(&self, now: i64) -> Result<Vec<Approval>, FleetError> {
        let due = sqlx::query(&format!(
            "{COLUMNS} WHERE state = 'awaiting-approval' AND expires_at <= $1 ORDER BY id LIMIT 100"
        ))
        .bind(now)
        .fetch_all(self.db.pool())
        .await?;
        let mut lapsed = Vec::new();
        for row in &due {
            let mut approval = row_of(row)?;
            let taken = sqlx::query(
                "UPDATE approvals SET state = 'expired', decided_at = $2
                 WHERE id = $1 AND state = 'awaiting-approval'",
            )
            .bind(approval.id)
            .bind(now)
            .execute(self.db.pool())
            .await?;
            if taken.rows_affected() == 1 {
                approval.state = State::Expired;
                approval.decided_at = Some(now);
                lapsed.push(approval);
            }
        }
        Ok(lapsed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(by: &str, expires_at: i64) -> Approval {
        Approval {
            id: 1,
            action: "release.publish".into(),
            subject: serde_json::json!({ "release": "2.0.0+2" }),
            payload: serde_json::json!({}),
            release: Some("2.0.0+2".into()),
            requested_by: by.into(),
            requested_at: 0,
            expires_at,
            state: State::AwaitingApproval,
            decided_by: None,
            decided_at: None,
            reason: None,
        }
    }

    #[test]
    fn a_waiting_change_lapses_at_its_expiry_and_not_before() {
        let a = waiting("alice", 1_000);
        assert_eq!(a.state_at(999), State::AwaitingApproval);
        assert_eq!(a.state_at(1_000), State::Expired);
        assert_eq!(a.to_json(5_000)["state"], "expired");
        // A decided change stays as decided, however late.
        let mut done = a.clone();
        done.state = State::Rejected;
        assert_eq!(done.state_at(5_000), State::Rejected);
    }

    #[test]
    fn another_operator_approves_and_the_one_who_asked_may_only_withdraw() {
        let a = waiting("alice", 1_000);
        assert_eq!(
            a.decide("alice", Decision::Approve, 10),
            Err(Refusal::OwnChange)
        );
        assert_eq!(a.decide("bob", Decision::Approve, 10), Ok(State::Approved));
        assert_eq!(a.decide("bob", Decision::Reject, 10), Ok(State::Rejected));
        assert_eq!(
            a.decide("alice", Decision::Reject, 10),
            Ok(State::Rejected),
            "withdrawing one's own change is no second pair of eyes, and needs none"
        );
    }

    #[test]
    fn a_decided_or_lapsed_change_takes_no_decision() {
        let a = waiting("alice", 1_000);
        assert_eq!(
            a.decide("bob", Decision::Approve, 1_000),
            Err(Refusal::NotWaiting(State::Expired))
        );
        let mut rejected = a.clone();
        rejected.state = State::Rejected;
        assert_eq!(
            rejected.decide("bob", Decision::Approve, 10),
            Err(Refusal::NotWaiting(State::Rejected))
        );
    }

    #[test]
    fn the_switch_is_off_unless_turned_on() {
        assert!(!required_on(None));
        assert!(!required_on(Some("false")));
        assert!(!required_on(Some("yes")));
        assert!(required_on(Some("true")));
    }

    async fn db() -> (tempfile::TempDir, Approvals) {
        let home = tempfile::tempdir().unwrap();
        let db = Db::open("", home.path(), 4).await.unwrap();
        (home, Approvals::new(db))
    }

    fn new<'a>(subject: &'a serde_json::Value, now: i64, expires_at: i64) -> NewApproval<'a> {
        NewApproval {
            action: "config.push",
            subject,
            payload: subject,
            release: None,
            requested_by: "alice",
            now,
            expires_at,
        }
    }

    #[tokio::test]
    async fn a_change_is_decided_once_and_a_lapsed_one_not_at_all() {
        let (_home, approvals) = db().await;
        let subject = serde_json::json!({ "group": "web" });
        let a = approvals.park(&new(&subject, 0, 1_000)).await.unwrap();
        assert_eq!(a.state, State::AwaitingApproval);
        assert_eq!(a.payload, subject);
        assert!(
            approvals
                .claim(a.id, State::Approved, "bob", None, 10)
                .await
                .unwrap()
        );
        assert!(
            !approvals
                .claim(a.id, State::Rejected, "carol", None, 11)
                .await
                .unwrap(),
            "decided already"
        );
        let stored = approvals.get(a.id).await.unwrap().unwrap();
        assert_eq!(stored.state, State::Approved);
        assert_eq!(stored.decided_by.as_deref(), Some("bob"));

        let late = approvals.park(&new(&subject, 0, 1_000)).await.unwrap();
        assert!(
            !approvals
                .claim(late.id, State::Approved, "bob", None, 1_000)
                .await
                .unwrap(),
            "lapsed at its expiry"
        );
        let lapsed = approvals.expire_due(1_000).await.unwrap();
        assert_eq!(lapsed.iter().map(|a| a.id).collect::<Vec<_>>(), [late.id]);
        assert!(
            approvals.expire_due(2_000).await.unwrap().is_empty(),
            "recorded once"
        );
        let listed = approvals.list().await.unwrap();
        assert_eq!(listed.len(), 2);
    }

    #[tokio::test]
    async fn the_file_seeds_a_new_fleet_and_the_fleet_keeps_its_switch() {
        let (_home, approvals) = db().await;
        assert!(!approvals.required().await.unwrap());
        assert!(approvals.seed(true).await.unwrap());
        assert!(
            approvals.seed(false).await.unwrap(),
            "the fleet's switch stands"
        );
        approvals.set_required(false).await.unwrap();
        assert!(!approvals.required().await.unwrap());
    }
}
