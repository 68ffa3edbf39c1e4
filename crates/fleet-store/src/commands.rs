//! What an operator asks of an agent beyond a release, as the OpAMP seed's server
//! offers it (docs/commands.md): restart the agent or only its workload, rotate its
//! credential, move it to another server URL.
//!
//! One model for every protocol: a command is a row of `agent_commands` (the latest of
//! each kind per agent), `PENDING` until a contact carries it, `SENT` until the agent
//! says how it ended (`DONE` or `FAILED`). A rotation ends when the server takes the new
//! credential: the agent proves it, and the old one is refused from then on. The edges
//! translate: native agents read it in their connect answer, OpAMP agents as a
//! `ServerToAgentCommand` or a `ConnectionSettingsOffers`. Which command a contact
//! carries is decided here ([`deliver`]), without a database.

use std::collections::HashMap;

use sqlx::Row;
use sqlx::any::AnyRow;

use crate::db::Db;
use crate::error::FleetError;

/// What is asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Restart the agent (argument `agent`) or only its workload (`workload`).
    Restart,
    /// Offer a new credential; the old one is refused once the agent proves the new.
    RotateCredentials,
    /// Try another server URL (the argument) and keep it only if it answers.
    Move,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Restart => "restart",
            Kind::RotateCredentials => "rotate-credentials",
            Kind::Move => "move",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "restart" => Some(Kind::Restart),
            "rotate-credentials" => Some(Kind::RotateCredentials),
            "move" => Some(Kind::Move),
            _ => None,
        }
    }
}

/// Where a command stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Asked; no contact carried it yet.
    Pending,
    /// Carried to the agent at least once; it has not said how it ended.
    Sent,
    Done,
    Failed,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "PENDING",
            Status::Sent => "SENT",
            Status::Done => "DONE",
            Status::Failed => "FAILED",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "PENDING" => Some(Status::Pending),
            "SENT" => Some(Status::Sent),
            "DONE" => Some(Status::Done),
            "FAILED" => Some(Status::Failed),
            _ => None,
        }
    }

    /// Still to be carried to the agent.
    pub fn is_open(self) -> bool {
        matches!(self, Status::Pending | Status::Sent)
    }
}

/// `argument` of a restart of the agent itself.
pub const RESTART_AGENT: &str = "agent";
/// `argument` of a restart of the workload alone.
pub const RESTART_WORKLOAD: &str = "workload";

/// One command, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    pub agent: String,
    pub kind: Kind,
    /// Random, unique in the fleet: what the agent reports against.
    pub id: String,
    /// A restart's `agent` or `workload`, a move's URL; empty for a rotation.
    pub argument: String,
    pub status: Status,
    pub error: Option<String>,
    /// Unix seconds.
    pub created_at: i64,
    pub updated_at: i64,
}

impl Command {
    /// As `/admin/agents` shows it (`"last_command"`).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "id": self.id,
            "kind": self.kind.as_str(),
            "argument": self.argument,
            "status": self.status.as_str(),
            "error": self.error,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        })
    }
}

/// What one contact of an agent carries, of its open commands.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Delivery<'a> {
    pub restart: Option<&'a Command>,
    pub rotate: Option<&'a Command>,
    pub move_to: Option<&'a Command>,
    /// One of them was never carried before: a held connect is answered at once.
    pub news: bool,
}

/// Which of `open` (one agent's commands) a contact carries: every open one, each kind
/// once (the table keeps one per kind). A command already carried is carried again
/// (its answer may have been lost; the agent acts on an id once), but it is news only
/// the first time, so an agent that does not take commands (one from an older release)
/// is not answered at once on every held connect.
pub fn deliver(open: &[Command]) -> Delivery<'_> {
    let mut d = Delivery::default();
    for c in open.iter().filter(|c| c.status.is_open()) {
        let slot = match c.kind {
            Kind::Restart => &mut d.restart,
            Kind::RotateCredentials => &mut d.rotate,
            Kind::Move => &mut d.move_to,
        };
        *slot = Some(c);
        d.news |= c.status == Status::Pending;
    }
    d
}

