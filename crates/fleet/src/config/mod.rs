//! Remote configuration: the workload's files, one set per agent group, reaching the
//! fleet in waves like a bundle and acknowledged by each agent (`APPLIED` or `FAILED`).
//!
//! - [`directive`]: which set an agent runs and whether an answer carries it (pure);
//! - [`store`]: the sets, the config rollouts' rows, the agents' configuration columns;
//! - [`Configs`] (here): stores a pushed set and starts its config rollout in the same
//!   write transaction; decides each config rollout's next step with the bundle
//!   rollouts' pure functions ([`step::next`], [`order::assign`], `join_wave`) over the
//!   [`CONFIGS`] tables, once, in the database; answers agents from what it last read.
//!
//! What a set may hold and its hash are [`agent_protocol::config_set`]'s. A config
//! rollout is keyed by its group, its set's hash and the set's creation time, so the
//! same files pushed again later are a new, deliberate rollout. It never touches the
//! bundle rollouts' tables, so a bundle rollout and a config rollout run side by side.

pub mod directive;
pub mod store;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use agent_protocol::config_set::{self, SetError};
use agent_protocol::wire::{ConfigOutcome, ConfigPayload, ConfigStatus};
use serde_json::json;

use crate::db::{Db, now_ms};
use crate::error::FleetError;
use crate::news::News;
use crate::rollout::Refusal;
use crate::rollout::order::{self, Member};
use crate::rollout::plan::Plan;
use crate::rollout::step::{self, Decision, HaltCause, State};
use crate::rollout::store::{self as rstore, CONFIGS, Membership};
use directive::Place;
use store::{ConfigRolloutRow, SetRow};

/// An agent's `config_status` while it was sent a set and has not answered.
pub const APPLYING: &str = "APPLYING";

/// A set as stored by a push.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pushed {
    pub group: String,
    pub hash: String,
    /// Unix milliseconds.
    pub created_at: i64,
    /// False when the group had this very set already (nothing new rolls out).
    pub new: bool,
}

/// A group's set and its config rollout, as last read.
#[derive(Debug, Clone)]
pub struct GroupSet {
    pub set: SetRow,
    pub rollout: Option<Arc<ConfigRolloutRow>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn secs(ms: i64) -> f64 {
    ms as f64 / 1000.0
}

pub struct Configs {
    db: Db,
    plan: Plan,
    server: String,
    groups: RwLock<HashMap<String, GroupSet>>,
    /// Agents' places per config rollout id, read once per rollout and kept.
    members: Mutex<HashMap<i64, HashMap<String, Membership>>>,
    deciding: tokio::sync::Mutex<()>,
    halts: [AtomicU64; 3],
    wake: tokio::sync::Notify,
    /// Told whenever a set or its rollout moves, so held connects look again.
    news: Arc<News>,
}

/// What a held connect cares about in each group: its set, and its rollout's progress.
type Shape = BTreeMap<String, (String, Option<(i64, State, u32)>)>;

fn shape(groups: &HashMap<String, GroupSet>) -> Shape {
    groups
        .iter()
        .map(|(name, g)| {
            (
                name.clone(),
                (
                    g.set.hash.clone(),
                    g.rollout.as_ref().map(|r| (r.id, r.state, r.opened)),
                ),
            )
        })
        .collect()
}

impl Configs {
    pub fn new(db: Db, plan: Plan, server: String, news: Arc<News>) -> Self {
        Self {
            news,
            db,
            plan,
            server,
            groups: RwLock::new(HashMap::new()),
            members: Mutex::new(HashMap::new()),
            deciding: tokio::sync::Mutex::new(()),
            halts: Default::default(),
            wake: tokio::sync::Notify::new(),
        }
    }

