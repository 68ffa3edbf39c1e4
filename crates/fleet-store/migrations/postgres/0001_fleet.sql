CREATE TABLE IF NOT EXISTS settings (
    key   TEXT PRIMARY KEY NOT NULL,
    value TEXT NOT NULL
);

CREATE TABLE IF NOT EXISTS agents (
    id            TEXT PRIMARY KEY NOT NULL,
    name          TEXT NOT NULL,
    platform      TEXT NOT NULL,
    version       TEXT NOT NULL,
    last_contact  BIGINT NOT NULL,
    update_status TEXT,
    update_error  TEXT
);

CREATE INDEX IF NOT EXISTS agents_version ON agents (version);
CREATE INDEX IF NOT EXISTS agents_update_status ON agents (update_status);
