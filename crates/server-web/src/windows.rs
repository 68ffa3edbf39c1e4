//! The maintenance windows as the rollouts page shows them: each with its deployment,
//! groups, days, start, length, zone, catch-up, and whether it is open (until when) or
//! when it opens.

use agent_fleet::policy::StoredWindow;

use super::model::utc;

/// One window, as text for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowView {
    pub id: i64,
    pub deployment: String,
    pub groups: String,
    pub days: String,
    pub start: String,
    pub duration: String,
    pub timezone: String,
    pub catch_up: String,
    /// "open until …" or "opens …".
    pub state: String,
    pub open: bool,
}

impl WindowView {
    /// Each window that checks (one that does not is said in the server's log).
    pub fn all(rows: &[StoredWindow], now: i64) -> Vec<Self> {
        rows.iter()
            .filter_map(|row| Some((row, row.window.window().ok()?)))
            .map(|(row, w)| {
                let until = w.open_until(now);
                let days = w.days();
                Self {
                    id: row.id,
                    deployment: row.window.deployment.clone(),
                    groups: w.groups().join(", "),
                    days: if days.len() == 7 {
                        "every day".into()
                    } else {
                        days.join(", ")
                    },
                    start: w.start(),
                    duration: length(w.duration_secs()),
                    timezone: w.timezone().to_owned(),
                    catch_up: w.catch_up().as_str().to_owned(),
                    state: match (until, w.next_opening(now)) {
                        (Some(end), _) => format!("open until {}", utc(end as f64)),
                        (None, Some(next)) => format!("opens {}", utc(next as f64)),
                        (None, None) => String::new(),
                    },
                    open: until.is_some(),
                }
            })
            .collect()
    }
}

/// `3h`, `90m`, `45s`: a window's length in the largest unit that writes it whole, as
/// server.toml takes it.
fn length(secs: i64) -> String {
    match secs {
        s if s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_fleet::policy::NewWindow;

    #[test]
    fn a_window_reads_as_written_with_its_next_opening() {
        let row = StoredWindow {
            id: 4,
            window: NewWindow {
                deployment: "prod".into(),
                groups: vec!["db".to_owned()],
                days: vec!["sat".to_owned(), "sun".to_owned()],
                start: "02:00".into(),
                duration_secs: 5400,
                timezone: "Europe/Berlin".into(),
                catch_up: "at-once".into(),
            },
            created_at: 0,
        };
        // Wednesday 2026-03-11 12:00 UTC.
        let views = WindowView::all(&[row], 1_773_230_400);
        assert_eq!(views.len(), 1);
        let v = &views[0];
        assert_eq!(
            (
                v.groups.as_str(),
                v.days.as_str(),
                v.start.as_str(),
                v.duration.as_str()
            ),
            ("db", "sat, sun", "02:00", "90m")
        );
        assert_eq!((v.id, v.deployment.as_str()), (4, "prod"));
        assert_eq!(v.state, "opens Sat, 14 Mar 2026 01:00:00 GMT");
        assert!(!v.open);
        assert_eq!(length(3 * 3600), "3h");
    }
}
