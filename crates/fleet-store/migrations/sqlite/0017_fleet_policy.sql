-- Fleet policy as live data (see agent_fleet::policy): each deployment's maintenance
-- windows, shared by every server of the fleet and changed without a restart. The
-- columns are a [[maintenance]] table of server.toml; groups and days are JSON arrays.
-- server.toml's windows and [rollout] seed `default` once, when the fleet is new (the
-- settings key policy.seeded says it was done).
CREATE TABLE maintenance_windows (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    deployment  TEXT NOT NULL,
    groups      TEXT NOT NULL,
    days        TEXT NOT NULL,
    start       TEXT NOT NULL,
    duration_s  BIGINT NOT NULL,
    timezone    TEXT NOT NULL,
    catch_up    TEXT NOT NULL,
    created_at  BIGINT NOT NULL
);
CREATE INDEX maintenance_windows_deployment ON maintenance_windows (deployment);
