//! [`Fleet`]: the model an edge drives. It writes what agents tell the server into the
//! fleet database, now or, while the database is away, later (see [`crate::outage`]):
//! the one place that knows how each queued write is applied, used by the edges and by
//! the drain alike.
//!
//! It owns the drain task, the settings poll (the fleet-wide switch another server
//! may have turned) and the contact batch: a known agent's contact (every held connect
//! and heartbeat) is kept in memory and written with the others once a
//! [`CONTACT_FLUSH_INTERVAL`], in one transaction, so a fleet of long-polling agents costs
//! a commit a second, not one per connect. A contact that says what the agent's last
//! batched one said is kept aside, not batched, until that one is
//! [`Fleet::with_contact_refresh`] old: a long-polling agent re-holds every heartbeat,
//! and its row needs only its `last_contact` kept fresh enough for the rollouts and
//! the other servers. Whatever reads the agents' rows for people (the admin API, the
//! page) flushes everything first, what was kept aside included, so people read every
//! contact as it came; a server that stops flushes last.
//!
//! It also remembers the tokens it verified (an agent's re-held connect is checked
//! against memory, not the database) until an operator forgets a token anywhere in the
//! fleet: the credentials revision in the settings moves, and the settings poll drops
//! them all. It never answers a request.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::commands::{self, Command};
use crate::config::Configs;
use crate::db::{Contact, Credentials, Db, Revocation, now_secs};
use crate::deployments::Deployments;
use crate::error::FleetError;
use crate::outage::{Deferred, Outage};
use crate::rollout::Rollouts;
use crate::settings;
use fleet_store::group::Group;

/// How often the drain looks at the database while it is away (and at the spool).
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// How often the fleet-wide settings are read again: a change made on another server
/// is in force here within this (docs/operations.md, "Several servers, one fleet",
/// promises 5 s).
pub const SETTINGS_INTERVAL: Duration = Duration::from_secs(2);
/// How long a known agent's contact may wait in memory before it is written: the
/// `last_contact` another server (or the database itself) sees is at most this late.
pub const CONTACT_FLUSH_INTERVAL: Duration = Duration::from_secs(1);
/// Queued contacts the drain writes in one transaction (statements of `TOUCH_CHUNK`).
const DRAIN_CONTACTS: usize = 2000;
/// Queued writes of other kinds (reports, mostly) the drain takes at a time, and how
/// many agents' it writes at once: a report is a few statements, and written one after
/// another, the reports a busy database left queued while a wave of 90,000 installed
/// took many minutes to write (five servers, one PostgreSQL), the wave waiting for them.
const DRAIN_RUN: usize = 512;
const DRAIN_AGENTS_AT_ONCE: usize = 8;
/// While this server holds a queued write a deadline waits for, it says so again this
/// often (well within [`settings::SPOOL_OLDEST_FRESH_MS`]).
const SPOOL_SAY_EVERY_MS: i64 = 10_000;

