//! Staged rollouts: a bundle that appears in the download directory reaches the fleet in
//! waves, and the rollout halts by itself when too many agents fail.
//!
//! - [`plan`]: `[rollout]` as a plan (waves, soak, threshold, deadline);
//! - [`claim`]: whether a served bundle may start a rollout (one at a time per fleet);
//! - [`order`]: which agent is in which wave, the same on every server;
//! - [`step`]: what happens next and the directive for one agent, pure functions of what
//!   was observed and the time;
//! - [`store`]: the rows of every kind of rollout in the fleet database and the guarded
//!   writes;
//! - [`engine`]: one rollout engine for every kind (a bundle release here, a
//!   configuration set in [`crate::config`]): starts, decisions in one write transaction
//!   each, deadlines, an operator's halt, advance and resume, agents' places;
//! - [`windows`]: maintenance windows in the directive: an agent whose window is closed
//!   waits, accepted, and is told when it opens;
//! - [`Rollouts`] (here): the bundle rollouts, an [`Engine`] of [`Bundle`]s: which bundle
//!   may start one, and the version directive, answered from what it last read, so a
//!   heartbeat costs no query once an agent's wave is known.
//!
//! It owns the `rollout*` tables. It never decides for a bundle it was not told about
//! and never changes an agent's row except its update status on a missed deadline.

pub mod claim;
pub mod engine;
pub mod order;
pub mod plan;
pub mod step;
pub mod store;
pub mod windows;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use agent_protocol::wire::{Report, UpdateStatus};
use agent_protocol::{AcceptPolicy, AgentVersion};
use serde_json::json;

use crate::db::{Backend, Db, now_ms};
use crate::deployment_table::{DEFAULT, Table};
use crate::error::FleetError;
use crate::maintenance::Schedule;
use crate::news::News;
use crate::rollout::claim::Claim;
use crate::rollout::engine::{Candidate, Engine, plan_json, secs};
use crate::rollout::plan::Plan;
use crate::rollout::step::{Decision, Directive, HaltCause, State};
pub use crate::rollout::store::{Bundle, Membership, RolloutRow};
use crate::rollout::store::{Kind, NewRollout};

/// The bundle this server serves, as a rollout knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    pub sha256: String,
    /// `signed-at` of its signature; 0 without one.
    pub signed_at: i64,
    pub version: AgentVersion,
    /// The platforms (target triples) it has bundles for; empty: it does not say.
    pub platforms: Vec<String>,
}

/// The directive for one agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub accepted: bool,
    /// The version a refused agent must run.
    pub expected: AgentVersion,
    /// Accepted only because the release has no bundle for the agent's platform: it
    /// keeps its version, recorded `NO_BUNDLE`.
    pub no_bundle: bool,
    /// Accepted only because its maintenance window is closed: the window's next start
    /// (unix seconds), when it will be refused and update to `expected`.
    pub window: Option<i64>,
}

/// An operator's request that cannot be done now, with the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal(pub String);

/// The bundle rollouts of one deployment: its latest one is the one that counts.
pub struct Rollouts {
    engine: Engine<Bundle>,
    /// The deployment's rollout line (`""` for `default`; see
    /// [`crate::deployment_table::line_of`]).
    line: String,
    /// The fleet's deployments as last read: a rollout places only the agents that
    /// follow its deployment.
    table: Arc<Table>,
    /// `[rollout]`: the plan new rollouts start under (a started one keeps its own);
    /// replaced live when the server's configuration is read again.
    plan: RwLock<Arc<Plan>>,
    policy: AcceptPolicy,
    current: RwLock<Option<Arc<RolloutRow>>>,
    served: Mutex<Option<Served>>,
    /// The served bundle waits for the fleet's rollout to end before it starts its own.
    waiting: AtomicBool,
    mismatch: RwLock<Option<String>>,
    /// Told whenever the rollout as this server sees it moves, so held connects look again.
    news: Arc<News>,
    /// The rollout and open waves last swept for agents with no bundle (see
    /// [`Rollouts::sweep_no_bundle`]).
    swept: Mutex<Option<(i64, u32)>>,
    /// `[[maintenance]]`: when agents of a group may install (see [`windows`]); replaced
    /// live when the server's configuration is read again, which whoever waits for the
    /// next opening sees.
    schedule: tokio::sync::watch::Sender<Arc<Schedule>>,
    window_waiting: windows::Waiting,
}

