//! `update-server audit`: the audit log, newest first.

use std::fmt::Write as _;

use anyhow::Context;
use clap::{Args, Subcommand};
use futures_util::StreamExt;
use serde_json::Value;
use std::io::Write as _;

use super::AdminClient;
use super::table::millis_utc;

#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct AuditQuery {
    /// Only entries by this token name (or server:NAME).
    #[arg(long)]
    who: Option<String>,
    /// Only these actions (`rollout` matches rollout.halt, rollout.resume, …).
    #[arg(long)]
    action: Option<String>,
    /// Only entries done to this: an agent's id, a group, a deployment, a release, a
    /// token's name.
    #[arg(long)]
    target: Option<String>,
    #[arg(long, default_value_t = 1)]
    page: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum AuditCommand {
    /// Write the audit log's entries from --since to --until to stdout, oldest first,
    /// as the server streams them.
    Export {
        /// From this time: 2025-03-01T12:00:00Z, 2025-03-01 (midnight UTC), or an age
        /// such as 30d. Default: the oldest entry kept.
        #[arg(long, value_name = "T")]
        since: Option<String>,
        /// Up to (not including) this time, written the same ways. Default: now.
        #[arg(long, value_name = "T")]
        until: Option<String>,
        #[arg(long, value_parser = ["jsonl", "csv"])]
        format: String,
    },
}

impl AuditCommand {
    pub(super) async fn run(&self, client: &AdminClient) -> anyhow::Result<()> {
        let AuditCommand::Export {
            since,
            until,
            format,
        } = self;
        let base = client.base()?;
        let mut query = vec![("format", format.clone())];
        query.extend(since.clone().map(|t| ("since", t)));
        query.extend(until.clone().map(|t| ("until", t)));
        // A long log takes long to send: no clock on the whole answer.
        let response = client
            .http_for(std::time::Duration::from_secs(24 * 3600))?
            .get(format!("{base}/admin/audit/export"))
            .query(&query)
            .bearer_auth(&client.token)
            .send()
            .await
            .with_context(|| {
                format!("cannot reach the update-server at {base}; is it running? (--server URL)")
            })?;
        let status = response.status();
        if !status.is_success() {
            let text = response.text().await.unwrap_or_default();
            let said: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
            let message = said["error"].as_str().map(str::to_owned);
            anyhow::bail!(
                "{base} answered {status}: {}",
                message.unwrap_or(said.to_string())
            );
        }
        let mut body = response.bytes_stream();
        let mut out = std::io::stdout();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.with_context(|| {
                format!("{base}: the export broke off; what was written is incomplete")
            })?;
            out.write_all(&chunk).context("cannot write to stdout")?;
        }
        out.flush().context("cannot write to stdout")?;
        Ok(())
    }
}

impl AuditQuery {
    pub(super) async fn run(&self, client: &AdminClient, json: bool) -> anyhow::Result<()> {
        let answer = client
            .audit(
                self.who.as_deref(),
                self.action.as_deref(),
                self.target.as_deref(),
                self.page,
            )
            .await?;
        super::print_answer(&answer, json, render_audit)
    }
}

impl AdminClient {
    /// `GET /admin/audit`, newest first.
    pub async fn audit(
        &self,
        who: Option<&str>,
        action: Option<&str>,
        target: Option<&str>,
        page: u32,
    ) -> anyhow::Result<Value> {
        let base = self.base()?;
        let mut query = vec![("page", page.to_string())];
        if let Some(who) = who {
            query.push(("who", who.to_owned()));
        }
        if let Some(action) = action {
            query.push(("action", action.to_owned()));
        }
        if let Some(target) = target {
            query.push(("target", target.to_owned()));
        }
        let request = self
            .http()?
            .get(format!("{base}/admin/audit"))
            .query(&query);
        self.send(base, request).await
    }
}

/// `GET /admin/audit` as a person reads it: one line per entry, newest first.
pub fn render_audit(answer: &Value) -> String {
    let mut out = String::new();
    let entries = answer["entries"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    for e in entries {
        let _ = writeln!(
            out,
            "{}  {:<20} {:<16} {:<22} {:<8} {}",
            millis_utc(&e["at"]),
            e["who"].as_str().unwrap_or("?"),
            e["address"].as_str().unwrap_or(""),
            e["action"].as_str().unwrap_or("?"),
            e["outcome"].as_str().unwrap_or("?"),
            crate::web::words::audit_details(&e["details"]),
        );
    }
    let total = answer["total"].as_i64().unwrap_or(0);
    let _ = writeln!(
        out,
        "{} of {} (page {})",
        entries.len(),
        crate::web::words::count(total, "entry", "entries"),
        answer["page"]
    );
    out
}
