//! `update-server webhook add|list|remove|test|deliveries`: where the fleet's events
//! are POSTed, signed (an admin's; through the admin API).

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;
use serde_json::Value;

use super::AdminClient;
use super::table::millis_utc;

#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum Webhook {
    /// POST these events to URL, signed with the secret in FILE (`X-Signature-256:
    /// sha256=<HMAC-SHA256 of the body>`); each carries its id in `X-Event-Id`.
    Add {
        url: String,
        /// Comma-separated: rollout.halted, rollout.completed, agent.failed,
        /// release.published, approval.requested, deployment.changed.
        #[arg(long, value_delimiter = ',', required = true)]
        events: Vec<String>,
        /// A file holding the secret (16 bytes at least; `openssl rand -hex 32`).
        #[arg(long, value_name = "FILE")]
        secret_file: PathBuf,
    },
    /// Webhooks, their events and how many are waiting, delivered, given up.
    List,
    /// Stop sending to one; its waiting events are dropped.
    Remove { id: i64 },
    /// Send it a `webhook.test` event now.
    Test { id: i64 },
    /// Its latest delivery attempts, newest first.
    Deliveries {
        id: i64,
        #[arg(long, default_value_t = 50)]
        limit: i64,
    },
}

impl Webhook {
    pub(super) async fn run(&self, client: &AdminClient, json: bool) -> anyhow::Result<()> {
        let answer = client.webhooks(self).await?;
        super::print_answer(&answer, json, |a| match self {
            Webhook::Add { .. } => format!(
                "added webhook {} for {}",
                a["id"],
                a["events"]
                    .as_array()
                    .map(|e| e
                        .iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join(", "))
                    .unwrap_or_default()
            ),
            Webhook::List => render_webhooks(a),
            Webhook::Remove { id } => format!("removed webhook {id}"),
            Webhook::Test { id } => format!(
                "queued a webhook.test event ({}) for webhook {id}; `update-server webhook deliveries {id}` shows how it went",
                a["event_id"].as_str().unwrap_or("?")
            ),
            Webhook::Deliveries { .. } => render_deliveries(a),
        })
    }
}

impl AdminClient {
    /// `/admin/webhooks...`: the answer's JSON, or an error that says what the server said.
    pub async fn webhooks(&self, action: &Webhook) -> anyhow::Result<Value> {
        let base = self.base()?;
        let http = self.http()?;
        let request = match action {
            Webhook::Add {
                url,
                events,
                secret_file,
            } => {
                let secret = std::fs::read_to_string(secret_file)
                    .with_context(|| format!("--secret-file {}", secret_file.display()))?;
                http.post(format!("{base}/admin/webhooks"))
                    .json(&serde_json::json!({
                        "url": url,
                        "events": events,
                        "secret": secret.trim_end_matches(['\r', '\n']),
                    }))
            }
            Webhook::List => http.get(format!("{base}/admin/webhooks")),
            Webhook::Remove { id } => http.delete(format!("{base}/admin/webhooks/{id}")),
            Webhook::Test { id } => http.post(format!("{base}/admin/webhooks/{id}/test")),
            Webhook::Deliveries { id, limit } => http
                .get(format!("{base}/admin/webhooks/{id}/deliveries"))
                .query(&[("limit", limit)]),
        };
        self.send(base, request).await
    }
}

/// `GET /admin/webhooks` as a person reads it.
pub fn render_webhooks(list: &Value) -> String {
    let rows = list.as_array().map(Vec::as_slice).unwrap_or_default();
    if rows.is_empty() {
        return "no webhooks (`update-server webhook add URL --events … --secret-file F`)\n"
            .to_owned();
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<4} {:<40} {:>8} {:>9} {:>6}  events",
        "id", "url", "waiting", "delivered", "failed"
    );
    for w in rows {
        let events = w["events"]
            .as_array()
            .map(|e| {
                e.iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "{:<4} {:<40} {:>8} {:>9} {:>6}  {events}",
            w["id"],
            w["url"].as_str().unwrap_or("?"),
            w["pending"],
            w["delivered"],
            w["failed"],
        );
    }
    out
}

/// `GET /admin/webhooks/{id}/deliveries` as a person reads it.
pub fn render_deliveries(answer: &Value) -> String {
    let mut out = String::new();
    let rows = answer["attempts"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    if rows.is_empty() {
        return "no delivery attempts yet\n".to_owned();
    }
    for a in rows {
        let status = match a["status"].as_i64() {
            Some(0) | None => "-".to_owned(),
            Some(s) => s.to_string(),
        };
        let _ = writeln!(
            out,
            "{}  {:<20} {} try {:<3} {:>4} {:>6} ms  {:<16} {}",
            millis_utc(&a["at"]),
            a["event"].as_str().unwrap_or("?"),
            a["event_id"].as_str().unwrap_or("?"),
            a["attempt"],
            status,
            a["millis"],
            a["server"].as_str().unwrap_or(""),
            a["error"].as_str().unwrap_or(""),
        );
    }
    out
}
