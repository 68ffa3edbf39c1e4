//! Where agents export their own telemetry (docs/commands.md, "Own telemetry"): the
//! OpAMP seed's `own_metrics` and `own_logs`, for native and OpAMP agents alike.
//!
//! An operator names a destination for a label selector (`update-server telemetry set
//! --selector S --metrics URL [--logs URL] [--header K=V]…`); it is a row of
//! `telemetry_destinations`, live fleet data that every server reads with the settings.
//! An agent exports to the destination of the most specific selector its labels match
//! ([`choose`]): the one with the most requirements, then the one set last. The edges
//! translate the answer: a native agent reads it as `"telemetry"` in its connect answer,
//! an OpAMP agent as `ConnectionSettingsOffers.own_metrics` / `own_logs`. Both are sent
//! only when the destination's hash ([`TelemetryOffer::hash`]) differs from what the agent
//! has. Which destination an agent gets is decided here, without a database.

use std::collections::BTreeMap;

use agent_protocol::selector::Selector;
use agent_protocol::wire::TelemetryOffer;
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::db::Db;
use crate::error::FleetError;
use crate::labels::Labels;

/// Headers one destination may carry.
pub const MAX_HEADERS: usize = 16;
/// Longest URL or header value taken.
const MAX_URL: usize = 2048;
const MAX_HEADER_VALUE: usize = 4096;

/// One destination, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    /// The label selector as the operator wrote it (trimmed); empty: every agent.
    pub selector: String,
    /// The full OTLP/HTTP metrics URL (`http://collector:4318/v1/metrics`).
    pub metrics: String,
    /// The full OTLP/HTTP logs URL, if the agents' log lines are wanted too.
    pub logs: Option<String>,
    /// Header names (lower case) to values, sent with every export.
    pub headers: BTreeMap<String, String>,
    /// Unix seconds.
    pub created_at: i64,
    pub updated_at: i64,
}

impl Destination {
    /// What an agent is told of it.
    pub fn offer(&self) -> TelemetryOffer {
        TelemetryOffer::new(
            self.metrics.clone(),
            self.logs.clone(),
            self.headers.clone(),
        )
    }

    /// As `GET /admin/telemetry` lists it: header names only, since their values are
    /// often credentials (an `Authorization`) and a viewer may read the list.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "selector": self.selector,
            "metrics": self.metrics,
            "logs": self.logs,
            "headers": self.headers.keys().collect::<Vec<_>>(),
            "hash": self.offer().hash,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        })
    }
}

/// The destinations with their selectors parsed, as a server last read them.
#[derive(Debug, Clone, Default)]
pub struct Table {
    entries: Vec<(Selector, Destination)>,
}

impl Table {
    /// The table of `all`; a row whose selector no longer parses (it was checked when
    /// set) is left out and said.
    pub fn new(all: Vec<Destination>) -> Self {
        let entries = all
            .into_iter()
            .filter_map(|d| match Selector::parse(&d.selector) {
                Ok(s) => Some((s, d)),
                Err(e) => {
                    tracing::warn!(
                        "telemetry destination for selector {:?} is ignored: {e}",
                        d.selector
                    );
                    None
                }
            })
            .collect();
        Self { entries }
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn destinations(&self) -> impl Iterator<Item = &Destination> {
        self.entries.iter().map(|(_, d)| d)
    }

    /// What an agent with `labels` is told: its destination, or off.
    pub fn for_labels(&self, labels: &Labels) -> TelemetryOffer {
        choose(&self.entries, labels).map_or_else(TelemetryOffer::off, Destination::offer)
    }

    /// Whether `other` holds the same destinations (what the settings poll compares).
    pub fn same_as(&self, other: &Table) -> bool {
        self.entries.len() == other.entries.len()
            && self
                .entries
                .iter()
                .zip(&other.entries)
                .all(|((_, a), (_, b))| a == b)
    }
}

/// The destination of an agent with `labels`: of those whose selector matches, the one
/// with the most requirements (`env=prod,region=eu` over `env=prod` over the empty
/// selector), then the one set last, then the first selector by text (so every server
/// of the fleet chooses the same).
pub fn choose<'a>(
    entries: &'a [(Selector, Destination)],
    labels: &Labels,
) -> Option<&'a Destination> {
    entries
        .iter()
        .filter(|(s, _)| s.matches(labels))
        .max_by(|(sa, a), (sb, b)| {
            sa.requirements()
                .len()
                .cmp(&sb.requirements().len())
                .then(a.updated_at.cmp(&b.updated_at))
                .then(b.selector.cmp(&a.selector))
        })
        .map(|(_, d)| d)
}

/// What `telemetry set` asks for, before it is checked and stored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NewDestination {
    pub selector: String,
    pub metrics: String,
    pub logs: Option<String>,
    pub headers: BTreeMap<String, String>,
}

