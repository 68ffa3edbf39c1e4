//! Staged rollouts: a bundle that appears in the download directory reaches the fleet in
//! waves, and the rollout halts by itself when too many agents fail.
//!
//! - [`plan`]: `[rollout]` as a plan (waves, soak, threshold, deadline);
//! - [`claim`]: whether a served bundle may start a rollout (one at a time per fleet);
//! - [`order`]: which agent is in which wave, the same on every server;
//! - [`step`]: what happens next and the directive for one agent, pure functions of what
//!   was observed and the time;
//! - [`store`]: the rows in the fleet database and the guarded writes;
//! - [`Rollouts`] (here): feeds the step function from the database, applies its
//!   decisions in one write transaction each, and answers the directive from what it
//!   last read, so a heartbeat costs no query once an agent's wave is known.
//!
//! It owns the `rollout*` tables. It never decides for a bundle it was not told about
//! and never changes an agent's row except its update status on a missed deadline.

pub mod claim;
pub mod order;
pub mod plan;
pub mod step;
pub mod store;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use agent_protocol::wire::{Report, UpdateStatus};
use agent_protocol::{AcceptPolicy, AgentVersion};
use serde_json::json;

use crate::db::{Backend, Db, now_ms};
use crate::error::FleetError;
use crate::news::News;
use crate::rollout::claim::Claim;
use crate::rollout::order::Member;
use crate::rollout::plan::Plan;
use crate::rollout::step::{Decision, Directive, HaltCause, State};
use crate::rollout::store::{BUNDLES, Membership, NewRollout, RolloutRow};

/// The bundle this server serves, as a rollout knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    pub sha256: String,
    /// `signed-at` of its signature; 0 without one.
    pub signed_at: i64,
    pub version: AgentVersion,
}

/// The directive for one agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub accepted: bool,
    /// The version a refused agent must run.
    pub expected: AgentVersion,
}

/// An operator's request that cannot be done now, with the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal(pub String);

pub struct Rollouts {
    db: Db,
    plan: Plan,
    policy: AcceptPolicy,
    server: String,
    current: RwLock<Option<Arc<RolloutRow>>>,
    /// Agents' places in the rollout whose id is the first field. A wave never changes
    /// once given; `told` and `done` only become true.
    members: Mutex<(i64, HashMap<String, Membership>)>,
    served: Mutex<Option<Served>>,
    /// The served bundle waits for the fleet's rollout to end before it starts its own.
    waiting: AtomicBool,
    mismatch: RwLock<Option<String>>,
    /// One decision at a time from this process (the database orders the servers).
    deciding: tokio::sync::Mutex<()>,
    /// Halts this server decided, by cause.
    halts: [AtomicU64; 3],
    /// Woken by a report, so the decision that may follow is not a tick away.
    wake: tokio::sync::Notify,
    /// Told whenever the rollout as this server sees it moves, so held connects look again.
    news: Arc<News>,
}

/// The PostgreSQL advisory lock that orders rollout starts across servers ("rollout").
const START_LOCK: i64 = 0x0072_6f6c_6c6f_7574;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn secs(ms: i64) -> f64 {
    ms as f64 / 1000.0
}

impl Rollouts {
    pub fn new(db: Db, plan: Plan, policy: AcceptPolicy, server: String) -> Self {
        Self {
            db,
            plan,
            policy,
            server,
            current: RwLock::new(None),
            members: Mutex::new((0, HashMap::new())),
            served: Mutex::new(None),
            waiting: AtomicBool::new(false),
            mismatch: RwLock::new(None),
            deciding: tokio::sync::Mutex::new(()),
            halts: Default::default(),
            wake: tokio::sync::Notify::new(),
            news: Arc::default(),
        }
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
        self.halts[cause as usize].load(Ordering::Relaxed)
    }

    /// Resolves when a report may have changed what happens next.
    pub async fn woken(&self) {
        self.wake.notified().await;
    }

