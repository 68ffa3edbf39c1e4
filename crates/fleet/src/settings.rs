//! The names of the fleet-wide settings in the `settings` table, and the keys of each
//! server's own.

/// The fleet-wide switch: one row for every server of the fleet.
pub const AUTO_UPDATE: &str = "auto-update";
/// Where a single server kept its download limit before limits were per server.
pub const DOWNLOAD_LIMIT: &str = "downloads.limit";

/// Moved whenever an operator forgets an agent's token, so every server of the fleet
/// drops the tokens it verified lately (see `Fleet::verified`) within a settings poll.
pub const CREDENTIALS_REVISION: &str = "credentials.revision";

/// `override-locks:<agent id>` = the release an operator let through that agent's update
/// locks (`POST /admin/agents/<id>/override-locks`).
pub const OVERRIDE_LOCKS_PREFIX: &str = "override-locks:";

/// Each server's own download limit, keyed by its `server.name`.
pub fn download_limit_key(server: &str) -> String {
    format!("{DOWNLOAD_LIMIT}@{server}")
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
}
