//! Maintenance windows (`[[maintenance]]` in server.toml): when the agents of a group may
//! install a new bundle. Pure: every answer is a function of the windows, a group and a
//! time (unix seconds); the directive ([`crate::rollout`]) asks, the server's edge wakes
//! held connects at [`Schedule::next_opening_any`].
//!
//! A window opens on each of its days at `start` in its IANA zone, as that zone's clocks
//! read then (a start that falls in a spring-forward gap opens at the first instant after
//! it, as `jiff`'s "compatible" disambiguation does), and stays open for `duration` of
//! real time, across midnight if it is long enough.

use jiff::Timestamp;
use jiff::civil::{Date, Time};
use jiff::tz::TimeZone;

/// Days a window may name, Monday first (as [`jiff::civil::Weekday::to_monday_zero_offset`]).
pub const DAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

/// The longest window: a week (longer would always be open; say no window instead).
pub const MAX_DURATION_SECS: i64 = 7 * 24 * 3600;

/// What happens to an agent that missed its window (it was away).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CatchUp {
    /// It waits for its group's next window.
    NextWindow,
    /// It updates as soon as it is back.
    AtOnce,
}

impl CatchUp {
    pub fn as_str(self) -> &'static str {
        match self {
            CatchUp::NextWindow => "next-window",
            CatchUp::AtOnce => "at-once",
        }
    }
}

/// One `[[maintenance]]` table as written; [`Window::new`] checks it.
#[derive(Debug, Clone)]
pub struct WindowSpec<'a> {
    pub groups: &'a [String],
    /// Empty: every day.
    pub days: &'a [String],
    /// `HH:MM`.
    pub start: &'a str,
    pub duration_secs: i64,
    pub timezone: &'a str,
    /// `next-window` or `at-once`.
    pub catch_up: &'a str,
}

/// A checked window.
#[derive(Debug, Clone)]
pub struct Window {
    groups: Vec<String>,
    days: [bool; 7],
    start: Time,
    duration_secs: i64,
    zone: TimeZone,
    zone_name: String,
    catch_up: CatchUp,
}

/// Whether an agent of a group may install now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// No window names its group: any time.
    Any,
    /// A window is open until this time (unix seconds).
    Open { until: i64 },
    /// Every window of its group is closed; the next opens then (unix seconds).
    Closed { opens: i64 },
}

impl Window {
    /// Checks a window; the error names the key at fault (`days`, `start`, `duration`,
    /// `timezone`, `catch-up`, `groups`) and what it takes.
    pub fn new(spec: &WindowSpec<'_>) -> Result<Self, String> {
        if spec.groups.is_empty() || spec.groups.iter().any(|g| g.trim().is_empty()) {
            return Err(
                "groups: name at least one agent group (agent.group), or \"*\" for every agent"
                    .into(),
            );
        }
        let mut days = [spec.days.is_empty(); 7];
        for day in spec.days {
            let wanted = day.trim().to_ascii_lowercase();
            let Some(i) = DAYS.iter().position(|d| *d == wanted) else {
                return Err(format!(
                    "days: unknown day {day:?}; use {}",
                    DAYS.join(", ")
                ));
            };
            days[i] = true;
        }
        let start = parse_hhmm(spec.start).ok_or_else(|| {
            format!(
                "start: {:?} is not a time HH:MM from 00:00 to 23:59",
                spec.start
            )
        })?;
        if spec.duration_secs <= 0 || spec.duration_secs > MAX_DURATION_SECS {
            return Err(format!(
                "duration: {} s; a window lasts more than nothing and at most a week (7d)",
                spec.duration_secs
            ));
        }
        let zone = TimeZone::get(spec.timezone).map_err(|_| {
            format!(
                "timezone: {:?} is not an IANA time zone (such as \"UTC\" or \"Europe/Berlin\")",
                spec.timezone
            )
        })?;
        let catch_up = match spec.catch_up {
            "next-window" => CatchUp::NextWindow,
            "at-once" => CatchUp::AtOnce,
            other => {
                return Err(format!(
                    "catch-up: {other:?}; use \"next-window\" or \"at-once\""
                ));
            }
        };
        Ok(Self {
            groups: spec.groups.iter().map(|g| g.trim().to_owned()).collect(),
            days,
            start,
            duration_secs: spec.duration_secs,
            zone,
            zone_name: spec.timezone.to_owned(),
            catch_up,
        })
    }

