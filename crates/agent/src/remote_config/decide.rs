//! The decisions of remote configuration, from what was observed: whether to apply an
//! offered set, whether a check passed, and whether the workload took the new set.

use std::time::Duration;

use agent_protocol::journal::WorkloadReport;
use agent_protocol::wire::WorkloadState;

/// What to do with the set a server offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OfferVerdict {
    Apply,
    /// The agent runs it already.
    Running,
    /// It failed here before; the server has not offered another since.
    FailedBefore,
}

pub fn offer(offered: &str, running: &str, failed_here: Option<&str>) -> OfferVerdict {
    if offered == running {
        OfferVerdict::Running
    } else if failed_here == Some(offered) {
        OfferVerdict::FailedBefore
    } else {
        OfferVerdict::Apply
    }
}

/// The verdict of `check-command` on the new directory: its exit code (`None`: killed by
/// a signal or not run) and the last lines of its output.
pub fn check_outcome(code: Option<i32>, output_tail: &str) -> Result<(), String> {
    match code {
        Some(0) => Ok(()),
        Some(code) => Err(format!(
            "check-command refused the set (exit code {code}){}",
            words(output_tail)
        )),
        None => Err(format!(
            "check-command did not finish (killed by a signal){}",
            words(output_tail)
        )),
    }
}

/// Where a workload stands after the new set reached it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Took {
    Yes,
    Wait,
    /// It did not come up healthy within `start-timeout`: in its own words.
    No(String),
}

/// Whether the workload took the new set: running and healthy, in a run that is not
/// `stale_pid` (the run from before a restart, whose health says nothing of the new set).
pub fn took(
    report: Option<&WorkloadReport>,
    stale_pid: Option<u32>,
    waited: Duration,
    timeout: Duration,
    log_tail: &str,
) -> Took {
    let Some(report) = report else {
        return Took::Yes;
    };
    if report.health.workload == WorkloadState::None {
        return Took::Yes;
    }
    let fresh = report.pid.is_some() && report.pid != stale_pid;
    if fresh && report.health.workload == WorkloadState::Running && report.health.healthy {
        return Took::Yes;
    }
    if waited < timeout {
        return Took::Wait;
    }
    let mut why = format!(
        "the workload did not come up healthy on the new set within {:?} (workload.start-timeout)",
        timeout
    );
    if let Some(exit) = &report.last_exit {
        why.push_str(&format!("; it {exit}"));
    }
    if let Some(error) = &report.health.last_error {
        why.push_str(&format!("; {error}"));
    }
    why.push_str(&words(log_tail));
    Took::No(why)
}

fn words(tail: &str) -> String {
    let tail = tail.trim();
    if tail.is_empty() {
        String::new()
    } else {
        format!(":\n{tail}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_protocol::wire::AgentHealth;

    fn report(state: WorkloadState, healthy: bool, pid: Option<u32>) -> WorkloadReport {
        WorkloadReport {
            health: AgentHealth {
                healthy,
                workload: state,
                restarts: 0,
                last_error: None,
            },
            pid,
            since: None,
            last_exit: Some("exited with code 1".into()),
            start_timeout_ms: 0,
        }
    }

    #[test]
    fn an_offer_is_applied_unless_running_or_failed_here() {
        assert_eq!(offer("b", "a", None), OfferVerdict::Apply);
        assert_eq!(offer("a", "a", None), OfferVerdict::Running);
        assert_eq!(offer("b", "a", Some("b")), OfferVerdict::FailedBefore);
        assert_eq!(offer("c", "a", Some("b")), OfferVerdict::Apply);
    }

    #[test]
    fn a_check_passes_on_zero_only_and_fails_in_its_words() {
        assert_eq!(check_outcome(Some(0), "fine"), Ok(()));
        let e = check_outcome(Some(2), "line one\nbad key x\n").unwrap_err();
        assert!(e.contains("exit code 2") && e.contains("bad key x"), "{e}");
        assert!(check_outcome(None, "").unwrap_err().contains("signal"));
    }

    #[test]
    fn the_stale_run_of_before_a_restart_does_not_count() {
        let t = Duration::from_secs(5);
        let stale = report(WorkloadState::Running, true, Some(10));
        assert_eq!(
            took(Some(&stale), Some(10), Duration::ZERO, t, ""),
            Took::Wait
        );
        let fresh = report(WorkloadState::Running, true, Some(11));
        assert_eq!(
            took(Some(&fresh), Some(10), Duration::ZERO, t, ""),
            Took::Yes
        );
        let starting = report(WorkloadState::Starting, false, Some(11));
        assert_eq!(
            took(Some(&starting), Some(10), Duration::from_secs(1), t, ""),
            Took::Wait
        );
    }

    #[test]
    fn past_the_start_timeout_the_workload_says_why() {
        let t = Duration::from_secs(5);
        let down = report(WorkloadState::Backoff, false, None);
        match took(Some(&down), Some(10), t, t, "config says bad\n") {
            Took::No(why) => assert!(
                why.contains("exited with code 1") && why.contains("config says bad"),
                "{why}"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn no_workload_takes_any_set() {
        let none = report(WorkloadState::None, true, None);
        assert_eq!(
            took(Some(&none), None, Duration::ZERO, Duration::ZERO, ""),
            Took::Yes
        );
        assert_eq!(
            took(None, None, Duration::ZERO, Duration::ZERO, ""),
            Took::Yes
        );
    }
}
