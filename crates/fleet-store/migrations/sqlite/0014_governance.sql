-- Governance: audit retention and webhooks.

-- Chores one server does for the whole fleet (the audit log's retention): the server
-- that claimed each last, and when the next claim is due. A claim is an UPDATE that
-- only one server's statement can win.
CREATE TABLE fleet_chores (
    name    TEXT PRIMARY KEY,
    due_at  BIGINT NOT NULL,
    held_by TEXT NOT NULL DEFAULT ''
);

-- Retention deletes by age; the export reads a time range.
CREATE INDEX audit_log_at ON audit_log (at);

-- Webhooks: where events are POSTed, which events, and the secret that signs them
-- (kept as it is: an HMAC needs the secret itself; never shown again).
CREATE TABLE webhooks (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    url        TEXT NOT NULL,
    events     TEXT NOT NULL,
    secret     TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    created_by TEXT NOT NULL
);

-- How far the fleet has turned each source (rollout events, the audit log, agents'
-- outcomes) into webhook events, in unix milliseconds.
CREATE TABLE webhook_cursors (
    source  TEXT PRIMARY KEY,
    read_to BIGINT NOT NULL
);

-- The outbox: one row per event and webhook, delivered once for the fleet. A server
-- leases a due row (lease_until) before it POSTs it.
CREATE TABLE webhook_outbox (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    webhook_id  BIGINT NOT NULL,
    event_id    TEXT NOT NULL,
    event       TEXT NOT NULL,
    body        TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    state       TEXT NOT NULL DEFAULT 'pending',
    attempts    INTEGER NOT NULL DEFAULT 0,
    next_at     BIGINT NOT NULL,
    lease_until BIGINT NOT NULL DEFAULT 0,
    done_at     BIGINT,
    UNIQUE (webhook_id, event_id)
);
CREATE INDEX webhook_outbox_due ON webhook_outbox (state, next_at);

-- Every attempt, for `webhook deliveries ID`.
CREATE TABLE webhook_attempts (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    webhook_id BIGINT NOT NULL,
    event_id   TEXT NOT NULL,
    event      TEXT NOT NULL,
    attempt    INTEGER NOT NULL,
    at         BIGINT NOT NULL,
    server     TEXT NOT NULL,
    status     INTEGER NOT NULL DEFAULT 0,
    error      TEXT NOT NULL DEFAULT '',
    millis     BIGINT NOT NULL
);
CREATE INDEX webhook_attempts_by_hook ON webhook_attempts (webhook_id, id);

-- agent.failed is read from agents' outcomes by when they came.
CREATE INDEX rollout_agents_outcome_at ON rollout_agents (outcome_at);
