//! The deployments as the fleet holds them: one as stored, the table every rollout and
//! connect reads, and which deployment an agent follows. Below the rollouts and the
//! maintenance policy, which name deployments; `deployments` keeps and changes them.

use std::sync::{Arc, RwLock};

use agent_protocol::selector::Selector;
use serde_json::json;

use crate::labels::Labels;
use crate::rollout::plan::Plan;

/// The deployment every agent follows when no other selects it.
pub const DEFAULT: &str = "default";

/// Longest deployment name (names are plain, as groups).
pub const MAX_NAME: usize = 64;

/// One deployment as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Deployment {
    pub name: String,
    /// As the operator wrote it (shown back); parsed in [`Deployment::selector`].
    pub selector_text: String,
    pub selector: Selector,
    /// `<version>+<build>` of a kept release; `None` for `default` (the fleet's current
    /// release).
    pub release: Option<String>,
    pub priority: i64,
    /// Its own rollout policy; `None`: `[rollout]` of server.toml.
    pub policy: Option<Plan>,
    /// Unix milliseconds.
    pub created_at: i64,
    pub updated_at: i64,
}

impl Deployment {
    pub fn is_default(&self) -> bool {
        self.name == DEFAULT
    }

    /// The name its bundle rollouts are kept under (`""` for `default`, as before
    /// deployments, so a fleet's rollouts stay `default`'s).
    pub fn line(&self) -> &str {
        line_of(&self.name)
    }

    /// The deployment's JSON, without its agents and rollout (the edge adds them).
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "name": self.name,
            "selector": self.selector_text,
            "release": self.release,
            "priority": self.priority,
            "policy": self.policy.as_ref().map(crate::rollout::engine::plan_json),
            "created_at": self.created_at / 1000,
            "updated_at": self.updated_at / 1000,
        })
    }
}

/// The rollout line of the deployment `name`.
pub fn line_of(name: &str) -> &str {
    if name == DEFAULT { "" } else { name }
}

/// The deployment an agent with `labels` follows: of those whose selector matches, the
/// highest priority, ties to the newest; `default` last. `None` only for an empty list.
pub fn choose<'a>(all: &'a [Deployment], labels: &Labels) -> Option<&'a Deployment> {
    let mut best: Option<&Deployment> = None;
    for d in all {
        if d.is_default() || !d.selector.matches(labels) {
            continue;
        }
        let better = match best {
            None => true,
            Some(b) => (d.priority, d.created_at, &d.name) > (b.priority, b.created_at, &b.name),
        };
        if better {
            best = Some(d);
        }
    }
    best.or_else(|| all.iter().find(|d| d.is_default()))
}

/// The deployments as last read, shared by every deployment's rollouts (which place in
/// their waves only the agents that follow them).
#[derive(Debug)]
pub struct Table {
    list: RwLock<Arc<Vec<Deployment>>>,
}

impl Default for Table {
    /// `default` alone, as a new fleet has it.
    fn default() -> Self {
        Self {
            list: RwLock::new(Arc::new(vec![Deployment {
                name: DEFAULT.to_owned(),
                selector_text: String::new(),
                selector: Selector::default(),
                release: None,
                priority: 0,
                policy: None,
                created_at: 0,
                updated_at: 0,
            }])),
        }
    }
}

impl Table {
    pub fn get(&self) -> Arc<Vec<Deployment>> {
        Arc::clone(&self.list.read().unwrap_or_else(|p| p.into_inner()))
    }

    pub(crate) fn set(&self, list: Vec<Deployment>) {
        *self.list.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(list);
    }

    /// Only `default`: every agent follows it, nothing to choose.
    pub fn is_single(&self) -> bool {
        self.get().len() <= 1
    }

    /// The name of the deployment an agent with `labels` follows.
    pub fn follows(&self, labels: &Labels) -> String {
        self.chosen(labels).0
    }

    /// The deployment an agent with `labels` follows: its name and the release it names
    /// (`None` for `default`).
    pub(crate) fn chosen(&self, labels: &Labels) -> (String, Option<String>) {
        choose(&self.get(), labels).map_or_else(
            || (DEFAULT.to_owned(), None),
            |d| (d.name.clone(), d.release.clone()),
        )
    }

    /// The release the deployment `name` names, as last read.
    pub(crate) fn release_of(&self, name: &str) -> Option<String> {
        self.get()
            .iter()
            .find(|d| d.name == name)
            .and_then(|d| d.release.clone())
    }
}
