//! What the supervisor does next, as a function of what it observed and the time: when to
//! start the workload again after an exit (exponential backoff, reset after a stable run),
//! when a start has failed, and what the workload's health is. No process, file or socket
//! is touched here; the supervisor feeds observations in and carries the actions out.

use std::fmt;
use std::time::{Duration, Instant};

use agent_protocol::wire::{AgentHealth, WorkloadState};

/// The first delay before a restart; it doubles after each exit up to [`BACKOFF_MAX`].
pub const BACKOFF_FIRST: Duration = Duration::from_secs(1);
pub const BACKOFF_MAX: Duration = Duration::from_secs(5 * 60);
/// A run at least this long resets the backoff: the next exit is a new trouble.
pub const STABLE_RESET: Duration = Duration::from_secs(5 * 60);
/// With no health check configured, a workload up this long (or `start-timeout`, if
/// shorter) is healthy: one that dies at once is never reported healthy.
pub const SETTLE: Duration = Duration::from_secs(1);
/// How often a check runs while the workload starts, and once it is running.
pub const CHECK_STARTING: Duration = Duration::from_millis(250);
pub const CHECK_RUNNING: Duration = Duration::from_secs(5);

/// How a run of the workload ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Exit::Code(code) => write!(f, "exited with code {code}"),
            Exit::Signal(sig) => {
                let name = super::group::signal_name(*sig)
                    .map(|s| format!(" ({s})"))
                    .unwrap_or_default();
                write!(f, "was killed by signal {sig}{name}")
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// No workload configured.
    None,
    /// Not started yet: reported as starting, so that nobody takes the time before the
    /// first start for a healthy agent without a workload.
    Initial,
    Starting {
        since: Instant,
    },
    Running {
        since: Instant,
    },
    Backoff {
        until: Instant,
    },
    Stopped,
}

/// What the supervisor should do now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Start the workload (the first time, or after its backoff).
    Start,
    /// The start failed (not healthy within `start-timeout`): stop the process; its
    /// exit then counts as a failed run.
    StopFailedStart(String),
    /// Nothing until `Some(instant)` (or until something is observed).
    Wait(Option<Instant>),
}

/// The supervisor's memory of the workload.
#[derive(Debug, Clone)]
pub struct Supervision {
    phase: Phase,
    start_timeout: Duration,
    has_check: bool,
    starts: u64,
    healthy: bool,
    last_error: Option<String>,
    last_exit: Option<String>,
    next_delay: Duration,
    /// Set when a start was given up on: the exit that follows is reported as this.
    failed_start: Option<String>,
    /// The last check's failure, for the message when a start times out.
    last_check_error: Option<String>,
}

impl Supervision {
    /// `enabled`: a command is configured; `has_check`: a health-url or health-command.
    pub fn new(enabled: bool, start_timeout: Duration, has_check: bool) -> Self {
        Self {
            phase: if enabled { Phase::Initial } else { Phase::None },
            start_timeout,
            has_check,
            starts: 0,
            healthy: false,
            last_error: None,
            last_exit: None,
            next_delay: BACKOFF_FIRST,
            failed_start: None,
            last_check_error: None,
        }
    }

    /// The process was spawned.
    pub fn started(&mut self, now: Instant) {
        self.starts += 1;
        self.healthy = false;
        self.failed_start = None;
        self.last_check_error = None;
        self.phase = Phase::Starting { since: now };
    }

    /// The process could not be spawned (`error` says why and what to do); returns the
    /// delay before the next attempt.
    pub fn spawn_failed(&mut self, error: String, now: Instant) -> Duration {
        self.healthy = false;
        self.last_error = Some(error);
        let delay = self.take_delay(None);
        self.phase = Phase::Backoff { until: now + delay };
        delay
    }

    /// The workload's process ended; returns the delay before it is started again.
    pub fn exited(&mut self, exit: Exit, now: Instant) -> Duration {
        let ran = match self.phase {
            Phase::Starting { since } | Phase::Running { since } => {
                Some(now.saturating_duration_since(since))
            }
            _ => None,
        };
        self.healthy = false;
        let after = ran
            .map(|r| format!(" after {:.1}s", r.as_secs_f64()))
            .unwrap_or_default();
        self.last_exit = Some(format!("{exit}{after}"));
        self.last_error = Some(match self.failed_start.take() {
            Some(why) => why,
            None => format!("the workload {exit}{after}"),
        });
        let delay = self.take_delay(ran);
        self.phase = Phase::Backoff { until: now + delay };
        delay
    }

