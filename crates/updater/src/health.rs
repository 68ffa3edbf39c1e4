//! The health verdict on a newly started version (step 5 of the update), as a pure
//! function of what was observed and when. The transaction feeds it observations of
//! `run/health.json`, `run/agent.pid` and `run/agent.exit`; nothing here touches a file.
//!
//! Healthy: the new process is alive, reports the expected version with its components
//! started, and stays so (same pid) through the stability window, all within the health
//! timeout. Failed, at once rather than at the timeout: the process exits or is
//! restarted before it is healthy, exits during the window, or a server refuses it.

use std::time::Duration;

use agent_protocol::AgentVersion;
use agent_protocol::journal::Health;
use agent_protocol::layout::EXIT_CONFIG;

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
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judgement {
    Wait,
    Healthy { pid: u32 },
    Failed(String),
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
        }
    }

    /// When the stability window began, if it has.
    pub fn stable_since(&self) -> Option<(u32, Duration)> {
        self.stable
    }

    pub fn observe(&mut self, obs: &Observation) -> Judgement {
        let to = &self.expected;
        let secs = obs.elapsed.as_secs_f64();
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
                return Judgement::Failed(format!(
                    "the server refuses {to}: it expects {expected}"
                ));
            }
            match self.stable {
                Some((pid, _)) if pid != h.pid => {
                    return Judgement::Failed(format!(
                        "the new agent (pid {pid}) exited {secs:.1}s after it reported healthy and was restarted"
                    ));
                }
                Some((pid, since)) if obs.elapsed.saturating_sub(since) >= self.window => {
                    return Judgement::Healthy { pid };
                }
                Some(_) => {}
                None if h.components_started => self.stable = Some((h.pid, obs.elapsed)),
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
            h.refused_by_server = Some("3.0.0+3".into());
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

    #[test]
    fn exit_file_parses() {
        assert_eq!(parse_exit_file("123 78 1700000000\n"), Some((123, 78)));
        assert_eq!(parse_exit_file("x"), None);
    }
}
