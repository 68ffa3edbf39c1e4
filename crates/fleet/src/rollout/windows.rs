//! The bundle directive's maintenance windows: an agent of a windowed group whose wave
//! opened outside its window is accepted on its old version, told the release and the
//! window's start, and recorded `WAITING_WINDOW`; its deadline counts from that start.
//! When the window opens it is refused like any other agent of an open wave. Whether a
//! window is open is [`crate::maintenance`]'s pure answer; this is its I/O.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sqlx::Row;

use super::{Rollouts, lock};
use crate::db::now_ms;
use crate::error::FleetError;
use crate::maintenance::{self, CatchUp, Gate, Schedule};
use crate::rollout::step::State;
use crate::rollout::store::{Membership, RolloutRow};

/// The `update_status` of an agent held for its window (the wire's `WAITING_WINDOW`).
pub const WAITING_WINDOW: &str = "WAITING_WINDOW";

/// What this server already recorded for waiting agents: (rollout, next opening), so a
/// heartbeat that changes nothing writes nothing; and the rollout and open waves last
/// swept (see [`Rollouts::sweep_windows`]).
#[derive(Default)]
pub(super) struct Waiting {
    recorded: Mutex<HashMap<String, (i64, i64)>>,
    swept: Mutex<Option<(i64, u32)>>,
}

impl Rollouts {
    /// The windows new updates wait for (none: any time).
    pub fn with_maintenance(self, schedule: Schedule) -> Self {
        self.set_maintenance(schedule);
        self
    }

    /// The windows as they are now.
    pub fn maintenance(&self) -> Arc<Schedule> {
        Arc::clone(&self.schedule.borrow())
    }

    /// A receiver that sees the windows replaced (whoever waits for the next opening).
    pub fn maintenance_changes(&self) -> tokio::sync::watch::Receiver<Arc<Schedule>> {
        self.schedule.subscribe()
    }

    /// Replaces the windows (the server read its configuration again). What was worked
    /// out from the old ones is forgotten: waiting agents are recorded again with their
    /// new window at their next contact, the open waves are swept again, and held
    /// connects look again at once.
    pub fn set_maintenance(&self, schedule: Schedule) {
        self.schedule.send_replace(Arc::new(schedule));
        lock(&self.window_waiting.recorded).clear();
        *lock(&self.window_waiting.swept) = None;
        self.news.publish("the maintenance windows changed");
    }

    /// When an agent of `group` that would be told now must wait: the next window's
    /// start (unix seconds). `None`: it may update now (no window names its group, one
    /// is open, or it missed an `at-once` window since its wave opened).
    pub(super) async fn window_wait(
        &self,
        current: &RolloutRow,
        group: &str,
        member: &Membership,
        now_ms: i64,
    ) -> Result<Option<i64>, FleetError> {
        let now = now_ms.div_euclid(1000);
        let schedule = self.maintenance();
        let Gate::Closed { opens } = schedule.gate(group, now) else {
            return Ok(None);
        };
        let at_once = schedule
            .windows()
            .iter()
            .any(|w| w.applies_to(group) && w.catch_up() == CatchUp::AtOnce);
        if at_once
            && let Some(opened_ms) = wave_opened_at(self, current.id, member.wave).await?
            && schedule.catch_up_now(group, opened_ms.div_euclid(1000), now)
        {
            return Ok(None);
        }
        Ok(Some(opens))
    }

    /// The same without the database (while it is away): the window alone decides; a
    /// missed `at-once` window waits for the next until the database is back.
    pub(super) fn window_wait_offline(&self, group: &str) -> Option<i64> {
        match self.maintenance().gate(group, now_ms().div_euclid(1000)) {
            Gate::Closed { opens } => Some(opens),
            Gate::Any | Gate::Open { .. } => None,
        }
    }

