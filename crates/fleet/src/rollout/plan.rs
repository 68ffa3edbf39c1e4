//! The plan a rollout runs under, from `[rollout]`: cumulative waves, the soak between
//! them, the failure threshold and the per-agent deadline.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// How far a wave reaches, cumulatively.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum WaveSpec {
    /// The first N agents of the order (`"2"`).
    Count(u64),
    /// A share of the fleet in hundredths of a percent (`"10%"` is 1000), rounded up.
    Share(u32),
    /// Every agent whose `agent.group` is NAME (`"group:canary"`), before the rest.
    Group(String),
}

pub const ALL: WaveSpec = WaveSpec::Share(10_000);

impl FromStr for WaveSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if let Some(name) = s.strip_prefix("group:") {
            let name = name.trim();
            if name.is_empty() || name.len() > 64 {
                return Err(format!("{s:?}: a group name is 1 to 64 characters"));
            }
            return Ok(WaveSpec::Group(name.to_owned()));
        }
        if let Some(share) = s.strip_suffix('%') {
            return parse_share(share)
                .map(WaveSpec::Share)
                .ok_or_else(|| format!("{s:?} is not a share between 0% and 100%, such as 10%"));
        }
        match s.parse::<u64>() {
            Ok(n) if n > 0 => Ok(WaveSpec::Count(n)),
            _ => Err(format!(
                "{s:?} is not a wave: write a count (\"2\"), a share (\"10%\") or \"group:NAME\""
            )),
        }
    }
}

/// `"12.5"` → 1250 (hundredths of a percent), within (0, 100].
fn parse_share(s: &str) -> Option<u32> {
    let value: f64 = s.trim().parse().ok()?;
    if !(value > 0.0 && value <= 100.0) {
        return None;
    }
    Some((value * 100.0).round() as u32)
}

impl fmt::Display for WaveSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WaveSpec::Count(n) => write!(f, "{n}"),
            WaveSpec::Share(bp) if bp % 100 == 0 => write!(f, "{}%", bp / 100),
            WaveSpec::Share(bp) => write!(f, "{}%", f64::from(*bp) / 100.0),
            WaveSpec::Group(name) => write!(f, "group:{name}"),
        }
    }
}

impl From<WaveSpec> for String {
    fn from(w: WaveSpec) -> String {
        w.to_string()
    }
}

impl TryFrom<String> for WaveSpec {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

/// `max-failures`: a count, or a share of the agents told so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum Threshold {
    Count(u64),
    /// Hundredths of a percent.
    Share(u32),
}

impl Threshold {
    /// True when `failures` among `told` agents is more than this allows.
    pub fn exceeded(self, failures: u64, told: u64) -> bool {
        match self {
            Threshold::Count(n) => failures > n,
            // failures / told > bp / 10000, in integers.
            Threshold::Share(bp) => {
                u128::from(failures) * 10_000 > u128::from(bp) * u128::from(told)
            }
        }
    }
}

impl FromStr for Threshold {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if let Some(share) = s.strip_suffix('%') {
            let value: f64 = share
                .trim()
                .parse()
                .map_err(|_| format!("{s:?} is not a share such as 10%"))?;
            if !(0.0..=100.0).contains(&value) {
                return Err(format!("{s:?} is not between 0% and 100%"));
            }
            return Ok(Threshold::Share((value * 100.0).round() as u32));
        }
        s.parse::<u64>()
            .map(Threshold::Count)
            .map_err(|_| format!("{s:?} is not a count (\"3\") or a share (\"10%\")"))
    }
}

impl fmt::Display for Threshold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Threshold::Count(n) => write!(f, "{n}"),
            Threshold::Share(bp) if bp % 100 == 0 => write!(f, "{}%", bp / 100),
            Threshold::Share(bp) => write!(f, "{}%", f64::from(*bp) / 100.0),
        }
    }
}

impl From<Threshold> for String {
    fn from(t: Threshold) -> String {
        t.to_string()
    }
}

impl TryFrom<String> for Threshold {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

/// A rollout's plan. Stored with the rollout when it starts: a later change of
/// `[rollout]` applies to the next rollout, never to one under way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub waves: Vec<WaveSpec>,
    /// Seconds a completed wave soaks before the next opens.
    pub wave_wait: u64,
    pub max_failures: Threshold,
    /// Seconds an agent told to update has to report.
    pub agent_deadline: u64,
}

impl Default for Plan {
    fn default() -> Self {
        Self {
            waves: vec![ALL],
            wave_wait: 0,
            max_failures: Threshold::Share(1000),
            agent_deadline: 1800,
        }
    }
}

