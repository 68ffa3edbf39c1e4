//! Fleet policy as live data: each deployment's maintenance windows, kept in the fleet
//! database and shared by every server of it, and the one-time seeding of `default`'s
//! policy and windows from what server.toml says when the fleet is new.
//!
//! - [`NewWindow`] / [`StoredWindow`]: a window as an operator writes it, checked by
//!   [`crate::maintenance::Window::new`];
//! - [`windows`], [`add_window`], [`remove_window`], [`replace_windows`]: the rows;
//! - [`seed`]: server.toml's values, once;
//! - [`disagreement`]: pure, what a server's file says that the fleet does not.
//!
//! It owns the `maintenance_windows` table and the settings key [`SEEDED`]. It never
//! reads server.toml (the edge hands it the file's values), and it knows no HTTP.

use serde_json::json;
use sqlx::Row;

use crate::db::{Db, now_ms};
use crate::deployment_table::DEFAULT;
use crate::error::FleetError;
use crate::maintenance::{Schedule, Window, WindowSpec};
use crate::rollout::plan::Plan;

/// Set once `default`'s policy and windows were seeded from a server's file.
pub const SEEDED: &str = "policy.seeded";

/// At most this many windows a deployment (a bound on what a connect looks through).
pub const MAX_WINDOWS: usize = 32;

/// A window as written: a `[[maintenance]]` table of server.toml, or `maintenance add`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewWindow {
    pub deployment: String,
    pub groups: Vec<String>,
    /// Empty: every day.
    pub days: Vec<String>,
    pub start: String,
    pub duration_secs: i64,
    pub timezone: String,
    pub catch_up: String,
}

impl NewWindow {
    fn spec(&self) -> WindowSpec<'_> {
        WindowSpec {
            groups: &self.groups,
            days: &self.days,
            start: &self.start,
            duration_secs: self.duration_secs,
            timezone: &self.timezone,
            catch_up: &self.catch_up,
        }
    }

    /// The window checked; the error names the key at fault.
    pub fn window(&self) -> Result<Window, String> {
        Window::new(&self.spec())
    }

    /// What makes two windows the same, whatever their order of groups and days and
    /// the case of the days.
    fn key(&self) -> (Vec<String>, Vec<String>, &str, i64, &str, &str) {
        let mut groups: Vec<String> = self.groups.iter().map(|g| g.trim().to_owned()).collect();
        groups.sort();
        let mut days: Vec<String> = self
            .days
            .iter()
            .map(|d| d.trim().to_ascii_lowercase())
            .collect();
        days.sort();
        // Every day written out is every day.
        if days.len() == 7 {
            days.clear();
        }
        (
            groups,
            days,
            self.start.trim(),
            self.duration_secs,
            self.timezone.trim(),
            self.catch_up.trim(),
        )
    }
}

/// A window as the fleet keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredWindow {
    pub id: i64,
    pub window: NewWindow,
    /// Unix milliseconds.
    pub created_at: i64,
}

impl StoredWindow {
    /// The window's JSON as `GET /admin/maintenance` lists it (the edge adds whether it
    /// is open and when it opens next).
    pub fn to_json(&self) -> serde_json::Value {
        let w = &self.window;
        json!({
            "id": self.id,
            "deployment": w.deployment,
            "groups": w.groups,
            "days": w.days,
            "start": w.start,
            "duration_secs": w.duration_secs,
            "timezone": w.timezone,
            "catch_up": w.catch_up,
        })
    }
}

/// The windows of `deployment` among `rows`, as a schedule. A stored row that no longer
/// checks (a time zone gone from the zone database) is left out and said.
pub fn schedule_of(rows: &[StoredWindow], deployment: &str) -> Schedule {
    Schedule::new(
        rows.iter()
            .filter(|r| r.window.deployment == deployment)
            .filter_map(|r| match r.window.window() {
                Ok(w) => Some(w),
                Err(e) => {
                    tracing::warn!(
                        "maintenance window {} of deployment {deployment} is left out: {e}; remove it (`update-server maintenance remove {}`) and add it again",
                        r.id,
                        r.id
                    );
                    None
                }
            })
            .collect(),
    )
}

