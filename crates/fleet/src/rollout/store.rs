//! Rollouts in the fleet database, of every kind: one family of tables (`rollouts`,
//! `rollout_waves`, `rollout_agents`, `rollout_events`), a rollout's kind in its row's
//! `rollout_kind`. Here are the rows, the wave counts, and the writes that apply a
//! decision. Every transition is guarded twice: by the write lock of the transaction it
//! is decided in, and by a unique event row (`rollout_events_once`), so a wave is opened
//! once even by two servers or across a restart.
//!
//! What differs between kinds is said once, by [`Kind`] (the outcomes its agents report,
//! the agent columns a missed deadline is written to) and by a [`Subject`] (the columns
//! that name what is rolled out: a bundle's sha256, signature time and versions, or a
//! configuration set's group and hash).

use std::collections::HashMap;

use agent_protocol::AgentVersion;
use sqlx::any::AnyRow;
use sqlx::{Any, AnyConnection, Executor, Row as _};

use crate::db::{Backend, retrying_lost_races};
use crate::error::FleetError;
use crate::rollout::plan::Plan;
use crate::rollout::step::{Decision, HaltCause, Progress, State, WaveStatus};

pub const INSTALLED: &str = "INSTALLED";
pub const INSTALL_FAILED: &str = "INSTALL_FAILED";
pub const TIMED_OUT: &str = "TIMED_OUT";
/// A bundle rollout's outcome for an agent whose platform the release has no bundle
/// for (nor a static musl one of its architecture): it keeps its version; neither a
/// failure nor waited for.
pub const NO_BUNDLE: &str = "NO_BUNDLE";
pub const APPLIED: &str = "APPLIED";
pub const FAILED: &str = "FAILED";

/// What a rollout rolls out, as its row's `rollout_kind` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A new bundle reaching the fleet.
    Bundle,
    /// A new configuration set reaching a group.
    Config,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Bundle => "bundle",
            Kind::Config => "config",
        }
    }

    /// The outcome of an agent that made it.
    pub fn done(self) -> &'static str {
        match self {
            Kind::Bundle => INSTALLED,
            Kind::Config => APPLIED,
        }
    }

    /// The outcome of an agent that reported a failure.
    pub fn failed(self) -> &'static str {
        match self {
            Kind::Bundle => INSTALL_FAILED,
            Kind::Config => FAILED,
        }
    }

    /// The columns of `agents` (status, error) a missed deadline is written to: a
    /// bundle's agents show it as their update status; a set's keep the status they
    /// reported (the set they run is theirs to say).
    fn agent_status(self) -> Option<(&'static str, &'static str)> {
        match self {
            Kind::Bundle => Some(("update_status", "update_error")),
            Kind::Config => None,
        }
    }

    /// What an agent was to report, for the deadline's message.
    pub fn awaited(self) -> &'static str {
        match self {
            Kind::Bundle => "INSTALLED or INSTALL_FAILED",
            Kind::Config => "APPLIED or FAILED",
        }
    }
}

/// What one kind of rollout rolls out, read from its row's own columns.
pub trait Subject: Clone + std::fmt::Debug + PartialEq + Send + Sync + 'static {
    const KIND: Kind;
    /// What its log lines and refusals call a rollout of this kind.
    const NOUN: &'static str;
    /// The column that, with its group and target, keys a rollout of this kind.
    const KEYED_AT: &'static str;
    /// From the columns of [`COLUMNS`] (group, target, signed_at, version, previous).
    fn decode(r: &AnyRow) -> Result<Self, sqlx::Error>;
    /// How the log names this rollout: "rollout of 2.0.0+2".
    fn label(&self) -> String;
}

/// A bundle rollout's subject: one per served bundle, keyed by its sha256 and the signing
/// time of its signature (the same bytes signed again today are a new, deliberate rollout).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bundle {
    pub sha256: String,
    /// `signed-at` of the bundle's signature (0 when it had none).
    pub signed_at: i64,
    pub version: AgentVersion,
    pub previous: Option<AgentVersion>,
}

impl Subject for Bundle {
    const KIND: Kind = Kind::Bundle;
    const NOUN: &'static str = "rollout";
    const KEYED_AT: &'static str = "signed_at";

    fn decode(r: &AnyRow) -> Result<Self, sqlx::Error> {
        let version: Option<String> = r.try_get(4)?;
        let previous: Option<String> = r.try_get(5)?;
        Ok(Bundle {
            sha256: r.try_get(2)?,
            signed_at: r.try_get(3)?,
            version: version
                .unwrap_or_default()
                .parse()
                .map_err(|e| decode("rollouts.version", e))?,
            previous: previous
                .map(|p| p.parse().map_err(|e| decode("rollouts.previous", e)))
                .transpose()?,
        })
    }

