//! Rollout state in the fleet database: the rows, the wave counts, and the writes that
//! apply a decision. Every transition is guarded twice: by the write lock of the
//! transaction it is decided in, and by a unique event row (`rollout_events_once`), so a
//! wave is opened once even by two servers or across a restart.
//!
//! Bundle rollouts and configuration rollouts have tables of the same shape
//! ([`Tables`]: [`BUNDLES`], [`CONFIGS`]); everything after a rollout's row is read
//! (waves, members, outcomes, events, the writes of a decision) is shared by both.

use std::collections::HashMap;

use agent_protocol::AgentVersion;
use sqlx::any::AnyRow;
use sqlx::{Any, AnyConnection, Executor, Row};

use crate::db::Backend;
use crate::rollout::plan::Plan;
use crate::rollout::step::{Decision, HaltCause, Progress, State, WaveStatus};

pub const INSTALLED: &str = "INSTALLED";
pub const INSTALL_FAILED: &str = "INSTALL_FAILED";
pub const TIMED_OUT: &str = "TIMED_OUT";

/// The tables of one kind of rollout, and the outcomes its agents report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tables {
    pub rollouts: &'static str,
    pub waves: &'static str,
    pub agents: &'static str,
    pub events: &'static str,
    /// The outcome of an agent that made it, and of one that failed.
    pub done: &'static str,
    pub failed: &'static str,
    /// The columns of `agents` (status, error) a missed deadline is written to.
    pub agent_status: Option<(&'static str, &'static str)>,
    /// What an agent was to report, for the deadline's message.
    pub awaited: &'static str,
}

/// A new bundle reaching the fleet.
pub const BUNDLES: &Tables = &Tables {
    rollouts: "rollouts",
    waves: "rollout_waves",
    agents: "rollout_agents",
    events: "rollout_events",
    done: INSTALLED,
    failed: INSTALL_FAILED,
    agent_status: Some(("update_status", "update_error")),
    awaited: "INSTALLED or INSTALL_FAILED",
};

/// A new configuration set reaching a group.
pub const CONFIGS: &Tables = &Tables {
    rollouts: "config_rollouts",
    waves: "config_rollout_waves",
    agents: "config_rollout_agents",
    events: "config_rollout_events",
    done: APPLIED,
    failed: FAILED,
    agent_status: None,
    awaited: "APPLIED or FAILED",
};

pub const APPLIED: &str = "APPLIED";
pub const FAILED: &str = "FAILED";

/// What the shared functions need of a rollout's row, whatever its kind.
#[derive(Debug, Clone, Copy)]
pub struct Head<'a> {
    pub id: i64,
    pub plan: &'a Plan,
    pub state: State,
    pub opened: u32,
    pub forgiven: u64,
}

impl RolloutRow {
    pub fn head(&self) -> Head<'_> {
        Head {
            id: self.id,
            plan: &self.plan,
            state: self.state,
            opened: self.opened,
            forgiven: self.forgiven,
        }
    }
}

/// How many failed agents a halt reason names.
const FAILURES_NAMED: i64 = 3;

/// A rollout as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolloutRow {
    pub id: i64,
    pub sha256: String,
    /// `signed-at` of the bundle's signature (0 when it had none).
    pub signed_at: i64,
    pub version: AgentVersion,
    pub previous: Option<AgentVersion>,
    pub state: State,
    pub reason: Option<String>,
    pub halt_cause: Option<String>,
    pub plan: Plan,
    pub opened: u32,
    pub forgiven: u64,
    pub started_at: i64,
    pub completed_at: Option<i64>,
}

/// An agent's place in a rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Membership {
    pub wave: u32,
    pub told: bool,
    /// It has an outcome (made it, failed or timed out).
    pub done: bool,
    /// Its outcome is the failure it reported.
    pub failed: bool,
}

fn member(t: &Tables, wave: i64, told_at: Option<i64>, outcome: Option<String>) -> Membership {
    Membership {
        wave: u32::try_from(wave).unwrap_or(0),
        told: told_at.is_some(),
        done: outcome.is_some(),
        failed: outcome.as_deref() == Some(t.failed),
    }
}