/// Every window of the fleet, in the order they were added.
pub async fn windows(db: &Db) -> Result<Vec<StoredWindow>, FleetError> {
    let rows = sqlx::query(
        "SELECT id, deployment, groups, days, start, duration_s, timezone, catch_up, created_at
         FROM maintenance_windows ORDER BY id",
    )
    .fetch_all(db.pool())
    .await?;
    rows.iter().map(row_of).collect()
}

fn row_of(r: &sqlx::any::AnyRow) -> Result<StoredWindow, FleetError> {
    let list = |i: usize| -> Result<Vec<String>, FleetError> {
        let text: String = r.try_get(i)?;
        serde_json::from_str(&text)
            .map_err(|e| FleetError::Invalid(format!("a stored maintenance window: {e}")))
    };
    Ok(StoredWindow {
        id: r.try_get(0)?,
        window: NewWindow {
            deployment: r.try_get(1)?,
            groups: list(2)?,
            days: list(3)?,
            start: r.try_get(4)?,
            duration_secs: r.try_get(5)?,
            timezone: r.try_get(6)?,
            catch_up: r.try_get(7)?,
        },
        created_at: r.try_get(8)?,
    })
}

fn json_list(list: &[String]) -> String {
    serde_json::Value::from(list.to_vec()).to_string()
}

async fn insert(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    w: &NewWindow,
    at: i64,
) -> Result<i64, FleetError> {
    let row = sqlx::query(
        "INSERT INTO maintenance_windows (deployment, groups, days, start, duration_s, timezone, catch_up, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id",
    )
    .bind(&w.deployment)
    .bind(json_list(&w.groups))
    .bind(json_list(&w.days))
    .bind(w.start.trim())
    .bind(w.duration_secs)
    .bind(w.timezone.trim())
    .bind(w.catch_up.trim())
    .bind(at)
    .fetch_one(&mut **tx)
    .await?;
    Ok(row.try_get(0)?)
}

async fn count_of(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    deployment: &str,
) -> Result<usize, FleetError> {
    let n: i64 = sqlx::query("SELECT COUNT(*) FROM maintenance_windows WHERE deployment = $1")
        .bind(deployment)
        .fetch_one(&mut **tx)
        .await?
        .try_get(0)?;
    Ok(usize::try_from(n).unwrap_or(usize::MAX))
}

/// Adds a window to a deployment; refused (nothing changed) for a window that does not
/// check, a deployment that does not exist, or one with [`MAX_WINDOWS`] already.
pub async fn add_window(db: &Db, new: &NewWindow) -> Result<StoredWindow, FleetError> {
    new.window()
        .map_err(|e| FleetError::Invalid(format!("maintenance window: {e}")))?;
    let mut tx = db.begin_write().await?;
    let known = sqlx::query("SELECT name FROM deployments WHERE name = $1")
        .bind(&new.deployment)
        .fetch_optional(&mut *tx)
        .await?;
    if known.is_none() {
        return Err(FleetError::NotFound(format!(
            "no deployment {:?}; list them with `update-server deployment list`",
            new.deployment
        )));
    }
    if count_of(&mut tx, &new.deployment).await? >= MAX_WINDOWS {
        return Err(FleetError::Invalid(format!(
            "deployment {} has {MAX_WINDOWS} maintenance windows, the most it may have; remove one first",
            new.deployment
        )));
    }
    let at = now_ms();
    let id = insert(&mut tx, new, at).await?;
    tx.commit().await?;
    Ok(StoredWindow {
        id,
        window: new.clone(),
        created_at: at,
    })
}

