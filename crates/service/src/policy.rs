//! What the supervisor does after the agent ends, as a pure function of how it ended, how
//! long it ran and whether an updater runs: one set of rules for the Unix supervisor
//! (behind `agent-wrapper.sh`) and the Windows service.

use std::time::Duration;

use agent_protocol::layout::{EXIT_CONFIG, EXIT_REFUSED, EXIT_RESTART};

/// The longest pause between restarts of a crashing agent.
pub const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// An agent that ran this long before it ended starts the backoff over.
pub const STABLE: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterExit {
    /// Start it again after this pause.
    Restart(Duration),
    /// Start nothing until asked.
    Idle(Idle),
    /// It handed over to the updater, which starts the next agent through this service.
    HandedOver,
}

/// Why the agent is not started again; each platform says it in its own words (paths,
/// the command that starts it again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idle {
    /// Exit 3: the server refuses this version and updates are disabled.
    Refused,
    /// Exit 78 (`EX_CONFIG`, the code): the agent refused its configuration, which a
    /// restart cannot fix.
    BadConfiguration(i32),
}

/// Restart pauses: 1 s doubling to a ceiling ([`BACKOFF_MAX`] unless told), back to 1 s
/// after a stable run.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
    max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

impl Backoff {
    pub fn new() -> Self {
        Self::with_max(BACKOFF_MAX)
    }

    /// Pauses that never exceed `max` (`AGENT_RESTART_BACKOFF_MAX`).
    pub fn with_max(max: Duration) -> Self {
        Self {
            next: Duration::from_secs(1),
            max,
        }
    }

    fn take(&mut self, ran: Duration) -> Duration {
        if ran > STABLE {
            self.next = Duration::from_secs(1);
        }
        let now = self.next;
        self.next = (self.next * 2).min(self.max);
        now
    }
}

/// After the agent exited with `code` (`None`: no code could be read) having run for
/// `ran`, with an updater holding `run/update.lock` or not.
pub fn after_exit(
    code: Option<i32>,
    ran: Duration,
    updater_running: bool,
    backoff: &mut Backoff,
) -> AfterExit {
    match code {
        Some(0) if updater_running => AfterExit::HandedOver,
        Some(c) if c == i32::from(EXIT_REFUSED) => AfterExit::Idle(Idle::Refused),
        Some(c) if c == i32::from(EXIT_CONFIG) => AfterExit::Idle(Idle::BadConfiguration(c)),
        // Asked for, not a crash: at once, and the backoff of crashes is left as it was.
        Some(c) if c == i32::from(EXIT_RESTART) => AfterExit::Restart(Duration::ZERO),
        _ => AfterExit::Restart(backoff.take(ran)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_crash_is_restarted_with_growing_pauses_reset_by_a_stable_run() {
        let mut b = Backoff::new();
        let pauses: Vec<AfterExit> = (0..8)
            .map(|_| after_exit(Some(1), S, false, &mut b))
            .collect();
        let secs: Vec<u64> = pauses
            .iter()
            .map(|p| match p {
                AfterExit::Restart(d) => d.as_secs(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(
            after_exit(None, STABLE + S, false, &mut b),
            AfterExit::Restart(S)
        );
    }

    #[test]
    fn a_clean_exit_is_a_hand_over_only_while_an_updater_runs() {
        let mut b = Backoff::new();
        assert_eq!(after_exit(Some(0), S, true, &mut b), AfterExit::HandedOver);
        assert_eq!(after_exit(Some(0), S, false, &mut b), AfterExit::Restart(S));
    }

    #[test]
    fn refusals_and_bad_configuration_are_not_restarted() {
        let mut b = Backoff::new();
        assert_eq!(
            after_exit(Some(3), S, false, &mut b),
            AfterExit::Idle(Idle::Refused)
        );
        assert_eq!(
            after_exit(Some(78), S, true, &mut b),
            AfterExit::Idle(Idle::BadConfiguration(78))
        );
    }

    #[test]
    fn an_asked_restart_is_at_once_and_leaves_the_backoff_alone() {
        let mut b = Backoff::new();
        let _ = after_exit(Some(1), S, false, &mut b);
        let _ = after_exit(Some(1), S, false, &mut b);
        for _ in 0..3 {
            assert_eq!(
                after_exit(Some(75), S, false, &mut b),
                AfterExit::Restart(Duration::ZERO)
            );
        }
        assert_eq!(
            after_exit(Some(1), S, false, &mut b),
            AfterExit::Restart(4 * S),
            "the crashes' pauses go on where they were"
        );
    }

    #[test]
    fn the_ceiling_can_be_lowered() {
        let mut b = Backoff::with_max(Duration::from_secs(2));
        let secs: Vec<u64> = (0..4)
            .map(|_| match after_exit(Some(1), S, false, &mut b) {
                AfterExit::Restart(d) => d.as_secs(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(secs, [1, 2, 2, 2]);
    }
}