    pub fn groups(&self) -> &[String] {
        &self.groups
    }

    /// The days it opens on, `mon` first.
    pub fn days(&self) -> Vec<&'static str> {
        DAYS.iter()
            .zip(self.days)
            .filter_map(|(d, on)| on.then_some(*d))
            .collect()
    }

    /// `HH:MM`.
    pub fn start(&self) -> String {
        format!("{:02}:{:02}", self.start.hour(), self.start.minute())
    }

    pub fn duration_secs(&self) -> i64 {
        self.duration_secs
    }

    pub fn timezone(&self) -> &str {
        &self.zone_name
    }

    pub fn catch_up(&self) -> CatchUp {
        self.catch_up
    }

    /// Whether it holds the agents of `group` (an agent's `agent.group`, "" for none).
    pub fn applies_to(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == "*" || g == group)
    }

    /// The opening on `date` (its zone's calendar), if it opens that day.
    fn opening_on(&self, date: Date) -> Option<i64> {
        let day = usize::try_from(date.weekday().to_monday_zero_offset()).ok()?;
        if !self.days.get(day).copied().unwrap_or(false) {
            return None;
        }
        let zoned = date
            .to_datetime(self.start)
            .to_zoned_datetime(self.zone.clone())
            .ok()?;
        Some(zoned.timestamp().as_second())
    }

    fn date_at(&self, at: i64) -> Option<Date> {
        let ts = Timestamp::from_second(at).ok()?;
        Some(ts.to_zoned_datetime(self.zone.clone()).date())
    }

    /// Openings on the days from the one holding `from` (minus `before` days) on, in order.
    fn openings_from(&self, from: i64, before: i64) -> impl Iterator<Item = i64> + '_ {
        let first = self
            .date_at(from)
            .and_then(|d| d.checked_sub(jiff::Span::new().days(before)).ok());
        // A week and a day past a week-long window's start covers every case asked here.
        let days = before + 9;
        (0..days).filter_map(move |i| {
            let date = first?.checked_add(jiff::Span::new().days(i)).ok()?;
            self.opening_on(date)
        })
    }

    /// Until when it is open at `now`, if it is.
    pub fn open_until(&self, now: i64) -> Option<i64> {
        // An opening up to `duration` (at most a week) plus a day of DST slack ago.
        let back = self.duration_secs / 86_400 + 2;
        self.openings_from(now, back)
            .filter(|start| *start <= now && now < start + self.duration_secs)
            .map(|start| start + self.duration_secs)
            .max()
    }

    /// Its first opening after `now`.
    pub fn next_opening(&self, now: i64) -> Option<i64> {
        self.openings_from(now, 0).find(|start| *start > now)
    }

    /// Whether it opened in `(from, to]`.
    pub fn opened_between(&self, from: i64, to: i64) -> bool {
        if to <= from {
            return false;
        }
        self.next_opening(from).is_some_and(|opening| opening <= to)
    }
}

/// `HH:MM`, 00:00 to 23:59.
fn parse_hhmm(text: &str) -> Option<Time> {
    let (h, m) = text.trim().split_once(':')?;
    if h.len() != 2 || m.len() != 2 {
        return None;
    }
    let h: i8 = h.parse().ok()?;
    let m: i8 = m.parse().ok()?;
    if !(0..24).contains(&h) || !(0..60).contains(&m) {
        return None;
    }
    Time::new(h, m, 0, 0).ok()
}