/// Whether a credential set at `set_at` (unix seconds) is due for rotation at `now`
/// under `agents.rotate-every` (`None`: off). A credential of unknown age is not: its
/// age is counted from when this server first saw it (see [`Db::start_credential_clocks`]).
pub fn rotation_due(set_at: Option<i64>, every_secs: Option<i64>, now: i64) -> bool {
    match (set_at, every_secs) {
        (Some(at), Some(every)) if every > 0 => now.saturating_sub(at) >= every,
        _ => false,
    }
}

/// A fresh command id: 16 random bytes, hex.
fn new_id() -> Result<String, FleetError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|e| FleetError::Config(format!("no randomness for a command id: {e}")))?;
    Ok(hex::encode(bytes))
}

/// What `/admin/agents` adds of an agent beyond its row.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extras {
    /// When its credential was set (unix seconds), if known.
    pub credential_at: Option<i64>,
    /// What a native agent said it takes, at its last register.
    pub capabilities: Option<Vec<String>>,
    /// The server URL a native agent used at its last register.
    pub endpoint: Option<String>,
}

const COMMAND_COLUMNS: &str = "SELECT agent_id, kind, id, argument, status, error, created_at, updated_at FROM agent_commands";

fn command_row(r: &AnyRow) -> Option<Command> {
    Some(Command {
        agent: r.get(0),
        kind: Kind::parse(&r.get::<String, _>(1))?,
        id: r.get(2),
        argument: r.get(3),
        status: Status::parse(&r.get::<String, _>(4))?,
        error: r.get(5),
        created_at: r.get(6),
        updated_at: r.get(7),
    })
}

impl Db {
    /// Asks `kind` of `agent`, replacing the command of that kind it had (done or not).
    /// `None` if the fleet does not know the agent (or it was revoked).
    pub async fn request_command(
        &self,
        agent: &str,
        kind: Kind,
        argument: &str,
        at: i64,
    ) -> Result<Option<Command>, FleetError> {
        let known = sqlx::query(
            "SELECT id FROM agents WHERE id = $1 AND id NOT IN (SELECT id FROM agents_revoked)",
        )
        .bind(agent)
        .fetch_optional(self.pool())
        .await?
        .is_some();
        if !known {
            return Ok(None);
        }
        let command = Command {
            agent: agent.to_owned(),
            kind,
            id: new_id()?,
            argument: argument.to_owned(),
            status: Status::Pending,
            error: None,
            created_at: at,
            updated_at: at,
        };
        sqlx::query(
            "INSERT INTO agent_commands (agent_id, kind, id, argument, status, error, created_at, updated_at)
             VALUES ($1, $2, $3, $4, $5, NULL, $6, $6)
             ON CONFLICT (agent_id, kind) DO UPDATE SET id = excluded.id, argument = excluded.argument,
               status = excluded.status, error = NULL, created_at = excluded.created_at,
               updated_at = excluded.updated_at",
        )
        .bind(agent)
        .bind(kind.as_str())
        .bind(&command.id)
        .bind(argument)
        .bind(Status::Pending.as_str())
        .bind(at)
        .execute(self.pool())
        .await?;
        Ok(Some(command))
    }

    /// Every command still to be carried, of every agent.
    pub async fn open_commands(&self) -> Result<HashMap<String, Vec<Command>>, FleetError> {
        let rows = sqlx::query(&format!(
            "{COMMAND_COLUMNS} WHERE status IN ('PENDING', 'SENT')"
        ))
        .fetch_all(self.pool())
        .await?;
        let mut open: HashMap<String, Vec<Command>> = HashMap::new();
        for c in rows.iter().filter_map(command_row) {
            open.entry(c.agent.clone()).or_default().push(c);
        }
        Ok(open)
    }

    /// The command `id`, if any.
    pub async fn command(&self, id: &str) -> Result<Option<Command>, FleetError> {
        let row = sqlx::query(&format!("{COMMAND_COLUMNS} WHERE id = $1"))
            .bind(id)
            .fetch_optional(self.pool())
            .await?;
        Ok(row.as_ref().and_then(command_row))
    }

    /// The latest command of each agent, for `/admin/agents`.
    pub async fn last_commands(&self) -> Result<HashMap<String, Command>, FleetError> {
        let rows = sqlx::query(COMMAND_COLUMNS).fetch_all(self.pool()).await?;
        let mut last: HashMap<String, Command> = HashMap::new();
        for c in rows.iter().filter_map(command_row) {
            match last.get(&c.agent) {
                Some(seen) if seen.updated_at > c.updated_at => {}
                _ => {
                    last.insert(c.agent.clone(), c);
                }
            }
        }
        Ok(last)
    }

