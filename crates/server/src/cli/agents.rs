//! `update-server agents list|label|forget-token|remove|override-locks|restart|
//! rotate-credentials|move` (also spelt `agent …`): the agents the fleet knows, and an
//! operator's actions on one (or, for the commands, on those a selector matches).

use std::fmt::Write as _;

use clap::Subcommand;
use serde_json::Value;

use super::AdminClient;
use super::table::text;

#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum Agents {
    /// The agents the server knows: id, name, version, group, last update status and
    /// last contact (`--json`: the API's rows).
    List {
        /// Only agents on this VERSION+BUILD.
        #[arg(long, value_name = "VERSION+BUILD")]
        version: Option<String>,
        /// Only agents whose last update status is this (INSTALLED, INSTALL_FAILED,
        /// RETRYING, …).
        #[arg(long)]
        status: Option<String>,
        /// Only agents of this group (`default`: also those with none).
        #[arg(long)]
        group: Option<String>,
        /// Only agents whose labels this selector matches, as `kubectl -l` writes it:
        /// `env=prod`, `env!=prod`, `env in (prod,staging)`, `env notin (dev)`, `region`,
        /// `!canary`, terms joined by `,`.
        #[arg(long, short = 'l', value_name = "SELECTOR")]
        selector: Option<String>,
    },
    /// Set or remove the server's own labels of an agent, as `kubectl label` does:
    /// `env=prod` sets, `tier-` removes; they win over the agent's labels of the same
    /// key (an operator's; audited).
    Label {
        /// The agent's id (data/agent-id, or `id` in GET /admin/agents).
        id: String,
        /// `KEY=VALUE` to set, `KEY-` to remove.
        #[arg(required = true, value_name = "KEY=VALUE|KEY-")]
        labels: Vec<String>,
    },
    /// Forget an agent's credentials (it lost data/agent-token); its next register gets
    /// new ones.
    ForgetToken {
        /// The agent's id (data/agent-id, or `id` in GET /admin/agents).
        id: String,
    },
    /// Forget a lost machine: its credentials are refused from then on, and no rollout
    /// waits for it (an operator's; audited).
    Remove {
        /// The agent's id (data/agent-id, or `id` in GET /admin/agents).
        id: String,
    },
    /// Let the fleet's current release through the agent's update locks now (an
    /// operator's; audited): it updates at its next contact.
    OverrideLocks {
        /// The agent's id (data/agent-id, or `id` in GET /admin/agents).
        id: String,
    },
    /// Restart an agent (through its supervisor), or only its workload, at its next
    /// contact; it reports when it did (`last_command` in `agents list --json`).
    Restart {
        #[command(flatten)]
        which: Which,
        /// Restart only the workload; the agent stays.
        #[arg(long)]
        workload: bool,
    },
    /// Give an agent a new credential: it keeps it beside the old one until a server takes
    /// it, then the old one is refused.
    RotateCredentials {
        #[command(flatten)]
        which: Which,
    },
    /// Move agents to another server URL: each tries it, and keeps it in its
    /// conf/agent.toml only once it answered there; otherwise it stays and says why.
    Move {
        #[command(flatten)]
        which: Which,
        /// The server URL to move to (http(s)://HOST:PORT).
        #[arg(long, value_name = "URL")]
        to: String,
    },
}

/// The agents a command is for: one id, or those a selector matches.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct Which {
    /// The agent's id (data/agent-id, or `id` in GET /admin/agents).
    #[arg(required_unless_present = "selector", conflicts_with = "selector")]
    id: Option<String>,
    /// Every agent whose labels this selector matches (as `agents list --selector`).
    #[arg(long, short = 'l', value_name = "SELECTOR")]
    selector: Option<String>,
}

