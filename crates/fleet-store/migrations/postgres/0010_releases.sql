-- Releases published with `update-server release publish`: what each is (its files,
-- their sha256 and signatures), and the history of publishes and rollbacks. The newest
-- history row is the fleet's current release. With PostgreSQL the bytes are kept here
-- (data) so that every server serves them; with SQLite they live under the home.
CREATE TABLE releases (
    id         TEXT PRIMARY KEY NOT NULL,
    identity   TEXT NOT NULL,
    created_at BIGINT NOT NULL
);

CREATE TABLE release_files (
    release_id TEXT NOT NULL,
    name       TEXT NOT NULL,
    platform   TEXT NOT NULL,
    sha256     TEXT NOT NULL,
    size       BIGINT NOT NULL,
    signature  TEXT NOT NULL,
    data       BYTEA,
    PRIMARY KEY (release_id, name)
);

CREATE TABLE release_history (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    release_id TEXT NOT NULL,
    kind       TEXT NOT NULL,
    at         BIGINT NOT NULL,
    who        TEXT NOT NULL
);