    /// Records `agent` waiting for the window that opens at `opens`: `WAITING_WINDOW`
    /// with that start in its row, and its deadline counting from it (its `told_at` is
    /// the opening, where it is told by the `409` the window's opening brings).
    pub(super) async fn wait_for_window(
        &self,
        current: &RolloutRow,
        agent: &str,
        opens: i64,
    ) -> Result<(), FleetError> {
        if lock(&self.window_waiting.recorded).get(agent) == Some(&(current.id, opens)) {
            return Ok(());
        }
        let why = format!("next window opens at {}", maintenance::rfc3339(opens));
        sqlx::query(
            "UPDATE agents SET update_status = $2, update_error = $3 WHERE id = $1
             AND (update_status IS NULL OR update_status <> $2 OR update_error IS NULL OR update_error <> $3)",
        )
        .bind(agent)
        .bind(WAITING_WINDOW)
        .bind(&why)
        .execute(self.db().pool())
        .await?;
        let at = opens.saturating_mul(1000);
        sqlx::query(
            "UPDATE rollout_agents SET told_at = $3
             WHERE rollout_id = $1 AND agent_id = $2 AND outcome IS NULL
               AND (told_at IS NULL OR told_at <> $3)",
        )
        .bind(current.id)
        .bind(agent)
        .bind(at)
        .execute(self.db().pool())
        .await?;
        self.engine.remember(current.id, agent, |m| m.told = true);
        let first = lock(&self.window_waiting.recorded)
            .insert(agent.to_owned(), (current.id, opens))
            .is_none();
        if first {
            tracing::info!(agent = %agent, rollout = current.id, "WAITING_WINDOW: {why}");
        }
        Ok(())
    }

    /// Once per wave that opens: the agents of the open waves not told yet whose group's
    /// windows are all closed have their deadline start at their next window's opening
    /// (their `told_at`), so that one that does not call in before it is not timed out
    /// from the wave's opening instead. One that calls in is recorded `WAITING_WINDOW` by
    /// [`Rollouts::answer`].
    pub(super) async fn sweep_windows(&self) -> Result<(), FleetError> {
        let Some(current) = self.current() else {
            return Ok(());
        };
        let key = (current.id, current.opened);
        let schedule = self.maintenance();
        if schedule.is_empty()
            || current.opened == 0
            || !matches!(current.state, State::Running | State::Soaking)
            || *lock(&self.window_waiting.swept) == Some(key)
        {
            return Ok(());
        }
        let now = now_ms().div_euclid(1000);
        let untold = sqlx::query(
            "SELECT ra.agent_id, COALESCE(a.agent_group, '') FROM rollout_agents ra
             JOIN agents a ON a.id = ra.agent_id
             WHERE ra.rollout_id = $1 AND ra.wave <= $2 AND ra.told_at IS NULL AND ra.outcome IS NULL",
        )
        .bind(current.id)
        .bind(i64::from(current.opened))
        .fetch_all(self.db().pool())
        .await?;
        for row in untold {
            let (agent, group): (String, String) = (row.get(0), row.get(1));
            if let Gate::Closed { opens } = schedule.gate(&group, now) {
                sqlx::query(
                    "UPDATE rollout_agents SET told_at = $3
                     WHERE rollout_id = $1 AND agent_id = $2 AND told_at IS NULL",
                )
                .bind(current.id)
                .bind(&agent)
                .bind(opens.saturating_mul(1000))
                .execute(self.db().pool())
                .await?;
                self.engine.remember(current.id, &agent, |m| m.told = true);
            }
        }
        *lock(&self.window_waiting.swept) = Some(key);
        Ok(())
    }

    /// `agent` may update now: a later wait is recorded again.
    pub(super) fn window_passed(&self, agent: &str) {
        lock(&self.window_waiting.recorded).remove(agent);
    }
}