impl Agents {
    pub(super) async fn run(&self, client: &AdminClient, json: bool) -> anyhow::Result<()> {
        let (answer, said) = match self {
            Agents::List {
                version,
                status,
                group,
                selector,
            } => {
                let query = AgentQuery {
                    version: version.clone(),
                    status: status.as_deref().map(known_status).transpose()?,
                    group: group.clone(),
                    selector: selector.clone(),
                };
                let answer = client.agents(&query).await?;
                let table = render_agents(&answer);
                (answer, table.trim_end().to_owned())
            }
            Agents::Label { id, labels } => {
                let answer = client.label_agent(id, labels).await?;
                let said = render_labels(id, &answer);
                (answer, said)
            }
            Agents::ForgetToken { id } => (
                client.forget_token(id).await?,
                format!("forgot the credentials of agent {id}; its next register gets new ones"),
            ),
            Agents::OverrideLocks { id } => {
                let answer = client.override_locks(id).await?;
                let release = answer["override_locks"]
                    .as_str()
                    .unwrap_or("the current release")
                    .to_owned();
                (
                    answer,
                    format!(
                        "agent {id} takes {release} despite its update locks, at its next contact"
                    ),
                )
            }
            Agents::Restart { which, workload } => {
                let body = serde_json::json!({ "workload": workload });
                let what = if *workload {
                    "its workload restarts"
                } else {
                    "it restarts"
                };
                client
                    .command_each(which, "restart", Some(&body), what)
                    .await?
            }
            Agents::RotateCredentials { which } => {
                client
                    .command_each(
                        which,
                        "rotate-credentials",
                        None,
                        "it is offered a new credential",
                    )
                    .await?
            }
            Agents::Move { which, to } => {
                let body = serde_json::json!({ "to": to });
                let what = format!("it is offered {to}");
                client
                    .command_each(which, "move", Some(&body), &what)
                    .await?
            }
            Agents::Remove { id } => (
                client.remove_agent(id).await?,
                format!(
                    "removed agent {id} from the fleet: its credentials are refused from now on and no rollout waits for it"
                ),
            ),
        };
        super::print_answer(&answer, json, |_| said)
    }
}

/// Which agents `agents list` shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentQuery {
    pub version: Option<String>,
    pub status: Option<String>,
    pub group: Option<String>,
    /// A label selector (`env=prod,region in (eu)`).
    pub selector: Option<String>,
}

impl AdminClient {
    /// `POST /admin/agents/{id}/labels`: `args` as `kubectl label` reads them (`k=v`
    /// sets, `k-` removes), checked before anything is sent.
    pub async fn label_agent(&self, id: &str, args: &[String]) -> anyhow::Result<Value> {
        let edit = agent_fleet::labels::Edit::parse(args).map_err(anyhow::Error::msg)?;
        let base = self.base()?;
        let request = self
            .http()?
            .post(format!("{base}/admin/agents/{id}/labels"))
            .json(&edit);
        self.send(base, request).await
    }

    /// `GET /admin/agents?version=&status=&group=&selector=`.
    pub async fn agents(&self, query: &AgentQuery) -> anyhow::Result<Value> {
        let base = self.base()?;
        let mut pairs = Vec::new();
        for (name, value) in [
            ("version", &query.version),
            ("status", &query.status),
            ("group", &query.group),
            ("selector", &query.selector),
        ] {
            if let Some(v) = value {
                pairs.push((name, v.clone()));
            }
        }
        let request = self
            .http()?
            .get(format!("{base}/admin/agents"))
            .query(&pairs);
        self.send(base, request).await
    }