const ROLLOUT_COLUMNS: &str = "SELECT id, sha256, signed_at, version, previous, state, reason, halt_cause, plan, opened, forgiven, started_at, completed_at FROM rollouts";

fn decode(what: &str, e: impl std::fmt::Display) -> sqlx::Error {
    sqlx::Error::Decode(format!("{what}: {e}").into())
}

fn rollout_row(r: &AnyRow) -> Result<RolloutRow, sqlx::Error> {
    let version: String = r.try_get(3)?;
    let previous: Option<String> = r.try_get(4)?;
    let state: String = r.try_get(5)?;
    let plan: String = r.try_get(8)?;
    Ok(RolloutRow {
        id: r.try_get(0)?,
        sha256: r.try_get(1)?,
        signed_at: r.try_get(2)?,
        version: version.parse().map_err(|e| decode("rollouts.version", e))?,
        previous: previous
            .map(|p| p.parse().map_err(|e| decode("rollouts.previous", e)))
            .transpose()?,
        state: state.parse().map_err(|e| decode("rollouts.state", e))?,
        reason: r.try_get(6)?,
        halt_cause: r.try_get(7)?,
        plan: serde_json::from_str(&plan).map_err(|e| decode("rollouts.plan", e))?,
        opened: u32::try_from(r.try_get::<i64, _>(9)?).unwrap_or(0),
        forgiven: u64::try_from(r.try_get::<i64, _>(10)?).unwrap_or(0),
        started_at: r.try_get(11)?,
        completed_at: r.try_get(12)?,
    })
}

/// The fleet's rollout: the one started last.
pub async fn latest<'e>(
    e: impl Executor<'e, Database = Any>,
) -> Result<Option<RolloutRow>, sqlx::Error> {
    sqlx::query(&format!("{ROLLOUT_COLUMNS} ORDER BY id DESC LIMIT 1"))
        .fetch_optional(e)
        .await?
        .as_ref()
        .map(rollout_row)
        .transpose()
}

/// The rollout `id`, with its row locked until the transaction ends (PostgreSQL; SQLite's
/// `BEGIN IMMEDIATE` already holds the whole database).
pub async fn lock<'e>(
    e: impl Executor<'e, Database = Any>,
    backend: Backend,
    id: i64,
) -> Result<Option<RolloutRow>, sqlx::Error> {
    let lock = match backend {
        Backend::Postgres => " FOR UPDATE",
        Backend::Sqlite => "",
    };
    sqlx::query(&format!("{ROLLOUT_COLUMNS} WHERE id = $1{lock}"))
        .bind(id)
        .fetch_optional(e)
        .await?
        .as_ref()
        .map(rollout_row)
        .transpose()
}

/// The rollout `id` as it stands, without a lock: for a look that decides nothing.
pub async fn get<'e>(
    e: impl Executor<'e, Database = Any>,
    id: i64,
) -> Result<Option<RolloutRow>, sqlx::Error> {
    lock(e, Backend::Sqlite, id).await
}

pub async fn find<'e>(
    e: impl Executor<'e, Database = Any>,
    sha256: &str,
    signed_at: i64,
) -> Result<Option<RolloutRow>, sqlx::Error> {
    sqlx::query(&format!(
        "{ROLLOUT_COLUMNS} WHERE sha256 = $1 AND signed_at = $2"
    ))
    .bind(sha256)
    .bind(signed_at)
    .fetch_optional(e)
    .await?
    .as_ref()
    .map(rollout_row)
    .transpose()
}

/// The target of the last completed rollout: the version the fleet ran before.
pub async fn last_completed_version<'e>(
    e: impl Executor<'e, Database = Any>,
) -> Result<Option<AgentVersion>, sqlx::Error> {
    let row = sqlx::query(
        "SELECT version FROM rollouts WHERE state = 'completed' ORDER BY completed_at DESC, id DESC LIMIT 1",
    )
    .fetch_optional(e)
    .await?;
    row.map(|r| {
        r.get::<String, _>(0)
            .parse()
            .map_err(|e| decode("rollouts.version", e))
    })
    .transpose()
}

