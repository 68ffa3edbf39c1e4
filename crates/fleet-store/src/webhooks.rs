//! Webhooks: the fleet's events POSTed, signed, to the URLs operators register.
//!
//! Events are not sent from where they happen. Each server *feeds* ([`Webhooks::feed`])
//! the fleet's own records into an outbox in the fleet database: a rollout's `halted`
//! and `completed` events (`rollout_events`), agents' failed outcomes
//! (`rollout_agents`), published releases, deployment changes and approval requests
//! (the audit log). An event's id is made from the record it comes from, and the outbox
//! holds an event once per webhook (a unique key), so servers feeding the same records
//! at once add each event once. A server then leases due rows ([`Webhooks::claim`]) and
//! POSTs them; whatever answers, [`Webhooks::finish`] records the attempt and, on a
//! failure, when to try again ([`retry_at`], pure) until `webhooks.retry-for` has passed.
//! A lease outlives a try, so a row is POSTed by one server at a time; a server that
//! dies holding one leaves it to another once the lease ends (the receiver may then see
//! an event twice, with the same `X-Event-Id`).
//!
//! Nothing here speaks HTTP: the server's `webhooks` module sends what
//! [`Due`] holds and says what came back.

use std::time::Duration;

use hmac::{Hmac, Mac};
use serde::Serialize;
use sha2::{Digest, Sha256};
use sqlx::Row;

use crate::db::{Backend, Db};
use crate::error::FleetError;

/// The events a webhook may ask for.
pub const EVENTS: [&str; 6] = [
    "rollout.halted",
    "rollout.completed",
    "agent.failed",
    "release.published",
    "approval.requested",
    "deployment.changed",
];

/// What `webhook test ID` sends (to that webhook alone, whatever its events).
pub const TEST_EVENT: &str = "webhook.test";

/// Records this recent are read again at every feed: a transaction that began earlier
/// may commit them after a later one's (ids and times are taken before commit).
pub const SETTLE_MS: i64 = 30_000;

/// A cursor with nothing new behind it is written once it would move this far.
const CURSOR_STEP_MS: i64 = 10_000;

/// Records read from one source per feed at most.
const FEED_BATCH: i64 = 1000;

/// The first retry comes this long after a failed try; each next one twice as long…
const FIRST_RETRY_MS: i64 = 1_000;
/// …up to this.
const LONGEST_RETRY_MS: i64 = 300_000;

/// The webhook signature's header value for `body` signed with `secret`:
/// `sha256=<hex HMAC-SHA256>`, as GitHub writes `X-Hub-Signature-256`.
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    // An HMAC takes a key of any length: new_from_slice fails for none.
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret) else {
        return String::new();
    };
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// When to try a delivery again after its `attempts`-th try failed at `now`: 1 s, 2 s,
/// 4 s, … at most 5 minutes apart, while that is within `retry_for` of the event's
/// `created_at`; `None`: give up. Unix milliseconds.
pub fn retry_at(attempts: u32, created_at: i64, now: i64, retry_for: Duration) -> Option<i64> {
    let doublings = attempts.saturating_sub(1).min(20);
    let wait = FIRST_RETRY_MS
        .saturating_mul(1 << doublings)
        .min(LONGEST_RETRY_MS);
    let next = now.saturating_add(wait);
    let deadline =
        created_at.saturating_add(i64::try_from(retry_for.as_millis()).unwrap_or(i64::MAX));
    (next <= deadline).then_some(next)
}

/// An event's body: `{"id", "event", "at", "fleet", "data"}`, `at` in RFC 3339.
pub fn body(id: &str, event: &str, at_ms: i64, fleet: &str, data: &serde_json::Value) -> String {
    let at = jiff::Timestamp::from_millisecond(at_ms)
        .map(|t| t.to_string())
        .unwrap_or_default();
    serde_json::json!({
        "id": id,
        "event": event,
        "at": at,
        "fleet": fleet,
        "data": data,
    })
    .to_string()
}

/// An event's id, from the record it was made of: the same on every server.
fn event_id(source_key: &str) -> String {
    let digest = Sha256::digest(source_key.as_bytes());
    hex::encode(&digest[..16])
}

