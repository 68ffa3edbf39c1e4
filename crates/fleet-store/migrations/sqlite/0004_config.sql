-- Remote configuration: one set of files per agent group, rolled out in waves like a
-- bundle (the config_rollout* tables have the shape of the rollout* ones). Times are
-- unix milliseconds.
CREATE TABLE config_sets (
    agent_group TEXT PRIMARY KEY NOT NULL,
    hash        TEXT NOT NULL,
    files       TEXT NOT NULL,
    created_at  INTEGER NOT NULL
);

-- The set each agent runs (from its contacts), and what it made of the set it was
-- last sent (config_status_hash): APPLYING, APPLIED or FAILED, with its error.
ALTER TABLE agents ADD COLUMN config_hash TEXT NOT NULL DEFAULT '';
ALTER TABLE agents ADD COLUMN config_status TEXT;
ALTER TABLE agents ADD COLUMN config_error TEXT;
ALTER TABLE agents ADD COLUMN config_status_hash TEXT;

CREATE TABLE config_rollouts (
    id           INTEGER PRIMARY KEY,
    agent_group  TEXT NOT NULL,
    hash         TEXT NOT NULL,
    state        TEXT NOT NULL,
    reason       TEXT,
    halt_cause   TEXT,
    plan         TEXT NOT NULL,
    opened       INTEGER NOT NULL DEFAULT 0,
    forgiven     INTEGER NOT NULL DEFAULT 0,
    started_at   INTEGER NOT NULL,
    completed_at INTEGER,
    UNIQUE (agent_group, hash, started_at)
);

CREATE TABLE config_rollout_waves (
    rollout_id   INTEGER NOT NULL,
    wave         INTEGER NOT NULL,
    spec         TEXT NOT NULL,
    opened_at    INTEGER,
    completed_at INTEGER,
    PRIMARY KEY (rollout_id, wave)
);

CREATE TABLE config_rollout_agents (
    rollout_id INTEGER NOT NULL,
    agent_id   TEXT NOT NULL,
    wave       INTEGER NOT NULL,
    told_at    INTEGER,
    outcome    TEXT,
    outcome_at INTEGER,
    error      TEXT,
    PRIMARY KEY (rollout_id, agent_id)
);

CREATE INDEX config_rollout_agents_by_wave ON config_rollout_agents (rollout_id, wave, outcome);

CREATE TABLE config_rollout_events (
    id         INTEGER PRIMARY KEY,
    rollout_id INTEGER NOT NULL,
    kind       TEXT NOT NULL,
    wave       INTEGER NOT NULL DEFAULT 0,
    at         INTEGER NOT NULL,
    detail     TEXT,
    server     TEXT NOT NULL DEFAULT ''
);

CREATE UNIQUE INDEX config_rollout_events_once ON config_rollout_events (rollout_id, kind, wave)
    WHERE kind IN ('started', 'wave_opened', 'wave_completed', 'completed');
