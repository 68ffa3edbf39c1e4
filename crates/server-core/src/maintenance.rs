//! `[[maintenance]]` in server.toml (config-file only: an array of tables has no
//! `UPDATE_SERVER_*` form) as the fleet's [`Schedule`], and the task that wakes held
//! connects when a window opens, so an agent waiting for it learns within a second.
//! The windows can be replaced while the server runs (see [`crate::reload`]): the task
//! follows them.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use agent_fleet::maintenance::{Schedule, Window, WindowSpec};
use agent_fleet::news::News;
use agent_fleet::policy::{NewWindow, StoredWindow};
use serde::Deserialize;
use tokio::sync::watch;

/// One `[[maintenance]]` table as written.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
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

/// A `[[maintenance]]` table that is no window: which one (counted from 1) and why,
/// starting with its key (`start: …`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowError {
    pub number: usize,
    pub message: String,
}

impl fmt::Display for WindowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "maintenance.{} (in [[maintenance]] number {})",
            self.message, self.number
        )
    }
}

impl WindowError {
    /// The error with the line of its table in `text` (the file it was read from), when
    /// the file has that many `[[maintenance]]` headers.
    pub fn located(&self, text: &str) -> String {
        match table_line(text, "maintenance", self.number) {
            Some(line) => format!(
                "maintenance.{} (in [[maintenance]] number {}, at line {line})",
                self.message, self.number
            ),
            None => self.to_string(),
        }
    }
}

/// The line (from 1) of the `number`th `[[name]]` header of a TOML text.
fn table_line(text: &str, name: &str, number: usize) -> Option<usize> {
    let header = format!("[[{name}]]");
    text.lines()
        .enumerate()
        .filter(|(_, line)| {
            let line = line.trim();
            line.strip_prefix(&header)
                .is_some_and(|rest| rest.is_empty() || rest.trim_start().starts_with('#'))
        })
        .nth(number.checked_sub(1)?)
        .map(|(i, _)| i + 1)
}