impl NewDestination {
    /// Checked, with the selector trimmed and header names in lower case (HTTP's are not
    /// case-sensitive; two spellings of one name are one header).
    pub fn checked(self) -> Result<Self, FleetError> {
        let invalid = FleetError::Invalid;
        let selector = self.selector.trim().to_owned();
        Selector::parse(&selector).map_err(|e| {
            invalid(format!(
                "selector {selector:?} does not parse ({e}); write it as `agents list --selector` takes it (env=prod,region in (eu))"
            ))
        })?;
        check_url("--metrics", &self.metrics).map_err(invalid)?;
        if let Some(logs) = &self.logs {
            check_url("--logs", logs).map_err(invalid)?;
        }
        if self.headers.len() > MAX_HEADERS {
            return Err(invalid(format!(
                "{} headers given; a destination carries at most {MAX_HEADERS}",
                self.headers.len()
            )));
        }
        let mut headers = BTreeMap::new();
        for (name, value) in self.headers {
            check_header(&name, &value).map_err(invalid)?;
            if headers.insert(name.to_ascii_lowercase(), value).is_some() {
                return Err(invalid(format!(
                    "header {name:?} is given twice (header names are not case-sensitive); give it once"
                )));
            }
        }
        Ok(Self {
            selector,
            metrics: self.metrics,
            logs: self.logs,
            headers,
        })
    }
}

/// An OTLP/HTTP URL agents can send to: `http://` or `https://`, a host, no spaces.
fn check_url(what: &str, url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"));
    let host = rest.and_then(|r| r.split('/').next()).unwrap_or_default();
    if host.is_empty()
        || url.len() > MAX_URL
        || url.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "{what} {url:?} is not an OTLP/HTTP URL agents can send to; write the receiver's full URL, http(s)://HOST:PORT/v1/metrics (or /v1/logs)"
        ));
    }
    Ok(())
}

/// A header name is an HTTP token; its value printable text without line breaks.
fn check_header(name: &str, value: &str) -> Result<(), String> {
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if name.is_empty() || name.len() > 64 || !name.chars().all(token) {
        return Err(format!(
            "header name {name:?} is not an HTTP header name (letters, digits and -, at most 64)"
        ));
    }
    if value.len() > MAX_HEADER_VALUE || value.chars().any(|c| c.is_control() && c != '\t') {
        return Err(format!(
            "the value of header {name} has a line break or control character, or is longer than {MAX_HEADER_VALUE} bytes"
        ));
    }
    Ok(())
}

/// `K=V` of `--header` (the value may hold `=`).
pub fn parse_header(text: &str) -> Result<(String, String), String> {
    let (k, v) = text
        .split_once('=')
        .ok_or_else(|| format!("--header {text:?} is not NAME=VALUE (authorization=Bearer …)"))?;
    let (k, v) = (k.trim(), v.trim());
    check_header(k, v)?;
    Ok((k.to_owned(), v.to_owned()))
}

const COLUMNS: &str =
    "SELECT selector, metrics, logs, headers, created_at, updated_at FROM telemetry_destinations";

fn row(r: &AnyRow) -> Destination {
    let headers: String = r.get(3);
    Destination {
        selector: r.get(0),
        metrics: r.get(1),
        logs: r.get(2),
        headers: serde_json::from_str(&headers).unwrap_or_default(),
        created_at: r.get(4),
        updated_at: r.get(5),
    }
}

impl Db {
    /// Every destination, by selector.
    pub async fn telemetry_destinations(&self) -> Result<Vec<Destination>, FleetError> {
        let rows = sqlx::query(&format!("{COLUMNS} ORDER BY selector"))
            .fetch_all(self.pool())
            .await?;
        Ok(rows.iter().map(row).collect())
    }

    /// Stores `new` (checked) for its selector, replacing the destination it had.
    pub async fn set_telemetry(
        &self,
        new: &NewDestination,
        at: i64,
    ) -> Result<Destination, FleetError> {
        let headers = serde_json::to_string(&new.headers).unwrap_or_else(|_| "{}".to_owned());
        sqlx::query(
            "INSERT INTO telemetry_destinations (selector, metrics, logs, headers, created_at, updated_at)
             VALUES ($1, $2, $3, $4, $5, $5)
             ON CONFLICT (selector) DO UPDATE SET metrics = excluded.metrics, logs = excluded.logs,
               headers = excluded.headers, updated_at = excluded.updated_at",
        )
        .bind(&new.selector)
        .bind(&new.metrics)
        .bind(new.logs.as_deref())
        .bind(&headers)
        .bind(at)
        .execute(self.pool())
        .await?;
        let stored = sqlx::query(&format!("{COLUMNS} WHERE selector = $1"))
            .bind(&new.selector)
            .fetch_one(self.pool())
            .await?;
        Ok(row(&stored))
    }