/// When wave `wave` of rollout `rollout` opened (unix milliseconds), if it did.
async fn wave_opened_at(
    rollouts: &Rollouts,
    rollout: i64,
    wave: u32,
) -> Result<Option<i64>, FleetError> {
    let row =
        sqlx::query("SELECT opened_at FROM rollout_waves WHERE rollout_id = $1 AND wave = $2")
            .bind(rollout)
            .bind(i64::from(wave))
            .fetch_optional(rollouts.db().pool())
            .await?;
    Ok(row.and_then(|r| r.get::<Option<i64>, _>(0)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::{Contact, Db, now_secs};
    use crate::maintenance::{Window, WindowSpec};
    use crate::rollout::Served;
    use crate::rollout::plan::Plan;
    use agent_protocol::{AcceptPolicy, AgentVersion};

    /// A daily window of the `db` group starting at `start` (unix seconds, whole minutes
    /// of UTC) for an hour.
    fn db_window(start: i64) -> Schedule {
        let groups = ["db".to_owned()];
        let hhmm = format!("{:02}:{:02}", start % 86_400 / 3600, start % 3600 / 60);
        let window = Window::new(&WindowSpec {
            groups: &groups,
            days: &[],
            start: &hhmm,
            duration_secs: 3600,
            timezone: "UTC",
            catch_up: "next-window",
        })
        .unwrap();
        Schedule::new(vec![window])
    }

    /// Agents `db-1` (group db) and `web-1` on 1.0.0, and the rollout of 2.0.0 open to all.
    async fn rollout(home: &std::path::Path, schedule: Schedule) -> Rollouts {
        let db = Db::open("", home, 1).await.unwrap();
        for (id, group) in [("db-1", "db"), ("web-1", "web")] {
            let contact = Contact {
                id,
                name: id,
                platform: "p",
                version: "1.0.0+1",
                group: Some(group),
                config_hash: Some(""),
                labels: None,
                at: now_secs(),
            };
            db.touch_agents(&[(contact, None)]).await.unwrap();
        }
        let plan = Plan::default();
        let rollouts =
            Rollouts::new(db, plan, AcceptPolicy::default(), "s".into()).with_maintenance(schedule);
        let served = Served {
            sha256: "b".repeat(64),
            signed_at: 1,
            version: "2.0.0+2".parse().unwrap(),
            platforms: Vec::new(),
        };
        rollouts.serve(served).await.unwrap();
        rollouts.decide().await.unwrap();
        rollouts
    }

    #[tokio::test]
    async fn outside_its_window_an_agent_waits_accepted_and_its_deadline_starts_at_the_opening() {
        let home = tempfile::tempdir().unwrap();
        // Opens in two hours (whole minutes), closed now.
        let opens = (now_secs() + 7200) / 60 * 60;
        let rollouts = rollout(home.path(), db_window(opens)).await;
        let v1: AgentVersion = "1.0.0+1".parse().unwrap();
        let db1 = rollouts
            .answer("db-1", "db", &v1, true)
            .await
            .unwrap()
            .unwrap();
        assert!(db1.accepted && !db1.no_bundle, "{db1:?}");
        assert_eq!(db1.window, Some(opens));
        // Another group has no window: refused as ever.
        let web = rollouts
            .answer("web-1", "web", &v1, true)
            .await
            .unwrap()
            .unwrap();
        assert!(!web.accepted && web.window.is_none(), "{web:?}");
        let row = rollouts.db().agent("db-1").await.unwrap().unwrap();
        assert_eq!(row.update_status.as_deref(), Some(WAITING_WINDOW));
        assert_eq!(
            row.update_error,
            Some(format!(
                "next window opens at {}",
                maintenance::rfc3339(opens)
            ))
        );
        let members = rollouts.members().await.unwrap();
        assert_eq!(members["db-1"].1, Some(opens as f64), "told at the opening");
        assert!(!rollouts.would_refuse("db-1", "db", &v1));
        // OpAMP: no package offered outside the window.
        let offer = rollouts.offer("db-1", "db", Some(&v1), true).await;
        assert_eq!(offer.unwrap(), None);
        // Not timed out by a decision now: its deadline runs from the opening.
        rollouts.decide().await.unwrap();
        let waves = rollouts.wave_counts().await.unwrap();
        assert_eq!(waves[0].timed_out, 0);
    }

    #[tokio::test]
    async fn an_agent_that_never_calls_in_has_its_deadline_from_its_window() {
        let home = tempfile::tempdir().unwrap();
        let opens = (now_secs() + 7200) / 60 * 60;
        let rollouts = rollout(home.path(), db_window(opens)).await;
        // The wave opened in `rollout`, and its decision swept it: db-1 never called in.
        let members = rollouts.members().await.unwrap();
        assert_eq!(members["db-1"].1, Some(opens as f64));
        assert_eq!(
            members["web-1"].1, None,
            "no window: its deadline runs from the wave"
        );
    }

    #[tokio::test]
    async fn inside_its_window_an_agent_is_refused_and_updates() {
        let home = tempfile::tempdir().unwrap();
        // Opened a minute or two ago, open for an hour.
        let opened = (now_secs() - 60) / 60 * 60;
        let rollouts = rollout(home.path(), db_window(opened)).await;
        let v1: AgentVersion = "1.0.0+1".parse().unwrap();
        let db1 = rollouts
            .answer("db-1", "db", &v1, true)
            .await
            .unwrap()
            .unwrap();
        assert!(!db1.accepted && db1.window.is_none(), "{db1:?}");
        let offer = rollouts.offer("db-1", "db", Some(&v1), true).await;
        assert_eq!(offer.unwrap(), Some("2.0.0+2".parse().unwrap()));
    }
}
