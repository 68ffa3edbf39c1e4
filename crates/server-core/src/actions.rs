//! Operator actions: every change an operator makes to an agent or a rollout, as one
//! operation of the model — who, what, on what — that ends done or refused, and is
//! logged and audited here, in one place, whichever edge asked.
//!
//! The admin API and the fleet page only translate: they say who is asking and what,
//! call [`perform`], and turn its answer into a status code or a page. A refusal (a
//! role that may not, an unknown agent, a rollout that cannot take the step) is
//! recorded before it is returned, so no edge can forget to. The command line goes
//! through the admin API. This module knows no HTTP.
//!
//! Approvals live here too. While the fleet requires approval, an action that moves
//! agents (a release published or rolled back, a deployment's release or selector set,
//! a configuration set pushed) is not done but *parked* ([`Done::Parked`], audited as
//! `approval.request`) with what applying it needs ([`Parked`]); another operator's
//! [`Act::Decide`] then applies it here, as it would have been applied at once, or
//! rejects it. The rules of who may decide and when a change lapses are the fleet
//! model's ([`agent_fleet::approvals`]).

use std::collections::BTreeMap;

use agent_fleet::FleetError;
use agent_fleet::approvals::{self, Approval, Decision, NewApproval};
use agent_fleet::audit::{Change, Outcome};
use agent_fleet::commands;
use agent_fleet::config::guard::Consent;
use agent_fleet::db::now_ms;
use agent_fleet::db::{Credentials, Revocation};
use agent_fleet::deployments;
use agent_fleet::labels::{Edit, Labels};
use agent_fleet::operators::{Action as Permission, Role};
use agent_fleet::policy;
use agent_fleet::releases::{HistoryEntry, Kind};
use agent_fleet::rollout::Refusal;
use serde::{Deserialize, Serialize};

use crate::releases::ReleaseError;
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
    /// A deployment's maintenance window added or removed (see [`agent_fleet::policy`]).
    Maintenance(MaintenanceAct),
    /// A kept release (checked and kept by the edge that received it) made the fleet's
    /// current one: `release publish` (`Kind::Publish`) or `release rollback`.
    Release {
        id: String,
        kind: Kind,
        /// The files uploaded (a publish) or signed again (a rollback), for the record.
        files: Vec<String>,
    },
    /// A configuration set for a group's agents.
    ConfigPush {
        group: String,
        files: BTreeMap<String, String>,
        consent: Consent,
    },
    /// A change waiting for approval, approved (and applied) or rejected.
    Decide {
        id: i64,
        decision: Decision,
        reason: Option<String>,
    },
    /// The fleet's approval switch (an admin's).
    RequireApproval {
        on: bool,
    },
    /// A person's named token (an admin's): made, shown once.
    TokenCreate {
        name: String,
        role: agent_fleet::operators::Role,
        /// Unix milliseconds; `None`: it never lapses.
        expires_at: Option<i64>,
    },
    /// A named token refused from now on, on every server (an admin's).
    TokenRevoke {
        name: String,
    },
    /// Where the agents a selector matches export their own telemetry (see
    /// [`agent_fleet::telemetry`]).
    TelemetrySet(agent_fleet::telemetry::NewDestination),
    /// The destination of a selector forgotten: its agents stop exporting there.
    TelemetryClear {
        selector: String,
    },
}

#[derive(Debug, Clone)]
pub enum MaintenanceAct {
    Add(policy::NewWindow),
    Remove { id: i64 },
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
    /// The window added (or removed).
    Window(Box<policy::StoredWindow>),
    /// The release the fleet's current one now.
    Release(Box<HistoryEntry>),
    ConfigPushed(agent_fleet::config::Pushed),
    /// Nothing changed yet: the change waits for another operator's approval.
    Parked(Box<Approval>),
    /// A waiting change decided: the approval as it stands now and, when approved, what
    /// applying it did.
    Decided {
        approval: Box<Approval>,
        applied: Option<Box<Done>>,
    },
    ApprovalRequired {
        on: bool,
    },
    /// The new token, to be shown this once and never again (nor logged, nor recorded).
    TokenCreated {
        token: String,
    },
    TokenRevoked,
    /// A command asked of an agent, carried at its next contact.
    Commanded(Box<agent_fleet::commands::Command>),
    /// The telemetry destination as it is now (as it was, for a clear).
    Telemetry(Box<agent_fleet::telemetry::Destination>),
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
    /// The server could not do it (a release's files could not be written); its log
    /// says why.
    #[error("{0}")]
    Failed(String),
}

