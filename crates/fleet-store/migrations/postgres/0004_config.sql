-- Remote configuration: one set of files per agent group, rolled out in waves like a
-- bundle (the config_rollout* tables have the shape of the rollout* ones). Times are
-- unix milliseconds.
CREATE TABLE config_sets (
    agent_group TEXT PRIMARY KEY NOT NULL,
    hash        TEXT NOT NULL,
    files       TEXT NOT NULL,
    created_at  BIGINT NOT NULL
);

-- The set each agent runs (from its contacts), and what it made of the set it was
-- last sent (config_status_hash): APPLYING, APPLIED or FAILED, with its error.
ALTER TABLE agents ADD COLUMN config_hash TEXT NOT NULL DEFAULT '';
ALTER TABLE agents ADD COLUMN config_status TEXT;
ALTER TABLE agents ADD COLUMN config_error TEXT;
ALTER TABLE agents ADD COLUMN config_status_hash TEXT;

CREATE TABLE config_rollouts (
    id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    agent_group  TEXT NOT NULL,
    hash         TEXT NOT NULL,
    state        TEXT NOT NULL,
    reason       TEXT,
    halt_cause   TEXT,
    plan         TEXT NOT NULL,
    opened       BIGINT NOT NULL DEFAULT 0,
    forgiven     BIGINT NOT NULL DEFAULT 0,
    started_at   BIGINT NOT NULL,
    completed_at BIGINT,
    UNIQUE (agent_group, hash, started_at)
);

CREATE TABLE config_rollout_waves (
    rollout_id   BIGINT NOT NULL,
    wave         BIGINT NOT NULL,
    spec         TEXT NOT NULL,
    opened_at    BIGINT,
    completed_at BIGINT,
    PRIMARY KEY (rollout_id, wave)
);

CREATE TABLE config_rollout_agents (
    rollout_id BIGINT NOT NULL,
    agent_id   TEXT NOT NULL,
    wave       BIGINT NOT NULL,
    told_at    BIGINT,
    outcome    TEXT,
    outcome_at BIGINT,
    error      TEXT,
    PRIMARY KEY (rollout_id, agent_id)
);

CREATE INDEX config_rollout_agents_by_wave ON config_rollout_agents (rollout_id, wave, outcome);

CREATE TABLE config_rollout_events (
    id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    rollout_id BIGINT NOT NULL,
    kind       TEXT NOT NULL,
    wave       BIGINT NOT NULL DEFAULT 0,
    at         BIGINT NOT NULL,
    detail     TEXT,
    server     TEXT NOT NULL DEFAULT ''
);

CREATE UNIQUE INDEX config_rollout_events_once ON config_rollout_events (rollout_id, kind, wave)
    WHERE kind IN ('started', 'wave_opened', 'wave_completed', 'completed');
