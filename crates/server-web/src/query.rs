//! `/agents?q=&version=&status=&health=&config=&group=&protocol=&platform=&selector=&stale=1&page=N`: the
//! parsed query, which agents it matches, the page of them to show, and the links to
//! the other pages. Pure: rows in, rows out.

use std::collections::HashMap;
use std::time::Duration;

use agent_protocol::selector::Selector;

use super::model::{Agent, is_stale};

/// Agents on one page of the list.
pub const PAGE_SIZE: usize = 50;

/// A search longer than this is cut: nothing an agent is called is longer.
const MAX_FIELD: usize = 256;

/// The list's filters. Empty fields match everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentQuery {
    /// Matches id and name, ignoring case.
    pub q: String,
    pub version: String,
    /// The update status, or `NONE` for agents that never reported.
    pub status: String,
    pub health: String,
    /// The configuration status, or `NONE`.
    pub config: String,
    pub group: String,
    pub protocol: String,
    /// The platform (target triple) the agent said.
    pub platform: String,
    /// A label selector, as written (`env=prod,region in (eu)`).
    pub selector: String,
    /// `selector`, read (the empty selector when it does not parse).
    pub parsed: Selector,
    /// Why `selector` does not parse (`column 9: …`); empty when it does.
    pub selector_error: String,
    pub stale: bool,
    /// 1-based.
    pub page: usize,
}

impl AgentQuery {
    /// From the query string's pairs. Unknown keys and a page that is not a positive
    /// number are ignored (a bookmark from an older page still opens).
    pub fn from_pairs(pairs: &HashMap<String, String>) -> Self {
        let field = |k: &str| {
            let v = pairs.get(k).map_or("", |v| v.trim());
            let end = v
                .char_indices()
                .nth(MAX_FIELD)
                .map_or(v.len(), |(at, _)| at);
            v[..end].to_owned()
        };
        let selector = field("selector");
        let parsed = Selector::parse(&selector);
        Self {
            q: field("q"),
            version: field("version"),
            status: field("status"),
            health: field("health"),
            config: field("config"),
            group: field("group"),
            protocol: field("protocol"),
            platform: field("platform"),
            selector: selector.clone(),
            parsed: parsed.as_ref().ok().cloned().unwrap_or_default(),
            selector_error: parsed.err().map(|e| e.to_string()).unwrap_or_default(),
            stale: matches!(field("stale").as_str(), "1" | "true" | "on" | "yes"),
            page: field("page").parse().ok().filter(|p| *p >= 1).unwrap_or(1),
        }
    }

    /// Whether `agent` passes every filter.
    pub fn matches(&self, agent: &Agent, heartbeat: Duration, now: i64) -> bool {
        let exact = |want: &str, have: &str| want.is_empty() || want == have;
        exact(&self.version, &agent.version)
            && exact(&self.status, agent.update_label())
            && exact(&self.health, agent.health_label())
            && exact(&self.config, agent.config_label())
            && exact(&self.group, &agent.group)
            && exact(&self.protocol, agent.protocol_label())
            && exact(&self.platform, agent.platform_label())
            // A selector that does not parse matches nothing (the page says why).
            && self.selector_error.is_empty()
            && self.parsed.matches(&agent.labels)
            && (!self.stale || is_stale(agent.last_contact, heartbeat, now))
            && (self.q.is_empty()
                || contains_ignoring_case(&agent.id, &self.q)
                || contains_ignoring_case(&agent.name, &self.q))
    }

    /// Any filter set (the page says "of N matching" then).
    pub fn filtered(&self) -> bool {
        *self
            != Self {
                page: self.page,
                ..Self::default()
            }
    }

