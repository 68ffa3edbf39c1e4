//! The bundle directive's maintenance windows: an agent of a windowed group whose wave
//! opened outside its window is accepted on its old version, told the release and the
//! window's start, and recorded `WAITING_WINDOW`; its deadline counts from that start.
//! When the window opens it is refused like any other agent of an open wave. Whether a
//! window is open is [`crate::maintenance`]'s pure answer; this is its I/O.

use std::collections::HashMap;
use std::sync::Mutex;

use sqlx::Row;

use super::{Rollouts, lock};
use crate::db::now_ms;
use crate::error::FleetError;
use crate::maintenance::{self, CatchUp, Gate, Schedule};
use crate::rollout::store::{Membership, RolloutRow};

/// The `update_status` of an agent held for its window (the wire's `WAITING_WINDOW`).
pub const WAITING_WINDOW: &str = "WAITING_WINDOW";

/// What this server already recorded for waiting agents: (rollout, next opening), so a
/// heartbeat that changes nothing writes nothing.
#[derive(Default)]
pub(super) struct Waiting(Mutex<HashMap<String, (i64, i64)>>);

impl Rollouts {
    /// The windows new updates wait for (none: any time).
    pub fn with_maintenance(mut self, schedule: Schedule) -> Self {
        self.schedule = schedule;
        self
    }

    pub fn maintenance(&self) -> &Schedule {
        &self.schedule
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
        let Gate::Closed { opens } = self.schedule.gate(group, now) else {
            return Ok(None);
        };
        let at_once = self
            .schedule
            .windows()
            .iter()
            .any(|w| w.applies_to(group) && w.catch_up() == CatchUp::AtOnce);
        if at_once
            && let Some(opened_ms) = wave_opened_at(self, current.id, member.wave).await?
            && self
                .schedule
                .catch_up_now(group, opened_ms.div_euclid(1000), now)
        {
            return Ok(None);
        }
        Ok(Some(opens))
    }

    /// The same without the database (while it is away): the window alone decides; a
    /// missed `at-once` window waits for the next until the database is back.
    pub(super) fn window_wait_offline(&self, group: &str) -> Option<i64> {
        match self.schedule.gate(group, now_ms().div_euclid(1000)) {
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
        if lock(&self.window_waiting.0).get(agent) == Some(&(current.id, opens)) {
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
        let first = lock(&self.window_waiting.0)
            .insert(agent.to_owned(), (current.id, opens))
            .is_none();
        if first {
            tracing::info!(agent = %agent, rollout = current.id, "WAITING_WINDOW: {why}");
        }
        Ok(())
    }

    /// `agent` may update now: a later wait is recorded again.
    pub(super) fn window_passed(&self, agent: &str) {
        lock(&self.window_waiting.0).remove(agent);
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