    /// Several servers share this fleet (and may serve different bundles).
    fn shared(&self) -> bool {
        self.db.backend() == Backend::Postgres
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
        let _one = self.deciding.lock().await;
        let mut tx = self.db.begin_write().await?;
        if self.shared() {
            // Two servers given two new bundles at once must not both see the fleet
            // idle and start one each; SQLite's BEGIN IMMEDIATE already orders them.
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(START_LOCK)
                .execute(&mut *tx)
                .await?;
        }
        if store::find(&mut *tx, &bundle.sha256, bundle.signed_at)
            .await?
            .is_some()
        {
            tx.commit().await?;
            return Ok(Claim::Ours);
        }
        let latest = store::latest(&mut *tx).await?;
        let claim = claim::claim(latest.as_ref(), bundle, self.shared());
        if claim != Claim::Start {
            tx.commit().await?;
            return Ok(claim);
        }
        let now = now_ms();
        let previous = store::last_completed_version(&mut *tx).await?;
        let (state, reason, cause) = initial_state(&bundle.version, previous.as_ref());
        let new = NewRollout {
            sha256: &bundle.sha256,
            signed_at: bundle.signed_at,
            version: &bundle.version,
            previous: previous.as_ref(),
            state,
            reason: reason.as_deref(),
            halt_cause: cause.map(HaltCause::as_str),
            plan: &self.plan,
            now,
        };
        let Some(id) = store::insert(&mut tx, &new).await? else {
            tx.commit().await?;
            return Ok(Claim::Ours);
        };
        let since = now / 1000 - i64::try_from(self.plan.agent_deadline).unwrap_or(i64::MAX);
        let live = store::live_agents(&mut *tx, since).await?;
        let members: Vec<Member> = live
            .iter()
            .map(|(id, group, _)| Member {
                id: id.clone(),
                group: group.clone(),
            })
            .collect();
        let waves = order::assign(&self.plan, &bundle.sha256, &members);
        let rows: Vec<(String, u32, bool)> = live
            .iter()
            .zip(&waves)
            .map(|((id, _, version), wave)| {
                let done = version
                    .parse::<AgentVersion>()
                    .is_ok_and(|v| self.policy.accepts(&bundle.version, &v));
                (id.clone(), *wave, done)
            })
            .collect();
        store::insert_members(&mut tx, BUNDLES, id, &rows, now).await?;
        let detail = format!(
            "{} -> {}, {} agents placed in {} waves ({})",
            previous
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_else(|| "no previous version".into()),
            bundle.version,
            rows.len(),
            self.plan.wave_count(),
            self.plan
                .waves
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        );
        store::event(
            &mut *tx,
            BUNDLES,
            id,
            "started",
            0,
            &detail,
            now,
            &self.server,
        )
        .await?;
        if state == State::Completed {
            // The previous version again: nothing to roll out.
            let row = store::lock(&mut *tx, self.db.backend(), id).await?;
            if let Some(row) = row {
                for w in 1..=self.plan.wave_count() {
                    store::apply(
                        &mut tx,
                        BUNDLES,
                        &row.head(),
                        &Decision::OpenWave(w),
                        now,
                        &self.server,
                    )
                    .await?;
                    store::apply(
                        &mut tx,
                        BUNDLES,
                        &row.head(),
                        &Decision::CompleteWave(w),
                        now,
                        &self.server,
                    )
                    .await?;
                }
                store::apply(
                    &mut tx,
                    BUNDLES,
                    &row.head(),
                    &Decision::Complete,
                    now,
                    &self.server,
                )
                .await?;
            }
        }
        tx.commit().await?;
        match state {
            State::Halted => {
                if let Some(cause) = cause {
                    self.halts[cause as usize].fetch_add(1, Ordering::Relaxed);
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
        let latest = store::latest(self.db.pool()).await?;
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
            let shape = |r: &RolloutRow| (r.id, r.state, r.opened, r.version.clone());
            before.as_deref().map(shape) != latest.as_ref().map(shape)
        };
        let latest = latest.map(Arc::new);
        // A new rollout: every agent placed at its start is read in once, so that its
        // heartbeats cost no read, and so that an outage of the database finds each
        // one's wave here. Agents that join later are read (and kept) one by one.
        if let Some(row) = &latest
            && lock(&self.members).0 != row.id
        {
            let placed = store::memberships(self.db.pool(), BUNDLES, row.id).await?;
            let mut members = lock(&self.members);
            if members.0 != row.id {
                *members = (row.id, placed);
            }
        }
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = latest;
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
        let _one = self.deciding.lock().await;
        if !self.due(current.id).await? {
            return Ok(());
        }
        let mut tx = self.db.begin_write().await?;
        let Some(mut row) = store::lock(&mut *tx, self.db.backend(), current.id).await? else {
            tx.commit().await?;
            return Ok(());
        };
        if matches!(row.state, State::Halted | State::Completed) {
            tx.commit().await?;
            return self.refresh().await;
        }
        let now = now_ms();
        let timed_out = store::time_out(&mut tx, BUNDLES, row.id, &row.plan, now).await?;
        let mut decided = Vec::new();
        // Each wave opens and completes at most once, plus a soak, a halt, the end.
        let most = 3 * row.plan.waves.len() + 3;
        while decided.len() < most {
            let progress = store::progress(&mut tx, BUNDLES, &row.head()).await?;
            let Some(decision) = step::next(&row.plan, &progress, now) else {
                break;
            };
            if !store::apply(&mut tx, BUNDLES, &row.head(), &decision, now, &self.server).await? {
                break;
            }
            decided.push((decision, progress));
            match store::lock(&mut *tx, self.db.backend(), row.id).await? {
                Some(r) => row = r,
                None => break,
            }
        }
        tx.commit().await?;
        for agent in &timed_out {
            tracing::warn!(
                rollout = row.id,
                agent = %agent,
                "agent missed its deadline ({} s after it was told): TIMED_OUT",
                row.plan.agent_deadline
            );
        }
        for (decision, progress) in &decided {
            self.log_decision(&row, decision, progress);
        }
        if !decided.is_empty() || !timed_out.is_empty() {
            self.refresh().await?;
        }
        Ok(())
    }

    /// Whether anything is due in rollout `id`: an agent past its deadline or a
    /// transition. Most looks (one per report) find nothing; this one reads without the
    /// write lock, so on SQLite the reports themselves are not held up behind it. What
    /// it finds due is read again under the lock before anything is written.
    async fn due(&self, id: i64) -> Result<bool, FleetError> {
        let mut tx = self.db.pool().begin().await?;
        let now = now_ms();
        let due = match store::get(&mut *tx, id).await? {
            None => false,
            Some(row) if matches!(row.state, State::Halted | State::Completed) => false,
            Some(row) => {
                store::overdue(&mut tx, BUNDLES, row.id, &row.plan, now).await? || {
                    let progress = store::progress(&mut tx, BUNDLES, &row.head()).await?;
                    step::next(&row.plan, &progress, now).is_some()
                }
            }
        };
        tx.rollback().await?;
        Ok(due)
    }

    fn log_decision(&self, row: &RolloutRow, decision: &Decision, progress: &step::Progress) {
        let version = &row.version;
        match decision {
            Decision::OpenWave(w) => tracing::info!(
                rollout = row.id,
                "rollout of {version}: wave {w} of {} opened ({})",
                row.plan.wave_count(),
                row.plan
                    .spec(*w)
                    .map(ToString::to_string)
                    .unwrap_or_default()
            ),
            Decision::CompleteWave(w) => {
                let s = progress
                    .waves
                    .get(*w as usize - 1)
                    .cloned()
                    .unwrap_or_default();
                tracing::info!(
                    rollout = row.id,
                    "rollout of {version}: wave {w} completed ({} agents: {} installed, {} failed, {} timed out)",
                    s.agents,
                    s.installed,
                    s.failed,
                    s.timed_out
                );
            }
            Decision::Soak(w) => tracing::info!(
                rollout = row.id,
                "rollout of {version}: wave {w} soaks for {} s before the next opens",
                row.plan.wave_wait
            ),
            Decision::Halt { cause, reason } => {
                self.halts[*cause as usize].fetch_add(1, Ordering::Relaxed);
                tracing::warn!(rollout = row.id, "rollout of {version} halted: {reason}");
            }
            Decision::Complete => tracing::info!(
                rollout = row.id,
                "rollout of {version} completed: every wave is done"
            ),
        }
    }

    /// The directive for an agent of version `version`, placing it in a wave the first
    /// time this rollout sees it. Without a rollout (no bundle has been served yet),
    /// `None`.
    pub async fn answer(
        &self,
        agent: &str,
        group: &str,
        version: &AgentVersion,
    ) -> Result<Option<Answer>, FleetError> {
        let served = lock(&self.served).clone();
        let (Some(current), Some(served)) = (self.current(), served) else {
            return Ok(None);
        };
        if self.mismatch().is_some() {
            return Ok(Some(self.not_ours(&current, served, version)));
        }
        let on_target = self.policy.accepts(&current.version, version);
        let member = self.membership(&current, agent, group, on_target).await?;
        let accepted = self.accepts(&current, version, member.wave);
        let now = now_ms();
        if on_target && !member.done {
            self.installed_by_running(&current, agent, now).await?;
        }
        if !accepted && !member.told {
            self.mark_told(&current, agent, now).await?;
        }
        Ok(Some(Answer {
            accepted,
            expected: current.version.clone(),
        }))
    }

    /// Whether the directive for `agent`, as this server last read the rollout and the
    /// agent's wave, refuses `version`: no query, nothing recorded. False when this
    /// server does not know the agent's wave (or the rollout is not its own).
    pub fn would_refuse(&self, agent: &str, version: &AgentVersion) -> bool {
        let (Some(current), true) = (self.current(), lock(&self.served).is_some()) else {
            return false;
        };
        if self.mismatch().is_some() {
            return false;
        }
        let wave = {
            let members = lock(&self.members);
            (members.0 == current.id)
                .then(|| members.1.get(agent).map(|m| m.wave))
                .flatten()
        };
        wave.is_some_and(|wave| !self.accepts(&current, version, wave))
    }

    /// For agents that are offered the bundle instead of being refused (OpAMP's
    /// `AcceptsPackages` agents): the rollout's target when the agent's wave is open
    /// and it does not run the target yet (`version`, if it says one). Places the agent
    /// in a wave the first time, like [`Rollouts::answer`]; an offer counts as telling
    /// it (its deadline starts), and running the target counts as installed.
    pub async fn offer(
        &self,
        agent: &str,
        group: &str,
        version: Option<&AgentVersion>,
    ) -> Result<Option<AgentVersion>, FleetError> {
        let (Some(current), true) = (self.current(), lock(&self.served).is_some()) else {
            return Ok(None);
        };
        if self.mismatch().is_some() {
            return Ok(None);
        }
        let on_target = version.is_some_and(|v| self.policy.accepts(&current.version, v));
        let member = self.membership(&current, agent, group, on_target).await?;
        let now = now_ms();
        if on_target {
            if !member.done {
                self.installed_by_running(&current, agent, now).await?;
            }
            return Ok(None);
        }
        let open = current.state != State::Halted && member.wave <= current.opened;
        if !open {
            return Ok(None);
        }
        if !member.told {
            self.mark_told(&current, agent, now).await?;
        }
        Ok(Some(current.version.clone()))
    }

    /// Records `agent` installed: running the target proves the install, even if its
    /// report got lost.
    async fn installed_by_running(
        &self,
        current: &RolloutRow,
        agent: &str,
        now: i64,
    ) -> Result<(), FleetError> {
        store::set_outcome(
            self.db.pool(),
            BUNDLES,
            current.id,
            agent,
            store::INSTALLED,
            None,
            now,
        )
        .await?;
        self.remember(current.id, agent, |m| m.done = true);
        self.wake.notify_one();
        Ok(())
    }

    /// Records that `agent` was told to update (its deadline starts).
    async fn mark_told(
        &self,
        current: &RolloutRow,
        agent: &str,
        now: i64,
    ) -> Result<(), FleetError> {
        store::mark_told(self.db.pool(), BUNDLES, current.id, agent, now).await?;
        self.remember(current.id, agent, |m| m.told = true);
        Ok(())
    }

    /// Not this server's rollout: refuse no one on a version of the fleet, and send the
    /// others to what this server can serve.
    fn not_ours(&self, current: &RolloutRow, served: Served, version: &AgentVersion) -> Answer {
        let fleet = [Some(&current.version), current.previous.as_ref()];
        let accepted = self.policy.accepts(&served.version, version)
            || fleet
                .into_iter()
                .flatten()
                .any(|v| self.policy.accepts(v, version));
        Answer {
            accepted,
            expected: served.version,
        }
    }

    fn accepts(&self, current: &RolloutRow, version: &AgentVersion, wave: u32) -> bool {
        Directive {
            target: &current.version,
            previous: current.previous.as_ref(),
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
        version: &AgentVersion,
    ) -> (Option<Answer>, Option<i64>) {
        let served = lock(&self.served).clone();
        let (Some(current), Some(served)) = (self.current(), served) else {
            return (None, None);
        };
        if self.mismatch().is_some() {
            return (Some(self.not_ours(&current, served, version)), None);
        }
        let known = {
            let members = lock(&self.members);
            (members.0 == current.id)
                .then(|| members.1.get(agent).copied())
                .flatten()
        };
        let wave = known.map_or(current.opened.saturating_add(1), |m| m.wave);
        let accepted = self.accepts(&current, version, wave);
        let mut told = None;
        if !accepted && known.is_some_and(|m| !m.told) {
            self.remember(current.id, agent, |m| m.told = true);
            told = Some(current.id);
        }
        (
            Some(Answer {
                accepted,
                expected: current.version.clone(),
            }),
            told,
        )
    }

    async fn membership(
        &self,
        current: &RolloutRow,
        agent: &str,
        group: &str,
        on_target: bool,
    ) -> Result<Membership, FleetError> {
        {
            let members = lock(&self.members);
            if members.0 == current.id
                && let Some(m) = members.1.get(agent)
            {
                return Ok(*m);
            }
        }
        let member = match store::membership(self.db.pool(), BUNDLES, current.id, agent).await? {
            Some(m) => m,
            None => {
                let wave = current.plan.join_wave(current.opened, group);
                store::join(
                    self.db.pool(),
                    BUNDLES,
                    current.id,
                    agent,
                    wave,
                    on_target,
                    now_ms(),
                )
                .await?
            }
        };
        let mut members = lock(&self.members);
        if members.0 == current.id {
            members.1.insert(agent.to_owned(), member);
        }
        Ok(member)
    }

    fn remember(&self, rollout: i64, agent: &str, change: impl FnOnce(&mut Membership)) {
        let mut members = lock(&self.members);
        if members.0 == rollout
            && let Some(m) = members.1.get_mut(agent)
        {
            change(m);
        }
    }

    /// An `INSTALLED` or `INSTALL_FAILED` for the rollout's target counts in its wave;
    /// `at` (unix milliseconds) is when it was received.
    pub async fn report(&self, report: &Report, at: i64) -> Result<(), FleetError> {
        let Some(current) = self.current() else {
            return Ok(());
        };
        let outcome = match report.status {
            UpdateStatus::Installed => store::INSTALLED,
            UpdateStatus::InstallFailed => store::INSTALL_FAILED,
            UpdateStatus::Installing => return Ok(()),
        };
        if report.to.parse::<AgentVersion>().ok().as_ref() != Some(&current.version) {
            return Ok(());
        }
        let group = self
            .db
            .agent(&report.id)
            .await?
            .map(|a| a.group)
            .unwrap_or_default();
        let on_target = outcome == store::INSTALLED;
        self.membership(&current, &report.id, &group, on_target)
            .await?;
        store::set_outcome(
            self.db.pool(),
            BUNDLES,
            current.id,
            &report.id,
            outcome,
            report.error.as_deref(),
            at,
        )
        .await?;
        self.remember(current.id, &report.id, |m| m.done = true);
        self.wake.notify_one();
        Ok(())
    }

    /// Records a `409` given while the database was away.
    pub async fn record_told(&self, rollout: i64, agent: &str, at: i64) -> Result<(), FleetError> {
        Ok(store::mark_told(self.db.pool(), BUNDLES, rollout, agent, at).await?)
    }

    /// `POST /admin/rollout/halt`.
    pub async fn halt(&self, why: Option<&str>) -> Result<Result<(), Refusal>, FleetError> {
        let reason = match why {
            Some(w) if !w.trim().is_empty() => format!("halted by an operator: {}", w.trim()),
            _ => "halted by an operator".to_owned(),
        };
        self.operator(|row, _| match row.state {
            State::Running | State::Soaking => Ok(Decision::Halt {
                cause: HaltCause::Operator,
                reason: reason.clone(),
            }),
            State::Halted => Err(Refusal("the rollout is halted already".into())),
            State::Completed => Err(Refusal("the rollout is completed; nothing to halt".into())),
        })
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
            return Ok(Err(Refusal("there is no rollout".into())));
        };
        let result = {
            let _one = self.deciding.lock().await;
            let mut tx = self.db.begin_write().await?;
            let row = store::lock(&mut *tx, self.db.backend(), current.id).await?;
            let result = match row {
                Some(row) if row.state == State::Halted => {
                    let progress = store::progress(&mut tx, BUNDLES, &row.head()).await?;
                    let now = now_ms();
                    store::forgive(&mut tx, BUNDLES, row.id, progress.failures()).await?;
                    store::set_state(&mut tx, BUNDLES, row.id, State::Running, None, None).await?;
                    store::event(
                        &mut *tx,
                        BUNDLES,
                        row.id,
                        "resumed",
                        row.opened,
                        "",
                        now,
                        &self.server,
                    )
                    .await?;
                    tracing::info!(
                        rollout = row.id,
                        "rollout of {} resumed by an operator ({} failures let go)",
                        row.version,
                        progress.failures()
                    );
                    Ok(())
                }
                Some(_) => Err(Refusal("the rollout is not halted".into())),
                None => Err(Refusal("there is no rollout".into())),
            };
            tx.commit().await?;
            result
        };
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
            return Ok(Err(Refusal("there is no rollout".into())));
        };
        let result = {
            let _one = self.deciding.lock().await;
            let mut tx = self.db.begin_write().await?;
            let Some(row) = store::lock(&mut *tx, self.db.backend(), current.id).await? else {
                return Ok(Err(Refusal("there is no rollout".into())));
            };
            let progress = store::progress(&mut tx, BUNDLES, &row.head()).await?;
            let result = match choose(&row, &progress) {
                Ok(decision) => {
                    store::apply(
                        &mut tx,
                        BUNDLES,
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
            result.map(|decision| self.log_decision(&row, &decision, &progress))
        };
        self.refresh().await?;
        self.decide().await?;
        Ok(result)
    }

    /// `GET /admin/rollout`: the fleet's rollout with each wave's counts.
    pub async fn status(&self) -> Result<Option<serde_json::Value>, FleetError> {
        let Some(row) = store::latest(self.db.pool()).await? else {
            return Ok(None);
        };
        let mut conn = self.db.pool().acquire().await?;
        let waves = store::wave_status(&mut conn, BUNDLES, &row.head()).await?;
        let events = store::events(&mut *conn, BUNDLES, row.id).await?;
        let waves: Vec<serde_json::Value> = waves
            .iter()
            .zip(&row.plan.waves)
            .map(|(w, spec)| {
                json!({
                    "size": spec.to_string(),
                    "agents": w.agents,
                    "installed": w.installed,
                    "failed": w.failed,
                    "timed_out": w.timed_out,
                    "pending": w.pending(),
                    "opened_at": w.opened_at.map(secs),
                    "completed_at": w.completed_at.map(secs),
                })
            })
            .collect();
        Ok(Some(json!({
            "version": row.version.to_string(),
            "previous": row.previous.as_ref().map(ToString::to_string),
            "sha256": row.sha256,
            "state": row.state.as_str(),
            "reason": row.reason,
            "wave": row.opened,
            "started_at": secs(row.started_at),
            "waves": waves,
            "completed_at": row.completed_at.map(secs),
            "signed_at": row.signed_at,
            "halt_cause": row.halt_cause,
            "plan": {
                "waves": row.plan.waves.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "wave_wait": row.plan.wave_wait,
                "max_failures": row.plan.max_failures.to_string(),
                "agent_deadline": row.plan.agent_deadline,
            },
            "mismatch": self.mismatch(),
            "events": events.iter().map(|(kind, wave, at, detail, server)| json!({
                "kind": kind, "wave": wave, "at": secs(*at), "detail": detail, "server": server,
            })).collect::<Vec<_>>(),
        })))
    }

    /// Every agent's wave and `told_at` (seconds) in the fleet's rollout.
    pub async fn members(&self) -> Result<HashMap<String, (u32, Option<f64>)>, FleetError> {
        let Some(current) = self.current() else {
            return Ok(HashMap::new());
        };
        Ok(store::members(self.db.pool(), BUNDLES, current.id)
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
        let mut conn = self.db.pool().acquire().await?;
        Ok(store::wave_status(&mut conn, BUNDLES, &current.head()).await?)
    }
}

/// How a rollout of `target` starts after `previous`: the previous version again simply
/// completes; an older one (a downgrade, however recently signed) starts halted.
fn initial_state(
    target: &AgentVersion,
    previous: Option<&AgentVersion>,
) -> (State, Option<String>, Option<HaltCause>) {
    match previous {
        Some(p) if p == target => (State::Completed, None, None),
        Some(p) if step::is_downgrade(target, p) => (
            State::Halted,
            Some(format!(
                "downgrade: {target} is older than the previous version {p}; `update-server rollout resume` rolls it out anyway"
            )),
            Some(HaltCause::Downgrade),
        ),
        _ => (State::Running, None, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_downgrade_starts_halted_and_the_previous_version_completes() {
        let v = |s: &str| s.parse::<AgentVersion>().unwrap();
        assert_eq!(initial_state(&v("2.0.0+2"), None).0, State::Running);
        assert_eq!(
            initial_state(&v("2.0.0+2"), Some(&v("1.0.0+1"))).0,
            State::Running
        );
        let (state, reason, cause) = initial_state(&v("1.0.0+1"), Some(&v("2.0.0+2")));
        assert_eq!(state, State::Halted);
        assert!(reason.unwrap().starts_with("downgrade: "));
        assert_eq!(cause, Some(HaltCause::Downgrade));
        assert_eq!(
            initial_state(&v("2.0.0+2"), Some(&v("2.0.0+2"))).0,
            State::Completed
        );
    }
}