/// What applying a parked change needs, stored with it (`approvals.payload`): the act
/// itself, but for a release's bytes, which stay with the kept release it names.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "act", rename_all = "kebab-case")]
pub enum Parked {
    Release {
        id: String,
        rollback: bool,
        files: Vec<String>,
    },
    ConfigPush {
        group: String,
        files: BTreeMap<String, String>,
        consent: Consent,
    },
    DeploymentCreate {
        new: deployments::NewDeployment,
    },
    DeploymentSet {
        name: String,
        change: deployments::Change,
    },
}

impl Parked {
    /// The payload of an act that moves agents; `None` for any other.
    pub fn of(act: &Act) -> Option<Parked> {
        Some(match act {
            Act::Release { id, kind, files } => Parked::Release {
                id: id.clone(),
                rollback: *kind == Kind::Rollback,
                files: files.clone(),
            },
            Act::ConfigPush {
                group,
                files,
                consent,
            } => Parked::ConfigPush {
                group: group.clone(),
                files: files.clone(),
                consent: *consent,
            },
            Act::Deployment(DeploymentAct::Create(new)) => {
                Parked::DeploymentCreate { new: new.clone() }
            }
            Act::Deployment(DeploymentAct::Set { name, change }) => Parked::DeploymentSet {
                name: name.clone(),
                change: change.clone(),
            },
            _ => return None,
        })
    }

    /// The act to apply.
    pub fn into_act(self) -> Act {
        match self {
            Parked::Release {
                id,
                rollback,
                files,
            } => Act::Release {
                id,
                kind: if rollback {
                    Kind::Rollback
                } else {
                    Kind::Publish
                },
                files,
            },
            Parked::ConfigPush {
                group,
                files,
                consent,
            } => Act::ConfigPush {
                group,
                files,
                consent,
            },
            Parked::DeploymentCreate { new } => Act::Deployment(DeploymentAct::Create(new)),
            Parked::DeploymentSet { name, change } => {
                Act::Deployment(DeploymentAct::Set { name, change })
            }
        }
    }
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
            Act::Maintenance(MaintenanceAct::Add(_)) => "maintenance.add",
            Act::Maintenance(MaintenanceAct::Remove { .. }) => "maintenance.remove",
            Act::Release {
                kind: Kind::Publish,
                ..
            } => "release.publish",
            Act::Release {
                kind: Kind::Rollback,
                ..
            } => "release.rollback",
            Act::ConfigPush { .. } => "config.push",
            Act::Decide {
                decision: Decision::Approve,
                ..
            } => "approval.approve",
            Act::Decide {
                decision: Decision::Reject,
                ..
            } => "approval.reject",
            Act::RequireApproval { .. } => "approval.require",
            Act::TokenCreate { .. } => "token.create",
            Act::TokenRevoke { .. } => "token.revoke",
            Act::TelemetrySet(_) => "telemetry.set",
            Act::TelemetryClear { .. } => "telemetry.clear",
        }
    }

    /// Whether, while the fleet requires approval, the action waits for another
    /// operator's: it moves agents (a release, a deployment's release or selector, a
    /// configuration set).
    pub fn moves_agents(&self) -> bool {
        match self {
            Act::Release { .. } | Act::ConfigPush { .. } => true,
            Act::Deployment(DeploymentAct::Create(_)) => true,
            Act::Deployment(DeploymentAct::Set { change, .. }) => {
                change.release.is_some() || change.selector.is_some()
            }
            _ => false,
        }
    }

    /// What the actor's role must allow.
    fn permission(&self) -> Permission {
        match self {
            Act::RequireApproval { .. } | Act::TokenCreate { .. } | Act::TokenRevoke { .. } => {
                Permission::ManageTokens
            }
            _ => Permission::Change,
        }
    }

    /// The kept release the action names, if any (a parked change keeps it from pruning).
    fn release(&self) -> Option<&str> {
        match self {
            Act::Release { id, .. } => Some(id),
            Act::Deployment(DeploymentAct::Create(new)) => Some(&new.release),
            Act::Deployment(DeploymentAct::Set { change, .. }) => change.release.as_deref(),
            _ => None,
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
            Act::Maintenance(MaintenanceAct::Add(w)) => serde_json::json!({
                "deployment": w.deployment,
                "groups": w.groups,
                "days": w.days,
                "start": w.start,
                "duration_secs": w.duration_secs,
                "timezone": w.timezone,
                "catch_up": w.catch_up,
            }),
            Act::Maintenance(MaintenanceAct::Remove { id }) => serde_json::json!({ "id": id }),
            Act::Release { id, files, .. } => {
                serde_json::json!({ "release": id, "files": files })
            }
            Act::ConfigPush { group, files, .. } => {
                let names: Vec<&String> = files.keys().collect();
                serde_json::json!({ "group": group, "files": names })
            }
            Act::Decide { id, reason, .. } => {
                let mut details = serde_json::json!({ "approval": id });
                if let Some(reason) = reason {
                    details["reason"] = serde_json::json!(reason);
                }
                details
            }
            Act::RequireApproval { on } => serde_json::json!({ "required": on }),
            Act::TokenCreate {
                name,
                role,
                expires_at,
            } => {
                let mut details = serde_json::json!({ "name": name, "role": role.as_str() });
                // Said only when it lapses: a token without one is as it always was.
                if let Some(at) = expires_at {
                    details["expires_at"] = serde_json::json!(at);
                }
                details
            }
            Act::TokenRevoke { name } => serde_json::json!({ "name": name }),
            // Header names only: their values are often credentials.
            Act::TelemetrySet(new) => serde_json::json!({
                "selector": new.selector,
                "metrics": new.metrics,
                "logs": new.logs,
                "headers": new.headers.keys().collect::<Vec<_>>(),
            }),
            Act::TelemetryClear { selector } => serde_json::json!({ "selector": selector }),
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
            Act::Maintenance(_) => "add or remove a maintenance window",
            Act::Release { .. } => "publish or roll back a release",
            Act::ConfigPush { .. } => "push configuration",
            Act::Decide { .. } => "approve or reject a change",
            Act::RequireApproval { .. } => "switch approvals on or off",
            Act::TokenCreate { .. } | Act::TokenRevoke { .. } => "manage tokens",
            Act::Restart { .. } => "restart an agent",
            Act::RotateCredentials { .. } => "rotate an agent's credentials",
            Act::Move { .. } => "move an agent to another server",
            Act::TelemetrySet(_) | Act::TelemetryClear { .. } => {
                "set or clear where agents export their own telemetry"
            }
        }
    }
}