    /// Exponential backoff: doubling from [`BACKOFF_FIRST`] to [`BACKOFF_MAX`], back to
    /// the start after a run of [`STABLE_RESET`].
    fn take_delay(&mut self, ran: Option<Duration>) -> Duration {
        if ran.is_some_and(|r| r >= STABLE_RESET) {
            self.next_delay = BACKOFF_FIRST;
        }
        let delay = self.next_delay;
        self.next_delay = (delay * 2).min(BACKOFF_MAX);
        delay
    }

    /// The result of one health check (`Err` says what failed), observed at `_now`.
    pub fn checked(&mut self, result: Result<(), String>, _now: Instant) {
        match (self.phase, result) {
            (Phase::Starting { since }, Ok(())) => {
                self.phase = Phase::Running { since };
                self.healthy = true;
                self.last_error = None;
            }
            (Phase::Starting { .. }, Err(e)) => self.last_check_error = Some(e),
            (Phase::Running { .. }, Ok(())) => {
                self.healthy = true;
                self.last_error = None;
            }
            (Phase::Running { .. }, Err(e)) => {
                self.healthy = false;
                self.last_error = Some(format!("health check failing: {e}"));
            }
            _ => {}
        }
    }

    /// What to do at `now`.
    pub fn tick(&mut self, now: Instant) -> Action {
        match self.phase {
            Phase::Initial => Action::Start,
            Phase::Backoff { until } if now >= until => Action::Start,
            Phase::Backoff { until } => Action::Wait(Some(until)),
            Phase::Starting { since } if !self.has_check => {
                let settle = since + SETTLE.min(self.start_timeout);
                if now >= settle {
                    self.phase = Phase::Running { since };
                    self.healthy = true;
                    self.last_error = None;
                    Action::Wait(None)
                } else {
                    Action::Wait(Some(settle))
                }
            }
            Phase::Starting { since } => {
                let deadline = since + self.start_timeout;
                if now >= deadline {
                    if self.failed_start.is_none() {
                        let why = format!(
                            "the workload did not pass its health check within {:?} (workload.start-timeout){}",
                            self.start_timeout,
                            self.last_check_error
                                .as_ref()
                                .map(|e| format!(": {e}"))
                                .unwrap_or_default()
                        );
                        self.failed_start = Some(why.clone());
                        return Action::StopFailedStart(why);
                    }
                    Action::Wait(None)
                } else {
                    Action::Wait(Some(deadline))
                }
            }
            Phase::Running { .. } | Phase::Stopped | Phase::None => Action::Wait(None),
        }
    }

    /// When the next health check is due, if checks run now.
    pub fn check_interval(&self) -> Option<Duration> {
        if !self.has_check {
            return None;
        }
        match self.phase {
            Phase::Starting { .. } => Some(CHECK_STARTING),
            Phase::Running { .. } => Some(CHECK_RUNNING),
            _ => None,
        }
    }

    /// The agent stops: the workload is stopped and not started again.
    pub fn stopped(&mut self) {
        if self.phase != Phase::None {
            self.phase = Phase::Stopped;
        }
        self.healthy = false;
    }

    pub fn is_running(&self) -> bool {
        matches!(self.phase, Phase::Starting { .. } | Phase::Running { .. })
    }

    pub fn state(&self) -> WorkloadState {
        match self.phase {
            Phase::None => WorkloadState::None,
            Phase::Initial | Phase::Starting { .. } => WorkloadState::Starting,
            Phase::Running { .. } => WorkloadState::Running,
            Phase::Backoff { .. } => WorkloadState::Backoff,
            Phase::Stopped => WorkloadState::Stopped,
        }
    }

    /// The `"health"` object: the agent runs, so it is healthy when its workload is.
    pub fn health(&self) -> AgentHealth {
        AgentHealth {
            healthy: self.phase == Phase::None || (self.is_running() && self.healthy),
            workload: self.state(),
            restarts: self.starts.saturating_sub(1),
            last_error: self.last_error.clone(),
        }
    }

