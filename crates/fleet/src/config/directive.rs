//! Which configuration set an agent runs and whether an answer carries it: pure
//! functions of what the fleet knows, unit tested without a database.

use crate::rollout::step::State;

/// The group of agents whose own group has no set (or who have no group).
pub const DEFAULT_GROUP: &str = "default";

/// Longest group name, as in `agent.group`.
pub const MAX_GROUP: usize = 64;

/// Whether `group` may name a set: 1 to 64 letters, digits, `.`, `_` or `-`.
pub fn check_group(group: &str) -> Result<(), String> {
    if agent_protocol::names::is_plain(group, MAX_GROUP) {
        Ok(())
    } else {
        Err(format!(
            "group {group:?}: write 1 to {MAX_GROUP} letters, digits, '.', '_' or '-'"
        ))
    }
}

/// The group whose set an agent of `group` runs: its own when that group has a set,
/// otherwise `default`'s.
pub fn effective_group(group: &str, has_set: impl Fn(&str) -> bool) -> &str {
    if !group.is_empty() && group != DEFAULT_GROUP && has_set(group) {
        group
    } else {
        DEFAULT_GROUP
    }
}

/// An agent's place in the config rollout of the set it should run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    pub wave: u32,
    /// It was sent the set already.
    pub told: bool,
    /// It reported `FAILED` for this set.
    pub failed: bool,
}

/// Whether the answer to an agent that runs `running` carries the set `target`: never
/// when it runs it already, nor after it said it cannot run it; only once its wave is
/// open; and, while the rollout is halted, only to an agent told before the halt (its
/// answer may have been lost).
pub fn send(running: &str, target: &str, state: State, opened: u32, place: Place) -> bool {
    if running == target || place.failed || place.wave > opened {
        return false;
    }
    state != State::Halted || place.told
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEW: Place = Place {
        wave: 1,
        told: false,
        failed: false,
    };

    #[test]
    fn a_set_goes_to_an_open_wave_once_and_never_after_a_failure() {
        assert!(send("", "h", State::Running, 1, NEW));
        assert!(send("old", "h", State::Completed, 3, NEW));
        // Runs it already: nothing re-sent.
        assert!(!send("h", "h", State::Running, 1, NEW));
        // Wave not open yet.
        assert!(!send(
            "old",
            "h",
            State::Running,
            1,
            Place { wave: 2, ..NEW }
        ));
        assert!(!send("old", "h", State::Soaking, 0, NEW));
        // Said FAILED for this very set.
        assert!(!send(
            "old",
            "h",
            State::Running,
            1,
            Place {
                failed: true,
                ..NEW
            }
        ));
        // Halted: no one new is told; one told before may be told again.
        assert!(!send("old", "h", State::Halted, 1, NEW));
        assert!(send(
            "old",
            "h",
            State::Halted,
            1,
            Place { told: true, ..NEW }
        ));
    }

    #[test]
    fn a_group_without_a_set_runs_default() {
        let has = |g: &str| g == "canary";
        assert_eq!(effective_group("canary", has), "canary");
        assert_eq!(effective_group("edge", has), DEFAULT_GROUP);
        assert_eq!(effective_group("", has), DEFAULT_GROUP);
        assert_eq!(effective_group("default", has), DEFAULT_GROUP);
    }

    #[test]
    fn group_names_are_checked() {
        for good in ["default", "canary", "eu-west.1", "a_b"] {
            assert_eq!(check_group(good), Ok(()), "{good}");
        }
        let long = "g".repeat(65);
        for bad in ["", "a/b", "..x/", "a b", long.as_str()] {
            assert!(check_group(bad).is_err(), "{bad:?}");
        }
    }
}