/// What a new rollout starts with.
pub struct NewRollout<'a> {
    pub sha256: &'a str,
    pub signed_at: i64,
    pub version: &'a AgentVersion,
    pub previous: Option<&'a AgentVersion>,
    pub state: State,
    pub reason: Option<&'a str>,
    pub halt_cause: Option<&'a str>,
    pub plan: &'a Plan,
    pub now: i64,
}

/// Inserts the rollout and its waves; `None` if another server (or an earlier run) made it.
pub async fn insert(
    tx: &mut sqlx::Transaction<'static, Any>,
    new: &NewRollout<'_>,
) -> Result<Option<i64>, sqlx::Error> {
    let plan = serde_json::to_string(new.plan).map_err(|e| decode("plan", e))?;
    let id: Option<i64> = sqlx::query(
        "INSERT INTO rollouts (sha256, signed_at, version, previous, state, reason, halt_cause, plan, opened, forgiven, started_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 0, 0, $9)
         ON CONFLICT (sha256, signed_at) DO NOTHING RETURNING id",
    )
    .bind(new.sha256)
    .bind(new.signed_at)
    .bind(new.version.to_string())
    .bind(new.previous.map(ToString::to_string))
    .bind(new.state.as_str())
    .bind(new.reason)
    .bind(new.halt_cause)
    .bind(plan)
    .bind(new.now)
    .fetch_optional(&mut **tx)
    .await?
    .map(|r| r.get(0));
    let Some(id) = id else {
        return Ok(None);
    };
    insert_waves(tx, BUNDLES, id, new.plan).await?;
    Ok(Some(id))
}

/// The plan's waves of a new rollout, none opened.
pub async fn insert_waves(
    tx: &mut sqlx::Transaction<'static, Any>,
    t: &Tables,
    id: i64,
    plan: &Plan,
) -> Result<(), sqlx::Error> {
    for (i, spec) in plan.waves.iter().enumerate() {
        sqlx::query(&format!(
            "INSERT INTO {} (rollout_id, wave, spec) VALUES ($1, $2, $3)",
            t.waves
        ))
        .bind(id)
        .bind(i as i64 + 1)
        .bind(spec.to_string())
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// Agents heard from since `since_secs`: (id, group, version).
pub async fn live_agents<'e>(
    e: impl Executor<'e, Database = Any>,
    since_secs: i64,
) -> Result<Vec<(String, String, String)>, sqlx::Error> {
    let rows = sqlx::query(
        // OpAMP agents that do not accept packages are never told to update.
        "SELECT id, agent_group, version FROM agents WHERE last_contact >= $1
           AND (protocol <> 'opamp' OR id IN (SELECT agent_id FROM agent_opamp WHERE accepts_packages = 1))
         ORDER BY id",
    )
    .bind(since_secs)
    .fetch_all(e)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect())
}

/// Places agents in their waves; `done` ones (already on the target) count as installed.
pub async fn insert_members(
    tx: &mut sqlx::Transaction<'static, Any>,
    t: &Tables,
    rollout: i64,
    members: &[(String, u32, bool)],
    now: i64,
) -> Result<(), sqlx::Error> {
    // Several rows per statement: a 10,000-agent fleet is placed in 50 round trips.
    for chunk in members.chunks(200) {
        let mut sql = format!(
            "INSERT INTO {} (rollout_id, agent_id, wave, outcome, outcome_at) VALUES ",
            t.agents
        );
        for i in 0..chunk.len() {
            let b = i * 5;
            if i > 0 {
                sql.push(',');
            }
            sql.push_str(&format!(
                "(${}, ${}, ${}, ${}, ${})",
                b + 1,
                b + 2,
                b + 3,
                b + 4,
                b + 5
            ));
        }
        sql.push_str(" ON CONFLICT (rollout_id, agent_id) DO NOTHING");
        let mut q = sqlx::query(&sql);
        for (agent, wave, done) in chunk {
            q = q
                .bind(rollout)
                .bind(agent.as_str())
                .bind(i64::from(*wave))
                .bind(done.then_some(t.done))
                .bind(done.then_some(now));
        }
        q.execute(&mut **tx).await?;
    }
    Ok(())
}

