//! OpAMP agents in the fleet database. They are rows of `agents` like native agents
//! (`protocol = 'opamp'`, the same name, version, group, contact and update status
//! columns, so rollouts, lists and counts see one fleet), and what only they have is
//! kept beside them in `agent_opamp`: the server's view of the agent as JSON (the
//! edge's `agent_opamp::view::AgentView`; this crate stores it without reading it),
//! the last `sequence_num`, whether it is connected, and whether it accepts packages
//! and remote configuration (only those take part in bundle, resp. config, rollouts).

use std::collections::HashMap;

use sqlx::Row;

use crate::db::Db;
use crate::error::FleetError;

/// `agents.protocol` of agents that speak the native JSON protocol.
pub const PROTOCOL_NATIVE: &str = "native";
/// `agents.protocol` of OpAMP agents.
pub const PROTOCOL_OPAMP: &str = "opamp";

/// An OpAMP agent not heard from for this long shows offline: three heartbeats at the
/// interval both registry clients and the opamp-go client default to (30 s).
pub const SILENCE_MS: i64 = 3 * 30 * 1000;

/// What an edge saves after a message from an OpAMP agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpampAgent {
    /// The instance uid, as UUID text.
    pub id: String,
    /// `service.name` (or `host.name`), for lists.
    pub name: String,
    /// `os.type`/`host.arch` as the agent describes them.
    pub platform: String,
    pub version: String,
    /// Its `agent.group` attribute; empty without one.
    pub group: String,
    /// The view, as JSON.
    pub view: String,
    pub sequence_num: Option<u64>,
    pub online: bool,
    pub accepts_packages: bool,
    /// Only those take part in config rollouts.
    pub accepts_remote_config: bool,
    /// When the message was received, unix milliseconds.
    pub at_ms: i64,
}

/// What is stored of an OpAMP agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredOpamp {
    pub view: String,
    /// False after `agent_disconnect` (or its WebSocket closed).
    pub online: bool,
    /// Last message, unix milliseconds.
    pub seen_at_ms: i64,
}

impl StoredOpamp {
    /// Whether the agent counts as connected at `now_ms`: it did not say goodbye and
    /// has not been silent for [`SILENCE_MS`].
    pub fn shows_online(&self, now_ms: i64) -> bool {
        self.online && now_ms.saturating_sub(self.seen_at_ms) < SILENCE_MS
    }
}

/// `u64` sequence numbers in a signed 64-bit column, bit for bit.
fn seq_to_db(seq: u64) -> i64 {
    i64::from_ne_bytes(seq.to_ne_bytes())
}

impl Db {
    /// The stored view of an OpAMP agent, if any.
    pub async fn opamp_agent(&self, id: &str) -> Result<Option<StoredOpamp>, FleetError> {
        let row = sqlx::query("SELECT view, online, seen_at FROM agent_opamp WHERE agent_id = $1")
            .bind(id)
            .fetch_optional(self.pool())
            .await?;
        Ok(row.map(|r| stored(&r)))
    }

    /// Every stored OpAMP agent by id, for lists.
    pub async fn opamp_agents(&self) -> Result<HashMap<String, StoredOpamp>, FleetError> {
        let rows = sqlx::query("SELECT view, online, seen_at, agent_id FROM agent_opamp")
            .fetch_all(self.pool())
            .await?;
        Ok(rows.iter().map(|r| (r.get(3), stored(r))).collect())
    }

