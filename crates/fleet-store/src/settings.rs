//! The names of the fleet-wide settings in the `settings` table, and the keys of each
//! server's own.

/// The fleet-wide switch: one row for every server of the fleet.
pub const AUTO_UPDATE: &str = "auto-update";
/// Where a single server kept its download limit before limits were per server.
pub const DOWNLOAD_LIMIT: &str = "downloads.limit";

/// Moved whenever an operator forgets an agent's token, so every server of the fleet
/// drops the tokens it verified lately (see `Fleet::verified`) within a settings poll.
pub const CREDENTIALS_REVISION: &str = "credentials.revision";

/// Moved whenever an operator changes an agent's server labels, so every server of the
/// fleet drops the labels it keeps in memory to route agents (see
/// `Deployments::refresh`) within a second.
pub const LABELS_REVISION: &str = "labels.revision";

/// `override-locks:<agent id>` = the release an operator let through that agent's update
/// locks (`POST /admin/agents/<id>/override-locks`).
pub const OVERRIDE_LOCKS_PREFIX: &str = "override-locks:";

/// Each server's own download limit, keyed by its `server.name`.
pub fn download_limit_key(server: &str) -> String {
    format!("{DOWNLOAD_LIMIT}@{server}")
}

/// `spool-oldest@<server>` = `<received ms> <said ms>`: the arrival of the oldest report
/// (or other write an agent's deadline waits for) that server holds queued for the
/// database, and when it said so; empty when it holds none. A busy database leaves
/// reports queued on every server, and an agent whose report waits there did report.
pub const SPOOL_OLDEST_PREFIX: &str = "spool-oldest@";
/// A server that has not said what it holds for this long (stopped, or cut off from the
/// database) no longer holds the fleet's deadlines back.
pub const SPOOL_OLDEST_FRESH_MS: i64 = 120_000;

/// Each server's own key under [`SPOOL_OLDEST_PREFIX`].
pub fn spool_oldest_key(server: &str) -> String {
    format!("{SPOOL_OLDEST_PREFIX}{server}")
}

/// The value a server stores under its [`spool_oldest_key`] at `said_ms`.
pub fn spool_oldest_value(oldest_ms: Option<i64>, said_ms: i64) -> String {
    oldest_ms.map_or_else(String::new, |at| format!("{at} {said_ms}"))
}

/// The time up to which the fleet has written every report it took: `now_ms`, or the
/// arrival of the oldest write a server said (within [`SPOOL_OLDEST_FRESH_MS`]) it still
/// holds queued. Agent deadlines are judged at this time, not at `now_ms`.
pub fn heard_until(now_ms: i64, said: &[(String, String)]) -> i64 {
    said.iter()
        .filter_map(|(_, value)| {
            let (at, when) = value.split_once(' ')?;
            let (at, when) = (at.parse::<i64>().ok()?, when.parse::<i64>().ok()?);
            (now_ms.saturating_sub(when) <= SPOOL_OLDEST_FRESH_MS).then_some(at)
        })
        .fold(now_ms, i64::min)
}

/// The switch as stored: anything but `false` (or no row) is on.
pub fn auto_update_on(value: Option<&str>) -> bool {
    value.is_none_or(|v| v != "false")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_switch_is_on_unless_turned_off() {
        assert!(auto_update_on(None));
        assert!(auto_update_on(Some("true")));
        assert!(!auto_update_on(Some("false")));
        assert_eq!(download_limit_key("a"), "downloads.limit@a");
    }

    #[test]
    fn deadlines_are_judged_at_the_oldest_report_a_server_still_holds_queued() {
        let now = 1_000_000;
        let said =
            |server: &str, oldest, at| (spool_oldest_key(server), spool_oldest_value(oldest, at));
        // Nothing queued anywhere: now.
        assert_eq!(heard_until(now, &[]), now);
        assert_eq!(heard_until(now, &[said("a", None, now - 5)]), now);
        // The oldest of what two servers hold.
        let two = [
            said("a", Some(now - 300_000), now - 5_000),
            said("b", Some(now - 90_000), now),
        ];
        assert_eq!(heard_until(now, &two), now - 300_000);
        // A server silent for longer than the freshness holds nothing back any more.
        let gone = [said(
            "a",
            Some(now - 300_000),
            now - SPOOL_OLDEST_FRESH_MS - 1,
        )];
        assert_eq!(heard_until(now, &gone), now);
        // Never later than now, and what cannot be read is no hold.
        let odd = [
            said("a", Some(now + 50_000), now),
            ("spool-oldest@b".to_owned(), "soon".to_owned()),
        ];
        assert_eq!(heard_until(now, &odd), now);
    }
}
