//! `update-server telemetry set|list|clear`: where agents export their own telemetry
//! (OTLP/HTTP), live fleet data kept in the fleet database (through the admin API of a
//! running server; every server of the fleet follows a change within seconds).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use clap::Subcommand;
use serde_json::Value;

use super::AdminClient;
use super::table::{date, text};

#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum Telemetry {
    /// Name where the agents a selector matches export their own metrics (and logs),
    /// with OTLP/HTTP (protobuf); setting a selector again replaces its destination.
    Set {
        /// The agents' label selector (as `agents list --selector`); "" for every agent.
        /// An agent follows the most specific selector it matches.
        #[arg(long, value_name = "S")]
        selector: String,
        /// The receiver's full metrics URL: http(s)://HOST:PORT/v1/metrics.
        #[arg(long, value_name = "URL")]
        metrics: String,
        /// The receiver's full logs URL, for the agents' own log lines too.
        #[arg(long, value_name = "URL")]
        logs: Option<String>,
        /// A header every export carries (authorization=Bearer …); repeat for more.
        #[arg(long = "header", value_name = "K=V", value_parser = header)]
        headers: Vec<(String, String)>,
    },
    /// The destinations, by selector (header names only: their values stay secret).
    List,
    /// Forget a selector's destination: its agents stop exporting there.
    Clear {
        /// The selector as it was set.
        #[arg(long, value_name = "S")]
        selector: String,
    },
}

fn header(text: &str) -> Result<(String, String), String> {
    agent_fleet::telemetry::parse_header(text)
}

impl Telemetry {
    pub(super) async fn run(&self, client: &AdminClient, json: bool) -> anyhow::Result<()> {
        let answer = client.telemetry(self).await?;
        super::print_answer(&answer, json, |a| match self {
            Telemetry::Set { .. } => format!(
                "agents matching {} export their own telemetry to {} from their next contact",
                shown_selector(text(a, "selector")),
                describe(a)
            ),
            Telemetry::List => render(a),
            Telemetry::Clear { .. } => format!(
                "agents matching {} no longer export to {}",
                shown_selector(text(a, "selector")),
                describe(a)
            ),
        })
    }
}

impl AdminClient {
    /// `/admin/telemetry`: the answer's JSON, or an error that says what the server said.
    pub async fn telemetry(&self, action: &Telemetry) -> anyhow::Result<Value> {
        let base = self.base()?;
        let http = self.http()?;
        let url = format!("{base}/admin/telemetry");
        let request = match action {
            Telemetry::Set {
                selector,
                metrics,
                logs,
                headers,
            } => {
                let headers: BTreeMap<&str, &str> = headers
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect();
                http.post(url).json(&serde_json::json!({
                    "selector": selector,
                    "metrics": metrics,
                    "logs": logs,
                    "headers": headers,
                }))
            }
            Telemetry::List => http.get(url),
            Telemetry::Clear { selector } => http.delete(url).query(&[("selector", selector)]),
        };
        self.send(base, request).await
    }
}

fn shown_selector(selector: &str) -> String {
    if selector.is_empty() {
        "any selector (every agent)".to_owned()
    } else {
        format!("{selector:?}")
    }
}

/// One destination in a line: `metrics URL, logs URL, headers a, b`.
fn describe(d: &Value) -> String {
    let mut line = format!("metrics {}", text(d, "metrics"));
    if let Some(logs) = d["logs"].as_str() {
        let _ = write!(line, ", logs {logs}");
    }
    let headers: Vec<&str> = d["headers"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if !headers.is_empty() {
        let _ = write!(line, ", headers {}", headers.join(", "));
    }
    line
}

fn render(answer: &Value) -> String {
    let rows = answer["destinations"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if rows.is_empty() {
        return "no telemetry destinations: agents export nothing (`update-server telemetry set --selector S --metrics URL`)".to_owned();
    }
    let mut out = String::new();
    for d in &rows {
        let _ = writeln!(
            out,
            "{}: {} (set {})",
            shown_selector(text(d, "selector")),
            describe(d),
            date(&d["updated_at"])
        );
    }
    out
}