    fn label(&self) -> String {
        format!("rollout of {}", self.version)
    }
}

/// A config rollout's subject: one per set pushed, keyed by its group, its hash and the
/// set's creation time (its rollout's `started_at`), so the same files pushed again
/// later are a new rollout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigSet {
    pub group: String,
    pub hash: String,
}

impl Subject for ConfigSet {
    const KIND: Kind = Kind::Config;
    const NOUN: &'static str = "config rollout";
    const KEYED_AT: &'static str = "started_at";

    fn decode(r: &AnyRow) -> Result<Self, sqlx::Error> {
        Ok(ConfigSet {
            group: r.try_get(1)?,
            hash: r.try_get(2)?,
        })
    }

    fn label(&self) -> String {
        format!(
            "config rollout of set {} (group {})",
            short(&self.hash),
            self.group
        )
    }
}

/// The first 12 hex digits of a hash, for logs and the page.
pub fn short(hash: &str) -> &str {
    hash.get(..12).unwrap_or(hash)
}

/// A rollout as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rollout<S> {
    pub id: i64,
    pub subject: S,
    pub state: State,
    pub reason: Option<String>,
    pub halt_cause: Option<String>,
    pub plan: Plan,
    pub opened: u32,
    pub forgiven: u64,
    pub started_at: i64,
    pub completed_at: Option<i64>,
}

pub type RolloutRow = Rollout<Bundle>;
pub type ConfigRolloutRow = Rollout<ConfigSet>;

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

/// How many failed agents a halt reason names.
const FAILURES_NAMED: i64 = 3;

fn member(kind: Kind, wave: i64, told_at: Option<i64>, outcome: Option<String>) -> Membership {
    Membership {
        wave: u32::try_from(wave).unwrap_or(0),
        told: told_at.is_some(),
        done: outcome.is_some(),
        failed: outcome.as_deref() == Some(kind.failed()),
    }
}

/// Every column of a rollout's row, the subject's first ([`Subject::decode`] reads 1-5).
const COLUMNS: &str = "SELECT id, agent_group, target, signed_at, version, previous, state, reason, halt_cause, plan, opened, forgiven, started_at, completed_at FROM rollouts WHERE rollout_kind = $1";

fn decode(what: &str, e: impl std::fmt::Display) -> sqlx::Error {
    sqlx::Error::Decode(format!("{what}: {e}").into())
}

fn rollout_row<S: Subject>(r: &AnyRow) -> Result<Rollout<S>, sqlx::Error> {
    let state: String = r.try_get(6)?;
    let plan: String = r.try_get(9)?;
    Ok(Rollout {
        id: r.try_get(0)?,
        subject: S::decode(r)?,
        state: state.parse().map_err(|e| decode("rollouts.state", e))?,
        reason: r.try_get(7)?,
        halt_cause: r.try_get(8)?,
        plan: serde_json::from_str(&plan).map_err(|e| decode("rollouts.plan", e))?,
        opened: u32::try_from(r.try_get::<i64, _>(10)?).unwrap_or(0),
        forgiven: u64::try_from(r.try_get::<i64, _>(11)?).unwrap_or(0),
        started_at: r.try_get(12)?,
        completed_at: r.try_get(13)?,
    })
}

/// The first row `query` (a select of [`COLUMNS`]) finds, as a rollout of kind `S`.
async fn first<'q, 'c, S: Subject>(
    e: impl Executor<'c, Database = Any>,
    query: sqlx::query::Query<'q, Any, sqlx::any::AnyArguments<'q>>,
) -> Result<Option<Rollout<S>>, sqlx::Error> {
    query
        .fetch_optional(e)
        .await?
        .as_ref()
        .map(rollout_row)
        .transpose()
}

/// The rollout of kind `S` started last in `group`: a bundle rollout's group is its
/// deployment (`""` for `default`), a config rollout's the set's group.
pub async fn latest<'e, S: Subject>(
    e: impl Executor<'e, Database = Any>,
    group: &str,
) -> Result<Option<Rollout<S>>, sqlx::Error> {
    let sql = format!("{COLUMNS} AND agent_group = $2 ORDER BY id DESC LIMIT 1");
    first(e, sqlx::query(&sql).bind(S::KIND.as_str()).bind(group)).await
}

