//! The health verdict on a newly started version (step 5 of the update), as a pure
//! function of what was observed and when. The transaction feeds it observations of
//! `run/health.json`, `run/agent.pid` and `run/agent.exit`; nothing here touches a file.
//!
//! Healthy: the new process is alive, reports the expected version with its components
//! started, and stays so (same pid) through the stability window, all within the health
//! timeout. Failed, at once rather than at the timeout: the process exits or is
//! restarted before it is healthy, exits during the window, or a server refuses it.
//!
//! Not every end is a failure. A stop that was asked for (`run/stop-requested`: the
//! wrapper's or the service's stop, and so systemd's, `net stop` and a shutdown) ends the
//! judgement with no verdict ([`Judgement::Stopped`]): the version is judged again at its
//! next start. A server that refuses the new version because it now offers a *newer* one
//! does not fail it either: it is judged to the end, and takes the newer one once it has
//! committed.
//!
//! The new version's workload counts too: the agent is healthy only once its workload
//! runs and passes its check (the agent gives up on a start after the workload's
//! `start-timeout`); a workload that exits, fails to start, restarts or turns unhealthy
//! before the commit fails the update.

use std::time::Duration;

use agent_protocol::AgentVersion;
use agent_protocol::journal::{Health, WorkloadReport};
use agent_protocol::layout::EXIT_CONFIG;
use agent_protocol::wire::WorkloadState;

/// One look at the installation, `elapsed` after the new version was started.
#[derive(Debug, Clone, Default)]
pub struct Observation {
    pub elapsed: Duration,
    /// `run/health.json`, if it parsed.
    pub health: Option<Health>,
    /// Whether the pid that `health` names is alive.
    pub health_pid_alive: bool,
    /// The agent pid the wrapper's supervisor recorded (`run/agent.pid`).
    pub agent_pid: Option<u32>,
    /// Whether `agent_pid` is alive.
    pub agent_alive: bool,
    /// `(pid, exit code)` of the agent's last exit (`run/agent.exit`).
    pub last_exit: Option<(u32, i32)>,
    /// A stop asked for since the new version was started (`run/stop-requested`): who
    /// asked, in words.
    pub stop_requested: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judgement {
    Wait,
    Healthy {
        pid: u32,
    },
    Failed(String),
    /// Stopped on request before a verdict: no failure of the version (why, in words).
    Stopped(String),
}

/// Judges one start of `expected`; feed it observations until it stops answering `Wait`.
#[derive(Debug, Clone)]
pub struct Judge {
    expected: AgentVersion,
    timeout: Duration,
    window: Duration,
    /// The first agent process seen: any other one means it was restarted.
    watched: Option<u32>,
    /// Healthy since (pid, elapsed).
    stable: Option<(u32, Duration)>,
    /// Set once the stability window has begun, for the log.
    pub announced: bool,
    /// The workload's restarts when the window began: one more fails it.
    restarts_at_stable: u64,
    /// The verdict blames the workload (its log is worth showing).
    workload_failed: bool,
    /// The newer version a server asks for instead, once one has (for the log).
    superseded_by: Option<String>,
}

/// The new version's workload, if it has one (an agent from before workloads, or one
/// with `workload.command = []`, has none).
fn workload_of(h: &Health) -> Option<&WorkloadReport> {
    h.workload
        .as_ref()
        .filter(|w| w.health.workload != WorkloadState::None)
}

impl Judge {
    pub fn new(expected: AgentVersion, timeout: Duration, window: Duration) -> Self {
        Self {
            expected,
            timeout,
            window,
            watched: None,
            stable: None,
            announced: false,
            restarts_at_stable: 0,
            workload_failed: false,
            superseded_by: None,
        }
    }

    /// The newer version a server asked for instead while this one was judged, if one
    /// did: not a failure of this one, which takes it after it commits.
    pub fn superseded_by(&self) -> Option<&str> {
        self.superseded_by.as_deref()
    }

    /// True when the failure is the workload's: its exit or failing check.
    pub fn workload_failed(&self) -> bool {
        self.workload_failed
    }

    fn workload_failure(&mut self, why: String) -> Judgement {
        self.workload_failed = true;
        Judgement::Failed(why)
    }

    /// When the stability window began, if it has.
    pub fn stable_since(&self) -> Option<(u32, Duration)> {
        self.stable
    }