    /// Records a message of an OpAMP agent: its `agents` row and its view, together.
    pub async fn save_opamp(&self, a: &OpampAgent) -> Result<(), FleetError> {
        let mut tx = self.pool().begin().await?;
        sqlx::query(
            "INSERT INTO agents (id, name, platform, version, last_contact, agent_group, protocol)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (id) DO UPDATE SET name = excluded.name, platform = excluded.platform,
               version = excluded.version, last_contact = excluded.last_contact,
               agent_group = excluded.agent_group, protocol = excluded.protocol",
        )
        .bind(&a.id)
        .bind(&a.name)
        .bind(&a.platform)
        .bind(&a.version)
        .bind(a.at_ms / 1000)
        .bind(&a.group)
        .bind(PROTOCOL_OPAMP)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO agent_opamp (agent_id, view, sequence_num, online, accepts_packages, seen_at, accepts_remote_config)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (agent_id) DO UPDATE SET view = excluded.view,
               sequence_num = excluded.sequence_num, online = excluded.online,
               accepts_packages = excluded.accepts_packages, seen_at = excluded.seen_at,
               accepts_remote_config = excluded.accepts_remote_config",
        )
        .bind(&a.id)
        .bind(&a.view)
        .bind(a.sequence_num.map(seq_to_db))
        .bind(i64::from(a.online))
        .bind(i64::from(a.accepts_packages))
        .bind(a.at_ms)
        .bind(i64::from(a.accepts_remote_config))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Replaces what is kept of the agent's view (JSON) alone: what this server offered
    /// it changed after its message was stored.
    pub async fn set_opamp_view(&self, id: &str, view: &str) -> Result<(), FleetError> {
        sqlx::query("UPDATE agent_opamp SET view = $2 WHERE agent_id = $1")
            .bind(id)
            .bind(view)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// The agent is gone (its WebSocket closed): it shows offline until it speaks.
    pub async fn opamp_offline(&self, id: &str) -> Result<(), FleetError> {
        sqlx::query("UPDATE agent_opamp SET online = 0 WHERE agent_id = $1")
            .bind(id)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// A connected agent that sends nothing (a quiet WebSocket) is still there.
    pub async fn opamp_seen(&self, id: &str, at_ms: i64) -> Result<(), FleetError> {
        sqlx::query("UPDATE agent_opamp SET seen_at = $2 WHERE agent_id = $1 AND online = 1")
            .bind(id)
            .bind(at_ms)
            .execute(self.pool())
            .await?;
        sqlx::query("UPDATE agents SET last_contact = $2 WHERE id = $1")
            .bind(id)
            .bind(at_ms / 1000)
            .execute(self.pool())
            .await?;
        Ok(())
    }
}

fn stored(r: &sqlx::any::AnyRow) -> StoredOpamp {
    StoredOpamp {
        view: r.get(0),
        online: r.get::<i64, _>(1) != 0,
        seen_at_ms: r.get(2),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(id: &str, at_ms: i64) -> OpampAgent {
        OpampAgent {
            id: id.into(),
            name: "svc".into(),
            platform: "linux".into(),
            version: "1.0".into(),
            group: "canary".into(),
            view: "{\"online\":true}".into(),
            sequence_num: Some(u64::MAX),
            online: true,
            accepts_packages: false,
            accepts_remote_config: true,
            at_ms,
        }
    }

    #[test]
    fn silence_and_goodbye_show_offline() {
        let s = StoredOpamp {
            view: String::new(),
            online: true,
            seen_at_ms: 1_000_000,
        };
        assert!(s.shows_online(1_000_000 + SILENCE_MS - 1));
        assert!(!s.shows_online(1_000_000 + SILENCE_MS));
        let gone = StoredOpamp { online: false, ..s };
        assert!(!gone.shows_online(1_000_000));
    }

    #[tokio::test]
    async fn opamp_agents_are_agents_with_a_view_beside_them() {
        let home = tempfile::tempdir().unwrap();
        let db = Db::open("", home.path(), 1).await.unwrap();
        db.touch_agent(&crate::db::Contact {
            id: "native-1",
            name: "n",
            platform: "p",
            version: "2.0.0+1",
            group: None,
            config_hash: None,
            labels: None,
            at: 10,
        })
        .await
        .unwrap();
        db.save_opamp(&agent("op-1", 20_000)).await.unwrap();
        db.save_opamp(&OpampAgent {
            view: "{\"online\":false}".into(),
            ..agent("op-1", 30_000)
        })
        .await
        .unwrap();
        let all = db.agents(None, None).await.unwrap();
        assert_eq!(all.len(), 2);
        let op = db.agent("op-1").await.unwrap().unwrap();
        assert_eq!((op.group.as_str(), op.last_contact), ("canary", 30));
        let views = db.opamp_agents().await.unwrap();
        assert_eq!(views.len(), 1);
        assert_eq!(views["op-1"].view, "{\"online\":false}");
        let protocols: Vec<(String, String)> =
            sqlx::query_as("SELECT id, protocol FROM agents ORDER BY id")
                .fetch_all(db.pool())
                .await
                .unwrap();
        assert_eq!(
            protocols,
            [
                ("native-1".into(), PROTOCOL_NATIVE.into()),
                ("op-1".into(), PROTOCOL_OPAMP.into())
            ]
        );
        db.opamp_offline("op-1").await.unwrap();
        let s = db.opamp_agent("op-1").await.unwrap().unwrap();
        assert!(!s.online && s.seen_at_ms == 30_000);
        db.opamp_seen("op-1", 40_000).await.unwrap();
        // Seen while offline does not bring it back: only a message does.
        assert!(!db.opamp_agent("op-1").await.unwrap().unwrap().online);
        assert!(db.opamp_agent("nobody").await.unwrap().is_none());
    }
}
