-- Staged rollouts. Times are unix milliseconds; agents.last_contact stays in seconds.
ALTER TABLE agents ADD COLUMN agent_group TEXT NOT NULL DEFAULT '';

-- One rollout per served bundle, keyed by its sha256 and the signing time of its
-- signature (the same bytes signed again today are a new, deliberate rollout).
CREATE TABLE rollouts (
    id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sha256       TEXT NOT NULL,
    signed_at    BIGINT NOT NULL,
    version      TEXT NOT NULL,
    previous     TEXT,
    state        TEXT NOT NULL,
    reason       TEXT,
    halt_cause   TEXT,
    plan         TEXT NOT NULL,
    opened       BIGINT NOT NULL DEFAULT 0,
    forgiven     BIGINT NOT NULL DEFAULT 0,
    started_at   BIGINT NOT NULL,
    completed_at BIGINT,
    UNIQUE (sha256, signed_at)
);

CREATE TABLE rollout_waves (
    rollout_id   BIGINT NOT NULL,
    wave         BIGINT NOT NULL,
    spec         TEXT NOT NULL,
    opened_at    BIGINT,
    completed_at BIGINT,
    PRIMARY KEY (rollout_id, wave)
);

CREATE TABLE rollout_agents (
    rollout_id BIGINT NOT NULL,
    agent_id   TEXT NOT NULL,
    wave       BIGINT NOT NULL,
    told_at    BIGINT,
    outcome    TEXT,
    outcome_at BIGINT,
    error      TEXT,
    PRIMARY KEY (rollout_id, agent_id)
);

CREATE INDEX rollout_agents_by_wave ON rollout_agents (rollout_id, wave, outcome);

-- Every transition, with the server that decided it. A wave opens once and completes
-- once, whatever restarts or servers race for it.
CREATE TABLE rollout_events (
    id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    rollout_id BIGINT NOT NULL,
    kind       TEXT NOT NULL,
    wave       BIGINT NOT NULL DEFAULT 0,
    at         BIGINT NOT NULL,
    detail     TEXT,
    server     TEXT NOT NULL DEFAULT ''
);

CREATE UNIQUE INDEX rollout_events_once ON rollout_events (rollout_id, kind, wave)
    WHERE kind IN ('started', 'wave_opened', 'wave_completed', 'completed');