/// The PostgreSQL advisory lock that orders rollout starts across servers ("rollout").
const START_LOCK: i64 = 0x0072_6f6c_6c6f_7574;

const NO_ROLLOUT: &str = "there is no rollout";

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Rollouts {
    /// The rollouts of `default`: the served bundle's, as before deployments.
    pub fn new(db: Db, plan: Plan, policy: AcceptPolicy, server: String) -> Self {
        Self::for_deployment(
            db,
            plan,
            policy,
            server,
            DEFAULT.to_owned(),
            Arc::default(),
            Arc::default(),
        )
    }

    /// The rollouts of the deployment `name`, whose release is fleet data (the same on
    /// every server): a new release starts its rollout at once, superseding the last.
    pub fn for_deployment(
        db: Db,
        plan: Plan,
        policy: AcceptPolicy,
        server: String,
        name: String,
        table: Arc<Table>,
        news: Arc<News>,
    ) -> Self {
        Self {
            engine: Engine::new(db, server),
            line: crate::deployment_table::line_of(&name).to_owned(),
            table,
            plan: RwLock::new(Arc::new(plan)),
            policy,
            current: RwLock::new(None),
            served: Mutex::new(None),
            waiting: AtomicBool::new(false),
            mismatch: RwLock::new(None),
            news,
            swept: Mutex::new(None),
            schedule: tokio::sync::watch::Sender::new(Arc::default()),
            window_waiting: windows::Waiting::default(),
        }
    }

    /// What versions satisfy a target (`agents.accept`).
    pub fn accept_policy(&self) -> &AcceptPolicy {
        &self.policy
    }

    /// The deployment these rollouts are of.
    pub fn deployment(&self) -> &str {
        if self.line.is_empty() {
            DEFAULT
        } else {
            &self.line
        }
    }

    /// The deployments table these rollouts place agents by.
    pub fn table(&self) -> Arc<Table> {
        Arc::clone(&self.table)
    }

    /// Whether the agent with `labels` follows this deployment.
    fn follows(&self, labels: &crate::labels::Labels) -> bool {
        self.table.follows(labels) == self.deployment()
    }

    fn db(&self) -> &Db {
        self.engine.db()
    }

    /// The plan new rollouts start under.
    pub fn plan(&self) -> Arc<Plan> {
        Arc::clone(&self.plan.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// New rollouts start under `plan` from now on; a started one keeps the plan it
    /// started with (its row holds it).
    pub fn set_plan(&self, plan: Plan) {
        *self.plan.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(plan);
    }

    /// Where held connects learn that the rollout moved.
    pub fn news(&self) -> &Arc<News> {
        &self.news
    }

    /// The fleet's rollout as last read.
    pub fn current(&self) -> Option<Arc<RolloutRow>> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Why this server's bundle is not the fleet's rollout, if it is not.
    pub fn mismatch(&self) -> Option<String> {
        self.mismatch
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn halts(&self, cause: HaltCause) -> u64 {
        self.engine.halts(cause)
    }

    /// The name this server decides under (its `server.name`).
    pub fn server(&self) -> &str {
        self.engine.server()
    }

    /// Resolves when a report may have changed what happens next.
    pub async fn woken(&self) {
        self.engine.woken().await;
    }

    /// Several servers share this fleet and may serve different bundles: `default`'s
    /// comes from each server's download directory. Another deployment's release is
    /// fleet data, the same for every server.
    fn shared(&self) -> bool {
        self.db().backend() == Backend::Postgres && self.line.is_empty()
    }

    /// The served bundle is `bundle`: start its rollout unless one exists or
    /// [`claim::claim`] says it may not, then read the fleet's rollout again. A bundle
    /// that waits for the fleet's rollout to end is looked at again at each call.
    pub async fn serve(&self, bundle: Served) -> Result<(), FleetError> {
        {
            let mut served = lock(&self.served);
            if served.as_ref() == Some(&bundle) {
                let ready = self.waiting.load(Ordering::Relaxed)
                    && claim::claim(self.current().as_deref(), &bundle, self.shared())
                        == Claim::Start;
                if !ready {
                    return Ok(());
                }
            }
            *served = Some(bundle.clone());
        }
        match self.start(&bundle).await {
            Ok(claim) => self.waiting.store(claim == Claim::Busy, Ordering::Relaxed),
            Err(e) => {
                // Not started: the next look tries again.
                *lock(&self.served) = None;
                return Err(e);
            }
        }
        self.refresh().await?;
        self.decide().await
    }

    /// Creates the rollout of `bundle` if no server did and the fleet's latest rollout
    /// lets it (see [`claim`]): the previous version is the last completed rollout's;
    /// the agents heard from within the deadline are placed in waves (later ones join
    /// as they come). Returns the claim it acted on.
    async fn start(&self, bundle: &Served) -> Result<Claim, FleetError> {
        let _one = self.engine.deciding().await;
        let mut tx = self.db().begin_write().await?;
        if self.shared() {
            // Two servers given two new bundles at once must not both see the fleet
            // idle and start one each; SQLite's BEGIN IMMEDIATE already orders them.
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(START_LOCK)
                .execute(&mut *tx)
                .await?;
        }
        if store::find::<Bundle>(&mut *tx, &self.line, &bundle.sha256, bundle.signed_at)
            .await?
            .is_some()
        {
            tx.commit().await?;
            return Ok(Claim::Ours);
        }
        let latest = store::latest::<Bundle>(&mut *tx, &self.line).await?;
        let act = if self.line.is_empty() {
            crate::releases::current_act(&mut tx, &bundle.sha256).await?
        } else {
            // An operator named this release for the deployment: meant, as a rollback is.
            Some(crate::releases::Kind::Rollback)
        };
        let mut claim = claim::claim(latest.as_ref(), bundle, self.shared());
        if claim == Claim::Busy && act.is_some() {
            // Published for the whole fleet: every server serves it, none waits.
            claim = Claim::Start;
        }
        if claim != Claim::Start {
            tx.commit().await?;
            return Ok(claim);
        }
        let now = now_ms();
        let plan = self.plan();
        let mut previous = store::last_completed_version(&mut *tx, &self.line).await?;
        if previous.is_none() && !self.line.is_empty() {
            // A new deployment's agents come from `default`: what they ran there is
            // what its first rollout moves them from (and keeps accepted until their
            // wave opens).
            previous = store::last_completed_version(&mut *tx, "").await?;
        }
        let meant = act == Some(crate::releases::Kind::Rollback);
        let (state, reason, cause) = initial_state(&bundle.version, previous.as_ref(), meant);
        let new = NewRollout {
            kind: Kind::Bundle,
            group: &self.line,
            target: &bundle.sha256,
            signed_at: bundle.signed_at,
            version: Some(&bundle.version),
            previous: previous.as_ref(),
            state,
            reason: reason.as_deref(),
            halt_cause: cause.map(HaltCause::as_str),
            plan: &plan,
            now,
        };
        let since = now / 1000 - i64::try_from(plan.agent_deadline).unwrap_or(i64::MAX);
        let on_target = |version: &str| {
            version
                .parse::<AgentVersion>()
                .is_ok_and(|v| self.policy.accepts(&bundle.version, &v))
        };
        // Only the agents that follow this deployment are placed (their labels say which).
        let single = self.table.is_single();
        let candidates: Vec<Candidate> = store::live_agents(&mut *tx, since)
            .await?
            .into_iter()
            .filter(|a| single || self.follows(&a.labels))
            .map(|a| Candidate {
                on_target: on_target(&a.version),
                id: a.id,
                group: a.group,
            })
            .collect();
        // The agents already running the new target (a rollback to the version they
        // run): what they said of moving to another release (retrying it, held off,
        // waiting for a window) is over. One statement for the fleet.
        store::clear_pending_status(&mut *tx, &bundle.version.to_string()).await?;
        let started = self
            .engine
            .start(&mut tx, &new, &bundle.sha256, &candidates, |placed| {
                format!(
                    "{} -> {}, {placed} agents placed in {} waves ({})",
                    previous
                        .as_ref()
                        .map(ToString::to_string)
                        .unwrap_or_else(|| "no previous version".into()),
                    bundle.version,
                    plan.wave_count(),
                    plan.waves
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })
            .await?;
        let Some((id, detail)) = started else {
            tx.commit().await?;
            return Ok(Claim::Ours);
        };
        if state == State::Completed {
            // The previous version again: nothing to roll out.
            if let Some(row) = store::lock::<Bundle>(&mut *tx, self.db().backend(), id).await? {
                let server = self.engine.server();
                for w in 1..=plan.wave_count() {
                    store::apply(&mut tx, &row, &Decision::OpenWave(w), now, server).await?;
                    store::apply(&mut tx, &row, &Decision::CompleteWave(w), now, server).await?;
                }
                store::apply(&mut tx, &row, &Decision::Complete, now, server).await?;
            }
        }
        tx.commit().await?;
        match state {
            State::Halted => {
                if let Some(cause) = cause {
                    self.engine.count_halt(cause);
                }
                tracing::warn!(
                    rollout = id,
                    "rollout of {} starts halted: {}",
                    bundle.version,
                    reason.unwrap_or_default()
                );
            }
            State::Completed => tracing::info!(
                rollout = id,
                "rollout of {} completed at once: it is the previous version",
                bundle.version
            ),
            _ => tracing::info!(rollout = id, "rollout started: {detail}"),
        }
        Ok(Claim::Start)
    }

    /// Reads the fleet's rollout again (another server may have moved it on).
    pub async fn refresh(&self) -> Result<(), FleetError> {
        let latest = store::latest::<Bundle>(self.db().pool(), &self.line).await?;
        let served = lock(&self.served).clone();
        let mismatch = served
            .as_ref()
            .and_then(|s| claim::mismatch(latest.as_ref(), s, self.shared()));
        let mismatch_changed;
        {
            let mut slot = self.mismatch.write().unwrap_or_else(|p| p.into_inner());
            mismatch_changed = *slot != mismatch;
            if *slot != mismatch {
                match &mismatch {
                    Some(m) => tracing::warn!("{m}"),
                    None if slot.is_some() => {
                        tracing::info!("this server's bundle is the fleet's rollout again")
                    }
                    None => {}
                }
                *slot = mismatch;
            }
        }
        let moved = {
            let before = self.current();
            let shape = |r: &RolloutRow| (r.id, r.state, r.opened, r.subject.version.clone());
            before.as_deref().map(shape) != latest.as_ref().map(shape)
        };
        // A new rollout: every agent placed at its start is read in once, so that its
        // heartbeats cost no read, and so that an outage of the database finds each
        // one's wave here. Agents that join later are read (and kept) one by one.
        if let Some(row) = &latest {
            self.engine.keep(&[row.id]).await?;
        }
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = latest.map(Arc::new);
        if moved || mismatch_changed {
            self.news.publish("the rollout moved");
        }
        Ok(())
    }

    /// Times out the agents past their deadline and applies every transition that is
    /// due, in one write transaction; logs each once, after it is committed.
    pub async fn decide(&self) -> Result<(), FleetError> {
        let Some(current) = self.current() else {
            return Ok(());
        };
        if matches!(current.state, State::Halted | State::Completed) {
            return Ok(());
        }
        if self.engine.decide(current.id).await? {
            self.refresh().await?;
        }
        self.sweep_no_bundle().await?;
        self.sweep_windows().await
    }

    /// Once per wave that opens: the agents of the open waves whose platform (a target
    /// triple) the served release has no bundle for, nor a static musl one of its
    /// architecture, are recorded `NO_BUNDLE` without waiting for them to come (an agent
    /// that comes is recorded so by [`Rollouts::answer`] as well).
    async fn sweep_no_bundle(&self) -> Result<(), FleetError> {
        let served = lock(&self.served).clone();
        let (Some(current), Some(served)) = (self.current(), served) else {
            return Ok(());
        };
        let key = (current.id, current.opened);
        if served.platforms.is_empty()
            || current.subject.sha256 != served.sha256
            || current.opened == 0
            || !matches!(current.state, State::Running | State::Soaking)
            || *lock(&self.swept) == Some(key)
        {
            return Ok(());
        }
        let now = now_ms();
        for (agent, platform) in
            store::undecided_platforms(self.db().pool(), current.id, current.opened).await?
        {
            if agent_protocol::platform::is_target(&platform)
                && agent_protocol::platform::choose(&served.platforms, &platform).is_none()
            {
                self.no_bundle(&current, &agent, now).await?;
            }
        }
        *lock(&self.swept) = Some(key);
        Ok(())
    }

    /// The directive for an agent of version `version`, placing it in a wave the first
    /// time this rollout sees it. Without a rollout (no bundle has been served yet),
    /// `None`. `servable`: whether the release has a bundle the agent's platform runs;
    /// an agent it has none for is never refused (nothing could update it): when its
    /// wave opens it is accepted as it is and recorded `NO_BUNDLE`, done in its wave
    /// and no failure.
    pub async fn answer(
        &self,
        agent: &str,
        group: &str,
        version: &AgentVersion,
        servable: bool,
    ) -> Result<Option<Answer>, FleetError> {
        let served = lock(&self.served).clone();
        let (Some(current), Some(served)) = (self.current(), served) else {
            return Ok(None);
        };
        if self.mismatch().is_some() {
            return Ok(Some(self.not_ours(&current, served, version)));
        }
        let on_target = self.policy.accepts(&current.subject.version, version);
        let member = self
            .engine
            .membership(&current, agent, group, on_target)
            .await?;
        let accepted = self.accepts(&current, version, member.wave);
        let now = now_ms();
        // Running the target counts as done for an agent that had it before it was
        // told; one that was told is done when it reports INSTALLED (committed, after
        // its stability window), not when it first calls in on the new version.
        if on_target && !member.done && !member.told {
            self.installed_by_running(&current, agent, now).await?;
        }
        if !accepted && !servable {
            if !member.done {
                self.no_bundle(&current, agent, now).await?;
            }
            return Ok(Some(Answer {
                accepted: true,
                expected: current.subject.version.clone(),
                no_bundle: true,
                window: None,
            }));
        }
        if !accepted {
            // Its maintenance window is closed: accepted as it is, told of the release
            // and the window's start, and told (refused) when the window opens.
            if let Some(opens) = self.window_wait(&current, group, &member, now).await? {
                self.wait_for_window(&current, agent, opens).await?;
                return Ok(Some(Answer {
                    accepted: true,
                    expected: current.subject.version.clone(),
                    no_bundle: false,
                    window: Some(opens),
                }));
            }
            self.window_passed(agent);
        }
        if !accepted && !member.told {
            self.engine.mark_told(current.id, agent, now).await?;
        }
        Ok(Some(Answer {
            accepted,
            expected: current.subject.version.clone(),
            no_bundle: false,
            window: None,
        }))
    }

    /// Records `agent` as `NO_BUNDLE` in the rollout and in its own row.
    async fn no_bundle(
        &self,
        current: &RolloutRow,
        agent: &str,
        now: i64,
    ) -> Result<(), FleetError> {
        let why = format!(
            "the release of {} has no bundle for this agent's platform (nor a static musl one of its architecture); it keeps its version",
            current.subject.version
        );
        store::set_agent_update_status(self.db().pool(), agent, store::NO_BUNDLE, &why).await?;
        self.engine
            .outcome(current.id, agent, store::NO_BUNDLE, Some(&why), now)
            .await?;
        tracing::info!(agent = %agent, rollout = current.id, "NO_BUNDLE: {why}");
        Ok(())
    }

    /// Whether the directive for `agent`, as this server last read the rollout and the
    /// agent's wave, refuses `version`: no query, nothing recorded. False when this
    /// server does not know the agent's wave (or the rollout is not its own), and while
    /// the maintenance windows of `group` are closed.
    pub fn would_refuse(&self, agent: &str, group: &str, version: &AgentVersion) -> bool {
        let (Some(current), true) = (self.current(), lock(&self.served).is_some()) else {
            return false;
        };
        if self.mismatch().is_some() {
            return false;
        }
        self.engine
            .known(current.id, agent)
            .is_some_and(|m| !self.accepts(&current, version, m.wave))
            && self.window_wait_offline(group).is_none()
    }

    /// For agents that are offered the bundle instead of being refused (OpAMP's
    /// `AcceptsPackages` agents): the rollout's target when the agent's wave is open
    /// and it does not run the target yet (`version`, if it says one). Places the agent
    /// in a wave the first time, like [`Rollouts::answer`]; an offer counts as telling
    /// it (its deadline starts), and running the target counts as installed.
    ///
    /// `servable`: whether the release has a bundle the agent runs; one it has none for
    /// is offered nothing and, once its wave opens, recorded `NO_BUNDLE`.
    pub async fn offer(
        &self,
        agent: &str,
        group: &str,
        version: Option<&AgentVersion>,
        servable: bool,
    ) -> Result<Option<AgentVersion>, FleetError> {
        let (Some(current), true) = (self.current(), lock(&self.served).is_some()) else {
            return Ok(None);
        };
        if self.mismatch().is_some() {
            return Ok(None);
        }
        let on_target = version.is_some_and(|v| self.policy.accepts(&current.subject.version, v));
        let member = self
            .engine
            .membership(&current, agent, group, on_target)
            .await?;
        let now = now_ms();
        if on_target {
            if !member.done && !member.told {
                self.installed_by_running(&current, agent, now).await?;
            }
            return Ok(None);
        }
        let open = current.state != State::Halted && member.wave <= current.opened;
        if !open {
            return Ok(None);
        }
        if !servable {
            if !member.done {
                self.no_bundle(&current, agent, now).await?;
            }
            return Ok(None);
        }
        // Offered its package only inside its maintenance window.
        if let Some(opens) = self.window_wait(&current, group, &member, now).await? {
            self.wait_for_window(&current, agent, opens).await?;
            return Ok(None);
        }
        self.window_passed(agent);
        if !member.told {
            self.engine.mark_told(current.id, agent, now).await?;
        }
        Ok(Some(current.subject.version.clone()))
    }

    /// Records `agent` installed: running the target proves the install, even if its
    /// report got lost.
    async fn installed_by_running(
        &self,
        current: &RolloutRow,
        agent: &str,
        now: i64,
    ) -> Result<(), FleetError> {
        self.engine
            .outcome(current.id, agent, store::INSTALLED, None, now)
            .await
    }

    /// Not this server's rollout: refuse no one on a version of the fleet, and send the
    /// others to what this server can serve.
    fn not_ours(&self, current: &RolloutRow, served: Served, version: &AgentVersion) -> Answer {
        let fleet = [
            Some(&current.subject.version),
            current.subject.previous.as_ref(),
        ];
        let accepted = self.policy.accepts(&served.version, version)
            || fleet
                .into_iter()
                .flatten()
                .any(|v| self.policy.accepts(v, version));
        Answer {
            accepted,
            expected: served.version,
            no_bundle: false,
            window: None,
        }
    }

    fn accepts(&self, current: &RolloutRow, version: &AgentVersion, wave: u32) -> bool {
        Directive {
            target: &current.subject.version,
            previous: current.subject.previous.as_ref(),
            state: current.state,
            opened: current.opened,
        }
        .accepts(&self.policy, version, wave)
    }

    /// The directive while the fleet database is unreachable: the rollout as last read,
    /// and the agent's wave as this server last knew it. An agent this server has not
    /// placed yet is treated as one of the next wave to open, so an outage never
    /// refuses an agent the rollout has not reached. Returns the `409` to record (the
    /// rollout's id) when this is the agent's first.
    pub fn answer_offline(
        &self,
        agent: &str,
        group: &str,
        version: &AgentVersion,
        servable: bool,
    ) -> (Option<Answer>, Option<i64>) {
        let served = lock(&self.served).clone();
        let (Some(current), Some(served)) = (self.current(), served) else {
            return (None, None);
        };
        if self.mismatch().is_some() {
            return (Some(self.not_ours(&current, served, version)), None);
        }
        let known = self.engine.known(current.id, agent);
        let wave = known.map_or(current.opened.saturating_add(1), |m| m.wave);
        let accepted = self.accepts(&current, version, wave);
        if !accepted && !servable {
            // Recorded when the database is back and the agent comes again.
            return (
                Some(Answer {
                    accepted: true,
                    expected: current.subject.version.clone(),
                    no_bundle: true,
                    window: None,
                }),
                None,
            );
        }
        if !accepted && let Some(opens) = self.window_wait_offline(group) {
            return (
                Some(Answer {
                    accepted: true,
                    expected: current.subject.version.clone(),
                    no_bundle: false,
                    window: Some(opens),
                }),
                None,
            );
        }
        let mut told = None;
        if !accepted && known.is_some_and(|m| !m.told) {
            self.engine.remember(current.id, agent, |m| m.told = true);
            told = Some(current.id);
        }
        (
            Some(Answer {
                accepted,
                expected: current.subject.version.clone(),
                no_bundle: false,
                window: None,
            }),
            told,
        )
    }

    /// An `INSTALLED` or `INSTALL_FAILED` for the rollout's target counts in its wave;
    /// `at` (unix milliseconds) is when it was received.
    pub async fn report(&self, report: &Report, at: i64) -> Result<(), FleetError> {
        self.reports(&[(report, at)]).await
    }

    /// [`Rollouts::report`] for reports in the order they came (written from a
    /// server's queue): an agent's last one counts.
    pub async fn reports(&self, reports: &[(&Report, i64)]) -> Result<(), FleetError> {
        let Some(current) = self.current() else {
            return Ok(());
        };
        let counted: Vec<(&Report, &'static str, i64)> = reports
            .iter()
            .filter_map(|&(report, at)| Some((report, counted_outcome(report, &current)?, at)))
            .collect();
        let counted = crate::db::latest_per_agent(&counted, |(r, _, _)| r.id.as_str());
        let mut told = Vec::with_capacity(counted.len());
        for &(report, outcome, at) in &counted {
            // Every deployment's rollouts hear every report, and two deployments may roll
            // out one release: a report places no agent, or an agent of one deployment
            // would join the other's rollout as done. An agent this rollout never placed
            // is placed when it next calls in (running the target, it is done then).
            let Some(member) = self.engine.placed(&current, &report.id).await? else {
                tracing::debug!(
                    agent = %report.id,
                    to = %report.to,
                    "a report from an agent this rollout never placed: not counted in it"
                );
                continue;
            };
            // Only what this rollout told the agent counts toward its wave: a report of
            // a release the agent was never sent (made up, or from an update an operator
            // ran by hand) is the agent's news, not the release's verdict.
            if member.told {
                told.push((report, outcome, at));
            } else {
                tracing::info!(
                    agent = %report.id,
                    to = %report.to,
                    status = report.status.as_str(),
                    "a report of a release this rollout did not tell the agent: recorded against the agent, not counted in the rollout"
                );
            }
        }
        let outcomes: Vec<store::Outcome<'_>> = told
            .iter()
            .map(|&(report, outcome, at)| store::Outcome {
                agent: &report.id,
                outcome,
                error: report.error.as_deref(),
                at,
            })
            .collect();
        self.engine.outcomes(current.id, &outcomes).await
    }

    /// Records a `409` given while the database was away.
    pub async fn record_told(&self, rollout: i64, agent: &str, at: i64) -> Result<(), FleetError> {
        self.record_told_many(&[(rollout, agent, at)]).await
    }

    /// Records `409`s given while the database was away or busy, in the order they
    /// were given (rollout, agent, when): the first to each agent counts.
    pub async fn record_told_many(&self, told: &[(i64, &str, i64)]) -> Result<(), FleetError> {
        let mut by_rollout: std::collections::BTreeMap<i64, Vec<(&str, i64)>> =
            std::collections::BTreeMap::new();
        let mut seen = std::collections::HashSet::new();
        for &(rollout, agent, at) in told {
            if seen.insert((rollout, agent)) {
                by_rollout.entry(rollout).or_default().push((agent, at));
            }
        }
        for (rollout, agents) in by_rollout {
            store::mark_told_many(self.db().pool(), self.db().backend(), rollout, &agents).await?;
            for (agent, _) in agents {
                self.engine.remember(rollout, agent, |m| m.told = true);
            }
        }
        Ok(())
    }

    /// `POST /admin/rollout/halt`.
    pub async fn halt(&self, why: Option<&str>) -> Result<Result<(), Refusal>, FleetError> {
        self.operator(|row, _| Engine::<Bundle>::halt_decision(row.state, why))
            .await
    }

    /// `POST /admin/rollout/advance`: the next wave opens now.
    pub async fn advance(&self) -> Result<Result<(), Refusal>, FleetError> {
        self.operator(|row, progress| step::advance(&row.plan, progress).map_err(Refusal))
            .await
    }

    /// `POST /admin/rollout/resume`: a halted rollout goes on; the failures seen so far
    /// are let go (only later ones count against `max-failures`).
    pub async fn resume(&self) -> Result<Result<(), Refusal>, FleetError> {
        let Some(current) = self.current() else {
            return Ok(Err(Refusal(NO_ROLLOUT.into())));
        };
        let result = self.engine.resume(current.id, NO_ROLLOUT).await?;
        self.refresh().await?;
        self.decide().await?;
        Ok(result)
    }

    /// Applies an operator's decision to the fleet's rollout.
    async fn operator(
        &self,
        choose: impl FnOnce(&RolloutRow, &step::Progress) -> Result<Decision, Refusal>,
    ) -> Result<Result<(), Refusal>, FleetError> {
        let Some(current) = self.current() else {
            return Ok(Err(Refusal(NO_ROLLOUT.into())));
        };
        let result = self.engine.operator(current.id, NO_ROLLOUT, choose).await?;
        self.refresh().await?;
        self.decide().await?;
        Ok(result)
    }

    /// `GET /admin/rollout`: the fleet's rollout with each wave's counts.
    pub async fn status(&self) -> Result<Option<serde_json::Value>, FleetError> {
        let Some(row) = store::latest::<Bundle>(self.db().pool(), &self.line).await? else {
            return Ok(None);
        };
        let mut conn = self.db().pool().acquire().await?;
        let (_, mut status) = self.engine.status(&mut conn, &row, "installed").await?;
        let b = &row.subject;
        for (key, value) in [
            ("version", json!(b.version.to_string())),
            (
                "previous",
                json!(b.previous.as_ref().map(ToString::to_string)),
            ),
            ("sha256", json!(b.sha256)),
            ("signed_at", json!(b.signed_at)),
            ("plan", plan_json(&row.plan)),
            ("mismatch", json!(self.mismatch())),
        ] {
            status.insert(key.to_owned(), value);
        }
        Ok(Some(serde_json::Value::Object(status)))
    }

    /// Every agent's wave and `told_at` (seconds) in the fleet's rollout.
    pub async fn members(&self) -> Result<HashMap<String, (u32, Option<f64>)>, FleetError> {
        let Some(current) = self.current() else {
            return Ok(HashMap::new());
        };
        Ok(store::members(self.db().pool(), current.id)
            .await?
            .into_iter()
            .map(|(id, (wave, told))| (id, (wave, told.map(secs))))
            .collect())
    }

    /// Per-wave counts of the fleet's rollout, for `/metrics`.
    pub async fn wave_counts(&self) -> Result<Vec<step::WaveStatus>, FleetError> {
        let Some(current) = self.current() else {
            return Ok(Vec::new());
        };
        self.engine.waves(&current).await
    }
}

/// How a rollout of `target` starts after `previous`: the previous version again simply
/// completes; an older one (a downgrade, however recently signed) starts halted, unless
/// it is an operator's `release rollback` (`rollback_meant`).
fn initial_state(
    target: &AgentVersion,
    previous: Option<&AgentVersion>,
    rollback_meant: bool,
) -> (State, Option<String>, Option<HaltCause>) {
    match previous {
        Some(p) if p == target => (State::Completed, None, None),
        Some(p) if step::is_downgrade(target, p) && !rollback_meant => (
            State::Halted,
            Some(format!(
                "downgrade: {target} is older than the previous version {p}; `update-server rollout resume` rolls it out anyway"
            )),
            Some(HaltCause::Downgrade),
        ),
        _ => (State::Running, None, None),
    }
}

/// The outcome `report` records in `current`: an `INSTALLED` or `INSTALL_FAILED` for
/// its target. Any other status is the machine's fault or progress: the agent tries
/// again, and only its deadline counts.
fn counted_outcome(report: &Report, current: &RolloutRow) -> Option<&'static str> {
    let outcome = match report.status {
        UpdateStatus::Installed => store::INSTALLED,
        UpdateStatus::InstallFailed => store::INSTALL_FAILED,
        UpdateStatus::Installing
        | UpdateStatus::Retrying
        | UpdateStatus::Deferred
        | UpdateStatus::WaitingWindow => return None,
    };
    let target = report.to.parse::<AgentVersion>().ok();
    (target.as_ref() == Some(&current.subject.version)).then_some(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_downgrade_starts_halted_and_the_previous_version_completes() {
        let v = |s: &str| s.parse::<AgentVersion>().unwrap();
        assert_eq!(initial_state(&v("2.0.0+2"), None, false).0, State::Running);
        assert_eq!(
            initial_state(&v("2.0.0+2"), Some(&v("1.0.0+1")), false).0,
            State::Running
        );
        let (state, reason, cause) = initial_state(&v("1.0.0+1"), Some(&v("2.0.0+2")), false);
        assert_eq!(
            initial_state(&v("1.0.0+1"), Some(&v("2.0.0+2")), true).0,
            State::Running,
            "an operator's release rollback runs at once"
        );
        assert_eq!(state, State::Halted);
        assert!(reason.unwrap().starts_with("downgrade: "));
        assert_eq!(cause, Some(HaltCause::Downgrade));
        assert_eq!(
            initial_state(&v("2.0.0+2"), Some(&v("2.0.0+2")), false).0,
            State::Completed
        );
    }
}