/// The rollout `id`, with its row locked until the transaction ends (PostgreSQL; SQLite's
/// `BEGIN IMMEDIATE` already holds the whole database).
pub async fn lock<'e, S: Subject>(
    e: impl Executor<'e, Database = Any>,
    backend: Backend,
    id: i64,
) -> Result<Option<Rollout<S>>, sqlx::Error> {
    let lock = match backend {
        Backend::Postgres => " FOR UPDATE",
        Backend::Sqlite => "",
    };
    let sql = format!("{COLUMNS} AND id = $2{lock}");
    first(e, sqlx::query(&sql).bind(S::KIND.as_str()).bind(id)).await
}

/// The rollout `id` as it stands, without a lock: for a look that decides nothing.
pub async fn get<'e, S: Subject>(
    e: impl Executor<'e, Database = Any>,
    id: i64,
) -> Result<Option<Rollout<S>>, sqlx::Error> {
    lock(e, Backend::Sqlite, id).await
}

/// The rollout of kind `S` of `target` (a bundle's sha256, a set's hash) in `group`
/// (empty for a bundle), keyed at `at` ([`Subject::KEYED_AT`]: a bundle signature's
/// time, a set's creation).
pub async fn find<'e, S: Subject>(
    e: impl Executor<'e, Database = Any>,
    group: &str,
    target: &str,
    at: i64,
) -> Result<Option<Rollout<S>>, sqlx::Error> {
    let sql = format!(
        "{COLUMNS} AND agent_group = $2 AND target = $3 AND {} = $4",
        S::KEYED_AT
    );
    let query = sqlx::query(&sql)
        .bind(S::KIND.as_str())
        .bind(group)
        .bind(target)
        .bind(at);
    first(e, query).await
}

/// The target of the last completed bundle rollout of deployment `line` (`""` for
/// `default`): the version its agents ran before.
pub async fn last_completed_version<'e>(
    e: impl Executor<'e, Database = Any>,
    line: &str,
) -> Result<Option<AgentVersion>, sqlx::Error> {
    let row = sqlx::query(
        "SELECT version FROM rollouts WHERE rollout_kind = 'bundle' AND state = 'completed'
           AND agent_group = $1
         ORDER BY completed_at DESC, id DESC LIMIT 1",
    )
    .bind(line)
    .fetch_optional(e)
    .await?;
    row.map(|r| {
        r.get::<Option<String>, _>(0)
            .unwrap_or_default()
            .parse()
            .map_err(|e| decode("rollouts.version", e))
    })
    .transpose()
}

/// What a new rollout starts with: its subject's columns, then the engine's.
pub struct NewRollout<'a> {
    pub kind: Kind,
    /// The set's group; empty for a bundle.
    pub group: &'a str,
    /// The bundle's sha256 or the set's hash.
    pub target: &'a str,
    /// The bundle signature's time; 0 for a set.
    pub signed_at: i64,
    pub version: Option<&'a AgentVersion>,
    pub previous: Option<&'a AgentVersion>,
    pub state: State,
    pub reason: Option<&'a str>,
    pub halt_cause: Option<&'a str>,
    pub plan: &'a Plan,
    pub now: i64,
}

/// Inserts the rollout and its waves; `None` if another server (or an earlier run) made
/// it: the unique index of its kind (`rollouts_bundle_once`, `rollouts_config_once`)
/// says so.
pub async fn insert(
    tx: &mut sqlx::Transaction<'static, Any>,
    new: &NewRollout<'_>,
) -> Result<Option<i64>, sqlx::Error> {
    let plan = serde_json::to_string(new.plan).map_err(|e| decode("plan", e))?;
    let id: Option<i64> = sqlx::query(
        "INSERT INTO rollouts (rollout_kind, agent_group, target, signed_at, version, previous,
           state, reason, halt_cause, plan, opened, forgiven, started_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 0, 0, $11)
         ON CONFLICT DO NOTHING RETURNING id",
    )
    .bind(new.kind.as_str())
    .bind(new.group)
    .bind(new.target)
    .bind(new.signed_at)
    .bind(new.version.map(ToString::to_string))
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
    for (i, spec) in new.plan.waves.iter().enumerate() {
        sqlx::query("INSERT INTO rollout_waves (rollout_id, wave, spec) VALUES ($1, $2, $3)")
            .bind(id)
            .bind(i as i64 + 1)
            .bind(spec.to_string())
            .execute(&mut **tx)
            .await?;
    }
    Ok(Some(id))
}

/// An agent a bundle rollout may place, with what decides the deployment it follows.
#[derive(Debug, Clone)]
pub struct LiveAgent {
    pub id: String,
    pub group: String,
    pub version: String,
    pub platform: String,
    /// Its own labels, the server's, the built-ins (see [`crate::labels::effective`]).
    pub labels: crate::labels::Labels,
}

