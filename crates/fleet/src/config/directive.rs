//! Which configuration set an agent runs and whether an answer carries it: pure
//! functions of what the fleet knows, unit tested without a database.

use agent_protocol::selector::Selector;

use crate::labels::Labels;
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

/// The key of a set for the agents a selector chooses (`config push --selector S`):
/// `selector:S`. No group name holds a `:`, so the two never meet.
pub const SELECTOR_PREFIX: &str = "selector:";

/// The selector of a set's key, when it is a selector's.
pub fn selector_of(key: &str) -> Option<&str> {
    key.strip_prefix(SELECTOR_PREFIX)
}

/// Whether `key` may name a set: a group name, or `selector:` and a selector that
/// parses (the error says where it does not).
pub fn check_key(key: &str) -> Result<(), String> {
    match selector_of(key) {
        Some(text) => Selector::parse(text)
            .map(|_| ())
            .map_err(|e| format!("selector {text:?}: {e}")),
        None => check_group(key),
    }
}

/// A set keyed by a selector, as the directive weighs it: its key, its selector parsed,
/// and when it was pushed (unix milliseconds).
#[derive(Debug, Clone)]
pub struct SelectorSet {
    pub key: String,
    pub selector: Selector,
    pub created_at: i64,
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

/// The key of the set an agent with `labels` in `group` runs: of the sets whose selector
/// matches its labels, the newest (ties: the greater key); else its group's
/// ([`effective_group`]).
pub fn effective_key(
    group: &str,
    labels: &Labels,
    selectors: &[SelectorSet],
    has_set: impl Fn(&str) -> bool,
) -> String {
    selectors
        .iter()
        .filter(|s| s.selector.matches(labels))
        .max_by(|a, b| (a.created_at, &a.key).cmp(&(b.created_at, &b.key)))
        .map_or_else(
            || effective_group(group, has_set).to_owned(),
            |s| s.key.clone(),
        )
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
    fn a_selectors_set_comes_before_the_groups_and_the_newest_match_wins() {
        let set = |key: &str, at: i64| SelectorSet {
            key: format!("{SELECTOR_PREFIX}{key}"),
            selector: Selector::parse(key).unwrap(),
            created_at: at,
        };
        let selectors = [set("env=prod", 1), set("region=eu", 2)];
        let has = |g: &str| g == "canary";
        let labels = |pairs: &[(&str, &str)]| -> Labels {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let key =
            |group: &str, l: &[(&str, &str)]| effective_key(group, &labels(l), &selectors, has);
        assert_eq!(key("canary", &[("env", "prod")]), "selector:env=prod");
        assert_eq!(
            key("", &[("env", "prod"), ("region", "eu")]),
            "selector:region=eu"
        );
        assert_eq!(key("canary", &[("env", "dev")]), "canary");
        assert_eq!(key("edge", &[]), DEFAULT_GROUP);
        assert_eq!(selector_of("selector:env=prod"), Some("env=prod"));
        assert_eq!(selector_of("canary"), None);
        assert!(check_key("selector:env in (prod").is_err());
        assert!(check_key("selector:env in (prod,dev)").is_ok());
        assert!(check_key("canary").is_ok() && check_key("a:b").is_err());
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