/// Checks what `webhook add` asks for; the words say what to change.
pub fn check_new(url: &str, events: &[String], secret: &str) -> Result<(), FleetError> {
    let bad = |m: String| Err(FleetError::Invalid(m));
    let lower = url.to_ascii_lowercase();
    if !(lower.starts_with("http://") || lower.starts_with("https://"))
        || url.len() > 2048
        || url.chars().any(char::is_whitespace)
    {
        return bad(format!(
            "a webhook's URL is http:// or https://, without spaces (got {:?})",
            agent_protocol::shown::shown(url, 60)
        ));
    }
    if events.is_empty() {
        return bad(format!(
            "say which events to send (--events), of: {}",
            EVENTS.join(", ")
        ));
    }
    if let Some(unknown) = events.iter().find(|e| !EVENTS.contains(&e.as_str())) {
        return bad(format!(
            "no event is called {:?}; the events are {}",
            agent_protocol::shown::shown(unknown, 40),
            EVENTS.join(", ")
        ));
    }
    if secret.len() < 16 {
        return bad(
            "the secret is shorter than 16 bytes; make one with `openssl rand -hex 32 > FILE`"
                .into(),
        );
    }
    Ok(())
}

/// A registered webhook, as listed (never its secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Webhook {
    pub id: i64,
    pub url: String,
    pub events: Vec<String>,
    pub created_at: i64,
    pub created_by: String,
    /// Events waiting to be delivered (or retried), delivered, and given up on.
    pub pending: i64,
    pub delivered: i64,
    pub failed: i64,
}

/// One try to deliver an event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Attempt {
    pub event_id: String,
    pub event: String,
    /// 1 for the first try of the event.
    pub attempt: i64,
    /// Unix milliseconds.
    pub at: i64,
    pub server: String,
    /// The receiver's HTTP status; 0 when it gave none (refused, timed out).
    pub status: i64,
    pub error: String,
    pub millis: i64,
}

/// An event leased for delivery: where to POST what, signed with what.
#[derive(Debug, Clone)]
pub struct Due {
    pub row: i64,
    pub webhook: i64,
    pub url: String,
    pub secret: String,
    pub event_id: String,
    pub event: String,
    pub body: String,
    /// Tries before this one.
    pub attempts: u32,
    pub created_at: i64,
}

/// What a try came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tried {
    /// The receiver answered 2xx.
    Delivered { status: u16 },
    /// It answered otherwise (`status`), or not at all (0), and why.
    Failed { status: u16, error: String },
}

/// An event the fleet's records say happened, before it is given to webhooks.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// What it is made of (`rollout_events:12`): the event's id comes from it.
    pub key: String,
    pub event: &'static str,
    pub at: i64,
    pub data: serde_json::Value,
}

/// The event an audit entry is, if any (pure): a published release, a deployment
/// changed, an approval asked for.
pub fn event_of_audit(
    id: i64,
    at: i64,
    who: &str,
    action: &str,
    outcome: &str,
    details: &serde_json::Value,
) -> Option<Event> {
    let event = match action {
        "release.publish" if outcome == "done" => "release.published",
        a if a.starts_with("deployment.") && outcome == "done" => "deployment.changed",
        a if a.starts_with("approval.request") && outcome != "refused" => "approval.requested",
        _ => return None,
    };
    Some(Event {
        key: format!("audit_log:{id}"),
        event,
        at,
        data: serde_json::json!({ "action": action, "who": who, "details": details }),
    })
}

/// The fleet's webhooks, their outbox and their deliveries.
#[derive(Clone)]
pub struct Webhooks {
    db: Db,
    server: String,
}

impl Webhooks {
    /// `server` names this server in the attempts it records.
    pub fn new(db: Db, server: String) -> Self {
        Self { db, server }
    }

    /// Registers a webhook; checked with [`check_new`].
    pub async fn add(
        &self,
        url: &str,
        events: &[String],
        secret: &str,
        by: &str,
        now: i64,
    ) -> Result<Webhook, FleetError> {
        check_new(url, events, secret)?;
        let row = sqlx::query(
            "INSERT INTO webhooks (url, events, secret, created_at, created_by) VALUES ($1, $2, $3, $4, $5) RETURNING id",
        )
        .bind(url)
        .bind(events.join(","))
        .bind(secret)
        .bind(now)
        .bind(by)
        .fetch_one(self.db.pool())
        .await?;
        Ok(Webhook {
            id: row.try_get(0)?,
            url: url.to_owned(),
            events: events.to_vec(),
            created_at: now,
            created_by: by.to_owned(),
            pending: 0,
            delivered: 0,
            failed: 0,
        })
    }

