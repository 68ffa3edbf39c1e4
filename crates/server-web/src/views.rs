//! The pages' templates (`crates/server-web/templates/`, compiled in, HTML-escaped) and the
//! view rows they show: every value already a string, every link already encoded.

use askama::Template;

use super::model::{Agent, ago, is_stale, utc};
use super::overview::{Count, Failure, Overview};
use super::query::{AgentQuery, Page, encode};
use super::source::{ConfigSets, HistoryLine, Rollout};

/// What every page's frame needs: its title, and the CSRF token of the signed-in
/// person's session (empty when signed out: no navigation then).
#[derive(Debug, Clone, Default)]
pub struct Frame {
    pub title: &'static str,
    pub csrf: String,
    pub server_version: &'static str,
    pub now_utc: String,
}

impl Frame {
    pub fn new(title: &'static str, csrf: &str, now: i64) -> Self {
        Self {
            title,
            csrf: csrf.to_owned(),
            server_version: env!("CARGO_PKG_VERSION"),
            now_utc: utc(now as f64),
        }
    }
}

/// `/agents/<id>`: the id encoded as one path segment.
pub fn agent_href(id: &str) -> String {
    format!("/agents/{}", encode(id))
}

#[derive(Template)]
#[template(path = "signin.html")]
pub struct SignIn {
    /// The layout's: title, CSRF token, version, the time.
    pub frame: Frame,
    pub signin_csrf: String,
    pub message: String,
}

impl SignIn {
    pub fn new(frame: Frame, signin_csrf: String, message: &str) -> Self {
        // Signed out: the page's own forms are not shown.
        let frame = Frame {
            csrf: String::new(),
            ..frame
        };
        Self {
            frame,
            signin_csrf,
            message: message.to_owned(),
        }
    }
}

#[derive(Template)]
#[template(path = "message.html")]
pub struct Message {
    /// The layout's: title, CSRF token, version, the time.
    pub frame: Frame,
    pub message: String,
}

impl Message {
    pub fn new(frame: Frame, message: &str) -> Self {
        Self {
            frame,
            message: message.to_owned(),
        }
    }
}

/// One count with the link to the agents it counts.
#[derive(Debug, Clone)]
pub struct CountRow {
    pub label: String,
    pub agents: usize,
    pub href: String,
}

fn count_rows(counts: &[Count], key: &str) -> Vec<CountRow> {
    counts
        .iter()
        .map(|c| CountRow {
            label: c.label.clone(),
            agents: c.agents,
            href: format!("/agents?{key}={}", encode(&c.label)),
        })
        .collect()
}

#[derive(Debug, Clone)]
pub struct FailureRow {
    pub name: String,
    pub href: String,
    pub kind: &'static str,
    pub status: String,
    pub reason: String,
    pub when: String,
    pub when_utc: String,
}

/// The rollout as the pages show it.
#[derive(Debug, Clone, Default)]
pub struct RolloutView {
    pub version: String,
    pub previous: String,
    pub state: String,
    pub reason: String,
    pub wave: u32,
    pub started: String,
    pub completed: String,
    pub can_halt: bool,
    pub can_resume: bool,
    pub can_advance: bool,
    /// Where its buttons post: `<actions>/halt`, `/resume`, `/advance`.
    pub actions: String,
    /// Whether the wave table has a "No bundle" column: a bundle rollout's has (a
    /// release may lack some platform), a configuration rollout's has not.
    pub no_bundle_column: bool,
    pub waves: Vec<WaveView>,
    pub events: Vec<EventView>,
}

#[derive(Debug, Clone, Default)]
pub struct WaveView {
    pub number: usize,
    pub size: String,
    pub agents: u64,
    pub installed: u64,
    pub failed: u64,
    pub timed_out: u64,
    pub no_bundle: u64,
    pub pending: u64,
    pub opened: String,
    pub completed: String,
}

#[derive(Debug, Clone, Default)]
pub struct EventView {
    pub at: String,
    pub kind: String,
    pub wave: String,
    pub detail: String,
    pub server: String,
}

/// An agent as a person tells it from the others: its name (the host's) and the
/// start of its id, since several agents may run on one host; its id alone when it has
/// no name.
pub fn named(name: &str, id: &str) -> String {
    if name.is_empty() {
        return id.to_owned();
    }
    let short: String = id.chars().take(8).collect();
    format!("{name} · {short}")
}

fn ms_to_secs(ms: i64) -> f64 {
    ms as f64 / 1000.0
}

fn when(at: Option<f64>, now: i64) -> String {
    match at {
        Some(t) if t.is_finite() => format!("{} ({})", ago(t as i64, now), utc(t)),
        _ => String::new(),
    }
}