    /// A contact carried command `id`: `PENDING` becomes `SENT`.
    pub async fn command_sent(&self, id: &str, at: i64) -> Result<(), FleetError> {
        sqlx::query(
            "UPDATE agent_commands SET status = 'SENT', updated_at = $2 WHERE id = $1 AND status = 'PENDING'",
        )
        .bind(id)
        .bind(at)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// How command `id` ended, as its agent says. False if it was not open (a repeat of
    /// a report already taken, or a command replaced since).
    pub async fn finish_command(
        &self,
        id: &str,
        status: Status,
        error: Option<&str>,
        at: i64,
    ) -> Result<bool, FleetError> {
        let done = sqlx::query(
            "UPDATE agent_commands SET status = $2, error = $3, updated_at = $4
             WHERE id = $1 AND status IN ('PENDING', 'SENT')",
        )
        .bind(id)
        .bind(status.as_str())
        .bind(error)
        .bind(at)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// A rotation offers `agent` the credential whose hash is `hash` (replacing one
    /// offered before and never proved).
    pub async fn offer_candidate(&self, agent: &str, hash: &str) -> Result<(), FleetError> {
        sqlx::query("UPDATE agents SET token_candidate = $2 WHERE id = $1")
            .bind(agent)
            .bind(hash)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// `agent` proved the credential a rotation offered it (whose hash is `hash`): it is
    /// its credential from now on and the old one is refused; the rotation is done.
    /// Every server of the fleet drops what it remembers of the old one (the credentials
    /// revision moves). False if `hash` is not its candidate.
    pub async fn accept_candidate(
        &self,
        agent: &str,
        hash: &str,
        at: i64,
    ) -> Result<bool, FleetError> {
        // Read first: a wrong token (anyone's guess) must not take the write lock.
        let offered = sqlx::query("SELECT 1 FROM agents WHERE id = $1 AND token_candidate = $2")
            .bind(agent)
            .bind(hash)
            .fetch_optional(self.pool())
            .await?
            .is_some();
        if !offered {
            return Ok(false);
        }
        let mut tx = self.begin_write().await?;
        let done = sqlx::query(
            "UPDATE agents SET token_hash = token_candidate, token_candidate = NULL, credential_at = $3
             WHERE id = $1 AND token_candidate = $2",
        )
        .bind(agent)
        .bind(hash)
        .bind(at)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() != 1 {
            return Ok(false);
        }
        sqlx::query(
            "UPDATE agent_commands SET status = 'DONE', error = NULL, updated_at = $2
             WHERE agent_id = $1 AND kind = 'rotate-credentials' AND status IN ('PENDING', 'SENT')",
        )
        .bind(agent)
        .bind(at)
        .execute(&mut *tx)
        .await?;
        crate::db::credentials_changed(&mut tx, agent).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// What a native agent said at its register: the commands it takes and the URL it
    /// used.
    pub async fn record_register(
        &self,
        agent: &str,
        capabilities: &[String],
        endpoint: Option<&str>,
    ) -> Result<(), FleetError> {
        let capabilities = serde_json::to_string(capabilities).unwrap_or_default();
        sqlx::query("UPDATE agents SET capabilities = $2, endpoint = $3 WHERE id = $1")
            .bind(agent)
            .bind(capabilities)
            .bind(endpoint)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Every agent's [`Extras`], by id.
    pub async fn agent_extras(&self) -> Result<HashMap<String, Extras>, FleetError> {
        let rows = sqlx::query("SELECT id, credential_at, capabilities, endpoint FROM agents")
            .fetch_all(self.pool())
            .await?;
        Ok(rows
            .iter()
            .map(|r| {
                let capabilities: Option<String> = r.get(2);
                (
                    r.get::<String, _>(0),
                    Extras {
                        credential_at: r.get(1),
                        capabilities: capabilities.and_then(|c| serde_json::from_str(&c).ok()),
                        endpoint: r.get(3),
                    },
                )
            })
            .collect())
    }

    /// Starts the age of every credential whose age is unknown (issued before the
    /// fleet kept it) at `now`, so `agents.rotate-every` rotates it one period later
    /// rather than the whole fleet at once.
    pub async fn start_credential_clocks(&self, now: i64) -> Result<(), FleetError> {
        sqlx::query(
            "UPDATE agents SET credential_at = $1 WHERE credential_at IS NULL AND token_hash IS NOT NULL",
        )
        .bind(now)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// The agents whose credential is older than `cutoff` (unix seconds) and that have
    /// no rotation under way.
    pub async fn credentials_older_than(&self, cutoff: i64) -> Result<Vec<String>, FleetError> {
        let rows = sqlx::query(
            "SELECT id FROM agents WHERE token_hash IS NOT NULL AND credential_at < $1
             AND id NOT IN (SELECT id FROM agents_revoked)
             AND id NOT IN (SELECT agent_id FROM agent_commands
                            WHERE kind = 'rotate-credentials' AND status IN ('PENDING', 'SENT'))",
        )
        .bind(cutoff)
        .fetch_all(self.pool())
        .await?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command(kind: Kind, status: Status) -> Command {
        Command {
            agent: "a1".into(),
            kind,
            id: format!("{}-{}", kind.as_str(), status.as_str()),
            argument: String::new(),
            status,
            error: None,
            created_at: 1,
            updated_at: 1,
        }
    }

    #[test]
    fn a_contact_carries_every_open_command_and_is_news_only_for_one_never_carried() {
        let open = [
            command(Kind::Restart, Status::Sent),
            command(Kind::Move, Status::Pending),
            command(Kind::RotateCredentials, Status::Done),
        ];
        let d = deliver(&open);
        assert_eq!(d.restart.map(|c| c.kind), Some(Kind::Restart));
        assert_eq!(d.move_to.map(|c| c.kind), Some(Kind::Move));
        assert_eq!(d.rotate, None, "a finished rotation is not offered again");
        assert!(d.news, "the move was never carried");

        let carried = [command(Kind::Restart, Status::Sent)];
        let d = deliver(&carried);
        assert!(d.restart.is_some(), "carried again: its answer may be lost");
        assert!(!d.news, "but a held connect is not answered for it again");
        assert_eq!(deliver(&[]), Delivery::default());
    }

    #[test]
    fn rotation_is_due_only_when_switched_on_and_the_credential_is_old_enough() {
        let day = 86_400;
        assert!(!rotation_due(Some(0), None, 100 * day), "off by default");
        assert!(!rotation_due(Some(0), Some(0), 100 * day), "0 is off too");
        assert!(!rotation_due(None, Some(day), 100 * day), "unknown age");
        assert!(!rotation_due(Some(10 * day), Some(90 * day), 99 * day));
        assert!(rotation_due(Some(10 * day), Some(90 * day), 100 * day));
    }

    /// An agent enrolled with `token`, in a fresh database.
    async fn fleet_with(token: &str) -> (tempfile::TempDir, Db) {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open("", dir.path(), 1).await.unwrap();
        let contact = crate::db::Contact {
            id: "a1",
            name: "h",
            platform: "x86_64-unknown-linux-gnu",
            version: "1.0.0+1",
            group: None,
            config_hash: None,
            labels: None,
            at: 100,
        };
        let hash = crate::credentials::hash_token(token);
        assert!(db.enroll(&contact, None, &hash).await.unwrap());
        (dir, db)
    }

    #[tokio::test]
    async fn a_rotation_ends_when_the_candidate_is_proved_and_the_old_token_is_refused() {
        use crate::credentials::{Verdict, decide, hash_token};
        let (_dir, db) = fleet_with("old").await;
        assert_eq!(
            db.agent_extras().await.unwrap()["a1"].credential_at,
            Some(100),
            "the credential's age starts at its enrollment"
        );
        let asked = db
            .request_command("a1", Kind::RotateCredentials, "", 200)
            .await
            .unwrap()
            .unwrap();
        assert!(
            db.request_command("ghost", Kind::Restart, "agent", 200)
                .await
                .unwrap()
                .is_none()
        );
        db.offer_candidate("a1", &hash_token("new")).await.unwrap();
        // Anything but the candidate changes nothing.
        assert!(
            !db.accept_candidate("a1", &hash_token("guess"), 300)
                .await
                .unwrap()
        );
        let known = db.credentials("a1").await.unwrap();
        assert_eq!(
            decide(&known, Some("old"), "", None),
            Verdict::Allow { issue: false }
        );

        assert!(
            db.accept_candidate("a1", &hash_token("new"), 300)
                .await
                .unwrap()
        );
        let known = db.credentials("a1").await.unwrap();
        assert_eq!(
            decide(&known, Some("new"), "", None),
            Verdict::Allow { issue: false }
        );
        assert!(matches!(
            decide(&known, Some("old"), "", None),
            Verdict::Deny(_)
        ));
        assert!(
            !db.accept_candidate("a1", &hash_token("new"), 301)
                .await
                .unwrap(),
            "a candidate is taken once"
        );
        let done = db.command(&asked.id).await.unwrap().unwrap();
        assert_eq!(done.status, Status::Done);
        assert_eq!(
            db.agent_extras().await.unwrap()["a1"].credential_at,
            Some(300)
        );
        assert!(db.open_commands().await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_command_is_open_until_its_agent_says_how_it_ended_and_a_new_one_replaces_it() {
        let (_dir, db) = fleet_with("t").await;
        let first = db
            .request_command("a1", Kind::Restart, RESTART_AGENT, 10)
            .await
            .unwrap()
            .unwrap();
        db.command_sent(&first.id, 11).await.unwrap();
        let open = db.open_commands().await.unwrap();
        assert_eq!(open["a1"][0].status, Status::Sent);
        let second = db
            .request_command("a1", Kind::Restart, RESTART_WORKLOAD, 12)
            .await
            .unwrap()
            .unwrap();
        assert!(
            !db.finish_command(&first.id, Status::Done, None, 13)
                .await
                .unwrap(),
            "the replaced command's report changes nothing"
        );
        assert!(
            db.finish_command(&second.id, Status::Failed, Some("no workload"), 14)
                .await
                .unwrap()
        );
        assert!(
            !db.finish_command(&second.id, Status::Done, None, 15)
                .await
                .unwrap()
        );
        let last = db.last_commands().await.unwrap().remove("a1").unwrap();
        assert_eq!(
            (last.argument.as_str(), last.status, last.error.as_deref()),
            (RESTART_WORKLOAD, Status::Failed, Some("no workload"))
        );
        assert!(db.open_commands().await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn rotate_every_finds_old_credentials_once_and_starts_the_clock_of_unknown_ones() {
        let (_dir, db) = fleet_with("t").await;
        // Enrolled at 100: old at 1,000 with a period of 500, not at 550.
        assert!(
            db.credentials_older_than(550 - 500)
                .await
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            db.credentials_older_than(1_000 - 500).await.unwrap(),
            ["a1"]
        );
        let asked = db
            .request_command("a1", Kind::RotateCredentials, "", 1_000)
            .await
            .unwrap()
            .unwrap();
        assert!(
            db.credentials_older_than(500).await.unwrap().is_empty(),
            "a rotation under way is not asked again"
        );
        db.finish_command(&asked.id, Status::Failed, Some("gone"), 1_001)
            .await
            .unwrap();
        assert_eq!(db.credentials_older_than(500).await.unwrap(), ["a1"]);
        // A credential from before its age was kept starts counting when first looked at.
        sqlx::query("UPDATE agents SET credential_at = NULL")
            .execute(db.pool())
            .await
            .unwrap();
        assert!(
            db.credentials_older_than(i64::MAX)
                .await
                .unwrap()
                .is_empty()
        );
        db.start_credential_clocks(2_000).await.unwrap();
        assert_eq!(
            db.agent_extras().await.unwrap()["a1"].credential_at,
            Some(2_000)
        );
    }

    #[test]
    fn kinds_and_statuses_read_back_as_written() {
        for k in [Kind::Restart, Kind::RotateCredentials, Kind::Move] {
            assert_eq!(Kind::parse(k.as_str()), Some(k));
        }
        for s in [Status::Pending, Status::Sent, Status::Done, Status::Failed] {
            assert_eq!(Status::parse(s.as_str()), Some(s));
        }
        assert_eq!(Kind::parse("reboot"), None);
        assert!(Status::Sent.is_open() && !Status::Failed.is_open());
    }
}
