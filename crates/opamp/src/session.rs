//! The server's decision on one `AgentToServer`: what it now knows of the agent and
//! what the protocol obliges it to say back. Pure: the stored view and the message
//! in, the new view and the duties out; the edge stores and answers.
//!
//! The duties (spec "Agent Status Compression", "Duplicate instance_uid
//! Detection", "ServerToAgent.capabilities"):
//!
//! - Omitted sub-messages mean unchanged: each one present replaces what was stored.
//! - `sequence_num` must be one more than the last: anything else is a gap, answered
//!   with `ReportFullState`. Two exceptions keep the real clients quiet: the *same*
//!   number again is a retry (the Python client re-sends a message byte for byte),
//!   and an instance the server does not know starting at 0 (Python) or 1 (Node) is
//!   a fresh start, whose omissions mean "nothing to say yet".
//! - An instance the server does not know that joins mid-stream (the server lost
//!   it, or the agent kept its uid across a restart) is asked for its full state
//!   unless its message already carries everything its capabilities promise; an
//!   agent whose description the server does not have is always asked.
//! - A uid already in use by another live agent (a second connection whose sequence
//!   does not continue the first's, or a description naming another service or
//!   host), or an agent that asks the server to choose (`RequestInstanceUid`), is
//!   given a fresh uid; a colliding message is not merged into the record it
//!   collided with.
//! - The first answer on a connection carries the server's capabilities.

use crate::error::Result;
use crate::proto::{AgentCapabilities, AgentToServer, AgentToServerFlags};
use crate::uid::{InstanceUid, WireForm};
use crate::view::{
    AgentView, Description, EffectiveConfigSummary, Health, PackagesReport, RemoteConfigReport,
    has_capability,
};

/// One message as the edge received it.
#[derive(Debug, Clone, Copy)]
pub struct Contact<'a> {
    pub message: &'a AgentToServer,
    /// First message on this transport connection; every HTTP request is one.
    pub first_on_connection: bool,
    /// The edge holds another open connection for this uid (WebSocket). Not proof of
    /// a second agent: a client whose network dropped reconnects before the server
    /// notices the old connection is dead. A reconnecting agent continues its
    /// `sequence_num`, a second agent does not, so only the latter is a duplicate;
    /// when the observation is not a duplicate the edge closes the old connection.
    pub uid_in_use_elsewhere: bool,
}

/// What changed in the view, so the edge records and wakes only on real changes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Changes {
    pub capabilities: bool,
    pub description: bool,
    pub health: bool,
    pub effective_config: bool,
    pub remote_config: bool,
    pub packages: bool,
}

impl Changes {
    pub fn any(&self) -> bool {
        self.capabilities
            || self.description
            || self.health
            || self.effective_config
            || self.remote_config
            || self.packages
    }
}

/// The decision on one message.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    pub uid: InstanceUid,
    /// How the agent wrote its uid, to write a new one the same way.
    pub uid_form: WireForm,
    /// The view to store under `uid`; the stored one, untouched, when `duplicate`.
    pub view: AgentView,
    pub changes: Changes,
    /// Set `ReportFullState` in the answer.
    pub report_full_state: bool,
    /// Put [`crate::answer::SERVER_CAPABILITIES`] in the answer.
    pub send_capabilities: bool,
    /// Answer with `AgentIdentification.new_instance_uid` = this.
    pub new_instance_uid: Option<InstanceUid>,
    /// The message collided with another agent's uid and was not merged.
    pub duplicate: bool,
    /// The agent said goodbye (`agent_disconnect`): mark it offline.
    pub disconnected: bool,
}

/// Attributes that never change within one running agent but do differ between two
/// agents: the same uid with different values here is two agents.
const DISTINCT_ATTRIBUTES: [&str; 5] = [
    "service.name",
    "service.namespace",
    "service.instance.id",
    "host.name",
    "host.id",
];