impl RolloutView {
    pub fn new(r: &Rollout, now: i64) -> Self {
        let live = matches!(r.state.as_str(), "running" | "soaking");
        Self {
            version: r.version.clone(),
            previous: r.previous.clone().unwrap_or_default(),
            state: r.state.clone(),
            reason: r.reason.clone().unwrap_or_default(),
            wave: r.wave,
            started: when(Some(r.started_at), now),
            completed: when(r.completed_at, now),
            can_halt: live,
            can_resume: r.state == "halted",
            can_advance: live,
            actions: "/rollouts".to_owned(),
            no_bundle_column: true,
            waves: r
                .waves
                .iter()
                .enumerate()
                .map(|(i, w)| WaveView {
                    number: i + 1,
                    size: w.size.clone(),
                    agents: w.agents,
                    installed: w.installed,
                    failed: w.failed,
                    timed_out: w.timed_out,
                    no_bundle: w.no_bundle,
                    pending: w.pending,
                    opened: when(w.opened_at, now),
                    completed: when(w.completed_at, now),
                })
                .collect(),
            events: r
                .events
                .iter()
                .rev()
                .map(|e| EventView {
                    at: when(Some(e.at), now),
                    kind: e.kind.clone(),
                    wave: if e.wave > 0 {
                        e.wave.to_string()
                    } else {
                        String::new()
                    },
                    detail: e.detail.clone().unwrap_or_default(),
                    server: e.server.clone(),
                })
                .collect(),
        }
    }
}

/// A configuration set and its config rollout.
#[derive(Debug, Clone, Default)]
pub struct ConfigView {
    pub group: String,
    pub hash: String,
    pub created: String,
    pub files: String,
    pub applied: u64,
    pub applying: u64,
    pub failed: u64,
    pub rollout: Option<RolloutView>,
}

impl ConfigView {
    pub fn all(sets: &ConfigSets, now: i64) -> Vec<Self> {
        sets.sets
            .iter()
            .map(|set| Self {
                group: set.group.clone(),
                hash: agent_fleet::config::short(&set.hash).to_owned(),
                created: when(Some(set.created_at), now),
                files: super::words::set_files(&set.files),
                applied: set.applied,
                applying: set.applying,
                failed: set.failed + set.timed_out,
                rollout: set.rollout.as_ref().map(|r| {
                    let mut view = RolloutView::new(r, now);
                    view.version =
                        format!("{} {}", set.group, agent_fleet::config::short(&set.hash));
                    view.actions = format!("/rollouts/config/{}", encode(&set.group));
                    view.no_bundle_column = false;
                    view
                }),
            })
            .collect()
    }

    /// A config rollout still going (or halted), for the overview.
    pub fn live(&self) -> bool {
        self.rollout
            .as_ref()
            .is_some_and(|r| r.state != "completed")
    }
}

#[derive(Template)]
#[template(path = "overview.html")]
pub struct OverviewPage {
    /// The layout's: title, CSRF token, version, the time.
    pub frame: Frame,
    pub total: usize,
    pub stale: usize,
    pub stale_after: String,
    pub failed: usize,
    pub rollout: Option<RolloutView>,
    pub configs: Vec<ConfigView>,
    pub by_version: Vec<CountRow>,
    pub by_status: Vec<CountRow>,
    pub by_health: Vec<CountRow>,
    pub by_config: Vec<CountRow>,
    pub by_protocol: Vec<CountRow>,
    pub by_platform: Vec<CountRow>,
    pub failures: Vec<FailureRow>,
    /// Changes waiting for a second operator's approval (a card when there are any).
    pub waiting: usize,
}

impl OverviewPage {
    pub fn with_waiting(mut self, waiting: usize) -> Self {
        self.waiting = waiting;
        self
    }

    pub fn new(
        frame: Frame,
        o: &Overview,
        failed: usize,
        stale_after: std::time::Duration,
        rollout: Option<RolloutView>,
        configs: Vec<ConfigView>,
        now: i64,
    ) -> Self {
        Self {
            waiting: 0,
            frame,
            configs: configs.into_iter().filter(ConfigView::live).collect(),
            total: o.total,
            stale: o.stale,
            stale_after: format!("{} s", stale_after.as_secs()),
            failed,
            rollout,
            by_version: count_rows(&o.by_version, "version"),
            by_status: count_rows(&o.by_status, "status"),
            by_health: count_rows(&o.by_health, "health"),
            by_config: count_rows(&o.by_config, "config"),
            by_protocol: count_rows(&o.by_protocol, "protocol"),
            by_platform: count_rows(&o.by_platform, "platform"),
            failures: o
                .failures
                .iter()
                .map(|f: &Failure| FailureRow {
                    name: named(&f.name, &f.id),
                    href: agent_href(&f.id),
                    kind: f.kind,
                    status: f.status.clone(),
                    reason: f.reason.clone(),
                    when: ago(f.last_contact, now),
                    when_utc: utc(f.last_contact as f64),
                })
                .collect(),
        }
    }
}

