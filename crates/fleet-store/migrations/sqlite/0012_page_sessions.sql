-- Signed-in people of the fleet page (see agent_fleet::sessions), kept here so that a
-- restart signs no one out and every server of a fleet knows a session another made.
-- Only the sha256 of the session cookie is stored; times are unix milliseconds.
CREATE TABLE page_sessions (
    id_hash TEXT PRIMARY KEY,
    csrf TEXT NOT NULL,
    name TEXT NOT NULL,
    role TEXT NOT NULL,
    token_hash TEXT,
    started_at BIGINT NOT NULL,
    seen_at BIGINT NOT NULL
);
CREATE INDEX page_sessions_seen ON page_sessions (seen_at);
