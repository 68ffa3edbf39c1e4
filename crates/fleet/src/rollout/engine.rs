//! The rollout engine, written once for every kind of rollout: it starts a rollout
//! (its row, waves, members and `started` event in the caller's write transaction),
//! decides each rollout's next steps with [`step::next`] and applies them in one write
//! transaction, times agents out, applies an operator's halt, advance and resume,
//! places agents that join late, records what they were told and what came of it, and
//! keeps every agent's place in memory so that answering costs no query.
//!
//! A kind ([`Subject`]: a bundle release, a configuration set) says only what differs:
//! its columns, its outcomes, what its log calls it. What a rollout offers an agent (a
//! version directive, a set's files) stays with the kind's front ([`super::Rollouts`],
//! [`crate::config::Configs`]), which calls this.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::json;

use crate::db::{Db, now_ms};
use crate::error::FleetError;
use crate::rollout::Refusal;
use crate::rollout::order::{self, Member};
use crate::rollout::plan::Plan;
use crate::rollout::step::{self, Decision, HaltCause, Progress, State, WaveStatus};
use crate::rollout::store::{self, Membership, NewRollout, Rollout, Subject};
use crate::settings;
use fleet_store::group::Group;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Unix milliseconds as the seconds the admin API shows.
pub fn secs(ms: i64) -> f64 {
    ms as f64 / 1000.0
}

/// An agent a new rollout places: its id, its group, and whether it runs the target.
pub struct Candidate {
    pub id: String,
    pub group: String,
    pub on_target: bool,
}

/// The rollouts of one kind.
pub struct Engine<S> {
    db: Db,
    server: String,
    /// Agents' places per rollout id, read once per rollout and kept. A wave never
    /// changes once given; `told` and `done` only become true.
    members: Mutex<HashMap<i64, HashMap<String, Membership>>>,
    /// One decision at a time from this process (the database orders the servers).
    deciding: tokio::sync::Mutex<()>,
    /// Halts this server decided, by cause.
    halts: [AtomicU64; 3],
    /// Woken by an outcome, so the decision that may follow is not a tick away.
    wake: tokio::sync::Notify,
    /// First `409`s (rollout, agent, when) written together (see [`crate::group`]): a
    /// window's opening tells its whole fleet in a second.
    told: Group<(i64, String, i64)>,
    kind: PhantomData<fn() -> S>,
}

impl<S: Subject> Engine<S> {
    pub fn new(db: Db, server: String) -> Self {
        Self {
            db,
            server,
            members: Mutex::new(HashMap::new()),
            deciding: tokio::sync::Mutex::new(()),
            halts: Default::default(),
            wake: tokio::sync::Notify::new(),
            told: Group::default(),
            kind: PhantomData,
        }
    }

    pub fn db(&self) -> &Db {
        &self.db
    }

    pub fn server(&self) -> &str {
        &self.server
    }

    pub fn halts(&self, cause: HaltCause) -> u64 {
        self.halts[cause as usize].load(Ordering::Relaxed)
    }

