-- One table family for every kind of rollout: the config_rollout* tables of 0004 join the
-- rollout* tables of 0002, told apart by rollouts.rollout_kind ('bundle' or 'config').
-- A rollout's own columns: agent_group (a set's group; '' for a bundle), target (the
-- bundle's sha256 or the set's hash), signed_at (the bundle signature's time; 0 for a
-- set), version and previous (a bundle's; NULL for a set). Config rollouts keep their
-- rows, their ids moved past the bundle rollouts' ones.

CREATE TABLE rollout_id_offset AS SELECT COALESCE(MAX(id), 0) AS n FROM rollouts;

INSERT INTO rollout_waves (rollout_id, wave, spec, opened_at, completed_at)
SELECT rollout_id + (SELECT n FROM rollout_id_offset), wave, spec, opened_at, completed_at
FROM config_rollout_waves;

INSERT INTO rollout_agents (rollout_id, agent_id, wave, told_at, outcome, outcome_at, error)
SELECT rollout_id + (SELECT n FROM rollout_id_offset), agent_id, wave, told_at, outcome, outcome_at, error
FROM config_rollout_agents;

INSERT INTO rollout_events (rollout_id, kind, wave, at, detail, server)
SELECT rollout_id + (SELECT n FROM rollout_id_offset), kind, wave, at, detail, server
FROM config_rollout_events ORDER BY id;

CREATE TABLE rollouts_new (
    id           INTEGER PRIMARY KEY,
    rollout_kind TEXT NOT NULL,
    agent_group  TEXT NOT NULL DEFAULT '',
    target       TEXT NOT NULL,
    signed_at    INTEGER NOT NULL DEFAULT 0,
    version      TEXT,
    previous     TEXT,
    state        TEXT NOT NULL,
    reason       TEXT,
    halt_cause   TEXT,
    plan         TEXT NOT NULL,
    opened       INTEGER NOT NULL DEFAULT 0,
    forgiven     INTEGER NOT NULL DEFAULT 0,
    started_at   INTEGER NOT NULL,
    completed_at INTEGER
);

INSERT INTO rollouts_new (id, rollout_kind, agent_group, target, signed_at, version, previous,
    state, reason, halt_cause, plan, opened, forgiven, started_at, completed_at)
SELECT id, 'bundle', '', sha256, signed_at, version, previous,
    state, reason, halt_cause, plan, opened, forgiven, started_at, completed_at
FROM rollouts;

INSERT INTO rollouts_new (id, rollout_kind, agent_group, target, signed_at, version, previous,
    state, reason, halt_cause, plan, opened, forgiven, started_at, completed_at)
SELECT id + (SELECT n FROM rollout_id_offset), 'config', agent_group, hash, 0, NULL, NULL,
    state, reason, halt_cause, plan, opened, forgiven, started_at, completed_at
FROM config_rollouts;

DROP TABLE rollouts;
ALTER TABLE rollouts_new RENAME TO rollouts;
DROP TABLE config_rollouts;
DROP TABLE config_rollout_waves;
DROP TABLE config_rollout_agents;
DROP TABLE config_rollout_events;
DROP TABLE rollout_id_offset;

-- A bundle rollout per sha256 and signature time; a config rollout per group, hash and
-- the set's creation. An insert that meets either is another server's, and does nothing.
CREATE UNIQUE INDEX rollouts_bundle_once ON rollouts (target, signed_at) WHERE rollout_kind = 'bundle';
CREATE UNIQUE INDEX rollouts_config_once ON rollouts (agent_group, target, started_at) WHERE rollout_kind = 'config';
-- The fleet's latest rollout of a kind, and a group's.
CREATE INDEX rollouts_by_kind ON rollouts (rollout_kind, id);
