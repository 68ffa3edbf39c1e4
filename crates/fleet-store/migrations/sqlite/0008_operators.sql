-- Operators' named tokens (only the sha256 of each is kept) and the append-only audit log.
CREATE TABLE operator_tokens (
    name TEXT PRIMARY KEY,
    role TEXT NOT NULL,
    token_hash TEXT NOT NULL UNIQUE,
    created_at BIGINT NOT NULL,
    last_used_at BIGINT
);
CREATE TABLE audit_log (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at BIGINT NOT NULL,
    who TEXT NOT NULL,
    address TEXT NOT NULL,
    action TEXT NOT NULL,
    outcome TEXT NOT NULL,
    details TEXT NOT NULL
);
CREATE INDEX audit_log_who ON audit_log (who);
