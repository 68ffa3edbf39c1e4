//! What a busy server (`503` with `Retry-After` to a register or a connect) asks of an
//! agent, for the agent and for fleet-sim alike.
//!
//! A server of a fleet answers `503` with `Retry-After` when its fleet database has no
//! connection free, or it has no release to serve. Moving to the next server at once, as
//! for a server that cannot be reached, helps neither: the servers of one fleet share
//! that database, and on the next one the agent registers again, which is a write more
//! for the database that was too busy. So the agent asks the same server again after the
//! wait it names (or its heartbeat, when that is sooner: the heartbeat stays the longest
//! silence), and moves on only when it is busy [`BUSY_ROUNDS`] times in a row (a server
//! that has no release to serve, say, while the next one does).

use std::time::Duration;

/// Busy answers in a row from one server before the agent fails over to the next.
pub const BUSY_ROUNDS: u32 = 3;

/// The longest a busy server's `Retry-After` holds an agent off: past it, the server is
/// asked anyway (a server naming an hour is not waited for an hour).
pub const MAX_BUSY_WAIT: Duration = Duration::from_secs(300);

/// What to do after a busy answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterBusy {
    /// Ask the same server again after the wait.
    AskAgain,
    /// Fail over to the next server (and register there), as for one that is down.
    FailOver,
}

/// After the `in_a_row`-th busy answer in a row (1 for the first) from the current one of
/// `servers` servers.
pub fn after_busy(in_a_row: u32, servers: usize) -> AfterBusy {
    if servers > 1 && in_a_row >= BUSY_ROUNDS {
        AfterBusy::FailOver
    } else {
        AfterBusy::AskAgain
    }
}

/// How long to wait before asking a busy server again: its `Retry-After` (at most
/// [`MAX_BUSY_WAIT`]), and up to a quarter more by `unit` (uniform in `[0, 1)`), so that
/// a fleet told the same wait does not come back in the same second; never longer than
/// the agent's `heartbeat`.
pub fn busy_wait(retry_after: Duration, heartbeat: Duration, unit: f64) -> Duration {
    let base = retry_after.min(MAX_BUSY_WAIT);
    (base + base.mul_f64(unit.clamp(0.0, 1.0) / 4.0)).min(heartbeat)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_server_is_asked_again_until_the_third_time_in_a_row() {
        assert_eq!(after_busy(1, 3), AfterBusy::AskAgain);
        assert_eq!(after_busy(2, 3), AfterBusy::AskAgain);
        assert_eq!(after_busy(3, 3), AfterBusy::FailOver);
        assert_eq!(after_busy(7, 2), AfterBusy::FailOver);
    }

    #[test]
    fn the_only_server_is_always_asked_again() {
        for n in 1..10 {
            assert_eq!(after_busy(n, 1), AfterBusy::AskAgain);
        }
    }

    #[test]
    fn the_wait_is_the_servers_and_up_to_a_quarter_more_within_the_caps() {
        let five = Duration::from_secs(5);
        let day = Duration::from_secs(86_400);
        assert_eq!(busy_wait(five, day, 0.0), five);
        assert_eq!(busy_wait(five, day, 0.5), Duration::from_millis(5625));
        assert!(busy_wait(five, day, 0.999_999) < Duration::from_millis(6250));
        assert_eq!(
            busy_wait(Duration::from_secs(3600), day, 0.0),
            MAX_BUSY_WAIT
        );
        // A unit out of range is held to it.
        assert_eq!(busy_wait(five, day, 7.0), Duration::from_millis(6250));
        assert_eq!(busy_wait(Duration::ZERO, day, 0.5), Duration::ZERO);
        // The heartbeat is the longest silence: a server with no release yet (30 s)
        // is asked again at a 1 s heartbeat, as before.
        let second = Duration::from_secs(1);
        assert_eq!(busy_wait(Duration::from_secs(30), second, 0.3), second);
        assert_eq!(busy_wait(five, Duration::from_secs(30), 0.0), five);
    }
}
