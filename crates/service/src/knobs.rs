//! The process-level knobs the supervisor reads from its environment (set in
//! `conf/agent-env.sh`, which the wrapper reads), with their defaults.

use std::time::Duration;

use agent_protocol::env_vars;

/// Seconds from the environment variable `name`, or `default` when it is unset or not a
/// number.
pub fn secs(name: &str, default: u64) -> Duration {
    parse_secs(std::env::var(name).ok().as_deref(), default)
}

fn parse_secs(value: Option<&str>, default: u64) -> Duration {
    Duration::from_secs(value.and_then(|v| v.trim().parse().ok()).unwrap_or(default))
}

/// Run by the updater ([`env_vars::AGENT_UPDATER_ACTIVE`]): it owns the update's
/// transaction and judges the new agent itself.
pub fn for_updater() -> bool {
    std::env::var_os(env_vars::AGENT_UPDATER_ACTIVE).is_some()
}

/// Seconds `stop` waits after TERM before KILL.
pub fn stop_timeout() -> Duration {
    secs(env_vars::AGENT_STOP_TIMEOUT, 20)
}

/// The longest pause between restarts of a crashing agent.
pub fn backoff_max() -> Duration {
    secs(
        env_vars::AGENT_RESTART_BACKOFF_MAX,
        crate::policy::BACKOFF_MAX.as_secs(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_knob_that_is_not_a_number_keeps_its_default() {
        assert_eq!(parse_secs(Some(" 5 "), 20), Duration::from_secs(5));
        assert_eq!(parse_secs(Some("5s"), 20), Duration::from_secs(20));
        assert_eq!(parse_secs(None, 20), Duration::from_secs(20));
    }
}