/// Decides on one message. `stored` is the view kept for the message's uid, if any.
/// Fails only when the message has no usable instance_uid (answer `BadRequest`).
pub fn observe(stored: Option<&AgentView>, contact: Contact<'_>) -> Result<Observation> {
    let msg = contact.message;
    let (uid, uid_form) = InstanceUid::from_wire(&msg.instance_uid)?;
    let incoming = msg.agent_description.as_ref().map(Description::from);

    let collides = stored.is_some_and(|s| {
        let continues = s
            .sequence_num
            .is_some_and(|last| msg.sequence_num == last.wrapping_add(1));
        s.online
            && ((contact.uid_in_use_elsewhere && !continues)
                || describes_another_agent(s, incoming.as_ref()))
    });
    let asks_for_uid = msg.flags & AgentToServerFlags::RequestInstanceUid as u64 != 0;
    if collides {
        return Ok(Observation {
            uid,
            uid_form,
            view: stored.cloned().unwrap_or_default(),
            changes: Changes::default(),
            // Not ReportFullState as well: a client that ignores the new uid (Python)
            // would answer at once with its old one, and again, and again.
            report_full_state: false,
            send_capabilities: contact.first_on_connection,
            new_instance_uid: Some(InstanceUid::new_v7()),
            duplicate: true,
            disconnected: msg.agent_disconnect.is_some(),
        });
    }

    let (view, changes) = merge(stored, msg, incoming);
    let report_full_state = match stored.and_then(|s| s.sequence_num) {
        Some(last) => {
            (msg.sequence_num != last.wrapping_add(1) && msg.sequence_num != last)
                || view.description.is_none()
        }
        None => {
            let fresh_start = msg.sequence_num <= 1;
            view.description.is_none() || (!fresh_start && !carries_full_state(msg))
        }
    };
    let disconnected = msg.agent_disconnect.is_some();
    Ok(Observation {
        uid,
        uid_form,
        view,
        changes,
        report_full_state: report_full_state && !disconnected,
        send_capabilities: contact.first_on_connection,
        new_instance_uid: asks_for_uid.then(InstanceUid::new_v7),
        duplicate: false,
        disconnected,
    })
}

fn describes_another_agent(stored: &AgentView, incoming: Option<&Description>) -> bool {
    let (Some(old), Some(new)) = (stored.description.as_ref(), incoming) else {
        return false;
    };
    DISTINCT_ATTRIBUTES
        .iter()
        .any(|key| matches!((old.get(key), new.get(key)), (Some(a), Some(b)) if a != b))
}

/// Whether the message holds every part its capabilities say the agent reports.
fn carries_full_state(msg: &AgentToServer) -> bool {
    let caps = msg.capabilities;
    let promised = |cap: AgentCapabilities, present: bool| !has_capability(caps, cap) || present;
    msg.agent_description.is_some()
        && promised(AgentCapabilities::ReportsHealth, msg.health.is_some())
        && promised(
            AgentCapabilities::ReportsEffectiveConfig,
            msg.effective_config.is_some(),
        )
        && promised(
            AgentCapabilities::ReportsRemoteConfig,
            msg.remote_config_status.is_some(),
        )
        && promised(
            AgentCapabilities::ReportsPackageStatuses,
            msg.package_statuses.is_some(),
        )
}

fn merge(
    stored: Option<&AgentView>,
    msg: &AgentToServer,
    description: Option<Description>,
) -> (AgentView, Changes) {
    let mut view = stored.cloned().unwrap_or_default();
    let mut changes = Changes::default();
    view.sequence_num = Some(msg.sequence_num);
    view.online = msg.agent_disconnect.is_none();
    // "MUST be always set": a zero is a broken client, not an agent that lost
    // every capability, so it changes nothing.
    if msg.capabilities != 0 {
        changes.capabilities = replace(&mut view.capabilities, msg.capabilities);
    }
    if let Some(d) = description {
        changes.description = replace_some(&mut view.description, d);
    }
    if let Some(h) = &msg.health {
        changes.health = replace_some(&mut view.health, Health::from(h));
    }
    if let Some(c) = &msg.effective_config {
        changes.effective_config =
            replace_some(&mut view.effective_config, EffectiveConfigSummary::from(c));
    }
    if let Some(r) = &msg.remote_config_status {
        changes.remote_config = replace_some(&mut view.remote_config, RemoteConfigReport::from(r));
    }
    if let Some(p) = &msg.package_statuses {
        changes.packages = replace_some(&mut view.packages, PackagesReport::from(p));
    }
    (view, changes)
}

fn replace<T: PartialEq>(slot: &mut T, value: T) -> bool {
    let changed = *slot != value;
    *slot = value;
    changed
}

