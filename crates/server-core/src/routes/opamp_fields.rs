//! What `/admin/agents` shows of an agent's protocol: `"protocol"` on every row and,
//! for OpAMP agents, their description, health, effective configuration hash and
//! remote configuration status (docs/opamp.md, "OpAMP agents").

use agent_fleet::opamp::{PROTOCOL_NATIVE, PROTOCOL_OPAMP, StoredOpamp};
use agent_opamp::view::AgentView;
use serde_json::{Map, Value, json};

/// Adds the protocol fields to one row of the list.
pub fn add_fields(row: &mut Value, stored: Option<&StoredOpamp>, now_ms: i64) {
    let Some(obj) = row.as_object_mut() else {
        return;
    };
    let Some(stored) = stored else {
        obj.insert("protocol".into(), json!(PROTOCOL_NATIVE));
        return;
    };
    obj.insert("protocol".into(), json!(PROTOCOL_OPAMP));
    obj.insert("online".into(), json!(stored.shows_online(now_ms)));
    let view: AgentView = serde_json::from_str(&stored.view).unwrap_or_default();
    let mut description = Map::new();
    if let Some(d) = &view.description {
        // Identifying attributes win over non-identifying ones of the same key.
        for (k, v) in d.non_identifying.iter().chain(d.identifying.iter()) {
            description.insert(k.clone(), json!(v));
        }
    }
    obj.insert("description".into(), Value::Object(description));
    obj.insert(
        "health".into(),
        view.health.as_ref().map_or(Value::Null, |h| {
            json!({
                "healthy": h.healthy,
                "status": h.status,
                "last_error": h.last_error,
                "start_time_unix_nano": h.start_time_unix_nano,
                "unhealthy_components": h.unhealthy_components,
            })
        }),
    );
    obj.insert(
        "effective_config_hash".into(),
        view.effective_config
            .as_ref()
            .map_or(Value::Null, |c| json!(c.hash)),
    );
    let rc = view.remote_config.as_ref();
    obj.insert(
        "remote_config_status".into(),
        rc.and_then(|r| r.status)
            .map_or(Value::Null, |st| json!(st.as_str())),
    );
    obj.insert(
        "remote_config_hash".into(),
        rc.filter(|r| !r.hash.is_empty())
            .map_or(Value::Null, |r| json!(r.hash)),
    );
    obj.insert(
        "remote_config_error".into(),
        rc.filter(|r| !r.error.is_empty())
            .map_or(Value::Null, |r| json!(r.error)),
    );
    // Named as the specification names them, like a native agent's list.
    obj.insert(
        "capabilities".into(),
        json!(agent_opamp::view::capability_names(view.capabilities)),
    );
    obj.insert("capability_bits".into(), json!(view.capabilities));
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_opamp::view::{ConfigStatus, Description, Health, RemoteConfigReport};

    #[test]
    fn native_rows_say_native_and_opamp_rows_say_what_the_agent_reported() {
        let mut native = json!({"id": "a"});
        add_fields(&mut native, None, 0);
        assert_eq!(native, json!({"id": "a", "protocol": "native"}));

        let view = AgentView {
            description: Some(Description {
                identifying: [("service.name".to_owned(), "svc".to_owned())].into(),
                non_identifying: [
                    ("service.name".to_owned(), "shadowed".to_owned()),
                    ("agent.group".to_owned(), "canary".to_owned()),
                ]
                .into(),
            }),
            health: Some(Health {
                healthy: false,
                last_error: "exporter down".into(),
                ..Default::default()
            }),
            remote_config: Some(RemoteConfigReport {
                hash: "ab".into(),
                status: Some(ConfigStatus::Applied),
                error: String::new(),
            }),
            online: true,
            ..Default::default()
        };
        let stored = StoredOpamp {
            view: serde_json::to_string(&view).unwrap(),
            online: true,
            seen_at_ms: 1_000,
        };
        let mut row = json!({"id": "b"});
        add_fields(&mut row, Some(&stored), 2_000);
        assert_eq!(row["protocol"], "opamp");
        assert_eq!(
            row["description"],
            json!({"service.name": "svc", "agent.group": "canary"})
        );
        assert_eq!(row["health"]["healthy"], false);
        assert_eq!(row["health"]["last_error"], "exporter down");
        assert_eq!(row["remote_config_status"], "APPLIED");
        assert_eq!(row["remote_config_hash"], "ab");
        assert_eq!(row["effective_config_hash"], Value::Null);
        assert_eq!(row["online"], true);
        // Silent for three heartbeats: offline.
        add_fields(
            &mut row,
            Some(&stored),
            1_000 + agent_fleet::opamp::SILENCE_MS,
        );
        assert_eq!(row["online"], false);
    }
}