    /// `POST /admin/agents/{id}/{action}` for the agent `which` names, or each agent its
    /// selector matches (none matching is an error, not a silent nothing). Answers the
    /// commands asked, and a line per agent.
    async fn command_each(
        &self,
        which: &Which,
        action: &str,
        body: Option<&Value>,
        what: &str,
    ) -> anyhow::Result<(Value, String)> {
        let ids = match (&which.id, &which.selector) {
            (Some(id), _) => vec![id.clone()],
            (None, selector) => {
                let query = AgentQuery {
                    selector: selector.clone(),
                    ..AgentQuery::default()
                };
                let rows = self.agents(&query).await?;
                let ids: Vec<String> = rows
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|r| r["id"].as_str().map(str::to_owned))
                    .collect();
                if ids.is_empty() {
                    anyhow::bail!(
                        "no agent matches the selector {:?}; `update-server agents list --selector` shows which do",
                        selector.as_deref().unwrap_or_default()
                    );
                }
                ids
            }
        };
        let base = self.base()?;
        let mut answers = Vec::new();
        let mut said = String::new();
        for id in ids {
            let mut request = self
                .http()?
                .post(format!("{base}/admin/agents/{id}/{action}"));
            if let Some(body) = body {
                request = request.json(body);
            }
            let answer = self.send(base, request).await?;
            let _ = writeln!(
                said,
                "agent {id}: {what} at its next contact (command {})",
                text(&answer, "id")
            );
            answers.push(answer);
        }
        Ok((Value::Array(answers), said.trim_end().to_owned()))
    }

    /// `DELETE /admin/agents/{id}/token`.
    pub async fn forget_token(&self, id: &str) -> anyhow::Result<Value> {
        let base = self.base()?;
        let request = self
            .http()?
            .delete(format!("{base}/admin/agents/{id}/token"));
        self.send(base, request).await
    }

    /// `POST /admin/agents/{id}/override-locks`.
    pub async fn override_locks(&self, id: &str) -> anyhow::Result<Value> {
        let base = self.base()?;
        let request = self
            .http()?
            .post(format!("{base}/admin/agents/{id}/override-locks"));
        self.send(base, request).await
    }

    /// `DELETE /admin/agents/{id}`.
    pub async fn remove_agent(&self, id: &str) -> anyhow::Result<Value> {
        let base = self.base()?;
        let request = self.http()?.delete(format!("{base}/admin/agents/{id}"));
        self.send(base, request).await
    }
}

/// `GET /admin/agents` as a person reads it: one line per agent, and a count.
pub fn render_agents(list: &Value) -> String {
    let mut out = String::new();
    let rows = list.as_array().map(Vec::as_slice).unwrap_or_default();
    if rows.is_empty() {
        return "no agents match\n".to_owned();
    }
    let _ = writeln!(
        out,
        "{:<36}  {:<20} {:<16} {:<10} {:<15} {:<29} {:<24} error",
        "id", "name", "version", "group", "status", "last contact", "labels"
    );
    for a in rows {
        let group = match text(a, "group") {
            "" => "default",
            g => g,
        };
        // As the page says it: no update asked of this agent yet.
        let status = match text(a, "update_status") {
            "" => "NONE",
            s => s,
        };
        let error = agent_protocol::shown::cut_at_word(text(a, "update_error"), 60);
        let _ = writeln!(
            out,
            "{:<36}  {:<20} {:<16} {:<10} {:<15} {:<29} {:<24} {}",
            text(a, "id"),
            text(a, "name"),
            text(a, "version"),
            group,
            status,
            text(a, "last_contact"),
            own_labels(a),
            error,
        );
    }
    let _ = writeln!(
        out,
        "{} agent{}",
        rows.len(),
        if rows.len() == 1 { "" } else { "s" }
    );
    out
}

/// A row's labels but the built-in ones (which the other columns show), `k=v,k=v`;
/// `-` for none.
fn own_labels(row: &Value) -> String {
    let own: Vec<String> = row["labels"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| !agent_fleet::labels::is_built_in(k))
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect();
    if own.is_empty() {
        "-".to_owned()
    } else {
        own.join(",")
    }
}

/// `agent label ID k=v k2-` as a person reads it.
pub fn render_labels(id: &str, answer: &Value) -> String {
    let shown = |v: &Value| {
        let pairs: Vec<String> = v
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
            .collect();
        if pairs.is_empty() {
            "none".to_owned()
        } else {
            pairs.join(", ")
        }
    };
    format!(
        "agent {id}: server labels {}\nlabels: {}",
        shown(&answer["server_labels"]),
        shown(&answer["labels"])
    )
}

/// `--status` of `agents list`, checked before anything is asked (a typo answered "no
/// agents match").
pub fn known_status(text: &str) -> anyhow::Result<String> {
    agent_protocol::wire::UpdateStatus::filter_name(text).map_err(anyhow::Error::msg)
}