    /// The query string of this search on page `page`, percent-encoded, without the
    /// `?`; empty fields are left out.
    pub fn to_query(&self, page: usize) -> String {
        let mut parts = Vec::new();
        for (k, v) in [
            ("q", &self.q),
            ("version", &self.version),
            ("status", &self.status),
            ("health", &self.health),
            ("config", &self.config),
            ("group", &self.group),
            ("protocol", &self.protocol),
            ("platform", &self.platform),
            ("selector", &self.selector),
        ] {
            if !v.is_empty() {
                parts.push(format!("{k}={}", encode(v)));
            }
        }
        if self.stale {
            parts.push("stale=1".to_owned());
        }
        if page > 1 {
            parts.push(format!("page={page}"));
        }
        parts.join("&")
    }
}

fn contains_ignoring_case(haystack: &str, needle: &str) -> bool {
    haystack.to_lowercase().contains(&needle.to_lowercase())
}

/// Percent-encodes everything but the unreserved characters (RFC 3986).
pub fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// One page of the matching agents.
#[derive(Debug)]
pub struct Page<'a> {
    pub rows: Vec<&'a Agent>,
    /// 1-based, clamped to the last page.
    pub page: usize,
    pub pages: usize,
    pub matching: usize,
}

/// The agents `query` matches, page `query.page` of them, in the order given.
pub fn page<'a>(
    agents: &'a [Agent],
    query: &AgentQuery,
    heartbeat: Duration,
    now: i64,
) -> Page<'a> {
    let matching: Vec<&Agent> = agents
        .iter()
        .filter(|a| query.matches(a, heartbeat, now))
        .collect();
    let pages = matching.len().div_ceil(PAGE_SIZE).max(1);
    let page = query.page.min(pages);
    let rows = matching
        .iter()
        .skip((page - 1) * PAGE_SIZE)
        .take(PAGE_SIZE)
        .copied()
        .collect();
    Page {
        rows,
        page,
        pages,
        matching: matching.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HB: Duration = Duration::from_secs(30);
    const NOW: i64 = 1_000_000;

    fn pairs(list: &[(&str, &str)]) -> HashMap<String, String> {
        list.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn agent(id: &str, name: &str, version: &str) -> Agent {
        Agent {
            id: id.into(),
            name: name.into(),
            version: version.into(),
            last_contact: NOW,
            ..Agent::default()
        }
    }

    #[test]
    fn an_empty_query_is_page_one_of_everything() {
        let q = AgentQuery::from_pairs(&HashMap::new());
        assert_eq!(q.page, 1);
        assert!(!q.filtered());
        assert!(q.matches(&agent("a", "b", "1.0.0"), HB, NOW));
        assert_eq!(q.to_query(1), "");
    }

    #[test]
    fn nonsense_pages_are_page_one() {
        for p in ["0", "-3", "x", "", "99999999999999999999999"] {
            assert_eq!(
                AgentQuery::from_pairs(&pairs(&[("page", p)])).page,
                1,
                "{p}"
            );
        }
        assert_eq!(AgentQuery::from_pairs(&pairs(&[("page", "7")])).page, 7);
    }

    #[test]
    fn q_matches_id_and_name_ignoring_case() {
        let q = AgentQuery::from_pairs(&pairs(&[("q", "WeB")]));
        assert!(q.matches(&agent("1", "web-01", "1"), HB, NOW));
        assert!(q.matches(&agent("web-id", "db", "1"), HB, NOW));
        assert!(!q.matches(&agent("1", "db-01", "1"), HB, NOW));
        assert!(q.filtered());
    }

    #[test]
    fn each_filter_is_exact_and_they_combine() {
        let mut a = agent("1", "n", "2.0.0");
        a.update_status = Some("INSTALL_FAILED".into());
        a.group = "canary".into();
        a.protocol = "opamp".into();
        a.health = Some("unhealthy".into());
        a.config_status = Some("APPLIED".into());
        let all = pairs(&[
            ("version", "2.0.0"),
            ("status", "INSTALL_FAILED"),
            ("group", "canary"),
            ("protocol", "opamp"),
            ("health", "unhealthy"),
            ("config", "APPLIED"),
        ]);
        assert!(AgentQuery::from_pairs(&all).matches(&a, HB, NOW));
        for (k, v) in [
            ("version", "2.0"),
            ("status", "INSTALLED"),
            ("group", "can"),
            ("protocol", "native"),
            ("health", "healthy"),
            ("config", "FAILED"),
        ] {
            let mut one = all.clone();
            one.insert(k.into(), v.into());
            assert!(
                !AgentQuery::from_pairs(&one).matches(&a, HB, NOW),
                "{k}={v}"
            );
        }
    }

    #[test]
    fn a_selector_filters_by_labels_and_a_bad_one_matches_nothing_and_says_where() {
        let mut prod = agent("1", "n", "1");
        prod.labels = [("env", "prod"), ("region", "eu")]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .into();
        let dev = agent("2", "n", "1");
        let q = AgentQuery::from_pairs(&pairs(&[("selector", "env=prod, region in (eu)")]));
        assert!(q.selector_error.is_empty());
        assert!(q.filtered());
        assert!(q.matches(&prod, HB, NOW));
        assert!(!q.matches(&dev, HB, NOW));
        assert_eq!(
            q.to_query(1),
            "selector=env%3Dprod%2C%20region%20in%20%28eu%29"
        );
        let q = AgentQuery::from_pairs(&pairs(&[("selector", "!env")]));
        assert!(q.matches(&dev, HB, NOW) && !q.matches(&prod, HB, NOW));
        let bad = AgentQuery::from_pairs(&pairs(&[("selector", "env in (")]));
        assert!(
            bad.selector_error.starts_with("column 9:"),
            "{}",
            bad.selector_error
        );
        assert!(!bad.matches(&prod, HB, NOW) && !bad.matches(&dev, HB, NOW));
    }

    #[test]
    fn none_finds_agents_that_never_reported_and_native_is_the_default_protocol() {
        let a = agent("1", "n", "1");
        let q = AgentQuery::from_pairs(&pairs(&[("status", "NONE"), ("protocol", "native")]));
        assert!(q.matches(&a, HB, NOW));
    }

    #[test]
    fn stale_keeps_only_the_silent() {
        let q = AgentQuery::from_pairs(&pairs(&[("stale", "1")]));
        let mut a = agent("1", "n", "1");
        assert!(!q.matches(&a, HB, NOW));
        a.last_contact = NOW - 91;
        assert!(q.matches(&a, HB, NOW));
    }

    #[test]
    fn pages_of_fifty_clamped_to_the_last() {
        let agents: Vec<Agent> = (0..120)
            .map(|i| agent(&format!("{i:03}"), "n", "1"))
            .collect();
        let mut q = AgentQuery {
            page: 1,
            ..AgentQuery::default()
        };
        let p = page(&agents, &q, HB, NOW);
        assert_eq!((p.page, p.pages, p.matching, p.rows.len()), (1, 3, 120, 50));
        assert_eq!(p.rows[0].id, "000");
        q.page = 3;
        let p = page(&agents, &q, HB, NOW);
        assert_eq!(p.rows.len(), 20);
        assert_eq!(p.rows[0].id, "100");
        q.page = 40;
        assert_eq!(page(&agents, &q, HB, NOW).page, 3);
        let none = page(&[], &q, HB, NOW);
        assert_eq!((none.page, none.pages, none.rows.len()), (1, 1, 0));
    }

    #[test]
    fn links_keep_the_filters_and_encode_them() {
        let q = AgentQuery::from_pairs(&pairs(&[
            ("q", "a b&c=<d>"),
            ("version", "1.0.0+5"),
            ("stale", "1"),
            ("page", "2"),
        ]));
        assert_eq!(
            q.to_query(3),
            "q=a%20b%26c%3D%3Cd%3E&version=1.0.0%2B5&stale=1&page=3"
        );
        assert_eq!(
            q.to_query(1),
            "q=a%20b%26c%3D%3Cd%3E&version=1.0.0%2B5&stale=1"
        );
    }

    #[test]
    fn a_long_search_is_cut_on_a_character_boundary() {
        let long = "é".repeat(1000);
        let q = AgentQuery::from_pairs(&pairs(&[("q", &long)]));
        assert_eq!(q.q.chars().count(), MAX_FIELD);
    }
}