/// Every window of the fleet.
#[derive(Debug, Clone, Default)]
pub struct Schedule {
    windows: Vec<Window>,
}

impl Schedule {
    pub fn new(windows: Vec<Window>) -> Self {
        Self { windows }
    }

    pub fn windows(&self) -> &[Window] {
        &self.windows
    }

    pub fn is_empty(&self) -> bool {
        self.windows.is_empty()
    }

    fn of<'a>(&'a self, group: &'a str) -> impl Iterator<Item = &'a Window> + 'a {
        self.windows.iter().filter(move |w| w.applies_to(group))
    }

    /// Whether an agent of `group` may install at `now`, and until or from when.
    pub fn gate(&self, group: &str, now: i64) -> Gate {
        let mut any = false;
        let mut opens: Option<i64> = None;
        let mut until: Option<i64> = None;
        for w in self.of(group) {
            any = true;
            if let Some(end) = w.open_until(now) {
                until = until.max(Some(end));
            } else if let Some(next) = w.next_opening(now) {
                opens = Some(opens.map_or(next, |o| o.min(next)));
            }
        }
        match (any, until, opens) {
            (false, _, _) => Gate::Any,
            (true, Some(until), _) => Gate::Open { until },
            (true, None, Some(opens)) => Gate::Closed { opens },
            // Every window of a valid schedule opens within a week: not reached.
            (true, None, None) => Gate::Any,
        }
    }

    /// Whether an agent of `group` that could have updated since `since` (its wave was
    /// open) and did not, missed a window it may catch up on at once: an `at-once`
    /// window of its group opened in `(since, now]`.
    pub fn catch_up_now(&self, group: &str, since: i64, now: i64) -> bool {
        self.of(group)
            .any(|w| w.catch_up == CatchUp::AtOnce && w.opened_between(since, now))
    }

    /// The first opening of any window after `now`: held connects look again then.
    pub fn next_opening_any(&self, now: i64) -> Option<i64> {
        self.windows
            .iter()
            .filter_map(|w| w.next_opening(now))
            .min()
    }
}

