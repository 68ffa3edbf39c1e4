//! Deployments: who gets which release. A deployment is a name, a selector over agents'
//! labels, the release its agents run, a priority and its rollout policy; every agent
//! follows exactly one ([`choose`]). `default` always exists: it selects every agent,
//! comes last, and its release is the fleet's current release (`release publish` and
//! `release rollback` move it), so its row names none.
//!
//! - [`Deployment`] and [`choose`]: pure, tested without a database;
//! - the `deployments` rows: [`list`], [`create`], [`update`], [`remove`];
//! - [`Deployments`]: the deployments as this server last read them, each with its own
//!   [`Rollouts`] (its waves, halts and windows), and which one an agent follows.
//!
//! It owns the `deployments` table. It never reads a bundle: an edge tells each
//! deployment's rollouts what it serves ([`Rollouts::serve`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use agent_protocol::AcceptPolicy;
use agent_protocol::selector::Selector;
use sqlx::Row;

use crate::db::{Db, now_ms};
use crate::error::FleetError;
use crate::labels::Labels;
use crate::news::News;
use crate::rollout::Rollouts;
use crate::rollout::plan::Plan;

pub use crate::deployment_table::{DEFAULT, Deployment, MAX_NAME, Table, choose, line_of};

/// Whether `name` may name a deployment: 1 to [`MAX_NAME`] letters, digits, `.`, `_`, `-`.
pub fn check_name(name: &str) -> Result<(), String> {
    if agent_protocol::names::is_plain(name, MAX_NAME) {
        Ok(())
    } else {
        Err(format!(
            "deployment name {name:?}: write 1 to {MAX_NAME} letters, digits, '.', '_' or '-'"
        ))
    }
}

fn parse_selector(text: &str) -> Result<Selector, String> {
    Selector::parse(text).map_err(|e| format!("selector {text:?}: {e}"))
}

/// A deployment to create (serialized when it waits for approval).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct NewDeployment {
    pub name: String,
    pub selector: String,
    pub release: String,
    pub priority: i64,
    pub policy: Option<Plan>,
}

/// A change to a deployment: what is `Some` is set (serialized when it waits for
/// approval).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Change {
    pub selector: Option<String>,
    pub release: Option<String>,
    pub priority: Option<i64>,
    pub policy: Option<Plan>,
}

impl Change {
    pub fn is_empty(&self) -> bool {
        self.selector.is_none()
            && self.release.is_none()
            && self.priority.is_none()
            && self.policy.is_none()
    }
}

fn no_such(name: &str) -> FleetError {
    FleetError::NotFound(format!(
        "no deployment {name:?}; list them with `update-server deployment list`"
    ))
}

const COLUMNS: &str =
    "SELECT name, selector, release_id, priority, policy, created_at, updated_at FROM deployments";

fn row_of(r: &sqlx::any::AnyRow) -> Result<Deployment, FleetError> {
    let name: String = r.try_get(0)?;
    let selector_text: String = r.try_get(1)?;
    let selector = parse_selector(&selector_text).map_err(|e| {
        FleetError::Invalid(format!("deployment {name}: {e} (stored; set a new one)"))
    })?;
    let policy: Option<String> = r.try_get(4)?;
    let policy = policy
        .map(|p| {
            serde_json::from_str::<Plan>(&p).map_err(|e| {
                FleetError::Invalid(format!("deployment {name}: its stored policy: {e}"))
            })
        })
        .transpose()?;
    Ok(Deployment {
        name,
        selector_text,
        selector,
        release: r.try_get(2)?,
        priority: r.try_get(3)?,
        policy,
        created_at: r.try_get(5)?,
        updated_at: r.try_get(6)?,
    })
}

/// Every deployment, `default` first, then by name.
pub async fn list(db: &Db) -> Result<Vec<Deployment>, FleetError> {
    let rows = sqlx::query(&format!(
        "{COLUMNS} ORDER BY CASE WHEN name = 'default' THEN 0 ELSE 1 END, name"
    ))
    .fetch_all(db.pool())
    .await?;
    rows.iter().map(row_of).collect()
}

/// One deployment by name.
pub async fn get(db: &Db, name: &str) -> Result<Option<Deployment>, FleetError> {
    let row = sqlx::query(&format!("{COLUMNS} WHERE name = $1"))
        .bind(name)
        .fetch_optional(db.pool())
        .await?;
    row.as_ref().map(row_of).transpose()
}

