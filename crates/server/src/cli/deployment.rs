//! `update-server deployment create|set|list|show|remove|halt|resume|advance`: who gets
//! which release (through `/admin/deployments`).

use std::fmt::Write as _;

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::AdminClient;
use super::rollout::Rollout;
use super::table::{count, text};

#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum Deployment {
    /// Make a deployment: the agents its selector picks run RELEASE.
    Create {
        /// A plain name (letters, digits, '.', '_', '-').
        name: String,
        /// Which agents, as `kubectl -l` writes it: `env=prod,region in (eu)`.
        #[arg(long, value_name = "SELECTOR", default_value = "")]
        selector: String,
        /// A kept release, `<version>+<build>` (see `update-server release list`).
        #[arg(long, value_name = "V+B")]
        release: String,
        /// Of several deployments that select an agent, the highest priority wins
        /// (ties: the newest).
        #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
        priority: i64,
        #[command(flatten)]
        policy: PolicyArgs,
    },
    /// Change a deployment: a new release starts its rollout.
    Set {
        name: String,
        #[arg(long, value_name = "SELECTOR")]
        selector: Option<String>,
        #[arg(long, value_name = "V+B")]
        release: Option<String>,
        #[arg(long, allow_negative_numbers = true)]
        priority: Option<i64>,
        #[command(flatten)]
        policy: PolicyArgs,
    },
    /// Every deployment: its selector, release, priority, agents and rollout.
    List,
    /// One deployment, with its rollout's waves.
    Show { name: String },
    /// Remove a deployment: its agents follow the next that selects them.
    Remove { name: String },
    /// Halt the deployment's rollout.
    Halt {
        name: String,
        /// Why, recorded with the halt.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Let the deployment's halted rollout go on.
    Resume { name: String },
    /// Open the deployment's next wave now.
    Advance { name: String },
}

/// A deployment's rollout policy (as `[rollout]`); what is left out keeps its value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Args)]
pub struct PolicyArgs {
    /// Cumulative waves, comma-separated: a count ("1"), a share ("10%") or "group:NAME".
    #[arg(long, value_name = "W,W,…", value_delimiter = ',')]
    waves: Option<Vec<String>>,
    /// Seconds a completed wave soaks before the next opens.
    #[arg(long, value_name = "SECS")]
    wave_wait: Option<u64>,
    /// Failures (a count or a share of the agents told) that halt the rollout.
    #[arg(long, value_name = "N|P%")]
    max_failures: Option<String>,
    /// Seconds an agent told to update has to report.
    #[arg(long, value_name = "SECS")]
    agent_deadline: Option<u64>,
}

impl PolicyArgs {
    fn json(&self) -> Value {
        let mut policy = serde_json::Map::new();
        if let Some(w) = &self.waves {
            policy.insert("waves".into(), json!(w));
        }
        if let Some(w) = self.wave_wait {
            policy.insert("wave-wait".into(), json!(w));
        }
        if let Some(m) = &self.max_failures {
            policy.insert("max-failures".into(), json!(m));
        }
        if let Some(d) = self.agent_deadline {
            policy.insert("agent-deadline".into(), json!(d));
        }
        Value::Object(policy)
    }
}

impl Deployment {
    pub(super) async fn run(&self, client: &AdminClient, json: bool) -> anyhow::Result<()> {
        let answer = client.deployment(self).await?;
        match self {
            Deployment::List => super::print_answer(&answer, json, render_list),
            Deployment::Remove { name } => super::print_answer(&answer, json, |_| {
                format!(
                    "deployment {name} removed: its agents follow the next deployment that selects them, at their next contact"
                )
            }),
            _ => super::print_answer(&answer, json, render_one),
        }
    }
}

impl Deployment {
    /// The same step on deployment `name`'s rollout (`rollout … --deployment NAME`).
    pub(super) async fn rollout_step(
        step: &Rollout,
        name: &str,
        client: &AdminClient,
        json: bool,
    ) -> anyhow::Result<()> {
        let name = name.to_owned();
        let action = match step {
            Rollout::Status => Self::Show { name },
            Rollout::Halt { reason } => Self::Halt {
                name,
                reason: reason.clone(),
            },
            Rollout::Resume => Self::Resume { name },
            Rollout::Advance => Self::Advance { name },
        };
        let answer = client.deployment(&action).await?;
        let rollout = answer.get("rollout").cloned().unwrap_or_default();
        if rollout.is_null() {
            anyhow::bail!(
                "deployment {} has no rollout yet: the servers are loading its release",
                answer["name"].as_str().unwrap_or("?")
            );
        }
        super::print_answer(&rollout, json, super::rollout::render_status)
    }
}

