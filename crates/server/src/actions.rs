//! Operator actions: every change an operator makes to an agent or a rollout, as one
//! operation of the model — who, what, on what — that ends done or refused, and is
//! logged and audited here, in one place, whichever edge asked.
//!
//! The admin API and the fleet page only translate: they say who is asking and what,
//! call [`perform`], and turn its answer into a status code or a page. A refusal (a
//! role that may not, an unknown agent, a rollout that cannot take the step) is
//! recorded before it is returned, so no edge can forget to. The command line goes
//! through the admin API. This module knows no HTTP.

use agent_fleet::FleetError;
use agent_fleet::audit::{Change, Outcome};
use agent_fleet::commands;
use agent_fleet::db::{Credentials, Revocation};
use agent_fleet::deployments;
use agent_fleet::labels::{self, Edit, Labels};
use agent_fleet::operators::{Action as Permission, Role};
use agent_fleet::rollout::Refusal;

use crate::state::Shared;

/// Who asks, from where, and through which edge (written into the audit log).
#[derive(Debug, Clone)]
pub struct Actor {
    pub name: String,
    pub role: Role,
    /// The client's address; empty when unknown.
    pub address: String,
    pub via: Via,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    Api,
    Page,
}

/// What a rollout step applies to: the bundle's rollout (`default`'s), another
/// deployment's, or a group's configuration set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Bundle,
    Deployment(String),
    Config(String),
}

/// The buttons of a rollout, the same for the bundle's and a configuration set's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Halt { reason: Option<String> },
    Resume,
    Advance,
}

/// One thing an operator asks for.
#[derive(Debug, Clone)]
pub enum Act {
    /// The agent lost its credentials; its next register gets new ones.
    ForgetToken {
        agent: String,
    },
    /// A lost machine: its credentials are refused from now on.
    RemoveAgent {
        agent: String,
    },
    /// The agent's update locks no longer hold off the release the fleet rolls out.
    OverrideLocks {
        agent: String,
    },
    /// The server's own labels of the agent.
    Labels {
        agent: String,
        edit: Edit,
    },
    Rollout {
        target: Target,
        step: Step,
    },
    /// A deployment made, changed or removed (see [`agent_fleet::deployments`]).
    Deployment(DeploymentAct),
    /// Restart the agent, or only its workload, at its next contact (see
    /// [`agent_fleet::commands`]).
    Restart {
        agent: String,
        workload: bool,
    },
    /// Offer the agent a new credential; the old one is refused once it proves the new.
    RotateCredentials {
        agent: String,
    },
    /// Offer the agent another server URL; it keeps it only if it answers there.
    Move {
        agent: String,
        to: String,
    },
}

#[derive(Debug, Clone)]
pub enum DeploymentAct {
    Create(deployments::NewDeployment),
    Set {
        name: String,
        change: deployments::Change,
    },
    Remove {
        name: String,
    },
}

/// What a done action changed, for the edge's answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Done {
    TokenForgotten {
        next: &'static str,
    },
    Removed,
    LocksOverridden {
        release: String,
    },
    Labelled {
        server_labels: Labels,
        labels: Labels,
    },
    Stepped,
    /// The deployment as it is now (as it was, for a removal).
    Deployment(Box<deployments::Deployment>),
    /// A command asked of an agent, carried at its next contact.
    Commanded(Box<agent_fleet::commands::Command>),
}

/// Why an action was not done, in words for the operator (the edge picks the status).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// The actor's role may not do this.
    NotAllowed(String),
    /// No such agent.
    Unknown(String),
    /// The fleet as it stands does not allow it (a revoked id, a halted rollout, no
    /// bundle served).
    Conflict(String),
    /// What was asked is malformed (a label that is not a plain name).
    Invalid(String),
}