async fn release_is_kept(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    id: &str,
) -> Result<(), FleetError> {
    let known = sqlx::query("SELECT id FROM releases WHERE id = $1")
        .bind(id)
        .fetch_optional(&mut **tx)
        .await?;
    if known.is_none() {
        return Err(FleetError::Invalid(format!(
            "release {id} is not kept here; publish it first (`update-server release publish --deployment NAME DIR`) or pick one of `update-server release list`"
        )));
    }
    Ok(())
}

fn policy_json(policy: Option<&Plan>) -> Result<Option<String>, FleetError> {
    policy
        .map(|p| serde_json::to_string(p).map_err(|e| FleetError::Invalid(e.to_string())))
        .transpose()
}

/// What [`create`] refuses of `new` without reading the fleet (a bad name or selector,
/// `default`): pure, so a change is refused at once rather than after it waited for
/// approval.
pub fn check_new(new: &NewDeployment) -> Result<(), FleetError> {
    check_name(&new.name).map_err(FleetError::Invalid)?;
    if new.name == DEFAULT {
        return Err(FleetError::Conflict(
            "deployment default always exists; change it with `update-server deployment set default`".into(),
        ));
    }
    parse_selector(&new.selector).map_err(FleetError::Invalid)?;
    Ok(())
}

/// What [`update`] refuses of `change` to `name` without reading the fleet: pure, as
/// [`check_new`].
pub fn check_change(name: &str, change: &Change) -> Result<(), FleetError> {
    if change.is_empty() {
        return Err(FleetError::Invalid(
            "nothing to change: give --release, --selector, --priority or a policy flag".into(),
        ));
    }
    if name == DEFAULT {
        if change.release.is_some() {
            return Err(FleetError::Invalid(
                "default's release is the fleet's current release: move it with `update-server release publish` or `update-server release rollback`".into(),
            ));
        }
        if change.selector.is_some() || change.priority.is_some() {
            return Err(FleetError::Invalid(
                "default selects every agent and comes last: its selector and priority cannot change; create another deployment".into(),
            ));
        }
    }
    if let Some(selector) = &change.selector {
        parse_selector(selector).map_err(FleetError::Invalid)?;
    }
    Ok(())
}

/// Creates a deployment; refused (nothing changed) for a taken name, a bad name or
/// selector, or a release the fleet does not keep.
pub async fn create(db: &Db, new: &NewDeployment) -> Result<Deployment, FleetError> {
    check_new(new)?;
    let now = now_ms();
    let mut tx = db.begin_write().await?;
    release_is_kept(&mut tx, &new.release).await?;
    let taken = sqlx::query("SELECT name FROM deployments WHERE name = $1")
        .bind(&new.name)
        .fetch_optional(&mut *tx)
        .await?;
    if taken.is_some() {
        return Err(FleetError::Conflict(format!(
            "deployment {} exists; change it with `update-server deployment set {}`",
            new.name, new.name
        )));
    }
    sqlx::query(
        "INSERT INTO deployments (name, selector, release_id, priority, policy, created_at, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, $6)",
    )
    .bind(&new.name)
    .bind(&new.selector)
    .bind(&new.release)
    .bind(new.priority)
    .bind(policy_json(new.policy.as_ref())?)
    .bind(now)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    get(db, &new.name).await?.ok_or_else(|| no_such(&new.name))
}

/// Changes a deployment: the deployment before and after. `default`'s selector,
/// priority and release are the fleet's and refused here (its release moves with
/// `release publish` and `release rollback`).
pub async fn update(
    db: &Db,
    name: &str,
    change: &Change,
) -> Result<(Deployment, Deployment), FleetError> {
    check_change(name, change)?;
    let before = get(db, name).await?.ok_or_else(|| no_such(name))?;
    let mut tx = db.begin_write().await?;
    if let Some(release) = &change.release {
        release_is_kept(&mut tx, release).await?;
    }
    sqlx::query(
        "UPDATE deployments SET selector = $2, release_id = $3, priority = $4, policy = $5, updated_at = $6
         WHERE name = $1",
    )
    .bind(name)
    .bind(change.selector.as_ref().unwrap_or(&before.selector_text))
    .bind(change.release.as_ref().or(before.release.as_ref()))
    .bind(change.priority.unwrap_or(before.priority))
    .bind(policy_json(change.policy.as_ref().or(before.policy.as_ref()))?)
    .bind(now_ms())
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    let after = get(db, name).await?.ok_or_else(|| no_such(name))?;
    Ok((before, after))
}

