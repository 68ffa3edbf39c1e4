//! `[[maintenance]]` in server.toml (config-file only: an array of tables has no
//! `UPDATE_SERVER_*` form) as the fleet's [`Schedule`], and the task that wakes held
//! connects when a window opens, so an agent waiting for it learns within a second.

use std::sync::Arc;
use std::time::Duration;

use agent_fleet::maintenance::{Schedule, Window, WindowSpec};
use agent_fleet::news::News;
use serde::Deserialize;

/// One `[[maintenance]]` table as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct MaintenanceSection {
    /// Agent groups (`agent.group`); `"*"`: every agent.
    pub groups: Vec<String>,
    /// `mon` … `sun`; empty: every day.
    pub days: Vec<String>,
    /// `HH:MM` in `timezone`.
    pub start: String,
    /// `"3h"`, `"90m"`, or seconds.
    pub duration: Seconds,
    /// An IANA zone.
    pub timezone: String,
    /// `next-window` or `at-once`.
    pub catch_up: String,
}

impl Default for MaintenanceSection {
    fn default() -> Self {
        Self {
            groups: vec!["*".into()],
            days: Vec::new(),
            start: String::new(),
            duration: Seconds::Text(String::new()),
            timezone: "UTC".into(),
            catch_up: "next-window".into(),
        }
    }
}

/// A duration written as seconds or as text (`"3h"`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum Seconds {
    Count(i64),
    Text(String),
}

impl Seconds {
    fn secs(&self) -> Result<i64, String> {
        match self {
            Seconds::Count(n) => Ok(*n),
            // The server's one duration syntax (as for every `Kind::Seconds` key).
            Seconds::Text(t) => agent_protocol::settings::parse_seconds(t)
                .map_err(|e| format!("{e}; write {}", agent_protocol::settings::SECONDS_FORMS))
                .and_then(|n| i64::try_from(n).map_err(|_| format!("{t:?} is too long"))),
        }
    }
}

/// Every table checked; the error names the key (`maintenance.start`) and which table.
pub fn schedule(sections: &[MaintenanceSection]) -> Result<Schedule, String> {
    let mut windows = Vec::with_capacity(sections.len());
    for (i, m) in sections.iter().enumerate() {
        let at = |e: String| format!("maintenance.{e} (in [[maintenance]] number {})", i + 1);
        if m.start.trim().is_empty() {
            return Err(at(
                "start: missing; say when the window opens, as \"HH:MM\"".into(),
            ));
        }
        let duration_secs = m
            .duration
            .secs()
            .map_err(|e| at(format!("duration: {e}")))?;
        let window = Window::new(&WindowSpec {
            groups: &m.groups,
            days: &m.days,
            start: &m.start,
            duration_secs,
            timezone: &m.timezone,
            catch_up: &m.catch_up,
        })
        .map_err(at)?;
        windows.push(window);
    }
    Ok(Schedule::new(windows))
}

/// `GET /admin/maintenance`: each window as configured, whether it is open (until when)
/// and when it opens next, in unix seconds and RFC 3339 (UTC).
pub fn listing(schedule: &Schedule, now: i64) -> serde_json::Value {
    use agent_fleet::maintenance::rfc3339;
    let windows: Vec<serde_json::Value> = schedule
        .windows()
        .iter()
        .map(|w| {
            let until = w.open_until(now);
            let next = w.next_opening(now);
            serde_json::json!({
                "groups": w.groups(),
                "days": w.days(),
                "start": w.start(),
                "duration_secs": w.duration_secs(),
                "timezone": w.timezone(),
                "catch_up": w.catch_up().as_str(),
                "open": until.is_some(),
                "open_until": until,
                "open_until_utc": until.map(rfc3339),
                "next_opening": next,
                "next_opening_utc": next.map(rfc3339),
            })
        })
        .collect();
    serde_json::json!({ "now": now, "windows": windows })
}

/// The longest a sleep for the next opening lasts before it looks again (a clock set
/// back or forward is noticed within it).
const LOOK_AGAIN: Duration = Duration::from_secs(60);

/// Publishes news at each window's opening: held connects work out their answer again
/// and the agents the window lets in are told at once.
pub fn spawn_waker(schedule: Schedule, news: Arc<News>) {
    if schedule.is_empty() {
        return;
    }
    tokio::spawn(async move {
        loop {
            let now = agent_fleet::db::now_ms();
            let Some(next) = schedule.next_opening_any(now.div_euclid(1000)) else {
                tokio::time::sleep(LOOK_AGAIN).await;
                continue;
            };
            let wait_ms = next.saturating_mul(1000).saturating_sub(now).max(0);
            let wait = Duration::from_millis(u64::try_from(wait_ms).unwrap_or(0));
            if wait > LOOK_AGAIN {
                tokio::time::sleep(LOOK_AGAIN).await;
                continue;
            }
            tokio::time::sleep(wait).await;
            news.publish("a maintenance window opened");
            tracing::info!(
                "maintenance window opened at {}",
                agent_fleet::maintenance::rfc3339(next)
            );
            // Past the opening, so the next look finds the one after it.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_with_units_or_in_seconds() {
        for (text, secs) in [
            ("3h", 3 * 3600),
            ("90m", 5400),
            ("2d", 2 * 86_400),
            ("600", 600),
        ] {
            assert_eq!(Seconds::Text(text.into()).secs(), Ok(secs), "{text}");
        }
        assert_eq!(Seconds::Count(60).secs(), Ok(60));
        for bad in ["", "h", "3x", "-3h", "three hours"] {
            assert!(Seconds::Text(bad.into()).secs().is_err(), "{bad}");
        }
    }

    fn section(f: impl FnOnce(&mut MaintenanceSection)) -> Vec<MaintenanceSection> {
        let mut m = MaintenanceSection {
            start: "02:00".into(),
            duration: Seconds::Text("3h".into()),
            ..MaintenanceSection::default()
        };
        f(&mut m);
        vec![m]
    }

    #[test]
    fn bad_tables_name_the_key_and_the_table() {
        assert!(schedule(&section(|_| {})).is_ok());
        let e = schedule(&section(|m| m.days = vec!["funday".into()])).unwrap_err();
        assert!(
            e.starts_with("maintenance.days:") && e.contains("number 1"),
            "{e}"
        );
        let e = schedule(&section(|m| m.start = "25:00".into())).unwrap_err();
        assert!(e.starts_with("maintenance.start:"), "{e}");
        let e = schedule(&section(|m| m.timezone = "Nowhere/Land".into())).unwrap_err();
        assert!(e.starts_with("maintenance.timezone:"), "{e}");
        let e = schedule(&section(|m| m.duration = Seconds::Text("0m".into()))).unwrap_err();
        assert!(e.starts_with("maintenance.duration:"), "{e}");
        let e = schedule(&section(|m| m.duration = Seconds::Text("8d".into()))).unwrap_err();
        assert!(e.starts_with("maintenance.duration:"), "{e}");
        let e = schedule(&section(|m| m.start = String::new())).unwrap_err();
        assert!(e.starts_with("maintenance.start:"), "{e}");
    }
}