pub async fn membership<'e>(
    e: impl Executor<'e, Database = Any>,
    t: &Tables,
    rollout: i64,
    agent: &str,
) -> Result<Option<Membership>, sqlx::Error> {
    let row = sqlx::query(&format!(
        "SELECT wave, told_at, outcome FROM {} WHERE rollout_id = $1 AND agent_id = $2",
        t.agents
    ))
    .bind(rollout)
    .bind(agent)
    .fetch_optional(e)
    .await?;
    Ok(row.map(|r| member(t, r.get(0), r.get(1), r.get(2))))
}

/// Places an agent first seen during the rollout; the first server to do so wins.
pub async fn join<'e>(
    e: impl Executor<'e, Database = Any> + Copy,
    t: &Tables,
    rollout: i64,
    agent: &str,
    wave: u32,
    done: bool,
    now: i64,
) -> Result<Membership, sqlx::Error> {
    sqlx::query(&format!(
        "INSERT INTO {} (rollout_id, agent_id, wave, outcome, outcome_at) VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (rollout_id, agent_id) DO NOTHING",
        t.agents
    ))
    .bind(rollout)
    .bind(agent)
    .bind(i64::from(wave))
    .bind(done.then_some(t.done))
    .bind(done.then_some(now))
    .execute(e)
    .await?;
    Ok(membership(e, t, rollout, agent)
        .await?
        .unwrap_or(Membership {
            wave,
            told: false,
            done,
            failed: false,
        }))
}

/// The first `409` of this rollout to the agent.
pub async fn mark_told<'e>(
    e: impl Executor<'e, Database = Any>,
    t: &Tables,
    rollout: i64,
    agent: &str,
    now: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query(&format!(
        "UPDATE {} SET told_at = $3 WHERE rollout_id = $1 AND agent_id = $2 AND told_at IS NULL",
        t.agents
    ))
    .bind(rollout)
    .bind(agent)
    .bind(now)
    .execute(e)
    .await?;
    Ok(())
}

/// What the agent reported (or, for `INSTALLED`, showed by running the target).
pub async fn set_outcome<'e>(
    e: impl Executor<'e, Database = Any>,
    t: &Tables,
    rollout: i64,
    agent: &str,
    outcome: &str,
    error: Option<&str>,
    now: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query(&format!(
        "UPDATE {} SET outcome = $3, outcome_at = $4, error = $5
         WHERE rollout_id = $1 AND agent_id = $2 AND (outcome IS NULL OR outcome <> $3)",
        t.agents
    ))
    .bind(rollout)
    .bind(agent)
    .bind(outcome)
    .bind(now)
    .bind(error)
    .execute(e)
    .await?;
    Ok(())
}

/// The agents of rollout `$1` told (or, never reached, whose wave opened) at `$2` or
/// before, without an outcome: those past the agent deadline when `$2` is its cutoff.
fn past_deadline(t: &Tables) -> String {
    format!(
        "rollout_id = $1 AND outcome IS NULL AND (
       (told_at IS NOT NULL AND told_at <= $2)
       OR (told_at IS NULL AND wave IN (SELECT wave FROM {}
            WHERE rollout_id = $1 AND opened_at IS NOT NULL AND opened_at <= $2)))",
        t.waves
    )
}

fn deadline_cutoff(plan: &Plan, now: i64) -> i64 {
    now.saturating_sub(plan.agent_deadline.saturating_mul(1000) as i64)
}

/// Whether [`time_out`] would time any agent out now.
pub async fn overdue(
    conn: &mut AnyConnection,
    t: &Tables,
    rollout: i64,
    plan: &Plan,
    now: i64,
) -> Result<bool, sqlx::Error> {
    let row = sqlx::query(&format!(
        "SELECT 1 FROM {} WHERE {} LIMIT 1",
        t.agents,
        past_deadline(t)
    ))
    .bind(rollout)
    .bind(deadline_cutoff(plan, now))
    .fetch_optional(conn)
    .await?;
    Ok(row.is_some())
}