/// The fleet as one server sees it: its database, what waits for the database, the
/// rollouts and the fleet-wide switch as last read.
pub struct Fleet {
    pub db: Db,
    /// The database's absence, and what waits for it.
    pub outage: Arc<Outage>,
    /// `default`'s rollouts (the fleet's, before deployments).
    pub rollouts: Arc<Rollouts>,
    /// Every deployment with its rollouts, `default`'s among them.
    pub deployments: Arc<crate::deployments::Deployments>,
    /// Configuration sets and their config rollouts.
    pub configs: Arc<Configs>,
    auto_update: AtomicBool,
    /// Contacts not written yet: the latest of each agent (only `Deferred::Contact`).
    contacts: Mutex<HashMap<String, Deferred>>,
    /// What each agent's last contact put in the batch said ([`fingerprint`]) and its
    /// time: an unchanged contact younger than `contact_refresh` seconds is kept aside.
    batched: Mutex<HashMap<String, (u64, i64)>>,
    /// The latest contact of each agent kept aside: written when people read the
    /// agents, or once the agent has said nothing for `contact_refresh`.
    quiet: Mutex<HashMap<String, Deferred>>,
    contact_refresh: i64,
    /// When `batched` was last rid of old contacts.
    batched_pruned: AtomicI64,
    /// Held while a batch is written; with the ids of that batch, so that a later write
    /// of one of them (a report) waits for it and never lands before its earlier contact.
    flushing: tokio::sync::Mutex<()>,
    in_flush: Mutex<std::collections::HashSet<String>>,
    /// The token hash each agent last proved it holds, as the database had it.
    verified: Mutex<HashMap<String, String>>,
    /// The credentials revision as last read (see [`settings::CREDENTIALS_REVISION`]).
    credentials_revision: Mutex<Option<String>>,
    /// The release each agent's update locks were overridden for, as last read: asked at
    /// every refused connect, so it is read with the settings, not per connect.
    lock_overrides: Mutex<HashMap<String, String>>,
    /// What this server last told the fleet it holds queued (see
    /// [`settings::SPOOL_OLDEST_PREFIX`]), and when; `None` before it said anything.
    spool_said: Mutex<Option<(Option<i64>, i64)>>,
    /// Each agent's commands still to be carried (see [`crate::commands`]), as last read:
    /// asked at every contact, so read with the settings, not per contact.
    open_commands: Mutex<HashMap<String, Vec<Command>>>,
    /// Update reports written together (see [`crate::group`]).
    reports: Group<Deferred>,
    /// What each agent's register last said it takes and where it connected (a hash):
    /// a register that says it again costs no write.
    registered: Mutex<HashMap<String, u64>>,
    /// Where agents export their own telemetry (see [`crate::telemetry`]), as last read:
    /// asked at every contact, so read with the settings, not per contact.
    telemetry: Mutex<Arc<crate::telemetry::Table>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Fleet {
    /// The fleet over `db`, with the fleet-wide switch read once.
    pub async fn new(
        db: Db,
        outage: Arc<Outage>,
        rollouts: Arc<Rollouts>,
        configs: Arc<Configs>,
    ) -> Result<Self, FleetError> {
        let on = settings::auto_update_on(db.setting(settings::AUTO_UPDATE).await?.as_deref());
        let revision = db.setting(settings::CREDENTIALS_REVISION).await?;
        let overrides = lock_overrides(&db).await?;
        let open_commands = db.open_commands().await?;
        let telemetry = crate::telemetry::Table::new(db.telemetry_destinations().await?);
        let deployments = Arc::new(crate::deployments::Deployments::new(
            db.clone(),
            Arc::clone(&rollouts),
            rollouts.accept_policy().clone(),
            rollouts.server().to_owned(),
        ));
        deployments.refresh().await?;
        Ok(Self {
            db,
            outage,
            rollouts,
            deployments,
            configs,
            auto_update: AtomicBool::new(on),
            contacts: Mutex::default(),
            batched: Mutex::default(),
            quiet: Mutex::default(),
            contact_refresh: 0,
            batched_pruned: AtomicI64::new(0),
            flushing: tokio::sync::Mutex::new(()),
            in_flush: Mutex::default(),
            verified: Mutex::default(),
            credentials_revision: Mutex::new(revision),
            lock_overrides: Mutex::new(overrides),
            spool_said: Mutex::default(),
            open_commands: Mutex::new(open_commands),
            reports: Group::default(),
            registered: Mutex::default(),
            telemetry: Mutex::new(Arc::new(telemetry)),
        })
    }

    /// Writes a contact that says what the agent's last one said only once that one is
    /// `every` old (without this, every contact is written). Keep `every` plus the
    /// agents' heartbeat under the silence the page calls stale.
    pub fn with_contact_refresh(mut self, every: Duration) -> Self {
        self.contact_refresh = i64::try_from(every.as_secs()).unwrap_or(i64::MAX);
        self
    }

    /// Whether an operator overrode `agent`'s update locks for the release `version`
    /// (on any server of the fleet, as of the last settings read).
    pub fn locks_overridden(&self, agent: &str, version: &str) -> bool {
        lock(&self.lock_overrides)
            .get(agent)
            .is_some_and(|v| v == version)
    }

    /// An operator lets the release `version` through `agent`'s update locks; every
    /// server of the fleet knows within a settings read.
    pub async fn override_locks(&self, agent: &str, version: &str) -> Result<(), FleetError> {
        let key = format!("{}{agent}", settings::OVERRIDE_LOCKS_PREFIX);
        self.db.set_setting(&key, version).await?;
        lock(&self.lock_overrides).insert(agent.to_owned(), version.to_owned());
        Ok(())
    }

    /// The operators' named tokens.
    pub fn operators(&self) -> crate::operators::Operators {
        crate::operators::Operators::new(self.db.clone())
    }

    /// The fleet page's signed-in sessions.
    pub fn sessions(&self) -> crate::sessions::Sessions {
        crate::sessions::Sessions::new(self.db.clone())
    }

    /// The audit log.
    pub fn audit(&self) -> crate::audit::Audit {
        crate::audit::Audit::new(self.db.clone())
    }

    /// Changes waiting for a second operator's approval, and the fleet's switch.
    pub fn approvals(&self) -> crate::approvals::Approvals {
        crate::approvals::Approvals::new(self.db.clone())
    }

    /// The fleet-wide switch as last read or set.
    pub fn auto_update(&self) -> bool {
        self.auto_update.load(Ordering::Relaxed)
    }

    /// Whether `agent` proved it holds the token whose hash is `hash` since the fleet's
    /// credentials last changed: then the database need not be asked again.
    pub fn verified(&self, agent: &str, hash: &str) -> bool {
        lock(&self.verified)
            .get(agent)
            .is_some_and(|h| crate::credentials::same(h, hash))
    }

    /// `agent` proved it holds the token whose hash the database has as `hash`.
    pub fn remember_verified(&self, agent: &str, hash: &str) {
        lock(&self.verified).insert(agent.to_owned(), hash.to_owned());
    }

    /// An operator forgets `agent`'s token (its next register gets a new one): false if
    /// the fleet does not know it. Every server of the fleet stops trusting its old
    /// token from memory within a [`SETTINGS_INTERVAL`]; this one at once.
    pub async fn forget_token(&self, agent: &str) -> Result<bool, FleetError> {
        let known = self.db.forget_token(agent).await?;
        lock(&self.verified).remove(agent);
        Ok(known)
    }

    /// `agent` leaves the fleet or is removed from it (see [`Db::revoke`]): false if the
    /// fleet does not know it. Its waves are decided again at once, so none waits for it.
    pub async fn revoke(&self, agent: &str, how: Revocation) -> Result<bool, FleetError> {
        // A contact still batched must not write the row back after it is forgotten.
        lock(&self.contacts).remove(agent);
        lock(&self.batched).remove(agent);
        lock(&self.quiet).remove(agent);
        let known = self.db.revoke(agent, how, now_secs()).await?;
        lock(&self.verified).remove(agent);
        if known {
            self.outage
                .remember_credentials(agent, &Credentials::Revoked(how));
            self.rollouts.decide().await?;
            self.deployments.decide().await?;
            self.configs.decide().await?;
        }
        Ok(known)
    }

    /// `agent`'s commands still to be carried, as this server last read or wrote them.
    pub fn open_commands(&self, agent: &str) -> Vec<Command> {
        lock(&self.open_commands)
            .get(agent)
            .cloned()
            .unwrap_or_default()
    }

    /// Asks `kind` of `agent` (see [`Db::request_command`]); its held connect on this
    /// server is answered at once, on the fleet's others within a settings read. `None`
    /// if the fleet does not know the agent.
    pub async fn request_command(
        &self,
        agent: &str,
        kind: commands::Kind,
        argument: &str,
    ) -> Result<Option<Command>, FleetError> {
        let Some(command) = self
            .db
            .request_command(agent, kind, argument, now_secs())
            .await?
        else {
            return Ok(None);
        };
        {
            let mut open = lock(&self.open_commands);
            let list = open.entry(agent.to_owned()).or_default();
            list.retain(|c| c.kind != kind);
            list.push(command.clone());
        }
        self.rollouts.news().publish("a command for an agent");
        Ok(Some(command))
    }

    /// The telemetry destinations as this server last read or wrote them.
    pub fn telemetry(&self) -> Arc<crate::telemetry::Table> {
        Arc::clone(&lock(&self.telemetry))
    }

    /// Stores a destination (see [`Db::set_telemetry`]); the agents it concerns hear it at
    /// their next contact (a held connect at once), on the fleet's other servers within
    /// a settings read.
    pub async fn set_telemetry(
        &self,
        new: &crate::telemetry::NewDestination,
    ) -> Result<crate::telemetry::Destination, FleetError> {
        let stored = self.db.set_telemetry(new, now_secs()).await?;
        self.reread_telemetry().await?;
        Ok(stored)
    }

    /// Forgets the destination of `selector`; its agents stop exporting there (or export
    /// to the next destination that selects them). `None` if it had none.
    pub async fn clear_telemetry(
        &self,
        selector: &str,
    ) -> Result<Option<crate::telemetry::Destination>, FleetError> {
        let had = self.db.clear_telemetry(selector).await?;
        if had.is_some() {
            self.reread_telemetry().await?;
        }
        Ok(had)
    }

    /// Reads the destinations again; a change wakes the held connects.
    async fn reread_telemetry(&self) -> Result<(), FleetError> {
        let read = crate::telemetry::Table::new(self.db.telemetry_destinations().await?);
        let changed = {
            let mut held = lock(&self.telemetry);
            let changed = !held.same_as(&read);
            *held = Arc::new(read);
            changed
        };
        if changed {
            self.rollouts
                .news()
                .publish("the telemetry destinations changed");
        }
        Ok(())
    }

    /// A contact carried `command`.
    pub async fn command_sent(&self, command: &Command) -> Result<(), FleetError> {
        if command.status != commands::Status::Pending {
            return Ok(());
        }
        self.db.command_sent(&command.id, now_secs()).await?;
        if let Some(list) = lock(&self.open_commands).get_mut(&command.agent) {
            for c in list.iter_mut().filter(|c| c.id == command.id) {
                c.status = commands::Status::Sent;
            }
        }
        Ok(())
    }

    /// Command `command` ended as its agent says (see [`Db::finish_command`]).
    pub async fn finish_command(
        &self,
        command: &Command,
        status: commands::Status,
        error: Option<&str>,
    ) -> Result<bool, FleetError> {
        let taken = self
            .db
            .finish_command(&command.id, status, error, now_secs())
            .await?;
        if let Some(list) = lock(&self.open_commands).get_mut(&command.agent) {
            list.retain(|c| c.id != command.id);
        }
        Ok(taken)
    }

    /// `agent` proved the credential its rotation offered, whose hash is `hash` (see
    /// [`Db::accept_candidate`]): this server trusts it, and only it, at once.
    pub async fn accept_candidate(&self, agent: &str, hash: &str) -> Result<bool, FleetError> {
        if !self.db.accept_candidate(agent, hash, now_secs()).await? {
            return Ok(false);
        }
        lock(&self.verified).insert(agent.to_owned(), hash.to_owned());
        self.outage
            .remember_credentials(agent, &Credentials::Hash(hash.to_owned()));
        if let Some(list) = lock(&self.open_commands).get_mut(agent) {
            list.retain(|c| c.kind != commands::Kind::RotateCredentials);
        }
        Ok(true)
    }

    /// Drops every remembered token if the fleet's credentials changed since last read.
    fn credentials_changed(&self, revision: Option<String>) {
        let mut last = lock(&self.credentials_revision);
        if *last != revision {
            *last = revision;
            let forgotten = std::mem::take(&mut *lock(&self.verified));
            tracing::debug!(
                "credentials changed in the fleet: {} remembered tokens dropped",
                forgotten.len()
            );
        }
    }

    /// Turns the fleet-wide switch, for every server of the fleet.
    pub async fn set_auto_update(&self, on: bool) -> Result<(), FleetError> {
        self.db
            .set_setting(settings::AUTO_UPDATE, if on { "true" } else { "false" })
            .await?;
        if self.auto_update.swap(on, Ordering::Relaxed) != on {
            self.rollouts.news().publish("the fleet switch flipped");
        }
        Ok(())
    }

    /// The download limit stored for `server` (or, from before limits were per server,
    /// the single one), if any.
    pub async fn download_limit(&self, server: &str) -> Result<Option<usize>, FleetError> {
        // A limit set before limits were per server was this server's.
        let own = self
            .db
            .setting(&settings::download_limit_key(server))
            .await?;
        let value = match own {
            Some(v) => Some(v),
            None => self.db.setting(settings::DOWNLOAD_LIMIT).await?,
        };
        Ok(value.and_then(|v| v.parse().ok()))
    }

    pub async fn set_download_limit(&self, server: &str, limit: usize) -> Result<(), FleetError> {
        self.db
            .set_setting(&settings::download_limit_key(server), &limit.to_string())
            .await
    }

    /// Writes `w` now, or queues it when the database is away (or goes away now). An
    /// error only for a fault that is not the database's absence. A contact of the same
    /// agent waiting for its batch is written first, so the agent's writes keep their
    /// order.
    pub async fn save(&self, w: Deferred) -> Result<(), FleetError> {
        if let Deferred::Report { .. } = w {
            return self
                .reports
                .write(w, |group| self.save_reports(group))
                .await;
        }
        self.flush_earlier(w.agent()).await?;
        self.save_now(w).await
    }

    /// [`Fleet::save`] for a group of reports: the contacts of their agents waiting for
    /// their batch first, then the reports, a statement or two for each. An agent with
    /// writes queued (or every agent, while the database is away) has its writes queued
    /// behind them in their order.
    async fn save_reports(&self, group: Vec<Deferred>) -> Result<(), FleetError> {
        let mut earlier = Vec::new();
        let mut in_flush = false;
        for w in &group {
            let aside = lock(&self.quiet).remove(w.agent());
            let mut contacts = lock(&self.contacts);
            in_flush |= lock(&self.in_flush).contains(w.agent());
            earlier.extend(aside.or(contacts.remove(w.agent())));
        }
        if in_flush {
            drop(self.flushing.lock().await);
        }
        let queue = |earlier: Vec<Deferred>, group: Vec<Deferred>| {
            earlier
                .into_iter()
                .chain(group)
                .for_each(|w| self.outage.defer(w));
        };
        if self.outage.is_down() {
            queue(earlier, group);
            return Ok(());
        }
        let (held, earlier): (Vec<_>, Vec<_>) = earlier
            .into_iter()
            .partition(|w| self.outage.holds(w.agent()));
        let (held_reports, group): (Vec<_>, Vec<_>) = group
            .into_iter()
            .partition(|w| self.outage.holds(w.agent()));
        queue(held, held_reports);
        let rows: Vec<_> = earlier.iter().filter_map(contact_row).collect();
        if let Err(e) = self.db.touch_agents(&rows).await {
            if !e.is_unavailable() {
                // Put back: written one by one, through `save`, by the caller's retry.
                let mut contacts = lock(&self.contacts);
                for w in earlier {
                    contacts.entry(w.agent().to_owned()).or_insert(w);
                }
                return Err(e);
            }
            self.outage.went_down(&e);
            queue(earlier, group);
            return Ok(());
        }
        drop(rows);
        let run: Vec<&Deferred> = group.iter().collect();
        match write_together(&self.db, &self.deployments, &run).await {
            Err(e) if e.is_unavailable() => {
                self.outage.went_down(&e);
                queue(Vec::new(), group);
                Ok(())
            }
            other => other,
        }
    }

    /// [`Fleet::save`], answered within `within`: a write still under way then goes on
    /// in the background (written, or queued if the database turns out away) and is
    /// answered [`Saved::Queued`]. A busy database kept reports past the agents'
    /// request clock (answered `408`, sent again, and written twice).
    pub async fn save_within(
        self: &Arc<Self>,
        w: Deferred,
        within: Duration,
    ) -> Result<Saved, FleetError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let fleet = Arc::clone(self);
        let task = tokio::spawn(async move {
            if let Err(Err(e)) = tx.send(fleet.save(w).await) {
                tracing::error!("a write answered `queued` is refused by the database: {e}");
            }
        });
        match tokio::time::timeout(within, rx).await {
            Ok(Ok(saved)) => saved.map(|()| {
                if self.outage.is_down() {
                    Saved::Queued
                } else {
                    Saved::Written
                }
            }),
            Err(_) => Ok(Saved::Queued),
            // The task ended without a word: it panicked (said where it did).
            Ok(Err(_)) => match task.await {
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                _ => Ok(Saved::Queued),
            },
        }
    }