/// Does `act` for `actor`: checks the role, does it (or, while the fleet requires
/// approval and it moves agents, parks it), logs it and records it in the audit log,
/// done, parked or refused.
pub async fn perform(s: &Shared, actor: &Actor, act: Act) -> Result<Done, ActionError> {
    let mut details = act.subject();
    if actor.via == Via::Page {
        details["via"] = serde_json::json!("page");
    }
    let outcome = if !actor.role.may(act.permission()) {
        Err(Refused::NotAllowed(format!(
            "refused: {} has the role {}, which may not {} ({}); ask {}",
            actor.name,
            actor.role,
            act.verb(),
            act.name(),
            if act.permission() == Permission::Change {
                "an operator"
            } else {
                "an admin"
            }
        )))
    } else if act.moves_agents() && s.fleet.approvals().required().await? {
        park(s, actor, &act).await?
    } else {
        run(s, actor, &act).await?
    };
    match outcome {
        Ok((done, more)) => {
            merge(&mut details, more);
            // A parked change is not the change: its entry says it was asked for.
            let action = if matches!(done, Done::Parked(_)) {
                "approval.request"
            } else {
                act.name()
            };
            tracing::info!(by = %actor.name, via = ?actor.via, "{action}: {}", done_words(&act, &done));
            record(s, actor, action, Outcome::Done, details).await;
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

/// Parks `act` for another operator's approval, once what can be checked now passes
/// (a change that could never be applied is refused at once, not after a wait).
async fn park(
    s: &Shared,
    actor: &Actor,
    act: &Act,
) -> Result<Result<(Done, Extra), Refused>, ActionError> {
    if let Err(refused) = precheck(s, act).await? {
        return Ok(Err(refused));
    }
    let Some(payload) = Parked::of(act) else {
        return Err(ActionError::Failed(format!(
            "{} cannot wait for approval",
            act.name()
        )));
    };
    let payload = serde_json::to_value(&payload)
        .map_err(|e| ActionError::Failed(format!("{}: {e}", act.name())))?;
    let now = now_ms();
    let expires_at =
        now.saturating_add(i64::try_from(s.approval_expires.as_millis()).unwrap_or(i64::MAX));
    let approval = s
        .fleet
        .approvals()
        .park(&NewApproval {
            action: act.name(),
            subject: &act.subject(),
            payload: &payload,
            release: act.release(),
            requested_by: &actor.name,
            now,
            expires_at,
        })
        .await?;
    let extra = serde_json::json!({
        "approval": approval.id,
        "action": act.name(),
        "expires_at": expires_at,
    });
    Ok(Ok((Done::Parked(Box::new(approval)), extra)))
}

/// What can be refused of a change before it waits for approval, from what the fleet
/// holds now; the rest is checked again when it is applied.
async fn precheck(s: &Shared, act: &Act) -> Result<Result<(), Refused>, FleetError> {
    let of = |e: FleetError| match e {
        FleetError::Invalid(why) => Ok(Refused::Invalid(why)),
        FleetError::Conflict(why) => Ok(Refused::Conflict(why)),
        FleetError::NotFound(why) => Ok(Refused::Unknown(why)),
        e => Err(e),
    };
    let releases = s.releases.releases();
    let refused = match act {
        Act::ConfigPush { files, .. } => agent_protocol::config_set::check_set(files)
            .err()
            .map(|e| Refused::Invalid(format!("configuration set refused: {e}"))),
        Act::Deployment(DeploymentAct::Create(new)) => match deployments::check_new(new) {
            Err(e) => Some(of(e)?),
            Ok(()) if releases.release(&new.release).await?.is_none() => {
                Some(not_kept(&new.release))
            }
            Ok(()) => None,
        },
        Act::Deployment(DeploymentAct::Set { name, change }) => {
            match deployments::check_change(name, change) {
                Err(e) => Some(of(e)?),
                Ok(()) if deployments::get(&s.fleet.db, name).await?.is_none() => {
                    Some(unknown_deployment(name))
                }
                Ok(()) => match &change.release {
                    Some(id) if releases.release(id).await?.is_none() => Some(not_kept(id)),
                    _ => None,
                },
            }
        }
        _ => None,
    };
    Ok(refused.map_or(Ok(()), Err))
}

fn not_kept(id: &str) -> Refused {
    Refused::Invalid(format!(
        "release {id} is not kept here; publish it first (`update-server release publish --deployment NAME DIR`) or pick one of `update-server release list`"
    ))
}

/// Decides the waiting change `id` for `actor`: a rejection records it; an approval
/// applies it as its requester's action (audited under their name, with the approver's)
/// and answers what applying it did.
async fn decide(
    s: &Shared,
    actor: &Actor,
    id: i64,
    decision: Decision,
    reason: Option<&str>,
) -> Result<Result<(Done, Extra), Refused>, ActionError> {
    let store = s.fleet.approvals();
    let Some(approval) = store.get(id).await? else {
        return Ok(Err(Refused::Unknown(format!(
            "no approval {id}; `update-server approval list` shows the waiting changes"
        ))));
    };
    let extra = serde_json::json!({
        "action": approval.action,
        "requested_by": approval.requested_by,
        "subject": approval.subject,
    });
    let now = now_ms();
    let state = match approval.decide(&actor.name, decision, now) {
        Ok(state) => state,
        Err(approvals::Refusal::OwnChange) => {
            return Ok(Err(Refused::NotAllowed(format!(
                "refused: {} asked for this change ({} {id}) and may not approve it; another operator must (or reject it to withdraw it)",
                actor.name, approval.action
            ))));
        }
        Err(approvals::Refusal::NotWaiting(state)) => {
            return Ok(Err(Refused::Conflict(format!(
                "approval {id} is {state}: there is nothing to decide"
            ))));
        }
    };
    // One decision of all the fleet's is taken; another found it decided (or lapsed).
    if !store.claim(id, state, &actor.name, reason, now).await? {
        let now_state = store
            .get(id)
            .await?
            .map_or(approvals::State::Expired, |a| a.state_at(now_ms()));
        return Ok(Err(Refused::Conflict(format!(
            "approval {id} is {now_state}: it was decided meanwhile"
        ))));
    }
    if decision == Decision::Reject {
        let approval = store.get(id).await?.unwrap_or(approval);
        return Ok(Ok((
            Done::Decided {
                approval: Box::new(approval),
                applied: None,
            },
            extra,
        )));
    }
    let act = match serde_json::from_value::<Parked>(approval.payload.clone()) {
        Ok(parked) => parked.into_act(),
        Err(e) => {
            let why = format!("its stored change cannot be read ({e}); ask for it again");
            store.failed(id, &why).await?;
            return Ok(Err(Refused::Conflict(format!(
                "approval {id} was approved but not applied: {why}"
            ))));
        }
    };
    // Applied as the change of the operator who asked for it; the role they had then
    // was checked when it was parked.
    let requester = Actor {
        name: approval.requested_by.clone(),
        role: agent_fleet::operators::Role::Operator,
        address: String::new(),
        via: actor.via,
    };
    let mut applied_details = act.subject();
    applied_details["approval"] = serde_json::json!(id);
    applied_details["approved_by"] = serde_json::json!(actor.name);
    let applied = Box::pin(run(s, &requester, &act)).await;
    match applied {
        Ok(Ok((done, more))) => {
            merge(&mut applied_details, more);
            tracing::info!(by = %requester.name, approved_by = %actor.name, "{}: {}", act.name(), done_words(&act, &done));
            record(s, &requester, act.name(), Outcome::Done, applied_details).await;
            let approval = store.get(id).await?.unwrap_or(approval);
            Ok(Ok((
                Done::Decided {
                    approval: Box::new(approval),
                    applied: Some(Box::new(done)),
                },
                extra,
            )))
        }
        Ok(Err(refused)) => {
            store.failed(id, refused.message()).await?;
            applied_details["reason"] = serde_json::json!(refused.message());
            record(s, &requester, act.name(), Outcome::Refused, applied_details).await;
            Ok(Err(Refused::Conflict(format!(
                "approval {id} was approved but not applied, nothing changed: {}",
                refused.message()
            ))))
        }
        Err(e) => {
            // Approved, not applied: said so, not left looking applied.
            if let Err(e) = store.failed(id, &e.to_string()).await {
                tracing::error!("approval {id}: cannot record that it failed: {e}");
            }
            Err(e)
        }
    }
}

/// Anything the audit log should say beyond the subject (the release let through).
type Extra = serde_json::Value;

async fn run(
    s: &Shared,
    actor: &Actor,
    act: &Act,
) -> Result<Result<(Done, Extra), Refused>, ActionError> {
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
                Err(e) => return Err(e.into()),
            };
            // Its next contact here follows its new deployment (news would wake every
            // held agent of the fleet for one).
            s.fleet.deployments.labels_changed(agent);
            let stored = s.fleet.db.opamp_agent(agent).await?;
            let effective = s
                .fleet
                .db
                .agent(agent)
                .await?
                .map(|a| a.labels_as_seen(stored.as_ref().map(|o| o.view.as_str())))
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
                Err(e) => return Err(e.into()),
            };
            // Taken at once here; every other server within its next look.
            s.fleet.deployments.refresh().await?;
            s.fleet.rollouts.news().publish("a deployment changed");
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
        Act::Maintenance(change) => {
            let db = &s.fleet.db;
            let result = match change {
                MaintenanceAct::Add(window) => policy::add_window(db, window).await,
                MaintenanceAct::Remove { id } => policy::remove_window(db, *id).await,
            };
            let window = match result {
                Ok(w) => w,
                Err(FleetError::Invalid(why)) => return Ok(Err(Refused::Invalid(why))),
                Err(FleetError::NotFound(why)) => return Ok(Err(Refused::Unknown(why))),
                Err(e) => return Err(e.into()),
            };
            // Taken at once here; every other server within its next look (a second).
            s.fleet.deployments.refresh().await?;
            let extra =
                serde_json::json!({ "id": window.id, "deployment": window.window.deployment });
            Ok((Done::Window(Box::new(window)), extra))
        }
        Act::Release { id, kind, .. } => {
            let entry = match s.releases.make_kept_current(id, *kind, &actor.name).await {
                Ok(entry) => entry,
                Err(ReleaseError::NotKept(why)) => return Ok(Err(Refused::Unknown(why))),
                Err(ReleaseError::Fleet(e)) => return Err(e.into()),
                Err(ReleaseError::Io(detail)) => {
                    tracing::error!("release {id}: {detail}");
                    return Err(ActionError::Failed(
                        "the server could not serve the release (its log says why)".into(),
                    ));
                }
                Err(e) => return Ok(Err(Refused::Conflict(e.to_string()))),
            };
            s.fleet.rollouts.news().publish(match kind {
                Kind::Publish => "a release was published",
                Kind::Rollback => "a release was rolled back",
            });
            if *kind == Kind::Rollback {
                tracing::warn!(release = %id, by = %actor.name, "rollback: release {id} is the target again");
            }
            Ok((Done::Release(Box::new(entry)), none))
        }
        Act::ConfigPush {
            group,
            files,
            consent,
        } => {
            let pushed = match s.fleet.configs.push(group, files.clone(), *consent).await {
                Err(FleetError::Conflict(why)) => return Ok(Err(Refused::Conflict(why))),
                other => other?,
            };
            match pushed {
                Ok(pushed) => {
                    if pushed.new {
                        tracing::info!(group = %pushed.group, hash = %pushed.hash, "configuration set stored");
                    }
                    let extra = serde_json::json!({ "hash": pushed.hash, "new": pushed.new });
                    Ok((Done::ConfigPushed(pushed), extra))
                }
                Err(e) => Err(Refused::Invalid(format!("configuration set refused: {e}"))),
            }
        }
        Act::Decide {
            id,
            decision,
            reason,
        } => return decide(s, actor, *id, *decision, reason.as_deref()).await,
        Act::RequireApproval { on } => {
            s.fleet.approvals().set_required(*on).await?;
            Ok((Done::ApprovalRequired { on: *on }, none))
        }
        Act::TokenCreate {
            name,
            role,
            expires_at,
        } => {
            if expires_at.is_some_and(|at| at <= now_ms()) {
                return Ok(Err(Refused::Invalid(
                    "the token would have lapsed already: give an expiry in the future (90d, 12h)"
                        .into(),
                )));
            }
            match s.fleet.operators().create(name, *role, *expires_at).await {
                Ok(token) => Ok((Done::TokenCreated { token }, none)),
                Err(FleetError::Invalid(why)) => Err(Refused::Invalid(why)),
                Err(FleetError::Conflict(why)) => Err(Refused::Conflict(why)),
                Err(e) => return Err(e.into()),
            }
        }
        Act::TelemetrySet(new) => {
            let new = match new.clone().checked() {
                Ok(new) => new,
                Err(FleetError::Invalid(why)) => return Ok(Err(Refused::Invalid(why))),
                Err(e) => return Err(e.into()),
            };
            let stored = s.fleet.set_telemetry(&new).await?;
            let extra = serde_json::json!({ "hash": stored.offer().hash });
            Ok((Done::Telemetry(Box::new(stored)), extra))
        }
        Act::TelemetryClear { selector } => match s.fleet.clear_telemetry(selector).await? {
            Some(had) => Ok((Done::Telemetry(Box::new(had)), none)),
            None => Err(Refused::Unknown(format!(
                "no telemetry destination is set for the selector {:?}; `update-server telemetry list` shows them (a selector is matched as it was written)",
                selector.trim()
            ))),
        },
        Act::TokenRevoke { name } => {
            if s.fleet.operators().revoke(name).await? {
                Ok((Done::TokenRevoked, none))
            } else {
                Err(Refused::Unknown(format!(
                    "no token is named {name:?}; `update-server token list` shows them"
                )))
            }
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

fn done_words(act: &Act, done: &Done) -> &'static str {
    match (act, done) {
        (_, Done::Parked(_)) => "the change waits for another operator's approval",
        (_, Done::Decided { applied: None, .. }) => "the change is rejected; nothing changed",
        (_, Done::Decided { .. }) => "the change is approved and applied",
        (Act::ForgetToken { .. }, _) => {
            "the agent's credentials are reset; its next register gets new ones"
        }
        (Act::RemoveAgent { .. }, _) => {
            "the agent is removed from the fleet; its credentials are revoked"
        }
        (Act::OverrideLocks { .. }, _) => "the agent's update locks are overridden",
        (Act::Labels { .. }, _) => "the agent's labels changed",
        (Act::Rollout { .. }, _) => "done",
        (Act::Deployment(DeploymentAct::Create(_)), _) => "the deployment is made",
        (Act::Deployment(DeploymentAct::Set { .. }), _) => "the deployment changed",
        (Act::Deployment(DeploymentAct::Remove { .. }), _) => {
            "the deployment is removed; its agents follow the next that selects them"
        }
        (Act::Maintenance(MaintenanceAct::Add(_)), _) => "the maintenance window is added",
        (Act::Maintenance(MaintenanceAct::Remove { .. }), _) => "the maintenance window is removed",
        (Act::Release { .. }, _) => "the release is the fleet's target",
        (Act::ConfigPush { .. }, _) => "the configuration set is stored",
        (Act::Decide { .. }, _) => "decided",
        (Act::RequireApproval { on: true }, _) => {
            "changes that move agents now wait for a second operator's approval"
        }
        (Act::RequireApproval { on: false }, _) => {
            "changes that move agents are applied at once again"
        }
        (Act::TokenCreate { .. }, _) => "operator token created",
        (Act::TokenRevoke { .. }, _) => "operator token revoked",
        (Act::Restart { .. }, _) => "the agent restarts at its next contact",
        (Act::RotateCredentials { .. }, _) => {
            "the agent is offered a new credential at its next contact"
        }
        (Act::Move { .. }, _) => "the agent is offered another server URL at its next contact",
        (Act::TelemetrySet(_), _) => {
            "the agents it selects export their own telemetry there from their next contact"
        }
        (Act::TelemetryClear { .. }, _) => {
            "the agents it selected stop exporting there from their next contact"
        }
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
    fn what_moves_agents_waits_for_approval_and_what_steers_does_not() {
        let set = |change: deployments::Change| {
            Act::Deployment(DeploymentAct::Set {
                name: "canary".into(),
                change,
            })
        };
        let moving = [
            Act::Release {
                id: "2.0.0+2".into(),
                kind: Kind::Rollback,
                files: vec![],
            },
            Act::ConfigPush {
                group: "web".into(),
                files: BTreeMap::new(),
                consent: Consent::default(),
            },
            set(deployments::Change {
                selector: Some("env=prod".into()),
                ..Default::default()
            }),
        ];
        assert!(moving.iter().all(Act::moves_agents));
        let steering = [
            Act::Rollout {
                target: Target::Bundle,
                step: Step::Halt { reason: None },
            },
            set(deployments::Change {
                priority: Some(5),
                ..Default::default()
            }),
            Act::Deployment(DeploymentAct::Remove {
                name: "canary".into(),
            }),
            Act::Decide {
                id: 1,
                decision: Decision::Approve,
                reason: None,
            },
            Act::RequireApproval { on: false },
        ];
        assert!(!steering.iter().any(Act::moves_agents));
    }

    #[test]
    fn a_parked_change_reads_back_as_the_same_change() {
        let files = BTreeMap::from([("app.conf".to_owned(), "a = 1\n".to_owned())]);
        let acts = [
            Act::Release {
                id: "2.0.0+2".into(),
                kind: Kind::Rollback,
                files: vec!["agent-bundle-2.0.0".into()],
            },
            Act::ConfigPush {
                group: "web".into(),
                files,
                consent: Consent {
                    allow_empty: false,
                    replace_all: true,
                },
            },
            Act::Deployment(DeploymentAct::Create(deployments::NewDeployment {
                name: "canary".into(),
                selector: "env in (prod)".into(),
                release: "2.0.0+2".into(),
                priority: 3,
                policy: None,
            })),
        ];
        for act in acts {
            let stored = serde_json::to_value(Parked::of(&act).unwrap()).unwrap();
            let back: Parked = serde_json::from_value(stored).unwrap();
            let back = back.into_act();
            assert_eq!(back.name(), act.name());
            assert_eq!(back.subject(), act.subject());
            assert_eq!(back.release(), act.release());
        }
        assert!(Parked::of(&Act::RemoveAgent { agent: "a".into() }).is_none());
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