    pub(crate) fn count_halt(&self, cause: HaltCause) {
        self.halts[cause as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Resolves when an outcome may have changed what happens next.
    pub async fn woken(&self) {
        self.wake.notified().await;
    }

    /// Held while a decision (or a start) is made, so this process makes one at a time.
    pub async fn deciding(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.deciding.lock().await
    }

    /// Inserts a new rollout in `tx` (unless another server did), places `candidates`
    /// in their waves (in the order [`order::assign`] gives them for `order_key`), and
    /// records its `started` event with `detail(placed)`. Returns its id, or `None` when
    /// it existed already.
    pub async fn start(
        &self,
        tx: &mut sqlx::Transaction<'static, sqlx::Any>,
        new: &NewRollout<'_>,
        order_key: &str,
        candidates: &[Candidate],
        detail: impl FnOnce(usize) -> String,
    ) -> Result<Option<(i64, String)>, FleetError> {
        let Some(id) = store::insert(tx, new).await? else {
            return Ok(None);
        };
        let members: Vec<Member> = candidates
            .iter()
            .map(|c| Member {
                id: c.id.clone(),
                group: c.group.clone(),
            })
            .collect();
        let waves = order::assign(new.plan, order_key, &members);
        let rows: Vec<(String, u32, bool)> = candidates
            .iter()
            .zip(&waves)
            .map(|(c, wave)| (c.id.clone(), *wave, c.on_target))
            .collect();
        store::insert_members(tx, S::KIND, id, &rows, new.now).await?;
        let detail = detail(rows.len());
        store::event(&mut **tx, id, "started", 0, &detail, new.now, &self.server).await?;
        Ok(Some((id, detail)))
    }

    /// Times out the agents of rollout `id` past their deadline and applies every
    /// transition that is due, in one write transaction; logs each once, after it is
    /// committed. True if anything changed (or the rollout ended meanwhile).
    pub async fn decide(&self, id: i64) -> Result<bool, FleetError> {
        let _one = self.deciding.lock().await;
        let now = now_ms();
        let heard = self.heard_until(now).await?;
        if !self.due(id, now, heard).await? {
            return Ok(false);
        }
        let mut tx = self.db.begin_write().await?;
        let Some(mut row) = store::lock::<S>(&mut *tx, self.db.backend(), id).await? else {
            tx.commit().await?;
            return Ok(false);
        };
        if matches!(row.state, State::Halted | State::Completed) {
            tx.commit().await?;
            return Ok(true);
        }
        let timed_out = store::time_out(&mut tx, S::KIND, row.id, &row.plan, heard, now).await?;
        let mut decided = Vec::new();
        // Each wave opens and completes at most once, plus a soak, a halt, the end.
        let most = 3 * row.plan.waves.len() + 3;
        while decided.len() < most {
            let progress = store::progress(&mut tx, &row).await?;
            let Some(decision) = step::next(&row.plan, &progress, now) else {
                break;
            };
            if !store::apply(&mut tx, &row, &decision, now, &self.server).await? {
                break;
            }
            decided.push((decision, progress));
            match store::lock::<S>(&mut *tx, self.db.backend(), row.id).await? {
                Some(r) => row = r,
                None => break,
            }
        }
        tx.commit().await?;
        for agent in &timed_out {
            tracing::warn!(
                rollout = row.id,
                kind = S::KIND.as_str(),
                agent = %agent,
                "{}: the agent sent no {} within the agent deadline ({} s after it was told): TIMED_OUT",
                row.subject.label(),
                S::KIND.awaited(),
                row.plan.agent_deadline
            );
        }
        for (decision, progress) in &decided {
            self.log_decision(&row, decision, progress);
        }
        Ok(!decided.is_empty() || !timed_out.is_empty())
    }

    /// The time agent deadlines are judged at: now, or the arrival of the oldest report
    /// a server of the fleet still holds queued (see [`settings::heard_until`]). Read
    /// before any transaction is begun (SQLite's pool may have one connection).
    async fn heard_until(&self, now: i64) -> Result<i64, FleetError> {
        let said = self
            .db
            .settings_with_prefix(settings::SPOOL_OLDEST_PREFIX)
            .await?;
        Ok(settings::heard_until(now, &said))
    }

    /// Whether anything is due in rollout `id`: an agent past its deadline or a
    /// transition. Most looks (one per outcome) find nothing; this one reads without the
    /// write lock, so on SQLite the reports themselves are not held up behind it. What
    /// it finds due is read again under the lock before anything is written.
    async fn due(&self, id: i64, now: i64, heard: i64) -> Result<bool, FleetError> {
        let mut tx = self.db.pool().begin().await?;
        let due = match store::get::<S>(&mut *tx, id).await? {
            None => false,
            Some(row) if matches!(row.state, State::Halted | State::Completed) => false,
            Some(row) => {
                store::overdue(&mut tx, row.id, &row.plan, heard).await? || {
                    let progress = store::progress(&mut tx, &row).await?;
                    step::next(&row.plan, &progress, now).is_some()
                }
            }
        };
        tx.rollback().await?;
        Ok(due)
    }

    fn log_decision(&self, row: &Rollout<S>, decision: &Decision, progress: &Progress) {
        let what = row.subject.label();
        let kind = S::KIND.as_str();
        match decision {
            Decision::OpenWave(w) => tracing::info!(
                rollout = row.id,
                kind,
                "{what}: wave {w} of {} opened ({})",
                row.plan.wave_count(),
                row.plan
                    .spec(*w)
                    .map(ToString::to_string)
                    .unwrap_or_default()
            ),
            Decision::CompleteWave(w) => {
                let s = progress
                    .waves
                    .get((*w as usize).saturating_sub(1))
                    .cloned()
                    .unwrap_or_default();
                tracing::info!(
                    rollout = row.id,
                    kind,
                    "{what}: wave {w} completed ({} agents: {} {}, {} failed, {} timed out)",
                    s.agents,
                    s.installed,
                    S::KIND.done(),
                    s.failed,
                    s.timed_out
                );
            }
            Decision::Soak(w) => tracing::info!(
                rollout = row.id,
                kind,
                "{what}: wave {w} soaks for {} s before the next opens",
                row.plan.wave_wait
            ),
            Decision::Halt { cause, reason } => {
                self.count_halt(*cause);
                tracing::warn!(rollout = row.id, kind, "{what} halted: {reason}");
            }
            Decision::Complete => {
                tracing::info!(
                    rollout = row.id,
                    kind,
                    "{what} completed: every wave is done"
                )
            }
        }
    }

    /// An operator's halt of a rollout in `state`, for `why` (pure).
    pub fn halt_decision(state: State, why: Option<&str>) -> Result<Decision, Refusal> {
        let noun = S::NOUN;
        match state {
            State::Running | State::Soaking => Ok(Decision::Halt {
                cause: HaltCause::Operator,
                reason: match why {
                    Some(w) if !w.trim().is_empty() => {
                        format!("halted by an operator: {}", w.trim())
                    }
                    _ => "halted by an operator".to_owned(),
                },
            }),
            State::Halted => Err(Refusal(format!("the {noun} is halted already"))),
            State::Completed => Err(Refusal(format!("the {noun} is completed; nothing to halt"))),
        }
    }

    /// Applies an operator's decision to rollout `id` (`missing`: the refusal when there
    /// is no such rollout). The caller reads and decides again afterwards.
    pub async fn operator(
        &self,
        id: i64,
        missing: &str,
        choose: impl FnOnce(&Rollout<S>, &Progress) -> Result<Decision, Refusal>,
    ) -> Result<Result<(), Refusal>, FleetError> {
        let _one = self.deciding.lock().await;
        let mut tx = self.db.begin_write().await?;
        let Some(row) = store::lock::<S>(&mut *tx, self.db.backend(), id).await? else {
            return Ok(Err(Refusal(missing.to_owned())));
        };
        let progress = store::progress(&mut tx, &row).await?;
        let result = match choose(&row, &progress) {
            Ok(decision) => {
                store::apply(&mut tx, &row, &decision, now_ms(), &self.server).await?;
                Ok(decision)
            }
            Err(refusal) => Err(refusal),
        };
        tx.commit().await?;
        Ok(result.map(|decision| self.log_decision(&row, &decision, &progress)))
    }

    /// An operator's resume of the halted rollout `id`: it goes on, and the failures
    /// seen so far are let go (only later ones count against `max-failures`). The caller
    /// reads and decides again afterwards.
    pub async fn resume(&self, id: i64, missing: &str) -> Result<Result<(), Refusal>, FleetError> {
        let _one = self.deciding.lock().await;
        let mut tx = self.db.begin_write().await?;
        let row = store::lock::<S>(&mut *tx, self.db.backend(), id).await?;
        let result = match row {
            Some(row) if row.state == State::Halted => {
                let progress = store::progress(&mut tx, &row).await?;
                store::forgive(&mut tx, row.id, progress.failures()).await?;
                store::set_state(&mut tx, row.id, State::Running, None, None).await?;
                store::event(
                    &mut *tx,
                    row.id,
                    "resumed",
                    row.opened,
                    "",
                    now_ms(),
                    &self.server,
                )
                .await?;
                tracing::info!(
                    rollout = row.id,
                    kind = S::KIND.as_str(),
                    "{} resumed by an operator ({} failures let go)",
                    row.subject.label(),
                    progress.failures()
                );
                Ok(())
            }
            Some(_) => Err(Refusal(format!("the {} is not halted", S::NOUN))),
            None => Err(Refusal(missing.to_owned())),
        };
        tx.commit().await?;
        Ok(result)
    }

    /// Reads every agent's place in rollout `id` once (later ones are read and kept one by
    /// one), and forgets the rollouts not in `live`.
    pub async fn keep(&self, live: &[i64]) -> Result<(), FleetError> {
        for id in live {
            if lock(&self.members).contains_key(id) {
                continue;
            }
            let placed = store::memberships(self.db.pool(), S::KIND, *id).await?;
            lock(&self.members).entry(*id).or_insert(placed);
        }
        lock(&self.members).retain(|id, _| live.contains(id));
        Ok(())
    }

    /// The agent's place in rollout `rollout` as this server last knew it, without a
    /// query.
    pub fn known(&self, rollout: i64, agent: &str) -> Option<Membership> {
        lock(&self.members)
            .get(&rollout)
            .and_then(|members| members.get(agent))
            .copied()
    }

    /// The agent's place in `row`, placing it in a wave (`join_wave` of its group) the
    /// first time this rollout sees it; `on_target` agents are placed as made it.
    pub async fn membership(
        &self,
        row: &Rollout<S>,
        agent: &str,
        group: &str,
        on_target: bool,
    ) -> Result<Membership, FleetError> {
        if let Some(m) = self.placed(row, agent).await? {
            return Ok(m);
        }
        let wave = row.plan.join_wave(row.opened, group);
        let member = store::join(
            self.db.pool(),
            S::KIND,
            row.id,
            agent,
            wave,
            on_target,
            now_ms(),
        )
        .await?;
        if let Some(members) = lock(&self.members).get_mut(&row.id) {
            members.insert(agent.to_owned(), member);
        }
        Ok(member)
    }

    /// The agent's place in rollout `row`, if the rollout placed it: unlike
    /// [`Engine::membership`], an agent it never placed is not placed by asking.
    pub async fn placed(
        &self,
        row: &Rollout<S>,
        agent: &str,
    ) -> Result<Option<Membership>, FleetError> {
        if let Some(m) = self.known(row.id, agent) {
            return Ok(Some(m));
        }
        let found = store::membership(self.db.pool(), S::KIND, row.id, agent).await?;
        if let Some(m) = found
            && let Some(members) = lock(&self.members).get_mut(&row.id)
        {
            members.insert(agent.to_owned(), m);
        }
        Ok(found)
    }

    /// The agent's place read again from the database (another server may have told it
    /// or heard its outcome since this one looked), and kept.
    pub async fn reread(
        &self,
        rollout: i64,
        agent: &str,
    ) -> Result<Option<Membership>, FleetError> {
        let fresh = store::membership(self.db.pool(), S::KIND, rollout, agent).await?;
        if let Some(fresh) = fresh {
            self.remember(rollout, agent, |m| *m = fresh);
        }
        Ok(fresh)
    }

    pub fn remember(&self, rollout: i64, agent: &str, change: impl FnOnce(&mut Membership)) {
        if let Some(m) = lock(&self.members)
            .get_mut(&rollout)
            .and_then(|members| members.get_mut(agent))
        {
            change(m);
        }
    }

    /// Records that `agent` was told (its deadline starts).
    pub async fn mark_told(&self, rollout: i64, agent: &str, at: i64) -> Result<(), FleetError> {
        let (pool, backend) = (self.db.pool(), self.db.backend());
        self.told
            .write((rollout, agent.to_owned(), at), |told| async move {
                let mut by_rollout: HashMap<i64, Vec<(&str, i64)>> = HashMap::new();
                for (rollout, agent, at) in &told {
                    by_rollout.entry(*rollout).or_default().push((agent, *at));
                }
                for (rollout, agents) in by_rollout {
                    store::mark_told_many(pool, backend, rollout, &agents).await?;
                }
                Ok(())
            })
            .await?;
        self.remember(rollout, agent, |m| m.told = true);
        Ok(())
    }

    /// Records the agent's outcome in rollout `id` (`outcome` one of the kind's), received
    /// at `at`, and wakes the decision that may follow.
    pub async fn outcome(
        &self,
        rollout: i64,
        agent: &str,
        outcome: &str,
        error: Option<&str>,
        at: i64,
    ) -> Result<(), FleetError> {
        let one = store::Outcome {
            agent,
            outcome,
            error,
            at,
        };
        self.outcomes(rollout, &[one]).await
    }

    /// [`Engine::outcome`] for many agents at once (each at most once).
    pub async fn outcomes(
        &self,
        rollout: i64,
        outcomes: &[store::Outcome<'_>],
    ) -> Result<(), FleetError> {
        if outcomes.is_empty() {
            return Ok(());
        }
        store::set_outcomes(self.db.pool(), self.db.backend(), rollout, outcomes).await?;
        for o in outcomes {
            let failed = o.outcome == S::KIND.failed();
            self.remember(rollout, o.agent, |m| {
                m.done = true;
                m.failed = failed;
            });
        }
        self.wake.notify_one();
        Ok(())
    }

    /// Each wave's counts of `row`.
    pub async fn waves(&self, row: &Rollout<S>) -> Result<Vec<WaveStatus>, FleetError> {
        let mut conn = self.db.pool().acquire().await?;
        Ok(store::wave_status(&mut conn, row).await?)
    }

    /// What the admin API shows of every rollout: its state, waves and events (the
    /// wave's successes under `done_key`: `installed` or `applied`).
    pub async fn status(
        &self,
        conn: &mut sqlx::AnyConnection,
        row: &Rollout<S>,
        done_key: &str,
    ) -> Result<(Vec<WaveStatus>, serde_json::Map<String, serde_json::Value>), FleetError> {
        let waves = store::wave_status(conn, row).await?;
        let events = store::events(&mut *conn, row.id).await?;
        let waves_json: Vec<serde_json::Value> = waves
            .iter()
            .zip(&row.plan.waves)
            .map(|(w, spec)| {
                let mut wave = json!({
                    "size": spec.to_string(),
                    "agents": w.agents,
                    done_key: w.installed,
                    "failed": w.failed,
                    "timed_out": w.timed_out,
                    "pending": w.pending(),
                    "opened_at": w.opened_at.map(secs),
                    "completed_at": w.completed_at.map(secs),
                });
                // Only when there are any: a wave of agents that all have a bundle (and
                // every configuration rollout's) reads as it always did.
                if w.no_bundle > 0 {
                    wave["no_bundle"] = json!(w.no_bundle);
                }
                wave
            })
            .collect();
        let mut map = serde_json::Map::new();
        map.insert("state".into(), json!(row.state.as_str()));
        map.insert("reason".into(), json!(row.reason));
        map.insert("halt_cause".into(), json!(row.halt_cause));
        map.insert("wave".into(), json!(row.opened));
        map.insert("started_at".into(), json!(secs(row.started_at)));
        map.insert("completed_at".into(), json!(row.completed_at.map(secs)));
        map.insert("waves".into(), json!(waves_json));
        map.insert(
            "events".into(),
            events
                .iter()
                .map(|(kind, wave, at, detail, server)| {
                    json!({
                        "kind": kind, "wave": wave, "at": secs(*at), "detail": detail, "server": server,
                    })
                })
                .collect(),
        );
        Ok((waves, map))
    }
}

/// A plan as the admin API shows it.
pub fn plan_json(plan: &Plan) -> serde_json::Value {
    json!({
        "waves": plan.waves.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "wave_wait": plan.wave_wait,
        "max_failures": plan.max_failures.to_string(),
        "agent_deadline": plan.agent_deadline,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::store::{Bundle, ConfigSet};

    #[test]
    fn an_operator_halts_a_live_rollout_and_is_told_why_not_otherwise() {
        let halt = Engine::<Bundle>::halt_decision(State::Running, Some("  canary broke "));
        assert_eq!(
            halt,
            Ok(Decision::Halt {
                cause: HaltCause::Operator,
                reason: "halted by an operator: canary broke".into()
            })
        );
        assert!(matches!(
            Engine::<Bundle>::halt_decision(State::Soaking, Some(" ")),
            Ok(Decision::Halt { reason, .. }) if reason == "halted by an operator"
        ));
        assert_eq!(
            Engine::<Bundle>::halt_decision(State::Halted, None),
            Err(Refusal("the rollout is halted already".into()))
        );
        assert_eq!(
            Engine::<ConfigSet>::halt_decision(State::Completed, None),
            Err(Refusal(
                "the config rollout is completed; nothing to halt".into()
            ))
        );
    }
}