    /// Writes a new agent's first contact as [`Fleet::save`] does, with `hash` as its
    /// token unless it has one (see [`Db::enroll`]): true if the id now holds `hash`.
    /// While the database is away the contact is queued and the agent gets no token
    /// (false): it is given one at a later register.
    pub async fn enroll(&self, w: Deferred, hash: &str) -> Result<bool, FleetError> {
        // A row made anew says nothing yet of what the agent takes.
        lock(&self.registered).remove(w.agent());
        self.flush_earlier(w.agent()).await?;
        let Some((contact, health)) = contact_row(&w).filter(|_| !self.outage.is_down()) else {
            return self.save_now(w).await.map(|()| false);
        };
        let held = self.db.enroll(&contact, health, hash).await;
        self.queued_if_away(w, held, false)
    }

    /// Writes the agent's contact waiting for the next batch now, or waits for the
    /// batch under way that holds it: what comes after must not be overwritten by it.
    async fn flush_earlier(&self, agent: &str) -> Result<(), FleetError> {
        // One kept aside came after the batched one.
        let aside = lock(&self.quiet).remove(agent);
        let (earlier, in_flush) = {
            let mut contacts = lock(&self.contacts);
            let in_flush = lock(&self.in_flush).contains(agent);
            (aside.or(contacts.remove(agent)), in_flush)
        };
        if let Some(contact) = earlier {
            self.save_now(contact).await?;
        } else if in_flush {
            drop(self.flushing.lock().await);
        }
        Ok(())
    }

    async fn save_now(&self, w: Deferred) -> Result<(), FleetError> {
        // Behind a write of the same agent still queued (a busy database): written
        // before it, an INSTALLING drained later would undo the INSTALLED that followed.
        if self.outage.is_down() || self.outage.holds(w.agent()) {
            self.outage.defer(w);
            return Ok(());
        }
        let written = write(&self.db, &self.deployments, &self.configs, &w).await;
        self.queued_if_away(w, written, ())
    }

    /// What a write that failed for want of the database becomes: `w` queued and the
    /// outage noted, answered with `queued`.
    fn queued_if_away<T>(
        &self,
        w: Deferred,
        written: Result<T, FleetError>,
        queued: T,
    ) -> Result<T, FleetError> {
        match written {
            Err(e) if e.is_unavailable() => {
                self.outage.went_down(&e);
                self.outage.defer(w);
                Ok(queued)
            }
            other => other,
        }
    }

    /// Keeps what a register says the agent takes and the URL it used, when it says
    /// something new: the new version of every agent of a wave registers within a
    /// second of the others, saying what it said before.
    pub async fn record_register(
        &self,
        agent: &str,
        capabilities: &[String],
        endpoint: Option<&str>,
    ) -> Result<(), FleetError> {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::hash::DefaultHasher::new();
        (capabilities, endpoint).hash(&mut hasher);
        let said = hasher.finish();
        if lock(&self.registered).get(agent) == Some(&said) {
            return Ok(());
        }
        self.db
            .record_register(agent, capabilities, endpoint)
            .await?;
        lock(&self.registered).insert(agent.to_owned(), said);
        Ok(())
    }

    /// Records the contact of an agent the database already knows with the next batch
    /// (see [`CONTACT_FLUSH_INTERVAL`]); it replaces the agent's contact waiting there.
    /// Anything else is written as [`Fleet::save`] does.
    pub async fn contact(&self, w: Deferred) -> Result<(), FleetError> {
        let (Some(said), Deferred::Contact { at, .. }) = (fingerprint(&w), &w) else {
            return self.save(w).await;
        };
        {
            let mut batched = lock(&self.batched);
            let last = batched.get(w.agent()).copied();
            if !worth_writing(last, (said, *at), self.contact_refresh) {
                lock(&self.quiet).insert(w.agent().to_owned(), w);
                return Ok(());
            }
            batched.insert(w.agent().to_owned(), (said, *at));
        }
        lock(&self.quiet).remove(w.agent());
        lock(&self.contacts).insert(w.agent().to_owned(), w);
        Ok(())
    }

    /// Contacts waiting for their batch.
    pub fn contacts_pending(&self) -> usize {
        lock(&self.contacts).len()
    }

    /// Writes the contacts waiting for their batch and every contact kept aside, in one
    /// transaction; while the database is away they wait for the next. Called before
    /// the agents' rows are read for people, and when the server stops.
    pub async fn flush_contacts(&self) {
        self.flush(Aside::All).await;
    }

    /// Writes the contact batch, and of the contacts kept aside those of agents silent
    /// for a refresh since: what [`Fleet::spawn_contact_flush`] does every
    /// [`CONTACT_FLUSH_INTERVAL`].
    pub async fn flush_due_contacts(&self) {
        self.flush(Aside::Due).await;
    }