impl Refused {
    pub fn message(&self) -> &str {
        match self {
            Refused::NotAllowed(m)
            | Refused::Unknown(m)
            | Refused::Conflict(m)
            | Refused::Invalid(m) => m,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    #[error("{}", .0.message())]
    Refused(Refused),
    /// The fleet database failed; nothing is recorded as done.
    #[error(transparent)]
    Fleet(#[from] FleetError),
}

impl Act {
    /// The action's name in the audit log (`agent.remove`, `rollout.halt`, …).
    pub fn name(&self) -> &'static str {
        match self {
            Act::ForgetToken { .. } => "agent.forget_token",
            Act::RemoveAgent { .. } => "agent.remove",
            Act::OverrideLocks { .. } => "agent.override_locks",
            Act::Labels { .. } => "agent.labels",
            Act::Rollout { target, step } => match (target, step) {
                (Target::Bundle, Step::Halt { .. }) => "rollout.halt",
                (Target::Bundle, Step::Resume) => "rollout.resume",
                (Target::Bundle, Step::Advance) => "rollout.advance",
                (Target::Config(_), Step::Halt { .. }) => "config.halt",
                (Target::Config(_), Step::Resume) => "config.resume",
                (Target::Config(_), Step::Advance) => "config.advance",
                (Target::Deployment(_), Step::Halt { .. }) => "deployment.halt",
                (Target::Deployment(_), Step::Resume) => "deployment.resume",
                (Target::Deployment(_), Step::Advance) => "deployment.advance",
            },
            Act::Deployment(DeploymentAct::Create(_)) => "deployment.create",
            Act::Deployment(DeploymentAct::Set { .. }) => "deployment.set",
            Act::Deployment(DeploymentAct::Remove { .. }) => "deployment.remove",
            Act::Restart { .. } => "agent.restart",
            Act::RotateCredentials { .. } => "agent.rotate_credentials",
            Act::Move { .. } => "agent.move",
        }
    }

    /// What the action is done to, as the audit log's details start.
    fn subject(&self) -> serde_json::Value {
        match self {
            Act::ForgetToken { agent }
            | Act::RemoveAgent { agent }
            | Act::OverrideLocks { agent }
            | Act::RotateCredentials { agent } => serde_json::json!({ "agent": agent }),
            Act::Restart { agent, workload } => {
                serde_json::json!({ "agent": agent, "workload": workload })
            }
            Act::Move { agent, to } => serde_json::json!({ "agent": agent, "to": to }),
            Act::Labels { agent, edit } => {
                serde_json::json!({ "agent": agent, "set": edit.set, "remove": edit.remove })
            }
            Act::Rollout { target, step } => {
                let mut details = match target {
                    Target::Bundle => serde_json::json!({}),
                    Target::Deployment(name) => serde_json::json!({ "deployment": name }),
                    Target::Config(group) => serde_json::json!({ "group": group }),
                };
                if let Step::Halt { reason } = step {
                    details["reason"] = serde_json::json!(reason);
                }
                details
            }
            Act::Deployment(DeploymentAct::Create(new)) => serde_json::json!({
                "deployment": new.name,
                "selector": new.selector,
                "release": new.release,
                "priority": new.priority,
            }),
            Act::Deployment(DeploymentAct::Set { name, change }) => serde_json::json!({
                "deployment": name,
                "selector": change.selector,
                "release": change.release,
                "priority": change.priority,
                "policy": change.policy.as_ref().map(agent_fleet::rollout::engine::plan_json),
            }),
            Act::Deployment(DeploymentAct::Remove { name }) => {
                serde_json::json!({ "deployment": name })
            }
        }
    }

    /// The words a refused role reads: what it may not do.
    fn verb(&self) -> &'static str {
        match self {
            Act::ForgetToken { .. } => "reset an agent's credentials",
            Act::RemoveAgent { .. } => "remove agents",
            Act::OverrideLocks { .. } => "override an agent's update locks",
            Act::Labels { .. } => "change an agent's labels",
            Act::Rollout { .. } => "halt, resume or advance a rollout",
            Act::Deployment(_) => "create, change or remove a deployment",
            Act::Restart { .. } => "restart an agent",
            Act::RotateCredentials { .. } => "rotate an agent's credentials",
            Act::Move { .. } => "move an agent to another server",
        }
    }
}

/// Does `act` for `actor`: checks the role, does it, logs it and records it in the
/// audit log, done or refused.
pub async fn perform(s: &Shared, actor: &Actor, act: Act) -> Result<Done, ActionError> {
    let mut details = act.subject();
    if actor.via == Via::Page {
        details["via"] = serde_json::json!("page");
    }
    let outcome = if actor.role.may(Permission::Change) {
        run(s, actor, &act).await?
    } else {
        Err(Refused::NotAllowed(format!(
            "refused: {} has the role {}, which may not {} ({}); ask an operator",
            actor.name,
            actor.role,
            act.verb(),
            act.name()
        )))
    };
    match outcome {
        Ok((done, more)) => {
            merge(&mut details, more);
            tracing::info!(by = %actor.name, via = ?actor.via, "{}: {}", act.name(), done_words(&act));
            record(s, actor, act.name(), Outcome::Done, details).await;
            Ok(done)
        }
        Err(refused) => {
            if let Refused::NotAllowed(_) = refused {
                details["role"] = serde_json::json!(actor.role.as_str());
                // The audit log has always said a role refusal as the API answers it.
                details["status"] = serde_json::json!(403);
            }
            details["reason"] = serde_json::json!(refused.message());
            tracing::warn!(by = %actor.name, via = ?actor.via, "{} refused: {}", act.name(), refused.message());
            record(s, actor, act.name(), Outcome::Refused, details).await;
            Err(ActionError::Refused(refused))
        }
    }
}

/// Anything the audit log should say beyond the subject (the release let through).
type Extra = serde_json::Value;

async fn run(
    s: &Shared,
    actor: &Actor,
    act: &Act,
) -> Result<Result<(Done, Extra), Refused>, FleetError> {
    let none = serde_json::Value::Null;
    Ok(match act {
        Act::ForgetToken { agent } => {
            // A revoked id stays revoked: forgetting its token would change nothing,
            // and an answer of "forgotten" would say otherwise.
            if let Credentials::Revoked(how) = s.fleet.db.credentials(agent).await? {
                return Ok(Err(Refused::Conflict(stays_revoked(agent, how))));
            }
            if !s.fleet.forget_token(agent).await? {
                return Ok(Err(unknown(agent)));
            }
            s.fleet
                .outage
                .remember_credentials(agent, &Credentials::None);
            let next = if s.enrollment_token.is_empty() {
                "the agent's next register (with a fresh data/agent-token, or none) gets new credentials"
            } else {
                "the agent's next register gets new credentials only if it presents this server's enrollment token (server.enrollment-token in its conf/agent.toml); until then the id is refused"
            };
            Ok((Done::TokenForgotten { next }, none))
        }
        Act::RemoveAgent { agent } => {
            if !s.fleet.revoke(agent, Revocation::Removed).await? {
                return Ok(Err(unknown(agent)));
            }
            Ok((Done::Removed, none))
        }
        Act::OverrideLocks { agent } => {
            if s.fleet.db.agent(agent).await?.is_none() {
                return Ok(Err(unknown(agent)));
            }
            let crate::store::Current::Ready(release) = s.store.current() else {
                return Ok(Err(Refused::Conflict(
                    "the server serves no bundle: there is no update to let through".into(),
                )));
            };
            // The release the fleet is told to run (the rollout's target).
            let release = release.version().to_string();
            s.fleet.override_locks(agent, &release).await?;
            s.fleet.rollouts.news().publish("update locks overridden");
            let extra = serde_json::json!({ "release": release });
            Ok((Done::LocksOverridden { release }, extra))
        }
        Act::Labels { agent, edit } => {
            let (before, after) = match s.fleet.db.set_server_labels(agent, edit).await {
                Ok(Some(changed)) => changed,
                Ok(None) => return Ok(Err(unknown(agent))),
                Err(FleetError::Invalid(why)) => return Ok(Err(Refused::Invalid(why))),
                Err(e) => return Err(e),
            };
            let stored = s.fleet.db.opamp_agent(agent).await?;
            let effective = s
                .fleet
                .db
                .agent(agent)
                .await?
                .map(|a| labels::of_agent(&a, stored.as_ref().map(|o| o.view.as_str())))
                .unwrap_or_default();
            let extra = serde_json::json!({ "before": before, "after": after });
            Ok((
                Done::Labelled {
                    server_labels: after,
                    labels: effective,
                },
                extra,
            ))
        }
        Act::Rollout { target, step } => {
            // The page's Halt has no reason field: its audit entry and the rollout say
            // where the halt came from.
            let page_reason = (actor.via == Via::Page).then_some("from the fleet page");
            let rollouts = match target {
                Target::Deployment(name) => match s.fleet.deployments.rollouts(name) {
                    Some(r) => r,
                    None => return Ok(Err(unknown_deployment(name))),
                },
                _ => std::sync::Arc::clone(&s.fleet.rollouts),
            };
            let configs = &s.fleet.configs;
            let result = match (target, step) {
                (Target::Bundle | Target::Deployment(_), Step::Halt { reason }) => {
                    rollouts.halt(reason.as_deref().or(page_reason)).await?
                }
                (Target::Bundle | Target::Deployment(_), Step::Resume) => rollouts.resume().await?,
                (Target::Bundle | Target::Deployment(_), Step::Advance) => {
                    rollouts.advance().await?
                }
                (Target::Config(group), Step::Halt { reason }) => {
                    configs
                        .halt(group, reason.as_deref().or(page_reason))
                        .await?
                }
                (Target::Config(group), Step::Resume) => configs.resume(group).await?,
                (Target::Config(group), Step::Advance) => configs.advance(group).await?,
            };
            let extra = match target {
                Target::Bundle | Target::Deployment(_) => rollouts
                    .current()
                    .map(|r| serde_json::json!({ "version": r.subject.version.to_string() }))
                    .unwrap_or_default(),
                Target::Config(_) => none,
            };
            result
                .map(|()| (Done::Stepped, extra))
                .map_err(|Refusal(why)| Refused::Conflict(why))
        }
        Act::Deployment(change) => {
            let db = &s.fleet.db;
            let result = match change {
                DeploymentAct::Create(new) => deployments::create(db, new).await,
                DeploymentAct::Set { name, change } => deployments::update(db, name, change)
                    .await
                    .map(|(_, after)| after),
                DeploymentAct::Remove { name } => deployments::remove(db, name).await,
            };
            let deployment = match result {
                Ok(d) => d,
                Err(FleetError::Invalid(why)) => return Ok(Err(Refused::Invalid(why))),
                Err(FleetError::Conflict(why)) => return Ok(Err(Refused::Conflict(why))),
                Err(FleetError::NotFound(why)) => return Ok(Err(Refused::Unknown(why))),
                Err(e) => return Err(e),
            };
            // Taken at once here; every other server within its next look.
            s.fleet.deployments.refresh().await?;
            Ok((Done::Deployment(Box::new(deployment)), none))
        }
        Act::Restart { agent, workload } => {
            let what = if *workload {
                commands::RESTART_WORKLOAD
            } else {
                commands::RESTART_AGENT
            };
            command(s, agent, commands::Kind::Restart, what).await?
        }
        Act::RotateCredentials { agent } => {
            command(s, agent, commands::Kind::RotateCredentials, "").await?
        }
        Act::Move { agent, to } => {
            if let Err(why) = check_endpoint(to) {
                return Ok(Err(Refused::Invalid(why)));
            }
            command(s, agent, commands::Kind::Move, to.trim_end_matches('/')).await?
        }
    })
}

/// Asks `kind` of `agent`; the audit log keeps the command's id, which the agent's
/// report names.
async fn command(
    s: &Shared,
    agent: &str,
    kind: commands::Kind,
    argument: &str,
) -> Result<Result<(Done, Extra), Refused>, FleetError> {
    if let Credentials::Revoked(how) = s.fleet.db.credentials(agent).await? {
        return Ok(Err(Refused::Conflict(format!(
            "agent {agent} {}; it takes no commands",
            match how {
                Revocation::Left => "left the fleet",
                Revocation::Removed => "was removed from the fleet",
            }
        ))));
    }
    Ok(
        match s.fleet.request_command(agent, kind, argument).await? {
            Some(c) => {
                let extra = serde_json::json!({ "command": c.id });
                Ok((Done::Commanded(Box::new(c)), extra))
            }
            None => Err(unknown(agent)),
        },
    )
}

/// A server URL an agent may be moved to: `http://` or `https://`, a host, no spaces.
pub fn check_endpoint(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or_else(|| format!("{url:?} is not an http:// or https:// URL"))?;
    let host = rest.split('/').next().unwrap_or_default();
    if host.is_empty()
        || url.len() > 2048
        || url.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "{url:?} is not a server URL agents can use (write http(s)://HOST[:PORT])"
        ));
    }
    Ok(())
}