    /// Forgets the destination of `selector` (trimmed); `None` if it had none.
    pub async fn clear_telemetry(&self, selector: &str) -> Result<Option<Destination>, FleetError> {
        let selector = selector.trim();
        let had = sqlx::query(&format!("{COLUMNS} WHERE selector = $1"))
            .bind(selector)
            .fetch_optional(self.pool())
            .await?;
        let Some(had) = had else {
            return Ok(None);
        };
        sqlx::query("DELETE FROM telemetry_destinations WHERE selector = $1")
            .bind(selector)
            .execute(self.pool())
            .await?;
        Ok(Some(row(&had)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dest(selector: &str, metrics: &str, at: i64) -> Destination {
        Destination {
            selector: selector.into(),
            metrics: metrics.into(),
            logs: None,
            headers: BTreeMap::new(),
            created_at: at,
            updated_at: at,
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn the_most_specific_matching_selector_wins_then_the_one_set_last() {
        let table = Table::new(vec![
            dest("", "http://all/v1/metrics", 30),
            dest("env=prod", "http://prod/v1/metrics", 10),
            dest("env=prod,region=eu", "http://prod-eu/v1/metrics", 5),
            dest("tier=web", "http://web/v1/metrics", 20),
        ]);
        let of = |pairs: &[(&str, &str)]| table.for_labels(&labels(pairs)).metrics;
        assert_eq!(of(&[("env", "dev")]), "http://all/v1/metrics");
        assert_eq!(of(&[("env", "prod")]), "http://prod/v1/metrics");
        assert_eq!(
            of(&[("env", "prod"), ("region", "eu")]),
            "http://prod-eu/v1/metrics",
            "two requirements beat one, though set earlier"
        );
        assert_eq!(
            of(&[("env", "prod"), ("tier", "web")]),
            "http://web/v1/metrics",
            "of two as specific, the one set last"
        );
        let none = Table::new(vec![dest("env=prod", "http://prod/v1/metrics", 1)]);
        assert!(none.for_labels(&labels(&[("env", "dev")])).is_off());
        assert!(Table::default().for_labels(&Labels::new()).is_off());
    }

    #[test]
    fn an_unparsable_stored_selector_is_left_out_and_tables_compare_by_content() {
        let table = Table::new(vec![dest("env in (", "http://x/v1/metrics", 1)]);
        assert!(table.is_empty());
        let a = Table::new(vec![dest("", "http://a/v1/metrics", 1)]);
        let b = Table::new(vec![dest("", "http://a/v1/metrics", 1)]);
        let c = Table::new(vec![dest("", "http://a/v1/metrics", 2)]);
        assert!(a.same_as(&b) && !a.same_as(&c) && !a.same_as(&Table::default()));
    }

    #[test]
    fn a_destination_is_checked_and_its_header_names_folded() {
        let ok = NewDestination {
            selector: " env=prod ".into(),
            metrics: "http://c:4318/v1/metrics".into(),
            logs: Some("https://c/v1/logs".into()),
            headers: BTreeMap::from([("Authorization".into(), "Bearer t".into())]),
        }
        .checked()
        .unwrap();
        assert_eq!(ok.selector, "env=prod");
        assert_eq!(ok.headers["authorization"], "Bearer t");
        let bad = |d: NewDestination| d.checked().unwrap_err().to_string();
        let base = NewDestination {
            metrics: "http://c/v1/metrics".into(),
            ..Default::default()
        };
        assert!(
            bad(NewDestination {
                selector: "env in (".into(),
                ..base.clone()
            })
            .contains("selector")
        );
        assert!(
            bad(NewDestination {
                metrics: "c:4318".into(),
                ..base.clone()
            })
            .contains("--metrics")
        );
        assert!(
            bad(NewDestination {
                logs: Some("ftp://x".into()),
                ..base.clone()
            })
            .contains("--logs")
        );
        let twice = BTreeMap::from([("A".into(), "1".into()), ("a".into(), "2".into())]);
        assert!(
            bad(NewDestination {
                headers: twice,
                ..base.clone()
            })
            .contains("twice")
        );
        let broken = BTreeMap::from([("x".into(), "a\nb".into())]);
        assert!(
            bad(NewDestination {
                headers: broken,
                ..base
            })
            .contains("line break")
        );
        assert_eq!(
            parse_header("authorization=Bearer a=b").unwrap(),
            ("authorization".into(), "Bearer a=b".into())
        );
        assert!(parse_header("novalue").is_err());
        assert!(parse_header("bad name=x").is_err());
    }

    #[tokio::test]
    async fn a_destination_is_set_replaced_and_cleared_by_its_selector() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open("", dir.path(), 1).await.unwrap();
        let new = NewDestination {
            selector: "env=prod".into(),
            metrics: "http://a/v1/metrics".into(),
            logs: None,
            headers: BTreeMap::from([("x-tenant".into(), "t1".into())]),
        };
        let first = db.set_telemetry(&new, 10).await.unwrap();
        assert_eq!(first.headers["x-tenant"], "t1");
        let again = NewDestination {
            metrics: "http://b/v1/metrics".into(),
            ..new.clone()
        };
        let second = db.set_telemetry(&again, 20).await.unwrap();
        assert_eq!((second.created_at, second.updated_at), (10, 20));
        assert_eq!(
            db.telemetry_destinations().await.unwrap(),
            std::slice::from_ref(&second)
        );
        assert_ne!(first.offer().hash, second.offer().hash);
        assert!(db.clear_telemetry("nope").await.unwrap().is_none());
        assert_eq!(db.clear_telemetry(" env=prod").await.unwrap(), Some(second));
        assert!(db.telemetry_destinations().await.unwrap().is_empty());
    }
}