    async fn flush(&self, aside: Aside) {
        let _flushing = self.flushing.lock().await;
        let now = now_secs();
        self.forget_old_contacts(now);
        self.batch_aside(aside, now);
        let batch: Vec<Deferred> = {
            let mut contacts = lock(&self.contacts);
            *lock(&self.in_flush) = contacts.keys().cloned().collect();
            contacts.drain().map(|(_, w)| w).collect()
        };
        if batch.is_empty() {
            return;
        }
        if self.outage.is_down() {
            self.keep_for_next_batch(batch);
            return;
        }
        let rows: Vec<_> = batch.iter().filter_map(contact_row).collect();
        let written = self.db.touch_agents(&rows).await;
        match written {
            Ok(()) => {}
            Err(e) if e.is_unavailable() => {
                self.outage.went_down(&e);
                self.keep_for_next_batch(batch);
                return;
            }
            Err(e) => {
                // One row the database refuses must not cost the others their contact.
                tracing::warn!(
                    "writing {} contacts in one transaction failed ({e}); writing them one by one",
                    batch.len()
                );
                for w in batch {
                    if let Err(e) = self.save_now(w).await {
                        tracing::error!("a contact is refused by the database: {e}");
                    }
                }
            }
        }
        lock(&self.in_flush).clear();
    }

    /// Moves contacts kept aside into the batch: every one, or those of agents silent for
    /// a refresh since (a live agent's next contact comes first and is batched itself).
    fn batch_aside(&self, which: Aside, now: i64) {
        let moved: Vec<Deferred> = {
            let mut quiet = lock(&self.quiet);
            match which {
                Aside::All => quiet.drain().map(|(_, w)| w).collect(),
                Aside::Due => {
                    let due: Vec<String> = quiet
                        .iter()
                        .filter(|(_, w)| now.saturating_sub(contact_at(w)) >= self.contact_refresh)
                        .map(|(id, _)| id.clone())
                        .collect();
                    due.iter().filter_map(|id| quiet.remove(id)).collect()
                }
            }
        };
        if moved.is_empty() {
            return;
        }
        let mut contacts = lock(&self.contacts);
        for w in moved {
            let newer = |pending: &Deferred| contact_at(pending) >= contact_at(&w);
            if !contacts.get(w.agent()).is_some_and(newer) {
                contacts.insert(w.agent().to_owned(), w);
            }
        }
    }

    /// Forgets what contacts said once they are old enough that the next is written
    /// anyway: agents that left this server take no memory for long.
    fn forget_old_contacts(&self, now: i64) {
        // Looked at once a refresh, not at every flush.
        if now.saturating_sub(self.batched_pruned.load(Ordering::Relaxed)) < self.contact_refresh {
            return;
        }
        self.batched_pruned.store(now, Ordering::Relaxed);
        lock(&self.batched).retain(|_, (_, at)| now.saturating_sub(*at) < self.contact_refresh);
    }

    /// While the database is away, the contacts of known agents wait in the batch, not
    /// in the spool: one per agent (a newer one that came meanwhile wins), never
    /// dropped, written by the first batch after the spool. The contact guard
    /// (`last_contact`) keeps one older than a queued report from undoing it.
    fn keep_for_next_batch(&self, batch: Vec<Deferred>) {
        let mut contacts = lock(&self.contacts);
        for w in batch {
            contacts.entry(w.agent().to_owned()).or_insert(w);
        }
        lock(&self.in_flush).clear();
    }

    /// Flushes the contact batch every [`CONTACT_FLUSH_INTERVAL`].
    pub fn spawn_contact_flush(self: &Arc<Self>) {
        let fleet = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(CONTACT_FLUSH_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                fleet.flush_due_contacts().await;
            }
        });
    }

    /// Writes the spool back, oldest first, while the database answers; then lets calls
    /// go to the database again.
    pub async fn drain(&self) {
        drain(&self.db, &self.deployments, &self.configs, &self.outage).await;
    }

    /// Tells the fleet the arrival of the oldest write this server holds queued that an
    /// agent's deadline waits for (a report it answered `queued`), so no server times
    /// that agent out meanwhile: when it changes, and again every [`SPOOL_SAY_EVERY_MS`]
    /// while there is one. Nothing while the database is away: it could not be written,
    /// and once it is stale the others judge deadlines at their own time again.
    pub async fn say_spool(&self) {
        if self.outage.is_down() {
            return;
        }
        let oldest = self.outage.oldest_awaited_ms();
        let now = crate::db::now_ms();
        if !spool_worth_saying(*lock(&self.spool_said), oldest, now) {
            return;
        }
        let key = settings::spool_oldest_key(self.rollouts.server());
        let value = settings::spool_oldest_value(oldest, now);
        match self.db.set_setting(&key, &value).await {
            Ok(()) => *lock(&self.spool_said) = Some((oldest, now)),
            // Said at the next tick.
            Err(e) if e.is_unavailable() => {}
            Err(e) => tracing::warn!("cannot tell the fleet what this server holds queued: {e}"),
        }
    }

    /// Drains the spool every [`PROBE_INTERVAL`] when there is something to write or the
    /// database is away.
    pub fn spawn_drain(self: &Arc<Self>) {
        let fleet = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(PROBE_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if fleet.outage.is_down() || fleet.outage.queued() > 0 {
                    fleet.drain().await;
                }
                fleet.say_spool().await;
            }
        });
    }

    /// Reads the fleet-wide switch again every [`SETTINGS_INTERVAL`], so that a change
    /// made on another server of the fleet is in force here.
    pub fn spawn_settings_poll(self: &Arc<Self>) {
        let fleet = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SETTINGS_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if fleet.outage.is_down() {
                    continue;
                }
                match fleet.db.setting(settings::AUTO_UPDATE).await {
                    Ok(value) => {
                        let on = settings::auto_update_on(value.as_deref());
                        let was = fleet.auto_update.swap(on, Ordering::Relaxed);
                        if was != on {
                            tracing::info!(
                                "auto_update is now {on} (changed on another server of the fleet)"
                            );
                            fleet.rollouts.news().publish("the fleet switch flipped");
                        }
                    }
                    Err(e) if e.is_unavailable() => fleet.outage.went_down(&e),
                    Err(e) => tracing::warn!("reading the fleet's settings: {e}"),
                }
                match fleet.db.setting(settings::CREDENTIALS_REVISION).await {
                    Ok(revision) => fleet.credentials_changed(revision),
                    Err(e) if e.is_unavailable() => fleet.outage.went_down(&e),
                    Err(e) => tracing::warn!("reading the fleet's settings: {e}"),
                }
                match lock_overrides(&fleet.db).await {
                    Ok(overrides) => *lock(&fleet.lock_overrides) = overrides,
                    Err(e) if e.is_unavailable() => fleet.outage.went_down(&e),
                    Err(e) => tracing::warn!("reading the fleet's settings: {e}"),
                }
                match fleet.db.open_commands().await {
                    Ok(open) => {
                        // A command asked on another server of the fleet: its agent's
                        // held connect here is answered.
                        let news = {
                            let mut held = lock(&fleet.open_commands);
                            let news = open.iter().any(|(agent, commands)| {
                                commands.iter().any(|c| {
                                    held.get(agent)
                                        .is_none_or(|h| h.iter().all(|k| k.id != c.id))
                                })
                            });
                            *held = open;
                            news
                        };
                        if news {
                            fleet.rollouts.news().publish("a command for an agent");
                        }
                    }
                    Err(e) if e.is_unavailable() => fleet.outage.went_down(&e),
                    Err(e) => tracing::warn!("reading the agents' commands: {e}"),
                }
                // Set or cleared on another server of the fleet: this one's agents hear it.
                match fleet.reread_telemetry().await {
                    Ok(()) => {}
                    Err(e) if e.is_unavailable() => fleet.outage.went_down(&e),
                    Err(e) => tracing::warn!("reading the telemetry destinations: {e}"),
                }
            }
        });
    }
}

/// The overridden update locks, by agent id.
async fn lock_overrides(db: &Db) -> Result<HashMap<String, String>, FleetError> {
    Ok(db
        .settings_with_prefix(settings::OVERRIDE_LOCKS_PREFIX)
        .await?
        .into_iter()
        .filter_map(|(key, value)| {
            key.strip_prefix(settings::OVERRIDE_LOCKS_PREFIX)
                .map(|id| (id.to_owned(), value))
        })
        .collect())
}

/// What a server answers of a write it took: in the database, or queued (for the
/// spool, or still under way): either way the agent may forget it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Saved {
    Written,
    Queued,
}

impl Saved {
    /// The `"status"` of the answer.
    pub fn as_str(self) -> &'static str {
        match self {
            Saved::Written => "recorded",
            Saved::Queued => "queued",
        }
    }
}

/// Which contacts kept aside a flush writes.
#[derive(Debug, Clone, Copy)]
enum Aside {
    All,
    Due,
}