/// Every table checked; the error names the key (`maintenance.start`) and which table.
pub fn schedule(sections: &[MaintenanceSection]) -> Result<Schedule, WindowError> {
    let mut windows = Vec::with_capacity(sections.len());
    for (i, m) in sections.iter().enumerate() {
        let at = |message: String| WindowError {
            number: i + 1,
            message,
        };
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

/// The tables as deployment `default`'s windows, each checked as [`schedule`] does.
pub fn windows(sections: &[MaintenanceSection]) -> Result<Vec<NewWindow>, WindowError> {
    schedule(sections)?;
    sections
        .iter()
        .enumerate()
        .map(|(i, m)| {
            Ok(NewWindow {
                deployment: agent_fleet::deployments::DEFAULT.to_owned(),
                groups: m.groups.clone(),
                days: m.days.clone(),
                start: m.start.trim().to_owned(),
                duration_secs: m.duration.secs().map_err(|message| WindowError {
                    number: i + 1,
                    message: format!("duration: {message}"),
                })?,
                timezone: m.timezone.clone(),
                catch_up: m.catch_up.clone(),
            })
        })
        .collect()
}

/// One window in a line for the log: `groups db; sat, sun; 02:00 for 10800s (UTC);
/// catch-up next-window`.
pub fn describe(w: &Window) -> String {
    let days = w.days();
    format!(
        "groups {}; {}; {} for {}s ({}); catch-up {}",
        w.groups().join(", "),
        if days.is_empty() || days.len() == 7 {
            "every day".to_owned()
        } else {
            days.join(", ")
        },
        w.start(),
        w.duration_secs(),
        w.timezone(),
        w.catch_up().as_str()
    )
}

/// The windows of `schedule` for the log, `none` for none.
pub fn describe_all(schedule: &Schedule) -> String {
    if schedule.is_empty() {
        return "none (updates at any time)".into();
    }
    schedule
        .windows()
        .iter()
        .map(|w| format!("[{}]", describe(w)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `GET /admin/maintenance`: each deployment's windows as the fleet keeps them, whether
/// each is open (until when) and when it opens next, in unix seconds and RFC 3339 (UTC).
/// A stored window that no longer checks is listed with its error.
pub fn listing(rows: &[StoredWindow], now: i64) -> serde_json::Value {
    use agent_fleet::maintenance::rfc3339;
    let windows: Vec<serde_json::Value> = rows
        .iter()
        .map(|row| {
            let mut listed = row.to_json();
            match row.window.window() {
                Ok(w) => {
                    let until = w.open_until(now);
                    let next = w.next_opening(now);
                    // The days as the window reads them (every day written out).
                    listed["days"] = serde_json::json!(w.days());
                    listed["open"] = serde_json::json!(until.is_some());
                    listed["open_until"] = serde_json::json!(until);
                    listed["open_until_utc"] = serde_json::json!(until.map(rfc3339));
                    listed["next_opening"] = serde_json::json!(next);
                    listed["next_opening_utc"] = serde_json::json!(next.map(rfc3339));
                }
                Err(e) => listed["error"] = serde_json::json!(e),
            }
            listed
        })
        .collect();
    serde_json::json!({ "now": now, "windows": windows })
}

/// The longest a sleep for the next opening lasts before it looks again (a clock set
/// back or forward is noticed within it).
const LOOK_AGAIN: Duration = Duration::from_secs(60);

/// Publishes news at each window's opening (of any deployment's windows): held connects
/// work out their answer again and the agents the window lets in are told at once.
/// Windows replaced meanwhile are looked at at once.
pub fn spawn_waker(mut changes: watch::Receiver<Arc<Schedule>>, news: Arc<News>) {
    // `changed()` fails once the rollouts are gone: the server is stopping.
    tokio::spawn(async move {
        loop {
            let schedule = Arc::clone(&changes.borrow_and_update());
            let now = agent_fleet::db::now_ms();
            let wait = match schedule.next_opening_any(now.div_euclid(1000)) {
                Some(next) => {
                    let wait_ms = next.saturating_mul(1000).saturating_sub(now).max(0);
                    Some((
                        next,
                        Duration::from_millis(u64::try_from(wait_ms).unwrap_or(0)),
                    ))
                }
                None => None,
            };
            let Some((next, wait)) = wait.filter(|(_, wait)| *wait <= LOOK_AGAIN) else {
                tokio::select! {
                    changed = changes.changed() => if changed.is_err() { return },
                    () = tokio::time::sleep(LOOK_AGAIN) => {}
                }
                continue;
            };
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return } else { continue },
                () = tokio::time::sleep(wait) => {}
            }
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
        let e = schedule(&section(|m| m.days = vec!["funday".into()]))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("maintenance.days:") && e.contains("number 1"),
            "{e}"
        );
        let e = schedule(&section(|m| m.start = "25:00".into()))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("maintenance.start:"), "{e}");
        let e = schedule(&section(|m| m.timezone = "Nowhere/Land".into()))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("maintenance.timezone:"), "{e}");
        let e = schedule(&section(|m| m.duration = Seconds::Text("0m".into())))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("maintenance.duration:"), "{e}");
        let e = schedule(&section(|m| m.duration = Seconds::Text("8d".into())))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("maintenance.duration:"), "{e}");
        let e = schedule(&section(|m| m.start = String::new()))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("maintenance.start:"), "{e}");
    }

    #[test]
    fn a_bad_table_is_found_by_its_line() {
        let text = "[server]\nlisten = \"x\"\n\n[[maintenance]]\nstart = \"02:00\"\n\n  [[maintenance]] # the second\nstart = \"25:00\"\n";
        assert_eq!(table_line(text, "maintenance", 1), Some(4));
        assert_eq!(table_line(text, "maintenance", 2), Some(7));
        assert_eq!(table_line(text, "maintenance", 3), None);
        assert_eq!(table_line(text, "maintenance", 0), None);
        let e = WindowError {
            number: 2,
            message: "start: no such time".into(),
        };
        assert_eq!(
            e.located(text),
            "maintenance.start: no such time (in [[maintenance]] number 2, at line 7)"
        );
        assert_eq!(
            e.located(""),
            "maintenance.start: no such time (in [[maintenance]] number 2)"
        );
    }

    #[test]
    fn windows_are_described_in_one_line_each() {
        let s = schedule(&section(|m| {
            m.groups = vec!["db".into()];
            m.days = vec!["sat".into(), "sun".into()];
        }))
        .unwrap();
        assert_eq!(
            describe_all(&s),
            "[groups db; sat, sun; 02:00 for 10800s (UTC); catch-up next-window]"
        );
        assert_eq!(
            describe_all(&Schedule::default()),
            "none (updates at any time)"
        );
    }
}
