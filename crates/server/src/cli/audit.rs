//! `update-server audit`: the audit log, newest first.

use std::fmt::Write as _;

use clap::Args;
use serde_json::Value;

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
    #[arg(long, default_value_t = 1)]
    page: u32,
}

impl AuditQuery {
    pub(super) async fn run(&self, client: &AdminClient, json: bool) -> anyhow::Result<()> {
        let answer = client
            .audit(self.who.as_deref(), self.action.as_deref(), self.page)
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