/// Whether what this server holds queued (`oldest`) is worth telling the fleet at
/// `now`, after it last said `last`: never said, changed, or (while it holds something)
/// said [`SPOOL_SAY_EVERY_MS`] ago.
fn spool_worth_saying(last: Option<(Option<i64>, i64)>, oldest: Option<i64>, now: i64) -> bool {
    last.is_none_or(|(said, at)| {
        said != oldest || (oldest.is_some() && now.saturating_sub(at) >= SPOOL_SAY_EVERY_MS)
    })
}

/// When a contact was made (0 for any other write).
fn contact_at(w: &Deferred) -> i64 {
    match w {
        Deferred::Contact { at, .. } => *at,
        _ => 0,
    }
}

/// What a contact says of its agent apart from when: contacts with equal fingerprints
/// write the same row. None for any other write.
fn fingerprint(w: &Deferred) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let Deferred::Contact {
        id: _,
        name,
        platform,
        version,
        group,
        config_hash,
        labels,
        at: _,
        health,
    } = w
    else {
        return None;
    };
    let mut hasher = std::hash::DefaultHasher::new();
    (name, platform, version, group, config_hash, labels, health).hash(&mut hasher);
    Some(hasher.finish())
}

/// Whether a known agent's contact (`now`: its fingerprint and time) goes in the batch,
/// after `last` went: when it says something new, or `last` is `refresh` seconds old.
fn worth_writing(last: Option<(u64, i64)>, now: (u64, i64), refresh: i64) -> bool {
    last.is_none_or(|(said, at)| said != now.0 || now.1.saturating_sub(at) >= refresh)
}

/// The row a queued contact writes, with the health it reported.
fn contact_row(w: &Deferred) -> Option<(Contact<'_>, Option<&agent_protocol::wire::AgentHealth>)> {
    match w {
        Deferred::Contact {
            id,
            name,
            platform,
            version,
            group,
            config_hash,
            labels,
            at,
            health,
        } => Some((
            Contact {
                id,
                name,
                platform,
                version,
                group: group.as_deref(),
                config_hash: config_hash.as_deref(),
                labels: labels.as_deref(),
                at: *at,
            },
            health.as_ref(),
        )),
        _ => None,
    }
}

/// Applies one write. Every write is idempotent, so a replay after a crash is harmless.
pub async fn write(
    db: &Db,
    rollouts: &Deployments,
    configs: &Configs,
    w: &Deferred,
) -> Result<(), FleetError> {
    match w {
        Deferred::Contact { .. } => match contact_row(w) {
            Some(row) => db.touch_agents(&[row]).await,
            None => Ok(()),
        },
        Deferred::ConfigStatus { status, at_ms } => configs.report(status, *at_ms).await,
        Deferred::Report { report, at_ms } => {
            db.record_report(report, at_ms / 1000).await?;
            rollouts.report(report, *at_ms).await
        }
        Deferred::Told {
            rollout,
            agent,
            at_ms,
        } => rollouts.record_told(*rollout, agent, *at_ms).await,
    }
}

/// Writes one queued write and forgets it, or drops it if the database refuses it for
/// good (it would block the spool for ever); false if the database went away again.
async fn write_queued(
    db: &Db,
    rollouts: &Deployments,
    configs: &Configs,
    outage: &Outage,
    seq: u64,
    w: &Deferred,
) -> bool {
    match write(db, rollouts, configs, w).await {
        Ok(()) => outage.written(seq),
        Err(e) if e.is_unavailable() => {
            outage.went_down(&e);
            return false;
        }
        Err(e) => {
            tracing::error!("a queued write is refused by the database ({e}); dropping it: {w:?}");
            outage.written(seq);
        }
    }
    true
}

/// Writes `run` (queued writes, oldest first), [`DRAIN_AGENTS_AT_ONCE`] agents at a
/// time, each agent's writes in their order: an agent's write that does not go leaves
/// its later ones queued behind it, and no other agent's is begun after it (a database
/// that went away would make each wait out its timeout). False if one did not go.
async fn write_by_agent(
    db: &Db,
    rollouts: &Deployments,
    configs: &Configs,
    outage: &Outage,
    run: Vec<(u64, Deferred)>,
) -> bool {
    use futures_util::StreamExt;
    let mut agents: Vec<Vec<(u64, Deferred)>> = Vec::new();
    let mut slot: HashMap<String, usize> = HashMap::new();
    for (seq, w) in run {
        let i = *slot.entry(w.agent().to_owned()).or_insert_with(|| {
            agents.push(Vec::new());
            agents.len() - 1
        });
        agents[i].push((seq, w));
    }
    let stopped = AtomicBool::new(false);
    let stopped = &stopped;
    futures_util::stream::iter(agents)
        .map(|writes| async move {
            for (seq, w) in writes {
                if stopped.load(Ordering::Acquire) {
                    return;
                }
                if !write_queued(db, rollouts, configs, outage, seq, &w).await {
                    stopped.store(true, Ordering::Release);
                    return;
                }
            }
        })
        .buffer_unordered(DRAIN_AGENTS_AT_ONCE)
        .collect::<()>()
        .await;
    !stopped.load(Ordering::Acquire)
}

/// Writes `run` (queued writes, oldest first): its reports and `409`s together, a few
/// statements for the run (a busy database left thousands queued, and one at a time
/// the spool drained at 150 writes a second), then the rest by agent
/// ([`write_by_agent`]). False if the database went away meanwhile.
async fn write_run(
    db: &Db,
    rollouts: &Deployments,
    configs: &Configs,
    outage: &Outage,
    run: Vec<(u64, Deferred)>,
) -> bool {
    let (together, mut rest): (Vec<_>, Vec<_>) = run
        .into_iter()
        .partition(|(_, w)| matches!(w, Deferred::Report { .. } | Deferred::Told { .. }));
    if !together.is_empty() {
        let writes: Vec<&Deferred> = together.iter().map(|(_, w)| w).collect();
        match write_together(db, rollouts, &writes).await {
            Ok(()) => together.iter().for_each(|(seq, _)| outage.written(*seq)),
            Err(e) if e.is_unavailable() => {
                outage.went_down(&e);
                return false;
            }
            // A row the database refuses: each is written alone, and only that one is
            // dropped.
            Err(e) => {
                tracing::warn!(
                    "writing {} queued reports together failed ({e}); writing them one by one",
                    together.len()
                );
                rest.extend(together);
                rest.sort_by_key(|(seq, _)| *seq);
            }
        }
    }
    write_by_agent(db, rollouts, configs, outage, rest).await
}

/// Writes queued reports and `409`s, each kind in a statement per few hundred agents.
/// An agent's later write of a kind wins over its earlier one, as written in turn.
async fn write_together(
    db: &Db,
    rollouts: &Deployments,
    run: &[&Deferred],
) -> Result<(), FleetError> {
    let mut reports: Vec<(&agent_protocol::wire::Report, i64)> = Vec::new();
    let mut told: Vec<(i64, &str, i64)> = Vec::new();
    for w in run {
        match w {
            Deferred::Report { report, at_ms } => reports.push((report, *at_ms)),
            Deferred::Told {
                rollout,
                agent,
                at_ms,
            } => told.push((*rollout, agent, *at_ms)),
            Deferred::Contact { .. } | Deferred::ConfigStatus { .. } => {}
        }
    }
    let received: Vec<_> = reports
        .iter()
        .map(|&(r, at_ms)| (r, at_ms / 1000))
        .collect();
    db.record_reports(&received).await?;
    // The 409s first: a report counts in a rollout only from an agent it told.
    rollouts.record_told_many(&told).await?;
    rollouts.reports(&reports).await
}

