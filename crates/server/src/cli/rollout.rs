//! `update-server rollout status|halt|resume|advance`: the bundle's rollout.

use std::fmt::Write as _;

use clap::Subcommand;
use serde_json::Value;

use super::AdminClient;
use super::table::{clock, count, date, text};

#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum Rollout {
    /// The rollout's state and a table of its waves.
    Status,
    /// Tell no more agents to update; agents on the previous version stay accepted.
    Halt {
        /// Why, recorded with the halt.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Let a halted rollout go on (failures seen so far no longer count).
    Resume,
    /// Open the next wave now, without waiting for the current one or the soak.
    Advance,
}

impl Rollout {
    pub(super) async fn run(&self, client: &AdminClient, json: bool) -> anyhow::Result<()> {
        let status = client.rollout(self).await?;
        super::print_answer(&status, json, render_status)
    }
}

impl AdminClient {
    /// `/admin/rollout…`: the answer's JSON, or an error that says what the server said.
    pub async fn rollout(&self, action: &Rollout) -> anyhow::Result<Value> {
        let base = self.base()?;
        let http = self.http()?;
        let request = match action {
            Rollout::Status => http.get(format!("{base}/admin/rollout")),
            Rollout::Halt { reason } => {
                let body = serde_json::json!({ "reason": reason });
                http.post(format!("{base}/admin/rollout/halt")).json(&body)
            }
            Rollout::Resume => http.post(format!("{base}/admin/rollout/resume")),
            Rollout::Advance => http.post(format!("{base}/admin/rollout/advance")),
        };
        self.send(base, request).await
    }
}

/// The rollout as a person reads it: a headline, the reason if any, then one line per wave.
pub fn render_status(status: &Value) -> String {
    let mut out = String::new();
    let waves = status
        .get("waves")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let previous = match status.get("previous").and_then(Value::as_str) {
        Some(p) => format!("after {p}, the last completed rollout"),
        None => "the first rollout".to_owned(),
    };
    let _ = writeln!(
        out,
        "rollout of {} ({previous}): {}, wave {} of {}",
        text(status, "version"),
        text(status, "state"),
        count(status, "wave"),
        waves.len()
    );
    let sha = text(status, "sha256");
    let _ = writeln!(
        out,
        "sha256 {}, started {}",
        sha.get(..16).unwrap_or(sha),
        date(&status["started_at"])
    );
    if let Some(reason) = status.get("reason").and_then(Value::as_str) {
        let _ = writeln!(out, "reason: {reason}");
    }
    if let Some(mismatch) = status.get("mismatch").and_then(Value::as_str) {
        let _ = writeln!(out, "warning: {mismatch}");
    }
    let _ = writeln!(
        out,
        "{:>4}  {:<14} {:>7} {:>10} {:>7} {:>10} {:>8}  {:<9} {:<9}",
        "wave",
        "size",
        "agents",
        "installed",
        "failed",
        "timed out",
        "pending",
        "opened",
        "completed"
    );
    for (i, w) in waves.iter().enumerate() {
        let _ = writeln!(
            out,
            "{:>4}  {:<14} {:>7} {:>10} {:>7} {:>10} {:>8}  {:<9} {:<9}",
            i + 1,
            text(w, "size"),
            count(w, "agents"),
            count(w, "installed"),
            count(w, "failed"),
            count(w, "timed_out"),
            count(w, "pending"),
            clock(&w["opened_at"]),
            clock(&w["completed_at"]),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_renders_a_headline_and_one_line_per_wave() {
        let status = serde_json::json!({
            "version": "2.0.0+2", "previous": "1.0.0+1", "sha256": "ab".repeat(32),
            "state": "halted", "reason": "1 of 2 agents told failed", "wave": 1,
            "started_at": 1_763_791_923.5,
            "waves": [
                {"size": "2", "agents": 2, "installed": 1, "failed": 1, "timed_out": 0, "pending": 0,
                 "opened_at": 1_763_791_924.0, "completed_at": null},
                {"size": "100%", "agents": 8, "installed": 0, "failed": 0, "timed_out": 0, "pending": 8,
                 "opened_at": null, "completed_at": null}
            ]
        });
        let text = render_status(&status);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].contains("2.0.0+2")
                && lines[0].contains("halted")
                && lines[0].contains("wave 1 of 2"),
            "{text}"
        );
        assert!(text.contains("reason: 1 of 2 agents told failed"), "{text}");
        let wave1 = lines
            .iter()
            .find(|l| l.trim_start().starts_with("1 "))
            .unwrap();
        assert!(
            wave1.contains(':') && wave1.trim_end().ends_with('-'),
            "{wave1}"
        );
        assert_eq!(lines.len(), 6, "{text}");
    }
}