    pub fn last_exit(&self) -> Option<&str> {
        self.last_exit.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn no_command_is_healthy_with_no_workload() {
        let now = Instant::now();
        let mut s = Supervision::new(false, secs(30), false);
        assert_eq!(s.tick(now), Action::Wait(None));
        let h = s.health();
        assert!(h.healthy);
        assert_eq!(h.workload, WorkloadState::None);
    }

    #[test]
    fn starts_at_once_and_is_healthy_after_settling_without_a_check() {
        let t0 = Instant::now();
        let mut s = Supervision::new(true, secs(30), false);
        // Before the first start it is starting, not healthy.
        assert_eq!(s.health().workload, WorkloadState::Starting);
        assert!(!s.health().healthy);
        assert_eq!(s.tick(t0), Action::Start);
        s.started(t0);
        assert_eq!(s.health().workload, WorkloadState::Starting);
        assert!(!s.health().healthy);
        assert_eq!(s.tick(t0 + secs(0)), Action::Wait(Some(t0 + SETTLE)));
        s.tick(t0 + SETTLE);
        let h = s.health();
        assert!(h.healthy && h.workload == WorkloadState::Running, "{h:?}");
        assert_eq!(h.restarts, 0);
    }

    #[test]
    fn backoff_doubles_to_five_minutes_while_it_keeps_crashing() {
        let mut now = Instant::now();
        let mut s = Supervision::new(true, secs(30), false);
        let mut delays = Vec::new();
        for _ in 0..12 {
            assert_eq!(s.tick(now), Action::Start);
            s.started(now);
            now += secs(2);
            let d = s.exited(Exit::Code(1), now);
            assert_eq!(s.tick(now), Action::Wait(Some(now + d)));
            delays.push(d.as_secs());
            now += d;
        }
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
        let h = s.health();
        assert_eq!(h.restarts, 11);
        assert_eq!(h.workload, WorkloadState::Backoff);
        assert!(!h.healthy);
        assert!(
            h.last_error
                .as_deref()
                .is_some_and(|e| e.contains("exited with code 1 after 2.0s")),
            "{h:?}"
        );
    }

    #[test]
    fn five_minutes_of_stable_running_resets_the_backoff() {
        let mut now = Instant::now();
        let mut s = Supervision::new(true, secs(30), false);
        for _ in 0..4 {
            s.started(now);
            now += secs(1);
            now += s.exited(Exit::Signal(9), now);
        }
        s.started(now);
        now += secs(299);
        assert_eq!(s.exited(Exit::Signal(9), now), secs(16));
        s.started(now);
        now += STABLE_RESET;
        assert_eq!(s.exited(Exit::Signal(9), now), secs(1));
        assert!(
            s.last_exit()
                .is_some_and(|e| e.contains("signal 9 (SIGKILL)")),
            "{:?}",
            s.last_exit()
        );
    }

    #[test]
    fn a_start_that_never_passes_its_check_fails_at_the_start_timeout() {
        let t0 = Instant::now();
        let mut s = Supervision::new(true, secs(5), true);
        s.started(t0);
        assert_eq!(s.check_interval(), Some(CHECK_STARTING));
        s.checked(
            Err("GET http://x/: connection refused".into()),
            t0 + secs(1),
        );
        assert_eq!(s.tick(t0 + secs(4)), Action::Wait(Some(t0 + secs(5))));
        let Action::StopFailedStart(why) = s.tick(t0 + secs(5)) else {
            panic!("not failed");
        };
        assert!(
            why.contains("5s") && why.contains("connection refused"),
            "{why}"
        );
        // Asked once; the stop's exit is reported as the failed start.
        assert_eq!(s.tick(t0 + secs(6)), Action::Wait(None));
        let delay = s.exited(Exit::Signal(15), t0 + secs(6));
        assert_eq!(delay, BACKOFF_FIRST);
        assert_eq!(s.health().last_error.as_deref(), Some(why.as_str()));
    }

    #[test]
    fn a_passing_check_makes_it_running_and_a_failing_one_unhealthy() {
        let t0 = Instant::now();
        let mut s = Supervision::new(true, secs(5), true);
        s.started(t0);
        s.checked(Ok(()), t0 + secs(1));
        assert!(s.health().healthy);
        assert_eq!(s.check_interval(), Some(CHECK_RUNNING));
        assert_eq!(s.tick(t0 + secs(60)), Action::Wait(None));
        s.checked(Err("answered 500".into()), t0 + secs(61));
        let h = s.health();
        assert!(!h.healthy && h.workload == WorkloadState::Running);
        assert!(h.last_error.is_some_and(|e| e.contains("500")));
        s.checked(Ok(()), t0 + secs(66));
        assert!(s.health().healthy && s.health().last_error.is_none());
    }

    #[test]
    fn a_command_that_cannot_start_backs_off_with_its_reason() {
        let t0 = Instant::now();
        let mut s = Supervision::new(true, secs(5), false);
        assert_eq!(s.spawn_failed("no such file".into(), t0), secs(1));
        assert_eq!(s.spawn_failed("no such file".into(), t0 + secs(1)), secs(2));
        let h = s.health();
        assert_eq!(h.workload, WorkloadState::Backoff);
        assert_eq!(h.restarts, 0);
        assert_eq!(h.last_error.as_deref(), Some("no such file"));
        s.stopped();
        assert_eq!(s.health().workload, WorkloadState::Stopped);
    }
}
