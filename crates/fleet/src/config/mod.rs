//! Remote configuration: the workload's files, one set per agent group (or per label
//! selector: `selector:env=prod`, which comes before the group's), reaching the fleet in
//! waves like a bundle and acknowledged by each agent (`APPLIED` or `FAILED`).
//!
//! - [`directive`]: which set an agent runs and whether an answer carries it (pure);
//! - [`store`]: the sets and the agents' configuration columns;
//! - [`Configs`] (here): the config rollouts, an [`Engine`] of [`ConfigSet`]s, one per
//!   group with a set: stores a pushed set and starts its rollout in the same write
//!   transaction, and answers agents from what it last read. Plans, waves, steps,
//!   deadlines and an operator's halt, advance and resume are the engine's, as for a
//!   bundle.
//!
//! What a set may hold and its hash are [`agent_protocol::config_set`]'s. A config
//! rollout is keyed by its group, its set's hash and the set's creation time, so the
//! same files pushed again later are a new, deliberate rollout. A bundle rollout and a
//! config rollout run side by side: the fleet's bundle rollout is the latest of its kind.

pub mod directive;
pub mod guard;
pub mod store;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use agent_protocol::config_set::{self, SetError};
use agent_protocol::wire::{ConfigOutcome, ConfigPayload, ConfigStatus};
use serde_json::json;

use crate::db::Db;
use crate::db::now_ms;
use crate::error::FleetError;
use crate::news::News;
use crate::rollout::Refusal;
use crate::rollout::engine::{Candidate, Engine, plan_json, secs};
use crate::rollout::plan::Plan;
use crate::rollout::step::{self, Decision, HaltCause, State};
use crate::rollout::store::{self as rstore, ConfigSet, Kind, NewRollout};
pub use crate::rollout::store::{ConfigRolloutRow, short};
use directive::Place;
use store::SetRow;

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

