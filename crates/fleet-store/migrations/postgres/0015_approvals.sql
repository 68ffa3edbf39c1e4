-- Approvals: a change that moves agents, made by one operator while the fleet requires
-- approval, waits here until another operator approves or rejects it, or it lapses.

-- One row per waiting (or decided) change. `payload` is what applying it needs (a
-- deployment's change, a configuration set's files, a kept release's id); a publish's
-- bytes stay with the kept release (`release_id`), which pruning spares while the
-- change waits.
CREATE TABLE approvals (
    id           BIGSERIAL PRIMARY KEY,
    action       TEXT NOT NULL,
    subject      TEXT NOT NULL,
    payload      TEXT NOT NULL,
    release_id   TEXT,
    requested_by TEXT NOT NULL,
    requested_at BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL,
    state        TEXT NOT NULL DEFAULT 'awaiting-approval',
    decided_by   TEXT,
    decided_at   BIGINT,
    reason       TEXT
);
CREATE INDEX approvals_by_state ON approvals (state, expires_at);

-- A named token may lapse (`token create --expires 90d`); none: it never does.
ALTER TABLE operator_tokens ADD COLUMN expires_at BIGINT;