/// Agents heard from since `since_secs` a bundle rollout places, with what decides the
/// deployment each follows.
pub async fn live_agents<'e>(
    e: impl Executor<'e, Database = Any>,
    since_secs: i64,
) -> Result<Vec<LiveAgent>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT id, agent_group, version, platform, labels, server_labels FROM agents
         WHERE last_contact >= $1
           AND (protocol <> 'opamp' OR id IN (SELECT agent_id FROM agent_opamp WHERE accepts_packages = 1))
           AND id NOT IN (SELECT id FROM agents_revoked)
         ORDER BY id",
    )
    .bind(since_secs)
    .fetch_all(e)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let (id, group, version, platform): (String, String, String, String) =
                (r.get(0), r.get(1), r.get(2), r.get(3));
            let labels = crate::labels::of_columns(
                r.get::<Option<String>, _>(4).as_deref(),
                r.get::<Option<String>, _>(5).as_deref(),
                &platform,
                &group,
                &version,
            );
            LiveAgent {
                id,
                group,
                version,
                platform,
                labels,
            }
        })
        .collect())
}

/// An agent now follows deployment `line`: its places in the unfinished bundle rollouts
/// of other deployments, where it was not done, are given up (a rollout it left must not
/// wait for it, nor time it out as a failure).
pub async fn leave_other_lines<'e>(
    e: impl Executor<'e, Database = Any>,
    agent: &str,
    line: &str,
) -> Result<u64, sqlx::Error> {
    let done = sqlx::query(
        "DELETE FROM rollout_agents WHERE agent_id = $1 AND outcome IS NULL
           AND rollout_id IN (SELECT id FROM rollouts WHERE rollout_kind = 'bundle'
             AND agent_group <> $2 AND state <> 'completed')",
    )
    .bind(agent)
    .bind(line)
    .execute(e)
    .await?;
    Ok(done.rows_affected())
}

/// Places agents in their waves; `done` ones (already on the target) count as made it.
pub async fn insert_members(
    tx: &mut sqlx::Transaction<'static, Any>,
    kind: Kind,
    rollout: i64,
    members: &[(String, u32, bool)],
    now: i64,
) -> Result<(), sqlx::Error> {
    // Several rows per statement: a 10,000-agent fleet is placed in 50 round trips.
    for chunk in members.chunks(200) {
        let mut sql = String::from(
            "INSERT INTO rollout_agents (rollout_id, agent_id, wave, outcome, outcome_at) VALUES ",
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
                .bind(done.then_some(kind.done()))
                .bind(done.then_some(now));
        }
        q.execute(&mut **tx).await?;
    }
    Ok(())
}

pub async fn membership<'e>(
    e: impl Executor<'e, Database = Any>,
    kind: Kind,
    rollout: i64,
    agent: &str,
) -> Result<Option<Membership>, sqlx::Error> {
    let row = sqlx::query(
        "SELECT wave, told_at, outcome FROM rollout_agents WHERE rollout_id = $1 AND agent_id = $2",
    )
    .bind(rollout)
    .bind(agent)
    .fetch_optional(e)
    .await?;
    Ok(row.map(|r| member(kind, r.get(0), r.get(1), r.get(2))))
}

/// Places an agent first seen during the rollout; the first server to do so wins.
pub async fn join<'e>(
    e: impl Executor<'e, Database = Any> + Copy,
    kind: Kind,
    rollout: i64,
    agent: &str,
    wave: u32,
    done: bool,
    now: i64,
) -> Result<Membership, sqlx::Error> {
    sqlx::query(
        "INSERT INTO rollout_agents (rollout_id, agent_id, wave, outcome, outcome_at) VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (rollout_id, agent_id) DO NOTHING",
    )
    .bind(rollout)
    .bind(agent)
    .bind(i64::from(wave))
    .bind(done.then_some(kind.done()))
    .bind(done.then_some(now))
    .execute(e)
    .await?;
    Ok(membership(e, kind, rollout, agent)
        .await?
        .unwrap_or(Membership {
            wave,
            told: false,
            done,
            failed: false,
        }))
}

/// Forgets the update status of the agents running `version` when it speaks of moving
/// to another release (retrying it, held off by locks, waiting for a window, installing
/// it): run when `version` becomes the target, which they need not move to.
pub async fn clear_pending_status<'e>(
    e: impl Executor<'e, Database = Any>,
    version: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE agents SET update_status = NULL, update_error = NULL
         WHERE version = $1 AND update_status IN ('RETRYING', 'DEFERRED', 'WAITING_WINDOW', 'INSTALLING')",
    )
    .bind(version)
    .execute(e)
    .await?;
    Ok(())
}