/// Removes a deployment (its agents follow the next that selects them, at their next
/// contact); `default` cannot be removed.
pub async fn remove(db: &Db, name: &str) -> Result<Deployment, FleetError> {
    if name == DEFAULT {
        return Err(FleetError::Invalid(
            "deployment default cannot be removed: every agent no other deployment selects follows it".into(),
        ));
    }
    let before = get(db, name).await?.ok_or_else(|| no_such(name))?;
    let mut tx = db.begin_write().await?;
    sqlx::query("DELETE FROM deployments WHERE name = $1")
        .bind(name)
        .execute(&mut *tx)
        .await?;
    sqlx::query("DELETE FROM maintenance_windows WHERE deployment = $1")
        .bind(name)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(before)
}

/// What an agent says of itself at a contact, for the labels a selector sees.
#[derive(Debug, Clone, Copy)]
pub struct AgentFacts<'a> {
    pub id: &'a str,
    /// The labels it sent; `None`: it sent none (its stored ones count).
    pub reported: Option<&'a Labels>,
    pub platform: &'a str,
    pub group: &'a str,
    pub version: &'a str,
}

impl AgentFacts<'_> {
    fn effective(&self, own: &Labels, server: &Labels) -> Labels {
        crate::labels::effective(
            own,
            server,
            crate::labels::built_in(self.platform, self.group, self.version),
        )
    }
}

/// Which deployment an agent follows, the release it names and its rollouts.
#[derive(Clone)]
pub struct Route {
    pub deployment: String,
    /// `None` for `default`, whose release is the fleet's current one.
    pub release: Option<String>,
    pub rollouts: Arc<Rollouts>,
}

impl Route {
    fn default_of(rollouts: &Arc<Rollouts>) -> Self {
        Self {
            deployment: DEFAULT.to_owned(),
            release: None,
            rollouts: Arc::clone(rollouts),
        }
    }
}

/// The labels the fleet database keeps for agents that a selector reads (an agent's own
/// as recorded, for one that sends none, and the server's), kept in memory so that a
/// connect costs no read of them: dropped whole when the fleet's labels revision moves
/// (any server changed an agent's server labels).
#[derive(Default)]
struct StoredLabels {
    revision: Option<String>,
    by_agent: HashMap<String, Arc<(Labels, Labels)>>,
}

/// The deployments as this server knows them, each with its rollouts.
pub struct Deployments {
    db: Db,
    table: Arc<Table>,
    default: Arc<Rollouts>,
    lines: RwLock<HashMap<String, Arc<Rollouts>>>,
    /// The plan a deployment without its own policy runs under when `default` has none
    /// either (`[rollout]` of server.toml).
    plan: RwLock<Plan>,
    /// What this server's file says of `default`'s policy (`[rollout]`,
    /// `[[maintenance]]`), compared with the fleet's at each refresh; `None` until the
    /// edge says it.
    file_windows: RwLock<Option<Vec<crate::policy::NewWindow>>>,
    /// The fleet's windows as last read, every deployment's.
    windows: Mutex<Option<Vec<crate::policy::StoredWindow>>>,
    /// Every deployment's windows together: whoever wakes held connects at an opening.
    every_window: tokio::sync::watch::Sender<Arc<crate::maintenance::Schedule>>,
    /// What the file says that the fleet does not (see [`crate::policy::disagreement`]).
    disagreement: RwLock<Option<String>>,
    policy: AcceptPolicy,
    server: String,
    /// The deployment each agent was last answered by here: a move is noticed at the
    /// first contact after it.
    followed: Mutex<HashMap<String, String>>,
    stored: Mutex<StoredLabels>,
}

impl Deployments {
    /// `default` is `rollouts` (the fleet's rollouts as before deployments).
    pub fn new(db: Db, rollouts: Arc<Rollouts>, policy: AcceptPolicy, server: String) -> Self {
        let plan = (*rollouts.plan()).clone();
        Self {
            db,
            table: rollouts.table(),
            default: rollouts,
            lines: RwLock::default(),
            plan: RwLock::new(plan),
            file_windows: RwLock::default(),
            windows: Mutex::default(),
            every_window: tokio::sync::watch::Sender::new(Arc::default()),
            disagreement: RwLock::default(),
            policy,
            server,
            followed: Mutex::default(),
            stored: Mutex::default(),
        }
    }

