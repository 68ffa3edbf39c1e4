//! What a rollout does next, as a function of what was observed and the time; and the
//! version directive it implies for one agent. The database only feeds and applies it.

use std::fmt;
use std::str::FromStr;

use agent_protocol::{AcceptPolicy, AgentVersion};

use crate::rollout::plan::Plan;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Running,
    /// A completed wave waits `wave-wait` before the next opens.
    Soaking,
    /// No more agents are told; agents on the previous version stay accepted.
    Halted,
    Completed,
}

impl State {
    pub const ALL: [State; 4] = [
        State::Running,
        State::Soaking,
        State::Halted,
        State::Completed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Soaking => "soaking",
            State::Halted => "halted",
            State::Completed => "completed",
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for State {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        State::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| format!("unknown rollout state {s:?}"))
    }
}

/// Why a rollout halted, for the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HaltCause {
    Failures,
    Downgrade,
    Operator,
}

impl HaltCause {
    pub const ALL: [HaltCause; 3] = [
        HaltCause::Failures,
        HaltCause::Downgrade,
        HaltCause::Operator,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            HaltCause::Failures => "failures",
            HaltCause::Downgrade => "downgrade",
            HaltCause::Operator => "operator",
        }
    }
}

/// One wave as observed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WaveStatus {
    pub agents: u64,
    pub installed: u64,
    pub failed: u64,
    pub timed_out: u64,
    /// Agents whose platform the release has no bundle for: done, not failed.
    pub no_bundle: u64,
    /// Unix milliseconds.
    pub opened_at: Option<i64>,
    pub completed_at: Option<i64>,
}

impl WaveStatus {
    pub fn pending(&self) -> u64 {
        self.agents
            .saturating_sub(self.installed + self.failed + self.timed_out + self.no_bundle)
    }
}

/// A rollout as observed: its state, how many waves are open, each wave's counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    pub state: State,
    /// Waves opened so far; the current wave is this one (1-based), 0 before the first.
    pub opened: u32,
    /// One per wave of the plan.
    pub waves: Vec<WaveStatus>,
    /// Agents told to update so far.
    pub told: u64,
    /// Failures an operator let go with `resume`; only failures beyond them count.
    pub forgiven: u64,
    /// A few failed agents, described for the halt reason.
    pub failures_seen: Vec<String>,
}

impl Progress {
    pub fn failures(&self) -> u64 {
        self.waves.iter().map(|w| w.failed + w.timed_out).sum()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    OpenWave(u32),
    CompleteWave(u32),
    Soak(u32),
    Halt { cause: HaltCause, reason: String },
    Complete,
}

/// The next transition, if any. Applied one at a time: apply it, observe again, ask again.
pub fn next(plan: &Plan, p: &Progress, now_ms: i64) -> Option<Decision> {
    if matches!(p.state, State::Halted | State::Completed) {
        return None;
    }
    let failures = p.failures();
    let counted = failures.saturating_sub(p.forgiven);
    // An agent that failed was told, whatever the record of its telling says.
    let told = p.told.max(failures);
    if counted > 0 && plan.max_failures.exceeded(counted, told) {
        let mut reason = format!(
            "{failures} of {told} agents told failed, more than max-failures {}",
            plan.max_failures
        );
        if p.forgiven > 0 {
            reason.push_str(&format!(" ({} let go by an earlier resume)", p.forgiven));
        }
        if !p.failures_seen.is_empty() {
            reason.push_str(": ");
            reason.push_str(&p.failures_seen.join("; "));
        }
        return Some(Decision::Halt {
            cause: HaltCause::Failures,
            reason,
        });
    }
    if p.opened == 0 {
        return Some(Decision::OpenWave(1));
    }
    let current = p.opened;
    let wave = p.waves.get(current as usize - 1)?;
    let Some(completed_at) = wave.completed_at else {
        return (wave.pending() == 0).then_some(Decision::CompleteWave(current));
    };
    if current >= plan.wave_count() {
        return Some(Decision::Complete);
    }
    // An empty wave has nothing to soak.
    let soak_until = completed_at.saturating_add(plan.wave_wait.saturating_mul(1000) as i64);
    if wave.agents > 0 && plan.wave_wait > 0 && now_ms < soak_until {
        return (p.state != State::Soaking).then_some(Decision::Soak(current));
    }
    Some(Decision::OpenWave(current + 1))
}

/// `advance`: the next wave opens now, soak or no soak, complete or not.
pub fn advance(plan: &Plan, p: &Progress) -> Result<Decision, String> {
    match p.state {
        State::Halted => Err("the rollout is halted; resume it first".into()),
        State::Completed => Err("the rollout is completed; there is no wave to open".into()),
        _ if p.opened >= plan.wave_count() => {
            Err("every wave is open already; the rollout completes when the last one does".into())
        }
        _ => Ok(Decision::OpenWave(p.opened + 1)),
    }
}

/// When an agent told at `told_at` (or, never reached, since its wave opened at
/// `opened_at`) without an outcome has missed its deadline.
pub fn timed_out(plan: &Plan, told_at: Option<i64>, opened_at: i64, now_ms: i64) -> bool {
    let since = told_at.unwrap_or(opened_at);
    now_ms.saturating_sub(since) >= plan.agent_deadline.saturating_mul(1000) as i64
}

/// What the directive needs to know of the rollout in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Directive<'a> {
    pub target: &'a AgentVersion,
    pub previous: Option<&'a AgentVersion>,
    pub state: State,
    pub opened: u32,
}