    /// Every webhook, oldest first, with its outbox's counts.
    pub async fn list(&self) -> Result<Vec<Webhook>, FleetError> {
        let rows = sqlx::query(
            "SELECT w.id, w.url, w.events, w.created_at, w.created_by,
                    CAST(COALESCE(SUM(CASE WHEN o.state = 'pending' THEN 1 ELSE 0 END), 0) AS BIGINT),
                    CAST(COALESCE(SUM(CASE WHEN o.state = 'delivered' THEN 1 ELSE 0 END), 0) AS BIGINT),
                    CAST(COALESCE(SUM(CASE WHEN o.state = 'failed' THEN 1 ELSE 0 END), 0) AS BIGINT)
             FROM webhooks w LEFT JOIN webhook_outbox o ON o.webhook_id = w.id
             GROUP BY w.id, w.url, w.events, w.created_at, w.created_by ORDER BY w.id",
        )
        .fetch_all(self.db.pool())
        .await?;
        rows.iter()
            .map(|r| {
                let events: String = r.try_get(2)?;
                Ok(Webhook {
                    id: r.try_get(0)?,
                    url: r.try_get(1)?,
                    events: events.split(',').map(str::to_owned).collect(),
                    created_at: r.try_get(3)?,
                    created_by: r.try_get(4)?,
                    pending: r.try_get(5)?,
                    delivered: r.try_get(6)?,
                    failed: r.try_get(7)?,
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(FleetError::from)
    }

    /// The webhook `id`, if there is one.
    pub async fn get(&self, id: i64) -> Result<Option<Webhook>, FleetError> {
        Ok(self.list().await?.into_iter().find(|w| w.id == id))
    }

    /// Removes webhook `id` with its outbox and attempts; false if there was none.
    pub async fn remove(&self, id: i64) -> Result<bool, FleetError> {
        let mut tx = self.db.begin_write().await?;
        let gone = sqlx::query("DELETE FROM webhooks WHERE id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        for table in ["webhook_outbox", "webhook_attempts"] {
            sqlx::query(&format!("DELETE FROM {table} WHERE webhook_id = $1"))
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(gone == 1)
    }

    /// Queues a [`TEST_EVENT`] for webhook `id` alone; its event id, or `None` if
    /// there is no such webhook.
    pub async fn test(&self, id: i64, by: &str, now: i64) -> Result<Option<String>, FleetError> {
        if self.get(id).await?.is_none() {
            return Ok(None);
        }
        let mut nonce = [0u8; 16];
        getrandom::fill(&mut nonce)
            .map_err(|e| FleetError::Invalid(format!("no randomness for an event id: {e}")))?;
        let event = Event {
            key: format!("test:{}", hex::encode(nonce)),
            event: TEST_EVENT,
            at: now,
            data: serde_json::json!({ "webhook": id, "by": by }),
        };
        let fleet = self.fleet_name().await?;
        let mut tx = self.db.begin_write().await?;
        let id_of = enqueue(&mut tx, id, &event, &fleet, now).await?;
        tx.commit().await?;
        Ok(Some(id_of))
    }

    /// The last `limit` attempts to deliver to webhook `id`, newest first.
    pub async fn deliveries(&self, id: i64, limit: i64) -> Result<Vec<Attempt>, FleetError> {
        let rows = sqlx::query(
            "SELECT event_id, event, attempt, at, server, status, error, millis FROM webhook_attempts
             WHERE webhook_id = $1 ORDER BY id DESC LIMIT $2",
        )
        .bind(id)
        .bind(limit.clamp(1, 1000))
        .fetch_all(self.db.pool())
        .await?;
        rows.iter()
            .map(|r| {
                Ok(Attempt {
                    event_id: r.try_get(0)?,
                    event: r.try_get(1)?,
                    attempt: r.try_get(2)?,
                    at: r.try_get(3)?,
                    server: r.try_get(4)?,
                    status: r.try_get(5)?,
                    error: r.try_get(6)?,
                    millis: r.try_get(7)?,
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(FleetError::from)
    }

    /// The fleet's name in event bodies: `fleet.name` in the settings, made once for
    /// the fleet (`fleet-<random>`) when unset.
    pub async fn fleet_name(&self) -> Result<String, FleetError> {
        if let Some(name) = self.db.setting(FLEET_NAME).await? {
            return Ok(name);
        }
        let mut nonce = [0u8; 4];
        getrandom::fill(&mut nonce)
            .map_err(|e| FleetError::Invalid(format!("no randomness for a fleet name: {e}")))?;
        sqlx::query(
            "INSERT INTO settings (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING",
        )
        .bind(FLEET_NAME)
        .bind(format!("fleet-{}", hex::encode(nonce)))
        .execute(self.db.pool())
        .await?;
        Ok(self.db.setting(FLEET_NAME).await?.unwrap_or_default())
    }

    /// Turns the fleet's records since the last feed into outbox rows for the webhooks
    /// that asked for them. Any server may feed at any time: an event is added once per
    /// webhook however many feed it. Returns how many rows were added.
    pub async fn feed(&self, now: i64) -> Result<u64, FleetError> {
        let hooks = self.subscriptions().await?;
        let fleet = if hooks.is_empty() {
            String::new()
        } else {
            self.fleet_name().await?
        };
        let mut added = 0;
        for source in [Source::Rollouts, Source::Agents, Source::Audit] {
            let from = self.cursor(source, now).await?;
            let events = self.read(source, from).await?;
            let read_to = next_cursor(from, &events, now, FEED_BATCH);
            let wanted = events
                .iter()
                .any(|e| hooks.iter().any(|(_, w)| w.iter().any(|w| w == e.event)));
            // Nothing to add: the cursor is written only now and then, so a quiet fleet
            // takes no write lock (SQLite has one) twice a second.
            if !wanted && read_to - from < CURSOR_STEP_MS {
                continue;
            }
            let mut tx = self.db.begin_write().await?;
            for event in &events {
                for (hook, wanted) in &hooks {
                    if wanted.iter().any(|w| w == event.event) {
                        enqueue(&mut tx, *hook, event, &fleet, now).await?;
                        added += 1;
                    }
                }
            }
            sqlx::query(
                "INSERT INTO webhook_cursors (source, read_to) VALUES ($1, $2)
                 ON CONFLICT (source) DO UPDATE SET read_to = excluded.read_to
                 WHERE webhook_cursors.read_to < excluded.read_to",
            )
            .bind(source.name())
            .bind(read_to)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
        }
        Ok(added)
    }

    /// Leases up to `limit` events due at `now` for `lease`: this server's to POST.
    pub async fn claim(
        &self,
        now: i64,
        limit: i64,
        lease: Duration,
    ) -> Result<Vec<Due>, FleetError> {
        if limit <= 0 {
            return Ok(Vec::new());
        }
        let until = now.saturating_add(i64::try_from(lease.as_millis()).unwrap_or(i64::MAX));
        let pick = match self.db.backend() {
            // Rows another server is leasing now are skipped, not waited for.
            Backend::Postgres => {
                "SELECT id FROM webhook_outbox WHERE state = 'pending' AND next_at <= $2 AND lease_until <= $2 ORDER BY next_at, id LIMIT $3 FOR UPDATE SKIP LOCKED"
            }
            Backend::Sqlite => {
                "SELECT id FROM webhook_outbox WHERE state = 'pending' AND next_at <= $2 AND lease_until <= $2 ORDER BY next_at, id LIMIT $3"
            }
        };
        // Most looks find nothing due: they read, and take no write lock.
        let any = sqlx::query(
            "SELECT id FROM webhook_outbox WHERE state = 'pending' AND next_at <= $1 AND lease_until <= $1 LIMIT 1",
        )
        .bind(now)
        .fetch_optional(self.db.pool())
        .await?;
        if any.is_none() {
            return Ok(Vec::new());
        }
        let mut tx = self.db.begin_write().await?;
        let rows = sqlx::query(&format!(
            "UPDATE webhook_outbox SET lease_until = $1
             WHERE id IN ({pick}) AND state = 'pending' AND lease_until <= $2
             RETURNING id, webhook_id, event_id, event, body, attempts, created_at"
        ))
        .bind(until)
        .bind(now)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        let hooks = sqlx::query("SELECT id, url, secret FROM webhooks")
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        let mut due = Vec::with_capacity(rows.len());
        for r in &rows {
            let webhook: i64 = r.try_get(1)?;
            let Some(hook) = hooks
                .iter()
                .find(|h| h.try_get::<i64, _>(0).is_ok_and(|id| id == webhook))
            else {
                continue;
            };
            due.push(Due {
                row: r.try_get(0)?,
                webhook,
                url: hook.try_get(1)?,
                secret: hook.try_get(2)?,
                event_id: r.try_get(2)?,
                event: r.try_get(3)?,
                body: r.try_get(4)?,
                attempts: u32::try_from(r.try_get::<i64, _>(5)?).unwrap_or(u32::MAX),
                created_at: r.try_get(6)?,
            });
        }
        due.sort_by_key(|d| d.row);
        Ok(due)
    }

    /// Records a try of `due` that took `millis` and came to `tried` at `now`: delivered,
    /// due again at [`retry_at`], or given up. A delivery brings the webhook's other
    /// waiting events forward: its receiver is back.
    pub async fn finish(
        &self,
        due: &Due,
        tried: &Tried,
        millis: i64,
        now: i64,
        retry_for: Duration,
    ) -> Result<(), FleetError> {
        let attempt = due.attempts.saturating_add(1);
        let mut tx = self.db.begin_write().await?;
        let (status, error) = match tried {
            Tried::Delivered { status } => {
                sqlx::query(
                    "UPDATE webhook_outbox SET state = 'delivered', attempts = $2, lease_until = 0, done_at = $3 WHERE id = $1",
                )
                .bind(due.row)
                .bind(i64::from(attempt))
                .bind(now)
                .execute(&mut *tx)
                .await?;
                sqlx::query(
                    "UPDATE webhook_outbox SET next_at = $2 WHERE webhook_id = $1 AND state = 'pending' AND next_at > $2",
                )
                .bind(due.webhook)
                .bind(now)
                .execute(&mut *tx)
                .await?;
                (*status, String::new())
            }
            Tried::Failed { status, error } => {
                match retry_at(attempt, due.created_at, now, retry_for) {
                    Some(next) => sqlx::query(
                        "UPDATE webhook_outbox SET attempts = $2, next_at = $3, lease_until = 0 WHERE id = $1",
                    )
                    .bind(due.row)
                    .bind(i64::from(attempt))
                    .bind(next),
                    None => sqlx::query(
                        "UPDATE webhook_outbox SET state = 'failed', attempts = $2, lease_until = 0, done_at = $3 WHERE id = $1",
                    )
                    .bind(due.row)
                    .bind(i64::from(attempt))
                    .bind(now),
                }
                .execute(&mut *tx)
                .await?;
                (*status, error.clone())
            }
        };
        sqlx::query(
            "INSERT INTO webhook_attempts (webhook_id, event_id, event, attempt, at, server, status, error, millis)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(due.webhook)
        .bind(&due.event_id)
        .bind(&due.event)
        .bind(i64::from(attempt))
        .bind(now)
        .bind(&self.server)
        .bind(i64::from(status))
        .bind(error)
        .bind(millis)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Deletes delivered and given-up events, and attempts, older than `before`.
    pub async fn prune(&self, before: i64) -> Result<u64, FleetError> {
        let mut tx = self.db.begin_write().await?;
        let mut gone =
            sqlx::query("DELETE FROM webhook_outbox WHERE state <> 'pending' AND done_at < $1")
                .bind(before)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        gone += sqlx::query("DELETE FROM webhook_attempts WHERE at < $1")
            .bind(before)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(gone)
    }

    /// Each webhook's id and the events it asked for.
    async fn subscriptions(&self) -> Result<Vec<(i64, Vec<String>)>, FleetError> {
        let rows = sqlx::query("SELECT id, events FROM webhooks")
            .fetch_all(self.db.pool())
            .await?;
        rows.iter()
            .map(|r| {
                let events: String = r.try_get(1)?;
                Ok((
                    r.try_get(0)?,
                    events.split(',').map(str::to_owned).collect(),
                ))
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(FleetError::from)
    }

    /// Where `source` was read to; a fleet that never fed starts at `now` less
    /// [`SETTLE_MS`] (what happened before it had webhooks is not sent).
    async fn cursor(&self, source: Source, now: i64) -> Result<i64, FleetError> {
        let row = sqlx::query("SELECT read_to FROM webhook_cursors WHERE source = $1")
            .bind(source.name())
            .fetch_optional(self.db.pool())
            .await?;
        Ok(match row {
            Some(r) => r.try_get(0)?,
            None => now - SETTLE_MS,
        })
    }

    /// The events of `source` recorded after `from`, oldest first.
    async fn read(&self, source: Source, from: i64) -> Result<Vec<Event>, FleetError> {
        let pool = self.db.pool();
        let events = match source {
            Source::Rollouts => sqlx::query(
                "SELECT e.id, e.kind, e.wave, e.at, COALESCE(e.detail, ''), e.server,
                        r.id, r.rollout_kind, r.agent_group, COALESCE(r.version, ''), r.target
                 FROM rollout_events e JOIN rollouts r ON r.id = e.rollout_id
                 WHERE e.at > $1 AND e.kind IN ('halted', 'completed')
                 ORDER BY e.at, e.id LIMIT $2",
            )
            .bind(from)
            .bind(FEED_BATCH)
            .fetch_all(pool)
            .await?
            .iter()
            .map(|r| {
                let kind: String = r.try_get(1)?;
                let mut data = serde_json::json!({
                    "rollout": r.try_get::<i64, _>(6)?,
                    "kind": r.try_get::<String, _>(7)?,
                    "group": r.try_get::<String, _>(8)?,
                    "version": r.try_get::<String, _>(9)?,
                    "target": r.try_get::<String, _>(10)?,
                    "wave": r.try_get::<i64, _>(2)?,
                    "server": r.try_get::<String, _>(5)?,
                });
                let halted = kind == "halted";
                if halted {
                    data["reason"] = serde_json::json!(r.try_get::<String, _>(4)?);
                }
                Ok(Event {
                    key: format!("rollout_events:{}", r.try_get::<i64, _>(0)?),
                    event: if halted {
                        "rollout.halted"
                    } else {
                        "rollout.completed"
                    },
                    at: r.try_get(3)?,
                    data,
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()?,
            Source::Agents => sqlx::query(
                "SELECT ra.rollout_id, ra.agent_id, ra.outcome, ra.outcome_at, COALESCE(ra.error, ''),
                        r.rollout_kind, r.agent_group, COALESCE(r.version, ''), COALESCE(a.name, '')
                 FROM rollout_agents ra JOIN rollouts r ON r.id = ra.rollout_id
                 LEFT JOIN agents a ON a.id = ra.agent_id
                 WHERE ra.outcome_at > $1 AND ra.outcome IN ('INSTALL_FAILED', 'FAILED', 'TIMED_OUT')
                 ORDER BY ra.outcome_at LIMIT $2",
            )
            .bind(from)
            .bind(FEED_BATCH)
            .fetch_all(pool)
            .await?
            .iter()
            .map(|r| {
                let rollout: i64 = r.try_get(0)?;
                let agent: String = r.try_get(1)?;
                let outcome: String = r.try_get(2)?;
                Ok(Event {
                    key: format!("rollout_agents:{rollout}:{agent}:{outcome}"),
                    event: "agent.failed",
                    at: r.try_get(3)?,
                    data: serde_json::json!({
                        "agent": agent,
                        "name": r.try_get::<String, _>(8)?,
                        "rollout": rollout,
                        "kind": r.try_get::<String, _>(5)?,
                        "group": r.try_get::<String, _>(6)?,
                        "version": r.try_get::<String, _>(7)?,
                        "outcome": outcome,
                        "error": r.try_get::<String, _>(4)?,
                    }),
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()?,
            Source::Audit => {
                let rows = sqlx::query(
                    "SELECT id, at, who, action, outcome, details FROM audit_log
                     WHERE at > $1 AND outcome <> 'refused'
                       AND (action = 'release.publish' OR action LIKE 'deployment.%' OR action LIKE 'approval.%')
                     ORDER BY at, id LIMIT $2",
                )
                .bind(from)
                .bind(FEED_BATCH)
                .fetch_all(pool)
                .await?;
                let mut events = Vec::with_capacity(rows.len());
                for r in &rows {
                    let details: String = r.try_get(5)?;
                    let details = serde_json::from_str(&details).unwrap_or_default();
                    let at: i64 = r.try_get(1)?;
                    match event_of_audit(
                        r.try_get(0)?,
                        at,
                        &r.try_get::<String, _>(2)?,
                        &r.try_get::<String, _>(3)?,
                        &r.try_get::<String, _>(4)?,
                        &details,
                    ) {
                        Some(event) => events.push(event),
                        // Read, not sent: still moves the cursor.
                        None => events.push(Event {
                            key: String::new(),
                            event: "",
                            at,
                            data: serde_json::Value::Null,
                        }),
                    }
                }
                events
            }
        };
        Ok(events)
    }
}

/// Where a feed of `events` (read from `from`, at most `batch`) leaves its source's
/// cursor at `now` (pure): past what settled, never back. A full batch stops at its
/// last record's time (what shares it is read again, and added once).
pub fn next_cursor(from: i64, events: &[Event], now: i64, batch: i64) -> i64 {
    let settled = now - SETTLE_MS;
    let full = i64::try_from(events.len()).unwrap_or(i64::MAX) >= batch;
    let to = match events.last() {
        Some(last) if full => (last.at - 1).min(settled),
        _ => settled,
    };
    to.max(from)
}

const FLEET_NAME: &str = "fleet.name";

/// Where webhook events are read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Rollouts,
    Agents,
    Audit,
}

impl Source {
    fn name(self) -> &'static str {
        match self {
            Source::Rollouts => "rollout_events",
            Source::Agents => "rollout_agents",
            Source::Audit => "audit_log",
        }
    }
}

/// Adds `event` for `webhook` unless it is there already; its id.
async fn enqueue(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    webhook: i64,
    event: &Event,
    fleet: &str,
    now: i64,
) -> Result<String, sqlx::Error> {
    let id = event_id(&event.key);
    if event.event.is_empty() {
        return Ok(id);
    }
    sqlx::query(
        "INSERT INTO webhook_outbox (webhook_id, event_id, event, body, created_at, next_at)
         VALUES ($1, $2, $3, $4, $5, $5) ON CONFLICT (webhook_id, event_id) DO NOTHING",
    )
    .bind(webhook)
    .bind(&id)
    .bind(event.event)
    .bind(body(&id, event.event, event.at, fleet, &event.data))
    .bind(now)
    .execute(&mut **tx)
    .await?;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_is_signed_as_github_signs_one() {
        // RFC 4231, test case 2.
        assert_eq!(
            sign(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // GitHub's documented example.
        assert_eq!(
            sign(b"It's a Secret to Everybody", b"Hello, World!"),
            "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
        );
    }

    #[test]
    fn retries_back_off_to_five_minutes_and_end_with_the_retry_time() {
        let day = Duration::from_secs(86_400);
        assert_eq!(retry_at(1, 0, 0, day), Some(1_000));
        assert_eq!(retry_at(2, 0, 10_000, day), Some(12_000));
        assert_eq!(retry_at(3, 0, 10_000, day), Some(14_000));
        assert_eq!(retry_at(30, 0, 10_000, day), Some(310_000));
        assert_eq!(retry_at(u32::MAX, 0, 10_000, day), Some(310_000));
        // The next try would come after the event's day is over: give up.
        assert_eq!(retry_at(200, 0, 86_399_000, day), None);
        assert_eq!(retry_at(1, 0, 0, Duration::ZERO), None);
    }

    #[test]
    fn a_new_webhook_is_checked_and_the_words_say_what_to_change() {
        let events = vec!["rollout.halted".to_owned()];
        let secret = "0123456789abcdef";
        assert!(check_new("https://hooks.example/x", &events, secret).is_ok());
        let e = |url: &str, events: &[String], secret: &str| {
            check_new(url, events, secret).unwrap_err().to_string()
        };
        assert!(e("ftp://x", &events, secret).contains("http://"));
        assert!(e("http://x", &[], secret).contains("rollout.completed"));
        assert!(e("http://x", &["rollout.halt".into()], secret).contains("\"rollout.halt\""));
        assert!(e("http://x", &events, "short").contains("openssl rand"));
    }

    #[test]
    fn audit_entries_that_are_events() {
        let d = serde_json::json!({ "release": "r1" });
        let published = event_of_audit(5, 9, "alice", "release.publish", "done", &d).unwrap();
        assert_eq!(published.event, "release.published");
        assert_eq!(published.key, "audit_log:5");
        assert_eq!(published.data["details"]["release"], "r1");
        assert!(event_of_audit(5, 9, "alice", "release.publish", "refused", &d).is_none());
        assert_eq!(
            event_of_audit(6, 9, "bob", "deployment.set", "done", &d)
                .unwrap()
                .event,
            "deployment.changed"
        );
        assert_eq!(
            event_of_audit(7, 9, "bob", "approval.request", "awaiting-approval", &d)
                .unwrap()
                .event,
            "approval.requested"
        );
        assert!(event_of_audit(8, 9, "bob", "token.create", "done", &d).is_none());
    }

    #[test]
    fn the_cursor_stays_behind_what_may_still_commit() {
        let ev = |at| Event {
            key: String::new(),
            event: "",
            at,
            data: serde_json::Value::Null,
        };
        let now = 100_000;
        assert_eq!(next_cursor(0, &[], now, 10), now - SETTLE_MS);
        assert_eq!(next_cursor(90_000, &[], now, 10), 90_000);
        let full: Vec<Event> = (0..10).map(|i| ev(1_000 + i)).collect();
        assert_eq!(next_cursor(0, &full, now, 10), 1_008);
    }

    #[tokio::test]
    async fn an_event_is_queued_once_per_webhook_and_leased_by_one_server() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open("", dir.path(), 2).await.unwrap();
        let a = Webhooks::new(db.clone(), "a".into());
        let b = Webhooks::new(db.clone(), "b".into());
        let secret = "0123456789abcdef";
        let hook = a
            .add(
                "http://127.0.0.1:9/hook",
                &["release.published".to_owned()],
                secret,
                "alice",
                0,
            )
            .await
            .unwrap();
        let now = crate::db::now_ms();
        crate::audit::Audit::new(db.clone())
            .record(&crate::audit::Change {
                who: "alice",
                address: "",
                action: "release.publish",
                outcome: crate::audit::Outcome::Done,
                details: serde_json::json!({ "release": "2.0.0+1" }),
            })
            .await
            .unwrap();
        // Both servers feed the same entry: one row.
        a.feed(now).await.unwrap();
        b.feed(now).await.unwrap();
        assert_eq!(a.get(hook.id).await.unwrap().unwrap().pending, 1);

        let lease = Duration::from_secs(20);
        let due = a.claim(now + 1, 10, lease).await.unwrap();
        assert_eq!(due.len(), 1);
        assert!(b.claim(now + 1, 10, lease).await.unwrap().is_empty());
        let body: serde_json::Value = serde_json::from_str(&due[0].body).unwrap();
        assert_eq!(body["event"], "release.published");
        assert_eq!(body["id"], due[0].event_id);
        assert_eq!(body["data"]["details"]["release"], "2.0.0+1");
        assert!(body["fleet"].as_str().unwrap().starts_with("fleet-"));

        // Fails: back in a second, for either server.
        let failed = Tried::Failed {
            status: 500,
            error: "answered 500".into(),
        };
        let day = Duration::from_secs(86_400);
        a.finish(&due[0], &failed, 3, now + 2, day).await.unwrap();
        assert!(b.claim(now + 3, 10, lease).await.unwrap().is_empty());
        let again = b.claim(now + 1_002, 10, lease).await.unwrap();
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].attempts, 1);
        b.finish(
            &again[0],
            &Tried::Delivered { status: 204 },
            2,
            now + 1_003,
            day,
        )
        .await
        .unwrap();
        assert!(a.claim(now + 900_000, 10, lease).await.unwrap().is_empty());
        let listed = a.get(hook.id).await.unwrap().unwrap();
        assert_eq!((listed.pending, listed.delivered), (0, 1));
        let tries = a.deliveries(hook.id, 10).await.unwrap();
        assert_eq!(tries.len(), 2);
        assert_eq!((tries[0].server.as_str(), tries[0].status), ("b", 204));
        assert_eq!((tries[1].attempt, tries[1].status), (1, 500));

        // A test event, then the webhook removed with its outbox.
        assert!(a.test(hook.id, "alice", now).await.unwrap().is_some());
        assert!(a.test(hook.id + 1, "alice", now).await.unwrap().is_none());
        assert!(a.remove(hook.id).await.unwrap());
        assert!(!a.remove(hook.id).await.unwrap());
        assert!(
            a.claim(now + 1_000_000, 10, lease)
                .await
                .unwrap()
                .is_empty()
        );
    }
}