    pub fn observe(&mut self, obs: &Observation) -> Judgement {
        let to = &self.expected;
        let secs = obs.elapsed.as_secs_f64();
        if let Some(stopped) = self.stopped_on_request(obs) {
            return Judgement::Stopped(stopped);
        }
        if let Some(pid) = obs.agent_pid {
            match self.watched {
                None => self.watched = Some(pid),
                Some(first) if first != pid => {
                    return Judgement::Failed(format!(
                        "the new agent (pid {first}) exited{} {secs:.1}s after start and was restarted (pid {pid}) before it was healthy",
                        exit_detail(first, obs.last_exit)
                    ));
                }
                Some(_) => {}
            }
        }
        let healthy_now = obs
            .health
            .as_ref()
            .filter(|h| h.version == *to && obs.health_pid_alive);
        if let Some(h) = healthy_now {
            if let Some(expected) = &h.refused_by_server {
                if !supersedes(expected, to) {
                    return Judgement::Failed(format!(
                        "the server refuses {to}: it expects {expected}"
                    ));
                }
                self.superseded_by = Some(expected.clone());
            }
            let workload = workload_of(h);
            if let Some(w) = workload
                && w.health.workload == WorkloadState::Backoff
            {
                return self.workload_failure(format!(
                    "the workload of {to} failed {secs:.1}s after start: {}",
                    w.health
                        .last_error
                        .as_deref()
                        .or(w.last_exit.as_deref())
                        .unwrap_or("it is not running")
                ));
            }
            let workload_ok = workload.is_none_or(|w| w.health.healthy);
            let restarts = workload.map_or(0, |w| w.health.restarts);
            match self.stable {
                Some((pid, _)) if pid == h.pid && restarts > self.restarts_at_stable => {
                    return self.workload_failure(format!(
                        "the workload of {to} was restarted {secs:.1}s after start, during the stability window: {}",
                        workload
                            .and_then(|w| w.last_exit.as_deref())
                            .unwrap_or("it exited")
                    ));
                }
                Some((pid, _)) if pid == h.pid && !workload_ok => {
                    return self.workload_failure(format!(
                        "the workload of {to} turned unhealthy {secs:.1}s after start, during the stability window: {}",
                        workload
                            .and_then(|w| w.health.last_error.as_deref())
                            .unwrap_or("its health check fails")
                    ));
                }
                Some((pid, _)) if pid != h.pid => {
                    return Judgement::Failed(format!(
                        "the new agent (pid {pid}) exited {secs:.1}s after it reported healthy and was restarted"
                    ));
                }
                Some((pid, since)) if obs.elapsed.saturating_sub(since) >= self.window => {
                    return Judgement::Healthy { pid };
                }
                Some(_) => {}
                None if h.components_started && workload_ok => {
                    self.stable = Some((h.pid, obs.elapsed));
                    self.restarts_at_stable = restarts;
                }
                None => {}
            }
        } else if let Some((pid, _)) = self.stable {
            return Judgement::Failed(format!(
                "the new agent (pid {pid}) exited{} {secs:.1}s after start, during the stability window",
                exit_detail(pid, obs.last_exit)
            ));
        } else if let Some(pid) = self.watched
            && obs.agent_pid == Some(pid)
            && !obs.agent_alive
        {
            return Judgement::Failed(format!(
                "the new agent (pid {pid}) exited{} {secs:.1}s after start, before it was healthy (see logs/agent.out)",
                exit_detail(pid, obs.last_exit)
            ));
        }
        if obs.elapsed >= self.timeout {
            let last = match (&obs.health, obs.agent_pid) {
                (Some(h), _) if h.version != *to => {
                    format!("run/health.json names {} pid {}", h.version, h.pid)
                }
                (Some(h), _) if !h.components_started => {
                    "running, components not started".to_owned()
                }
                (Some(h), _) if workload_of(h).is_some_and(|w| !w.health.healthy) => {
                    self.workload_failed = true;
                    let w = workload_of(h);
                    format!(
                        "its workload is {}{}",
                        w.map_or("starting", |w| w.health.workload.as_str()),
                        w.and_then(|w| w.health.last_error.as_deref())
                            .map(|e| format!(" ({e})"))
                            .unwrap_or_default()
                    )
                }
                (Some(_), _) => "healthy, but not for the whole stability window".to_owned(),
                (None, Some(_)) if obs.agent_alive => {
                    "running, but it never wrote run/health.json".to_owned()
                }
                (None, _) => "the new agent is not running (see logs/agent.out)".to_owned(),
            };
            return Judgement::Failed(format!(
                "{to} did not become healthy within {:?} (update.health-timeout): {last}",
                self.timeout
            ));
        }
        Judgement::Wait
    }
}

impl Judge {
    /// The new agent ended (or ends, or was replaced) after a stop was asked for: the
    /// stop's doing, not the version's. While it still runs, a stop under way is waited
    /// for like anything else.
    fn stopped_on_request(&self, obs: &Observation) -> Option<String> {
        let by = obs.stop_requested.as_deref()?;
        let running = obs.agent_pid.is_some() && obs.agent_alive;
        let replaced = matches!((self.watched, obs.agent_pid), (Some(a), Some(b)) if a != b);
        if running && !replaced {
            return None;
        }
        let secs = obs.elapsed.as_secs_f64();
        let which = self
            .watched
            .or(self.stable.map(|(pid, _)| pid))
            .map(|pid| format!(" (pid {pid})"))
            .unwrap_or_default();
        let when = if self.stable.is_some() {
            "during the stability window"
        } else {
            "before it was healthy"
        };
        Some(format!(
            "the new agent{which} was stopped on request ({by}) {secs:.1}s after start, {when}"
        ))
    }
}

/// Whether a server that asks for `expected` instead of `to` asks for a newer release:
/// `to` is then superseded, not refused (a release published during its stability window).
/// An older version, the same one, or one that does not parse is a refusal.
pub fn supersedes(expected: &str, to: &AgentVersion) -> bool {
    expected
        .parse::<AgentVersion>()
        .is_ok_and(|e| e.version() > to.version())
}

fn exit_detail(pid: u32, last_exit: Option<(u32, i32)>) -> String {
    match last_exit {
        Some((p, code)) if p == pid && code == i32::from(EXIT_CONFIG) => {
            format!(" (code {code}: it refused its configuration)")
        }
        Some((p, code)) if p == pid => format!(" with code {code}"),
        _ => String::new(),
    }
}

/// Parses `run/agent.exit`: `<pid> <exit code> <unix seconds>`.
pub fn parse_exit_file(text: &str) -> Option<(u32, i32)> {
    let mut fields = text.split_whitespace();
    let pid = fields.next()?.parse().ok()?;
    let code = fields.next()?.parse().ok()?;
    Some((pid, code))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judge() -> Judge {
        Judge::new(
            "2.0.0+2".parse().unwrap(),
            Duration::from_secs(60),
            Duration::from_secs(10),
        )
    }

    fn at(secs: f64) -> Observation {
        Observation {
            elapsed: Duration::from_secs_f64(secs),
            ..Observation::default()
        }
    }

    fn healthy(secs: f64, pid: u32) -> Observation {
        Observation {
            health: Some(Health {
                version: "2.0.0+2".parse().unwrap(),
                pid,
                components_started: true,
                last_contact: None,
                refused_by_server: None,
                workload: None,
                waiting_window: None,
                deployment: None,
            }),
            health_pid_alive: true,
            agent_pid: Some(pid),
            agent_alive: true,
            ..at(secs)
        }
    }

    fn dead(secs: f64, pid: u32, code: i32) -> Observation {
        Observation {
            agent_pid: Some(pid),
            agent_alive: false,
            last_exit: Some((pid, code)),
            ..at(secs)
        }
    }

    #[test]
    fn healthy_after_the_stability_window() {
        let mut j = judge();
        assert_eq!(j.observe(&healthy(0.5, 7)), Judgement::Wait);
        assert_eq!(j.observe(&healthy(9.0, 7)), Judgement::Wait);
        assert_eq!(j.observe(&healthy(10.6, 7)), Judgement::Healthy { pid: 7 });
    }

    #[test]
    fn an_exit_before_healthy_fails_at_once_not_at_the_timeout() {
        let mut j = judge();
        let alive = Observation {
            agent_pid: Some(7),
            agent_alive: true,
            ..at(0.1)
        };
        assert_eq!(j.observe(&alive), Judgement::Wait);
        let Judgement::Failed(why) = j.observe(&dead(0.3, 7, 1)) else {
            panic!("not failed");
        };
        assert!(
            why.contains("with code 1") && why.contains("before it was healthy"),
            "{why}"
        );
    }

    #[test]
    fn a_restart_before_healthy_fails() {
        let mut j = judge();
        let first = Observation {
            agent_pid: Some(7),
            agent_alive: true,
            ..at(0.1)
        };
        assert_eq!(j.observe(&first), Judgement::Wait);
        let second = Observation {
            agent_pid: Some(8),
            agent_alive: true,
            last_exit: Some((7, 78)),
            ..at(1.5)
        };
        let Judgement::Failed(why) = j.observe(&second) else {
            panic!("not failed");
        };
        assert!(
            why.contains("restarted") && why.contains("configuration"),
            "{why}"
        );
    }

    #[test]
    fn an_exit_during_the_window_fails() {
        let mut j = judge();
        assert_eq!(j.observe(&healthy(0.5, 7)), Judgement::Wait);
        let Judgement::Failed(why) = j.observe(&dead(2.5, 7, 1)) else {
            panic!("not failed");
        };
        assert!(why.contains("during the stability window"), "{why}");
    }

    #[test]
    fn refused_by_the_server_fails() {
        let mut j = judge();
        let mut o = healthy(1.0, 7);
        if let Some(h) = o.health.as_mut() {
            // The server went back to the old release: 2.0.0 is refused, not superseded.
            h.refused_by_server = Some("1.0.0+1".into());
        }
        assert!(matches!(j.observe(&o), Judgement::Failed(w) if w.contains("refuses")));
    }

    #[test]
    fn a_slow_start_waits_until_the_timeout() {
        let mut j = judge();
        let slow = Observation {
            agent_pid: Some(7),
            agent_alive: true,
            ..at(30.0)
        };
        assert_eq!(j.observe(&slow), Judgement::Wait);
        let late = Observation {
            elapsed: Duration::from_secs(60),
            ..slow
        };
        assert!(matches!(j.observe(&late), Judgement::Failed(w) if w.contains("never wrote")));
    }

    #[test]
    fn the_old_versions_health_does_not_count() {
        let mut j = judge();
        let mut o = healthy(1.0, 7);
        if let Some(h) = o.health.as_mut() {
            h.version = "1.0.0+1".parse().unwrap();
        }
        assert_eq!(j.observe(&o), Judgement::Wait);
    }

    fn with_workload(
        mut o: Observation,
        state: WorkloadState,
        healthy: bool,
        restarts: u64,
    ) -> Observation {
        use agent_protocol::wire::AgentHealth;
        if let Some(h) = o.health.as_mut() {
            h.workload = Some(WorkloadReport {
                health: AgentHealth {
                    healthy,
                    workload: state,
                    restarts,
                    last_error: (!healthy)
                        .then(|| "GET http://127.0.0.1:9/metrics: connection refused".into()),
                },
                pid: Some(70),
                since: None,
                last_exit: (restarts > 0).then(|| "exited with code 2 after 0.1s".into()),
                start_timeout_ms: 30_000,
            });
        }
        o
    }

    #[test]
    fn a_starting_workload_delays_the_verdict_and_a_healthy_one_allows_it() {
        let mut j = judge();
        let starting = with_workload(healthy(0.5, 7), WorkloadState::Starting, false, 0);
        assert_eq!(j.observe(&starting), Judgement::Wait);
        assert_eq!(j.stable_since(), None);
        let up = with_workload(healthy(3.0, 7), WorkloadState::Running, true, 0);
        assert_eq!(j.observe(&up), Judgement::Wait);
        let later = with_workload(healthy(13.5, 7), WorkloadState::Running, true, 0);
        assert_eq!(j.observe(&later), Judgement::Healthy { pid: 7 });
        assert!(!j.workload_failed());
    }

    #[test]
    fn a_workload_that_exits_or_fails_its_start_fails_the_update_at_once() {
        let mut j = judge();
        let crashed = with_workload(healthy(1.5, 7), WorkloadState::Backoff, false, 0);
        let Judgement::Failed(why) = j.observe(&crashed) else {
            panic!("not failed");
        };
        assert!(
            why.contains("workload of 2.0.0+2 failed") && why.contains("connection refused"),
            "{why}"
        );
        assert!(j.workload_failed());
    }

    #[test]
    fn a_workload_restarted_or_unhealthy_in_the_window_fails_the_update() {
        let mut j = judge();
        let up = with_workload(healthy(1.0, 7), WorkloadState::Running, true, 0);
        assert_eq!(j.observe(&up), Judgement::Wait);
        let again = with_workload(healthy(2.0, 7), WorkloadState::Starting, false, 1);
        assert!(matches!(j.observe(&again), Judgement::Failed(w) if w.contains("code 2")));
        let mut j = judge();
        assert_eq!(j.observe(&up), Judgement::Wait);
        let sick = with_workload(healthy(2.0, 7), WorkloadState::Running, false, 0);
        assert!(matches!(j.observe(&sick), Judgement::Failed(w) if w.contains("unhealthy")));
        assert!(j.workload_failed());
    }

    #[test]
    fn a_workload_still_starting_at_the_timeout_is_named() {
        let mut j = judge();
        let slow = with_workload(healthy(60.0, 7), WorkloadState::Starting, false, 0);
        let Judgement::Failed(why) = j.observe(&slow) else {
            panic!("not failed");
        };
        assert!(
            why.contains("workload is starting") && why.contains("connection refused"),
            "{why}"
        );
        assert!(j.workload_failed());
    }

    fn asked(mut o: Observation) -> Observation {
        o.stop_requested = Some("agent-wrapper.sh stop".into());
        o
    }

    #[test]
    fn a_stop_asked_for_during_the_window_is_no_verdict() {
        let mut j = judge();
        assert_eq!(j.observe(&healthy(0.5, 7)), Judgement::Wait);
        // The stop is under way: the agent still runs.
        assert_eq!(j.observe(&asked(healthy(1.0, 7))), Judgement::Wait);
        // It exited 0, as a stopped agent does; the wrapper removed run/agent.pid.
        let gone = Observation {
            agent_pid: None,
            last_exit: Some((7, 0)),
            health: healthy(1.1, 7).health,
            ..at(1.1)
        };
        let Judgement::Stopped(why) = j.observe(&asked(gone.clone())) else {
            panic!("a planned stop failed the update");
        };
        assert!(
            why.contains("(pid 7) was stopped on request (agent-wrapper.sh stop) 1.1s after start, during the stability window"),
            "{why}"
        );
        // The same exit with no stop asked for is the version's failure.
        let mut j = judge();
        assert_eq!(j.observe(&healthy(0.5, 7)), Judgement::Wait);
        assert!(
            matches!(j.observe(&gone), Judgement::Failed(w) if w.contains("during the stability window"))
        );
    }

    #[test]
    fn a_stop_asked_for_before_healthy_or_with_any_exit_code_is_no_verdict() {
        let mut j = judge();
        let starting = Observation {
            agent_pid: Some(7),
            agent_alive: true,
            ..at(0.2)
        };
        assert_eq!(j.observe(&starting), Judgement::Wait);
        // Killed after the wrapper's stop timeout: still the stop's doing.
        let Judgement::Stopped(why) = j.observe(&asked(dead(0.4, 7, 137))) else {
            panic!("not a planned stop");
        };
        assert!(why.contains("before it was healthy"), "{why}");
        // Stopped and started again (a restart) before this updater looked.
        let mut j = judge();
        assert_eq!(j.observe(&healthy(0.5, 7)), Judgement::Wait);
        assert!(matches!(
            j.observe(&asked(healthy(1.5, 8))),
            Judgement::Stopped(_)
        ));
        // Nothing ever started, and a stop was asked for.
        assert!(matches!(
            judge().observe(&asked(at(0.1))),
            Judgement::Stopped(_)
        ));
    }

    #[test]
    fn a_newer_release_offered_during_the_window_does_not_fail_the_update() {
        let refused = |secs, expected: &str| {
            let mut o = healthy(secs, 7);
            if let Some(h) = o.health.as_mut() {
                h.refused_by_server = Some(expected.into());
            }
            o
        };
        let mut j = judge();
        assert_eq!(j.observe(&healthy(0.5, 7)), Judgement::Wait);
        assert_eq!(j.observe(&refused(2.0, "3.0.0+3")), Judgement::Wait);
        assert_eq!(j.superseded_by(), Some("3.0.0+3"));
        assert_eq!(
            j.observe(&refused(10.6, "3.0.0+3")),
            Judgement::Healthy { pid: 7 }
        );
        // An older version, another build of the same one, or nonsense: refused.
        for expected in ["1.0.0+1", "2.0.0+9", "2.0.0+2", "latest"] {
            let mut j = judge();
            assert!(
                matches!(j.observe(&refused(1.0, expected)), Judgement::Failed(w) if w.contains("refuses")),
                "{expected}"
            );
        }
    }

    #[test]
    fn exit_file_parses() {
        assert_eq!(parse_exit_file("123 78 1700000000\n"), Some((123, 78)));
        assert_eq!(parse_exit_file("x"), None);
    }
}