/// Marks `TIMED_OUT` every agent of an open wave that was told (or, never reached, whose
/// wave opened) `agent-deadline` ago or more without an outcome; returns their ids.
pub async fn time_out(
    tx: &mut sqlx::Transaction<'static, Any>,
    t: &Tables,
    rollout: i64,
    plan: &Plan,
    now: i64,
) -> Result<Vec<String>, sqlx::Error> {
    let ids: Vec<String> = sqlx::query(&format!(
        "UPDATE {} SET outcome = 'TIMED_OUT', outcome_at = $3,
           error = 'no report within the agent deadline'
         WHERE {}
         RETURNING agent_id",
        t.agents,
        past_deadline(t)
    ))
    .bind(rollout)
    .bind(deadline_cutoff(plan, now))
    .bind(now)
    .fetch_all(&mut **tx)
    .await?
    .into_iter()
    .map(|r| r.get(0))
    .collect();
    let Some((status, error)) = t.agent_status else {
        return Ok(ids);
    };
    let detail = format!(
        "no {} within the agent deadline ({} s)",
        t.awaited, plan.agent_deadline
    );
    for id in &ids {
        sqlx::query(&format!(
            "UPDATE agents SET {status} = 'TIMED_OUT', {error} = $2 WHERE id = $1"
        ))
        .bind(id)
        .bind(&detail)
        .execute(&mut **tx)
        .await?;
    }
    Ok(ids)
}

/// The rollout as the step function sees it.
pub async fn progress(
    tx: &mut sqlx::Transaction<'static, Any>,
    t: &Tables,
    row: &Head<'_>,
) -> Result<Progress, sqlx::Error> {
    let waves = wave_status(tx, t, row).await?;
    let told: i64 = sqlx::query(&format!(
        "SELECT COUNT(*) FROM {} WHERE rollout_id = $1 AND told_at IS NOT NULL",
        t.agents
    ))
    .bind(row.id)
    .fetch_one(&mut **tx)
    .await?
    .get(0);
    let failures_seen = sqlx::query(&format!(
        "SELECT ra.agent_id, COALESCE(a.name, ''), ra.outcome, COALESCE(ra.error, '')
         FROM {} ra LEFT JOIN agents a ON a.id = ra.agent_id
         WHERE ra.rollout_id = $1 AND ra.outcome IN ($3, 'TIMED_OUT')
         ORDER BY ra.outcome_at LIMIT $2",
        t.agents
    ))
    .bind(row.id)
    .bind(FAILURES_NAMED)
    .bind(t.failed)
    .fetch_all(&mut **tx)
    .await?
    .into_iter()
    .map(|r| {
        let (id, name, outcome, error): (String, String, String, String) =
            (r.get(0), r.get(1), r.get(2), r.get(3));
        let who = if name.is_empty() {
            id
        } else {
            format!("{name} ({id})")
        };
        let error: String = error.chars().take(160).collect();
        if error.is_empty() {
            format!("{who} {outcome}")
        } else {
            format!("{who} {outcome}: {error}")
        }
    })
    .collect();
    Ok(Progress {
        state: row.state,
        opened: row.opened,
        waves,
        told: u64::try_from(told).unwrap_or(0),
        forgiven: row.forgiven,
        failures_seen,
    })
}