/// One agent as a row of the list or the facts of its page.
#[derive(Debug, Clone, Default)]
pub struct AgentView {
    pub id: String,
    pub name: String,
    pub href: String,
    pub version: String,
    pub platform: String,
    pub group: String,
    pub protocol: String,
    pub last_ago: String,
    pub last_utc: String,
    pub stale: bool,
    pub update: String,
    pub update_error: String,
    pub wave: String,
    pub told: String,
    pub health: String,
    pub health_detail: String,
    pub config: String,
    pub config_hash: String,
    pub config_error: String,
    /// Its labels but the built-in ones (which other columns show), `k=v, k=v`.
    pub labels: String,
    pub deployment: String,
}

impl AgentView {
    pub fn new(a: &Agent, heartbeat: std::time::Duration, now: i64) -> Self {
        Self {
            id: a.id.clone(),
            // The list has an id column beside the name.
            name: if a.name.is_empty() {
                a.id.clone()
            } else {
                a.name.clone()
            },
            href: agent_href(&a.id),
            version: a.version.clone(),
            platform: a.platform.clone(),
            group: a.group.clone(),
            protocol: a.protocol_label().to_owned(),
            last_ago: ago(a.last_contact, now),
            last_utc: utc(a.last_contact as f64),
            stale: is_stale(a.last_contact, heartbeat, now),
            update: a.update_label().to_owned(),
            update_error: a.update_error.clone().unwrap_or_default(),
            wave: a.wave.map(|w| w.to_string()).unwrap_or_default(),
            told: when(a.told_at, now),
            health: a.health_label().to_owned(),
            health_detail: a.health_detail.clone().unwrap_or_default(),
            config: a.config_label().to_owned(),
            config_hash: a.config_hash.clone().unwrap_or_default(),
            config_error: a.config_error.clone().unwrap_or_default(),
            labels: a
                .labels
                .iter()
                .filter(|(k, _)| !agent_fleet::labels::is_built_in(k))
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(", "),
            deployment: a.deployment.clone(),
        }
    }
}

#[derive(Template)]
#[template(path = "agents.html")]
pub struct AgentsPage {
    /// The layout's: title, CSRF token, version, the time.
    pub frame: Frame,
    pub query: AgentQuery,
    pub filtered: bool,
    pub versions: Vec<String>,
    pub statuses: Vec<String>,
    pub healths: Vec<String>,
    pub configs: Vec<String>,
    pub groups: Vec<String>,
    pub protocols: Vec<String>,
    pub total: usize,
    pub matching: usize,
    pub page: usize,
    pub pages: usize,
    pub rows: Vec<AgentView>,
    pub prev: String,
    pub next: String,
}

/// The choices of each filter: the labels the fleet has, sorted; and its size.
#[derive(Debug, Clone, Default)]
pub struct Choices {
    pub total: usize,
    pub versions: Vec<String>,
    pub statuses: Vec<String>,
    pub healths: Vec<String>,
    pub configs: Vec<String>,
    pub groups: Vec<String>,
    pub protocols: Vec<String>,
}

impl Choices {
    pub fn of(agents: &[Agent]) -> Self {
        fn sorted<'a>(labels: impl Iterator<Item = &'a str>) -> Vec<String> {
            let set: std::collections::BTreeSet<&str> = labels.collect();
            set.into_iter().map(str::to_owned).collect()
        }
        Self {
            total: agents.len(),
            versions: sorted(agents.iter().map(|a| a.version.as_str())),
            statuses: sorted(agents.iter().map(Agent::update_label)),
            healths: sorted(agents.iter().map(Agent::health_label)),
            configs: sorted(agents.iter().map(Agent::config_label)),
            groups: sorted(
                agents
                    .iter()
                    .map(|a| a.group.as_str())
                    .filter(|g| !g.is_empty()),
            ),
            protocols: sorted(agents.iter().map(Agent::protocol_label)),
        }
    }
}