pub struct Configs {
    engine: Engine<ConfigSet>,
    /// `[rollout]`: the plan new config rollouts start under; replaced live when the
    /// server's configuration is read again.
    plan: RwLock<Arc<Plan>>,
    groups: RwLock<HashMap<String, GroupSet>>,
    /// The sets keyed by a selector, parsed: which an agent runs depends on its labels.
    selectors: RwLock<Arc<Vec<directive::SelectorSet>>>,
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
            engine: Engine::new(db, server),
            plan: RwLock::new(Arc::new(plan)),
            groups: RwLock::new(HashMap::new()),
            selectors: RwLock::default(),
            news,
        }
    }

    /// Whether some set is keyed by a selector: then an agent's labels decide its set.
    pub fn has_selectors(&self) -> bool {
        !self.selectors().is_empty()
    }

    fn selectors(&self) -> Arc<Vec<directive::SelectorSet>> {
        Arc::clone(&self.selectors.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// The key of the set an agent of `group` with `labels` runs (`None`: its labels are
    /// not known; only its group counts).
    fn key_for(
        &self,
        group: &str,
        labels: Option<&crate::labels::Labels>,
        groups: &HashMap<String, GroupSet>,
    ) -> String {
        match labels {
            Some(labels) => directive::effective_key(group, labels, &self.selectors(), |g| {
                groups.contains_key(g)
            }),
            None => directive::effective_group(group, |g| groups.contains_key(g)).to_owned(),
        }
    }

    /// An agent's labels as the fleet keeps them, when a selector's set may be its.
    async fn labels_of(&self, agent: &str) -> Result<Option<crate::labels::Labels>, FleetError> {
        if !self.has_selectors() {
            return Ok(None);
        }
        let Some(row) = self.db().agent(agent).await? else {
            return Ok(None);
        };
        let opamp = self.db().opamp_agent(agent).await?;
        Ok(Some(
            row.labels_as_seen(opamp.as_ref().map(|o| o.view.as_str())),
        ))
    }

    fn db(&self) -> &Db {
        self.engine.db()
    }

    /// The plan new config rollouts start under.
    pub fn plan(&self) -> Arc<Plan> {
        Arc::clone(&self.plan.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// New config rollouts start under `plan` from now on; a started one keeps its own.
    pub fn set_plan(&self, plan: Plan) {
        *self.plan.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(plan);
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
        self.engine.halts(cause)
    }

    /// Resolves when a status may have changed what happens next.
    pub async fn woken(&self) {
        self.engine.woken().await;
    }

    /// Reads the sets and their rollouts again (another server may have pushed one or
    /// moved one on).
    pub async fn refresh(&self) -> Result<(), FleetError> {
        // A set's files are read once per set, not at every look.
        let known = self.groups();
        let mut sets = Vec::new();
        for (group, hash, created_at) in store::set_heads(self.db().pool()).await? {
            match known.get(&group) {
                Some(g) if g.set.hash == hash && g.set.created_at == created_at => {
                    sets.push(g.set.clone());
                }
                _ => {
                    if let Some(set) = store::set(self.db().pool(), &group).await? {
                        sets.push(set);
                    }
                }
            }
        }
        let mut groups = HashMap::new();
        let mut selectors = Vec::new();
        for set in &sets {
            let Some(text) = directive::selector_of(&set.group) else {
                continue;
            };
            match agent_protocol::selector::Selector::parse(text) {
                Ok(selector) => selectors.push(directive::SelectorSet {
                    key: set.group.clone(),
                    selector,
                    created_at: set.created_at,
                }),
                Err(e) => tracing::warn!(
                    "configuration set {} is left out: its selector does not parse ({e}); delete it",
                    set.group
                ),
            }
        }
        *self.selectors.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(selectors);
        for set in sets {
            let rollout =
                rstore::find::<ConfigSet>(self.db().pool(), &set.group, &set.hash, set.created_at)
                    .await?
                    .map(Arc::new);
            groups.insert(set.group.clone(), GroupSet { set, rollout });
        }
        // Each rollout's places are read once; rollouts no longer any group's are not
        // asked about again.
        let live: Vec<i64> = groups
            .values()
            .filter_map(|g| g.rollout.as_ref().map(|r| r.id))
            .collect();
        self.engine.keep(&live).await?;
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
    /// write transaction. The same files as the group's set change nothing. A set that
    /// would empty the agents' files without `consent` is a [`FleetError::Conflict`]
    /// (see [`guard`]) and stores nothing.
    pub async fn push(
        &self,
        group: &str,
        files: BTreeMap<String, String>,
        consent: guard::Consent,
    ) -> Result<Result<Pushed, SetError>, FleetError> {
        if let Err(e) = config_set::check_set(&files) {
            return Ok(Err(e));
        }
        let hash = config_set::hash(&files);
        let pushed = {
            let _one = self.engine.deciding().await;
            let mut tx = self.db().begin_write().await?;
            let existing = store::set(&mut *tx, group).await?;
            if let Some(why) = guard::refusal(
                group,
                existing.as_ref().map(|e| e.files.keys()),
                &files,
                consent,
            ) {
                return Err(FleetError::Conflict(why));
            }
            if let Some(existing) = existing
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
            let plan = self.plan();
            store::put_set(&mut tx, group, &hash, &files, now).await?;
            let since = now / 1000 - i64::try_from(plan.agent_deadline).unwrap_or(i64::MAX);
            let mut selectors = (*self.selectors()).clone();
            if let Some(text) = directive::selector_of(group) {
                let selector = agent_protocol::selector::Selector::parse(text)
                    .map_err(|e| FleetError::Invalid(format!("selector {text:?}: {e}")))?;
                selectors.retain(|s| s.key != group);
                selectors.push(directive::SelectorSet {
                    key: group.to_owned(),
                    selector,
                    created_at: now,
                });
            }
            let candidates: Vec<Candidate> = if selectors.is_empty() {
                store::group_agents(&mut *tx, group, since)
                    .await?
                    .into_iter()
                    .map(|(id, group, running)| Candidate {
                        id,
                        group,
                        on_target: running == hash,
                    })
                    .collect()
            } else {
                // Which set each agent runs depends on its labels: weighed here, with this
                // set among the others.
                let groups = self.groups();
                let has_set = |g: &str| g == group || groups.contains_key(g);
                store::labelled_agents(&mut *tx, since)
                    .await?
                    .into_iter()
                    .filter(|a| {
                        directive::effective_key(&a.group, &a.labels, &selectors, has_set) == group
                    })
                    .map(|a| Candidate {
                        on_target: a.config_hash == hash,
                        id: a.id,
                        group: a.group,
                    })
                    .collect()
            };
            let new = NewRollout {
                kind: Kind::Config,
                group,
                target: &hash,
                signed_at: 0,
                version: None,
                previous: None,
                state: State::Running,
                reason: None,
                halt_cause: None,
                plan: &plan,
                now,
            };
            // Each set has its own order, as each bundle does.
            let order = format!("{group}:{hash}");
            let started = self
                .engine
                .start(&mut tx, &new, &order, &candidates, |placed| {
                    format!(
                        "set {} of group {group} ({} files), {placed} agents placed in {} waves",
                        short(&hash),
                        files.len(),
                        plan.wave_count()
                    )
                })
                .await?;
            if let Some((id, detail)) = started {
                tracing::info!(
                    rollout = id,
                    kind = "config",
                    "config rollout started: {detail}"
                );
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
            let _one = self.engine.deciding().await;
            let mut tx = self.db().begin_write().await?;
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
    /// `labels`: the agent's, when some set is keyed by a selector ([`Configs::has_selectors`]).
    pub async fn answer(
        &self,
        agent: &str,
        group: &str,
        labels: Option<&crate::labels::Labels>,
        running: &str,
    ) -> Result<Option<ConfigPayload>, FleetError> {
        let groups = self.groups();
        let effective = self.key_for(group, labels, &groups);
        let Some(GroupSet {
            set,
            rollout: Some(rollout),
        }) = groups.get(&effective).cloned()
        else {
            return Ok(None);
        };
        let on_target = running == set.hash;
        let mut member = self
            .engine
            .membership(&rollout, agent, group, on_target)
            .await?;
        if !on_target && !member.done && member.wave <= rollout.opened {
            // About to send: another server may have sent it or heard the answer since
            // this one last looked, and a set the agent refused is never sent again.
            if let Some(fresh) = self.engine.reread(rollout.id, agent).await? {
                member = fresh;
            }
        }
        let now = now_ms();
        if on_target {
            if !member.done || member.failed {
                self.engine
                    .outcome(rollout.id, agent, rstore::APPLIED, None, now)
                    .await?;
                store::set_agent_status(self.db().pool(), agent, &set.hash, rstore::APPLIED, None)
                    .await?;
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
            self.engine.mark_told(rollout.id, agent, now).await?;
            store::set_agent_status(self.db().pool(), agent, &set.hash, APPLYING, None).await?;
        }
        Ok(Some(ConfigPayload {
            hash: set.hash.clone(),
            files: (*set.files).clone(),
        }))
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
        store::set_agent_status(self.db().pool(), &status.id, &status.hash, outcome, error).await?;
        let group = store::agent_group(self.db().pool(), &status.id)
            .await?
            .unwrap_or_default();
        let groups = self.groups();
        let labels = self.labels_of(&status.id).await?;
        let effective = self.key_for(&group, labels.as_ref(), &groups);
        let Some(rollout) = groups
            .get(&effective)
            .and_then(|g| g.rollout.clone())
            .filter(|r| r.subject.hash == status.hash)
        else {
            return Ok(());
        };
        let on_target = outcome == rstore::APPLIED;
        let member = self
            .engine
            .membership(&rollout, &status.id, &group, on_target)
            .await?;
        // A status of a set this rollout never sent the agent counts for the agent only.
        if !member.told {
            tracing::info!(agent = %status.id, hash = %status.hash, "a configuration status of a set this rollout did not send the agent: recorded against the agent, not counted in the rollout");
            return Ok(());
        }
        self.engine
            .outcome(rollout.id, &status.id, outcome, error, at)
            .await
    }

    /// Applies every transition that is due in each group's config rollout.
    pub async fn decide(&self) -> Result<(), FleetError> {
        let mut changed = false;
        for g in self.groups().into_values() {
            let Some(rollout) = g.rollout else { continue };
            if matches!(rollout.state, State::Halted | State::Completed) {
                continue;
            }
            changed |= self.engine.decide(rollout.id).await?;
        }
        if changed {
            self.refresh().await?;
        }
        Ok(())
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
        self.operator(group, |row, _| {
            Engine::<ConfigSet>::halt_decision(row.state, why)
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
        let missing = format!("group {group} has no config rollout");
        let result = self.engine.resume(current.id, &missing).await?;
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
        let missing = format!("group {group} has no config rollout");
        let result = self.engine.operator(current.id, &missing, choose).await?;
        self.refresh().await?;
        self.decide().await?;
        Ok(result)
    }

    /// `GET /admin/config`: every set, its agents' statuses and its config rollout.
    pub async fn status(&self) -> Result<serde_json::Value, FleetError> {
        let sets = store::sets(self.db().pool()).await?;
        let mut out = Vec::new();
        let mut conn = self.db().pool().acquire().await?;
        for set in sets {
            let rollout =
                rstore::find::<ConfigSet>(&mut *conn, &set.group, &set.hash, set.created_at)
                    .await?;
            let (counts, rollout_json) = match &rollout {
                Some(row) => {
                    let (waves, status) = self.engine.status(&mut conn, row, "applied").await?;
                    let places = rstore::memberships(&mut *conn, Kind::Config, row.id).await?;
                    // Sent the set and not answered yet.
                    let applying = places.values().filter(|m| m.told && !m.done).count() as u64;
                    let applied: u64 = waves.iter().map(|w| w.installed).sum();
                    let failed: u64 = waves.iter().map(|w| w.failed).sum();
                    let timed_out: u64 = waves.iter().map(|w| w.timed_out).sum();
                    (
                        (applied, applying, failed, timed_out),
                        serde_json::Value::Object(status),
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
            "plan": plan_json(&self.plan()),
        }))
    }

    /// (group, state) of each config rollout, and (group, status, count) of agents, for
    /// `/metrics`.
    pub async fn gauges(&self) -> Result<ConfigGauges, FleetError> {
        let mut gauges = ConfigGauges::default();
        let mut groups: Vec<(String, GroupSet)> = self.groups().into_iter().collect();
        groups.sort_by(|a, b| a.0.cmp(&b.0));
        for (group, g) in groups {
            let Some(row) = g.rollout else { continue };
            gauges.states.push((group.clone(), row.state.as_str()));
            let waves = self.engine.waves(&row).await?;
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