fn unknown_deployment(name: &str) -> Refused {
    Refused::Unknown(format!(
        "no deployment {name:?}; list them with `update-server deployment list`"
    ))
}

fn unknown(agent: &str) -> Refused {
    Refused::Unknown(format!(
        "no agent {agent:?} is known; `update-server agents list` shows the fleet"
    ))
}

fn stays_revoked(agent: &str, how: Revocation) -> String {
    let what = match how {
        Revocation::Left => "left the fleet (agent uninstall)",
        Revocation::Removed => "was removed from the fleet",
    };
    format!(
        "agent {agent} {what} and its credentials stay revoked: there is no token to forget; install the agent on that machine again (it enrolls with a new id)"
    )
}

fn done_words(act: &Act) -> &'static str {
    match act {
        Act::ForgetToken { .. } => {
            "the agent's credentials are reset; its next register gets new ones"
        }
        Act::RemoveAgent { .. } => {
            "the agent is removed from the fleet; its credentials are revoked"
        }
        Act::OverrideLocks { .. } => "the agent's update locks are overridden",
        Act::Labels { .. } => "the agent's labels changed",
        Act::Rollout { .. } => "done",
        Act::Deployment(DeploymentAct::Create(_)) => "the deployment is made",
        Act::Deployment(DeploymentAct::Set { .. }) => "the deployment changed",
        Act::Deployment(DeploymentAct::Remove { .. }) => {
            "the deployment is removed; its agents follow the next that selects them"
        }
        Act::Restart { .. } => "the agent restarts at its next contact",
        Act::RotateCredentials { .. } => {
            "the agent is offered a new credential at its next contact"
        }
        Act::Move { .. } => "the agent is offered another server URL at its next contact",
    }
}