impl AdminClient {
    /// `/admin/deployments…`: the answer's JSON, or an error that says what the server said.
    pub async fn deployment(&self, action: &Deployment) -> anyhow::Result<Value> {
        let base = self.base()?;
        let http = self.http()?;
        let one = |name: &str| format!("{base}/admin/deployments/{name}");
        let request = match action {
            Deployment::Create {
                name,
                selector,
                release,
                priority,
                policy,
            } => http.post(format!("{base}/admin/deployments")).json(&json!({
                "name": name,
                "selector": selector,
                "release": release,
                "priority": priority,
                "policy": policy.json(),
            })),
            Deployment::Set {
                name,
                selector,
                release,
                priority,
                policy,
            } => {
                let mut body = json!({ "policy": policy.json() });
                if let Some(s) = selector {
                    body["selector"] = json!(s);
                }
                if let Some(r) = release {
                    body["release"] = json!(r);
                }
                if let Some(p) = priority {
                    body["priority"] = json!(p);
                }
                http.patch(one(name)).json(&body)
            }
            Deployment::List => http.get(format!("{base}/admin/deployments")),
            Deployment::Show { name } => http.get(one(name)),
            Deployment::Remove { name } => http.delete(one(name)),
            Deployment::Halt { name, reason } => http
                .post(format!("{}/halt", one(name)))
                .json(&json!({ "reason": reason })),
            Deployment::Resume { name } => http.post(format!("{}/resume", one(name))),
            Deployment::Advance { name } => http.post(format!("{}/advance", one(name))),
        };
        self.send(base, request).await
    }
}

/// The rollout's few words: `running, wave 1 of 2` or `no rollout`.
fn rollout_words(d: &Value) -> String {
    match d.get("rollout").filter(|r| !r.is_null()) {
        Some(r) => format!(
            "{} of {}, wave {} of {}",
            text(r, "state"),
            text(r, "version"),
            count(r, "wave"),
            r.get("waves").and_then(Value::as_array).map_or(0, Vec::len)
        ),
        None => "no rollout yet".to_owned(),
    }
}

/// The deployments as a table.
pub fn render_list(answer: &Value) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<16} {:<28} {:<14} {:>8} {:>7}  rollout",
        "name", "selector", "release", "priority", "agents"
    );
    for d in answer["deployments"].as_array().into_iter().flatten() {
        let selector = match text(d, "selector") {
            "" | "-" => "(every agent)",
            s => s,
        };
        let _ = writeln!(
            out,
            "{:<16} {:<28} {:<14} {:>8} {:>7}  {}",
            text(d, "name"),
            selector,
            text(d, "release"),
            d["priority"].as_i64().unwrap_or(0),
            count(d, "agents"),
            rollout_words(d)
        );
    }
    out
}

/// One deployment, then its rollout's waves.
pub fn render_one(d: &Value) -> String {
    let mut out = String::new();
    let selector = match text(d, "selector") {
        "" | "-" => "(every agent)",
        s => s,
    };
    let _ = writeln!(
        out,
        "deployment {}: selector {selector}, release {}, priority {}",
        text(d, "name"),
        text(d, "release"),
        d["priority"].as_i64().unwrap_or(0)
    );
    if d.get("agents").is_some() {
        let _ = writeln!(out, "agents: {}", count(d, "agents"));
    }
    match d.get("rollout").filter(|r| !r.is_null()) {
        Some(r) => out.push_str(&super::rollout::render_status(r)),
        None => {
            let _ = writeln!(out, "no rollout yet");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_names_every_deployment_and_an_empty_selector_reads_every_agent() {
        let answer = json!({"deployments": [
            {"name": "default", "selector": "", "release": "2.0.0+2", "priority": 0, "agents": 3, "rollout": null},
            {"name": "prod", "selector": "env=prod", "release": "1.0.0+1", "priority": 10, "agents": 2,
             "rollout": {"state": "completed", "version": "1.0.0+1", "wave": 1, "waves": [{}]}},
        ]});
        let shown = render_list(&answer);
        assert!(shown.contains("(every agent)"), "{shown}");
        assert!(shown.contains("env=prod"), "{shown}");
        assert!(
            shown.contains("completed of 1.0.0+1, wave 1 of 1"),
            "{shown}"
        );
        assert!(shown.contains("no rollout yet"), "{shown}");
    }
}