    pub fn table(&self) -> &Arc<Table> {
        &self.table
    }

    pub fn default_rollouts(&self) -> &Arc<Rollouts> {
        &self.default
    }

    /// Where held connects learn that something moved (every deployment's rollouts
    /// share it).
    pub fn news(&self) -> &Arc<News> {
        self.default.news()
    }

    /// What this server's file says of `default`'s policy: the fallback plan of
    /// deployments without one (while `default` has none), and what the fleet's policy
    /// is compared with at each [`Deployments::refresh`].
    pub fn set_file_policy(&self, plan: Plan, windows: Vec<crate::policy::NewWindow>) {
        *self.plan.write().unwrap_or_else(|p| p.into_inner()) = plan;
        *self.file_windows.write().unwrap_or_else(|p| p.into_inner()) = Some(windows);
        // Compared again at the next refresh.
        *self.windows.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// What this server's file says of `default`'s policy that the fleet does not, in
    /// words for its log and `/healthz`.
    pub fn disagreement(&self) -> Option<String> {
        self.disagreement
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Every deployment's maintenance windows together, and each change of them.
    pub fn every_window(&self) -> tokio::sync::watch::Receiver<Arc<crate::maintenance::Schedule>> {
        self.every_window.subscribe()
    }

    /// The plan of a deployment without its own: `default`'s, else the file's.
    fn fallback_plan(&self, list: &[Deployment]) -> Plan {
        list.iter()
            .find(|d| d.is_default())
            .and_then(|d| d.policy.clone())
            .unwrap_or_else(|| self.plan.read().unwrap_or_else(|p| p.into_inner()).clone())
    }

    /// The rollouts of the deployment `name`, if it exists here.
    pub fn rollouts(&self, name: &str) -> Option<Arc<Rollouts>> {
        if name == DEFAULT {
            return Some(Arc::clone(&self.default));
        }
        self.lines
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    /// Every deployment as last read, with its rollouts.
    pub fn all(&self) -> Vec<(Deployment, Arc<Rollouts>)> {
        self.table
            .get()
            .iter()
            .filter_map(|d| Some((d.clone(), self.rollouts(&d.name)?)))
            .collect()
    }

    /// Reads the deployments again: new ones get their rollouts, removed ones lose
    /// them, policies are applied (a started rollout keeps the plan it started with).
    /// Returns whether the list changed.
    pub async fn refresh(&self) -> Result<bool, FleetError> {
        let revision = self.db.setting(crate::settings::LABELS_REVISION).await?;
        {
            let mut stored = self.stored.lock().unwrap_or_else(|p| p.into_inner());
            if stored.revision != revision {
                stored.by_agent.clear();
                stored.revision = revision;
            }
        }
        let list = list(&self.db).await?;
        let changed = *self.table.get() != list;
        let plan = self.fallback_plan(&list);
        let windows = crate::policy::windows(&self.db).await?;
        let windows_changed = self
            .windows
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            != Some(&windows);
        {
            let mut lines = self.lines.write().unwrap_or_else(|p| p.into_inner());
            lines.retain(|name, _| list.iter().any(|d| &d.name == name));
            for d in &list {
                let own = d.policy.clone().unwrap_or_else(|| plan.clone());
                if d.is_default() {
                    self.default.set_plan(own);
                    continue;
                }
                match lines.get(&d.name) {
                    Some(r) => r.set_plan(own),
                    None => {
                        let rollouts = Rollouts::for_deployment(
                            self.db.clone(),
                            own,
                            self.policy.clone(),
                            self.server.clone(),
                            d.name.clone(),
                            Arc::clone(&self.table),
                            Arc::clone(self.default.news()),
                        )
                        .with_maintenance(crate::policy::schedule_of(&windows, &d.name));
                        lines.insert(d.name.clone(), Arc::new(rollouts));
                    }
                }
            }
        }
        if windows_changed || changed {
            self.windows_read(&list, windows, windows_changed);
        }
        if changed {
            self.table.set(list);
            self.news().publish("the deployments changed");
        }
        Ok(changed)
    }

    /// The fleet's windows read anew (or its deployments): each deployment waits for its
    /// own, and what this server's file says is compared with `default`'s.
    /// `moved`: the windows differ from those last read (not only the deployments).
    fn windows_read(
        &self,
        list: &[Deployment],
        windows: Vec<crate::policy::StoredWindow>,
        moved: bool,
    ) {
        if moved {
            let mut every = Vec::new();
            for d in list {
                let own = crate::policy::schedule_of(&windows, &d.name);
                every.extend_from_slice(own.windows());
                if let Some(rollouts) = self.rollouts(&d.name) {
                    rollouts.set_maintenance(own);
                }
            }
            self.every_window
                .send_replace(Arc::new(crate::maintenance::Schedule::new(every)));
        }
        let default_plan = list
            .iter()
            .find(|d| d.is_default())
            .and_then(|d| d.policy.as_ref());
        let said = self
            .file_windows
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .and_then(|file| {
                crate::policy::disagreement(
                    &self.plan.read().unwrap_or_else(|p| p.into_inner()),
                    file,
                    default_plan,
                    &windows,
                )
            });
        let mut disagreement = self.disagreement.write().unwrap_or_else(|p| p.into_inner());
        if *disagreement != said {
            match &said {
                Some(said) => tracing::warn!("{said}"),
                None if disagreement.is_some() => tracing::info!(
                    "this server's [rollout] and [[maintenance]] agree with the fleet's policy for deployment default again"
                ),
                None => {}
            }
            *disagreement = said;
        }
        *self.windows.lock().unwrap_or_else(|p| p.into_inner()) = Some(windows);
    }

    /// The deployment an agent with `labels` follows, and its rollouts. An agent that
    /// moved here from another deployment gives up its places in that one's rollouts.
    pub async fn route(&self, agent: &str, labels: &Labels) -> Result<Route, FleetError> {
        if self.table.is_single() {
            return Ok(Route::default_of(&self.default));
        }
        let (name, release) = self.table.chosen(labels);
        // A deployment read a moment ago whose rollouts are not made yet: `default`.
        let (name, release, rollouts) = match self.rollouts(&name) {
            Some(rollouts) => (name, release, rollouts),
            None => (DEFAULT.to_owned(), None, Arc::clone(&self.default)),
        };
        let before = self
            .followed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(agent.to_owned(), name.clone());
        if before.as_deref() != Some(name.as_str()) {
            let left =
                crate::rollout::store::leave_other_lines(self.db.pool(), agent, line_of(&name))
                    .await?;
            if left > 0 || before.is_some() {
                tracing::info!(
                    agent = %agent,
                    "the agent follows deployment {name} now (before: {}); it left {left} unfinished rollout place(s) of others",
                    before.as_deref().unwrap_or("not seen here")
                );
            }
        }
        Ok(Route {
            deployment: name,
            release,
            rollouts,
        })
    }

    /// The deployment an agent follows, from what it says (`reported`: its own labels,
    /// `None` for an agent that sends none, whose stored ones count) and the labels the
    /// server keeps for it (read only when there is a choice to make).
    pub async fn route_agent(&self, agent: &AgentFacts<'_>) -> Result<Route, FleetError> {
        if self.table.is_single() {
            return self.route(agent.id, &Labels::new()).await;
        }
        let stored = self.stored_labels(agent.id).await?;
        let (own, server) = &*stored;
        let labels = agent.effective(agent.reported.unwrap_or(own), server);
        self.route(agent.id, &labels).await
    }

    /// An agent's effective labels (what it says, the server's, the built-ins), as a
    /// selector sees them; the server's from memory ([`Deployments::route_agent`]'s).
    pub async fn labels_of(&self, agent: &AgentFacts<'_>) -> Result<Labels, FleetError> {
        let stored = self.stored_labels(agent.id).await?;
        let (own, server) = &*stored;
        Ok(agent.effective(agent.reported.unwrap_or(own), server))
    }

    /// The agent's stored labels (its own, the server's): from memory, or read once.
    async fn stored_labels(&self, agent: &str) -> Result<Arc<(Labels, Labels)>, FleetError> {
        let revision = {
            let stored = self.stored.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(known) = stored.by_agent.get(agent) {
                return Ok(Arc::clone(known));
            }
            stored.revision.clone()
        };
        let row = sqlx::query("SELECT labels, server_labels FROM agents WHERE id = $1")
            .bind(agent)
            .fetch_optional(self.db.pool())
            .await?;
        let read = Arc::new(match &row {
            Some(row) => (
                crate::labels::from_json(row.try_get::<Option<String>, _>(0)?.as_deref()),
                crate::labels::from_json(row.try_get::<Option<String>, _>(1)?.as_deref()),
            ),
            None => (Labels::new(), Labels::new()),
        });
        let mut stored = self.stored.lock().unwrap_or_else(|p| p.into_inner());
        // Kept only if no change was seen while it was read (a revision read since then
        // would otherwise be answered with the labels from before it), and only for an
        // agent the fleet knows (one registering now has its row in a moment).
        if stored.revision == revision && row.is_some() {
            stored.by_agent.insert(agent.to_owned(), Arc::clone(&read));
        }
        Ok(read)
    }

    /// An operator changed `agent`'s server labels here: this server routes it by the new
    /// ones from its next contact (the others within a [`Deployments::refresh`]).
    pub fn labels_changed(&self, agent: &str) {
        self.stored
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .by_agent
            .remove(agent);
    }

    /// [`Deployments::route_agent`] while the fleet database is away: the deployment
    /// this server last answered the agent by, else what its own labels select.
    pub fn route_offline(&self, agent: &AgentFacts<'_>) -> Route {
        let name = self
            .followed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(agent.id)
            .cloned()
            .unwrap_or_else(|| {
                let own = agent.reported.cloned().unwrap_or_default();
                self.table.follows(&agent.effective(&own, &Labels::new()))
            });
        match self.rollouts(&name) {
            Some(rollouts) if name != DEFAULT => Route {
                release: self.table.release_of(&name),
                deployment: name,
                rollouts,
            },
            _ => Route::default_of(&self.default),
        }
    }

    /// The rollouts of the deployment this server last answered `agent` by (`default`'s
    /// for an agent it has not answered).
    pub fn followed_rollouts(&self, agent: &str) -> Arc<Rollouts> {
        let name = self
            .followed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(agent)
            .cloned();
        name.and_then(|n| self.rollouts(&n))
            .unwrap_or_else(|| Arc::clone(&self.default))
    }

    /// The deployment an agent with `labels` follows, as last read (no database).
    pub fn follows(&self, labels: &Labels) -> String {
        self.table.follows(labels)
    }

    /// Every deployment's rollouts, `default`'s first.
    fn every(&self) -> Vec<Arc<Rollouts>> {
        let mut all = vec![Arc::clone(&self.default)];
        all.extend(
            self.lines
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .values()
                .cloned(),
        );
        all
    }

    /// An agent's report counts in the rollout of whichever deployment told it (each
    /// looks only at reports of its own target, from agents it told).
    pub async fn report(
        &self,
        report: &agent_protocol::wire::Report,
        at: i64,
    ) -> Result<(), FleetError> {
        self.reports(&[(report, at)]).await
    }

    /// [`Deployments::report`] for reports in the order they came.
    pub async fn reports(
        &self,
        reports: &[(&agent_protocol::wire::Report, i64)],
    ) -> Result<(), FleetError> {
        for rollouts in self.every() {
            rollouts.reports(reports).await?;
        }
        Ok(())
    }

    /// Records a `409` given while the database was away (a rollout of any deployment).
    pub async fn record_told(&self, rollout: i64, agent: &str, at: i64) -> Result<(), FleetError> {
        self.record_told_many(&[(rollout, agent, at)]).await
    }

    /// Records `409`s given while the database was away or busy (rollout, agent, when).
    pub async fn record_told_many(&self, told: &[(i64, &str, i64)]) -> Result<(), FleetError> {
        // The rows are written by rollout id, whichever deployment it is of.
        self.default.record_told_many(told).await
    }

    /// Every deployment's rollouts: decides what is due in each.
    pub async fn decide(&self) -> Result<(), FleetError> {
        let lines: Vec<Arc<Rollouts>> = self
            .lines
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        for rollouts in lines {
            rollouts.refresh().await?;
            rollouts.decide().await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment(name: &str, selector: &str, priority: i64, created_at: i64) -> Deployment {
        Deployment {
            name: name.into(),
            selector_text: selector.into(),
            selector: Selector::parse(selector).unwrap(),
            release: (name != DEFAULT).then(|| "2.0.0+2".into()),
            priority,
            policy: None,
            created_at,
            updated_at: created_at,
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn an_agent_follows_the_matching_deployment_of_highest_priority_then_the_newest() {
        let all = vec![
            deployment(DEFAULT, "", 0, 0),
            deployment("prod", "env=prod", 10, 1),
            deployment("eu", "region=eu", 10, 2),
            deployment("beta", "beta", 0, 3),
        ];
        let follows = |l: &[(&str, &str)]| choose(&all, &labels(l)).unwrap().name.clone();
        assert_eq!(follows(&[("env", "prod")]), "prod");
        // Equal priority: the newest wins.
        assert_eq!(follows(&[("env", "prod"), ("region", "eu")]), "eu");
        // A higher priority beats a newer deployment.
        assert_eq!(follows(&[("env", "prod"), ("beta", "yes")]), "prod");
        assert_eq!(follows(&[("beta", "")]), "beta");
        // default is last, whatever its place in the list.
        assert_eq!(follows(&[("env", "dev")]), DEFAULT);
        assert_eq!(follows(&[]), DEFAULT);
        assert!(choose(&[], &labels(&[])).is_none());
    }

    #[test]
    fn defaults_line_is_the_one_rollouts_had_before_deployments() {
        assert_eq!(deployment(DEFAULT, "", 0, 0).line(), "");
        assert_eq!(deployment("prod", "env=prod", 0, 0).line(), "prod");
    }

    #[test]
    fn names_are_plain() {
        assert!(check_name("prod-eu.1").is_ok());
        for bad in ["", "a b", "<script>", "../x", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn an_agent_is_routed_by_labels_kept_in_memory_until_the_fleet_changes_them() {
        let home = tempfile::tempdir().unwrap();
        let db = Db::open("", home.path(), 1).await.unwrap();
        db.touch_agent(&crate::db::Contact {
            id: "a",
            name: "host",
            platform: "x86_64-unknown-linux-gnu",
            version: "1.0.0+1",
            group: None,
            config_hash: None,
            labels: None,
            at: 1,
        })
        .await
        .unwrap();
        sqlx::query(
            "INSERT INTO deployments (name, selector, release_id, priority, policy, created_at, updated_at)
             VALUES ('prod', 'env=prod', '2.0.0+2', 0, NULL, 1, 1)",
        )
        .execute(db.pool())
        .await
        .unwrap();
        let rollouts = Arc::new(Rollouts::new(
            db.clone(),
            Plan::default(),
            AcceptPolicy::Exact,
            "here".into(),
        ));
        let deployments =
            Deployments::new(db.clone(), rollouts, AcceptPolicy::Exact, "here".into());
        deployments.refresh().await.unwrap();
        let facts = AgentFacts {
            id: "a",
            reported: None,
            platform: "x86_64-unknown-linux-gnu",
            group: "",
            version: "1.0.0+1",
        };
        let route = deployments.route_agent(&facts).await.unwrap();
        assert_eq!((route.deployment.as_str(), route.release), (DEFAULT, None));

        // Another server labels it: this one keeps what it read until it refreshes.
        let prod = crate::labels::Edit::parse(&["env=prod".to_owned()]).unwrap();
        db.set_server_labels("a", &prod).await.unwrap().unwrap();
        assert_eq!(
            deployments.route_agent(&facts).await.unwrap().deployment,
            DEFAULT
        );
        deployments.refresh().await.unwrap();
        let route = deployments.route_agent(&facts).await.unwrap();
        assert_eq!(route.deployment, "prod");
        assert_eq!(route.release.as_deref(), Some("2.0.0+2"));

        // A change made here counts from the next contact.
        let unlabel = crate::labels::Edit::parse(&["env-".to_owned()]).unwrap();
        db.set_server_labels("a", &unlabel).await.unwrap().unwrap();
        deployments.labels_changed("a");
        assert_eq!(
            deployments.route_agent(&facts).await.unwrap().deployment,
            DEFAULT
        );
    }

    #[test]
    fn a_table_of_default_alone_needs_no_choice() {
        let table = Table::default();
        assert!(table.is_single());
        assert_eq!(table.follows(&labels(&[("env", "prod")])), DEFAULT);
    }
}