fn replace_some<T: PartialEq>(slot: &mut Option<T>, value: T) -> bool {
    replace(slot, Some(value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{
        self, AgentDisconnect, AnyValue, ComponentHealth, KeyValue, RemoteConfigStatus,
        RemoteConfigStatuses, any_value,
    };
    use crate::view::ConfigStatus;

    const UID: [u8; 16] = [0x01, 0x90, 0, 0, 0, 0, 0x70, 0, 0x80, 0, 0, 0, 0, 0, 0, 1];

    /// What the Python client sends (capabilities from its source).
    const PYTHON_CAPS: u64 = 0x1 | 0x2000 | 0x2 | 0x1000 | 0x4;
    /// What the Node client sends with remote config enabled.
    const NODE_CAPS: u64 = 0x1 | 0x2000 | 0x2 | 0x1000;

    fn description(pairs: &[(&str, &str)]) -> proto::AgentDescription {
        proto::AgentDescription {
            identifying_attributes: pairs
                .iter()
                .map(|(k, v)| KeyValue {
                    key: k.to_string(),
                    value: Some(AnyValue {
                        value: Some(any_value::Value::StringValue(v.to_string())),
                    }),
                })
                .collect(),
            non_identifying_attributes: vec![],
        }
    }

    fn full(seq: u64, caps: u64) -> AgentToServer {
        AgentToServer {
            instance_uid: UID.to_vec(),
            sequence_num: seq,
            capabilities: caps,
            agent_description: Some(description(&[("service.name", "svc"), ("host.name", "h1")])),
            ..Default::default()
        }
    }

    fn heartbeat(seq: u64, caps: u64) -> AgentToServer {
        AgentToServer {
            instance_uid: UID.to_vec(),
            sequence_num: seq,
            capabilities: caps,
            ..Default::default()
        }
    }

    fn http(msg: &AgentToServer) -> Contact<'_> {
        Contact {
            message: msg,
            first_on_connection: true,
            uid_in_use_elsewhere: false,
        }
    }

    /// Runs messages through in order as the edge would, storing each view.
    fn run(msgs: &[AgentToServer]) -> Vec<Observation> {
        let mut stored: Option<AgentView> = None;
        msgs.iter()
            .map(|m| {
                let o = observe(stored.as_ref(), http(m)).unwrap();
                if !o.duplicate {
                    stored = Some(o.view.clone());
                }
                o
            })
            .collect()
    }

    fn flags(obs: &[Observation]) -> Vec<bool> {
        obs.iter().map(|o| o.report_full_state).collect()
    }

    #[test]
    fn python_client_starts_at_zero_without_full_state_request() {
        // Python's first message: description, no remote config status or effective
        // config yet although its capabilities promise both.
        let obs = run(&[
            full(0, PYTHON_CAPS),
            heartbeat(1, PYTHON_CAPS),
            heartbeat(2, PYTHON_CAPS),
        ]);
        assert_eq!(flags(&obs), [false, false, false]);
        assert!(obs[0].changes.description && obs[0].changes.capabilities);
        assert!(!obs[1].changes.any());
        assert_eq!(
            obs[2].view.description.as_ref().unwrap().service_name(),
            Some("svc")
        );
        assert!(obs[2].view.online);
    }

    #[test]
    fn python_retries_repeat_a_number_then_jump() {
        // seq 3 was received but the 1 s client timeout fired; the retry repeats 3,
        // while the client's counter moved on to 5.
        let obs = run(&[
            full(0, PYTHON_CAPS),
            heartbeat(1, PYTHON_CAPS),
            heartbeat(2, PYTHON_CAPS),
            heartbeat(3, PYTHON_CAPS),
            heartbeat(3, PYTHON_CAPS),
            heartbeat(5, PYTHON_CAPS),
            full(6, PYTHON_CAPS),
        ]);
        assert_eq!(
            flags(&obs),
            [false, false, false, false, false, true, false]
        );
    }

    #[test]
    fn node_client_starts_at_one_with_an_empty_remote_config_status() {
        let mut first = full(1, NODE_CAPS);
        first.remote_config_status = Some(RemoteConfigStatus::default());
        let obs = run(&[first, heartbeat(2, NODE_CAPS)]);
        assert_eq!(flags(&obs), [false, false]);
        let rc = obs[0].view.remote_config.as_ref().unwrap();
        assert_eq!(rc.status, None);
        assert_eq!(rc.hash, "");
    }

    #[test]
    fn sequence_gap_asks_for_full_state_even_when_the_message_is_complete() {
        let obs = run(&[
            full(1, NODE_CAPS),
            heartbeat(2, NODE_CAPS),
            heartbeat(5, NODE_CAPS),
            full(6, NODE_CAPS),
        ]);
        assert_eq!(flags(&obs), [false, false, true, false]);
        let obs = run(&[full(1, 1), full(3, 1)]);
        assert_eq!(flags(&obs), [false, true]);
        // Going backwards is a gap too (a restarted client keeping its uid).
        let obs = run(&[full(1, 1), full(2, 1), heartbeat(1, 1)]);
        assert_eq!(flags(&obs), [false, false, true]);
        // Wrapping around u64 is the next number.
        let obs = run(&[full(u64::MAX, 1), heartbeat(0, 1)]);
        assert_eq!(flags(&obs), [false, false]);
    }

    #[test]
    fn unknown_instance_mid_stream_is_asked_unless_complete() {
        // The server lost the agent: a bare heartbeat says nothing.
        let obs = run(&[heartbeat(40, PYTHON_CAPS)]);
        assert_eq!(flags(&obs), [true]);
        // Even at seq 0 an instance with no description is asked for one.
        let obs = run(&[heartbeat(0, 1)]);
        assert_eq!(flags(&obs), [true]);
        // Mid-stream with a description but without the health it promises.
        let obs = run(&[full(40, 1 | AgentCapabilities::ReportsHealth as u64)]);
        assert_eq!(flags(&obs), [true]);
        // Mid-stream and complete.
        let mut complete = full(40, 1 | AgentCapabilities::ReportsHealth as u64);
        complete.health = Some(ComponentHealth {
            healthy: true,
            ..Default::default()
        });
        let obs = run(&[complete]);
        assert_eq!(flags(&obs), [false]);
        // The full state that answers the request is consecutive: no loop.
        let obs = run(&[heartbeat(40, PYTHON_CAPS), full(41, PYTHON_CAPS)]);
        assert_eq!(flags(&obs), [true, false]);
    }

    #[test]
    fn omitted_sub_messages_leave_the_view_unchanged() {
        let mut first = full(1, NODE_CAPS | AgentCapabilities::ReportsHealth as u64);
        first.health = Some(ComponentHealth {
            healthy: true,
            status: "ok".into(),
            ..Default::default()
        });
        first.remote_config_status = Some(RemoteConfigStatus {
            last_remote_config_hash: vec![0xaa; 32],
            status: RemoteConfigStatuses::Applied as i32,
            error_message: String::new(),
        });
        let down = ComponentHealth {
            healthy: false,
            last_error: "down".into(),
            ..Default::default()
        };
        let mut third = heartbeat(3, 0); // capabilities 0: a broken client, ignored
        third.health = Some(down.clone());
        let obs = run(&[
            first,
            heartbeat(2, NODE_CAPS | AgentCapabilities::ReportsHealth as u64),
            third,
        ]);
        let v = &obs[1].view;
        assert!(v.health.as_ref().unwrap().healthy);
        assert_eq!(
            v.remote_config
                .as_ref()
                .unwrap()
                .status_of(&"aa".repeat(32)),
            Some(ConfigStatus::Applied)
        );
        assert_eq!(v.description.as_ref().unwrap().service_name(), Some("svc"));
        assert_eq!(obs[1].changes, Changes::default());
        let v = &obs[2].view;
        assert!(!v.health.as_ref().unwrap().healthy);
        assert!(obs[2].changes.health && !obs[2].changes.capabilities);
        assert!(v.has(AgentCapabilities::AcceptsRemoteConfig));
        assert_eq!(
            v.remote_config.as_ref().unwrap().status,
            Some(ConfigStatus::Applied)
        );
        // Same health again: recorded as no change.
        let mut again = heartbeat(4, NODE_CAPS);
        again.health = Some(down);
        let o = observe(Some(v), http(&again)).unwrap();
        assert!(!o.changes.health);
    }

    #[test]
    fn disconnect_marks_offline_and_asks_nothing() {
        let mut bye = heartbeat(7, 1);
        bye.agent_disconnect = Some(AgentDisconnect {});
        let obs = run(&[full(1, 1), bye]);
        assert!(obs[1].disconnected);
        assert!(!obs[1].view.online);
        // A gap in a goodbye is not worth a request nobody will answer.
        assert!(!obs[1].report_full_state);
    }

    #[test]
    fn capabilities_go_in_the_first_answer_on_a_connection() {
        let msg = full(1, 1);
        let o = observe(
            None,
            Contact {
                message: &msg,
                first_on_connection: true,
                uid_in_use_elsewhere: false,
            },
        )
        .unwrap();
        assert!(o.send_capabilities);
        let next = heartbeat(2, 1);
        let o = observe(
            Some(&o.view),
            Contact {
                message: &next,
                first_on_connection: false,
                uid_in_use_elsewhere: false,
            },
        )
        .unwrap();
        assert!(!o.send_capabilities);
    }

    #[test]
    fn a_second_live_connection_with_the_same_uid_gets_a_new_uid_and_is_not_merged() {
        let first = run(&[full(1, 1)]).remove(0);
        let mut clone = full(1, 1);
        clone.health = Some(ComponentHealth::default());
        let o = observe(
            Some(&first.view),
            Contact {
                message: &clone,
                first_on_connection: true,
                uid_in_use_elsewhere: true,
            },
        )
        .unwrap();
        assert!(o.duplicate);
        let new = o.new_instance_uid.unwrap();
        assert_ne!(new, o.uid);
        assert_eq!(o.view, first.view);
        assert!(!o.report_full_state);
    }

    #[test]
    fn a_reconnect_before_the_old_connection_is_noticed_dead_is_the_same_agent() {
        let obs = run(&[full(1, 1), heartbeat(2, 1)]);
        let again = heartbeat(3, 1);
        let o = observe(
            Some(&obs[1].view),
            Contact {
                message: &again,
                first_on_connection: true,
                uid_in_use_elsewhere: true,
            },
        )
        .unwrap();
        assert!(!o.duplicate && o.new_instance_uid.is_none());
        assert!(o.send_capabilities && !o.report_full_state);
        assert_eq!(o.view.sequence_num, Some(3));
    }

    #[test]
    fn same_uid_from_another_host_is_a_duplicate_but_a_version_bump_is_not() {
        let first = run(&[full(1, 1)]).remove(0);
        let mut other_host = full(1, 1);
        other_host.agent_description =
            Some(description(&[("service.name", "svc"), ("host.name", "h2")]));
        let o = observe(Some(&first.view), http(&other_host)).unwrap();
        assert!(o.duplicate && o.new_instance_uid.is_some());

        let mut upgraded = full(2, 1);
        upgraded.agent_description = Some(description(&[
            ("service.name", "svc"),
            ("host.name", "h1"),
            ("service.version", "2"),
        ]));
        let o = observe(Some(&first.view), http(&upgraded)).unwrap();
        assert!(!o.duplicate && o.new_instance_uid.is_none());
        assert!(o.changes.description);

        // After a goodbye the uid is free: the same uid on another host is the agent moved.
        let mut offline = first.view.clone();
        offline.online = false;
        let o = observe(Some(&offline), http(&other_host)).unwrap();
        assert!(!o.duplicate);
    }

    #[test]
    fn python_clone_that_ignores_its_new_uid_does_not_loop() {
        // Python never adopts new_instance_uid: each message from the clone is refused
        // again, without ReportFullState (which would make it re-send at once).
        let first = run(&[full(0, PYTHON_CAPS)]).remove(0);
        let mut clone = full(0, PYTHON_CAPS);
        clone.agent_description = Some(description(&[
            ("service.name", "svc"),
            ("host.name", "clone"),
        ]));
        for _ in 0..3 {
            let o = observe(Some(&first.view), http(&clone)).unwrap();
            assert!(o.duplicate && !o.report_full_state);
        }
    }

    #[test]
    fn request_instance_uid_flag_is_answered_with_a_new_uid() {
        let mut msg = full(1, 1);
        msg.flags = AgentToServerFlags::RequestInstanceUid as u64;
        let o = observe(None, http(&msg)).unwrap();
        assert!(o.new_instance_uid.is_some() && !o.duplicate);
    }

    #[test]
    fn a_message_without_a_usable_uid_is_refused() {
        let mut msg = full(1, 1);
        msg.instance_uid = vec![1, 2, 3];
        let err = observe(None, http(&msg)).unwrap_err();
        assert!(err.to_string().contains("3 bytes"), "{err}");
        msg.instance_uid.clear();
        assert!(observe(None, http(&msg)).is_err());
    }

    #[test]
    fn group_comes_from_the_description() {
        let mut msg = full(1, 1);
        msg.agent_description = Some(proto::AgentDescription {
            identifying_attributes: vec![],
            non_identifying_attributes: description(&[("agent.group", "canary")])
                .identifying_attributes,
        });
        let o = observe(None, http(&msg)).unwrap();
        assert_eq!(o.view.group(), "canary");
    }
}