/// `secs` (unix) as RFC 3339 in UTC, for messages.
pub fn rfc3339(secs: i64) -> String {
    Timestamp::from_second(secs)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| secs.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> i64 {
        text.parse::<Timestamp>().unwrap().as_second()
    }

    fn window(groups: &[&str], days: &[&str], start: &str, dur: i64, tz: &str) -> Window {
        let groups: Vec<String> = groups.iter().map(|s| (*s).to_owned()).collect();
        let days: Vec<String> = days.iter().map(|s| (*s).to_owned()).collect();
        Window::new(&WindowSpec {
            groups: &groups,
            days: &days,
            start,
            duration_secs: dur,
            timezone: tz,
            catch_up: "next-window",
        })
        .unwrap()
    }

    const H: i64 = 3600;

    #[test]
    fn a_window_crossing_midnight_is_open_on_both_sides_of_it() {
        // Every day 22:00 UTC for 4 h: open until 02:00 the next day.
        let w = window(&["*"], &[], "22:00", 4 * H, "UTC");
        assert_eq!(
            w.open_until(at("2026-03-10T23:30:00Z")),
            Some(at("2026-03-11T02:00:00Z"))
        );
        assert_eq!(
            w.open_until(at("2026-03-11T01:59:59Z")),
            Some(at("2026-03-11T02:00:00Z"))
        );
        assert_eq!(
            w.open_until(at("2026-03-11T02:00:00Z")),
            None,
            "the end is not inside"
        );
        assert_eq!(
            w.next_opening(at("2026-03-11T02:00:00Z")),
            Some(at("2026-03-11T22:00:00Z"))
        );
        assert_eq!(w.open_until(at("2026-03-11T21:59:59Z")), None);
        assert_eq!(
            w.open_until(at("2026-03-11T22:00:00Z")),
            Some(at("2026-03-12T02:00:00Z"))
        );
    }

    #[test]
    fn a_day_list_skips_the_other_days_and_a_sunday_night_window_ends_on_monday() {
        // 2026-03-14 is a Saturday.
        let w = window(&["db"], &["sat", "sun"], "23:00", 2 * H, "UTC");
        assert_eq!(w.days(), ["sat", "sun"]);
        let friday = at("2026-03-13T23:30:00Z");
        assert_eq!(w.open_until(friday), None);
        assert_eq!(w.next_opening(friday), Some(at("2026-03-14T23:00:00Z")));
        // Sunday's window runs into Monday; Monday opens none of its own.
        assert_eq!(
            w.open_until(at("2026-03-16T00:30:00Z")),
            Some(at("2026-03-16T01:00:00Z"))
        );
        assert_eq!(
            w.next_opening(at("2026-03-16T00:30:00Z")),
            Some(at("2026-03-21T23:00:00Z"))
        );
    }

    #[test]
    fn berlin_spring_forward_opens_a_0200_window_at_the_first_instant_after_the_gap() {
        // 2026-03-29: Berlin's clocks go from 02:00 CET to 03:00 CEST (01:00 UTC).
        let w = window(&["*"], &[], "02:00", H, "Europe/Berlin");
        let before = at("2026-03-28T12:00:00Z");
        assert_eq!(w.next_opening(before), Some(at("2026-03-29T01:00:00Z")));
        // An hour of real time: until 04:00 CEST (02:00 UTC).
        assert_eq!(
            w.open_until(at("2026-03-29T01:30:00Z")),
            Some(at("2026-03-29T02:00:00Z"))
        );
        // The day before it opened at 02:00 CET (01:00 UTC), the day after at 02:00 CEST.
        assert_eq!(
            w.next_opening(at("2026-03-27T12:00:00Z")),
            Some(at("2026-03-28T01:00:00Z"))
        );
        assert_eq!(
            w.next_opening(at("2026-03-29T12:00:00Z")),
            Some(at("2026-03-30T00:00:00Z"))
        );
    }

    #[test]
    fn a_window_shorter_than_an_install_lets_a_started_install_finish_and_tells_no_one_after() {
        // Five minutes at 03:00 UTC; an install takes longer.
        let s = Schedule::new(vec![window(&["*"], &[], "03:00", 300, "UTC")]);
        let opening = at("2026-03-10T03:00:00Z");
        assert_eq!(
            s.gate("web", opening),
            Gate::Open {
                until: opening + 300
            }
        );
        // Told at the opening, still installing after the end: the window no longer
        // matters to it, and no one else is told until tomorrow.
        assert_eq!(
            s.gate("web", opening + 600),
            Gate::Closed {
                opens: opening + 24 * H
            }
        );
    }

    #[test]
    fn windows_hold_their_groups_only_and_star_holds_every_agent() {
        let s = Schedule::new(vec![window(&["db", "cache"], &[], "02:00", H, "UTC")]);
        let noon = at("2026-03-10T12:00:00Z");
        assert_eq!(s.gate("web", noon), Gate::Any);
        assert_eq!(
            s.gate("", noon),
            Gate::Any,
            "no group: not held by a named one"
        );
        assert_eq!(
            s.gate("db", noon),
            Gate::Closed {
                opens: at("2026-03-11T02:00:00Z")
            }
        );
        assert_eq!(
            s.gate("cache", noon),
            Gate::Closed {
                opens: at("2026-03-11T02:00:00Z")
            }
        );
        let all = Schedule::new(vec![window(&["*"], &[], "02:00", H, "UTC")]);
        assert_eq!(
            all.gate("", noon),
            Gate::Closed {
                opens: at("2026-03-11T02:00:00Z")
            }
        );
        assert_eq!(
            all.gate("web", noon),
            Gate::Closed {
                opens: at("2026-03-11T02:00:00Z")
            }
        );
    }

    #[test]
    fn several_windows_for_one_group_the_nearest_opening_and_the_latest_end_count() {
        let s = Schedule::new(vec![
            window(&["db"], &[], "02:00", 2 * H, "UTC"),
            window(&["db"], &[], "03:00", 3 * H, "UTC"),
            window(&["*"], &[], "14:00", H, "Europe/Berlin"),
        ]);
        // 03:30: both morning windows open; the later end counts.
        assert_eq!(
            s.gate("db", at("2026-03-10T03:30:00Z")),
            Gate::Open {
                until: at("2026-03-10T06:00:00Z")
            }
        );
        // 07:00: the Berlin afternoon (13:00 UTC in winter) is nearer than tomorrow's 02:00.
        assert_eq!(
            s.gate("db", at("2026-03-10T07:00:00Z")),
            Gate::Closed {
                opens: at("2026-03-10T13:00:00Z")
            }
        );
        assert_eq!(
            s.next_opening_any(at("2026-03-10T13:30:00Z")),
            Some(at("2026-03-11T02:00:00Z"))
        );
    }

    #[test]
    fn catch_up_at_once_only_after_an_at_once_window_was_missed() {
        let groups = vec!["*".to_owned()];
        let spec = |catch_up| WindowSpec {
            groups: &groups,
            days: &[],
            start: "02:00",
            duration_secs: H,
            timezone: "UTC",
            catch_up,
        };
        let at_once = Schedule::new(vec![Window::new(&spec("at-once")).unwrap()]);
        let next = Schedule::new(vec![Window::new(&spec("next-window")).unwrap()]);
        let wave_opened = at("2026-03-10T12:00:00Z");
        let same_evening = at("2026-03-10T20:00:00Z");
        let next_noon = at("2026-03-11T12:00:00Z");
        assert!(
            !at_once.catch_up_now("x", wave_opened, same_evening),
            "no window since"
        );
        assert!(
            at_once.catch_up_now("x", wave_opened, next_noon),
            "missed 02:00"
        );
        assert!(!next.catch_up_now("x", wave_opened, next_noon));
    }

    #[test]
    fn bad_windows_name_the_key() {
        let groups = vec!["*".to_owned()];
        let bad = |days: &[String], start: &str, dur: i64, tz: &str, catch_up: &str| {
            Window::new(&WindowSpec {
                groups: &groups,
                days,
                start,
                duration_secs: dur,
                timezone: tz,
                catch_up,
            })
            .unwrap_err()
        };
        let e = bad(
            &["mon".into(), "funday".into()],
            "02:00",
            H,
            "UTC",
            "at-once",
        );
        assert!(e.starts_with("days:") && e.contains("funday"), "{e}");
        for start in ["25:00", "2:00", "02:60", "noon", ""] {
            let e = bad(&[], start, H, "UTC", "at-once");
            assert!(e.starts_with("start:"), "{e}");
        }
        assert!(bad(&[], "02:00", 0, "UTC", "at-once").starts_with("duration:"));
        assert!(
            bad(&[], "02:00", MAX_DURATION_SECS + 1, "UTC", "at-once").starts_with("duration:")
        );
        let e = bad(&[], "02:00", H, "Mars/Olympus_Mons", "at-once");
        assert!(
            e.starts_with("timezone:") && e.contains("Mars/Olympus_Mons"),
            "{e}"
        );
        assert!(bad(&[], "02:00", H, "UTC", "later").starts_with("catch-up:"));
    }

    #[test]
    fn the_bundled_zone_database_knows_zones_without_the_system_one() {
        // tzdb-bundle-always: these resolve even where /usr/share/zoneinfo is missing.
        for tz in ["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata"] {
            assert!(TimeZone::get(tz).is_ok(), "{tz}");
        }
    }
}