/// Each wave's counts and times, in order.
pub async fn wave_status(
    conn: &mut AnyConnection,
    t: &Tables,
    row: &Head<'_>,
) -> Result<Vec<WaveStatus>, sqlx::Error> {
    let mut waves = vec![WaveStatus::default(); row.plan.waves.len()];
    for r in sqlx::query(&format!(
        "SELECT wave, opened_at, completed_at FROM {} WHERE rollout_id = $1",
        t.waves
    ))
    .bind(row.id)
    .fetch_all(&mut *conn)
    .await?
    {
        if let Some(w) = slot(&mut waves, r.get(0)) {
            w.opened_at = r.get(1);
            w.completed_at = r.get(2);
        }
    }
    for r in sqlx::query(&format!(
        "SELECT wave, COALESCE(outcome, ''), COUNT(*) FROM {} WHERE rollout_id = $1 GROUP BY wave, COALESCE(outcome, '')",
        t.agents
    ))
    .bind(row.id)
    .fetch_all(&mut *conn)
    .await?
    {
        let outcome: String = r.get(1);
        let n = u64::try_from(r.get::<i64, _>(2)).unwrap_or(0);
        if let Some(w) = slot(&mut waves, r.get(0)) {
            w.agents += n;
            match outcome.as_str() {
                o if o == t.done => w.installed += n,
                o if o == t.failed => w.failed += n,
                TIMED_OUT => w.timed_out += n,
                _ => {}
            }
        }
    }
    Ok(waves)
}

fn slot(waves: &mut [WaveStatus], wave: i64) -> Option<&mut WaveStatus> {
    waves.get_mut(usize::try_from(wave).ok()?.checked_sub(1)?)
}

/// Records an event; false if its unique key says it happened already.
#[allow(
    clippy::too_many_arguments,
    reason = "one row's columns, each named at the call"
)]
pub async fn event<'e>(
    e: impl Executor<'e, Database = Any>,
    t: &Tables,
    rollout: i64,
    kind: &str,
    wave: u32,
    detail: &str,
    now: i64,
    server: &str,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(&format!(
        "INSERT INTO {} (rollout_id, kind, wave, at, detail, server) VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT DO NOTHING",
        t.events
    ))
    .bind(rollout)
    .bind(kind)
    .bind(i64::from(wave))
    .bind(now)
    .bind(detail)
    .bind(server)
    .execute(e)
    .await?;
    Ok(done.rows_affected() > 0)
}

/// Applies one decision to the locked rollout `row`; false if it was taken already.
pub async fn apply(
    tx: &mut sqlx::Transaction<'static, Any>,
    t: &Tables,
    row: &Head<'_>,
    decision: &Decision,
    now: i64,
    server: &str,
) -> Result<bool, sqlx::Error> {
    let id = row.id;
    match decision {
        Decision::OpenWave(w) => {
            if !event(&mut **tx, t, id, "wave_opened", *w, "", now, server).await? {
                return Ok(false);
            }
            sqlx::query(&format!(
                "UPDATE {} SET opened = $2, state = 'running' WHERE id = $1 AND opened = $3",
                t.rollouts
            ))
            .bind(id)
            .bind(i64::from(*w))
            .bind(i64::from(w.saturating_sub(1)))
            .execute(&mut **tx)
            .await?;
            sqlx::query(&format!("UPDATE {} SET opened_at = $3 WHERE rollout_id = $1 AND wave = $2 AND opened_at IS NULL", t.waves))
                .bind(id)
                .bind(i64::from(*w))
                .bind(now)
                .execute(&mut **tx)
                .await?;
        }
        Decision::CompleteWave(w) => {
            if !event(&mut **tx, t, id, "wave_completed", *w, "", now, server).await? {
                return Ok(false);
            }
            sqlx::query(&format!("UPDATE {} SET completed_at = $3 WHERE rollout_id = $1 AND wave = $2 AND completed_at IS NULL", t.waves))
                .bind(id)
                .bind(i64::from(*w))
                .bind(now)
                .execute(&mut **tx)
                .await?;
        }
        Decision::Soak(w) => {
            event(&mut **tx, t, id, "soaking", *w, "", now, server).await?;
            set_state(tx, t, id, State::Soaking, None, None).await?;
        }
        Decision::Halt { cause, reason } => {
            event(&mut **tx, t, id, "halted", row.opened, reason, now, server).await?;
            set_state(tx, t, id, State::Halted, Some(reason), Some(cause.as_str())).await?;
            // The server's own decision, in the audit log with the halt itself (an
            // operator's halt is recorded by the edge that took it, under their name).
            if *cause != HaltCause::Operator {
                let who = format!("server:{server}");
                let action = if t.rollouts == BUNDLES.rollouts {
                    "rollout.halt"
                } else {
                    "config.halt"
                };
                crate::audit::record_in(
                    &mut **tx,
                    &crate::audit::Change {
                        who: &who,
                        address: "",
                        action,
                        outcome: crate::audit::Outcome::Done,
                        details: serde_json::json!({
                            "rollout": id,
                            "cause": cause.as_str(),
                            "reason": reason,
                        }),
                    },
                )
                .await?;
            }
        }
        Decision::Complete => {
            if !event(&mut **tx, t, id, "completed", 0, "", now, server).await? {
                return Ok(false);
            }
            set_state(tx, t, id, State::Completed, None, None).await?;
            sqlx::query(&format!(
                "UPDATE {} SET completed_at = $2 WHERE id = $1",
                t.rollouts
            ))
            .bind(id)
            .bind(now)
            .execute(&mut **tx)
            .await?;
        }
    }
    Ok(true)
}