fn merge(details: &mut serde_json::Value, more: serde_json::Value) {
    if let (Some(into), serde_json::Value::Object(more)) = (details.as_object_mut(), more) {
        into.extend(more);
    }
}

/// Records what `actor` asked for and how it ended.
async fn record(
    s: &Shared,
    actor: &Actor,
    action: &str,
    outcome: Outcome,
    details: serde_json::Value,
) {
    let change = Change {
        who: &actor.name,
        address: &actor.address,
        action,
        outcome,
        details,
    };
    audit(s, &change).await;
}

/// Appends to the audit log, for every edge. A change already made is not undone when
/// its record cannot be written (the database went away in between): the log says so
/// instead.
pub async fn audit(s: &Shared, change: &Change<'_>) {
    if let Err(e) = s.fleet.audit().record(change).await {
        tracing::error!(
            who = change.who,
            action = change.action,
            "cannot write the audit log: {e}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_action_has_the_audit_name_the_api_always_used() {
        let agent = || "a1".to_owned();
        let names: Vec<_> = [
            Act::ForgetToken { agent: agent() },
            Act::RemoveAgent { agent: agent() },
            Act::OverrideLocks { agent: agent() },
            Act::Labels {
                agent: agent(),
                edit: Edit::default(),
            },
            Act::Rollout {
                target: Target::Bundle,
                step: Step::Halt { reason: None },
            },
            Act::Rollout {
                target: Target::Config("web".into()),
                step: Step::Advance,
            },
            Act::Restart {
                agent: agent(),
                workload: true,
            },
            Act::RotateCredentials { agent: agent() },
            Act::Move {
                agent: agent(),
                to: "http://b".into(),
            },
        ]
        .iter()
        .map(Act::name)
        .collect();
        assert_eq!(
            names,
            [
                "agent.forget_token",
                "agent.remove",
                "agent.override_locks",
                "agent.labels",
                "rollout.halt",
                "config.advance",
                "agent.restart",
                "agent.rotate_credentials",
                "agent.move"
            ]
        );
    }

    #[test]
    fn the_subject_names_the_agent_or_group_and_a_halts_reason() {
        let halt = Act::Rollout {
            target: Target::Config("web".into()),
            step: Step::Halt {
                reason: Some("disk".into()),
            },
        };
        assert_eq!(
            halt.subject(),
            serde_json::json!({ "group": "web", "reason": "disk" })
        );
        let remove = Act::RemoveAgent { agent: "a1".into() };
        assert_eq!(remove.subject(), serde_json::json!({ "agent": "a1" }));
    }

    #[test]
    fn an_agent_is_moved_only_to_a_server_url() {
        assert!(check_endpoint("http://10.0.0.2:7080").is_ok());
        assert!(check_endpoint("https://updates.example.com/").is_ok());
        for bad in [
            "ftp://x",
            "http://",
            "updates.example.com",
            "http://a b",
            "https:///path",
        ] {
            assert!(check_endpoint(bad).is_err(), "{bad}");
        }
    }
}