/// Writes the spool back, oldest first, while the database answers; then lets calls go
/// to the database again.
pub async fn drain(db: &Db, rollouts: &Deployments, configs: &Configs, outage: &Outage) {
    if outage.is_down() && outage.queued() == 0 {
        if let Err(e) = db.ping().await {
            if !e.is_unavailable() {
                tracing::warn!("database probe: {e}");
            }
            return;
        }
    }
    while let Some((_, w)) = outage.front() {
        if !matches!(w, Deferred::Contact { .. }) {
            if !write_run(db, rollouts, configs, outage, outage.front_run(DRAIN_RUN)).await {
                return;
            }
            continue;
        }
        let run = outage.front_contacts(DRAIN_CONTACTS);
        if run.len() > 1 {
            let rows: Vec<_> = run.iter().filter_map(|(_, w)| contact_row(w)).collect();
            match db.touch_agents(&rows).await {
                Ok(()) => {
                    run.iter().for_each(|(seq, _)| outage.written(*seq));
                    continue;
                }
                Err(e) if e.is_unavailable() => {
                    outage.went_down(&e);
                    return;
                }
                // A row the database refuses: each is written alone, below, and only
                // that one is dropped.
                Err(_) => {}
            }
        }
        for (seq, w) in run {
            if !write_queued(db, rollouts, configs, outage, seq, &w).await {
                return;
            }
        }
    }
    outage.came_back();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::plan::Plan;
    use agent_protocol::wire::{Report, UpdateStatus};
    use agent_protocol::{AcceptPolicy, AgentVersion};

    async fn fleet(home: &std::path::Path) -> Fleet {
        fleet_with(home, Plan::default(), "s").await
    }

    /// A fleet over `home`'s database whose rollouts follow `plan`, decided as `server`.
    async fn fleet_with(home: &std::path::Path, plan: Plan, server: &str) -> Fleet {
        let db = Db::open("", home, 1).await.unwrap();
        let rollouts = Arc::new(Rollouts::new(
            db.clone(),
            plan.clone(),
            AcceptPolicy::default(),
            server.into(),
        ));
        let configs = Arc::new(Configs::new(
            db.clone(),
            plan,
            server.into(),
            Arc::clone(rollouts.news()),
        ));
        Fleet::new(db, Arc::new(Outage::new(None)), rollouts, configs)
            .await
            .unwrap()
    }

    fn contact(id: &str, version: &str, at: i64) -> Deferred {
        Deferred::Contact {
            id: id.into(),
            name: format!("host-{id}"),
            platform: "p".into(),
            version: version.into(),
            group: None,
            config_hash: Some(String::new()),
            labels: None,
            at,
            health: None,
        }
    }

    #[tokio::test]
    async fn a_platform_the_release_lacks_is_no_bundle_and_its_wave_does_not_wait() {
        let home = tempfile::tempdir().unwrap();
        let fleet = fleet(home.path()).await;
        let now = crate::db::now_secs();
        for (id, platform) in [
            ("gnu", "x86_64-unknown-linux-gnu"),
            ("arm", "aarch64-unknown-linux-gnu"),
            ("musl", "x86_64-unknown-linux-musl"),
        ] {
            fleet
                .save(Deferred::Contact {
                    id: id.into(),
                    name: id.into(),
                    platform: platform.into(),
                    version: "1.0.0+1".into(),
                    group: None,
                    config_hash: Some(String::new()),
                    labels: None,
                    at: now,
                    health: None,
                })
                .await
                .unwrap();
        }
        let target: AgentVersion = "2.0.0+2".parse().unwrap();
        // A release for x86_64 glibc only: nothing runs on aarch64, nor on musl.
        fleet
            .rollouts
            .serve(crate::rollout::Served {
                sha256: "a".repeat(64),
                signed_at: 1,
                version: target.clone(),
                platforms: vec!["x86_64-unknown-linux-gnu".into()],
            })
            .await
            .unwrap();
        fleet.rollouts.decide().await.unwrap();
        for id in ["arm", "musl"] {
            let a = fleet.db.agent(id).await.unwrap().unwrap();
            assert_eq!(a.update_status.as_deref(), Some("NO_BUNDLE"), "{id}");
        }
        let waves = fleet.rollouts.wave_counts().await.unwrap();
        assert_eq!((waves[0].no_bundle, waves[0].pending()), (2, 1));
        // Its agents are not refused; the one with a bundle is.
        let v1: AgentVersion = "1.0.0+1".parse().unwrap();
        let arm = fleet
            .rollouts
            .answer("arm", "", &v1, false)
            .await
            .unwrap()
            .unwrap();
        assert!(arm.accepted && arm.no_bundle);
        let gnu = fleet
            .rollouts
            .answer("gnu", "", &v1, true)
            .await
            .unwrap()
            .unwrap();
        assert!(!gnu.accepted && !gnu.no_bundle);
        let report = Report {
            id: "gnu".into(),
            from: "1.0.0+1".into(),
            to: "2.0.0+2".into(),
            status: UpdateStatus::Installed,
            error: None,
        };
        fleet.rollouts.report(&report, now * 1000).await.unwrap();
        fleet.rollouts.decide().await.unwrap();
        fleet.rollouts.decide().await.unwrap();
        let current = fleet.rollouts.current().unwrap();
        assert_eq!(current.state, crate::rollout::step::State::Completed);
    }

    #[tokio::test]
    async fn a_report_from_an_agent_the_rollout_never_placed_places_it_nowhere() {
        let home = tempfile::tempdir().unwrap();
        let fleet = fleet(home.path()).await;
        let now = crate::db::now_secs();
        fleet.save(contact("placed", "1.0.0+1", now)).await.unwrap();
        fleet
            .rollouts
            .serve(crate::rollout::Served {
                sha256: "a".repeat(64),
                signed_at: 1,
                version: "2.0.0+2".parse().unwrap(),
                platforms: vec!["p".into()],
            })
            .await
            .unwrap();
        let placed = |waves: &[crate::rollout::step::WaveStatus]| {
            waves.iter().map(|w| w.agents).sum::<u64>()
        };
        assert_eq!(placed(&fleet.rollouts.wave_counts().await.unwrap()), 1);
        // An agent of another deployment that rolls out the same release (every
        // deployment's rollouts hear every report), or one updated by hand.
        fleet
            .save(contact("stranger", "2.0.0+2", now))
            .await
            .unwrap();
        let report = Report {
            id: "stranger".into(),
            from: "1.0.0+1".into(),
            to: "2.0.0+2".into(),
            status: UpdateStatus::Installed,
            error: None,
        };
        fleet.rollouts.report(&report, now * 1000).await.unwrap();
        fleet.rollouts.decide().await.unwrap();
        assert_eq!(
            placed(&fleet.rollouts.wave_counts().await.unwrap()),
            1,
            "the report placed its agent in the rollout"
        );
        let rows: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM rollout_agents WHERE agent_id = 'stranger'")
                .fetch_one(fleet.db.pool())
                .await
                .unwrap();
        assert_eq!(rows, 0);
        // Calling in, it is placed, and running the target it is done.
        let v2: AgentVersion = "2.0.0+2".parse().unwrap();
        fleet
            .rollouts
            .answer("stranger", "", &v2, true)
            .await
            .unwrap();
        assert_eq!(placed(&fleet.rollouts.wave_counts().await.unwrap()), 2);
    }

    #[tokio::test]
    async fn contacts_wait_for_their_batch_and_only_the_latest_is_written() {
        let home = tempfile::tempdir().unwrap();
        let fleet = fleet(home.path()).await;
        fleet.save(contact("a", "1.0.0+1", 10)).await.unwrap();
        fleet.contact(contact("a", "1.0.0+1", 20)).await.unwrap();
        fleet.contact(contact("a", "1.0.0+1", 30)).await.unwrap();
        fleet.contact(contact("b", "1.0.0+1", 30)).await.unwrap();
        assert_eq!(fleet.contacts_pending(), 2);
        assert_eq!(fleet.db.agent("a").await.unwrap().unwrap().last_contact, 10);
        assert!(fleet.db.agent("b").await.unwrap().is_none());
        fleet.flush_contacts().await;
        assert_eq!(fleet.contacts_pending(), 0);
        assert_eq!(fleet.db.agent("a").await.unwrap().unwrap().last_contact, 30);
        assert_eq!(fleet.db.agent("b").await.unwrap().unwrap().name, "host-b");
    }

    #[test]
    fn an_unchanged_contact_is_written_once_a_refresh() {
        // The first contact, and one that says something new, are written at once.
        assert!(worth_writing(None, (1, 100), 45));
        assert!(worth_writing(Some((1, 100)), (2, 101), 45));
        // The same again: not before the last one is a refresh old.
        assert!(!worth_writing(Some((1, 100)), (1, 130), 45));
        assert!(!worth_writing(Some((1, 100)), (1, 144), 45));
        assert!(worth_writing(Some((1, 100)), (1, 145), 45));
        // No refresh: every contact.
        assert!(worth_writing(Some((1, 100)), (1, 100), 0));
    }

    #[tokio::test]
    async fn a_re_held_connect_that_says_nothing_new_waits_for_the_refresh() {
        let home = tempfile::tempdir().unwrap();
        let fleet = fleet(home.path())
            .await
            .with_contact_refresh(Duration::from_secs(45));
        let last_contact =
            async |fleet: &Fleet| fleet.db.agent("a").await.unwrap().unwrap().last_contact;
        // Times as the server stamps them: old contacts are forgotten by the clock.
        let t = now_secs();
        fleet.save(contact("a", "1.0.0+1", t)).await.unwrap();
        // Batched: the first contact this server had of it.
        fleet
            .contact(contact("a", "1.0.0+1", t + 10))
            .await
            .unwrap();
        fleet.flush_due_contacts().await;
        assert_eq!(last_contact(&fleet).await, t + 10);
        // A heartbeat later, nothing new: kept aside, not batched.
        fleet
            .contact(contact("a", "1.0.0+1", t + 40))
            .await
            .unwrap();
        assert_eq!(fleet.contacts_pending(), 0);
        fleet.flush_due_contacts().await;
        assert_eq!(last_contact(&fleet).await, t + 10);
        // Its health changed: batched at once.
        let mut sick = contact("a", "1.0.0+1", t + 45);
        if let Deferred::Contact { health, .. } = &mut sick {
            *health = Some(agent_protocol::wire::AgentHealth {
                healthy: false,
                ..agent_protocol::wire::AgentHealth::no_workload()
            });
        }
        fleet.contact(sick.clone()).await.unwrap();
        fleet.flush_due_contacts().await;
        assert_eq!(last_contact(&fleet).await, t + 45);
        // The same again a refresh after the last batched one: batched, so no other
        // server sees a live agent go stale.
        let at_time = |mut w: Deferred, when: i64| {
            if let Deferred::Contact { at, .. } = &mut w {
                *at = when;
            }
            w
        };
        fleet.contact(at_time(sick.clone(), t + 90)).await.unwrap();
        fleet.flush_due_contacts().await;
        assert_eq!(last_contact(&fleet).await, t + 90);
        // Kept aside, then people read the agents: they read every contact as it came.
        fleet.contact(at_time(sick, t + 100)).await.unwrap();
        fleet.flush_due_contacts().await;
        assert_eq!(last_contact(&fleet).await, t + 90);
        fleet.flush_contacts().await;
        assert_eq!(last_contact(&fleet).await, t + 100);
        // A removed agent that comes back is batched at once.
        fleet.revoke("a", Revocation::Removed).await.unwrap();
        assert!(fleet.batched.lock().unwrap().is_empty());
        assert!(fleet.quiet.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_contact_kept_aside_is_written_once_its_agent_stays_silent_for_a_refresh() {
        let home = tempfile::tempdir().unwrap();
        let fleet = fleet(home.path())
            .await
            .with_contact_refresh(Duration::from_secs(45));
        let t = now_secs();
        fleet.save(contact("a", "1.0.0+1", t - 100)).await.unwrap();
        fleet
            .contact(contact("a", "1.0.0+1", t - 90))
            .await
            .unwrap();
        // Nothing new 20 s later: kept aside; then the agent says nothing more.
        fleet
            .contact(contact("a", "1.0.0+1", t - 70))
            .await
            .unwrap();
        fleet.flush_due_contacts().await;
        let row = fleet.db.agent("a").await.unwrap().unwrap();
        assert_eq!(row.last_contact, t - 70);
        assert!(fleet.quiet.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn reports_arriving_together_are_written_together_each_after_its_contact() {
        let home = tempfile::tempdir().unwrap();
        let fleet = Arc::new(fleet(home.path()).await);
        let ids: Vec<String> = (0..300).map(|i| format!("agent-{i:03}")).collect();
        for id in &ids {
            fleet.save(contact(id, "1.0.0+1", 10)).await.unwrap();
            // Each one's last connect waits in the batch when its report comes.
            fleet.contact(contact(id, "1.0.0+1", 50)).await.unwrap();
        }
        let saves: Vec<_> = ids
            .iter()
            .map(|id| {
                let fleet = Arc::clone(&fleet);
                let report = Deferred::Report {
                    report: Report {
                        id: id.clone(),
                        from: "1.0.0+1".into(),
                        to: "2.0.0+1".into(),
                        status: UpdateStatus::Installed,
                        error: None,
                    },
                    at_ms: 50_000,
                };
                tokio::spawn(async move { fleet.save(report).await })
            })
            .collect();
        for save in saves {
            save.await.unwrap().unwrap();
        }
        assert_eq!(
            fleet.contacts_pending(),
            0,
            "each contact went before its report"
        );
        fleet.flush_contacts().await;
        for id in &ids {
            let a = fleet.db.agent(id).await.unwrap().unwrap();
            assert_eq!(
                (a.version.as_str(), a.last_contact),
                ("2.0.0+1", 50),
                "{id}"
            );
            assert_eq!(a.update_status.as_deref(), Some("INSTALLED"), "{id}");
        }
    }

    #[tokio::test]
    async fn a_report_is_written_after_the_contact_that_came_before_it() {
        let home = tempfile::tempdir().unwrap();
        let fleet = fleet(home.path()).await;
        fleet.save(contact("a", "1.0.0+1", 10)).await.unwrap();
        // The old version's last connect, then, within the same second, the new one's
        // report: the batch must not write the old version over the report's.
        fleet.contact(contact("a", "1.0.0+1", 50)).await.unwrap();
        let report = Report {
            id: "a".into(),
            from: "1.0.0+1".into(),
            to: "2.0.0+1".into(),
            status: UpdateStatus::Installed,
            error: None,
        };
        fleet
            .save(Deferred::Report {
                report,
                at_ms: 50_000,
            })
            .await
            .unwrap();
        assert_eq!(fleet.contacts_pending(), 0);
        fleet.flush_contacts().await;
        let a = fleet.db.agent("a").await.unwrap().unwrap();
        assert_eq!((a.version.as_str(), a.last_contact), ("2.0.0+1", 50));
        assert_eq!(a.update_status.as_deref(), Some("INSTALLED"));
    }

    #[tokio::test]
    async fn a_revoked_agent_is_refused_listed_as_it_left_or_forgotten() {
        let home = tempfile::tempdir().unwrap();
        let fleet = fleet(home.path()).await;
        for id in ["a", "b"] {
            fleet.save(contact(id, "1.0.0+1", 10)).await.unwrap();
            assert!(fleet.db.issue_token(id, "h").await.unwrap());
        }
        assert!(fleet.revoke("a", Revocation::Left).await.unwrap());
        assert!(fleet.revoke("b", Revocation::Removed).await.unwrap());
        assert!(!fleet.revoke("nobody", Revocation::Removed).await.unwrap());
        assert_eq!(
            fleet.db.credentials("a").await.unwrap(),
            Credentials::Revoked(Revocation::Left)
        );
        assert_eq!(
            fleet.db.credentials("b").await.unwrap(),
            Credentials::Revoked(Revocation::Removed)
        );
        let a = fleet.db.agent("a").await.unwrap().unwrap();
        assert_eq!(a.update_status.as_deref(), Some("LEFT"));
        assert!(fleet.db.agent("b").await.unwrap().is_none());
        let (by_version, _) = fleet.db.fleet_counts().await.unwrap();
        assert!(by_version.is_empty(), "{by_version:?}");
    }

    #[tokio::test]
    async fn contacts_wait_in_their_batch_while_the_database_is_away() {
        let home = tempfile::tempdir().unwrap();
        let fleet = fleet(home.path()).await;
        fleet.save(contact("a", "1.0.0+1", 10)).await.unwrap();
        fleet.contact(contact("a", "1.0.0+1", 20)).await.unwrap();
        fleet
            .outage
            .went_down(&FleetError::Config("test: the database went away".into()));
        fleet.flush_contacts().await;
        assert_eq!((fleet.contacts_pending(), fleet.outage.queued()), (1, 0));
        // A heartbeat later replaces it; what is saved goes to the spool.
        fleet.contact(contact("a", "1.0.0+1", 30)).await.unwrap();
        fleet.flush_contacts().await;
        fleet.save(contact("b", "1.0.0+1", 25)).await.unwrap();
        assert_eq!((fleet.contacts_pending(), fleet.outage.queued()), (1, 1));
        fleet.drain().await;
        assert!(!fleet.outage.is_down());
        fleet.flush_contacts().await;
        assert_eq!(fleet.db.agent("a").await.unwrap().unwrap().last_contact, 30);
        assert_eq!(fleet.db.agent("b").await.unwrap().unwrap().last_contact, 25);
        assert_eq!((fleet.contacts_pending(), fleet.outage.queued()), (0, 0));
    }

    #[tokio::test]
    async fn a_spool_of_thousands_of_contacts_drains_in_batches() {
        let home = tempfile::tempdir().unwrap();
        let fleet = fleet(home.path()).await;
        fleet
            .outage
            .went_down(&FleetError::Config("test: the database went away".into()));
        for i in 0..(DRAIN_CONTACTS * 2 + 5) {
            fleet
                .save(contact(&format!("agent-{i}"), "1.0.0+1", 10))
                .await
                .unwrap();
        }
        fleet.drain().await;
        assert!(!fleet.outage.is_down());
        let (by_version, _) = fleet.db.fleet_counts().await.unwrap();
        let expected = i64::try_from(DRAIN_CONTACTS * 2 + 5).unwrap();
        assert_eq!(by_version, vec![("1.0.0+1".to_owned(), expected)]);
    }

    #[tokio::test]
    async fn queued_reports_of_many_agents_drain_together_each_agents_in_its_order() {
        let home = tempfile::tempdir().unwrap();
        let fleet = fleet(home.path()).await;
        fleet
            .outage
            .went_down(&FleetError::Config("test: the database went away".into()));
        let agents = DRAIN_RUN + 40;
        let report = |i: usize, status| Deferred::Report {
            report: Report {
                id: format!("agent-{i}"),
                from: "1.0.0+1".into(),
                to: "2.0.0+1".into(),
                status,
                error: None,
            },
            at_ms: 60_000,
        };
        // Interleaved as a wave's reports come: every agent's INSTALLING, then each one's
        // INSTALLED; the first run of the drain ends between an agent's two.
        for status in [UpdateStatus::Installing, UpdateStatus::Installed] {
            for i in 0..agents {
                fleet.save(report(i, status)).await.unwrap();
            }
        }
        fleet.drain().await;
        assert!(!fleet.outage.is_down());
        assert_eq!(fleet.outage.queued(), 0);
        let (by_version, by_status) = fleet.db.fleet_counts().await.unwrap();
        let all = i64::try_from(agents).unwrap();
        assert_eq!(by_version, vec![("2.0.0+1".to_owned(), all)]);
        assert_eq!(by_status, vec![("INSTALLED".to_owned(), all)]);
    }

    #[tokio::test]
    async fn a_report_of_an_agent_with_a_write_queued_is_queued_behind_it() {
        let home = tempfile::tempdir().unwrap();
        let fleet = fleet(home.path()).await;
        fleet.save(contact("a", "1.0.0+1", 10)).await.unwrap();
        let report = |status| Deferred::Report {
            report: Report {
                id: "a".into(),
                from: "1.0.0+1".into(),
                to: "2.0.0+1".into(),
                status,
                error: None,
            },
            at_ms: 20_000,
        };
        // A busy database left its INSTALLING queued; the database answers again.
        fleet.outage.defer(report(UpdateStatus::Installing));
        fleet.save(report(UpdateStatus::Installed)).await.unwrap();
        assert_eq!(fleet.outage.queued(), 2);
        fleet.save(contact("b", "1.0.0+1", 20)).await.unwrap();
        assert_eq!(
            fleet.outage.queued(),
            2,
            "an agent with nothing queued is written"
        );
        fleet.drain().await;
        let a = fleet.db.agent("a").await.unwrap().unwrap();
        assert_eq!(
            (a.version.as_str(), a.update_status.as_deref()),
            ("2.0.0+1", Some("INSTALLED"))
        );
    }

    #[tokio::test]
    async fn a_report_not_written_in_time_is_answered_queued_and_written_meanwhile() {
        let home = tempfile::tempdir().unwrap();
        let fleet = Arc::new(fleet(home.path()).await);
        fleet.save(contact("a", "1.0.0+1", 10)).await.unwrap();
        let report = Deferred::Report {
            report: Report {
                id: "a".into(),
                from: "1.0.0+1".into(),
                to: "2.0.0+1".into(),
                status: UpdateStatus::Installed,
                error: None,
            },
            at_ms: 20_000,
        };
        // Every connection of the pool busy.
        let pool = fleet.db.pool();
        let mut busy = Vec::new();
        for _ in 0..pool.options().get_max_connections() {
            busy.push(pool.acquire().await.unwrap());
        }
        let saved = fleet.save_within(report, Duration::from_millis(100)).await;
        assert_eq!(saved.unwrap(), Saved::Queued);
        drop(busy);
        let started = std::time::Instant::now();
        loop {
            let a = fleet.db.agent("a").await.unwrap().unwrap();
            if a.update_status.as_deref() == Some("INSTALLED") {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(10), "never written");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let contact = contact("a", "2.0.0+1", 30);
        let saved = fleet.save_within(contact, Duration::from_secs(10)).await;
        assert_eq!(saved.unwrap(), Saved::Written);
    }

    #[tokio::test]
    async fn no_server_times_an_agent_out_while_a_server_holds_its_report_queued() {
        let home = tempfile::tempdir().unwrap();
        // Every agent told is past its deadline at once.
        let plan = Plan {
            agent_deadline: 0,
            ..Plan::default()
        };
        let fleet = fleet_with(home.path(), plan.clone(), "s1").await;
        let rollouts = Arc::clone(&fleet.rollouts);
        for id in ["a", "b"] {
            fleet
                .save(contact(id, "1.0.0+1", now_secs()))
                .await
                .unwrap();
        }
        // The INSTALLED of `a` waits in this server's spool (the database was busy); it
        // came a second before now, which keeps the test off the clock.
        fleet.outage.defer(Deferred::Report {
            report: Report {
                id: "a".into(),
                from: "1.0.0+1".into(),
                to: "2.0.0+2".into(),
                status: UpdateStatus::Installed,
                error: None,
            },
            at_ms: crate::db::now_ms() - 1000,
        });
        fleet.say_spool().await;
        // The rollout starts (its first decision opens the wave), and `a` is told.
        rollouts
            .serve(crate::rollout::Served {
                sha256: "b".repeat(64),
                signed_at: 1,
                version: "2.0.0+2".parse().unwrap(),
                platforms: Vec::new(),
            })
            .await
            .unwrap();
        rollouts.decide().await.unwrap();
        let v1: AgentVersion = "1.0.0+1".parse().unwrap();
        let told = rollouts.answer("a", "", &v1, true).await.unwrap().unwrap();
        assert!(!told.accepted, "{told:?}");
        // Another server decides: nobody is timed out while the report is queued.
        let there = Rollouts::new(fleet.db.clone(), plan, AcceptPolicy::default(), "s2".into());
        there.refresh().await.unwrap();
        there.decide().await.unwrap();
        let waves = there.wave_counts().await.unwrap();
        assert_eq!((waves[0].installed, waves[0].timed_out), (0, 0));
        // Written: `a` installed; nothing holds the deadlines back, and `b`, which never
        // called in, is timed out.
        fleet.drain().await;
        fleet.say_spool().await;
        there.decide().await.unwrap();
        let waves = there.wave_counts().await.unwrap();
        assert_eq!((waves[0].installed, waves[0].timed_out), (1, 1));
    }

    #[test]
    fn a_server_says_what_it_holds_queued_when_it_changes_and_while_it_lasts() {
        let every = SPOOL_SAY_EVERY_MS;
        assert!(spool_worth_saying(None, None, 0), "said once at start");
        assert!(!spool_worth_saying(Some((None, 0)), None, 10 * every));
        assert!(spool_worth_saying(Some((None, 0)), Some(5), 1));
        assert!(!spool_worth_saying(Some((Some(5), 0)), Some(5), every - 1));
        assert!(spool_worth_saying(Some((Some(5), 0)), Some(5), every));
        assert!(spool_worth_saying(Some((Some(5), 0)), None, 1));
        assert!(every * 3 < settings::SPOOL_OLDEST_FRESH_MS);
    }

    #[tokio::test]
    async fn a_token_forgotten_on_another_server_is_no_longer_trusted_from_memory() {
        let home = tempfile::tempdir().unwrap();
        let here = fleet(home.path()).await;
        let there = fleet(home.path()).await;
        here.save(contact("a", "1.0.0+1", 10)).await.unwrap();
        here.remember_verified("a", "hash-a");
        here.remember_verified("b", "hash-b");
        assert!(here.verified("a", "hash-a") && !here.verified("a", "hash-b"));
        // Nothing changed in the fleet: what was verified stays.
        let revision = here
            .db
            .setting(settings::CREDENTIALS_REVISION)
            .await
            .unwrap();
        here.credentials_changed(revision);
        assert!(here.verified("b", "hash-b"));
        assert!(there.forget_token("a").await.unwrap());
        assert!(!there.forget_token("nobody").await.unwrap());
        let revision = here
            .db
            .setting(settings::CREDENTIALS_REVISION)
            .await
            .unwrap();
        here.credentials_changed(revision);
        assert!(!here.verified("a", "hash-a") && !here.verified("b", "hash-b"));
    }
}