pub async fn set_state(
    tx: &mut sqlx::Transaction<'static, Any>,
    t: &Tables,
    id: i64,
    state: State,
    reason: Option<&str>,
    cause: Option<&str>,
) -> Result<(), sqlx::Error> {
    sqlx::query(&format!(
        "UPDATE {} SET state = $2, reason = $3, halt_cause = $4 WHERE id = $1",
        t.rollouts
    ))
    .bind(id)
    .bind(state.as_str())
    .bind(reason)
    .bind(cause)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Lets the failures seen so far go (an operator's `resume`).
pub async fn forgive(
    tx: &mut sqlx::Transaction<'static, Any>,
    t: &Tables,
    id: i64,
    failures: u64,
) -> Result<(), sqlx::Error> {
    sqlx::query(&format!(
        "UPDATE {} SET forgiven = $2 WHERE id = $1",
        t.rollouts
    ))
    .bind(id)
    .bind(i64::try_from(failures).unwrap_or(i64::MAX))
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Every agent's place in a rollout, to answer from memory.
pub async fn memberships<'e>(
    e: impl Executor<'e, Database = Any>,
    t: &Tables,
    rollout: i64,
) -> Result<HashMap<String, Membership>, sqlx::Error> {
    Ok(sqlx::query(&format!(
        "SELECT agent_id, wave, told_at, outcome FROM {} WHERE rollout_id = $1",
        t.agents
    ))
    .bind(rollout)
    .fetch_all(e)
    .await?
    .into_iter()
    .map(|r| {
        (
            r.get::<String, _>(0),
            member(t, r.get(1), r.get(2), r.get(3)),
        )
    })
    .collect())
}

/// Every agent's wave and `told_at` in a rollout, for `/admin/agents`.
pub async fn members<'e>(
    e: impl Executor<'e, Database = Any>,
    t: &Tables,
    rollout: i64,
) -> Result<HashMap<String, (u32, Option<i64>)>, sqlx::Error> {
    Ok(sqlx::query(&format!(
        "SELECT agent_id, wave, told_at FROM {} WHERE rollout_id = $1",
        t.agents
    ))
    .bind(rollout)
    .fetch_all(e)
    .await?
    .into_iter()
    .map(|r| {
        (
            r.get::<String, _>(0),
            (u32::try_from(r.get::<i64, _>(1)).unwrap_or(0), r.get(2)),
        )
    })
    .collect())
}

/// The transitions of a rollout, oldest first: (kind, wave, at, detail, server).
pub async fn events<'e>(
    e: impl Executor<'e, Database = Any>,
    t: &Tables,
    rollout: i64,
) -> Result<Vec<(String, u32, i64, String, String)>, sqlx::Error> {
    Ok(sqlx::query(&format!(
        "SELECT kind, wave, at, COALESCE(detail, ''), server FROM {} WHERE rollout_id = $1 ORDER BY id",
        t.events
    ))
    .bind(rollout)
    .fetch_all(e)
    .await?
    .into_iter()
    .map(|r| {
        (
            r.get(0),
            u32::try_from(r.get::<i64, _>(1)).unwrap_or(0),
            r.get(2),
            r.get(3),
            r.get(4),
        )
    })
    .collect())
}