/// Agents per statement of [`set_outcomes`] and [`mark_told_many`].
const OUTCOME_CHUNK: usize = 500;

/// What agents reported (or, for the kind's success, showed by running the target),
/// a statement per [`OUTCOME_CHUNK`]: an agent's outcome changes (and takes the time
/// and error given) unless it is that outcome already. An agent at most once in `rows`.
pub async fn set_outcomes(
    pool: &sqlx::AnyPool,
    backend: Backend,
    rollout: i64,
    rows: &[Outcome<'_>],
) -> Result<(), FleetError> {
    // One order of rows in every statement (see `Db::record_reports`).
    let mut rows = rows.to_vec();
    rows.sort_by_key(|o| o.agent);
    for chunk in rows.chunks(OUTCOME_CHUNK) {
        let sql = format!(
            "UPDATE rollout_agents SET outcome = v.column2, outcome_at = v.column3, error = v.column4
             FROM (VALUES {}) AS v
             WHERE rollout_agents.rollout_id = {rollout} AND rollout_agents.agent_id = v.column1
               AND (rollout_agents.outcome IS NULL OR rollout_agents.outcome <> v.column2)",
            crate::db::value_rows(backend, chunk.len(), &["$"; 4])
        );
        let sql = &sql;
        retrying_lost_races(|| async {
            let mut query = sqlx::query(sql).persistent(chunk.len() == 1);
            for o in chunk {
                query = query.bind(o.agent).bind(o.outcome).bind(o.at).bind(o.error);
            }
            Ok(query.execute(pool).await?)
        })
        .await?;
    }
    Ok(())
}

/// One agent's outcome in a rollout, as [`set_outcomes`] writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome<'a> {
    pub agent: &'a str,
    pub outcome: &'a str,
    pub error: Option<&'a str>,
    /// Unix milliseconds.
    pub at: i64,
}

/// [`mark_told`] for many agents of one rollout (each with the time it was told), a
/// statement per [`OUTCOME_CHUNK`]; an agent at most once.
pub async fn mark_told_many(
    pool: &sqlx::AnyPool,
    backend: Backend,
    rollout: i64,
    told: &[(&str, i64)],
) -> Result<(), FleetError> {
    let mut told = told.to_vec();
    told.sort_unstable();
    for chunk in told.chunks(OUTCOME_CHUNK) {
        let sql = format!(
            "UPDATE rollout_agents SET told_at = v.column2 FROM (VALUES {}) AS v
             WHERE rollout_agents.rollout_id = {rollout} AND rollout_agents.agent_id = v.column1
               AND rollout_agents.told_at IS NULL",
            crate::db::value_rows(backend, chunk.len(), &["$"; 2])
        );
        let sql = &sql;
        retrying_lost_races(|| async {
            let mut query = sqlx::query(sql).persistent(false);
            for (agent, at) in chunk {
                query = query.bind(*agent).bind(*at);
            }
            Ok(query.execute(pool).await?)
        })
        .await?;
    }
    Ok(())
}

/// Records in the agent's own row the update status the server decided for it
/// ([`NO_BUNDLE`]), unless it says so already.
pub async fn set_agent_update_status<'e>(
    e: impl Executor<'e, Database = Any>,
    agent: &str,
    status: &str,
    error: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE agents SET update_status = $2, update_error = $3
         WHERE id = $1 AND (update_status IS NULL OR update_status <> $2)",
    )
    .bind(agent)
    .bind(status)
    .bind(error)
    .execute(e)
    .await?;
    Ok(())
}

/// The agents of rollout `$1` told (or, never reached, whose wave opened) at `$2` or
/// before, without an outcome: those past the agent deadline when `$2` is its cutoff.
const PAST_DEADLINE: &str = "rollout_id = $1 AND outcome IS NULL AND (
       (told_at IS NOT NULL AND told_at <= $2)
       OR (told_at IS NULL AND wave IN (SELECT wave FROM rollout_waves
            WHERE rollout_id = $1 AND opened_at IS NOT NULL AND opened_at <= $2)))";

fn deadline_cutoff(plan: &Plan, now: i64) -> i64 {
    now.saturating_sub(plan.agent_deadline.saturating_mul(1000) as i64)
}

