-- Staged rollouts. Times are unix milliseconds; agents.last_contact stays in seconds.
ALTER TABLE agents ADD COLUMN agent_group TEXT NOT NULL DEFAULT '';

-- One rollout per served bundle, keyed by its sha256 and the signing time of its
-- signature (the same bytes signed again today are a new, deliberate rollout).
CREATE TABLE rollouts (
    id           INTEGER PRIMARY KEY,
    sha256       TEXT NOT NULL,
    signed_at    INTEGER NOT NULL,
    version      TEXT NOT NULL,
    previous     TEXT,
    state        TEXT NOT NULL,
    reason       TEXT,
    halt_cause   TEXT,
    plan         TEXT NOT NULL,
    opened       INTEGER NOT NULL DEFAULT 0,
    forgiven     INTEGER NOT NULL DEFAULT 0,
    started_at   INTEGER NOT NULL,
    completed_at INTEGER,
    UNIQUE (sha256, signed_at)
);

CREATE TABLE rollout_waves (
    rollout_id   INTEGER NOT NULL,
    wave         INTEGER NOT NULL,
    spec         TEXT NOT NULL,
    opened_at    INTEGER,
    completed_at INTEGER,
    PRIMARY KEY (rollout_id, wave)
);

CREATE TABLE rollout_agents (
    rollout_id INTEGER NOT NULL,
    agent_id   TEXT NOT NULL,
    wave       INTEGER NOT NULL,
    told_at    INTEGER,
    outcome    TEXT,
    outcome_at INTEGER,
    error      TEXT,
    PRIMARY KEY (rollout_id, agent_id)
);

CREATE INDEX rollout_agents_by_wave ON rollout_agents (rollout_id, wave, outcome);

-- Every transition, with the server that decided it. A wave opens once and completes
-- once, whatever restarts or servers race for it.
CREATE TABLE rollout_events (
    id         INTEGER PRIMARY KEY,
    rollout_id INTEGER NOT NULL,
    kind       TEXT NOT NULL,
    wave       INTEGER NOT NULL DEFAULT 0,
    at         INTEGER NOT NULL,
    detail     TEXT,
    server     TEXT NOT NULL DEFAULT ''
);

CREATE UNIQUE INDEX rollout_events_once ON rollout_events (rollout_id, kind, wave)
    WHERE kind IN ('started', 'wave_opened', 'wave_completed', 'completed');
