//! `update-server maintenance add|list|remove`: each deployment's maintenance windows,
//! fleet policy kept in the fleet database (through the admin API of a running server;
//! every server of the fleet follows a change within seconds).

use std::fmt::Write as _;

use clap::Subcommand;
use serde_json::Value;

use super::AdminClient;

#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum Maintenance {
    /// Add a window: agents of its groups in its deployment install new bundles only
    /// inside it (as a `[[maintenance]]` table of server.toml says it).
    Add {
        /// The deployment whose agents wait for it.
        #[arg(long, value_name = "NAME", default_value = "default")]
        deployment: String,
        /// Agent groups it applies to (comma-separated); `*` for every agent.
        #[arg(long, value_delimiter = ',', default_value = "*")]
        groups: Vec<String>,
        /// Days (comma-separated: mon, tue, …, sun); every day when not given.
        #[arg(long, value_delimiter = ',')]
        days: Vec<String>,
        /// When it opens, HH:MM in --timezone.
        #[arg(long, value_name = "HH:MM")]
        start: String,
        /// How long it stays open: 3h, 90m, or seconds.
        #[arg(long, value_name = "DURATION")]
        duration: String,
        /// An IANA time zone (Europe/Berlin); DST as that zone has it.
        #[arg(long, default_value = "UTC")]
        timezone: String,
        /// An agent that missed its window: next-window, or at-once.
        #[arg(long, default_value = "next-window")]
        catch_up: String,
    },
    /// The windows, whether each is open and when it opens next.
    List {
        /// Only this deployment's.
        #[arg(long, value_name = "NAME")]
        deployment: Option<String>,
    },
    /// Remove a window by its id (`maintenance list` shows it).
    Remove { id: i64 },
}

impl Maintenance {
    pub(super) async fn run(&self, client: &AdminClient, json: bool) -> anyhow::Result<()> {
        let answer = client.maintenance(self).await?;
        super::print_answer(&answer, json, |a| match self {
            Maintenance::Add { .. } => format!(
                "added maintenance window {} to deployment {}: {}",
                a["id"],
                a["deployment"].as_str().unwrap_or("?"),
                describe(a)
            ),
            Maintenance::List { .. } => render(a),
            Maintenance::Remove { id } => format!(
                "removed maintenance window {id} of deployment {}: {}",
                a["deployment"].as_str().unwrap_or("?"),
                describe(a)
            ),
        })
    }
}

impl AdminClient {
    /// `/admin/maintenance...`: the answer's JSON, or an error that says what the server
    /// said.
    pub async fn maintenance(&self, action: &Maintenance) -> anyhow::Result<Value> {
        let base = self.base()?;
        let http = self.http()?;
        let request = match action {
            Maintenance::Add {
                deployment,
                groups,
                days,
                start,
                duration,
                timezone,
                catch_up,
            } => http
                .post(format!("{base}/admin/maintenance"))
                .json(&serde_json::json!({
                    "deployment": deployment,
                    "groups": groups,
                    "days": days,
                    "start": start,
                    "duration": duration,
                    "timezone": timezone,
                    "catch-up": catch_up,
                })),
            Maintenance::List { deployment } => {
                let request = http.get(format!("{base}/admin/maintenance"));
                match deployment {
                    Some(d) => request.query(&[("deployment", d)]),
                    None => request,
                }
            }
            Maintenance::Remove { id } => http.delete(format!("{base}/admin/maintenance/{id}")),
        };
        self.send(base, request).await
    }
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// One window in a line: `groups db; sat, sun; 02:00 for 10800s (UTC); catch-up
/// next-window`.
fn describe(w: &Value) -> String {
    let days = strings(&w["days"]);
    format!(
        "groups {}; {}; {} for {}s ({}); catch-up {}",
        strings(&w["groups"]).join(", "),
        if days.is_empty() || days.len() == 7 {
            "every day".to_owned()
        } else {
            days.join(", ")
        },
        w["start"].as_str().unwrap_or("?"),
        w["duration_secs"],
        w["timezone"].as_str().unwrap_or("?"),
        w["catch_up"].as_str().unwrap_or("?"),
    )
}

/// `GET /admin/maintenance` as a person reads it.
pub fn render(answer: &Value) -> String {
    let rows = answer["windows"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    if rows.is_empty() {
        return "no maintenance windows: agents update at any time (`update-server maintenance add --start HH:MM --duration 3h`)\n".to_owned();
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<4} {:<16} {:<26} window",
        "id", "deployment", "next opening (UTC)"
    );
    for w in rows {
        let next = if w["open"].as_bool() == Some(true) {
            format!("open until {}", w["open_until_utc"].as_str().unwrap_or("?"))
        } else {
            w["next_opening_utc"].as_str().unwrap_or("-").to_owned()
        };
        let said = match w["error"].as_str() {
            Some(e) => format!("{} (left out: {e})", describe(w)),
            None => describe(w),
        };
        let _ = writeln!(
            out,
            "{:<4} {:<16} {:<26} {said}",
            w["id"],
            w["deployment"].as_str().unwrap_or("?"),
            next
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_listed_one_a_line_with_their_next_opening() {
        let answer = serde_json::json!({ "windows": [{
            "id": 3, "deployment": "prod", "groups": ["db"], "days": ["sat", "sun"],
            "start": "02:00", "duration_secs": 10800, "timezone": "UTC",
            "catch_up": "next-window", "open": false,
            "next_opening_utc": "2026-12-05T02:00:00Z"
        }]});
        let shown = render(&answer);
        assert!(shown.contains("prod"), "{shown}");
        assert!(
            shown.contains("2026-12-05T02:00:00Z")
                && shown.contains("groups db; sat, sun; 02:00 for 10800s (UTC)"),
            "{shown}"
        );
        assert!(render(&serde_json::json!({ "windows": [] })).contains("any time"));
    }
}