impl Directive<'_> {
    /// The target is accepted; the previous version until the agent's wave opens (and
    /// for as long as the rollout is halted); any other version is refused.
    pub fn accepts(&self, policy: &AcceptPolicy, agent: &AgentVersion, agent_wave: u32) -> bool {
        if policy.accepts(self.target, agent) {
            return true;
        }
        match self.previous {
            Some(previous) if policy.accepts(previous, agent) => {
                self.state == State::Halted || agent_wave > self.opened
            }
            _ => false,
        }
    }
}

/// True when `target` is older than `previous`: a downgrade, which starts halted.
pub fn is_downgrade(target: &AgentVersion, previous: &AgentVersion) -> bool {
    match target.version().cmp(previous.version()) {
        std::cmp::Ordering::Less => true,
        std::cmp::Ordering::Greater => false,
        // Same version: numeric builds compare as numbers, others are not ordered.
        std::cmp::Ordering::Equal => match (
            target.build().parse::<u64>(),
            previous.build().parse::<u64>(),
        ) {
            (Ok(t), Ok(p)) => t < p,
            _ => false,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(waves: &[&str], wait: u64) -> Plan {
        let waves: Vec<String> = waves.iter().map(|s| (*s).to_owned()).collect();
        Plan::new(&waves, wait, "10%", 60).unwrap()
    }

    fn wave(agents: u64, installed: u64, failed: u64) -> WaveStatus {
        WaveStatus {
            agents,
            installed,
            failed,
            ..WaveStatus::default()
        }
    }

    fn progress(opened: u32, waves: Vec<WaveStatus>, told: u64) -> Progress {
        Progress {
            state: State::Running,
            opened,
            waves,
            told,
            forgiven: 0,
            failures_seen: Vec::new(),
        }
    }

    #[test]
    fn waves_open_complete_soak_and_finish_in_order() {
        let p3 = plan(&["2", "50%", "100%"], 5);
        let mut p = progress(0, vec![wave(2, 0, 0), wave(3, 0, 0), wave(5, 0, 0)], 0);
        assert_eq!(next(&p3, &p, 0), Some(Decision::OpenWave(1)));
        p.opened = 1;
        p.waves[0].opened_at = Some(0);
        p.told = 2;
        assert_eq!(next(&p3, &p, 1000), None, "wave 1 is pending");
        p.waves[0].installed = 2;
        assert_eq!(next(&p3, &p, 2000), Some(Decision::CompleteWave(1)));
        p.waves[0].completed_at = Some(2000);
        assert_eq!(next(&p3, &p, 2000), Some(Decision::Soak(1)));
        p.state = State::Soaking;
        assert_eq!(next(&p3, &p, 6999), None, "still soaking");
        assert_eq!(next(&p3, &p, 7000), Some(Decision::OpenWave(2)));
        p.state = State::Running;
        p.opened = 3;
        for w in &mut p.waves {
            w.installed = w.agents;
            w.completed_at = Some(9000);
        }
        assert_eq!(next(&p3, &p, 9000), Some(Decision::Complete));
        p.state = State::Completed;
        assert_eq!(next(&p3, &p, 9000), None);
    }

    #[test]
    fn failures_beyond_the_threshold_halt_and_name_the_agents() {
        let p3 = plan(&["2", "50%", "100%"], 0);
        let mut p = progress(1, vec![wave(2, 1, 1), wave(3, 0, 0), wave(5, 0, 0)], 2);
        p.failures_seen = vec!["host-a (INSTALL_FAILED: exited at once)".into()];
        let Some(Decision::Halt { cause, reason }) = next(&p3, &p, 0) else {
            panic!("no halt");
        };
        assert_eq!(cause, HaltCause::Failures);
        assert!(
            reason.contains("1 of 2") && reason.contains("host-a"),
            "{reason}"
        );
        // Halted: nothing more happens, however long it waits.
        p.state = State::Halted;
        assert_eq!(next(&p3, &p, i64::MAX), None);
        // Resumed: the failures seen so far are let go.
        p.state = State::Running;
        p.forgiven = 1;
        assert_eq!(next(&p3, &p, 0), Some(Decision::CompleteWave(1)));
    }

    #[test]
    fn an_empty_wave_does_not_soak() {
        let p = plan(&["group:none", "100%"], 30);
        let mut prog = progress(1, vec![wave(0, 0, 0), wave(4, 0, 0)], 0);
        assert_eq!(next(&p, &prog, 0), Some(Decision::CompleteWave(1)));
        prog.waves[0].completed_at = Some(0);
        assert_eq!(next(&p, &prog, 0), Some(Decision::OpenWave(2)));
    }

    #[test]
    fn advance_opens_the_next_wave_now_unless_halted_or_done() {
        let p3 = plan(&["2", "100%"], 600);
        let mut p = progress(1, vec![wave(2, 0, 0), wave(3, 0, 0)], 2);
        assert_eq!(advance(&p3, &p), Ok(Decision::OpenWave(2)));
        p.opened = 2;
        assert!(advance(&p3, &p).is_err());
        p.opened = 1;
        p.state = State::Halted;
        assert!(advance(&p3, &p).is_err());
    }

    #[test]
    fn deadlines_run_from_the_telling_or_else_from_the_wave_opening() {
        let p = plan(&["100%"], 0);
        assert!(!timed_out(&p, Some(10_000), 0, 69_999));
        assert!(timed_out(&p, Some(10_000), 0, 70_000));
        assert!(timed_out(&p, None, 0, 60_000));
    }

    fn v(s: &str) -> AgentVersion {
        s.parse().unwrap()
    }

    #[test]
    fn the_directive_follows_the_waves() {
        let target = v("2.0.0+2");
        let previous = v("1.0.0+1");
        let exact = AcceptPolicy::Exact;
        let mut d = Directive {
            target: &target,
            previous: Some(&previous),
            state: State::Running,
            opened: 1,
        };
        assert!(d.accepts(&exact, &target, 1));
        assert!(!d.accepts(&exact, &previous, 1), "its wave is open");
        assert!(d.accepts(&exact, &previous, 2), "its wave is not open yet");
        assert!(!d.accepts(&exact, &v("0.9.0+1"), 3), "another version");
        d.state = State::Halted;
        assert!(
            d.accepts(&exact, &previous, 1),
            "halted: the previous stays accepted"
        );
        let first = Directive {
            target: &target,
            previous: None,
            state: State::Running,
            opened: 0,
        };
        assert!(!first.accepts(&exact, &previous, 5), "no previous: refused");
    }

    #[test]
    fn downgrades_compare_versions_then_numeric_builds() {
        assert!(is_downgrade(&v("1.0.0+5"), &v("2.0.0+1")));
        assert!(!is_downgrade(&v("2.0.0+1"), &v("1.0.0+5")));
        assert!(is_downgrade(&v("2.0.0+9"), &v("2.0.0+10")));
        assert!(!is_downgrade(&v("2.0.0+10"), &v("2.0.0+10")));
        assert!(!is_downgrade(&v("2.0.0+b"), &v("2.0.0+a")));
    }
}