impl AgentsPage {
    pub fn new(
        frame: Frame,
        query: AgentQuery,
        choices: Choices,
        page: &Page<'_>,
        rows: &[Agent],
        heartbeat: std::time::Duration,
        now: i64,
    ) -> Self {
        let link = |n: usize| {
            let q = query.to_query(n);
            if q.is_empty() {
                "/agents".to_owned()
            } else {
                format!("/agents?{q}")
            }
        };
        Self {
            frame,
            filtered: query.filtered(),
            versions: choices.versions,
            statuses: choices.statuses,
            healths: choices.healths,
            configs: choices.configs,
            groups: choices.groups,
            protocols: choices.protocols,
            total: choices.total,
            matching: page.matching,
            page: page.page,
            pages: page.pages,
            rows: rows
                .iter()
                .map(|a| AgentView::new(a, heartbeat, now))
                .collect(),
            prev: if page.page > 1 {
                link(page.page - 1)
            } else {
                String::new()
            },
            next: if page.page < page.pages {
                link(page.page + 1)
            } else {
                String::new()
            },
            query,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct HistoryView {
    pub kind: &'static str,
    pub version: String,
    pub wave: u32,
    pub told: String,
    pub outcome: String,
    pub when: String,
    pub error: String,
}

#[derive(Template)]
#[template(path = "agent.html")]
pub struct AgentPage {
    /// The layout's: title, CSRF token, version, the time.
    pub frame: Frame,
    pub a: AgentView,
    pub history: Vec<HistoryView>,
    /// The last command asked of it (a restart, a rotation, a move), if any.
    pub last_command: Option<CommandView>,
}

/// A command as the agent's page shows it.
pub struct CommandView {
    /// `restart agent`, `move http://…`, `rotate-credentials`.
    pub what: String,
    pub status: String,
    pub error: String,
    pub when: String,
}

impl CommandView {
    pub fn new(c: &agent_fleet::commands::Command, now: i64) -> Self {
        Self {
            what: format!("{} {}", c.kind.as_str(), c.argument)
                .trim_end()
                .to_owned(),
            status: c.status.as_str().to_owned(),
            error: c.error.clone().unwrap_or_default(),
            when: when(Some(c.updated_at as f64), now),
        }
    }
}

impl AgentPage {
    pub fn new(frame: Frame, a: AgentView, history: &[HistoryLine], now: i64) -> Self {
        Self {
            frame,
            a,
            history: history
                .iter()
                .map(|h| HistoryView {
                    kind: h.kind,
                    version: h.target.clone(),
                    wave: h.wave,
                    told: when(h.told_at.map(ms_to_secs), now),
                    outcome: h.outcome.clone().unwrap_or_else(|| "PENDING".to_owned()),
                    when: when(h.outcome_at.map(ms_to_secs), now),
                    error: h.error.clone().unwrap_or_default(),
                })
                .collect(),
            last_command: None,
        }
    }
}

#[derive(Template)]
#[template(path = "rollouts.html")]
pub struct RolloutsPage {
    /// The layout's: title, CSRF token, version, the time.
    pub frame: Frame,
    pub message: String,
    pub rollout: Option<RolloutView>,
    pub configs: Vec<ConfigView>,
    /// `[[maintenance]]`: when agents may install.
    pub windows: Vec<super::windows::WindowView>,
    /// The published releases, the current first.
    pub releases: Vec<ReleaseLine>,
    /// Said while an operator's rollback is rolling out; empty otherwise.
    pub rollback: String,
    /// The deployments but `default` (whose rollout is the bundle's above).
    pub deployments: Vec<DeploymentView>,
    /// Whether the fleet requires a second operator's approval of changes that move
    /// agents.
    pub approval_required: bool,
    /// The changes waiting for approval, oldest first.
    pub approvals: Vec<ApprovalView>,
}

/// A change waiting for approval, as the rollouts page shows it, with the buttons the
/// person signed in may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalView {
    pub id: i64,
    pub action: String,
    /// What it names (a release, a deployment, a group), in words.
    pub what: String,
    pub requested_by: String,
    pub asked: String,
    pub expires: String,
    /// Approve is shown: an operator who did not ask for it.
    pub can_approve: bool,
    /// Reject is shown (read `Withdraw` by the one who asked).
    pub can_reject: bool,
    pub own: bool,
}

impl ApprovalView {
    /// The waiting changes among `all` at `now_ms`, seen by `who` whose role
    /// `may_change` or not.
    pub fn waiting(
        all: &[agent_fleet::approvals::Approval],
        who: &str,
        may_change: bool,
        now_ms: i64,
    ) -> Vec<Self> {
        all.iter()
            .filter(|a| a.state_at(now_ms) == agent_fleet::approvals::State::AwaitingApproval)
            .map(|a| {
                let own = a.requested_by == who;
                let what = ["release", "deployment", "group", "selector"]
                    .iter()
                    .filter_map(|k| {
                        a.subject
                            .get(*k)
                            .and_then(serde_json::Value::as_str)
                            .map(|v| format!("{k} {v}"))
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                Self {
                    id: a.id,
                    action: a.action.clone(),
                    what,
                    requested_by: a.requested_by.clone(),
                    asked: utc(a.requested_at as f64 / 1000.0),
                    expires: utc(a.expires_at as f64 / 1000.0),
                    can_approve: may_change && !own,
                    can_reject: may_change,
                    own,
                }
            })
            .collect()
    }
}

/// A deployment on the rollouts page: what it selects, its release, its rollout.
#[derive(Debug, Clone)]
pub struct DeploymentView {
    pub name: String,
    pub selector: String,
    pub release: String,
    pub priority: i64,
    pub rollout: Option<RolloutView>,
}

impl DeploymentView {
    pub fn new(
        d: &agent_fleet::deployments::Deployment,
        rollout: Option<&super::source::Rollout>,
        now: i64,
    ) -> Self {
        Self {
            name: d.name.clone(),
            selector: d.selector_text.clone(),
            release: d.release.clone().unwrap_or_default(),
            priority: d.priority,
            rollout: rollout.map(|r| {
                let mut view = RolloutView::new(r, now);
                view.actions = format!("/rollouts/deployment/{}", d.name);
                view
            }),
        }
    }
}

/// One published release, as text for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseLine {
    pub id: String,
    pub kind: &'static str,
    pub when: String,
    pub by: String,
    pub platforms: String,
    pub current: bool,
}

impl ReleaseLine {
    pub fn all(history: &[agent_fleet::releases::HistoryEntry]) -> Vec<Self> {
        history
            .iter()
            .enumerate()
            .map(|(i, h)| Self {
                id: h.release.id.clone(),
                kind: h.kind.as_str(),
                when: utc(h.at as f64 / 1000.0),
                by: h.who.clone(),
                platforms: h
                    .release
                    .files
                    .iter()
                    .map(|f| f.platform.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                current: i == 0,
            })
            .collect()
    }
}

/// What the page says while an operator's rollback rolls out: the current release is a
/// rollback and the bundle's rollout of it is under way.
pub fn rollback_note(
    history: &[agent_fleet::releases::HistoryEntry],
    rollout: Option<&RolloutView>,
) -> String {
    let (Some(current), Some(r)) = (history.first(), rollout) else {
        return String::new();
    };
    if current.kind != agent_fleet::releases::Kind::Rollback
        || r.version != current.release.id
        || r.state == "completed"
    {
        return String::new();
    }
    format!(
        "Rolling back to {} (by {}, {}): agents that keep it switch back without downloading.",
        current.release.id,
        current.who,
        utc(current.at as f64 / 1000.0)
    )
}

impl RolloutsPage {
    pub fn with_releases(mut self, history: &[agent_fleet::releases::HistoryEntry]) -> Self {
        self.rollback = rollback_note(history, self.rollout.as_ref());
        self.releases = ReleaseLine::all(history);
        self
    }

    pub fn with_deployments(mut self, deployments: Vec<DeploymentView>) -> Self {
        self.deployments = deployments;
        self
    }

    pub fn with_windows(mut self, windows: Vec<super::windows::WindowView>) -> Self {
        self.windows = windows;
        self
    }

    pub fn with_approvals(mut self, required: bool, approvals: Vec<ApprovalView>) -> Self {
        self.approval_required = required;
        self.approvals = approvals;
        self
    }

    pub fn new(
        frame: Frame,
        rollout: Option<RolloutView>,
        configs: Vec<ConfigView>,
        message: &str,
    ) -> Self {
        Self {
            frame,
            message: message.to_owned(),
            rollout,
            configs,
            windows: Vec::new(),
            releases: Vec::new(),
            rollback: String::new(),
            deployments: Vec::new(),
            approval_required: false,
            approvals: Vec::new(),
        }
    }
}

/// One named token on `/tokens` (an admin's view): never the token itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenLine {
    pub name: String,
    pub role: String,
    pub created: String,
    pub last_used: String,
    pub expires: String,
    /// Where its Revoke button posts.
    pub revoke: String,
}

#[derive(Template)]
#[template(path = "tokens.html")]
pub struct TokensPage {
    /// The layout's: title, CSRF token, version, the time.
    pub frame: Frame,
    /// Who is signed in, and their role: all a viewer or an operator sees here.
    pub me: String,
    pub my_role: &'static str,
    /// The tokens and the form to make one are an admin's.
    pub admin: bool,
    pub tokens: Vec<TokenLine>,
    pub message: String,
    /// A token just made, shown this once; empty otherwise.
    pub new_name: String,
    pub new_token: String,
}

impl TokensPage {
    pub fn new(
        frame: Frame,
        me: &str,
        role: agent_fleet::operators::Role,
        tokens: &[agent_fleet::operators::TokenInfo],
        now_ms: i64,
    ) -> Self {
        let admin = role.may(agent_fleet::operators::Action::ManageTokens);
        let ms = |t: i64| utc(t as f64 / 1000.0);
        let tokens = if admin {
            tokens
                .iter()
                .map(|t| TokenLine {
                    name: t.name.clone(),
                    role: t.role.clone(),
                    created: ms(t.created_at),
                    last_used: t.last_used_at.map_or_else(|| "never".to_owned(), ms),
                    expires: match t.expires_at {
                        None => "never".to_owned(),
                        Some(at) if agent_fleet::operators::expired(Some(at), now_ms) => {
                            format!("lapsed {}", ms(at))
                        }
                        Some(at) => ms(at),
                    },
                    revoke: format!("/tokens/{}/revoke", encode(&t.name)),
                })
                .collect()
        } else {
            Vec::new()
        };
        Self {
            frame,
            me: me.to_owned(),
            my_role: role.as_str(),
            admin,
            tokens,
            message: String::new(),
            new_name: String::new(),
            new_token: String::new(),
        }
    }

    pub fn with_message(mut self, message: &str) -> Self {
        self.message = message.to_owned();
        self
    }

    pub fn with_new_token(mut self, name: &str, token: String) -> Self {
        self.new_name = name.to_owned();
        self.new_token = token;
        self
    }
}

/// Audit entries per page of `/audit`.
pub const AUDIT_PER_PAGE: i64 = 100;

/// One line of `/audit`; every field is text someone else chose (names, details).
#[derive(Debug, Clone)]
pub struct AuditLine {
    pub at: String,
    pub who: String,
    pub address: String,
    pub action: String,
    pub outcome: String,
    pub details: String,
}

#[derive(Template)]
#[template(path = "audit.html")]
pub struct AuditPage {
    /// The layout's: title, CSRF token, version, the time.
    pub frame: Frame,
    pub who: String,
    pub action: String,
    pub target: String,
    pub total: i64,
    /// `1 entry`, `2 entries`.
    pub total_words: String,
    pub page: i64,
    pub prev: String,
    pub next: String,
    pub lines: Vec<AuditLine>,
}

impl AuditPage {
    pub fn new(
        frame: Frame,
        filter: &agent_fleet::audit::Filter,
        entries: &[agent_fleet::audit::Entry],
        total: i64,
    ) -> Self {
        let who = filter.who.clone().unwrap_or_default();
        let action = filter.action.clone().unwrap_or_default();
        let target = filter.target.clone().unwrap_or_default();
        let href = |page: i64| {
            format!(
                "/audit?who={}&action={}&target={}&page={page}",
                encode(&who),
                encode(&action),
                encode(&target)
            )
        };
        let last = (total + AUDIT_PER_PAGE - 1) / AUDIT_PER_PAGE;
        Self {
            frame,
            prev: if filter.page > 1 {
                href(filter.page - 1)
            } else {
                String::new()
            },
            next: if filter.page < last {
                href(filter.page + 1)
            } else {
                String::new()
            },
            who,
            action,
            target,
            total,
            total_words: super::words::count(total, "entry", "entries"),
            page: filter.page,
            lines: entries
                .iter()
                .map(|e| AuditLine {
                    at: utc(e.at as f64 / 1000.0),
                    who: e.who.clone(),
                    address: e.address.clone(),
                    action: e.action.clone(),
                    outcome: e.outcome.clone(),
                    details: super::words::audit_details(&e.details),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn frame() -> Frame {
        Frame::new("Agents", "the-csrf", 1_000)
    }

    fn token(name: &str, expires_at: Option<i64>) -> agent_fleet::operators::TokenInfo {
        agent_fleet::operators::TokenInfo {
            name: name.into(),
            role: "operator".into(),
            created_at: 0,
            last_used_at: None,
            expires_at,
        }
    }

    #[test]
    fn only_an_admin_sees_the_tokens_and_a_lapsed_one_says_so() {
        use agent_fleet::operators::Role;
        let tokens = [token("<b>x</b>", Some(500)), token("bob", None)];
        let admin = TokensPage::new(frame(), "ops", Role::Admin, &tokens, 1_000);
        assert!(admin.admin);
        assert!(
            admin.tokens[0].expires.starts_with("lapsed"),
            "{:?}",
            admin.tokens
        );
        assert_eq!(admin.tokens[1].expires, "never");
        assert_eq!(admin.tokens[0].revoke, "/tokens/%3Cb%3Ex%3C%2Fb%3E/revoke");
        let html = admin.render().unwrap();
        assert!(
            !html.contains("<b>x</b>")
                && (html.contains("&lt;b&gt;x") || html.contains("&#60;b&#62;x")),
            "escaped"
        );
        for role in [Role::Viewer, Role::Operator] {
            let page = TokensPage::new(frame(), "vera", role, &tokens, 1_000);
            assert!(!page.admin && page.tokens.is_empty());
            let html = page.render().unwrap();
            assert!(html.contains("vera") && html.contains(role.as_str()));
            assert!(
                !html.contains("bob") && !html.contains("form method=\"post\" action=\"/tokens\"")
            );
        }
    }

    #[test]
    fn a_waiting_change_offers_approve_to_others_and_withdraw_to_the_one_who_asked() {
        let waiting = agent_fleet::approvals::Approval {
            id: 3,
            action: "config.push".into(),
            subject: serde_json::json!({ "group": "web", "files": ["a.conf"] }),
            payload: serde_json::json!({}),
            release: None,
            requested_by: "alice".into(),
            requested_at: 0,
            expires_at: 10_000,
            state: agent_fleet::approvals::State::AwaitingApproval,
            decided_by: None,
            decided_at: None,
            reason: None,
        };
        let all = [waiting.clone()];
        let bob = ApprovalView::waiting(&all, "bob", true, 1_000);
        assert_eq!(
            (bob[0].can_approve, bob[0].can_reject, bob[0].own),
            (true, true, false)
        );
        assert_eq!(bob[0].what, "group web");
        let alice = ApprovalView::waiting(&all, "alice", true, 1_000);
        assert_eq!((alice[0].can_approve, alice[0].can_reject), (false, true));
        let viewer = ApprovalView::waiting(&all, "vera", false, 1_000);
        assert_eq!(
            (viewer[0].can_approve, viewer[0].can_reject),
            (false, false)
        );
        assert!(
            ApprovalView::waiting(&all, "bob", true, 10_000).is_empty(),
            "lapsed"
        );
    }

    fn hostile() -> Agent {
        Agent {
            id: "id/<b>".into(),
            name: "<script>alert(1)</script>".into(),
            version: "1.0.0\"><img src=x onerror=alert(1)>".into(),
            update_status: Some("INSTALL_FAILED".into()),
            update_error: Some("<script>document.cookie</script>".into()),
            last_contact: 1_000,
            ..Agent::default()
        }
    }

    #[test]
    fn everything_an_agent_said_is_escaped() {
        let agents = vec![hostile()];
        let query = AgentQuery {
            page: 1,
            ..AgentQuery::default()
        };
        let p = super::super::query::page(&agents, &query, Duration::from_secs(30), 1_000);
        let html = AgentsPage::new(
            frame(),
            query.clone(),
            Choices::of(&agents),
            &p,
            &agents,
            Duration::from_secs(30),
            1_000,
        )
        .render()
        .unwrap();
        assert!(!html.contains("<script>"), "{html}");
        assert!(!html.contains("<img"), "{html}");
        assert!(
            html.contains("&#60;script&#62;alert(1)&#60;/script&#62;")
                || html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
            "{html}"
        );
        assert!(html.contains("href=\"/agents/id%2F%3Cb%3E\""), "{html}");
    }

    #[test]
    fn a_deployment_shows_its_selector_release_and_its_own_buttons() {
        let r = Rollout {
            version: "2.0.1+3".into(),
            state: "soaking".into(),
            wave: 1,
            ..Rollout::default()
        };
        let prod = agent_fleet::deployments::Deployment {
            name: "prod".into(),
            selector_text: "env=prod,region in (<eu>)".into(),
            selector: agent_protocol::selector::Selector::default(),
            release: Some("2.0.1+3".into()),
            priority: 10,
            policy: None,
            created_at: 0,
            updated_at: 0,
        };
        let html = RolloutsPage::new(frame(), None, Vec::new(), "")
            .with_deployments(vec![DeploymentView::new(&prod, Some(&r), 1_000)])
            .render()
            .unwrap();
        assert!(html.contains("id=\"deployment-prod\""), "{html}");
        assert!(html.contains("release 2.0.1+3 · priority 10"), "{html}");
        assert!(
            html.contains("action=\"/rollouts/deployment/prod/halt\""),
            "{html}"
        );
        // A selector is text on the page.
        assert!(!html.contains("(<eu>)"), "{html}");
    }

    #[test]
    fn forms_carry_the_sessions_csrf_token() {
        let r = Rollout {
            version: "2.0.0".into(),
            state: "running".into(),
            wave: 1,
            ..Rollout::default()
        };
        let html = RolloutsPage::new(frame(), Some(RolloutView::new(&r, 1_000)), Vec::new(), "")
            .render()
            .unwrap();
        assert_eq!(
            html.matches("name=\"csrf\" value=\"the-csrf\"").count(),
            3,
            "{html}"
        );
        assert!(html.contains(">Halt</button>") && html.contains(">Advance</button>"));
        assert!(!html.contains(">Resume</button>"));
    }

    #[test]
    fn the_history_shows_each_release_and_a_rollback_under_way() {
        use agent_fleet::releases::{FileRecord, HistoryEntry, Kind, ReleaseRecord};
        let entry = |id: &str, kind, who: &str| HistoryEntry {
            seq: 1,
            kind,
            at: 1_000_000,
            who: who.into(),
            release: ReleaseRecord {
                id: id.into(),
                identity: "0".repeat(64),
                files: vec![FileRecord {
                    name: format!("agent-bundle-{id}"),
                    platform: "x86_64-unknown-linux-gnu".into(),
                    sha256: "0".repeat(64),
                    size: 1,
                    signature: String::new(),
                }],
                msi: None,
            },
        };
        let history = vec![
            entry("1.0.0+1", Kind::Rollback, "<script>x</script>"),
            entry("2.0.0+2", Kind::Publish, "ops"),
        ];
        let running = Rollout {
            version: "1.0.0+1".into(),
            state: "running".into(),
            wave: 1,
            ..Rollout::default()
        };
        let html = RolloutsPage::new(
            frame(),
            Some(RolloutView::new(&running, 1_000)),
            Vec::new(),
            "",
        )
        .with_releases(&history)
        .render()
        .unwrap();
        assert!(html.contains("Rolling back to 1.0.0+1"), "{html}");
        assert!(
            html.contains("<strong>1.0.0+1</strong> (current)"),
            "{html}"
        );
        assert!(html.contains(">2.0.0+2</td>"), "{html}");
        assert!(!html.contains("<script>x"), "{html}");
        let done = Rollout {
            state: "completed".into(),
            ..running
        };
        assert_eq!(
            rollback_note(&history, Some(&RolloutView::new(&done, 1_000))),
            ""
        );
        let html = RolloutsPage::new(frame(), None, Vec::new(), "")
            .with_releases(&[])
            .render()
            .unwrap();
        assert!(html.contains("No release was published yet"), "{html}");
    }

    #[test]
    fn a_bundle_rollouts_waves_count_the_agents_with_no_bundle() {
        let r: Rollout = serde_json::from_value(serde_json::json!({
            "version": "2.0.0+2", "state": "completed", "reason": null, "wave": 2,
            "started_at": 1.0, "completed_at": 2.0, "events": [],
            "waves": [
                {"size": "1", "agents": 1, "installed": 1, "failed": 0, "timed_out": 0,
                    "pending": 0, "opened_at": 1.0, "completed_at": 1.5},
                {"size": "100%", "agents": 9, "installed": 2, "failed": 0, "timed_out": 0,
                    "no_bundle": 7, "pending": 0, "opened_at": 1.5, "completed_at": 2.0}
            ]
        }))
        .unwrap();
        let html = RolloutsPage::new(frame(), Some(RolloutView::new(&r, 1_000)), Vec::new(), "")
            .render()
            .unwrap();
        assert!(html.contains("<th title="), "{html}");
        assert!(html.contains(">No bundle</th>"), "{html}");
        // Wave 2: 9 agents, 2 done, 0 failed, 0 timed out, 7 with no bundle, 0 pending.
        assert!(
            html.contains(
                "<td class=\"num\">9</td><td class=\"num\">2</td><td class=\"num\">0</td><td class=\"num\">0</td><td class=\"num\">7</td><td class=\"num\">0</td>"
            ),
            "{html}"
        );
    }

    #[test]
    fn a_config_rollouts_buttons_post_to_its_group() {
        let sets: ConfigSets = serde_json::from_value(serde_json::json!({"sets": [{
            "group": "a b/c", "hash": "0123456789abcdef", "created_at": 1.0,
            "files": ["x.conf"], "applied": 1, "applying": 0, "failed": 0, "timed_out": 0,
            "rollout": {"state": "running", "reason": null, "wave": 1, "started_at": 1.0,
                "completed_at": null, "events": [],
                "waves": [{"size": "100%", "agents": 2, "applied": 1, "failed": 0,
                    "timed_out": 0, "pending": 1, "opened_at": 1.0, "completed_at": null}]}
        }]}))
        .unwrap();
        let configs = ConfigView::all(&sets, 1_000);
        assert_eq!(configs[0].hash, "0123456789ab");
        let html = RolloutsPage::new(frame(), None, configs, "")
            .render()
            .unwrap();
        assert!(
            html.contains("action=\"/rollouts/config/a%20b%2Fc/halt\""),
            "{html}"
        );
        assert!(html.contains(">Advance</button>"));
        // A configuration is for every platform: no such column.
        assert!(!html.contains("No bundle"), "{html}");
    }

    #[test]
    fn a_halted_rollout_offers_resume_only() {
        let r = Rollout {
            state: "halted".into(),
            ..Rollout::default()
        };
        let html = RolloutsPage::new(frame(), Some(RolloutView::new(&r, 1_000)), Vec::new(), "")
            .render()
            .unwrap();
        assert!(html.contains(">Resume</button>"));
        assert!(!html.contains(">Halt</button>") && !html.contains(">Advance</button>"));
    }

    #[test]
    fn signed_out_pages_have_no_navigation_and_a_password_field() {
        let html = SignIn::new(Frame::new("Sign in", "", 0), "nonce".into(), "")
            .render()
            .unwrap();
        assert!(html.contains("<form method=\"post\" action=\"/signin\">"));
        assert!(html.contains("type=\"password\" id=\"token\" name=\"token\""));
        assert!(html.contains("name=\"csrf\" value=\"nonce\""));
        assert!(!html.contains("/signout"));
    }

    #[test]
    fn paging_links_keep_the_filters() {
        let agents: Vec<Agent> = (0..120)
            .map(|i| Agent {
                id: format!("{i:03}"),
                version: "1 2".into(),
                last_contact: 1_000,
                ..Agent::default()
            })
            .collect();
        let query = AgentQuery {
            version: "1 2".into(),
            page: 2,
            ..AgentQuery::default()
        };
        let p = super::super::query::page(&agents, &query, Duration::from_secs(30), 1_000);
        let page = AgentsPage::new(
            frame(),
            query,
            Choices::of(&agents),
            &p,
            &[],
            Duration::from_secs(30),
            1_000,
        );
        assert_eq!(page.prev, "/agents?version=1%202");
        assert_eq!(page.next, "/agents?version=1%202&page=3");
    }
}