impl Plan {
    /// Checks the waves and makes sure the last one reaches every agent: a plan that
    /// stops short (`["1", "10%"]`) gets a final `"100%"`, so no agent is left behind.
    pub fn new(
        waves: &[String],
        wave_wait: u64,
        max_failures: &str,
        agent_deadline: u64,
    ) -> Result<Self, String> {
        let mut parsed = Vec::with_capacity(waves.len() + 1);
        for w in waves {
            parsed.push(
                w.parse::<WaveSpec>()
                    .map_err(|e| format!("rollout.waves: {e}"))?,
            );
        }
        if parsed.len() > 100 {
            return Err("rollout.waves: at most 100 waves".into());
        }
        if parsed.last() != Some(&ALL) {
            parsed.push(ALL);
        }
        if agent_deadline == 0 {
            return Err("rollout.agent-deadline must be at least 1 second".into());
        }
        Ok(Self {
            waves: parsed,
            wave_wait,
            max_failures: max_failures
                .parse()
                .map_err(|e| format!("rollout.max-failures: {e}"))?,
            agent_deadline,
        })
    }

    pub fn wave_count(&self) -> u32 {
        self.waves.len() as u32
    }

    /// The spec of wave `wave` (1-based).
    pub fn spec(&self, wave: u32) -> Option<&WaveSpec> {
        self.waves.get((wave as usize).checked_sub(1)?)
    }

    /// The wave an agent first seen after the rollout started joins: the next wave to
    /// open that can hold it (a `group:` wave holds only its group), or, when every wave
    /// is open, the last.
    pub fn join_wave(&self, opened: u32, group: &str) -> u32 {
        let n = self.wave_count();
        ((opened + 1)..=n)
            .find(|&w| match self.spec(w) {
                Some(WaveSpec::Group(g)) => g == group,
                _ => true,
            })
            .unwrap_or(n.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(waves: &[&str]) -> Plan {
        let waves: Vec<String> = waves.iter().map(|s| (*s).to_owned()).collect();
        Plan::new(&waves, 0, "10%", 1800).unwrap()
    }

    #[test]
    fn waves_parse_and_print() {
        for (text, spec) in [
            ("2", WaveSpec::Count(2)),
            ("10%", WaveSpec::Share(1000)),
            ("0.5%", WaveSpec::Share(50)),
            ("group:canary", WaveSpec::Group("canary".into())),
        ] {
            assert_eq!(text.parse::<WaveSpec>().unwrap(), spec);
            assert_eq!(spec.to_string(), text);
        }
        for bad in ["0", "-1", "0%", "101%", "x", "group:", "ten%"] {
            assert!(bad.parse::<WaveSpec>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_plan_always_ends_with_everyone() {
        assert_eq!(plan(&["2", "50%"]).waves.last(), Some(&ALL));
        assert_eq!(plan(&["2", "50%", "100%"]).waves.len(), 3);
        assert_eq!(plan(&[]).waves, vec![ALL]);
    }

    #[test]
    fn halt_threshold_counts_and_shares() {
        let ten = Threshold::Share(1000);
        // One failure in a canary of two is more than 10 %.
        assert!(ten.exceeded(1, 2));
        assert!(!ten.exceeded(0, 2));
        // Exactly 10 % is not more than 10 %.
        assert!(!ten.exceeded(10, 100));
        assert!(ten.exceeded(11, 100));
        let five = Threshold::Share(500);
        assert!(!five.exceeded(5, 100));
        assert!(five.exceeded(6, 100));
        let two = Threshold::Count(2);
        assert!(!two.exceeded(2, 1000));
        assert!(two.exceeded(3, 3));
        assert!(!Threshold::Share(0).exceeded(0, 0));
        assert!(Threshold::Share(0).exceeded(1, 10));
        assert_eq!("3".parse::<Threshold>().unwrap(), Threshold::Count(3));
        assert!("x".parse::<Threshold>().is_err());
    }

    #[test]
    fn newcomers_join_the_next_wave_that_can_hold_them() {
        let p = plan(&["group:canary", "2", "50%", "100%"]);
        assert_eq!(p.join_wave(0, "canary"), 1);
        assert_eq!(p.join_wave(0, ""), 2);
        assert_eq!(p.join_wave(1, "canary"), 2);
        assert_eq!(p.join_wave(3, ""), 4);
        // Every wave open: the last one, told at once.
        assert_eq!(p.join_wave(4, ""), 4);
    }
}