    /// Each group's set and config rollout as last read.
    pub fn groups(&self) -> HashMap<String, GroupSet> {
        self.groups
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn group(&self, group: &str) -> Option<GroupSet> {
        self.groups
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(group)
            .cloned()
    }

    pub fn halts(&self, cause: HaltCause) -> u64 {
        self.halts[cause as usize].load(Ordering::Relaxed)
    }

    /// Resolves when a status may have changed what happens next.
    pub async fn woken(&self) {
        self.wake.notified().await;
    }

    /// Reads the sets and their rollouts again (another server may have pushed one or
    /// moved one on).
    pub async fn refresh(&self) -> Result<(), FleetError> {
        // A set's files are read once per set, not at every look.
        let known = self.groups();
        let mut sets = Vec::new();
        for (group, hash, created_at) in store::set_heads(self.db.pool()).await? {
            match known.get(&group) {
                Some(g) if g.set.hash == hash && g.set.created_at == created_at => {
                    sets.push(g.set.clone());
                }
                _ => {
                    if let Some(set) = store::set(self.db.pool(), &group).await? {
                        sets.push(set);
                    }
                }
            }
        }
        let mut groups = HashMap::new();
        for set in sets {
            let rollout = store::rollout_of(self.db.pool(), &set.group, &set.hash, set.created_at)
                .await?
                .map(Arc::new);
            if let Some(r) = &rollout {
                let known = lock(&self.members).contains_key(&r.id);
                if !known {
                    let placed = rstore::memberships(self.db.pool(), CONFIGS, r.id).await?;
                    lock(&self.members).entry(r.id).or_insert(placed);
                }
            }
            groups.insert(set.group.clone(), GroupSet { set, rollout });
        }
        // Rollouts no longer any group's are not asked about again.
        let live: Vec<i64> = groups
            .values()
            .filter_map(|g| g.rollout.as_ref().map(|r| r.id))
            .collect();
        lock(&self.members).retain(|id, _| live.contains(id));
        let moved = {
            let mut slot = self.groups.write().unwrap_or_else(|p| p.into_inner());
            let moved = shape(&slot) != shape(&groups);
            *slot = groups;
            moved
        };
        if moved {
            self.news
                .publish("a configuration set or its rollout moved");
        }
        Ok(())
    }

    /// `PUT /admin/config/<group>`: stores the set and starts its config rollout, in one
    /// write transaction. The same files as the group's set change nothing.
    pub async fn push(
        &self,
        group: &str,
        files: BTreeMap<String, String>,
    ) -> Result<Result<Pushed, SetError>, FleetError> {
        if let Err(e) = config_set::check_set(&files) {
            return Ok(Err(e));
        }
        let hash = config_set::hash(&files);
        let pushed = {
            let _one = self.deciding.lock().await;
            let mut tx = self.db.begin_write().await?;
            if let Some(existing) = store::set(&mut *tx, group).await?
                && existing.hash == hash
            {
                tx.commit().await?;
                return Ok(Ok(Pushed {
                    group: group.to_owned(),
                    hash,
                    created_at: existing.created_at,
                    new: false,
                }));
            }
            let now = now_ms();
            store::put_set(&mut tx, group, &hash, &files, now).await?;
            if let Some(id) = store::insert_rollout(&mut tx, group, &hash, &self.plan, now).await? {
                rstore::insert_waves(&mut tx, CONFIGS, id, &self.plan).await?;
                let since =
                    now / 1000 - i64::try_from(self.plan.agent_deadline).unwrap_or(i64::MAX);
                let live = store::group_agents(&mut *tx, group, since).await?;
                let members: Vec<Member> = live
                    .iter()
                    .map(|(id, group, _)| Member {
                        id: id.clone(),
                        group: group.clone(),
                    })
                    .collect();
                // Each set has its own order, as each bundle does.
                let waves = order::assign(&self.plan, &format!("{group}:{hash}"), &members);
                let rows: Vec<(String, u32, bool)> = live
                    .iter()
                    .zip(&waves)
                    .map(|((id, _, running), wave)| (id.clone(), *wave, *running == hash))
                    .collect();
                rstore::insert_members(&mut tx, CONFIGS, id, &rows, now).await?;
                let detail = format!(
                    "set {} of group {group} ({} files), {} agents placed in {} waves",
                    short(&hash),
                    files.len(),
                    rows.len(),
                    self.plan.wave_count()
                );
                rstore::event(
                    &mut *tx,
                    CONFIGS,
                    id,
                    "started",
                    0,
                    &detail,
                    now,
                    &self.server,
                )
                .await?;
                tracing::info!(config_rollout = id, "config rollout started: {detail}");
            }
            tx.commit().await?;
            Pushed {
                group: group.to_owned(),
                hash,
                created_at: now,
                new: true,
            }
        };
        self.refresh().await?;
        self.decide().await?;
        Ok(Ok(pushed))
    }

    /// `DELETE /admin/config/<group>`: the group's agents run `default`'s set again.
    /// False if the group had no set.
    pub async fn delete(&self, group: &str) -> Result<bool, FleetError> {
        let deleted = {
            let _one = self.deciding.lock().await;
            let mut tx = self.db.begin_write().await?;
            let deleted = store::delete_set(&mut tx, group).await?;
            tx.commit().await?;
            deleted
        };
        if deleted {
            tracing::info!("configuration set of group {group} deleted");
        }
        self.refresh().await?;
        Ok(deleted)
    }

    /// The set to send in the answer to `agent` of `group` that runs `running`, if it
    /// should run another; records that it was sent (`APPLYING`), or, when it runs the
    /// set already, that it applied it (its status may have been lost).
    pub async fn answer(
        &self,
        agent: &str,
        group: &str,
        running: &str,
    ) -> Result<Option<ConfigPayload>, FleetError> {
        let groups = self
            .groups
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let effective = directive::effective_group(group, |g| groups.contains_key(g));
        let Some(GroupSet {
            set,
            rollout: Some(rollout),
        }) = groups.get(effective).cloned()
        else {
            return Ok(None);
        };
        let on_target = running == set.hash;
        let mut member = self.membership(&rollout, agent, group, on_target).await?;
        if !on_target && !member.done && member.wave <= rollout.opened {
            // About to send: another server may have sent it or heard the answer since
            // this one last looked, and a set the agent refused is never sent again.
            if let Some(fresh) =
                rstore::membership(self.db.pool(), CONFIGS, rollout.id, agent).await?
            {
                member = fresh;
                self.remember(rollout.id, agent, |m| *m = fresh);
            }
        }
        let now = now_ms();
        if on_target {
            if !member.done || member.failed {
                rstore::set_outcome(
                    self.db.pool(),
                    CONFIGS,
                    rollout.id,
                    agent,
                    rstore::APPLIED,
                    None,
                    now,
                )
                .await?;
                store::set_agent_status(self.db.pool(), agent, &set.hash, rstore::APPLIED, None)
                    .await?;
                self.remember(rollout.id, agent, |m| {
                    m.done = true;
                    m.failed = false;
                });
                self.wake.notify_one();
            }
            return Ok(None);
        }
        let place = Place {
            wave: member.wave,
            told: member.told,
            failed: member.failed,
        };
        if !directive::send(running, &set.hash, rollout.state, rollout.opened, place) {
            return Ok(None);
        }
        if !member.told {
            rstore::mark_told(self.db.pool(), CONFIGS, rollout.id, agent, now).await?;
            store::set_agent_status(self.db.pool(), agent, &set.hash, APPLYING, None).await?;
            self.remember(rollout.id, agent, |m| m.told = true);
        }
        Ok(Some(ConfigPayload {
            hash: set.hash.clone(),
            files: (*set.files).clone(),
        }))
    }

    async fn membership(
        &self,
        rollout: &ConfigRolloutRow,
        agent: &str,
        group: &str,
        on_target: bool,
    ) -> Result<Membership, FleetError> {
        if let Some(m) = lock(&self.members)
            .get(&rollout.id)
            .and_then(|members| members.get(agent))
        {
            return Ok(*m);
        }
        let member = match rstore::membership(self.db.pool(), CONFIGS, rollout.id, agent).await? {
            Some(m) => m,
            None => {
                let wave = rollout.plan.join_wave(rollout.opened, group);
                rstore::join(
                    self.db.pool(),
                    CONFIGS,
                    rollout.id,
                    agent,
                    wave,
                    on_target,
                    now_ms(),
                )
                .await?
            }
        };
        if let Some(members) = lock(&self.members).get_mut(&rollout.id) {
            members.insert(agent.to_owned(), member);
        }
        Ok(member)
    }

    fn remember(&self, rollout: i64, agent: &str, change: impl FnOnce(&mut Membership)) {
        if let Some(m) = lock(&self.members)
            .get_mut(&rollout)
            .and_then(|members| members.get_mut(agent))
        {
            change(m);
        }
    }

    /// `POST /agent/config-status`, received at `at` (unix milliseconds): the agent's
    /// row, and the outcome in the config rollout of that set.
    pub async fn report(&self, status: &ConfigStatus, at: i64) -> Result<(), FleetError> {
        let outcome = match status.status {
            ConfigOutcome::Applied => rstore::APPLIED,
            ConfigOutcome::Failed => rstore::FAILED,
        };
        let error = match status.status {
            ConfigOutcome::Applied => None,
            ConfigOutcome::Failed => status.error.as_deref(),
        };
        store::set_agent_status(self.db.pool(), &status.id, &status.hash, outcome, error).await?;
        let group = store::agent_group(self.db.pool(), &status.id)
            .await?
            .unwrap_or_default();
        let groups = self.groups();
        let effective = directive::effective_group(&group, |g| groups.contains_key(g));
        let Some(rollout) = groups
            .get(effective)
            .and_then(|g| g.rollout.clone())
            .filter(|r| r.hash == status.hash)
        else {
            return Ok(());
        };
        let on_target = outcome == rstore::APPLIED;
        self.membership(&rollout, &status.id, &group, on_target)
            .await?;
        rstore::set_outcome(
            self.db.pool(),
            CONFIGS,
            rollout.id,
            &status.id,
            outcome,
            error,
            at,
        )
        .await?;
        self.remember(rollout.id, &status.id, |m| {
            m.done = true;
            m.failed = !on_target;
        });
        self.wake.notify_one();
        Ok(())
    }

    /// Applies every transition that is due in each group's config rollout.
    pub async fn decide(&self) -> Result<(), FleetError> {
        let mut changed = false;
        for g in self.groups().into_values() {
            let Some(rollout) = g.rollout else { continue };
            if matches!(rollout.state, State::Halted | State::Completed) {
                continue;
            }
            changed |= self.decide_one(rollout.id).await?;
        }
        if changed {
            self.refresh().await?;
        }
        Ok(())
    }

    /// One config rollout's due transitions, in one write transaction. True if any.
    async fn decide_one(&self, id: i64) -> Result<bool, FleetError> {
        let _one = self.deciding.lock().await;
        if !self.due(id).await? {
            return Ok(false);
        }
        let mut tx = self.db.begin_write().await?;
        let Some(mut row) = store::lock(&mut *tx, self.db.backend(), id).await? else {
            tx.commit().await?;
            return Ok(false);
        };
        if matches!(row.state, State::Halted | State::Completed) {
            tx.commit().await?;
            return Ok(true);
        }
        let now = now_ms();
        let timed_out = rstore::time_out(&mut tx, CONFIGS, row.id, &row.plan, now).await?;
        let mut decided = Vec::new();
        let most = 3 * row.plan.waves.len() + 3;
        while decided.len() < most {
            let progress = rstore::progress(&mut tx, CONFIGS, &row.head()).await?;
            let Some(decision) = step::next(&row.plan, &progress, now) else {
                break;
            };
            if !rstore::apply(&mut tx, CONFIGS, &row.head(), &decision, now, &self.server).await? {
                break;
            }
            decided.push(decision);
            match store::lock(&mut *tx, self.db.backend(), row.id).await? {
                Some(r) => row = r,
                None => break,
            }
        }
        tx.commit().await?;
        for agent in &timed_out {
            tracing::warn!(
                config_rollout = row.id,
                agent = %agent,
                "agent sent no APPLIED or FAILED for set {} within {} s: TIMED_OUT",
                short(&row.hash),
                row.plan.agent_deadline
            );
        }
        for decision in &decided {
            self.log_decision(&row, decision);
        }
        Ok(!decided.is_empty() || !timed_out.is_empty())
    }

    /// Whether anything is due, read without the write lock (see `Rollouts::due`).
    async fn due(&self, id: i64) -> Result<bool, FleetError> {
        let mut tx = self.db.pool().begin().await?;
        let now = now_ms();
        let due = match store::lock(&mut *tx, crate::db::Backend::Sqlite, id).await? {
            None => false,
            Some(row) if matches!(row.state, State::Halted | State::Completed) => false,
            Some(row) => {
                rstore::overdue(&mut tx, CONFIGS, row.id, &row.plan, now).await? || {
                    let progress = rstore::progress(&mut tx, CONFIGS, &row.head()).await?;
                    step::next(&row.plan, &progress, now).is_some()
                }
            }
        };
        tx.rollback().await?;
        Ok(due)
    }

    fn log_decision(&self, row: &ConfigRolloutRow, decision: &Decision) {
        let what = format!(
            "config rollout of set {} (group {})",
            short(&row.hash),
            row.group
        );
        match decision {
            Decision::OpenWave(w) => tracing::info!(
                config_rollout = row.id,
                "{what}: wave {w} of {} opened",
                row.plan.wave_count()
            ),
            Decision::CompleteWave(w) => {
                tracing::info!(config_rollout = row.id, "{what}: wave {w} completed")
            }
            Decision::Soak(w) => tracing::info!(
                config_rollout = row.id,
                "{what}: wave {w} soaks for {} s",
                row.plan.wave_wait
            ),
            Decision::Halt { cause, reason } => {
                self.halts[*cause as usize].fetch_add(1, Ordering::Relaxed);
                tracing::warn!(config_rollout = row.id, "{what} halted: {reason}");
            }
            Decision::Complete => {
                tracing::info!(
                    config_rollout = row.id,
                    "{what} completed: every wave is done"
                )
            }
        }
    }

    fn rollout_of(&self, group: &str) -> Result<Arc<ConfigRolloutRow>, Refusal> {
        self.group(group)
            .and_then(|g| g.rollout)
            .ok_or_else(|| Refusal(format!("group {group} has no configuration set")))
    }

    /// `POST /admin/config/<group>/halt`.
    pub async fn halt(
        &self,
        group: &str,
        why: Option<&str>,
    ) -> Result<Result<(), Refusal>, FleetError> {
        let reason = match why {
            Some(w) if !w.trim().is_empty() => format!("halted by an operator: {}", w.trim()),
            _ => "halted by an operator".to_owned(),
        };
        self.operator(group, |row, _| match row.state {
            State::Running | State::Soaking => Ok(Decision::Halt {
                cause: HaltCause::Operator,
                reason: reason.clone(),
            }),
            State::Halted => Err(Refusal("the config rollout is halted already".into())),
            State::Completed => Err(Refusal(
                "the config rollout is completed; nothing to halt".into(),
            )),
        })
        .await
    }

    /// `POST /admin/config/<group>/advance`: the next wave opens now.
    pub async fn advance(&self, group: &str) -> Result<Result<(), Refusal>, FleetError> {
        self.operator(group, |row, progress| {
            step::advance(&row.plan, progress).map_err(Refusal)
        })
        .await
    }

    /// `POST /admin/config/<group>/resume`: the failures seen so far are let go.
    pub async fn resume(&self, group: &str) -> Result<Result<(), Refusal>, FleetError> {
        let current = match self.rollout_of(group) {
            Ok(r) => r,
            Err(refusal) => return Ok(Err(refusal)),
        };
        let result = {
            let _one = self.deciding.lock().await;
            let mut tx = self.db.begin_write().await?;
            let row = store::lock(&mut *tx, self.db.backend(), current.id).await?;
            let result = match row {
                Some(row) if row.state == State::Halted => {
                    let progress = rstore::progress(&mut tx, CONFIGS, &row.head()).await?;
                    rstore::forgive(&mut tx, CONFIGS, row.id, progress.failures()).await?;
                    rstore::set_state(&mut tx, CONFIGS, row.id, State::Running, None, None).await?;
                    rstore::event(
                        &mut *tx,
                        CONFIGS,
                        row.id,
                        "resumed",
                        row.opened,
                        "",
                        now_ms(),
                        &self.server,
                    )
                    .await?;
                    tracing::info!(
                        config_rollout = row.id,
                        "config rollout of group {group} resumed by an operator ({} failures let go)",
                        progress.failures()
                    );
                    Ok(())
                }
                Some(_) => Err(Refusal("the config rollout is not halted".into())),
                None => Err(Refusal(format!("group {group} has no config rollout"))),
            };
            tx.commit().await?;
            result
        };
        self.refresh().await?;
        self.decide().await?;
        Ok(result)
    }

    async fn operator(
        &self,
        group: &str,
        choose: impl FnOnce(&ConfigRolloutRow, &step::Progress) -> Result<Decision, Refusal>,
    ) -> Result<Result<(), Refusal>, FleetError> {
        let current = match self.rollout_of(group) {
            Ok(r) => r,
            Err(refusal) => return Ok(Err(refusal)),
        };
        let result = {
            let _one = self.deciding.lock().await;
            let mut tx = self.db.begin_write().await?;
            let Some(row) = store::lock(&mut *tx, self.db.backend(), current.id).await? else {
                return Ok(Err(Refusal(format!("group {group} has no config rollout"))));
            };
            let progress = rstore::progress(&mut tx, CONFIGS, &row.head()).await?;
            let result = match choose(&row, &progress) {
                Ok(decision) => {
                    rstore::apply(
                        &mut tx,
                        CONFIGS,
                        &row.head(),
                        &decision,
                        now_ms(),
                        &self.server,
                    )
                    .await?;
                    Ok(decision)
                }
                Err(refusal) => Err(refusal),
            };
            tx.commit().await?;
            result.map(|decision| self.log_decision(&row, &decision))
        };
        self.refresh().await?;
        self.decide().await?;
        Ok(result)
    }

    /// `GET /admin/config`: every set, its agents' statuses and its config rollout.
    pub async fn status(&self) -> Result<serde_json::Value, FleetError> {
        let sets = store::sets(self.db.pool()).await?;
        let mut out = Vec::new();
        let mut conn = self.db.pool().acquire().await?;
        for set in sets {
            let rollout =
                store::rollout_of(&mut *conn, &set.group, &set.hash, set.created_at).await?;
            let (counts, rollout_json) = match &rollout {
                Some(row) => {
                    let waves = rstore::wave_status(&mut conn, CONFIGS, &row.head()).await?;
                    let places = rstore::memberships(&mut *conn, CONFIGS, row.id).await?;
                    // Sent the set and not answered yet.
                    let applying = places.values().filter(|m| m.told && !m.done).count() as u64;
                    let events = rstore::events(&mut *conn, CONFIGS, row.id).await?;
                    let applied: u64 = waves.iter().map(|w| w.installed).sum();
                    let failed: u64 = waves.iter().map(|w| w.failed).sum();
                    let timed_out: u64 = waves.iter().map(|w| w.timed_out).sum();
                    let waves_json: Vec<serde_json::Value> = waves
                        .iter()
                        .zip(&row.plan.waves)
                        .map(|(w, spec)| {
                            json!({
                                "size": spec.to_string(),
                                "agents": w.agents,
                                "applied": w.installed,
                                "failed": w.failed,
                                "timed_out": w.timed_out,
                                "pending": w.pending(),
                                "opened_at": w.opened_at.map(secs),
                                "completed_at": w.completed_at.map(secs),
                            })
                        })
                        .collect();
                    (
                        (applied, applying, failed, timed_out),
                        json!({
                            "state": row.state.as_str(),
                            "reason": row.reason,
                            "halt_cause": row.halt_cause,
                            "wave": row.opened,
                            "started_at": secs(row.started_at),
                            "completed_at": row.completed_at.map(secs),
                            "waves": waves_json,
                            "events": events.iter().map(|(kind, wave, at, detail, server)| json!({
                                "kind": kind, "wave": wave, "at": secs(*at), "detail": detail, "server": server,
                            })).collect::<Vec<_>>(),
                        }),
                    )
                }
                None => ((0, 0, 0, 0), serde_json::Value::Null),
            };
            let (applied, applying, failed, timed_out) = counts;
            out.push(json!({
                "group": set.group,
                "hash": set.hash,
                "created_at": secs(set.created_at),
                "files": set.files.keys().collect::<Vec<_>>(),
                "bytes": set.files.iter().map(|(n, c)| n.len() + c.len()).sum::<usize>(),
                "applied": applied,
                "applying": applying,
                "failed": failed,
                "timed_out": timed_out,
                "counts": { "APPLIED": applied, "APPLYING": applying, "FAILED": failed + timed_out },
                "state": rollout_json.get("state").cloned().unwrap_or(serde_json::Value::Null),
                "reason": rollout_json.get("reason").cloned().unwrap_or(serde_json::Value::Null),
                "rollout": rollout_json,
            }));
        }
        Ok(json!({
            "sets": out,
            "plan": {
                "waves": self.plan.waves.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "wave_wait": self.plan.wave_wait,
                "max_failures": self.plan.max_failures.to_string(),
                "agent_deadline": self.plan.agent_deadline,
            },
        }))
    }

    /// (group, state) of each config rollout, and (group, status, count) of agents, for
    /// `/metrics`.
    pub async fn gauges(&self) -> Result<ConfigGauges, FleetError> {
        let mut gauges = ConfigGauges::default();
        let mut groups: Vec<(String, GroupSet)> = self.groups().into_iter().collect();
        groups.sort_by(|a, b| a.0.cmp(&b.0));
        let mut conn = self.db.pool().acquire().await?;
        for (group, g) in groups {
            let Some(row) = g.rollout else { continue };
            gauges.states.push((group.clone(), row.state.as_str()));
            let waves = rstore::wave_status(&mut conn, CONFIGS, &row.head()).await?;
            let applied = waves.iter().map(|w| w.installed).sum();
            let failed = waves.iter().map(|w| w.failed + w.timed_out).sum();
            let pending = waves.iter().map(step::WaveStatus::pending).sum();
            gauges.agents.push((group, applied, failed, pending));
        }
        gauges.halts = HaltCause::ALL
            .iter()
            .map(|c| (c.as_str(), self.halts(*c)))
            .collect();
        Ok(gauges)
    }
}

/// What `/metrics` says of config rollouts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigGauges {
    /// (group, state) of each group's config rollout.
    pub states: Vec<(String, &'static str)>,
    /// (group, applied, failed, pending) agents of each.
    pub agents: Vec<(String, u64, u64, u64)>,
    pub halts: Vec<(&'static str, u64)>,
}

/// The first 12 hex digits of a hash, for logs.
pub fn short(hash: &str) -> &str {
    hash.get(..12).unwrap_or(hash)
}