/// Whether [`time_out`] would time any agent out now.
pub async fn overdue(
    conn: &mut AnyConnection,
    rollout: i64,
    plan: &Plan,
    now: i64,
) -> Result<bool, sqlx::Error> {
    let row = sqlx::query(&format!(
        "SELECT 1 FROM rollout_agents WHERE {PAST_DEADLINE} LIMIT 1"
    ))
    .bind(rollout)
    .bind(deadline_cutoff(plan, now))
    .fetch_optional(conn)
    .await?;
    Ok(row.is_some())
}

/// Marks `TIMED_OUT` (at `now`) every agent of an open wave that was told (or, never
/// reached, whose wave opened) `agent-deadline` or more before `heard` without an
/// outcome; returns their ids. `heard`: the time up to which the fleet has written every
/// report it took (`now` unless a server still holds some queued).
pub async fn time_out(
    tx: &mut sqlx::Transaction<'static, Any>,
    kind: Kind,
    rollout: i64,
    plan: &Plan,
    heard: i64,
    now: i64,
) -> Result<Vec<String>, sqlx::Error> {
    let ids: Vec<String> = sqlx::query(&format!(
        "UPDATE rollout_agents SET outcome = 'TIMED_OUT', outcome_at = $3,
           error = 'no report within the agent deadline'
         WHERE {PAST_DEADLINE}
         RETURNING agent_id"
    ))
    .bind(rollout)
    .bind(deadline_cutoff(plan, heard))
    .bind(now)
    .fetch_all(&mut **tx)
    .await?
    .into_iter()
    .map(|r| r.get(0))
    .collect();
    let Some((status, error)) = kind.agent_status() else {
        return Ok(ids);
    };
    let detail = format!(
        "no {} within the agent deadline ({} s)",
        kind.awaited(),
        plan.agent_deadline
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
pub async fn progress<S: Subject>(
    tx: &mut sqlx::Transaction<'static, Any>,
    row: &Rollout<S>,
) -> Result<Progress, sqlx::Error> {
    let waves = wave_status(tx, row).await?;
    // An agent waiting for its maintenance window has its `told_at` at the window's
    // opening: it is not told before then.
    let told: i64 = sqlx::query(
        "SELECT COUNT(*) FROM rollout_agents WHERE rollout_id = $1 AND told_at IS NOT NULL AND told_at <= $2",
    )
    .bind(row.id)
    .bind(crate::db::now_ms())
    .fetch_one(&mut **tx)
    .await?
    .get(0);
    let failures_seen = sqlx::query(
        "SELECT ra.agent_id, COALESCE(a.name, ''), ra.outcome, COALESCE(ra.error, '')
         FROM rollout_agents ra LEFT JOIN agents a ON a.id = ra.agent_id
         WHERE ra.rollout_id = $1 AND ra.outcome IN ($3, 'TIMED_OUT')
         ORDER BY ra.outcome_at LIMIT $2",
    )
    .bind(row.id)
    .bind(FAILURES_NAMED)
    .bind(S::KIND.failed())
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
        let error = agent_protocol::shown::cut_at_word(&error, 160);
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

/// Each wave's counts and times, in order; `installed` counts the kind's success.
pub async fn wave_status<S: Subject>(
    conn: &mut AnyConnection,
    row: &Rollout<S>,
) -> Result<Vec<WaveStatus>, sqlx::Error> {
    let kind = S::KIND;
    let mut waves = vec![WaveStatus::default(); row.plan.waves.len()];
    for r in
        sqlx::query("SELECT wave, opened_at, completed_at FROM rollout_waves WHERE rollout_id = $1")
            .bind(row.id)
            .fetch_all(&mut *conn)
            .await?
    {
        if let Some(w) = slot(&mut waves, r.get(0)) {
            w.opened_at = r.get(1);
            w.completed_at = r.get(2);
        }
    }
    for r in sqlx::query(
        "SELECT wave, COALESCE(outcome, ''), COUNT(*) FROM rollout_agents WHERE rollout_id = $1 GROUP BY wave, COALESCE(outcome, '')",
    )
    .bind(row.id)
    .fetch_all(&mut *conn)
    .await?
    {
        let outcome: String = r.get(1);
        let n = u64::try_from(r.get::<i64, _>(2)).unwrap_or(0);
        if let Some(w) = slot(&mut waves, r.get(0)) {
            w.agents += n;
            match outcome.as_str() {
                o if o == kind.done() => w.installed += n,
                o if o == kind.failed() => w.failed += n,
                TIMED_OUT => w.timed_out += n,
                NO_BUNDLE => w.no_bundle += n,
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
pub async fn event<'e>(
    e: impl Executor<'e, Database = Any>,
    rollout: i64,
    kind: &str,
    wave: u32,
    detail: &str,
    now: i64,
    server: &str,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "INSERT INTO rollout_events (rollout_id, kind, wave, at, detail, server) VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT DO NOTHING",
    )
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
pub async fn apply<S: Subject>(
    tx: &mut sqlx::Transaction<'static, Any>,
    row: &Rollout<S>,
    decision: &Decision,
    now: i64,
    server: &str,
) -> Result<bool, sqlx::Error> {
    let id = row.id;
    match decision {
        Decision::OpenWave(w) => {
            if !event(&mut **tx, id, "wave_opened", *w, "", now, server).await? {
                return Ok(false);
            }
            sqlx::query(
                "UPDATE rollouts SET opened = $2, state = 'running' WHERE id = $1 AND opened = $3",
            )
            .bind(id)
            .bind(i64::from(*w))
            .bind(i64::from(w.saturating_sub(1)))
            .execute(&mut **tx)
            .await?;
            sqlx::query("UPDATE rollout_waves SET opened_at = $3 WHERE rollout_id = $1 AND wave = $2 AND opened_at IS NULL")
                .bind(id)
                .bind(i64::from(*w))
                .bind(now)
                .execute(&mut **tx)
                .await?;
        }
        Decision::CompleteWave(w) => {
            if !event(&mut **tx, id, "wave_completed", *w, "", now, server).await? {
                return Ok(false);
            }
            sqlx::query("UPDATE rollout_waves SET completed_at = $3 WHERE rollout_id = $1 AND wave = $2 AND completed_at IS NULL")
                .bind(id)
                .bind(i64::from(*w))
                .bind(now)
                .execute(&mut **tx)
                .await?;
        }
        Decision::Soak(w) => {
            event(&mut **tx, id, "soaking", *w, "", now, server).await?;
            set_state(tx, id, State::Soaking, None, None).await?;
        }
        Decision::Halt { cause, reason } => {
            event(&mut **tx, id, "halted", row.opened, reason, now, server).await?;
            set_state(tx, id, State::Halted, Some(reason), Some(cause.as_str())).await?;
            // The server's own decision, in the audit log with the halt itself (an
            // operator's halt is recorded by the edge that took it, under their name).
            if *cause != HaltCause::Operator {
                let who = format!("server:{server}");
                let action = match S::KIND {
                    Kind::Bundle => "rollout.halt",
                    Kind::Config => "config.halt",
                };
                crate::audit::record_in(
                    tx,
                    &crate::audit::Change {
                        who: &who,
                        address: "",
                        action,
                        outcome: crate::audit::Outcome::Done,
                        details: serde_json::json!({
                            "rollout": id,
                            "what": row.subject.label(),
                            "cause": cause.as_str(),
                            "reason": reason,
                        }),
                    },
                )
                .await?;
            }
        }
        Decision::Complete => {
            if !event(&mut **tx, id, "completed", 0, "", now, server).await? {
                return Ok(false);
            }
            set_state(tx, id, State::Completed, None, None).await?;
            sqlx::query("UPDATE rollouts SET completed_at = $2 WHERE id = $1")
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
    id: i64,
    state: State,
    reason: Option<&str>,
    cause: Option<&str>,
) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE rollouts SET state = $2, reason = $3, halt_cause = $4 WHERE id = $1")
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
    id: i64,
    failures: u64,
) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE rollouts SET forgiven = $2 WHERE id = $1")
        .bind(id)
        .bind(i64::try_from(failures).unwrap_or(i64::MAX))
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Every agent's place in a rollout, to answer from memory.
pub async fn memberships<'e>(
    e: impl Executor<'e, Database = Any>,
    kind: Kind,
    rollout: i64,
) -> Result<HashMap<String, Membership>, sqlx::Error> {
    Ok(sqlx::query(
        "SELECT agent_id, wave, told_at, outcome FROM rollout_agents WHERE rollout_id = $1",
    )
    .bind(rollout)
    .fetch_all(e)
    .await?
    .into_iter()
    .map(|r| {
        (
            r.get::<String, _>(0),
            member(kind, r.get(1), r.get(2), r.get(3)),
        )
    })
    .collect())
}

/// The agents of the open waves (1 to `opened`) of a rollout that have no outcome yet,
/// with the platform each last said.
pub async fn undecided_platforms<'e>(
    e: impl Executor<'e, Database = Any>,
    rollout: i64,
    opened: u32,
) -> Result<Vec<(String, String)>, sqlx::Error> {
    Ok(sqlx::query(
        "SELECT ra.agent_id, COALESCE(a.platform, '') FROM rollout_agents ra
         JOIN agents a ON a.id = ra.agent_id
         WHERE ra.rollout_id = $1 AND ra.outcome IS NULL AND ra.wave <= $2",
    )
    .bind(rollout)
    .bind(i64::from(opened))
    .fetch_all(e)
    .await?
    .into_iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect())
}

/// Every agent's wave and `told_at` in a rollout, for `/admin/agents`.
pub async fn members<'e>(
    e: impl Executor<'e, Database = Any>,
    rollout: i64,
) -> Result<HashMap<String, (u32, Option<i64>)>, sqlx::Error> {
    Ok(
        sqlx::query("SELECT agent_id, wave, told_at FROM rollout_agents WHERE rollout_id = $1")
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
            .collect(),
    )
}

/// The transitions of a rollout, oldest first: (kind, wave, at, detail, server).
pub async fn events<'e>(
    e: impl Executor<'e, Database = Any>,
    rollout: i64,
) -> Result<Vec<(String, u32, i64, String, String)>, sqlx::Error> {
    Ok(sqlx::query(
        "SELECT kind, wave, at, COALESCE(detail, ''), server FROM rollout_events WHERE rollout_id = $1 ORDER BY id",
    )
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn outcomes_and_told_marks_of_many_agents_are_written_in_one_go() {
        let home = tempfile::tempdir().unwrap();
        let db = crate::db::Db::open("", home.path(), 1).await.unwrap();
        let pool = db.pool();
        for (agent, told, outcome) in [
            ("a", None, None),
            ("b", Some(5), None),
            ("c", None, Some(INSTALLED)),
        ] {
            sqlx::query(
                "INSERT INTO rollout_agents (rollout_id, agent_id, wave, told_at, outcome, outcome_at)
                 VALUES (7, $1, 0, $2, $3, $4)",
            )
            .bind(agent)
            .bind(told)
            .bind(outcome)
            .bind(outcome.map(|_| 1_i64))
            .execute(pool)
            .await
            .unwrap();
        }
        mark_told_many(pool, db.backend(), 7, &[("a", 10), ("b", 10), ("x", 10)])
            .await
            .unwrap();
        let outcome = |agent, outcome, error| Outcome {
            agent,
            outcome,
            error,
            at: 20,
        };
        set_outcomes(
            pool,
            db.backend(),
            7,
            &[
                outcome("a", INSTALL_FAILED, Some("bad signature")),
                outcome("c", INSTALLED, None),
            ],
        )
        .await
        .unwrap();
        type Row = (
            String,
            Option<i64>,
            Option<String>,
            Option<i64>,
            Option<String>,
        );
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT agent_id, told_at, outcome, outcome_at, error FROM rollout_agents
                 WHERE rollout_id = 7 ORDER BY agent_id",
        )
        .fetch_all(pool)
        .await
        .unwrap();
        let failed = (
            Some(INSTALL_FAILED.into()),
            Some(20),
            Some("bad signature".into()),
        );
        assert_eq!(
            rows,
            vec![
                ("a".into(), Some(10), failed.0, failed.1, failed.2),
                // Told before: the first 409 counts.
                ("b".into(), Some(5), None, None, None),
                // INSTALLED already: it keeps its time.
                ("c".into(), None, Some(INSTALLED.into()), Some(1), None),
            ]
        );
    }

    #[test]
    fn each_kind_names_its_outcomes_and_its_rollouts() {
        assert_eq!(
            (Kind::Bundle.done(), Kind::Bundle.failed()),
            (INSTALLED, INSTALL_FAILED)
        );
        assert_eq!(
            (Kind::Config.done(), Kind::Config.failed()),
            (APPLIED, FAILED)
        );
        // Only a bundle's missed deadline shows in the agent's own row.
        assert_eq!(
            Kind::Bundle.agent_status(),
            Some(("update_status", "update_error"))
        );
        assert_eq!(Kind::Config.agent_status(), None);
        let set = ConfigSet {
            group: "edge".into(),
            hash: "0123456789abcdef".into(),
        };
        assert_eq!(
            set.label(),
            "config rollout of set 0123456789ab (group edge)"
        );
        assert_eq!(
            member(Kind::Config, 2, Some(1), Some(FAILED.into())),
            Membership {
                wave: 2,
                told: true,
                done: true,
                failed: true
            }
        );
        // A failure is the kind's own: FAILED is not a bundle's.
        assert!(!member(Kind::Bundle, 1, None, Some(FAILED.into())).failed);
        assert!(member(Kind::Bundle, 1, None, Some(INSTALL_FAILED.into())).failed);
    }
}
