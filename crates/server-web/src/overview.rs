//! The overview's numbers: agents by version, update status, health, configuration
//! status, protocol and platform; the stale ones; the last failures. Pure: computed from the rows.

use std::collections::HashMap;
use std::time::Duration;

use super::model::{Agent, is_stale};

/// Failures listed on the overview; the rest are one filter away.
pub const LAST_FAILURES: usize = 20;

/// One count: the label and how many agents have it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Count {
    pub label: String,
    pub agents: usize,
}

/// What went wrong for one agent.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub id: String,
    pub name: String,
    /// `update` or `config`.
    pub kind: &'static str,
    pub status: String,
    pub reason: String,
    pub last_contact: i64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Overview {
    pub total: usize,
    pub stale: usize,
    pub by_version: Vec<Count>,
    pub by_status: Vec<Count>,
    pub by_health: Vec<Count>,
    pub by_config: Vec<Count>,
    pub by_protocol: Vec<Count>,
    /// By the platform (target triple) each agent said; `unknown` when it said none.
    pub by_platform: Vec<Count>,
    /// The most recently heard from first.
    pub failures: Vec<Failure>,
}

/// Most agents first; ties by label, so the page does not shuffle between loads.
fn counts<'a>(labels: impl Iterator<Item = &'a str>) -> Vec<Count> {
    let mut map: HashMap<&str, usize> = HashMap::new();
    for label in labels {
        *map.entry(label).or_default() += 1;
    }
    let mut out: Vec<Count> = map
        .into_iter()
        .map(|(label, agents)| Count {
            label: label.to_owned(),
            agents,
        })
        .collect();
    out.sort_by(|a, b| b.agents.cmp(&a.agents).then_with(|| a.label.cmp(&b.label)));
    out
}

pub fn overview(agents: &[Agent], heartbeat: Duration, now: i64) -> Overview {
    let mut failures: Vec<Failure> = Vec::new();
    for a in agents {
        if matches!(a.update_label(), "INSTALL_FAILED" | "TIMED_OUT") {
            failures.push(Failure {
                id: a.id.clone(),
                name: a.name.clone(),
                kind: "update",
                status: a.update_label().to_owned(),
                reason: a.update_error.clone().unwrap_or_default(),
                last_contact: a.last_contact,
            });
        }
        if a.config_label() == "FAILED" {
            failures.push(Failure {
                id: a.id.clone(),
                name: a.name.clone(),
                kind: "config",
                status: "FAILED".to_owned(),
                reason: a.config_error.clone().unwrap_or_default(),
                last_contact: a.last_contact,
            });
        }
    }
    failures.sort_by(|a, b| {
        b.last_contact
            .cmp(&a.last_contact)
            .then_with(|| a.id.cmp(&b.id))
    });
    failures.truncate(LAST_FAILURES);
    Overview {
        total: agents.len(),
        stale: agents
            .iter()
            .filter(|a| is_stale(a.last_contact, heartbeat, now))
            .count(),
        by_version: counts(agents.iter().map(|a| a.version.as_str())),
        by_status: counts(agents.iter().map(Agent::update_label)),
        by_health: counts(agents.iter().map(Agent::health_label)),
        by_config: counts(agents.iter().map(Agent::config_label)),
        by_protocol: counts(agents.iter().map(Agent::protocol_label)),
        by_platform: counts(agents.iter().map(Agent::platform_label)),
        failures,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HB: Duration = Duration::from_secs(30);
    const NOW: i64 = 10_000;

    fn agent(id: &str, version: &str, status: Option<&str>, last_contact: i64) -> Agent {
        Agent {
            id: id.into(),
            name: format!("host-{id}"),
            version: version.into(),
            update_status: status.map(Into::into),
            last_contact,
            ..Agent::default()
        }
    }

    #[test]
    fn an_empty_fleet_counts_nothing() {
        let o = overview(&[], HB, NOW);
        assert_eq!((o.total, o.stale), (0, 0));
        assert!(o.by_version.is_empty() && o.failures.is_empty());
    }

    #[test]
    fn counts_by_each_label_most_first() {
        let mut fleet = vec![
            agent("a", "1.0.0", Some("INSTALLED"), NOW),
            agent("b", "2.0.0", Some("INSTALLED"), NOW),
            agent("c", "2.0.0", None, NOW - 100),
            agent("d", "2.0.0", Some("INSTALL_FAILED"), NOW - 1000),
        ];
        fleet[0].protocol = "opamp".into();
        fleet[0].health = Some("healthy".into());
        fleet[1].config_status = Some("APPLIED".into());
        fleet[1].platform = "x86_64-unknown-linux-musl".into();
        fleet[2].platform = "x86_64-unknown-linux-gnu".into();
        fleet[3].platform = "x86_64-unknown-linux-gnu".into();
        let o = overview(&fleet, HB, NOW);
        assert_eq!(o.total, 4);
        assert_eq!(o.stale, 2);
        let pairs = |c: &[Count]| {
            c.iter()
                .map(|c| (c.label.clone(), c.agents))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            pairs(&o.by_version),
            [("2.0.0".to_owned(), 3), ("1.0.0".to_owned(), 1)]
        );
        assert_eq!(
            pairs(&o.by_status),
            [
                ("INSTALLED".to_owned(), 2),
                ("INSTALL_FAILED".to_owned(), 1),
                ("NONE".to_owned(), 1)
            ]
        );
        assert_eq!(
            pairs(&o.by_protocol),
            [("native".to_owned(), 3), ("opamp".to_owned(), 1)]
        );
        assert_eq!(
            pairs(&o.by_platform),
            [
                ("x86_64-unknown-linux-gnu".to_owned(), 2),
                ("unknown".to_owned(), 1),
                ("x86_64-unknown-linux-musl".to_owned(), 1)
            ]
        );
        assert_eq!(
            pairs(&o.by_health),
            [("unknown".to_owned(), 3), ("healthy".to_owned(), 1)]
        );
        assert_eq!(
            pairs(&o.by_config),
            [("NONE".to_owned(), 3), ("APPLIED".to_owned(), 1)]
        );
    }

    #[test]
    fn failures_latest_first_with_their_reasons_both_kinds() {
        let mut fleet = vec![
            agent("old", "1", Some("TIMED_OUT"), NOW - 500),
            agent("new", "1", Some("INSTALL_FAILED"), NOW - 5),
            agent("fine", "1", Some("INSTALLED"), NOW),
        ];
        fleet[1].update_error = Some("disk full".into());
        fleet[2].config_status = Some("FAILED".into());
        fleet[2].config_error = Some("check-command said no".into());
        let o = overview(&fleet, HB, NOW);
        let got: Vec<(&str, &str, &str)> = o
            .failures
            .iter()
            .map(|f| (f.id.as_str(), f.kind, f.reason.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("fine", "config", "check-command said no"),
                ("new", "update", "disk full"),
                ("old", "update", "")
            ]
        );
    }

    #[test]
    fn only_the_last_failures_are_listed() {
        let fleet: Vec<Agent> = (0..100)
            .map(|i| agent(&format!("{i:03}"), "1", Some("INSTALL_FAILED"), i))
            .collect();
        let o = overview(&fleet, HB, NOW);
        assert_eq!(o.failures.len(), LAST_FAILURES);
        assert_eq!(o.failures[0].id, "099");
    }
}