/// Removes a window: the window it was.
pub async fn remove_window(db: &Db, id: i64) -> Result<StoredWindow, FleetError> {
    let mut tx = db.begin_write().await?;
    let row = sqlx::query(
        "SELECT id, deployment, groups, days, start, duration_s, timezone, catch_up, created_at
         FROM maintenance_windows WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(row) = row else {
        return Err(FleetError::NotFound(format!(
            "no maintenance window {id}; list them with `update-server maintenance list`"
        )));
    };
    let before = row_of(&row)?;
    sqlx::query("DELETE FROM maintenance_windows WHERE id = $1")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(before)
}

/// Replaces a deployment's windows with `windows` (server.toml read again): the
/// windows it had.
pub async fn replace_windows(
    db: &Db,
    deployment: &str,
    windows: &[NewWindow],
) -> Result<Vec<StoredWindow>, FleetError> {
    for w in windows {
        w.window()
            .map_err(|e| FleetError::Invalid(format!("maintenance window: {e}")))?;
    }
    let before: Vec<StoredWindow> = self::windows(db)
        .await?
        .into_iter()
        .filter(|w| w.window.deployment == deployment)
        .collect();
    let mut tx = db.begin_write().await?;
    sqlx::query("DELETE FROM maintenance_windows WHERE deployment = $1")
        .bind(deployment)
        .execute(&mut *tx)
        .await?;
    let at = now_ms();
    for w in windows {
        insert(&mut tx, w, at).await?;
    }
    tx.commit().await?;
    Ok(before)
}

/// Sets `default`'s policy (server.toml read again changed `[rollout]`).
pub async fn set_default_plan(db: &Db, plan: &Plan) -> Result<(), FleetError> {
    let text = serde_json::to_string(plan).map_err(|e| FleetError::Invalid(e.to_string()))?;
    sqlx::query("UPDATE deployments SET policy = $1, updated_at = $2 WHERE name = $3")
        .bind(text)
        .bind(now_ms())
        .bind(DEFAULT)
        .execute(db.pool())
        .await?;
    Ok(())
}

/// Seeds `default`'s policy (`[rollout]`) and windows (`[[maintenance]]`) from a
/// server's file, once for the fleet: true if this call did it. On PostgreSQL two
/// servers starting together seed it once (the key is claimed in the same transaction).
/// A `default` whose policy an operator already set keeps it.
pub async fn seed(db: &Db, plan: &Plan, windows: &[NewWindow]) -> Result<bool, FleetError> {
    let mut tx = db.begin_write().await?;
    let claimed = sqlx::query(
        "INSERT INTO settings (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING RETURNING key",
    )
    .bind(SEEDED)
    .bind(now_ms().to_string())
    .fetch_optional(&mut *tx)
    .await?;
    if claimed.is_none() {
        return Ok(false);
    }
    let text = serde_json::to_string(plan).map_err(|e| FleetError::Invalid(e.to_string()))?;
    sqlx::query("UPDATE deployments SET policy = $1 WHERE name = $2 AND policy IS NULL")
        .bind(text)
        .bind(DEFAULT)
        .execute(&mut *tx)
        .await?;
    if count_of(&mut tx, DEFAULT).await? == 0 {
        let at = now_ms();
        for w in windows {
            insert(&mut tx, w, at).await?;
        }
    }
    tx.commit().await?;
    Ok(true)
}

/// What a server's file says of `default`'s policy that the fleet does not, in words for
/// its log and `/healthz`; `None` when they agree. Pure.
pub fn disagreement(
    file_plan: &Plan,
    file_windows: &[NewWindow],
    fleet_plan: Option<&Plan>,
    fleet_windows: &[StoredWindow],
) -> Option<String> {
    let mut said = Vec::new();
    if fleet_plan.is_some_and(|p| p != file_plan) {
        said.push("[rollout]");
    }
    let mut file: Vec<_> = file_windows.iter().map(NewWindow::key).collect();
    let mut fleet: Vec<_> = fleet_windows
        .iter()
        .filter(|w| w.window.deployment == DEFAULT)
        .map(|w| w.window.key())
        .collect();
    file.sort();
    fleet.sort();
    if file != fleet {
        said.push("[[maintenance]]");
    }
    (!said.is_empty()).then(|| {
        format!(
            "this server's {} differ from the fleet's policy for deployment default; the server follows the fleet (see `update-server deployment show default` and `update-server maintenance list`); change the fleet's with `update-server deployment set default` or `update-server maintenance add|remove`, or make the file say the same",
            said.join(" and ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(start: &str) -> NewWindow {
        NewWindow {
            deployment: DEFAULT.into(),
            groups: vec!["db".into(), "web".into()],
            days: vec!["Sat".into(), "sun".into()],
            start: start.into(),
            duration_secs: 3600,
            timezone: "UTC".into(),
            catch_up: "next-window".into(),
        }
    }

    fn stored(w: NewWindow) -> StoredWindow {
        StoredWindow {
            id: 1,
            window: w,
            created_at: 0,
        }
    }

    #[test]
    fn a_file_that_says_what_the_fleet_does_agrees_whatever_its_order() {
        let plan = Plan::default();
        let mut reordered = window("02:00");
        reordered.groups.reverse();
        reordered.days = vec!["sun".into(), "sat".into()];
        assert_eq!(
            disagreement(&plan, &[window("02:00")], Some(&plan), &[stored(reordered)]),
            None
        );
        // A fleet whose `default` has no policy of its own follows the file's.
        assert_eq!(
            disagreement(&plan, &[], None, &[]),
            None,
            "nothing set anywhere"
        );
    }

    #[test]
    fn a_file_that_differs_says_which_section_and_what_to_do() {
        let plan = Plan::default();
        let other = Plan {
            wave_wait: 60,
            ..Plan::default()
        };
        let said = disagreement(&plan, &[window("02:00")], Some(&other), &[]).unwrap();
        assert!(said.contains("[rollout] and [[maintenance]]"), "{said}");
        assert!(said.contains("follows the fleet"), "{said}");
        let said = disagreement(
            &plan,
            &[window("02:00")],
            Some(&plan),
            &[stored(window("03:00"))],
        )
        .unwrap();
        assert!(
            said.contains("this server's [[maintenance]] differ"),
            "{said}"
        );
        // Another deployment's windows are not `default`'s.
        let mut prod = window("02:00");
        prod.deployment = "prod".into();
        assert!(disagreement(&plan, &[], Some(&plan), &[stored(prod)]).is_none());
    }

    #[tokio::test]
    async fn the_fleet_is_seeded_once_and_windows_are_kept_per_deployment() {
        let home = tempfile::tempdir().unwrap();
        let db = Db::open("", home.path(), 1).await.unwrap();
        let plan = Plan {
            wave_wait: 30,
            ..Plan::default()
        };
        assert!(seed(&db, &plan, &[window("02:00")]).await.unwrap());
        // A second server's file, or a restart, seeds nothing.
        assert!(
            !seed(&db, &Plan::default(), &[window("05:00")])
                .await
                .unwrap()
        );
        let all = windows(&db).await.unwrap();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].window.start, "02:00");
        let default = crate::deployments::get(&db, DEFAULT)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(default.policy, Some(plan));

        // A deployment that does not exist has no windows; a bad window changes nothing.
        let mut prod = window("04:00");
        prod.deployment = "prod".into();
        assert!(matches!(
            add_window(&db, &prod).await,
            Err(FleetError::NotFound(_))
        ));
        let mut bad = window("25:00");
        bad.deployment = DEFAULT.into();
        let e = add_window(&db, &bad).await.unwrap_err().to_string();
        assert!(e.contains("start"), "{e}");
        let added = add_window(&db, &window("06:00")).await.unwrap();
        assert_eq!(windows(&db).await.unwrap().len(), 2);
        assert_eq!(
            schedule_of(&windows(&db).await.unwrap(), DEFAULT)
                .windows()
                .len(),
            2
        );
        assert!(schedule_of(&windows(&db).await.unwrap(), "prod").is_empty());
        let removed = remove_window(&db, added.id).await.unwrap();
        assert_eq!(removed.window.start, "06:00");
        assert!(matches!(
            remove_window(&db, added.id).await,
            Err(FleetError::NotFound(_))
        ));
        let before = replace_windows(&db, DEFAULT, &[window("07:00"), window("08:00")])
            .await
            .unwrap();
        assert_eq!(before.len(), 1);
        let starts: Vec<String> = windows(&db)
            .await
            .unwrap()
            .into_iter()
            .map(|w| w.window.start)
            .collect();
        assert_eq!(starts, ["07:00", "08:00"]);
    }
}
